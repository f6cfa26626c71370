/* gguf_reader.c: opens a GGUF v3 file (mmap or caller memory) and validates all of it before
 * anyone sees it: header, every KV (nested arrays to GGUF_MAX_ARRAY_DEPTH), the tensor
 * directory (names, dims, types, block multiples), the alignment, and that every tensor's data
 * lies inside the file, aligned, without overlap. Nothing read from the file is trusted: every
 * count is bounded by the bytes left before anything is allocated, every product is checked for
 * overflow. Errors name the file, the byte offset, the item and the field. Lookups by name go
 * through hash indexes built here. */
#include "gguf/gguf_cursor.h"
#include "gguf/gguf_internal.h"
#include "base/error.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

/* Smallest encodings, used to bound counts by the bytes left before allocating. */
#define GGUF_MIN_KV_BYTES 13     /* key len (8) + type (4) + 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 33 /* name len (8) + 1 byte + n_dims (4) + ne[0] (8) + type (4) + offset (8) */
#define GGUF_MIN_ARRAY_BYTES 12  /* elem type (4) + count (8) */

static const char *const k_type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_type_name(gguf_type type) {
    if ((unsigned)type >= GGUF_TYPE_COUNT) {
        return "unknown";
    }
    return k_type_names[type];
}

uint64_t gguf_type_size(gguf_type type) {
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

bool gguf_str_eq(gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.ptr, cstr, n) == 0);
}

uint64_t gguf_hash(const char *p, uint64_t len) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

int64_t gguf_index_find(const gguf_index *ix, const char *p, uint64_t len,
                        gguf_str (*name_of)(const void *items, int64_t i), const void *items) {
    if (ix->cap == 0) {
        return -1;
    }
    uint64_t mask = ix->cap - 1;
    for (uint64_t s = gguf_hash(p, len) & mask;; s = (s + 1) & mask) {
        int64_t v = ix->slots[s];
        if (v == 0) {
            return -1;
        }
        gguf_str name = name_of(items, v - 1);
        if (name.len == len && (len == 0 || memcmp(name.ptr, p, len) == 0)) {
            return v - 1;
        }
    }
}

static gguf_str kv_name_of(const void *items, int64_t i) { return ((const gguf_kv *)items)[i].key; }
static gguf_str tensor_name_of(const void *items, int64_t i) {
    return ((const gguf_tensor *)items)[i].name;
}

/* Builds an index over n items; on a duplicate name sets *dup_a < *dup_b to the two indexes and
 * returns false. Returns false with *dup_a = -1 when out of memory. */
static bool index_build(gguf_index *ix, int64_t n, gguf_str (*name_of)(const void *, int64_t),
                        const void *items, int64_t *dup_a, int64_t *dup_b) {
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n) {
        cap *= 2;
    }
    ix->slots = calloc(cap, sizeof(int64_t));
    ix->cap = cap;
    if (ix->slots == NULL) {
        ix->cap = 0;
        *dup_a = -1;
        return false;
    }
    uint64_t mask = cap - 1;
    for (int64_t i = 0; i < n; i++) {
        gguf_str name = name_of(items, i);
        uint64_t s = gguf_hash(name.ptr, name.len) & mask;
        for (; ix->slots[s] != 0; s = (s + 1) & mask) {
            gguf_str other = name_of(items, ix->slots[s] - 1);
            if (other.len == name.len && (name.len == 0 || memcmp(other.ptr, name.ptr, name.len) == 0)) {
                *dup_a = ix->slots[s] - 1;
                *dup_b = i;
                return false;
            }
        }
        ix->slots[s] = i + 1;
    }
    return true;
}

/* ---- KVs ----------------------------------------------------------------------------------- */

/* Validates the elements of an array (elem type and count already read) at depth `depth`
 * (1 = a KV's own array). `str_off`, if not NULL, receives the offset of each string element
 * from `base`. The work is linear in the bytes consumed: every element takes at least 1 byte. */
static bool read_array_elems(gguf_cursor *c, gguf_type elem, uint64_t n, int depth,
                             const uint8_t *base, uint64_t *str_off) {
    uint64_t esize = gguf_type_size(elem);
    if (esize != 0) {
        if (n > gguf_cursor_left(c) / esize) {
            return gguf_cursor_fail_at(c, c->pos, DFL_ERR_FORMAT,
                                       "array of %llu %s elements runs past the end of the file "
                                       "(%llu bytes left)", (unsigned long long)n,
                                       gguf_type_name(elem), (unsigned long long)gguf_cursor_left(c));
        }
        return gguf_cursor_skip(c, "array elements", n * esize);
    }
    if (elem == GGUF_TYPE_STRING) {
        if (n > gguf_cursor_left(c) / 8) {
            return gguf_cursor_fail_at(c, c->pos, DFL_ERR_FORMAT,
                                       "array of %llu strings runs past the end of the file "
                                       "(%llu bytes left, 8 needed per string)",
                                       (unsigned long long)n, (unsigned long long)gguf_cursor_left(c));
        }
        for (uint64_t i = 0; i < n; i++) {
            uint64_t at = c->pos;
            if (gguf_cursor_left(c) < 8) {
                return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT,
                                           "string element %llu of %llu: length truncated",
                                           (unsigned long long)i, (unsigned long long)n);
            }
            uint64_t len = gguf_load_u64(c->data + at);
            if (len > gguf_cursor_left(c) - 8) {
                return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT,
                                           "string element %llu of %llu: length %llu runs past the "
                                           "end of the file (%llu bytes left)",
                                           (unsigned long long)i, (unsigned long long)n,
                                           (unsigned long long)len,
                                           (unsigned long long)(gguf_cursor_left(c) - 8));
            }
            if (str_off != NULL) {
                str_off[i] = (uint64_t)(c->data + at - base);
            }
            c->pos = at + 8 + len;
        }
        return true;
    }
    if (elem == GGUF_TYPE_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH) {
            return gguf_cursor_fail_at(c, c->pos, DFL_ERR_FORMAT,
                                       "arrays nested deeper than %d levels", GGUF_MAX_ARRAY_DEPTH);
        }
        if (n > gguf_cursor_left(c) / GGUF_MIN_ARRAY_BYTES) {
            return gguf_cursor_fail_at(c, c->pos, DFL_ERR_FORMAT,
                                       "array of %llu arrays runs past the end of the file "
                                       "(%llu bytes left, 12 needed per array)",
                                       (unsigned long long)n, (unsigned long long)gguf_cursor_left(c));
        }
        for (uint64_t i = 0; i < n; i++) {
            uint64_t at = c->pos;
            uint32_t sub_type;
            uint64_t sub_n;
            if (!gguf_cursor_u32(c, "nested array element type", &sub_type) ||
                !gguf_cursor_u64(c, "nested array count", &sub_n)) {
                return false;
            }
            if (sub_type >= GGUF_TYPE_COUNT) {
                return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT,
                                           "nested array %llu (depth %d): unknown element type %u",
                                           (unsigned long long)i, depth + 1, sub_type);
            }
            if (!read_array_elems(c, (gguf_type)sub_type, sub_n, depth + 1, NULL, NULL)) {
                return false;
            }
        }
        return true;
    }
    return gguf_cursor_fail_at(c, c->pos, DFL_ERR_FORMAT, "unknown array element type %u",
                               (unsigned)elem);
}

static bool read_kv(gguf_cursor *c, int64_t i, gguf_kv *kv) {
    char q[400];
    gguf_cursor_ctx(c, "kv %lld", (long long)i);
    kv->offset = c->pos;
    if (!gguf_cursor_str(c, "key", &kv->key)) {
        return false;
    }
    gguf_cursor_ctx(c, "kv %lld '%s'", (long long)i, gguf_str_quote(kv->key, q, sizeof(q)));
    uint64_t type_at = c->pos;
    uint32_t type;
    if (!gguf_cursor_u32(c, "value type", &type)) {
        return false;
    }
    if (type >= GGUF_TYPE_COUNT) {
        return gguf_cursor_fail_at(c, type_at, DFL_ERR_FORMAT, "unknown value type %u", type);
    }
    kv->type = (gguf_type)type;
    uint64_t at = c->pos;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: {
        uint8_t v;
        if (!gguf_cursor_u8(c, "value", &v)) return false;
        if (kv->type == GGUF_TYPE_INT8) kv->val.i64 = (int8_t)v;
        else kv->val.u64 = v;
        if (kv->type == GGUF_TYPE_BOOL && v > 1) {
            return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT, "bool value %u is not 0 or 1", v);
        }
        return true;
    }
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: {
        uint16_t v;
        if (!gguf_cursor_u16(c, "value", &v)) return false;
        if (kv->type == GGUF_TYPE_INT16) kv->val.i64 = (int16_t)v;
        else kv->val.u64 = v;
        return true;
    }
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: {
        uint32_t v;
        if (!gguf_cursor_u32(c, "value", &v)) return false;
        if (kv->type == GGUF_TYPE_INT32) {
            kv->val.i64 = (int32_t)v;
        } else if (kv->type == GGUF_TYPE_FLOAT32) {
            float fv;
            memcpy(&fv, &v, sizeof(fv));
            kv->val.f64 = fv;
        } else {
            kv->val.u64 = v;
        }
        return true;
    }
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: {
        uint64_t v;
        if (!gguf_cursor_u64(c, "value", &v)) return false;
        if (kv->type == GGUF_TYPE_INT64) {
            memcpy(&kv->val.i64, &v, sizeof(v));
        } else if (kv->type == GGUF_TYPE_FLOAT64) {
            memcpy(&kv->val.f64, &v, sizeof(v));
        } else {
            kv->val.u64 = v;
        }
        return true;
    }
    case GGUF_TYPE_STRING:
        return gguf_cursor_str(c, "string value", &kv->val.str);
    case GGUF_TYPE_ARRAY: {
        uint32_t elem;
        if (!gguf_cursor_u32(c, "array element type", &elem) ||
            !gguf_cursor_u64(c, "array count", &kv->arr_n)) {
            return false;
        }
        if (elem >= GGUF_TYPE_COUNT) {
            return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT, "unknown array element type %u", elem);
        }
        kv->arr_type = (gguf_type)elem;
        kv->arr_data = c->data + c->pos;
        uint64_t *off = NULL;
        if (kv->arr_type == GGUF_TYPE_STRING) {
            /* bound the count before allocating the index */
            if (kv->arr_n > gguf_cursor_left(c) / 8) {
                return gguf_cursor_fail_at(c, c->pos, DFL_ERR_FORMAT,
                                           "array of %llu strings runs past the end of the file "
                                           "(%llu bytes left, 8 needed per string)",
                                           (unsigned long long)kv->arr_n,
                                           (unsigned long long)gguf_cursor_left(c));
            }
            off = malloc(kv->arr_n > 0 ? kv->arr_n * sizeof(uint64_t) : 1);
            if (off == NULL) {
                return gguf_cursor_fail_at(c, c->pos, DFL_ERR_NOMEM,
                                           "out of memory for the index of %llu strings",
                                           (unsigned long long)kv->arr_n);
            }
            kv->arr_str_off = off;
        }
        uint64_t start = c->pos;
        if (!read_array_elems(c, kv->arr_type, kv->arr_n, 1, kv->arr_data, off)) {
            return false;
        }
        kv->arr_bytes = c->pos - start;
        return true;
    }
    default:
        break;
    }
    return gguf_cursor_fail_at(c, type_at, DFL_ERR_FORMAT, "unknown value type %u", type);
}

/* ---- tensor directory ------------------------------------------------------------------------ */

static bool read_tensor_info(gguf_cursor *c, int64_t i, uint64_t alignment, gguf_tensor *t) {
    char q[400];
    gguf_cursor_ctx(c, "tensor %lld", (long long)i);
    t->info_offset = c->pos;
    if (!gguf_cursor_str(c, "name", &t->name)) {
        return false;
    }
    if (t->name.len == 0) {
        return gguf_cursor_fail_at(c, t->info_offset, DFL_ERR_FORMAT, "empty tensor name");
    }
    if (t->name.len > GGUF_MAX_NAME) {
        return gguf_cursor_fail_at(c, t->info_offset, DFL_ERR_FORMAT,
                                   "tensor name '%s' is %llu bytes (max %d)",
                                   gguf_str_quote(t->name, q, sizeof(q)),
                                   (unsigned long long)t->name.len, GGUF_MAX_NAME);
    }
    gguf_cursor_ctx(c, "tensor %lld '%s'", (long long)i, gguf_str_quote(t->name, q, sizeof(q)));
    uint64_t at = c->pos;
    if (!gguf_cursor_u32(c, "n_dims", &t->n_dims)) {
        return false;
    }
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT, "n_dims %u %s", t->n_dims,
                                   t->n_dims == 0 ? "< 1" : "> 4");
    }
    uint64_t n_elem = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
    }
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = c->pos;
        uint64_t ne;
        if (!gguf_cursor_u64(c, d == 0 ? "ne[0]" : d == 1 ? "ne[1]" : d == 2 ? "ne[2]" : "ne[3]", &ne)) {
            return false;
        }
        if (ne < 1 || ne > (uint64_t)INT64_MAX) {
            return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT, "ne[%u] = %llu (must be 1 .. 2^63-1)",
                                       d, (unsigned long long)ne);
        }
        if (n_elem > (uint64_t)INT64_MAX / ne) {
            return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT,
                                       "element count overflows at ne[%u] = %llu", d,
                                       (unsigned long long)ne);
        }
        n_elem *= ne;
        t->ne[d] = (int64_t)ne;
    }
    at = c->pos;
    if (!gguf_cursor_u32(c, "type", &t->type)) {
        return false;
    }
    const quant_type_info *ti = quant_type_get(t->type);
    if (ti == NULL) {
        return gguf_cursor_fail_at(c, at, DFL_ERR_UNSUPPORTED, "unknown tensor type %u", t->type);
    }
    if (t->ne[0] % ti->blck_size != 0) {
        return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT,
                                   "ne[0] = %lld is not a multiple of the %s block size %lld",
                                   (long long)t->ne[0], ti->name, (long long)ti->blck_size);
    }
    uint64_t row_bytes = (uint64_t)(t->ne[0] / ti->blck_size) * ti->type_size; /* no overflow: ne0 < 2^63, type_size <= 292 */
    if ((uint64_t)(t->ne[0] / ti->blck_size) > UINT64_MAX / ti->type_size) {
        return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT, "row size overflows");
    }
    uint64_t rows = n_elem / (uint64_t)t->ne[0];
    if (rows != 0 && row_bytes > UINT64_MAX / rows) {
        return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT, "byte size overflows (%llu rows of %llu bytes)",
                                   (unsigned long long)rows, (unsigned long long)row_bytes);
    }
    t->nbytes = row_bytes * rows;
    at = c->pos;
    if (!gguf_cursor_u64(c, "offset", &t->offset)) {
        return false;
    }
    if (t->offset % alignment != 0) {
        return gguf_cursor_fail_at(c, at, DFL_ERR_FORMAT,
                                   "data offset %llu is not a multiple of the alignment %llu",
                                   (unsigned long long)t->offset, (unsigned long long)alignment);
    }
    return true;
}

static int compare_by_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a;
    const gguf_tensor *y = *(const gguf_tensor *const *)b;
    if (x->offset != y->offset) {
        return x->offset < y->offset ? -1 : 1;
    }
    return x->info_offset < y->info_offset ? -1 : (x->info_offset > y->info_offset);
}

/* Checks that every tensor's data lies inside the data section and that none overlap. */
static bool check_tensor_data(gguf_cursor *c, gguf_file *f) {
    char q[400], q2[400];
    uint64_t data_size = f->size - f->data_offset;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            gguf_cursor_ctx(c, "tensor %lld '%s'", (long long)i, gguf_str_quote(t->name, q, sizeof(q)));
            return gguf_cursor_fail_at(c, t->info_offset, DFL_ERR_FORMAT,
                                       "data at offset %llu + %llu bytes runs past the end of the "
                                       "file (data section %llu..%llu)",
                                       (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                                       (unsigned long long)f->data_offset, (unsigned long long)f->size);
        }
        t->data = f->data + f->data_offset + t->offset;
    }
    if (f->n_tensors < 2) {
        return true;
    }
    gguf_tensor **sorted = malloc((size_t)f->n_tensors * sizeof(*sorted));
    if (sorted == NULL) {
        gguf_cursor_ctx(c, "tensor directory");
        return gguf_cursor_fail_at(c, 0, DFL_ERR_NOMEM, "out of memory sorting %lld tensors",
                                   (long long)f->n_tensors);
    }
    for (int64_t i = 0; i < f->n_tensors; i++) {
        sorted[i] = &f->tensors[i];
    }
    qsort(sorted, (size_t)f->n_tensors, sizeof(*sorted), compare_by_offset);
    bool ok = true;
    for (int64_t i = 1; i < f->n_tensors && ok; i++) {
        const gguf_tensor *a = sorted[i - 1], *b = sorted[i];
        if (a->offset + a->nbytes > b->offset) {
            const gguf_tensor *later = a->info_offset > b->info_offset ? a : b;
            const gguf_tensor *other = later == a ? b : a;
            gguf_cursor_ctx(c, "tensor %lld '%s'", (long long)(later - f->tensors),
                            gguf_str_quote(later->name, q, sizeof(q)));
            ok = gguf_cursor_fail_at(c, later->info_offset, DFL_ERR_FORMAT,
                                     "data [%llu, %llu) overlaps tensor %lld '%s' data [%llu, %llu)",
                                     (unsigned long long)later->offset,
                                     (unsigned long long)(later->offset + later->nbytes),
                                     (long long)(other - f->tensors),
                                     gguf_str_quote(other->name, q2, sizeof(q2)),
                                     (unsigned long long)other->offset,
                                     (unsigned long long)(other->offset + other->nbytes));
        }
    }
    free(sorted);
    return ok;
}

/* ---- open ------------------------------------------------------------------------------------ */

/* Reads general.alignment if present: any integer type, nonzero power of two. */
static bool read_alignment(gguf_cursor *c, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_index_find(&f->kv_index, "general.alignment", 17, kv_name_of, f->kvs);
    if (i < 0) {
        return true;
    }
    const gguf_kv *kv = &f->kvs[i];
    gguf_cursor_ctx(c, "kv %lld 'general.alignment'", (long long)i);
    uint64_t v;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        v = kv->val.u64;
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        if (kv->val.i64 <= 0) {
            return gguf_cursor_fail_at(c, kv->offset, DFL_ERR_FORMAT,
                                       "alignment %lld is not a positive power of two",
                                       (long long)kv->val.i64);
        }
        v = (uint64_t)kv->val.i64;
        break;
    default:
        return gguf_cursor_fail_at(c, kv->offset, DFL_ERR_FORMAT,
                                   "alignment must be an integer, found %s", gguf_type_name(kv->type));
    }
    if (v == 0 || (v & (v - 1)) != 0) {
        return gguf_cursor_fail_at(c, kv->offset, DFL_ERR_FORMAT,
                                   "alignment %llu is not a positive power of two",
                                   (unsigned long long)v);
    }
    f->alignment = v;
    return true;
}

static bool parse(gguf_cursor *c, gguf_file *f) {
    char q[400], q2[400];
    gguf_cursor_ctx(c, "header");
    uint32_t magic;
    if (!gguf_cursor_u32(c, "magic", &magic)) {
        return false;
    }
    if (memcmp(f->data, "GGUF", 4) != 0) {
        return gguf_cursor_fail_at(c, 0, DFL_ERR_FORMAT,
                                   "bad magic %02x %02x %02x %02x (not a GGUF file)", f->data[0],
                                   f->data[1], f->data[2], f->data[3]);
    }
    if (!gguf_cursor_u32(c, "version", &f->version)) {
        return false;
    }
    if (f->version != 3) {
        return gguf_cursor_fail_at(c, 4, DFL_ERR_UNSUPPORTED, "unsupported GGUF version %u%s",
                                   f->version,
                                   f->version == 0x03000000u ? " (a big-endian file?)"
                                   : " (only version 3 is supported)");
    }
    uint64_t n_tensors, n_kv;
    if (!gguf_cursor_u64(c, "n_tensors", &n_tensors) || !gguf_cursor_u64(c, "n_kv", &n_kv)) {
        return false;
    }
    uint64_t left = gguf_cursor_left(c);
    if (n_kv > left / GGUF_MIN_KV_BYTES) {
        return gguf_cursor_fail_at(c, 16, DFL_ERR_FORMAT,
                                   "n_kv %llu is larger than the file allows (%llu bytes left, "
                                   "at least %d per kv)", (unsigned long long)n_kv,
                                   (unsigned long long)left, GGUF_MIN_KV_BYTES);
    }
    if (n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        n_tensors * GGUF_MIN_TENSOR_BYTES > left - n_kv * GGUF_MIN_KV_BYTES) {
        return gguf_cursor_fail_at(c, 8, DFL_ERR_FORMAT,
                                   "n_tensors %llu is larger than the file allows (%llu bytes "
                                   "left, at least %d per tensor info)", (unsigned long long)n_tensors,
                                   (unsigned long long)left, GGUF_MIN_TENSOR_BYTES);
    }
    f->kvs = calloc(n_kv > 0 ? n_kv : 1, sizeof(gguf_kv));
    f->tensors = calloc(n_tensors > 0 ? n_tensors : 1, sizeof(gguf_tensor));
    if (f->kvs == NULL || f->tensors == NULL) {
        return gguf_cursor_fail_at(c, 8, DFL_ERR_NOMEM, "out of memory for %llu kvs and %llu tensors",
                                   (unsigned long long)n_kv, (unsigned long long)n_tensors);
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = (int64_t)i + 1; /* counts the kv being read, so close frees its index */
        if (!read_kv(c, (int64_t)i, &f->kvs[i])) {
            return false;
        }
    }
    f->n_kv = (int64_t)n_kv;
    int64_t dup_a = -1, dup_b = -1;
    if (!index_build(&f->kv_index, f->n_kv, kv_name_of, f->kvs, &dup_a, &dup_b)) {
        gguf_cursor_ctx(c, "kv %lld", (long long)dup_b);
        if (dup_a < 0) {
            return gguf_cursor_fail_at(c, 24, DFL_ERR_NOMEM, "out of memory for the key index");
        }
        return gguf_cursor_fail_at(c, f->kvs[dup_b].offset, DFL_ERR_FORMAT,
                                   "duplicate key '%s' (also kv %lld)",
                                   gguf_str_quote(f->kvs[dup_b].key, q, sizeof(q)), (long long)dup_a);
    }
    if (!read_alignment(c, f)) {
        return false;
    }
    f->n_tensors = (int64_t)n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (!read_tensor_info(c, (int64_t)i, f->alignment, &f->tensors[i])) {
            return false;
        }
    }
    if (!index_build(&f->tensor_index, f->n_tensors, tensor_name_of, f->tensors, &dup_a, &dup_b)) {
        gguf_cursor_ctx(c, "tensor %lld", (long long)dup_b);
        if (dup_a < 0) {
            return gguf_cursor_fail_at(c, 24, DFL_ERR_NOMEM, "out of memory for the tensor index");
        }
        return gguf_cursor_fail_at(c, f->tensors[dup_b].info_offset, DFL_ERR_FORMAT,
                                   "duplicate tensor name '%s' (also tensor %lld '%s')",
                                   gguf_str_quote(f->tensors[dup_b].name, q, sizeof(q)),
                                   (long long)dup_a, gguf_str_quote(f->tensors[dup_a].name, q2, sizeof(q2)));
    }
    /* the data section starts at the end of the infos, padded to the alignment */
    uint64_t end = c->pos;
    uint64_t pad = end % f->alignment == 0 ? 0 : f->alignment - end % f->alignment;
    gguf_cursor_ctx(c, "data section");
    if (pad > UINT64_MAX - end || end + pad > f->size) {
        if (n_tensors == 0) {
            f->data_offset = f->size; /* no data: the padding may be absent */
            return true;
        }
        return gguf_cursor_fail_at(c, end, DFL_ERR_FORMAT,
                                   "file truncated: the data section starts at offset %llu "
                                   "(alignment %llu) but the file has %llu bytes",
                                   (unsigned long long)(pad > UINT64_MAX - end ? UINT64_MAX : end + pad),
                                   (unsigned long long)f->alignment, (unsigned long long)f->size);
    }
    f->data_offset = end + pad;
    return check_tensor_data(c, f);
}

static gguf_file *open_common(gguf_file *f, dfl_error *err) {
    gguf_cursor c;
    gguf_cursor_init(&c, f->data, f->size, f->label, err);
    if (!parse(&c, f)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

static gguf_file *file_new(const char *label, dfl_error *err) {
    gguf_file *f = calloc(1, sizeof(*f));
    if (f != NULL) {
        f->label = strdup(label);
    }
    if (f == NULL || f->label == NULL) {
        free(f);
        error_set(err, DFL_ERR_NOMEM, "%s: out of memory", label);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open(const char *path, dfl_error *err) {
    gguf_file *f = file_new(path, err);
    if (f == NULL) {
        return NULL;
    }
    if (fmap_open(&f->map, path, err) != DFL_OK) {
        gguf_close(f);
        return NULL;
    }
    f->data = f->map.data;
    f->size = f->map.size;
    return open_common(f, err);
}

gguf_file *gguf_open_memory(const uint8_t *data, size_t size, dfl_error *err) {
    gguf_file *f = file_new("<memory>", err);
    if (f == NULL) {
        return NULL;
    }
    f->data = data;
    f->size = data != NULL ? size : 0;
    return open_common(f, err);
}

void gguf_close(gguf_file *f) {
    if (f == NULL) {
        return;
    }
    for (int64_t i = 0; i < f->n_kv; i++) {
        free((void *)f->kvs[i].arr_str_off);
    }
    free(f->kvs);
    free(f->tensors);
    free(f->kv_index.slots);
    free(f->tensor_index.slots);
    fmap_close(&f->map);
    free(f->label);
    free(f);
}
