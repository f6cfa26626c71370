// cluster_fault.mjs: three `dflash serve` replicas behind HAProxy (tools/cluster.sh), driven by the
// official OpenAI client, with a drained and a killed replica in the middle of the run.
// Started by tests/test_cluster.c as `node cluster_fault.mjs ROOT CLI PORT DIR`.
//
// 8 clients x 10 completions at temperature 0, streaming and not, through HAProxy on PORT. After
// 20 completed requests replica r1 gets SIGTERM (it drains: in-flight requests finish, it leaves
// the pool); after 40, replica r2 gets SIGKILL. Required:
//   - every non-streaming request succeeds (HAProxy re-sends it elsewhere);
//   - every stream served by r1 (drained) completes;
//   - a stream cut by the SIGKILL ends in an error the client sees, never in a shorter text;
//   - every completed text equals the solo `dflash generate` output of its prompt.
// Then both replicas are restarted and must be back in HAProxy's pool (UP) within the
// health-check interval (rise 2 x inter 1 s) plus one second. Prints "ok NAME", "FAIL NAME: why"
// (exit 1), and a figures line.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const [root, cli, portArg, dir] = process.argv.slice(2);
if (!root || !cli || !portArg || !dir) {
  console.error('usage: node cluster_fault.mjs ROOT DFLASH_CLI PORT DIR');
  process.exit(2);
}
const port = Number(portArg);
const cluster = `${root}/tools/cluster.sh`;
const env = { ...process.env, DFLASH: cli, DFLASH_CLUSTER_DIR: dir };

function sh(args, timeout = 120000) {
  return execFileSync(cluster, args, { env, timeout, encoding: 'utf8' });
}
function down() {
  try { sh(['down']); } catch (e) { console.log(`cluster down: ${e.message}`); }
}
function fail(name, why) {
  console.log(`FAIL ${name}: ${why}`);
  try { console.log(sh(['status'])); } catch (e) { console.log(e.stdout || ''); }
  // HAProxy's log lines of the requests that did not end as a plain 200 (status, termination
  // flags, retries: what a flaky failure needs) and its server events; the test's folder is
  // removed afterwards
  try {
    const lines = readFileSync(`${dir}/haproxy.log`, 'utf8').split('\n')
      .filter((l) => /Server |"(GET|POST) /.test(l) && !/ 200 \d+ - - ---- \S+\/\d+ /.test(l));
    console.log(`haproxy.log (${lines.length} lines other than plain 200s):\n${lines.slice(-40).join('\n')}`);
  } catch (e) { console.log(`haproxy.log: ${e.message}`); }
  down();
  process.exit(1);
}
function check(name, cond, why) {
  if (!cond) fail(name, typeof why === 'function' ? why() : why);
}
const ok = (name) => console.log(`ok ${name}`);

const prompts = [
  'def read_config(path):',
  'And the LORD spake unto Moses, saying,',
  'import os\nimport sys\n\ndef main():',
  'In the beginning God created',
  'class Queue:\n    def __init__(self):',
  'Blessed are the meek: for',
  'def parse_args(argv):',
  'And it came to pass, when',
];
const MAX_TOKENS = 40;

// the solo outputs, from the CLI with the same pair and settings
const solo = prompts.map((p) => {
  const out = execFileSync(cli, ['generate', '-p', p, '-n', String(MAX_TOKENS), '--temp', '0', '--json'],
    { encoding: 'utf8', timeout: 60000 });
  return JSON.parse(out).text;
});
ok('solo references');

// pool state from HAProxy's CSV: { r1: 'UP', ... }
async function pool() {
  const r = await fetch(`http://127.0.0.1:${port + 100}/stats;csv`, { signal: AbortSignal.timeout(5000) });
  const out = {};
  for (const line of (await r.text()).split('\n')) {
    const f = line.split(',');
    if (f[0] === 'dflash_replicas' && f[1] !== 'BACKEND' && f[1] !== 'FRONTEND') out[f[1]] = f[17];
  }
  return out;
}

try {
  sh(['up', '3', '--port', String(port), '--', '-np', '4'], 180000);
} catch (e) {
  fail('cluster up', `${e.message}\n${e.stdout || ''}${e.stderr || ''}`);
}
ok('cluster up (3 replicas)');

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
let done = 0, termSent = false, killSent = false;
const results = [];
const inflight = new Set(); // records whose response has started and not ended
let drainedInFlight = [];   // streams on r1 in flight when it got SIGTERM
let killTime = Infinity;    // when r2 got SIGKILL
const t0 = Date.now();

// SIGTERM to r1 once 20 requests are done, at a moment when a stream is in flight on r1 (so the
// drain is exercised on a live stream); after 60 requests it is sent regardless (and the count
// of such streams, possibly 0, is reported)
function maybeFault() {
  if (!termSent && done >= 20) {
    const onR1 = [...inflight].filter((r) => r.stream && r.replica === 'r1');
    if (onR1.length > 0 || done >= 60) {
      termSent = true;
      drainedInFlight = onR1;
      sh(['kill', '1', 'TERM']);
      console.log(`(after ${done} requests: SIGTERM to r1 with ${onR1.length} stream(s) in flight on it)`);
    }
  }
  if (termSent && !killSent && done >= 40) {
    killSent = true;
    const onR2 = [...inflight].filter((r) => r.replica === 'r2').length;
    killTime = Date.now();
    sh(['kill', '2', 'KILL']);
    console.log(`(after ${done} requests: SIGKILL to r2 with ${onR2} request(s) in flight on it)`);
  }
}

async function one(ci, k) {
  const pi = (ci + k) % prompts.length;
  const stream = (ci + k) % 2 === 1;
  const ts = Date.now();
  const rec = { ci, k, pi, stream, replica: null, text: null, error: null, t: 0, start: ts, end: 0 };
  try {
    const params = { model: 'dflash-embedded', prompt: prompts[pi], max_tokens: MAX_TOKENS, temperature: 0 };
    if (stream) {
      const { data, response } = await client.completions.create({ ...params, stream: true }).withResponse();
      rec.replica = response.headers.get('x-dflash-replica');
      inflight.add(rec);
      maybeFault();
      let text = '', finish = null;
      for await (const chunk of data) {
        for (const ch of chunk.choices) {
          if (ch.text) text += ch.text;
          if (ch.finish_reason) finish = ch.finish_reason;
        }
      }
      if (finish === null) throw new Error('stream ended without a finish_reason');
      rec.text = text;
    } else {
      const { data, response } = await client.completions.create(params).withResponse();
      rec.replica = response.headers.get('x-dflash-replica');
      rec.text = data.choices[0].text;
    }
  } catch (e) {
    rec.error = `${e?.constructor?.name}: ${e?.message}`;
  }
  inflight.delete(rec);
  rec.end = Date.now();
  rec.t = rec.end - ts;
  results.push(rec);
  done++;
  maybeFault();
}

await Promise.all(Array.from({ length: 8 }, async (_, ci) => {
  for (let k = 0; k < 10; k++) await one(ci, k);
}));
const wall = Date.now() - t0;
check('all requests ran', results.length === 80, `${results.length} results`);
check('faults injected', termSent && killSent, 'the run ended before both faults');

let failedNonStream = 0, cutStreams = 0, wrongText = 0, drainedStreams = 0, badErrors = 0;
for (const r of results) {
  const what = `client ${r.ci} request ${r.k} (${r.stream ? 'stream' : 'plain'}, replica ${r.replica})`;
  if (r.error !== null) {
    if (!r.stream) { failedNonStream++; console.log(`  non-streaming request failed: ${what}: ${r.error}`); continue; }
    // a stream may fail only if the kill cut it: its replica was the killed one, or its response
    // had not started (no replica header yet) when the kill came, and it failed after the kill
    const cutByKill = r.replica === 'r2' || (r.replica === null && r.start < killTime && r.end >= killTime);
    if (!cutByKill) { badErrors++; console.log(`  stream failed on a live replica: ${what}: ${r.error}`); }
    cutStreams++;
    continue;
  }
  if (r.stream && r.replica === 'r1') drainedStreams++;
  if (r.text !== solo[r.pi]) {
    wrongText++;
    console.log(`  ${what}: text differs from the solo output:\n    got  ${JSON.stringify(r.text)}\n    want ${JSON.stringify(solo[r.pi])}`);
  }
}
console.log(`figures: 80 requests in ${wall} ms through HAProxy, non-streaming failures ${failedNonStream}, ` +
  `streams cut by the SIGKILL ${cutStreams}, streams completed on the drained replica ${drainedStreams}, ` +
  `texts different from solo ${wrongText}`);
check('every non-streaming request succeeded', failedNonStream === 0, `${failedNonStream} failed`);
check('streams fail only on the killed replica', badErrors === 0, `${badErrors} failed elsewhere`);
for (const r of drainedInFlight) {
  check('a stream in flight on the drained replica completes', r.error === null && r.text === solo[r.pi],
    () => `client ${r.ci} request ${r.k}: ${r.error ?? JSON.stringify(r.text)}`);
}
console.log(`figures: ${drainedInFlight.length} stream(s) in flight on r1 at its SIGTERM, all completed`);
check('every completed text equals its solo output', wrongText === 0, `${wrongText} differ`);
ok('fault run: drained replica finished its streams, killed replica cost only its own streams');

// the drained replica exits by itself (0); the killed one is gone
let st = '';
try { st = sh(['status']); } catch (e) { st = e.stdout || ''; }
check('r1 exited after draining', /replica 1 +not running/.test(st), st);
check('r2 is gone', /replica 2 +not running/.test(st), st);

// restarted replicas are back in the pool within the check interval
for (const i of [1, 2]) sh(['restart', String(i)]);
const tr = Date.now();
let p = {};
while (Date.now() - tr < 10000) {
  p = await pool();
  if (p.r1 === 'UP' && p.r2 === 'UP' && p.r3 === 'UP') break;
  await new Promise((r) => setTimeout(r, 100));
}
const back = Date.now() - tr;
check('restarted replicas back in the pool', p.r1 === 'UP' && p.r2 === 'UP', () => JSON.stringify(p));
check('back within the health-check interval', back <= 3000, `${back} ms`);
console.log(`figures: restarted replicas UP in HAProxy after ${back} ms`);
// and they serve
const again = await Promise.all(prompts.slice(0, 6).map((pr, i) =>
  client.completions.create({ model: 'dflash-embedded', prompt: pr, max_tokens: MAX_TOKENS, temperature: 0 }).withResponse()
    .then(({ data, response }) => ({ i, text: data.choices[0].text, replica: response.headers.get('x-dflash-replica') }))));
for (const a of again) check('after restart', a.text === solo[a.i], `${a.replica}: ${JSON.stringify(a.text)}`);
ok(`restarted replicas back in the pool (${back} ms) and serving`);
down();
ok('cluster down');
