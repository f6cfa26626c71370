/* dflash.h: the only public header of dflash, a C11 engine for lossless speculative decoding
 * with DFlash block drafters.
 *
 * Conventions: every function that can fail because of its input returns a dfl_status (0 = ok)
 * or NULL, and fills a caller-owned dfl_error with a message that says what and where; each such
 * call resets the dfl_error on entry (err may be NULL). A function that writes into a caller's
 * buffer and finds it too small returns the negated capacity it needs (so the call can be
 * repeated with exactly that) and never writes beyond the buffer.
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

/* What the shared library exports: the functions of this header, nothing else (the library is
 * built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define DFL_API __attribute__((visibility("default")))
#else
#define DFL_API
#endif

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
DFL_API const char *dfl_status_str(dfl_status code);

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

DFL_API dfl_model_params dfl_model_default_params(void);

/* Loads a GGUF model (arch qwen3, llama or dflash). Weights stay in the file mapping.
 * Returns NULL and fills err on failure. */
DFL_API dfl_model *dfl_model_load(const char *path, const dfl_model_params *params, dfl_error *err);
DFL_API void dfl_model_free(dfl_model *model);

/* ---- contexts --------------------------------------------------------------------------- */

/* A context: the mutable state of inference over one model (KV cache for n_seq sequences of up
 * to n_ctx positions, scratch, a backend queue). All memory is allocated by dfl_context_new for
 * the worst case; decoding does not allocate. */
typedef struct dfl_context dfl_context;
typedef struct dfl_batch dfl_batch;

/* Where a context runs. */
typedef enum dfl_device {
    DFL_DEVICE_CPU = 0,  /* the CPU backend (always built) */
    DFL_DEVICE_CUDA = 1, /* an NVIDIA GPU (builds with CUDA only; otherwise context creation fails
                          * with "built without CUDA") */
} dfl_device;

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
    /* read the weights only as stored: no packed copy for the CPU kernels (default: Q8_0 weights
     * with n_in a multiple of 512, and with AVX2 / AVX-512 Q4_0 (the same n_in), Q4_K and Q6_K
     * ones, are repacked once per
     * model and backend; same results, faster; the copy takes about the size of those weights, Q6_K
     * a third more, and the mapping's pages of the packed weights are released) */
    bool no_weight_pack;
    /* the backend (thread pool) of another context to share; NULL: create one */
    dfl_context *share_backend;
    /* a drafter context (arch dflash) REQUIRES its target context: it shares the target's
     * backend, token embedding, output head (unless the drafter ships its own) and features */
    dfl_context *target;
    /* layer-input ids whose hidden states are captured for every token of every batch
     * (id L = residual stream entering layer L; id n_layer = the last layer's output) */
    int32_t n_capture;
    const int32_t *capture_layers;
    /* the capture goes into ONE feature buffer [n_capture*n_embd, n_batch] in backend memory
     * (row r = batch entry r, columns in capture_layers order, any id order) unless disabled
     * here or larger than feature_buffer_max bytes (0: no cap); then features are staged per
     * micro-batch and copied to host memory (the host path) */
    bool no_feature_buffer;
    size_t feature_buffer_max;
    /* the backend a context creates when it shares none (default DFL_DEVICE_CPU); a drafter
     * context always runs on its target's backend */
    dfl_device device;
    /* drafter contexts only: a reduced draft vocabulary (docs/drafter.md "Reduced draft
     * vocabulary"). The head computes the logits of these n_draft_vocab token ids only (unique,
     * inside the vocabulary; copied), so drafts are always among them, and on the CPU a draft is
     * the whole head's whenever the whole head's argmax is among them. The target verifies against
     * its whole vocabulary: the output is unchanged, only acceptance can drop. 0: the whole head.
     * DFlash, DFlash2 (at least its selector's top-k ids) and DSpark drafters. */
    int32_t n_draft_vocab;
    const int32_t *draft_vocab;
} dfl_context_params;

DFL_API dfl_context_params dfl_context_default_params(void);
/* NULL + err on an invalid parameter or when memory cannot be allocated. */
DFL_API dfl_context *dfl_context_new(dfl_model *model, const dfl_context_params *params, dfl_error *err);
DFL_API void dfl_context_free(dfl_context *ctx);

/* Evaluates a batch: appends its tokens to their sequences' KV cache and computes logits for the
 * entries with output set. The batch is validated first (DFL_ERR_INVALID / DFL_ERR_CTX_FULL with
 * a message naming the entry); on any error nothing of the batch is applied. Logits that are not
 * finite (NaN or Inf: broken weights or activations that overflow) are DFL_ERR_FORMAT with a
 * message naming the position and sequence; the batch is then rolled back. */
DFL_API dfl_status dfl_decode(dfl_context *ctx, const dfl_batch *batch, dfl_error *err);
/* Logits [n_vocab] of entry i of the last decoded batch; NULL if i had no output. */
DFL_API const float *dfl_get_logits(const dfl_context *ctx, int64_t i);
/* Captured layer inputs of entry i of the last batch: [n_capture * n_embd] floats, in the
 * capture_layers order; NULL without capture or when they stay in the device feature buffer. */
DFL_API const float *dfl_get_features(const dfl_context *ctx, int64_t i);
/* True when the context captures into a device feature buffer (else: host path), and why not. */
DFL_API bool dfl_context_has_feature_buffer(const dfl_context *ctx);
DFL_API const char *dfl_context_feature_buffer_note(const dfl_context *ctx);
DFL_API int64_t dfl_n_vocab(const dfl_context *ctx);
DFL_API int64_t dfl_n_ctx(const dfl_context *ctx);
DFL_API int32_t dfl_n_seq(const dfl_context *ctx);
/* Positions stored for seq (its next position). */
DFL_API int64_t dfl_seq_len(const dfl_context *ctx, int32_t seq);
/* Removes positions >= p0 of seq (p0 <= 0: all). */
DFL_API dfl_status dfl_seq_remove(dfl_context *ctx, int32_t seq, int64_t p0, dfl_error *err);
/* Makes dst a copy of src (its KV cells and length). */
DFL_API dfl_status dfl_seq_copy(dfl_context *ctx, int32_t src, int32_t dst, dfl_error *err);
DFL_API const dfl_model *dfl_context_model(const dfl_context *ctx);

/* ---- speculative decoding (DFlash): the feature path (the engine below drives the session) -- */

/* How target features reach the drafter (dfl_engine_params.features). */
typedef enum dfl_feature_path {
    DFL_FEATURES_DEVICE = 0, /* the drafter reads rows of the target's feature buffer in place */
    DFL_FEATURES_HOST = 1,   /* features are copied through host memory */
} dfl_feature_path;

/* How the drafter waits for the target's `written` event before it reads the feature buffer:
 * on the host (event synchronize, the seed's choice: a device-side wait would stall the
 * drafter's queue for the whole target batch) or on its queue (device-side; only where the
 * backend's queues are independent). */
typedef enum dfl_feature_wait {
    DFL_WAIT_HOST = 0,
    DFL_WAIT_DEVICE = 1,
} dfl_feature_wait;

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
    /* drafter variants (docs/drafter.md, "DSpark") */
    int64_t n_draft_max;   /* most drafts one block gives: block_size - 1, or block_size (anchor-first DSpark) */
    bool dspark;           /* DSpark Markov head present */
    bool dspark_confidence;/* DSpark confidence head present (draft length from draft_p_min) */
} dfl_hparams;

DFL_API const dfl_hparams *dfl_model_hparams(const dfl_model *model);
/* Bytes and elements of all the model's tensors. */
DFL_API uint64_t dfl_model_n_bytes(const dfl_model *model);
DFL_API uint64_t dfl_model_n_params(const dfl_model *model);
DFL_API const char *dfl_arch_name(dfl_arch arch);

/* ---- batch ------------------------------------------------------------------------------ */

/* A batch: a table of entries, one row per token slot (like llama.cpp's llama_batch).
 * Each entry carries a token id, an embedding, or both ("mixed"), optionally a state embedding,
 * OR an embd row (its input is row `embd_row` of the other context's feature buffer, docs/
 * feature-protocol.md). All memory is allocated by dfl_batch_init for n_tokens_max entries; adding never
 * allocates. The arrays are public and may be filled directly; a context validates the whole
 * batch before it changes anything (an invalid batch is rejected with a message naming the
 * entry, and nothing is half-applied). */
#define DFL_TOKEN_NULL (-1) /* token[i] when entry i has no token id */

typedef struct dfl_batch {
    int64_t n_tokens;       /* entries in use */
    int64_t n_tokens_max;   /* capacity */
    int64_t n_embd;         /* floats per embedding and per state embedding (0: none allowed) */
    int64_t n_pos_sections; /* 1 (plain RoPE) or 4 (M-RoPE) */
    int32_t *token;    /* [n_tokens_max]                  | token id or DFL_TOKEN_NULL */
    float   *embd;     /* [n_tokens_max, n_embd]          | entry i at embd + i*n_embd (copied in) */
    bool    *has_embd; /* [n_tokens_max]                  | embd of entry i is set */
    int32_t *pos;      /* [n_tokens_max, n_pos_sections]  | entry i section s at pos[i*n_pos_sections + s] */
    int32_t *seq_id;   /* [n_tokens_max]                  | sequence of entry i */
    bool    *output;   /* [n_tokens_max]                  | compute logits/outputs for entry i */
    int32_t *embd_row; /* [n_tokens_max]                  | row of the other context's feature buffer, -1 if none */
    float   *state;    /* [n_tokens_max, n_embd]          | state embedding of entry i (copied in) */
    bool    *has_state;/* [n_tokens_max]                  | state of entry i is set */
} dfl_batch;

/* Allocates a batch for up to n_tokens_max entries with embeddings of n_embd floats (0 if the
 * batch carries only token ids / embd rows) and n_pos_sections (1 or 4) positions per entry.
 * Returns NULL and fills err (may be NULL) on a bad argument or a failed allocation. */
DFL_API dfl_batch *dfl_batch_init(int64_t n_tokens_max, int64_t n_embd, int64_t n_pos_sections, dfl_error *err);
DFL_API void dfl_batch_free(dfl_batch *batch);
/* Removes all entries (keeps the memory). */
DFL_API void dfl_batch_clear(dfl_batch *batch);

/* The adders append one entry and return its index, or a negative status:
 * -DFL_ERR_CTX_FULL when the batch already holds n_tokens_max entries, -DFL_ERR_INVALID for a
 * NULL pointer, an embedding in a batch created with n_embd == 0, or a negative embd row.
 * pos points to n_pos_sections positions. Values (token range, positions ...) are checked when
 * the batch is submitted, not here. */
DFL_API int32_t dfl_batch_add_token(dfl_batch *batch, int32_t token, const int32_t *pos, int32_t seq_id, bool output);
DFL_API int32_t dfl_batch_add_embd(dfl_batch *batch, const float *embd, const int32_t *pos, int32_t seq_id, bool output);
/* A "mixed" entry: token id and embedding together. */
DFL_API int32_t dfl_batch_add_token_embd(dfl_batch *batch, int32_t token, const float *embd, const int32_t *pos,
                                 int32_t seq_id, bool output);
/* An entry whose input is row `row` of the other context's feature buffer. */
DFL_API int32_t dfl_batch_add_embd_row(dfl_batch *batch, int32_t row, const int32_t *pos, int32_t seq_id, bool output);
/* Sets the state embedding (n_embd floats, copied) of entry idx. DFL_ERR_INVALID on a bad idx,
 * a NULL state or a batch with n_embd == 0. */
DFL_API dfl_status dfl_batch_set_state(dfl_batch *batch, int64_t idx, const float *state);

/* ---- sampler ---------------------------------------------------------------------------- */

/* Token sampling. The transforms run in llama.cpp's default-chain order:
 *   penalties (repetition, frequency, presence) -> top-k -> top-p -> min-p -> temperature ->
 *   softmax -> draw.
 * top-p and min-p therefore act on the temperature-1 distribution. temp <= 0 is greedy: argmax
 * of the (penalized) logits, the lowest id wins ties, no random number is used. The random
 * numbers come from the sampler's own seeded generator (xoshiro256**): the same seed and inputs
 * give the same tokens. All scratch memory is allocated by dfl_sampler_new. */
typedef struct dfl_sampler_params {
    float temp;             /* <= 0: greedy */
    int32_t top_k;          /* keep the k most likely tokens; <= 0: off */
    float top_p;            /* keep the smallest top set with mass >= top_p, in [0, 1]; 1: off */
    float min_p;            /* keep tokens with p >= min_p * p_max, in [0, 1]; 0: off */
    float repeat_penalty;   /* > 0; 1: off. logit > 0 is divided by it, logit <= 0 multiplied */
    int32_t repeat_last_n;  /* accepted tokens the penalties look back on, >= 0; 0: off */
    /* OpenAI-style additive penalties over the same window, after the repetition penalty:
     * logit -= count * frequency_penalty + presence_penalty for each token of the window (count:
     * its occurrences there); each in [-100, 100], 0: off */
    float presence_penalty;
    float frequency_penalty;
    uint64_t seed;          /* seed of the generator */
} dfl_sampler_params;

typedef struct dfl_sampler dfl_sampler;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1, repeat_last_n 64, presence and
 * frequency penalties 0, seed 0. */
DFL_API dfl_sampler_params dfl_sampler_default_params(void);
/* Returns NULL and fills err (may be NULL) on an invalid parameter or a failed allocation. */
DFL_API dfl_sampler *dfl_sampler_new(const dfl_sampler_params *params, int64_t n_vocab, dfl_error *err);
DFL_API void dfl_sampler_free(dfl_sampler *sampler);
/* Samples a token from n_vocab logits. Returns the token id, or -DFL_ERR_INVALID when a logit is
 * NaN or +Inf or no logit is finite (-Inf logits are allowed: such tokens are never drawn). */
DFL_API int32_t dfl_sampler_sample(dfl_sampler *sampler, const float *logits);
/* Appends a committed token to the repetition-penalty window. DFL_ERR_INVALID if out of range. */
DFL_API dfl_status dfl_sampler_accept(dfl_sampler *sampler, int32_t token);
/* Empties the repetition window and restarts the generator from the seed. */
DFL_API void dfl_sampler_reset(dfl_sampler *sampler);
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
DFL_API dfl_vocab *dfl_vocab_load(const char *path, dfl_error *err);
/* The vocabulary of a loaded model, from the metadata already read (the file is not parsed
 * again). The model may be freed afterwards. NULL + err when it has none. */
DFL_API dfl_vocab *dfl_model_vocab_new(const dfl_model *model, dfl_error *err);
DFL_API void dfl_vocab_free(dfl_vocab *vocab);

DFL_API int64_t dfl_vocab_n_tokens(const dfl_vocab *vocab);
/* Special token ids, -1 where the vocabulary has none. eot: tokenizer.ggml.eot_token_id, else
 * the first of <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn> that is a control token. */
DFL_API int32_t dfl_vocab_bos(const dfl_vocab *vocab);
DFL_API int32_t dfl_vocab_eos(const dfl_vocab *vocab);
DFL_API int32_t dfl_vocab_eot(const dfl_vocab *vocab);
DFL_API int32_t dfl_vocab_pad(const dfl_vocab *vocab);
DFL_API int32_t dfl_vocab_mask(const dfl_vocab *vocab);
DFL_API bool dfl_vocab_add_bos(const dfl_vocab *vocab);
/* True for tokens that end a generation (eos, eot, and control tokens such as <|endoftext|>). */
DFL_API bool dfl_vocab_is_eog(const dfl_vocab *vocab, int32_t token);
DFL_API dfl_token_type dfl_vocab_token_type(const dfl_vocab *vocab, int32_t token);
/* The token whose text is exactly text[0..len) (decoded bytes; control tokens included), or -1. */
DFL_API int32_t dfl_vocab_find(const dfl_vocab *vocab, const char *text, size_t len);
/* The pre-tokenizer in use: "qwen2", "llama3" or "gpt2". */
DFL_API const char *dfl_vocab_pre_name(const dfl_vocab *vocab);

/* Tokenizes text[0..len) (any bytes) into tokens[0..n_max). Returns the token count n; if n > n_max,
 * writes the first n_max and returns -n (tokens NULL, n_max 0 = a count query); DFL_VOCAB_FAIL on a
 * bad argument (len > INT32_MAX included) or out of memory. Thread-safe (one vocabulary may serve
 * many threads). n <= 3 * len + 2 always (NFC can lengthen the text: use that bound, or the count
 * query, to size tokens; n <= len + 2 for text that NFC leaves alone).
 * add_special: add BOS (and EOS) where the vocabulary asks for it (tokenizer.ggml.add_bos_token).
 * parse_special: control tokens written in the text (e.g. "<|im_start|>") become those tokens;
 * otherwise they are tokenized as plain text. User-defined tokens are always matched.
 * Pipeline (as the reference tokenizer): special tokens (leftmost, longest first), then NFC
 * (Qwen2/3), the pre-tokenizer regex, byte-level BPE. Bytes that are not part of well-formed
 * UTF-8 split the text like special tokens and each becomes its own byte token, so
 * dfl_detokenize(dfl_tokenize(x), special = true) == x for every NFC input, valid UTF-8 or not. */
DFL_API int64_t dfl_tokenize(const dfl_vocab *vocab, const char *text, size_t len, int32_t *tokens, int64_t n_max,
                     bool add_special, bool parse_special);

/* The bytes of one token into buf[0..cap). Returns the length n, -n if cap < n, DFL_VOCAB_FAIL for
 * an invalid token id. special: write the text of control (and unused) tokens; otherwise they
 * are empty. A token's bytes may be an incomplete UTF-8 sequence (use dfl_detok to stream). */
DFL_API int64_t dfl_token_to_piece(const dfl_vocab *vocab, int32_t token, char *buf, size_t cap, bool special);
/* The concatenated bytes of tokens[0..n_tokens) (no NUL added). Same return convention. */
DFL_API int64_t dfl_detokenize(const dfl_vocab *vocab, const int32_t *tokens, int64_t n_tokens, char *buf, size_t cap,
                       bool special);

/* Streaming detokenizer: turns tokens one at a time into text that is always valid UTF-8.
 * Bytes of an incomplete UTF-8 sequence are held back until it completes; bytes that cannot
 * become valid UTF-8 are replaced by U+FFFD (one per maximal ill-formed subpart, as the WHATWG
 * decoder does). Allocates at creation only. */
typedef struct dfl_detok dfl_detok;
DFL_API dfl_detok *dfl_detok_new(const dfl_vocab *vocab, bool special, dfl_error *err);
DFL_API void dfl_detok_free(dfl_detok *detok);
/* Feeds one token; text and len receive the text that is complete now (valid until the next call).
 * DFL_ERR_INVALID (text empty) for a token id outside the vocabulary. */
DFL_API dfl_status dfl_detok_push(dfl_detok *detok, int32_t token, const char **text, size_t *len);
/* Ends the stream: returns what is held back (as U+FFFD), and resets the state. */
DFL_API void dfl_detok_flush(dfl_detok *detok, const char **text, size_t *len);

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
DFL_API int64_t dfl_chat_render(const dfl_vocab *vocab, const dfl_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
                        bool enable_thinking, char *buf, size_t cap, dfl_error *err);

/* ---- engine: one target (+ drafter) pair and its sequences --------------------------------- */

/* An engine loads a target and, optionally, a DFlash drafter, checks that they pair, sizes both
 * contexts for n_seq concurrent sequences and the draft length, and picks the feature path.
 * Without a drafter it decodes plainly (autoregressively) behind the same calls, so callers never
 * branch. Each sequence is started with a prompt and its own sampler settings and limits; one
 * dfl_engine_step advances every active sequence (speculative: one drafter pass + one verify
 * batch for all of them; plain: one batch of one token each). Sequences join (start) and leave
 * (finish, cancel) between steps; a sequence's output depends on its own prompt and settings
 * only. Greedy output equals plain greedy decoding token for token; sampled output has the
 * plain sampler's distribution (penalties included). */
typedef struct dfl_engine dfl_engine;

#define DFL_MAX_DRAFT 64

typedef struct dfl_engine_params {
    int32_t n_seq;            /* concurrent sequences (default 1) */
    int64_t n_ctx;            /* positions per sequence; 0: min(n_ctx_train, 4096) */
    int64_t n_batch;          /* prompt tokens per forward batch (default 512) */
    int32_t n_threads;        /* threads for steps; <= 0: all cores */
    int32_t n_threads_batch;  /* threads for prompt batches; <= 0: all cores */
    bool kv_f32;              /* KV caches in f32 (default f16) */
    bool no_weight_pack;      /* no packed weight copies (dfl_context_params.no_weight_pack) */
    bool async;               /* queues run on worker threads */
    dfl_device device;        /* default DFL_DEVICE_CPU */
    /* speculative decoding (read only with a drafter; docs/drafter.md) */
    int32_t n_draft;          /* draft tokens per step, 1..n_draft_max (block_size-1, or block_size for an
                               * anchor-first DSpark drafter); 0: n_draft_max */
    int32_t n_draft_min;      /* adaptive draft length from n_draft_min (0: always n_draft) */
    float draft_p_min;        /* drafter-probability cut (DSpark: confidence cut), in [0, 1]; 0: off */
    dfl_feature_path features;/* default DFL_FEATURES_DEVICE (falls back to host copies) */
    dfl_feature_wait wait;
    size_t feature_buffer_max;/* bytes; above it features go through host memory; 0: no cap */
    /* optional: an engine whose backend (thread pool or device queue owner) this one shares; it
     * must outlive this engine */
    const dfl_engine *share_backend;
    /* optional: replaces a sequence's drafts (tests, other drafting strategies; lossless) */
    void (*draft_hook)(void *user, int32_t seq, int32_t *draft, int32_t n_draft);
    void *draft_hook_user;
    /* optional: a reduced draft vocabulary (dfl_context_params.n_draft_vocab; lossless): the
     * drafter's head computes these n_draft_vocab ids (draft_vocab NULL: ids 0 .. n_draft_vocab
     * - 1, as a BPE vocabulary numbers its tokens in merge order, the commonest first) plus the
     * vocabulary's end-of-generation tokens; 0: the whole vocabulary */
    int32_t n_draft_vocab;
    const int32_t *draft_vocab;
} dfl_engine_params;

DFL_API dfl_engine_params dfl_engine_default_params(void);
/* Loads target_path (arch qwen3 or llama) with its vocabulary and drafter_path (arch dflash; NULL:
 * plain decoding). NULL + err on a load failure, a mismatched pair or a bad parameter. */
DFL_API dfl_engine *dfl_engine_new(const char *target_path, const char *drafter_path, const dfl_engine_params *params,
                           dfl_error *err);
/* The same over models already loaded (borrowed: they and vocab must outlive the engine). vocab
 * may be NULL: then there is no text output and no end-of-generation token. */
DFL_API dfl_engine *dfl_engine_new_from_models(dfl_model *target, dfl_model *drafter, const dfl_vocab *vocab,
                                       const dfl_engine_params *params, dfl_error *err);
DFL_API void dfl_engine_free(dfl_engine *engine);

DFL_API const dfl_vocab *dfl_engine_vocab(const dfl_engine *engine);   /* NULL if none */
DFL_API const dfl_model *dfl_engine_target(const dfl_engine *engine);
DFL_API const dfl_model *dfl_engine_drafter(const dfl_engine *engine); /* NULL: plain decoding */
DFL_API int32_t dfl_engine_n_seq(const dfl_engine *engine);
DFL_API int64_t dfl_engine_n_ctx(const dfl_engine *engine);
DFL_API int32_t dfl_engine_n_draft(const dfl_engine *engine);          /* 0: plain decoding */
/* "device", "host" (speculative) or "none" (plain), and why. */
DFL_API const char *dfl_engine_feature_path(const dfl_engine *engine);
DFL_API const char *dfl_engine_feature_note(const dfl_engine *engine);

typedef struct dfl_seq_params {
    dfl_sampler_params sampler;  /* default: greedy (temp 0), no penalties */
    int64_t max_tokens;          /* tokens to generate at most; <= 0: until the context is full */
    int32_t n_draft;             /* this sequence's draft length cap, 0..the engine's; 0: the engine's */
    const int32_t *stop_tokens;  /* extra token ids that end the generation (copied) */
    int32_t n_stop_tokens;
    const char *const *stop;     /* stop strings (copied; non-empty, at most 256 bytes each) */
    int32_t n_stop;              /* at most 16 */
    bool ignore_eos;             /* the vocabulary's end-of-generation tokens do not stop */
    bool special;                /* write the text of control tokens */
    /* > 0: dfl_engine_seq_start prefills at most this many prompt tokens, and every
     * dfl_engine_step prefills the next chunk (DFL_SEQ_PREFILL) until the prompt is in, so a
     * long prompt does not stall the other sequences' steps; 0: the whole prompt at start */
    int64_t prefill_chunk;
    /* log-probabilities of the generated tokens under the target's distribution (log-softmax of
     * its logits at temperature 1, before any sampling transform) and of the n_top_logprobs most
     * likely tokens at each position (0..20); greedy steps then return full logits */
    bool logprobs;
    int32_t n_top_logprobs;
} dfl_seq_params;

DFL_API dfl_seq_params dfl_seq_default_params(void);

typedef enum dfl_seq_state {
    DFL_SEQ_IDLE = 0,     /* never started, or reset */
    DFL_SEQ_ACTIVE = 1,   /* generating: advanced by dfl_engine_step */
    DFL_SEQ_FINISHED = 2, /* stopped (see dfl_finish_reason); its cache stays for prefix reuse */
    DFL_SEQ_PREFILL = 3,  /* its prompt is being prefilled chunk by chunk (dfl_engine_step) */
} dfl_seq_state;

typedef enum dfl_finish_reason {
    DFL_FINISH_NONE = 0,
    DFL_FINISH_STOP = 1,      /* an end-of-generation token, a stop token or a stop string */
    DFL_FINISH_LENGTH = 2,    /* max_tokens reached */
    DFL_FINISH_CTX = 3,       /* the context has no room for another step */
    DFL_FINISH_CANCELLED = 4, /* dfl_engine_seq_cancel */
} dfl_finish_reason;

/* What a sequence produced since its output was last read. */
typedef struct dfl_seq_output {
    dfl_seq_state state;
    dfl_finish_reason finish;
    const int32_t *tokens;    /* new tokens (a stop token is not included) */
    int64_t n_tokens;
    const char *text;         /* new text: valid UTF-8, never part of a stop string; NUL-terminated */
    size_t text_len;
    /* with dfl_seq_params.logprobs (else NULL): logprobs[i] of tokens[i]; top_ids / top_logprobs
     * [n_tokens, n_top]: the n_top most likely tokens at each position, most likely first */
    const float *logprobs;
    const int32_t *top_ids;
    const float *top_logprobs;
    int32_t n_top;
} dfl_seq_output;

typedef struct dfl_seq_stats {
    int64_t n_prompt;         /* tokens of the last prompt */
    int64_t n_reused;         /* of which taken from the cache (prefix reuse) */
    int64_t n_generated;      /* tokens generated (the stop token included) */
    int64_t n_steps;          /* steps taken (speculative or plain) */
    int64_t n_drafts;         /* steps that verified at least one draft */
    int64_t n_draft_tokens;   /* draft tokens verified */
    int64_t n_accepted;       /* draft tokens accepted */
    int64_t accepted_per_pos[DFL_MAX_DRAFT]; /* [j]: steps that accepted draft j (0-based) */
    double t_prefill_ms;      /* its prompt processing */
} dfl_seq_stats;

/* Engine totals since creation: the sum over all sequences plus the time split. */
typedef struct dfl_engine_stats {
    int64_t n_steps;          /* dfl_engine_step calls that ran a batch */
    int64_t n_prompt_tokens;  /* prompt tokens decoded (reused ones not counted) */
    int64_t n_generated;
    int64_t n_drafts, n_draft_tokens, n_accepted;
    int64_t accepted_per_pos[DFL_MAX_DRAFT];
    int64_t accept_hist[DFL_MAX_DRAFT + 1]; /* [k]: sequence steps that accepted exactly k drafts */
    double t_prefill_ms, t_step_ms;         /* wall time in prefills and steps */
    double t_draft_ms, t_verify_ms, t_inject_ms, t_other_ms; /* the speculative steps' split */
    uint64_t feature_host_bytes;            /* features copied through host memory */
    int64_t n_draft_nonfinite;              /* draft slots not verified: the drafter's logits were NaN/Inf */
} dfl_engine_stats;

/* Starts seq (idle or finished) on a prompt: decodes only the part after the longest prefix it
 * shares with what the sequence's cache holds (at least the last prompt token). Without a
 * drafter it then samples the first token (readable with dfl_engine_seq_read; the sequence may
 * already be finished); with a drafter the last prompt token is left for the first step, which
 * drafts from it and verifies (so the first tokens can be accepted drafts). With
 * params.prefill_chunk the prompt is prefilled over the next steps instead.
 * Errors (nothing changes): seq outside 0..n_seq-1, an active sequence, an empty prompt or a
 * token outside the vocabulary, a prompt that leaves no room to generate, parameter values
 * out of range (the message names the value and the limit). */
DFL_API dfl_status dfl_engine_seq_start(dfl_engine *engine, int32_t seq, const int32_t *prompt, int64_t n_prompt,
                                const dfl_seq_params *params, dfl_error *err);
/* Advances the n sequences seqs (seqs NULL: every active or prefilling sequence; none: nothing
 * to do): a prefilling sequence gets its next prompt chunk (and its first token with the last
 * chunk), the active ones one step together. Each listed sequence must be active or prefilling
 * and listed once; on such an error nothing changes. A sequence without room for the step
 * finishes with DFL_FINISH_CTX. */
DFL_API dfl_status dfl_engine_step(dfl_engine *engine, const int32_t *seqs, int32_t n, dfl_error *err);
/* Sequences active or prefilling now. */
DFL_API int32_t dfl_engine_n_active(const dfl_engine *engine);
/* Ends an active or prefilling sequence now (DFL_FINISH_CANCELLED; its held-back text is
 * dropped). A sequence that is idle or finished is left as it is. DFL_ERR_INVALID only for seq out of range. */
DFL_API dfl_status dfl_engine_seq_cancel(dfl_engine *engine, int32_t seq, dfl_error *err);
/* Forgets seq (cache, output, stats): idle. */
DFL_API dfl_status dfl_engine_seq_reset(dfl_engine *engine, int32_t seq, dfl_error *err);
/* The output of seq since the previous read (its pointers stay valid until the next call that
 * changes the engine). */
DFL_API dfl_status dfl_engine_seq_read(dfl_engine *engine, int32_t seq, dfl_seq_output *out, dfl_error *err);
DFL_API dfl_seq_state dfl_engine_seq_state(const dfl_engine *engine, int32_t seq);
DFL_API dfl_status dfl_engine_seq_stats(const dfl_engine *engine, int32_t seq, dfl_seq_stats *out, dfl_error *err);
DFL_API dfl_engine_stats dfl_engine_get_stats(const dfl_engine *engine);

#ifdef __cplusplus
}
#endif
#endif
