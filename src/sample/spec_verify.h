/* spec_verify.h: lossless speculative verification (docs/drafter.md, "Verification"), a pure
 * function of the drafts, the draft and target distributions and a generator.
 *
 * Indexing. The context is committed up to the last token `last`; the drafter proposed
 * d_1..d_n (draft[0..n)), d_{i+1} drawn from q_i. The target ran [last, d_1, ..., d_n]:
 *   row i of p (i = 0..n) is the target's distribution (already through the sampler's
 *   transforms, e.g. sampler_probs) for the token that FOLLOWS [last, d_1..d_i], i.e. the slot
 *   where d_{i+1} is checked; row n is the bonus row (after all n drafts).
 *   row i of q (i = 0..n-1) is the distribution d_{i+1} was drawn from; q == NULL means every
 *   q_i is one-hot on d_{i+1} (plain DFlash drafts the argmax).
 * Rule, for i = 0, 1, ...: accept d_{i+1} with probability min(1, p_i(d)/q_i(d)); at the first
 * rejection draw the next token from normalize(max(0, p_i - q_i)) (with one-hot q: p_i with d
 * removed, renormalized) and stop; if all n are accepted draw the bonus token from p_n.
 * The emitted tokens are d_1..d_a then next_token, distributed exactly as sampling the target.
 * Greedy: with one-hot p rows (a greedy sampler), this is exactly the greedy argmax rule: a = the
 * longest prefix with d_{i+1} == argmax p_i, next_token = argmax p_a. */
#ifndef DFL_SAMPLE_SPEC_VERIFY_H
#define DFL_SAMPLE_SPEC_VERIFY_H

#include "dflash.h"
#include "sample/rng.h"

typedef struct spec_verify_result {
    int64_t n_accepted; /* a: drafts accepted, 0..n_draft */
    int32_t next_token; /* the token after d_1..d_a: the residual draw or the bonus */
} spec_verify_result;

/* draft: [n_draft] token ids; q: [n_draft, n_vocab] or NULL; p: [n_draft + 1, n_vocab].
 * Returns DFL_OK, or DFL_ERR_INVALID (message in err) for n_draft < 0, a draft id out of range,
 * or a p row with no probability mass where a draw is needed. Uses rng only where a random
 * decision is needed (an acceptance with p(d) < q(d), and each draw). */
dfl_status spec_verify(int64_t n_vocab, int64_t n_draft, const int32_t *draft, const float *q, const float *p,
                       sample_rng *rng, spec_verify_result *res, dfl_error *err);

#endif
