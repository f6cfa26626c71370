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
 * thread count or the row blocking.
 * Below: matmul + scale + argmax fused (op_matmul_argmax, the drafter's greedy head): the same
 * kernels on chunks of outputs whose logits stay in L2, reduced to each row's argmax. */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#include <stdatomic.h>
#include <string.h>

/* Prepared activation bytes of one row block (see the header comment). */
#define MATMUL_ROW_BLOCK_BYTES (512 * 1024)
/* F32 / F16 / BF16 weights (f32 activations): their kernels keep one row tile's activations in L1
 * and stream the weights from L2 (cpu_gemm_float_avx512.c), so a row block need not fit L2; a
 * larger one reads the weights from L3 / memory fewer times (n_in 3072: 160 rows instead of 32,
 * measured +20-25% on the AVX-512 kernel at 128-512 rows). */
#define MATMUL_ROW_BLOCK_BYTES_F32 (2 * 1024 * 1024)

/* ---- tile shares ---------------------------------------------------------------------------
 * The output chunks are split into nth contiguous ranges, one per thread, which a thread runs in
 * order, so each thread streams one part of the weight front to back; a thread done with its own
 * takes the last tiles of the others' (cpu_share). Measured on the AMX Xeon VM, 2 threads, [1024 x
 * 1024] Q4_K at 16 rows from memory: 8 chunks a thread handed out in turn 0.052 ms, these shares
 * 0.041 (from cache both 0.024); a 16-row verify of the 0.6B Q4_K_M model 34.8-36.0 -> 32.9-33.7
 * ms, its 1-row decode 20.1-20.9 -> 19.5-20.1 (alternated). One range a thread with no taking was
 * as fast at 16 rows but made the decode bimodal: one late thread (a decode's ops take 20-80 us)
 * held whole ops up. */

/* Takes position j of share s from the front (the owner) or the back: false when none is left. */
static bool share_take(cpu_share *s, bool back, int64_t *j) {
    uint_fast64_t v = atomic_load_explicit(&s->fb, memory_order_relaxed);
    for (;;) {
        const uint_fast64_t f = v & 0xffffffffu, b = v >> 32;
        if (f >= b) return false;
        const uint_fast64_t nv = back ? f | ((b - 1) << 32) : (f + 1) | (b << 32);
        if (atomic_compare_exchange_weak_explicit(&s->fb, &v, nv, memory_order_relaxed, memory_order_relaxed)) {
            *j = (int64_t)(back ? b - 1 : f);
            return true;
        }
    }
}

/* Thread i's chunks of n_chunks: [c0, c0 + n). */
static void share_chunks(int64_t n_chunks, int i, int nth, int64_t *c0, int64_t *n) {
    *c0 = n_chunks * i / nth;
    *n = n_chunks * (i + 1) / nth - *c0;
}

/* Sets the nth shares of n_chunks chunks x n_blocks row blocks (each thread: its chunks of every
 * row block, row block major). */
static void share_init(cpu_share *sh, int nth, int64_t n_chunks, int64_t n_blocks) {
    DFL_ASSERT(n_chunks * n_blocks < ((int64_t)1 << 32));
    for (int i = 0; i < nth; i++) {
        int64_t c0, n;
        share_chunks(n_chunks, i, nth, &c0, &n);
        atomic_store_explicit(&sh[i].fb, (uint_fast64_t)(n * n_blocks) << 32, memory_order_relaxed);
    }
}

/* The next tile for thread ith: its own from the front, then the others' from the back, as
 * (row block, chunk); false when every tile is taken. */
static bool share_next(cpu_share *sh, int ith, int nth, int64_t n_chunks, int64_t *rb, int64_t *c) {
    for (int k = 0; k < nth; k++) {
        const int i = (ith + k) % nth;
        int64_t j;
        if (!share_take(&sh[i], k > 0, &j)) continue;
        int64_t c0, n;
        share_chunks(n_chunks, i, nth, &c0, &n);
        *rb = j / n;
        *c = c0 + j % n;
        return true;
    }
    return false;
}

typedef struct matmul_job {
    const backend_op *op;
    cpu_act act;
    cpu_matmul_fn kernel;
    cpu_act_row_fn prep;
    int64_t chunk;          /* output rows per chunk (a multiple of 4) */
    int64_t n_chunks;       /* output chunks per row block */
    int64_t row_block;      /* activation rows per row block */
    cpu_share *shares;      /* [nth] (share_init) */
} matmul_job;

static void matmul_prep_fn(void *ctx, int ith, int nth) {
    matmul_job *job = ctx;
    const tensor *x = &job->op->src[1];
    for (int64_t r = ith; r < x->ne[1]; r += nth) {
        job->prep(&job->act, r, (const float *)((const char *)x->data + (size_t)r * x->nb[1]));
    }
}

static void matmul_compute_fn(void *ctx, int ith, int nth) {
    matmul_job *job = ctx;
    const tensor *w = &job->op->src[0], *d = &job->op->dst;
    const int64_t n_out = w->ne[1];
    const int64_t dst_stride = (int64_t)(d->nb[1] / sizeof(float));
    const int64_t n_rows = job->act.n_rows;
    int64_t rb, c;
    while (share_next(job->shares, ith, nth, job->n_chunks, &rb, &c)) {
        const int64_t r0 = rb * job->row_block;
        const int64_t nr = n_rows - r0 < job->row_block ? n_rows - r0 : job->row_block;
        const int64_t o0 = c * job->chunk;
        const int64_t o1 = o0 + job->chunk < n_out ? o0 + job->chunk : n_out;
        job->kernel(w->data, w->nb[1], &job->act, r0, nr, (float *)d->data, dst_stride, o0, o1);
    }
}

/* The bytes a [ne0, ne1] f32 view spans: [lo, hi). */
static void view_span(const tensor *t, const char **lo, const char **hi) {
    *lo = (const char *)t->data;
    *hi = *lo + (size_t)(t->ne[1] - 1) * t->nb[1] + (size_t)t->ne[0] * sizeof(float);
}

/* True when the scratch holds x's activations as prep makes them: the op just before this one was
 * a matmul of the same x view with the same preparation (not only the same dot type: F16 and BF16
 * both take f32 rows, rounded differently) whose output did not overlap x (so nothing has written
 * x since: backend memory is written by ops only). */
static bool matmul_act_reuse(const cpu_backend *be, const tensor *x, cpu_act_row_fn prep) {
    if (be->act_seq == 0 || be->act_seq + 1 != be->op_seq) return false;
    if (be->act_x != (const char *)x->data || be->act_nb1 != x->nb[1] || be->act_n_in != x->ne[0] ||
        be->act_n_rows != x->ne[1] || be->act_prep != prep) {
        return false;
    }
    const char *lo, *hi;
    view_span(x, &lo, &hi);
    return be->act_dst_hi <= lo || hi <= be->act_dst_lo;
}

/* Records that the scratch now holds x's activations made by prep, and this op's output span. */
static void matmul_act_note(cpu_backend *be, const tensor *x, cpu_act_row_fn prep, const tensor *dst) {
    be->act_seq = be->op_seq;
    be->act_x = (const char *)x->data;
    be->act_nb1 = x->nb[1];
    be->act_n_in = x->ne[0];
    be->act_n_rows = x->ne[1];
    be->act_prep = prep;
    view_span(dst, &be->act_dst_lo, &be->act_dst_hi);
}

void cpu_op_matmul(cpu_backend *be, const backend_op *op) {
    const tensor *w = &op->src[0], *x = &op->src[1];
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n_rows = x->ne[1];
    const cpu_dot_type dot = cpu_dot_type_of_weight(w);

    matmul_job job;
    job.op = op;
    job.kernel = w->layout != TENSOR_LAYOUT_PLAIN ? be->kernels.matmul_packed[w->type] : be->kernels.matmul[w->type];
    /* a packed weight comes from this backend's own kernels (backend_weight_pack) */
    DFL_ASSERT(w->layout == TENSOR_LAYOUT_PLAIN || w->layout == be->kernels.pack_layout[w->type]);
    job.prep = cpu_act_prep_of(&be->kernels, w);
    DFL_ASSERT(job.kernel != NULL && job.prep != NULL);
    cpu_act_layout(&job.act, dot, n_in, n_rows, cpu_scratch(be, cpu_act_bytes(dot, n_in, n_rows)));
    job.act.pf_l1_rows = be->kernels.pf_l1_rows;

    int nth = n_rows == 1 ? be->n_threads : be->n_threads_batch;
    if (nth > cpu_pool_size(be->pool)) nth = cpu_pool_size(be->pool);
    /* tiny matmuls are not worth waking threads for */
    const double work = (double)n_in * (double)n_out * (double)n_rows;
    if (work < 65536.0) nth = 1;

    /* phase 1: activation rows (split over threads only when there is real work), unless the
     * previous op prepared these (matmul_act_reuse) */
    if (!matmul_act_reuse(be, x, job.prep)) {
        const int nth_prep = (double)n_in * (double)n_rows >= 32768.0 ? (nth < n_rows ? nth : (int)n_rows) : 1;
        cpu_pool_run(be->pool, nth_prep, matmul_prep_fn, &job);
    }
    matmul_act_note(be, x, job.prep, &op->dst);

    /* phase 2: about 8 chunks per thread for balance, multiples of 4 (kernels work on 2 or 4
     * weight rows at a time) */
    int64_t chunk = (n_out + 8 * nth - 1) / (8 * nth);
    if (chunk < 16) chunk = 16;
    /* KQ_X16 / Q6K_X16V / P16_X16 weights come in groups of 16 rows: chunks start at a group */
    const bool groups16 = w->layout == TENSOR_LAYOUT_KQ_X16 || w->layout == TENSOR_LAYOUT_Q6K_X16V ||
                          w->layout == TENSOR_LAYOUT_P16_X16;
    chunk = groups16 ? (chunk + 15) & ~(int64_t)15 : (chunk + 3) & ~(int64_t)3;
    job.chunk = chunk;
    job.n_chunks = (n_out + chunk - 1) / chunk;
    /* row blocks: whole multiples of 16 rows (the kernels' row tiles), at least 16 */
    const int64_t row_bytes = (int64_t)cpu_act_row_hot_bytes(dot, n_in);
    const int64_t block_bytes = dot == CPU_DOT_F32 ? MATMUL_ROW_BLOCK_BYTES_F32 : MATMUL_ROW_BLOCK_BYTES;
    int64_t rb = block_bytes / (row_bytes > 0 ? row_bytes : 1) / 16 * 16;
    if (rb < 16) rb = 16;
    job.row_block = rb < n_rows ? rb : n_rows;
    job.shares = be->shares;
    share_init(job.shares, nth, job.n_chunks, (n_rows + job.row_block - 1) / job.row_block);
    cpu_pool_run(be->pool, nth, matmul_compute_fn, &job);
}

/* ---- matmul + scale + argmax (a greedy head) ----------------------------------------------
 * The activations are prepared as for a matmul; the outputs are cut into chunks (multiples of 16
 * rows, ~8 per thread, a thread's [n_rows, chunk] logits at most 256 KiB so that they stay in
 * L2); a thread computes a chunk's logits with the same kernel as op_matmul (the same bits: the
 * chunks start at multiples of 4 like op_matmul's, and the kernels' results do not depend on the
 * output range), scales them, and keeps each row's argmax over the chunk (the SIMD argmax row
 * kernel: first index of the max, or the flagged first NaN/Inf). The caller combines the chunks
 * in order (the first flagged chunk wins, else the largest value, the earlier chunk on ties), so
 * dst equals op_matmul + op_scale + op_argmax and no [n_out, n_rows] logits are written (with
 * src[2], op_matmul_argmax_logits: each chunk's rows are also copied there from L2, so that a
 * verify's logits and their ids and NaN/Inf flags cost one pass). */
#define MMAX_TILE_FLOATS (64 * 1024)

typedef struct mmax_job {
    const backend_op *op;
    cpu_act act;
    cpu_matmul_fn kernel;
    cpu_act_row_fn prep;
    cpu_argmax_row_fn argmax;
    int64_t chunk, n_chunks;
    float *logits;          /* per thread: [n_rows, chunk] */
    float *best;            /* [n_chunks, n_rows] the max of a chunk's row (unflagged rows) */
    int64_t *where;         /* [n_chunks, n_rows] its output index, or -1 - (index of the first NaN/Inf) */
    cpu_share *shares;      /* [nth] (share_init) */
} mmax_job;

static void mmax_prep_fn(void *ctx, int ith, int nth) {
    mmax_job *job = ctx;
    const tensor *x = &job->op->src[1];
    for (int64_t r = ith; r < x->ne[1]; r += nth) {
        job->prep(&job->act, r, (const float *)((const char *)x->data + (size_t)r * x->nb[1]));
    }
}

static void mmax_compute_fn(void *ctx, int ith, int nth) {
    mmax_job *job = ctx;
    const tensor *w = &job->op->src[0], *L = &job->op->src[2]; /* L: the logits, where wanted */
    const int64_t n_out = w->ne[1], n_rows = job->act.n_rows;
    const float scale = job->op->f[0];
    float *lg = job->logits + (size_t)ith * (size_t)(job->chunk * n_rows);
    int64_t rb, c;
    while (share_next(job->shares, ith, nth, job->n_chunks, &rb, &c)) {
        const int64_t o0 = c * job->chunk;
        const int64_t no = n_out - o0 < job->chunk ? n_out - o0 : job->chunk;
        /* lg [no, n_rows]: outputs o0 .. o0 + no - 1 */
        job->kernel((const char *)w->data + (size_t)o0 * w->nb[1], w->nb[1], &job->act, 0, n_rows, lg, no, 0, no);
        for (int64_t r = 0; r < n_rows; r++) {
            float *lr = lg + r * no;
            for (int64_t o = 0; o < no; o++) lr[o] = lr[o] * scale; /* op_scale's product */
            if (L->data != NULL) memcpy((char *)L->data + (size_t)r * L->nb[1] + (size_t)o0 * sizeof(float), lr, (size_t)no * sizeof(float));
            const int32_t i = job->argmax(lr, no);
            job->where[c * n_rows + r] = i >= 0 ? o0 + i : -1 - (o0 + (-1 - (int64_t)i));
            job->best[c * n_rows + r] = i >= 0 ? lr[i] : 0.0f;
        }
    }
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

void cpu_op_matmul_argmax(cpu_backend *be, const backend_op *op) {
    const tensor *w = &op->src[0], *x = &op->src[1], *d = &op->dst;
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n_rows = x->ne[1];
    const cpu_dot_type dot = cpu_dot_type_of_weight(w);

    mmax_job job;
    job.op = op;
    job.kernel = w->layout != TENSOR_LAYOUT_PLAIN ? be->kernels.matmul_packed[w->type] : be->kernels.matmul[w->type];
    /* a packed weight comes from this backend's own kernels (backend_weight_pack) */
    DFL_ASSERT(w->layout == TENSOR_LAYOUT_PLAIN || w->layout == be->kernels.pack_layout[w->type]);
    job.prep = cpu_act_prep_of(&be->kernels, w);
    job.argmax = be->kernels.argmax_row;
    DFL_ASSERT(job.kernel != NULL && job.prep != NULL && job.argmax != NULL);

    int nth = n_rows == 1 ? be->n_threads : be->n_threads_batch;
    if (nth > cpu_pool_size(be->pool)) nth = cpu_pool_size(be->pool);
    if ((double)n_in * (double)n_out * (double)n_rows < 65536.0) nth = 1;

    /* 8 chunks a thread, more where a thread's [n_rows, chunk] would pass the cap, and always a
     * multiple of nth, so that the threads get equal shares (rounding the chunk down to 16 had
     * made 17 chunks of the 151,936-row head for 2 threads) */
    const int64_t cap = MMAX_TILE_FLOATS / n_rows;
    int64_t n_ch = 8 * nth;
    if ((n_out + n_ch - 1) / n_ch > cap) n_ch = ((n_out + cap - 1) / cap + nth - 1) / nth * nth;
    int64_t chunk = ((n_out + n_ch - 1) / n_ch + 15) & ~(int64_t)15;
    if (chunk < 16) chunk = 16;
    job.chunk = chunk;
    job.n_chunks = (n_out + chunk - 1) / chunk;

    /* scratch: activations | per-thread logits | chunk maxima | their indices */
    const size_t act_b = align64(cpu_act_bytes(dot, n_in, n_rows));
    const size_t lg_b = align64((size_t)nth * (size_t)(chunk * n_rows) * sizeof(float));
    const size_t best_b = align64((size_t)(job.n_chunks * n_rows) * sizeof(float));
    const size_t where_b = (size_t)(job.n_chunks * n_rows) * sizeof(int64_t);
    char *mem = cpu_scratch(be, act_b + lg_b + best_b + where_b);
    cpu_act_layout(&job.act, dot, n_in, n_rows, mem);
    job.act.pf_l1_rows = be->kernels.pf_l1_rows;
    job.logits = (float *)(mem + act_b);
    job.best = (float *)(mem + act_b + lg_b);
    job.where = (int64_t *)(mem + act_b + lg_b + best_b);

    const int nth_prep = (double)n_in * (double)n_rows >= 32768.0 ? (nth < n_rows ? nth : (int)n_rows) : 1;
    cpu_pool_run(be->pool, nth_prep, mmax_prep_fn, &job);
    job.shares = be->shares;
    share_init(job.shares, nth, job.n_chunks, 1);
    cpu_pool_run(be->pool, nth, mmax_compute_fn, &job);

    for (int64_t r = 0; r < n_rows; r++) {
        int64_t idx = -1;
        float best = 0.0f;
        for (int64_t c = 0; c < job.n_chunks; c++) {
            const int64_t wh = job.where[c * n_rows + r];
            if (wh < 0) { /* the row's first NaN/Inf lies in the first flagged chunk */
                idx = wh;
                break;
            }
            if (idx < 0 || job.best[c * n_rows + r] > best) {
                idx = wh;
                best = job.best[c * n_rows + r];
            }
        }
        *(int32_t *)((char *)d->data + (size_t)r * d->nb[0]) = (int32_t)idx;
    }
}
