"""bpe.py: byte-level BPE vocabulary for the embedded default model pair (trainer + encoder).

Byte-level as GPT-2/Qwen2: text is NFC-normalized (docs/target.md, "Tokenizer keys"), split by the Qwen2
pre-tokenizer regex, each piece's UTF-8 bytes are mapped to printable characters with GPT-2's
bytes_to_unicode table, and merges are learned greedily by pair frequency (ties broken by the
pair's strings, so a run is deterministic). Token ids: 0..255 are the 256 byte symbols (in
bytes_to_unicode order of the byte value), then merges in rank order, then the special tokens.

    python3 train/bpe.py train --corpus W/train_prose.txt W/train_code.txt --out W/vocab.json
    v = Vocab.load("W/vocab.json"); ids = v.encode("text"); v.decode(ids)

vocab.json: {"tokens": [str], "merges": ["a b"], "specials": {name: id}, "token_type": [int]}.
"""

import argparse
import collections
import json
import sys
import time
import unicodedata

import regex

# Qwen2 pre-tokenizer (tokenizer.json of Qwen2/Qwen3), docs/target.md
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_RE = regex.compile(QWEN2_PATTERN)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3  # llama.cpp token types


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table (256 entries)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}


def pretokenize(text):
    """NFC, then the Qwen2 regex -> list of byte-mapped pieces (str of bytes_to_unicode chars)."""
    text = unicodedata.normalize("NFC", text)
    return ["".join(B2U[b] for b in m.encode("utf-8")) for m in PRE_RE.findall(text)]


def train(texts, vocab_size, log=sys.stderr):
    """texts: iterable of str documents -> (tokens list, merges list of (a, b))."""
    n_merges = vocab_size - 256 - len(SPECIALS)
    if n_merges < 0:
        raise ValueError("vocab size %d < 256 bytes + %d specials" % (vocab_size, len(SPECIALS)))
    t0 = time.time()
    counts = collections.Counter()
    for t in texts:
        counts.update(pretokenize(t))
    tokens = [B2U[b] for b in range(256)]
    tok_id = {s: i for i, s in enumerate(tokens)}
    words = [[tok_id[c] for c in w] for w in counts]       # symbol ids per unique piece
    freqs = list(counts.values())
    print("bpe: %d unique pieces, %d total, %.1fs" % (len(words), sum(freqs), time.time() - t0), file=log)

    pair_count = collections.Counter()
    pair_words = collections.defaultdict(set)
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += f
            pair_words[(a, b)].add(wi)

    merges = []
    for step in range(n_merges):
        if not pair_count:
            break
        c = max(pair_count.values())
        a, b = min((p for p, n in pair_count.items() if n == c), key=lambda p: (tokens[p[0]], tokens[p[1]]))
        if c <= 0:
            break
        new = len(tokens)
        tokens.append(tokens[a] + tokens[b])
        merges.append((tokens[a], tokens[b]))
        for wi in list(pair_words[(a, b)]):
            w, f = words[wi], freqs[wi]
            # remove this word's old pairs
            for p in zip(w, w[1:]):
                pair_count[p] -= f
                if pair_count[p] <= 0:
                    del pair_count[p]
                pair_words[p].discard(wi)
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                pair_count[p] += f
                pair_words[p].add(wi)
        pair_words.pop((a, b), None)
        if step % 500 == 0:
            print("bpe: merge %d/%d %r+%r (%d) %.1fs" % (step, n_merges, tokens[a], tokens[b], c, time.time() - t0), file=log)
    return tokens, merges


class Vocab:
    def __init__(self, tokens, merges, specials):
        self.tokens = tokens                                   # id -> byte-mapped string
        self.merges = merges                                   # rank -> (a, b)
        self.specials = specials                               # name -> id
        self.tok_id = {s: i for i, s in enumerate(tokens)}
        self.rank = {m: i for i, m in enumerate(merges)}
        self.cache = {}
        self.token_type = [TOKEN_CONTROL if i in specials.values() else TOKEN_NORMAL for i in range(len(tokens))]
        self.special_re = regex.compile("|".join(regex.escape(s) for s in specials))

    @classmethod
    def build(cls, tokens, merges):
        tokens = list(tokens)
        specials = {}
        for s in SPECIALS:
            specials[s] = len(tokens)
            tokens.append(s)
        return cls(tokens, [tuple(m) for m in merges], specials)

    @classmethod
    def load(cls, path):
        with open(path) as f:
            j = json.load(f)
        return cls(j["tokens"], [tuple(m.split(" ")) for m in j["merges"]], j["specials"])

    def save(self, path):
        with open(path, "w") as f:
            json.dump({"tokens": self.tokens, "merges": [a + " " + b for a, b in self.merges],
                       "specials": self.specials, "token_type": self.token_type}, f, ensure_ascii=False)

    def __len__(self):
        return len(self.tokens)

    def _bpe(self, piece):
        """One pre-token piece -> ids, merging the lowest-rank pair first."""
        ids = self.cache.get(piece)
        if ids is not None:
            return ids
        sym = list(piece)
        while len(sym) > 1:
            best, bi = None, -1
            for i in range(len(sym) - 1):
                r = self.rank.get((sym[i], sym[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            a, b = self.merges[best]
            out, i = [], 0
            while i < len(sym):
                if i + 1 < len(sym) and sym[i] == a and sym[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            sym = out
        ids = [self.tok_id[s] for s in sym]
        self.cache[piece] = ids
        return ids

    def encode(self, text, special=True):
        """text -> ids; with special=True the special token strings become their ids."""
        out = []
        if special:
            pos = 0
            for m in self.special_re.finditer(text):
                out += self.encode(text[pos:m.start()], special=False)
                out.append(self.specials[m.group()])
                pos = m.end()
            text = text[pos:]
        for p in pretokenize(text):
            out += self._bpe(p)
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            s = self.tokens[i]
            if self.token_type[i] == TOKEN_CONTROL:
                bs += s.encode("utf-8")
            else:
                bs += bytes(U2B[c] for c in s)
        return bs.decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--corpus", required=True, nargs="+", help="text files, documents separated by <|endoftext|>")
    t.add_argument("--vocab-size", type=int, default=4096)
    t.add_argument("--out", required=True)
    e = sub.add_parser("encode")
    e.add_argument("--vocab", required=True)
    e.add_argument("text")
    a = ap.parse_args()
    if a.cmd == "train":
        docs = []
        for path in a.corpus:
            with open(path, encoding="utf-8") as f:
                docs += f.read().split(SPECIALS[0])
        tokens, merges = train(docs, a.vocab_size)
        v = Vocab.build(tokens, merges)
        v.save(a.out)
        print("bpe: %d tokens (%d merges) -> %s" % (len(v), len(merges), a.out), file=sys.stderr)
    else:
        v = Vocab.load(a.vocab)
        ids = v.encode(a.text)
        print(json.dumps({"ids": ids, "pieces": [v.tokens[i] for i in ids], "decoded": v.decode(ids)}))


if __name__ == "__main__":
    main()
