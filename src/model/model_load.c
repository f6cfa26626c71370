/* model_load.c: dfl_model_load for arch qwen3, llama (targets) and dflash (drafter): reads the
 * hparams and binds every tensor by name, checking type and shape. Every missing or mismatched
 * tensor is reported ("name: expected [..] type T, found [..] type U"), not just the first.
 * Weights stay in the file mapping. */
#include "model/model.h"
#include "base/error.h"
#include "quant/quant.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Collects binding problems into one message. */
typedef struct bind_report {
    char text[900];
    size_t len;
    int n_problems;
    dfl_status code;
} bind_report;

static void report_add(bind_report *r, dfl_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void report_add(bind_report *r, dfl_status code, const char *fmt, ...) {
    if (r->n_problems == 0) r->code = code;
    r->n_problems++;
    if (r->len + 8 >= sizeof(r->text)) return;
    if (r->n_problems > 1) r->len += (size_t)snprintf(r->text + r->len, sizeof(r->text) - r->len, "; ");
    if (r->len >= sizeof(r->text)) { r->len = sizeof(r->text) - 1; return; }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->text + r->len, sizeof(r->text) - r->len, fmt, ap);
    va_end(ap);
    if (n > 0) r->len += (size_t)n;
    if (r->len >= sizeof(r->text)) r->len = sizeof(r->text) - 1;
}

static void shape_str(char *buf, size_t cap, const int64_t *ne, int n_dims) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n_dims && len < cap; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)ne[i]);
    }
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

typedef enum bind_kind {
    BIND_NORM,   /* a norm vector: f32 (f16/bf16 accepted) */
    BIND_MATRIX, /* a weight: any type we can compute with */
} bind_kind;

static const char *type_name(uint32_t type) {
    const quant_type_info *ti = quant_type_get(type);
    return ti != NULL ? ti->name : "unknown";
}

/* Binds tensor `name` with the expected shape (n_dims 1 or 2). NULL if missing or mismatched
 * (then the problem is in the report), or if optional and absent (no problem). */
static const gguf_tensor *bind(const gguf_file *f, bind_report *r, const char *name, bind_kind kind,
                               int n_dims, int64_t ne0, int64_t ne1, bool optional) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    int64_t want[2] = {ne0, ne1};
    char ws[64], fs[96];
    shape_str(ws, sizeof(ws), want, n_dims);
    const char *want_type =
        kind == BIND_NORM ? "f32" : "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_K|q3_K|q4_K|q5_K|q6_K|iq4_nl|iq4_xs";
    if (t == NULL) {
        if (!optional) report_add(r, DFL_ERR_MISSING, "%s: expected %s type %s, missing", name, ws, want_type);
        return NULL;
    }
    /* trailing dims of 1 are equivalent (a [n] vector may be stored as [n, 1]) */
    int t_dims = (int)t->n_dims;
    while (t_dims > n_dims && t->ne[t_dims - 1] == 1) t_dims--;
    bool shape_ok = t_dims == n_dims && t->ne[0] == ne0 && (n_dims < 2 || t->ne[1] == ne1);
    bool type_ok;
    if (kind == BIND_NORM) {
        type_ok = t->type == QUANT_TYPE_F32 || t->type == QUANT_TYPE_F16 || t->type == QUANT_TYPE_BF16;
    } else {
        const quant_type_info *ti = quant_type_get(t->type);
        type_ok = ti != NULL && ti->can_dequantize;
    }
    if (!shape_ok || !type_ok) {
        shape_str(fs, sizeof(fs), t->ne, (int)t->n_dims);
        report_add(r, DFL_ERR_MISMATCH, "%s: expected %s type %s, found %s type %s", name, ws, want_type, fs,
                   type_name(t->type));
        return NULL;
    }
    return t;
}

/* Reads an integer hparam "<arch>.<key>"; missing -> *out = dflt if dflt >= 0 else error. */
static dfl_status read_int(const gguf_file *f, const char *arch, const char *key, int64_t dflt, int64_t lo,
                           int64_t hi, int64_t *out, dfl_error *err) {
    char full[160];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    int64_t v = 0;
    dfl_error e2 = {0};
    dfl_status st = gguf_get_int(f, full, &v, &e2);
    if (st == DFL_ERR_MISSING && dflt >= 0) {
        *out = dflt;
        return DFL_OK;
    }
    if (st == DFL_ERR_MISSING) {
        return error_set(err, DFL_ERR_MISSING, "required key %s is missing", full);
    }
    if (st != DFL_OK) {
        return error_set(err, st, "%s", e2.msg);
    }
    if (v < lo || v > hi) {
        return error_set(err, DFL_ERR_FORMAT, "key %s = %lld is out of range [%lld, %lld]", full, (long long)v,
                         (long long)lo, (long long)hi);
    }
    *out = v;
    return DFL_OK;
}

static dfl_status read_float(const gguf_file *f, const char *arch, const char *key, double dflt, bool required,
                             float *out, dfl_error *err) {
    char full[160];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    double v = 0;
    dfl_error e2 = {0};
    dfl_status st = gguf_get_float(f, full, &v, &e2);
    if (st == DFL_ERR_MISSING && !required) {
        *out = (float)dflt;
        return DFL_OK;
    }
    if (st == DFL_ERR_MISSING) return error_set(err, DFL_ERR_MISSING, "required key %s is missing", full);
    if (st != DFL_OK) return error_set(err, st, "%s", e2.msg);
    if (!(v == v) || v > 1e30 || v < -1e30) {
        return error_set(err, DFL_ERR_FORMAT, "key %s = %g is not a usable number", full, v);
    }
    *out = (float)v;
    return DFL_OK;
}

static dfl_status read_bool(const gguf_file *f, const char *arch, const char *key, bool dflt, bool *out,
                            dfl_error *err) {
    char full[160];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    dfl_error e2 = {0};
    dfl_status st = gguf_get_bool(f, full, out, &e2);
    if (st == DFL_ERR_MISSING) {
        *out = dflt;
        return DFL_OK;
    }
    if (st != DFL_OK) return error_set(err, st, "%s", e2.msg);
    return DFL_OK;
}

const char *dfl_arch_name(dfl_arch arch) {
    switch (arch) {
    case DFL_ARCH_QWEN3: return "qwen3";
    case DFL_ARCH_LLAMA: return "llama";
    case DFL_ARCH_DFLASH: return "dflash";
    }
    return "unknown";
}

dfl_model_params dfl_model_default_params(void) {
    dfl_model_params p;
    memset(&p, 0, sizeof(p));
    return p;
}

const dfl_hparams *dfl_model_hparams(const dfl_model *model) { return &model->hp; }

const gguf_file *model_gguf(const dfl_model *model) { return model->gguf; }
uint64_t dfl_model_n_bytes(const dfl_model *model) { return model->n_bytes; }
uint64_t dfl_model_n_params(const dfl_model *model) { return model->n_params; }

/* hparams common to all three architectures. */
static dfl_status load_hparams(const gguf_file *f, const char *arch, dfl_hparams *hp, dfl_error *err) {
    const int64_t big = (int64_t)1 << 24;
    dfl_status st;
    if ((st = read_int(f, arch, "block_count", -1, 1, MODEL_MAX_LAYERS, &hp->n_layer, err))) return st;
    if ((st = read_int(f, arch, "context_length", 4096, 1, (int64_t)1 << 31, &hp->n_ctx_train, err))) return st;
    if ((st = read_int(f, arch, "embedding_length", -1, 1, big, &hp->n_embd, err))) return st;
    if ((st = read_int(f, arch, "feed_forward_length", -1, 1, big, &hp->n_ff, err))) return st;
    if ((st = read_int(f, arch, "attention.head_count", -1, 1, 4096, &hp->n_head, err))) return st;
    if ((st = read_int(f, arch, "attention.head_count_kv", hp->n_head, 1, 4096, &hp->n_head_kv, err))) return st;
    if (hp->n_head % hp->n_head_kv != 0) {
        return error_set(err, DFL_ERR_FORMAT, "%s.attention.head_count %lld is not a multiple of head_count_kv %lld",
                         arch, (long long)hp->n_head, (long long)hp->n_head_kv);
    }
    int64_t hd_default = hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : -1;
    if ((st = read_int(f, arch, "attention.key_length", hd_default, 2, 4096, &hp->n_embd_head_k, err))) return st;
    if ((st = read_int(f, arch, "attention.value_length", hp->n_embd_head_k, 1, 4096, &hp->n_embd_head_v, err))) {
        return st;
    }
    if (hp->n_embd_head_k % 2 != 0) {
        return error_set(err, DFL_ERR_FORMAT, "%s.attention.key_length %lld must be even (RoPE pairs)", arch,
                         (long long)hp->n_embd_head_k);
    }
    if ((st = read_float(f, arch, "attention.layer_norm_rms_epsilon", 1e-6, true, &hp->norm_eps, err))) return st;
    if (!(hp->norm_eps > 0.0f && hp->norm_eps < 1.0f)) {
        return error_set(err, DFL_ERR_FORMAT, "%s.attention.layer_norm_rms_epsilon = %g is out of range (0, 1)", arch,
                         (double)hp->norm_eps);
    }
    if ((st = read_float(f, arch, "rope.freq_base", 10000.0, false, &hp->rope_freq_base, err))) return st;
    if (!(hp->rope_freq_base > 0.0f)) {
        return error_set(err, DFL_ERR_FORMAT, "%s.rope.freq_base = %g must be positive", arch,
                         (double)hp->rope_freq_base);
    }
    return DFL_OK;
}

static dfl_status load_dflash_options(const gguf_file *f, dfl_model *m, dfl_error *err);

static dfl_status load_dflash_hparams(const gguf_file *f, dfl_model *m, dfl_error *err) {
    dfl_hparams *hp = &m->hp;
    dfl_status st;
    if ((st = read_int(f, "dflash", "block_size", 16, 1, 64, &hp->block_size, err))) return st;
    if (hp->block_size < 2) {
        return error_set(err, DFL_ERR_FORMAT, "dflash.block_size = %lld: a block needs at least 2 slots",
                         (long long)hp->block_size);
    }
    const gguf_kv *kv = NULL;
    dfl_error e2 = {0};
    st = gguf_get_arr(f, "dflash.target_layers", GGUF_TYPE_COUNT, &kv, &e2);
    if (st == DFL_ERR_MISSING) {
        return error_set(err, DFL_ERR_MISSING, "required key dflash.target_layers is missing");
    }
    if (st != DFL_OK) return error_set(err, st, "%s", e2.msg);
    if (kv->arr_n < 1 || kv->arr_n > 64) {
        return error_set(err, DFL_ERR_FORMAT, "dflash.target_layers has %llu entries (expected 1..64)",
                         (unsigned long long)kv->arr_n);
    }
    hp->n_target_layers = (int64_t)kv->arr_n;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        int64_t v = 0;
        if (!gguf_arr_int(kv, i, &v)) {
            return error_set(err, DFL_ERR_MISMATCH, "dflash.target_layers must be an integer array (found %s elements)",
                             gguf_type_name(kv->arr_type));
        }
        if (v < 0 || v > MODEL_MAX_LAYERS) {
            return error_set(err, DFL_ERR_FORMAT, "dflash.target_layers[%llu] = %lld is out of range",
                             (unsigned long long)i, (long long)v);
        }
        hp->target_layers[i] = (int32_t)v;
    }
    int64_t mask = -1;
    e2.code = DFL_OK;
    st = gguf_get_int(f, "tokenizer.ggml.mask_token_id", &mask, &e2);
    if (st != DFL_OK && st != DFL_ERR_MISSING) return error_set(err, st, "%s", e2.msg);
    hp->mask_token_id = st == DFL_OK ? mask : -1;
    if ((st = read_bool(f, "dflash", "attention.causal", false, &m->dflash.causal, err))) return st;
    hp->causal = m->dflash.causal;
    if ((st = load_dflash_options(f, m, err))) return st;
    return DFL_OK;
}

/* ---- drafter options (docs/drafter.md, "Drafter options") --------------------------------- */

/* Sliding-window layers, logit scale and softcap, embedding scale, sample_from_anchor. */
static dfl_status load_dflash_options(const gguf_file *f, dfl_model *m, dfl_error *err) {
    const dfl_hparams *hp = &m->hp;
    model_dflash *o = &m->dflash;
    dfl_status st;
    if ((st = read_int(f, "dflash", "attention.sliding_window", 0, 0, (int64_t)1 << 31, &o->sliding_window, err))) {
        return st;
    }
    if (o->sliding_window > 0) {
        /* llama.cpp reads the pattern as a required per-layer array (true = sliding layer) */
        const gguf_kv *kv = NULL;
        dfl_error e2 = {0};
        st = gguf_get_arr(f, "dflash.attention.sliding_window_pattern", GGUF_TYPE_COUNT, &kv, &e2);
        if (st == DFL_ERR_MISSING) {
            return error_set(err, DFL_ERR_MISSING, "dflash.attention.sliding_window = %lld needs the key "
                             "dflash.attention.sliding_window_pattern (a bool per layer), which is missing",
                             (long long)o->sliding_window);
        }
        if (st != DFL_OK) {
            return error_set(err, DFL_ERR_MISMATCH, "dflash.attention.sliding_window_pattern must be an array of %lld "
                             "bools (one per layer): %s", (long long)hp->n_layer, e2.msg);
        }
        if ((int64_t)kv->arr_n != hp->n_layer) {
            return error_set(err, DFL_ERR_FORMAT, "dflash.attention.sliding_window_pattern has %llu entries, expected %lld "
                             "(one per layer)", (unsigned long long)kv->arr_n, (long long)hp->n_layer);
        }
        o->swa_layer = calloc((size_t)hp->n_layer, sizeof(bool));
        if (o->swa_layer == NULL) return error_set(err, DFL_ERR_NOMEM, "out of memory");
        for (int64_t il = 0; il < hp->n_layer; il++) {
            int64_t v = 0;
            if (!gguf_arr_int(kv, (uint64_t)il, &v)) {
                return error_set(err, DFL_ERR_MISMATCH, "dflash.attention.sliding_window_pattern must be a bool array "
                                 "(found %s elements)", gguf_type_name(kv->arr_type));
            }
            o->swa_layer[il] = v != 0;
        }
    }
    if ((st = read_float(f, "dflash", "logit_scale", 1.0, false, &o->logit_scale, err))) return st;
    if (!(o->logit_scale > 0.0f)) {
        return error_set(err, DFL_ERR_FORMAT, "dflash.logit_scale = %g must be positive", (double)o->logit_scale);
    }
    if ((st = read_float(f, "dflash", "final_logit_softcapping", 0.0, false, &o->final_logit_softcapping, err))) {
        return st;
    }
    if (!(o->final_logit_softcapping >= 0.0f)) {
        return error_set(err, DFL_ERR_FORMAT, "dflash.final_logit_softcapping = %g must be >= 0 (0: none)",
                         (double)o->final_logit_softcapping);
    }
    if ((st = read_float(f, "dflash", "embedding_scale", 0.0, false, &o->embedding_scale, err))) return st;
    if (o->embedding_scale == 0.0f) o->embedding_scale = 1.0f; /* 0 or absent: none (as llama.cpp's hparam) */
    if ((st = read_bool(f, "dflash", "sample_from_anchor", true, &o->sample_from_anchor, err))) return st;
    return DFL_OK;
}

static void bind_layers(dfl_model *m, bind_report *r) {
    const gguf_file *f = m->gguf;
    const dfl_hparams *hp = &m->hp;
    const int64_t n_embd = hp->n_embd, n_ff = hp->n_ff;
    const int64_t n_q = hp->n_head * hp->n_embd_head_k;
    const int64_t n_k = hp->n_head_kv * hp->n_embd_head_k;
    const int64_t n_v = hp->n_head_kv * hp->n_embd_head_v;
    const int64_t n_o = hp->n_head * hp->n_embd_head_v;
    const bool qk_norm = hp->arch != DFL_ARCH_LLAMA;
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof(name), "blk.%lld." suffix, (long long)il), name)
    for (int64_t il = 0; il < hp->n_layer; il++) {
        model_layer *L = &m->layers[il];
        L->attn_norm = bind(f, r, NAME("attn_norm.weight"), BIND_NORM, 1, n_embd, 1, false);
        L->wq = bind(f, r, NAME("attn_q.weight"), BIND_MATRIX, 2, n_embd, n_q, false);
        L->wk = bind(f, r, NAME("attn_k.weight"), BIND_MATRIX, 2, n_embd, n_k, false);
        L->wv = bind(f, r, NAME("attn_v.weight"), BIND_MATRIX, 2, n_embd, n_v, false);
        L->wo = bind(f, r, NAME("attn_output.weight"), BIND_MATRIX, 2, n_o, n_embd, false);
        if (qk_norm) {
            L->q_norm = bind(f, r, NAME("attn_q_norm.weight"), BIND_NORM, 1, hp->n_embd_head_k, 1, false);
            L->k_norm = bind(f, r, NAME("attn_k_norm.weight"), BIND_NORM, 1, hp->n_embd_head_k, 1, false);
        }
        L->ffn_norm = bind(f, r, NAME("ffn_norm.weight"), BIND_NORM, 1, n_embd, 1, false);
        L->ffn_gate = bind(f, r, NAME("ffn_gate.weight"), BIND_MATRIX, 2, n_embd, n_ff, false);
        L->ffn_up = bind(f, r, NAME("ffn_up.weight"), BIND_MATRIX, 2, n_embd, n_ff, false);
        L->ffn_down = bind(f, r, NAME("ffn_down.weight"), BIND_MATRIX, 2, n_ff, n_embd, false);
    }
#undef NAME
}

/* ---- DSpark heads (docs/drafter.md, "DSpark") --------------------------------------------- */

/* A scalar f32 tensor [1] (markov_w2.scale, conf_proj.bias); dflt if absent. */
static float bind_scalar(const gguf_file *f, bind_report *r, const char *name, float dflt) {
    const gguf_tensor *t = bind(f, r, name, BIND_NORM, 1, 1, 1, true);
    if (t == NULL) return dflt;
    float v = 0.0f;
    if (!quant_dequantize_row(t->type, t->data, &v, 1) || !(v == v)) {
        report_add(r, DFL_ERR_FORMAT, "%s: not a usable number", name);
        return dflt;
    }
    return v;
}

/* Binds the Markov and confidence heads when markov_w1.weight is present (n_vocab: the drafter's
 * vocabulary size, or 0 when it has none: then markov_w1's row count, checked against the
 * target's when a drafter context is created). */
static void bind_dspark(dfl_model *m, bind_report *r) {
    const gguf_file *f = m->gguf;
    dfl_hparams *hp = &m->hp;
    model_dspark *d = &m->dspark;
    const gguf_tensor *w1 = gguf_find_tensor(f, "markov_w1.weight");
    const bool has_conf_key = gguf_find_kv(f, "dflash.has_confidence_head") != NULL;
    if (w1 == NULL) {
        static const char *const dspark_only[] = {"markov_w2.weight", "markov_w2.scale", "conf_proj.weight", "conf_proj.bias"};
        for (size_t i = 0; i < sizeof(dspark_only) / sizeof(dspark_only[0]); i++) {
            if (gguf_find_tensor(f, dspark_only[i]) != NULL) {
                report_add(r, DFL_ERR_MISSING, "%s is present but markov_w1.weight (the DSpark Markov head) is missing",
                           dspark_only[i]);
            }
        }
        if (has_conf_key) report_add(r, DFL_ERR_FORMAT, "dflash.has_confidence_head is set but the file has no DSpark heads");
        return;
    }
    if (gguf_find_tensor(f, "d2t") != NULL) {
        report_add(r, DFL_ERR_UNSUPPORTED, "d2t: a reduced draft vocabulary is not supported (the Markov head must cover "
                   "the target's vocabulary)");
    }
    const int64_t rank = w1->ne[0];
    const int64_t n_vocab = hp->n_vocab > 0 ? hp->n_vocab : (w1->n_dims >= 2 ? w1->ne[1] : 0);
    if (rank < 1 || rank > ((int64_t)1 << 16) || n_vocab < 1) {
        report_add(r, DFL_ERR_MISMATCH, "markov_w1.weight: expected [R, n_vocab] with 1 <= R <= 65536, found R = %lld, "
                   "n_vocab = %lld", (long long)rank, (long long)n_vocab);
        return;
    }
    d->rank = rank;
    d->markov_w1 = bind(f, r, "markov_w1.weight", BIND_MATRIX, 2, rank, n_vocab, false);
    d->markov_w2 = bind(f, r, "markov_w2.weight", BIND_MATRIX, 2, rank, n_vocab, false);
    d->markov_scale = bind_scalar(f, r, "markov_w2.scale", 1.0f);
    d->conf_proj = bind(f, r, "conf_proj.weight", BIND_MATRIX, 1, hp->n_embd + rank, 1, true);
    d->conf_bias = bind_scalar(f, r, "conf_proj.bias", 0.0f);
    if (gguf_find_tensor(f, "conf_proj.weight") == NULL && gguf_find_tensor(f, "conf_proj.bias") != NULL) {
        report_add(r, DFL_ERR_MISSING, "conf_proj.bias is present but conf_proj.weight is missing");
    }
    if (has_conf_key) {
        bool want = false;
        dfl_error e2 = {0};
        if (gguf_get_bool(f, "dflash.has_confidence_head", &want, &e2) != DFL_OK) {
            report_add(r, DFL_ERR_MISMATCH, "%s", e2.msg);
        } else if (want != (gguf_find_tensor(f, "conf_proj.weight") != NULL)) {
            report_add(r, DFL_ERR_MISSING, "dflash.has_confidence_head = %s but conf_proj.weight is %s",
                       want ? "true" : "false", want ? "missing" : "present");
        }
    }
    d->anchor_first = m->dflash.sample_from_anchor;
    if (d->markov_w1 == NULL || d->markov_w2 == NULL) d->markov_w1 = NULL;
}

/* Tensors llama.cpp's dflash model may carry that change the result and that we do not run:
 * refused by name rather than silently ignored (per-tensor dequantization scales of FP8 exports,
 * attention sinks). */
static void refuse_unsupported_drafter_tensors(const gguf_file *f, bind_report *r) {
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_str nm = gguf_tensor_at(f, i)->name;
        const int len = (int)(nm.len > 63 ? 63 : nm.len);
        const bool is_scale = nm.len > 6 && memcmp(nm.ptr + nm.len - 6, ".scale", 6) == 0 && !gguf_str_eq(nm, "markov_w2.scale");
        bool is_sink = false;
        for (uint64_t k = 0; k + 10 <= nm.len && !is_sink; k++) is_sink = memcmp(nm.ptr + k, "attn_sinks", 10) == 0;
        if (is_scale) report_add(r, DFL_ERR_UNSUPPORTED, "%.*s: per-tensor weight scales are not supported", len, nm.ptr);
        if (is_sink) report_add(r, DFL_ERR_UNSUPPORTED, "%.*s: attention sinks are not supported", len, nm.ptr);
    }
}

/* n_vocab from token_embd, or from the tokenizer's token list when the model has no embedding. */
static int64_t vocab_size_from_tokens(const gguf_file *f) {
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    return (kv != NULL && kv->type == GGUF_TYPE_ARRAY) ? (int64_t)kv->arr_n : 0;
}

/* Every tensor type of the file that we cannot compute with, listed once each with its count, as
 * the first problem of the report (so a file of an unsupported quantization says so at once). */
static void report_unsupported_types(const gguf_file *f, bind_report *r) {
    int64_t count[QUANT_TYPE_COUNT] = {0};
    int n_types = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const uint32_t type = gguf_tensor_at(f, i)->type;
        const quant_type_info *ti = quant_type_get(type);
        if (ti != NULL && ti->can_dequantize) continue;
        if (type < QUANT_TYPE_COUNT && count[type]++ == 0) n_types++;
    }
    if (n_types == 0) return;
    char list[400];
    size_t len = 0;
    list[0] = '\0';
    for (int k = 0; k < QUANT_TYPE_COUNT && len < sizeof(list); k++) {
        if (count[k] == 0) continue;
        len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s (%lld tensor%s)", len ? ", " : "",
                                type_name((uint32_t)k), (long long)count[k], count[k] == 1 ? "" : "s");
    }
    report_add(r, DFL_ERR_UNSUPPORTED, "unsupported tensor type%s %s", n_types == 1 ? "" : "s", list);
}

static dfl_status bind_all(dfl_model *m, dfl_error *err) {
    const gguf_file *f = m->gguf;
    dfl_hparams *hp = &m->hp;
    bind_report r;
    memset(&r, 0, sizeof(r));
    const bool drafter = hp->arch == DFL_ARCH_DFLASH;
    report_unsupported_types(f, &r);

    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    hp->n_vocab = te != NULL && te->n_dims >= 2 ? te->ne[1] : vocab_size_from_tokens(f);
    if (!drafter && hp->n_vocab <= 0) {
        return error_set(err, DFL_ERR_MISSING, "token_embd.weight: expected [%lld, n_vocab], missing",
                         (long long)hp->n_embd);
    }
    /* token ids come from the file's vocabulary: every one needs its embedding row and logit
     * (llama.cpp also requires the two counts to be equal) */
    const int64_t n_tokens = vocab_size_from_tokens(f);
    if (te != NULL && te->n_dims >= 2 && n_tokens > 0 && n_tokens != hp->n_vocab) {
        report_add(&r, DFL_ERR_MISMATCH, "the vocabulary has %lld tokens but token_embd.weight has %lld rows",
                   (long long)n_tokens, (long long)hp->n_vocab);
    }
    m->token_embd = bind(f, &r, "token_embd.weight", BIND_MATRIX, 2, hp->n_embd, hp->n_vocab, drafter);
    m->output_norm = bind(f, &r, "output_norm.weight", BIND_NORM, 1, hp->n_embd, 1, false);
    m->output = bind(f, &r, "output.weight", BIND_MATRIX, 2, hp->n_embd, hp->n_vocab, true);
    hp->has_token_embd = m->token_embd != NULL;
    hp->has_output = m->output != NULL;
    if (m->output == NULL && gguf_find_tensor(f, "output.weight") == NULL) {
        hp->tied_output = m->token_embd != NULL;
        m->output = m->token_embd;
    }
    if (drafter) {
        m->fc = bind(f, &r, "fc.weight", BIND_MATRIX, 2, hp->n_target_layers * hp->n_embd, hp->n_embd, false);
        m->enc_output_norm = bind(f, &r, "enc.output_norm.weight", BIND_NORM, 1, hp->n_embd, 1, false);
        bind_dspark(m, &r);
        refuse_unsupported_drafter_tensors(f, &r);
        hp->dspark = m->dspark.markov_w1 != NULL;
        hp->dspark_confidence = m->dspark.conf_proj != NULL;
        hp->n_draft_max = hp->dspark && m->dspark.anchor_first ? hp->block_size : hp->block_size - 1;
    }
    bind_layers(m, &r);
    if (r.n_problems > 0) {
        return error_set(err, r.code, "%s: %d tensor problem%s: %s", m->path, r.n_problems,
                         r.n_problems == 1 ? "" : "s", r.text);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        m->n_bytes += t->nbytes;
        m->n_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    return DFL_OK;
}

dfl_model *dfl_model_load(const char *path, const dfl_model_params *params, dfl_error *err) {
    error_clear(err);
    (void)params;
    dfl_model *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory loading %s", path);
        return NULL;
    }
    m->path = strdup(path);
    m->gguf = gguf_open(path, err);
    if (m->gguf == NULL || m->path == NULL) {
        if (m->path == NULL) error_set(err, DFL_ERR_NOMEM, "out of memory loading %s", path);
        dfl_model_free(m);
        return NULL;
    }
    gguf_str arch_s;
    dfl_error e2 = {0};
    if (gguf_get_str(m->gguf, "general.architecture", &arch_s, &e2) != DFL_OK) {
        error_set(err, e2.code == DFL_ERR_MISSING ? DFL_ERR_MISSING : e2.code, "%s: %s", path,
                  e2.code == DFL_ERR_MISSING ? "required key general.architecture is missing" : e2.msg);
        dfl_model_free(m);
        return NULL;
    }
    const char *arch;
    if (gguf_str_eq(arch_s, "qwen3")) {
        m->hp.arch = DFL_ARCH_QWEN3;
        arch = "qwen3";
    } else if (gguf_str_eq(arch_s, "llama")) {
        m->hp.arch = DFL_ARCH_LLAMA;
        arch = "llama";
    } else if (gguf_str_eq(arch_s, "dflash")) {
        m->hp.arch = DFL_ARCH_DFLASH;
        arch = "dflash";
    } else {
        error_set(err, DFL_ERR_UNSUPPORTED, "%s: architecture '%.*s' is not supported (expected qwen3, llama or dflash)",
                  path, (int)(arch_s.len > 64 ? 64 : arch_s.len), arch_s.ptr);
        dfl_model_free(m);
        return NULL;
    }
    m->hp.mask_token_id = -1;
    dfl_error e3 = {0};
    dfl_status st = load_hparams(m->gguf, arch, &m->hp, &e3);
    if (st == DFL_OK && m->hp.arch == DFL_ARCH_DFLASH) st = load_dflash_hparams(m->gguf, m, &e3);
    if (st != DFL_OK) {
        error_set(err, st, "%s: %s", path, e3.msg);
        dfl_model_free(m);
        return NULL;
    }
    m->layers = calloc((size_t)m->hp.n_layer, sizeof(model_layer));
    if (m->layers == NULL) {
        error_set(err, DFL_ERR_NOMEM, "%s: out of memory", path);
        dfl_model_free(m);
        return NULL;
    }
    if (bind_all(m, err) != DFL_OK) {
        dfl_model_free(m);
        return NULL;
    }
    /* DFlash2: the conv and selector part of a dflash file (model_dflash2.c) */
    if (m->hp.arch == DFL_ARCH_DFLASH && model_dflash2_load(m, err) != DFL_OK) {
        dfl_model_free(m);
        return NULL;
    }
    return m;
}

void dfl_model_free(dfl_model *model) {
    if (model == NULL) return;
    gguf_close(model->gguf);
    free(model->dflash.swa_layer);
    model_dflash2_free(model->d2);
    free(model->layers);
    free(model->path);
    free(model);
}
