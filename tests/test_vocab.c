/* tv_spec.c: unit tests of the tokenizer on small vocabularies built from arrays: BPE against a
 * naive quadratic reference, the pre-tokenizer scanners against PCRE2 running the same regexes,
 * special tokens, ill-formed UTF-8, the streaming detokenizer, the return conventions, every
 * vocabulary and GGUF error, concurrent use. (Conformance with the real Qwen3 tokenizer is in
 * test_vocab_qwen3.c.) */
#include "test.h"
#include "dflash.h"
#include "gguf/gguf.h"
#include "vocab/unicode.h"
#include "vocab/vocab.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small vocabulary builder --------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode, written out again for the tests */
static size_t byte_level(const uint8_t *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned b = s[i], cp = b;
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
            unsigned extra = 0;
            for (unsigned c = 0; c < b; c++) {
                if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) extra++;
            }
            cp = 256 + extra;
        }
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[o] = '\0';
    return o;
}

#define TV_MAX 4096
typedef struct tv_spec {
    char *tok[TV_MAX];
    int32_t type[TV_MAX];
    int n_tok;
    char *mer[TV_MAX];
    int n_mer;
} tv_spec;

static int tv_add(tv_spec *tv, const char *text, int32_t type) {
    tv->tok[tv->n_tok] = strdup(text);
    tv->type[tv->n_tok] = type;
    return tv->n_tok++;
}

/* all 256 byte tokens */
static void tv_init(tv_spec *tv) {
    memset(tv, 0, sizeof(*tv));
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        char s[8];
        byte_level(&byte, 1, s);
        tv_add(tv, s, DFL_TOKEN_TYPE_NORMAL);
    }
}

/* a merge of two raw byte strings; adds the merged token; returns its id */
static int tv_merge(tv_spec *tv, const char *a, const char *b) {
    char ea[256], eb[256], m[600], cat[600];
    byte_level((const uint8_t *)a, strlen(a), ea);
    byte_level((const uint8_t *)b, strlen(b), eb);
    snprintf(m, sizeof(m), "%s %s", ea, eb);
    tv->mer[tv->n_mer++] = strdup(m);
    snprintf(cat, sizeof(cat), "%s%s", ea, eb);
    for (int i = 0; i < tv->n_tok; i++) {
        if (tv->type[i] == DFL_TOKEN_TYPE_NORMAL && strcmp(tv->tok[i], cat) == 0) return i;
    }
    return tv_add(tv, cat, DFL_TOKEN_TYPE_NORMAL);
}

static void tv_free(tv_spec *tv) {
    for (int i = 0; i < tv->n_tok; i++) free(tv->tok[i]);
    for (int i = 0; i < tv->n_mer; i++) free(tv->mer[i]);
}

static dfl_vocab *tv_build(const tv_spec *tv, const char *pre, dfl_error *err) {
    vocab_desc d = vocab_desc_default();
    d.n_tokens = tv->n_tok;
    d.tokens = (const char *const *)tv->tok;
    d.types = tv->type;
    d.n_merges = tv->n_mer;
    d.merges = (const char *const *)tv->mer;
    d.pre = pre;
    return vocab_new(&d, err);
}

/* the id of a raw byte string among the normal tokens */
static int32_t id_of(const dfl_vocab *v, const char *raw) { return dfl_vocab_find(v, raw, strlen(raw)); }

/* ---- BPE -------------------------------------------------------------------------------------- */

/* the textbook algorithm: merge the lowest-ranked adjacent pair (leftmost on ties) until none */
static int naive_bpe(const dfl_vocab *v, const uint8_t *w, int n, int32_t *out) {
    int m = n;
    for (int i = 0; i < n; i++) out[i] = v->byte_token[w[i]];
    for (;;) {
        int best = -1;
        int32_t best_rank = INT32_MAX, best_res = -1;
        for (int i = 0; i + 1 < m; i++) {
            const vocab_merge *mg = vocab_merge_find(v, out[i], out[i + 1]);
            if (mg && mg->rank < best_rank) {
                best_rank = mg->rank;
                best_res = mg->result;
                best = i;
            }
        }
        if (best < 0) return m;
        out[best] = best_res;
        memmove(out + best + 1, out + best + 2, (size_t)(m - best - 2) * sizeof(int32_t));
        m--;
    }
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* merges learned like BPE training: the most frequent adjacent pair of a corpus of words over
 * "abc d", merged everywhere, 300 times */
static void train_merges(tv_spec *tv, uint64_t *rng) {
    enum { N_WORDS = 120, MAX_LEN = 14 };
    char sym[N_WORDS][MAX_LEN][MAX_LEN + 1]; /* current segmentation of each word */
    int n_sym[N_WORDS];
    const char *alpha = "aabbcd ";
    for (int w = 0; w < N_WORDS; w++) {
        n_sym[w] = 2 + (int)(rng_next(rng) % (MAX_LEN - 2));
        for (int k = 0; k < n_sym[w]; k++) {
            sym[w][k][0] = alpha[rng_next(rng) % 7];
            sym[w][k][1] = '\0';
        }
    }
    for (int step = 0; step < 300; step++) {
        /* count pairs by brute force (small) */
        int best_w = -1, best_k = -1, best_count = 0;
        for (int w = 0; w < N_WORDS; w++) {
            for (int k = 0; k + 1 < n_sym[w]; k++) {
                int count = 0;
                for (int w2 = 0; w2 < N_WORDS; w2++) {
                    for (int k2 = 0; k2 + 1 < n_sym[w2]; k2++) {
                        count += strcmp(sym[w][k], sym[w2][k2]) == 0 && strcmp(sym[w][k + 1], sym[w2][k2 + 1]) == 0;
                    }
                }
                if (count > best_count) best_count = count, best_w = w, best_k = k;
            }
        }
        if (best_w < 0) break;
        char a[MAX_LEN + 1], b[MAX_LEN + 1];
        strcpy(a, sym[best_w][best_k]);
        strcpy(b, sym[best_w][best_k + 1]);
        tv_merge(tv, a, b);
        for (int w = 0; w < N_WORDS; w++) { /* apply left to right */
            for (int k = 0; k + 1 < n_sym[w]; k++) {
                if (strcmp(sym[w][k], a) == 0 && strcmp(sym[w][k + 1], b) == 0) {
                    strcat(sym[w][k], b);
                    memmove(sym[w][k + 1], sym[w][k + 2], sizeof(sym[w][0]) * (size_t)(n_sym[w] - k - 2));
                    n_sym[w]--;
                }
            }
        }
    }
}

TEST(vocab_bpe_matches_naive) {
    for (int kind = 0; kind < 2; kind++) {
        static tv_spec tv;
        tv_init(&tv);
        uint64_t rng = 42 + (uint64_t)kind;
        if (kind == 0) {
            train_merges(&tv, &rng);
        } else {
            /* random merges of existing tokens (more conflicting orders than training gives) */
            char pool[1200][32];
            int n_pool = 0;
            for (const char *p = "abc "; *p; p++) {
                pool[n_pool][0] = *p;
                pool[n_pool++][1] = '\0';
            }
            for (int k = 0; k < 1000; k++) {
                const char *a = pool[rng_next(&rng) % (uint64_t)n_pool], *b = pool[rng_next(&rng) % (uint64_t)n_pool];
                if (strlen(a) + strlen(b) >= 31) continue;
                char cat[64];
                snprintf(cat, sizeof(cat), "%s%s", a, b);
                bool seen = false;
                for (int i = 0; i < n_pool && !seen; i++) seen = strcmp(pool[i], cat) == 0;
                tv_merge(&tv, a, b); /* two merges may give the same token */
                if (!seen && n_pool < 1200) strcpy(pool[n_pool++], cat);
            }
        }
        dfl_error err = {0};
        dfl_vocab *v = tv_build(&tv, "gpt2", &err);
        REQUIRE(v != NULL);
        bpe_ws ws;
        memset(&ws, 0, sizeof(ws));
        int n_diff = 0;
        const char *alpha = kind == 0 ? "aabbcd " : "abcab a";
        for (int trial = 0; trial < 3000; trial++) {
            uint8_t w[300];
            int n = 1 + (int)(rng_next(&rng) % (trial < 2000 ? 24 : 300));
            for (int i = 0; i < n; i++) w[i] = (uint8_t)alpha[rng_next(&rng) % 7];
            int32_t want[300], got[300];
            int nw = naive_bpe(v, w, n, want);
            ws.use_cache = trial % 2 == 0;
            tok_sink sink = {got, 300, 0};
            REQUIRE(bpe_word(v, w, (size_t)n, &ws, &sink));
            tok_sink sink2 = {got, 300, 0}; /* a second time: through the cache */
            REQUIRE(bpe_word(v, w, (size_t)n, &ws, &sink2));
            bool same = sink.n == nw && sink2.n == nw && memcmp(got, want, (size_t)nw * sizeof(int32_t)) == 0;
            if (!same && n_diff++ < 3) {
                test_fail(t, __FILE__, __LINE__, "merges %d: BPE of %.*s: %lld tokens vs %d", kind, n, w, (long long)sink2.n, nw);
            }
        }
        CHECK_EQ_INT(n_diff, 0);
        bpe_ws_free(&ws);
        dfl_vocab_free(v);
        tv_free(&tv);
    }
}

/* ---- pre-tokenizers vs PCRE2 ------------------------------------------------------------------ */

/* PCRE2 runs the reference patterns with \p{L}, \p{N} and \s spelled out as classes of the test
 * alphabet (so both sides agree on every code point's class and only the regex logic is tested) */
static void append_class(char *out, size_t cap, const uint32_t *cps, size_t n, unicode_class c) {
    for (size_t i = 0; i < n; i++) {
        if (unicode_class_of(cps[i]) == c) snprintf(out + strlen(out), cap - strlen(out), "\\x{%x}", (unsigned)cps[i]);
    }
}

static pcre2_code *compile_pattern(test_ctx *t, const char *tmpl, const uint32_t *cps, size_t n) {
    char L[2048] = "", N[2048] = "", S[2048] = "", pat[16384] = "";
    append_class(L, sizeof(L), cps, n, UNICODE_CLASS_LETTER);
    append_class(N, sizeof(N), cps, n, UNICODE_CLASS_NUMBER);
    append_class(S, sizeof(S), cps, n, UNICODE_CLASS_SPACE);
    /* placeholders: \1 \2 \3 = the contents of the classes L, N, S */
    for (const char *p = tmpl; *p; p++) {
        const char *ins = *p == '\1' ? L : *p == '\2' ? N : *p == '\3' ? S : NULL;
        size_t len = strlen(pat);
        if (ins) snprintf(pat + len, sizeof(pat) - len, "%s", ins);
        else if (len + 1 < sizeof(pat)) pat[len] = *p, pat[len + 1] = '\0';
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        test_fail(t, __FILE__, __LINE__, "pcre2: %s at %zu in %s", (char *)msg, (size_t)eo, pat);
    }
    return re;
}

TEST(vocab_pretok_matches_pcre2) {
    /* letters (ASCII, Latin-1, CJK, a Unicode 16 letter), numbers (digits, Arabic-Indic, No, Nl),
     * JavaScript \s (incl. U+FEFF, not U+0085), other */
    static const uint32_t cps[] = {'a', 's', 't', 'r', 'e', 'v', 'm', 'l', 'd', 'S', 'T', 'R', 'E', 'L', 'D', 'M', 'V',
                                   0xE9, 0x4E2D, 0x1C89, '1', '7', 0x663, 0xB2, 0x216B, ' ', ' ', ' ', '\t', '\n', '\r',
                                   0x0B, 0x0C, 0xA0, 0x3000, 0x2028, 0xFEFF, '\'', '\'', '!', '.', '-', 0x85, 0x180E,
                                   0x1F600, 0x301, 0x200B, 0};
    const size_t n_cps = sizeof(cps) / sizeof(cps[0]);
    CHECK_EQ_INT(unicode_class_of(0x85), UNICODE_CLASS_OTHER);
    CHECK_EQ_INT(unicode_class_of(0xFEFF), UNICODE_CLASS_SPACE);
    CHECK_EQ_INT(unicode_class_of(0x1C89), UNICODE_CLASS_LETTER);
    CHECK_EQ_INT(unicode_class_of(0x216B), UNICODE_CLASS_NUMBER);
    static const struct {
        vocab_pre pre;
        const char *pattern; /* \1 = \p{L}, \2 = \p{N}, \3 = \s as class contents */
    } k_patterns[] = {
        {VOCAB_PRE_GPT2, "'s|'t|'re|'ve|'m|'ll|'d| ?[\1]+| ?[\2]+| ?[^\3\1\2]+|[\3]+(?![^\3])|[\3]+"},
        {VOCAB_PRE_LLAMA3, "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\\r\\n\1\2]?[\1]+|[\2]{1,3}|"
                           " ?[^\3\1\2]+[\\r\\n]*|[\3]*[\\r\\n]+|[\3]+(?![^\3])|[\3]+"},
        {VOCAB_PRE_QWEN2, "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\\r\\n\1\2]?[\1]+|[\2]|"
                          " ?[^\3\1\2]+[\\r\\n]*|[\3]*[\\r\\n]+|[\3]+(?![^\3])|[\3]+"},
    };
    uint64_t rng = 7;
    for (size_t p = 0; p < 3; p++) {
        pcre2_code *re = compile_pattern(t, k_patterns[p].pattern, cps, n_cps);
        REQUIRE(re != NULL);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        int n_bad = 0;
        long n_words = 0;
        for (int trial = 0; trial < 4000; trial++) {
            uint8_t s[512];
            size_t n = 0;
            int len = 1 + (int)(rng_next(&rng) % 40);
            for (int k = 0; k < len; k++) n += utf8_encode(cps[rng_next(&rng) % n_cps], s + n);
            size_t pos = 0;
            while (pos < n) {
                int rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t want = rc > 0 && ov[0] == pos ? (size_t)ov[1] : (size_t)-1;
                size_t got = pretok_next(k_patterns[p].pre, s, n, pos);
                if (got != want) {
                    if (n_bad++ < 3) {
                        char hex[1600] = "";
                        for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", s[i]);
                        test_fail(t, __FILE__, __LINE__, "pattern %zu on %s at %zu: end %zu, PCRE2 %zd", p, hex, pos, got,
                                  (ssize_t)want);
                    }
                    break;
                }
                n_words++;
                pos = got;
            }
        }
        CHECK_MSG(n_bad == 0, "pattern %zu: %d strings differ", p, n_bad);
        CHECK(n_words > 10000);
        pcre2_match_data_free(md);
        pcre2_code_free(re);
    }
}

/* ---- special tokens, ill-formed UTF-8, API conventions ----------------------------------------- */

static dfl_vocab *small_vocab(test_ctx *t, const char *pre, tv_spec *tv) {
    tv_init(tv);
    tv_merge(tv, "h", "e");
    tv_merge(tv, "l", "l");
    tv_merge(tv, "he", "ll");
    tv_merge(tv, "hell", "o");
    tv_merge(tv, " ", "w");
    tv_merge(tv, "o", "r");
    tv_merge(tv, " w", "or");
    tv_merge(tv, "1", "2");
    tv_add(tv, "<|s|>", DFL_TOKEN_TYPE_CONTROL);
    tv_add(tv, "<|s|>x", DFL_TOKEN_TYPE_CONTROL);
    tv_add(tv, "<u>", DFL_TOKEN_TYPE_USER_DEFINED);
    tv_add(tv, "<|end|>", DFL_TOKEN_TYPE_CONTROL);
    tv_add(tv, "[PAD]", DFL_TOKEN_TYPE_UNUSED);
    dfl_error err = {0};
    dfl_vocab *v = tv_build(tv, pre, &err);
    if (v == NULL) test_fail(t, __FILE__, __LINE__, "vocab_new: %s", err.msg);
    return v;
}

static int64_t tokenize_str(const dfl_vocab *v, const char *s, int32_t *out, int64_t cap, bool special) {
    return dfl_tokenize(v, s, strlen(s), out, cap, false, special);
}

TEST(vocab_special_tokens) {
    static tv_spec tv;
    dfl_vocab *v = small_vocab(t, "qwen2", &tv);
    REQUIRE(v != NULL);
    int32_t s = id_of(v, "<|s|>"), sx = id_of(v, "<|s|>x"), u = id_of(v, "<u>"), end = id_of(v, "<|end|>");
    CHECK(s >= 0 && sx >= 0 && u >= 0 && end >= 0);
    int32_t ids[64];
    /* longest match first: <|s|>x wins over <|s|> */
    CHECK_EQ_INT(tokenize_str(v, "<|s|>x<|s|>", ids, 64, true), 2);
    CHECK_EQ_INT(ids[0], sx);
    CHECK_EQ_INT(ids[1], s);
    /* text around and between special tokens is tokenized on its own */
    CHECK_EQ_INT(tokenize_str(v, "hello<u> world", ids, 64, true), 5);
    CHECK_EQ_INT(ids[0], id_of(v, "hello"));
    CHECK_EQ_INT(ids[1], u);
    CHECK_EQ_INT(ids[2], id_of(v, " wor"));
    CHECK_EQ_INT(ids[3], id_of(v, "l"));
    /* parse_special off: control tokens are text, user-defined ones still match */
    int64_t n = tokenize_str(v, "<|end|><u>", ids, 64, false);
    CHECK(n == 8);
    CHECK_EQ_INT(ids[0], id_of(v, "<"));
    CHECK_EQ_INT(ids[n - 1], u);
    /* a partial special token is text */
    n = tokenize_str(v, "<|s|", ids, 64, true);
    CHECK_EQ_INT(n, 4);
    /* unused tokens never come out of text */
    n = tokenize_str(v, "[PAD]", ids, 64, true);
    CHECK_EQ_INT(n, 5);
    /* pieces: control and unused tokens are empty unless special */
    char buf[16];
    CHECK_EQ_INT(dfl_token_to_piece(v, end, buf, sizeof(buf), false), 0);
    CHECK_EQ_INT(dfl_token_to_piece(v, end, buf, sizeof(buf), true), 7);
    CHECK(memcmp(buf, "<|end|>", 7) == 0);
    CHECK_EQ_INT(dfl_token_to_piece(v, u, buf, sizeof(buf), false), 3);
    CHECK_EQ_INT(dfl_token_to_piece(v, id_of(v, "[PAD]"), buf, sizeof(buf), false), 0);
    CHECK_EQ_INT(dfl_vocab_eot(v), end); /* detected by name */
    CHECK(dfl_vocab_is_eog(v, end));
    dfl_vocab_free(v);
    tv_free(&tv);
}

TEST(vocab_invalid_utf8) {
    static tv_spec tv;
    dfl_vocab *v = small_vocab(t, "qwen2", &tv);
    REQUIRE(v != NULL);
    /* every byte that is not part of a well-formed sequence is its byte token and splits the text:
     * "hel" + 0xFF + "lo" is not "hello" */
    static const struct {
        const char *text;
        size_t len;
        int n;
    } cases[] = {
        {"\xe2\x82", 2, 2},               /* truncated 3-byte sequence: 2 byte tokens */
        {"\xed\xa0\x80", 3, 3},           /* a surrogate */
        {"\xc0\xaf", 2, 2},               /* overlong */
        {"\xf4\x90\x80\x80", 4, 4},       /* above U+10FFFF */
        {"\xe4\xb8\xad", 3, 3},           /* well-formed U+4E2D: 3 byte tokens, no merges in this vocabulary */
    };
    int32_t ids[64];
    char back[64];
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int64_t n = dfl_tokenize(v, cases[c].text, cases[c].len, ids, 64, false, true);
        CHECK(n > 0);
        CHECK_EQ_INT(n, cases[c].n);
        for (int64_t i = 0; i < n; i++) CHECK_EQ_INT(ids[i], v->byte_token[(uint8_t)cases[c].text[i]]);
        /* the bytes come back as they were */
        CHECK_EQ_INT(dfl_detokenize(v, ids, n, back, sizeof(back), true), (int64_t)cases[c].len);
        CHECK(memcmp(back, cases[c].text, cases[c].len) == 0);
    }
    int64_t n = dfl_tokenize(v, "hel\xffllo", 7, ids, 64, false, true);
    REQUIRE(n == 5);
    CHECK_EQ_INT(ids[0], id_of(v, "he"));
    CHECK_EQ_INT(ids[1], id_of(v, "l"));
    CHECK_EQ_INT(ids[2], v->byte_token[0xFF]);
    CHECK_EQ_INT(ids[3], id_of(v, "ll"));
    CHECK_EQ_INT(ids[4], id_of(v, "o"));
    dfl_vocab_free(v);
    tv_free(&tv);
}

TEST(vocab_api_conventions) {
    static tv_spec tv;
    tv_init(&tv);
    tv_merge(&tv, "a", "b");
    int bos = tv_add(&tv, "<s>", DFL_TOKEN_TYPE_CONTROL), eos = tv_add(&tv, "</s>", DFL_TOKEN_TYPE_CONTROL);
    vocab_desc d = vocab_desc_default();
    d.n_tokens = tv.n_tok;
    d.tokens = (const char *const *)tv.tok;
    d.types = tv.type;
    d.n_merges = tv.n_mer;
    d.merges = (const char *const *)tv.mer;
    d.pre = "llama3";
    d.bos = bos;
    d.eos = eos;
    d.add_bos = d.add_eos = true;
    dfl_error err = {0};
    dfl_vocab *v = vocab_new(&d, &err);
    REQUIRE(v != NULL);
    int32_t ids[16] = {0};
    /* add_special: BOS and EOS where the vocabulary asks for them */
    CHECK_EQ_INT(dfl_tokenize(v, "ab", 2, ids, 16, true, true), 3);
    CHECK_EQ_INT(ids[0], bos);
    CHECK_EQ_INT(ids[2], eos);
    CHECK(dfl_vocab_add_bos(v));
    /* too small: -n, the first n_max written */
    ids[1] = -7;
    CHECK_EQ_INT(dfl_tokenize(v, "ab ab ab", 8, ids, 1, false, true), -5); /* ab | " " ab | " " ab */
    CHECK_EQ_INT(ids[1], -7);
    CHECK_EQ_INT(dfl_tokenize(v, "ab ab ab", 8, NULL, 0, false, true), -5);
    CHECK_EQ_INT(dfl_tokenize(v, "", 0, NULL, 0, false, true), 0);
    /* bad arguments */
    CHECK(dfl_tokenize(NULL, "a", 1, ids, 16, false, true) == DFL_VOCAB_FAIL);
    CHECK(dfl_tokenize(v, NULL, 1, ids, 16, false, true) == DFL_VOCAB_FAIL);
    CHECK(dfl_tokenize(v, "a", 1, ids, -1, false, true) == DFL_VOCAB_FAIL);
    CHECK(dfl_tokenize(v, "a", 1, NULL, 4, false, true) == DFL_VOCAB_FAIL);
    char buf[8];
    CHECK(dfl_token_to_piece(v, -1, buf, 8, true) == DFL_VOCAB_FAIL);
    CHECK(dfl_token_to_piece(v, (int32_t)dfl_vocab_n_tokens(v), buf, 8, true) == DFL_VOCAB_FAIL);
    CHECK_EQ_INT(dfl_token_to_piece(v, eos, buf, 2, true), -4);
    CHECK_EQ_INT(dfl_tokenize(v, "ab", 2, ids, 16, true, true), 3);
    int32_t bad[2] = {0, 1 << 30};
    CHECK(dfl_detokenize(v, bad, 2, buf, 8, true) == DFL_VOCAB_FAIL);
    CHECK_EQ_INT(dfl_detokenize(v, ids, 3, buf, 1, true), -9); /* "<s>" "ab" "</s>" */
    CHECK_EQ_INT(dfl_detokenize(v, ids, 3, buf, 8, false), 2); /* control tokens hidden */
    CHECK_EQ_INT(dfl_vocab_token_type(v, bos), DFL_TOKEN_TYPE_CONTROL);
    CHECK_EQ_INT(dfl_vocab_token_type(NULL, 0), DFL_TOKEN_TYPE_INVALID);
    CHECK(strcmp(dfl_vocab_pre_name(v), "llama3") == 0);
    dfl_vocab_free(v);
    dfl_vocab_free(NULL);
    tv_free(&tv);
}

TEST(vocab_llama3_ignore_merges) {
    /* "abc" is a token, but BPE would stop at "ab" "c" (no merge ab+c): llama3 (ignore_merges) takes
     * the token, gpt2 does not */
    static tv_spec tv;
    tv_init(&tv);
    tv_merge(&tv, "a", "b");
    tv_merge(&tv, "1", "2");
    tv_add(&tv, "abc", DFL_TOKEN_TYPE_NORMAL);
    dfl_error err = {0};
    dfl_vocab *l3 = tv_build(&tv, "llama-bpe", &err), *g2 = tv_build(&tv, "gpt2", &err), *q2 = tv_build(&tv, "qwen2", &err);
    REQUIRE(l3 != NULL && g2 != NULL && q2 != NULL);
    int32_t ids[16];
    CHECK_EQ_INT(tokenize_str(l3, "abc", ids, 16, true), 1);
    CHECK_EQ_INT(ids[0], id_of(l3, "abc"));
    CHECK_EQ_INT(tokenize_str(g2, "abc", ids, 16, true), 2);
    /* digits: llama3 groups up to three (121 212 1 -> 12 1 | 2 12 | 1), qwen2 one, gpt2 all (12 12 12 1) */
    CHECK_EQ_INT(tokenize_str(l3, "1212121", ids, 16, true), 5);
    CHECK_EQ_INT(tokenize_str(q2, "1212121", ids, 16, true), 7);
    CHECK_EQ_INT(tokenize_str(g2, "1212121", ids, 16, true), 4);
    dfl_vocab_free(l3);
    dfl_vocab_free(g2);
    dfl_vocab_free(q2);
    tv_free(&tv);
}

/* ---- streaming detokenizer -------------------------------------------------------------------- */

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l;
        if (utf8_decode(s + i, n - i, &cp, &l) != UTF8_OK) return false;
        i += l;
    }
    return true;
}

TEST(vocab_detok_stream) {
    static tv_spec tv;
    dfl_vocab *v = small_vocab(t, "qwen2", &tv);
    REQUIRE(v != NULL);
    dfl_error err = {0};
    dfl_detok *d = dfl_detok_new(v, false, &err);
    REQUIRE(d != NULL);
    const char *out;
    size_t n;
    /* U+4E2D arrives byte by byte: nothing until it is complete */
    CHECK(dfl_detok_push(d, v->byte_token[0xE4], &out, &n) == DFL_OK && n == 0);
    CHECK(dfl_detok_push(d, v->byte_token[0xB8], &out, &n) == DFL_OK && n == 0);
    CHECK(dfl_detok_push(d, v->byte_token[0xAD], &out, &n) == DFL_OK && n == 3 && memcmp(out, "\xe4\xb8\xad", 3) == 0);
    /* an ill-formed byte becomes U+FFFD; an interrupted sequence too, and the next byte is kept */
    CHECK(dfl_detok_push(d, v->byte_token[0xFF], &out, &n) == DFL_OK && n == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK(dfl_detok_push(d, v->byte_token[0xE4], &out, &n) == DFL_OK && n == 0);
    CHECK(dfl_detok_push(d, id_of(v, "a"), &out, &n) == DFL_OK && n == 4 && memcmp(out, "\xef\xbf\xbd" "a", 4) == 0);
    /* held back at the end: flush gives U+FFFD and resets */
    CHECK(dfl_detok_push(d, v->byte_token[0xF0], &out, &n) == DFL_OK && n == 0);
    dfl_detok_flush(d, &out, &n);
    CHECK(n == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
    dfl_detok_flush(d, &out, &n);
    CHECK_EQ_INT(n, 0);
    /* control tokens are hidden (special = false), user-defined ones shown */
    CHECK(dfl_detok_push(d, id_of(v, "<|end|>"), &out, &n) == DFL_OK && n == 0);
    CHECK(dfl_detok_push(d, id_of(v, "<u>"), &out, &n) == DFL_OK && n == 3);
    CHECK(dfl_detok_push(d, -1, &out, &n) == DFL_ERR_INVALID && n == 0);
    /* random byte tokens: the output is always valid UTF-8, and for well-formed input it is the input */
    uint64_t rng = 99;
    for (int trial = 0; trial < 200; trial++) {
        uint8_t bytes[64], got[512];
        size_t nb = 1 + rng_next(&rng) % 64, ng = 0;
        bool text = trial % 2 == 0;
        for (size_t i = 0; i < nb; i++) bytes[i] = (uint8_t)(rng_next(&rng) & (text ? 0x7F : 0xFF));
        if (text) nb = 0, nb += utf8_encode(0x1F600, bytes), nb += utf8_encode(0xE9, bytes + nb), nb += utf8_encode('x', bytes + nb);
        for (size_t i = 0; i < nb; i++) {
            REQUIRE(dfl_detok_push(d, v->byte_token[bytes[i]], &out, &n) == DFL_OK);
            memcpy(got + ng, out, n);
            ng += n;
        }
        dfl_detok_flush(d, &out, &n);
        memcpy(got + ng, out, n);
        ng += n;
        CHECK(valid_utf8(got, ng));
        if (text) CHECK(ng == nb && memcmp(got, bytes, nb) == 0);
    }
    dfl_detok_free(d);
    dfl_vocab_free(v);
    tv_free(&tv);
}

/* ---- errors ----------------------------------------------------------------------------------- */

static void expect_vocab_error(test_ctx *t, const vocab_desc *d, dfl_status code, const char *needle) {
    dfl_error err = {0};
    dfl_vocab *v = vocab_new(d, &err);
    CHECK(v == NULL);
    CHECK_EQ_INT(err.code, code);
    CHECK_STR_CONTAINS(err.msg, needle);
    dfl_vocab_free(v);
}

TEST(vocab_build_errors) {
    static tv_spec tv;
    tv_init(&tv);
    tv_merge(&tv, "a", "b");
    vocab_desc d = vocab_desc_default();
    d.n_tokens = tv.n_tok;
    d.tokens = (const char *const *)tv.tok;
    d.types = tv.type;
    d.n_merges = tv.n_mer;
    d.merges = (const char *const *)tv.mer;
    dfl_error err = {0};
    dfl_vocab *ok = vocab_new(&d, &err);
    CHECK(ok != NULL);
    dfl_vocab_free(ok);

    vocab_desc e = d;
    e.pre = "falcon";
    expect_vocab_error(t, &e, DFL_ERR_UNSUPPORTED, "'falcon' is not supported");
    e = d;
    e.bos = (int32_t)d.n_tokens;
    expect_vocab_error(t, &e, DFL_ERR_FORMAT, "bos token id");
    e = d;
    e.n_tokens = 255; /* the byte 0xff... is missing: which token id lacks depends on the order */
    expect_vocab_error(t, &e, DFL_ERR_FORMAT, "no normal token for the byte");
    const char *bad_merges[] = {"nospace", "a c\xc4\x80zz"};
    e = d;
    e.merges = bad_merges;
    e.n_merges = 1;
    expect_vocab_error(t, &e, DFL_ERR_FORMAT, "merge 0 'nospace'");
    e.merges = bad_merges + 1;
    expect_vocab_error(t, &e, DFL_ERR_FORMAT, "is not a normal token");
    int32_t types[TV_MAX];
    memcpy(types, tv.type, sizeof(int32_t) * (size_t)tv.n_tok);
    types[5] = 9;
    e = d;
    e.types = types;
    expect_vocab_error(t, &e, DFL_ERR_FORMAT, "token 5 has an invalid type 9");
    char *toks[TV_MAX];
    memcpy(toks, tv.tok, sizeof(char *) * (size_t)tv.n_tok);
    toks[256] = (char *)"\xe4\xb8\xad"; /* a normal token outside the byte alphabet */
    e = d;
    e.tokens = (const char *const *)toks;
    expect_vocab_error(t, &e, DFL_ERR_FORMAT, "not byte-level text");
    e = d;
    e.n_tokens = 0;
    expect_vocab_error(t, &e, DFL_ERR_INVALID, "no tokens");
    tv_free(&tv);
}

/* writes a vocabulary GGUF with our writer; mutate selects one defect */
static bool write_vocab_gguf(test_ctx *t, const char *path, const tv_spec *tv, int mutate) {
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3");
    gguf_writer_set_str(w, "tokenizer.ggml.model", mutate == 1 ? "llama" : "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", mutate == 2 ? "bloom" : "qwen2");
    if (mutate != 3) gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tv->tok, NULL, (size_t)tv->n_tok);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", tv->type, (size_t)(mutate == 4 ? tv->n_tok - 1 : tv->n_tok));
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)tv->mer, NULL, (size_t)tv->n_mer);
    if (mutate == 5) gguf_writer_set_str(w, "tokenizer.ggml.eos_token_id", "two");
    else gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(mutate == 6 ? 1000000 : 256));
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    dfl_error err = {0};
    dfl_status st = gguf_writer_write(w, path, &err);
    gguf_writer_free(w);
    if (st != DFL_OK) test_fail(t, __FILE__, __LINE__, "gguf write: %s", err.msg);
    return st == DFL_OK;
}

TEST(vocab_gguf_load_errors) {
    static tv_spec tv;
    tv_init(&tv);
    tv_merge(&tv, "a", "b");
    static const struct {
        int mutate;
        dfl_status code;
        const char *needle;
    } cases[] = {
        {0, DFL_OK, ""},
        {1, DFL_ERR_UNSUPPORTED, "tokenizer.ggml.model is 'llama'"},
        {2, DFL_ERR_UNSUPPORTED, "'bloom' is not supported"},
        {3, DFL_ERR_MISSING, "tokenizer.ggml.tokens"},
        {4, DFL_ERR_MISMATCH, "token_type has 256 entries for 257 tokens"},
        {5, DFL_ERR_MISMATCH, "tokenizer.ggml.eos_token_id"},
        {6, DFL_ERR_FORMAT, "eos token id 1000000 is out of range"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char path[512], name[32];
        snprintf(name, sizeof(name), "v%zu.gguf", c);
        test_path(t, name, path, sizeof(path));
        REQUIRE(write_vocab_gguf(t, path, &tv, cases[c].mutate));
        dfl_error err = {0};
        dfl_vocab *v = dfl_vocab_load(path, &err);
        if (cases[c].code == DFL_OK) {
            CHECK_MSG(v != NULL, "load: %s", err.msg);
            CHECK_EQ_INT(dfl_vocab_eos(v), 256);
        } else {
            CHECK(v == NULL);
            CHECK_EQ_INT(err.code, cases[c].code);
            CHECK_STR_CONTAINS(err.msg, cases[c].needle);
            CHECK_STR_CONTAINS(err.msg, name); /* the message names the file */
        }
        dfl_vocab_free(v);
    }
    dfl_error err = {0};
    CHECK(dfl_vocab_load("/nonexistent/x.gguf", &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "/nonexistent/x.gguf");
    tv_free(&tv);
}

/* ---- concurrency: the shared word cache -------------------------------------------------------- */

typedef struct thread_job {
    const dfl_vocab *v;
    const char *text;
    size_t len;
    int32_t *out;
    int64_t n;
} thread_job;

static void *tokenize_thread(void *arg) {
    thread_job *j = arg;
    for (int r = 0; r < 20; r++) j->n = dfl_tokenize(j->v, j->text, j->len, j->out, (int64_t)j->len + 8, false, true);
    return NULL;
}

TEST(vocab_threads) {
    static tv_spec tv;
    dfl_vocab *v = small_vocab(t, "qwen2", &tv);
    REQUIRE(v != NULL);
    char text[4096];
    size_t len = 0;
    uint64_t rng = 3;
    static const char *const words[] = {"hello", " world", " hell", "o", "12", "<|s|>", "\xe4\xb8\xad", " ", "\n", "x"};
    while (len < sizeof(text) - 16) {
        const char *w = words[rng_next(&rng) % 10];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
    }
    int32_t *ref = malloc((len + 8) * sizeof(int32_t));
    int64_t n_ref = dfl_tokenize(v, text, len, ref, (int64_t)len + 8, false, true);
    REQUIRE(n_ref > 0);
    pthread_t th[4];
    thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){v, text, len, malloc((len + 8) * sizeof(int32_t)), 0};
        pthread_create(&th[i], NULL, tokenize_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(jobs[i].n, n_ref);
        CHECK(memcmp(jobs[i].out, ref, (size_t)n_ref * sizeof(int32_t)) == 0);
        free(jobs[i].out);
    }
    free(ref);
    dfl_vocab_free(v);
    tv_free(&tv);
}

/* ---- chat template corner cases (the fixtures cover Qwen3's renderings) ------------------------ */

TEST(vocab_chat_errors) {
    static tv_spec tv;
    dfl_vocab *v = small_vocab(t, "qwen2", &tv);
    REQUIRE(v != NULL);
    dfl_chat_msg m = {"user", "hi", NULL};
    dfl_error err = {0};
    char buf[256];
    /* a vocabulary without <|im_start|> */
    CHECK(dfl_chat_render(v, &m, 1, true, true, buf, sizeof(buf), &err) == DFL_VOCAB_FAIL);
    CHECK_EQ_INT(err.code, DFL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.msg, "<|im_start|>");
    /* without a vocabulary: ChatML */
    const char *want = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    int64_t n = (int64_t)strlen(want);
    CHECK_EQ_INT(dfl_chat_render(NULL, &m, 1, true, true, buf, sizeof(buf), NULL), n);
    CHECK(strcmp(buf, want) == 0);
    CHECK_EQ_INT(dfl_chat_render(NULL, &m, 1, true, true, buf, (size_t)n, NULL), -(n + 1));
    dfl_chat_msg bad = {"user", NULL, NULL};
    err = (dfl_error){0};
    CHECK(dfl_chat_render(NULL, &bad, 1, true, true, buf, sizeof(buf), &err) == DFL_VOCAB_FAIL);
    CHECK_STR_CONTAINS(err.msg, "message 0 has no content");
    dfl_vocab_free(v);
    tv_free(&tv);
}
