/* test_vocab.h: a small deterministic byte-level BPE vocabulary (GPT-2 byte-to-unicode tokens,
 * merges for frequent English pairs and words, ChatML control tokens and a mask token) for the
 * random test models written by `dflash make-test-model`. */
#ifndef DFL_TOOLS_TEST_VOCAB_H
#define DFL_TOOLS_TEST_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"

typedef struct test_vocab {
    char **tokens;        /* [n_vocab] UTF-8 token texts (GPT-2 byte-level form) */
    int32_t *types;       /* [n_vocab] 1 normal, 3 control, 5 unused (padding) */
    char **merges;        /* [n_merges] "left right" */
    size_t n_vocab;
    size_t n_merges;
    int32_t endoftext_id; /* <|endoftext|>: bos and padding */
    int32_t im_start_id;
    int32_t im_end_id;    /* <|im_end|>: eos and eot */
    int32_t mask_id;      /* <|MASK|> */
} test_vocab;

/* The fewest tokens the vocabulary needs (bytes + merges + control tokens). */
size_t test_vocab_min_size(void);
/* Builds the vocabulary padded with "[PAD{i}]" tokens up to n_vocab. Returns 0 on success, -1 if
 * n_vocab < test_vocab_min_size() or memory ran out (with a message in msg). */
int test_vocab_build(test_vocab *v, size_t n_vocab, char *msg, size_t msg_cap);
void test_vocab_free(test_vocab *v);
/* Writes the tokenizer.* keys (gpt2 model, qwen2 pre-tokenizer, ChatML template). */
void test_vocab_write(const test_vocab *v, gguf_writer *w);

#endif
