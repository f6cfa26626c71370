"""kv_f32.py: llama-speculative-simple's per-step accepted counts next to dflash's with its default
f16 KV caches and with f32 KV caches (build/dflash2_parity_steps, bench/dflash2_parity/steps.c),
on the held-out prompts of models/spec_eval.json, greedy, fixed draft length. The KV precision
changes rounding only (the algorithm is the same), so a step whose count follows it is decided by
a numerical near-tie, not by a difference of semantics. Steps are compared while llama.cpp drafted
the full k (its example shortens drafts near the -n budget).

usage: python3 bench/dflash2_parity/kv_f32.py --llama PATH/llama-speculative-simple
           [-m models/target.gguf] [-md models/drafter-dflash2.gguf] [--draft 15] [-n 64]
           [--count 10] [-t 2]
needs build/dflash and build/dflash2_parity_steps (bench/dflash2_parity/parity.sh builds it, or:
cc -std=c11 -Iinclude bench/dflash2_parity/steps.c build/libdflash.a -lm -lpthread ...). Not in CI."""

import argparse
import json
import re
import subprocess
import sys


def llama_steps(a, prompt):
    r = subprocess.run([a.llama, "-m", a.m, "-md", a.md, "--spec-type", "draft-dflash", "--spec-draft-n-max",
                        str(a.draft), "--spec-draft-n-min", "0", "-p", prompt, "-n", str(a.n), "--temp", "0",
                        "-t", str(a.t), "-c", "4096", "-v"], capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise RuntimeError("llama-speculative-simple exited %d" % r.returncode)
    return [(int(m.group(2)), int(m.group(1))) for m in re.finditer(r"accepted (\d+)/(\d+) draft tokens", r.stderr)]


def dflash_steps(a, ids, kv_f32):
    # a budget past the last compared step: steps prints the tokens each step delivered, which the
    # engine cuts at max_tokens, while llama.cpp's -n loop may overshoot in its last step
    n_gen = a.n + a.draft + 2
    cmd = ["build/dflash2_parity_steps", a.m, a.md, "0", str(n_gen), str(a.draft), ",".join(map(str, ids))]
    r = subprocess.run(cmd + (["kv-f32"] if kv_f32 else []), capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise RuntimeError("steps exited %d: %s" % (r.returncode, r.stderr.strip()))
    return [tuple(map(int, s.split(":"))) for s in r.stdout.split()[1:]]


def main(argv):
    ap = argparse.ArgumentParser(prog="kv_f32.py")
    ap.add_argument("--llama", required=True)
    ap.add_argument("-m", default="models/target.gguf")
    ap.add_argument("-md", default="models/drafter-dflash2.gguf")
    ap.add_argument("--draft", type=int, default=15)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--prompts", default="models/spec_eval.json")
    a = ap.parse_args(argv)
    with open(a.prompts) as f:
        ev = json.load(f)
    same = {False: 0, True: 0}
    rows = 0
    for dom, d in ev["domains"].items():
        for s in d["samples"][:a.count]:
            prompt = s["prompt"]
            r = subprocess.run(["build/dflash", "generate", "-m", a.m, "-p", prompt, "-n", "1", "--no-spec", "--json"],
                               capture_output=True, text=True, errors="replace", check=True)
            ids = json.loads(r.stdout)["prompt_tokens"]
            L = llama_steps(a, prompt)
            n = 0
            while n < len(L) and L[n][0] == a.draft:
                n += 1
            out = []
            for kv in (False, True):
                D = dflash_steps(a, ids, kv)
                diff = next((i for i in range(n) if i >= len(D) or D[i] != L[i]), -1)
                same[kv] += diff < 0
                out.append("same" if diff < 0 else "differ at step %d (llama %s, dflash %s)"
                           % (diff, list(L[diff]), list(D[diff]) if diff < len(D) else None))
            print("%2d %-6s %3d steps  f16 KV: %s  f32 KV: %s" % (rows, dom, n, out[0], out[1]))
            rows += 1
    print("steps equal to llama.cpp's: f16 KV %d of %d prompts, f32 KV %d of %d" % (same[False], rows, same[True], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
