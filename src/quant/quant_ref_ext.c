/* quant_ref_ext.c: scalar reference dequantize-row functions for Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
 * Q5_K, IQ4_NL, IQ4_XS and quantize-row functions for Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS. The
 * arithmetic follows the formats' definitions in llama.cpp's ggml (same f32 products in the same
 * order), so the results are bit-identical to ggml's; the quantizers make the same choices as the
 * ones llama-quantize calls without an importance matrix (quantize_q4_1 ... quantize_iq4_xs).
 * Where ggml's float->int conversion is undefined (NaN, infinities) we saturate instead. */
#include "quant/quant_ref.h"

#include "base/fp16.h"

#include <float.h>
#include <math.h>
#include <string.h>

const int8_t quant_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- dequantization ------------------------------------------------------------------------ */

void dequantize_row_q4_1_ref(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        float *y = dst + i * 32; /* [32] */
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
            y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

/* The 5-bit values of a Q5_0 / Q5_1 block (0..31), weight order. */
static void q5_values(const uint8_t *qs, const uint8_t *qh4, int *v) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int j = 0; j < 16; j++) {
        v[j] = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
        v[j + 16] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    }
}

void dequantize_row_q5_0_ref(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = fp16_to_fp32(b[i].d);
        int v[32];
        q5_values(b[i].qs, b[i].qh, v);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = (float)(v[j] - 16) * d;
    }
}

void dequantize_row_q5_1_ref(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        int v[32];
        q5_values(b[i].qs, b[i].qh, v);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = (float)v[j] * d + m;
    }
}

void dequantize_row_q2_K_ref(const void *src, float *dst, int64_t n) {
    const block_q2_K *b = src; /* [n / 256] blocks */
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        float *y = dst + i * QK_K; /* [256] */
        for (int e = 0; e < QK_K; e++) {
            const int half = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t sc = b[i].scales[e / 16];
            const int q = (b[i].qs[32 * half + l] >> (2 * k)) & 3;
            const float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
            y[e] = dl * (float)q - ml;
        }
    }
}

/* Q3_K: the 16 six-bit scales (0..63, before the -32). */
static void q3_K_scales(const uint8_t *s, int *sc) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = lo | (hi << 4);
    }
}

void dequantize_row_q3_K_ref(const void *src, float *dst, int64_t n) {
    const block_q3_K *b = src; /* [n / 256] blocks */
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = fp16_to_fp32(b[i].d);
        int sc[16];
        q3_K_scales(b[i].scales, sc);
        float *y = dst + i * QK_K; /* [256] */
        for (int e = 0; e < QK_K; e++) {
            const int half = e / 128, k = (e % 128) / 32, l = e % 32;
            const int q2 = (b[i].qs[32 * half + l] >> (2 * k)) & 3;
            const int h = (b[i].hmask[l] >> (4 * half + k)) & 1;
            const float dl = d * (float)(sc[e / 16] - 32);
            y[e] = dl * (float)(q2 - (h ? 0 : 4));
        }
    }
}

/* Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) (ggml's get_scale_min_k4). */
static void k4_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

void dequantize_row_q5_K_ref(const void *src, float *dst, int64_t n) {
    const block_q5_K *b = src; /* [n / 256] blocks */
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        float *y = dst + i * QK_K; /* [256] */
        for (int j = 0; j < 8; j++) { /* sub-block j: weights 32j .. 32j+31 */
            int sc, m;
            k4_scale_min(j, b[i].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *ql = b[i].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                const int lo = (j & 1) ? ql[l] >> 4 : ql[l] & 0x0f;
                const int hi = (b[i].qh[l] >> j) & 1;
                y[32 * j + l] = dl * (float)(lo + 16 * hi) - ml;
            }
        }
    }
}

void dequantize_row_iq4_nl_ref(const void *src, float *dst, int64_t n) {
    const block_iq4_nl *b = src; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; j++) {
            dst[i * 32 + j] = d * (float)quant_iq4nl_values[b[i].qs[j] & 0x0f];
            dst[i * 32 + j + 16] = d * (float)quant_iq4nl_values[b[i].qs[j] >> 4];
        }
    }
}

void dequantize_row_iq4_xs_ref(const void *src, float *dst, int64_t n) {
    const block_iq4_xs *b = src; /* [n / 256] blocks */
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = fp16_to_fp32(b[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const int ls = ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((b[i].scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            const uint8_t *qs = b[i].qs + 16 * ib;
            float *y = dst + i * QK_K + 32 * ib;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)quant_iq4nl_values[qs[j] & 0x0f];
                y[j + 16] = dl * (float)quant_iq4nl_values[qs[j] >> 4];
            }
        }
    }
}

/* ---- quantization: Q4_1, Q5_0, Q5_1 ---------------------------------------------------------- */

/* Truncation toward zero of v clamped to [0, top]: ggml's MIN(top, (int8_t)v) / (uint8_t)v for v
 * in range, defined also for NaN and out-of-range v. */
static uint8_t trunc_clamp(float v, int top) {
    if (!(v > 0.0f)) return 0;
    if (v >= (float)top) return (uint8_t)top;
    return (uint8_t)(int)v;
}

void quantize_row_q4_1_ref(const float *src, void *dst, int64_t n) {
    block_q4_1 *b = dst; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) {
        const float *x = src + i * 32; /* [32] */
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        b[i].m = fp32_to_fp16(min);
        for (int j = 0; j < 16; j++) {
            const uint8_t lo = trunc_clamp((x[j] - min) * id + 0.5f, 15);
            const uint8_t hi = trunc_clamp((x[j + 16] - min) * id + 0.5f, 15);
            b[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* Packs 32 five-bit values into qs / qh. */
static void q5_pack(const uint8_t *v, uint8_t *qs, uint8_t *qh4) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((v[j] & 0x0f) | ((v[j + 16] & 0x0f) << 4));
        qh |= (uint32_t)((v[j] >> 4) & 1) << j;
        qh |= (uint32_t)((v[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh4, &qh, 4);
}

void quantize_row_q5_0_ref(const float *src, void *dst, int64_t n) {
    block_q5_0 *b = dst; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) {
        const float *x = src + i * 32; /* [32] */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        uint8_t v[32];
        for (int j = 0; j < 32; j++) v[j] = trunc_clamp(x[j] * id + 16.5f, 31);
        q5_pack(v, b[i].qs, b[i].qh);
    }
}

void quantize_row_q5_1_ref(const float *src, void *dst, int64_t n) {
    block_q5_1 *b = dst; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) {
        const float *x = src + i * 32; /* [32] */
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        b[i].m = fp32_to_fp16(min);
        uint8_t v[32];
        /* ggml keeps the low 5 bits of (uint8_t)(v + 0.5f); v <= 31 by construction */
        for (int j = 0; j < 32; j++) v[j] = trunc_clamp((x[j] - min) * id + 0.5f, 31);
        q5_pack(v, b[i].qs, b[i].qh);
    }
}

/* ---- quantization: IQ4_NL, IQ4_XS ------------------------------------------------------------ */

#define GROUP_MAX_EPS 1e-15f

/* ggml's nearest_int (round half to even through the f32 mantissa), clamped to |v| < 2^22. */
static int nearest_int_c(float v) {
    if (!(v == v)) return 0;
    if (v > 4194303.0f) v = 4194303.0f;
    if (v < -4194303.0f) v = -4194303.0f;
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Index of the table value nearest x (ties to the upper one unless strictly closer below), as
 * ggml's best_index_int8. */
static int iq4_best_index(float x) {
    const int8_t *val = quant_iq4nl_values;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    if (!(x == x)) return 0;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav; else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* One super-block of sbs weights in sub-blocks of 32 (sbs 32: IQ4_NL, 256: IQ4_XS), with the
 * search of llama-quantize (ntry = 7, weights x^2, no importance matrix). Writes dh, q4 and for
 * IQ4_XS scales_h / scales_l. */
static void iq4_quantize_block(int sbs, const float *x, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                               uint8_t *scales_l) {
    const int8_t *values = quant_iq4nl_values;
    const int ntry = 7;
    uint8_t L[QK_K];
    float scales[QK_K / 32], weight[32];
    memset(L, 0, sizeof(L));
    memset(q4, 0, (size_t)sbs / 2);
    *dh = fp32_to_fp16(0.0f);
    float max_scale = 0.0f, amax_scale = 0.0f;
    for (int ib = 0; ib < sbs / 32; ib++) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0.0f;
            continue;
        }
        float d = -max / (float)values[0];
        float id = 1.0f / d;
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float al = id * xb[j];
            const int l = iq4_best_index(al);
            Lb[j] = (uint8_t)l;
            const float q = (float)values[l];
            const float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (float)(itry + values[0]) / max;
            sumqx = sumq2 = 0.0f;
            for (int j = 0; j < 32; j++) {
                const float al = id * xb[j];
                const int l = iq4_best_index(al);
                const float q = (float)values[l];
                const float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if (sbs > 32) {
        *scales_h = 0;
        const float d = -max_scale / 32.0f;
        *dh = fp32_to_fp16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int ib = 0; ib < sbs / 32; ib++) {
            int l = nearest_int_c(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * (float)l;
            const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            for (int j = 0; j < 32; j++) L[ib * 32 + j] = (uint8_t)iq4_best_index(idl * x[ib * 32 + j]);
            l += 32;
            const uint8_t l_l = (uint8_t)(l & 0x0f), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << (2 * (ib % 8)));
        }
    } else {
        *dh = fp32_to_fp16(scales[0]);
        const float id = scales[0] != 0.0f ? 1.0f / scales[0] : 0.0f;
        for (int j = 0; j < sbs; j++) L[j] = (uint8_t)iq4_best_index(id * x[j]);
    }
    for (int i = 0; i < sbs / 32; i++) {
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
    }
}

void quantize_row_iq4_nl_ref(const float *src, void *dst, int64_t n) {
    block_iq4_nl *b = dst; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / 32; i++) iq4_quantize_block(32, src + i * 32, &b[i].d, b[i].qs, NULL, NULL);
}

void quantize_row_iq4_xs_ref(const float *src, void *dst, int64_t n) {
    block_iq4_xs *b = dst; /* [n / 256] blocks */
    for (int64_t i = 0; i < n / QK_K; i++) {
        iq4_quantize_block(QK_K, src + i * QK_K, &b[i].d, b[i].qs, &b[i].scales_h, b[i].scales_l);
    }
}
