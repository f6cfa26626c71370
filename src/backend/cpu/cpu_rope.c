/* cpu_rope.c: the CPU backend's rope op (NEOX and NORM pairing) with a table of each position's
 * cos / sin, kept by the backend and grown to the largest position seen.
 *
 * The reference (cpu_op_rope_neox_ref) computes the n_rot / 2 angles of a token's position with
 * cosf / sinf in every op: a verify batch of 16 tokens paid 1024 of them for q and again for k, in
 * every layer of the target and again in the drafter, on one thread while the other waited. Here
 * row p of the table is cpu_rope_cache(p) (the same function, so the same bits), filled once per
 * position for the backend's (freq_base, n_rot): the target and a drafter of the same rope share
 * it. Positions outside [0, CPU_ROPE_TABLE_MAX) or a table that cannot grow fall back to the
 * reference. The rotation is the kernels' rope_row (cpu_rope_row, or its AVX-512 form with the
 * same bits), split over tokens across the pool when the op is big. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops_ref.h"

#include <stdlib.h>
#include <string.h>

#define CPU_ROPE_TABLE_MAX (1 << 20) /* positions the table covers at most (n_rot floats each) */

static int32_t rope_pos(const tensor *pos, int64_t it) {
    int32_t p;
    memcpy(&p, (const char *)pos->data + (size_t)it * pos->nb[0], sizeof(p));
    return p;
}

/* Makes the table hold positions [0, n) for (freq_base, n_rot); false when it cannot grow. */
static bool rope_table_cover(cpu_backend *be, float freq_base, int32_t n_rot, int64_t n) {
    if (be->rope_base != freq_base || be->rope_rot != n_rot) { /* another rope: start over */
        be->rope_n = 0;
        be->rope_base = freq_base;
        be->rope_rot = n_rot;
    }
    if (n <= be->rope_n) return true;
    if (n * (int64_t)n_rot > be->rope_cap) {
        int64_t cap = be->rope_cap > 0 ? be->rope_cap : (int64_t)n_rot * 1024;
        while (cap < n * (int64_t)n_rot) cap *= 2;
        float *t = realloc(be->rope_cs, (size_t)cap * sizeof(float));
        if (t == NULL) return false;
        be->rope_cs = t;
        be->rope_cap = cap;
    }
    for (int64_t p = be->rope_n; p < n; p++) cpu_rope_cache(be->rope_cs + p * n_rot, (float)p, freq_base, n_rot);
    be->rope_n = n;
    return true;
}

typedef struct rope_job {
    const backend_op *op;
    cpu_rope_row_fn row; /* the kernels' rotation (cpu_rope_row's bits) */
    const float *cs; /* the table: row p at cs + p * n_rot */
} rope_job;

static void rope_fn(void *ctx, int ith, int nth) {
    const rope_job *job = ctx;
    const backend_op *op = job->op;
    const tensor *x = &op->src[0], *pos = &op->src[1], *d = &op->dst;
    const int64_t hd = x->ne[0], nh = x->ne[1], nt = x->ne[2];
    const int32_t n_rot = op->i[0] == 0 ? (int32_t)hd : op->i[0];
    const bool norm = op->i[1] == 1; /* NORM mode (llama): adjacent pairs (2i, 2i+1) */
    const int64_t t0 = nt * ith / nth, t1 = nt * (ith + 1) / nth;
    for (int64_t it = t0; it < t1; it++) {
        const float *cs = job->cs + (int64_t)rope_pos(pos, it) * n_rot;
        for (int64_t ih = 0; ih < nh; ih++) {
            const float *xr = (const float *)((const char *)x->data + (size_t)ih * x->nb[1] + (size_t)it * x->nb[2]);
            float *dr = (float *)((char *)d->data + (size_t)ih * d->nb[1] + (size_t)it * d->nb[2]);
            job->row(dr, xr, cs, hd, n_rot, norm);
        }
    }
}

bool cpu_op_rope(cpu_backend *be, const backend_op *op) {
    const tensor *x = &op->src[0], *pos = &op->src[1];
    /* x [hd, n_head, n_tok] with f32 elements contiguous in dim 0 (the validated layout) */
    if (x->ne[3] != 1 || op->dst.ne[3] != 1 || x->nb[0] != sizeof(float) || op->dst.nb[0] != sizeof(float)) return false;
    const int64_t nt = x->ne[2];
    const int32_t n_rot = op->i[0] == 0 ? (int32_t)x->ne[0] : op->i[0];
    int64_t max_p = -1;
    for (int64_t it = 0; it < nt; it++) {
        const int32_t p = rope_pos(pos, it);
        if (p < 0 || p >= CPU_ROPE_TABLE_MAX) return false;
        if (p > max_p) max_p = p;
    }
    if (!rope_table_cover(be, op->f[0], n_rot, max_p + 1)) return false;
    rope_job job = {op, be->kernels.rope_row, be->rope_cs};
    int nth = cpu_pool_size(be->pool) < be->n_threads_batch ? cpu_pool_size(be->pool) : be->n_threads_batch;
    if (tensor_nelements(&op->dst) < CPU_LIGHT_MIN_ELEMS || nth < 1) nth = 1;
    if (nth > nt) nth = nt > 0 ? (int)nt : 1;
    cpu_pool_run(be->pool, nth, rope_fn, &job);
    return true;
}
