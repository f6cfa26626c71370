/* session.h: library-internal calls of the speculative session (session.c) that the engine
 * (src/engine/) drives: per-sequence samplers and draft lengths, prefill after a cached prefix,
 * and a step that also reports how many drafts each sequence verified. */
#ifndef DFL_SPECULATIVE_SESSION_H
#define DFL_SPECULATIVE_SESSION_H

#include "dflash.h"

/* Sequence seq samples (and verifies) with smp (borrowed until replaced; NULL: the session's own
 * sampler, built from dfl_spec_params). The session feeds smp every token the sequence commits
 * (prompt included), so its penalty window sees exactly what the plain path's would. */
void spec_seq_set_sampler(dfl_spec *s, int32_t seq, dfl_sampler *smp);
/* Caps seq's draft length at n_draft (1..the session's draft length; 0: the session's). */
void spec_seq_set_max_draft(dfl_spec *s, int32_t seq, int32_t n_draft);
/* Prefill of seq whose caches (target and drafter) already hold prompt[0, n_cached): decodes the
 * rest and samples the first token. 0 <= n_cached < n_prompt. */
dfl_status spec_prefill_from(dfl_spec *s, int32_t seq, const int32_t *prompt, int64_t n_prompt, int64_t n_cached,
                             int32_t *first, dfl_error *err);
/* dfl_spec_step, plus n_drafted [n]: the drafts each sequence verified this step (NULL: not
 * wanted). */
dfl_status spec_step_ex(dfl_spec *s, int32_t n, const int32_t *seqs, int32_t *tokens, int32_t *n_tokens,
                        int32_t *n_drafted, dfl_error *err);
/* Room a step of seq needs in the target's context (positions after the sequence's length). */
int32_t spec_step_room(const dfl_spec *s);

#endif
