/* dflash.h: the only public header of dflash, a C11 engine for lossless speculative decoding
 * with DFlash block drafters.
 *
 * Conventions: every function that can fail because of its input returns a dfl_status (0 = ok)
 * or NULL, and fills a caller-owned dfl_error with a message that says what and where.
 * Sizes and offsets are size_t / int64_t. No function keeps global state. */
#ifndef DFLASH_H
#define DFLASH_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFL_VERSION "0.1.0"

/* Return codes. Every public function that can fail returns one of these. */
typedef enum dfl_status {
    DFL_OK = 0,
    DFL_ERR_IO = 1,          /* a file could not be opened, read or mapped */
    DFL_ERR_FORMAT = 2,      /* a file is corrupt or not in the expected format */
    DFL_ERR_UNSUPPORTED = 3, /* valid but not supported (architecture, tensor type, version) */
    DFL_ERR_MISSING = 4,     /* a required key or tensor is missing */
    DFL_ERR_MISMATCH = 5,    /* a key or tensor has the wrong type or shape */
    DFL_ERR_INVALID = 6,     /* an invalid argument (bad batch, bad option) */
    DFL_ERR_NOMEM = 7,       /* an allocation failed */
    DFL_ERR_CTX_FULL = 8,    /* the context has no room for the batch */
    DFL_ERR_INTERNAL = 9,
} dfl_status;

/* An error: the first failure's status and a human-readable message. */
typedef struct dfl_error {
    dfl_status code;
    char msg[1024];
} dfl_error;

/* Name of a status code, e.g. "format error". */
const char *dfl_status_str(dfl_status code);

/* ---- models ----------------------------------------------------------------------------- */

typedef struct dfl_model dfl_model;

typedef enum dfl_arch {
    DFL_ARCH_QWEN3 = 0,
    DFL_ARCH_LLAMA = 1,
    DFL_ARCH_DFLASH = 2,
} dfl_arch;

typedef struct dfl_model_params {
    bool verbose; /* log what is loaded to stderr */
} dfl_model_params;

dfl_model_params dfl_model_default_params(void);

/* Loads a GGUF model (arch qwen3, llama or dflash). Weights stay in the file mapping.
 * Returns NULL and fills err on failure. */
dfl_model *dfl_model_load(const char *path, const dfl_model_params *params, dfl_error *err);
void dfl_model_free(dfl_model *model);

/* ---- contexts --------------------------------------------------------------------------- */

/* A context: the mutable state of inference over one model (KV cache for n_seq sequences of up
 * to n_ctx positions, scratch, a backend queue). All memory is allocated by dfl_context_new for
 * the worst case; decoding does not allocate. */
typedef struct dfl_context dfl_context;
typedef struct dfl_batch dfl_batch;

typedef struct dfl_context_params {
    int64_t n_ctx;          /* positions per sequence; 0: min(n_ctx_train, 4096) */
    int32_t n_seq;          /* sequences (default 1) */
    int64_t n_batch;        /* most entries one dfl_decode call accepts (default 512) */
    int64_t n_ubatch;       /* most entries one forward pass computes (default 512, <= n_batch) */
    int64_t n_outputs;      /* most entries with output per call; 0: min(n_batch, 64) */
    int32_t n_threads;      /* threads for single-token decode; <= 0: all cores */
    int32_t n_threads_batch;/* threads for batches; <= 0: all cores */
    bool kv_f32;            /* KV cache in f32 (default f16, like llama.cpp) */
    bool async;             /* the context's queue runs on a worker thread */
    /* the backend (thread pool) of another context to share; NULL: create one */
    dfl_context *share_backend;
    /* layer-input ids whose hidden states are captured for every token of every batch
     * (id L = residual stream entering layer L; id n_layer = the last layer's output) */
    int32_t n_capture;
    const int32_t *capture_layers;
} dfl_context_params;

dfl_context_params dfl_context_default_params(void);
/* NULL + err on an invalid parameter or when memory cannot be allocated. */
dfl_context *dfl_context_new(dfl_model *model, const dfl_context_params *params, dfl_error *err);
void dfl_context_free(dfl_context *ctx);

/* Evaluates a batch: appends its tokens to their sequences' KV cache and computes logits for the
 * entries with output set. The batch is validated first (DFL_ERR_INVALID / DFL_ERR_CTX_FULL with
 * a message naming the entry); on any error nothing of the batch is applied. */
dfl_status dfl_decode(dfl_context *ctx, const dfl_batch *batch, dfl_error *err);
/* Logits [n_vocab] of entry i of the last decoded batch; NULL if i had no output. */
const float *dfl_get_logits(const dfl_context *ctx, int64_t i);
/* Captured layer inputs of entry i of the last batch: [n_capture * n_embd] floats, in the
 * capture_layers order; NULL without capture. */
const float *dfl_get_features(const dfl_context *ctx, int64_t i);
int64_t dfl_n_vocab(const dfl_context *ctx);
int64_t dfl_n_ctx(const dfl_context *ctx);
int32_t dfl_n_seq(const dfl_context *ctx);
/* Positions stored for seq (its next position). */
int64_t dfl_seq_len(const dfl_context *ctx, int32_t seq);
/* Removes positions >= p0 of seq (p0 <= 0: all). */
dfl_status dfl_seq_remove(dfl_context *ctx, int32_t seq, int64_t p0, dfl_error *err);
/* Makes dst a copy of src (its KV cells and length). */
dfl_status dfl_seq_copy(dfl_context *ctx, int32_t src, int32_t dst, dfl_error *err);
const dfl_model *dfl_context_model(const dfl_context *ctx);

/* Hyperparameters of a loaded model. */
typedef struct dfl_hparams {
    dfl_arch arch;
    int64_t n_layer;
    int64_t n_ctx_train;
    int64_t n_embd;
    int64_t n_ff;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t n_embd_head_k; /* head_dim of q and k */
    int64_t n_embd_head_v; /* head_dim of v */
    int64_t n_vocab;
    float norm_eps;
    float rope_freq_base;
    bool tied_output;      /* output.weight absent: the head is token_embd */
    /* dflash drafter only */
    int64_t block_size;
    int64_t n_target_layers;
    int32_t target_layers[64];
    int64_t mask_token_id; /* -1 if none */
    bool has_token_embd;   /* drafter ships its own token_embd */
    bool has_output;       /* drafter ships its own output head */
    bool causal;           /* dflash.attention.causal (default false) */
} dfl_hparams;

const dfl_hparams *dfl_model_hparams(const dfl_model *model);
const char *dfl_arch_name(dfl_arch arch);

#ifdef __cplusplus
}
#endif
#endif
