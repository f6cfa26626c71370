/* test_spec_sampling.c: losslessness at temperature > 0. Over many seeded runs, the empirical
 * distribution of the tokens generated at fixed positions with speculation (real drafter, and
 * drafts forced to likely tokens so that acceptance AND rejection both happen often) matches the
 * target-only sampler's (two-sample chi-square). A negative control (a different temperature)
 * must be rejected, which shows the test can fail. */
#include "test.h"
#include "test_util.h"
#include "speculative/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NV 640
#define N_RUNS 2500
#define N_POS 3 /* generated positions compared: 1, 2, 3 (2 and 3 come from the first spec step) */

typedef struct setup {
    dfl_model *target, *drafter;
    dfl_context *tctx, *dctx;
} setup;

static bool setup_open(test_ctx *t, setup *s, const char *tp, const char *dp) {
    dfl_error err = {0};
    memset(s, 0, sizeof(*s));
    s->target = dfl_model_load(tp, NULL, &err);
    s->drafter = dfl_model_load(dp, NULL, &err);
    if (!s->target || !s->drafter) { test_fail(t, __FILE__, __LINE__, "%s", err.msg); return false; }
    const dfl_hparams *dh = dfl_model_hparams(s->drafter);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 16;
    cp.n_outputs = 16;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    s->tctx = dfl_context_new(s->target, &cp, &err);
    dfl_context_params dp2 = dfl_context_default_params();
    dp2.target = s->tctx;
    s->dctx = s->tctx ? dfl_context_new(s->drafter, &dp2, &err) : NULL;
    if (!s->dctx) { test_fail(t, __FILE__, __LINE__, "%s", err.msg); return false; }
    return true;
}

static void setup_close(setup *s) {
    dfl_context_free(s->dctx);
    dfl_context_free(s->tctx);
    dfl_model_free(s->drafter);
    dfl_model_free(s->target);
}

static const int32_t k_prompt[5] = {17, 301, 42, 99, 250};

/* Target-only sampling of N_POS tokens with the given seed and temperature. */
static bool sample_plain(setup *s, uint64_t seed, float temp, int32_t out[N_POS]) {
    dfl_error err = {0};
    dfl_sampler_params sp = dfl_sampler_default_params();
    sp.temp = temp;
    sp.top_k = 8;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.0f;
    sp.seed = seed;
    dfl_sampler *smp = dfl_sampler_new(&sp, NV, &err);
    dfl_seq_remove(s->tctx, 0, 0, NULL);
    bool ok = smp != NULL && tu_decode(s->tctx, 0, k_prompt, 5, NULL, &err) == DFL_OK;
    /* tu_decode without outputs: decode the last prompt token again for its logits */
    dfl_seq_remove(s->tctx, 0, 4, NULL);
    float logits[NV];
    ok = ok && tu_decode(s->tctx, 0, &k_prompt[4], 1, logits, &err) == DFL_OK;
    for (int k = 0; ok && k < N_POS; k++) {
        out[k] = dfl_sampler_sample(smp, logits);
        ok = out[k] >= 0 && (k + 1 == N_POS || tu_decode(s->tctx, 0, &out[k], 1, logits, &err) == DFL_OK);
    }
    dfl_sampler_free(smp);
    return ok;
}

typedef struct forced { int32_t tok[N_POS]; bool on; } forced;

static void force_hook(void *user, int32_t seq, int32_t *draft, int32_t n_draft) {
    (void)seq;
    const forced *f = user;
    if (!f->on) return;
    for (int32_t j = 0; j < n_draft && j + 1 < N_POS; j++) draft[j] = f->tok[j + 1];
}

/* adapt: the adaptive draft length from 1 and the drafter-probability cut at 0.05 (draft lengths
 * 0..3 chosen from the drafter's own probabilities) */
static bool sample_spec_p(setup *s, uint64_t seed, forced *f, bool adapt, float p_min, int32_t out[N_POS]) {
    dfl_error err = {0};
    spec_params sp = spec_default_params();
    sp.n_draft_min = adapt ? 1 : 0;
    sp.draft_p_min = adapt ? p_min : 0.0f;
    sp.temp = 1.0f;
    sp.top_k = 8;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = seed;
    sp.n_draft = 3;
    sp.draft_hook = force_hook;
    sp.draft_hook_user = f;
    spec_session *spec = spec_new(s->tctx, s->dctx, &sp, &err);
    if (spec == NULL) return false;
    spec_seq_reset(spec, 0);
    int32_t first, seq = 0, toks[8], n = 0, got = 0;
    bool ok = spec_prefill(spec, 0, k_prompt, 5, &first, &err) == DFL_OK;
    if (ok) out[got++] = first;
    while (ok && got < N_POS) {
        ok = spec_step(spec, 1, &seq, toks, &n, &err) == DFL_OK;
        for (int32_t j = 0; ok && j < n && got < N_POS; j++) out[got++] = toks[j];
    }
    spec_seq_reset(spec, 0);
    spec_free(spec);
    return ok;
}

static bool sample_spec(setup *s, uint64_t seed, forced *f, bool adapt, int32_t out[N_POS]) {
    return sample_spec_p(s, seed, f, adapt, 0.05f, out);
}

/* Two-sample chi-square over NV bins (bins with few counts merged); returns the statistic and
 * the degrees of freedom. */
static double chi2_two_sample(const int *a, const int *b, int n_bins, int *df) {
    double stat = 0;
    int used = 0, pa = 0, pb = 0;
    long na = 0, nb = 0;
    for (int i = 0; i < n_bins; i++) { na += a[i]; nb += b[i]; }
    const double ka = sqrt((double)nb / (double)na), kb = sqrt((double)na / (double)nb);
    for (int i = 0; i < n_bins; i++) {
        pa += a[i];
        pb += b[i];
        if (pa + pb < 20 && i + 1 < n_bins) continue; /* merge small bins into the next */
        if (pa + pb > 0) {
            const double d = ka * pa - kb * pb;
            stat += d * d / (double)(pa + pb);
            used++;
        }
        pa = pb = 0;
    }
    *df = used - 1;
    return stat;
}

/* Upper critical value of chi-square(df) at p = 1e-4 (Wilson-Hilferty). */
static double chi2_crit(int df) {
    const double z = 3.719; /* one-sided 1e-4 */
    const double k = (double)df;
    const double c = 1.0 - 2.0 / (9.0 * k) + z * sqrt(2.0 / (9.0 * k));
    return k * c * c * c;
}

TEST(spec_sampling_is_lossless) {
    char tp[512], dp[512];
    /* larger weights so that the top-8 distribution is far from uniform */
    if (!tu_make_models(t, "m", "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 "
                        "--type f32 --block-size 4 --std 0.2 --seed 9", tp, dp, sizeof(tp))) return;
    setup s;
    if (!setup_open(t, &s, tp, dp)) { setup_close(&s); return; }
    static int plain[N_POS][NV], hot[N_POS][NV], spec_real[N_POS][NV], spec_forced[N_POS][NV], spec_adapt[N_POS][NV];
    memset(plain, 0, sizeof(plain));
    memset(hot, 0, sizeof(hot));
    memset(spec_real, 0, sizeof(spec_real));
    memset(spec_forced, 0, sizeof(spec_forced));
    memset(spec_adapt, 0, sizeof(spec_adapt));
    int32_t o[N_POS];
    bool ok = true;
    for (int r = 0; ok && r < N_RUNS; r++) {
        ok = sample_plain(&s, 1000 + (uint64_t)r, 1.0f, o);
        for (int k = 0; ok && k < N_POS; k++) plain[k][o[k]]++;
        ok = ok && sample_plain(&s, 900000 + (uint64_t)r, 3.0f, o);
        for (int k = 0; ok && k < N_POS; k++) hot[k][o[k]]++;
    }
    /* forced drafts: the most frequent target-only token at each position */
    forced f;
    f.on = true;
    for (int k = 0; k < N_POS; k++) {
        int best = 0;
        for (int v = 1; v < NV; v++) if (plain[k][v] > plain[k][best]) best = v;
        f.tok[k] = best;
    }
    forced off = {{0}, false};
    for (int r = 0; ok && r < N_RUNS; r++) {
        ok = sample_spec(&s, 5000000 + (uint64_t)r, &off, false, o);
        for (int k = 0; ok && k < N_POS; k++) spec_real[k][o[k]]++;
        ok = ok && sample_spec(&s, 7000000 + (uint64_t)r, &f, false, o);
        for (int k = 0; ok && k < N_POS; k++) spec_forced[k][o[k]]++;
        ok = ok && sample_spec(&s, 8000000 + (uint64_t)r, &off, true, o);
        for (int k = 0; ok && k < N_POS; k++) spec_adapt[k][o[k]]++;
    }
    REQUIRE(ok);
    for (int k = 0; k < N_POS; k++) {
        int df1, df2, df3, df4;
        double c4 = chi2_two_sample(plain[k], spec_adapt[k], NV, &df4);
        double c1 = chi2_two_sample(plain[k], spec_real[k], NV, &df1);
        double c2 = chi2_two_sample(plain[k], spec_forced[k], NV, &df2);
        double c3 = chi2_two_sample(plain[k], hot[k], NV, &df3);
        printf("    position %d: chi2 plain vs spec(real drafter) %.1f (df %d, crit %.1f); vs spec(forced drafts) %.1f "
               "(df %d); negative control T=3: %.1f (df %d, crit %.1f)\n",
               k + 1, c1, df1, chi2_crit(df1), c2, df2, c3, df3, chi2_crit(df3));
        CHECK_MSG(df1 >= 2 && c1 < chi2_crit(df1), "position %d: speculative (real drafter) distribution differs", k + 1);
        CHECK_MSG(df2 >= 2 && c2 < chi2_crit(df2), "position %d: speculative (forced drafts) distribution differs", k + 1);
        printf("    position %d: chi2 plain vs spec(adaptive length, p_min 0.05) %.1f (df %d, crit %.1f)\n", k + 1, c4, df4,
               chi2_crit(df4));
        CHECK_MSG(df4 >= 2 && c4 < chi2_crit(df4), "position %d: speculative (adaptive, p_min) distribution differs", k + 1);
        if (k < 2) CHECK_MSG(c3 > chi2_crit(df3), "position %d: the negative control was not detected", k + 1);
    }
    setup_close(&s);
}

/* Through the engine with penalties on (repetition, presence, frequency): N_POS tokens of one
 * run with the given seed; dm NULL: plain decoding. The engine is reused across runs (its
 * prefix reuse decodes only the last prompt token). */
static bool engine_sample(dfl_engine *e, uint64_t seed, bool penalties, int32_t out[N_POS]) {
    dfl_error err = {0};
    dfl_seq_params sp = dfl_seq_default_params();
    sp.sampler.temp = 1.0f;
    sp.sampler.top_k = 8;
    sp.sampler.top_p = 1.0f;
    sp.sampler.min_p = 0.0f;
    if (penalties) {
        sp.sampler.repeat_penalty = 2.0f;
        sp.sampler.presence_penalty = 1.0f;
        sp.sampler.frequency_penalty = 0.5f;
        sp.sampler.repeat_last_n = 64;
    }
    sp.sampler.seed = seed;
    sp.max_tokens = N_POS;
    if (dfl_engine_seq_start(e, 0, k_prompt, 5, &sp, &err) != DFL_OK) return false;
    int got = 0;
    for (int guard = 0; guard < 16; guard++) {
        dfl_seq_output o;
        dfl_engine_seq_read(e, 0, &o, &err);
        for (int64_t j = 0; j < o.n_tokens && got < N_POS; j++) out[got++] = o.tokens[j];
        if (o.state != DFL_SEQ_ACTIVE) break;
        if (dfl_engine_step(e, NULL, 0, &err) != DFL_OK) return false;
    }
    return got == N_POS;
}

TEST(spec_sampling_penalties_lossless) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 "
                        "--type f32 --block-size 4 --std 0.2 --seed 9", tp, dp, sizeof(tp))) return;
    dfl_error err = {0};
    dfl_model *tm = dfl_model_load(tp, NULL, &err), *dm = dfl_model_load(dp, NULL, &err);
    REQUIRE(tm != NULL && dm != NULL);
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_ctx = 64;
    ep.n_threads = ep.n_threads_batch = 1;
    ep.n_draft = 3;
    forced f = {{0}, false};
    ep.draft_hook = force_hook;
    ep.draft_hook_user = &f;
    dfl_engine *plain = dfl_engine_new_from_models(tm, NULL, NULL, &ep, &err);
    dfl_engine *spec = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    REQUIRE(plain != NULL && spec != NULL);
    static int pl[N_POS][NV], nopen[N_POS][NV], sreal[N_POS][NV], sforced[N_POS][NV];
    memset(pl, 0, sizeof(pl));
    memset(nopen, 0, sizeof(nopen));
    memset(sreal, 0, sizeof(sreal));
    memset(sforced, 0, sizeof(sforced));
    int32_t o[N_POS];
    bool ok = true;
    for (int r = 0; ok && r < N_RUNS; r++) {
        ok = engine_sample(plain, 1000 + (uint64_t)r, true, o);
        for (int k = 0; ok && k < N_POS; k++) pl[k][o[k]]++;
        ok = ok && engine_sample(plain, 300000 + (uint64_t)r, false, o);
        for (int k = 0; ok && k < N_POS; k++) nopen[k][o[k]]++;
    }
    for (int k = 0; k < N_POS; k++) {
        int best = 0;
        for (int v = 1; v < NV; v++) if (pl[k][v] > pl[k][best]) best = v;
        f.tok[k] = best;
    }
    for (int r = 0; ok && r < N_RUNS; r++) {
        f.on = false;
        ok = engine_sample(spec, 5000000 + (uint64_t)r, true, o);
        for (int k = 0; ok && k < N_POS; k++) sreal[k][o[k]]++;
        f.on = true;
        ok = ok && engine_sample(spec, 7000000 + (uint64_t)r, true, o);
        for (int k = 0; ok && k < N_POS; k++) sforced[k][o[k]]++;
    }
    CHECK_MSG(ok, "%s", err.msg);
    const dfl_engine_stats es = dfl_engine_get_stats(spec);
    printf("    penalties on: the speculative engine accepted %lld of %lld drafts\n", (long long)es.n_accepted,
           (long long)es.n_draft_tokens);
    CHECK(es.n_accepted > 0 && es.n_accepted < es.n_draft_tokens); /* both acceptance and rejection happened */
    for (int k = 0; k < N_POS; k++) {
        int df1, df2, df3;
        const double c1 = chi2_two_sample(pl[k], sreal[k], NV, &df1);
        const double c2 = chi2_two_sample(pl[k], sforced[k], NV, &df2);
        const double c3 = chi2_two_sample(pl[k], nopen[k], NV, &df3);
        printf("    position %d, penalties on: chi2 plain vs spec(real drafter) %.1f (df %d, crit %.1f); vs spec(forced "
               "drafts) %.1f (df %d, crit %.1f); negative control without penalties %.1f (df %d, crit %.1f)\n",
               k + 1, c1, df1, chi2_crit(df1), c2, df2, chi2_crit(df2), c3, df3, chi2_crit(df3));
        CHECK_MSG(df1 >= 2 && c1 < chi2_crit(df1), "position %d: speculative (real drafter) with penalties differs", k + 1);
        CHECK_MSG(df2 >= 2 && c2 < chi2_crit(df2), "position %d: speculative (forced drafts) with penalties differs", k + 1);
        /* position 2 is the first whose window holds a generated token (the prompt's tokens are
         * rarely among the top 8): there dropping the penalties must be detected */
        if (k == 1) CHECK_MSG(c3 > chi2_crit(df3), "position %d: dropping the penalties was not detected", k + 1);
    }
    dfl_engine_free(spec);
    dfl_engine_free(plain);
    dfl_model_free(dm);
    dfl_model_free(tm);
}

/* ---- DFlash2 (docs/drafter.md "DFlash2") ---------------------------------------------------------- */

/* A DFlash2 drafter's deterministic lattice walk is a point-mass proposal: with the standard
 * rejection rule (q = one-hot on the draft) the sampled output is distributed exactly as the
 * target's, with the whole walk and with the walk's own p_min cut. */
TEST(spec_sampling_dflash2_lossless) {
    char tp[512], dp[512];
    if (!tu_make_models(t, "m", "--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 "
                        "--type f32 --block-size 4 --std 0.2 --seed 9 --dflash2 2,8,16,4", tp, dp, sizeof(tp))) return;
    setup s;
    if (!setup_open(t, &s, tp, dp)) { setup_close(&s); return; }
    static int plain[N_POS][NV], walk[N_POS][NV], walk_cut[N_POS][NV], forced_cut[N_POS][NV];
    memset(plain, 0, sizeof(plain));
    memset(forced_cut, 0, sizeof(forced_cut));
    memset(walk, 0, sizeof(walk));
    memset(walk_cut, 0, sizeof(walk_cut));
    int32_t o[N_POS];
    forced off = {{0}, false};
    bool ok = true;
    for (int r = 0; ok && r < N_RUNS; r++) {
        ok = sample_plain(&s, 1000 + (uint64_t)r, 1.0f, o);
        for (int k = 0; ok && k < N_POS; k++) plain[k][o[k]]++;
    }
    /* random weights: the walk's own drafts are rarely accepted, so a third run replaces them
     * with likely tokens (acceptance and rejection both frequent) while the cut still comes from
     * the walk's probabilities */
    forced f;
    f.on = true;
    for (int k = 0; k < N_POS; k++) {
        int best = 0;
        for (int v = 1; v < NV; v++) if (plain[k][v] > plain[k][best]) best = v;
        f.tok[k] = best;
    }
    for (int r = 0; ok && r < N_RUNS; r++) {
        ok = sample_spec_p(&s, 7000000 + (uint64_t)r, &f, true, 0.6f, o);
        for (int k = 0; ok && k < N_POS; k++) forced_cut[k][o[k]]++;
        ok = ok && sample_spec(&s, 5000000 + (uint64_t)r, &off, false, o);
        for (int k = 0; ok && k < N_POS; k++) walk[k][o[k]]++;
        ok = ok && sample_spec_p(&s, 8000000 + (uint64_t)r, &off, true, 0.6f, o);
        for (int k = 0; ok && k < N_POS; k++) walk_cut[k][o[k]]++;
    }
    REQUIRE(ok);
    for (int k = 0; k < N_POS; k++) {
        int df1, df2, df3;
        const double c1 = chi2_two_sample(plain[k], walk[k], NV, &df1);
        const double c2 = chi2_two_sample(plain[k], walk_cut[k], NV, &df2);
        const double c3 = chi2_two_sample(plain[k], forced_cut[k], NV, &df3);
        printf("    position %d: chi2 plain vs DFlash2 walk %.1f (df %d, crit %.1f); vs walk with p_min 0.6 and adaptive "
               "length %.1f (df %d, crit %.1f)\n", k + 1, c1, df1, chi2_crit(df1), c2, df2, chi2_crit(df2));
        CHECK_MSG(df1 >= 2 && c1 < chi2_crit(df1), "position %d: DFlash2 speculative distribution differs", k + 1);
        CHECK_MSG(df2 >= 2 && c2 < chi2_crit(df2), "position %d: DFlash2 (p_min, adaptive) distribution differs", k + 1);
        printf("    position %d: chi2 plain vs forced drafts cut by the walk's p_min %.1f (df %d, crit %.1f)\n", k + 1, c3,
               df3, chi2_crit(df3));
        CHECK_MSG(df3 >= 2 && c3 < chi2_crit(df3), "position %d: DFlash2 (forced drafts, walk p_min) distribution differs",
                  k + 1);
    }
    setup_close(&s);
}
