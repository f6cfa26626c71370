/* cuda_quant_ext.cu: op_matmul for up to 64 activation rows with the weight types added after the
 * first set (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS): a warp per output row
 * dequantizes 8 weights per lane per step (cu_dequant8 -> cu_dequant8_ext) and accumulates every
 * activation row in f32 with explicit _rn operations, so an output's value does not depend on the
 * number of rows (decode and verification agree). Larger batches and get_rows take the generic
 * paths of cuda_matmul.cu / cuda_ops.cu, which dequantize through the same cu_dequant8. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/cuda_quant_ext.cuh"

template <uint32_t WT, int NR>
__global__ void __launch_bounds__(128) k_mm_deq_ext(const uint8_t *w, int64_t w_nb1, const char *x, int64_t x_nb1,
                                                    float *dst, int64_t ldd, int64_t n_in, int64_t n_out, int n_rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * 4 + warp;
    if (o >= n_out) return;
    const uint8_t *wr = w + o * w_nb1;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    const int64_t n8 = n_in / 8; /* n_in is a multiple of 32 for these types */
    for (int64_t p = lane; p < n8; p += 32) {
        float wv[8];
        cu_dequant8_ext(WT, wr, 8 * p, wv);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < n_rows) {
                const float *xr = (const float *)(x + (int64_t)r * x_nb1) + 8 * p;
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r] = __fmaf_rn(wv[i], xr[i], acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        if (r < n_rows) {
            const float s = cu_warp_sum(acc[r]);
            if (lane == 0) dst[(int64_t)r * ldd + o] = s;
        }
    }
}

template <uint32_t WT>
static void launch_ext(int nr, dim3 grid, cudaStream_t st, const uint8_t *w, int64_t w_nb1, const char *x,
                       int64_t x_nb1, float *dst, int64_t ldd, int64_t n_in, int64_t n_out, int n_rows) {
    switch (nr) {
#define CASE(N) case N: k_mm_deq_ext<WT, N><<<grid, 128, 0, st>>>(w, w_nb1, x, x_nb1, dst, ldd, n_in, n_out, n_rows); break;
    CASE(1) CASE(2) CASE(4) CASE(8) CASE(16) CASE(32) CASE(64)
#undef CASE
    default: cuda_fatal(__FILE__, __LINE__, "launch_ext", "row bucket");
    }
    CUDA_LAUNCH_CHECK("k_mm_deq_ext");
}

bool cuda_matmul_small_ext(uint32_t type, int nr, dim3 grid, cudaStream_t st, const uint8_t *w, int64_t w_nb1,
                           const char *x, int64_t x_nb1, float *dst, int64_t ldd, int64_t n_in, int64_t n_out,
                           int n_rows) {
    switch (type) {
#define T(QT) case QT: launch_ext<QT>(nr, grid, st, w, w_nb1, x, x_nb1, dst, ldd, n_in, n_out, n_rows); return true;
    T(QUANT_TYPE_Q4_1) T(QUANT_TYPE_Q5_0) T(QUANT_TYPE_Q5_1) T(QUANT_TYPE_IQ4_NL)
    T(QUANT_TYPE_Q2_K) T(QUANT_TYPE_Q3_K) T(QUANT_TYPE_Q5_K) T(QUANT_TYPE_IQ4_XS)
#undef T
    default: return false;
    }
}
