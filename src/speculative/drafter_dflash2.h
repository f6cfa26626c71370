/* drafter_dflash2.h: the DFlash2 parts of the drafter forward (drafter_dflash2.c,
 * docs/drafter.md "DFlash2"): the per-layer dynamic convolutions around attention and FFN, the
 * selector lattice (top-k candidates per block position + pairwise transition scores) and the
 * greedy walk over it that gives the draft tokens, as llama.cpp's common/speculative.cpp does. */
#ifndef DFL_SPECULATIVE_DRAFTER_DFLASH2_H
#define DFL_SPECULATIVE_DRAFTER_DFLASH2_H

#include "model/context.h"

typedef struct dflash2_state dflash2_state;

/* Scratch, weight views and host arrays for a drafter context d whose model has d2 set.
 * NULL + err on failure. */
dflash2_state *dflash2_state_new(dfl_context *d, dfl_error *err);
void dflash2_state_free(dflash2_state *st);

/* Before the layers of a draft pass over the n rows of ub (work order already planned): each
 * row's position inside its sequence's block (position - the sequence's length), from which the
 * shifted-row indices of the convolution taps are uploaded. */
void dflash2_begin(dfl_context *d, dflash2_state *st, const batch_ubatch *ub, int64_t n);
/* One drafter layer with its convolutions (replaces fwd_attention_block + fwd_ffn_block):
 *   h = rmsnorm(x) attn_norm, c = attn_conv_proj h, x += conv1_c(Wo attn(conv0_c(h)))
 *   h = rmsnorm(x) ffn_norm,  c = ffn_conv_proj h,  x += conv1_c(ffn(conv0_c(h)))            */
void dflash2_layer(dfl_context *d, dflash2_state *st, int64_t il, tensor x, int64_t n, int64_t n_groups);
/* After the head: e = x_out [n_embd, n_out] (normed head input), logits [n_vocab, n_out] (with
 * the head's scale/softcap), rows packed per sequence (sequence i: lens[i] rows, or n_draft
 * when lens is NULL). Builds each row's lattice, walks it from the anchor last[i] and writes
 * sequence i's drafts to out + i * n_draft; logits_out as drafter_draft documents. With a
 * reduced draft vocabulary (n_hot > 0, hot_ids ascending, n_hot >= the selector's top-k) logits
 * is [n_hot, n_out]: the candidates are the top-k of those ids' logits (ties: the lower id), a
 * NaN / Inf among them ends the walk as on full rows, and logits_out gets full rows with -inf off
 * the vocabulary. Synchronizes the queue. */
dfl_status dflash2_select(dfl_context *d, dflash2_state *st, tensor x_out, tensor logits, int64_t n_out, int32_t n_active,
                          const int32_t *last, int32_t n_draft, const int32_t *lens, const int32_t *hot_ids,
                          int64_t n_hot, int32_t *out, float *logits_out, dfl_error *err);
/* The selector's top-k (the least draft vocabulary a DFlash2 drafter takes). */
int64_t dflash2_top_k_count(const dflash2_state *st);

/* The last dflash2_select, per output row r (packed order): the lattice row [k + k*k] floats
 * (candidate ids as floats, then score[j][s] at k + j*k + s, llama.cpp's packing) and the walk's
 * softmax probability of the chosen candidate at that row; probs strided like out
 * ([n_active, n_draft]). NULL if d is not a DFlash2 drafter or nothing was drafted yet. */
const float *dflash2_last_lattice(const dfl_context *d, int64_t *row_len);
const float *dflash2_last_probs(const dfl_context *d);
/* dflash2_state of a drafter context (NULL if not DFlash2); drafter.c. */
dflash2_state *drafter_dflash2(const dfl_context *d);

/* The selector on host arrays (exposed for the tests): top-k of row [n_vocab] (descending,
 * ties: lower id first; NaN never chosen) into ids [k]. */
void dflash2_top_k(const float *row, int64_t n_vocab, int64_t k, int32_t *ids);
/* What the selector reads of a logit row in one pass: the index of its first NaN / Inf (the walk
 * ends there), or -1 with the row's top-k in ids exactly as dflash2_top_k gives them (blocks of 16
 * whose largest value cannot enter the current k are skipped). */
int64_t dflash2_scan_row(const float *row, int64_t n_vocab, int64_t k, int32_t *ids);

#endif
