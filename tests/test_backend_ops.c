/* test_backend_ops.c: every CPU backend op but matmul (test_backend_matmul.c) against its scalar
 * reference (cpu_ops_ref.c) on awkward sizes, for each CPU feature level this machine has (scalar,
 * avx2, avx512): rmsnorm, rope, attention (masks, row invariance, the f16 dot/axpy kernels),
 * rows, element-wise ops, copy, argmax, the light-row kernels, softmax and op validation. Every
 * comparison fails on a non-finite value unless the test is about non-finite values. */
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

/* One backend through a sequence of rope ops (its position table: cpu_rope.c): positions that
 * grow the table, another freq_base and n_rot (the table starts over), back again, NORM pairing,
 * and positions the table does not cover (negative, 2^20 and above: the reference); every output
 * equals cpu_op_rope_neox_ref bit for bit, on 1 and 2 threads. */
TEST(backend_op_rope_table) {
    rng r = {61};
    enum { HD = 128, NH = 6, NT = 24 };
    static float x[HD * NH * NT], y[HD * NH * NT], yr[HD * NH * NT];
    static int32_t pos[NT];
    const struct { int32_t p0, step; float base; int32_t n_rot, norm; } cases[] = {
        {0, 1, 10000.0f, 64, 0},   {3000, 97, 10000.0f, 64, 0}, {5, 3, 1000000.0f, 64, 0},
        {40, 1, 10000.0f, 64, 0},  {9, 2, 10000.0f, 0, 0},      {7, 11, 10000.0f, 128, 1},
        {-3, 1, 10000.0f, 64, 0},
        {(1 << 20) - 10, 1, 10000.0f, 64, 0}, {100, 5, 10000.0f, 64, 0},
    };
    for (int nt = 1; nt <= 2; nt++) {
        backend *be = make_backend(nt, 2, false);
        REQUIRE(be);
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            for (int64_t i = 0; i < NT; i++) pos[i] = cases[c].p0 + (int32_t)i * cases[c].step;
            fill_f32(&r, x, HD * NH * NT, 1.0f);
            backend_op op = mkop(BACKEND_OP_ROPE_NEOX, tensor_3d(QUANT_TYPE_F32, y, HD, NH, NT),
                                 &(tensor){0}, NULL);
            op.src[0] = tensor_3d(QUANT_TYPE_F32, x, HD, NH, NT);
            op.src[1] = tensor_1d(QUANT_TYPE_I32, pos, NT);
            op.f[0] = cases[c].base;
            op.i[0] = cases[c].n_rot;
            op.i[1] = cases[c].norm;
            backend_op ref = op;
            ref.dst.data = yr;
            cpu_op_rope_neox_ref(&ref);
            memset(y, 0, sizeof(y));
            run_op(be, &op);
            CHECK_MSG(memcmp(y, yr, sizeof(y)) == 0, "rope case %zu (positions from %d, base %g, n_rot %d, %d threads): "
                      "differs from the reference", c, cases[c].p0, (double)cases[c].base, cases[c].n_rot, nt);
        }
        backend_free(be);
    }
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

/* An attention op over a cache of ktype keys and vtype values [hd, nh_kv, nkv] with a mask tensor
 * [nkv, nq]. */
static backend_op attn_op(float *q, uint32_t ktype, void *kc, uint32_t vtype, void *vc, float *mask, float *out,
                          int64_t hd, int64_t nh, int64_t nh_kv, int64_t nq, int64_t nkv) {
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_ATTENTION;
    op.src[0] = tensor_3d(QUANT_TYPE_F32, q, hd, nh, nq);
    op.src[1] = tensor_3d(ktype, kc, hd, nh_kv, nkv);
    op.src[2] = tensor_3d(vtype, vc, hd, nh_kv, nkv);
    op.src[3] = tensor_2d(QUANT_TYPE_F32, mask, nkv, nq);
    op.dst = tensor_3d(QUANT_TYPE_F32, out, hd, nh, nq);
    return op;
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
    backend_op op = attn_op(q, ktype, kc, vtype, vc, mask, ref, hd, nh, nh_kv, nq, n_kv);
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
    for (int level = 0; level < TEST_LEVELS; level++) {
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
 * single bit; nor must the query rows per item (cpu_kernels.attn_rows, 16 by default: 4-32 here). */
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
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        for (int mk = 0; mk < 2; mk++) {
            for (int iq = 0; iq < NQ; iq++) {
                for (int j = 0; j < NKV; j++) {
                    bool vis = j <= PAST + iq;                                  /* causal */
                    if (mk == 1) vis = vis && (j < PAST ? j % 3 != 0 : (j - PAST) % 2 == iq % 2); /* 2 seqs */
                    mask[iq * NKV + j] = vis ? 0.0f : -INFINITY;
                }
            }
            for (int run = 0; run < 8; run++) { /* threads 1, 2 x rows per item 4, 8, 16, 32 */
                const int nt = 1 + run / 4, ar = 4 << (run % 4);
                backend *be = make_backend(nt, level, false);
                REQUIRE(be);
                ((cpu_backend *)be)->kernels.attn_rows = ar;
                backend_op op = attn_op(q, QUANT_TYPE_F16, kc, QUANT_TYPE_F16, vc, mask, out, HD, NH, NH_KV, NQ, NKV);
                run_op(be, &op);
                for (int iq = 0; iq < NQ; iq++) {
                    op.src[0] = tensor_3d(QUANT_TYPE_F32, q + iq * HD * NH, HD, NH, 1);
                    op.src[3] = tensor_2d(QUANT_TYPE_F32, mask + iq * NKV, NKV, 1);
                    op.dst = tensor_3d(QUANT_TYPE_F32, one, HD, NH, 1);
                    run_op(be, &op);
                    CHECK_MSG(memcmp(one, out + iq * HD * NH, sizeof(one)) == 0,
                              "attention %s mask %d threads %d, %d rows per item: row %d alone differs from the batch",
                              k_level_names[level], mk, nt, ar, iq);
                }
                backend_free(be);
            }
        }
    }
}

/* A decode step or a short verify (one item per kv head) reads its kv heads' cache rows together,
 * block by block of cells, its P V sums going on from block to block (cpu_ops.c attn16_heads_fn):
 * each row's output is the batch path's (attn16_fn, items of 2 positions here), bit for bit, with
 * 8 kv heads over 1-8 threads (shares of 1-8 heads, uneven with 3), cells across several blocks
 * and a partial one, and masked cells whose keys and values are inf or NaN (a whole block of
 * them, and scattered ones), which must add nothing. */
TEST(backend_attention_decode_blocks) {
    rng r = {33};
    enum { HD = 128, NH = 16, NH_KV = 8, NQ = 5, NKV = 300 };
    static uint16_t kc[HD * NH_KV * NKV], vc[HD * NH_KV * NKV];
    static float q[HD * NH * NQ], mask[NKV * NQ], out[HD * NH * NQ], part[HD * NH * 2];
    fill_f32(&r, q, HD * NH * NQ, 4.0f);
    for (int j = 0; j < NKV; j++) {
        const bool hidden = (j >= 128 && j < 192) || j % 5 == 3 || j >= 290; /* for every row */
        for (int iq = 0; iq < NQ; iq++) {
            const bool later = j >= 270 + 3 * iq; /* causal-like: later rows see more */
            mask[iq * NKV + j] = hidden || later ? -INFINITY : (j % 7 == 0 ? -0.5f : 0.0f);
        }
        for (int i = 0; i < HD * NH_KV; i++) {
            kc[j * HD * NH_KV + i] = fp32_to_fp16(rng_f(&r) * 2.0f);
            vc[j * HD * NH_KV + i] = fp32_to_fp16(rng_f(&r));
            if (hidden && i % 9 == j % 9) {
                vc[j * HD * NH_KV + i] = i % 2 ? 0x7c00 : 0x7e00; /* inf, NaN */
                kc[j * HD * NH_KV + i] = 0xfc00;                  /* -inf */
            }
        }
    }
    /* the parts: one position (a decode step), and two (a short verify) */
    static const int p0s[] = {1, 3}, pns[] = {1, 2};
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        static const int nts[] = {1, 2, 3, 8};
        for (int ti = 0; ti < 4; ti++) {
            backend *be = make_backend(nts[ti], level, false);
            REQUIRE(be);
            ((cpu_backend *)be)->kernels.attn_rows = 4; /* 2 positions x group 2 per item */
            backend_op op = attn_op(q, QUANT_TYPE_F16, kc, QUANT_TYPE_F16, vc, mask, out, HD, NH, NH_KV, NQ, NKV);
            run_op(be, &op);
            for (int pi = 0; pi < 2; pi++) {
                const int p0 = p0s[pi], pn = pns[pi];
                op.src[0] = tensor_3d(QUANT_TYPE_F32, q + p0 * HD * NH, HD, NH, pn);
                op.src[3] = tensor_2d(QUANT_TYPE_F32, mask + p0 * NKV, NKV, pn);
                op.dst = tensor_3d(QUANT_TYPE_F32, part, HD, NH, pn);
                memset(part, 0xff, sizeof(part));
                run_op(be, &op);
                CHECK_MSG(memcmp(part, out + p0 * HD * NH, (size_t)(pn * HD * NH) * sizeof(float)) == 0,
                          "attention %s, %d threads: positions %d..%d alone differ from the batch",
                          k_level_names[level], nts[ti], p0, p0 + pn - 1);
                bool finite = true;
                for (int i = 0; i < pn * HD * NH; i++) finite = finite && isfinite(part[i]);
                CHECK_MSG(finite, "attention %s, %d threads: masked inf / NaN cells reached positions %d..%d",
                          k_level_names[level], nts[ti], p0, p0 + pn - 1);
            }
            backend_free(be);
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
        backend_op op = attn_op(q, ktype, kc, vtype, vc, mask, o[0], hd, nh, nh_kv, nq, n_kv);
        backend_op sop = op;
        memset(&sop.src[3], 0, sizeof(sop.src[3])); /* a structured kind takes no mask tensor */
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
    for (int level = 0; level < TEST_LEVELS; level++) {
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
    for (int level = 1; level < TEST_LEVELS; level++) {
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
    backend_op op = attn_op(q, QUANT_TYPE_F32, k, QUANT_TYPE_F32, v, mask, out, hd, nh, nh_kv, nq, n_kv);
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
/* P V over keys [0, s1) then [s1, nkv) continuing the sums (cpu_attn_pv_fn's acc). */
static void pv_split(const cpu_kernels *ks, float *d, int64_t hd, const float *b, int64_t ldp, int64_t nq,
                     const uint16_t *h, int64_t vstride, int64_t nkv, int64_t s1) {
    ks->attn_pv_f16(d, hd, b, ldp, nq, h, (size_t)vstride * 2, s1, hd, 0, false);
    ks->attn_pv_f16(d, hd, b + s1, ldp, nq, h + s1 * vstride, (size_t)vstride * 2, nkv - s1, hd, 0, true);
}

TEST(backend_light_row_kernels) {
    rng r = {14};
    static const int64_t lens[] = {1, 2, 7, 15, 16, 17, 31, 33, 64, 255, 256, 1000, 4097};
    float *a = malloc(8192 * sizeof(float)), *b = malloc(8192 * sizeof(float));
    float *d1 = malloc(8192 * sizeof(float)), *d2 = malloc(8192 * sizeof(float));
    uint16_t *h1 = malloc(65536 * sizeof(uint16_t)), *h2 = malloc(8192 * sizeof(uint16_t));
    REQUIRE(a && b && d1 && d2 && h1 && h2);
    for (int level = 1; level < TEST_LEVELS; level++) {
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
        /* attention P V: awkward head sizes, row counts across the 5- and 6-row tiles, key counts
         * across the 128-key blocks, strided values */
        static const int64_t hds[] = {8, 64, 72, 130}, nqs[] = {1, 2, 3, 4, 5, 6, 7, 13}, nkvs[] = {1, 37, 290};
        for (size_t hi = 0; hi < 4; hi++)
            for (size_t qi = 0; qi < 8; qi++)
                for (size_t ki = 0; ki < 3; ki++) {
                    const int64_t hd = hds[hi], nq = nqs[qi], nkv = nkvs[ki], vstride = hd + 3, ldp = nkv + 2;
                    REQUIRE(nkv * vstride <= 65536 && nq * ldp <= 8192 && nq * hd <= 8192);
                    fill_f32(&r, b, nq * ldp, 1.0f);
                    for (int64_t i = 0; i < nkv * vstride; i++) h1[i] = fp32_to_fp16(rng_f(&r));
                    const int64_t got = ks.attn_pv_f16(d1, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd, 0, false);
                    CHECK_MSG(got == 0 || got == nkv, "attention P V: %lld rows known finite of %lld", (long long)got,
                              (long long)nkv);
                    CHECK_EQ_INT(kr.attn_pv_f16(d2, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd, 0, false), 0);
                    close_enough(t, "attention P V", d1, d2, nq * hd, 1e-6, 1e-5);
                    /* rows vouched finite (n_fin) are not checked again: the same bits */
                    static float d3[8192];
                    const int64_t nf = nkv / 2;
                    const int64_t got2 = ks.attn_pv_f16(d3, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd, nf, false);
                    CHECK_MSG(got2 == nf || got2 == nkv, "attention P V from %lld: %lld rows known finite", (long long)nf,
                              (long long)got2);
                    CHECK_MSG(memcmp(d1, d3, (size_t)(nq * hd) * 4) == 0, "attention P V (%s) with n_fin %lld differs",
                              ks.name, (long long)nf);
                    /* the keys in two calls, the second continuing the first's sums (acc): the
                     * same bits (a decode step reads several heads' values per block of cells) */
                    static float d4[8192];
                    const int64_t s1 = nkv / 3 + 1;
                    if (nkv > 1) {
                        pv_split(&ks, d4, hd, b, ldp, nq, h1, vstride, nkv, s1);
                        CHECK_MSG(memcmp(d1, d4, (size_t)(nq * hd) * 4) == 0,
                                  "attention P V (%s) over keys [0, %lld) + [%lld, %lld) differs from one call", ks.name,
                                  (long long)s1, (long long)s1, (long long)nkv);
                    }
                    /* a key masked for every row (p = 0) whose value overflowed f16 to inf adds
                     * nothing: the outputs stay finite and equal the reference's */
                    if (nkv > 1) {
                        for (int64_t q = 0; q < nq; q++) b[q * ldp + nkv - 1] = 0.0f;
                        for (int64_t i = 0; i < hd; i++) h1[(nkv - 1) * vstride + i] = 0x7c00; /* +inf */
                        /* the inf row past n_fin is found: fewer than all rows known finite */
                        const int64_t gi = ks.attn_pv_f16(d1, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd, nkv - 1, false);
                        CHECK_MSG(gi == nkv - 1, "attention P V: an inf value row counted finite (%lld of %lld)",
                                  (long long)gi, (long long)nkv);
                        kr.attn_pv_f16(d2, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd, 0, false);
                        close_enough(t, "attention P V, masked inf value", d1, d2, nq * hd, 1e-6, 1e-5);
                        /* an inf only in the row's last value (the last chunk a kernel checks on
                         * its own): still found, and the sums still the reference's */
                        for (int64_t i = 0; i < hd - 1; i++) h1[(nkv - 1) * vstride + i] = fp32_to_fp16(0.5f);
                        const int64_t gl = ks.attn_pv_f16(d1, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd, 0, false);
                        CHECK_MSG(gl == 0, "attention P V: a row with one inf value counted finite (%lld of %lld)",
                                  (long long)gl, (long long)nkv);
                        kr.attn_pv_f16(d2, hd, b, ldp, nq, h1, (size_t)vstride * 2, nkv, hd, 0, false);
                        close_enough(t, "attention P V, one masked inf value", d1, d2, nq * hd, 1e-6, 1e-5);
                        /* split, the inf in the second part: found there, the first part's sums kept */
                        pv_split(&ks, d4, hd, b, ldp, nq, h1, vstride, nkv, s1);
                        CHECK_MSG(memcmp(d1, d4, (size_t)(nq * hd) * 4) == 0,
                                  "attention P V (%s), one masked inf value, split at %lld: differs from one call",
                                  ks.name, (long long)s1);
                    }
                }
    }
    free(a); free(b); free(d1); free(d2); free(h1); free(h2);
}

/* The fused structured-mask attention row (attn_probs_row) of every level that has one against
 * the three steps it replaces with the same level's kernels (scale + 0.0f on the visible cells,
 * -inf after, softmax_row, act_row[F16]), bit for bit: awkward lengths (SIMD tails), no visible
 * cell, one, all, a NaN or +Inf among the visible scores (the row turns NaN) or among the hidden
 * ones (ignored), -inf scores, and scores far apart (exp underflow to 0). */
TEST(backend_attn_probs_row_kernels) {
    rng r = {16};
    static const int64_t lens[] = {1, 7, 15, 16, 17, 31, 32, 33, 100, 512, 513};
    float s[520], d1[520], d2[520];
    int tested = 0;
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        cpu_kernels ks;
        cpu_kernels_select(&ks, cpu_features_detect() & ~level_disable(level));
        if (ks.attn_probs_row == NULL) continue;
        tested++;
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            const int64_t n = lens[li];
            const int64_t vis[] = {0, 1, n / 2, n - 1, n};
            for (size_t vi = 0; vi < sizeof(vis) / sizeof(vis[0]); vi++) {
                for (int special = 0; special < 5; special++) {
                    const int64_t nv = vis[vi];
                    fill_f32(&r, s, n, 30.0f);
                    if (special == 1 && nv > 0) s[nv - 1] = NAN;
                    if (special == 2 && nv > 0) s[nv / 2] = INFINITY;
                    if (special == 3 && nv < n) s[n - 1] = NAN; /* hidden: ignored */
                    if (special == 4) {
                        s[0] = -INFINITY;
                        if (n > 2) s[n / 3] = 4000.0f;
                    }
                    const float scale = 0.08838834764831845f;
                    memcpy(d1, s, (size_t)n * 4);
                    ks.attn_probs_row(d1, n, nv, scale);
                    for (int64_t j = 0; j < n; j++) d2[j] = j < nv ? s[j] * scale + 0.0f : -INFINITY;
                    ks.softmax_row(d2, d2, n);
                    cpu_act pact;
                    cpu_act_layout(&pact, CPU_DOT_F32, n, 1, d2);
                    ks.act_row[QUANT_TYPE_F16](&pact, 0, d2);
                    CHECK_MSG(memcmp(d1, d2, (size_t)n * 4) == 0, "attn probs row (%s, n %lld, n_vis %lld, case %d) differs",
                              ks.name, (long long)n, (long long)nv, special);
                }
            }
        }
    }
    CHECK_MSG(tested > 0 || !level_available(2), "no level with a fused attention row was tested");
}

/* The rope rotation of every level against cpu_rope_row bit for bit: NEOX and NORM pairing,
 * n_rot from one pair to a whole row with SIMD tails (pairs 1, 3, 7, 8, 9, 15, 16, 17, 18, 31,
 * 32, 33), pass-through tails after n_rot, in place and out of place, with values of every
 * magnitude, signed zeros, infinities and NaNs (the same IEEE operations give the same bits). */
TEST(backend_rope_row_kernels) {
    rng r = {15};
    static const int32_t rots[] = {2, 6, 14, 16, 18, 30, 32, 34, 36, 62, 64, 66, 128};
    float x[160], cs[128], d1[160], d2[160];
    for (int level = 0; level < TEST_LEVELS; level++) {
        if (!level_available(level)) continue;
        cpu_kernels ks;
        cpu_kernels_select(&ks, cpu_features_detect() & ~level_disable(level));
        for (size_t ri = 0; ri < sizeof(rots) / sizeof(rots[0]); ri++) {
            const int32_t n_rot = rots[ri];
            for (int extra = 0; extra <= 5; extra += 5) {
                const int64_t hd = n_rot + extra + (n_rot % 4); /* rows of odd length too */
                for (int norm = 0; norm <= 1; norm++) {
                    fill_f32(&r, x, 160, 1000.0f);
                    x[0] = -0.0f;
                    x[n_rot / 2] = INFINITY;
                    if (hd > 3) x[3] = NAN;
                    cpu_rope_cache(cs, 37.0f + (float)ri * 1001.0f, 10000.0f, n_rot);
                    cpu_rope_row(d2, x, cs, hd, n_rot, norm);
                    ks.rope_row(d1, x, cs, hd, n_rot, norm);
                    CHECK_MSG(memcmp(d1, d2, (size_t)hd * 4) == 0, "rope row (%s, n_rot %d, hd %lld, norm %d) differs",
                              ks.name, n_rot, (long long)hd, norm);
                    memcpy(d1, x, sizeof(x));
                    ks.rope_row(d1, d1, cs, hd, n_rot, norm);
                    CHECK_MSG(memcmp(d1, d2, (size_t)hd * 4) == 0,
                              "rope row in place (%s, n_rot %d, hd %lld, norm %d) differs", ks.name, n_rot, (long long)hd,
                              norm);
                    CHECK_MSG(memcmp(d1 + hd, x + hd, (size_t)(160 - hd) * 4) == 0, "rope row wrote past its row");
                }
            }
        }
    }
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


/* The attention softmax kernels against the reference softmax (exp within a few ulp). */
TEST(backend_softmax_kernels) {
    rng r = {31};
    for (int level = 1; level < TEST_LEVELS; level++) {
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
    for (int level = 0; level < TEST_LEVELS; level++) {
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
