/* test_gemm_q4_0_x16.c: Q4_0 weights packed for the AVX2 and AVX-512 kernels
 * (TENSOR_LAYOUT_Q4_0_X16, cpu_pack.c; cpu_kernels_avx2.c, and the tile of
 * cpu_gemm_q8_0_x16_avx512.c with the nibbles split in registers), at each of those levels:
 * - the layout byte for byte (quant bytes at their transposed offsets, scales after the groups,
 *   padding zeroed), and which weights and levels pack (the scalar level reads Q4_0 as stored);
 * - the packed kernel gives the bits of the plain Q4_0 kernel of its level on awkward shapes (n_in 512 ..
 *   8704: calls of more than 4 rows unpack the weights into a buffer up to n_in 8192), outputs not multiples of 4, rows around the tiles), random and extreme blocks (every
 *   nibble 0 or 15, |x| at the quantizer's limit); the packed reference gives the bits of the
 *   plain reference (every level);
 * - batch invariance: any row range / output range of a call gives the full call's bits and
 *   writes nothing outside;
 * - the ops on 2 threads equal the plain weight, validation refuses malformed packed tensors, and a
 *   backend whose kernels do not read the layout refuses it;
 * - a Q4_0 model gives the same logits and greedy tokens with and without the packed copy. */
#include "test.h"
#include "test_backend_util.h"
#include "test_util.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "model/context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The levels whose kernels pack Q4_0: avx2 (1) and avx512 (2). */
#define Q4X_LEVEL0 1
#define Q4X_LEVEL1 2

static size_t q4x_stride(int64_t n_in) { return ((size_t)(n_in / 32) * 18 + 63) & ~(size_t)63; }

/* The kernels of level (1 or 2), or false when this CPU lacks it (a test with no level then skips). */
static bool q4x_kernels(int level, cpu_kernels *k) {
    if (!level_available(level)) return false;
    cpu_kernels_select(k, cpu_features_detect() & ~level_disable(level));
    return k->matmul_packed[QUANT_TYPE_Q4_0] != NULL;
}

static bool q4x_any_level(test_ctx *t) {
    if (level_available(Q4X_LEVEL0) || level_available(Q4X_LEVEL1)) return true;
    test_skip(t, "no AVX2 on this CPU: Q4_0 is packed by the AVX2 and AVX-512 kernels only");
    return false;
}

/* A packed copy of the plain Q4_0 weight w [n_in, n_out] by k (aligned_alloc'd; free()). */
static uint8_t *q4x_pack(const cpu_kernels *k, const void *w, int64_t n_in, int64_t n_out, tensor *out) {
    tensor tw = tensor_2d(QUANT_TYPE_Q4_0, (void *)w, n_in, n_out);
    const size_t sz = cpu_weight_pack_size(k, &tw);
    DFL_ASSERT(sz == q4x_stride(n_in) * (size_t)n_out);
    uint8_t *p = aligned_alloc(64, sz);
    DFL_ASSERT(p != NULL);
    memset(p, 0xcd, sz); /* the padding must be written */
    *out = cpu_weight_pack(k, &tw, p);
    return p;
}

/* A Q4_0 weight; extreme: every nibble 0 (even rows: quant -8) or 15 (odd rows: 7). */
static void *q4x_weight(rng *r, int64_t n_in, int64_t n_out, bool extreme) {
    block_q4_0 *w = make_weight(r, QUANT_TYPE_Q4_0, n_in, n_out);
    if (extreme) {
        for (int64_t o = 0; o < n_out; o++) {
            for (int64_t b = 0; b < n_in / 32; b++) memset(w[o * (n_in / 32) + b].qs, o % 2 ? 0xff : 0x00, 16);
        }
    }
    return w;
}

TEST(gemm_q4_0_x16_layout) {
    if (!q4x_any_level(t)) return;
    cpu_kernels k;
    if (!q4x_kernels(Q4X_LEVEL0, &k)) REQUIRE(q4x_kernels(Q4X_LEVEL1, &k));
    rng r = {41};
    const int64_t k_n[3] = {512, 1536, 2048};
    for (int ni = 0; ni < 3; ni++) {
        const int64_t n_in = k_n[ni], n_out = 3, nb = n_in / 32;
        block_q4_0 *w = make_weight(&r, QUANT_TYPE_Q4_0, n_in, n_out);
        tensor tp;
        uint8_t *p = q4x_pack(&k, w, n_in, n_out, &tp);
        CHECK_EQ_INT(tp.layout, TENSOR_LAYOUT_Q4_0_X16);
        CHECK_EQ_INT(tp.type, QUANT_TYPE_Q4_0);
        CHECK_EQ_INT(tp.nb[1], q4x_stride(n_in));
        CHECK_EQ_INT(tp.nb[1] % 64, 0);
        int bad = 0;
        for (int64_t o = 0; o < n_out && !bad; o++) {
            const uint8_t *row = p + (size_t)o * tp.nb[1];
            for (int64_t b = 0; b < nb && !bad; b++) {
                for (int j = 0; j < 16 && !bad; j++) {
                    const int64_t at = (b / 16) * 256 + (j / 4) * 64 + (b % 16) * 4 + j % 4;
                    if (row[at] != w[o * nb + b].qs[j]) {
                        test_fail(t, __FILE__, __LINE__, "n_in %lld row %lld block %lld byte %d: at %lld = %02x, expected %02x",
                                  (long long)n_in, (long long)o, (long long)b, j, (long long)at, row[at], w[o * nb + b].qs[j]);
                        bad = 1;
                    }
                }
                uint16_t d;
                memcpy(&d, row + n_in / 2 + 2 * b, 2);
                if (d != w[o * nb + b].d) {
                    test_fail(t, __FILE__, __LINE__, "n_in %lld row %lld: scale %lld = %04x, expected %04x", (long long)n_in,
                              (long long)o, (long long)b, d, w[o * nb + b].d);
                    bad = 1;
                }
            }
            for (size_t i = (size_t)nb * 18; i < tp.nb[1] && !bad; i++) {
                CHECK_MSG(row[i] == 0, "n_in %lld row %lld: padding byte %zu = %u", (long long)n_in, (long long)o, i, row[i]);
                if (row[i] != 0) bad = 1;
            }
        }
        free(p);
        free(w);
    }
    /* not packable: rows not a multiple of 16 blocks, strided rows, a packed view; and the scalar
     * level reads Q4_0 as stored */
    uint8_t dummy[64] __attribute__((aligned(64)));
    tensor a = tensor_2d(QUANT_TYPE_Q4_0, dummy, 544, 4);
    CHECK_EQ_INT(cpu_weight_pack_size(&k, &a), 0);
    tensor c = tensor_2d(QUANT_TYPE_Q4_0, dummy, 512, 4);
    c.nb[1] += 18;
    CHECK_EQ_INT(cpu_weight_pack_size(&k, &c), 0);
    tensor e = tensor_2d(QUANT_TYPE_Q4_0, dummy, 512, 4);
    CHECK(cpu_weight_pack_size(&k, &e) > 0);
    e.layout = TENSOR_LAYOUT_Q4_0_X16;
    CHECK_EQ_INT(cpu_weight_pack_size(&k, &e), 0);
    cpu_kernels kl;
    cpu_kernels_select(&kl, cpu_features_detect() & ~level_disable(0));
    tensor f = tensor_2d(QUANT_TYPE_Q4_0, dummy, 512, 4);
    CHECK_MSG(cpu_weight_pack_size(&kl, &f) == 0, "the scalar level packs Q4_0");
}

/* 8704: above the kernel's unpack buffer (Q4X_BUF_MAX_IN), so its tiles of many rows split the
 * nibbles in registers too */
static const int64_t k_q_in[5] = {512, 1536, 2560, 1024, 8704};
static const int64_t k_q_out[6] = {1, 3, 4, 5, 13, 37};
static const int64_t k_q_rows[9] = {1, 2, 3, 4, 5, 7, 16, 17, 33};

static int q4x_cmp(test_ctx *t, const float *a, const float *b, int64_t n_out, int64_t n_rows, const char *what,
                   int level, int64_t n_in) {
    const int64_t i = first_bit_diff(a, b, n_out * n_rows);
    if (i < 0) return 0;
    test_fail(t, __FILE__, __LINE__, "%s %s [%lld -> %lld] x %lld rows: out %lld row %lld: %.9g vs %.9g", what,
              k_level_names[level], (long long)n_in, (long long)n_out, (long long)n_rows, (long long)(i % n_out), (long long)(i / n_out), a[i],
              b[i]);
    return 1;
}

TEST(gemm_q4_0_x16_same_bits_as_plain) {
    if (!q4x_any_level(t)) return;
    rng r = {9002};
    for (int level = Q4X_LEVEL0; level <= Q4X_LEVEL1; level++) {
    cpu_kernels ks;
    if (!q4x_kernels(level, &ks)) continue;
    for (int ni = 0; ni < 5; ni++) {
        for (int oi = 0; oi < 6; oi++) {
            for (int ri = 0; ri < 9; ri++) {
                if (ni == 4 && (oi != 5 || (ri != 0 && ri != 7))) continue; /* 1 and 17 rows, 37 outputs */
                const int64_t n_in = k_q_in[ni], n_out = k_q_out[oi], n_rows = k_q_rows[ri];
                const bool extreme = (oi + ri) % 5 == 2;
                void *w = q4x_weight(&r, n_in, n_out, extreme);
                float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
                float *y0 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                float *y1 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                REQUIRE(w && x && y0 && y1);
                fill_f32(&r, x, n_in * n_rows, 2.0f);
                if (extreme) {
                    for (int64_t i = 0; i < n_in * n_rows; i++) x[i] = (i / 32) % 2 ? 3.0f : -3.0f; /* q = +-127 */
                }
                tensor tp;
                uint8_t *p = q4x_pack(&ks, w, n_in, n_out, &tp);
                cpu_act act;
                void *mem = prep_act(&ks, QUANT_TYPE_Q4_0, &act, x, n_in, n_rows);
                const size_t wrow = (size_t)(n_in / 32) * 18;
                memset(y0, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                memset(y1, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                ks.matmul[QUANT_TYPE_Q4_0](w, wrow, &act, 0, n_rows, y0, n_out, 0, n_out);
                ks.matmul_packed[QUANT_TYPE_Q4_0](p, tp.nb[1], &act, 0, n_rows, y1, n_out, 0, n_out);
                int bad = q4x_cmp(t, y1, y0, n_out, n_rows, extreme ? "packed vs plain (extreme)" : "packed vs plain",
                                  level, n_in);
                for (int64_t i = 0; i < n_out * n_rows && !bad; i++) {
                    if (!isfinite(y1[i])) bad = q4x_cmp(t, y1, y1, 1, 1, "non-finite", level, n_in) + 1;
                }
                if (ri < 5 && level == Q4X_LEVEL1) { /* the references, on the same activations */
                    cpu_matmul_q_ref(QUANT_TYPE_Q4_0, w, wrow, &act, 0, n_rows, y0, n_out, 0, n_out);
                    cpu_matmul_q4_0_x16_ref(p, tp.nb[1], &act, 0, n_rows, y1, n_out, 0, n_out);
                    q4x_cmp(t, y1, y0, n_out, n_rows, "packed ref vs plain ref", level, n_in);
                }
                free(mem); free(p); free(y1); free(y0); free(x); free(w);
            }
        }
    }
    }
}

/* Every row range [a, a + nr) and output range [c, d) gives the full call's bits, nothing else. */
TEST(gemm_q4_0_x16_batch_invariant) {
    if (!q4x_any_level(t)) return;
    rng r = {4712};
    for (int level = Q4X_LEVEL0; level <= Q4X_LEVEL1; level++) {
    cpu_kernels ks;
    if (!q4x_kernels(level, &ks)) continue;
    const int64_t n_in = 1536, n_out = 37, n_rows = 41;
    void *w = q4x_weight(&r, n_in, n_out, false);
    float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
    float *y = malloc((size_t)(n_out * n_rows) * sizeof(float));
    float *y2 = malloc((size_t)(n_out * n_rows) * sizeof(float));
    REQUIRE(w && x && y && y2);
    fill_f32(&r, x, n_in * n_rows, 1.0f);
    tensor tp;
    uint8_t *p = q4x_pack(&ks, w, n_in, n_out, &tp);
    cpu_act act;
    void *mem = prep_act(&ks, QUANT_TYPE_Q4_0, &act, x, n_in, n_rows);
    ks.matmul_packed[QUANT_TYPE_Q4_0](p, tp.nb[1], &act, 0, n_rows, y, n_out, 0, n_out);
    int bad = 0;
    for (int64_t len = 1; len <= 10 && !bad; len++) {
        const int64_t a = (len * 7) % (n_rows - len), nr = len == 10 ? n_rows - a : len;
        const int64_t c = len % 4 + (len > 5 ? 4 : 0), dd = n_out - (len % 3);
        memset(y2, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
        ks.matmul_packed[QUANT_TYPE_Q4_0](p, tp.nb[1], &act, a, nr, y2, n_out, c, dd);
        for (int64_t i = 0; i < n_out * n_rows && !bad; i++) {
            const int64_t row = i / n_out, o = i % n_out;
            const bool inside = row >= a && row < a + nr && o >= c && o < dd;
            uint32_t u;
            memcpy(&u, &y2[i], 4);
            if ((!inside && u != 0xffffffffu) || (inside && memcmp(&y2[i], &y[i], 4) != 0)) {
                test_fail(t, __FILE__, __LINE__, "%s: rows [%lld, %lld) outputs [%lld, %lld): row %lld out %lld %s",
                          k_level_names[level], (long long)a, (long long)(a + nr), (long long)c, (long long)dd, (long long)row, (long long)o,
                          inside ? "differs from the full call" : "written");
                bad = 1;
            }
        }
    }
    free(mem); free(p); free(y2); free(y); free(x); free(w);
    }
}

TEST(gemm_q4_0_x16_ops_and_validation) {
    if (!q4x_any_level(t)) return;
    rng r = {78};
    for (int level = Q4X_LEVEL0; level <= Q4X_LEVEL1; level++) {
    if (!level_available(level)) continue;
    const int64_t n_in = 1024, n_out = 203, n_rows = 19;
    void *w = q4x_weight(&r, n_in, n_out, false);
    float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
    float *y = malloc((size_t)(n_out * n_rows) * sizeof(float));
    REQUIRE(w && x && y);
    fill_f32(&r, x, n_in * n_rows, 1.0f);
    backend *be = make_backend(2, level, false);
    REQUIRE(be != NULL);
    tensor tw = tensor_2d(QUANT_TYPE_Q4_0, w, n_in, n_out);
    const size_t psz = backend_weight_pack_size(be, &tw);
    CHECK_EQ_INT(psz, q4x_stride(n_in) * (size_t)n_out);
    uint8_t *p = aligned_alloc(64, psz);
    REQUIRE(p != NULL);
    const tensor tp = backend_weight_pack(be, &tw, p);
    CHECK_EQ_INT(tp.layout, TENSOR_LAYOUT_Q4_0_X16);
    CHECK_MSG(mm_ops_same_bits(be, tw, tp, x, n_rows), "op_matmul / op_matmul_argmax packed vs plain differ");
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_MATMUL;
    op.src[0] = tp;
    op.src[1] = tensor_2d(QUANT_TYPE_F32, x, n_in, n_rows);
    op.dst = tensor_2d(QUANT_TYPE_F32, y, n_out, n_rows);
    dfl_error err = {0};
    CHECK(backend_op_validate(be, &op, &err) == DFL_OK);
    backend_op m = op;
    m.src[0].type = QUANT_TYPE_Q8_0;
    error_clear(&err);
    CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "not q4_0");
    m.src[0] = tp;
    m.src[0].nb[1] -= 64; /* rows too short for their blocks */
    error_clear(&err);
    CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "q4_0 x16");
    m.src[0] = tp;
    m.src[0].data = p + 32; /* misaligned */
    error_clear(&err);
    CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
    m.src[0] = tp;
    m.src[0].ne[0] = 544; /* not whole groups */
    error_clear(&err);
    CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
    /* a backend whose kernels do not read the layout (the scalar level) refuses it, with a message */
    {
        backend *b2 = make_backend(1, 0, false);
        REQUIRE(b2 != NULL);
        CHECK_EQ_INT(backend_weight_pack_size(b2, &tw), 0);
        error_clear(&err);
        CHECK(backend_op_validate(b2, &op, &err) == DFL_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(err.msg, "do not read");
        backend_free(b2);
    }
    free(p);
    backend_free(be);
    free(y); free(x); free(w);
    }
}

static void q4x_check_packed(test_ctx *t, dfl_context *c) {
    CHECK_EQ_INT(c->weights_packed, 1);
    CHECK_EQ_INT(c->w.layers[0].wq.layout, TENSOR_LAYOUT_Q4_0_X16);
    CHECK_EQ_INT(c->w.layers[1].ffn_down.layout, TENSOR_LAYOUT_Q4_0_X16);
}

/* A Q4_0 model with packable dimensions: the same logits and tokens with and without the packed
 * copy (on this machine's best level). */
TEST(gemm_q4_0_x16_model_same_logits) {
    if (!q4x_any_level(t)) return;
    char target[512], drafter[512];
    if (!tu_make_models(t, "q4x", "--n-embd 512 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 128 --n-ff 1536 "
                        "--n-vocab 700 --draft-layers 1 --block-size 4 --type q4_0",
                        target, drafter, sizeof(target))) {
        return;
    }
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(target, NULL, &err);
    REQUIRE(m != NULL);
    const int32_t prompt[9] = {5, 77, 301, 2, 699, 18, 42, 42, 7};
    float *lg = tu_pack_ab(t, m, prompt, 9, 12, q4x_check_packed);
    free(lg);
    dfl_model_free(m);
}
