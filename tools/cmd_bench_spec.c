/* cmd_bench_spec.c: the speculative rows of `dflash bench` (cmd_bench.h): the speculative
 * generation vs the plain one on the same prompt (feature paths), the drafter pass, one
 * speculative step at a fixed draft length (3 and 15 drafts: the step's cost whatever the
 * drafter accepts), and --llama's comparison with node-llama-cpp. */
#include "cmd_bench.h"

#include <stdlib.h>
#include <string.h>

bool bench_spec(bench *b, const int32_t *prompt, int64_t n_prompt) {
    enum { NV = 3 };
    static const char *names[NV] = {"spec-gen (device features)", "spec-gen (host features)",
                                    "spec-gen (device features, device-side wait)"};
    const dfl_feature_path paths[NV] = {DFL_FEATURES_DEVICE, DFL_FEATURES_HOST, DFL_FEATURES_DEVICE};
    const dfl_feature_wait waits[NV] = {DFL_WAIT_HOST, DFL_WAIT_HOST, DFL_WAIT_DEVICE};
    dfl_engine *eng[NV] = {NULL};
    double *t_ar = malloc(sizeof(double) * (size_t)b->reps), *t_sp[NV];
    for (int f = 0; f < NV; f++) t_sp[f] = malloc(sizeof(double) * (size_t)b->reps);
    dfl_seq_stats st[NV];
    double split[NV][4] = {{0}};
    uint64_t host_bytes[NV] = {0};
    bool ok = t_ar && t_sp[0] && t_sp[1] && t_sp[2];
    dfl_error err = {0};
    for (int f = 0; f < NV && ok; f++) {
        dfl_engine_params ep = cli_engine_params(&b->o);
        ep.features = paths[f];
        ep.wait = waits[f];
        ep.share_backend = b->plain; /* one thread pool for every engine of the run */
        eng[f] = dfl_engine_new_from_models(b->s.target, b->s.drafter, b->s.vocab, &ep, &err);
        if (eng[f] == NULL) {
            fprintf(stderr, "dflash bench: %s\n", err.msg);
            ok = false;
        }
    }
    for (int r = 0; r <= b->reps && ok; r++) {
        double ms = 0;
        ok = bench_engine_gen(b->plain, prompt, n_prompt, b->n_spec, &ms, NULL, NULL);
        if (r > 0) t_ar[r - 1] = ms;
        for (int f = 0; f < NV && ok; f++) {
            dfl_engine_stats d;
            ok = bench_engine_gen(eng[f], prompt, n_prompt, b->n_spec, &ms, &d, &st[f]);
            host_bytes[f] = d.feature_host_bytes;
            if (r > 0) {
                t_sp[f][r - 1] = ms;
                const double steps = (double)(st[f].n_steps > 0 ? st[f].n_steps : 1);
                split[f][0] += d.t_draft_ms / steps / b->reps;
                split[f][1] += d.t_verify_ms / steps / b->reps;
                split[f][2] += d.t_inject_ms / steps / b->reps;
                split[f][3] += d.t_other_ms / steps / b->reps;
            }
        }
    }
    if (ok) {
        const double n_gen = (double)(b->n_spec - 1);
        double ar = bench_median(t_ar, b->reps);
        bench_row *row = bench_add_row(b, "ar-gen");
        row->ms = ar / n_gen;
        row->tok_s = n_gen / (ar / 1e3);
        snprintf(row->note, sizeof(row->note), "autoregressive greedy, %lld tokens after a %lld-token prompt",
                 (long long)b->n_spec, (long long)n_prompt);
        for (int f = 0; f < NV; f++) {
            double sp = bench_median(t_sp[f], b->reps);
            const double steps = (double)(st[f].n_steps > 0 ? st[f].n_steps : 1);
            const double tau = (double)(st[f].n_accepted + st[f].n_steps) / steps;
            row = bench_add_row(b, "%s", names[f]);
            row->ms = sp / n_gen;
            row->tok_s = n_gen / (sp / 1e3);
            snprintf(row->note, sizeof(row->note), "%.2fx ar; tau %.2f; %.1f drafts verified per step; step %.2f ms = "
                     "draft %.2f + verify %.2f + inject %.2f + other %.2f; %llu feature bytes via host",
                     ar / sp, tau, (double)st[f].n_draft_tokens / steps, split[f][0] + split[f][1] + split[f][2] + split[f][3],
                     split[f][0], split[f][1], split[f][2], split[f][3], (unsigned long long)host_bytes[f]);
        }
    }
    for (int f = 0; f < NV; f++) dfl_engine_free(eng[f]);
    free(t_ar);
    for (int f = 0; f < NV; f++) free(t_sp[f]);
    return ok;
}

/* One fixed-length configuration: k drafts every step (draft-min = draft-max = k, no
 * probability cut), -r repetitions of n_tg generated tokens after the prompt. Per repetition:
 * ms per step, tokens per second, and the drafter's time per step (drafter_draft, timed by the
 * session around the pass alone); medians over the repetitions. */
typedef struct spec_fixed {
    int32_t k;
    double ms_step, tok_s, draft_ms, verify_ms, other_ms, tau;
    int64_t n_steps, n_gen;
} spec_fixed;

static bool spec_fixed_run(bench *b, const int32_t *prompt, int64_t n_prompt, spec_fixed *out) {
    dfl_error err = {0};
    dfl_engine_params ep = cli_engine_params(&b->o);
    ep.n_draft = out->k;
    ep.n_draft_min = 0; /* always k drafts */
    ep.draft_p_min = 0.0f;
    ep.share_backend = b->plain;
    dfl_engine *e = dfl_engine_new_from_models(b->s.target, b->s.drafter, b->s.vocab, &ep, &err);
    double *v = malloc(sizeof(double) * (size_t)b->reps * 5);
    bool ok = e != NULL && v != NULL;
    if (e == NULL) fprintf(stderr, "dflash bench: %s\n", err.msg);
    dfl_seq_stats st = {0};
    for (int r = 0; r <= b->reps && ok; r++) {
        double ms = 0;
        dfl_engine_stats d;
        ok = bench_engine_gen(e, prompt, n_prompt, b->n_tg, &ms, &d, &st);
        if (!ok || r == 0) continue;
        const double steps = (double)(st.n_steps > 0 ? st.n_steps : 1);
        v[0 * b->reps + r - 1] = ms / steps;
        v[1 * b->reps + r - 1] = (double)st.n_generated / (ms / 1e3);
        v[2 * b->reps + r - 1] = d.t_draft_ms / steps;
        v[3 * b->reps + r - 1] = d.t_verify_ms / steps;
        v[4 * b->reps + r - 1] = (d.t_inject_ms + d.t_other_ms) / steps;
    }
    if (ok) {
        out->ms_step = bench_median(v, b->reps);
        out->tok_s = bench_median(v + b->reps, b->reps);
        out->draft_ms = bench_median(v + 2 * b->reps, b->reps);
        out->verify_ms = bench_median(v + 3 * b->reps, b->reps);
        out->other_ms = bench_median(v + 4 * b->reps, b->reps);
        out->n_steps = st.n_steps;
        out->n_gen = st.n_generated;
        out->tau = st.n_steps > 0 ? (double)(st.n_accepted + st.n_steps) / (double)st.n_steps : 0.0;
    }
    free(v);
    dfl_engine_free(e);
    return ok;
}

bool bench_spec_steps(bench *b, const int32_t *prompt, int64_t n_prompt) {
    const int32_t kmax = (int32_t)dfl_model_hparams(b->s.drafter)->n_draft_max;
    const int32_t kfull = kmax < DFL_MAX_DRAFT - 1 ? kmax : DFL_MAX_DRAFT - 1;
    /* [0]: the full block (the drafter pass row), then the two step rows, clamped to the block */
    spec_fixed runs[3] = {{.k = kfull}, {.k = 3 < kfull ? 3 : kfull}, {.k = 15 < kfull ? 15 : kfull}};
    bool ok = true;
    for (int i = 0; i < 3 && ok; i++) {
        const spec_fixed *same = NULL;
        for (int j = 0; j < i; j++) same = runs[j].k == runs[i].k ? &runs[j] : same;
        if (same != NULL) runs[i] = *same; /* one run per distinct draft length */
        else ok = spec_fixed_run(b, prompt, n_prompt, &runs[i]);
    }
    if (!ok) return false;
    bench_row *row = bench_add_row(b, "drafter pass");
    row->ms = runs[0].draft_ms;
    snprintf(row->note, sizeof(row->note), "one drafter forward drafting a full block (%d drafts), greedy: "
             "%.2fx one tg step; ms per step, median of %d runs of %lld steps", kfull, runs[0].draft_ms / b->tg_ms,
             b->reps, (long long)runs[0].n_steps);
    for (int i = 1; i < 3; i++) {
        if (i == 2 && runs[2].k == runs[1].k) break; /* a block of 3 drafts or fewer: one row */
        row = bench_add_row(b, "spec d%d", runs[i].k);
        row->ms = runs[i].ms_step;
        row->tok_s = runs[i].tok_s;
        snprintf(row->note, sizeof(row->note), "ms per step (%d drafts each, verify %d rows), %.2fx one tg step: draft %.2f "
                 "+ verify %.2f + other %.2f; tau %.2f (1.00: nothing accepted); %lld tokens in %lld steps",
                 runs[i].k, runs[i].k + 1, runs[i].ms_step / b->tg_ms, runs[i].draft_ms, runs[i].verify_ms,
                 runs[i].other_ms, runs[i].tau, (long long)runs[i].n_gen, (long long)runs[i].n_steps);
    }
    return true;
}

bool bench_llama(bench *b) {
    char script[4096], out[4096], threads[32], tg[32], pp[32], reps[32];
    if (!cli_find_peer_script("llama_bench.mjs", script, sizeof(script), "bench")) return false;
    snprintf(threads, sizeof(threads), "%d", b->o.n_threads > 0 ? b->o.n_threads : 2);
    snprintf(tg, sizeof(tg), "%lld", (long long)b->n_tg);
    snprintf(pp, sizeof(pp), "%lld", (long long)b->n_verify);
    snprintf(reps, sizeof(reps), "%d", b->reps);
    /* argv, no shell: the model path is passed as it is */
    char *argv[] = {"node", script, (char *)b->o.model, "--threads", threads, "--tg", tg, "--pp", pp, "--reps", reps, NULL};
    const int rc = cli_spawn_capture(argv, out, sizeof(out), "bench");
    const char *pps = strstr(out, "\"pp_tok_s\":"), *tgs = strstr(out, "\"tg_tok_s\":");
    if (rc != 0 || pps == NULL || tgs == NULL) {
        if (rc >= 0) {
            fprintf(stderr, "dflash bench: the llama.cpp comparison failed (node %s, exit %d; needs node and "
                    "tests/peer/node_modules: make deps): %.600s\n", script, rc, out);
        }
        return false;
    }
    double pp_s = atof(pps + 11), tg_s = atof(tgs + 11);
    double our_tg = 0, our_v = 0;
    for (int i = 0; i < b->n_rows; i++) {
        if (!strncmp(b->rows[i].name, "tg", 2)) our_tg = b->rows[i].tok_s;
        if (!strncmp(b->rows[i].name, "verify", 6) && strchr(b->rows[i].name, 'x') == NULL) our_v = b->rows[i].tok_s;
    }
    bench_row *row = bench_add_row(b, "llama.cpp tg");
    row->tok_s = tg_s;
    row->ms = 1e3 / tg_s;
    row->gb_s = (double)b->weight_bytes / (row->ms / 1e3) / 1e9;
    snprintf(row->note, sizeof(row->note), "node-llama-cpp 3.21.1, same file; dflash/llama.cpp = %.2fx", our_tg / tg_s);
    row = bench_add_row(b, "llama.cpp pp%lld", (long long)b->n_verify);
    row->tok_s = pp_s;
    row->ms = (double)b->n_verify * 1e3 / pp_s;
    row->gb_s = (double)b->weight_bytes / (row->ms / 1e3) / 1e9;
    snprintf(row->note, sizeof(row->note), "dflash verify%lld / llama.cpp pp%lld = %.2fx", (long long)b->n_verify,
             (long long)b->n_verify, our_v / pp_s);
    return true;
}
