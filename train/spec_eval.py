"""spec_eval.py: greedy speculative decoding in PyTorch (docs/drafter.md) and the held-out tau.

    /usr/bin/python3 train/spec_eval.py --work train/work [--n-prompts 12] [--n-gen 128] [--block 16]

Prompts are windows of the HELD-OUT streams (Bible chapters and stdlib files the models never saw
in training), cut at a line start, 48 tokens long. For each prompt the loop runs:
prefill the prompt (target, KV cache, layer inputs at target_layers captured); draft
[last, MASK x (B-1)] at start..start+B-1 over the fused features of positions < start; verify the
block in one target pass; accept the longest matching prefix a, commit it and the bonus token;
roll the target cache back to start + a + 1; append the features of start..start+a. tau is the
mean of a + 1 over steps. The same prompt is also decoded by the target alone (greedy, one token
at a time) and the outputs must be identical. Models are the export-rounded checkpoints (= the
GGUF weights). Writes work/spec_eval.json (tau per domain, histogram of a + 1, prompts, outputs):
"domains" for the DFlash drafter, "families" for DSpark (fixed length and with the confidence
cut) and DFlash2, each drafted as llama.cpp drafts them (draft_block()).
"""

import argparse
import collections
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Vocab  # noqa: E402
from export_gguf import load_drafter, load_target, round_to_export  # noqa: E402
from train_target import load_bin  # noqa: E402


@torch.no_grad()
def target_greedy(target, prompt, n_gen):
    cache = [None] * target.c.n_layer
    logits, _ = target(torch.tensor([prompt]), cache=cache)
    out = [int(logits[0, -1].argmax())]
    pos = len(prompt)
    while len(out) < n_gen:
        logits, _ = target(torch.tensor([[out[-1]]]), start_pos=pos, cache=cache)
        out.append(int(logits[0, -1].argmax()))
        pos += 1
    return out


def draft_block(drafter, feats, start, last, B, p_min=0.0):
    """One drafted block of B-1 tokens from anchor `last` at position `start` over the fused
    features of positions < start, as llama.cpp drafts with each family (docs/drafter.md):
      dflash   argmax of each mask row 1..B-1;
      dspark   (bonus anchor) the greedy Markov chain over rows 1..B-1; with p_min > 0 the draft
               stops before the first row whose confidence is below p_min;
      dflash2  the selector walk over the top-k lattice (first maximum on ties).
    -> (draft ids, per-row confidence or walk probability or None)."""
    block = torch.tensor([[last] + [drafter.c.mask_token_id] * (B - 1)])
    h = drafter.hidden(feats[:, :start], torch.arange(start), block, start + torch.arange(B),
                       torch.ones(B, start + B, dtype=torch.bool))[0, 1:]              # (B-1, n_embd)
    logits = drafter.head(h)                                                            # (B-1, n_vocab)
    fam = drafter.c.family
    if fam == "dflash":
        return logits.argmax(-1).tolist(), None
    out, conf, prev = [], [], last
    for j in range(B - 1):
        if fam == "dspark":
            z, cl = drafter.markov(logits[j], h[j], torch.tensor(prev))
            c = float(torch.sigmoid(cl))
            if p_min > 0 and c < p_min:
                break
            tok = int(z.argmax())
        else:
            cand, sc = drafter.selector(logits[j], h[j], torch.tensor(prev))
            best = int(sc.argmax())
            c = float(torch.softmax(sc, -1)[best])
            if p_min > 0 and c < p_min:
                break
            tok = int(cand[best])
        out.append(tok)
        conf.append(c)
        prev = tok
    return out, conf


@torch.no_grad()
def spec_greedy(target, drafter, prompt, n_gen, B, p_min=0.0, stats=None):
    """-> (tokens (n_gen), accepted a per step). stats (dict, optional) gets the number of
    drafted tokens per step under "drafted"."""
    tl = tuple(drafter.c.target_layers)
    cache = [None] * target.c.n_layer
    n = len(prompt)
    logits, cap = target(torch.tensor([prompt]), capture=tl, cache=cache)
    feats = torch.cat([cap[i] for i in tl], -1)                       # (1, n, n_tl*n_embd)
    last = int(logits[0, -1].argmax())
    out, acc = [last], []
    start = n
    while len(out) < n_gen:
        d, _ = draft_block(drafter, feats, start, last, B, p_min)
        k = len(d)
        if stats is not None:
            stats.setdefault("drafted", []).append(k)
        vt = torch.tensor([[last] + d])
        logits, cap = target(vt, capture=tl, start_pos=start, cache=cache)
        am = logits[0].argmax(-1).tolist()                              # (k+1,)
        a = 0
        while a < k and d[a] == am[a]:
            a += 1
        acc.append(a)
        out += d[:a] + [am[a]]
        keep = start + a + 1
        for il in range(len(cache)):
            kk, vv = cache[il]
            cache[il] = (kk[:, :keep], vv[:, :keep])
        f = torch.cat([cap[i] for i in tl], -1)[:, :a + 1]
        feats = torch.cat([feats, f], 1)
        last = am[a]
        start += a + 1
    return out[:n_gen], acc


def heldout_prompts(stream, v, n, plen, seed):
    """n prompts of plen tokens from the held-out stream, each starting after a newline token."""
    rng = np.random.default_rng(seed)
    eot = v.specials["<|endoftext|>"]
    nl = [i for i, t in enumerate(v.tokens) if t.endswith("Ċ")]
    nl_set = set(nl)
    s = stream.tolist()
    starts = [i + 1 for i in range(len(s) - plen - 1) if s[i] in nl_set or s[i] == eot]
    starts = [i for i in starts if eot not in s[i:i + plen]]
    pick = sorted(rng.choice(len(starts), size=n, replace=False))
    return [s[starts[i]:starts[i] + plen] for i in pick]


FAMILY_CKPT = {"dflash": "drafter_final.pt", "dspark": "drafter_dspark_final.pt", "dflash2": "drafter_dflash2_final.pt"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--n-prompts", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--families", default="dflash,dspark,dflash2",
                    help="drafter families to evaluate (those whose checkpoint exists)")
    ap.add_argument("--dspark-p-min", default="0,0.5",
                    help="DSpark confidence cuts to evaluate (0 = fixed draft length B-1)")
    ap.add_argument("--no-check", action="store_true", help="skip the target-alone comparison")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    target = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    runs = []                                              # (key, family, drafter, p_min)
    for fam in a.families.split(","):
        path = os.path.join(W, FAMILY_CKPT[fam])
        if not os.path.exists(path):
            print("spec_eval: no %s, %s skipped" % (path, fam), flush=True)
            continue
        d = round_to_export(load_drafter(path, target))
        assert d.c.family == fam
        if fam == "dspark":
            for pm in (float(x) for x in a.dspark_p_min.split(",")):
                runs.append(("dspark" if pm == 0 else "dspark_p%g" % pm, fam, d, pm))
        else:
            runs.append((fam, fam, d, 0.0))
    res = {"block": a.block, "n_gen": a.n_gen, "prompt_len": a.prompt_len, "domains": {}, "families": {}}
    t0 = time.time()
    for dom in ("code", "prose"):
        stream = load_bin(os.path.join(W, "heldout_%s.bin" % dom))
        # the recorded prompt is text: tokenize it again (a held-out window's ids can differ from the
        # ids of its decoded text at a few merges), so that the outputs are the continuations any
        # engine tokenizing samples[i]["prompt"] must produce (tests/ref/check_embedded.py)
        prompts = [v.encode(v.decode(p), special=False) for p in heldout_prompts(stream, v, a.n_prompts, a.prompt_len, a.seed)]
        refs = [None if a.no_check else target_greedy(target, p, a.n_gen) for p in prompts]
        for key, fam, drafter, pm in runs:
            hist = collections.Counter()
            accs, samples, mismatches, drafted = [], [], 0, []
            for p, ref in zip(prompts, refs):
                st = {}
                toks, acc = spec_greedy(target, drafter, p, a.n_gen, a.block, pm, st)
                if ref is not None and ref != toks:
                    mismatches += 1
                    print("spec_eval: MISMATCH %s %s at %d" % (key, dom, next(i for i, (x, y) in enumerate(zip(ref, toks)) if x != y)), flush=True)
                accs += acc
                drafted += st["drafted"]
                hist.update(x + 1 for x in acc)
                samples.append({"prompt": v.decode(p), "output": v.decode(toks), "tau": float(np.mean([x + 1 for x in acc]))})
            tau = float(np.mean([x + 1 for x in accs]))
            r = {"tau": tau, "steps": len(accs), "prompts": len(prompts), "p_min": pm,
                 "mean_drafted": float(np.mean(drafted)),
                 "hist_accept_len": {str(k): hist[k] for k in range(1, a.block + 1)},
                 "lossless_mismatches": None if a.no_check else mismatches, "samples": samples}
            if key == "dflash":
                res["domains"][dom] = r
            else:
                res["families"].setdefault(key, {"family": fam, "p_min": pm, "domains": {}})["domains"][dom] = r
            print("spec_eval: %s %s tau %.3f over %d steps (%d prompts), %.2f drafted/step, mismatches %s, %.1fs" % (
                key, dom, tau, len(accs), len(prompts), np.mean(drafted), mismatches if not a.no_check else "n/a",
                time.time() - t0), flush=True)
            print("  histogram (a+1: count): %s" % " ".join("%d:%d" % (k, hist[k]) for k in range(1, a.block + 1)), flush=True)
    with open(a.out or os.path.join(W, "spec_eval.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
