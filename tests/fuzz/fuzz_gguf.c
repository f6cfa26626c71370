/* fuzz_gguf.c: libFuzzer target for the GGUF reader: opens the input with gguf_open_memory and,
 * when it is accepted, walks every KV (typed getters, every array element, nested arrays) and
 * every tensor (lookup by name, touching the first and last data byte). ASan/UBSan catch the
 * rest. Build with `make fuzz`. */
#include "base/error.h"
#include "gguf/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t g_sink; /* keeps reads from being optimized away */

static void walk_array(const gguf_kv *kv, int depth) {
    uint64_t n = kv->arr_n < 4096 ? kv->arr_n : 4096;
    for (uint64_t i = 0; i < n; i++) {
        int64_t iv;
        double fv;
        gguf_str s;
        gguf_kv sub;
        if (gguf_arr_int(kv, i, &iv)) g_sink += (uint64_t)iv;
        if (gguf_arr_float(kv, i, &fv)) g_sink += (uint64_t)(fv == fv);
        if (gguf_arr_str(kv, i, &s) && s.len > 0) g_sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        if (depth < 16 && gguf_arr_sub(kv, i, &sub)) walk_array(&sub, depth + 1);
    }
    /* out of range must fail cleanly */
    int64_t iv;
    gguf_str s;
    if (gguf_arr_int(kv, kv->arr_n, &iv) || gguf_arr_str(kv, kv->arr_n, &s)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dfl_error err = {0};
    gguf_file *f = gguf_open_memory(data, size, &err);
    if (f == NULL) {
        if (err.code == DFL_OK || err.msg[0] == '\0') abort(); /* a failure must say why */
        return 0;
    }
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[128];
        size_t n = kv->key.len < sizeof(key) - 1 ? (size_t)kv->key.len : sizeof(key) - 1;
        memcpy(key, kv->key.ptr, n);
        key[n] = '\0';
        dfl_error e = {0};
        int64_t iv;
        double fv;
        bool bv;
        gguf_str sv;
        const gguf_kv *arr;
        if (gguf_find_kv(f, key) == NULL && strlen(key) == kv->key.len) abort();
        (void)gguf_get_int(f, key, &iv, &e);
        error_clear(&e);
        (void)gguf_get_int_range(f, key, 0, 100, &iv, &e);
        error_clear(&e);
        (void)gguf_get_float(f, key, &fv, &e);
        error_clear(&e);
        (void)gguf_get_bool(f, key, &bv, &e);
        error_clear(&e);
        if (gguf_get_str(f, key, &sv, &e) == DFL_OK && sv.len > 0) g_sink += (uint8_t)sv.ptr[sv.len - 1];
        error_clear(&e);
        if (gguf_get_arr(f, key, GGUF_TYPE_COUNT, &arr, &e) == DFL_OK) walk_array(arr, 0);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[GGUF_MAX_NAME + 1];
        memcpy(name, t->name.ptr, (size_t)t->name.len);
        name[t->name.len] = '\0';
        const gguf_tensor *found = gguf_find_tensor(f, name);
        if (strlen(name) == t->name.len && found != t) abort();
        const uint8_t *p = t->data;
        g_sink += p[0] + p[t->nbytes - 1];
        if (t->offset % gguf_alignment(f) != 0) abort();
    }
    (void)gguf_find_kv(f, "general.architecture");
    (void)gguf_find_tensor(f, "token_embd.weight");
    gguf_close(f);
    return 0;
}
