"""check_llama.py: llama.cpp runs the embedded pair with each drafter family; its output and its
n_drafted / n_accept counts against a PyTorch loop that mirrors llama-speculative-simple.

    /usr/bin/python3 train/check_llama.py --work train/work --models models \
        --llama-bin /work/llama-peer/src/build/bin [--n-prompts 10] [--n-gen 64]

llama.cpp is never built by this project: --llama-bin points at a llama.cpp build
(llama-speculative-simple) made elsewhere. For n held-out prompts per domain (spec_eval's
heldout_prompts, seed 7) and each family (DFlash: --spec-type draft-dflash; DSpark:
draft-dspark; DFlash2: draft-dflash, recognized by its selector) it runs
    llama-speculative-simple -m target.gguf -md DRAFTER --spec-type T --spec-draft-n-max 15
        --temp 0 -p PROMPT -n N -t 1
and the same loop in PyTorch (export-rounded models = the GGUF weights): the prompt's last token is
the first anchor (the target prefills all but it), every step drafts a full block (B-1 tokens,
DSpark with --spec-draft-p-min 0: no confidence cut), cut to N - n_predict - 1 when that is > 0
(common_speculative_draft), verifies greedily, and stops once n_predict > N or at <|endoftext|>.
Recorded per prompt: llama.cpp's text vs the PyTorch speculative text vs the PyTorch target alone,
and n_drafted / n_accept of both. Writes models/check_llama.json.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bpe import Vocab  # noqa: E402
from export_gguf import load_drafter, load_target, round_to_export  # noqa: E402
from spec_eval import FAMILY_CKPT, draft_block, heldout_prompts, target_greedy  # noqa: E402
from train_target import load_bin  # noqa: E402

FAMILIES = {"dflash": ("drafter.gguf", "draft-dflash"), "dspark": ("drafter-dspark.gguf", "draft-dspark"),
            "dflash2": ("drafter-dflash2.gguf", "draft-dflash")}


@torch.no_grad()
def spec_llama(target, drafter, ids, n_predict_max, n_max, eos, n_ctx):
    """PyTorch mirror of llama-speculative-simple's loop -> (generated ids (up to eos),
    n_predict, n_drafted, n_accept)."""
    tl = tuple(drafter.c.target_layers)
    B = drafter.c.block_size
    cache = [None] * target.c.n_layer
    _, cap = target(torch.tensor([ids[:-1]]), capture=tl, cache=cache)
    feats = torch.cat([cap[i] for i in tl], -1)
    last, n_past = ids[-1], len(ids) - 1
    out, n_predict, n_drafted, n_accept = [], 0, 0, 0
    while True:
        n_draft_max = max(min(n_ctx - n_past - 2, n_predict_max - n_predict - 1), 0)
        d, _ = draft_block(drafter, feats, n_past, last, B)
        d = d[:n_max]
        if n_draft_max > 0:
            d = d[:n_draft_max]
        logits, cap = target(torch.tensor([[last] + d]), capture=tl, start_pos=n_past, cache=cache)
        am = logits[0].argmax(-1).tolist()
        a = 0
        while a < len(d) and d[a] == am[a]:
            a += 1
        acc_ids = d[:a] + [am[a]]
        keep = n_past + a + 1
        for il in range(len(cache)):
            k, v = cache[il]
            cache[il] = (k[:, :keep], v[:, :keep])
        feats = torch.cat([feats, torch.cat([cap[i] for i in tl], -1)[:, :a + 1]], 1)
        n_past = keep
        n_drafted += len(d)
        n_accept += a
        n_predict += len(acc_ids)
        has_eos = False
        for t in acc_ids:
            if t == eos:
                has_eos = True
                break
            out.append(t)
        last = acc_ids[-1]
        if n_predict > n_predict_max or has_eos:
            return out, n_predict, n_drafted, n_accept


def run_llama(binp, models, drafter_file, spec_type, prompt, n, threads, echoed):
    cmd = [os.path.join(binp, "llama-speculative-simple"), "-m", os.path.join(models, "target.gguf"),
           "-md", os.path.join(models, drafter_file), "--spec-type", spec_type, "--spec-draft-n-max", "15",
           "--temp", "0", "--no-escape", "-p", prompt, "-n", str(n), "-t", str(threads), "--seed", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    if r.returncode != 0:
        raise RuntimeError("llama-speculative-simple failed (%d): %s" % (r.returncode, r.stderr[-2000:]))
    log = r.stdout + "\n" + r.stderr
    ms = {k: re.search(r"%s\s*=\s*(\d+)" % k, log) for k in ("n_predict", "n_drafted", "n_accept")}
    if not all(ms.values()):
        raise RuntimeError("no n_predict/n_drafted/n_accept in llama-speculative-simple's log: %s" % log[-1500:])
    cnt = {k: int(m.group(1)) for k, m in ms.items()}
    text = r.stdout
    i = text.find(echoed)                         # the prompt as llama.cpp prints it back (NFC)
    if i < 0:                                     # printed otherwise: after the leading blank lines
        sys.stderr.write("check_llama: prompt not echoed verbatim: %r\n" % text[:len(echoed) + 4])
        i = len(text) - len(text.lstrip("\n"))
    return text[i + len(echoed):].rstrip("\n"), cnt, " ".join(cmd[:1] + [os.path.basename(c) if c.endswith(".gguf") else c for c in cmd[1:]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--n-prompts", type=int, default=10)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--families", default="dflash,dspark,dflash2")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    eos = v.specials["<|endoftext|>"]
    target = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    res = {"n_gen": a.n_gen, "draft_n_max": 15, "families": {}}
    t0 = time.time()
    for fam in a.families.split(","):
        drafter = round_to_export(load_drafter(os.path.join(W, FAMILY_CKPT[fam]), target))
        dfile, stype = FAMILIES[fam]
        fr = res["families"][fam] = {"file": dfile, "spec_type": stype, "domains": {}}
        for dom in ("code", "prose"):
            prompts = heldout_prompts(load_bin(os.path.join(W, "heldout_%s.bin" % dom)), v, a.n_prompts, 48, 7)
            rows, tot = [], {"llama_n_drafted": 0, "llama_n_accept": 0, "torch_n_drafted": 0, "torch_n_accept": 0,
                             "text_equal": 0, "counts_equal": 0, "llama_equals_target": 0}
            for p in prompts:
                text = v.decode(p)
                ids = v.encode(text, special=False)
                try:
                    ltext, cnt, cmd = run_llama(a.llama_bin, a.models, dfile, stype, text, a.n_gen, a.threads, v.decode(ids))
                except RuntimeError as e:
                    print("check_llama: %s %s: %s" % (fam, dom, e), flush=True)
                    rows.append({"prompt": text, "error": str(e)[-1500:]})
                    continue
                toks, n_pred, n_dr, n_acc = spec_llama(target, drafter, ids, a.n_gen, 15, eos, target.c.n_ctx)
                ref = target_greedy(target, ids, max(len(toks), 1))
                ttext = v.decode(toks)
                row = {"prompt": text, "reencoded_equal": ids == p, "llama_text": ltext, "torch_text": ttext,
                       "text_equal": ltext.rstrip("\n") == ttext.rstrip("\n"),
                       "llama_equals_target": ltext.rstrip("\n") == v.decode(ref[:len(toks)]).rstrip("\n"),
                       "torch_spec_equals_target": ref[:len(toks)] == toks,
                       "llama": cnt, "torch": {"n_predict": n_pred, "n_drafted": n_dr, "n_accept": n_acc}}
                row["counts_equal"] = (cnt["n_drafted"], cnt["n_accept"], cnt["n_predict"]) == (n_dr, n_acc, n_pred)
                rows.append(row)
                tot["llama_n_drafted"] += cnt["n_drafted"]
                tot["llama_n_accept"] += cnt["n_accept"]
                tot["torch_n_drafted"] += n_dr
                tot["torch_n_accept"] += n_acc
                for k in ("text_equal", "counts_equal", "llama_equals_target"):
                    tot[k] += int(row[k])
            tot["prompts"] = len(prompts)
            fr["domains"][dom] = {"totals": tot, "prompts": rows}
            fr["command"] = cmd
            print("check_llama: %s %s %s (%.0fs)" % (fam, dom, json.dumps(tot), time.time() - t0), flush=True)
    with open(a.out or os.path.join(a.models, "check_llama.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
