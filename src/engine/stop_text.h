/* stop_text.h: a sequence's text stream with stop strings: text is shown only once it can no
 * longer be the start of a stop string; a stop string that completes ends the stream, and
 * neither it nor anything after it is ever shown. Buffers grow as needed (never shrink). */
#ifndef DFL_ENGINE_STOP_TEXT_H
#define DFL_ENGINE_STOP_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STOP_TEXT_MAX_STRINGS 16
#define STOP_TEXT_MAX_LEN 256

/* A growable byte buffer, NUL-terminated. */
typedef struct text_buf {
    char *p;
    size_t n, cap;
} text_buf;

bool text_buf_append(text_buf *b, const char *s, size_t len);
void text_buf_free(text_buf *b);

typedef struct stop_text {
    char *stop[STOP_TEXT_MAX_STRINGS]; /* owned copies */
    size_t stop_len[STOP_TEXT_MAX_STRINGS];
    int32_t n_stop;
    text_buf held;                     /* text not shown yet: it may start a stop string */
} stop_text;

/* Replaces the stop strings (copies them) and empties the held text. False when out of memory. */
bool stop_text_set(stop_text *st, const char *const *stop, int32_t n_stop);
void stop_text_free(stop_text *st);
/* Adds text; appends to out what can be shown now. Returns 1 if a stop string matched (the text
 * before it was appended to out, the rest dropped), 0 if not, -1 when out of memory. */
int stop_text_push(stop_text *st, const char *text, size_t len, text_buf *out);
/* End of the stream without a stop: shows everything held. False when out of memory. */
bool stop_text_flush(stop_text *st, text_buf *out);

#endif
