/* gguf_get.c: read access to an opened GGUF file: accessors, O(1) lookups by name through the
 * hash indexes, typed getters with "what and where" errors, and array element access (O(1)
 * for numbers and indexed strings; nested arrays are walked within their validated bytes). */
#include "gguf/gguf_cursor.h"
#include "gguf/gguf_internal.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }
const uint8_t *gguf_file_data(const gguf_file *f) { return f->data; }
const char *gguf_label(const gguf_file *f) { return f->label; }

int64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
int64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? &f->kvs[i] : NULL;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

static gguf_str kv_name(const void *items, int64_t i) { return ((const gguf_kv *)items)[i].key; }
static gguf_str tensor_name(const void *items, int64_t i) {
    return ((const gguf_tensor *)items)[i].name;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    int64_t i = gguf_index_find(&f->kv_index, key, strlen(key), kv_name, f->kvs);
    return i >= 0 ? &f->kvs[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int64_t i = gguf_index_find(&f->tensor_index, name, strlen(name), tensor_name, f->tensors);
    return i >= 0 ? &f->tensors[i] : NULL;
}

/* ---- typed getters --------------------------------------------------------------------------- */

static const gguf_kv *find_or_fail(const gguf_file *f, const char *key, dfl_error *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (kv == NULL) {
        error_set(err, DFL_ERR_MISSING, "%s: key '%s' not found", f->label, key);
    }
    return kv;
}

static dfl_status type_mismatch(const gguf_file *f, const gguf_kv *kv, const char *key,
                                const char *expected, dfl_error *err) {
    if (kv->type == GGUF_TYPE_ARRAY) {
        return error_set(err, DFL_ERR_MISMATCH,
                         "%s: offset %llu: key '%s': expected %s, found an array of %s", f->label,
                         (unsigned long long)kv->offset, key, expected, gguf_type_name(kv->arr_type));
    }
    return error_set(err, DFL_ERR_MISMATCH, "%s: offset %llu: key '%s': expected %s, found %s",
                     f->label, (unsigned long long)kv->offset, key, expected,
                     gguf_type_name(kv->type));
}

static bool is_signed_int(gguf_type t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

static bool is_unsigned_int(gguf_type t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
           t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_BOOL;
}

dfl_status gguf_get_int(const gguf_file *f, const char *key, int64_t *out, dfl_error *err) {
    const gguf_kv *kv = find_or_fail(f, key, err);
    if (kv == NULL) {
        return DFL_ERR_MISSING;
    }
    if (is_signed_int(kv->type)) {
        *out = kv->val.i64;
        return DFL_OK;
    }
    if (is_unsigned_int(kv->type)) {
        if (kv->val.u64 > (uint64_t)INT64_MAX) {
            return error_set(err, DFL_ERR_MISMATCH,
                             "%s: offset %llu: key '%s': value %llu does not fit in int64", f->label,
                             (unsigned long long)kv->offset, key, (unsigned long long)kv->val.u64);
        }
        *out = (int64_t)kv->val.u64;
        return DFL_OK;
    }
    return type_mismatch(f, kv, key, "an integer", err);
}

dfl_status gguf_get_int_range(const gguf_file *f, const char *key, int64_t lo, int64_t hi,
                              int64_t *out, dfl_error *err) {
    int64_t v;
    dfl_status st = gguf_get_int(f, key, &v, err);
    if (st != DFL_OK) {
        return st;
    }
    if (v < lo || v > hi) {
        const gguf_kv *kv = gguf_find_kv(f, key);
        return error_set(err, DFL_ERR_MISMATCH,
                         "%s: offset %llu: key '%s': value %lld is out of range [%lld, %lld]",
                         f->label, (unsigned long long)kv->offset, key, (long long)v, (long long)lo,
                         (long long)hi);
    }
    *out = v;
    return DFL_OK;
}

dfl_status gguf_get_float(const gguf_file *f, const char *key, double *out, dfl_error *err) {
    const gguf_kv *kv = find_or_fail(f, key, err);
    if (kv == NULL) {
        return DFL_ERR_MISSING;
    }
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) {
        *out = kv->val.f64;
    } else if (is_signed_int(kv->type)) {
        *out = (double)kv->val.i64;
    } else if (is_unsigned_int(kv->type) && kv->type != GGUF_TYPE_BOOL) {
        *out = (double)kv->val.u64;
    } else {
        return type_mismatch(f, kv, key, "a number", err);
    }
    return DFL_OK;
}

dfl_status gguf_get_bool(const gguf_file *f, const char *key, bool *out, dfl_error *err) {
    const gguf_kv *kv = find_or_fail(f, key, err);
    if (kv == NULL) {
        return DFL_ERR_MISSING;
    }
    if (kv->type != GGUF_TYPE_BOOL) {
        return type_mismatch(f, kv, key, "bool", err);
    }
    *out = kv->val.u64 != 0;
    return DFL_OK;
}

dfl_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, dfl_error *err) {
    const gguf_kv *kv = find_or_fail(f, key, err);
    if (kv == NULL) {
        return DFL_ERR_MISSING;
    }
    if (kv->type != GGUF_TYPE_STRING) {
        return type_mismatch(f, kv, key, "string", err);
    }
    *out = kv->val.str;
    return DFL_OK;
}

dfl_status gguf_get_arr(const gguf_file *f, const char *key, gguf_type elem_type,
                        const gguf_kv **out, dfl_error *err) {
    const gguf_kv *kv = find_or_fail(f, key, err);
    if (kv == NULL) {
        return DFL_ERR_MISSING;
    }
    if (kv->type != GGUF_TYPE_ARRAY || (elem_type != GGUF_TYPE_COUNT && kv->arr_type != elem_type)) {
        char expected[64];
        if (elem_type == GGUF_TYPE_COUNT) {
            snprintf(expected, sizeof(expected), "an array");
        } else {
            snprintf(expected, sizeof(expected), "an array of %s", gguf_type_name(elem_type));
        }
        return type_mismatch(f, kv, key, expected, err);
    }
    *out = kv;
    return DFL_OK;
}

/* ---- array elements -------------------------------------------------------------------------- */

/* Byte size of one element of `type` at p with `avail` bytes available; false if it does not fit
 * (cannot happen for validated data, checked anyway). */
static bool elem_size(const uint8_t *p, uint64_t avail, gguf_type type, int depth, uint64_t *size) {
    uint64_t es = gguf_type_size(type);
    if (es != 0) {
        *size = es;
        return es <= avail;
    }
    if (type == GGUF_TYPE_STRING) {
        if (avail < 8) return false;
        uint64_t len = gguf_load_u64(p);
        if (len > avail - 8) return false;
        *size = 8 + len;
        return true;
    }
    if (type != GGUF_TYPE_ARRAY || depth >= GGUF_MAX_ARRAY_DEPTH || avail < 12) {
        return false;
    }
    uint32_t sub = gguf_load_u32(p);
    uint64_t n = gguf_load_u64(p + 4);
    if (sub >= GGUF_TYPE_COUNT) return false;
    uint64_t used = 12;
    uint64_t ses = gguf_type_size((gguf_type)sub);
    if (ses != 0) {
        if (n > (avail - used) / ses) return false;
        *size = used + n * ses;
        return true;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t s;
        if (!elem_size(p + used, avail - used, (gguf_type)sub, depth + 1, &s)) return false;
        used += s;
    }
    *size = used;
    return true;
}

/* Pointer to element i of a variable-size array by walking (bounds-checked), or NULL. */
static const uint8_t *walk_to(const gguf_kv *kv, uint64_t i, uint64_t *avail) {
    const uint8_t *p = kv->arr_data;
    uint64_t left = kv->arr_bytes;
    for (uint64_t j = 0; j < i; j++) {
        uint64_t s;
        if (!elem_size(p, left, kv->arr_type, 1, &s)) return NULL;
        p += s;
        left -= s;
    }
    *avail = left;
    return p;
}

bool gguf_arr_int(const gguf_kv *kv, uint64_t i, int64_t *out) {
    if (kv->type != GGUF_TYPE_ARRAY || i >= kv->arr_n) {
        return false;
    }
    uint64_t es = gguf_type_size(kv->arr_type);
    if (es == 0 || kv->arr_type == GGUF_TYPE_FLOAT32 || kv->arr_type == GGUF_TYPE_FLOAT64 ||
        i >= kv->arr_bytes / es) {
        return false;
    }
    const uint8_t *p = kv->arr_data + i * es;
    switch (kv->arr_type) {
    case GGUF_TYPE_UINT8: *out = p[0]; return true;
    case GGUF_TYPE_BOOL: *out = p[0] != 0; return true;
    case GGUF_TYPE_INT8: *out = (int8_t)p[0]; return true;
    case GGUF_TYPE_UINT16: *out = gguf_load_u16(p); return true;
    case GGUF_TYPE_INT16: *out = (int16_t)gguf_load_u16(p); return true;
    case GGUF_TYPE_UINT32: *out = gguf_load_u32(p); return true;
    case GGUF_TYPE_INT32: *out = (int32_t)gguf_load_u32(p); return true;
    case GGUF_TYPE_UINT64: {
        uint64_t v = gguf_load_u64(p);
        if (v > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v;
        return true;
    }
    case GGUF_TYPE_INT64: {
        uint64_t v = gguf_load_u64(p);
        memcpy(out, &v, sizeof(v));
        return true;
    }
    default: return false;
    }
}

bool gguf_arr_float(const gguf_kv *kv, uint64_t i, double *out) {
    if (kv->type != GGUF_TYPE_ARRAY || i >= kv->arr_n) {
        return false;
    }
    if (kv->arr_type == GGUF_TYPE_FLOAT32 && i < kv->arr_bytes / 4) {
        uint32_t bits = gguf_load_u32(kv->arr_data + i * 4);
        float v;
        memcpy(&v, &bits, sizeof(v));
        *out = v;
        return true;
    }
    if (kv->arr_type == GGUF_TYPE_FLOAT64 && i < kv->arr_bytes / 8) {
        uint64_t bits = gguf_load_u64(kv->arr_data + i * 8);
        memcpy(out, &bits, sizeof(*out));
        return true;
    }
    return false;
}

bool gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out) {
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING || i >= kv->arr_n) {
        return false;
    }
    const uint8_t *p;
    uint64_t avail;
    if (kv->arr_str_off != NULL) {
        uint64_t off = kv->arr_str_off[i];
        if (off > kv->arr_bytes) return false;
        p = kv->arr_data + off;
        avail = kv->arr_bytes - off;
    } else {
        p = walk_to(kv, i, &avail);
        if (p == NULL) return false;
    }
    if (avail < 8) return false;
    uint64_t len = gguf_load_u64(p);
    if (len > avail - 8) return false;
    out->ptr = (const char *)p + 8;
    out->len = len;
    return true;
}

bool gguf_arr_sub(const gguf_kv *kv, uint64_t i, gguf_kv *out) {
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_ARRAY || i >= kv->arr_n) {
        return false;
    }
    uint64_t avail, size;
    const uint8_t *p = walk_to(kv, i, &avail);
    if (p == NULL || !elem_size(p, avail, GGUF_TYPE_ARRAY, 1, &size)) {
        return false;
    }
    memset(out, 0, sizeof(*out));
    out->key = kv->key;
    out->offset = kv->offset;
    out->type = GGUF_TYPE_ARRAY;
    out->arr_type = (gguf_type)gguf_load_u32(p);
    out->arr_n = gguf_load_u64(p + 4);
    out->arr_data = p + 12;
    out->arr_bytes = size - 12;
    out->arr_str_off = NULL;
    return true;
}
