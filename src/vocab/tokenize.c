/* tokenize.c: dfl_tokenize, the encoder pipeline of the reference tokenizer:
 *   1. special tokens: leftmost, longest match over the trie of control (parse_special only) and
 *      user-defined tokens; the text between them is processed on its own;
 *   2. bytes that are not well-formed UTF-8 split that text further and become their byte tokens
 *      (a JavaScript string cannot hold them, so this is dflash's definition: it keeps
 *      detokenize(tokenize(x)) == x);
 *   3. each well-formed run: NFC (qwen2), the pre-tokenizer scanner, BPE per word. */
#include "vocab/unicode.h"
#include "vocab/vocab.h"

#include <stdlib.h>
#include <string.h>

typedef struct encoder {
    const dfl_vocab *v;
    tok_sink sink;
    bpe_ws bpe;
    unicode_nfc_ws nfc;
} encoder;

/* well-formed UTF-8 text: normalize, pre-tokenize, BPE */
static bool encode_text(encoder *e, const uint8_t *s, size_t n) {
    if (n == 0) return true;
    if (e->v->nfc && !unicode_nfc(s, n, &e->nfc, &s, &n)) return false;
    size_t pos = 0;
    while (pos < n) {
        size_t end = pretok_next(e->v->pre, s, n, pos);
        if (!bpe_word(e->v, s + pos, end - pos, &e->bpe, &e->sink)) return false;
        pos = end;
    }
    return true;
}

/* any bytes between special tokens: split at ill-formed UTF-8 */
static bool encode_fragment(encoder *e, const uint8_t *s, size_t n) {
    size_t start = 0, i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = utf8_valid_len(s + i, n - i);
        if (l > 0) {
            i += l;
            continue;
        }
        if (!encode_text(e, s + start, i - start)) return false;
        tok_sink_push(&e->sink, e->v->byte_token[s[i]]);
        start = ++i;
    }
    return encode_text(e, s + start, n - start);
}

/* the special token that starts at s[0] (longest), or -1; *len its length */
static int32_t match_special(const dfl_vocab *v, const uint8_t *s, size_t n, bool parse_special, size_t *len) {
    uint32_t node = 0;
    int32_t best = -1;
    for (size_t k = 0; k < n; k++) {
        uint32_t child = vocab_trie_child(v, node, s[k]);
        if (child == UINT32_MAX) break;
        node = child;
        int32_t t = v->trie_term[node];
        if (t >= 0 && (parse_special || v->types[t] == DFL_TOKEN_TYPE_USER_DEFINED)) {
            best = t;
            *len = k + 1;
        }
    }
    return best;
}

int64_t dfl_tokenize(const dfl_vocab *vocab, const char *text, size_t len, int32_t *tokens, int64_t n_max,
                     bool add_special, bool parse_special) {
    if (vocab == NULL || (text == NULL && len > 0) || n_max < 0 || (tokens == NULL && n_max > 0) ||
        len > (size_t)INT32_MAX) {
        return DFL_VOCAB_FAIL;
    }
    encoder e;
    memset(&e, 0, sizeof(e));
    e.v = vocab;
    e.sink.out = tokens;
    e.sink.cap = n_max;
    /* the word cache is used by one call at a time; the others run without it */
    e.bpe.use_cache = pthread_mutex_trylock(vocab->cache_lock) == 0;

    if (add_special && vocab->add_bos) tok_sink_push(&e.sink, vocab->bos);
    const uint8_t *s = (const uint8_t *)text;
    size_t start = 0, i = 0;
    bool ok = true;
    while (i < len && ok) {
        if (!(vocab->special_first[s[i] >> 3] & (1u << (s[i] & 7)))) {
            i++;
            continue;
        }
        size_t mlen = 0;
        int32_t id = match_special(vocab, s + i, len - i, parse_special, &mlen);
        if (id < 0) {
            i++;
            continue;
        }
        ok = encode_fragment(&e, s + start, i - start);
        tok_sink_push(&e.sink, id);
        i += mlen;
        start = i;
    }
    if (ok) ok = encode_fragment(&e, s + start, len - start);
    if (add_special && vocab->add_eos) tok_sink_push(&e.sink, vocab->eos);

    if (e.bpe.use_cache) pthread_mutex_unlock(vocab->cache_lock);
    bpe_ws_free(&e.bpe);
    unicode_nfc_ws_free(&e.nfc);
    if (!ok) return DFL_VOCAB_FAIL;
    return e.sink.n <= n_max ? e.sink.n : -e.sink.n;
}
