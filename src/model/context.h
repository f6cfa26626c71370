/* context.h: the internals of a dfl_context: model, backend queue, KV cache, the scratch
 * tensors of one forward pass (sized for n_ubatch rows at creation) and the host-side outputs. */
#ifndef DFL_MODEL_CONTEXT_H
#define DFL_MODEL_CONTEXT_H

#include "backend/backend.h"
#include "batch/batch.h"
#include "kv/kv_cache.h"
#include "model/model.h"

#include "speculative/feature_link.h"

#define CONTEXT_MAX_CAPTURE FEATURE_LINK_MAX_CAPTURE

typedef struct drafter_state drafter_state; /* speculative/drafter.c */

#ifdef DFL_TEST_HOOKS
/* Test-only faults (never in release builds): prove the ordering tests detect a missing wait. */
#define CTX_FAULT_SKIP_READ_WAIT FEATURE_FAULT_SKIP_READ_WAIT       /* the target does not wait for `read` */
#define CTX_FAULT_SKIP_WRITTEN_WAIT FEATURE_FAULT_SKIP_WRITTEN_WAIT /* the drafter does not wait for `written` */
/* Sets the faults of a target context's feature link. */
void context_test_set_faults(dfl_context *ctx, uint32_t faults);
#endif

/* A context on a given backend (borrowed: it must outlive the context), e.g. an asynchronous
 * CPU backend in the ordering tests, or another device. */
dfl_context *context_new_on(dfl_model *model, const dfl_context_params *params, backend *be, dfl_error *err);

/* Output mode of the next decodes: argmax ids only (greedy verification: n_out ids come back
 * instead of n_out x n_vocab floats; dfl_get_logits then returns NULL) or logits. */
void context_set_argmax_only(dfl_context *ctx, bool on);
/* Argmax id (lowest id on ties) of output entry i of the last decode made in argmax-only mode;
 * -1 if i had no output or the decode returned logits. */
int32_t context_get_argmax(const dfl_context *ctx, int64_t i);

/* Logits [n_vocab] of the last output row of the last decode (NULL if none or argmax-only). */
const float *context_last_logits(const dfl_context *ctx);

/* Waits for the context's queue if it has work in flight (before host staging is reused). */
void context_sync_pending(dfl_context *ctx);

/* Weights of the model as backend tensor views (zero-copy into the mmap on the CPU). */
typedef struct ctx_layer_w {
    tensor attn_norm, wq, wk, wv, wo, q_norm, k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down;
    bool has_qk_norm;
} ctx_layer_w;

typedef struct ctx_weights {
    tensor token_embd;   /* [n_embd, n_vocab] */
    tensor output_norm;  /* [n_embd] */
    tensor output;       /* [n_embd, n_vocab] */
    tensor fc;           /* drafter: [n_cap*n_embd, n_embd] */
    tensor enc_norm;     /* drafter: [n_embd] */
    tensor markov_w1;    /* DSpark drafter: [R, n_vocab] (data NULL otherwise) */
    tensor markov_w2;    /* DSpark drafter: [R, n_vocab] */
    bool has_token_embd, has_output;
    ctx_layer_w *layers; /* [n_layer] */
} ctx_weights;

/* Scratch of one forward pass over up to n_ub rows (rows are in "work order": grouped by
 * sequence, positions ascending; perm maps work row -> batch index). */
typedef struct ctx_scratch {
    backend_buffer *buf;
    tensor x;       /* [n_embd, n_ub]   residual stream */
    tensor h;       /* [n_embd, n_ub]   normed input of a sub-block */
    tensor q;       /* [hd_k, n_head, n_ub] */
    tensor k;       /* [hd_k, n_head_kv, n_ub] */
    tensor v;       /* [hd_v, n_head_kv, n_ub] */
    tensor att;     /* [hd_v, n_head, n_ub] attention output */
    tensor gate;    /* [n_ff, n_ub] */
    tensor up;      /* [n_ff, n_ub] */
    tensor x_out;   /* [n_embd, n_out] rows gathered for the head */
    tensor logits;  /* [n_vocab, n_out] */
    tensor ids;     /* [n_ub] i32 token ids (work order) */
    tensor pos;     /* [n_ub] i32 rope positions (work order) */
    tensor cells;   /* [n_ub] i64 KV cells (work order) */
    tensor rows;    /* [n_ub] i32 work rows of the outputs, in batch order */
    tensor bidx;    /* [n_ub] i64 batch index of each work row (capture scatter) */
    tensor embd_in; /* [n_embd, n_ub] f32 input embeddings (work order) */
    tensor feat_in; /* drafter: [n_tl*n_embd, n_ub] f32 raw target features (work order) */
    tensor erow;    /* drafter: [n_ub] i32 rows of the target's feature buffer (work order) */
} ctx_scratch;

/* A run of work rows of one sequence inside a micro-batch. */
typedef struct ctx_group {
    int32_t seq;
    int64_t r0, n;        /* work rows [r0, r0 + n) */
    int64_t n_kv;         /* cells visible: [0, n_kv) of the sequence's region */
    bool causal;          /* row i sees cells [0, n_kv - n + i]; else all n_kv (drafter block) */
} ctx_group;

struct dfl_context {
    dfl_model *model;
    dfl_context_params params;
    backend *be;
    bool own_backend;
    bool weights_on_device;   /* w points into the model's device copy (weights_device.c) */
    bool weights_packed;      /* ctx->w holds views of the model's packed copy (weights_pack.c) */
    backend_queue *queue;
    kv_cache kv;
    ctx_weights w;
    ctx_scratch s;
    int64_t n_ub;          /* rows per forward pass */
    int64_t n_out_max;     /* output rows per decode call */
    int64_t n_vocab;
    int64_t n_embd;
    /* host-side work arrays (allocated at creation) */
    int32_t *h_ids;        /* [n_ub] */
    int32_t *h_pos;        /* [n_ub] */
    int64_t *h_cells;      /* [n_ub] */
    int32_t *h_rows;       /* [n_ub] */
    int64_t *h_bidx;       /* [n_ub] */
    int64_t *h_perm;       /* [n_ub] work row -> ubatch entry */
    int64_t *h_inv;        /* [n_ub] ubatch entry -> work row */
    float *h_embd;         /* [n_embd, n_ub] */
    ctx_group *groups;     /* [n_ub] */
    int64_t *seq_len_tmp;  /* [n_seq] */
    /* outputs of the last decode */
    bool argmax_only;      /* the next decodes return each output's argmax id instead of its logits */
    bool last_argmax;      /* the last decode returned ids (logits untouched) */
    bool logits_direct;    /* the head writes the host logits itself, with argmax_ids and their
                            * NaN/Inf flags (a host-visible backend with matmul_argmax) */
    int32_t *argmax_ids;   /* [n_out_max] host: argmax of each output row (argmax_only, logits_direct) */
    float *logits;         /* [n_vocab, n_out_max] host */
    int64_t *out_of;       /* [n_batch] batch index -> output row or -1 */
    int64_t n_outputs;
    int64_t n_batch_last;  /* entries of the last decoded batch */
    bool pending;          /* ops enqueued since the last synchronize */
    /* a target whose layer inputs a drafter reads: the feature handoff (NULL: no capture) */
    feature_link *link;
    /* a drafter context: its target and its own state (NULL for a target) */
    drafter_state *dr;
};

/* forward.c: one micro-batch through the target model (rows already validated). */
dfl_status forward_target_ubatch(dfl_context *ctx, const batch_ubatch *ub, int64_t n_out_before, dfl_error *err);

/* speculative/drafter.c: the DFlash drafter (docs/drafter.md). */
/* The drafter's own state, created with a drafter context for its target (NULL + err on
 * failure), and freed with it. */
/* p: the drafter context's parameters (target, draft_vocab, no_weight_pack). */
drafter_state *drafter_state_new(dfl_context *d, const dfl_context_params *p, dfl_error *err);
void drafter_state_free(drafter_state *ds);
/* The target context a drafter context drafts for. */
dfl_context *drafter_target(const dfl_context *d);
/* Injects target features: each entry carries the raw features of one committed target token
 * (an embedding of n_tl*n_embd floats: host path; or an embd row of the target's feature buffer:
 * device path) at its position; fuses them (fc + rmsnorm) and writes every layer's K/V there. */
dfl_status drafter_inject(dfl_context *d, const dfl_batch *batch, dfl_error *err);
/* Drafts one block per sequence: [last, MASK x len] at positions seq_len .. seq_len+len,
 * non-causal over the injected context, len = lens[i] (1..n_draft; lens NULL: n_draft for all,
 * n_draft <= the model's n_draft_max: B-1, or B for anchor-first DSpark, whose block is
 * [last, MASK x (len-1)] with every row a draft row); writes the len argmax tokens of sequence i to out [n, n_draft] (row i, stride
 * n_draft) and, if logits_out is not NULL, their logits [n, n_draft, n_vocab]. The block's K/V
 * are dropped afterwards. */
dfl_status drafter_draft(dfl_context *d, int32_t n, const int32_t *seqs, const int32_t *last, int32_t n_draft,
                         const int32_t *lens, int32_t *out, float *logits_out, dfl_error *err);

/* The reduced draft vocabulary's parts that DSpark and DFlash2 share (drafter.c):
 * - drafter_gather_rows: rows ids[0..n) of a [ne0, rows] weight of the file mapping copied into a
 *   buffer of d's backend (*buf, owned by the caller; packed like the model's weights when pack
 *   and the backend packs that type) and viewed as *out [ne0, n]; what names them in errors;
 * - drafter_vocab_spread: a logit row over the n_hot ids (ascending) spread to all n_vocab
 *   (src and dst apart): -inf off the vocabulary (never drafted). */
dfl_status drafter_gather_rows(dfl_context *d, const gguf_tensor *src, const int32_t *ids, int64_t n, bool pack,
                               const char *what, backend_buffer **buf, tensor *out, dfl_error *err);
void drafter_vocab_spread(float *dst, const float *src, const int32_t *hot_ids, int64_t n_hot, int64_t n_vocab);

/* DSpark with a confidence head: the confidences of the last drafter_draft's rows, laid out like
 * its `out` ([n, n_draft], row i stride n_draft); NULL otherwise (docs/drafter.md, "DSpark"). */
const float *drafter_confidence(const dfl_context *d);

/* Binds the model's weights as backend tensors. */
dfl_status ctx_weights_bind(ctx_weights *w, const dfl_model *model, dfl_error *err);
void ctx_weights_free(ctx_weights *w);
/* A backend tensor view of a GGUF tensor inside the mapping. */
tensor ctx_tensor_from_gguf(const gguf_tensor *t);

#endif
