"""check_export.py: the exported GGUF pair against the PyTorch models, through the independent
numpy reference (tests/ref/model_np.py, written from docs/, float64).

    /usr/bin/python3 train/check_export.py --work train/work --models models

Checks, on held-out prompts: target logits (every position) and captured layer inputs; drafter
block logits after a prefill; greedy tokens of the target; the greedy speculative loop (tokens
and per-step acceptance) of model_np vs spec_eval.py's PyTorch loop. Prints the maximum relative
logit difference (max |a - b| / max |b|) and writes models/check_export.json; exit 1 on failure.
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
import model_np as M  # noqa: E402
from bpe import Vocab  # noqa: E402
from export_gguf import load_drafter, load_target, round_to_export  # noqa: E402
from spec_eval import heldout_prompts, spec_greedy, target_greedy  # noqa: E402
from train_target import load_bin  # noqa: E402

TOL = 1e-4


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--n-gen", type=int, default=40)
    a = ap.parse_args()
    torch.set_num_threads(2)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    t = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    d = round_to_export(load_drafter(os.path.join(W, "drafter_final.pt"), t))
    rt = M.Target(os.path.join(a.models, "target.gguf"))
    rd = M.Drafter(os.path.join(a.models, "drafter.gguf"), rt)
    tl = d.c.target_layers
    assert rd.target_layers == tl and rd.block_size == d.c.block_size and rd.mask_token_id == d.c.mask_token_id
    res = {"tolerance": TOL, "cases": []}
    ok = True
    for dom in ("code", "prose"):
        prompt = heldout_prompts(load_bin(os.path.join(W, "heldout_%s.bin" % dom)), v, 1, 48, 5)[0]
        n, B = len(prompt), d.c.block_size
        r = rt.forward(prompt, np.arange(n), rt.new_cache(), capture=tl, logits="all")
        with torch.no_grad():
            lg, cap = t(torch.tensor([prompt]), capture=tuple(tl))
            f = torch.cat([cap[i] for i in tl], -1)
            last = int(lg[0, -1].argmax())
            dl = d(f, torch.arange(n), torch.tensor([[last] + [d.c.mask_token_id] * (B - 1)]), n + torch.arange(B),
                   torch.ones(B, n + B, dtype=torch.bool))[0, 1:].numpy()
        dc = rd.new_cache()
        rd.add_context(dc, rd.features(r.captured), np.arange(n))
        dtoks, dref = rd.draft(dc, int(np.argmax(r.logits[-1])), n, B)
        case = {"domain": dom, "prompt": v.decode(prompt),
                "target_logits_rel": rel(lg[0].numpy(), r.logits),
                "features_rel": max(rel(cap[i][0].numpy(), r.captured[i]) for i in tl),
                "drafter_logits_rel": rel(dl, dref),
                "draft_argmax_equal": bool((dl.argmax(-1) == dtoks).all())}
        g_ref = rt.greedy(prompt, a.n_gen)
        g_t = target_greedy(t, prompt, a.n_gen)
        s_ref = M.spec_generate(rt, rd, prompt, a.n_gen, B)
        s_t, acc_t = spec_greedy(t, d, prompt, a.n_gen, B)
        case.update({"greedy_equal": g_ref == g_t, "spec_tokens_equal": s_ref.tokens == s_t,
                     "spec_accepted_equal": s_ref.accepted == acc_t, "spec_equals_greedy": s_t == g_t,
                     "tau_ref": s_ref.tau, "output": v.decode(g_t)})
        good = (case["target_logits_rel"] < TOL and case["drafter_logits_rel"] < TOL and case["features_rel"] < TOL
                and case["draft_argmax_equal"] and case["greedy_equal"] and case["spec_tokens_equal"]
                and case["spec_equals_greedy"])
        case["ok"] = good
        ok &= good
        res["cases"].append(case)
        print("check_export: %s target %.2e features %.2e drafter %.2e greedy_equal %s spec==ref %s "
              "spec==greedy %s accepted==ref %s tau %.2f -> %s" % (
                  dom, case["target_logits_rel"], case["features_rel"], case["drafter_logits_rel"], case["greedy_equal"],
                  case["spec_tokens_equal"], case["spec_equals_greedy"], case["spec_accepted_equal"], s_ref.tau,
                  "ok" if good else "FAIL"), flush=True)
    res["ok"] = ok
    with open(os.path.join(a.models, "check_export.json"), "w") as f:
        json.dump(res, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
