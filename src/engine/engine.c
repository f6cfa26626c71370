/* engine.c: dfl_engine: a target (+ DFlash drafter) pair sized for n_seq sequences, and the
 * sequences' life cycle: start (prefill with prefix reuse), step (speculative through the
 * session of src/speculative/, or plain: one batch of one token per sequence), stop conditions,
 * text deltas, cancel, reset, statistics. Both paths sample with each sequence's own sampler,
 * which sees every committed token (prompt included). */
#include "dflash.h"
#include "base/error.h"
#include "engine/stop_text.h"
#include "model/context.h"
#include "sample/sampler.h"
#include "speculative/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct eng_seq {
    dfl_seq_state state;
    dfl_finish_reason finish;
    dfl_sampler *smp;          /* this run's sampler (NULL while idle) */
    dfl_detok *detok;          /* NULL without a vocabulary */
    int32_t *hist;             /* [n_ctx] the tokens its caches hold, in order */
    int64_t n_hist;
    int64_t n_prompt;          /* the prompt's length (hist[n_hist, n_prompt): still to prefill) */
    int64_t prefill_chunk;     /* prompt tokens per prefill call, <= 0: all */
    int32_t pending;           /* the last committed token, not yet in the caches; -1: none */
    int64_t max_tokens;        /* <= 0: no limit */
    int32_t *stop_tok;         /* [n_stop_tok] */
    int32_t n_stop_tok;
    bool ignore_eos;
    stop_text stop;
    bool want_lp;              /* logprobs asked for */
    int32_t n_top;             /* top logprobs per position */
    /* output since the last read */
    int32_t *out_tok;
    int64_t n_out, cap_out;
    float *out_lp;             /* [cap_out] (want_lp) */
    int32_t *out_top_id;       /* [cap_out, n_top] */
    float *out_top_lp;         /* [cap_out, n_top] */
    text_buf text;
    bool drained;              /* read since the last append: the next append starts afresh */
    dfl_seq_stats stats;
} eng_seq;

struct dfl_engine {
    dfl_model *target, *drafter;
    bool own_models;
    dfl_vocab *vocab;
    bool own_vocab;
    dfl_context *tctx, *dctx;
    spec_session *spec;            /* NULL: plain decoding */
    dfl_engine_params params;
    int32_t n_seq, n_draft;
    int64_t n_ctx, n_vocab, n_batch;
    eng_seq *seqs;             /* [n_seq] */
    dfl_batch *batch;          /* plain path: prompt chunks and steps [max(n_batch, n_seq)] */
    int32_t *act;              /* [n_seq] sequences of the current step */
    int32_t *step_tok;         /* [n_seq, n_draft + 1] */
    int32_t *step_n;           /* [n_seq] */
    int32_t *step_nd;          /* [n_seq] */
    dfl_engine_stats stats;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

dfl_engine_params dfl_engine_default_params(void) {
    dfl_engine_params p;
    memset(&p, 0, sizeof(p));
    p.n_seq = 1;
    p.n_batch = 512;
    p.features = DFL_FEATURES_DEVICE;
    p.wait = DFL_WAIT_HOST;
    return p;
}

dfl_seq_params dfl_seq_default_params(void) {
    dfl_seq_params p;
    memset(&p, 0, sizeof(p));
    p.sampler = dfl_sampler_default_params();
    p.sampler.temp = 0.0f;
    return p;
}

static void seq_free(eng_seq *q) {
    dfl_sampler_free(q->smp);
    dfl_detok_free(q->detok);
    free(q->hist);
    free(q->stop_tok);
    stop_text_free(&q->stop);
    free(q->out_tok);
    free(q->out_lp);
    free(q->out_top_id);
    free(q->out_top_lp);
    text_buf_free(&q->text);
}

void dfl_engine_free(dfl_engine *e) {
    if (e == NULL) return;
    if (e->seqs != NULL) {
        for (int32_t i = 0; i < e->n_seq; i++) seq_free(&e->seqs[i]);
        free(e->seqs);
    }
    spec_free(e->spec);
    dfl_context_free(e->dctx);
    dfl_context_free(e->tctx);
    dfl_batch_free(e->batch);
    free(e->act);
    free(e->step_tok);
    free(e->step_n);
    free(e->step_nd);
    if (e->own_models) {
        dfl_model_free(e->drafter);
        dfl_model_free(e->target);
    }
    if (e->own_vocab) dfl_vocab_free(e->vocab);
    free(e);
}

dfl_engine *dfl_engine_new(const char *target_path, const char *drafter_path, const dfl_engine_params *params,
                           dfl_error *err) {
    error_clear(err);
    if (target_path == NULL) {
        error_set(err, DFL_ERR_INVALID, "engine: no target model path");
        return NULL;
    }
    dfl_model *t = dfl_model_load(target_path, NULL, err);
    if (t == NULL) return NULL;
    dfl_model *d = NULL;
    if (drafter_path != NULL) {
        d = dfl_model_load(drafter_path, NULL, err);
        if (d == NULL) {
            dfl_model_free(t);
            return NULL;
        }
    }
    dfl_vocab *v = dfl_model_vocab_new(t, err);
    if (v == NULL) {
        dfl_model_free(d);
        dfl_model_free(t);
        return NULL;
    }
    dfl_engine *e = dfl_engine_new_from_models(t, d, v, params, err);
    if (e == NULL) {
        dfl_vocab_free(v);
        dfl_model_free(d);
        dfl_model_free(t);
        return NULL;
    }
    e->own_models = true;
    e->own_vocab = true;
    return e;
}

/* The pair's checks that the contexts would otherwise report less plainly. */
static dfl_status check_pair(const dfl_model *target, const dfl_model *drafter, const dfl_vocab *vocab,
                             dfl_error *err) {
    const dfl_hparams *th = dfl_model_hparams(target);
    if (th->arch == DFL_ARCH_DFLASH) {
        return error_set(err, DFL_ERR_MISMATCH, "engine: the target model is a DFlash drafter (arch dflash); pass it as "
                         "the drafter");
    }
    if (vocab != NULL && dfl_vocab_n_tokens(vocab) > th->n_vocab) {
        return error_set(err, DFL_ERR_MISMATCH, "engine: the vocabulary has %lld tokens, more than the target's n_vocab %lld",
                         (long long)dfl_vocab_n_tokens(vocab), (long long)th->n_vocab);
    }
    if (drafter == NULL) return DFL_OK;
    const dfl_hparams *dh = dfl_model_hparams(drafter);
    if (dh->arch != DFL_ARCH_DFLASH) {
        return error_set(err, DFL_ERR_MISMATCH, "engine: the drafter model has arch %s (expected dflash)",
                         dfl_arch_name(dh->arch));
    }
    if (dh->n_vocab != th->n_vocab) {
        return error_set(err, DFL_ERR_MISMATCH, "engine: the drafter's n_vocab %lld differs from the target's %lld",
                         (long long)dh->n_vocab, (long long)th->n_vocab);
    }
    if (dh->n_embd != th->n_embd) {
        return error_set(err, DFL_ERR_MISMATCH, "engine: the drafter's n_embd %lld differs from the target's %lld",
                         (long long)dh->n_embd, (long long)th->n_embd);
    }
    for (int64_t i = 0; i < dh->n_target_layers; i++) {
        if (dh->target_layers[i] < 0 || dh->target_layers[i] > th->n_layer) {
            return error_set(err, DFL_ERR_MISMATCH, "engine: the drafter reads target layer %d, outside 0..%lld (the "
                             "target's n_layer)", dh->target_layers[i], (long long)th->n_layer);
        }
    }
    return DFL_OK;
}

dfl_engine *dfl_engine_new_from_models(dfl_model *target, dfl_model *drafter, const dfl_vocab *vocab,
                                       const dfl_engine_params *params, dfl_error *err) {
    error_clear(err);
    if (target == NULL) {
        error_set(err, DFL_ERR_INVALID, "engine: no target model");
        return NULL;
    }
    const dfl_engine_params p = params != NULL ? *params : dfl_engine_default_params();
    if (p.n_seq < 1 || p.n_seq > 256) {
        error_set(err, DFL_ERR_INVALID, "engine: n_seq %d is outside 1..256", p.n_seq);
        return NULL;
    }
    if (p.n_batch < 1 || p.n_batch > (1 << 20)) {
        error_set(err, DFL_ERR_INVALID, "engine: n_batch %lld is outside 1..%d", (long long)p.n_batch, 1 << 20);
        return NULL;
    }
    if (check_pair(target, drafter, vocab, err) != DFL_OK) return NULL;
    int32_t n_draft = 0;
    if (drafter != NULL) {
        const dfl_hparams *dh = dfl_model_hparams(drafter);
        /* n_draft_max: block_size - 1, or block_size for an anchor-first DSpark drafter */
        n_draft = p.n_draft > 0 ? p.n_draft : (int32_t)dh->n_draft_max;
        if (n_draft > DFL_MAX_DRAFT - 1 && p.n_draft <= 0) n_draft = DFL_MAX_DRAFT - 1;
        if (p.n_draft < 0 || n_draft < 1 || n_draft > dh->n_draft_max || n_draft > DFL_MAX_DRAFT - 1) {
            error_set(err, DFL_ERR_INVALID, "engine: draft length %d is outside 1..%lld (the drafter's block_size %lld%s)",
                      p.n_draft, (long long)(dh->n_draft_max < DFL_MAX_DRAFT - 1 ? dh->n_draft_max : DFL_MAX_DRAFT - 1),
                      (long long)dh->block_size, dh->n_draft_max == dh->block_size ? "" : " - 1");
            return NULL;
        }
        if (p.n_draft_min < 0 || p.n_draft_min > n_draft) {
            error_set(err, DFL_ERR_INVALID, "engine: minimum draft length %d is outside 0..%d (the draft length)",
                      p.n_draft_min, n_draft);
            return NULL;
        }
    }
    dfl_engine *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        error_set(err, DFL_ERR_NOMEM, "engine: out of memory");
        return NULL;
    }
    e->target = target;
    e->drafter = drafter;
    e->vocab = (dfl_vocab *)vocab;
    e->params = p;
    e->n_seq = p.n_seq;
    e->n_draft = n_draft;
    /* the target context: prompt batches, and a whole verify batch (n_seq x (n_draft + 1)
     * entries, all with output) or a plain step (n_seq entries) */
    const int64_t n_step = (int64_t)p.n_seq * (n_draft + 1);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = p.n_ctx;
    cp.n_seq = p.n_seq;
    cp.n_batch = p.n_batch > n_step ? p.n_batch : n_step;
    cp.n_ubatch = cp.n_batch;
    cp.n_outputs = n_step;
    cp.n_threads = p.n_threads;
    cp.n_threads_batch = p.n_threads_batch;
    cp.kv_f32 = p.kv_f32;
    cp.no_weight_pack = p.no_weight_pack;
    cp.async = p.async;
    cp.device = p.device;
    cp.share_backend = p.share_backend != NULL ? p.share_backend->tctx : NULL;
    if (drafter != NULL) {
        const dfl_hparams *dh = dfl_model_hparams(drafter);
        cp.n_capture = (int32_t)dh->n_target_layers;
        cp.capture_layers = dh->target_layers;
        cp.no_feature_buffer = p.features == DFL_FEATURES_HOST;
        cp.feature_buffer_max = p.feature_buffer_max;
    }
    e->tctx = dfl_context_new(target, &cp, err);
    if (e->tctx == NULL) goto fail;
    e->n_ctx = dfl_n_ctx(e->tctx);
    e->n_vocab = dfl_n_vocab(e->tctx);
    e->n_batch = p.n_batch;
    if (drafter != NULL) {
        dfl_context_params dp = dfl_context_default_params();
        dp.n_ctx = 0; /* the target's positions plus room for a draft block */
        dp.n_seq = p.n_seq;
        dp.n_batch = cp.n_batch;
        dp.n_ubatch = cp.n_batch;
        dp.kv_f32 = p.kv_f32;
        dp.no_weight_pack = p.no_weight_pack;
        dp.target = e->tctx;
        int32_t *hot = NULL; /* the reduced draft vocabulary (dfl_engine_params.n_draft_vocab) */
        if (p.n_draft_vocab != 0) {
            if (p.n_draft_vocab < 1 || p.n_draft_vocab > e->n_vocab) {
                error_set(err, DFL_ERR_INVALID, "engine: draft vocabulary of %d tokens is outside 1..%lld (the vocabulary)",
                          p.n_draft_vocab, (long long)e->n_vocab);
                goto fail;
            }
            /* the given ids (or 0 .. n-1: BPE merge order, the commonest first), then the end
             * tokens not among them, so that a draft can end where the target ends */
            hot = malloc((size_t)(p.n_draft_vocab + e->n_vocab) * sizeof(int32_t));
            bool *seen = calloc((size_t)e->n_vocab, sizeof(bool));
            if (hot == NULL || seen == NULL) {
                free(hot);
                free(seen);
                error_set(err, DFL_ERR_NOMEM, "engine: out of memory");
                goto fail;
            }
            int32_t n_hot = 0;
            for (int32_t i = 0; i < p.n_draft_vocab; i++) {
                const int32_t id = p.draft_vocab != NULL ? p.draft_vocab[i] : i;
                hot[n_hot++] = id; /* duplicates and ids outside the vocabulary: the context says which */
                if (id >= 0 && id < e->n_vocab) seen[id] = true;
            }
            for (int32_t id = 0; vocab != NULL && id < (int32_t)e->n_vocab; id++) {
                if (!seen[id] && dfl_vocab_is_eog(vocab, id)) hot[n_hot++] = id;
            }
            free(seen);
            dp.n_draft_vocab = n_hot;
            dp.draft_vocab = hot;
        }
        e->dctx = dfl_context_new(drafter, &dp, err);
        free(hot);
        e->params.draft_vocab = NULL; /* the caller's: not kept */
        if (e->dctx == NULL) goto fail;
        spec_params sp = spec_default_params();
        sp.n_draft = n_draft;
        sp.n_draft_min = p.n_draft_min;
        sp.draft_p_min = p.draft_p_min;
        sp.features = p.features;
        sp.wait = p.wait;
        sp.draft_hook = p.draft_hook;
        sp.draft_hook_user = p.draft_hook_user;
        e->spec = spec_new(e->tctx, e->dctx, &sp, err);
        if (e->spec == NULL) goto fail;
    } else {
        e->batch = dfl_batch_init(cp.n_batch, 0, 1, err);
        if (e->batch == NULL) goto fail;
    }
    e->seqs = calloc((size_t)p.n_seq, sizeof(eng_seq));
    e->act = calloc((size_t)p.n_seq, sizeof(int32_t));
    e->step_tok = calloc((size_t)n_step, sizeof(int32_t));
    e->step_n = calloc((size_t)p.n_seq, sizeof(int32_t));
    e->step_nd = calloc((size_t)p.n_seq, sizeof(int32_t));
    if (e->seqs == NULL || e->act == NULL || e->step_tok == NULL || e->step_n == NULL || e->step_nd == NULL) {
        error_set(err, DFL_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < p.n_seq; i++) {
        eng_seq *q = &e->seqs[i];
        q->pending = -1;
        q->hist = malloc((size_t)e->n_ctx * sizeof(int32_t));
        q->cap_out = 64;
        q->out_tok = malloc((size_t)q->cap_out * sizeof(int32_t));
        if (q->hist == NULL || q->out_tok == NULL || !text_buf_append(&q->text, "", 0)) {
            error_set(err, DFL_ERR_NOMEM, "engine: out of memory for %d sequences of %lld positions", p.n_seq,
                      (long long)e->n_ctx);
            goto fail;
        }
    }
    return e;
fail:
    dfl_engine_free(e);
    return NULL;
}

const dfl_vocab *dfl_engine_vocab(const dfl_engine *e) { return e->vocab; }
const dfl_model *dfl_engine_target(const dfl_engine *e) { return e->target; }
const dfl_model *dfl_engine_drafter(const dfl_engine *e) { return e->drafter; }
int32_t dfl_engine_n_seq(const dfl_engine *e) { return e->n_seq; }
int64_t dfl_engine_n_ctx(const dfl_engine *e) { return e->n_ctx; }
int32_t dfl_engine_n_draft(const dfl_engine *e) { return e->n_draft; }
const char *dfl_engine_feature_path(const dfl_engine *e) { return e->spec ? spec_feature_path_name(e->spec) : "none"; }
const char *dfl_engine_feature_note(const dfl_engine *e) {
    return e->spec ? spec_feature_note(e->spec) : "plain decoding (no drafter)";
}

/* Positions a step of one sequence needs after its cached tokens. */
static int64_t step_room(const dfl_engine *e) { return e->spec ? spec_step_room(e->spec) : 1; }

static dfl_status check_seq(const dfl_engine *e, int32_t seq, const char *what, dfl_error *err) {
    if (seq < 0 || seq >= e->n_seq) {
        return error_set(err, DFL_ERR_INVALID, "%s: sequence %d is outside 0..%d (the engine was sized for n_seq %d)", what,
                         seq, e->n_seq - 1, e->n_seq);
    }
    return DFL_OK;
}

static const char *finish_name(dfl_finish_reason r) {
    switch (r) {
    case DFL_FINISH_STOP: return "finished (stop)";
    case DFL_FINISH_LENGTH: return "finished (max_tokens)";
    case DFL_FINISH_CTX: return "finished (context full)";
    case DFL_FINISH_CANCELLED: return "cancelled";
    default: return "finished";
    }
}

/* Starts a fresh output after a read. */
static void out_begin(eng_seq *q) {
    if (q->drained) {
        q->n_out = 0;
        q->text.n = 0;
        q->text.p[0] = '\0';
        q->drained = false;
    }
}

/* Grows the output arrays to hold n tokens. */
static bool out_reserve(eng_seq *q, int64_t n) {
    if (n <= q->cap_out && (!q->want_lp || q->out_lp != NULL)) return true;
    int64_t cap = q->cap_out;
    while (cap < n) cap *= 2;
    int32_t *t = realloc(q->out_tok, (size_t)cap * sizeof(int32_t));
    if (t == NULL) return false;
    q->out_tok = t;
    q->cap_out = cap;
    if (q->want_lp) {
        const size_t nt = (size_t)(q->n_top > 0 ? q->n_top : 1);
        float *lp = realloc(q->out_lp, (size_t)cap * sizeof(float));
        if (lp != NULL) q->out_lp = lp;
        int32_t *ti = realloc(q->out_top_id, (size_t)cap * nt * sizeof(int32_t));
        if (ti != NULL) q->out_top_id = ti;
        float *tl = realloc(q->out_top_lp, (size_t)cap * nt * sizeof(float));
        if (tl != NULL) q->out_top_lp = tl;
        if (lp == NULL || ti == NULL || tl == NULL) return false;
    }
    return true;
}

/* Log-softmax of logits [n_vocab] at tok, and the n_top most likely tokens (most likely first,
 * lowest id on ties). */
static void logprobs_of(const float *l, int64_t n_vocab, int32_t tok, int32_t n_top, float *lp, int32_t *top_id,
                        float *top_lp) {
    float mx = l[0];
    for (int64_t v = 1; v < n_vocab; v++) mx = l[v] > mx ? l[v] : mx;
    double sum = 0.0;
    for (int64_t v = 0; v < n_vocab; v++) sum += exp((double)l[v] - (double)mx);
    const double lse = (double)mx + log(sum);
    *lp = (float)((double)l[tok] - lse);
    /* one pass keeping the n_top best sorted (insertion; ties keep the lower id first) */
    int32_t n = 0;
    for (int64_t v = 0; v < n_vocab && n_top > 0; v++) {
        if (n == n_top && !(l[v] > l[top_id[n - 1]])) continue;
        int32_t k = n < n_top ? n++ : n_top - 1;
        while (k > 0 && l[v] > l[top_id[k - 1]]) {
            top_id[k] = top_id[k - 1];
            k--;
        }
        top_id[k] = (int32_t)v;
    }
    for (int32_t k = 0; k < n; k++) top_lp[k] = (float)((double)l[top_id[k]] - lse);
}

static dfl_status out_token(dfl_engine *e, eng_seq *q, int32_t tok, const float *logits, dfl_error *err) {
    if (!out_reserve(q, q->n_out + 1)) return error_set(err, DFL_ERR_NOMEM, "engine: out of memory for the output");
    if (q->want_lp) {
        if (logits == NULL) return error_set(err, DFL_ERR_INTERNAL, "engine: no logits for the logprobs of token %d", tok);
        logprobs_of(logits, e->n_vocab, tok, q->n_top, &q->out_lp[q->n_out], q->out_top_id + (size_t)q->n_out * (size_t)q->n_top,
                    q->out_top_lp + (size_t)q->n_out * (size_t)q->n_top);
    }
    q->out_tok[q->n_out++] = tok;
    return DFL_OK;
}

static bool is_stop_token(const dfl_engine *e, const eng_seq *q, int32_t tok) {
    if (!q->ignore_eos && e->vocab != NULL && dfl_vocab_is_eog(e->vocab, tok)) return true;
    for (int32_t i = 0; i < q->n_stop_tok; i++) {
        if (q->stop_tok[i] == tok) return true;
    }
    return false;
}

static void seq_finish(eng_seq *q, dfl_finish_reason why) {
    q->state = DFL_SEQ_FINISHED;
    q->finish = why;
}

/* Ends the text stream without a stop string: what the detokenizer and the stop strings hold
 * is shown. */
static dfl_status text_end(eng_seq *q, dfl_error *err) {
    if (q->detok != NULL) {
        const char *t;
        size_t len;
        dfl_detok_flush(q->detok, &t, &len);
        if (len > 0 && stop_text_push(&q->stop, t, len, &q->text) < 0) goto nomem;
    }
    if (!stop_text_flush(&q->stop, &q->text)) goto nomem;
    return DFL_OK;
nomem:
    return error_set(err, DFL_ERR_NOMEM, "engine: out of memory for the text");
}

/* Commits the generated tokens toks[0..n) of q in order, until one ends the generation; rows[j]
 * (rows may be NULL without logprobs): the target's logits token j was drawn from. */
static dfl_status commit_tokens(dfl_engine *e, eng_seq *q, const int32_t *toks, int32_t n, const float *const *rows,
                                dfl_error *err) {
    out_begin(q);
    for (int32_t j = 0; j < n && q->state == DFL_SEQ_ACTIVE; j++) {
        const int32_t tok = toks[j];
        q->stats.n_generated++;
        e->stats.n_generated++;
        if (is_stop_token(e, q, tok)) {
            seq_finish(q, DFL_FINISH_STOP);
            break;
        }
        dfl_status st = out_token(e, q, tok, rows != NULL ? rows[j] : NULL, err);
        if (st != DFL_OK) return st;
        if (q->detok != NULL) {
            const char *t;
            size_t len;
            if (dfl_detok_push(q->detok, tok, &t, &len) == DFL_OK && len > 0) {
                const int r = stop_text_push(&q->stop, t, len, &q->text);
                if (r < 0) return error_set(err, DFL_ERR_NOMEM, "engine: out of memory for the text");
                if (r == 1) {
                    seq_finish(q, DFL_FINISH_STOP);
                    return DFL_OK; /* the stop string and what follows are never shown */
                }
            }
        }
        if (q->max_tokens > 0 && q->stats.n_generated >= q->max_tokens) seq_finish(q, DFL_FINISH_LENGTH);
    }
    if (q->state == DFL_SEQ_FINISHED) return text_end(q, err);
    return DFL_OK;
}

/* Validates a sequence's parameters. */
static dfl_status check_seq_params(const dfl_engine *e, const dfl_seq_params *p, dfl_error *err) {
    if (p->n_draft < 0 || p->n_draft > e->n_draft) {
        if (e->spec == NULL && p->n_draft > 0) {
            return error_set(err, DFL_ERR_INVALID, "seq_start: draft length %d asked of an engine without a drafter",
                             p->n_draft);
        }
        return error_set(err, DFL_ERR_INVALID, "seq_start: draft length %d is outside 0..%d (the engine's draft length)",
                         p->n_draft, e->n_draft);
    }
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > 20) {
        return error_set(err, DFL_ERR_INVALID, "seq_start: n_top_logprobs %d is outside 0..20", p->n_top_logprobs);
    }
    if (p->prefill_chunk < 0) {
        return error_set(err, DFL_ERR_INVALID, "seq_start: prefill_chunk %lld is negative (0: the whole prompt)",
                         (long long)p->prefill_chunk);
    }
    if (p->n_stop_tokens < 0 || p->n_stop_tokens > 1024 || (p->n_stop_tokens > 0 && p->stop_tokens == NULL)) {
        return error_set(err, DFL_ERR_INVALID, "seq_start: %d stop tokens (expected 0..1024 with an array)",
                         p->n_stop_tokens);
    }
    for (int32_t i = 0; i < p->n_stop_tokens; i++) {
        if (p->stop_tokens[i] < 0 || p->stop_tokens[i] >= e->n_vocab) {
            return error_set(err, DFL_ERR_INVALID, "seq_start: stop token %d is outside 0..%lld (the vocabulary)",
                             p->stop_tokens[i], (long long)(e->n_vocab - 1));
        }
    }
    if (p->n_stop < 0 || p->n_stop > STOP_TEXT_MAX_STRINGS || (p->n_stop > 0 && p->stop == NULL)) {
        return error_set(err, DFL_ERR_INVALID, "seq_start: %d stop strings (expected 0..%d)", p->n_stop,
                         STOP_TEXT_MAX_STRINGS);
    }
    if (p->n_stop > 0 && e->vocab == NULL) {
        return error_set(err, DFL_ERR_INVALID, "seq_start: stop strings need a vocabulary (the engine has none)");
    }
    for (int32_t i = 0; i < p->n_stop; i++) {
        const size_t len = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (len == 0 || len > STOP_TEXT_MAX_LEN) {
            return error_set(err, DFL_ERR_INVALID, "seq_start: stop string %d has %zu bytes (expected 1..%d)", i, len,
                             STOP_TEXT_MAX_LEN);
        }
    }
    return DFL_OK;
}

/* Plain path: decodes prompt[from, to) of seq; with the last prompt token, samples the first
 * token into *first (else -1). */
static dfl_status plain_prefill(dfl_engine *e, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t from,
                                int64_t to, dfl_sampler *smp, int32_t *first, dfl_error *err) {
    const int64_t chunk = e->batch->n_tokens_max < e->n_batch ? e->batch->n_tokens_max : e->n_batch;
    for (int64_t off = from; off < to; off += chunk) {
        const int64_t m = to - off < chunk ? to - off : chunk;
        dfl_batch_clear(e->batch);
        for (int64_t k = 0; k < m; k++) {
            const int32_t pos = (int32_t)(off + k);
            dfl_batch_add_token(e->batch, prompt[off + k], &pos, seq, off + k == n_prompt - 1);
        }
        dfl_status st = dfl_decode(e->tctx, e->batch, err);
        if (st != DFL_OK) return st;
    }
    *first = -1;
    if (to < n_prompt) return DFL_OK;
    for (int64_t i = 0; i < n_prompt; i++) dfl_sampler_accept(smp, prompt[i]);
    const int32_t tok = dfl_sampler_sample(smp, dfl_get_logits(e->tctx, e->batch->n_tokens - 1));
    if (tok < 0) return error_set(err, DFL_ERR_INVALID, "prefill: the target's logits are not finite");
    dfl_sampler_accept(smp, tok);
    *first = tok;
    return DFL_OK;
}

/* Drops positions >= p0 of seq from both caches. */
static void seq_trim(dfl_engine *e, int32_t seq, int64_t p0);

/* Prefills the next chunk of a prefilling sequence (all of the rest without a chunk size); the
 * last chunk makes the sequence active. Plain: it samples the first token. Speculative: the last
 * prompt token is left undecoded as the anchor of the first step, which drafts from it, so the
 * first tokens can already be accepted drafts (llama.cpp's order; docs/engine.md). */
static dfl_status prefill_next(dfl_engine *e, int32_t seq, dfl_error *err) {
    eng_seq *q = &e->seqs[seq];
    const int64_t from = q->n_hist;
    const int64_t to = q->prefill_chunk > 0 && q->n_prompt - from > q->prefill_chunk ? from + q->prefill_chunk : q->n_prompt;
    const double t0 = now_ms();
    int32_t first = -1;
    dfl_status st;
    if (e->spec != NULL) st = spec_prefill_anchor(e->spec, seq, q->hist, q->n_prompt, from, to, err);
    else st = plain_prefill(e, seq, q->hist, q->n_prompt, from, to, q->smp, &first, err);
    if (st != DFL_OK) {
        seq_trim(e, seq, 0);
        q->state = DFL_SEQ_IDLE;
        q->finish = DFL_FINISH_NONE;
        return st;
    }
    const double dt = now_ms() - t0;
    q->n_hist = to;
    q->stats.t_prefill_ms += dt;
    e->stats.t_prefill_ms += dt;
    e->stats.n_prompt_tokens += to - from;
    if (to < q->n_prompt) return DFL_OK;
    q->state = DFL_SEQ_ACTIVE;
    if (e->spec != NULL) {
        q->n_hist = q->n_prompt - 1; /* the anchor is pending, not cached */
        q->pending = q->hist[q->n_prompt - 1];
        return DFL_OK;
    }
    q->pending = first;
    const float *row = context_last_logits(e->tctx);
    return commit_tokens(e, q, &first, 1, &row, err);
}

/* Drops positions >= p0 of seq from both caches. */
static void seq_trim(dfl_engine *e, int32_t seq, int64_t p0) {
    dfl_seq_remove(e->tctx, seq, p0, NULL);
    if (e->dctx != NULL) dfl_seq_remove(e->dctx, seq, p0, NULL);
    e->seqs[seq].n_hist = p0 > 0 ? p0 : 0;
}

dfl_status dfl_engine_seq_start(dfl_engine *e, int32_t seq, const int32_t *prompt, int64_t n_prompt,
                                const dfl_seq_params *params, dfl_error *err) {
    error_clear(err);
    if (e == NULL) return error_set(err, DFL_ERR_INVALID, "seq_start: NULL engine");
    dfl_status st = check_seq(e, seq, "seq_start", err);
    if (st != DFL_OK) return st;
    eng_seq *q = &e->seqs[seq];
    if (q->state == DFL_SEQ_ACTIVE || q->state == DFL_SEQ_PREFILL) {
        return error_set(err, DFL_ERR_INVALID, "seq_start: sequence %d is %s (cancel or reset it first)", seq,
                         q->state == DFL_SEQ_ACTIVE ? "active" : "prefilling");
    }
    if (prompt == NULL || n_prompt < 1) return error_set(err, DFL_ERR_INVALID, "seq_start: the prompt is empty");
    const int64_t room = e->n_ctx - step_room(e);
    if (n_prompt > room) {
        return error_set(err, DFL_ERR_CTX_FULL, "seq_start: a prompt of %lld tokens does not fit: at most %lld (the context "
                         "of %lld positions less %lld for a step)", (long long)n_prompt, (long long)room,
                         (long long)e->n_ctx, (long long)step_room(e));
    }
    for (int64_t i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= e->n_vocab) {
            return error_set(err, DFL_ERR_INVALID, "seq_start: prompt token %lld = %d is outside 0..%lld (the vocabulary)",
                             (long long)i, prompt[i], (long long)(e->n_vocab - 1));
        }
    }
    const dfl_seq_params p = params != NULL ? *params : dfl_seq_default_params();
    st = check_seq_params(e, &p, err);
    if (st != DFL_OK) return st;
    /* everything this run needs, before the sequence changes */
    dfl_sampler *smp = dfl_sampler_new(&p.sampler, e->n_vocab, err);
    if (smp == NULL) return err != NULL ? err->code : DFL_ERR_INVALID;
    dfl_detok *dt = NULL;
    int32_t *stop_tok = NULL;
    if (e->vocab != NULL) {
        dt = dfl_detok_new(e->vocab, p.special, err);
        if (dt == NULL) goto nomem;
    }
    if (p.n_stop_tokens > 0) {
        stop_tok = malloc((size_t)p.n_stop_tokens * sizeof(int32_t));
        if (stop_tok == NULL) goto nomem;
        memcpy(stop_tok, p.stop_tokens, (size_t)p.n_stop_tokens * sizeof(int32_t));
    }
    if (!stop_text_set(&q->stop, p.stop, p.n_stop)) goto nomem;
    dfl_sampler_free(q->smp);
    dfl_detok_free(q->detok);
    free(q->stop_tok);
    q->smp = smp;
    q->detok = dt;
    q->stop_tok = stop_tok;
    q->n_stop_tok = p.n_stop_tokens;
    q->ignore_eos = p.ignore_eos;
    q->max_tokens = p.max_tokens;
    q->want_lp = p.logprobs;
    q->n_top = p.logprobs ? p.n_top_logprobs : 0;
    free(q->out_lp); /* sized again for this run's n_top */
    free(q->out_top_id);
    free(q->out_top_lp);
    q->out_lp = NULL;
    q->out_top_id = NULL;
    q->out_top_lp = NULL;
    if (!out_reserve(q, q->cap_out)) goto nomem_after;
    /* prefix reuse: keep the longest common prefix (all but the last prompt token at most) */
    int64_t keep = 0;
    while (keep < q->n_hist && keep < n_prompt - 1 && q->hist[keep] == prompt[keep]) keep++;
    seq_trim(e, seq, keep);
    memset(&q->stats, 0, sizeof(q->stats));
    q->stats.n_prompt = n_prompt;
    q->stats.n_reused = keep;
    q->n_out = 0;
    q->text.n = 0;
    q->text.p[0] = '\0';
    q->drained = false;
    q->pending = -1;
    if (e->spec != NULL) {
        spec_seq_set_sampler(e->spec, seq, smp);
        spec_seq_set_max_draft(e->spec, seq, p.n_draft);
        spec_seq_set_need_logits(e->spec, seq, p.logprobs);
    }
    memcpy(q->hist + keep, prompt + keep, (size_t)(n_prompt - keep) * sizeof(int32_t));
    q->n_prompt = n_prompt;
    q->prefill_chunk = p.prefill_chunk;
    q->state = DFL_SEQ_PREFILL;
    q->finish = DFL_FINISH_NONE;
    return prefill_next(e, seq, err);
nomem:
    dfl_sampler_free(smp);
    dfl_detok_free(dt);
    free(stop_tok);
    return error_set(err, DFL_ERR_NOMEM, "seq_start: out of memory");
nomem_after:
    q->state = DFL_SEQ_IDLE;
    return error_set(err, DFL_ERR_NOMEM, "seq_start: out of memory for the logprobs");
}

int32_t dfl_engine_n_active(const dfl_engine *e) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_seq; i++) n += e->seqs[i].state == DFL_SEQ_ACTIVE || e->seqs[i].state == DFL_SEQ_PREFILL;
    return n;
}

/* Plain path: one batch of each sequence's pending token; samples the next. */
static dfl_status plain_step(dfl_engine *e, int32_t n, dfl_error *err) {
    dfl_batch_clear(e->batch);
    for (int32_t i = 0; i < n; i++) {
        const eng_seq *q = &e->seqs[e->act[i]];
        const int32_t pos = (int32_t)q->n_hist;
        dfl_batch_add_token(e->batch, q->pending, &pos, e->act[i], true);
    }
    /* greedy sequences without penalties need only the argmax: ids come back, not logits */
    bool ids_only = true;
    for (int32_t i = 0; i < n; i++) {
        ids_only = ids_only && sampler_is_plain_greedy(e->seqs[e->act[i]].smp) && !e->seqs[e->act[i]].want_lp;
    }
    context_set_argmax_only(e->tctx, ids_only);
    dfl_status st = dfl_decode(e->tctx, e->batch, err);
    context_set_argmax_only(e->tctx, false);
    if (st != DFL_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        eng_seq *q = &e->seqs[e->act[i]];
        const int32_t tok = ids_only ? context_get_argmax(e->tctx, i) : dfl_sampler_sample(q->smp, dfl_get_logits(e->tctx, i));
        if (tok < 0) return error_set(err, DFL_ERR_INVALID, "step: the target's logits are not finite (sequence %d)", e->act[i]);
        dfl_sampler_accept(q->smp, tok);
        e->step_tok[(size_t)i * (size_t)(e->n_draft + 1)] = tok;
        e->step_n[i] = 1;
        e->step_nd[i] = 0;
    }
    return DFL_OK;
}

dfl_status dfl_engine_step(dfl_engine *e, const int32_t *seqs, int32_t n, dfl_error *err) {
    error_clear(err);
    if (e == NULL) return error_set(err, DFL_ERR_INVALID, "step: NULL engine");
    /* the sequences of this step, all checked before anything changes */
    int32_t n_act = 0;
    if (seqs == NULL) {
        for (int32_t i = 0; i < e->n_seq; i++) {
            if (e->seqs[i].state == DFL_SEQ_ACTIVE || e->seqs[i].state == DFL_SEQ_PREFILL) e->act[n_act++] = i;
        }
    } else {
        if (n < 0 || n > e->n_seq) {
            return error_set(err, DFL_ERR_INVALID, "step: %d sequences listed, outside 0..%d (the engine's n_seq)", n,
                             e->n_seq);
        }
        for (int32_t i = 0; i < n; i++) {
            dfl_status st = check_seq(e, seqs[i], "step", err);
            if (st != DFL_OK) return st;
            const eng_seq *q = &e->seqs[seqs[i]];
            if (q->state != DFL_SEQ_ACTIVE && q->state != DFL_SEQ_PREFILL) {
                return error_set(err, DFL_ERR_INVALID, "step: sequence %d is %s", seqs[i],
                                 q->state == DFL_SEQ_IDLE ? "idle (not started)" : finish_name(q->finish));
            }
            for (int32_t j = 0; j < i; j++) {
                if (seqs[j] == seqs[i]) return error_set(err, DFL_ERR_INVALID, "step: sequence %d is listed twice", seqs[i]);
            }
        }
        memcpy(e->act, seqs, (size_t)n * sizeof(int32_t));
        n_act = n;
    }
    /* prefilling sequences get their next chunk (they step from the next call on); sequences
     * without room for a step finish here */
    int32_t m = 0;
    for (int32_t i = 0; i < n_act; i++) {
        eng_seq *q = &e->seqs[e->act[i]];
        if (q->state == DFL_SEQ_PREFILL) {
            dfl_status st = prefill_next(e, e->act[i], err);
            if (st != DFL_OK) return st;
        } else if (q->n_hist + step_room(e) > e->n_ctx) {
            out_begin(q);
            seq_finish(q, DFL_FINISH_CTX);
            dfl_status st = text_end(q, err);
            if (st != DFL_OK) return st;
        } else {
            e->act[m++] = e->act[i];
        }
    }
    if (m == 0) return DFL_OK;
    const double t0 = now_ms();
    dfl_status st;
    if (e->spec != NULL) {
        st = spec_step_ex(e->spec, m, e->act, e->step_tok, e->step_n, e->step_nd, err);
    } else {
        st = plain_step(e, m, err);
    }
    if (st != DFL_OK) return st;
    e->stats.n_steps++;
    for (int32_t i = 0; i < m; i++) {
        const int32_t seq = e->act[i];
        eng_seq *q = &e->seqs[seq];
        const int32_t *toks = e->step_tok + (size_t)i * (size_t)(e->n_draft + 1);
        const int32_t nt = e->step_n[i], nd = e->step_nd[i];
        /* the caches now hold the pending token and all committed tokens but the last */
        q->hist[q->n_hist++] = q->pending;
        for (int32_t j = 0; j + 1 < nt; j++) q->hist[q->n_hist++] = toks[j];
        q->pending = toks[nt - 1];
        q->stats.n_steps++;
        if (nd > 0) {
            const int32_t a = nt - 1;
            q->stats.n_drafts++;
            q->stats.n_draft_tokens += nd;
            q->stats.n_accepted += a;
            e->stats.n_drafts++;
            e->stats.n_draft_tokens += nd;
            e->stats.n_accepted += a;
            for (int32_t j = 0; j < a; j++) {
                q->stats.accepted_per_pos[j]++;
                e->stats.accepted_per_pos[j]++;
            }
        }
        if (e->spec != NULL) e->stats.accept_hist[nt - 1]++;
        const float *rows[DFL_MAX_DRAFT];
        if (q->want_lp) {
            for (int32_t j = 0; j < nt; j++) rows[j] = e->spec ? spec_step_logits(e->spec, i, j) : dfl_get_logits(e->tctx, i);
        }
        st = commit_tokens(e, q, toks, nt, q->want_lp ? rows : NULL, err);
        if (st != DFL_OK) return st;
    }
    e->stats.t_step_ms += now_ms() - t0;
    return DFL_OK;
}

dfl_status dfl_engine_seq_cancel(dfl_engine *e, int32_t seq, dfl_error *err) {
    error_clear(err);
    dfl_status st = check_seq(e, seq, "seq_cancel", err);
    if (st != DFL_OK) return st;
    eng_seq *q = &e->seqs[seq];
    if (q->state != DFL_SEQ_ACTIVE && q->state != DFL_SEQ_PREFILL) return DFL_OK;
    out_begin(q);
    seq_finish(q, DFL_FINISH_CANCELLED);
    stop_text_set(&q->stop, NULL, 0); /* drops the held text */
    return DFL_OK;
}

dfl_status dfl_engine_seq_reset(dfl_engine *e, int32_t seq, dfl_error *err) {
    error_clear(err);
    dfl_status st = check_seq(e, seq, "seq_reset", err);
    if (st != DFL_OK) return st;
    eng_seq *q = &e->seqs[seq];
    if (e->spec != NULL) {
        spec_seq_reset(e->spec, seq);
        spec_seq_set_sampler(e->spec, seq, NULL);
    }
    seq_trim(e, seq, 0);
    dfl_sampler_free(q->smp);
    q->smp = NULL;
    q->state = DFL_SEQ_IDLE;
    q->finish = DFL_FINISH_NONE;
    q->pending = -1;
    q->n_out = 0;
    q->text.n = 0;
    q->text.p[0] = '\0';
    q->drained = false;
    stop_text_set(&q->stop, NULL, 0);
    memset(&q->stats, 0, sizeof(q->stats));
    return DFL_OK;
}

dfl_status dfl_engine_seq_read(dfl_engine *e, int32_t seq, dfl_seq_output *out, dfl_error *err) {
    error_clear(err);
    dfl_status st = check_seq(e, seq, "seq_read", err);
    if (st != DFL_OK) return st;
    eng_seq *q = &e->seqs[seq];
    out_begin(q); /* a second read without news gives nothing new */
    out->state = q->state;
    out->finish = q->finish;
    out->tokens = q->out_tok;
    out->n_tokens = q->n_out;
    out->text = q->text.p;
    out->text_len = q->text.n;
    out->logprobs = q->want_lp ? q->out_lp : NULL;
    out->top_ids = q->want_lp ? q->out_top_id : NULL;
    out->top_logprobs = q->want_lp ? q->out_top_lp : NULL;
    out->n_top = q->want_lp ? q->n_top : 0;
    q->drained = true;
    return DFL_OK;
}

dfl_seq_state dfl_engine_seq_state(const dfl_engine *e, int32_t seq) {
    if (e == NULL || seq < 0 || seq >= e->n_seq) return DFL_SEQ_IDLE;
    return e->seqs[seq].state;
}

dfl_status dfl_engine_seq_stats(const dfl_engine *e, int32_t seq, dfl_seq_stats *out, dfl_error *err) {
    error_clear(err);
    dfl_status st = check_seq(e, seq, "seq_stats", err);
    if (st != DFL_OK) return st;
    *out = e->seqs[seq].stats;
    return DFL_OK;
}

dfl_engine_stats dfl_engine_get_stats(const dfl_engine *e) {
    dfl_engine_stats s = e->stats;
    if (e->spec != NULL) {
        const spec_stats ss = spec_get_stats(e->spec);
        s.t_draft_ms = ss.t_draft_ms;
        s.t_verify_ms = ss.t_verify_ms;
        s.t_inject_ms = ss.t_inject_ms;
        s.t_other_ms = ss.t_other_ms;
        s.feature_host_bytes = ss.feature_host_bytes;
        s.n_draft_nonfinite = ss.n_draft_nonfinite;
    }
    return s;
}
