/* cmd_bench.c: `dflash bench`: speed, measured honestly: every figure is the median of -r
 * repetitions after a warm-up, in one run, with ratios against the baseline measured beside it.
 * Rows: pp (prompt processing) and tg (generation) through a plain engine, a verification-sized
 * batch (one forward pass of a context), and with a drafter the speculative generation vs the
 * plain engine's on the same prompt (tau, per-step time split), the host vs device feature
 * paths; --llama adds llama.cpp's tg and pp16 on the same file. */
#include "cli_common.h"
#include "cmds.h"
#include "base/jsonw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_row {
    char name[48];
    double tok_s;  /* tokens per second (0: n/a) */
    double ms;     /* median milliseconds of one repetition */
    double gb_s;   /* weight bytes read per second (0: n/a) */
    char note[224];
} bench_row;

typedef struct bench {
    cli_opts o;
    int reps;
    int64_t n_pp, n_tg, n_verify, n_spec;
    bool csv, llama;
    cli_session s;         /* s.engine: the speculative engine (or plain with --no-spec / no drafter) */
    dfl_engine *plain;     /* a plain engine on the same target: the baselines */
    dfl_context *ar;       /* a plain target context: the verification-sized batch */
    uint64_t weight_bytes;
    bench_row rows[32];
    int n_rows;
} bench;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static bench_row *add_row(bench *b, const char *name) {
    bench_row *r = &b->rows[b->n_rows++];
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", name);
    return r;
}

/* Generates with seq 0 of e after the prompt until n tokens (greedy, EOS ignored): the prefill
 * is not timed; ms_out: the steps' wall time; d (may be NULL): the engine's totals of the steps
 * alone (after the prefill). */
static bool engine_gen(dfl_engine *e, const int32_t *prompt, int64_t n_prompt, int64_t n, double *ms_out,
                       dfl_engine_stats *d) {
    dfl_error err = {0};
    dfl_seq_params sp = dfl_seq_default_params();
    sp.max_tokens = n;
    sp.ignore_eos = true;
    dfl_engine_seq_reset(e, 0, NULL); /* no prefix reuse between repetitions */
    bool ok = dfl_engine_seq_start(e, 0, prompt, n_prompt, &sp, &err) == DFL_OK;
    const dfl_engine_stats s0 = dfl_engine_get_stats(e);
    const double t0 = cli_now_ms();
    while (ok && dfl_engine_seq_state(e, 0) == DFL_SEQ_ACTIVE) ok = dfl_engine_step(e, NULL, 0, &err) == DFL_OK;
    *ms_out = cli_now_ms() - t0;
    if (d != NULL) {
        const dfl_engine_stats s1 = dfl_engine_get_stats(e);
        d->t_draft_ms = s1.t_draft_ms - s0.t_draft_ms;
        d->t_verify_ms = s1.t_verify_ms - s0.t_verify_ms;
        d->t_inject_ms = s1.t_inject_ms - s0.t_inject_ms;
        d->t_other_ms = s1.t_other_ms - s0.t_other_ms;
        d->feature_host_bytes = s1.feature_host_bytes - s0.feature_host_bytes;
    }
    if (!ok) fprintf(stderr, "dflash bench: %s\n", err.msg);
    return ok;
}

static bool bench_ar(bench *b, const int32_t *prompt, int64_t n_prompt) {
    dfl_error err = {0};
    dfl_batch *bt = dfl_batch_init(b->n_verify, 0, 1, &err);
    int32_t *rnd = malloc((size_t)(b->n_pp + 1) * sizeof(int32_t));
    double *t = malloc((size_t)(b->reps + 1) * sizeof(double) * 3);
    if (bt == NULL || rnd == NULL || t == NULL) return false;
    const int64_t nv = dfl_n_vocab(b->ar);
    for (int64_t i = 0; i <= b->n_pp; i++) rnd[i] = (int32_t)((i * 2654435761u) % (uint64_t)nv);
    dfl_seq_params sp1 = dfl_seq_default_params();
    sp1.max_tokens = 1;
    bool ok = true;
    /* pp: a prefill of n_pp tokens (and its first token) */
    for (int r = 0; r <= b->reps && ok; r++) {
        dfl_engine_seq_reset(b->plain, 0, NULL);
        double t0 = cli_now_ms();
        ok = dfl_engine_seq_start(b->plain, 0, rnd, b->n_pp, &sp1, &err) == DFL_OK;
        if (r > 0) t[r - 1] = cli_now_ms() - t0;
    }
    if (!ok) goto out;
    {
        double ms = median(t, b->reps);
        bench_row *row = add_row(b, "");
        snprintf(row->name, sizeof(row->name), "pp%lld", (long long)b->n_pp);
        row->ms = ms;
        row->tok_s = (double)b->n_pp / (ms / 1e3);
        snprintf(row->note, sizeof(row->note), "prompt of %lld tokens, batches of %lld", (long long)b->n_pp,
                 (long long)b->o.n_batch);
    }
    /* tg: after the prompt, n_tg plain steps (greedy) */
    for (int r = 0; r <= b->reps && ok; r++) {
        double ms = 0;
        ok = engine_gen(b->plain, prompt, n_prompt, b->n_tg + 1, &ms, NULL);
        if (r > 0) t[r - 1] = ms;
    }
    if (!ok) goto out;
    {
        double ms = median(t, b->reps);
        bench_row *row = add_row(b, "");
        snprintf(row->name, sizeof(row->name), "tg%lld", (long long)b->n_tg);
        row->ms = ms / (double)b->n_tg;
        row->tok_s = (double)b->n_tg / (ms / 1e3);
        row->gb_s = (double)b->weight_bytes / (row->ms / 1e3) / 1e9;
        snprintf(row->note, sizeof(row->note), "ms per token; weights %.1f MB", (double)b->weight_bytes / 1e6);
    }
    /* a verification-sized batch (one forward pass, logits for all) after a prompt, rolled back */
    for (int r = 0; r <= b->reps && ok; r++) {
        dfl_seq_remove(b->ar, 0, 0, NULL);
        dfl_batch_clear(bt);
        for (int64_t i = 0; i < n_prompt && i < b->n_verify; i++) {
            const int32_t pos = (int32_t)i;
            dfl_batch_add_token(bt, prompt[i], &pos, 0, false);
        }
        ok = dfl_decode(b->ar, bt, &err) == DFL_OK;
        dfl_batch_clear(bt);
        for (int64_t i = 0; i < b->n_verify; i++) {
            const int32_t pos = (int32_t)(dfl_seq_len(b->ar, 0) + i);
            dfl_batch_add_token(bt, rnd[i], &pos, 0, true);
        }
        double t0 = cli_now_ms();
        ok = ok && dfl_decode(b->ar, bt, &err) == DFL_OK;
        if (r > 0) t[r - 1] = cli_now_ms() - t0;
    }
    if (!ok) {
        fprintf(stderr, "dflash bench: %s\n", err.msg);
        goto out;
    }
    {
        double ms = median(t, b->reps);
        bench_row *row = add_row(b, "");
        snprintf(row->name, sizeof(row->name), "verify%lld", (long long)b->n_verify);
        row->ms = ms;
        row->tok_s = (double)b->n_verify / (ms / 1e3);
        row->gb_s = (double)b->weight_bytes / (ms / 1e3) / 1e9;
        snprintf(row->note, sizeof(row->note), "one batch of %lld tokens, logits for all: %.2fx one tg step",
                 (long long)b->n_verify, ms / b->rows[b->n_rows - 2].ms);
    }
out:
    if (!ok) fprintf(stderr, "dflash bench: %s\n", err.msg);
    free(t);
    free(rnd);
    dfl_batch_free(bt);
    return ok;
}

static bool bench_spec(bench *b, const int32_t *prompt, int64_t n_prompt) {
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
        ok = engine_gen(b->plain, prompt, n_prompt, b->n_spec, &ms, NULL);
        if (r > 0) t_ar[r - 1] = ms;
        for (int f = 0; f < NV && ok; f++) {
            dfl_engine_stats d;
            ok = engine_gen(eng[f], prompt, n_prompt, b->n_spec, &ms, &d);
            dfl_engine_seq_stats(eng[f], 0, &st[f], NULL);
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
        double ar = median(t_ar, b->reps);
        bench_row *row = add_row(b, "ar-gen");
        row->ms = ar / n_gen;
        row->tok_s = n_gen / (ar / 1e3);
        snprintf(row->note, sizeof(row->note), "autoregressive greedy, %lld tokens after a %lld-token prompt",
                 (long long)b->n_spec, (long long)n_prompt);
        for (int f = 0; f < NV; f++) {
            double sp = median(t_sp[f], b->reps);
            const double steps = (double)(st[f].n_steps > 0 ? st[f].n_steps : 1);
            const double tau = (double)(st[f].n_accepted + st[f].n_steps) / steps;
            row = add_row(b, names[f]);
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

static void bench_llama(bench *b) {
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd), "node tests/peer/llama_bench.mjs '%s' --threads %d --tg %lld --pp %lld --reps %d", b->o.model,
             b->o.n_threads > 0 ? b->o.n_threads : 2, (long long)b->n_tg, (long long)b->n_verify, b->reps);
    FILE *f = popen(cmd, "r");
    size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
    out[n] = '\0';
    int rc = f ? pclose(f) : -1;
    const char *pp = strstr(out, "\"pp_tok_s\":"), *tg = strstr(out, "\"tg_tok_s\":");
    if (rc != 0 || pp == NULL || tg == NULL) {
        fprintf(stderr, "dflash bench: the llama.cpp comparison failed (needs node and tests/peer/node_modules): %.300s\n", out);
        return;
    }
    double pp_s = atof(pp + 11), tg_s = atof(tg + 11);
    double our_tg = 0, our_v = 0;
    for (int i = 0; i < b->n_rows; i++) {
        if (!strncmp(b->rows[i].name, "tg", 2)) our_tg = b->rows[i].tok_s;
        if (!strncmp(b->rows[i].name, "verify", 6)) our_v = b->rows[i].tok_s;
    }
    bench_row *row = add_row(b, "llama.cpp tg");
    row->tok_s = tg_s;
    row->ms = 1e3 / tg_s;
    row->gb_s = (double)b->weight_bytes / (row->ms / 1e3) / 1e9;
    snprintf(row->note, sizeof(row->note), "node-llama-cpp 3.21.1, same file; dflash/llama.cpp = %.2fx", our_tg / tg_s);
    row = add_row(b, "");
    snprintf(row->name, sizeof(row->name), "llama.cpp pp%lld", (long long)b->n_verify);
    row->tok_s = pp_s;
    row->ms = (double)b->n_verify * 1e3 / pp_s;
    row->gb_s = (double)b->weight_bytes / (row->ms / 1e3) / 1e9;
    snprintf(row->note, sizeof(row->note), "dflash verify%lld / llama.cpp pp%lld = %.2fx", (long long)b->n_verify,
             (long long)b->n_verify, our_v / pp_s);
}

static int usage(FILE *out) {
    fprintf(out, "usage: dflash bench [-m TARGET.gguf] [-md DRAFT.gguf] [options]\n"
                 "  -r N            repetitions per figure (median; one warm-up more; default 5)\n"
                 "  --pp N          prompt-processing tokens (default 512)\n"
                 "  --tg N          generation tokens (default 64)\n"
                 "  --verify N      tokens in the verification-sized batch (default 16)\n"
                 "  --spec-n N      tokens generated in the speculative comparison (default 128)\n"
                 "  --llama         also measure llama.cpp (node-llama-cpp) on the same file\n"
                 "  --csv           CSV instead of a markdown table\n");
    cli_print_common_help(out);
    return out == stdout ? 0 : 2;
}

int cmd_bench(int argc, char **argv) {
    bench b;
    memset(&b, 0, sizeof(b));
    cli_opts_default(&b.o);
    b.reps = 5;
    b.n_pp = 512;
    b.n_tg = 64;
    b.n_verify = 16;
    b.n_spec = 128;
    b.o.prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!strcmp(a, "--csv")) { b.csv = true; continue; }
        if (!strcmp(a, "--llama")) { b.llama = true; continue; }
        if ((!strcmp(a, "-r") || !strcmp(a, "--pp") || !strcmp(a, "--tg") || !strcmp(a, "--verify") || !strcmp(a, "--spec-n")) &&
            i + 1 < argc) {
            long long v = strtoll(argv[++i], &end, 10);
            if (*end != '\0' || v < 1 || v > 100000 || (!strcmp(a, "--verify") && v > 64)) {
                fprintf(stderr, "dflash bench: invalid value '%s' for %s\n", argv[i], a);
                return 2;
            }
            if (!strcmp(a, "-r")) b.reps = (int)v;
            else if (!strcmp(a, "--pp")) b.n_pp = v;
            else if (!strcmp(a, "--tg")) b.n_tg = v;
            else if (!strcmp(a, "--verify")) b.n_verify = v;
            else b.n_spec = v < 2 ? 2 : v;
            continue;
        }
        int r = cli_parse_common(&b.o, argc, argv, &i, "bench");
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "dflash bench: unknown option %s\n", a);
            return usage(stderr);
        }
    }
    b.o.n_ctx = b.n_pp + b.n_tg + b.n_spec + 256;
    if (cli_session_open(&b.s, &b.o, true, "bench") != 0) {
        cli_session_close(&b.s);
        return 1;
    }
    dfl_error err = {0};
    dfl_engine_free(b.s.engine); /* the bench builds its own engines (one backend for all) */
    b.s.engine = NULL;
    dfl_engine_params ep = cli_engine_params(&b.o);
    b.plain = dfl_engine_new_from_models(b.s.target, NULL, b.s.vocab, &ep, &err);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = b.o.n_ctx;
    cp.n_batch = cp.n_ubatch = cp.n_outputs = b.n_verify;
    cp.n_threads = b.o.n_threads;
    cp.n_threads_batch = b.o.n_threads_batch;
    cp.device = b.o.device;
    b.ar = b.plain != NULL ? dfl_context_new(b.s.target, &cp, &err) : NULL;
    if (b.ar == NULL) {
        fprintf(stderr, "dflash bench: %s\n", err.msg);
        dfl_engine_free(b.plain);
        cli_session_close(&b.s);
        return 1;
    }
    b.weight_bytes = dfl_model_n_bytes(b.s.target);
    int32_t *prompt = NULL;
    int64_t n_prompt = cli_tokenize_prompt(&b.s, &b.o, b.o.prompt, &prompt, "bench");
    bool ok = n_prompt > 0 && bench_ar(&b, prompt, n_prompt);
    if (ok && b.s.drafter != NULL) ok = bench_spec(&b, prompt, n_prompt);
    if (ok && b.llama) bench_llama(&b);
    const dfl_hparams *hp = dfl_model_hparams(b.s.target);
    if (b.csv) {
        printf("test,tok_s,ms,gb_s,note\n");
        for (int i = 0; i < b.n_rows; i++) {
            printf("%s,%.2f,%.3f,%.2f,\"%s\"\n", b.rows[i].name, b.rows[i].tok_s, b.rows[i].ms, b.rows[i].gb_s, b.rows[i].note);
        }
    } else {
        printf("model: %s (%s, %lld layers, n_embd %lld, %.1f MB)%s%s, threads %d (0 = all cores), %s queues, "
               "median of %d after a warm-up\n\n",
               b.o.model, dfl_arch_name(hp->arch), (long long)hp->n_layer, (long long)hp->n_embd, (double)b.weight_bytes / 1e6,
               b.s.drafter ? ", drafter " : "", b.s.drafter ? b.o.draft : "", b.o.n_threads, b.o.async ? "async" : "sync", b.reps);
        printf("| test | tok/s | ms | GB/s | notes |\n|---|---:|---:|---:|---|\n");
        for (int i = 0; i < b.n_rows; i++) {
            char gbs[32] = "";
            if (b.rows[i].gb_s > 0) snprintf(gbs, sizeof(gbs), "%.2f", b.rows[i].gb_s);
            printf("| %s | %.2f | %.3f | %s | %s |\n", b.rows[i].name, b.rows[i].tok_s, b.rows[i].ms, gbs, b.rows[i].note);
        }
    }
    free(prompt);
    dfl_context_free(b.ar);
    dfl_engine_free(b.plain);
    cli_session_close(&b.s);
    return ok ? 0 : 1;
}
