/* forward_common.c: micro-batch planning (work order, per-sequence groups), input
 * upload, embedding, layer-input capture, and the attention / FFN sub-blocks shared by the target
 * and drafter forwards. */
#include "model/forward_common.h"
#include "base/error.h"

#include <string.h>

tensor fwd_vec_head(const tensor *t, int64_t n) {
    tensor v = *t;
    v.ne[0] = n;
    return v;
}

int64_t fwd_plan_groups(dfl_context *ctx, const batch_ubatch *ub, bool non_causal) {
    const int64_t n = ub->n_tokens;
    const int64_t n_seq = ctx->kv.n_seq;
    int64_t *count = ctx->seq_len_tmp; /* [n_seq] entries per sequence, then the start row */
    memset(count, 0, (size_t)n_seq * sizeof(int64_t));
    for (int64_t e = 0; e < n; e++) count[ub->seq_id[e]]++;
    int64_t n_groups = 0, r = 0;
    for (int64_t sq = 0; sq < n_seq; sq++) {
        if (count[sq] == 0) continue;
        ctx_group *g = &ctx->groups[n_groups++];
        g->seq = (int32_t)sq;
        g->r0 = r;
        g->n = count[sq];
        g->n_kv = ctx->kv.seq_len[sq] + count[sq];
        g->causal = !non_causal;
        count[sq] = r; /* now: next free work row of sq */
        r += g->n;
    }
    for (int64_t e = 0; e < n; e++) {
        const int64_t row = count[ub->seq_id[e]]++;
        ctx->h_perm[row] = e;
        ctx->h_inv[e] = row;
    }
    /* no mask: a group's attention op computes it (BACKEND_ATTN_CAUSAL: row i, at position
     * len + i, sees the cells <= len + i; BACKEND_ATTN_FULL: every cell of the group) */
    return n_groups;
}

int64_t fwd_output_rows(dfl_context *ctx, const bool *output, int64_t n) {
    int64_t n_out = 0;
    for (int64_t e = 0; e < n; e++) {
        if (output[e]) ctx->h_rows[n_out++] = (int32_t)ctx->h_inv[e];
    }
    return n_out;
}

void fwd_upload_inputs(dfl_context *ctx, int64_t n) {
    ctx_scratch *s = &ctx->s;
    backend_queue *q = ctx->queue;
    op_write(q, fwd_vec_head(&s->ids, n), ctx->h_ids, (size_t)n * sizeof(int32_t));
    op_write(q, fwd_vec_head(&s->pos, n), ctx->h_pos, (size_t)n * sizeof(int32_t));
    op_write(q, fwd_vec_head(&s->cells, n), ctx->h_cells, (size_t)n * sizeof(int64_t));
    op_write(q, fwd_vec_head(&s->bidx, n), ctx->h_bidx, (size_t)n * sizeof(int64_t));
    op_write(q, fwd_vec_head(&s->rows, n), ctx->h_rows, (size_t)n * sizeof(int32_t));
}

void fwd_embed_inputs(dfl_context *ctx, const batch_ubatch *ub, const tensor *token_embd, tensor x, int64_t n) {
    backend_queue *q = ctx->queue;
    bool any_token = false;
    for (int64_t r = 0; r < n; r++) {
        const int64_t e = ctx->h_perm[r];
        if (!(ub->embd != NULL && ub->has_embd[e])) any_token = true;
    }
    if (any_token) op_get_rows(q, x, *token_embd, fwd_vec_head(&ctx->s.ids, n));
    /* entries with an embedding use it (a token id beside it is informational) */
    if (ub->embd != NULL) {
        for (int64_t r = 0; r < n; r++) {
            const int64_t e = ctx->h_perm[r];
            if (!ub->has_embd[e]) continue;
            memcpy(ctx->h_embd + r * ctx->n_embd, ub->embd + e * ub->n_embd, (size_t)ctx->n_embd * sizeof(float));
            op_write(q, tensor_row(&x, r), ctx->h_embd + r * ctx->n_embd, (size_t)ctx->n_embd * sizeof(float));
        }
    }
}

void fwd_capture(dfl_context *ctx, int64_t id, tensor x, int64_t n) {
    const feature_link *fl = ctx->link;
    for (int32_t j = 0; fl != NULL && j < fl->n_capture; j++) {
        if (fl->capture_layers[j] != id) continue;
        /* columns [j*n_embd, (j+1)*n_embd) of the feature rows: a strided view */
        const int64_t ne[4] = {ctx->n_embd, fl->feat.ne[1], 1, 1};
        const size_t nb[4] = {sizeof(float), fl->feat.nb[1], fl->feat.nb[1] * (size_t)fl->feat.ne[1],
                              fl->feat.nb[1] * (size_t)fl->feat.ne[1]};
        tensor cols = tensor_view(&fl->feat, ne, nb, (size_t)j * (size_t)ctx->n_embd * sizeof(float));
        op_set_rows(ctx->queue, cols, x, fwd_vec_head(&ctx->s.bidx, n));
    }
}

void fwd_write_kv(dfl_context *ctx, int64_t il, tensor h, int64_t n) {
    const dfl_hparams *hp = &ctx->model->hp;
    const ctx_layer_w *L = &ctx->w.layers[il];
    backend_queue *q = ctx->queue;
    ctx_scratch *s = &ctx->s;
    tensor k = tensor_reshape_2d(&s->k, hp->n_embd_head_k * hp->n_head_kv, ctx->n_ub);
    k = tensor_rows(&k, 0, n);                                            /* [n_kv*hd_k, n] */
    tensor v = tensor_reshape_2d(&s->v, hp->n_embd_head_v * hp->n_head_kv, ctx->n_ub);
    v = tensor_rows(&v, 0, n);                                            /* [n_kv*hd_v, n] */
    op_matmul(q, k, L->wk, h);
    op_matmul(q, v, L->wv, h);
    tensor k3 = tensor_reshape_3d(&k, hp->n_embd_head_k, hp->n_head_kv, n); /* [hd_k, n_kv, n] */
    if (L->has_qk_norm) {
        tensor kh = tensor_reshape_2d(&k, hp->n_embd_head_k, hp->n_head_kv * n);
        op_rmsnorm(q, kh, kh, &L->k_norm, hp->norm_eps);
    }
    if (hp->arch == DFL_ARCH_LLAMA) op_rope_norm(q, k3, k3, fwd_vec_head(&s->pos, n), hp->rope_freq_base, 0);
    else op_rope_neox(q, k3, k3, fwd_vec_head(&s->pos, n), hp->rope_freq_base, 0);
    tensor cells = fwd_vec_head(&s->cells, n);
    op_set_rows(q, ctx->kv.k[il], k, cells);
    op_set_rows(q, ctx->kv.v[il], v, cells);
}

void fwd_attention_block(dfl_context *ctx, int64_t il, tensor x, int64_t n, int64_t n_groups) {
    fwd_attention_block_mask(ctx, il, x, n, n_groups, NULL, NULL);
}

void fwd_attention_block_mask(dfl_context *ctx, int64_t il, tensor x, int64_t n, int64_t n_groups, const tensor *mask,
                              const size_t *mask_off) {
    const dfl_hparams *hp = &ctx->model->hp;
    const ctx_layer_w *L = &ctx->w.layers[il];
    backend_queue *q = ctx->queue;
    tensor h = tensor_rows(&ctx->s.h, 0, n);                               /* [n_embd, n] */
    op_rmsnorm(q, h, x, &L->attn_norm, hp->norm_eps);
    fwd_attention_core(ctx, il, h, h, n, n_groups, mask, mask_off);
    op_add(q, x, x, h);
}

void fwd_attention_core(dfl_context *ctx, int64_t il, tensor h, tensor out, int64_t n, int64_t n_groups,
                        const tensor *mask, const size_t *mask_off) {
    const dfl_hparams *hp = &ctx->model->hp;
    const ctx_layer_w *L = &ctx->w.layers[il];
    backend_queue *q = ctx->queue;
    ctx_scratch *s = &ctx->s;
    const int64_t hd_k = hp->n_embd_head_k, hd_v = hp->n_embd_head_v;

    /* q [hd_k, n_head, n] */
    tensor qm = tensor_reshape_2d(&s->q, hd_k * hp->n_head, ctx->n_ub);
    qm = tensor_rows(&qm, 0, n);
    op_matmul(q, qm, L->wq, h);
    /* k, v -> cache; their matmuls right after q's, so that the three share h's prepared
     * activations (the CPU backend reuses them for consecutive matmuls of one input) */
    fwd_write_kv(ctx, il, h, n);
    if (L->has_qk_norm) {
        tensor qh = tensor_reshape_2d(&qm, hd_k, hp->n_head * n);
        op_rmsnorm(q, qh, qh, &L->q_norm, hp->norm_eps);
    }
    tensor q3 = tensor_reshape_3d(&qm, hd_k, hp->n_head, n);
    if (hp->arch == DFL_ARCH_LLAMA) op_rope_norm(q, q3, q3, fwd_vec_head(&s->pos, n), hp->rope_freq_base, 0);
    else op_rope_neox(q, q3, q3, fwd_vec_head(&s->pos, n), hp->rope_freq_base, 0);
    /* attention per sequence group over its cells [0, n_kv) */
    tensor att = tensor_reshape_2d(&s->att, hd_v * hp->n_head, ctx->n_ub);
    att = tensor_rows(&att, 0, n);                                         /* [n_head*hd_v, n] */
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const ctx_group *g = &ctx->groups[gi];
        tensor kc = kv_k_view(&ctx->kv, il, g->seq, g->n_kv);
        tensor vc = kv_v_view(&ctx->kv, il, g->seq, g->n_kv);
        kc = tensor_reshape_3d(&kc, hd_k, hp->n_head_kv, g->n_kv);           /* [hd_k, n_kv_head, n_kv] */
        vc = tensor_reshape_3d(&vc, hd_v, hp->n_head_kv, g->n_kv);           /* [hd_v, n_kv_head, n_kv] */
        tensor qg = tensor_rows(&qm, g->r0, g->n);
        qg = tensor_reshape_3d(&qg, hd_k, hp->n_head, g->n);                /* [hd_k, n_head, n_g] */
        tensor og = tensor_rows(&att, g->r0, g->n);
        og = tensor_reshape_3d(&og, hd_v, hp->n_head, g->n);                /* [hd_v, n_head, n_g] */
        if (mask != NULL) {
            tensor mg = tensor_2d(QUANT_TYPE_F32, (float *)mask->data + mask_off[gi], g->n_kv, g->n); /* [n_kv, n_g] */
            mg.buf = mask->buf;
            op_attention(q, og, qg, kc, vc, mg, 0.0f);
        } else {
            op_attention_structured(q, og, qg, kc, vc, g->causal ? BACKEND_ATTN_CAUSAL : BACKEND_ATTN_FULL, 0.0f);
        }
    }
    /* out = Wo att */
    op_matmul(q, out, L->wo, att);
}

void fwd_ffn_block(dfl_context *ctx, int64_t il, tensor x, int64_t n) {
    const dfl_hparams *hp = &ctx->model->hp;
    const ctx_layer_w *L = &ctx->w.layers[il];
    backend_queue *q = ctx->queue;
    ctx_scratch *s = &ctx->s;
    tensor h = tensor_rows(&s->h, 0, n);       /* [n_embd, n] */
    tensor gate = tensor_rows(&s->gate, 0, n); /* [n_ff, n] */
    tensor up = tensor_rows(&s->up, 0, n);     /* [n_ff, n] */
    op_rmsnorm(q, h, x, &L->ffn_norm, hp->norm_eps);
    op_matmul(q, gate, L->ffn_gate, h);
    op_matmul(q, up, L->ffn_up, h);
    op_swiglu(q, gate, gate, up);
    op_matmul(q, h, L->ffn_down, gate);
    op_add(q, x, x, h);
}
