/* unicode_data.h: the tables generated into unicode_data.c by gen_unicode_data.mjs (Unicode data
 * of the reference tokenizer's JavaScript engine). Read them through unicode.h. */
#ifndef DFL_VOCAB_UNICODE_DATA_H
#define DFL_VOCAB_UNICODE_DATA_H

#include <stddef.h>
#include <stdint.h>

#define UNICODE_BLOCK_SHIFT 7 /* code points per block = 1 << shift (the generator's SHIFT) */

/* bits of unicode_props */
#define UNICODE_CLASS_MASK 0x03u
#define UNICODE_NFC_SAFE 0x04u /* NFC leaves it alone, a starter that never composes with what precedes */
#define UNICODE_DECOMP 0x08u   /* has a canonical decomposition (Hangul syllables excluded) */
#define UNICODE_SECOND 0x10u   /* can be the second element of a canonical composition */

typedef struct unicode_decomp_entry {
    uint32_t cp;
    uint16_t off; /* into unicode_decomp_pool */
    uint8_t len;
} unicode_decomp_entry;

typedef struct unicode_ccc_range {
    uint32_t first, last;
    uint8_t rank; /* 1..: order of the canonical combining class (0 = starter, not listed) */
} unicode_ccc_range;

typedef struct unicode_comp_pair {
    uint64_t key; /* first << 21 | second */
    uint32_t composite;
} unicode_comp_pair;

extern const uint16_t unicode_blocks[];
extern const uint8_t unicode_props[];
extern const unicode_decomp_entry unicode_decomp[];
extern const size_t unicode_n_decomp;
extern const uint32_t unicode_decomp_pool[];
extern const unicode_ccc_range unicode_ccc[];
extern const size_t unicode_n_ccc;
extern const unicode_comp_pair unicode_comp[];
extern const size_t unicode_n_comp;

#endif
