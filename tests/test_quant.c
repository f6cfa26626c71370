/* test_quant.c: the block formats (src/quant/): dequantize and quantize against the numpy
 * reference's fixtures (tests/fixtures/quant/, written by tests/ref/gen_quant_fixtures.py), a few
 * blocks packed by hand, and the type table. Every comparison is bit-exact: the C reference and
 * numpy compute the same float32 products in the same order (no case needs a 1-ulp tolerance). */
#include "test.h"

#include "base/fp16.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

#define FIXTURE_DIR "tests/fixtures/quant/"

/* Reads a whole file; NULL if it cannot be read. */
static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            uint8_t *nb = realloc(buf, cap);
            if (nb == NULL) { free(buf); fclose(f); return NULL; }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    *len = n;
    return buf;
}

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* One fixture case: n elements, n_bytes raw bytes, then n f32 (see gen_quant_fixtures.py). */
typedef struct fixture_case {
    int64_t n;
    size_t n_bytes;
    const uint8_t *raw;  /* [n_bytes] */
    float *vals;         /* [n], copied out (alignment) */
} fixture_case;

/* Parses the next case at *pos; false at the end or on a malformed file (reported). */
static bool next_case(test_ctx *t, const char *path, const uint8_t *data, size_t len, size_t *pos,
                      fixture_case *c) {
    if (*pos == len) return false;
    if (len - *pos < 8) {
        test_fail(t, __FILE__, __LINE__, "%s: truncated case header at byte %zu", path, *pos);
        return false;
    }
    c->n = rd_u32(data + *pos);
    c->n_bytes = rd_u32(data + *pos + 4);
    size_t need = 8 + c->n_bytes + (size_t)c->n * 4;
    if (len - *pos < need) {
        test_fail(t, __FILE__, __LINE__, "%s: truncated case at byte %zu", path, *pos);
        return false;
    }
    c->raw = data + *pos + 8;
    c->vals = malloc((size_t)c->n * sizeof(float) + 1);
    if (c->vals == NULL) return false;
    memcpy(c->vals, c->raw + c->n_bytes, (size_t)c->n * 4);
    *pos += need;
    return true;
}

static const char *const k_dequant_types[] = {"f32",  "f16",  "bf16", "q4_0", "q8_0", "q4_K",   "q6_K",
                                                 "q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q5_K", "iq4_nl", "iq4_xs"};
static const char *const k_quant_types[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};

TEST(quant_dequantize_matches_numpy) {
    for (size_t k = 0; k < sizeof(k_dequant_types) / sizeof(k_dequant_types[0]); k++) {
        const int type = quant_type_from_name(k_dequant_types[k]);
        REQUIRE(type >= 0);
        char path[256];
        snprintf(path, sizeof(path), FIXTURE_DIR "dequant_%s.bin", k_dequant_types[k]);
        size_t len = 0;
        uint8_t *data = read_all(path, &len);
        CHECK_MSG(data != NULL, "cannot read %s (run tests from the repo root)", path);
        if (data == NULL) continue;
        size_t pos = 0;
        int n_cases = 0;
        fixture_case c;
        while (next_case(t, path, data, len, &pos, &c)) {
            n_cases++;
            CHECK_EQ_INT(quant_row_size((uint32_t)type, c.n), c.n_bytes);
            float *out = malloc((size_t)c.n * sizeof(float));
            REQUIRE(out != NULL);
            CHECK(quant_dequantize_row((uint32_t)type, c.raw, out, c.n));
            int64_t n_bad = 0;
            for (int64_t i = 0; i < c.n; i++) {
                if (fp32_bits(out[i]) != fp32_bits(c.vals[i])) {
                    if (n_bad++ < 3) {
                        test_fail(t, __FILE__, __LINE__, "%s case %d: y[%lld] = %.9g (0x%08x), numpy %.9g (0x%08x)",
                                  k_dequant_types[k], n_cases, (long long)i, out[i], fp32_bits(out[i]),
                                  c.vals[i], fp32_bits(c.vals[i]));
                    }
                }
            }
            free(out);
            free(c.vals);
        }
        CHECK_MSG(n_cases >= 4, "%s: only %d cases", path, n_cases);
        free(data);
    }
}

TEST(quant_quantize_matches_numpy) {
    for (size_t k = 0; k < sizeof(k_quant_types) / sizeof(k_quant_types[0]); k++) {
        const int type = quant_type_from_name(k_quant_types[k]);
        REQUIRE(type >= 0);
        char path[256];
        snprintf(path, sizeof(path), FIXTURE_DIR "quant_%s.bin", k_quant_types[k]);
        size_t len = 0;
        uint8_t *data = read_all(path, &len);
        CHECK_MSG(data != NULL, "cannot read %s (run tests from the repo root)", path);
        if (data == NULL) continue;
        size_t pos = 0;
        int n_cases = 0;
        fixture_case c;
        while (next_case(t, path, data, len, &pos, &c)) {
            n_cases++;
            uint8_t *out = malloc(c.n_bytes + 1);
            REQUIRE(out != NULL);
            memset(out, 0xa5, c.n_bytes + 1);
            CHECK_EQ_INT(quant_quantize_row((uint32_t)type, c.vals, out, c.n), c.n_bytes);
            CHECK_MSG(out[c.n_bytes] == 0xa5, "%s case %d: wrote past the row", k_quant_types[k], n_cases);
            for (size_t i = 0; i < c.n_bytes; i++) {
                if (out[i] != c.raw[i]) {
                    test_fail(t, __FILE__, __LINE__, "%s case %d (n=%lld): byte %zu = 0x%02x, numpy 0x%02x",
                              k_quant_types[k], n_cases, (long long)c.n, i, out[i], c.raw[i]);
                    break;
                }
            }
            free(out);
            free(c.vals);
        }
        CHECK_MSG(n_cases >= 2, "%s: only %d cases", path, n_cases);
        free(data);
    }
}

/* ---- hand-packed blocks -------------------------------------------------------------------- */

TEST(quant_q8_0_hand) {
    block_q8_0 b[2];
    b[0].d = 0x3800; /* 0.5 */
    b[1].d = 0xc000; /* -2.0 */
    for (int j = 0; j < 32; j++) {
        b[0].qs[j] = (int8_t)(-128 + j);
        b[1].qs[j] = (int8_t)(96 + j);
    }
    float y[64];
    REQUIRE(quant_dequantize_row(QUANT_TYPE_Q8_0, b, y, 64));
    CHECK(y[0] == -64.0f);
    CHECK(y[1] == -63.5f);
    CHECK(y[31] == -48.5f);
    CHECK(y[32] == -192.0f);
    CHECK(y[63] == -254.0f);

    /* x = 127 and multiples of 4: d = 127/127 = 1 exactly, so q = x */
    float x[32];
    x[0] = 127.0f;
    for (int j = 1; j < 32; j++) x[j] = (float)(4 * j - 64);
    block_q8_0 q;
    REQUIRE(quant_quantize_row(QUANT_TYPE_Q8_0, x, &q, 32) == sizeof(q));
    CHECK_EQ_INT(q.d, 0x3c00);
    CHECK_EQ_INT(q.qs[0], 127);
    for (int j = 1; j < 32; j++) CHECK_EQ_INT(q.qs[j], 4 * j - 64);

    /* all zero: d = +0, q = 0; one 2.5 step from a tie: 2.5 rounds away from zero to 3 */
    memset(x, 0, sizeof(x));
    REQUIRE(quant_quantize_row(QUANT_TYPE_Q8_0, x, &q, 32) == sizeof(q));
    CHECK_EQ_INT(q.d, 0);
    for (int j = 0; j < 32; j++) CHECK_EQ_INT(q.qs[j], 0);
    x[0] = -127.0f;
    x[1] = 2.5f;
    x[2] = -2.5f;
    REQUIRE(quant_quantize_row(QUANT_TYPE_Q8_0, x, &q, 32) == sizeof(q));
    CHECK_EQ_INT(q.d, 0x3c00);
    CHECK_EQ_INT(q.qs[0], -127);
    CHECK_EQ_INT(q.qs[1], 3);
    CHECK_EQ_INT(q.qs[2], -3);
}

TEST(quant_q4_0_hand) {
    block_q4_0 b;
    b.d = 0x3400; /* 0.25 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    REQUIRE(quant_dequantize_row(QUANT_TYPE_Q4_0, &b, y, 32));
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (float)(j - 8) * 0.25f);
        CHECK(y[j + 16] == (float)(7 - j) * 0.25f);
    }
    CHECK(y[0] == -2.0f);
    CHECK(y[16] == 1.75f);

    /* max = -8 (the largest magnitude, negative) -> d = 1; q = min(15, trunc(x + 8.5)) */
    float x[32];
    for (int j = 0; j < 16; j++) {
        x[j] = (float)(j - 8);
        x[j + 16] = (float)(7 - j) + 0.49f;
    }
    x[31] = 7.9f; /* 16.4 -> clamped to 15 */
    block_q4_0 q;
    REQUIRE(quant_quantize_row(QUANT_TYPE_Q4_0, x, &q, 32) == sizeof(q));
    CHECK_EQ_INT(q.d, 0x3c00);
    for (int j = 0; j < 15; j++) CHECK_EQ_INT(q.qs[j], j | ((15 - j) << 4));
    CHECK_EQ_INT(q.qs[15], 15 | (15 << 4));

    /* a zero block: max = +0, d = 0 / -8 = -0 (f16 0x8000, as ggml writes it), every q = 8 */
    memset(x, 0, sizeof(x));
    REQUIRE(quant_quantize_row(QUANT_TYPE_Q4_0, x, &q, 32) == sizeof(q));
    CHECK_EQ_INT(q.d, 0x8000);
    for (int j = 0; j < 16; j++) CHECK_EQ_INT(q.qs[j], 0x88);
}

TEST(quant_q4_K_hand) {
    /* sub-block scales and mins, 6 bits each; 4..7 use the high bits */
    static const int sc[8] = {1, 2, 3, 4, 17, 33, 48, 62};
    static const int mn[8] = {5, 6, 7, 8, 51, 3, 35, 20};
    block_q4_K b;
    b.d = 0x3c00;    /* 1.0 */
    b.dmin = 0x3800; /* 0.5 */
    /* bytes 0..3: sc[0..3] | (sc[4..7] >> 4) << 6   (17 -> hi 1, 33 -> 2, 48 -> 3, 62 -> 3)
     * bytes 4..7: mn[0..3] | (mn[4..7] >> 4) << 6   (51 -> hi 3, 3 -> 0, 35 -> 2, 20 -> 1)
     * bytes 8..11: (sc[4..7] & 15) | (mn[4..7] & 15) << 4   (1|3, 1|3, 0|3, 14|4)
     * (the high bits of scales and mins differ, so mixing up their source bytes shows) */
    static const uint8_t packed[12] = {0x41, 0x82, 0xC3, 0xC4, 0xC5, 0x06, 0x87, 0x48,
                                       0x31, 0x31, 0x30, 0x4E};
    memcpy(b.scales, packed, 12);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)((i & 15) | ((15 - (i & 15)) << 4));
    float y[256];
    REQUIRE(quant_dequantize_row(QUANT_TYPE_Q4_K, &b, y, 256));
    /* sub-block j = 2c + h: chunk c of 32 qs bytes, low (h = 0) or high (h = 1) nibbles */
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 32; l++) {
            const int nib = (j % 2 == 0) ? (l & 15) : 15 - (l & 15);
            const float want = (float)(sc[j] * nib) - 0.5f * (float)mn[j];
            const float got = y[32 * j + l];
            CHECK_MSG(got == want, "sub-block %d l %d: %g != %g", j, l, got, want);
        }
    }
    CHECK(y[7 * 32 + 1] == 858.0f); /* last sub-block: sc 62, min 20, nibble 14: 868 - 10 */
    CHECK(y[4 * 32 + 0] == -25.5f); /* sub-block 4: sc 17, min 51, nibble 0 */
}

TEST(quant_q6_K_hand) {
    /* pack q6[w] = (7 w) mod 64 and scales[k] = k - 8 by the layout, then expect
     * y[w] = d * scales[w / 16] * (q6[w] - 32) */
    block_q6_K b;
    memset(&b, 0, sizeof(b));
    b.d = 0x3800; /* 0.5 */
    for (int k = 0; k < 16; k++) b.scales[k] = (int8_t)(k - 8);
    for (int w = 0; w < 256; w++) {
        const int q6 = (7 * w) % 64;
        const int half = w / 128, g = (w % 128) / 32, l = w % 32;
        uint8_t *ql = &b.ql[64 * half + l + 32 * (g & 1)];
        *ql |= (uint8_t)((q6 & 15) << (g >= 2 ? 4 : 0));
        b.qh[32 * half + l] |= (uint8_t)((q6 >> 4) << (2 * g));
    }
    float y[256];
    REQUIRE(quant_dequantize_row(QUANT_TYPE_Q6_K, &b, y, 256));
    for (int w = 0; w < 256; w++) {
        const float want = 0.5f * (float)(w / 16 - 8) * (float)((7 * w) % 64 - 32);
        CHECK_MSG(y[w] == want, "y[%d] = %g, want %g", w, y[w], want);
    }
}

/* ---- type table ---------------------------------------------------------------------------- */

TEST(quant_type_table) {
    static const uint32_t unknown[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 41, 1000, 0xffffffffu};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        CHECK_MSG(quant_type_get(unknown[i]) == NULL, "type %u should be unknown", unknown[i]);
        CHECK_EQ_INT(quant_row_size(unknown[i], 256), 0);
    }
    struct { uint32_t type; const char *name; int64_t blck; size_t size; bool deq, q; } known[] = {
        {QUANT_TYPE_F32, "f32", 1, 4, true, true},      {QUANT_TYPE_F16, "f16", 1, 2, true, true},
        {QUANT_TYPE_BF16, "bf16", 1, 2, true, true},    {QUANT_TYPE_Q4_0, "q4_0", 32, 18, true, true},
        {QUANT_TYPE_Q8_0, "q8_0", 32, 34, true, true},  {QUANT_TYPE_Q4_K, "q4_K", 256, 144, true, true},
        {QUANT_TYPE_Q6_K, "q6_K", 256, 210, true, true}, {QUANT_TYPE_Q5_K, "q5_K", 256, 176, true, true},
        {QUANT_TYPE_Q4_1, "q4_1", 32, 20, true, true},  {QUANT_TYPE_Q5_0, "q5_0", 32, 22, true, true},
        {QUANT_TYPE_Q5_1, "q5_1", 32, 24, true, true},  {QUANT_TYPE_Q2_K, "q2_K", 256, 84, true, true},
        {QUANT_TYPE_Q3_K, "q3_K", 256, 110, true, true}, {QUANT_TYPE_IQ4_NL, "iq4_nl", 32, 18, true, true},
        {QUANT_TYPE_IQ4_XS, "iq4_xs", 256, 136, true, true}, {QUANT_TYPE_Q8_K, "q8_K", 256, 292, false, false},
        {16, "iq2_xxs", 256, 66, false, false},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        const quant_type_info *ti = quant_type_get(known[i].type);
        REQUIRE(ti != NULL);
        CHECK(strcmp(ti->name, known[i].name) == 0);
        CHECK_EQ_INT(ti->blck_size, known[i].blck);
        CHECK_EQ_INT(ti->type_size, known[i].size);
        CHECK(ti->can_dequantize == known[i].deq);
        CHECK(ti->can_quantize == known[i].q);
        CHECK_EQ_INT(quant_type_from_name(known[i].name), known[i].type);
    }
    CHECK_EQ_INT(quant_type_from_name("Q8_0"), QUANT_TYPE_Q8_0);
    CHECK_EQ_INT(quant_type_from_name("Q4_k"), QUANT_TYPE_Q4_K);
    CHECK_EQ_INT(quant_type_from_name("q9_0"), -1);
    CHECK_EQ_INT(quant_type_from_name(""), -1);

    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_Q4_K, 512), 288);
    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_Q6_K, 256), 210);
    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_Q8_0, 96), 102);
    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_F16, 7), 14);
    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_F32, 0), 0);
    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_Q8_0, 33), 0);  /* not a multiple of the block */
    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_Q4_K, 128), 0);
    CHECK_EQ_INT(quant_row_size(QUANT_TYPE_Q4_0, -32), 0);
}

TEST(quant_unsupported_rejected) {
    uint8_t raw[292] = {0};
    float y[256];
    float x[256] = {0};
    CHECK(!quant_dequantize_row(16, raw, y, 256)); /* iq2_xxs */
    CHECK(!quant_dequantize_row(QUANT_TYPE_Q5_K, raw, y, 128));
    CHECK(!quant_dequantize_row(QUANT_TYPE_Q8_K, raw, y, 256));
    CHECK(!quant_dequantize_row(4, raw, y, 32));
    CHECK(!quant_dequantize_row(1000, raw, y, 32));
    CHECK(!quant_dequantize_row(QUANT_TYPE_Q8_0, raw, y, 31));
    CHECK_EQ_INT(quant_quantize_row(QUANT_TYPE_Q8_K, x, raw, 256), 0);
    CHECK_EQ_INT(quant_quantize_row(16, x, raw, 256), 0);
    CHECK_EQ_INT(quant_quantize_row(QUANT_TYPE_Q4_K, x, raw, 128), 0);
    CHECK_EQ_INT(quant_quantize_row(41, x, raw, 32), 0);
    CHECK_EQ_INT(quant_quantize_row(QUANT_TYPE_Q4_0, x, raw, 48), 0);
}
