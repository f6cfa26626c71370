/* forward_common.h: the pieces of a forward pass shared by the target (forward.c) and the
 * DFlash drafter: planning a micro-batch (work order, sequence groups), uploading its
 * inputs, embedding, capture of layer inputs, and the attention and FFN sub-blocks. */
#ifndef DFL_MODEL_FORWARD_COMMON_H
#define DFL_MODEL_FORWARD_COMMON_H

#include "model/context.h"

/* Sorts the micro-batch's entries by sequence (stable) into ctx->h_perm (work row -> entry),
 * fills ctx->groups. Causal: a query at position p sees the cells <= p of its sequence;
 * non-causal (the drafter's block): every query sees all cells of its sequence up to the end of
 * the micro-batch. No mask is built: each group's attention op computes it from the row index
 * (backend_attn_mask). Returns the number of groups. */
int64_t fwd_plan_groups(dfl_context *ctx, const batch_ubatch *ub, bool non_causal);
/* The first n elements of a 1-d tensor. */
tensor fwd_vec_head(const tensor *t, int64_t n);
/* Work rows of the entries with output set, in entry order (so logits come out in batch order),
 * into ctx->h_rows; returns their count. Needs fwd_plan_groups first. */
int64_t fwd_output_rows(dfl_context *ctx, const bool *output, int64_t n);
/* Enqueues the writes of ids, pos, cells, output rows and batch indices. */
void fwd_upload_inputs(dfl_context *ctx, int64_t n);
/* x [n_embd, n] = token_embd[ids] for token entries, the entry's embedding for the others. */
void fwd_embed_inputs(dfl_context *ctx, const batch_ubatch *ub, const tensor *token_embd, tensor x, int64_t n);
/* If layer-input id `id` is captured, scatter x's rows into the feature buffer at their batch index. */
void fwd_capture(dfl_context *ctx, int64_t id, tensor x, int64_t n);
/* x += Wo attention(rmsnorm(x) * attn_norm) for layer il; writes K/V at the rows' cells. */
void fwd_attention_block(dfl_context *ctx, int64_t il, tensor x, int64_t n, int64_t n_groups);
/* The attention of layer il from already-normed rows h [n_embd, n]: q, K/V (written at the rows'
 * cells), attention, out [n_embd, n] = Wo att (out may be h; no residual). Uses scratch q, k, v,
 * att. (fwd_attention_block = rmsnorm + this + residual; DFlash2 convolves h and out.) */
void fwd_attention_core(dfl_context *ctx, int64_t il, tensor h, tensor out, int64_t n, int64_t n_groups);
/* x += Wdown(silu(Wgate h) * Wup h), h = rmsnorm(x) * ffn_norm. */
void fwd_ffn_block(dfl_context *ctx, int64_t il, tensor x, int64_t n);
/* K/V of layer il from hidden rows h [n_embd, n] (no attn_norm), roped at pos, into the cache:
 * the DFlash context injection (docs/drafter.md, "Feeding the drafter") and the K/V part of the attention block. */
void fwd_write_kv(dfl_context *ctx, int64_t il, tensor h, int64_t n);

#endif
