/* cpu_kernels_ext_avx2.c: AVX2 matmul kernels of the added weight types (decoders in
 * cpu_decode_ext.h), selected after cpu_kernels_init_avx2.
 * - Q4_1, Q5_0, Q5_1, IQ4_NL x Q8_0 activations: per group of 16 blocks, each half (8 blocks) is
 *   decoded and transposed once to the activation's layout, then for each activation row the
 *   8 vectors give one int32 per block (vpmaddubsw, vpmaddwd with ones); f32 per lane:
 *   acc += (d dx) isum - (m dx) ns (ns = minus the activation block's q sum). IQ4_NL uses signed
 *   table values with the sign trick (|w| x sign(x, w)), the others unsigned values.
 * - Q2_K, Q3_K, Q5_K, IQ4_XS x Q8_K activations: each super-block is decoded once to 256 int8 and
 *   16 scales / mins; per row and 32-value chunk vpmaddubsw then vpmaddwd with the two sub-block
 *   scales, int32 per super-block; the mins through the Q8_K sums of 16. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_decode_ext.h"

#if defined(__x86_64__)

#define T2 DX_T2
#define INL DX_INL

T2 INL float hsum8_ext(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

enum { TILE = 8 }; /* activation rows per pass over a weight row */

/* ---- 32-blocks x Q8_0 ------------------------------------------------------------------------ */

T2 INL void mm32_avx2(const uint32_t T, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                      float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int signed_values = T == QUANT_TYPE_IQ4_NL;
    const int64_t nb = act->n_in / QK8_0, nb_pad = act->row_len / QK8_0, ng = nb_pad / CPU_Q8_0_GROUP;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += TILE) {
            const int nt = r0 + nr - rt >= TILE ? TILE : (int)(r0 + nr - rt);
            __m256 acc[TILE];
            for (int r = 0; r < nt; r++) acc[r] = _mm256_setzero_ps();
            for (int64_t g = 0; g < ng; g++) {
                for (int h = 0; h < 2; h++) {
                    if (g * CPU_Q8_0_GROUP + 8 * h >= nb) break; /* only padding left */
                    __m256i c[8];
                    float d8[8], m8[8];
                    dx_group_half(row, nb, g * CPU_Q8_0_GROUP, h, T, !signed_values, c, d8, m8);
                    __m256i cabs[8];
                    if (signed_values) {
                        for (int k = 0; k < 8; k++) cabs[k] = _mm256_sign_epi8(c[k], c[k]);
                    }
                    const __m256 dw = _mm256_loadu_ps(d8), mw = _mm256_loadu_ps(m8);
                    const int64_t blk0 = g * CPU_Q8_0_GROUP + 8 * h;
                    for (int r = 0; r < nt; r++) {
                        const int64_t rr = rt + r;
                        const int8_t *xg = act->qs + rr * act->row_len + g * CPU_Q8_0_GROUP_VALUES + 32 * h;
                        __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
                        for (int k = 0; k < 8; k++) {
                            const __m256i x = _mm256_loadu_si256((const __m256i *)(xg + 64 * k));
                            const __m256i p = signed_values ? _mm256_maddubs_epi16(cabs[k], _mm256_sign_epi8(x, c[k]))
                                                            : _mm256_maddubs_epi16(c[k], x);
                            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ones));
                        }
                        const __m256 dx = _mm256_loadu_ps(act->d + rr * nb_pad + blk0);
                        const __m256 ns = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(act->ns + rr * nb_pad + blk0)));
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[r]);
                        acc[r] = _mm256_fnmadd_ps(ns, _mm256_mul_ps(mw, dx), acc[r]);
                    }
                }
            }
            for (int r = 0; r < nt; r++) dst[(rt + r) * ds + o] = hsum8_ext(acc[r]);
        }
    }
}

/* ---- K super-blocks x Q8_K ------------------------------------------------------------------- */

/* One weight row (nsb super-blocks) against NT activation rows from rt: chunk by chunk (32 values),
 * the decoded weights and scales of a chunk in registers, one int32 accumulator per row. */
T2 INL void mmK_tile_avx2(const uint32_t T, const uint8_t *row, size_t bsize, int64_t nsb, const cpu_act *act,
                          int64_t rt, const int NT, float *dst, int64_t ds, int64_t o) {
    const int signed_values = T == QUANT_TYPE_IQ4_XS;
    const __m256i pair_lo_hi = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    __m256 acc[TILE];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) acc[r] = _mm256_setzero_ps();
    kdec dec;
    for (int64_t sb = 0; sb < nsb; sb++) {
        dx_superblock(row + (size_t)sb * bsize, T, !signed_values, &dec);
        const __m256i scv = _mm256_load_si256((const __m256i *)dec.sc);
        __m256i isum[TILE];
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            const __m256i wv = _mm256_load_si256((const __m256i *)(dec.v + 32 * c));
            const __m256i wabs = signed_values ? _mm256_sign_epi8(wv, wv) : wv;
            /* int16 lanes 0-7 = sc[2c], 8-15 = sc[2c+1] (dword c of sc holds the pair) */
            const __m256i sv = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(scv, _mm256_set1_epi32(c)), pair_lo_hi);
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(act->qs + (rt + r) * act->n_in + sb * QK_K + 32 * c));
                const __m256i p = signed_values ? _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(x, wv))
                                                : _mm256_maddubs_epi16(wv, x);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, sv));
            }
        }
        const __m256i mnv = _mm256_load_si256((const __m256i *)dec.mn);
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) {
            const float dx = act->d[(rt + r) * (act->n_in / QK_K) + sb];
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(dec.d * dx), acc[r]);
            if (!signed_values) {
                const int16_t *bs = act->bsums + (rt + r) * (act->n_in / 16) + sb * 16;
                const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), mnv);
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dec.dmin * dx), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) dst[(rt + r) * ds + o] = hsum8_ext(acc[r]);
}

T2 INL void mmK_avx2(const uint32_t T, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                     float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t nsb = act->n_in / QK_K;
    const size_t bsize = quant_type_get(T)->type_size;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += TILE) {
            const int nt = r0 + nr - rt >= TILE ? TILE : (int)(r0 + nr - rt);
            switch (nt) {
#define C(N) case N: mmK_tile_avx2(T, row, bsize, nsb, act, rt, N, dst, ds, o); break;
            C(1) C(2) C(3) C(4) C(5) C(6) C(7)
#undef C
            default: mmK_tile_avx2(T, row, bsize, nsb, act, rt, TILE, dst, ds, o); break;
            }
        }
    }
}

#define MM_ENTRY(name, T, body)                                                                                  \
    T2 static void name(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,   \
                        int64_t ds, int64_t o0, int64_t o1) {                                                  \
        body(T, w, w_nb1, act, r0, nr, dst, ds, o0, o1);                                                        \
    }
MM_ENTRY(mm_q4_1_avx2, QUANT_TYPE_Q4_1, mm32_avx2)
MM_ENTRY(mm_q5_0_avx2, QUANT_TYPE_Q5_0, mm32_avx2)
MM_ENTRY(mm_q5_1_avx2, QUANT_TYPE_Q5_1, mm32_avx2)
MM_ENTRY(mm_iq4_nl_avx2, QUANT_TYPE_IQ4_NL, mm32_avx2)
MM_ENTRY(mm_q2_K_avx2, QUANT_TYPE_Q2_K, mmK_avx2)
MM_ENTRY(mm_q3_K_avx2, QUANT_TYPE_Q3_K, mmK_avx2)
MM_ENTRY(mm_q5_K_avx2, QUANT_TYPE_Q5_K, mmK_avx2)
MM_ENTRY(mm_iq4_xs_avx2, QUANT_TYPE_IQ4_XS, mmK_avx2)
#undef MM_ENTRY

void cpu_kernels_init_ext_avx2(cpu_kernels *k) {
    k->matmul[QUANT_TYPE_Q4_1] = mm_q4_1_avx2;
    k->matmul[QUANT_TYPE_Q5_0] = mm_q5_0_avx2;
    k->matmul[QUANT_TYPE_Q5_1] = mm_q5_1_avx2;
    k->matmul[QUANT_TYPE_IQ4_NL] = mm_iq4_nl_avx2;
    k->matmul[QUANT_TYPE_Q2_K] = mm_q2_K_avx2;
    k->matmul[QUANT_TYPE_Q3_K] = mm_q3_K_avx2;
    k->matmul[QUANT_TYPE_Q5_K] = mm_q5_K_avx2;
    k->matmul[QUANT_TYPE_IQ4_XS] = mm_iq4_xs_avx2;
    /* the activations are those of the first set's types (this level's quantizers) */
    k->act_row[QUANT_TYPE_Q4_1] = k->act_row[QUANT_TYPE_Q5_0] = k->act_row[QUANT_TYPE_Q5_1] =
        k->act_row[QUANT_TYPE_IQ4_NL] = k->act_row[QUANT_TYPE_Q8_0];
    k->act_row[QUANT_TYPE_Q2_K] = k->act_row[QUANT_TYPE_Q3_K] = k->act_row[QUANT_TYPE_Q5_K] =
        k->act_row[QUANT_TYPE_IQ4_XS] = k->act_row[QUANT_TYPE_Q4_K];
}

#else
void cpu_kernels_init_ext_avx2(cpu_kernels *k) { (void)k; }
#endif
