/* cuda_common.cuh: what the CUDA backend's .cu files share: the C headers (wrapped for C++), the
 * error checks (CUDA_CHECK on every runtime call, CUBLAS_CHECK, CUDA_LAUNCH_CHECK after every
 * kernel launch), the backend / queue objects, the kernel-side tensor view, small device helpers
 * (warp and block reductions, f16 / bf16 loads) and the op launchers of each file. C++ only
 * inside this folder; the rest of dflash sees backend_cuda.h. */
#ifndef DFL_BACKEND_CUDA_COMMON_CUH
#define DFL_BACKEND_CUDA_COMMON_CUH

/* the C headers use C11 keywords that C++ spells differently */
#ifndef _Static_assert
#define _Static_assert static_assert
#endif
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif

extern "C" {
#include "backend/backend_impl.h"
#include "base/error.h"
}
#include "backend/cuda/backend_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <stdint.h>

/* ---- error checks ------------------------------------------------------------------------ */

/* Aborts with "cuda backend: <what> failed: <msg>" at file:line (a broken invariant). */
[[noreturn]] void cuda_fatal(const char *file, int line, const char *what, const char *msg);

#define CUDA_CHECK(call)                                                                         \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) cuda_fatal(__FILE__, __LINE__, #call, cudaGetErrorString(e_));   \
    } while (0)

/* api: the backend's cuda_blas_api (cuBLAS is opened at run time, cuda_blas.cu) */
#define CUBLAS_CHECK(api, call)                                                                  \
    do {                                                                                         \
        cublasStatus_t s_ = (call);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) cuda_fatal(__FILE__, __LINE__, #call, (api)->status_string(s_)); \
    } while (0)

/* After every kernel launch: a bad configuration (grid, shared memory) fails here, named. */
#define CUDA_LAUNCH_CHECK(kernel_name)                                                           \
    do {                                                                                         \
        cudaError_t e_ = cudaGetLastError();                                                     \
        if (e_ != cudaSuccess) cuda_fatal(__FILE__, __LINE__, "launch of " kernel_name, cudaGetErrorString(e_)); \
    } while (0)

/* Device-side invariant failures, OR-ed into the backend's error word (checked on every host
 * synchronization): an index out of range in set_rows / get_rows. */
enum {
    CUDA_ERRF_SET_ROWS_INDEX = 1u,
    CUDA_ERRF_GET_ROWS_INDEX = 2u,
};

/* ---- objects ----------------------------------------------------------------------------- */

/* The cuBLAS entry points the backend uses (dlopen'ed once per backend, cuda_blas.cu). */
typedef struct cuda_blas_api {
    void *lib;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    decltype(&cublasGetStatusString) status_string;
} cuda_blas_api;

dfl_status cuda_blas_load(cuda_blas_api *api, dfl_error *err);
void cuda_blas_unload(cuda_blas_api *api);

typedef struct cuda_backend {
    backend base;
    int device;
    int n_sm;
    int cc_major, cc_minor;
    size_t smem_optin;          /* max dynamic shared memory per block (opt-in) */
    size_t mem_total;
    char desc[400];             /* backend_cuda_device_name */
    unsigned int *err_host;     /* pinned, mapped: the error word (CUDA_ERRF_*) */
    unsigned int *err_dev;      /* its device address */
    cudaStream_t xfer;          /* blocking buffer_set / buffer_get */
    cuda_blas_api blas;
    /* bumped on every host-side wait (queue or event synchronize, a ring wrap) and host write
     * into a buffer (buffer_set): after one the host may have changed any activation, so no
     * queue reuses quantized activations from before it (atomic: any thread may wait) */
    uint64_t host_gen;
#ifdef DFL_TEST_HOOKS
    int64_t test_chunk_rows;    /* > 0: rows per dequantized chunk in the quantized cuBLAS path */
#endif
} cuda_backend;

typedef struct cuda_queue {
    backend_queue base;
    cudaStream_t stream;
    cublasHandle_t blas;
    char *stage;                /* pinned ring for op_write (host bytes copied at submit) */
    size_t stage_cap, stage_head;
    void *scratch;              /* per-op device scratch (quantized activations, partials) */
    size_t scratch_size;
    /* the Q8_0 activations in the scratch stay valid for the next op when it is a matmul over
     * the same x (k and v, gate and up share their input): any other op, a device-side wait, a
     * synchronization of this queue, or a host-side wait anywhere on the backend (xq_gen !=
     * the backend's host_gen) invalidates them */
    bool xq_valid;
    const void *xq_x;
    int64_t xq_nb1, xq_n_in, xq_rows;
    uint64_t xq_gen;
} cuda_queue;

typedef struct cuda_event {
    backend_event base;
    cudaEvent_t ev;
    std::atomic<bool> recorded;
} cuda_event;

/* Makes be's device current on the calling thread (the runtime's current device is per thread). */
void cuda_set_device(const cuda_backend *be);
/* The host waited (or wrote device memory): a new generation of host-visible state. */
static inline void cuda_host_gen_bump(cuda_backend *be) { __atomic_add_fetch(&be->host_gen, 1, __ATOMIC_ACQ_REL); }
static inline uint64_t cuda_host_gen(const cuda_backend *be) { return __atomic_load_n(&be->host_gen, __ATOMIC_ACQUIRE); }
/* Device scratch of at least bytes for the op being enqueued on q; grows once to the largest op
 * (the old block is freed with cudaFree, which waits for the device, so no queued op still
 * uses it). Contents are undefined between ops. */
void *cuda_queue_scratch(cuda_queue *q, size_t bytes);

/* ---- the kernel-side tensor view ---------------------------------------------------------- */

typedef struct cuda_tensor {
    char *data;
    int64_t ne[4];
    int64_t nb[4]; /* byte strides */
    uint32_t type;
} cuda_tensor;

static inline cuda_tensor cuda_view(const tensor *t) {
    cuda_tensor v;
    v.data = (char *)t->data;
    for (int d = 0; d < 4; d++) {
        v.ne[d] = t->ne[d];
        v.nb[d] = (int64_t)t->nb[d];
    }
    v.type = t->type;
    return v;
}

/* Row ir (over dims 1..3) of t. */
__device__ __forceinline__ char *cu_row(const cuda_tensor &t, int64_t ir) {
    const int64_t i1 = ir % t.ne[1];
    const int64_t i2 = (ir / t.ne[1]) % t.ne[2];
    const int64_t i3 = ir / (t.ne[1] * t.ne[2]);
    return t.data + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/* ---- device helpers ---------------------------------------------------------------------- */

__device__ __forceinline__ float cu_f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float cu_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t cu_f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ uint16_t cu_f32_to_bf16(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
/* A 16-bit little-endian load from a 2-byte aligned address. */
__device__ __forceinline__ uint16_t cu_ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }
/* 4 bytes from a 2-byte aligned address as one int (byte 0 lowest). */
__device__ __forceinline__ int cu_ld_i32_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (int)((uint32_t)h[0] | ((uint32_t)h[1] << 16));
}

__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * sh: 32 floats of shared memory. Fixed reduction order: the result depends only on the inputs. */
__device__ __forceinline__ float cu_block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < n_warps ? sh[lane] : 0.0f;
    return cu_warp_sum(v);
}

__device__ __forceinline__ float cu_block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < n_warps ? sh[lane] : -INFINITY;
    return cu_warp_max(v);
}

/* ---- op launchers (enqueue on q->stream) ------------------------------------------------- */

/* cuda_matmul.cu */
void cuda_op_matmul(cuda_backend *be, cuda_queue *q, const backend_op *op);
/* one-time per-device setup of the matmul kernels (shared-memory limits) */
void cuda_matmul_init(cuda_backend *be);
/* cuda_attention.cu */
void cuda_op_attention(cuda_backend *be, cuda_queue *q, const backend_op *op);
/* cuda_ops.cu: rmsnorm, rope, set/get rows, add, mul, swiglu, scale, copy, softmax, argmax */
void cuda_op_light(cuda_backend *be, cuda_queue *q, const backend_op *op);

#endif
