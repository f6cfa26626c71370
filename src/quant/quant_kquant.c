/* quant_kquant.c: reference quantizers of the K-quant formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), the
 * ones llama-quantize uses when it has no importance matrix. Each sub-block gets a scale (and for
 * Q2_K / Q4_K / Q5_K a min) from a small search that minimizes a weighted squared (Q2_K: absolute)
 * error; the scales are then quantized against a super-block scale and the weights re-quantized
 * with the rounded scales. The searches, their constants and their f32 operation order are those
 * of ggml's quantize_row_q*_K_ref, so our output is byte-identical to llama-quantize's. */
#include "quant/quant_ref.h"

#include "base/fp16.h"

#include <math.h>
#include <string.h>

#define GROUP_MAX_EPS 1e-15f

/* ggml's nearest_int (round half to even through the f32 mantissa); NaN -> 0, clamped to |v| < 2^22
 * where ggml's is undefined. */
static int nearest_int(float v) {
    if (!(v == v)) return 0;
    if (v > 4194303.0f) v = 4194303.0f;
    if (v < -4194303.0f) v = -4194303.0f;
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Signed quantization of n values to [-nmax, nmax-1] (L stores l + nmax) with the weights x^2
 * (ggml's make_qx_quants with rmse_type 1 and no importance weights); returns the scale. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    float iscale = -(float)nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's sub-block search (ggml's make_q3_quants with do_rmse): start from the max, then up to 5
 * passes moving single values where that lowers the x^2-weighted error. L stores l + nmax. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    const float iscale = -(float)nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0.0f) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                const int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (n_changed == 0) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Unsigned quantization with a min, x ~ scale * L - the_min, L in [0, nmax] (ggml's
 * make_qkx2_quants): a grid of nstep + 1 inverse scales, each followed by a weighted least-squares
 * fit of scale and min; keeps the one of least weighted error (|err| if use_mad, else err^2). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1.0f / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)clampi(l, 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0.0f) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0.0f;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Packs 256 2-bit values: weight 128h + 32k + l -> bits 2k of qs[32h + l]. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        }
    }
}

void quantize_row_q2_K_ref(const float *src, void *dst, int64_t n) {
    block_q2_K *y = dst; /* [n / 256] blocks */
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K; /* [256] */
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0.0f) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[i].d = fp32_to_fp16(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = 0;
            y[i].d = fp32_to_fp16(0.0f);
        }
        if (max_min > 0.0f) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = fp16_to_fp32(y[i].d) * (float)(y[i].scales[j] & 0x0f);
            if (d == 0.0f) continue;
            const float dm = fp16_to_fp32(y[i].dmin) * (float)(y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (uint8_t)clampi(nearest_int((x[16 * j + ii] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

void quantize_row_q3_K_ref(const float *src, void *dst, int64_t n) {
    block_q3_K *y = dst; /* [n / 256] blocks */
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K; /* [256] */
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                /* ggml stores nearest_int into an int8_t before clamping */
                int l = (int8_t)nearest_int(iscale * scales[j]);
                l = clampi(l, -32, 31) + 32;
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0x0f);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0x0f) << 4);
                l >>= 4;
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = fp32_to_fp16(1.0f / iscale);
        } else {
            y[i].d = fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sc = j < 8 ? y[i].scales[j] & 0x0f : y[i].scales[j - 8] >> 4;
            sc = (sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            const float d = fp16_to_fp32(y[i].d) * (float)sc;
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (int8_t)(clampi(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        memset(y[i].hmask, 0, QK_K / 8);
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] -= 4;
            }
            if (++m == QK_K / 8) {
                m = 0;
                hm = (uint8_t)(hm << 1);
            }
        }
        pack_2bit((const uint8_t *)L, y[i].qs);
    }
}

/* Q4_K / Q5_K: sub-block scales and mins (nmax 15 or 31) packed into 12 bytes, then the values. */
static void k4_quantize_block(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out, uint16_t *dmin_out,
                              uint8_t *sc_out, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < QK_K / 32; j++) {
        /* ggml stores nearest_int into a uint8_t before the MIN(63, .) */
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            sc_out[j] = ls;
            sc_out[j + 4] = lm;
        } else {
            sc_out[j + 4] = (uint8_t)((ls & 0x0f) | ((lm & 0x0f) << 4));
            sc_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc_out[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = fp32_to_fp16(max_scale / 63.0f);
    *dmin_out = fp32_to_fp16(max_min / 63.0f);
    for (int j = 0; j < QK_K / 32; j++) {
        int sc, m;
        if (j < 4) {
            sc = sc_out[j] & 63;
            m = sc_out[j + 4] & 63;
        } else {
            sc = (sc_out[j + 4] & 0x0f) | ((sc_out[j - 4] >> 6) << 4);
            m = (sc_out[j + 4] >> 4) | ((sc_out[j] >> 6) << 4);
        }
        const float d = fp16_to_fp32(*d_out) * (float)sc;
        if (d == 0.0f) continue;
        const float dm = fp16_to_fp32(*dmin_out) * (float)m;
        for (int ii = 0; ii < 32; ii++) L[32 * j + ii] = (uint8_t)clampi(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

void quantize_row_q4_K_ref(const float *src, void *dst, int64_t n) {
    block_q4_K *y = dst; /* [n / 256] blocks */
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        memset(y[i].scales, 0, K_SCALE_SIZE);
        k4_quantize_block(src + i * QK_K, 15, -1.0f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            q += 32;
        }
    }
}

void quantize_row_q5_K_ref(const float *src, void *dst, int64_t n) {
    block_q5_K *y = dst; /* [n / 256] blocks */
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        memset(y[i].scales, 0, K_SCALE_SIZE);
        k4_quantize_block(src + i * QK_K, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int nn = 0; nn < QK_K; nn += 64) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[nn + j], l2 = L[nn + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
            ql += 32;
        }
    }
}

void quantize_row_q6_K_ref(const float *src, void *dst, int64_t n) {
    block_q6_K *y = dst; /* [n / 256] blocks */
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K; /* [256] */
        float max_scale = 0.0f, max_abs_scale = 0.0f;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            const float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(block_q6_K));
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[i].d = fp32_to_fp16(1.0f / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const int v = nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = fp16_to_fp32(y[i].d) * (float)y[i].scales[j];
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ii++) L[16 * j + ii] = (int8_t)(clampi(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0x0f, q2 = L[j + l + 32] & 0x0f;
                const uint8_t q3 = L[j + l + 64] & 0x0f, q4 = L[j + l + 96] & 0x0f;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
    }
}
