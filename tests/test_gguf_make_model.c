/* test_gguf_make_model.c: `dflash make-test-model`: the files it writes are deterministic per
 * seed, have the shapes and keys of docs/target.md and docs/drafter.md, load with dfl_model_load, carry a consistent test
 * vocabulary, and bad option combinations are refused with a clear message. */
#include "test.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

static int run_make(test_ctx *t, const char *dir, const char *opts, char *out, size_t cap) {
    char cmd[2048], d[400];
    test_path(t, dir, d, sizeof(d));
    snprintf(cmd, sizeof(cmd), "%s make-test-model -o %s %s", test_cli_path(), d, opts);
    return test_run(cmd, out, cap);
}

static bool files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool eq = fa != NULL && fb != NULL;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = false;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

TEST(make_test_model_is_deterministic) {
    char out[4096], a[400], b[400], c[400];
    REQUIRE(run_make(t, "a", "--type q4_0 --seed 5", out, sizeof(out)) == 0);
    REQUIRE(run_make(t, "b", "--type q4_0 --seed 5", out, sizeof(out)) == 0);
    REQUIRE(run_make(t, "c", "--type q4_0 --seed 6", out, sizeof(out)) == 0);
    CHECK(files_equal(test_path(t, "a/target.gguf", a, sizeof(a)), test_path(t, "b/target.gguf", b, sizeof(b))));
    CHECK(!files_equal(a, test_path(t, "c/target.gguf", c, sizeof(c))));
    CHECK(files_equal(test_path(t, "a/drafter.gguf", a, sizeof(a)), test_path(t, "b/drafter.gguf", b, sizeof(b))));
    CHECK(!files_equal(a, test_path(t, "c/drafter.gguf", c, sizeof(c))));
}

/* ne of a tensor, or all -1 when absent. */
static void shape_of(const gguf_file *f, const char *name, int64_t ne[2]) {
    const gguf_tensor *tt = gguf_find_tensor(f, name);
    ne[0] = tt ? tt->ne[0] : -1;
    ne[1] = tt ? (tt->n_dims >= 2 ? tt->ne[1] : 0) : -1;
}

#define CHECK_SHAPE(f, name, e0, e1) do { int64_t ne_[2]; shape_of(f, name, ne_); \
        CHECK_MSG(ne_[0] == (e0) && ne_[1] == (e1), "%s: [%lld, %lld], expected [%lld, %lld]", name, \
                  (long long)ne_[0], (long long)ne_[1], (long long)(e0), (long long)(e1)); } while (0)

TEST(make_test_model_shapes_and_hparams) {
    char out[4096], path[400];
    int rc = run_make(t, "m", "--n-embd 96 --n-layer 5 --n-head 6 --n-head-kv 2 --head-dim 32 --n-ff 160 "
                      "--n-vocab 700 --draft-layers 2 --block-size 8 --target-layers 1,3,5 --type q8_0 --untied",
                      out, sizeof(out));
    CHECK_MSG(rc == 0, "%s", out);
    REQUIRE(rc == 0);
    dfl_error err = {0};
    gguf_file *f = gguf_open(test_path(t, "m/target.gguf", path, sizeof(path)), &err);
    REQUIRE(f != NULL);
    CHECK_SHAPE(f, "token_embd.weight", 96, 700);
    CHECK_SHAPE(f, "output.weight", 96, 700);
    CHECK_SHAPE(f, "output_norm.weight", 96, 0);
    CHECK_SHAPE(f, "blk.4.attn_q.weight", 96, 6 * 32);
    CHECK_SHAPE(f, "blk.4.attn_k.weight", 96, 2 * 32);
    CHECK_SHAPE(f, "blk.4.attn_v.weight", 96, 2 * 32);
    CHECK_SHAPE(f, "blk.4.attn_output.weight", 6 * 32, 96);
    CHECK_SHAPE(f, "blk.4.attn_q_norm.weight", 32, 0);
    CHECK_SHAPE(f, "blk.4.ffn_gate.weight", 96, 160);
    CHECK_SHAPE(f, "blk.4.ffn_down.weight", 160, 96);
    CHECK(gguf_find_tensor(f, "blk.5.attn_q.weight") == NULL);
    CHECK_EQ_INT(gguf_find_tensor(f, "blk.0.ffn_up.weight")->type, QUANT_TYPE_Q8_0);
    CHECK_EQ_INT(gguf_find_tensor(f, "token_embd.weight")->type, QUANT_TYPE_Q8_0);
    CHECK_EQ_INT(gguf_find_tensor(f, "blk.0.ffn_norm.weight")->type, QUANT_TYPE_F32);
    CHECK_EQ_INT(gguf_n_tensors(f), 3 + 5 * 11);
    gguf_close(f);

    dfl_model *m = dfl_model_load(path, NULL, &err);
    CHECK_MSG(m != NULL, "target does not load: %s", err.msg);
    if (m != NULL) {
        const dfl_hparams *hp = dfl_model_hparams(m);
        CHECK_EQ_INT(hp->arch, DFL_ARCH_QWEN3);
        CHECK_EQ_INT(hp->n_layer, 5);
        CHECK_EQ_INT(hp->n_embd, 96);
        CHECK_EQ_INT(hp->n_head, 6);
        CHECK_EQ_INT(hp->n_head_kv, 2);
        CHECK_EQ_INT(hp->n_embd_head_k, 32);
        CHECK_EQ_INT(hp->n_ff, 160);
        CHECK_EQ_INT(hp->n_vocab, 700);
        CHECK(!hp->tied_output);
        dfl_model_free(m);
    }

    f = gguf_open(test_path(t, "m/drafter.gguf", path, sizeof(path)), &err);
    REQUIRE(f != NULL);
    CHECK_SHAPE(f, "fc.weight", 3 * 96, 96);
    CHECK_SHAPE(f, "enc.output_norm.weight", 96, 0);
    CHECK_SHAPE(f, "blk.1.attn_k_norm.weight", 32, 0);
    CHECK(gguf_find_tensor(f, "token_embd.weight") == NULL);
    CHECK(gguf_find_tensor(f, "output.weight") == NULL);
    CHECK(gguf_find_tensor(f, "blk.2.attn_q.weight") == NULL);
    gguf_close(f);
    m = dfl_model_load(path, NULL, &err);
    CHECK_MSG(m != NULL, "drafter does not load: %s", err.msg);
    if (m != NULL) {
        const dfl_hparams *hp = dfl_model_hparams(m);
        CHECK_EQ_INT(hp->arch, DFL_ARCH_DFLASH);
        CHECK_EQ_INT(hp->n_layer, 2);
        CHECK_EQ_INT(hp->block_size, 8);
        CHECK_EQ_INT(hp->n_target_layers, 3);
        CHECK(hp->target_layers[0] == 1 && hp->target_layers[1] == 3 && hp->target_layers[2] == 5);
        CHECK(hp->mask_token_id > 0);
        dfl_model_free(m);
    }

    /* llama: no q/k norms; default target layers spread over 1..n_layer-1 */
    REQUIRE(run_make(t, "l", "--arch llama --n-layer 6 --type bf16", out, sizeof(out)) == 0);
    f = gguf_open(test_path(t, "l/target.gguf", path, sizeof(path)), &err);
    REQUIRE(f != NULL);
    CHECK(gguf_find_tensor(f, "blk.0.attn_q_norm.weight") == NULL);
    CHECK(gguf_find_tensor(f, "output.weight") == NULL); /* tied by default */
    CHECK(gguf_find_kv(f, "llama.block_count") != NULL);
    CHECK_EQ_INT(gguf_find_tensor(f, "blk.5.attn_q.weight")->type, QUANT_TYPE_BF16);
    gguf_close(f);
    f = gguf_open(test_path(t, "l/drafter.gguf", path, sizeof(path)), &err);
    REQUIRE(f != NULL);
    const gguf_kv *tl;
    REQUIRE(gguf_get_arr(f, "dflash.target_layers", GGUF_TYPE_INT32, &tl, &err) == DFL_OK);
    int64_t v0 = 0, v2 = 0;
    CHECK(tl->arr_n == 3 && gguf_arr_int(tl, 0, &v0) && gguf_arr_int(tl, 2, &v2) && v0 == 1 && v2 == 5);
    gguf_close(f);
}

TEST(make_test_model_vocabulary) {
    char out[4096], path[400];
    REQUIRE(run_make(t, "v", "", out, sizeof(out)) == 0);
    dfl_error err = {0};
    gguf_file *f = gguf_open(test_path(t, "v/drafter.gguf", path, sizeof(path)), &err);
    REQUIRE(f != NULL);
    const gguf_kv *toks, *types, *merges;
    REQUIRE(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == DFL_OK);
    REQUIRE(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &err) == DFL_OK);
    REQUIRE(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges, &err) == DFL_OK);
    CHECK_EQ_INT(toks->arr_n, 1024);
    CHECK_EQ_INT(types->arr_n, 1024);
    CHECK(merges->arr_n > 100);
    /* texts are unique; every merge joins two tokens into a third */
    char **text = calloc(toks->arr_n, sizeof(char *));
    for (uint64_t i = 0; i < toks->arr_n; i++) {
        gguf_str s;
        REQUIRE(gguf_arr_str(toks, i, &s));
        text[i] = strndup(s.ptr, (size_t)s.len);
    }
    int dups = 0, bad_merges = 0;
    for (uint64_t i = 0; i < toks->arr_n; i++) {
        for (uint64_t j = 0; j < i; j++) dups += strcmp(text[i], text[j]) == 0;
    }
    for (uint64_t m = 0; m < merges->arr_n; m++) {
        gguf_str s;
        REQUIRE(gguf_arr_str(merges, m, &s));
        char buf[300];
        snprintf(buf, sizeof(buf), "%.*s", (int)s.len, s.ptr);
        char *sp = strchr(buf, ' ');
        if (sp == NULL) { bad_merges++; continue; }
        *sp = '\0';
        char joined[300];
        snprintf(joined, sizeof(joined), "%s%s", buf, sp + 1);
        bool l = false, r = false, j = false;
        for (uint64_t i = 0; i < toks->arr_n; i++) {
            l |= strcmp(text[i], buf) == 0;
            r |= strcmp(text[i], sp + 1) == 0;
            j |= strcmp(text[i], joined) == 0;
        }
        if (!(l && r && j)) bad_merges++;
    }
    CHECK_EQ_INT(dups, 0);
    CHECK_EQ_INT(bad_merges, 0);
    /* byte tokens: '!' first, 'Ġ' (space) and 'Ċ' (newline) present */
    CHECK(strcmp(text[0], "!") == 0);
    int64_t id, ty;
    REQUIRE(gguf_get_int(f, "tokenizer.ggml.mask_token_id", &id, &err) == DFL_OK);
    CHECK(strcmp(text[id], "<|MASK|>") == 0);
    CHECK(gguf_arr_int(types, (uint64_t)id, &ty) && ty == 3);
    REQUIRE(gguf_get_int(f, "tokenizer.ggml.eos_token_id", &id, &err) == DFL_OK);
    CHECK(strcmp(text[id], "<|im_end|>") == 0);
    REQUIRE(gguf_get_int(f, "tokenizer.ggml.bos_token_id", &id, &err) == DFL_OK);
    CHECK(strcmp(text[id], "<|endoftext|>") == 0);
    CHECK(gguf_arr_int(types, 10, &ty) && ty == 1);
    CHECK(strcmp(text[1023], "[PAD1023]") == 0 && gguf_arr_int(types, 1023, &ty) && ty == 5);
    bool add_bos = true;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, &err) == DFL_OK && !add_bos);
    gguf_str s;
    CHECK(gguf_get_str(f, "tokenizer.chat_template", &s, &err) == DFL_OK && s.len > 0);
    CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &s, &err) == DFL_OK && gguf_str_eq(s, "qwen2"));
    for (uint64_t i = 0; i < toks->arr_n; i++) free(text[i]);
    free(text);
    gguf_close(f);
}

TEST(make_test_model_refuses_bad_options) {
    const struct { const char *opts; const char *want; } cases[] = {
        {"--n-head 6 --n-head-kv 4", "--n-head 6 is not a multiple of --n-head-kv 4"},
        {"--type q8_0 --n-embd 48", "--type q8_0 needs n_embd (48) to be a multiple of its block size 32"},
        {"--type q4_0 --n-ff 100", "needs n_ff (100) to be a multiple"},
        {"--type q4_0 --head-dim 12 --n-head 2 --n-head-kv 2", "needs n_head*head_dim (24) to be a multiple"},
        {"--target-layers 0,2", "--target-layers: id 0 is out of 1..4"},
        {"--n-layer 2 --target-layers 1,3", "id 3 is out of 1..2"},
        {"--target-layers 1,1", "id 1 appears twice"},
        {"--target-layers 1,x", "--target-layers expects comma-separated integers"},
        {"--n-vocab 300", "--n-vocab 300 is too small: the test vocabulary needs at least"},
        {"--block-size 1", "--block-size expects an integer in 2..64"},
        {"--head-dim 15", "--head-dim 15 must be even"},
        {"--type q4_K", "--type must be f32, f16, bf16, q8_0 or q4_0"},
        {"--arch gpt2", "--arch must be qwen3 or llama"},
        {"--n-embd", "--n-embd needs a value"},
        {"--bogus 1", "unknown option '--bogus'"},
        {"--n-embd 1048576 --n-vocab 100000", "too large for a test model"},
    };
    char out[4096];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = run_make(t, "x", cases[i].opts, out, sizeof(out));
        CHECK_MSG(rc == 2, "%s: exit %d: %s", cases[i].opts, rc, out);
        CHECK_STR_CONTAINS(out, cases[i].want);
    }
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "%s make-test-model", test_cli_path());
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 2);
    CHECK_STR_CONTAINS(out, "give -o DIR or --target PATH");
    snprintf(cmd, sizeof(cmd), "%s make-test-model --target /nonexistent/dir/t.gguf", test_cli_path());
    CHECK_EQ_INT(test_run(cmd, out, sizeof(out)), 1);
    CHECK_STR_CONTAINS(out, "/nonexistent/dir/t.gguf: cannot create");
}
