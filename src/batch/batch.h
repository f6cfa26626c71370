/* batch.h: batch validation against a context's limits (docs/batch.md) and the micro-batch
 * split. The dfl_batch table itself and its adders are public (include/dflash.h).
 *
 * Contract: a context calls batch_validate on the whole batch BEFORE it changes anything (KV
 * cache, outputs, feature buffer). batch_validate only reads; so an invalid batch is rejected
 * with nothing half-applied. */
#ifndef DFL_BATCH_BATCH_H
#define DFL_BATCH_BATCH_H

#include "dflash.h"

/* What the receiving context accepts. */
typedef struct batch_limits {
    int64_t n_vocab;          /* token ids must be in [0, n_vocab) */
    int64_t n_embd;           /* width the context expects for embeddings / state embeddings */
    int64_t n_pos_sections;   /* positions per entry the context expects (1 or 4) */
    int64_t n_seq;            /* seq ids must be in [0, n_seq) */
    int64_t n_ctx;            /* positions per sequence the KV cache holds */
    int64_t n_batch;          /* most entries one call accepts; 0: no limit */
    int64_t n_rows_available; /* embd rows must be in [0, n_rows_available); 0: no rows */
    const int64_t *seq_len;   /* [n_seq] current length of each sequence (next position) */
    bool encode_only;         /* an encode-only call: embd-row batches are rejected */
} batch_limits;

/* Checks every rule of docs/batch.md and returns DFL_OK, DFL_ERR_INVALID (bad entry; the
 * message names the entry index and the reason) or DFL_ERR_CTX_FULL (a sequence would exceed
 * n_ctx). The rules, in the order they are checked:
 *  - the batch is not empty and not larger than n_batch; its n_pos_sections matches the context,
 *    and so does its n_embd when an entry carries an embedding or a state;
 *  - every entry carries a token id, an embedding, or both; or an embd row, never together with
 *    a token id or embedding; embd rows are on all entries or none (and not in encode-only
 *    calls); a state embedding is on all entries or none;
 *  - token ids in [0, n_vocab), embd rows in [0, n_rows_available), seq ids in [0, n_seq),
 *    positions (every section) non-negative, embeddings and states finite (no NaN/Inf);
 *  - per sequence, position section 0 (the KV cell) continues the sequence: the first entry of
 *    sequence s has position seq_len[s], the next one seq_len[s] + 1, ... in batch order
 *    (entries of different sequences may interleave);
 *  - each sequence fits: seq_len[s] + its entries <= n_ctx, else DFL_ERR_CTX_FULL.
 * Allocation-free. */
dfl_status batch_validate(const dfl_batch *batch, const batch_limits *lim, dfl_error *err);

/* Number of entries with output set. */
int64_t batch_n_outputs(const dfl_batch *batch);

/* A micro-batch: a view of entries [i0, i0 + n_tokens) of a batch, pointers into its arrays
 * (offset by i0, same layouts). embd/state are NULL when the batch has none. */
typedef struct batch_ubatch {
    int64_t i0;             /* index of the first entry in the batch */
    int64_t n_tokens;       /* entries in this micro-batch */
    int64_t n_embd;
    int64_t n_pos_sections;
    bool has_embd_rows;     /* the entries carry embd rows */
    bool has_states;        /* the entries carry state embeddings */
    const int32_t *token;    /* [n_tokens] */
    const float *embd;       /* [n_tokens, n_embd] */
    const bool *has_embd;    /* [n_tokens] */
    const int32_t *pos;      /* [n_tokens, n_pos_sections] */
    const int32_t *seq_id;   /* [n_tokens] */
    const bool *output;      /* [n_tokens] */
    const int32_t *embd_row; /* [n_tokens] */
    const float *state;      /* [n_tokens, n_embd] */
} batch_ubatch;

/* Iterates over consecutive ranges of at most n_ubatch entries, in plain batch order (never
 * reordered). Start with *cursor = 0; each call fills ub with the range at *cursor, advances
 * *cursor and returns true; returns false when the batch is exhausted. Allocation-free:
 *     int64_t cur = 0; batch_ubatch ub;
 *     while (batch_split(b, n_ubatch, &cur, &ub)) { ... }                                   */
bool batch_split(const dfl_batch *batch, int64_t n_ubatch, int64_t *cursor, batch_ubatch *ub);

#endif
