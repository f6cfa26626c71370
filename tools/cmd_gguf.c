/* cmd_gguf.c: `dflash gguf PATH [--json]`: architecture, hparams, tokenizer summary, all keys,
 * the tensor table (name, type, shape, bytes) and totals; then whether dflash can bind it as a model. */
#include "cmds.h"
#include "base/jsonw.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef struct tok_summary {
    const char *model; size_t model_len;
    const char *pre; size_t pre_len;
    int64_t n_tokens, n_merges;
    int64_t n_type[7]; /* counts by token type 0..6 */
    int64_t chat_template_bytes; /* -1 if none */
} tok_summary;

static const char *k_special_keys[] = {
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id", "tokenizer.ggml.add_bos_token",
};

static void summarize_tokenizer(const gguf_file *f, tok_summary *s) {
    memset(s, 0, sizeof(*s));
    s->chat_template_bytes = -1;
    const gguf_kv *kv;
    if ((kv = gguf_find_kv(f, "tokenizer.ggml.model")) && kv->type == GGUF_TYPE_STRING) {
        s->model = kv->val.str.ptr; s->model_len = (size_t)kv->val.str.len;
    }
    if ((kv = gguf_find_kv(f, "tokenizer.ggml.pre")) && kv->type == GGUF_TYPE_STRING) {
        s->pre = kv->val.str.ptr; s->pre_len = (size_t)kv->val.str.len;
    }
    if ((kv = gguf_find_kv(f, "tokenizer.ggml.tokens")) && kv->type == GGUF_TYPE_ARRAY) s->n_tokens = (int64_t)kv->arr_n;
    if ((kv = gguf_find_kv(f, "tokenizer.ggml.merges")) && kv->type == GGUF_TYPE_ARRAY) s->n_merges = (int64_t)kv->arr_n;
    if ((kv = gguf_find_kv(f, "tokenizer.ggml.token_type")) && kv->type == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            int64_t t = 0;
            if (gguf_arr_int(kv, i, &t) && t >= 0 && t < 7) s->n_type[t]++;
        }
    }
    if ((kv = gguf_find_kv(f, "tokenizer.chat_template")) && kv->type == GGUF_TYPE_STRING) {
        s->chat_template_bytes = (int64_t)kv->val.str.len;
    }
}

static void shape_text(char *buf, size_t cap, const gguf_tensor *t) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < t->n_dims && n < cap; d++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? ", " : "", t->ne[d]);
    }
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static const char *tensor_type_name(uint32_t type) {
    const quant_type_info *ti = quant_type_get(type);
    return ti ? ti->name : "?";
}

/* A scalar KV as text (arrays and long strings summarized). */
static void kv_value_text(const gguf_kv *kv, char *buf, size_t cap) {
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        snprintf(buf, cap, "%" PRIu64, kv->val.u64); break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        snprintf(buf, cap, "%" PRId64, kv->val.i64); break;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64:
        snprintf(buf, cap, "%g", kv->val.f64); break;
    case GGUF_TYPE_BOOL:
        snprintf(buf, cap, "%s", kv->val.u64 ? "true" : "false"); break;
    case GGUF_TYPE_STRING: {
        size_t n = 0;
        int shown = 0;
        buf[n++] = '"';
        for (uint64_t i = 0; i < kv->val.str.len && n + 8 < cap && shown < 60; i++, shown++) {
            char c = kv->val.str.ptr[i];
            if (c == '\n') { buf[n++] = '\\'; buf[n++] = 'n'; }
            else if ((unsigned char)c < 0x20) buf[n++] = '?';
            else buf[n++] = c;
        }
        if (kv->val.str.len > 60) n += (size_t)snprintf(buf + n, cap - n, "...\" (%" PRIu64 " bytes)", kv->val.str.len);
        else { buf[n++] = '"'; buf[n] = '\0'; }
        break;
    }
    case GGUF_TYPE_ARRAY: {
        size_t n = (size_t)snprintf(buf, cap, "[%s x %" PRIu64 "]", gguf_type_name(kv->arr_type), kv->arr_n);
        if (kv->arr_n <= 16 && kv->arr_type != GGUF_TYPE_STRING && kv->arr_type != GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < kv->arr_n && n < cap; i++) {
                int64_t iv; double dv;
                if (gguf_arr_int(kv, i, &iv)) n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? "," : " ", iv);
                else if (gguf_arr_float(kv, i, &dv)) n += (size_t)snprintf(buf + n, cap - n, "%s%g", i ? "," : " ", dv);
            }
        }
        break;
    }
    default: snprintf(buf, cap, "?"); break;
    }
}

static void kv_value_json(jsonw *w, const gguf_kv *kv) {
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        jsonw_uint(w, kv->val.u64); break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        jsonw_int(w, kv->val.i64); break;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: jsonw_double(w, kv->val.f64); break;
    case GGUF_TYPE_BOOL: jsonw_bool(w, kv->val.u64 != 0); break;
    case GGUF_TYPE_STRING: jsonw_strn(w, kv->val.str.ptr, (size_t)kv->val.str.len); break;
    case GGUF_TYPE_ARRAY:
        jsonw_obj_begin(w);
        jsonw_key(w, "array_type"); jsonw_str(w, gguf_type_name(kv->arr_type));
        jsonw_key(w, "count"); jsonw_uint(w, kv->arr_n);
        if (kv->arr_n <= 64 && kv->arr_type != GGUF_TYPE_ARRAY) {
            jsonw_key(w, "values");
            jsonw_arr_begin(w);
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                int64_t iv; double dv; gguf_str sv;
                if (gguf_arr_int(kv, i, &iv)) jsonw_int(w, iv);
                else if (gguf_arr_float(kv, i, &dv)) jsonw_double(w, dv);
                else if (gguf_arr_str(kv, i, &sv)) jsonw_strn(w, sv.ptr, (size_t)sv.len);
                else jsonw_null(w);
            }
            jsonw_arr_end(w);
        }
        jsonw_obj_end(w);
        break;
    default: jsonw_null(w); break;
    }
}

static void print_hparams_text(const dfl_hparams *hp) {
    printf("hparams:\n");
    printf("  n_layer %" PRId64 ", n_embd %" PRId64 ", n_ff %" PRId64 ", n_head %" PRId64 ", n_head_kv %" PRId64
           ", head_dim %" PRId64 "/%" PRId64 ", n_vocab %" PRId64 "\n",
           hp->n_layer, hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->n_embd_head_k, hp->n_embd_head_v,
           hp->n_vocab);
    printf("  n_ctx_train %" PRId64 ", rms_eps %g, rope_freq_base %g, output head %s\n", hp->n_ctx_train,
           (double)hp->norm_eps, (double)hp->rope_freq_base,
           hp->arch == DFL_ARCH_DFLASH ? (hp->has_output ? "own" : "target's") : (hp->tied_output ? "tied to token_embd" : "output.weight"));
    if (hp->arch == DFL_ARCH_DFLASH) {
        printf("  drafter: block_size %" PRId64 ", target_layers [", hp->block_size);
        for (int64_t i = 0; i < hp->n_target_layers; i++) printf("%s%d", i ? ", " : "", hp->target_layers[i]);
        printf("], mask_token_id %" PRId64 ", attention %s, token_embd %s\n", hp->mask_token_id,
               hp->causal ? "causal" : "non-causal", hp->has_token_embd ? "own" : "target's");
        if (hp->dspark) {
            printf("  DSpark: Markov head, %s, drafts per block up to %" PRId64 " (%s)\n",
                   hp->dspark_confidence ? "confidence head" : "no confidence head", hp->n_draft_max,
                   hp->n_draft_max == hp->block_size ? "anchor-first" : "bonus anchor");
        }
    }
}

static void print_hparams_json(jsonw *w, const dfl_hparams *hp) {
    jsonw_obj_begin(w);
    jsonw_key(w, "n_layer"); jsonw_int(w, hp->n_layer);
    jsonw_key(w, "n_ctx_train"); jsonw_int(w, hp->n_ctx_train);
    jsonw_key(w, "n_embd"); jsonw_int(w, hp->n_embd);
    jsonw_key(w, "n_ff"); jsonw_int(w, hp->n_ff);
    jsonw_key(w, "n_head"); jsonw_int(w, hp->n_head);
    jsonw_key(w, "n_head_kv"); jsonw_int(w, hp->n_head_kv);
    jsonw_key(w, "head_dim_k"); jsonw_int(w, hp->n_embd_head_k);
    jsonw_key(w, "head_dim_v"); jsonw_int(w, hp->n_embd_head_v);
    jsonw_key(w, "n_vocab"); jsonw_int(w, hp->n_vocab);
    jsonw_key(w, "rms_eps"); jsonw_double(w, hp->norm_eps);
    jsonw_key(w, "rope_freq_base"); jsonw_double(w, hp->rope_freq_base);
    jsonw_key(w, "tied_output"); jsonw_bool(w, hp->tied_output);
    if (hp->arch == DFL_ARCH_DFLASH) {
        jsonw_key(w, "block_size"); jsonw_int(w, hp->block_size);
        jsonw_key(w, "target_layers");
        jsonw_arr_begin(w);
        for (int64_t i = 0; i < hp->n_target_layers; i++) jsonw_int(w, hp->target_layers[i]);
        jsonw_arr_end(w);
        jsonw_key(w, "mask_token_id"); jsonw_int(w, hp->mask_token_id);
        jsonw_key(w, "causal"); jsonw_bool(w, hp->causal);
        jsonw_key(w, "n_draft_max"); jsonw_int(w, hp->n_draft_max);
        jsonw_key(w, "dspark"); jsonw_bool(w, hp->dspark);
        jsonw_key(w, "dspark_confidence"); jsonw_bool(w, hp->dspark_confidence);
    }
    jsonw_obj_end(w);
}

static int usage(void) {
    fprintf(stderr, "usage: dflash gguf PATH [--json]\n"
                    "  prints the architecture, hparams, tokenizer summary, keys, tensor table and totals\n");
    return 2;
}

int cmd_gguf(int argc, char **argv) {
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = true;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) { usage(); return 0; }
        else if (argv[i][0] == '-' && argv[i][1] != '\0') { fprintf(stderr, "dflash gguf: unknown option %s\n", argv[i]); return usage(); }
        else if (path == NULL) path = argv[i];
        else return usage();
    }
    if (path == NULL) return usage();

    dfl_error err = {0};
    gguf_file *f = gguf_open(path, &err);
    if (f == NULL) {
        fprintf(stderr, "dflash gguf: %s\n", err.msg);
        return 1;
    }
    /* bind as a model when the architecture is one of ours (reported, not required) */
    const gguf_kv *arch_kv = gguf_find_kv(f, "general.architecture");
    dfl_error merr = {0};
    dfl_model *model = NULL;
    bool ours = arch_kv != NULL && arch_kv->type == GGUF_TYPE_STRING &&
                (gguf_str_eq(arch_kv->val.str, "qwen3") || gguf_str_eq(arch_kv->val.str, "llama") ||
                 gguf_str_eq(arch_kv->val.str, "dflash"));
    bool model_ok = false;
    if (arch_kv != NULL) {
        model = dfl_model_load(path, NULL, &merr);
        model_ok = model != NULL;
        /* a target is used with its own vocabulary: the same checks as `generate` when it loads */
        if (model != NULL && dfl_model_hparams(model)->arch != DFL_ARCH_DFLASH) {
            dfl_vocab *voc = dfl_vocab_load(path, &merr);
            model_ok = voc != NULL;
            dfl_vocab_free(voc);
        }
    } else {
        merr.code = DFL_ERR_MISSING;
        snprintf(merr.msg, sizeof(merr.msg), "general.architecture is missing");
    }

    tok_summary tok;
    summarize_tokenizer(f, &tok);
    uint64_t total_bytes = 0, total_params = 0;
    uint64_t bytes_by_type[QUANT_TYPE_COUNT] = {0};
    int64_t n_by_type[QUANT_TYPE_COUNT] = {0};
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        total_bytes += t->nbytes;
        total_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        if (t->type < QUANT_TYPE_COUNT) { bytes_by_type[t->type] += t->nbytes; n_by_type[t->type]++; }
    }

    if (json) {
        jsonw w;
        jsonw_init(&w, stdout);
        jsonw_obj_begin(&w);
        jsonw_key(&w, "path"); jsonw_str(&w, path);
        jsonw_key(&w, "file_size"); jsonw_uint(&w, gguf_file_size(f));
        jsonw_key(&w, "version"); jsonw_uint(&w, gguf_version(f));
        jsonw_key(&w, "alignment"); jsonw_uint(&w, gguf_alignment(f));
        jsonw_key(&w, "data_offset"); jsonw_uint(&w, gguf_data_offset(f));
        jsonw_key(&w, "architecture");
        if (arch_kv && arch_kv->type == GGUF_TYPE_STRING) jsonw_strn(&w, arch_kv->val.str.ptr, (size_t)arch_kv->val.str.len);
        else jsonw_null(&w);
        jsonw_key(&w, "model_ok"); jsonw_bool(&w, model_ok);
        if (!model_ok) { jsonw_key(&w, "model_error"); jsonw_str(&w, merr.msg); }
        if (model != NULL) { jsonw_key(&w, "hparams"); print_hparams_json(&w, dfl_model_hparams(model)); }
        jsonw_key(&w, "unsupported_types");
        jsonw_arr_begin(&w);
        for (int k = 0; k < QUANT_TYPE_COUNT; k++) {
            if (n_by_type[k] > 0 && !quant_type_get((uint32_t)k)->can_dequantize) jsonw_str(&w, tensor_type_name((uint32_t)k));
        }
        jsonw_arr_end(&w);
        jsonw_key(&w, "tokenizer");
        jsonw_obj_begin(&w);
        jsonw_key(&w, "model"); if (tok.model) jsonw_strn(&w, tok.model, tok.model_len); else jsonw_null(&w);
        jsonw_key(&w, "pre"); if (tok.pre) jsonw_strn(&w, tok.pre, tok.pre_len); else jsonw_null(&w);
        jsonw_key(&w, "n_tokens"); jsonw_int(&w, tok.n_tokens);
        jsonw_key(&w, "n_merges"); jsonw_int(&w, tok.n_merges);
        jsonw_key(&w, "n_control"); jsonw_int(&w, tok.n_type[3]);
        jsonw_key(&w, "n_user_defined"); jsonw_int(&w, tok.n_type[4]);
        jsonw_key(&w, "n_unused"); jsonw_int(&w, tok.n_type[5]);
        jsonw_key(&w, "chat_template_bytes"); jsonw_int(&w, tok.chat_template_bytes);
        for (size_t k = 0; k < sizeof(k_special_keys) / sizeof(k_special_keys[0]); k++) {
            const gguf_kv *kv = gguf_find_kv(f, k_special_keys[k]);
            if (kv) { jsonw_key(&w, k_special_keys[k] + strlen("tokenizer.ggml.")); kv_value_json(&w, kv); }
        }
        jsonw_obj_end(&w);
        jsonw_key(&w, "kv");
        jsonw_obj_begin(&w);
        for (int64_t i = 0; i < gguf_n_kv(f); i++) {
            const gguf_kv *kv = gguf_kv_at(f, i);
            char key[512];
            snprintf(key, sizeof(key), "%.*s", (int)(kv->key.len > 500 ? 500 : kv->key.len), kv->key.ptr);
            jsonw_key(&w, key);
            kv_value_json(&w, kv);
        }
        jsonw_obj_end(&w);
        jsonw_key(&w, "tensors");
        jsonw_arr_begin(&w);
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            jsonw_obj_begin(&w);
            jsonw_key(&w, "name"); jsonw_strn(&w, t->name.ptr, (size_t)t->name.len);
            jsonw_key(&w, "type"); jsonw_str(&w, tensor_type_name(t->type));
            jsonw_key(&w, "shape");
            jsonw_arr_begin(&w);
            for (uint32_t d = 0; d < t->n_dims; d++) jsonw_int(&w, t->ne[d]);
            jsonw_arr_end(&w);
            jsonw_key(&w, "offset"); jsonw_uint(&w, t->offset);
            jsonw_key(&w, "bytes"); jsonw_uint(&w, t->nbytes);
            jsonw_obj_end(&w);
        }
        jsonw_arr_end(&w);
        jsonw_key(&w, "n_tensors"); jsonw_int(&w, gguf_n_tensors(f));
        jsonw_key(&w, "n_params"); jsonw_uint(&w, total_params);
        jsonw_key(&w, "tensor_bytes"); jsonw_uint(&w, total_bytes);
        jsonw_obj_end(&w);
        fputc('\n', stdout);
    } else {
        printf("file: %s (%" PRIu64 " bytes), GGUF v%u, alignment %" PRIu64 ", %" PRId64 " keys, %" PRId64 " tensors\n",
               path, gguf_file_size(f), gguf_version(f), gguf_alignment(f), gguf_n_kv(f), gguf_n_tensors(f));
        printf("architecture: %.*s\n", arch_kv && arch_kv->type == GGUF_TYPE_STRING ? (int)arch_kv->val.str.len : 9,
               arch_kv && arch_kv->type == GGUF_TYPE_STRING ? arch_kv->val.str.ptr : "(missing)");
        if (model != NULL) print_hparams_text(dfl_model_hparams(model));
        printf("tokenizer: model %.*s, pre %.*s, %" PRId64 " tokens (%" PRId64 " control, %" PRId64 " user-defined, %" PRId64
               " unused), %" PRId64 " merges, chat template %s\n",
               tok.model ? (int)tok.model_len : 4, tok.model ? tok.model : "none", tok.pre ? (int)tok.pre_len : 4,
               tok.pre ? tok.pre : "none", tok.n_tokens, tok.n_type[3], tok.n_type[4], tok.n_type[5], tok.n_merges,
               tok.chat_template_bytes >= 0 ? "yes" : "no");
        printf("  special:");
        for (size_t k = 0; k < sizeof(k_special_keys) / sizeof(k_special_keys[0]); k++) {
            const gguf_kv *kv = gguf_find_kv(f, k_special_keys[k]);
            if (kv) { char v[64]; kv_value_text(kv, v, sizeof(v)); printf(" %s=%s", k_special_keys[k] + strlen("tokenizer.ggml."), v); }
        }
        printf("\nkeys:\n");
        for (int64_t i = 0; i < gguf_n_kv(f); i++) {
            const gguf_kv *kv = gguf_kv_at(f, i);
            char v[256];
            kv_value_text(kv, v, sizeof(v));
            printf("  %-44.*s %-7s %s\n", (int)(kv->key.len > 200 ? 200 : kv->key.len), kv->key.ptr, gguf_type_name(kv->type), v);
        }
        printf("tensors:\n  %-40s %-6s %-22s %14s\n", "name", "type", "shape", "bytes");
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            char shape[96];
            shape_text(shape, sizeof(shape), t);
            printf("  %-40.*s %-6s %-22s %14" PRIu64 "\n", (int)t->name.len, t->name.ptr, tensor_type_name(t->type), shape,
                   t->nbytes);
        }
        printf("totals: %" PRId64 " tensors, %" PRIu64 " parameters (%.2f M), %" PRIu64 " bytes (%.2f MiB)\n",
               gguf_n_tensors(f), total_params, (double)total_params / 1e6, total_bytes, (double)total_bytes / 1048576.0);
        for (int k = 0; k < QUANT_TYPE_COUNT; k++) {
            if (n_by_type[k] > 0) {
                printf("  %-6s %5" PRId64 " tensors %14" PRIu64 " bytes\n", tensor_type_name((uint32_t)k), n_by_type[k], bytes_by_type[k]);
            }
        }
        int n_unsupported = 0;
        for (int k = 0; k < QUANT_TYPE_COUNT; k++) {
            if (n_by_type[k] == 0 || quant_type_get((uint32_t)k)->can_dequantize) continue;
            printf("%s %s (%" PRId64 " tensor%s)", n_unsupported++ ? "," : "unsupported tensor types:",
                   tensor_type_name((uint32_t)k), n_by_type[k], n_by_type[k] == 1 ? "" : "s");
        }
        if (n_unsupported > 0) printf("\n");
        if (model_ok) printf("model: ok (dflash can load it as %s)\n", dfl_arch_name(dfl_model_hparams(model)->arch));
        else printf("model: not loadable by dflash: %s\n", merr.msg);
    }
    /* a model of an architecture we support that fails to bind is an error; other GGUFs are fine */
    int rc = (ours && !model_ok) ? 1 : 0;
    if (rc != 0 && !json) fprintf(stderr, "dflash gguf: %s\n", merr.msg);
    dfl_model_free(model);
    gguf_close(f);
    return rc;
}
