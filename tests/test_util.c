/* test_util.c: helpers for the model tests (see test_util.h). Not a test file itself. */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool tu_make_models(test_ctx *t, const char *dir_name, const char *args, char *target, char *drafter, size_t cap) {
    char dir[512], cmd[2048], out[4096];
    test_path(t, dir_name, dir, sizeof(dir));
    snprintf(cmd, sizeof(cmd), "%s make-test-model -o %s %s", test_cli_path(), dir, args);
    int rc = test_run(cmd, out, sizeof(out));
    if (rc != 0) {
        test_fail(t, __FILE__, __LINE__, "make-test-model failed (%d): %s\n%s", rc, cmd, out);
        return false;
    }
    snprintf(target, cap, "%s/target.gguf", dir);
    if (drafter) snprintf(drafter, cap, "%s/drafter.gguf", dir);
    return true;
}

bool tu_have_numpy(test_ctx *t) {
    char out[256];
    if (test_run("/usr/bin/python3 -c 'import numpy'", out, sizeof(out)) != 0) {
        test_skip(t, "Debian's python3-numpy is not installed (make deps)");
        return false;
    }
    return true;
}

float *tu_read_floats(const char *path, int64_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *x = malloc((size_t)size + 4);
    if (x == NULL || fread(x, 1, (size_t)size, f) != (size_t)size) {
        free(x);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *n = size / 4;
    return x;
}

double tu_rel_err(const float *a, const float *ref, int64_t n) {
    double max_d = 0, max_r = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        if (!(d == d)) return INFINITY;
        if (d > max_d) max_d = d;
        if (fabs((double)ref[i]) > max_r) max_r = fabs((double)ref[i]);
    }
    return max_r > 0 ? max_d / max_r : max_d;
}

void tu_ids_csv(const int32_t *ids, int64_t n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int64_t i = 0; i < n && len + 16 < cap; i++) len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", ids[i]);
}

int32_t tu_argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

dfl_status tu_decode(dfl_context *ctx, int32_t seq, const int32_t *tokens, int64_t n, float *out, dfl_error *err) {
    dfl_batch *b = dfl_batch_init(n, 0, 1, err);
    if (b == NULL) return DFL_ERR_NOMEM;
    const int64_t p0 = dfl_seq_len(ctx, seq);
    for (int64_t i = 0; i < n; i++) {
        const int32_t pos = (int32_t)(p0 + i);
        dfl_batch_add_token(b, tokens[i], &pos, seq, out != NULL);
    }
    dfl_status st = dfl_decode(ctx, b, err);
    if (st == DFL_OK && out != NULL) {
        const int64_t nv = dfl_n_vocab(ctx);
        for (int64_t i = 0; i < n; i++) memcpy(out + i * nv, dfl_get_logits(ctx, i), (size_t)nv * sizeof(float));
    }
    dfl_batch_free(b);
    return st;
}

dfl_status tu_greedy(dfl_context *ctx, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t n_gen, int32_t *out,
                     dfl_error *err) {
    const int64_t nv = dfl_n_vocab(ctx);
    dfl_batch *b = dfl_batch_init(n_prompt > 1 ? n_prompt : 1, 0, 1, err);
    if (b == NULL) return DFL_ERR_NOMEM;
    int64_t p0 = dfl_seq_len(ctx, seq);
    for (int64_t i = 0; i < n_prompt; i++) {
        const int32_t pos = (int32_t)(p0 + i);
        dfl_batch_add_token(b, prompt[i], &pos, seq, i == n_prompt - 1);
    }
    dfl_status st = dfl_decode(ctx, b, err);
    int64_t last = n_prompt - 1;
    for (int64_t k = 0; k < n_gen && st == DFL_OK; k++) {
        out[k] = tu_argmax(dfl_get_logits(ctx, last), nv);
        if (k + 1 == n_gen) break;
        dfl_batch_clear(b);
        const int32_t pos = (int32_t)dfl_seq_len(ctx, seq);
        dfl_batch_add_token(b, out[k], &pos, seq, true);
        st = dfl_decode(ctx, b, err);
        last = 0;
    }
    dfl_batch_free(b);
    return st;
}

bool tu_have_node_package(test_ctx *t, const char *pkg) {
    char out[256], path[512], why[600];
    if (test_run("command -v node", out, sizeof(out)) != 0) {
        test_skip(t, "node is not installed (make deps)");
        return false;
    }
    snprintf(path, sizeof(path), "tests/peer/node_modules/%s/package.json", pkg);
    if (access(path, R_OK) != 0) {
        snprintf(why, sizeof(why), "tests/peer/node_modules/%s is missing (make deps)", pkg);
        test_skip(t, why);
        return false;
    }
    return true;
}

bool tu_parse_results(const char *json, int32_t *res, int n_rows, int n_cols, bool exact, int *n_res) {
    const char *p = strstr(json, "\"results\":[");
    if (p == NULL) return false;
    p += strlen("\"results\":[");
    *n_res = 0;
    while (*p == '[' && *n_res < n_rows) {
        p++;
        int k = 0;
        while (*p != ']' && *p != '\0') {
            char *end;
            const long v = strtol(p, &end, 10);
            if (end == p) return false;
            if (k < n_cols) res[(size_t)*n_res * (size_t)n_cols + (size_t)k++] = (int32_t)v;
            p = end;
            if (*p == ',') p++;
        }
        if (*p != ']' || (exact && k != n_cols)) return false;
        p++;
        (*n_res)++;
        if (*p == ',') p++;
    }
    return true;
}

void tu_oracle_hook(void *user, int32_t seq, int32_t *draft, int32_t n_draft) {
    tu_oracle *o = user;
    if (o->mode == 0) return;
    for (int32_t j = 0; j < n_draft; j++) {
        const int64_t at = o->done[seq] + j;
        draft[j] = at < o->n_ref ? o->ref[seq][at] : 0;
    }
    o->rng += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    uint64_t r = o->rng;
    r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
    r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
    r ^= r >> 31;
    if (r % 4 != 0) { /* 3 in 4 steps: one planted error at a random slot */
        const int32_t j = (int32_t)((r >> 8) % (uint64_t)n_draft);
        draft[j] = (draft[j] + 1) % o->n_vocab;
    }
}

bool tu_pair_open(test_ctx *t, tu_pair *p, const char *tpath, const char *dpath, const tu_pair_params *pp) {
    memset(p, 0, sizeof(*p));
    dfl_error err = {0};
    p->target = dfl_model_load(tpath, NULL, &err);
    p->drafter = p->target ? dfl_model_load(dpath, NULL, &err) : NULL;
    if (p->drafter == NULL) {
        test_fail(t, __FILE__, __LINE__, "load: %s", err.msg);
        return false;
    }
    const dfl_hparams *dh = dfl_model_hparams(p->drafter);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_seq = pp->n_seq;
    cp.n_ctx = 256;
    cp.n_batch = pp->n_batch;
    cp.n_ubatch = 16;
    cp.n_outputs = pp->n_batch;
    cp.kv_f32 = pp->kv_f32;
    cp.n_threads = cp.n_threads_batch = 1; /* tiny models: the thread pool would only add dispatch overhead */
    cp.device = pp->device;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    p->tctx = dfl_context_new(p->target, &cp, &err);
    if (p->tctx != NULL && pp->ref_ctx) {
        dfl_context_params rp = cp;
        rp.n_seq = 1;
        rp.n_capture = 0;
        rp.capture_layers = NULL;
        p->rctx = dfl_context_new(p->target, &rp, &err);
    }
    dfl_context_params dcp = dfl_context_default_params();
    dcp.n_seq = pp->n_seq;
    dcp.target = p->tctx;
    dcp.kv_f32 = pp->kv_f32;
    if (pp->drafter_n_batch > 0) dcp.n_batch = pp->drafter_n_batch;
    dcp.n_draft_vocab = pp->n_draft_vocab;
    dcp.draft_vocab = pp->draft_vocab;
    const bool ready = p->tctx != NULL && (!pp->ref_ctx || p->rctx != NULL);
    p->dctx = ready ? dfl_context_new(p->drafter, &dcp, &err) : NULL;
    const spec_params sp0 = pp->sp ? *pp->sp : spec_default_params();
    p->spec = p->dctx ? spec_new(p->tctx, p->dctx, &sp0, &err) : NULL;
    if (p->spec == NULL) {
        test_fail(t, __FILE__, __LINE__, "setup: %s", err.msg);
        return false;
    }
    return true;
}

void tu_pair_close(tu_pair *p) {
    spec_free(p->spec);
    dfl_context_free(p->dctx);
    dfl_context_free(p->tctx);
    dfl_context_free(p->rctx);
    dfl_model_free(p->drafter);
    dfl_model_free(p->target);
    memset(p, 0, sizeof(*p));
}

/* Appends what sequence s produced since the last read to got + s * cap. */
static void tu_engine_collect(dfl_engine *e, int s, int32_t *got, int64_t cap, int64_t *n_got, tu_oracle *o,
                              dfl_error *err) {
    dfl_seq_output out;
    dfl_engine_seq_read(e, s, &out, err);
    for (int64_t j = 0; j < out.n_tokens && n_got[s] < cap; j++) got[s * cap + n_got[s]++] = out.tokens[j];
    if (o != NULL) o->done[s] = n_got[s];
}

bool tu_engine_generate(dfl_engine *e, int n_seq, int32_t *const *prompts, const int64_t *lens, const dfl_seq_params *sp,
                        int32_t *got, int64_t cap, int64_t *n_got, tu_oracle *o, dfl_error *err) {
    bool ok = true;
    for (int s = 0; s < n_seq && ok; s++) {
        ok = dfl_engine_seq_start(e, s, prompts[s], lens[s], sp, err) == DFL_OK;
        if (ok) tu_engine_collect(e, s, got, cap, n_got, o, err);
    }
    for (int guard = 0; ok && dfl_engine_n_active(e) > 0 && guard < 1000; guard++) {
        ok = dfl_engine_step(e, NULL, 0, err) == DFL_OK;
        for (int s = 0; ok && s < n_seq; s++) tu_engine_collect(e, s, got, cap, n_got, o, err);
    }
    return ok;
}

float *tu_pack_ab(test_ctx *t, dfl_model *m, const int32_t *prompt, int64_t n, int64_t n_gen,
                  void (*check)(test_ctx *t, dfl_context *c)) {
    float *lg[2] = {NULL, NULL};
    int32_t gen[2][16];
    int64_t nv = 0;
    bool ok = n <= 16 && n_gen <= 16;
    for (int k = 0; k < 2 && ok; k++) {
        dfl_error err = {0};
        dfl_context_params cp = dfl_context_default_params();
        cp.n_ctx = 64;
        cp.n_batch = cp.n_ubatch = cp.n_outputs = 16;
        cp.n_threads = cp.n_threads_batch = 2;
        cp.no_weight_pack = k == 1;
        dfl_context *c = dfl_context_new(m, &cp, &err);
        if (c == NULL) {
            test_fail(t, __FILE__, __LINE__, "context (no_weight_pack %d): %s", k, err.msg);
            ok = false;
            break;
        }
        if (k == 0 && check != NULL) check(t, c);
        nv = dfl_n_vocab(c);
        lg[k] = malloc(sizeof(float) * (size_t)(n * nv));
        ok = lg[k] != NULL && tu_decode(c, 0, prompt, n, lg[k], &err) == DFL_OK &&
             dfl_seq_remove(c, 0, 0, &err) == DFL_OK && tu_greedy(c, 0, prompt, n, n_gen, gen[k], &err) == DFL_OK;
        if (!ok) test_fail(t, __FILE__, __LINE__, "decode (no_weight_pack %d): %s", k, err.msg);
        dfl_context_free(c);
    }
    if (ok) {
        CHECK_MSG(memcmp(lg[0], lg[1], sizeof(float) * (size_t)(n * nv)) == 0, "logits differ with the packed weights");
        CHECK_MSG(memcmp(gen[0], gen[1], sizeof(int32_t) * (size_t)n_gen) == 0, "greedy tokens differ with the packed weights");
    }
    free(lg[1]);
    if (!ok) {
        free(lg[0]);
        return NULL;
    }
    return lg[0];
}
