/* cli_common.h: what the generate / bench / serve commands share: option parsing helpers, loading
 * a target (+ drafter) with contexts and a speculative session, prompt tokenization (plain or
 * ChatML), and timing. */
#ifndef DFL_TOOLS_CLI_COMMON_H
#define DFL_TOOLS_CLI_COMMON_H

#include "dflash.h"

#include <stdbool.h>
#include <stdio.h>

/* default --draft-min (see dfl_spec_params.n_draft_min) */
#define CLI_DRAFT_MIN 1
#define CLI_DRAFT_MIN_STR "1"
/* default --draft-p-min (see dfl_spec_params.draft_p_min) */
#define CLI_DRAFT_P_MIN 0.0f
#define CLI_DRAFT_P_MIN_STR "0"

typedef struct cli_opts {
    const char *model;        /* -m (NULL: the embedded default pair) */
    const char *draft;        /* -md */
    const char *prompt;       /* -p */
    int64_t n_predict;        /* -n */
    int64_t n_ctx;            /* -c */
    int64_t n_batch;          /* -b */
    int32_t n_threads;        /* -t */
    int32_t n_threads_batch;  /* -tb */
    float temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int32_t top_k;
    int32_t repeat_last_n;    /* --repeat-last-n */
    const char *stop[16];     /* --stop (repeatable) */
    int32_t n_stop;
    bool ignore_eos;          /* --ignore-eos */
    uint64_t seed;
    bool chat, json, no_spec, verbose, async;
    int32_t draft_max;        /* --draft-max */
    float draft_p_min;        /* --draft-p-min */
    int32_t draft_min;        /* --draft-min (0: fixed draft length) */
    dfl_feature_path features;
    dfl_feature_wait feature_wait;
    int64_t feature_buffer_max; /* bytes, 0: no cap */
    int32_t n_seq;
    dfl_device device;        /* --device cpu|cuda */
} cli_opts;

void cli_opts_default(cli_opts *o);
/* Parses one option at argv[*i] (advancing *i past its value). Returns 1 if it was a common
 * option, 0 if unknown, -1 on a bad value (message printed). */
int cli_parse_common(cli_opts *o, int argc, char **argv, int *i, const char *cmd);
/* Prints the common options' help. */
void cli_print_common_help(FILE *out);

/* Where the embedded default models live (DFLASH_MODEL_DIR or the build's models/ folder). */
const char *cli_default_model_dir(void);

typedef struct cli_session {
    dfl_model *target, *drafter; /* drafter NULL: plain decoding (none given, or --no-spec) */
    dfl_vocab *vocab;
    dfl_engine *engine;
} cli_session;

/* Loads the models and creates the engine (speculative when a drafter is given and not
 * --no-spec). Prints a progress bar on a terminal unless quiet. 0 ok, 1 error printed. */
int cli_session_open(cli_session *s, cli_opts *o, bool quiet, const char *cmd);
void cli_session_close(cli_session *s);
/* The engine parameters the options ask for (the draft options only matter with a drafter). */
dfl_engine_params cli_engine_params(const cli_opts *o);
/* The sequence parameters (sampler, limits, stop strings) the options ask for. */
dfl_seq_params cli_seq_params(const cli_opts *o);

/* Tokenizes the prompt (ChatML with --chat). Returns the token count (> 0) or -1 (printed). */
int64_t cli_tokenize_prompt(const cli_session *s, const cli_opts *o, const char *text, int32_t **tokens, const char *cmd);

double cli_now_ms(void);

#endif
