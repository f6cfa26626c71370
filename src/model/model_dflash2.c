/* model_dflash2.c: the DFlash2 part of a dflash drafter file (docs/drafter.md, "DFlash2"): the
 * keys dflash.conv_kernel_size / conv_group_size / selector_rank / selector_top_k and the tensors
 * blk.N.{attn,ffn}_conv_{base,proj}, selector_{predecessor,successor,hidden}, checked as llama.cpp
 * checks them (every key present and positive, n_embd divisible by the group size, n_embd large
 * enough for the packed lattice row) plus shape and type. Every problem names the key or tensor. */
#include "model/model.h"
#include "base/error.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D2_MAX_KERNEL 64
#define D2_MAX_TOP_K 64
#define D2_MAX_RANK 65536

void model_dflash2_free(model_dflash2 *d2) {
    if (d2 == NULL) return;
    free(d2->layers);
    free(d2);
}

/* Reads a required DFlash2 key into *out within [lo, hi]. */
static dfl_status d2_key(const dfl_model *m, const char *key, int64_t lo, int64_t hi, int64_t *out, dfl_error *err) {
    int64_t v = 0;
    dfl_error e2 = {0};
    dfl_status st = gguf_get_int(m->gguf, key, &v, &e2);
    if (st == DFL_ERR_MISSING) {
        return error_set(err, DFL_ERR_MISSING, "%s: DFlash2 drafter (selector_hidden.weight present) needs key %s, missing",
                         m->path, key);
    }
    if (st != DFL_OK) return error_set(err, st, "%s: DFlash2: %s", m->path, e2.msg);
    if (v < lo || v > hi) {
        return error_set(err, DFL_ERR_FORMAT, "%s: DFlash2: key %s = %lld is out of range [%lld, %lld]", m->path, key,
                         (long long)v, (long long)lo, (long long)hi);
    }
    *out = v;
    return DFL_OK;
}

/* Binds tensor `name` of shape [ne0, ne1, ne2] (trailing 1s optional). norm: f32/f16/bf16 only;
 * else any type we can compute with. Appends a problem to msg (cap) and returns NULL if it is
 * missing or mismatched. */
static const gguf_tensor *d2_bind(const dfl_model *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                                  bool norm, char *msg, size_t cap, int *n_bad) {
    const gguf_tensor *t = gguf_find_tensor(m->gguf, name);
    const int n_want = ne2 > 1 ? 3 : 2;
    char want[64];
    if (n_want == 3) snprintf(want, sizeof(want), "[%lld, %lld, %lld]", (long long)ne0, (long long)ne1, (long long)ne2);
    else snprintf(want, sizeof(want), "[%lld, %lld]", (long long)ne0, (long long)ne1);
    const char *types = norm ? "f32|f16|bf16" : "a matrix type";
    size_t len = strlen(msg);
    if (t == NULL) {
        if ((*n_bad)++ < 6 && len < cap) snprintf(msg + len, cap - len, "%s%s: expected %s, missing", len ? "; " : "", name, want);
        return NULL;
    }
    int dims = (int)t->n_dims;
    while (dims > n_want && t->ne[dims - 1] == 1) dims--;
    const bool shape_ok = dims <= n_want && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == ne2 && t->ne[3] == 1;
    const quant_type_info *ti = quant_type_get(t->type);
    const bool type_ok = norm ? (t->type == QUANT_TYPE_F32 || t->type == QUANT_TYPE_F16 || t->type == QUANT_TYPE_BF16)
                              : (ti != NULL && ti->can_dequantize);
    if (!shape_ok || !type_ok) {
        if ((*n_bad)++ < 6 && len < cap) {
            snprintf(msg + len, cap - len, "%s%s: expected %s type %s, found [%lld, %lld, %lld] type %s", len ? "; " : "",
                     name, want, types, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                     ti != NULL ? ti->name : "unknown");
        }
        return NULL;
    }
    return t;
}

/* A DFlash2 key or tensor name present in a file that has no selector_hidden.weight (NULL if none). */
static const char *d2_stray(const dfl_model *m) {
    static const char *const keys[] = {"dflash.conv_kernel_size", "dflash.conv_group_size", "dflash.selector_rank",
                                       "dflash.selector_top_k"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (gguf_find_kv(m->gguf, keys[i]) != NULL) return keys[i];
    }
    if (gguf_find_tensor(m->gguf, "selector_predecessor.weight") != NULL) return "selector_predecessor.weight";
    if (gguf_find_tensor(m->gguf, "selector_successor.weight") != NULL) return "selector_successor.weight";
    if (gguf_find_tensor(m->gguf, "blk.0.attn_conv_proj.weight") != NULL) return "blk.0.attn_conv_proj.weight";
    return NULL;
}

dfl_status model_dflash2_load(dfl_model *m, dfl_error *err) {
    m->d2 = NULL;
    if (gguf_find_tensor(m->gguf, "selector_hidden.weight") == NULL) {
        const char *stray = d2_stray(m);
        if (stray != NULL) {
            return error_set(err, DFL_ERR_MISSING,
                             "%s: has the DFlash2 part %s but no selector_hidden.weight [n_embd, selector_rank]", m->path,
                             stray);
        }
        return DFL_OK;
    }
    const dfl_hparams *hp = &m->hp;
    if (gguf_find_kv(m->gguf, "dflash.block_size") == NULL) {
        return error_set(err, DFL_ERR_MISSING, "%s: DFlash2 drafter (selector_hidden.weight present) needs key "
                         "dflash.block_size, missing", m->path);
    }
    model_dflash2 *d2 = calloc(1, sizeof(*d2));
    if (d2 == NULL) return error_set(err, DFL_ERR_NOMEM, "%s: out of memory", m->path);
    dfl_status st;
    if ((st = d2_key(m, "dflash.conv_kernel_size", 1, D2_MAX_KERNEL, &d2->conv_kernel, err)) ||
        (st = d2_key(m, "dflash.conv_group_size", 1, hp->n_embd, &d2->conv_group, err)) ||
        (st = d2_key(m, "dflash.selector_rank", 1, D2_MAX_RANK, &d2->rank, err)) ||
        (st = d2_key(m, "dflash.selector_top_k", 1, D2_MAX_TOP_K, &d2->top_k, err))) {
        model_dflash2_free(d2);
        return st;
    }
    if (hp->n_embd % d2->conv_group != 0) {
        st = error_set(err, DFL_ERR_FORMAT, "%s: DFlash2: n_embd %lld is not divisible by dflash.conv_group_size %lld",
                       m->path, (long long)hp->n_embd, (long long)d2->conv_group);
        model_dflash2_free(d2);
        return st;
    }
    if (hp->n_embd < d2->top_k * (d2->top_k + 1)) {
        st = error_set(err, DFL_ERR_FORMAT, "%s: DFlash2: n_embd %lld is too small for the selector lattice of "
                       "dflash.selector_top_k %lld (needs n_embd >= k * (k + 1) = %lld)", m->path, (long long)hp->n_embd,
                       (long long)d2->top_k, (long long)(d2->top_k * (d2->top_k + 1)));
        model_dflash2_free(d2);
        return st;
    }
    if (d2->top_k > hp->n_vocab) {
        st = error_set(err, DFL_ERR_FORMAT, "%s: DFlash2: dflash.selector_top_k %lld exceeds the vocabulary (%lld)",
                       m->path, (long long)d2->top_k, (long long)hp->n_vocab);
        model_dflash2_free(d2);
        return st;
    }
    d2->layers = calloc((size_t)hp->n_layer, sizeof(model_dflash2_layer));
    if (d2->layers == NULL) {
        model_dflash2_free(d2);
        return error_set(err, DFL_ERR_NOMEM, "%s: out of memory", m->path);
    }
    const int64_t E = hp->n_embd, K = d2->conv_kernel, G = hp->n_embd / d2->conv_group, R = d2->rank;
    char msg[700] = "";
    int n_bad = 0;
    d2->sel_pred = d2_bind(m, "selector_predecessor.weight", R, hp->n_vocab, 1, false, msg, sizeof(msg), &n_bad);
    d2->sel_succ = d2_bind(m, "selector_successor.weight", R, hp->n_vocab, 1, false, msg, sizeof(msg), &n_bad);
    d2->sel_hidden = d2_bind(m, "selector_hidden.weight", E, R, 1, false, msg, sizeof(msg), &n_bad);
    char name[96];
    for (int64_t il = 0; il < hp->n_layer; il++) {
        model_dflash2_layer *L = &d2->layers[il];
#define NAME(s) (snprintf(name, sizeof(name), "blk.%lld." s, (long long)il), name)
        L->attn_conv_base = d2_bind(m, NAME("attn_conv_base"), E, K, 2, true, msg, sizeof(msg), &n_bad);
        L->attn_conv_proj = d2_bind(m, NAME("attn_conv_proj.weight"), E, 2 * K * G, 1, false, msg, sizeof(msg), &n_bad);
        L->ffn_conv_base = d2_bind(m, NAME("ffn_conv_base"), E, K, 2, true, msg, sizeof(msg), &n_bad);
        L->ffn_conv_proj = d2_bind(m, NAME("ffn_conv_proj.weight"), E, 2 * K * G, 1, false, msg, sizeof(msg), &n_bad);
#undef NAME
    }
    if (n_bad > 0) {
        st = error_set(err, DFL_ERR_MISMATCH, "%s: DFlash2: %d tensor problem%s: %s%s", m->path, n_bad, n_bad == 1 ? "" : "s",
                       msg, n_bad > 6 ? "; ..." : "");
        model_dflash2_free(d2);
        return st;
    }
    m->d2 = d2;
    return DFL_OK;
}
