/* vocab_gguf.c: a vocabulary from the tokenizer.ggml.* keys of a GGUF file (as llama.cpp's
 * converter writes them), and dfl_vocab_load for a file path. */
#include "vocab/vocab.h"

#include "base/error.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* optional integer key -> token id; absent leaves *id unchanged */
static dfl_status get_id(const gguf_file *f, const char *key, int32_t *id, dfl_error *err) {
    if (gguf_find_kv(f, key) == NULL) return DFL_OK;
    int64_t v;
    dfl_status st = gguf_get_int(f, key, &v, err);
    if (st != DFL_OK) return st;
    if (v < -1 || v > INT32_MAX) return error_set(err, DFL_ERR_FORMAT, "%s = %lld is not a token id", key, (long long)v);
    *id = (int32_t)v;
    return DFL_OK;
}

static dfl_status get_flag(const gguf_file *f, const char *key, bool *out, dfl_error *err) {
    if (gguf_find_kv(f, key) == NULL) return DFL_OK;
    return gguf_get_bool(f, key, out, err);
}

/* the strings of a STRING array as pointer + length arrays */
static dfl_status get_strings(const gguf_kv *kv, const char *key, const char ***ptrs, size_t **lens, dfl_error *err) {
    *ptrs = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof(char *));
    *lens = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof(size_t));
    if (*ptrs == NULL || *lens == NULL) return error_set(err, DFL_ERR_NOMEM, "%s: out of memory", key);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        gguf_str s;
        if (!gguf_arr_str(kv, i, &s)) return error_set(err, DFL_ERR_FORMAT, "%s[%llu] is not a string", key, (unsigned long long)i);
        (*ptrs)[i] = s.ptr;
        (*lens)[i] = (size_t)s.len;
    }
    return DFL_OK;
}

dfl_vocab *vocab_load_gguf(const gguf_file *f, dfl_error *err) {
    gguf_str model;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, err) != DFL_OK) return NULL;
    if (!gguf_str_eq(model, "gpt2")) {
        error_set(err, DFL_ERR_UNSUPPORTED,
                  "tokenizer.ggml.model is '%.*s': dflash supports 'gpt2' (byte-level BPE) vocabularies only",
                  (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return NULL;
    }
    vocab_desc d = vocab_desc_default();
    char pre[128] = "";
    if (gguf_find_kv(f, "tokenizer.ggml.pre") != NULL) {
        gguf_str s;
        if (gguf_get_str(f, "tokenizer.ggml.pre", &s, err) != DFL_OK) return NULL;
        size_t n = s.len < sizeof(pre) - 1 ? (size_t)s.len : sizeof(pre) - 1;
        memcpy(pre, s.ptr, n);
        pre[n] = '\0';
        if (memchr(pre, '\0', n) != NULL || s.len >= sizeof(pre)) {
            error_set(err, DFL_ERR_UNSUPPORTED, "tokenizer.ggml.pre '%s...' is not supported", pre);
            return NULL;
        }
        d.pre = pre;
    }
    const gguf_kv *tokens_kv = NULL, *merges_kv = NULL, *types_kv = NULL;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens_kv, err) != DFL_OK) return NULL;
    if (gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges_kv, err) != DFL_OK) return NULL;
    if (gguf_find_kv(f, "tokenizer.ggml.token_type") != NULL &&
        gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_COUNT, &types_kv, err) != DFL_OK) {
        return NULL;
    }
    if (types_kv != NULL && types_kv->arr_n != tokens_kv->arr_n) {
        error_set(err, DFL_ERR_MISMATCH, "tokenizer.ggml.token_type has %llu entries for %llu tokens",
                  (unsigned long long)types_kv->arr_n, (unsigned long long)tokens_kv->arr_n);
        return NULL;
    }
    if (get_id(f, "tokenizer.ggml.bos_token_id", &d.bos, err) != DFL_OK ||
        get_id(f, "tokenizer.ggml.eos_token_id", &d.eos, err) != DFL_OK ||
        get_id(f, "tokenizer.ggml.eot_token_id", &d.eot, err) != DFL_OK ||
        get_id(f, "tokenizer.ggml.padding_token_id", &d.pad, err) != DFL_OK ||
        get_id(f, "tokenizer.ggml.mask_token_id", &d.mask, err) != DFL_OK ||
        get_flag(f, "tokenizer.ggml.add_bos_token", &d.add_bos, err) != DFL_OK ||
        get_flag(f, "tokenizer.ggml.add_eos_token", &d.add_eos, err) != DFL_OK) {
        return NULL;
    }
    const char **tok = NULL, **mer = NULL;
    size_t *tok_len = NULL, *mer_len = NULL;
    int32_t *types = NULL;
    dfl_vocab *v = NULL;
    if (get_strings(tokens_kv, "tokenizer.ggml.tokens", &tok, &tok_len, err) != DFL_OK) goto done;
    if (get_strings(merges_kv, "tokenizer.ggml.merges", &mer, &mer_len, err) != DFL_OK) goto done;
    if (types_kv != NULL) {
        types = malloc((types_kv->arr_n ? types_kv->arr_n : 1) * sizeof(int32_t));
        if (types == NULL) {
            error_set(err, DFL_ERR_NOMEM, "tokenizer.ggml.token_type: out of memory");
            goto done;
        }
        for (uint64_t i = 0; i < types_kv->arr_n; i++) {
            int64_t t;
            if (!gguf_arr_int(types_kv, i, &t) || t < INT32_MIN || t > INT32_MAX) {
                error_set(err, DFL_ERR_FORMAT, "tokenizer.ggml.token_type[%llu] is not an integer token type",
                          (unsigned long long)i);
                goto done;
            }
            types[i] = (int32_t)t;
        }
    }
    d.n_tokens = (int64_t)tokens_kv->arr_n;
    d.tokens = tok;
    d.token_lens = tok_len;
    d.types = types;
    d.n_merges = (int64_t)merges_kv->arr_n;
    d.merges = mer;
    d.merge_lens = mer_len;
    v = vocab_new(&d, err);
done:
    free(tok);
    free(tok_len);
    free(mer);
    free(mer_len);
    free(types);
    return v;
}

dfl_vocab *dfl_model_vocab_new(const dfl_model *model, dfl_error *err) {
    error_clear(err);
    if (model == NULL) {
        error_set(err, DFL_ERR_INVALID, "vocabulary: no model");
        return NULL;
    }
    return vocab_load_gguf(model_gguf(model), err);
}

dfl_vocab *dfl_vocab_load(const char *path, dfl_error *err) {
    error_clear(err);
    if (path == NULL) {
        error_set(err, DFL_ERR_INVALID, "vocabulary: no path");
        return NULL;
    }
    gguf_file *f = gguf_open(path, err);
    if (f == NULL) return NULL;
    dfl_vocab *v = vocab_load_gguf(f, err);
    if (v == NULL && err != NULL && strstr(err->msg, path) == NULL) {
        /* say which file */
        char msg[sizeof(err->msg)];
        snprintf(msg, sizeof(msg), "%.200s: %.800s", path, err->msg);
        memcpy(err->msg, msg, sizeof(msg));
    }
    gguf_close(f);
    return v;
}
