/* cpu_gemm_float_avx512.c: AVX-512 matmul of F32 / F16 / BF16 weights with f32 activation rows
 * (f16- / bf16-rounded for F16 / BF16, cpu_act.c), from decode (1 row) to prefill batches.
 *
 * Arithmetic (the same for every row count, so a row's result does not depend on the batch, the
 * tile or the thread: batch invariance, tested bit for bit): the dot product of weight row o and
 * activation row r keeps 16 f32 lanes, lane l = the FMA chain over inputs i = l, l + 16, ...
 * ascending from 0 (the last partial vector masked to zeros on both sides), then the 16 lanes are
 * added by hsum16_tree (cpu_hsum_avx512.h).
 *
 * Register tile: 4 weight rows x NT (<= 6) activation rows, 24 accumulators; per 16 inputs 4
 * weight vectors and NT activation vectors feed 4 * NT FMAs.
 * Cache blocking (batches): a group of FG_OB weight rows is taken against one row tile at a time
 * over a block of FG_KC inputs: the row tile's FG_KC inputs (24 KiB) stay in L1 while the group's
 * weights (f16 / bf16: half the bytes of the f32 activations) stream from L2, so an activation
 * vector is loaded from L2 once per FG_OB weight rows (the previous loop, 4 weight rows against
 * every row tile of the row block, loaded it once per 4). Rows longer than FG_KC keep the
 * accumulators of the group's tiles in a small buffer between input blocks (exact: the chains
 * continue unchanged). As the activations no longer need to fit L2, the driver gives these
 * kernels larger row blocks (cpu_matmul.c), so the weights come from L3 / memory fewer times.
 * Measured on Zen 5, one core, by thread CPU time (the machine was shared): n_in 3072 -> 1024 at
 * 128 / 512 rows 136 -> 172 GFLOP/s, n_in 1024 unchanged at 170-190, 16 rows ~200, of a measured
 * FMA peak of ~225; the register tile alone reaches ~205 (91%) when its data is in L1.
 * Prefetch: the first row tile of a group prefetches the same inputs of the rows FG_PF_ROWS on into
 * L2, a line per row as its loads enter a new line. Here (a 2-core VM sharing its L3) a process
 * keeps only ~12-16 MB in L3, so even the 15 MB embedded pair's weights come from memory every
 * step, and the hardware prefetchers leave the kernel waiting on the next rows. Into L2, not L1: a
 * 16-row tile's activations (16 KiB at n_in 256) and a group's weights (16 KiB) already fill L1,
 * and prefetching into it evicted them. A cold [256 x 4096] F16 matrix at 16 rows, one thread:
 * 0.61-0.74 ms without prefetch, 0.47-0.55 into L1, 0.37 into L2 (0.34 when cached). The embedded
 * pair's speculative steps (draft 15, 2 threads, 16 alternated pairs of runs): 1.10x less time
 * with the prefetch (interquartile range of the paired ratios 1.05-1.16); L1 vs L2 made no
 * difference measurable there (0.84-1.05).
 * AVX512_BF16's vdpbf16ps is not used: it rounds differently from this f32 FMA chain, which the
 * decode path (1 row) must share with the batches. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_hsum_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define FG_WR 4     /* weight rows per register tile (fg_store: one 128-bit lane) */
_Static_assert(FG_WR == 4, "fg_store stores the 4 sums of an activation row as one 128-bit lane");
#define FG_NT 6     /* activation rows per register tile */
#define FG_KC 1024  /* inputs per block: FG_NT rows x FG_KC f32 = 24 KiB of activations in L1 */
#define FG_OB 32    /* weight rows per group (a multiple of FG_WR) */
#define FG_PF_ROWS 64 /* weight rows ahead that the first row tile prefetches (two groups) */

/* 16 weights (the lanes of m; others 0) of a row as f32. WT: 0 f32, 1 f16, 2 bf16. */
T512 INL __m512 fg_load_w16(const void *p, int64_t i, const int WT, __mmask16 m) {
    switch (WT) {
    case 0: return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    case 1: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    default:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    }
}

/* Stores the sums of a 4 x NT tile's accumulators (acc[j * NT + r]: weight row o + j, activation
 * row r0 + r) for the weight rows j < no: up to 4 activation rows per reduction tree, in the order
 * r * 4 + j, so that the 4 sums of an activation row are one 128-bit lane, stored at once (the
 * tree's lane k is hsum16_one of its input k whatever the order: the same bits). Before, one tree
 * per 16 accumulators in the order j * NT + r and a scalar store each: at n_in 128 (the attention
 * scores) the stores were about as many uops as a quarter of the FMAs. */
T512 INL void fg_store(const __m512 *acc, const int NT, int no, float *dst, int64_t r0, int64_t ds, int64_t o) {
    const __mmask8 m = (__mmask8)((1u << no) - 1);
    float tmp[16] __attribute__((aligned(64)));
#pragma GCC unroll 2
    for (int rb = 0; rb < NT; rb += 4) {
        const int nr = NT - rb < 4 ? NT - rb : 4;
        __m512 flat[16];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
            for (int j = 0; j < FG_WR; j++) flat[r * FG_WR + j] = acc[j * NT + rb + r];
        _mm512_store_ps(tmp, hsum16_tree(flat, FG_WR * nr));
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            float *d = dst + (r0 + rb + r) * ds + o;
            if (no == FG_WR) _mm_storeu_ps(d, _mm_load_ps(tmp + 4 * r));
            else _mm_mask_storeu_ps(d, m, _mm_load_ps(tmp + 4 * r));
        }
    }
}

/* One register tile over inputs [k0, k1): weight rows o .. o + no - 1 (no <= 4; missing rows repeat
 * the last and are not stored) x activation rows r0 .. r0 + NT - 1. The accumulators start at 0
 * when first, else from sv; they are saved to sv unless last, when the sums go to dst. */
T512 INL void fg_tile(const void *w, size_t w_nb1, const int WT, int no, const cpu_act *act, int64_t r0, const int NT,
                      int64_t k0, int64_t k1, bool first, bool last, __m512 *sv, float *dst, int64_t ds, int64_t o,
                      bool pf) {
    const int64_t n = act->n_in;
    const void *wr[FG_WR];
#pragma GCC unroll 4
    for (int j = 0; j < FG_WR; j++) wr[j] = (const char *)w + (size_t)(o + (j < no ? j : no - 1)) * w_nb1;
    /* pf: the same inputs of the 4 rows FG_PF_ROWS on are prefetched into L2, a line per row
     * whenever this tile's loads enter a new line, so the weights of the groups ahead arrive from
     * L3 / memory while this group computes (its other row tiles find this group's in L1 / L2) */
    const size_t pf_off = (size_t)FG_PF_ROWS * w_nb1;
    const int64_t esz = WT == 0 ? 4 : 2, line_in = 64 / esz; /* inputs per cache line */
    const float *xr = act->f + r0 * n;
    __m512 acc[FG_WR * FG_NT];
#pragma GCC unroll 24
    for (int a = 0; a < FG_WR * NT; a++) acc[a] = first ? _mm512_setzero_ps() : sv[a];
    int64_t i = k0;
    for (; i + 16 <= k1; i += 16) {
        __m512 wv[FG_WR];
        if (pf && (i & (line_in - 1)) == 0) {
#pragma GCC unroll 4
            for (int j = 0; j < FG_WR; j++)
                _mm_prefetch((const char *)((uintptr_t)wr[j] + pf_off + (uintptr_t)(i * esz)), _MM_HINT_T1);
        }
#pragma GCC unroll 4
        for (int j = 0; j < FG_WR; j++) wv[j] = fg_load_w16(wr[j], i, WT, 0xffff);
#pragma GCC unroll 6
        for (int r = 0; r < NT; r++) {
            const __m512 xv = _mm512_loadu_ps(xr + r * n + i);
#pragma GCC unroll 4
            for (int j = 0; j < FG_WR; j++) acc[j * NT + r] = _mm512_fmadd_ps(wv[j], xv, acc[j * NT + r]);
        }
    }
    if (i < k1) { /* the row's last partial vector (k1 = n here: FG_KC is a multiple of 16) */
        const __mmask16 m = (__mmask16)((1u << (k1 - i)) - 1);
        __m512 wv[FG_WR];
#pragma GCC unroll 4
        for (int j = 0; j < FG_WR; j++) wv[j] = fg_load_w16(wr[j], i, WT, m);
#pragma GCC unroll 6
        for (int r = 0; r < NT; r++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, xr + r * n + i);
#pragma GCC unroll 4
            for (int j = 0; j < FG_WR; j++) acc[j * NT + r] = _mm512_fmadd_ps(wv[j], xv, acc[j * NT + r]);
        }
    }
    if (!last) {
#pragma GCC unroll 24
        for (int a = 0; a < FG_WR * NT; a++) sv[a] = acc[a];
        return;
    }
    fg_store(acc, NT, no, dst, r0, ds, o);
}

T512 INL void fg_tile_nt(const void *w, size_t w_nb1, const int WT, int no, const cpu_act *act, int64_t r0, int nt,
                         int64_t k0, int64_t k1, bool first, bool last, __m512 *sv, float *dst, int64_t ds, int64_t o,
                         bool pf) {
    switch (nt) {
    case 1: fg_tile(w, w_nb1, WT, no, act, r0, 1, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 2: fg_tile(w, w_nb1, WT, no, act, r0, 2, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 3: fg_tile(w, w_nb1, WT, no, act, r0, 3, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 4: fg_tile(w, w_nb1, WT, no, act, r0, 4, k0, k1, first, last, sv, dst, ds, o, pf); break;
    case 5: fg_tile(w, w_nb1, WT, no, act, r0, 5, k0, k1, first, last, sv, dst, ds, o, pf); break;
    default: fg_tile(w, w_nb1, WT, no, act, r0, 6, k0, k1, first, last, sv, dst, ds, o, pf); break;
    }
}

/* dst[r * ds + o] for o in [o0, o1), r in [r0, r0 + nr) (the cpu_matmul_fn contract). */
T512 INL void fg_matmul(const void *w, size_t w_nb1, const int WT, const cpu_act *act, int64_t r0, int64_t nr,
                        float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t n = act->n_in;
    __m512 sv[FG_OB / FG_WR][FG_WR * FG_NT]; /* a group's accumulators between input blocks */
    for (int64_t ob = o0; ob < o1; ob += FG_OB) {
        const int64_t oe = ob + FG_OB < o1 ? ob + FG_OB : o1;
        for (int64_t rt = r0; rt < r0 + nr; rt += FG_NT) {
            const int nt = r0 + nr - rt >= FG_NT ? FG_NT : (int)(r0 + nr - rt);
            for (int64_t k0 = 0; k0 < n; k0 += FG_KC) {
                const int64_t k1 = k0 + FG_KC < n ? k0 + FG_KC : n;
                for (int64_t o = ob; o < oe; o += FG_WR) {
                    const int no = oe - o >= FG_WR ? FG_WR : (int)(oe - o);
                    /* the first row tile prefetches FG_PF_ROWS rows on (past o1 too: the next
                     * chunk's, often taken next by this thread; a prefetch never faults) */
                    const bool pf = rt == r0;
                    fg_tile_nt(w, w_nb1, WT, no, act, rt, nt, k0, k1, k0 == 0, k1 == n, sv[(o - ob) / FG_WR], dst, ds,
                               o, pf);
                }
            }
        }
    }
}

T512 void cpu_mm_f32_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    fg_matmul(w, w_nb1, 0, act, r0, nr, dst, ds, o0, o1);
}

T512 void cpu_mm_f16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    fg_matmul(w, w_nb1, 1, act, r0, nr, dst, ds, o0, o1);
}

T512 void cpu_mm_bf16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    fg_matmul(w, w_nb1, 2, act, r0, nr, dst, ds, o0, o1);
}

#endif
