/* cuda_quant_ext.cuh: device-side dequantization of the weight types added after the first set
 * (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS), eight consecutive elements at a time (e0 a
 * multiple of 8, so the eight share one 32-block or one 16-weight K sub-block), following
 * src/quant/quant.h and the scalar reference src/quant/quant_ref_ext.c (same f32 products, no
 * fused multiply-add). cu_dequant8 (cuda_quant.cuh) hands these types here; cuda_quant_ext.cu has
 * the mat-vec entry for them. Rows start 2-byte aligned: only 16-bit and byte loads. */
#ifndef DFL_BACKEND_CUDA_QUANT_EXT_CUH
#define DFL_BACKEND_CUDA_QUANT_EXT_CUH

#include "backend/cuda/cuda_common.cuh"

/* IQ4_NL / IQ4_XS table (quant_iq4nl_values). */
__device__ __forceinline__ float cu_iq4nl_value(int i) {
    const int8_t t[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return (float)t[i & 15];
}

/* Bit j of the little-endian u32 at p (2-byte aligned). */
__device__ __forceinline__ uint32_t cu_ld_u32_a2(const uint8_t *p) {
    return (uint32_t)cu_ld_u16(p) | ((uint32_t)cu_ld_u16(p + 2) << 16);
}

__device__ __forceinline__ void cu_dequant8_ext(uint32_t type, const uint8_t *row, int64_t e0, float y[8]) {
    switch (type) {
    case QUANT_TYPE_Q4_1:
    case QUANT_TYPE_IQ4_NL: {
        const bool q41 = type == QUANT_TYPE_Q4_1;
        const uint8_t *b = row + (e0 / 32) * (q41 ? 20 : 18);
        const float d = cu_f16_to_f32(cu_ld_u16(b));
        const float m = q41 ? cu_f16_to_f32(cu_ld_u16(b + 2)) : 0.0f;
        const int j = (int)(e0 % 32);
        const uint8_t *qs = b + (q41 ? 4 : 2) + (j & 15);
        const int shift = j < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = (qs[i] >> shift) & 0x0f;
            y[i] = q41 ? __fadd_rn(__fmul_rn((float)q, d), m) : __fmul_rn(d, cu_iq4nl_value(q));
        }
        break;
    }
    case QUANT_TYPE_Q5_0:
    case QUANT_TYPE_Q5_1: {
        const bool q50 = type == QUANT_TYPE_Q5_0;
        const uint8_t *b = row + (e0 / 32) * (q50 ? 22 : 24);
        const float d = cu_f16_to_f32(cu_ld_u16(b));
        const float m = q50 ? 0.0f : cu_f16_to_f32(cu_ld_u16(b + 2));
        const uint32_t qh = cu_ld_u32_a2(b + (q50 ? 2 : 4));
        const int j = (int)(e0 % 32);
        const uint8_t *qs = b + (q50 ? 6 : 8) + (j & 15);
        const int shift = j < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int v = ((qs[i] >> shift) & 0x0f) | (int)(((qh >> (j + i)) & 1u) << 4);
            y[i] = q50 ? __fmul_rn((float)(v - 16), d) : __fadd_rn(__fmul_rn((float)v, d), m);
        }
        break;
    }
    case QUANT_TYPE_Q2_K:
    case QUANT_TYPE_Q3_K: {
        const bool q2 = type == QUANT_TYPE_Q2_K;
        const uint8_t *b = row + (e0 / 256) * (q2 ? 84 : 110);
        const int off = (int)(e0 % 256), h = off / 128, k = (off % 128) / 32, l = off % 32, g = off / 16;
        const uint8_t *qs = b + (q2 ? 16 : 32) + 32 * h + l;
        float dl, ml = 0.0f;
        if (q2) {
            const uint8_t sc = b[g];
            dl = __fmul_rn(cu_f16_to_f32(cu_ld_u16(b + 80)), (float)(sc & 0x0f));
            ml = __fmul_rn(cu_f16_to_f32(cu_ld_u16(b + 82)), (float)(sc >> 4));
        } else {
            const uint8_t *s = b + 96;
            const int lo = g < 8 ? s[g] & 0x0f : s[g - 8] >> 4;
            const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
            dl = __fmul_rn(cu_f16_to_f32(cu_ld_u16(b + 108)), (float)((lo | (hi << 4)) - 32));
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = (qs[i] >> (2 * k)) & 3;
            if (!q2) q -= ((b[l + i] >> (4 * h + k)) & 1) ? 0 : 4;
            y[i] = q2 ? __fmul_rn(dl, (float)q) - ml : __fmul_rn(dl, (float)q);
        }
        break;
    }
    case QUANT_TYPE_Q5_K: {
        const uint8_t *b = row + (e0 / 256) * 176;
        const float d = cu_f16_to_f32(cu_ld_u16(b)), dmin = cu_f16_to_f32(cu_ld_u16(b + 2));
        const int off = (int)(e0 % 256), j = off / 32, l = off % 32;
        const uint8_t *s = b + 4;
        int sc, m;
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
        const uint8_t *qh = b + 16 + l, *qs = b + 48 + 32 * (j / 2) + l;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int lo = (j & 1) ? qs[i] >> 4 : qs[i] & 0x0f;
            const int v = lo + 16 * ((qh[i] >> j) & 1);
            y[i] = __fmul_rn(dl, (float)v) - ml;
        }
        break;
    }
    case QUANT_TYPE_IQ4_XS: {
        const uint8_t *b = row + (e0 / 256) * 136;
        const float d = cu_f16_to_f32(cu_ld_u16(b));
        const int off = (int)(e0 % 256), ib = off / 32, j = off % 32;
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((cu_ld_u16(b + 2) >> (2 * ib)) & 3) << 4);
        const float dl = __fmul_rn(d, (float)(ls - 32));
        const uint8_t *qs = b + 8 + 16 * ib + (j & 15);
        const int shift = j < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = __fmul_rn(dl, cu_iq4nl_value((qs[i] >> shift) & 0x0f));
        break;
    }
    default:
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = 0.0f;
        break;
    }
}

/* Host: the small-batch (<= 64 rows) mat-vec for these types (cuda_quant_ext.cu); false if type
 * is not one of them. grid: (n_out + 3) / 4 blocks of 128 threads; nr: the power-of-two row bucket. */
bool cuda_matmul_small_ext(uint32_t type, int nr, dim3 grid, cudaStream_t st, const uint8_t *w, int64_t w_nb1,
                           const char *x, int64_t x_nb1, float *dst, int64_t ldd, int64_t n_in, int64_t n_out,
                           int n_rows);

#endif
