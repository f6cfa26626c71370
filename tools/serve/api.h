/* api.h: the OpenAI-shaped JSON of `dflash serve` (jansson): request bodies mapped to generation
 * parameters (every field checked for its type and range: a wrong one is a 400 naming the field),
 * and the response objects (completions, chat completions, their stream chunks, models, errors).
 * No I/O and no engine calls, so the mapping can be fuzzed on its own (tests/fuzz/fuzz_serve.c). */
#ifndef DFL_SERVE_API_H
#define DFL_SERVE_API_H

#include "dflash.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define API_MAX_STOP 16        /* stop strings per request (the engine's limit) */
#define API_MAX_STOP_LEN 256   /* bytes per stop string */
#define API_MAX_MESSAGES 4096

/* An error answer: HTTP status and the OpenAI error object's fields. */
typedef struct api_error {
    int status;
    const char *type;  /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code;  /* NULL: JSON null */
    const char *param; /* NULL: JSON null */
    char message[768];
} api_error;

void api_error_set(api_error *e, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {...}} as a malloc'ed NUL-terminated string (NULL when out of memory). */
char *api_error_json(const api_error *e);

/* A generation request. */
typedef struct api_gen {
    bool chat;               /* /v1/chat/completions (else /v1/completions) */
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    char *prompt;            /* text to tokenize (chat: the rendered template); NULL with prompt_tokens */
    int32_t *prompt_tokens;  /* completions given token ids */
    int64_t n_prompt_tokens;
    int64_t max_tokens;      /* 0: not given (up to the context) */
    dfl_sampler_params sampler;
    bool has_seed;
    char *stop[API_MAX_STOP];
    int32_t n_stop;
    bool ignore_eos;         /* llama-server's extension: end-of-generation tokens do not stop */
    bool logprobs;           /* chat: logprobs true; completions: logprobs given (an integer) */
    int32_t top_logprobs;    /* alternatives per position (chat: top_logprobs; completions: logprobs), 0..20 */
    char model[256];         /* as asked ("" if absent) */
} api_gen;

/* Parses a body of /v1/completions (chat = false) or /v1/chat/completions (chat = true). vocab
 * renders chat messages with the model's template (NULL: the plain ChatML markers); defaults: the
 * sampler settings of fields the request leaves out. 0 ok; -1 with err filled (out then holds
 * nothing to free). Unknown fields are ignored. */
int api_parse_gen(const char *body, size_t len, bool chat, const dfl_vocab *vocab, const dfl_sampler_params *defaults,
                  api_gen *out, api_error *err);
void api_gen_free(api_gen *g);

/* /tokenize: {"content": string, "add_special": bool, "with_pieces": bool}. content is malloc'ed. */
int api_parse_tokenize(const char *body, size_t len, char **content, bool *add_special, bool *with_pieces,
                       api_error *err);
/* /detokenize: {"tokens": [int...]}. tokens malloc'ed (NULL when empty). */
int api_parse_detokenize(const char *body, size_t len, int32_t **tokens, int64_t *n_tokens, api_error *err);

/* What a response object needs besides the text. */
typedef struct api_ids {
    char id[48];             /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;         /* unix seconds */
    const char *model;
    bool chat;
} api_ids;

typedef struct api_usage {
    int64_t prompt_tokens, completion_tokens, cached_tokens;
    /* our `timings` */
    double prompt_ms, predicted_ms, ttft_ms;
    int64_t n_steps, n_drafts, n_draft_tokens, n_accepted;
} api_usage;

/* Log-probabilities of generated tokens, gathered for one response or one stream chunk, in the
 * chat shape ({"content": [{token, logprob, bytes, top_logprobs}]}) or the completions shape
 * ({tokens, token_logprobs, top_logprobs, text_offset}). */
typedef struct api_lp api_lp;
api_lp *api_lp_new(bool chat);
void api_lp_free(api_lp *lp);
/* Appends n tokens with their log-probabilities and n_top alternatives each ([n, n_top]). */
void api_lp_add(api_lp *lp, const dfl_vocab *vocab, const int32_t *tokens, int64_t n, const float *logprobs,
                const int32_t *top_ids, const float *top_logprobs, int32_t n_top);

/* "stop", "length" or NULL (JSON null) for the finish reason enum values. */
const char *api_finish_name(dfl_finish_reason f);

/* Whole (non-streamed) response. */
char *api_response_json(const api_ids *ids, const char *text, size_t text_len, const char *finish,
                        const api_usage *u, const api_lp *lp);
/* One stream chunk: text delta (role: the chat's first chunk carries the assistant role), or the
 * finish chunk (finish != NULL, empty delta), with "usage": null when include_usage; lp: the
 * delta's log-probabilities (NULL: "logprobs": null). */
char *api_chunk_json(const api_ids *ids, bool role, const char *text, size_t text_len, const char *finish,
                     bool include_usage, const api_lp *lp);
/* The final usage chunk ("choices": []). */
char *api_usage_chunk_json(const api_ids *ids, const api_usage *u);
/* /tokenize's answer: {"tokens": [ids]} or, with pieces, [{"id": N, "piece": string, or the bytes
 * as an array of ints where the piece is not valid UTF-8 on its own}]. */
char *api_tokens_json(const dfl_vocab *vocab, const int32_t *tokens, int64_t n, bool with_pieces);
/* {"content": text} (text must be valid UTF-8). */
char *api_content_json(const char *text, size_t len);
/* GET /v1/models (one model) and /v1/models/{id}. */
char *api_models_json(const char *model, int64_t created, bool list);

#endif
