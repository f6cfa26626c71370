/* test_peer_greedy.c: greedy tokens identical to llama.cpp (node-llama-cpp 3.21.1, prebuilt
 * CPU build) on generated models of several weight types: 10 prompts x 64 tokens, prompts longer
 * than one micro-batch, all prompts decoded together as separate sequences on our side. Skips
 * with a message where node or the npm peers are missing (CI has them). */
#include "test.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NV 640
#define N_PROMPTS 10
#define N_GEN 64



/* Our greedy tokens for all prompts, decoded together (one batch per step, one sequence each). */
static bool our_greedy(test_ctx *t, const char *path, int32_t prompts[N_PROMPTS][48], const int *lens,
                       int32_t out[N_PROMPTS][N_GEN]) {
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(path, NULL, &err);
    if (m == NULL) { test_fail(t, __FILE__, __LINE__, "%s", err.msg); return false; }
    dfl_context_params cp = dfl_context_default_params();
    cp.n_seq = N_PROMPTS;
    cp.n_ctx = 160;
    cp.n_batch = 512;
    cp.n_ubatch = 16;
    cp.n_outputs = N_PROMPTS;
    cp.n_threads = 1; /* thread counts give identical results (backend tests); 1 keeps a busy CI fast */
    dfl_context *ctx = dfl_context_new(m, &cp, &err);
    dfl_batch *b = dfl_batch_init(512, 0, 1, &err);
    bool ok = ctx != NULL && b != NULL;
    int32_t idx[N_PROMPTS];
    /* prefill: every prompt in one batch (several micro-batches), interleaved by sequence */
    for (int pos = 0; ok && pos < 48; pos++) {
        for (int s = 0; s < N_PROMPTS; s++) {
            if (pos < lens[s]) {
                int32_t p = pos;
                int32_t i = dfl_batch_add_token(b, prompts[s][pos], &p, s, pos == lens[s] - 1);
                if (pos == lens[s] - 1) idx[s] = i;
            }
        }
    }
    if (ok) ok = dfl_decode(ctx, b, &err) == DFL_OK;
    for (int k = 0; ok && k < N_GEN; k++) {
        for (int s = 0; s < N_PROMPTS; s++) out[s][k] = tu_argmax(dfl_get_logits(ctx, idx[s]), NV);
        if (k + 1 == N_GEN) break;
        dfl_batch_clear(b);
        for (int s = 0; s < N_PROMPTS; s++) {
            int32_t p = (int32_t)dfl_seq_len(ctx, s);
            idx[s] = dfl_batch_add_token(b, out[s][k], &p, s, true);
        }
        ok = dfl_decode(ctx, b, &err) == DFL_OK;
    }
    if (!ok) test_fail(t, __FILE__, __LINE__, "our decode: %s", err.msg);
    dfl_batch_free(b);
    dfl_context_free(ctx);
    dfl_model_free(m);
    return ok;
}

static void compare_type(test_ctx *t, const char *type, const char *arch, int *n_equal_out, int *n_total_out) {
    char tpath[512], args[512];
    snprintf(args, sizeof(args), "--n-embd 128 --n-layer 4 --n-head 4 --n-head-kv 2 --head-dim 32 --n-ff 256 "
             "--n-vocab %d --type %s --arch %s --seed 21", NV, type, arch);
    char dir[64];
    snprintf(dir, sizeof(dir), "%s_%s", type, arch);
    if (!tu_make_models(t, dir, args, tpath, NULL, sizeof(tpath))) return;
    static int32_t prompts[N_PROMPTS][48];
    int lens[N_PROMPTS];
    static char cases[8192];
    size_t len = 0;
    for (int s = 0; s < N_PROMPTS; s++) {
        lens[s] = 1 + (s * 7) % 45; /* 1 .. 45 tokens: up to 3 micro-batches of 16 */
        for (int i = 0; i < lens[s]; i++) prompts[s][i] = (int32_t)((i * 97 + s * 131 + 5) % (NV - 8));
        for (int i = 0; i < lens[s]; i++) len += (size_t)snprintf(cases + len, sizeof(cases) - len, "%s%d", i ? "," : "", prompts[s][i]);
        if (s + 1 < N_PROMPTS) cases[len++] = ';';
    }
    cases[len] = '\0';
    static char cmd[16384], out[65536];
    snprintf(cmd, sizeof(cmd), "node tests/peer/llama_greedy.mjs %s --cases '%s' --n %d --ctx 512 --batch 16", tpath, cases, N_GEN);
    int rc = test_run(cmd, out, sizeof(out));
    static int32_t ref[N_PROMPTS][N_GEN], ours[N_PROMPTS][N_GEN];
    int n_res = 0;
    if (rc != 0 || !tu_parse_results(out, &ref[0][0], N_PROMPTS, N_GEN, false, &n_res) || n_res != N_PROMPTS) {
        test_fail(t, __FILE__, __LINE__, "llama.cpp oracle failed (%d): %.400s", rc, out);
        return;
    }
    if (!our_greedy(t, tpath, prompts, lens, ours)) return;
    int n_equal = 0;
    for (int s = 0; s < N_PROMPTS; s++) {
        int first_diff = -1;
        for (int k = 0; k < N_GEN && first_diff < 0; k++) if (ours[s][k] != ref[s][k]) first_diff = k;
        if (first_diff < 0) n_equal++;
        else test_fail(t, __FILE__, __LINE__, "%s prompt %d (%d tokens): first difference at token %d: ours %d, llama.cpp %d",
                       type, s, lens[s], first_diff, ours[s][first_diff], ref[s][first_diff]);
    }
    printf("    %s %s: %d of %d prompts x %d tokens identical to llama.cpp\n", arch, type, n_equal, N_PROMPTS, N_GEN);
    *n_equal_out += n_equal;
    *n_total_out += N_PROMPTS;
}

TEST(peer_greedy_tokens_match_llama_cpp) {
    if (!tu_have_node_package(t, "node-llama-cpp")) return;
    const char *types[] = {"f32", "f16", "q8_0", "q4_0"};
    int eq = 0, tot = 0;
    for (int i = 0; i < 4; i++) compare_type(t, types[i], "qwen3", &eq, &tot);
    compare_type(t, "q8_0", "llama", &eq, &tot);
    CHECK_EQ_INT(eq, tot);
}
