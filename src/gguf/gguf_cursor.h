/* gguf_cursor.h: a bounds-checked little-endian reader over a byte buffer with a sticky first
 * error. Every failure names the file, the byte offset, what was being read (the context, e.g.
 * "tensor 5 'blk.0.attn_q.weight'") and the field. Internal to src/gguf/. */
#ifndef DFL_GGUF_CURSOR_H
#define DFL_GGUF_CURSOR_H

#include "gguf/gguf.h"

typedef struct gguf_cursor {
    const uint8_t *data; /* [size] the whole file */
    uint64_t size;
    uint64_t pos;        /* next byte to read */
    const char *label;   /* file name for messages */
    char ctx[200];       /* what is being read, e.g. "kv 3 'general.name'" */
    dfl_error *err;      /* receives the first error (may be NULL) */
    bool failed;         /* sticky: once set, every read fails */
} gguf_cursor;

void gguf_cursor_init(gguf_cursor *c, const uint8_t *data, uint64_t size, const char *label,
                      dfl_error *err);
/* Sets the context printed in front of the field in error messages. */
void gguf_cursor_ctx(gguf_cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records an error at a byte offset ("label: offset N: ctx: message"); returns false. Only the
 * first error is kept. */
bool gguf_cursor_fail_at(gguf_cursor *c, uint64_t offset, dfl_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static inline uint64_t gguf_cursor_left(const gguf_cursor *c) { return c->size - c->pos; }

/* Each read checks the bytes are there (else "field: truncated ...") and advances. */
bool gguf_cursor_u8(gguf_cursor *c, const char *field, uint8_t *out);
bool gguf_cursor_u16(gguf_cursor *c, const char *field, uint16_t *out);
bool gguf_cursor_u32(gguf_cursor *c, const char *field, uint32_t *out);
bool gguf_cursor_u64(gguf_cursor *c, const char *field, uint64_t *out);
/* A GGUF string (u64 length + bytes); the bytes stay in the buffer. */
bool gguf_cursor_str(gguf_cursor *c, const char *field, gguf_str *out);
/* Skips n bytes (checked). */
bool gguf_cursor_skip(gguf_cursor *c, const char *field, uint64_t n);

/* Little-endian loads from validated memory. */
static inline uint16_t gguf_load_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}
static inline uint32_t gguf_load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t gguf_load_u64(const uint8_t *p) {
    return (uint64_t)gguf_load_u32(p) | (uint64_t)gguf_load_u32(p + 4) << 32;
}

/* Formats a string from the file for a message: printable ASCII kept, other bytes as \xNN,
 * cut to about 80 characters with "..." appended. Returns buf. */
const char *gguf_str_quote(gguf_str s, char *buf, size_t cap);

#endif
