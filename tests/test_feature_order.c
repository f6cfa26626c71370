/* test_feature_order.c: the feature-buffer ordering protocol (docs/feature-protocol.md) on asynchronous
 * CPU queues (a worker thread per queue, like GPU streams) with random delays injected into the
 * workers: over 1,000+ speculative steps on several sequences, the drafts (which depend on the
 * features the drafter read) and the outputs equal a synchronous run's. With a test-only fault
 * that skips the `read` or the `written` wait, the same comparison must detect corrupted
 * features. Runs under ThreadSanitizer in `make tsan`. */
#include "test.h"
#include "test_util.h"
#include "speculative/session.h"
#include "backend/backend.h"
#include "model/context.h"

#include <stdlib.h>
#include <string.h>

#define N_SEQ 4
#define PROMPT 70     /* several prompt chunks of n_batch 16: the async prefill path */
#define STEPS 260     /* x N_SEQ sequences = 1040 speculative steps */

typedef struct draft_log {
    int32_t *tok;  /* every draft token proposed, in order */
    int64_t n, cap;
} draft_log;

static void log_hook(void *user, int32_t seq, int32_t *draft, int32_t n_draft) {
    draft_log *l = user;
    for (int32_t j = 0; j < n_draft && l->n < l->cap; j++) l->tok[l->n++] = draft[j] + seq * 100000;
}

typedef struct run_result {
    draft_log drafts;
    int32_t out[N_SEQ][STEPS * 8 + 8];
    int64_t n_out[N_SEQ];
    int64_t n_steps;
    char path[16];
} run_result;

/* delays (us): 0 = none; the target's and the drafter's queue workers separately */
typedef struct delays { uint32_t target, drafter; } delays;

static bool run(test_ctx *t, const char *tp, const char *dp, bool async, delays dl, uint32_t faults, int steps,
                run_result *r) {
    dfl_error err = {0};
    memset(r->n_out, 0, sizeof(r->n_out));
    r->drafts.n = 0;
    dfl_model *tm = dfl_model_load(tp, NULL, &err), *dm = dfl_model_load(dp, NULL, &err);
    if (!tm || !dm) { test_fail(t, __FILE__, __LINE__, "%s", err.msg); return false; }
    const dfl_hparams *dh = dfl_model_hparams(dm);
    backend_cpu_params bp = backend_cpu_default_params();
    bp.n_threads = 1;
    bp.n_threads_batch = 1;
    bp.async = async;
    bp.debug_max_delay_us = async ? 150 : 0;
    bp.debug_seed = 12345;
    backend *bt = backend_cpu_new(&bp, &err); /* one backend, two queues (two workers when async) */
    dfl_context_params cp = dfl_context_default_params();
    cp.n_seq = N_SEQ;
    cp.n_ctx = PROMPT + STEPS * 8 + 32;
    cp.n_batch = 16;
    cp.n_outputs = 16;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    dfl_context *tc = bt ? context_new_on(tm, &cp, bt, &err) : NULL;
    dfl_context_params dpp = dfl_context_default_params();
    dpp.n_seq = N_SEQ;
    dpp.target = tc;
    dfl_context *dc = tc ? context_new_on(dm, &dpp, bt, &err) : NULL;
    spec_params sp = spec_default_params();
    sp.n_draft = 3;
    sp.draft_hook = log_hook;
    sp.draft_hook_user = &r->drafts;
    spec_session *spec = dc ? spec_new(tc, dc, &sp, &err) : NULL;
    bool ok = spec != NULL;
    if (!ok) test_fail(t, __FILE__, __LINE__, "setup: %s", err.msg);
    if (ok) {
        snprintf(r->path, sizeof(r->path), "%s", spec_feature_path_name(spec));
        context_test_set_faults(tc, faults);
        if (async) {
            backend_cpu_queue_set_test_delay(tc->queue, dl.target);
            backend_cpu_queue_set_test_delay(dc->queue, dl.drafter);
        }
    }
    for (int s = 0; ok && s < N_SEQ; s++) {
        int32_t prompt[PROMPT + N_SEQ], first;
        for (int i = 0; i < PROMPT + s; i++) prompt[i] = (int32_t)((i * 37 + s * 101 + 7) % 600);
        ok = spec_prefill(spec, s, prompt, PROMPT + s, &first, &err) == DFL_OK;
        r->out[s][r->n_out[s]++] = first;
    }
    int32_t seqs[N_SEQ] = {0, 1, 2, 3}, toks[N_SEQ * 4], n_tok[N_SEQ];
    for (int k = 0; ok && k < steps; k++) {
        ok = spec_step(spec, N_SEQ, seqs, toks, n_tok, &err) == DFL_OK;
        for (int s = 0; ok && s < N_SEQ; s++) {
            for (int j = 0; j < n_tok[s]; j++) r->out[s][r->n_out[s]++] = toks[s * 4 + j];
        }
    }
    if (!ok) test_fail(t, __FILE__, __LINE__, "run: %s", err.msg);
    r->n_steps = spec ? spec_get_stats(spec).n_steps : 0;
    spec_free(spec);
    dfl_context_free(dc);
    dfl_context_free(tc);
    backend_free(bt);
    dfl_model_free(dm);
    dfl_model_free(tm);
    return ok;
}

static bool same_drafts(const run_result *a, const run_result *b) {
    return a->drafts.n == b->drafts.n && memcmp(a->drafts.tok, b->drafts.tok, (size_t)a->drafts.n * sizeof(int32_t)) == 0;
}

/* Outputs agree on their common prefix (runs with other drafts accept other counts, so after the
 * same number of steps their lengths differ; the tokens never may). exact: lengths equal too. */
static bool same_outputs(const run_result *a, const run_result *b, bool exact) {
    for (int s = 0; s < N_SEQ; s++) {
        const int64_t n = a->n_out[s] < b->n_out[s] ? a->n_out[s] : b->n_out[s];
        if (exact && a->n_out[s] != b->n_out[s]) return false;
        if (memcmp(a->out[s], b->out[s], (size_t)n * sizeof(int32_t)) != 0) return false;
    }
    return true;
}

static run_result *result_new(void) {
    run_result *r = calloc(1, sizeof(*r));
    r->drafts.cap = (int64_t)N_SEQ * STEPS * 4;
    r->drafts.tok = calloc((size_t)r->drafts.cap, sizeof(int32_t));
    return r;
}

static void result_free(run_result *r) {
    if (r) free(r->drafts.tok);
    free(r);
}

#define MODELS "--n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 " \
               "--type q8_0 --block-size 4 --std 0.1 --seed 4"

TEST(feature_order_async_queues_match_sync) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", MODELS, tp, dp, sizeof(tp))) return;
    run_result *a = result_new(), *b = result_new();
    const delays none = {0, 0};
    REQUIRE(run(t, tp, dp, false, none, 0, STEPS, a));
    const delays cases[3] = {{100, 100}, {0, 600}, {600, 0}}; /* random both; a slow drafter; a slow target */
    for (int c = 0; c < 3; c++) {
        const int steps = c == 0 ? STEPS : 8; /* the slow-queue cases stress the prefill chunks */
        REQUIRE(run(t, tp, dp, true, cases[c], 0, steps, b));
        const bool drafts_ok = c == 0 ? same_drafts(a, b)
                                      : b->drafts.n > 0 && memcmp(a->drafts.tok, b->drafts.tok,
                                                                  (size_t)b->drafts.n * sizeof(int32_t)) == 0;
        printf("    async, delays <= %u/%u us: %lld speculative steps on %d sequences, feature path %s: drafts %s, "
               "outputs %s\n", cases[c].target, cases[c].drafter, (long long)b->n_steps, N_SEQ, b->path,
               drafts_ok ? "identical" : "DIFFER", same_outputs(a, b, c == 0) ? "identical" : "DIFFER");
        if (c == 0) CHECK(b->n_steps >= 1000);
        CHECK(strcmp(b->path, "device") == 0);
        CHECK(drafts_ok);
        CHECK(same_outputs(a, b, c == 0));
    }
    result_free(a);
    result_free(b);
}

TEST(feature_order_missing_wait_is_detected) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", MODELS, tp, dp, sizeof(tp))) return;
    run_result *a = result_new(), *b = result_new(), *c = result_new();
    const delays none = {0, 0}, slow_drafter = {0, 600}, slow_target = {600, 0};
    REQUIRE(run(t, tp, dp, false, none, 0, 8, a));
    /* without the `read` wait a slow drafter still reads rows the target's next chunk overwrites;
     * without the `written` wait the drafter reads rows a slow target has not written yet */
    REQUIRE(run(t, tp, dp, true, slow_drafter, CTX_FAULT_SKIP_READ_WAIT, 8, b));
    REQUIRE(run(t, tp, dp, true, slow_target, CTX_FAULT_SKIP_WRITTEN_WAIT, 8, c));
    printf("    skip `read` wait: drafts %s; skip `written` wait: drafts %s (outputs stay lossless: %s, %s)\n",
           same_drafts(a, b) ? "identical (NOT detected)" : "differ (detected)",
           same_drafts(a, c) ? "identical (NOT detected)" : "differ (detected)", same_outputs(a, b, false) ? "yes" : "no",
           same_outputs(a, c, false) ? "yes" : "no");
    CHECK(!same_drafts(a, b));
    CHECK(!same_drafts(a, c));
    /* the verification keeps the output exact even with a corrupted drafter */
    CHECK(same_outputs(a, b, false));
    CHECK(same_outputs(a, c, false));
    result_free(a);
    result_free(b);
    result_free(c);
}
