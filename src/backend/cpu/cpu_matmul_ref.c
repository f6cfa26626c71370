/* cpu_matmul_ref.c: the scalar reference of the quantized matmul computation: weight blocks times
 * prepared activations (cpu_act) with exact integer block dot products, scaled and summed in f64.
 * The SIMD kernels compute the same integers and differ only in the f32 rounding of the scale
 * products and of the sum order. Also the scalar kernel set's matmul on CPUs without AVX2. */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/fp16.h"

#include <string.h>

/* Q4_K: 6-bit scale and min of sub-block j (0..7), as ggml's get_scale_min_k4. */
void cpu_q4_K_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q6_K: the signed 6-bit value (-32..31) of element e (0..255). */
int cpu_q6_K_value(const block_q6_K *b, int e) {
    const int n = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t ql = b->ql[64 * n + l + (k & 1) * 32];
    const int lo = k >= 2 ? ql >> 4 : ql & 0xF;
    const int hi = (b->qh[32 * n + l] >> (2 * k)) & 3;
    return (lo | (hi << 4)) - 32;
}

void cpu_q6_K_values(const block_q6_K *b, int8_t v[QK_K]) {
    for (int n = 0; n < 2; n++) { /* ggml's dequantize_row_q6_K order: cpu_q6_K_value of every e */
        const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
        int8_t *o = v + 128 * n;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

/* Super-block b of a Q4_K row (its f16 d, dmin, the unpacked scales and mins, the 128 qs bytes)
 * against activation row r, in f64. */
static double dot_q4_K_sb(uint16_t d, uint16_t dmin, const int sc[8], const int m[8], const uint8_t *qs,
                          const cpu_act *act, int64_t r, int64_t b) {
    const int64_t n = act->n_in;
    const int8_t *q = act->qs + r * n + b * QK_K;
    const float dx = act->d[r * (n / QK_K) + b];
    const int16_t *bs = act->bsums + r * (n / 16) + b * 16;
    int64_t isc = 0, imin = 0;
    for (int j = 0; j < 8; j++) {
        int32_t dot = 0;
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = qs[32 * (j / 2) + l];
            const int v = (j & 1) ? byte >> 4 : byte & 0xF;
            dot += v * q[32 * j + l];
        }
        isc += (int64_t)sc[j] * dot;
        imin += (int64_t)m[j] * (bs[2 * j] + bs[2 * j + 1]);
    }
    return (double)fp16_to_fp32(d) * (double)dx * (double)isc - (double)fp16_to_fp32(dmin) * (double)dx * (double)imin;
}

/* Super-block b of a Q6_K row (its f16 d, int8 scales and signed 6-bit values) against activation
 * row r, in f64. */
static double dot_q6_K_sb(uint16_t d, const int8_t *scales, const int8_t *vals, const cpu_act *act, int64_t r, int64_t b) {
    const int64_t n = act->n_in;
    const int8_t *q = act->qs + r * n + b * QK_K;
    int64_t isum = 0;
    for (int j = 0; j < 16; j++) {
        int32_t dot = 0;
        for (int l = 0; l < 16; l++) dot += vals[16 * j + l] * q[16 * j + l];
        isum += (int64_t)scales[j] * dot;
    }
    return (double)fp16_to_fp32(d) * (double)act->d[r * (n / QK_K) + b] * (double)isum;
}

/* One weight row o against activation row r, in f64. */
static double dot_row(uint32_t wtype, const void *wrow, const cpu_act *act, int64_t r) {
    const int64_t n = act->n_in;
    double sum = 0.0;
    switch (wtype) {
    case QUANT_TYPE_F32:
    case QUANT_TYPE_F16:
    case QUANT_TYPE_BF16: {
        const float *x = act->f + r * n;
        for (int64_t i = 0; i < n; i++) {
            float w;
            if (wtype == QUANT_TYPE_F32) {
                memcpy(&w, (const char *)wrow + 4 * i, 4);
            } else {
                uint16_t h;
                memcpy(&h, (const char *)wrow + 2 * i, 2);
                w = wtype == QUANT_TYPE_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
            }
            sum += (double)w * (double)x[i];
        }
        return sum;
    }
    case QUANT_TYPE_Q8_0:
    case QUANT_TYPE_Q4_0: {
        const int8_t *qx = act->qs + r * act->row_len; /* transposed layout: cpu_q8_0_offset */
        const float *dx = act->d + r * (act->row_len / QK8_0);
        for (int64_t b = 0; b < n / QK8_0; b++) {
            int32_t isum = 0;
            float dw;
            if (wtype == QUANT_TYPE_Q8_0) {
                const block_q8_0 *blk = (const block_q8_0 *)wrow + b;
                for (int j = 0; j < QK8_0; j++) isum += blk->qs[j] * qx[cpu_q8_0_offset(b * QK8_0 + j)];
                dw = fp16_to_fp32(blk->d);
            } else {
                const block_q4_0 *blk = (const block_q4_0 *)wrow + b;
                for (int j = 0; j < QK4_0 / 2; j++) {
                    isum += ((blk->qs[j] & 0xF) - 8) * qx[cpu_q8_0_offset(b * QK8_0 + j)];
                    isum += ((blk->qs[j] >> 4) - 8) * qx[cpu_q8_0_offset(b * QK8_0 + j + 16)];
                }
                dw = fp16_to_fp32(blk->d);
            }
            sum += (double)dw * (double)dx[b] * (double)isum;
        }
        return sum;
    }
    case QUANT_TYPE_Q4_K: {
        for (int64_t b = 0; b < n / QK_K; b++) {
            const block_q4_K *blk = (const block_q4_K *)wrow + b;
            int sc[8], m[8];
            for (int j = 0; j < 8; j++) cpu_q4_K_scale_min(j, blk->scales, &sc[j], &m[j]);
            sum += dot_q4_K_sb(blk->d, blk->dmin, sc, m, blk->qs, act, r, b);
        }
        return sum;
    }
    case QUANT_TYPE_Q6_K: {
        for (int64_t b = 0; b < n / QK_K; b++) {
            const block_q6_K *blk = (const block_q6_K *)wrow + b;
            int8_t vals[QK_K];
            cpu_q6_K_values(blk, vals);
            sum += dot_q6_K_sb(blk->d, blk->scales, vals, act, r, b);
        }
        return sum;
    }
    default:
        return cpu_dot_row_ext_ref(wtype, wrow, act, r);
    }
}

void cpu_matmul_q_ref(uint32_t wtype, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0,
                      int64_t nr, float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = (const char *)w + (size_t)o * w_nb1;
        for (int64_t r = r0; r < r0 + nr; r++) {
            dst[r * dst_stride + o] = (float)dot_row(wtype, wrow, act, r);
        }
    }
}

/* One packed Q8_0 x16 (q4: Q4_0 x16) row (cpu_pack.c) against activation row r: the f64 sum of
 * dot_row. Quant byte j of block b sits at group b / 16, then (j / 4) * 64 + (b % 16) * 4 + j % 4:
 * Q8_0 q + 128; Q4_0 as stored (low nibble value j, high nibble value j + 16). */
static double dot_row_x16(const uint8_t *wrow, bool q4, const cpu_act *act, int64_t r) {
    const int64_t n = act->n_in, qb = q4 ? QK4_0 / 2 : QK8_0;
    const int8_t *qx = act->qs + r * act->row_len;
    const float *dx = act->d + r * (act->row_len / QK8_0);
    double sum = 0.0;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const uint8_t *g = wrow + (b / CPU_Q8_0_GROUP) * CPU_Q8_0_GROUP * qb + (b % CPU_Q8_0_GROUP) * 4;
        int32_t isum = 0;
        for (int j = 0; j < qb; j++) {
            const uint8_t q = g[64 * (j / 4) + j % 4];
            if (q4) {
                isum += ((q & 0xF) - 8) * qx[cpu_q8_0_offset(b * QK8_0 + j)];
                isum += ((q >> 4) - 8) * qx[cpu_q8_0_offset(b * QK8_0 + j + 16)];
            } else {
                isum += ((int32_t)q - 128) * qx[cpu_q8_0_offset(b * QK8_0 + j)];
            }
        }
        uint16_t h;
        memcpy(&h, wrow + (n / QK8_0) * qb + 2 * b, sizeof(h));
        sum += (double)fp16_to_fp32(h) * (double)dx[b] * (double)isum;
    }
    return sum;
}

/* dst[r][o] = dot(row o, activation row r) for the rows and outputs of a call. */
static void matmul_rows_ref(bool q4, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                            float *dst, int64_t ds, int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wrow = (const uint8_t *)w + (size_t)o * w_nb1;
        for (int64_t r = r0; r < r0 + nr; r++) dst[r * ds + o] = (float)dot_row_x16(wrow, q4, act, r);
    }
}

void cpu_matmul_q8_0_x16_ref(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    matmul_rows_ref(false, w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}

void cpu_matmul_q4_0_x16_ref(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    matmul_rows_ref(true, w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}

/* Q6K_X16V (cpu_pack.c): the 256 values (-32..31) of row i of a record, from its 3-dword groups. */
static void q6K_x16v_values(const uint8_t *R, int i, int8_t vals[QK_K]) {
    for (int j = 0; j < 16; j++) {
        const uint8_t *g = R + CPU_Q6K_X16V_QV + 64 * (3 * j) + 4 * i; /* dword k at g + 64 k */
        for (int m = 0; m < 12; m++) vals[16 * j + m] = (int8_t)((g[64 * (m / 4) + m % 4] & 0x3f) - 32);
        for (int e = 0; e < 4; e++) {
            int u = 0;
            for (int k = 0; k < 3; k++) u |= (g[64 * k + e] >> 6) << (2 * k);
            vals[16 * j + 12 + e] = (int8_t)(u - 32);
        }
    }
}

/* KQ_X16 and Q6K_X16V (cpu_pack.c): row o is lane o % 16 of the records of group o / 16; each
 * super-block's fields are gathered back from the lane and summed as dot_row does. */
void cpu_matmul_kq_x16_ref(uint32_t wtype, uint32_t layout, const void *w, size_t w_nb1, const cpu_act *act,
                           int64_t r0, int64_t nr, float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const size_t rec = tensor_kq_x16_record_bytes(wtype);
    const int64_t nsb = act->n_in / QK_K;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *group = (const uint8_t *)w + (size_t)(o / 16) * 16 * w_nb1;
        const int i = (int)(o % 16);
        for (int64_t r = r0; r < r0 + nr; r++) {
            double sum = 0.0;
            for (int64_t b = 0; b < nsb; b++) {
                const uint8_t *R = group + (size_t)b * rec;
                if (wtype == QUANT_TYPE_Q4_K) {
                    uint16_t d, dmin;
                    memcpy(&d, R + 4 * i, 2);
                    memcpy(&dmin, R + 4 * i + 2, 2);
                    int sc[8], m[8];
                    uint8_t qs[QK_K / 2];
                    for (int j = 0; j < 8; j++) {
                        sc[j] = R[CPU_KQ_X16_Q4K_SC + 16 * j + i];
                        m[j] = R[CPU_KQ_X16_Q4K_M + 16 * j + i];
                    }
                    for (int q = 0; q < QK_K / 8; q++) memcpy(qs + 4 * q, R + CPU_KQ_X16_QS + 64 * q + 4 * i, 4);
                    sum += dot_q4_K_sb(d, dmin, sc, m, qs, act, r, b);
                } else {
                    /* the row's block back from its lane, then its values as the plain path reads them */
                    block_q6_K blk;
                    memset(&blk, 0, sizeof(blk));
                    memcpy(&blk.d, R + 2 * i, 2);
                    for (int j = 0; j < 16; j++) blk.scales[j] = (int8_t)R[CPU_KQ_X16_Q6K_SC + 16 * j + i];
                    int8_t vals[QK_K];
                    if (layout == TENSOR_LAYOUT_Q6K_X16V) {
                        q6K_x16v_values(R, i, vals);
                    } else {
                        for (int q = 0; q < QK_K / 8; q++) memcpy(blk.ql + 4 * q, R + CPU_KQ_X16_Q6K_QL + 64 * q + 4 * i, 4);
                        for (int q = 0; q < QK_K / 16; q++) memcpy(blk.qh + 4 * q, R + CPU_KQ_X16_Q6K_QH + 64 * q + 4 * i, 4);
                        cpu_q6_K_values(&blk, vals);
                    }
                    sum += dot_q6_K_sb(blk.d, blk.scales, vals, act, r, b);
                }
            }
            dst[r * ds + o] = (float)sum;
        }
    }
}

void cpu_matmul_p16_x16_ref(uint32_t wtype, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                            float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const bool bf16 = wtype == QUANT_TYPE_BF16;
    const int64_t ld = act->row_len;
    for (int64_t o = o0; o < o1; o++) {
        const uint16_t *group = (const uint16_t *)((const uint8_t *)w + (size_t)(o / 16) * 16 * w_nb1);
        const int c = (int)(o % 16);
        for (int64_t r = r0; r < r0 + nr; r++) {
            double sum = 0.0;
            for (int64_t i = 0; i < ld; i++) {
                const int64_t t = i / 32, p = (i % 32) / 2, e = i % 2;
                const uint16_t v = group[t * 512 + p * 32 + (bf16 ? 2 * c + e : 16 * e + c)];
                const double wv = bf16 ? (double)bf16_to_fp32(v) : (double)fp16_to_fp32(v);
                double xv = (double)bf16_to_fp32(act->th[r * ld + i]);
                if (!bf16) xv += (double)bf16_to_fp32(act->tl[r * ld + i]);
                sum += wv * xv;
            }
            dst[r * ds + o] = (float)sum;
        }
    }
}
