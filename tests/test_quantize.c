/* test_quantize.c: `dflash quantize`: re-encoding an f32 model gives, tensor for tensor, the bytes
 * of the same model written directly in that type (make-test-model quantizes the same values),
 * keeps every metadata entry, loads and generates, and bad input gets a message and an exit code. */
#include "test.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>

static int run(test_ctx *t, const char *args, char *out, size_t cap) {
    (void)t;
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s %s", test_cli_path(), args);
    return test_run(cmd, out, cap);
}

/* Every tensor of a (quantized) equals b's (written directly) tensor of that name (type, shape,
 * bytes); every key of b is in a, which also says general.file_type 7 (mostly q8_0). */
static void same_model(test_ctx *t, const char *pa, const char *pb) {
    dfl_error err = {0};
    gguf_file *a = gguf_open(pa, &err), *b = a ? gguf_open(pb, &err) : NULL;
    CHECK_MSG(a && b, "%s", err.msg);
    if (a && b) {
        CHECK_EQ_INT(gguf_n_tensors(a), gguf_n_tensors(b));
        int64_t ft = -1;
        CHECK(gguf_get_int(a, "general.file_type", &ft, &err) == DFL_OK && ft == 7);
        for (int64_t i = 0; i < gguf_n_tensors(a); i++) {
            const gguf_tensor *ta = gguf_tensor_at(a, i);
            char name[GGUF_MAX_NAME + 1];
            snprintf(name, sizeof(name), "%.*s", (int)ta->name.len, ta->name.ptr);
            const gguf_tensor *tb = gguf_find_tensor(b, name);
            CHECK_MSG(tb != NULL, "%s: no tensor %s", pb, name);
            if (tb == NULL) continue;
            CHECK_MSG(ta->type == tb->type && ta->ne[0] == tb->ne[0] && ta->ne[1] == tb->ne[1] && ta->nbytes == tb->nbytes &&
                          memcmp(ta->data, tb->data, (size_t)ta->nbytes) == 0,
                      "tensor %s: %s vs %s, or other bytes", name, quant_type_get(ta->type)->name,
                      quant_type_get(tb->type)->name);
        }
        for (int64_t i = 0; i < gguf_n_kv(b); i++) {
            const gguf_kv *kv = gguf_kv_at(b, i);
            char key[256];
            snprintf(key, sizeof(key), "%.*s", (int)kv->key.len, kv->key.ptr);
            const gguf_kv *kb = gguf_find_kv(a, key);
            CHECK_MSG(kb != NULL && kb->type == kv->type, "key %s missing or of another type", key);
            if (kb != NULL && kv->type == GGUF_TYPE_ARRAY) {
                CHECK_MSG(kb->arr_n == kv->arr_n && kb->arr_bytes == kv->arr_bytes &&
                              memcmp(kb->arr_data, kv->arr_data, (size_t)kv->arr_bytes) == 0,
                          "array %s differs", key);
            }
        }
    }
    gguf_close(a);
    gguf_close(b);
}

TEST(quantize_equals_direct_encoding) {
    char out[8192], args[1400], df[300], dq[300], tq[420], dq8[420];
    test_path(t, "f", df, sizeof(df));
    test_path(t, "q", dq, sizeof(dq));
    snprintf(args, sizeof(args), "make-test-model -o %s --type f32 --seed 9", df);
    REQUIRE(run(t, args, out, sizeof(out)) == 0);
    snprintf(args, sizeof(args), "make-test-model -o %s --type q8_0 --seed 9", dq);
    REQUIRE(run(t, args, out, sizeof(out)) == 0);
    const char *files[2] = {"target", "drafter"};
    for (int i = 0; i < 2; i++) {
        snprintf(tq, sizeof(tq), "%s/%s.gguf", df, files[i]);
        snprintf(dq8, sizeof(dq8), "%s/%s_q8.gguf", df, files[i]);
        snprintf(args, sizeof(args), "quantize %s %s q8_0", tq, dq8);
        int rc = run(t, args, out, sizeof(out));
        CHECK_MSG(rc == 0, "%s", out);
        CHECK_STR_CONTAINS(out, "as q8_0");
        snprintf(tq, sizeof(tq), "%s/%s.gguf", dq, files[i]);
        same_model(t, dq8, tq);
    }
    /* in place (OUT = IN, the input mapped while it is replaced): the same bytes as a copy */
    snprintf(args, sizeof(args), "sh -c 'cp %s/target.gguf %s/inplace.gguf'", df, df);
    REQUIRE(test_run(args, out, sizeof(out)) == 0);
    snprintf(args, sizeof(args), "quantize %s/inplace.gguf %s/inplace.gguf q8_0", df, df);
    int rc_in = run(t, args, out, sizeof(out));
    CHECK_MSG(rc_in == 0, "in place: %s", out);
    snprintf(tq, sizeof(tq), "%s/inplace.gguf", df);
    snprintf(dq8, sizeof(dq8), "%s/target.gguf", dq);
    same_model(t, tq, dq8);
    /* the quantized pair generates */
    snprintf(args, sizeof(args), "generate -m %s/target_q8.gguf -md %s/drafter_q8.gguf -p 'ab' -n 8 -t 1", df, df);
    int rc = run(t, args, out, sizeof(out));
    CHECK_MSG(rc == 0, "%s", out);
}

TEST(quantize_refuses_bad_input) {
    char out[4096], args[1200], d[400];
    test_path(t, "b", d, sizeof(d));
    snprintf(args, sizeof(args), "make-test-model -o %s --type f16", d);
    REQUIRE(run(t, args, out, sizeof(out)) == 0);
    snprintf(args, sizeof(args), "quantize %s/target.gguf %s/x.gguf q9_K", d, d);
    CHECK_EQ_INT(run(t, args, out, sizeof(out)), 2);
    CHECK_STR_CONTAINS(out, "unknown quantization type 'q9_K'");
    CHECK_STR_CONTAINS(out, "Q4_K_M");
    snprintf(args, sizeof(args), "quantize %s/missing.gguf %s/x.gguf q8_0", d, d);
    CHECK_EQ_INT(run(t, args, out, sizeof(out)), 1);
    CHECK_STR_CONTAINS(out, "missing.gguf");
    snprintf(args, sizeof(args), "quantize %s/target.gguf", d);
    CHECK_EQ_INT(run(t, args, out, sizeof(out)), 2);
    CHECK_STR_CONTAINS(out, "usage: dflash quantize");
    snprintf(args, sizeof(args), "quantize %s/target.gguf /nonexistent/dir/x.gguf q8_0", d);
    CHECK_EQ_INT(run(t, args, out, sizeof(out)), 1);
    CHECK_STR_CONTAINS(out, "/nonexistent/dir/x.gguf");
    /* a corrupt file: the reader's message */
    snprintf(args, sizeof(args), "sh -c 'head -c 100 %s/target.gguf > %s/cut.gguf'", d, d);
    (void)test_run(args, out, sizeof(out));
    snprintf(args, sizeof(args), "quantize %s/cut.gguf %s/x.gguf q8_0", d, d);
    CHECK_EQ_INT(run(t, args, out, sizeof(out)), 1);
    CHECK_STR_CONTAINS(out, "cut.gguf");
}

/* Targets and drafters alike: a pair quantized with llama-quantize's mixed presets (the drafter's
 * 64-wide rows take the 32-block fallbacks, the target's 256-wide rows the K types) generates the
 * same greedy text with and without speculative decoding. */
TEST(quantize_presets_pair_lossless) {
    char out[16384], args[2400], d[300];
    test_path(t, "p", d, sizeof(d));
    snprintf(args, sizeof(args), "make-test-model -o %s --type f16 --n-embd 256 --n-head 4 --head-dim 64 --n-ff 512 "
             "--n-layer 3 --seed 5 --std 0.15", d);
    REQUIRE(run(t, args, out, sizeof(out)) == 0);
    const char *presets[] = {"Q4_K_M", "IQ4_XS", "Q2_K", "Q5_K_S"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof(args), "quantize %s/target.gguf %s/t_%s.gguf %s", d, d, presets[i], presets[i]);
        int rc = run(t, args, out, sizeof(out));
        CHECK_MSG(rc == 0, "%s: %s", presets[i], out);
        snprintf(args, sizeof(args), "quantize %s/drafter.gguf %s/d_%s.gguf %s", d, d, presets[i], presets[i]);
        rc = run(t, args, out, sizeof(out));
        CHECK_MSG(rc == 0, "%s drafter: %s", presets[i], out);
        static char spec[16384];
        snprintf(args, sizeof(args), "generate -m %s/t_%s.gguf -md %s/d_%s.gguf -p 'the quick brown fox' -n 24 -t 1 --json 2>/dev/null",
                 d, presets[i], d, presets[i]);
        rc = run(t, args, spec, sizeof(spec));
        CHECK_MSG(rc == 0, "%s spec: %s", presets[i], spec);
        snprintf(args, sizeof(args), "generate -m %s/t_%s.gguf -p 'the quick brown fox' -n 24 -t 1 --no-spec --json 2>/dev/null",
                 d, presets[i]);
        rc = run(t, args, out, sizeof(out));
        CHECK_MSG(rc == 0, "%s plain: %s", presets[i], out);
        /* the generated token ids: "tokens":[...] */
        char *t1 = strstr(spec, "\"tokens\":["), *t2 = strstr(out, "\"tokens\":[");
        CHECK_MSG(t1 != NULL && t2 != NULL, "%s: no tokens in %.200s / %.200s", presets[i], spec, out);
        if (t1 == NULL || t2 == NULL) continue;
        char *e1 = strchr(t1, ']'), *e2 = strchr(t2, ']');
        if (e1) e1[1] = '\0';
        if (e2) e2[1] = '\0';
        memmove(spec, t1, strlen(t1) + 1);
        memmove(out, t2, strlen(t2) + 1);
        CHECK_MSG(strcmp(spec, out) == 0, "%s: speculative \"%s\" vs plain \"%s\"", presets[i], spec, out);
    }
}
