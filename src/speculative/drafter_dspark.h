/* drafter_dspark.h: the DSpark heads of a drafter context (drafter_dspark.c, docs/drafter.md
 * "DSpark"): the greedy Markov chain over the block positions and the confidence head. */
#ifndef DFL_SPECULATIVE_DRAFTER_DSPARK_H
#define DFL_SPECULATIVE_DRAFTER_DSPARK_H

#include "model/context.h"

typedef struct dspark_state dspark_state;

/* The chain's scratch for a drafter context of a DSpark model (n_seq sequences, blocks of at
 * most n_draft_max drafted rows). NULL + err on failure. */
dspark_state *dspark_state_new(dfl_context *d, dfl_error *err);
void dspark_state_free(dspark_state *st);

/* A reduced draft vocabulary (hot_ids [n_hot] ascending, kept by the caller): the markov_w1 and
 * markov_w2 rows of those ids are copied to the context's backend; from then on the chain runs
 * over the n_hot ids (logits [n_hot, n_out]: z_j = logits_j + the bias's rows of the ids, argmax
 * an index into hot_ids) and dspark_finish gives token ids. */
dfl_status dspark_set_vocab(dfl_context *d, dspark_state *st, const int32_t *hot_ids, int64_t n_hot, dfl_error *err);

/* Enqueues the Markov chain on the drafter's queue. logits [n_vocab, n_out] are the head's
 * rows of the n sequences, packed: sequence i's lens[i] drafted rows (block-position order) at
 * rows off_i = lens[0] + .. + lens[i-1]; they are biased in place (z_j = logits_j + bias_j, the
 * bias from the previous row's drafted token, last[i] for the first row). x_out [n_embd, n_out]
 * are the head's inputs (read back for the confidence head). Nothing is read on the host until
 * dspark_finish, after the queue is synchronized. */
void dspark_chain_enqueue(dfl_context *d, dspark_state *st, tensor logits, tensor x_out, int32_t n, const int32_t *last,
                          const int32_t *lens);
/* After the synchronize: the drafted tokens, packed like the rows (out [n_out]), and when the
 * model has a confidence head, conf [n_out] = sigmoid(conf_proj . [h_j ; markov_w1[prev_j]] + b)
 * (conf may be NULL). */
void dspark_finish(const dfl_context *d, const dspark_state *st, int32_t n, const int32_t *last, const int32_t *lens,
                   int32_t *out, float *conf);

#endif
