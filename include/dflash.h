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

/* ---- vocab: the tokenizer (byte-level BPE, as the reference tokenizer of the model) -------- */

typedef struct dfl_vocab dfl_vocab;

/* Token types (the values GGUF's tokenizer.ggml.token_type uses). */
typedef enum dfl_token_type {
    DFL_TOKEN_TYPE_INVALID = 0,      /* not a token id of this vocabulary */
    DFL_TOKEN_TYPE_NORMAL = 1,
    DFL_TOKEN_TYPE_UNKNOWN = 2,
    DFL_TOKEN_TYPE_CONTROL = 3,      /* e.g. <|im_start|>: matched in text only with parse_special */
    DFL_TOKEN_TYPE_USER_DEFINED = 4, /* e.g. <think>: always matched in text */
    DFL_TOKEN_TYPE_UNUSED = 5,       /* padding entries */
    DFL_TOKEN_TYPE_BYTE = 6,
} dfl_token_type;

/* Returned by the functions below (instead of a count) for an invalid argument or when memory
 * runs out. */
#define DFL_VOCAB_FAIL INT64_MIN

/* Loads only the vocabulary of a GGUF file (a model or a vocabulary-only file): model "gpt2"
 * (byte-level BPE), pre-tokenizer "qwen2", "llama3"/"llama-bpe" or "gpt2"/"default" (absent =
 * gpt2). NULL + err on failure. */
dfl_vocab *dfl_vocab_load(const char *path, dfl_error *err);
void dfl_vocab_free(dfl_vocab *vocab);

int64_t dfl_vocab_n_tokens(const dfl_vocab *vocab);
/* Special token ids, -1 where the vocabulary has none. eot: tokenizer.ggml.eot_token_id, else
 * the first of <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn> that is a control token. */
int32_t dfl_vocab_bos(const dfl_vocab *vocab);
int32_t dfl_vocab_eos(const dfl_vocab *vocab);
int32_t dfl_vocab_eot(const dfl_vocab *vocab);
int32_t dfl_vocab_pad(const dfl_vocab *vocab);
int32_t dfl_vocab_mask(const dfl_vocab *vocab);
bool dfl_vocab_add_bos(const dfl_vocab *vocab);
/* True for tokens that end a generation (eos, eot, and control tokens such as <|endoftext|>). */
bool dfl_vocab_is_eog(const dfl_vocab *vocab, int32_t token);
dfl_token_type dfl_vocab_token_type(const dfl_vocab *vocab, int32_t token);
/* The token whose text is exactly text[0..len) (decoded bytes; control tokens included), or -1. */
int32_t dfl_vocab_find(const dfl_vocab *vocab, const char *text, size_t len);
/* The pre-tokenizer in use: "qwen2", "llama3" or "gpt2". */
const char *dfl_vocab_pre_name(const dfl_vocab *vocab);

/* Tokenizes text[0..len) (any bytes) into tokens[0..n_max). Returns the token count n; if n > n_max,
 * writes the first n_max and returns -n; DFL_VOCAB_FAIL on a bad argument or out of memory.
 * add_special: add BOS (and EOS) where the vocabulary asks for it (tokenizer.ggml.add_bos_token).
 * parse_special: control tokens written in the text (e.g. "<|im_start|>") become those tokens;
 * otherwise they are tokenized as plain text. User-defined tokens are always matched.
 * Pipeline (as the reference tokenizer): special tokens (leftmost, longest first), then NFC
 * (Qwen2/3), the pre-tokenizer regex, byte-level BPE. Bytes that are not part of well-formed
 * UTF-8 split the text like special tokens and each becomes its own byte token, so
 * dfl_detokenize(dfl_tokenize(x)) == x for every NFC input, valid UTF-8 or not. */
int64_t dfl_tokenize(const dfl_vocab *vocab, const char *text, size_t len, int32_t *tokens, int64_t n_max,
                     bool add_special, bool parse_special);

/* The bytes of one token into buf[0..cap). Returns the length n, -n if cap < n, DFL_VOCAB_FAIL for
 * an invalid token id. special: write the text of control (and unused) tokens; otherwise they
 * are empty. A token's bytes may be an incomplete UTF-8 sequence (use dfl_detok to stream). */
int64_t dfl_token_to_piece(const dfl_vocab *vocab, int32_t token, char *buf, size_t cap, bool special);
/* The concatenated bytes of tokens[0..n_tokens) (no NUL added). Same return convention. */
int64_t dfl_detokenize(const dfl_vocab *vocab, const int32_t *tokens, int64_t n_tokens, char *buf, size_t cap,
                       bool special);

/* Streaming detokenizer: turns tokens one at a time into text that is always valid UTF-8.
 * Bytes of an incomplete UTF-8 sequence are held back until it completes; bytes that cannot
 * become valid UTF-8 are replaced by U+FFFD (one per maximal ill-formed subpart, as the WHATWG
 * decoder does). Allocates at creation only. */
typedef struct dfl_detok dfl_detok;
dfl_detok *dfl_detok_new(const dfl_vocab *vocab, bool special, dfl_error *err);
void dfl_detok_free(dfl_detok *detok);
/* Feeds one token; text and len receive the text that is complete now (valid until the next call).
 * DFL_ERR_INVALID (text empty) for a token id outside the vocabulary. */
dfl_status dfl_detok_push(dfl_detok *detok, int32_t token, const char **text, size_t *len);
/* Ends the stream: returns what is held back (as U+FFFD), and resets the state. */
void dfl_detok_flush(dfl_detok *detok, const char **text, size_t *len);

/* Chat template: ChatML as Qwen3's template renders it:
 *   "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message (roles system, user, assistant, tool;
 *   tool results are wrapped in <tool_response> inside a user turn; assistant turns after the
 *   last user query keep their <think> block, earlier ones lose it), then with
 *   add_generation_prompt "<|im_start|>assistant\n" and, when enable_thinking is false, the empty
 *   think block "<think>\n\n</think>\n\n". Other roles render nothing (as in the template). */
typedef struct dfl_chat_msg {
    const char *role;
    const char *content;
    const char *reasoning_content; /* assistant only; NULL = take it from a <think> block in content */
} dfl_chat_msg;

/* Renders into buf[0..cap) with a terminating NUL. Returns the length n (without the NUL), or
 * -(n + 1) if cap < n + 1, or DFL_VOCAB_FAIL with err set (NULL message fields; a vocabulary,
 * if given, without <|im_start|> and <|im_end|>). */
int64_t dfl_chat_render(const dfl_vocab *vocab, const dfl_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
                        bool enable_thinking, char *buf, size_t cap, dfl_error *err);

#ifdef __cplusplus
}
#endif
#endif
