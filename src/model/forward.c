/* forward.c: the Qwen3 / Llama forward pass over one micro-batch (docs/target.md), written once
 * as per-layer code over backend ops enqueued on the context's queue:
 *
 *   x  = token_embd[ids]                                  (or the entries' embeddings)
 *   per layer l:  [capture x if l is a captured layer-input id]
 *     h  = rmsnorm(x) * attn_norm
 *     q  = rmsnorm_per_head(Wq h) * q_norm ; k = rmsnorm_per_head(Wk h) * k_norm ; v = Wv h
 *     q,k = rope_neox(q, k, pos)
 *     K/V cache[cells] = k, v
 *     a  = softmax(q K^T / sqrt(hd) + mask) V             (per sequence, GQA)
 *     x  = x + Wo a
 *     h  = rmsnorm(x) * ffn_norm
 *     x  = x + Wdown(silu(Wgate h) * Wup h)
 *   [capture x if n_layer is captured]
 *   logits = Wout(rmsnorm(x[output rows]) * output_norm)
 *
 * Rows are processed in "work order": grouped by sequence (a stable counting sort of the
 * micro-batch), so each sequence's queries attend to one contiguous range of its KV cells. */
#include "model/context.h"
#include "model/forward_common.h"
#include "base/error.h"

#include <math.h>
#include <string.h>

dfl_status forward_target_ubatch(dfl_context *ctx, const batch_ubatch *ub, int64_t n_out_before, dfl_error *err) {
    (void)err;
    ctx_scratch *s = &ctx->s;
    backend_queue *q = ctx->queue;
    const dfl_hparams *hp = &ctx->model->hp;
    const int64_t n = ub->n_tokens;

    /* 1. work order, groups, masks, inputs */
    int64_t n_groups = fwd_plan_groups(ctx, ub, false);
    for (int64_t r = 0; r < n; r++) {
        const int64_t e = ctx->h_perm[r]; /* ubatch entry of work row r */
        ctx->h_ids[r] = ub->token[e] >= 0 ? ub->token[e] : 0;
        ctx->h_pos[r] = ub->pos[e * ub->n_pos_sections];
        ctx->h_cells[r] = kv_cell(&ctx->kv, ub->seq_id[e], ub->pos[e * ub->n_pos_sections]);
        ctx->h_bidx[r] = ctx->link != NULL && ctx->link->device ? ub->i0 + e : e; /* feature row: batch index, or staging row */
    }
    const int64_t n_out = fwd_output_rows(ctx, ub->output, n);
    fwd_upload_inputs(ctx, n);

    /* 2. input embeddings [n_embd, n] */
    tensor x = tensor_rows(&s->x, 0, n);
    fwd_embed_inputs(ctx, ub, &ctx->w.token_embd, x, n);

    /* 3. layers */
    for (int64_t il = 0; il < hp->n_layer; il++) {
        fwd_capture(ctx, il, x, n);
        fwd_attention_block(ctx, il, x, n, n_groups);
        fwd_ffn_block(ctx, il, x, n);
    }
    fwd_capture(ctx, hp->n_layer, x, n);

    /* 4. the head on the output rows */
    if (n_out > 0) {
        tensor rows = s->rows;
        rows.ne[0] = n_out;
        tensor x_out = tensor_rows(&s->x_out, 0, n_out);             /* [n_embd, n_out] */
        op_get_rows(q, x_out, x, rows);
        op_rmsnorm(q, x_out, x_out, &ctx->w.output_norm, hp->norm_eps);
        tensor logits = tensor_rows(&s->logits, 0, n_out);           /* [n_vocab, n_out] */
        if (ctx->argmax_only || ctx->logits_direct) {
            /* n_out ids (the token ids of s->ids were consumed by the embedding above, on this
             * queue), with each row's NaN/Inf flag (context_check_outputs). Greedy verification
             * wants only them; logits_direct (a host-visible backend with the fused head) has the
             * same op write the logits straight into the host array too. Without the fused head:
             * op_matmul + op_argmax. */
            tensor amax = fwd_vec_head(&s->ids, n_out);                  /* [n_out] i32 */
            if (backend_get_caps(ctx->be).matmul_argmax) {
                tensor host;                                             /* [n_vocab, n_out] or none */
                memset(&host, 0, sizeof(host));
                if (!ctx->argmax_only) {
                    host = tensor_2d(QUANT_TYPE_F32, ctx->logits + (size_t)n_out_before * (size_t)ctx->n_vocab,
                                     ctx->n_vocab, n_out);
                }
                op_matmul_argmax_logits(q, amax, ctx->w.output, x_out, 1.0f, host);
            } else {
                op_matmul(q, logits, ctx->w.output, x_out);
                op_argmax(q, amax, logits);
            }
            op_read(q, ctx->argmax_ids + n_out_before, amax, (size_t)n_out * sizeof(int32_t));
        } else {
            op_matmul(q, logits, ctx->w.output, x_out);
            op_read(q, ctx->logits + (size_t)n_out_before * (size_t)ctx->n_vocab, logits,
                    (size_t)n_out * (size_t)ctx->n_vocab * sizeof(float));
        }
    }
    /* 5. the sequences grew */
    for (int64_t g = 0; g < n_groups; g++) {
        ctx->kv.seq_len[ctx->groups[g].seq] += ctx->groups[g].n;
    }
    return DFL_OK;
}
