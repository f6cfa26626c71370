/* test_fp16.c: the f16 and bf16 conversions of src/base/fp16.h, checked per value against
 * independent references written here (ldexp for f16 -> f32, nearest-of-two-neighbours search
 * for f32 -> f16/bf16) and against numpy through tests/fixtures/quant/ (fp16_edge.bin: edge cases
 * value by value; fp16_hashes.txt: FNV-1a hashes of all 65536 patterns and of a 2^18 sample).
 * One known difference from numpy: a signalling NaN becomes a QUIET f16 NaN here (as with x86
 * F16C, which ggml uses); numpy keeps it signalling. Both keep the sign; that is what we check. */
#include "test.h"

#include "base/fp16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURE_DIR "tests/fixtures/quant/"

/* ---- independent references ---------------------------------------------------------------- */

/* f16 bits -> value (double; NaN for NaN patterns). */
static double ref_f16_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(1024 + m), e - 25);
    return s ? -v : v;
}

/* Nearest-even rounding of |f| onto an ordered grid of non-negative patterns [0, top], where
 * value(top) is the first value past the largest finite one (it rounds to infinity). */
static uint32_t ref_round_grid(double a, uint32_t top, double (*value)(uint32_t)) {
    uint32_t lo = 0, hi = top; /* largest p with value(p) <= a, by bisection */
    if (a >= value(top)) return top;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (value(mid) <= a) lo = mid; else hi = mid - 1;
    }
    if (value(lo) == a) return lo;
    const double below = a - value(lo), above = value(lo + 1) - a;
    if (below < above) return lo;
    if (above < below) return lo + 1;
    return (lo & 1) ? lo + 1 : lo;
}

static double grid_f16(uint32_t p) { return p == 0x7c00 ? 65536.0 : ref_f16_value((uint16_t)p); }
static double grid_bf16(uint32_t p) {
    return p == 0x7f80 ? ldexp(1.0, 128) : (double)fp32_from_bits(p << 16);
}

/* f32 -> f16 bits for non-NaN f */
static uint16_t ref_f32_to_f16(float f) {
    const uint32_t sign = (fp32_bits(f) >> 16) & 0x8000u;
    return (uint16_t)(sign | ref_round_grid(fabs((double)f), 0x7c00, grid_f16));
}

static uint16_t ref_f32_to_bf16(float f) {
    const uint32_t sign = (fp32_bits(f) >> 16) & 0x8000u;
    return (uint16_t)(sign | ref_round_grid(fabs((double)f), 0x7f80, grid_bf16));
}

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

/* ---- the numpy hashes ---------------------------------------------------------------------- */

static uint64_t fnv1a64(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_BASIS 0xcbf29ce484222325ull

/* Hash named `name` from fp16_hashes.txt (and its element count); false if absent. */
static bool numpy_hash(const char *name, uint64_t *hash, long *count) {
    FILE *f = fopen(FIXTURE_DIR "fp16_hashes.txt", "r");
    if (f == NULL) return false;
    char line[256], key[64];
    unsigned long long h;
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "%63s %ld %llx", key, count, &h) == 3 && strcmp(key, name) == 0) {
            *hash = h;
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* The sample of gen_quant_fixtures.py: splitmix64 outputs; even i -> the low 32 bits, odd i ->
 * sign bit 63, exponent 100 + (z >> 32) % 46, mantissa z & 0x7fffff. */
#define SAMPLE_SEED 0x5eedf16ull
static uint32_t sample_bits(uint64_t i) {
    uint64_t z = SAMPLE_SEED + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    if (i % 2 == 0) return (uint32_t)z;
    return (uint32_t)(z >> 63) << 31 | (uint32_t)(100 + (z >> 32) % 46) << 23 | (uint32_t)(z & 0x7fffff);
}

/* ---- tests --------------------------------------------------------------------------------- */

TEST(fp16_all_patterns_to_f32) {
    uint64_t h16 = FNV_BASIS, hbf = FNV_BASIS;
    int n_bad = 0;
    for (uint32_t p = 0; p < 65536; p++) {
        const float f = fp16_to_fp32((uint16_t)p);
        const uint32_t u = fp32_bits(f);
        h16 = fnv1a64(h16, &u, 4); /* little-endian host */
        const double want = ref_f16_value((uint16_t)p);
        bool ok;
        if (want != want) { /* NaN: payload and sign kept, like numpy */
            ok = u == (((p & 0x8000u) << 16) | 0x7f800000u | ((p & 0x3ffu) << 13));
        } else {
            ok = (double)f == want && !signbit(f) == !signbit(want);
        }
        if (!ok && n_bad++ < 5) test_fail(t, __FILE__, __LINE__, "f16 0x%04x -> 0x%08x", p, u);
        const uint32_t ub = fp32_bits(bf16_to_fp32((uint16_t)p));
        CHECK(ub == p << 16);
        hbf = fnv1a64(hbf, &ub, 4);
    }
    uint64_t want;
    long count;
    REQUIRE(numpy_hash("f16_to_f32_all", &want, &count));
    CHECK_EQ_INT(count, 65536);
    CHECK_MSG(h16 == want, "f16 -> f32 of all patterns: hash %016llx, numpy %016llx",
              (unsigned long long)h16, (unsigned long long)want);
    REQUIRE(numpy_hash("bf16_to_f32_all", &want, &count));
    CHECK_MSG(hbf == want, "bf16 -> f32: hash %016llx, numpy %016llx", (unsigned long long)hbf,
              (unsigned long long)want);
}

TEST(fp16_round_trip_all_patterns) {
    for (uint32_t p = 0; p < 65536; p++) {
        if (f16_is_nan((uint16_t)p)) {
            const uint16_t back = fp32_to_fp16(fp16_to_fp32((uint16_t)p));
            CHECK_MSG(f16_is_nan(back) && (back & 0x8000) == (p & 0x8000), "NaN 0x%04x -> 0x%04x", p, back);
            continue;
        }
        const uint16_t back = fp32_to_fp16(fp16_to_fp32((uint16_t)p));
        if (back != p) {
            test_fail(t, __FILE__, __LINE__, "f16 0x%04x -> f32 -> 0x%04x", p, back);
            return;
        }
    }
}

TEST(fp16_from_f32_sample) {
    uint64_t h16 = FNV_BASIS, hbf = FNV_BASIS;
    long count;
    uint64_t want16, wantbf;
    REQUIRE(numpy_hash("f32_to_f16", &want16, &count));
    REQUIRE(numpy_hash("f32_to_bf16", &wantbf, &count));
    REQUIRE(count > 0);
    int n_bad = 0, n_sub = 0, n_inf = 0, n_nan = 0;
    for (long i = 0; i < count; i++) {
        const uint32_t u = sample_bits((uint64_t)i);
        const float f = fp32_from_bits(u);
        uint16_t h = fp32_to_fp16(f);
        const uint16_t b = fp32_to_bf16(f);
        if (f != f) {
            n_nan++;
            CHECK_MSG(f16_is_nan(h) && (h & 0x8000) == ((u >> 16) & 0x8000), "f32 0x%08x -> f16 0x%04x", u, h);
            CHECK_MSG(b == (uint16_t)((u >> 16) | 0x40), "NaN 0x%08x -> bf16 0x%04x", u, b);
            h = (uint16_t)((h & 0x8000) | 0x7e00); /* canonical, as in the numpy hash */
        } else {
            const uint16_t r16 = ref_f32_to_f16(f), rbf = ref_f32_to_bf16(f);
            if ((h != r16 || b != rbf) && n_bad++ < 5) {
                test_fail(t, __FILE__, __LINE__, "f32 0x%08x -> f16 0x%04x (ref 0x%04x), bf16 0x%04x (ref 0x%04x)",
                          u, h, r16, b, rbf);
            }
            n_sub += (h & 0x7c00) == 0 && (h & 0x3ff) != 0;
            n_inf += (h & 0x7fff) == 0x7c00;
        }
        h16 = fnv1a64(h16, &h, 2);
        hbf = fnv1a64(hbf, &b, 2);
    }
    /* the sample really covers the awkward ranges */
    CHECK_MSG(n_sub > 1000 && n_inf > 1000 && n_nan > 100, "sample: %d subnormal, %d inf, %d NaN",
              n_sub, n_inf, n_nan);
    CHECK_MSG(h16 == want16, "f32 -> f16 sample: hash %016llx, numpy %016llx", (unsigned long long)h16,
              (unsigned long long)want16);
    CHECK_MSG(hbf == wantbf, "f32 -> bf16 sample: hash %016llx, numpy ref %016llx", (unsigned long long)hbf,
              (unsigned long long)wantbf);
}

TEST(fp16_edge_cases_vs_numpy) {
    FILE *f = fopen(FIXTURE_DIR "fp16_edge.bin", "rb");
    REQUIRE(f != NULL);
    uint8_t rec[6];
    int n = 0, n_snan = 0;
    while (fread(rec, 1, 6, f) == 6) {
        const uint32_t u = (uint32_t)rec[0] | (uint32_t)rec[1] << 8 | (uint32_t)rec[2] << 16 | (uint32_t)rec[3] << 24;
        const uint16_t want = (uint16_t)(rec[4] | rec[5] << 8);
        const uint16_t got = fp32_to_fp16(fp32_from_bits(u));
        n++;
        if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu) != 0 && (u & 0x400000u) == 0) {
            n_snan++; /* signalling NaN: we quiet it, numpy does not */
            CHECK_MSG(f16_is_nan(got) && f16_is_nan(want) && (got & 0x8000) == (want & 0x8000),
                      "sNaN 0x%08x -> 0x%04x, numpy 0x%04x", u, got, want);
            continue;
        }
        CHECK_MSG(got == want, "f32 0x%08x (%.9g) -> f16 0x%04x, numpy 0x%04x", u, (double)fp32_from_bits(u),
                  got, want);
    }
    fclose(f);
    CHECK_MSG(n > 600 && n_snan == 3, "fp16_edge.bin: %d records, %d sNaN", n, n_snan);
}

TEST(fp16_known_values) {
    CHECK_EQ_INT(fp32_to_fp16(1.0f), 0x3c00);
    CHECK_EQ_INT(fp32_to_fp16(-2.0f), 0xc000);
    CHECK_EQ_INT(fp32_to_fp16(65504.0f), 0x7bff);
    CHECK_EQ_INT(fp32_to_fp16(65519.996f), 0x7bff);
    CHECK_EQ_INT(fp32_to_fp16(65520.0f), 0x7c00); /* tie between 65504 and 2^16: even -> inf */
    CHECK_EQ_INT(fp32_to_fp16(-1e10f), 0xfc00);
    CHECK_EQ_INT(fp32_to_fp16(ldexpf(1.0f, -24)), 0x0001);
    CHECK_EQ_INT(fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000);              /* tie -> even 0 */
    CHECK_EQ_INT(fp32_to_fp16(ldexpf(3.0f, -25)), 0x0002);              /* 1.5 units -> 2 */
    CHECK_EQ_INT(fp32_to_fp16(-ldexpf(1.0f, -26)), 0x8000);
    CHECK_EQ_INT(fp32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00);        /* tie -> even */
    CHECK_EQ_INT(fp32_to_fp16(1.0f + ldexpf(3.0f, -11)), 0x3c02);
    CHECK_EQ_INT(fp32_to_fp16(-0.0f), 0x8000);
    CHECK_EQ_INT(fp32_to_fp16(INFINITY), 0x7c00);
    CHECK(f16_is_nan(fp32_to_fp16(NAN)));
    CHECK(fp16_to_fp32(0x0001) == ldexpf(1.0f, -24));
    CHECK(fp16_to_fp32(0x03ff) == ldexpf(1023.0f, -24));
    CHECK(fp16_to_fp32(0xc000) == -2.0f);

    CHECK_EQ_INT(fp32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0x3f808000u)), 0x3f80); /* tie -> even */
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0x3f818000u)), 0x3f82); /* tie -> even (up) */
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0x3f808001u)), 0x3f81);
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0x7f7f8000u)), 0x7f80); /* rounds up to inf */
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0x7f7f7fffu)), 0x7f7f);
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0x00008000u)), 0x0000); /* subnormal tie -> even */
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0x00018000u)), 0x0002);
    CHECK(bf16_is_nan(fp32_to_bf16(fp32_from_bits(0x7f800001u)))); /* would round to inf if not special-cased */
    CHECK_EQ_INT(fp32_to_bf16(fp32_from_bits(0xffc00000u)), 0xffc0);
    CHECK(bf16_to_fp32(0x3f80) == 1.0f);
}
