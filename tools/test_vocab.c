/* test_vocab.c: the deterministic byte-level BPE vocabulary of the random test models.
 *
 * Layout (ids):  [0, 256)            the 256 byte tokens in GPT-2's byte-to-unicode order
 *                then the merged tokens, in order of first appearance
 *                then <|endoftext|>, <|im_start|>, <|im_end|>, <|MASK|> (control)
 *                then [PAD{i}] (unused) up to n_vocab.
 * Merges are built word by word from a fixed list of frequent English pieces: each word is first
 * tokenized with the merges so far (real BPE: lowest rank first), then its pieces are merged left
 * to right with new merges, so every listed word ends up as one token and earlier words keep
 * their tokenization (new merges always rank after the old ones). */
#include "test_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Frequent English pieces; a leading space becomes 'Ġ' in the byte-level form. */
static const char *const k_words[] = {
    "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of",
    "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le",
    "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce", "ll", "ly", "ch",
    " t", " a", " s", " w", " c", " b", " f", " p", " m", " d", " h", " l", " n", " o", " i",
    " e", " g", " r", " u", " y", " T", " A", " I", " S", " W", " H", " C",
    "the", " the", " and", " to", " of", " a", " in", " is", " that", " it", " for", " was",
    " on", " are", " as", " with", " be", " at", " this", " have", " from", " or", " by",
    " not", " but", " what", " all", " were", " we", " when", " your", " can", " said",
    " there", " use", " an", " each", " which", " she", " do", " how", " their", " if",
    " will", " up", " other", " about", " out", " many", " then", " them", " these", " so",
    " some", " her", " would", " make", " like", " him", " into", " time", " has", " look",
    " two", " more", " write", " go", " see", " number", " no", " way", " could", " people",
    " my", " than", " first", " water", " been", " call", " who", " its", " now", " find",
    " long", " down", " day", " did", " get", " come", " made", " may", " part", " you",
    " he", " they", " one", " had", " word", " i", " me", " The", " This", " It", " In",
    "ing", "ion", "tion", "ation", "ent", "ment", "ness", "able", "ly", "ed", "er", "est",
    "Hello", " Hello", " world", " hello", " World", "Hi", " question", " answer", " model",
    " token", " draft", " fast", " quick", " brown", " fox", " jumps", " over", " lazy", " dog",
    " once", " upon", " story", " little", " cat", " sat", " mat", " small", " big", " good",
    "user", "assistant", "system", " user", " assistant", " helpful",
    "  ", "    ", "\n\n", ".\n", ",", " (", ")", "'s", "'t", " -", "--",
};

/* GPT-2 byte-to-unicode: printable bytes map to themselves, the rest to U+0100.. in order. */
static void byte_to_unicode(uint32_t cp[256], uint8_t order[256]) {
    bool printable[256] = {false};
    int n = 0;
    for (int b = 0; b < 256; b++) {
        printable[b] = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    }
    for (int b = 0; b < 256; b++) {
        if (printable[b]) {
            cp[b] = (uint32_t)b;
            order[n++] = (uint8_t)b;
        }
    }
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        if (!printable[b]) {
            cp[b] = 256u + (uint32_t)extra++;
            order[n++] = (uint8_t)b;
        }
    }
}

static size_t utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2; /* all code points here are < 0x800 */
}

/* Growable string list. */
typedef struct strlist {
    char **s;
    size_t n, cap;
} strlist;

static int strlist_push(strlist *l, const char *s) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 512;
        char **p = realloc(l->s, cap * sizeof(*p));
        if (p == NULL) return -1;
        l->s = p;
        l->cap = cap;
    }
    char *c = strdup(s);
    if (c == NULL) return -1;
    l->s[l->n++] = c;
    return 0;
}

static long strlist_find(const strlist *l, const char *s) {
    for (size_t i = 0; i < l->n; i++) {
        if (strcmp(l->s[i], s) == 0) return (long)i;
    }
    return -1;
}

static void strlist_free(strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->s[i]);
    free(l->s);
    memset(l, 0, sizeof(*l));
}

#define PIECE_CAP 128

/* Rank of the merge "a b", or -1. */
static long merge_rank(const strlist *merges, const char *a, const char *b) {
    char key[2 * PIECE_CAP + 2];
    snprintf(key, sizeof(key), "%s %s", a, b);
    return strlist_find(merges, key);
}

#define MAX_PIECES 64

/* dst = a + b (dst may be a); false if it does not fit. */
static bool join(char *dst, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la + lb + 1 > PIECE_CAP) return false;
    char tmp[PIECE_CAP];
    memcpy(tmp, a, la);
    memcpy(tmp + la, b, lb + 1);
    memcpy(dst, tmp, la + lb + 1);
    return true;
}

/* Builds the token list (bytes + merged tokens) and the merge list. */
static int build_merges(strlist *tokens, strlist *merges) {
    uint32_t cp[256];
    uint8_t order[256];
    byte_to_unicode(cp, order);
    for (int i = 0; i < 256; i++) {
        char s[4] = {0};
        utf8_put(s, cp[order[i]]);
        if (strlist_push(tokens, s) != 0) return -1;
    }
    for (size_t w = 0; w < sizeof(k_words) / sizeof(k_words[0]); w++) {
        /* pieces = the word's bytes in byte-level form */
        char pieces[MAX_PIECES][PIECE_CAP];
        int n = 0;
        for (const unsigned char *p = (const unsigned char *)k_words[w]; *p && n < MAX_PIECES; p++) {
            size_t len = utf8_put(pieces[n], cp[*p]);
            pieces[n++][len] = '\0';
        }
        /* apply the existing merges, lowest rank first */
        for (;;) {
            long best = -1;
            int at = -1;
            for (int i = 0; i + 1 < n; i++) {
                long r = merge_rank(merges, pieces[i], pieces[i + 1]);
                if (r >= 0 && (best < 0 || r < best)) {
                    best = r;
                    at = i;
                }
            }
            if (at < 0) break;
            if (!join(pieces[at], pieces[at], pieces[at + 1])) return -1;
            memmove(&pieces[at + 1], &pieces[at + 2], (size_t)(n - at - 2) * sizeof(pieces[0]));
            n--;
        }
        /* then merge what is left, left to right, with new merges */
        while (n > 1) {
            char merge[2 * PIECE_CAP + 2], joined[PIECE_CAP];
            snprintf(merge, sizeof(merge), "%s %s", pieces[0], pieces[1]);
            if (!join(joined, pieces[0], pieces[1])) return -1;
            if (strlist_push(merges, merge) != 0) return -1;
            if (strlist_find(tokens, joined) < 0 && strlist_push(tokens, joined) != 0) return -1;
            memcpy(pieces[0], joined, sizeof(joined));
            memmove(&pieces[1], &pieces[2], (size_t)(n - 2) * sizeof(pieces[0]));
            n--;
        }
    }
    return 0;
}

static const char *const k_control[4] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"};

size_t test_vocab_min_size(void) {
    strlist tokens = {0}, merges = {0};
    size_t n = build_merges(&tokens, &merges) == 0 ? tokens.n + 4 : 0;
    strlist_free(&tokens);
    strlist_free(&merges);
    return n;
}

int test_vocab_build(test_vocab *v, size_t n_vocab, char *msg, size_t msg_cap) {
    memset(v, 0, sizeof(*v));
    strlist tokens = {0}, merges = {0};
    if (build_merges(&tokens, &merges) != 0) {
        snprintf(msg, msg_cap, "out of memory building the vocabulary");
        goto fail;
    }
    size_t need = tokens.n + 4;
    if (n_vocab < need) {
        snprintf(msg, msg_cap,
                 "n_vocab %zu is too small: the test vocabulary has %zu tokens (256 bytes, %zu "
                 "merged tokens, 4 control tokens)", n_vocab, need, tokens.n - 256);
        goto fail;
    }
    v->endoftext_id = (int32_t)tokens.n;
    v->im_start_id = v->endoftext_id + 1;
    v->im_end_id = v->endoftext_id + 2;
    v->mask_id = v->endoftext_id + 3;
    for (int i = 0; i < 4; i++) {
        if (strlist_push(&tokens, k_control[i]) != 0) goto oom;
    }
    for (size_t i = tokens.n; i < n_vocab; i++) {
        char pad[32];
        snprintf(pad, sizeof(pad), "[PAD%zu]", i);
        if (strlist_push(&tokens, pad) != 0) goto oom;
    }
    v->types = malloc(n_vocab * sizeof(int32_t));
    if (v->types == NULL) goto oom;
    for (size_t i = 0; i < n_vocab; i++) {
        v->types[i] = i < (size_t)v->endoftext_id ? 1 : i <= (size_t)v->mask_id ? 3 : 5;
    }
    v->tokens = tokens.s;
    v->n_vocab = tokens.n;
    v->merges = merges.s;
    v->n_merges = merges.n;
    return 0;
oom:
    snprintf(msg, msg_cap, "out of memory building the vocabulary");
fail:
    strlist_free(&tokens);
    strlist_free(&merges);
    free(v->types);
    memset(v, 0, sizeof(*v));
    return -1;
}

void test_vocab_free(test_vocab *v) {
    for (size_t i = 0; i < v->n_vocab; i++) free(v->tokens[i]);
    for (size_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->merges);
    free(v->types);
    memset(v, 0, sizeof(*v));
}

static const char k_chatml[] =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

void test_vocab_write(const test_vocab *v, gguf_writer *w) {
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, NULL, v->n_vocab);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->types, v->n_vocab);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL, v->n_merges);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->endoftext_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->im_end_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)v->im_end_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->endoftext_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", (uint32_t)v->mask_id);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_set_str(w, "tokenizer.chat_template", k_chatml);
}
