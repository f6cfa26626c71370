/* cuda_ops.cu: the CUDA backend's light ops: rmsnorm (also per head), rope (NEOX and NORM pairs), set_rows,
 * get_rows, add / mul (with broadcast), swiglu, scale, copy (f32 / f16 / bf16), row softmax and
 * row argmax. One thread block per row (rows over dims 1..3, any byte strides); every result is
 * computed by a fixed sequence of operations, so it does not depend on how many rows an op has.
 * Numerics follow the CPU reference (src/backend/cpu/cpu_ops_ref.c): rmsnorm scale
 * 1/sqrt(mean(x^2) + eps), rope angles accumulated by repeated f32 multiplication of
 * theta_scale = freq_base^(-2/n_rot) (computed on the host with the same powf), cos / sin
 * rounded from double, silu x / (1 + exp(-x)), softmax max-subtracted, argmax first max (a NaN/Inf
 * row flagged as -1 - its first such index). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"

#include <math.h>

static int threads_for(int64_t n) {
    int t = 32;
    while (t < 256 && t < n) t *= 2;
    return t;
}

/* ---- rmsnorm ------------------------------------------------------------------------------ */

/* dst row = x row / sqrt(mean(x^2) + eps) * w (w may be NULL); dst may be x. */
__global__ void k_rmsnorm(cuda_tensor dst, cuda_tensor x, const float *w, float eps) {
    __shared__ float sh[32];
    const int64_t ir = blockIdx.x, n = x.ne[0];
    const float *xr = (const float *)cu_row(x, ir);
    float *dr = (float *)cu_row(dst, ir);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(xr[i], xr[i], s);
    s = cu_block_sum(s, sh);
    const float mean = s / (float)n;
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float y = xr[i] * scale;
        dr[i] = w != NULL ? y * w[i] : y;
    }
}

/* ---- rope --------------------------------------------------------------------------------- */

/* x, dst [hd, nh, nt]; block per (head, token) row; pos[it] at pos + it * pos_stride bytes. Pair i
 * (i < n_rot/2, angle theta_i) is (i, i + n_rot/2) in NEOX mode, (2i, 2i + 1) in NORM mode (arch
 * llama). Each thread reads and writes only its own pairs and tail elements: dst may be x. */
__global__ void k_rope(cuda_tensor dst, cuda_tensor x, const char *pos, int64_t pos_stride, float theta_scale,
                       int n_rot, int norm) {
    const int64_t ir = blockIdx.x;
    const int64_t ih = ir % x.ne[1], it = ir / x.ne[1];
    const float *xr = (const float *)(x.data + ih * x.nb[1] + it * x.nb[2]);
    float *dr = (float *)(dst.data + ih * dst.nb[1] + it * dst.nb[2]);
    const int half = n_rot / 2;
    const float p = (float)*(const int32_t *)(pos + it * pos_stride);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = p;
        for (int j = 0; j < i; j++) theta = __fmul_rn(theta, theta_scale);
        double sd, cd;
        sincos((double)theta, &sd, &cd);
        const float c = (float)cd, s = (float)sd;
        const int i0 = norm ? 2 * i : i, i1 = norm ? 2 * i + 1 : i + half;
        const float x0 = xr[i0], x1 = xr[i1];
        dr[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        dr[i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
    for (int64_t i = n_rot + threadIdx.x; i < x.ne[0]; i += blockDim.x) dr[i] = xr[i];
}

/* ---- rows --------------------------------------------------------------------------------- */

__device__ __forceinline__ int64_t cu_load_index(const char *idx, int64_t stride, int is64, int64_t i) {
    const char *p = idx + i * stride;
    return is64 ? *(const int64_t *)p : (int64_t)*(const int32_t *)p;
}

/* dst row idx[r] = convert(src row r); block per src row. */
__global__ void k_set_rows(cuda_tensor dst, cuda_tensor src, const char *idx, int64_t idx_stride, int idx64,
                           unsigned int *err) {
    const int64_t r = blockIdx.x;
    const int64_t id = cu_load_index(idx, idx_stride, idx64, r);
    if (id < 0 || id >= dst.ne[1]) {
        if (threadIdx.x == 0) atomicOr(err, (unsigned int)CUDA_ERRF_SET_ROWS_INDEX);
        return;
    }
    const float *sr = (const float *)(src.data + r * src.nb[1]);
    char *dr = dst.data + id * dst.nb[1];
    const int64_t n = src.ne[0];
    switch (dst.type) {
    case QUANT_TYPE_F32:
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ((float *)dr)[i] = sr[i];
        break;
    case QUANT_TYPE_F16:
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ((uint16_t *)dr)[i] = cu_f32_to_f16(sr[i]);
        break;
    default:
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ((uint16_t *)dr)[i] = cu_f32_to_bf16(sr[i]);
        break;
    }
}

/* dst row r = dequantize(src row idx[r]); block per dst row. */
__global__ void k_get_rows(cuda_tensor dst, cuda_tensor src, const int32_t *idx, int64_t idx_stride,
                           unsigned int *err) {
    const int64_t r = blockIdx.x;
    const int64_t id = *(const int32_t *)((const char *)idx + r * idx_stride);
    if (id < 0 || id >= src.ne[1]) {
        if (threadIdx.x == 0) atomicOr(err, (unsigned int)CUDA_ERRF_GET_ROWS_INDEX);
        return;
    }
    cu_dequant_row_block(src.type, (const uint8_t *)src.data + id * src.nb[1], (float *)(dst.data + r * dst.nb[1]),
                         src.ne[0]);
}

/* ---- elementwise -------------------------------------------------------------------------- */

/* dst = a + b or a * b, b broadcast (b.ne[d] == 1 or a.ne[d]); block per row of a. */
__global__ void k_binary(cuda_tensor dst, cuda_tensor a, cuda_tensor b, int mul) {
    const int64_t ir = blockIdx.x;
    const int64_t i1 = ir % a.ne[1], i2 = (ir / a.ne[1]) % a.ne[2], i3 = ir / (a.ne[1] * a.ne[2]);
    const float *ar = (const float *)(a.data + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    float *dr = (float *)(dst.data + i1 * dst.nb[1] + i2 * dst.nb[2] + i3 * dst.nb[3]);
    const float *br = (const float *)(b.data + (i1 % b.ne[1]) * b.nb[1] + (i2 % b.ne[2]) * b.nb[2] +
                                      (i3 % b.ne[3]) * b.nb[3]);
    const int64_t n = a.ne[0], nb0 = b.ne[0];
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float bv = br[nb0 == 1 ? 0 : i];
        dr[i] = mul ? __fmul_rn(ar[i], bv) : __fadd_rn(ar[i], bv);
    }
}

__global__ void k_swiglu(cuda_tensor dst, cuda_tensor g, cuda_tensor u) {
    const int64_t ir = blockIdx.x;
    const float *gr = (const float *)cu_row(g, ir), *ur = (const float *)cu_row(u, ir);
    float *dr = (float *)cu_row(dst, ir);
    for (int64_t i = threadIdx.x; i < g.ne[0]; i += blockDim.x) {
        const float x = gr[i];
        const float silu = x / (1.0f + expf(-x));
        dr[i] = __fmul_rn(silu, ur[i]);
    }
}

__global__ void k_scale(cuda_tensor dst, cuda_tensor a, float s) {
    const int64_t ir = blockIdx.x;
    const float *ar = (const float *)cu_row(a, ir);
    float *dr = (float *)cu_row(dst, ir);
    for (int64_t i = threadIdx.x; i < a.ne[0]; i += blockDim.x) dr[i] = __fmul_rn(ar[i], s);
}

__device__ __forceinline__ float cu_load_elem(uint32_t type, const char *row, int64_t i) {
    return cu_dequant1(type, (const uint8_t *)row, i);
}

__device__ __forceinline__ void cu_store_elem(uint32_t type, char *row, int64_t i, float v) {
    switch (type) {
    case QUANT_TYPE_F32: ((float *)row)[i] = v; break;
    case QUANT_TYPE_F16: ((uint16_t *)row)[i] = cu_f32_to_f16(v); break;
    default: ((uint16_t *)row)[i] = cu_f32_to_bf16(v); break;
    }
}

__global__ void k_copy(cuda_tensor dst, cuda_tensor src) {
    const int64_t ir = blockIdx.x;
    const char *sr = cu_row(src, ir);
    char *dr = cu_row(dst, ir);
    for (int64_t i = threadIdx.x; i < src.ne[0]; i += blockDim.x) cu_store_elem(dst.type, dr, i, cu_load_elem(src.type, sr, i));
}

/* Row softmax (max-subtracted); a row with all scores -Inf gives zeros, a row with a NaN or +Inf
 * score gives NaN (as the CPU reference). dst may be a. */
__global__ void k_softmax(cuda_tensor dst, cuda_tensor a) {
    __shared__ float sh[32];
    const int64_t ir = blockIdx.x, n = a.ne[0];
    const float *ar = (const float *)cu_row(a, ir);
    float *dr = (float *)cu_row(dst, ir);
    float m = -INFINITY, bad = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        m = fmaxf(m, ar[i]);
        if (!(ar[i] < INFINITY)) bad = 1.0f; /* NaN or +Inf */
    }
    m = cu_block_max(m, sh);
    bad = cu_block_max(bad, sh);
    if (bad > 0.0f) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dr[i] = NAN;
        return;
    }
    if (m == -INFINITY) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dr[i] = 0.0f;
        return;
    }
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += ar[i] == -INFINITY ? 0.0f : expf(ar[i] - m);
    s = cu_block_sum(s, sh);
    const float inv = 1.0f / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = ar[i] == -INFINITY ? 0.0f : expf(ar[i] - m);
        dr[i] = e * inv;
    }
}

/* dst[r] = index of the first maximum of row r; a row holding a NaN or an Inf gives
 * -1 - (index of its first such value), as the CPU reference. */
__global__ void k_argmax(int32_t *dst, cuda_tensor a) {
    __shared__ float shv[32];
    __shared__ int64_t shi[32];
    __shared__ int64_t shb[32];
    const int64_t r = blockIdx.x, n = a.ne[0];
    const float *ar = (const float *)(a.data + r * a.nb[1]);
    float bv = -INFINITY;
    int64_t bi = n; /* n: none yet */
    int64_t bad = n; /* first non-finite index seen by this thread (n: none) */
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = ar[i];
        if (!isfinite(v) && bad == n) bad = i;
        if (v > bv || (bi == n && v == bv)) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        const int64_t ob = __shfl_xor_sync(0xffffffffu, bad, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
        bad = ob < bad ? ob : bad;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    if (lane == 0) {
        shv[warp] = bv;
        shi[warp] = bi;
        shb[warp] = bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < n_warps; w++) {
            if (shv[w] > bv || (shv[w] == bv && shi[w] < bi)) {
                bv = shv[w];
                bi = shi[w];
            }
            bad = shb[w] < bad ? shb[w] : bad;
        }
        dst[r] = bad < n ? (int32_t)(-1 - bad) : bi < n ? (int32_t)bi : 0;
    }
}

/* ---- dispatch ----------------------------------------------------------------------------- */

void cuda_op_light(cuda_backend *be, cuda_queue *q, const backend_op *op) {
    const tensor *d = &op->dst, *s0 = &op->src[0], *s1 = &op->src[1];
    cudaStream_t st = q->stream;
    switch (op->kind) {
    case BACKEND_OP_RMSNORM: {
        const int64_t rows = tensor_nrows(s0);
        k_rmsnorm<<<(unsigned)rows, threads_for(s0->ne[0]), 0, st>>>(cuda_view(d), cuda_view(s0),
                                                                     (const float *)s1->data, op->f[0]);
        CUDA_LAUNCH_CHECK("k_rmsnorm");
        break;
    }
    case BACKEND_OP_ROPE_NEOX: {
        const int n_rot = op->i[0] == 0 ? (int)s0->ne[0] : op->i[0];
        const float theta_scale = powf(op->f[0], -2.0f / (float)n_rot); /* the host's powf, as the CPU */
        const int threads = threads_for(n_rot / 2);
        const int64_t rows = s0->ne[1] * s0->ne[2];
        const int norm = op->i[1] == 1; /* NORM pairing (arch llama), see op_rope_norm */
        k_rope<<<(unsigned)rows, threads, 0, st>>>(cuda_view(d), cuda_view(s0), (const char *)s1->data,
                                                   (int64_t)s1->nb[0], theta_scale, n_rot, norm);
        CUDA_LAUNCH_CHECK("k_rope");
        break;
    }
    case BACKEND_OP_SET_ROWS: {
        k_set_rows<<<(unsigned)s0->ne[1], threads_for(s0->ne[0]), 0, st>>>(
            cuda_view(d), cuda_view(s0), (const char *)s1->data, (int64_t)s1->nb[0], s1->type == QUANT_TYPE_I64,
            be->err_dev);
        CUDA_LAUNCH_CHECK("k_set_rows");
        break;
    }
    case BACKEND_OP_GET_ROWS: {
        k_get_rows<<<(unsigned)d->ne[1], threads_for(s0->ne[0] / 8 + 1), 0, st>>>(
            cuda_view(d), cuda_view(s0), (const int32_t *)s1->data, (int64_t)s1->nb[0], be->err_dev);
        CUDA_LAUNCH_CHECK("k_get_rows");
        break;
    }
    case BACKEND_OP_ADD:
    case BACKEND_OP_MUL:
        k_binary<<<(unsigned)tensor_nrows(s0), threads_for(s0->ne[0]), 0, st>>>(
            cuda_view(d), cuda_view(s0), cuda_view(s1), op->kind == BACKEND_OP_MUL);
        CUDA_LAUNCH_CHECK("k_binary");
        break;
    case BACKEND_OP_SWIGLU:
        k_swiglu<<<(unsigned)tensor_nrows(s0), threads_for(s0->ne[0]), 0, st>>>(cuda_view(d), cuda_view(s0),
                                                                                cuda_view(s1));
        CUDA_LAUNCH_CHECK("k_swiglu");
        break;
    case BACKEND_OP_SCALE:
        k_scale<<<(unsigned)tensor_nrows(s0), threads_for(s0->ne[0]), 0, st>>>(cuda_view(d), cuda_view(s0), op->f[0]);
        CUDA_LAUNCH_CHECK("k_scale");
        break;
    case BACKEND_OP_COPY:
        k_copy<<<(unsigned)tensor_nrows(s0), threads_for(s0->ne[0]), 0, st>>>(cuda_view(d), cuda_view(s0));
        CUDA_LAUNCH_CHECK("k_copy");
        break;
    case BACKEND_OP_SOFTMAX:
        k_softmax<<<(unsigned)tensor_nrows(s0), threads_for(s0->ne[0]), 0, st>>>(cuda_view(d), cuda_view(s0));
        CUDA_LAUNCH_CHECK("k_softmax");
        break;
    case BACKEND_OP_ARGMAX:
        k_argmax<<<(unsigned)s0->ne[1], 256, 0, st>>>((int32_t *)d->data, cuda_view(s0));
        CUDA_LAUNCH_CHECK("k_argmax");
        break;
    default:
        cuda_fatal(__FILE__, __LINE__, "cuda_op_light", backend_op_name(op->kind));
    }
}
