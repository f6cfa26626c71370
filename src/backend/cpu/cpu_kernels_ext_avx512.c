/* cpu_kernels_ext_avx512.c: AVX-512 (VNNI) matmul kernels of the added weight types, selected after
 * cpu_kernels_init_avx512. All weights are decoded to unsigned bytes (cpu_decode_ext.h: IQ4 values
 * + 128, Q5_0 q, Q3_K q + 4, the offsets through the activation sums) so that vpdpbusd (u8 x s8,
 * four products per int32 lane, no saturation) does the integer dot products.
 * - Q4_1, Q5_0, Q5_1, IQ4_NL x Q8_0: per group of 16 blocks the two decoded, transposed halves
 *   form 8 vectors of 64 bytes whose lane j is block j, as the activation's layout: 8 vpdpbusd per
 *   row give the 16 block sums; acc += (d dx) isum - (m dx) ns per lane.
 * - Q2_K, Q3_K, Q5_K, IQ4_XS x Q8_K: per super-block 4 vpdpbusd of 64 values; lane i of chunk c
 *   belongs to sub-block 4c + i/4 and is multiplied by its scale (vpmulld); the mins through the
 *   Q8_K sums of 16. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_decode_ext.h"

#if defined(__x86_64__)

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INL DX_INL

enum { TILE = 8 };

/* ---- 32-blocks x Q8_0 ------------------------------------------------------------------------ */

T512 INL void mm32_512(const uint32_t T, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                       float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t nb = act->n_in / QK8_0, nb_pad = act->row_len / QK8_0, ng = nb_pad / CPU_Q8_0_GROUP;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += TILE) {
            const int nt = r0 + nr - rt >= TILE ? TILE : (int)(r0 + nr - rt);
            __m512 acc[TILE];
            for (int r = 0; r < nt; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t g = 0; g < ng; g++) {
                __m256i lo[8], hi[8];
                float d16[16], m16[16];
                dx_group_half(row, nb, g * CPU_Q8_0_GROUP, 0, T, 1, lo, d16, m16);
                dx_group_half(row, nb, g * CPU_Q8_0_GROUP, 1, T, 1, hi, d16 + 8, m16 + 8);
                __m512i wv[8];
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++) wv[k] = _mm512_inserti64x4(_mm512_castsi256_si512(lo[k]), hi[k], 1);
                const __m512 dw = _mm512_loadu_ps(d16), mw = _mm512_loadu_ps(m16);
                const int64_t blk0 = g * CPU_Q8_0_GROUP;
                for (int r = 0; r < nt; r++) {
                    const int64_t rr = rt + r;
                    const int8_t *xg = act->qs + rr * act->row_len + g * CPU_Q8_0_GROUP_VALUES;
                    __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 8
                    for (int k = 0; k < 8; k++) isum = _mm512_dpbusd_epi32(isum, wv[k], _mm512_loadu_si512(xg + 64 * k));
                    const __m512 dx = _mm512_loadu_ps(act->d + rr * nb_pad + blk0);
                    const __m512 ns = _mm512_cvtepi32_ps(_mm512_loadu_si512(act->ns + rr * nb_pad + blk0));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[r]);
                    acc[r] = _mm512_fnmadd_ps(ns, _mm512_mul_ps(mw, dx), acc[r]);
                }
            }
            for (int r = 0; r < nt; r++) dst[(rt + r) * ds + o] = _mm512_reduce_add_ps(acc[r]);
        }
    }
}

/* ---- K super-blocks x Q8_K ------------------------------------------------------------------- */

/* One weight row against NT activation rows from rt, chunk by chunk (64 values), one int32
 * accumulator per row. */
T512 INL void mmK_tile_512(const uint32_t T, const uint8_t *row, size_t bsize, int64_t nsb, const cpu_act *act,
                           int64_t rt, const int NT, float *dst, int64_t ds, int64_t o) {
    /* lane i of a 64-value chunk holds values 4i..4i+3: sub-block i / 4 of the chunk */
    const __m512i sub_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[TILE];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) acc[r] = _mm512_setzero_ps();
    kdec dec;
    for (int64_t sb = 0; sb < nsb; sb++) {
        dx_superblock(row + (size_t)sb * bsize, T, 1, &dec);
        const __m512i sc32 = _mm512_cvtepi16_epi32(_mm256_load_si256((const __m256i *)dec.sc)); /* [16] */
        __m512i isum[TILE];
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) isum[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i wv = _mm512_load_si512(dec.v + 64 * c);
            const __m512i sv = _mm512_permutexvar_epi32(_mm512_add_epi32(sub_of_lane, _mm512_set1_epi32(4 * c)), sc32);
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) {
                const int8_t *xq = act->qs + (rt + r) * act->n_in + sb * QK_K + 64 * c;
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(xq));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(p, sv));
            }
        }
        const __m256i mnv = _mm256_load_si256((const __m256i *)dec.mn);
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) {
            const int16_t *bs = act->bsums + (rt + r) * (act->n_in / 16) + sb * 16;
            const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), mnv);
            const float dx = act->d[(rt + r) * (act->n_in / QK_K) + sb];
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_set1_ps(dec.d * dx), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(msum)), _mm512_set1_ps(dec.dmin * dx),
                                      acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) dst[(rt + r) * ds + o] = _mm512_reduce_add_ps(acc[r]);
}

T512 INL void mmK_512(const uint32_t T, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                      float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t nsb = act->n_in / QK_K;
    const size_t bsize = quant_type_get(T)->type_size;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += TILE) {
            const int nt = r0 + nr - rt >= TILE ? TILE : (int)(r0 + nr - rt);
            switch (nt) {
#define C(N) case N: mmK_tile_512(T, row, bsize, nsb, act, rt, N, dst, ds, o); break;
            C(1) C(2) C(3) C(4) C(5) C(6) C(7)
#undef C
            default: mmK_tile_512(T, row, bsize, nsb, act, rt, TILE, dst, ds, o); break;
            }
        }
    }
}

#define MM_ENTRY(name, T, body)                                                                                  \
    T512 static void name(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst, \
                          int64_t ds, int64_t o0, int64_t o1) {                                                \
        body(T, w, w_nb1, act, r0, nr, dst, ds, o0, o1);                                                        \
    }
MM_ENTRY(mm_q4_1_512, QUANT_TYPE_Q4_1, mm32_512)
MM_ENTRY(mm_q5_0_512, QUANT_TYPE_Q5_0, mm32_512)
MM_ENTRY(mm_q5_1_512, QUANT_TYPE_Q5_1, mm32_512)
MM_ENTRY(mm_iq4_nl_512, QUANT_TYPE_IQ4_NL, mm32_512)
MM_ENTRY(mm_q2_K_512, QUANT_TYPE_Q2_K, mmK_512)
MM_ENTRY(mm_q3_K_512, QUANT_TYPE_Q3_K, mmK_512)
MM_ENTRY(mm_q5_K_512, QUANT_TYPE_Q5_K, mmK_512)
MM_ENTRY(mm_iq4_xs_512, QUANT_TYPE_IQ4_XS, mmK_512)
#undef MM_ENTRY

void cpu_kernels_init_ext_avx512(cpu_kernels *k) {
    k->matmul[QUANT_TYPE_Q4_1] = mm_q4_1_512;
    k->matmul[QUANT_TYPE_Q5_0] = mm_q5_0_512;
    k->matmul[QUANT_TYPE_Q5_1] = mm_q5_1_512;
    k->matmul[QUANT_TYPE_IQ4_NL] = mm_iq4_nl_512;
    k->matmul[QUANT_TYPE_Q2_K] = mm_q2_K_512;
    k->matmul[QUANT_TYPE_Q3_K] = mm_q3_K_512;
    k->matmul[QUANT_TYPE_Q5_K] = mm_q5_K_512;
    k->matmul[QUANT_TYPE_IQ4_XS] = mm_iq4_xs_512;
    k->act_row[QUANT_TYPE_Q4_1] = k->act_row[QUANT_TYPE_Q5_0] = k->act_row[QUANT_TYPE_Q5_1] =
        k->act_row[QUANT_TYPE_IQ4_NL] = k->act_row[QUANT_TYPE_Q8_0];
    k->act_row[QUANT_TYPE_Q2_K] = k->act_row[QUANT_TYPE_Q3_K] = k->act_row[QUANT_TYPE_Q5_K] =
        k->act_row[QUANT_TYPE_IQ4_XS] = k->act_row[QUANT_TYPE_Q4_K];
}

#else
void cpu_kernels_init_ext_avx512(cpu_kernels *k) { (void)k; }
#endif
