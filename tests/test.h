/* test.h: the table-driven test framework. A test is `TEST(name) { ... }` in any tests/test_*.c;
 * tests/gen_list.sh collects them into build/test_list.h, and tests/runner.c lists, filters and
 * runs them, ending with "N passed, N failed". */
#ifndef DFL_TEST_H
#define DFL_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct test_ctx {
    const char *name;
    int n_fail;    /* failed checks in this test */
    bool skipped;  /* the test skipped itself (test_skip) */
    bool quiet;    /* failures are counted but not printed (a test of a test helper) */
    char skip_why[512]; /* the reason given to test_skip (the last one), printed in the summary */
    char tmpdir[256]; /* a fresh directory for this test's files, removed afterwards */
} test_ctx;

void test_fail(test_ctx *t, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void test_skip(test_ctx *t, const char *why);
/* Path of a file inside the test's temporary directory (static buffer per call slot 0..3). */
const char *test_path(test_ctx *t, const char *name, char *buf, size_t cap);
/* Path of the built dflash CLI (for tests that run it). */
const char *test_cli_path(void);
/* Runs a shell command, captures up to cap-1 bytes of stdout+stderr in out; returns the exit status. */
int test_run(const char *cmd, char *out, size_t cap);

#define TEST(name) void test_##name(test_ctx *t)

#define CHECK(cond) \
    do { if (!(cond)) test_fail(t, __FILE__, __LINE__, "CHECK(%s)", #cond); } while (0)
#define REQUIRE(cond) \
    do { if (!(cond)) { test_fail(t, __FILE__, __LINE__, "REQUIRE(%s)", #cond); return; } } while (0)
#define CHECK_MSG(cond, ...) \
    do { if (!(cond)) test_fail(t, __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define CHECK_EQ_INT(a, b) \
    do { long long a_ = (long long)(a), b_ = (long long)(b); \
         if (a_ != b_) test_fail(t, __FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); } while (0)
#define CHECK_NEAR(a, b, tol) \
    do { double a_ = (double)(a), b_ = (double)(b), d_ = a_ - b_; if (d_ < 0) d_ = -d_; \
         if (!(d_ <= (double)(tol))) test_fail(t, __FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, a_, b_, (double)(tol)); } while (0)
#define CHECK_STR_CONTAINS(hay, needle) \
    do { const char *h_ = (hay); if (h_ == NULL || strstr(h_, (needle)) == NULL) \
         test_fail(t, __FILE__, __LINE__, "\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", (needle)); } while (0)

#endif
