/* cuda_attention.cu: attention over the KV cache on the GPU, one kernel pair for every query
 * count (1 row in decode, 2-64 in verification, a prompt's rows in prefill), causal or not (the
 * caller's additive mask decides), GQA (head h reads kv head h / (n_head / n_head_kv)).
 *
 *   k_attn_partial: grid (n_split, n_head, n_q). The cells are cut into splits of ATT_CHUNK;
 *     each block scores its split for one (head, query) (a warp per cell, masked cells skipped),
 *     then writes the split's max m, sum l = sum exp(s - m) and acc = sum exp(s - m) v.
 *   k_attn_combine: grid (n_head, n_q): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)
 *     with M = max_s m_s, splits in order; a row whose cells are all masked gets zeros. With a
 *     single split (n_kv <= ATT_CHUNK) k_attn_partial writes acc * (1/l) itself: the same bits
 *     (the weight is e^0 = 1, fmaf(x, 1, 0) = x) without the second launch.
 * The split size is fixed, so a query row's result does not depend on how many rows the op has
 * (decode and verification give the same values). With an F16 cache q is rounded to f16 before
 * the dot products, as the CPU reference does. Partials live in the queue's scratch:
 * [n_q, n_head, n_split, 2 + hd_v] floats. */
#include "backend/cuda/cuda_common.cuh"

#include <math.h>

#define ATT_CHUNK 256
#define ATT_THREADS 128

__device__ __forceinline__ float att_load(const char *row, int f16, int64_t i) {
    return f16 ? cu_f16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

__global__ void __launch_bounds__(ATT_THREADS) k_attn_partial(cuda_tensor q, cuda_tensor k, cuda_tensor v,
                                                              cuda_tensor mask, float *part, cuda_tensor dst,
                                                              float scale, int group, int n_split) {
    extern __shared__ float att_sm[];
    const int split = blockIdx.x, h = blockIdx.y, iq = blockIdx.z;
    const int64_t hd = q.ne[0], hd_v = v.ne[0], n_kv = k.ne[2], n_head = q.ne[1];
    const int hk = h / group;
    const int k16 = k.type == QUANT_TYPE_F16, v16 = v.type == QUANT_TYPE_F16;
    float *qs = att_sm;          /* [hd] */
    float *sc = att_sm + hd;     /* [ATT_CHUNK] scores, then probabilities */
    float *red = sc + ATT_CHUNK; /* [32] */
    const float *qr = (const float *)(q.data + h * q.nb[1] + iq * q.nb[2]);
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
        qs[i] = k16 ? __half2float(__float2half_rn(qr[i])) : qr[i];
    }
    const int64_t j0 = (int64_t)split * ATT_CHUNK;
    const int64_t j1 = j0 + ATT_CHUNK < n_kv ? j0 + ATT_CHUNK : n_kv;
    const int n = (int)(j1 - j0);
    const float *mrow = (const float *)(mask.data + iq * mask.nb[1]);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int t = warp; t < n; t += n_warps) {
        const int64_t j = j0 + t;
        const float mv = mrow[j];
        float s = -INFINITY;
        if (mv != -INFINITY) {
            const char *kr = k.data + hk * k.nb[1] + j * k.nb[2];
            float dot = 0.0f;
            for (int64_t i = lane; i < hd; i += 32) dot = fmaf(qs[i], att_load(kr, k16, i), dot);
            dot = cu_warp_sum(dot);
            s = dot * scale + mv;
        }
        if (lane == 0) sc[t] = s;
    }
    __syncthreads();
    float m = -INFINITY, bad = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        m = fmaxf(m, sc[t]);
        if (!(sc[t] < INFINITY)) bad = 1.0f; /* NaN or +Inf */
    }
    m = cu_block_max(m, red);
    bad = cu_block_max(bad, red);
    /* one split: the final values directly (the bits k_attn_combine would give: e^0 = 1) */
    const bool direct = n_split == 1;
    float *out = direct ? NULL : part + (((int64_t)iq * n_head + h) * n_split + split) * (2 + hd_v);
    float *dr = direct ? (float *)(dst.data + h * dst.nb[1] + iq * dst.nb[2]) : NULL;
    if (bad > 0.0f) { /* a NaN or +Inf score: the output is NaN (as the CPU reference; never hidden) */
        for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
            if (direct) dr[d] = NAN;
            else out[2 + d] = NAN;
        }
        if (threadIdx.x == 0 && !direct) {
            out[0] = NAN;
            out[1] = NAN;
        }
        return;
    }
    if (m == -INFINITY) {
        for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
            if (direct) dr[d] = 0.0f;
            else out[2 + d] = 0.0f;
        }
        if (threadIdx.x == 0 && !direct) {
            out[0] = -INFINITY;
            out[1] = 0.0f;
        }
        return;
    }
    float l = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const float p = sc[t] == -INFINITY ? 0.0f : expf(sc[t] - m);
        sc[t] = p;
        l += p;
    }
    l = cu_block_sum(l, red); /* its barrier also publishes the probabilities */
    const char *vbase = v.data + hk * v.nb[1] + j0 * v.nb[2];
    const float inv = 1.0f / l;
    for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) {
            const float p = sc[t];
            if (p != 0.0f) acc = fmaf(p, att_load(vbase + t * v.nb[2], v16, d), acc);
        }
        if (direct) dr[d] = acc * inv;
        else out[2 + d] = acc;
    }
    if (threadIdx.x == 0 && !direct) {
        out[0] = m;
        out[1] = l;
    }
}

__global__ void __launch_bounds__(ATT_THREADS) k_attn_combine(cuda_tensor dst, const float *part, int n_split) {
    extern __shared__ float wsm[]; /* [n_split] split weights */
    __shared__ float sh_l;
    const int h = blockIdx.x, iq = blockIdx.y;
    const int64_t hd_v = dst.ne[0], n_head = dst.ne[1];
    const float *base = part + ((int64_t)iq * n_head + h) * n_split * (2 + hd_v);
    float *dr = (float *)(dst.data + h * dst.nb[1] + iq * dst.nb[2]);
    float M = -INFINITY;
    bool bad = false;
    for (int s = 0; s < n_split; s++) {
        M = fmaxf(M, base[s * (2 + hd_v)]);
        bad |= isnan(base[s * (2 + hd_v)]); /* a split saw a NaN or +Inf score */
    }
    if (bad) {
        for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) dr[d] = NAN;
        return;
    }
    if (M == -INFINITY) {
        for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) dr[d] = 0.0f;
        return;
    }
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) {
        const float ms = base[s * (2 + hd_v)];
        wsm[s] = ms == -INFINITY ? 0.0f : expf(ms - M);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int s = 0; s < n_split; s++) L = fmaf(base[s * (2 + hd_v) + 1], wsm[s], L);
        sh_l = L;
    }
    __syncthreads();
    const float inv = 1.0f / sh_l;
    for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            if (wsm[s] != 0.0f) acc = fmaf(base[s * (2 + hd_v) + 2 + d], wsm[s], acc);
        }
        dr[d] = acc * inv;
    }
}

void cuda_op_attention(cuda_backend *be, cuda_queue *q, const backend_op *op) {
    (void)be;
    const tensor *qt = &op->src[0], *kt = &op->src[1], *vt = &op->src[2], *mt = &op->src[3], *dt = &op->dst;
    const int64_t hd = qt->ne[0], n_head = qt->ne[1], n_q = qt->ne[2];
    const int64_t n_head_kv = kt->ne[1], n_kv = kt->ne[2], hd_v = vt->ne[0];
    if (n_head > 65535 || n_q > 65535) {
        cuda_fatal(__FILE__, __LINE__, "cuda_op_attention", "more than 65535 heads or query rows in one op");
    }
    const float scale = op->f[0] != 0.0f ? op->f[0] : 1.0f / sqrtf((float)hd);
    const int n_split = (int)((n_kv + ATT_CHUNK - 1) / ATT_CHUNK);
    const size_t part_bytes = (size_t)n_q * (size_t)n_head * (size_t)n_split * (size_t)(2 + hd_v) * sizeof(float);
    float *part = n_split > 1 ? (float *)cuda_queue_scratch(q, part_bytes) : NULL;
    const size_t sm1 = (size_t)(hd + ATT_CHUNK + 32) * sizeof(float);
    if (sm1 > 48 * 1024) cuda_fatal(__FILE__, __LINE__, "cuda_op_attention", "head_dim above 12000");
    dim3 g1((unsigned)n_split, (unsigned)n_head, (unsigned)n_q);
    k_attn_partial<<<g1, ATT_THREADS, sm1, q->stream>>>(cuda_view(qt), cuda_view(kt), cuda_view(vt), cuda_view(mt),
                                                       part, cuda_view(dt), scale, (int)(n_head / n_head_kv), n_split);
    CUDA_LAUNCH_CHECK("k_attn_partial");
    if (n_split == 1) return;
    dim3 g2((unsigned)n_head, (unsigned)n_q);
    const size_t sm2 = (size_t)n_split * sizeof(float);
    if (sm2 > 48 * 1024) cuda_fatal(__FILE__, __LINE__, "cuda_op_attention", "more than 12288 splits (n_kv too large)");
    k_attn_combine<<<g2, ATT_THREADS, sm2, q->stream>>>(cuda_view(dt), part, n_split);
    CUDA_LAUNCH_CHECK("k_attn_combine");
}
