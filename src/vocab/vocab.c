/* vocab.c: building a vocabulary: token texts (byte-level decoding of NORMAL tokens), the text
 * -> id map, the merge table ((left, right) -> rank, result), the special-token trie, special ids
 * and end-of-generation tokens, the pre-tokenizer choice; plus the public accessors. */
#include "vocab/vocab.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

#define VOCAB_CACHE_ENTRIES 65536 /* 4 MiB */

vocab_desc vocab_desc_default(void) {
    vocab_desc d;
    memset(&d, 0, sizeof(d));
    d.bos = d.eos = d.pad = d.mask = -1;
    d.eot = VOCAB_ID_AUTO;
    return d;
}

uint64_t vocab_hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to 256, 257, ... */
static void byte_level_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[324]) {
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    uint32_t extra = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_to_cp[b] = printable ? (uint32_t)b : extra++;
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* Decodes a byte-level string (UTF-8 of code points of the byte-level alphabet) into bytes.
 * Returns the byte count, or -1 if s is not byte-level text. out has room for n bytes. */
static int64_t byte_level_decode(const int16_t cp_to_byte[324], const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        if (s[i] < 0x80) {
            cp = s[i++];
        } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
            cp = ((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3Fu);
            i += 2;
        } else {
            return -1;
        }
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[o++] = (uint8_t)cp_to_byte[cp];
    }
    return (int64_t)o;
}

int32_t vocab_lookup(const dfl_vocab *v, const uint8_t *s, size_t n) {
    size_t i = (size_t)vocab_hash_bytes(s, n) & v->tok_map_mask;
    for (;;) {
        int32_t id = v->tok_map[i];
        if (id < 0) return -1;
        size_t len;
        const uint8_t *t = vocab_text(v, id, &len);
        if (len == n && memcmp(t, s, n) == 0) return id;
        i = (i + 1) & v->tok_map_mask;
    }
}

/* Inserts id (replacing a token with the same text). */
static void tok_map_insert(dfl_vocab *v, int32_t id) {
    size_t n;
    const uint8_t *s = vocab_text(v, id, &n);
    size_t i = (size_t)vocab_hash_bytes(s, n) & v->tok_map_mask;
    for (;;) {
        int32_t o = v->tok_map[i];
        if (o < 0) break;
        size_t len;
        const uint8_t *t = vocab_text(v, o, &len);
        if (len == n && memcmp(t, s, n) == 0) break;
        i = (i + 1) & v->tok_map_mask;
    }
    v->tok_map[i] = id;
}

/* Inserts or replaces a merge (a later duplicate wins, as in the reference tokenizer). */
static void merge_insert(dfl_vocab *v, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & v->merge_mask;
    while (v->merges[i].key != UINT64_MAX && v->merges[i].key != key) i = (i + 1) & v->merge_mask;
    if (v->merges[i].key == UINT64_MAX) v->n_merges++;
    v->merges[i].key = key;
    v->merges[i].rank = rank;
    v->merges[i].result = result;
}

static void trie_insert(dfl_vocab *v, const uint8_t *s, size_t n, int32_t id) {
    uint32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t c = vocab_trie_child(v, node, s[k]);
        if (c == UINT32_MAX) {
            c = v->n_trie_nodes++;
            v->trie_term[c] = -1;
            size_t i = (size_t)(((uint64_t)node * 256 + s[k]) * 0x9E3779B97F4A7C15ull >> 24) & v->trie_mask;
            while (v->trie[i].node != UINT32_MAX) i = (i + 1) & v->trie_mask;
            v->trie[i].node = node;
            v->trie[i].byte = s[k];
            v->trie[i].child = c;
        }
        node = c;
    }
    v->trie_term[node] = id;
}

const char *vocab_type_name(int32_t t) {
    switch (t) {
    case DFL_TOKEN_TYPE_NORMAL: return "normal";
    case DFL_TOKEN_TYPE_UNKNOWN: return "unknown";
    case DFL_TOKEN_TYPE_CONTROL: return "control";
    case DFL_TOKEN_TYPE_USER_DEFINED: return "user-defined";
    case DFL_TOKEN_TYPE_UNUSED: return "unused";
    case DFL_TOKEN_TYPE_BYTE: return "byte";
    }
    return "?";
}

static dfl_status set_pre(dfl_vocab *v, const char *pre, dfl_error *err) {
    if (pre == NULL || strcmp(pre, "gpt2") == 0 || strcmp(pre, "gpt-2") == 0 || strcmp(pre, "default") == 0) {
        v->pre = VOCAB_PRE_GPT2;
    } else if (strcmp(pre, "llama3") == 0 || strcmp(pre, "llama-bpe") == 0 || strcmp(pre, "llama-v3") == 0) {
        v->pre = VOCAB_PRE_LLAMA3;
        v->ignore_merges = true; /* Llama 3's tokenizer.json sets ignore_merges */
    } else if (strcmp(pre, "qwen2") == 0) {
        v->pre = VOCAB_PRE_QWEN2;
        v->nfc = true; /* Qwen2/3's tokenizer.json normalizer is NFC */
    } else {
        return error_set(err, DFL_ERR_UNSUPPORTED,
                         "tokenizer.ggml.pre '%s' is not supported (dflash knows qwen2, llama3/llama-bpe, gpt2/default)",
                         pre);
    }
    return DFL_OK;
}

static dfl_status check_id(const char *what, int32_t id, int64_t n_tokens, dfl_error *err) {
    if (id < -1 || id >= n_tokens) {
        return error_set(err, DFL_ERR_FORMAT, "vocabulary: %s token id %d is out of range (%lld tokens)", what, (int)id,
                         (long long)n_tokens);
    }
    return DFL_OK;
}

static void add_eog(dfl_vocab *v, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < v->n_eog; i++) {
        if (v->eog[i] == id) return;
    }
    if (v->n_eog < (int)(sizeof(v->eog) / sizeof(v->eog[0]))) v->eog[v->n_eog++] = id;
}

static int32_t find_control(const dfl_vocab *v, const char *text) {
    int32_t id = vocab_lookup(v, (const uint8_t *)text, strlen(text));
    if (id >= 0 && v->types[id] == DFL_TOKEN_TYPE_CONTROL) return id;
    return -1;
}

static dfl_status build_tokens(dfl_vocab *v, const vocab_desc *d, const int16_t cp_to_byte[324], dfl_error *err) {
    size_t total = 0;
    for (int64_t i = 0; i < d->n_tokens; i++) {
        if (d->tokens[i] == NULL) return error_set(err, DFL_ERR_FORMAT, "vocabulary: token %lld has no text", (long long)i);
        total += d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
    }
    size_t n_tok = (size_t)(uint32_t)d->n_tokens; /* <= INT32_MAX, checked by vocab_new */
    v->types = malloc(n_tok);
    v->text_off = malloc((n_tok + 1) * sizeof(uint64_t));
    v->text = malloc(total + 1);
    if (v->types == NULL || v->text_off == NULL || v->text == NULL) return error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
    uint64_t off = 0;
    for (int64_t i = 0; i < d->n_tokens; i++) {
        const uint8_t *s = (const uint8_t *)d->tokens[i];
        size_t n = d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
        int32_t t = d->types ? d->types[i] : DFL_TOKEN_TYPE_NORMAL;
        if (t < DFL_TOKEN_TYPE_NORMAL || t > DFL_TOKEN_TYPE_BYTE) {
            return error_set(err, DFL_ERR_FORMAT, "vocabulary: token %lld has an invalid type %d", (long long)i, (int)t);
        }
        v->types[i] = (uint8_t)t;
        v->text_off[i] = off;
        if (t == DFL_TOKEN_TYPE_NORMAL) {
            int64_t m = byte_level_decode(cp_to_byte, s, n, v->text + off);
            if (m < 0) {
                return error_set(err, DFL_ERR_FORMAT,
                                 "vocabulary: normal token %lld '%.*s' is not byte-level text (GPT-2 byte alphabet)",
                                 (long long)i, (int)(n > 64 ? 64 : n), (const char *)s);
            }
            if (m == 0) return error_set(err, DFL_ERR_FORMAT, "vocabulary: normal token %lld is empty", (long long)i);
            off += (uint64_t)m;
        } else {
            memcpy(v->text + off, s, n);
            off += n;
        }
        size_t len = (size_t)(off - v->text_off[i]);
        if (len > v->max_token_len) v->max_token_len = len;
    }
    v->text_off[d->n_tokens] = off;
    /* text -> id: non-normal tokens first so that a normal token with the same bytes wins */
    v->tok_map_mask = pow2_at_least(2 * (size_t)d->n_tokens) - 1;
    v->tok_map = malloc((v->tok_map_mask + 1) * sizeof(int32_t));
    if (v->tok_map == NULL) return error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
    memset(v->tok_map, 0xFF, (v->tok_map_mask + 1) * sizeof(int32_t));
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < d->n_tokens; i++) {
            bool normal = v->types[i] == DFL_TOKEN_TYPE_NORMAL;
            if ((pass == 1) != normal || v->text_off[i + 1] == v->text_off[i]) continue;
            tok_map_insert(v, (int32_t)i);
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        int32_t id = vocab_lookup(v, &byte, 1);
        if (id < 0 || v->types[id] != DFL_TOKEN_TYPE_NORMAL) {
            return error_set(err, DFL_ERR_FORMAT, "vocabulary: no normal token for the byte 0x%02x (a byte-level BPE vocabulary has all 256)", b);
        }
        v->byte_token[b] = id;
    }
    return DFL_OK;
}

static dfl_status build_merges(dfl_vocab *v, const vocab_desc *d, const int16_t cp_to_byte[324], dfl_error *err) {
    if (d->n_merges > INT32_MAX) return error_set(err, DFL_ERR_FORMAT, "vocabulary: too many merges (%lld)", (long long)d->n_merges);
    v->merge_mask = pow2_at_least(2 * (size_t)d->n_merges + 2) - 1;
    v->merges = malloc((v->merge_mask + 1) * sizeof(vocab_merge));
    size_t cap = 64;
    uint8_t *buf = malloc(cap);
    if (v->merges == NULL || buf == NULL) {
        free(buf);
        return error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
    }
    for (size_t i = 0; i <= v->merge_mask; i++) v->merges[i].key = UINT64_MAX;
    dfl_status st = DFL_OK;
    for (int64_t r = 0; r < d->n_merges && st == DFL_OK; r++) {
        const uint8_t *s = (const uint8_t *)d->merges[r];
        size_t n = s == NULL ? 0 : d->merge_lens ? d->merge_lens[r] : strlen(d->merges[r]);
        const uint8_t *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (sp == NULL || sp + 1 == s + n) {
            st = error_set(err, DFL_ERR_FORMAT, "vocabulary: merge %lld '%.*s' is not two tokens separated by a space",
                           (long long)r, (int)(n > 64 ? 64 : n), s ? (const char *)s : "");
            break;
        }
        if (n > cap) {
            while (cap < n) cap *= 2;
            uint8_t *nb = realloc(buf, cap);
            if (nb == NULL) {
                st = error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
                break;
            }
            buf = nb;
        }
        size_t nl = (size_t)(sp - s);
        int64_t a = byte_level_decode(cp_to_byte, s, nl, buf);
        int64_t b = a < 0 ? -1 : byte_level_decode(cp_to_byte, sp + 1, n - nl - 1, buf + a);
        int32_t left = a > 0 ? vocab_lookup(v, buf, (size_t)a) : -1;
        int32_t right = b > 0 ? vocab_lookup(v, buf + a, (size_t)b) : -1;
        int32_t result = (left >= 0 && right >= 0) ? vocab_lookup(v, buf, (size_t)(a + b)) : -1;
        if (left < 0 || right < 0 || result < 0 || v->types[left] != DFL_TOKEN_TYPE_NORMAL ||
            v->types[right] != DFL_TOKEN_TYPE_NORMAL || v->types[result] != DFL_TOKEN_TYPE_NORMAL) {
            st = error_set(err, DFL_ERR_FORMAT, "vocabulary: merge %lld '%.*s': %s is not a normal token", (long long)r,
                           (int)(n > 64 ? 64 : n), (const char *)s,
                           left < 0 || v->types[left] != DFL_TOKEN_TYPE_NORMAL ? "the left part"
                           : right < 0 || v->types[right] != DFL_TOKEN_TYPE_NORMAL ? "the right part"
                                                                                 : "the merged text");
            break;
        }
        merge_insert(v, left, right, (int32_t)r, result);
    }
    free(buf);
    if (st != DFL_OK) return st;
    /* the merges of two single bytes, by byte pair (the first merges of every word) */
    v->byte_pair = malloc(256 * 256 * sizeof(int32_t));
    if (v->byte_pair == NULL) return error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
    for (int a = 0; a < 256; a++) {
        for (int b = 0; b < 256; b++) {
            const vocab_merge *m = vocab_merge_find(v, v->byte_token[a], v->byte_token[b]);
            v->byte_pair[a * 256 + b] = m ? (int32_t)(m - v->merges) : -1;
        }
    }
    return DFL_OK;
}

static dfl_status build_special(dfl_vocab *v, dfl_error *err) {
    size_t total = 0;
    for (int64_t i = 0; i < v->n_tokens; i++) {
        if (v->types[i] == DFL_TOKEN_TYPE_CONTROL || v->types[i] == DFL_TOKEN_TYPE_USER_DEFINED) {
            total += (size_t)(v->text_off[i + 1] - v->text_off[i]);
        }
    }
    if (total >= UINT32_MAX - 1) return error_set(err, DFL_ERR_FORMAT, "vocabulary: special tokens too long");
    v->trie_mask = pow2_at_least(2 * total + 2) - 1;
    v->trie = malloc((v->trie_mask + 1) * sizeof(vocab_trie_edge));
    v->trie_term = malloc((total + 1) * sizeof(int32_t));
    if (v->trie == NULL || v->trie_term == NULL) return error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
    for (size_t i = 0; i <= v->trie_mask; i++) v->trie[i].node = UINT32_MAX;
    v->n_trie_nodes = 1;
    v->trie_term[0] = -1;
    for (int64_t i = 0; i < v->n_tokens; i++) {
        if (v->types[i] != DFL_TOKEN_TYPE_CONTROL && v->types[i] != DFL_TOKEN_TYPE_USER_DEFINED) continue;
        size_t n;
        const uint8_t *s = vocab_text(v, (int32_t)i, &n);
        if (n == 0) continue;
        trie_insert(v, s, n, (int32_t)i);
        v->special_first[s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
    }
    return DFL_OK;
}

void dfl_vocab_free(dfl_vocab *v) {
    if (v == NULL) return;
    free(v->text);
    free(v->text_off);
    free(v->types);
    free(v->tok_map);
    free(v->merges);
    free(v->byte_pair);
    free(v->trie);
    free(v->trie_term);
    free(v->cache);
    if (v->cache_lock != NULL) {
        pthread_mutex_destroy(v->cache_lock);
        free(v->cache_lock);
    }
    free(v);
}

dfl_vocab *vocab_new(const vocab_desc *d, dfl_error *err) {
    if (d == NULL || d->n_tokens <= 0 || d->tokens == NULL || (d->n_merges > 0 && d->merges == NULL) || d->n_merges < 0) {
        error_set(err, DFL_ERR_INVALID, "vocabulary: no tokens (or merges missing)");
        return NULL;
    }
    if (d->n_tokens > INT32_MAX) {
        error_set(err, DFL_ERR_FORMAT, "vocabulary: too many tokens (%lld)", (long long)d->n_tokens);
        return NULL;
    }
    dfl_vocab *v = calloc(1, sizeof(dfl_vocab));
    if (v == NULL) {
        error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
        return NULL;
    }
    v->n_tokens = d->n_tokens;
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    byte_level_tables(byte_to_cp, cp_to_byte);
    dfl_status st = set_pre(v, d->pre, err);
    if (st == DFL_OK) st = build_tokens(v, d, cp_to_byte, err);
    if (st == DFL_OK) st = build_merges(v, d, cp_to_byte, err);
    if (st == DFL_OK) st = build_special(v, err);
    if (st == DFL_OK) st = check_id("bos", d->bos, d->n_tokens, err);
    if (st == DFL_OK) st = check_id("eos", d->eos, d->n_tokens, err);
    if (st == DFL_OK && d->eot != VOCAB_ID_AUTO) st = check_id("eot", d->eot, d->n_tokens, err);
    if (st == DFL_OK) st = check_id("padding", d->pad, d->n_tokens, err);
    if (st == DFL_OK) st = check_id("mask", d->mask, d->n_tokens, err);
    if (st != DFL_OK) {
        dfl_vocab_free(v);
        return NULL;
    }
    v->bos = d->bos;
    v->eos = d->eos;
    v->pad = d->pad;
    v->mask = d->mask;
    v->add_bos = d->add_bos && d->bos >= 0;
    v->add_eos = d->add_eos && d->eos >= 0;
    v->eot = d->eot;
    static const char *const k_eot_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};
    if (v->eot == VOCAB_ID_AUTO) {
        v->eot = -1;
        for (size_t k = 0; k < sizeof(k_eot_names) / sizeof(k_eot_names[0]) && v->eot < 0; k++) {
            v->eot = find_control(v, k_eot_names[k]);
        }
    }
    add_eog(v, v->eos);
    add_eog(v, v->eot);
    static const char *const k_eog_names[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                                              "<|end_of_text|>", "<end_of_turn>", "<|end|>"};
    for (size_t k = 0; k < sizeof(k_eog_names) / sizeof(k_eog_names[0]); k++) add_eog(v, find_control(v, k_eog_names[k]));

    v->cache_mask = VOCAB_CACHE_ENTRIES - 1;
    v->cache = calloc(VOCAB_CACHE_ENTRIES, sizeof(vocab_cache_entry));
    v->cache_lock = malloc(sizeof(pthread_mutex_t));
    if (v->cache == NULL || v->cache_lock == NULL || pthread_mutex_init(v->cache_lock, NULL) != 0) {
        free(v->cache_lock);
        v->cache_lock = NULL;
        dfl_vocab_free(v);
        error_set(err, DFL_ERR_NOMEM, "vocabulary: out of memory");
        return NULL;
    }
    return v;
}

/* ---- accessors ------------------------------------------------------------------------------ */

int64_t dfl_vocab_n_tokens(const dfl_vocab *v) { return v ? v->n_tokens : 0; }
int32_t dfl_vocab_bos(const dfl_vocab *v) { return v ? v->bos : -1; }
int32_t dfl_vocab_eos(const dfl_vocab *v) { return v ? v->eos : -1; }
int32_t dfl_vocab_eot(const dfl_vocab *v) { return v ? v->eot : -1; }
int32_t dfl_vocab_pad(const dfl_vocab *v) { return v ? v->pad : -1; }
int32_t dfl_vocab_mask(const dfl_vocab *v) { return v ? v->mask : -1; }
bool dfl_vocab_add_bos(const dfl_vocab *v) { return v ? v->add_bos : false; }

bool dfl_vocab_is_eog(const dfl_vocab *v, int32_t token) {
    if (v == NULL || token < 0) return false;
    for (int i = 0; i < v->n_eog; i++) {
        if (v->eog[i] == token) return true;
    }
    return false;
}

dfl_token_type dfl_vocab_token_type(const dfl_vocab *v, int32_t token) {
    if (v == NULL || token < 0 || token >= v->n_tokens) return DFL_TOKEN_TYPE_INVALID;
    return (dfl_token_type)v->types[token];
}

int32_t dfl_vocab_find(const dfl_vocab *v, const char *text, size_t len) {
    if (v == NULL || (text == NULL && len > 0) || len == 0) return -1;
    return vocab_lookup(v, (const uint8_t *)text, len);
}

const char *dfl_vocab_pre_name(const dfl_vocab *v) {
    if (v == NULL) return "";
    switch (v->pre) {
    case VOCAB_PRE_GPT2: return "gpt2";
    case VOCAB_PRE_LLAMA3: return "llama3";
    case VOCAB_PRE_QWEN2: return "qwen2";
    }
    return "";
}
