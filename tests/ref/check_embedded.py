"""check_embedded.py: the C engine against the PyTorch outputs committed with the embedded pair.

    /usr/bin/python3 tests/ref/check_embedded.py [--dflash build/dflash] [--n N]

models/spec_eval.json holds, for held-out prompts of both domains, the text the PyTorch target
generated greedily (128 tokens; the speculative PyTorch loop gave the same). `dflash generate`
must produce exactly that text on the committed GGUF files, without the drafter (--no-spec) and
with it (the CLI's default draft settings). Prints one line per case; exit 1 on a mismatch.
"""

import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dflash", default="build/dflash")
    ap.add_argument("--n", type=int, default=12, help="prompts per domain")
    a = ap.parse_args()
    ref = json.load(open("models/spec_eval.json"))
    n_ok = n_all = 0
    for dom in ("code", "prose"):
        for i, s in enumerate(ref["domains"][dom]["samples"][: a.n]):
            for spec in (False, True):
                cmd = [a.dflash, "generate", "-p", s["prompt"], "-n", str(ref["n_gen"]), "--json", "-t", "1", "-tb", "1"]
                if not spec:
                    cmd.append("--no-spec")
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print("check_embedded: %s failed (%d): %s" % (" ".join(cmd[:2]), r.returncode, r.stderr[-500:]))
                    sys.exit(1)
                got = json.loads(r.stdout.strip().splitlines()[-1])["text"]
                want = s["output"]
                n_all += 1
                if got == want:
                    n_ok += 1
                    continue
                k = next((q for q in range(min(len(got), len(want))) if got[q] != want[q]), min(len(got), len(want)))
                print("check_embedded: %s prompt %d %s: differs from PyTorch at char %d: %r vs %r" % (
                    dom, i, "speculative" if spec else "autoregressive", k, got[max(0, k - 20):k + 20],
                    want[max(0, k - 20):k + 20]))
    print("check_embedded: %d of %d generations equal PyTorch's greedy text" % (n_ok, n_all))
    sys.exit(0 if n_ok == n_all else 1)


if __name__ == "__main__":
    main()
