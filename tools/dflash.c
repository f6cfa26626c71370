/* dflash.c: the command-line entry point; dispatches to the subcommands in tools/cmd_*.c. */
#include "cli_common.h"
#include "cmds.h"
#include "dflash.h"

#include <stdio.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cli_command;

static const cli_command k_commands[] = {
    {"gguf", cmd_gguf, "gguf PATH [--json]            inspect a GGUF file (hparams, tokenizer, tensors)"},
    {"make-test-model", cmd_make_test_model,
     "make-test-model -o DIR [...]   write a random tiny Qwen3 target + DFlash drafter pair"},
    {"quantize", cmd_quantize, "quantize IN OUT TYPE           re-encode a model's matrix weights (q8_0, q4_0, f16, ...)"},
    {"tokenize", cmd_tokenize, "tokenize -m MODEL -p TEXT      print token ids (and pieces)"},
    {"bench", cmd_bench, "bench [-m T] [-md D] [--llama]   speed: pp, tg, verify, speculative vs autoregressive"},
    {"generate", cmd_generate, "generate [-m T] [-md D] -p TEXT generate text (speculative with a drafter)"},
    {"serve", cmd_serve, "serve [-m T] [-md D] [--port N]  OpenAI-compatible HTTP server (continuous batching)"},
};

static void usage(FILE *out) {
    fprintf(out, "dflash %s: lossless speculative decoding with DFlash block drafters\n\n", DFL_VERSION);
    fprintf(out, "usage: dflash COMMAND [options]   (dflash COMMAND --help for its options)\n\n");
    for (size_t i = 0; i < sizeof(k_commands) / sizeof(k_commands[0]); i++) {
        fprintf(out, "  %s\n", k_commands[i].help);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return cli_finish_output(0, "help");
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("dflash %s\n", DFL_VERSION);
        return cli_finish_output(0, "--version");
    }
    for (size_t i = 0; i < sizeof(k_commands) / sizeof(k_commands[0]); i++) {
        if (strcmp(argv[1], k_commands[i].name) == 0) {
            /* every command's output is checked at the end (a full disk, a closed pipe) */
            return cli_finish_output(k_commands[i].fn(argc - 1, argv + 1), k_commands[i].name);
        }
    }
    fprintf(stderr, "dflash: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
