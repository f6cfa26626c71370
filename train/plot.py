"""plot.py: loss curves of the target and drafter runs -> one PNG (matplotlib, Agg backend).

    /usr/bin/python3 train/plot.py --work train/work --out models/training.png
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    t = read(os.path.join(a.work, "target_log.jsonl"))
    tr = [r for r in t if "loss" in r]
    ax[0].plot([r["tokens"] / 1e6 for r in tr], [r["loss"] for r in tr], label="train (10-step mean)", lw=1)
    ev = [r for r in t if "heldout" in r]
    for dom, st in (("prose", "o-"), ("code", "s-")):
        ax[0].plot([r["tokens"] / 1e6 for r in ev], [r["heldout"][dom] for r in ev], st, ms=3, label="held-out " + dom)
    ax[0].set_xlabel("training tokens (M)")
    ax[0].set_ylabel("next-token cross-entropy (nats)")
    ax[0].set_title("target (Qwen3, %d steps, %.0f min)" % (t[-1]["step"], t[-1]["elapsed_s"] / 60))
    ax[0].set_ylim(0, 8.5)
    ax[0].grid(alpha=0.3)
    ax[0].legend()
    dpath = os.path.join(a.work, "drafter_log.jsonl")
    if os.path.exists(dpath):
        d = read(dpath)
        ax[1].plot([r["step"] for r in d], [r["loss"] for r in d], lw=1)
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("weighted block cross-entropy")
        ax[1].set_title("drafter (DFlash, %d steps, %.0f min)" % (d[-1]["step"], d[-1]["elapsed_s"] / 60))
        ax[1].grid(alpha=0.3)
        for j in (0, 3, 7, 14):
            ax[2].plot([r["step"] for r in d], [r["slot_acc"][j] for r in d], lw=1, label="slot %d" % (j + 1))
        ax[2].set_xlabel("step")
        ax[2].set_ylabel("draft accuracy vs target greedy (training batches)")
        ax[2].set_title("drafter per-slot accuracy")
        ax[2].set_ylim(0, 1)
        ax[2].grid(alpha=0.3)
        ax[2].legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=80)
    print("plot: %s" % a.out)


if __name__ == "__main__":
    main()
