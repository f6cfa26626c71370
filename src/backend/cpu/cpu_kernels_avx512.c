/* cpu_kernels_avx512.c: AVX-512 (F, BW, VL, DQ) + VNNI kernels, compiled per function with target
 * attributes and selected at run time (cpu_kernels_select), so the rest of the build stays portable.
 *
 * Matmul kernels compute a range of output rows for a tile of up to 16
 * activation rows whose accumulators stay in registers: each weight block is loaded and decoded
 * once per tile and reused for every row of it.
 * - Q8_0 / Q4_0: 16 weight blocks are transposed into 8 vectors whose 32-bit lane j holds 4 values
 *   of block j, matching the transposed Q8_0 activation layout (cpu_internal.h); vpdpbusd then
 *   accumulates each block in its own lane (weights made unsigned: Q8_0 + 128, Q4_0 nibbles; the
 *   offset is removed exactly through the activation block sums), and one f32 scale per lane
 *   (d_w * d_x) applies per 16 blocks.
 * - Q4_K / Q6_K: in cpu_gemm_kquant_avx512.c (weight rows in lanes, one decode per super-block
 *   of 16 weight rows for all activation rows).
 * - F32 / F16 / BF16: cpu_gemm_float_avx512.c. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_hsum_avx512.h"
#include "backend/cpu/cpu_ops_ref.h"
#include "base/fp16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

#include "backend/cpu/cpu_round_avx512.h"

/* ---- activation preparation ---------------------------------------------------------------- */

/* d[j] = x[j] rounded to f16, for j in [i, n): whole 16s from i as vectors, the rest one by one
 * (act_row_f16_512's rounding, which softmax_512 repeats on its probabilities). */
T512 INL void round_f16_run_512(float *d, const float *x, int64_t i, int64_t n) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, round_f16_512(_mm512_loadu_ps(x + i)));
    for (; i < n; i++) d[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
}

T512 static void act_row_f16_512(cpu_act *act, int64_t r, const float *x) {
    round_f16_run_512(act->f + r * act->n_in, x, 0, act->n_in);
}

T512 static void act_row_bf16_512(cpu_act *act, int64_t r, const float *x) {
    float *f = act->f + r * act->n_in;
    int64_t i = 0;
    for (; i + 16 <= act->n_in; i += 16) _mm512_storeu_ps(f + i, round_bf16_512(_mm512_loadu_ps(x + i)));
    for (; i < act->n_in; i++) f[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

static void act_row_f32_512(cpu_act *act, int64_t r, const float *x) {
    memcpy(act->f + r * act->n_in, x, (size_t)act->n_in * sizeof(float));
}

/* Q8_0: the 32 values of one block -> 32 int8 (q = round_half_even(x * 127 / amax)), d, -sum; a
 * block with a NaN / Inf: q = 0, d = NaN (as cpu_act_row_q8_0_ref). */
T512 INL void q8_0_block_512(const float *xb, int8_t *q, float *d, int32_t *ns) {
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1), inf = _mm512_set1_ps(INFINITY);
    if (_mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ)) {
        memset(q, 0, QK8_0);
        *d = NAN;
        *ns = 0;
        return;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    const float id = amax >= CPU_Q8_0_AMAX_MIN ? 127.0f / amax : 0.0f;
    *d = fp16_to_fp32(fp32_to_fp16(amax / 127.0f));
    const __m512 m = _mm512_set1_ps(id);
    const __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(i1));
    *ns = -_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}

T512 static void act_row_q8_0_512(cpu_act *act, int64_t r, const float *x) {
    const int64_t nb = act->n_in / QK8_0, nb_pad = act->row_len / QK8_0;
    int8_t *qs = act->qs + r * act->row_len;
    float *d = act->d + r * nb_pad;
    int32_t *ns = act->ns + r * nb_pad;
    /* a group is quantized block-major into tmp, then transposed with 8 dword gathers */
    int8_t tmp[CPU_Q8_0_GROUP_VALUES] __attribute__((aligned(64)));
    const __m512i idx0 = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
    for (int64_t g = 0; g < nb_pad / CPU_Q8_0_GROUP; g++) {
        for (int j = 0; j < CPU_Q8_0_GROUP; j++) {
            const int64_t b = g * CPU_Q8_0_GROUP + j;
            if (b < nb) {
                q8_0_block_512(x + b * QK8_0, tmp + j * QK8_0, d + b, ns + b);
            } else {
                memset(tmp + j * QK8_0, 0, QK8_0);
                d[b] = 0.0f;
                ns[b] = 0;
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i v = _mm512_i32gather_epi32(_mm512_add_epi32(idx0, _mm512_set1_epi32(k)), tmp, 4);
            _mm512_storeu_si512(qs + g * CPU_Q8_0_GROUP_VALUES + k * 64, v);
        }
    }
}

T512 static void act_row_q8_K_512(cpu_act *act, int64_t r, const float *x) {
    const int64_t nb = act->n_in / QK_K;
    int8_t *qs = act->qs + r * act->n_in;
    float *d = act->d + r * nb;
    int16_t *bsums = act->bsums + r * (act->n_in / 16);
    uint8_t *qu = act->qsu + r * act->n_in;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK_K;
        __m512 am = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int j = 0; j < QK_K; j += 16) {
            const __m512 a = _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + j));
            bad |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ); /* NaN or Inf */
            am = _mm512_max_ps(am, a);
        }
        const float amax = _mm512_reduce_max_ps(am);
        if (bad || amax < CPU_Q8_0_AMAX_MIN) { /* as cpu_act_row_q8_K_ref: NaN / Inf -> d = NaN; tiny -> 0 */
            d[b] = bad ? NAN : 0.0f;
            memset(qs + b * QK_K, 0, QK_K);
            memset(qu + b * QK_K, 128, QK_K);
            memset(bsums + b * 16, 0, 16 * sizeof(int16_t));
            continue;
        }
        /* the first value of largest magnitude, with its sign */
        float max = 0.0f;
        for (int j = 0; j < QK_K; j += 16) {
            __mmask16 m = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + j)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (m) {
                max = xb[j + __builtin_ctz((unsigned)m)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m512 is = _mm512_set1_ps(iscale);
        const __m512i lim = _mm512_set1_epi32(127);
        __m512i sad[4]; /* per 64 values: the sums of 8 of the unsigned codes q + 128 */
#pragma GCC unroll 4
        for (int j = 0; j < QK_K; j += 64) {
            __m128i q8[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + j + 16 * k), is),
                                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q8[k] = _mm512_cvtsepi32_epi8(_mm512_min_epi32(q, lim)); /* -127..127: exact */
            }
            __m512i v = _mm512_castsi128_si512(q8[0]);
            v = _mm512_inserti32x4(v, q8[1], 1);
            v = _mm512_inserti32x4(v, q8[2], 2);
            v = _mm512_inserti32x4(v, q8[3], 3);
            const __m512i u = _mm512_xor_si512(v, _mm512_set1_epi8(-128)); /* q + 128 */
            _mm512_storeu_si512(qs + b * QK_K + j, v);
            _mm512_storeu_si512(qu + b * QK_K + j, u);
            sad[j / 64] = _mm512_sad_epu8(u, _mm512_setzero_si512());
        }
        /* the 16 sums of 16: adjacent sad qwords added (exact integers), less 16 * 128 */
        const __m512i ev = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), od = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
        const __m128i off = _mm_set1_epi16(16 * 128);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i a = sad[2 * h], c = sad[2 * h + 1];
            const __m512i sum = _mm512_add_epi64(_mm512_permutex2var_epi64(a, ev, c), _mm512_permutex2var_epi64(a, od, c));
            _mm_storeu_si128((__m128i *)(bsums + b * 16 + 8 * h), _mm_sub_epi16(_mm512_cvtepi64_epi16(sum), off));
        }
        d[b] = 1.0f / iscale;
    }
    cpu_act_q8_K_sums32(act, r);
}

/* ---- horizontal sums, identical bits for a row whatever the tile size ------------------------ */

/* hsum16_one, hsum16_tree: cpu_hsum_avx512.h (shared with cpu_gemm_float_avx512.c). */

/* dst[(r0 + r) * ds + o] = sum of acc[r], r < NT. */
T512 INL void store_sums(const __m512 *acc, const int NT, float *dst, int64_t r0, int64_t ds, int64_t o) {
    if (NT <= 3) {
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) dst[(r0 + r) * ds + o] = hsum16_one(acc[r]);
        return;
    }
    float tmp[16] __attribute__((aligned(64)));
    _mm512_store_ps(tmp, hsum16_tree(acc, NT));
#pragma GCC unroll 16
    for (int r = 0; r < NT; r++) dst[(r0 + r) * ds + o] = tmp[r];
}

/* ---- Q8_0 / Q4_0 x Q8_0 (transposed groups of 16 blocks) -------------------------------------- */

/* 8x8 transpose of dwords inside each 256-bit half of z[0..7] (row j, column k) into v[k]. */
T512 INL void transpose_8x8_halves(const __m512i z[8], __m512i v[8]) {
    __m512i t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        v[k] = _mm512_permutex2var_epi64(u[k], lo, u[k + 4]);
        v[k + 4] = _mm512_permutex2var_epi64(u[k], hi, u[k + 4]);
    }
}

/* Group g (blocks 16g .. 16g + 15, of which `nv` exist) of a Q8_0 weight row: w[k] lane j = values
 * 4k..4k+3 of block j plus 128 (unsigned), dw lane j = d of block j (0 for missing blocks). */
T512 INL void q8_0_group(const block_q8_0 *blk, int nv, __m512i w[8], __m512 *dw) {
    __m512i z[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m256i a = j < nv ? _mm256_loadu_si256((const __m256i *)blk[j].qs) : _mm256_setzero_si256();
        const __m256i b = j + 8 < nv ? _mm256_loadu_si256((const __m256i *)blk[j + 8].qs) : _mm256_setzero_si256();
        z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    }
    transpose_8x8_halves(z, w);
    const __m512i off = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) w[k] = _mm512_xor_si512(w[k], off);
    const __m512i idx = _mm512_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238, 272, 306, 340, 374, 408, 442, 476, 510);
    const __mmask16 m = nv >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
    const __m512i dd = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, (const void *)blk, 1);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
}

/* The same for Q4_0: w[k] lane j = nibble values 4k..4k+3 of block j (0..15, unsigned). */
T512 INL void q4_0_group(const block_q4_0 *blk, int nv, __m512i w[8], __m512 *dw) {
    __m512i z[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m128i p[4];
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {
            const int b = j + 4 * l;
            p[l] = b < nv ? _mm_loadu_si128((const __m128i *)blk[b].qs) : _mm_setzero_si128();
        }
        __m512i v = _mm512_castsi128_si512(p[0]);
        v = _mm512_inserti32x4(v, p[1], 1);
        v = _mm512_inserti32x4(v, p[2], 2);
        z[j] = _mm512_inserti32x4(v, p[3], 3);
    }
    /* 4x4 dword transpose inside each 128-bit lane: lane L of z[j] is block j + 4L */
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    __m512i c[4];
    c[0] = _mm512_unpacklo_epi64(t0, t2);
    c[1] = _mm512_unpackhi_epi64(t0, t2);
    c[2] = _mm512_unpacklo_epi64(t1, t3);
    c[3] = _mm512_unpackhi_epi64(t1, t3);
    const __m512i low = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        w[k] = _mm512_and_si512(c[k], low);
        w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(c[k], 4), low);
    }
    const __m512i idx = _mm512_setr_epi32(0, 18, 36, 54, 72, 90, 108, 126, 144, 162, 180, 198, 216, 234, 252, 270);
    const __mmask16 m = nv >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
    const __m512i dd = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, (const void *)blk, 1);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
}

/* One weight row o against NT activation rows from r0. Q4 selects Q4_0 (else Q8_0). */
T512 INL void q80_tile(const void *wrow, const int Q4, const cpu_act *act, int64_t r0, const int NT, float *dst,
                       int64_t ds, int64_t o) {
    const int64_t nb = act->n_in / QK8_0, ng = act->row_len / CPU_Q8_0_GROUP_VALUES;
    const int64_t nbp = act->row_len / QK8_0;
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < NT; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512i w[8];
        __m512 dw;
        const int64_t rem = nb - g * CPU_Q8_0_GROUP;
        const int nv = rem >= CPU_Q8_0_GROUP ? CPU_Q8_0_GROUP : (int)rem;
        if (Q4) {
            q4_0_group((const block_q4_0 *)wrow + g * CPU_Q8_0_GROUP, nv, w, &dw);
        } else {
            q8_0_group((const block_q8_0 *)wrow + g * CPU_Q8_0_GROUP, nv, w, &dw);
        }
#pragma GCC unroll 16
        for (int r = 0; r < NT; r++) {
            const int8_t *xq = act->qs + (r0 + r) * act->row_len + g * CPU_Q8_0_GROUP_VALUES;
            const __m512i ns = _mm512_loadu_si512(act->ns + (r0 + r) * nbp + g * CPU_Q8_0_GROUP);
            __m512i isum = _mm512_slli_epi32(ns, Q4 ? 3 : 7); /* remove the +8 / +128 offset */
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) isum = _mm512_dpbusd_epi32(isum, w[k], _mm512_loadu_si512(xq + 64 * k));
            const __m512 dx = _mm512_loadu_ps(act->d + (r0 + r) * nbp + g * CPU_Q8_0_GROUP);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[r]);
        }
    }
    store_sums(acc, NT, dst, r0, ds, o);
}

#define TILE_SWITCH(NT_VAR, CALL)                                                                         \
    switch (NT_VAR) {                                                                                     \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break;     \
    case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break; case 8: CALL(8); break;     \
    case 9: CALL(9); break; case 10: CALL(10); break; case 11: CALL(11); break; case 12: CALL(12); break; \
    case 13: CALL(13); break; case 14: CALL(14); break; case 15: CALL(15); break; default: CALL(16); break; \
    }

/* 4 weight rows x 4 activation rows per step: per k, 4 activation and 4 weight vectors feed 16
 * vpdpbusd (the row-at-a-time loop needs one load per vpdpbusd, and loads are the limit). The 4
 * weight rows are decoded once for all groups into wc; the f32 accumulators of a 4x4 tile live in
 * L1. Each (weight row, activation row) pair goes through exactly the operations of q80_tile, so
 * the results are bit-identical to it (batch invariance). */
#define Q80_MAXG 32 /* n_in <= 16384 (larger rows use q80_tile only) */

T512 INL void q80_block4(const void *w, size_t w_nb1, const int Q4, const cpu_act *act, int64_t r0, int64_t nr,
                         float *dst, int64_t ds, int64_t o, int no) {
    const int64_t nb = act->n_in / QK8_0, ng = act->row_len / CPU_Q8_0_GROUP_VALUES;
    const int64_t nbp = act->row_len / QK8_0;
    __m512i wc[4][Q80_MAXG][8];
    __m512 dwc[4][Q80_MAXG];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const void *wrow = (const char *)w + (size_t)(o + (i < no ? i : no - 1)) * w_nb1;
        for (int64_t g = 0; g < ng; g++) {
            const int64_t rem = nb - g * CPU_Q8_0_GROUP;
            const int nv = rem >= CPU_Q8_0_GROUP ? CPU_Q8_0_GROUP : (int)rem;
            if (Q4) {
                q4_0_group((const block_q4_0 *)wrow + g * CPU_Q8_0_GROUP, nv, wc[i][g], &dwc[i][g]);
            } else {
                q8_0_group((const block_q8_0 *)wrow + g * CPU_Q8_0_GROUP, nv, wc[i][g], &dwc[i][g]);
            }
        }
    }
    int64_t rt = r0;
    for (; rt + 4 <= r0 + nr; rt += 4) {
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) acc[i][r] = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const int8_t *xq[4];
            __m512i is[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                xq[r] = act->qs + (rt + r) * act->row_len + g * CPU_Q8_0_GROUP_VALUES;
                const __m512i init = _mm512_slli_epi32(_mm512_loadu_si512(act->ns + (rt + r) * nbp + g * CPU_Q8_0_GROUP),
                                                       Q4 ? 3 : 7);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) is[i][r] = init;
            }
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m512i x[4];
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
                    x[r] = _mm512_loadu_si512(xq[r] + 64 * k);
                    __asm__("" : "+v"(x[r])); /* keep it in a register: one load, four uses */
                }
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    __m512i wk = wc[i][g][k];
                    __asm__("" : "+v"(wk));
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) is[i][r] = _mm512_dpbusd_epi32(is[i][r], wk, x[r]);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512 dx = _mm512_loadu_ps(act->d + (rt + r) * nbp + g * CPU_Q8_0_GROUP);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[i][r]), _mm512_mul_ps(dwc[i][g], dx), acc[i][r]);
                }
            }
        }
        /* the 16 sums in one reduction tree (lane r * 4 + i; the same bits as hsum16_one), then a
         * row's 4 outputs in one store */
        __m512 flat[16];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) flat[r * 4 + i] = acc[i][r];
        float tmp[16] __attribute__((aligned(64)));
        _mm512_store_ps(tmp, hsum16_tree(flat, 16));
        if (no == 4) {
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) _mm_storeu_ps(dst + (rt + r) * ds + o, _mm_load_ps(tmp + 4 * r));
        } else {
            for (int r = 0; r < 4; r++)
                for (int i = 0; i < no; i++) dst[(rt + r) * ds + o + i] = tmp[r * 4 + i];
        }
    }
    /* the last nr % 4 rows, one weight row at a time */
    if (rt < r0 + nr) {
        const int nt = (int)(r0 + nr - rt);
        for (int i = 0; i < no; i++) {
            const void *wrow = (const char *)w + (size_t)(o + i) * w_nb1;
            switch (nt) {
            case 1: q80_tile(wrow, Q4, act, rt, 1, dst, ds, o + i); break;
            case 2: q80_tile(wrow, Q4, act, rt, 2, dst, ds, o + i); break;
            default: q80_tile(wrow, Q4, act, rt, 3, dst, ds, o + i); break;
            }
        }
    }
}

T512 INL void mm_q80_512(const void *w, size_t w_nb1, const int Q4, const cpu_act *act, int64_t r0, int64_t nr,
                         float *dst, int64_t ds, int64_t o0, int64_t o1) {
    if (nr >= 4 && act->row_len / CPU_Q8_0_GROUP_VALUES <= Q80_MAXG) {
        const size_t row_bytes = (size_t)(act->n_in / QK8_0) * (Q4 ? sizeof(block_q4_0) : sizeof(block_q8_0));
        for (int64_t o = o0; o < o1; o += 4) {
            /* the next 4 weight rows are needed after a lot of arithmetic: fetch them now (the
             * hardware prefetcher alone leaves the tile waiting on memory once W exceeds the caches) */
            const int64_t on = o + 4 < o1 ? o + 4 : o1;
            const int64_t oe = on + 4 < o1 ? on + 4 : o1;
            for (const char *pf = (const char *)w + (size_t)on * w_nb1; pf < (const char *)w + (size_t)(oe - 1) * w_nb1 + row_bytes;
                 pf += 64) {
                _mm_prefetch(pf, _MM_HINT_T0);
            }
            q80_block4(w, w_nb1, Q4, act, r0, nr, dst, ds, o, o1 - o >= 4 ? 4 : (int)(o1 - o));
        }
        return;
    }
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = (const char *)w + (size_t)o * w_nb1;
        for (int64_t rt = r0; rt < r0 + nr; rt += 16) {
            const int nt = r0 + nr - rt >= 16 ? 16 : (int)(r0 + nr - rt);
#define CALL(N) q80_tile(wrow, Q4, act, rt, N, dst, ds, o)
            TILE_SWITCH(nt, CALL)
#undef CALL
        }
    }
}

T512 static void mm_q8_0_512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    mm_q80_512(w, w_nb1, 0, act, r0, nr, dst, ds, o0, o1);
}

T512 static void mm_q4_0_512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    mm_q80_512(w, w_nb1, 1, act, r0, nr, dst, ds, o0, o1);
}

/* Q4_K / Q6_K weights: cpu_gemm_kquant_avx512.c; F32 / F16 / BF16 weights: cpu_gemm_float_avx512.c. */

/* ---- attention helpers ------------------------------------------------------------------------- */

T512 static float dot_f16_512(const float *x, const uint16_t *y, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))), acc);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + i)), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

T512 static void axpy_f16_512(float *y, float a, const uint16_t *x, int64_t n) {
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                                                _mm512_loadu_ps(y + i)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)),
                                                        _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* e^x for x <= 0 (after max subtraction): x = n ln2 + r, |r| <= ln2 / 2, e^r by its degree-7
 * Taylor polynomial (relative error < 2e-8 before rounding), times 2^n with vscalefps; x < -104
 * gives 0. */
T512 INL __m512 exp_neg512(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ);
    return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
}

/* softmax_row_512's body. With PROBS (attn_probs_row_512) the scores are first scaled as the f16
 * attention does (t = s * scale + 0.0f for j < n_vis, -inf after) and stored, and the
 * probabilities come out rounded to f16 (as act_row_f16_512 rounds them), in the passes that
 * already read them: the same operations in the same order as the three steps apart. */
T512 INL void softmax_512(float *p, const float *s, int64_t n, const bool PROBS, float scale, int64_t n_vis) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    const __m512 inf = _mm512_set1_ps(INFINITY), ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
    int64_t i = 0;
    __mmask16 nf = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(s + i);
        if (PROBS) {
            const __mmask16 vis = i + 16 <= n_vis ? (__mmask16)0xffff : i >= n_vis ? (__mmask16)0 : (__mmask16)((1u << (n_vis - i)) - 1);
            x = _mm512_mask_blend_ps(vis, ninf, _mm512_add_ps(_mm512_mul_ps(x, sc), _mm512_setzero_ps()));
            _mm512_storeu_ps(p + i, x);
        }
        mx = _mm512_max_ps(mx, x);
        nf |= _mm512_cmp_ps_mask(x, inf, _CMP_NLT_UQ); /* NaN or +Inf */
    }
    float max = _mm512_reduce_max_ps(mx);
    int bad = nf != 0;
    for (; i < n; i++) {
        float x = s[i];
        if (PROBS) {
            x = i < n_vis ? x * scale + 0.0f : -INFINITY;
            p[i] = x;
        }
        max = x > max ? x : max;
        bad |= !(x < INFINITY);
    }
    if (PROBS) s = p; /* the scaled scores */
    if (bad) { /* a NaN or +Inf score: the row is NaN (never hidden) */
        for (i = 0; i < n; i++) p[i] = NAN;
        if (PROBS) round_f16_run_512(p, p, 0, n); /* rounded as act_row_f16_512 rounds */
        return;
    }
    if (max == -INFINITY) {
        memset(p, 0, (size_t)n * sizeof(float)); /* f16 zeros too */
        return;
    }
    const __m512 mv = _mm512_set1_ps(max);
    __m512d sum0 = _mm512_setzero_pd(), sum1 = _mm512_setzero_pd();
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 e = exp_neg512(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv)); /* -inf -> 0 */
        _mm512_storeu_ps(p + i, e);
        sum0 = _mm512_add_pd(sum0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sum1 = _mm512_add_pd(sum1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(sum0, sum1));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(m, exp_neg512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), mv)));
        _mm512_mask_storeu_ps(p + i, m, e);
        sum += _mm512_reduce_add_pd(_mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)),
                                                  _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1))));
    }
    const __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(p + i), inv);
        _mm512_storeu_ps(p + i, PROBS ? round_f16_512(y) : y);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(p + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + i), inv));
        if (PROBS) round_f16_run_512(p, p, i, n); /* the tail, one by one as act_row_f16_512 */
    }
}

T512 static void softmax_row_512(float *p, const float *s, int64_t n) { softmax_512(p, s, n, false, 1.0f, n); }

/* cpu_attn_probs_fn: the structured-mask attention row in one kernel (cpu_internal.h). */
T512 static void attn_probs_row_512(float *s, int64_t n, int64_t n_vis, float scale) {
    softmax_512(s, s, n, true, scale, n_vis);
}

/* ---- attention: P V over f16 value rows ------------------------------------------------------ */

/* out[r] (+0 .. 16 NC - 1 of chunk i0) = sum over j ascending of p[r][j] * v_j, NR query rows at
 * once: each value vector is converted once for NR rows. MASK: a key whose p is 0 is skipped (its
 * value may be inf or NaN: a masked cell); without MASK (every value finite) it is added as
 * 0 * v = +-0, which leaves the sum as skipping it would: x + (+-0) = x for x != 0 and
 * +0 + (+-0) = +0 (the sum starts at +0; only a sum that underflowed to -0 would turn +0, a value
 * equal to it). CHECK: also tests every value loaded for inf / NaN (an f16 whose exponent bits are
 * all set) and returns true when one was found (the sums are then unusable without MASK, and
 * are not stored). acc: the sums start from out (the earlier keys' sums, cpu_attn_pv_fn).
 * The value rows are prefetched 16 keys ahead: they lie n_head_kv * head_dim * 2 bytes apart (one
 * row of the cache per key), a stride the hardware prefetchers follow poorly across pages (16 rows
 * x 4097 cells: 4.7 -> 2.7 ms on Zen 5). */
T512 INL bool pv_tile(float *out, int64_t ldo, const float *p, int64_t ldp, const int NR, const void *v, size_t v_nb,
                      int64_t n_kv, int64_t i0, int64_t hd, const int NC, const bool MASK, const bool CHECK, bool acc) {
    __mmask16 m[8];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        const int64_t left = hd - i0 - 16 * c;
        m[c] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
    }
    const int64_t left = hd - i0 < 16 * NC ? hd - i0 : 16 * NC;
    const int n_lines = (int)((2 * left + 63) / 64); /* cache lines of a row's chunk */
    const __m256i em = _mm256_set1_epi16(0x7c00);
    __mmask16 bad = 0;
    __m512 sum[6][8];
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            sum[r][c] = acc ? _mm512_maskz_loadu_ps(m[c], out + r * ldo + i0 + 16 * c) : _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < n_kv; j++) {
        const uint16_t *vr = (const uint16_t *)((const char *)v + (size_t)j * v_nb) + i0;
#pragma GCC unroll 4
        for (int l = 0; l < NC / 2; l++) {
            if (l < n_lines) _mm_prefetch((const char *)vr + 16 * v_nb + 64 * l, _MM_HINT_T0);
        }
        __m512 vv[8];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            const __m256i raw = _mm256_maskz_loadu_epi16(m[c], vr + 16 * c);
            if (CHECK) bad |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(raw, em), em);
            vv[c] = _mm512_cvtph_ps(raw);
        }
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) {
            const float pr = p[r * ldp + j];
            const __m512 pb = _mm512_set1_ps(pr);
            if (MASK) {
                /* a masked key (p = 0) adds nothing, even where its value is inf */
                const __mmask16 nz = pr != 0.0f ? (__mmask16)0xffff : (__mmask16)0;
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) sum[r][c] = _mm512_mask3_fmadd_ps(pb, vv[c], sum[r][c], nz);
            } else {
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) sum[r][c] = _mm512_fmadd_ps(pb, vv[c], sum[r][c]);
            }
        }
    }
    /* a tile that found an inf or NaN stores nothing: its sums are unusable, and the redo starts
     * from out (0, or the earlier keys' sums with acc) */
    if (CHECK && bad != 0) return true;
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) _mm512_mask_storeu_ps(out + r * ldo + i0 + 16 * c, m[c], sum[r][c]);
    }
    return false;
}

/* One tile of nr (1..6) rows; chunks of 128 values (NC 8) for up to 2 rows. */
T512 INL bool pv_tile_nr(float *o, int64_t ldo, const float *pr, int64_t ldp, int nr, const void *v, size_t v_nb,
                         int64_t n_kv, int64_t i0, int64_t hd, const bool wide, const bool MASK, const bool CHECK,
                         bool acc) {
    if (wide) {
        return nr == 1 ? pv_tile(o, ldo, pr, ldp, 1, v, v_nb, n_kv, i0, hd, 8, MASK, CHECK, acc)
                       : pv_tile(o, ldo, pr, ldp, 2, v, v_nb, n_kv, i0, hd, 8, MASK, CHECK, acc);
    }
    switch (nr) {
    case 1: return pv_tile(o, ldo, pr, ldp, 1, v, v_nb, n_kv, i0, hd, 4, MASK, CHECK, acc);
    case 2: return pv_tile(o, ldo, pr, ldp, 2, v, v_nb, n_kv, i0, hd, 4, MASK, CHECK, acc);
    case 3: return pv_tile(o, ldo, pr, ldp, 3, v, v_nb, n_kv, i0, hd, 4, MASK, CHECK, acc);
    case 4: return pv_tile(o, ldo, pr, ldp, 4, v, v_nb, n_kv, i0, hd, 4, MASK, CHECK, acc);
    case 5: return pv_tile(o, ldo, pr, ldp, 5, v, v_nb, n_kv, i0, hd, 4, MASK, CHECK, acc);
    default: return pv_tile(o, ldo, pr, ldp, 6, v, v_nb, n_kv, i0, hd, 4, MASK, CHECK, acc);
    }
}

/* The values the caller does not vouch for are checked in the first row tile of each chunk, in
 * the same pass that multiplies them (before, a separate pass over the value rows, without
 * prefetch, took 59% of the kernel's time in a decode step after 4096 cells on Zen 4): a chunk
 * found all finite takes the tiles without the per-key zero test (with the value prefetch, 8-10%
 * less attention time at 16-128 rows over ~1000 cells on Zen 5), one with an inf or NaN redoes
 * that tile with it. Either way the sums are the same bits (pv_tile). Up to 2 query rows (a
 * decode step's query heads of one kv head) take the whole 128 values of a row per pass. */
T512 static int64_t attn_pv_f16_512(float *out, int64_t ldo, const float *p, int64_t ldp, int64_t nq, const void *v,
                                    size_t v_nb, int64_t n_kv, int64_t hd, int64_t n_fin, bool acc) {
    if (nq <= 0) return n_fin; /* nothing read, nothing checked */
    const bool known = n_fin >= n_kv, wide = nq <= 2 && hd > 64;
    const int64_t step = wide ? 128 : 64;
    bool all_fin = true;
    for (int64_t i0 = 0; i0 < hd; i0 += step) {
        bool checked = known, mask = false; /* this chunk's values: checked, and the zero test needed */
        for (int64_t r0 = 0; r0 < nq; r0 += 6) {
            const int nr = nq - r0 >= 6 ? 6 : (int)(nq - r0);
            float *o = out + r0 * ldo;
            const float *pr = p + r0 * ldp;
            if (!checked) { /* the chunk's first tile checks as it goes; found finite, it is done */
                checked = true;
                if (!pv_tile_nr(o, ldo, pr, ldp, nr, v, v_nb, n_kv, i0, hd, wide, false, true, acc)) continue;
                mask = true; /* an inf or NaN: this tile again, and the rest, with the zero test */
                all_fin = false;
            }
            if (mask) pv_tile_nr(o, ldo, pr, ldp, nr, v, v_nb, n_kv, i0, hd, wide, true, false, acc);
            else pv_tile_nr(o, ldo, pr, ldp, nr, v, v_nb, n_kv, i0, hd, wide, false, false, acc);
        }
    }
    return known || all_fin ? n_kv : n_fin;
}

/* ---- light-op rows --------------------------------------------------------------------------- */

/* Same products and final roundings as cpu_rmsnorm_row_ref; the f64 sum of squares runs in 16
 * lanes (the order differs, so the mean may differ from the reference's in its last f64 bits). */
T512 static void rmsnorm_row_512(float *d, const float *x, const float *w, int64_t n, float eps) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i), sq = _mm512_mul_ps(v, v);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sq, 1)));
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const __m512 sc = _mm512_set1_ps(1.0f / sqrtf(mean + eps));
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sc);
        if (w != NULL) y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(d + i, m, y);
    }
}

/* silu(g) * u with e = e^-|g| (never overflows): g >= 0: g / (1 + e), else g e / (1 + e). */
T512 static void swiglu_row_512(float *d, const float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = exp_neg512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));
        const __mmask16 neg = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_LT_OQ);
        const __m512 num = _mm512_mask_mul_ps(gv, neg, gv, e);
        const __m512 s = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(d + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

T512 static void add_row_512(float *d, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(d + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
    }
}

T512 static void mul_row_512(float *d, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(d + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
    }
}

/* The first index of the maximum; a row with a NaN or an Inf (v - v is NaN exactly for those)
 * takes the reference's scan, which flags the first one. */
T512 static int32_t argmax_row_512(const float *x, int64_t n) {
    if (n < 16) return cpu_argmax_row_ref(x, n);
    __m512 mx = _mm512_loadu_ps(x);
    __mmask16 bad = _mm512_cmp_ps_mask(_mm512_sub_ps(mx, mx), _mm512_setzero_ps(), _CMP_NEQ_UQ);
    int64_t i = 16;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_NEQ_UQ);
        mx = _mm512_max_ps(mx, v);
    }
    float best = _mm512_reduce_max_ps(mx);
    for (int64_t j = i; j < n; j++) {
        if (!isfinite(x[j])) bad = 1;
        best = x[j] > best ? x[j] : best;
    }
    if (bad) return cpu_argmax_row_ref(x, n);
    const __m512 bv = _mm512_set1_ps(best);
    for (i = 0; i + 16 <= n; i += 16) {
        const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), bv, _CMP_EQ_OQ);
        if (eq) return (int32_t)(i + __builtin_ctz((unsigned)eq));
    }
    for (; i < n; i++) {
        if (x[i] == best) return (int32_t)i;
    }
    return 0;
}

/* Round to nearest even, as fp32_to_fp16 (NaNs keep a quiet NaN, maybe another payload). */
T512 static void f16_row_512(uint16_t *d, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(d + i, m, h);
    }
}

/* The rotation of cpu_rope_row (the same products, differences and sums in f32, so the same
 * bits), 16 pairs a step: NEOX pairs (i, i + n_rot / 2) from two contiguous runs, NORM pairs
 * (2i, 2i + 1) split into even and odd lanes and merged back; cs holds (cos, sin) pairs. A pp512
 * profile of the 0.6B-dimension model spent 2.3% in the scalar rotation. */
T512 static void rope_row_512(float *dr, const float *xr, const float *cs, int64_t hd, int32_t n_rot, bool norm) {
    const int32_t half = n_rot / 2;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int32_t i = 0; i < half; i += 16) {
        const int32_t k = half - i >= 16 ? 16 : half - i; /* pairs this step */
        const __mmask16 m = (__mmask16)((1u << k) - 1);
        const __mmask16 m0 = (__mmask16)(k >= 8 ? 0xffffu : (1u << (2 * k)) - 1);
        const __mmask16 m1 = (__mmask16)(k > 8 ? (1u << (2 * (k - 8))) - 1 : 0);
        const __m512 ca = _mm512_maskz_loadu_ps(m0, cs + 2 * i), cb = _mm512_maskz_loadu_ps(m1, cs + 2 * i + 16);
        const __m512 c = _mm512_permutex2var_ps(ca, ev, cb), sn = _mm512_permutex2var_ps(ca, od, cb);
        __m512 x0, x1;
        if (norm) {
            const __m512 a = _mm512_maskz_loadu_ps(m0, xr + 2 * i), b = _mm512_maskz_loadu_ps(m1, xr + 2 * i + 16);
            x0 = _mm512_permutex2var_ps(a, ev, b);
            x1 = _mm512_permutex2var_ps(a, od, b);
        } else {
            x0 = _mm512_maskz_loadu_ps(m, xr + i);
            x1 = _mm512_maskz_loadu_ps(m, xr + half + i);
        }
        const __m512 d0 = _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, sn));
        const __m512 d1 = _mm512_add_ps(_mm512_mul_ps(x0, sn), _mm512_mul_ps(x1, c));
        if (norm) {
            _mm512_mask_storeu_ps(dr + 2 * i, m0, _mm512_permutex2var_ps(d0, lo, d1));
            _mm512_mask_storeu_ps(dr + 2 * i + 16, m1, _mm512_permutex2var_ps(d0, hi, d1));
        } else {
            _mm512_mask_storeu_ps(dr + i, m, d0);
            _mm512_mask_storeu_ps(dr + half + i, m, d1);
        }
    }
    for (int64_t i = n_rot; i < hd; i++) dr[i] = xr[i];
}

void cpu_kernels_init_avx512(cpu_kernels *k) {
    k->name = "avx512";
    k->matmul[QUANT_TYPE_F32] = cpu_mm_f32_avx512;
    k->matmul[QUANT_TYPE_F16] = cpu_mm_f16_avx512;
    k->matmul[QUANT_TYPE_BF16] = cpu_mm_bf16_avx512;
    k->matmul[QUANT_TYPE_Q8_0] = mm_q8_0_512;
    k->matmul_packed[QUANT_TYPE_Q8_0] = cpu_mm_q8_0_x16_avx512;
    k->pack_layout[QUANT_TYPE_Q8_0] = TENSOR_LAYOUT_Q8_0_X16;
    k->matmul_packed[QUANT_TYPE_Q4_0] = cpu_mm_q4_0_x16_avx512;
    k->pack_layout[QUANT_TYPE_Q4_0] = TENSOR_LAYOUT_Q4_0_X16;
    k->matmul[QUANT_TYPE_Q4_0] = mm_q4_0_512;
    cpu_kernels_init_kquant_avx512(k); /* Q4_K, Q6_K (cpu_gemm_kquant_avx512.c) */
    k->act_row[QUANT_TYPE_F32] = act_row_f32_512;
    k->act_row[QUANT_TYPE_F16] = act_row_f16_512;
    k->act_row[QUANT_TYPE_BF16] = act_row_bf16_512;
    k->act_row[QUANT_TYPE_Q8_0] = act_row_q8_0_512;
    k->act_row[QUANT_TYPE_Q4_0] = act_row_q8_0_512;
    k->act_row[QUANT_TYPE_Q4_K] = act_row_q8_K_512;
    k->act_row[QUANT_TYPE_Q6_K] = act_row_q8_K_512;
    k->dot_f16 = dot_f16_512;
    k->axpy_f16 = axpy_f16_512;
    k->softmax_row = softmax_row_512;
    k->attn_probs_row = attn_probs_row_512;
    k->attn_pv_f16 = attn_pv_f16_512;
    k->rmsnorm_row = rmsnorm_row_512;
    k->swiglu_row = swiglu_row_512;
    k->add_row = add_row_512;
    k->mul_row = mul_row_512;
    k->argmax_row = argmax_row_512;
    k->f16_row = f16_row_512;
    k->rope_row = rope_row_512;
}

#else
void cpu_kernels_init_avx512(cpu_kernels *k) { (void)k; }
#endif
