/* test_engine.c: the engine (dfl_engine): the lossless matrix through it (weight types x block
 * sizes x draft lengths x 1-8 sequences x both feature paths, bit-identical to plain greedy
 * decoding, which the drafter-less engine must also reproduce), sequences joining and leaving
 * between steps and a cancel (each sequence exactly its solo output and acceptance), prefix
 * reuse, stop strings and text deltas on the embedded pair, and bad input that names the value
 * and the limit while the other sequences stay bit-identical. */
#include "test.h"
#include "test_util.h"
#include "engine/stop_text.h"

#include <stdlib.h>
#include <string.h>

#define NV 640
#define REQUIRE_RET(cond, ret) \
    do { if (!(cond)) { test_fail(t, __FILE__, __LINE__, "REQUIRE(%s)", #cond); return ret; } } while (0)
#define N_GEN 24
#define MAXG (N_GEN + 64)

#define TINY_T "--n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 --draft-layers 1"

typedef tu_oracle oracle; /* the shared oracle draft hook (test_util.h) */

static void make_prompt(int32_t *p, int len, int s, int salt) {
    for (int i = 0; i < len; i++) p[i] = (int32_t)((i * 131 + s * 17 + salt * 7 + 3) % NV);
}

/* Runs every active sequence of e to its end, collecting tokens; o (may be NULL) is kept in step. */
static bool run_all(test_ctx *t, dfl_engine *e, int n_seq, int32_t got[][MAXG], int64_t *n_got, oracle *o) {
    dfl_error err = {0};
    for (int guard = 0; dfl_engine_n_active(e) > 0 && guard < 1000; guard++) {
        if (dfl_engine_step(e, NULL, 0, &err) != DFL_OK) {
            test_fail(t, __FILE__, __LINE__, "step: %s", err.msg);
            return false;
        }
        for (int s = 0; s < n_seq; s++) {
            dfl_seq_output out;
            dfl_engine_seq_read(e, s, &out, &err);
            for (int64_t j = 0; j < out.n_tokens && n_got[s] < MAXG; j++) got[s][n_got[s]++] = out.tokens[j];
            if (o) o->done[s] = n_got[s];
        }
    }
    return true;
}

/* One case: n_seq sequences with different prompts through a speculative engine (and, with plain,
 * through a drafter-less engine) against target-alone greedy decoding. */
static bool engine_case(test_ctx *t, dfl_model *tm, dfl_model *dm, dfl_context *rctx, int n_seq, int n_draft,
                        int prompt_len, dfl_feature_path fp, int mode, int adapt, bool plain) {
    oracle o;
    memset(&o, 0, sizeof(o));
    o.n_ref = N_GEN + 64;
    o.n_vocab = NV;
    o.mode = mode;
    o.rng = (uint64_t)(n_seq * 1000 + n_draft * 10 + prompt_len);
    static int32_t prompts[8][128], ref[8][MAXG], got[8][MAXG];
    int64_t n_got[8] = {0};
    dfl_error err = {0};
    bool ok = true;
    for (int s = 0; s < n_seq && ok; s++) {
        make_prompt(prompts[s], prompt_len + s, s, prompt_len);
        dfl_seq_remove(rctx, 0, 0, NULL);
        ok = tu_greedy(rctx, 0, prompts[s], prompt_len + s, MAXG, ref[s], &err) == DFL_OK;
        o.ref[s] = ref[s];
    }
    REQUIRE_RET(ok, false);
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_seq = n_seq;
    ep.n_ctx = 256;
    ep.n_batch = 16; /* prompts cross batches */
    ep.n_threads = ep.n_threads_batch = 1;
    ep.n_draft = n_draft;
    ep.n_draft_min = adapt > 0 ? 1 : 0;
    ep.draft_p_min = adapt == 2 ? 0.3f : 0.0f;
    ep.features = fp;
    ep.draft_hook = tu_oracle_hook;
    ep.draft_hook_user = &o;
    for (int pass = 0; pass < (plain ? 2 : 1) && ok; pass++) {
        dfl_engine *e = dfl_engine_new_from_models(tm, pass == 0 ? dm : NULL, NULL, &ep, &err);
        if (e == NULL) {
            test_fail(t, __FILE__, __LINE__, "engine: %s", err.msg);
            return false;
        }
        dfl_seq_params sp = dfl_seq_default_params();
        sp.max_tokens = N_GEN;
        memset(n_got, 0, sizeof(n_got));
        for (int s = 0; s < n_seq && ok; s++) {
            ok = dfl_engine_seq_start(e, s, prompts[s], prompt_len + s, &sp, &err) == DFL_OK;
            dfl_seq_output out;
            dfl_engine_seq_read(e, s, &out, &err);
            for (int64_t j = 0; j < out.n_tokens; j++) got[s][n_got[s]++] = out.tokens[j];
            o.done[s] = n_got[s];
        }
        ok = ok && run_all(t, e, n_seq, got, n_got, &o);
        for (int s = 0; s < n_seq && ok; s++) {
            dfl_seq_output out;
            dfl_engine_seq_read(e, s, &out, &err);
            if (out.finish != DFL_FINISH_LENGTH || n_got[s] != N_GEN) {
                test_fail(t, __FILE__, __LINE__, "seq %d: finish %d after %lld tokens", s, (int)out.finish,
                          (long long)n_got[s]);
                ok = false;
            }
            for (int i = 0; i < N_GEN && ok; i++) {
                if (got[s][i] != ref[s][i]) {
                    test_fail(t, __FILE__, __LINE__, "%s n_seq %d k %d prompt %d mode %d adapt %d features %d: seq %d token "
                              "%d: %d != greedy %d", pass ? "plain" : "spec", n_seq, n_draft, prompt_len, mode, adapt,
                              (int)fp, s, i, got[s][i], ref[s][i]);
                    ok = false;
                }
            }
        }
        dfl_engine_free(e);
    }
    return ok;
}

typedef struct pair_models {
    dfl_model *tm, *dm;
    dfl_context *rctx;
} pair_models;

static bool models_open(test_ctx *t, pair_models *m, const char *tp, const char *dp) {
    dfl_error err = {0};
    memset(m, 0, sizeof(*m));
    m->tm = dfl_model_load(tp, NULL, &err);
    m->dm = m->tm ? dfl_model_load(dp, NULL, &err) : NULL;
    dfl_context_params rp = dfl_context_default_params();
    rp.n_ctx = 256;
    rp.n_batch = 128;
    rp.n_ubatch = 16;
    rp.n_threads = rp.n_threads_batch = 1;
    m->rctx = m->dm ? dfl_context_new(m->tm, &rp, &err) : NULL;
    if (m->rctx == NULL) test_fail(t, __FILE__, __LINE__, "open: %s", err.msg);
    return m->rctx != NULL;
}

static void models_close(pair_models *m) {
    dfl_context_free(m->rctx);
    dfl_model_free(m->dm);
    dfl_model_free(m->tm);
}

TEST(engine_lossless_matrix) {
    const char *types[] = {"f32", "f16", "q8_0"};
    const int blocks[] = {4, 8, 16};
    int n_cases = 0, n_ok = 0;
    for (int ti = 0; ti < 3; ti++) {
        for (int bi = 0; bi < 3; bi++) {
            char args[512], tp[512], dp[512], dir[32];
            snprintf(args, sizeof(args), TINY_T " --type %s --block-size %d --seed %d", types[ti], blocks[bi], 11 + ti * 3 + bi);
            snprintf(dir, sizeof(dir), "%s_%d", types[ti], blocks[bi]);
            if (!tu_make_models(t, dir, args, tp, dp, sizeof(tp))) return;
            pair_models m;
            if (!models_open(t, &m, tp, dp)) {
                models_close(&m);
                return;
            }
            const int B = blocks[bi];
            /* (n_seq, n_draft, prompt_len, mode) */
            const int cases[][4] = {
                {1, B - 1, 1, 1}, {1, 1, 5, 1}, {2, B / 2, 17, 1}, {3, B - 1, 40, 1}, {8, B - 1, 3, 1},
                {4, 2, 33, 1}, {1, B - 1, 9, 0}, {2, B - 1, 20, 0}, {5, B / 2, 2, 1}, {8, 1, 16, 1},
                {6, B - 1, 31, 1}, {1, B - 1, 64, 1},
            };
            for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
                const dfl_feature_path fp = (c % 2) ? DFL_FEATURES_HOST : DFL_FEATURES_DEVICE;
                n_cases++;
                n_ok += engine_case(t, m.tm, m.dm, m.rctx, cases[c][0], cases[c][1], cases[c][2], fp, cases[c][3],
                                    (int)(c % 3), c % 4 == 0);
            }
            models_close(&m);
        }
    }
    printf("    %d of %d engine runs bit-identical to target-alone greedy decoding\n", n_ok, n_cases);
    CHECK(n_cases >= 100);
    CHECK_EQ_INT(n_ok, n_cases);
}

/* Solo output of one prompt on a fresh engine with n_seq 1. */
static bool solo_run(test_ctx *t, dfl_model *tm, dfl_model *dm, const dfl_engine_params *ep0, const int32_t *prompt,
                     int len, const dfl_seq_params *sp, int32_t *out, int64_t *n_out, dfl_seq_stats *st) {
    dfl_error err = {0};
    dfl_engine_params ep = *ep0;
    ep.n_seq = 1;
    dfl_engine *e = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    REQUIRE_RET(e != NULL, false);
    static int32_t got[1][MAXG];
    int64_t n_got[1] = {0};
    bool ok = dfl_engine_seq_start(e, 0, prompt, len, sp, &err) == DFL_OK;
    dfl_seq_output o;
    dfl_engine_seq_read(e, 0, &o, &err);
    for (int64_t j = 0; j < o.n_tokens; j++) got[0][n_got[0]++] = o.tokens[j];
    ok = ok && run_all(t, e, 1, got, n_got, NULL);
    memcpy(out, got[0], sizeof(int32_t) * (size_t)n_got[0]);
    *n_out = n_got[0];
    dfl_engine_seq_stats(e, 0, st, &err);
    dfl_engine_free(e);
    return ok;
}

/* Sequences join (a start while others are mid-generation) and leave (finish, cancel) between
 * steps: every sequence gives exactly its solo tokens and its solo acceptance (its drafts depend
 * on its own state only); greedy and sampled with penalties. */
TEST(engine_join_leave_cancel_solo) {
    /* the embedded pair: a trained drafter, so that acceptance is far from zero */
    char tp[1024], dp[1024];
    snprintf(tp, sizeof(tp), "%s/target.gguf", DFLASH_MODEL_DIR);
    snprintf(dp, sizeof(dp), "%s/drafter.gguf", DFLASH_MODEL_DIR);
    dfl_error verr = {0};
    dfl_vocab *vocab = dfl_vocab_load(tp, &verr);
    REQUIRE(vocab != NULL);
    static const char *texts[4] = {
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "The capital of France is",
        "import numpy as np\n\ndef softmax(x):\n",
        "Once upon a time, in a small village by the sea,",
    };
    pair_models m;
    if (!models_open(t, &m, tp, dp)) {
        models_close(&m);
        return;
    }
    for (int variant = 0; variant < 2; variant++) {
        dfl_engine_params ep = dfl_engine_default_params();
        ep.n_seq = 4;
        ep.n_ctx = 256;
        ep.n_threads = ep.n_threads_batch = 1;
        ep.n_draft_min = 1; /* adaptive lengths: sequences of one pass draft different lengths */
        dfl_seq_params sp[4];
        int32_t prompts[4][64];
        int plen[4];
        for (int s = 0; s < 4; s++) {
            sp[s] = dfl_seq_default_params();
            sp[s].max_tokens = 20 + 5 * s;
            if (variant == 1) {
                sp[s].sampler.temp = 0.9f;
                sp[s].sampler.top_k = 20;
                sp[s].sampler.repeat_penalty = 1.3f;
                sp[s].sampler.presence_penalty = 0.2f;
                sp[s].sampler.frequency_penalty = 0.1f;
                sp[s].sampler.seed = 77 + (uint64_t)s;
            }
            plen[s] = (int)dfl_tokenize(vocab, texts[s], strlen(texts[s]), prompts[s], 64, true, false);
            REQUIRE(plen[s] > 0);
        }
        sp[3].n_draft = 3;        /* a per-sequence draft cap */
        sp[2].prefill_chunk = 3;  /* a prompt prefilled in chunks between the others' steps */
        int32_t solo[4][MAXG];
        int64_t n_solo[4];
        dfl_seq_stats solo_st[4];
        for (int s = 0; s < 4; s++) {
            dfl_seq_params whole = sp[s]; /* solo: the whole prompt at start */
            whole.prefill_chunk = 0;
            REQUIRE(solo_run(t, m.tm, m.dm, &ep, prompts[s], plen[s], &whole, solo[s], &n_solo[s], &solo_st[s]));
        }
        dfl_error err = {0};
        dfl_engine *e = dfl_engine_new_from_models(m.tm, m.dm, NULL, &ep, &err);
        REQUIRE(e != NULL);
        static int32_t got[4][MAXG];
        int64_t n_got[4] = {0};
        bool ok = true;
        /* schedule: 0 starts; after 2 steps 1 joins; after 4, 2 joins and 0 is cancelled; after 5, 3 joins */
        for (int step = 0; ok && step < 200; step++) {
            const int join = step == 0 ? 0 : step == 2 ? 1 : step == 4 ? 2 : step == 5 ? 3 : -1;
            if (join >= 0) ok = dfl_engine_seq_start(e, join, prompts[join], plen[join], &sp[join], &err) == DFL_OK;
            if (step == 4) ok = ok && dfl_engine_seq_cancel(e, 0, &err) == DFL_OK;
            if (step == 4) CHECK_EQ_INT(dfl_engine_seq_state(e, 2), DFL_SEQ_PREFILL);
            for (int s = 0; s < 4; s++) {
                dfl_seq_output o;
                dfl_engine_seq_read(e, s, &o, &err);
                for (int64_t j = 0; j < o.n_tokens; j++) got[s][n_got[s]++] = o.tokens[j];
            }
            if (step > 5 && dfl_engine_n_active(e) == 0) break;
            ok = ok && dfl_engine_step(e, NULL, 0, &err) == DFL_OK;
        }
        CHECK_MSG(ok, "variant %d: %s", variant, err.msg);
        CHECK_EQ_INT(dfl_engine_seq_state(e, 0), DFL_SEQ_FINISHED);
        for (int s = 0; s < 4; s++) {
            dfl_seq_output o;
            dfl_engine_seq_read(e, s, &o, &err);
            CHECK_EQ_INT(o.finish, s == 0 ? DFL_FINISH_CANCELLED : DFL_FINISH_LENGTH);
            if (s > 0) CHECK_EQ_INT(n_got[s], n_solo[s]);
            CHECK(n_got[s] <= n_solo[s] && n_got[s] > 0);
            CHECK_MSG(memcmp(got[s], solo[s], sizeof(int32_t) * (size_t)n_got[s]) == 0, "variant %d seq %d differs from solo",
                      variant, s);
            if (s > 0) {
                dfl_seq_stats st;
                dfl_engine_seq_stats(e, s, &st, &err);
                CHECK_MSG(st.n_accepted == solo_st[s].n_accepted && st.n_steps == solo_st[s].n_steps,
                          "variant %d seq %d: accepted %lld in %lld steps, solo %lld in %lld", variant, s,
                          (long long)st.n_accepted, (long long)st.n_steps, (long long)solo_st[s].n_accepted,
                          (long long)solo_st[s].n_steps);
                for (int j = 0; j < DFL_MAX_DRAFT; j++) CHECK(st.accepted_per_pos[j] == solo_st[s].accepted_per_pos[j]);
                printf("    variant %d seq %d: %lld tokens, %lld of %lld drafts accepted in %lld steps (= solo)\n", variant, s,
                       (long long)n_got[s], (long long)st.n_accepted, (long long)st.n_draft_tokens, (long long)st.n_steps);
            }
        }
        dfl_engine_free(e);
    }
    models_close(&m);
    dfl_vocab_free(vocab);
}

/* A prompt that shares a prefix with what the sequence holds decodes only the rest, and gives
 * the output of a fresh start; both paths. */
TEST(engine_prefix_reuse) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", TINY_T " --type f16 --block-size 8 --seed 7", tp, dp, sizeof(tp))) return;
    pair_models m;
    if (!models_open(t, &m, tp, dp)) {
        models_close(&m);
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        dfl_model *dm = pass == 0 ? m.dm : NULL;
        dfl_engine_params ep = dfl_engine_default_params();
        ep.n_ctx = 256;
        ep.n_batch = 8;
        ep.n_threads = ep.n_threads_batch = 1;
        dfl_error err = {0};
        dfl_engine *e = dfl_engine_new_from_models(m.tm, dm, NULL, &ep, &err);
        REQUIRE(e != NULL);
        int32_t p1[30], p2[60];
        make_prompt(p1, 30, 1, 9);
        dfl_seq_params sp = dfl_seq_default_params();
        sp.max_tokens = 12;
        REQUIRE(dfl_engine_seq_start(e, 0, p1, 30, &sp, &err) == DFL_OK);
        static int32_t got[1][MAXG];
        int64_t n_got[1] = {0};
        dfl_seq_output o;
        dfl_engine_seq_read(e, 0, &o, &err);
        for (int64_t j = 0; j < o.n_tokens; j++) got[0][n_got[0]++] = o.tokens[j];
        REQUIRE(run_all(t, e, 1, got, n_got, NULL));
        /* the next prompt: p1, 6 of the generated tokens, then new tokens (a chat's next turn) */
        memcpy(p2, p1, sizeof(p1));
        memcpy(p2 + 30, got[0], 6 * sizeof(int32_t));
        for (int i = 36; i < 60; i++) p2[i] = (int32_t)((i * 37 + 5) % NV);
        sp.max_tokens = 15;
        sp.prefill_chunk = 7; /* the 24 new prompt tokens over 4 calls */
        REQUIRE(dfl_engine_seq_start(e, 0, p2, 60, &sp, &err) == DFL_OK);
        CHECK_EQ_INT(dfl_engine_seq_state(e, 0), DFL_SEQ_PREFILL);
        sp.prefill_chunk = 0;
        dfl_seq_stats st;
        dfl_engine_seq_stats(e, 0, &st, &err);
        CHECK_EQ_INT(st.n_reused, 36);
        CHECK_EQ_INT(st.n_prompt, 60);
        n_got[0] = 0;
        dfl_engine_seq_read(e, 0, &o, &err);
        for (int64_t j = 0; j < o.n_tokens; j++) got[0][n_got[0]++] = o.tokens[j];
        REQUIRE(run_all(t, e, 1, got, n_got, NULL));
        int32_t fresh[MAXG];
        int64_t n_fresh = 0;
        dfl_seq_stats fst;
        REQUIRE(solo_run(t, m.tm, dm, &ep, p2, 60, &sp, fresh, &n_fresh, &fst));
        CHECK_EQ_INT(fst.n_reused, 0);
        CHECK_EQ_INT(n_got[0], n_fresh);
        CHECK_MSG(memcmp(got[0], fresh, sizeof(int32_t) * (size_t)n_fresh) == 0, "%s: reused prefill differs from a fresh one",
                  pass ? "plain" : "spec");
        /* the same prompt again: everything but its last token comes from the cache */
        REQUIRE(dfl_engine_seq_start(e, 0, p2, 60, &sp, &err) == DFL_OK);
        dfl_engine_seq_stats(e, 0, &st, &err);
        CHECK_EQ_INT(st.n_reused, 59);
        dfl_engine_free(e);
    }
    models_close(&m);
}

/* Bad input: each error names the value and the limit; sequences already running continue
 * bit-identically. */
TEST(engine_bad_input) {
    char t1[512], d1[512], t2[512], d2[512];
    if (!tu_make_models(t, "a", TINY_T " --type f32 --block-size 8 --seed 3", t1, d1, sizeof(t1))) return;
    if (!tu_make_models(t, "b", "--n-embd 96 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 "
                        "--type f32 --block-size 8", t2, d2, sizeof(t2))) return;
    pair_models m;
    if (!models_open(t, &m, t1, d1)) {
        models_close(&m);
        return;
    }
    dfl_error err = {0};
    dfl_model *db = dfl_model_load(d2, NULL, &err);
    REQUIRE(db != NULL);
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_seq = 2;
    ep.n_ctx = 128;
    ep.n_threads = ep.n_threads_batch = 1;
    /* a mismatched pair, a drafter as target, a draft length beyond the block */
    CHECK(dfl_engine_new_from_models(m.tm, db, NULL, &ep, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "the drafter's n_embd 96 differs from the target's 64");
    CHECK(dfl_engine_new_from_models(m.dm, NULL, NULL, &ep, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "is a DFlash drafter");
    CHECK(dfl_engine_new_from_models(m.tm, m.tm, NULL, &ep, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "arch qwen3 (expected dflash)");
    ep.n_draft = 8;
    CHECK(dfl_engine_new_from_models(m.tm, m.dm, NULL, &ep, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "draft length 8 is outside 1..7");
    ep.n_draft = 0;
    ep.n_seq = 300;
    CHECK(dfl_engine_new_from_models(m.tm, m.dm, NULL, &ep, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "n_seq 300 is outside 1..256");
    ep.n_seq = 2;
    CHECK(dfl_engine_new("/nonexistent/t.gguf", NULL, &ep, &err) == NULL);
    CHECK(err.code == DFL_ERR_IO);

    int32_t pa[9];
    make_prompt(pa, 9, 0, 1);
    dfl_seq_params sp = dfl_seq_default_params();
    sp.max_tokens = 30;
    int32_t solo[MAXG];
    int64_t n_solo = 0;
    dfl_seq_stats sst;
    REQUIRE(solo_run(t, m.tm, m.dm, &ep, pa, 9, &sp, solo, &n_solo, &sst));
    dfl_engine *e = dfl_engine_new_from_models(m.tm, m.dm, NULL, &ep, &err);
    REQUIRE(e != NULL);
    static int32_t got[2][MAXG];
    int64_t n_got[2] = {0};
    REQUIRE(dfl_engine_seq_start(e, 0, pa, 9, &sp, &err) == DFL_OK);
    REQUIRE(dfl_engine_step(e, NULL, 0, &err) == DFL_OK);
    /* errors while sequence 0 is mid-generation */
    CHECK_EQ_INT(dfl_engine_seq_start(e, 2, pa, 9, &sp, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "sequence 2 is outside 0..1 (the engine was sized for n_seq 2)");
    CHECK_EQ_INT(dfl_engine_seq_start(e, 0, pa, 9, &sp, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "sequence 0 is active");
    const int32_t one = 1, zero_one[2] = {0, 1}, twice[2] = {0, 0}, far = 7;
    CHECK_EQ_INT(dfl_engine_step(e, &one, 1, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "sequence 1 is idle");
    CHECK_EQ_INT(dfl_engine_step(e, zero_one, 2, &err), DFL_ERR_INVALID); /* nothing stepped, not even 0 */
    CHECK_EQ_INT(dfl_engine_step(e, twice, 2, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "listed twice");
    CHECK_EQ_INT(dfl_engine_step(e, &far, 1, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "sequence 7 is outside 0..1");
    dfl_seq_params bad = sp;
    bad.sampler.top_p = 2.0f;
    CHECK_EQ_INT(dfl_engine_seq_start(e, 1, pa, 9, &bad, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "top_p 2 must be in [0, 1]");
    bad = sp;
    bad.sampler.repeat_penalty = -1.0f;
    CHECK_EQ_INT(dfl_engine_seq_start(e, 1, pa, 9, &bad, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "repeat_penalty -1");
    bad = sp;
    bad.n_draft = 9;
    CHECK_EQ_INT(dfl_engine_seq_start(e, 1, pa, 9, &bad, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "draft length 9 is outside 0..7");
    bad = sp;
    const int32_t bad_stop = 640;
    bad.stop_tokens = &bad_stop;
    bad.n_stop_tokens = 1;
    CHECK_EQ_INT(dfl_engine_seq_start(e, 1, pa, 9, &bad, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "stop token 640 is outside 0..639");
    bad = sp;
    const char *stops[1] = {"x"};
    bad.stop = stops;
    bad.n_stop = 1;
    CHECK_EQ_INT(dfl_engine_seq_start(e, 1, pa, 9, &bad, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "stop strings need a vocabulary");
    int32_t pbad[3] = {1, 640, 2};
    CHECK_EQ_INT(dfl_engine_seq_start(e, 1, pbad, 3, &sp, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "prompt token 1 = 640 is outside 0..639");
    static int32_t plong[128];
    CHECK_EQ_INT(dfl_engine_seq_start(e, 1, plong, 128, &sp, &err), DFL_ERR_CTX_FULL);
    CHECK_STR_CONTAINS(err.msg, "at most 120");
    CHECK_EQ_INT(dfl_engine_seq_state(e, 1), DFL_SEQ_IDLE);
    /* a finished and a cancelled sequence cannot step */
    dfl_seq_params shortp = sp;
    shortp.max_tokens = 1;
    REQUIRE(dfl_engine_seq_start(e, 1, pa, 5, &shortp, &err) == DFL_OK);
    /* speculative: the first step drafts from the last prompt token and gives the first token */
    CHECK_EQ_INT(dfl_engine_seq_state(e, 1), DFL_SEQ_ACTIVE);
    CHECK_EQ_INT(dfl_engine_step(e, &one, 1, &err), DFL_OK);
    CHECK_EQ_INT(dfl_engine_seq_state(e, 1), DFL_SEQ_FINISHED);
    CHECK_EQ_INT(dfl_engine_step(e, &one, 1, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "sequence 1 is finished (max_tokens)");
    dfl_seq_output o;
    dfl_engine_seq_read(e, 1, &o, &err);
    CHECK_EQ_INT(o.n_tokens, 1);
    shortp.max_tokens = 0;
    REQUIRE(dfl_engine_seq_start(e, 1, pa, 5, &shortp, &err) == DFL_OK);
    REQUIRE(dfl_engine_seq_cancel(e, 1, &err) == DFL_OK);
    CHECK_EQ_INT(dfl_engine_step(e, &one, 1, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "sequence 1 is cancelled");
    CHECK_EQ_INT(dfl_engine_seq_cancel(e, 5, &err), DFL_ERR_INVALID);
    CHECK_EQ_INT(dfl_engine_seq_cancel(e, 1, &err), DFL_OK); /* twice: nothing more happens */
    /* sequence 0 carries on: its output is its solo output */
    dfl_engine_seq_read(e, 0, &o, &err);
    for (int64_t j = 0; j < o.n_tokens; j++) got[0][n_got[0]++] = o.tokens[j];
    dfl_engine_seq_read(e, 0, &o, &err);
    CHECK_EQ_INT(o.n_tokens, 0); /* a second read without a step: nothing new */
    REQUIRE(run_all(t, e, 1, got, n_got, NULL));
    CHECK_EQ_INT(n_got[0], n_solo);
    CHECK(memcmp(got[0], solo, sizeof(int32_t) * (size_t)n_solo) == 0);
    dfl_engine_free(e);
    dfl_model_free(db);
    models_close(&m);
}

/* The stop-string stream on its own: held back while it may match, never shown once matched. */
TEST(engine_stop_text_stream) {
    stop_text st;
    memset(&st, 0, sizeof(st));
    text_buf out = {0};
    const char *stops[2] = {"</end>", "STOP"};
    REQUIRE(stop_text_set(&st, stops, 2));
    CHECK_EQ_INT(stop_text_push(&st, "hello <", 7, &out), 0);
    CHECK(out.n == 6 && memcmp(out.p, "hello ", 6) == 0); /* "<" may start "</end>" */
    CHECK_EQ_INT(stop_text_push(&st, "/e", 2, &out), 0);
    CHECK_EQ_INT(out.n, 6);
    CHECK_EQ_INT(stop_text_push(&st, "x ST", 4, &out), 0); /* "</ex" cannot match any more; "ST" may */
    CHECK(out.n == 11 && memcmp(out.p, "hello </ex ", 11) == 0);
    CHECK_EQ_INT(stop_text_push(&st, "OP and more", 11, &out), 1);
    CHECK(out.n == 11);
    /* a match inside one push, text before it shown */
    out.n = 0;
    REQUIRE(stop_text_set(&st, stops, 2));
    CHECK_EQ_INT(stop_text_push(&st, "abc</end>def", 12, &out), 1);
    CHECK(out.n == 3 && memcmp(out.p, "abc", 3) == 0);
    /* no stop strings: everything passes; flush shows what is held */
    out.n = 0;
    REQUIRE(stop_text_set(&st, stops, 1));
    CHECK_EQ_INT(stop_text_push(&st, "a</en", 5, &out), 0);
    CHECK_EQ_INT(out.n, 1);
    CHECK(stop_text_flush(&st, &out));
    CHECK(out.n == 5 && memcmp(out.p, "a</en", 5) == 0);
    stop_text_free(&st);
    text_buf_free(&out);
}

static bool utf8_valid(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (k == 0 || i + k > n) return false;
        for (size_t j = 1; j < k; j++) {
            if (((unsigned char)s[i + j] >> 6) != 2) return false;
        }
        i += k;
    }
    return true;
}

/* On the embedded pair (a real vocabulary): the text deltas are valid UTF-8 and add up to the
 * detokenized tokens; a stop string taken from the middle of that text ends the generation with
 * the text before it, on both paths. */
TEST(engine_text_and_stop_strings) {
    char tp[1024], dp[1024];
    snprintf(tp, sizeof(tp), "%s/target.gguf", DFLASH_MODEL_DIR);
    snprintf(dp, sizeof(dp), "%s/drafter.gguf", DFLASH_MODEL_DIR);
    dfl_error err = {0};
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_ctx = 512;
    ep.n_threads = ep.n_threads_batch = 1;
    static char full[2][8192];
    size_t n_full[2] = {0};
    for (int pass = 0; pass < 2; pass++) {
        dfl_engine *e = dfl_engine_new(tp, pass == 0 ? dp : NULL, &ep, &err);
        REQUIRE(e != NULL);
        const dfl_vocab *v = dfl_engine_vocab(e);
        REQUIRE(v != NULL);
        const char *text = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
        int32_t prompt[256];
        const int64_t n_prompt = dfl_tokenize(v, text, strlen(text), prompt, 256, true, false);
        REQUIRE(n_prompt > 0);
        dfl_seq_params sp = dfl_seq_default_params();
        sp.max_tokens = 48;
        REQUIRE(dfl_engine_seq_start(e, 0, prompt, n_prompt, &sp, &err) == DFL_OK);
        static int32_t toks[256];
        int64_t n_toks = 0;
        for (int guard = 0; guard < 200; guard++) {
            dfl_seq_output o;
            dfl_engine_seq_read(e, 0, &o, &err);
            CHECK(utf8_valid(o.text, o.text_len));
            CHECK(strlen(o.text) == o.text_len);
            memcpy(full[pass] + n_full[pass], o.text, o.text_len);
            n_full[pass] += o.text_len;
            for (int64_t j = 0; j < o.n_tokens; j++) toks[n_toks++] = o.tokens[j];
            if (o.state != DFL_SEQ_ACTIVE) break;
            REQUIRE(dfl_engine_step(e, NULL, 0, &err) == DFL_OK);
        }
        CHECK_EQ_INT(n_toks, 48);
        char detok[8192];
        const int64_t nd = dfl_detokenize(v, toks, n_toks, detok, sizeof(detok), false);
        CHECK(nd == (int64_t)n_full[pass] && memcmp(detok, full[pass], (size_t)nd) == 0);
        /* a stop string from the middle of the text */
        REQUIRE(n_full[pass] > 24);
        char stop[8];
        memcpy(stop, full[pass] + n_full[pass] / 2, 5);
        stop[5] = '\0';
        const char *at = strstr(full[pass], stop);
        REQUIRE(at != NULL);
        const size_t want = (size_t)(at - full[pass]);
        const char *stops[1] = {stop};
        sp.stop = stops;
        sp.n_stop = 1;
        REQUIRE(dfl_engine_seq_start(e, 0, prompt, n_prompt, &sp, &err) == DFL_OK);
        char got[8192];
        size_t n_got = 0;
        dfl_seq_output o;
        for (int guard = 0; guard < 200; guard++) {
            dfl_engine_seq_read(e, 0, &o, &err);
            CHECK(strstr(o.text, stop) == NULL);
            memcpy(got + n_got, o.text, o.text_len);
            n_got += o.text_len;
            if (o.state != DFL_SEQ_ACTIVE) break;
            REQUIRE(dfl_engine_step(e, NULL, 0, &err) == DFL_OK);
        }
        CHECK_EQ_INT(o.finish, DFL_FINISH_STOP);
        CHECK_MSG(n_got == want && memcmp(got, full[pass], want) == 0, "pass %d: stop '%s': %zu bytes, want %zu", pass,
                  stop, n_got, want);
        dfl_engine_free(e);
    }
    /* speculative and plain give the same text */
    CHECK(n_full[0] == n_full[1] && memcmp(full[0], full[1], n_full[0]) == 0);
}

/* The CLI on the embedded pair: with penalties on, greedy speculative output equals --no-spec
 * (the drafter used to drop --repeat-penalty), and the penalties change the text; --stop ends the
 * text before the stop string. */
TEST(engine_cli_penalties_and_stop) {
    char cmd[1024], a[16384], b[16384], c[16384];
    const char *base = "generate -p 'The capital of France is' -n 40 -t 1 -tb 1";
    const char *pen = "--repeat-penalty 1.3 --presence-penalty 0.4 --frequency-penalty 0.2";
    snprintf(cmd, sizeof(cmd), "(%s %s %s 2>/dev/null)", test_cli_path(), base, pen);
    REQUIRE(test_run(cmd, a, sizeof(a)) == 0);
    snprintf(cmd, sizeof(cmd), "(%s %s %s --no-spec 2>/dev/null)", test_cli_path(), base, pen);
    REQUIRE(test_run(cmd, b, sizeof(b)) == 0);
    snprintf(cmd, sizeof(cmd), "(%s %s 2>/dev/null)", test_cli_path(), base);
    REQUIRE(test_run(cmd, c, sizeof(c)) == 0);
    CHECK_MSG(strcmp(a, b) == 0, "with penalties, speculative '%s' != --no-spec '%s'", a, b);
    CHECK_MSG(strcmp(a, c) != 0, "the penalties changed nothing: '%s'", a);
    /* --stop: a piece of the penalized text, cut there */
    const size_t n = strlen(a);
    REQUIRE(n > 20);
    char stop[8];
    memcpy(stop, a + n / 2, 4);
    stop[4] = '\0';
    if (strchr(stop, '\'') != NULL || strchr(stop, '\n') != NULL) return; /* keep the shell quoting simple */
    snprintf(cmd, sizeof(cmd), "(%s %s %s --stop '%s' 2>/dev/null)", test_cli_path(), base, pen, stop);
    REQUIRE(test_run(cmd, b, sizeof(b)) == 0);
    const size_t want = (size_t)(strstr(a, stop) - a);
    CHECK_MSG(strlen(b) == want + 1 && strncmp(a, b, want) == 0, "--stop '%s': '%s'", stop, b);
}

/* logprobs: the speculative engine gives the plain engine's tokens, logprobs and top
 * alternatives (the target's distribution at each committed slot), greedy and sampled. */
TEST(engine_logprobs_spec_equals_plain) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", TINY_T " --type f32 --block-size 8 --seed 21", tp, dp, sizeof(tp))) return;
    pair_models m;
    if (!models_open(t, &m, tp, dp)) {
        models_close(&m);
        return;
    }
    oracle o;
    memset(&o, 0, sizeof(o));
    o.n_ref = N_GEN + 64;
    o.n_vocab = NV;
    o.mode = 1; /* oracle drafts: several tokens per step, so logprobs come from many slots */
    static int32_t ref[1][MAXG];
    int32_t prompt[11];
    make_prompt(prompt, 11, 0, 5);
    dfl_error err = {0};
    REQUIRE(tu_greedy(m.rctx, 0, prompt, 11, MAXG, ref[0], &err) == DFL_OK);
    o.ref[0] = ref[0];
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_ctx = 256;
    ep.n_threads = ep.n_threads_batch = 1;
    ep.draft_hook = tu_oracle_hook;
    ep.draft_hook_user = &o;
    for (int sampled = 0; sampled < 2; sampled++) {
        static int32_t tok[2][MAXG], top[2][MAXG * 5];
        static float lp[2][MAXG], toplp[2][MAXG * 5];
        int64_t n[2] = {0, 0};
        int64_t steps = 0, accepted = 0;
        for (int pass = 0; pass < 2; pass++) {
            dfl_engine *e = dfl_engine_new_from_models(m.tm, pass == 0 ? m.dm : NULL, NULL, &ep, &err);
            REQUIRE(e != NULL);
            dfl_seq_params sp = dfl_seq_default_params();
            sp.max_tokens = N_GEN;
            sp.logprobs = true;
            sp.n_top_logprobs = 5;
            if (sampled) {
                sp.sampler.temp = 0.0f; /* greedy with a penalty: the verify batch still returns logits */
                sp.sampler.repeat_penalty = 1.2f;
            }
            o.done[0] = 0;
            REQUIRE(dfl_engine_seq_start(e, 0, prompt, 11, &sp, &err) == DFL_OK);
            for (int guard = 0; guard < 100; guard++) {
                dfl_seq_output so;
                dfl_engine_seq_read(e, 0, &so, &err);
                REQUIRE(so.logprobs != NULL && so.n_top == 5);
                for (int64_t j = 0; j < so.n_tokens; j++, n[pass]++) {
                    tok[pass][n[pass]] = so.tokens[j];
                    lp[pass][n[pass]] = so.logprobs[j];
                    memcpy(&top[pass][n[pass] * 5], so.top_ids + j * 5, 5 * sizeof(int32_t));
                    memcpy(&toplp[pass][n[pass] * 5], so.top_logprobs + j * 5, 5 * sizeof(float));
                }
                o.done[0] = n[pass];
                if (so.state != DFL_SEQ_ACTIVE) break;
                REQUIRE(dfl_engine_step(e, NULL, 0, &err) == DFL_OK);
            }
            if (pass == 0) {
                dfl_seq_stats st;
                dfl_engine_seq_stats(e, 0, &st, &err);
                steps = st.n_steps;
                accepted = st.n_accepted;
            }
            dfl_engine_free(e);
        }
        printf("    %s: %lld tokens, %lld drafts accepted in %lld speculative steps\n", sampled ? "penalized" : "greedy",
               (long long)n[0], (long long)accepted, (long long)steps);
        CHECK(accepted > 0);
        CHECK_EQ_INT(n[0], n[1]);
        CHECK(memcmp(tok[0], tok[1], sizeof(int32_t) * (size_t)n[0]) == 0);
        CHECK(memcmp(top[0], top[1], sizeof(int32_t) * (size_t)n[0] * 5) == 0);
        for (int64_t i = 0; i < n[0]; i++) {
            CHECK_NEAR(lp[0][i], lp[1][i], 1e-5);
            CHECK(lp[0][i] <= 0.0f);
            CHECK(toplp[0][i * 5] >= toplp[0][i * 5 + 4]);
            if (!sampled) CHECK(top[0][i * 5] == tok[0][i]); /* greedy: the token is the most likely */
        }
    }
    models_close(&m);
}

/* A generation that runs into the end of the context finishes with DFL_FINISH_CTX (no error:
 * both contexts were sized for it), its tokens the plain greedy ones. */
TEST(engine_runs_to_the_end_of_the_context) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", TINY_T " --type q8_0 --block-size 8 --seed 4", tp, dp, sizeof(tp))) return;
    pair_models m;
    if (!models_open(t, &m, tp, dp)) {
        models_close(&m);
        return;
    }
    int32_t prompt[10], ref[MAXG];
    make_prompt(prompt, 10, 2, 8);
    dfl_error err = {0};
    REQUIRE(tu_greedy(m.rctx, 0, prompt, 10, MAXG, ref, &err) == DFL_OK);
    for (int pass = 0; pass < 2; pass++) {
        dfl_engine_params ep = dfl_engine_default_params();
        ep.n_ctx = 48;
        ep.n_threads = ep.n_threads_batch = 1;
        dfl_engine *e = dfl_engine_new_from_models(m.tm, pass == 0 ? m.dm : NULL, NULL, &ep, &err);
        REQUIRE(e != NULL);
        dfl_seq_params sp = dfl_seq_default_params(); /* max_tokens 0: until the context is full */
        REQUIRE(dfl_engine_seq_start(e, 0, prompt, 10, &sp, &err) == DFL_OK);
        static int32_t got[1][MAXG];
        int64_t n_got[1] = {0};
        dfl_seq_output o;
        dfl_engine_seq_read(e, 0, &o, &err);
        for (int64_t j = 0; j < o.n_tokens; j++) got[0][n_got[0]++] = o.tokens[j];
        CHECK(run_all(t, e, 1, got, n_got, NULL));
        dfl_engine_seq_read(e, 0, &o, &err);
        CHECK_EQ_INT(o.finish, DFL_FINISH_CTX);
        CHECK_MSG(n_got[0] >= 48 - 10 - 8 - 1, "%s: %lld tokens", pass ? "plain" : "spec", (long long)n_got[0]);
        CHECK(memcmp(got[0], ref, sizeof(int32_t) * (size_t)n_got[0]) == 0);
        dfl_engine_free(e);
    }
    models_close(&m);
}
