"""train_drafter.py: trains a drafter (DFlash, DSpark or DFlash2) on the target's greedy
continuations (PyTorch, CPU).

    /usr/bin/python3 train/train_drafter.py --work train/work [--budget-min 25] [--family dflash]
    /usr/bin/python3 train/train_drafter.py --work train/work --family dspark --init-ckpt train/work/drafter_final.pt
    /usr/bin/python3 train/train_drafter.py --work train/work --family dflash2 --init-ckpt train/work/drafter_final.pt

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

Families (model.py; the tag names the files: drafter_<family>_ckpt.pt etc. for dspark/dflash2):
  dflash   the loss above.
  dspark   the block logits get the Markov bias of the TRUE previous token (teacher forcing: the
           anchor for slot 1, x_{a+k-1} for slot k; at inference the chain uses its own argmax,
           which equals it as long as the draft is right) and the weighted CE is taken on them;
           the confidence head is trained with BCE to predict that the draft at slot k is
           accepted (the argmax of the biased logits is right at slots 1..k), on detached inputs
           (a logistic head that does not move the drafter). Blocks are bonus-anchor
           (dflash.sample_from_anchor = false: slot k drafts x_{a+k}, as DFlash).
  dflash2  the block convolutions run inside the layers; besides the weighted CE, the selector
           is trained with a CE over the top-k candidates of each slot (score = logit +
           transition(previous TRUE token -> candidate)), the label being the true token's
           candidate index (slots whose true token is not among the candidates are skipped), so
           that the lattice walk reproduces the target's tokens.
--init-ckpt starts from a trained DFlash checkpoint (its weights; the new heads start neutral:
zero Markov bias, identity convolutions, zero selector gate, so step 0 drafts as that DFlash
drafter). --init-gguf starts from a DFlash GGUF (e.g. the previously committed drafter), keeping
the fc columns of the target layers both share.
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
from model import Config, Drafter, make_drafter, n_params  # noqa: E402

FAMILY_KEYS = {"dflash": {}, "dspark": dict(markov_rank=64, sample_from_anchor=False),
               "dflash2": dict(conv_kernel_size=4, conv_group_size=32, selector_rank=64, selector_top_k=8)}


def drafter_config(tc, mask_id, family="dflash", target_layers=(1, 3, 5)):
    d = tc.to_dict()
    d.update(n_layer=2, block_size=16, target_layers=list(target_layers), mask_token_id=mask_id, family=family)
    d.update(FAMILY_KEYS[family])
    return d


def init_from_gguf(model, path):
    """Warm start from a DFlash GGUF whose target_layers may differ: layers, norms and the fc
    column blocks of the shared target layer ids are copied."""
    from from_gguf import load_drafter_weights, GGUF
    old_tl = [int(x) for x in GGUF(path).kv["dflash.target_layers"]]
    oc = Config(**dict(model.c.to_dict(), target_layers=old_tl, family="dflash"))
    old = Drafter(oc, model.target[0])
    load_drafter_weights(path, old)
    sd = {k: v for k, v in old.state_dict().items() if k != "fc.weight"}
    model.load_state_dict(sd, strict=False)
    e = model.c.n_embd
    with torch.no_grad():
        model.fc.weight.normal_(0.0, 0.002)
        for j, lid in enumerate(model.c.target_layers):
            if lid in old_tl:
                i = old_tl.index(lid)
                model.fc.weight[:, j * e:(j + 1) * e] = old.fc.weight[:, i * e:(i + 1) * e]
    return old_tl


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
    ap.add_argument("--family", default="dflash", choices=sorted(FAMILY_KEYS))
    ap.add_argument("--target-layers", default="1,3,5", help="layer-INPUT ids (< n_layer for llama.cpp)")
    ap.add_argument("--init-gguf", default=None, help="warm start from a DFlash GGUF")
    ap.add_argument("--init-ckpt", default=None, help="warm start from a DFlash checkpoint (drafter_final.pt)")
    ap.add_argument("--aux-weight", type=float, default=1.0, help="weight of the selector CE (dflash2)")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 autocast (float32 master weights)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    W = a.work
    v = Vocab.load(os.path.join(W, "vocab.json"))
    mask_id = v.specials["<|MASK|>"]
    target = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    for p in target.parameters():
        p.requires_grad_(False)
    c = Config(**drafter_config(target.c, mask_id, a.family, [int(x) for x in a.target_layers.split(",")]))
    B = c.block_size
    model = make_drafter(c, target)
    tag = "drafter" if a.family == "dflash" else "drafter_" + a.family
    if a.init_ckpt:
        ck = torch.load(a.init_ckpt)
        assert ck["config"]["target_layers"] == c.target_layers, "init checkpoint has other target_layers"
        missing, unexpected = model.load_state_dict(ck["model"], strict=False)
        assert not unexpected, unexpected
        print("drafter: %s initialized from %s (new: %s)" % (a.family, a.init_ckpt, sorted({m.split(".")[0] for m in missing})), flush=True)
    elif a.init_gguf:
        print("drafter: initialized from %s (its target_layers %s)" % (a.init_gguf, init_from_gguf(model, a.init_gguf)), flush=True)
    elif not a.random_init:
        print("drafter: layers initialized from target layer %d" % init_from_target(model, target), flush=True)
    data = torch.load(os.path.join(W, "drafter_data.pt"))
    groups = [(s.long(), p) for s, p in zip(data["seqs"], data["prompt_len"])]
    n_seq = sum(s.shape[0] for s, _ in groups)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)
    ckpt_path = os.path.join(W, tag + "_ckpt.pt")
    log_path = os.path.join(W, tag + "_log.jsonl")
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
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            with torch.no_grad():
                _, cap = target(seqs, capture=tuple(c.target_layers), logits=False)
                f_raw = torch.cat([cap[i] for i in c.target_layers], dim=-1)        # (N, L, n_tl*n_embd)
            n_a = min(a.anchors, L - 1 - plen)
            tok, pos, lab, mask = make_batch(seqs, plen, n_a, B, mask_id, gen)
            h = model.hidden(f_raw, torch.arange(L), tok, pos, mask, block_len=B)   # (N, Tb, n_embd)
            logits = model.head(h)
        logits, h = logits.float(), h.float()
        extra = {}
        if a.family == "dflash":
            loss, slot_acc = block_loss(logits, lab, B, a.gamma)
        else:
            prev = seqs.gather(1, (pos - 1).clamp(0, L - 1))                           # true previous token
            if a.family == "dspark":
                e = model.markov_w1(prev)
                z = logits + model.markov_w2(e)
                loss, slot_acc = block_loss(z, lab, B, a.gamma)
                cl = model.conf(torch.cat([h.detach(), e.detach()], -1))[..., 0]     # (N, Tb)
                valid = (lab != -100).view(N, n_a, B)
                right = ((z.argmax(-1) == lab) | ~(lab != -100)).view(N, n_a, B)
                right[:, :, 0] = True
                accd = right.long().cumprod(-1).bool() & valid                        # accepted through slot k
                bce = F.binary_cross_entropy_with_logits(cl.view(N, n_a, B)[valid], accd[valid].float())
                loss = loss + bce
                extra = {"conf_bce": float(bce),
                         "conf_acc": float(((cl.view(N, n_a, B)[valid] > 0) == accd[valid]).float().mean())}
            else:
                loss, slot_acc = block_loss(logits, lab, B, a.gamma)
                cand, sc = model.selector(logits, h, prev)                              # (N, Tb, k)
                hit = cand == lab.unsqueeze(-1)
                ok = hit.any(-1) & (lab != -100)
                kk = torch.arange(lab.shape[1]) % B
                w = torch.exp(-(kk.float() - 1) / a.gamma) * (kk > 0).float()
                wv = w[None, :].expand_as(ok)[ok]
                sce = (F.cross_entropy(sc[ok], hit[ok].float().argmax(-1), reduction="none") * wv).sum() / wv.sum()
                loss = loss + a.aux_weight * sce
                walk_right = (cand.gather(-1, sc.argmax(-1, keepdim=True))[..., 0] == lab)[lab != -100]
                extra = {"sel_ce": float(sce), "sel_acc": float(walk_right.float().mean()),
                         "in_topk": float(ok.float().sum() / (lab != -100).float().sum())}
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
            rec.update({k: round(v, 4) for k, v in extra.items()})
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            print("%s: step %d %.1fmin loss %.3f acc1 %.3f acc8 %.3f acc15 %.3f lr %.2e %s" % (
                tag, step, elapsed / 60, rec["loss"], sa[0], sa[7], sa[-1], lr,
                " ".join("%s %.3f" % kv for kv in extra.items())), flush=True)
            acc_loss, acc_n, acc_slots = 0.0, 0, None
        if now - t_ckpt > a.ckpt_min * 60:
            save()
            t_ckpt = time.time()
            t_last += t_ckpt - now
    save()
    torch.save({"model": model.state_dict(), "config": c.to_dict(), "step": step, "elapsed": elapsed},
               os.path.join(W, tag + "_final.pt"))
    print(tag + ": done, %d steps, %.1f min" % (step, elapsed / 60), flush=True)


if __name__ == "__main__":
    main()
