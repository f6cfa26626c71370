"""near_tie_target.py: why dflash and llama.cpp can commit different tokens although every
speculative step agreed (same drafts, same acceptances): the target's own greedy choice at one
position is a near-tie that the engines' f32 / f16 arithmetic decides differently. For the
tokens before that position, the target's last-row logits under the emulations of
near_tie.py: f64 (the reference), f64 with an f16 KV cache (kv16), f16act (every F16 matmul
sees f16-rounded activations), dflash (f16act plus dflash's CPU attention over an f16 cache),
llama (f16act plus ggml's CPU flash attention over an f16 cache); for each the top two ids and
their gap, and which of the two given ids comes first.

usage: python3 bench/dflash2_parity/near_tie_target.py --target T.gguf --run RUN.json --pos P
           [--other ID]
  --run: a `dflash generate --json` output (prompt_tokens, tokens); --pos: the index in its
  generated tokens of the token in question (0-based); the context is the prompt plus the
  generated tokens before it. --other: the id the other engine committed there.
Needs numpy; not part of `make check`."""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import near_tie as NT  # noqa: E402

M = NT.M


def last_logits(mode, target, ctx):
    t = M.Target(target, kv_f16=mode in ("kv16", "dflash", "llama"))
    NT.emulate(mode, t)
    return t.forward(ctx, np.arange(len(ctx)), None, logits="last").logits[-1].astype(np.float64)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--pos", type=int, required=True)
    ap.add_argument("--other", type=int)
    ap.add_argument("--mode", nargs="+", default=["f64", "kv16", "f16act", "dflash", "llama"])
    a = ap.parse_args(argv)
    with open(a.run) as f:
        run = json.load(f)
    gen = run["tokens"]
    if not 0 <= a.pos < len(gen):
        sys.exit("near_tie_target: --pos %d outside the run's %d generated tokens" % (a.pos, len(gen)))
    ctx = list(run["prompt_tokens"]) + list(gen[:a.pos])
    ours = gen[a.pos]
    print("position %d (context %d tokens): dflash committed %d%s" % (a.pos, len(ctx), ours,
          "" if a.other is None else ", the other engine %d" % a.other))
    for mode in a.mode:
        lg = last_logits(mode, a.target, ctx)
        top = np.argsort(-lg, kind="stable")[:2]
        line = "  %-7s top %d (%.6f), %d (%.6f): gap %.3g" % (mode, top[0], lg[top[0]], top[1], lg[top[1]],
                                                          lg[top[0]] - lg[top[1]])
        if a.other is not None:
            first = ours if lg[ours] >= lg[a.other] else a.other
            line += "; of %d / %d: %d first by %.3g" % (ours, a.other, first, abs(lg[ours] - lg[a.other]))
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
