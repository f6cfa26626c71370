/* cmd_quantize.c: `dflash quantize [--pure] IN.gguf OUT.gguf TYPE` (llama-quantize's habit):
 * copies a model's metadata and re-encodes its matrix weights with the per-tensor types of
 * llama-quantize's file type TYPE (src/quant/quant_preset.c), without an importance matrix;
 * norms stay as they are. Works for targets and DFlash drafters alike. */
#include "cmds.h"
#include "base/error.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant/quant_preset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: dflash quantize [--pure] IN.gguf OUT.gguf TYPE\n"
                    "  TYPE: a llama-quantize file type: Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q3_K_S, Q3_K_M, Q3_K_L, Q2_K,\n"
                    "        Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, F16, BF16, F32 (case-insensitive;\n"
                    "        Q3_K, Q4_K, Q5_K mean the _M ones). Matrix weights get llama-quantize's per-tensor\n"
                    "        types and fallbacks (docs/quantization.md); norms and metadata are copied.\n"
                    "  --pure: every matrix weight in TYPE's main type (fallbacks only for rows that do not fit)\n");
    return 2;
}

/* A NUL-terminated copy of s (the caller frees). */
static char *str_dup(gguf_str s) {
    char *c = malloc((size_t)s.len + 1);
    if (c != NULL) {
        memcpy(c, s.ptr, (size_t)s.len);
        c[s.len] = '\0';
    }
    return c;
}

/* Copies one metadata entry; general.file_type is left to the caller. */
static bool copy_kv(gguf_writer *w, const gguf_kv *kv) {
    char *key = str_dup(kv->key);
    if (key == NULL) return false;
    bool ok = true;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: gguf_writer_set_u8(w, key, (uint8_t)kv->val.u64); break;
    case GGUF_TYPE_INT8: gguf_writer_set_i8(w, key, (int8_t)kv->val.i64); break;
    case GGUF_TYPE_UINT16: gguf_writer_set_u16(w, key, (uint16_t)kv->val.u64); break;
    case GGUF_TYPE_INT16: gguf_writer_set_i16(w, key, (int16_t)kv->val.i64); break;
    case GGUF_TYPE_UINT32: gguf_writer_set_u32(w, key, (uint32_t)kv->val.u64); break;
    case GGUF_TYPE_INT32: gguf_writer_set_i32(w, key, (int32_t)kv->val.i64); break;
    case GGUF_TYPE_UINT64: gguf_writer_set_u64(w, key, kv->val.u64); break;
    case GGUF_TYPE_INT64: gguf_writer_set_i64(w, key, kv->val.i64); break;
    case GGUF_TYPE_FLOAT32: gguf_writer_set_f32(w, key, (float)kv->val.f64); break;
    case GGUF_TYPE_FLOAT64: gguf_writer_set_f64(w, key, kv->val.f64); break;
    case GGUF_TYPE_BOOL: gguf_writer_set_bool(w, key, kv->val.u64 != 0); break;
    case GGUF_TYPE_STRING: {
        char *v = str_dup(kv->val.str);
        ok = v != NULL;
        if (ok) gguf_writer_set_str(w, key, v);
        free(v);
        break;
    }
    case GGUF_TYPE_ARRAY:
        gguf_writer_set_arr_raw(w, key, kv->arr_type, kv->arr_n, kv->arr_data, (size_t)kv->arr_bytes);
        break;
    default: ok = false; break;
    }
    free(key);
    return ok;
}

/* Dimensions of t after dropping trailing 1s (ggml_n_dims). */
static int eff_dims(const gguf_tensor *t) {
    int n = (int)t->n_dims;
    while (n > 1 && t->ne[n - 1] == 1) n--;
    return n;
}

/* Layer number of a "blk.N." tensor name, -1 otherwise. */
static int layer_of(const gguf_tensor *t) {
    char name[GGUF_MAX_NAME + 1];
    snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1) l = -1;
    return l;
}

/* A tensor's place in llama-quantize's order: by layer (non-layer tensors first), then by name. */
typedef struct order_key {
    int layer;
    const char *name;
    size_t len;
    int64_t index;
} order_key;

static int llama_order(const void *a, const void *b) {
    const order_key *ka = a, *kb = b;
    if (ka->layer != kb->layer) return ka->layer < kb->layer ? -1 : 1;
    const int c = memcmp(ka->name, kb->name, ka->len < kb->len ? ka->len : kb->len);
    if (c != 0) return c;
    return ka->len < kb->len ? -1 : ka->len > kb->len ? 1 : 0;
}

/* Integer key "<arch>.<key>" or dflt. */
static int64_t arch_int(const gguf_file *f, const char *arch, const char *key, int64_t dflt) {
    char full[160];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    int64_t v = dflt;
    dfl_error e = {0};
    if (gguf_get_int(f, full, &v, &e) != DFL_OK) v = dflt;
    return v;
}

int cmd_quantize(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage();
        return 0;
    }
    bool pure = false;
    if (argc >= 2 && strcmp(argv[1], "--pure") == 0) {
        pure = true;
        argv++;
        argc--;
    }
    if (argc != 4) return usage();
    const quant_preset *preset = quant_preset_find(argv[3]);
    if (preset == NULL) {
        fprintf(stderr, "dflash quantize: unknown quantization type '%s' (%s)\n", argv[3], quant_preset_names());
        return 2;
    }
    dfl_error err = {0};
    gguf_file *f = gguf_open(argv[1], &err);
    if (f == NULL) {
        fprintf(stderr, "dflash quantize: %s\n", err.msg);
        return 1;
    }
    const int64_t n_t = gguf_n_tensors(f);
    gguf_writer *w = gguf_writer_new();
    void **bufs = calloc((size_t)(n_t > 0 ? n_t : 1), sizeof(void *));
    float *row = NULL;
    order_key *order = NULL;
    uint32_t *types = NULL;
    int rc = 1;
    if (w == NULL || bufs == NULL) {
        fprintf(stderr, "dflash quantize: out of memory\n");
        goto done;
    }
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (gguf_str_eq(kv->key, "general.file_type") || gguf_str_eq(kv->key, "general.quantization_version")) continue;
        if (!copy_kv(w, kv)) {
            fprintf(stderr, "dflash quantize: %s: cannot copy key %.*s\n", argv[1], (int)kv->key.len, kv->key.ptr);
            goto done;
        }
    }
    /* as llama-quantize: the two keys it sets go last, in this order (ggml's quantization version 2) */
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    gguf_writer_set_u32(w, "general.file_type", (uint32_t)preset->ftype);

    /* the type of every tensor, decided in llama-quantize's order (its counters depend on it) */
    char arch[64] = "llama";
    const gguf_kv *akv = gguf_find_kv(f, "general.architecture");
    if (akv != NULL && akv->type == GGUF_TYPE_STRING) snprintf(arch, sizeof(arch), "%.*s", (int)akv->val.str.len, akv->val.str.ptr);
    const int64_t n_head = arch_int(f, arch, "attention.head_count", 1);
    const int64_t n_head_kv = arch_int(f, arch, "attention.head_count_kv", n_head);
    quant_plan plan;
    quant_plan_init(&plan, preset, pure, (int)arch_int(f, arch, "block_count", 0),
                    n_head_kv > 0 ? (int)(n_head / n_head_kv) : 1);
    order = malloc((size_t)(n_t > 0 ? n_t : 1) * sizeof(order_key));
    types = malloc((size_t)(n_t > 0 ? n_t : 1) * sizeof(uint32_t));
    if (order == NULL || types == NULL) {
        fprintf(stderr, "dflash quantize: out of memory\n");
        goto done;
    }
    for (int64_t i = 0; i < n_t; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
        quant_plan_count(&plan, name);
        order[i] = (order_key){layer_of(t), t->name.ptr, (size_t)t->name.len, i};
    }
    qsort(order, (size_t)n_t, sizeof(order_key), llama_order);
    for (int64_t k = 0; k < n_t; k++) {
        const gguf_tensor *t = gguf_tensor_at(f, order[k].index);
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
        types[order[k].index] = quant_plan_type(&plan, name, eff_dims(t), t->ne[0], t->type);
    }

    int64_t n_req = 0, n_by_type[QUANT_TYPE_COUNT] = {0};
    uint64_t bytes_in = 0, bytes_out = 0;
    /* written in llama-quantize's order too, so that the files are byte-identical */
    for (int64_t k = 0; k < n_t; k++) {
        const int64_t i = order[k].index;
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
        bytes_in += t->nbytes;
        const uint32_t type = types[i];
        if (type == t->type) {
            if (gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, (size_t)t->nbytes, &err) != DFL_OK) {
                fprintf(stderr, "dflash quantize: %s\n", err.msg);
                goto done;
            }
            bytes_out += t->nbytes;
            continue;
        }
        if (!quant_type_get(t->type)->can_dequantize) {
            fprintf(stderr, "dflash quantize: %s: tensor %s has type %s, which cannot be decoded\n", argv[1], name,
                    quant_type_get(t->type)->name);
            goto done;
        }
        const size_t in_row = quant_row_size(t->type, t->ne[0]), out_row = quant_row_size(type, t->ne[0]);
        free(row);
        row = malloc((size_t)t->ne[0] * sizeof(float));
        const int64_t nrows = t->ne[1] * t->ne[2] * t->ne[3];
        bufs[i] = malloc(out_row * (size_t)nrows + 1);
        if (row == NULL || bufs[i] == NULL) {
            fprintf(stderr, "dflash quantize: out of memory (tensor %s)\n", name);
            goto done;
        }
        for (int64_t r = 0; r < nrows; r++) {
            if (!quant_dequantize_row(t->type, (const char *)t->data + (size_t)r * in_row, row, t->ne[0]) ||
                quant_quantize_row(type, row, (char *)bufs[i] + (size_t)r * out_row, t->ne[0]) != out_row) {
                fprintf(stderr, "dflash quantize: tensor %s row %lld: conversion %s -> %s failed\n", name, (long long)r,
                        quant_type_get(t->type)->name, quant_type_get(type)->name);
                goto done;
            }
        }
        if (gguf_writer_add_tensor(w, name, type, t->n_dims, t->ne, bufs[i], out_row * (size_t)(nrows), &err) != DFL_OK) {
            fprintf(stderr, "dflash quantize: %s\n", err.msg);
            goto done;
        }
        bytes_out += out_row * (size_t)nrows;
        n_req++;
        n_by_type[type]++;
    }
    if (gguf_writer_write(w, argv[2], &err) != DFL_OK) {
        fprintf(stderr, "dflash quantize: %s\n", err.msg);
        goto done;
    }
    printf("dflash quantize: %s -> %s: %s%s, %lld of %lld tensors re-encoded (", argv[1], argv[2], preset->name,
           pure ? " (pure)" : "", (long long)n_req, (long long)n_t);
    for (int k = 0, first = 1; k < QUANT_TYPE_COUNT; k++) {
        if (n_by_type[k] == 0) continue;
        printf("%s%lld as %s", first ? "" : ", ", (long long)n_by_type[k], quant_type_get((uint32_t)k)->name);
        first = 0;
    }
    printf("), %d fallback%s for rows that do not fit a block, %.2f MB -> %.2f MB of tensor data\n", plan.n_fallback,
           plan.n_fallback == 1 ? "" : "s", (double)bytes_in / 1e6, (double)bytes_out / 1e6);
    rc = 0;
done:
    if (bufs != NULL) {
        for (int64_t i = 0; i < n_t; i++) free(bufs[i]);
    }
    free(bufs);
    free(row);
    free(order);
    free(types);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}
