/* cli_common.c: shared option parsing, model/context/session setup, prompt tokenization. */
#define _POSIX_C_SOURCE 200809L
#include "cli_common.h"

#include "model/model.h"
#include "gguf/gguf.h"

#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

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
    /* DFLASH_FEATURES: the default of --features; checked like it (cli_session_open refuses a
     * bad value) */
    o->features_env = getenv("DFLASH_FEATURES");
    if (o->features_env != NULL && strcmp(o->features_env, "host") == 0) o->features = DFL_FEATURES_HOST;
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

/* The full unsigned 64-bit range (no sign: strtoull would wrap "-1"). */
static bool parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    const char *p = s;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '-') return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') return false;
    *out = (uint64_t)v;
    return true;
}

/* A float in [lo, hi]. A value too small for a normal float (strtof: ERANGE on underflow) is
 * taken as the subnormal or zero strtof returns; NaN, Inf and overflow are refused. */
static bool parse_f(const char *s, float lo, float hi, float *out) {
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (errno == ERANGE && isfinite(v) && fabsf(v) < 1.0f) errno = 0; /* underflow */
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
/* an integer option in [lo, hi]; the message states the same limits */
#define INT_OPT(lo, hi, dst)                                                           \
    do {                                                                               \
        NEED_VALUE();                                                                  \
        if (!parse_i64(v, (lo), (hi), &iv)) {                                          \
            fprintf(stderr, "dflash %s: invalid value '%s' for %s (an integer in %lld..%lld)\n", cmd, v, a, \
                    (long long)(lo), (long long)(hi));                                 \
            return -1;                                                                 \
        }                                                                              \
        (dst) = iv;                                                                    \
        return 1;                                                                      \
    } while (0)
#define FLOAT_OPT(lo, hi, dst, what)                                                   \
    do {                                                                               \
        NEED_VALUE();                                                                  \
        if (!parse_f(v, (lo), (hi), &(dst))) BAD(what);                                \
        return 1;                                                                      \
    } while (0)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED_VALUE(); o->model = v; return 1; }
    if (!strcmp(a, "-md") || !strcmp(a, "--model-draft")) { NEED_VALUE(); o->draft = v; return 1; }
    if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEED_VALUE(); o->prompt = v; return 1; }
    if (!strcmp(a, "-f") || !strcmp(a, "--file")) { NEED_VALUE(); o->prompt_file = v; return 1; }
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) INT_OPT(0, 1 << 24, o->n_predict);
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) INT_OPT(16, 1 << 24, o->n_ctx);
    if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) INT_OPT(1, 1 << 16, o->n_batch);
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) INT_OPT(1, 1024, o->n_threads);
    if (!strcmp(a, "-tb") || !strcmp(a, "--threads-batch")) INT_OPT(1, 1024, o->n_threads_batch);
    if (!strcmp(a, "--temp")) FLOAT_OPT(0.0f, 100.0f, o->temp, "a number in 0..100");
    if (!strcmp(a, "--top-k")) INT_OPT(0, 1 << 30, o->top_k);
    if (!strcmp(a, "--top-p")) FLOAT_OPT(0.0f, 1.0f, o->top_p, "a number in 0..1");
    if (!strcmp(a, "--min-p")) FLOAT_OPT(0.0f, 1.0f, o->min_p, "a number in 0..1");
    if (!strcmp(a, "--repeat-penalty")) FLOAT_OPT(0.01f, 100.0f, o->repeat_penalty, "a number in 0.01..100");
    if (!strcmp(a, "--presence-penalty")) FLOAT_OPT(-100.0f, 100.0f, o->presence_penalty, "a number in -100..100");
    if (!strcmp(a, "--frequency-penalty")) FLOAT_OPT(-100.0f, 100.0f, o->frequency_penalty, "a number in -100..100");
    if (!strcmp(a, "--repeat-last-n")) INT_OPT(0, 1 << 24, o->repeat_last_n);
    if (!strcmp(a, "--stop")) {
        NEED_VALUE();
        if (o->n_stop >= 16 || v[0] == '\0' || strlen(v) > 256) BAD("at most 16 stop strings of 1..256 bytes");
        o->stop[o->n_stop++] = v;
        return 1;
    }
    if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = true; return 1; }
    if (!strcmp(a, "--seed") || !strcmp(a, "-s")) {
        NEED_VALUE();
        if (!parse_u64(v, &o->seed)) BAD("an integer in 0..18446744073709551615");
        return 1;
    }
    if (!strcmp(a, "--draft-max") || !strcmp(a, "--draft")) INT_OPT(1, 63, o->draft_max);
    if (!strcmp(a, "--draft-min")) INT_OPT(0, 63, o->draft_min);
    if (!strcmp(a, "--draft-p-min")) FLOAT_OPT(0.0f, 1.0f, o->draft_p_min, "a number in 0..1");
    if (!strcmp(a, "--draft-vocab")) INT_OPT(1, INT32_MAX, o->draft_vocab);
    if (!strcmp(a, "--draft-vocab-file")) { NEED_VALUE(); o->draft_vocab_file = v; return 1; }
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
    if (!strcmp(a, "--feature-buffer-max")) INT_OPT(0, INT64_MAX, o->feature_buffer_max);
    if (!strcmp(a, "--device")) {
        NEED_VALUE();
        if (!strcmp(v, "cpu")) o->device = DFL_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->device = DFL_DEVICE_CUDA;
        else BAD("cpu or cuda");
        return 1;
    }
    if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) INT_OPT(1, 64, o->n_seq);
    if (!strcmp(a, "--chat")) { o->chat = true; return 1; }
    if (!strcmp(a, "--json")) { o->json = true; return 1; }
    if (!strcmp(a, "--no-spec")) { o->no_spec = true; return 1; }
    if (!strcmp(a, "--async")) { o->async = true; return 1; }
    if (!strcmp(a, "--no-repack")) { o->no_repack = true; return 1; }
    const bool is_ctk = !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k");
    if (is_ctk || !strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
        NEED_VALUE();
        if (strcmp(v, "f16") && strcmp(v, "f32")) BAD("f16 or f32");
        if (is_ctk) o->cache_type_k = v;
        else o->cache_type_v = v;
        return 1;
    }
    if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { o->verbose = true; return 1; }
#undef NEED_VALUE
#undef BAD
#undef INT_OPT
#undef FLOAT_OPT
    return 0;
}

int cli_opts_finish(cli_opts *o, const char *cmd) {
    const char *k = o->cache_type_k != NULL ? o->cache_type_k : "f16";
    const char *v = o->cache_type_v != NULL ? o->cache_type_v : "f16";
    if (strcmp(k, v) != 0) {
        fprintf(stderr, "dflash %s: -ctk %s with -ctv %s: the KV cache keeps K and V in one type (give both the same)\n",
                cmd, k, v);
        return -1;
    }
    o->kv_f32 = !strcmp(k, "f32");
    return 0;
}

void cli_print_common_help(FILE *out) {
    fprintf(out,
            "  -m, --model PATH        target model (GGUF, qwen3/llama); default: the embedded pair in %s\n"
            "  -md, --model-draft PATH DFlash drafter (GGUF, arch dflash): speculative decoding\n"
            "  -p, --prompt TEXT       prompt\n"
            "  -f, --file PATH         read the prompt from a file (bytes as they are; instead of -p)\n"
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
            "  --draft-max N           draft tokens per step, at most (default block_size - 1;\n"
            "                          block_size for an anchor-first DSpark drafter)\n"
            "  --draft-min N           adaptive draft length between N and --draft-max: +2 after a\n"
            "                          fully accepted draft, -1 after a rejection (0: always\n"
            "                          --draft-max; default " CLI_DRAFT_MIN_STR ")\n"
            "  --draft-p-min P         verify drafts only up to the first one the drafter gives a\n"
            "                          probability below P (0: the whole block; default " CLI_DRAFT_P_MIN_STR ");\n"
            "                          a DSpark drafter cuts on its confidence head instead\n"
            "  --draft-vocab N         the drafter's head computes N tokens only (lossless: the\n"
            "                          target verifies over all; fewer drafts may be accepted):\n"
            "                          ids 0..N-1, or the first N of (all without N)\n"
            "  --draft-vocab-file F    token ids, commonest first; the end tokens are added\n"
            "                          (docs/drafter.md \"Reduced draft vocabulary\")\n"
            "  --features host|device  how target features reach the drafter (default device;\n"
            "                          env DFLASH_FEATURES)\n"
            "  --feature-wait host|device  where the drafter waits for the target's features\n"
            "  --feature-buffer-max B  cap of the feature buffer in bytes (above: host copies)\n"
            "  --device cpu|cuda       where the model runs (default cpu; cuda needs a CUDA build)\n"
            "  --no-spec               ignore the drafter (plain autoregressive decoding)\n"
            "  --async                 queues run on worker threads (like GPU streams)\n"
            "  --no-repack             read the weights as stored: no packed copy of the Q8_0 /\n"
            "                          Q4_0 / Q4_K / Q6_K weights for the CPU kernels (same output,\n"
            "                          slower)\n"
            "  -ctk, --cache-type-k T  KV cache type, f16 (default, like llama.cpp) or f32;\n"
            "  -ctv, --cache-type-v T  K and V take the same type\n"
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

/* Touches every page of a loaded model's file mapping (so the first tokens are not timed page
 * faults), with a progress bar. The model is loaded first: its file is known to be a regular,
 * mapped GGUF (a FIFO or /dev/zero is refused by the loader, never read here). */
static void warm_pages(const dfl_model *m, bool show, const char *what) {
    const gguf_file *f = model_gguf(m);
    const volatile uint8_t *p = gguf_file_data(f);
    const uint64_t size = gguf_file_size(f);
    if (p == NULL || size == 0) return;
    const uint64_t page = 4096, step = (uint64_t)1 << 20;
    uint8_t acc = 0;
    int last = -1;
    for (uint64_t off = 0; off < size; off += step) {
        const uint64_t end = off + step < size ? off + step : size;
        for (uint64_t q = off; q < end; q += page) acc ^= p[q];
        const int pct = (int)(100.0 * (double)end / (double)size);
        if (pct != last) {
            progress(show, what, (double)end / (double)size);
            last = pct;
        }
    }
    (void)acc;
}

bool cli_path_join(char *buf, size_t cap, const char *dir, const char *name, const char *cmd) {
    const int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "dflash %s: path too long (%zu bytes; the limit is %zu): %.80s...\n", cmd,
                strlen(dir) + 1 + strlen(name), cap - 1, dir);
        return false;
    }
    return true;
}

int cli_check_env(const cli_opts *o, const char *cmd) {
    const char *v = o->features_env;
    if (v != NULL && strcmp(v, "host") != 0 && strcmp(v, "device") != 0) {
        fprintf(stderr, "dflash %s: invalid value '%s' for DFLASH_FEATURES (host or device)\n", cmd, v);
        return 2;
    }
    return 0;
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
    ep.no_weight_pack = o->no_repack;
    ep.kv_f32 = o->kv_f32;
    ep.n_draft_vocab = o->draft_vocab_ids != NULL ? o->n_draft_vocab_ids : o->draft_vocab;
    ep.draft_vocab = o->draft_vocab_ids;
    return ep;
}

int cli_load_draft_vocab(cli_opts *o, int32_t **ids, const char *cmd) {
    *ids = NULL;
    o->draft_vocab_ids = NULL;
    o->n_draft_vocab_ids = 0;
    if (o->draft_vocab_file == NULL) return 0;
    size_t len = 0;
    char *text = cli_read_file(o->draft_vocab_file, &len, cmd);
    if (text == NULL) return 1;
    const int32_t cap = o->draft_vocab > 0 ? o->draft_vocab : INT32_MAX;
    int32_t n = 0, n_alloc = 0, *v = NULL;
    int line = 1;
    for (size_t i = 0; i < len && n < cap;) {
        const char c = text[i];
        if (c == '\n') line++;
        if (c == '#') {
            while (i < len && text[i] != '\n') i++;
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',') {
            i++;
            continue;
        }
        /* one word up to the next separator, read by the options' own integer parser */
        const size_t w = strcspn(text + i, " \t\r\n,#");
        char word[24];
        int64_t x = -1;
        bool ok = w < sizeof(word);
        if (ok) {
            memcpy(word, text + i, w);
            word[w] = '\0';
            ok = parse_i64(word, 0, INT32_MAX, &x);
        }
        if (!ok) {
            fprintf(stderr, "dflash %s: %s, line %d: '%.*s' is not a token id (a decimal number)\n", cmd,
                    o->draft_vocab_file, line, (int)(w < 40 ? w : 40), text + i);
            free(text);
            free(v);
            return 1;
        }
        if (n == n_alloc) {
            n_alloc = n_alloc > 0 ? 2 * n_alloc : 4096;
            int32_t *nv = realloc(v, (size_t)n_alloc * sizeof(int32_t));
            if (nv == NULL) {
                fprintf(stderr, "dflash %s: out of memory reading %s\n", cmd, o->draft_vocab_file);
                free(text);
                free(v);
                return 1;
            }
            v = nv;
        }
        v[n++] = (int32_t)x;
        i += w;
    }
    free(text);
    if (n == 0) {
        fprintf(stderr, "dflash %s: %s holds no token ids\n", cmd, o->draft_vocab_file);
        free(v);
        return 1;
    }
    *ids = v;
    o->draft_vocab_ids = v;
    o->n_draft_vocab_ids = n;
    return 0;
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
    const int env_rc = cli_check_env(o, cmd);
    if (env_rc != 0) return env_rc;
    if (o->model == NULL) {
        if (!cli_path_join(s->tpath, sizeof(s->tpath), cli_default_model_dir(), "target.gguf", cmd)) return 1;
        o->model = s->tpath;
        if (o->draft == NULL) {
            if (!cli_path_join(s->dpath, sizeof(s->dpath), cli_default_model_dir(), "drafter.gguf", cmd)) return 1;
            o->draft = s->dpath;
        }
    }
    const bool bar = !quiet && isatty(2);
    dfl_error err = {0};
    s->target = dfl_model_load(o->model, NULL, &err);
    if (s->target == NULL) {
        fprintf(stderr, "dflash %s: %s\n", cmd, err.msg);
        return 1;
    }
    warm_pages(s->target, bar, "target");
    if (dfl_model_hparams(s->target)->arch == DFL_ARCH_DFLASH) {
        fprintf(stderr, "dflash %s: %s is a DFlash drafter; pass it with -md and a target with -m\n", cmd, o->model);
        return 1;
    }
    s->vocab = dfl_model_vocab_new(s->target, &err);
    if (s->vocab == NULL) {
        fprintf(stderr, "dflash %s: %.200s%s: %s\n", cmd, o->model, strlen(o->model) > 200 ? "..." : "", err.msg);
        return 1;
    }
    const bool spec = o->draft != NULL && !o->no_spec;
    if (spec) {
        s->drafter = dfl_model_load(o->draft, NULL, &err);
        if (s->drafter == NULL) {
            fprintf(stderr, "dflash %s: %s\n", cmd, err.msg);
            return 1;
        }
        warm_pages(s->drafter, bar, "drafter");
        if (dfl_model_hparams(s->drafter)->arch != DFL_ARCH_DFLASH) {
            fprintf(stderr, "dflash %s: %s is not a DFlash drafter (arch %s)\n", cmd, o->draft,
                    dfl_arch_name(dfl_model_hparams(s->drafter)->arch));
            return 1;
        }
    }
    const dfl_hparams *dh = spec ? dfl_model_hparams(s->drafter) : NULL;
    const int32_t n_draft = spec ? (o->draft_max > 0 ? o->draft_max : (int32_t)dh->n_draft_max) : 0;
    if (spec && n_draft > dh->n_draft_max) {
        fprintf(stderr, "dflash %s: --draft-max %d is above the drafter's %s = %lld\n", cmd, n_draft,
                dh->n_draft_max == dh->block_size ? "block_size (anchor-first DSpark)" : "block_size - 1",
                (long long)dh->n_draft_max);
        return 1;
    }
    if (spec && o->draft_min > n_draft) {
        fprintf(stderr, "dflash %s: --draft-min %d is above the draft length %d (--draft-max or block_size - 1)\n", cmd,
                o->draft_min, n_draft);
        return 1;
    }
    if (spec && cli_load_draft_vocab(o, &s->draft_vocab, cmd) != 0) return 1;
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
    free(s->draft_vocab);
    memset(s, 0, sizeof(*s));
}

int64_t cli_tokenize(const dfl_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                     int32_t **tokens) {
    *tokens = NULL;
    /* the count query (tokens NULL, n_max 0) gives the exact length: one convention for every
     * caller, whatever NFC or special tokens do to the text's length */
    int64_t n = dfl_tokenize(v, text, len, NULL, 0, add_special, parse_special);
    if (n == DFL_VOCAB_FAIL) return DFL_VOCAB_FAIL;
    const int64_t need = n < 0 ? -n : n;
    *tokens = malloc((size_t)(need > 0 ? need : 1) * sizeof(int32_t));
    if (*tokens == NULL) return DFL_VOCAB_FAIL;
    n = dfl_tokenize(v, text, len, *tokens, need, add_special, parse_special);
    if (n != need) {
        free(*tokens);
        *tokens = NULL;
        return DFL_VOCAB_FAIL;
    }
    return n;
}

int64_t cli_tokenize_prompt(const cli_session *s, const cli_opts *o, const char *text, int32_t **tokens,
                            const char *cmd) {
    return cli_tokenize_prompt_n(s, o, text, strlen(text), tokens, cmd);
}

int64_t cli_tokenize_prompt_n(const cli_session *s, const cli_opts *o, const char *text, size_t text_len,
                              int32_t **tokens, const char *cmd) {
    char *rendered = NULL;
    const char *src = text;
    size_t len = text_len;
    *tokens = NULL;
    if (o->chat) {
        if (memchr(text, '\0', text_len) != NULL) {
            fprintf(stderr, "dflash %s: --chat: the prompt contains a NUL byte\n", cmd);
            return -1;
        }
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
        len = strlen(rendered);
    }
    int64_t n = cli_tokenize(s->vocab, src, len, true, o->chat, tokens);
    free(rendered);
    if (n == DFL_VOCAB_FAIL) {
        fprintf(stderr, "dflash %s: tokenization failed (%s)\n", cmd,
                len > (size_t)INT32_MAX ? "the prompt is longer than 2 GiB" : "out of memory");
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

char *cli_read_file(const char *path, size_t *len, const char *cmd) {
    *len = 0;
    /* not a regular file (a FIFO, /dev/stdin): read as a stream, no blocking surprise at open
     * beyond what the user asked for; a directory is refused */
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "dflash %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "dflash %s: %s is a directory\n", cmd, path);
        fclose(f);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    bool ok = buf != NULL;
    while (ok) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap >= CLI_MAX_FILE) {
            fprintf(stderr, "dflash %s: %s is larger than %d MiB\n", cmd, path, CLI_MAX_FILE >> 20);
            fclose(f);
            free(buf);
            return NULL;
        }
        char *nb = realloc(buf, cap * 2 + 1);
        if (nb == NULL) ok = false;
        else {
            buf = nb;
            cap *= 2;
        }
    }
    if (!ok || ferror(f)) {
        fprintf(stderr, "dflash %s: cannot read %s: %s\n", cmd, path, ok ? strerror(errno) : "out of memory");
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

int cli_check_fit(const cli_session *s, int64_t n_prompt, int64_t n_predict, const char *cmd) {
    /* the speculative path keeps a verification block free after the last position: a step
     * needs room for n_draft + 1 entries */
    const int64_t reserve = dfl_engine_n_draft(s->engine) > 0 ? (int64_t)dfl_engine_n_draft(s->engine) + 1 : 0;
    const int64_t need = n_prompt + n_predict + reserve, n_ctx = dfl_engine_n_ctx(s->engine);
    if (need <= n_ctx) return 0;
    if (reserve > 0) {
        fprintf(stderr, "dflash %s: prompt (%lld tokens) + %lld to generate + %lld kept free for a verification block "
                "(draft length %lld + 1) do not fit the context of %lld: use -c %lld or more\n", cmd,
                (long long)n_prompt, (long long)n_predict, (long long)reserve, (long long)(reserve - 1), (long long)n_ctx,
                (long long)need);
    } else {
        fprintf(stderr, "dflash %s: prompt (%lld tokens) + %lld to generate do not fit the context of %lld: use -c %lld "
                "or more\n", cmd, (long long)n_prompt, (long long)n_predict, (long long)n_ctx, (long long)need);
    }
    return 1;
}

int cli_finish_output(int rc, const char *cmd) {
    errno = 0;
    int e = fflush(stdout) != 0 ? errno : 0;
    const bool failed = ferror(stdout) || e != 0;
    if (fclose(stdout) != 0 && e == 0) e = errno;
    if (!failed && e == 0) return rc;
    if (rc == 0) {
        fprintf(stderr, "dflash %s: cannot write output: %s\n", cmd, e != 0 ? strerror(e) : "a write to standard output failed");
        return 1;
    }
    return rc;
}

int cli_spawn_capture(char *const argv[], char *out, size_t cap, const char *cmd) {
    int fds[2];
    if (cap == 0 || pipe(fds) != 0) {
        fprintf(stderr, "dflash %s: cannot create a pipe: %s\n", cmd, strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    const int e = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (e != 0) {
        close(fds[0]);
        fprintf(stderr, "dflash %s: cannot run %s: %s\n", cmd, argv[0], strerror(e));
        return -1;
    }
    size_t n = 0;
    for (;;) {
        char tmp[4096];
        const ssize_t r = read(fds[0], tmp, sizeof(tmp));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        /* keep the first cap - 1 bytes; read on so the child never blocks on a full pipe */
        const size_t k = n + (size_t)r < cap - 1 ? (size_t)r : cap - 1 - n;
        memcpy(out + n, tmp, k);
        n += k;
    }
    out[n] = '\0';
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

#ifndef DFLASH_SOURCE_DIR
#define DFLASH_SOURCE_DIR "."
#endif

bool cli_find_peer_script(const char *name, char *buf, size_t cap, const char *cmd) {
    char exe[4096], tried[2][4096];
    int n_tried = 0;
    /* 1. next to the executable: build/dflash -> ../tests/peer */
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            *slash = '\0';
            const int k = snprintf(tried[n_tried], sizeof(tried[0]), "%s/../tests/peer/%s", exe, name);
            if (k > 0 && (size_t)k < sizeof(tried[0])) n_tried++;
        }
    }
    /* 2. the source tree this binary was built from (compiled in) */
    const int k = snprintf(tried[n_tried], sizeof(tried[0]), "%s/tests/peer/%s", DFLASH_SOURCE_DIR, name);
    if (k > 0 && (size_t)k < sizeof(tried[0])) n_tried++;
    for (int i = 0; i < n_tried; i++) {
        if (access(tried[i], R_OK) == 0 && strlen(tried[i]) < cap) {
            snprintf(buf, cap, "%s", tried[i]);
            return true;
        }
    }
    fprintf(stderr, "dflash %s: the llama.cpp peer script %s was not found (looked for %s%s%s); it is part of the dflash "
            "source tree (tests/peer, with `make deps` for its node modules)\n", cmd, name, n_tried > 0 ? tried[0] : "",
            n_tried > 1 ? " and " : "", n_tried > 1 ? tried[1] : "");
    return false;
}
