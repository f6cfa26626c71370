/* cpu_gemm_float_avx2.c: AVX2 + FMA + F16C matmul of F32 / F16 / BF16 weights with f32 activation
 * rows (f16- / bf16-rounded for F16 / BF16, cpu_act.c), from decode (1 row) to prefill batches.
 *
 * Arithmetic (the same for every row count: batch invariance, tested bit for bit): the dot
 * product of weight row o and activation row r keeps 8 f32 lanes, lane l = the FMA chain over
 * inputs i = l, l + 8, ... below n8 = n_in rounded down to 8, from 0; the lanes are added by
 * fg2_hsum8, then the inputs n8 .. n_in - 1 are added one at a time (w * x, then +).
 *
 * Register tile: 2 weight rows x NT (<= 6) activation rows, 12 accumulators + 2 weight vectors + 1
 * activation vector of the 16 registers. Cache blocking as in cpu_gemm_float_avx512.c: a group of
 * FG2_OB weight rows against one row tile at a time over blocks of FG2_KC inputs, so the row tile's
 * activations stay in L1 while the group's weights stream from L2; accumulators of the group's
 * tiles wait in a small buffer between input blocks (the chains continue unchanged), and the first
 * row tile prefetches the weights FG2_PF_ROWS rows ahead (why: cpu_gemm_float_avx512.c).
 * Measured (Zen 5 forced to AVX2, one core, thread CPU time): 16-512 rows 45-60 -> 70-87 GFLOP/s
 * against the previous 1 weight row x 8 activation rows loop (the FMA peak with 256-bit vectors
 * is ~112). */
#include "backend/cpu/cpu_internal.h"
#include "base/fp16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

#define FG2_WR 2     /* weight rows per register tile */
#define FG2_NT 6     /* activation rows per register tile */
#define FG2_KC 1024  /* inputs per block: FG2_NT rows x FG2_KC f32 = 24 KiB of activations */
#define FG2_OB 32    /* weight rows per group (a multiple of FG2_WR) */
#define FG2_PF_ROWS 8 /* weight rows ahead that the first row tile prefetches (Zen 2, 1 row from
                       * memory: 8 rows 0.267 ms, 16 rows 0.278, 64 rows 0.301 on F16 1024 x 3072) */

/* Sum of the 8 lanes: (l + l^4), then (l + l^2), then (l + l^1) (as hsum8 in cpu_kernels_avx2.c). */
T2 INL float fg2_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 weights of a row from i as f32. WT: 0 f32, 1 f16, 2 bf16. */
T2 INL __m256 fg2_load_w8(const void *p, int64_t i, const int WT) {
    switch (WT) {
    case 0: return _mm256_loadu_ps((const float *)p + i);
    case 1: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    default:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    }
}

T2 INL float fg2_w_scalar(const void *p, int64_t i, const int WT) {
    switch (WT) {
    case 0: return ((const float *)p)[i];
    case 1: return fp16_to_fp32(((const uint16_t *)p)[i]);
    default: return bf16_to_fp32(((const uint16_t *)p)[i]);
    }
}

/* One register tile over inputs [k0, k1) (k1 <= n8): weight rows o, o + 1 (no = 1: only o) x
 * activation rows r0 .. r0 + NT - 1. The accumulators start at 0 when first, else from sv; they
 * are saved to sv unless last, when the sums (plus the scalar tail) go to dst. */
T2 INL void fg2_tile(const void *w, size_t w_nb1, const int WT, int no, const cpu_act *act, int64_t r0, const int NT,
                     int64_t k0, int64_t k1, bool first, bool last, __m256 *sv, float *dst, int64_t ds, int64_t o,
                     bool pf) {
    const int64_t n = act->n_in;
    const void *wr[FG2_WR];
#pragma GCC unroll 2
    for (int j = 0; j < FG2_WR; j++) wr[j] = (const char *)w + (size_t)(o + (j < no ? j : no - 1)) * w_nb1;
    const float *xr = act->f + r0 * n;
    __m256 acc[FG2_WR * FG2_NT];
#pragma GCC unroll 12
    for (int a = 0; a < FG2_WR * NT; a++) acc[a] = first ? _mm256_setzero_ps() : sv[a];
    /* pf: the same inputs of the rows FG2_PF_ROWS on are prefetched into L2, a line per row whenever this
     * tile's loads enter a new line (as in cpu_gemm_float_avx512.c) */
    const size_t pf_off = (size_t)FG2_PF_ROWS * w_nb1;
    const int64_t esz = WT == 0 ? 4 : 2, line_in = 64 / esz; /* inputs per cache line */
    for (int64_t i = k0; i < k1; i += 8) {
        __m256 wv[FG2_WR];
        if (pf && (i & (line_in - 1)) == 0) {
#pragma GCC unroll 2
            for (int j = 0; j < FG2_WR; j++)
                _mm_prefetch((const char *)((uintptr_t)wr[j] + pf_off + (uintptr_t)(i * esz)), _MM_HINT_T1);
        }
#pragma GCC unroll 2
        for (int j = 0; j < FG2_WR; j++) wv[j] = fg2_load_w8(wr[j], i, WT);
#pragma GCC unroll 6
        for (int r = 0; r < NT; r++) {
            const __m256 xv = _mm256_loadu_ps(xr + r * n + i);
#pragma GCC unroll 2
            for (int j = 0; j < FG2_WR; j++) acc[j * NT + r] = _mm256_fmadd_ps(wv[j], xv, acc[j * NT + r]);
        }
    }
    if (!last) {
#pragma GCC unroll 12
        for (int a = 0; a < FG2_WR * NT; a++) sv[a] = acc[a];
        return;
    }
    const int64_t n8 = n / 8 * 8;
#pragma GCC unroll 2
    for (int j = 0; j < FG2_WR; j++) {
        if (j >= no) break;
#pragma GCC unroll 6
        for (int r = 0; r < NT; r++) {
            float s = fg2_hsum8(acc[j * NT + r]);
            for (int64_t i = n8; i < n; i++) s += fg2_w_scalar(wr[j], i, WT) * xr[r * n + i];
            dst[(r0 + r) * ds + o + j] = s;
        }
    }
}

T2 INL void fg2_tile_nt(const void *w, size_t w_nb1, const int WT, int no, const cpu_act *act, int64_t r0, int nt,
                        int64_t k0, int64_t k1, bool first, bool last, __m256 *sv, float *dst, int64_t ds, int64_t o,
                        bool pf) {
    switch (nt) {
    case 1: fg2_tile(w, w_nb1, WT, no, act, r0, 1, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 2: fg2_tile(w, w_nb1, WT, no, act, r0, 2, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 3: fg2_tile(w, w_nb1, WT, no, act, r0, 3, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 4: fg2_tile(w, w_nb1, WT, no, act, r0, 4, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 5: fg2_tile(w, w_nb1, WT, no, act, r0, 5, k0, k1, first, last, sv, dst, ds, o, pf); break;
    default: fg2_tile(w, w_nb1, WT, no, act, r0, 6, k0, k1, first, last, sv, dst, ds, o, pf); break;
    }
}

/* dst[r * ds + o] for o in [o0, o1), r in [r0, r0 + nr) (the cpu_matmul_fn contract). */
T2 INL void fg2_matmul(const void *w, size_t w_nb1, const int WT, const cpu_act *act, int64_t r0, int64_t nr,
                       float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t n8 = act->n_in / 8 * 8;
    __m256 sv[FG2_OB / FG2_WR][FG2_WR * FG2_NT]; /* a group's accumulators between input blocks */
    for (int64_t ob = o0; ob < o1; ob += FG2_OB) {
        const int64_t oe = ob + FG2_OB < o1 ? ob + FG2_OB : o1;
        for (int64_t rt = r0; rt < r0 + nr; rt += FG2_NT) {
            const int nt = r0 + nr - rt >= FG2_NT ? FG2_NT : (int)(r0 + nr - rt);
            int64_t k0 = 0;
            do { /* at least one (empty) block when n_in < 8: the scalar tail is all */
                const int64_t k1 = k0 + FG2_KC < n8 ? k0 + FG2_KC : n8;
                for (int64_t o = ob; o < oe; o += FG2_WR) {
                    const int no = oe - o >= FG2_WR ? FG2_WR : (int)(oe - o);
                    fg2_tile_nt(w, w_nb1, WT, no, act, rt, nt, k0, k1, k0 == 0, k1 == n8, sv[(o - ob) / FG2_WR], dst,
                                ds, o, rt == r0); /* the first row tile prefetches (past o1 too) */
                }
                k0 = k1;
            } while (k0 < n8);
        }
    }
}

T2 void cpu_mm_f32_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                        int64_t ds, int64_t o0, int64_t o1) {
    fg2_matmul(w, w_nb1, 0, act, r0, nr, dst, ds, o0, o1);
}

T2 void cpu_mm_f16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                        int64_t ds, int64_t o0, int64_t o1) {
    fg2_matmul(w, w_nb1, 1, act, r0, nr, dst, ds, o0, o1);
}

T2 void cpu_mm_bf16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1) {
    fg2_matmul(w, w_nb1, 2, act, r0, nr, dst, ds, o0, o1);
}

#endif
