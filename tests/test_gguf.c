/* test_gguf.c: GGUF reader and writer: round trips of every KV type and tensor type, integer
 * getters across widths, lookups among thousands of tensors, and every kind of bad input
 * (built byte by byte here), each of which must fail cleanly with a message saying what and
 * where. */
#include "test.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

/* ---- a tiny little-endian byte builder ------------------------------------------------------- */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_put(bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (b->p == NULL) abort();
        b->cap = cap;
    }
    if (n > 0) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    bb_put(b, x, 4);
}
static void bb_u64(bb *b, uint64_t v) { bb_u32(b, (uint32_t)v); bb_u32(b, (uint32_t)(v >> 32)); }
static void bb_str(bb *b, const char *s) { bb_u64(b, strlen(s)); bb_put(b, s, strlen(s)); }
static void bb_pad(bb *b, size_t align) { while (b->n % align) bb_u8(b, 0); }
static void bb_zeros(bb *b, size_t n) { for (size_t i = 0; i < n; i++) bb_u8(b, 0); }
static void bb_header(bb *b, uint64_t n_tensors, uint64_t n_kv) {
    bb_put(b, "GGUF", 4);
    bb_u32(b, 3);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v) { bb_str(b, key); bb_u32(b, GGUF_TYPE_UINT32); bb_u32(b, v); }
static void bb_kv_str(bb *b, const char *key, const char *v) { bb_str(b, key); bb_u32(b, GGUF_TYPE_STRING); bb_str(b, v); }

typedef struct tinfo {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
} tinfo;

static void bb_tinfo(bb *b, const tinfo *t) {
    bb_str(b, t->name);
    bb_u32(b, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++) bb_u64(b, d < 4 ? t->ne[d] : 1);
    bb_u32(b, t->type);
    bb_u64(b, t->offset);
}

/* A file with one `general.architecture` KV, the given tensors and `data_size` bytes of data. */
static void bb_tensor_file(bb *b, const tinfo *ts, int n, size_t data_size) {
    bb_header(b, (uint64_t)n, 1);
    bb_kv_str(b, "general.architecture", "test");
    for (int i = 0; i < n; i++) bb_tinfo(b, &ts[i]);
    bb_pad(b, 32);
    for (size_t i = 0; i < data_size; i++) bb_u8(b, (uint8_t)i);
}

/* Opens bytes from an exact-size heap copy (so ASan sees any overread); returns the file or NULL
 * with err filled. */
static gguf_file *open_bytes(const uint8_t *p, size_t n, dfl_error *err) {
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    memset(err, 0, sizeof(*err));
    gguf_file *f = gguf_open_memory(copy, n, err);
    if (f != NULL) {
        gguf_close(f);
        f = NULL;
        /* reopen over the caller's bytes for inspection */
        f = gguf_open_memory(p, n, err);
    }
    free(copy);
    return f;
}

/* Expects the bytes to be rejected with `code` and a message containing every needle. */
#define EXPECT_BAD(b, code_, ...) do { \
        dfl_error e_; \
        gguf_file *f_ = open_bytes((b)->p, (b)->n, &e_); \
        CHECK_MSG(f_ == NULL, "accepted a bad file (expected: %s)", #__VA_ARGS__); \
        gguf_close(f_); \
        CHECK_EQ_INT(e_.code, code_); \
        const char *needles_[] = {__VA_ARGS__}; \
        for (size_t k_ = 0; k_ < sizeof(needles_) / sizeof(needles_[0]); k_++) \
            CHECK_STR_CONTAINS(e_.msg, needles_[k_]); \
    } while (0)

/* ---- round trips ----------------------------------------------------------------------------- */

TEST(gguf_roundtrip_every_kv_type) {
    gguf_writer *w = gguf_writer_new();
    REQUIRE(w != NULL);
    gguf_writer_set_str(w, "general.architecture", "qwen3");
    gguf_writer_set_u8(w, "k.u8", 250);
    gguf_writer_set_i8(w, "k.i8", -100);
    gguf_writer_set_u16(w, "k.u16", 65000);
    gguf_writer_set_i16(w, "k.i16", -32000);
    gguf_writer_set_u32(w, "k.u32", 4000000000u);
    gguf_writer_set_i32(w, "k.i32", -2000000000);
    gguf_writer_set_u64(w, "k.u64", 0xfedcba9876543210ull);
    gguf_writer_set_i64(w, "k.i64", -(1ll << 50));
    gguf_writer_set_f32(w, "k.f32", 0.15625f);
    gguf_writer_set_f64(w, "k.f64", -1e300);
    gguf_writer_set_bool(w, "k.true", true);
    gguf_writer_set_bool(w, "k.false", false);
    gguf_writer_set_str(w, "k.str", "h\xc3\xa9llo");
    gguf_writer_set_str(w, "k.empty", "");
    gguf_writer_set_u32(w, "k.replaced", 1);
    const char *strs[] = {"a", "", "with\0nul", "last"};
    size_t lens[] = {1, 0, 8, 4};
    gguf_writer_set_arr_str(w, "k.strs", strs, lens, 4);
    gguf_writer_set_arr_str(w, "k.strs0", NULL, NULL, 0);
    uint8_t a_u8[] = {0, 255};
    int8_t a_i8[] = {-128, 127};
    uint16_t a_u16[] = {65535};
    int16_t a_i16[] = {-32768, 5};
    uint32_t a_u32[] = {4294967295u};
    int32_t a_i32[] = {-1, 2, -3};
    uint64_t a_u64[] = {1ull << 63, 7};
    int64_t a_i64[] = {INT64_MIN, INT64_MAX};
    float a_f32[] = {1.5f, -0.0f};
    double a_f64[] = {3.25};
    bool a_bool[] = {true, false, true};
    gguf_writer_set_arr_num(w, "a.u8", GGUF_TYPE_UINT8, a_u8, 2);
    gguf_writer_set_arr_num(w, "a.i8", GGUF_TYPE_INT8, a_i8, 2);
    gguf_writer_set_arr_num(w, "a.u16", GGUF_TYPE_UINT16, a_u16, 1);
    gguf_writer_set_arr_num(w, "a.i16", GGUF_TYPE_INT16, a_i16, 2);
    gguf_writer_set_arr_num(w, "a.u32", GGUF_TYPE_UINT32, a_u32, 1);
    gguf_writer_set_arr_i32(w, "a.i32", a_i32, 3);
    gguf_writer_set_arr_num(w, "a.u64", GGUF_TYPE_UINT64, a_u64, 2);
    gguf_writer_set_arr_num(w, "a.i64", GGUF_TYPE_INT64, a_i64, 2);
    gguf_writer_set_arr_f32(w, "a.f32", a_f32, 2);
    gguf_writer_set_arr_num(w, "a.f64", GGUF_TYPE_FLOAT64, a_f64, 1);
    gguf_writer_set_arr_num(w, "a.bool", GGUF_TYPE_BOOL, a_bool, 3);
    gguf_writer_set_arr_i32(w, "a.empty", NULL, 0);
    /* nested: [[7, 8], ["hi", ""], [[9]], []] */
    bb nb = {0};
    bb_u32(&nb, GGUF_TYPE_INT32); bb_u64(&nb, 2); bb_u32(&nb, 7); bb_u32(&nb, 8);
    bb_u32(&nb, GGUF_TYPE_STRING); bb_u64(&nb, 2); bb_str(&nb, "hi"); bb_str(&nb, "");
    bb_u32(&nb, GGUF_TYPE_ARRAY); bb_u64(&nb, 1); bb_u32(&nb, GGUF_TYPE_UINT8); bb_u64(&nb, 1); bb_u8(&nb, 9);
    bb_u32(&nb, GGUF_TYPE_FLOAT32); bb_u64(&nb, 0);
    gguf_writer_set_arr_raw(w, "a.nested", GGUF_TYPE_ARRAY, 4, nb.p, nb.n);
    free(nb.p);
    gguf_writer_set_u32(w, "k.replaced", 2); /* keeps its position */

    char path[512];
    dfl_error err = {0};
    CHECK_EQ_INT(gguf_writer_write(w, test_path(t, "kv.gguf", path, sizeof(path)), &err), DFL_OK);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    REQUIRE(f != NULL);
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_n_kv(f), 31);
    CHECK_EQ_INT(gguf_n_tensors(f), 0);
    CHECK(gguf_str_eq(gguf_kv_at(f, 0)->key, "general.architecture"));
    CHECK(gguf_str_eq(gguf_kv_at(f, 15)->key, "k.replaced"));
    CHECK(gguf_str_eq(gguf_kv_at(f, 30)->key, "a.nested"));

    const gguf_kv *kv;
    REQUIRE((kv = gguf_find_kv(f, "k.u8")) != NULL && kv->type == GGUF_TYPE_UINT8);
    CHECK_EQ_INT(kv->val.u64, 250);
    REQUIRE((kv = gguf_find_kv(f, "k.i8")) != NULL && kv->type == GGUF_TYPE_INT8);
    CHECK_EQ_INT(kv->val.i64, -100);
    CHECK_EQ_INT(gguf_find_kv(f, "k.u16")->val.u64, 65000);
    CHECK_EQ_INT(gguf_find_kv(f, "k.i16")->val.i64, -32000);
    CHECK_EQ_INT(gguf_find_kv(f, "k.u32")->val.u64, 4000000000u);
    CHECK_EQ_INT(gguf_find_kv(f, "k.i32")->val.i64, -2000000000);
    CHECK(gguf_find_kv(f, "k.u64")->val.u64 == 0xfedcba9876543210ull);
    CHECK_EQ_INT(gguf_find_kv(f, "k.i64")->val.i64, -(1ll << 50));
    CHECK(gguf_find_kv(f, "k.f32")->type == GGUF_TYPE_FLOAT32 && gguf_find_kv(f, "k.f32")->val.f64 == 0.15625);
    CHECK(gguf_find_kv(f, "k.f64")->val.f64 == -1e300);
    CHECK_EQ_INT(gguf_find_kv(f, "k.replaced")->val.u64, 2);
    bool bv = false;
    CHECK_EQ_INT(gguf_get_bool(f, "k.true", &bv, &err), DFL_OK);
    CHECK(bv);
    CHECK_EQ_INT(gguf_get_bool(f, "k.false", &bv, &err), DFL_OK);
    CHECK(!bv);
    gguf_str s;
    CHECK_EQ_INT(gguf_get_str(f, "k.str", &s, &err), DFL_OK);
    CHECK(gguf_str_eq(s, "h\xc3\xa9llo"));
    CHECK_EQ_INT(gguf_get_str(f, "k.empty", &s, &err), DFL_OK);
    CHECK_EQ_INT(s.len, 0);

    const gguf_kv *arr;
    CHECK_EQ_INT(gguf_get_arr(f, "k.strs", GGUF_TYPE_STRING, &arr, &err), DFL_OK);
    CHECK_EQ_INT(arr->arr_n, 4);
    CHECK(arr->arr_str_off != NULL);
    for (uint64_t i = 0; i < 4; i++) {
        CHECK(gguf_arr_str(arr, i, &s) && s.len == lens[i] && memcmp(s.ptr, strs[i], lens[i]) == 0);
    }
    CHECK(!gguf_arr_str(arr, 4, &s));
    int64_t iv;
    CHECK(!gguf_arr_int(arr, 0, &iv));
    CHECK_EQ_INT(gguf_get_arr(f, "k.strs0", GGUF_TYPE_STRING, &arr, &err), DFL_OK);
    CHECK_EQ_INT(arr->arr_n, 0);
    CHECK(!gguf_arr_str(arr, 0, &s));

    struct { const char *key; int n; int64_t v[3]; } ints[] = {
        {"a.u8", 2, {0, 255}}, {"a.i8", 2, {-128, 127}}, {"a.u16", 1, {65535}},
        {"a.i16", 2, {-32768, 5}}, {"a.u32", 1, {4294967295ll}}, {"a.i32", 3, {-1, 2, -3}},
        {"a.i64", 2, {INT64_MIN, INT64_MAX}}, {"a.bool", 3, {1, 0, 1}},
    };
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        REQUIRE(gguf_get_arr(f, ints[k].key, GGUF_TYPE_COUNT, &arr, &err) == DFL_OK);
        CHECK_EQ_INT(arr->arr_n, ints[k].n);
        for (int i = 0; i < ints[k].n; i++) {
            CHECK_MSG(gguf_arr_int(arr, (uint64_t)i, &iv) && iv == ints[k].v[i], "%s[%d]", ints[k].key, i);
        }
        CHECK(!gguf_arr_int(arr, (uint64_t)ints[k].n, &iv));
    }
    REQUIRE(gguf_get_arr(f, "a.u64", GGUF_TYPE_UINT64, &arr, &err) == DFL_OK);
    CHECK(!gguf_arr_int(arr, 0, &iv)); /* 2^63 does not fit */
    CHECK(gguf_arr_int(arr, 1, &iv) && iv == 7);
    double dv;
    REQUIRE(gguf_get_arr(f, "a.f32", GGUF_TYPE_FLOAT32, &arr, &err) == DFL_OK);
    CHECK(gguf_arr_float(arr, 0, &dv) && dv == 1.5);
    CHECK(gguf_arr_float(arr, 1, &dv) && dv == 0.0);
    CHECK(!gguf_arr_int(arr, 0, &iv));
    REQUIRE(gguf_get_arr(f, "a.f64", GGUF_TYPE_FLOAT64, &arr, &err) == DFL_OK);
    CHECK(gguf_arr_float(arr, 0, &dv) && dv == 3.25);
    REQUIRE(gguf_get_arr(f, "a.empty", GGUF_TYPE_INT32, &arr, &err) == DFL_OK);
    CHECK_EQ_INT(arr->arr_n, 0);
    CHECK(!gguf_arr_int(arr, 0, &iv));

    REQUIRE(gguf_get_arr(f, "a.nested", GGUF_TYPE_ARRAY, &arr, &err) == DFL_OK);
    CHECK_EQ_INT(arr->arr_n, 4);
    gguf_kv sub, sub2;
    REQUIRE(gguf_arr_sub(arr, 0, &sub));
    CHECK(sub.arr_type == GGUF_TYPE_INT32 && sub.arr_n == 2);
    CHECK(gguf_arr_int(&sub, 1, &iv) && iv == 8);
    REQUIRE(gguf_arr_sub(arr, 1, &sub));
    CHECK(sub.arr_type == GGUF_TYPE_STRING && sub.arr_n == 2);
    CHECK(gguf_arr_str(&sub, 0, &s) && gguf_str_eq(s, "hi"));
    CHECK(gguf_arr_str(&sub, 1, &s) && s.len == 0);
    REQUIRE(gguf_arr_sub(arr, 2, &sub));
    REQUIRE(gguf_arr_sub(&sub, 0, &sub2));
    CHECK(sub2.arr_type == GGUF_TYPE_UINT8 && gguf_arr_int(&sub2, 0, &iv) && iv == 9);
    REQUIRE(gguf_arr_sub(arr, 3, &sub));
    CHECK(sub.arr_type == GGUF_TYPE_FLOAT32 && sub.arr_n == 0);
    CHECK(!gguf_arr_sub(arr, 4, &sub));

    /* a wrong element type is a mismatch naming the key and both types */
    dfl_error e2 = {0};
    CHECK_EQ_INT(gguf_get_arr(f, "k.strs", GGUF_TYPE_INT32, &arr, &e2), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e2.msg, "key 'k.strs': expected an array of i32, found an array of string");
    gguf_close(f);
}

TEST(gguf_roundtrip_tensors) {
    /* shapes with awkward sizes, every type the writer quantizes */
    float src[4 * 96];
    for (int i = 0; i < 4 * 96; i++) src[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    static uint8_t buf[5][4 * 96 * 4];
    const uint32_t types[5] = {QUANT_TYPE_F32, QUANT_TYPE_F16, QUANT_TYPE_BF16, QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_0};
    size_t sizes[5];
    gguf_writer *w = gguf_writer_new();
    dfl_error err = {0};
    gguf_writer_set_str(w, "general.architecture", "qwen3");
    for (int k = 0; k < 5; k++) {
        int64_t ne[3] = {96, k == 4 ? 2 : 4, 2}; /* q4_0 as [96, 2, 2], the others [96, 4] */
        sizes[k] = 0;
        for (int r = 0; r < 4; r++) {
            sizes[k] += quant_quantize_row(types[k], src + r * 96, buf[k] + sizes[k], 96);
        }
        REQUIRE(sizes[k] == quant_row_size(types[k], 96) * 4);
        char name[32];
        snprintf(name, sizeof(name), "t.%s", quant_type_get(types[k])->name);
        CHECK_EQ_INT(gguf_writer_add_tensor(w, name, types[k], k == 4 ? 3 : 2, ne, buf[k], sizes[k], &err),
                     DFL_OK);
    }
    int64_t ne1[1] = {7};
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "norm", QUANT_TYPE_F32, 1, ne1, src, 28, &err), DFL_OK);
    char path[512];
    CHECK_EQ_INT(gguf_writer_write(w, test_path(t, "t.gguf", path, sizeof(path)), &err), DFL_OK);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    REQUIRE(f != NULL);
    CHECK_EQ_INT(gguf_n_tensors(f), 6);
    CHECK_EQ_INT(gguf_alignment(f), 32);
    CHECK_EQ_INT(gguf_data_offset(f) % 32, 0);
    CHECK(gguf_find_kv(f, "general.alignment") == NULL); /* default: not written */
    for (int k = 0; k < 5; k++) {
        char name[32];
        snprintf(name, sizeof(name), "t.%s", quant_type_get(types[k])->name);
        const gguf_tensor *tt = gguf_find_tensor(f, name);
        REQUIRE(tt != NULL);
        CHECK_EQ_INT(tt->type, types[k]);
        CHECK_EQ_INT(tt->n_dims, k == 4 ? 3 : 2);
        CHECK_EQ_INT(tt->ne[0], 96);
        CHECK_EQ_INT(tt->ne[1], k == 4 ? 2 : 4);
        CHECK_EQ_INT(tt->ne[2], k == 4 ? 2 : 1);
        CHECK_EQ_INT(tt->ne[3], 1);
        CHECK_EQ_INT(tt->nbytes, sizes[k]);
        CHECK_EQ_INT(tt->offset % 32, 0);
        CHECK(memcmp(tt->data, buf[k], sizes[k]) == 0);
        CHECK((const uint8_t *)tt->data == gguf_file_data(f) + gguf_data_offset(f) + tt->offset);
    }
    const gguf_tensor *norm = gguf_find_tensor(f, "norm");
    REQUIRE(norm != NULL);
    CHECK(memcmp(norm->data, src, 28) == 0);
    CHECK(gguf_tensor_at(f, 5) == norm);
    CHECK(gguf_find_tensor(f, "nor") == NULL);
    CHECK(gguf_find_tensor(f, "norm.") == NULL);
    CHECK(gguf_tensor_at(f, 6) == NULL && gguf_tensor_at(f, -1) == NULL);
    /* the file ends right after the last tensor's padded data */
    CHECK_EQ_INT(gguf_file_size(f) % 32, 0);
    CHECK(gguf_file_size(f) >= norm->offset + gguf_data_offset(f) + 28);
    gguf_close(f);
}

TEST(gguf_writer_alignment_64) {
    gguf_writer *w = gguf_writer_new();
    dfl_error err = {0};
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ne[1] = {3};
    gguf_writer_set_u32(w, "general.alignment", 64);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", QUANT_TYPE_F32, 1, ne, x, 12, &err), DFL_OK);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "b", QUANT_TYPE_F32, 1, ne, x + 3, 12, &err), DFL_OK);
    char path[512];
    CHECK_EQ_INT(gguf_writer_write(w, test_path(t, "a.gguf", path, sizeof(path)), &err), DFL_OK);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    REQUIRE(f != NULL);
    CHECK_EQ_INT(gguf_alignment(f), 64);
    CHECK_EQ_INT(gguf_data_offset(f) % 64, 0);
    CHECK_EQ_INT(gguf_find_tensor(f, "b")->offset, 64);
    CHECK(memcmp(gguf_find_tensor(f, "b")->data, x + 3, 12) == 0);
    gguf_close(f);
}

TEST(gguf_int_getters_across_widths) {
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_u8(w, "u8", 200);
    gguf_writer_set_i8(w, "i8", -8);
    gguf_writer_set_u16(w, "u16", 60000);
    gguf_writer_set_i16(w, "i16", -16);
    gguf_writer_set_u32(w, "u32", 28);
    gguf_writer_set_i32(w, "i32", -32);
    gguf_writer_set_u64(w, "u64", 1ull << 40);
    gguf_writer_set_u64(w, "u64big", UINT64_MAX);
    gguf_writer_set_i64(w, "i64", -64);
    gguf_writer_set_bool(w, "bool", true);
    gguf_writer_set_f32(w, "f32", 1e-6f);
    gguf_writer_set_f64(w, "f64", 1e6);
    gguf_writer_set_str(w, "str", "28");
    float arr[1] = {1};
    gguf_writer_set_arr_f32(w, "arr", arr, 1);
    char path[512];
    dfl_error err = {0};
    CHECK_EQ_INT(gguf_writer_write(w, test_path(t, "i.gguf", path, sizeof(path)), &err), DFL_OK);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    REQUIRE(f != NULL);
    struct { const char *key; int64_t v; } ok[] = {
        {"u8", 200}, {"i8", -8}, {"u16", 60000}, {"i16", -16}, {"u32", 28}, {"i32", -32},
        {"u64", 1ll << 40}, {"i64", -64}, {"bool", 1},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int64_t v = 0;
        dfl_error e = {0};
        CHECK_EQ_INT(gguf_get_int(f, ok[i].key, &v, &e), DFL_OK);
        CHECK_MSG(v == ok[i].v, "%s: %lld != %lld", ok[i].key, (long long)v, (long long)ok[i].v);
        double d = 0;
        if (strcmp(ok[i].key, "bool") != 0) {
            CHECK_EQ_INT(gguf_get_float(f, ok[i].key, &d, &e), DFL_OK);
            CHECK(d == (double)ok[i].v);
        }
    }
    int64_t v;
    dfl_error e = {0};
    CHECK_EQ_INT(gguf_get_int(f, "u64big", &v, &e), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e.msg, "key 'u64big': value 18446744073709551615 does not fit in int64");
    CHECK_STR_CONTAINS(e.msg, path);
    e = (dfl_error){0};
    CHECK_EQ_INT(gguf_get_int(f, "str", &v, &e), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e.msg, "key 'str': expected an integer, found string");
    e = (dfl_error){0};
    CHECK_EQ_INT(gguf_get_int(f, "f32", &v, &e), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e.msg, "found f32");
    e = (dfl_error){0};
    CHECK_EQ_INT(gguf_get_int(f, "arr", &v, &e), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e.msg, "found an array of f32");
    e = (dfl_error){0};
    CHECK_EQ_INT(gguf_get_int(f, "nope", &v, &e), DFL_ERR_MISSING);
    CHECK_STR_CONTAINS(e.msg, "key 'nope' not found");
    e = (dfl_error){0};
    CHECK_EQ_INT(gguf_get_int_range(f, "u32", 1, 28, &v, &e), DFL_OK);
    CHECK_EQ_INT(v, 28);
    CHECK_EQ_INT(gguf_get_int_range(f, "u16", 1, 1000, &v, &e), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e.msg, "key 'u16': value 60000 is out of range [1, 1000]");
    double d;
    e = (dfl_error){0};
    CHECK_EQ_INT(gguf_get_float(f, "f32", &d, &e), DFL_OK);
    CHECK_NEAR(d, 1e-6, 1e-12);
    CHECK_EQ_INT(gguf_get_float(f, "f64", &d, &e), DFL_OK);
    CHECK(d == 1e6);
    CHECK_EQ_INT(gguf_get_float(f, "str", &d, &e), DFL_ERR_MISMATCH);
    e = (dfl_error){0};
    bool b;
    CHECK_EQ_INT(gguf_get_bool(f, "u8", &b, &e), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e.msg, "expected bool, found u8");
    e = (dfl_error){0};
    gguf_str s;
    CHECK_EQ_INT(gguf_get_str(f, "u8", &s, &e), DFL_ERR_MISMATCH);
    CHECK_STR_CONTAINS(e.msg, "expected string, found u8");
    gguf_close(f);
}

TEST(gguf_lookup_among_thousands) {
    enum { N = 5000 };
    gguf_writer *w = gguf_writer_new();
    dfl_error err = {0};
    static float vals[N];
    char name[64];
    for (int i = 0; i < N; i++) {
        vals[i] = (float)i;
        int64_t ne[1] = {1};
        snprintf(name, sizeof(name), "blk.%d.w", i);
        REQUIRE(gguf_writer_add_tensor(w, name, QUANT_TYPE_F32, 1, ne, &vals[i], 4, &err) == DFL_OK);
        snprintf(name, sizeof(name), "key.%d", i);
        gguf_writer_set_i32(w, name, -i);
    }
    char path[512];
    CHECK_EQ_INT(gguf_writer_write(w, test_path(t, "many.gguf", path, sizeof(path)), &err), DFL_OK);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    REQUIRE(f != NULL);
    int bad = 0;
    for (int i = N - 1; i >= 0; i--) {
        snprintf(name, sizeof(name), "blk.%d.w", i);
        const gguf_tensor *tt = gguf_find_tensor(f, name);
        float v;
        if (tt == NULL) { bad++; continue; }
        memcpy(&v, tt->data, 4);
        if (v != (float)i || tt != gguf_tensor_at(f, i)) bad++;
        snprintf(name, sizeof(name), "key.%d", i);
        int64_t iv;
        if (gguf_get_int(f, name, &iv, &err) != DFL_OK || iv != -i) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(gguf_find_tensor(f, "blk.5000.w") == NULL);
    CHECK(gguf_find_kv(f, "key.-1") == NULL);
    gguf_close(f);
}

TEST(gguf_string_array_index) {
    enum { N = 3000 };
    static char store[N][16];
    const char *strs[N];
    for (int i = 0; i < N; i++) {
        snprintf(store[i], sizeof(store[i]), "tok%d", i * 7);
        strs[i] = store[i];
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, NULL, N);
    char path[512];
    dfl_error err = {0};
    CHECK_EQ_INT(gguf_writer_write(w, test_path(t, "s.gguf", path, sizeof(path)), &err), DFL_OK);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    REQUIRE(f != NULL);
    const gguf_kv *arr;
    REQUIRE(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &arr, &err) == DFL_OK);
    REQUIRE(arr->arr_str_off != NULL);
    int bad = 0;
    for (int i = N - 1; i >= 0; i -= 3) {
        gguf_str s;
        if (!gguf_arr_str(arr, (uint64_t)i, &s) || !gguf_str_eq(s, strs[i])) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    gguf_close(f);
}

/* ---- bad input ------------------------------------------------------------------------------- */

/* A valid file exercising every KV type, nested arrays and several tensors, built by the writer. */
static size_t make_rich_file(test_ctx *t, char *path, size_t cap) {
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3");
    gguf_writer_set_u32(w, "general.alignment", 32);
    gguf_writer_set_i8(w, "i8", -1);
    gguf_writer_set_u16(w, "u16", 2);
    gguf_writer_set_u64(w, "u64", 3);
    gguf_writer_set_f64(w, "f64", 4);
    gguf_writer_set_bool(w, "b", true);
    const char *strs[] = {"x", "", "yz"};
    gguf_writer_set_arr_str(w, "strs", strs, NULL, 3);
    int32_t iv[] = {1, 2};
    gguf_writer_set_arr_i32(w, "ints", iv, 2);
    bb nb = {0};
    bb_u32(&nb, GGUF_TYPE_STRING); bb_u64(&nb, 1); bb_str(&nb, "n");
    bb_u32(&nb, GGUF_TYPE_ARRAY); bb_u64(&nb, 1); bb_u32(&nb, GGUF_TYPE_UINT8); bb_u64(&nb, 2); bb_u8(&nb, 1); bb_u8(&nb, 2);
    gguf_writer_set_arr_raw(w, "nested", GGUF_TYPE_ARRAY, 2, nb.p, nb.n);
    free(nb.p);
    static float x[64];
    static uint8_t q8[34 * 2];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    quant_quantize_row(QUANT_TYPE_Q8_0, x, q8, 64);
    int64_t ne1[1] = {5}, ne2[2] = {32, 2};
    dfl_error err = {0};
    gguf_writer_add_tensor(w, "a", QUANT_TYPE_F32, 1, ne1, x, 20, &err);
    gguf_writer_add_tensor(w, "b", QUANT_TYPE_Q8_0, 2, ne2, q8, sizeof(q8), &err);
    gguf_writer_add_tensor(w, "c", QUANT_TYPE_F32, 1, ne1, x, 20, &err);
    dfl_status st = gguf_writer_write(w, test_path(t, "rich.gguf", path, cap), &err);
    gguf_writer_free(w);
    if (st != DFL_OK) return 0;
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    fclose(fp);
    return n;
}

TEST(gguf_truncated_at_every_offset) {
    char path[512];
    size_t n = make_rich_file(t, path, sizeof(path));
    REQUIRE(n > 0);
    uint8_t *full = malloc(n);
    FILE *fp = fopen(path, "rb");
    REQUIRE(fp != NULL && fread(full, 1, n, fp) == n);
    fclose(fp);
    dfl_error err;
    gguf_file *f = open_bytes(full, n, &err);
    REQUIRE(f != NULL);
    uint64_t data_start = gguf_find_tensor(f, "c")->offset + gguf_data_offset(f);
    gguf_close(f);
    int accepted = 0, no_msg = 0;
    for (size_t len = 0; len < n; len++) {
        f = open_bytes(full, len, &err);
        if (f != NULL) {
            /* only the zero padding after the last tensor's data may be cut */
            if (len < data_start + 20) accepted++;
            gguf_close(f);
            continue;
        }
        if (err.code == DFL_OK || strstr(err.msg, "<memory>: offset ") == NULL) {
            if (no_msg++ < 3) test_fail(t, __FILE__, __LINE__, "len %zu: bad message '%s'", len, err.msg);
        }
    }
    CHECK_EQ_INT(accepted, 0);
    CHECK_EQ_INT(no_msg, 0);
    /* two spot checks of what the message says */
    f = open_bytes(full, 10, &err);
    CHECK(f == NULL);
    CHECK_STR_CONTAINS(err.msg, "<memory>: offset 8: header: n_tensors: file truncated");
    f = open_bytes(full, data_start + 19, &err);
    CHECK(f == NULL);
    CHECK_STR_CONTAINS(err.msg, "tensor 2 'c': data at offset");
    CHECK_STR_CONTAINS(err.msg, "runs past the end of the file");
    /* the mmap path reports the file name */
    char path2[512];
    fp = fopen(test_path(t, "cut.gguf", path2, sizeof(path2)), "wb");
    fwrite(full, 1, n / 2, fp);
    fclose(fp);
    err = (dfl_error){0};
    CHECK(gguf_open(path2, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, path2);
    CHECK_EQ_INT(err.code, DFL_ERR_FORMAT);
    free(full);
}

TEST(gguf_bad_magic_and_version) {
    bb b = {0};
    bb_put(&b, "GGML", 4); bb_u32(&b, 3); bb_u64(&b, 0); bb_u64(&b, 0);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "<memory>: offset 0: header: bad magic 47 47 4d 4c (not a GGUF file)");
    for (uint32_t v = 1; v <= 4; v++) {
        if (v == 3) continue;
        b.n = 0;
        bb_put(&b, "GGUF", 4); bb_u32(&b, v); bb_u64(&b, 0); bb_u64(&b, 0); bb_zeros(&b, 64);
        char want[64];
        snprintf(want, sizeof(want), "offset 4: header: unsupported GGUF version %u", v);
        EXPECT_BAD(&b, DFL_ERR_UNSUPPORTED, want);
    }
    b.n = 0;
    bb_put(&b, "GGUF", 4); bb_u32(&b, 0x03000000u); bb_u64(&b, 0); bb_u64(&b, 0);
    EXPECT_BAD(&b, DFL_ERR_UNSUPPORTED, "unsupported GGUF version 50331648 (a big-endian file?)");
    b.n = 0;
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "offset 0: header: magic: file truncated (needs 4 bytes, 0 left");
    /* the smallest valid file: header only */
    b.n = 0;
    bb_header(&b, 0, 0);
    dfl_error err;
    gguf_file *f = open_bytes(b.p, b.n, &err);
    CHECK(f != NULL);
    if (f) CHECK_EQ_INT(gguf_n_kv(f) + gguf_n_tensors(f), 0);
    gguf_close(f);
    /* a missing file */
    err = (dfl_error){0};
    CHECK(gguf_open("/nonexistent/dir/x.gguf", &err) == NULL);
    CHECK_EQ_INT(err.code, DFL_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "/nonexistent/dir/x.gguf: cannot open");
    free(b.p);
}

TEST(gguf_bad_counts) {
    bb b = {0};
    bb_header(&b, 0, 1000000);
    bb_kv_u32(&b, "a", 1);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "offset 16: header: n_kv 1000000 is larger than the file allows");
    b.n = 0;
    bb_header(&b, UINT64_MAX, 0);
    bb_zeros(&b, 100);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "n_tensors 18446744073709551615 is larger than the file allows");
    b.n = 0;
    bb_header(&b, 3, 1); /* 3 tensors promised, none there */
    bb_kv_u32(&b, "a", 1);
    bb_zeros(&b, 50);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "n_tensors 3 is larger than the file allows");
    b.n = 0;
    bb_header(&b, 0, 2); /* 2 kvs promised, 1 there */
    bb_kv_u32(&b, "a", 1);
    bb_kv_u32(&b, "b", 1);
    b.n -= 4;
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 1 'b': value: file truncated");
    free(b.p);
}

TEST(gguf_bad_strings) {
    bb b = {0};
    bb_header(&b, 0, 1);
    bb_u64(&b, 1ull << 40); /* key length */
    bb_zeros(&b, 20);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "offset 24: kv 0: key: string length 1099511627776 runs past the end of the file");
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "general.name");
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 100);
    bb_put(&b, "short", 5);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'general.name': string value: string length 100 runs past the end");
    /* an element of a string array */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "tokens");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 3);
    bb_str(&b, "a");
    bb_u64(&b, UINT64_MAX - 3);
    bb_str(&b, "c");
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'tokens': string element 1 of 3: length 18446744073709551612 runs past the end");
    /* a string array count larger than the file */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "tokens");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 1ull << 61);
    bb_zeros(&b, 16);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'tokens': array of 2305843009213693952 strings runs past the end");
    /* a numeric array count larger than the file (the product would overflow) */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "ints");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_UINT64);
    bb_u64(&b, (1ull << 61) + 1);
    bb_zeros(&b, 16);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'ints': array of 2305843009213693953 u64 elements runs past the end");
    /* names with odd bytes are quoted safely */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "bad\n\x01key");
    bb_u32(&b, 77);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'bad\\x0a\\x01key': unknown value type 77");
    free(b.p);
}

TEST(gguf_bad_kv_values) {
    bb b = {0};
    bb_header(&b, 0, 1);
    bb_str(&b, "flag");
    bb_u32(&b, GGUF_TYPE_BOOL);
    bb_u8(&b, 2);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "offset 40: kv 0 'flag': bool value 2 is not 0 or 1");
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, 13);
    bb_u64(&b, 0);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'arr': unknown array element type 13");
    b.n = 0;
    bb_header(&b, 0, 2);
    bb_kv_u32(&b, "dup", 1);
    bb_kv_u32(&b, "dup", 2);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 1: duplicate key 'dup' (also kv 0)");
    free(b.p);
}

TEST(gguf_bad_nested_arrays) {
    bb b = {0};
    /* inner count past the end */
    bb_header(&b, 0, 1);
    bb_str(&b, "n");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 2);
    bb_u32(&b, GGUF_TYPE_INT32); bb_u64(&b, 1); bb_u32(&b, 5);
    bb_u32(&b, GGUF_TYPE_INT32); bb_u64(&b, 1000); bb_u32(&b, 5);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'n': array of 1000 i32 elements runs past the end");
    /* outer count past the end */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "n");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 1ull << 60);
    bb_zeros(&b, 24);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "array of 1152921504606846976 arrays runs past the end");
    /* nested string past the end */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "n");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, GGUF_TYPE_STRING); bb_u64(&b, 1); bb_u64(&b, 50); bb_put(&b, "abc", 3);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "string element 0 of 1: length 50 runs past the end");
    /* unknown type inside */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "n");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, 99); bb_u64(&b, 0);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "nested array 0 (depth 2): unknown element type 99");
    /* depth: 8 levels are fine, 9 are refused */
    for (int depth = 8; depth <= 9; depth++) {
        b.n = 0;
        bb_header(&b, 0, 1);
        bb_str(&b, "deep");
        bb_u32(&b, GGUF_TYPE_ARRAY);
        for (int d = 1; d < depth; d++) {
            bb_u32(&b, GGUF_TYPE_ARRAY);
            bb_u64(&b, 1);
        }
        bb_u32(&b, GGUF_TYPE_UINT8);
        bb_u64(&b, 1);
        bb_u8(&b, 42);
        if (depth == 8) {
            dfl_error err;
            gguf_file *f = open_bytes(b.p, b.n, &err);
            CHECK_MSG(f != NULL, "depth 8 refused: %s", err.msg);
            if (f != NULL) {
                gguf_kv cur = *gguf_find_kv(f, "deep"), next;
                int levels = 1;
                while (cur.arr_type == GGUF_TYPE_ARRAY && gguf_arr_sub(&cur, 0, &next)) {
                    cur = next;
                    levels++;
                }
                int64_t v = 0;
                CHECK_EQ_INT(levels, 8);
                CHECK(gguf_arr_int(&cur, 0, &v) && v == 42);
            }
            gguf_close(f);
        } else {
            EXPECT_BAD(&b, DFL_ERR_FORMAT, "kv 0 'deep': arrays nested deeper than 8 levels");
        }
    }
    /* a huge, very deep file does not blow the stack: 100000 nesting levels */
    b.n = 0;
    bb_header(&b, 0, 1);
    bb_str(&b, "deep");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    for (int d = 0; d < 100000; d++) {
        bb_u32(&b, GGUF_TYPE_ARRAY);
        bb_u64(&b, 1);
    }
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "arrays nested deeper than 8 levels");
    free(b.p);
}

TEST(gguf_bad_tensor_infos) {
    bb b = {0};
    /* n_dims: the message names the exact offset, the tensor and the field */
    b.n = 0;
    bb_header(&b, 1, 0);
    tinfo t1 = {"w", 7, {32, 1, 1, 1}, QUANT_TYPE_F32, 0};
    bb_str(&b, t1.name);
    bb_u32(&b, 7);
    bb_zeros(&b, 80);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "<memory>: offset 33: tensor 0 'w': n_dims 7 > 4");
    b.n = 0;
    tinfo t0 = {"w", 0, {0}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &t0, 1, 64);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'w': n_dims 0 < 1");
    b.n = 0;
    tinfo t5 = {"blk.0.attn_q.weight", 5, {1, 1, 1, 1}, QUANT_TYPE_F32, 0};
    bb_header(&b, 1, 0);
    bb_tinfo(&b, &t5);
    bb_zeros(&b, 100);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'blk.0.attn_q.weight': n_dims 5 > 4");
    /* unknown and removed types */
    b.n = 0;
    tinfo tu = {"w", 1, {32}, 99, 0};
    bb_tensor_file(&b, &tu, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_UNSUPPORTED, "tensor 0 'w': unknown tensor type 99");
    b.n = 0;
    tu.type = 4; /* q4_2, removed from ggml */
    bb_tensor_file(&b, &tu, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_UNSUPPORTED, "unknown tensor type 4");
    /* ne */
    b.n = 0;
    tinfo tz = {"w", 2, {32, 0}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &tz, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'w': ne[1] = 0 (must be 1");
    b.n = 0;
    tinfo tov = {"w", 3, {1ull << 32, 1ull << 20, 1ull << 12}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &tov, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'w': element count overflows at ne[2] = 4096");
    b.n = 0;
    tinfo tneg = {"w", 1, {UINT64_MAX}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &tneg, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "ne[0] = 18446744073709551615");
    /* byte size overflow with a plausible element count: 2^62 f32 */
    b.n = 0;
    tinfo tbig = {"w", 2, {1ull << 31, 1ull << 31}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &tbig, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'w': byte size overflows");
    /* block size */
    b.n = 0;
    tinfo tq = {"blk.0.ffn_up.weight", 2, {33, 2}, QUANT_TYPE_Q8_0, 0};
    bb_tensor_file(&b, &tq, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'blk.0.ffn_up.weight': ne[0] = 33 is not a multiple of the q8_0 block size 32");
    b.n = 0;
    tinfo tk = {"k", 1, {128}, QUANT_TYPE_Q4_K, 0};
    bb_tensor_file(&b, &tk, 1, 128);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "ne[0] = 128 is not a multiple of the q4_K block size 256");
    free(b.p);
}

TEST(gguf_bad_tensor_names) {
    bb b = {0};
    char n64[65], n65[66];
    memset(n64, 'a', 64);
    n64[64] = '\0';
    memset(n65, 'b', 65);
    n65[65] = '\0';
    tinfo ok = {n64, 1, {8}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &ok, 1, 32);
    dfl_error err;
    gguf_file *f = open_bytes(b.p, b.n, &err);
    CHECK_MSG(f != NULL, "64-byte name refused: %s", err.msg);
    if (f) CHECK(gguf_find_tensor(f, n64) != NULL);
    gguf_close(f);
    b.n = 0;
    tinfo longn = {n65, 1, {8}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &longn, 1, 32);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0: tensor name 'bbbbbbbb", "' is 65 bytes (max 64)");
    b.n = 0;
    tinfo empty = {"", 1, {8}, QUANT_TYPE_F32, 0};
    bb_tensor_file(&b, &empty, 1, 32);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0: empty tensor name");
    b.n = 0;
    tinfo dup[3] = {{"x", 1, {8}, QUANT_TYPE_F32, 0}, {"y", 1, {8}, QUANT_TYPE_F32, 32},
                    {"x", 1, {8}, QUANT_TYPE_F32, 64}};
    bb_tensor_file(&b, dup, 3, 96);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 2: duplicate tensor name 'x' (also tensor 0 'x')");
    free(b.p);
}

TEST(gguf_bad_tensor_data) {
    bb b = {0};
    /* misaligned */
    tinfo mis = {"w", 1, {4}, QUANT_TYPE_F32, 16};
    bb_tensor_file(&b, &mis, 1, 64);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'w': data offset 16 is not a multiple of the alignment 32");
    /* overlapping */
    b.n = 0;
    tinfo ov[3] = {{"a", 1, {8}, QUANT_TYPE_F32, 0}, {"b", 1, {16}, QUANT_TYPE_F32, 64},
                   {"c", 1, {8}, QUANT_TYPE_F32, 96}};
    bb_tensor_file(&b, ov, 3, 160);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 2 'c': data [96, 128) overlaps tensor 1 'b' data [64, 128)");
    b.n = 0;
    tinfo same[2] = {{"a", 1, {8}, QUANT_TYPE_F32, 32}, {"b", 1, {8}, QUANT_TYPE_F32, 32}};
    bb_tensor_file(&b, same, 2, 64);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 1 'b': data [32, 64) overlaps tensor 0 'a'");
    /* touching is fine, and order in the file does not matter */
    b.n = 0;
    tinfo touch[2] = {{"a", 1, {8}, QUANT_TYPE_F32, 32}, {"b", 1, {8}, QUANT_TYPE_F32, 0}};
    bb_tensor_file(&b, touch, 2, 64);
    dfl_error err;
    gguf_file *f = open_bytes(b.p, b.n, &err);
    CHECK_MSG(f != NULL, "touching tensors refused: %s", err.msg);
    gguf_close(f);
    /* past the end (by one byte) and an offset far past the end */
    b.n = 0;
    tinfo past = {"w", 2, {8, 2}, QUANT_TYPE_F32, 32};
    bb_tensor_file(&b, &past, 1, 95);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "tensor 0 'w': data at offset 32 + 64 bytes runs past the end of the file");
    b.n = 0;
    tinfo far = {"w", 1, {8}, QUANT_TYPE_F32, UINT64_MAX - 31};
    bb_tensor_file(&b, &far, 1, 64);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "runs past the end of the file");
    /* the data section itself is missing */
    b.n = 0;
    bb_header(&b, 1, 0);
    tinfo nodata = {"w", 1, {4}, QUANT_TYPE_F32, 0};
    bb_tinfo(&b, &nodata);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "data section: file truncated");
    free(b.p);
}

TEST(gguf_bad_alignment) {
    const struct { uint32_t type; uint64_t v; const char *want; } cases[] = {
        {GGUF_TYPE_UINT32, 0, "alignment 0 is not a positive power of two"},
        {GGUF_TYPE_UINT32, 3, "alignment 3 is not a positive power of two"},
        {GGUF_TYPE_UINT32, 48, "alignment 48 is not a positive power of two"},
        {GGUF_TYPE_INT32, (uint32_t)-32, "alignment -32 is not a positive power of two"},
        {GGUF_TYPE_STRING, 0, "alignment must be an integer, found string"},
        {GGUF_TYPE_FLOAT32, 0, "alignment must be an integer, found f32"},
    };
    bb b = {0};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        b.n = 0;
        bb_header(&b, 0, 1);
        bb_str(&b, "general.alignment");
        bb_u32(&b, cases[i].type);
        if (cases[i].type == GGUF_TYPE_STRING) bb_str(&b, "32");
        else bb_u32(&b, (uint32_t)cases[i].v);
        EXPECT_BAD(&b, DFL_ERR_FORMAT, "offset 24: kv 0 'general.alignment': ", cases[i].want);
    }
    /* other integer widths are accepted; the data section follows it */
    b.n = 0;
    bb_header(&b, 1, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_TYPE_UINT64);
    bb_u64(&b, 128);
    tinfo tt = {"w", 1, {4}, QUANT_TYPE_F32, 128};
    bb_tinfo(&b, &tt);
    bb_pad(&b, 128);
    bb_zeros(&b, 144);
    dfl_error err;
    gguf_file *f = open_bytes(b.p, b.n, &err);
    CHECK_MSG(f != NULL, "u64 alignment 128 refused: %s", err.msg);
    if (f) {
        CHECK_EQ_INT(gguf_alignment(f), 128);
        CHECK_EQ_INT(gguf_data_offset(f), 128);
    }
    gguf_close(f);
    /* a tensor offset that is 32- but not 128-aligned */
    b.n = 0;
    bb_header(&b, 1, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_TYPE_UINT8);
    bb_u8(&b, 128);
    tt.offset = 32;
    bb_tinfo(&b, &tt);
    bb_pad(&b, 128);
    bb_zeros(&b, 256);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "data offset 32 is not a multiple of the alignment 128");
    /* a huge alignment: the data section cannot start inside the file */
    b.n = 0;
    bb_header(&b, 1, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_TYPE_UINT64);
    bb_u64(&b, 1ull << 63);
    tt.offset = 0;
    bb_tinfo(&b, &tt);
    bb_zeros(&b, 256);
    EXPECT_BAD(&b, DFL_ERR_FORMAT, "data section: file truncated");
    free(b.p);
}

TEST(gguf_writer_errors) {
    gguf_writer *w = gguf_writer_new();
    dfl_error err = {0};
    float x[64] = {0};
    int64_t ne[2] = {32, 2};
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "w", QUANT_TYPE_F32, 2, ne, x, 255, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "tensor 'w': nbytes 255 != 256");
    char path[512];
    dfl_error e2 = {0};
    test_path(t, "never.gguf", path, sizeof(path));
    CHECK_EQ_INT(gguf_writer_write(w, path, &e2), DFL_ERR_INVALID); /* sticky */
    CHECK_STR_CONTAINS(e2.msg, "nbytes 255 != 256");
    FILE *fp = fopen(path, "rb");
    CHECK(fp == NULL);
    if (fp) fclose(fp);
    gguf_writer_free(w);

    w = gguf_writer_new();
    err = (dfl_error){0};
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "w", QUANT_TYPE_F32, 2, ne, x, 256, &err), DFL_OK);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "w", QUANT_TYPE_F32, 2, ne, x, 256, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "duplicate tensor name 'w'");
    gguf_writer_free(w);

    const struct { const char *name; uint32_t type; uint32_t n_dims; int64_t ne0; size_t nbytes; const char *want; } bad[] = {
        {"0123456789012345678901234567890123456789012345678901234567890123", QUANT_TYPE_F32, 1, 4, 16, "must be 1..63 bytes"},
        {"", QUANT_TYPE_F32, 1, 4, 16, "must be 1..63 bytes"},
        {"q", QUANT_TYPE_Q8_0, 1, 33, 34, "ne[0] = 33 is not a multiple of the q8_0 block size 32"},
        {"u", 99, 1, 4, 16, "unknown type 99"},
        {"d", QUANT_TYPE_F32, 5, 4, 16, "n_dims 5 not in 1..4"},
        {"z", QUANT_TYPE_F32, 1, 0, 0, "ne[0] = 0 < 1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        w = gguf_writer_new();
        err = (dfl_error){0};
        int64_t ne4[4] = {bad[i].ne0, 1, 1, 1};
        CHECK_EQ_INT(gguf_writer_add_tensor(w, bad[i].name, bad[i].type, bad[i].n_dims, ne4, x, bad[i].nbytes, &err),
                     DFL_ERR_INVALID);
        CHECK_STR_CONTAINS(err.msg, bad[i].want);
        gguf_writer_free(w);
    }

    /* a bad general.alignment is refused at write */
    w = gguf_writer_new();
    gguf_writer_set_u32(w, "general.alignment", 24);
    err = (dfl_error){0};
    CHECK_EQ_INT(gguf_writer_write(w, path, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "general.alignment 24 is not a power of two");
    gguf_writer_set_str(w, "general.alignment", "32");
    err = (dfl_error){0};
    CHECK_EQ_INT(gguf_writer_write(w, path, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "general.alignment must be u32");
    gguf_writer_free(w);

    /* an unwritable path */
    w = gguf_writer_new();
    err = (dfl_error){0};
    CHECK_EQ_INT(gguf_writer_write(w, "/nonexistent/dir/x.gguf", &err), DFL_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "/nonexistent/dir/x.gguf: cannot create");
    /* an empty key is an error kept until write */
    gguf_writer_set_u32(w, "", 1);
    err = (dfl_error){0};
    CHECK_EQ_INT(gguf_writer_write(w, path, &err), DFL_ERR_INVALID);
    CHECK_STR_CONTAINS(err.msg, "empty key");
    gguf_writer_free(w);
}
