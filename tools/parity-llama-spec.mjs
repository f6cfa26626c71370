#!/usr/bin/env node
// parity-llama-spec.mjs: draft-for-draft parity of `dflash generate` with llama.cpp's
// `llama-speculative-simple` on the same GGUF pair, greedy, fixed draft length (docs/drafter.md).
//
// Both engines run the same loop: the prompt but its last token is prefilled, each step drafts
// k tokens from the last committed token (the last prompt token first), the target verifies
// them in one batch and keeps the longest agreeing prefix plus its own next token. So with the
// same files the generated text and every step's accepted count must match. llama.cpp's example
// shortens its drafts to the remaining -n budget near the end (and drafts a full block again once
// the budget is spent), so steps are compared while llama.cpp drafted the full k (dflash never
// shortens a draft for the budget). Speed: a second llama.cpp run without -v (its per-step log)
// gives its "decoded N tokens in T seconds"; dflash's is its --json t_gen_ms.
//
// usage: node tools/parity-llama-spec.mjs --llama PATH/llama-speculative-simple
//          [-m models/target.gguf] [-md models/drafter.gguf] [--spec-type draft-dflash]
//          [--draft 7] [-n 64] [--count 10] [--prompts models/spec_eval.json] [-t 2]
//          [--dflash build/dflash] [--out FILE.md] [--explain PYTHON]
// Prompts: the first --count held-out prompts of each domain in models/spec_eval.json.
// --explain PYTHON (a python3 with numpy; DFlash2 drafters): for each prompt whose steps differ,
// bench/dflash2_parity/near_tie.py prints the float64 reference at the first differing step
// (dflash's context there): the walk margin and the top-k boundary gap at the first draft
// position, and whether a near-tie decides the draft; the report quotes it.
// Exit 0 when every prompt agrees (text and steps), 1 otherwise.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const opt = {
    llama: null, m: "models/target.gguf", md: "models/drafter.gguf", type: "draft-dflash", draft: 7, n: 64,
    count: 10, prompts: "models/spec_eval.json", t: 2, dflash: "build/dflash", out: null, explain: null,
};
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
    const a = argv[i], v = argv[i + 1];
    const take = () => { if (v === undefined) { console.error(`parity: option ${a} needs a value`); process.exit(2); } i++; return v; };
    if (a === "--llama") opt.llama = take();
    else if (a === "-m") opt.m = take();
    else if (a === "-md") opt.md = take();
    else if (a === "--spec-type") opt.type = take();
    else if (a === "--draft") opt.draft = parseInt(take(), 10);
    else if (a === "-n") opt.n = parseInt(take(), 10);
    else if (a === "--count") opt.count = parseInt(take(), 10);
    else if (a === "--prompts") opt.prompts = take();
    else if (a === "-t") opt.t = parseInt(take(), 10);
    else if (a === "--dflash") opt.dflash = take();
    else if (a === "--out") opt.out = take();
    else if (a === "--explain") opt.explain = take();
    else { console.error(`parity: unknown option ${a}`); process.exit(2); }
}
if (!opt.llama) { console.error("parity: --llama PATH/llama-speculative-simple is required"); process.exit(2); }

const evalData = JSON.parse(readFileSync(opt.prompts, "utf8"));
const prompts = [];
for (const [dom, d] of Object.entries(evalData.domains)) {
    for (const s of d.samples.slice(0, opt.count)) prompts.push({ dom, text: s.prompt });
}

function runLlama(prompt, verbose) {
    const args = ["-m", opt.m, "-md", opt.md, "--spec-type", opt.type, "--spec-draft-n-max", String(opt.draft),
        "--spec-draft-n-min", "0", "-p", prompt, "-n", String(opt.n), "--temp", "0", "-t", String(opt.t),
        "-c", "4096", ...(verbose ? ["-v"] : [])];
    const r = spawnSync(opt.llama, args, { encoding: "utf8", maxBuffer: 1 << 28 });
    if (r.status !== 0) throw new Error(`llama-speculative-simple exited ${r.status}: ${(r.stderr || "").slice(-2000)}`);
    // stdout: "\n\n" + prompt + generated text + "\n\n"
    let out = r.stdout.replace(/^\n\n/, "");
    if (!out.startsWith(prompt)) throw new Error("llama.cpp's output does not start with the prompt");
    out = out.slice(prompt.length).replace(/\n\n\n\n$/, ""); // two "\n\n" follow the text
    const steps = [];
    for (const m of r.stderr.matchAll(/accepted (\d+)\/(\d+) draft tokens/g)) steps.push([+m[2], +m[1]]);
    const sp = /decoded\s+(\d+) tokens in\s+([0-9.]+) seconds/.exec(r.stderr);
    return { text: out, steps, n_gen: sp ? +sp[1] : 0, ms: sp ? 1000 * +sp[2] : 0, cmd: [opt.llama, ...args] };
}

function runDflash(prompt) {
    const args = ["generate", "-m", opt.m, "-md", opt.md, "-p", prompt, "-n", String(opt.n + 1),
        "--draft-max", String(opt.draft), "--draft-min", "0", "-t", String(opt.t), "--json"];
    const r = spawnSync(opt.dflash, args, { encoding: "utf8", maxBuffer: 1 << 28 });
    if (r.status !== 0) throw new Error(`dflash exited ${r.status}: ${(r.stderr || "").slice(-2000)}`);
    const j = JSON.parse(r.stdout);
    return { text: j.text, steps: j.steps, n_gen: j.n_gen, ms: j.t_gen_ms, cmd: [opt.dflash, ...args], json: r.stdout };
}

// The float64 reference at dflash's step `step` (bench/dflash2_parity/near_tie.py); its report or the error.
function explainStep(D, step) {
    const dir = mkdtempSync(join(tmpdir(), "parity-"));
    try {
        const run = join(dir, "run.json");
        writeFileSync(run, D.json);
        const script = join(dirname(fileURLToPath(import.meta.url)), "..", "bench", "dflash2_parity", "near_tie.py");
        const r = spawnSync(opt.explain, [script, "--target", opt.m, "--drafter", opt.md, "--run", run, "--step", String(step),
            "--positions", "1"], { encoding: "utf8", maxBuffer: 1 << 24 });
        if (r.error) return `near_tie.py did not run: ${r.error.message}`;
        return r.status === 0 ? r.stdout.trimEnd() : `near_tie.py failed (${r.status}): ${(r.stderr || "").trim().slice(-500)}`;
    } finally {
        rmSync(dir, { recursive: true, force: true });
    }
}

const rows = [];
let ok = true, totD = 0, totA = 0, totSteps = 0;
const speed = { lt: 0, lms: 0, dt: 0, dms: 0 }; /* generated tokens and ms, summed over prompts */
for (const p of prompts) {
    let L, D;
    try {
        L = runLlama(p.text, true);
        const Ls = runLlama(p.text, false); /* the timing run, without the per-step log */
        L.n_gen = Ls.n_gen;
        L.ms = Ls.ms;
        D = runDflash(p.text);
    } catch (e) {
        console.log(`${p.dom.padEnd(6)} FAILED to run: ${e.message}`);
        rows.push({ dom: p.dom, n: 0, drafted: 0, accepted: 0, accD: 0, stepOk: false, textOk: false, firstDiff: -1,
            textDiff: -1, chars: 0 });
        ok = false;
        continue;
    }
    // steps where llama.cpp drafted the full k (before its budget cap)
    let n = 0;
    while (n < L.steps.length && L.steps[n][0] === opt.draft) n++;
    let stepOk = D.steps.length >= n, firstDiff = -1;
    for (let i = 0; i < n && stepOk; i++) {
        if (D.steps[i][0] !== L.steps[i][0] || D.steps[i][1] !== L.steps[i][1]) { stepOk = false; firstDiff = i; }
    }
    const k = Math.min(L.text.length, D.text.length);
    const textOk = L.text.slice(0, k) === D.text.slice(0, k) && k > 0;
    let textDiff = -1;
    if (!textOk) { textDiff = 0; while (textDiff < k && L.text[textDiff] === D.text[textDiff]) textDiff++; }
    const drafted = L.steps.slice(0, n).reduce((s, x) => s + x[0], 0);
    const accepted = L.steps.slice(0, n).reduce((s, x) => s + x[1], 0);
    const accD = D.steps.slice(0, n).reduce((s, x) => s + x[1], 0);
    totD += drafted; totA += accepted; totSteps += n;
    speed.lt += L.n_gen; speed.lms += L.ms; speed.dt += D.n_gen; speed.dms += D.ms;
    const good = stepOk && textOk;
    ok = ok && good;
    const why = opt.explain && firstDiff >= 0 ? explainStep(D, firstDiff) : null;
    rows.push({ dom: p.dom, n, drafted, accepted, accD, stepOk, textOk, firstDiff, textDiff, chars: k,
        lstep: firstDiff >= 0 ? L.steps[firstDiff] : null, dstep: firstDiff >= 0 ? D.steps[firstDiff] : null, why });
    console.log(`${p.dom.padEnd(6)} steps ${String(n).padStart(3)}  n_drafted ${String(drafted).padStart(4)}  ` +
        `n_accepted llama ${String(accepted).padStart(4)} dflash ${String(accD).padStart(4)}  text ${textOk ? "same" : "DIFFERS at char " + textDiff} ` +
        `(${k} chars)  steps ${stepOk ? "same" : "DIFFER at step " + firstDiff + " llama " + JSON.stringify(L.steps[firstDiff]) + " dflash " + JSON.stringify(D.steps[firstDiff])}`);
    if (!textOk) {
        console.log(`       llama:  ${JSON.stringify(L.text.slice(Math.max(0, textDiff - 40), textDiff + 40))}`);
        console.log(`       dflash: ${JSON.stringify(D.text.slice(Math.max(0, textDiff - 40), textDiff + 40))}`);
        console.log(`       prompt: ${JSON.stringify(p.text)}`);
    }
    if (why) console.log(why);
}
const tpsL = speed.lms > 0 ? speed.lt / (speed.lms / 1e3) : 0, tpsD = speed.dms > 0 ? speed.dt / (speed.dms / 1e3) : 0;
const summary = `${rows.filter(r => r.stepOk && r.textOk).length} of ${rows.length} prompts agree; compared steps ${totSteps}, ` +
    `n_drafted ${totD}, n_accepted ${totA} (tau ${(totSteps ? (totA + totSteps) / totSteps : 0).toFixed(2)}); ` +
    `speed (generated tokens / generation time, all prompts, -t ${opt.t}): llama.cpp ${tpsL.toFixed(1)} tok/s, ` +
    `dflash ${tpsD.toFixed(1)} tok/s (${tpsL > 0 ? (tpsD / tpsL).toFixed(2) : "?"}x)`;
console.log(summary);
if (opt.out) {
    const lines = [`# Parity with llama.cpp: ${opt.type}, draft ${opt.draft}, -n ${opt.n}`, "",
        `Files: \`${opt.m}\`, \`${opt.md}\`; prompts: the first ${opt.count} per domain of \`${opt.prompts}\`.`, "",
        "Commands (per prompt):", "", "```", `${opt.llama} -m ${opt.m} -md ${opt.md} --spec-type ${opt.type} --spec-draft-n-max ${opt.draft} --spec-draft-n-min 0 -p PROMPT -n ${opt.n} --temp 0 -t ${opt.t} -c 4096 -v`,
        `${opt.dflash} generate -m ${opt.m} -md ${opt.md} -p PROMPT -n ${opt.n + 1} --draft-max ${opt.draft} --draft-min 0 -t ${opt.t} --json`, "```", "",
        "| # | domain | steps compared | n_drafted | n_accepted llama.cpp | n_accepted dflash | text | steps |", "|---|---|---|---|---|---|---|---|",
        ...rows.map((r, i) => `| ${i} | ${r.dom} | ${r.n} | ${r.drafted} | ${r.accepted} | ${r.accD} | ${r.textOk ? "same" : "differs at char " + r.textDiff} | ${r.stepOk ? "same" : "differ at step " + r.firstDiff}` + " |"),
        "", summary, ""];
    for (const [i, r] of rows.entries()) {
        if (!r.why) continue;
        lines.push(`Row ${i}, step ${r.firstDiff}: llama.cpp [drafted, accepted] ${JSON.stringify(r.lstep)}, dflash ${JSON.stringify(r.dstep)}; ` +
            "the float64 reference at dflash's context of that step (`bench/dflash2_parity/near_tie.py --run RUN.json " +
            `--step ${r.firstDiff} --positions 1\`, RUN.json = dflash's --json output):`, "", "```", r.why, "```", "");
    }
    writeFileSync(opt.out, lines.join("\n"));
}
process.exit(ok ? 0 : 1);
