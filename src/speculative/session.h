/* session.h: the speculative session (session.c) over a target context and a drafter context,
 * library-internal: the engine (src/engine/, dfl_engine in dflash.h) drives it; tests use it
 * directly. */
#ifndef DFL_SPECULATIVE_SESSION_H
#define DFL_SPECULATIVE_SESSION_H

#include "dflash.h"

/* A speculative session over a target context and a drafter context (created with
 * params.target = the target context, whose capture_layers are the drafter's target_layers).
 * Each step drafts one block per active sequence in ONE drafter pass, verifies all of them in ONE
 * target batch, keeps the longest correct prefix plus a bonus token, and rolls both caches back.
 * Greedy output is bit-identical to the target's own greedy decoding; at temperature > 0 the
 * rejection rule keeps the output distribution exactly the target's. */
typedef struct spec_session spec_session;

#define SPEC_DRAFT_START 4

typedef struct spec_params {
    int32_t n_draft;             /* draft tokens per step, 1..block_size-1; 0: block_size-1 */
    /* adaptive draft length: a sequence's draft stops before the first token whose drafter
     * probability (softmax of the drafter's logits) is below draft_p_min, so the target verifies
     * only the confident part of the block (0 drafts: a plain decode step). 0: always n_draft.
     * The output is lossless whatever the cut (it depends on the drafter only). */
    float draft_p_min;
    /* adaptive draft length: 0 = always n_draft; else each sequence's draft length moves between
     * n_draft_min and n_draft (+2 after a step that accepted its whole draft, -1 after a step
     * that rejected one of its drafts; it starts at SPEC_DRAFT_START clamped to the range), and
     * the drafter pass covers the longest of them. */
    int32_t n_draft_min;
    float temp;                  /* <= 0: greedy */
    int32_t top_k;               /* target sampling transforms at temp > 0 (as dfl_sampler_params) */
    float top_p;
    float min_p;
    uint64_t seed;
    dfl_feature_path features;   /* default DFL_FEATURES_DEVICE */
    dfl_feature_wait wait;       /* default DFL_WAIT_HOST */
    /* optional: called after each drafter pass with a sequence's draft tokens, which it may
     * replace (other drafting strategies; tests that force acceptance patterns). Output stays
     * lossless whatever it writes, as long as the ids are inside the vocabulary. */
    void (*draft_hook)(void *user, int32_t seq, int32_t *draft, int32_t n_draft);
    void *draft_hook_user;
} spec_params;

typedef struct spec_stats {
    int64_t n_steps;             /* speculative steps (per sequence) */
    int64_t n_drafted;           /* draft tokens proposed */
    int64_t n_accepted;          /* draft tokens accepted */
    int64_t accept_hist[65];     /* accept_hist[k]: steps that accepted exactly k draft tokens */
    double t_draft_ms;           /* drafting (drafter block decode) */
    double t_verify_ms;          /* target verification batches */
    double t_inject_ms;          /* drafter feature injection */
    double t_prefill_ms;         /* prompt processing (target + drafter injection) */
    double t_other_ms;           /* acceptance and bookkeeping */
    uint64_t feature_host_bytes; /* bytes of features copied through host memory */
    int64_t n_prefill_tokens;
    int64_t n_draft_nonfinite; /* draft slots dropped because the drafter's logits were not finite */
} spec_stats;

spec_params spec_default_params(void);
spec_session *spec_new(dfl_context *target, dfl_context *drafter, const spec_params *params, dfl_error *err);
void spec_free(spec_session *spec);
/* Processes seq's prompt (target + drafter context) and returns the first generated token. The
 * sequence must be empty in both contexts. */
dfl_status spec_prefill(spec_session *spec, int32_t seq, const int32_t *prompt, int64_t n_prompt, int32_t *first,
                            dfl_error *err);
/* One speculative step for n sequences (each prefilled). tokens [n, n_draft+1] receives each
 * sequence's newly committed tokens (accepted drafts, then the bonus), n_tokens [n] their count
 * (1..n_draft+1). */
dfl_status spec_step(spec_session *spec, int32_t n, const int32_t *seqs, int32_t *tokens, int32_t *n_tokens,
                         dfl_error *err);
/* Forgets seq in both contexts (so it can be prefilled again). */
void spec_seq_reset(spec_session *spec, int32_t seq);
int32_t spec_n_draft(const spec_session *spec);
spec_stats spec_get_stats(const spec_session *spec);
/* "device" or "host": the path in use (a device request falls back to host copies when the
 * target has no feature buffer or the drafter cannot read it); the note says why. */
const char *spec_feature_path_name(const spec_session *spec);
const char *spec_feature_note(const spec_session *spec);


/* Sequence seq samples (and verifies) with smp (borrowed until replaced; NULL: the session's own
 * sampler, built from spec_params). The session feeds smp every token the sequence commits
 * (prompt included), so its penalty window sees exactly what the plain path's would. */
void spec_seq_set_sampler(spec_session *s, int32_t seq, dfl_sampler *smp);
/* Caps seq's draft length at n_draft (1..the session's draft length; 0: the session's). */
void spec_seq_set_max_draft(spec_session *s, int32_t seq, int32_t n_draft);
/* Prefill of seq whose caches (target and drafter) already hold prompt[0, n_cached): decodes the
 * rest and samples the first token. 0 <= n_cached < n_prompt. */
dfl_status spec_prefill_from(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t n_cached,
                             int32_t *first, dfl_error *err);
/* Prefills prompt[from, to) of seq (its caches hold prompt[0, from)); when to == n_prompt, also
 * samples the first token into *first (else *first = -1). Lets a long prompt be prefilled in
 * chunks between steps of other sequences. */
dfl_status spec_prefill_range(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t from,
                              int64_t to, int32_t *first, dfl_error *err);
/* As spec_prefill_range, but the last prompt token is not decoded and nothing is sampled: when to
 * == n_prompt it becomes the sequence's anchor, so the first step drafts from it and its verify
 * batch decodes it (llama.cpp's order: the first generated tokens can already be drafts). */
dfl_status spec_prefill_anchor(spec_session *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t from,
                               int64_t to, dfl_error *err);
/* spec_step, plus n_drafted [n]: the drafts each sequence verified this step (NULL: not
 * wanted). */
dfl_status spec_step_ex(spec_session *s, int32_t n, const int32_t *seqs, int32_t *tokens, int32_t *n_tokens,
                        int32_t *n_drafted, dfl_error *err);
/* Sequence seq needs the target's logits at every verified slot (logprobs): its steps never
 * use the argmax-only verification. */
void spec_seq_set_need_logits(spec_session *s, int32_t seq, bool on);
/* The target's logits [n_vocab] at slot j (0..n_tokens-1) of the i-th sequence of the last step:
 * the distribution its j-th committed token was drawn from; NULL if the step returned ids only. */
const float *spec_step_logits(const spec_session *s, int32_t i, int32_t j);
/* Room a step of seq needs in the target's context (positions after the sequence's length). */
int32_t spec_step_room(const spec_session *s);

#endif
