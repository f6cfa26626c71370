/* test_backend_util.c: the shared CPU backend test helpers (test_backend_util.h). */
#include "test_backend_util.h"
#include "test_views.h"

#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/fp16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------------------- */


uint32_t rng_u32(rng *r) {
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 33);
}

/* uniform in [-1, 1) */
float rng_f(rng *r) { return (float)rng_u32(r) / 2147483648.0f - 1.0f; }

void fill_f32(rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float v = rng_f(r) * scale;
        if (rng_u32(r) % 97 == 0) v *= 8.0f; /* occasional outliers */
        x[i] = v;
    }
}

/* Feature levels: 0 scalar, 1 avx2, 2 avx512 (VNNI, without AMX), 3 avx512 with AMX (if the machine
 * has them: the AMX kernels take some row counts and types, so on an AMX machine level 2 runs the
 * VNNI kernels those would hide). */
const char *const k_level_names[TEST_LEVELS] = {"scalar", "avx2", "avx512", "avx512+amx"};

uint32_t level_disable(int level) {
    switch (level) {
    case 0: return ~0u;
    case 1: return BACKEND_CPU_FEATURE_AVX512 | BACKEND_CPU_FEATURE_AVX512_VNNI | BACKEND_CPU_FEATURE_AVX512_BF16 |
                   BACKEND_CPU_FEATURE_AMX_INT8 | BACKEND_CPU_FEATURE_AMX_BF16;
    case 2: return BACKEND_CPU_FEATURE_AMX_INT8 | BACKEND_CPU_FEATURE_AMX_BF16;
    default: return 0;
    }
}

bool level_available(int level) {
    uint32_t f = cpu_features_detect();
    if (level == 1) return (f & BACKEND_CPU_FEATURE_AVX2) != 0;
    if (level == 2) return (f & BACKEND_CPU_FEATURE_AVX512) && (f & BACKEND_CPU_FEATURE_AVX512_VNNI);
    if (level == 3) {
        return (f & BACKEND_CPU_FEATURE_AVX512) && (f & BACKEND_CPU_FEATURE_AVX512_VNNI) &&
               (f & (BACKEND_CPU_FEATURE_AMX_INT8 | BACKEND_CPU_FEATURE_AMX_BF16));
    }
    return true;
}

backend *make_backend(int n_threads, int level, bool async) {
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
void run_op(backend *be, const backend_op *op) {
    dfl_error err;
    memset(&err, 0, sizeof(err));
    backend_queue *q = backend_queue_new(be, &err);
    DFL_ASSERT(q != NULL);
    backend_queue_submit(q, op);
    backend_queue_synchronize(q);
    backend_queue_free(q);
}

/* max |a - b| / (tol_abs + tol_rel * |b|) over n values; > 1 fails. Non-finite values fail. */
bool close_enough(test_ctx *t, const char *what, const float *a, const float *b, int64_t n, double tol_abs,
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

uint16_t rand_f16(rng *r, float lo, float hi) {
    float u = (rng_f(r) + 1.0f) * 0.5f;
    return fp32_to_fp16(lo + u * (hi - lo));
}

/* A [n_in, n_out] weight of type `type` with random content (all block fields random). */
void fill_weight(rng *r, uint32_t type, uint8_t *w, int64_t n_in, int64_t n_out) {
    const size_t row = quant_row_size(type, n_in);
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
            DFL_ASSERT(0 && "fill_weight: type");
        }
    }
}

void *make_weight(rng *r, uint32_t type, int64_t n_in, int64_t n_out) {
    uint8_t *w = malloc(quant_row_size(type, n_in) * (size_t)n_out + 64);
    DFL_ASSERT(w != NULL);
    fill_weight(r, type, w, n_in, n_out);
    return w;
}

const uint32_t k_mm_types[] = {QUANT_TYPE_F32,  QUANT_TYPE_F16,    QUANT_TYPE_BF16, QUANT_TYPE_Q8_0,
                                      QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_K,   QUANT_TYPE_Q6_K, QUANT_TYPE_Q4_1,
                                      QUANT_TYPE_Q5_0, QUANT_TYPE_Q5_1,   QUANT_TYPE_IQ4_NL, QUANT_TYPE_Q2_K,
                                      QUANT_TYPE_Q3_K, QUANT_TYPE_Q5_K,   QUANT_TYPE_IQ4_XS};

double mm_budget(uint32_t type) {
    switch (type) {
    case QUANT_TYPE_F32: return 1e-6;
    case QUANT_TYPE_F16: return 7e-4;
    default: return 5e-3;
    }
}

/* N[r][o] = sum_i |w_o,i| * max_i |x_r,i| */
void mm_norms(double *N, uint32_t type, const void *w, int64_t n_in, int64_t n_out, const float *x,
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


/* (n_in, n_out, n_rows) triples covering every awkward size at least once per block size */
const mm_case k_cases_32[] = {
    {32, 1, 1}, {64, 3, 2}, {96, 7, 3}, {256, 17, 7}, {512, 127, 16}, {1024, 129, 17},
    {1088, 1000, 1}, {96, 33, 33}, {2048, 64, 4}, {160, 129, 16}, {160, 9, 15}, {96, 5, 64},
    /* n_in not a multiple of 32 (f32 / f16 / bf16 only): the SIMD tail loops of every level */
    {33, 5, 3}, {47, 17, 7}, {72, 129, 16}, {33, 64, 17}, {47, 1, 1}, {1, 9, 2}, {15, 33, 6},
    /* rows over several row blocks of the matmul driver (32 rows of f32, 96 of int8 at n_in 4096) */
    {4096, 40, 100},
};
const mm_case k_cases_256[] = {
    {256, 1, 1}, {256, 3, 2}, {512, 7, 3}, {768, 17, 7}, {1024, 127, 16}, {1280, 129, 17},
    {512, 1000, 1}, {256, 33, 33}, {2048, 64, 4}, {768, 9, 15}, {512, 5, 64}, {4096, 40, 130},
};

/* Runs op_matmul on be; dst [n_out, n_rows] */
void mm_run(backend *be, uint32_t type, const void *w, int64_t n_in, int64_t n_out, const float *x,
                   int64_t n_rows, float *dst) {
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_MATMUL;
    op.dst = tensor_2d(QUANT_TYPE_F32, dst, n_out, n_rows);
    op.src[0] = tensor_2d(type, (void *)w, n_in, n_out);
    op.src[1] = tensor_2d(QUANT_TYPE_F32, (void *)x, n_in, n_rows);
    run_op(be, &op);
}

/* A [n_in, n_out] Q4_K / Q6_K weight: random blocks (make_weight), or (extreme) every quant at
 * its maximum with the largest scales (Q4_K 63 / 63, Q6_K -128), the bounds of the kernels'
 * integer sums. */
void *make_kq_weight(rng *r, uint32_t type, int64_t n_in, int64_t n_out, bool extreme) {
    if (!extreme) return make_weight(r, type, n_in, n_out);
    const size_t row = quant_row_size(type, n_in);
    uint8_t *w = malloc(row * (size_t)n_out);
    DFL_ASSERT(w != NULL);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t b = 0; b < n_in / QK_K; b++) {
            if (type == QUANT_TYPE_Q4_K) {
                block_q4_K blk;
                blk.d = rand_f16(r, 0.0005f, 0.004f);
                blk.dmin = rand_f16(r, 0.0f, 0.004f);
                memset(blk.scales, 0xff, sizeof(blk.scales));
                memset(blk.qs, 0xff, sizeof(blk.qs));
                memcpy(w + (size_t)o * row + (size_t)b * sizeof(blk), &blk, sizeof(blk));
            } else {
                block_q6_K blk;
                memset(blk.ql, 0xff, sizeof(blk.ql));
                memset(blk.qh, 0xff, sizeof(blk.qh));
                memset(blk.scales, 0x80, sizeof(blk.scales)); /* -128 */
                blk.d = rand_f16(r, -0.0005f, 0.0005f);
                memcpy(w + (size_t)o * row + (size_t)b * sizeof(blk), &blk, sizeof(blk));
            }
        }
    }
    return w;
}

int64_t first_bit_diff(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    }
    return -1;
}

bool range_call_ok(test_ctx *t, const char *what, const float *y2, const float *y, int64_t n_out, int64_t n_rows,
                   int64_t a, int64_t nr, int64_t c, int64_t d) {
    for (int64_t i = 0; i < n_out * n_rows; i++) {
        const int64_t row = i / n_out, o = i % n_out;
        const bool inside = row >= a && row < a + nr && o >= c && o < d;
        uint32_t u;
        memcpy(&u, &y2[i], 4);
        if ((!inside && u != 0xffffffffu) || (inside && memcmp(&y2[i], &y[i], 4) != 0)) {
            test_fail(t, __FILE__, __LINE__, "%s: rows [%lld, %lld) outputs [%lld, %lld): row %lld out %lld %s (%.9g, full call %.9g)",
                      what, (long long)a, (long long)(a + nr), (long long)c, (long long)d, (long long)row, (long long)o,
                      inside ? "differs from the full call" : "written", y2[i], y[i]);
            return false;
        }
    }
    return true;
}

void *prep_act(const cpu_kernels *k, uint32_t wtype, cpu_act *act, const float *x, int64_t n_in, int64_t n_rows) {
    const cpu_dot_type dot = cpu_dot_type_of(wtype);
    const size_t bytes = cpu_act_bytes(dot, n_in, n_rows);
    void *mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
    DFL_ASSERT(mem != NULL);
    memset(mem, 0, bytes);
    cpu_act_layout(act, dot, n_in, n_rows, mem);
    for (int64_t r = 0; r < n_rows; r++) k->act_row[wtype](act, r, x + r * n_in);
    return mem;
}

bool mm_ops_same_bits(backend *be, tensor w0, tensor w1, const float *x, int64_t n_rows) {
    const int64_t n_in = w0.ne[0], n_out = w0.ne[1];
    float *y[2] = {malloc(sizeof(float) * (size_t)(n_out * n_rows)), malloc(sizeof(float) * (size_t)(n_out * n_rows))};
    int32_t *am[2] = {malloc(sizeof(int32_t) * (size_t)n_rows), malloc(sizeof(int32_t) * (size_t)n_rows)};
    DFL_ASSERT(y[0] && y[1] && am[0] && am[1]);
    for (int k = 0; k < 2; k++) {
        backend_op op;
        memset(&op, 0, sizeof(op));
        op.kind = BACKEND_OP_MATMUL;
        op.src[0] = k == 0 ? w0 : w1;
        op.src[1] = tensor_2d(QUANT_TYPE_F32, (void *)x, n_in, n_rows);
        op.dst = tensor_2d(QUANT_TYPE_F32, y[k], n_out, n_rows);
        run_op(be, &op);
        op.kind = BACKEND_OP_MATMUL_ARGMAX;
        op.f[0] = 0.5f;
        op.dst = tensor_1d(QUANT_TYPE_I32, am[k], n_rows);
        run_op(be, &op);
    }
    const bool same = first_bit_diff(y[0], y[1], n_out * n_rows) < 0 &&
                      memcmp(am[0], am[1], sizeof(int32_t) * (size_t)n_rows) == 0;
    free(y[0]); free(y[1]); free(am[0]); free(am[1]);
    return same;
}
