/* drafter.c: the DFlash drafter forward (docs/drafter.md), over the same per-layer code as the
 * target (forward_common.c):
 *
 *   inject (per committed target token at position p, features f_raw[p] = [x_L0 | x_L1 | ...]):
 *     f = rmsnorm(fc f_raw) * enc_output_norm                          [n_embd]
 *     per draft layer j: K/V cache_j[p] = rope(rmsnorm_per_head(Wk_j f) * k_norm_j, p), Wv_j f
 *                        (the fused feature does NOT pass through attn_norm)
 *   draft (per sequence, start = its context length; k = the draft length, at most B-1):
 *     x = token_embd[last, MASK x k] at positions start .. start+k
 *     per draft layer: a Qwen3 block whose attention is NON-causal over cells [0, start+k+1)
 *     logits = output(rmsnorm(x[1..k]) * output_norm)   -> argmax = draft tokens
 *     (the block is the trained one, B positions, when k = B-1; a shorter draft leaves out the
 *     trailing masks, whose outputs nobody reads, and costs (k+1)/B of a full pass; on the
 *     embedded pair the drafts of the kept positions come out the same, see models/README.md)
 *     drop the block's K/V (keep positions < start)
 *   options (docs/drafter.md, "Drafter options"): causal block, sliding-window layers (their
 *   own masks), embedding scale on x, logit scale, softcap (on the logits handed back);
 *   DSpark (drafter_dspark.c): anchor-first blocks [last, MASK x (k-1)] with every row a draft
 *   row, the greedy Markov chain over the head's rows, the confidence head.                */
#include "model/context.h"
#include "model/forward_common.h"
#include "speculative/drafter_dspark.h"
#include "speculative/drafter_dflash2.h"
#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What a drafter context has that a target context does not. */
struct drafter_state {
    dfl_context *target;   /* the target whose features it reads (borrowed) */
    int32_t *h_erow;       /* [n_ub] rows of the target's feature buffer (work order) */
    float *h_feat;         /* [n_tl*n_embd, n_ub] host features (host path) */
    int32_t *blk_tok;      /* [n_ub] the draft block's entries: token, position, sequence, output */
    int32_t *blk_pos;
    int32_t *blk_seq;
    bool *blk_out;
    float logit_scale;     /* dflash logit scale of the head */
    /* drafter options and DSpark (docs/drafter.md, "Drafter options", "DSpark") */
    dspark_state *dspark;  /* NULL: not a DSpark drafter */
    float *conf;           /* [n_seq * n_draft_max] DSpark confidences of the last draft (stride n_draft) */
    bool conf_valid;       /* the last draft produced confidences */
    int32_t *lens_all;     /* [n_seq] */
    backend_buffer *swa_buf; /* sliding-window layers' masks (swa_masks_upload) */
    tensor swa_mask;
    float *h_swa;          /* [n_ctx * n_ub] */
    size_t *swa_off;       /* [n_ub] float offset of each group's mask */
    dflash2_state *d2;     /* DFlash2 drafter (drafter_dflash2.c); NULL otherwise */
    /* a reduced draft vocabulary (dfl_context_params.draft_vocab; docs/drafter.md "Reduced
     * draft vocabulary"): the head computes the rows of these token ids only */
    int32_t n_hot;         /* 0: the whole head */
    int32_t *hot_ids;      /* [n_hot] token ids, ascending */
    float *hot_tmp;        /* [n_hot] one row of head logits while they are spread to n_vocab */
    backend_buffer *hot_buf;
    tensor hot_w;          /* [n_embd, n_hot] the head's rows of hot_ids (packed where the backend packs) */
};

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

dfl_status drafter_gather_rows(dfl_context *d, const gguf_tensor *src, const int32_t *ids, int64_t n, bool pack,
                               const char *what, backend_buffer **buf, tensor *out, dfl_error *err) {
    const size_t row_bytes = quant_row_size(src->type, src->ne[0]), bytes = row_bytes * (size_t)n;
    uint8_t *rows = malloc(bytes);
    if (rows == NULL) return error_set(err, DFL_ERR_NOMEM, "out of memory for the draft vocabulary's %s", what);
    for (int64_t i = 0; i < n; i++) {
        memcpy(rows + row_bytes * (size_t)i, (const uint8_t *)src->data + row_bytes * (size_t)ids[i], row_bytes);
    }
    const tensor plain = tensor_2d(src->type, rows, src->ne[0], n); /* [ne0, n] host rows */
    const size_t packed = pack && backend_get_caps(d->be).host_visible ? backend_weight_pack_size(d->be, &plain) : 0;
    dfl_error e2;
    error_clear(&e2);
    *buf = backend_buffer_alloc(d->be, packed > 0 ? packed : bytes, &e2);
    if (*buf == NULL) {
        free(rows);
        return error_set(err, e2.code, "draft vocabulary: cannot allocate its %.1f MB of %s: %s",
                         (double)(packed > 0 ? packed : bytes) / 1e6, what, e2.msg);
    }
    if (packed > 0) {
        *out = backend_weight_pack(d->be, &plain, backend_buffer_base(*buf));
        out->buf = *buf;
    } else {
        backend_buffer_set(*buf, 0, rows, bytes);
        *out = tensor_in_buffer(*buf, 0, src->type, src->ne[0], n);
    }
    free(rows);
    return DFL_OK;
}

void drafter_vocab_spread(float *dst, const float *src, const int32_t *hot_ids, int64_t n_hot, int64_t n_vocab) {
    for (int64_t v = 0; v < n_vocab; v++) dst[v] = -INFINITY;
    for (int64_t h = 0; h < n_hot; h++) dst[hot_ids[h]] = src[h];
}

/* A draft of the reduced head -> its token id; a NaN/Inf flag -1 - i names token hot_ids[i]. */
static int32_t hot_token(const drafter_state *ds, int32_t v) {
    return v >= 0 ? ds->hot_ids[v] : -1 - ds->hot_ids[-1 - v];
}

/* The reduced head: the rows hot[0..n) of the head (the drafter's own, else its target's) copied
 * into backend memory, ids sorted so that an argmax tie picks the lowest id as over the whole
 * head; packed like the model's weights unless no_pack. */
static dfl_status drafter_hot_init(dfl_context *d, drafter_state *ds, const int32_t *hot, int32_t n, bool no_pack,
                                   dfl_error *err) {
    const dfl_model *tm = ds->target->model;
    const gguf_tensor *src = d->model->output != NULL ? d->model->output : tm->output;
    /* DFlash2: the selector takes the top-k of every row, so the vocabulary holds at least k */
    const int64_t n_min = ds->d2 != NULL ? dflash2_top_k_count(ds->d2) : 1;
    if (hot == NULL || n < n_min || n > d->n_vocab || src == NULL) {
        return error_set(err, DFL_ERR_INVALID, "draft vocabulary: %d ids%s (expected %lld..%lld%s)", n,
                         hot == NULL ? " and no id list" : "", (long long)n_min, (long long)d->n_vocab,
                         ds->d2 != NULL ? ": a DFlash2 selector takes its top-k of them" : "");
    }
    ds->hot_ids = malloc((size_t)n * sizeof(int32_t));
    ds->hot_tmp = malloc((size_t)n * sizeof(float));
    if (ds->hot_ids == NULL || ds->hot_tmp == NULL) return error_set(err, DFL_ERR_NOMEM, "out of memory for the draft vocabulary");
    for (int32_t i = 0; i < n; i++) {
        if (hot[i] < 0 || hot[i] >= d->n_vocab) {
            return error_set(err, DFL_ERR_INVALID, "draft vocabulary: entry %d, token %d, is outside the vocabulary (0..%lld)",
                             i, hot[i], (long long)d->n_vocab - 1);
        }
        ds->hot_ids[i] = hot[i];
    }
    qsort(ds->hot_ids, (size_t)n, sizeof(int32_t), cmp_i32);
    for (int32_t i = 1; i < n; i++) {
        if (ds->hot_ids[i] == ds->hot_ids[i - 1]) {
            return error_set(err, DFL_ERR_INVALID, "draft vocabulary: token %d is listed twice", ds->hot_ids[i]);
        }
    }
    ds->n_hot = n;
    dfl_status st = drafter_gather_rows(d, src, ds->hot_ids, n, !no_pack, "head rows", &ds->hot_buf, &ds->hot_w, err);
    if (st != DFL_OK) return st;
    /* DSpark: the Markov chain's rows of the same ids */
    if (ds->dspark != NULL) return dspark_set_vocab(d, ds->dspark, ds->hot_ids, n, err);
    return DFL_OK;
}

drafter_state *drafter_state_new(dfl_context *d, const dfl_context_params *p, dfl_error *err) {
    dfl_context *target = p->target;
    const int64_t n = d->n_ub;
    drafter_state *ds = calloc(1, sizeof(*ds));
    if (ds == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the drafter context");
        return NULL;
    }
    ds->target = target;
    ds->h_erow = calloc((size_t)n, sizeof(int32_t));
    ds->h_feat = calloc((size_t)(d->model->hp.n_target_layers * d->n_embd * n), sizeof(float));
    ds->blk_tok = calloc((size_t)n, sizeof(int32_t));
    ds->blk_pos = calloc((size_t)n, sizeof(int32_t));
    ds->blk_seq = calloc((size_t)n, sizeof(int32_t));
    ds->blk_out = calloc((size_t)n, sizeof(bool));
    ds->logit_scale = d->model->dflash.logit_scale;
    ds->conf = calloc((size_t)(d->kv.n_seq * d->model->hp.n_draft_max), sizeof(float));
    ds->lens_all = calloc((size_t)d->kv.n_seq, sizeof(int32_t));
    if (!ds->h_erow || !ds->h_feat || !ds->blk_tok || !ds->blk_pos || !ds->blk_seq || !ds->blk_out || !ds->conf ||
        !ds->lens_all) {
        drafter_state_free(ds);
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the drafter context");
        return NULL;
    }
    if (d->model->dflash.swa_layer != NULL) {
        const size_t n_mask = (size_t)d->kv.n_ctx * (size_t)n;
        ds->h_swa = calloc(n_mask, sizeof(float));
        ds->swa_off = calloc((size_t)n, sizeof(size_t));
        ds->swa_buf = ds->h_swa != NULL && ds->swa_off != NULL ? backend_buffer_alloc(d->be, n_mask * sizeof(float), err) : NULL;
        if (ds->swa_buf == NULL) {
            if (ds->h_swa == NULL || ds->swa_off == NULL) error_set(err, DFL_ERR_NOMEM, "out of memory creating the drafter context");
            drafter_state_free(ds);
            return NULL;
        }
        ds->swa_mask = tensor_in_buffer(ds->swa_buf, 0, QUANT_TYPE_F32, (int64_t)n_mask, 1);
    }
    if (d->model->dspark.markov_w1 != NULL) {
        ds->dspark = dspark_state_new(d, err);
        if (ds->dspark == NULL) {
            drafter_state_free(ds);
            return NULL;
        }
    }
    if (d->model->d2 != NULL && (d->model->dflash.swa_layer != NULL || d->model->dspark.markov_w1 != NULL)) {
        error_set(err, DFL_ERR_UNSUPPORTED, "a DFlash2 drafter with %s is not supported (its convolution layers "
                  "use the plain block attention)", d->model->dflash.swa_layer != NULL ? "sliding-window layers" :
                  "DSpark heads");
        drafter_state_free(ds);
        return NULL;
    }
    if (d->model->d2 != NULL) {
        ds->d2 = dflash2_state_new(d, err);
        if (ds->d2 == NULL) {
            drafter_state_free(ds);
            return NULL;
        }
    }
    if (p->n_draft_vocab != 0 && drafter_hot_init(d, ds, p->draft_vocab, p->n_draft_vocab, p->no_weight_pack, err) != DFL_OK) {
        drafter_state_free(ds);
        return NULL;
    }
    return ds;
}

void drafter_state_free(drafter_state *ds) {
    if (ds == NULL) return;
    free(ds->h_erow);
    free(ds->h_feat);
    free(ds->blk_tok);
    free(ds->blk_pos);
    free(ds->blk_seq);
    free(ds->blk_out);
    free(ds->conf);
    free(ds->lens_all);
    free(ds->h_swa);
    free(ds->swa_off);
    if (ds->swa_buf) backend_buffer_free(ds->swa_buf);
    dspark_state_free(ds->dspark);
    dflash2_state_free(ds->d2);
    free(ds->hot_ids);
    free(ds->hot_tmp);
    if (ds->hot_buf) backend_buffer_free(ds->hot_buf);
    free(ds);
}

dflash2_state *drafter_dflash2(const dfl_context *d) { return d->dr != NULL ? d->dr->d2 : NULL; }

dfl_context *drafter_target(const dfl_context *d) { return d->dr != NULL ? d->dr->target : NULL; }

const float *drafter_confidence(const dfl_context *d) {
    return d->dr != NULL && d->dr->conf_valid ? d->dr->conf : NULL;
}

/* Sliding-window layers: additive masks [n_kv, n_g] per group, packed (group gi at
 * ds->swa_off[gi]): row i of a group (position len + i, cell len + i) sees cell c when the plan's
 * rule allows it (causal: c <= len + i; the non-causal block: every cell of the group) and c is
 * inside the window (llama.cpp's standard window: a key at p0 is hidden from a query at p1 when
 * p1 - p0 >= n_swa); uploaded to ds->swa_mask. */
static void swa_masks_upload(dfl_context *d, int64_t n_groups) {
    drafter_state *ds = d->dr;
    const int64_t n_swa = d->model->dflash.sliding_window;
    size_t off = 0;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const ctx_group *g = &d->groups[gi];
        const int64_t len = g->n_kv - g->n;
        float *m = ds->h_swa + off;
        ds->swa_off[gi] = off;
        for (int64_t i = 0; i < g->n; i++) {
            const int64_t qpos = len + i;
            for (int64_t c = 0; c < g->n_kv; c++) {
                const bool seen = (!g->causal || c <= qpos) && qpos - c < n_swa;
                m[i * g->n_kv + c] = seen ? 0.0f : -INFINITY;
            }
        }
        off += (size_t)g->n_kv * (size_t)g->n;
    }
    op_write(d->queue, fwd_vec_head(&ds->swa_mask, (int64_t)off), ds->h_swa, off * sizeof(float));
}

/* Validation limits of an injection batch. */
static void inject_limits(const dfl_context *d, const dfl_batch *b, batch_limits *lim) {
    memset(lim, 0, sizeof(*lim));
    lim->n_vocab = d->n_vocab;
    lim->n_embd = d->model->hp.n_target_layers * d->n_embd;
    lim->n_pos_sections = b->n_pos_sections;
    lim->n_seq = d->kv.n_seq;
    lim->n_ctx = d->kv.n_ctx - d->model->hp.block_size; /* keep room for the block */
    lim->n_batch = d->params.n_batch;
    const dfl_context *t = drafter_target(d);
    lim->n_rows_available = t != NULL && t->link != NULL ? t->link->n_rows : 0;
    lim->seq_len = d->kv.seq_len;
}

dfl_status drafter_inject(dfl_context *d, const dfl_batch *batch, dfl_error *err) {
    batch_limits lim;
    inject_limits(d, batch, &lim);
    dfl_status st = batch_validate(batch, &lim, err);
    if (st != DFL_OK) return st;
    for (int64_t i = 0; i < batch->n_tokens; i++) {
        if (batch->embd_row[i] < 0 && !batch->has_embd[i]) {
            return error_set(err, DFL_ERR_INVALID, "drafter batch entry %lld carries no features (embedding or embd row)",
                             (long long)i);
        }
    }
    const dfl_hparams *hp = &d->model->hp;
    const int64_t width = hp->n_target_layers * d->n_embd;
    backend_queue *q = d->queue;
    ctx_scratch *s = &d->s;
    drafter_state *ds = d->dr;
    feature_link *fl = ds->target->link;
    const bool rows = batch->embd_row[0] >= 0;
    if (rows && !fl->device) {
        return error_set(err, DFL_ERR_INVALID, "drafter batch: embd rows need the target's feature buffer (%s)", fl->note);
    }
    context_sync_pending(d); /* the host staging arrays are about to be rewritten */
    /* the reader's side of the feature handoff (speculative/feature_link.h, steps 4-6) */
    if (rows) feature_link_read_begin(fl, q);
    int64_t cursor = 0;
    batch_ubatch ub;
    while (batch_split(batch, d->n_ub, &cursor, &ub)) {
        const int64_t n = ub.n_tokens;
        const int64_t n_groups = fwd_plan_groups(d, &ub, false);
        (void)n_groups;
        for (int64_t r = 0; r < n; r++) {
            const int64_t e = d->h_perm[r];
            d->h_pos[r] = ub.pos[e * ub.n_pos_sections];
            d->h_cells[r] = kv_cell(&d->kv, ub.seq_id[e], ub.pos[e * ub.n_pos_sections]);
            ds->h_erow[r] = ub.embd_row[e];
            d->h_ids[r] = 0;
            d->h_bidx[r] = ub.i0 + e;
            d->h_rows[r] = 0;
        }
        op_write(q, fwd_vec_head(&s->pos, n), d->h_pos, (size_t)n * sizeof(int32_t));
        op_write(q, fwd_vec_head(&s->cells, n), d->h_cells, (size_t)n * sizeof(int64_t));
        /* raw features [width, n] in work order */
        tensor f_raw = tensor_rows(&s->feat_in, 0, n);
        if (ub.has_embd_rows) {
            /* device path: gather rows of the target's feature buffer in place */
            op_write(q, fwd_vec_head(&s->erow, n), ds->h_erow, (size_t)n * sizeof(int32_t));
            op_get_rows(q, f_raw, fl->feat, fwd_vec_head(&s->erow, n));
        } else {
            for (int64_t r = 0; r < n; r++) {
                memcpy(ds->h_feat + r * width, ub.embd + d->h_perm[r] * ub.n_embd, (size_t)width * sizeof(float));
            }
            op_write(q, f_raw, ds->h_feat, (size_t)width * (size_t)n * sizeof(float));
        }
        /* f = rmsnorm(fc f_raw) * enc_output_norm   [n_embd, n] */
        tensor f = tensor_rows(&s->h, 0, n);
        op_matmul(q, f, d->w.fc, f_raw);
        op_rmsnorm(q, f, f, &d->w.enc_norm, hp->norm_eps);
        for (int64_t il = 0; il < hp->n_layer; il++) fwd_write_kv(d, il, f, n);
        for (int64_t e = 0; e < n; e++) d->kv.seq_len[ub.seq_id[e]]++;
        if (cursor < batch->n_tokens) backend_queue_synchronize(q); /* staging arrays reused */
    }
    if (rows) feature_link_read_end(fl, q);
    d->pending = true;
    return DFL_OK;
}

dfl_status drafter_draft(dfl_context *d, int32_t n_active, const int32_t *seqs, const int32_t *last, int32_t n_draft,
                         const int32_t *lens, int32_t *out, float *logits_out, dfl_error *err) {
    const dfl_hparams *hp = &d->model->hp;
    const int64_t K = hp->n_draft_max;
    /* anchor-first DSpark: row 0 (the anchor) is a draft row, the block has len rows */
    const bool anchor_first = d->model->dspark.markov_w1 != NULL && d->model->dspark.anchor_first;
    if (n_active <= 0 || n_active > d->kv.n_seq) {
        return error_set(err, DFL_ERR_INVALID, "draft: %d sequences (expected 1..%lld)", n_active, (long long)d->kv.n_seq);
    }
    if (n_draft < 1 || n_draft > K) {
        return error_set(err, DFL_ERR_INVALID, "draft length %d is outside 1..%lld (%s)", n_draft, (long long)K,
                         anchor_first ? "block_size, anchor-first DSpark" : "block_size - 1");
    }
    for (int32_t i = 0; i < n_active; i++) {
        if (seqs[i] < 0 || seqs[i] >= d->kv.n_seq) {
            return error_set(err, DFL_ERR_INVALID, "draft: sequence id %d is out of range", seqs[i]);
        }
        for (int32_t j = 0; j < i; j++) {
            if (seqs[j] == seqs[i]) return error_set(err, DFL_ERR_INVALID, "draft: sequence %d listed twice", seqs[i]);
        }
        if (last[i] < 0 || last[i] >= d->n_vocab) {
            return error_set(err, DFL_ERR_INVALID, "draft: token %d is outside the vocabulary", last[i]);
        }
        if (lens != NULL && (lens[i] < 1 || lens[i] > n_draft)) {
            return error_set(err, DFL_ERR_INVALID, "draft: sequence %d's draft length %d is outside 1..%d", seqs[i], lens[i],
                             n_draft);
        }
        if (d->kv.seq_len[seqs[i]] + n_draft + 1 > d->kv.n_ctx) {
            return error_set(err, DFL_ERR_CTX_FULL, "draft: sequence %d has no room for a block of %d", seqs[i],
                             n_draft + 1);
        }
    }
    context_sync_pending(d);
    drafter_state *ds = d->dr;
    /* the block as a micro-batch of nb_i = len_i + 1 positions per sequence i (its own draft
     * length, so that its drafts do not depend on the other sequences of the pass), one after
     * the other */
    int64_t n = 0;
    for (int32_t i = 0; i < n_active; i++) {
        const int64_t start = d->kv.seq_len[seqs[i]];
        ds->lens_all[i] = lens != NULL ? lens[i] : n_draft;
        const int64_t nb = ds->lens_all[i] + (anchor_first ? 0 : 1);
        for (int64_t k = 0; k < nb; k++, n++) {
            ds->blk_tok[n] = k == 0 ? last[i] : (int32_t)hp->mask_token_id;
            ds->blk_pos[n] = (int32_t)(start + k);
            ds->blk_seq[n] = seqs[i];
            ds->blk_out[n] = anchor_first || k >= 1;
        }
    }
    ds->conf_valid = false;
    batch_ubatch ub;
    memset(&ub, 0, sizeof(ub));
    ub.n_tokens = n;
    ub.n_pos_sections = 1;
    ub.token = ds->blk_tok;
    ub.pos = ds->blk_pos;
    ub.seq_id = ds->blk_seq;
    ub.output = ds->blk_out;
    const int64_t n_groups = fwd_plan_groups(d, &ub, !hp->causal);
    int64_t n_out = 0;
    for (int64_t r = 0; r < n; r++) {
        const int64_t e = d->h_perm[r];
        d->h_ids[r] = ds->blk_tok[e];
        d->h_pos[r] = ds->blk_pos[e];
        d->h_cells[r] = kv_cell(&d->kv, ds->blk_seq[e], ds->blk_pos[e]);
        d->h_bidx[r] = e;
    }
    n_out = fwd_output_rows(d, ds->blk_out, n);
    fwd_upload_inputs(d, n);
    backend_queue *q = d->queue;
    ctx_scratch *s = &d->s;
    tensor x = tensor_rows(&s->x, 0, n);                               /* [n_embd, n] */
    fwd_embed_inputs(d, &ub, &d->w.token_embd, x, n);
    const model_dflash *opt = &d->model->dflash;
    if (opt->embedding_scale != 1.0f) op_scale(q, x, x, opt->embedding_scale);
    if (opt->swa_layer != NULL) swa_masks_upload(d, n_groups);
    if (ds->d2 != NULL) dflash2_begin(d, ds->d2, &ub, n); /* DFlash2: the conv taps' row shifts */
    for (int64_t il = 0; il < hp->n_layer; il++) {
        if (ds->d2 != NULL) {
            dflash2_layer(d, ds->d2, il, x, n, n_groups); /* DFlash2: layers with convolutions */
            continue;
        }
        const bool swa = opt->swa_layer != NULL && opt->swa_layer[il];
        fwd_attention_block_mask(d, il, x, n, n_groups, swa ? &ds->swa_mask : NULL, swa ? ds->swa_off : NULL);
        fwd_ffn_block(d, il, x, n);
    }
    /* head on slots 1..len_i of every block, in entry order (packed) */
    tensor rows = fwd_vec_head(&s->rows, n_out);
    tensor x_out = tensor_rows(&s->x_out, 0, n_out);                  /* [n_embd, n_out] */
    op_get_rows(q, x_out, x, rows);
    op_rmsnorm(q, x_out, x_out, &d->w.output_norm, hp->norm_eps);
    tensor logits = tensor_rows(&s->logits, 0, n_out);                /* [n_vocab, n_out] */
    bool flagged = false, ids_mapped = false;
    const int64_t n_row = ds->n_hot > 0 ? ds->n_hot : d->n_vocab; /* logits per output row */
    if (ds->d2 == NULL && ds->dspark == NULL) {
        tensor amax = fwd_vec_head(&s->ids, n_out);                       /* [n_out] i32 */
        const tensor *head = ds->n_hot > 0 ? &ds->hot_w : &d->w.output;
        if (ds->n_hot > 0) {                                              /* [n_hot, n_out] */
            logits = tensor_2d(QUANT_TYPE_F32, s->logits.data, n_row, n_out);
            logits.buf = s->logits.buf;
        }
        if (logits_out == NULL && backend_get_caps(d->be).matmul_argmax) {
            /* greedy drafts only: the head's argmax without writing the logits (same ids) */
            op_matmul_argmax(q, amax, *head, x_out, ds->logit_scale);
        } else {
            op_matmul(q, logits, *head, x_out);
            if (ds->logit_scale != 1.0f) op_scale(q, logits, logits, ds->logit_scale);
            op_argmax(q, amax, logits);
        }
        op_read(q, out, amax, (size_t)n_out * sizeof(int32_t));
    } else if (ds->n_hot > 0) { /* DFlash2 / DSpark on the reduced head: [n_hot, n_out] */
        logits = tensor_2d(QUANT_TYPE_F32, s->logits.data, n_row, n_out);
        logits.buf = s->logits.buf;
        op_matmul(q, logits, ds->hot_w, x_out);
    } else {
        op_matmul(q, logits, d->w.output, x_out);
    }
    if (ds->d2 != NULL) {
        /* DFlash2: the selector lattice and its walk give the drafts (drafter_dflash2.c) */
        if (ds->logit_scale != 1.0f) op_scale(q, logits, logits, ds->logit_scale);
        dfl_status st = dflash2_select(d, ds->d2, x_out, logits, n_out, n_active, last, n_draft, lens, ds->hot_ids,
                                       ds->n_hot, out, logits_out, err);
        d->pending = false;
        return st;
    }
    if (ds->dspark != NULL) {
        /* DSpark: the chain feeds each row's argmax to the next row's get_rows, so a NaN/Inf in
         * the head's rows (flagged by ARGMAX as a negative id) must stop it first; the Markov
         * weights were checked finite and bounded when the context was created */
        tensor amax = fwd_vec_head(&s->ids, n_out);                       /* [n_out] i32 */
        op_argmax(q, amax, logits);
        op_read(q, out, amax, (size_t)n_out * sizeof(int32_t));
        backend_queue_synchronize(q);
        for (int64_t r = 0; r < n_out && !flagged; r++) flagged = out[r] < 0;
        /* no Markov chain ran: no row is a DSpark draft, all are flagged (the session cuts them;
         * a reduced vocabulary's flags name their token ids first) */
        for (int64_t r = 0; r < n_out && flagged; r++) {
            out[r] = out[r] >= 0 ? -1 : ds->n_hot > 0 ? hot_token(ds, out[r]) : out[r];
        }
        ids_mapped = flagged;
    }
    if (ds->dspark != NULL && !flagged) {
        /* DSpark: the Markov bias chained over the rows (drafts = argmax of the biased rows),
         * then the logit scale on the biased rows */
        dspark_chain_enqueue(d, ds->dspark, logits, x_out, n_active, last, ds->lens_all);
        if (ds->logit_scale != 1.0f) op_scale(q, logits, logits, ds->logit_scale);
    }
    if (logits_out != NULL) {
        op_read(q, logits_out, logits, (size_t)n_out * (size_t)n_row * sizeof(float));
    }
    backend_queue_synchronize(q);
    d->pending = false;
    if (ds->n_hot > 0 && !ids_mapped) {
        for (int64_t r = 0; r < n_out; r++) out[r] = hot_token(ds, out[r]); /* ids of the reduced head -> tokens */
    }
    if (ds->dspark != NULL && !flagged) {
        dspark_finish(d, ds->dspark, n_active, last, ds->lens_all, out, d->model->dspark.conf_proj ? ds->conf : NULL);
        ds->conf_valid = d->model->dspark.conf_proj != NULL;
    }
    /* final logit softcapping: monotone, so it changes the drafter's probabilities, not its drafts */
    const float cap = opt->final_logit_softcapping;
    if (logits_out != NULL && cap > 0.0f) {
        for (size_t i = 0; i < (size_t)n_out * (size_t)n_row; i++) logits_out[i] = cap * tanhf(logits_out[i] / cap);
    }
    if (logits_out != NULL && ds->n_hot > 0) {
        /* rows of n_hot -> rows of n_vocab, last row first (its packed offset is <= its own): the
         * tokens outside the reduced vocabulary get -inf (probability 0: they are never drafted) */
        for (int64_t r = n_out - 1; r >= 0; r--) {
            memcpy(ds->hot_tmp, logits_out + (size_t)r * (size_t)n_row, (size_t)n_row * sizeof(float));
            drafter_vocab_spread(logits_out + (size_t)r * (size_t)d->n_vocab, ds->hot_tmp, ds->hot_ids, n_row, d->n_vocab);
        }
    }
    if (lens != NULL) {
        /* outputs came packed (sequence i's len_i rows after those of sequences < i): spread them
         * to stride n_draft, last sequence first (its packed offset is <= its strided one) */
        int64_t off = n_out;
        for (int32_t i = n_active - 1; i >= 0; i--) {
            off -= lens[i];
            const int64_t dst = (int64_t)i * n_draft;
            memmove(out + dst, out + off, (size_t)lens[i] * sizeof(int32_t));
            if (ds->conf_valid) memmove(ds->conf + dst, ds->conf + off, (size_t)lens[i] * sizeof(float));
            if (logits_out != NULL) {
                memmove(logits_out + dst * d->n_vocab, logits_out + off * d->n_vocab,
                        (size_t)lens[i] * (size_t)d->n_vocab * sizeof(float));
            }
        }
    }
    /* the block's K/V are dropped: seq_len was never advanced past start */
    return DFL_OK;
}
