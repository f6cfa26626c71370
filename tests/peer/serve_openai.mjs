// serve_openai.mjs: `dflash serve` against the official OpenAI client (openai@6.49.0, pinned in
// package.json). Started by tests/test_serve.c as `node serve_openai.mjs CLI PART`; starts its own
// servers on loopback ports (--port 0: the server prints the port it got), with the embedded pair.
// PART: "api" (models, chat and completions, stream == non-stream at T=0, max_tokens, stop, the
// error classes), "lossless" (16 concurrent streams == `dflash generate`, tau == solo tau),
// "cancel" (20 streams aborted at random points), "load" (64 clients x 8 requests).
// Prints "ok NAME" per check, "FAIL NAME: why" and exits 1 on the first failure.
import { spawn, execFileSync } from 'node:child_process';
import net from 'node:net';
import OpenAI from 'openai';

const [cli, part] = process.argv.slice(2);
if (!cli || !part) {
  console.error('usage: node serve_openai.mjs DFLASH_CLI api|lossless|cancel|load');
  process.exit(2);
}

let servers = [];
function fail(name, why) {
  console.log(`FAIL ${name}: ${why}`);
  for (const s of servers) {
    console.log(`--- server log (${s.args.join(' ')}):\n${s.log.slice(-4000)}`);
    s.proc.kill('SIGKILL');
  }
  process.exit(1);
}
function check(name, cond, why) {
  if (!cond) fail(name, typeof why === 'function' ? why() : why);
}
function ok(name) {
  console.log(`ok ${name}`);
}

async function startServer(args) {
  const proc = spawn(cli, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  const s = { proc, args, log: '', port: 0, exit: null };
  servers.push(s);
  proc.stderr.on('data', (d) => { s.log += d.toString(); });
  s.exited = new Promise((resolve) => proc.on('exit', (code, sig) => { s.exit = { code, sig }; resolve(); }));
  const t0 = Date.now();
  while (Date.now() - t0 < 60000) {
    const m = s.log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m && /ready:/.test(s.log)) {
      s.port = Number(m[1]);
      s.base = `http://127.0.0.1:${s.port}`;
      return s;
    }
    if (s.exit) fail('start', `server exited (${JSON.stringify(s.exit)})`);
    await new Promise((r) => setTimeout(r, 50));
  }
  fail('start', 'server not ready within 60 s');
}

async function stopServer(s) {
  s.proc.kill('SIGTERM');
  const t = setTimeout(() => s.proc.kill('SIGKILL'), 30000);
  await s.exited;
  clearTimeout(t);
  check('graceful stop', s.exit.code === 0, () => `exit ${JSON.stringify(s.exit)}`);
  check('graceful stop log', /stopped \(/.test(s.log), 'no "stopped" line in the log');
  servers = servers.filter((x) => x !== s);
}

function client(s, extra = {}) {
  return new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000, ...extra });
}

async function metrics(s) {
  const r = await fetch(`${s.base}/metrics`, { signal: AbortSignal.timeout(20000) });
  const txt = await r.text();
  const get = (name) => {
    const m = txt.match(new RegExp(`^dflash:${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { txt, get };
}

async function streamText(c, params, onChunk) {
  const stream = await c.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, timings = null, roles = 0, n = 0;
  for await (const chunk of stream) {
    if (chunk.usage) { usage = chunk.usage; timings = chunk.timings; }
    for (const ch of chunk.choices) {
      if (ch.delta?.role) roles++;
      if (ch.delta?.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    n++;
    if (onChunk) onChunk(n, stream);
  }
  return { text, finish, usage, timings, roles };
}

// Raw bytes to the server; resolves with everything it sent until it closed (or after ms).
function raw(s, bytes, ms = 8000) {
  return new Promise((resolve) => {
    const sock = net.connect(s.port, '127.0.0.1');
    let got = '';
    const t = setTimeout(() => { sock.destroy(); resolve(got + '<timeout>'); }, ms);
    sock.on('data', (d) => { got += d.toString(); });
    sock.on('close', () => { clearTimeout(t); resolve(got); });
    sock.on('error', () => {});
    sock.write(bytes);
  });
}

async function expectError(name, fn, cls, status) {
  try {
    await fn();
  } catch (e) {
    check(name, e instanceof cls, () => `expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
    check(name, e.status === status, () => `expected status ${status}, got ${e.status}`);
    check(name, typeof e.error?.message === 'string' && e.error.message.length > 0, 'error without a message');
    ok(name);
    return e;
  }
  fail(name, `no error (expected ${status})`);
}

const chatParams = (content, extra = {}) => ({
  model: 'dflash-embedded', messages: [{ role: 'user', content }], temperature: 0, ...extra,
});

async function partApi() {
  const s = await startServer(['-np', '4', '--cors-origin', 'https://example.com']);
  const c = client(s);
  // raw HTTP: pipelining, a malformed request, CORS
  const two = await raw(s, 'GET /health HTTP/1.1\r\nHost: a\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n');
  check('pipelined', (two.match(/HTTP\/1\.1 200 OK/g) || []).length === 2 && two.includes('dflash-embedded'), two);
  const badreq = await raw(s, 'GET / HTTP/1.1\nHost: a\n\n');
  check('malformed -> 400 and close', badreq.startsWith('HTTP/1.1 400') && !badreq.endsWith('<timeout>'), badreq);
  const pre = await fetch(`${s.base}/v1/chat/completions`, { method: 'OPTIONS' });
  check('cors preflight', pre.status === 204 && pre.headers.get('access-control-allow-origin') === 'https://example.com' &&
    /Authorization/.test(pre.headers.get('access-control-allow-headers') ?? ''), `${pre.status}`);
  ok('raw HTTP: pipelining, 400 on a malformed request, CORS');
  // models
  const list = await c.models.list();
  check('models.list', list.data.length === 1 && list.data[0].id === 'dflash-embedded', JSON.stringify(list.data));
  const m = await c.models.retrieve('dflash-embedded');
  check('models.retrieve', m.id === 'dflash-embedded' && m.object === 'model', JSON.stringify(m));
  ok('models');
  await expectError('models.retrieve unknown -> NotFoundError', () => c.models.retrieve('no-such-model'),
    OpenAI.NotFoundError, 404);
  // chat, non-streamed and streamed, T = 0
  const p = chatParams('Write a function that reads a config file.', { max_tokens: 24 });
  const whole = await c.chat.completions.create(p);
  const text = whole.choices[0].message.content;
  check('chat', whole.object === 'chat.completion' && whole.choices[0].message.role === 'assistant', JSON.stringify(whole));
  check('chat usage', whole.usage.completion_tokens > 0 && whole.usage.prompt_tokens > 0 &&
    whole.usage.total_tokens === whole.usage.prompt_tokens + whole.usage.completion_tokens, JSON.stringify(whole.usage));
  check('chat timings', typeof whole.timings?.tau === 'number' && whole.timings.tau >= 1, JSON.stringify(whole.timings));
  ok('chat');
  const st = await streamText(c, p);
  check('chat stream == non-stream', st.text === text, () => `stream ${JSON.stringify(st.text)} vs ${JSON.stringify(text)}`);
  check('chat stream role once', st.roles === 1, `role in ${st.roles} chunks`);
  check('chat stream finish', st.finish === whole.choices[0].finish_reason, `${st.finish} vs ${whole.choices[0].finish_reason}`);
  check('chat stream usage', st.usage && st.usage.completion_tokens === whole.usage.completion_tokens,
    () => JSON.stringify(st.usage));
  ok('chat stream == non-stream at T=0');
  // max_tokens -> length
  const short = await c.chat.completions.create({ ...p, max_tokens: 3, ignore_eos: true });
  check('max_tokens', short.choices[0].finish_reason === 'length' && short.usage.completion_tokens === 3,
    JSON.stringify(short));
  ok('max_tokens -> length');
  // completions
  const cp = { model: 'dflash-embedded', prompt: 'def read_config(path):', max_tokens: 24, temperature: 0 };
  const cw = await c.completions.create(cp);
  const ctext = cw.choices[0].text;
  check('completions', cw.object === 'text_completion' && ctext.length > 0, JSON.stringify(cw));
  const cs = await c.completions.create({ ...cp, stream: true });
  let ctext2 = '', cfin = null;
  for await (const ch of cs) { ctext2 += ch.choices[0]?.text ?? ''; if (ch.choices[0]?.finish_reason) cfin = ch.choices[0].finish_reason; }
  check('completions stream', ctext2 === ctext && cfin === cw.choices[0].finish_reason, () => `${JSON.stringify(ctext2)} vs ${JSON.stringify(ctext)}`);
  ok('completions (stream == non-stream)');
  // stop: a string from the middle of the greedy text ends it there, and is not in the output
  const long = await c.completions.create({ ...cp, max_tokens: 40, ignore_eos: true });
  const full = long.choices[0].text;
  let stop = null;
  for (let i = 6; i + 3 <= full.length && !stop; i++) {
    const cand = full.slice(i, i + 3);
    if (full.indexOf(cand) === i && cand.trim().length === 3) stop = cand;
  }
  check('stop candidate', stop !== null, `no stop candidate in ${JSON.stringify(full)}`);
  const want = full.slice(0, full.indexOf(stop));
  const stopped = await c.completions.create({ ...cp, max_tokens: 40, ignore_eos: true, stop: [stop, 'zzzq'] });
  check('stop', stopped.choices[0].finish_reason === 'stop', JSON.stringify(stopped.choices[0]));
  check('stop text', stopped.choices[0].text === want,
    () => `stop ${JSON.stringify(stop)}: ${JSON.stringify(stopped.choices[0].text)} vs ${JSON.stringify(want)}`);
  const ss = await c.completions.create({ ...cp, max_tokens: 40, ignore_eos: true, stop, stream: true });
  let stext = '';
  for await (const ch of ss) stext += ch.choices[0]?.text ?? '';
  check('stop stream', stext === want && !stext.includes(stop), () => `${JSON.stringify(stext)} vs ${JSON.stringify(want)}`);
  ok('stop -> stop, stop string absent (stream and not)');
  // logprobs: one entry per generated token; at T=0 the chosen token is the most likely one
  const lpp = chatParams('Count to ten.', { max_tokens: 8, ignore_eos: true, logprobs: true, top_logprobs: 3 });
  const lw = await c.chat.completions.create(lpp);
  const lc = lw.choices[0].logprobs?.content;
  check('logprobs', Array.isArray(lc) && lc.length === lw.usage.completion_tokens, () => JSON.stringify(lw.choices[0]));
  for (const e of lc) {
    check('logprobs entry', typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes) &&
      e.top_logprobs.length === 3 && e.top_logprobs[0].token === e.token &&
      Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6 && e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob,
      () => JSON.stringify(e));
  }
  if (!lc.some((e) => e.token.includes('\ufffd'))) {
    check('logprobs tokens == text', lc.map((e) => e.token).join('') === lw.choices[0].message.content,
      () => `${JSON.stringify(lc.map((e) => e.token))} vs ${JSON.stringify(lw.choices[0].message.content)}`);
  }
  const ls = await c.chat.completions.create({ ...lpp, stream: true });
  const lsc = [];
  for await (const ch of ls) lsc.push(...(ch.choices[0]?.logprobs?.content ?? []));
  check('logprobs stream', lsc.length === lc.length && lsc.every((e, i) => e.token === lc[i].token &&
    Math.abs(e.logprob - lc[i].logprob) < 1e-6), () => `${JSON.stringify(lsc)} vs ${JSON.stringify(lc)}`);
  const cl = await c.completions.create({ ...cp, max_tokens: 6, ignore_eos: true, logprobs: 2 });
  const clp = cl.choices[0].logprobs;
  check('completions logprobs', clp && clp.tokens.length === 6 && clp.token_logprobs.length === 6 &&
    clp.top_logprobs.length === 6 && Object.keys(clp.top_logprobs[0]).length >= 1 && clp.text_offset[0] === 0,
    () => JSON.stringify(clp));
  ok('logprobs (chat: stream == non-stream, top alternatives; completions shape)');
  // tokenize / detokenize round trip
  const tk = await (await fetch(`${s.base}/tokenize`, { method: 'POST', body: JSON.stringify({ content: 'hello world' }) })).json();
  check('tokenize', Array.isArray(tk.tokens) && tk.tokens.length > 0, JSON.stringify(tk));
  const dt = await (await fetch(`${s.base}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: tk.tokens }) })).json();
  check('detokenize', dt.content === 'hello world', JSON.stringify(dt));
  ok('tokenize/detokenize');
  // 400: a wrong type and an out-of-range value
  await expectError('bad temperature -> BadRequestError', () => c.chat.completions.create({ ...p, temperature: 7 }),
    OpenAI.BadRequestError, 400);
  await expectError('bad type -> BadRequestError', () => c.chat.completions.create({ ...p, max_tokens: 'many' }),
    OpenAI.BadRequestError, 400);
  await stopServer(s);

  // the command line's sampling options are the defaults of requests that do not set them: with
  // --frequency-penalty / --presence-penalty / --repeat-last-n given to serve, a greedy completion
  // equals `dflash generate` with the same options (and differs from one without them)
  const pen = ['--frequency-penalty', '1.5', '--presence-penalty', '1', '--repeat-last-n', '32'];
  const penPrompt = 'And the LORD spake unto Moses, saying,';
  const gen = (extra) => JSON.parse(execFileSync(cli, ['generate', '--json', '--temp', '0', '-n', '24', '-p', penPrompt,
    ...extra], { encoding: 'utf8', timeout: 120000, stdio: ['ignore', 'pipe', 'ignore'] })).text;
  const refPen = gen(pen), refPlain = gen([]);
  check('penalties change the greedy text', refPen !== refPlain, `${JSON.stringify(refPen)} with and without penalties`);
  const sp = await startServer(['-np', '1', ...pen]);
  const penOut = await client(sp).completions.create({ model: 'x', prompt: penPrompt, max_tokens: 24, temperature: 0 });
  check('serve penalty defaults == generate', penOut.choices[0].text === refPen,
    () => `${JSON.stringify(penOut.choices[0].text)} vs ${JSON.stringify(refPen)}`);
  await stopServer(sp);
  ok('serve takes its default penalties from the command line');

  // a small server for the limits: API key, context, body size, queue
  const b = await startServer(['-np', '1', '-c', '256', '--max-queue', '0', '--api-key', 'sekret', '--max-body', '65536',
    '--timeout', '2']);
  const slow = await raw(b, 'GET /health HTTP/1.1\r\nHo', 10000);
  check('--timeout -> 408', slow.startsWith('HTTP/1.1 408'), slow);
  ok('a request not completed within --timeout gets 408');
  const bad = client(b, { apiKey: 'wrong' });
  await expectError('wrong api key -> AuthenticationError', () => bad.models.list(), OpenAI.AuthenticationError, 401);
  const hr = await fetch(`${b.base}/health`);
  check('health public', hr.status === 200, `health ${hr.status}`);
  const bc = client(b, { apiKey: 'sekret' });
  const xk = await fetch(`${b.base}/v1/models`, { headers: { 'X-Api-Key': 'sekret' } });
  check('x-api-key', xk.status === 200, `x-api-key ${xk.status}`);
  ok('api key (Bearer, X-Api-Key, /health public)');
  const e400 = await expectError('prompt too long -> BadRequestError',
    () => bc.completions.create({ model: 'x', prompt: 'word '.repeat(400), max_tokens: 4 }), OpenAI.BadRequestError, 400);
  check('prompt too long sizes', /256/.test(e400.error.message), e400.error.message);
  await expectError('body too large -> APIError 413',
    () => bc.completions.create({ model: 'x', prompt: 'a'.repeat(100000), max_tokens: 4 }), OpenAI.APIError, 413);
  // 503: the one sequence busy, no queue
  const ctl = new AbortController();
  const busy = await bc.chat.completions.create(chatParams('Tell me a long story.', { max_tokens: 100000,
    ignore_eos: true, stream: true }), { signal: ctl.signal });
  const it = busy[Symbol.asyncIterator]();
  await it.next();
  await it.next();
  const e503 = await expectError('full queue -> InternalServerError 503',
    () => bc.chat.completions.create(chatParams('hi', { max_tokens: 2 })), OpenAI.InternalServerError, 503);
  check('retry-after', e503.headers?.get('retry-after') === '1', 'no Retry-After: 1');
  ctl.abort();
  await it.next().catch(() => null);
  // the aborted stream's sequence is free again: the next request is served
  let served = null;
  for (let i = 0; i < 50 && !served; i++) {
    served = await bc.chat.completions.create(chatParams('hi', { max_tokens: 2 })).catch(() => null);
    if (!served) await new Promise((r) => setTimeout(r, 100));
  }
  check('served after abort', served && served.choices[0].finish_reason, 'not served after the abort');
  await stopServer(b);
  ok('limits (401, 400 with sizes, 413, 503 + Retry-After)');
}

async function partLossless() {
  const prompts = [
    'def read_config(path):', 'And the LORD spake unto Moses, saying,', 'import numpy as np\n', 'The quick brown fox',
    'class Stack:\n    def', 'for i in range(10):', 'In the beginning', 'Once upon a time', '#include <stdio.h>\n',
    'SELECT * FROM', 'The capital of France is', 'function add(a, b) {', 'Dear Sir,', 'def main():\n',
    'Chapter 1\n\n',
    // a prompt longer than --prefill-chunk (256): prefilled over several steps beside the others
    `values = [${Array.from({ length: 150 }, (_, i) => i * 7 % 101).join(', ')}]\n`,
  ];
  const N = 16;
  // the reference: `dflash generate` for each prompt (greedy)
  const ref = prompts.map((pr) => JSON.parse(execFileSync(cli, ['generate', '--json', '--temp', '0', '-n', String(N), '-p', pr],
    { encoding: 'utf8', timeout: 120000, stdio: ['ignore', 'pipe', 'ignore'] })));
  const s = await startServer(['-np', '16']);
  const c = client(s);
  // solo runs (one at a time): each prompt's own tau
  const solo = [];
  for (const pr of prompts) {
    solo.push(await c.completions.create({ model: 'x', prompt: pr, max_tokens: N, temperature: 0 }));
  }
  for (let i = 0; i < prompts.length; i++) {
    check(`solo ${i} == generate`, solo[i].choices[0].text === ref[i].text,
      () => `${JSON.stringify(prompts[i])}: ${JSON.stringify(solo[i].choices[0].text)} vs ${JSON.stringify(ref[i].text)}`);
  }
  ok('solo completions == dflash generate');
  const runs = await Promise.all(prompts.map(async (pr) => {
    const st = await c.completions.create({ model: 'x', prompt: pr, max_tokens: N, temperature: 0, stream: true,
      stream_options: { include_usage: true } });
    let text = '', timings = null;
    for await (const ch of st) { text += ch.choices[0]?.text ?? ''; if (ch.usage) timings = ch.timings; }
    return { text, timings };
  }));
  for (let i = 0; i < prompts.length; i++) {
    check(`stream ${i} == generate`, runs[i].text === ref[i].text,
      () => `${JSON.stringify(prompts[i])}: ${JSON.stringify(runs[i].text)} vs ${JSON.stringify(ref[i].text)}`);
    const a = runs[i].timings, b = solo[i].timings;
    check(`stream ${i} tau == solo`, a && b && a.steps === b.steps && a.draft_n_accepted === b.draft_n_accepted &&
      a.tau === b.tau, () => `concurrent ${JSON.stringify(a)} vs solo ${JSON.stringify(b)}`);
  }
  ok('16 concurrent streams == dflash generate, tau == solo tau');
  await stopServer(s);
}

async function partCancel() {
  const s = await startServer(['-np', '4']);
  const c = client(s);
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const jobs = [];
  for (let i = 0; i < 20; i++) {
    const after = rnd(12); // chunks to read before aborting (0: while queued or in prefill)
    const delay = rnd(200);
    jobs.push((async () => {
      const ctl = new AbortController();
      try {
        const st = await c.chat.completions.create(chatParams(`Story number ${i}:`, { max_tokens: 100000, ignore_eos: true,
          stream: true }), { signal: ctl.signal });
        if (after === 0) { setTimeout(() => ctl.abort(), delay); }
        let n = 0;
        for await (const _ of st) { if (++n >= after) { ctl.abort(); break; } }
      } catch (e) {
        if (!(e instanceof OpenAI.APIUserAbortError) && e?.name !== 'AbortError') throw e;
      }
    })());
  }
  await Promise.all(jobs);
  let m, t0 = Date.now();
  for (;;) {
    m = await metrics(s);
    if (m.get('num_requests_running') === 0 && m.get('num_requests_waiting') === 0) break;
    check('cancel drains', Date.now() - t0 < 20000, () => `still running after 20 s:\n${m.txt}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  check('cancel counted', m.get('request_cancelled_total') >= 15, () => `request_cancelled_total ${m.get('request_cancelled_total')}`);
  const h = await fetch(`${s.base}/health`);
  check('healthy after cancels', h.status === 200, `health ${h.status}`);
  const after = await c.chat.completions.create(chatParams('hi', { max_tokens: 4 }));
  check('serves after cancels', after.choices[0].finish_reason !== null, JSON.stringify(after));
  ok('20 aborted streams: 0 running afterwards, healthy, still serving');
  // SIGTERM while a stream runs: the stream still completes, the port closes, exit 0
  const st = await c.chat.completions.create(chatParams('A last story:', { max_tokens: 24, ignore_eos: true,
    stream: true, stream_options: { include_usage: true } }));
  let text = '', fin = null, usage = null, n = 0;
  for await (const ch of st) {
    if (++n === 2) s.proc.kill('SIGTERM');
    if (ch.usage) usage = ch.usage;
    text += ch.choices[0]?.delta?.content ?? '';
    if (ch.choices[0]?.finish_reason) fin = ch.choices[0].finish_reason;
  }
  check('in-flight stream finishes on SIGTERM', fin === 'length' && usage?.completion_tokens === 24,
    () => `finish ${fin}, usage ${JSON.stringify(usage)}`);
  let refused = false;
  try { await fetch(`${s.base}/health`, { signal: AbortSignal.timeout(5000) }); } catch { refused = true; }
  check('no new connections after SIGTERM', refused, 'the port still accepts');
  await s.exited;
  check('exit 0 after SIGTERM', s.exit.code === 0, () => `exit ${JSON.stringify(s.exit)}`);
  servers = servers.filter((x) => x !== s);
  ok('SIGTERM: in-flight stream completed, port closed, exit 0');
}

async function partLoad() {
  const s = await startServer(['-np', '16', '--max-queue', '32']);
  const c = client(s);
  let okN = 0, n503 = 0;
  const errs = [];
  const t0 = Date.now();
  await Promise.all(Array.from({ length: 64 }, async (_, k) => {
    for (let j = 0; j < 8; j++) {
      try {
        if ((k + j) % 2 === 0) {
          const r = await c.completions.create({ model: 'x', prompt: `Item ${k}-${j}:`, max_tokens: 2, temperature: 0.7 });
          if (r.choices[0].finish_reason) okN++;
        } else {
          const r = await streamText(c, chatParams(`Question ${k}-${j}?`, { max_tokens: 2 }));
          if (r.finish) okN++;
        }
      } catch (e) {
        if (e.status === 503) n503++;
        else errs.push(`${e.constructor.name} ${e.status}: ${e.message}`);
      }
    }
  }));
  check('load errors', errs.length === 0, () => `${errs.length} errors: ${errs.slice(0, 5).join('; ')}`);
  check('load completed', okN + n503 === 512, `${okN} ok + ${n503} 503`);
  check('load served', okN >= 128, `only ${okN} served`);
  const m = await metrics(s);
  check('load drained', m.get('num_requests_running') === 0 && m.get('num_requests_waiting') === 0, m.txt);
  const h = await fetch(`${s.base}/health`);
  check('load healthy', h.status === 200, `health ${h.status}`);
  ok(`load: 64 clients x 8 requests: ${okN} ok, ${n503} answered 503 (--max-queue), 0 errors, ${Date.now() - t0} ms`);
  await stopServer(s);
}

const parts = { api: partApi, lossless: partLossless, cancel: partCancel, load: partLoad };
if (!parts[part]) fail('args', `unknown part ${part}`);
try {
  await parts[part]();
} catch (e) {
  fail(part, `exception: ${e?.stack ?? e}`);
}
console.log('ALL OK');
process.exit(0);
