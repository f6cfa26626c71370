/* cmd_bench.c: `dflash bench`: speed, measured honestly: every figure is the median of -r
 * repetitions after a warm-up, in one run, with ratios against the baseline measured beside it.
 * Rows (docs in README.md, "dflash bench"): pp (prompt processing) and tg (generation) through a
 * plain engine; a verification-sized batch (one forward pass of one sequence, logits for all) and
 * the same for --verify-seqs sequences at once (one batch); with --threads-scan the batched rows
 * again at one thread; with a drafter (cmd_bench_spec.c) the speculative generation vs the plain
 * one, the drafter pass, one speculative step at 3 and 15 drafts; --llama adds llama.cpp's tg and
 * pp16 on the same file. */
#include "cmd_bench.h"
#include "cmds.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --depth N: the prompt becomes N tokens, the tokenized -p text repeated (the rows after the
 * prompt then run with N cells of context, as llama-bench's -d). False when out of memory. */
static bool bench_prompt_depth(int32_t **prompt, int64_t *n_prompt, int64_t n_depth) {
    int32_t *p = malloc((size_t)n_depth * sizeof(int32_t));
    if (p == NULL) {
        fprintf(stderr, "dflash bench: out of memory for a prompt of %lld tokens\n", (long long)n_depth);
        return false;
    }
    for (int64_t i = 0; i < n_depth; i++) p[i] = (*prompt)[i % *n_prompt];
    free(*prompt);
    *prompt = p;
    *n_prompt = n_depth;
    return true;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bench_row *bench_add_row(bench *b, const char *fmt, ...) {
    bench_row *r = &b->rows[b->n_rows < BENCH_MAX_ROWS ? b->n_rows++ : BENCH_MAX_ROWS - 1];
    memset(r, 0, sizeof(*r));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->name, sizeof(r->name), fmt, ap);
    va_end(ap);
    return r;
}

bool bench_engine_gen(dfl_engine *e, const int32_t *prompt, int64_t n_prompt, int64_t n, double *ms_out,
                      dfl_engine_stats *d, dfl_seq_stats *st) {
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
    if (ok && st != NULL) dfl_engine_seq_stats(e, 0, st, NULL);
    if (!ok) fprintf(stderr, "dflash bench: %s\n", err.msg);
    return ok;
}

/* A plain target context for the verify rows: n_seq sequences of n_ctx positions, batches of
 * n_tok entries with logits for all; threads 0: the options' threads. */
static dfl_context *bench_ctx_new(bench *b, int32_t n_seq, int64_t n_ctx, int64_t n_tok, int32_t threads) {
    dfl_error err = {0};
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_seq = n_seq;
    cp.n_batch = cp.n_ubatch = cp.n_outputs = n_tok;
    cp.n_threads = threads > 0 ? threads : b->o.n_threads;
    cp.n_threads_batch = threads > 0 ? threads : b->o.n_threads_batch;
    cp.device = b->o.device;
    cp.no_weight_pack = b->o.no_repack;
    cp.kv_f32 = b->o.kv_f32;
    dfl_context *c = dfl_context_new(b->s.target, &cp, &err);
    if (c == NULL) fprintf(stderr, "dflash bench: %s\n", err.msg);
    return c;
}

/* Sequence s's own prompt for the multi-sequence verify: the prompt for s = 0, then the prompt's
 * tokens shifted through the vocabulary (same length, other contents). */
static int32_t seq_prompt_token(const int32_t *prompt, int64_t i, int32_t s, int64_t n_vocab) {
    return (int32_t)(((int64_t)prompt[i] + (int64_t)s * 7919) % n_vocab);
}

/* Median ms of one batch of n_verify random tokens per sequence for sequences 0..n_seq-1 of c
 * (logits for all), each after its own prompt (prefilled once, not timed); rolled back after
 * every repetition. */
static bool time_verify(bench *b, dfl_context *c, int32_t n_seq, const int32_t *prompt, int64_t n_prompt,
                        const int32_t *rnd, double *ms_out) {
    dfl_error err = {0};
    const int64_t n_tok = (int64_t)n_seq * b->n_verify, nv = dfl_n_vocab(c);
    dfl_batch *bt = dfl_batch_init(n_tok, 0, 1, &err);
    double *t = malloc(sizeof(double) * (size_t)b->reps);
    bool ok = bt != NULL && t != NULL;
    for (int32_t s = 0; s < n_seq && ok; s++) {
        ok = dfl_seq_remove(c, s, 0, &err) == DFL_OK;
        for (int64_t i0 = 0; i0 < n_prompt && ok; i0 += n_tok) { /* the prompt in batches of n_tok */
            dfl_batch_clear(bt);
            for (int64_t i = i0; i < n_prompt && i < i0 + n_tok; i++) {
                const int32_t pos = (int32_t)i;
                dfl_batch_add_token(bt, seq_prompt_token(prompt, i, s, nv), &pos, s, false);
            }
            ok = dfl_decode(c, bt, &err) == DFL_OK;
        }
    }
    for (int r = 0; r <= b->reps && ok; r++) {
        dfl_batch_clear(bt);
        for (int32_t s = 0; s < n_seq; s++) {
            for (int64_t i = 0; i < b->n_verify; i++) {
                const int32_t pos = (int32_t)(n_prompt + i);
                dfl_batch_add_token(bt, rnd[(i + s) % (b->n_verify + 1)], &pos, s, true);
            }
        }
        const double t0 = cli_now_ms();
        ok = dfl_decode(c, bt, &err) == DFL_OK;
        if (r > 0) t[r - 1] = cli_now_ms() - t0;
        for (int32_t s = 0; s < n_seq && ok; s++) ok = dfl_seq_remove(c, s, n_prompt, &err) == DFL_OK;
    }
    if (ok) *ms_out = bench_median(t, b->reps);
    else fprintf(stderr, "dflash bench: %s\n", err.msg);
    free(t);
    dfl_batch_free(bt);
    return ok;
}

/* Median ms of a prefill of n_pp tokens (and its first token) through a plain engine. */
static bool time_pp(bench *b, dfl_engine *e, const int32_t *rnd, double *ms_out) {
    dfl_error err = {0};
    dfl_seq_params sp1 = dfl_seq_default_params();
    sp1.max_tokens = 1;
    double *t = malloc(sizeof(double) * (size_t)b->reps);
    bool ok = t != NULL;
    for (int r = 0; r <= b->reps && ok; r++) {
        dfl_engine_seq_reset(e, 0, NULL);
        const double t0 = cli_now_ms();
        ok = dfl_engine_seq_start(e, 0, rnd, b->n_pp, &sp1, &err) == DFL_OK;
        if (r > 0) t[r - 1] = cli_now_ms() - t0;
    }
    if (ok) *ms_out = bench_median(t, b->reps);
    else fprintf(stderr, "dflash bench: %s\n", err.msg);
    free(t);
    return ok;
}

/* The batched rows (pp, verify, verify x sequences) at one setting: ms[0..2]. */
static bool time_batched(bench *b, dfl_engine *e, dfl_context *one, dfl_context *many, const int32_t *prompt,
                         int64_t n_prompt, const int32_t *rnd, double ms[3]) {
    return time_pp(b, e, rnd, &ms[0]) && time_verify(b, one, 1, prompt, n_prompt, rnd, &ms[1]) &&
           time_verify(b, many, b->n_vseq, prompt, n_prompt, rnd, &ms[2]);
}

/* Row i (0: pp, 1: verify, 2: verify x sequences) of the batched rows from its median ms. */
static void batched_row(bench *b, int i, double ms, const char *suffix) {
    bench_row *row;
    if (i == 0) {
        row = bench_add_row(b, "pp%lld%s", (long long)b->n_pp, suffix);
        row->tok_s = (double)b->n_pp / (ms / 1e3);
        snprintf(row->note, sizeof(row->note), "prompt of %lld tokens, batches of %lld", (long long)b->n_pp,
                 (long long)b->o.n_batch);
    } else if (i == 1) {
        row = bench_add_row(b, "verify%lld%s%s", (long long)b->n_verify, b->depth_tag, suffix);
        row->tok_s = (double)b->n_verify / (ms / 1e3);
        snprintf(row->note, sizeof(row->note), "one batch of %lld tokens, logits for all: %.2fx one tg step",
                 (long long)b->n_verify, ms / b->tg_ms);
    } else {
        row = bench_add_row(b, "verify%lldx%d%s%s", (long long)b->n_verify, b->n_vseq, b->depth_tag, suffix);
        row->tok_s = (double)(b->n_verify * b->n_vseq) / (ms / 1e3);
        snprintf(row->note, sizeof(row->note), "one batch of %d sequences x %lld tokens (%lld rows), each after its own "
                 "prompt, logits for all: %.2fx one tg step", b->n_vseq, (long long)b->n_verify,
                 (long long)(b->n_verify * b->n_vseq), ms / b->tg_ms);
    }
    row->ms = ms;
    if (i > 0) row->gb_s = (double)b->weight_bytes / (ms / 1e3) / 1e9;
}

/* --threads-scan: the batched rows again at one thread (its own engine, contexts and thread
 * pools), each against the same row at the chosen threads (ms). */
static bool bench_threads(bench *b, const int32_t *prompt, int64_t n_prompt, const int32_t *rnd, const double ms[3]) {
    dfl_error err = {0};
    dfl_engine_params ep = cli_engine_params(&b->o);
    ep.n_threads = ep.n_threads_batch = 1;
    ep.n_ctx = b->n_pp + 8;
    ep.share_backend = NULL;
    dfl_engine *e1 = dfl_engine_new_from_models(b->s.target, NULL, b->s.vocab, &ep, &err);
    if (e1 == NULL) fprintf(stderr, "dflash bench: %s\n", err.msg);
    dfl_context *one = e1 ? bench_ctx_new(b, 1, dfl_n_ctx(b->ar), b->n_verify, 1) : NULL;
    dfl_context *many = one ? bench_ctx_new(b, b->n_vseq, dfl_n_ctx(b->arn), b->n_verify * b->n_vseq, 1) : NULL;
    double ms1[3] = {0};
    const bool ok = many != NULL && time_batched(b, e1, one, many, prompt, n_prompt, rnd, ms1);
    dfl_context_free(many);
    dfl_context_free(one);
    dfl_engine_free(e1);
    const long n_cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int tb = b->o.n_threads_batch > 0 ? b->o.n_threads_batch : (int)(n_cores > 0 ? n_cores : 1);
    for (int i = 0; i < 3 && ok; i++) {
        batched_row(b, i, ms1[i], " @1 thread");
        bench_row *row = &b->rows[b->n_rows - 1];
        row->gb_s = 0;
        snprintf(row->note, sizeof(row->note),
                 "the %s row at 1 thread; speed at %d threads (-tb) / at 1 thread: %.2fx (ideal %.2fx)",
                 i == 0 ? "pp" : i == 1 ? "verify" : "multi-sequence verify", tb, ms1[i] / ms[i], (double)tb);
    }
    return ok;
}

static bool bench_ar(bench *b, const int32_t *prompt, int64_t n_prompt) {
    const int64_t n_rnd = (b->n_pp > b->n_verify ? b->n_pp : b->n_verify) + 1; /* pp and verify read it */
    int32_t *rnd = malloc((size_t)n_rnd * sizeof(int32_t));
    double *t = malloc((size_t)(b->reps + 1) * sizeof(double));
    bool ok = rnd != NULL && t != NULL;
    const int64_t nv = dfl_n_vocab(b->ar);
    for (int64_t i = 0; ok && i < n_rnd; i++) rnd[i] = (int32_t)((i * 2654435761u) % (uint64_t)nv);
    /* tg first (the batched rows' ratios read it): after the prompt, n_tg plain steps (greedy) */
    for (int r = 0; r <= b->reps && ok; r++) {
        double ms = 0;
        ok = bench_engine_gen(b->plain, prompt, n_prompt, b->n_tg + 1, &ms, NULL, NULL);
        if (r > 0) t[r - 1] = ms;
    }
    double ms[3] = {0};
    if (ok) {
        b->tg_ms = bench_median(t, b->reps) / (double)b->n_tg;
        ok = time_batched(b, b->plain, b->ar, b->arn, prompt, n_prompt, rnd, ms);
    }
    if (ok) {
        batched_row(b, 0, ms[0], "");
        bench_row *row = bench_add_row(b, "tg%lld%s", (long long)b->n_tg, b->depth_tag);
        row->ms = b->tg_ms;
        row->tok_s = 1e3 / b->tg_ms;
        row->gb_s = (double)b->weight_bytes / (row->ms / 1e3) / 1e9;
        snprintf(row->note, sizeof(row->note), "ms per token; weights %.1f MB", (double)b->weight_bytes / 1e6);
        batched_row(b, 1, ms[1], "");
        batched_row(b, 2, ms[2], "");
    }
    if (ok && b->threads_scan) ok = bench_threads(b, prompt, n_prompt, rnd, ms);
    free(t);
    free(rnd);
    return ok;
}

static int usage(FILE *out) {
    fprintf(out, "usage: dflash bench [-m TARGET.gguf] [-md DRAFT.gguf] [options]\n"
                 "  -r N            repetitions per figure (median; one warm-up more; default 5)\n"
                 "  --pp N          prompt-processing tokens (default 512)\n"
                 "  --tg N          generation tokens (default 64)\n"
                 "  --verify N      tokens in the verification-sized batch (default 16)\n"
                 "  --depth N       the rows after the prompt (tg, verify, speculative) follow N tokens of\n"
                 "                  context: the prompt repeated to N tokens (as llama-bench -d; rows @ dN)\n"
                 "  --verify-seqs N sequences of the multi-sequence verify: one batch of N x --verify\n"
                 "                  tokens, each sequence after its own prompt (default 8)\n"
                 "  --threads-scan  the batched rows (pp, verify, verify x sequences) again at 1 thread,\n"
                 "                  with the scaling to -tb threads (all cores when not given)\n"
                 "  --spec-n N      tokens generated in the speculative comparison (default 128)\n"
                 "  with -md also: the drafter pass (one block) and one speculative step at a fixed\n"
                 "  draft length of 3 and of 15 (--tg tokens generated; tau shows the acceptance)\n"
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
    b.n_vseq = 8;
    b.o.prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!strcmp(a, "--csv")) { b.csv = true; continue; }
        if (!strcmp(a, "--llama")) { b.llama = true; continue; }
        if (!strcmp(a, "--threads-scan")) { b.threads_scan = true; continue; }
        if (!strcmp(a, "-r") || !strcmp(a, "--pp") || !strcmp(a, "--tg") || !strcmp(a, "--verify") || !strcmp(a, "--spec-n") ||
            !strcmp(a, "--verify-seqs") || !strcmp(a, "--depth")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dflash bench: option %s needs a value\n", a);
                return 2;
            }
            long long v = strtoll(argv[++i], &end, 10);
            const long long hi = !strcmp(a, "--verify") || !strcmp(a, "--verify-seqs") ? 64 : 100000;
            if (*end != '\0' || end == argv[i] || v < 1 || v > hi) {
                fprintf(stderr, "dflash bench: invalid value '%s' for %s (an integer in 1..%lld)\n", argv[i], a, hi);
                return 2;
            }
            if (!strcmp(a, "-r")) b.reps = (int)v;
            else if (!strcmp(a, "--pp")) b.n_pp = v;
            else if (!strcmp(a, "--tg")) b.n_tg = v;
            else if (!strcmp(a, "--verify")) b.n_verify = v;
            else if (!strcmp(a, "--verify-seqs")) b.n_vseq = (int32_t)v;
            else if (!strcmp(a, "--depth")) b.n_depth = v;
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
    if (cli_opts_finish(&b.o, "bench") != 0) return 2;
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
    dfl_engine_free(b.s.engine); /* the bench builds its own engines (one backend for all) */
    b.s.engine = NULL;
    int32_t *prompt = NULL;
    int64_t n_prompt = cli_tokenize_prompt(&b.s, &b.o, b.o.prompt, &prompt, "bench");
    if (n_prompt > 0 && b.n_depth > 0 && !bench_prompt_depth(&prompt, &n_prompt, b.n_depth)) n_prompt = -1;
    if (b.n_depth > 0) snprintf(b.depth_tag, sizeof(b.depth_tag), " @ d%lld", (long long)b.n_depth);
    /* the engines' contexts hold the prompt (-p may be long) and what the rows generate after it */
    if (n_prompt > 0 && n_prompt + b.n_tg + b.n_spec + 256 > b.o.n_ctx) b.o.n_ctx = n_prompt + b.n_tg + b.n_spec + 256;
    dfl_engine_params ep = cli_engine_params(&b.o);
    if (n_prompt > 0) b.plain = dfl_engine_new_from_models(b.s.target, NULL, b.s.vocab, &ep, &err);
    if (n_prompt > 0 && b.plain == NULL) fprintf(stderr, "dflash bench: %s\n", err.msg);
    b.weight_bytes = dfl_model_n_bytes(b.s.target);
    /* the verify contexts: each sequence holds its prompt and one verify batch */
    if (n_prompt > 0) b.ar = bench_ctx_new(&b, 1, n_prompt + b.n_verify + 1, b.n_verify, 0);
    if (b.ar != NULL) b.arn = bench_ctx_new(&b, b.n_vseq, n_prompt + b.n_verify + 1, b.n_verify * b.n_vseq, 0);
    bool ok = b.arn != NULL && bench_ar(&b, prompt, n_prompt);
    if (ok && b.s.drafter != NULL) ok = bench_spec(&b, prompt, n_prompt);
    if (ok && b.s.drafter != NULL) ok = bench_spec_steps(&b, prompt, n_prompt);
    if (ok && b.llama) ok = bench_llama(&b); /* a failed comparison fails the run (rows so far still printed) */
    const dfl_hparams *hp = dfl_model_hparams(b.s.target);
    if (b.csv) {
        printf("test,tok_s,ms,gb_s,note\n");
        for (int i = 0; i < b.n_rows; i++) {
            printf("%s,%.2f,%.3f,%.2f,\"%s\"\n", b.rows[i].name, b.rows[i].tok_s, b.rows[i].ms, b.rows[i].gb_s, b.rows[i].note);
        }
    } else {
        char dv[96] = ""; /* the reduced draft vocabulary, when one is set */
        if (b.s.drafter != NULL && (b.o.draft_vocab > 0 || b.o.draft_vocab_ids != NULL)) {
            if (b.o.draft_vocab_ids != NULL) {
                snprintf(dv, sizeof(dv), " (draft vocabulary: %d ids of --draft-vocab-file + the end tokens)", b.o.n_draft_vocab_ids);
            } else {
                snprintf(dv, sizeof(dv), " (draft vocabulary: ids 0..%d + the end tokens)", b.o.draft_vocab - 1);
            }
        }
        printf("model: %s (%s, %lld layers, n_embd %lld, %.1f MB)%s%s%s, threads %d (0 = all cores), %s queues, "
               "median of %d after a warm-up%s\n\n",
               b.o.model ? b.o.model : b.s.tpath, dfl_arch_name(hp->arch), (long long)hp->n_layer, (long long)hp->n_embd, (double)b.weight_bytes / 1e6,
               b.s.drafter ? ", drafter " : "", b.s.drafter ? (b.o.draft ? b.o.draft : b.s.dpath) : "", dv, b.o.n_threads,
               b.o.async ? "async" : "sync", b.reps,
               b.n_depth > 0 ? "; --depth: the rows after the prompt (all but pp) follow a prompt of that many tokens" : "");
        printf("| test | tok/s | ms | GB/s | notes |\n|---|---:|---:|---:|---|\n");
        for (int i = 0; i < b.n_rows; i++) {
            char gbs[32] = "", toks[32] = "";
            if (b.rows[i].gb_s > 0) snprintf(gbs, sizeof(gbs), "%.2f", b.rows[i].gb_s);
            if (b.rows[i].tok_s > 0) snprintf(toks, sizeof(toks), "%.2f", b.rows[i].tok_s);
            printf("| %s | %s | %.3f | %s | %s |\n", b.rows[i].name, toks, b.rows[i].ms, gbs, b.rows[i].note);
        }
    }
    free(prompt);
    dfl_context_free(b.arn);
    dfl_context_free(b.ar);
    dfl_engine_free(b.plain);
    cli_session_close(&b.s);
    return ok ? 0 : 1;
}
