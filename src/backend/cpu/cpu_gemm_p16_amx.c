/* cpu_gemm_p16_amx.c: F16 / BF16 weights (packed as TENSOR_LAYOUT_P16_X16, cpu_pack.c) times
 * CPU_DOT_BF16T activations on AMX-BF16 tiles, for every row count (decode included), and the
 * AVX-512 preparation of those activations.
 *
 * Arithmetic: a tile product (tdpbf16ps) multiplies bf16 values exactly and adds the products
 * into f32 sums. An F16 value (11 significant bits) is the exact sum of two bf16 values, its top
 * 8 bits (h) and the rest (l, at most 3 bits), so the product of an f16 weight w and an f16-rounded
 * activation x is the sum of the four exact products wh xh + wh xl + wl xh + wl xl: four tile
 * products per block of 32 inputs, into one f32 sum per (activation row, output). A BF16 weight
 * against bf16-rounded activations needs one. The activations are rounded as the plain F16 /
 * BF16 kernels round them (nearest even), so the products are those of the same values; only the
 * order and the rounding of the sums differ from the plain kernels' FMA chains (measured here: an
 * error below 1e-7 of the sum of |w x| at n_in 1024-3072). The tile unit's sums do not depend on
 * the other rows of the tile or on how many rows it has (tested bit for bit, 1 row against 130),
 * and every row count of a backend with AMX-BF16 takes this kernel, so a row's result does not
 * depend on its batch: a verify gives decode's bits.
 *
 * Tiles (16 rows x 64 bytes): A = 16 activation rows x 32 bf16 (th or tl of CPU_DOT_BF16T, rows
 * in place, stride row_len), B = 16 lines (input pairs) x 16 weight rows (the packed block; F16:
 * split into its h and l tiles by the vector unit first), C = [16 activation rows][16 outputs]
 * f32. Two activation tiles sets share the B tiles: tiles 0, 1 B (h, l), 2, 3 set 0's A (th, tl),
 * 4, 5 set 1's, 6 and 7 their C. A call's last rows (fewer than 16) go on set 1 configured with
 * that many rows. The tile intrinsics are asm statements without memory operands, so compiler
 * barriers fence the vector stores of the B tiles before the tile loads, and the tile stores
 * before the vector loads (as in cpu_gemm_kquant_amx.c). */
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define TBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-bf16")))
#define INL static inline __attribute__((always_inline))
#define P16_BARRIER() __asm__ volatile("" ::: "memory")

#include "backend/cpu/cpu_round_avx512.h"
/* Weight blocks ahead that the kernel prefetches into L2 (past a group's end: the next group's).
 * [1024 x 3072] F16 from memory, 2 threads, ms, 0 / 2 / 4 / 8 / 16 ahead, 2 rounds: 1 row
 * 0.34-0.35 / 0.31-0.32 / 0.32 / 0.32 / 0.31-0.32, 16 rows 0.395 / 0.37 / 0.34-0.35 / 0.34-0.37 /
 * 0.37-0.38. */
#ifndef P16_PF
#define P16_PF 4
#endif

/* ldtilecfg's 64-byte operand: palette 1, tiles 0..7 of 64-byte rows. */
typedef struct p16_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} p16_cfg;

/* One packed F16 block (1024 bytes: line p = input 2p of the 16 rows, then input 2p + 1) into the
 * B tiles bh, bl: dword c of line p = the pair (2p, 2p + 1) of row c, as bf16 h (l) parts. */
TBF INL void p16_decode_f16(const uint8_t *src, uint8_t *bh, uint8_t *bl) {
#pragma GCC unroll 16
    for (int p = 0; p < 16; p++) {
        const __m512 e = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(src + 64 * p)));
        const __m512 o = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(src + 64 * p + 32)));
        __m512i eh, el, oh, ol;
        split_bf16_512(e, &eh, &el);
        split_bf16_512(o, &oh, &ol);
        /* the pair's first value in the low 16 bits, the second in the high 16 */
        _mm512_store_si512(bh + 64 * p, _mm512_or_si512(_mm512_srli_epi32(eh, 16), oh));
        _mm512_store_si512(bl + 64 * p, _mm512_or_si512(_mm512_srli_epi32(el, 16), ol)); /* l: low 16 bits 0 */
    }
}

/* Rows r0 .. r0 + nr - 1, outputs o0 .. o1 - 1 (o0 % 16 == 0). F16: 4 products per block, else 1. */
TBF INL void p16_rows(const void *w, size_t w_nb1, const int F16, const cpu_act *act, int64_t r0, int64_t nr,
                      float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t ld = act->row_len, nb = ld / 32;
    const size_t stride = (size_t)ld * sizeof(uint16_t);
    const int rem = (int)(nr % 16);
    uint8_t bt[2][1024] __attribute__((aligned(64))); /* F16: the B tiles h, l of a block */
    float cb[2][256] __attribute__((aligned(64)));
    p16_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = (uint8_t)(rem > 0 && (i == 4 || i == 5 || i == 7) ? rem : 16); /* set 1: A 4, 5 and C 7 */
    }
    _tile_loadconfig(&cfg);
    for (int64_t o = o0; o < o1; o += 16) {
        const int nw = o1 - o >= 16 ? 16 : (int)(o1 - o);
        const uint8_t *grp = (const uint8_t *)w + (size_t)o * w_nb1; /* the group's first block */
        for (int64_t r = r0; r < r0 + nr;) {
            /* rem == 0: 16 rows on set 0 and the next 16 on set 1 (while 32 are left); else whole
             * 16s on set 0 alone and the last rem rows on set 1, with the last whole 16 */
            const int64_t left = r0 + nr - r;
            const bool s0 = rem == 0 || left > rem, s1 = rem == 0 ? left >= 32 : left <= 16 + rem;
            const int n1 = !s1 ? 0 : rem == 0 ? 16 : rem;
            const int64_t ra = r, rb = s0 ? r + 16 : r;
            if (s0) _tile_zero(6);
            if (s1) _tile_zero(7);
            const uint16_t *a0h = act->th + ra * ld, *a0l = act->tl + ra * ld;
            const uint16_t *a1h = act->th + rb * ld, *a1l = act->tl + rb * ld;
            for (int64_t t = 0; t < nb; t++) {
                const uint8_t *blk = grp + (size_t)t * 1024;
                if (P16_PF > 0) { /* the weight stream P16_PF blocks ahead into L2 (past the group: the next one's) */
                    for (int l = 0; l < 16; l++) _mm_prefetch((const char *)blk + P16_PF * 1024 + 64 * l, _MM_HINT_T1);
                }
                if (F16) {
                    p16_decode_f16(blk, bt[0], bt[1]);
                    P16_BARRIER(); /* the B tiles' vector stores before the tile loads */
                    _tile_loadd(0, bt[0], 64);
                    _tile_loadd(1, bt[1], 64);
                } else {
                    _tile_loadd(0, blk, 64);
                }
                if (s0) {
                    _tile_loadd(2, a0h + 32 * t, stride);
                    if (F16) _tile_loadd(3, a0l + 32 * t, stride);
                }
                if (s1) {
                    _tile_loadd(4, a1h + 32 * t, stride);
                    if (F16) _tile_loadd(5, a1l + 32 * t, stride);
                }
                /* per set: xh wh, xh wl, xl wh, xl wl (F16), in this order */
                if (s0) _tile_dpbf16ps(6, 2, 0);
                if (s1) _tile_dpbf16ps(7, 4, 0);
                if (F16) {
                    if (s0) _tile_dpbf16ps(6, 2, 1);
                    if (s1) _tile_dpbf16ps(7, 4, 1);
                    if (s0) _tile_dpbf16ps(6, 3, 0);
                    if (s1) _tile_dpbf16ps(7, 5, 0);
                    if (s0) _tile_dpbf16ps(6, 3, 1);
                    if (s1) _tile_dpbf16ps(7, 5, 1);
                }
                P16_BARRIER(); /* the tile loads before the next block's vector stores */
            }
            if (s0) _tile_stored(6, cb[0], 64);
            if (s1) _tile_stored(7, cb[1], 64);
            P16_BARRIER(); /* the tile stores before the vector loads of cb */
            const __mmask16 mask = (__mmask16)((1u << nw) - 1);
            if (s0) {
                for (int i = 0; i < 16; i++) _mm512_mask_storeu_ps(dst + (ra + i) * ds + o, mask, _mm512_load_ps(cb[0] + 16 * i));
            }
            for (int i = 0; i < n1; i++) _mm512_mask_storeu_ps(dst + (rb + i) * ds + o, mask, _mm512_load_ps(cb[1] + 16 * i));
            P16_BARRIER(); /* the vector loads of cb before the next tile stores */
            r += (s0 ? 16 : 0) + n1;
        }
    }
    _tile_release();
}

TBF void cpu_mm_f16_p16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    p16_rows(w, w_nb1, 1, act, r0, nr, dst, ds, o0, o1);
}

TBF void cpu_mm_bf16_p16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    p16_rows(w, w_nb1, 0, act, r0, nr, dst, ds, o0, o1);
}

/* Row r of a CPU_DOT_BF16T act: x rounded to f16 (F16) or bf16, as th (and tl), zeros past n_in.
 * The same values as cpu_act_row_f16_tile_ref / cpu_act_row_bf16_tile_ref. */
TBF INL void p16_act_row(cpu_act *act, int64_t r, const float *x, const int F16) {
    const int64_t n = act->n_in, ld = act->row_len;
    uint16_t *th = act->th + r * ld, *tl = act->tl + r * ld;
    const __m512i expo = _mm512_set1_epi32(0x7f800000);
    for (int64_t i = 0; i < ld; i += 16) {
        const __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : i < n ? (__mmask16)((1u << (n - i)) - 1) : 0;
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512i h, l = _mm512_setzero_si512();
        if (F16) {
            split_bf16_512(round_f16_512(v), &h, &l);
            /* Inf / NaN: th alone (Inf - Inf would make tl a NaN) */
            const __mmask16 fin = _mm512_cmpneq_epi32_mask(_mm512_and_si512(h, expo), expo);
            l = _mm512_maskz_mov_epi32(fin, l);
        } else {
            h = _mm512_castps_si512(round_bf16_512(v));
        }
        _mm256_storeu_si256((__m256i *)(th + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
        if (F16) _mm256_storeu_si256((__m256i *)(tl + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(l, 16)));
    }
}

TBF void cpu_act_row_f16_tile_512(cpu_act *act, int64_t r, const float *x) { p16_act_row(act, r, x, 1); }
TBF void cpu_act_row_bf16_tile_512(cpu_act *act, int64_t r, const float *x) { p16_act_row(act, r, x, 0); }

#else
void cpu_mm_f16_p16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                        int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_p16_x16_ref(QUANT_TYPE_F16, w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
void cpu_mm_bf16_p16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_p16_x16_ref(QUANT_TYPE_BF16, w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
void cpu_act_row_f16_tile_512(cpu_act *act, int64_t r, const float *x) { cpu_act_row_f16_tile_ref(act, r, x); }
void cpu_act_row_bf16_tile_512(cpu_act *act, int64_t r, const float *x) { cpu_act_row_bf16_tile_ref(act, r, x); }
#endif
