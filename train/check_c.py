"""check_c.py: the C engine (build/dflash) on the committed pair against the PyTorch models.

    /usr/bin/python3 train/check_c.py --work train/work --models models [--dflash build/dflash]

For held-out prompts (the same ones as spec_eval.py): the C tokenizer's prompt ids must equal
ours; `dflash generate --no-spec` must give the PyTorch target's greedy tokens; `dflash generate`
with the drafter must give the same tokens (lossless) and its per-step acceptance must match the
PyTorch speculative loop's. Prints a summary and writes models/check_c.json; exit 1 on failure.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Vocab  # noqa: E402
from export_gguf import load_drafter, load_target, round_to_export  # noqa: E402
from spec_eval import heldout_prompts, spec_greedy, target_greedy  # noqa: E402
from train_target import load_bin  # noqa: E402


def run_c(dflash, models, text, n, spec, threads):
    cmd = [dflash, "generate", "-m", os.path.join(models, "target.gguf"), "-p", text, "-n", str(n),
           "--json", "-t", str(threads), "-tb", str(threads)]
    cmd += ["-md", os.path.join(models, "drafter.gguf")] if spec else ["--no-spec"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("check_c: %s failed (%d): %s" % (" ".join(cmd[:3]), r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--dflash", default="build/dflash")
    ap.add_argument("--n-prompts", type=int, default=6)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    t = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    d = round_to_export(load_drafter(os.path.join(W, "drafter_final.pt"), t))
    B = d.c.block_size
    out, ok = {"cases": []}, True
    for dom in ("code", "prose"):
        prompts = heldout_prompts(load_bin(os.path.join(W, "heldout_%s.bin" % dom)), v, a.n_prompts, 48, 99)
        for p in prompts:
            text = v.decode(p)
            ids = v.encode(text)
            g = target_greedy(t, ids, a.n_gen)
            s, acc = spec_greedy(t, d, ids, a.n_gen, B)
            c_ar = run_c(a.dflash, a.models, text, a.n_gen, False, a.threads)
            c_sp = run_c(a.dflash, a.models, text, a.n_gen, True, a.threads)
            case = {"domain": dom, "prompt": text,
                    "prompt_ids_equal": c_sp["prompt_tokens"] == ids,
                    "c_greedy_equals_torch": c_ar["tokens"] == g,
                    "c_spec_equals_c_greedy": c_sp["tokens"] == c_ar["tokens"],
                    "torch_spec_equals_torch_greedy": s == g,
                    "tau_c": c_sp.get("tau"), "tau_torch": sum(x + 1 for x in acc) / len(acc),
                    "steps_c": c_sp.get("n_steps"), "steps_torch": len(acc)}
            first_diff = next((i for i, (x, y) in enumerate(zip(c_ar["tokens"], g)) if x != y), None)
            case["first_diff_c_vs_torch"] = first_diff
            good = all(case[k] for k in ("prompt_ids_equal", "c_greedy_equals_torch", "c_spec_equals_c_greedy",
                                         "torch_spec_equals_torch_greedy"))
            case["ok"] = good
            ok &= good
            out["cases"].append(case)
            print("check_c: %s ids %s greedy C==torch %s spec==greedy C %s torch %s tau C %.2f torch %.2f%s" % (
                dom, case["prompt_ids_equal"], case["c_greedy_equals_torch"], case["c_spec_equals_c_greedy"],
                case["torch_spec_equals_torch_greedy"], case["tau_c"] or 0, case["tau_torch"],
                "" if first_diff is None else " (first diff at %d)" % first_diff), flush=True)
    out["ok"] = ok
    with open(os.path.join(a.models, "check_c.json"), "w") as f:
        json.dump(out, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
