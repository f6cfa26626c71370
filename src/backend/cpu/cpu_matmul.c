/* cpu_matmul.c: the matmul driver of the CPU backend. Two phases on the thread pool:
 * 1. the activation rows are prepared once (quantized to the weight's dot type) into the scratch;
 * 2. output rows are handed out in chunks (an atomic counter) and each chunk is computed by the
 *    selected kernel for ALL activation rows, so each weight block is read from memory once per
 *    matmul whatever the number of rows (the kernels keep a row tile's accumulators in registers).
 * Every output element is computed by the same code whichever thread takes its chunk, so the
 * result does not depend on the thread count. */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#include <stdatomic.h>

typedef struct matmul_job {
    const backend_op *op;
    cpu_act act;
    cpu_matmul_fn kernel;
    cpu_act_row_fn prep;
    int64_t chunk;          /* output rows per chunk (even) */
    atomic_llong next;      /* next chunk start */
} matmul_job;

static void matmul_prep_fn(void *ctx, int ith, int nth) {
    matmul_job *job = ctx;
    const tensor *x = &job->op->src[1];
    for (int64_t r = ith; r < x->ne[1]; r += nth) {
        job->prep(&job->act, r, (const float *)((const char *)x->data + (size_t)r * x->nb[1]));
    }
}

static void matmul_compute_fn(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    matmul_job *job = ctx;
    const tensor *w = &job->op->src[0], *d = &job->op->dst;
    const int64_t n_out = w->ne[1];
    const int64_t dst_stride = (int64_t)(d->nb[1] / sizeof(float));
    for (;;) {
        const int64_t o0 = atomic_fetch_add_explicit(&job->next, job->chunk, memory_order_relaxed);
        if (o0 >= n_out) break;
        const int64_t o1 = o0 + job->chunk < n_out ? o0 + job->chunk : n_out;
        job->kernel(w->data, w->nb[1], &job->act, 0, job->act.n_rows, (float *)d->data, dst_stride, o0, o1);
    }
}

void cpu_op_matmul(cpu_backend *be, const backend_op *op) {
    const tensor *w = &op->src[0], *x = &op->src[1];
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n_rows = x->ne[1];
    const cpu_dot_type dot = cpu_dot_type_of(w->type);

    matmul_job job;
    job.op = op;
    job.kernel = be->kernels.matmul[w->type];
    job.prep = be->kernels.act_row[w->type];
    DFL_ASSERT(job.kernel != NULL && job.prep != NULL);
    cpu_act_layout(&job.act, dot, n_in, n_rows, cpu_scratch(be, cpu_act_bytes(dot, n_in, n_rows)));

    int nth = n_rows == 1 ? be->n_threads : be->n_threads_batch;
    if (nth > cpu_pool_size(be->pool)) nth = cpu_pool_size(be->pool);
    /* tiny matmuls are not worth waking threads for */
    const double work = (double)n_in * (double)n_out * (double)n_rows;
    if (work < 65536.0) nth = 1;

    /* phase 1: activation rows (split over threads only when there is real work) */
    const int nth_prep = (double)n_in * (double)n_rows >= 32768.0 ? (nth < n_rows ? nth : (int)n_rows) : 1;
    cpu_pool_run(be->pool, nth_prep, matmul_prep_fn, &job);

    /* phase 2: about 8 chunks per thread for balance, even sizes (kernels pair rows) */
    int64_t chunk = (n_out + 8 * nth - 1) / (8 * nth);
    if (chunk < 16) chunk = 16;
    chunk = (chunk + 1) & ~(int64_t)1;
    job.chunk = chunk;
    atomic_init(&job.next, 0);
    cpu_pool_run(be->pool, nth, matmul_compute_fn, &job);
}
