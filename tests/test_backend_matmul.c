/* test_backend_matmul.c: the CPU matmul against its scalar references on awkward sizes, for each
 * CPU feature level this machine has (scalar, avx2, avx512): the quantized-activation path against a
 * scalar reference of that same quantized computation, thread-count and batch invariance, the fused
 * matmul + argmax head, and the activation quantizer's rounding rules.
 *
 * matmul error budgets, as |y - y_ref| <= budget * N with N = sum_i |w_i| * max_i |x_i| (a bound
 * on what activation rounding can change; y_ref uses f32 activations and dequantized weights):
 *   f32 1e-6 (sum order only), f16 7e-4 (x rounded to f16: 2^-11), bf16 5e-3 (x to bf16: 2^-8),
 *   q8_0 / q4_0 5e-3 (x to Q8_0: d/2 = amax/254, plus d stored as f16), q4_K / q6_K 5e-3 (Q8_K).
 * The optimized kernels against cpu_matmul_q_ref (same quantized activations, exact integer block
 * sums in f64): |y - y_q| <= 2^-22 * (n_in / 32 + 8) * N (f32 rounding of scale products and
 * sums only); the prepared activations must be byte-identical to the scalar preparation.
 * Every comparison fails on a non-finite value. */
#include "test.h"
#include "test_backend_util.h"
#include "test_views.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops_ref.h"
#include "base/error.h"
#include "base/fp16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

TEST(backend_matmul_vs_ref) {
    rng r = {12345};
    for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
        const uint32_t type = k_mm_types[ti];
        const bool k256 = quant_type_get(type)->blck_size == 256;
        const mm_case *cases = k256 ? k_cases_256 : k_cases_32;
        const size_t n_cases = k256 ? sizeof(k_cases_256) / sizeof(mm_case) : sizeof(k_cases_32) / sizeof(mm_case);
        for (size_t ci = 0; ci < n_cases; ci++) {
            const mm_case c = cases[ci];
            if (c.n_in % quant_type_get(type)->blck_size != 0) continue;
            void *w = make_weight(&r, type, c.n_in, c.n_out);
            float *x = malloc((size_t)(c.n_in * c.n_rows) * sizeof(float));
            float *y = malloc((size_t)(c.n_out * c.n_rows) * sizeof(float));
            float *yref = malloc((size_t)(c.n_out * c.n_rows) * sizeof(float));
            double *N = malloc((size_t)(c.n_out * c.n_rows) * sizeof(double));
            REQUIRE(w && x && y && yref && N);
            fill_f32(&r, x, c.n_in * c.n_rows, 2.0f);
            if (c.n_rows >= 3) memset(x + c.n_in, 0, (size_t)c.n_in * sizeof(float)); /* a zero row */
            backend_op op;
            memset(&op, 0, sizeof(op));
            op.kind = BACKEND_OP_MATMUL;
            op.dst = tensor_2d(QUANT_TYPE_F32, yref, c.n_out, c.n_rows);
            op.src[0] = tensor_2d(type, w, c.n_in, c.n_out);
            op.src[1] = tensor_2d(QUANT_TYPE_F32, x, c.n_in, c.n_rows);
            REQUIRE(tv_view_check(t, &op.dst, yref, (size_t)(c.n_out * c.n_rows) * 4, "matmul", "dst") &&
                    tv_view_check(t, &op.src[0], w, quant_row_size(type, c.n_in) * (size_t)c.n_out, "matmul", "w") &&
                    tv_view_check(t, &op.src[1], x, (size_t)(c.n_in * c.n_rows) * 4, "matmul", "x"));
            cpu_op_matmul_ref(&op);
            mm_norms(N, type, w, c.n_in, c.n_out, x, c.n_rows);
            for (int level = 0; level < TEST_LEVELS; level++) {
                if (!level_available(level)) continue;
                backend *be = make_backend(2, level, false);
                REQUIRE(be != NULL);
                memset(y, 0xff, (size_t)(c.n_out * c.n_rows) * sizeof(float)); /* NaN poison */
                mm_run(be, type, w, c.n_in, c.n_out, x, c.n_rows, y);
                for (int64_t i = 0; i < c.n_out * c.n_rows; i++) {
                    const double d = fabs((double)y[i] - (double)yref[i]);
                    if (!isfinite(y[i]) || d > mm_budget(type) * N[i]) {
                        test_fail(t, __FILE__, __LINE__,
                                  "matmul %s %s [%lld -> %lld] x %lld rows: out %lld: %.8g vs ref %.8g (budget %.3g)",
                                  quant_type_get(type)->name, k_level_names[level], (long long)c.n_in,
                                  (long long)c.n_out, (long long)c.n_rows, (long long)i, y[i], yref[i],
                                  mm_budget(type) * N[i]);
                        break;
                    }
                }
                backend_free(be);
            }
            free(w); free(x); free(y); free(yref); free(N);
        }
    }
}

/* The optimized preparation and kernels against the scalar reference of the same computation. */
TEST(backend_matmul_quantized_path_exact) {
    rng r = {777};
    for (int level = 1; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        cpu_kernels ks, kref;
        cpu_kernels_select(&ks, cpu_features_detect() & ~level_disable(level));
        cpu_kernels_init_ref(&kref);
        for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
            const uint32_t type = k_mm_types[ti];
            const bool k256 = quant_type_get(type)->blck_size == 256;
            const mm_case *cases = k256 ? k_cases_256 : k_cases_32;
            const size_t n_cases = k256 ? sizeof(k_cases_256) / sizeof(mm_case) : sizeof(k_cases_32) / sizeof(mm_case);
            for (size_t ci = 0; ci < n_cases; ci++) {
                const mm_case c = cases[ci];
                if (c.n_in % quant_type_get(type)->blck_size != 0) continue;
                const cpu_dot_type dot = cpu_dot_type_of(type);
                const size_t bytes = cpu_act_bytes(dot, c.n_in, c.n_rows);
                void *m1 = aligned_alloc(64, bytes), *m2 = aligned_alloc(64, bytes);
                float *x = malloc((size_t)(c.n_in * c.n_rows) * sizeof(float));
                float *y = malloc((size_t)(c.n_out * c.n_rows) * sizeof(float));
                float *yq = malloc((size_t)(c.n_out * c.n_rows) * sizeof(float));
                double *N = malloc((size_t)(c.n_out * c.n_rows) * sizeof(double));
                void *w = make_weight(&r, type, c.n_in, c.n_out);
                REQUIRE(m1 && m2 && x && y && yq && N);
                memset(m1, 0, bytes);
                memset(m2, 0, bytes);
                fill_f32(&r, x, c.n_in * c.n_rows, 3.0f);
                if (c.n_rows >= 2) memset(x, 0, (size_t)c.n_in * sizeof(float));
                /* exact ties for the rounding: values k + 0.5 steps of the block scale */
                if (c.n_rows >= 3) {
                    for (int64_t i = 0; i < c.n_in; i++) x[2 * c.n_in + i] = (float)((int)(i % 64) - 32) * 0.5f + 0.25f;
                }
                cpu_act a1, a2;
                cpu_act_layout(&a1, dot, c.n_in, c.n_rows, m1);
                cpu_act_layout(&a2, dot, c.n_in, c.n_rows, m2);
                for (int64_t row = 0; row < c.n_rows; row++) {
                    ks.act_row[type](&a1, row, x + row * c.n_in);
                    kref.act_row[type](&a2, row, x + row * c.n_in);
                }
                CHECK_MSG(memcmp(m1, m2, bytes) == 0, "prepared activations %s %s differ from the scalar ones (%lld x %lld)",
                          quant_type_get(type)->name, k_level_names[level], (long long)c.n_in, (long long)c.n_rows);
                const size_t wrow = quant_row_size(type, c.n_in);
                ks.matmul[type](w, wrow, &a1, 0, c.n_rows, y, c.n_out, 0, c.n_out);
                cpu_matmul_q_ref(type, w, wrow, &a2, 0, c.n_rows, yq, c.n_out, 0, c.n_out);
                mm_norms(N, type, w, c.n_in, c.n_out, x, c.n_rows);
                const double eps = ldexp(1.0, -22) * (double)(c.n_in / 32 + 8);
                for (int64_t i = 0; i < c.n_out * c.n_rows; i++) {
                    if (!isfinite(y[i]) || fabs((double)y[i] - (double)yq[i]) > eps * N[i]) {
                        test_fail(t, __FILE__, __LINE__, "kernel %s %s [%lld -> %lld] x %lld: out %lld: %.9g vs %.9g",
                                  quant_type_get(type)->name, k_level_names[level], (long long)c.n_in,
                                  (long long)c.n_out, (long long)c.n_rows, (long long)i, y[i], yq[i]);
                        break;
                    }
                }
                /* sub-ranges of rows and outputs give the same values */
                if (c.n_out >= 7 && c.n_rows >= 3) {
                    float *y2 = malloc((size_t)(c.n_out * c.n_rows) * sizeof(float));
                    REQUIRE(y2);
                    memcpy(y2, y, (size_t)(c.n_out * c.n_rows) * sizeof(float));
                    ks.matmul[type](w, wrow, &a1, 1, c.n_rows - 2, y2, c.n_out, 3, c.n_out - 1);
                    CHECK_MSG(memcmp(y, y2, (size_t)(c.n_out * c.n_rows) * sizeof(float)) == 0,
                              "kernel %s %s: a sub-range gives other values", quant_type_get(type)->name,
                              k_level_names[level]);
                    free(y2);
                }
                free(m1); free(m2); free(x); free(y); free(yq); free(N); free(w);
            }
        }
    }
}

TEST(backend_matmul_threads_identical) {
    rng r = {99};
    enum { N_IN = 512, N_OUT = 301, N_ROWS = 5 };
    static float x[N_IN * N_ROWS], y1[N_OUT * N_ROWS], y[N_OUT * N_ROWS];
    fill_f32(&r, x, N_IN * N_ROWS, 1.0f);
    for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
        const uint32_t type = k_mm_types[ti];
        void *w = make_weight(&r, type, N_IN, N_OUT);
        REQUIRE(w);
        for (int64_t rows = 1; rows <= N_ROWS; rows += N_ROWS - 1) {
            backend *be1 = make_backend(1, 2, false);
            REQUIRE(be1);
            mm_run(be1, type, w, N_IN, N_OUT, x, rows, y1);
            backend_free(be1);
            for (int nt = 2; nt <= 3; nt++) {
                backend *be = make_backend(nt, 2, false);
                REQUIRE(be);
                memset(y, 0, sizeof(y));
                mm_run(be, type, w, N_IN, N_OUT, x, rows, y);
                CHECK_MSG(memcmp(y, y1, (size_t)(N_OUT * rows) * sizeof(float)) == 0,
                          "matmul %s, %lld rows: %d threads differ from 1 thread", quant_type_get(type)->name,
                          (long long)rows, nt);
                backend_free(be);
            }
        }
        free(w);
    }
}

/* ---- matmul + argmax (the drafter's greedy head) --------------------------------------------- */

/* op_matmul_argmax gives the ids of op_matmul + op_scale + op_argmax on the same backend, for
 * every weight type and level, 1-3 threads, one chunk or dozens: a max tied across chunks (a
 * weight row copied into the first and the last chunk: the first index wins), a negative scale,
 * a NaN weight row in a late chunk and a NaN activation row (flagged -1 - first index). With a
 * logits tensor (op_matmul_argmax_logits) the same ids, and the logits of op_matmul + op_scale
 * bit for bit. */
static void mmax_case(test_ctx *t, rng *r, backend *be, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_rows,
                      float scale, const char *lv) {
    void *w = make_weight(r, type, n_in, n_out);
    float *x = malloc((size_t)(n_in * n_rows) * sizeof(float)), *lg = malloc((size_t)(n_out * n_rows) * 4);
    float *lg2 = malloc((size_t)(n_out * n_rows) * 4);
    int32_t ids[3][64];
    REQUIRE(w && x && lg && lg2 && n_rows <= 64);
    fill_f32(r, x, n_in * n_rows, 1.0f);
    const size_t row = quant_row_size(type, n_in);
    backend_op mm, sc, am, fu, fl;
    memset(&mm, 0, sizeof(mm));
    mm.kind = BACKEND_OP_MATMUL;
    mm.dst = tensor_2d(QUANT_TYPE_F32, lg, n_out, n_rows);
    mm.src[0] = tensor_2d(type, w, n_in, n_out);
    mm.src[1] = tensor_2d(QUANT_TYPE_F32, x, n_in, n_rows);
    sc = mm;
    sc.kind = BACKEND_OP_SCALE;
    sc.src[0] = mm.dst;
    sc.f[0] = scale;
    memset(&am, 0, sizeof(am));
    am.kind = BACKEND_OP_ARGMAX;
    am.src[0] = mm.dst;
    am.dst = tensor_1d(QUANT_TYPE_I32, ids[0], n_rows);
    fu = mm;
    fu.kind = BACKEND_OP_MATMUL_ARGMAX;
    fu.dst = tensor_1d(QUANT_TYPE_I32, ids[1], n_rows);
    fu.f[0] = scale;
    fl = fu;
    fl.dst = tensor_1d(QUANT_TYPE_I32, ids[2], n_rows);
    fl.src[2] = tensor_2d(QUANT_TYPE_F32, lg2, n_out, n_rows);
    for (int step = 0; step < 4; step++) {
        if (step == 1 && n_out > 40) { /* row 0's max copied into rows 3 and n_out - 1: a three-way tie */
            const int64_t a = ids[0][0] >= 0 ? ids[0][0] : 0;
            memcpy((char *)w + 3 * row, (char *)w + (size_t)a * row, row);
            memcpy((char *)w + (size_t)(n_out - 1) * row, (char *)w + (size_t)a * row, row);
        }
        if (step == 2 && type == QUANT_TYPE_F32) { /* a NaN weight in a late row: every row flags it */
            const float nan = NAN;
            memcpy((char *)w + (size_t)(n_out - n_out / 3) * row + 4, &nan, 4);
        }
        /* activation row 1: all its logits NaN (f32/f16/bf16: an int8 quantizer has no NaN) */
        if (step == 3 && n_rows > 1 && quant_type_get(type)->blck_size == 1) x[n_in + 2] = NAN;
        dfl_error err = {0};
        REQUIRE(backend_op_validate(be, &fu, &err) == DFL_OK);
        REQUIRE(backend_op_validate(be, &fl, &err) == DFL_OK);
        run_op(be, &mm);
        run_op(be, &sc);
        run_op(be, &am);
        memset(ids[1], 0x55, sizeof(ids[1]));
        memset(ids[2], 0x55, sizeof(ids[2]));
        memset(lg2, 0x55, (size_t)(n_out * n_rows) * 4);
        run_op(be, &fu);
        run_op(be, &fl);
        for (int64_t i = 0; i < n_rows; i++) {
            CHECK_MSG(ids[1][i] == ids[0][i] && ids[2][i] == ids[0][i],
                      "matmul_argmax %s %s [%lld -> %lld] x %lld scale %g step %d row %lld: %d / %d (logits) vs %d",
                      quant_type_get(type)->name, lv, (long long)n_in, (long long)n_out, (long long)n_rows,
                      (double)scale, step, (long long)i, ids[1][i], ids[2][i], ids[0][i]);
        }
        CHECK_MSG(memcmp(lg2, lg, (size_t)(n_out * n_rows) * 4) == 0, "matmul_argmax_logits %s %s [%lld -> %lld] x %lld "
                  "step %d: the logits differ from op_matmul + op_scale", quant_type_get(type)->name, lv, (long long)n_in,
                  (long long)n_out, (long long)n_rows, step);
        if (step == 1 && n_out > 40) CHECK(ids[1][0] == 3 || ids[1][0] < 3);
        if (step == 2 && type == QUANT_TYPE_F32) CHECK_EQ_INT(ids[1][0], (int)(-1 - (n_out - n_out / 3)));
        if (step == 3 && n_rows > 1 && quant_type_get(type)->blck_size == 1) CHECK_EQ_INT(ids[1][1], -1);
    }
    free(w); free(x); free(lg); free(lg2);
}

TEST(backend_matmul_argmax_fused) {
    rng r = {4242};
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        for (int nt = 1; nt <= 3; nt += 2) {
            backend *be = make_backend(nt, level, false);
            REQUIRE(be);
            CHECK(backend_get_caps(be).matmul_argmax);
            for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
                const uint32_t type = k_mm_types[ti];
                mmax_case(t, &r, be, type, 256, 1000, 15, 1.0f, k_level_names[level]);
                mmax_case(t, &r, be, type, 512, 6007, 2, -0.75f, k_level_names[level]);
                mmax_case(t, &r, be, type, 256, 37, 1, 0.5f, k_level_names[level]);
                if (ti < 3) mmax_case(t, &r, be, type, 47, 1031, 40, 1.0f, k_level_names[level]);
            }
            backend_free(be);
        }
    }
    /* the reference: flags and the tie rule on a hand-made case (f32 weights, exact sums) */
    float w[4 * 3] = {1, 0, 0, 0, 2, 0, 0, 2, 0, 0, 0, 1}, x[3 * 2] = {1, 1, 0, 0, 0, NAN};
    int32_t ids[2];
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_MATMUL_ARGMAX;
    op.src[0] = tensor_2d(QUANT_TYPE_F32, w, 3, 4); /* logits of row 0: 1, 2, 2, 0 */
    op.src[1] = tensor_2d(QUANT_TYPE_F32, x, 3, 2);
    op.dst = tensor_1d(QUANT_TYPE_I32, ids, 2);
    op.f[0] = 1.0f;
    cpu_op_matmul_argmax_ref(&op);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], -1);
    op.f[0] = -1.0f; /* -1, -2, -2, 0 */
    cpu_op_matmul_argmax_ref(&op);
    CHECK_EQ_INT(ids[0], 3);
    float lgr[4 * 2];
    op.src[2] = tensor_2d(QUANT_TYPE_F32, lgr, 4, 2); /* and the logits */
    cpu_op_matmul_argmax_ref(&op);
    CHECK_EQ_INT(ids[0], 3);
    CHECK(lgr[0] == -1.0f && lgr[1] == -2.0f && lgr[2] == -2.0f && lgr[3] == 0.0f && isnan(lgr[5]));
    /* a logits tensor of the wrong shape is refused */
    backend *be = make_backend(1, 0, false);
    REQUIRE(be);
    dfl_error err = {0};
    op.src[2] = tensor_2d(QUANT_TYPE_F32, lgr, 2, 4);
    CHECK(backend_op_validate(be, &op, &err) == DFL_ERR_INVALID && strstr(err.msg, "logits") != NULL);
    backend_free(be);
}

/* ---- the threads' shares of a matmul --------------------------------------------------------- */

/* Each thread runs its own contiguous range of the output chunks and then takes the last tiles of
 * the others' (cpu_matmul.c, cpu_share): every tile runs exactly once whichever threads take part.
 * op_matmul (3 row blocks x the chunks) and op_matmul_argmax on 3 threads give the 1-thread bits
 * with all workers free, one held and both held (the caller then runs the held workers' shares,
 * finding their tiles taken by itself). Named "pool" for `make check`'s TSan run. */
TEST(backend_matmul_pool_shares_run_every_tile_once) {
    rng r = {77};
    enum { N_IN = 4096, N_OUT = 203, N_ROWS = 300 };
    float *w = malloc((size_t)N_IN * N_OUT * sizeof(float)), *x = malloc((size_t)N_IN * N_ROWS * sizeof(float));
    float *y1 = malloc((size_t)N_OUT * N_ROWS * sizeof(float)), *y3 = malloc((size_t)N_OUT * N_ROWS * sizeof(float));
    REQUIRE(w && x && y1 && y3);
    fill_f32(&r, w, (int64_t)N_IN * N_OUT, 1.0f);
    fill_f32(&r, x, (int64_t)N_IN * N_ROWS, 1.0f);
    backend *b1 = make_backend(1, 2, false), *b3 = make_backend(3, 2, false);
    REQUIRE(b1 && b3);
    cpu_pool *pool = ((cpu_backend *)b3)->pool;
    backend_op mm, am;
    memset(&mm, 0, sizeof(mm));
    mm.kind = BACKEND_OP_MATMUL;
    mm.src[0] = tensor_2d(QUANT_TYPE_F32, w, N_IN, N_OUT);
    mm.src[1] = tensor_2d(QUANT_TYPE_F32, x, N_IN, N_ROWS);
    int32_t ids1[40], ids3[40];
    am = mm;
    am.kind = BACKEND_OP_MATMUL_ARGMAX;
    am.src[1] = tensor_2d(QUANT_TYPE_F32, x, N_IN, 40);
    am.f[0] = 1.0f;
    mm.dst = tensor_2d(QUANT_TYPE_F32, y1, N_OUT, N_ROWS);
    am.dst = tensor_1d(QUANT_TYPE_I32, ids1, 40);
    run_op(b1, &mm);
    run_op(b1, &am);
    mm.dst = tensor_2d(QUANT_TYPE_F32, y3, N_OUT, N_ROWS);
    am.dst = tensor_1d(QUANT_TYPE_I32, ids3, 40);
    const bool held[3][2] = {{false, false}, {true, false}, {true, true}};
    for (int h = 0; h < 3; h++) {
        cpu_pool_test_hold(pool, 1, held[h][0]);
        cpu_pool_test_hold(pool, 2, held[h][1]);
        for (int rep = 0; rep < 3; rep++) {
            memset(y3, 0xff, (size_t)N_OUT * N_ROWS * sizeof(float)); /* NaN: a tile not run shows */
            memset(ids3, 0x55, sizeof(ids3));
            run_op(b3, &mm);
            run_op(b3, &am);
            const int64_t k = first_bit_diff(y3, y1, (int64_t)N_OUT * N_ROWS);
            CHECK_MSG(k < 0, "holds %d rep %d: output %lld (row %lld) differs from 1 thread's", h, rep, (long long)k,
                      (long long)(k / N_OUT));
            CHECK_MSG(memcmp(ids1, ids3, sizeof(ids1)) == 0, "holds %d rep %d: matmul_argmax ids differ", h, rep);
        }
    }
    cpu_pool_test_hold(pool, 1, false);
    cpu_pool_test_hold(pool, 2, false);
    backend_free(b1);
    backend_free(b3);
    free(w); free(x); free(y1); free(y3);
}

/* ---- batch invariance and the activation quantizers ---------------------------------------- */

/* A row's result does not depend on the other rows of the batch nor on its position in it (the
 * speculative verify batch must reproduce single-token decoding bit for bit). */
TEST(backend_matmul_batch_invariant) {
    rng r = {2024};
    /* n_in 4096: a row block of the matmul driver is 128 (f32 activations) or 96 (int8) rows, so
     * 140 rows cross several row blocks */
    enum { N_IN = 4096, N_OUT = 67, N_ROWS = 140 };
    static float x[N_IN * N_ROWS], y_all[N_OUT * N_ROWS], y_one[N_OUT];
    fill_f32(&r, x, N_IN * N_ROWS, 2.0f);
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        backend *be = make_backend(2, level, false);
        REQUIRE(be);
        for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
            const uint32_t type = k_mm_types[ti];
            void *w = make_weight(&r, type, N_IN, N_OUT);
            REQUIRE(w);
            mm_run(be, type, w, N_IN, N_OUT, x, N_ROWS, y_all);
            const int rows_to_check[9] = {0, 5, 16, 31, 32, 95, 96, 100, 139};
            for (int i = 0; i < 9; i++) {
                const int row = rows_to_check[i];
                mm_run(be, type, w, N_IN, N_OUT, x + row * N_IN, 1, y_one);
                CHECK_MSG(memcmp(y_one, y_all + row * N_OUT, sizeof(y_one)) == 0,
                          "matmul %s %s: row %d alone differs from row %d of a batch of %d", quant_type_get(type)->name,
                          k_level_names[level], row, row, N_ROWS);
            }
            free(w);
        }
        backend_free(be);
    }
}

/* Q8_0 activations round half to even with id = 127 / amax, d stored as f16 (ggml's x86
 * quantize_row_q8_0); Q8_K uses the signed value of largest magnitude: q(max) = -127. */
TEST(backend_act_quantizer_rules) {
    float x[544];
    for (int i = 0; i < 544; i++) x[i] = 0.0f;
    /* block 0: amax = 127 -> id = 1: ties 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2 */
    x[0] = 127.0f; x[1] = 0.5f; x[2] = 1.5f; x[3] = 2.5f; x[4] = -0.5f; x[5] = -1.5f; x[6] = -127.0f; x[7] = 3.49f;
    /* block 16 (first of the second group): one value */
    x[16 * 32 + 3] = -0.25f;
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        cpu_kernels k;
        cpu_kernels_select(&k, cpu_features_detect() & ~level_disable(level));
        static uint8_t mem[1 << 16] __attribute__((aligned(64)));
        cpu_act a;
        REQUIRE(cpu_act_bytes(CPU_DOT_Q8_0, 544, 1) <= sizeof(mem));
        cpu_act_layout(&a, CPU_DOT_Q8_0, 544, 1, mem);
        k.act_row[QUANT_TYPE_Q8_0](&a, 0, x);
        const int8_t expect[8] = {127, 0, 2, 2, 0, -2, -127, 3};
        for (int i = 0; i < 8; i++) {
            CHECK_MSG(a.qs[cpu_q8_0_offset(i)] == expect[i], "%s: q8_0 value %d: %d, expected %d", k_level_names[level], i,
                      a.qs[cpu_q8_0_offset(i)], expect[i]);
        }
        CHECK_NEAR(a.d[0], 1.0, 0);
        CHECK_EQ_INT(a.ns[0], -(127 + 0 + 2 + 2 + 0 - 2 - 127 + 3));
        CHECK_EQ_INT(a.qs[cpu_q8_0_offset(16 * 32 + 3)], -127);
        CHECK_NEAR(a.d[16], fp16_to_fp32(fp32_to_fp16(0.25f / 127.0f)), 0);
        CHECK_EQ_INT(a.row_len, 1024); /* 17 blocks -> 2 groups of 16 */
        CHECK_NEAR(a.d[20], 0.0, 0);   /* padding block */

        cpu_act_layout(&a, CPU_DOT_Q8_K, 512, 1, mem);
        float xk[512];
        for (int i = 0; i < 512; i++) xk[i] = (float)(i % 7) * 0.1f;
        xk[10] = -2.0f;  /* the value of largest magnitude (first of the two) */
        xk[200] = 2.0f;
        k.act_row[QUANT_TYPE_Q6_K](&a, 0, xk);
        /* max = -2 (signed): iscale = -127 / max = 63.5, q(-2) = -127, q(2) = 127, d = 1 / 63.5 */
        CHECK_EQ_INT(a.qs[10], -127);
        CHECK_EQ_INT(a.qs[200], 127);
        CHECK_NEAR(a.d[0], 1.0f / 63.5f, 0);
        int sum = 0;
        for (int i = 16; i < 32; i++) sum += a.qs[i];
        CHECK_EQ_INT(a.bsums[1], sum);
        CHECK(a.d[1] < 0.0f && a.d[1] > -0.01f); /* second block: max 0.6 positive -> d = -0.6 / 127 */
    }
}

/* ---- prepared activations reused by the next matmul of the same x (cpu_matmul.c) ------------ */

/* A matmul right after a matmul of the same x (same view, same dot type, the first one's output
 * clear of x) reuses the prepared activations: its output equals a fresh backend's bit for bit,
 * and (proof that the reuse happens) x changed behind the backend's back is not seen. x changed by
 * an op in between, a first matmul whose output overlaps x, or another dot type prepare again. */
/* The reference: a new backend per matmul (a kept one would itself reuse across calls). */
static void mm_fresh(int n_threads, uint32_t type, const void *w, int64_t n_in, int64_t n_out, const float *x,
                     int64_t n_rows, float *dst) {
    backend *be = make_backend(n_threads, 2, false);
    DFL_ASSERT(be != NULL);
    mm_run(be, type, w, n_in, n_out, x, n_rows, dst);
    backend_free(be);
}

static void mm_reuse_case(test_ctx *t, rng *r, int n_threads, uint32_t type1, uint32_t type2) {
    enum { N_IN = 256, N_OUT = 40, N_ROWS = 7 };
    static float x[N_IN * N_ROWS], x0[N_IN * N_ROWS], y1[N_OUT * N_ROWS], y[N_OUT * N_ROWS], ref[N_OUT * N_ROWS];
    void *w1 = make_weight(r, type1, N_IN, N_OUT), *w2 = make_weight(r, type2, N_IN, N_OUT);
    REQUIRE(w1 && w2);
    const char *n1 = quant_type_get(type1)->name, *n2 = quant_type_get(type2)->name;
    backend *be = make_backend(n_threads, 2, false);
    REQUIRE(be);
    const cpu_kernels *k = &((const cpu_backend *)be)->kernels;
    const bool same_prep = k->act_row[type1] == k->act_row[type2];
    fill_f32(r, x, N_IN * N_ROWS, 1.0f);
    memcpy(x0, x, sizeof(x));

    /* 1. w1 then w2 on x: w2's output is a fresh backend's */
    mm_fresh(n_threads, type2, w2, N_IN, N_OUT, x, N_ROWS, ref);
    mm_run(be, type1, w1, N_IN, N_OUT, x, N_ROWS, y1);
    mm_run(be, type2, w2, N_IN, N_OUT, x, N_ROWS, y);
    CHECK_MSG(memcmp(y, ref, sizeof(y)) == 0, "%s after %s on the same x, %d threads: differs from a fresh backend", n2,
              n1, n_threads);

    /* 2. x changed on the host, not by an op: a reused preparation still sees x0 */
    mm_run(be, type1, w1, N_IN, N_OUT, x, N_ROWS, y1);
    for (int64_t i = 0; i < N_IN * N_ROWS; i++) x[i] = -x[i];
    mm_run(be, type2, w2, N_IN, N_OUT, x, N_ROWS, y);
    if (same_prep) {
        CHECK_MSG(memcmp(y, ref, sizeof(y)) == 0, "%s after %s: the activations were prepared again (no reuse)", n2, n1);
    } else {
        mm_fresh(n_threads, type2, w2, N_IN, N_OUT, x, N_ROWS, ref);
        CHECK_MSG(memcmp(y, ref, sizeof(y)) == 0, "%s after %s (other preparation): reused stale activations", n2,
                  n1);
    }

    /* 3. x changed by an op in between (x = x + x): prepared again */
    memcpy(x, x0, sizeof(x));
    mm_run(be, type1, w1, N_IN, N_OUT, x, N_ROWS, y1);
    backend_op add;
    memset(&add, 0, sizeof(add));
    add.kind = BACKEND_OP_ADD;
    add.dst = add.src[0] = add.src[1] = tensor_2d(QUANT_TYPE_F32, x, N_IN, N_ROWS);
    run_op(be, &add);
    mm_run(be, type2, w2, N_IN, N_OUT, x, N_ROWS, y);
    mm_fresh(n_threads, type2, w2, N_IN, N_OUT, x, N_ROWS, ref);
    CHECK_MSG(memcmp(y, ref, sizeof(y)) == 0, "%s after %s and an op writing x: reused stale activations", n2, n1);

    /* 4. the first matmul writes its output into x (the first N_OUT values of each row) */
    memcpy(x, x0, sizeof(x));
    backend_op mm;
    memset(&mm, 0, sizeof(mm));
    mm.kind = BACKEND_OP_MATMUL;
    mm.src[0] = tensor_2d(type1, w1, N_IN, N_OUT);
    mm.src[1] = tensor_2d(QUANT_TYPE_F32, x0, N_IN, N_ROWS);
    mm.dst = tensor_2d(QUANT_TYPE_F32, x, N_OUT, N_ROWS);
    mm.dst.nb[1] = (size_t)N_IN * sizeof(float); /* row r at x + r * N_IN */
    mm.dst.nb[2] = mm.dst.nb[3] = mm.dst.nb[1] * N_ROWS;
    mm_run(be, type1, w1, N_IN, N_OUT, x, N_ROWS, y1); /* prepares x ... */
    mm.src[1] = tensor_2d(QUANT_TYPE_F32, x, N_IN, N_ROWS);
    run_op(be, &mm);                                    /* ... the same x again, output into x */
    mm_run(be, type2, w2, N_IN, N_OUT, x, N_ROWS, y);
    mm_fresh(n_threads, type2, w2, N_IN, N_OUT, x, N_ROWS, ref);
    CHECK_MSG(memcmp(y, ref, sizeof(y)) == 0, "%s after a %s writing into x: reused stale activations", n2, n1);

    backend_free(be);
    free(w1);
    free(w2);
}

TEST(backend_matmul_reuses_prepared_activations) {
    rng r = {2024};
    for (int nt = 1; nt <= 2; nt++) {
        mm_reuse_case(t, &r, nt, QUANT_TYPE_F16, QUANT_TYPE_F16);
        mm_reuse_case(t, &r, nt, QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_0); /* both Q8_0 activations */
        mm_reuse_case(t, &r, nt, QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K); /* both Q8_K activations */
        mm_reuse_case(t, &r, nt, QUANT_TYPE_F16, QUANT_TYPE_Q8_0);  /* other dot types */
        mm_reuse_case(t, &r, nt, QUANT_TYPE_BF16, QUANT_TYPE_F16);  /* both f32 rows, rounded differently */
        mm_reuse_case(t, &r, nt, QUANT_TYPE_F32, QUANT_TYPE_F32);
    }
}
