/* bpe.c: byte-level BPE of one pre-token word in O(n log n): the word's bytes start as their
 * byte tokens in a linked list; a min-heap holds (rank, left position) of adjacent pairs that
 * have a merge; the lowest rank (leftmost on ties, as the reference tokenizer) is merged, and
 * only the two new neighbour pairs are pushed. Stale heap entries are skipped when popped (the
 * pair at their position no longer has their rank). Short words go through the vocabulary's
 * word cache. */
#include "vocab/vocab.h"

#include <stdlib.h>
#include <string.h>

void bpe_ws_free(bpe_ws *ws) {
    free(ws->id);
    free(ws->prev);
    free(ws->next);
    free(ws->heap);
    free(ws->pair);
    memset(ws, 0, sizeof(*ws));
}

static bool ws_reserve(bpe_ws *ws, size_t n) {
    if (n <= ws->cap) return true;
    size_t c = ws->cap ? ws->cap : 64;
    while (c < n) c *= 2;
    int32_t *id = realloc(ws->id, c * sizeof(int32_t));
    if (id) ws->id = id;
    int32_t *prev = realloc(ws->prev, c * sizeof(int32_t));
    if (prev) ws->prev = prev;
    int32_t *next = realloc(ws->next, c * sizeof(int32_t));
    if (next) ws->next = next;
    int32_t *pair = realloc(ws->pair, c * sizeof(int32_t));
    if (pair) ws->pair = pair;
    uint64_t *heap = realloc(ws->heap, 2 * c * sizeof(uint64_t));
    if (heap) ws->heap = heap;
    if (!id || !prev || !next || !pair || !heap) return false;
    ws->cap = c;
    return true;
}

/* a 4-ary min-heap of (rank << 32 | position): half the depth of a binary heap, and the four
 * children of a node share a cache line */
static inline void heap_down(uint64_t *h, size_t n, size_t i) {
    uint64_t v = h[i];
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n) break;
        size_t best = c;
        size_t end = c + 4 < n ? c + 4 : n;
        for (size_t k = c + 1; k < end; k++) {
            if (h[k] < h[best]) best = k;
        }
        if (h[best] >= v) break;
        h[i] = h[best];
        i = best;
    }
    h[i] = v;
}

static inline void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0];
    h[0] = h[--(*n)];
    if (*n > 0) heap_down(h, *n, 0);
    return top;
}

#define ENTRY(rank, pos) (((uint64_t)(uint32_t)(rank) << 32) | (uint32_t)(pos))

static bool cache_get(const dfl_vocab *v, const uint8_t *w, size_t n, uint64_t h, tok_sink *sink) {
    const vocab_cache_entry *e = &v->cache[h & v->cache_mask];
    if (e->len != n || memcmp(e->word, w, n) != 0) return false;
    for (uint8_t k = 0; k < e->n_tok; k++) tok_sink_push(sink, e->tok[k]);
    return true;
}

static void cache_put(const dfl_vocab *v, const uint8_t *w, size_t n, uint64_t h, const int32_t *tok, size_t n_tok) {
    if (n_tok > VOCAB_CACHE_TOKENS) return;
    vocab_cache_entry *e = &v->cache[h & v->cache_mask];
    e->len = (uint8_t)n;
    e->n_tok = (uint8_t)n_tok;
    memcpy(e->word, w, n);
    memcpy(e->tok, tok, n_tok * sizeof(int32_t));
}

bool bpe_word(const dfl_vocab *v, const uint8_t *w, size_t n, bpe_ws *ws, tok_sink *sink) {
    if (n == 1) {
        tok_sink_push(sink, v->byte_token[w[0]]);
        return true;
    }
    if (v->ignore_merges) {
        int32_t id = vocab_lookup(v, w, n);
        if (id >= 0 && v->types[id] == DFL_TOKEN_TYPE_NORMAL) {
            tok_sink_push(sink, id);
            return true;
        }
    }
    bool cacheable = ws->use_cache && n <= VOCAB_CACHE_WORD;
    uint64_t h = 0;
    if (cacheable) {
        h = vocab_hash_bytes(w, n);
        if (cache_get(v, w, n, h, sink)) return true;
    }
    if (n > INT32_MAX || !ws_reserve(ws, n)) return false;
    /* symbols, indexed by their first byte: token, neighbours, and the merge of the pair that
     * starts there (an index into v->merges, -1 none) */
    int32_t *id = ws->id, *prev = ws->prev, *next = ws->next, *pair = ws->pair; /* [n] */
    uint64_t *heap = ws->heap;                                                  /* [2n] pending merges */
    size_t nh = 0;
    for (size_t k = 0; k < n; k++) {
        id[k] = v->byte_token[w[k]];
        prev[k] = (int32_t)k - 1;
        next[k] = k + 1 < n ? (int32_t)k + 1 : -1;
        pair[k] = k + 1 < n ? v->byte_pair[w[k] * 256 + w[k + 1]] : -1;
        if (pair[k] >= 0) heap[nh++] = ENTRY(v->merges[pair[k]].rank, k);
    }
    for (size_t k = nh / 4 + 1; k-- > 0;) heap_down(heap, nh, k);
    while (nh > 0) {
        uint64_t top = heap_pop(heap, &nh);
        int32_t rank = (int32_t)(top >> 32), left = (int32_t)(uint32_t)top;
        /* stale if the symbol was merged away or its pair changed since the push */
        if (id[left] < 0 || pair[left] < 0 || v->merges[pair[left]].rank != rank) continue;
        int32_t right = next[left];
        id[left] = v->merges[pair[left]].result;
        id[right] = -1;
        next[left] = next[right];
        if (next[right] >= 0) prev[next[right]] = left;
        /* the heap holds < 2n entries: n - 1 pairs at the start, and each of the <= n - 1 merges
         * pops one entry and pushes at most two */
        int32_t p = prev[left];
        if (p >= 0) {
            const vocab_merge *m = vocab_merge_find(v, id[p], id[left]);
            pair[p] = m ? (int32_t)(m - v->merges) : -1;
            if (m) heap_push(heap, &nh, ENTRY(m->rank, p));
        }
        if (next[left] >= 0) {
            const vocab_merge *m = vocab_merge_find(v, id[left], id[next[left]]);
            pair[left] = m ? (int32_t)(m - v->merges) : -1;
            if (m) heap_push(heap, &nh, ENTRY(m->rank, left));
        } else {
            pair[left] = -1;
        }
    }
    int32_t out[VOCAB_CACHE_TOKENS];
    size_t n_out = 0;
    for (int32_t k = 0; k >= 0; k = next[k]) {
        tok_sink_push(sink, id[k]);
        if (n_out < VOCAB_CACHE_TOKENS) out[n_out] = id[k];
        n_out++;
    }
    if (cacheable) cache_put(v, w, n, h, out, n_out);
    return true;
}
