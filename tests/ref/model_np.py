"""model_np.py: independent numpy reference of the dflash forward passes (testing layer 2).

Written from docs/target.md and docs/drafter.md only (not from the C code). Computes in float64 by default
(`dtype=np.float32` is accepted for speed); weights are dequantized to float32 by gguf_np /
quant_np and then widened, so quantized files are compared on identical weight values.

  Target (arch qwen3 | llama):
    t = Target("target.gguf")
    cache = t.new_cache()
    r = t.forward(tokens, positions, cache, capture=[1, 3], logits="all")
    r.logits            # (n_tokens, n_vocab)   ("last": (1, n_vocab))
    r.captured[1]       # (n_tokens, n_embd)    residual stream entering layer 1
    t.greedy(prompt, n) # n generated ids, plain greedy with the KV cache

  Drafter (arch dflash):
    d = Drafter("drafter.gguf", t)
    dc = d.new_cache()
    d.add_context(dc, f_raw, positions)          # f_raw (n, n_target_layers*n_embd): steps 2-3
    toks, logits = d.draft(dc, last, start, B)   # (B-1,), (B-1, n_vocab): steps 4-5
    spec_generate(t, d, prompt, n, B)            # greedy speculative loop -> SpecResult

Conventions: a weight with GGUF ne=[n_in, n_out] is a numpy (n_out, n_in) array, y = x @ W.T.
Activations are (n_tokens, ...) row-major. RoPE: NEOX (pairs (i, i+n_rot/2)) for qwen3 and the
drafter; llama uses llama.cpp's NORM mode (adjacent pairs (2i, 2i+1)) by default, because real
llama GGUFs are converted for it (Target(rope_mode=...) overrides).
"""

import numpy as np

from gguf_np import GGUF, GGUFError, INT_TYPES, T_F32, T_F64

ROPE_NEOX = "neox"
ROPE_NORM = "norm"


class ModelError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# ops
# ---------------------------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """x (..., n) -> x / sqrt(mean(x^2) + eps) * w; w (n,) or None."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_angles(pos, n_rot, freq_base, freq_scale=1.0, freq_factors=None):
    """pos (n,) -> angles (n, n_rot/2): theta_i = pos * freq_scale * base^(-2i/n_rot) / ff_i."""
    i = np.arange(n_rot // 2, dtype=np.float64)
    inv = np.power(float(freq_base), -2.0 * i / n_rot)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
    return np.asarray(pos, dtype=np.float64)[:, None] * freq_scale * inv[None, :]


def rope(x, pos, n_rot, freq_base, mode=ROPE_NEOX, freq_scale=1.0, freq_factors=None):
    """x (n, n_head, head_dim), pos (n,) -> rotated copy. Only the first n_rot dims rotate.
    NEOX: pair (i, i + n_rot/2); NORM: pair (2i, 2i+1). (x1, x2) -> (x1 c - x2 s, x1 s + x2 c)."""
    ang = rope_angles(pos, n_rot, freq_base, freq_scale, freq_factors)[:, None, :]  # (n, 1, n_rot/2)
    c, s = np.cos(ang).astype(x.dtype), np.sin(ang).astype(x.dtype)
    out = x.copy()
    half = n_rot // 2
    if mode == ROPE_NEOX:
        i1, i2 = slice(0, half), slice(half, n_rot)
    elif mode == ROPE_NORM:
        i1, i2 = slice(0, n_rot, 2), slice(1, n_rot, 2)
    else:
        raise ModelError("unknown rope mode %r" % mode)
    x1, x2 = x[..., i1], x[..., i2]
    out[..., i1] = x1 * c - x2 * s
    out[..., i2] = x1 * s + x2 * c
    return out


def attention(q, k, v, mask):
    """q (n_q, n_head, d), k (n_k, n_head_kv, d), v (n_k, n_head_kv, dv), mask (n_q, n_k) bool
    (True = visible) or None -> (n_q, n_head, dv). GQA: head h uses kv head h // (n_head/n_head_kv).
    Scale 1/sqrt(d)."""
    n_head, n_head_kv = q.shape[1], k.shape[1]
    if n_head % n_head_kv:
        raise ModelError("n_head %d is not a multiple of n_head_kv %d" % (n_head, n_head_kv))
    g = n_head // n_head_kv
    if g > 1:
        k = np.repeat(k, g, axis=1)                                # (n_k, n_head, d)
        v = np.repeat(v, g, axis=1)                                # (n_k, n_head, dv)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])    # (n_head, n_q, n_k)
    if mask is not None:
        if not mask.any(axis=1).all():
            raise ModelError("a query sees no key (empty attention row)")
        s = np.where(mask[None, :, :], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v)                       # (n_q, n_head, dv)


# ---------------------------------------------------------------------------------------------
# KV cache (one sequence): cells appended in batch order, each with its position
# ---------------------------------------------------------------------------------------------

class KVCache:
    def __init__(self, n_layer, n_head_kv, dk, dv, dtype=np.float64, kv_f16=False):
        """kv_f16: K and V are rounded to float16 as they are stored (the f16 cache of dflash and
        llama.cpp by default); attention then reads the rounded values, also for the batch itself."""
        self.n_layer, self.n_head_kv, self.dk, self.dv, self.dtype = n_layer, n_head_kv, dk, dv, dtype
        self.kv_f16 = kv_f16
        self.n = 0
        self.pos = np.zeros(0, dtype=np.int64)                                     # (cap,)
        self.k = [np.zeros((0, n_head_kv, dk), dtype) for _ in range(n_layer)]      # (cap, n_head_kv, dk)
        self.v = [np.zeros((0, n_head_kv, dv), dtype) for _ in range(n_layer)]      # (cap, n_head_kv, dv)

    def alloc(self, positions):
        """Reserve cells for a batch at `positions`; returns the slice of the new cells."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(np.unique(positions)) != len(positions):
            raise ModelError("batch has duplicate positions")
        if np.isin(positions, self.pos[:self.n]).any():
            raise ModelError("position already in the KV cache: %s"
                             % positions[np.isin(positions, self.pos[:self.n])].tolist())
        m = len(positions)
        if self.n + m > len(self.pos):
            cap = max(16, 2 * (self.n + m))
            self.pos = np.resize(self.pos, cap)
            for l in range(self.n_layer):
                self.k[l] = np.concatenate([self.k[l][:self.n], np.zeros((cap - self.n, self.n_head_kv, self.dk), self.dtype)])
                self.v[l] = np.concatenate([self.v[l][:self.n], np.zeros((cap - self.n, self.n_head_kv, self.dv), self.dtype)])
        sl = slice(self.n, self.n + m)
        self.pos[sl] = positions
        self.n += m
        return sl

    def store(self, layer, sl, k, v):
        if self.kv_f16:
            k = np.asarray(k).astype(np.float16)
            v = np.asarray(v).astype(np.float16)
        self.k[layer][sl] = k
        self.v[layer][sl] = v

    def view(self, layer):
        """(K (n, n_head_kv, dk), V (n, n_head_kv, dv), pos (n,)) of the filled cells."""
        return self.k[layer][:self.n], self.v[layer][:self.n], self.pos[:self.n]

    def remove_from(self, p):
        """Drop every cell at position >= p (rollback)."""
        keep = np.nonzero(self.pos[:self.n] < p)[0]
        m = len(keep)
        self.pos[:m] = self.pos[keep]
        for l in range(self.n_layer):
            self.k[l][:m] = self.k[l][keep]
            self.v[l][:m] = self.v[l][keep]
        self.n = m

    def positions(self):
        return self.pos[:self.n].copy()

    def next_pos(self):
        return int(self.pos[:self.n].max()) + 1 if self.n else 0


# ---------------------------------------------------------------------------------------------
# hyperparameters and weights
# ---------------------------------------------------------------------------------------------

def _kv_int(g, key, default=None, required=True):
    if key not in g.kv:
        if default is None and required:
            raise ModelError("%s: missing key '%s'" % (g.path, key))
        return default
    v, t = g.kv[key], g.kv_type[key]
    if t == 9 and isinstance(v, list) and v and all(isinstance(x, int) for x in v):
        if len(set(v)) != 1:  # per-layer arrays: the reference handles uniform ones only
            raise ModelError("%s: per-layer '%s' = %s is not supported by the reference" % (g.path, key, v))
        return v[0]
    if t not in INT_TYPES:
        raise ModelError("%s: key '%s' has type %d, expected an integer" % (g.path, key, t))
    return int(v)


def _kv_float(g, key, default=None):
    if key not in g.kv:
        if default is None:
            raise ModelError("%s: missing key '%s'" % (g.path, key))
        return default
    v, t = g.kv[key], g.kv_type[key]
    if t not in (T_F32, T_F64) and t not in INT_TYPES:
        raise ModelError("%s: key '%s' has type %d, expected a number" % (g.path, key, t))
    return float(v)


class HParams:
    """The block hparams under `<arch>.`."""

    def __init__(self, g, arch):
        p = arch + "."
        self.arch = arch
        self.n_layer = _kv_int(g, p + "block_count")
        self.n_embd = _kv_int(g, p + "embedding_length")
        self.n_ff = _kv_int(g, p + "feed_forward_length")
        self.n_head = _kv_int(g, p + "attention.head_count")
        self.n_head_kv = _kv_int(g, p + "attention.head_count_kv", self.n_head)
        if self.n_head <= 0 or self.n_head_kv <= 0 or self.n_head % self.n_head_kv:
            raise ModelError("%s: head_count %d / head_count_kv %d invalid" % (g.path, self.n_head, self.n_head_kv))
        self.head_dim = _kv_int(g, p + "attention.key_length", self.n_embd // self.n_head)
        self.head_dim_v = _kv_int(g, p + "attention.value_length", self.head_dim)
        self.eps = _kv_float(g, p + "attention.layer_norm_rms_epsilon")
        self.freq_base = _kv_float(g, p + "rope.freq_base", 10000.0)
        self.n_rot = _kv_int(g, p + "rope.dimension_count", self.head_dim)
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise ModelError("%s: rope.dimension_count %d invalid for head_dim %d" % (g.path, self.n_rot, self.head_dim))
        self.n_ctx_train = _kv_int(g, p + "context_length", 0, required=False)
        self.freq_scale = 1.0
        stype = g.kv.get(p + "rope.scaling.type", "none")
        if stype == "linear":
            self.freq_scale = 1.0 / _kv_float(g, p + "rope.scaling.factor")
        elif stype not in ("none", ""):
            raise ModelError("%s: rope.scaling.type '%s' is not supported by the reference" % (g.path, stype))
        secs = g.kv.get(p + "rope.dimension_sections")
        if secs is not None and (len(secs) < 4 or secs[3] != 0):
            # text M-RoPE positions are [p, p, p, 0]: with section 3 empty they equal plain RoPE
            raise ModelError("%s: M-RoPE with a non-empty 4th section is not supported by the reference" % g.path)
        for k in ("n_layer", "n_embd", "n_ff", "head_dim", "head_dim_v"):
            if getattr(self, k) <= 0:
                raise ModelError("%s: %s must be positive" % (g.path, k))


class Layer:
    pass


def _load_w(g, name, shape, dtype, required=True):
    if not g.has(name):
        if required:
            raise ModelError("%s: missing tensor '%s'" % (g.path, name))
        return None
    w = g.tensor(name)
    if tuple(w.shape) != tuple(shape):
        raise ModelError("%s: tensor '%s' has numpy shape %s (ne %s), expected %s"
                         % (g.path, name, w.shape, g.tensors[name].ne, tuple(shape)))
    w = w.astype(dtype)
    # matrices are used as x @ W.T: keep W in Fortran order so W.T is C-contiguous for BLAS
    return np.asfortranarray(w) if w.ndim == 2 else w


def _load_block(g, hp, i, dtype, qk_norm):
    """One transformer block's weights, numpy (n_out, n_in)."""
    b = "blk.%d." % i
    e, H, Hkv, d, dv, ff = hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.head_dim_v, hp.n_ff
    L = Layer()
    L.attn_norm = _load_w(g, b + "attn_norm.weight", (e,), dtype)            # (n_embd,)
    L.wq = _load_w(g, b + "attn_q.weight", (H * d, e), dtype)                # (n_head*hd, n_embd)
    L.wk = _load_w(g, b + "attn_k.weight", (Hkv * d, e), dtype)              # (n_head_kv*hd, n_embd)
    L.wv = _load_w(g, b + "attn_v.weight", (Hkv * dv, e), dtype)             # (n_head_kv*hdv, n_embd)
    L.wo = _load_w(g, b + "attn_output.weight", (e, H * dv), dtype)          # (n_embd, n_head*hdv)
    L.q_norm = _load_w(g, b + "attn_q_norm.weight", (d,), dtype, qk_norm)    # (hd,)
    L.k_norm = _load_w(g, b + "attn_k_norm.weight", (d,), dtype, qk_norm)    # (hd,)
    if not qk_norm:
        L.q_norm = L.k_norm = None
    L.ffn_norm = _load_w(g, b + "ffn_norm.weight", (e,), dtype)              # (n_embd,)
    L.w_gate = _load_w(g, b + "ffn_gate.weight", (ff, e), dtype)             # (n_ff, n_embd)
    L.w_up = _load_w(g, b + "ffn_up.weight", (ff, e), dtype)                 # (n_ff, n_embd)
    L.w_down = _load_w(g, b + "ffn_down.weight", (e, ff), dtype)             # (n_embd, n_ff)
    return L


def _qkv(L, hp, h, pos, rope_mode, freq_factors=None):
    """Block attention inputs from normed hidden h (n, n_embd) -> q (n,H,d), k (n,Hkv,d), v (n,Hkv,dv)."""
    n = h.shape[0]
    q = (h @ L.wq.T).reshape(n, hp.n_head, hp.head_dim)
    k = (h @ L.wk.T).reshape(n, hp.n_head_kv, hp.head_dim)
    v = (h @ L.wv.T).reshape(n, hp.n_head_kv, hp.head_dim_v)
    if L.q_norm is not None:
        q = rmsnorm(q, L.q_norm, hp.eps)      # per head, over head_dim
        k = rmsnorm(k, L.k_norm, hp.eps)
    q = rope(q, pos, hp.n_rot, hp.freq_base, rope_mode, hp.freq_scale, freq_factors)
    k = rope(k, pos, hp.n_rot, hp.freq_base, rope_mode, hp.freq_scale, freq_factors)
    return q, k, v


def _attn_out_ffn(L, hp, x, a):
    """x (n, n_embd) + Wo a, then the SwiGLU FFN residual."""
    n = x.shape[0]
    x = x + a.reshape(n, hp.n_head * hp.head_dim_v) @ L.wo.T
    h = rmsnorm(x, L.ffn_norm, hp.eps)
    return x + (silu(h @ L.w_gate.T) * (h @ L.w_up.T)) @ L.w_down.T


class ForwardResult:
    def __init__(self, logits, captured, positions):
        self.logits = logits        # (n_out, n_vocab) or None
        self.captured = captured    # {layer id: (n_tokens, n_embd)}
        self.positions = positions  # (n_tokens,)


# ---------------------------------------------------------------------------------------------
# target
# ---------------------------------------------------------------------------------------------

class Target:
    ARCHS = {"qwen3": (True, ROPE_NEOX), "llama": (False, ROPE_NORM)}

    def __init__(self, path, dtype=np.float64, rope_mode=None, kv_f16=False):
        """rope_mode: None = by arch as llama.cpp does (qwen3 NEOX, llama NORM), or force
        ROPE_NEOX / ROPE_NORM. kv_f16: the KV cache keeps float16 values (KVCache)."""
        g = self.g = GGUF(path)
        self.dtype = dtype
        self.kv_f16 = kv_f16
        arch = g.kv.get("general.architecture")
        if arch not in self.ARCHS:
            raise ModelError("%s: general.architecture %r is not a target arch (qwen3, llama)" % (path, arch))
        self.arch = arch
        qk_norm, self.rope_mode = self.ARCHS[arch]
        if rope_mode is not None:
            if rope_mode not in (ROPE_NEOX, ROPE_NORM):
                raise ModelError("rope mode %r: expected %r or %r" % (rope_mode, ROPE_NEOX, ROPE_NORM))
            self.rope_mode = rope_mode
        hp = self.hp = HParams(g, arch)
        if not g.has("token_embd.weight"):
            raise ModelError("%s: missing tensor 'token_embd.weight'" % path)
        te = g.tensors["token_embd.weight"]
        if len(te.ne) != 2 or te.ne[0] != hp.n_embd:
            raise ModelError("%s: token_embd.weight ne %s, expected [%d, n_vocab]" % (path, te.ne, hp.n_embd))
        self.n_vocab = te.ne[1]
        self.tok_embd = _load_w(g, "token_embd.weight", (self.n_vocab, hp.n_embd), dtype)   # (n_vocab, n_embd)
        self.output_norm = _load_w(g, "output_norm.weight", (hp.n_embd,), dtype)             # (n_embd,)
        self.output = _load_w(g, "output.weight", (self.n_vocab, hp.n_embd), dtype, False)   # (n_vocab, n_embd)
        self.tied = self.output is None
        if self.tied:
            self.output = self.tok_embd
        self.freq_factors = None
        if g.has("rope_freqs.weight"):
            self.freq_factors = _load_w(g, "rope_freqs.weight", (hp.n_rot // 2,), np.float64)
        self.layers = [_load_block(g, hp, i, dtype, qk_norm) for i in range(hp.n_layer)]

    @property
    def n_layer(self):
        return self.hp.n_layer

    @property
    def n_embd(self):
        return self.hp.n_embd

    def new_cache(self):
        hp = self.hp
        return KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, hp.head_dim_v, self.dtype, self.kv_f16)

    def embed(self, tokens):
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ModelError("need a non-empty 1-D token list")
        bad = tokens[(tokens < 0) | (tokens >= self.n_vocab)]
        if len(bad):
            raise ModelError("token id %d out of range [0, %d)" % (bad[0], self.n_vocab))
        return self.tok_embd[tokens]                                              # (n, n_embd)

    def head(self, x):
        """Output head on already-normed x (n, n_embd) -> logits (n, n_vocab)."""
        return x @ self.output.T

    def forward(self, tokens, positions=None, cache=None, capture=(), logits="last", embeddings=None):
        """Evaluate a batch. positions default to cache.next_pos() + arange(n). The batch's K/V are
        added to the cache (a fresh one if None); attention is causal by position (a query at p
        sees every cached cell at position <= p). capture: layer-input ids 0..n_layer."""
        hp = self.hp
        x = self.embed(tokens) if embeddings is None else np.asarray(embeddings, self.dtype)  # (n, n_embd)
        n = x.shape[0]
        if cache is None:
            cache = self.new_cache()
        if positions is None:
            positions = cache.next_pos() + np.arange(n)
        positions = np.asarray(positions, dtype=np.int64)
        if positions.shape != (n,):
            raise ModelError("%d positions for %d tokens" % (len(positions), n))
        if (positions < 0).any():
            raise ModelError("negative position")
        capture = list(capture)
        for c in capture:
            if not 0 <= c <= hp.n_layer:
                raise ModelError("capture id %d out of range [0, %d]" % (c, hp.n_layer))
        captured = {}
        sl = cache.alloc(positions)
        for il, L in enumerate(self.layers):
            if il in capture:
                captured[il] = x.copy()
            h = rmsnorm(x, L.attn_norm, hp.eps)                                   # (n, n_embd)
            q, k, v = _qkv(L, hp, h, positions, self.rope_mode, self.freq_factors)
            cache.store(il, sl, k, v)
            K, V, kpos = cache.view(il)                                           # (n_kv, Hkv, d)
            mask = kpos[None, :] <= positions[:, None]                            # (n, n_kv) causal
            a = attention(q, K, V, mask)                                          # (n, H, dv)
            x = _attn_out_ffn(L, hp, x, a)
        if hp.n_layer in capture:
            captured[hp.n_layer] = x.copy()
        out = None
        if logits == "all":
            out = self.head(rmsnorm(x, self.output_norm, hp.eps))                 # (n, n_vocab)
        elif logits == "last":
            out = self.head(rmsnorm(x[-1:], self.output_norm, hp.eps))            # (1, n_vocab)
        elif logits is not None:
            raise ModelError("logits must be 'all', 'last' or None")
        return ForwardResult(out, captured, positions)

    def greedy(self, prompt, n_gen, cache=None):
        """Plain greedy decoding: prefill the prompt, then one token at a time. -> list of n_gen ids."""
        cache = self.new_cache() if cache is None else cache
        out = []
        if n_gen <= 0:
            return out
        r = self.forward(prompt, None, cache, logits="last")
        tok = int(np.argmax(r.logits[-1]))
        out.append(tok)
        while len(out) < n_gen:
            r = self.forward([tok], None, cache, logits="last")
            tok = int(np.argmax(r.logits[-1]))
            out.append(tok)
        return out


# ---------------------------------------------------------------------------------------------
# DFlash drafter
# ---------------------------------------------------------------------------------------------

class Drafter:
    def __init__(self, path, target, dtype=np.float64):
        g = self.g = GGUF(path)
        self.dtype = dtype
        self.target = target
        arch = g.kv.get("general.architecture")
        if arch != "dflash":
            raise ModelError("%s: general.architecture %r, expected 'dflash'" % (path, arch))
        hp = self.hp = HParams(g, "dflash")
        self.block_size = _kv_int(g, "dflash.block_size", 16)
        if self.block_size < 2:
            raise ModelError("%s: dflash.block_size %d must be >= 2" % (path, self.block_size))
        tl = g.kv.get("dflash.target_layers")
        if tl is None:
            raise ModelError("%s: missing key 'dflash.target_layers'" % path)
        if not isinstance(tl, list) or not tl or not all(isinstance(x, int) for x in tl):
            raise ModelError("%s: dflash.target_layers must be a non-empty integer array" % path)
        for x in tl:
            if not 0 <= x <= target.n_layer:
                raise ModelError("%s: dflash.target_layers id %d out of range [0, %d] of the target"
                                 % (path, x, target.n_layer))
        self.target_layers = tl
        if "tokenizer.ggml.mask_token_id" not in g.kv:
            raise ModelError("%s: missing key 'tokenizer.ggml.mask_token_id'" % path)
        self.mask_token_id = _kv_int(g, "tokenizer.ggml.mask_token_id")
        self.causal = bool(g.kv.get("dflash.attention.causal", False))
        # drafter options (docs/drafter.md, "Drafter options"): sliding-window layers (a per-layer
        # bool pattern), embedding scale; sample_from_anchor is read by the DSpark reference
        self.sample_from_anchor = bool(g.kv.get("dflash.sample_from_anchor", True))
        self.n_swa = _kv_int(g, "dflash.attention.sliding_window", 0)
        self.swa_layers = [False] * hp.n_layer
        if self.n_swa > 0:
            pat = g.kv.get("dflash.attention.sliding_window_pattern")
            if not isinstance(pat, list) or len(pat) != hp.n_layer:
                raise ModelError("%s: dflash.attention.sliding_window_pattern must list one bool per layer" % path)
            self.swa_layers = [bool(x) for x in pat]
        self.logit_scale = _kv_float(g, "dflash.logit_scale", 1.0)
        self.softcap = _kv_float(g, "dflash.final_logit_softcapping", 0.0)
        self.embedding_scale = _kv_float(g, "dflash.embedding_scale", 0.0) or 1.0

        e = hp.n_embd
        n_fin = len(tl) * target.n_embd
        self.fc = _load_w(g, "fc.weight", (e, n_fin), dtype)                           # (n_embd, n_tl*n_embd_t)
        self.enc_norm = _load_w(g, "enc.output_norm.weight", (e,), dtype)              # (n_embd,)
        self.output_norm = _load_w(g, "output_norm.weight", (e,), dtype)               # (n_embd,)
        # token_embd / output: the drafter's own if present, else the target's
        if g.has("token_embd.weight"):
            nv = g.tensors["token_embd.weight"].ne[-1]
            self.tok_embd = _load_w(g, "token_embd.weight", (nv, e), dtype)            # (n_vocab, n_embd)
        else:
            if target.n_embd != e:
                raise ModelError("%s: drafter n_embd %d != target n_embd %d (shared token_embd)" % (path, e, target.n_embd))
            self.tok_embd = target.tok_embd
        if g.has("output.weight"):
            nv = g.tensors["output.weight"].ne[-1]
            self.output = _load_w(g, "output.weight", (nv, e), dtype)                  # (n_vocab, n_embd)
        else:
            if target.n_embd != e:
                raise ModelError("%s: drafter n_embd %d != target n_embd %d (shared output head)" % (path, e, target.n_embd))
            self.output = target.output
        if not 0 <= self.mask_token_id < self.tok_embd.shape[0]:
            raise ModelError("%s: mask_token_id %d out of range [0, %d)" % (path, self.mask_token_id, self.tok_embd.shape[0]))
        self.layers = [_load_block(g, hp, i, dtype, True) for i in range(hp.n_layer)]

    def new_cache(self):
        hp = self.hp
        return KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, hp.head_dim_v, self.dtype)

    def features(self, captured):
        """{layer id: (n, n_embd_t)} -> f_raw (n, n_tl*n_embd_t) in target_layers order."""
        return np.concatenate([captured[L] for L in self.target_layers], axis=1)

    def fuse(self, f_raw):
        """Step 2: f = rmsnorm(fc f_raw) * enc.output_norm. (n, n_tl*n_embd_t) -> (n, n_embd)."""
        f_raw = np.asarray(f_raw, dtype=self.dtype)
        if f_raw.ndim != 2 or f_raw.shape[1] != self.fc.shape[1]:
            raise ModelError("features have shape %s, expected (n, %d)" % (f_raw.shape, self.fc.shape[1]))
        return rmsnorm(f_raw @ self.fc.T, self.enc_norm, self.hp.eps)

    def add_context(self, cache, f_raw, positions):
        """Steps 2-3: K/V injection of the fused features at `positions` into every draft layer.
        K = rope(rmsnorm_per_head(Wk f) * k_norm, p), V = Wv f (no attn_norm on f)."""
        hp = self.hp
        positions = np.asarray(positions, dtype=np.int64)
        f = self.fuse(f_raw)                                                          # (n, n_embd)
        n = f.shape[0]
        if positions.shape != (n,):
            raise ModelError("%d positions for %d feature rows" % (len(positions), n))
        sl = cache.alloc(positions)
        for j, L in enumerate(self.layers):
            k = rmsnorm((f @ L.wk.T).reshape(n, hp.n_head_kv, hp.head_dim), L.k_norm, hp.eps)
            k = rope(k, positions, hp.n_rot, hp.freq_base, ROPE_NEOX, hp.freq_scale)
            v = (f @ L.wv.T).reshape(n, hp.n_head_kv, hp.head_dim_v)
            cache.store(j, sl, k, v)

    def forward_block(self, cache, block_tokens, start):
        """Steps 4-5: run the block at positions start.. non-causally over context (< start) + the
        block. Returns logits (B, n_vocab) for every slot (slot 0 included; callers drop it)."""
        return self.head(self.forward_hidden(cache, block_tokens, start))

    def head(self, h, bias=None):
        """logits = softcap(logit_scale * (output h + bias)) for normed rows h (n, n_embd)."""
        logits = h @ self.output.T                                                   # (n, n_vocab)
        if bias is not None:
            logits = logits + bias
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.softcap > 0:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits

    def forward_hidden(self, cache, block_tokens, start):
        """The block's rows after the last layer and output_norm (B, n_embd): the head's input."""
        hp = self.hp
        toks = np.asarray(block_tokens, dtype=np.int64)
        B = len(toks)
        if B < 1 or (toks < 0).any() or (toks >= self.tok_embd.shape[0]).any():
            raise ModelError("bad block tokens %s" % toks.tolist())
        pos = start + np.arange(B)
        x = self.tok_embd[toks] * self.embedding_scale                               # (B, n_embd)
        for j, L in enumerate(self.layers):
            h = rmsnorm(x, L.attn_norm, hp.eps)
            q, k, v = _qkv(L, hp, h, pos, ROPE_NEOX)                                # block q/k/v
            Kc, Vc, cpos = cache.view(j)
            ctx = cpos < start
            K = np.concatenate([Kc[ctx], k])                                         # (n_ctx + B, Hkv, d)
            V = np.concatenate([Vc[ctx], v])
            mask = None
            n_ctx = int(ctx.sum())
            if self.causal:
                mask = np.ones((B, n_ctx + B), dtype=bool)
                mask[:, n_ctx:] = np.tril(np.ones((B, B), dtype=bool))
            if self.swa_layers[j]:
                # a key at position p0 is hidden from a query at p1 when p1 - p0 >= n_swa
                kpos = np.concatenate([cpos[ctx], pos])
                win = (pos[:, None] - kpos[None, :]) < self.n_swa
                mask = win if mask is None else (mask & win)
            a = attention(q, K, V, mask)                                             # (B, H, dv)
            x = _attn_out_ffn(L, hp, x, a)
        return rmsnorm(x, self.output_norm, hp.eps)                                  # (B, n_embd)

    def draft(self, cache, last, start, block_size=None):
        """[last, MASK x (B-1)] at start.. -> (draft ids (B-1,), logits (B-1, n_vocab)). The block's
        K/V never enter the cache (step 6)."""
        B = self.block_size if block_size is None else block_size
        if B < 2:
            raise ModelError("block size %d must be >= 2" % B)
        logits = self.forward_block(cache, [last] + [self.mask_token_id] * (B - 1), start)[1:]
        return np.argmax(logits, axis=-1).astype(np.int64), logits


# ---------------------------------------------------------------------------------------------
# greedy speculative loop (docs/drafter.md, "Verification (greedy)")
# ---------------------------------------------------------------------------------------------

class SpecResult:
    def __init__(self, tokens, accepted, drafts):
        self.tokens = tokens        # generated ids (n_gen)
        self.accepted = accepted    # per step: a = number of accepted draft tokens (0..B-1)
        self.drafts = drafts        # per step: the B-1 drafted ids

    @property
    def tau(self):
        """mean over steps of (a + 1); None if no step ran."""
        return float(np.mean([a + 1 for a in self.accepted])) if self.accepted else None


def spec_generate(target, drafter, prompt, n_gen, block_size=None, draft_fn=None):
    """Greedy speculative decoding. draft_fn(dcache, last, start, B) -> draft ids overrides the
    drafter (tests use it to force acceptances). Returns SpecResult."""
    B = drafter.block_size if block_size is None else block_size
    if B < 2:
        raise ModelError("block size %d must be >= 2" % B)
    tl = drafter.target_layers
    tcache, dcache = target.new_cache(), drafter.new_cache()
    res = SpecResult([], [], [])
    if n_gen <= 0:
        return res
    n = len(prompt)
    r = target.forward(prompt, np.arange(n), tcache, capture=tl, logits="last")   # prefill
    drafter.add_context(dcache, drafter.features(r.captured), np.arange(n))
    last = int(np.argmax(r.logits[-1]))
    res.tokens.append(last)
    start = n                                       # `last` is committed but not in the target cache
    while len(res.tokens) < n_gen:
        if draft_fn is None:
            d, _ = drafter.draft(dcache, last, start, B)
        else:
            d = np.asarray(draft_fn(dcache, last, start, B), dtype=np.int64)
        res.drafts.append([int(t) for t in d])
        block = [last] + [int(t) for t in d]
        r = target.forward(block, start + np.arange(B), tcache, capture=tl, logits="all")
        am = np.argmax(r.logits, axis=-1)             # (B,) target greedy after each slot
        a = 0
        while a < B - 1 and d[a] == am[a]:
            a += 1
        res.accepted.append(a)
        res.tokens.extend(int(t) for t in d[:a])
        res.tokens.append(int(am[a]))                 # bonus
        tcache.remove_from(start + a + 1)             # drop rejected drafts (bonus not in cache)
        feats = drafter.features(r.captured)[:a + 1]  # positions start .. start+a
        drafter.add_context(dcache, feats, start + np.arange(a + 1))
        last = int(am[a])
        start += a + 1
    res.tokens = res.tokens[:n_gen]
    return res
