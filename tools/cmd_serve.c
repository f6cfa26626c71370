/* cmd_serve.c: `dflash serve`: an OpenAI-compatible HTTP server over one engine (target +
 * drafter, -np concurrent sequences). Option names follow llama-server where it has them. The
 * server itself is tools/serve/ (docs/server.md). */
#include "cli_common.h"
#include "cmds.h"
#include "serve/server.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *out) {
    fprintf(out,
            "usage: dflash serve [-m TARGET.gguf] [-md DRAFT.gguf] [options]\n"
            "  --host H           address to listen on (default 127.0.0.1)\n"
            "  --port N           port (default 8080; 0: any free port, printed at start-up)\n"
            "  -np, --parallel N  concurrent sequences (default 4)\n"
            "  -c, --ctx-size N   context per sequence (default 4096)\n"
            "  -a, --alias NAME   the model id clients see (default: the target's file name)\n"
            "  --api-key K        require Authorization: Bearer K (or X-Api-Key: K); /health stays public\n"
            "  --cors-origin O    send Access-Control-Allow-Origin: O (and answer preflights)\n"
            "  --max-queue N      waiting requests beyond the free sequences before 503 (default 256)\n"
            "  --timeout S        idle/stalled connection timeout and shutdown grace, seconds (default 600)\n"
            "  --max-body BYTES   largest request body (default 8388608; larger: 413)\n"
            "  --prefill-chunk N  a joining prompt is prefilled N tokens per step, between the running\n"
            "                     streams' steps (default 256; 0: the whole prompt at once)\n"
            "  --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed: defaults for requests that\n"
            "                     do not set them (the request's fields win)\n");
    cli_print_common_help(out);
    return out == stdout ? 0 : 2;
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int cmd_serve(int argc, char **argv) {
    cli_opts o;
    cli_opts_default(&o);
    o.n_seq = 4;
    srv_opts so;
    srv_opts_default(&so);
    bool seed_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        long n;
        struct { const char *name; long lo, hi; } ints[] = {
            {"--port", 0, 65535}, {"--max-queue", 0, 1 << 20}, {"--timeout", 1, 86400}, {"--max-body", 1024, INT_MAX},
            {"--prefill-chunk", 0, 1 << 20}};
        bool done = false;
        for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
            if (strcmp(a, ints[k].name) != 0) continue;
            if (v == NULL || !parse_int(v, ints[k].lo, ints[k].hi, &n)) {
                fprintf(stderr, "dflash serve: %s needs an integer in [%ld, %ld]\n", a, ints[k].lo, ints[k].hi);
                return 2;
            }
            if (k == 0) so.port = (int)n;
            else if (k == 1) so.max_queue = (int32_t)n;
            else if (k == 2) so.timeout_s = (int32_t)n;
            else if (k == 3) so.max_body = (size_t)n;
            else so.prefill_chunk = n;
            i++;
            done = true;
        }
        if (done) continue;
        const char **strs[] = {&so.host, &so.api_key, &so.cors_origin, &so.alias, &so.alias};
        const char *snames[] = {"--host", "--api-key", "--cors-origin", "--alias", "-a"};
        for (size_t k = 0; k < sizeof(snames) / sizeof(snames[0]); k++) {
            if (strcmp(a, snames[k]) != 0) continue;
            if (v == NULL || v[0] == '\0') {
                fprintf(stderr, "dflash serve: %s needs a non-empty value\n", a);
                return 2;
            }
            *strs[k] = v;
            i++;
            done = true;
        }
        if (done) continue;
        if (!strcmp(a, "--seed") || !strcmp(a, "-s")) seed_given = true;
        int r = cli_parse_common(&o, argc, argv, &i, "serve");
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "dflash serve: unknown option %s\n", a);
            return usage(stderr);
        }
    }
    if (cli_opts_finish(&o, "serve") != 0) return 2;
    static char tpath[4096], dpath[4096];
    if (o.model == NULL) {
        snprintf(tpath, sizeof(tpath), "%s/target.gguf", cli_default_model_dir());
        o.model = tpath;
        if (o.draft == NULL) {
            snprintf(dpath, sizeof(dpath), "%s/drafter.gguf", cli_default_model_dir());
            o.draft = dpath;
        }
        if (so.alias == NULL) so.alias = "dflash-embedded";
    }
    so.target_path = o.model;
    so.drafter_path = o.no_spec ? NULL : o.draft;
    int32_t *draft_vocab = NULL; /* --draft-vocab-file's ids, read before the engines are made */
    if (!o.no_spec && cli_load_draft_vocab(&o, &draft_vocab, "serve") != 0) return 1;
    so.engine = cli_engine_params(&o); /* the engine options of generate and bench */
    /* the sampling options of generate (penalties and their window included) as the defaults of
     * requests that do not set a field */
    so.sampler = cli_seq_params(&o).sampler;
    so.fixed_seed = seed_given;
    const int rc = srv_run(&so);
    free(draft_vocab);
    return rc;
}
