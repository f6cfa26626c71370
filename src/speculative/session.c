/* session.c: the DFlash speculative state machine (docs/drafter.md) over a target context and a
 * drafter context. Several sequences advance together: one drafter pass drafts a block for
 * every active sequence (each its own length), one target batch verifies them all. Every
 * sequence samples and verifies with its own sampler, through the same transform chain as plain
 * decoding (penalties included). */
#include "speculative/session.h"
#include "base/error.h"
#include "batch/batch.h"
#include "model/context.h"
#include "sample/sampler.h"
#include "sample/spec_verify.h"
#include "speculative/drafter_dflash2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct spec_session {
    dfl_context *tgt;
    dfl_context *dft;
    spec_params params;
    int32_t n_draft;        /* drafts per step */
    int32_t n_seq;
    int64_t n_vocab;
    int64_t width;          /* n_tl * n_embd: floats of one token's raw features */
    dfl_sampler *sampler;   /* the session's own sampler (spec_params' transforms) */
    dfl_sampler **smp;      /* [n_seq] each sequence's sampler (default: sampler) */
    int32_t *kmax;          /* [n_seq] each sequence's longest draft (<= n_draft) */
    int32_t *lens;          /* [n_seq] draft length of each sequence of the current pass */
    bool *need_logits;      /* [n_seq] the sequence wants full logits (logprobs) */
    int32_t *last;          /* [n_seq] committed token not yet in the target's cache, -1: idle */
    int32_t *draft;         /* [n_seq, n_draft] */
    int32_t *n_use;         /* [n_seq] drafts verified this step (<= n_draft; draft_p_min cut) */
    int32_t *want;          /* [n_seq] adaptive draft length (n_draft_min > 0 only) */
    float *dlogits;         /* [n_seq * n_draft, n_vocab] drafter logits (draft_p_min > 0 only) */
    dfl_batch *verify;      /* [n_seq * (n_draft+1)] token entries */
    dfl_batch *inject;      /* drafter injection entries (features or rows) */
    dfl_batch *pbatch;      /* [n_batch] prompt chunks */
    float *probs;           /* [n_draft+1, n_vocab] target distributions of one sequence (sampling) */
    int64_t *vidx;          /* [n_seq] index of each sequence's first entry in the verify batch */
    spec_stats stats;
    dfl_feature_path path;  /* the path in use (a device request may fall back to host) */
    uint64_t host_bytes_base; /* the target's feature_host_bytes when this session began */
    char note[200];
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int32_t draft_start(const spec_session *s, int32_t seq);

spec_params spec_default_params(void) {
    spec_params p;
    memset(&p, 0, sizeof(p));
    p.n_draft = 0;
    p.temp = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.features = DFL_FEATURES_DEVICE;
    return p;
}

void spec_free(spec_session *s) {
    if (s == NULL) return;
    dfl_sampler_free(s->sampler);
    dfl_batch_free(s->verify);
    dfl_batch_free(s->inject);
    dfl_batch_free(s->pbatch);
    free(s->smp);
    free(s->kmax);
    free(s->lens);
    free(s->need_logits);
    free(s->last);
    free(s->draft);
    free(s->probs);
    free(s->vidx);
    free(s->n_use);
    free(s->want);
    free(s->dlogits);
    free(s);
}

spec_session *spec_new(dfl_context *tgt, dfl_context *dft, const spec_params *params, dfl_error *err) {
    error_clear(err);
    if (tgt == NULL || dft == NULL) {
        error_set(err, DFL_ERR_INVALID, "spec_new: NULL context");
        return NULL;
    }
    if (drafter_target(dft) != tgt) {
        error_set(err, DFL_ERR_INVALID, "spec_new: the drafter context was not created for this target context");
        return NULL;
    }
    spec_params p = params ? *params : spec_default_params();
    const dfl_hparams *dh = &dft->model->hp;
    if (p.n_draft == 0) p.n_draft = (int32_t)dh->n_draft_max;
    if (!(p.draft_p_min >= 0.0f && p.draft_p_min <= 1.0f)) {
        error_set(err, DFL_ERR_INVALID, "draft_p_min %g is outside [0, 1]", (double)p.draft_p_min);
        return NULL;
    }
    if (p.n_draft < 1 || p.n_draft > dh->n_draft_max) {
        error_set(err, DFL_ERR_INVALID, "draft length %d is outside 1..%lld (the drafter's block_size %lld%s)", p.n_draft,
                  (long long)dh->n_draft_max, (long long)dh->block_size,
                  dh->n_draft_max == dh->block_size ? ", anchor-first DSpark" : " - 1");
        return NULL;
    }
    /* DSpark: draft_p_min cuts on the confidence head (as llama.cpp), which the file must have */
    if (dh->dspark && !dh->dspark_confidence && p.draft_p_min > 0.0f) {
        error_set(err, DFL_ERR_UNSUPPORTED, "draft_p_min %g: this DSpark drafter has no confidence head (conf_proj) to cut "
                  "the draft with; use draft_p_min 0", (double)p.draft_p_min);
        return NULL;
    }
    if (p.n_draft_min < 0 || p.n_draft_min > p.n_draft) {
        error_set(err, DFL_ERR_INVALID, "minimum draft length %d is outside 0..%d (the draft length)", p.n_draft_min,
                  p.n_draft);
        return NULL;
    }
    const int32_t n_seq = dfl_n_seq(dft) < dfl_n_seq(tgt) ? dfl_n_seq(dft) : dfl_n_seq(tgt);
    const int64_t n_verify = (int64_t)n_seq * (p.n_draft + 1);
    if (n_verify > tgt->params.n_batch || n_verify > tgt->n_out_max) {
        error_set(err, DFL_ERR_INVALID, "a verification batch of %d sequences x %d tokens needs n_batch and n_outputs >= "
                  "%lld in the target context (have %lld and %lld)", n_seq, p.n_draft + 1, (long long)n_verify,
                  (long long)tgt->params.n_batch, (long long)tgt->n_out_max);
        return NULL;
    }
    spec_session *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->tgt = tgt;
    s->dft = dft;
    s->params = p;
    s->n_draft = p.n_draft;
    s->n_seq = n_seq;
    s->n_vocab = tgt->n_vocab;
    s->width = dh->n_target_layers * dh->n_embd;
    dfl_sampler_params sp = dfl_sampler_default_params();
    sp.temp = p.temp;
    sp.top_k = p.top_k;
    sp.top_p = p.top_p;
    sp.min_p = p.min_p;
    sp.repeat_penalty = 1.0f;
    sp.repeat_last_n = 0;
    sp.seed = p.seed;
    s->sampler = dfl_sampler_new(&sp, s->n_vocab, err);
    s->last = malloc((size_t)n_seq * sizeof(int32_t));
    s->draft = calloc((size_t)n_seq * (size_t)p.n_draft, sizeof(int32_t));
    s->vidx = calloc((size_t)n_seq, sizeof(int64_t));
    s->n_use = calloc((size_t)n_seq, sizeof(int32_t));
    s->want = calloc((size_t)n_seq, sizeof(int32_t));
    if (p.draft_p_min > 0.0f && !dh->dspark) {
        s->dlogits = malloc((size_t)n_seq * (size_t)p.n_draft * (size_t)s->n_vocab * sizeof(float));
    }
    s->verify = dfl_batch_init(n_verify, 0, 1, err);
    const int64_t n_inject = tgt->params.n_batch > n_verify ? tgt->params.n_batch : n_verify;
    /* the feature path: the device buffer unless asked otherwise or impossible */
    s->path = p.features;
    snprintf(s->note, sizeof(s->note), "%s", p.features == DFL_FEATURES_HOST ? "host copies requested" : "device buffer");
    if (s->path == DFL_FEATURES_DEVICE && !dfl_context_has_feature_buffer(tgt)) {
        s->path = DFL_FEATURES_HOST;
        snprintf(s->note, sizeof(s->note), "fallback to host copies: %s", dfl_context_feature_buffer_note(tgt));
    } else if (s->path == DFL_FEATURES_DEVICE && dft->be != tgt->be &&
               !(backend_get_caps(dft->be).host_visible && backend_get_caps(tgt->be).host_visible)) {
        s->path = DFL_FEATURES_HOST;
        snprintf(s->note, sizeof(s->note), "fallback to host copies: the drafter's backend cannot read the target's buffer");
    }
    tgt->link->wait_on_device = p.wait == DFL_WAIT_DEVICE;
    s->inject = dfl_batch_init(n_inject, s->path == DFL_FEATURES_HOST ? s->width : 0, 1, err);
    s->probs = malloc((size_t)(p.n_draft + 1) * (size_t)s->n_vocab * sizeof(float));
    s->pbatch = dfl_batch_init(tgt->params.n_batch, 0, 1, err);
    s->smp = calloc((size_t)n_seq, sizeof(dfl_sampler *));
    s->kmax = calloc((size_t)n_seq, sizeof(int32_t));
    s->lens = calloc((size_t)n_seq, sizeof(int32_t));
    s->need_logits = calloc((size_t)n_seq, sizeof(bool));
    if (s->sampler == NULL || s->last == NULL || s->draft == NULL || s->vidx == NULL || s->n_use == NULL || s->want == NULL ||
        s->verify == NULL || s->inject == NULL || s->probs == NULL || s->pbatch == NULL || s->smp == NULL || s->kmax == NULL || s->lens == NULL || s->need_logits == NULL ||
        (p.draft_p_min > 0.0f && !dh->dspark && s->dlogits == NULL)) {
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the speculative session");
        spec_free(s);
        return NULL;
    }
    for (int32_t i = 0; i < n_seq; i++) {
        s->last[i] = -1;
        s->smp[i] = s->sampler;
        s->kmax[i] = s->n_draft;
        s->want[i] = draft_start(s, i);
    }
    /* the device path reads the target's feature buffer in place: no host copy of features */
    tgt->link->to_host = s->path == DFL_FEATURES_HOST && tgt->link->device;
    s->host_bytes_base = tgt->link->host_bytes;
    return s;
}

int32_t spec_n_draft(const spec_session *s) { return s->n_draft; }
spec_stats spec_get_stats(const spec_session *s) { return s->stats; }
const char *spec_feature_path_name(const spec_session *s) { return s->path == DFL_FEATURES_HOST ? "host" : "device"; }
const char *spec_feature_note(const spec_session *s) { return s->note; }

/* A sequence's first draft length. */
static int32_t draft_start(const spec_session *s, int32_t seq) {
    const int32_t kmax = s->kmax[seq];
    const int32_t kmin = s->params.n_draft_min < kmax ? s->params.n_draft_min : kmax;
    if (kmin <= 0) return kmax;
    int32_t k = SPEC_DRAFT_START;
    if (k < kmin) k = kmin;
    return k < kmax ? k : kmax;
}

void spec_seq_set_sampler(spec_session *s, int32_t seq, dfl_sampler *smp) {
    if (seq < 0 || seq >= s->n_seq) return;
    s->smp[seq] = smp != NULL ? smp : s->sampler;
}

void spec_seq_set_max_draft(spec_session *s, int32_t seq, int32_t n_draft) {
    if (seq < 0 || seq >= s->n_seq) return;
    s->kmax[seq] = n_draft >= 1 && n_draft <= s->n_draft ? n_draft : s->n_draft;
    s->want[seq] = draft_start(s, seq);
}

int32_t spec_step_room(const spec_session *s) { return s->n_draft + 1; }

void spec_seq_set_need_logits(spec_session *s, int32_t seq, bool on) {
    if (seq >= 0 && seq < s->n_seq) s->need_logits[seq] = on;
}

const float *spec_step_logits(const spec_session *s, int32_t i, int32_t j) {
    return dfl_get_logits(s->tgt, s->vidx[i] + j);
}

void spec_seq_reset(spec_session *s, int32_t seq) {
    if (seq < 0 || seq >= s->n_seq) return;
    dfl_seq_remove(s->tgt, seq, 0, NULL);
    dfl_seq_remove(s->dft, seq, 0, NULL);
    s->last[seq] = -1;
    s->want[seq] = draft_start(s, seq);
}

/* Feeds the drafter the features of entries [i0, i0 + n) of the target's last batch, which
 * belong to `seq` at consecutive positions from the drafter's current length. */
static dfl_status inject_rows(spec_session *s, int32_t seq, int64_t i0, int64_t n, dfl_error *err) {
    const double t0 = now_ms();
    const int64_t cap = s->dft->params.n_batch < s->inject->n_tokens_max ? s->dft->params.n_batch : s->inject->n_tokens_max;
    for (int64_t off = 0; off < n; off += cap) {
        const int64_t m = n - off < cap ? n - off : cap;
        dfl_batch_clear(s->inject);
        int64_t p0 = dfl_seq_len(s->dft, seq);
        for (int64_t k = 0; k < m; k++) {
            const int32_t pos = (int32_t)(p0 + k);
            const int64_t row = i0 + off + k;
            if (s->path == DFL_FEATURES_HOST) {
                dfl_batch_add_embd(s->inject, dfl_get_features(s->tgt, row), &pos, seq, false);
            } else {
                dfl_batch_add_embd_row(s->inject, (int32_t)row, &pos, seq, false);
            }
        }
        dfl_status st = drafter_inject(s->dft, s->inject, err);
        if (st != DFL_OK) return st;
    }
    s->stats.t_inject_ms += now_ms() - t0;
    return DFL_OK;
}

/* Argmax of a row, lowest id on ties. */
static int32_t argmax_row(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    return (int32_t)best;
}

dfl_status spec_prefill(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int32_t *first,
                            dfl_error *err) {
    error_clear(err);
    if (seq >= 0 && seq < s->n_seq && (dfl_seq_len(s->tgt, seq) != 0 || dfl_seq_len(s->dft, seq) != 0)) {
        return error_set(err, DFL_ERR_INVALID, "prefill: sequence %d is not empty (reset it first)", seq);
    }
    return spec_prefill_from(s, seq, prompt, n_prompt, 0, first, err);
}

dfl_status spec_prefill_from(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t n_cached,
                             int32_t *first, dfl_error *err) {
    return spec_prefill_range(s, seq, prompt, n_prompt, n_cached, n_prompt, first, err);
}

static dfl_status prefill_impl(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t from,
                               int64_t to, bool anchor, int32_t *first, dfl_error *err);

dfl_status spec_prefill_range(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t from,
                              int64_t to, int32_t *first, dfl_error *err) {
    return prefill_impl(s, seq, prompt, n_prompt, from, to, false, first, err);
}

dfl_status spec_prefill_anchor(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t from,
                               int64_t to, dfl_error *err) {
    return prefill_impl(s, seq, prompt, n_prompt, from, to, true, NULL, err);
}

/* Decodes prompt[from, end) in the target and feeds its features to the drafter; end = to, or
 * n_prompt - 1 for the last range in anchor mode. The last range (to == n_prompt) accepts the
 * prompt into the sampler and either samples the first token from the last prompt logits or, in
 * anchor mode, makes the last prompt token the sequence's anchor (undecoded, like a bonus token). */
static dfl_status prefill_impl(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t from,
                               int64_t to, bool anchor, int32_t *first, dfl_error *err) {
    if (seq < 0 || seq >= s->n_seq) return error_set(err, DFL_ERR_INVALID, "prefill: sequence %d is out of range", seq);
    if (n_prompt < 1 || prompt == NULL) return error_set(err, DFL_ERR_INVALID, "prefill: the prompt is empty");
    if (from < 0 || from >= to || to > n_prompt || dfl_seq_len(s->tgt, seq) != from || dfl_seq_len(s->dft, seq) != from) {
        return error_set(err, DFL_ERR_INVALID, "prefill: sequence %d holds %lld (target) and %lld (drafter) positions, "
                         "expected %lld before prompt tokens %lld..%lld of %lld", seq, (long long)dfl_seq_len(s->tgt, seq),
                         (long long)dfl_seq_len(s->dft, seq), (long long)from, (long long)from, (long long)to - 1,
                         (long long)n_prompt);
    }
    const int64_t room = dfl_n_ctx(s->tgt) - (s->n_draft + 1);
    if (n_prompt > room) {
        return error_set(err, DFL_ERR_CTX_FULL, "prompt of %lld tokens does not fit the context (%lld positions, %d kept "
                         "free for a verification block)", (long long)n_prompt, (long long)dfl_n_ctx(s->tgt), s->n_draft + 1);
    }
    for (int64_t i = from; i < to; i++) {
        if (prompt[i] < 0 || prompt[i] >= s->n_vocab) {
            return error_set(err, DFL_ERR_INVALID, "prompt token %lld = %d is outside the vocabulary (%lld)", (long long)i,
                             prompt[i], (long long)s->n_vocab);
        }
    }
    const double t0 = now_ms();
    dfl_batch *pb = s->pbatch;
    const int64_t chunk = pb->n_tokens_max;
    dfl_sampler *smp = s->smp[seq];
    dfl_status st = DFL_OK;
    int32_t tok = -1;
    const int64_t end = anchor && to == n_prompt ? n_prompt - 1 : to;
    for (int64_t off = from; off < end && st == DFL_OK; off += chunk) {
        const int64_t m = end - off < chunk ? end - off : chunk;
        dfl_batch_clear(pb);
        for (int64_t k = 0; k < m; k++) {
            const int32_t pos = (int32_t)(off + k);
            dfl_batch_add_token(pb, prompt[off + k], &pos, seq, off + k == n_prompt - 1);
        }
        st = dfl_decode(s->tgt, pb, err);
        if (st == DFL_OK) st = inject_rows(s, seq, 0, m, err);
        if (st == DFL_OK && off + m == n_prompt) {
            for (int64_t i = 0; i < n_prompt; i++) dfl_sampler_accept(smp, prompt[i]);
            const float *lg = dfl_get_logits(s->tgt, m - 1);
            tok = dfl_sampler_sample(smp, lg);
            if (tok < 0) st = error_set(err, DFL_ERR_INVALID, "prefill: the target's logits are not finite");
            else dfl_sampler_accept(smp, tok);
        }
    }
    if (st != DFL_OK) {
        spec_seq_reset(s, seq);
        return st;
    }
    if (anchor && to == n_prompt) {
        for (int64_t i = 0; i < n_prompt; i++) dfl_sampler_accept(smp, prompt[i]);
        tok = prompt[n_prompt - 1];
    }
    if (to == n_prompt) s->last[seq] = tok;
    if (first != NULL) *first = tok;
    s->stats.t_prefill_ms += now_ms() - t0;
    s->stats.feature_host_bytes = s->tgt->link->host_bytes - s->host_bytes_base;
    s->stats.n_prefill_tokens += to - from;
    return DFL_OK;
}

/* The drafter's probability of token t in its logits row l [n_vocab] (softmax). */
static double draft_prob(const float *l, int64_t n_vocab, int32_t t) {
    float max = l[0];
    for (int64_t v = 1; v < n_vocab; v++) max = l[v] > max ? l[v] : max;
    double sum = 0.0;
    for (int64_t v = 0; v < n_vocab; v++) sum += (double)expf(l[v] - max);
    return (double)expf(l[t] - max) / sum;
}

/* Drafts of one sequence kept for verification: those before the first token whose drafter
 * probability is below p_min (rows [k, n_vocab] of the drafter's logits). */
static int32_t draft_keep(const float *rows, const int32_t *d, int32_t k, int64_t n_vocab, float p_min) {
    for (int32_t j = 0; j < k; j++) {
        if (draft_prob(rows + (size_t)j * (size_t)n_vocab, n_vocab, d[j]) < (double)p_min) return j;
    }
    return k;
}

/* Drafts kept before the first slot whose own probability (DSpark confidence, DFlash2 walk) is
 * below p_min (llama.cpp's cut for both). */
static int32_t conf_keep(const float *conf, int32_t k, float p_min) {
    for (int32_t j = 0; j < k; j++) {
        if (conf[j] < p_min) return j;
    }
    return k;
}

/*
 * One speculative step for n sequences:
 *   1. draft: one drafter pass decodes the block [last, MASK x k] of every sequence (non-causal
 *      over its injected context; k = the sequence's own draft length: n_draft, or with
 *      n_draft_min its adaptive length, so its drafts depend on its own state only) -> d_1..d_k;
 *      a sequence keeps d_1..d_m, cut with draft_p_min before the first draft whose drafter
 *      probability is below it (below, k stands for the sequence's m);
 *   2. verify: one target batch of [last, d_1..d_k] per sequence at positions start..start+k,
 *      logits at every entry, layer inputs captured;
 *   3. accept: a = the longest prefix with d_{i+1} == argmax(logits_i) (greedy without
 *      penalties), or the rejection rule on the sequence's sampler distributions (sampling, or
 *      penalties: slot j sees d_1..d_j in its penalty window); commit d_1..d_a and the bonus;
 *   4. roll back the target: remove positions >= start + a + 1 (the bonus is not yet cached);
 *   5. feed the drafter the features of positions start .. start+a from this verify batch
 *      (never the bonus position); the drafter's block K/V were already dropped;
 *   6. last = bonus; start += a + 1; with n_draft_min, the sequence's wanted length grows by 2
 *      after a = m = wanted, shrinks by 1 after a < m.
 */
dfl_status spec_step(spec_session *s, int32_t n, const int32_t *seqs, int32_t *tokens, int32_t *n_tokens,
                         dfl_error *err) {
    error_clear(err);
    return spec_step_ex(s, n, seqs, tokens, n_tokens, NULL, err);
}

dfl_status spec_step_ex(spec_session *s, int32_t n, const int32_t *seqs, int32_t *tokens, int32_t *n_tokens,
                        int32_t *n_drafted, dfl_error *err) {
    const int32_t K = s->n_draft; /* the longest draft: tokens rows have K + 1 entries */
    if (n < 1 || n > s->n_seq) return error_set(err, DFL_ERR_INVALID, "step: %d sequences (expected 1..%d)", n, s->n_seq);
    for (int32_t i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= s->n_seq || s->last[seqs[i]] < 0) {
            return error_set(err, DFL_ERR_INVALID, "step: sequence %d is out of range or not prefilled", seqs[i]);
        }
        for (int32_t j = 0; j < i; j++) {
            if (seqs[j] == seqs[i]) return error_set(err, DFL_ERR_INVALID, "step: sequence %d listed twice", seqs[i]);
        }
        if (dfl_seq_len(s->tgt, seqs[i]) + K + 1 > dfl_n_ctx(s->tgt)) {
            return error_set(err, DFL_ERR_CTX_FULL, "step: sequence %d is full (%lld of %lld positions)", seqs[i],
                             (long long)dfl_seq_len(s->tgt, seqs[i]), (long long)dfl_n_ctx(s->tgt));
        }
    }
    int32_t last_of[256];
    int32_t k = 1; /* this pass's longest draft: the stride of the draft rows */
    for (int32_t i = 0; i < n; i++) {
        last_of[i] = s->last[seqs[i]];
        s->lens[i] = s->want[seqs[i]];
        k = s->lens[i] > k ? s->lens[i] : k;
    }

    /* 1. draft: each sequence its own block length */
    double t0 = now_ms();
    dfl_status st = drafter_draft(s->dft, n, seqs, last_of, k, s->lens, s->draft, s->dlogits, err);
    if (st != DFL_OK) return st;
    /* the drafter's ARGMAX flags a slot whose logits hold a NaN/Inf as -1 - (first such token):
     * a sequence's draft ends before its first such slot (a broken drafter, or features from a
     * broken target, whose own verify then fails with the target's error); counted in the stats */
    for (int32_t i = 0; i < n; i++) {
        const int32_t *d = s->draft + (size_t)i * (size_t)k;
        for (int32_t j = 0; j < s->lens[i]; j++) {
            if (d[j] < 0) {
                s->stats.n_draft_nonfinite += s->lens[i] - j;
                s->lens[i] = j;
                break;
            }
        }
    }
    double t1 = now_ms();
    s->stats.t_draft_ms += t1 - t0;
    if (s->params.draft_hook != NULL) {
        for (int32_t i = 0; i < n; i++) {
            int32_t *d = s->draft + (size_t)i * (size_t)k;
            s->params.draft_hook(s->params.draft_hook_user, seqs[i], d, s->lens[i]);
            for (int32_t j = 0; j < s->lens[i]; j++) {
                if (d[j] < 0 || d[j] >= s->n_vocab) {
                    return error_set(err, DFL_ERR_INVALID, "draft hook: token %d is outside the vocabulary", d[j]);
                }
            }
        }
    }
    const float *conf = s->params.draft_p_min > 0.0f ? drafter_confidence(s->dft) : NULL;
    /* DFlash2: draft_p_min cuts where the walk's own probability (softmax over the lattice
     * scores of the chosen predecessor) falls below it, as llama.cpp's --draft-p-min does */
    const float *walk_p = drafter_dflash2(s->dft) != NULL ? dflash2_last_probs(s->dft) : NULL;
    /* a drafter with its own per-slot probability (DSpark's confidence, DFlash2's walk) is cut on
     * it; otherwise on the drafter's softmax probability of each draft */
    const float *slot_p = conf != NULL ? conf : s->dlogits != NULL ? walk_p : NULL;
    for (int32_t i = 0; i < n; i++) {
        const int32_t want = s->lens[i];
        if (slot_p != NULL) {
            s->n_use[i] = conf_keep(slot_p + (size_t)i * (size_t)k, want, s->params.draft_p_min);
        } else {
            s->n_use[i] = s->dlogits == NULL ? want
                                             : draft_keep(s->dlogits + (size_t)i * (size_t)k * (size_t)s->n_vocab,
                                                          s->draft + (size_t)i * (size_t)k, want, s->n_vocab,
                                                          s->params.draft_p_min);
        }
    }

    /* 2. verify */
    dfl_batch_clear(s->verify);
    for (int32_t i = 0; i < n; i++) {
        const int64_t start = dfl_seq_len(s->tgt, seqs[i]);
        s->vidx[i] = s->verify->n_tokens;
        for (int32_t j = 0; j <= s->n_use[i]; j++) {
            const int32_t pos = (int32_t)(start + j);
            const int32_t tok = j == 0 ? last_of[i] : s->draft[(size_t)i * (size_t)k + (size_t)(j - 1)];
            dfl_batch_add_token(s->verify, tok, &pos, seqs[i], true);
        }
    }
    /* greedy sequences without penalties need only the argmax of each verify row: the verify
     * batch then returns n ids instead of n x n_vocab logits, unless a sequence samples */
    bool ids_only = true;
    for (int32_t i = 0; i < n; i++) ids_only = ids_only && sampler_is_plain_greedy(s->smp[seqs[i]]) && !s->need_logits[seqs[i]];
    context_set_argmax_only(s->tgt, ids_only);
    st = dfl_decode(s->tgt, s->verify, err);
    context_set_argmax_only(s->tgt, false);
    if (st != DFL_OK) return st;
    double t2 = now_ms();
    s->stats.t_verify_ms += t2 - t1;

    /* 3-6 per sequence */
    for (int32_t i = 0; i < n; i++) {
        const int32_t seq = seqs[i];
        const int32_t *d = s->draft + (size_t)i * (size_t)k;
        const int32_t m = s->n_use[i];
        const int64_t start = dfl_seq_len(s->tgt, seq) - (m + 1);
        dfl_sampler *smp = s->smp[seq];
        int64_t a = 0;
        int32_t next = -1;
        if (ids_only) {
            while (a < m && d[a] == context_get_argmax(s->tgt, s->vidx[i] + a)) a++;
            next = context_get_argmax(s->tgt, s->vidx[i] + a);
        } else if (sampler_is_plain_greedy(smp)) {
            while (a < m && d[a] == argmax_row(dfl_get_logits(s->tgt, s->vidx[i] + a), s->n_vocab)) a++;
            next = argmax_row(dfl_get_logits(s->tgt, s->vidx[i] + a), s->n_vocab);
        } else {
            /* the target's distribution at slot j is the sampler's, as if d_1..d_j were accepted
             * (the penalty window grows with the drafts exactly as in plain decoding) */
            for (int32_t j = 0; j <= m; j++) {
                st = sampler_probs_after(smp, dfl_get_logits(s->tgt, s->vidx[i] + j), d, j,
                                         s->probs + (size_t)j * (size_t)s->n_vocab, err);
                if (st != DFL_OK) return st;
            }
            spec_verify_result res;
            st = spec_verify(s->n_vocab, m, d, NULL, s->probs, sampler_rng(smp), &res, err);
            if (st != DFL_OK) return st;
            a = res.n_accepted;
            next = res.next_token;
        }
        for (int64_t j = 0; j < a; j++) {
            tokens[(size_t)i * (size_t)(K + 1) + (size_t)j] = d[j];
            dfl_sampler_accept(smp, d[j]);
        }
        tokens[(size_t)i * (size_t)(K + 1) + (size_t)a] = next;
        dfl_sampler_accept(smp, next);
        /* the adaptive draft length: longer after a whole accepted draft, shorter after a reject */
        if (s->params.n_draft_min > 0) {
            int32_t *w = &s->want[seq];
            const int32_t kmax = s->kmax[seq];
            const int32_t kmin = s->params.n_draft_min < kmax ? s->params.n_draft_min : kmax;
            if (a == m && m == *w) *w = *w + 2 < kmax ? *w + 2 : kmax;
            else if (a < m) *w = *w - 1 > kmin ? *w - 1 : kmin;
        }
        n_tokens[i] = (int32_t)(a + 1);
        if (n_drafted != NULL) n_drafted[i] = m;
        /* 4. target rollback: keep last, d_1..d_a */
        dfl_seq_remove(s->tgt, seq, start + a + 1, NULL);
        s->last[seq] = next;
        s->stats.n_steps++;
        s->stats.n_drafted += m;
        s->stats.n_accepted += a;
        s->stats.accept_hist[a]++;
    }
    double t3 = now_ms();
    s->stats.t_other_ms += t3 - t2;
    /* 5. drafter context: features of [last, d_1..d_a] from this verify batch */
    for (int32_t i = 0; i < n; i++) {
        st = inject_rows(s, seqs[i], s->vidx[i], n_tokens[i], err);
        if (st != DFL_OK) return st;
    }
    s->stats.feature_host_bytes = s->tgt->link->host_bytes - s->host_bytes_base;
    return DFL_OK;
}
