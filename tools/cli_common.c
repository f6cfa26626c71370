/* cli_common.c: shared option parsing, model/context/session setup, prompt tokenization. */
#define _POSIX_C_SOURCE 200809L
#include "cli_common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef DFLASH_MODEL_DIR
#define DFLASH_MODEL_DIR "models"
#endif

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void cli_opts_default(cli_opts *o) {
    memset(o, 0, sizeof(*o));
    o->n_predict = 128;
    o->n_ctx = 4096;
    o->n_batch = 512;
    o->temp = 0.0f;
    o->draft_p_min = CLI_DRAFT_P_MIN;
    o->draft_min = CLI_DRAFT_MIN;
    o->top_k = 40;
    o->top_p = 0.95f;
    o->min_p = 0.05f;
    o->repeat_penalty = 1.0f;
    o->repeat_last_n = 64;
    o->seed = 0;
    o->features = DFL_FEATURES_DEVICE;
    o->n_seq = 1;
    const char *env = getenv("DFLASH_FEATURES");
    if (env != NULL && strcmp(env, "host") == 0) o->features = DFL_FEATURES_HOST;
}

const char *cli_default_model_dir(void) {
    const char *env = getenv("DFLASH_MODEL_DIR");
    return env != NULL ? env : DFLASH_MODEL_DIR;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_f(const char *s, float lo, float hi, float *out) {
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int cli_parse_common(cli_opts *o, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int64_t iv;
#define NEED_VALUE()                                                                   \
    do {                                                                               \
        if (v == NULL) {                                                               \
            fprintf(stderr, "dflash %s: option %s needs a value\n", cmd, a);           \
            return -1;                                                                 \
        }                                                                              \
        (*i)++;                                                                        \
    } while (0)
#define BAD(what)                                                                      \
    do {                                                                               \
        fprintf(stderr, "dflash %s: invalid value '%s' for %s (%s)\n", cmd, v, a, what); \
        return -1;                                                                     \
    } while (0)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED_VALUE(); o->model = v; return 1; }
    if (!strcmp(a, "-md") || !strcmp(a, "--model-draft")) { NEED_VALUE(); o->draft = v; return 1; }
    if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEED_VALUE(); o->prompt = v; return 1; }
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
        NEED_VALUE(); if (!parse_i64(v, 0, 1 << 24, &iv)) BAD("0..16777216"); o->n_predict = iv; return 1;
    }
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        NEED_VALUE(); if (!parse_i64(v, 16, 1 << 24, &iv)) BAD("16..16777216"); o->n_ctx = iv; return 1;
    }
    if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
        NEED_VALUE(); if (!parse_i64(v, 1, 1 << 16, &iv)) BAD("1..65536"); o->n_batch = iv; return 1;
    }
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        NEED_VALUE(); if (!parse_i64(v, 1, 1024, &iv)) BAD("1..1024"); o->n_threads = (int32_t)iv; return 1;
    }
    if (!strcmp(a, "-tb") || !strcmp(a, "--threads-batch")) {
        NEED_VALUE(); if (!parse_i64(v, 1, 1024, &iv)) BAD("1..1024"); o->n_threads_batch = (int32_t)iv; return 1;
    }
    if (!strcmp(a, "--temp")) { NEED_VALUE(); if (!parse_f(v, 0.0f, 100.0f, &o->temp)) BAD("0..100"); return 1; }
    if (!strcmp(a, "--top-k")) {
        NEED_VALUE(); if (!parse_i64(v, 0, 1 << 30, &iv)) BAD(">= 0"); o->top_k = (int32_t)iv; return 1;
    }
    if (!strcmp(a, "--top-p")) { NEED_VALUE(); if (!parse_f(v, 0.0f, 1.0f, &o->top_p)) BAD("0..1"); return 1; }
    if (!strcmp(a, "--min-p")) { NEED_VALUE(); if (!parse_f(v, 0.0f, 1.0f, &o->min_p)) BAD("0..1"); return 1; }
    if (!strcmp(a, "--repeat-penalty")) {
        NEED_VALUE(); if (!parse_f(v, 0.01f, 100.0f, &o->repeat_penalty)) BAD("0.01..100"); return 1;
    }
    if (!strcmp(a, "--presence-penalty")) {
        NEED_VALUE(); if (!parse_f(v, -100.0f, 100.0f, &o->presence_penalty)) BAD("-100..100"); return 1;
    }
    if (!strcmp(a, "--frequency-penalty")) {
        NEED_VALUE(); if (!parse_f(v, -100.0f, 100.0f, &o->frequency_penalty)) BAD("-100..100"); return 1;
    }
    if (!strcmp(a, "--repeat-last-n")) {
        NEED_VALUE(); if (!parse_i64(v, 0, 1 << 24, &iv)) BAD("0..16777216"); o->repeat_last_n = (int32_t)iv; return 1;
    }
    if (!strcmp(a, "--stop")) {
        NEED_VALUE();
        if (o->n_stop >= 16 || v[0] == '\0' || strlen(v) > 256) BAD("at most 16 stop strings of 1..256 bytes");
        o->stop[o->n_stop++] = v;
        return 1;
    }
    if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = true; return 1; }
    if (!strcmp(a, "--seed") || !strcmp(a, "-s")) {
        NEED_VALUE(); if (!parse_i64(v, 0, INT64_MAX, &iv)) BAD(">= 0"); o->seed = (uint64_t)iv; return 1;
    }
    if (!strcmp(a, "--draft-max") || !strcmp(a, "--draft")) {
        NEED_VALUE(); if (!parse_i64(v, 1, 63, &iv)) BAD("1..63"); o->draft_max = (int32_t)iv; return 1;
    }
    if (!strcmp(a, "--draft-min")) {
        NEED_VALUE(); if (!parse_i64(v, 0, 63, &iv)) BAD("0..63"); o->draft_min = (int32_t)iv; return 1;
    }
    if (!strcmp(a, "--draft-p-min")) {
        NEED_VALUE(); if (!parse_f(v, 0.0f, 1.0f, &o->draft_p_min)) BAD("0..1"); return 1;
    }
    if (!strcmp(a, "--features")) {
        NEED_VALUE();
        if (!strcmp(v, "host")) o->features = DFL_FEATURES_HOST;
        else if (!strcmp(v, "device")) o->features = DFL_FEATURES_DEVICE;
        else BAD("host or device");
        return 1;
    }
    if (!strcmp(a, "--feature-wait")) {
        NEED_VALUE();
        if (!strcmp(v, "host")) o->feature_wait = DFL_WAIT_HOST;
        else if (!strcmp(v, "device")) o->feature_wait = DFL_WAIT_DEVICE;
        else BAD("host or device");
        return 1;
    }
    if (!strcmp(a, "--feature-buffer-max")) {
        NEED_VALUE(); if (!parse_i64(v, 0, INT64_MAX, &iv)) BAD("bytes >= 0"); o->feature_buffer_max = iv; return 1;
    }
    if (!strcmp(a, "--device")) {
        NEED_VALUE();
        if (!strcmp(v, "cpu")) o->device = DFL_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->device = DFL_DEVICE_CUDA;
        else BAD("cpu or cuda");
        return 1;
    }
    if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
        NEED_VALUE(); if (!parse_i64(v, 1, 64, &iv)) BAD("1..64"); o->n_seq = (int32_t)iv; return 1;
    }
    if (!strcmp(a, "--chat")) { o->chat = true; return 1; }
    if (!strcmp(a, "--json")) { o->json = true; return 1; }
    if (!strcmp(a, "--no-spec")) { o->no_spec = true; return 1; }
    if (!strcmp(a, "--async")) { o->async = true; return 1; }
    if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { o->verbose = true; return 1; }
#undef NEED_VALUE
#undef BAD
    return 0;
}

void cli_print_common_help(FILE *out) {
    fprintf(out,
            "  -m, --model PATH        target model (GGUF, qwen3/llama); default: the embedded pair in %s\n"
            "  -md, --model-draft PATH DFlash drafter (GGUF, arch dflash): speculative decoding\n"
            "  -p, --prompt TEXT       prompt\n"
            "  -n, --n-predict N       tokens to generate (default 128)\n"
            "  -c, --ctx-size N        context positions per sequence (default 4096)\n"
            "  -b, --batch-size N      prompt batch size (default 512)\n"
            "  -t, --threads N         threads for decoding (default: all cores)\n"
            "  -tb, --threads-batch N  threads for batches (default: all cores)\n"
            "  --temp T                temperature, 0 = greedy (default 0)\n"
            "  --top-k K, --top-p P, --min-p P, --repeat-penalty R, --seed S   sampling\n"
            "  --presence-penalty P, --frequency-penalty F, --repeat-last-n N  penalties (N: window, default 64)\n"
            "  --stop TEXT             stop before TEXT (repeatable, up to 16)\n"
            "  --ignore-eos            do not stop at end-of-generation tokens\n"
            "  --chat                  wrap the prompt in the ChatML template (non-thinking)\n"
            "  --draft-max N           draft tokens per step, at most (default block_size - 1)\n"
            "  --draft-min N           adaptive draft length between N and --draft-max: +2 after a\n"
            "                          fully accepted draft, -1 after a rejection (0: always\n"
            "                          --draft-max; default " CLI_DRAFT_MIN_STR ")\n"
            "  --draft-p-min P         verify drafts only up to the first one the drafter gives a\n"
            "                          probability below P (0: the whole block; default " CLI_DRAFT_P_MIN_STR ")\n"
            "  --features host|device  how target features reach the drafter (default device;\n"
            "                          env DFLASH_FEATURES)\n"
            "  --feature-wait host|device  where the drafter waits for the target's features\n"
            "  --feature-buffer-max B  cap of the feature buffer in bytes (above: host copies)\n"
            "  --device cpu|cuda       where the model runs (default cpu; cuda needs a CUDA build)\n"
            "  --no-spec               ignore the drafter (plain autoregressive decoding)\n"
            "  --async                 queues run on worker threads (like GPU streams)\n"
            "  --json                  print one JSON object at the end instead of streaming\n",
            cli_default_model_dir());
}

static void progress(bool show, const char *what, double frac) {
    if (!show) return;
    int w = 30, filled = (int)(frac * w + 0.5);
    fprintf(stderr, "\rloading %-12s [", what);
    for (int k = 0; k < w; k++) fputc(k < filled ? '#' : '.', stderr);
    fprintf(stderr, "] %3d%%", (int)(frac * 100 + 0.5));
    if (frac >= 1.0) fputc('\n', stderr);
    fflush(stderr);
}

/* Touches every page of the file mapping (so the first tokens are not timed page faults),
 * with a progress bar. */
static void warm_pages(const char *path, bool show, const char *what) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    static char buf[1 << 20];
    long done = 0;
    size_t n;
    int last = -1;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        done += (long)n;
        int pct = size > 0 ? (int)(100.0 * (double)done / (double)size) : 100;
        if (pct != last) {
            progress(show, what, size > 0 ? (double)done / (double)size : 1.0);
            last = pct;
        }
    }
    if (last != 100) progress(show, what, 1.0);
    fclose(f);
}

dfl_engine_params cli_engine_params(const cli_opts *o) {
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_seq = o->n_seq;
    ep.n_ctx = o->n_ctx;
    ep.n_batch = o->n_batch;
    ep.n_threads = o->n_threads;
    ep.n_threads_batch = o->n_threads_batch;
    ep.async = o->async;
    ep.device = o->device;
    ep.n_draft = o->draft_max;
    ep.n_draft_min = o->draft_min;
    ep.draft_p_min = o->draft_p_min;
    ep.features = o->features;
    ep.wait = o->feature_wait;
    ep.feature_buffer_max = (size_t)o->feature_buffer_max;
    return ep;
}

dfl_seq_params cli_seq_params(const cli_opts *o) {
    dfl_seq_params sp = dfl_seq_default_params();
    sp.sampler.temp = o->temp;
    sp.sampler.top_k = o->top_k;
    sp.sampler.top_p = o->top_p;
    sp.sampler.min_p = o->min_p;
    sp.sampler.repeat_penalty = o->repeat_penalty;
    sp.sampler.repeat_last_n = o->repeat_last_n;
    sp.sampler.presence_penalty = o->presence_penalty;
    sp.sampler.frequency_penalty = o->frequency_penalty;
    sp.sampler.seed = o->seed;
    sp.max_tokens = o->n_predict;
    sp.stop = o->stop;
    sp.n_stop = o->n_stop;
    sp.ignore_eos = o->ignore_eos;
    return sp;
}

int cli_session_open(cli_session *s, cli_opts *o, bool quiet, const char *cmd) {
    memset(s, 0, sizeof(*s));
    static char tpath[4096], dpath[4096];
    if (o->model == NULL) {
        snprintf(tpath, sizeof(tpath), "%s/target.gguf", cli_default_model_dir());
        o->model = tpath;
        if (o->draft == NULL) {
            snprintf(dpath, sizeof(dpath), "%s/drafter.gguf", cli_default_model_dir());
            o->draft = dpath;
        }
    }
    const bool bar = !quiet && isatty(2);
    dfl_error err = {0};
    warm_pages(o->model, bar, "target");
    s->target = dfl_model_load(o->model, NULL, &err);
    if (s->target == NULL) {
        fprintf(stderr, "dflash %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (dfl_model_hparams(s->target)->arch == DFL_ARCH_DFLASH) {
        fprintf(stderr, "dflash %s: %s is a DFlash drafter; pass it with -md and a target with -m\n", cmd, o->model);
        return 1;
    }
    s->vocab = dfl_model_vocab_new(s->target, &err);
    if (s->vocab == NULL) {
        fprintf(stderr, "dflash %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (o->draft != NULL && !o->no_spec) {
        warm_pages(o->draft, bar, "drafter");
        s->drafter = dfl_model_load(o->draft, NULL, &err);
        if (s->drafter == NULL) {
            fprintf(stderr, "dflash %s: %s\n", cmd, err.msg);
            return 1;
        }
        const dfl_hparams *dh = dfl_model_hparams(s->drafter);
        if (dh->arch != DFL_ARCH_DFLASH) {
            fprintf(stderr, "dflash %s: %s is not a DFlash drafter (arch %s)\n", cmd, o->draft, dfl_arch_name(dh->arch));
            return 1;
        }
        /* the draft options in the CLI's own words (the engine checks them too) */
        const int32_t n_draft = o->draft_max > 0 ? o->draft_max : (int32_t)dh->block_size - 1;
        if (n_draft > dh->block_size - 1) {
            fprintf(stderr, "dflash %s: --draft-max %d is above the drafter's block_size - 1 = %lld\n", cmd, n_draft,
                    (long long)(dh->block_size - 1));
            return 1;
        }
        if (o->draft_min > n_draft) {
            fprintf(stderr, "dflash %s: --draft-min %d is above the draft length %d (--draft-max or block_size - 1)\n", cmd,
                    o->draft_min, n_draft);
            return 1;
        }
    }
    const dfl_engine_params ep = cli_engine_params(o);
    s->engine = dfl_engine_new_from_models(s->target, s->drafter, s->vocab, &ep, &err);
    if (s->engine == NULL) {
        fprintf(stderr, "dflash %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (!quiet && s->drafter != NULL) {
        const bool dev = !strcmp(dfl_engine_feature_path(s->engine), "device");
        fprintf(stderr, "dflash: target features via %s (%s; %s backend)\n", dev ? "device buffer" : "host copies",
                dfl_engine_feature_note(s->engine), o->device == DFL_DEVICE_CUDA ? "cuda" : "cpu");
    }
    return 0;
}

void cli_session_close(cli_session *s) {
    dfl_engine_free(s->engine);
    dfl_model_free(s->drafter);
    dfl_model_free(s->target);
    dfl_vocab_free(s->vocab);
    memset(s, 0, sizeof(*s));
}

int64_t cli_tokenize_prompt(const cli_session *s, const cli_opts *o, const char *text, int32_t **tokens,
                            const char *cmd) {
    char *rendered = NULL;
    const char *src = text;
    if (o->chat) {
        dfl_chat_msg msg = {"user", text, NULL};
        dfl_error err = {0};
        int64_t n = dfl_chat_render(s->vocab, &msg, 1, true, false, NULL, 0, &err);
        if (n == DFL_VOCAB_FAIL) {
            fprintf(stderr, "dflash %s: chat template: %s\n", cmd, err.msg);
            return -1;
        }
        size_t cap = (size_t)(n < 0 ? -n : n + 1);
        rendered = malloc(cap);
        if (rendered == NULL || dfl_chat_render(s->vocab, &msg, 1, true, false, rendered, cap, &err) < 0) {
            fprintf(stderr, "dflash %s: chat template failed\n", cmd);
            free(rendered);
            return -1;
        }
        src = rendered;
    }
    const size_t len = strlen(src);
    int64_t n_max = 3 * (int64_t)len + 2; /* NFC can lengthen text up to 3x */
    *tokens = malloc((size_t)n_max * sizeof(int32_t));
    int64_t n = *tokens ? dfl_tokenize(s->vocab, src, len, *tokens, n_max, true, o->chat) : DFL_VOCAB_FAIL;
    free(rendered);
    if (n == DFL_VOCAB_FAIL || n < 0) {
        fprintf(stderr, "dflash %s: tokenization failed\n", cmd);
        free(*tokens);
        *tokens = NULL;
        return -1;
    }
    if (n == 0) {
        fprintf(stderr, "dflash %s: the prompt is empty\n", cmd);
        free(*tokens);
        *tokens = NULL;
        return -1;
    }
    return n;
}
