/* cmd_quantize.c: `dflash quantize IN.gguf OUT.gguf TYPE` (llama-quantize's habit): copies a
 * model's metadata as is and re-encodes its matrix weights (2-d tensors named *.weight whose row
 * length is a multiple of TYPE's block) in TYPE; vectors (norms) and rows that do not fit a block
 * stay as they are. Works for targets and DFlash drafters alike. */
#include "cmds.h"
#include "base/error.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: dflash quantize IN.gguf OUT.gguf TYPE\n"
                    "  TYPE: q8_0, q4_0, f16, bf16 or f32; matrix weights are re-encoded, the rest copied\n");
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

/* Whether tensor t is a matrix weight that TYPE can encode. */
static bool requantize(const gguf_tensor *t, uint32_t type) {
    const size_t n = (size_t)t->name.len;
    if (t->n_dims != 2 || t->ne[1] < 2 || n < 7 || memcmp(t->name.ptr + n - 7, ".weight", 7) != 0) return false;
    return t->ne[0] % quant_type_get(type)->blck_size == 0 && t->type != type;
}

int cmd_quantize(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage();
        return 0;
    }
    if (argc != 4) return usage();
    const int type = quant_type_from_name(argv[3]);
    if (type < 0 || !quant_type_get((uint32_t)type)->can_quantize) {
        fprintf(stderr, "dflash quantize: unknown or unsupported type '%s' (q8_0, q4_0, f16, bf16, f32)\n", argv[3]);
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
    int rc = 1;
    if (w == NULL || bufs == NULL) {
        fprintf(stderr, "dflash quantize: out of memory\n");
        goto done;
    }
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (gguf_str_eq(kv->key, "general.file_type")) continue;
        if (!copy_kv(w, kv)) {
            fprintf(stderr, "dflash quantize: %s: cannot copy key %.*s\n", argv[1], (int)kv->key.len, kv->key.ptr);
            goto done;
        }
    }
    /* llama.cpp's file types: 0 all f32, 1 mostly f16, 7 mostly q8_0, 2 mostly q4_0, 32 mostly bf16 */
    const uint32_t ftype = type == QUANT_TYPE_F32 ? 0 : type == QUANT_TYPE_F16 ? 1 : type == QUANT_TYPE_Q8_0 ? 7
                         : type == QUANT_TYPE_Q4_0 ? 2 : 32;
    gguf_writer_set_u32(w, "general.file_type", ftype);
    int64_t n_req = 0;
    uint64_t bytes_in = 0, bytes_out = 0;
    for (int64_t i = 0; i < n_t; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
        bytes_in += t->nbytes;
        if (!requantize(t, (uint32_t)type)) {
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
        const size_t in_row = quant_row_size(t->type, t->ne[0]), out_row = quant_row_size((uint32_t)type, t->ne[0]);
        free(row);
        row = malloc((size_t)t->ne[0] * sizeof(float));
        bufs[i] = malloc(out_row * (size_t)t->ne[1]);
        if (row == NULL || bufs[i] == NULL) {
            fprintf(stderr, "dflash quantize: out of memory (tensor %s)\n", name);
            goto done;
        }
        for (int64_t r = 0; r < t->ne[1]; r++) {
            if (!quant_dequantize_row(t->type, (const char *)t->data + (size_t)r * in_row, row, t->ne[0]) ||
                quant_quantize_row((uint32_t)type, row, (char *)bufs[i] + (size_t)r * out_row, t->ne[0]) != out_row) {
                fprintf(stderr, "dflash quantize: tensor %s row %lld: conversion %s -> %s failed\n", name, (long long)r,
                        quant_type_get(t->type)->name, argv[3]);
                goto done;
            }
        }
        if (gguf_writer_add_tensor(w, name, (uint32_t)type, 2, t->ne, bufs[i], out_row * (size_t)t->ne[1], &err) != DFL_OK) {
            fprintf(stderr, "dflash quantize: %s\n", err.msg);
            goto done;
        }
        bytes_out += out_row * (size_t)t->ne[1];
        n_req++;
    }
    if (gguf_writer_write(w, argv[2], &err) != DFL_OK) {
        fprintf(stderr, "dflash quantize: %s\n", err.msg);
        goto done;
    }
    printf("dflash quantize: %s -> %s: %lld of %lld tensors as %s, %.2f MB -> %.2f MB of tensor data\n", argv[1], argv[2],
           (long long)n_req, (long long)n_t, quant_type_get((uint32_t)type)->name, (double)bytes_in / 1e6,
           (double)bytes_out / 1e6);
    rc = 0;
done:
    if (bufs != NULL) {
        for (int64_t i = 0; i < n_t; i++) free(bufs[i]);
    }
    free(bufs);
    free(row);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}
