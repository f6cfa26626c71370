/* test_util.h: helpers shared by the model tests: generating test models with the CLI, running
 * the numpy reference, reading raw float files, comparing logits. */
#ifndef DFL_TEST_UTIL_H
#define DFL_TEST_UTIL_H

#include "test.h"
#include "dflash.h"
#include "speculative/session.h"

/* Runs `dflash make-test-model -o DIR ARGS`; DIR is created in the test's temp dir. Fills
 * target/drafter paths. Returns true on success (a failure is reported on t). */
bool tu_make_models(test_ctx *t, const char *dir_name, const char *args, char *target, char *drafter, size_t cap);
/* True if Debian's python3 with numpy is available (else the test skips itself). */
bool tu_have_numpy(test_ctx *t);
/* Reads a raw little-endian float32 file into a malloc'd array; *n = element count. */
float *tu_read_floats(const char *path, int64_t *n);
/* Max relative error of a vs ref: max|a-b| / max|ref| (NaN -> +inf). */
double tu_rel_err(const float *a, const float *ref, int64_t n);
/* Formats ids as "1,2,3" into buf. */
void tu_ids_csv(const int32_t *ids, int64_t n, char *buf, size_t cap);
/* Evaluates tokens [0, n) of seq 0 in a fresh batch (positions from the sequence's length) and
 * copies the logits of every entry into out [n, n_vocab] (out may be NULL). */
dfl_status tu_decode(dfl_context *ctx, int32_t seq, const int32_t *tokens, int64_t n, float *out, dfl_error *err);
/* Greedy decoding of n_gen tokens after a prompt (target alone), into out. */
dfl_status tu_greedy(dfl_context *ctx, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t n_gen, int32_t *out,
                     dfl_error *err);
int32_t tu_argmax(const float *x, int64_t n);
/* True if node and the npm package tests/peer/node_modules/PKG (e.g. "node-llama-cpp", "openai")
 * are installed; otherwise the test skips itself, saying which is missing. */
bool tu_have_node_package(test_ctx *t, const char *pkg);
/* Packed against as-stored weights: decodes prompt (n <= 16 tokens, logits of all) and n_gen <= 16
 * greedy tokens after it with a context that packs (the default) and one with no_weight_pack (2
 * threads, n_ctx 64) and checks that both give the same logit bits and tokens; check (may be NULL)
 * inspects the packing context first. Returns its logits [n, n_vocab] (free() them), NULL on
 * failure (reported on t). */
float *tu_pack_ab(test_ctx *t, dfl_model *m, const int32_t *prompt, int64_t n, int64_t n_gen,
                  void (*check)(test_ctx *t, dfl_context *c));
/* A draft hook (dfl_engine / spec draft_hook) for the lossless tests. mode 0 keeps the real
 * drafter's tokens; mode 1 proposes the true greedy continuation ref[seq][done[seq] ...] (0 past
 * n_ref) with one planted error (token + 1 mod n_vocab) at a random slot in 3 of 4 steps, so that
 * every acceptance length and rollback path is exercised. The test keeps done[] up to date. */
typedef struct tu_oracle {
    const int32_t *ref[8];  /* per sequence: the target-alone greedy tokens */
    int64_t done[8];        /* tokens committed so far (incl. the prefill's first token) */
    int64_t n_ref;          /* length of each ref[] */
    int32_t n_vocab;
    uint64_t rng;           /* splitmix64 state */
    int mode;
} tu_oracle;
void tu_oracle_hook(void *user, int32_t seq, int32_t *draft, int32_t n_draft);
/* Starts sequences 0 .. n_seq-1 of e (prompts[s], lens[s] tokens, params sp) and steps until none is
 * active (at most 1000 steps), appending each sequence's tokens to got + s * cap (n_got[s], at most
 * cap) and keeping o->done up to date (o may be NULL). False on an engine error (err says which). */
bool tu_engine_generate(dfl_engine *e, int n_seq, int32_t *const *prompts, const int64_t *lens, const dfl_seq_params *sp,
                        int32_t *got, int64_t cap, int64_t *n_got, tu_oracle *o, dfl_error *err);
/* Parses the "results":[[ids...],[ids...]] arrays of a peer script's JSON line into res
 * [n_rows][n_cols] (row-major; ids past n_cols are ignored). With exact, a row of fewer than n_cols
 * ids is an error. *n_res = rows parsed (at most n_rows). False on bad syntax. */
bool tu_parse_results(const char *json, int32_t *res, int n_rows, int n_cols, bool exact, int *n_res);

/* A target + drafter pair with their contexts (1 thread, n_ctx 256, n_ubatch 16, so prompts
 * cross micro-batches), a speculative session and optionally a reference context (the target
 * alone, one sequence). */
typedef struct tu_pair {
    dfl_model *target, *drafter;
    dfl_context *tctx, *dctx, *rctx; /* target, drafter, reference (NULL unless asked for) */
    spec_session *spec;
} tu_pair;
typedef struct tu_pair_params {
    int n_seq;
    int64_t n_batch;         /* target batches and outputs */
    int64_t drafter_n_batch; /* 0: the drafter context's default */
    bool kv_f32;             /* f32 KV caches (tight comparisons with the float64 reference) */
    bool ref_ctx;            /* also open rctx */
    dfl_device device;
    const spec_params *sp;   /* NULL: spec_default_params() */
    int32_t n_draft_vocab;   /* the drafter context's reduced draft vocabulary (0: none) */
    const int32_t *draft_vocab;
} tu_pair_params;
/* Loads and opens the pair; false (reported on t) on failure; tu_pair_close is needed either way. */
bool tu_pair_open(test_ctx *t, tu_pair *p, const char *tpath, const char *dpath, const tu_pair_params *pp);
void tu_pair_close(tu_pair *p);

#endif
