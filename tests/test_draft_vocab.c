/* test_draft_vocab.c: the reduced draft vocabulary (dfl_context_params.n_draft_vocab,
 * docs/drafter.md "Reduced draft vocabulary"): on the same injected context, a drafter with the
 * vocabulary H drafts the whole head's token wherever that token is in H and a token of H
 * elsewhere; its logits are the whole head's on H (same bits) and -inf off H, also spread over
 * several sequences of different draft lengths; plain, packed Q8_0 and packed Q4_K_M (Q6_K head)
 * weights; the speculative output stays the target's own greedy output; a DFlash2 drafter's
 * selector takes its candidates from the vocabulary (the whole head's lattice when every candidate
 * is in it, else the top-k over it of the same logits) and a DSpark drafter's Markov chain runs
 * over it (the whole head's drafts, biased logits and confidences when every draft is in it, else
 * a first draft that is the argmax over it of the same biased row); bad id lists, a target context
 * and a DFlash2 vocabulary smaller than its top-k are refused with a message; the CLI's
 * --draft-vocab options and `dflash tokenize --freq`. */
#include "test.h"
#include "test_util.h"
#include "speculative/session.h"
#include "speculative/drafter_dflash2.h"
#include "model/context.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DV_NV 640
#define DV_K 7

static bool in_set(const int32_t *h, int32_t n, int32_t v) {
    for (int32_t i = 0; i < n; i++) {
        if (h[i] == v) return true;
    }
    return false;
}

static bool open_pair(test_ctx *t, tu_pair *p, const char *tp, const char *dp, int n_seq, const int32_t *hot, int32_t n_hot,
                      bool ref) {
    spec_params sp = spec_default_params();
    sp.n_draft = DV_K;
    const tu_pair_params pp = {.n_seq = n_seq, .n_batch = 64, .drafter_n_batch = 32, .ref_ctx = ref, .sp = &sp,
                               .n_draft_vocab = n_hot, .draft_vocab = hot};
    return tu_pair_open(t, p, tp, dp, &pp);
}

/* Drafts of sequences 0 and 1 (prompts of 11 and 6 tokens; lens 5 and 7) with their logits. */
static bool draft_two(test_ctx *t, tu_pair *p, int32_t draft[2 * DV_K], float *logits) {
    int32_t pa[11], pb[6], first[2];
    for (int i = 0; i < 11; i++) pa[i] = (int32_t)((i * 37 + 5) % DV_NV);
    for (int i = 0; i < 6; i++) pb[i] = (int32_t)((i * 101 + 9) % DV_NV);
    dfl_error err = {0};
    bool ok = spec_prefill(p->spec, 0, pa, 11, &first[0], &err) == DFL_OK &&
              spec_prefill(p->spec, 1, pb, 6, &first[1], &err) == DFL_OK;
    const int32_t lens[2] = {5, DV_K}, seqs[2] = {0, 1};
    ok = ok && drafter_draft(p->dctx, 2, seqs, first, DV_K, lens, draft, logits, &err) == DFL_OK;
    if (!ok) test_fail(t, __FILE__, __LINE__, "draft: %s", err.msg);
    return ok;
}

/* The speculative output with a vocabulary of 40 ids is the target's greedy output (24 tokens). */
static void dv_lossless(test_ctx *t, const char *tp, const char *dp, const char *what) {
    tu_pair g;
    memset(&g, 0, sizeof(g));
    bool ok = true;
    int32_t small[40];
    for (int i = 0; i < 40; i++) small[i] = (int32_t)((i * 53 + 11) % DV_NV);
    if (open_pair(t, &g, tp, dp, 1, small, 40, true)) {
        int32_t prompt[9], ref[64], got[64], first, step[DV_K + 1], n_step, seq = 0;
        for (int i = 0; i < 9; i++) prompt[i] = (int32_t)((i * 29 + 3) % DV_NV);
        dfl_error err = {0};
        ok = tu_greedy(g.rctx, 0, prompt, 9, 40, ref, &err) == DFL_OK && spec_prefill(g.spec, 0, prompt, 9, &first, &err) == DFL_OK;
        int n = 0;
        if (ok) got[n++] = first;
        while (ok && n < 24) {
            ok = spec_step(g.spec, 1, &seq, step, &n_step, &err) == DFL_OK;
            for (int j = 0; ok && j < n_step && n < 64; j++) got[n++] = step[j];
        }
        CHECK_MSG(ok, "%s: speculative run: %s", what, err.msg);
        for (int i = 0; ok && i < 24; i++) {
            CHECK_MSG(got[i] == ref[i], "%s: token %d: %d with the reduced vocabulary, %d greedy", what, i, got[i], ref[i]);
            if (got[i] != ref[i]) break;
        }
    }
    tu_pair_close(&g);
}

/* One weight type: the whole head's drafts, then H = every third id plus half of those drafts. */
static void draft_vocab_case(test_ctx *t, const char *tp, const char *dp, const char *what) {
    tu_pair full, hot;
    memset(&full, 0, sizeof(full));
    memset(&hot, 0, sizeof(hot));
    const size_t nl = (size_t)2 * DV_K * DV_NV;
    float *lf = malloc(nl * sizeof(float)), *lh = malloc(nl * sizeof(float));
    int32_t df[2 * DV_K], dh[2 * DV_K], H[DV_NV];
    int32_t nh = 0;
    bool ok = lf != NULL && lh != NULL && open_pair(t, &full, tp, dp, 2, NULL, 0, false) && draft_two(t, &full, df, lf);
    tu_pair_close(&full);
    const int32_t lens[2] = {5, DV_K};
    /* two vocabularies, so that both cases occur even when every draft is one token: pass 0,
     * ids = 1 mod 3 plus sequence 0's drafts; pass 1, ids = 1 mod 3 without any draft; listed in
     * descending order */
    int n_same = 0, n_off = 0;
    for (int pass = 0; pass < 2 && ok; pass++) {
        nh = 0;
        for (int32_t v = DV_NV - 1; v >= 0; v--) {
            bool in0 = false, in1 = false;
            for (int j = 0; j < lens[0]; j++) in0 = in0 || df[j] == v;
            for (int j = 0; j < lens[1]; j++) in1 = in1 || df[DV_K + j] == v;
            if (pass == 0 ? in0 || (v % 3 == 1 && !in1) : v % 3 == 1 && !in0 && !in1) H[nh++] = v;
        }
        ok = open_pair(t, &hot, tp, dp, 2, H, nh, false) && draft_two(t, &hot, dh, lh);
        tu_pair_close(&hot);
        /* without logits: the fused matmul + argmax of greedy drafting gives the same drafts */
        int32_t dg[2 * DV_K];
        ok = ok && open_pair(t, &hot, tp, dp, 2, H, nh, false) && draft_two(t, &hot, dg, NULL);
        for (int s = 0; s < 2 && ok; s++) {
            for (int j = 0; j < lens[s]; j++) {
                CHECK_MSG(dg[s * DV_K + j] == dh[s * DV_K + j], "%s: seq %d slot %d: greedy draft %d, %d with logits",
                          what, s, j, dg[s * DV_K + j], dh[s * DV_K + j]);
            }
        }
        for (int s = 0; s < 2 && ok; s++) {
            for (int j = 0; j < lens[s] && ok; j++) {
                const int32_t f = df[s * DV_K + j], h = dh[s * DV_K + j];
                if (in_set(H, nh, f)) {
                    n_same++;
                    CHECK_MSG(h == f, "%s: seq %d slot %d: draft %d, the whole head's %d is in the vocabulary", what, s, j, h, f);
                } else {
                    n_off++;
                    CHECK_MSG(in_set(H, nh, h), "%s: seq %d slot %d: draft %d is outside the vocabulary", what, s, j, h);
                }
                const float *rf = lf + ((size_t)s * DV_K + (size_t)j) * DV_NV;
                const float *rh = lh + ((size_t)s * DV_K + (size_t)j) * DV_NV;
                for (int32_t v = 0; v < DV_NV && ok; v++) {
                    const bool in = in_set(H, nh, v);
                    if (in ? memcmp(&rf[v], &rh[v], sizeof(float)) != 0 : !(isinf(rh[v]) && rh[v] < 0)) {
                        test_fail(t, __FILE__, __LINE__, "%s: seq %d slot %d token %d (%s the vocabulary): logit %g, the "
                                  "whole head's %g", what, s, j, v, in ? "in" : "outside", rh[v], rf[v]);
                        ok = false;
                    }
                }
            }
        }
        tu_pair_close(&hot);
    }
    CHECK_MSG(!ok || (n_same > 0 && n_off > 0), "%s: %d slots in and %d outside the vocabulary (both expected)", what,
              n_same, n_off);
    /* the output stays the target's: 24 greedy tokens with a vocabulary of 40 ids */
    if (ok) dv_lossless(t, tp, dp, what);
    free(lf);
    free(lh);
}

#define DV_T "--n-vocab 640 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --draft-layers 1 --block-size 8"

TEST(draft_vocab_drafts_logits_and_output) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "f32", DV_T " --n-embd 64 --type f32", tp, dp, sizeof(tp))) return;
    draft_vocab_case(t, tp, dp, "f32");
    /* n_embd 512: the Q8_0 head is packed (TENSOR_LAYOUT_Q8_0_X16), H's rows too */
    if (!tu_make_models(t, "q8", DV_T " --n-embd 512 --type q8_0", tp, dp, sizeof(tp))) return;
    draft_vocab_case(t, tp, dp, "q8_0 packed");
    /* Q4_K_M: the tied head is Q6_K (packed by AVX2 / AVX-512 CPUs: records of 16 rows, H has a
     * partial last record) */
    if (!tu_make_models(t, "f16", DV_T " --n-embd 256 --type f16", tp, dp, sizeof(tp))) return;
    char q[600], cmd[2048], out[4096];
    snprintf(q, sizeof(q), "%s.q4km.gguf", tp);
    snprintf(cmd, sizeof(cmd), "%s quantize %s %s Q4_K_M", test_cli_path(), tp, q);
    if (test_run(cmd, out, sizeof(out)) != 0) {
        test_fail(t, __FILE__, __LINE__, "quantize: %s", out);
        return;
    }
    draft_vocab_case(t, q, dp, "Q4_K_M (Q6_K head)");
}

/* DFlash2 (the selector's top-k candidates per row, then the lattice walk): with every candidate of
 * the whole head's lattice in H the drafts, the lattice and the walk probabilities are the whole
 * head's, bit for bit; with some candidates left out, each row's candidates are the top-k over H
 * of the whole head's logits and every draft is in H; logits are the whole head's on H and -inf
 * off it; the output stays the target's; fewer ids than the top-k are refused. */
TEST(draft_vocab_dflash2) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "d2", DV_T " --n-embd 64 --type f32 --seed 8 --dflash2 3,8,16,4", tp, dp, sizeof(tp))) return;
    const size_t nl = (size_t)2 * DV_K * DV_NV;
    const int32_t lens[2] = {5, DV_K};
    const int64_t n_rows = lens[0] + lens[1];
    float *lf = malloc(nl * sizeof(float)), *lh = malloc(nl * sizeof(float)), *lat_f = NULL, *pr_f = NULL;
    int32_t df[2 * DV_K], dh[2 * DV_K], H[DV_NV];
    REQUIRE(lf != NULL && lh != NULL);
    tu_pair p;
    memset(&p, 0, sizeof(p));
    int64_t rl = 0, k = 0;
    bool ok = open_pair(t, &p, tp, dp, 2, NULL, 0, false) && draft_two(t, &p, df, lf);
    if (ok) {
        const float *lat = dflash2_last_lattice(p.dctx, &rl), *pr = dflash2_last_probs(p.dctx);
        REQUIRE(lat != NULL && pr != NULL);
        k = dflash2_top_k_count(drafter_dflash2(p.dctx));
        lat_f = malloc((size_t)(n_rows * rl) * sizeof(float));
        pr_f = malloc((size_t)(2 * DV_K) * sizeof(float));
        REQUIRE(lat_f != NULL && pr_f != NULL && rl == k + k * k);
        memcpy(lat_f, lat, (size_t)(n_rows * rl) * sizeof(float));
        memcpy(pr_f, pr, (size_t)(2 * DV_K) * sizeof(float));
    }
    tu_pair_close(&p);
    for (int pass = 0; pass < 2 && ok; pass++) {
        /* pass 0: every candidate of every row, plus ids = 2 mod 5; pass 1: ids = 1 mod 3 without
         * each row's first candidate */
        bool in[DV_NV];
        for (int32_t v = 0; v < DV_NV; v++) in[v] = pass == 0 ? v % 5 == 2 : v % 3 == 1;
        for (int64_t r = 0; r < n_rows; r++) {
            for (int64_t s = 0; s < (pass == 0 ? k : 1); s++) in[(int32_t)lat_f[r * rl + s]] = pass == 0;
        }
        int32_t nh = 0;
        for (int32_t v = DV_NV - 1; v >= 0; v--) {
            if (in[v]) H[nh++] = v;
        }
        ok = open_pair(t, &p, tp, dp, 2, H, nh, false) && draft_two(t, &p, dh, lh);
        const float *lat = ok ? dflash2_last_lattice(p.dctx, NULL) : NULL, *pr = ok ? dflash2_last_probs(p.dctx) : NULL;
        ok = ok && lat != NULL && pr != NULL;
        int64_t r = 0;
        for (int sq = 0; sq < 2 && ok; sq++) {
            for (int j = 0; j < lens[sq] && ok; j++, r++) {
                const size_t slot = (size_t)sq * DV_K + (size_t)j;
                const float *rf = lf + slot * DV_NV, *rh = lh + slot * DV_NV;
                for (int32_t v = 0; v < DV_NV && ok; v++) {
                    if (in[v] ? memcmp(&rf[v], &rh[v], sizeof(float)) != 0 : !(isinf(rh[v]) && rh[v] < 0)) {
                        test_fail(t, __FILE__, __LINE__, "pass %d: seq %d slot %d token %d: logit %g, the whole head's %g",
                                  pass, sq, j, v, rh[v], rf[v]);
                        ok = false;
                    }
                }
                CHECK_MSG(in[dh[slot]], "pass %d: seq %d slot %d: draft %d is outside the vocabulary", pass, sq, j, dh[slot]);
                if (pass == 0) {
                    CHECK_MSG(dh[slot] == df[slot], "pass 0: seq %d slot %d: draft %d, the whole head's %d", sq, j, dh[slot], df[slot]);
                    CHECK_MSG(memcmp(&pr[slot], &pr_f[slot], sizeof(float)) == 0, "pass 0: seq %d slot %d: walk probability "
                              "%g, the whole head's %g", sq, j, pr[slot], pr_f[slot]);
                    CHECK_MSG(memcmp(lat + r * rl, lat_f + r * rl, (size_t)rl * sizeof(float)) == 0,
                              "pass 0: lattice row %lld differs from the whole head's", (long long)r);
                    continue;
                }
                /* the candidates: the top-k over H of the whole head's row */
                float masked[DV_NV];
                for (int32_t v = 0; v < DV_NV; v++) masked[v] = in[v] ? rf[v] : -INFINITY;
                int32_t want[64];
                dflash2_top_k(masked, DV_NV, k, want);
                for (int64_t s = 0; s < k; s++) {
                    CHECK_MSG((int32_t)lat[r * rl + s] == want[s], "pass 1: row %lld candidate %lld: %d, the top-k over the "
                              "vocabulary has %d", (long long)r, (long long)s, (int)lat[r * rl + s], want[s]);
                }
            }
        }
        tu_pair_close(&p);
    }
    if (ok) dv_lossless(t, tp, dp, "dflash2");
    /* fewer ids than the selector's top-k */
    dfl_error err = {0};
    dfl_model *tm = dfl_model_load(tp, NULL, &err), *dm = tm != NULL ? dfl_model_load(dp, NULL, &err) : NULL;
    REQUIRE(dm != NULL);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 64;
    cp.n_capture = (int32_t)dfl_model_hparams(dm)->n_target_layers;
    cp.capture_layers = dfl_model_hparams(dm)->target_layers;
    dfl_context *tc = dfl_context_new(tm, &cp, &err);
    REQUIRE(tc != NULL);
    int32_t few[64];
    for (int i = 0; i < 64; i++) few[i] = 1 + 3 * i;
    REQUIRE(k >= 2 && k <= 64);
    dfl_context_params dpar = dfl_context_default_params();
    dpar.target = tc;
    dpar.n_draft_vocab = (int32_t)k - 1;
    dpar.draft_vocab = few;
    dfl_context *dc = dfl_context_new(dm, &dpar, &err);
    CHECK(dc == NULL);
    dfl_context_free(dc);
    CHECK_STR_CONTAINS(err.msg, "a DFlash2 selector takes its top-k of them");
    dpar.n_draft_vocab = (int32_t)k;
    dc = dfl_context_new(dm, &dpar, &err);
    CHECK_MSG(dc != NULL, "a vocabulary of the top-k's %lld ids: %s", (long long)k, err.msg);
    dfl_context_free(dc);
    dfl_context_free(tc);
    dfl_model_free(dm);
    dfl_model_free(tm);
    free(lat_f);
    free(pr_f);
    free(lf);
    free(lh);
}

/* DSpark (the Markov bias chained over the rows; the confidence head): pass 0, H = every draft of
 * the whole head plus ids = 2 mod 5: the same drafts, biased logits (same bits on H, -inf off it)
 * and confidences; pass 1, H = ids = 1 mod 3 without the first row's drafts: each sequence's first
 * draft is the argmax over H of the whole head's first biased row (its bias comes from the anchor
 * alone), that row's logits are the same on H, and every draft is in H; the output stays the
 * target's. */
TEST(draft_vocab_dspark) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "dsp", DV_T " --n-embd 64 --type f32 --dspark-rank 8", tp, dp, sizeof(tp))) return;
    const size_t nl = (size_t)2 * DV_K * DV_NV;
    const int32_t lens[2] = {5, DV_K};
    float *lf = malloc(nl * sizeof(float)), *lh = malloc(nl * sizeof(float)), cf[2 * DV_K];
    int32_t df[2 * DV_K], dh[2 * DV_K], H[DV_NV];
    REQUIRE(lf != NULL && lh != NULL);
    tu_pair p;
    memset(&p, 0, sizeof(p));
    bool ok = open_pair(t, &p, tp, dp, 2, NULL, 0, false) && draft_two(t, &p, df, lf);
    const float *c = ok ? drafter_confidence(p.dctx) : NULL;
    ok = ok && c != NULL;
    CHECK_MSG(c != NULL || !ok, "no DSpark confidences");
    if (ok) memcpy(cf, c, sizeof(cf));
    tu_pair_close(&p);
    for (int pass = 0; pass < 2 && ok; pass++) {
        bool in[DV_NV];
        for (int32_t v = 0; v < DV_NV; v++) in[v] = pass == 0 ? v % 5 == 2 : v % 3 == 1;
        for (int sq = 0; sq < 2; sq++) {
            for (int j = 0; j < (pass == 0 ? lens[sq] : 1); j++) in[df[sq * DV_K + j]] = pass == 0;
        }
        int32_t nh = 0;
        for (int32_t v = 0; v < DV_NV; v++) {
            if (in[v]) H[nh++] = v;
        }
        ok = open_pair(t, &p, tp, dp, 2, H, nh, false) && draft_two(t, &p, dh, lh);
        const float *ch = ok ? drafter_confidence(p.dctx) : NULL;
        ok = ok && ch != NULL;
        for (int sq = 0; sq < 2 && ok; sq++) {
            for (int j = 0; j < lens[sq] && ok; j++) {
                const size_t slot = (size_t)sq * DV_K + (size_t)j;
                const float *rf = lf + slot * DV_NV, *rh = lh + slot * DV_NV;
                CHECK_MSG(in[dh[slot]], "pass %d: seq %d slot %d: draft %d is outside the vocabulary", pass, sq, j, dh[slot]);
                for (int32_t v = 0; v < DV_NV && ok && (pass == 0 || j == 0); v++) {
                    if (in[v] ? memcmp(&rf[v], &rh[v], sizeof(float)) != 0 : !(isinf(rh[v]) && rh[v] < 0)) {
                        test_fail(t, __FILE__, __LINE__, "pass %d: seq %d slot %d token %d: biased logit %g, the whole "
                                  "head's %g", pass, sq, j, v, rh[v], rf[v]);
                        ok = false;
                    }
                }
                if (pass == 0) {
                    CHECK_MSG(dh[slot] == df[slot], "pass 0: seq %d slot %d: draft %d, the whole head's %d", sq, j, dh[slot], df[slot]);
                    CHECK_MSG(memcmp(&ch[slot], &cf[slot], sizeof(float)) == 0, "pass 0: seq %d slot %d: confidence %g, "
                              "the whole head's %g", sq, j, ch[slot], cf[slot]);
                } else if (j == 0) {
                    int32_t best = -1;
                    for (int32_t v = 0; v < DV_NV; v++) {
                        if (in[v] && (best < 0 || rf[v] > rf[best])) best = v;
                    }
                    CHECK_MSG(dh[slot] == best, "pass 1: seq %d: first draft %d, the argmax over the vocabulary is %d", sq,
                              dh[slot], best);
                }
            }
        }
        tu_pair_close(&p);
    }
    if (ok) dv_lossless(t, tp, dp, "dspark");
    free(lf);
    free(lh);
}

TEST(draft_vocab_refuses_bad_lists) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", DV_T " --n-embd 64 --type f32", tp, dp, sizeof(tp))) return;
    dfl_error err = {0};
    dfl_model *tm = dfl_model_load(tp, NULL, &err), *dm = dfl_model_load(dp, NULL, &err);
    REQUIRE(tm != NULL && dm != NULL);
    const dfl_hparams *dh = dfl_model_hparams(dm);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 64;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    int32_t ids[4] = {3, 9, 3, 1};
    cp.n_draft_vocab = 2;
    cp.draft_vocab = ids;
    CHECK(dfl_context_new(tm, &cp, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "for drafter contexts only");
    cp.n_draft_vocab = 0;
    cp.draft_vocab = NULL;
    dfl_context *tc = dfl_context_new(tm, &cp, &err);
    REQUIRE(tc != NULL);
    struct { int32_t n; int32_t ids[4]; const char *msg; } bad[] = {
        {4, {3, 9, 3, 1}, "token 3 is listed twice"},
        {3, {3, 640, 1}, "entry 1, token 640, is outside the vocabulary"},
        {2, {-2, 5}, "entry 0, token -2"},
        {-1, {0}, "-1 ids"},
        {641, {0}, "641 ids"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dfl_context_params dpar = dfl_context_default_params();
        dpar.target = tc;
        dpar.n_draft_vocab = bad[i].n;
        dpar.draft_vocab = bad[i].ids;
        err.code = DFL_OK;
        err.msg[0] = '\0';
        dfl_context *dc = dfl_context_new(dm, &dpar, &err);
        CHECK_MSG(dc == NULL, "case %zu accepted", i);
        dfl_context_free(dc);
        CHECK_STR_CONTAINS(err.msg, bad[i].msg);
    }
    dfl_context_params dpar = dfl_context_default_params();
    dpar.target = tc;
    dpar.n_draft_vocab = 2;
    dpar.draft_vocab = NULL;
    CHECK(dfl_context_new(dm, &dpar, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "no id list");
    dfl_context_free(tc);
    dfl_model_free(tm);
    dfl_model_free(dm);
}

/* The "tokens":[...] array of a --json line (empty when missing). */
static void json_tokens(const char *out, char *dst, size_t cap) {
    const char *a = strstr(out, "\"tokens\":[");
    const char *b = a != NULL ? strchr(a, ']') : NULL;
    const size_t n = b != NULL ? (size_t)(b - a) : 0;
    snprintf(dst, cap, "%.*s", (int)(n < cap ? n : cap - 1), a != NULL ? a : "");
}

/* The CLI on the embedded pair: --draft-vocab N and a file give the tokens of --no-spec; bad
 * values and files are refused with a message. */
TEST(draft_vocab_cli) {
    char out[65536], cmd[2048], ref[8192], got[8192], path[512];
    const char *p = "-p 'def main():' -n 40 -t 1 --json";
    snprintf(cmd, sizeof(cmd), "%s generate %s --no-spec 2>/dev/null", test_cli_path(), p);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    json_tokens(out, ref, sizeof(ref));
    CHECK(strlen(ref) > 20);
    snprintf(cmd, sizeof(cmd), "%s generate %s --draft-vocab 300 2>/dev/null", test_cli_path(), p);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    json_tokens(out, got, sizeof(got));
    CHECK_MSG(strcmp(got, ref) == 0, "tokens differ from --no-spec:\n%s\n---\n%s", got, ref);
    test_path(t, "ids.txt", path, sizeof(path));
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fprintf(f, "# ids, commonest first\n");
    for (int i = 4095; i >= 0; i -= 2) fprintf(f, "%d%s", i, i % 20 == 1 ? "\n" : ", ");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s generate %s --draft-vocab-file %s --draft-vocab 1000 2>/dev/null", test_cli_path(), p, path);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    json_tokens(out, got, sizeof(got));
    CHECK_MSG(strcmp(got, ref) == 0, "tokens differ from --no-spec:\n%s\n---\n%s", got, ref);
    /* refused with a message: bad values, a bad file, an empty list, a missing file */
    struct { const char *file_text, *args, *msg; } bad[] = {
        {NULL, "--draft-vocab 0", "invalid value '0' for --draft-vocab"},
        {NULL, "--draft-vocab 5000", "outside 1..4096"},
        {"12 13\n14 x7\n", "--draft-vocab-file", "line 2: 'x7"},
        {"# nothing\n", "--draft-vocab-file", "holds no token ids"},
        {NULL, "--draft-vocab-file /nonexistent/ids.txt", "/nonexistent/ids.txt"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (bad[i].file_text != NULL) {
            f = fopen(path, "w");
            REQUIRE(f != NULL);
            fputs(bad[i].file_text, f);
            fclose(f);
        }
        snprintf(cmd, sizeof(cmd), "%s generate %s %s %s 2>&1", test_cli_path(), p, bad[i].args,
                 bad[i].file_text != NULL ? path : "");
        CHECK_MSG(test_run(cmd, out, sizeof(out)) != 0, "accepted: %s", bad[i].args);
        CHECK_STR_CONTAINS(out, bad[i].msg);
    }
}

/* dflash tokenize --freq: a comment line, then every id that occurs once, counts descending (ties:
 * ids ascending), counts summing to the token count; readable back as a --draft-vocab-file. */
TEST(draft_vocab_tokenize_freq) {
    char cmd[2048], out[65536], ids[65536];
    const char *text = "And God said, Let there be light: and there was light. And God saw the light, that it was good";
    snprintf(cmd, sizeof(cmd), "%s tokenize -m %s/target.gguf -p '%s' --ids", test_cli_path(), DFLASH_MODEL_DIR, text);
    REQUIRE(test_run(cmd, ids, sizeof(ids)) == 0);
    snprintf(cmd, sizeof(cmd), "%s tokenize -m %s/target.gguf -p '%s' --freq", test_cli_path(), DFLASH_MODEL_DIR, text);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    REQUIRE(out[0] == '#');
    int64_t n_tok = 0, counts[4096];
    memset(counts, 0, sizeof(counts));
    for (const char *q = ids + 1; *q != '\0' && *q != ']';) { /* [1, 2, 3] */
        char *e;
        const long v = strtol(q, &e, 10);
        if (e == q) break;
        REQUIRE(v >= 0 && v < 4096);
        counts[v]++;
        n_tok++;
        q = e;
        while (*q == ',' || *q == ' ') q++;
    }
    REQUIRE(n_tok > 5);
    int64_t sum = 0, prev_n = INT64_MAX, prev_id = -1, n_lines = 0;
    for (const char *q = strchr(out, '\n') + 1; *q != '\0'; q = strchr(q, '\n') + 1) {
        long id = -1, c = -1;
        REQUIRE(sscanf(q, "%ld  # %ld", &id, &c) == 2);
        REQUIRE(id >= 0 && id < 4096);
        CHECK_MSG(counts[id] == c, "id %ld: count %ld, the text has %lld", id, c, (long long)counts[id]);
        CHECK_MSG(c < prev_n || (c == prev_n && id > prev_id), "id %ld (count %ld) after id %lld (count %lld)", id, c,
                  (long long)prev_id, (long long)prev_n);
        prev_n = c;
        prev_id = id;
        sum += c;
        n_lines++;
        if (strchr(q, '\n') == NULL) break;
    }
    CHECK_EQ_INT(sum, n_tok);
    int64_t distinct = 0;
    for (int i = 0; i < 4096; i++) distinct += counts[i] > 0;
    CHECK_EQ_INT(n_lines, distinct);
}
