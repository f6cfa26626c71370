"""model.py: PyTorch Qwen3 target and DFlash drafter of the embedded default pair.

Semantics are docs/target.md and docs/drafter.md (the same as tests/ref/model_np.py and the C engine):
  target  per layer: x += Wo attn(rope_neox(qk_norm(Wq/Wk rmsnorm(x)))), x += Wdown(silu(Wg h)*(Wu h));
          logits = Wout(rmsnorm(x)); output head tied to token_embd (no output.weight).
  drafter fc over the target's layer inputs at target_layers (id L = residual entering target
          layer L), enc norm, K/V injection of the fused feature in every draft layer (no
          attn_norm on it), non-causal block [last, MASK x (B-1)], target embedding and head
          (frozen, shared).
Weights keep torch's Linear layout (n_out, n_in) = GGUF ne [n_in, n_out].
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, **kw):
        self.n_vocab = kw.get("n_vocab", 4096)
        self.n_embd = kw.get("n_embd", 256)
        self.n_layer = kw.get("n_layer", 6)
        self.n_head = kw.get("n_head", 4)
        self.n_head_kv = kw.get("n_head_kv", 2)
        self.head_dim = kw.get("head_dim", 64)
        self.n_ff = kw.get("n_ff", 768)
        self.eps = kw.get("eps", 1e-6)
        self.rope_base = kw.get("rope_base", 10000.0)
        self.n_ctx = kw.get("n_ctx", 512)
        # drafter only
        self.block_size = kw.get("block_size", 16)
        self.target_layers = kw.get("target_layers", [])
        self.mask_token_id = kw.get("mask_token_id", -1)
        self.family = kw.get("family", "dflash")          # dflash | dspark | dflash2
        self.markov_rank = kw.get("markov_rank", 0)        # dspark
        self.sample_from_anchor = kw.get("sample_from_anchor", False)   # dspark: only false is trained here
        self.conv_kernel_size = kw.get("conv_kernel_size", 0)           # dflash2
        self.conv_group_size = kw.get("conv_group_size", 0)
        self.selector_rank = kw.get("selector_rank", 0)
        self.selector_top_k = kw.get("selector_top_k", 0)

    def to_dict(self):
        return dict(self.__dict__)


def rmsnorm(x, w, eps):
    """x (..., n) float32 -> x / sqrt(mean(x^2) + eps) * w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(pos, head_dim, base):
    """pos (..., T) int -> cos, sin (..., T, head_dim/2): theta_i = pos * base^(-2i/head_dim)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv = base ** (-2.0 * i / head_dim)
    ang = pos.to(torch.float64)[..., None] * inv
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope_neox(x, cos, sin):
    """x (N, T, n_head, head_dim) rotated in pairs (i, i + head_dim/2); cos/sin (T, head_dim/2)
    or (N, T, head_dim/2)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def attend(q, k, v, mask):
    """q (N, Tq, H, d), k/v (N, Tk, Hkv, d), mask (Tq, Tk) or (N, Tq, Tk) bool, True = visible
    -> (N, Tq, H*d). GQA: head h uses kv head h // (H/Hkv)."""
    H, Hkv = q.shape[2], k.shape[2]
    if H != Hkv:
        k = k.repeat_interleave(H // Hkv, dim=2)
        v = v.repeat_interleave(H // Hkv, dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)       # (N, H, T, d)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])                   # (N, H, Tq, Tk)
    if mask.dim() == 3:
        mask = mask[:, None]
    s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, dim=-1) @ v                                          # (N, H, Tq, d)
    return a.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


class Block(nn.Module):
    """One Qwen3 block (the drafter's layers are the same block)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        e, H, Hkv, d = c.n_embd, c.n_head, c.n_head_kv, c.head_dim
        self.attn_norm = nn.Parameter(torch.ones(e))              # (n_embd,)
        self.wq = nn.Linear(e, H * d, bias=False)                 # (H*d, n_embd)
        self.wk = nn.Linear(e, Hkv * d, bias=False)               # (Hkv*d, n_embd)
        self.wv = nn.Linear(e, Hkv * d, bias=False)               # (Hkv*d, n_embd)
        self.wo = nn.Linear(H * d, e, bias=False)                 # (n_embd, H*d)
        self.q_norm = nn.Parameter(torch.ones(d))                 # (head_dim,)
        self.k_norm = nn.Parameter(torch.ones(d))                 # (head_dim,)
        self.ffn_norm = nn.Parameter(torch.ones(e))               # (n_embd,)
        self.w_gate = nn.Linear(e, c.n_ff, bias=False)            # (n_ff, n_embd)
        self.w_up = nn.Linear(e, c.n_ff, bias=False)              # (n_ff, n_embd)
        self.w_down = nn.Linear(c.n_ff, e, bias=False)            # (n_embd, n_ff)

    def qkv(self, h, cos, sin):
        """normed h (N, T, n_embd) -> q (N,T,H,d), k (N,T,Hkv,d), v (N,T,Hkv,d)."""
        c = self.c
        N, T, _ = h.shape
        q = rmsnorm(self.wq(h).view(N, T, c.n_head, c.head_dim), self.q_norm, c.eps)
        k = rmsnorm(self.wk(h).view(N, T, c.n_head_kv, c.head_dim), self.k_norm, c.eps)
        v = self.wv(h).view(N, T, c.n_head_kv, c.head_dim)
        return rope_neox(q, cos, sin), rope_neox(k, cos, sin), v

    def kv_from_feature(self, f, cos, sin):
        """Drafter K/V injection: fused feature f (N, T, n_embd), no attn_norm."""
        c = self.c
        N, T, _ = f.shape
        k = rmsnorm(self.wk(f).view(N, T, c.n_head_kv, c.head_dim), self.k_norm, c.eps)
        return rope_neox(k, cos, sin), self.wv(f).view(N, T, c.n_head_kv, c.head_dim)

    def finish(self, x, a):
        """x + Wo a, then the SwiGLU residual."""
        x = x + self.wo(a)
        h = rmsnorm(x, self.ffn_norm, self.c.eps)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Target(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Embedding(c.n_vocab, c.n_embd)         # (n_vocab, n_embd), tied head
        self.layers = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.output_norm = nn.Parameter(torch.ones(c.n_embd))     # (n_embd,)
        self.apply(self._init)
        for L in self.layers:
            nn.init.normal_(L.wo.weight, std=0.02 / math.sqrt(2 * c.n_layer))
            nn.init.normal_(L.w_down.weight, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def head(self, x):
        """final residual (.., n_embd) -> logits (.., n_vocab)."""
        return rmsnorm(x, self.output_norm, self.c.eps) @ self.tok_embd.weight.t()

    def forward(self, tokens, capture=(), start_pos=0, cache=None, logits=True):
        """tokens (N, T) at positions start_pos.. -> (logits (N, T, n_vocab) | None,
        {layer id: (N, T, n_embd)}). cache: list per layer of (K, V) (N, T_past, Hkv, d), appended to."""
        N, T = tokens.shape
        pos = torch.arange(start_pos, start_pos + T)
        cos, sin = rope_cos_sin(pos, self.c.head_dim, self.c.rope_base)
        x = self.tok_embd(tokens)                                  # (N, T, n_embd)
        T_past = 0 if cache is None or cache[0] is None else cache[0][0].shape[1]
        mask = torch.ones(T, T_past + T, dtype=torch.bool).tril(T_past)   # causal
        cap = {}
        for il, L in enumerate(self.layers):
            if il in capture:
                cap[il] = x
            h = rmsnorm(x, L.attn_norm, self.c.eps)
            q, k, v = L.qkv(h, cos, sin)
            if cache is not None:
                if cache[il] is not None:
                    k = torch.cat([cache[il][0], k], dim=1)
                    v = torch.cat([cache[il][1], v], dim=1)
                cache[il] = (k, v)
            x = L.finish(x, attend(q, k, v, mask))
        if self.c.n_layer in capture:
            cap[self.c.n_layer] = x
        return (self.head(x) if logits else None), cap


class Drafter(nn.Module):
    def __init__(self, c, target):
        super().__init__()
        self.c = c
        n_tl = len(c.target_layers)
        self.fc = nn.Linear(n_tl * c.n_embd, c.n_embd, bias=False)  # (n_embd, n_tl*n_embd)
        self.enc_norm = nn.Parameter(torch.ones(c.n_embd))          # (n_embd,)
        self.layers = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.output_norm = nn.Parameter(torch.ones(c.n_embd))       # (n_embd,)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        for L in self.layers:
            nn.init.normal_(L.wo.weight, std=0.02 / math.sqrt(2 * c.n_layer))
            nn.init.normal_(L.w_down.weight, std=0.02 / math.sqrt(2 * c.n_layer))
        self.target = [target]            # not a submodule: frozen, shared, not saved with the drafter

    def fuse(self, f_raw):
        """f_raw (N, T, n_tl*n_embd) -> (N, T, n_embd)."""
        return rmsnorm(self.fc(f_raw), self.enc_norm, self.c.eps)

    def hidden(self, f_raw, ctx_pos, block_tokens, block_pos, mask, block_len=None):
        """Training/eval forward with any number of blocks over one shared context.
        f_raw (N, Tc, n_tl*n_embd) at ctx_pos (Tc,); block_tokens (N, Tb) at block_pos (Tb,) or
        (N, Tb); mask (Tb, Tc + Tb) or (N, Tb, Tc + Tb) bool (True = visible); block_len: the
        length of each block in Tb (Tb if None; only DFlash2's block convolution reads it)
        -> the head's input h = rmsnorm(x) * output_norm (N, Tb, n_embd)."""
        tgt = self.target[0]
        f = self.fuse(f_raw)
        cc, cs = rope_cos_sin(ctx_pos, self.c.head_dim, self.c.rope_base)
        bc, bs = rope_cos_sin(block_pos, self.c.head_dim, self.c.rope_base)
        x = tgt.tok_embd(block_tokens)                               # (N, Tb, n_embd)
        for il, L in enumerate(self.layers):
            x = self.layer(il, L, x, f, (cc, cs), (bc, bs), mask, block_len or x.shape[1])
        return rmsnorm(x, self.output_norm, self.c.eps)

    def layer(self, il, L, x, f, ctx_rope, blk_rope, mask, block_len):
        kc, vc = L.kv_from_feature(f, *ctx_rope)
        h = rmsnorm(x, L.attn_norm, self.c.eps)
        q, k, v = L.qkv(h, *blk_rope)
        a = attend(q, torch.cat([kc, k], 1), torch.cat([vc, v], 1), mask)
        return L.finish(x, a)

    def head(self, h):
        return h @ self.target[0].tok_embd.weight.t()

    def forward(self, f_raw, ctx_pos, block_tokens, block_pos, mask, block_len=None):
        """-> block logits (N, Tb, n_vocab) (see hidden())."""
        return self.head(self.hidden(f_raw, ctx_pos, block_tokens, block_pos, mask, block_len))


class DSparkDrafter(Drafter):
    """DSpark = DFlash + a Markov head and a confidence head (llama.cpp src/models/dflash.cpp,
    build_dspark_markov_head; docs/drafter.md "DSpark"). Row j of a block drafted with previous
    token prev: e = markov_w1[prev] (R,), z = head(h) + markov_w2 e, conf = sigmoid(conf . [h; e] + b);
    at inference prev is the previous row's argmax z (the anchor token for the first drafted row)."""

    def __init__(self, c, target):
        super().__init__(c, target)
        R = c.markov_rank
        self.markov_w1 = nn.Embedding(c.n_vocab, R)                 # (n_vocab, R) = GGUF ne [R, n_vocab]
        self.markov_w2 = nn.Linear(R, c.n_vocab, bias=False)        # (n_vocab, R) = GGUF ne [R, n_vocab]
        self.conf = nn.Linear(c.n_embd + R, 1)                      # (1, n_embd+R) = ne [n_embd+R, 1]; bias (1,)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)                       # starts as the DFlash drafter
        nn.init.zeros_(self.conf.weight)
        nn.init.zeros_(self.conf.bias)

    def markov(self, logits, h, prev):
        """logits (.., n_vocab), h (.., n_embd), prev (..) ids -> (biased logits, confidence logit (..))."""
        e = self.markov_w1(prev)                                      # (.., R)
        z = logits + self.markov_w2(e)
        return z, self.conf(torch.cat([h, e], -1))[..., 0]


def dyn_conv(y, dyn, base, side, K, G, block_len):
    """DFlash2's per-token dynamic causal convolution along each block (docs/drafter.md "DFlash2").
    y (N, T, E), dyn (N, T, 2*K*G) (index g + G*(t + K*side)), base (2, K, E); T = blocks of block_len.
    out[i, c] = sum_{t <= i in block} (dyn[i, side, t, c // gs] + base[side, t, c]) * y[i - t, c]."""
    N, T, E = y.shape
    gs = E // G
    w = dyn.view(N, T, 2, K, G)[:, :, side].repeat_interleave(gs, dim=-1) + base[side]   # (N, T, K, E)
    yb = y.view(N, T // block_len, block_len, E)
    out = None
    for t in range(K):
        if t == 0:
            sh = yb
        elif t < block_len:
            sh = F.pad(yb, (0, 0, t, 0))[:, :, :block_len]
        else:
            continue
        term = w[:, :, t] * sh.reshape(N, T, E)
        out = term if out is None else out + term
    return out


class ConvPair(nn.Module):
    """One sub-block's dynamic convolution weights: base (2, K, E) = GGUF ne [E, K, 2] (F32),
    proj Linear E -> 2*K*G (weight (2KG, E) = ne [E, 2KG])."""

    def __init__(self, E, K, G):
        super().__init__()
        base = torch.zeros(2, K, E)
        base[:, 0, :] = 1.0                                          # identity: starts as DFlash
        self.base = nn.Parameter(base)
        self.proj = nn.Linear(E, 2 * K * G, bias=False)
        nn.init.zeros_(self.proj.weight)


class DFlash2Drafter(Drafter):
    """DFlash2 = DFlash + per-layer dynamic convolutions (attention and FFN, input and output side)
    + a top-k selector lattice (llama.cpp build_dflash2_conv / build_dflash2_selector and the walk
    in common/speculative.cpp; docs/drafter.md "DFlash2")."""

    def __init__(self, c, target):
        super().__init__(c, target)
        E, K, G, R = c.n_embd, c.conv_kernel_size, c.n_embd // c.conv_group_size, c.selector_rank
        self.attn_conv = nn.ModuleList([ConvPair(E, K, G) for _ in range(c.n_layer)])
        self.ffn_conv = nn.ModuleList([ConvPair(E, K, G) for _ in range(c.n_layer)])
        self.sel_prev = nn.Embedding(c.n_vocab, R)                   # (n_vocab, R) = ne [R, n_vocab]
        self.sel_next = nn.Embedding(c.n_vocab, R)                   # (n_vocab, R) = ne [R, n_vocab]
        self.sel_hidden = nn.Linear(E, R, bias=False)                # (R, E) = ne [E, R]
        nn.init.normal_(self.sel_prev.weight, std=0.3)
        nn.init.normal_(self.sel_next.weight, std=0.3)
        nn.init.zeros_(self.sel_hidden.weight)                       # starts as argmax of the logits

    def layer(self, il, L, x, f, ctx_rope, blk_rope, mask, block_len):
        c = self.c
        K, G = c.conv_kernel_size, c.n_embd // c.conv_group_size
        ac, fc = self.attn_conv[il], self.ffn_conv[il]
        kc, vc = L.kv_from_feature(f, *ctx_rope)
        h = rmsnorm(x, L.attn_norm, c.eps)
        d = ac.proj(h)
        q, k, v = L.qkv(dyn_conv(h, d, ac.base, 0, K, G, block_len), *blk_rope)
        a = attend(q, torch.cat([kc, k], 1), torch.cat([vc, v], 1), mask)
        x = x + dyn_conv(L.wo(a), d, ac.base, 1, K, G, block_len)
        h = rmsnorm(x, L.ffn_norm, c.eps)
        d = fc.proj(h)
        hc = dyn_conv(h, d, fc.base, 0, K, G, block_len)
        y = L.w_down(F.silu(L.w_gate(hc)) * L.w_up(hc))
        return x + dyn_conv(y, d, fc.base, 1, K, G, block_len)

    def selector(self, logits, h, prev):
        """logits (.., n_vocab), h (.., n_embd), prev (..) predecessor ids -> (cand (.., k) ids,
        scores (.., k)): score_s = logits[cand_s] + sum_r next[cand_s, r] prev_emb[r] gate[r]."""
        k = self.c.selector_top_k
        cand = logits.topk(k, dim=-1).indices
        u = logits.gather(-1, cand)
        cond = self.sel_prev(prev) * self.sel_hidden(h)               # (.., R)
        return cand, u + (self.sel_next(cand) * cond.unsqueeze(-2)).sum(-1)


def make_drafter(c, target):
    return {"dflash": Drafter, "dspark": DSparkDrafter, "dflash2": DFlash2Drafter}[c.family](c, target)


def n_params(m):
    return sum(p.numel() for p in m.parameters())
