/* test_gemm_q8_0_x16.c: Q8_0 and Q4_0 weights packed for the CPU kernels (TENSOR_LAYOUT_Q8_0_X16
 * at every feature level this machine has: scalar, avx2, avx512; TENSOR_LAYOUT_Q4_0_X16 at avx2 and
 * avx512; cpu_pack.c):
 * - the layouts byte for byte (Q8_0: each quant + 128 at its transposed offset; Q4_0: each quant
 *   byte as stored at its transposed offset; scales after the groups, padding zeroed, rows 64-byte
 *   aligned), and which weights and levels pack;
 * - the packed kernels give the bits of the plain kernels of the same level on awkward shapes
 *   (n_in 512 .. 2560 with odd group counts, and 8704, above the AVX-512 Q4_0 kernel's unpack
 *   buffer; outputs not multiples of 4, rows around the tiles), random and extreme blocks (every
 *   quant at its limits, |x| at the quantizer's limit); the packed references give the bits of the
 *   plain reference;
 * - batch invariance: any row range / output range of a call gives the bits of the full call and
 *   writes nothing outside;
 * - the ops: op_matmul and op_matmul_argmax on 2 threads with a packed weight equal the plain
 *   weight; a packed tensor anywhere else, or a malformed one, is refused by validation, and so is
 *   one a backend's kernels do not read;
 * - a model: Q8_0 and Q4_0 test models with packable dimensions give the same logits and greedy
 *   tokens with and without the packed copy (dfl_context_params.no_weight_pack), and a drafter
 *   pair shares one packed head. */
#include "test.h"
#include "test_backend_util.h"
#include "test_util.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/fp16.h"
#include "model/context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The two packed types: Q8_0 (every level) and Q4_0 (avx2, avx512). */
static const uint32_t k_x_types[2] = {QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_0};

/* Bytes of a plain row, and of a packed one (64-byte aligned). */
static size_t x16_row_bytes(uint32_t type, int64_t n_in) { return (size_t)(n_in / 32) * (type == QUANT_TYPE_Q4_0 ? 18 : 34); }
static size_t x16_stride(uint32_t type, int64_t n_in) { return (x16_row_bytes(type, n_in) + 63) & ~(size_t)63; }

/* The kernels of a level for type, or false when the CPU lacks the level or the level does not
 * pack the type. */
static uint32_t tp_layout_of(uint32_t type) {
    return type == QUANT_TYPE_Q4_0 ? TENSOR_LAYOUT_Q4_0_X16 : TENSOR_LAYOUT_Q8_0_X16;
}

static bool x16_level(int level, uint32_t type, cpu_kernels *k) {
    if (!level_available(level)) return false;
    cpu_kernels_select(k, cpu_features_detect() & ~level_disable(level));
    return k->matmul_packed[type] != NULL && k->pack_layout[type] != TENSOR_LAYOUT_PLAIN;
}

/* A packed copy by k of the plain weight w [n_in, n_out] (aligned_alloc'd; free()). */
static uint8_t *x16_pack(const cpu_kernels *k, uint32_t type, const void *w, int64_t n_in, int64_t n_out, tensor *out) {
    tensor tw = tensor_2d(type, (void *)w, n_in, n_out);
    const size_t sz = cpu_weight_pack_size(k, &tw);
    DFL_ASSERT(sz == x16_stride(type, n_in) * (size_t)n_out);
    uint8_t *p = aligned_alloc(64, sz);
    DFL_ASSERT(p != NULL);
    memset(p, 0xcd, sz); /* the padding must be written */
    *out = cpu_weight_pack(k, &tw, p);
    return p;
}

/* A weight; extreme: Q8_0 every quant -128 (even rows) or 127 (odd rows), Q4_0 every nibble 0 (-8)
 * or 15 (7): the largest |sums|. */
static void *x16_weight(rng *r, uint32_t type, int64_t n_in, int64_t n_out, bool extreme) {
    if (type == QUANT_TYPE_Q4_0) {
        block_q4_0 *w = make_weight(r, type, n_in, n_out);
        for (int64_t o = 0; o < n_out && extreme; o++) {
            for (int64_t b = 0; b < n_in / 32; b++) memset(w[o * (n_in / 32) + b].qs, o % 2 ? 0xff : 0x00, 16);
        }
        return w;
    }
    block_q8_0 *w = make_weight(r, type, n_in, n_out);
    for (int64_t o = 0; o < n_out && extreme; o++) {
        for (int64_t b = 0; b < n_in / 32; b++) memset(w[o * (n_in / 32) + b].qs, o % 2 ? 127 : 0x80, 32);
    }
    return w;
}

/* The scalar reference of the packed layout of type. */
static void x16_ref(uint32_t type, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                    int64_t ds, int64_t o0, int64_t o1) {
    if (type == QUANT_TYPE_Q4_0) cpu_matmul_q4_0_x16_ref(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
    else cpu_matmul_q8_0_x16_ref(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}

/* Packed rows byte for byte: quant byte j (Q8_0: 0..31, as q + 128; Q4_0: 0..15, as stored) of
 * block b at group b / 16, then (j / 4) * 64 + (b % 16) * 4 + j % 4; the scales after the quants;
 * zero padding. */
static void x16_check_layout(test_ctx *t, const cpu_kernels *k, uint32_t type, rng *r) {
    const bool q4 = type == QUANT_TYPE_Q4_0;
    const int64_t k_n[3] = {512, 1536, 2048};
    for (int ni = 0; ni < 3; ni++) {
        const int64_t n_in = k_n[ni], n_out = 3, nb = n_in / 32;
        const int qb = q4 ? 16 : 32;                   /* quant bytes per block */
        const size_t bb = x16_row_bytes(type, 32);     /* bytes per block */
        const uint8_t *w = make_weight(r, type, n_in, n_out);
        tensor tp;
        uint8_t *p = x16_pack(k, type, w, n_in, n_out, &tp);
        CHECK_EQ_INT(tp.layout, q4 ? TENSOR_LAYOUT_Q4_0_X16 : TENSOR_LAYOUT_Q8_0_X16);
        CHECK_EQ_INT(tp.type, type);
        CHECK_EQ_INT(tp.nb[1], x16_stride(type, n_in));
        CHECK_EQ_INT(tp.nb[1] % 64, 0);
        CHECK_EQ_INT(tp.ne[0], n_in);
        CHECK_EQ_INT(tp.ne[1], n_out);
        int bad = 0;
        for (int64_t o = 0; o < n_out && !bad; o++) {
            const uint8_t *row = p + (size_t)o * tp.nb[1];
            for (int64_t b = 0; b < nb && !bad; b++) {
                const uint8_t *blk = w + (size_t)(o * nb + b) * bb; /* d (f16), then the quants */
                for (int j = 0; j < qb && !bad; j++) {
                    const int64_t at = (b / 16) * 16 * qb + (j / 4) * 64 + (b % 16) * 4 + j % 4;
                    const uint8_t want = q4 ? blk[2 + j] : (uint8_t)(blk[2 + j] ^ 0x80); /* Q8_0: q + 128 */
                    if (row[at] != want) {
                        test_fail(t, __FILE__, __LINE__, "%s n_in %lld row %lld block %lld byte %d: at %lld = %02x, expected %02x",
                                  quant_type_get(type)->name, (long long)n_in, (long long)o, (long long)b, j, (long long)at,
                                  row[at], want);
                        bad = 1;
                    }
                }
                uint16_t d, dw;
                memcpy(&d, row + (size_t)(nb * qb) + 2 * b, 2);
                memcpy(&dw, blk, 2);
                CHECK_MSG(d == dw, "%s n_in %lld row %lld: scale %lld = %04x, expected %04x", quant_type_get(type)->name,
                          (long long)n_in, (long long)o, (long long)b, d, dw);
                if (d != dw) bad = 1;
            }
            for (size_t i = (size_t)nb * bb; i < tp.nb[1] && !bad; i++) {
                CHECK_MSG(row[i] == 0, "%s n_in %lld row %lld: padding byte %zu = %u", quant_type_get(type)->name,
                          (long long)n_in, (long long)o, i, row[i]);
                if (row[i] != 0) bad = 1;
            }
        }
        free(p);
        free((void *)w);
    }
    /* not packable: rows not a multiple of 16 blocks, strided rows, a packed view */
    uint8_t dummy[64] __attribute__((aligned(64)));
    tensor a = tensor_2d(type, dummy, 544, 4);
    CHECK_EQ_INT(cpu_weight_pack_size(k, &a), 0);
    tensor c = tensor_2d(type, dummy, 512, 4);
    c.nb[1] += x16_row_bytes(type, 32);
    CHECK_EQ_INT(cpu_weight_pack_size(k, &c), 0);
    tensor e = tensor_2d(type, dummy, 512, 4);
    CHECK(cpu_weight_pack_size(k, &e) > 0);
    e.layout = tp_layout_of(type);
    CHECK_EQ_INT(cpu_weight_pack_size(k, &e), 0); /* packed already */
}

TEST(gemm_q8_0_x16_layout) {
    rng r = {31};
    cpu_kernels k;
    cpu_kernels_init_ref(&k); /* every level packs Q8_0 */
    x16_check_layout(t, &k, QUANT_TYPE_Q8_0, &r);
    /* the scalar level packs no other type */
    uint8_t dummy[64] __attribute__((aligned(64)));
    tensor b = tensor_2d(QUANT_TYPE_F16, dummy, 512, 4);
    CHECK_EQ_INT(cpu_weight_pack_size(&k, &b), 0);
    tensor d = tensor_2d(QUANT_TYPE_Q4_0, dummy, 512, 4);
    CHECK_EQ_INT(cpu_weight_pack_size(&k, &d), 0);
}

TEST(gemm_q4_0_x16_layout) {
    cpu_kernels k;
    if (!x16_level(1, QUANT_TYPE_Q4_0, &k) && !x16_level(2, QUANT_TYPE_Q4_0, &k)) {
        test_skip(t, "no AVX2 on this CPU: Q4_0 is packed by the AVX2 and AVX-512 kernels only");
        return;
    }
    rng r = {41};
    x16_check_layout(t, &k, QUANT_TYPE_Q4_0, &r);
}

/* 8704: above the AVX-512 Q4_0 kernel's unpack buffer (Q4X_BUF_MAX_IN) */
static const int64_t k_x_in[5] = {512, 1536, 2560, 1024, 8704};
static const int64_t k_x_out[6] = {1, 3, 4, 5, 13, 37};
static const int64_t k_x_rows[9] = {1, 2, 3, 4, 5, 7, 16, 17, 33};

static int x16_cmp(test_ctx *t, const float *a, const float *b, int64_t n_out, int64_t n_rows, const char *what,
                   uint32_t type, int level, int64_t n_in) {
    const int64_t i = first_bit_diff(a, b, n_out * n_rows);
    if (i < 0) return 0;
    test_fail(t, __FILE__, __LINE__, "%s %s %s [%lld -> %lld] x %lld rows: out %lld row %lld: %.9g vs %.9g", what,
              quant_type_get(type)->name, k_level_names[level], (long long)n_in, (long long)n_out, (long long)n_rows,
              (long long)(i % n_out), (long long)(i / n_out), a[i], b[i]);
    return 1;
}

TEST(gemm_x16_same_bits_as_plain) {
    rng r = {9001};
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = k_x_types[ti];
        for (int level = 0; level < TEST_LEVELS; level++) {
            cpu_kernels ks;
            if (!x16_level(level, type, &ks)) {
                CHECK(type != QUANT_TYPE_Q8_0 || !level_available(level)); /* every level packs Q8_0 */
                continue;
            }
            for (int ni = 0; ni < 5; ni++) {
                for (int oi = 0; oi < 6; oi++) {
                    for (int ri = 0; ri < 9; ri++) {
                        if (level == 0 && (ni != 0 || ri > 6)) continue; /* the scalar kernels are slow */
                        if (ni == 4 && (oi != 5 || (ri != 0 && ri != 7))) continue; /* 1 and 17 rows, 37 outputs */
                        const int64_t n_in = k_x_in[ni], n_out = k_x_out[oi], n_rows = k_x_rows[ri];
                        const bool extreme = (oi + ri) % 5 == 2;
                        void *w = x16_weight(&r, type, n_in, n_out, extreme);
                        float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
                        float *y0 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                        float *y1 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                        REQUIRE(w && x && y0 && y1);
                        fill_f32(&r, x, n_in * n_rows, 2.0f);
                        if (extreme) {
                            for (int64_t i = 0; i < n_in * n_rows; i++) x[i] = (i / 32) % 2 ? 3.0f : -3.0f; /* q = +-127 */
                        }
                        tensor tp;
                        uint8_t *p = x16_pack(&ks, type, w, n_in, n_out, &tp);
                        cpu_act act;
                        void *mem = prep_act(&ks, type, &act, x, n_in, n_rows);
                        const size_t wrow = x16_row_bytes(type, n_in);
                        memset(y0, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                        memset(y1, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                        ks.matmul[type](w, wrow, &act, 0, n_rows, y0, n_out, 0, n_out);
                        ks.matmul_packed[type](p, tp.nb[1], &act, 0, n_rows, y1, n_out, 0, n_out);
                        int bad = x16_cmp(t, y1, y0, n_out, n_rows, extreme ? "packed vs plain (extreme)" : "packed vs plain",
                                          type, level, n_in);
                        for (int64_t i = 0; i < n_out * n_rows && !bad; i++) {
                            if (!isfinite(y1[i])) bad = x16_cmp(t, y1, y1, 1, 1, "non-finite", type, level, n_in) + 1;
                        }
                        if (level == 2 && ri < 5) { /* the references, on the same activations */
                            cpu_matmul_q_ref(type, w, wrow, &act, 0, n_rows, y0, n_out, 0, n_out);
                            x16_ref(type, p, tp.nb[1], &act, 0, n_rows, y1, n_out, 0, n_out);
                            x16_cmp(t, y1, y0, n_out, n_rows, "packed ref vs plain ref", type, level, n_in);
                        }
                        free(mem); free(p); free(y1); free(y0); free(x); free(w);
                    }
                }
            }
        }
    }
}

/* Every row range [a, a + nr) and output range [c, d) gives the full call's bits, nothing else. */
TEST(gemm_x16_batch_invariant) {
    rng r = {4711};
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = k_x_types[ti];
        for (int level = 0; level < TEST_LEVELS; level++) {
            cpu_kernels ks;
            if (!x16_level(level, type, &ks)) continue;
            const int64_t n_in = 1536, n_out = 37, n_rows = level == 0 ? 20 : 41;
            void *w = x16_weight(&r, type, n_in, n_out, false);
            float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
            float *y = malloc((size_t)(n_out * n_rows) * sizeof(float));
            float *y2 = malloc((size_t)(n_out * n_rows) * sizeof(float));
            REQUIRE(w && x && y && y2);
            fill_f32(&r, x, n_in * n_rows, 1.0f);
            tensor tp;
            uint8_t *p = x16_pack(&ks, type, w, n_in, n_out, &tp);
            cpu_act act;
            void *mem = prep_act(&ks, type, &act, x, n_in, n_rows);
            ks.matmul_packed[type](p, tp.nb[1], &act, 0, n_rows, y, n_out, 0, n_out);
            int bad = 0;
            for (int64_t len = 1; len <= 10 && !bad; len++) {
                const int64_t a = (len * 7) % (n_rows - len), nr = len == 10 ? n_rows - a : len;
                const int64_t c = len % 4 + (len > 5 ? 4 : 0), dd = n_out - (len % 3);
                memset(y2, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                ks.matmul_packed[type](p, tp.nb[1], &act, a, nr, y2, n_out, c, dd);
                char what[64];
                snprintf(what, sizeof(what), "%s %s", quant_type_get(type)->name, k_level_names[level]);
                bad = !range_call_ok(t, what, y2, y, n_out, n_rows, a, nr, c, dd);
            }
            free(mem); free(p); free(y2); free(y); free(x); free(w);
        }
    }
}

TEST(gemm_x16_ops_and_validation) {
    rng r = {77};
    const int64_t n_in = 1024, n_out = 203, n_rows = 19;
    float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
    float *y0 = malloc((size_t)(n_out * n_rows) * sizeof(float));
    float *y1 = malloc((size_t)(n_out * n_rows) * sizeof(float));
    REQUIRE(x && y0 && y1);
    fill_f32(&r, x, n_in * n_rows, 1.0f);
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = k_x_types[ti], other = type == QUANT_TYPE_Q8_0 ? QUANT_TYPE_Q4_0 : QUANT_TYPE_Q8_0;
        void *w = x16_weight(&r, type, n_in, n_out, false);
        REQUIRE(w != NULL);
        tensor tw = tensor_2d(type, w, n_in, n_out);
        tensor tp = {0}; /* the last packed copy, for the levels that do not read it */
        uint8_t *p = NULL;
        for (int level = 0; level < TEST_LEVELS; level++) {
            if (!level_available(level)) continue;
            backend *be = make_backend(2, level, false);
            REQUIRE(be != NULL);
            const size_t sz = backend_weight_pack_size(be, &(tensor){0});
            CHECK_EQ_INT(sz, 0); /* an F32 scalar-less view: nothing to pack */
            cpu_kernels kl;
            if (!x16_level(level, type, &kl)) {
                CHECK_EQ_INT(backend_weight_pack_size(be, &tw), 0);
                backend_free(be);
                continue;
            }
            const size_t psz = backend_weight_pack_size(be, &tw);
            CHECK_EQ_INT(psz, x16_stride(type, n_in) * (size_t)n_out);
            free(p);
            p = aligned_alloc(64, psz);
            REQUIRE(p != NULL);
            tp = backend_weight_pack(be, &tw, p);
            CHECK_MSG(mm_ops_same_bits(be, tw, tp, x, n_rows), "op_matmul / op_matmul_argmax packed vs plain differ (%s %s)",
                      quant_type_get(type)->name, k_level_names[level]);
            backend_op op; /* a valid matmul with the packed weight */
            memset(&op, 0, sizeof(op));
            op.kind = BACKEND_OP_MATMUL;
            op.src[0] = tp;
            op.src[1] = tensor_2d(QUANT_TYPE_F32, x, n_in, n_rows);
            op.dst = tensor_2d(QUANT_TYPE_F32, y1, n_out, n_rows);
            /* validation: packed only as a matmul's weight, and only well-formed */
            dfl_error err = {0};
            backend_op g;
            memset(&g, 0, sizeof(g));
            g.kind = BACKEND_OP_GET_ROWS;
            int32_t ids[2] = {0, 1};
            g.src[0] = tp;
            g.src[1] = tensor_1d(QUANT_TYPE_I32, ids, 2);
            g.dst = tensor_2d(QUANT_TYPE_F32, y0, n_in, 2);
            error_clear(&err);
            CHECK(backend_op_validate(be, &g, &err) == DFL_ERR_INVALID);
            CHECK_STR_CONTAINS(err.msg, "packed");
            backend_op m = op;
            m.src[1] = tp; /* as the activations */
            m.src[1].ne[1] = n_rows < n_out ? n_rows : n_out;
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            m = op;
            m.src[0].type = other;
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            CHECK_STR_CONTAINS(err.msg, type == QUANT_TYPE_Q8_0 ? "not q8_0" : "not q4_0");
            m.src[0] = tp;
            m.src[0].nb[1] -= 64; /* rows too short for their blocks */
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            m.src[0] = tp;
            m.src[0].data = p + 32; /* misaligned */
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            m.src[0] = tp;
            m.src[0].ne[0] = 544; /* not whole groups */
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            m.src[0] = tp;
            m.src[0].layout = 7;
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            CHECK_STR_CONTAINS(err.msg, "unknown layout");
            m.src[0] = tp;
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_OK);
            backend_free(be);
        }
        /* a backend whose kernels do not read the layout (Q4_0: the scalar level) refuses it */
        if (p != NULL && type == QUANT_TYPE_Q4_0) {
            backend *b0 = make_backend(1, 0, false);
            REQUIRE(b0 != NULL);
            backend_op op;
            memset(&op, 0, sizeof(op));
            op.kind = BACKEND_OP_MATMUL;
            op.src[0] = tp;
            op.src[1] = tensor_2d(QUANT_TYPE_F32, x, n_in, n_rows);
            op.dst = tensor_2d(QUANT_TYPE_F32, y1, n_out, n_rows);
            dfl_error err = {0};
            CHECK(backend_op_validate(b0, &op, &err) == DFL_ERR_UNSUPPORTED);
            CHECK_STR_CONTAINS(err.msg, "do not read");
            backend_free(b0);
        }
        free(p);
        free(w);
    }
    free(y1); free(y0); free(x);
}

/* A Q8_0 model with packable dimensions (n_embd 512, n_ff 1536): the same logits and tokens with
 * and without the packed copy; the drafter pair packs and shares the head once. */
static void x16_check_packed(test_ctx *t, dfl_context *c) {
    CHECK_EQ_INT(c->weights_packed, 1);
    CHECK_EQ_INT(c->w.layers[0].wq.layout, TENSOR_LAYOUT_Q8_0_X16);
    CHECK_EQ_INT(c->w.layers[1].ffn_down.layout, TENSOR_LAYOUT_Q8_0_X16);
    CHECK_EQ_INT(c->w.output.layout, TENSOR_LAYOUT_Q8_0_X16);
    CHECK_EQ_INT(c->w.token_embd.layout, TENSOR_LAYOUT_PLAIN); /* get_rows reads the mapping */
}

static void q4x_check_packed(test_ctx *t, dfl_context *c) {
    CHECK_EQ_INT(c->weights_packed, 1);
    CHECK_EQ_INT(c->w.layers[0].wq.layout, TENSOR_LAYOUT_Q4_0_X16);
    CHECK_EQ_INT(c->w.layers[1].ffn_down.layout, TENSOR_LAYOUT_Q4_0_X16);
}

/* A Q4_0 model (the same dimensions) on this machine's best level: the same logits and tokens
 * with and without the packed copy. */
TEST(gemm_q4_0_x16_model_same_logits) {
    cpu_kernels k;
    cpu_kernels_select(&k, cpu_features_detect());
    if (k.pack_layout[QUANT_TYPE_Q4_0] != TENSOR_LAYOUT_Q4_0_X16) {
        test_skip(t, "no AVX2 on this CPU: Q4_0 is packed by the AVX2 and AVX-512 kernels only");
        return;
    }
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
    free(tu_pack_ab(t, m, prompt, 9, 12, q4x_check_packed));
    dfl_model_free(m);
}

TEST(gemm_q8_0_x16_model_same_logits) {
    char target[512], drafter[512];
    if (!tu_make_models(t, "m", "--n-embd 512 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 128 --n-ff 1536 "
                        "--n-vocab 700 --draft-layers 1 --block-size 4 --type q8_0",
                        target, drafter, sizeof(target))) {
        return;
    }
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(target, NULL, &err);
    REQUIRE(m != NULL);
    const int32_t prompt[9] = {5, 77, 301, 2, 699, 18, 42, 42, 7};
    float *lg = tu_pack_ab(t, m, prompt, 9, 12, x16_check_packed);
    REQUIRE(lg != NULL);
    /* more backends than the model has pack slots: the extra context reads the weights as stored */
    {
        dfl_context *cs[MODEL_MAX_DEVICE_COPIES + 1];
        dfl_context_params cp = dfl_context_default_params();
        cp.n_ctx = 64;
        cp.n_batch = cp.n_ubatch = cp.n_outputs = 16;
        cp.n_threads = cp.n_threads_batch = 1;
        float *l2 = malloc(sizeof(float) * 9 * 700);
        REQUIRE(l2 != NULL);
        for (int i = 0; i <= MODEL_MAX_DEVICE_COPIES; i++) {
            cs[i] = dfl_context_new(m, &cp, &err);
            REQUIRE(cs[i] != NULL);
            CHECK_EQ_INT(cs[i]->weights_packed, i < MODEL_MAX_DEVICE_COPIES);
        }
        CHECK(tu_decode(cs[MODEL_MAX_DEVICE_COPIES], 0, prompt, 9, l2, &err) == DFL_OK);
        CHECK_MSG(memcmp(l2, lg, sizeof(float) * 9 * 700) == 0, "logits of the unpacked extra context differ");
        CHECK(tu_decode(cs[0], 0, prompt, 9, l2, &err) == DFL_OK);
        CHECK_MSG(memcmp(l2, lg, sizeof(float) * 9 * 700) == 0, "logits of a packed context on 1 thread differ");
        for (int i = MODEL_MAX_DEVICE_COPIES; i >= 0; i--) dfl_context_free(cs[i]);
        free(l2);
    }
    CHECK_EQ_INT(m->pack[0].refs, 0); /* released with the last context */
    CHECK(m->pack[0].be == NULL);
    free(lg);
    /* target + drafter on one backend: each model packs once; the drafter's head is the target's */
    dfl_model *dm = dfl_model_load(drafter, NULL, &err);
    REQUIRE(dm != NULL);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = cp.n_threads_batch = 1;
    const dfl_hparams *dh = dfl_model_hparams(dm);
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    dfl_context *tc = dfl_context_new(m, &cp, &err);
    REQUIRE(tc != NULL);
    dfl_context_params dp = dfl_context_default_params();
    dp.target = tc;
    dfl_context *dc = dfl_context_new(dm, &dp, &err);
    CHECK(dc != NULL);
    if (dc != NULL) {
        CHECK(dc->w.output.data == tc->w.output.data);
        CHECK_EQ_INT(dc->w.layers[0].wq.layout, TENSOR_LAYOUT_Q8_0_X16);
        CHECK_EQ_INT(m->pack[0].refs, 1);
        CHECK_EQ_INT(dm->pack[0].refs, 1);
        dfl_context_free(dc);
    }
    dfl_context_free(tc);
    dfl_model_free(dm);
    dfl_model_free(m);
}
