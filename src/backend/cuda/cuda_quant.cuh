/* cuda_quant.cuh: device-side dequantization of the weight types op_matmul / op_get_rows accept
 * (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K), eight consecutive elements at a time, following the
 * block layouts of src/quant/quant.h and the scalar reference src/quant/quant_ref.c:
 *   Q8_0 y = d * q;  Q4_0 y = d * (nibble - 8) (low nibbles = elements 0..15, high = 16..31);
 *   Q4_K per 64-element chunk c: low nibbles of qs[32c..] with (scale, min) of sub-block 2c, high
 *        nibbles with sub-block 2c+1: y = d * sc * q - dmin * m;
 *   Q6_K per 128-element half h, quarter qd, lane l (0..31): q = (ql nibble | 2 bits of qh) - 32,
 *        y = d * scales[8h + l/16 + 2qd] * q.
 * Rows of block types start 2-byte aligned (every block size is even), so only 16-bit and byte
 * loads are used. */
#ifndef DFL_BACKEND_CUDA_QUANT_CUH
#define DFL_BACKEND_CUDA_QUANT_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant_ext.cuh"

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K block (ggml's get_scale_min_k4). */
__device__ __forceinline__ void cu_q4_K_scale_min(int j, const uint8_t *s, float *sc, float *m) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *m = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* y[0..8) = elements [e0, e0 + 8) of a row of `type` (e0 a multiple of 8, inside the row). */
__device__ __forceinline__ void cu_dequant8(uint32_t type, const uint8_t *row, int64_t e0, float y[8]) {
    switch (type) {
    case QUANT_TYPE_F32: {
        const float *p = (const float *)row + e0;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = p[i];
        break;
    }
    case QUANT_TYPE_F16: {
        const uint16_t *p = (const uint16_t *)row + e0;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = cu_f16_to_f32(p[i]);
        break;
    }
    case QUANT_TYPE_BF16: {
        const uint16_t *p = (const uint16_t *)row + e0;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = cu_bf16_to_f32(p[i]);
        break;
    }
    case QUANT_TYPE_Q8_0: {
        const uint8_t *b = row + (e0 / 32) * 34;
        const float d = cu_f16_to_f32(cu_ld_u16(b));
        const int j = (int)(e0 % 32);
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = d * (float)(int8_t)b[2 + j + i];
        break;
    }
    case QUANT_TYPE_Q4_0: {
        const uint8_t *b = row + (e0 / 32) * 18;
        const float d = cu_f16_to_f32(cu_ld_u16(b));
        const int j = (int)(e0 % 32);
        const uint8_t *qs = b + 2 + (j & 15);
        const int shift = j < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = d * (float)(((qs[i] >> shift) & 0x0f) - 8);
        break;
    }
    case QUANT_TYPE_Q4_K: {
        const uint8_t *b = row + (e0 / 256) * 144;
        const float d = cu_f16_to_f32(cu_ld_u16(b)), dmin = cu_f16_to_f32(cu_ld_u16(b + 2));
        const int off = (int)(e0 % 256), c = off / 64, w = off % 64;
        const int is = 2 * c + (w >= 32 ? 1 : 0);
        float sc, m;
        cu_q4_K_scale_min(is, b + 4, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        const uint8_t *qs = b + 16 + 32 * c + (w & 31);
        const int shift = w < 32 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = __fmul_rn(d1, (float)((qs[i] >> shift) & 0x0f)) - m1; /* no fma: as the CPU */
        break;
    }
    case QUANT_TYPE_Q6_K: {
        const uint8_t *b = row + (e0 / 256) * 210;
        const float d = cu_f16_to_f32(cu_ld_u16(b + 208));
        const int off = (int)(e0 % 256), h = off / 128, l2 = off % 128, qd = l2 / 32, l = l2 % 32;
        const uint8_t *ql = b + 64 * h + l + (qd & 1) * 32;
        const uint8_t *qh = b + 128 + 32 * h + l;
        const float sc = (float)(int8_t)b[192 + 8 * h + l / 16 + 2 * qd];
        const int lshift = qd < 2 ? 0 : 4, hshift = 2 * qd;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = (((ql[i] >> lshift) & 0x0f) | (((qh[i] >> hshift) & 3) << 4)) - 32;
            y[i] = d * sc * (float)q;
        }
        break;
    }
    default: /* the types added later: cuda_quant_ext.cuh */
        cu_dequant8_ext(type, row, e0, y);
        break;
    }
}

/* Element i of a row of a block-size-1 type (F32, F16, BF16). */
__device__ __forceinline__ float cu_dequant1(uint32_t type, const uint8_t *row, int64_t i) {
    switch (type) {
    case QUANT_TYPE_F32: return ((const float *)row)[i];
    case QUANT_TYPE_F16: return cu_f16_to_f32(((const uint16_t *)row)[i]);
    case QUANT_TYPE_BF16: return cu_bf16_to_f32(((const uint16_t *)row)[i]);
    default: return 0.0f;
    }
}

/* Dequantizes a whole row of n elements into y (called by all threads of a block, strided). */
__device__ __forceinline__ void cu_dequant_row_block(uint32_t type, const uint8_t *row, float *y, int64_t n) {
    const int64_t n8 = n / 8;
    for (int64_t p = threadIdx.x; p < n8; p += blockDim.x) {
        float v[8];
        cu_dequant8(type, row, 8 * p, v);
#pragma unroll
        for (int i = 0; i < 8; i++) y[8 * p + i] = v[i];
    }
    for (int64_t i = 8 * n8 + threadIdx.x; i < n; i += blockDim.x) y[i] = cu_dequant1(type, row, i);
}

#endif
