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
