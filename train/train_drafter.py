"""train_drafter.py: trains the DFlash drafter on the target's greedy continuations (PyTorch, CPU).

    /usr/bin/python3 train/train_drafter.py --work train/work [--budget-min 25]

The DFlash recipe: for each sequence (prompt + the target's greedy continuation, from
gen_drafter_data.py) the frozen, export-rounded target computes its layer inputs at
target_layers; random anchors a are drawn in the continuation; each anchor's block is
[x_a, MASK x (B-1)] at positions a..a+B-1, which sees the fused target features of positions < a
(K/V injection) and its own block non-causally. Slot k predicts x_{a+k}; the loss is the
cross-entropy weighted by exp(-(k-1)/gamma) over block slots k = 1..B-1. All anchors of a
sequence run in one forward with a block-diagonal visibility mask. The target's embedding and
head are shared and frozen. The draft layers start as copies of a target layer (init_from_target;
--random-init to start from noise). Checkpoints and logs as train_target.py (drafter_ckpt.pt,
drafter_log.jsonl); the final model goes to drafter_final.pt.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Vocab  # noqa: E402
from export_gguf import load_target, round_to_export  # noqa: E402
from model import Config, Drafter, n_params  # noqa: E402


def drafter_config(tc, mask_id):
    d = tc.to_dict()
    d.update(n_layer=2, block_size=16, target_layers=[1, 3, 5, 6], mask_token_id=mask_id)
    return d


def init_from_target(model, target):
    """Warm start: every draft layer starts as a copy of the target layer whose input is the
    deepest non-final feature id (5 of [1, 3, 5, 6]); fc starts as the identity on that
    feature's slice (small noise elsewhere) and enc_norm as that layer's attn_norm, so the
    injected context K/V begin as that target layer's own K/V."""
    tl = model.c.target_layers
    src = max(i for i in tl if i < target.c.n_layer)
    j = tl.index(src)
    e = model.c.n_embd
    with torch.no_grad():
        for L in model.layers:
            L.load_state_dict(target.layers[src].state_dict())
        model.fc.weight.normal_(0.0, 0.002)
        model.fc.weight[:, j * e:(j + 1) * e] += torch.eye(e)
        model.enc_norm.copy_(target.layers[src].attn_norm)
    return src


def make_batch(seqs, plen, n_anchor, B, mask_id, gen):
    """seqs (N, L) -> block tokens (N, n_anchor*B), block positions (N, n_anchor*B), labels
    (N, n_anchor*B) (-100 = none), visibility mask (N, n_anchor*B, L + n_anchor*B)."""
    N, L = seqs.shape
    lo, hi = plen, L - 2                                   # anchor a: x_{a+1} must exist
    anchors = torch.stack([torch.randperm(hi - lo + 1, generator=gen)[:n_anchor] + lo for _ in range(N)])  # (N, n_a)
    anchors, _ = anchors.sort(dim=1)
    k = torch.arange(B)
    pos = anchors[:, :, None] + k[None, None, :]                                    # (N, n_a, B)
    tok = torch.full((N, n_anchor, B), mask_id, dtype=torch.long)
    tok[:, :, 0] = seqs.gather(1, anchors)
    lab = torch.full((N, n_anchor, B), -100, dtype=torch.long)
    ok = pos < L
    lab[ok] = seqs[torch.arange(N)[:, None, None].expand_as(pos)[ok], pos[ok]]
    lab[:, :, 0] = -100                                                            # slot 0 unused
    Tb = n_anchor * B
    ctx_vis = torch.arange(L)[None, None, :] < anchors.repeat_interleave(B, 1)[:, :, None]   # (N, Tb, L)
    blk = torch.arange(Tb) // B
    blk_vis = (blk[:, None] == blk[None, :]).expand(N, Tb, Tb)                       # (N, Tb, Tb)
    return tok.view(N, Tb), pos.view(N, Tb), lab.view(N, Tb), torch.cat([ctx_vis, blk_vis], 2)


def block_loss(logits, labels, B, gamma):
    """Weighted CE over slots: weight exp(-(k-1)/gamma) for slot k >= 1. -> (loss, per-slot acc)."""
    N, Tb, V = logits.shape
    k = torch.arange(Tb) % B
    w = torch.exp(-(k.float() - 1) / gamma) * (k > 0).float()                       # (Tb,)
    ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100, reduction="none").view(N, Tb)
    valid = (labels != -100).float()
    wv = w[None, :] * valid
    loss = (ce * wv).sum() / wv.sum()
    hit = (logits.argmax(-1) == labels).float() * valid
    acc = [float(hit[:, k == j].sum() / valid[:, k == j].sum().clamp(min=1)) for j in range(1, B)]
    return loss, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--budget-min", type=float, default=25.0)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seqs-per-step", type=int, default=4)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--random-init", action="store_true", help="no warm start from the target's layers")
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--ckpt-min", type=float, default=3.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    mask_id = v.specials["<|MASK|>"]
    target = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    for p in target.parameters():
        p.requires_grad_(False)
    c = Config(**drafter_config(target.c, mask_id))
    B = c.block_size
    model = Drafter(c, target)
    if not a.random_init:
        print("drafter: layers initialized from target layer %d" % init_from_target(model, target), flush=True)
    data = torch.load(os.path.join(W, "drafter_data.pt"))
    groups = [(s.long(), p) for s, p in zip(data["seqs"], data["prompt_len"])]
    n_seq = sum(s.shape[0] for s, _ in groups)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)
    ckpt_path = os.path.join(W, "drafter_ckpt.pt")
    log_path = os.path.join(W, "drafter_log.jsonl")
    step, elapsed = 0, 0.0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        step, elapsed = ck["step"], ck["elapsed"]
        print("drafter: resumed at step %d (%.1f min)" % (step, elapsed / 60), flush=True)
    else:
        print("drafter: %.2fM parameters, %d training sequences, target_layers %s, B=%d" % (
            n_params(model) / 1e6, n_seq, c.target_layers, B), flush=True)
        open(log_path, "w").close()
    logf = open(log_path, "a")

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "step": step, "elapsed": elapsed, "config": c.to_dict()}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    budget = a.budget_min * 60
    t_last = t_ckpt = time.time()
    acc_loss, acc_n, acc_slots = 0.0, 0, None
    while True:
        progress = max(step / a.steps, elapsed / budget)
        if progress >= 1.0:
            break
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        gi = int(torch.randint(0, len(groups), (1,), generator=gen))
        seqs_all, plen = groups[gi]
        idx = torch.randperm(seqs_all.shape[0], generator=gen)[:a.seqs_per_step]
        seqs = seqs_all[idx]                                                        # (N, L)
        N, L = seqs.shape
        with torch.no_grad():
            _, cap = target(seqs, capture=tuple(c.target_layers), logits=False)
            f_raw = torch.cat([cap[i] for i in c.target_layers], dim=-1)            # (N, L, n_tl*n_embd)
        n_a = min(a.anchors, L - 1 - plen)
        tok, pos, lab, mask = make_batch(seqs, plen, n_a, B, mask_id, gen)
        # positions differ per sequence: run the drafter per row group with shared ctx positions
        logits = model.forward(f_raw, torch.arange(L), tok, pos, mask)
        loss, slot_acc = block_loss(logits, lab, B, a.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        now = time.time()
        elapsed += now - t_last
        t_last = now
        acc_loss += float(loss)
        acc_n += 1
        acc_slots = slot_acc if acc_slots is None else [x + y for x, y in zip(acc_slots, slot_acc)]
        if step % 10 == 0:
            sa = [x / acc_n for x in acc_slots]
            # expected acceptance length from per-slot accuracies (conditional chain approximated)
            tau_est = 1 + sum(math.prod(sa[:j + 1]) for j in range(len(sa)))
            rec = {"step": step, "elapsed_s": round(elapsed, 1), "lr": lr, "loss": acc_loss / acc_n,
                   "slot_acc": [round(x, 4) for x in sa], "tau_est_indep": round(tau_est, 3)}
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            print("drafter: step %d %.1fmin loss %.3f acc1 %.3f acc8 %.3f acc15 %.3f lr %.2e" % (
                step, elapsed / 60, rec["loss"], sa[0], sa[7], sa[-1], lr), flush=True)
            acc_loss, acc_n, acc_slots = 0.0, 0, None
        if now - t_ckpt > a.ckpt_min * 60:
            save()
            t_ckpt = time.time()
            t_last += t_ckpt - now
    save()
    torch.save({"model": model.state_dict(), "config": c.to_dict(), "step": step, "elapsed": elapsed},
               os.path.join(W, "drafter_final.pt"))
    print("drafter: done, %d steps, %.1f min" % (step, elapsed / 60), flush=True)


if __name__ == "__main__":
    main()
