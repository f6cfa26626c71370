/* error.h: filling a dfl_error (the user-caused error tier) and aborting on broken invariants. */
#ifndef DFL_BASE_ERROR_H
#define DFL_BASE_ERROR_H

#include "dflash.h"
#include <stdarg.h>

/* Sets err (if not NULL and not already set) and returns code. The first error wins. */
dfl_status error_set(dfl_error *err, dfl_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
dfl_status error_vset(dfl_error *err, dfl_status code, const char *fmt, va_list ap);
/* Clears err to DFL_OK with an empty message. */
void error_clear(dfl_error *err);

/* Invariant violated inside the library: print file:line and abort (never for user input). */
_Noreturn void error_abort(const char *file, int line, const char *what);
#define DFL_ASSERT(x) do { if (!(x)) error_abort(__FILE__, __LINE__, #x); } while (0)

#endif
