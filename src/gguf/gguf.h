/* gguf.h: GGUF v3 reader (mmap, bounds-checked cursor, sticky first error naming the byte offset
 * and field; nothing read from the file is trusted) and writer (files llama.cpp loads). */
#ifndef DFL_GGUF_H
#define DFL_GGUF_H

#include "dflash.h"

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT,
} gguf_type;

const char *gguf_type_name(gguf_type type);
/* Bytes of one value of a fixed-size type (u8 .. f64, bool); 0 for STRING, ARRAY and unknown. */
uint64_t gguf_type_size(gguf_type type);

/* Deepest nesting of arrays the reader accepts (an array of arrays is depth 2). */
#define GGUF_MAX_ARRAY_DEPTH 8

/* A string inside the mapping (not NUL-terminated). */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

bool gguf_str_eq(gguf_str s, const char *cstr);

/* One key/value pair. Scalars are decoded; arrays keep a pointer to their raw elements. */
typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    uint64_t offset;         /* byte offset of the key in the file */
    union {
        uint64_t u64;        /* unsigned integer types and bool */
        int64_t i64;         /* signed integer types */
        double f64;          /* FLOAT32 / FLOAT64 */
        gguf_str str;        /* STRING */
    } val;
    /* ARRAY only */
    gguf_type arr_type;      /* element type (may be ARRAY: nested) */
    uint64_t arr_n;          /* element count (validated against the file) */
    const uint8_t *arr_data; /* first element's bytes in the mapping */
    uint64_t arr_bytes;      /* bytes of all elements */
    const uint64_t *arr_str_off; /* STRING arrays: offset of element i from arr_data (an index built at open;
                                  * NULL for arrays nested in arrays, whose access walks the elements) */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length; unused dims are 1 */
    uint32_t type;             /* ggml type id (quant_type) */
    uint64_t offset;           /* from the start of the data section */
    uint64_t nbytes;
    const void *data;          /* inside the mapping */
    uint64_t info_offset;      /* byte offset of the tensor info in the file */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Opens and validates a GGUF v3 file (mmap). NULL + err on any problem. */
gguf_file *gguf_open(const char *path, dfl_error *err);
/* Same over a caller-owned buffer that must outlive the gguf_file (used by the fuzzer). */
gguf_file *gguf_open_memory(const uint8_t *data, size_t size, dfl_error *err);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);
uint64_t gguf_data_offset(const gguf_file *f);   /* start of the data section */
uint64_t gguf_file_size(const gguf_file *f);
const uint8_t *gguf_file_data(const gguf_file *f);

int64_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i);
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key); /* NULL if absent */

int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

/* Typed getters. They return DFL_ERR_MISSING if the key is absent, DFL_ERR_MISMATCH (with the
 * key, expected and found type in err) if the type is wrong. Integer getters accept every integer
 * width (and bool) and fail if the value does not fit. */
dfl_status gguf_get_int(const gguf_file *f, const char *key, int64_t *out, dfl_error *err);
/* gguf_get_int, then DFL_ERR_MISMATCH (naming the key, value and range) unless lo <= value <= hi. */
dfl_status gguf_get_int_range(const gguf_file *f, const char *key, int64_t lo, int64_t hi,
                              int64_t *out, dfl_error *err);
dfl_status gguf_get_float(const gguf_file *f, const char *key, double *out, dfl_error *err); /* f32, f64 or integer */
dfl_status gguf_get_bool(const gguf_file *f, const char *key, bool *out, dfl_error *err);
dfl_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, dfl_error *err);
/* An array of a given element type (GGUF_TYPE_COUNT = any). */
dfl_status gguf_get_arr(const gguf_file *f, const char *key, gguf_type elem_type,
                        const gguf_kv **out, dfl_error *err);

/* Array element access (i < arr_n is checked; false if out of range or wrong type). */
bool gguf_arr_int(const gguf_kv *kv, uint64_t i, int64_t *out);   /* any integer element type */
bool gguf_arr_float(const gguf_kv *kv, uint64_t i, double *out);  /* f32/f64 elements */
bool gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out);  /* STRING elements */
/* Element i of an array of arrays, as an ARRAY kv (same key and offset as the parent). */
bool gguf_arr_sub(const gguf_kv *kv, uint64_t i, gguf_kv *out);
/* Name of the file for messages (the path, or "<memory>"). */
const char *gguf_label(const gguf_file *f);

/* ---- writer ----------------------------------------------------------------------------- */

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
/* Key setters (the key and strings are copied). Setting a key twice replaces its value. */
void gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
void gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n);
void gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n);
/* n strings of lengths lens[i] (lens NULL: NUL-terminated). */
void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v,
                             const size_t *lens, size_t n);
/* The remaining scalar widths. */
void gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
void gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
void gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
void gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
void gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
/* An array of n fixed-size elements (elem_type u8 .. f64 or bool) from host values of that C
 * type (uint8_t, int8_t, ..., float, bool, ..., double). */
void gguf_writer_set_arr_num(gguf_writer *w, const char *key, gguf_type elem_type, const void *v,
                             size_t n);
/* An array of n elements of any type given as their serialized GGUF bytes (used for arrays of
 * arrays: each element is `u32 elem_type, u64 count, elements`). The bytes are copied as is. */
void gguf_writer_set_arr_raw(gguf_writer *w, const char *key, gguf_type elem_type, uint64_t n,
                             const void *bytes, size_t nbytes);
/* Adds a tensor. The data is NOT copied: it must stay valid until gguf_writer_write returns.
 * nbytes must equal the row size of the type times the row count. The name must be 1..63 bytes
 * (llama.cpp's limit) and unique. Errors are also kept and reported again by gguf_writer_write. */
dfl_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const int64_t *ne, const void *data, size_t nbytes, dfl_error *err);
/* Writes the file (header, KVs in insertion order, tensor infos, data aligned to 32 or to a
 * u32 `general.alignment` the caller set). Reports the first error of any earlier setter
 * (out of memory, bad argument). A partly written file is removed. */
dfl_status gguf_writer_write(gguf_writer *w, const char *path, dfl_error *err);

#endif
