/* jsonw.h: a small streaming JSON writer over a FILE* (escapes strings, tracks commas). */
#ifndef DFL_BASE_JSONW_H
#define DFL_BASE_JSONW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define JSONW_MAX_DEPTH 32

typedef struct jsonw {
    FILE *out;
    int depth;
    bool need_comma[JSONW_MAX_DEPTH];
    bool after_key;
} jsonw;

void jsonw_init(jsonw *w, FILE *out);
void jsonw_obj_begin(jsonw *w);
void jsonw_obj_end(jsonw *w);
void jsonw_arr_begin(jsonw *w);
void jsonw_arr_end(jsonw *w);
void jsonw_key(jsonw *w, const char *key);
void jsonw_str(jsonw *w, const char *s);
void jsonw_strn(jsonw *w, const char *s, size_t n); /* bytes; invalid UTF-8 becomes U+FFFD */
void jsonw_int(jsonw *w, int64_t v);
void jsonw_uint(jsonw *w, uint64_t v);
void jsonw_double(jsonw *w, double v); /* non-finite -> null */
void jsonw_bool(jsonw *w, bool v);
void jsonw_null(jsonw *w);

#endif
