/* cpu_decode_ext.h: AVX2 block decoders shared by the AVX2 and AVX-512 kernels of the added weight
 * types (cpu_kernels_ext_avx2.c, cpu_kernels_ext_avx512.c). Each turns one block into int8 values
 * (in weight order) plus the factors the integer dot products are scaled with:
 * - 32-blocks (Q4_1, Q5_0, Q5_1, IQ4_NL): w_j = d * v_j + m, v in 0..31 (unsigned) or, for IQ4_NL
 *   in the signed variant, the table value itself (m = 0). Unsigned IQ4_NL stores value + 128 and
 *   m = -128 d; Q5_0 stores q (0..31) and m = -16 d.
 * - K super-blocks (Q2_K, Q3_K, Q5_K, IQ4_XS): 256 values, an int16 scale sc and min mn per 16
 *   values: w = d * sc * v - dmin * mn, so that sum w x = d dx sum_j sc_j (v_j . x_j)
 *   - dmin dx sum_j mn_j bsum_j with the Q8_K sums of 16. Q3_K stores q + 4 (0..7) with mn = 4 sc
 *   and dmin = d; unsigned IQ4_XS stores value + 128 with mn = 128 sc and dmin = d.
 * Also the 8x8 dword transpose every AVX2 kernel file uses (dx_transpose8).
 * Functions are always_inline with the AVX2 target, so AVX-512 callers inline them too. */
#ifndef DFL_BACKEND_CPU_DECODE_EXT_H
#define DFL_BACKEND_CPU_DECODE_EXT_H

#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define DX_T2 __attribute__((target("avx2,fma,f16c")))
#define DX_INL static inline __attribute__((always_inline))

/* One decoded K super-block. */
typedef struct kdec {
    int8_t v[QK_K] __attribute__((aligned(64))); /* values, weight order */
    int16_t sc[16] __attribute__((aligned(32))); /* scale of each 16 values */
    int16_t mn[16] __attribute__((aligned(32))); /* min of each 16 values */
    float d, dmin;
} kdec;

DX_T2 DX_INL float dx_f16(uint16_t h) { return _cvtsh_ss(h); }

/* Byte j (0..31) = 0x10 where bit j of qh is set, else 0. */
DX_T2 DX_INL __m256i dx_bits_to_0x10(uint32_t qh) {
    __m256i v = _mm256_set1_epi32((int)qh);
    v = _mm256_shuffle_epi8(v, _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                                  0x0303030303030303));
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)); /* all bits but bit j%8 */
    v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* 16 nibble bytes -> 32 values: low nibbles (weights 0..15), then high nibbles (16..31). */
DX_T2 DX_INL __m256i dx_nibbles32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* The IQ4_NL table in both 128-bit lanes, +128 if unsigned. */
DX_T2 DX_INL __m256i dx_iq4_table(int unsigned_values) {
    __m128i t = _mm_loadu_si128((const __m128i *)quant_iq4nl_values);
    if (unsigned_values) t = _mm_add_epi8(t, _mm_set1_epi8((char)0x80));
    return _mm256_broadcastsi128_si256(t);
}

/* Decodes 32-block b of type T (QUANT_TYPE_*): values, d and m (see the header comment). */
DX_T2 DX_INL __m256i dx_block32(const void *blk, const uint32_t T, int unsigned_values, float *d, float *m) {
    switch (T) {
    case QUANT_TYPE_Q4_1: {
        const block_q4_1 *b = blk;
        *d = dx_f16(b->d);
        *m = dx_f16(b->m);
        return dx_nibbles32(b->qs);
    }
    case QUANT_TYPE_Q5_0: {
        const block_q5_0 *b = blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        *d = dx_f16(b->d);
        *m = -16.0f * *d;
        return _mm256_or_si256(dx_nibbles32(b->qs), dx_bits_to_0x10(qh));
    }
    case QUANT_TYPE_Q5_1: {
        const block_q5_1 *b = blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        *d = dx_f16(b->d);
        *m = dx_f16(b->m);
        return _mm256_or_si256(dx_nibbles32(b->qs), dx_bits_to_0x10(qh));
    }
    default: { /* IQ4_NL */
        const block_iq4_nl *b = blk;
        *d = dx_f16(b->d);
        *m = unsigned_values ? -128.0f * *d : 0.0f;
        return _mm256_shuffle_epi8(dx_iq4_table(unsigned_values), dx_nibbles32(b->qs));
    }
    }
}

/* The 8 six-bit scales and mins of a Q4_K / Q5_K block, each duplicated for its two 16-value
 * halves into o->sc / o->mn, with 32-bit word operations: bytes 0-3 hold sc0-3 / m0-3 in their low
 * 6 bits and the high 2 bits of sc4-7 / m4-7; bytes 8-11 the low 4 bits of sc4-7 (low nibbles)
 * and m4-7 (high nibbles). */
DX_T2 DX_INL void dx_k4_scales16(const uint8_t *q, kdec *o) {
    uint32_t u[3], w[4];
    memcpy(u, q, 12);
    w[0] = u[0] & 0x3f3f3f3fu;                                               /* sc0-3 */
    w[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);         /* sc4-7 */
    w[2] = u[1] & 0x3f3f3f3fu;                                               /* m0-3 */
    w[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4); /* m4-7 */
    const __m128i sm = _mm_loadu_si128((const __m128i *)w);                  /* sc0-7 | m0-7 bytes */
    const __m128i s16 = _mm_cvtepu8_epi16(sm), m16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    _mm256_store_si256((__m256i *)o->sc, _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16)));
    _mm256_store_si256((__m256i *)o->mn, _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16)));
}

/* Decodes K super-block blk of type T into o (see the header comment). */
DX_T2 DX_INL void dx_superblock(const void *blk, const uint32_t T, int unsigned_values, kdec *o) {
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), m15 = _mm256_set1_epi8(0x0f);
    switch (T) {
    case QUANT_TYPE_Q2_K:
    case QUANT_TYPE_Q3_K: {
        const uint8_t *qs = T == QUANT_TYPE_Q2_K ? ((const block_q2_K *)blk)->qs : ((const block_q3_K *)blk)->qs;
        const __m256i hm = T == QUANT_TYPE_Q3_K ? _mm256_loadu_si256((const __m256i *)((const block_q3_K *)blk)->hmask)
                                                : _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * k)), m3);
                if (T == QUANT_TYPE_Q3_K) {
                    const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + k)), one);
                    v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 2));
                }
                _mm256_store_si256((__m256i *)(o->v + 128 * h + 32 * k), v);
            }
        }
        if (T == QUANT_TYPE_Q2_K) {
            const block_q2_K *b = blk;
            for (int j = 0; j < 16; j++) {
                o->sc[j] = (int16_t)(b->scales[j] & 0x0f);
                o->mn[j] = (int16_t)(b->scales[j] >> 4);
            }
            o->d = dx_f16(b->d);
            o->dmin = dx_f16(b->dmin);
        } else {
            const block_q3_K *b = blk;
            /* the 16 six-bit scales with word operations: scale j's low 4 bits are the low (j < 8) or
             * high nibble of byte j % 8, its high 2 bits bits 2 (j / 4) of byte 8 + j % 4 */
            uint32_t u[3], w[4];
            memcpy(u, b->scales, 12);
            w[0] = (u[0] & 0x0f0f0f0fu) | ((u[2] & 0x03030303u) << 4);
            w[1] = (u[1] & 0x0f0f0f0fu) | (((u[2] >> 2) & 0x03030303u) << 4);
            w[2] = ((u[0] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 4) & 0x03030303u) << 4);
            w[3] = ((u[1] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 6) & 0x03030303u) << 4);
            const __m256i sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w)),
                                                _mm256_set1_epi16(32));
            _mm256_store_si256((__m256i *)o->sc, sc);
            _mm256_store_si256((__m256i *)o->mn, _mm256_slli_epi16(sc, 2));
            o->d = o->dmin = dx_f16(b->d);
        }
        return;
    }
    case QUANT_TYPE_Q5_K: {
        const block_q5_K *b = blk;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
            const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
            const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
            _mm256_store_si256((__m256i *)(o->v + 64 * c),
                               _mm256_or_si256(_mm256_and_si256(q, m15), _mm256_slli_epi16(h0, 4)));
            _mm256_store_si256((__m256i *)(o->v + 64 * c + 32),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m15), _mm256_slli_epi16(h1, 4)));
        }
        dx_k4_scales16(b->scales, o);
        o->d = dx_f16(b->d);
        o->dmin = dx_f16(b->dmin);
        return;
    }
    default: { /* IQ4_XS */
        const block_iq4_xs *b = blk;
        const __m256i table = dx_iq4_table(unsigned_values);
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            _mm256_store_si256((__m256i *)(o->v + 32 * ib), _mm256_shuffle_epi8(table, dx_nibbles32(b->qs + 16 * ib)));
        }
        /* ls_j: low 4 bits = nibble j of scales_l (byte j/2), high 2 bits = bits 2j of scales_h */
        uint32_t sl;
        memcpy(&sl, b->scales_l, 4);
        uint64_t hb = 0;
        for (int j = 0; j < 8; j++) hb |= (uint64_t)((b->scales_h >> (2 * j)) & 3) << (8 * j + 4);
        const __m128i lo = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(sl & 0x0f0f0f0fu)),
                                             _mm_cvtsi32_si128((int)((sl >> 4) & 0x0f0f0f0fu)));
        const __m128i ls = _mm_or_si128(lo, _mm_cvtsi64_si128((long long)hb));
        const __m128i s16 = _mm_sub_epi16(_mm_cvtepu8_epi16(ls), _mm_set1_epi16(32));
        const __m256i sc = _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16));
        _mm256_store_si256((__m256i *)o->sc, sc);
        _mm256_store_si256((__m256i *)o->mn, unsigned_values ? _mm256_slli_epi16(sc, 7) : _mm256_setzero_si256());
        o->d = dx_f16(b->d);
        o->dmin = unsigned_values ? o->d : 0.0f;
        return;
    }
    }
}

/* 8x8 dword transpose: r[j] (row j, column k) -> c[k]. */
DX_T2 DX_INL void dx_transpose8(const __m256i r[8], __m256i c[8]) {
    __m256i t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        c[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        c[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* Decodes blocks [8h, 8h + 8) of the group starting at block b0 of a row of nb blocks (missing
 * blocks past the row end are zero with d = m = 0) and transposes them to the activation layout:
 * c[k] dword j = values 4k..4k+3 of block 8h + j. */
DX_T2 DX_INL void dx_group_half(const uint8_t *row, int64_t nb, int64_t b0, int h, const uint32_t T,
                                int unsigned_values, __m256i c[8], float *d8, float *m8) {
    const size_t bsize = T == QUANT_TYPE_Q4_1 ? sizeof(block_q4_1)
                         : T == QUANT_TYPE_Q5_0 ? sizeof(block_q5_0)
                         : T == QUANT_TYPE_Q5_1 ? sizeof(block_q5_1)
                                                : sizeof(block_iq4_nl);
    __m256i r[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const int64_t b = b0 + 8 * h + j;
        if (b < nb) {
            r[j] = dx_block32(row + (size_t)b * bsize, T, unsigned_values, &d8[j], &m8[j]);
        } else {
            r[j] = _mm256_setzero_si256();
            d8[j] = m8[j] = 0.0f;
        }
    }
    dx_transpose8(r, c);
}

#endif
#endif
