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
GGUF weights). Writes work/spec_eval.json (tau per domain, histogram of a + 1, prompts, outputs).
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


@torch.no_grad()
def spec_greedy(target, drafter, prompt, n_gen, B):
    """-> (tokens (n_gen), accepted a per step)."""
    tl = tuple(drafter.c.target_layers)
    mask_id = drafter.c.mask_token_id
    cache = [None] * target.c.n_layer
    n = len(prompt)
    logits, cap = target(torch.tensor([prompt]), capture=tl, cache=cache)
    feats = torch.cat([cap[i] for i in tl], -1)                       # (1, n, n_tl*n_embd)
    last = int(logits[0, -1].argmax())
    out, acc = [last], []
    start = n
    while len(out) < n_gen:
        block = torch.tensor([[last] + [mask_id] * (B - 1)])
        dl = drafter(feats[:, :start], torch.arange(start), block, start + torch.arange(B),
                     torch.ones(B, start + B, dtype=torch.bool))
        d = dl[0, 1:].argmax(-1).tolist()                              # B-1 drafts
        vt = torch.tensor([[last] + d])
        logits, cap = target(vt, capture=tl, start_pos=start, cache=cache)
        am = logits[0].argmax(-1).tolist()                              # (B,)
        a = 0
        while a < B - 1 and d[a] == am[a]:
            a += 1
        acc.append(a)
        out += d[:a] + [am[a]]
        keep = start + a + 1
        for il in range(len(cache)):
            k, v = cache[il]
            cache[il] = (k[:, :keep], v[:, :keep])
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--n-prompts", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--no-check", action="store_true", help="skip the target-alone comparison")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    target = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    drafter = round_to_export(load_drafter(os.path.join(W, "drafter_final.pt"), target))
    res = {"block": a.block, "n_gen": a.n_gen, "prompt_len": a.prompt_len, "domains": {}}
    t0 = time.time()
    for dom in ("code", "prose"):
        stream = load_bin(os.path.join(W, "heldout_%s.bin" % dom))
        prompts = heldout_prompts(stream, v, a.n_prompts, a.prompt_len, a.seed)
        hist = collections.Counter()
        accs, samples, mismatches = [], [], 0
        for p in prompts:
            toks, acc = spec_greedy(target, drafter, p, a.n_gen, a.block)
            if not a.no_check:
                ref = target_greedy(target, p, a.n_gen)
                if ref != toks:
                    mismatches += 1
                    print("spec_eval: MISMATCH %s at %d" % (dom, next(i for i, (x, y) in enumerate(zip(ref, toks)) if x != y)), flush=True)
            accs += acc
            hist.update(x + 1 for x in acc)
            samples.append({"prompt": v.decode(p), "output": v.decode(toks), "tau": float(np.mean([x + 1 for x in acc]))})
        tau = float(np.mean([x + 1 for x in accs]))
        res["domains"][dom] = {"tau": tau, "steps": len(accs), "prompts": len(prompts),
                               "hist_accept_len": {str(k): hist[k] for k in range(1, a.block + 1)},
                               "lossless_mismatches": None if a.no_check else mismatches, "samples": samples}
        print("spec_eval: %s tau %.3f over %d steps (%d prompts), mismatches %s, %.1fs" % (
            dom, tau, len(accs), len(prompts), mismatches if not a.no_check else "n/a", time.time() - t0), flush=True)
        print("  histogram (a+1: count): %s" % " ".join("%d:%d" % (k, hist[k]) for k in range(1, a.block + 1)), flush=True)
    with open(a.out or os.path.join(W, "spec_eval.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
