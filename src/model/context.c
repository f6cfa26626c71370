/* context.c: dfl_context: creation (everything allocated for the worst case), dfl_decode
 * (validate the whole batch, then run it micro-batch by micro-batch), outputs and the KV
 * sequence operations. */
#include "model/context.h"
#include "model/weights_device.h"
#include "model/weights_pack.h"
#include "base/error.h"
#ifdef DFL_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dfl_context_params dfl_context_default_params(void) {
    dfl_context_params p;
    memset(&p, 0, sizeof(p));
    p.n_ctx = 0;
    p.n_seq = 1;
    p.n_batch = 512;
    p.n_ubatch = 512;
    p.n_outputs = 0;
    return p;
}

tensor ctx_tensor_from_gguf(const gguf_tensor *t) {
    tensor r = tensor_4d(t->type, (void *)t->data, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    return r;
}

dfl_status ctx_weights_bind(ctx_weights *w, const dfl_model *m, dfl_error *err) {
    memset(w, 0, sizeof(*w));
    w->layers = calloc((size_t)m->hp.n_layer, sizeof(ctx_layer_w));
    if (w->layers == NULL) return error_set(err, DFL_ERR_NOMEM, "out of memory binding weights");
    if (m->token_embd) { w->token_embd = ctx_tensor_from_gguf(m->token_embd); w->has_token_embd = true; }
    if (m->output) { w->output = ctx_tensor_from_gguf(m->output); w->has_output = true; }
    w->output_norm = ctx_tensor_from_gguf(m->output_norm);
    if (m->fc) w->fc = ctx_tensor_from_gguf(m->fc);
    if (m->enc_output_norm) w->enc_norm = ctx_tensor_from_gguf(m->enc_output_norm);
    if (m->dspark.markov_w1) {
        w->markov_w1 = ctx_tensor_from_gguf(m->dspark.markov_w1);
        w->markov_w2 = ctx_tensor_from_gguf(m->dspark.markov_w2);
    }
    for (int64_t il = 0; il < m->hp.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        ctx_layer_w *o = &w->layers[il];
        o->attn_norm = ctx_tensor_from_gguf(L->attn_norm);
        o->wq = ctx_tensor_from_gguf(L->wq);
        o->wk = ctx_tensor_from_gguf(L->wk);
        o->wv = ctx_tensor_from_gguf(L->wv);
        o->wo = ctx_tensor_from_gguf(L->wo);
        o->has_qk_norm = L->q_norm != NULL && L->k_norm != NULL;
        if (o->has_qk_norm) {
            o->q_norm = ctx_tensor_from_gguf(L->q_norm);
            o->k_norm = ctx_tensor_from_gguf(L->k_norm);
        }
        o->ffn_norm = ctx_tensor_from_gguf(L->ffn_norm);
        o->ffn_gate = ctx_tensor_from_gguf(L->ffn_gate);
        o->ffn_up = ctx_tensor_from_gguf(L->ffn_up);
        o->ffn_down = ctx_tensor_from_gguf(L->ffn_down);
    }
    return DFL_OK;
}

void ctx_weights_free(ctx_weights *w) {
    free(w->layers);
    w->layers = NULL;
}

/* Lays out the scratch tensors in one buffer. With buf NULL only computes the size. */
static size_t scratch_layout(dfl_context *ctx, backend_buffer *buf) {
    const dfl_hparams *hp = &ctx->model->hp;
    const int64_t n = ctx->n_ub, n_out = ctx->n_out_max < n ? ctx->n_out_max : n;
    size_t off = 0;
    ctx_scratch *s = &ctx->s;
#define PLACE(field, type, ne0, ne1)                                                    \
    do {                                                                                \
        if (buf) s->field = tensor_in_buffer(buf, off, type, (ne0), (ne1));             \
        off += (quant_row_size(type, (ne0)) * (size_t)(ne1) + 63) & ~(size_t)63;        \
    } while (0)
    PLACE(x, QUANT_TYPE_F32, hp->n_embd, n);
    PLACE(h, QUANT_TYPE_F32, hp->n_embd, n);
    PLACE(q, QUANT_TYPE_F32, hp->n_embd_head_k * hp->n_head, n);
    PLACE(k, QUANT_TYPE_F32, hp->n_embd_head_k * hp->n_head_kv, n);
    PLACE(v, QUANT_TYPE_F32, hp->n_embd_head_v * hp->n_head_kv, n);
    PLACE(att, QUANT_TYPE_F32, hp->n_embd_head_v * hp->n_head, n);
    PLACE(gate, QUANT_TYPE_F32, hp->n_ff, n);
    PLACE(up, QUANT_TYPE_F32, hp->n_ff, n);
    PLACE(x_out, QUANT_TYPE_F32, hp->n_embd, n_out);
    PLACE(logits, QUANT_TYPE_F32, ctx->n_vocab, n_out);
    PLACE(ids, QUANT_TYPE_I32, n, 1);
    PLACE(pos, QUANT_TYPE_I32, n, 1);
    PLACE(cells, QUANT_TYPE_I64, n, 1);
    PLACE(rows, QUANT_TYPE_I32, n, 1);
    PLACE(bidx, QUANT_TYPE_I64, n, 1);
    PLACE(embd_in, QUANT_TYPE_F32, hp->n_embd, n);
    if (hp->arch == DFL_ARCH_DFLASH) {
        PLACE(feat_in, QUANT_TYPE_F32, hp->n_target_layers * hp->n_embd, n);
        PLACE(erow, QUANT_TYPE_I32, n, 1);
    }
#undef PLACE
    if (buf) {
        s->q = tensor_reshape_3d(&s->q, hp->n_embd_head_k, hp->n_head, n);
        s->k = tensor_reshape_3d(&s->k, hp->n_embd_head_k, hp->n_head_kv, n);
        s->v = tensor_reshape_3d(&s->v, hp->n_embd_head_v, hp->n_head_kv, n);
        s->att = tensor_reshape_3d(&s->att, hp->n_embd_head_v, hp->n_head, n);
    }
    return off;
}

static dfl_status context_alloc_host(dfl_context *ctx, dfl_error *err) {
    const int64_t n = ctx->n_ub;
    ctx->h_ids = calloc((size_t)n, sizeof(int32_t));
    ctx->h_pos = calloc((size_t)n, sizeof(int32_t));
    ctx->h_cells = calloc((size_t)n, sizeof(int64_t));
    ctx->h_rows = calloc((size_t)n, sizeof(int32_t));
    ctx->h_bidx = calloc((size_t)n, sizeof(int64_t));
    ctx->h_perm = calloc((size_t)n, sizeof(int64_t));
    ctx->h_inv = calloc((size_t)n, sizeof(int64_t));
    ctx->h_embd = calloc((size_t)(ctx->n_embd * n), sizeof(float));
    ctx->groups = calloc((size_t)n, sizeof(ctx_group));
    ctx->seq_len_tmp = calloc((size_t)ctx->kv.n_seq, sizeof(int64_t));
    ctx->logits = calloc((size_t)ctx->n_vocab * (size_t)ctx->n_out_max, sizeof(float));
    ctx->argmax_ids = calloc((size_t)ctx->n_out_max, sizeof(int32_t));
    ctx->out_of = calloc((size_t)ctx->params.n_batch, sizeof(int64_t));
    if (!ctx->h_ids || !ctx->h_pos || !ctx->h_cells || !ctx->h_rows || !ctx->h_bidx || !ctx->h_perm || !ctx->h_inv ||
        !ctx->h_embd || !ctx->groups || !ctx->seq_len_tmp || !ctx->logits || !ctx->argmax_ids || !ctx->out_of) {
        return error_set(err, DFL_ERR_NOMEM, "out of memory creating the context");
    }
    return DFL_OK;
}

bool dfl_context_has_feature_buffer(const dfl_context *ctx) { return ctx != NULL && ctx->link != NULL && ctx->link->device; }
const char *dfl_context_feature_buffer_note(const dfl_context *ctx) {
    if (ctx == NULL || ctx->link == NULL) return "no feature capture";
    return ctx->link->device ? "feature buffer in backend memory" : ctx->link->note;
}

void context_sync_pending(dfl_context *ctx) {
    if (ctx->pending) {
        backend_queue_synchronize(ctx->queue);
        ctx->pending = false;
    }
}

#ifdef DFL_TEST_HOOKS
void context_test_set_faults(dfl_context *ctx, uint32_t faults) {
    if (ctx->link != NULL) ctx->link->test_faults = faults;
}
#endif

/* A drafter context needs a target context that fits it (docs/drafter.md). */
static dfl_status drafter_check_target(const dfl_model *d, const dfl_context_params *p, dfl_error *err) {
    const dfl_hparams *hp = &d->hp;
    if (p->target == NULL) {
        return error_set(err, DFL_ERR_INVALID, "%s: a drafter context needs its target context (params.target)", d->path);
    }
    const dfl_context *t = p->target;
    const dfl_hparams *th = &t->model->hp;
    if (th->arch == DFL_ARCH_DFLASH) return error_set(err, DFL_ERR_INVALID, "the target context is itself a drafter");
    if (th->n_embd != hp->n_embd) {
        return error_set(err, DFL_ERR_MISMATCH, "drafter n_embd %lld does not match the target's %lld",
                         (long long)hp->n_embd, (long long)th->n_embd);
    }
    if (hp->has_token_embd && hp->n_vocab != th->n_vocab) {
        return error_set(err, DFL_ERR_MISMATCH, "drafter vocabulary %lld does not match the target's %lld",
                         (long long)hp->n_vocab, (long long)th->n_vocab);
    }
    if (hp->mask_token_id < 0 || hp->mask_token_id >= th->n_vocab) {
        return error_set(err, DFL_ERR_MISSING, "drafter mask token id %lld is missing or outside the target's vocabulary "
                         "(%lld tokens)", (long long)hp->mask_token_id, (long long)th->n_vocab);
    }
    for (int64_t j = 0; j < hp->n_target_layers; j++) {
        if (hp->target_layers[j] < 1 || hp->target_layers[j] > th->n_layer) {
            return error_set(err, DFL_ERR_MISMATCH, "drafter target_layers[%lld] = %d is outside 1..%lld (the target's layers)",
                             (long long)j, hp->target_layers[j], (long long)th->n_layer);
        }
    }
    const int32_t n_cap = t->link != NULL ? t->link->n_capture : 0;
    if (n_cap != hp->n_target_layers) {
        return error_set(err, DFL_ERR_INVALID, "the target context captures %d layer inputs; the drafter needs %lld",
                         n_cap, (long long)hp->n_target_layers);
    }
    for (int64_t j = 0; j < hp->n_target_layers; j++) {
        if (t->link->capture_layers[j] != hp->target_layers[j]) {
            return error_set(err, DFL_ERR_INVALID, "the target context captures layer %d at slot %lld; the drafter needs %d",
                             t->link->capture_layers[j], (long long)j, hp->target_layers[j]);
        }
    }
    /* DSpark: the Markov head indexes and scores the target's vocabulary */
    if (d->dspark.markov_w1 != NULL && (d->dspark.markov_w1->ne[1] != th->n_vocab || d->dspark.markov_w2->ne[1] != th->n_vocab)) {
        return error_set(err, DFL_ERR_MISMATCH, "DSpark markov_w1/markov_w2 have %lld/%lld rows; the target's vocabulary "
                         "has %lld tokens", (long long)d->dspark.markov_w1->ne[1], (long long)d->dspark.markov_w2->ne[1],
                         (long long)th->n_vocab);
    }
    if (p->n_seq > t->kv.n_seq) {
        return error_set(err, DFL_ERR_INVALID, "drafter n_seq %d exceeds the target's %lld", p->n_seq, (long long)t->kv.n_seq);
    }
    return DFL_OK;
}

static dfl_context *context_create(dfl_model *model, const dfl_context_params *params, backend *be, dfl_error *err) {
    if (model == NULL) {
        error_set(err, DFL_ERR_INVALID, "dfl_context_new: model is NULL");
        return NULL;
    }
    dfl_context_params p = params ? *params : dfl_context_default_params();
    const dfl_hparams *hp = &model->hp;
    if (p.n_ctx <= 0 && p.target != NULL) p.n_ctx = p.target->kv.n_ctx + hp->block_size; /* room for the block */
    if (p.n_ctx <= 0) p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_seq <= 0) p.n_seq = 1;
    if (p.n_batch <= 0) p.n_batch = 512;
    if (p.n_ubatch <= 0 || p.n_ubatch > p.n_batch) p.n_ubatch = p.n_batch;
    if (p.n_seq > 256) {
        error_set(err, DFL_ERR_INVALID, "n_seq %d is above the limit of 256 sequences", p.n_seq);
        return NULL;
    }
    if (p.n_ctx > ((int64_t)1 << 24)) {
        error_set(err, DFL_ERR_INVALID, "n_ctx %lld is above the limit of 16M positions", (long long)p.n_ctx);
        return NULL;
    }
    if (p.n_batch > ((int64_t)1 << 20)) {
        error_set(err, DFL_ERR_INVALID, "n_batch %lld is above the limit of 1M entries", (long long)p.n_batch);
        return NULL;
    }
    if (p.n_capture < 0 || p.n_capture > CONTEXT_MAX_CAPTURE || (p.n_capture > 0 && p.capture_layers == NULL)) {
        error_set(err, DFL_ERR_INVALID, "n_capture %d: expected 0..%d layer ids", p.n_capture, CONTEXT_MAX_CAPTURE);
        return NULL;
    }
    for (int32_t j = 0; j < p.n_capture; j++) {
        if (p.capture_layers[j] < 0 || p.capture_layers[j] > hp->n_layer) {
            error_set(err, DFL_ERR_INVALID, "capture layer id %d is out of range [0, %lld] (n_layer %lld)",
                      p.capture_layers[j], (long long)hp->n_layer, (long long)hp->n_layer);
            return NULL;
        }
    }
    if (hp->arch != DFL_ARCH_DFLASH && !(model->token_embd != NULL && model->output != NULL)) {
        error_set(err, DFL_ERR_MISSING, "%s: the model has no token embedding / output head", model->path);
        return NULL;
    }
    if (hp->arch == DFL_ARCH_DFLASH && drafter_check_target(model, &p, err) != DFL_OK) return NULL;
    if (p.n_draft_vocab != 0 && hp->arch != DFL_ARCH_DFLASH) {
        error_set(err, DFL_ERR_INVALID, "%s: a draft vocabulary (n_draft_vocab %d) is for drafter contexts only",
                  model->path, p.n_draft_vocab);
        return NULL;
    }
    dfl_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the context");
        return NULL;
    }
    ctx->model = model;
    ctx->params = p;
    ctx->params.draft_vocab = NULL; /* copied by the drafter state (drafter_state_new), not kept */
    ctx->n_ub = p.n_ubatch;
    ctx->n_out_max = p.n_outputs > 0 ? p.n_outputs : (p.n_batch < 64 ? p.n_batch : 64);
    if (ctx->n_out_max > p.n_batch) ctx->n_out_max = p.n_batch;
    ctx->n_vocab = p.target ? p.target->n_vocab : hp->n_vocab;
    if (p.target) {
        /* a drafter decodes one block of B slots per sequence at once */
        const int64_t n_block = (int64_t)p.n_seq * hp->block_size;
        if (ctx->n_ub < n_block) ctx->n_ub = n_block;
        if (ctx->params.n_batch < n_block) ctx->params.n_batch = n_block;
        if (ctx->n_out_max < (int64_t)p.n_seq * hp->n_draft_max) ctx->n_out_max = (int64_t)p.n_seq * hp->n_draft_max;
        p.share_backend = p.target;
    }
    ctx->n_embd = hp->n_embd;
    ctx->params.capture_layers = NULL;

    if (be != NULL) {
        ctx->be = be; /* borrowed */
    } else if (p.share_backend != NULL) {
        ctx->be = p.share_backend->be;
    } else if (p.device == DFL_DEVICE_CUDA) {
#ifdef DFL_HAVE_CUDA
        backend_cuda_params bp = backend_cuda_default_params();
        ctx->be = backend_cuda_new(&bp, err);
        ctx->own_backend = true;
        if (ctx->be == NULL) goto fail;
#else
        error_set(err, DFL_ERR_UNSUPPORTED, "device cuda: dflash was built without CUDA (rebuild with make CUDA=1 "
                  "where nvcc is installed)");
        goto fail;
#endif
    } else if (p.device != DFL_DEVICE_CPU) {
        error_set(err, DFL_ERR_INVALID, "unknown device %d (expected DFL_DEVICE_CPU or DFL_DEVICE_CUDA)", (int)p.device);
        goto fail;
    } else {
        backend_cpu_params bp = backend_cpu_default_params();
        bp.n_threads = p.n_threads;
        bp.n_threads_batch = p.n_threads_batch;
        bp.async = p.async;
        ctx->be = backend_cpu_new(&bp, err);
        ctx->own_backend = true;
        if (ctx->be == NULL) goto fail;
    }
    ctx->queue = backend_queue_new(ctx->be, err);
    if (ctx->queue == NULL) goto fail;
    if (kv_cache_init(&ctx->kv, ctx->be, hp->n_layer, p.n_ctx, p.n_seq, hp->n_embd_head_k * hp->n_head_kv,
                      hp->n_embd_head_v * hp->n_head_kv, p.kv_f32 ? QUANT_TYPE_F32 : QUANT_TYPE_F16, err) != DFL_OK) {
        goto fail;
    }
    if (ctx_weights_bind(&ctx->w, model, err) != DFL_OK) goto fail;
    if (!backend_get_caps(ctx->be).host_visible) {
        /* the backend cannot read the mapping: use (upload once) the model's device copy */
        if (weights_device_acquire(model, ctx->be, &ctx->w, err) != DFL_OK) goto fail;
        ctx->weights_on_device = true;
    } else if (!p.no_weight_pack) {
        /* the backend's kernels may read some weights faster repacked (once per model) */
        ctx->weights_packed = weights_pack_acquire(model, ctx->be, &ctx->w, p.target != NULL);
    }
    if (p.target != NULL) {
        /* the drafter uses the target's embedding and head unless it ships its own */
        if (!ctx->w.has_token_embd) ctx->w.token_embd = p.target->w.token_embd;
        if (!ctx->w.has_output) ctx->w.output = p.target->w.output;
    }
    if (context_alloc_host(ctx, err) != DFL_OK) goto fail;
    ctx->logits_direct = backend_get_caps(ctx->be).host_visible && backend_get_caps(ctx->be).matmul_argmax;
    ctx->s.buf = backend_buffer_alloc(ctx->be, scratch_layout(ctx, NULL), err);
    if (ctx->s.buf == NULL) goto fail;
    scratch_layout(ctx, ctx->s.buf);
    if (p.n_capture > 0) {
        ctx->link = feature_link_new(ctx->be, p.capture_layers, p.n_capture, ctx->n_embd, p.n_batch, ctx->n_ub,
                                     p.no_feature_buffer, p.feature_buffer_max, err);
        if (ctx->link == NULL) goto fail;
    }
    if (p.target != NULL) {
        ctx->dr = drafter_state_new(ctx, &p, err);
        if (ctx->dr == NULL) goto fail;
    }
    return ctx;
fail:
    dfl_context_free(ctx);
    return NULL;
}

dfl_context *dfl_context_new(dfl_model *model, const dfl_context_params *params, dfl_error *err) {
    error_clear(err);
    return context_create(model, params, NULL, err);
}

dfl_context *context_new_on(dfl_model *model, const dfl_context_params *params, backend *be, dfl_error *err) {
    if (be == NULL) {
        error_set(err, DFL_ERR_INVALID, "context_new_on: no backend");
        return NULL;
    }
    return context_create(model, params, be, err);
}

void dfl_context_free(dfl_context *ctx) {
    if (ctx == NULL) return;
    if (ctx->queue) backend_queue_synchronize(ctx->queue);
    feature_link_free(ctx->link);
    drafter_state_free(ctx->dr);
    if (ctx->s.buf) backend_buffer_free(ctx->s.buf);
    kv_cache_free(&ctx->kv);
    if (ctx->weights_on_device) weights_device_release(ctx->model, ctx->be);
    if (ctx->weights_packed) weights_pack_release(ctx->model, ctx->be);
    ctx_weights_free(&ctx->w);
    if (ctx->queue) backend_queue_free(ctx->queue);
    if (ctx->own_backend && ctx->be) backend_free(ctx->be);
    free(ctx->h_ids); free(ctx->h_pos); free(ctx->h_cells); free(ctx->h_rows); free(ctx->h_bidx);
    free(ctx->h_perm); free(ctx->h_inv); free(ctx->h_embd); free(ctx->groups); free(ctx->seq_len_tmp);
    free(ctx->logits); free(ctx->argmax_ids); free(ctx->out_of);
    free(ctx);
}

static void context_limits(const dfl_context *ctx, batch_limits *lim) {
    memset(lim, 0, sizeof(*lim));
    lim->n_vocab = ctx->n_vocab;
    lim->n_embd = ctx->n_embd;
    lim->n_pos_sections = 0; /* 1 or 4 accepted: checked below */
    lim->n_seq = ctx->kv.n_seq;
    lim->n_ctx = ctx->kv.n_ctx;
    lim->n_batch = ctx->params.n_batch;
    lim->n_rows_available = 0;
    lim->seq_len = ctx->kv.seq_len;
    lim->encode_only = false;
}

/* True when x[0..NONFINITE_BLK) holds a NaN or +-Inf (exponent bits all ones). The trip count is a
 * constant so that GCC's -O2 vectorizer takes the loop (with a variable one it stays scalar: 2.9
 * ms of a 45 ms 16-row verify over a 151,936-token vocabulary went here). */
#define NONFINITE_BLK 1024
static bool block_has_nonfinite(const float *x) {
    uint32_t any = 0;
    for (int i = 0; i < NONFINITE_BLK; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof(u));
        any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return any != 0;
}

/* Index of the first NaN or +-Inf in x[0..n), or -1. */
static int64_t first_nonfinite(const float *x, int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += NONFINITE_BLK) {
        const int64_t i1 = i0 + NONFINITE_BLK < n ? i0 + NONFINITE_BLK : n;
        if (i1 - i0 == NONFINITE_BLK && !block_has_nonfinite(x + i0)) continue;
        for (int64_t i = i0; i < i1; i++) {
            if (x[i] - x[i] != 0.0f) return i; /* NaN or Inf */
        }
    }
    return -1;
}

/* After a decode: non-finite logits (NaN or Inf: broken weights, or activations that overflow)
 * are an error naming the position, and the batch is rolled back (nothing of it applied), so no
 * caller samples from them. An argmax-only decode has no logits on the host: its ARGMAX op flags
 * a row holding a NaN/Inf as -1 - (index of the first one), checked the same way; so does the
 * fused head of logits_direct, which writes the logits too (no second pass over them here). */
static dfl_status context_check_outputs(dfl_context *ctx, const dfl_batch *batch, dfl_error *err) {
    const int64_t nv = ctx->n_vocab;
    for (int64_t i = 0; i < batch->n_tokens; i++) {
        if (ctx->out_of[i] < 0) continue;
        int64_t k;
        char value[48];
        if (ctx->last_argmax || ctx->logits_direct) {
            const int32_t id = ctx->argmax_ids[ctx->out_of[i]];
            if (id >= 0) continue;
            k = -1 - (int64_t)id;
            if (ctx->last_argmax) snprintf(value, sizeof(value), "not finite");
            else snprintf(value, sizeof(value), "%g", (double)ctx->logits[(size_t)ctx->out_of[i] * (size_t)nv + (size_t)k]);
        } else {
            const float *row = ctx->logits + (size_t)ctx->out_of[i] * (size_t)nv;
            k = first_nonfinite(row, nv);
            if (k < 0) continue;
            snprintf(value, sizeof(value), "%g", (double)row[k]);
        }
        const int64_t nps = batch->n_pos_sections;
        error_set(err, DFL_ERR_FORMAT,
                  "non-finite logits at position %d of sequence %d (batch entry %lld): the logit of token %lld is %s "
                  "(NaN or Inf in the model's weights, or activations that overflow)",
                  batch->pos[i * nps], batch->seq_id[i], (long long)i, (long long)k, value);
        for (int64_t j = 0; j < batch->n_tokens; j++) kv_seq_remove(&ctx->kv, batch->seq_id[j], batch->pos[j * nps]);
        ctx->n_outputs = 0;
        return DFL_ERR_FORMAT;
    }
    return DFL_OK;
}

dfl_status dfl_decode(dfl_context *ctx, const dfl_batch *batch, dfl_error *err) {
    error_clear(err);
    if (ctx == NULL || batch == NULL) return error_set(err, DFL_ERR_INVALID, "dfl_decode: NULL context or batch");
    if (ctx->model->hp.arch == DFL_ARCH_DFLASH) {
        return error_set(err, DFL_ERR_INVALID, "dfl_decode: a drafter context is driven by the speculative session");
    }
    batch_limits lim;
    context_limits(ctx, &lim);
    lim.n_pos_sections = batch->n_pos_sections;
    if (batch->n_pos_sections != 1 && batch->n_pos_sections != 4) {
        return error_set(err, DFL_ERR_INVALID, "batch has %lld position sections (expected 1 or 4)",
                         (long long)batch->n_pos_sections);
    }
    dfl_status st = batch_validate(batch, &lim, err);
    if (st != DFL_OK) return st;
    /* batch fields the forward pass does not read are refused, never ignored */
    if (batch->n_pos_sections != 1) {
        return error_set(err, DFL_ERR_UNSUPPORTED, "batch has %lld position sections: M-RoPE is not supported by the "
                         "%s forward pass (1 section only)", (long long)batch->n_pos_sections, dfl_arch_name(ctx->model->hp.arch));
    }
    for (int64_t i = 0; i < batch->n_tokens; i++) {
        if (batch->has_state[i]) {
            return error_set(err, DFL_ERR_UNSUPPORTED, "batch entry %lld carries a state embedding: not supported by the %s "
                             "forward pass", (long long)i, dfl_arch_name(ctx->model->hp.arch));
        }
    }
    const int64_t n_out_total = batch_n_outputs(batch);
    if (n_out_total > ctx->n_out_max) {
        return error_set(err, DFL_ERR_INVALID, "batch asks for %lld outputs; the context holds at most %lld "
                         "(dfl_context_params.n_outputs)", (long long)n_out_total, (long long)ctx->n_out_max);
    }
    /* the writer's side of the feature handoff (speculative/feature_link.h, steps 1-3); the host
     * returns without waiting when no output is asked for (no logits, no host copies): prompt
     * chunks then overlap with the drafter's work on its own queue */
    context_sync_pending(ctx); /* the host staging arrays are about to be rewritten */
    if (ctx->link != NULL) feature_link_write_begin(ctx->link, ctx->queue);
    int64_t n_out = 0;
    for (int64_t i = 0; i < batch->n_tokens; i++) {
        ctx->out_of[i] = batch->output[i] ? n_out++ : -1;
    }
    int64_t cursor = 0;
    batch_ubatch ub;
    n_out = 0;
    while (batch_split(batch, ctx->n_ub, &cursor, &ub)) {
        st = forward_target_ubatch(ctx, &ub, n_out, err);
        if (st != DFL_OK) return st;
        for (int64_t e = 0; e < ub.n_tokens; e++) n_out += ub.output[e] ? 1 : 0;
        if (ctx->link != NULL) feature_link_write_ubatch(ctx->link, ctx->queue, ub.i0, ub.n_tokens);
        if (cursor < batch->n_tokens) backend_queue_synchronize(ctx->queue); /* staging arrays reused */
    }
    const bool host_rows = ctx->link != NULL && feature_link_write_end(ctx->link, ctx->queue, batch->n_tokens);
    ctx->n_outputs = n_out;
    ctx->n_batch_last = batch->n_tokens;
    ctx->last_argmax = ctx->argmax_only;
    const bool host_needs = n_out > 0 || host_rows;
    if (host_needs) {
        backend_queue_synchronize(ctx->queue);
        ctx->pending = false;
    } else {
        ctx->pending = true;
    }
    if (n_out > 0) return context_check_outputs(ctx, batch, err);
    return DFL_OK;
}

void context_set_argmax_only(dfl_context *ctx, bool on) { ctx->argmax_only = on; }

const float *context_last_logits(const dfl_context *ctx) {
    if (ctx->last_argmax || ctx->n_outputs < 1) return NULL;
    return ctx->logits + (size_t)(ctx->n_outputs - 1) * (size_t)ctx->n_vocab;
}

int32_t context_get_argmax(const dfl_context *ctx, int64_t i) {
    if (!ctx->last_argmax || i < 0 || i >= ctx->n_batch_last || ctx->out_of[i] < 0) return -1;
    return ctx->argmax_ids[ctx->out_of[i]];
}

const float *dfl_get_logits(const dfl_context *ctx, int64_t i) {
    if (ctx == NULL || ctx->last_argmax || i < 0 || i >= ctx->n_batch_last || ctx->out_of[i] < 0) return NULL;
    return ctx->logits + (size_t)ctx->out_of[i] * (size_t)ctx->n_vocab;
}

const float *dfl_get_features(const dfl_context *ctx, int64_t i) {
    if (ctx == NULL || ctx->link == NULL) return NULL;
    return feature_link_host_row(ctx->link, i);
}

int64_t dfl_n_vocab(const dfl_context *ctx) { return ctx->n_vocab; }
int64_t dfl_n_ctx(const dfl_context *ctx) { return ctx->kv.n_ctx; }
int32_t dfl_n_seq(const dfl_context *ctx) { return (int32_t)ctx->kv.n_seq; }
const dfl_model *dfl_context_model(const dfl_context *ctx) { return ctx->model; }

int64_t dfl_seq_len(const dfl_context *ctx, int32_t seq) {
    if (ctx == NULL || seq < 0 || seq >= ctx->kv.n_seq) return -1;
    return ctx->kv.seq_len[seq];
}

dfl_status dfl_seq_remove(dfl_context *ctx, int32_t seq, int64_t p0, dfl_error *err) {
    error_clear(err);
    if (ctx == NULL || seq < 0 || seq >= ctx->kv.n_seq) {
        return error_set(err, DFL_ERR_INVALID, "seq_remove: sequence %d is out of range [0, %lld)", seq,
                         ctx ? (long long)ctx->kv.n_seq : 0LL);
    }
    kv_seq_remove(&ctx->kv, seq, p0);
    return DFL_OK;
}

dfl_status dfl_seq_copy(dfl_context *ctx, int32_t src, int32_t dst, dfl_error *err) {
    error_clear(err);
    if (ctx == NULL || src < 0 || src >= ctx->kv.n_seq || dst < 0 || dst >= ctx->kv.n_seq) {
        return error_set(err, DFL_ERR_INVALID, "seq_copy: sequence %d or %d is out of range [0, %lld)", src, dst,
                         ctx ? (long long)ctx->kv.n_seq : 0LL);
    }
    kv_seq_copy(&ctx->kv, ctx->queue, src, dst);
    backend_queue_synchronize(ctx->queue);
    return DFL_OK;
}
