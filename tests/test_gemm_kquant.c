/* test_gemm_kquant.c: the Q4_K / Q6_K matmul kernels of every CPU feature level this machine has
 * (scalar, avx2, avx512) on the batched shapes of verify and prefill: awkward super-block counts
 * (n_in 256, 768, 2816), output counts that are not multiples of a kernel's weight group (1, 3, 13,
 * 16, 37) and row counts around its row tiles (1, 3, 4, 5, 16, 17, 33, 130).
 * - against cpu_matmul_q_ref (same prepared activations, exact integer sums in f64) within
 *   2^-22 * (n_in / 32 + 8) * N, N = sum_i |w_i| * max_i |x_i| (f32 rounding of the scale
 *   products and sums only), random and extreme blocks (all-max quants, largest scales, |x| = 127);
 * - batch invariance, bit for bit: a row computed alone (decode), in any row range or tile, and an
 *   output in any output range or lane of a weight group, give the same bits as in the full call;
 *   the same through the backend's matmul op (row blocks, output chunks, 2 threads). */
#include "test.h"
#include "test_backend_util.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/fp16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* x [n_rows, n_in]: random with outliers; row 1 zero, row 2 all equal (every q = -127) */
static void kq_fill_x(rng *r, float *x, int64_t n_in, int64_t n_rows, bool extreme) {
    for (int64_t i = 0; i < n_in * n_rows; i++) {
        float v = rng_f(r) * 2.0f;
        if (rng_u32(r) % 97 == 0) v *= 8.0f;
        x[i] = extreme ? 1.5f : v;
    }
    if (n_rows >= 2) memset(x + n_in, 0, (size_t)n_in * sizeof(float));
    if (n_rows >= 3) {
        for (int64_t i = 0; i < n_in; i++) x[2 * n_in + i] = 0.75f;
    }
}

static const uint32_t k_types[2] = {QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K};
static const int64_t k_n_in[3] = {256, 768, 2816};
static const int64_t k_n_out[5] = {1, 3, 13, 16, 37};
static const int64_t k_rows[8] = {1, 3, 4, 5, 16, 17, 33, 130};

/* One shape: prepared activations (byte-identical to the scalar preparation), the kernel over
 * all rows and outputs against cpu_matmul_q_ref; returns the kernel's output in y (caller frees). */
static float *kq_run_case(test_ctx *t, const cpu_kernels *ks, const cpu_kernels *kref, int level, uint32_t type,
                          const void *w, const float *x, int64_t n_in, int64_t n_out, int64_t n_rows, cpu_act *act,
                          void **act_mem, const char *what) {
    const size_t bytes = cpu_act_bytes(CPU_DOT_Q8_K, n_in, n_rows);
    void *m1 = aligned_alloc(64, (bytes + 63) / 64 * 64), *m2 = aligned_alloc(64, (bytes + 63) / 64 * 64);
    float *y = malloc((size_t)(n_out * n_rows) * sizeof(float));
    float *yq = malloc((size_t)(n_out * n_rows) * sizeof(float));
    double *N = malloc((size_t)(n_out * n_rows) * sizeof(double));
    DFL_ASSERT(m1 && m2 && y && yq && N);
    memset(m1, 0, bytes);
    memset(m2, 0, bytes);
    cpu_act a2;
    cpu_act_layout(act, CPU_DOT_Q8_K, n_in, n_rows, m1);
    cpu_act_layout(&a2, CPU_DOT_Q8_K, n_in, n_rows, m2);
    for (int64_t r = 0; r < n_rows; r++) {
        ks->act_row[type](act, r, x + r * n_in);
        kref->act_row[type](&a2, r, x + r * n_in);
    }
    CHECK_MSG(memcmp(m1, m2, bytes) == 0, "%s: prepared activations %s %s differ from the scalar ones (%lld x %lld)",
              what, quant_type_get(type)->name, k_level_names[level], (long long)n_in, (long long)n_rows);
    const size_t wrow = quant_row_size(type, n_in);
    memset(y, 0xff, (size_t)(n_out * n_rows) * sizeof(float)); /* NaN poison */
    ks->matmul[type](w, wrow, act, 0, n_rows, y, n_out, 0, n_out);
    cpu_matmul_q_ref(type, w, wrow, &a2, 0, n_rows, yq, n_out, 0, n_out);
    mm_norms(N, type, w, n_in, n_out, x, n_rows);
    const double eps = ldexp(1.0, -22) * (double)(n_in / 32 + 8);
    for (int64_t i = 0; i < n_out * n_rows; i++) {
        if (!isfinite(y[i]) || fabs((double)y[i] - (double)yq[i]) > eps * N[i]) {
            test_fail(t, __FILE__, __LINE__, "%s: %s %s [%lld -> %lld] x %lld rows: out %lld (row %lld): %.9g vs ref %.9g",
                      what, quant_type_get(type)->name, k_level_names[level], (long long)n_in, (long long)n_out,
                      (long long)n_rows, (long long)(i % n_out), (long long)(i / n_out), y[i], yq[i]);
            break;
        }
    }
    free(m2); free(yq); free(N);
    *act_mem = m1;
    return y;
}

TEST(gemm_kquant_vs_ref) {
    rng r = {4242};
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        cpu_kernels ks, kref;
        cpu_kernels_select(&ks, cpu_features_detect() & ~level_disable(level));
        cpu_kernels_init_ref(&kref);
        for (int ti = 0; ti < 2; ti++) {
            for (int ni = 0; ni < 3; ni++) {
                for (int oi = 0; oi < 5; oi++) {
                    for (int ri = 0; ri < 8; ri++) {
                        /* the largest shapes once per n_out only, to keep the test short */
                        if (k_n_in[ni] == 2816 && k_rows[ri] == 130 && oi != 4) continue;
                        const bool extreme = (oi + ri) % 7 == 3;
                        const int64_t n_in = k_n_in[ni], n_out = k_n_out[oi], n_rows = k_rows[ri];
                        void *w = make_kq_weight(&r, k_types[ti], n_in, n_out, extreme);
                        float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
                        REQUIRE(w && x);
                        kq_fill_x(&r, x, n_in, n_rows, extreme);
                        cpu_act act;
                        void *mem;
                        float *y = kq_run_case(t, &ks, &kref, level, k_types[ti], w, x, n_in, n_out, n_rows, &act, &mem,
                                               extreme ? "extreme" : "random");
                        free(y); free(mem); free(x); free(w);
                    }
                }
            }
        }
    }
}

/* Every row range [a, b) and output range [c, d) of a call gives the bits of the full call. */
TEST(gemm_kquant_batch_invariant_kernel) {
    rng r = {777};
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        cpu_kernels ks, kref;
        cpu_kernels_select(&ks, cpu_features_detect() & ~level_disable(level));
        cpu_kernels_init_ref(&kref);
        for (int ti = 0; ti < 2; ti++) {
            for (int ni = 0; ni < 3; ni++) {
                const uint32_t type = k_types[ti];
                const int64_t n_in = k_n_in[ni], n_out = 37, n_rows = 130;
                void *w = make_kq_weight(&r, type, n_in, n_out, false);
                float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
                float *y2 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                REQUIRE(w && x && y2);
                kq_fill_x(&r, x, n_in, n_rows, false);
                cpu_act act;
                void *mem;
                float *y = kq_run_case(t, &ks, &kref, level, type, w, x, n_in, n_out, n_rows, &act, &mem, "invariance");
                const size_t wrow = quant_row_size(type, n_in);
                /* row ranges of every length 1 .. 17 (each tile size and its tails) and a long one,
                 * at several starts; output ranges starting at every lane offset of a group */
                int bad = 0;
                for (int64_t len = 1; len <= 18 && !bad; len++) {
                    const int64_t a = len == 18 ? 7 : (len * 13) % (n_rows - len);
                    const int64_t nr = len == 18 ? 113 : len;
                    const int64_t c = len % 16, d = n_out - (len % 5);
                    memset(y2, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                    ks.matmul[type](w, wrow, &act, a, nr, y2, n_out, c, d);
                    for (int64_t i = 0; i < n_out * n_rows && !bad; i++) { /* nothing outside the ranges */
                        const int64_t row = i / n_out, o = i % n_out;
                        uint32_t u;
                        memcpy(&u, &y2[i], 4);
                        if ((row < a || row >= a + nr || o < c || o >= d) && u != 0xffffffffu) {
                            test_fail(t, __FILE__, __LINE__, "%s %s n_in %lld: rows [%lld, %lld) outputs [%lld, %lld) wrote row %lld out %lld",
                                      quant_type_get(type)->name, k_level_names[level], (long long)n_in, (long long)a,
                                      (long long)(a + nr), (long long)c, (long long)d, (long long)row, (long long)o);
                            bad = 1;
                        }
                    }
                    for (int64_t row = a; row < a + nr && !bad; row++) {
                        for (int64_t o = c; o < d; o++) {
                            if (memcmp(&y2[row * n_out + o], &y[row * n_out + o], sizeof(float)) != 0) {
                                test_fail(t, __FILE__, __LINE__,
                                          "%s %s n_in %lld: rows [%lld, %lld) outputs [%lld, %lld): row %lld out %lld "
                                          "%.9g, full call %.9g",
                                          quant_type_get(type)->name, k_level_names[level], (long long)n_in, (long long)a,
                                          (long long)(a + nr), (long long)c, (long long)d, (long long)row, (long long)o,
                                          y2[row * n_out + o], y[row * n_out + o]);
                                bad = 1;
                                break;
                            }
                        }
                    }
                }
                /* each row alone (the decode call), one output at a time for a few */
                for (int64_t row = 0; row < n_rows && !bad; row++) {
                    float one[37];
                    ks.matmul[type](w, wrow, &act, row, 1, y2, n_out, 0, n_out);
                    memcpy(one, y2 + row * n_out, sizeof(one));
                    if (row % 29 == 0) {
                        for (int64_t o = 0; o < n_out; o++) ks.matmul[type](w, wrow, &act, row, 1, y2, n_out, o, o + 1);
                        CHECK_MSG(memcmp(one, y2 + row * n_out, sizeof(one)) == 0,
                                  "%s %s n_in %lld: row %lld one output at a time differs", quant_type_get(type)->name,
                                  k_level_names[level], (long long)n_in, (long long)row);
                    }
                    if (memcmp(one, y + row * n_out, sizeof(one)) != 0) {
                        test_fail(t, __FILE__, __LINE__, "%s %s n_in %lld: row %lld alone differs from the %lld-row call",
                                  quant_type_get(type)->name, k_level_names[level], (long long)n_in, (long long)row,
                                  (long long)n_rows);
                        bad = 1;
                    }
                }
                free(y); free(mem); free(y2); free(x); free(w);
            }
        }
    }
}

/* Through the backend: a 130-row matmul (row blocks, output chunks, 2 threads) against each row
 * alone and against a 16-row verify-sized batch, bit for bit. */
TEST(gemm_kquant_batch_invariant_op) {
    rng r = {99};
    enum { N_ROWS = 130 };
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        backend *be = make_backend(2, level, false);
        REQUIRE(be != NULL);
        for (int ti = 0; ti < 2; ti++) {
            for (int ni = 0; ni < 3; ni += 2) {
                const uint32_t type = k_types[ti];
                const int64_t n_in = k_n_in[ni], n_out = 301;
                void *w = make_kq_weight(&r, type, n_in, n_out, false);
                float *x = malloc((size_t)(n_in * N_ROWS) * sizeof(float));
                float *y = malloc((size_t)(n_out * N_ROWS) * sizeof(float));
                float *y1 = malloc((size_t)(n_out * 16) * sizeof(float));
                REQUIRE(w && x && y && y1);
                kq_fill_x(&r, x, n_in, N_ROWS, false);
                mm_run(be, type, w, n_in, n_out, x, N_ROWS, y);
                const int64_t rows_to_check[6] = {0, 5, 16, 63, 100, 129};
                for (int i = 0; i < 6; i++) {
                    const int64_t row = rows_to_check[i];
                    mm_run(be, type, w, n_in, n_out, x + row * n_in, 1, y1);
                    CHECK_MSG(memcmp(y1, y + row * n_out, (size_t)n_out * sizeof(float)) == 0,
                              "matmul %s %s n_in %lld: row %lld alone differs from row %lld of %d",
                              quant_type_get(type)->name, k_level_names[level], (long long)n_in, (long long)row,
                              (long long)row, N_ROWS);
                }
                /* a verify batch: rows 40 .. 55 */
                mm_run(be, type, w, n_in, n_out, x + 40 * n_in, 16, y1);
                CHECK_MSG(memcmp(y1, y + 40 * n_out, (size_t)(16 * n_out) * sizeof(float)) == 0,
                          "matmul %s %s n_in %lld: a 16-row batch differs from the same rows of %d",
                          quant_type_get(type)->name, k_level_names[level], (long long)n_in, N_ROWS);
                free(w); free(x); free(y); free(y1);
            }
        }
        backend_free(be);
    }
}

/* The Q8_K activation quantizer (Q4_K / Q6_K weights) on non-finite and tiny inputs, at every level:
 * a super-block with a NaN or an Inf gets d = NaN, q = 0 and zero sums of 16 (no float -> int
 * overflow, no int16 wrap; every dot with it is NaN), one whose values are all below 2^-100 gets
 * d = 0 and q = 0; the bytes equal the scalar preparation's, and the matmul row is NaN exactly for
 * the rows with a non-finite input. */
TEST(gemm_q8_K_quantizer_nonfinite_and_tiny) {
    enum { N_IN = 3 * QK_K, N_OUT = 5, ROWS = 4 };
    static float x[ROWS][N_IN];
    rng r = {777};
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < N_IN; j++) x[i][j] = rng_f(&r);
    x[1][QK_K + 17] = NAN;                       /* row 1: super-block 1 has a NaN */
    x[2][0] = INFINITY;                          /* row 2: super-block 0 +Inf, 2 -Inf */
    x[2][2 * QK_K + 255] = -INFINITY;
    for (int j = 0; j < QK_K; j++) x[3][QK_K + j] = (float)(j % 3 - 1) * 1e-39f; /* row 3: super-block 1 tiny */
    const bool bad[ROWS][3] = {{0}, {0, 1, 0}, {1, 0, 1}, {0}};
    void *w = make_weight(&r, QUANT_TYPE_Q4_K, N_IN, N_OUT);
    REQUIRE(w != NULL);
    const size_t wrow = quant_row_size(QUANT_TYPE_Q4_K, N_IN);

    static uint8_t mem_ref[1 << 15] __attribute__((aligned(64)));
    static uint8_t mem[1 << 15] __attribute__((aligned(64)));
    REQUIRE(cpu_act_bytes(CPU_DOT_Q8_K, N_IN, ROWS) <= sizeof(mem));
    cpu_act a_ref;
    cpu_act_layout(&a_ref, CPU_DOT_Q8_K, N_IN, ROWS, mem_ref);
    for (int i = 0; i < ROWS; i++) cpu_act_row_q8_K_ref(&a_ref, i, x[i]);
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        cpu_kernels k;
        cpu_kernels_select(&k, cpu_features_detect() & ~level_disable(level));
        const char *lvl = k_level_names[level];
        cpu_act a;
        cpu_act_layout(&a, CPU_DOT_Q8_K, N_IN, ROWS, mem);
        for (int i = 0; i < ROWS; i++) k.act_row[QUANT_TYPE_Q4_K](&a, i, x[i]);
        for (int i = 0; i < ROWS; i++) {
            for (int b = 0; b < 3; b++) {
                const float d = a.d[i * 3 + b];
                int nz = 0, ns = 0;
                for (int j = 0; j < QK_K; j++) nz += a.qs[i * N_IN + b * QK_K + j] != 0;
                for (int j = 0; j < QK_K / 16; j++) ns += a.bsums[i * (N_IN / 16) + b * 16 + j] != 0;
                if (bad[i][b]) {
                    CHECK_MSG(isnan(d) && nz == 0 && ns == 0,
                              "%s: row %d super-block %d (NaN/Inf input): d %g, %d nonzero q, %d nonzero sums", lvl, i, b,
                              d, nz, ns);
                } else if (i == 3 && b == 1) {
                    CHECK_MSG(d == 0.0f && nz == 0 && ns == 0, "%s: row 3 super-block 1 (tiny): d %g, %d nonzero q", lvl,
                              d, nz);
                } else {
                    CHECK_MSG(isfinite(d) && d != 0.0f, "%s: row %d super-block %d: d %g", lvl, i, b, d);
                }
            }
        }
        CHECK_MSG(memcmp(a.qs, a_ref.qs, (size_t)(N_IN * ROWS)) == 0, "%s: q differ from the reference", lvl);
        CHECK_MSG(memcmp(a.d, a_ref.d, sizeof(float) * 3 * ROWS) == 0, "%s: d differ from the reference", lvl);
        CHECK_MSG(memcmp(a.bsums, a_ref.bsums, sizeof(int16_t) * (size_t)(N_IN / 16 * ROWS)) == 0,
                  "%s: sums differ from the reference", lvl);
        int bad32 = 0; /* the sums of 32 (the AVX-512 Q4_K mins): each the sum of its 32 q */
        for (int i = 0; i < ROWS; i++) {
            for (int j = 0; j < N_IN / 32; j++) {
                int sum = 0;
                for (int l = 0; l < 32; l++) sum += a.qs[i * N_IN + 32 * j + l];
                bad32 += a.bsums32[i * (N_IN / 32) + j] != sum;
            }
        }
        CHECK_MSG(bad32 == 0, "%s: %d sums of 32 differ from their q", lvl, bad32);
        int badu = 0; /* the biased copy (the AVX-512 packed Q6_K operand): q + 128 */
        for (int i = 0; i < N_IN * ROWS; i++) badu += a.qsu[i] != a.qs[i] + 128;
        CHECK_MSG(badu == 0, "%s: %d biased q differ from q + 128", lvl, badu);
        float y[ROWS][N_OUT];
        k.matmul[QUANT_TYPE_Q4_K](w, wrow, &a, 0, ROWS, &y[0][0], N_OUT, 0, N_OUT);
        for (int i = 0; i < ROWS; i++)
            for (int o = 0; o < N_OUT; o++)
                CHECK_MSG((i == 1 || i == 2) ? isnan(y[i][o]) : isfinite(y[i][o]), "%s: y[%d][%d] = %g", lvl, i, o,
                          y[i][o]);
    }
    free(w);
}
