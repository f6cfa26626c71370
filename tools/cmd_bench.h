/* cmd_bench.h: what the two files of `dflash bench` share: cmd_bench.c (options, contexts, the
 * batched rows pp / tg / verify / verify x sequences / threads, the table) and cmd_bench_spec.c
 * (the speculative rows: spec-gen, drafter pass, spec steps at a fixed draft length, and the
 * llama.cpp comparison). */
#ifndef DFL_TOOLS_CMD_BENCH_H
#define DFL_TOOLS_CMD_BENCH_H

#include "cli_common.h"

typedef struct bench_row {
    char name[48];
    double tok_s;  /* tokens per second (0: n/a) */
    double ms;     /* median milliseconds of one repetition (or of one step / token, as the note says) */
    double gb_s;   /* weight bytes read per second (0: n/a) */
    char note[256];
} bench_row;

#define BENCH_MAX_ROWS 48

typedef struct bench {
    cli_opts o;
    int reps;
    int64_t n_pp, n_tg, n_verify, n_spec;
    char depth_tag[32];    /* " @ dN" in the row names with --depth, else empty */
    int64_t n_depth;       /* --depth: context tokens before the tg, verify and speculative rows (0: the prompt) */
    int32_t n_vseq;        /* sequences of the multi-sequence verify (--verify-seqs) */
    bool csv, llama, threads_scan;
    cli_session s;         /* s.engine is not used: the bench builds its own engines */
    dfl_engine *plain;     /* a plain engine on the target: pp, tg and the baselines */
    dfl_context *ar;       /* a plain target context: the verification-sized batch */
    dfl_context *arn;      /* n_vseq sequences: the multi-sequence verify */
    uint64_t weight_bytes;
    double tg_ms;          /* one tg step (ms), for the "x one tg step" ratios */
    bench_row rows[BENCH_MAX_ROWS];
    int n_rows;
} bench;

/* Median of v[0..n) (sorts v). */
double bench_median(double *v, int n);
/* Appends a zeroed row named by the printf-style format (never past BENCH_MAX_ROWS: the last row
 * is reused). */
bench_row *bench_add_row(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Generates with seq 0 of e after the prompt until n tokens (greedy, EOS ignored): the prefill
 * is not timed; ms_out: the steps' wall time; d (may be NULL): the engine's totals of the steps
 * alone (after the prefill); st (may be NULL): the sequence's stats afterwards. */
bool bench_engine_gen(dfl_engine *e, const int32_t *prompt, int64_t n_prompt, int64_t n, double *ms_out,
                      dfl_engine_stats *d, dfl_seq_stats *st);

/* cmd_bench_spec.c */
/* spec-gen rows: the speculative generation (device / host feature paths) vs the plain one. */
bool bench_spec(bench *b, const int32_t *prompt, int64_t n_prompt);
/* drafter pass and spec dK rows: steps at a fixed draft length (3, 15). */
bool bench_spec_steps(bench *b, const int32_t *prompt, int64_t n_prompt);
/* --llama: llama.cpp's tg and pp on the same file (node-llama-cpp). */
bool bench_llama(bench *b);

#endif
