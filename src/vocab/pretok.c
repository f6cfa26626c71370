/* pretok.c: the pre-tokenizer regexes as hand-written scanners. Each function returns the end
 * of the match that the regex (leftmost alternative first, greedy quantifiers, backtracking)
 * finds at the start position, exactly as JavaScript's engine runs the pattern in the reference
 * tokenizer (transformers.js): \p{L}, \p{N} and \s come from the generated Unicode tables
 * (\s as JavaScript defines it), and the case-insensitive contractions (?i:'s|'t|...) are
 * ASCII-only ('[sS]|[tT]|...'), as transformers.js rewrites them.
 *
 * gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *         \s*[\r\n]+|\s+(?!\S)|\s+
 * qwen2:  as llama3 with \p{N} instead of \p{N}{1,3}. */
#include "vocab/unicode.h"
#include "vocab/vocab.h"

/* class of the code point at s[i] and its length (s[0..n) well-formed, i < n) */
static inline unicode_class class_at(const uint8_t *s, size_t n, size_t i, size_t *len) {
    uint8_t b = s[i];
    if (b < 0x80) {
        *len = 1;
        if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') return UNICODE_CLASS_LETTER;
        if (b >= '0' && b <= '9') return UNICODE_CLASS_NUMBER;
        if (b == ' ' || (b >= '\t' && b <= '\r')) return UNICODE_CLASS_SPACE;
        return UNICODE_CLASS_OTHER;
    }
    uint32_t cp;
    utf8_decode(s + i, n - i, &cp, len);
    return unicode_class_of(cp);
}

/* end of the run of code points of class c starting at i */
static inline size_t run_end(const uint8_t *s, size_t n, size_t i, unicode_class c) {
    while (i < n) {
        size_t l;
        if (class_at(s, n, i, &l) != c) break;
        i += l;
    }
    return i;
}

static inline int lower_ascii(uint8_t b) { return (b >= 'A' && b <= 'Z') ? b + 32 : b; }

/* 's 't 're 've 'm 'll 'd at s[i] == '\''; returns the end or 0 */
static size_t contraction(const uint8_t *s, size_t n, size_t i, bool any_case) {
    if (i + 1 >= n) return 0;
    int a = any_case ? lower_ascii(s[i + 1]) : s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 >= n) return 0;
    int b = any_case ? lower_ascii(s[i + 2]) : s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

/* the whitespace alternatives: \s*[\r\n]+ (with_newline_rule) | \s+(?!\S) | \s+ at a space */
static size_t space_run(const uint8_t *s, size_t n, size_t i, bool with_newline_rule) {
    size_t e = i, last = i, after_nl = 0;
    while (e < n) {
        size_t l;
        if (class_at(s, n, e, &l) != UNICODE_CLASS_SPACE) break;
        if (s[e] == '\r' || s[e] == '\n') after_nl = e + 1;
        last = e;
        e += l;
    }
    if (with_newline_rule && after_nl != 0) return after_nl; /* up to the last \r or \n */
    if (e == n || last == i) return e;                       /* \s+(?!\S) at the end, or \s+ */
    return last;                                             /* \s+(?!\S): leave the last space */
}

static size_t next_llama3(const uint8_t *s, size_t n, size_t i, size_t max_digits) {
    uint8_t b = s[i];
    if (b == '\'') {
        size_t e = contraction(s, n, i, true);
        if (e) return e;
    }
    size_t l0;
    unicode_class c0 = class_at(s, n, i, &l0);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c0 == UNICODE_CLASS_LETTER) return run_end(s, n, i + l0, UNICODE_CLASS_LETTER);
    if (c0 != UNICODE_CLASS_NUMBER && b != '\r' && b != '\n' && i + l0 < n) {
        size_t l1;
        if (class_at(s, n, i + l0, &l1) == UNICODE_CLASS_LETTER) return run_end(s, n, i + l0 + l1, UNICODE_CLASS_LETTER);
    }
    /* \p{N}{1,max_digits} */
    if (c0 == UNICODE_CLASS_NUMBER) {
        size_t e = i + l0;
        for (size_t k = 1; k < max_digits && e < n; k++) {
            size_t l;
            if (class_at(s, n, e, &l) != UNICODE_CLASS_NUMBER) break;
            e += l;
        }
        return e;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = i;
    if (b == ' ' && i + 1 < n) {
        size_t l1;
        if (class_at(s, n, i + 1, &l1) == UNICODE_CLASS_OTHER) j = i + 1;
    }
    if (j > i || c0 == UNICODE_CLASS_OTHER) {
        size_t e = run_end(s, n, j, UNICODE_CLASS_OTHER);
        while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }
    /* \s*[\r\n]+ | \s+(?!\S) | \s+ */
    return space_run(s, n, i, true);
}

static size_t next_gpt2(const uint8_t *s, size_t n, size_t i) {
    uint8_t b = s[i];
    if (b == '\'') {
        size_t e = contraction(s, n, i, false);
        if (e) return e;
    }
    size_t l0;
    unicode_class c0 = class_at(s, n, i, &l0);
    /* ' ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+' */
    if (b == ' ' && i + 1 < n) {
        size_t l1;
        unicode_class c1 = class_at(s, n, i + 1, &l1);
        if (c1 != UNICODE_CLASS_SPACE) return run_end(s, n, i + 1 + l1, c1);
    }
    if (c0 != UNICODE_CLASS_SPACE) return run_end(s, n, i + l0, c0);
    /* \s+(?!\S) | \s+ */
    return space_run(s, n, i, false);
}

size_t pretok_next(vocab_pre pre, const uint8_t *s, size_t n, size_t pos) {
    switch (pre) {
    case VOCAB_PRE_GPT2: return next_gpt2(s, n, pos);
    case VOCAB_PRE_LLAMA3: return next_llama3(s, n, pos, 3);
    case VOCAB_PRE_QWEN2: return next_llama3(s, n, pos, 1);
    }
    return n;
}
