/* sampler.h: library-internal access to a dfl_sampler: the final distribution it would draw
 * from (for lossless speculative verification) and its generator. */
#ifndef DFL_SAMPLE_SAMPLER_H
#define DFL_SAMPLE_SAMPLER_H

#include "dflash.h"
#include "sample/rng.h"

/* Writes the distribution dfl_sampler_sample would draw from for these logits: probs_out
 * [n_vocab], after every transform (penalty, top-k, top-p, min-p, temperature, softmax); zero for
 * removed tokens, sums to 1. Greedy samplers give a one-hot vector on the argmax (exact 1.0 and
 * 0.0). Consumes no random numbers. DFL_ERR_INVALID (message in err) on bad logits. */
dfl_status sampler_probs(dfl_sampler *s, const float *logits, float *probs_out, dfl_error *err);

/* Same, as if the n_extra tokens in extra were accepted after the current window (for the
 * repetition penalty at a draft slot: extra = the draft tokens before that slot). Does not change
 * the window. */
dfl_status sampler_probs_after(dfl_sampler *s, const float *logits, const int32_t *extra, int64_t n_extra,
                               float *probs_out, dfl_error *err);

/* The sampler's generator (the speculative verification draws from it too, so one seed fixes a
 * whole generation). */
sample_rng *sampler_rng(dfl_sampler *s);
int64_t sampler_n_vocab(const dfl_sampler *s);
/* True for a greedy sampler without penalties: its token is the argmax of the raw logits (lowest
 * id on ties), so callers may ask the backend for argmax ids instead of logits. */
bool sampler_is_plain_greedy(const dfl_sampler *s);
const dfl_sampler_params *sampler_params(const dfl_sampler *s);

#endif
