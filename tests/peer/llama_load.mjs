// llama_load.mjs: peer check with llama.cpp (node-llama-cpp 3.21.1, prebuilt CPU binaries, never
// compiles). For each model: load it, create a context, tokenize a prompt (or take --tokens),
// generate --n tokens greedily; print one JSON line per model:
//   {"model":"..","ok":true,"prompt":[ids],"generated":[ids],"text":".."}
// --load-only stops after loading (a DFlash drafter cannot get a context of its own: llama.cpp
// needs the target context for it). A failure prints {"model":"..","ok":false,"error":".."}
// and the exit status is 1.
//
// --log-grep TEXT adds "log_match": llama.cpp's log lines (info level) that contain TEXT.
//
// usage: node llama_load.mjs MODEL.gguf... [--prompt TEXT | --tokens 1,2,3] [--n N] [--load-only]
//        [--log-grep TEXT]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const models = [];
let prompt = " the quick brown fox";
let tokensArg = null;
let nGen = 8;
let loadOnly = false;
let logGrep = null;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
    if (args[i] === "--prompt") prompt = args[++i];
    else if (args[i] === "--tokens") tokensArg = args[++i].split(",").map((s) => parseInt(s, 10));
    else if (args[i] === "--n") nGen = parseInt(args[++i], 10);
    else if (args[i] === "--load-only") loadOnly = true;
    else if (args[i] === "--log-grep") logGrep = args[++i];
    else if (args[i].startsWith("--")) {
        console.log(JSON.stringify({ok: false, error: `unknown argument ${args[i]}`}));
        process.exit(2);
    } else models.push(args[i]);
}

const llamaLog = [];
const llama = await getLlama({
    build: "never",
    gpu: false,
    logLevel: logGrep !== null ? LlamaLogLevel.info : LlamaLogLevel.warn,
    logger: (level, message) => { llamaLog.push(String(message).trim()); },
});
let failed = false;
for (const modelPath of models) {
    llamaLog.length = 0;
    const out = {model: modelPath, ok: true};
    let model = null;
    try {
        model = await llama.loadModel({modelPath, gpuLayers: 0});
        if (!loadOnly) {
            const context = await model.createContext({contextSize: 256, batchSize: 64, threads: 1});
            const sequence = context.getSequence();
            const promptTokens = tokensArg ?? model.tokenize(prompt, false);
            const generated = [];
            if (nGen > 0) {
                for await (const token of sequence.evaluate(promptTokens, {temperature: 0})) {
                    generated.push(token);
                    if (generated.length >= nGen) break;
                }
            }
            out.prompt = promptTokens;
            out.generated = generated;
            out.text = model.detokenize(generated);
            await context.dispose();
        }
    } catch (e) {
        out.ok = false;
        out.error = String(e && e.message ? e.message : e);
        out.llama_log = llamaLog.slice(-5).join(" | ");
        failed = true;
    }
    if (model) await model.dispose();
    if (logGrep !== null) out.log_match = llamaLog.filter((l) => l.includes(logGrep));
    console.log(JSON.stringify(out));
}
await llama.dispose();
process.exit(failed ? 1 : 0);
