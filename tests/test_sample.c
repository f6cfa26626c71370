/* test_sample.c: the sampler (greedy, top-k/top-p/min-p/temperature against hand-computed
 * distributions, repetition penalty, seeding, chi-square of the draws) and the lossless
 * speculative verification rule (greedy = argmax rule; emitted-token distributions = target). */
#include "test.h"

#include "base/error.h"
#include "sample/rng.h"
#include "sample/sampler.h"
#include "sample/spec_verify.h"

#include <math.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------- */

static dfl_sampler_params params_plain(float temp) {
    dfl_sampler_params p = dfl_sampler_default_params();
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 0;
    p.seed = 1234;
    return p;
}

/* Critical value of chi-square with df degrees of freedom at z = 5 standard deviations
 * (one-sided p ~ 3e-7), by the Wilson-Hilferty approximation: a fixed-seed test that only fails
 * when the distribution is really wrong. */
static double chi2_critical(int64_t df) {
    const double z = 5.0, a = 2.0 / (9.0 * (double)df);
    const double c = 1.0 - a + z * sqrt(a);
    return (double)df * c * c * c;
}

/* Pearson statistic of counts [k] against probabilities [k] for n draws; bins with an expected
 * count below 5 are pooled. Returns the statistic and sets *df. A draw in a zero-probability bin
 * returns +inf. */
static double chi2_stat(const int64_t *counts, const double *probs, int64_t k, int64_t n, int64_t *df) {
    double stat = 0.0, pool_e = 0.0, pool_o = 0.0;
    int64_t bins = 0;
    for (int64_t j = 0; j < k; j++) {
        const double e = probs[j] * (double)n;
        if (probs[j] <= 0.0) {
            if (counts[j] != 0) return INFINITY;
            continue;
        }
        if (e < 5.0) {
            pool_e += e;
            pool_o += (double)counts[j];
            continue;
        }
        stat += ((double)counts[j] - e) * ((double)counts[j] - e) / e;
        bins++;
    }
    if (pool_e > 0.0) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    }
    *df = bins > 1 ? bins - 1 : 1;
    return stat;
}

/* ---- rng ------------------------------------------------------------------------------------ */

TEST(sample_rng_reference_values) {
    /* xoshiro256** seeded with splitmix64, values from an independent transliteration of the
     * published algorithms */
    sample_rng r;
    rng_seed(&r, 0);
    CHECK(r.s[0] == 0xE220A8397B1DCDAFull); /* the well-known first splitmix64 output for 0 */
    CHECK(rng_next_u64(&r) == 0x99ec5f36cb75f2b4ull);
    CHECK(rng_next_u64(&r) == 0xbf6e1f784956452aull);
    CHECK(rng_next_u64(&r) == 0x1a5f849d4933e6e0ull);
    rng_seed(&r, 42);
    CHECK(rng_next_u64(&r) == 0x15780b2e0c2ec716ull);
    CHECK(rng_next_u64(&r) == 0x6104d9866d113a7eull);
    double lo = 1.0, hi = 0.0;
    for (int i = 0; i < 10000; i++) {
        const double u = rng_uniform(&r);
        CHECK(u >= 0.0 && u < 1.0);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    CHECK(lo < 0.001 && hi > 0.999);
    const float w[4] = {0.0f, 2.0f, 0.0f, 0.0f};
    for (int i = 0; i < 100; i++) CHECK_EQ_INT(rng_pick(&r, w, 4, 2.0), 1);
    const float z[3] = {0.0f, 0.0f, 0.0f};
    CHECK_EQ_INT(rng_pick(&r, z, 3, 1.0), -1);
}

/* ---- sampler --------------------------------------------------------------------------------- */

TEST(sample_greedy_argmax_ties) {
    dfl_error err;
    error_clear(&err);
    dfl_sampler_params p = params_plain(0.0f);
    p.top_k = 1; /* filters do not matter for greedy */
    dfl_sampler *s = dfl_sampler_new(&p, 8, &err);
    REQUIRE(s != NULL);
    const float l1[8] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 3.0f, 0.0f, -5.0f};
    CHECK_EQ_INT(dfl_sampler_sample(s, l1), 1); /* tie between 1, 3 and 5: lowest id */
    const float l2[8] = {-INFINITY, -2.0f, -1.0f, -1.0f, -INFINITY, -7.0f, -1.5f, -3.0f};
    CHECK_EQ_INT(dfl_sampler_sample(s, l2), 2);
    const float l3[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -100.0f};
    CHECK_EQ_INT(dfl_sampler_sample(s, l3), 7);
    float pr[8];
    REQUIRE(sampler_probs(s, l1, pr, &err) == DFL_OK);
    for (int j = 0; j < 8; j++) CHECK(pr[j] == (j == 1 ? 1.0f : 0.0f)); /* exact one-hot */
    /* greedy uses no random numbers */
    const sample_rng before = *sampler_rng(s);
    for (int i = 0; i < 10; i++) dfl_sampler_sample(s, l1);
    CHECK(memcmp(&before, sampler_rng(s), sizeof(before)) == 0);
    dfl_sampler_free(s);
    p.temp = -1.0f; /* negative temperature is greedy too */
    s = dfl_sampler_new(&p, 8, &err);
    REQUIRE(s != NULL);
    CHECK_EQ_INT(dfl_sampler_sample(s, l1), 1);
    dfl_sampler_free(s);
}

/* sampler_probs for logits L with params p, compared with the expected vector. */
static void check_probs(test_ctx *t, const char *what, const dfl_sampler_params *p, const float *expected) {
    static const float L[6] = {2.0f, 1.0f, 0.0f, 3.0f, -1.0f, 1.0f};
    dfl_error err;
    error_clear(&err);
    dfl_sampler *s = dfl_sampler_new(p, 6, &err);
    CHECK_MSG(s != NULL, "%s: %s", what, err.msg);
    if (s == NULL) return;
    float pr[6];
    const dfl_status st = sampler_probs(s, L, pr, &err);
    CHECK_MSG(st == DFL_OK, "%s: %s", what, err.msg);
    double sum = 0.0;
    for (int j = 0; j < 6; j++) {
        sum += pr[j];
        CHECK_MSG(fabs(pr[j] - expected[j]) < 1e-6, "%s: token %d: %.9f, expected %.9f", what, j, (double)pr[j],
                  (double)expected[j]);
        if (expected[j] == 0.0f) CHECK_MSG(pr[j] == 0.0f, "%s: token %d should be removed", what, j);
    }
    CHECK_NEAR(sum, 1.0, 1e-6);
    dfl_sampler_free(s);
}

TEST(sample_filters_hand_computed) {
    /* logits L = {2, 1, 0, 3, -1, 1}; expected values computed by hand (numpy) */
    dfl_sampler_params p = params_plain(1.0f);
    const float plain[6] = {0.215556122f, 0.079298666f, 0.029172349f, 0.585942290f, 0.010731907f, 0.079298666f};
    check_probs(t, "temp 1", &p, plain);

    p = params_plain(1.0f);
    p.top_k = 2;
    const float k2[6] = {0.268941421f, 0, 0, 0.731058579f, 0, 0};
    check_probs(t, "top_k 2", &p, k2);

    p.top_k = 3; /* tokens 1 and 5 tie at 1.0: the lower id stays */
    const float k3[6] = {0.244728471f, 0.090030573f, 0, 0.665240956f, 0, 0};
    check_probs(t, "top_k 3", &p, k3);

    p = params_plain(1.0f);
    p.top_p = 0.85f; /* cumulative 0.586, 0.802, 0.881 -> 3 tokens (1 before 5) */
    check_probs(t, "top_p 0.85", &p, k3);
    p.top_p = 0.7f;
    check_probs(t, "top_p 0.7", &p, k2);
    p.top_p = 0.5f;
    const float only3[6] = {0, 0, 0, 1.0f, 0, 0};
    check_probs(t, "top_p 0.5", &p, only3);
    p.top_p = 0.0f;
    check_probs(t, "top_p 0 keeps one", &p, only3);

    p = params_plain(1.0f);
    p.min_p = 0.1f; /* keep p >= 0.1 * 0.586 */
    const float m01[6] = {0.224515236f, 0.082594539f, 0, 0.610295685f, 0, 0.082594539f};
    check_probs(t, "min_p 0.1", &p, m01);
    p.min_p = 0.3f;
    check_probs(t, "min_p 0.3", &p, k2);
    p.min_p = 1.0f;
    check_probs(t, "min_p 1", &p, only3);

    p = params_plain(0.5f);
    p.top_k = 3;
    const float t05[6] = {0.117310428f, 0.015876240f, 0, 0.866813332f, 0, 0};
    check_probs(t, "temp 0.5 top_k 3", &p, t05);

    /* order: top-p acts before the temperature (at temp 0.25 token 3 alone would hold 0.98) */
    p = params_plain(0.25f);
    p.top_p = 0.7f;
    const float t025[6] = {0.017986210f, 0, 0, 0.982013790f, 0, 0};
    check_probs(t, "temp 0.25 top_p 0.7", &p, t025);

    /* order: top-p normalizes over the top-k set: top_k 2 gives token 3 0.731 >= 0.7 */
    p = params_plain(1.0f);
    p.top_k = 2;
    p.top_p = 0.7f;
    check_probs(t, "top_k 2 top_p 0.7", &p, only3);

    /* top-p then min-p: top_p 0.7 keeps {3, 0} (mass over the whole set), min_p 0.3 keeps {3, 0} */
    p = params_plain(1.0f);
    p.top_p = 0.7f;
    p.min_p = 0.3f;
    check_probs(t, "top_p 0.7 min_p 0.3", &p, k2);
    /* top_k 4 -> {3,0,1,5}; top_p 0.9 -> {3,0,1}; min_p 0.2 -> {3,0}; temp 2 */
    p = params_plain(2.0f);
    p.top_k = 4;
    p.top_p = 0.9f;
    p.min_p = 0.2f;
    const float all4[6] = {0.377540669f, 0, 0, 0.622459331f, 0, 0};
    check_probs(t, "top_k 4 top_p 0.9 min_p 0.2 temp 2", &p, all4);
}

TEST(sample_top_k_large_vocab) {
    /* quickselect on a larger vocabulary with many ties: the kept set is the k best by
     * (logit desc, id asc) */
    enum { V = 1000 };
    static float l[V];
    for (int j = 0; j < V; j++) l[j] = (float)((j * 37) % 101) / 10.0f; /* values repeat ~10 times */
    dfl_error err;
    error_clear(&err);
    dfl_sampler_params p = params_plain(1.0f);
    p.top_k = 25;
    dfl_sampler *s = dfl_sampler_new(&p, V, &err);
    REQUIRE(s != NULL);
    static float pr[V];
    REQUIRE(sampler_probs(s, l, pr, &err) == DFL_OK);
    /* reference: count, for each token, how many tokens come before it */
    int n_kept = 0;
    for (int j = 0; j < V; j++) {
        int better = 0;
        for (int i = 0; i < V; i++) better += l[i] > l[j] || (l[i] == l[j] && i < j);
        const bool keep = better < 25;
        n_kept += keep;
        CHECK_MSG((pr[j] > 0.0f) == keep, "token %d (logit %g, %d better): p %g", j, (double)l[j], better,
                  (double)pr[j]);
    }
    CHECK_EQ_INT(n_kept, 25);
    dfl_sampler_free(s);
}

TEST(sample_presence_frequency_penalty) {
    static const float L[6] = {2.0f, 1.0f, 0.0f, 3.0f, -1.0f, 1.0f};
    dfl_error err;
    error_clear(&err);
    dfl_sampler_params p = params_plain(1.0f);
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repeat_last_n = 4;
    dfl_sampler *s = dfl_sampler_new(&p, 6, &err);
    REQUIRE(s != NULL);
    /* window {3, 4, 3, 1}: 3 -> 3/2 - 2*0.25 - 0.5 = 0.5; 4 -> -1*2 - 0.25 - 0.5 = -2.75;
     * 1 -> 1/2 - 0.25 - 0.5 = -0.25 */
    dfl_sampler_accept(s, 3);
    dfl_sampler_accept(s, 4);
    dfl_sampler_accept(s, 3);
    dfl_sampler_accept(s, 1);
    float pr[6];
    REQUIRE(sampler_probs(s, L, pr, &err) == DFL_OK);
    {
        const double e[6] = {exp(2.0), exp(-0.25), exp(0.0), exp(0.5), exp(-2.75), exp(1.0)};
        const double z = e[0] + e[1] + e[2] + e[3] + e[4] + e[5];
        for (int j = 0; j < 6; j++) CHECK_NEAR(pr[j], e[j] / z, 1e-6);
    }
    /* extra tokens count too: window = last 4 of {3, 4, 3, 1, 5, 5} = {3, 1, 5, 5} */
    const int32_t extra[2] = {5, 5};
    REQUIRE(sampler_probs_after(s, L, extra, 2, pr, &err) == DFL_OK);
    {   /* 3 -> 1.5 - 0.25 - 0.5 = 0.75; 1 -> -0.25; 5 -> 0.5 - 0.5 - 0.5 = -0.5 */
        const double e[6] = {exp(2.0), exp(-0.25), exp(0.0), exp(0.75), exp(-1.0), exp(-0.5)};
        const double z = e[0] + e[1] + e[2] + e[3] + e[4] + e[5];
        for (int j = 0; j < 6; j++) CHECK_NEAR(pr[j], e[j] / z, 1e-6);
    }
    dfl_sampler_free(s);
    /* the additive penalties alone (repeat_penalty 1) act as well; greedy follows them */
    p = params_plain(0.0f);
    p.presence_penalty = 2.0f;
    p.repeat_last_n = 8;
    s = dfl_sampler_new(&p, 6, &err);
    REQUIRE(s != NULL);
    CHECK_EQ_INT(dfl_sampler_sample(s, L), 3);
    dfl_sampler_accept(s, 3); /* 3 -> 1.0 < 2.0 */
    CHECK_EQ_INT(dfl_sampler_sample(s, L), 0);
    dfl_sampler_free(s);
    /* out of range values are refused with the value and the limit */
    p.presence_penalty = 101.0f;
    CHECK(dfl_sampler_new(&p, 6, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "presence_penalty 101 must be in [-100, 100]");
    p.presence_penalty = 0.0f;
    p.frequency_penalty = NAN;
    error_clear(&err);
    CHECK(dfl_sampler_new(&p, 6, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "frequency_penalty");
}

TEST(sample_repetition_penalty) {
    static const float L[6] = {2.0f, 1.0f, 0.0f, 3.0f, -1.0f, 1.0f};
    dfl_error err;
    error_clear(&err);
    dfl_sampler_params p = params_plain(1.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 3;
    dfl_sampler *s = dfl_sampler_new(&p, 6, &err);
    REQUIRE(s != NULL);
    /* window {3, 4, 3}: 3 -> 1.5 (divided, once despite two occurrences), 4 -> -2 (multiplied) */
    CHECK_EQ_INT(dfl_sampler_accept(s, 3), DFL_OK);
    CHECK_EQ_INT(dfl_sampler_accept(s, 4), DFL_OK);
    CHECK_EQ_INT(dfl_sampler_accept(s, 3), DFL_OK);
    float pr[6];
    REQUIRE(sampler_probs(s, L, pr, &err) == DFL_OK);
    const float pen[6] = {0.400650582f, 0.147391112f, 0.054222160f, 0.243006862f, 0.007338171f, 0.147391112f};
    for (int j = 0; j < 6; j++) CHECK_NEAR(pr[j], pen[j], 1e-6);
    /* the window holds the last 3: after 0, 1, 2 token 3 and 4 are no longer penalized */
    dfl_sampler_accept(s, 0);
    dfl_sampler_accept(s, 1);
    dfl_sampler_accept(s, 2);
    REQUIRE(sampler_probs(s, L, pr, &err) == DFL_OK);
    /* 0: 2 -> 1, 1: 1 -> 0.5, 2: 0 -> 0 */
    {
        const double e[6] = {exp(1.0), exp(0.5), exp(0.0), exp(3.0), exp(-1.0), exp(1.0)};
        const double z = e[0] + e[1] + e[2] + e[3] + e[4] + e[5];
        for (int j = 0; j < 6; j++) CHECK_NEAR(pr[j], e[j] / z, 1e-6);
    }
    /* sampler_probs_after: extra tokens count as the newest window entries, window unchanged */
    const int32_t extra[2] = {3, 5};
    REQUIRE(sampler_probs_after(s, L, extra, 2, pr, &err) == DFL_OK);
    {   /* window = last 3 of {0, 1, 2, 3, 5} = {2, 3, 5}: 3 -> 1.5, 5 -> 0.5, 2 stays 0 */
        const double e[6] = {exp(2.0), exp(1.0), exp(0.0), exp(1.5), exp(-1.0), exp(0.5)};
        const double z = e[0] + e[1] + e[2] + e[3] + e[4] + e[5];
        for (int j = 0; j < 6; j++) CHECK_NEAR(pr[j], e[j] / z, 1e-6);
    }
    const int32_t bad[1] = {6};
    CHECK_EQ_INT(sampler_probs_after(s, L, bad, 1, pr, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "extra token 0 (id 6)");
    dfl_sampler_free(s);

    /* greedy with the penalty: 3 penalized below 2.0 -> token 0 wins; reset empties the window */
    p = params_plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 4;
    s = dfl_sampler_new(&p, 6, &err);
    REQUIRE(s != NULL);
    CHECK_EQ_INT(dfl_sampler_sample(s, L), 3);
    dfl_sampler_accept(s, 3);
    CHECK_EQ_INT(dfl_sampler_sample(s, L), 0);
    dfl_sampler_accept(s, 0); /* 3 -> 1.5, 0 -> 1.0: 3 again */
    CHECK_EQ_INT(dfl_sampler_sample(s, L), 3);
    CHECK_EQ_INT(dfl_sampler_accept(s, 6), DFL_ERR_INVALID);
    CHECK_EQ_INT(dfl_sampler_accept(s, -1), DFL_ERR_INVALID);
    dfl_sampler_reset(s);
    dfl_sampler_accept(s, 0);
    CHECK_EQ_INT(dfl_sampler_sample(s, L), 3);
    dfl_sampler_free(s);
    /* penalty 1 (off): window ignored */
    p.repeat_penalty = 1.0f;
    s = dfl_sampler_new(&p, 6, &err);
    REQUIRE(s != NULL);
    dfl_sampler_accept(s, 3);
    CHECK_EQ_INT(dfl_sampler_sample(s, L), 3);
    dfl_sampler_free(s);
}

TEST(sample_seed_determinism) {
    enum { V = 50, N = 300 };
    float l[V];
    for (int j = 0; j < V; j++) l[j] = (float)sin(j * 1.7) * 2.0f;
    dfl_error err;
    error_clear(&err);
    dfl_sampler_params p = dfl_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.min_p = 0.0f;
    p.seed = 42;
    dfl_sampler *a = dfl_sampler_new(&p, V, &err), *b = dfl_sampler_new(&p, V, &err);
    p.seed = 43;
    dfl_sampler *c = dfl_sampler_new(&p, V, &err);
    REQUIRE(a != NULL && b != NULL && c != NULL);
    int32_t ta[N];
    int n_diff = 0, n_distinct = 0;
    bool seen[V] = {false};
    for (int i = 0; i < N; i++) {
        ta[i] = dfl_sampler_sample(a, l);
        const int32_t tb = dfl_sampler_sample(b, l), tc = dfl_sampler_sample(c, l);
        REQUIRE(ta[i] >= 0 && ta[i] < V);
        CHECK_EQ_INT(ta[i], tb);
        n_diff += ta[i] != tc;
        if (!seen[ta[i]]) n_distinct++;
        seen[ta[i]] = true;
    }
    CHECK_MSG(n_diff > N / 4, "seeds 42 and 43 differ at only %d of %d draws", n_diff, N);
    CHECK(n_distinct > 5); /* really random, not a constant */
    /* reset replays the sequence from the seed */
    dfl_sampler_reset(a);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(dfl_sampler_sample(a, l), ta[i]);
    dfl_sampler_free(a);
    dfl_sampler_free(b);
    dfl_sampler_free(c);
}

/* Draws n tokens with the sampler and returns the chi-square statistic against probs. */
static double draw_chi2(dfl_sampler *s, const float *logits, const double *probs, int64_t v, int64_t n,
                        int64_t *df) {
    int64_t counts[64] = {0};
    for (int64_t i = 0; i < n; i++) {
        const int32_t tok = dfl_sampler_sample(s, logits);
        if (tok < 0 || tok >= v) return INFINITY;
        counts[tok]++;
    }
    return chi2_stat(counts, probs, v, n, df);
}

TEST(sample_draws_match_probs) {
    enum { V = 12, N = 100000 };
    float l[V];
    for (int j = 0; j < V; j++) l[j] = (float)((j * 7) % V) * 0.3f - 1.0f;
    l[5] = -INFINITY;
    dfl_error err;
    error_clear(&err);
    const struct { float temp; int32_t top_k; float top_p, min_p; } cases[] = {
        {1.0f, 0, 1.0f, 0.0f}, {0.7f, 8, 1.0f, 0.0f}, {1.3f, 0, 0.8f, 0.0f}, {0.9f, 10, 0.9f, 0.1f},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        dfl_sampler_params p = params_plain(cases[c].temp);
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.seed = 7 + c;
        dfl_sampler *s = dfl_sampler_new(&p, V, &err);
        REQUIRE(s != NULL);
        float pr[V];
        REQUIRE(sampler_probs(s, l, pr, &err) == DFL_OK);
        double probs[V];
        int n_support = 0;
        for (int j = 0; j < V; j++) {
            probs[j] = pr[j];
            n_support += pr[j] > 0.0f;
        }
        CHECK(probs[5] == 0.0);
        CHECK(n_support >= 3);
        int64_t df = 0;
        const double stat = draw_chi2(s, l, probs, V, N, &df);
        CHECK_MSG(stat < chi2_critical(df), "case %zu: chi2 %.1f >= %.1f (df %lld)", c, stat, chi2_critical(df),
                  (long long)df);
        /* the test has power: the draws are far from a slightly wrong distribution (mass moved
         * from the most likely kept token to the least likely one) */
        int hi = -1, lo = -1;
        for (int j = 0; j < V; j++) {
            if (probs[j] <= 0.0) continue;
            if (hi < 0 || probs[j] > probs[hi]) hi = j;
            if (lo < 0 || probs[j] < probs[lo]) lo = j;
        }
        double wrong[V];
        memcpy(wrong, probs, sizeof(wrong));
        wrong[hi] -= 0.02;
        wrong[lo] += 0.02;
        dfl_sampler_reset(s);
        const double stat_w = draw_chi2(s, l, wrong, V, N, &df);
        CHECK_MSG(stat_w > chi2_critical(df), "case %zu: a wrong distribution passes (chi2 %.1f)", c, stat_w);
        dfl_sampler_free(s);
    }
}

TEST(sample_bad_input) {
    dfl_error err;
    dfl_sampler_params p = params_plain(1.0f);
    struct { const char *field; dfl_sampler_params p; int64_t n_vocab; } bad[8];
    int nb = 0;
    bad[nb].p = p; bad[nb].p.temp = NAN; bad[nb].field = "temp"; bad[nb++].n_vocab = 4;
    bad[nb].p = p; bad[nb].p.top_p = 1.5f; bad[nb].field = "top_p"; bad[nb++].n_vocab = 4;
    bad[nb].p = p; bad[nb].p.min_p = -0.1f; bad[nb].field = "min_p"; bad[nb++].n_vocab = 4;
    bad[nb].p = p; bad[nb].p.repeat_penalty = 0.0f; bad[nb].field = "repeat_penalty"; bad[nb++].n_vocab = 4;
    bad[nb].p = p; bad[nb].p.repeat_last_n = -1; bad[nb].field = "repeat_last_n"; bad[nb++].n_vocab = 4;
    bad[nb].p = p; bad[nb].field = "n_vocab"; bad[nb++].n_vocab = 0;
    for (int i = 0; i < nb; i++) {
        error_clear(&err);
        CHECK(dfl_sampler_new(&bad[i].p, bad[i].n_vocab, &err) == NULL);
        CHECK_EQ_INT(err.code, DFL_ERR_INVALID);
        CHECK_STR_CONTAINS(err.msg, bad[i].field);
    }
    CHECK(dfl_sampler_new(NULL, 4, NULL) == NULL);

    error_clear(&err);
    dfl_sampler *s = dfl_sampler_new(&p, 4, &err);
    REQUIRE(s != NULL);
    float l[4] = {0.0f, NAN, 1.0f, 2.0f};
    CHECK_EQ_INT(dfl_sampler_sample(s, l), -DFL_ERR_INVALID);
    float pr[4];
    CHECK_EQ_INT(sampler_probs(s, l, pr, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "logit of token 1 is nan");
    l[1] = INFINITY;
    CHECK_EQ_INT(dfl_sampler_sample(s, l), -DFL_ERR_INVALID);
    for (int j = 0; j < 4; j++) l[j] = -INFINITY;
    CHECK_EQ_INT(dfl_sampler_sample(s, l), -DFL_ERR_INVALID);
    error_clear(&err);
    CHECK_EQ_INT(sampler_probs(s, l, pr, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "no token has a finite logit");
    CHECK_EQ_INT(dfl_sampler_sample(s, NULL), -DFL_ERR_INVALID);
    CHECK_EQ_INT(dfl_sampler_sample(NULL, l), -DFL_ERR_INVALID);
    dfl_sampler_free(s);
    dfl_sampler_free(NULL);
}

/* ---- speculative verification ------------------------------------------------------------ */

TEST(spec_verify_greedy_is_argmax_rule) {
    enum { V = 40, B = 8 };
    dfl_error err;
    error_clear(&err);
    dfl_sampler_params gp = params_plain(0.0f);
    dfl_sampler *g = dfl_sampler_new(&gp, V, &err);
    REQUIRE(g != NULL);
    sample_rng gen;
    rng_seed(&gen, 99);
    static float logits[(B + 1) * V], p[(B + 1) * V];
    int n_full = 0, n_zero = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int n_draft = trial % (B + 1);
        int32_t draft[B], amax[B + 1];
        for (int i = 0; i <= n_draft; i++) {
            for (int j = 0; j < V; j++) logits[i * V + j] = (float)(rng_next_u64(&gen) % 7); /* many ties */
            int best = 0;
            for (int j = 1; j < V; j++) best = logits[i * V + j] > logits[i * V + best] ? j : best;
            amax[i] = best;
            REQUIRE(sampler_probs(g, logits + i * V, p + i * V, &err) == DFL_OK);
        }
        /* drafts: mostly the argmax, sometimes not, so every acceptance length occurs */
        for (int i = 0; i < n_draft; i++) {
            draft[i] = (rng_next_u64(&gen) % 5 != 0) ? amax[i] : (int32_t)(rng_next_u64(&gen) % V);
        }
        int a = 0;
        while (a < n_draft && draft[a] == amax[a]) a++;
        sample_rng r;
        rng_seed(&r, (uint64_t)trial);
        spec_verify_result res;
        REQUIRE(spec_verify(V, n_draft, draft, NULL, p, &r, &res, &err) == DFL_OK);
        CHECK_EQ_INT(res.n_accepted, a);
        CHECK_EQ_INT(res.next_token, amax[a]);
        n_full += a == n_draft && n_draft > 0;
        n_zero += a == 0 && n_draft > 0;
        /* one-hot q on the drafts gives the same */
        static float q[B * V];
        memset(q, 0, sizeof(q));
        for (int i = 0; i < n_draft; i++) q[i * V + draft[i]] = 1.0f;
        REQUIRE(spec_verify(V, n_draft, draft, q, p, &r, &res, &err) == DFL_OK);
        CHECK_EQ_INT(res.n_accepted, a);
        CHECK_EQ_INT(res.next_token, amax[a]);
    }
    CHECK(n_full > 10 && n_zero > 10);
    dfl_sampler_free(g);
}

/* Draws a token from a distribution row (test side, own generator). */
static int32_t draw_row(sample_rng *r, const float *row, int v) {
    double tot = 0.0;
    for (int j = 0; j < v; j++) tot += row[j];
    return (int32_t)rng_pick(r, row, v, tot);
}

TEST(spec_verify_first_slot_distribution) {
    enum { V = 6, N = 100000 };
    static const float p0[V] = {0.05f, 0.40f, 0.10f, 0.25f, 0.15f, 0.05f};
    static const float q_far[V] = {0.70f, 0.01f, 0.01f, 0.01f, 0.02f, 0.25f}; /* mass where p is small */
    static const float q_near[V] = {0.10f, 0.35f, 0.10f, 0.20f, 0.20f, 0.05f};
    static const float q_outside[V] = {0.0f, 0.0f, 0.5f, 0.0f, 0.0f, 0.5f};
    static const float p0_zero[V] = {0.0f, 0.5f, 0.0f, 0.3f, 0.2f, 0.0f}; /* p zero on q's support */
    /* p rows: row 0 as above, row 1 (bonus) arbitrary */
    static const float p1[V] = {0.3f, 0.1f, 0.1f, 0.1f, 0.1f, 0.3f};
    const struct { const char *what; const float *p; const float *q; int32_t onehot; } cases[] = {
        {"one-hot q on a likely token", p0, NULL, 1},
        {"one-hot q on an unlikely token", p0, NULL, 5},
        {"q far from p", p0, q_far, -1},
        {"q near p", p0, q_near, -1},
        {"q = p", p0, p0, -1},
        {"q outside p's support", p0_zero, q_outside, -1},
        {"one-hot q where p is 0", p0_zero, NULL, 2},
    };
    dfl_error err;
    error_clear(&err);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        float p[2 * V];
        memcpy(p, cases[c].p, sizeof(float) * V);
        memcpy(p + V, p1, sizeof(p1));
        sample_rng r;
        rng_seed(&r, 1000 + c);
        int64_t counts[V] = {0};
        int64_t n_acc = 0;
        for (int k = 0; k < N; k++) {
            const int32_t d = cases[c].q != NULL ? draw_row(&r, cases[c].q, V) : cases[c].onehot;
            spec_verify_result res;
            REQUIRE(spec_verify(V, 1, &d, cases[c].q, p, &r, &res, &err) == DFL_OK);
            const int32_t first = res.n_accepted >= 1 ? d : res.next_token;
            counts[first]++;
            n_acc += res.n_accepted;
        }
        double probs[V];
        double acc_expected = 0.0; /* sum_x min(p, q) */
        for (int j = 0; j < V; j++) {
            probs[j] = cases[c].p[j];
            const double qj = cases[c].q != NULL ? cases[c].q[j] : (j == cases[c].onehot ? 1.0 : 0.0);
            acc_expected += probs[j] < qj ? probs[j] : qj;
        }
        int64_t df = 0;
        const double stat = chi2_stat(counts, probs, V, N, &df);
        CHECK_MSG(stat < chi2_critical(df), "%s: chi2 %.1f >= %.1f (df %lld)", cases[c].what, stat,
                  chi2_critical(df), (long long)df);
        /* the acceptance rate is sum min(p, q) (binomial, 6 sigma) */
        if (acc_expected > 1.0) acc_expected = 1.0; /* float rows sum to 1 within rounding */
        const double rate = (double)n_acc / N, sd = sqrt(acc_expected * (1 - acc_expected) / N);
        CHECK_MSG(fabs(rate - acc_expected) <= 6 * sd + 1e-6, "%s: acceptance %.4f, expected %.4f", cases[c].what,
                  rate, acc_expected);
    }
}

TEST(spec_verify_second_slot_distribution) {
    /* two drafts from q0, q1; given that the first emitted token is d_1 (accepted), the second
     * emitted token must follow p_1 whatever q_1 is */
    enum { V = 5, N = 100000 };
    static const float q[2 * V] = {0.6f, 0.1f, 0.1f, 0.1f, 0.1f,   /* q_0 */
                                   0.05f, 0.05f, 0.1f, 0.1f, 0.7f}; /* q_1 */
    static const float p[3 * V] = {0.5f, 0.2f, 0.1f, 0.1f, 0.1f,   /* p_0 */
                                   0.4f, 0.3f, 0.2f, 0.05f, 0.05f, /* p_1 */
                                   0.2f, 0.2f, 0.2f, 0.2f, 0.2f};  /* p_2 (bonus) */
    dfl_error err;
    error_clear(&err);
    sample_rng r;
    rng_seed(&r, 5);
    int64_t counts[V] = {0}, n_cond = 0, n_all = 0, bonus[V] = {0};
    for (int k = 0; k < N; k++) {
        int32_t d[2];
        d[0] = draw_row(&r, q, V);
        d[1] = draw_row(&r, q + V, V);
        spec_verify_result res;
        REQUIRE(spec_verify(V, 2, d, q, p, &r, &res, &err) == DFL_OK);
        REQUIRE(res.n_accepted >= 0 && res.n_accepted <= 2);
        if (res.n_accepted >= 1) {
            counts[res.n_accepted >= 2 ? d[1] : res.next_token]++;
            n_cond++;
        }
        if (res.n_accepted == 2) {
            bonus[res.next_token]++;
            n_all++;
        }
    }
    double probs[V], pb[V];
    for (int j = 0; j < V; j++) {
        probs[j] = p[V + j];
        pb[j] = p[2 * V + j];
    }
    int64_t df = 0;
    double stat = chi2_stat(counts, probs, V, n_cond, &df);
    CHECK_MSG(stat < chi2_critical(df), "second slot: chi2 %.1f >= %.1f", stat, chi2_critical(df));
    REQUIRE(n_all > 1000);
    stat = chi2_stat(bonus, pb, V, n_all, &df);
    CHECK_MSG(stat < chi2_critical(df), "bonus: chi2 %.1f >= %.1f", stat, chi2_critical(df));
}

TEST(spec_verify_bad_input) {
    enum { V = 4 };
    dfl_error err;
    sample_rng r;
    rng_seed(&r, 1);
    float p[2 * V] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
    spec_verify_result res;
    int32_t d = 4;
    error_clear(&err);
    CHECK_EQ_INT(spec_verify(V, 1, &d, NULL, p, &r, &res, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "draft 0 (token 4)");
    error_clear(&err);
    CHECK_EQ_INT(spec_verify(V, -1, &d, NULL, p, &r, &res, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "n_draft -1");
    /* no draft: only the bonus */
    d = 0;
    error_clear(&err);
    CHECK_EQ_INT(spec_verify(V, 0, NULL, NULL, p, &r, &res, &err), DFL_OK);
    CHECK_EQ_INT(res.n_accepted, 0);
    CHECK(res.next_token >= 0 && res.next_token < V);
    /* a bonus row without mass */
    for (int j = 0; j < V; j++) p[V + j] = 0.0f;
    p[0] = 1.0f;
    error_clear(&err);
    CHECK_EQ_INT(spec_verify(V, 1, &d, NULL, p, &r, &res, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "row 1 (bonus) has no probability mass");
}
