/* cli_common.h: what the generate / bench / serve commands share: option parsing helpers, loading
 * a target (+ drafter) with contexts and a speculative session, prompt tokenization (plain or
 * ChatML), and timing. */
#ifndef DFL_TOOLS_CLI_COMMON_H
#define DFL_TOOLS_CLI_COMMON_H

#include "dflash.h"

#include <stdbool.h>
#include <stdio.h>

/* default --draft-min (see dfl_engine_params.n_draft_min) */
#define CLI_DRAFT_MIN 1
#define CLI_DRAFT_MIN_STR "1"
/* default --draft-p-min (see dfl_engine_params.draft_p_min) */
#define CLI_DRAFT_P_MIN 0.0f
#define CLI_DRAFT_P_MIN_STR "0"

typedef struct cli_opts {
    const char *model;        /* -m (NULL: the embedded default pair) */
    const char *draft;        /* -md */
    const char *prompt;       /* -p */
    const char *prompt_file;  /* -f: the prompt from a file (bytes as they are) */
    const char *features_env; /* DFLASH_FEATURES as found (checked by cli_check_env) */
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
    bool no_repack;           /* --no-repack: weights read as stored (no packed copy) */
    const char *cache_type_k, *cache_type_v; /* -ctk / -ctv: f16 (default) or f32, both the same */
    bool kv_f32;              /* set by cli_opts_finish from -ctk / -ctv */
    int32_t draft_vocab;      /* --draft-vocab N (0: the whole vocabulary) */
    const char *draft_vocab_file; /* --draft-vocab-file FILE */
    const int32_t *draft_vocab_ids; /* the ids read from it (cli_load_draft_vocab; owned by the caller) */
    int32_t n_draft_vocab_ids;
} cli_opts;

void cli_opts_default(cli_opts *o);
/* Parses one option at argv[*i] (advancing *i past its value). Returns 1 if it was a common
 * option, 0 if unknown, -1 on a bad value (message printed). */
int cli_parse_common(cli_opts *o, int argc, char **argv, int *i, const char *cmd);
/* Checks the common options together once all are parsed (-ctk and -ctv name one type). Returns 0,
 * or -1 with a message. */
int cli_opts_finish(cli_opts *o, const char *cmd);
/* Prints the common options' help. */
void cli_print_common_help(FILE *out);

/* Where the embedded default models live (DFLASH_MODEL_DIR or the build's models/ folder). */
const char *cli_default_model_dir(void);

typedef struct cli_session {
    dfl_model *target, *drafter; /* drafter NULL: plain decoding (none given, or --no-spec) */
    dfl_vocab *vocab;
    dfl_engine *engine;
    char tpath[4096], dpath[4096]; /* the embedded pair's paths (when no -m) */
    int32_t *draft_vocab;          /* --draft-vocab-file's ids (o->draft_vocab_ids points here) */
} cli_session;

/* Reads --draft-vocab-file (token ids as decimal numbers, separated by white space or commas;
 * '#' starts a comment to the end of the line; the first --draft-vocab N of them, or all) into
 * *ids (malloc'd, the caller frees) and points o->draft_vocab_ids at it. No file: 0 and *ids
 * NULL. 1 with a message on an unreadable file, a bad number or an empty list. */
int cli_load_draft_vocab(cli_opts *o, int32_t **ids, const char *cmd);

/* Loads the models and creates the engine (speculative when a drafter is given and not
 * --no-spec). Prints a progress bar on a terminal unless quiet. 0 ok, 1 error printed, 2 a bad
 * setting (DFLASH_FEATURES) printed. */
int cli_session_open(cli_session *s, cli_opts *o, bool quiet, const char *cmd);
void cli_session_close(cli_session *s);
/* The engine parameters the options ask for (the draft options only matter with a drafter). */
dfl_engine_params cli_engine_params(const cli_opts *o);
/* The sequence parameters (sampler, limits, stop strings) the options ask for. */
dfl_seq_params cli_seq_params(const cli_opts *o);

/* Tokenizes the prompt (ChatML with --chat). Returns the token count (> 0) or -1 (printed). */
int64_t cli_tokenize_prompt(const cli_session *s, const cli_opts *o, const char *text, int32_t **tokens, const char *cmd);
/* The same for text[0..len) (any bytes, e.g. read with -f). */
int64_t cli_tokenize_prompt_n(const cli_session *s, const cli_opts *o, const char *text, size_t len, int32_t **tokens,
                              const char *cmd);
/* dfl_tokenize into a malloc'd array sized by the API's count query (*tokens, the caller frees).
 * Returns the count, or DFL_VOCAB_FAIL (*tokens NULL). */
int64_t cli_tokenize(const dfl_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                     int32_t **tokens);

/* DFLASH_FEATURES must be host or device, like --features: 0, or 2 with the message printed. */
int cli_check_env(const cli_opts *o, const char *cmd);
/* dir + "/" + name into buf; false with "path too long" printed when it does not fit (never cut). */
bool cli_path_join(char *buf, size_t cap, const char *dir, const char *name, const char *cmd);
/* Whether the prompt and n_predict tokens fit the target context, with the verification block the
 * speculative path keeps free: 0, or 1 with a message that states the reserve and the smallest -c. */
int cli_check_fit(const cli_session *s, int64_t n_prompt, int64_t n_predict, const char *cmd);

/* Most bytes cli_read_file reads. */
#define CLI_MAX_FILE (256 << 20)
/* A whole file (or FIFO, /dev/stdin) into a malloc'd buffer (NUL added after len bytes); NULL
 * with a message printed. */
char *cli_read_file(const char *path, size_t *len, const char *cmd);

/* At the end of a command: flushes and closes stdout; a failed write anywhere (a full disk, a
 * closed pipe) turns rc 0 into 1 with "dflash CMD: cannot write output: REASON". */
int cli_finish_output(int rc, const char *cmd);

/* Runs argv (argv[0] looked up in PATH, no shell) with stdout and stderr captured into out
 * (NUL-terminated, the first cap - 1 bytes). Returns the exit status (128 + signal), or -1 when it
 * could not run (printed). */
int cli_spawn_capture(char *const argv[], char *out, size_t cap, const char *cmd);
/* The path of tests/peer/NAME: next to the executable (build/../tests/peer) or in the source tree
 * the binary was built from. false with a message printed when neither exists. */
bool cli_find_peer_script(const char *name, char *buf, size_t cap, const char *cmd);

double cli_now_ms(void);

#endif
