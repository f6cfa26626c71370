"""dflash2_np.py: independent numpy float64 reference of the DFlash2 drafter (docs/drafter.md,
"DFlash2"), written from the doc only: the dynamic convolutions around each layer's attention
and FFN, the selector lattice and the greedy walk over it.

    d = Drafter2("drafter.gguf", target)          # a DFlash2 file (selector_hidden.weight present)
    toks, logits, lat, margins = d.draft2(cache, last, start, n_draft)

CLI (used by tests/test_dflash2.c):
    dflash2_np.py draft --target T --drafter D --tokens 1,2,3 --n-draft N --out PREFIX
        prefill the target on the tokens, feed the drafter, draft one block after the target's
        greedy token; writes PREFIX.logits (n_draft x n_vocab f32), PREFIX.lattice (n_draft x
        (k + k*k) f32) and prints JSON: last, draft_tokens, margins (per position: the gap between
        the best and second best walk score, and between the k-th and (k+1)-th logit).
    dflash2_np.py spec --target T --drafter D --tokens 1,2,3 -n N --n-draft N
        greedy speculative loop with the DFlash2 drafter; JSON: tokens, accepted, greedy_equal.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_np as M  # noqa: E402
from model_np import ModelError, rmsnorm, attention, rope, silu, ROPE_NEOX, _kv_int, _qkv  # noqa: E402


def top_k(row, k):
    """The k ids of the largest values, descending; equal values: lower id first."""
    return np.argsort(-row, kind="stable")[:k]


class Drafter2(M.Drafter):
    def __init__(self, path, target, dtype=np.float64):
        super().__init__(path, target, dtype)
        g = self.g
        if not g.has("selector_hidden.weight"):
            raise ModelError("%s: not a DFlash2 drafter (no selector_hidden.weight)" % path)
        e = self.hp.n_embd
        self.K = _kv_int(g, "dflash.conv_kernel_size")
        self.gs = _kv_int(g, "dflash.conv_group_size")
        self.R = _kv_int(g, "dflash.selector_rank")
        self.k = _kv_int(g, "dflash.selector_top_k")
        if self.K < 1 or self.gs < 1 or e % self.gs or self.R < 1 or self.k < 1:
            raise ModelError("%s: bad DFlash2 keys" % path)
        self.G = e // self.gs
        nv = self.output.shape[0]
        K, G, R = self.K, self.G, self.R

        def w(name, shape):
            a = g.tensor(name).astype(dtype)
            if a.shape != shape:
                raise ModelError("%s: %s has numpy shape %s, expected %s" % (path, name, a.shape, shape))
            return a

        self.conv = []
        for i in range(self.hp.n_layer):
            b = "blk.%d." % i
            self.conv.append({
                "attn_base": w(b + "attn_conv_base", (2, K, e)),          # [side][tap][channel]
                "attn_proj": w(b + "attn_conv_proj.weight", (2 * K * G, e)),
                "ffn_base": w(b + "ffn_conv_base", (2, K, e)),
                "ffn_proj": w(b + "ffn_conv_proj.weight", (2 * K * G, e)),
            })
        self.sel_pred = w("selector_predecessor.weight", (nv, R))        # row = token id
        self.sel_succ = w("selector_successor.weight", (nv, R))
        self.sel_hidden = w("selector_hidden.weight", (R, e))

    def dconv(self, y, c, base, side):
        """y (B, e) convolved along the block: out[i] = sum_t w_t[i] * y[i - t], with
        w_t[i, ch] = c[i, g(ch) + G (t + K side)] + base[side, t, ch]."""
        B, K, G, gs = y.shape[0], self.K, self.G, self.gs
        coef = c.reshape(B, 2, K, G)[:, side]                         # (B, K, G)
        wts = np.repeat(coef, gs, axis=2) + base[side][None]          # (B, K, e)
        out = np.zeros_like(y)
        for t in range(K):
            if t < B:
                out[t:] += wts[t:, t] * y[:B - t]
        return out

    def forward_block2(self, cache, block_tokens, start):
        """The block with the convolutions; returns (logits (B, n_vocab), e (B, n_embd))."""
        hp = self.hp
        toks = np.asarray(block_tokens, dtype=np.int64)
        B = len(toks)
        pos = start + np.arange(B)
        x = self.tok_embd[toks]
        for j, L in enumerate(self.layers):
            C = self.conv[j]
            h = rmsnorm(x, L.attn_norm, hp.eps)
            c = h @ C["attn_proj"].T                                   # (B, 2KG)
            h = self.dconv(h, c, C["attn_base"], 0)
            q, k, v = _qkv(L, hp, h, pos, ROPE_NEOX)
            Kc, Vc, cpos = cache.view(j)
            ctx = cpos < start
            K_ = np.concatenate([Kc[ctx], k])
            V_ = np.concatenate([Vc[ctx], v])
            mask = None
            if self.causal:
                n_ctx = int(ctx.sum())
                mask = np.ones((B, n_ctx + B), dtype=bool)
                mask[:, n_ctx:] = np.tril(np.ones((B, B), dtype=bool))
            a = attention(q, K_, V_, mask).reshape(B, hp.n_head * hp.head_dim_v) @ L.wo.T
            x = x + self.dconv(a, c, C["attn_base"], 1)
            h = rmsnorm(x, L.ffn_norm, hp.eps)
            c = h @ C["ffn_proj"].T
            h = self.dconv(h, c, C["ffn_base"], 0)
            f = (silu(h @ L.w_gate.T) * (h @ L.w_up.T)) @ L.w_down.T
            x = x + self.dconv(f, c, C["ffn_base"], 1)
        e = rmsnorm(x, self.output_norm, hp.eps)
        logits = e @ self.output.T
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.softcap > 0:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits, e

    def lattice(self, logits, e, last):
        """Rows 1..n of the block: logits (n, V), e (n, n_embd). Returns (cands (n, k),
        lattice (n, k + k*k): candidate ids then score[j][s] at k + j*k + s)."""
        n, k = logits.shape[0], self.k
        cands = np.stack([top_k(logits[i], k) for i in range(n)])
        lat = np.zeros((n, k + k * k))
        for i in range(n):
            cand = cands[i]
            u = logits[i][cand]
            gate = self.sel_hidden @ e[i]                              # (R,)
            preds = [last] if i == 0 else list(cands[i - 1])
            lat[i, :k] = cand
            for j in range(k):
                p = preds[0] if i == 0 else preds[j]
                lat[i, k + j * k: k + (j + 1) * k] = u + self.sel_succ[cand] @ (self.sel_pred[p] * gate)
        return cands, lat

    def walk(self, cands, lat):
        """Greedy walk; returns (tokens (n,), probs (n,), margins (n,): best - second best score)."""
        n, k = cands.shape
        j, toks, probs, margins = 0, [], [], []
        for i in range(n):
            sc = lat[i, k + j * k: k + (j + 1) * k]
            best = int(np.argmax(sc))                                  # first maximum
            srt = np.sort(sc)[::-1]
            margins.append(float(srt[0] - srt[1]) if k > 1 else float("inf"))
            probs.append(float(1.0 / np.sum(np.exp(sc - sc[best]))))
            toks.append(int(cands[i][best]))
            j = best
        return np.array(toks, dtype=np.int64), np.array(probs), np.array(margins)

    def draft2(self, cache, last, start, n_draft):
        logits, e = self.forward_block2(cache, [last] + [self.mask_token_id] * n_draft, start)
        logits, e = logits[1:], e[1:]
        cands, lat = self.lattice(logits, e, last)
        toks, probs, margins = self.walk(cands, lat)
        # gap between the k-th and (k+1)-th logit: how robust the candidate set is
        kgap = []
        for i in range(logits.shape[0]):
            s = np.sort(logits[i])[::-1]
            kgap.append(float(s[self.k - 1] - s[self.k]) if self.k < len(s) else float("inf"))
        return toks, logits, lat, margins, np.array(kgap), probs


def spec_generate2(t, d, prompt, n_gen, n_draft):
    """Greedy speculative decoding with the DFlash2 walk as the drafter."""
    def draft_fn(dcache, last, start, B):
        toks = d.draft2(dcache, last, start, B - 1)[0]
        return toks
    return M.spec_generate(t, d, prompt, n_gen, n_draft + 1, draft_fn=draft_fn)


def main(argv):
    ap = argparse.ArgumentParser(prog="dflash2_np.py")
    sub = ap.add_subparsers(dest="cmd")
    for name in ("draft", "spec"):
        p = sub.add_parser(name)
        p.add_argument("--target", required=True)
        p.add_argument("--drafter", required=True)
        p.add_argument("--tokens", required=True)
        p.add_argument("--n-draft", type=int, required=True)
        if name == "draft":
            p.add_argument("--out", required=True)
        else:
            p.add_argument("-n", type=int, required=True)
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.error("a command is required (draft, spec)")
    t = M.Target(args.target)
    d = Drafter2(args.drafter, t)
    toks = [int(x) for x in args.tokens.split(",")]
    if args.cmd == "spec":
        r = spec_generate2(t, d, toks, args.n, args.n_draft)
        g = t.greedy(toks, args.n)
        print(json.dumps({"tokens": r.tokens, "accepted": r.accepted, "greedy_equal": g == r.tokens}))
        return 0
    n = len(toks)
    r = t.forward(toks, np.arange(n), None, capture=d.target_layers, logits="last")
    dc = d.new_cache()
    d.add_context(dc, d.features(r.captured), np.arange(n))
    last = int(np.argmax(r.logits[-1]))
    ids, logits, lat, margins, kgap, probs = d.draft2(dc, last, n, args.n_draft)
    logits.astype(np.float32).tofile(args.out + ".logits")
    lat.astype(np.float32).tofile(args.out + ".lattice")
    print(json.dumps({"last": last, "draft_tokens": ids.tolist(), "margins": margins.tolist(),
                      "kgap": kgap.tolist(), "probs": probs.tolist(), "k": d.k}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ModelError as ex:
        sys.stderr.write("dflash2_np.py: error: %s\n" % ex)
        sys.exit(1)
