/* cmd_tokenize.c: `dflash tokenize -m MODEL.gguf -p TEXT [--json] [--no-special]`: the token ids
 * (and pieces) of a text with the vocabulary of a GGUF file (a model or a vocabulary-only file);
 * `--bench -f FILE` measures the encoding speed (MB/s, one thread); `--freq` lists the ids that
 * occur, commonest first (a --draft-vocab-file, docs/drafter.md). */
#include "cli_common.h"
#include "cmds.h"
#include "base/jsonw.h"
#include "dflash.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: dflash tokenize -m MODEL.gguf (-p TEXT | -f FILE) [options]\n"
            "  -m, --model PATH   GGUF file with a tokenizer (a model or a vocabulary-only file)\n"
            "  -p, --prompt TEXT  text to tokenize\n"
            "  -f, --file PATH    read the text from a file (bytes as they are)\n"
            "  --json             print JSON: {\"n_tokens\", \"tokens\": [{\"id\", \"piece\"}...]}\n"
            "  --ids              print only the ids, as [1, 2, 3]\n"
            "  --freq             print the ids that occur, commonest first (ties: lower id first),\n"
            "                     one per line with its count as a comment: a --draft-vocab-file\n"
            "  --no-special       control tokens written in the text stay text (<|im_start|> ...)\n"
            "  --add-special      add BOS/EOS where the vocabulary asks for it\n"
            "  --chat             render TEXT as a user message with the ChatML template first\n"
            "  --bench            encode the text repeatedly and print MB/s (single thread)\n"
            "  --reps N           repetitions for --bench (default 10)\n");
}

/* CPU time of this thread: the encoder is single-threaded, and other processes on the machine
 * do not count */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* a piece for the terminal: printable ASCII as is, the rest escaped */
static void print_piece(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\'') fputs("\\'", stdout);
        else if (c >= 0x80) putchar(c); /* UTF-8 bytes as they are */
        else if (isprint(c)) putchar(c);
        else printf("\\x%02x", c);
    }
}

static int bench(const dfl_vocab *v, const char *text, size_t len, int reps, bool parse_special) {
    /* the buffer from the API's count query (NFC can lengthen the text) */
    int64_t n_max = dfl_tokenize(v, text, len, NULL, 0, false, parse_special);
    if (n_max == DFL_VOCAB_FAIL) {
        fprintf(stderr, "dflash tokenize: tokenization failed\n");
        return 1;
    }
    n_max = n_max < 0 ? -n_max : 1;
    int32_t *tok = malloc((size_t)n_max * sizeof(int32_t));
    double *t = malloc((size_t)reps * sizeof(double));
    if (tok == NULL || t == NULL) {
        free(tok);
        free(t);
        fprintf(stderr, "dflash tokenize: out of memory\n");
        return 1;
    }
    int64_t n = 0;
    double cold = 0;
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        n = dfl_tokenize(v, text, len, tok, n_max, false, parse_special);
        double dt = now_s() - t0;
        if (n < 0) {
            fprintf(stderr, "dflash tokenize: tokenization failed\n");
            free(tok);
            free(t);
            return 1;
        }
        if (r < 0) cold = dt;
        else t[r] = dt;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    double med = t[reps / 2];
    printf("bytes %zu  tokens %lld  (%.2f bytes/token)\n", len, (long long)n, n > 0 ? (double)len / (double)n : 0.0);
    printf("(thread CPU time)\nfirst run (cold word cache) %.2f MB/s\n", (double)len / cold / 1e6);
    printf("median of %d runs           %.2f MB/s  %.2f M tokens/s  (min %.2f, max %.2f MB/s)\n", reps,
           (double)len / med / 1e6, (double)n / med / 1e6, (double)len / t[reps - 1] / 1e6, (double)len / t[0] / 1e6);
    free(tok);
    free(t);
    return 0;
}

typedef struct tok_count {
    int64_t n;
    int32_t id;
} tok_count;

static int cmp_count(const void *a, const void *b) {
    const tok_count *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* --freq: the ids of tok[0..n), commonest first, "ID  # COUNT" per line. 0, or 1 (out of memory). */
static int print_freq(const dfl_vocab *v, const int32_t *tok, int64_t n) {
    const int64_t nv = dfl_vocab_n_tokens(v);
    tok_count *c = calloc((size_t)(nv > 0 ? nv : 1), sizeof(tok_count));
    if (c == NULL) {
        fprintf(stderr, "dflash tokenize: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < nv; i++) c[i].id = (int32_t)i;
    for (int64_t i = 0; i < n; i++) {
        if (tok[i] >= 0 && tok[i] < nv) c[tok[i]].n++;
    }
    int64_t n_ids = 0;
    for (int64_t i = 0; i < nv; i++) n_ids += c[i].n > 0;
    qsort(c, (size_t)nv, sizeof(tok_count), cmp_count);
    printf("# %lld tokens, %lld distinct ids, commonest first (dflash tokenize --freq)\n", (long long)n, (long long)n_ids);
    for (int64_t i = 0; i < nv && c[i].n > 0; i++) printf("%d  # %lld\n", (int)c[i].id, (long long)c[i].n);
    free(c);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL;
    bool json = false, ids_only = false, freq = false, parse_special = true, add_special = false, chat = false, do_bench = false;
    int reps = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-p") || !strcmp(a, "--prompt") ||
                     !strcmp(a, "-f") || !strcmp(a, "--file") || !strcmp(a, "--reps");
        if (takes && val == NULL) {
            fprintf(stderr, "dflash tokenize: option %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = argv[++i];
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = argv[++i];
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = argv[++i];
        else if (!strcmp(a, "--reps")) {
            char *end;
            long r = strtol(argv[++i], &end, 10);
            if (*end != '\0' || r < 1 || r > 100000) {
                fprintf(stderr, "dflash tokenize: invalid value '%s' for --reps (1..100000)\n", argv[i]);
                return 2;
            }
            reps = (int)r;
        } else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--ids")) ids_only = true;
        else if (!strcmp(a, "--freq")) freq = true;
        else if (!strcmp(a, "--no-special")) parse_special = false;
        else if (!strcmp(a, "--add-special")) add_special = true;
        else if (!strcmp(a, "--chat")) chat = true;
        else if (!strcmp(a, "--bench")) do_bench = true;
        else {
            fprintf(stderr, "dflash tokenize: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (model == NULL || (prompt == NULL) == (file == NULL)) {
        fprintf(stderr, "dflash tokenize: needs -m MODEL and one of -p TEXT or -f FILE\n\n");
        usage(stderr);
        return 2;
    }
    char *owned = NULL;
    size_t len = 0;
    if (file != NULL) {
        owned = cli_read_file(file, &len, "tokenize");
        if (owned == NULL) return 1;
    } else {
        len = strlen(prompt);
    }
    const char *text = owned ? owned : prompt;
    dfl_error err = {0};
    dfl_vocab *v = dfl_vocab_load(model, &err);
    int rc = 0;
    int32_t *tok = NULL;
    char *rendered = NULL;
    if (v == NULL) {
        fprintf(stderr, "dflash tokenize: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    if (chat) {
        char *content = malloc(len + 1);
        if (content == NULL) goto oom;
        memcpy(content, text, len);
        content[len] = '\0';
        dfl_chat_msg msg = {"user", content, NULL};
        int64_t need = dfl_chat_render(v, &msg, 1, true, false, NULL, 0, &err);
        if (need == DFL_VOCAB_FAIL) {
            fprintf(stderr, "dflash tokenize: %s\n", err.msg);
            free(content);
            rc = 1;
            goto done;
        }
        size_t cap = (size_t)(need < 0 ? -need : need + 1);
        rendered = malloc(cap);
        int64_t n = rendered ? dfl_chat_render(v, &msg, 1, true, false, rendered, cap, &err) : -1;
        free(content);
        if (n < 0) goto oom;
        text = rendered;
        len = (size_t)n;
    }
    if (do_bench) {
        rc = bench(v, text, len, reps, parse_special);
        goto done;
    }
    int64_t n = cli_tokenize(v, text, len, add_special, parse_special, &tok);
    if (n == DFL_VOCAB_FAIL) {
        fprintf(stderr, "dflash tokenize: tokenization failed (%s)\n",
                len > (size_t)INT32_MAX ? "the text is longer than 2 GiB" : "out of memory");
        rc = 1;
        goto done;
    }
    char piece[4096];
    if (freq) {
        rc = print_freq(v, tok, n);
    } else if (json) {
        jsonw w;
        jsonw_init(&w, stdout);
        jsonw_obj_begin(&w);
        jsonw_key(&w, "n_tokens");
        jsonw_int(&w, n);
        jsonw_key(&w, "tokens");
        jsonw_arr_begin(&w);
        for (int64_t i = 0; i < n; i++) {
            int64_t pn = dfl_token_to_piece(v, tok[i], piece, sizeof(piece), true);
            jsonw_obj_begin(&w);
            jsonw_key(&w, "id");
            jsonw_int(&w, tok[i]);
            jsonw_key(&w, "piece");
            jsonw_strn(&w, piece, pn > 0 ? (size_t)pn : 0);
            jsonw_obj_end(&w);
        }
        jsonw_arr_end(&w);
        jsonw_obj_end(&w);
        putchar('\n');
    } else if (ids_only) {
        putchar('[');
        for (int64_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", (int)tok[i]);
        puts("]");
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t pn = dfl_token_to_piece(v, tok[i], piece, sizeof(piece), true);
            printf("%6d -> '", (int)tok[i]);
            print_piece(piece, pn > 0 ? (size_t)pn : 0);
            puts("'");
        }
    }
    goto done;
oom:
    fprintf(stderr, "dflash tokenize: out of memory\n");
    rc = 1;
done:
    free(tok);
    free(rendered);
    free(owned);
    dfl_vocab_free(v);
    return rc;
}
