/* http.h: a strict HTTP/1.1 request parser for `dflash serve` (no I/O, no allocation). The server
 * keeps each connection's received bytes in a buffer and calls http_parse on it after every read:
 * the parser either needs more bytes, rejects the request with a status code and a reason, or
 * returns one complete request (head + Content-Length body) and how many bytes it used. */
#ifndef DFL_SERVE_HTTP_H
#define DFL_SERVE_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_HEAD 16384   /* request line + headers, bytes (above: 431) */
#define HTTP_MAX_TARGET 2048  /* request target, bytes (above: 414) */
#define HTTP_MAX_HEADERS 64   /* header lines (above: 431) */
#define HTTP_MAX_VALUE 1024   /* a kept header value, bytes (authorization, origin, ...) */

typedef enum http_parse_result {
    HTTP_INCOMPLETE = 0, /* need more bytes */
    HTTP_DONE = 1,       /* one request parsed; consumed bytes belong to it */
    HTTP_ERROR = 2,      /* the request is invalid: answer status and close */
} http_parse_result;

typedef struct http_request {
    char method[16];
    char path[HTTP_MAX_TARGET + 1];  /* the target up to '?' */
    char query[HTTP_MAX_TARGET + 1]; /* after '?', without it ("" if none) */
    int version_minor;               /* HTTP/1.0 or HTTP/1.1 */
    bool keep_alive;                 /* the connection may serve another request afterwards */
    bool expect_continue;            /* "Expect: 100-continue" */
    int64_t content_length;          /* -1: none given */
    /* header values the server uses (truncated to HTTP_MAX_VALUE - 1 bytes; "" if absent) */
    char authorization[HTTP_MAX_VALUE];
    char x_api_key[HTTP_MAX_VALUE];
    char origin[HTTP_MAX_VALUE];
    char content_type[HTTP_MAX_VALUE];
    size_t head_len;                 /* bytes of the request line + headers (+ the blank line) */
    const char *body;                /* points into the parsed buffer; body_len bytes */
    size_t body_len;
    size_t consumed;                 /* head_len + body_len */
} http_request;

/* Parses the request at the start of buf[0..len). max_body: the largest body accepted (a larger
 * Content-Length gives HTTP_ERROR with status 413 as soon as the head is complete, before the body
 * arrives). On HTTP_ERROR *status is 400, 413, 414, 431, 501 or 505 and *why says what is wrong.
 * On HTTP_INCOMPLETE with a complete head, req->head_len and req->content_length are set (so a
 * caller can answer "Expect: 100-continue"). */
http_parse_result http_parse(const char *buf, size_t len, size_t max_body, http_request *req, int *status,
                             const char **why);

/* The reason phrase of a status code ("OK", "Not Found", ...). */
const char *http_reason(int status);

#endif
