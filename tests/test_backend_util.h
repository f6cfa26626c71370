/* test_backend_util.h: helpers shared by the CPU backend tests (test_backend_ops.c,
 * test_backend_matmul.c and the GEMM tests): a small deterministic RNG, the feature levels this
 * machine has, backends per level, one-op runs, tolerant comparisons, random weights of every
 * matmul type with their error budgets, and the awkward matmul sizes. */
#ifndef DFL_TEST_BACKEND_UTIL_H
#define DFL_TEST_BACKEND_UTIL_H

#include "test.h"

#include "backend/backend.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct rng {
    uint64_t s;
} rng;

uint32_t rng_u32(rng *r);
/* uniform in [-1, 1) */
float rng_f(rng *r);
/* x[i] = uniform * scale, with occasional outliers (x 8) */
void fill_f32(rng *r, float *x, int64_t n, float scale);
/* an f16 value uniform in [lo, hi] */
uint16_t rand_f16(rng *r, float lo, float hi);

/* Feature levels: 0 scalar, 1 avx2, 2 avx512 without AMX, 3 avx512 with AMX (if the machine has
 * them). */
#define TEST_LEVELS 4
extern const char *const k_level_names[TEST_LEVELS];
/* the feature bits to disable for a level */
uint32_t level_disable(int level);
bool level_available(int level);
/* a CPU backend restricted to a level (NULL on failure) */
backend *make_backend(int n_threads, int level, bool async);
/* Runs one op on a fresh queue of be and waits for it. */
void run_op(backend *be, const backend_op *op);
/* max |a - b| / (tol_abs + tol_rel * |b|) over n values; > 1 fails. Non-finite values fail. */
bool close_enough(test_ctx *t, const char *what, const float *a, const float *b, int64_t n, double tol_abs,
                  double tol_rel);

/* Activation rows x [n_rows, n_in] prepared for weight type wtype by the kernel set k (its
 * quantizer) into new 64-byte aligned memory (returned: free() it), laid out in *act. */
struct cpu_kernels;
struct cpu_act;
void *prep_act(const struct cpu_kernels *k, uint32_t wtype, struct cpu_act *act, const float *x, int64_t n_in,
               int64_t n_rows);

/* op_matmul and op_matmul_argmax (scale 0.5) on be with weight w0 and with weight w1 [n_in, n_out]
 * (e.g. plain and packed) over x [n_in, n_rows]: true when both give the same bits. */
bool mm_ops_same_bits(backend *be, tensor w0, tensor w1, const float *x, int64_t n_rows);

/* The first i < n where a[i] and b[i] differ in any bit, or -1 (bit-exact comparisons). */
int64_t first_bit_diff(const float *a, const float *b, int64_t n);
/* A call over rows [a, a + nr) and outputs [c, d) wrote y2 [n_rows, n_out] (poisoned with 0xff
 * bytes before): true when those outputs have y's bits (the full call) and nothing else was
 * written; else fails t once with what and the first wrong place. */
bool range_call_ok(test_ctx *t, const char *what, const float *y2, const float *y, int64_t n_out, int64_t n_rows,
                   int64_t a, int64_t nr, int64_t c, int64_t d);

/* Random content for a [n_in, n_out] weight of `type` at w (every block field random, scales sane). */
void fill_weight(rng *r, uint32_t type, uint8_t *w, int64_t n_in, int64_t n_out);
/* The same in a new malloc'd array (free() it). */
void *make_weight(rng *r, uint32_t type, int64_t n_in, int64_t n_out);
/* A [n_in, n_out] Q4_K / Q6_K weight (malloc'd): random blocks, or (extreme) every quant at its
 * maximum with the largest scales (Q4_K 63 / 63, Q6_K -128), the bounds of the integer sums. */
void *make_kq_weight(rng *r, uint32_t type, int64_t n_in, int64_t n_out, bool extreme);
/* every matmul weight type */
extern const uint32_t k_mm_types[15];
/* matmul error budget of a type, relative to mm_norms (see test_backend_matmul.c) */
double mm_budget(uint32_t type);
/* N [n_rows][n_out]: N[r][o] = sum_i |w_o,i| * max_i |x_r,i| */
void mm_norms(double *N, uint32_t type, const void *w, int64_t n_in, int64_t n_out, const float *x, int64_t n_rows);

typedef struct mm_case {
    int64_t n_in, n_out, n_rows;
} mm_case;
/* (n_in, n_out, n_rows) triples covering every awkward size at least once per block size */
extern const mm_case k_cases_32[20];
extern const mm_case k_cases_256[12];
/* Runs op_matmul on be; dst [n_out, n_rows] */
void mm_run(backend *be, uint32_t type, const void *w, int64_t n_in, int64_t n_out, const float *x, int64_t n_rows,
            float *dst);

#endif
