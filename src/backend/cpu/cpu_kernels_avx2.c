/* cpu_kernels_avx2.c: AVX2 + FMA + F16C kernels (matmul per weight type, activation quantizers,
 * f16 dot / axpy), compiled per function with target attributes and selected at run time.
 *
 * Same data flow as the AVX-512 kernels (cpu_kernels_avx512.c) with 256-bit vectors and 16
 * registers: a tile of up to 8 activation rows per pass over a weight row.
 * - Q8_0 / Q4_0: each half of a transposed group (blocks 0-7, 8-15) is one 32-byte slice of the
 *   group's 64-byte vectors; 8 weight blocks are transposed to match, lane j = block j. Q8_0 uses
 *   the sign trick (|w| x sign(x, w) with vpmaddubsw, no saturation since |x| <= 127), Q4_0
 *   nibbles x int8 directly (the -8 offset through the block sums). Packed rows (Q8_0_X16,
 *   Q4_0_X16: cpu_pack.c) are already in lane order: a load (and an xor, or a mask and a shift)
 *   per weight vector instead of the transpose.
 * - Q4_K / Q6_K: in cpu_gemm_kquant_avx2.c (weight rows in lanes, one decode per super-block of 8
 *   weight rows for all activation rows).
 * - F32 / F16 / BF16: cpu_gemm_float_avx2.c. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_decode_ext.h" /* dx_transpose8 */
#include "backend/cpu/cpu_exp_avx2.h"
#include "base/fp16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

/* ---- helpers ------------------------------------------------------------------------------- */

/* Sum of the 8 lanes: (l + l^4), then (l + l^2), then (l + l^1). */
T2 INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T2 INL int hsum8_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

T2 INL float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- activation preparation ------------------------------------------------------------------ */

static void act_row_f32_avx2(cpu_act *act, int64_t r, const float *x) {
    memcpy(act->f + r * act->n_in, x, (size_t)act->n_in * sizeof(float));
}

T2 static void act_row_f16_avx2(cpu_act *act, int64_t r, const float *x) {
    float *f = act->f + r * act->n_in;
    int64_t i = 0;
    for (; i + 8 <= act->n_in; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(h));
    }
    for (; i < act->n_in; i++) f[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
}

T2 static void act_row_bf16_avx2(cpu_act *act, int64_t r, const float *x) {
    float *f = act->f + r * act->n_in;
    int64_t i = 0;
    const __m256i lsb = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u), qnan = _mm256_set1_epi32(0x00400000);
    for (; i + 8 <= act->n_in; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i u = _mm256_castps_si256(v);
        const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        __m256i rnd = _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), lsb));
        rnd = _mm256_and_si256(rnd, hi);
        const __m256i qn = _mm256_and_si256(_mm256_or_si256(u, qnan), hi);
        rnd = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rnd), _mm256_castsi256_ps(qn), nan));
        _mm256_storeu_ps(f + i, _mm256_castsi256_ps(rnd));
    }
    for (; i < act->n_in; i++) f[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

/* 8 floats -> 8 int32 rounded half to even. */
T2 INL __m256i round_epi32(__m256 v) {
    return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

T2 static void act_row_q8_0_avx2(cpu_act *act, int64_t r, const float *x) {
    const int64_t nb = act->n_in / QK8_0, nb_pad = act->row_len / QK8_0;
    int8_t *qs = act->qs + r * act->row_len;
    float *d = act->d + r * nb_pad;
    int32_t *ns = act->ns + r * nb_pad;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb_pad; b++) {
        int8_t q[QK8_0];
        if (b >= nb) {
            memset(q, 0, sizeof(q));
            d[b] = 0.0f;
            ns[b] = 0;
        } else {
            const float *xb = x + b * QK8_0;
            __m256 v[4];
            __m256 am = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                am = _mm256_max_ps(am, _mm256_andnot_ps(sign, v[i]));
            }
            const float amax = hmax8(am);
            /* a NaN / Inf: q = 0, d = NaN (as cpu_act_row_q8_0_ref) */
            const __m256 inf = _mm256_set1_ps(INFINITY);
            int bad = 0;
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) bad |= _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v[i]), inf, _CMP_NLT_UQ));
            const float id = amax >= CPU_Q8_0_AMAX_MIN ? 127.0f / amax : 0.0f;
            d[b] = bad ? NAN : fp16_to_fp32(fp32_to_fp16(amax / 127.0f));
            const __m256 m = _mm256_set1_ps(id);
            if (bad) {
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) v[i] = _mm256_setzero_ps();
            }
            __m256i iv[4], sum = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                iv[i] = round_epi32(_mm256_mul_ps(v[i], m));
                sum = _mm256_add_epi32(sum, iv[i]);
            }
            ns[b] = -hsum8_epi32(sum);
            /* pack to int8 in order */
            __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]), p23 = _mm256_packs_epi32(iv[2], iv[3]);
            __m256i p = _mm256_packs_epi16(p01, p23);
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)q, p);
        }
        for (int k = 0; k < 8; k++) memcpy(qs + cpu_q8_0_offset(b * QK8_0 + 4 * k), q + 4 * k, 4);
    }
}

T2 static void act_row_q8_K_avx2(cpu_act *act, int64_t r, const float *x) {
    const int64_t nb = act->n_in / QK_K;
    int8_t *qs = act->qs + r * act->n_in;
    float *d = act->d + r * nb;
    int16_t *bsums = act->bsums + r * (act->n_in / 16);
    uint8_t *qu = act->qsu + r * act->n_in;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK_K;
        __m256 am = _mm256_setzero_ps();
        int bad = 0;
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j));
            bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_NLT_UQ)); /* NaN or Inf */
            am = _mm256_max_ps(am, a);
        }
        const float amax = hmax8(am);
        if (bad || amax < CPU_Q8_0_AMAX_MIN) { /* as cpu_act_row_q8_K_ref: NaN / Inf -> d = NaN; tiny -> 0 */
            d[b] = bad ? NAN : 0.0f;
            memset(qs + b * QK_K, 0, QK_K);
            memset(qu + b * QK_K, 128, QK_K);
            memset(bsums + b * 16, 0, 16 * sizeof(int16_t));
            continue;
        }
        float max = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            if ((xb[j] < 0 ? -xb[j] : xb[j]) == amax) {
                max = xb[j];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 16) {
            const __m256i a = _mm256_min_epi32(round_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), is)), lim);
            const __m256i c = _mm256_min_epi32(round_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), is)), lim);
            bsums[b * 16 + j / 16] = (int16_t)hsum8_epi32(_mm256_add_epi32(a, c));
            __m256i p = _mm256_packs_epi32(a, c);                                   /* a0-3 c0-3 | a4-7 c4-7 */
            p = _mm256_permute4x64_epi64(p, 0xd8);                                  /* a0-7 | c0-7 (int16) */
            const __m128i q = _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
            _mm_storeu_si128((__m128i *)(qs + b * QK_K + j), q);
            _mm_storeu_si128((__m128i *)(qu + b * QK_K + j), _mm_xor_si128(q, _mm_set1_epi8(-128))); /* q + 128 */
        }
        d[b] = 1.0f / iscale;
    }
    cpu_act_q8_K_sums32(act, r);
}

/* ---- Q8_0 / Q4_0 ---------------------------------------------------------------------------- */

/* Half h of group g: weights of blocks 8h .. 8h+7 (nv of them exist) as w[k] lane j = values
 * 4k..4k+3 of block j (Q8_0: signed; Q4_0: nibbles), dw lane j = d. */
T2 INL void q80_half(const void *wrow, const int Q4, int64_t b0, int nv, __m256i w[8], __m256 *dw) {
    uint16_t dd[8];
    if (Q4) {
        const block_q4_0 *blk = (const block_q4_0 *)wrow + b0;
        __m256i r[8];
        /* rows j: 16 nibble bytes of block j twice (low nibbles: values 0-15, high: 16-31) */
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m128i q = j < nv ? _mm_loadu_si128((const __m128i *)blk[j].qs) : _mm_setzero_si128();
            const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0f));
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f));
            r[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
            dd[j] = j < nv ? blk[j].d : 0;
        }
        dx_transpose8(r, w);
    } else {
        const block_q8_0 *blk = (const block_q8_0 *)wrow + b0;
        __m256i r[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            r[j] = j < nv ? _mm256_loadu_si256((const __m256i *)blk[j].qs) : _mm256_setzero_si256();
            dd[j] = j < nv ? blk[j].d : 0;
        }
        dx_transpose8(r, w);
    }
    *dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dd));
}

/* One output o (plain Q8_0 / Q4_0 row wrow) for activation rows r0 .. r0+NT-1: q80_half
 * transposes a group half into registers, which every row of the tile reuses (rows outer). */
T2 INL void q80_tile2(const void *wrow, const int Q4, const cpu_act *act, int64_t r0, const int NT, float *dst,
                      int64_t ds, int64_t o) {
    const int64_t nb = act->n_in / QK8_0, nbp = act->row_len / QK8_0;
    const int64_t ng = act->row_len / CPU_Q8_0_GROUP_VALUES;
    __m256 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t g = 0; g < ng; g++) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t b0 = g * CPU_Q8_0_GROUP + 8 * h;
            const int64_t rem = nb - b0;
            if (rem <= 0) break; /* padding blocks contribute 0 */
            __m256i w[8], aw[8];
            __m256 dw;
            q80_half(wrow, Q4, b0, rem >= 8 ? 8 : (int)rem, w, &dw);
            if (!Q4) {
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++) aw[k] = _mm256_sign_epi8(w[k], w[k]);
            }
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) {
                const int8_t *xq = act->qs + (r0 + r) * act->row_len + g * CPU_Q8_0_GROUP_VALUES + 32 * h;
                __m256i isum;
                if (Q4) {
                    /* nibble x int8 pairs stay below 2^15 even summed over all 8 k */
                    __m256i p16 = _mm256_setzero_si256();
#pragma GCC unroll 8
                    for (int k = 0; k < 8; k++) {
                        p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(w[k], _mm256_loadu_si256((const __m256i *)(xq + 64 * k))));
                    }
                    const __m256i ns = _mm256_loadu_si256((const __m256i *)(act->ns + (r0 + r) * nbp + b0));
                    isum = _mm256_add_epi32(_mm256_madd_epi16(p16, ones), _mm256_slli_epi32(ns, 3));
                } else {
                    isum = _mm256_setzero_si256();
#pragma GCC unroll 8
                    for (int k = 0; k < 8; k++) {
                        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 64 * k));
                        const __m256i p = _mm256_maddubs_epi16(aw[k], _mm256_sign_epi8(x, w[k]));
                        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ones));
                    }
                }
                const __m256 dx = _mm256_loadu_ps(act->d + (r0 + r) * nbp + b0);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) dst[(r0 + r) * ds + o] = hsum8(acc[r]);
}

/* The same output from a row packed as TENSOR_LAYOUT_Q8_0_X16 or (Q4) Q4_0_X16 (cpu_pack.c): half h
 * of a group is the 32-byte slice h of each of its 64-byte vectors, already in lane order (lane j =
 * block 8h + j), so q80_half's transpose becomes a load per vector: Q8_0 q + 128, an xor away;
 * Q4_0 vector k is the low nibbles of vector k (values 4k .. 4k+3) or, for k >= 4, the high
 * nibbles of vector k - 4, a mask and a shift away. One weight vector at a time (k outer, the NT
 * rows inner: one vector and its magnitudes live at a time, NT int sums). The int sums are exact
 * in any order, so the bits are q80_tile2's. pf: this is the first row tile of the output, which
 * prefetches two groups (Q8_0 1 KiB) ahead in the row (Zen 2 needs it). */
T2 INL void q80_x16_tile2(const uint8_t *wrow, const int Q4, const cpu_act *act, int64_t r0, const int NT, float *dst,
                          int64_t ds, int64_t o, bool pf) {
    const int64_t nb = act->n_in / QK8_0, nbp = act->row_len / QK8_0;
    const int64_t ng = act->row_len / CPU_Q8_0_GROUP_VALUES;
    const int64_t gbytes = Q4 ? CPU_Q8_0_GROUP_VALUES / 2 : CPU_Q8_0_GROUP_VALUES, sc_at = Q4 ? act->n_in / 2 : act->n_in;
    __m256 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);
    for (int64_t g = 0; g < ng; g++) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t b0 = g * CPU_Q8_0_GROUP + 8 * h;
            if (nb - b0 <= 0) break; /* padding blocks contribute 0 */
            const uint8_t *gh = wrow + g * gbytes + 32 * h;
            if (pf && h == 0) {
                for (int k = 0; k < gbytes / 64; k++) _mm_prefetch((const char *)gh + 2 * gbytes + 64 * k, _MM_HINT_T0);
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wrow + sc_at + 2 * b0)));
            const int8_t *xq0 = act->qs + r0 * act->row_len + g * CPU_Q8_0_GROUP_VALUES + 32 * h;
            __m256i isum[8]; /* Q4: int16 sums (nibble x int8 pairs stay below 2^15 over all 8 k) */
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int k = 0; k < 8; k++) {
                if (Q4) {
                    const __m256i c = _mm256_loadu_si256((const __m256i *)(gh + 64 * (k % 4)));
                    const __m256i wk = _mm256_and_si256(k < 4 ? c : _mm256_srli_epi16(c, 4), low);
#pragma GCC unroll 8
                    for (int r = 0; r < NT; r++) {
                        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq0 + r * act->row_len + 64 * k));
                        isum[r] = _mm256_add_epi16(isum[r], _mm256_maddubs_epi16(wk, x));
                    }
                    continue;
                }
                const __m256i wk =
                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(gh + 64 * k)), _mm256_set1_epi8((char)0x80));
                const __m256i ak = _mm256_sign_epi8(wk, wk);
#pragma GCC unroll 8
                for (int r = 0; r < NT; r++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xq0 + r * act->row_len + 64 * k));
                    const __m256i pk = _mm256_maddubs_epi16(ak, _mm256_sign_epi8(x, wk));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pk, ones));
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) {
                if (Q4) { /* the int16 sums to int32, and the -8 offset through the block sums */
                    const __m256i ns = _mm256_loadu_si256((const __m256i *)(act->ns + (r0 + r) * nbp + b0));
                    isum[r] = _mm256_add_epi32(_mm256_madd_epi16(isum[r], ones), _mm256_slli_epi32(ns, 3));
                }
                const __m256 dx = _mm256_loadu_ps(act->d + (r0 + r) * nbp + b0);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, dx), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) dst[(r0 + r) * ds + o] = hsum8(acc[r]);
}

#define TILE_SWITCH8(NT_VAR, CALL)                                                                    \
    switch (NT_VAR) {                                                                                 \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
    case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break; default: CALL(8); break; \
    }

T2 static void mm_q8_0_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = (const char *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += 8) {
            const int nt = r0 + nr - rt >= 8 ? 8 : (int)(r0 + nr - rt);
#define CALL(N) q80_tile2(wrow, 0, act, rt, N, dst, ds, o)
            TILE_SWITCH8(nt, CALL)
#undef CALL
        }
    }
}

T2 static void mm_q4_0_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = (const char *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += 8) {
            const int nt = r0 + nr - rt >= 8 ? 8 : (int)(r0 + nr - rt);
#define CALL(N) q80_tile2(wrow, 1, act, rt, N, dst, ds, o)
            TILE_SWITCH8(nt, CALL)
#undef CALL
        }
    }
}

/* Q80_X16_ROWS: activation rows per tile of the packed kernel (its k-outer loop holds NT int sums
 * and NT float accumulators). 4 against 6 and the old 8-row tile (all 8 weight vectors and their
 * magnitudes live, which GCC spilled): Zen 3, 2 threads, bench_ops Q8_0 rows, alternated medians of
 * 7, 8 rows = 100%: [1024 -> 3072] x 16 0.70 / 0.88 ms cold, 0.73 / 0.98 hot, x 64 3.37 / 3.78;
 * [3072 -> 1024] x 64 3.08 / 3.30; the head [1024 -> 151936] x 16 38.1 / 41.3, x 64 153 / 187. */
#ifndef Q80_X16_ROWS
#define Q80_X16_ROWS 4
#endif
#define TILE_SWITCH4(NT_VAR, CALL)                                                                    \
    switch (NT_VAR) {                                                                                 \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; default: CALL(4); break; \
    }

/* Q4: Q4_0_X16 rows, else Q8_0_X16 (q80_x16_tile2). */
T2 INL void mm_x16_avx2(const void *w, size_t w_nb1, const int Q4, const cpu_act *act, int64_t r0, int64_t nr,
                        float *dst, int64_t ds, int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wrow = (const uint8_t *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += Q80_X16_ROWS) {
            const int nt = r0 + nr - rt >= Q80_X16_ROWS ? Q80_X16_ROWS : (int)(r0 + nr - rt);
#define CALL(N) q80_x16_tile2(wrow, Q4, act, rt, N, dst, ds, o, rt == r0)
#if Q80_X16_ROWS <= 4
            TILE_SWITCH4(nt, CALL)
#else
            TILE_SWITCH8(nt, CALL)
#endif
#undef CALL
        }
    }
}

T2 void cpu_mm_q8_0_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    mm_x16_avx2(w, w_nb1, 0, act, r0, nr, dst, ds, o0, o1);
}

T2 void cpu_mm_q4_0_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    mm_x16_avx2(w, w_nb1, 1, act, r0, nr, dst, ds, o0, o1);
}

/* Q4_K / Q6_K weights: cpu_gemm_kquant_avx2.c; F32 / F16 / BF16 weights: cpu_gemm_float_avx2.c. */

/* ---- attention helpers ------------------------------------------------------------------------ */

T2 static float dot_f16_avx2(const float *x, const uint16_t *y, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))), acc);
    }
    float s = hsum8(acc);
    for (; i < n; i++) s += x[i] * fp16_to_fp32(y[i]);
    return s;
}

T2 static void axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                                _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] += a * fp16_to_fp32(x[i]);
}

/* Attention P V, out[r] (columns i0 .. i0 + 8 NC) = sum over j ascending of p[r][j] * v_j, for NR
 * query rows at once: each value vector is converted once for NR rows (the AVX-512 kernel's tile
 * on 8 lanes). At most 5 rows: 5 x 2 accumulators + 2 values + the broadcast fit the 16 ymm
 * registers; the 6-row tile spilled an accumulator to the stack, and its store-forwarding chain
 * took 44% of P V's cycles (perf, Zen 5 AVX2 path: 16 rows x 1040 cells 1.77 -> 1.44 ms). MASK: a key
 * whose p is 0 is skipped (its value may be inf or NaN); without it (every value row finite) it
 * adds 0 * v = +-0, which leaves each sum as skipping it would (see the AVX-512 kernel). The value
 * rows, n_head_kv * head_dim * 2 bytes apart, are prefetched 16 keys ahead, a line per row. */
T2 INL void pv_tile2(float *out, int64_t ldo, const float *p, int64_t ldp, const int NR, const void *v, size_t v_nb,
                     int64_t n_kv, int64_t i0, const int NC, const bool MASK, bool first) {
    __m256 acc[5][2];
#pragma GCC unroll 5
    for (int r = 0; r < NR; r++) {
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++)
            acc[r][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + r * ldo + i0 + 8 * c);
    }
    for (int64_t j = 0; j < n_kv; j++) {
        const uint16_t *vr = (const uint16_t *)((const char *)v + (size_t)j * v_nb) + i0;
        if ((i0 & 31) == 0) _mm_prefetch((const char *)vr + 16 * v_nb, _MM_HINT_T0);
        __m256 vv[2];
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++) vv[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8 * c)));
#pragma GCC unroll 5
        for (int r = 0; r < NR; r++) {
            const float pr = p[r * ldp + j];
            if (MASK && pr == 0.0f) continue; /* a masked key adds nothing, even where its value is inf */
            const __m256 pb = _mm256_set1_ps(pr);
#pragma GCC unroll 2
            for (int c = 0; c < NC; c++) acc[r][c] = _mm256_fmadd_ps(pb, vv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 5
    for (int r = 0; r < NR; r++) {
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + r * ldo + i0 + 8 * c, acc[r][c]);
    }
}

#define PV_ROWS_SWITCH_M(NR_VAR, NC, MASK)                                                      \
    switch (NR_VAR) {                                                                           \
    case 1: pv_tile2(o, ldo, pr, ldp, 1, vb, v_nb, kn, i0, NC, MASK, fresh); break;             \
    case 2: pv_tile2(o, ldo, pr, ldp, 2, vb, v_nb, kn, i0, NC, MASK, fresh); break;             \
    case 3: pv_tile2(o, ldo, pr, ldp, 3, vb, v_nb, kn, i0, NC, MASK, fresh); break;             \
    case 4: pv_tile2(o, ldo, pr, ldp, 4, vb, v_nb, kn, i0, NC, MASK, fresh); break;             \
    default: pv_tile2(o, ldo, pr, ldp, 5, vb, v_nb, kn, i0, NC, MASK, fresh); break;            \
    }
#define PV_ROWS_SWITCH(NR_VAR, NC)                                                              \
    if (finite) {                                                                               \
        PV_ROWS_SWITCH_M(NR_VAR, NC, false)                                                     \
    } else {                                                                                    \
        PV_ROWS_SWITCH_M(NR_VAR, NC, true)                                                      \
    }

/* PV_KEYS: keys per block of attn_pv_f16_avx2. The cache rows interleave the kv heads (one row of
 * a head every n_head_kv * head_dim * 2 bytes, 2 KiB for the 0.6B shape), so one head's values map
 * to a small share of L2's sets, and every row and column tile of a long context read them from L3
 * again. Blocks of 128 keys stay in L2 across the tiles; a tile starts from the block before's
 * outputs, so each sum runs over the keys in the same order (the same bits). Zen 3, 2 threads,
 * bench_ops attn, alternated medians, unblocked / 128 / 256: 16 rows x 4112 cells 21.7 / 16.5 /
 * 15.6 ms, x 1040 2.86 / 2.69 / 2.78, 128 x 1152 23.5 / 22.0 / 22.2, decode 1 x 4097 2.02 / 1.56 /
 * 1.63. */
#ifndef PV_KEYS
#define PV_KEYS 128
#endif

/* Whether the first n f16 values of each of n_rows rows (nb bytes apart) are all finite (an f16 is
 * inf or NaN when its exponent bits are all set). */
T2 static bool f16_rows_finite_avx2(const void *v, size_t nb, int64_t n_rows, int64_t n) {
    const __m256i em = _mm256_set1_epi16(0x7c00);
    __m256i bad = _mm256_setzero_si256();
    int tail_bad = 0;
    for (int64_t j = 0; j < n_rows; j++) {
        const uint16_t *r = (const uint16_t *)((const char *)v + (size_t)j * nb);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(r + i));
            bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(x, em), em));
        }
        for (; i < n; i++) tail_bad |= (r[i] & 0x7c00) == 0x7c00;
    }
    return _mm256_testz_si256(bad, bad) && !tail_bad;
}

/* Keys in blocks of PV_KEYS; rows in tiles of 5; columns in tiles of 16, then 8; a last hd % 8
 * columns one value at a time (same fma order). From 4 query rows a finiteness check (one pass over the value rows) picks the
 * tiles without the per-key zero test; below, the check costs more than the test it saves (decode,
 * 2 rows x 1030 cells, Zen 3: 0.30 ms with it, 0.27 without). */
T2 static int64_t attn_pv_f16_avx2(float *out, int64_t ldo, const float *p, int64_t ldp, int64_t nq, const void *v,
                                   size_t v_nb, int64_t n_kv, int64_t hd, int64_t n_fin, bool acc) {
    bool all_finite = nq >= 4;
    for (int64_t kb = 0; kb < n_kv; kb += PV_KEYS) {
        const int64_t kn = n_kv - kb < PV_KEYS ? n_kv - kb : PV_KEYS;
        const bool fresh = kb == 0 && !acc; /* the sums start from 0, else from out */
        const void *vb = (const char *)v + (size_t)kb * v_nb;
        /* rows from n_fin on are checked (those before are vouched for) */
        const int64_t c0 = n_fin > kb ? (n_fin < kb + kn ? n_fin : kb + kn) : kb;
        const bool finite = nq >= 4 && f16_rows_finite_avx2((const char *)v + (size_t)c0 * v_nb, v_nb, kb + kn - c0, hd);
        all_finite = all_finite && finite;
        for (int64_t r0 = 0; r0 < nq; r0 += 5) {
            const int nr = nq - r0 >= 5 ? 5 : (int)(nq - r0);
            float *o = out + r0 * ldo;
            const float *pr = p + r0 * ldp + kb;
            int64_t i0 = 0;
            for (; i0 + 16 <= hd; i0 += 16) PV_ROWS_SWITCH(nr, 2)
            if (i0 + 8 <= hd) {
                PV_ROWS_SWITCH(nr, 1)
                i0 += 8;
            }
            for (; i0 < hd; i0++) {
                for (int r = 0; r < nr; r++) {
                    float a = fresh ? 0.0f : o[r * ldo + i0];
                    for (int64_t j = 0; j < kn; j++) {
                        const float pj = pr[r * ldp + j];
                        if (pj == 0.0f) continue;
                        a = fmaf(pj, fp16_to_fp32(((const uint16_t *)((const char *)vb + (size_t)j * v_nb))[i0]), a);
                    }
                    o[r * ldo + i0] = a;
                }
            }
        }
    }
    return all_finite ? n_kv : n_fin;
}
#undef PV_ROWS_SWITCH
#undef PV_ROWS_SWITCH_M

T2 static void softmax_row_avx2(float *p, const float *s, int64_t n) {
    float max = -INFINITY;
    int64_t i = 0;
    int bad = 0;
    if (n >= 8) {
        __m256 mx = _mm256_set1_ps(-INFINITY), nf = _mm256_setzero_ps();
        const __m256 inf = _mm256_set1_ps(INFINITY);
        for (; i + 8 <= n; i += 8) {
            const __m256 x = _mm256_loadu_ps(s + i);
            mx = _mm256_max_ps(mx, x);
            nf = _mm256_or_ps(nf, _mm256_cmp_ps(x, inf, _CMP_NLT_UQ)); /* NaN or +Inf */
        }
        max = hmax8(mx);
        bad = _mm256_movemask_ps(nf);
    }
    for (; i < n; i++) {
        max = s[i] > max ? s[i] : max;
        bad |= !(s[i] < INFINITY);
    }
    if (bad) { /* a NaN or +Inf score: the row is NaN (never hidden) */
        for (i = 0; i < n; i++) p[i] = NAN;
        return;
    }
    if (max == -INFINITY) {
        memset(p, 0, (size_t)n * sizeof(float));
        return;
    }
    const __m256 mv = _mm256_set1_ps(max);
    __m256d sum0 = _mm256_setzero_pd(), sum1 = _mm256_setzero_pd();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(p + i, e);
        sum0 = _mm256_add_pd(sum0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        sum1 = _mm256_add_pd(sum1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(sum0, sum1));
    double sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    for (; i < n; i++) {
        const float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - max);
        p[i] = e;
        sum += (double)e;
    }
    const float inv = (float)(1.0 / sum);
    const __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, _mm256_mul_ps(_mm256_loadu_ps(p + i), iv));
    for (; i < n; i++) p[i] *= inv;
}

void cpu_kernels_init_avx2(cpu_kernels *k) {
    k->name = "avx2";
    k->matmul[QUANT_TYPE_F32] = cpu_mm_f32_avx2;
    k->matmul[QUANT_TYPE_F16] = cpu_mm_f16_avx2;
    k->matmul[QUANT_TYPE_BF16] = cpu_mm_bf16_avx2;
    k->matmul[QUANT_TYPE_Q8_0] = mm_q8_0_avx2;
    k->matmul_packed[QUANT_TYPE_Q8_0] = cpu_mm_q8_0_x16_avx2;
    k->pack_layout[QUANT_TYPE_Q8_0] = TENSOR_LAYOUT_Q8_0_X16;
    k->matmul_packed[QUANT_TYPE_Q4_0] = cpu_mm_q4_0_x16_avx2;
    k->pack_layout[QUANT_TYPE_Q4_0] = TENSOR_LAYOUT_Q4_0_X16;
    k->matmul_packed[QUANT_TYPE_Q4_0] = cpu_mm_q4_0_x16_avx2;
    k->pack_layout[QUANT_TYPE_Q4_0] = TENSOR_LAYOUT_Q4_0_X16;
    k->matmul[QUANT_TYPE_Q4_0] = mm_q4_0_avx2;
    cpu_kernels_init_kquant_avx2(k); /* Q4_K, Q6_K (cpu_gemm_kquant_avx2.c) */
    k->act_row[QUANT_TYPE_F32] = act_row_f32_avx2;
    k->act_row[QUANT_TYPE_F16] = act_row_f16_avx2;
    k->act_row[QUANT_TYPE_BF16] = act_row_bf16_avx2;
    k->act_row[QUANT_TYPE_Q8_0] = act_row_q8_0_avx2;
    k->act_row[QUANT_TYPE_Q4_0] = act_row_q8_0_avx2;
    k->act_row[QUANT_TYPE_Q4_K] = act_row_q8_K_avx2;
    k->act_row[QUANT_TYPE_Q6_K] = act_row_q8_K_avx2;
    k->dot_f16 = dot_f16_avx2;
    k->axpy_f16 = axpy_f16_avx2;
    k->attn_pv_f16 = attn_pv_f16_avx2;
    k->softmax_row = softmax_row_avx2;
}

#else
void cpu_kernels_init_avx2(cpu_kernels *k) { (void)k; }
void cpu_mm_q8_0_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                          int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_q8_0_x16_ref(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
void cpu_mm_q4_0_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                          int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_q4_0_x16_ref(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
#endif
