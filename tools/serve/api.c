/* api.c: OpenAI request mapping and response objects for `dflash serve` (see api.h). */
#include "api.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Replaces every byte of s that is not part of a well-formed UTF-8 sequence (overlong forms,
 * surrogates and code points above U+10FFFF included) by '?', in place: an error message may
 * quote the client's bytes (a JSON parser's "near '...'"), or be cut inside a character, and
 * jansson refuses to serialize invalid UTF-8. */
static void utf8_sanitize(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p != 0) {
        const unsigned c = p[0];
        int n = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        bool ok = n > 0;
        for (int k = 1; ok && k < n; k++) ok = (p[k] & 0xC0) == 0x80;
        if (ok && n == 3) {
            ok = !(c == 0xE0 && p[1] < 0xA0) && !(c == 0xED && p[1] >= 0xA0); /* overlong, surrogate */
        } else if (ok && n == 4) {
            ok = !(c == 0xF0 && p[1] < 0x90) && !(c == 0xF4 && p[1] >= 0x90); /* overlong, > U+10FFFF */
        }
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

void api_error_set(api_error *e, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    utf8_sanitize(e->message);
}

static json_t *str_or_null(const char *s) {
    return s != NULL ? json_string(s) : json_null();
}

char *api_error_json(const api_error *e) {
    json_t *o = json_pack("{s:{s:s%, s:s, s:o, s:o}}", "error", "message", e->message, strlen(e->message),
                          "type", e->type ? e->type : "server_error", "param", str_or_null(e->param), "code",
                          str_or_null(e->code));
    if (o == NULL) return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

#define BAD(param, ...)                                                                   \
    do {                                                                                  \
        api_error_set(err, 400, "invalid_request_error", NULL, param, __VA_ARGS__);       \
        goto fail;                                                                        \
    } while (0)

static json_t *load_object(const char *body, size_t len, api_error *err) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        api_error_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                      "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        api_error_set(err, 400, "invalid_request_error", "invalid_json", NULL, "the request body must be a JSON object");
        json_decref(root);
        return NULL;
    }
    return root;
}

/* A field that is absent or null counts as not given. */
static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* Number field in [lo, hi]; returns 0 absent, 1 set, -1 error (err filled). */
static int get_num(json_t *o, const char *key, double lo, double hi, double *out, api_error *err) {
    json_t *v = field(o, key);
    if (v == NULL) return 0;
    if (!json_is_number(v)) {
        api_error_set(err, 400, "invalid_request_error", NULL, key, "'%s' must be a number", key);
        return -1;
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        api_error_set(err, 400, "invalid_request_error", NULL, key, "'%s' is %g; it must be in [%g, %g]", key, d, lo,
                      hi);
        return -1;
    }
    *out = d;
    return 1;
}

static int get_int(json_t *o, const char *key, json_int_t lo, json_int_t hi, json_int_t *out, api_error *err) {
    json_t *v = field(o, key);
    if (v == NULL) return 0;
    if (!json_is_integer(v)) {
        api_error_set(err, 400, "invalid_request_error", NULL, key, "'%s' must be an integer", key);
        return -1;
    }
    json_int_t d = json_integer_value(v);
    if (d < lo || d > hi) {
        api_error_set(err, 400, "invalid_request_error", NULL, key, "'%s' is %lld; it must be in [%lld, %lld]", key,
                      (long long)d, (long long)lo, (long long)hi);
        return -1;
    }
    *out = d;
    return 1;
}

static int get_bool(json_t *o, const char *key, bool *out, api_error *err) {
    json_t *v = field(o, key);
    if (v == NULL) return 0;
    if (!json_is_boolean(v)) {
        api_error_set(err, 400, "invalid_request_error", NULL, key, "'%s' must be a boolean", key);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d == NULL) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Concatenated text of a message's content: a string, or an array of {"type":"text","text":...}
 * parts. Returns malloc'ed text or NULL with err filled. */
static char *content_text(json_t *c, size_t idx, api_error *err) {
    if (c == NULL) return dup_n("", 0);
    if (json_is_string(c)) {
        if (memchr(json_string_value(c), '\0', json_string_length(c)) != NULL) {
            api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                          "messages[%zu].content contains a NUL character", idx);
            return NULL;
        }
        return dup_n(json_string_value(c), json_string_length(c));
    }
    if (!json_is_array(c)) {
        api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                      "messages[%zu].content must be a string or an array of text parts", idx);
        return NULL;
    }
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") != 0 ||
            !json_is_string(tx)) {
            api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                          "messages[%zu].content[%zu] must be {\"type\": \"text\", \"text\": string} (only text is "
                          "supported)", idx, i);
            return NULL;
        }
        if (memchr(json_string_value(tx), '\0', json_string_length(tx)) != NULL) {
            api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                          "messages[%zu].content[%zu] contains a NUL character", idx, i);
            return NULL;
        }
        total += json_string_length(tx);
    }
    char *out = malloc(total + 1), *p = out;
    if (out == NULL) {
        api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    json_array_foreach(c, i, part) {
        json_t *tx = json_object_get(part, "text");
        memcpy(p, json_string_value(tx), json_string_length(tx));
        p += json_string_length(tx);
    }
    *p = '\0';
    return out;
}

static int parse_messages(json_t *root, const dfl_vocab *vocab, api_gen *g, bool enable_thinking, api_error *err) {
    json_t *msgs = field(root, "messages");
    if (msgs == NULL) {
        api_error_set(err, 400, "invalid_request_error", NULL, "messages", "'messages' is required");
        return -1;
    }
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        api_error_set(err, 400, "invalid_request_error", NULL, "messages", "'messages' must be a non-empty array");
        return -1;
    }
    const size_t n = json_array_size(msgs);
    if (n > API_MAX_MESSAGES) {
        api_error_set(err, 400, "invalid_request_error", NULL, "messages", "more than %d messages",
                      API_MAX_MESSAGES);
        return -1;
    }
    dfl_chat_msg *cm = calloc(n, sizeof(*cm));
    char **owned = calloc(2 * n, sizeof(char *));
    int rc = -1;
    char *buf = NULL;
    if (cm == NULL || owned == NULL) {
        api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) {
            api_error_set(err, 400, "invalid_request_error", NULL, "messages", "messages[%zu] must be an object", i);
            goto done;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            api_error_set(err, 400, "invalid_request_error", NULL, "messages", "messages[%zu].role must be a string",
                          i);
            goto done;
        }
        const char *r = json_string_value(role);
        if (strcmp(r, "developer") == 0) r = "system";
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 &&
            strcmp(r, "tool") != 0) {
            api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                          "messages[%zu].role '%.64s' is not one of system, developer, user, assistant, tool", i,
                          json_string_value(role));
            goto done;
        }
        json_t *content = field(m, "content");
        if (content == NULL && strcmp(r, "assistant") != 0) {
            api_error_set(err, 400, "invalid_request_error", NULL, "messages", "messages[%zu].content is required", i);
            goto done;
        }
        owned[2 * i] = content_text(content, i, err);
        if (owned[2 * i] == NULL) goto done;
        cm[i].role = r;
        cm[i].content = owned[2 * i];
        json_t *rc_ = field(m, "reasoning_content");
        if (rc_ != NULL) {
            owned[2 * i + 1] = content_text(rc_, i, err);
            if (owned[2 * i + 1] == NULL) goto done;
            cm[i].reasoning_content = owned[2 * i + 1];
        }
    }
    dfl_error derr = {0};
    int64_t need = dfl_chat_render(vocab, cm, n, true, enable_thinking, NULL, 0, &derr);
    if (need == DFL_VOCAB_FAIL) {
        api_error_set(err, 400, "invalid_request_error", NULL, "messages", "chat template: %s", derr.msg);
        goto done;
    }
    size_t cap = (size_t)(need < 0 ? -need : need + 1);
    buf = malloc(cap);
    if (buf == NULL) {
        api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    if (dfl_chat_render(vocab, cm, n, true, enable_thinking, buf, cap, &derr) < 0) {
        api_error_set(err, 500, "server_error", NULL, NULL, "chat template: %s", derr.msg);
        goto done;
    }
    g->prompt = buf;
    buf = NULL;
    rc = 0;
done:
    if (owned != NULL) {
        for (size_t i = 0; i < 2 * n; i++) free(owned[i]);
    }
    free(owned);
    free(cm);
    free(buf);
    return rc;
}

static int parse_prompt(json_t *root, api_gen *g, api_error *err) {
    json_t *p = field(root, "prompt");
    if (p == NULL) {
        api_error_set(err, 400, "invalid_request_error", NULL, "prompt", "'prompt' is required");
        return -1;
    }
    /* a one-element array is the same as its element */
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) {
            api_error_set(err, 400, "invalid_request_error", NULL, "prompt", "'prompt' is empty");
            return -1;
        }
        g->prompt = dup_n(json_string_value(p), json_string_length(p));
        if (g->prompt == NULL) {
            api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        return 0;
    }
    if (json_is_array(p) && json_array_size(p) > 0) {
        const size_t n = json_array_size(p);
        g->prompt_tokens = malloc(n * sizeof(int32_t));
        if (g->prompt_tokens == NULL) {
            api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_array_get(p, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
                api_error_set(err, 400, "invalid_request_error", NULL, "prompt",
                              "'prompt' must be a string, or an array of token ids (one prompt: batches of prompts "
                              "are not supported); element %zu is not a token id", i);
                return -1;
            }
            g->prompt_tokens[i] = (int32_t)json_integer_value(t);
        }
        g->n_prompt_tokens = (int64_t)n;
        return 0;
    }
    api_error_set(err, 400, "invalid_request_error", NULL, "prompt",
                  "'prompt' must be a non-empty string or array of token ids");
    return -1;
}

static int parse_stop(json_t *root, api_gen *g, api_error *err) {
    json_t *s = field(root, "stop");
    if (s == NULL) return 0;
    json_t *one[1] = {s};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(s)) {
        n = json_array_size(s);
        items = NULL;
    } else if (!json_is_string(s)) {
        api_error_set(err, 400, "invalid_request_error", NULL, "stop", "'stop' must be a string or an array of strings");
        return -1;
    }
    if (n > API_MAX_STOP) {
        api_error_set(err, 400, "invalid_request_error", NULL, "stop", "'stop' has %zu strings; at most %d", n,
                      API_MAX_STOP);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = items ? items[i] : json_array_get(s, i);
        if (!json_is_string(v)) {
            api_error_set(err, 400, "invalid_request_error", NULL, "stop", "'stop' must be a string or an array of strings");
            return -1;
        }
        const size_t len = json_string_length(v);
        if (len == 0 || len > API_MAX_STOP_LEN || memchr(json_string_value(v), '\0', len) != NULL) {
            api_error_set(err, 400, "invalid_request_error", NULL, "stop",
                          "stop strings must be 1..%d bytes without NUL (stop[%zu] has %zu)", API_MAX_STOP_LEN, i, len);
            return -1;
        }
        g->stop[g->n_stop] = dup_n(json_string_value(v), len);
        if (g->stop[g->n_stop] == NULL) {
            api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        g->n_stop++;
    }
    return 0;
}

int api_parse_gen(const char *body, size_t len, bool chat, const dfl_vocab *vocab, const dfl_sampler_params *defaults,
                  api_gen *g, api_error *err) {
    memset(g, 0, sizeof(*g));
    g->chat = chat;
    g->sampler = defaults != NULL ? *defaults : dfl_sampler_default_params();
    json_t *root = load_object(body, len, err);
    if (root == NULL) return -1;
    double d;
    json_int_t iv;
    bool b;
    json_t *v;
    if ((v = field(root, "model")) != NULL) {
        if (!json_is_string(v)) BAD("model", "'model' must be a string");
        snprintf(g->model, sizeof(g->model), "%s", json_string_value(v));
    }
    if (get_bool(root, "stream", &g->stream, err) < 0) goto fail;
    if (get_bool(root, "ignore_eos", &g->ignore_eos, err) < 0) goto fail;
    if ((v = field(root, "stream_options")) != NULL) {
        if (!json_is_object(v)) BAD("stream_options", "'stream_options' must be an object");
        if (get_bool(v, "include_usage", &g->include_usage, err) < 0) goto fail;
    }
    /* max_completion_tokens (chat) wins over the older max_tokens */
    int r = get_int(root, "max_completion_tokens", 1, INT32_MAX, &iv, err);
    if (r < 0) goto fail;
    if (r == 0) {
        r = get_int(root, "max_tokens", 1, INT32_MAX, &iv, err);
        if (r < 0) goto fail;
    }
    if (r == 1) g->max_tokens = iv;
    if ((r = get_num(root, "temperature", 0, 2, &d, err)) < 0) goto fail;
    if (r) g->sampler.temp = (float)d;
    if ((r = get_num(root, "top_p", 0, 1, &d, err)) < 0) goto fail;
    if (r) g->sampler.top_p = (float)d;
    if ((r = get_int(root, "top_k", 0, INT32_MAX, &iv, err)) < 0) goto fail;
    if (r) g->sampler.top_k = (int32_t)iv;
    if ((r = get_num(root, "min_p", 0, 1, &d, err)) < 0) goto fail;
    if (r) g->sampler.min_p = (float)d;
    if ((r = get_num(root, "presence_penalty", -2, 2, &d, err)) < 0) goto fail;
    if (r) g->sampler.presence_penalty = (float)d;
    if ((r = get_num(root, "frequency_penalty", -2, 2, &d, err)) < 0) goto fail;
    if (r) g->sampler.frequency_penalty = (float)d;
    if ((r = get_num(root, "repetition_penalty", 1e-3, 100, &d, err)) < 0) goto fail;
    if (r) g->sampler.repeat_penalty = (float)d;
    if ((r = get_int(root, "seed", INT64_MIN, INT64_MAX, &iv, err)) < 0) goto fail;
    if (r) {
        g->sampler.seed = (uint64_t)iv;
        g->has_seed = true;
    }
    if ((r = get_int(root, "n", 1, 128, &iv, err)) < 0) goto fail;
    if (r && iv != 1) BAD("n", "'n' is %lld; only n = 1 is supported", (long long)iv);
    if (chat) {
        if (get_bool(root, "logprobs", &g->logprobs, err) < 0) goto fail;
        if ((r = get_int(root, "top_logprobs", 0, 20, &iv, err)) < 0) goto fail;
        if (r && !g->logprobs) BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (r) g->top_logprobs = (int32_t)iv;
    } else {
        if ((r = get_int(root, "logprobs", 0, 5, &iv, err)) < 0) goto fail;
        if (r) {
            g->logprobs = true;
            g->top_logprobs = (int32_t)iv;
        }
        b = false;
        if (get_bool(root, "echo", &b, err) < 0) goto fail;
        if (b) BAD("echo", "echo is not supported by this server");
        if ((v = field(root, "suffix")) != NULL && !(json_is_string(v) && json_string_length(v) == 0))
            BAD("suffix", "suffix is not supported by this server");
        if ((r = get_int(root, "best_of", 1, 128, &iv, err)) < 0) goto fail;
        if (r && iv != 1) BAD("best_of", "only best_of = 1 is supported");
    }
    if (parse_stop(root, g, err) < 0) goto fail;
    if (chat) {
        bool thinking = false;
        if ((v = field(root, "chat_template_kwargs")) != NULL) {
            if (!json_is_object(v)) BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
            if (get_bool(v, "enable_thinking", &thinking, err) < 0) goto fail;
        }
        if (parse_messages(root, vocab, g, thinking, err) < 0) goto fail;
    } else {
        if (parse_prompt(root, g, err) < 0) goto fail;
    }
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    api_gen_free(g);
    return -1;
}

void api_gen_free(api_gen *g) {
    free(g->prompt);
    free(g->prompt_tokens);
    for (int32_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    memset(g, 0, sizeof(*g));
}

int api_parse_tokenize(const char *body, size_t len, char **content, bool *add_special, bool *with_pieces,
                       api_error *err) {
    *content = NULL;
    *add_special = false;
    *with_pieces = false;
    json_t *root = load_object(body, len, err);
    if (root == NULL) return -1;
    json_t *c = field(root, "content");
    if (!json_is_string(c)) BAD("content", "'content' must be a string");
    if (get_bool(root, "add_special", add_special, err) < 0) goto fail;
    if (get_bool(root, "with_pieces", with_pieces, err) < 0) goto fail;
    *content = dup_n(json_string_value(c), json_string_length(c));
    if (*content == NULL) {
        api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    json_decref(root);
    return (int)0;
fail:
    json_decref(root);
    return -1;
}

int api_parse_detokenize(const char *body, size_t len, int32_t **tokens, int64_t *n_tokens, api_error *err) {
    *tokens = NULL;
    *n_tokens = 0;
    json_t *root = load_object(body, len, err);
    if (root == NULL) return -1;
    json_t *a = field(root, "tokens");
    if (!json_is_array(a)) BAD("tokens", "'tokens' must be an array of token ids");
    const size_t n = json_array_size(a);
    if (n > 0) {
        *tokens = malloc(n * sizeof(int32_t));
        if (*tokens == NULL) {
            api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
            free(*tokens);
            *tokens = NULL;
            BAD("tokens", "tokens[%zu] is not a token id", i);
        }
        (*tokens)[i] = (int32_t)json_integer_value(t);
    }
    *n_tokens = (int64_t)n;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    return -1;
}

const char *api_finish_name(dfl_finish_reason f) {
    switch (f) {
    case DFL_FINISH_STOP: return "stop";
    case DFL_FINISH_LENGTH:
    case DFL_FINISH_CTX: return "length";
    default: return NULL;
    }
}

static char *dump(json_t *o) {
    if (o == NULL) return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* A JSON string of the bytes, invalid UTF-8 replaced by U+FFFD (a token may end inside a
 * character). */
static json_t *lossy_string(const char *p, size_t n) {
    json_t *j = json_stringn(p, n);
    if (j != NULL) return j;
    char *o = malloc(n * 3 + 1);
    if (o == NULL) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)p[i];
        const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len > 0 && i + len <= n) {
            json_t *t = json_stringn(p + i, len);
            if (t != NULL) {
                json_decref(t);
                memcpy(o + k, p + i, len);
                k += len;
                i += len;
                continue;
            }
        }
        memcpy(o + k, "\xEF\xBF\xBD", 3);
        k += 3;
        i++;
    }
    j = json_stringn(o, k);
    free(o);
    return j;
}

struct api_lp {
    bool chat;
    json_t *content;                            /* chat: [{token, logprob, bytes, top_logprobs}] */
    json_t *tokens, *token_lps, *tops, *offsets; /* completions */
    int64_t offset;                             /* completions: bytes of text so far */
};

api_lp *api_lp_new(bool chat) {
    api_lp *lp = calloc(1, sizeof(*lp));
    if (lp == NULL) return NULL;
    lp->chat = chat;
    lp->content = json_array();
    lp->tokens = json_array();
    lp->token_lps = json_array();
    lp->tops = json_array();
    lp->offsets = json_array();
    return lp;
}

void api_lp_free(api_lp *lp) {
    if (lp == NULL) return;
    json_decref(lp->content);
    json_decref(lp->tokens);
    json_decref(lp->token_lps);
    json_decref(lp->tops);
    json_decref(lp->offsets);
    free(lp);
}

/* -inf is not JSON: OpenAI reports -9999 for tokens the model gives no probability */
static double finite_lp(float v) {
    return isfinite(v) ? (double)v : -9999.0;
}

static json_t *token_entry(const dfl_vocab *vocab, int32_t tok, float logprob, size_t *n_bytes) {
    char piece[256];
    int64_t pl = dfl_token_to_piece(vocab, tok, piece, sizeof(piece), true);
    if (pl < 0) pl = 0;
    json_t *bytes = json_array();
    for (int64_t k = 0; k < pl; k++) json_array_append_new(bytes, json_integer((unsigned char)piece[k]));
    if (n_bytes != NULL) *n_bytes = (size_t)pl;
    return json_pack("{s:o, s:f, s:o}", "token", lossy_string(piece, (size_t)pl), "logprob", finite_lp(logprob),
                     "bytes", bytes);
}

void api_lp_add(api_lp *lp, const dfl_vocab *vocab, const int32_t *tokens, int64_t n, const float *logprobs,
                const int32_t *top_ids, const float *top_logprobs, int32_t n_top) {
    if (lp == NULL || logprobs == NULL) return;
    for (int64_t i = 0; i < n; i++) {
        size_t nb = 0;
        json_t *e = token_entry(vocab, tokens[i], logprobs[i], &nb);
        if (lp->chat) {
            json_t *tops = json_array();
            for (int32_t k = 0; k < n_top && top_ids != NULL; k++) {
                json_array_append_new(tops, token_entry(vocab, top_ids[i * n_top + k], top_logprobs[i * n_top + k],
                                                        NULL));
            }
            json_object_set_new(e, "top_logprobs", tops);
            json_array_append_new(lp->content, e);
            continue;
        }
        json_array_append(lp->tokens, json_object_get(e, "token"));
        json_array_append_new(lp->token_lps, json_real(finite_lp(logprobs[i])));
        json_t *tops = json_object();
        for (int32_t k = 0; k < n_top && top_ids != NULL; k++) {
            json_t *te = token_entry(vocab, top_ids[i * n_top + k], top_logprobs[i * n_top + k], NULL);
            json_t *tt = json_object_get(te, "token");
            if (json_is_string(tt)) json_object_set_new(tops, json_string_value(tt), json_real(finite_lp(top_logprobs[i * n_top + k])));
            json_decref(te);
        }
        json_array_append_new(lp->tops, tops);
        json_array_append_new(lp->offsets, json_integer(lp->offset));
        lp->offset += (int64_t)nb;
        json_decref(e);
    }
}

static json_t *lp_json(const api_lp *lp) {
    if (lp == NULL) return json_null();
    if (lp->chat) return json_pack("{s:O, s:n}", "content", lp->content, "refusal");
    return json_pack("{s:O, s:O, s:O, s:O}", "tokens", lp->tokens, "token_logprobs", lp->token_lps, "top_logprobs",
                     lp->tops, "text_offset", lp->offsets);
}

static json_t *usage_obj(const api_usage *u) {
    const double tau = u->n_steps > 0 ? (double)(u->n_accepted + u->n_steps) / (double)u->n_steps : 0.0;
    const double tps = u->predicted_ms > 0 ? (double)u->completion_tokens / (u->predicted_ms / 1e3) : 0.0;
    const double pps = u->prompt_ms > 0 ? (double)(u->prompt_tokens - u->cached_tokens) / (u->prompt_ms / 1e3) : 0.0;
    return json_pack("{s:I, s:I, s:I, s:{s:I}, s:{s:I, s:f, s:f, s:I, s:f, s:f, s:f, s:I, s:I, s:I, s:f}}",
                     "prompt_tokens", (json_int_t)u->prompt_tokens, "completion_tokens",
                     (json_int_t)u->completion_tokens, "total_tokens",
                     (json_int_t)(u->prompt_tokens + u->completion_tokens), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)u->cached_tokens, "timings", "prompt_n",
                     (json_int_t)(u->prompt_tokens - u->cached_tokens), "prompt_ms", u->prompt_ms,
                     "prompt_per_second", pps, "predicted_n", (json_int_t)u->completion_tokens, "predicted_ms",
                     u->predicted_ms, "predicted_per_second", tps, "ttft_ms", u->ttft_ms, "steps",
                     (json_int_t)u->n_steps, "draft_n", (json_int_t)u->n_draft_tokens, "draft_n_accepted",
                     (json_int_t)u->n_accepted, "tau", tau);
}

/* The timings live inside usage while building (one pack); OpenAI's usage has no timings, so
 * move them to the top level. */
static void hoist_timings(json_t *resp, json_t *usage) {
    json_t *t = json_object_get(usage, "timings");
    if (t != NULL) {
        json_object_set(resp, "timings", t);
        json_object_del(usage, "timings");
    }
}

char *api_response_json(const api_ids *ids, const char *text, size_t text_len, const char *finish,
                        const api_usage *u, const api_lp *lp) {
    json_t *choice = ids->chat
        ? json_pack("{s:i, s:{s:s, s:s%}, s:o, s:o}", "index", 0, "message", "role", "assistant", "content", text,
                    text_len, "logprobs", lp_json(lp), "finish_reason", str_or_null(finish))
        : json_pack("{s:i, s:s%, s:o, s:o}", "index", 0, "text", text, text_len, "logprobs", lp_json(lp),
                    "finish_reason", str_or_null(finish));
    json_t *usage = usage_obj(u);
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", ids->id, "object",
                          ids->chat ? "chat.completion" : "text_completion", "created", (json_int_t)ids->created,
                          "model", ids->model, "choices", choice, "usage", usage);
    if (o != NULL) hoist_timings(o, usage);
    return dump(o);
}

char *api_chunk_json(const api_ids *ids, bool role, const char *text, size_t text_len, const char *finish,
                     bool include_usage, const api_lp *lp) {
    json_t *choice;
    if (ids->chat) {
        json_t *delta = json_object();
        if (delta != NULL && role) json_object_set_new(delta, "role", json_string("assistant"));
        if (delta != NULL && finish == NULL) json_object_set_new(delta, "content", json_stringn(text, text_len));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs", lp_json(lp),
                           "finish_reason", str_or_null(finish));
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:o}", "index", 0, "text", finish ? "" : text, finish ? 0 : text_len,
                           "logprobs", lp_json(lp), "finish_reason", str_or_null(finish));
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", ids->id, "object",
                          ids->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)ids->created,
                          "model", ids->model, "choices", choice);
    if (o != NULL && include_usage) json_object_set_new(o, "usage", json_null());
    return dump(o);
}

char *api_usage_chunk_json(const api_ids *ids, const api_usage *u) {
    json_t *usage = usage_obj(u);
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", ids->id, "object",
                          ids->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)ids->created,
                          "model", ids->model, "choices", "usage", usage);
    if (o != NULL) hoist_timings(o, usage);
    return dump(o);
}

char *api_tokens_json(const dfl_vocab *vocab, const int32_t *tokens, int64_t n, bool with_pieces) {
    json_t *arr = json_array();
    for (int64_t i = 0; arr != NULL && i < n; i++) {
        if (!with_pieces) {
            json_array_append_new(arr, json_integer(tokens[i]));
            continue;
        }
        char piece[256];
        int64_t pl = dfl_token_to_piece(vocab, tokens[i], piece, sizeof(piece), true);
        if (pl < 0) pl = 0; /* longer than 256 bytes or invalid: not expected from the tokenizer */
        json_t *ps = json_stringn(piece, (size_t)pl);
        if (ps == NULL) {
            ps = json_array();
            for (int64_t k = 0; k < pl; k++) json_array_append_new(ps, json_integer((unsigned char)piece[k]));
        }
        json_array_append_new(arr, json_pack("{s:i, s:o}", "id", tokens[i], "piece", ps));
    }
    return dump(json_pack("{s:o}", "tokens", arr));
}

char *api_content_json(const char *text, size_t len) {
    return dump(json_pack("{s:s%}", "content", text, len));
}

char *api_models_json(const char *model, int64_t created, bool list) {
    json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", model, "object", "model", "created", (json_int_t)created,
                          "owned_by", "dflash");
    if (!list) return dump(m);
    return dump(json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}
