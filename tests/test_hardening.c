/* test_hardening.c: bad inputs get a clear error, the right exit code and lose nothing (issue 12,
 * one test per row of its table): special files as models, hostile paths, a full disk, option
 * values, vocabularies the loader must refuse, non-finite logits, the context reserve. CLI runs are
 * wrapped in `timeout` so a regression (a hang) fails instead of blocking the suite. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_util.h"
#include "dflash.h"
#include "base/error.h"
#include "gguf/gguf.h"
#include "model/context.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TO "timeout 90 " /* every CLI run: a hang fails the test (exit 124); generous, since node-llama-cpp
                           * loading on a loaded 2-core machine took over 20 s */

/* ---- a GGUF copy with edits ----------------------------------------------------------------- */

typedef struct gguf_edit {
    const char *drop_key;   /* leave this key out */
    const char *fill_tensor; /* fill this f32 tensor with fill */
    float fill;
    const char *cut_tensor; /* keep only the first cut_rows rows of this 2-D tensor */
    int64_t cut_rows;
    void (*keys)(gguf_writer *w, const gguf_file *src); /* set or replace keys */
} gguf_edit;

static char *str_z(gguf_str s) {
    char *c = malloc((size_t)s.len + 1);
    memcpy(c, s.ptr, (size_t)s.len);
    c[s.len] = '\0';
    return c;
}

static bool copy_kv(gguf_writer *w, const gguf_kv *kv) {
    char *key = str_z(kv->key);
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32:
        gguf_writer_set_u32(w, key, (uint32_t)kv->val.u64); break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32:
        gguf_writer_set_i32(w, key, (int32_t)kv->val.i64); break;
    case GGUF_TYPE_UINT64: gguf_writer_set_u64(w, key, kv->val.u64); break;
    case GGUF_TYPE_INT64: gguf_writer_set_i64(w, key, kv->val.i64); break;
    case GGUF_TYPE_FLOAT32: gguf_writer_set_f32(w, key, (float)kv->val.f64); break;
    case GGUF_TYPE_FLOAT64: gguf_writer_set_f64(w, key, kv->val.f64); break;
    case GGUF_TYPE_BOOL: gguf_writer_set_bool(w, key, kv->val.u64 != 0); break;
    case GGUF_TYPE_STRING: {
        char *v = str_z(kv->val.str);
        gguf_writer_set_str(w, key, v);
        free(v);
        break;
    }
    case GGUF_TYPE_ARRAY:
        gguf_writer_set_arr_raw(w, key, kv->arr_type, kv->arr_n, kv->arr_data, (size_t)kv->arr_bytes);
        break;
    default: free(key); return false;
    }
    free(key);
    return true;
}

static bool gguf_copy_edit(const char *src, const char *dst, const gguf_edit *e) {
    dfl_error err = {0};
    gguf_file *f = gguf_open(src, &err);
    if (f == NULL) return false;
    gguf_writer *w = gguf_writer_new();
    bool ok = true;
    for (int64_t i = 0; i < gguf_n_kv(f) && ok; i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (e->drop_key != NULL && gguf_str_eq(kv->key, e->drop_key)) continue;
        ok = copy_kv(w, kv);
    }
    if (e->keys != NULL) e->keys(w, f);
    float *fill = NULL;
    for (int64_t i = 0; i < gguf_n_tensors(f) && ok; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char *name = str_z(t->name);
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        const void *data = t->data;
        size_t nbytes = (size_t)t->nbytes;
        if (e->fill_tensor != NULL && strcmp(name, e->fill_tensor) == 0) {
            fill = malloc(nbytes);
            for (size_t k = 0; k < nbytes / sizeof(float); k++) fill[k] = e->fill;
            data = fill;
        }
        if (e->cut_tensor != NULL && strcmp(name, e->cut_tensor) == 0) {
            nbytes = nbytes / (size_t)ne[1] * (size_t)e->cut_rows;
            ne[1] = e->cut_rows;
        }
        ok = gguf_writer_add_tensor(w, name, t->type, t->n_dims, ne, data, nbytes, &err) == DFL_OK;
        free(name);
    }
    ok = ok && gguf_writer_write(w, dst, &err) == DFL_OK;
    free(fill);
    gguf_writer_free(w);
    gguf_close(f);
    return ok;
}

/* Runs `PRE timeout 20 env ENV CLI ARGS` (the CLI path made absolute, so PRE may cd). */
static int run_cli_env(const char *pre, const char *env, const char *args, char *out, size_t cap) {
    char cli[4096], cmd[16384];
    if (realpath(test_cli_path(), cli) == NULL) snprintf(cli, sizeof(cli), "%s", test_cli_path());
    snprintf(cmd, sizeof(cmd), "%s " TO "env %s %s %s", pre ? pre : "", env ? env : "", cli, args);
    return test_run(cmd, out, cap);
}

static int run_cli(const char *env, const char *args, char *out, size_t cap) {
    return run_cli_env(NULL, env, args, out, cap);
}

static bool file_equal(const char *a, const char *b) {
    char cmd[2048], out[256];
    snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
    return test_run(cmd, out, sizeof(out)) == 0;
}

/* ---- row 1: bench with --pp below --verify --------------------------------------------------- */

/* The verify row reads --verify random tokens: with --pp 8 < --verify 16 it read past the pp
 * array (a heap overflow under ASan). */
TEST(hardening_bench_pp_below_verify) {
    char tgt[512], dft[512], args[2048], out[16384];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    snprintf(args, sizeof(args), "bench -m %s -md %s -r 1 --pp 8 --tg 8 --spec-n 8 -t 1 -tb 1", tgt, dft);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s", out);
    CHECK_STR_CONTAINS(out, "| verify16 |");
    CHECK_STR_CONTAINS(out, "| pp8 |");
}

/* ---- rows 2, 3: special files as models ------------------------------------------------------- */

TEST(hardening_special_files_refused_at_once) {
    char tgt[512], dft[512], fifo[512], args[2048], out[8192];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    test_path(t, "fifo", fifo, sizeof(fifo));
    REQUIRE(mkfifo(fifo, 0600) == 0);
    /* a FIFO blocked in open (waiting for a writer); /dev/zero was read forever by page warming */
    const char *specials[] = {fifo, "/dev/zero"};
    for (int k = 0; k < 2; k++) {
        const char *sp = specials[k];
        const char *want = k == 0 ? "not a regular file (a FIFO)" : "not a regular file (a character device)";
        const char *cmds[] = {"gguf %1$s", "generate -m %1$s -p hi -n 2", "generate -m %2$s -md %1$s -p hi -n 2",
                              "tokenize -m %1$s -p hi", "quantize %1$s %3$s/out.gguf q8_0", "bench -m %1$s -r 1",
                              "bench -m %2$s -md %1$s -r 1"};
        for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
            char fmt_args[1024];
            snprintf(fmt_args, sizeof(fmt_args), cmds[c], sp, tgt, t->tmpdir);
            snprintf(args, sizeof(args), "%s", fmt_args);
            const int rc = run_cli(NULL, args, out, sizeof(out));
            CHECK_MSG(rc == 1, "%s: rc %d (124 = hung): %s", args, rc, out);
            CHECK_STR_CONTAINS(out, want);
        }
    }
}

/* ---- rows 4, 5: bench --llama ---------------------------------------------------------------- */


/* The model path reaches node as one argument (no shell), from any folder; a failed comparison
 * fails the run. */
TEST(hardening_bench_llama_argv_any_folder) {
    char tgt[512], dft[512], hostile[1024], pwned[512], prefix[1024], args[2048], out[16384];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    /* the peer's own failure (node missing) is an error: exit 1 with the reason */
    snprintf(args, sizeof(args), "bench -m %s -r 1 --pp 8 --tg 4 -t 1 -tb 1 --llama", tgt);
    snprintf(prefix, sizeof(prefix), "cd %s &&", t->tmpdir);
    int rc = run_cli_env(prefix, "PATH=/nonexistent", args, out, sizeof(out));
    CHECK_MSG(rc == 1, "no node: rc %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "cannot run node");
    if (!tu_have_node_package(t, "node-llama-cpp")) return;
    snprintf(hostile, sizeof(hostile), "%s/x';touch pwned;'.gguf", t->tmpdir);
    char cp[2048];
    snprintf(cp, sizeof(cp), "cp %s \"%s\"", tgt, hostile);
    REQUIRE(test_run(cp, out, sizeof(out)) == 0);
    /* from the test's temp folder (not the repo root): the peer script is found from the binary */
    snprintf(prefix, sizeof(prefix), "cd %s &&", t->tmpdir);
    snprintf(args, sizeof(args), "bench -m \"x';touch pwned;'.gguf\" -r 1 --pp 8 --tg 4 -t 1 -tb 1 --llama");
    rc = run_cli_env(prefix, NULL, args, out, sizeof(out));
    test_path(t, "pwned", pwned, sizeof(pwned));
    CHECK_MSG(access(pwned, F_OK) != 0, "the model path was run by a shell: %s", out);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "| llama.cpp tg |");
    /* the comparison fails (a node that exits 3): the run fails, with node's output */
    char bin[512], fake[2048];
    test_path(t, "bin", bin, sizeof(bin));
    snprintf(fake, sizeof(fake), "mkdir -p %s && printf '#!/bin/sh\\necho peer-broke\\nexit 3\\n' > %s/node && chmod +x %s/node",
             bin, bin, bin);
    REQUIRE(test_run(fake, out, sizeof(out)) == 0);
    snprintf(fake, sizeof(fake), "PATH=%s:/usr/bin:/bin", bin);
    snprintf(args, sizeof(args), "bench -m %s -r 1 --pp 8 --tg 4 -t 1 -tb 1 --llama", tgt);
    rc = run_cli_env(NULL, fake, args, out, sizeof(out));
    CHECK_MSG(rc == 1, "rc %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "exit 3");
    CHECK_STR_CONTAINS(out, "peer-broke");
}

/* ---- row 6: output that cannot be written ---------------------------------------------------- */

TEST(hardening_full_disk_is_an_error) {
    if (access("/dev/full", W_OK) != 0) {
        test_skip(t, "no /dev/full");
        return;
    }
    char tgt[512], dft[512], args[2048], out[8192];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    const char *cmds[] = {"generate -m %1$s -p hi -n 4", "generate -m %1$s -p hi -n 4 --json",
                          "generate -m %1$s -md %2$s -p hi -n 4", "gguf %1$s", "gguf %1$s --json",
                          "tokenize -m %1$s -p hello", "tokenize -m %1$s -p hello --json"};
    for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
        char a[1024];
        snprintf(a, sizeof(a), cmds[c], tgt, dft);
        snprintf(args, sizeof(args), "%s > /dev/full )", a); /* stderr stays on the pipe */
        const int rc = run_cli_env("(", NULL, args, out, sizeof(out));
        CHECK_MSG(rc == 1, "%s: rc %d: %s", a, rc, out);
        CHECK_STR_CONTAINS(out, "cannot write output: No space left on device");
    }
}

/* ---- row 7: writers replace the file, never write into it ------------------------------------ */

/* A hard link to the old output keeps the old bytes: quantize and make-test-model write a new
 * file and rename it over the path (a process that maps the old file keeps a valid mapping). */
TEST(hardening_writers_replace_never_overwrite) {
    char tgt[512], dft[512], keep[512], link[512], args[2048], out[8192], cmd[4096];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    test_path(t, "keep.gguf", keep, sizeof(keep));
    test_path(t, "link.gguf", link, sizeof(link));
    snprintf(cmd, sizeof(cmd), "cp %s %s && ln %s %s", tgt, keep, tgt, link);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    snprintf(args, sizeof(args), "quantize %s %s q8_0", tgt, tgt); /* in place: IN == OUT */
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s", out);
    CHECK_MSG(file_equal(link, keep), "quantize wrote into the old file");
    CHECK(!file_equal(tgt, keep));
    /* make-test-model over an existing file: its other name keeps the old bytes */
    snprintf(cmd, sizeof(cmd), "rm -f %s && cp %s %s && ln -f %s %s", link, dft, keep, dft, link);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    snprintf(args, sizeof(args), "make-test-model --drafter %s --seed 7", dft);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s", out);
    CHECK_MSG(file_equal(link, keep), "make-test-model wrote into the old file");
    CHECK(!file_equal(dft, keep));
}

/* ---- row 8: text that NFC lengthens ---------------------------------------------------------- */

TEST(hardening_tokenize_text_nfc_lengthens) {
    char tgt[512], dft[512], args[4096], out[65536];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    char text[512] = "";
    for (int i = 0; i < 100; i++) strcat(text, "\xcd\x84"); /* U+0344 -> U+0308 U+0301 under NFC */
    dfl_error err = {0};
    dfl_vocab *v = dfl_vocab_load(tgt, &err);
    REQUIRE(v != NULL);
    int32_t ids[4096];
    const int64_t n = dfl_tokenize(v, text, strlen(text), ids, 4096, false, true);
    dfl_vocab_free(v);
    REQUIRE(n > (int64_t)strlen(text) + 8); /* more tokens than bytes + 8: the old buffer size */
    char want[65536];
    size_t len = (size_t)snprintf(want, sizeof(want), "[");
    for (int64_t i = 0; i < n; i++) len += (size_t)snprintf(want + len, sizeof(want) - len, "%s%d", i ? ", " : "", ids[i]);
    snprintf(want + len, sizeof(want) - len, "]");
    snprintf(args, sizeof(args), "tokenize -m %s --ids -p '%s'", tgt, text);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s", out);
    CHECK_STR_CONTAINS(out, want);
    /* generate tokenizes the same way (prompt_tokens of --json) */
    snprintf(args, sizeof(args), "generate -m %s -c 1024 -n 1 --json -p '%s'", tgt, text);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s", out);
    char key[64];
    snprintf(key, sizeof(key), "\"n_prompt\":%lld", (long long)n);
    CHECK_STR_CONTAINS(out, key);
}

/* ---- row 9 (the speculative path's repetition penalty) is covered with the engine API (issue 13) */

/* ---- row 10: DFLASH_FEATURES ---------------------------------------------------------------- */

TEST(hardening_features_env_checked) {
    char tgt[512], dft[512], args[2048], out[8192];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    snprintf(args, sizeof(args), "generate -m %s -md %s -p hi -n 2 --features bad", tgt, dft);
    CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 2);
    CHECK_STR_CONTAINS(out, "invalid value 'bad' for --features (host or device)");
    snprintf(args, sizeof(args), "generate -m %s -md %s -p hi -n 2", tgt, dft);
    CHECK_EQ_INT(run_cli("DFLASH_FEATURES=bad", args, out, sizeof(out)), 2);
    CHECK_STR_CONTAINS(out, "invalid value 'bad' for DFLASH_FEATURES (host or device)");
    snprintf(args, sizeof(args), "bench -m %s -md %s -r 1", tgt, dft);
    CHECK_EQ_INT(run_cli("DFLASH_FEATURES=bad", args, out, sizeof(out)), 2);
    CHECK_STR_CONTAINS(out, "DFLASH_FEATURES");
    snprintf(args, sizeof(args), "generate -m %s -md %s -p hi -n 2 --json", tgt, dft);
    CHECK_EQ_INT(run_cli("DFLASH_FEATURES=host", args, out, sizeof(out)), 0);
    CHECK_STR_CONTAINS(out, "\"feature_path\":\"host\"");
}

/* ---- rows 11, 12: vocabularies the loader refuses -------------------------------------------- */

static void keys_bos_out_of_range(gguf_writer *w, const gguf_file *f) {
    (void)f;
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 5000);
}
static void keys_types_short(gguf_writer *w, const gguf_file *f) {
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.token_type");
    gguf_writer_set_arr_raw(w, "tokenizer.ggml.token_type", kv->arr_type, kv->arr_n - 1, kv->arr_data,
                            (size_t)(kv->arr_bytes / kv->arr_n * (kv->arr_n - 1)));
}
static void keys_bad_utf8_token(gguf_writer *w, const gguf_file *f) {
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const size_t n = (size_t)kv->arr_n;
    char **s = malloc(n * sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        gguf_str g;
        gguf_arr_str(kv, i, &g);
        s[i] = str_z(g);
    }
    free(s[0]); /* a normal token: byte-level text, which invalid UTF-8 cannot be */
    s[0] = strdup("bad\xff\xfe");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)s, NULL, n);
    for (size_t i = 0; i < n; i++) free(s[i]);
    free(s);
}

/* `gguf` runs the checks `generate` runs when it loads (vocabulary included) and says why. */
TEST(hardening_gguf_checks_like_loading) {
    char tgt[512], dft[512], bad[512], args[2048], out[65536], gen[8192];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    const struct { const char *what; gguf_edit e; const char *want; } cases[] = {
        {"merges missing", {.drop_key = "tokenizer.ggml.merges"}, "tokenizer.ggml.merges"},
        {"bos out of range", {.keys = keys_bos_out_of_range}, "5000"},
        {"token_type short", {.keys = keys_types_short}, "token_type"},
        {"invalid UTF-8 token", {.keys = keys_bad_utf8_token}, "is not byte-level text"},
        {"embedding rows", {.cut_tensor = "token_embd.weight", .cut_rows = 512},
         "the vocabulary has 1024 tokens but token_embd.weight has 512 rows"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        test_path(t, "bad.gguf", bad, sizeof(bad));
        REQUIRE(gguf_copy_edit(tgt, bad, &cases[c].e));
        snprintf(args, sizeof(args), "generate -m %s -p hi -n 2", bad);
        const int grc = run_cli(NULL, args, gen, sizeof(gen));
        CHECK_MSG(grc == 1, "%s: generate rc %d: %s", cases[c].what, grc, gen);
        snprintf(args, sizeof(args), "gguf %s", bad);
        const int rc = run_cli(NULL, args, out, sizeof(out));
        CHECK_MSG(rc == 1, "%s: gguf rc %d", cases[c].what, rc);
        CHECK_MSG(strstr(out, "model: ok") == NULL, "%s: gguf says ok", cases[c].what);
        CHECK_MSG(strstr(out, cases[c].want) != NULL && strstr(gen, cases[c].want) != NULL,
                  "%s: '%s' not in gguf's / generate's message: %s", cases[c].what, cases[c].want, gen);
        snprintf(args, sizeof(args), "gguf %s --json", bad);
        CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 1);
        CHECK_STR_CONTAINS(out, "\"model_ok\":false");
    }
    snprintf(args, sizeof(args), "gguf %s", tgt);
    CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 0);
    CHECK_STR_CONTAINS(out, "model: ok");
    snprintf(args, sizeof(args), "gguf %s", dft); /* a drafter uses its target's vocabulary */
    CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 0);
}

/* dfl_model_load refuses a target whose embedding has fewer rows than the vocabulary has tokens
 * (the ids past the rows were rejected only at generation). */
TEST(hardening_model_load_vocab_rows) {
    char tgt[512], dft[512], bad[512];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    test_path(t, "bad.gguf", bad, sizeof(bad));
    gguf_edit e = {.cut_tensor = "token_embd.weight", .cut_rows = 512};
    REQUIRE(gguf_copy_edit(tgt, bad, &e));
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(bad, NULL, &err);
    CHECK(m == NULL);
    CHECK_EQ_INT(err.code, DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(err.msg, "the vocabulary has 1024 tokens but token_embd.weight has 512 rows");
    dfl_model_free(m);
}

/* ---- row 13: non-finite logits ---------------------------------------------------------------- */

/* A copy of tgt at bad with output_norm.weight filled with v, loaded, and a 64-position context
 * on it (NULL after a failed check); *m gets the model. */
static dfl_context *open_filled_target(test_ctx *t, const char *tgt, const char *bad, float v, dfl_model **m) {
    gguf_edit e = {.fill_tensor = "output_norm.weight", .fill = v};
    dfl_error err = {0};
    CHECK(gguf_copy_edit(tgt, bad, &e));
    *m = dfl_model_load(bad, NULL, &err);
    CHECK_MSG(*m != NULL, "%s", err.msg);
    if (*m == NULL) return NULL;
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = cp.n_threads_batch = 1;
    dfl_context *ctx = dfl_context_new(*m, &cp, &err);
    CHECK_MSG(ctx != NULL, "%s", err.msg);
    return ctx;
}

TEST(hardening_nonfinite_logits_are_an_error) {
    char tgt[512], dft[512], bad[512], args[2048], out[8192];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    const struct { const char *tensor; float v; } cases[] = {
        {"output_norm.weight", NAN}, {"blk.0.attn_q_norm.weight", INFINITY}, {"output_norm.weight", INFINITY}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        test_path(t, "bad.gguf", bad, sizeof(bad));
        gguf_edit e = {.fill_tensor = cases[c].tensor, .fill = cases[c].v};
        REQUIRE(gguf_copy_edit(tgt, bad, &e));
        const char *modes[] = {"--no-spec", "", "--temp 0.8 --seed 3", "--no-spec --temp 0.8"};
        char first[128] = "";
        for (int m = 0; m < 4; m++) {
            snprintf(args, sizeof(args), "generate -m %s -md %s -p 'hello world' -n 8 %s", bad, dft, modes[m]);
            const int rc = run_cli(NULL, args, out, sizeof(out));
            CHECK_MSG(rc == 1, "%s = %g, '%s': rc %d: %s", cases[c].tensor, (double)cases[c].v, modes[m], rc, out);
            const char *p = strstr(out, "non-finite logits at position ");
            CHECK_MSG(p != NULL, "'%s': %s", modes[m], out);
            if (p == NULL) continue;
            /* the same error (position, sequence) on the plain and the speculative path (the
             * batch entry differs: a verify batch is laid out otherwise than a prompt) */
            char line[128];
            snprintf(line, sizeof(line), "%.*s", (int)strcspn(p, "("), p);
            if (m == 0) snprintf(first, sizeof(first), "%s", line);
            else CHECK_MSG(strcmp(line, first) == 0, "'%s': '%s' vs --no-spec '%s'", modes[m], line, first);
        }
        snprintf(args, sizeof(args), "bench -m %s -r 1 --pp 8 --tg 4", bad);
        CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 1);
        CHECK_STR_CONTAINS(out, "non-finite logits");
    }
    /* the library: the error names the position, and nothing of the batch is applied */
    dfl_error err = {0};
    dfl_model *m = NULL;
    dfl_context *ctx = open_filled_target(t, tgt, bad, NAN, &m);
    REQUIRE(ctx != NULL);
    const int32_t toks[3] = {10, 11, 12};
    CHECK_EQ_INT(tu_decode(ctx, 0, toks, 2, NULL, &err), DFL_OK); /* no logits asked: nothing checked */
    CHECK_EQ_INT(dfl_seq_len(ctx, 0), 2);
    float *lg = malloc(sizeof(float) * 1024);
    CHECK_EQ_INT(tu_decode(ctx, 0, toks + 2, 1, lg, &err), DFL_ERR_FORMAT);
    CHECK_STR_CONTAINS(err.msg, "non-finite logits at position 2 of sequence 0");
    CHECK_STR_CONTAINS(err.msg, "the logit of token 0 is "); /* all NaN: the first one */
    CHECK_EQ_INT(dfl_seq_len(ctx, 0), 2);
    free(lg);
    dfl_context_free(ctx);
    dfl_model_free(m);
}

/* Greedy decoding without penalties brings back argmax ids, no logits: the ARGMAX op flags a
 * non-finite row, so a NaN/Inf is still an error (the same message, the batch rolled back); a
 * drafter whose logits are not finite gets its drafts cut (the output stays the target's) and the
 * run warns. */
TEST(hardening_nonfinite_argmax_only) {
    char tgt[512], dft[512], bad[512], args[2048], out[8192];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    test_path(t, "bad.gguf", bad, sizeof(bad));
    dfl_error err = {0};
    dfl_model *m = NULL;
    dfl_context *ctx = open_filled_target(t, tgt, bad, INFINITY, &m);
    REQUIRE(ctx != NULL);
    const int32_t toks[4] = {10, 11, 12, 13};
    CHECK_EQ_INT(tu_decode(ctx, 0, toks, 2, NULL, &err), DFL_OK);
    context_set_argmax_only(ctx, true);
    dfl_batch *b = dfl_batch_init(2, 0, 1, &err);
    REQUIRE(b != NULL);
    for (int32_t i = 2; i < 4; i++) dfl_batch_add_token(b, toks[i], &i, 0, i == 3);
    CHECK_EQ_INT(dfl_decode(ctx, b, &err), DFL_ERR_FORMAT);
    dfl_batch_free(b);
    CHECK_STR_CONTAINS(err.msg, "non-finite logits at position 3 of sequence 0");
    CHECK_STR_CONTAINS(err.msg, "is not finite");
    CHECK_EQ_INT(dfl_seq_len(ctx, 0), 2);
    dfl_context_free(ctx);
    dfl_model_free(m);
    /* a broken drafter: its drafts are not verified (the output stays the target's own) and the
     * run says so; the count of such slots is in the stats */
    gguf_edit e = {.fill_tensor = "output_norm.weight", .fill = NAN};
    REQUIRE(gguf_copy_edit(dft, bad, &e));
    char ref[8192];
    snprintf(args, sizeof(args), "generate -m %s -p 'hello world' -n 8 --no-spec --json", tgt);
    REQUIRE(run_cli(NULL, args, ref, sizeof(ref)) == 0);
    const char *rt = strstr(ref, "\"tokens\":");
    REQUIRE(rt != NULL);
    snprintf(args, sizeof(args), "generate -m %s -md %s -p 'hello world' -n 8 --json", tgt, bad);
    CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 0);
    CHECK_STR_CONTAINS(out, "warning: the drafter's logits were not finite at ");
    CHECK_STR_CONTAINS(out, "\"n_accepted\":0");
    const char *ot = strstr(out, "\"tokens\":");
    CHECK(ot != NULL && strncmp(ot, rt, strcspn(rt, "]")) == 0);
}

/* ---- row 14: the context reserve -------------------------------------------------------------- */

/* The message states the verification block kept free and the smallest -c; that -c works and
 * one less does not (greedy, sampled; the embedded pair when present, where drafts get accepted). */
static void check_min_ctx(test_ctx *t, const char *models, const char *opts) {
    char args[2048], out[16384];
    snprintf(args, sizeof(args), "generate %s -p 'And the LORD spake unto Moses' -n 40 -c 16 -t 1 -tb 1 %s", models, opts);
    REQUIRE(run_cli(NULL, args, out, sizeof(out)) == 1);
    CHECK_STR_CONTAINS(out, "kept free for a verification block (draft length 15 + 1)");
    const char *p = strstr(out, "use -c ");
    REQUIRE(p != NULL);
    const long min_c = strtol(p + 7, NULL, 10);
    snprintf(args, sizeof(args), "generate %s -p 'And the LORD spake unto Moses' -n 40 -c %ld -t 1 -tb 1 %s", models,
             min_c, opts);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "-c %ld (%s): %s", min_c, opts, out);
    snprintf(args, sizeof(args), "generate %s -p 'And the LORD spake unto Moses' -n 40 -c %ld -t 1 -tb 1 %s", models,
             min_c - 1, opts);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 1, "-c %ld: %s", min_c - 1, out);
    CHECK_STR_CONTAINS(out, "use -c ");
}

TEST(hardening_context_reserve_stated) {
    char tgt[512], dft[512], models[1200];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    snprintf(models, sizeof(models), "-m %s -md %s", tgt, dft);
    check_min_ctx(t, models, "--draft-min 0");
    check_min_ctx(t, models, "--temp 0.9 --seed 5");
    if (access("models/target.gguf", R_OK) == 0 && access("models/drafter.gguf", R_OK) == 0) {
        check_min_ctx(t, "", "");
        check_min_ctx(t, "", "--draft-min 0");
    }
}

/* ---- row 15: options without their value ---------------------------------------------------- */

TEST(hardening_option_needs_value) {
    char args[512], out[8192];
    const struct { const char *cmd; const char *opts; } table[] = {
        {"generate", "-m -md -p -f -n -c -b -t -tb --temp --top-k --top-p --min-p --repeat-penalty --seed -s --draft-max "
                     "--draft-min --draft-p-min --features --feature-wait --feature-buffer-max --device -np"},
        {"bench", "-r --pp --tg --verify --spec-n -m -md -p -n -c -b -t --temp --seed --draft-max --features --device"},
        {"tokenize", "-m -p -f --reps"},
        {"make-test-model", "-o --target --drafter --arch --n-embd --n-layer --n-head --n-head-kv --head-dim --n-ff --n-vocab "
                            "--n-ctx-train --draft-layers --block-size --target-layers --type --seed --std"},
    };
    for (size_t c = 0; c < sizeof(table) / sizeof(table[0]); c++) {
        char list[1024];
        snprintf(list, sizeof(list), "%s", table[c].opts);
        for (char *opt = strtok(list, " "); opt != NULL; opt = strtok(NULL, " ")) {
            snprintf(args, sizeof(args), "%s %s", table[c].cmd, opt);
            const int rc = run_cli(NULL, args, out, sizeof(out));
            char want[128];
            snprintf(want, sizeof(want), "option %s needs a value", opt);
            CHECK_MSG(rc == 2 && strstr(out, want) != NULL, "%s: rc %d: %s", args, rc, out);
        }
    }
}

/* ---- row 16: option limits ------------------------------------------------------------------ */

TEST(hardening_option_limits_stated) {
    char tgt[512], dft[512], args[2048], out[8192];
    if (!tu_make_models(t, "m", "", tgt, dft, sizeof(tgt))) return;
    /* a subnormal temperature is a (greedy) temperature; the full u64 seed range */
    const char *ok_opts[] = {"--temp 1e-45", "--seed 18446744073709551615", "--top-p 1e-40", "--min-p 0"};
    for (size_t i = 0; i < sizeof(ok_opts) / sizeof(ok_opts[0]); i++) {
        snprintf(args, sizeof(args), "generate -m %s -p hi -n 2 %s", tgt, ok_opts[i]);
        CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s: %s", ok_opts[i], out);
    }
    const struct { const char *opt; const char *want; } bad[] = {
        {"--seed -1", "0..18446744073709551615"},
        {"--seed 18446744073709551616", "0..18446744073709551615"},
        {"--top-k 2000000000", "0..1073741824"},
        {"--temp 1e39", "0..100"},
        {"--temp nan", "0..100"},
        {"-n -1", "0..16777216"},
        {"--feature-buffer-max -1", "0..9223372036854775807"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(args, sizeof(args), "generate -m %s -p hi %s", tgt, bad[i].opt);
        CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 2, "%s: %s", bad[i].opt, out);
        CHECK_STR_CONTAINS(out, bad[i].want);
    }
}

/* ---- row 17: long paths ---------------------------------------------------------------------- */

TEST(hardening_path_too_long) {
    char *dir = malloc(5002), *args = malloc(12000), out[8192];
    dir[0] = '/';
    memset(dir + 1, 'a', 4999);
    dir[5000] = '\0';
    snprintf(args, 12000, "generate -p hi -n 2");
    char env[5100];
    snprintf(env, sizeof(env), "DFLASH_MODEL_DIR=%s", dir);
    int rc = run_cli(env, args, out, sizeof(out));
    CHECK_MSG(rc == 1, "rc %d", rc);
    CHECK_STR_CONTAINS(out, "path too long");
    CHECK_MSG(strlen(out) < 400, "%zu bytes of message", strlen(out));
    const char *cmds[] = {"generate -m %s -p hi", "gguf %s", "tokenize -m %s -p hi", "make-test-model -o %s"};
    for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
        snprintf(args, 12000, cmds[c], dir);
        rc = run_cli(NULL, args, out, sizeof(out));
        CHECK_MSG(rc == 1, "%.40s: rc %d", cmds[c], rc);
        CHECK_STR_CONTAINS(out, "too long");
    }
    /* a message longer than dfl_error's buffer ends in "..." (never cut silently) */
    dfl_error err = {0};
    error_set(&err, DFL_ERR_IO, "%s: cannot open", dir);
    CHECK_EQ_INT(strlen(err.msg), sizeof(err.msg) - 1);
    CHECK(strcmp(err.msg + sizeof(err.msg) - 4, "...") == 0);
    dfl_model *m = dfl_model_load(dir, NULL, &err);
    CHECK(m == NULL);
    free(dir);
    free(args);
}

/* ---- also: generate -f FILE ------------------------------------------------------------------ */

/* The prompt from a file: bytes as they are (invalid UTF-8 included), 1 MB prompts (tokenized
 * whole: generate's n_prompt equals the library's count). */
TEST(hardening_generate_prompt_file) {
    char tgt[512], args[2048], out[16384], path[512];
    if (!tu_make_models(t, "m", "--n-layer 1 --n-head 1 --n-head-kv 1 --head-dim 8 --n-embd 16 --n-ff 32", tgt, NULL,
                        sizeof(tgt))) {
        return;
    }
    const size_t n_big = 1 << 20;
    char *big = malloc(n_big);
    for (size_t i = 0; i < n_big; i++) big[i] = (char)(i % 97 == 96 ? '\n' : "the quick brown fox "[i % 20]);
    for (size_t i = 1000; i < 1100; i++) big[i] = (char)(0x80 + i % 0x7f); /* not UTF-8, no NUL */
    test_path(t, "prompt.txt", path, sizeof(path));
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL);
    REQUIRE(fwrite(big, 1, n_big, f) == n_big);
    fclose(f);
    dfl_error err = {0};
    dfl_vocab *v = dfl_vocab_load(tgt, &err);
    REQUIRE(v != NULL);
    const int64_t n = -dfl_tokenize(v, big, n_big, NULL, 0, true, false);
    dfl_vocab_free(v);
    REQUIRE(n > 0);
    char json[512];
    test_path(t, "out.json", json, sizeof(json));
    snprintf(args, sizeof(args), "generate -m %s -f %s -n 0 -b 16 -c %lld --json > %s", tgt, path, (long long)n + 16, json);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s", out);
    char tail_cmd[600], key[64];
    snprintf(tail_cmd, sizeof(tail_cmd), "tail -c 300 %s", json);
    REQUIRE(test_run(tail_cmd, out, sizeof(out)) == 0);
    snprintf(key, sizeof(key), "\"n_prompt\":%lld", (long long)n);
    CHECK_STR_CONTAINS(out, key);
    /* and it generates from a small binary prompt */
    f = fopen(path, "wb");
    REQUIRE(f != NULL);
    fwrite(big + 990, 1, 200, f);
    fclose(f);
    snprintf(args, sizeof(args), "generate -m %s -f %s -n 4 --json", tgt, path);
    CHECK_MSG(run_cli(NULL, args, out, sizeof(out)) == 0, "%s", out);
    CHECK_STR_CONTAINS(out, "\"n_gen\":4");
    snprintf(args, sizeof(args), "generate -m %s -f %s -p hi", tgt, path);
    CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 2);
    snprintf(args, sizeof(args), "generate -m %s -f %s/missing.txt", tgt, t->tmpdir);
    CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 1);
    CHECK_STR_CONTAINS(out, "cannot open");
    free(big);
}

/* ---- DFlash2 (docs/drafter.md "DFlash2"): non-finite drafter logits ------------------------------ */

/* A DFlash2 drafter whose logits are not finite (a NaN in its final norm, an Inf in a conv base)
 * flags the slot like a DFlash drafter's argmax: its drafts are not verified, the run warns, and
 * the output is the target's own (greedy, and with the walk's p_min); sampling runs too. */
TEST(hardening_dflash2_nonfinite_drafter) {
    char tgt[512], dft[512], bad[512], args[2048], out[8192], ref[8192];
    if (!tu_make_models(t, "m", "--block-size 8 --dflash2 3,8,16,4", tgt, dft, sizeof(tgt))) return;
    test_path(t, "bad.gguf", bad, sizeof(bad));
    snprintf(args, sizeof(args), "generate -m %s -p 'hello world' -n 8 --no-spec --json", tgt);
    REQUIRE(run_cli(NULL, args, ref, sizeof(ref)) == 0);
    const char *rt = strstr(ref, "\"tokens\":");
    REQUIRE(rt != NULL);
    const struct { const char *tensor; float v; } cases[] = {{"output_norm.weight", NAN}, {"blk.0.attn_conv_base", INFINITY}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        gguf_edit e = {.fill_tensor = cases[c].tensor, .fill = cases[c].v};
        REQUIRE(gguf_copy_edit(dft, bad, &e));
        /* the last: a reduced draft vocabulary (the selector's flags through its ids) */
        const char *modes[] = {"", "--draft-p-min 0.5", "--draft-vocab 64", "--temp 0.8 --seed 3"};
        for (int k = 0; k < 4; k++) {
            snprintf(args, sizeof(args), "generate -m %s -md %s -p 'hello world' -n 8 --json %s", tgt, bad, modes[k]);
            CHECK_EQ_INT(run_cli(NULL, args, out, sizeof(out)), 0);
            CHECK_STR_CONTAINS(out, "warning: the drafter's logits were not finite at ");
            CHECK_STR_CONTAINS(out, "\"n_accepted\":0");
            const char *ot = strstr(out, "\"tokens\":");
            if (k < 3) CHECK(ot != NULL && strncmp(ot, rt, strcspn(rt, "]")) == 0);
        }
    }
}
