/* vocab.h: the tokenizer's vocabulary (internal): token texts and types, the BPE merge table,
 * the special-token trie, the word cache, and how to build one (from arrays or a GGUF file). */
#ifndef DFL_VOCAB_VOCAB_H
#define DFL_VOCAB_VOCAB_H

#include "dflash.h"
#include "gguf/gguf.h"

#include <pthread.h>

/* Pre-tokenizer patterns (src/vocab/pretok.c). */
typedef enum vocab_pre {
    VOCAB_PRE_GPT2 = 0,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    VOCAB_PRE_LLAMA3 = 1, /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    VOCAB_PRE_QWEN2 = 2,  /* as llama3 with \p{N} (single digits); the text is NFC-normalized first */
} vocab_pre;

#define VOCAB_ID_AUTO (-2) /* vocab_desc.eot: detect from the token texts */

/* What a vocabulary is built from. Token texts are as GGUF stores them: NORMAL tokens in the
 * byte-level alphabet (GPT-2's bytes_to_unicode), the other types as raw bytes. Nothing is kept:
 * the texts are copied. */
typedef struct vocab_desc {
    int64_t n_tokens;
    const char *const *tokens;   /* [n_tokens] */
    const size_t *token_lens;    /* [n_tokens], NULL: NUL-terminated */
    const int32_t *types;        /* [n_tokens] dfl_token_type, NULL: all NORMAL */
    int64_t n_merges;
    const char *const *merges;   /* [n_merges] "left right", ranked by position */
    const size_t *merge_lens;    /* [n_merges], NULL: NUL-terminated */
    const char *pre;             /* tokenizer.ggml.pre, NULL: gpt2 */
    int32_t bos, eos, eot, pad, mask; /* -1: none; eot VOCAB_ID_AUTO: detect */
    bool add_bos, add_eos;
} vocab_desc;

/* A default description (no special ids, eot detected, no BOS/EOS added). */
vocab_desc vocab_desc_default(void);

dfl_vocab *vocab_new(const vocab_desc *desc, dfl_error *err);
/* Reads the tokenizer.ggml.* keys of an open GGUF file. The vocabulary does not keep f. */
dfl_vocab *vocab_load_gguf(const gguf_file *f, dfl_error *err);

/* ---- internals shared by the files of src/vocab ---------------------------------------------- */

typedef struct vocab_merge {
    uint64_t key;   /* (uint64_t)left << 32 | right; UINT64_MAX = empty slot */
    int32_t rank;
    int32_t result;
} vocab_merge;

typedef struct vocab_trie_edge {
    uint32_t node;  /* parent node; UINT32_MAX = empty slot */
    uint32_t child;
    uint8_t byte;
} vocab_trie_edge;

#define VOCAB_CACHE_WORD 26
#define VOCAB_CACHE_TOKENS 9
typedef struct vocab_cache_entry {
    uint8_t len;    /* word bytes; 0 = empty */
    uint8_t n_tok;
    uint8_t word[VOCAB_CACHE_WORD];
    int32_t tok[VOCAB_CACHE_TOKENS];
} vocab_cache_entry; /* 64 bytes */

struct dfl_vocab {
    int64_t n_tokens;
    uint8_t *text;          /* [text_off[n_tokens]] token bytes (decoded from byte-level for NORMAL) */
    uint64_t *text_off;     /* [n_tokens + 1] */
    uint8_t *types;         /* [n_tokens] dfl_token_type */
    size_t max_token_len;

    int32_t *tok_map;       /* [tok_map_mask + 1] open addressing: text -> id (every token), -1 empty */
    size_t tok_map_mask;

    vocab_merge *merges;    /* [merge_mask + 1] open addressing: (left, right) -> rank, result */
    size_t merge_mask;
    int64_t n_merges;
    int32_t byte_token[256];/* the NORMAL token of each single byte */
    int32_t *byte_pair;     /* [256 * 256] merge index (into merges) of two byte tokens, -1 none */

    /* special (control and user-defined) tokens: a byte trie, node 0 = root */
    vocab_trie_edge *trie;  /* [trie_mask + 1] (parent node, byte) -> child */
    size_t trie_mask;
    int32_t *trie_term;     /* [n_trie_nodes] token ending at the node, -1 none */
    uint32_t n_trie_nodes;
    uint8_t special_first[32]; /* bitset: bytes that start a special token */

    vocab_pre pre;
    bool nfc;               /* NFC-normalize before pre-tokenizing (qwen2) */
    bool ignore_merges;     /* a word that is a token is that token (llama3) */
    int32_t bos, eos, eot, pad, mask;
    bool add_bos, add_eos;
    int32_t eog[8];
    int n_eog;

    /* word cache: direct-mapped, shared by the callers of one vocabulary; a call uses it only if
     * it gets the lock without waiting */
    pthread_mutex_t *cache_lock;
    vocab_cache_entry *cache; /* [cache_mask + 1] */
    size_t cache_mask;
};

static inline const uint8_t *vocab_text(const dfl_vocab *v, int32_t id, size_t *len) {
    *len = (size_t)(v->text_off[id + 1] - v->text_off[id]);
    return v->text + v->text_off[id];
}

/* "normal", "control", ... */
const char *vocab_type_name(int32_t type);
uint64_t vocab_hash_bytes(const uint8_t *s, size_t n);
/* The token whose bytes are s[0..n) (any type; the last one if several), -1 if none. */
int32_t vocab_lookup(const dfl_vocab *v, const uint8_t *s, size_t n);
/* The merge of two adjacent tokens: NULL if none. */
static inline const vocab_merge *vocab_merge_find(const dfl_vocab *v, int32_t left, int32_t right) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & v->merge_mask;
    for (;;) {
        const vocab_merge *m = &v->merges[i];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
        i = (i + 1) & v->merge_mask;
    }
}

/* The child of a trie node by one byte, UINT32_MAX if none. */
static inline uint32_t vocab_trie_child(const dfl_vocab *v, uint32_t node, uint8_t byte) {
    size_t i = (size_t)(((uint64_t)node * 256 + byte) * 0x9E3779B97F4A7C15ull >> 24) & v->trie_mask;
    for (;;) {
        const vocab_trie_edge *e = &v->trie[i];
        if (e->node == UINT32_MAX) return UINT32_MAX;
        if (e->node == node && e->byte == byte) return e->child;
        i = (i + 1) & v->trie_mask;
    }
}

/* ---- the encoder pieces (pretok.c, bpe.c) ---------------------------------------------------- */

/* End of the pre-token that starts at s[pos] (s[0..n) well-formed UTF-8, pos < n). */
size_t pretok_next(vocab_pre pre, const uint8_t *s, size_t n, size_t pos);

/* Output of the encoder: writes while there is room, counts everything. */
typedef struct tok_sink {
    int32_t *out;
    int64_t cap;
    int64_t n;
} tok_sink;

static inline void tok_sink_push(tok_sink *k, int32_t id) {
    if (k->n < k->cap) k->out[k->n] = id;
    k->n++;
}

/* Scratch of the BPE of one word (grown as needed, freed by bpe_ws_free). */
typedef struct bpe_ws {
    int32_t *id, *prev, *next, *pair; /* [cap] symbols */
    uint64_t *heap;            /* [2 * cap] rank << 32 | left symbol */
    size_t cap;
    bool use_cache;            /* this call holds the vocabulary's cache lock */
} bpe_ws;

void bpe_ws_free(bpe_ws *ws);
/* Appends the tokens of the word w[0..n) (n >= 1). False if memory ran out. */
bool bpe_word(const dfl_vocab *v, const uint8_t *w, size_t n, bpe_ws *ws, tok_sink *sink);

#endif
