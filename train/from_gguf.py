"""from_gguf.py: reads the committed GGUF files back into the training pipeline.

    /usr/bin/python3 train/from_gguf.py vocab --gguf models/target.gguf --out train/work/vocab.json
    /usr/bin/python3 train/from_gguf.py target-ckpt --gguf models/target.gguf --out W/target_final.pt
    /usr/bin/python3 train/from_gguf.py check-vocab --gguf models/target.gguf --vocab train/work/vocab.json

vocab: writes vocab.json (bpe.Vocab format) from the GGUF's tokenizer.ggml.tokens / merges /
token_type, so a rebuilt pipeline keeps exactly the committed tokenizer (the C engine's tests
depend on its ids). check-vocab compares a vocab.json (e.g. a fresh bpe.py train) with the GGUF.
load_target(path) / load_drafter_weights(path, drafter) fill the PyTorch models of model.py from a
GGUF's F16/F32 tensors (GGUF ne [n_in, n_out] = torch Linear (n_out, n_in)).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
from gguf_np import GGUF  # noqa: E402
from bpe import Vocab, SPECIALS, TOKEN_CONTROL  # noqa: E402
from model import Config, Target  # noqa: E402


def vocab_from_gguf(path):
    g = GGUF(path)
    tokens = list(g.kv["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ")) for m in g.kv["tokenizer.ggml.merges"]]
    types = list(g.kv["tokenizer.ggml.token_type"])
    specials = {s: tokens.index(s) for s in SPECIALS}
    for s, i in specials.items():
        if types[i] != TOKEN_CONTROL:
            raise SystemExit("from_gguf: %s is not a control token" % s)
    v = Vocab(tokens, merges, specials)
    if v.token_type != types:
        raise SystemExit("from_gguf: token types differ from the bpe.py convention")
    return v


def target_config(g):
    p = "qwen3."
    return Config(n_vocab=len(g.kv["tokenizer.ggml.tokens"]), n_embd=int(g.kv[p + "embedding_length"]),
                  n_layer=int(g.kv[p + "block_count"]), n_head=int(g.kv[p + "attention.head_count"]),
                  n_head_kv=int(g.kv[p + "attention.head_count_kv"]),
                  head_dim=int(g.kv[p + "attention.key_length"]), n_ff=int(g.kv[p + "feed_forward_length"]),
                  eps=float(g.kv[p + "attention.layer_norm_rms_epsilon"]),
                  rope_base=float(g.kv[p + "rope.freq_base"]), n_ctx=int(g.kv[p + "context_length"]))


BLOCK_NAMES = [("attn_norm.weight", "attn_norm"), ("attn_q.weight", "wq.weight"), ("attn_k.weight", "wk.weight"),
               ("attn_v.weight", "wv.weight"), ("attn_output.weight", "wo.weight"),
               ("attn_q_norm.weight", "q_norm"), ("attn_k_norm.weight", "k_norm"), ("ffn_norm.weight", "ffn_norm"),
               ("ffn_gate.weight", "w_gate.weight"), ("ffn_up.weight", "w_up.weight"),
               ("ffn_down.weight", "w_down.weight")]


def _t(g, name):
    return torch.from_numpy(np.array(g.tensor(name), dtype=np.float32))


def load_target(path):
    """GGUF qwen3 target -> model.Target with its weights (float32 copies of the stored values)."""
    g = GGUF(path)
    m = Target(target_config(g))
    sd = {"tok_embd.weight": _t(g, "token_embd.weight"), "output_norm": _t(g, "output_norm.weight")}
    for i in range(m.c.n_layer):
        for gn, tn in BLOCK_NAMES:
            sd["layers.%d.%s" % (i, tn)] = _t(g, "blk.%d.%s" % (i, gn))
    m.load_state_dict(sd)
    return m


def load_drafter_weights(path, d):
    """GGUF dflash drafter -> fills model.Drafter d (fc columns must match d's target_layers)."""
    g = GGUF(path)
    sd = {"fc.weight": _t(g, "fc.weight"), "enc_norm": _t(g, "enc.output_norm.weight"),
          "output_norm": _t(g, "output_norm.weight")}
    for i in range(d.c.n_layer):
        for gn, tn in BLOCK_NAMES:
            sd["layers.%d.%s" % (i, tn)] = _t(g, "blk.%d.%s" % (i, gn))
    d.load_state_dict(sd, strict=False)
    return list(g.kv["dflash.target_layers"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("vocab")
    s.add_argument("--gguf", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("target-ckpt", help="a target_final.pt-style checkpoint from a qwen3 GGUF")
    s.add_argument("--gguf", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("check-vocab")
    s.add_argument("--gguf", required=True)
    s.add_argument("--vocab", required=True)
    a = ap.parse_args()
    if a.cmd == "target-ckpt":
        m = load_target(a.gguf)
        torch.save({"model": m.state_dict(), "config": m.c.to_dict(), "from": a.gguf}, a.out)
        return
    v = vocab_from_gguf(a.gguf)
    if a.cmd == "vocab":
        v.save(a.out)
        print("from_gguf: %d tokens, %d merges -> %s" % (len(v), len(v.merges), a.out))
    else:
        w = Vocab.load(a.vocab)
        same = w.tokens == v.tokens and w.merges == v.merges and w.specials == v.specials
        print(json.dumps({"tokens_equal": w.tokens == v.tokens, "merges_equal": w.merges == v.merges,
                          "specials_equal": w.specials == v.specials}))
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
