/* stop_text.c: stop strings held back until they can no longer match (see stop_text.h). The
 * held text is always the longest suffix of the stream that is a proper prefix of some stop
 * string, so every possible match starts inside it: searching held + new text finds the first
 * match of the whole stream. */
#include "engine/stop_text.h"

#include <stdlib.h>
#include <string.h>

bool text_buf_append(text_buf *b, const char *s, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + len + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) return false;
        b->p = p;
        b->cap = cap;
    }
    if (len > 0) memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
    return true;
}

void text_buf_free(text_buf *b) {
    free(b->p);
    memset(b, 0, sizeof(*b));
}

void stop_text_free(stop_text *st) {
    for (int32_t i = 0; i < st->n_stop; i++) free(st->stop[i]);
    st->n_stop = 0;
    text_buf_free(&st->held);
}

bool stop_text_set(stop_text *st, const char *const *stop, int32_t n_stop) {
    for (int32_t i = 0; i < st->n_stop; i++) free(st->stop[i]);
    st->n_stop = 0;
    st->held.n = 0;
    if (st->held.p) st->held.p[0] = '\0';
    for (int32_t i = 0; i < n_stop && i < STOP_TEXT_MAX_STRINGS; i++) {
        const size_t len = strlen(stop[i]);
        st->stop[i] = malloc(len + 1);
        if (st->stop[i] == NULL) return false;
        memcpy(st->stop[i], stop[i], len + 1);
        st->stop_len[i] = len;
        st->n_stop = i + 1;
    }
    return true;
}

/* Length of the longest suffix of t[0..n) that is a proper prefix of a stop string. */
static size_t held_suffix(const stop_text *st, const char *t, size_t n) {
    size_t best = 0;
    for (int32_t i = 0; i < st->n_stop; i++) {
        const size_t l = st->stop_len[i];
        for (size_t k = (l - 1 < n ? l - 1 : n); k > best; k--) {
            if (memcmp(t + n - k, st->stop[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

int stop_text_push(stop_text *st, const char *text, size_t len, text_buf *out) {
    if (st->n_stop == 0) return text_buf_append(out, text, len) ? 0 : -1;
    if (!text_buf_append(&st->held, text, len)) return -1;
    const char *t = st->held.p;
    const size_t n = st->held.n;
    /* the earliest match of any stop string */
    size_t at = n;
    for (int32_t i = 0; i < st->n_stop; i++) {
        const size_t l = st->stop_len[i];
        for (size_t p = 0; p + l <= n && p < at; p++) {
            if (memcmp(t + p, st->stop[i], l) == 0) {
                at = p;
                break;
            }
        }
    }
    if (at < n) {
        const bool ok = text_buf_append(out, t, at);
        st->held.n = 0;
        st->held.p[0] = '\0';
        return ok ? 1 : -1;
    }
    const size_t keep = held_suffix(st, t, n);
    if (!text_buf_append(out, t, n - keep)) return -1;
    memmove(st->held.p, t + n - keep, keep);
    st->held.n = keep;
    st->held.p[keep] = '\0';
    return 0;
}

bool stop_text_flush(stop_text *st, text_buf *out) {
    const bool ok = text_buf_append(out, st->held.p ? st->held.p : "", st->held.n);
    st->held.n = 0;
    if (st->held.p) st->held.p[0] = '\0';
    return ok;
}
