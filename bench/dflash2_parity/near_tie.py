"""near_tie.py: why two engines can draft differently at one DFlash2 step although the walk's
margin is large. The float64 reference (tests/ref/dflash2_np.py) at that step, position by
position: the walk margin (best - second best lattice score) and the gap at the top-k boundary
(the k-th vs the (k+1)-th logit), and what the walk drafts when the (k+1)-th id replaces the k-th
in the candidate set. The f32 engines' logits differ from float64 by a few 1e-3 (f16 activations
into F16 matmuls, an f16 KV cache), enough to swap two ids whose logits are closer than that;
when the id swapped in or out has the best lattice score, the draft changes at that position
although no two walk scores are close. Optional emulations of the engines' arithmetic show where
the boundary lands under each.

usage: python3 bench/dflash2_parity/near_tie.py --target T --drafter D
           (--context ID,ID,... [--anchor ID] | --run RUN.json --step S)
           [--n-draft N] [--positions 3] [--tie 0.01] [--mode f64 f32 f16act dflash llama] [--logits F]
  --context: the committed tokens before the anchor (what the target and the drafter's context
             hold); --anchor: the last committed token (default: the target's greedy token after
             the context, which a greedy run commits).
  --run/--step: the context and anchor of step S (0-based) of a `dflash generate --json` output.
  --logits FILE: an engine's f32 logits of block position 1 (n_vocab floats, e.g. dumped by a
             temporary debug print) to compare with float64.
Modes (each also compared with f64 at position 1): f64 (the reference), f32 (every array f32),
f16act (f64, but every matmul with an F16 weight sees f16-rounded activations, as both engines'
CPU kernels and ggml's do), dflash (f16act plus dflash's CPU attention over an f16 cache: q, K, V
and the probabilities in f16, the P V sum in f32 or wider), llama (f16act plus ggml's CPU flash
attention over an f16 cache: an online softmax with an f16 V accumulator). A line "NEAR-TIE"
marks a float64 gap below --tie that decides the draft. Needs numpy; not part of `make check`."""


import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import model_np as M  # noqa: E402
import dflash2_np as D2  # noqa: E402


def r16(x):
    return np.asarray(x).astype(np.float16).astype(np.asarray(x).dtype)


class _W16T:
    """W.T of a wrapped weight: x @ W.T rounds x to f16 first."""
    __array_ufunc__ = None

    def __init__(self, a):
        self.a = a

    def __rmatmul__(self, x):
        return r16(x) @ self.a


class W16:
    """An F16 weight whose matmuls see f16-rounded activations (y = W x or x @ W.T)."""
    __array_ufunc__ = None

    def __init__(self, a):
        self.a = a
        self.shape = a.shape

    @property
    def T(self):
        return _W16T(self.a.T)

    def __matmul__(self, x):
        return self.a @ r16(x)

    def __getitem__(self, idx):
        return self.a[idx]


def wrap_layers_f16(m):
    """Wraps the layer matrices of a target or drafter (the files' F16 weights) for f16 activations."""
    for L in m.layers:
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            setattr(L, name, W16(getattr(L, name)))


def wrap_target_f16(t):
    """Wraps every matrix the target multiplies (its layers and output head) for f16 activations."""
    wrap_layers_f16(t)
    t.output = W16(t.output)


def wrap_f16(t, d):
    """Wraps every matrix the engines multiply with f16 activations (the files' F16 weights)."""
    wrap_target_f16(t)
    wrap_layers_f16(d)
    d.output = t.output
    d.fc = W16(d.fc)
    d.sel_hidden = W16(d.sel_hidden)
    for C in d.conv:
        C["attn_proj"] = W16(C["attn_proj"])
        C["ffn_proj"] = W16(C["ffn_proj"])


ATTENTION_F64 = M.attention


def _gqa(q, k, v):
    g = q.shape[1] // k.shape[1]
    return (np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)) if g > 1 else (k, v)


def attention_dflash(q, k, v, mask=None):
    """dflash's CPU attention over an f16 cache (src/backend/cpu/cpu_ops.c, cpu_ops_ref.c): q, K, V
    in f16, an f32 softmax, the probabilities rounded to f16 times V, summed here in float64 (the
    kernels sum in f32)."""
    k, v = _gqa(q, r16(k), r16(v))
    q = r16(q)
    s = (np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])).astype(np.float32).astype(np.float64)
    if mask is not None:
        s = np.where(mask[None, :, :], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = r16(p / p.sum(axis=-1, keepdims=True))
    return np.einsum("hqk,khd->qhd", p, v)


def attention_llama_fa(q, k, v, mask=None):
    """ggml's CPU flash attention for fewer than 64 query rows over an f16 cache
    (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk): Q rounded to f16, an
    online softmax over the cells in order, the V sum kept in an f16 accumulator (VKQ16: scaled by
    exp(M_old - M) on a new maximum, then += v * exp(s - M), rounded to f16 at every step)."""
    k, v = _gqa(q, r16(k), r16(v))
    q = r16(q)
    f32 = np.float32
    nq, nh, dv = q.shape[0], q.shape[1], v.shape[2]
    scale = f32(1.0 / np.sqrt(q.shape[-1]))
    s_all = np.einsum("qhd,khd->qhk", q, k).astype(f32) * scale          # (n_q, n_head, n_k)
    M = np.full((nq, nh), -np.inf, dtype=f32)
    S = np.zeros((nq, nh), dtype=f32)
    acc = np.zeros((nq, nh, dv), dtype=np.float16)
    for c in range(k.shape[0]):
        vis = np.ones(nq, dtype=bool) if mask is None else mask[:, c]
        s = s_all[:, :, c]
        new = (s > M) & vis[:, None]
        with np.errstate(invalid="ignore", over="ignore"):
            ms = np.where(new, np.exp(M - s), f32(1)).astype(f32)
            vs = np.where(new, f32(1), np.exp(s - M)).astype(f32)
        M = np.where(new, s, M)
        a32 = acc.astype(f32)
        a32 = np.where(new[:, :, None], (a32 * ms[:, :, None]).astype(np.float16).astype(f32), a32)
        upd = (a32 + v[c][None].astype(f32) * vs[:, :, None]).astype(np.float16)
        acc = np.where(vis[:, None, None], upd, a32.astype(np.float16))
        S = np.where(vis[:, None], S * ms + vs, S).astype(f32)
    return acc.astype(np.float64) / S[:, :, None].astype(np.float64)


def set_attention(fn):
    M.attention = fn
    D2.attention = fn


def emulate(mode, t, d=None):
    """Sets up a mode's arithmetic on target t (and drafter d): f16-rounded activations for the F16
    matmuls in the f16act / dflash / llama modes, and that mode's attention (f64 otherwise)."""
    if mode in ("f16act", "dflash", "llama"):
        if d is None:
            wrap_target_f16(t)
        else:
            wrap_f16(t, d)
    set_attention({"dflash": attention_dflash, "llama": attention_llama_fa}.get(mode, ATTENTION_F64))


def lattice_of(d, logits, e, last, cands):
    """Drafter2.lattice with a given candidate set (n, k) instead of the top-k."""
    k = d.k
    lat = np.zeros((len(cands), k + k * k))
    for i in range(len(cands)):
        u = logits[i][cands[i]]
        gate = d.sel_hidden @ e[i]
        lat[i, :k] = cands[i]
        for j in range(k):
            p = last if i == 0 else cands[i - 1][j]
            lat[i, k + j * k: k + (j + 1) * k] = u + d.sel_succ[cands[i]] @ (d.sel_pred[p] * gate)
    return lat


def block(mode, args, ctx, anchor):
    dtype = np.float32 if mode == "f32" else np.float64
    t = M.Target(args.target, dtype=dtype)
    d = D2.Drafter2(args.drafter, t, dtype=dtype)
    emulate(mode, t, d)
    n = len(ctx)
    r = t.forward(ctx, np.arange(n), None, capture=d.target_layers, logits="last")
    dc = d.new_cache()
    d.add_context(dc, d.features(r.captured), np.arange(n))
    last = int(np.argmax(r.logits[-1])) if anchor is None else anchor
    logits, e = d.forward_block2(dc, [last] + [d.mask_token_id] * args.n_draft, n)
    return d, last, logits[1:].astype(np.float64), e[1:].astype(np.float64)


def context_of_run(path, step):
    """(context, anchor, n_draft) of step `step` (0-based) of a `dflash generate --json` run: the
    first step drafts from the last prompt token, each step commits its accepted drafts and the
    target's token, which is the next anchor."""
    with open(path) as f:
        j = json.load(f)
    steps = j.get("steps") or []
    if not 0 <= step < len(steps):
        raise SystemExit("near_tie.py: %s has %d steps, no step %d" % (path, len(steps), step))
    full = list(j["prompt_tokens"]) + list(j["tokens"])
    n = len(j["prompt_tokens"]) - 1 + sum(a + 1 for _, a in steps[:step])
    if n >= len(full):
        raise SystemExit("near_tie.py: step %d starts after the run's last token" % step)
    return full[:n], full[n], int(j.get("n_draft", 15))


def main(argv):
    ap = argparse.ArgumentParser(prog="near_tie.py")
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--context", help="committed token ids before the anchor, comma-separated")
    ap.add_argument("--anchor", type=int, default=None)
    ap.add_argument("--run", help="a `dflash generate --json` output (with --step instead of --context)")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--n-draft", type=int, default=None)
    ap.add_argument("--positions", type=int, default=3)
    ap.add_argument("--tie", type=float, default=0.01,
                    help="a gap below this (nats) is a near-tie (default 0.01: the f32 engines' logits "
                         "differ from float64 by up to ~0.007 on the embedded pair)")
    ap.add_argument("--mode", nargs="+", default=["f64"], choices=["f64", "f32", "f16act", "dflash", "llama"])
    ap.add_argument("--logits", default=None)
    args = ap.parse_args(argv)
    if (args.run is None) == (args.context is None) or (args.run is not None) != (args.step is not None):
        ap.error("give either --context [--anchor] or --run FILE --step S")
    if args.run is not None:
        ctx, anchor, n_draft = context_of_run(args.run, args.step)
    else:
        ctx, anchor, n_draft = [int(x) for x in args.context.split(",")], args.anchor, 15
    if args.n_draft is None:
        args.n_draft = n_draft
    modes = args.mode if args.mode[0] == "f64" else ["f64"] + args.mode
    ref = None
    for mode in modes:
        d, last, logits, e = block(mode, args, ctx, anchor)
        k = d.k
        cands, lat = d.lattice(logits, e, last)
        toks, _, margins = d.walk(cands, lat)
        print("== %s: context %d tokens, anchor %d, walk %s" % (mode, len(ctx), last, toks[:args.positions].tolist()))
        for p in range(min(args.positions, len(toks))):
            srt = np.argsort(-logits[p], kind="stable")
            kth, nxt = int(srt[k - 1]), int(srt[k])
            gap = float(logits[p][kth] - logits[p][nxt])
            # the walk with the (k+1)-th id in place of the k-th at position p
            alt = cands.copy()
            alt[p][k - 1] = nxt
            toks2, _, _ = d.walk(alt, lattice_of(d, logits, e, last, alt))
            print("  position %d: drafts %d, walk margin %.4f; top-k boundary: #%d %d (%.5f) vs #%d %d (%.5f), gap %.5f;"
                  " with %d in place of %d the walk drafts %s"
                  % (p + 1, toks[p], margins[p], k, kth, logits[p][kth], k + 1, nxt, logits[p][nxt], gap, nxt, kth,
                     toks2[:p + 2].tolist()))
            if p == 0:
                print("    candidates (logit / lattice score after the anchor): " +
                      " ".join("%d:%.4f/%.4f" % (c, logits[0][c], sc) for c, sc in zip(cands[0], lat[0, k:2 * k])))
            if mode == "f64":
                if gap < args.tie and toks2[p] != toks[p]:
                    print("    NEAR-TIE at the top-k boundary: a logit rounding of %.5f swaps %d and %d and the draft "
                          "becomes %d" % (gap, kth, nxt, toks2[p]))
                elif margins[p] < args.tie:
                    print("    NEAR-TIE in the walk: margin %.5f" % margins[p])
        if ref is None:
            ref = logits[0]
        else:
            dif = logits[0] - ref
            print("  position 1 logits vs f64: max |diff| %.5f, rms %.5f" % (np.abs(dif).max(), np.sqrt((dif ** 2).mean())))
    if args.logits:
        ours = np.fromfile(args.logits, dtype=np.float32)
        if ours.size < ref.size:
            raise SystemExit("near_tie.py: %s holds %d floats, need %d" % (args.logits, ours.size, ref.size))
        ours = ours[:ref.size].astype(np.float64)
        dif = ours - ref
        o = np.argsort(-ours, kind="stable")
        print("== %s: position 1 logits vs f64: max |diff| %.5f, rms %.5f; top-%d %s"
              % (args.logits, np.abs(dif).max(), np.sqrt((dif ** 2).mean()), d.k + 1,
                 " ".join("%d:%.5f" % (c, ours[c]) for c in o[:d.k + 1])))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (M.ModelError, OSError, ValueError, KeyError) as ex:
        sys.stderr.write("near_tie.py: error: %s\n" % ex)
        sys.exit(1)
