"""test_ref.py: self-tests of the numpy reference (gguf_np, model_np, ref_cli).

Run: /usr/bin/python3 tests/ref/test_ref.py [-v] [TestClass.test_name]

Test models: if build/dflash (or $DFLASH_CLI) exists and has `make-test-model`, the tests also run on the files
it writes; they always run on files from the small GGUF writer below (tests only: F32/F16/BF16
tensors, every KV type) so the reference is testable on its own.
"""

import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(os.path.dirname(HERE))

import gguf_np  # noqa: E402
import quant_np  # noqa: E402
import model_np as M  # noqa: E402
from gguf_np import GGUF, GGUFError  # noqa: E402

PY = "/usr/bin/python3"
_TMP = tempfile.mkdtemp(prefix="dflash_ref_")
atexit.register(shutil.rmtree, _TMP, True)


def tmpdir():
    """A fresh directory under this run's temp root (removed at exit)."""
    return tempfile.mkdtemp(dir=_TMP)

CLI = os.path.join(HERE, "ref_cli.py")

# ---------------------------------------------------------------------------------------------
# minimal GGUF writer (tests only)
# ---------------------------------------------------------------------------------------------

_CODES = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


def _w_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _w_val(t, v):
    if t in _CODES:
        return struct.pack(_CODES[t], v)
    if t == 8:
        return _w_str(v)
    if t == 9:  # v = (elem_type, [elements])
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(_w_val(et, x) for x in items)
    raise ValueError(t)


def write_gguf(path, kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, numpy array (numpy order), ggml type)], the
    data encoded by quant_np.quantize (F32, F16, BF16, Q8_0, Q4_0)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += _w_str(k) + struct.pack("<I", t) + _w_val(t, v)
    blobs, off = [], 0
    for name, arr, gt in tensors:
        a = np.ascontiguousarray(arr, dtype=np.float32)
        raw = quant_np.quantize(gt, a.reshape(-1))
        ne = list(reversed(a.shape))
        out += _w_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", gt, off)
        blobs.append((off, raw))
        off += (len(raw) + alignment - 1) // alignment * alignment
    out += b"\0" * ((-len(out)) % alignment)
    data_start = len(out)
    for o, raw in blobs:
        out += b"\0" * (data_start + o - len(out)) + raw
    with open(path, "wb") as f:
        f.write(out)


def _block_tensors(rng, prefix, n_embd, n_head, n_head_kv, hd, n_ff, qk_norm, scale=0.3):
    def w(*shape):
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32) * 3

    def nw(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = [
        (prefix + "attn_norm.weight", nw(n_embd)),
        (prefix + "attn_q.weight", w(n_head * hd, n_embd)),
        (prefix + "attn_k.weight", w(n_head_kv * hd, n_embd)),
        (prefix + "attn_v.weight", w(n_head_kv * hd, n_embd)),
        (prefix + "attn_output.weight", w(n_embd, n_head * hd)),
        (prefix + "ffn_norm.weight", nw(n_embd)),
        (prefix + "ffn_gate.weight", w(n_ff, n_embd)),
        (prefix + "ffn_up.weight", w(n_ff, n_embd)),
        (prefix + "ffn_down.weight", w(n_embd, n_ff)),
    ]
    if qk_norm:
        t += [(prefix + "attn_q_norm.weight", nw(hd)), (prefix + "attn_k_norm.weight", nw(hd))]
    return t


def _hp_kvs(arch, n_layer, n_embd, n_head, n_head_kv, hd, n_ff, eps=1e-6, base=10000.0):
    p = arch + "."
    return [
        ("general.architecture", 8, arch),
        (p + "block_count", 4, n_layer),
        (p + "context_length", 4, 4096),
        (p + "embedding_length", 4, n_embd),
        (p + "feed_forward_length", 4, n_ff),
        (p + "attention.head_count", 4, n_head),
        (p + "attention.head_count_kv", 4, n_head_kv),
        (p + "attention.key_length", 4, hd),
        (p + "attention.value_length", 4, hd),
        (p + "attention.layer_norm_rms_epsilon", 6, eps),
        (p + "rope.freq_base", 6, base),
    ]


def make_target(path, seed=0, arch="qwen3", n_vocab=96, n_embd=64, n_layer=3, n_head=4, n_head_kv=2,
                hd=24, n_ff=96, tied=False, gtype=0):
    rng = np.random.default_rng(seed)
    ts = [("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32)),
          ("output_norm.weight", (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))]
    if not tied:
        ts.append(("output.weight", (rng.standard_normal((n_vocab, n_embd)) / 4).astype(np.float32)))
    for i in range(n_layer):
        ts += _block_tensors(rng, "blk.%d." % i, n_embd, n_head, n_head_kv, hd, n_ff, arch == "qwen3")
    write_gguf(path, _hp_kvs(arch, n_layer, n_embd, n_head, n_head_kv, hd, n_ff, base=1e4 if arch == "llama" else 1e6),
               [(n, a, gtype if a.ndim == 2 else 0) for n, a in ts])


def make_drafter(path, target_n_embd, target_layers, seed=1, n_layer=2, n_head=4, n_head_kv=2, hd=16,
                 n_ff=80, block_size=4, mask_id=5, extra_kvs=()):
    rng = np.random.default_rng(seed)
    e = target_n_embd
    ts = [("fc.weight", (rng.standard_normal((e, len(target_layers) * e)) / np.sqrt(e)).astype(np.float32)),
          ("enc.output_norm.weight", (1 + 0.1 * rng.standard_normal(e)).astype(np.float32)),
          ("output_norm.weight", (1 + 0.1 * rng.standard_normal(e)).astype(np.float32))]
    for i in range(n_layer):
        ts += _block_tensors(rng, "blk.%d." % i, e, n_head, n_head_kv, hd, n_ff, True)
    kvs = _hp_kvs("dflash", n_layer, e, n_head, n_head_kv, hd, n_ff, base=1e6)
    kvs += [("dflash.block_size", 4, block_size),
            ("dflash.target_layers", 9, (5, list(target_layers))),
            ("tokenizer.ggml.mask_token_id", 4, mask_id)]
    kvs += list(extra_kvs)
    write_gguf(path, kvs, [(n, a, 0) for n, a in ts])


# ---------------------------------------------------------------------------------------------
# naive (loop) reference forward, for cross-checking the vectorized one
# ---------------------------------------------------------------------------------------------

def naive_rope_complex(vec, p, n_rot, base, mode):
    """One head vector rotated with complex numbers: z_i = x_a + i x_b, z_i * e^{i p theta_i}."""
    out = vec.copy()
    half = n_rot // 2
    for i in range(half):
        a, b = (i, i + half) if mode == M.ROPE_NEOX else (2 * i, 2 * i + 1)
        z = complex(vec[a], vec[b]) * np.exp(1j * p * base ** (-2.0 * i / n_rot))
        out[a], out[b] = z.real, z.imag
    return out


def naive_attention(q, k, v, mask):
    n_q, H, d = q.shape
    Hkv = k.shape[1]
    out = np.zeros((n_q, H, v.shape[2]))
    for i in range(n_q):
        for h in range(H):
            kh = h // (H // Hkv)
            sc = [float(np.dot(q[i, h], k[j, kh])) / np.sqrt(d) if (mask is None or mask[i, j]) else None
                  for j in range(k.shape[0])]
            m = max(s for s in sc if s is not None)
            w = [np.exp(s - m) if s is not None else 0.0 for s in sc]
            z = sum(w)
            for j in range(k.shape[0]):
                out[i, h] += w[j] / z * v[j, kh]
    return out


def naive_target_logits(t, tokens):
    """Token-by-token, head-by-head, no cache object: logits (n, n_vocab)."""
    hp = t.hp
    n = len(tokens)
    xs = [t.tok_embd[tok].copy() for tok in tokens]
    for L in t.layers:
        ks, vs, qs = [], [], []
        for p in range(n):
            h = M.rmsnorm(xs[p], L.attn_norm, hp.eps)
            q = (L.wq @ h).reshape(hp.n_head, hp.head_dim)
            k = (L.wk @ h).reshape(hp.n_head_kv, hp.head_dim)
            v = (L.wv @ h).reshape(hp.n_head_kv, hp.head_dim_v)
            if L.q_norm is not None:
                q = np.stack([M.rmsnorm(q[i], L.q_norm, hp.eps) for i in range(hp.n_head)])
                k = np.stack([M.rmsnorm(k[i], L.k_norm, hp.eps) for i in range(hp.n_head_kv)])
            q = np.stack([naive_rope_complex(q[i], p, hp.n_rot, hp.freq_base, t.rope_mode) for i in range(hp.n_head)])
            k = np.stack([naive_rope_complex(k[i], p, hp.n_rot, hp.freq_base, t.rope_mode) for i in range(hp.n_head_kv)])
            qs.append(q), ks.append(k), vs.append(v)
        new = []
        for p in range(n):
            a = naive_attention(qs[p][None], np.stack(ks[:p + 1]), np.stack(vs[:p + 1]), None)[0]
            x = xs[p] + L.wo @ a.reshape(-1)
            h = M.rmsnorm(x, L.ffn_norm, hp.eps)
            g = L.w_gate @ h
            x = x + L.w_down @ (g / (1 + np.exp(-g)) * (L.w_up @ h))
            new.append(x)
        xs = new
    return np.stack([t.output @ M.rmsnorm(x, t.output_norm, hp.eps) for x in xs])


def naive_draft_logits(d, ctx_feats, ctx_pos, last, start, B):
    """The drafter written out per token: context K/V from fused features, then a non-causal block."""
    hp = d.hp
    f = [M.rmsnorm(d.fc @ fr, d.enc_norm, hp.eps) for fr in ctx_feats]
    toks = [last] + [d.mask_token_id] * (B - 1)
    xs = [d.tok_embd[t].copy() for t in toks]

    def kvec(L, hvec, p):
        k = (L.wk @ hvec).reshape(hp.n_head_kv, hp.head_dim)
        k = np.stack([naive_rope_complex(M.rmsnorm(k[i], L.k_norm, hp.eps), p, hp.n_rot, hp.freq_base, M.ROPE_NEOX)
                      for i in range(hp.n_head_kv)])
        return k

    for L in d.layers:
        K = [kvec(L, fv, p) for fv, p in zip(f, ctx_pos)]
        V = [(L.wv @ fv).reshape(hp.n_head_kv, hp.head_dim_v) for fv in f]
        hs = [M.rmsnorm(x, L.attn_norm, hp.eps) for x in xs]
        K += [kvec(L, hs[i], start + i) for i in range(B)]
        V += [(L.wv @ hs[i]).reshape(hp.n_head_kv, hp.head_dim_v) for i in range(B)]
        new = []
        for i in range(B):
            q = (L.wq @ hs[i]).reshape(hp.n_head, hp.head_dim)
            q = np.stack([naive_rope_complex(M.rmsnorm(q[h], L.q_norm, hp.eps), start + i, hp.n_rot, hp.freq_base,
                                             M.ROPE_NEOX) for h in range(hp.n_head)])
            a = naive_attention(q[None], np.stack(K), np.stack(V), None)[0]
            x = xs[i] + L.wo @ a.reshape(-1)
            h = M.rmsnorm(x, L.ffn_norm, hp.eps)
            g = L.w_gate @ h
            new.append(x + L.w_down @ (g / (1 + np.exp(-g)) * (L.w_up @ h)))
        xs = new
    return np.stack([d.output @ M.rmsnorm(x, d.output_norm, hp.eps) for x in xs[1:]])


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------

class Files:
    """Test model files, written once per run."""
    dir = None

    @classmethod
    def get(cls):
        if cls.dir is None:
            cls.dir = tmpdir()
            d = cls.dir
            make_target(os.path.join(d, "target.gguf"))
            make_target(os.path.join(d, "target_tied.gguf"), seed=3, tied=True, n_head_kv=4)
            make_target(os.path.join(d, "target_llama.gguf"), seed=4, arch="llama", gtype=1)
            make_target(os.path.join(d, "target_small.gguf"), seed=5, n_vocab=24, n_embd=32, n_layer=2,
                        n_head=2, n_head_kv=1, hd=16, n_ff=48)
            make_target(os.path.join(d, "target_q8_0.gguf"), seed=6, gtype=8)
            make_target(os.path.join(d, "target_q4_0.gguf"), seed=7, gtype=2, tied=True)
            make_drafter(os.path.join(d, "drafter.gguf"), 64, [1, 3, 0])
            make_drafter(os.path.join(d, "drafter_small.gguf"), 32, [2, 1], n_head=2, n_head_kv=1,
                         hd=16, block_size=5, mask_id=3)
        return cls.dir

    @classmethod
    def path(cls, name):
        return os.path.join(cls.get(), name)


class TestGGUF(unittest.TestCase):
    def test_all_kv_types_and_tensors(self):
        p = os.path.join(tmpdir(), "kv.gguf")
        kvs = [("u8", 0, 250), ("i8", 1, -5), ("u16", 2, 65000), ("i16", 3, -30000), ("u32", 4, 4000000000),
               ("i32", 5, -2000000000), ("f32", 6, 1.5), ("bool", 7, 1), ("str", 8, "héllo"),
               ("u64", 10, 2 ** 63 + 5), ("i64", 11, -2 ** 62), ("f64", 12, 0.1),
               ("arr_i32", 9, (5, [1, -2, 3])), ("arr_f32", 9, (6, [0.5, 2.0])),
               ("arr_str", 9, (8, ["a", "", "bc"])), ("arr_bool", 9, (7, [1, 0])),
               ("nested", 9, (9, [(4, [1, 2]), (8, ["x"]), (9, [(0, [7])])])),
               ("empty", 9, (5, [])), ("general.alignment", 4, 64)]
        a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.25
        b = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
        c = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32)
        write_gguf(p, kvs, [("a", a, 0), ("b", b, 1), ("c", c, 30)], alignment=64)
        g = GGUF(p)
        self.assertEqual(g.kv["u8"], 250)
        self.assertEqual(g.kv["i8"], -5)
        self.assertEqual(g.kv["u16"], 65000)
        self.assertEqual(g.kv["i16"], -30000)
        self.assertEqual(g.kv["u32"], 4000000000)
        self.assertEqual(g.kv["i32"], -2000000000)
        self.assertEqual(g.kv["f32"], 1.5)
        self.assertIs(g.kv["bool"], True)
        self.assertEqual(g.kv["str"], "héllo")
        self.assertEqual(g.kv["u64"], 2 ** 63 + 5)
        self.assertEqual(g.kv["i64"], -2 ** 62)
        self.assertEqual(g.kv["f64"], 0.1)
        self.assertEqual(g.kv["arr_i32"], [1, -2, 3])
        self.assertEqual(list(g.kv["arr_f32"]), [0.5, 2.0])
        self.assertEqual(g.kv["arr_str"], ["a", "", "bc"])
        self.assertEqual(g.kv["arr_bool"], [True, False])
        self.assertEqual(g.kv["nested"], [[1, 2], ["x"], [[7]]])
        self.assertEqual(g.kv["empty"], [])
        self.assertEqual(g.kv_type["nested"], 9)
        self.assertEqual(g.alignment, 64)
        self.assertEqual(g.data_start % 64, 0)
        self.assertEqual(g.tensors["a"].ne, [4, 3, 2])
        np.testing.assert_array_equal(g.tensor("a"), a)
        np.testing.assert_array_equal(g.tensor("b"), b.astype(np.float16).astype(np.float32))
        self.assertEqual(g.tensor("b").shape, (4, 16))
        np.testing.assert_array_equal(g.tensor("c"), np.array([1.0, -2.5, 3.140625, 0.00099945068359375], np.float32))
        for n in ("a", "b", "c"):
            self.assertEqual(g.tensors[n].data_offset % 64, 0)

    def test_bad_files(self):
        d = tmpdir()
        good = os.path.join(d, "good.gguf")
        write_gguf(good, [("k", 8, "v")], [("t", np.ones((2, 32), np.float32), 0)])
        data = open(good, "rb").read()
        cases = {
            "magic": b"GGUX" + data[4:],
            "version": data[:4] + struct.pack("<I", 2) + data[8:],
            "truncated_header": data[:10],
            "truncated_data": data[:-4],
            "bad_kv_type": data[:24 + 9] + struct.pack("<I", 99) + data[24 + 13:],
            "huge_string": data[:24] + struct.pack("<Q", 1 << 60) + data[32:],
        }
        for name, blob in cases.items():
            p = os.path.join(d, name + ".gguf")
            with open(p, "wb") as f:
                f.write(blob)
            with self.assertRaises(GGUFError, msg=name):
                GGUF(p)
        # a misaligned offset
        p = os.path.join(d, "misaligned.gguf")
        bad = bytearray(data)
        i = 24 + (8 + 1 + 4 + 8 + 1) + (8 + 1 + 4 + 16 + 4)  # header, kv "k"="v", tensor "t" up to offset
        struct.pack_into("<Q", bad, i, 4)
        open(p, "wb").write(bytes(bad))
        with self.assertRaisesRegex(GGUFError, "not aligned"):
            GGUF(p)

    def test_quantized_tensors(self):
        # the reader hands back exactly quant_np's dequantization of the quantized weights
        rng = np.random.default_rng(6)
        emb = rng.standard_normal((96, 64)).astype(np.float32)  # make_target's first draw
        for name, gt in (("target_q8_0.gguf", 8), ("target.gguf", 0)):
            g = GGUF(Files.path(name))
            self.assertEqual(g.tensors["token_embd.weight"].ggml_type, gt)
            self.assertEqual(g.tensors["output_norm.weight"].ggml_type, 0)
            if gt == 8:
                want = quant_np.dequantize(8, quant_np.quantize(8, emb.reshape(-1)), emb.size).reshape(96, 64)
                np.testing.assert_array_equal(g.tensor("token_embd.weight"), want)
                self.assertLess(np.abs(want - emb).max(), np.abs(emb).max() / 100)
                self.assertEqual(g.tensors["token_embd.weight"].nbytes, 96 * 64 // 32 * 34)
        g = GGUF(Files.path("target_q4_0.gguf"))
        self.assertEqual(g.tensors["blk.0.ffn_down.weight"].nbytes, 64 * 96 // 32 * 18)
        self.assertEqual(g.tensor("blk.0.ffn_down.weight").shape, (64, 96))

    def test_model_file_shapes(self):
        g = GGUF(Files.path("target.gguf"))
        self.assertEqual(g.tensors["token_embd.weight"].ne, [64, 96])
        self.assertEqual(g.tensor("token_embd.weight").shape, (96, 64))
        self.assertEqual(g.tensor("blk.0.attn_q.weight").shape, (4 * 24, 64))
        g = GGUF(Files.path("drafter.gguf"))
        self.assertEqual(g.kv["dflash.target_layers"], [1, 3, 0])
        self.assertEqual(g.tensor("fc.weight").shape, (64, 3 * 64))


class TestOps(unittest.TestCase):
    def test_rope_vs_complex(self):
        rng = np.random.default_rng(7)
        for mode in (M.ROPE_NEOX, M.ROPE_NORM):
            for hd, n_rot in ((16, 16), (24, 24), (32, 16)):
                x = rng.standard_normal((5, 3, hd))
                pos = np.array([0, 1, 7, 100, 4097])
                got = M.rope(x, pos, n_rot, 1e6, mode)
                for i in range(5):
                    for h in range(3):
                        want = naive_rope_complex(x[i, h], pos[i], n_rot, 1e6, mode)
                        np.testing.assert_allclose(got[i, h], want, rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
        # relative-position property: <rope(q,p), rope(k,s)> depends on p - s only
        q, k = rng.standard_normal((1, 1, 16)), rng.standard_normal((1, 1, 16))
        d1 = np.sum(M.rope(q, [10], 16, 1e4) * M.rope(k, [3], 16, 1e4))
        d2 = np.sum(M.rope(q, [107], 16, 1e4) * M.rope(k, [100], 16, 1e4))
        self.assertAlmostEqual(d1, d2, places=10)

    def test_attention_vs_loop(self):
        rng = np.random.default_rng(8)
        for H, Hkv in ((4, 4), (4, 2), (6, 1)):
            q = rng.standard_normal((5, H, 8))
            k = rng.standard_normal((7, Hkv, 8))
            v = rng.standard_normal((7, Hkv, 6))
            mask = rng.random((5, 7)) < 0.6
            mask[:, 0] = True
            np.testing.assert_allclose(M.attention(q, k, v, mask), naive_attention(q, k, v, mask), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(M.attention(q, k, v, None), naive_attention(q, k, v, None), rtol=1e-10, atol=1e-12)
        with self.assertRaises(M.ModelError):
            M.attention(q, k, v, np.zeros((5, 7), bool))

    def test_rmsnorm(self):
        x = np.array([[3.0, 4.0]])
        np.testing.assert_allclose(M.rmsnorm(x, np.array([1.0, 2.0]), 0.0), [[3 / np.sqrt(12.5), 8 / np.sqrt(12.5)]])


class TestTarget(unittest.TestCase):
    def test_forward_vs_naive(self):
        for name in ("target.gguf", "target_tied.gguf", "target_llama.gguf", "target_q8_0.gguf", "target_q4_0.gguf"):
            t = M.Target(Files.path(name))
            toks = [3, 17, 0, 95 if t.n_vocab > 95 else 1, 42, 8]
            got = t.forward(toks, logits="all").logits
            want = naive_target_logits(t, toks)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=name)
        self.assertTrue(M.Target(Files.path("target_tied.gguf")).tied)
        self.assertEqual(M.Target(Files.path("target_llama.gguf")).rope_mode, M.ROPE_NORM)
        self.assertEqual(M.Target(Files.path("target.gguf")).rope_mode, M.ROPE_NEOX)
        t = M.Target(Files.path("target_llama.gguf"), rope_mode=M.ROPE_NEOX)
        np.testing.assert_allclose(t.forward([1, 2, 3], logits="all").logits, naive_target_logits(t, [1, 2, 3]),
                                   rtol=1e-9, atol=1e-9)

    def test_batched_equals_token_by_token(self):
        t = M.Target(Files.path("target.gguf"))
        toks = [5, 9, 2, 77, 31, 31, 60, 1, 0, 12, 88]
        full = t.forward(toks, logits="all", capture=[0, 2, 3])
        c = t.new_cache()
        rows, caps = [], {0: [], 2: [], 3: []}
        for i, tok in enumerate(toks):
            r = t.forward([tok], [i], c, logits="all", capture=[0, 2, 3])
            rows.append(r.logits[0])
            for k in caps:
                caps[k].append(r.captured[k][0])
        np.testing.assert_allclose(full.logits, np.stack(rows), rtol=1e-10, atol=1e-10)
        for k in caps:
            np.testing.assert_allclose(full.captured[k], np.stack(caps[k]), rtol=1e-10, atol=1e-10)
        # uneven batches
        c = t.new_cache()
        parts = [t.forward(toks[a:b], None, c, logits="all").logits for a, b in ((0, 4), (4, 5), (5, 11))]
        np.testing.assert_allclose(full.logits, np.concatenate(parts), rtol=1e-10, atol=1e-10)
        # capture 0 is the token embedding; rollback then re-evaluate gives the same logits
        np.testing.assert_array_equal(full.captured[0], t.tok_embd[toks])
        c.remove_from(6)
        self.assertEqual(c.positions().tolist(), list(range(6)))
        r = t.forward(toks[6:], None, c, logits="all")
        np.testing.assert_allclose(r.logits, full.logits[6:], rtol=1e-10, atol=1e-10)

    def test_positions_and_errors(self):
        t = M.Target(Files.path("target.gguf"))
        # shifting all positions keeps relative positions: same logits up to rounding
        a = t.forward([1, 2, 3], [0, 1, 2], logits="all").logits
        b = t.forward([1, 2, 3], [10, 11, 12], logits="all").logits
        np.testing.assert_allclose(a[0], b[0], rtol=1e-10)  # single token: rotation-invariant
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8)
        cc = t.forward([1, 2, 3], [0, 1, 5], logits="all").logits
        self.assertGreater(np.abs(cc[2] - a[2]).max(), 1e-4)
        with self.assertRaises(M.ModelError):
            t.forward([t.n_vocab])
        with self.assertRaises(M.ModelError):
            t.forward([1], capture=[t.n_layer + 1])
        c = t.new_cache()
        t.forward([1, 2], None, c)
        with self.assertRaises(M.ModelError):
            t.forward([3], [1], c)

    def test_greedy_matches_full_recompute(self):
        t = M.Target(Files.path("target.gguf"))
        prompt = [4, 8, 15, 16, 23, 42]
        g = t.greedy(prompt, 8)
        seq = list(prompt)
        for _ in range(8):
            seq.append(int(np.argmax(t.forward(seq, logits="last").logits[-1])))
        self.assertEqual(g, seq[len(prompt):])


class TestDrafter(unittest.TestCase):
    def setUp(self):
        self.t = M.Target(Files.path("target.gguf"))
        self.d = M.Drafter(Files.path("drafter.gguf"), self.t)

    def _ctx(self, prompt):
        r = self.t.forward(prompt, logits="last", capture=self.d.target_layers)
        c = self.d.new_cache()
        f = self.d.features(r.captured)
        self.d.add_context(c, f, np.arange(len(prompt)))
        return c, f, int(np.argmax(r.logits[-1]))

    def test_feature_order_and_fuse(self):
        r = self.t.forward([1, 2, 3], logits=None, capture=[0, 1, 3])
        f = self.d.features(r.captured)
        e = self.t.n_embd
        np.testing.assert_array_equal(f[:, :e], r.captured[1])
        np.testing.assert_array_equal(f[:, e:2 * e], r.captured[3])
        np.testing.assert_array_equal(f[:, 2 * e:], r.captured[0])

    def test_draft_vs_naive(self):
        prompt = [7, 3, 9, 12, 50, 2, 61]
        c, f, last = self._ctx(prompt)
        toks, logits = self.d.draft(c, last, len(prompt), 4)
        want = naive_draft_logits(self.d, f, list(range(len(prompt))), last, len(prompt), 4)
        np.testing.assert_allclose(logits, want, rtol=1e-9, atol=1e-9)
        self.assertEqual(toks.tolist(), np.argmax(want, axis=-1).tolist())
        self.assertEqual(logits.shape, (3, self.t.n_vocab))
        self.assertEqual(c.n, len(prompt))  # block K/V are not kept

    def test_noncausal_and_order(self):
        prompt = [7, 3, 9, 12, 50, 2, 61]
        c, f, last = self._ctx(prompt)
        _, l4 = self.d.draft(c, last, 7, 4)
        # permuting the context cells (K/V rows with their positions) changes nothing
        perm = np.random.default_rng(0).permutation(c.n)
        c.pos[:c.n] = c.pos[perm]
        for j in range(len(self.d.layers)):
            c.k[j][:c.n] = c.k[j][perm]
            c.v[j][:c.n] = c.v[j][perm]
        _, lp = self.d.draft(c, last, 7, 4)
        np.testing.assert_allclose(lp, l4, rtol=1e-10, atol=1e-12)
        # injecting the same features in another order (with their positions) changes nothing
        c2 = self.d.new_cache()
        order = np.random.default_rng(1).permutation(len(prompt))
        self.d.add_context(c2, f[order], order)
        _, l2 = self.d.draft(c2, last, 7, 4)
        np.testing.assert_allclose(l2, l4, rtol=1e-10, atol=1e-12)
        # non-causal: slot 1 sees later slots, so a longer block changes slot 1
        _, l6 = self.d.draft(c, last, 7, 6)
        self.assertGreater(np.abs(l6[0] - l4[0]).max(), 1e-6)
        # positions matter: the same features at shifted positions with a shifted block are
        # rotation-equivalent (same relative positions) -> same output
        c3 = self.d.new_cache()
        self.d.add_context(c3, f, np.arange(len(prompt)) + 20)
        _, l3 = self.d.draft(c3, last, 27, 4)
        np.testing.assert_allclose(l3, l4, rtol=1e-8, atol=1e-8)
        # but a position mismatch changes it
        c4 = self.d.new_cache()
        self.d.add_context(c4, f, np.arange(len(prompt)) * 2)
        _, l5 = self.d.draft(c4, last, 14, 4)
        self.assertGreater(np.abs(l5 - l4).max(), 1e-6)
        # context at positions >= start is ignored
        _, lstart = self.d.draft(c, last, 5, 4)
        c5 = self.d.new_cache()
        self.d.add_context(c5, f[:5], np.arange(5))
        _, lwant = self.d.draft(c5, last, 5, 4)
        np.testing.assert_allclose(lstart, lwant, rtol=1e-10, atol=1e-12)

    def test_injection_uses_features_not_attn_norm(self):
        # scaling the raw features changes nothing beyond eps (rmsnorm(fc f)) -> invariant
        prompt = [7, 3, 9]
        c, f, last = self._ctx(prompt)
        c2 = self.d.new_cache()
        self.d.add_context(c2, f * 3.0, np.arange(3))
        np.testing.assert_allclose(self.d.draft(c2, last, 3, 4)[1], self.d.draft(c, last, 3, 4)[1], atol=1e-5)
        # the V rows equal Wv f exactly (no attn_norm on the fused feature)
        fused = self.d.fuse(f)
        L = self.d.layers[0]
        np.testing.assert_allclose(c.v[0][:3].reshape(3, -1), fused @ L.wv.T, rtol=1e-12)

    def test_bad_drafter_files(self):
        d = tmpdir()
        p = os.path.join(d, "bad.gguf")
        make_drafter(p, 64, [1, 9])  # layer 9 > n_layer 3
        with self.assertRaisesRegex(M.ModelError, "out of range"):
            M.Drafter(p, self.t)
        make_drafter(p, 32, [1])  # n_embd mismatch with the target's
        with self.assertRaises(M.ModelError):
            M.Drafter(p, self.t)


class TestSpec(unittest.TestCase):
    def test_spec_equals_greedy(self):
        for tn, dn in (("target.gguf", "drafter.gguf"), ("target_small.gguf", "drafter_small.gguf")):
            t = M.Target(Files.path(tn))
            d = M.Drafter(Files.path(dn), t)
            for prompt in ([1, 2, 3], [5, 9, 2, 7, 11, 13, 4]):
                want = t.greedy(prompt, 20)
                for B in (2, 3, d.block_size, 8):
                    r = M.spec_generate(t, d, prompt, 20, B)
                    self.assertEqual(r.tokens, want, "%s B=%d" % (tn, B))
                    self.assertTrue(1 <= r.tau <= B)
                    self.assertTrue(all(0 <= a <= B - 1 for a in r.accepted))
                    self.assertGreaterEqual(1 + sum(a + 1 for a in r.accepted), 20)

    def test_spec_with_forced_acceptances(self):
        # a draft_fn that proposes the true greedy continuation with one wrong token at a chosen
        # slot: exercises acceptance of a > 0 and the KV/context rollback
        t = M.Target(Files.path("target.gguf"))
        d = M.Drafter(Files.path("drafter.gguf"), t)
        prompt = [5, 9, 2, 7]
        n = 30
        full = t.greedy(prompt, n + 20)
        rng = np.random.default_rng(3)
        B = 5
        log = []

        def oracle(dcache, last, start, B_):
            k = start - len(prompt)          # index of `last` in full
            self.assertEqual(full[k], last)
            self.assertEqual(dcache.positions().tolist(), list(range(start)))  # context < start only
            prop = list(full[k + 1:k + B_])
            bad = int(rng.integers(0, B_))    # B_-1 -> all correct
            if bad < B_ - 1:
                prop[bad] = (prop[bad] + 1) % t.n_vocab
            log.append(bad)
            return prop

        r = M.spec_generate(t, d, prompt, n, B, draft_fn=oracle)
        self.assertEqual(r.tokens, full[:n])
        self.assertEqual(r.accepted, [min(b, B - 1) for b in log])
        self.assertGreater(max(r.accepted), 0)
        self.assertIn(B - 1, r.accepted)

    def test_perfect_drafter_tau(self):
        t = M.Target(Files.path("target.gguf"))
        d = M.Drafter(Files.path("drafter.gguf"), t)
        prompt = [1, 2]
        full = t.greedy(prompt, 40)
        r = M.spec_generate(t, d, prompt, 21, 5,
                            draft_fn=lambda c, last, start, B: full[start - 2 + 1:start - 2 + B])
        self.assertEqual(r.tokens, full[:21])
        self.assertEqual(r.tau, 5.0)
        self.assertEqual(len(r.accepted), 4)


class TestCLI(unittest.TestCase):
    def run_cli(self, *args, ok=True):
        p = subprocess.run([PY, CLI] + [str(a) for a in args], capture_output=True, text=True)
        if ok:
            self.assertEqual(p.returncode, 0, p.stderr)
            return json.loads(p.stdout)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertTrue(p.stderr.strip())
        return p.stderr

    def test_commands(self):
        T, D = Files.path("target.gguf"), Files.path("drafter.gguf")
        t = M.Target(T)
        toks = [5, 9, 2, 7]
        want = t.forward(toks, logits="all").logits
        out = os.path.join(Files.get(), "logits.bin")
        j = self.run_cli("logits", "--model", T, "--tokens", "5,9,2,7", "--all", "--out", out)
        got = np.fromfile(out, dtype="<f4").reshape(4, t.n_vocab)
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6)
        np.testing.assert_allclose(np.array(j["logits"]), want, rtol=1e-6, atol=1e-6)
        j = self.run_cli("logits", "--model", T, "--tokens", "5,9,2,7", "--top-k", "3")
        self.assertEqual(j["top_ids"][0], np.argsort(-want[-1])[:3].tolist())
        self.assertNotIn("logits", j)
        j = self.run_cli("logits", "--model", T, "--tokens", "5,9,2,7", "--split", "1,3", "--out", out + ".npy")
        np.testing.assert_allclose(np.load(out + ".npy"), want[-1:].astype(np.float32), rtol=1e-6)
        g = self.run_cli("greedy", "--model", T, "--tokens", "5,9,2,7", "-n", "6")
        self.assertEqual(g["tokens"], t.greedy(toks, 6))
        fo = os.path.join(Files.get(), "feat.bin")
        j = self.run_cli("features", "--model", T, "--tokens", "5,9,2,7", "--layers", "3,1", "--out", fo)
        f = np.fromfile(fo, dtype="<f4").reshape(4, 2 * 64)
        r = t.forward(toks, logits=None, capture=[1, 3])
        np.testing.assert_allclose(f[:, :64], r.captured[3], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(f[:, 64:], r.captured[1], rtol=1e-6, atol=1e-6)
        j = self.run_cli("draft", "--target", T, "--drafter", D, "--tokens", "5,9,2,7", "--top-k", "2")
        self.assertEqual(len(j["draft_tokens"]), 3)
        self.assertEqual(j["start"], 4)
        s = self.run_cli("spec", "--target", T, "--drafter", D, "--tokens", "5,9,2,7", "-n", "10", "--block", "3",
                         "--check")
        self.assertEqual(s["tokens"], t.greedy(toks, 10))
        self.assertEqual(s["greedy_equal"], True)

    def test_bad_input(self):
        T = Files.path("target.gguf")
        self.run_cli("logits", "--model", T, "--tokens", "1,x", ok=False)
        self.run_cli("logits", "--model", T, "--tokens", "100000", ok=False)
        self.run_cli("logits", "--model", "/nonexistent.gguf", "--tokens", "1", ok=False)
        self.run_cli("logits", "--model", T, "--tokens", "1,2", "--positions", "0", ok=False)
        self.run_cli("nosuchcmd", ok=False)
        self.run_cli("features", "--model", T, "--tokens", "1", "--layers", "9", ok=False)
        self.run_cli("spec", "--target", T, "--drafter", T, "--tokens", "1", "-n", "3", ok=False)

    def test_kv_f16_option(self):
        """--kv f16: the cache holds float16-rounded K / V (the batch's own included), nothing else
        changes: the first token's logits equal a forward whose K / V are rounded by hand."""
        T = Files.path("target.gguf")
        toks = [5, 9, 2, 7, 31]
        a = np.array(self.run_cli("logits", "--model", T, "--tokens", "5,9,2,7,31", "--all")["logits"])
        b = np.array(self.run_cli("logits", "--model", T, "--tokens", "5,9,2,7,31", "--all", "--kv", "f16")["logits"])
        d = np.abs(a - b).max()
        self.assertGreater(d, 1e-9)
        self.assertLess(d, 1e-2 * max(1.0, np.abs(a).max()))
        t = M.Target(T, kv_f16=True)
        c = t.new_cache()
        t.forward(toks, None, c, logits=None)
        K, V, _ = c.view(0)
        np.testing.assert_array_equal(K, K.astype(np.float16).astype(np.float64))
        np.testing.assert_array_equal(V, V.astype(np.float16).astype(np.float64))
        self.assertFalse(np.array_equal(M.Target(T).forward(toks, logits="all").logits,
                                        t.forward(toks, logits="all").logits))
        self.run_cli("logits", "--model", T, "--tokens", "1", "--kv", "f8", ok=False)

    def test_rope_option(self):
        llama = Files.path("target_llama.gguf")
        a = self.run_cli("logits", "--model", llama, "--tokens", "1,2,3")["logits"]
        b = self.run_cli("logits", "--model", llama, "--tokens", "1,2,3", "--rope", "neox")["logits"]
        self.assertGreater(np.abs(np.array(a) - np.array(b)).max(), 1e-6)


class TestDflashTestModel(unittest.TestCase):
    """Runs on `build/dflash make-test-model` output when that command exists (skipped otherwise)."""

    def test_make_test_model(self):
        exe = os.environ.get("DFLASH_CLI") or os.path.join(ROOT, "build", "dflash")
        if not os.path.isabs(exe):
            exe = os.path.join(ROOT, exe)
        if not os.path.exists(exe):
            self.skipTest("%s not built" % exe)
        d = tmpdir()
        p = subprocess.run([exe, "make-test-model", "-o", d, "--n-embd", "64", "--n-layer", "2", "--type", "f32"],
                           capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(os.path.join(d, "target.gguf")):
            self.skipTest("make-test-model unavailable: %s" % (p.stderr.strip()[:200]))
        t = M.Target(os.path.join(d, "target.gguf"))
        toks = [1, 2, 3, 4, 5]
        np.testing.assert_allclose(t.forward(toks, logits="all").logits, naive_target_logits(t, toks),
                                   rtol=1e-8, atol=1e-8)
        if os.path.exists(os.path.join(d, "drafter.gguf")):
            dr = M.Drafter(os.path.join(d, "drafter.gguf"), t)
            self.assertEqual(M.spec_generate(t, dr, toks, 12).tokens, t.greedy(toks, 12))


if __name__ == "__main__":
    unittest.main()
