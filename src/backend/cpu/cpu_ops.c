/* cpu_ops.c: the CPU backend's op executor. matmul and attention have their own threaded, SIMD
 * implementations (cpu_matmul.c and below); the light ops (norms, rope, elementwise, rows) run the
 * reference code on slices of the op split along an outer dimension across the pool when they are
 * big enough to be worth it. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops_ref.h"
#include "base/error.h"
#include "base/fp16.h"

#include <math.h>
#include <string.h>

/* ---- slicing light ops ------------------------------------------------------------------- */

static tensor slice(const tensor *t, int dim, int64_t i0, int64_t n) {
    tensor r = *t;
    r.data = (char *)t->data + (size_t)i0 * t->nb[dim];
    r.ne[dim] = n;
    return r;
}

/* The dimension an op is split along and its extent; n = 1 means "do not split". */
static int split_dim(const backend_op *op, int64_t *n) {
    const tensor *d = &op->dst;
    switch (op->kind) {
    case BACKEND_OP_RMSNORM:
    case BACKEND_OP_SWIGLU:
    case BACKEND_OP_SCALE:
    case BACKEND_OP_SOFTMAX:
    case BACKEND_OP_ADD:
    case BACKEND_OP_MUL:
    case BACKEND_OP_COPY:
        for (int dim = 3; dim >= 1; dim--) {
            if (d->ne[dim] > 1) {
                *n = d->ne[dim];
                return dim;
            }
        }
        break;
    case BACKEND_OP_ROPE_NEOX:
        *n = d->ne[2] > 1 ? d->ne[2] : d->ne[1];
        return d->ne[2] > 1 ? 2 : 1;
    case BACKEND_OP_SET_ROWS: *n = op->src[0].ne[1]; return 1;
    case BACKEND_OP_GET_ROWS: *n = d->ne[1]; return 1;
    case BACKEND_OP_ARGMAX: *n = op->src[0].ne[1]; return 1;
    default: break;
    }
    *n = 1;
    return 1;
}

/* The part [i0, i0 + n) of op along dim. */
static backend_op slice_op(const backend_op *op, int dim, int64_t i0, int64_t n) {
    backend_op s = *op;
    switch (op->kind) {
    case BACKEND_OP_RMSNORM:
    case BACKEND_OP_SWIGLU:
    case BACKEND_OP_SCALE:
    case BACKEND_OP_SOFTMAX:
    case BACKEND_OP_COPY:
        s.dst = slice(&op->dst, dim, i0, n);
        s.src[0] = slice(&op->src[0], dim, i0, n);
        if (op->kind == BACKEND_OP_SWIGLU) s.src[1] = slice(&op->src[1], dim, i0, n);
        break;
    case BACKEND_OP_ADD:
    case BACKEND_OP_MUL:
        s.dst = slice(&op->dst, dim, i0, n);
        s.src[0] = slice(&op->src[0], dim, i0, n);
        if (op->src[1].ne[dim] != 1) s.src[1] = slice(&op->src[1], dim, i0, n);
        break;
    case BACKEND_OP_ROPE_NEOX:
        s.dst = slice(&op->dst, dim, i0, n);
        s.src[0] = slice(&op->src[0], dim, i0, n);
        if (dim == 2) s.src[1] = slice(&op->src[1], 0, i0, n);
        break;
    case BACKEND_OP_SET_ROWS:
        s.src[0] = slice(&op->src[0], 1, i0, n);
        s.src[1] = slice(&op->src[1], 0, i0, n);
        break;
    case BACKEND_OP_GET_ROWS:
        s.dst = slice(&op->dst, 1, i0, n);
        s.src[1] = slice(&op->src[1], 0, i0, n);
        break;
    case BACKEND_OP_ARGMAX:
        s.src[0] = slice(&op->src[0], 1, i0, n);
        s.dst = slice(&op->dst, 0, i0, n);
        break;
    default:
        DFL_ASSERT(0 && "slice_op: kind");
    }
    return s;
}

/* ---- light ops on contiguous rows: the row kernels (SIMD where the CPU has them) ----------- */

static bool rows_f32(const tensor *t) { return t->type == QUANT_TYPE_F32 && t->nb[0] == sizeof(float); }


/* d = a op b with b broadcast by index modulo its extents, a row of b as long as a's. */
static void light_binary(const backend_op *op, cpu_binary_row_fn fn) {
    const tensor *a = &op->src[0], *b = &op->src[1], *d = &op->dst;
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                const char *ar = (const char *)a->data + (size_t)i1 * a->nb[1] + (size_t)i2 * a->nb[2] + (size_t)i3 * a->nb[3];
                const char *br = (const char *)b->data + (size_t)(i1 % b->ne[1]) * b->nb[1] +
                                 (size_t)(i2 % b->ne[2]) * b->nb[2] + (size_t)(i3 % b->ne[3]) * b->nb[3];
                char *dr = (char *)d->data + (size_t)i1 * d->nb[1] + (size_t)i2 * d->nb[2] + (size_t)i3 * d->nb[3];
                fn((float *)dr, (const float *)ar, (const float *)br, a->ne[0]);
            }
}

/* d = a op b where b has one value per row of a (b->ne[0] == 1, the other dims broadcast by
 * index modulo its extents, any strides): the same f32 operation per element as the reference,
 * in a loop the compiler vectorizes (e.g. DFlash2's group coefficients, drafter_dflash2.c). */
static void light_binary_scalar(const backend_op *op, bool mul) {
    const tensor *a = &op->src[0], *b = &op->src[1], *d = &op->dst;
    const int64_t n = a->ne[0];
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                const float *ar = (const float *)((const char *)a->data + (size_t)i1 * a->nb[1] + (size_t)i2 * a->nb[2] +
                                                  (size_t)i3 * a->nb[3]);
                const float bv = *(const float *)((const char *)b->data + (size_t)(i1 % b->ne[1]) * b->nb[1] +
                                                  (size_t)(i2 % b->ne[2]) * b->nb[2] + (size_t)(i3 % b->ne[3]) * b->nb[3]);
                float *dr = (float *)((char *)d->data + (size_t)i1 * d->nb[1] + (size_t)i2 * d->nb[2] + (size_t)i3 * d->nb[3]);
                if (mul) {
                    for (int64_t i = 0; i < n; i++) dr[i] = ar[i] * bv;
                } else {
                    for (int64_t i = 0; i < n; i++) dr[i] = ar[i] + bv;
                }
            }
}

/* Runs a light op (or a slice of one) with the row kernels when its rows are contiguous f32, and
 * with the reference code otherwise. */
static void light_run(const cpu_kernels *k, const backend_op *op) {
    const tensor *x = &op->src[0], *d = &op->dst;
    switch (op->kind) {
    case BACKEND_OP_RMSNORM:
        if (!rows_f32(x) || !rows_f32(d) || (op->src[1].data != NULL && !rows_f32(&op->src[1]))) break;
        for (int64_t ir = 0; ir < tensor_nrows(x); ir++) {
            k->rmsnorm_row((float *)cpu_row_ptr(d, ir), (const float *)cpu_row_ptr(x, ir),
                           (const float *)op->src[1].data, x->ne[0], op->f[0]);
        }
        return;
    case BACKEND_OP_SWIGLU:
        if (!rows_f32(x) || !rows_f32(&op->src[1]) || !rows_f32(d)) break;
        for (int64_t ir = 0; ir < tensor_nrows(x); ir++) {
            k->swiglu_row((float *)cpu_row_ptr(d, ir), (const float *)cpu_row_ptr(x, ir),
                          (const float *)cpu_row_ptr(&op->src[1], ir), x->ne[0]);
        }
        return;
    case BACKEND_OP_ADD:
    case BACKEND_OP_MUL:
        if (rows_f32(x) && rows_f32(&op->src[1]) && rows_f32(d) && op->src[1].ne[0] == 1 && x->ne[0] > 1) {
            light_binary_scalar(op, op->kind == BACKEND_OP_MUL);
            return;
        }
        if (!rows_f32(x) || !rows_f32(&op->src[1]) || !rows_f32(d) || op->src[1].ne[0] != x->ne[0]) break;
        light_binary(op, op->kind == BACKEND_OP_ADD ? k->add_row : k->mul_row);
        return;
    case BACKEND_OP_ARGMAX:
        if (!rows_f32(x)) break;
        for (int64_t r = 0; r < x->ne[1]; r++) {
            *(int32_t *)((char *)d->data + (size_t)r * d->nb[0]) =
                k->argmax_row((const float *)((const char *)x->data + (size_t)r * x->nb[1]), x->ne[0]);
        }
        return;
    case BACKEND_OP_SET_ROWS:
        if (!rows_f32(x) || !(rows_f32(d) || (d->type == QUANT_TYPE_F16 && d->nb[0] == sizeof(uint16_t))) ||
            (op->src[1].type != QUANT_TYPE_I32 && op->src[1].type != QUANT_TYPE_I64)) {
            break;
        }
        for (int64_t r = 0; r < x->ne[1]; r++) {
            const int64_t id = cpu_load_index(&op->src[1], r);
            if (id < 0 || id >= d->ne[1]) {
                cpu_op_ref(op); /* reports the bad index */
                return;
            }
        }
        for (int64_t r = 0; r < x->ne[1]; r++) {
            const int64_t id = cpu_load_index(&op->src[1], r);
            const float *sr = (const float *)((const char *)x->data + (size_t)r * x->nb[1]);
            char *dr = (char *)d->data + (size_t)id * d->nb[1];
            if (d->type == QUANT_TYPE_F16) k->f16_row((uint16_t *)dr, sr, x->ne[0]);
            else memcpy(dr, sr, (size_t)x->ne[0] * sizeof(float));
        }
        return;
    default: break;
    }
    cpu_op_ref(op);
}

typedef struct split_job {
    const backend_op *op;
    const cpu_kernels *k;
    int dim;
    int64_t n;
} split_job;

static void split_fn(void *ctx, int ith, int nth) {
    const split_job *job = ctx;
    const int64_t i0 = job->n * ith / nth, i1 = job->n * (ith + 1) / nth;
    if (i1 <= i0) return;
    backend_op s = slice_op(job->op, job->dim, i0, i1 - i0);
    light_run(job->k, &s);
}

static void exec_light(cpu_backend *be, const backend_op *op) {
    split_job job = {op, &be->kernels, 1, 1};
    job.dim = split_dim(op, &job.n);
    const tensor *big = op->kind == BACKEND_OP_SET_ROWS || op->kind == BACKEND_OP_ARGMAX ? &op->src[0] : &op->dst;
    int nth = cpu_pool_size(be->pool);
    if (nth > be->n_threads_batch) nth = be->n_threads_batch;
    if (tensor_nelements(big) < CPU_LIGHT_MIN_ELEMS || job.n < 2) nth = 1;
    if (nth > job.n) nth = (int)job.n;
    if (nth == 1) {
        light_run(&be->kernels, op);
        return;
    }
    cpu_pool_run(be->pool, nth, split_fn, &job);
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_job {
    const backend_op *op;
    const cpu_kernels *k;
    float *scratch; /* per thread: [n_kv] scores + [hd] q + [hd_v] acc, 16-float aligned */
    size_t per_thread;
} attn_job;

static float dot_f32(const float *x, const float *y, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * y[i];
    return sum;
}

static void attn_fn(void *ctx, int ith, int nth) {
    const attn_job *job = ctx;
    const backend_op *op = job->op;
    const tensor *q = &op->src[0], *k = &op->src[1], *v = &op->src[2], *mask = &op->src[3], *d = &op->dst;
    const int64_t hd = q->ne[0], nh = q->ne[1], nq = q->ne[2];
    const int64_t nh_kv = k->ne[1], n_kv = k->ne[2], hd_v = v->ne[0];
    const int64_t group = nh / nh_kv;
    const float scale = op->f[0] != 0.0f ? op->f[0] : 1.0f / sqrtf((float)hd);
    float *s = job->scratch + job->per_thread * (size_t)ith;
    float *qv = s + ((n_kv + 15) & ~(int64_t)15);
    float *acc = qv + ((hd + 15) & ~(int64_t)15);
    const bool k16 = k->type == QUANT_TYPE_F16, v16 = v->type == QUANT_TYPE_F16;
    const int32_t kind = op->i[0];

    const int64_t n_items = nq * nh;
    const int64_t it0 = n_items * ith / nth, it1 = n_items * (ith + 1) / nth;
    for (int64_t it = it0; it < it1; it++) {
        const int64_t iq = it / nh, h = it % nh, hk = h / group;
        /* a mask tensor's row, or the cells [0, n_vis) a structured kind shows this row */
        const float *mrow = kind == BACKEND_ATTN_MASK ? (const float *)((const char *)mask->data + (size_t)iq * mask->nb[1]) : NULL;
        const int64_t n_vis = kind == BACKEND_ATTN_MASK ? n_kv : backend_attn_n_visible(kind, iq, nq, n_kv);
        const float *qr = (const float *)((const char *)q->data + (size_t)h * q->nb[1] + (size_t)iq * q->nb[2]);
        for (int64_t i = 0; i < hd; i++) qv[i] = k16 ? fp16_to_fp32(fp32_to_fp16(qr[i])) : qr[i];
        const char *kbase = (const char *)k->data + (size_t)hk * k->nb[1];
        for (int64_t j = 0; j < n_kv; j++) {
            const float mv = mrow != NULL ? mrow[j] : j < n_vis ? 0.0f : -INFINITY;
            if (mv == -INFINITY) {
                s[j] = -INFINITY;
                continue;
            }
            const void *kr = kbase + (size_t)j * k->nb[2];
            const float dot = k16 ? job->k->dot_f16(qv, kr, hd) : dot_f32(qv, kr, hd);
            s[j] = dot * scale + mv;
        }
        job->k->softmax_row(s, s, n_kv);
        memset(acc, 0, (size_t)hd_v * sizeof(float));
        const char *vbase = (const char *)v->data + (size_t)hk * v->nb[1];
        for (int64_t j = 0; j < n_kv; j++) {
            if (s[j] == 0.0f) continue;
            const void *vr = vbase + (size_t)j * v->nb[2];
            if (v16) {
                job->k->axpy_f16(acc, fp16_to_fp32(fp32_to_fp16(s[j])), vr, hd_v);
            } else {
                const float *vf = vr;
                for (int64_t i = 0; i < hd_v; i++) acc[i] += s[j] * vf[i];
            }
        }
        float *dr = (float *)((char *)d->data + (size_t)h * d->nb[1] + (size_t)iq * d->nb[2]);
        memcpy(dr, acc, (size_t)hd_v * sizeof(float));
    }
}

/* F16 K and V (the KV cache): an item is a kv head and up to tq query positions, i.e. rows =
 * group * nqi query rows that share every key and value row:
 *   S [rows, n_kv] = Q K^T by the f16 matmul kernel (the queries rounded to f16 as its
 *   activations), then scale + mask, row softmax, the probabilities rounded to f16, and
 *   O [rows, hd_v] = P V by attn_pv_f16 (a sum over the keys in order).
 * A (query row, key) score and a query row's output go through the same operations whatever the
 * tile and n_kv (masked keys, p = 0, are skipped), so a row's result does not depend on its batch.
 * Causal / block structure: keys past the last one any row of the item can see (mask -inf to the
 * end, e.g. the future of a prefill chunk, or past a structured kind's visible prefix, which needs
 * no mask tensor: backend_attn_n_visible) are not computed at all: the item works on the first
 * kv_end keys, kv_end rounded up to a multiple of 16 (the softmax kernels' chunk: a row's sums
 * then meet exactly the same nonzero terms in the same lanes and order as over all n_kv keys, the
 * rest being exact zeros), so the results stay bit-identical. Items are dealt to threads in turn
 * (their costs grow along a causal prefill), head by head: a thread's next item reads the same kv
 * head's K / V rows, which are still in its L2 (the cache rows interleave the kv heads, so items
 * of alternating heads read them from L3 / memory each time). AMX Xeon VM, Q4_K_M 0.6B, 2 threads,
 * pp512 in alternated rounds: 668 / 680 -> 641 / 654 ms in one window, medians of 5 rounds
 * 614 -> 604 in a later one (within its noise). Converting an item's K / V rows to f32 first (no
 * conversion in the inner loops, same bits) was slower: 706 / 692. A decode step (one query
 * position, or a verify of group * nq <= attn_rows rows) takes attn16_heads_fn instead: its items
 * would each be one whole kv head. */
/* Query rows per item: cpu_kernels.attn_rows (cpu_kernels_select; -DATTN_ROWS= forces one). */

typedef struct attn16_job {
    const backend_op *op;
    const cpu_kernels *k;
    int64_t tq, rows, ldk; /* query positions per item, query rows per item, score row stride */
    float *scratch;        /* per thread: q [rows, hd], scores [rows, ldk], out [rows, hd_v] */
    size_t per_thread;
} attn16_job;

/* keys [0, kv_end) hold every key query positions iq0 .. iq0 + nqi - 1 see (see the comment above) */
static int64_t attn16_kv_end(const backend_op *op, int64_t iq0, int64_t nqi) {
    const tensor *mask = &op->src[3];
    const int64_t nq = op->src[0].ne[2], n_kv = op->src[1].ne[2];
    const int32_t kind = op->i[0];
    int64_t last = 0;
    for (int64_t iq = iq0; iq < iq0 + nqi; iq++) {
        if (kind != BACKEND_ATTN_MASK) { /* structured: a row sees a prefix of the cells */
            const int64_t n_vis = backend_attn_n_visible(kind, iq, nq, n_kv);
            if (n_vis > last) last = n_vis;
            continue;
        }
        const float *mrow = (const float *)((const char *)mask->data + (size_t)iq * mask->nb[1]);
        int64_t j = n_kv;
        while (j > last && mrow[j - 1] == -INFINITY) j--;
        last = j;
    }
    int64_t kv_end = (last + 15) & ~(int64_t)15;
    if (kv_end < 16) kv_end = 16;
    if (kv_end > n_kv) kv_end = n_kv;
    return kv_end;
}

/* Score row sr [kv_end] of query position iq -> its probabilities rounded to f16, in place. */
static void attn16_probs(const attn16_job *job, float *sr, int64_t iq, int64_t kv_end) {
    const backend_op *op = job->op;
    const tensor *q = &op->src[0], *mask = &op->src[3];
    const int64_t nq = q->ne[2], n_kv = op->src[1].ne[2];
    const float scale = op->f[0] != 0.0f ? op->f[0] : 1.0f / sqrtf((float)q->ne[0]);
    const int32_t kind = op->i[0];
    if (kind == BACKEND_ATTN_MASK) {
        const float *mrow = (const float *)((const char *)mask->data + (size_t)iq * mask->nb[1]);
        for (int64_t j = 0; j < kv_end; j++) sr[j] = mrow[j] == -INFINITY ? -INFINITY : sr[j] * scale + mrow[j];
    } else {
        /* the mask tensor's arithmetic (+ 0.0f) on the visible cells, -inf on the rest */
        const int64_t n_vis = backend_attn_n_visible(kind, iq, nq, n_kv);
        const int64_t jv = n_vis < kv_end ? n_vis : kv_end;
        if (job->k->attn_probs_row != NULL) { /* the steps below in one kernel */
            job->k->attn_probs_row(sr, kv_end, jv, scale);
            return;
        }
        for (int64_t j = 0; j < jv; j++) sr[j] = sr[j] * scale + 0.0f;
        for (int64_t j = jv; j < kv_end; j++) sr[j] = -INFINITY;
    }
    job->k->softmax_row(sr, sr, kv_end);
    /* the probabilities rounded to f16 in place (the activation rounding of f16 weights) */
    cpu_act pact;
    cpu_act_layout(&pact, CPU_DOT_F32, kv_end, 1, sr);
    job->k->act_row[QUANT_TYPE_F16](&pact, 0, sr);
}

/* Cells per block of attn16_heads_fn. */
#ifndef ATTN_DECODE_CELLS
#define ATTN_DECODE_CELLS 64
#endif

/* Query positions [iq0, iq0 + nqi) of kv heads [h0, h1), with thread scratch qb / sb / ob (see
 * attn16_job). Row r is kv head h0 + r / hrows, query position iq0 + (r % hrows) / group, head
 * (h0 + r / hrows) * group + r % group (hrows = nqi * group rows per kv head):
 *   S = Q K^T by the f16 matmul kernel, block by block of `block` cells, every head per block;
 *   the probabilities row by row (attn16_probs);
 *   O = P V by attn_pv_f16 block by block, each block's sums going on from the previous one's
 *   (acc). One block of all the cells is one matmul and one P V call per head.
 * n_fin: value rows of h0 known finite (one head only; 0 with several); returns attn_pv_f16's
 * count for the last call. */
static int64_t attn16_span(const attn16_job *job, float *qb, int64_t h0, int64_t h1, int64_t iq0, int64_t nqi,
                           int64_t block, int64_t n_fin) {
    const backend_op *op = job->op;
    const tensor *q = &op->src[0], *k = &op->src[1], *v = &op->src[2], *d = &op->dst;
    const int64_t hd = q->ne[0], group = q->ne[1] / k->ne[1], hd_v = v->ne[0], ldk = job->ldk;
    const int64_t hrows = nqi * group, rows = (h1 - h0) * hrows;
    float *sb = qb + job->rows * hd;   /* scores [rows, ldk] */
    float *ob = sb + job->rows * ldk;  /* outputs [rows, hd_v] */
    cpu_act act;
    cpu_act_layout(&act, CPU_DOT_F32, hd, job->rows, qb);
    const int64_t kv_end = attn16_kv_end(op, iq0, nqi);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t iq = iq0 + r % hrows / group, h = (h0 + r / hrows) * group + r % group;
        job->k->act_row[QUANT_TYPE_F16](&act, r, (const float *)((const char *)q->data + (size_t)h * q->nb[1] +
                                                                  (size_t)iq * q->nb[2]));
    }
    for (int64_t c0 = 0; c0 < kv_end; c0 += block) {
        const int64_t c1 = kv_end - c0 > block ? c0 + block : kv_end;
        for (int64_t hk = h0; hk < h1; hk++) {
            const char *kbase = (const char *)k->data + (size_t)hk * k->nb[1];
            job->k->matmul[QUANT_TYPE_F16](kbase, k->nb[2], &act, (hk - h0) * hrows, hrows, sb, ldk, c0, c1);
        }
    }
    for (int64_t r = 0; r < rows; r++) attn16_probs(job, sb + r * ldk, iq0 + r % hrows / group, kv_end);
    int64_t got = 0;
    for (int64_t c0 = 0; c0 < kv_end; c0 += block) {
        const int64_t c1 = kv_end - c0 > block ? c0 + block : kv_end;
        const int64_t nf = n_fin - c0 < 0 ? 0 : n_fin - c0 < c1 - c0 ? n_fin - c0 : c1 - c0;
        for (int64_t hk = h0; hk < h1; hk++) {
            const int64_t r0 = (hk - h0) * hrows;
            const char *vblk = (const char *)v->data + (size_t)hk * v->nb[1] + (size_t)c0 * v->nb[2];
            got = c0 + job->k->attn_pv_f16(ob + r0 * hd_v, hd_v, sb + r0 * ldk + c0, ldk, hrows, vblk, v->nb[2],
                                           c1 - c0, hd_v, nf, c0 > 0);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t iq = iq0 + r % hrows / group, h = (h0 + r / hrows) * group + r % group;
        memcpy((char *)d->data + (size_t)h * d->nb[1] + (size_t)iq * d->nb[2], ob + r * hd_v,
               (size_t)hd_v * sizeof(float));
    }
    return got;
}

/* Items of one kv head and up to tq query positions (see the comment above), one block of cells. */
static void attn16_fn(void *ctx, int ith, int nth) {
    const attn16_job *job = ctx;
    const int64_t nq = job->op->src[0].ne[2], nh_kv = job->op->src[1].ne[1];
    const int64_t n_kv = job->op->src[1].ne[2];
    float *qb = job->scratch + job->per_thread * (size_t)ith;
    const int64_t n_qt = (nq + job->tq - 1) / job->tq, n_items = nh_kv * n_qt;
    /* leading value rows of kv head fin_hk known finite (attn_pv_f16's n_fin): a thread's next
     * item is mostly the same head's, and the op does not write the cache */
    int64_t fin_hk = -1, fin_n = 0;
    for (int64_t it = ith; it < n_items; it += nth) {
        const int64_t hk = it / n_qt, iq0 = (it % n_qt) * job->tq;
        const int64_t nqi = nq - iq0 < job->tq ? nq - iq0 : job->tq;
        const int64_t got = attn16_span(job, qb, hk, hk + 1, iq0, nqi, n_kv, hk != fin_hk ? 0 : fin_n);
        if (hk != fin_hk || got > fin_n) {
            fin_hk = hk;
            fin_n = got;
        }
    }
}

/* Few query positions (a decode step, or a short verify: group * nq <= attn_rows, one item per kv
 * head in attn16_fn) of the f16 attention: thread ith takes a contiguous share of the kv heads,
 * [h0, h1), and reads their key rows, then their value rows, together, block by block of
 * ATTN_DECODE_CELLS cells (attn16_span). The kv heads of a cell lie side by side in the cache (one
 * row of n_head_kv * head_dim * 2 bytes per cell), so a thread reads a run of (h1 - h0) * 256
 * bytes of each row (the 0.6B shape, 2 threads: 1 KiB of 2 KiB) instead of 256 bytes for one
 * head at a time, spread over the whole cache. The operations per (query row, key) are
 * attn16_fn's: the scores are the matmul's outputs over key ranges (which do not depend on the
 * range), the probabilities the same row kernels, and the P V sums go on from block to block in
 * key order (attn_pv_f16's acc), so a row's output is the batch's, bit for bit. Zen 4 VM, 2
 * threads, bench_ops attn 2 1 16385 (16 / 8 heads, dim 128), 3 alternated rounds: 4.3-6.7 ->
 * 2.5-3.8 ms (cells per block 32 / 64 / 128 / 256: 2.50-3.22 / 2.53-2.93 / 2.66-3.42 /
 * 2.71-3.43); the Q4_K_M 0.6B decode step after 4096 cells 49.4-50.9 -> 36.4-38.6 ms. */
static void attn16_heads_fn(void *ctx, int ith, int nth) {
    const attn16_job *job = ctx;
    const int64_t nq = job->op->src[0].ne[2], nh_kv = job->op->src[1].ne[1];
    const int64_t h0 = nh_kv * ith / nth, h1 = nh_kv * (ith + 1) / nth;
    if (h1 > h0) attn16_span(job, job->scratch + job->per_thread * (size_t)ith, h0, h1, 0, nq, ATTN_DECODE_CELLS, 0);
}

static void exec_attention(cpu_backend *be, const backend_op *op) {
    const tensor *q = &op->src[0], *k = &op->src[1], *v = &op->src[2];
    int nth = q->ne[2] == 1 ? be->n_threads : be->n_threads_batch;
    if (nth > cpu_pool_size(be->pool)) nth = cpu_pool_size(be->pool);
    if ((double)q->ne[1] * (double)q->ne[2] * (double)k->ne[2] * (double)q->ne[0] < 65536.0) nth = 1;
    const bool f16 = k->type == QUANT_TYPE_F16 && v->type == QUANT_TYPE_F16 && k->nb[0] == 2 && v->nb[0] == 2;
    if (f16) {
        attn16_job job;
        job.op = op;
        job.k = &be->kernels;
        const int64_t group = q->ne[1] / k->ne[1];
        const int64_t attn_rows = be->kernels.attn_rows;
        job.tq = group >= attn_rows ? 1 : attn_rows / group;
        if (job.tq > q->ne[2]) job.tq = q->ne[2];
        job.rows = job.tq * group;
        job.ldk = (k->ne[2] + 15) & ~(int64_t)15;
        const int64_t n_items = k->ne[1] * ((q->ne[2] + job.tq - 1) / job.tq);
        if (nth > n_items) nth = (int)n_items;
        /* one item per kv head (a decode step, a short verify): each thread's share of the kv
         * heads at once (attn16_heads_fn) */
        const bool heads = job.tq >= q->ne[2];
        if (heads) job.rows = job.tq * group * ((k->ne[1] + nth - 1) / nth);
        job.per_thread = (size_t)(job.rows * (((q->ne[0] + 15) & ~(int64_t)15) + job.ldk + ((v->ne[0] + 15) & ~(int64_t)15)));
        job.scratch = cpu_scratch(be, job.per_thread * (size_t)nth * sizeof(float));
        cpu_pool_run(be->pool, nth, heads ? attn16_heads_fn : attn16_fn, &job);
        return;
    }
    const int64_t n_items = q->ne[1] * q->ne[2];
    if (nth > n_items) nth = (int)n_items;
    attn_job job;
    job.op = op;
    job.k = &be->kernels;
    job.per_thread = (size_t)((k->ne[2] + 15) & ~(int64_t)15) + (size_t)((q->ne[0] + 15) & ~(int64_t)15) +
                     (size_t)((v->ne[0] + 15) & ~(int64_t)15);
    job.scratch = cpu_scratch(be, job.per_thread * (size_t)nth * sizeof(float));
    cpu_pool_run(be->pool, nth, attn_fn, &job);
}

/* ---- dispatch ---------------------------------------------------------------------------- */

void cpu_exec_op(cpu_backend *be, const backend_op *op) {
    pthread_mutex_lock(&be->exec_mu);
    be->op_seq++;
    switch (op->kind) {
    case BACKEND_OP_MATMUL: cpu_op_matmul(be, op); break;
    case BACKEND_OP_MATMUL_ARGMAX: cpu_op_matmul_argmax(be, op); break;
    case BACKEND_OP_ATTENTION: exec_attention(be, op); break;
    case BACKEND_OP_ROPE_NEOX:
        if (!cpu_op_rope(be, op)) exec_light(be, op);
        break;
    case BACKEND_OP_WRITE: memcpy(op->dst.data, op->host, op->size); break;
    case BACKEND_OP_READ: memcpy(op->host, op->src[0].data, op->size); break;
    default: exec_light(be, op); break;
    }
    pthread_mutex_unlock(&be->exec_mu);
}
