/* http.c: the strict HTTP/1.1 request parser of `dflash serve` (see http.h). RFC 9112 rules it
 * enforces: CRLF line ends, a request line of exactly three parts, token method and header names,
 * an origin-form target ('/'... or '*'), HTTP/1.0 or HTTP/1.1, no obsolete line folding, Host for
 * HTTP/1.1, one Content-Length of digits only (duplicates must agree), no Transfer-Encoding
 * (request bodies are small JSON documents; chunked uploads are refused with 501). */
#include "http.h"

#include <string.h>

static bool is_tchar(unsigned char c) {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
    return strchr("!#$%&'*+-.^_`|~", c) != NULL && c != '\0';
}

static bool is_vchar_or_ws(unsigned char c) {
    return c == ' ' || c == '\t' || (c >= 0x21 && c != 0x7f);
}

static bool name_is(const char *p, size_t n, const char *want) {
    size_t m = strlen(want);
    if (n != m) return false;
    for (size_t i = 0; i < n; i++) {
        char a = p[i], b = want[i];
        if (a >= 'A' && a <= 'Z') a = (char)(a - 'A' + 'a');
        if (a != b) return false;
    }
    return true;
}

/* Case-insensitive search for a comma-separated token in a header value. */
static bool value_has_token(const char *v, size_t n, const char *tok) {
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
        size_t s = i;
        while (i < n && v[i] != ',') i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (e > s && name_is(v + s, e - s, tok)) return true;
    }
    return false;
}

static void keep(char *dst, const char *v, size_t n) {
    if (n > HTTP_MAX_VALUE - 1) n = HTTP_MAX_VALUE - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

#define FAIL(st, msg)      \
    do {                   \
        *status = (st);    \
        *why = (msg);      \
        return HTTP_ERROR; \
    } while (0)

http_parse_result http_parse(const char *buf, size_t len, size_t max_body, http_request *req, int *status,
                             const char **why) {
    memset(req, 0, sizeof(*req));
    req->content_length = -1;
    *status = 0;
    *why = "";
    /* find the end of the head */
    size_t head_end = 0;
    bool found = false;
    const size_t scan = len < HTTP_MAX_HEAD ? len : HTTP_MAX_HEAD;
    for (size_t i = 0; i + 3 < scan; i++) {
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
            head_end = i + 4;
            found = true;
            break;
        }
    }
    /* a bare LF or a NUL anywhere in what we have of the head is an error right away */
    for (size_t i = 0; i < (found ? head_end : scan); i++) {
        if (buf[i] == '\n' && (i == 0 || buf[i - 1] != '\r')) FAIL(400, "bare LF in the request head (CRLF required)");
        if (buf[i] == '\0') FAIL(400, "NUL byte in the request head");
    }
    if (!found) {
        if (len >= HTTP_MAX_HEAD) FAIL(431, "request head larger than 16384 bytes");
        return HTTP_INCOMPLETE;
    }
    req->head_len = head_end;
    /* request line */
    const char *p = buf, *end = buf + head_end - 2; /* end: the final CRLF */
    const char *eol = memchr(p, '\r', (size_t)(end - p));
    if (eol == NULL || eol == p) FAIL(400, "empty request line");
    const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    if (sp1 == NULL || sp1 == p) FAIL(400, "malformed request line");
    if ((size_t)(sp1 - p) >= sizeof(req->method)) FAIL(501, "unknown method");
    for (const char *c = p; c < sp1; c++) {
        if (!is_tchar((unsigned char)*c)) FAIL(400, "invalid character in the method");
    }
    memcpy(req->method, p, (size_t)(sp1 - p));
    const char *tgt = sp1 + 1;
    const char *sp2 = memchr(tgt, ' ', (size_t)(eol - tgt));
    if (sp2 == NULL || sp2 == tgt) FAIL(400, "malformed request line");
    const size_t tlen = (size_t)(sp2 - tgt);
    if (tlen > HTTP_MAX_TARGET) FAIL(414, "request target longer than 2048 bytes");
    for (const char *c = tgt; c < sp2; c++) {
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c == 0x7f) FAIL(400, "invalid character in the request target");
    }
    if (tgt[0] != '/' && !(tlen == 1 && tgt[0] == '*')) FAIL(400, "the request target must start with '/'");
    const char *q = memchr(tgt, '?', tlen);
    const size_t plen = q ? (size_t)(q - tgt) : tlen;
    memcpy(req->path, tgt, plen);
    if (q) memcpy(req->query, q + 1, tlen - plen - 1);
    const char *ver = sp2 + 1;
    if (eol - ver != 8 || memcmp(ver, "HTTP/1.", 7) != 0) {
        if (eol - ver >= 5 && memcmp(ver, "HTTP/", 5) == 0 && memchr(ver, ' ', (size_t)(eol - ver)) == NULL)
            FAIL(505, "only HTTP/1.0 and HTTP/1.1 are supported");
        FAIL(400, "malformed HTTP version");
    }
    if (ver[7] != '0' && ver[7] != '1') FAIL(505, "only HTTP/1.0 and HTTP/1.1 are supported");
    req->version_minor = ver[7] - '0';
    req->keep_alive = req->version_minor == 1;
    /* headers */
    bool have_host = false, conn_close = false, conn_keep = false;
    int n_headers = 0;
    p = eol + 2;
    while (p < end) {
        eol = memchr(p, '\r', (size_t)(end - p + 1));
        if (eol == NULL) FAIL(400, "malformed header line");
        if (*p == ' ' || *p == '\t') FAIL(400, "obsolete header line folding");
        if (++n_headers > HTTP_MAX_HEADERS) FAIL(431, "more than 64 header lines");
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (colon == NULL || colon == p) FAIL(400, "header line without a name");
        for (const char *c = p; c < colon; c++) {
            if (!is_tchar((unsigned char)*c)) FAIL(400, "invalid character in a header name");
        }
        const char *v = colon + 1, *ve = eol;
        while (v < ve && (*v == ' ' || *v == '\t')) v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        for (const char *c = v; c < ve; c++) {
            if (!is_vchar_or_ws((unsigned char)*c)) FAIL(400, "invalid character in a header value");
        }
        const size_t nlen = (size_t)(colon - p), vlen = (size_t)(ve - v);
        if (name_is(p, nlen, "content-length")) {
            if (vlen == 0 || vlen > 18) FAIL(400, "invalid Content-Length");
            int64_t cl = 0;
            for (size_t i = 0; i < vlen; i++) {
                if (v[i] < '0' || v[i] > '9') FAIL(400, "invalid Content-Length");
                cl = cl * 10 + (v[i] - '0');
            }
            if (req->content_length >= 0 && req->content_length != cl) FAIL(400, "conflicting Content-Length headers");
            req->content_length = cl;
        } else if (name_is(p, nlen, "transfer-encoding")) {
            FAIL(501, "Transfer-Encoding is not supported for requests (send Content-Length)");
        } else if (name_is(p, nlen, "host")) {
            if (have_host) FAIL(400, "more than one Host header");
            have_host = true;
        } else if (name_is(p, nlen, "connection")) {
            if (value_has_token(v, vlen, "close")) conn_close = true;
            if (value_has_token(v, vlen, "keep-alive")) conn_keep = true;
        } else if (name_is(p, nlen, "expect")) {
            if (!name_is(v, vlen, "100-continue")) FAIL(400, "unsupported Expect header");
            req->expect_continue = true;
        } else if (name_is(p, nlen, "authorization")) {
            keep(req->authorization, v, vlen);
        } else if (name_is(p, nlen, "x-api-key")) {
            keep(req->x_api_key, v, vlen);
        } else if (name_is(p, nlen, "origin")) {
            keep(req->origin, v, vlen);
        } else if (name_is(p, nlen, "content-type")) {
            keep(req->content_type, v, vlen);
        }
        p = eol + 2;
    }
    if (req->version_minor == 1 && !have_host) FAIL(400, "HTTP/1.1 request without a Host header");
    if (conn_close) req->keep_alive = false;
    if (req->version_minor == 0 && conn_keep && !conn_close) req->keep_alive = true;
    const int64_t cl = req->content_length < 0 ? 0 : req->content_length;
    if ((uint64_t)cl > max_body) FAIL(413, "request body too large");
    if (len - head_end < (size_t)cl) return HTTP_INCOMPLETE;
    req->body = buf + head_end;
    req->body_len = (size_t)cl;
    req->consumed = head_end + (size_t)cl;
    return HTTP_DONE;
}

const char *http_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
