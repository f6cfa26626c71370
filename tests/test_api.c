/* test_api.c: the public surface: the shared library next to the CLI exports the functions of
 * include/dflash.h and nothing else, every one of them, and it does not link PCRE2. */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST(api_shared_library_exports_only_dfl) {
    char so[1024], cmd[2048];
    snprintf(so, sizeof(so), "%s", test_cli_path());
    char *slash = strrchr(so, '/');
    if (slash != NULL) slash[1] = '\0';
    else so[0] = '\0';
    strncat(so, "libdflash.so", sizeof(so) - strlen(so) - 1);
    if (access(so, R_OK) != 0) {
        test_skip(t, "no libdflash.so beside the CLI (sanitizer builds link statically)");
        return;
    }
    static char out[1 << 16];
    snprintf(cmd, sizeof(cmd), "nm -D --defined-only %s | awk '{print $3}'", so);
    if (test_run(cmd, out, sizeof(out)) != 0 || out[0] == '\0') {
        test_skip(t, "nm is not available");
        return;
    }
    int n_dfl = 0, n_other = 0;
    for (char *line = strtok(out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "dfl_", 4) == 0) n_dfl++;
        else if (line[0] != '\0' && strcmp(line, "_init") != 0 && strcmp(line, "_fini") != 0) {
            if (n_other++ < 5) test_fail(t, __FILE__, __LINE__, "libdflash.so exports %s", line);
        }
    }
    /* the header's declarations: every DFL_API function is exported */
    snprintf(cmd, sizeof(cmd), "grep -c '^DFL_API' include/dflash.h");
    char cnt[64];
    REQUIRE(test_run(cmd, cnt, sizeof(cnt)) == 0);
    printf("    libdflash.so exports %d dfl_ functions (the header declares %ld), %d others\n", n_dfl, atol(cnt), n_other);
    CHECK_EQ_INT(n_other, 0);
    CHECK_EQ_INT(n_dfl, atol(cnt));
    snprintf(cmd, sizeof(cmd), "ldd %s", so);
    static char deps[8192];
    if (test_run(cmd, deps, sizeof(deps)) == 0) CHECK_MSG(strstr(deps, "pcre2") == NULL, "libdflash.so links PCRE2: %s", deps);
}
