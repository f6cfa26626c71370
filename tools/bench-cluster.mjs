#!/usr/bin/env node
// bench-cluster.mjs: aggregate generated tok/s through HAProxy with 1..N `dflash serve` replicas
// (tools/cluster.sh), and the latency the proxy adds per request. Not a test: the figures depend on
// the machine and its load (on one 2-core machine the replicas share the same cores).
//   node tools/bench-cluster.mjs [--cli build/dflash] [--max N] [--clients C] [--requests R]
//        [--tokens T] [--port P] [-- serve options]
// Per replica count n = 1..N: `cluster.sh up n`, C clients send R streamed completions in all
// (T tokens each, ignore_eos, temperature 0), aggregate tok/s = tokens / wall time. Then, with
// one replica: 50 sequential 1-token requests and 50 GET /health, straight to the replica and
// through HAProxy; the medians' difference is the proxy's cost per request.
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
let cli = `${root}/build/dflash`, max = 3, clients = 8, requests = 32, tokens = 64, basePort = 22000, extra = [];
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--cli') cli = path.resolve(argv[++i]);
  else if (a === '--max') max = Number(argv[++i]);
  else if (a === '--clients') clients = Number(argv[++i]);
  else if (a === '--requests') requests = Number(argv[++i]);
  else if (a === '--tokens') tokens = Number(argv[++i]);
  else if (a === '--port') basePort = Number(argv[++i]);
  else if (a === '--') { extra = argv.slice(i + 1); break; }
  else { console.error(`unknown option ${a}`); process.exit(2); }
}
const dir = `${root}/build/bench-cluster`;
const env = { ...process.env, DFLASH: cli, DFLASH_CLUSTER_DIR: dir };
const cluster = (args) => execFileSync(`${root}/tools/cluster.sh`, args, { env, encoding: 'utf8', timeout: 180000 });
const prompts = ['def read_config(path):', 'And the LORD spake unto Moses, saying,', 'import os\n', 'class Stack:\n    def',
  'In the beginning', 'for i in range(10):', 'Blessed are the meek', 'def main():'];
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };

async function completion(base, prompt, n, stream) {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: n, temperature: 0, ignore_eos: true, stream,
      stream_options: stream ? { include_usage: true } : undefined }),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  if (!stream) return (await r.json()).usage.completion_tokens;
  let buf = '', got = 0;
  for await (const chunk of r.body) buf += new TextDecoder().decode(chunk);
  for (const line of buf.split('\n')) {
    if (line.startsWith('data: {')) { const j = JSON.parse(line.slice(6)); if (j.usage) got = j.usage.completion_tokens; }
  }
  return got;
}

const rows = [];
process.on('uncaughtException', (e) => {
  console.error(`bench-cluster: ${e?.message}${e?.cause ? ` (${e.cause.message ?? e.cause})` : ''}`);
  try { cluster(['down']); } catch { /* already down */ }
  process.exit(1);
});
for (let n = 1; n <= max; n++) {
  // a fresh port per replica count: no pooled connection of the previous proxy is reused
  const port = basePort + 200 * (n - 1);
  cluster(['up', String(n), '--port', String(port), '--', '-np', String(Math.max(1, Math.ceil(clients / n))), ...extra]);
  const base = `http://127.0.0.1:${port}`;
  await completion(base, 'warm up', 8, false);
  let next = 0, total = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, async () => {
    while (next < requests) {
      const k = next++;
      const got = await completion(base, prompts[k % prompts.length], tokens, true);
      total += got;
    }
  }));
  const s = (performance.now() - t0) / 1000;
  rows.push({ n, tokens: total, s, tps: total / s });
  console.log(`${n} replica(s): ${total} tokens in ${s.toFixed(2)} s = ${(total / s).toFixed(1)} tok/s`);
  if (n === 1) {
    // the proxy's cost per request: the same requests straight to the replica and through HAProxy
    const direct = `http://127.0.0.1:${port + 1}`;
    const lat = {};
    for (const [name, b] of [['direct', direct], ['haproxy', base]]) {
      const h = [], c = [];
      for (let i = 0; i < 50; i++) {
        let t = performance.now();
        await (await fetch(`${b}/health`)).text();
        h.push(performance.now() - t);
        t = performance.now();
        await completion(b, 'def f():', 1, false);
        c.push(performance.now() - t);
      }
      lat[name] = { health: median(h), one: median(c) };
    }
    console.log(`latency (median of 50): GET /health direct ${lat.direct.health.toFixed(3)} ms, via HAProxy ` +
      `${lat.haproxy.health.toFixed(3)} ms; 1-token completion direct ${lat.direct.one.toFixed(3)} ms, via HAProxy ` +
      `${lat.haproxy.one.toFixed(3)} ms`);
  }
  cluster(['down']);
}
console.log('\n| replicas | tokens | seconds | aggregate tok/s | vs 1 replica |\n|---|---|---|---|---|');
for (const r of rows) {
  console.log(`| ${r.n} | ${r.tokens} | ${r.s.toFixed(2)} | ${r.tps.toFixed(1)} | ${(r.tps / rows[0].tps).toFixed(2)}x |`);
}
