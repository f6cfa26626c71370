/* test_gemm_float.c: the F32 / F16 / BF16 matmul kernels (cpu_gemm_float_avx2.c,
 * cpu_gemm_float_avx512.c) at every feature level this machine has, on awkward sizes (n_in not a
 * multiple of 8 / 16, inputs across the kernels' input blocks of 1024, output and row counts that
 * leave partial register tiles), against the scalar reference cpu_matmul_q_ref, and bit for bit
 * against themselves: a (weight row, activation row) result must not depend on the rows or
 * outputs computed with it (batch invariance: a 1-row decode and a 130-row batch agree).
 * Also the Q8_0 activation quantizers on non-finite and tiny inputs (NaN / Inf give d = NaN and
 * q = 0, so the matmul's outputs are NaN; a block of tiny values gives q = 0, never an overflow).
 *
 * Reference tolerance: |y - y_ref| <= 2^-23 * (n_in / 8 + 16) * sum_i |w_i x_i| (f32 rounding of an
 * FMA chain of n_in / 16 (AVX-512) or n_in / 8 + 7 (AVX2) terms and a 4-level sum; y_ref in f64). */
#include "test.h"
#include "test_backend_util.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/fp16.h"
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers (rng, feature levels: test_backend_util.h) ----------------------------------- */

/* The kernel set of a feature level; false if this machine lacks it. */
static bool gf_level_kernels(int level, cpu_kernels *k) {
    if (!level_available(level)) return false;
    cpu_kernels_select(k, cpu_features_detect() & ~level_disable(level));
    return true;
}

/* A random [n_out, n_in] weight of type (F32, F16 or BF16), values in [-1, 1). */
static void *gf_weight(rng *r, uint32_t type, int64_t n_in, int64_t n_out, size_t *nb1) {
    const size_t es = type == QUANT_TYPE_F32 ? 4 : 2;
    *nb1 = (size_t)n_in * es;
    void *w = malloc(*nb1 * (size_t)n_out);
    for (int64_t i = 0; i < n_in * n_out; i++) {
        const float v = rng_f(r);
        if (type == QUANT_TYPE_F32) {
            ((float *)w)[i] = v;
        } else {
            ((uint16_t *)w)[i] = type == QUANT_TYPE_F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
        }
    }
    return w;
}

static float gf_w(uint32_t type, const void *w, int64_t i) {
    if (type == QUANT_TYPE_F32) return ((const float *)w)[i];
    const uint16_t h = ((const uint16_t *)w)[i];
    return type == QUANT_TYPE_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

static bool gf_same_bits(float a, float b) { return memcmp(&a, &b, sizeof(a)) == 0; }

/* The reference tolerance of output (row i, weight row o) (the header comment), and in *s the sum
 * of |w x| over the row (act_ref: the rounded f32 activations). */
static double gf_tolerance(uint32_t type, const void *w, size_t nb1, const cpu_act *act_ref, int64_t i, int64_t o, double *s) {
    const int64_t n_in = act_ref->n_in;
    *s = 0.0;
    for (int64_t j = 0; j < n_in; j++) *s += fabs((double)gf_w(type, (const char *)w + o * nb1, j) * act_ref->f[i * n_in + j]);
    return ldexp(1.0, -23) * ((double)n_in / 8.0 + 16.0) * *s;
}

/* ---- F32 / F16 / BF16 kernels vs the reference, and batch invariance ------------------------- */

typedef struct gf_case {
    int64_t n_in, n_out, rows;
} gf_case;

/* One case at one level: returns false after reporting the first failure. */
static bool gf_run_case(test_ctx *t, const cpu_kernels *k, const char *lvl, uint32_t type, rng *r, gf_case c) {
    const int64_t n_in = c.n_in, n_out = c.n_out, rows = c.rows;
    size_t nb1;
    void *w = gf_weight(r, type, n_in, n_out, &nb1);
    float *x = malloc(sizeof(float) * (size_t)(n_in * rows));
    for (int64_t i = 0; i < n_in * rows; i++) x[i] = rng_f(r) * (rng_u32(r) % 29 == 0 ? 8.0f : 1.0f);
    const size_t ab = cpu_act_bytes(CPU_DOT_F32, n_in, rows);
    void *mem = aligned_alloc(64, ab), *mem_ref = aligned_alloc(64, ab);
    cpu_act act, act_ref;
    cpu_act_layout(&act, CPU_DOT_F32, n_in, rows, mem);
    cpu_act_layout(&act_ref, CPU_DOT_F32, n_in, rows, mem_ref);
    cpu_kernels kr;
    cpu_kernels_select(&kr, 0);
    for (int64_t i = 0; i < rows; i++) {
        k->act_row[type](&act, i, x + i * n_in);
        kr.act_row[type](&act_ref, i, x + i * n_in);
    }
    const size_t ny = sizeof(float) * (size_t)(n_out * rows);
    float *y = malloc(ny), *y1 = malloc(ny), *ys = malloc(ny), *yref = malloc(ny);
    bool ok = memcmp(act.f, act_ref.f, sizeof(float) * (size_t)(n_in * rows)) == 0;
    CHECK_MSG(ok, "%s %s %lld: prepared activations differ from the scalar preparation", lvl,
              quant_type_get(type)->name, (long long)n_in);

    /* the whole batch in one call */
    k->matmul[type](w, nb1, &act, 0, rows, y, n_out, 0, n_out);
    /* one row at a time (decode), outputs in chunks of 4 */
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t o = 0; o < n_out; o += 4) k->matmul[type](w, nb1, &act, i, 1, y1, n_out, o, o + 4 < n_out ? o + 4 : n_out);
    }
    /* odd splits: rows in runs of 5 from row 2 (rows 0-1 together), outputs from 1 then in 7s */
    for (int64_t r0 = 0; r0 < rows;) {
        const int64_t nr = r0 == 0 ? (rows < 2 ? rows : 2) : (rows - r0 < 5 ? rows - r0 : 5);
        k->matmul[type](w, nb1, &act, r0, nr, ys, n_out, 0, 1);
        for (int64_t o = 1; o < n_out; o += 7) k->matmul[type](w, nb1, &act, r0, nr, ys, n_out, o, o + 7 < n_out ? o + 7 : n_out);
        r0 += nr;
    }
    cpu_matmul_q_ref(type, w, nb1, &act_ref, 0, rows, yref, n_out, 0, n_out);

    for (int64_t i = 0; i < rows && ok; i++) {
        for (int64_t o = 0; o < n_out && ok; o++) {
            const int64_t e = i * n_out + o;
            double s;
            const double tol = gf_tolerance(type, w, nb1, &act_ref, i, o, &s);
            const double err = fabs((double)y[e] - (double)yref[e]);
            if (!(err <= tol)) {
                CHECK_MSG(false, "%s %s n_in %lld n_out %lld rows %lld: y[%lld][%lld] = %.9g, reference %.9g (err %.3g > tol %.3g)",
                          lvl, quant_type_get(type)->name, (long long)n_in, (long long)n_out, (long long)rows, (long long)i,
                          (long long)o, y[e], yref[e], err, tol);
                ok = false;
            } else if (!gf_same_bits(y[e], y1[e]) || !gf_same_bits(y[e], ys[e])) {
                CHECK_MSG(false, "%s %s n_in %lld n_out %lld rows %lld: y[%lld][%lld] batch %.9g, one row %.9g, split %.9g: not bit-identical",
                          lvl, quant_type_get(type)->name, (long long)n_in, (long long)n_out, (long long)rows, (long long)i,
                          (long long)o, y[e], y1[e], ys[e]);
                ok = false;
            }
        }
    }
    free(w);
    free(x);
    free(mem);
    free(mem_ref);
    free(y);
    free(y1);
    free(ys);
    free(yref);
    return ok;
}

static const uint32_t k_float_types[] = {QUANT_TYPE_F16, QUANT_TYPE_BF16, QUANT_TYPE_F32};

TEST(gemm_float_awkward_sizes_vs_ref_and_batch_invariant) {
    const int64_t n_ins[] = {1, 15, 33, 47, 72, 1000};
    const int64_t n_outs[] = {1, 3, 13, 37};
    const int64_t rowss[] = {1, 3, 4, 5, 7, 16, 17, 33, 130};
    for (int level = 0; level < TEST_LEVELS; level++) {
        cpu_kernels k;
        if (!gf_level_kernels(level, &k)) continue;
        for (size_t ti = 0; ti < sizeof(k_float_types) / sizeof(k_float_types[0]); ti++) {
            rng r = {1000 + 7 * (uint64_t)ti};
            bool ok = true;
            for (size_t a = 0; a < sizeof(n_ins) / sizeof(n_ins[0]) && ok; a++) {
                for (size_t b = 0; b < sizeof(n_outs) / sizeof(n_outs[0]) && ok; b++) {
                    for (size_t c = 0; c < sizeof(rowss) / sizeof(rowss[0]) && ok; c++) {
                        /* the largest rows only with the largest rows' partner sizes (time) */
                        if (rowss[c] == 130 && n_ins[a] == 1000 && n_outs[b] > 13) continue;
                        ok = gf_run_case(t, &k, k_level_names[level], k_float_types[ti], &r,
                                         (gf_case){n_ins[a], n_outs[b], rowss[c]});
                    }
                }
            }
        }
    }
}

/* Rows longer than the kernels' input block (1024): accumulators carried across blocks, and the
 * row's tail in the last block. */
TEST(gemm_float_long_rows_across_input_blocks) {
    const gf_case cases[] = {{1025, 5, 1}, {2100, 37, 7}, {2100, 3, 17}, {3072 + 13, 9, 6}, {2048, 33, 13}};
    for (int level = 0; level < TEST_LEVELS; level++) {
        cpu_kernels k;
        if (!gf_level_kernels(level, &k)) continue;
        for (size_t ti = 0; ti < sizeof(k_float_types) / sizeof(k_float_types[0]); ti++) {
            rng r = {77 + (uint64_t)ti};
            for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
                if (!gf_run_case(t, &k, k_level_names[level], k_float_types[ti], &r, cases[c])) break;
            }
        }
    }
}

/* ---- F16 / BF16 packed as P16_X16 (AMX-BF16 tiles, cpu_gemm_p16_amx.c) ----------------------
 * Where the level packs F16 / BF16 (pack_layout P16_X16): the tile kernel against the f64
 * reference on the plain rows (the same tolerance: its sums are at least as close), the scalar
 * reference of the layout against the same, and the kernel bit for bit against itself over row
 * and output splits (outputs start at a group of 16): one row at a time must give the batch's
 * bits. The activation preparation (th / tl) is compared bit for bit with the scalar one. */
static bool gf_run_packed_case(test_ctx *t, const cpu_kernels *k, const char *lvl, uint32_t type, rng *r, gf_case c) {
    const int64_t n_in = c.n_in, n_out = c.n_out, rows = c.rows;
    size_t nb1;
    void *w = gf_weight(r, type, n_in, n_out, &nb1);
    const tensor tw = tensor_2d(type, w, n_in, n_out);
    if (cpu_weight_pack_layout(k, &tw) != TENSOR_LAYOUT_P16_X16) {
        CHECK_MSG(false, "%s %s [%lld x %lld]: not packed as p16 x16", lvl, quant_type_get(type)->name, (long long)n_in,
                  (long long)n_out);
        free(w);
        return false;
    }
    const size_t psz = cpu_weight_pack_size(k, &tw);
    void *pw = aligned_alloc(64, psz);
    memset(pw, 0xa5, psz); /* the padding must be written */
    const tensor tp = cpu_weight_pack(k, &tw, pw);
    float *x = malloc(sizeof(float) * (size_t)(n_in * rows));
    for (int64_t i = 0; i < n_in * rows; i++) x[i] = rng_f(r) * (rng_u32(r) % 29 == 0 ? 8.0f : 1.0f);
    cpu_kernels kr;
    cpu_kernels_select(&kr, 0);
    const size_t ab = cpu_act_bytes(CPU_DOT_F32, n_in, rows), tb = cpu_act_bytes(CPU_DOT_BF16T, n_in, rows);
    void *mem_ref = aligned_alloc(64, ab), *mem_t = aligned_alloc(64, tb), *mem_tr = aligned_alloc(64, tb);
    memset(mem_t, 0xa5, tb);
    memset(mem_tr, 0, tb);
    cpu_act act_ref, act_t, act_tr;
    cpu_act_layout(&act_ref, CPU_DOT_F32, n_in, rows, mem_ref);
    cpu_act_layout(&act_t, CPU_DOT_BF16T, n_in, rows, mem_t);
    cpu_act_layout(&act_tr, CPU_DOT_BF16T, n_in, rows, mem_tr);
    const bool f16 = type == QUANT_TYPE_F16;
    for (int64_t i = 0; i < rows; i++) {
        kr.act_row[type](&act_ref, i, x + i * n_in);
        k->act_row_packed[type](&act_t, i, x + i * n_in);
        (f16 ? cpu_act_row_f16_tile_ref : cpu_act_row_bf16_tile_ref)(&act_tr, i, x + i * n_in);
    }
    const size_t tn = sizeof(uint16_t) * (size_t)(act_t.row_len * rows);
    bool ok = memcmp(act_t.th, act_tr.th, tn) == 0 && (!f16 || memcmp(act_t.tl, act_tr.tl, tn) == 0);
    CHECK_MSG(ok, "%s %s %lld: prepared tile activations differ from the scalar preparation", lvl,
              quant_type_get(type)->name, (long long)n_in);
    const size_t ny = sizeof(float) * (size_t)(n_out * rows);
    float *y = malloc(ny), *y1 = malloc(ny), *ys = malloc(ny), *yref = malloc(ny), *ypr = malloc(ny);
    cpu_matmul_fn mm = k->matmul_packed[type];
    mm(tp.data, tp.nb[1], &act_t, 0, rows, y, n_out, 0, n_out);
    for (int64_t i = 0; i < rows; i++) { /* decode: one row, outputs in groups of 16 */
        for (int64_t o = 0; o < n_out; o += 16) mm(tp.data, tp.nb[1], &act_t, i, 1, y1, n_out, o, o + 16 < n_out ? o + 16 : n_out);
    }
    for (int64_t r0 = 0; r0 < rows;) { /* rows 0-1, then runs of 5 (sets of fewer than 16 rows); outputs 16, then 32s */
        const int64_t nr = r0 == 0 ? (rows < 2 ? rows : 2) : (rows - r0 < 5 ? rows - r0 : 5);
        mm(tp.data, tp.nb[1], &act_t, r0, nr, ys, n_out, 0, n_out < 16 ? n_out : 16);
        for (int64_t o = 16; o < n_out; o += 32) mm(tp.data, tp.nb[1], &act_t, r0, nr, ys, n_out, o, o + 32 < n_out ? o + 32 : n_out);
        r0 += nr;
    }
    cpu_matmul_q_ref(type, w, nb1, &act_ref, 0, rows, yref, n_out, 0, n_out);
    cpu_matmul_p16_x16_ref(type, tp.data, tp.nb[1], &act_tr, 0, rows, ypr, n_out, 0, n_out);
    for (int64_t i = 0; i < rows && ok; i++) {
        for (int64_t o = 0; o < n_out && ok; o++) {
            const int64_t e = i * n_out + o;
            double s;
            const double tol = gf_tolerance(type, w, nb1, &act_ref, i, o, &s);
            const double err = fabs((double)y[e] - (double)yref[e]), err_r = fabs((double)ypr[e] - (double)yref[e]);
            if (!(err <= tol) || !(err_r <= ldexp(1.0, -24) * fabs((double)yref[e]) + ldexp(1.0, -40) * s)) {
                CHECK_MSG(false, "%s %s packed n_in %lld n_out %lld rows %lld: y[%lld][%lld] = %.9g, layout reference %.9g, "
                          "reference %.9g (err %.3g, tol %.3g)", lvl, quant_type_get(type)->name, (long long)n_in,
                          (long long)n_out, (long long)rows, (long long)i, (long long)o, y[e], ypr[e], yref[e], err, tol);
                ok = false;
            } else if (!gf_same_bits(y[e], y1[e]) || !gf_same_bits(y[e], ys[e])) {
                CHECK_MSG(false, "%s %s packed n_in %lld n_out %lld rows %lld: y[%lld][%lld] batch %.9g, one row %.9g, split "
                          "%.9g: not bit-identical", lvl, quant_type_get(type)->name, (long long)n_in, (long long)n_out,
                          (long long)rows, (long long)i, (long long)o, y[e], y1[e], ys[e]);
                ok = false;
            }
        }
    }
    free(w); free(pw); free(x); free(mem_ref); free(mem_t); free(mem_tr);
    free(y); free(y1); free(ys); free(yref); free(ypr);
    return ok;
}

TEST(gemm_float_packed_tiles_vs_ref_and_batch_invariant) {
    const int64_t n_ins[] = {1, 15, 33, 47, 72, 1000, 2100};
    const int64_t n_outs[] = {1, 13, 16, 37};
    const int64_t rowss[] = {1, 3, 15, 16, 17, 32, 33, 130};
    int ran = 0;
    for (int level = 0; level < TEST_LEVELS; level++) {
        cpu_kernels k;
        if (!gf_level_kernels(level, &k)) continue;
        for (int ti = 0; ti < 2; ti++) {
            const uint32_t type = ti == 0 ? QUANT_TYPE_F16 : QUANT_TYPE_BF16;
            if (k.pack_layout[type] != TENSOR_LAYOUT_P16_X16 || k.matmul_packed[type] == NULL) continue;
            ran++;
            rng r = {5150 + 3 * (uint64_t)ti};
            bool ok = true;
            for (size_t a = 0; a < sizeof(n_ins) / sizeof(n_ins[0]) && ok; a++) {
                for (size_t b = 0; b < sizeof(n_outs) / sizeof(n_outs[0]) && ok; b++) {
                    for (size_t c = 0; c < sizeof(rowss) / sizeof(rowss[0]) && ok; c++) {
                        if (rowss[c] == 130 && n_ins[a] >= 1000 && n_outs[b] > 16) continue; /* time */
                        ok = gf_run_packed_case(t, &k, k_level_names[level], type, &r, (gf_case){n_ins[a], n_outs[b], rowss[c]});
                    }
                }
            }
        }
    }
    if (ran == 0) test_skip(t, "this machine has no AMX-BF16: no level packs F16 / BF16");
}

/* The tile activations of special values, bit for bit against the scalar preparation: f16
 * subnormals, values that round to f16 Inf, Inf, NaN, -0, bf16 ties. */
TEST(gemm_float_tile_activations_special_values) {
    cpu_kernels k;
    if (!gf_level_kernels(3, &k) || k.act_row_packed[QUANT_TYPE_F16] == NULL) {
        test_skip(t, "this machine has no AMX-BF16");
        return;
    }
    enum { N = 45 };
    float x[N];
    rng r = {99};
    for (int i = 0; i < N; i++) x[i] = rng_f(&r) * ldexp(1.0f, (int)(rng_u32(&r) % 40) - 30);
    x[0] = 3e-8f; x[1] = -6e-5f; x[2] = 70000.0f; x[3] = -65520.0f; x[4] = INFINITY; x[5] = -INFINITY;
    x[6] = NAN; x[7] = -0.0f; x[8] = 1.0f + ldexp(1.0f, -8); x[9] = 1.0f + 3 * ldexp(1.0f, -8); x[10] = 1e-45f;
    x[40] = 65504.0f; x[44] = -1e30f;
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = ti == 0 ? QUANT_TYPE_F16 : QUANT_TYPE_BF16;
        static uint8_t m1[4096] __attribute__((aligned(64))), m2[4096] __attribute__((aligned(64)));
        REQUIRE(cpu_act_bytes(CPU_DOT_BF16T, N, 1) <= sizeof(m1));
        memset(m1, 0x5a, sizeof(m1));
        memset(m2, 0, sizeof(m2));
        cpu_act a1, a2;
        cpu_act_layout(&a1, CPU_DOT_BF16T, N, 1, m1);
        cpu_act_layout(&a2, CPU_DOT_BF16T, N, 1, m2);
        k.act_row_packed[type](&a1, 0, x);
        (ti == 0 ? cpu_act_row_f16_tile_ref : cpu_act_row_bf16_tile_ref)(&a2, 0, x);
        CHECK(a1.row_len == 64);
        for (int i = 0; i < a1.row_len; i++) {
            CHECK_MSG(a1.th[i] == a2.th[i], "%s th[%d] (x = %g): %04x, scalar %04x", quant_type_get(type)->name, i,
                      i < N ? (double)x[i] : 0.0, a1.th[i], a2.th[i]);
            if (ti == 0) CHECK_MSG(a1.tl[i] == a2.tl[i], "f16 tl[%d]: %04x, scalar %04x", i, a1.tl[i], a2.tl[i]);
        }
        if (ti == 0) { /* th + tl is the f16 value: 1 + 2^-8 keeps its last bit in tl; Inf has tl 0 */
            CHECK(a2.tl[8] != 0 && a2.tl[4] == 0 && a2.th[4] == 0x7f80 && a2.th[2] == 0x7f80);
        }
    }
}

/* ---- Q8_0 activation quantizers: non-finite and tiny inputs ---------------------------------- */

TEST(gemm_q8_0_quantizer_nonfinite_and_tiny) {
    enum { N_IN = 160, N_OUT = 5, ROWS = 4 }; /* 5 blocks (one group, padded to 16) */
    float x[ROWS][N_IN];
    rng r = {4242};
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < N_IN; j++) x[i][j] = rng_f(&r);
    x[1][32 + 5] = NAN;               /* row 1: block 1 has a NaN */
    x[2][64 + 0] = INFINITY;          /* row 2: block 2 has +Inf, block 3 -Inf */
    x[2][96 + 31] = -INFINITY;
    for (int j = 0; j < 32; j++) x[3][128 + j] = (j % 3 - 1) * 1e-39f; /* row 3: block 4 subnormal */
    x[3][128 + 7] = 1e-45f;

    /* random Q8_0 weights */
    block_q8_0 w[N_OUT][N_IN / QK8_0];
    for (int o = 0; o < N_OUT; o++) {
        for (int b = 0; b < N_IN / QK8_0; b++) {
            w[o][b].d = fp32_to_fp16(0.01f + 0.001f * (float)b);
            for (int j = 0; j < QK8_0; j++) w[o][b].qs[j] = (int8_t)((int)(rng_u32(&r) % 255) - 127);
        }
    }
    const bool bad_block[ROWS][5] = {{0}, {0, 1, 0, 0, 0}, {0, 0, 1, 1, 0}, {0}};

    static uint8_t mem_ref[1 << 15] __attribute__((aligned(64)));
    static uint8_t mem[1 << 15] __attribute__((aligned(64)));
    REQUIRE(cpu_act_bytes(CPU_DOT_Q8_0, N_IN, ROWS) <= sizeof(mem));
    cpu_act a_ref;
    cpu_act_layout(&a_ref, CPU_DOT_Q8_0, N_IN, ROWS, mem_ref);
    for (int i = 0; i < ROWS; i++) cpu_act_row_q8_0_ref(&a_ref, i, x[i]);
    const int64_t nbp = a_ref.row_len / QK8_0;

    for (int level = 0; level < TEST_LEVELS; level++) {
        cpu_kernels k;
        if (!gf_level_kernels(level, &k)) continue;
        const char *lvl = k_level_names[level];
        cpu_act a;
        cpu_act_layout(&a, CPU_DOT_Q8_0, N_IN, ROWS, mem);
        for (int i = 0; i < ROWS; i++) k.act_row[QUANT_TYPE_Q8_0](&a, i, x[i]);
        for (int i = 0; i < ROWS; i++) {
            for (int b = 0; b < 5; b++) {
                const float d = a.d[i * nbp + b];
                int nz = 0;
                for (int j = 0; j < QK8_0; j++) nz += a.qs[i * a.row_len + cpu_q8_0_offset(b * QK8_0 + j)] != 0;
                if (bad_block[i][b]) {
                    CHECK_MSG(isnan(d) && nz == 0 && a.ns[i * nbp + b] == 0,
                              "%s: row %d block %d (NaN/Inf input): d %g, %d nonzero q, ns %d; expected NaN, 0, 0", lvl, i, b,
                              d, nz, a.ns[i * nbp + b]);
                } else if (i == 3 && b == 4) {
                    CHECK_MSG(d == 0.0f && nz == 0 && a.ns[i * nbp + b] == 0,
                              "%s: row 3 block 4 (tiny values): d %g, %d nonzero q, ns %d; expected 0, 0, 0", lvl, d, nz,
                              a.ns[i * nbp + b]);
                } else {
                    CHECK_MSG(isfinite(d) && d > 0.0f, "%s: row %d block %d: d %g", lvl, i, b, d);
                }
            }
        }
        /* the same bytes as the scalar preparation (NaN d included: the same NaN) */
        CHECK_MSG(memcmp(a.qs, a_ref.qs, (size_t)(a.row_len * ROWS)) == 0, "%s: q differ from the reference", lvl);
        CHECK_MSG(memcmp(a.d, a_ref.d, sizeof(float) * (size_t)(nbp * ROWS)) == 0, "%s: d differ from the reference", lvl);
        CHECK_MSG(memcmp(a.ns, a_ref.ns, sizeof(int32_t) * (size_t)(nbp * ROWS)) == 0, "%s: sums differ from the reference",
                  lvl);

        /* the matmul: rows with a NaN / Inf give NaN everywhere, the others finite and as the reference */
        float y[ROWS][N_OUT], yr[ROWS][N_OUT];
        k.matmul[QUANT_TYPE_Q8_0](w, sizeof(w[0]), &a, 0, ROWS, &y[0][0], N_OUT, 0, N_OUT);
        cpu_matmul_q_ref(QUANT_TYPE_Q8_0, w, sizeof(w[0]), &a_ref, 0, ROWS, &yr[0][0], N_OUT, 0, N_OUT);
        for (int i = 0; i < ROWS; i++) {
            for (int o = 0; o < N_OUT; o++) {
                if (i == 1 || i == 2) {
                    CHECK_MSG(isnan(y[i][o]) && isnan(yr[i][o]), "%s: y[%d][%d] = %g (reference %g), expected NaN", lvl, i, o,
                              y[i][o], yr[i][o]);
                } else {
                    CHECK_MSG(isfinite(y[i][o]) && fabsf(y[i][o] - yr[i][o]) <= 1e-5f * (1.0f + fabsf(yr[i][o])),
                              "%s: y[%d][%d] = %g, reference %g", lvl, i, o, y[i][o], yr[i][o]);
                }
            }
        }
    }
}
