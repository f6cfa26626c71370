"""gen_drafter_data.py: the drafter's training data: the target's own greedy continuations.

    /usr/bin/python3 train/gen_drafter_data.py --work train/work [--budget-min 8]

Each round takes a batch of prompts (random windows of the TRAINING streams, half prose, half
code; prompt length cycling through 32/64/128 tokens) and extends them greedily by --gen tokens
with the (export-rounded) target and a KV cache. Rounds append to work/drafter_data.pt:
{"seqs": [int16 tensor (N, P + gen)], "prompt_len": [P]}; a restarted run keeps what exists.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_gguf import load_target, round_to_export  # noqa: E402
from train_target import load_bin  # noqa: E402


@torch.no_grad()
def greedy_batch(model, prompts, n_gen):
    """prompts (N, P) -> (N, P + n_gen): greedy continuation with a KV cache."""
    cache = [None] * model.c.n_layer
    logits, _ = model(prompts, cache=cache)
    tok = logits[:, -1].argmax(-1, keepdim=True)                     # (N, 1)
    out = [prompts, tok]
    pos = prompts.shape[1]
    for _ in range(n_gen - 1):
        logits, _ = model(tok, start_pos=pos, cache=cache)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        out.append(tok)
        pos += 1
    return torch.cat(out, dim=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--budget-min", type=float, default=8.0)
    ap.add_argument("--max-seqs", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=777)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    W = a.work
    model = round_to_export(load_target(os.path.join(W, "target_final.pt")))
    streams = [load_bin(os.path.join(W, "train_prose.bin")), load_bin(os.path.join(W, "train_code.bin"))]
    path = os.path.join(W, "drafter_data.pt")
    data = torch.load(path) if os.path.exists(path) else {"seqs": [], "prompt_len": []}
    gen = torch.Generator().manual_seed(a.seed + len(data["seqs"]))
    t0 = time.time()
    n_have = sum(s.shape[0] for s in data["seqs"])
    while n_have < a.max_seqs and time.time() - t0 < a.budget_min * 60:
        P = (32, 64, 128)[len(data["seqs"]) % 3]
        rows = []
        for i in range(a.batch):
            s = streams[i % 2]
            o = int(torch.randint(0, len(s) - P, (1,), generator=gen))
            rows.append(s[o:o + P])
        t1 = time.time()
        seqs = greedy_batch(model, torch.stack(rows), a.gen)
        data["seqs"].append(seqs.to(torch.int16))
        data["prompt_len"].append(P)
        n_have += seqs.shape[0]
        torch.save(data, path + ".tmp")
        os.replace(path + ".tmp", path)
        print("gen: %d sequences (P=%d, +%d) %.1fs, total %d, %.1f min" % (
            seqs.shape[0], P, a.gen, time.time() - t1, n_have, (time.time() - t0) / 60), flush=True)


if __name__ == "__main__":
    main()
