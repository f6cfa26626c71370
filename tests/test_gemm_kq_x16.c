/* test_gemm_kq_x16.c: Q4_K / Q6_K weights packed for the AVX2 and AVX-512 kernels (TENSOR_LAYOUT_KQ_X16,
 * and Q6_K for AVX2 as TENSOR_LAYOUT_Q6K_X16V; cpu_pack.c): 16 rows per group, one record per
 * super-block with row i in 32-bit lane i.
 * - the layout: every record field at its offset (d, dmin, the unpacked 6-bit / int8 scales, the
 *   Q4_K quant dwords, the Q6_K ql / qh dwords or, Q6K_X16V, its 6-bit values four in three bytes,
 *   and Q6_K's correction for biased activations), the last group padded with the last row; which levels pack (AVX2 and AVX-512; the scalar level
 *   reads the blocks);
 * - the packed kernels give the bits of the plain kernels on awkward shapes (n_in 256 .. 2816,
 *   outputs 1 .. 37, rows 1 .. 130, from row 0 and from row 1), random and extreme blocks; the
 *   packed reference gives the bits of the plain reference (also at levels that do not pack);
 * - output ranges starting at any group and any row range give the full call's bits and write
 *   nothing outside;
 * - op_matmul / op_matmul_argmax on 2 threads: packed equals plain; malformed packed views are
 *   refused;
 * - a Q4_K_M model (dflash quantize of a generated F16 one): the same logits and greedy tokens
 *   with and without the packed copy. */
#include "test.h"
#include "test_backend_util.h"
#include "test_util.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "model/context.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t k_kt[2] = {QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K};

/* the kernels of a level (1 avx2, 2 avx512) if this machine has it (they pack K-quants) */
static bool kx_level(int level, cpu_kernels *k) {
    if (!level_available(level))
        return false;
    cpu_kernels_select(k, cpu_features_detect() & ~level_disable(level));
    return k->matmul_packed[QUANT_TYPE_Q4_K] != NULL && k->matmul_packed[QUANT_TYPE_Q6_K] != NULL;
}

/* A packed copy (aligned_alloc'd) of the plain weight w; poisoned first so that every byte must
 * be written. The reference kernel set packs nothing, so the packing goes through k. */
static uint8_t *kx_pack(const cpu_kernels *k, uint32_t type, const void *w, int64_t n_in, int64_t n_out, tensor *out) {
    tensor tw = tensor_2d(type, (void *)w, n_in, n_out);
    const size_t sz = cpu_weight_pack_size(k, &tw);
    DFL_ASSERT(sz == (size_t)((n_out + 15) / 16) * (size_t)(n_in / QK_K) * tensor_kq_x16_record_bytes(type));
    uint8_t *p = aligned_alloc(64, sz);
    DFL_ASSERT(p != NULL);
    memset(p, 0xcd, sz);
    *out = cpu_weight_pack(k, &tw, p);
    return p;
}

TEST(gemm_kq_x16_layout) {
    cpu_kernels k, kr;
    if (!kx_level(1, &k)) {
        test_skip(t, "no AVX2: K-quants are packed only for the AVX2 and AVX-512 kernels");
        return;
    }
    cpu_kernels_init_ref(&kr);
    rng r = {123};
    for (int lt = 0; lt < 4; lt++) { /* (level, type): AVX2 then AVX-512 (if here), Q4_K then Q6_K */
        const int ti = lt % 2;
        if (lt == 2 && !kx_level(2, &k)) break;
        const uint32_t type = k_kt[ti];
        const int64_t n_in = 512, n_out = 19, nsb = 2; /* two groups, the second padded */
        void *w = make_kq_weight(&r, type, n_in, n_out, false);
        tensor tp;
        uint8_t *p = kx_pack(&k, type, w, n_in, n_out, &tp);
        const size_t rec = tensor_kq_x16_record_bytes(type);
        /* AVX2 reads Q6_K as ready 6-bit values, AVX-512 as the block's ql / qh */
        const bool vl = type == QUANT_TYPE_Q6_K && lt < 2;
        CHECK_EQ_INT(tp.layout, vl ? TENSOR_LAYOUT_Q6K_X16V : TENSOR_LAYOUT_KQ_X16);
        CHECK_EQ_INT(tp.nb[1], rec * nsb / 16);
        int bad = 0;
        for (int64_t o = 0; o < 32 && !bad; o++) {
            const int64_t src = o < n_out ? o : n_out - 1, i = o % 16;
            for (int64_t sb = 0; sb < nsb && !bad; sb++) {
                const uint8_t *R = p + (size_t)(o / 16) * 16 * tp.nb[1] + (size_t)sb * rec;
                if (type == QUANT_TYPE_Q4_K) {
                    const block_q4_K *b = (const block_q4_K *)w + src * nsb + sb;
                    bad |= memcmp(R + 4 * i, &b->d, 2) != 0 || memcmp(R + 4 * i + 2, &b->dmin, 2) != 0;
                    for (int j = 0; j < 8; j++) {
                        int sc, m;
                        cpu_q4_K_scale_min(j, b->scales, &sc, &m);
                        bad |= R[CPU_KQ_X16_Q4K_SC + 16 * j + i] != sc || R[CPU_KQ_X16_Q4K_M + 16 * j + i] != m;
                    }
                    for (int q = 0; q < 32; q++)
                        bad |= memcmp(R + CPU_KQ_X16_QS + 64 * q + 4 * i, b->qs + 4 * q, 4) != 0;
                } else {
                    const block_q6_K *b = (const block_q6_K *)w + src * nsb + sb;
                    bad |= memcmp(R + 2 * i, &b->d, 2) != 0 || R[32 + i] != 0;
                    for (int j = 0; j < 16; j++)
                        bad |= (int8_t)R[CPU_KQ_X16_Q6K_SC + 16 * j + i] != b->scales[j];
                    int32_t nk = 0, nk_rec; /* the biased activations' correction (both layouts) */
                    for (int e = 0; e < QK_K; e++) nk -= 128 * b->scales[e / 16] * cpu_q6_K_value(b, e);
                    memcpy(&nk_rec, R + CPU_KQ_X16_Q6K_NK + 4 * i, 4);
                    bad |= nk_rec != nk;
                    for (int q = 0; q < 32 && !vl; q++)
                        bad |= memcmp(R + CPU_KQ_X16_Q6K_QL + 64 * q + 4 * i, b->ql + 4 * q, 4) != 0;
                    for (int q = 0; q < 16 && !vl; q++)
                        bad |= memcmp(R + CPU_KQ_X16_Q6K_QH + 64 * q + 4 * i, b->qh + 4 * q, 4) != 0;
                    for (int j = 0; j < 16 && vl; j++) { /* sub-block j: 3 dwords, written out by hand */
                        for (int kk = 0; kk < 3; kk++) {
                            for (int e = 0; e < 4; e++) {
                                const int lo = cpu_q6_K_value(b, 16 * j + 4 * kk + e) + 32;
                                const int hi = ((cpu_q6_K_value(b, 16 * j + 12 + e) + 32) >> (2 * kk)) & 3;
                                bad |= R[CPU_Q6K_X16V_QV + 64 * (3 * j + kk) + 4 * i + e] != (uint8_t)(lo | hi << 6);
                            }
                        }
                    }
                    /* the reference's whole-block decode (what the x16 reference reads) against its
                     * element-wise one */
                    int8_t v[QK_K];
                    cpu_q6_K_values(b, v);
                    for (int e = 0; e < QK_K; e++) bad |= v[e] != cpu_q6_K_value(b, e);
                }
                CHECK_MSG(!bad, "%s: packed row %lld super-block %lld differs from its block",
                          quant_type_get(type)->name, (long long)o, (long long)sb);
            }
        }
        tensor tw = tensor_2d(type, w, n_in, n_out);
        CHECK_EQ_INT(cpu_weight_pack_size(&kr, &tw), 0); /* the scalar level reads the blocks */
        free(p);
        free(w);
    }
}

static const int64_t k_kn_in[3] = {256, 768, 2816};
static const int64_t k_kn_out[5] = {1, 3, 13, 16, 37};
/* the fused paths' edges: AVX-512 tiles of 8 (8 / 9, 16 / 17), Q6_K fused up to 24 rows (24 / 25,
 * and 23 / 24 from row 1), sweeps of 64 (130); AVX2 16 / 17 */
static const int64_t k_krows[12] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 24, 25, 130};

static int kx_cmp(test_ctx *t, const float *a, const float *b, int64_t n, int64_t n_out, const char *what,
                  uint32_t type, int64_t n_in) {
    const int64_t i = first_bit_diff(a, b, n);
    if (i < 0)
        return 0;
    test_fail(t, __FILE__, __LINE__, "%s %s n_in %lld n_out %lld: out %lld row %lld: %.9g vs %.9g", what,
              quant_type_get(type)->name, (long long)n_in, (long long)n_out, (long long)(i % n_out),
              (long long)(i / n_out), a[i], b[i]);
    return 1;
}

TEST(gemm_kq_x16_same_bits_as_plain) {
    rng r = {8080};
    for (int level = 1; level <= 2; level++) {
        cpu_kernels k;
        const bool have = kx_level(level, &k);
        if (!have)
            continue;
        for (int ti = 0; ti < 2; ti++) {
            for (int ni = 0; ni < 3; ni++) {
                for (int oi = 0; oi < 5; oi++) {
                    for (int ri = 0; ri < 12; ri++) {
                        if (k_kn_in[ni] == 2816 && k_krows[ri] == 130 && oi != 4)
                            continue;
                        const uint32_t type = k_kt[ti];
                        const int64_t n_in = k_kn_in[ni], n_out = k_kn_out[oi], n_rows = k_krows[ri];
                        const bool extreme = (oi + ri) % 7 == 3;
                        void *w = make_kq_weight(&r, type, n_in, n_out, extreme);
                        float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
                        float *y0 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                        float *y1 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                        REQUIRE(w && x && y0 && y1);
                        fill_f32(&r, x, n_in * n_rows, extreme ? 0.0f : 2.0f);
                        if (extreme) {
                            for (int64_t i = 0; i < n_in * n_rows; i++)
                                x[i] = 1.5f; /* every q at -127 or 127 */
                        }
                        cpu_act act;
                        void *mem;
                        mem = prep_act(&k, type, &act, x, n_in, n_rows);
                        const size_t wrow = quant_row_size(type, n_in);
                        if (have) {
                            tensor tp;
                            uint8_t *p = kx_pack(&k, type, w, n_in, n_out, &tp);
                            const char *what =
                                level == 2 ? (extreme ? "avx512 packed vs plain (extreme)" : "avx512 packed vs plain")
                                           : (extreme ? "avx2 packed vs plain (extreme)" : "avx2 packed vs plain");
                            /* rows [a, n_rows) from a = 0, then from a = 1 (a sweep past row 0) */
                            for (int64_t a = 0; a < (n_rows >= 2 ? 2 : 1); a++) {
                                memset(y0, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                                memset(y1, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                                k.matmul[type](w, wrow, &act, a, n_rows - a, y0, n_out, 0, n_out);
                                k.matmul_packed[type](p, tp.nb[1], &act, a, n_rows - a, y1, n_out, 0, n_out);
                                kx_cmp(t, y1, y0, n_out * n_rows, n_out, a == 0 ? what : "packed vs plain, rows from 1",
                                       type, n_in);
                            }
                            if (n_rows <= 5 && ni < 2) {
                                cpu_matmul_q_ref(type, w, wrow, &act, 0, n_rows, y0, n_out, 0, n_out);
                                cpu_matmul_kq_x16_ref(type, tp.layout, p, tp.nb[1], &act, 0, n_rows, y1, n_out, 0, n_out);
                                kx_cmp(t, y1, y0, n_out * n_rows, n_out, "packed ref vs plain ref", type, n_in);
                            }
                            free(p);
                        }
                        free(mem);
                        free(y1);
                        free(y0);
                        free(x);
                        free(w);
                    }
                }
            }
        }
    }
}

/* Output ranges from any group start, any row range: the full call's bits, nothing outside. */
TEST(gemm_kq_x16_batch_invariant) {
    rng r = {99};
    for (int level = 1; level <= 2; level++) {
        cpu_kernels k;
        if (!kx_level(level, &k))
            continue;
        for (int ti = 0; ti < 2; ti++) {
            const uint32_t type = k_kt[ti];
            const int64_t n_in = 768, n_out = 53, n_rows = 70;
            void *w = make_kq_weight(&r, type, n_in, n_out, false);
            float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
            float *y = malloc((size_t)(n_out * n_rows) * sizeof(float));
            float *y2 = malloc((size_t)(n_out * n_rows) * sizeof(float));
            REQUIRE(w && x && y && y2);
            fill_f32(&r, x, n_in * n_rows, 1.0f);
            tensor tp;
            uint8_t *p = kx_pack(&k, type, w, n_in, n_out, &tp);
            cpu_act act;
            void *mem;
            mem = prep_act(&k, type, &act, x, n_in, n_rows);
            k.matmul_packed[type](p, tp.nb[1], &act, 0, n_rows, y, n_out, 0, n_out);
            int bad = 0;
            for (int64_t len = 1; len <= 12 && !bad; len++) {
                const int64_t a = (len * 5) % (n_rows - len), nr = len == 12 ? n_rows - a : len;
                const int64_t c = 16 * (len % 4), dd = len % 3 ? n_out - len % 7 : (c + 16 < n_out ? c + 16 : n_out);
                memset(y2, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                k.matmul_packed[type](p, tp.nb[1], &act, a, nr, y2, n_out, c, dd);
                bad = !range_call_ok(t, quant_type_get(type)->name, y2, y, n_out, n_rows, a, nr, c, dd);
            }
            free(mem);
            free(p);
            free(y2);
            free(y);
            free(x);
            free(w);
        }
    }
}

TEST(gemm_kq_x16_ops_and_validation) {
    rng r = {5};
    const int64_t n_in = 1024, n_out = 203, n_rows = 21;
    float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
    float *y0 = malloc((size_t)(n_out * n_rows) * sizeof(float));
    float *y1 = malloc((size_t)(n_out * n_rows) * sizeof(float));
    REQUIRE(x && y0 && y1);
    fill_f32(&r, x, n_in * n_rows, 1.0f);
    for (int level = 1; level <= 2; level++) {
        if (!level_available(level))
            continue;
        backend *be = make_backend(2, level, false);
        REQUIRE(be != NULL);
        for (int ti = 0; ti < 2; ti++) {
            const uint32_t type = k_kt[ti];
            void *w = make_kq_weight(&r, type, n_in, n_out, false);
            REQUIRE(w != NULL);
            tensor tw = tensor_2d(type, w, n_in, n_out);
            const size_t sz = backend_weight_pack_size(be, &tw);
            REQUIRE(sz > 0);
            uint8_t *p = aligned_alloc(64, sz);
            REQUIRE(p != NULL);
            const tensor tp = backend_weight_pack(be, &tw, p);
            for (int64_t rows = 1; rows <= n_rows; rows += 20) { /* a decode row and a batch */
                CHECK_MSG(mm_ops_same_bits(be, tw, tp, x, rows),
                          "%s: op_matmul / op_matmul_argmax packed vs plain, %lld rows", quant_type_get(type)->name,
                          (long long)rows);
            }
            dfl_error err = {0};
            backend_op m;
            memset(&m, 0, sizeof(m));
            m.kind = BACKEND_OP_MATMUL;
            m.src[1] = tensor_2d(QUANT_TYPE_F32, x, n_in, n_rows);
            m.dst = tensor_2d(QUANT_TYPE_F32, y1, n_out, n_rows);
            m.src[0] = tp;
            CHECK(backend_op_validate(be, &m, &err) == DFL_OK);
            m.src[0].nb[1] += 16;
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            m.src[0] = tp;
            m.src[0].type = QUANT_TYPE_Q8_0;
            error_clear(&err);
            CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
            CHECK_STR_CONTAINS(err.msg, "neither q4_K nor q6_K");
            if (tp.layout == TENSOR_LAYOUT_Q6K_X16V) { /* the values layout is Q6_K's only */
                m.src[0] = tp;
                m.src[0].type = QUANT_TYPE_Q4_K;
                m.src[0].nb[1] = tensor_kq_x16_record_bytes(QUANT_TYPE_Q4_K) * (size_t)(n_in / QK_K) / 16;
                error_clear(&err);
                CHECK(backend_op_validate(be, &m, &err) == DFL_ERR_INVALID);
                CHECK_STR_CONTAINS(err.msg, "is not q6_K");
            }
            free(p);
            free(w);
        }
        backend_free(be);
    }
    free(y1);
    free(y0);
    free(x);
}

/* Q4_K_M: every q4_K and q6_K projection packed, in the layout of this CPU's kernels (Q6_K:
 * Q6K_X16V for AVX2, KQ_X16 for AVX-512) */
static void kx_check_packed(test_ctx *t, dfl_context *c) {
    cpu_kernels k;
    cpu_kernels_select(&k, cpu_features_detect());
    const uint32_t q6 = k.pack_layout[QUANT_TYPE_Q6_K];
    CHECK(q6 == ((cpu_features_detect() & BACKEND_CPU_FEATURE_AVX512_VNNI) && (cpu_features_detect() & BACKEND_CPU_FEATURE_AVX512)
                     ? TENSOR_LAYOUT_KQ_X16
                     : TENSOR_LAYOUT_Q6K_X16V));
    int n_packed = 0;
    for (int il = 0; il < 2; il++) {
        const ctx_layer_w *L = &c->w.layers[il];
        const tensor *ts[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (int i = 0; i < 7; i++) {
            CHECK(ts[i]->type != QUANT_TYPE_Q4_K || ts[i]->layout == TENSOR_LAYOUT_KQ_X16);
            CHECK(ts[i]->type != QUANT_TYPE_Q6_K || ts[i]->layout == q6);
            n_packed += ts[i]->layout != TENSOR_LAYOUT_PLAIN;
        }
    }
    CHECK(n_packed >= 10);
}

TEST(gemm_kq_x16_model_same_logits) {
    if (!level_available(1)) {
        test_skip(t, "no AVX2: nothing packs K-quants");
        return;
    }
    char f16[512], q4[512], cmd[2048], out[4096];
    if (!tu_make_models(t, "m",
                        "--n-embd 512 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 128 --n-ff 1536 "
                        "--n-vocab 700 --type f16",
                        f16, NULL, sizeof(f16))) {
        return;
    }
    test_path(t, "q4km.gguf", q4, sizeof(q4));
    snprintf(cmd, sizeof(cmd), "%s quantize %s %s Q4_K_M 2>&1", test_cli_path(), f16, q4);
    const int rc = test_run(cmd, out, sizeof(out));
    REQUIRE(rc == 0);
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(q4, NULL, &err);
    REQUIRE(m != NULL);
    const int32_t prompt[7] = {9, 400, 12, 699, 3, 3, 250};
    free(tu_pack_ab(t, m, prompt, 7, 10, kx_check_packed));
    dfl_model_free(m);
}

/* The AMX-INT8 Q4_K / Q6_K kernels (cpu_gemm_kquant_amx.c) against the AVX-512 VNNI kernels on the
 * same packed weights, bit for bit: row ranges that start anywhere and hold 5..290 rows (whole
 * tiles, smaller last tiles, calls below AMX_MIN_ROWS for the VNNI kernel, Q6_K calls below
 * AMX_PIPE_ROWS that decode one step ahead and those from it that do not), output ranges from any group, random and extreme
 * blocks (Q4_K scales and mins at 63; Q6_K scales at -128 with every value at 31, and at -32: the
 * largest products, -3968 and 4096, whose hi bytes are -16 and 16), every activation at +-127
 * (the largest tile sums). Needs AMX: skipped without. */
TEST(gemm_kq_x16_amx_same_bits_as_vnni) {
    if (!(cpu_features_detect() & BACKEND_CPU_FEATURE_AMX_INT8) || !level_available(2)) {
        test_skip(t, "no AMX-INT8 (or no AVX-512 VNNI) on this CPU");
        return;
    }
    cpu_kernels k;
    cpu_kernels_select(&k, cpu_features_detect());
    CHECK(k.matmul_packed[QUANT_TYPE_Q4_K] == cpu_mm_q4_K_x16_amx);
    CHECK(k.matmul_packed[QUANT_TYPE_Q6_K] == cpu_mm_q6_K_x16_amx);
    rng r = {77};
    static const int64_t n_ins[3] = {256, 1024, 2816};
    /* r0, nr: whole 16s (in pairs of tile sets and alone), with a last part of 2..4 rows on a
     * smaller tile set (67: after single sets; 290: two sweeps of AMX_RCHUNK 256), 8..15 rows
     * (that smaller set only), 5 rows (the VNNI kernel) */
    static const int64_t rows[12][2] = {{0, 16},  {3, 16}, {5, 35}, {0, 64}, {1, 80}, {0, 67},
                                        {0, 256}, {1, 290}, {7, 20}, {2, 9},  {0, 15}, {4, 5}};
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = ti == 0 ? QUANT_TYPE_Q4_K : QUANT_TYPE_Q6_K;
        cpu_matmul_fn vnni = ti == 0 ? cpu_mm_q4_K_x16_avx512 : cpu_mm_q6_K_x16_avx512;
        cpu_matmul_fn amx = ti == 0 ? cpu_mm_q4_K_x16_amx : cpu_mm_q6_K_x16_amx;
        for (int ni = 0; ni < 3; ni++) {
            for (int e = 0; e < (ti == 0 ? 2 : 3); e++) {
                const int64_t n_in = n_ins[ni], n_out = 45, n_rows = 291;
                void *w = make_kq_weight(&r, type, n_in, n_out, e >= 1);
                if (e == 2) { /* Q6_K: every value -32 (code 0) against the scale -128 */
                    for (int64_t b = 0; b < n_out * (n_in / QK_K); b++) {
                        block_q6_K *blk = (block_q6_K *)w + b;
                        memset(blk->ql, 0, sizeof(blk->ql));
                        memset(blk->qh, 0, sizeof(blk->qh));
                    }
                }
                float *x = malloc((size_t)(n_in * n_rows) * sizeof(float));
                float *y0 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                float *y1 = malloc((size_t)(n_out * n_rows) * sizeof(float));
                REQUIRE(w && x && y0 && y1);
                fill_f32(&r, x, n_in * n_rows, 2.0f);
                if (e >= 1) {
                    for (int64_t i = 0; i < n_in * n_rows; i++) x[i] = (i / 7) % 3 == 0 ? -1.5f : 1.5f;
                }
                cpu_act act;
                void *mem = prep_act(&k, type, &act, x, n_in, n_rows);
                tensor tp;
                uint8_t *p = kx_pack(&k, type, w, n_in, n_out, &tp);
                for (int ri = 0; ri < 12; ri++) {
                    for (int oi = 0; oi < 2; oi++) {
                        const int64_t r0 = rows[ri][0], nr = rows[ri][1], o0 = oi == 0 ? 0 : 16;
                        memset(y0, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                        memset(y1, 0xff, (size_t)(n_out * n_rows) * sizeof(float));
                        vnni(p, tp.nb[1], &act, r0, nr, y0, n_out, o0, n_out);
                        amx(p, tp.nb[1], &act, r0, nr, y1, n_out, o0, n_out);
                        /* every element, the untouched (0xff) ones included */
                        kx_cmp(t, y1, y0, n_out * n_rows, n_out, e ? "amx vs vnni (extreme)" : "amx vs vnni", type, n_in);
                    }
                }
                free(p);
                free(mem);
                free(y1);
                free(y0);
                free(x);
                free(w);
            }
        }
    }
}
