/* test_dspark.c: DSpark drafters and the drafter options (docs/drafter.md, "DSpark" and "Drafter
 * options"): random-weight files in the converter's layout (dflash make-test-model) against the
 * float64 numpy references (tests/ref/dspark_np.py, tests/ref/ref_cli.py draft): biased block
 * logits, drafted tokens and confidences, with several sequences of different draft lengths in
 * one pass; each option (causal, sliding window, logit scale + softcap, embedding scale) against
 * the reference; the lossless matrix (greedy through the engine, bit-identical to the target
 * alone, with the confidence cut on and off); sampled output with the target's distribution
 * (two-sample chi-square); and bad files refused with a message naming the problem. */
#include "test.h"
#include "test_util.h"
#include "gguf/gguf.h"
#include "model/context.h"
#include "quant/quant.h"
#include "speculative/session.h"
#ifdef DFL_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NV 640
#define REQUIRE_MSG(cond, ...) \
    do { if (!(cond)) { test_fail(t, __FILE__, __LINE__, __VA_ARGS__); return; } } while (0)
#define TINY "--n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 --draft-layers 2"

typedef tu_pair dpair;

static void dpair_close(dpair *p) { tu_pair_close(p); }

static bool dpair_open_on(test_ctx *t, dpair *p, const char *tp, const char *dp, int n_seq, const spec_params *sp0,
                          dfl_device device) {
    const tu_pair_params pp = {.n_seq = n_seq, .n_batch = 128, .kv_f32 = true, .device = device, .sp = sp0};
    return tu_pair_open(t, p, tp, dp, &pp);
}

static bool dpair_open(test_ctx *t, dpair *p, const char *tp, const char *dp, int n_seq, const spec_params *sp0) {
    return dpair_open_on(t, p, tp, dp, n_seq, sp0, DFL_DEVICE_CPU);
}

static void make_prompt(int32_t *p, int len, int salt) {
    for (int i = 0; i < len; i++) p[i] = (int32_t)((i * 71 + salt * 37 + 2) % NV);
}

/* Pulls the numbers of a JSON array "key":[...] (null -> 0 values). */
static int json_numbers(const char *json, const char *key, double *out, int cap) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":[", key);
    const char *p = strstr(json, pat);
    if (p == NULL) return -1;
    p += strlen(pat);
    int n = 0;
    while (*p && *p != ']' && n < cap) {
        char *end;
        out[n++] = strtod(p, &end);
        if (end == p) return -1;
        p = end;
        if (*p == ',') p++;
    }
    return n;
}

/* One DSpark file: n_seq sequences with their own prompts and draft lengths in ONE drafter pass
 * against the reference of each alone: biased logits, tokens, confidences. */
static void dspark_case(test_ctx *t, const char *dir, const char *args, int n_seq, const int32_t *lens, dfl_device dev) {
    char tp[512], dp[512];
    if (!tu_make_models(t, dir, args, tp, dp, sizeof(tp))) return;
    dpair p;
    if (!dpair_open_on(t, &p, tp, dp, n_seq, NULL, dev)) {
        dpair_close(&p);
        return;
    }
    const dfl_hparams *dh = dfl_model_hparams(p.drafter);
    dfl_error err = {0};
    int32_t prompts[4][32], first[4], seqs[4], k = 0;
    for (int i = 0; i < n_seq; i++) {
        make_prompt(prompts[i], 9 + 4 * i, i);
        REQUIRE(spec_prefill(p.spec, i, prompts[i], 9 + 4 * i, &first[i], &err) == DFL_OK);
        seqs[i] = i;
        k = lens[i] > k ? lens[i] : k;
    }
    int32_t *out = calloc((size_t)n_seq * (size_t)k, sizeof(int32_t));
    float *logits = calloc((size_t)n_seq * (size_t)k * NV, sizeof(float));
    REQUIRE(out && logits);
    CHECK(drafter_draft(p.dctx, n_seq, seqs, first, k, lens, out, logits, &err) == DFL_OK);
    const float *conf = drafter_confidence(p.dctx);
    CHECK((conf != NULL) == dh->dspark_confidence);
    for (int i = 0; i < n_seq; i++) {
        char csv[256], cmd[2048], ref_path[512], json[8192], name[32];
        tu_ids_csv(prompts[i], 9 + 4 * i, csv, sizeof(csv));
        snprintf(name, sizeof(name), "%s_%d.bin", dir, i);
        test_path(t, name, ref_path, sizeof(ref_path));
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 tests/ref/dspark_np.py draft --target %s --drafter %s --tokens %s "
                 "--k %d --last %d --out %s", tp, dp, csv, lens[i], first[i], ref_path);
        if (test_run(cmd, json, sizeof(json)) != 0) {
            test_fail(t, __FILE__, __LINE__, "dspark_np failed: %.300s", json);
            break;
        }
        int64_t n_ref = 0;
        float *ref = tu_read_floats(ref_path, &n_ref);
        REQUIRE(ref != NULL && n_ref == (int64_t)lens[i] * NV);
        double toks[64], rconf[64];
        const int n_t = json_numbers(json, "draft_tokens", toks, 64);
        const int n_c = json_numbers(json, "conf", rconf, 64);
        CHECK_EQ_INT(n_t, lens[i]);
        const float *row = logits + (size_t)i * (size_t)k * NV;
        const double e = tu_rel_err(row, ref, (int64_t)lens[i] * NV);
        double ce = 0.0;
        for (int j = 0; j < lens[i] && j < n_t; j++) {
            CHECK_MSG(out[i * k + j] == (int32_t)toks[j], "%s seq %d draft %d: %d, reference %d", dir, i, j, out[i * k + j],
                      (int32_t)toks[j]);
            if (conf != NULL && n_c == lens[i]) ce = fmax(ce, fabs((double)conf[i * k + j] - rconf[j]));
        }
        if (conf != NULL) CHECK_EQ_INT(n_c, lens[i]);
        printf("    %s seq %d (%d drafts): biased logits max rel err %.3g, confidence max abs err %.3g%s\n", dir, i,
               lens[i], e, ce, conf ? "" : " (no confidence head)");
        /* f32 weights: 1e-4 on the CPU; the GPU's f32 matmuls round differently (as in test_backend_cuda.c) */
        const double tol = dev == DFL_DEVICE_CUDA ? 1e-3 : 1e-4;
        CHECK_MSG(e < tol, "%s: logits relative error %.3g", dir, e);
        CHECK_MSG(ce < tol, "%s: confidence error %.3g", dir, ce);
        free(ref);
    }
    free(out);
    free(logits);
    dpair_close(&p);
}

TEST(dspark_drafts_vs_numpy) {
    if (!tu_have_numpy(t)) return;
    /* anchor-first, the whole block drafted; three sequences of different lengths in one pass */
    dspark_case(t, "anchor", TINY " --block-size 8 --dspark-rank 16 --seed 3", 1, (const int32_t[]){8}, DFL_DEVICE_CPU);
    dspark_case(t, "anchor3", TINY " --block-size 8 --dspark-rank 16 --seed 4", 3, (const int32_t[]){3, 8, 5}, DFL_DEVICE_CPU);
    /* bonus anchor (slot 0 not a draft row), markov_w2.scale */
    dspark_case(t, "bonus", TINY " --block-size 8 --dspark-rank 16 --bonus-anchor --markov-scale 0.7 --seed 5", 2,
                (const int32_t[]){7, 2}, DFL_DEVICE_CPU);
    /* no confidence head; logit scale and softcap act on the biased rows */
    dspark_case(t, "noconf", TINY " --block-size 6 --dspark-rank 32 --no-confidence --logit-scale 1.5 --softcap 3 --seed 6",
                1, (const int32_t[]){6}, DFL_DEVICE_CPU);
    /* with the block options: causal, sliding window, embedding scale */
    dspark_case(t, "opts", TINY " --block-size 8 --dspark-rank 16 --causal --swa 4 --embedding-scale 2 --seed 7", 2,
                (const int32_t[]){5, 8}, DFL_DEVICE_CPU);
}

/* The same on the CUDA backend (the chain is composed of existing ops; skipped without a device). */
TEST(dspark_cuda_vs_numpy) {
#ifdef DFL_HAVE_CUDA
    dfl_error err = {0};
    if (backend_cuda_device_count(&err) <= 0) {
        test_skip(t, err.msg[0] ? err.msg : "no CUDA device");
        return;
    }
    if (!tu_have_numpy(t)) return;
    dspark_case(t, "cuda3", TINY " --block-size 8 --dspark-rank 16 --seed 4", 3, (const int32_t[]){3, 8, 5}, DFL_DEVICE_CUDA);
    dspark_case(t, "cudaopt", TINY " --block-size 8 --dspark-rank 32 --bonus-anchor --swa 3 --softcap 4 --seed 5",
                2, (const int32_t[]){7, 4}, DFL_DEVICE_CUDA);
#else
    test_skip(t, "built without CUDA (make CUDA=1 where nvcc is installed)");
#endif
}

TEST(dspark_load_hparams) {
    char tp[512], dp[512], tp2[512], dp2[512];
    if (!tu_make_models(t, "a", TINY " --block-size 8 --dspark-rank 16", tp, dp, sizeof(tp))) return;
    if (!tu_make_models(t, "b", TINY " --block-size 8 --dspark-rank 16 --bonus-anchor --no-confidence", tp2, dp2,
                        sizeof(tp2))) return;
    dfl_error err = {0};
    dfl_model *a = dfl_model_load(dp, NULL, &err);
    dfl_model *b = dfl_model_load(dp2, NULL, &err);
    REQUIRE(a != NULL && b != NULL);
    const dfl_hparams *ha = dfl_model_hparams(a), *hb = dfl_model_hparams(b);
    CHECK(ha->dspark && ha->dspark_confidence);
    CHECK_EQ_INT(ha->n_draft_max, 8); /* anchor-first: the whole block */
    CHECK(hb->dspark && !hb->dspark_confidence);
    CHECK_EQ_INT(hb->n_draft_max, 7);
    dfl_model_free(a);
    dfl_model_free(b);
}

/* The plain DFlash drafter with each option against ref_cli.py draft (B-1 rows). */
TEST(drafter_options_vs_numpy) {
    if (!tu_have_numpy(t)) return;
    static const char *const opts[] = {
        "--causal", "--swa 3 --swa-pattern 1,0", "--swa 2 --swa-pattern 1,1", "--logit-scale 1.7 --softcap 2",
        "--embedding-scale 3", "--causal --swa 5 --softcap 4 --embedding-scale 0.5",
    };
    for (size_t o = 0; o < sizeof(opts) / sizeof(opts[0]); o++) {
        char tp[512], dp[512], args[512], dir[16], cmd[2048], json[8192], ref_path[512], csv[256], name[32];
        snprintf(args, sizeof(args), TINY " --block-size 8 --seed %d %s", 20 + (int)o, opts[o]);
        snprintf(dir, sizeof(dir), "o%d", (int)o);
        if (!tu_make_models(t, dir, args, tp, dp, sizeof(tp))) return;
        dpair p;
        if (!dpair_open(t, &p, tp, dp, 1, NULL)) {
            dpair_close(&p);
            return;
        }
        int32_t prompt[17], first, out[7];
        make_prompt(prompt, 17, (int)o);
        dfl_error err = {0};
        REQUIRE(spec_prefill(p.spec, 0, prompt, 17, &first, &err) == DFL_OK);
        float *logits = malloc(7 * NV * sizeof(float));
        REQUIRE(logits != NULL);
        CHECK(drafter_draft(p.dctx, 1, (int32_t[]){0}, &first, 7, NULL, out, logits, &err) == DFL_OK);
        tu_ids_csv(prompt, 17, csv, sizeof(csv));
        snprintf(name, sizeof(name), "o%d.bin", (int)o);
        test_path(t, name, ref_path, sizeof(ref_path));
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 tests/ref/ref_cli.py draft --target %s --drafter %s --tokens %s "
                 "--block 8 --last %d --top-k 1 --out %s", tp, dp, csv, first, ref_path);
        if (test_run(cmd, json, sizeof(json)) == 0) {
            int64_t n_ref = 0;
            float *ref = tu_read_floats(ref_path, &n_ref);
            REQUIRE(ref != NULL && n_ref == 7 * NV);
            const double e = tu_rel_err(logits, ref, 7 * NV);
            printf("    option %-48s drafter logits max rel err %.3g\n", opts[o], e);
            CHECK_MSG(e < 1e-4, "option %s: relative error %.3g", opts[o], e);
            for (int j = 0; j < 7; j++) CHECK_EQ_INT(out[j], tu_argmax(ref + j * NV, NV));
            free(ref);
        } else {
            test_fail(t, __FILE__, __LINE__, "ref_cli failed: %.300s", json);
        }
        free(logits);
        dpair_close(&p);
    }
}

/* ---- the lossless matrix through the engine -------------------------------------------------- */

#define N_GEN 24
#define MAXG (N_GEN + 64)

/* n_seq sequences through a speculative engine (drafts: the drafter's own, mode 0, or the oracle
 * with planted errors, mode 1) against target-alone greedy decoding. */
static bool lossless_case(test_ctx *t, dfl_model *tm, dfl_model *dm, dfl_context *rctx, int n_seq, int n_draft, int plen,
                          int mode, float p_min, dfl_feature_path fp, bool async, double *tau) {
    tu_oracle o;
    memset(&o, 0, sizeof(o));
    o.n_ref = MAXG;
    o.n_vocab = NV;
    o.mode = mode;
    o.rng = (uint64_t)(n_seq * 1000 + n_draft * 10 + plen);
    static int32_t prompts[8][128], ref[8][MAXG], got[8][MAXG];
    int64_t n_got[8] = {0};
    dfl_error err = {0};
    for (int s = 0; s < n_seq; s++) {
        make_prompt(prompts[s], plen + s, s + plen);
        dfl_seq_remove(rctx, 0, 0, NULL);
        if (tu_greedy(rctx, 0, prompts[s], plen + s, MAXG, ref[s], &err) != DFL_OK) {
            test_fail(t, __FILE__, __LINE__, "reference: %s", err.msg);
            return false;
        }
        o.ref[s] = ref[s];
    }
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_seq = n_seq;
    ep.n_ctx = 256;
    ep.n_batch = 16;
    ep.n_threads = ep.n_threads_batch = 1;
    ep.n_draft = n_draft;
    ep.draft_p_min = p_min;
    ep.features = fp;
    ep.async = async; /* queues on worker threads: the chain's host staging must outlive the ops */
    ep.draft_hook = tu_oracle_hook;
    ep.draft_hook_user = &o;
    dfl_engine *e = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    if (e == NULL) {
        test_fail(t, __FILE__, __LINE__, "engine: %s", err.msg);
        return false;
    }
    dfl_seq_params sp = dfl_seq_default_params();
    sp.max_tokens = N_GEN;
    int32_t *pp[8];
    int64_t lens[8];
    for (int s = 0; s < n_seq; s++) {
        pp[s] = prompts[s];
        lens[s] = plen + s;
    }
    bool ok = tu_engine_generate(e, n_seq, pp, lens, &sp, &got[0][0], MAXG, n_got, &o, &err);
    if (!ok) test_fail(t, __FILE__, __LINE__, "engine run: %s", err.msg);
    int64_t steps = 0, acc = 0;
    for (int s = 0; s < n_seq && ok; s++) {
        if (n_got[s] != N_GEN) {
            test_fail(t, __FILE__, __LINE__, "seq %d: %lld tokens", s, (long long)n_got[s]);
            ok = false;
        }
        for (int i = 0; i < N_GEN && ok; i++) {
            if (got[s][i] != ref[s][i]) {
                test_fail(t, __FILE__, __LINE__, "n_seq %d k %d prompt %d mode %d p_min %.2f: seq %d token %d: %d != greedy %d",
                          n_seq, n_draft, plen, mode, (double)p_min, s, i, got[s][i], ref[s][i]);
                ok = false;
            }
        }
        dfl_seq_stats st;
        if (dfl_engine_seq_stats(e, s, &st, &err) == DFL_OK) {
            steps += st.n_steps;
            acc += st.n_accepted;
        }
    }
    if (tau != NULL) *tau = steps > 0 ? (double)(steps + acc) / (double)steps : 0.0;
    dfl_engine_free(e);
    return ok;
}

TEST(dspark_lossless_matrix) {
    static const char *const variants[] = {
        "--type f32 --block-size 8 --dspark-rank 16",
        "--type q8_0 --block-size 6 --dspark-rank 32 --bonus-anchor --markov-scale 0.5",
        "--type f16 --block-size 16 --dspark-rank 16 --causal --swa 6 --softcap 5 --embedding-scale 1.5",
        "--type f32 --block-size 8 --swa 4 --logit-scale 2 --causal", /* plain DFlash with options */
    };
    int n_cases = 0, n_ok = 0;
    double tau_sum = 0.0;
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        char tp[512], dp[512], args[512], dir[16];
        snprintf(args, sizeof(args), TINY " %s --seed %d", variants[v], 31 + (int)v);
        snprintf(dir, sizeof(dir), "v%d", (int)v);
        if (!tu_make_models(t, dir, args, tp, dp, sizeof(tp))) return;
        dfl_error err = {0};
        dfl_model *tm = dfl_model_load(tp, NULL, &err);
        dfl_model *dm = tm ? dfl_model_load(dp, NULL, &err) : NULL;
        REQUIRE_MSG(dm != NULL, "%s", err.msg);
        dfl_context_params rp = dfl_context_default_params();
        rp.n_ctx = 256;
        rp.n_batch = 128;
        rp.n_ubatch = 16;
        rp.n_threads = rp.n_threads_batch = 1;
        dfl_context *rctx = dfl_context_new(tm, &rp, &err);
        REQUIRE(rctx != NULL);
        const dfl_hparams *dh = dfl_model_hparams(dm);
        const int K = (int)dh->n_draft_max;
        /* (n_seq, n_draft, prompt, mode, p_min x 100) */
        const int cases[][5] = {
            {1, K, 5, 1, 0}, {1, K, 9, 0, 0}, {3, K / 2, 17, 1, 0}, {2, K, 11, 1, 50}, {8, K, 3, 1, 50},
            {4, 2, 30, 0, 30}, {1, 1, 12, 1, 0}, {5, K - 1, 7, 1, 70},
        };
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            float p_min = (float)cases[c][4] / 100.0f;
            if (!dh->dspark_confidence && dh->dspark) p_min = 0.0f; /* refused (tested in dspark_bad_files) */
            double tau = 0;
            n_cases++;
            const bool ok = lossless_case(t, tm, dm, rctx, cases[c][0], cases[c][1], cases[c][2], cases[c][3], p_min,
                                          c % 2 ? DFL_FEATURES_HOST : DFL_FEATURES_DEVICE, c % 3 == 1, &tau);
            n_ok += ok;
            tau_sum += tau;
        }
        dfl_context_free(rctx);
        dfl_model_free(dm);
        dfl_model_free(tm);
    }
    printf("    %d of %d DSpark / option engine runs bit-identical to target-alone greedy (mean tau %.2f, oracle and "
           "real drafts)\n", n_ok, n_cases, n_cases ? tau_sum / n_cases : 0.0);
    CHECK(n_cases >= 32);
    CHECK_EQ_INT(n_ok, n_cases);
}

/* The confidence cut shortens drafts exactly where the head says: with p_min above every
 * confidence of the first row nothing is drafted (plain steps), with p_min 0 the whole block. */
TEST(dspark_confidence_cuts_draft) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "c", TINY " --block-size 8 --dspark-rank 16 --seed 8", tp, dp, sizeof(tp))) return;
    int64_t drafted[3] = {0}, steps[3] = {0};
    /* the middle threshold: the first row's confidence of the first step (so that step keeps at
     * least one draft; later rows and steps fall below it or not) */
    float pm[3] = {0.0f, 0.0f, 1.0f};
    for (int v = 0; v < 3; v++) {
        spec_params sp = spec_default_params();
        sp.draft_p_min = pm[v];
        dpair p;
        if (!dpair_open(t, &p, tp, dp, 1, &sp)) {
            dpair_close(&p);
            return;
        }
        int32_t prompt[12], first, toks[16], n_tok, nd;
        make_prompt(prompt, 12, 1);
        dfl_error err = {0};
        REQUIRE(spec_prefill(p.spec, 0, prompt, 12, &first, &err) == DFL_OK);
        for (int s = 0; s < 6; s++) {
            /* the confidences this step's cut reads, recomputed from a draft of the same state */
            REQUIRE(spec_step_ex(p.spec, 1, (int32_t[]){0}, toks, &n_tok, &nd, &err) == DFL_OK);
            const float *conf = drafter_confidence(p.dctx);
            REQUIRE(conf != NULL);
            int want = 0;
            while (want < 8 && conf[want] >= pm[v]) want++;
            CHECK_MSG(nd == want, "p_min %.1f step %d: %d drafts verified, confidence allows %d", (double)pm[v], s, nd, want);
            drafted[v] += nd;
            steps[v]++;
            if (v == 0 && s == 0) {
                pm[1] = conf[0];
                printf("    first step's confidences:");
                for (int j = 0; j < 8; j++) printf(" %.3f", (double)conf[j]);
                printf("\n");
            }
        }
        dpair_close(&p);
    }
    printf("    drafts per step: p_min 0: %.1f, p_min %.3f: %.1f, p_min 1: %.1f\n", (double)drafted[0] / steps[0],
           (double)pm[1], (double)drafted[1] / steps[1], (double)drafted[2] / steps[2]);
    CHECK_EQ_INT(drafted[0], 8 * steps[0]);
    CHECK_EQ_INT(drafted[2], 0);
    CHECK(drafted[1] > 0 && drafted[1] < drafted[0]);
}

/* ---- bad files --------------------------------------------------------------------------------- */

static float k_zeros[1 << 16];

typedef struct bad_spec {
    const char *skip;        /* tensor left out */
    const char *bad;         /* tensor with ne0 + 32 */
    bool conf_key, conf_key_value;
    bool markov;             /* DSpark heads at all */
    bool d2t;
    int swa;                 /* sliding_window (0: none) */
    int swa_pattern_n;       /* entries of the pattern (-1: no key) */
    float logit_scale, softcap; /* 0: no key */
    int n_vocab_markov;
    const char *extra;       /* an extra [4] f32 tensor of that name */
    const char *nan_tensor;  /* this (f32) tensor is all NaN */
} bad_spec;

static float k_nans[1 << 16];

static void bad_t(gguf_writer *w, const bad_spec *b, const char *name, uint32_t type, int n_dims, int64_t ne0, int64_t ne1) {
    if (b->skip && strcmp(b->skip, name) == 0) return;
    if (b->bad && strcmp(b->bad, name) == 0) ne0 += 32;
    int64_t ne[2] = {ne0, ne1};
    const size_t nbytes = quant_row_size(type, ne0) * (size_t)(n_dims > 1 ? ne1 : 1);
    if (nbytes > sizeof(k_zeros)) abort();
    const bool nan = b->nan_tensor && strcmp(b->nan_tensor, name) == 0;
    if (nan) for (size_t i = 0; i < sizeof(k_nans) / sizeof(k_nans[0]); i++) k_nans[i] = NAN;
    gguf_writer_add_tensor(w, name, type, (uint32_t)n_dims, ne, nan ? k_nans : k_zeros, nbytes, NULL);
}

/* A 2-layer DSpark drafter of zeros (n_embd 64, R 16) with one defect. */
static bool write_bad(const bad_spec *b, const char *path) {
    gguf_writer *w = gguf_writer_new();
    const int64_t E = 64, R = 16, V = b->n_vocab_markov > 0 ? b->n_vocab_markov : NV;
    gguf_writer_set_str(w, "general.architecture", "dflash");
    gguf_writer_set_u32(w, "dflash.block_count", 2);
    gguf_writer_set_u32(w, "dflash.embedding_length", (uint32_t)E);
    gguf_writer_set_u32(w, "dflash.feed_forward_length", 128);
    gguf_writer_set_u32(w, "dflash.attention.head_count", 4);
    gguf_writer_set_u32(w, "dflash.attention.head_count_kv", 2);
    gguf_writer_set_u32(w, "dflash.attention.key_length", 16);
    gguf_writer_set_u32(w, "dflash.attention.value_length", 16);
    gguf_writer_set_f32(w, "dflash.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_set_u32(w, "dflash.block_size", 8);
    gguf_writer_set_arr_i32(w, "dflash.target_layers", (const int32_t[]){1, 2}, 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", 5);
    if (b->conf_key) gguf_writer_set_bool(w, "dflash.has_confidence_head", b->conf_key_value);
    if (b->swa > 0) gguf_writer_set_u32(w, "dflash.attention.sliding_window", (uint32_t)b->swa);
    if (b->swa_pattern_n >= 0) {
        bool pat[8] = {true, false, true, false, true, false, true, false};
        gguf_writer_set_arr_num(w, "dflash.attention.sliding_window_pattern", GGUF_TYPE_BOOL, pat, (size_t)b->swa_pattern_n);
    }
    if (b->logit_scale != 0.0f) gguf_writer_set_f32(w, "dflash.logit_scale", b->logit_scale);
    if (b->softcap != 0.0f) gguf_writer_set_f32(w, "dflash.final_logit_softcapping", b->softcap);
    bad_t(w, b, "fc.weight", QUANT_TYPE_F32, 2, 2 * E, E);
    bad_t(w, b, "enc.output_norm.weight", QUANT_TYPE_F32, 1, E, 1);
    bad_t(w, b, "output_norm.weight", QUANT_TYPE_F32, 1, E, 1);
    if (b->markov) {
        bad_t(w, b, "markov_w1.weight", QUANT_TYPE_F32, 2, R, V);
        bad_t(w, b, "markov_w2.weight", QUANT_TYPE_F32, 2, R, V);
    }
    bad_t(w, b, "conf_proj.weight", QUANT_TYPE_F32, 2, E + R, 1);
    bad_t(w, b, "conf_proj.bias", QUANT_TYPE_F32, 1, 1, 1);
    if (b->d2t) bad_t(w, b, "d2t", QUANT_TYPE_I32, 1, 100, 1);
    if (b->extra) bad_t(w, b, b->extra, QUANT_TYPE_F32, 1, 4, 1);
    for (int il = 0; il < 2; il++) {
        char n[64];
#define T(suffix, type, nd, a, c) (snprintf(n, sizeof(n), "blk.%d." suffix, il), bad_t(w, b, n, type, nd, a, c))
        T("attn_norm.weight", QUANT_TYPE_F32, 1, E, 1);
        T("attn_q.weight", QUANT_TYPE_F32, 2, E, 64);
        T("attn_k.weight", QUANT_TYPE_F32, 2, E, 32);
        T("attn_v.weight", QUANT_TYPE_F32, 2, E, 32);
        T("attn_output.weight", QUANT_TYPE_F32, 2, 64, E);
        T("attn_q_norm.weight", QUANT_TYPE_F32, 1, 16, 1);
        T("attn_k_norm.weight", QUANT_TYPE_F32, 1, 16, 1);
        T("ffn_norm.weight", QUANT_TYPE_F32, 1, E, 1);
        T("ffn_gate.weight", QUANT_TYPE_F32, 2, E, 128);
        T("ffn_up.weight", QUANT_TYPE_F32, 2, E, 128);
        T("ffn_down.weight", QUANT_TYPE_F32, 2, 128, E);
#undef T
    }
    dfl_error err = {0};
    const dfl_status st = gguf_writer_write(w, path, &err);
    gguf_writer_free(w);
    return st == DFL_OK;
}

static bad_spec bad_default(void) {
    bad_spec b;
    memset(&b, 0, sizeof(b));
    b.markov = true;
    b.swa_pattern_n = -1;
    return b;
}

/* Loads a defective file: refused, and the message contains `want`. */
static void expect_refused(test_ctx *t, const bad_spec *b, const char *name, const char *want) {
    char path[512];
    test_path(t, name, path, sizeof(path));
    REQUIRE(write_bad(b, path));
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(path, NULL, &err);
    CHECK_MSG(m == NULL, "%s: loaded", name);
    dfl_model_free(m);
    CHECK_STR_CONTAINS(err.msg, want);
    printf("    %-12s %s\n", name, err.msg);
}

TEST(dspark_bad_files) {
    bad_spec b = bad_default();
    /* the good file loads */
    char good[512];
    test_path(t, "good.gguf", good, sizeof(good));
    REQUIRE(write_bad(&b, good));
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(good, NULL, &err);
    REQUIRE_MSG(m != NULL, "%s", err.msg);
    CHECK(dfl_model_hparams(m)->dspark && dfl_model_hparams(m)->dspark_confidence);
    dfl_model_free(m);

    b = bad_default(); b.skip = "markov_w2.weight";
    expect_refused(t, &b, "no_w2", "markov_w2.weight: expected [16, 640] type");
    b = bad_default(); b.bad = "markov_w2.weight";
    expect_refused(t, &b, "bad_w2", "markov_w2.weight: expected [16, 640] type");
    b = bad_default(); b.bad = "conf_proj.weight";
    expect_refused(t, &b, "bad_conf", "conf_proj.weight: expected [80] type");
    b = bad_default(); b.skip = "conf_proj.weight"; b.conf_key = true; b.conf_key_value = true;
    expect_refused(t, &b, "conf_key", "dflash.has_confidence_head = true but conf_proj.weight is missing");
    b = bad_default(); b.conf_key = true; b.conf_key_value = false;
    expect_refused(t, &b, "conf_key2", "dflash.has_confidence_head = false but conf_proj.weight is present");
    b = bad_default(); b.markov = false;
    expect_refused(t, &b, "no_markov", "conf_proj.weight is present but markov_w1.weight");
    b = bad_default(); b.skip = "conf_proj.weight";
    expect_refused(t, &b, "bias_only", "conf_proj.bias is present but conf_proj.weight is missing");
    b = bad_default(); b.d2t = true;
    expect_refused(t, &b, "d2t", "reduced draft vocabulary");
    b = bad_default(); b.swa = 4;
    expect_refused(t, &b, "swa_nopat", "dflash.attention.sliding_window_pattern");
    b = bad_default(); b.swa = 4; b.swa_pattern_n = 3;
    expect_refused(t, &b, "swa_pat3", "has 3 entries, expected 2");
    b = bad_default(); b.logit_scale = -1.0f;
    expect_refused(t, &b, "neg_scale", "dflash.logit_scale = -1 must be positive");
    b = bad_default(); b.softcap = -2.0f;
    expect_refused(t, &b, "neg_cap", "final_logit_softcapping = -2 must be >= 0");
    b = bad_default(); b.extra = "fc.scale";
    expect_refused(t, &b, "fc_scale", "fc.scale: per-tensor weight scales are not supported");
    b = bad_default(); b.extra = "blk.1.attn_sinks.weight";
    expect_refused(t, &b, "sinks", "blk.1.attn_sinks.weight: attention sinks are not supported");

    /* a Markov head over another vocabulary than the target's: refused at context creation */
    char tp[512], dp[512], small[512];
    if (!tu_make_models(t, "m", TINY " --block-size 8 --dspark-rank 16 --no-confidence", tp, dp, sizeof(tp))) return;
    b = bad_default(); b.n_vocab_markov = 500;
    test_path(t, "v500.gguf", small, sizeof(small));
    REQUIRE(write_bad(&b, small));
    dpair p;
    memset(&p, 0, sizeof(p));
    p.target = dfl_model_load(tp, NULL, &err);
    p.drafter = dfl_model_load(small, NULL, &err);
    REQUIRE(p.target && p.drafter);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 64;
    cp.n_capture = 2;
    cp.capture_layers = dfl_model_hparams(p.drafter)->target_layers;
    p.tctx = dfl_context_new(p.target, &cp, &err);
    REQUIRE(p.tctx != NULL);
    dfl_context_params dcp = dfl_context_default_params();
    dcp.target = p.tctx;
    err.code = DFL_OK;
    CHECK(dfl_context_new(p.drafter, &dcp, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "markov_w1/markov_w2 have 500/500 rows; the target's vocabulary has 640");
    dpair_close(&p);

    /* draft_p_min without a confidence head; a draft longer than the block */
    dfl_model *tm = dfl_model_load(tp, NULL, &err), *dm = dfl_model_load(dp, NULL, &err);
    REQUIRE(tm && dm);
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_ctx = 128;
    ep.draft_p_min = 0.5f;
    err.code = DFL_OK;
    dfl_engine *e = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    CHECK(e == NULL);
    CHECK_STR_CONTAINS(err.msg, "no confidence head");
    dfl_engine_free(e);
    ep.draft_p_min = 0.0f;
    ep.n_draft = 9;
    err.code = DFL_OK;
    e = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    CHECK(e == NULL);
    CHECK_STR_CONTAINS(err.msg, "draft length 9 is outside 1..8");
    dfl_engine_free(e);
    ep.n_draft = 8; /* anchor-first: the whole block is a draft */
    err.code = DFL_OK;
    e = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    CHECK_MSG(e != NULL, "%s", err.msg);
    dfl_engine_free(e);
    dfl_model_free(dm);
    dfl_model_free(tm);
}

/* ---- sampling stays lossless ------------------------------------------------------------------- */

#define S_RUNS 2000
#define S_POS 3

/* Two-sample chi-square over histograms a, b (bins merged until they hold 20 counts). */
static double chi2_hist(const int *a, const int *b, int n, int *df) {
    long na = 0, nb = 0;
    for (int i = 0; i < n; i++) na += a[i], nb += b[i];
    const double ka = sqrt((double)nb / (double)na), kb = sqrt((double)na / (double)nb);
    double stat = 0.0;
    int bins = 0, ca = 0, cb = 0;
    for (int i = 0; i < n; i++) {
        ca += a[i];
        cb += b[i];
        if (ca + cb < 20 && i + 1 < n) continue;
        if (ca + cb > 0) {
            const double d = ka * ca - kb * cb;
            stat += d * d / (double)(ca + cb);
            bins++;
        }
        ca = cb = 0;
    }
    *df = bins - 1;
    return stat;
}

/* chi-square(df) quantile at 1 - 1e-4 (Wilson-Hilferty). */
static double chi2_limit(int df) {
    const double k = (double)df, z = 3.719;
    const double c = 1.0 - 2.0 / (9.0 * k) + z * sqrt(2.0 / (9.0 * k));
    return k * c * c * c;
}

typedef struct forced_drafts {
    int32_t tok[S_POS];
    bool on;
} forced_drafts;

/* Replaces the drafts with likely tokens (so that acceptance and rejection both happen often). */
static void forced_hook(void *user, int32_t seq, int32_t *draft, int32_t n_draft) {
    const forced_drafts *f = user;
    (void)seq;
    for (int32_t j = 0; f->on && j < n_draft; j++) draft[j] = f->tok[j + 1 < S_POS ? j + 1 : S_POS - 1];
}

/* S_POS tokens of one seeded run (temperature temp, top-k 8) through engine e. */
static bool sample_run(dfl_engine *e, uint64_t seed, float temp, int32_t out[S_POS]) {
    static const int32_t prompt[5] = {17, 301, 42, 99, 250};
    dfl_error err = {0};
    dfl_seq_params sp = dfl_seq_default_params();
    sp.sampler.temp = temp;
    sp.sampler.top_k = 8;
    sp.sampler.seed = seed;
    sp.max_tokens = S_POS;
    if (dfl_engine_seq_start(e, 0, prompt, 5, &sp, &err) != DFL_OK) return false;
    int got = 0;
    for (int guard = 0; guard < 16; guard++) {
        dfl_seq_output o;
        dfl_engine_seq_read(e, 0, &o, &err);
        for (int64_t j = 0; j < o.n_tokens && got < S_POS; j++) out[got++] = o.tokens[j];
        if (o.state != DFL_SEQ_ACTIVE) break;
        if (dfl_engine_step(e, NULL, 0, &err) != DFL_OK) return false;
    }
    return got == S_POS;
}

/* Sampled output with a DSpark drafter (its own drafts with the confidence cut, and forced likely
 * drafts) has the target-alone distribution at each of the first positions; a different
 * temperature is detected (the test can fail). */
TEST(dspark_sampling_lossless) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "s", "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 "
                        "--draft-layers 1 --block-size 4 --std 0.2 --dspark-rank 16 --seed 9", tp, dp, sizeof(tp))) return;
    dfl_error err = {0};
    dfl_model *tm = dfl_model_load(tp, NULL, &err), *dm = tm ? dfl_model_load(dp, NULL, &err) : NULL;
    REQUIRE_MSG(dm != NULL, "%s", err.msg);
    forced_drafts f;
    memset(&f, 0, sizeof(f));
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_ctx = 64;
    ep.n_threads = ep.n_threads_batch = 1;
    dfl_engine *plain = dfl_engine_new_from_models(tm, NULL, NULL, &ep, &err);
    ep.draft_p_min = 0.3f;
    ep.draft_hook = forced_hook;
    ep.draft_hook_user = &f;
    dfl_engine *spec = plain ? dfl_engine_new_from_models(tm, dm, NULL, &ep, &err) : NULL;
    REQUIRE_MSG(spec != NULL, "%s", err.msg);
    static int h_plain[S_POS][NV], h_hot[S_POS][NV], h_spec[S_POS][NV], h_forced[S_POS][NV];
    memset(h_plain, 0, sizeof(h_plain));
    memset(h_hot, 0, sizeof(h_hot));
    memset(h_spec, 0, sizeof(h_spec));
    memset(h_forced, 0, sizeof(h_forced));
    int32_t o[S_POS];
    bool ok = true;
    for (int r = 0; ok && r < S_RUNS; r++) {
        ok = sample_run(plain, 1000 + (uint64_t)r, 1.0f, o);
        for (int k = 0; ok && k < S_POS; k++) h_plain[k][o[k]]++;
        ok = ok && sample_run(plain, 500000 + (uint64_t)r, 3.0f, o);
        for (int k = 0; ok && k < S_POS; k++) h_hot[k][o[k]]++;
    }
    for (int k = 0; k < S_POS; k++) {
        for (int v = 1; v < NV; v++) if (h_plain[k][v] > h_plain[k][f.tok[k]]) f.tok[k] = v;
    }
    for (int r = 0; ok && r < S_RUNS; r++) {
        f.on = false;
        ok = sample_run(spec, 2000000 + (uint64_t)r, 1.0f, o);
        for (int k = 0; ok && k < S_POS; k++) h_spec[k][o[k]]++;
        f.on = true;
        ok = ok && sample_run(spec, 3000000 + (uint64_t)r, 1.0f, o);
        for (int k = 0; ok && k < S_POS; k++) h_forced[k][o[k]]++;
    }
    CHECK_MSG(ok, "sampling runs failed");
    const dfl_engine_stats es = dfl_engine_get_stats(spec);
    printf("    speculative engine: %lld draft tokens verified, %lld accepted\n", (long long)es.n_draft_tokens,
           (long long)es.n_accepted);
    for (int k = 0; ok && k < S_POS; k++) {
        int d1, d2, d3;
        const double c1 = chi2_hist(h_plain[k], h_spec[k], NV, &d1);
        const double c2 = chi2_hist(h_plain[k], h_forced[k], NV, &d2);
        const double c3 = chi2_hist(h_plain[k], h_hot[k], NV, &d3);
        printf("    position %d: chi2 plain vs DSpark drafts %.1f (df %d, limit %.1f), vs forced drafts %.1f (df %d), "
               "negative control T=3 %.1f (df %d, limit %.1f)\n", k + 1, c1, d1, chi2_limit(d1), c2, d2, c3, d3,
               chi2_limit(d3));
        CHECK_MSG(d1 >= 2 && c1 < chi2_limit(d1), "position %d: DSpark speculative distribution differs", k + 1);
        CHECK_MSG(d2 >= 2 && c2 < chi2_limit(d2), "position %d: forced-draft distribution differs", k + 1);
        if (k < 2) CHECK_MSG(c3 > chi2_limit(d3), "position %d: the negative control was not detected", k + 1);
    }
    dfl_engine_free(spec);
    dfl_engine_free(plain);
    dfl_model_free(dm);
    dfl_model_free(tm);
}

/* NaN in the Markov weights: refused when the drafter context is created; NaN in the head's rows
 * (here output_norm): the chain does not run, the draft is cut (counted), nothing crashes. */
TEST(dspark_nonfinite) {
    char tp[512], dp[512], bad[512];
    if (!tu_make_models(t, "m", TINY " --block-size 8 --dspark-rank 16", tp, dp, sizeof(tp))) return;
    const char *const nan_in[2] = {"markov_w2.weight", "output_norm.weight"};
    for (int c = 0; c < 2; c++) {
        bad_spec b = bad_default();
        b.nan_tensor = nan_in[c];
        test_path(t, c ? "nan_head.gguf" : "nan_markov.gguf", bad, sizeof(bad));
        REQUIRE(write_bad(&b, bad));
        dfl_error err = {0};
        dpair p;
        memset(&p, 0, sizeof(p));
        p.target = dfl_model_load(tp, NULL, &err);
        p.drafter = dfl_model_load(bad, NULL, &err);
        REQUIRE(p.target && p.drafter);
        dfl_context_params cp = dfl_context_default_params();
        cp.n_ctx = 64;
        cp.n_capture = 2;
        cp.capture_layers = dfl_model_hparams(p.drafter)->target_layers;
        p.tctx = dfl_context_new(p.target, &cp, &err);
        REQUIRE(p.tctx != NULL);
        dfl_context_params dcp = dfl_context_default_params();
        dcp.target = p.tctx;
        p.dctx = dfl_context_new(p.drafter, &dcp, &err);
        if (c == 0) {
            CHECK(p.dctx == NULL);
            CHECK_STR_CONTAINS(err.msg, "markov_w2.weight row 0 holds a NaN or Inf");
        } else {
            REQUIRE_MSG(p.dctx != NULL, "%s", err.msg);
            spec_params sp = spec_default_params();
            p.spec = spec_new(p.tctx, p.dctx, &sp, &err);
            REQUIRE_MSG(p.spec != NULL, "%s", err.msg);
            int32_t prompt[6] = {3, 4, 5, 6, 7, 8}, first, toks[16], n_tok;
            REQUIRE(spec_prefill(p.spec, 0, prompt, 6, &first, &err) == DFL_OK);
            /* the draft is cut (a plain step), counted; the target's own token comes out */
            CHECK_MSG(spec_step(p.spec, 1, (int32_t[]){0}, toks, &n_tok, &err) == DFL_OK, "%s", err.msg);
            CHECK_EQ_INT(n_tok, 1);
            const spec_stats st = spec_get_stats(p.spec);
            CHECK(st.n_draft_nonfinite > 0);
            /* the same with a reduced draft vocabulary: every row flagged, naming a token of it */
            const int32_t H[4] = {100, 5, 77, 9};
            dfl_context *tc2 = dfl_context_new(p.target, &cp, &err);
            REQUIRE(tc2 != NULL);
            dfl_context_params dv = dfl_context_default_params();
            dv.target = tc2;
            dv.n_draft_vocab = 4;
            dv.draft_vocab = H;
            dfl_context *dc2 = dfl_context_new(p.drafter, &dv, &err);
            spec_session *s2 = dc2 != NULL ? spec_new(tc2, dc2, &sp, &err) : NULL;
            CHECK_MSG(s2 != NULL, "%s", err.msg);
            int32_t f2, dr[3];
            if (s2 != NULL && spec_prefill(s2, 0, prompt, 6, &f2, &err) == DFL_OK &&
                drafter_draft(dc2, 1, (int32_t[]){0}, &f2, 3, NULL, dr, NULL, &err) == DFL_OK) {
                for (int j = 0; j < 3; j++) {
                    const int32_t tok = -1 - dr[j];
                    CHECK_MSG(dr[j] < 0 && (tok == 5 || tok == 9 || tok == 77 || tok == 100),
                              "reduced vocabulary: draft %d: %d (a flag naming a token of the vocabulary expected)", j, dr[j]);
                }
                CHECK_MSG(spec_step(s2, 1, (int32_t[]){0}, toks, &n_tok, &err) == DFL_OK, "%s", err.msg);
                CHECK_EQ_INT(n_tok, 1);
                CHECK(spec_get_stats(s2).n_draft_nonfinite > 0);
            } else {
                CHECK_MSG(false, "reduced vocabulary: %s", err.msg);
            }
            spec_free(s2);
            dfl_context_free(dc2);
            dfl_context_free(tc2);
            snprintf(err.msg, sizeof(err.msg), "step ran without drafts (%lld non-finite draft slots)",
                     (long long)st.n_draft_nonfinite);
        }
        printf("    NaN in %-20s %s\n", nan_in[c], err.msg);
        dpair_close(&p);
    }
}
