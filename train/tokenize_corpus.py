"""tokenize_corpus.py: encodes the corpus files with the trained BPE vocabulary.

    python3 train/tokenize_corpus.py --work train/work
reads vocab.json and train_{prose,code}.txt, heldout_{prose,code}.txt, writes the same names
with .bin: uint16 token ids, documents separated by
<|endoftext|>, and adds the token counts to corpus_stats.json.
"""

import argparse
import json
import os

import numpy as np

from bpe import Vocab, SPECIALS


def encode_file(v, path):
    with open(path, encoding="utf-8") as f:
        docs = f.read().split(SPECIALS[0])
    eot = v.specials[SPECIALS[0]]
    out = []
    for d in docs:
        out += v.encode(d, special=False)
        out.append(eot)
    return np.asarray(out, dtype=np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    v = Vocab.load(os.path.join(a.work, "vocab.json"))
    assert len(v) <= 65536
    stats_path = os.path.join(a.work, "corpus_stats.json")
    with open(stats_path) as f:
        stats = json.load(f)
    for name in ("train_prose", "train_code", "heldout_prose", "heldout_code"):
        ids = encode_file(v, os.path.join(a.work, name + ".txt"))
        out = name + ".bin"
        ids.tofile(os.path.join(a.work, out))
        stats[name + "_tokens"] = int(len(ids))
        print("tokenize: %s -> %s: %d tokens" % (name, out, len(ids)))
    with open(stats_path, "w") as f:
        json.dump(stats, f, indent=1)


if __name__ == "__main__":
    main()
