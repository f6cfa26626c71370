// llama_greedy.mjs: the llama.cpp oracle for greedy tokens (node-llama-cpp 3.21.1, prebuilt CPU
// binaries). Loads one GGUF, then for each prompt (token ids) generates N tokens greedily from a
// fresh sequence and prints one JSON line: {"ok":true,"results":[[ids],...]}.
//
// usage: node llama_greedy.mjs MODEL.gguf --cases 1,2,3;4,5 --n N [--ctx C] [--batch B]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

let modelPath = null, cases = [], nGen = 16, ctx = 512, batch = 16;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
    if (args[i] === "--cases") cases = args[++i].split(";").map((c) => c.split(",").map((s) => parseInt(s, 10)));
    else if (args[i] === "--n") nGen = parseInt(args[++i], 10);
    else if (args[i] === "--ctx") ctx = parseInt(args[++i], 10);
    else if (args[i] === "--batch") batch = parseInt(args[++i], 10);
    else if (!args[i].startsWith("--")) modelPath = args[i];
    else { console.log(JSON.stringify({ok: false, error: `unknown argument ${args[i]}`})); process.exit(2); }
}
const llama = await getLlama({build: "never", gpu: false, logLevel: LlamaLogLevel.error});
try {
    const model = await llama.loadModel({modelPath, gpuLayers: 0});
    const context = await model.createContext({contextSize: ctx, batchSize: batch, threads: 2, flashAttention: false,
                                               batching: {dispatchSchedule: "nextTick"}});
    const results = [];
    for (const prompt of cases) {
        const sequence = context.getSequence();
        const out = [];
        for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
            out.push(token);
            if (out.length >= nGen) break;
        }
        results.push(out);
        sequence.dispose();
    }
    await context.dispose();
    await model.dispose();
    console.log(JSON.stringify({ok: true, results}));
} catch (e) {
    console.log(JSON.stringify({ok: false, error: String(e && e.message ? e.message : e)}));
    process.exit(1);
}
await llama.dispose();
