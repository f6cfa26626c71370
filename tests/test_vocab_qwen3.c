/* test_vocab_qwen3.c: conformance of the tokenizer with the real Qwen3 tokenizer. The fixtures in
 * tests/fixtures/vocab/ come from tests/peer/gen_tokenizer_fixtures.mjs: a vocabulary-only GGUF
 * written by our GGUF writer from Qwen3's tokenizer.json, and the ids that the reference encoder
 * (transformers.js) gives for a corpus of > 3,000 strings, with and without special-token
 * parsing; the NFC forms of ~60,000 strings; Qwen3's chat template rendered by a Jinja engine. */
#include "test.h"
#include "dflash.h"
#include "vocab/unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FIXTURE_DIR "tests/fixtures/vocab/"

/* gunzips a fixture into the test's directory; returns the path (buf) or NULL */
static const char *gunzip_fixture(test_ctx *t, const char *name, char *buf, size_t cap) {
    char gz[512], cmd[1400], out[512];
    snprintf(gz, sizeof(gz), FIXTURE_DIR "%s.gz", name);
    test_path(t, name, buf, cap);
    snprintf(cmd, sizeof(cmd), "gzip -dc '%s' > '%s'", gz, buf);
    if (test_run(cmd, out, sizeof(out)) != 0) {
        test_fail(t, __FILE__, __LINE__, "cannot decompress %s: %s", gz, out);
        return NULL;
    }
    return buf;
}

static dfl_vocab *load_qwen3(test_ctx *t) {
    char path[512];
    if (gunzip_fixture(t, "qwen3-vocab.gguf", path, sizeof(path)) == NULL) return NULL;
    dfl_error err = {0};
    dfl_vocab *v = dfl_vocab_load(path, &err);
    if (v == NULL) test_fail(t, __FILE__, __LINE__, "dfl_vocab_load: %s", err.msg);
    return v;
}

static uint8_t *unhex(const char *h, size_t n, size_t *len) {
    uint8_t *out = malloc(n / 2 + 1);
    if (out == NULL) return NULL;
    for (size_t i = 0; i + 1 < n; i += 2) {
        int hi = h[i] <= '9' ? h[i] - '0' : (h[i] | 0x20) - 'a' + 10;
        int lo = h[i + 1] <= '9' ? h[i + 1] - '0' : (h[i + 1] | 0x20) - 'a' + 10;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return out;
}

/* "1,2,3" -> ids (malloc'd) */
static int32_t *parse_ids(const char *s, size_t n, int64_t *count) {
    int32_t *ids = malloc((n / 2 + 2) * sizeof(int32_t));
    int64_t k = 0;
    size_t i = 0;
    while (i < n) {
        long v = 0;
        while (i < n && s[i] != ',') v = v * 10 + (s[i++] - '0');
        ids[k++] = (int32_t)v;
        i++;
    }
    *count = k;
    return ids;
}

/* splits a line at tabs into at most max fields */
static int split_tabs(char *line, char **f, size_t *len, int max) {
    int n = 0;
    char *p = line;
    while (n < max) {
        char *tab = strchr(p, '\t');
        char *end = tab ? tab : p + strlen(p);
        while (end > p && (end[-1] == '\n' || end[-1] == '\r')) end--;
        f[n] = p;
        len[n] = (size_t)(end - p);
        n++;
        if (tab == NULL) break;
        p = tab + 1;
    }
    return n;
}

static int64_t first_diff(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

typedef struct cat_count {
    char name[16];
    int n, ok_special, ok_plain, ok_decode, ok_stream;
} cat_count;

TEST(vocab_qwen3_corpus) {
    dfl_vocab *v = load_qwen3(t);
    REQUIRE(v != NULL);
    char path[512];
    REQUIRE(gunzip_fixture(t, "corpus.tsv", path, sizeof(path)) != NULL);
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    dfl_error err = {0};
    dfl_detok *dt = dfl_detok_new(v, true, &err);
    REQUIRE(dt != NULL);
    cat_count cats[32];
    int n_cats = 0, n_lines = 0, n_reported = 0;
    int tot_sp = 0, tot_plain = 0, tot_dec = 0, tot_stream = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    double t_enc = 0;
    size_t enc_bytes = 0;
    while ((got = getline(&line, &cap, f)) > 0) {
        char *fl[6];
        size_t ln[6];
        if (split_tabs(line, fl, ln, 6) != 6) {
            CHECK_MSG(false, "corpus line %d: not 6 fields", n_lines + 1);
            continue;
        }
        n_lines++;
        cat_count *c = NULL;
        for (int k = 0; k < n_cats; k++) {
            if (strlen(cats[k].name) == ln[0] && memcmp(cats[k].name, fl[0], ln[0]) == 0) c = &cats[k];
        }
        if (c == NULL && n_cats < 32) {
            c = &cats[n_cats++];
            memset(c, 0, sizeof(*c));
            memcpy(c->name, fl[0], ln[0] < 15 ? ln[0] : 15);
        }
        REQUIRE(c != NULL);
        c->n++;
        size_t text_len, dec_len, lossy_len;
        uint8_t *text = unhex(fl[1], ln[1], &text_len);
        int64_t n_sp, n_plain;
        int32_t *want_sp = parse_ids(fl[2], ln[2], &n_sp);
        int32_t *want_plain = (ln[3] == 1 && fl[3][0] == '=') ? NULL : parse_ids(fl[3], ln[3], &n_plain);
        if (want_plain == NULL) n_plain = n_sp;
        uint8_t *dec = (ln[4] == 1 && fl[4][0] == '=') ? NULL : unhex(fl[4], ln[4], &dec_len);
        const uint8_t *want_dec = dec ? dec : text;
        if (!dec) dec_len = text_len;
        uint8_t *lossy = (ln[5] == 1 && fl[5][0] == '=') ? NULL : unhex(fl[5], ln[5], &lossy_len);
        const uint8_t *want_lossy = lossy ? lossy : want_dec;
        if (!lossy) lossy_len = dec_len;

        int64_t n_max = (int64_t)text_len + 8;
        int32_t *ids = malloc((size_t)n_max * sizeof(int32_t));
        struct timespec t0, t1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        int64_t n = dfl_tokenize(v, (const char *)text, text_len, ids, n_max, false, true);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        t_enc += (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        enc_bytes += text_len;
        bool ok_sp = n == n_sp && memcmp(ids, want_sp, (size_t)n_sp * sizeof(int32_t)) == 0;
        if (!ok_sp && n_reported++ < 10) {
            int64_t d = n >= 0 ? first_diff(ids, n, want_sp, n_sp) : 0;
            test_fail(t, __FILE__, __LINE__, "corpus line %d (%s, %zu bytes): %lld tokens vs %lld expected, first difference "
                      "at token %lld: %d vs %d", n_lines, c->name, text_len, (long long)n, (long long)n_sp, (long long)d,
                      d < n ? ids[d] : -1, d < n_sp ? want_sp[d] : -1);
        }
        c->ok_special += ok_sp;
        tot_sp += ok_sp;

        int64_t m = dfl_tokenize(v, (const char *)text, text_len, ids, n_max, false, false);
        const int32_t *wp = want_plain ? want_plain : want_sp;
        bool ok_plain = m == n_plain && memcmp(ids, wp, (size_t)n_plain * sizeof(int32_t)) == 0;
        if (!ok_plain && n_reported++ < 10) {
            test_fail(t, __FILE__, __LINE__, "corpus line %d (%s): parse_special=false: %lld tokens vs %lld expected",
                      n_lines, c->name, (long long)m, (long long)n_plain);
        }
        c->ok_plain += ok_plain;
        tot_plain += ok_plain;

        /* decode(encode(x)) == NFC(x) (x itself for NFC UTF-8; ill-formed bytes kept), with and
         * without special-token parsing */
        char *out = malloc(dec_len + 16);
        int64_t d1 = dfl_detokenize(v, wp, n_plain, out, dec_len + 16, true);
        bool ok_dec = d1 == (int64_t)dec_len && memcmp(out, want_dec, dec_len) == 0;
        d1 = dfl_detokenize(v, want_sp, n_sp, out, dec_len + 16, true);
        ok_dec = ok_dec && d1 == (int64_t)dec_len && memcmp(out, want_dec, dec_len) == 0;
        if (!ok_dec && n_reported++ < 10) {
            test_fail(t, __FILE__, __LINE__, "corpus line %d (%s): detokenize gives %lld bytes, expected %zu", n_lines,
                      c->name, (long long)d1, dec_len);
        }
        c->ok_decode += ok_dec;
        tot_dec += ok_dec;
        free(out);

        /* streaming: always valid UTF-8, equal to the WHATWG decoding of the bytes */
        char *stream = malloc(3 * dec_len + 16);
        size_t sn = 0;
        bool ok_stream = true;
        for (int64_t i = 0; i < n_sp && ok_stream; i++) {
            const char *piece;
            size_t pl;
            ok_stream = dfl_detok_push(dt, want_sp[i], &piece, &pl) == DFL_OK && sn + pl <= 3 * dec_len + 16;
            if (ok_stream) {
                memcpy(stream + sn, piece, pl);
                sn += pl;
            }
        }
        const char *piece;
        size_t pl;
        dfl_detok_flush(dt, &piece, &pl);
        if (ok_stream && sn + pl <= 3 * dec_len + 16) {
            memcpy(stream + sn, piece, pl);
            sn += pl;
        }
        ok_stream = ok_stream && sn == lossy_len && memcmp(stream, want_lossy, lossy_len) == 0;
        if (!ok_stream && n_reported++ < 10) {
            test_fail(t, __FILE__, __LINE__, "corpus line %d (%s): streamed %zu bytes, expected %zu", n_lines, c->name, sn,
                      lossy_len);
        }
        c->ok_stream += ok_stream;
        tot_stream += ok_stream;
        free(stream);

        free(ids);
        free(text);
        free(want_sp);
        free(want_plain);
        free(dec);
        free(lossy);
    }
    free(line);
    fclose(f);
    dfl_detok_free(dt);
    dfl_vocab_free(v);
    CHECK(n_lines >= 2000);
    fprintf(stderr, "  corpus: %d strings; ids match %d (parse_special) and %d (no parse_special); decode %d; stream %d\n",
            n_lines, tot_sp, tot_plain, tot_dec, tot_stream);
    for (int k = 0; k < n_cats; k++) {
        fprintf(stderr, "    %-12s %4d strings: %4d / %4d ids, %4d decode, %4d stream\n", cats[k].name, cats[k].n,
                cats[k].ok_special, cats[k].ok_plain, cats[k].ok_decode, cats[k].ok_stream);
    }
    fprintf(stderr, "  corpus encode speed (cold word cache, thread CPU time): %.1f MB/s over %zu bytes\n",
            (double)enc_bytes / t_enc / 1e6, enc_bytes);
    CHECK_EQ_INT(tot_sp, n_lines);
    CHECK_EQ_INT(tot_plain, n_lines);
    CHECK_EQ_INT(tot_dec, n_lines);
    CHECK_EQ_INT(tot_stream, n_lines);
}

TEST(vocab_qwen3_nfc) {
    char path[512];
    REQUIRE(gunzip_fixture(t, "nfc.tsv", path, sizeof(path)) != NULL);
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    unicode_nfc_ws ws;
    memset(&ws, 0, sizeof(ws));
    char *line = NULL;
    size_t cap = 0;
    int n = 0, ok = 0;
    while (getline(&line, &cap, f) > 0) {
        char *fl[2];
        size_t ln[2];
        if (split_tabs(line, fl, ln, 2) != 2) continue;
        size_t in_len, want_len, got_len;
        uint8_t *in = unhex(fl[0], ln[0], &in_len), *want = unhex(fl[1], ln[1], &want_len);
        const uint8_t *got;
        bool r = unicode_nfc(in, in_len, &ws, &got, &got_len);
        bool good = r && got_len == want_len && memcmp(got, want, want_len) == 0;
        /* the quick check never claims NFC for text that normalization changes */
        if (unicode_nfc_quick(in, in_len)) good = good && in_len == want_len && memcmp(in, want, in_len) == 0;
        if (!good && n - ok < 5) test_fail(t, __FILE__, __LINE__, "NFC of %.*s differs", (int)ln[0], fl[0]);
        ok += good;
        n++;
        free(in);
        free(want);
    }
    free(line);
    fclose(f);
    unicode_nfc_ws_free(&ws);
    fprintf(stderr, "  nfc: %d / %d strings normalized as the reference engine does\n", ok, n);
    CHECK(n > 50000);
    CHECK_EQ_INT(ok, n);
}

TEST(vocab_qwen3_chat_template) {
    dfl_vocab *v = load_qwen3(t);
    REQUIRE(v != NULL);
    FILE *f = fopen(FIXTURE_DIR "chat.txt", "r");
    REQUIRE(f != NULL);
    char *line = NULL;
    size_t cap = 0;
    dfl_chat_msg msgs[16];
    char *owned[48];
    int n_owned = 0, n_msgs = 0, gen = 0, think = 1, n_cases = 0, n_ok = 0;
    while (getline(&line, &cap, f) > 0) {
        char a[65536], b[65536], c[65536];
        size_t la, lb, lc;
        if (sscanf(line, "case gen=%d think=%d", &gen, &think) == 2) {
            for (int k = 0; k < n_owned; k++) free(owned[k]);
            n_owned = n_msgs = 0;
        } else if (sscanf(line, "msg %65535s %65535s %65535s", a, b, c) == 3 && n_msgs < 16) {
            char *role = (char *)unhex(a, a[0] == '.' ? 0 : strlen(a), &la);
            char *content = (char *)unhex(b, b[0] == '.' ? 0 : strlen(b), &lb);
            char *reason = strcmp(c, "-") == 0 ? NULL : (char *)unhex(c, c[0] == '.' ? 0 : strlen(c), &lc);
            role[la] = '\0';
            content[lb] = '\0';
            if (reason) reason[lc] = '\0';
            owned[n_owned++] = role;
            owned[n_owned++] = content;
            if (reason) owned[n_owned++] = reason;
            msgs[n_msgs++] = (dfl_chat_msg){role, content, reason};
        } else if (sscanf(line, "want %65535s", a) == 1) {
            char *want = (char *)unhex(a, a[0] == '.' ? 0 : strlen(a), &la);
            want[la] = '\0';
            char buf[65536];
            dfl_error err = {0};
            int64_t n = dfl_chat_render(v, msgs, (size_t)n_msgs, gen != 0, think != 0, buf, sizeof(buf), &err);
            bool ok = n == (int64_t)la && memcmp(buf, want, la) == 0 && buf[la] == '\0';
            if (!ok) {
                test_fail(t, __FILE__, __LINE__, "chat case %d (gen=%d think=%d, %d messages): got [%s] want [%s]",
                          n_cases + 1, gen, think, n_msgs, n >= 0 ? buf : err.msg, want);
            }
            /* the size query gives the size to allocate */
            int64_t q = dfl_chat_render(v, msgs, (size_t)n_msgs, gen != 0, think != 0, NULL, 0, &err);
            CHECK_EQ_INT(q, -(int64_t)(la + 1));
            n_ok += ok;
            n_cases++;
            free(want);
        }
    }
    for (int k = 0; k < n_owned; k++) free(owned[k]);
    free(line);
    fclose(f);
    dfl_vocab_free(v);
    CHECK(n_cases >= 60);
    CHECK_EQ_INT(n_ok, n_cases);
}

TEST(vocab_qwen3_special_ids) {
    dfl_vocab *v = load_qwen3(t);
    REQUIRE(v != NULL);
    CHECK_EQ_INT(dfl_vocab_n_tokens(v), 151936);
    CHECK_EQ_INT(dfl_vocab_bos(v), 151643);
    CHECK_EQ_INT(dfl_vocab_eos(v), 151645);
    CHECK_EQ_INT(dfl_vocab_eot(v), 151645); /* <|im_end|>, detected */
    CHECK_EQ_INT(dfl_vocab_pad(v), 151643);
    CHECK_EQ_INT(dfl_vocab_mask(v), -1);
    CHECK(!dfl_vocab_add_bos(v));
    CHECK(dfl_vocab_is_eog(v, 151645));
    CHECK(dfl_vocab_is_eog(v, 151643));
    CHECK(!dfl_vocab_is_eog(v, 151644));
    CHECK(!dfl_vocab_is_eog(v, 9707));
    CHECK_EQ_INT(dfl_vocab_token_type(v, 151644), DFL_TOKEN_TYPE_CONTROL);
    CHECK_EQ_INT(dfl_vocab_token_type(v, 151667), DFL_TOKEN_TYPE_USER_DEFINED); /* <think> */
    CHECK_EQ_INT(dfl_vocab_token_type(v, 151659), DFL_TOKEN_TYPE_CONTROL);      /* <|fim_prefix|>: looks special */
    CHECK_EQ_INT(dfl_vocab_token_type(v, 151700), DFL_TOKEN_TYPE_UNUSED);
    CHECK_EQ_INT(dfl_vocab_token_type(v, 151936), DFL_TOKEN_TYPE_INVALID);
    CHECK_EQ_INT(dfl_vocab_find(v, "Hello", 5), 9707);
    CHECK_EQ_INT(dfl_vocab_find(v, "<|im_start|>", 12), 151644);
    CHECK(strcmp(dfl_vocab_pre_name(v), "qwen2") == 0);
    /* add_special adds nothing for Qwen3 (no BOS, no EOS) */
    int32_t ids[8];
    CHECK_EQ_INT(dfl_tokenize(v, "Hello", 5, ids, 8, true, true), 1);
    CHECK_EQ_INT(ids[0], 9707);
    dfl_vocab_free(v);
}

/* bad input: no crash, no quadratic blow-up, defined output */
TEST(vocab_qwen3_bad_input) {
    dfl_vocab *v = load_qwen3(t);
    REQUIRE(v != NULL);
    /* 100k special tokens in a row: one token each */
    const char *sp = "<|im_start|>";
    size_t n = 100000, len = n * strlen(sp);
    char *text = malloc(len);
    for (size_t i = 0; i < n; i++) memcpy(text + i * strlen(sp), sp, strlen(sp));
    int32_t *ids = malloc((len + 8) * sizeof(int32_t));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int64_t k = dfl_tokenize(v, text, len, ids, (int64_t)len + 8, false, true);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK_EQ_INT(k, (int64_t)n);
    CHECK(ids[0] == 151644 && ids[n - 1] == 151644);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK_MSG(dt < 2.0, "100k special tokens took %.2f s", dt);
    /* the same as plain text */
    k = dfl_tokenize(v, text, len, ids, (int64_t)len + 8, false, false);
    CHECK(k > (int64_t)n);
    free(text);
    free(ids);

    /* huge single words (a letter run, a punctuation run, a digit-free space run, CJK): exact
     * round trip, and O(n log n): 4x the bytes may take ~4.5x the time, not 16x. (A 10 MB word takes
     * a few seconds; `dflash tokenize --bench -f FILE` measures it.) */
    static const char *const kinds[] = {"a", "-", " ", "\xe4\xb8\xad"};
    for (size_t kd = 0; kd < 4; kd++) {
        double secs[2];
        for (int pass = 0; pass < 2; pass++) {
            size_t unit = strlen(kinds[kd]);
            len = ((pass == 0 ? (256u << 10) : (1u << 20)) / unit) * unit;
            text = malloc(len);
            ids = malloc((len + 8) * sizeof(int32_t));
            for (size_t i = 0; i < len; i += unit) memcpy(text + i, kinds[kd], unit);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
            k = dfl_tokenize(v, text, len, ids, (int64_t)len + 8, false, true);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            secs[pass] = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
            CHECK(k > 0);
            char *back = malloc(len + 1);
            CHECK_EQ_INT(dfl_detokenize(v, ids, k, back, len + 1, true), (int64_t)len);
            CHECK(memcmp(back, text, len) == 0);
            free(back);
            free(text);
            free(ids);
        }
        CHECK_MSG(secs[1] < 8.0 * secs[0] + 0.05, "word of '%s': 256 KB in %.3f s, 1 MB in %.3f s", kinds[kd], secs[0],
                  secs[1]);
    }

    /* NUL bytes, invalid UTF-8 everywhere: each ill-formed byte is its byte token */
    const char nul[] = "a\0b\xff\xfe\xc0\x80";
    int32_t out[32];
    k = dfl_tokenize(v, nul, sizeof(nul) - 1, out, 32, false, true);
    REQUIRE(k == 7);
    CHECK_EQ_INT(out[0], dfl_vocab_find(v, "a", 1));
    CHECK_EQ_INT(out[1], dfl_vocab_find(v, "\0", 1));
    CHECK_EQ_INT(out[3], dfl_vocab_find(v, "\xff", 1));
    CHECK_EQ_INT(out[5], dfl_vocab_find(v, "\xc0", 1));
    CHECK_EQ_INT(out[6], dfl_vocab_find(v, "\x80", 1));
    dfl_vocab_free(v);
}

TEST(vocab_qwen3_cli) {
    char path[512], cmd[1400], out[8192];
    REQUIRE(gunzip_fixture(t, "qwen3-vocab.gguf", path, sizeof(path)) != NULL);
    snprintf(cmd, sizeof(cmd), "%s tokenize -m '%s' -p 'Hello world<|im_end|>' --ids", test_cli_path(), path);
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 0);
    CHECK_STR_CONTAINS(out, "[9707, 1879, 151645]");
    snprintf(cmd, sizeof(cmd), "%s tokenize -m '%s' -p 'Hello world<|im_end|>' --ids --no-special", test_cli_path(), path);
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 0);
    CHECK_STR_CONTAINS(out, "[9707, 1879, 27, 91, 318, 6213, 91, 29]");
    snprintf(cmd, sizeof(cmd), "%s tokenize -m '%s' -p 'Hi <think>' --json", test_cli_path(), path);
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 0);
    CHECK_STR_CONTAINS(out, "\"n_tokens\":3");
    CHECK_STR_CONTAINS(out, "\"id\":151667");
    CHECK_STR_CONTAINS(out, "\"piece\":\"<think>\"");
    snprintf(cmd, sizeof(cmd), "%s tokenize -m '%s' -p 'Hello'", test_cli_path(), path);
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 0);
    CHECK_STR_CONTAINS(out, "9707 -> 'Hello'");
    /* errors: a missing file, a usage error */
    snprintf(cmd, sizeof(cmd), "%s tokenize -m /nonexistent.gguf -p x", test_cli_path());
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 1);
    CHECK_STR_CONTAINS(out, "/nonexistent.gguf");
    snprintf(cmd, sizeof(cmd), "%s tokenize -p x", test_cli_path());
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 2);
}
