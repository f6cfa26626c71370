"""train_target.py: trains the Qwen3 target of the embedded default pair (PyTorch, CPU).

    /usr/bin/python3 train/train_target.py --work train/work [--budget-min 50] [--steps 3000]
    /usr/bin/python3 train/train_target.py --work train/work --init-gguf models/target.gguf --bf16 ...  (continued run)

Batches are random windows of the training token streams, half prose and half code. The schedule
(linear warmup, cosine decay to 10%) runs on progress = max(step / steps, elapsed / budget), so a
run ends within the wall-time budget whatever the machine's load. The last 15% of progress uses
windows of n_ctx (512) tokens instead of 256 (same tokens per step) so the model knows every
position up to its context length. A checkpoint (model, optimizer, RNG, step, elapsed) is written
every few minutes to work/target_ckpt.pt; a restarted run resumes from it. One JSON line per
logged step goes to work/target_log.jsonl (loss, lr, tokens/s; held-out losses every eval).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Target, n_params  # noqa: E402

TARGET_CONFIG = dict(n_vocab=4096, n_embd=256, n_layer=6, n_head=4, n_head_kv=2, head_dim=64,
                     n_ff=768, eps=1e-6, rope_base=10000.0, n_ctx=512)


def load_bin(path):
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))


def batch(streams, n, T, gen):
    """n windows of T+1 tokens, alternating streams -> (N, T+1) int64."""
    rows = []
    for i in range(n):
        s = streams[i % len(streams)]
        o = int(torch.randint(0, len(s) - T - 1, (1,), generator=gen))
        rows.append(s[o:o + T + 1])
    return torch.stack(rows)


@torch.no_grad()
def evaluate(model, heldout, T=256, n=16):
    """Mean next-token loss over n fixed, evenly spaced windows of each held-out stream."""
    model.eval()
    out = {}
    for name, s in heldout.items():
        offs = np.linspace(0, len(s) - T - 2, n).astype(np.int64)
        x = torch.stack([s[o:o + T + 1] for o in offs])
        lg, _ = model(x[:, :-1])
        out[name] = float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1)))
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--budget-min", type=float, default=50.0, help="wall-time budget (minutes)")
    ap.add_argument("--steps", type=int, default=4000, help="step budget (whichever ends first)")
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--ckpt-min", type=float, default=3.0)
    ap.add_argument("--init-gguf", default=None, help="start from this qwen3 GGUF's weights (a continued run)")
    ap.add_argument("--init-ckpt", default=None, help="start from this checkpoint's weights (e.g. work/target_run1_final.pt)")
    ap.add_argument("--name", default="target", help="file prefix in --work: NAME_ckpt.pt, NAME_log.jsonl, NAME_final.pt")
    ap.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor as a fraction of --lr")
    ap.add_argument("--long-frac", type=float, default=0.85, help="progress after which windows are n_ctx long")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the training forward/backward "
                    "(float32 master weights and optimizer; evaluation stays float32)")
    ap.add_argument("--eval-min", type=float, default=4.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    W = a.work
    streams = [load_bin(os.path.join(W, "train_prose.bin")), load_bin(os.path.join(W, "train_code.bin"))]
    heldout = {"prose": load_bin(os.path.join(W, "heldout_prose.bin")), "code": load_bin(os.path.join(W, "heldout_code.bin"))}
    c = Config(**TARGET_CONFIG)
    model = Target(c)
    if a.init_gguf or a.init_ckpt:
        if a.init_gguf:
            from from_gguf import load_target
            init = load_target(a.init_gguf)
        else:
            init = Target(Config(**torch.load(a.init_ckpt)["config"]))
            init.load_state_dict(torch.load(a.init_ckpt)["model"])
        assert all(getattr(init.c, k) == getattr(c, k) for k in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_ctx")), "init GGUF has another shape"
        model.load_state_dict(init.state_dict())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed)
    ckpt_path = os.path.join(W, a.name + "_ckpt.pt")
    log_path = os.path.join(W, a.name + "_log.jsonl")
    step, elapsed, n_tok = 0, 0.0, 0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        torch.set_rng_state(ck["rng"])
        step, elapsed, n_tok = ck["step"], ck["elapsed"], ck["n_tok"]
        print("target: resumed at step %d (%.1f min)" % (step, elapsed / 60), flush=True)
    else:
        if a.init_gguf or a.init_ckpt:
            ev0 = evaluate(model, heldout)
            print("target: init from %s, held-out %s" % (a.init_gguf or a.init_ckpt, ev0), flush=True)
        print("target: %.2fM parameters (%.2fM without the embedding)" % (
            n_params(model) / 1e6, (n_params(model) - c.n_vocab * c.n_embd) / 1e6), flush=True)
        with open(log_path, "w") as f:
            if a.init_gguf or a.init_ckpt:
                f.write(json.dumps({"step": 0, "elapsed_s": 0.0, "tokens": 0, "init": a.init_gguf or a.init_ckpt,
                                    "heldout": ev0}) + "\n")
    logf = open(log_path, "a")
    budget = a.budget_min * 60
    t_last = time.time()
    t_ckpt = t_eval = t_last
    loss_acc, n_acc = 0.0, 0

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "rng": torch.get_rng_state(), "step": step, "elapsed": elapsed, "n_tok": n_tok,
                    "config": c.to_dict()}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    while True:
        progress = max(step / a.steps, elapsed / budget)
        if progress >= 1.0:
            break
        T = c.n_ctx if progress >= a.long_frac else 256
        N = max(1, a.batch_tokens // T)
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(streams, N, T, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, c.n_vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        n_tok += N * T
        now = time.time()
        dt = now - t_last
        elapsed += dt
        t_last = now
        loss_acc += float(loss)
        n_acc += 1
        if step % 10 == 0:
            rec = {"step": step, "elapsed_s": round(elapsed, 1), "tokens": n_tok, "lr": lr,
                   "loss": loss_acc / n_acc, "T": T, "tok_s": round(N * T / dt)}
            loss_acc, n_acc = 0.0, 0
            if now - t_eval > a.eval_min * 60:
                rec["heldout"] = evaluate(model, heldout)
                t_eval = time.time()
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            print("target: step %d %.1fmin loss %.3f lr %.2e %d tok/s%s" % (
                step, elapsed / 60, rec["loss"], lr, rec["tok_s"],
                (" heldout %s" % rec["heldout"]) if "heldout" in rec else ""), flush=True)
        if now - t_ckpt > a.ckpt_min * 60:
            save()
            t_ckpt = time.time()
            t_last += t_ckpt - now          # checkpoint time is not training time
    ev = evaluate(model, heldout)
    logf.write(json.dumps({"step": step, "elapsed_s": round(elapsed, 1), "tokens": n_tok, "final": True, "heldout": ev}) + "\n")
    logf.close()
    save()
    torch.save({"model": model.state_dict(), "config": c.to_dict(), "step": step, "tokens": n_tok,
                "elapsed": elapsed, "heldout": ev}, os.path.join(W, a.name + "_final.pt"))
    print("target: done, %d steps, %d tokens, %.1f min, held-out %s" % (step, n_tok, elapsed / 60, ev), flush=True)


if __name__ == "__main__":
    main()
