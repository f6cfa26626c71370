/* test_peer_llama.c: llama.cpp (node-llama-cpp 3.21.1, tests/peer/llama_load.mjs) loads the
 * files `dflash make-test-model` writes: targets of every weight type generate tokens greedily,
 * llama.cpp's BPE tokenizes a prompt into the test vocabulary's merged tokens, and the DFlash
 * drafter loads. Skips when node or the npm package is missing. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "test_util.h"
#include "gguf/gguf.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PEER_SCRIPT "tests/peer/llama_load.mjs"


/* Id of the token whose text is `text` in the file's token list, or -1. */
static long token_id(const gguf_file *f, const char *text) {
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (toks == NULL) return -1;
    for (uint64_t i = 0; i < toks->arr_n; i++) {
        gguf_str s;
        if (gguf_arr_str(toks, i, &s) && gguf_str_eq(s, text)) return (long)i;
    }
    return -1;
}

/* Parses the int array after `"key":[` in line; returns the count (up to cap), -1 if absent. */
static int json_int_array(const char *line, const char *key, long *out, int cap) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":[", key);
    const char *p = strstr(line, pat);
    if (p == NULL) return -1;
    p += strlen(pat);
    int n = 0;
    while (*p && *p != ']') {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return -1;
        if (n < cap) out[n] = v;
        n++;
        p = end;
        if (*p == ',') p++;
    }
    return *p == ']' ? n : -1;
}

TEST(peer_llama_generates_from_test_targets) {
    if (!tu_have_node_package(t, "node-llama-cpp")) return;
    /* target variants: weight type, output head, architecture */
    const struct { const char *type; const char *extra; } variants[] = {
        {"f32", "--tied"}, {"f16", "--untied"}, {"q8_0", "--untied"}, {"q4_0", "--untied"},
        {"bf16", "--tied"}, {"q8_0", "--arch llama --untied"},
    };
    enum { NV = sizeof(variants) / sizeof(variants[0]) };
    char dirs[NV][300];
    char cmd[8192], out[16384];
    size_t len = (size_t)snprintf(cmd, sizeof(cmd), "node %s", PEER_SCRIPT);
    for (int i = 0; i < NV; i++) {
        char name[32], sub[2048];
        snprintf(name, sizeof(name), "m%d", i);
        test_path(t, name, dirs[i], sizeof(dirs[i]));
        snprintf(sub, sizeof(sub), "%s make-test-model -o %s --type %s %s --n-layer 2 --seed %d",
                 test_cli_path(), dirs[i], variants[i].type, variants[i].extra, 11 + i);
        int rc = test_run(sub, out, sizeof(out));
        if (rc != 0) {
            test_fail(t, __FILE__, __LINE__, "%s: %s", sub, out);
            return;
        }
        len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " %s/target.gguf", dirs[i]);
    }
    snprintf(cmd + len, sizeof(cmd) - len, " --prompt ' the quick brown fox' --n 5");
    int rc = test_run(cmd, out, sizeof(out));
    CHECK_MSG(rc == 0, "node failed (%d): %s", rc, out);

    /* the prompt must be tokenized into the vocabulary's merged word tokens */
    char path[400];
    snprintf(path, sizeof(path), "%s/target.gguf", dirs[0]);
    dfl_error err = {0};
    gguf_file *f = gguf_open(path, &err);
    REQUIRE(f != NULL);
    long want[4] = {token_id(f, "\xc4\xa0the"), token_id(f, "\xc4\xa0quick"), token_id(f, "\xc4\xa0" "brown"),
                    token_id(f, "\xc4\xa0" "fox")};
    gguf_close(f);
    CHECK(want[0] >= 256 && want[1] >= 256 && want[2] >= 256 && want[3] >= 256);

    int n_lines = 0;
    for (char *line = strtok(out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strstr(line, "\"model\":") == NULL) continue;
        n_lines++;
        CHECK_MSG(strstr(line, "\"ok\":true") != NULL, "llama.cpp failed: %s", line);
        long prompt[8], gen[8];
        int np = json_int_array(line, "prompt", prompt, 8);
        int ng = json_int_array(line, "generated", gen, 8);
        CHECK_MSG(np == 4 && prompt[0] == want[0] && prompt[1] == want[1] && prompt[2] == want[2] &&
                  prompt[3] == want[3], "prompt tokens differ from [%ld,%ld,%ld,%ld]: %s", want[0], want[1],
                  want[2], want[3], line);
        CHECK_MSG(ng == 5, "expected 5 generated tokens: %s", line);
        for (int i = 0; i < ng && i < 8; i++) CHECK_MSG(gen[i] >= 0 && gen[i] < 1024, "bad token id: %s", line);
    }
    CHECK_EQ_INT(n_lines, NV);
}

TEST(peer_llama_loads_test_drafter) {
    if (!tu_have_node_package(t, "node-llama-cpp")) return;
    char dir[300], cmd[2048], out[8192];
    test_path(t, "m", dir, sizeof(dir));
    snprintf(cmd, sizeof(cmd), "%s make-test-model -o %s --type q8_0 --n-layer 3 --draft-layers 2 --target-layers 1,3",
             test_cli_path(), dir);
    REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
    /* llama.cpp knows the dflash architecture: the drafter must load (its keys and every tensor
     * name and shape accepted). A context of its own needs the target's (ctx_other), which the
     * JS API does not offer, so only loading is checked. */
    snprintf(cmd, sizeof(cmd), "node %s %s/drafter.gguf --load-only", PEER_SCRIPT, dir);
    int rc = test_run(cmd, out, sizeof(out));
    CHECK_MSG(rc == 0 && strstr(out, "\"ok\":true") != NULL, "llama.cpp refused the drafter (%d): %s", rc, out);
}

/* A DFlash2 drafter of make-test-model (docs/drafter.md "DFlash2") loads in llama.cpp as DFlash2:
 * its loader creates every conv and selector tensor with the converter's shapes (a tensor it did
 * not create would fail the load's tensor count) and logs the keys we wrote. Two shapes: quantized
 * matrices with 2 layers, and f32 with one group over all channels and top-1. */
TEST(peer_llama_loads_dflash2_drafter) {
    if (!tu_have_node_package(t, "node-llama-cpp")) return;
    const char *cfg[][2] = {
        {"--type q8_0 --n-layer 3 --draft-layers 2 --target-layers 1,3 --block-size 8 --dflash2 3,8,32,4",
         "DFlash2 conv kernel = 3, group = 8, selector rank = 32, top-k = 4"},
        {"--type f32 --n-layer 3 --draft-layers 1 --target-layers 1,2 --block-size 6 --dflash2 4,64,8,1",
         "DFlash2 conv kernel = 4, group = 64, selector rank = 8, top-k = 1"},
    };
    for (int c = 0; c < 2; c++) {
        char dir[300], cmd[2048], out[8192], name[16];
        snprintf(name, sizeof(name), "d2_%d", c);
        test_path(t, name, dir, sizeof(dir));
        snprintf(cmd, sizeof(cmd), "%s make-test-model -o %s %s", test_cli_path(), dir, cfg[c][0]);
        REQUIRE(test_run(cmd, out, sizeof(out)) == 0);
        snprintf(cmd, sizeof(cmd), "node %s %s/drafter.gguf --load-only --log-grep DFlash2", PEER_SCRIPT, dir);
        int rc = test_run(cmd, out, sizeof(out));
        CHECK_MSG(rc == 0 && strstr(out, "\"ok\":true") != NULL, "llama.cpp refused the DFlash2 drafter (%d): %s", rc, out);
        CHECK_MSG(strstr(out, cfg[c][1]) != NULL, "llama.cpp did not load it as DFlash2 (%s): %s", cfg[c][1], out);
    }
}

/* Every committed drafter of the embedded pair (models/README.md) loads in llama.cpp as its
 * family: DFlash, DSpark (its log names the Markov head), DFlash2 (its log names the conv and
 * selector keys). */
TEST(peer_llama_loads_committed_drafters) {
    if (!tu_have_node_package(t, "node-llama-cpp")) return;
    const char *files[][2] = {
        {"models/drafter.gguf", ""},
        {"models/drafter-dspark.gguf", "DFlash with DSpark markov head (rank = "},
        {"models/drafter-dflash2.gguf", "DFlash2 conv kernel = "},
    };
    for (int f = 0; f < 3; f++) {
        char cmd[2048], out[8192];
        snprintf(cmd, sizeof(cmd), "node %s %s --load-only%s%s%s", PEER_SCRIPT, files[f][0], files[f][1][0] ? " --log-grep '" : "",
                 files[f][1], files[f][1][0] ? "'" : "");
        const int rc = test_run(cmd, out, sizeof(out));
        CHECK_MSG(rc == 0 && strstr(out, "\"ok\":true") != NULL, "llama.cpp refused %s (%d): %s", files[f][0], rc, out);
        if (files[f][1][0]) {
            CHECK_MSG(strstr(out, files[f][1]) != NULL, "llama.cpp did not load %s as its family: %s", files[f][0], out);
        }
    }
}
