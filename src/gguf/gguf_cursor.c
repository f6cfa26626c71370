/* gguf_cursor.c: the bounds-checked reader with a sticky first error (see gguf_cursor.h). */
#include "gguf/gguf_cursor.h"
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void gguf_cursor_init(gguf_cursor *c, const uint8_t *data, uint64_t size, const char *label,
                      dfl_error *err) {
    c->data = data;
    c->size = size;
    c->pos = 0;
    c->label = label;
    c->ctx[0] = '\0';
    c->err = err;
    c->failed = false;
}

void gguf_cursor_ctx(gguf_cursor *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->ctx, sizeof(c->ctx), fmt, ap);
    va_end(ap);
}

bool gguf_cursor_fail_at(gguf_cursor *c, uint64_t offset, dfl_status code, const char *fmt, ...) {
    if (c->failed) {
        return false;
    }
    c->failed = true;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (c->ctx[0] != '\0') {
        error_set(c->err, code, "%s: offset %llu: %s: %s", c->label, (unsigned long long)offset,
                  c->ctx, what);
    } else {
        error_set(c->err, code, "%s: offset %llu: %s", c->label, (unsigned long long)offset, what);
    }
    return false;
}

/* Checks that n bytes are left; on success returns a pointer to them and advances. */
static const uint8_t *cursor_take(gguf_cursor *c, const char *field, uint64_t n) {
    if (c->failed) {
        return NULL;
    }
    uint64_t left = gguf_cursor_left(c);
    if (n > left) {
        gguf_cursor_fail_at(c, c->pos, DFL_ERR_FORMAT,
                            "%s: file truncated (needs %llu bytes, %llu left of %llu)", field,
                            (unsigned long long)n, (unsigned long long)left,
                            (unsigned long long)c->size);
        return NULL;
    }
    const uint8_t *p = c->data + c->pos;
    c->pos += n;
    return p;
}

bool gguf_cursor_u8(gguf_cursor *c, const char *field, uint8_t *out) {
    const uint8_t *p = cursor_take(c, field, 1);
    if (p == NULL) return false;
    *out = p[0];
    return true;
}

bool gguf_cursor_u16(gguf_cursor *c, const char *field, uint16_t *out) {
    const uint8_t *p = cursor_take(c, field, 2);
    if (p == NULL) return false;
    *out = gguf_load_u16(p);
    return true;
}

bool gguf_cursor_u32(gguf_cursor *c, const char *field, uint32_t *out) {
    const uint8_t *p = cursor_take(c, field, 4);
    if (p == NULL) return false;
    *out = gguf_load_u32(p);
    return true;
}

bool gguf_cursor_u64(gguf_cursor *c, const char *field, uint64_t *out) {
    const uint8_t *p = cursor_take(c, field, 8);
    if (p == NULL) return false;
    *out = gguf_load_u64(p);
    return true;
}

bool gguf_cursor_str(gguf_cursor *c, const char *field, gguf_str *out) {
    uint64_t start = c->pos;
    uint64_t len;
    if (!gguf_cursor_u64(c, field, &len)) {
        return false;
    }
    if (len > gguf_cursor_left(c)) {
        return gguf_cursor_fail_at(c, start, DFL_ERR_FORMAT,
                                   "%s: string length %llu runs past the end of the file "
                                   "(%llu bytes left)", field, (unsigned long long)len,
                                   (unsigned long long)gguf_cursor_left(c));
    }
    out->ptr = (const char *)(c->data + c->pos);
    out->len = len;
    c->pos += len;
    return true;
}

bool gguf_cursor_skip(gguf_cursor *c, const char *field, uint64_t n) {
    return cursor_take(c, field, n) != NULL;
}

const char *gguf_str_quote(gguf_str s, char *buf, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    const size_t max_src = 80;
    if (cap == 0) return buf;
    for (uint64_t i = 0; i < s.len; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (i >= max_src) {
            if (o + 4 > cap) break;
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (ch >= 0x20 && ch < 0x7f && ch != '\\' && ch != '\'') {
            if (o + 2 > cap) break;
            buf[o++] = (char)ch;
        } else {
            if (o + 5 > cap) break;
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[ch >> 4];
            buf[o++] = hex[ch & 15];
        }
    }
    buf[o] = '\0';
    return buf;
}
