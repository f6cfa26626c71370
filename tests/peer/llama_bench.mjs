// llama_bench.mjs: llama.cpp speed on a GGUF through node-llama-cpp 3.21.1 (prebuilt CPU build),
// for `dflash bench --llama`: tg (tokens generated one at a time) and ppN (a prompt of N tokens in
// one batch), each the median of --reps repetitions after a warm-up. Prints one JSON line.
//
// usage: node llama_bench.mjs MODEL.gguf [--threads T] [--tg N] [--pp N] [--reps R]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

let modelPath = null, threads = 2, tg = 32, pp = 16, reps = 3;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
    if (args[i] === "--threads") threads = parseInt(args[++i], 10);
    else if (args[i] === "--tg") tg = parseInt(args[++i], 10);
    else if (args[i] === "--pp") pp = parseInt(args[++i], 10);
    else if (args[i] === "--reps") reps = parseInt(args[++i], 10);
    else modelPath = args[i];
}
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
const llama = await getLlama({build: "never", gpu: false, logLevel: LlamaLogLevel.error});
try {
    const model = await llama.loadModel({modelPath, gpuLayers: 0});
    const context = await model.createContext({contextSize: 1024, batchSize: Math.max(pp, 16), threads,
                                               flashAttention: false, batching: {dispatchSchedule: "nextTick"}});
    const prompt = Array.from({length: pp}, (_, i) => (i * 7 + 3) % 200 + 1);
    const ppTimes = [], tgTimes = [];
    for (let r = 0; r <= reps; r++) {
        const seq = context.getSequence();
        let t0 = performance.now();
        await seq.evaluateWithoutGeneratingNewTokens(prompt);
        const tp = performance.now() - t0;
        t0 = performance.now();
        let n = 0;
        for await (const token of seq.evaluate([prompt[0]], {temperature: 0})) {
            if (++n >= tg) break;
        }
        const tt = performance.now() - t0;
        if (r > 0) { ppTimes.push(tp); tgTimes.push(tt); } /* r == 0 is the warm-up */
        seq.dispose();
    }
    const ppMs = median(ppTimes), tgMs = median(tgTimes);
    console.log(JSON.stringify({ok: true, pp, tg, pp_ms: ppMs, pp_tok_s: pp / (ppMs / 1e3), tg_ms: tgMs,
                                tg_tok_s: tg / (tgMs / 1e3)}));
    await context.dispose();
    await model.dispose();
} catch (e) {
    console.log(JSON.stringify({ok: false, error: String(e && e.message ? e.message : e)}));
    process.exit(1);
}
await llama.dispose();
