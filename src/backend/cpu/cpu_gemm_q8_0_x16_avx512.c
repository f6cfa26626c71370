/* cpu_gemm_q8_0_x16_avx512.c: the AVX-512 VNNI matmul of Q8_0 weights packed as
 * TENSOR_LAYOUT_Q8_0_X16 (cpu_pack.c) against prepared Q8_0 activations (cpu_internal.h).
 * A weight group (16 blocks) is eight 64-byte vectors whose lane j holds 4 unsigned quants of
 * block j, already in the activations' transposed order, so vpdpbusd reads it straight from
 * memory: no transpose, no gather (the plain Q8_0 kernel in cpu_kernels_avx512.c decodes every
 * group in every call). Tiles of 4 weight rows x up to 4 activation rows: per 64-byte step, 4
 * activation vectors and 4 weight vectors feed 16 vpdpbusd; the 4 weight rows stay in L1 while
 * the activation tiles pass, and the next rows are prefetched. Each (weight row, activation row)
 * pair goes through exactly the integer and f32 operations of the plain kernel (offset removal
 * through the block sums, one fma of d_w * d_x per group, the shared 16-lane reduction tree), so
 * packed and plain weights give the same bits, for any tile, row range or output range.
 * Q4_0 packed as TENSOR_LAYOUT_Q4_0_X16 takes the same tiles (Q4): a group is four 64-byte
 * vectors whose lane j holds 4 quant bytes of block j as stored, and weight vector k is the low
 * nibbles of vector k (values 4k .. 4k+3) or, for k >= 4, the high nibbles of vector k - 4 (a mask
 * and a shift, no transpose); the offset is 8 instead of 128. A call of more than Q4X_UNPACK_ROWS
 * activation rows first unpacks each block of 4 weight rows into a stack buffer laid out like
 * Q8_0_X16 (values 0..15, the scales after them), which all its tiles then read as Q8_0 tiles do:
 * the nibbles are split once per block instead of once per tile. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_hsum_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

/* The weight rows of the block of 4 this many blocks ahead are prefetched while a block is
 * computed, a few cache lines per 64-byte step spread over all its tiles (a burst of prefetches
 * at the start of a block fills the miss buffers and stalls the tile). */
#ifndef Q8X_PREFETCH_BLOCKS
#define Q8X_PREFETCH_BLOCKS 2
#endif
/* Q8X_PREFETCH_HINT: a tile of 3-4 activation rows computes a block ~2x longer than one of 1-2,
 * and its 16 int + 16 float accumulators leave L1 no room: prefetched into L1 the rows ahead
 * evicted the block in use. Into L2 for those tiles (one thread, [1024 x 65536] weights in huge
 * pages, best of 3, twice): 4 rows 4.4-5.7 -> 3.0-3.5 ms, 8 rows 6.5-7.3 -> 3.6-4.0 ms, 16 rows
 * 7.5 -> 7.0-7.2 ms; into L2 for all tiles would cost the 1-2 row tiles (decode) 2.5 -> 3.5 ms
 * (Zen 4). On Intel L2 is the faster for those too: act->pf_l1_rows (cpu_kernels.pf_l1_rows). */

/* Activation rows of a Q4_0_X16 call above which the weights are unpacked once per block of 4 rows
 * (mm_x16), and the largest n_in with a buffer (4 rows of n_in * 34 / 32 bytes on the stack). */
#ifndef Q4X_UNPACK_ROWS
#define Q4X_UNPACK_ROWS 4
#endif
#define Q4X_BUF_MAX_IN 8192

/* The tiles' weight kinds: Q8_0_X16 rows; Q4_0_X16 rows (nibbles split in registers); Q4_0 rows
 * unpacked by mm_x16 (Q8_0_X16 bytes holding the values 0..15). */
enum { Q8X_W_Q8 = 0, Q8X_W_Q4 = 1, Q8X_W_Q4_BYTES = 2 };

/* Weight rows o .. o + 3 (row i at w + wo[i] bytes: rows past the range repeat the last one and
 * are not stored) against activation rows r0 .. r0 + NT - 1; dst[(r0 + r) * ds + o + i] for
 * i < no. WK: Q8X_W_*. */
T512 INL void q8x_tile(const uint8_t *w, const int WK, const size_t wo[4], const cpu_act *act, int64_t r0,
                       const int NT, float *dst, int64_t ds, int64_t o, int no, const char *pf, int64_t pf_lines) {
    const int64_t ng = act->row_len / CPU_Q8_0_GROUP_VALUES, nbp = act->row_len / QK8_0;
    const int64_t n_in = act->n_in;
    const int Q4 = WK == Q8X_W_Q4; /* nibbles to split */
    /* bytes of a weight group's quants, and where a row's scales start */
    const int64_t gbytes = Q4 ? CPU_Q8_0_GROUP_VALUES / 2 : CPU_Q8_0_GROUP_VALUES, sc_at = Q4 ? n_in / 2 : n_in;
    const __m512i low = _mm512_set1_epi8(0x0f);
    /* prefetch pf_lines cache lines from pf, about the same number in each 64-byte step */
    const int64_t pf_step = (pf_lines + 8 * ng - 1) / (8 * ng);
    int64_t pf_done = 0;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) acc[i][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const int8_t *xq[4];
        __m512i is[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) {
            xq[r] = act->qs + (r0 + r) * act->row_len + g * CPU_Q8_0_GROUP_VALUES;
            /* remove the +128 (Q4_0: +8) of the weights: sum (q + 128) x = sum q x + 128 sum x */
            const __m512i init =
                _mm512_slli_epi32(_mm512_loadu_si512(act->ns + (r0 + r) * nbp + g * CPU_Q8_0_GROUP), WK != Q8X_W_Q8 ? 3 : 7);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) is[i][r] = init;
        }
        const uint8_t *wg = w + g * gbytes;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            for (int64_t l = 0; l < pf_step && pf_done < pf_lines; l++, pf_done++) {
                /* into L1 for tiles of up to act->pf_l1_rows rows, else into L2 (cpu_kernels) */
                if (NT <= act->pf_l1_rows) _mm_prefetch(pf + 64 * pf_done, _MM_HINT_T0);
                else _mm_prefetch(pf + 64 * pf_done, _MM_HINT_T1);
            }
            __m512i x[4];
#pragma GCC unroll 4
            for (int r = 0; r < NT; r++) {
                x[r] = _mm512_loadu_si512(xq[r] + 64 * k);
                __asm__("" : "+v"(x[r])); /* one load, four uses */
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                /* no asm barrier on wk: with one, GCC stored the last row's vector to the stack
                 * at every step (a dead store; zmm stores take vpdpbusd's slots on Zen 4). Zen 4
                 * VM, [1024 x 3072]: 512 rows 1 thread 307-308 -> 321-325 GOP/s (3 alternated
                 * rounds), 2 threads 16 rows 610 -> 641, 128 rows 641 -> 657; 1 row equal */
                __m512i wk;
                if (!Q4) {
                    wk = _mm512_loadu_si512(wg + wo[i] + 64 * k);
                } else { /* the nibbles of vector k % 4: low for k < 4, high for k >= 4 */
                    const uint8_t *src = wg + wo[i] + 64 * (k % 4);
                    /* loaded again at k >= 4: kept from k - 4, the 16 vectors spilled */
                    if (k >= 4) __asm__("" : "+r"(src));
                    const __m512i c = _mm512_loadu_si512(src);
                    wk = _mm512_and_si512(k < 4 ? c : _mm512_srli_epi16(c, 4), low);
                }
#pragma GCC unroll 4
                for (int r = 0; r < NT; r++) is[i][r] = _mm512_dpbusd_epi32(is[i][r], wk, x[r]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) {
            const __m512 dx = _mm512_loadu_ps(act->d + (r0 + r) * nbp + g * CPU_Q8_0_GROUP);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + wo[i] + sc_at + 32 * g)));
                acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[i][r]), _mm512_mul_ps(dw, dx), acc[i][r]);
            }
        }
    }
    /* all sums of the tile in one reduction tree (lane r * 4 + i; the same bits as hsum16_one) */
    __m512 flat[16];
#pragma GCC unroll 4
    for (int r = 0; r < NT; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) flat[r * 4 + i] = acc[i][r];
    float tmp[16] __attribute__((aligned(64)));
    _mm512_store_ps(tmp, hsum16_tree(flat, 4 * NT));
    if (no == 4) {
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) _mm_storeu_ps(dst + (r0 + r) * ds + o, _mm_load_ps(tmp + 4 * r));
    } else {
        for (int r = 0; r < NT; r++)
            for (int i = 0; i < no; i++) dst[(r0 + r) * ds + o + i] = tmp[r * 4 + i];
    }
}

/* Q4_0_X16 rows wrow + i * w_nb1 (i < no) -> n rows of Q8_0_X16 bytes holding the values 0..15
 * at buf + i * bs (the scales after them; rows >= no not written). */
T512 INL void q4x_unpack(const uint8_t *wrow, size_t w_nb1, int no, int64_t n_in, uint8_t *buf, size_t bs) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int i = 0; i < no; i++) {
        const uint8_t *s = wrow + (size_t)i * w_nb1;
        uint8_t *d = buf + (size_t)i * bs;
        for (int64_t g = 0; g < n_in / CPU_Q8_0_GROUP_VALUES; g++) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i c = _mm512_loadu_si512(s + g * (CPU_Q8_0_GROUP_VALUES / 2) + 64 * k);
                _mm512_store_si512(d + g * CPU_Q8_0_GROUP_VALUES + 64 * k, _mm512_and_si512(c, low));
                _mm512_store_si512(d + g * CPU_Q8_0_GROUP_VALUES + 64 * (k + 4),
                                   _mm512_and_si512(_mm512_srli_epi16(c, 4), low));
            }
        }
        memcpy(d + n_in, s + n_in / 2, (size_t)(n_in / QK4_0) * 2);
    }
}

T512 INL void mm_x16(const void *w, size_t w_nb1, const int Q4, const cpu_act *act, int64_t r0, int64_t nr,
                     float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const uint8_t *wb = (const uint8_t *)w;
    const int64_t n_tiles = (nr + 3) / 4;
    const int64_t n_in = act->n_in;
    /* Q4_0 with more rows than Q4X_UNPACK_ROWS: each block of 4 weight rows unpacked once */
    const bool unpack = Q4 && nr > Q4X_UNPACK_ROWS && n_in <= Q4X_BUF_MAX_IN;
    const size_t bs = ((size_t)(n_in / QK8_0) * sizeof(block_q8_0) + 63) & ~(size_t)63;
    /* [4 rows x bs], ~35 KiB of stack (unused, and dropped by the compiler, in the Q8_0 instance) */
    uint8_t buf[4 * (Q4X_BUF_MAX_IN / QK8_0) * sizeof(block_q8_0) + 64] __attribute__((aligned(64)));
    for (int64_t o = o0; o < o1; o += 4) {
        const int no = o1 - o >= 4 ? 4 : (int)(o1 - o);
        /* the rows of the block Q8X_PREFETCH_BLOCKS ahead (within the range), a share per tile */
        const int64_t p0 = o + 4 * Q8X_PREFETCH_BLOCKS, p1 = p0 + 4 < o1 ? p0 + 4 : o1;
        const int64_t pf_lines = p1 > p0 ? (int64_t)(((size_t)(p1 - p0) * w_nb1 + 63) / 64) : 0;
        const char *pf = (const char *)wb + (size_t)(p0 < o1 ? p0 : o) * w_nb1;
        const uint8_t *wrow = wb + (size_t)o * w_nb1;
        size_t wo[4];
        for (int i = 0; i < 4; i++) wo[i] = (size_t)(i < no ? i : no - 1) * (unpack ? bs : w_nb1);
        int64_t rt = r0, t = 0;
#define PF_SHARE pf + 64 * (pf_lines * t / n_tiles), pf_lines * (t + 1) / n_tiles - pf_lines * t / n_tiles
#define TILES(W, WK)                                                                                   \
    do {                                                                                               \
        for (; rt + 4 <= r0 + nr; rt += 4, t++) q8x_tile(W, WK, wo, act, rt, 4, dst, ds, o, no, PF_SHARE); \
        switch (r0 + nr - rt) {                                                                        \
        case 1: q8x_tile(W, WK, wo, act, rt, 1, dst, ds, o, no, PF_SHARE); break;                      \
        case 2: q8x_tile(W, WK, wo, act, rt, 2, dst, ds, o, no, PF_SHARE); break;                      \
        case 3: q8x_tile(W, WK, wo, act, rt, 3, dst, ds, o, no, PF_SHARE); break;                      \
        default: break;                                                                                \
        }                                                                                              \
    } while (0)
        if (!Q4) {
            TILES(wrow, Q8X_W_Q8);
        } else if (unpack) {
            q4x_unpack(wrow, w_nb1, no, n_in, buf, bs);
            TILES(buf, Q8X_W_Q4_BYTES);
        } else {
            TILES(wrow, Q8X_W_Q4);
        }
#undef TILES
#undef PF_SHARE
    }
}

T512 void cpu_mm_q8_0_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                                 int64_t ds, int64_t o0, int64_t o1) {
    mm_x16(w, w_nb1, 0, act, r0, nr, dst, ds, o0, o1);
}

T512 void cpu_mm_q4_0_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                                 int64_t ds, int64_t o0, int64_t o1) {
    mm_x16(w, w_nb1, 1, act, r0, nr, dst, ds, o0, o1);
}

#else
void cpu_mm_q8_0_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_q8_0_x16_ref(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
void cpu_mm_q4_0_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_q4_0_x16_ref(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
#endif
