/* sampler.c: token sampling with llama.cpp's default-chain order:
 *   repetition penalty -> top-k -> top-p -> min-p -> temperature -> softmax -> draw,
 * greedy argmax for temp <= 0, and the final distribution for speculative verification.
 *
 * How the filters are computed without sorting the whole vocabulary in the common case:
 * top-k, top-p and min-p each keep a prefix of the candidates sorted by (logit desc, id asc).
 * top-k is a quickselect. min-p keeps p >= min_p * p_max; that ratio does not change when the
 * set is renormalized, so it can prune first, as long as top-p's cumulative mass is divided by
 * the mass of the whole top-k set (Z below): the kept set is then the shorter of the two
 * prefixes, exactly what top-p followed by min-p keeps. Only the survivors are sorted. */
#include "sample/sampler.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLER_MAX_WINDOW ((int64_t)1 << 24)
#define SAMPLER_MAX_ADD_PENALTY 100.0

typedef struct sampler_cand {
    int32_t id;
    float logit; /* after the repetition penalty */
    float p;     /* final probability (unnormalized until the end) */
} sampler_cand;

struct dfl_sampler {
    dfl_sampler_params params;
    int64_t n_vocab;
    sample_rng rng;
    int32_t *window;     /* [repeat_last_n] ring buffer of accepted tokens */
    int64_t n_window;    /* tokens in the window, <= repeat_last_n */
    int64_t head;        /* next slot to write */
    uint32_t *pen_mark;  /* [n_vocab] == pen_epoch: in the penalty window of the current call */
    uint32_t *pen_count; /* [n_vocab] occurrences in the window (valid where pen_mark == pen_epoch) */
    uint32_t pen_epoch;
    sampler_cand *cand;  /* [n_vocab] candidates of the current call */
};

dfl_sampler_params dfl_sampler_default_params(void) {
    dfl_sampler_params p;
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 0;
    return p;
}

dfl_sampler *dfl_sampler_new(const dfl_sampler_params *params, int64_t n_vocab, dfl_error *err) {
    error_clear(err);
    if (params == NULL) {
        error_set(err, DFL_ERR_INVALID, "sampler: NULL params");
        return NULL;
    }
    const dfl_sampler_params *p = params;
    if (n_vocab < 1 || n_vocab > (int64_t)INT32_MAX) {
        error_set(err, DFL_ERR_INVALID, "sampler: n_vocab %lld must be in [1, %d]", (long long)n_vocab, INT32_MAX);
        return NULL;
    }
    if (!isfinite(p->temp)) {
        error_set(err, DFL_ERR_INVALID, "sampler: temp %g is not finite", (double)p->temp);
        return NULL;
    }
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f)) {
        error_set(err, DFL_ERR_INVALID, "sampler: top_p %g must be in [0, 1]", (double)p->top_p);
        return NULL;
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        error_set(err, DFL_ERR_INVALID, "sampler: min_p %g must be in [0, 1]", (double)p->min_p);
        return NULL;
    }
    if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty))) {
        error_set(err, DFL_ERR_INVALID, "sampler: repeat_penalty %g must be a finite number > 0 (1 = off)",
                  (double)p->repeat_penalty);
        return NULL;
    }
    if (!(p->presence_penalty >= -SAMPLER_MAX_ADD_PENALTY && p->presence_penalty <= SAMPLER_MAX_ADD_PENALTY)) {
        error_set(err, DFL_ERR_INVALID, "sampler: presence_penalty %g must be in [%g, %g] (0 = off)",
                  (double)p->presence_penalty, -SAMPLER_MAX_ADD_PENALTY, SAMPLER_MAX_ADD_PENALTY);
        return NULL;
    }
    if (!(p->frequency_penalty >= -SAMPLER_MAX_ADD_PENALTY && p->frequency_penalty <= SAMPLER_MAX_ADD_PENALTY)) {
        error_set(err, DFL_ERR_INVALID, "sampler: frequency_penalty %g must be in [%g, %g] (0 = off)",
                  (double)p->frequency_penalty, -SAMPLER_MAX_ADD_PENALTY, SAMPLER_MAX_ADD_PENALTY);
        return NULL;
    }
    if (p->repeat_last_n < 0 || p->repeat_last_n > SAMPLER_MAX_WINDOW) {
        error_set(err, DFL_ERR_INVALID, "sampler: repeat_last_n %d must be in [0, %lld]", p->repeat_last_n,
                  (long long)SAMPLER_MAX_WINDOW);
        return NULL;
    }
    dfl_sampler *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        error_set(err, DFL_ERR_NOMEM, "sampler: out of memory");
        return NULL;
    }
    s->params = *p;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof(sampler_cand));
    s->pen_mark = calloc((size_t)n_vocab, sizeof(uint32_t));
    s->pen_count = calloc((size_t)n_vocab, sizeof(uint32_t));
    s->window = malloc((size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1) * sizeof(int32_t));
    if (s->cand == NULL || s->pen_mark == NULL || s->pen_count == NULL || s->window == NULL) {
        error_set(err, DFL_ERR_NOMEM, "sampler: out of memory for a vocabulary of %lld", (long long)n_vocab);
        dfl_sampler_free(s);
        return NULL;
    }
    dfl_sampler_reset(s);
    return s;
}

void dfl_sampler_free(dfl_sampler *s) {
    if (s == NULL) return;
    free(s->cand);
    free(s->pen_mark);
    free(s->pen_count);
    free(s->window);
    free(s);
}

void dfl_sampler_reset(dfl_sampler *s) {
    s->n_window = 0;
    s->head = 0;
    rng_seed(&s->rng, s->params.seed);
}

dfl_status dfl_sampler_accept(dfl_sampler *s, int32_t token) {
    if (s == NULL || token < 0 || token >= s->n_vocab) return DFL_ERR_INVALID;
    const int64_t cap = s->params.repeat_last_n;
    if (cap == 0) return DFL_OK;
    s->window[s->head] = token;
    s->head = (s->head + 1) % cap;
    if (s->n_window < cap) s->n_window++;
    return DFL_OK;
}

sample_rng *sampler_rng(dfl_sampler *s) {
    return &s->rng;
}

int64_t sampler_n_vocab(const dfl_sampler *s) {
    return s->n_vocab;
}

bool sampler_is_plain_greedy(const dfl_sampler *s) {
    const dfl_sampler_params *p = &s->params;
    const bool penalties = p->repeat_last_n > 0 &&
                           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
    return p->temp <= 0.0f && !penalties;
}

const dfl_sampler_params *sampler_params(const dfl_sampler *s) {
    return &s->params;
}

/* ---- the chain ---------------------------------------------------------------------------- */

/* a comes before b: higher logit, then lower id (a total order: ids are unique) */
static int cand_before(const sampler_cand *a, const sampler_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const sampler_cand *a = pa, *b = pb;
    return cand_before(a, b) ? -1 : (cand_before(b, a) ? 1 : 0);
}

/* Moves the k best candidates to c[0..k) (in no particular order): Wirth's quickselect. */
static void cand_select_top(sampler_cand *c, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    const int64_t kth = k - 1;
    while (lo < hi) {
        const sampler_cand x = c[kth];
        int64_t i = lo, j = hi;
        do {
            while (cand_before(&c[i], &x)) i++;
            while (cand_before(&x, &c[j])) j--;
            if (i <= j) {
                const sampler_cand tmp = c[i];
                c[i] = c[j];
                c[j] = tmp;
                i++;
                j--;
            }
        } while (i <= j);
        if (j < kth) lo = i;
        if (kth < i) hi = j;
    }
}

/* Counts one more occurrence of token v in the current call's window. */
static void sampler_count(dfl_sampler *s, int32_t v) {
    if (s->pen_mark[v] != s->pen_epoch) {
        s->pen_mark[v] = s->pen_epoch;
        s->pen_count[v] = 0;
    }
    s->pen_count[v]++;
}

/* Marks (and counts) the tokens of the penalty window: the last repeat_last_n of (window, then
 * extra). */
static dfl_status sampler_mark_window(dfl_sampler *s, const int32_t *extra, int64_t n_extra, dfl_error *err) {
    const int64_t cap = s->params.repeat_last_n;
    if (++s->pen_epoch == 0) { /* wrapped: forget all stamps */
        memset(s->pen_mark, 0, (size_t)s->n_vocab * sizeof(uint32_t));
        s->pen_epoch = 1;
    }
    const int64_t n_from_extra = n_extra < cap ? n_extra : cap;
    const int64_t n_from_window = s->n_window < cap - n_from_extra ? s->n_window : cap - n_from_extra;
    for (int64_t k = n_extra - n_from_extra; k < n_extra; k++) {
        if (extra[k] < 0 || extra[k] >= s->n_vocab) {
            return error_set(err, DFL_ERR_INVALID, "sampler: extra token %lld (id %d) is outside [0, %lld)",
                             (long long)k, extra[k], (long long)s->n_vocab);
        }
        sampler_count(s, extra[k]);
    }
    for (int64_t k = 0; k < n_from_window; k++) {
        const int64_t slot = ((s->head - 1 - k) % cap + cap) % cap;
        sampler_count(s, s->window[slot]);
    }
    return DFL_OK;
}

/* Runs the chain on logits [n_vocab]: fills s->cand[0..*n_out) with the kept tokens and their
 * probabilities (normalized, sum 1). */
static dfl_status sampler_run(dfl_sampler *s, const float *logits, const int32_t *extra, int64_t n_extra,
                              int64_t *n_out, dfl_error *err) {
    const dfl_sampler_params *p = &s->params;
    const int64_t n_vocab = s->n_vocab;
    if (logits == NULL) return error_set(err, DFL_ERR_INVALID, "sampler: NULL logits");
    if (n_extra < 0 || (n_extra > 0 && extra == NULL)) {
        return error_set(err, DFL_ERR_INVALID, "sampler: bad extra tokens (n %lld)", (long long)n_extra);
    }
    /* 1. penalties (llama.cpp: each distinct token of the window once: the repetition penalty
     * scales its logit, then frequency * count + presence is subtracted) */
    const bool penalize = (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) &&
                          p->repeat_last_n > 0;
    if (penalize) {
        const dfl_status st = sampler_mark_window(s, extra, n_extra, err);
        if (st != DFL_OK) return st;
    }
    sampler_cand *c = s->cand;
    int64_t n = 0;
    for (int64_t v = 0; v < n_vocab; v++) {
        float l = logits[v];
        if (isnan(l) || l == INFINITY) {
            return error_set(err, DFL_ERR_INVALID, "sampler: logit of token %lld is %g", (long long)v, (double)l);
        }
        if (l == -INFINITY) continue; /* masked: never drawn */
        if (penalize && s->pen_mark[v] == s->pen_epoch) {
            l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
            l -= (float)s->pen_count[v] * p->frequency_penalty + p->presence_penalty;
        }
        c[n].id = (int32_t)v;
        c[n].logit = l;
        c[n].p = 0.0f;
        n++;
    }
    if (n == 0) return error_set(err, DFL_ERR_INVALID, "sampler: no token has a finite logit");

    if (p->temp <= 0.0f) { /* greedy: argmax, the lowest id wins ties (candidates are in id order) */
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++) {
            if (c[i].logit > c[best].logit) best = i;
        }
        c[0] = c[best];
        c[0].p = 1.0f;
        *n_out = 1;
        return DFL_OK;
    }
    /* 2. top-k */
    if (p->top_k > 0 && p->top_k < n) {
        cand_select_top(c, n, p->top_k);
        n = p->top_k;
    }
    double l_max = -INFINITY;
    for (int64_t i = 0; i < n; i++) l_max = c[i].logit > l_max ? c[i].logit : l_max;
    /* Z: mass of the top-k set at temperature 1 (the denominator of top-p) */
    double z = 0.0;
    for (int64_t i = 0; i < n; i++) z += exp((double)c[i].logit - l_max);
    /* 4. min-p, pruned early (see the top of the file): keep p / p_max >= min_p */
    if (p->min_p > 0.0f) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            if (exp((double)c[i].logit - l_max) >= (double)p->min_p) c[m++] = c[i];
        }
        n = m; /* the max itself always stays */
    }
    /* 3. top-p: the shortest prefix (sorted) whose mass reaches top_p * Z, at least one token */
    if (p->top_p < 1.0f) {
        qsort(c, (size_t)n, sizeof(sampler_cand), cand_cmp);
        double cum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - l_max);
            if (cum >= (double)p->top_p * z) {
                n = i + 1;
                break;
            }
        }
    }
    /* 5-6. temperature and softmax over the kept set */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += exp(((double)c[i].logit - l_max) / (double)p->temp);
    for (int64_t i = 0; i < n; i++) c[i].p = (float)(exp(((double)c[i].logit - l_max) / (double)p->temp) / sum);
    *n_out = n;
    return DFL_OK;
}

int32_t dfl_sampler_sample(dfl_sampler *s, const float *logits) {
    if (s == NULL) return -(int32_t)DFL_ERR_INVALID;
    int64_t n = 0;
    const dfl_status st = sampler_run(s, logits, NULL, 0, &n, NULL);
    if (st != DFL_OK) return -(int32_t)st;
    if (n == 1) return s->cand[0].id; /* greedy or a single survivor: no random number */
    /* 7. draw */
    const double r = rng_uniform(&s->rng);
    double cum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        cum += (double)s->cand[i].p;
        if (cum > r) return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* rounding: the sum fell short of r */
}

dfl_status sampler_probs_after(dfl_sampler *s, const float *logits, const int32_t *extra, int64_t n_extra,
                               float *probs_out, dfl_error *err) {
    int64_t n = 0;
    const dfl_status st = sampler_run(s, logits, extra, n_extra, &n, err);
    if (st != DFL_OK) return st;
    memset(probs_out, 0, (size_t)s->n_vocab * sizeof(float));
    for (int64_t i = 0; i < n; i++) probs_out[s->cand[i].id] = s->cand[i].p;
    return DFL_OK;
}

dfl_status sampler_probs(dfl_sampler *s, const float *logits, float *probs_out, dfl_error *err) {
    return sampler_probs_after(s, logits, NULL, 0, probs_out, err);
}
