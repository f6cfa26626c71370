"""quant_np.py: an independent numpy implementation of the ggml block formats dflash reads
(F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K) and writes (F32, F16, BF16, Q8_0, Q4_0).

Written from the format descriptions (docs/gguf.md, llama.cpp's ggml-quants.c), not from
src/quant/: blocks are numpy structured arrays and every format is dequantized with whole-array
operations. All arithmetic is float32 with the same products as ggml, so results are bit-exact.

    dequantize(ggml_type: int, raw: bytes, n: int) -> np.ndarray  # float32 [n]
    quantize(ggml_type: int, x: np.ndarray) -> bytes               # x: float32 [n]

Run with /usr/bin/python3 (Debian's interpreter, which has numpy).
"""
import numpy as np

F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, BF16 = 0, 1, 2, 8, 12, 14, 30

# Block layouts (little-endian, packed).
BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])                      # 18 B, 32 weights
BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])                      # 34 B, 32 weights
BLOCK_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12),
                       ("qs", "u1", 128)])                                   # 144 B, 256 weights
BLOCK_Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16),
                       ("d", "<f2")])                                        # 210 B, 256 weights

# ggml type -> (elements per block, bytes per block)
BLOCKS = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34),
          Q4_K: (256, 144), Q6_K: (256, 210)}


def row_size(ggml_type, n):
    blck, size = BLOCKS[ggml_type]
    assert n % blck == 0, f"n={n} is not a multiple of the block size {blck}"
    return n // blck * size


def _blocks(raw, n, dtype, blck):
    assert n % blck == 0, f"n={n} is not a multiple of the block size {blck}"
    nb = n // blck
    assert len(raw) >= nb * dtype.itemsize, f"{len(raw)} bytes < {nb} blocks of {dtype.itemsize}"
    return np.frombuffer(raw, dtype=dtype, count=nb)


def _f16(a):
    """f16 field -> float32 column [nb, 1] (numpy's exact half->float conversion)."""
    return a.astype(np.float32)[:, None]


def dequantize(ggml_type, raw, n):
    """Dequantizes the first n elements stored in raw (bytes or any buffer, e.g. a slice of a
    memory-mapped GGUF; not copied) to a new float32 array [n]."""
    if ggml_type == F32:
        return np.frombuffer(raw, dtype="<f4", count=n).astype(np.float32)
    if ggml_type == F16:
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32)
    if ggml_type == BF16:
        u = np.frombuffer(raw, dtype="<u2", count=n).astype(np.uint32) << 16
        return u.view(np.float32)
    if ggml_type == Q8_0:
        b = _blocks(raw, n, BLOCK_Q8_0, 32)
        return (b["qs"].astype(np.float32) * _f16(b["d"])).reshape(-1)
    if ggml_type == Q4_0:
        b = _blocks(raw, n, BLOCK_Q4_0, 32)
        q = np.concatenate([b["qs"] & 15, b["qs"] >> 4], axis=1).astype(np.int32) - 8  # [nb, 32]
        return (q.astype(np.float32) * _f16(b["d"])).reshape(-1)
    if ggml_type == Q4_K:
        b = _blocks(raw, n, BLOCK_Q4_K, 256)
        s = b["scales"]                                                       # [nb, 12]
        # 6-bit scales/mins: sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales) and
        # 4..7 (mins); sub-blocks 4..7: low 4 bits in the nibbles of bytes 8..11, top 2 bits
        # in the spare top bits of bytes 0..3 (scales) and 4..7 (mins).
        sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
        mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
        # qs: 4 chunks of 32 bytes; chunk c holds sub-block 2c in the low and 2c+1 in the high nibbles
        qs = b["qs"].reshape(-1, 4, 1, 32)
        q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)      # [nb, 8, 32]
        d1 = (_f16(b["d"]) * sc.astype(np.float32))[:, :, None]              # [nb, 8, 1]
        m1 = (_f16(b["dmin"]) * mn.astype(np.float32))[:, :, None]
        return (d1 * q.astype(np.float32) - m1).reshape(-1)
    if ggml_type == Q6_K:
        b = _blocks(raw, n, BLOCK_Q6_K, 256)
        # Within each 128-weight half, weight 32*g + l (g = 0..3) takes its low 4 bits from
        # ql[l] (g = 0, 2) or ql[l+32] (g = 1, 3), low nibble for g < 2, high for g >= 2, and its
        # high 2 bits from bits 2g..2g+1 of qh[l]. Weight t of the block uses scales[t // 16].
        ql = b["ql"].reshape(-1, 2, 1, 2, 32)                                 # [nb, half, 1, a, l]
        lo = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 4, 32)  # g = 2*nib + a
        qh = b["qh"].reshape(-1, 2, 1, 32)
        hi = (qh >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
        q = (lo.astype(np.int32) | (hi.astype(np.int32) << 4)) - 32            # [nb, 2, 4, 32]
        scale = _f16(b["d"]) * np.repeat(b["scales"].astype(np.float32), 16, axis=1)  # [nb, 256]
        return (scale * q.reshape(-1, 256).astype(np.float32)).reshape(-1)
    raise ValueError(f"dequantize: unsupported ggml type {ggml_type}")


def f32_to_bf16_bits(x):
    """float32 [n] -> bf16 bits (uint16 [n]): round to nearest, ties to even; NaN stays NaN with
    its sign and top payload bits and the quiet bit (0x0040) set."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    top = (u >> 16).astype(np.uint32)
    low = u & 0xFFFF
    up = (low > 0x8000) | ((low == 0x8000) & ((top & 1) == 1))
    out = top + up.astype(np.uint32)  # a carry into the exponent is the right rounding
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = np.where(nan, top | 0x40, out)
    return out.astype(np.uint16)


def _round_half_away(v):
    """C's roundf on float32 values, computed in float64 (exact: v + 0.5 cannot round there)."""
    v64 = v.astype(np.float64)
    return np.trunc(v64 + np.copysign(0.5, v64))


def quantize(ggml_type, x):
    """Quantizes float32 x [n] (n a multiple of the block size) like ggml's reference
    quantize_row_*_ref; returns the raw bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if ggml_type == F32:
        return x.astype("<f4").tobytes()
    if ggml_type == F16:
        return x.astype("<f2").tobytes()
    if ggml_type == BF16:
        return f32_to_bf16_bits(x).astype("<u2").tobytes()
    with np.errstate(all="ignore"):
        if ggml_type == Q8_0:
            assert x.size % 32 == 0
            xb = x.reshape(-1, 32)
            amax = np.abs(xb).max(axis=1)                                      # float32 [nb]
            d = amax / np.float32(127)
            idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            v = xb * idv[:, None]                                              # float32 [nb, 32]
            q = np.clip(np.nan_to_num(_round_half_away(v), nan=0.0), -127, 127)
            out = np.zeros(xb.shape[0], dtype=BLOCK_Q8_0)
            out["d"] = d.astype(np.float16)
            out["qs"] = q.astype(np.int8)
            return out.tobytes()
        if ggml_type == Q4_0:
            assert x.size % 32 == 0
            xb = x.reshape(-1, 32)
            a = np.abs(xb)
            first = np.argmax(a, axis=1)                    # first element of largest magnitude
            amax = a[np.arange(xb.shape[0]), first]
            mx = np.where(amax > 0, xb[np.arange(xb.shape[0]), first], np.float32(0))
            d = (mx / np.float32(-8)).astype(np.float32)
            idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            v = xb * idv[:, None] + np.float32(8.5)                            # float32 [nb, 32]
            q = np.where(v > 0, np.minimum(np.trunc(v), 15), 0).astype(np.uint8)
            out = np.zeros(xb.shape[0], dtype=BLOCK_Q4_0)
            out["d"] = d.astype(np.float16)
            out["qs"] = q[:, :16] | (q[:, 16:] << 4)
            return out.tobytes()
    raise ValueError(f"quantize: unsupported ggml type {ggml_type}")
