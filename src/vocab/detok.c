/* detok.c: tokens back to bytes (dfl_token_to_piece, dfl_detokenize) and the streaming
 * detokenizer, which emits only valid UTF-8: it holds back the bytes of a sequence that is still
 * incomplete, and replaces each maximal ill-formed subpart with U+FFFD (the WHATWG decoder's rule),
 * so the stream equals TextDecoder('utf-8').decode() of all the bytes. */
#include "vocab/unicode.h"
#include "vocab/vocab.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* the bytes a token renders to (empty for control/unused tokens unless special) */
static const uint8_t *piece_of(const dfl_vocab *v, int32_t token, bool special, size_t *len) {
    const uint8_t *s = vocab_text(v, token, len);
    uint8_t t = v->types[token];
    if (t != DFL_TOKEN_TYPE_NORMAL && t != DFL_TOKEN_TYPE_USER_DEFINED && !special) *len = 0;
    return s;
}

int64_t dfl_token_to_piece(const dfl_vocab *vocab, int32_t token, char *buf, size_t cap, bool special) {
    if (vocab == NULL || token < 0 || token >= vocab->n_tokens || (buf == NULL && cap > 0)) return DFL_VOCAB_FAIL;
    size_t n;
    const uint8_t *s = piece_of(vocab, token, special, &n);
    if (n > cap) return -(int64_t)n;
    if (n > 0) memcpy(buf, s, n);
    return (int64_t)n;
}

int64_t dfl_detokenize(const dfl_vocab *vocab, const int32_t *tokens, int64_t n_tokens, char *buf, size_t cap,
                       bool special) {
    if (vocab == NULL || n_tokens < 0 || (tokens == NULL && n_tokens > 0) || (buf == NULL && cap > 0)) {
        return DFL_VOCAB_FAIL;
    }
    size_t total = 0;
    for (int64_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab->n_tokens) return DFL_VOCAB_FAIL;
        size_t n;
        const uint8_t *s = piece_of(vocab, tokens[i], special, &n);
        if (total + n <= cap && n > 0) memcpy(buf + total, s, n);
        total += n;
    }
    return total <= cap ? (int64_t)total : -(int64_t)total;
}

/* ---- streaming ------------------------------------------------------------------------------ */

struct dfl_detok {
    const dfl_vocab *vocab;
    bool special;
    uint8_t pending[4];   /* an incomplete UTF-8 sequence held back */
    size_t n_pending;
    uint8_t *in;          /* [max_token_len + 4] pending + the new piece */
    uint8_t *out;         /* [3 * (max_token_len + 4)] the text handed out */
};

dfl_detok *dfl_detok_new(const dfl_vocab *vocab, bool special, dfl_error *err) {
    error_clear(err);
    if (vocab == NULL) {
        error_set(err, DFL_ERR_INVALID, "detokenizer: no vocabulary");
        return NULL;
    }
    dfl_detok *d = calloc(1, sizeof(dfl_detok));
    size_t cap = vocab->max_token_len + 4;
    if (d != NULL) {
        d->in = malloc(cap);
        d->out = malloc(3 * cap);
    }
    if (d == NULL || d->in == NULL || d->out == NULL) {
        dfl_detok_free(d);
        error_set(err, DFL_ERR_NOMEM, "detokenizer: out of memory");
        return NULL;
    }
    d->vocab = vocab;
    d->special = special;
    return d;
}

void dfl_detok_free(dfl_detok *d) {
    if (d == NULL) return;
    free(d->in);
    free(d->out);
    free(d);
}

static const uint8_t k_replacement[3] = {0xEF, 0xBF, 0xBD};

dfl_status dfl_detok_push(dfl_detok *d, int32_t token, const char **text, size_t *len) {
    *text = (const char *)d->out;
    *len = 0;
    if (token < 0 || token >= d->vocab->n_tokens) return DFL_ERR_INVALID;
    size_t n;
    const uint8_t *s = piece_of(d->vocab, token, d->special, &n);
    memcpy(d->in, d->pending, d->n_pending);
    memcpy(d->in + d->n_pending, s, n);
    n += d->n_pending;
    d->n_pending = 0;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l;
        utf8_status st = utf8_decode(d->in + i, n - i, &cp, &l);
        if (st == UTF8_OK) {
            memcpy(d->out + o, d->in + i, l);
            o += l;
        } else if (st == UTF8_TRUNCATED) {
            memcpy(d->pending, d->in + i, l); /* wait for the rest */
            d->n_pending = l;
        } else {
            memcpy(d->out + o, k_replacement, 3);
            o += 3;
        }
        i += l;
    }
    *len = o;
    return DFL_OK;
}

void dfl_detok_flush(dfl_detok *d, const char **text, size_t *len) {
    *text = (const char *)d->out;
    *len = 0;
    if (d->n_pending > 0) {
        memcpy(d->out, k_replacement, 3);
        *len = 3;
    }
    d->n_pending = 0;
}
