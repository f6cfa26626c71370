#!/usr/bin/python3
"""dspark_np.py: float64 numpy reference of the DSpark heads (docs/drafter.md, "DSpark"), on top of
model_np's DFlash drafter forward. Written from the docs, independently of the C code.

Run with Debian's interpreter:
  /usr/bin/python3 tests/ref/dspark_np.py draft --target T.gguf --drafter D.gguf --tokens 1,2,3 \
      --k K [--last ID] [--out logits.bin]
Prefills the prompt in the target (positions 0..n-1), injects every prompt position's features into
the drafter, then drafts K tokens from the anchor `last` (default: the target's greedy token after
the prompt) at position n. Prints ONE JSON object: start, last, anchor_first, draft_tokens (K ids),
conf (K values, or null without a confidence head), argmax (per row of the biased logits);
--out writes the biased logits [K, n_vocab] (after logit_scale and softcapping) as raw float32.
Exit 1 on a bad file (message on stderr: "dspark_np: error: ...").
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import model_np as M  # noqa: E402
from gguf_np import GGUFError  # noqa: E402


class DSpark:
    """The Markov and confidence heads of a DSpark drafter file."""

    def __init__(self, drafter):
        g = drafter.g
        self.d = drafter
        if not g.has("markov_w1.weight"):
            raise M.ModelError("%s: no markov_w1.weight: not a DSpark drafter" % g.path)
        w1 = g.tensor("markov_w1.weight").astype(np.float64)          # (n_vocab, R): row = a token
        w2 = g.tensor("markov_w2.weight").astype(np.float64)          # (n_vocab, R)
        if w1.ndim != 2 or w2.shape != w1.shape:
            raise M.ModelError("markov_w1 %s / markov_w2 %s shapes differ" % (w1.shape, w2.shape))
        self.w1, self.w2 = w1, w2
        self.R = w1.shape[1]
        self.scale = float(g.tensor("markov_w2.scale").reshape(-1)[0]) if g.has("markov_w2.scale") else 1.0
        self.conf_w = None
        if g.has("conf_proj.weight"):
            cw = g.tensor("conf_proj.weight").astype(np.float64).reshape(-1)    # (n_embd + R,)
            if cw.shape[0] != drafter.hp.n_embd + self.R:
                raise M.ModelError("conf_proj.weight has %d inputs, expected n_embd + R = %d"
                                   % (cw.shape[0], drafter.hp.n_embd + self.R))
            self.conf_w = cw
        self.conf_b = float(g.tensor("conf_proj.bias").reshape(-1)[0]) if g.has("conf_proj.bias") else 0.0
        self.anchor_first = drafter.sample_from_anchor

    def draft(self, cache, last, start, k):
        """k drafts from anchor `last` at position start -> (ids (k,), biased logits (k, n_vocab)
        after the head's scale/softcap, conf (k,) or None)."""
        d = self.d
        if self.anchor_first:
            block, rows = [last] + [d.mask_token_id] * (k - 1), np.arange(k)
        else:
            block, rows = [last] + [d.mask_token_id] * k, np.arange(1, k + 1)
        h = d.forward_hidden(cache, block, start)[rows]                              # (k, n_embd)
        base = h @ d.output.T                                                        # (k, n_vocab)
        prev = last
        ids, logits, conf = [], [], []
        E = d.hp.n_embd
        for j in range(k):
            e = self.w1[prev]                                                        # (R,)
            bias = (self.w2 @ e) * self.scale                                        # (n_vocab,)
            z = base[j] + bias
            tok = int(np.argmax(z))                                                  # lowest id on ties
            ids.append(tok)
            logits.append(d.head(h[j:j + 1], bias[None, :])[0])
            if self.conf_w is not None:
                a = self.conf_w[:E] @ h[j] + self.conf_w[E:] @ e + self.conf_b
                conf.append(float(1.0 / (1.0 + np.exp(-a))))
            prev = tok
        return np.array(ids, dtype=np.int64), np.array(logits), (conf if self.conf_w is not None else None)


def main(argv):
    ap = argparse.ArgumentParser(prog="dspark_np.py")
    sub = ap.add_subparsers(dest="cmd")
    p = sub.add_parser("draft")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--last", type=int)
    p.add_argument("--out")
    args = ap.parse_args(argv)
    if args.cmd != "draft":
        ap.print_usage(sys.stderr)
        return 2
    try:
        toks = [int(x) for x in args.tokens.split(",") if x.strip()]
        t = M.Target(args.target, np.float64, None)
        d = M.Drafter(args.drafter, t, np.float64)
        ds = DSpark(d)
        n = len(toks)
        r = t.forward(toks, np.arange(n), None, capture=d.target_layers, logits="last")
        dc = d.new_cache()
        d.add_context(dc, d.features(r.captured), np.arange(n))
        last = int(np.argmax(r.logits[-1])) if args.last is None else args.last
        ids, logits, conf = ds.draft(dc, last, n, args.k)
    except (GGUFError, M.ModelError, ValueError) as e:
        sys.stderr.write("dspark_np: error: %s\n" % e)
        return 1
    j = {"start": n, "last": last, "anchor_first": ds.anchor_first, "draft_tokens": ids.tolist(), "conf": conf,
         "argmax": np.argmax(logits, axis=-1).tolist()}
    if args.out:
        np.ascontiguousarray(logits, dtype=np.float32).astype("<f4").tofile(args.out)
        j["out"] = args.out
    sys.stdout.write(json.dumps(j, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
