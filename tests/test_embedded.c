/* test_embedded.c: the embedded default pair (models/target.gguf + models/drafter.gguf, trained
 * here, see models/README.md): on fixed prompts, greedy speculative output equals the target's
 * own greedy output, and the drafter is really accepted (tau > 2); and on the held-out prompts of
 * models/spec_eval.json the CLI generates exactly the text the PyTorch model generated
 * (tests/ref/check_embedded.py). Skips while the pair is absent. */
#include "test.h"
#include "test_util.h"
#include "speculative/session.h"
#include "backend/cpu/cpu_internal.h"
#include "model/context.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_GEN 64

/* held-out text (models/check_c.json): two code and two prose prompts */
static const char *k_prompts[] = {
    "        if self.plat_name is None:\n"
    "            self.plat_name = get_platform()\n"
    "        else:\n"
    "            # plat-name only supported for windows (other platforms are\n"
    "            # supported via ./configure",
    "    def __init__(self,type, children,\n"
    "                 context=None,\n"
    "                 prefix=None,\n"
    "                 fixers_applied=None):\n"
    "        \"\"\"\n"
    "        Initializer.\n"
    "\n"
    "        Takes a type constant (a symbol",
    "But it came to pass within a while after, in the time of wheat harvest, that Samson visited his wife with a kid; and he said, I will go in to my wife into the ch",
    "The wrath of God came upon them, and slew the fattest of them, and smote down the chosen men of Israel.\n"
    "For all this they sinned still, and believed not for his wondrous works.\n"
    "Therefore their",
};

/* Loads the embedded pair into *tm, *dm; false (the test skipped, or failed to load) otherwise. */
static bool embedded_load(test_ctx *t, dfl_model **tm, dfl_model **dm) {
    const char *tp = "models/target.gguf", *dp = "models/drafter.gguf";
    *tm = *dm = NULL;
    if (access(tp, R_OK) != 0 || access(dp, R_OK) != 0) {
        test_skip(t, "the embedded pair (models/target.gguf, models/drafter.gguf) is not in this checkout");
        return false;
    }
    dfl_error err = {0};
    *tm = dfl_model_load(tp, NULL, &err);
    *dm = *tm ? dfl_model_load(dp, NULL, &err) : NULL;
    CHECK_MSG(*dm != NULL, "the embedded pair does not load: %s", err.msg);
    if (*dm == NULL) {
        dfl_model_free(*tm);
        *tm = NULL;
    }
    return *dm != NULL;
}

TEST(embedded_pair_lossless_and_accepted) {
    const char *tp = "models/target.gguf";
    dfl_model *tm, *dm;
    if (!embedded_load(t, &tm, &dm)) return;
    dfl_error err = {0};
    dfl_vocab *vocab = dfl_vocab_load(tp, &err);
    REQUIRE(vocab != NULL);
    const dfl_hparams *dh = dfl_model_hparams(dm);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 64;
    cp.n_outputs = 64;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    dfl_context *tc = dfl_context_new(tm, &cp, &err);
    dfl_context_params rp = cp;
    rp.n_capture = 0;
    rp.capture_layers = NULL;
    dfl_context *rc = tc ? dfl_context_new(tm, &rp, &err) : NULL;
    dfl_context_params dpp = dfl_context_default_params();
    dpp.target = tc;
    dfl_context *dc = rc ? dfl_context_new(dm, &dpp, &err) : NULL;
    REQUIRE(dc != NULL);
    /* the trained block (fixed draft length B-1), then the CLI's adaptive length with and without
     * the drafter-probability cut: all lossless; tau > 1.5 asked of the trained block (a drafter
     * that predicts nothing gives 1.0; this pair gives 1.8 here, 2.3-2.6 on held-out prompts, see
     * models/README.md: its target loops less than the first one, whose pair gave 3-6) */
    struct { int32_t n_draft_min; float p_min; const char *name; } cfgs[] = {
        {0, 0.0f, "block 16, fixed"}, {1, 0.0f, "adaptive 1..15"}, {1, 0.1f, "adaptive 1..15, p_min 0.1"}};
    for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
        spec_params sp = spec_default_params();
        sp.n_draft_min = cfgs[c].n_draft_min;
        sp.draft_p_min = cfgs[c].p_min;
        spec_session *spec = spec_new(tc, dc, &sp, &err);
        REQUIRE(spec != NULL);
        int64_t steps = 0, accepted = 0;
        for (size_t p = 0; p < sizeof(k_prompts) / sizeof(k_prompts[0]); p++) {
            int32_t prompt[256], ref[N_GEN + 32], got[N_GEN + 32];
            int64_t n = dfl_tokenize(vocab, k_prompts[p], strlen(k_prompts[p]), prompt, 256, true, false);
            REQUIRE(n > 0 && n < 256);
            dfl_seq_remove(rc, 0, 0, NULL);
            REQUIRE(tu_greedy(rc, 0, prompt, n, N_GEN, ref, &err) == DFL_OK);
            spec_seq_reset(spec, 0);
            spec_stats s0 = spec_get_stats(spec);
            int32_t first, seq = 0, toks[64], nt = 0;
            REQUIRE(spec_prefill(spec, 0, prompt, n, &first, &err) == DFL_OK);
            int64_t k = 0;
            got[k++] = first;
            while (k < N_GEN) {
                REQUIRE(spec_step(spec, 1, &seq, toks, &nt, &err) == DFL_OK);
                for (int32_t j = 0; j < nt && k < N_GEN + 32; j++) got[k++] = toks[j];
            }
            spec_stats s1 = spec_get_stats(spec);
            const int64_t ds = s1.n_steps - s0.n_steps, da = s1.n_accepted - s0.n_accepted;
            steps += ds;
            accepted += da;
            CHECK_MSG(memcmp(got, ref, N_GEN * sizeof(int32_t)) == 0, "%s, prompt %zu: speculative output differs from greedy",
                      cfgs[c].name, p);
        }
        const spec_stats st = spec_get_stats(spec);
        const double tau = steps ? (double)(accepted + steps) / (double)steps : 0.0;
        const double mean_draft = st.n_steps ? (double)st.n_drafted / (double)st.n_steps : 0.0;
        printf("    embedded pair, %s: tau %.2f over %lld steps, %.2f drafts verified per step\n", cfgs[c].name, tau,
               (long long)steps, mean_draft);
        if (c == 0) {
            CHECK_MSG(tau > 1.5, "tau %.2f <= 1.5 on the fixed prompts (block %lld)", tau, (long long)dh->block_size);
            CHECK_MSG(st.n_drafted == st.n_steps * (dh->block_size - 1), "a fixed draft length verified other lengths");
        } else {
            /* the adaptive length really moves: shorter than the block on average, longer than its start somewhere */
            CHECK_MSG(mean_draft < (double)(dh->block_size - 1) && mean_draft >= 1.0, "%s: %.2f drafts per step",
                      cfgs[c].name, mean_draft);
            CHECK_MSG(st.accept_hist[SPEC_DRAFT_START + 1] + st.accept_hist[SPEC_DRAFT_START + 2] > 0 ||
                          mean_draft > (double)SPEC_DRAFT_START,
                      "%s: the draft length never grew past its start", cfgs[c].name);
        }
        spec_free(spec);
    }
    /* bad adaptive parameters are refused with a message */
    spec_params bad = spec_default_params();
    bad.n_draft = 4;
    bad.n_draft_min = 5;
    memset(&err, 0, sizeof(err));
    CHECK(spec_new(tc, dc, &bad, &err) == NULL && strstr(err.msg, "minimum draft length") != NULL);
    bad = spec_default_params();
    bad.draft_p_min = 1.5f;
    memset(&err, 0, sizeof(err));
    CHECK_MSG(spec_new(tc, dc, &bad, &err) == NULL && strstr(err.msg, "draft_p_min") != NULL, "got: %s", err.msg);
    dfl_context_free(dc);
    dfl_context_free(rc);
    dfl_context_free(tc);
    dfl_vocab_free(vocab);
    dfl_model_free(dm);
    dfl_model_free(tm);
}

TEST(embedded_pair_equals_pytorch_outputs) {
    if (access("models/target.gguf", R_OK) != 0 || access("models/spec_eval.json", R_OK) != 0) {
        test_skip(t, "the embedded pair or models/spec_eval.json is not in this checkout");
        return;
    }
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 tests/ref/check_embedded.py --dflash %s --n 6", test_cli_path());
    const int rc = test_run(cmd, out, sizeof(out));
    CHECK_MSG(rc == 0, "%s", out);
    CHECK_STR_CONTAINS(out, ", 0 differ");   /* equal, or a near-tie of the float64 reference */
    const char *last = strstr(out, "check_embedded: 24");
    if (last != NULL) printf("    %.*s\n", (int)strcspn(last, "\n"), last);
}

/* The CLI's draft options on the embedded pair: the default adapts the draft length, --draft-min 0
 * keeps the whole block, and out-of-range settings are refused with a message. */
TEST(embedded_cli_draft_options) {
    if (access("models/target.gguf", R_OK) != 0 || access("models/drafter.gguf", R_OK) != 0) {
        test_skip(t, "the embedded pair is not in this checkout");
        return;
    }
    char cmd[1024], out[16384];
    const char *base = "generate -p 'And the LORD spake unto Moses, saying,' -n 48 -t 1 -tb 1 --json";
    snprintf(cmd, sizeof(cmd), "%s %s", test_cli_path(), base);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    const char *p = strstr(out, "\"n_steps\":"), *q = strstr(out, "\"n_drafted\":");
    REQUIRE(p != NULL && q != NULL);
    const long steps = strtol(p + 10, NULL, 10), drafted = strtol(q + 12, NULL, 10);
    CHECK_MSG(steps > 0 && drafted < steps * 15, "default: %ld drafts over %ld steps (not adaptive?)", drafted, steps);
    snprintf(cmd, sizeof(cmd), "%s %s --draft-min 0", test_cli_path(), base);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    p = strstr(out, "\"n_steps\":");
    q = strstr(out, "\"n_drafted\":");
    REQUIRE(p != NULL && q != NULL);
    CHECK_EQ_INT(strtol(q + 12, NULL, 10), strtol(p + 10, NULL, 10) * 15);
    const struct { const char *opts; int rc; const char *want; } bad[] = {
        {"--draft-min 20", 1, "--draft-min 20 is above the draft length 15"},
        {"--draft-max 4 --draft-min 5", 1, "--draft-min 5 is above the draft length 4"},
        {"--draft-max 20", 1, "--draft-max 20 is above the drafter's block_size - 1 = 15"},
        {"--draft-min -1", 2, "--draft-min"},
        {"--draft-p-min 1.5", 2, "--draft-p-min"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s generate -p x -n 4 %s", test_cli_path(), bad[i].opts);
        CHECK_MSG(test_run(cmd, out, sizeof(out)) == bad[i].rc, "%s: %s", bad[i].opts, out);
        CHECK_STR_CONTAINS(out, bad[i].want);
    }
}

/* The "tokens":[...] array of a `generate --json` output, copied into buf (empty if absent). */
static void json_tokens(const char *out, char *buf, size_t cap) {
    const char *p = strstr(out, "\"tokens\":[");
    buf[0] = '\0';
    if (p == NULL) return;
    const size_t n = strcspn(p, "]");
    snprintf(buf, cap, "%.*s", (int)n, p);
}

static long json_long(const char *out, const char *key) {
    const char *p = strstr(out, key);
    return p != NULL ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* -ctk / -ctv (llama.cpp's spelling): an f32 KV cache runs speculative decoding losslessly (its
 * output equals the target alone with the same cache type); K and V of different types, or a type
 * other than f16/f32, are refused with a message. */
TEST(embedded_cli_cache_types) {
    if (access("models/target.gguf", R_OK) != 0 || access("models/drafter.gguf", R_OK) != 0) {
        test_skip(t, "the embedded pair is not in this checkout");
        return;
    }
    char cmd[1024], out[16384], spec[4096], plain[4096];
    const char *base = "generate -p 'def read_config(path):' -n 40 -t 1 -tb 1 --json --draft-min 0";
    snprintf(cmd, sizeof(cmd), "%s %s -ctk f32 -ctv f32", test_cli_path(), base);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    json_tokens(out, spec, sizeof(spec));
    CHECK(json_long(out, "\"n_accepted\":") > 0);
    snprintf(cmd, sizeof(cmd), "%s %s --cache-type-k f32 --cache-type-v f32 --no-spec", test_cli_path(), base);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    json_tokens(out, plain, sizeof(plain));
    CHECK(spec[0] != '\0');
    CHECK_MSG(strcmp(spec, plain) == 0, "f32 KV: speculative %s\n  plain %s", spec, plain);
    const struct { const char *opts; const char *want; } bad[] = {
        {"-ctk f32", "-ctk f32 with -ctv f16"},
        {"-ctk f16 -ctv f32", "-ctk f16 with -ctv f32"},
        {"-ctk q8_0 -ctv q8_0", "invalid value 'q8_0' for -ctk (f16 or f32)"},
        {"-ctv", "option -ctv needs a value"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s generate -p x -n 4 %s", test_cli_path(), bad[i].opts);
        CHECK_MSG(test_run(cmd, out, sizeof(out)) == 2, "%s: %s", bad[i].opts, out);
        CHECK_STR_CONTAINS(out, bad[i].want);
    }
}

/* Every committed drafter family (DFlash, DSpark, DFlash2; models/README.md) with the embedded
 * target, through the CLI: greedy output equals the target alone on held-out prompts, with the
 * default adaptive draft length, with the whole block, and with the drafter's own draft-length
 * cut (--draft-p-min: DSpark's confidence head, DFlash2's walk, DFlash's probabilities); and the
 * drafts are really accepted. */
TEST(embedded_every_drafter_family_lossless) {
    static const char *const files[] = {"models/drafter.gguf", "models/drafter-dspark.gguf", "models/drafter-dflash2.gguf"};
    static const char *const modes[] = {"", "--draft-min 0", "--draft-p-min 0.3"};
    char cmd[4096], out[65536], ref[32768], got[32768], qp[2048];
    for (size_t p = 0; p < sizeof(k_prompts) / sizeof(k_prompts[0]); p++) {
        /* the prompt for a single-quoted shell argument */
        size_t w = 0;
        for (const char *c = k_prompts[p]; *c && w + 5 < sizeof(qp); c++) {
            if (*c == '\'') { memcpy(qp + w, "'\\''", 4); w += 4; }
            else qp[w++] = *c;
        }
        qp[w] = '\0';
        snprintf(cmd, sizeof(cmd), "%s generate -p '%s' -n %d -t 1 -tb 1 --json --no-spec", test_cli_path(), qp, N_GEN);
        REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
        json_tokens(out, ref, sizeof(ref));
        REQUIRE(ref[0] != '\0');
        for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
            CHECK_MSG(access(files[f], R_OK) == 0, "%s is missing", files[f]);
            if (access(files[f], R_OK) != 0) continue;
            for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
                snprintf(cmd, sizeof(cmd), "%s generate -md %s -p '%s' -n %d -t 1 -tb 1 --json %s", test_cli_path(),
                         files[f], qp, N_GEN, modes[m]);
                const int rc = test_run(cmd, out, sizeof(out));
                CHECK_MSG(rc == 0, "%s %s: rc %d: %.300s", files[f], modes[m], rc, out);
                json_tokens(out, got, sizeof(got));
                CHECK_MSG(strcmp(got, ref) == 0, "%s '%s', prompt %zu: output differs from the target alone", files[f],
                          modes[m], p);
                const long steps = json_long(out, "\"n_steps\":"), acc = json_long(out, "\"n_accepted\":");
                if (p == 0 || steps <= 0) {
                    printf("    %s %s, prompt %zu: tau %.2f (%ld steps)\n", files[f], modes[m][0] ? modes[m] : "(default)", p,
                           steps > 0 ? (double)(acc + steps) / (double)steps : 0.0, steps);
                }
                CHECK_MSG(steps > 0 && acc > 0, "%s '%s', prompt %zu: no draft accepted (%ld steps)", files[f], modes[m], p,
                          steps);
            }
        }
    }
}

/* The embedded pair is F16: on a CPU with AMX-BF16 the drafter's matmul weights are packed for the
 * tiles (P16_X16), the target's stay plain (its decode is one row, where the tiles lose), and
 * dfl_context_params.no_weight_pack keeps the drafter's plain too. */
TEST(embedded_pair_drafter_f16_tiles_target_plain) {
    dfl_model *tm, *dm;
    if (!embedded_load(t, &tm, &dm)) return;
    dfl_error err = {0};
    const bool tiles = (cpu_features_detect() & BACKEND_CPU_FEATURE_AMX_BF16) &&
                       (cpu_features_detect() & BACKEND_CPU_FEATURE_AVX512_VNNI);
    const dfl_hparams *dh = dfl_model_hparams(dm);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    dfl_context *tc = dfl_context_new(tm, &cp, &err);
    REQUIRE(tc != NULL);
    CHECK_EQ_INT(tc->w.layers[0].wq.type, QUANT_TYPE_F16);
    CHECK_EQ_INT(tc->w.layers[0].wq.layout, TENSOR_LAYOUT_PLAIN);
    for (int np = 0; np < 2; np++) {
        dfl_context_params dpp = dfl_context_default_params();
        dpp.target = tc;
        dpp.no_weight_pack = np == 1;
        dfl_context *dc = dfl_context_new(dm, &dpp, &err);
        REQUIRE(dc != NULL);
        const uint32_t want = tiles && np == 0 ? TENSOR_LAYOUT_P16_X16 : TENSOR_LAYOUT_PLAIN;
        CHECK_EQ_INT(dc->w.layers[0].wq.layout, want);
        CHECK_EQ_INT(dc->w.layers[dh->n_layer - 1].ffn_down.layout, want);
        dfl_context_free(dc);
    }
    if (!tiles) test_skip(t, "no AMX-BF16 on this CPU: only the plain layouts were checked");
    dfl_context_free(tc);
    dfl_model_free(dm);
    dfl_model_free(tm);
}
