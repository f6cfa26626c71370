/* rng.h: the sampler's seeded pseudo-random generator (xoshiro256**, seeded with splitmix64)
 * and drawing an index from non-negative weights. One generator per sampler: no global state. */
#ifndef DFL_SAMPLE_RNG_H
#define DFL_SAMPLE_RNG_H

#include <stdint.h>

typedef struct sample_rng {
    uint64_t s[4]; /* xoshiro256** state, never all zero */
} sample_rng;

/* Seeds the state from one 64-bit seed through splitmix64 (any seed, 0 included, is fine). */
void rng_seed(sample_rng *rng, uint64_t seed);
uint64_t rng_next_u64(sample_rng *rng);
/* Uniform double in [0, 1) with 53 random bits. */
double rng_uniform(sample_rng *rng);
/* Draws index j with probability w[j] / total (w: [n] non-negative weights, total = their sum,
 * > 0). Consumes one uniform. Never returns an index whose weight is 0; -1 if every weight is 0. */
int64_t rng_pick(sample_rng *rng, const float *w, int64_t n, double total);

#endif
