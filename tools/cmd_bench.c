/* cmd_bench.c: `dflash bench`: speed, measured honestly: every figure is the median of -r
 * repetitions after a warm-up, in one run, with ratios against the baseline measured beside it.
 * Rows: pp (prompt processing), tg (generation), a verification-sized batch, and with a drafter
 * the speculative generation vs autoregressive on the same prompt (tau, per-step time split), the
 * host vs device feature paths; --llama adds llama.cpp's tg and pp16 on the same file. */
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
    cli_session s;
    dfl_context *ar;       /* a plain target context (no feature capture) for the baselines */
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

/* Decodes tokens [0, n) of seq 0 from position p0 in batches of n_batch; logits of the last. */
static bool decode_tokens(dfl_context *ctx, dfl_batch *bt, const int32_t *tok, int64_t n, int64_t n_batch, bool all_out) {
    dfl_error err = {0};
    const int64_t p0 = dfl_seq_len(ctx, 0);
    for (int64_t off = 0; off < n; off += n_batch) {
        const int64_t m = n - off < n_batch ? n - off : n_batch;
        dfl_batch_clear(bt);
        for (int64_t j = 0; j < m; j++) {
            const int32_t pos = (int32_t)(p0 + off + j);
            dfl_batch_add_token(bt, tok[off + j], &pos, 0, all_out || off + j == n - 1);
        }
        if (dfl_decode(ctx, bt, &err) != DFL_OK) {
            fprintf(stderr, "dflash bench: %s\n", err.msg);
            return false;
        }
    }
    return true;
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 1; i < n; i++) if (x[i] > x[k]) k = i;
    return (int32_t)k;
}

static bool bench_ar(bench *b, const int32_t *prompt, int64_t n_prompt) {
    dfl_error err = {0};
    const int64_t nb = b->o.n_batch;
    dfl_batch *bt = dfl_batch_init(nb > b->n_verify ? nb : b->n_verify, 0, 1, &err);
    const int64_t n_rnd = (b->n_pp > b->n_verify ? b->n_pp : b->n_verify) + 1; /* pp and verify read it */
    int32_t *rnd = malloc((size_t)n_rnd * sizeof(int32_t));
    double *t = malloc((size_t)(b->reps + 1) * sizeof(double) * 3);
    if (bt == NULL || rnd == NULL || t == NULL) return false;
    const int64_t nv = dfl_n_vocab(b->ar);
    for (int64_t i = 0; i < n_rnd; i++) rnd[i] = (int32_t)((i * 2654435761u) % (uint64_t)nv);
    bool ok = true;
    /* pp */
    for (int r = 0; r <= b->reps && ok; r++) {
        dfl_seq_remove(b->ar, 0, 0, NULL);
        double t0 = cli_now_ms();
        ok = decode_tokens(b->ar, bt, rnd, b->n_pp, nb, false);
        if (r > 0) t[r - 1] = cli_now_ms() - t0;
    }
    if (!ok) goto out;
    {
        double ms = median(t, b->reps);
        bench_row *row = add_row(b, "");
        snprintf(row->name, sizeof(row->name), "pp%lld", (long long)b->n_pp);
        row->ms = ms;
        row->tok_s = (double)b->n_pp / (ms / 1e3);
        snprintf(row->note, sizeof(row->note), "prompt of %lld tokens, batches of %lld", (long long)b->n_pp, (long long)nb);
    }
    /* tg: after the prompt, n_tg single-token steps (greedy) */
    for (int r = 0; r <= b->reps && ok; r++) {
        dfl_seq_remove(b->ar, 0, 0, NULL);
        ok = decode_tokens(b->ar, bt, prompt, n_prompt, nb, false);
        int32_t tok = ok ? argmax(dfl_get_logits(b->ar, bt->n_tokens - 1), nv) : 0;
        double t0 = cli_now_ms();
        for (int64_t k = 0; k < b->n_tg && ok; k++) {
            ok = decode_tokens(b->ar, bt, &tok, 1, nb, true);
            if (ok) tok = argmax(dfl_get_logits(b->ar, 0), nv);
        }
        if (r > 0) t[r - 1] = cli_now_ms() - t0;
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
    /* a verification-sized batch at the end of the prompt, rolled back each time */
    for (int r = 0; r <= b->reps && ok; r++) {
        dfl_seq_remove(b->ar, 0, 0, NULL);
        ok = decode_tokens(b->ar, bt, prompt, n_prompt, nb, false);
        double t0 = cli_now_ms();
        if (ok) ok = decode_tokens(b->ar, bt, rnd, b->n_verify, b->n_verify, true);
        if (r > 0) t[r - 1] = cli_now_ms() - t0;
    }
    if (!ok) goto out;
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
    free(t);
    free(rnd);
    dfl_batch_free(bt);
    return ok;
}

/* AR greedy generation of n tokens after the prompt (the baseline of the speculative row). */
static bool gen_ar(bench *b, const int32_t *prompt, int64_t n_prompt, double *ms_out) {
    dfl_error err = {0};
    dfl_batch *bt = dfl_batch_init(b->o.n_batch, 0, 1, &err);
    if (bt == NULL) return false;
    dfl_seq_remove(b->ar, 0, 0, NULL);
    bool ok = decode_tokens(b->ar, bt, prompt, n_prompt, b->o.n_batch, false);
    const int64_t nv = dfl_n_vocab(b->ar);
    int32_t tok = ok ? argmax(dfl_get_logits(b->ar, bt->n_tokens - 1), nv) : 0;
    double t0 = cli_now_ms();
    for (int64_t k = 1; k < b->n_spec && ok; k++) {
        ok = decode_tokens(b->ar, bt, &tok, 1, 1, true);
        if (ok) tok = argmax(dfl_get_logits(b->ar, 0), nv);
    }
    *ms_out = cli_now_ms() - t0;
    dfl_batch_free(bt);
    return ok;
}

/* Speculative generation of n tokens with a fresh session on the given feature path. */
static bool gen_spec(bench *b, dfl_feature_path fp, dfl_feature_wait wait, const int32_t *prompt, int64_t n_prompt,
                     double *ms_out, dfl_spec_stats *st_out) {
    dfl_error err = {0};
    dfl_spec_params sp = dfl_spec_default_params();
    sp.n_draft = b->o.draft_max;
    sp.draft_p_min = b->o.draft_p_min;
    sp.n_draft_min = b->o.draft_min; /* <= the draft length: checked when the session opened */
    sp.features = fp;
    sp.wait = wait;
    dfl_spec *spec = dfl_spec_new(b->s.tctx, b->s.dctx, &sp, &err);
    if (spec == NULL) {
        fprintf(stderr, "dflash bench: %s\n", err.msg);
        return false;
    }
    dfl_spec_seq_reset(spec, 0);
    int32_t first, seq = 0, n_step = 0;
    int32_t toks[64];
    bool ok = dfl_spec_prefill(spec, 0, prompt, n_prompt, &first, &err) == DFL_OK;
    dfl_spec_stats st0 = dfl_spec_get_stats(spec);
    double t0 = cli_now_ms();
    int64_t n = 1;
    while (ok && n < b->n_spec) {
        ok = dfl_spec_step(spec, 1, &seq, toks, &n_step, &err) == DFL_OK;
        n += n_step;
    }
    *ms_out = (cli_now_ms() - t0) * (double)(b->n_spec - 1) / (double)(n - 1); /* per n_spec-1 tokens */
    dfl_spec_stats st = dfl_spec_get_stats(spec);
    st.t_prefill_ms -= st0.t_prefill_ms;
    st.t_inject_ms -= st0.t_inject_ms;
    st.feature_host_bytes -= st0.feature_host_bytes;
    *st_out = st;
    if (!ok) fprintf(stderr, "dflash bench: %s\n", err.msg);
    dfl_spec_seq_reset(spec, 0);
    dfl_spec_free(spec);
    return ok;
}

static bool bench_spec(bench *b, const int32_t *prompt, int64_t n_prompt) {
    enum { NV = 3 };
    static const char *names[NV] = {"spec-gen (device features)", "spec-gen (host features)",
                                    "spec-gen (device features, device-side wait)"};
    const dfl_feature_path paths[NV] = {DFL_FEATURES_DEVICE, DFL_FEATURES_HOST, DFL_FEATURES_DEVICE};
    const dfl_feature_wait waits[NV] = {DFL_WAIT_HOST, DFL_WAIT_HOST, DFL_WAIT_DEVICE};
    double *t_ar = malloc(sizeof(double) * (size_t)b->reps), *t_sp[NV];
    for (int f = 0; f < NV; f++) t_sp[f] = malloc(sizeof(double) * (size_t)b->reps);
    dfl_spec_stats st[NV];
    double split[NV][4] = {{0}};
    bool ok = t_ar && t_sp[0] && t_sp[1] && t_sp[2];
    for (int r = 0; r <= b->reps && ok; r++) {
        double ms = 0;
        ok = gen_ar(b, prompt, n_prompt, &ms);
        if (r > 0) t_ar[r - 1] = ms;
        for (int f = 0; f < NV && ok; f++) {
            ok = gen_spec(b, paths[f], waits[f], prompt, n_prompt, &ms, &st[f]);
            if (r > 0) {
                t_sp[f][r - 1] = ms;
                const double steps = (double)(st[f].n_steps > 0 ? st[f].n_steps : 1);
                split[f][0] += st[f].t_draft_ms / steps / b->reps;
                split[f][1] += st[f].t_verify_ms / steps / b->reps;
                split[f][2] += st[f].t_inject_ms / steps / b->reps;
                split[f][3] += st[f].t_other_ms / steps / b->reps;
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
                     ar / sp, tau, (double)st[f].n_drafted / steps, split[f][0] + split[f][1] + split[f][2] + split[f][3],
                     split[f][0], split[f][1], split[f][2], split[f][3], (unsigned long long)st[f].feature_host_bytes);
        }
    }
    free(t_ar);
    for (int f = 0; f < NV; f++) free(t_sp[f]);
    return ok;
}

static bool bench_llama(bench *b) {
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
    return true;
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
        if (!strcmp(a, "-r") || !strcmp(a, "--pp") || !strcmp(a, "--tg") || !strcmp(a, "--verify") || !strcmp(a, "--spec-n")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dflash bench: option %s needs a value\n", a);
                return 2;
            }
            long long v = strtoll(argv[++i], &end, 10);
            const long long hi = !strcmp(a, "--verify") ? 64 : 100000;
            if (*end != '\0' || end == argv[i] || v < 1 || v > hi) {
                fprintf(stderr, "dflash bench: invalid value '%s' for %s (an integer in 1..%lld)\n", argv[i], a, hi);
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
    if (b.o.prompt_file != NULL) {
        fprintf(stderr, "dflash bench: -f is not supported by bench (its prompt is -p TEXT)\n");
        return 2;
    }
    b.o.n_ctx = b.n_pp + b.n_tg + b.n_spec + 256;
    const int open_rc = cli_session_open(&b.s, &b.o, true, "bench");
    if (open_rc != 0) {
        cli_session_close(&b.s);
        return open_rc;
    }
    dfl_error err = {0};
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = b.o.n_ctx;
    cp.n_batch = b.o.n_batch > b.n_verify ? b.o.n_batch : b.n_verify;
    cp.n_ubatch = cp.n_batch;
    cp.n_outputs = b.n_verify;
    cp.share_backend = b.s.tctx;
    b.ar = dfl_context_new(b.s.target, &cp, &err);
    if (b.ar == NULL) {
        fprintf(stderr, "dflash bench: %s\n", err.msg);
        cli_session_close(&b.s);
        return 1;
    }
    b.weight_bytes = dfl_model_n_bytes(b.s.target);
    int32_t *prompt = NULL;
    int64_t n_prompt = cli_tokenize_prompt(&b.s, &b.o, b.o.prompt, &prompt, "bench");
    bool ok = n_prompt > 0 && bench_ar(&b, prompt, n_prompt);
    if (ok && b.s.spec != NULL) ok = bench_spec(&b, prompt, n_prompt);
    if (ok && b.llama) ok = bench_llama(&b); /* a failed comparison fails the run (rows so far still printed) */
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
               b.s.spec ? ", drafter " : "", b.s.spec ? b.o.draft : "", b.o.n_threads, b.o.async ? "async" : "sync", b.reps);
        printf("| test | tok/s | ms | GB/s | notes |\n|---|---:|---:|---:|---|\n");
        for (int i = 0; i < b.n_rows; i++) {
            char gbs[32] = "";
            if (b.rows[i].gb_s > 0) snprintf(gbs, sizeof(gbs), "%.2f", b.rows[i].gb_s);
            printf("| %s | %.2f | %.3f | %s | %s |\n", b.rows[i].name, b.rows[i].tok_s, b.rows[i].ms, gbs, b.rows[i].note);
        }
    }
    free(prompt);
    dfl_context_free(b.ar);
    cli_session_close(&b.s);
    return ok ? 0 : 1;
}
