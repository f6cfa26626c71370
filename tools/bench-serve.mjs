#!/usr/bin/env node
// bench-serve.mjs: aggregate generated tok/s and median time to first token of `dflash serve` at
// 1, 4 and 16 concurrent streams, with the drafter and without (--no-spec). Starts its own server
// on a free loopback port for each configuration. Not a test: figures depend on the machine and
// on its load.
//   node tools/bench-serve.mjs [--cli build/dflash] [--tokens 64] [--rounds 2] [-- extra serve options]
import { spawn } from 'node:child_process';

const argv = process.argv.slice(2);
let cli = 'build/dflash', tokens = 64, rounds = 2, extra = [];
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--cli') cli = argv[++i];
  else if (argv[i] === '--tokens') tokens = Number(argv[++i]);
  else if (argv[i] === '--rounds') rounds = Number(argv[++i]);
  else if (argv[i] === '--') { extra = argv.slice(i + 1); break; }
  else { console.error(`unknown option ${argv[i]}`); process.exit(2); }
}
const prompts = ['def read_config(path):', 'And the LORD spake unto Moses, saying,', 'import numpy as np\n',
  'The quick brown fox', 'class Stack:\n    def', 'for i in range(10):', 'In the beginning', 'Once upon a time'];

async function start(args) {
  const proc = spawn(cli, ['serve', '--port', '0', '-np', '16', ...args, ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  for (let t = 0; t < 1200; t++) {
    const m = log.match(/listening on (http:\/\/[^ ]+)/);
    if (m && /ready:/.test(log)) return { proc, base: m[1] };
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`server did not start:\n${log}`);
}

async function one(base, prompt) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: tokens, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } }) });
  const dec = new TextDecoder();
  let ttft = null, usage = null, timings = null, buf = '';
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (ttft === null && j.choices?.[0]?.text) ttft = performance.now() - t0;
      if (j.usage) { usage = j.usage; timings = j.timings; }
    }
  }
  return { ttft, n: usage?.completion_tokens ?? 0, tau: timings?.tau ?? 0 };
}

const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
console.log('| drafter | streams | aggregate tok/s | median TTFT ms | mean tau |');
console.log('|---|---|---|---|---|');
for (const spec of [true, false]) {
  const s = await start(spec ? [] : ['--no-spec']);
  await one(s.base, 'warm up'); // first request pays page faults
  for (const n of [1, 4, 16]) {
    const rates = [], ttfts = [], taus = [];
    for (let r = 0; r < rounds; r++) {
      const t0 = performance.now();
      const res = await Promise.all(Array.from({ length: n }, (_, i) => one(s.base, prompts[i % prompts.length])));
      const dt = (performance.now() - t0) / 1e3;
      rates.push(res.reduce((a, x) => a + x.n, 0) / dt);
      for (const x of res) { ttfts.push(x.ttft); taus.push(x.tau); }
    }
    console.log(`| ${spec ? 'yes' : 'no'} | ${n} | ${median(rates).toFixed(1)} | ${median(ttfts).toFixed(0)} | ` +
      `${(taus.reduce((a, x) => a + x, 0) / taus.length).toFixed(2)} |`);
  }
  s.proc.kill('SIGTERM');
  await new Promise((r) => s.proc.on('exit', r));
}
