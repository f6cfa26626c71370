"""gen_quant_fixtures.py: writes the block-format fixtures of tests/test_quant.c and
tests/test_fp16.c into tests/fixtures/quant/, with values from the numpy reference
(tests/ref/quant_np.py). Deterministic (fixed seeds); rerun after changing quant_np.py:

    /usr/bin/python3 tests/ref/gen_quant_fixtures.py

Files (all little-endian):
  dequant_<type>.bin  cases of: u32 n, u32 n_bytes, n_bytes raw bytes (input), f32[n] (expected)
  quant_<type>.bin    cases of: u32 n, u32 n_bytes, n_bytes raw bytes (expected), f32[n] (input)
  fp16_edge.bin       records of: u32 f32 bits, u16 numpy f16 bits (f32 -> f16 edge cases)
  fp16_hashes.txt     FNV-1a 64 hashes (over the little-endian bytes) of numpy conversions:
                        f16_to_f32_all   all 65536 f16 patterns -> f32 bits
                        bf16_to_f32_all  all 65536 bf16 patterns -> f32 bits
                        f32_to_f16       SAMPLE_N splitmix64 f32 patterns -> f16 bits
                                         (NaN results canonicalised to sign|0x7e00, see below)
                        f32_to_bf16      the same sample -> bf16 bits (quant_np's rounding)
Sample: splitmix64 from SAMPLE_SEED; output i (64 bits z): even i -> the f32 pattern z & 0xffffffff
(uniform bits); odd i -> sign = bit 63, exponent = 100 + (z >> 32) % 46, mantissa = z & 0x7fffff
(the f16 normal/subnormal/overflow range). NaN f16 results are canonicalised before hashing
because numpy keeps signalling NaNs signalling while dflash (like x86 F16C) quiets them; NaN
payloads of quiet NaNs are checked exactly in fp16_edge.bin.
"""
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_np as qn  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "quant")
SAMPLE_SEED = 0x5EED_F16
SAMPLE_N = 1 << 18

NAMES = {qn.F32: "f32", qn.F16: "f16", qn.BF16: "bf16", qn.Q4_0: "q4_0", qn.Q8_0: "q8_0",
         qn.Q4_K: "q4_K", qn.Q6_K: "q6_K", qn.Q4_1: "q4_1", qn.Q5_0: "q5_0", qn.Q5_1: "q5_1",
         qn.Q2_K: "q2_K", qn.Q3_K: "q3_K", qn.Q5_K: "q5_K", qn.IQ4_NL: "iq4_nl", qn.IQ4_XS: "iq4_xs"}


def f32(*v):
    return np.array(v, dtype=np.float32)


def bits_f32(u):
    return np.array(u, dtype=np.uint32).view(np.float32)


def write_cases(path, cases):
    """cases: list of (n, raw bytes, float32 array [n])."""
    with open(path, "wb") as f:
        for n, raw, vals in cases:
            vals = np.asarray(vals, dtype="<f4")
            assert vals.size == n
            f.write(struct.pack("<II", n, len(raw)))
            f.write(raw)
            f.write(vals.tobytes())


# ---- dequantize fixtures: random raw bytes with sane f16 scales --------------------------------

def sane_f16(rng, count, lo=1e-3, hi=4.0):
    """count random finite f16 values, log-uniform magnitude in [lo, hi], random sign."""
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), count))
    sign = np.where(rng.integers(0, 2, count) == 1, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def random_blocks(rng, dtype, nb, f16_fields, scale_overrides=None):
    raw = bytearray(rng.integers(0, 256, nb * dtype.itemsize, dtype=np.uint8).tobytes())
    blocks = np.frombuffer(raw, dtype=dtype).copy()
    for field in f16_fields:
        blocks[field] = sane_f16(rng, nb)
    if scale_overrides:
        for field, vals in scale_overrides.items():
            blocks[field][: len(vals)] = np.array(vals, dtype=np.float16)
    return blocks.tobytes()


def dequant_cases(rng, t):
    cases = []
    if t in (qn.F32, qn.F16, qn.BF16):
        width = 4 if t == qn.F32 else 2
        for n in (1, 7, 64, 300):
            raw = rng.integers(0, 256, n * width, dtype=np.uint8).tobytes()
            cases.append((n, raw))
        return [(n, raw, qn.dequantize(t, raw, n)) for n, raw in cases]
    dtype, blck, fields = {
        qn.Q4_0: (qn.BLOCK_Q4_0, 32, ["d"]),
        qn.Q8_0: (qn.BLOCK_Q8_0, 32, ["d"]),
        qn.Q4_K: (qn.BLOCK_Q4_K, 256, ["d", "dmin"]),
        qn.Q6_K: (qn.BLOCK_Q6_K, 256, ["d"]),
        qn.Q4_1: (qn.BLOCK_Q4_1, 32, ["d", "m"]),
        qn.Q5_0: (qn.BLOCK_Q5_0, 32, ["d"]),
        qn.Q5_1: (qn.BLOCK_Q5_1, 32, ["d", "m"]),
        qn.Q2_K: (qn.BLOCK_Q2_K, 256, ["d", "dmin"]),
        qn.Q3_K: (qn.BLOCK_Q3_K, 256, ["d"]),
        qn.Q5_K: (qn.BLOCK_Q5_K, 256, ["d", "dmin"]),
        qn.IQ4_NL: (qn.BLOCK_IQ4_NL, 32, ["d"]),
        qn.IQ4_XS: (qn.BLOCK_IQ4_XS, 256, ["d"]),
    }[t]
    counts = (1, 3, 8) if blck == 32 else (1, 2, 5)
    for nb in counts:
        cases.append((nb * blck, random_blocks(rng, dtype, nb, fields)))
    # awkward scales: zero, subnormal f16 (6e-8 .. 6e-5), the largest finite f16
    odd = {f: [0.0, 3e-7, -65504.0] for f in fields}
    cases.append((3 * blck, random_blocks(rng, dtype, 3, fields, odd)))
    return [(n, raw, qn.dequantize(t, raw, n)) for n, raw in cases]


# ---- quantize fixtures: awkward f32 inputs ---------------------------------------------------

def quant_inputs(rng, t):
    blck = 32
    ins = []
    ins.append(rng.standard_normal(4 * blck).astype(np.float32) * np.float32(0.05))   # weights
    ins.append(np.zeros(blck, dtype=np.float32))                                     # zero block
    z = np.zeros(blck, dtype=np.float32)
    z[0] = -0.0
    z[5] = -0.0
    ins.append(z)                                                                    # -0 entries
    x = rng.standard_normal(blck).astype(np.float32) * np.float32(0.01)
    x[13] = 1e4
    ins.append(x)                                                                    # one huge
    x = rng.standard_normal(blck).astype(np.float32)
    x[2] = -3e30
    ins.append(x)                                                                    # d -> f16 inf
    ins.append(-np.abs(rng.standard_normal(2 * blck)).astype(np.float32) - 0.1)     # negatives
    ins.append(np.abs(rng.standard_normal(blck)).astype(np.float32))                 # positives
    x = rng.standard_normal(blck).astype(np.float32) * np.float32(1e-39)
    ins.append(x)                                                                    # 1/d overflows
    x = np.full(blck, 0.25, dtype=np.float32)
    x[7] = -0.25
    ins.append(x)                                                                    # equal |max|: first wins
    ins.append(-x)
    ins.append(rng.standard_normal(blck).astype(np.float32) * np.float32(1e-6))      # d f16 subnormal
    # ties: exact scales (Q8_0: amax 127 -> d = 1; Q4_0: max -8 -> d = 1) and values at and
    # one ulp around k + 0.5 (Q8_0 rounding) or k - 8.5 (Q4_0 truncation of x + 8.5)
    if t == qn.Q8_0:
        base = np.arange(-15, 16, dtype=np.float32)[:31] + np.float32(0.5)
        x = np.concatenate([f32(127.0), base])
    else:
        base = np.arange(-7, 8, dtype=np.float32) - np.float32(0.5)
        x = np.concatenate([f32(-8.0), base, base + np.float32(0.25), f32(7.5)])
    assert x.size == 32
    ins.append(x)
    for toward in (np.inf, -np.inf):  # one ulp off every value but the one fixing d
        y = np.nextafter(x, np.float32(toward)).astype(np.float32)
        y[0] = x[0]
        ins.append(y)
    # ties with an inexact scale: values (k + 0.5) * d for a random amax
    d = np.float32(0.0371)
    x = ((np.arange(32, dtype=np.float32) - np.float32(16)) + np.float32(0.5)) * d
    ins.append(x.astype(np.float32))
    return ins


def f16_inputs():
    """Edge values for f32 -> f16 (also used as the F16 quantize fixture)."""
    v = []
    for e in range(-26, 17):          # ties and their neighbours at every f16 exponent
        for m in (0x1000, 0x3000, 0x1001, 0x0FFF, 0x2000, 0x7FF000, 0x7FFFFF, 0):
            b = ((e + 127) << 23) | m
            v += [b, b | 0x80000000]
    v += [0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,  # 65504 .. 65536
          0x33000000, 0x33000001, 0x32FFFFFF, 0x33400000, 0x33C00000,  # around 2^-25
          0x387FC000, 0x387FE000, 0x387FF000, 0x38800000,              # largest subnormal -> normal
          0x00000000, 0x80000000, 0x00000001, 0x7F7FFFFF, 0xFF7FFFFF,
          0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FD55000, 0x7FFFE000, 0xFFE02000]
    return np.array(v, dtype=np.uint32)


def bf16_inputs(rng):
    v = [0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000,
         0x00008000, 0x00018000, 0x80008000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
         0x7F800001, 0x7FA12345, 0x00000000, 0x80000000, 0x00000001]
    return np.concatenate([np.array(v, dtype=np.uint32),
                           rng.integers(0, 2**32, 45, dtype=np.uint64).astype(np.uint32)])


def quant_cases(rng, t):
    if t == qn.F32:
        ins = [rng.standard_normal(37).astype(np.float32), bits_f32(f16_inputs())]
    elif t == qn.F16:
        ins = [bits_f32(f16_inputs()), rng.standard_normal(33).astype(np.float32)]
    elif t == qn.BF16:
        ins = [bits_f32(bf16_inputs(rng)), rng.standard_normal(33).astype(np.float32)]
    else:
        ins = quant_inputs(rng, t)
    return [(x.size, qn.quantize(t, x), x) for x in ins]


# ---- fp16 hashes -------------------------------------------------------------------------------

M64 = (1 << 64) - 1


def fnv1a64(words):
    """Standard byte-wise FNV-1a 64 over the little-endian bytes of words."""
    h = 0xCBF29CE484222325
    for byte in words.astype(words.dtype.newbyteorder("<")).tobytes():
        h = ((h ^ byte) * 0x100000001B3) & M64
    return h


def splitmix_sample(seed, n):
    """The f32 bit patterns described in the header (uint32 [n])."""
    with np.errstate(over="ignore"):
        s = (np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = s
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    uniform = (z & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    exp = (np.uint64(100) + (z >> np.uint64(32)) % np.uint64(46)).astype(np.uint32)
    ranged = ((z >> np.uint64(63)).astype(np.uint32) << 31) | (exp << 23) | \
             (z & np.uint64(0x7FFFFF)).astype(np.uint32)
    return np.where(np.arange(n) % 2 == 0, uniform, ranged).astype(np.uint32)


def canon_f16_nan(h):
    h = h.astype(np.uint16)
    nan = ((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0)
    return np.where(nan, (h & 0x8000) | 0x7E00, h).astype(np.uint16)


def fp16_hashes():
    all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f16_all = all16.view(np.float16).astype(np.float32).view(np.uint32)
    bf16_all = np.frombuffer(qn.dequantize(qn.BF16, all16.astype("<u2").tobytes(), 65536)
                             .tobytes(), dtype=np.uint32)
    sample = splitmix_sample(SAMPLE_SEED, SAMPLE_N).view(np.float32)
    with np.errstate(all="ignore"):
        to16 = canon_f16_nan(sample.astype(np.float16).view(np.uint16))
    tobf = qn.f32_to_bf16_bits(sample)
    return [("f16_to_f32_all", 65536, fnv1a64(f16_all)),
            ("bf16_to_f32_all", 65536, fnv1a64(bf16_all)),
            ("f32_to_f16", SAMPLE_N, fnv1a64(to16)),
            ("f32_to_bf16", SAMPLE_N, fnv1a64(tobf))]


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240611)
    for t in (qn.F32, qn.F16, qn.BF16, qn.Q4_0, qn.Q8_0, qn.Q4_K, qn.Q6_K):
        write_cases(os.path.join(OUT, f"dequant_{NAMES[t]}.bin"), dequant_cases(rng, t))
    # the formats added later draw from their own generator (the older fixtures stay as they were)
    rng2 = np.random.default_rng(20261201)
    for t in (qn.Q4_1, qn.Q5_0, qn.Q5_1, qn.Q2_K, qn.Q3_K, qn.Q5_K, qn.IQ4_NL, qn.IQ4_XS):
        write_cases(os.path.join(OUT, f"dequant_{NAMES[t]}.bin"), dequant_cases(rng2, t))
    with np.errstate(all="ignore"):
        for t in (qn.F32, qn.F16, qn.BF16, qn.Q8_0, qn.Q4_0):
            write_cases(os.path.join(OUT, f"quant_{NAMES[t]}.bin"), quant_cases(rng, t))
        # plus signalling NaNs (numpy keeps them signalling: the C test checks NaN-ness only)
        edge = np.concatenate([f16_inputs(), np.array([0x7F800001, 0xFFA00000, 0x7FBFFFFF],
                                                      dtype=np.uint32)])
        edge16 = bits_f32(edge).astype(np.float16).view(np.uint16)
    with open(os.path.join(OUT, "fp16_edge.bin"), "wb") as f:
        for a, b in zip(edge.tolist(), edge16.tolist()):
            f.write(struct.pack("<IH", a, b))
    with open(os.path.join(OUT, "fp16_hashes.txt"), "w") as f:
        f.write(f"# FNV-1a 64 of numpy conversions; sample seed {SAMPLE_SEED:#x} "
                f"(see tests/ref/gen_quant_fixtures.py)\n")
        for name, n, h in fp16_hashes():
            f.write(f"{name} {n} {h:016x}\n")
    total = sum(os.path.getsize(os.path.join(OUT, p)) for p in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
