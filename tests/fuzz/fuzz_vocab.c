/* fuzz_vocab.c: libFuzzer target for the tokenizer. The first input byte picks a mode:
 *   0-5: encode/decode the rest with one of three built-in vocabularies (qwen2 with NFC, llama3,
 *        gpt2; byte tokens, merges, control and user-defined tokens), parse_special on or off.
 *        Checks: the count query agrees with the full call; decode(encode(x)) is x for the
 *        vocabularies without normalization, and encoding it again gives the same tokens for all;
 *        the streaming detokenizer emits valid UTF-8 for any token sequence.
 *   6:   the rest as a GGUF file whose vocabulary is loaded (errors are fine, crashes are not).
 *   7:   the rest as chat messages (NUL-separated role/content pairs) for the chat template.
 * With DFL_FUZZ_VOCAB=path.gguf (e.g. the decompressed tests/fixtures/vocab/qwen3-vocab.gguf.gz),
 * modes 0-5 use that vocabulary instead of the built-in qwen2 one.
 * Build: make fuzz; run: build-fuzz/fuzz_vocab -max_total_time=300 */
#include "dflash.h"
#include "gguf/gguf.h"
#include "vocab/unicode.h"
#include "vocab/vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dfl_vocab *g_vocab[3];

/* GPT-2's byte-level alphabet for one byte */
static void byte_level(uint8_t b, char out[3]) {
    unsigned cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        unsigned extra = 0;
        for (unsigned c = 0; c < b; c++) extra += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
        cp = 256 + extra;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

static dfl_vocab *builtin_vocab(const char *pre) {
    /* bytes, then merges of frequent pairs, then special tokens */
    static const char *const k_merges[][2] = {{"t", "h"}, {"th", "e"}, {"h", "e"}, {" ", "t"}, {" t", "he"}, {"i", "n"},
                                              {"e", "r"}, {"a", "n"}, {" ", "a"}, {"o", "n"}, {"in", "g"},
                                              {"\xc3", "\xa9"}, {"\xe4", "\xb8"}, {"\xe4\xb8", "\xad"}, {" ", " "},
                                              {"  ", "  "}, {"\n", "\n"}, {"1", "2"}, {"12", "3"}, {"'", "s"}};
    enum { N_MERGES = sizeof(k_merges) / sizeof(k_merges[0]) };
    static const char *const k_special[] = {"<|s|>", "<|s|>x", "<u>", "<|end|>", "<|im_start|>", "<|im_end|>"};
    char *tok[256 + N_MERGES + 6];
    int32_t type[256 + N_MERGES + 6];
    char *mer[N_MERGES];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        char s[3];
        byte_level((uint8_t)b, s);
        tok[n] = strdup(s);
        type[n++] = DFL_TOKEN_TYPE_NORMAL;
    }
    for (int m = 0; m < N_MERGES; m++) {
        char a[16] = "", b[16] = "", s[3];
        for (const char *p = k_merges[m][0]; *p; p++) byte_level((uint8_t)*p, s), strcat(a, s);
        for (const char *p = k_merges[m][1]; *p; p++) byte_level((uint8_t)*p, s), strcat(b, s);
        char line[40], cat[40];
        snprintf(line, sizeof(line), "%s %s", a, b);
        snprintf(cat, sizeof(cat), "%s%s", a, b);
        mer[m] = strdup(line);
        tok[n] = strdup(cat);
        type[n++] = DFL_TOKEN_TYPE_NORMAL;
    }
    for (int k = 0; k < 6; k++) {
        tok[n] = strdup(k_special[k]);
        type[n++] = k == 2 ? DFL_TOKEN_TYPE_USER_DEFINED : DFL_TOKEN_TYPE_CONTROL;
    }
    vocab_desc d = vocab_desc_default();
    d.n_tokens = n;
    d.tokens = (const char *const *)tok;
    d.types = type;
    d.n_merges = N_MERGES;
    d.merges = (const char *const *)mer;
    d.pre = pre;
    dfl_error err = {0};
    dfl_vocab *v = vocab_new(&d, &err);
    if (v == NULL) {
        fprintf(stderr, "fuzz_vocab: %s\n", err.msg);
        abort();
    }
    for (int i = 0; i < n; i++) free(tok[i]);
    for (int m = 0; m < N_MERGES; m++) free(mer[m]);
    return v;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("DFL_FUZZ_VOCAB");
    if (path != NULL) {
        dfl_error err = {0};
        g_vocab[0] = dfl_vocab_load(path, &err);
        if (g_vocab[0] == NULL) {
            fprintf(stderr, "fuzz_vocab: %s\n", err.msg);
            abort();
        }
    } else {
        g_vocab[0] = builtin_vocab("qwen2");
    }
    g_vocab[1] = builtin_vocab("llama3");
    g_vocab[2] = builtin_vocab("gpt2");
    return 0;
}

#define FUZZ_CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_vocab: check failed: %s (line %d)\n", #c, __LINE__); abort(); } } while (0)

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l;
        if (utf8_decode(s + i, n - i, &cp, &l) != UTF8_OK) return false;
        i += l;
    }
    return true;
}

static void fuzz_encode(const dfl_vocab *v, bool normalizes, bool special, const uint8_t *text, size_t len) {
    int64_t cap = 3 * (int64_t)len + 2; /* the documented bound (NFC can expand the text) */
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    int64_t n = dfl_tokenize(v, (const char *)text, len, ids, cap, false, special);
    FUZZ_CHECK(n >= 0 && (normalizes || n <= (int64_t)len));
    FUZZ_CHECK(dfl_tokenize(v, (const char *)text, len, NULL, 0, false, special) == (n > 0 ? -n : 0));
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < dfl_vocab_n_tokens(v));
    /* decode: the input itself without normalization (NFC may grow it, less than 3x) */
    size_t dcap = 3 * len + 16;
    char *dec = malloc(dcap);
    int64_t m = dfl_detokenize(v, ids, n, dec, dcap, true);
    FUZZ_CHECK(m >= 0);
    if (!normalizes) FUZZ_CHECK((size_t)m == len && memcmp(dec, text, len) == 0);
    /* encoding the decoded text again gives the same tokens */
    int32_t *ids2 = malloc(((size_t)m + 8) * sizeof(int32_t));
    int64_t n2 = dfl_tokenize(v, dec, (size_t)m, ids2, m + 8, false, special);
    FUZZ_CHECK(n2 == n && memcmp(ids, ids2, (size_t)n * sizeof(int32_t)) == 0);
    free(ids2);
    free(dec);
    free(ids);
}

static void fuzz_stream(const dfl_vocab *v, const uint8_t *data, size_t size) {
    dfl_error err = {0};
    dfl_detok *d = dfl_detok_new(v, (size & 1) != 0, &err);
    FUZZ_CHECK(d != NULL);
    for (size_t i = 0; i + 1 < size; i += 2) {
        int32_t tok = (int32_t)((data[i] | (data[i + 1] << 8)) % (dfl_vocab_n_tokens(v) + 2)) - 1;
        const char *out;
        size_t n;
        dfl_status st = dfl_detok_push(d, tok, &out, &n);
        FUZZ_CHECK(st == (tok >= 0 && tok < dfl_vocab_n_tokens(v) ? DFL_OK : DFL_ERR_INVALID));
        FUZZ_CHECK(valid_utf8((const uint8_t *)out, n));
    }
    const char *out;
    size_t n;
    dfl_detok_flush(d, &out, &n);
    FUZZ_CHECK(valid_utf8((const uint8_t *)out, n));
    dfl_detok_free(d);
}

static void fuzz_gguf(const uint8_t *data, size_t size) {
    dfl_error err = {0};
    gguf_file *f = gguf_open_memory(data, size, &err);
    if (f == NULL) return;
    dfl_vocab *v = vocab_load_gguf(f, &err);
    if (v != NULL) {
        int32_t ids[64];
        dfl_tokenize(v, "Hello world <|im_start|>", 24, ids, 64, true, true);
        dfl_vocab_free(v);
    }
    gguf_close(f);
}

static void fuzz_chat(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = '\0';
    dfl_chat_msg msgs[16];
    size_t n = 0;
    char *p = buf, *end = buf + size;
    while (n < 16 && p < end) {
        char *role = p;
        p += strlen(p) + 1;
        if (p >= end) break;
        char *content = p;
        p += strlen(p) + 1;
        msgs[n] = (dfl_chat_msg){role, content, (n % 3 == 2) ? content : NULL};
        n++;
    }
    dfl_error err = {0};
    int64_t need = dfl_chat_render(NULL, msgs, n, (size & 1) != 0, (size & 2) != 0, NULL, 0, &err);
    FUZZ_CHECK(need < 0 && need != DFL_VOCAB_FAIL);
    char *out = malloc((size_t)-need);
    int64_t got = dfl_chat_render(NULL, msgs, n, (size & 1) != 0, (size & 2) != 0, out, (size_t)-need, &err);
    FUZZ_CHECK(got == -need - 1 && out[got] == '\0');
    free(out);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t mode = data[0] & 7;
    data++;
    size--;
    if (mode < 6) {
        int which = mode % 3;
        bool special = mode < 3;
        fuzz_encode(g_vocab[which], which == 0, special, data, size);
        fuzz_stream(g_vocab[which], data, size);
    } else if (mode == 6) {
        fuzz_gguf(data, size);
    } else {
        fuzz_chat(data, size);
    }
    return 0;
}
