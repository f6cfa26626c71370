"""check_embedded.py: the C engine against the PyTorch outputs committed with the embedded pair.

    /usr/bin/python3 tests/ref/check_embedded.py [--dflash build/dflash] [--n N]

models/spec_eval.json holds, for held-out prompts of both domains, the text the PyTorch target
generated greedily (128 tokens; the speculative PyTorch loop gave the same). `dflash generate`
must produce exactly that text on the committed GGUF files, without the drafter (--no-spec) and
with it (the CLI's default draft settings), or, where the C output leaves PyTorch's text, the
C engine's token must be a near-tie there: the float64 numpy reference (model_np.py) on the
committed target puts it within TIE_GAP nats of its top logit (F16 kernels may flip such a
token), and the speculative output must still equal the C autoregressive one (lossless). Prints
one line per case; exit 1 on a mismatch.
"""

import argparse
import json
import os
import subprocess
import sys

TIE_GAP = 0.01   # nats between the reference's top logit and the C engine's token


def near_tie(prompt_ids, toks, k):
    """float64 reference logits after prompt + toks[:k]: (is toks[k] within TIE_GAP of the top?, gap)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    import model_np as M
    t = M.Target("models/target.gguf")
    seq = list(prompt_ids) + list(toks[:k])
    lg = t.forward(seq, np.arange(len(seq)), t.new_cache(), logits="last").logits[-1]
    gap = float(lg.max() - lg[toks[k]])
    return gap <= TIE_GAP, gap


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dflash", default="build/dflash")
    ap.add_argument("--n", type=int, default=12, help="prompts per domain")
    a = ap.parse_args()
    ref = json.load(open("models/spec_eval.json"))
    n_ok = n_all = n_tie = 0
    for dom in ("code", "prose"):
        for i, s in enumerate(ref["domains"][dom]["samples"][: a.n]):
            res = {}
            for spec in (False, True):
                cmd = [a.dflash, "generate", "-p", s["prompt"], "-n", str(ref["n_gen"]), "--json", "-t", "1", "-tb", "1"]
                if not spec:
                    cmd.append("--no-spec")
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print("check_embedded: %s failed (%d): %s" % (" ".join(cmd[:2]), r.returncode, r.stderr[-500:]))
                    sys.exit(1)
                res[spec] = json.loads(r.stdout.strip().splitlines()[-1])
            want = s["output"]
            for spec in (False, True):
                got = res[spec]["text"]
                n_all += 1
                if got == want:
                    n_ok += 1
                    continue
                k = next((q for q in range(min(len(got), len(want))) if got[q] != want[q]), min(len(got), len(want)))
                what = "%s prompt %d %s: differs from PyTorch at char %d: %r vs %r" % (
                    dom, i, "speculative" if spec else "autoregressive", k, got[max(0, k - 20):k + 20],
                    want[max(0, k - 20):k + 20])
                toks = res[False]["tokens"]
                if spec and res[True]["tokens"] != toks:
                    print("check_embedded: %s, and from the C autoregressive output (not lossless)" % what)
                    continue
                # the first generated token whose text leaves PyTorch's
                from_ids = res[False]["prompt_tokens"]
                j = 0
                while j + 1 < len(toks):
                    r = subprocess.run([a.dflash, "generate", "-p", s["prompt"], "-n", str(j + 1), "--json", "--no-spec",
                                        "-t", "1", "-tb", "1"], capture_output=True, text=True)
                    if not want.startswith(json.loads(r.stdout.strip().splitlines()[-1])["text"]):
                        break
                    j += 1
                tie, gap = near_tie(from_ids, toks, j)
                if tie:
                    n_tie += 1
                    print("check_embedded: %s: a near-tie at generated token %d (reference gap %.2e nats)" % (what, j, gap))
                else:
                    print("check_embedded: %s (generated token %d, reference gap %.3f nats: not a near-tie)" % (what, j, gap))
    print("check_embedded: %d of %d generations equal PyTorch's greedy text, %d leave it at a near-tie, %d differ" % (
        n_ok, n_all, n_tie, n_all - n_ok - n_tie))
    sys.exit(0 if n_ok + n_tie == n_all else 1)


if __name__ == "__main__":
    main()
