/* spec_verify.c: the rejection rule of lossless speculative sampling (accept with
 * min(1, p/q), else draw from the residual max(0, p - q)); see spec_verify.h for the indexing. */
#include "sample/spec_verify.h"

#include "base/error.h"

#include <stddef.h>

/* Weight of token j in the residual max(0, p - q) of one slot; q_row NULL = one-hot on d. */
static double verify_residual_w(const float *p_row, const float *q_row, int32_t d, int64_t j) {
    const double q = q_row != NULL ? (double)q_row[j] : (j == d ? 1.0 : 0.0);
    const double w = (double)p_row[j] - q;
    return w > 0.0 ? w : 0.0;
}

/* Draws from normalize(max(0, p - q)); falls back to p when rounding left no residual mass
 * (a rejection implies p(d) < q(d), so the exact residual is never empty). */
static int64_t verify_pick_residual(const float *p_row, const float *q_row, int32_t d, int64_t n_vocab,
                                    sample_rng *rng) {
    double total = 0.0;
    for (int64_t j = 0; j < n_vocab; j++) total += verify_residual_w(p_row, q_row, d, j);
    if (!(total > 0.0)) {
        double tp = 0.0;
        for (int64_t j = 0; j < n_vocab; j++) tp += p_row[j] > 0.0f ? (double)p_row[j] : 0.0;
        return tp > 0.0 ? rng_pick(rng, p_row, n_vocab, tp) : -1;
    }
    const double r = rng_uniform(rng) * total;
    double cum = 0.0;
    int64_t last = -1;
    for (int64_t j = 0; j < n_vocab; j++) {
        const double w = verify_residual_w(p_row, q_row, d, j);
        if (w > 0.0) {
            cum += w;
            last = j;
            if (cum > r) return j;
        }
    }
    return last;
}

dfl_status spec_verify(int64_t n_vocab, int64_t n_draft, const int32_t *draft, const float *q, const float *p,
                       sample_rng *rng, spec_verify_result *res, dfl_error *err) {
    if (n_vocab < 1 || n_draft < 0 || p == NULL || rng == NULL || res == NULL || (n_draft > 0 && draft == NULL)) {
        return error_set(err, DFL_ERR_INVALID, "spec_verify: bad arguments (n_vocab %lld, n_draft %lld)",
                         (long long)n_vocab, (long long)n_draft);
    }
    for (int64_t i = 0; i < n_draft; i++) {
        if (draft[i] < 0 || draft[i] >= n_vocab) {
            return error_set(err, DFL_ERR_INVALID, "spec_verify: draft %lld (token %d) is outside [0, %lld)",
                             (long long)i, draft[i], (long long)n_vocab);
        }
    }
    for (int64_t i = 0; i < n_draft; i++) {
        const float *p_row = p + (size_t)i * (size_t)n_vocab;
        const float *q_row = q != NULL ? q + (size_t)i * (size_t)n_vocab : NULL;
        const int32_t d = draft[i];
        const double pd = (double)p_row[d];
        const double qd = q_row != NULL ? (double)q_row[d] : 1.0;
        /* accept with probability min(1, pd / qd): certain when pd >= qd, impossible when pd <= 0 */
        bool accept = pd >= qd;
        if (!accept && pd > 0.0) accept = rng_uniform(rng) * qd < pd;
        if (accept) continue;
        const int64_t next = verify_pick_residual(p_row, q_row, d, n_vocab, rng);
        if (next < 0) {
            return error_set(err, DFL_ERR_INVALID, "spec_verify: target row %lld has no probability mass",
                             (long long)i);
        }
        res->n_accepted = i;
        res->next_token = (int32_t)next;
        return DFL_OK;
    }
    /* every draft accepted: the bonus token from the last row */
    const float *p_last = p + (size_t)n_draft * (size_t)n_vocab;
    double total = 0.0;
    for (int64_t j = 0; j < n_vocab; j++) total += p_last[j] > 0.0f ? (double)p_last[j] : 0.0;
    const int64_t next = total > 0.0 ? rng_pick(rng, p_last, n_vocab, total) : -1;
    if (next < 0) {
        return error_set(err, DFL_ERR_INVALID, "spec_verify: target row %lld (bonus) has no probability mass",
                         (long long)n_draft);
    }
    res->n_accepted = n_draft;
    res->next_token = (int32_t)next;
    return DFL_OK;
}
