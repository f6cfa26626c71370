/* cpu_matmul.c: the matmul driver of the CPU backend. Two phases on the thread pool:
 * 1. the activation rows are prepared once (quantized to the weight's dot type) into the scratch;
 * 2. the work is cut into tiles (a block of activation rows) x (a chunk of output rows), handed out
 *    by an atomic counter, row block by row block; a tile is computed by the selected kernel (which
 *    keeps a row tile's accumulators in registers). A row block's prepared activations fit in about
 *    half of a core's L2 (MATMUL_ROW_BLOCK_BYTES; 512 KiB measured best on Zen 4 among 128 KiB - 1 MiB), so that they stay cached while the output
 *    chunks stream past; each weight chunk is read once per row block (once per matmul for up to
 *    a few dozen rows, e.g. decode and verify).
 * Every output element is computed by the same code whichever thread takes its tile, and the
 * kernels give the same bits for any row range (tested), so the result does not depend on the
 * thread count or the row blocking. */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#include <stdatomic.h>

/* Prepared activation bytes of one row block (see the header comment). */
#define MATMUL_ROW_BLOCK_BYTES (512 * 1024)

typedef struct matmul_job {
    const backend_op *op;
    cpu_act act;
    cpu_matmul_fn kernel;
    cpu_act_row_fn prep;
    int64_t chunk;          /* output rows per chunk (a multiple of 4) */
    int64_t n_chunks;       /* output chunks per row block */
    int64_t row_block;      /* activation rows per row block */
    int64_t n_tiles;        /* row blocks x output chunks */
    atomic_llong next;      /* next tile (row block major) */
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
    const int64_t n_rows = job->act.n_rows;
    for (;;) {
        const int64_t tile = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (tile >= job->n_tiles) break;
        const int64_t r0 = (tile / job->n_chunks) * job->row_block;
        const int64_t nr = n_rows - r0 < job->row_block ? n_rows - r0 : job->row_block;
        const int64_t o0 = (tile % job->n_chunks) * job->chunk;
        const int64_t o1 = o0 + job->chunk < n_out ? o0 + job->chunk : n_out;
        job->kernel(w->data, w->nb[1], &job->act, r0, nr, (float *)d->data, dst_stride, o0, o1);
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

    /* phase 2: about 8 chunks per thread for balance, multiples of 4 (kernels work on 2 or 4
     * weight rows at a time) */
    int64_t chunk = (n_out + 8 * nth - 1) / (8 * nth);
    if (chunk < 16) chunk = 16;
    chunk = (chunk + 3) & ~(int64_t)3;
    job.chunk = chunk;
    job.n_chunks = (n_out + chunk - 1) / chunk;
    /* row blocks: whole multiples of 16 rows (the kernels' row tiles), at least 16 */
    const int64_t row_bytes = (int64_t)cpu_act_bytes(dot, n_in, 1);
    int64_t rb = MATMUL_ROW_BLOCK_BYTES / (row_bytes > 0 ? row_bytes : 1) / 16 * 16;
    if (rb < 16) rb = 16;
    job.row_block = rb < n_rows ? rb : n_rows;
    job.n_tiles = (n_rows + job.row_block - 1) / job.row_block * job.n_chunks;
    atomic_init(&job.next, 0);
    cpu_pool_run(be->pool, nth, matmul_compute_fn, &job);
}
