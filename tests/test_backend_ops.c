/* test_backend_ops.c: every CPU backend op against its scalar reference (cpu_ops_ref.c) on awkward
 * sizes, for each CPU feature level this machine has (scalar, avx2, avx512), and the matmul's
 * quantized-activation path against a scalar reference of that same quantized computation.
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
#include "test_views.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops_ref.h"
#include "base/error.h"
#include "base/fp16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint32_t rng_u32(rng *r) {
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 33);
}

/* uniform in [-1, 1) */
static float rng_f(rng *r) { return (float)rng_u32(r) / 2147483648.0f - 1.0f; }

static void fill_f32(rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float v = rng_f(r) * scale;
        if (rng_u32(r) % 97 == 0) v *= 8.0f; /* occasional outliers */
        x[i] = v;
    }
}

/* Feature levels: 0 scalar, 1 avx2, 2 avx512 (if the machine has them). */
static const char *const k_level_names[3] = {"scalar", "avx2", "avx512"};

static uint32_t level_disable(int level) {
    switch (level) {
    case 0: return ~0u;
    case 1: return BACKEND_CPU_FEATURE_AVX512 | BACKEND_CPU_FEATURE_AVX512_VNNI | BACKEND_CPU_FEATURE_AVX512_BF16;
    default: return 0;
    }
}

static bool level_available(int level) {
    uint32_t f = cpu_features_detect();
    if (level == 1) return (f & BACKEND_CPU_FEATURE_AVX2) != 0;
    if (level == 2) return (f & BACKEND_CPU_FEATURE_AVX512) && (f & BACKEND_CPU_FEATURE_AVX512_VNNI);
    return true;
}

static backend *make_backend(int n_threads, int level, bool async) {
    backend_cpu_params p = backend_cpu_default_params();
    p.n_threads = n_threads;
    p.n_threads_batch = n_threads;
    p.disable_features = level_disable(level);
    p.async = async;
    dfl_error err;
    memset(&err, 0, sizeof(err));
    return backend_cpu_new(&p, &err);
}

/* Runs one op on a fresh queue of be and waits for it. */
static void run_op(backend *be, const backend_op *op) {
    dfl_error err;
    memset(&err, 0, sizeof(err));
    backend_queue *q = backend_queue_new(be, &err);
    DFL_ASSERT(q != NULL);
    backend_queue_submit(q, op);
    backend_queue_synchronize(q);
    backend_queue_free(q);
}

/* max |a - b| / (tol_abs + tol_rel * |b|) over n values; > 1 fails. Non-finite values fail. */
static bool close_enough(test_ctx *t, const char *what, const float *a, const float *b, int64_t n, double tol_abs,
                         double tol_rel) {
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            test_fail(t, __FILE__, __LINE__, "%s: non-finite value at %lld: %g vs %g", what, (long long)i, a[i], b[i]);
            return false;
        }
        const double d = fabs((double)a[i] - (double)b[i]);
        if (d > tol_abs + tol_rel * fabs((double)b[i])) {
            test_fail(t, __FILE__, __LINE__, "%s: element %lld: %.9g vs ref %.9g (diff %.3g)", what, (long long)i,
                      a[i], b[i], d);
            return false;
        }
    }
    return true;
}

/* ---- random weights of every matmul type ------------------------------------------------- */

static uint16_t rand_f16(rng *r, float lo, float hi) {
    float u = (rng_f(r) + 1.0f) * 0.5f;
    return fp32_to_fp16(lo + u * (hi - lo));
}

/* A [n_in, n_out] weight of type `type` with random content (all block fields random). */
static void *make_weight(rng *r, uint32_t type, int64_t n_in, int64_t n_out) {
    const size_t row = quant_row_size(type, n_in);
    uint8_t *w = malloc(row * (size_t)n_out + 64);
    DFL_ASSERT(w != NULL);
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *p = w + (size_t)o * row;
        switch (type) {
        case QUANT_TYPE_F32:
            for (int64_t i = 0; i < n_in; i++) { float v = rng_f(r); memcpy(p + 4 * i, &v, 4); }
            break;
        case QUANT_TYPE_F16:
            for (int64_t i = 0; i < n_in; i++) { uint16_t h = fp32_to_fp16(rng_f(r)); memcpy(p + 2 * i, &h, 2); }
            break;
        case QUANT_TYPE_BF16:
            for (int64_t i = 0; i < n_in; i++) { uint16_t h = fp32_to_bf16(rng_f(r)); memcpy(p + 2 * i, &h, 2); }
            break;
        case QUANT_TYPE_Q8_0:
            for (int64_t b = 0; b < n_in / 32; b++) {
                block_q8_0 blk;
                blk.d = rand_f16(r, -0.02f, 0.02f);
                for (int j = 0; j < 32; j++) blk.qs[j] = (int8_t)rng_u32(r); /* includes -128 */
                memcpy(p + b * sizeof(blk), &blk, sizeof(blk));
            }
            break;
        case QUANT_TYPE_Q4_0:
            for (int64_t b = 0; b < n_in / 32; b++) {
                block_q4_0 blk;
                blk.d = rand_f16(r, -0.1f, 0.1f);
                for (int j = 0; j < 16; j++) blk.qs[j] = (uint8_t)rng_u32(r);
                memcpy(p + b * sizeof(blk), &blk, sizeof(blk));
            }
            break;
        case QUANT_TYPE_Q4_K:
            for (int64_t b = 0; b < n_in / 256; b++) {
                block_q4_K blk;
                blk.d = rand_f16(r, 0.0005f, 0.004f);
                blk.dmin = rand_f16(r, 0.0f, 0.004f);
                for (int j = 0; j < 12; j++) blk.scales[j] = (uint8_t)rng_u32(r);
                for (int j = 0; j < 128; j++) blk.qs[j] = (uint8_t)rng_u32(r);
                memcpy(p + b * sizeof(blk), &blk, sizeof(blk));
            }
            break;
        case QUANT_TYPE_Q6_K:
            for (int64_t b = 0; b < n_in / 256; b++) {
                block_q6_K blk;
                for (int j = 0; j < 128; j++) blk.ql[j] = (uint8_t)rng_u32(r);
                for (int j = 0; j < 64; j++) blk.qh[j] = (uint8_t)rng_u32(r);
                for (int j = 0; j < 16; j++) blk.scales[j] = (int8_t)rng_u32(r); /* includes -128 */
                blk.d = rand_f16(r, -0.0005f, 0.0005f);
                memcpy(p + b * sizeof(blk), &blk, sizeof(blk));
            }
            break;
        case QUANT_TYPE_Q4_1: case QUANT_TYPE_Q5_0: case QUANT_TYPE_Q5_1: case QUANT_TYPE_IQ4_NL:
        case QUANT_TYPE_Q2_K: case QUANT_TYPE_Q3_K: case QUANT_TYPE_Q5_K: case QUANT_TYPE_IQ4_XS: {
            /* random bytes, then sane f16 scales at their offsets (d first, then m / dmin; Q2_K and
             * Q3_K keep theirs at the end) */
            const quant_type_info *ti = quant_type_get(type);
            for (size_t i = 0; i < row; i++) p[i] = (uint8_t)rng_u32(r);
            for (int64_t b = 0; b < n_in / ti->blck_size; b++) {
                uint8_t *blk = p + (size_t)b * ti->type_size;
                uint16_t h[2];
                size_t off = 0;
                int nh = 1;
                switch (type) {
                case QUANT_TYPE_Q4_1: case QUANT_TYPE_Q5_1:
                    h[0] = rand_f16(r, -0.1f, 0.1f); h[1] = rand_f16(r, -0.5f, 0.5f); nh = 2; break;
                case QUANT_TYPE_Q5_0: h[0] = rand_f16(r, -0.05f, 0.05f); break;
                case QUANT_TYPE_IQ4_NL: h[0] = rand_f16(r, -0.01f, 0.01f); break;
                case QUANT_TYPE_Q2_K: off = 80; h[0] = rand_f16(r, 0.0005f, 0.01f); h[1] = rand_f16(r, 0.0f, 0.01f); nh = 2; break;
                case QUANT_TYPE_Q3_K: off = 108; h[0] = rand_f16(r, -0.001f, 0.001f); break;
                case QUANT_TYPE_Q5_K: h[0] = rand_f16(r, 0.0005f, 0.002f); h[1] = rand_f16(r, 0.0f, 0.004f); nh = 2; break;
                default: h[0] = rand_f16(r, -0.0005f, 0.0005f); break; /* IQ4_XS */
                }
                memcpy(blk + off, h, 2 * (size_t)nh);
            }
            break;
        }
        default:
            DFL_ASSERT(0 && "make_weight: type");
        }
    }
    return w;
}

static const uint32_t k_mm_types[] = {QUANT_TYPE_F32,  QUANT_TYPE_F16,    QUANT_TYPE_BF16, QUANT_TYPE_Q8_0,
                                      QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_K,   QUANT_TYPE_Q6_K, QUANT_TYPE_Q4_1,
                                      QUANT_TYPE_Q5_0, QUANT_TYPE_Q5_1,   QUANT_TYPE_IQ4_NL, QUANT_TYPE_Q2_K,
                                      QUANT_TYPE_Q3_K, QUANT_TYPE_Q5_K,   QUANT_TYPE_IQ4_XS};

static double mm_budget(uint32_t type) {
    switch (type) {
    case QUANT_TYPE_F32: return 1e-6;
    case QUANT_TYPE_F16: return 7e-4;
    default: return 5e-3;
    }
}

/* N[r][o] = sum_i |w_o,i| * max_i |x_r,i| */
static void mm_norms(double *N, uint32_t type, const void *w, int64_t n_in, int64_t n_out, const float *x,
                     int64_t n_rows) {
    float *wrow = malloc((size_t)n_in * sizeof(float));
    DFL_ASSERT(wrow != NULL);
    for (int64_t o = 0; o < n_out; o++) {
        DFL_ASSERT(quant_dequantize_row(type, (const char *)w + (size_t)o * quant_row_size(type, n_in), wrow, n_in));
        double wa = 0.0;
        for (int64_t i = 0; i < n_in; i++) wa += fabs((double)wrow[i]);
        for (int64_t r = 0; r < n_rows; r++) {
            double xm = 0.0;
            for (int64_t i = 0; i < n_in; i++) xm = fmax(xm, fabs((double)x[r * n_in + i]));
            N[r * n_out + o] = wa * xm + 1e-30;
        }
    }
    free(wrow);
}

typedef struct mm_case {
    int64_t n_in, n_out, n_rows;
} mm_case;

/* (n_in, n_out, n_rows) triples covering every awkward size at least once per block size */
static const mm_case k_cases_32[] = {
    {32, 1, 1}, {64, 3, 2}, {96, 7, 3}, {256, 17, 7}, {512, 127, 16}, {1024, 129, 17},
    {1088, 1000, 1}, {96, 33, 33}, {2048, 64, 4}, {160, 129, 16}, {160, 9, 15}, {96, 5, 64},
    /* n_in not a multiple of 32 (f32 / f16 / bf16 only): the SIMD tail loops of every level */
    {33, 5, 3}, {47, 17, 7}, {72, 129, 16}, {33, 64, 17}, {47, 1, 1}, {1, 9, 2}, {15, 33, 6},
    /* rows over several row blocks of the matmul driver (32 rows of f32, 96 of int8 at n_in 4096) */
    {4096, 40, 100},
};
static const mm_case k_cases_256[] = {
    {256, 1, 1}, {256, 3, 2}, {512, 7, 3}, {768, 17, 7}, {1024, 127, 16}, {1280, 129, 17},
    {512, 1000, 1}, {256, 33, 33}, {2048, 64, 4}, {768, 9, 15}, {512, 5, 64}, {4096, 40, 130},
};

/* Runs op_matmul on be; dst [n_out, n_rows] */
static void mm_run(backend *be, uint32_t type, const void *w, int64_t n_in, int64_t n_out, const float *x,
                   int64_t n_rows, float *dst) {
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_MATMUL;
    op.dst = tensor_2d(QUANT_TYPE_F32, dst, n_out, n_rows);
    op.src[0] = tensor_2d(type, (void *)w, n_in, n_out);
    op.src[1] = tensor_2d(QUANT_TYPE_F32, (void *)x, n_in, n_rows);
    run_op(be, &op);
}

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
            for (int level = 0; level < 3; level++) {
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
    for (int level = 1; level < 3; level++) {
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

/* ---- light ops: the threaded executor (reference code on slices) against the reference ----- */

/* Runs op (whose dst/inputs are arrays of the arena a, each view checked against its array)
 * through a backend with nt threads and compares the whole arena with a reference run on a copy
 * (same layout, pointers rebased). */
static void check_light_op(test_ctx *t, const char *what, const backend_op *op, const tv_arena *a, int nt, bool exact,
                           double tol) {
    if (!tv_op_check(t, op, a, what)) return;
    uint8_t *mem = a->mem;
    const size_t bytes = a->size;
    uint8_t *copy = malloc(bytes);
    REQUIRE(copy);
    memcpy(copy, mem, bytes);
    backend_op ref = *op;
    const ptrdiff_t delta = copy - mem;
#define REBASE(tt) do { if ((tt).data != NULL && (uint8_t *)(tt).data >= mem && (uint8_t *)(tt).data < mem + bytes) \
                            (tt).data = (uint8_t *)(tt).data + delta; } while (0)
    REBASE(ref.dst);
    for (int i = 0; i < 4; i++) REBASE(ref.src[i]);
#undef REBASE
    cpu_op_ref(&ref);
    backend *be = make_backend(nt, 2, false);
    REQUIRE(be);
    run_op(be, op);
    backend_free(be);
    if (exact) {
        CHECK_MSG(memcmp(mem, copy, bytes) == 0, "%s (%d threads): differs from the reference", what, nt);
    } else {
        close_enough(t, what, (const float *)mem, (const float *)copy, (int64_t)(bytes / sizeof(float)), tol, tol);
    }
    free(copy);
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

TEST(backend_op_rmsnorm) {
    rng r = {5};
    for (int nt = 1; nt <= 3; nt++) {
        /* [1024, 70] with a weight; x and dst distinct; then in place; then per head with NULL weight */
        const int64_t n = 1024, rows = 70;
        tv_arena a;
        tv_arena_init(&a, (size_t)(2 * n * rows + n) * sizeof(float) + 1024);
        float *xm = tv_arena_take(&a, (size_t)(n * rows) * 4), *dm = tv_arena_take(&a, (size_t)(n * rows) * 4);
        float *wm = tv_arena_take(&a, (size_t)n * 4);
        fill_f32(&r, xm, n * rows, 3.0f);
        fill_f32(&r, dm, n * rows, 3.0f);
        fill_f32(&r, wm, n, 3.0f);
        tensor x = tensor_2d(QUANT_TYPE_F32, xm, n, rows);
        tensor d = tensor_2d(QUANT_TYPE_F32, dm, n, rows);
        tensor w = tensor_1d(QUANT_TYPE_F32, wm, n);
        backend_op op = mkop(BACKEND_OP_RMSNORM, d, &x, &w);
        op.f[0] = 1e-6f;
        check_light_op(t, "rmsnorm", &op, &a, nt, true, 0);
        op = mkop(BACKEND_OP_RMSNORM, x, &x, &w);
        op.f[0] = 1e-5f;
        check_light_op(t, "rmsnorm in place", &op, &a, nt, true, 0);
        tensor xh = tensor_reshape_2d(&x, 128, 8 * rows);
        op = mkop(BACKEND_OP_RMSNORM, xh, &xh, NULL);
        op.f[0] = 1e-6f;
        check_light_op(t, "rmsnorm per head", &op, &a, nt, true, 0);
        tv_arena_free(&a);
    }
    /* the reference itself: one row by hand */
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 0.5f, 2, 1}, y[4];
    tensor tx = tensor_1d(QUANT_TYPE_F32, x, 4), ty = tensor_1d(QUANT_TYPE_F32, y, 4), tw = tensor_1d(QUANT_TYPE_F32, w, 4);
    backend_op op = mkop(BACKEND_OP_RMSNORM, ty, &tx, &tw);
    op.f[0] = 0.0f;
    cpu_op_rmsnorm_ref(&op);
    const double s = 1.0 / sqrt(30.0 / 4.0);
    for (int i = 0; i < 4; i++) CHECK_NEAR(y[i], x[i] * s * w[i], 1e-6);
}

TEST(backend_op_rope_neox) {
    rng r = {6};
    const int64_t hd = 128, nh = 16, nt_tok = 40;
    const size_t n = (size_t)(hd * nh * nt_tok);
    tv_arena a;
    tv_arena_init(&a, (2 * n + 4 * (size_t)nt_tok) * sizeof(float) + 1024);
    float *xm = tv_arena_take(&a, n * 4), *dm = tv_arena_take(&a, n * 4);
    fill_f32(&r, xm, (int64_t)n, 1.0f);
    fill_f32(&r, dm, (int64_t)n, 1.0f);
    int32_t *pos = tv_arena_take(&a, 4 * (size_t)nt_tok * sizeof(int32_t)); /* 4 sections: the strided case */
    for (int64_t i = 0; i < 4 * nt_tok; i++) pos[i] = (int32_t)((i * 37) % 3000);
    for (int nt = 1; nt <= 3; nt++) {
        tensor x = tensor_3d(QUANT_TYPE_F32, xm, hd, nh, nt_tok);
        tensor d = tensor_3d(QUANT_TYPE_F32, dm, hd, nh, nt_tok);
        tensor p = tensor_1d(QUANT_TYPE_I32, pos, nt_tok);
        backend_op op = mkop(BACKEND_OP_ROPE_NEOX, d, &x, &p);
        op.f[0] = 1000000.0f;
        check_light_op(t, "rope", &op, &a, nt, true, 0);
        /* positions with a stride of 4 int32 (one section of interleaved positions), n_rot 64, in place */
        p.ne[0] = nt_tok;
        p.nb[0] = 16;
        op = mkop(BACKEND_OP_ROPE_NEOX, x, &x, &p);
        op.f[0] = 10000.0f;
        op.i[0] = 64;
        check_light_op(t, "rope strided pos", &op, &a, nt, true, 0);
        /* one token, split over heads */
        tensor x1 = tensor_3d(QUANT_TYPE_F32, xm, hd, nh * 40, 1);
        tensor d1 = tensor_3d(QUANT_TYPE_F32, dm, hd, nh * 40, 1);
        op = mkop(BACKEND_OP_ROPE_NEOX, d1, &x1, &p);
        op.f[0] = 10000.0f;
        check_light_op(t, "rope one token", &op, &a, nt, true, 0);
        /* NORM pairing (i[1] = 1, arch llama): full and n_rot 96 with strided positions, in place */
        p.nb[0] = 4;
        op = mkop(BACKEND_OP_ROPE_NEOX, d, &x, &p);
        op.f[0] = 500000.0f;
        op.i[1] = 1;
        check_light_op(t, "rope norm", &op, &a, nt, true, 0);
        p.nb[0] = 16;
        op = mkop(BACKEND_OP_ROPE_NEOX, x, &x, &p);
        op.f[0] = 10000.0f;
        op.i[0] = 96;
        op.i[1] = 1;
        check_light_op(t, "rope norm strided pos n_rot 96", &op, &a, nt, true, 0);
    }
    /* the reference against the closed form in f64 (small positions: the f32 angle recurrence is close) */
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    int32_t p5 = 5;
    tensor tx = tensor_3d(QUANT_TYPE_F32, x, 8, 1, 1), ty = tensor_3d(QUANT_TYPE_F32, y, 8, 1, 1);
    tensor tp = tensor_1d(QUANT_TYPE_I32, &p5, 1);
    backend_op op = mkop(BACKEND_OP_ROPE_NEOX, ty, &tx, &tp);
    op.f[0] = 10000.0f;
    cpu_op_rope_neox_ref(&op);
    for (int i = 0; i < 4; i++) {
        const double th = 5.0 * pow(10000.0, -2.0 * i / 8.0);
        CHECK_NEAR(y[i], x[i] * cos(th) - x[i + 4] * sin(th), 1e-5);
        CHECK_NEAR(y[i + 4], x[i] * sin(th) + x[i + 4] * cos(th), 1e-5);
    }
    /* NORM mode: pair i is (2i, 2i + 1), n_rot 6 of 8 (dims 6, 7 copied) */
    op.i[0] = 6;
    op.i[1] = 1;
    cpu_op_rope_neox_ref(&op);
    for (int i = 0; i < 3; i++) {
        const double th = 5.0 * pow(10000.0, -2.0 * i / 6.0);
        CHECK_NEAR(y[2 * i], x[2 * i] * cos(th) - x[2 * i + 1] * sin(th), 1e-5);
        CHECK_NEAR(y[2 * i + 1], x[2 * i] * sin(th) + x[2 * i + 1] * cos(th), 1e-5);
    }
    CHECK(y[6] == x[6] && y[7] == x[7]);
    tv_arena_free(&a);
}

/* Attention: builds q, a KV cache view (capacity > n_kv, so strided), a mask; compares with the ref
 * at one feature level. K and V may differ in type (f16 / f32): the mixed cases take the
 * per-row path (dot_f16 / axpy_f16 kernels), F16 K and V the tiled one. */
static void attn_case(test_ctx *t, rng *r, uint32_t ktype, uint32_t vtype, int64_t hd, int64_t nh, int64_t nh_kv,
                      int64_t nq, int64_t n_kv, int mask_kind, int nt, int level) {
    const int64_t cap = n_kv + 5;
    const size_t ksz = ktype == QUANT_TYPE_F16 ? 2 : 4, vsz = vtype == QUANT_TYPE_F16 ? 2 : 4;
    float *q = malloc((size_t)(hd * nh * nq) * sizeof(float));
    uint8_t *kc = malloc((size_t)(hd * nh_kv * cap) * ksz), *vc = malloc((size_t)(hd * nh_kv * cap) * vsz);
    float *mask = malloc((size_t)(n_kv * nq) * sizeof(float));
    float *out = malloc((size_t)(hd * nh * nq) * sizeof(float)), *ref = malloc((size_t)(hd * nh * nq) * sizeof(float));
    REQUIRE(q && kc && vc && mask && out && ref);
    fill_f32(r, q, hd * nh * nq, 2.0f);
    for (int64_t i = 0; i < hd * nh_kv * cap; i++) {
        const float kv = rng_f(r) * 2.0f, vv = rng_f(r);
        if (ksz == 2) {
            uint16_t a = fp32_to_fp16(kv);
            memcpy(kc + 2 * i, &a, 2);
        } else {
            memcpy(kc + 4 * i, &kv, 4);
        }
        if (vsz == 2) {
            uint16_t b = fp32_to_fp16(vv);
            memcpy(vc + 2 * i, &b, 2);
        } else {
            memcpy(vc + 4 * i, &vv, 4);
        }
    }
    for (int64_t iq = 0; iq < nq; iq++) {
        for (int64_t j = 0; j < n_kv; j++) {
            float m = 0.0f;
            if (mask_kind == 1 && j > n_kv - nq + iq) m = -INFINITY;                  /* causal */
            if (mask_kind == 2 && (j % 2) != (iq % 2)) m = -INFINITY;                 /* two sequences */
            if (mask_kind == 3 && iq == 0) m = -INFINITY;                             /* a fully masked row */
            if (mask_kind == 3 && iq != 0 && j % 3 == 0) m = -1.5f;                   /* a soft bias */
            mask[iq * n_kv + j] = m;
        }
    }
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_ATTENTION;
    op.src[0] = tensor_3d(QUANT_TYPE_F32, q, hd, nh, nq);
    op.src[1] = tensor_3d(ktype, kc, hd, nh_kv, n_kv);
    op.src[2] = tensor_3d(vtype, vc, hd, nh_kv, n_kv);
    op.src[3] = tensor_2d(QUANT_TYPE_F32, mask, n_kv, nq);
    op.dst = tensor_3d(QUANT_TYPE_F32, ref, hd, nh, nq);
    REQUIRE(tv_view_check(t, &op.src[0], q, (size_t)(hd * nh * nq) * 4, "attention", "q") &&
            tv_view_check(t, &op.src[1], kc, (size_t)(hd * nh_kv * cap) * ksz, "attention", "k") &&
            tv_view_check(t, &op.src[2], vc, (size_t)(hd * nh_kv * cap) * vsz, "attention", "v") &&
            tv_view_check(t, &op.src[3], mask, (size_t)(n_kv * nq) * 4, "attention", "mask") &&
            tv_view_check(t, &op.dst, ref, (size_t)(hd * nh * nq) * 4, "attention", "dst"));
    cpu_op_attention_ref(&op);
    op.dst.data = out;
    memset(out, 0xff, (size_t)(hd * nh * nq) * sizeof(float));
    backend *be = make_backend(nt, level, false);
    REQUIRE(be);
    run_op(be, &op);
    backend_free(be);
    char what[160];
    snprintf(what, sizeof(what), "attention %s k %s v %s hd %lld nh %lld/%lld nq %lld n_kv %lld mask %d threads %d",
             k_level_names[level], ktype == QUANT_TYPE_F16 ? "f16" : "f32", vtype == QUANT_TYPE_F16 ? "f16" : "f32",
             (long long)hd, (long long)nh, (long long)nh_kv, (long long)nq, (long long)n_kv, mask_kind, nt);
    /* f16 V: the probabilities are rounded to f16, where a last-bit difference of the scores can
     * flip one rounding: allow 2^-10 of |v| <= 1 */
    close_enough(t, what, out, ref, hd * nh * nq, vtype == QUANT_TYPE_F16 ? 1e-3 : 2e-6, 2e-5);
    if (mask_kind == 3) {
        for (int64_t i = 0; i < hd * nh; i++) CHECK_MSG(out[i] == 0.0f, "%s: fully masked row is not zero", what);
    }
    free(q); free(kc); free(vc); free(mask); free(out); free(ref);
}

TEST(backend_op_attention) {
    rng r = {8};
    const uint32_t F16 = QUANT_TYPE_F16, F32 = QUANT_TYPE_F32;
    for (int level = 0; level < 3; level++) {
        if (!level_available(level)) continue;
        for (int nt = 1; nt <= 3; nt += 2) {
            for (int mk = 0; mk < 4; mk++) {
                attn_case(t, &r, F16, F16, 64, 4, 2, 5, 37, mk, nt, level);
                attn_case(t, &r, F32, F32, 64, 4, 2, 5, 37, mk, nt, level);
                attn_case(t, &r, F16, F32, 64, 4, 2, 5, 37, mk, nt, level);
                attn_case(t, &r, F32, F16, 64, 4, 2, 5, 37, mk, nt, level);
            }
            attn_case(t, &r, F16, F16, 128, 16, 8, 1, 300, 0, nt, level);
            attn_case(t, &r, F16, F16, 128, 16, 8, 17, 200, 1, nt, level);
            attn_case(t, &r, F32, F32, 32, 3, 1, 7, 1, 0, nt, level);
            attn_case(t, &r, F16, F16, 72, 6, 6, 3, 129, 2, nt, level);
            /* head sizes off the SIMD widths: the tail loops of the score and value kernels */
            static const int64_t hds[] = {33, 47, 72, 15};
            for (int hi = 0; hi < 4; hi++) {
                attn_case(t, &r, F16, F16, hds[hi], 4, 2, 9, 41, 1, nt, level);
                attn_case(t, &r, F32, F32, hds[hi], 4, 2, 9, 41, 1, nt, level);
                attn_case(t, &r, F16, F32, hds[hi], 4, 2, 9, 41, 3, nt, level);
                attn_case(t, &r, F32, F16, hds[hi], 4, 2, 9, 41, 2, nt, level);
            }
        }
    }
}

/* A query row's attention output is bit-identical whether the row comes alone (decode) or inside a
 * batch (verify, prefill), with causal and two-sequence masks: the kernel works on a prefix of the
 * keys that depends on the batch (the last key any row of a tile sees), which must not change a
 * single bit. */
TEST(backend_attention_row_invariance) {
    rng r = {16};
    enum { HD = 64, NH = 8, NH_KV = 2, NQ = 21, PAST = 49, NKV = PAST + NQ };
    static uint16_t kc[HD * NH_KV * NKV], vc[HD * NH_KV * NKV];
    static float q[HD * NH * NQ], mask[NKV * NQ], out[HD * NH * NQ], one[HD * NH];
    /* large scores: the exponentials span far more than 2^53, so the f64 sums of the softmax are
     * inexact and their order matters */
    fill_f32(&r, q, HD * NH * NQ, 8.0f);
    for (int i = 0; i < HD * NH_KV * NKV; i++) {
        kc[i] = fp32_to_fp16(rng_f(&r) * 2.0f);
        vc[i] = fp32_to_fp16(rng_f(&r));
    }
    for (int level = 0; level < 3; level++) {
        if (!level_available(level)) continue;
        for (int mk = 0; mk < 2; mk++) {
            for (int iq = 0; iq < NQ; iq++) {
                for (int j = 0; j < NKV; j++) {
                    bool vis = j <= PAST + iq;                                  /* causal */
                    if (mk == 1) vis = vis && (j < PAST ? j % 3 != 0 : (j - PAST) % 2 == iq % 2); /* 2 seqs */
                    mask[iq * NKV + j] = vis ? 0.0f : -INFINITY;
                }
            }
            for (int nt = 1; nt <= 2; nt++) {
                backend *be = make_backend(nt, level, false);
                REQUIRE(be);
                backend_op op;
                memset(&op, 0, sizeof(op));
                op.kind = BACKEND_OP_ATTENTION;
                op.src[0] = tensor_3d(QUANT_TYPE_F32, q, HD, NH, NQ);
                op.src[1] = tensor_3d(QUANT_TYPE_F16, kc, HD, NH_KV, NKV);
                op.src[2] = tensor_3d(QUANT_TYPE_F16, vc, HD, NH_KV, NKV);
                op.src[3] = tensor_2d(QUANT_TYPE_F32, mask, NKV, NQ);
                op.dst = tensor_3d(QUANT_TYPE_F32, out, HD, NH, NQ);
                run_op(be, &op);
                for (int iq = 0; iq < NQ; iq++) {
                    op.src[0] = tensor_3d(QUANT_TYPE_F32, q + iq * HD * NH, HD, NH, 1);
                    op.src[3] = tensor_2d(QUANT_TYPE_F32, mask + iq * NKV, NKV, 1);
                    op.dst = tensor_3d(QUANT_TYPE_F32, one, HD, NH, 1);
                    run_op(be, &op);
                    CHECK_MSG(memcmp(one, out + iq * HD * NH, sizeof(one)) == 0,
                              "attention %s mask %d threads %d: row %d alone differs from the batch",
                              k_level_names[level], mk, nt, iq);
                }
                backend_free(be);
            }
        }
    }
}

/* Structured mask kinds (BACKEND_ATTN_CAUSAL / BACKEND_ATTN_FULL: no mask tensor, the kernel
 * computes the visible cells from the row index) give the same bits as the same op with the mask
 * tensor that kind describes: in the scalar reference, and at every level through the tiled f16
 * path (several tiles of query rows, GQA groups of 1-8) and the per-row path (f32 or mixed K/V),
 * head sizes off the SIMD widths, a causal op whose queries are all its cells (nq == n_kv). */
static void attn_struct_case(test_ctx *t, rng *r, uint32_t ktype, uint32_t vtype, int64_t hd, int64_t nh,
                             int64_t nh_kv, int64_t nq, int64_t n_kv, int nt, int level) {
    const int64_t cap = n_kv + 3; /* the first n_kv cells of a larger cache */
    const size_t ksz = ktype == QUANT_TYPE_F16 ? 2 : 4, vsz = vtype == QUANT_TYPE_F16 ? 2 : 4;
    const size_t n_out = (size_t)(hd * nh * nq);
    float *q = malloc(n_out * sizeof(float)), *mask = malloc((size_t)(n_kv * nq) * sizeof(float));
    uint8_t *kc = malloc((size_t)(hd * nh_kv * cap) * ksz), *vc = malloc((size_t)(hd * nh_kv * cap) * vsz);
    float *o[4]; /* reference with mask / structured, backend with mask / structured */
    for (int i = 0; i < 4; i++) o[i] = malloc(n_out * sizeof(float));
    REQUIRE(q && mask && kc && vc && o[0] && o[1] && o[2] && o[3]);
    fill_f32(r, q, hd * nh * nq, 4.0f);
    for (int64_t i = 0; i < hd * nh_kv * cap; i++) {
        const float kv = rng_f(r) * 2.0f, vv = rng_f(r);
        const uint16_t a = fp32_to_fp16(kv), b = fp32_to_fp16(vv);
        if (ksz == 2) memcpy(kc + 2 * i, &a, 2);
        else memcpy(kc + 4 * i, &kv, 4);
        if (vsz == 2) memcpy(vc + 2 * i, &b, 2);
        else memcpy(vc + 4 * i, &vv, 4);
    }
    backend *be = make_backend(nt, level, false);
    REQUIRE(be);
    for (int32_t kind = BACKEND_ATTN_CAUSAL; kind <= BACKEND_ATTN_FULL; kind++) {
        for (int64_t iq = 0; iq < nq; iq++) {
            for (int64_t j = 0; j < n_kv; j++) {
                const bool vis = kind == BACKEND_ATTN_FULL || j <= n_kv - nq + iq;
                mask[iq * n_kv + j] = vis ? 0.0f : -INFINITY;
            }
        }
        backend_op op;
        memset(&op, 0, sizeof(op));
        op.kind = BACKEND_OP_ATTENTION;
        op.src[0] = tensor_3d(QUANT_TYPE_F32, q, hd, nh, nq);
        op.src[1] = tensor_3d(ktype, kc, hd, nh_kv, n_kv);
        op.src[2] = tensor_3d(vtype, vc, hd, nh_kv, n_kv);
        backend_op sop = op;
        op.src[3] = tensor_2d(QUANT_TYPE_F32, mask, n_kv, nq);
        op.i[0] = BACKEND_ATTN_MASK;
        sop.i[0] = kind;
        dfl_error err;
        memset(&err, 0, sizeof(err));
        op.dst = tensor_3d(QUANT_TYPE_F32, o[0], hd, nh, nq);
        REQUIRE(backend_op_validate(be, &op, &err) == DFL_OK);
        sop.dst = tensor_3d(QUANT_TYPE_F32, o[1], hd, nh, nq);
        REQUIRE(backend_op_validate(be, &sop, &err) == DFL_OK);
        cpu_op_attention_ref(&op);
        cpu_op_attention_ref(&sop);
        op.dst.data = o[2];
        sop.dst.data = o[3];
        memset(o[2], 0xff, n_out * sizeof(float));
        memset(o[3], 0xff, n_out * sizeof(float));
        run_op(be, &op);
        run_op(be, &sop);
        char what[160];
        snprintf(what, sizeof(what), "attention %s %s k %s v %s hd %lld nh %lld/%lld nq %lld n_kv %lld threads %d",
                 kind == BACKEND_ATTN_CAUSAL ? "causal" : "full", k_level_names[level],
                 ktype == QUANT_TYPE_F16 ? "f16" : "f32", vtype == QUANT_TYPE_F16 ? "f16" : "f32", (long long)hd,
                 (long long)nh, (long long)nh_kv, (long long)nq, (long long)n_kv, nt);
        CHECK_MSG(memcmp(o[0], o[1], n_out * sizeof(float)) == 0, "%s: reference, structured differs from the mask",
                  what);
        for (size_t i = 0; i < n_out; i++) {
            if (memcmp(&o[2][i], &o[3][i], sizeof(float)) != 0) {
                test_fail(t, __FILE__, __LINE__, "%s: structured differs from the mask at %zu: %.9g vs %.9g", what, i,
                          o[3][i], o[2][i]);
                break;
            }
        }
        close_enough(t, what, o[3], o[1], (int64_t)n_out, vtype == QUANT_TYPE_F16 ? 1e-3 : 2e-6, 2e-5);
    }
    backend_free(be);
    free(q); free(mask); free(kc); free(vc);
    for (int i = 0; i < 4; i++) free(o[i]);
}

TEST(backend_attention_structured_masks) {
    rng r = {21};
    const uint32_t F16 = QUANT_TYPE_F16, F32 = QUANT_TYPE_F32;
    for (int level = 0; level < 3; level++) {
        if (!level_available(level)) continue;
        for (int nt = 1; nt <= 3; nt += 2) {
            attn_struct_case(t, &r, F16, F16, 64, 4, 2, 5, 37, nt, level);
            attn_struct_case(t, &r, F16, F16, 128, 16, 8, 17, 200, nt, level);  /* verify-sized, GQA 2 */
            attn_struct_case(t, &r, F16, F16, 64, 8, 1, 40, 40, nt, level);     /* a prompt: nq == n_kv */
            attn_struct_case(t, &r, F16, F16, 33, 6, 6, 19, 90, nt, level);     /* group 1: 8 positions a tile */
            attn_struct_case(t, &r, F16, F16, 72, 4, 2, 1, 129, nt, level);     /* decode */
            attn_struct_case(t, &r, F32, F32, 47, 4, 2, 9, 41, nt, level);
            attn_struct_case(t, &r, F16, F32, 15, 4, 2, 9, 9, nt, level);
            attn_struct_case(t, &r, F32, F16, 64, 4, 1, 3, 70, nt, level);
        }
    }
}

/* The f16 attention helpers (dot_f16, axpy_f16) of every level against the scalar ones on lengths
 * around every SIMD width: a tail bug moves a result by O(1). */
TEST(backend_f16_dot_axpy_kernels) {
    rng r = {15};
    static const int64_t lens[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 72, 127, 129, 1000};
    float x[1000], y1[1000], y2[1000];
    uint16_t h[1000];
    cpu_kernels kr;
    cpu_kernels_init_ref(&kr);
    for (int level = 1; level < 3; level++) {
        if (!level_available(level)) continue;
        cpu_kernels ks;
        cpu_kernels_select(&ks, cpu_features_detect() & ~level_disable(level));
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            const int64_t n = lens[li];
            fill_f32(&r, x, n, 2.0f);
            double mag = 0.0;
            for (int64_t i = 0; i < n; i++) {
                h[i] = fp32_to_fp16(rng_f(&r) * 3.0f);
                mag += fabs((double)x[i] * fp16_to_fp32(h[i]));
            }
            /* dot: the same products, summed in another order */
            const float d1 = ks.dot_f16(x, h, n), d2 = kr.dot_f16(x, h, n);
            CHECK_MSG(isfinite(d1) && fabs((double)d1 - (double)d2) <= ldexp(1.0, -22) * (double)(n + 4) * mag,
                      "dot_f16 %s n %lld: %.9g vs ref %.9g", k_level_names[level], (long long)n, d1, d2);
            /* axpy: y += a * x elementwise (an fma may round once less) */
            fill_f32(&r, y1, n, 1.0f);
            memcpy(y2, y1, (size_t)n * sizeof(float));
            const float a = rng_f(&r) * 1.5f;
            ks.axpy_f16(y1, a, h, n);
            kr.axpy_f16(y2, a, h, n);
            char what[64];
            snprintf(what, sizeof(what), "axpy_f16 %s n %lld", k_level_names[level], (long long)n);
            close_enough(t, what, y1, y2, n, 1e-6, 1e-6);
            /* only [0, n) is written */
            for (int64_t i = 0; i < n; i++) y1[i] = 0.0f;
            if (n < 1000) {
                y1[n] = 123.0f;
                ks.axpy_f16(y1, a, h, n);
                CHECK_MSG(y1[n] == 123.0f, "%s: wrote past n", what);
            }
        }
    }
}

/* The attention reference against a direct f64 computation (f32 cache: no roundings). */
TEST(backend_op_attention_ref_semantics) {
    rng r = {9};
    const int64_t hd = 8, nh = 4, nh_kv = 2, nq = 3, n_kv = 6;
    float q[8 * 4 * 3], k[8 * 2 * 6], v[8 * 2 * 6], mask[6 * 3], out[8 * 4 * 3];
    fill_f32(&r, q, hd * nh * nq, 1.0f);
    fill_f32(&r, k, hd * nh_kv * n_kv, 1.0f);
    fill_f32(&r, v, hd * nh_kv * n_kv, 1.0f);
    for (int64_t iq = 0; iq < nq; iq++)
        for (int64_t j = 0; j < n_kv; j++) mask[iq * n_kv + j] = j <= iq + 3 ? 0.0f : -INFINITY;
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_ATTENTION;
    op.src[0] = tensor_3d(QUANT_TYPE_F32, q, hd, nh, nq);
    op.src[1] = tensor_3d(QUANT_TYPE_F32, k, hd, nh_kv, n_kv);
    op.src[2] = tensor_3d(QUANT_TYPE_F32, v, hd, nh_kv, n_kv);
    op.src[3] = tensor_2d(QUANT_TYPE_F32, mask, n_kv, nq);
    op.dst = tensor_3d(QUANT_TYPE_F32, out, hd, nh, nq);
    cpu_op_attention_ref(&op);
    for (int64_t iq = 0; iq < nq; iq++) {
        for (int64_t h = 0; h < nh; h++) {
            const int64_t hk = h / 2; /* GQA: heads 0,1 -> kv 0; 2,3 -> kv 1 */
            double s[6], mx = -1e300, sum = 0;
            for (int64_t j = 0; j <= iq + 3 && j < n_kv; j++) {
                double dot = 0;
                for (int64_t i = 0; i < hd; i++) dot += (double)q[(iq * nh + h) * hd + i] * k[(j * nh_kv + hk) * hd + i];
                s[j] = dot / sqrt((double)hd);
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = 0; j <= iq + 3 && j < n_kv; j++) sum += exp(s[j] - mx);
            for (int64_t i = 0; i < hd; i++) {
                double o = 0;
                for (int64_t j = 0; j <= iq + 3 && j < n_kv; j++) o += exp(s[j] - mx) / sum * v[(j * nh_kv + hk) * hd + i];
                CHECK_NEAR(out[(iq * nh + h) * hd + i], o, 1e-5);
            }
        }
    }
}

TEST(backend_op_set_get_rows) {
    rng r = {10};
    const uint32_t dtypes[3] = {QUANT_TYPE_F32, QUANT_TYPE_F16, QUANT_TYPE_BF16};
    for (int nt = 1; nt <= 2; nt++) {
        for (int di = 0; di < 3; di++) {
            for (int it = 0; it < 2; it++) {
                /* dst [256, 300] <- src [256, 280] rows, idx a permutation slice; big enough to split */
                const int64_t n = 256, nd = 300, ns = 280;
                const size_t esz = dtypes[di] == QUANT_TYPE_F32 ? 4 : 2;
                tv_arena a;
                tv_arena_init(&a, (size_t)(n * nd) * esz + (size_t)(n * ns) * 4 + (size_t)ns * 8 + 1024);
                uint8_t *dst = tv_arena_take(&a, (size_t)(n * nd) * esz);
                float *src = tv_arena_take(&a, (size_t)(n * ns) * 4);
                fill_f32(&r, src, n * ns, 4.0f);
                void *idx = tv_arena_take(&a, (size_t)ns * (it == 0 ? 4 : 8));
                for (int64_t i = 0; i < ns; i++) {
                    const int64_t v = (i * 7 + 3) % nd;
                    if (it == 0) ((int32_t *)idx)[i] = (int32_t)v; else ((int64_t *)idx)[i] = v;
                }
                tensor td = tensor_2d(dtypes[di], dst, n, nd);
                tensor ts = tensor_2d(QUANT_TYPE_F32, src, n, ns);
                tensor ti = tensor_1d(it == 0 ? QUANT_TYPE_I32 : QUANT_TYPE_I64, idx, ns);
                backend_op op = mkop(BACKEND_OP_SET_ROWS, td, &ts, &ti);
                check_light_op(t, "set_rows", &op, &a, nt, true, 0);
                tv_arena_free(&a);
            }
        }
        for (size_t ti = 0; ti < sizeof(k_mm_types) / sizeof(k_mm_types[0]); ti++) {
            const uint32_t type = k_mm_types[ti];
            const int64_t n = 512, ns = 9, ni = 140;
            void *wh = make_weight(&r, type, n, ns);
            REQUIRE(wh);
            tv_arena a;
            tv_arena_init(&a, quant_row_size(type, n) * (size_t)ns + (size_t)(n * ni) * 4 + (size_t)ni * 4 + 1024);
            void *w = tv_arena_take(&a, quant_row_size(type, n) * (size_t)ns);
            memcpy(w, wh, quant_row_size(type, n) * (size_t)ns);
            free(wh);
            float *mem = tv_arena_take(&a, (size_t)(n * ni) * 4);
            int32_t *idx = tv_arena_take(&a, (size_t)ni * 4);
            for (int64_t i = 0; i < ni; i++) idx[i] = (int32_t)((i * 5) % ns);
            tensor td = tensor_2d(QUANT_TYPE_F32, mem, n, ni);
            tensor tsrc = tensor_2d(type, w, n, ns);
            tensor tix = tensor_1d(QUANT_TYPE_I32, idx, ni);
            backend_op op = mkop(BACKEND_OP_GET_ROWS, td, &tsrc, &tix);
            check_light_op(t, "get_rows", &op, &a, nt, true, 0);
            /* and the values are the dequantized rows */
            float row[512];
            REQUIRE(quant_dequantize_row(type, (const uint8_t *)w + quant_row_size(type, n) * (size_t)idx[5], row, n));
            CHECK(memcmp(row, mem + 5 * n, (size_t)n * 4) == 0);
            tv_arena_free(&a);
        }
    }
}

TEST(backend_op_elementwise) {
    rng r = {11};
    for (int nt = 1; nt <= 3; nt++) {
        const int64_t n0 = 1000, n1 = 9, n2 = 8;
        const int64_t na = n0 * n1 * n2;
        tv_arena ar;
        tv_arena_init(&ar, (size_t)(3 * na + n0 * n2) * sizeof(float) + 1024);
        float *am = tv_arena_take(&ar, (size_t)na * 4), *bm = tv_arena_take(&ar, (size_t)na * 4);
        float *dm = tv_arena_take(&ar, (size_t)na * 4), *bbm = tv_arena_take(&ar, (size_t)(n0 * n2) * 4);
        fill_f32(&r, am, na, 3.0f);
        fill_f32(&r, bm, na, 3.0f);
        fill_f32(&r, dm, na, 3.0f);
        fill_f32(&r, bbm, n0 * n2, 3.0f);
        tensor a = tensor_3d(QUANT_TYPE_F32, am, n0, n1, n2);
        tensor b = tensor_3d(QUANT_TYPE_F32, bm, n0, n1, n2);
        tensor d = tensor_3d(QUANT_TYPE_F32, dm, n0, n1, n2);
        tensor bb = tensor_3d(QUANT_TYPE_F32, bbm, n0, 1, n2); /* broadcast over dim 1 */
        tensor bs = tensor_3d(QUANT_TYPE_F32, bbm, 1, n1, 1);  /* one value per row */
        backend_op op = mkop(BACKEND_OP_ADD, d, &a, &b);
        check_light_op(t, "add", &op, &ar, nt, true, 0);
        op = mkop(BACKEND_OP_ADD, a, &a, &bb);
        check_light_op(t, "add broadcast in place", &op, &ar, nt, true, 0);
        op = mkop(BACKEND_OP_MUL, d, &a, &bb);
        check_light_op(t, "mul broadcast", &op, &ar, nt, true, 0);
        op = mkop(BACKEND_OP_MUL, d, &a, &bs);
        check_light_op(t, "mul scalar per row", &op, &ar, nt, true, 0);
        op = mkop(BACKEND_OP_ADD, d, &a, &bs);
        check_light_op(t, "add scalar per row", &op, &ar, nt, true, 0);
        /* one value per group of rows, read through a strided view (DFlash2's coefficients):
         * a viewed [40, 25, 8, 9] (n0 = 1000 = 40 x 25), b [1, 25, 8, 1] with row stride 4 bytes */
        {
            const int64_t ne4[4] = {40, 25, n2, n1};
            const size_t nb4[4] = {4, 40 * 4, (size_t)n0 * 4, (size_t)(n0 * n2) * 4};
            tensor a4 = tensor_view(&a, ne4, nb4, 0), d4 = tensor_view(&d, ne4, nb4, 0);
            const int64_t neb[4] = {1, 25, n2, 1};
            const size_t nbb[4] = {4, 4, 25 * 4, (size_t)(25 * n2) * 4};
            tensor bg = tensor_view(&bb, neb, nbb, 4);
            op = mkop(BACKEND_OP_ADD, d4, &a4, &bg);
            check_light_op(t, "add one value per group (strided b)", &op, &ar, nt, true, 0);
            op = mkop(BACKEND_OP_MUL, d4, &a4, &bg);
            check_light_op(t, "mul one value per group (strided b)", &op, &ar, nt, true, 0);
        }
        op = mkop(BACKEND_OP_SWIGLU, d, &a, &b);
        check_light_op(t, "swiglu", &op, &ar, nt, false, 2e-6); /* SIMD exp: ulps */
        op = mkop(BACKEND_OP_SCALE, d, &a, NULL);
        op.f[0] = -0.375f;
        check_light_op(t, "scale", &op, &ar, nt, true, 0);
        op = mkop(BACKEND_OP_SOFTMAX, d, &a, NULL);
        check_light_op(t, "softmax", &op, &ar, nt, true, 0);
        tv_arena_free(&ar);
    }
    /* reference values by hand */
    float g[3] = {0.0f, 1.0f, -2.0f}, u[3] = {2.0f, 3.0f, 1.0f}, y[3];
    tensor tg = tensor_1d(QUANT_TYPE_F32, g, 3), tu = tensor_1d(QUANT_TYPE_F32, u, 3), ty = tensor_1d(QUANT_TYPE_F32, y, 3);
    backend_op op = mkop(BACKEND_OP_SWIGLU, ty, &tg, &tu);
    cpu_op_swiglu_ref(&op);
    CHECK_NEAR(y[0], 0.0, 0);
    CHECK_NEAR(y[1], 3.0 / (1.0 + exp(-1.0)), 1e-6);
    CHECK_NEAR(y[2], -2.0 / (1.0 + exp(2.0)), 1e-6);
    float s[4] = {1.0f, 2.0f, -INFINITY, 2.0f}, p[4];
    cpu_softmax_row_ref(p, s, 4);
    const double z = exp(-1.0) + 2.0;
    CHECK_NEAR(p[0], exp(-1.0) / z, 1e-7);
    CHECK_NEAR(p[1], 1.0 / z, 1e-7);
    CHECK_NEAR(p[2], 0.0, 0);
}

TEST(backend_op_copy) {
    rng r = {12};
    for (int nt = 1; nt <= 2; nt++) {
        /* f32 [128, 600] into a strided f16 view (every other column block of a cache [256, 600]) */
        const int64_t n = 128, rows = 600;
        tv_arena a;
        tv_arena_init(&a, (size_t)(n * rows) * 4 + (size_t)(2 * n * rows) * 2 + (size_t)(n * rows) * 4 + 1024);
        float *src = tv_arena_take(&a, (size_t)(n * rows) * 4);
        fill_f32(&r, src, n * rows, 100.0f);
        src[0] = 70000.0f; /* overflows f16 */
        src[1] = 1e-8f;    /* f16 subnormal range */
        uint16_t *cache = tv_arena_take(&a, (size_t)(2 * n * rows) * 2);
        float *back = tv_arena_take(&a, (size_t)(n * rows) * 4);
        tensor ts = tensor_2d(QUANT_TYPE_F32, src, n, rows);
        tensor tc = tensor_2d(QUANT_TYPE_F16, cache + n, n, rows);
        tc.nb[1] = (size_t)(2 * n) * 2;
        backend_op op = mkop(BACKEND_OP_COPY, tc, &ts, NULL);
        check_light_op(t, "copy f32 -> f16 strided", &op, &a, nt, true, 0);
        tensor tb = tensor_2d(QUANT_TYPE_F32, back, n, rows);
        op = mkop(BACKEND_OP_COPY, tb, &tc, NULL);
        check_light_op(t, "copy f16 -> f32", &op, &a, nt, true, 0);
        tensor tbf = tensor_2d(QUANT_TYPE_BF16, cache, n, rows);
        op = mkop(BACKEND_OP_COPY, tbf, &ts, NULL);
        check_light_op(t, "copy f32 -> bf16", &op, &a, nt, true, 0);
        tv_arena_free(&a);
    }
    float x = 1.5f;
    uint16_t h = 0;
    tensor tx = tensor_1d(QUANT_TYPE_F32, &x, 1), th = tensor_1d(QUANT_TYPE_F16, &h, 1);
    backend_op op = mkop(BACKEND_OP_COPY, th, &tx, NULL);
    cpu_op_copy_ref(&op);
    CHECK_EQ_INT(h, 0x3e00);
}

TEST(backend_op_argmax) {
    rng r = {13};
    for (int nt = 1; nt <= 2; nt++) {
        const int64_t n = 5000, rows = 20;
        tv_arena ar;
        tv_arena_init(&ar, (size_t)(n * rows) * 4 + (size_t)rows * 4 + 1024);
        float *a = tv_arena_take(&ar, (size_t)(n * rows) * 4);
        int32_t *out = tv_arena_take(&ar, (size_t)rows * 4);
        fill_f32(&r, a, n * rows, 1.0f);
        a[3 * n + 10] = 50.0f;
        a[3 * n + 4000] = 50.0f; /* tie: the first wins */
        tensor ta = tensor_2d(QUANT_TYPE_F32, a, n, rows);
        tensor td = tensor_1d(QUANT_TYPE_I32, out, rows);
        backend_op op = mkop(BACKEND_OP_ARGMAX, td, &ta, NULL);
        check_light_op(t, "argmax", &op, &ar, nt, true, 0);
        backend *be = make_backend(nt, 2, false);
        REQUIRE(be);
        run_op(be, &op);
        backend_free(be);
        CHECK_EQ_INT(((int32_t *)td.data)[3], 10);
        tv_arena_free(&ar);
    }
}

/* The light-op row kernels of every level against the scalar ones, on awkward lengths, with
 * ties, infinities and NaNs where the contract covers them. */
TEST(backend_light_row_kernels) {
    rng r = {14};
    static const int64_t lens[] = {1, 2, 7, 15, 16, 17, 31, 33, 64, 255, 256, 1000, 4097};
    float *a = malloc(8192 * sizeof(float)), *b = malloc(8192 * sizeof(float));
    float *d1 = malloc(8192 * sizeof(float)), *d2 = malloc(8192 * sizeof(float));
    uint16_t *h1 = malloc(8192 * sizeof(uint16_t)), *h2 = malloc(8192 * sizeof(uint16_t));
    REQUIRE(a && b && d1 && d2 && h1 && h2);
    for (int level = 1; level < 3; level++) {
        if (!level_available(level)) continue;
        cpu_kernels ks, kr;
        cpu_kernels_select(&ks, cpu_features_detect() & ~level_disable(level));
        cpu_kernels_init_ref(&kr);
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            const int64_t n = lens[li];
            fill_f32(&r, a, n, 20.0f);
            fill_f32(&r, b, n, 3.0f);
            /* rmsnorm: same products and roundings, an f64 sum in another order */
            ks.rmsnorm_row(d1, a, b, n, 1e-6f);
            kr.rmsnorm_row(d2, a, b, n, 1e-6f);
            close_enough(t, "rmsnorm row", d1, d2, n, 1e-7, 1e-6);
            ks.rmsnorm_row(d1, a, NULL, n, 1e-5f);
            kr.rmsnorm_row(d2, a, NULL, n, 1e-5f);
            close_enough(t, "rmsnorm row, no weight", d1, d2, n, 1e-7, 1e-6);
            /* swiglu over +-20 (e^20 would overflow a naive form) and the exact zeros */
            a[0] = 0.0f;
            if (n > 2) a[2] = -90.0f;
            ks.swiglu_row(d1, a, b, n);
            kr.swiglu_row(d2, a, b, n);
            close_enough(t, "swiglu row", d1, d2, n, 1e-7, 2e-6);
            /* add / mul: exact */
            ks.add_row(d1, a, b, n);
            kr.add_row(d2, a, b, n);
            CHECK_MSG(memcmp(d1, d2, (size_t)n * 4) == 0, "add row (n %lld) differs", (long long)n);
            ks.mul_row(d1, a, b, n);
            kr.mul_row(d2, a, b, n);
            CHECK_MSG(memcmp(d1, d2, (size_t)n * 4) == 0, "mul row (n %lld) differs", (long long)n);
            /* argmax: plain, a tie (the first wins), an infinity, a NaN (flagged as -1 - first index) */
            CHECK_EQ_INT(ks.argmax_row(a, n), kr.argmax_row(a, n));
            if (n >= 3) {
                a[n - 1] = 100.0f;
                a[n / 2] = 100.0f;
                CHECK_EQ_INT(ks.argmax_row(a, n), kr.argmax_row(a, n));
                CHECK_EQ_INT(kr.argmax_row(a, n), n / 2);
                /* a non-finite value anywhere (also in the SIMD tail) flags the row: -1 - its index */
                a[n - 1] = -INFINITY;
                CHECK_EQ_INT(ks.argmax_row(a, n), kr.argmax_row(a, n));
                CHECK_EQ_INT(kr.argmax_row(a, n), -n);
                a[n - 1] = 100.0f;
                a[n - 2] = INFINITY;
                CHECK_EQ_INT(ks.argmax_row(a, n), kr.argmax_row(a, n));
                CHECK_EQ_INT(kr.argmax_row(a, n), -1 - (n - 2));
                a[1] = NAN;
                CHECK_EQ_INT(ks.argmax_row(a, n), kr.argmax_row(a, n));
                CHECK_EQ_INT(kr.argmax_row(a, n), -2);
            }
            /* f16 rows: round to nearest even, overflow, subnormals */
            fill_f32(&r, a, n, 70000.0f);
            if (n > 4) {
                a[0] = 1e-8f;
                a[1] = 65520.0f; /* rounds to infinity */
                a[2] = -0.0f;
                a[3] = 1.0f + 1.0f / 2048.0f; /* a tie: to even */
            }
            ks.f16_row(h1, a, n);
            kr.f16_row(h2, a, n);
            CHECK_MSG(memcmp(h1, h2, (size_t)n * 2) == 0, "f16 row (n %lld) differs", (long long)n);
        }
        /* attention P V: awkward head sizes, row counts across the 6-row tile, strided values */
        static const int64_t hds[] = {8, 64, 72, 130}, nqs[] = {1, 5, 6, 7, 13}, nkvs[] = {1, 37};
        for (size_t hi = 0; hi < 4; hi++)
            for (size_t qi = 0; qi < 5; qi++)
                for (size_t ki = 0; ki < 2; ki++) {
                    const int64_t hd = hds[hi], nq = nqs[qi], nkv = nkvs[ki], vstride = hd + 3, ldp = nkv + 2;
                    REQUIRE(nkv * vstride <= 8192 && nq * ldp <= 8192 && nq * hd <= 8192);
                    fill_f32(&r, b, nq * ldp, 1.0f);
                    for (int64_t i = 0; i < nkv * vstride; i++) h1[i] = fp32_to_fp16(rng_f(&r));
                    ks.attn_pv_f16(d1, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd);
                    kr.attn_pv_f16(d2, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd);
                    close_enough(t, "attention P V", d1, d2, nq * hd, 1e-6, 1e-5);
                    /* a key masked for every row (p = 0) whose value overflowed f16 to inf adds
                     * nothing: the outputs stay finite and equal the reference's */
                    if (nkv > 1) {
                        for (int64_t q = 0; q < nq; q++) b[q * ldp + nkv - 1] = 0.0f;
                        for (int64_t i = 0; i < hd; i++) h1[(nkv - 1) * vstride + i] = 0x7c00; /* +inf */
                        ks.attn_pv_f16(d1, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd);
                        kr.attn_pv_f16(d2, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd);
                        close_enough(t, "attention P V, masked inf value", d1, d2, nq * hd, 1e-6, 1e-5);
                    }
                }
    }
    free(a); free(b); free(d1); free(d2); free(h1); free(h2);
}

/* ---- validation ---------------------------------------------------------------------------- */

TEST(backend_op_validation_messages) {
    backend *be = make_backend(1, 2, false);
    REQUIRE(be);
    float buf[4096];
    dfl_error err;
    backend_op op;

    memset(&err, 0, sizeof(err));
    op = mkop(BACKEND_OP_MATMUL, tensor_2d(QUANT_TYPE_F32, buf, 8, 2), NULL, NULL);
    op.src[0] = tensor_2d(QUANT_TYPE_F32, buf, 64, 8);
    op.src[1] = tensor_2d(QUANT_TYPE_F32, buf, 32, 2); /* n_in mismatch */
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "matmul");
    CHECK_STR_CONTAINS(err.msg, "x");

    memset(&err, 0, sizeof(err));
    op.src[1] = tensor_2d(QUANT_TYPE_F32, buf, 64, 2);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_OK);
    op.src[0] = tensor_2d(16 /* iq2_xxs */, buf, 256, 8);
    op.src[1] = tensor_2d(QUANT_TYPE_F32, buf, 256, 2);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "iq2_xxs");

    memset(&err, 0, sizeof(err));
    int32_t pos[4] = {0};
    tensor x = tensor_3d(QUANT_TYPE_F32, buf, 8, 2, 4);
    tensor p = tensor_1d(QUANT_TYPE_I32, pos, 4);
    op = mkop(BACKEND_OP_ROPE_NEOX, x, &x, &p);
    op.f[0] = 10000.0f;
    op.i[0] = 3;
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "n_rot");

    memset(&err, 0, sizeof(err));
    op = mkop(BACKEND_OP_ATTENTION, tensor_3d(QUANT_TYPE_F32, buf, 8, 3, 1), NULL, NULL);
    op.src[0] = tensor_3d(QUANT_TYPE_F32, buf, 8, 3, 1);
    op.src[1] = tensor_3d(QUANT_TYPE_F16, buf, 8, 2, 5);
    op.src[2] = tensor_3d(QUANT_TYPE_F16, buf, 8, 2, 5);
    op.src[3] = tensor_2d(QUANT_TYPE_F32, buf, 5, 1);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "n_head_kv");
    /* structured mask kinds: a known kind, no mask tensor beside it, causal queries within the cells */
    memset(&err, 0, sizeof(err));
    op.src[1] = tensor_3d(QUANT_TYPE_F16, buf, 8, 3, 5);
    op.src[2] = tensor_3d(QUANT_TYPE_F16, buf, 8, 3, 5);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_OK);
    op.i[0] = 7;
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "mask kind 7 is unknown");
    memset(&err, 0, sizeof(err));
    op.i[0] = BACKEND_ATTN_CAUSAL;
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "takes no mask tensor");
    memset(&err, 0, sizeof(err));
    op.src[3] = tensor_2d(QUANT_TYPE_F32, NULL, 5, 1);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_OK);
    op.src[0] = tensor_3d(QUANT_TYPE_F32, buf, 8, 3, 6);
    op.dst = tensor_3d(QUANT_TYPE_F32, buf, 8, 3, 6);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "causal with 6 query rows over 5 cells");
    op.i[0] = BACKEND_ATTN_FULL; /* any number of rows sees every cell */
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_OK);

    memset(&err, 0, sizeof(err));
    tensor a = tensor_2d(QUANT_TYPE_F32, buf, 10, 3), b = tensor_2d(QUANT_TYPE_F32, buf, 10, 2);
    op = mkop(BACKEND_OP_ADD, a, &a, &b);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "broadcast");

    memset(&err, 0, sizeof(err));
    tensor nodata = tensor_2d(QUANT_TYPE_F32, NULL, 10, 3);
    op = mkop(BACKEND_OP_SCALE, a, &nodata, NULL);
    CHECK_EQ_INT(backend_op_validate(be, &op, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "no data");
    backend_free(be);
}

/* ---- matmul + argmax (the drafter's greedy head) --------------------------------------------- */

/* op_matmul_argmax gives the ids of op_matmul + op_scale + op_argmax on the same backend, for
 * every weight type and level, 1-3 threads, one chunk or dozens: a max tied across chunks (a
 * weight row copied into the first and the last chunk: the first index wins), a negative scale,
 * a NaN weight row in a late chunk and a NaN activation row (flagged -1 - first index). */
static void mmax_case(test_ctx *t, rng *r, backend *be, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_rows,
                      float scale, const char *lv) {
    void *w = make_weight(r, type, n_in, n_out);
    float *x = malloc((size_t)(n_in * n_rows) * sizeof(float)), *lg = malloc((size_t)(n_out * n_rows) * 4);
    int32_t ids[2][64];
    REQUIRE(w && x && lg && n_rows <= 64);
    fill_f32(r, x, n_in * n_rows, 1.0f);
    const size_t row = quant_row_size(type, n_in);
    backend_op mm, sc, am, fu;
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
        run_op(be, &mm);
        run_op(be, &sc);
        run_op(be, &am);
        memset(ids[1], 0x55, sizeof(ids[1]));
        run_op(be, &fu);
        for (int64_t i = 0; i < n_rows; i++) {
            CHECK_MSG(ids[1][i] == ids[0][i], "matmul_argmax %s %s [%lld -> %lld] x %lld scale %g step %d row %lld: %d vs %d",
                      quant_type_get(type)->name, lv, (long long)n_in, (long long)n_out, (long long)n_rows,
                      (double)scale, step, (long long)i, ids[1][i], ids[0][i]);
        }
        if (step == 1 && n_out > 40) CHECK(ids[1][0] == 3 || ids[1][0] < 3);
        if (step == 2 && type == QUANT_TYPE_F32) CHECK_EQ_INT(ids[1][0], (int)(-1 - (n_out - n_out / 3)));
        if (step == 3 && n_rows > 1 && quant_type_get(type)->blck_size == 1) CHECK_EQ_INT(ids[1][1], -1);
    }
    free(w); free(x); free(lg);
}

TEST(backend_matmul_argmax_fused) {
    rng r = {4242};
    for (int level = 0; level < 3; level++) {
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
    for (int level = 0; level < 3; level++) {
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
    for (int level = 0; level < 3; level++) {
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

/* The attention softmax kernels against the reference softmax (exp within a few ulp). */
TEST(backend_softmax_kernels) {
    rng r = {31};
    for (int level = 1; level < 3; level++) {
        if (!level_available(level)) continue;
        cpu_kernels k;
        cpu_kernels_select(&k, cpu_features_detect() & ~level_disable(level));
        const int64_t sizes[6] = {1, 7, 16, 17, 300, 1029};
        for (int si = 0; si < 6; si++) {
            const int64_t n = sizes[si];
            float s[1029], p[1029], pr[1029];
            for (int64_t i = 0; i < n; i++) s[i] = rng_f(&r) * 30.0f;
            for (int64_t i = 0; i < n; i += 3) s[i] = -INFINITY; /* masked cells */
            if (n > 2) s[n - 1] = -200.0f;                       /* underflows to 0 */
            cpu_softmax_row_ref(pr, s, n);
            k.softmax_row(p, s, n);
            double sum = 0.0;
            for (int64_t i = 0; i < n; i++) sum += p[i];
            char what[64];
            snprintf(what, sizeof(what), "softmax %s n %lld", k_level_names[level], (long long)n);
            close_enough(t, what, p, pr, n, 1e-7, 2e-6);
            if (n > 1) CHECK_NEAR(sum, 1.0, 1e-5);
            for (int64_t i = 0; i < n; i += 3) CHECK_MSG(p[i] == 0.0f, "%s: masked cell %lld is %g", what, (long long)i, p[i]);
            /* in place, and a fully masked row */
            k.softmax_row(s, s, n);
            CHECK(memcmp(s, p, (size_t)n * sizeof(float)) == 0);
            for (int64_t i = 0; i < n; i++) s[i] = -INFINITY;
            k.softmax_row(p, s, n);
            for (int64_t i = 0; i < n; i++) CHECK(p[i] == 0.0f);
        }
    }
}

/* A NaN or +Inf score is never hidden (a broken weight must reach the logits, where decoding
 * reports it): the softmax row is NaN for the reference and every kernel level, and so is the
 * attention output of that head; an all -Inf row still gives zeros. */
TEST(backend_nonfinite_scores_propagate) {
    rng r = {41};
    for (int level = 0; level < 3; level++) {
        if (!level_available(level)) continue;
        cpu_kernels k;
        cpu_kernels_select(&k, cpu_features_detect() & ~level_disable(level));
        const int64_t sizes[4] = {1, 7, 17, 300};
        for (int si = 0; si < 4; si++) {
            const int64_t n = sizes[si];
            for (int bad = 0; bad < 2; bad++) {
                float s[300], p[300];
                for (int64_t i = 0; i < n; i++) s[i] = rng_f(&r) * 10.0f;
                s[n / 2] = bad ? INFINITY : NAN;
                for (int impl = 0; impl < 2; impl++) {
                    if (impl == 0) cpu_softmax_row_ref(p, s, n);
                    else k.softmax_row(p, s, n);
                    for (int64_t i = 0; i < n; i++) {
                        CHECK_MSG(isnan(p[i]), "%s %s n %lld %s: p[%lld] = %g", impl ? "kernel" : "ref", k_level_names[level],
                                  (long long)n, bad ? "inf" : "nan", (long long)i, p[i]);
                    }
                }
            }
        }
    }
    for (int f16 = 0; f16 < 2; f16++) {
        const int64_t hd = 64, nh = 4, nh_kv = 2, nq = 17, n_kv = 200;
        const size_t esz = f16 ? 2 : 4;
        float *q = calloc((size_t)(hd * nh * nq), sizeof(float)), *mask = calloc((size_t)(n_kv * nq), sizeof(float));
        float *out = malloc((size_t)(hd * nh * nq) * sizeof(float));
        uint8_t *kc = calloc((size_t)(hd * nh_kv * n_kv), esz), *vc = calloc((size_t)(hd * nh_kv * n_kv), esz);
        REQUIRE(q && mask && out && kc && vc);
        fill_f32(&r, q, hd * nh * nq, 1.0f);
        q[5] = NAN; /* head 0 of query 0 */
        backend_op op;
        memset(&op, 0, sizeof(op));
        op.kind = BACKEND_OP_ATTENTION;
        op.src[0] = tensor_3d(QUANT_TYPE_F32, q, hd, nh, nq);
        op.src[1] = tensor_3d(f16 ? QUANT_TYPE_F16 : QUANT_TYPE_F32, kc, hd, nh_kv, n_kv);
        op.src[2] = tensor_3d(f16 ? QUANT_TYPE_F16 : QUANT_TYPE_F32, vc, hd, nh_kv, n_kv);
        op.src[3] = tensor_2d(QUANT_TYPE_F32, mask, n_kv, nq);
        op.dst = tensor_3d(QUANT_TYPE_F32, out, hd, nh, nq);
        for (int path = 0; path < 4; path++) {
            memset(out, 0, (size_t)(hd * nh * nq) * sizeof(float));
            if (path == 0) {
                cpu_op_attention_ref(&op);
            } else {
                if (!level_available(path - 1)) continue;
                backend *be = make_backend(1, path - 1, false);
                REQUIRE(be);
                run_op(be, &op);
                backend_free(be);
            }
            for (int64_t i = 0; i < hd; i++) CHECK_MSG(isnan(out[i]), "f16 %d path %d: out[%lld] = %g", f16, path, (long long)i, out[i]);
            for (int64_t i = hd; i < hd * nh * nq; i++) CHECK(!isnan(out[i]));
        }
        free(q); free(mask); free(out); free(kc); free(vc);
    }
}
