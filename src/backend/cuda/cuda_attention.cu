/* cuda_attention.cu: attention over the KV cache on the GPU, one kernel pair for every query
 * count (1 row in decode, 2-64 in verification, a prompt's rows in prefill), causal or not (the
 * caller's additive mask, or a structured kind computed here from the row index: no mask
 * tensor), GQA (head h reads kv head h / (n_head / n_head_kv)).
 *
 * The cells are cut into splits of ATT_CHUNK; a block of k_attn_partial, grid (n_split, n_head,
 * n_q), scores its split for one (head, query) (a warp per cell, masked cells skipped).
 * F32 V (phase ATT_FULL): the block writes the split's max m, sum l = sum exp(s - m) and
 *   acc = sum exp(s - m) v; k_attn_combine, grid (n_head, n_q), gives
 *   out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M) with M = max_s m_s, splits in order.
 * F16 V: the CPU reference rounds the normalized probabilities p = e^(s - M) / L to f16 before
 *   P V (ggml's f16 dot type), which needs the row's global M and L first: phase ATT_STATS writes
 *   each split's (m, l) only, phase ATT_PV recomputes its split's scores, takes M and
 *   L = sum_s l_s e^(m_s - M) (every block of a row the same way, splits in order), and writes
 *   acc = sum f16(e^(s - M) * (1/L)) v; k_attn_combine adds the splits' acc in order.
 * With a single split (n_kv <= ATT_CHUNK) k_attn_partial writes the result itself: acc * (1/l)
 * (F32 V) or acc over the rounded probabilities (F16 V), the same bits the split path gives when
 * the other splits are masked (weight e^0 = 1, fmaf(x, 1, 0) = x, 0 + x = x).
 * A row whose cells are all masked gets zeros; a row with a NaN or +Inf score gets NaN (as the CPU
 * reference: broken weights are never hidden).
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

__device__ __forceinline__ float att_round_f16(float x) { return __half2float(__float2half_rn(x)); }

enum { ATT_FULL = 0, ATT_STATS = 1, ATT_PV = 2 };

__global__ void __launch_bounds__(ATT_THREADS) k_attn_partial(cuda_tensor q, cuda_tensor k, cuda_tensor v,
                                                              cuda_tensor mask, int64_t vis0, int vis_step,
                                                              float *part, cuda_tensor dst, float scale, int group,
                                                              int n_split, int phase) {
    extern __shared__ float att_sm[];
    __shared__ float sh_ml[2]; /* ATT_PV: the row's M and 1/L */
    const int split = blockIdx.x, h = blockIdx.y, iq = blockIdx.z;
    const int64_t hd = q.ne[0], hd_v = v.ne[0], n_kv = k.ne[2], n_head = q.ne[1];
    const int hk = h / group;
    const int k16 = k.type == QUANT_TYPE_F16, v16 = v.type == QUANT_TYPE_F16;
    float *qs = att_sm;          /* [hd] */
    float *sc = att_sm + hd;     /* [ATT_CHUNK] scores, then probabilities */
    float *red = sc + ATT_CHUNK; /* [32] */
    const float *qr = (const float *)(q.data + h * q.nb[1] + iq * q.nb[2]);
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = k16 ? att_round_f16(qr[i]) : qr[i];
    const int64_t j0 = (int64_t)split * ATT_CHUNK;
    const int64_t j1 = j0 + ATT_CHUNK < n_kv ? j0 + ATT_CHUNK : n_kv;
    const int n = (int)(j1 - j0);
    /* a mask tensor's row, or (no mask data: a structured kind) the cells [0, vis0 + vis_step * iq) */
    const float *mrow = mask.data != NULL ? (const float *)(mask.data + iq * mask.nb[1]) : NULL;
    const int64_t n_vis = vis0 + (int64_t)vis_step * iq;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int t = warp; t < n; t += n_warps) {
        const int64_t j = j0 + t;
        const float mv = mrow != NULL ? mrow[j] : j < n_vis ? 0.0f : -INFINITY;
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
    /* one split: the final values directly */
    const bool direct = n_split == 1;
    float *out = direct ? NULL : part + (((int64_t)iq * n_head + h) * n_split + split) * (2 + hd_v);
    float *dr = direct ? (float *)(dst.data + h * dst.nb[1] + iq * dst.nb[2]) : NULL;
    if (bad > 0.0f) { /* a NaN or +Inf score: the output is NaN (as the CPU reference; never hidden) */
        if (phase != ATT_STATS) {
            for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
                if (direct) dr[d] = NAN;
                else out[2 + d] = NAN;
            }
        }
        if (threadIdx.x == 0 && !direct && phase != ATT_PV) { /* k_attn_combine sees the NaN m */
            out[0] = NAN;
            out[1] = NAN;
        }
        return;
    }
    if (m == -INFINITY) { /* every cell of the split masked */
        if (phase != ATT_STATS) {
            for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
                if (direct) dr[d] = 0.0f;
                else out[2 + d] = 0.0f;
            }
        }
        if (threadIdx.x == 0 && !direct && phase != ATT_PV) { /* ATT_PV: the stats are other blocks' input */
            out[0] = -INFINITY;
            out[1] = 0.0f;
        }
        return;
    }
    if (phase == ATT_PV && threadIdx.x == 0) {
        /* the row's M and L from every split's (m, l), in split order (the same in every block) */
        const float *row = part + ((int64_t)iq * n_head + h) * n_split * (2 + hd_v);
        float M = -INFINITY;
        for (int s2 = 0; s2 < n_split; s2++) M = fmaxf(M, row[s2 * (2 + hd_v)]);
        float L = 0.0f;
        for (int s2 = 0; s2 < n_split; s2++) {
            const float ms = row[s2 * (2 + hd_v)];
            if (ms != -INFINITY) L = fmaf(row[s2 * (2 + hd_v) + 1], expf(ms - M), L);
        }
        sh_ml[0] = M;
        sh_ml[1] = 1.0f / L;
    }
    if (phase == ATT_PV) __syncthreads();
    const float M = phase == ATT_PV ? sh_ml[0] : m;
    float l = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const float p = sc[t] == -INFINITY ? 0.0f : expf(sc[t] - M);
        sc[t] = p;
        l += p;
    }
    /* its barrier also publishes the probabilities (ATT_PV needs no l: the barrier after the
     * rounding below publishes them) */
    if (phase != ATT_PV) l = cu_block_sum(l, red);
    if (phase == ATT_STATS) {
        if (threadIdx.x == 0) {
            out[0] = m;
            out[1] = l;
        }
        return;
    }
    if (v16) {
        /* the normalized probabilities rounded to f16 (each thread its own cells: nobody reads sc
         * between the barrier above and the one below) */
        const float inv_l = phase == ATT_PV ? sh_ml[1] : 1.0f / l;
        for (int t = threadIdx.x; t < n; t += blockDim.x) {
            sc[t] = sc[t] == 0.0f ? 0.0f : att_round_f16(__fmul_rn(sc[t], inv_l));
        }
        __syncthreads();
    }
    const char *vbase = v.data + hk * v.nb[1] + j0 * v.nb[2];
    const float inv = 1.0f / l; /* F32 V only: F16 V probabilities are normalized already */
    for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) {
            const float p = sc[t];
            if (p != 0.0f) acc = fmaf(p, att_load(vbase + t * v.nb[2], v16, d), acc);
        }
        if (!direct) out[2 + d] = acc;
        else dr[d] = v16 ? acc : acc * inv;
    }
    if (threadIdx.x == 0 && !direct && phase == ATT_FULL) {
        out[0] = m;
        out[1] = l;
    }
}

/* normalized: the splits hold sum p v over probabilities already divided by L (F16 V); else
 * they hold unnormalized (m, l, acc) to weight by e^(m_s - M). */
__global__ void __launch_bounds__(ATT_THREADS) k_attn_combine(cuda_tensor dst, const float *part, int n_split,
                                                              int normalized) {
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
    if (normalized) {
        for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
            float acc = 0.0f;
            for (int s = 0; s < n_split; s++) {
                if (base[s * (2 + hd_v)] != -INFINITY) acc = __fadd_rn(acc, base[s * (2 + hd_v) + 2 + d]);
            }
            dr[d] = acc;
        }
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
    const bool two_pass = vt->type == QUANT_TYPE_F16 && n_split > 1;
    const int group = (int)(n_head / n_head_kv);
    /* a structured mask kind: row iq sees the cells [0, vis0 + vis_step * iq) (backend_attn_n_visible) */
    const int32_t kind = op->i[0];
    const int64_t vis0 = kind == BACKEND_ATTN_MASK ? n_kv : backend_attn_n_visible(kind, 0, n_q, n_kv);
    const int vis_step = kind == BACKEND_ATTN_CAUSAL ? 1 : 0;
    const tensor no_mask = tensor_1d(QUANT_TYPE_F32, NULL, 1);
    dim3 g1((unsigned)n_split, (unsigned)n_head, (unsigned)n_q);
    /* F16 V over several splits: the splits' (m, l) first, then each split's P V over the
     * normalized, f16-rounded probabilities */
    const int phases[2] = {two_pass ? ATT_STATS : ATT_FULL, ATT_PV};
    for (int ph = 0; ph < (two_pass ? 2 : 1); ph++) {
        k_attn_partial<<<g1, ATT_THREADS, sm1, q->stream>>>(cuda_view(qt), cuda_view(kt), cuda_view(vt),
                                                           cuda_view(kind == BACKEND_ATTN_MASK ? mt : &no_mask), vis0,
                                                           vis_step, part, cuda_view(dt), scale, group, n_split,
                                                           phases[ph]);
        CUDA_LAUNCH_CHECK("k_attn_partial");
    }
    if (n_split == 1) return;
    dim3 g2((unsigned)n_head, (unsigned)n_q);
    const size_t sm2 = (size_t)n_split * sizeof(float);
    if (sm2 > 48 * 1024) cuda_fatal(__FILE__, __LINE__, "cuda_op_attention", "more than 12288 splits (n_kv too large)");
    k_attn_combine<<<g2, ATT_THREADS, sm2, q->stream>>>(cuda_view(dt), part, n_split, two_pass ? 1 : 0);
    CUDA_LAUNCH_CHECK("k_attn_combine");
}
