/* runner.c: table-driven test runner. `dflash-tests` runs all, `dflash-tests FILTER...` the tests
 * whose name contains any filter, `--list` prints the names. Ends with "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <ftw.h>

#define TEST_ENTRY(n) void test_##n(test_ctx *t);
#include "test_list.h"
#undef TEST_ENTRY

typedef struct test_entry {
    const char *name;
    void (*fn)(test_ctx *t);
} test_entry;

static const test_entry k_tests[] = {
#define TEST_ENTRY(n) {#n, test_##n},
#include "test_list.h"
#undef TEST_ENTRY
};

void test_fail(test_ctx *t, const char *file, int line, const char *fmt, ...) {
    t->n_fail++;
    if (t->quiet) return;
    fprintf(stderr, "  FAIL %s (%s:%d): ", t->name, file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void test_skip(test_ctx *t, const char *why) {
    t->skipped = true;
    snprintf(t->skip_why, sizeof(t->skip_why), "%s", why);
    fprintf(stderr, "  SKIP %s: %s\n", t->name, why);
}

const char *test_path(test_ctx *t, const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s", t->tmpdir, name);
    return buf;
}

const char *test_cli_path(void) {
    const char *p = getenv("DFLASH_CLI");
    return p != NULL ? p : "build/dflash";
}

int test_run(const char *cmd, char *out, size_t cap) {
    char full[8192];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    if (f == NULL) return -1;
    size_t n = 0;
    if (cap > 0) {
        int c;
        while ((c = fgetc(f)) != EOF) {
            if (n + 1 < cap) out[n++] = (char)c;
        }
        out[n] = '\0';
    } else {
        while (fgetc(f) != EOF) {}
    }
    int st = pclose(f);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static bool matches(const char *name, int n_filter, char **filters) {
    if (n_filter == 0) return true;
    for (int i = 0; i < n_filter; i++) {
        if (strstr(name, filters[i]) != NULL) return true;
    }
    return false;
}

int main(int argc, char **argv) {
    const size_t n_tests = sizeof(k_tests) / sizeof(k_tests[0]);
    char *filters[64];
    int n_filter = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            for (size_t k = 0; k < n_tests; k++) printf("%s\n", k_tests[k].name);
            return 0;
        }
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: %s [--list] [FILTER...]\n", argv[0]);
            return 0;
        }
        if (n_filter < 64) filters[n_filter++] = argv[i];
    }
    /* a filter that selects no test is a mistake (e.g. a stale name in the Makefile's TSan list) */
    for (int i = 0; i < n_filter; i++) {
        bool any = false;
        for (size_t k = 0; k < n_tests && !any; k++) any = strstr(k_tests[k].name, filters[i]) != NULL;
        if (!any) {
            fprintf(stderr, "filter '%s' matches no test (--list shows them)\n", filters[i]);
            return 2;
        }
    }
    int n_pass = 0, n_fail = 0, n_skip = 0;
    /* the skipped tests and their reasons, for the summary: a skip must never read as a pass */
    char *skips = NULL;
    size_t skips_len = 0;
    for (size_t k = 0; k < n_tests; k++) {
        if (!matches(k_tests[k].name, n_filter, filters)) continue;
        test_ctx t;
        memset(&t, 0, sizeof(t));
        t.name = k_tests[k].name;
        snprintf(t.tmpdir, sizeof(t.tmpdir), "/tmp/dflash-test-XXXXXX");
        if (mkdtemp(t.tmpdir) == NULL) {
            fprintf(stderr, "cannot create a temporary directory\n");
            return 2;
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        k_tests[k].fn(&t);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        nftw(t.tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (t.n_fail > 0) {
            n_fail++;
            printf("FAIL %-48s %8.1f ms\n", t.name, ms);
        } else if (t.skipped) {
            n_skip++;
            printf("skip %-48s %8.1f ms\n", t.name, ms);
            const size_t add = strlen(t.name) + strlen(t.skip_why) + 8;
            char *grown = realloc(skips, skips_len + add + 1);
            if (grown != NULL) {
                skips = grown;
                skips_len += (size_t)snprintf(skips + skips_len, add + 1, "  %s: %s\n", t.name, t.skip_why);
            }
        } else {
            n_pass++;
            printf("ok   %-48s %8.1f ms\n", t.name, ms);
        }
        fflush(stdout);
    }
    if (n_skip > 0) {
        printf("%d skipped (not passed):\n%s", n_skip, skips != NULL ? skips : "");
    }
    free(skips);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
