/* test_peer_dspark.c: llama.cpp (node-llama-cpp 3.21.1, tests/peer/llama_load.mjs) loads the DSpark
 * drafters and the drafter options `dflash make-test-model` writes in the converter's layout
 * (docs/drafter.md, "DSpark" and "Drafter options"): every key and every tensor name and shape
 * accepted by its `dflash` architecture. Load only: a drafter context needs the target's, which
 * the JS API does not offer. Skips when node or the npm package is missing. */
#include "test.h"
#include "test_util.h"

#include <stdio.h>
#include <string.h>

TEST(peer_llama_loads_dspark_drafters) {
    if (!tu_have_node_package(t, "node-llama-cpp")) return;
    static const char *const variants[] = {
        /* anchor-first with the confidence head, markov_w2.scale, and every option */
        "--type q8_0 --dspark-rank 32 --markov-scale 0.5 --causal --swa 8 --softcap 30 --logit-scale 1.5",
        /* bonus anchor, no confidence head, f16 */
        "--type f16 --dspark-rank 16 --bonus-anchor --no-confidence --swa 4 --swa-pattern 0,1",
    };
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        char dir[300], name[16], cmd[2048], out[8192];
        snprintf(name, sizeof(name), "m%d", (int)v);
        test_path(t, name, dir, sizeof(dir));
        snprintf(cmd, sizeof(cmd), "%s make-test-model -o %s --n-layer 3 --draft-layers 2 --target-layers 1,3 %s",
                 test_cli_path(), dir, variants[v]);
        REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
        snprintf(cmd, sizeof(cmd), "node tests/peer/llama_load.mjs %s/drafter.gguf --load-only", dir);
        const int rc = test_run(cmd, out, sizeof(out));
        CHECK_MSG(rc == 0 && strstr(out, "\"ok\":true") != NULL, "llama.cpp refused the DSpark drafter (%s) (%d): %s",
                  variants[v], rc, out);
    }
}
