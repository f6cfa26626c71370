/* test_serve.c: `dflash serve` end to end with the official OpenAI client (openai@6.49.0 in
 * tests/peer, script tests/peer/serve_openai.mjs): the script starts servers with the embedded
 * pair on loopback ports the kernel picks, and checks the API (models, chat, completions, stream
 * == non-stream, max_tokens, stop, the error classes for 400/401/404/413/503), lossless concurrent
 * streams (== `dflash generate`, tau == solo tau), cancellation (20 aborted streams leave 0
 * running), and a bounded load (64 clients x 8 requests). Every server must stop with exit 0 on
 * SIGTERM (under ASan that also means no leak). Each part runs under `timeout`; skips when node
 * or the npm package is missing. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_util.h"

#include <string.h>
#include <unistd.h>

#define SERVE_SCRIPT "tests/peer/serve_openai.mjs"

static bool serve_peer_available(test_ctx *t) {
    char out[256];
    if (test_run("command -v timeout", out, sizeof(out)) != 0) {
        test_skip(t, "coreutils timeout is missing");
        return false;
    }
    return tu_have_node_package(t, "openai");
}

static void run_part(test_ctx *t, const char *part, int timeout_s) {
    if (!serve_peer_available(t)) return;
    static char out[1 << 16];
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "timeout -k 10 %d node %s %s %s", timeout_s, SERVE_SCRIPT, test_cli_path(), part);
    const int rc = test_run(cmd, out, sizeof(out));
    const size_t len = strlen(out);
    const char *tail = len > 6000 ? out + len - 6000 : out;
    CHECK_MSG(rc == 0 && strstr(out, "ALL OK") != NULL, "%s: exit %d%s\n%s", cmd, rc,
              rc == 124 ? " (timed out)" : "", tail);
}

TEST(serve_openai_api) {
    run_part(t, "api", 400);
}

TEST(serve_openai_lossless_concurrent) {
    run_part(t, "lossless", 500);
}

TEST(serve_openai_cancel) {
    run_part(t, "cancel", 300);
}

TEST(serve_openai_load) {
    run_part(t, "load", 500);
}
