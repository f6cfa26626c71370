/* cuda_matmul.cu: op_matmul on the GPU, dst [n_out, n_rows] = x [n_in, n_rows] W^T for weights
 * W [n_in, n_out] of type F32, F16, BF16, Q8_0, Q4_0, Q4_K or Q6_K.
 *
 * Up to MM_SMALL_ROWS (64) activation rows (decode: 1, verification: 2-64) our own kernels read
 * every weight once per op, with all rows in registers:
 *   - F16 / BF16 (n_in, n_out multiples of 16, rows 32-byte aligned): tensor cores (WMMA 16x16x16,
 *     f32 accumulation) on x rounded to the weight's type (the CPU's dot type). A block owns 16
 *     output rows; its 8 warps take the 64-wide k chunks c = warp, warp + 8, ... and their
 *     accumulators are summed in warp order at the end (a fixed split of k, no atomics).
 *   - Q8_0 / Q4_0: x is quantized to Q8_0 blocks first (d = amax/127 rounded to f16,
 *     q = round-half-even(x * 127/amax), as the CPU's AVX path; kept for a directly following
 *     matmul over the same x), then a warp per output row takes 8 blocks per step (4 lanes per
 *     block, 8 quants per lane) with integer dp4a dot products.
 *   - everything else (F32, Q4_K, Q6_K, unaligned F16 / BF16): a warp per output row dequantizes
 *     8 weights per lane per step and accumulates in f32 (a tiled dequantizing mat-vec).
 * In each of them an output's value is produced by the same sequence of operations whatever
 * n_rows is (explicit _rn intrinsics where contraction could differ), so decode and verification
 * agree bit for bit: greedy speculative output equals the target's own greedy output.
 * Above 64 rows (prompt processing) cuBLAS: SGEMM for F32, GemmEx on x rounded to f16 / bf16 for
 * F16 / BF16, and for quantized weights a chunk of rows dequantized to f32 then GemmEx with TF32
 * tensor cores (no f16 overflow on large activations). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"

#include <mma.h>

#define MM_SMALL_ROWS 64

/* ---- x -> Q8_0 blocks ------------------------------------------------------------------------ */

/* xq [n_rows][n_in] int8, xd [n_rows][n_in / 32] f32; a warp per block of 32, 8 per thread block. */
__global__ void k_quantize_q8(const char *x, int64_t x_nb1, int8_t *xq, float *xd, int64_t n_in) {
    const int64_t nb = n_in / 32;
    const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int64_t r = blockIdx.y;
    if (b >= nb) return;
    const int lane = threadIdx.x & 31;
    const float v = ((const float *)(x + r * x_nb1))[b * 32 + lane];
    const float amax = cu_warp_max(fabsf(v));
    const float db = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    xq[r * n_in + b * 32 + lane] = (int8_t)__float2int_rn(__fmul_rn(v, id));
    if (lane == 0) xd[r * nb + b] = __half2float(__float2half_rn(db));
}

/* ---- Q8_0 / Q4_0 x Q8_0 with dp4a ------------------------------------------------------------ */

template <int WT, int NR>
__global__ void __launch_bounds__(128) k_mm_dp4a(const uint8_t *w, int64_t w_nb1, const int8_t *xq, const float *xd,
                                                 float *dst, int64_t ldd, int64_t n_in, int64_t n_out, int n_rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * 4 + warp;
    if (o >= n_out) return;
    const uint8_t *wr = w + o * w_nb1;
    const int64_t nb = n_in / 32;
    const int part = lane & 3;
    constexpr int64_t BSZ = WT == QUANT_TYPE_Q8_0 ? 34 : 18;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
#pragma unroll 4
    for (int64_t b = lane >> 2; b < nb; b += 8) {
        const uint8_t *blk = wr + b * BSZ;
        const float dw = cu_f16_to_f32(cu_ld_u16(blk));
        int w0, w1;
        if (WT == QUANT_TYPE_Q8_0) {
            w0 = cu_ld_i32_a2(blk + 2 + 8 * part);
            w1 = cu_ld_i32_a2(blk + 6 + 8 * part);
        } else {
            const int v = cu_ld_i32_a2(blk + 2 + 4 * part);
            w0 = v & 0x0f0f0f0f;        /* elements 4p .. 4p+3 */
            w1 = (v >> 4) & 0x0f0f0f0f; /* elements 16+4p .. 16+4p+3 */
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < n_rows) {
                const int8_t *xb = xq + (int64_t)r * n_in + b * 32;
                int isum;
                if (WT == QUANT_TYPE_Q8_0) {
                    const int2 xv = *(const int2 *)(xb + 8 * part);
                    isum = __dp4a(w0, xv.x, __dp4a(w1, xv.y, 0));
                } else {
                    const int xa = *(const int *)(xb + 4 * part), xc = *(const int *)(xb + 16 + 4 * part);
                    const int sx = __dp4a(0x01010101, xa, __dp4a(0x01010101, xc, 0));
                    isum = __dp4a(w0, xa, __dp4a(w1, xc, 0)) - 8 * sx;
                }
                acc[r] = __fmaf_rn(__fmul_rn(dw, xd[(int64_t)r * nb + b]), (float)isum, acc[r]);
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

/* ---- generic dequantizing mat-vec ------------------------------------------------------------ */

template <uint32_t WT, int NR>
__global__ void __launch_bounds__(128) k_mm_deq(const uint8_t *w, int64_t w_nb1, const char *x, int64_t x_nb1,
                                                float *dst, int64_t ldd, int64_t n_in, int64_t n_out, int n_rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * 4 + warp;
    if (o >= n_out) return;
    const uint8_t *wr = w + o * w_nb1;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    const int64_t n8 = n_in / 8;
    for (int64_t p = lane; p < n8; p += 32) {
        float wv[8];
        cu_dequant8(WT, wr, 8 * p, wv);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < n_rows) {
                const float *xr = (const float *)(x + (int64_t)r * x_nb1) + 8 * p;
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r] = __fmaf_rn(wv[i], xr[i], acc[r]);
            }
        }
    }
    for (int64_t i = 8 * n8 + lane; i < n_in; i += 32) {
        const float wv = cu_dequant1(WT, wr, i);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < n_rows) acc[r] = __fmaf_rn(wv, ((const float *)(x + (int64_t)r * x_nb1))[i], acc[r]);
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

/* ---- F16 / BF16 with tensor cores ------------------------------------------------------------ */

#define MMW_WARPS 8
#define MMW_KC 64  /* k chunk per warp step */
#define MMW_LDX 72 /* staged x row stride (elements): 144 bytes, keeps 32-byte fragment alignment */

template <typename T> __device__ __forceinline__ T cu_from_f32(float v);
template <> __device__ __forceinline__ __half cu_from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 cu_from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

template <int NT> static constexpr size_t mmw_smem_bytes() {
    return (size_t)MMW_WARPS * NT * 16 * MMW_LDX * 2;
}

/* Block: 16 output rows [o0, o0 + 16); NT tiles of 16 activation rows (rows >= n_rows are 0). */
template <typename T, int NT>
__global__ void __launch_bounds__(MMW_WARPS * 32) k_mm_wmma(const T *w, int64_t ldw, const char *x, int64_t x_nb1,
                                                            float *dst, int64_t ldd, int64_t n_in, int n_rows) {
    using namespace nvcuda;
    extern __shared__ __align__(32) unsigned char mmw_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t o0 = (int64_t)blockIdx.x * 16;
    T *xs = (T *)mmw_sm + (size_t)warp * NT * 16 * MMW_LDX; /* this warp's [NT*16][MMW_LDX] */
    for (int i = lane; i < NT * 16 * MMW_LDX; i += 32) xs[i] = cu_from_f32<T>(0.0f);
    __syncwarp();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) wmma::fill_fragment(acc[t], 0.0f);
    const int64_t n_chunks = (n_in + MMW_KC - 1) / MMW_KC;
    const T *wt = w + o0 * ldw;
    for (int64_t c = warp; c < n_chunks; c += MMW_WARPS) {
        const int64_t k0 = c * MMW_KC;
        const int kc = (int)(n_in - k0 < MMW_KC ? n_in - k0 : MMW_KC); /* a multiple of 16 */
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[MMW_KC / 16];
#pragma unroll
        for (int s = 0; s < MMW_KC / 16; s++) {
            if (s * 16 < kc) wmma::load_matrix_sync(a[s], wt + k0 + s * 16, (unsigned)ldw);
        }
        for (int r = 0; r < n_rows; r++) {
            const float *xr = (const float *)(x + (int64_t)r * x_nb1) + k0;
            for (int kk = lane; kk < kc; kk += 32) xs[r * MMW_LDX + kk] = cu_from_f32<T>(xr[kk]);
        }
        __syncwarp();
#pragma unroll
        for (int s = 0; s < MMW_KC / 16; s++) {
            if (s * 16 < kc) {
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                    wmma::load_matrix_sync(b, xs + t * 16 * MMW_LDX + s * 16, MMW_LDX);
                    wmma::mma_sync(acc[t], a[s], b, acc[t]);
                }
            }
        }
        __syncwarp();
    }
    __syncthreads();
    float *red = (float *)mmw_sm; /* [MMW_WARPS][NT][16 x 16] column-major tiles */
#pragma unroll
    for (int t = 0; t < NT; t++) wmma::store_matrix_sync(red + (warp * NT + t) * 256, acc[t], 16, wmma::mem_col_major);
    __syncthreads();
    for (int e = threadIdx.x; e < NT * 256; e += blockDim.x) {
        const int t = e >> 8, rem = e & 255, i = rem & 15, j = rem >> 4;
        const int r = t * 16 + j;
        if (r < n_rows) {
            float s = 0.0f;
            for (int ww = 0; ww < MMW_WARPS; ww++) s = __fadd_rn(s, red[(ww * NT + t) * 256 + rem]);
            dst[(int64_t)r * ldd + o0 + i] = s;
        }
    }
}

/* ---- large batches: conversions for cuBLAS ---------------------------------------------------- */

/* out [n_rows][n_in] = x rows rounded to T; grid.y strides over the rows (<= 65535 blocks). */
template <typename T>
__global__ void k_convert_rows(const char *x, int64_t x_nb1, T *out, int64_t n_in, int64_t n_rows) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_in) return;
    for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
        out[r * n_in + i] = cu_from_f32<T>(((const float *)(x + r * x_nb1))[i]);
    }
}

/* out [rows][n_in] f32 = dequantize(w rows); block per row. */
__global__ void k_dequant_rows(const uint8_t *w, int64_t w_nb1, uint32_t type, float *out, int64_t n_in) {
    const int64_t r = blockIdx.x;
    cu_dequant_row_block(type, w + r * w_nb1, out + r * n_in, n_in);
}

/* ---- dispatch --------------------------------------------------------------------------------- */

static int rows_bucket(int64_t n_rows) {
    int nr = 1;
    while (nr < n_rows) nr *= 2;
    return nr;
}

template <int WT>
static void launch_dp4a(int nr, dim3 grid, cudaStream_t st, const uint8_t *w, int64_t w_nb1, const int8_t *xq,
                        const float *xd, float *dst, int64_t ldd, int64_t n_in, int64_t n_out, int n_rows) {
    switch (nr) {
#define CASE(N) case N: k_mm_dp4a<WT, N><<<grid, 128, 0, st>>>(w, w_nb1, xq, xd, dst, ldd, n_in, n_out, n_rows); break;
    CASE(1) CASE(2) CASE(4) CASE(8) CASE(16) CASE(32) CASE(64)
#undef CASE
    default: cuda_fatal(__FILE__, __LINE__, "launch_dp4a", "row bucket");
    }
    CUDA_LAUNCH_CHECK("k_mm_dp4a");
}

template <uint32_t WT>
static void launch_deq(int nr, dim3 grid, cudaStream_t st, const uint8_t *w, int64_t w_nb1, const char *x,
                       int64_t x_nb1, float *dst, int64_t ldd, int64_t n_in, int64_t n_out, int n_rows) {
    switch (nr) {
#define CASE(N) case N: k_mm_deq<WT, N><<<grid, 128, 0, st>>>(w, w_nb1, x, x_nb1, dst, ldd, n_in, n_out, n_rows); break;
    CASE(1) CASE(2) CASE(4) CASE(8) CASE(16) CASE(32) CASE(64)
#undef CASE
    default: cuda_fatal(__FILE__, __LINE__, "launch_deq", "row bucket");
    }
    CUDA_LAUNCH_CHECK("k_mm_deq");
}

template <typename T>
static void launch_wmma(int nt, dim3 grid, cudaStream_t st, const T *w, int64_t ldw, const char *x, int64_t x_nb1,
                        float *dst, int64_t ldd, int64_t n_in, int n_rows) {
    switch (nt) {
#define CASE(N) case N: k_mm_wmma<T, N><<<grid, MMW_WARPS * 32, mmw_smem_bytes<N>(), st>>>(w, ldw, x, x_nb1, dst, ldd, n_in, n_rows); break;
    CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
    default: cuda_fatal(__FILE__, __LINE__, "launch_wmma", "row tiles");
    }
    CUDA_LAUNCH_CHECK("k_mm_wmma");
}

template <typename T> static void wmma_set_smem(void) {
    CUDA_CHECK(cudaFuncSetAttribute(k_mm_wmma<T, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mmw_smem_bytes<1>()));
    CUDA_CHECK(cudaFuncSetAttribute(k_mm_wmma<T, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mmw_smem_bytes<2>()));
    CUDA_CHECK(cudaFuncSetAttribute(k_mm_wmma<T, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mmw_smem_bytes<3>()));
    CUDA_CHECK(cudaFuncSetAttribute(k_mm_wmma<T, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mmw_smem_bytes<4>()));
}

void cuda_matmul_init(cuda_backend *be) {
    (void)be;
    wmma_set_smem<__half>();
    wmma_set_smem<__nv_bfloat16>();
}

static bool wmma_ok(const tensor *w) {
    return (w->type == QUANT_TYPE_F16 || w->type == QUANT_TYPE_BF16) && w->ne[0] % 16 == 0 && w->ne[1] % 16 == 0 &&
           w->nb[1] % 32 == 0 && ((uintptr_t)w->data % 32) == 0 && w->ne[1] / 16 <= 0x7fffffff &&
           w->nb[1] / 2 <= 0x7fffffff;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static void matmul_small(cuda_backend *be, cuda_queue *q, const backend_op *op) {
    const tensor *w = &op->src[0], *x = &op->src[1], *d = &op->dst;
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    const int n_rows = (int)x->ne[1];
    const int64_t ldd = (int64_t)(d->nb[1] / sizeof(float));
    cudaStream_t st = q->stream;
    const uint8_t *wd = (const uint8_t *)w->data;
    const int64_t w_nb1 = (int64_t)w->nb[1], x_nb1 = (int64_t)x->nb[1];
    float *dd = (float *)d->data;
    const bool q8 = w->type == QUANT_TYPE_Q8_0 || w->type == QUANT_TYPE_Q4_0;
    if (!q8) q->xq_valid = false;
    if (wmma_ok(w)) {
        const int nt = (n_rows + 15) / 16;
        const dim3 grid((unsigned)(n_out / 16));
        if (w->type == QUANT_TYPE_F16) {
            launch_wmma<__half>(nt, grid, st, (const __half *)wd, w_nb1 / 2, (const char *)x->data, x_nb1, dd, ldd, n_in,
                                n_rows);
        } else {
            launch_wmma<__nv_bfloat16>(nt, grid, st, (const __nv_bfloat16 *)wd, w_nb1 / 2, (const char *)x->data, x_nb1,
                                       dd, ldd, n_in, n_rows);
        }
        return;
    }
    const int nr = rows_bucket(n_rows);
    const dim3 grid((unsigned)((n_out + 3) / 4));
    if (q8) {
        const int64_t nb = n_in / 32;
        const size_t q_bytes = align256((size_t)n_rows * (size_t)n_in);
        const uint64_t gen = cuda_host_gen(be);
        const bool reuse = q->xq_valid && q->xq_gen == gen && q->xq_x == x->data && q->xq_nb1 == x_nb1 &&
                           q->xq_n_in == n_in && q->xq_rows == n_rows;
        char *scr = (char *)cuda_queue_scratch(q, q_bytes + (size_t)n_rows * (size_t)nb * sizeof(float));
        int8_t *xq = (int8_t *)scr;
        float *xd = (float *)(scr + q_bytes);
        if (!reuse) {
            k_quantize_q8<<<dim3((unsigned)((nb + 7) / 8), (unsigned)n_rows), 256, 0, st>>>((const char *)x->data, x_nb1,
                                                                                             xq, xd, n_in);
            CUDA_LAUNCH_CHECK("k_quantize_q8");
            q->xq_valid = true;
            q->xq_gen = gen;
            q->xq_x = x->data;
            q->xq_nb1 = x_nb1;
            q->xq_n_in = n_in;
            q->xq_rows = n_rows;
        }
        if (w->type == QUANT_TYPE_Q8_0) {
            launch_dp4a<QUANT_TYPE_Q8_0>(nr, grid, st, wd, w_nb1, xq, xd, dd, ldd, n_in, n_out, n_rows);
        } else {
            launch_dp4a<QUANT_TYPE_Q4_0>(nr, grid, st, wd, w_nb1, xq, xd, dd, ldd, n_in, n_out, n_rows);
        }
        return;
    }
    const char *xp = (const char *)x->data;
    switch (w->type) {
    case QUANT_TYPE_F32: launch_deq<QUANT_TYPE_F32>(nr, grid, st, wd, w_nb1, xp, x_nb1, dd, ldd, n_in, n_out, n_rows); break;
    case QUANT_TYPE_F16: launch_deq<QUANT_TYPE_F16>(nr, grid, st, wd, w_nb1, xp, x_nb1, dd, ldd, n_in, n_out, n_rows); break;
    case QUANT_TYPE_BF16: launch_deq<QUANT_TYPE_BF16>(nr, grid, st, wd, w_nb1, xp, x_nb1, dd, ldd, n_in, n_out, n_rows); break;
    case QUANT_TYPE_Q4_K: launch_deq<QUANT_TYPE_Q4_K>(nr, grid, st, wd, w_nb1, xp, x_nb1, dd, ldd, n_in, n_out, n_rows); break;
    case QUANT_TYPE_Q6_K: launch_deq<QUANT_TYPE_Q6_K>(nr, grid, st, wd, w_nb1, xp, x_nb1, dd, ldd, n_in, n_out, n_rows); break;
    default: cuda_fatal(__FILE__, __LINE__, "cuda_op_matmul", "weight type without a kernel");
    }
}

/* dst = x W^T through cuBLAS (column-major: C [n_out, n_rows] = W^T [n_out, n_in] * X [n_in, n_rows]). */
static void matmul_large(cuda_backend *be, cuda_queue *q, const backend_op *op) {
    const cuda_blas_api *api = &be->blas;
    const tensor *w = &op->src[0], *x = &op->src[1], *d = &op->dst;
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n_rows = x->ne[1];
    const int ldd = (int)(d->nb[1] / sizeof(float)), ldx = (int)(x->nb[1] / sizeof(float));
    const float one = 1.0f, zero = 0.0f;
    cudaStream_t st = q->stream;
    if (n_in > 0x7fffffff || n_out > 0x7fffffff || n_rows > 0x7fffffff || w->nb[1] / 2 > 0x7fffffff) {
        cuda_fatal(__FILE__, __LINE__, "cuda_op_matmul", "matrix too large for cuBLAS");
    }
    switch (w->type) {
    case QUANT_TYPE_F32:
        CUBLAS_CHECK(api, api->sgemm(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_rows, (int)n_in, &one,
                                 (const float *)w->data, (int)(w->nb[1] / 4), (const float *)x->data, ldx, &zero,
                                 (float *)d->data, ldd));
        return;
    case QUANT_TYPE_F16:
    case QUANT_TYPE_BF16: {
        const bool f16 = w->type == QUANT_TYPE_F16;
        void *xh = cuda_queue_scratch(q, (size_t)n_in * (size_t)n_rows * 2);
        const dim3 grid((unsigned)((n_in + 255) / 256), (unsigned)(n_rows < 65535 ? n_rows : 65535));
        if (f16) {
            k_convert_rows<__half><<<grid, 256, 0, st>>>((const char *)x->data, (int64_t)x->nb[1], (__half *)xh, n_in,
                                                         n_rows);
        } else {
            k_convert_rows<__nv_bfloat16><<<grid, 256, 0, st>>>((const char *)x->data, (int64_t)x->nb[1],
                                                                (__nv_bfloat16 *)xh, n_in, n_rows);
        }
        CUDA_LAUNCH_CHECK("k_convert_rows");
        const cudaDataType_t ty = f16 ? CUDA_R_16F : CUDA_R_16BF;
        CUBLAS_CHECK(api, api->gemm_ex(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_rows, (int)n_in, &one, w->data,
                                  ty, (int)(w->nb[1] / 2), xh, ty, (int)n_in, &zero, d->data, CUDA_R_32F, ldd,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    default: {
        /* quantized: dequantize chunks of rows to f32 (<= 64 MiB), TF32 GEMM per chunk */
        int64_t chunk = ((int64_t)64 << 20) / (n_in * 4);
        if (chunk < 16) chunk = 16;
#ifdef DFL_TEST_HOOKS
        if (be->test_chunk_rows > 0) chunk = be->test_chunk_rows; /* several chunks on a test's sizes */
#endif
        if (chunk > n_out) chunk = n_out;
        float *wf = (float *)cuda_queue_scratch(q, (size_t)chunk * (size_t)n_in * sizeof(float));
        for (int64_t o0 = 0; o0 < n_out; o0 += chunk) {
            const int64_t m = n_out - o0 < chunk ? n_out - o0 : chunk;
            k_dequant_rows<<<(unsigned)m, 256, 0, st>>>((const uint8_t *)w->data + o0 * (int64_t)w->nb[1],
                                                        (int64_t)w->nb[1], w->type, wf, n_in);
            CUDA_LAUNCH_CHECK("k_dequant_rows");
            CUBLAS_CHECK(api, api->gemm_ex(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n_rows, (int)n_in, &one, wf,
                                      CUDA_R_32F, (int)n_in, x->data, CUDA_R_32F, ldx, &zero, (float *)d->data + o0,
                                      CUDA_R_32F, ldd, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
        }
        return;
    }
    }
}

void cuda_op_matmul(cuda_backend *be, cuda_queue *q, const backend_op *op) {
    if (op->src[0].ne[1] > 0x7fffffffLL * 4) cuda_fatal(__FILE__, __LINE__, "cuda_op_matmul", "too many output rows");
    if (op->src[1].ne[1] <= MM_SMALL_ROWS) {
        matmul_small(be, q, op);
    } else {
        q->xq_valid = false; /* the cuBLAS paths use the scratch */
        matmul_large(be, q, op);
    }
}
