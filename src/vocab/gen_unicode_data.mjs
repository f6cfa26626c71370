// gen_unicode_data.mjs: writes unicode_data.c, the Unicode tables of the tokenizer, from the
// Unicode data of the JavaScript engine that runs the reference tokenizer (transformers.js on
// node), so dflash classifies and normalizes exactly as the oracle does:
//   - per code point: pre-tokenizer class (\p{L}, \p{N}, JS \s, other), NFC flags;
//   - canonical decompositions (full NFD of each code point), canonical combining class ranks
//     (derived from canonical reordering; only their order matters to NFC), composition pairs
//     (derived from the primary composites).
// The derived tables are checked here against String.prototype.normalize before writing.
// Usage: node src/vocab/gen_unicode_data.mjs   (from the repository root)
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const SHIFT = 7; // must match UNICODE_BLOCK_SHIFT in unicode_data.h
const N_CP = 0x110000;
const isSur = (cp) => cp >= 0xd800 && cp <= 0xdfff;
const S = (cp) => String.fromCodePoint(cp);
const cps = (s) => Array.from(s, (c) => c.codePointAt(0));
const isHangulSyl = (cp) => cp >= 0xac00 && cp <= 0xd7a3;
const isHangulVT = (cp) => (cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11a8 && cp <= 0x11c2);

// 1. classes
const reL = /\p{L}/u, reN = /\p{N}/u, reS = /\s/u;
const cls = new Uint8Array(N_CP);
for (let cp = 0; cp < N_CP; cp++) {
  if (isSur(cp)) continue;
  const s = S(cp);
  cls[cp] = reL.test(s) ? 1 : reN.test(s) ? 2 : reS.test(s) ? 3 : 0;
}

// 2. decompositions
const nfd = new Map(); // cp -> [cps] (full canonical decomposition), Hangul excluded
for (let cp = 0; cp < N_CP; cp++) {
  if (isSur(cp) || isHangulSyl(cp)) continue;
  const d = S(cp).normalize("NFD");
  if (d !== S(cp)) nfd.set(cp, cps(d));
}

// 3. non-starters and their combining class order. Canonical reordering swaps two adjacent
// non-starters a b iff ccc(a) > ccc(b); U+0345 has the highest class (240), U+0334 the lowest (1).
const swaps = (a, b) => a !== b && ("a" + S(a) + S(b)).normalize("NFD") === "a" + S(b) + S(a);
const nonstarters = [];
for (let cp = 0; cp < N_CP; cp++) {
  if (isSur(cp) || nfd.has(cp) || isHangulSyl(cp)) continue;
  if (cp === 0x345 || cp === 0x334 || swaps(0x345, cp) || swaps(cp, 0x334)) nonstarters.push(cp);
}
const cmp = (a, b) => (swaps(a, b) ? 1 : swaps(b, a) ? -1 : 0);
nonstarters.sort(cmp);
const rank = new Map();
let r = 0;
for (let i = 0; i < nonstarters.length; i++) {
  if (i === 0 || cmp(nonstarters[i - 1], nonstarters[i]) !== 0) r++;
  rank.set(nonstarters[i], r);
}
if (r > 255) throw new Error("too many combining classes");
// the order must be total and consistent: check every pair of class representatives
const reps = [];
for (const cp of nonstarters) if (reps.length === 0 || rank.get(reps[reps.length - 1]) !== rank.get(cp)) reps.push(cp);
for (let i = 0; i < reps.length; i++)
  for (let j = 0; j < reps.length; j++) {
    const want = i < j ? -1 : i > j ? 1 : 0;
    if (cmp(reps[i], reps[j]) !== want) throw new Error(`ccc order inconsistent ${reps[i]} ${reps[j]}`);
  }
const ccc = (cp) => rank.get(cp) ?? 0;

// 4. composition pairs from primary composites (NFC(P) == P, NFD(P) != P)
const pairs = new Map(); // (first * 0x200000 + second) -> composite
let ambiguous = 0;
for (const [cp, d] of nfd) {
  if (S(cp).normalize("NFC") !== S(cp)) continue; // excluded or singleton
  const found = [];
  for (let j = d.length - 1; j >= 0; j--) {
    const rest = d.filter((_, k) => k !== j);
    const a = cps(String.fromCodePoint(...rest).normalize("NFC"));
    if (a.length !== 1) continue;
    if ((S(a[0]) + S(d[j])).normalize("NFC") === S(cp)) found.push([a[0], d[j]]);
  }
  if (found.length === 0) throw new Error(`no pair for ${cp.toString(16)}`);
  if (found.length > 1) ambiguous++;
  const [a, b] = found[0]; // the last decomposed code point as the second element
  pairs.set(a * 0x200000 + b, cp);
}
const seconds = new Set([...pairs.keys()].map((k) => k % 0x200000));

// 5. flags: NFC_SAFE = the code point is unchanged by NFC, a starter, and never combines with
// what precedes it (a string of such code points is NFC); DECOMP = has a canonical decomposition;
// SECOND = can be the second element of a composition.
const props = new Uint8Array(N_CP);
for (let cp = 0; cp < N_CP; cp++) {
  let p = cls[cp];
  if (isSur(cp)) { props[cp] = p; continue; }
  const s = S(cp);
  const first = nfd.has(cp) ? nfd.get(cp)[0] : cp;
  const second = seconds.has(cp) || isHangulVT(cp);
  if (s.normalize("NFC") === s && ccc(cp) === 0 && ccc(first) === 0 && !second) p |= 4;
  if (nfd.has(cp)) p |= 8;
  if (second) p |= 16;
  props[cp] = p;
}

// 6. check: a JS implementation of NFC over these tables must equal String.prototype.normalize
function nfcTables(input) {
  const d = [];
  for (const cp of input) {
    if (isHangulSyl(cp)) {
      const s = cp - 0xac00, l = 0x1100 + Math.floor(s / 588), v = 0x1161 + Math.floor((s % 588) / 28), t = 0x11a7 + (s % 28);
      d.push(l, v); if (t !== 0x11a7) d.push(t);
    } else if (nfd.has(cp)) d.push(...nfd.get(cp)); else d.push(cp);
  }
  for (let i = 1; i < d.length; i++) { // stable insertion sort of non-starter runs
    const c = ccc(d[i]); if (c === 0) continue;
    let j = i; while (j > 0 && ccc(d[j - 1]) > c) { [d[j - 1], d[j]] = [d[j], d[j - 1]]; j--; }
  }
  const out = []; let starter = -1, lastCcc = -1;
  for (const cp of d) {
    const c = ccc(cp);
    if (starter >= 0 && (lastCcc < c || (lastCcc === 0 && out.length - 1 === starter))) {
      const f = out[starter];
      let comp = -1;
      if (f >= 0x1100 && f <= 0x1112 && cp >= 0x1161 && cp <= 0x1175) comp = 0xac00 + ((f - 0x1100) * 21 + (cp - 0x1161)) * 28;
      else if (f >= 0xac00 && f <= 0xd7a3 && (f - 0xac00) % 28 === 0 && cp >= 0x11a8 && cp <= 0x11c2) comp = f + (cp - 0x11a7);
      else comp = pairs.get(f * 0x200000 + cp) ?? -1;
      if (comp >= 0) { out[starter] = comp; continue; }
    }
    if (c === 0) { starter = out.length; lastCcc = 0; } else lastCcc = c;
    out.push(cp);
  }
  return out;
}
const tests = [];
for (let cp = 0; cp < N_CP; cp++) if (!isSur(cp) && (props[cp] & 0x1c) !== 4) tests.push([cp]);
for (const k of pairs.keys()) tests.push([Math.floor(k / 0x200000), k % 0x200000]);
let seed = 12345; const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const marks = nonstarters, interesting = [...nfd.keys(), ...seconds, 0x1100, 0x1161, 0x11a8, 0xac00, 0xac01, 0x41, 0x61];
for (let i = 0; i < 200000; i++) {
  const n = 1 + rnd(6), t = [];
  for (let k = 0; k < n; k++) { const w = rnd(3); t.push(w === 0 ? marks[rnd(marks.length)] : interesting[rnd(interesting.length)]); }
  tests.push(t);
}
for (let i = 0; i < 20000; i++) { // safe code points stay safe in any order
  const t = []; for (let k = 0; k < 4; k++) { let cp; do { cp = rnd(N_CP); } while (isSur(cp) || !(props[cp] & 4)); t.push(cp); }
  if (String.fromCodePoint(...t).normalize("NFC") !== String.fromCodePoint(...t)) throw new Error("NFC_SAFE broken " + t);
}
for (const t of tests) {
  const want = String.fromCodePoint(...t).normalize("NFC");
  const got = String.fromCodePoint(...nfcTables(t));
  if (want !== got) throw new Error(`NFC mismatch on ${t.map((x) => x.toString(16))}: ${cps(want).map((x) => x.toString(16))} vs ${cps(got).map((x) => x.toString(16))}`);
}

// dfl_tokenize documents n_tokens <= 3 * bytes + 2: NFD (and so NFC) grows no code point's UTF-8
// more than 3x
for (let cp = 0; cp < N_CP; cp++) {
  if (isSur(cp)) continue;
  const s = S(cp);
  if (Buffer.byteLength(s.normalize("NFD")) > 3 * Buffer.byteLength(s)) throw new Error(`NFD of ${cp.toString(16)} grows > 3x`);
}

// 7. write
const bs = 1 << SHIFT, blocks = new Map(), stage1 = [], stage2 = [];
for (let b = 0; b < N_CP / bs; b++) {
  const blk = props.subarray(b * bs, (b + 1) * bs), key = blk.join(",");
  if (!blocks.has(key)) { blocks.set(key, blocks.size); stage2.push(...blk); }
  stage1.push(blocks.get(key));
}
const fmt = (arr, per) => { const lines = []; for (let i = 0; i < arr.length; i += per) lines.push("    " + arr.slice(i, i + per).join(",") + ","); return lines.join("\n"); };
const decompCps = [...nfd.keys()].sort((a, b) => a - b), pool = [], decompIdx = [];
for (const cp of decompCps) { decompIdx.push(`{${cp},${pool.length},${nfd.get(cp).length}}`); pool.push(...nfd.get(cp)); }
const cccRanges = [];
for (const cp of [...rank.keys()].sort((a, b) => a - b)) {
  const last = cccRanges[cccRanges.length - 1];
  if (last && last[1] === cp - 1 && last[2] === rank.get(cp)) last[1] = cp; else cccRanges.push([cp, cp, rank.get(cp)]);
}
const pairList = [...pairs.entries()].sort((a, b) => a[0] - b[0]);
const here = dirname(fileURLToPath(import.meta.url));
const out = `/* unicode_data.c: GENERATED by src/vocab/gen_unicode_data.mjs from the Unicode ${process.versions.unicode} data of
 * node ${process.versions.node} (the engine of the reference tokenizer); do not edit. Tables for unicode.c:
 * code point properties (pre-tokenizer class, NFC flags), canonical decompositions, combining
 * class ranks (order-preserving stand-ins for the canonical combining classes), compositions. */
#include "unicode_data.h"

/* [0x110000 >> ${SHIFT}] block index of each code point's 128-entry block in unicode_props */
const uint16_t unicode_blocks[${stage1.length}] = {
${fmt(stage1, 32)}
};

/* [${blocks.size} blocks * ${bs}] bits 0-1 class (UNICODE_CLASS_*), UNICODE_NFC_SAFE, UNICODE_DECOMP, UNICODE_SECOND */
const uint8_t unicode_props[${stage2.length}] = {
${fmt(stage2, 56)}
};

/* [${decompCps.length}] sorted by code point: full canonical decomposition = unicode_decomp_pool[off .. off+len) */
const unicode_decomp_entry unicode_decomp[${decompCps.length}] = {
${fmt(decompIdx, 10)}
};
const size_t unicode_n_decomp = ${decompCps.length};

/* [${pool.length}] */
const uint32_t unicode_decomp_pool[${pool.length}] = {
${fmt(pool, 16)}
};

/* [${cccRanges.length}] sorted ranges of non-starters with their combining class rank (1..${r}) */
const unicode_ccc_range unicode_ccc[${cccRanges.length}] = {
${fmt(cccRanges.map(([a, b, c]) => `{${a},${b},${c}}`), 10)}
};
const size_t unicode_n_ccc = ${cccRanges.length};

/* [${pairList.length}] sorted by key = first << 21 | second: the primary composite */
const unicode_comp_pair unicode_comp[${pairList.length}] = {
${fmt(pairList.map(([k, v]) => `{${BigInt(Math.floor(k / 0x200000)) << 21n | BigInt(k % 0x200000)}u,${v}}`), 5)}
};
const size_t unicode_n_comp = ${pairList.length};
`;
writeFileSync(join(here, "unicode_data.c"), out);
console.log(`unicode ${process.versions.unicode}: ${blocks.size} blocks, ${decompCps.length} decompositions, ` +
  `${nonstarters.length} non-starters in ${r} classes, ${pairList.length} compositions (${ambiguous} ambiguous), ${tests.length} NFC checks ok`);
