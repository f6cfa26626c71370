/* rng.c: xoshiro256** (Blackman & Vigna) seeded by splitmix64, and weighted index drawing. */
#include "sample/rng.h"

static uint64_t rng_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void rng_seed(sample_rng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = rng_splitmix64(&x);
    /* splitmix64 is a bijection of a counter: four consecutive outputs are never all zero */
}

uint64_t rng_next_u64(sample_rng *rng) {
    uint64_t *s = rng->s;
    const uint64_t result = rng_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return result;
}

double rng_uniform(sample_rng *rng) {
    return (double)(rng_next_u64(rng) >> 11) * 0x1.0p-53;
}

int64_t rng_pick(sample_rng *rng, const float *w, int64_t n, double total) {
    const double r = rng_uniform(rng) * total;
    double cum = 0.0;
    int64_t last = -1;
    for (int64_t j = 0; j < n; j++) {
        if (w[j] > 0.0f) {
            cum += (double)w[j];
            last = j;
            if (cum > r) return j;
        }
    }
    return last; /* rounding left r at or above the sum: the last positive weight */
}
