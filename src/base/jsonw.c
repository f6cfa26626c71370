/* jsonw.c: streaming JSON writer (RFC 8259 string escaping, valid UTF-8 out). */
#include "base/jsonw.h"

#include <math.h>
#include <string.h>

void jsonw_init(jsonw *w, FILE *out) {
    w->out = out;
    w->depth = 0;
    w->need_comma[0] = false;
    w->after_key = false;
}

static void before_value(jsonw *w) {
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (w->need_comma[w->depth]) fputc(',', w->out);
    w->need_comma[w->depth] = true;
}

static void open_(jsonw *w, char c) {
    before_value(w);
    fputc(c, w->out);
    if (w->depth + 1 < JSONW_MAX_DEPTH) w->depth++;
    w->need_comma[w->depth] = false;
}

static void close_(jsonw *w, char c) {
    fputc(c, w->out);
    if (w->depth > 0) w->depth--;
}

void jsonw_obj_begin(jsonw *w) { open_(w, '{'); }
void jsonw_obj_end(jsonw *w) { close_(w, '}'); }
void jsonw_arr_begin(jsonw *w) { open_(w, '['); }
void jsonw_arr_end(jsonw *w) { close_(w, ']'); }

/* Length of a valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
        return 0;
    }
    return len;
}

static void write_string(FILE *out, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', out);
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc(c, out);
            i++;
        } else if (c == '\n') { fputs("\\n", out); i++; }
        else if (c == '\r') { fputs("\\r", out); i++; }
        else if (c == '\t') { fputs("\\t", out); i++; }
        else if (c < 0x20 || c == 0x7f) { fprintf(out, "\\u%04x", c); i++; }
        else if (c < 0x80) { fputc(c, out); i++; }
        else {
            size_t len = utf8_valid_len(p + i, n - i);
            if (len == 0) {
                fputs("\xef\xbf\xbd", out);
                i++;
            } else {
                fwrite(p + i, 1, len, out);
                i += len;
            }
        }
    }
    fputc('"', out);
}

void jsonw_key(jsonw *w, const char *key) {
    before_value(w);
    write_string(w->out, key, strlen(key));
    fputc(':', w->out);
    w->after_key = true;
}

void jsonw_str(jsonw *w, const char *s) {
    before_value(w);
    write_string(w->out, s, strlen(s));
}

void jsonw_strn(jsonw *w, const char *s, size_t n) {
    before_value(w);
    write_string(w->out, s, n);
}

void jsonw_int(jsonw *w, int64_t v) {
    before_value(w);
    fprintf(w->out, "%lld", (long long)v);
}

void jsonw_uint(jsonw *w, uint64_t v) {
    before_value(w);
    fprintf(w->out, "%llu", (unsigned long long)v);
}

void jsonw_double(jsonw *w, double v) {
    before_value(w);
    if (isfinite(v)) fprintf(w->out, "%.9g", v);
    else fputs("null", w->out);
}

void jsonw_bool(jsonw *w, bool v) {
    before_value(w);
    fputs(v ? "true" : "false", w->out);
}

void jsonw_null(jsonw *w) {
    before_value(w);
    fputs("null", w->out);
}
