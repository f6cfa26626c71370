/* error.c: the two error tiers (status + message for user input, abort for invariants). */
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *dfl_status_str(dfl_status code) {
    switch (code) {
    case DFL_OK: return "ok";
    case DFL_ERR_IO: return "i/o error";
    case DFL_ERR_FORMAT: return "format error";
    case DFL_ERR_UNSUPPORTED: return "unsupported";
    case DFL_ERR_MISSING: return "missing";
    case DFL_ERR_MISMATCH: return "mismatch";
    case DFL_ERR_INVALID: return "invalid argument";
    case DFL_ERR_NOMEM: return "out of memory";
    case DFL_ERR_CTX_FULL: return "context full";
    case DFL_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

dfl_status error_vset(dfl_error *err, dfl_status code, const char *fmt, va_list ap) {
    if (err == NULL || err->code != DFL_OK) {
        return code;
    }
    err->code = code;
    const int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    if (n >= (int)sizeof(err->msg)) {
        /* a message longer than the buffer ends in "..." (never cut silently) */
        memcpy(err->msg + sizeof(err->msg) - 4, "...", 4);
    }
    return code;
}

dfl_status error_set(dfl_error *err, dfl_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

void error_clear(dfl_error *err) {
    if (err != NULL) {
        err->code = DFL_OK;
        err->msg[0] = '\0';
    }
}

_Noreturn void error_abort(const char *file, int line, const char *what) {
    fprintf(stderr, "dflash: internal invariant failed at %s:%d: %s\n", file, line, what);
    abort();
}
