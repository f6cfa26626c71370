/* quant_ref.c: scalar reference dequantize-row functions (F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K)
 * and quantize-row functions (F32, F16, BF16, Q8_0, Q4_0). The arithmetic follows llama.cpp's
 * ggml-quants.c operation for operation (same f32 products in the same order), so results are
 * bit-identical to ggml's reference paths. Quantization rounds to nearest like ggml's *_ref:
 *   Q8_0: d = amax/127, id = 1/d, q = roundf(x*id)          (half away from zero)
 *   Q4_0: d = max/-8 (max = the value of largest magnitude, signed), id = 1/d,
 *         q = min(15, trunc(x*id + 8.5f))
 * A zero block gets d = 0 and id = 0. Where ggml's float->int cast is undefined (a NaN or an
 * infinite x*id, e.g. from a block so tiny that 1/d overflows) we saturate instead: NaN -> the
 * zero point, +-inf -> the nearest end of the range. */
#include "quant/quant_ref.h"

#include "base/fp16.h"

#include <math.h>
#include <string.h>

/* ---- float formats ---------------------------------------------------------------------- */

void dequantize_row_f32_ref(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void dequantize_row_f16_ref(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src; /* [n] little-endian f16 */
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
    }
}

void dequantize_row_bf16_ref(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src; /* [n] little-endian bf16 */
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
    }
}

void quantize_row_f32_ref(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void quantize_row_f16_ref(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst; /* [n] f16 */
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = fp32_to_fp16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

void quantize_row_bf16_ref(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst; /* [n] bf16 */
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = fp32_to_bf16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* ---- Q4_0 / Q8_0 -------------------------------------------------------------------------- */

void dequantize_row_q4_0_ref(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = fp16_to_fp32(b[i].d);
        float *y = dst + i * QK4_0; /* [32] */
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int lo = (b[i].qs[j] & 0x0f) - 8;
            const int hi = (b[i].qs[j] >> 4) - 8;
            y[j] = (float)lo * d;
            y[j + QK4_0 / 2] = (float)hi * d;
        }
    }
}

void dequantize_row_q8_0_ref(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK8_0; j++) {
            dst[i * QK8_0 + j] = (float)b[i].qs[j] * d;
        }
    }
}

/* Truncation toward zero of v (expected in [0, 16]) clamped to a nibble: ggml's
 * MIN(15, (int8_t)v), defined also for NaN and out-of-range v. */
static uint8_t q4_0_nibble(float v) {
    if (!(v > 0.0f)) return 0; /* NaN, negatives */
    if (v >= 15.0f) return 15;
    return (uint8_t)(int)v;
}

/* roundf(v) as an int8 in [-127, 127]; NaN -> 0. */
static int8_t q8_0_round(float v) {
    if (v != v) return 0;
    if (v >= 127.0f) return 127;
    if (v <= -127.0f) return -127;
    return (int8_t)roundf(v);
}

void quantize_row_q4_0_ref(const float *src, void *dst, int64_t n) {
    block_q4_0 *b = dst; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float *x = src + i * QK4_0; /* [32] */
        float amax = 0.0f; /* largest magnitude */
        float max = 0.0f;  /* the value having it, with its sign */
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const uint8_t lo = q4_0_nibble(x[j] * id + 8.5f);
            const uint8_t hi = q4_0_nibble(x[j + QK4_0 / 2] * id + 8.5f);
            b[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void quantize_row_q8_0_ref(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst; /* [n / 32] blocks */
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *x = src + i * QK8_0; /* [32] */
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            amax = fmaxf(amax, fabsf(x[j]));
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) {
            b[i].qs[j] = q8_0_round(x[j] * id);
        }
    }
}

/* ---- Q4_K --------------------------------------------------------------------------------- */

/* 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes (ggml's get_scale_min_k4):
 * bytes 0..3 hold scales 0..3 in their low 6 bits, bytes 4..7 mins 0..3; sub-blocks 4..7 take
 * their low 4 bits from the nibbles of bytes 8..11 and their top 2 bits from the spare top bits
 * of bytes 0..7. */
static void q4_K_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
        *m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

void dequantize_row_q4_K_ref(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src; /* [n / 256] blocks */
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = fp16_to_fp32(b[i].d);
        const float dmin = fp16_to_fp32(b[i].dmin);
        const uint8_t *q = b[i].qs; /* 32 bytes per 64 weights */
        float *y = dst + i * QK_K;  /* [256] */
        /* each 64-weight chunk: sub-block is from the low nibbles, is+1 from the high ones */
        for (int is = 0; is < 8; is += 2) {
            uint8_t sc, m;
            q4_K_scale_min(is, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            q4_K_scale_min(is + 1, b[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32;
        }
    }
}

/* ---- Q6_K --------------------------------------------------------------------------------- */

void dequantize_row_q6_K_ref(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src; /* [n / 256] blocks */
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = fp16_to_fp32(b[i].d);
        const uint8_t *ql = b[i].ql;    /* 64 bytes per 128-weight half */
        const uint8_t *qh = b[i].qh;    /* 32 bytes per half */
        const int8_t *sc = b[i].scales; /* 8 scales per half, one per 16 weights */
        float *y = dst + i * QK_K;      /* [256] */
        for (int half = 0; half < 2; half++) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}
