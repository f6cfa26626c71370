/* test_model_load.c: binding of qwen3 / llama / dflash models by name with type and shape checked,
 * and the error message for every missing or mismatched tensor or key. */
#include "test.h"
#include "dflash.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

/* A tiny model description for building test files. */
typedef struct tiny {
    const char *arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    bool drafter;
    const char *skip_tensor;   /* leave this tensor out */
    const char *bad_tensor;    /* give this tensor a wrong shape */
    const char *skip_key;      /* leave this key out */
    uint32_t matrix_type;      /* F32, F16 or any quantized type the dims allow */
    const uint32_t *extra_types; /* n_extra more [256] tensors "extra.<i>" of these types */
    int n_extra;
} tiny;

static float k_zeros[1 << 16];

static void add_t(gguf_writer *w, const tiny *m, const char *name, uint32_t type, int n_dims, int64_t ne0, int64_t ne1) {
    if (m->skip_tensor && strcmp(name, m->skip_tensor) == 0) return;
    if (m->bad_tensor && strcmp(name, m->bad_tensor) == 0) ne0 += 32;
    int64_t ne[2] = {ne0, ne1};
    size_t nbytes = quant_row_size(type, ne0) * (size_t)(n_dims > 1 ? ne1 : 1);
    if (nbytes > sizeof(k_zeros)) abort();
    gguf_writer_add_tensor(w, name, type, (uint32_t)n_dims, ne, k_zeros, nbytes, NULL);
}

static void set_key_u32(gguf_writer *w, const tiny *m, const char *key, uint32_t v) {
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", m->arch, key);
    if (m->skip_key && strcmp(full, m->skip_key) == 0) return;
    gguf_writer_set_u32(w, full, v);
}

static bool write_tiny(const tiny *m, const char *path) {
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", m->arch);
    set_key_u32(w, m, "block_count", (uint32_t)m->n_layer);
    set_key_u32(w, m, "context_length", 256);
    set_key_u32(w, m, "embedding_length", (uint32_t)m->n_embd);
    set_key_u32(w, m, "feed_forward_length", (uint32_t)m->n_ff);
    set_key_u32(w, m, "attention.head_count", (uint32_t)m->n_head);
    set_key_u32(w, m, "attention.head_count_kv", (uint32_t)m->n_head_kv);
    set_key_u32(w, m, "attention.key_length", (uint32_t)m->head_dim);
    set_key_u32(w, m, "attention.value_length", (uint32_t)m->head_dim);
    char eps_key[128];
    snprintf(eps_key, sizeof(eps_key), "%s.attention.layer_norm_rms_epsilon", m->arch);
    if (!(m->skip_key && strcmp(m->skip_key, eps_key) == 0)) gguf_writer_set_f32(w, eps_key, 1e-6f);
    const uint32_t mt = m->matrix_type;
    const int64_t E = m->n_embd, Q = (int64_t)m->n_head * m->head_dim, K = (int64_t)m->n_head_kv * m->head_dim;
    if (m->drafter) {
        int32_t tl[2] = {1, 2};
        if (!(m->skip_key && strcmp(m->skip_key, "dflash.target_layers") == 0)) {
            gguf_writer_set_arr_i32(w, "dflash.target_layers", tl, 2);
        }
        gguf_writer_set_u32(w, "dflash.block_size", 8);
        gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", 5);
        add_t(w, m, "fc.weight", mt, 2, 2 * E, E);
        add_t(w, m, "enc.output_norm.weight", QUANT_TYPE_F32, 1, E, 1);
    } else {
        add_t(w, m, "token_embd.weight", mt, 2, E, m->n_vocab);
    }
    add_t(w, m, "output_norm.weight", QUANT_TYPE_F32, 1, E, 1);
    for (int i = 0; i < m->n_extra; i++) {
        char n[32];
        snprintf(n, sizeof(n), "extra.%d", i);
        add_t(w, m, n, m->extra_types[i], 1, 256, 1);
    }
    for (int il = 0; il < m->n_layer; il++) {
        char n[64];
#define T(suffix, type, nd, a, b) (snprintf(n, sizeof(n), "blk.%d." suffix, il), add_t(w, m, n, type, nd, a, b))
        T("attn_norm.weight", QUANT_TYPE_F32, 1, E, 1);
        T("attn_q.weight", mt, 2, E, Q);
        T("attn_k.weight", mt, 2, E, K);
        T("attn_v.weight", mt, 2, E, K);
        T("attn_output.weight", mt, 2, Q, E);
        if (strcmp(m->arch, "llama") != 0) {
            T("attn_q_norm.weight", QUANT_TYPE_F32, 1, m->head_dim, 1);
            T("attn_k_norm.weight", QUANT_TYPE_F32, 1, m->head_dim, 1);
        }
        T("ffn_norm.weight", QUANT_TYPE_F32, 1, E, 1);
        T("ffn_gate.weight", mt, 2, E, m->n_ff);
        T("ffn_up.weight", mt, 2, E, m->n_ff);
        T("ffn_down.weight", mt, 2, m->n_ff, E);
#undef T
    }
    dfl_error err = {0};
    dfl_status st = gguf_writer_write(w, path, &err);
    gguf_writer_free(w);
    return st == DFL_OK;
}

static tiny tiny_default(void) {
    tiny m = {"qwen3", 2, 64, 4, 2, 16, 96, 50, false, NULL, NULL, NULL, QUANT_TYPE_F32, NULL, 0};
    return m;
}

TEST(model_load_qwen3_ok) {
    char path[512];
    tiny m = tiny_default();
    REQUIRE(write_tiny(&m, test_path(t, "m.gguf", path, sizeof(path))));
    dfl_error err = {0};
    dfl_model *model = dfl_model_load(path, NULL, &err);
    REQUIRE(model != NULL);
    const dfl_hparams *hp = dfl_model_hparams(model);
    CHECK_EQ_INT(hp->arch, DFL_ARCH_QWEN3);
    CHECK_EQ_INT(hp->n_layer, 2);
    CHECK_EQ_INT(hp->n_embd, 64);
    CHECK_EQ_INT(hp->n_head, 4);
    CHECK_EQ_INT(hp->n_head_kv, 2);
    CHECK_EQ_INT(hp->n_embd_head_k, 16);
    CHECK_EQ_INT(hp->n_vocab, 50);
    CHECK(hp->tied_output);
    CHECK_NEAR(hp->rope_freq_base, 10000.0, 1e-3);
    CHECK(model->output == model->token_embd);
    CHECK(model->layers[1].q_norm != NULL);
    dfl_model_free(model);
}

TEST(model_load_llama_and_f16) {
    char path[512];
    tiny m = tiny_default();
    m.arch = "llama";
    m.matrix_type = QUANT_TYPE_F16;
    REQUIRE(write_tiny(&m, test_path(t, "m.gguf", path, sizeof(path))));
    dfl_error err = {0};
    dfl_model *model = dfl_model_load(path, NULL, &err);
    CHECK_MSG(model != NULL, "%s", err.msg);
    if (model) {
        CHECK_EQ_INT(dfl_model_hparams(model)->arch, DFL_ARCH_LLAMA);
        CHECK(model->layers[0].q_norm == NULL);
        dfl_model_free(model);
    }
}

TEST(model_load_drafter_ok) {
    char path[512];
    tiny m = tiny_default();
    m.arch = "dflash";
    m.drafter = true;
    m.n_layer = 1;
    REQUIRE(write_tiny(&m, test_path(t, "d.gguf", path, sizeof(path))));
    dfl_error err = {0};
    dfl_model *model = dfl_model_load(path, NULL, &err);
    REQUIRE(model != NULL);
    const dfl_hparams *hp = dfl_model_hparams(model);
    CHECK_EQ_INT(hp->arch, DFL_ARCH_DFLASH);
    CHECK_EQ_INT(hp->block_size, 8);
    CHECK_EQ_INT(hp->n_target_layers, 2);
    CHECK_EQ_INT(hp->target_layers[1], 2);
    CHECK_EQ_INT(hp->mask_token_id, 5);
    CHECK(!hp->has_token_embd);
    CHECK(!hp->causal);
    dfl_model_free(model);
}

/* Loads a broken variant; expects failure with `code` and a message containing `needle`. */
static void expect_fail(test_ctx *t, const tiny *m, dfl_status code, const char *needle) {
    char path[512];
    REQUIRE(write_tiny(m, test_path(t, "bad.gguf", path, sizeof(path))));
    dfl_error err = {0};
    dfl_model *model = dfl_model_load(path, NULL, &err);
    CHECK(model == NULL);
    CHECK_EQ_INT(err.code, code);
    CHECK_STR_CONTAINS(err.msg, needle);
    dfl_model_free(model);
}

TEST(model_load_missing_tensor) {
    tiny m = tiny_default();
    m.skip_tensor = "blk.1.ffn_up.weight";
    expect_fail(t, &m, DFL_ERR_MISSING, "blk.1.ffn_up.weight: expected [64, 96]");
}

TEST(model_load_mismatched_tensor) {
    tiny m = tiny_default();
    m.bad_tensor = "blk.0.attn_k.weight";
    expect_fail(t, &m, DFL_ERR_MISMATCH, "blk.0.attn_k.weight: expected [64, 32] type");
    m.bad_tensor = "blk.0.attn_k.weight";
    expect_fail(t, &m, DFL_ERR_MISMATCH, "found [96, 32] type f32");
}

TEST(model_load_reports_every_problem) {
    tiny m = tiny_default();
    m.skip_tensor = "blk.0.attn_q_norm.weight";
    m.bad_tensor = "blk.1.ffn_down.weight";
    char path[512];
    REQUIRE(write_tiny(&m, test_path(t, "bad.gguf", path, sizeof(path))));
    dfl_error err = {0};
    dfl_model *model = dfl_model_load(path, NULL, &err);
    CHECK(model == NULL);
    CHECK_STR_CONTAINS(err.msg, "2 tensor problems");
    CHECK_STR_CONTAINS(err.msg, "blk.0.attn_q_norm.weight");
    CHECK_STR_CONTAINS(err.msg, "blk.1.ffn_down.weight");
}

/* Every type llama-quantize's common presets write binds as a weight matrix. */
TEST(model_load_quantized_types) {
    static const uint32_t types[] = {QUANT_TYPE_Q4_1, QUANT_TYPE_Q5_0, QUANT_TYPE_Q5_1, QUANT_TYPE_IQ4_NL,
                                     QUANT_TYPE_Q2_K, QUANT_TYPE_Q3_K, QUANT_TYPE_Q5_K, QUANT_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        tiny m = tiny_default();
        m.matrix_type = types[i];
        if (quant_type_get(types[i])->blck_size == 256) { /* every row length a multiple of 256 */
            m.n_embd = 256;
            m.head_dim = 64;
            m.n_ff = 256;
        }
        char path[512];
        REQUIRE(write_tiny(&m, test_path(t, "q.gguf", path, sizeof(path))));
        dfl_error err = {0};
        dfl_model *model = dfl_model_load(path, NULL, &err);
        CHECK_MSG(model != NULL, "%s: %s", quant_type_get(types[i])->name, err.msg);
        if (model) CHECK_EQ_INT(model->layers[1].ffn_down->type, types[i]);
        dfl_model_free(model);
    }
}

/* A file with several types we cannot compute with names all of them, each once, first. */
TEST(model_load_lists_every_unsupported_type) {
    static const uint32_t extra[] = {16 /* iq2_xxs */, 34 /* tq1_0 */, 16, QUANT_TYPE_Q5_K};
    tiny m = tiny_default();
    m.extra_types = extra;
    m.n_extra = 4;
    m.bad_tensor = "blk.1.ffn_down.weight";
    expect_fail(t, &m, DFL_ERR_UNSUPPORTED,
                "2 tensor problems: unsupported tensor types iq2_xxs (2 tensors), tq1_0 (1 tensor); blk.1.ffn_down");
}

TEST(model_load_missing_keys) {
    tiny m = tiny_default();
    m.skip_key = "qwen3.block_count";
    expect_fail(t, &m, DFL_ERR_MISSING, "qwen3.block_count");
    m.skip_key = "qwen3.attention.layer_norm_rms_epsilon";
    expect_fail(t, &m, DFL_ERR_MISSING, "layer_norm_rms_epsilon");
    m = tiny_default();
    m.arch = "dflash";
    m.drafter = true;
    m.skip_key = "dflash.target_layers";
    expect_fail(t, &m, DFL_ERR_MISSING, "dflash.target_layers");
}

TEST(model_load_unknown_arch) {
    tiny m = tiny_default();
    m.arch = "gpt-neox";
    expect_fail(t, &m, DFL_ERR_UNSUPPORTED, "architecture 'gpt-neox' is not supported");
}

TEST(model_load_bad_head_counts) {
    tiny m = tiny_default();
    m.n_head_kv = 3;
    expect_fail(t, &m, DFL_ERR_FORMAT, "not a multiple of head_count_kv");
}

TEST(model_load_not_a_file) {
    dfl_error err = {0};
    dfl_model *model = dfl_model_load("/nonexistent/model.gguf", NULL, &err);
    CHECK(model == NULL);
    CHECK_EQ_INT(err.code, DFL_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "/nonexistent/model.gguf");
}
