/* gguf_writer.c: writes GGUF v3 files that llama.cpp loads: header, KVs in insertion order,
 * tensor infos, then the tensor data aligned (zero padding). KV values are serialized when set;
 * tensor data is referenced, not copied, and streamed to the file with fwrite. Setters keep the
 * first error (out of memory, bad argument); gguf_writer_write reports it. */
#include "gguf/gguf.h"
#include "base/error.h"
#include "quant/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A growable byte buffer. */
typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

static void wbuf_put(wbuf *b, const void *src, size_t n) {
    if (b->oom || n == 0) {
        return;
    }
    if (n > SIZE_MAX / 2 - b->n) {
        b->oom = true;
        return;
    }
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) {
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void wbuf_u8(wbuf *b, uint8_t v) { wbuf_put(b, &v, 1); }
static void wbuf_u16(wbuf *b, uint16_t v) {
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    wbuf_put(b, x, 2);
}
static void wbuf_u32(wbuf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    wbuf_put(b, x, 4);
}
static void wbuf_u64(wbuf *b, uint64_t v) {
    wbuf_u32(b, (uint32_t)v);
    wbuf_u32(b, (uint32_t)(v >> 32));
}
static void wbuf_str(wbuf *b, const char *s, size_t len) {
    wbuf_u64(b, len);
    wbuf_put(b, s, len);
}

typedef struct writer_kv {
    char *key;
    gguf_type type;
    uint8_t *val;     /* [val_len] the serialized value (after the type) */
    size_t val_len;
} writer_kv;

typedef struct writer_tensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data; /* [nbytes] caller-owned */
    size_t nbytes;
} writer_tensor;

struct gguf_writer {
    writer_kv *kvs;
    size_t n_kv, cap_kv;
    writer_tensor *tensors;
    size_t n_tensors, cap_tensors;
    dfl_error err; /* the first setter error */
};

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = calloc(1, sizeof(*w));
    return w;
}

void gguf_writer_free(gguf_writer *w) {
    if (w == NULL) {
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
    }
    free(w->kvs);
    free(w->tensors);
    free(w);
}

/* Stores (key, type, serialized value), replacing an earlier value of the key. Takes b's bytes. */
static void writer_set(gguf_writer *w, const char *key, gguf_type type, wbuf *b) {
    if (w == NULL) {
        free(b->p);
        return;
    }
    if (key == NULL || key[0] == '\0') {
        error_set(&w->err, DFL_ERR_INVALID, "gguf writer: empty key");
        free(b->p);
        return;
    }
    if (b->oom) {
        error_set(&w->err, DFL_ERR_NOMEM, "gguf writer: out of memory setting key '%s'", key);
        free(b->p);
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            free(w->kvs[i].val);
            w->kvs[i].type = type;
            w->kvs[i].val = b->p;
            w->kvs[i].val_len = b->n;
            return;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        writer_kv *kvs = realloc(w->kvs, cap * sizeof(*kvs));
        if (kvs == NULL) {
            error_set(&w->err, DFL_ERR_NOMEM, "gguf writer: out of memory setting key '%s'", key);
            free(b->p);
            return;
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (k == NULL) {
        error_set(&w->err, DFL_ERR_NOMEM, "gguf writer: out of memory setting key '%s'", key);
        free(b->p);
        return;
    }
    w->kvs[w->n_kv++] = (writer_kv){k, type, b->p, b->n};
}

#define WRITER_SCALAR(fn, ctype, gtype, put, conv) \
    void fn(gguf_writer *w, const char *key, ctype v) { \
        wbuf b = {0}; \
        put(&b, conv); \
        writer_set(w, key, gtype, &b); \
    }

static uint32_t f32_bits(float v) { uint32_t u; memcpy(&u, &v, 4); return u; }
static uint64_t f64_bits(double v) { uint64_t u; memcpy(&u, &v, 8); return u; }

WRITER_SCALAR(gguf_writer_set_u8, uint8_t, GGUF_TYPE_UINT8, wbuf_u8, v)
WRITER_SCALAR(gguf_writer_set_i8, int8_t, GGUF_TYPE_INT8, wbuf_u8, (uint8_t)v)
WRITER_SCALAR(gguf_writer_set_u16, uint16_t, GGUF_TYPE_UINT16, wbuf_u16, v)
WRITER_SCALAR(gguf_writer_set_i16, int16_t, GGUF_TYPE_INT16, wbuf_u16, (uint16_t)v)
WRITER_SCALAR(gguf_writer_set_u32, uint32_t, GGUF_TYPE_UINT32, wbuf_u32, v)
WRITER_SCALAR(gguf_writer_set_i32, int32_t, GGUF_TYPE_INT32, wbuf_u32, (uint32_t)v)
WRITER_SCALAR(gguf_writer_set_u64, uint64_t, GGUF_TYPE_UINT64, wbuf_u64, v)
WRITER_SCALAR(gguf_writer_set_i64, int64_t, GGUF_TYPE_INT64, wbuf_u64, (uint64_t)v)
WRITER_SCALAR(gguf_writer_set_f32, float, GGUF_TYPE_FLOAT32, wbuf_u32, f32_bits(v))
WRITER_SCALAR(gguf_writer_set_f64, double, GGUF_TYPE_FLOAT64, wbuf_u64, f64_bits(v))
WRITER_SCALAR(gguf_writer_set_bool, bool, GGUF_TYPE_BOOL, wbuf_u8, (uint8_t)(v ? 1 : 0))

void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    wbuf b = {0};
    if (v == NULL) {
        v = "";
    }
    wbuf_str(&b, v, strlen(v));
    writer_set(w, key, GGUF_TYPE_STRING, &b);
}

void gguf_writer_set_arr_num(gguf_writer *w, const char *key, gguf_type elem_type, const void *v,
                             size_t n) {
    wbuf b = {0};
    uint64_t es = gguf_type_size(elem_type);
    if (es == 0) {
        if (w != NULL) {
            error_set(&w->err, DFL_ERR_INVALID, "gguf writer: key '%s': %s is not a fixed-size "
                      "element type", key ? key : "(null)", gguf_type_name(elem_type));
        }
        return;
    }
    if (n > 0 && v == NULL) {
        if (w != NULL) {
            error_set(&w->err, DFL_ERR_INVALID, "gguf writer: key '%s': NULL array", key ? key : "(null)");
        }
        return;
    }
    wbuf_u32(&b, (uint32_t)elem_type);
    wbuf_u64(&b, n);
    const uint8_t *p = v;
    for (size_t i = 0; i < n && !b.oom; i++) {
        switch (elem_type) {
        case GGUF_TYPE_BOOL: wbuf_u8(&b, ((const bool *)v)[i] ? 1 : 0); break;
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: wbuf_u8(&b, p[i]); break;
        case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: wbuf_u16(&b, ((const uint16_t *)v)[i]); break;
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            wbuf_u32(&b, u);
            break;
        }
        default: {
            uint64_t u;
            memcpy(&u, p + 8 * i, 8);
            wbuf_u64(&b, u);
            break;
        }
        }
    }
    writer_set(w, key, GGUF_TYPE_ARRAY, &b);
}

void gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    gguf_writer_set_arr_num(w, key, GGUF_TYPE_INT32, v, n);
}

void gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n) {
    gguf_writer_set_arr_num(w, key, GGUF_TYPE_FLOAT32, v, n);
}

void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v,
                             const size_t *lens, size_t n) {
    wbuf b = {0};
    if (n > 0 && v == NULL) {
        if (w != NULL) {
            error_set(&w->err, DFL_ERR_INVALID, "gguf writer: key '%s': NULL array", key ? key : "(null)");
        }
        return;
    }
    wbuf_u32(&b, GGUF_TYPE_STRING);
    wbuf_u64(&b, n);
    for (size_t i = 0; i < n && !b.oom; i++) {
        const char *s = v[i] != NULL ? v[i] : "";
        size_t len = lens != NULL ? lens[i] : strlen(s);
        wbuf_str(&b, s, len);
    }
    writer_set(w, key, GGUF_TYPE_ARRAY, &b);
}

void gguf_writer_set_arr_raw(gguf_writer *w, const char *key, gguf_type elem_type, uint64_t n,
                             const void *bytes, size_t nbytes) {
    wbuf b = {0};
    wbuf_u32(&b, (uint32_t)elem_type);
    wbuf_u64(&b, n);
    wbuf_put(&b, bytes, nbytes);
    writer_set(w, key, GGUF_TYPE_ARRAY, &b);
}

/* ---- tensors --------------------------------------------------------------------------------- */

dfl_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const int64_t *ne, const void *data, size_t nbytes, dfl_error *err) {
    dfl_error local = {0};
    dfl_status st = DFL_OK;
    const quant_type_info *ti = quant_type_get(type);
    size_t name_len = name != NULL ? strlen(name) : 0;
    if (w == NULL) {
        return error_set(err, DFL_ERR_INVALID, "gguf writer: NULL writer");
    }
    if (name_len == 0 || name_len >= GGUF_MAX_NAME) {
        st = error_set(&local, DFL_ERR_INVALID, "gguf writer: tensor name '%s' must be 1..%d bytes",
                       name ? name : "", GGUF_MAX_NAME - 1);
    } else if (ti == NULL) {
        st = error_set(&local, DFL_ERR_INVALID, "gguf writer: tensor '%s': unknown type %u", name, type);
    } else if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || ne == NULL) {
        st = error_set(&local, DFL_ERR_INVALID, "gguf writer: tensor '%s': n_dims %u not in 1..%d",
                       name, n_dims, GGUF_MAX_DIMS);
    }
    uint64_t rows = 1;
    for (uint32_t d = 0; st == DFL_OK && d < n_dims; d++) {
        if (ne[d] < 1) {
            st = error_set(&local, DFL_ERR_INVALID, "gguf writer: tensor '%s': ne[%u] = %lld < 1",
                           name, d, (long long)ne[d]);
        } else if (d > 0) {
            if (rows > (uint64_t)INT64_MAX / (uint64_t)ne[d]) {
                st = error_set(&local, DFL_ERR_INVALID, "gguf writer: tensor '%s': size overflows", name);
            }
            rows *= (uint64_t)ne[d];
        }
    }
    if (st == DFL_OK && ne[0] % ti->blck_size != 0) {
        st = error_set(&local, DFL_ERR_INVALID,
                       "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %lld",
                       name, (long long)ne[0], ti->name, (long long)ti->blck_size);
    }
    if (st == DFL_OK) {
        uint64_t row = quant_row_size(type, ne[0]);
        if (row != 0 && rows > UINT64_MAX / row) {
            st = error_set(&local, DFL_ERR_INVALID, "gguf writer: tensor '%s': size overflows", name);
        } else if (row * rows != nbytes) {
            st = error_set(&local, DFL_ERR_INVALID,
                           "gguf writer: tensor '%s': nbytes %zu != %llu (%llu rows of %llu bytes)",
                           name, nbytes, (unsigned long long)(row * rows), (unsigned long long)rows,
                           (unsigned long long)row);
        } else if (data == NULL) {
            st = error_set(&local, DFL_ERR_INVALID, "gguf writer: tensor '%s': NULL data", name);
        }
    }
    for (size_t i = 0; st == DFL_OK && i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            st = error_set(&local, DFL_ERR_INVALID, "gguf writer: duplicate tensor name '%s'", name);
        }
    }
    if (st == DFL_OK && w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        writer_tensor *ts = realloc(w->tensors, cap * sizeof(*ts));
        if (ts == NULL) {
            st = error_set(&local, DFL_ERR_NOMEM, "gguf writer: out of memory adding tensor '%s'", name);
        } else {
            w->tensors = ts;
            w->cap_tensors = cap;
        }
    }
    char *copy = NULL;
    if (st == DFL_OK && (copy = strdup(name)) == NULL) {
        st = error_set(&local, DFL_ERR_NOMEM, "gguf writer: out of memory adding tensor '%s'", name);
    }
    if (st != DFL_OK) {
        error_set(&w->err, st, "%s", local.msg);
        return error_set(err, st, "%s", local.msg);
    }
    writer_tensor *t = &w->tensors[w->n_tensors++];
    t->name = copy;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    }
    t->data = data;
    t->nbytes = nbytes;
    return DFL_OK;
}

/* ---- write ----------------------------------------------------------------------------------- */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* The alignment to use: 32, or a u32 general.alignment the caller set. */
static dfl_status writer_alignment(gguf_writer *w, uint64_t *out, dfl_error *err) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0) {
            continue;
        }
        if (w->kvs[i].type != GGUF_TYPE_UINT32) {
            return error_set(err, DFL_ERR_INVALID, "gguf writer: general.alignment must be u32, not %s",
                             gguf_type_name(w->kvs[i].type));
        }
        const uint8_t *p = w->kvs[i].val;
        uint32_t a = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (a == 0 || (a & (a - 1)) != 0) {
            return error_set(err, DFL_ERR_INVALID,
                             "gguf writer: general.alignment %u is not a power of two", a);
        }
        *out = a;
    }
    return DFL_OK;
}

static bool write_zeros(FILE *fp, uint64_t n) {
    static const uint8_t zeros[64] = {0};
    while (n > 0) {
        size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
        if (fwrite(zeros, 1, k, fp) != k) {
            return false;
        }
        n -= k;
    }
    return true;
}

dfl_status gguf_writer_write(gguf_writer *w, const char *path, dfl_error *err) {
    if (w == NULL) {
        return error_set(err, DFL_ERR_INVALID, "gguf writer: NULL writer");
    }
    if (w->err.code != DFL_OK) {
        return error_set(err, w->err.code, "%s: %s", path, w->err.msg);
    }
    uint64_t alignment;
    dfl_status st = writer_alignment(w, &alignment, err);
    if (st != DFL_OK) {
        return st;
    }
    /* header, KVs and tensor infos are built in memory (small); the data is streamed */
    wbuf b = {0};
    wbuf_put(&b, "GGUF", 4);
    wbuf_u32(&b, 3);
    wbuf_u64(&b, w->n_tensors);
    wbuf_u64(&b, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        wbuf_str(&b, w->kvs[i].key, strlen(w->kvs[i].key));
        wbuf_u32(&b, (uint32_t)w->kvs[i].type);
        wbuf_put(&b, w->kvs[i].val, w->kvs[i].val_len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        wbuf_str(&b, t->name, strlen(t->name));
        wbuf_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            wbuf_u64(&b, (uint64_t)t->ne[d]);
        }
        wbuf_u32(&b, t->type);
        wbuf_u64(&b, offset);
        offset = align_up(offset + t->nbytes, alignment);
    }
    if (b.oom) {
        free(b.p);
        return error_set(err, DFL_ERR_NOMEM, "%s: out of memory building the GGUF header", path);
    }
    /* written to a temporary file next to path, then renamed over it: a tensor's data may be a
     * mapping of the very file being replaced (dflash quantize IN IN), and a failed write leaves
     * whatever path held untouched */
    const size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    if (tmp == NULL) {
        free(b.p);
        return error_set(err, DFL_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (fp == NULL) {
        const int e0 = errno;
        free(b.p);
        free(tmp);
        return error_set(err, DFL_ERR_IO, "%s: cannot create: %s", path, strerror(e0));
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    bool ok = fwrite(b.p, 1, b.n, fp) == b.n;
    ok = ok && write_zeros(fp, align_up(b.n, alignment) - b.n);
    free(b.p);
    for (size_t i = 0; ok && i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        ok = fwrite(t->data, 1, t->nbytes, fp) == t->nbytes;
        ok = ok && write_zeros(fp, align_up(t->nbytes, alignment) - t->nbytes);
    }
    int e = ok ? 0 : errno;
    if (fclose(fp) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        remove(tmp);
        free(tmp);
        return error_set(err, DFL_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    free(tmp);
    return DFL_OK;
}
