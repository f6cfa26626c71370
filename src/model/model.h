/* model.h: a loaded model (target qwen3/llama or dflash drafter): hparams and every weight bound
 * by name to a tensor inside the GGUF mapping, with type and shape checked at load. */
#ifndef DFL_MODEL_H
#define DFL_MODEL_H

#include "dflash.h"
#include "gguf/gguf.h"

#define MODEL_MAX_LAYERS 512
#define MODEL_MAX_DEVICE_COPIES 8

/* A copy of the model's tensor data in the memory of a backend that is not host-visible (CUDA),
 * shared by the contexts of this model on that backend (weights_device.c). */
typedef struct model_device_copy {
    struct backend *be;          /* NULL: slot unused */
    struct backend_buffer *buf;  /* the GGUF data section, byte for byte */
    int64_t refs;                /* contexts using it */
} model_device_copy;

/* The model's matmul weights packed for one host-visible backend's kernels, shared by the
 * contexts of this model on it (weights_pack.c). */
typedef struct model_pack_copy {
    struct backend *be;          /* NULL: slot unused */
    struct backend_buffer *buf;  /* the packed weights (NULL: none of them is packable) */
    struct tensor *packed;       /* [n_slots] packed views (layout PLAIN: slot not packed) */
    int64_t n_slots;
    int64_t refs;                /* contexts using it */
} model_pack_copy;

/* One transformer block's weights (ggml shapes, ne[0] = input dim). */
typedef struct model_layer {
    const gguf_tensor *attn_norm;   /* [n_embd] f32 */
    const gguf_tensor *wq;          /* [n_embd, n_head*head_dim_k] */
    const gguf_tensor *wk;          /* [n_embd, n_head_kv*head_dim_k] */
    const gguf_tensor *wv;          /* [n_embd, n_head_kv*head_dim_v] */
    const gguf_tensor *wo;          /* [n_head*head_dim_v, n_embd] */
    const gguf_tensor *q_norm;      /* [head_dim_k] f32, qwen3/dflash only (NULL for llama) */
    const gguf_tensor *k_norm;      /* [head_dim_k] f32, qwen3/dflash only (NULL for llama) */
    const gguf_tensor *ffn_norm;    /* [n_embd] f32 */
    const gguf_tensor *ffn_gate;    /* [n_embd, n_ff] */
    const gguf_tensor *ffn_up;      /* [n_embd, n_ff] */
    const gguf_tensor *ffn_down;    /* [n_ff, n_embd] */
} model_layer;

/* Drafter-only settings (docs/drafter.md, "Drafter options"). */
typedef struct model_dflash {
    bool causal;                    /* dflash.attention.causal (default false: non-causal block) */
    int64_t sliding_window;         /* dflash.attention.sliding_window; 0 = none */
    bool *swa_layer;                /* [n_layer] dflash.attention.sliding_window_pattern (NULL: none) */
    float logit_scale;              /* dflash.logit_scale, > 0; 1.0 if absent */
    float final_logit_softcapping;  /* 0 = none */
    float embedding_scale;          /* dflash.embedding_scale on the block's input embeddings; 1 if absent */
    bool sample_from_anchor;        /* dflash.sample_from_anchor (absent: true); used by DSpark only */
} model_dflash;

/* DSpark heads (docs/drafter.md, "DSpark"); markov_w1 == NULL: not a DSpark drafter. */
typedef struct model_dspark {
    const gguf_tensor *markov_w1;   /* [R, n_vocab] rows indexed by the previous token */
    const gguf_tensor *markov_w2;   /* [R, n_vocab] bias projection */
    const gguf_tensor *conf_proj;   /* [n_embd + R] (stored [n_embd + R, 1]); NULL: no confidence head */
    float markov_scale;             /* markov_w2.scale, 1 if absent */
    float conf_bias;                /* conf_proj.bias, 0 if absent */
    int64_t rank;                   /* R */
    bool anchor_first;              /* sample_from_anchor: row 0 of the block is a draft row */
} model_dspark;
/* DFlash2 drafter tensors and keys (docs/drafter.md, "DFlash2"); bound by model_dflash2.c. */
typedef struct model_dflash2_layer {
    const gguf_tensor *attn_conv_base;  /* [n_embd, K, 2] f32|f16|bf16 */
    const gguf_tensor *attn_conv_proj;  /* [n_embd, 2*K*G] */
    const gguf_tensor *ffn_conv_base;   /* [n_embd, K, 2] */
    const gguf_tensor *ffn_conv_proj;   /* [n_embd, 2*K*G] */
} model_dflash2_layer;

typedef struct model_dflash2 {
    int64_t conv_kernel;                /* K  dflash.conv_kernel_size */
    int64_t conv_group;                 /* gs dflash.conv_group_size (G = n_embd / gs) */
    int64_t rank;                       /* R  dflash.selector_rank */
    int64_t top_k;                      /* k  dflash.selector_top_k */
    const gguf_tensor *sel_pred;        /* [R, n_vocab] selector_predecessor.weight */
    const gguf_tensor *sel_succ;        /* [R, n_vocab] selector_successor.weight */
    const gguf_tensor *sel_hidden;      /* [n_embd, R] selector_hidden.weight */
    model_dflash2_layer *layers;        /* [n_layer] */
} model_dflash2;

struct dfl_model {
    char *path;
    gguf_file *gguf;
    dfl_hparams hp;
    model_dflash dflash;
    model_dspark dspark;
    const gguf_tensor *token_embd;      /* [n_embd, n_vocab]; NULL for a drafter without one */
    const gguf_tensor *output_norm;     /* [n_embd] f32 */
    const gguf_tensor *output;          /* [n_embd, n_vocab]; == token_embd when tied; NULL for a drafter without one */
    const gguf_tensor *fc;              /* drafter: [n_target_layers*n_embd, n_embd] */
    const gguf_tensor *enc_output_norm; /* drafter: [n_embd] f32 (the fusion norm) */
    model_layer *layers;                /* [n_layer] */
    model_dflash2 *d2;                  /* DFlash2 drafter parts; NULL for every other model */
    uint64_t n_params;                  /* elements of all tensors */
    uint64_t n_bytes;                   /* bytes of all tensors */
    model_device_copy dev[MODEL_MAX_DEVICE_COPIES]; /* uploaded weights, per backend */
    model_pack_copy pack[MODEL_MAX_DEVICE_COPIES];  /* packed matmul weights, per host backend */
};

/* model_dflash2.c: if the drafter m has selector_hidden.weight, reads the DFlash2 keys and binds
 * its tensors into m->d2 (llama.cpp's checks: divisibility, lattice size), else leaves d2 NULL.
 * Every problem is named (key or tensor, expected vs found). */
dfl_status model_dflash2_load(dfl_model *m, dfl_error *err);
void model_dflash2_free(model_dflash2 *d2);

/* The GGUF file under a model (for the vocabulary and inspection). */
const gguf_file *model_gguf(const dfl_model *model);

#endif
