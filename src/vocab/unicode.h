/* unicode.h: what the tokenizer needs from Unicode: strict UTF-8 decoding (Unicode Table 3-7,
 * maximal-subpart error reporting), code point classes for the pre-tokenizer regexes (\p{L},
 * \p{N}, JavaScript's \s), and NFC normalization, all from tables generated from the Unicode data
 * of the reference tokenizer's engine (unicode_data.c). */
#ifndef DFL_VOCAB_UNICODE_H
#define DFL_VOCAB_UNICODE_H

#include "unicode_data.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum unicode_class {
    UNICODE_CLASS_OTHER = 0,
    UNICODE_CLASS_LETTER = 1, /* \p{L} */
    UNICODE_CLASS_NUMBER = 2, /* \p{N} */
    UNICODE_CLASS_SPACE = 3,  /* JavaScript's \s (with the u flag) */
} unicode_class;

static inline uint8_t unicode_props_of(uint32_t cp) {
    if (cp > 0x10FFFF) return UNICODE_CLASS_OTHER;
    return unicode_props[((size_t)unicode_blocks[cp >> UNICODE_BLOCK_SHIFT] << UNICODE_BLOCK_SHIFT) |
                         (cp & ((1u << UNICODE_BLOCK_SHIFT) - 1))];
}

static inline unicode_class unicode_class_of(uint32_t cp) {
    return (unicode_class)(unicode_props_of(cp) & UNICODE_CLASS_MASK);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

typedef enum utf8_status {
    UTF8_OK = 0,        /* a well-formed sequence of *len bytes encoding *cp */
    UTF8_INVALID = 1,   /* ill-formed: *len = bytes of the maximal subpart (>= 1) */
    UTF8_TRUNCATED = 2, /* a proper prefix of a well-formed sequence that the buffer end cuts: *len bytes */
} utf8_status;

/* Decodes the sequence at s[0..n) (n >= 1). */
utf8_status utf8_decode(const uint8_t *s, size_t n, uint32_t *cp, size_t *len);
/* Length of the well-formed sequence at s (0 if ill-formed or truncated). */
static inline size_t utf8_valid_len(const uint8_t *s, size_t n) {
    if (s[0] < 0x80) return 1;
    uint32_t cp;
    size_t len;
    return utf8_decode(s, n, &cp, &len) == UTF8_OK ? len : 0;
}
/* Writes the UTF-8 encoding of cp (<= 0x10FFFF) to out; returns its length (1..4). */
size_t utf8_encode(uint32_t cp, uint8_t out[4]);

/* ---- NFC ------------------------------------------------------------------------------------ */

/* A growable workspace for NFC (kept by the caller across calls; zero-initialize, then free with
 * unicode_nfc_ws_free). */
typedef struct unicode_nfc_ws {
    uint32_t *cps;  /* [cap_cps] code points of the segment being normalized */
    size_t cap_cps;
    uint8_t *out;   /* [cap_out] the normalized text */
    size_t cap_out;
} unicode_nfc_ws;

void unicode_nfc_ws_free(unicode_nfc_ws *ws);

/* True if s[0..n) (well-formed UTF-8) is certainly NFC: every code point is UNICODE_NFC_SAFE. */
bool unicode_nfc_quick(const uint8_t *s, size_t n);

/* NFC-normalizes well-formed UTF-8 s[0..n). On success *out points to the result (s itself if
 * unchanged, else ws->out) and *out_len is its length; false if an allocation failed. */
bool unicode_nfc(const uint8_t *s, size_t n, unicode_nfc_ws *ws, const uint8_t **out, size_t *out_len);

/* Combining class rank of cp (0 for starters); exposed for tests. */
uint8_t unicode_ccc_rank(uint32_t cp);

#endif
