"""plot.py: loss curves of the target and drafter runs -> one PNG (matplotlib, Agg backend).

    /usr/bin/python3 train/plot.py --work train/work --out models/training.png

Target: the first run (work/target_run1_log.jsonl, if present: the from-scratch run the current
target was continued from) and the continued run (work/target_log.jsonl), on one token axis.
Drafters: the weighted block loss and per-slot accuracy of each family's run
(drafter_log.jsonl = DFlash, drafter_dspark_log.jsonl, drafter_dflash2_log.jsonl).
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FAMILIES = (("DFlash", "drafter_log.jsonl", "-"), ("DSpark", "drafter_dspark_log.jsonl", "--"),
            ("DFlash2", "drafter_dflash2_log.jsonl", ":"))


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
    runs = []
    p1 = os.path.join(a.work, "target_run1_log.jsonl")
    if os.path.exists(p1):
        runs.append(("run 1", read(p1)))
    runs.append(("run 2 (continued)" if runs else "", read(os.path.join(a.work, "target_log.jsonl"))))
    off, title = 0.0, []
    for name, t in runs:
        tr = [r for r in t if "loss" in r]
        ev = [r for r in t if "heldout" in r]
        ax[0].plot([off + r["tokens"] / 1e6 for r in tr], [r["loss"] for r in tr], lw=1,
                   label="%s train (10-step mean)" % name)
        for dom, st in (("prose", "o-"), ("code", "s-")):
            ax[0].plot([off + r["tokens"] / 1e6 for r in ev], [r["heldout"][dom] for r in ev], st, ms=3,
                       label="%s held-out %s" % (name, dom))
        title.append("%d steps, %.0f min" % (t[-1]["step"], t[-1]["elapsed_s"] / 60))
        off += t[-1]["tokens"] / 1e6
    ax[0].axhline(4.0, color="gray", lw=0.8, ls="--")
    ax[0].set_xlabel("training tokens (M)")
    ax[0].set_ylabel("next-token cross-entropy (nats)")
    ax[0].set_title("target (Qwen3; %s)" % " + ".join(title), fontsize=9)
    ax[0].set_ylim(2.5, 8.5)
    ax[0].grid(alpha=0.3)
    ax[0].legend(fontsize=7)
    for fam, fn, ls in FAMILIES:
        dpath = os.path.join(a.work, fn)
        if not os.path.exists(dpath):
            continue
        d = read(dpath)
        ax[1].plot([r["step"] for r in d], [r["loss"] for r in d], ls, lw=1,
                   label="%s (%d steps, %.0f min)" % (fam, d[-1]["step"], d[-1]["elapsed_s"] / 60))
        for j, col in ((0, "C0"), (7, "C1"), (14, "C2")):
            ax[2].plot([r["step"] for r in d], [r["slot_acc"][j] for r in d], ls, color=col, lw=1,
                       label="%s slot %d" % (fam, j + 1))
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("training loss (weighted block CE; + BCE / selector CE)")
    ax[1].set_title("drafters")
    ax[1].grid(alpha=0.3)
    ax[1].legend(fontsize=7)
    ax[2].set_xlabel("step")
    ax[2].set_ylabel("draft accuracy vs target greedy (training batches)")
    ax[2].set_title("drafter per-slot accuracy (argmax of the slot)")
    ax[2].set_ylim(0, 1)
    ax[2].grid(alpha=0.3)
    ax[2].legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=80)
    print("plot: %s" % a.out)


if __name__ == "__main__":
    main()
