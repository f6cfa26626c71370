/* test_backend_cuda.c: the CUDA backend against the CPU reference.
 *
 * Ops: every op on awkward sizes, each case laid out in one host blob that is run twice: by the
 * scalar reference (cpu_op_ref, on a copy) and by the backend under test (the blob uploaded to
 * one buffer, the op's pointers rebased into it). Tolerances by dtype (matmul budgets as in
 * test_backend_matmul.c: |y - y_ref| <= budget * sum_i |w_i| * max_i |x_i|), exact where the op is
 * exact (copies, rows, add/mul/scale, argmax); a non-finite value never passes. Batch invariance:
 * matmul rows and attention query rows give bit-identical results whatever the op's row count
 * (1..64), the property greedy speculative decoding relies on.
 * Queues and events: ordering across two queues with a device-side wait and a host wait.
 * End to end on generated models: test_cuda_model.c.
 *
 * Without a CUDA build every test but cuda_device_option skips ("built without CUDA"). With CUDA
 * but no usable device (this development machine), the op and queue tests run their harness
 * against the asynchronous CPU backend (so the test code itself is exercised) and then skip with
 * the reason; the end-to-end tests (test_cuda_model.c) skip. tools/device-check.sh runs them on a GPU. */
#include "test.h"
#include "test_backend_util.h"
#include "test_util.h"
#include "test_views.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_ops_ref.h"
#include "base/error.h"
#include "base/fp16.h"
#include "dflash.h"
#ifdef DFL_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the backend under test ----------------------------------------------------------------- */

typedef struct cu_env {
    backend *be;
    bool is_cuda;
    char why[512]; /* why there is no CUDA device */
} cu_env;

/* Opens the CUDA backend, or (no device, stand_in) the asynchronous CPU backend. False: the test
 * has skipped itself. */
static bool env_open(test_ctx *t, cu_env *e, bool stand_in) {
    memset(e, 0, sizeof(*e));
#ifdef DFL_HAVE_CUDA
    dfl_error err;
    error_clear(&err);
    if (backend_cuda_device_count(&err) > 0) {
        backend_cuda_params p = backend_cuda_default_params();
        e->be = backend_cuda_new(&p, &err);
        if (e->be == NULL) {
            test_fail(t, __FILE__, __LINE__, "backend_cuda_new: %s", err.msg);
            return false;
        }
        e->is_cuda = true;
        printf("    cuda: %s\n", backend_cuda_device_name(e->be));
        return true;
    }
    snprintf(e->why, sizeof(e->why), "%.400s", err.msg);
    if (!stand_in) {
        test_skip(t, e->why);
        return false;
    }
    backend_cpu_params cp = backend_cpu_default_params();
    cp.async = true;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    e->be = backend_cpu_new(&cp, &err);
    if (e->be == NULL) {
        test_fail(t, __FILE__, __LINE__, "backend_cpu_new: %s", err.msg);
        return false;
    }
    return true;
#else
    (void)stand_in;
    test_skip(t, "built without CUDA (make CUDA=1 where nvcc is installed)");
    return false;
#endif
}

static void env_close(test_ctx *t, cu_env *e) {
    backend_free(e->be);
    if (!e->is_cuda && t->n_fail == 0) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "no CUDA device (%s): the harness ran against the CPU backend only", e->why);
        test_skip(t, msg);
    }
}

/* ---- running one op blob both ways --------------------------------------------------------------- */

static void op_rebase(backend_op *op, const uint8_t *from, size_t n, uint8_t *to, backend_buffer *buf) {
    tensor *ts[5] = {&op->dst, &op->src[0], &op->src[1], &op->src[2], &op->src[3]};
    for (int i = 0; i < 5; i++) {
        const uint8_t *p = ts[i]->data;
        if (p != NULL && p >= from && p < from + n) {
            ts[i]->data = to + (p - from);
            ts[i]->buf = buf;
        }
    }
}

/* The reference result: the blob after cpu_op_ref (malloc'd copy); NULL (reported) when a view of
 * the op does not fit the array it was made for. */
static uint8_t *run_ref(test_ctx *t, const backend_op *op, const tv_arena *b, const char *what) {
    if (!tv_op_check(t, op, b, what)) return NULL;
    uint8_t *copy = malloc(b->size);
    DFL_ASSERT(copy != NULL);
    memcpy(copy, b->mem, b->size);
    backend_op r = *op;
    op_rebase(&r, b->mem, b->size, copy, NULL);
    cpu_op_ref(&r);
    return copy;
}

/* The backend's result: the blob after the op ran in one buffer of be (malloc'd), NULL on a
 * validation failure or a view that does not fit its array (reported). */
static uint8_t *run_dev(test_ctx *t, backend *be, const backend_op *op, const tv_arena *b, const char *what) {
    if (!tv_op_check(t, op, b, what)) return NULL;
    dfl_error err;
    error_clear(&err);
    backend_buffer *buf = backend_buffer_alloc(be, b->size, &err);
    if (buf == NULL) {
        test_fail(t, __FILE__, __LINE__, "%s: buffer: %s", what, err.msg);
        return NULL;
    }
    backend_buffer_set(buf, 0, b->mem, b->size);
    backend_op d = *op;
    op_rebase(&d, b->mem, b->size, backend_buffer_base(buf), buf);
    uint8_t *out = NULL;
    if (backend_op_validate(be, &d, &err) != DFL_OK) {
        test_fail(t, __FILE__, __LINE__, "%s: %s", what, err.msg);
    } else {
        backend_queue *q = backend_queue_new(be, &err);
        DFL_ASSERT(q != NULL);
        backend_queue_submit(q, &d);
        backend_queue_synchronize(q);
        backend_queue_free(q);
        out = malloc(b->size);
        DFL_ASSERT(out != NULL);
        backend_buffer_get(buf, 0, out, b->size);
    }
    backend_buffer_free(buf);
    return out;
}

/* max |a - b| <= tol_abs + tol_rel * |b| over n floats; non-finite fails. */
static bool close_f32(test_ctx *t, const char *what, const float *a, const float *b, int64_t n, double tol_abs,
                      double tol_rel) {
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            test_fail(t, __FILE__, __LINE__, "%s: non-finite value at %lld: %g vs ref %g", what, (long long)i, a[i], b[i]);
            return false;
        }
        const double d = fabs((double)a[i] - (double)b[i]);
        if (d > tol_abs + tol_rel * fabs((double)b[i])) {
            test_fail(t, __FILE__, __LINE__, "%s: element %lld: %.9g vs ref %.9g (diff %.3g)", what, (long long)i, a[i],
                      b[i], d);
            return false;
        }
    }
    return true;
}

/* Runs op both ways and compares: exact (whole blob) or the contiguous f32 dst within tolerance,
 * and then also a mean |y - y_ref| over dst of at most mean_max (a systematic difference, such as a
 * rounding step the reference has and the kernel lacks, shows in the mean long before the max). */
static void check_op_mean(test_ctx *t, backend *be, const backend_op *op, const tv_arena *b, const char *what, bool exact,
                          double tol_abs, double tol_rel, double mean_max) {
    uint8_t *ref = run_ref(t, op, b, what);
    uint8_t *got = ref != NULL ? run_dev(t, be, op, b, what) : NULL;
    if (got != NULL) {
        if (exact) {
            if (memcmp(ref, got, b->size) != 0) {
                size_t i = 0;
                while (ref[i] == got[i]) i++;
                test_fail(t, __FILE__, __LINE__, "%s: differs from the reference at byte %zu", what, i);
            }
        } else {
            const size_t off = (size_t)((const uint8_t *)op->dst.data - b->mem);
            const float *y = (const float *)(got + off), *yr = (const float *)(ref + off);
            const int64_t n = tensor_nelements(&op->dst);
            if (close_f32(t, what, y, yr, n, tol_abs, tol_rel) && n > 0) {
                double mean = 0.0;
                for (int64_t i = 0; i < n; i++) mean += fabs((double)y[i] - (double)yr[i]);
                mean /= (double)n;
                if (!(mean <= mean_max)) {
                    test_fail(t, __FILE__, __LINE__, "%s: mean |y - y_ref| %.3g > %.3g", what, mean, mean_max);
                }
            }
        }
    }
    free(ref);
    free(got);
}

static void check_op(test_ctx *t, backend *be, const backend_op *op, const tv_arena *b, const char *what, bool exact,
                     double tol_abs, double tol_rel) {
    check_op_mean(t, be, op, b, what, exact, tol_abs, tol_rel, INFINITY);
}

static backend_op mkop(backend_op_kind kind, tensor dst, const tensor *s0, const tensor *s1) {
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = kind;
    op.dst = dst;
    if (s0) op.src[0] = *s0;
    if (s1) op.src[1] = *s1;
    return op;
}

/* ---- the device option (both builds) --------------------------------------------------------- */

#define TINY "--n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 --draft-layers 1"

TEST(cuda_device_option) {
    char tpath[512], dpath[512];
    if (!tu_make_models(t, "m", TINY, tpath, dpath, sizeof(tpath))) return;
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(tpath, NULL, &err);
    REQUIRE(m != NULL);
    dfl_context_params p = dfl_context_default_params();
    p.n_ctx = 64;
    p.device = (dfl_device)7;
    dfl_context *ctx = dfl_context_new(m, &p, &err);
    CHECK(ctx == NULL);
    CHECK_EQ_INT(err.code, DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "unknown device 7");
    error_clear(&err);
    p.device = DFL_DEVICE_CUDA;
    ctx = dfl_context_new(m, &p, &err);
    char cmd[1200], out[4096];
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -md %s -p hello -n 3 --device cuda", test_cli_path(), tpath, dpath);
    const int rc = test_run(cmd, out, sizeof(out));
#ifdef DFL_HAVE_CUDA
    dfl_error e2 = {0};
    if (backend_cuda_device_count(&e2) > 0) {
        CHECK_MSG(ctx != NULL, "a cuda context: %s", err.msg);
        CHECK_EQ_INT(rc, 0);
        CHECK_STR_CONTAINS(out, "(cuda backend)");
    } else {
        CHECK(ctx == NULL);
        CHECK_EQ_INT(err.code, DFL_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(err.msg, "CUDA");
        CHECK(rc == 1);
        CHECK_STR_CONTAINS(out, "CUDA");
    }
#else
    CHECK(ctx == NULL);
    CHECK_EQ_INT(err.code, DFL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.msg, "built without CUDA");
    CHECK(rc == 1);
    CHECK_STR_CONTAINS(out, "built without CUDA");
#endif
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -p hello -n 3 --device tpu", test_cli_path(), tpath);
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 2);
    CHECK_STR_CONTAINS(out, "cpu or cuda");
    dfl_context_free(ctx);
    dfl_model_free(m);
}

/* ---- buffers, transfers, queues, events ------------------------------------------------------- */

TEST(cuda_buffers_and_transfers) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    dfl_error err = {0};
    const size_t n = 1000003;
    backend_buffer *buf = backend_buffer_alloc(e.be, n, &err);
    REQUIRE(buf != NULL);
    uint8_t *h = malloc(n), *g = malloc(n);
    REQUIRE(h && g);
    backend_buffer_get(buf, 0, g, n);
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += g[i] != 0;
    CHECK_MSG(nz == 0, "a new buffer is not zeroed (%zu bytes)", nz);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)(i * 7 + 3);
    backend_buffer_set(buf, 0, h, n);
    backend_buffer_get(buf, 17, g, n - 17);
    CHECK(memcmp(g, h + 17, n - 17) == 0);
    /* ordered transfers: many small writes (wrapping the staging ring), then reads */
    backend_queue *q = backend_queue_new(e.be, &err);
    REQUIRE(q != NULL);
    const int64_t nf = 4096;
    float *src = malloc((size_t)nf * 3000 * sizeof(float)), *dst = malloc((size_t)nf * sizeof(float));
    REQUIRE(src && dst);
    for (int64_t i = 0; i < nf * 3000; i++) src[i] = (float)i;
    tensor tv = tensor_in_buffer(buf, 0, QUANT_TYPE_F32, nf, 1);
    for (int k = 0; k < 3000; k++) op_write(q, tv, src + (size_t)k * (size_t)nf, (size_t)nf * sizeof(float));
    op_read(q, dst, tv, (size_t)nf * sizeof(float));
    backend_queue_synchronize(q);
    CHECK(memcmp(dst, src + (size_t)2999 * (size_t)nf, (size_t)nf * sizeof(float)) == 0);
    /* a 1 MB write (through the staging ring) */
    op_write(q, tensor_in_buffer(buf, 0, QUANT_TYPE_F32, 250000, 1), src, 250000 * sizeof(float));
    backend_queue_synchronize(q);
    backend_buffer_get(buf, 0, g, 250000 * sizeof(float));
    CHECK(memcmp(g, src, 250000 * sizeof(float)) == 0);
    /* above the staging threshold (4 MiB, half the ring): straight from pageable memory, in
     * order with the staged writes before and after it on the same queue */
    {
        const int64_t nbig = ((int64_t)6 << 20) / 4 + 1; /* 6 MiB + 4 bytes */
        backend_buffer *bb = backend_buffer_alloc(e.be, (size_t)nbig * 4, &err);
        REQUIRE(bb != NULL);
        float *got = malloc((size_t)nbig * 4), *early = malloc(4096), *late = malloc(4096);
        REQUIRE(got && early && late);
        for (int i = 0; i < 1024; i++) early[i] = -1.0f - (float)i, late[i] = -5000.0f - (float)i;
        op_write(q, tensor_in_buffer(bb, 0, QUANT_TYPE_F32, 1024, 1), early, 4096);           /* staged */
        op_write(q, tensor_in_buffer(bb, 0, QUANT_TYPE_F32, nbig, 1), src, (size_t)nbig * 4);  /* pageable, over it */
        op_write(q, tensor_in_buffer(bb, 4096, QUANT_TYPE_F32, 1024, 1), late, 4096);         /* staged, after */
        op_read(q, got, tensor_in_buffer(bb, 0, QUANT_TYPE_F32, nbig, 1), (size_t)nbig * 4);
        backend_queue_synchronize(q);
        CHECK_MSG(memcmp(got, src, 4096) == 0, "the pageable write did not land over the staged write before it");
        CHECK_MSG(memcmp(got + 1024, late, 4096) == 0, "the staged write after the pageable one was overwritten");
        CHECK_MSG(memcmp(got + 2048, src + 2048, (size_t)(nbig - 2048) * 4) == 0, "the 6 MiB pageable write differs");
        free(got); free(early); free(late);
        backend_buffer_free(bb);
    }
    backend_queue_free(q);
    backend_buffer_free(buf);
    /* an impossible allocation fails with a message, nothing else breaks (not tried on the CPU
     * stand-in: a sanitizer build would abort on the request) */
    if (e.is_cuda) {
        error_clear(&err);
        backend_buffer *huge = backend_buffer_alloc(e.be, (size_t)1 << 50, &err);
        CHECK(huge == NULL);
        CHECK_EQ_INT(err.code, DFL_ERR_NOMEM);
        CHECK_STR_CONTAINS(err.msg, "device memory");
    }
    free(h); free(g); free(src); free(dst);
    env_close(t, &e);
}

TEST(cuda_events_order_queues) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    dfl_error err = {0};
    const int64_t n = 512;
    backend_buffer *buf = backend_buffer_alloc(e.be, (size_t)(n * n + 4 * n) * sizeof(float), &err);
    REQUIRE(buf != NULL);
    backend_queue *qa = backend_queue_new(e.be, &err), *qb = backend_queue_new(e.be, &err);
    backend_event *written = backend_event_new(e.be, &err), *never = backend_event_new(e.be, &err);
    REQUIRE(qa && qb && written && never);
    backend_queue_wait_event(qb, never); /* never recorded: complete */
    backend_event_synchronize(never);
    tensor w = tensor_in_buffer(buf, 0, QUANT_TYPE_F32, n, n);                              /* [n, n] */
    tensor x = tensor_in_buffer(buf, (size_t)(n * n) * 4, QUANT_TYPE_F32, n, 1);            /* [n] */
    tensor y = tensor_in_buffer(buf, (size_t)(n * n + n) * 4, QUANT_TYPE_F32, n, 1);        /* [n] */
    tensor z = tensor_in_buffer(buf, (size_t)(n * n + 2 * n) * 4, QUANT_TYPE_F32, n, 1);    /* [n] */
    float *hw = malloc((size_t)(n * n) * sizeof(float)), hx[512], hz[512], hz2[512];
    REQUIRE(hw);
    for (int round = 0; round < 2; round++) {
        for (int64_t i = 0; i < n * n; i++) hw[i] = (i % (n + 1)) == 0 ? 1.0f : 0.0f; /* identity */
        for (int64_t i = 0; i < n; i++) hx[i] = (float)(i + 1000 * round);
        /* A: y = W x repeated (slow), then y *= 2; record `written` */
        op_write(qa, w, hw, (size_t)(n * n) * sizeof(float));
        op_write(qa, x, hx, (size_t)n * sizeof(float));
        for (int k = 0; k < 100; k++) op_matmul(qa, y, w, x);
        op_scale(qa, y, y, 2.0f);
        backend_event_record(written, qa);
        if (round == 0) {
            /* B waits on the device, then z = y + 1 */
            backend_queue_wait_event(qb, written);
        } else {
            /* B's host waits, then enqueues */
            backend_event_synchronize(written);
        }
        op_copy(qb, z, y);
        op_add(qb, z, z, x);
        op_read(qb, hz, z, (size_t)n * sizeof(float));
        backend_queue_synchronize(qb);
        for (int64_t i = 0; i < n; i++) hz2[i] = 3.0f * hx[i];
        CHECK_MSG(memcmp(hz, hz2, sizeof(hz)) == 0, "round %d (%s wait): B read y before A wrote it", round,
                  round == 0 ? "device" : "host");
        backend_queue_synchronize(qa);
    }
    backend_event_free(written);
    backend_event_free(never);
    backend_queue_free(qa);
    backend_queue_free(qb);
    backend_buffer_free(buf);
    free(hw);
    env_close(t, &e);
}

TEST(cuda_op_rejects_host_memory) {
    cu_env e;
    if (!env_open(t, &e, false)) return;
    float a[8] = {0}, d[8];
    tensor ta = tensor_1d(QUANT_TYPE_F32, a, 8), td = tensor_1d(QUANT_TYPE_F32, d, 8);
    backend_op op = mkop(BACKEND_OP_SCALE, td, &ta, NULL);
    op.f[0] = 2.0f;
    dfl_error err = {0};
    CHECK_EQ_INT(backend_op_validate(e.be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "not in a cuda buffer");
    backend_caps c = backend_get_caps(e.be);
    CHECK(!c.host_visible && c.has_events && c.async);
    CHECK(strcmp(c.name, "cuda") == 0);
    env_close(t, &e);
}

/* ---- matmul --------------------------------------------------------------------------------------- */

/* the GPU rounds f32 sums in another order: twice the CPU budget for f32 */
static double cu_mm_budget(uint32_t type) {
    switch (type) {
    case QUANT_TYPE_F32: return 2e-6;
    case QUANT_TYPE_F16: return 7e-4;
    default: return 5e-3;
    }
}

typedef struct mm_layout {
    tv_arena b;
    backend_op op;
    float *x;     /* [n_in, n_rows] rows x_stride floats apart */
    int64_t x_stride;
} mm_layout;

/* A matmul blob: W [n_in, n_out], x [n_in, n_rows] (row stride n_in + pad), dst [n_out, n_rows]. */
static void mm_make(mm_layout *L, rng *r, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_rows, int64_t pad) {
    const size_t wbytes = quant_row_size(type, n_in) * (size_t)n_out;
    L->x_stride = n_in + pad;
    tv_arena_init(&L->b, wbytes + (size_t)(L->x_stride * n_rows + n_out * n_rows) * 4 + 4096);
    uint8_t *w = tv_arena_take(&L->b, wbytes);
    L->x = tv_arena_take(&L->b, (size_t)(L->x_stride * n_rows) * 4);
    float *d = tv_arena_take(&L->b, (size_t)(n_out * n_rows) * 4);
    fill_weight(r, type, w, n_in, n_out);
    fill_f32(r, L->x, L->x_stride * n_rows, 2.0f);
    if (n_rows >= 3) memset(L->x + L->x_stride, 0, (size_t)n_in * 4); /* a zero row */
    memset(d, 0xff, (size_t)(n_out * n_rows) * 4);                      /* NaN poison */
    tensor tx = tensor_2d(QUANT_TYPE_F32, L->x, n_in, n_rows);
    tx.nb[1] = (size_t)L->x_stride * 4;
    tx.nb[2] = tx.nb[3] = tx.nb[1] * (size_t)n_rows;
    tensor tw = tensor_2d(type, w, n_in, n_out);
    L->op = mkop(BACKEND_OP_MATMUL, tensor_2d(QUANT_TYPE_F32, d, n_out, n_rows), &tw, &tx);
}

/* N[r][o] = sum_i |w_o,i| * max_i |x_r,i| */
static double *cu_mm_norms(const mm_layout *L) {
    const tensor *w = &L->op.src[0];
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n_rows = L->op.src[1].ne[1];
    double *N = malloc((size_t)(n_out * n_rows) * sizeof(double));
    float *row = malloc((size_t)n_in * sizeof(float));
    DFL_ASSERT(N && row);
    for (int64_t o = 0; o < n_out; o++) {
        DFL_ASSERT(quant_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)o * w->nb[1], row, n_in));
        double wa = 0.0;
        for (int64_t i = 0; i < n_in; i++) wa += fabs((double)row[i]);
        for (int64_t r = 0; r < n_rows; r++) {
            double xm = 0.0;
            for (int64_t i = 0; i < n_in; i++) xm = fmax(xm, fabs((double)L->x[r * L->x_stride + i]));
            N[r * n_out + o] = wa * xm + 1e-30;
        }
    }
    free(row);
    return N;
}

TEST(cuda_op_matmul_vs_ref) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {4242};
    /* (n_in, n_out, n_rows, x row padding): decode, verification (2-64 rows: own kernels),
     * prompt batches (> 64 rows: cuBLAS), awkward sizes, strided activations */
    static const int64_t cases32[][4] = {
        {32, 1, 1, 0},    {64, 3, 2, 0},     {96, 7, 3, 4},     {256, 17, 7, 0},  {512, 128, 16, 0},
        {1024, 129, 17, 0}, {1088, 1000, 1, 0}, {96, 33, 33, 0}, {2048, 64, 4, 8}, {160, 144, 64, 0},
        {256, 48, 65, 0}, {512, 100, 100, 3}, {64, 16, 1, 0},
    };
    static const int64_t cases256[][4] = {
        {256, 1, 1, 0}, {256, 3, 2, 0}, {512, 7, 3, 0}, {768, 17, 7, 0}, {1024, 127, 16, 0},
        {512, 1000, 1, 0}, {256, 33, 33, 0}, {256, 64, 64, 0}, {512, 40, 70, 0},
    };
    static const int64_t cases1[][4] = {{7, 5, 3, 0}, {33, 3, 1, 1}, {17, 19, 66, 0}};
    for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
        const uint32_t type = k_mm_types[ti];
        const int64_t bs = quant_type_get(type)->blck_size;
        for (int set = 0; set < 3; set++) {
            const int64_t(*cases)[4] = set == 0 ? cases32 : set == 1 ? cases256 : cases1;
            const size_t n_cases = set == 0 ? sizeof(cases32) / sizeof(cases32[0])
                                   : set == 1 ? sizeof(cases256) / sizeof(cases256[0])
                                              : sizeof(cases1) / sizeof(cases1[0]);
            if (set == 1 && bs != 256) continue;
            if (set == 0 && bs == 256) continue;
            if (set == 2 && bs != 1) continue;
            for (size_t ci = 0; ci < n_cases; ci++) {
                const int64_t n_in = cases[ci][0], n_out = cases[ci][1], n_rows = cases[ci][2], pad = cases[ci][3];
                mm_layout L;
                mm_make(&L, &r, type, n_in, n_out, n_rows, pad);
                double *N = cu_mm_norms(&L);
                char what[160];
                snprintf(what, sizeof(what), "matmul %s [%lld -> %lld] x %lld rows (pad %lld)", quant_type_get(type)->name,
                         (long long)n_in, (long long)n_out, (long long)n_rows, (long long)pad);
                uint8_t *ref = run_ref(t, &L.op, &L.b, what);
                uint8_t *got = ref != NULL ? run_dev(t, e.be, &L.op, &L.b, what) : NULL;
                if (got != NULL) {
                    const size_t off = (size_t)((uint8_t *)L.op.dst.data - L.b.mem);
                    const float *y = (const float *)(got + off), *yr = (const float *)(ref + off);
                    for (int64_t i = 0; i < n_out * n_rows; i++) {
                        if (!isfinite(y[i]) || fabs((double)y[i] - (double)yr[i]) > cu_mm_budget(type) * N[i]) {
                            test_fail(t, __FILE__, __LINE__, "%s: out %lld: %.8g vs ref %.8g (budget %.3g)", what,
                                      (long long)i, y[i], yr[i], cu_mm_budget(type) * N[i]);
                            break;
                        }
                    }
                }
                free(ref); free(got); free(N); tv_arena_free(&L.b);
            }
        }
    }
    env_close(t, &e);
}

/* The quantized prompt path (> 64 activation rows: W dequantized to f32 a chunk of rows at a time,
 * one TF32 GEMM per chunk) with several chunks and a short last one: the chunk size is a test hook
 * (by default a chunk holds 64 MiB of f32, so no small case has more than one). */
TEST(cuda_op_matmul_chunked_prompt) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {5150};
    static const uint32_t types[] = {QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K};
    /* (n_in, n_out, n_rows, chunk rows): 100 outputs in chunks of 7 (the last one 2), 33 in 16 + 16 + 1,
     * one chunk exactly n_out */
    static const int64_t cases[][4] = {{512, 100, 70, 7}, {256, 33, 129, 16}, {768, 48, 65, 48}};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            const int64_t n_in = cases[ci][0], n_out = cases[ci][1], n_rows = cases[ci][2];
            if (n_in % quant_type_get(types[ti])->blck_size != 0) continue;
#if defined(DFL_HAVE_CUDA)
            if (e.is_cuda) backend_cuda_set_test_chunk_rows(e.be, cases[ci][3]);
#endif
            mm_layout L;
            mm_make(&L, &r, types[ti], n_in, n_out, n_rows, ci == 1 ? 5 : 0);
            double *N = cu_mm_norms(&L);
            char what[160];
            snprintf(what, sizeof(what), "matmul %s [%lld -> %lld] x %lld rows, chunks of %lld rows",
                     quant_type_get(types[ti])->name, (long long)n_in, (long long)n_out, (long long)n_rows,
                     (long long)cases[ci][3]);
            uint8_t *ref = run_ref(t, &L.op, &L.b, what);
            uint8_t *got = ref != NULL ? run_dev(t, e.be, &L.op, &L.b, what) : NULL;
            if (got != NULL) {
                const size_t off = (size_t)((uint8_t *)L.op.dst.data - L.b.mem);
                const float *y = (const float *)(got + off), *yr = (const float *)(ref + off);
                for (int64_t i = 0; i < n_out * n_rows; i++) {
                    /* TF32 products (10-bit mantissas): the budget of the 16-bit types */
                    if (!isfinite(y[i]) || fabs((double)y[i] - (double)yr[i]) > 5e-3 * N[i]) {
                        test_fail(t, __FILE__, __LINE__, "%s: out %lld (row %lld, output %lld): %.8g vs ref %.8g", what,
                                  (long long)i, (long long)(i / n_out), (long long)(i % n_out), y[i], yr[i]);
                        break;
                    }
                }
            }
            free(ref); free(got); free(N); tv_arena_free(&L.b);
        }
    }
#if defined(DFL_HAVE_CUDA)
    if (e.is_cuda) backend_cuda_set_test_chunk_rows(e.be, 0);
#endif
    env_close(t, &e);
}

/* Row r of a matmul over R rows is bit-identical to row r over 64 rows, for R in 1..64, and to the
 * same row computed alone. */
TEST(cuda_op_matmul_batch_invariance) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {77};
    static const int64_t dims[][2] = {{512, 80}, {4096, 48}};
    static const int64_t rows[] = {1, 2, 3, 7, 16, 17, 31, 33, 64};
    for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
        const uint32_t type = k_mm_types[ti];
        for (size_t di = 0; di < 2; di++) {
            const int64_t n_in = dims[di][0], n_out = dims[di][1];
            mm_layout L;
            mm_make(&L, &r, type, n_in, n_out, 64, 0);
            char what[128];
            snprintf(what, sizeof(what), "matmul %s [%lld -> %lld]", quant_type_get(type)->name, (long long)n_in,
                     (long long)n_out);
            uint8_t *full = run_dev(t, e.be, &L.op, &L.b, what);
            if (full == NULL) {
                tv_arena_free(&L.b);
                continue;
            }
            const size_t off = (size_t)((uint8_t *)L.op.dst.data - L.b.mem);
            for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
                backend_op op = L.op;
                op.src[1].ne[1] = rows[ri];
                op.dst.ne[1] = rows[ri];
                uint8_t *part = run_dev(t, e.be, &op, &L.b, what);
                if (part != NULL && memcmp(part + off, full + off, (size_t)(n_out * rows[ri]) * 4) != 0) {
                    test_fail(t, __FILE__, __LINE__, "%s: %lld rows differ from the same rows of a 64-row op", what,
                              (long long)rows[ri]);
                }
                free(part);
            }
            /* a row alone (at column 0 of the first tile) gives the bits it has at its place in the
             * 64-row op: what a token computes in decode vs inside a verification batch */
            static const int64_t alone[] = {5, 17, 40, 63};
            for (size_t ai = 0; ai < sizeof(alone) / sizeof(alone[0]); ai++) {
                const int64_t ra = alone[ai];
                backend_op op = L.op;
                op.src[1].data = (uint8_t *)op.src[1].data + (size_t)ra * op.src[1].nb[1];
                op.src[1].ne[1] = 1;
                op.dst.data = (uint8_t *)op.dst.data + (size_t)ra * op.dst.nb[1];
                op.dst.ne[1] = 1;
                uint8_t *one = run_dev(t, e.be, &op, &L.b, what);
                const size_t roff = off + (size_t)(ra * n_out) * 4;
                if (one != NULL && memcmp(one + roff, full + roff, (size_t)n_out * 4) != 0) {
                    test_fail(t, __FILE__, __LINE__, "%s: row %lld alone differs from row %lld of a 64-row op", what,
                              (long long)ra, (long long)ra);
                }
                free(one);
            }
            free(full);
            tv_arena_free(&L.b);
        }
    }
    env_close(t, &e);
}

/* Consecutive matmuls over one x on one queue (k/v, gate/up) share the quantized activations;
 * an op_write into x, another op in between, a different row count, or a host-side wait (after
 * which another queue's write may have landed in x) must not reuse them.
 * Each result must equal (bit for bit) the same matmul run alone on a fresh queue. */
TEST(cuda_op_matmul_activation_reuse) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {2024};
    const int64_t n_in = 1024, n_out = 96, rows = 5;
    dfl_error err = {0};
    const uint32_t types[2] = {QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_0};
    for (int ti = 0; ti < 2; ti++) {
        const size_t wb = quant_row_size(types[ti], n_in) * (size_t)n_out, xb = (size_t)(n_in * rows) * 4,
                     db = (size_t)(n_out * rows) * 4;
        uint8_t *hw = malloc(2 * wb);
        float *hx = malloc(xb), *hx2 = malloc(xb), *out = malloc(5 * db), *alone = malloc(db);
        REQUIRE(hw && hx && hx2 && out && alone);
        fill_weight(&r, types[ti], hw, n_in, 2 * n_out);
        fill_f32(&r, hx, n_in * rows, 1.0f);
        fill_f32(&r, hx2, n_in * rows, 1.0f);
        backend_buffer *buf = backend_buffer_alloc(e.be, 2 * wb + xb + 5 * db + 4096, &err);
        REQUIRE(buf != NULL);
        backend_buffer_set(buf, 0, hw, 2 * wb);
        tensor w1 = tensor_in_buffer(buf, 0, types[ti], n_in, n_out), w2 = tensor_in_buffer(buf, wb, types[ti], n_in, n_out);
        tensor x = tensor_in_buffer(buf, 2 * wb, QUANT_TYPE_F32, n_in, rows);
        tensor d[5];
        for (int k = 0; k < 5; k++) d[k] = tensor_in_buffer(buf, 2 * wb + xb + (size_t)k * db, QUANT_TYPE_F32, n_out, rows);
        backend_queue *q = backend_queue_new(e.be, &err);
        REQUIRE(q != NULL);
        op_write(q, x, hx, xb);
        op_matmul(q, d[0], w1, x);                                  /* quantizes x */
        op_matmul(q, d[1], w2, x);                                  /* reuses it */
        op_write(q, x, hx2, xb);                                    /* x changes */
        op_matmul(q, d[2], w1, x);                                  /* must quantize again */
        tensor x3 = tensor_rows(&x, 0, 3), d3 = tensor_rows(&d[3], 0, 3);
        op_matmul(q, d3, w2, x3);                                   /* fewer rows: no reuse */
        op_scale(q, x, x, 0.5f);                                    /* another op writes x */
        op_matmul(q, d[4], w1, x);
        op_read(q, out, tensor_in_buffer(buf, 2 * wb + xb, QUANT_TYPE_F32, n_out, 5 * rows), 5 * db);
        backend_queue_synchronize(q);
        backend_queue_free(q);
        /* each alone, on a fresh queue, from the same inputs */
        for (int k = 0; k < 5; k++) {
            float *hxk = malloc(xb);
            REQUIRE(hxk);
            memcpy(hxk, k < 2 ? hx : hx2, xb);
            if (k == 4) for (int64_t i = 0; i < n_in * rows; i++) hxk[i] *= 0.5f;
            backend_queue *q1 = backend_queue_new(e.be, &err);
            REQUIRE(q1 != NULL);
            op_write(q1, x, hxk, xb);
            const int64_t nr = k == 3 ? 3 : rows;
            op_matmul(q1, tensor_rows(&d[k], 0, nr), (k % 2) ? w2 : w1, tensor_rows(&x, 0, nr));
            op_read(q1, alone, d[k], (size_t)(n_out * nr) * 4);
            backend_queue_synchronize(q1);
            backend_queue_free(q1);
            CHECK_MSG(memcmp(alone, out + (size_t)k * (size_t)(n_out * rows), (size_t)(n_out * nr) * 4) == 0,
                      "%s: matmul %d of the chain differs from the same matmul alone", quant_type_get(types[ti])->name, k);
            free(hxk);
        }
        backend_buffer_free(buf);
        free(hw); free(hx); free(hx2); free(out); free(alone);
    }
    /* A host-side wait between two matmuls over one x on queue A: A quantizes x; queue B (behind a
     * device-side wait for A) overwrites x and records `written`; the host waits for it, then A
     * runs a matmul over x again. A's quantized copy from before the host wait must not be reused
     * (nothing on A itself changed x); the result must equal the same matmul over the new x. */
    for (int ti = 0; ti < 2; ti++) {
        const size_t wb = quant_row_size(types[ti], n_in) * (size_t)n_out, xb = (size_t)(n_in * rows) * 4,
                     db = (size_t)(n_out * rows) * 4;
        uint8_t *hw = malloc(2 * wb);
        float *hx = malloc(xb), *hx2 = malloc(xb), *out = malloc(db), *alone = malloc(db);
        REQUIRE(hw && hx && hx2 && out && alone);
        fill_weight(&r, types[ti], hw, n_in, 2 * n_out);
        fill_f32(&r, hx, n_in * rows, 1.0f);
        fill_f32(&r, hx2, n_in * rows, 1.0f);
        backend_buffer *buf = backend_buffer_alloc(e.be, 2 * wb + xb + 2 * db + 4096, &err);
        REQUIRE(buf != NULL);
        backend_buffer_set(buf, 0, hw, 2 * wb);
        tensor w1 = tensor_in_buffer(buf, 0, types[ti], n_in, n_out), w2 = tensor_in_buffer(buf, wb, types[ti], n_in, n_out);
        tensor x = tensor_in_buffer(buf, 2 * wb, QUANT_TYPE_F32, n_in, rows);
        tensor d0 = tensor_in_buffer(buf, 2 * wb + xb, QUANT_TYPE_F32, n_out, rows);
        tensor d1 = tensor_in_buffer(buf, 2 * wb + xb + db, QUANT_TYPE_F32, n_out, rows);
        backend_queue *qa = backend_queue_new(e.be, &err), *qb = backend_queue_new(e.be, &err);
        backend_event *done_a = backend_event_new(e.be, &err), *written = backend_event_new(e.be, &err);
        REQUIRE(qa && qb && done_a && written);
        op_write(qa, x, hx, xb);
        op_matmul(qa, d0, w1, x);             /* quantizes x on A */
        backend_event_record(done_a, qa);
        backend_queue_wait_event(qb, done_a); /* B overwrites x after A read it */
        op_write(qb, x, hx2, xb);
        backend_event_record(written, qb);
        backend_event_synchronize(written);   /* the host wait */
        op_matmul(qa, d1, w2, x);             /* must quantize B's x */
        op_read(qa, out, d1, db);
        backend_queue_synchronize(qa);
        backend_queue *q1 = backend_queue_new(e.be, &err);
        REQUIRE(q1 != NULL);
        op_write(q1, x, hx2, xb);
        op_matmul(q1, d1, w2, x);
        op_read(q1, alone, d1, db);
        backend_queue_synchronize(q1);
        CHECK_MSG(memcmp(alone, out, db) == 0, "%s: a matmul after a host-side event wait reused activations quantized "
                  "before it (x was rewritten by another queue)", quant_type_get(types[ti])->name);
        backend_queue_free(q1);
        backend_event_free(done_a);
        backend_event_free(written);
        backend_queue_free(qa);
        backend_queue_free(qb);
        backend_buffer_free(buf);
        free(hw); free(hx); free(hx2); free(out); free(alone);
    }
    env_close(t, &e);
}

/* ---- light ops ------------------------------------------------------------------------------------ */

static void light_rmsnorm_rope(test_ctx *t, backend *be, rng *r) {
    tv_arena b;
    tv_arena_init(&b, 4 << 20);
    const int64_t n = 1024, rows = 70;
    float *x = tv_arena_take(&b, (size_t)(n * rows) * 4), *d = tv_arena_take(&b, (size_t)(n * rows) * 4);
    float *w = tv_arena_take(&b, (size_t)n * 4);
    fill_f32(r, x, n * rows, 3.0f);
    fill_f32(r, w, n, 1.0f);
    tensor tx = tensor_2d(QUANT_TYPE_F32, x, n, rows), td = tensor_2d(QUANT_TYPE_F32, d, n, rows);
    tensor tw = tensor_1d(QUANT_TYPE_F32, w, n);
    backend_op op = mkop(BACKEND_OP_RMSNORM, td, &tx, &tw);
    op.f[0] = 1e-6f;
    check_op(t, be, &op, &b, "rmsnorm", false, 1e-6, 1e-5);
    op = mkop(BACKEND_OP_RMSNORM, tx, &tx, &tw);
    op.f[0] = 1e-5f;
    check_op(t, be, &op, &b, "rmsnorm in place", false, 1e-6, 1e-5);
    tensor xh = tensor_reshape_2d(&tx, 128, 8 * rows);
    op = mkop(BACKEND_OP_RMSNORM, xh, &xh, NULL);
    op.f[0] = 1e-6f;
    check_op(t, be, &op, &b, "rmsnorm per head", false, 1e-6, 1e-5);
    tensor x33 = tensor_2d(QUANT_TYPE_F32, x, 33, 5);
    op = mkop(BACKEND_OP_RMSNORM, tensor_2d(QUANT_TYPE_F32, d, 33, 5), &x33, NULL);
    check_op(t, be, &op, &b, "rmsnorm 33 x 5", false, 1e-6, 1e-5);
    /* rope [128, 16, 40]: plain, strided positions with n_rot 64 in place, large positions; each
     * case on arrays of its own size (the blob is never written: both runs work on copies) */
    const int64_t hd = 128, nh = 16, n_tok = 40;
    float *xr = tv_arena_take(&b, (size_t)(hd * nh * n_tok) * 4), *dr = tv_arena_take(&b, (size_t)(hd * nh * n_tok) * 4);
    fill_f32(r, xr, hd * nh * n_tok, 3.0f);
    int32_t *pos = tv_arena_take(&b, (size_t)(4 * n_tok) * sizeof(int32_t)); /* 4 sections: the strided case */
    for (int64_t i = 0; i < 4 * n_tok; i++) pos[i] = (int32_t)((i * 37) % 3000);
    tensor x3 = tensor_3d(QUANT_TYPE_F32, xr, hd, nh, n_tok), d3 = tensor_3d(QUANT_TYPE_F32, dr, hd, nh, n_tok);
    tensor tp = tensor_1d(QUANT_TYPE_I32, pos, n_tok);
    op = mkop(BACKEND_OP_ROPE_NEOX, d3, &x3, &tp);
    op.f[0] = 1000000.0f;
    check_op(t, be, &op, &b, "rope", false, 2e-5, 2e-5);
    tp.nb[0] = 16;
    op = mkop(BACKEND_OP_ROPE_NEOX, x3, &x3, &tp);
    op.f[0] = 10000.0f;
    op.i[0] = 64;
    check_op(t, be, &op, &b, "rope strided pos n_rot 64 in place", false, 2e-5, 2e-5);
    float *xl = tv_arena_take(&b, (size_t)(64 * 3 * n_tok) * 4), *dl = tv_arena_take(&b, (size_t)(64 * 3 * n_tok) * 4);
    fill_f32(r, xl, 64 * 3 * n_tok, 3.0f);
    int32_t *pos_l = tv_arena_take(&b, (size_t)n_tok * sizeof(int32_t));
    for (int64_t i = 0; i < n_tok; i++) pos_l[i] = (int32_t)(40000 - i * 1000);
    tensor x6 = tensor_3d(QUANT_TYPE_F32, xl, 64, 3, n_tok), d6 = tensor_3d(QUANT_TYPE_F32, dl, 64, 3, n_tok);
    tp = tensor_1d(QUANT_TYPE_I32, pos_l, n_tok);
    op = mkop(BACKEND_OP_ROPE_NEOX, d6, &x6, &tp);
    op.f[0] = 10000.0f;
    check_op(t, be, &op, &b, "rope large positions", false, 1e-4, 1e-4);
    /* NORM pairing (i[1] = 1, arch llama: adjacent pairs (2i, 2i + 1)): every dim rotated, then
     * n_rot 96 in place with strided positions (dims 96..127 copied) */
    tp = tensor_1d(QUANT_TYPE_I32, pos, n_tok);
    op = mkop(BACKEND_OP_ROPE_NEOX, d3, &x3, &tp);
    op.f[0] = 500000.0f;
    op.i[1] = 1;
    check_op(t, be, &op, &b, "rope norm", false, 2e-5, 2e-5);
    tp.nb[0] = 16;
    op = mkop(BACKEND_OP_ROPE_NEOX, x3, &x3, &tp);
    op.f[0] = 10000.0f;
    op.i[0] = 96;
    op.i[1] = 1;
    check_op(t, be, &op, &b, "rope norm strided pos n_rot 96 in place", false, 2e-5, 2e-5);
    tv_arena_free(&b);
}

static void light_rows(test_ctx *t, backend *be, rng *r) {
    tv_arena b;
    tv_arena_init(&b, 1 << 20);
    /* set_rows into F32 / F16 / BF16 with I32 / I64 indices, and into a column view */
    const int64_t n = 100, n_dst = 50, n_src = 7;
    float *src = tv_arena_take(&b, (size_t)(n * n_src) * 4);
    fill_f32(r, src, n * n_src, 100.0f);
    src[3] = 70000.0f; /* f16 overflow: inf in both */
    int32_t *i32 = tv_arena_take(&b, (size_t)n_src * 4);
    int64_t *i64 = tv_arena_take(&b, (size_t)n_src * 8);
    for (int64_t i = 0; i < n_src; i++) i32[i] = (int32_t)((i * 13 + 5) % n_dst), i64[i] = (i * 29 + 1) % n_dst;
    tensor ts = tensor_2d(QUANT_TYPE_F32, src, n, n_src);
    const uint32_t dts[3] = {QUANT_TYPE_F32, QUANT_TYPE_F16, QUANT_TYPE_BF16};
    for (int k = 0; k < 3; k++) {
        void *dst = tv_arena_take(&b, quant_row_size(dts[k], n) * (size_t)n_dst);
        tensor td = tensor_2d(dts[k], dst, n, n_dst);
        tensor ti = k == 1 ? tensor_1d(QUANT_TYPE_I64, i64, n_src) : tensor_1d(QUANT_TYPE_I32, i32, n_src);
        backend_op op = mkop(BACKEND_OP_SET_ROWS, td, &ts, &ti);
        check_op(t, be, &op, &b, "set_rows", true, 0, 0);
    }
    float *feat = tv_arena_take(&b, (size_t)(3 * n * 20) * 4); /* [3n, 20]: columns [n, 2n) of each row */
    const int64_t ne[4] = {n, 20, 1, 1};
    const size_t nb[4] = {4, (size_t)(3 * n) * 4, (size_t)(3 * n * 20) * 4, (size_t)(3 * n * 20) * 4};
    tensor tf = tensor_2d(QUANT_TYPE_F32, feat, 3 * n, 20);
    tensor cols = tensor_view(&tf, ne, nb, (size_t)n * 4);
    int32_t *i20 = tv_arena_take(&b, (size_t)n_src * 4);
    for (int64_t i = 0; i < n_src; i++) i20[i] = (int32_t)((i * 3 + 2) % 20);
    tensor ti = tensor_1d(QUANT_TYPE_I32, i20, n_src);
    backend_op op = mkop(BACKEND_OP_SET_ROWS, cols, &ts, &ti);
    check_op(t, be, &op, &b, "set_rows into columns", true, 0, 0);
    /* get_rows of every weight type (repeated and reversed indices) */
    for (size_t k = 0; k < sizeof(k_mm_types) / sizeof(k_mm_types[0]); k++) {
        const int64_t ne0 = 512, rows = 9;
        uint8_t *w = tv_arena_take(&b, quant_row_size(k_mm_types[k], ne0) * rows);
        fill_weight(r, k_mm_types[k], w, ne0, rows);
        int32_t *idx = tv_arena_take(&b, 6 * 4);
        const int32_t iv[6] = {8, 0, 3, 3, 7, 1};
        memcpy(idx, iv, sizeof(iv));
        float *out = tv_arena_take(&b, (size_t)(ne0 * 6) * 4);
        tensor tw = tensor_2d(k_mm_types[k], w, ne0, rows), tix = tensor_1d(QUANT_TYPE_I32, idx, 6);
        op = mkop(BACKEND_OP_GET_ROWS, tensor_2d(QUANT_TYPE_F32, out, ne0, 6), &tw, &tix);
        char what[64];
        snprintf(what, sizeof(what), "get_rows %s", quant_type_get(k_mm_types[k])->name);
        check_op(t, be, &op, &b, what, false, 1e-7, 1e-6);
    }
    tv_arena_free(&b);
}

static void light_elementwise(test_ctx *t, backend *be, rng *r) {
    tv_arena b;
    tv_arena_init(&b, 1 << 20);
    float *a = tv_arena_take(&b, 37 * 5 * 3 * 4), *bb = tv_arena_take(&b, 37 * 5 * 3 * 4), *d = tv_arena_take(&b, 37 * 5 * 3 * 4);
    fill_f32(r, a, 37 * 15, 2.0f);
    fill_f32(r, bb, 37 * 15, 2.0f);
    tensor ta = tensor_3d(QUANT_TYPE_F32, a, 37, 5, 3), td = tensor_3d(QUANT_TYPE_F32, d, 37, 5, 3);
    const int64_t bshapes[4][3] = {{37, 5, 3}, {37, 1, 3}, {1, 5, 1}, {37, 1, 1}};
    for (int k = 0; k < 4; k++) {
        tensor tb = tensor_3d(QUANT_TYPE_F32, bb, bshapes[k][0], bshapes[k][1], bshapes[k][2]);
        backend_op op = mkop(BACKEND_OP_ADD, td, &ta, &tb);
        check_op(t, be, &op, &b, "add broadcast", true, 0, 0);
        op = mkop(BACKEND_OP_MUL, ta, &ta, &tb);
        check_op(t, be, &op, &b, "mul broadcast in place", true, 0, 0);
    }
    tensor g = tensor_2d(QUANT_TYPE_F32, a, 185, 3), u = tensor_2d(QUANT_TYPE_F32, bb, 185, 3);
    backend_op op = mkop(BACKEND_OP_SWIGLU, tensor_2d(QUANT_TYPE_F32, d, 185, 3), &g, &u);
    check_op(t, be, &op, &b, "swiglu", false, 1e-7, 2e-6);
    op = mkop(BACKEND_OP_SCALE, td, &ta, NULL);
    op.f[0] = -0.37f;
    check_op(t, be, &op, &b, "scale", true, 0, 0);
    /* softmax with -inf entries and a fully masked row */
    float *s = tv_arena_take(&b, 1000 * 4 * 4);
    fill_f32(r, s, 4000, 20.0f);
    for (int i = 0; i < 1000; i += 3) s[1000 + i] = -INFINITY;
    for (int i = 0; i < 1000; i++) s[2000 + i] = -INFINITY;
    tensor tsm = tensor_2d(QUANT_TYPE_F32, s, 1000, 4);
    op = mkop(BACKEND_OP_SOFTMAX, tsm, &tsm, NULL);
    check_op(t, be, &op, &b, "softmax", false, 1e-8, 2e-6);
    /* argmax with ties (first wins) and -inf rows */
    float *am = tv_arena_take(&b, 151 * 9 * 4);
    fill_f32(r, am, 151 * 9, 1.0f);
    am[151 * 2 + 40] = am[151 * 2 + 90] = 50.0f;
    for (int i = 0; i < 151; i++) am[151 * 3 + i] = -INFINITY;
    for (int i = 0; i < 151; i++) am[151 * 4 + i] = 1.0f;
    int32_t *ai = tv_arena_take(&b, 9 * 4);
    tensor tam = tensor_2d(QUANT_TYPE_F32, am, 151, 9);
    op = mkop(BACKEND_OP_ARGMAX, tensor_1d(QUANT_TYPE_I32, ai, 9), &tam, NULL);
    check_op(t, be, &op, &b, "argmax", true, 0, 0);
    /* copy between every pair of F32 / F16 / BF16, into a strided (cache-like) view */
    const uint32_t cts[3] = {QUANT_TYPE_F32, QUANT_TYPE_F16, QUANT_TYPE_BF16};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) {
            uint8_t *sp = tv_arena_take(&b, 70 * 12 * 4), *dp = tv_arena_take(&b, 80 * 12 * 4);
            float tmp[70 * 12];
            fill_f32(r, tmp, 70 * 12, 4.0f);
            tensor tsrc = tensor_2d(cts[i], sp, 70, 12);
            for (int k = 0; k < 70 * 12; k++) {
                if (cts[i] == QUANT_TYPE_F32) memcpy(sp + 4 * k, &tmp[k], 4);
                else { uint16_t h = cts[i] == QUANT_TYPE_F16 ? fp32_to_fp16(tmp[k]) : fp32_to_bf16(tmp[k]); memcpy(sp + 2 * k, &h, 2); }
            }
            tensor tdst = tensor_2d(cts[j], dp, 70, 12);
            tdst.nb[1] = quant_row_size(cts[j], 80);
            tdst.nb[2] = tdst.nb[3] = tdst.nb[1] * 12;
            op = mkop(BACKEND_OP_COPY, tdst, &tsrc, NULL);
            check_op(t, be, &op, &b, "copy", true, 0, 0);
        }
    }
    tv_arena_free(&b);
}

TEST(cuda_op_light_vs_ref) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {31337};
    light_rmsnorm_rope(t, e.be, &r);
    light_rows(t, e.be, &r);
    light_elementwise(t, e.be, &r);
    env_close(t, &e);
}

/* ---- attention ------------------------------------------------------------------------------------ */

typedef struct attn_layout {
    tv_arena b;
    backend_op op;
} attn_layout;

/* q [hd, nh, nq], a cache of cap >= n_kv cells (strided views), mask [n_kv, nq] of kind
 * 0 none, 1 causal (the last nq cells are the queries'), 2 two interleaved sequences,
 * 3 a fully masked first row and soft biases. */
static void attn_make(attn_layout *L, rng *r, uint32_t kvtype, int64_t hd, int64_t nh, int64_t nh_kv, int64_t nq,
                      int64_t n_kv, int mask_kind) {
    const int64_t cap = n_kv + 5;
    const size_t esz = kvtype == QUANT_TYPE_F16 ? 2 : 4;
    tv_arena_init(&L->b, (size_t)(hd * nh * nq * 8) + (size_t)(hd * nh_kv * cap) * esz * 2 + (size_t)(n_kv * nq) * 4 + 8192);
    float *q = tv_arena_take(&L->b, (size_t)(hd * nh * nq) * 4);
    uint8_t *kc = tv_arena_take(&L->b, (size_t)(hd * nh_kv * cap) * esz), *vc = tv_arena_take(&L->b, (size_t)(hd * nh_kv * cap) * esz);
    float *mask = tv_arena_take(&L->b, (size_t)(n_kv * nq) * 4);
    float *out = tv_arena_take(&L->b, (size_t)(hd * nh * nq) * 4);
    fill_f32(r, q, hd * nh * nq, 2.0f);
    for (int64_t i = 0; i < hd * nh_kv * cap; i++) {
        const float kv = rng_f(r) * 2.0f, vv = rng_f(r);
        if (esz == 2) {
            uint16_t a = fp32_to_fp16(kv), c = fp32_to_fp16(vv);
            memcpy(kc + 2 * i, &a, 2);
            memcpy(vc + 2 * i, &c, 2);
        } else {
            memcpy(kc + 4 * i, &kv, 4);
            memcpy(vc + 4 * i, &vv, 4);
        }
    }
    for (int64_t iq = 0; iq < nq; iq++) {
        for (int64_t j = 0; j < n_kv; j++) {
            float m = 0.0f;
            if (mask_kind == 1 && j > n_kv - nq + iq) m = -INFINITY;
            if (mask_kind == 2 && (j % 2) != (iq % 2)) m = -INFINITY;
            if (mask_kind == 3 && iq == 0) m = -INFINITY;
            if (mask_kind == 3 && iq != 0 && j % 3 == 0) m = -1.5f;
            mask[iq * n_kv + j] = m;
        }
    }
    memset(out, 0xff, (size_t)(hd * nh * nq) * 4);
    memset(&L->op, 0, sizeof(L->op));
    L->op.kind = BACKEND_OP_ATTENTION;
    L->op.src[0] = tensor_3d(QUANT_TYPE_F32, q, hd, nh, nq);
    L->op.src[1] = tensor_3d(kvtype, kc, hd, nh_kv, n_kv);
    L->op.src[2] = tensor_3d(kvtype, vc, hd, nh_kv, n_kv);
    L->op.src[3] = tensor_2d(QUANT_TYPE_F32, mask, n_kv, nq);
    L->op.dst = tensor_3d(QUANT_TYPE_F32, out, hd, nh, nq);
}

TEST(cuda_op_attention_vs_ref) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {8};
    /* (hd, nh, nh_kv, nq, n_kv): small, decode over several splits, verification, GQA 32/8,
     * a prompt-sized causal block */
    static const int64_t cases[][5] = {
        {64, 4, 2, 5, 37}, {128, 32, 8, 1, 600}, {128, 32, 8, 16, 300}, {16, 2, 1, 70, 70}, {80, 6, 3, 3, 513},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int mk = 0; mk < 4; mk++) {
            for (int f16 = 0; f16 < 2; f16++) {
                attn_layout L;
                const uint32_t kvt = f16 ? QUANT_TYPE_F16 : QUANT_TYPE_F32;
                attn_make(&L, &r, kvt, cases[c][0], cases[c][1], cases[c][2], cases[c][3], cases[c][4], mk);
                char what[160];
                snprintf(what, sizeof(what), "attention %s hd %lld nh %lld/%lld nq %lld n_kv %lld mask %d", f16 ? "f16" : "f32",
                         (long long)cases[c][0], (long long)cases[c][1], (long long)cases[c][2], (long long)cases[c][3],
                         (long long)cases[c][4], mk);
                /* f16 V: the reference rounds the normalized probabilities to f16; the kernel must
                 * too. A probability whose rounding goes the other way (the f32 values differ by a
                 * few ulps) moves an output by one f16 ulp of p times |v| (<= 2^-11 * p), which the
                 * max bound allows. A host emulation of the kernel on these
                 * cases: mean error <= 4e-7 with the rounding (also with p off by 4 f32 ulps), >= 2.9e-6
                 * without it */
                check_op_mean(t, e.be, &L.op, &L.b, what, false, f16 ? 1e-3 : 3e-5, 2e-5, f16 ? 1e-6 : INFINITY);
                if (mk == 3) {
                    uint8_t *got = run_dev(t, e.be, &L.op, &L.b, what);
                    if (got != NULL) {
                        const float *o = (const float *)(got + ((uint8_t *)L.op.dst.data - L.b.mem));
                        for (int64_t i = 0; i < cases[c][0] * cases[c][1]; i++) {
                            if (o[i] != 0.0f) {
                                test_fail(t, __FILE__, __LINE__, "%s: the fully masked row is not zero", what);
                                break;
                            }
                        }
                    }
                    free(got);
                }
                tv_arena_free(&L.b);
            }
        }
    }
    env_close(t, &e);
}

/* Structured mask kinds (no mask tensor: the kernel computes the visible cells from the row index)
 * give the same bits as the op with the mask tensor of that kind (causal: mask kind 1; full: no
 * masked cell), over one split and several, F16 and F32 caches. */
TEST(cuda_op_attention_structured_masks) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {77};
    static const int64_t cases[][5] = {
        {64, 4, 2, 5, 37}, {128, 32, 8, 16, 300}, {16, 2, 1, 70, 70}, {80, 6, 3, 3, 513}, {128, 8, 2, 1, 600},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int32_t kind = BACKEND_ATTN_CAUSAL; kind <= BACKEND_ATTN_FULL; kind++) {
            for (int f16 = 0; f16 < 2; f16++) {
                attn_layout L;
                attn_make(&L, &r, f16 ? QUANT_TYPE_F16 : QUANT_TYPE_F32, cases[c][0], cases[c][1], cases[c][2],
                          cases[c][3], cases[c][4], kind == BACKEND_ATTN_CAUSAL ? 1 : 0);
                char what[160];
                snprintf(what, sizeof(what), "attention %s %s hd %lld nh %lld/%lld nq %lld n_kv %lld",
                         kind == BACKEND_ATTN_CAUSAL ? "causal" : "full", f16 ? "f16" : "f32", (long long)cases[c][0],
                         (long long)cases[c][1], (long long)cases[c][2], (long long)cases[c][3], (long long)cases[c][4]);
                uint8_t *with_mask = run_dev(t, e.be, &L.op, &L.b, what);
                backend_op sop = L.op;
                sop.src[3] = tensor_2d(QUANT_TYPE_F32, NULL, cases[c][4], cases[c][3]);
                sop.i[0] = kind;
                uint8_t *structured = run_dev(t, e.be, &sop, &L.b, what);
                if (with_mask != NULL && structured != NULL) {
                    const size_t off = (size_t)((uint8_t *)L.op.dst.data - L.b.mem);
                    CHECK_MSG(memcmp(with_mask + off, structured + off, tensor_nbytes(&L.op.dst)) == 0,
                              "%s: structured differs from the mask tensor", what);
                }
                free(with_mask);
                free(structured);
                tv_arena_free(&L.b);
            }
        }
    }
    env_close(t, &e);
}

/* A query row gives the same bits alone as inside a 16-row op, and over exactly its visible cells
 * (decode) as inside a causal verification op over more cells. */
TEST(cuda_op_attention_row_invariance) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {99};
    attn_layout L;
    attn_make(&L, &r, QUANT_TYPE_F16, 128, 32, 8, 16, 700, 1);
    uint8_t *full = run_dev(t, e.be, &L.op, &L.b, "attention 16 rows");
    REQUIRE(full != NULL);
    const size_t off = (size_t)((uint8_t *)L.op.dst.data - L.b.mem);
    const size_t row_bytes = (size_t)(128 * 32) * 4;
    for (int64_t iq = 0; iq < 16; iq += 5) {
        backend_op op = L.op;
        op.src[0].data = (uint8_t *)op.src[0].data + (size_t)iq * op.src[0].nb[2];
        op.src[0].ne[2] = 1;
        op.src[3].data = (uint8_t *)op.src[3].data + (size_t)iq * op.src[3].nb[1];
        op.src[3].ne[1] = 1;
        op.dst.data = (uint8_t *)op.dst.data + (size_t)iq * op.dst.nb[2];
        op.dst.ne[2] = 1;
        uint8_t *one = run_dev(t, e.be, &op, &L.b, "attention 1 row");
        if (one != NULL) {
            CHECK_MSG(memcmp(one + off + (size_t)iq * row_bytes, full + off + (size_t)iq * row_bytes, row_bytes) == 0,
                      "query row %lld alone differs from the same row in a 16-row op", (long long)iq);
        }
        free(one);
    }
    free(full);
    tv_arena_free(&L.b);
    /* decode vs verification: a causal 16-row op over 260 cells (two splits) against each row
     * alone over exactly the cells it sees (245 + i: one split for the first rows) */
    attn_make(&L, &r, QUANT_TYPE_F16, 128, 8, 2, 16, 260, 1);
    full = run_dev(t, e.be, &L.op, &L.b, "attention 16 rows causal");
    REQUIRE(full != NULL);
    const size_t off2 = (size_t)((uint8_t *)L.op.dst.data - L.b.mem);
    const size_t row2 = (size_t)(128 * 8) * 4;
    for (int64_t iq = 0; iq < 16; iq += 3) {
        backend_op op = L.op;
        const int64_t n_kv = 245 + iq;
        op.src[0].data = (uint8_t *)op.src[0].data + (size_t)iq * op.src[0].nb[2];
        op.src[0].ne[2] = 1;
        op.src[1].ne[2] = n_kv;
        op.src[2].ne[2] = n_kv;
        op.src[3].data = (uint8_t *)op.src[3].data + (size_t)iq * op.src[3].nb[1];
        op.src[3].ne[0] = n_kv;
        op.src[3].ne[1] = 1;
        op.dst.data = (uint8_t *)op.dst.data + (size_t)iq * op.dst.nb[2];
        op.dst.ne[2] = 1;
        uint8_t *one = run_dev(t, e.be, &op, &L.b, "attention decode row");
        if (one != NULL) {
            CHECK_MSG(memcmp(one + off2 + (size_t)iq * row2, full + off2 + (size_t)iq * row2, row2) == 0,
                      "row %lld over its %lld cells differs from the same row in the causal 16-row op", (long long)iq,
                      (long long)n_kv);
        }
        free(one);
    }
    free(full);
    tv_arena_free(&L.b);
    env_close(t, &e);
}

/* A NaN or +Inf score is never hidden: the softmax row and the attention output are NaN, as the
 * CPU reference (one split and several, f32 and f16 caches); an all -Inf row still gives zeros. */
TEST(cuda_op_nonfinite_scores_propagate) {
    cu_env e;
    if (!env_open(t, &e, true)) return;
    rng r = {21};
    tv_arena b;
    tv_arena_init(&b, 1 << 16);
    float *s = tv_arena_take(&b, 300 * 3 * 4);
    fill_f32(&r, s, 900, 5.0f);
    s[17] = NAN;
    s[300 + 299] = INFINITY;
    for (int i = 0; i < 300; i++) s[600 + i] = -INFINITY;
    tensor ts = tensor_2d(QUANT_TYPE_F32, s, 300, 3);
    backend_op op = mkop(BACKEND_OP_SOFTMAX, ts, &ts, NULL);
    uint8_t *got = run_dev(t, e.be, &op, &b, "softmax non-finite");
    if (got != NULL) {
        const float *o = (const float *)(got + ((uint8_t *)s - b.mem));
        for (int i = 0; i < 600; i++) CHECK_MSG(isnan(o[i]), "softmax row %d col %d = %g", i / 300, i % 300, o[i]);
        for (int i = 600; i < 900; i++) CHECK(o[i] == 0.0f);
    }
    free(got);
    tv_arena_free(&b);
    static const int64_t cases[][5] = {{64, 4, 2, 3, 37}, {64, 4, 2, 1, 600}};
    for (size_t c = 0; c < 2; c++) {
        for (int f16 = 0; f16 < 2; f16++) {
            attn_layout L;
            attn_make(&L, &r, f16 ? QUANT_TYPE_F16 : QUANT_TYPE_F32, cases[c][0], cases[c][1], cases[c][2], cases[c][3],
                      cases[c][4], 0);
            float *q = (float *)L.op.src[0].data;
            q[0] = NAN; /* head 0 of query 0 */
            got = run_dev(t, e.be, &L.op, &L.b, "attention non-finite");
            if (got != NULL) {
                const float *o = (const float *)(got + ((uint8_t *)L.op.dst.data - L.b.mem));
                const int64_t hd = cases[c][0];
                for (int64_t i = 0; i < hd; i++) CHECK_MSG(isnan(o[i]), "case %zu f16 %d: out[%lld] = %g", c, f16, (long long)i, o[i]);
                CHECK(!isnan(o[hd])); /* head 1 is untouched */
            }
            free(got);
            tv_arena_free(&L.b);
        }
    }
    env_close(t, &e);
}
