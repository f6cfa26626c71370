/* test_cluster.c: replicas behind HAProxy (deploy/haproxy/dflash.cfg, tools/cluster.sh): three
 * `dflash serve` replicas of the embedded pair, 8 clients x 10 requests through the official
 * OpenAI client with one replica drained (SIGTERM) and one killed (SIGKILL) mid-run, then both
 * restarted (tests/peer/cluster_fault.mjs says what is required). Skips, with the reason, where
 * node, the openai package, haproxy or curl is missing (make deps installs them). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool cluster_available(test_ctx *t) {
    char out[256];
    static const char *const need[][2] = {
        {"command -v haproxy", "haproxy is not installed (make deps)"},
        {"command -v curl", "curl is not installed (make deps)"},
    };
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
        if (test_run(need[i][0], out, sizeof(out)) != 0) {
            test_skip(t, need[i][1]);
            return false;
        }
    }
    return tu_have_node_package(t, "openai");
}

TEST(cluster_haproxy_drain_kill_restart) {
    if (!cluster_available(t)) return;
    char cwd[1024], cli[1200], dir[512], cmd[4096];
    REQUIRE(getcwd(cwd, sizeof(cwd)) != NULL);
    const char *c = test_cli_path();
    if (c[0] == '/') snprintf(cli, sizeof(cli), "%s", c);
    else snprintf(cli, sizeof(cli), "%s/%s", cwd, c);
    test_path(t, "cluster", dir, sizeof(dir));
    /* ports P (HAProxy), P+1..P+3 (replicas), P+100 (stats): spread by pid so parallel runs of
     * the suite (sanitizer builds) do not collide */
    const int port = 21000 + (int)(getpid() % 400) * 10;
    char out[65536];
    snprintf(cmd, sizeof(cmd), "cd tests/peer && timeout 600 node cluster_fault.mjs '%s' '%s' %d '%s'", cwd, cli, port,
             dir);
    const int rc = test_run(cmd, out, sizeof(out));
    /* the figures and checks, for the log */
    for (char *line = strtok(out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "ok ", 3) == 0 || strncmp(line, "figures", 7) == 0 || strncmp(line, "(after", 6) == 0) {
            printf("    %s\n", line);
        } else {
            fprintf(stderr, "    %s\n", line);
        }
    }
    CHECK_MSG(rc == 0, "cluster_fault.mjs failed (rc %d): see the lines above", rc);
    /* whatever happened, nothing of the cluster may outlive the test */
    snprintf(cmd, sizeof(cmd), "tools/cluster.sh down --dir '%s' >/dev/null 2>&1", dir);
    test_run(cmd, NULL, 0);
}
