"""check_variants.py: the exported DSpark / DFlash2 drafters against the PyTorch models, through
the independent numpy references tests/ref/dspark_np.py and tests/ref/dflash2_np.py (float64,
written from docs/drafter.md).

    /usr/bin/python3 train/check_variants.py --work train/work --models models --family dspark
    /usr/bin/python3 train/check_variants.py --work train/work --models models --family dflash2

For one held-out prompt per domain: the drafted block (B-1 tokens) of the GGUF through the numpy
reference vs spec_eval.draft_block() on the export-rounded PyTorch model: DSpark: the Markov-biased
logits of every row, the chain's tokens and the confidences; DFlash2: the block logits, the walk's
tokens and, along the walk, the selector scores. Then the greedy speculative loop of both (tokens
and per-step acceptance) and the target alone. Writes models/check_<family>.json; exit 1 on failure.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bpe import Vocab  # noqa: E402
from export_gguf import load_drafter, load_target, round_to_export  # noqa: E402
from spec_eval import FAMILY_CKPT, draft_block, heldout_prompts, spec_greedy, target_greedy  # noqa: E402
from train_target import load_bin  # noqa: E402

TOL = 1e-4
FILES = {"dspark": "drafter-dspark.gguf", "dflash2": "drafter-dflash2.gguf"}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--family", required=True, choices=sorted(FILES))
    ap.add_argument("--ref-dir", default=os.path.join(HERE, "..", "tests", "ref"))
    ap.add_argument("--n-gen", type=int, default=40)
    a = ap.parse_args()
    sys.path.insert(0, a.ref_dir)
    mod = "dspark_np" if a.family == "dspark" else "dflash2_np"
    if not os.path.exists(os.path.join(a.ref_dir, mod + ".py")):
        sys.exit("check_variants: %s/%s.py not found (the %s numpy reference)" % (a.ref_dir, mod, a.family))
    import model_np as M  # noqa: E402
    R = __import__(mod)
    torch.set_num_threads(2)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    t = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    d = round_to_export(load_drafter(os.path.join(W, FAMILY_CKPT[a.family]), t))
    rt = M.Target(os.path.join(a.models, "target.gguf"))
    path = os.path.join(a.models, FILES[a.family])
    if a.family == "dspark":
        rd = M.Drafter(path, rt)
        rs = R.DSpark(rd)
        assert not rs.anchor_first
    else:
        rd = R.Drafter2(path, rt)
    tl = d.c.target_layers
    B = d.c.block_size
    assert list(rd.target_layers) == list(tl) and rd.block_size == B
    res = {"family": a.family, "tolerance": TOL, "cases": []}
    ok = True
    for dom in ("code", "prose"):
        prompt = heldout_prompts(load_bin(os.path.join(W, "heldout_%s.bin" % dom)), v, 1, 48, 5)[0]
        n = len(prompt)
        r = rt.forward(prompt, np.arange(n), rt.new_cache(), capture=tl, logits="last")
        dc = rd.new_cache()
        rd.add_context(dc, rd.features(r.captured), np.arange(n))
        last = int(np.argmax(r.logits[-1]))
        with torch.no_grad():
            lg, cap = t(torch.tensor([prompt]), capture=tuple(tl))
            f = torch.cat([cap[i] for i in tl], -1)
            assert int(lg[0, -1].argmax()) == last
            toks_t, conf_t = draft_block(d, f, n, last, B)
            h = d.hidden(f, torch.arange(n), torch.tensor([[last] + [d.c.mask_token_id] * (B - 1)]), n + torch.arange(B),
                         torch.ones(B, n + B, dtype=torch.bool))[0, 1:]
            base = d.head(h)
        case = {"domain": dom, "draft_tokens": toks_t}
        if a.family == "dspark":
            ids, zs, conf = rs.draft(dc, last, n, B - 1)
            prev, zt = last, []
            for j in range(B - 1):
                z, _ = d.markov(base[j], h[j], torch.tensor(prev))
                zt.append(z.detach().numpy())
                prev = toks_t[j]
            case.update({"biased_logits_rel": rel(np.array(zt), zs), "tokens_equal": ids.tolist() == toks_t,
                         "conf_max_abs": float(np.abs(np.array(conf) - np.array(conf_t)).max())})
            good = case["biased_logits_rel"] < TOL and case["tokens_equal"] and case["conf_max_abs"] < 1e-4

            def draft_fn(dcache, last_, start, B_):
                return rs.draft(dcache, last_, start, B_ - 1)[0]
        else:
            ids, logits, lat, margins, kgap, probs = rd.draft2(dc, last, n, B - 1)
            k = d.c.selector_top_k
            sc_t, prev = [], last
            for j in range(B - 1):
                _, sc = d.selector(base[j], h[j], torch.tensor(prev))
                sc_t.append(sc.detach().numpy())
                prev = toks_t[j]
            # the numpy lattice row at the walk's predecessor index
            sc_ref, jj = [], 0
            for i in range(B - 1):
                row = lat[i, k + jj * k:k + (jj + 1) * k]
                sc_ref.append(row)
                jj = int(np.argmax(row))
            case.update({"logits_rel": rel(base.numpy(), logits), "tokens_equal": ids.tolist() == toks_t,
                         "walk_scores_rel": rel(np.array(sc_t), np.array(sc_ref)),
                         "min_walk_margin": float(np.min(margins)), "min_topk_gap": float(np.min(kgap))})
            good = case["logits_rel"] < TOL and case["tokens_equal"] and case["walk_scores_rel"] < TOL

            def draft_fn(dcache, last_, start, B_):
                return rd.draft2(dcache, last_, start, B_ - 1)[0]
        s_ref = M.spec_generate(rt, rd, prompt, a.n_gen, B, draft_fn=draft_fn)
        s_t, acc_t = spec_greedy(t, d, prompt, a.n_gen, B)
        g_t = target_greedy(t, prompt, a.n_gen)
        case.update({"spec_tokens_equal": s_ref.tokens == s_t, "spec_accepted_equal": s_ref.accepted == acc_t,
                     "spec_equals_greedy": s_t == g_t, "tau_ref": s_ref.tau})
        good = good and case["spec_tokens_equal"] and case["spec_accepted_equal"] and case["spec_equals_greedy"]
        case["ok"] = bool(good)
        ok &= good
        res["cases"].append(case)
        print("check_variants: %s %s %s -> %s" % (a.family, dom, json.dumps({k_: v_ for k_, v_ in case.items()
              if k_ not in ("draft_tokens",)}), "ok" if good else "FAIL"), flush=True)
    res["ok"] = bool(ok)
    with open(os.path.join(a.models, "check_%s.json" % a.family), "w") as f:
        json.dump(res, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
