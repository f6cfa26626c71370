/* drafter_dflash2.c: the DFlash2 drafter (docs/drafter.md, "DFlash2").
 *
 *   dynamic convolution of one sub-block (attention or FFN) of layer il, side s (0: input,
 *   1: output), over the rows of each sequence's block (row i = block position i):
 *     c = conv_proj h                                          [2 K G, n] (h: the normed input)
 *     w_t[i, ch] = c[g(ch) + G (t + K s), i] + base[ch, t, s]  (g(ch) = ch / gs)
 *     y[i, ch] = sum_t w_t[i, ch] * v[i - t, ch]               (0 when i - t < 0)
 *   composed of existing backend ops over all taps at once (K + 3 ops): a broadcast add of the
 *   group coefficients onto zeros, an add of the static kernel rows, one get_rows that gathers
 *   every row shifted by every tap inside its block (a row whose block position is < t reads a
 *   zero row), a mul, and the sum over taps in order; the order of the f32 operations is
 *   llama.cpp's (coefficient + base, times value, summed over taps in order).
 *
 *   selector (host, after the head): per output row the top-k candidates of the logits, their
 *   logits u, gate = selector_hidden e, and
 *     score[j][s] = u[s] + sum_r succ[cand[s]][r] * (pred[p_j][r] * gate[r])
 *   with p_j the anchor (block position 1) or the previous position's candidates; the walk
 *   picks, from the first position on, the best successor of the previous pick (first maximum).
 *   The codebook rows are read from the file mapping (they are never on a device). */
#include "speculative/drafter_dflash2.h"
#include "model/forward_common.h"
#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dflash2_state {
    int64_t K, G, gs, R, k;     /* conv taps, groups, group size, selector rank, top-k */
    int64_t n_embd, n_ub, n_vocab, n_rows_out;
    backend_buffer *buf;
    tensor cv;                  /* [n_embd, n_ub + 1] conv source rows; row n_ub stays zero */
    tensor dyn;                 /* [2 K G, n_ub] dynamic coefficients of the current sub-block */
    tensor w;                   /* [n_embd, K, n_ub] tap weights, then the taps' terms */
    tensor sh;                  /* [n_embd, K * n_ub] row r shifted by tap t at r*K + t */
    tensor zero;                /* [n_embd, K * n_ub] zeros (never written) */
    tensor sidx;                /* [K * n_ub] i32 source row of (row r, tap t) at r*K + t */
    tensor gate;                /* [R, n_rows_out] selector gate */
    tensor bases;               /* [n_embd, n_layer * 4 * K] f32 row ((il*2 + f)*2 + s)*K + t */
    backend_buffer *base_buf;
    tensor *attn_proj;          /* [n_layer] [n_embd, 2 K G] */
    tensor *ffn_proj;           /* [n_layer] [n_embd, 2 K G] */
    tensor sel_hidden;          /* [n_embd, R] */
    const gguf_tensor *sel_pred, *sel_succ; /* [R, n_vocab] in the mapping */
    int32_t *h_sidx;            /* [n_ub, K] */
    float *h_logits;            /* [n_rows_out, n_vocab] */
    float *h_gate;              /* [n_rows_out, R] */
    int32_t *cand;              /* [n_rows_out, k] candidate token ids */
    float *cand_lg;             /* [n_rows_out, k] their logits */
    float *lattice;             /* [n_rows_out, k + k*k] */
    float *probs;               /* [n_seq * block_size] walk probabilities, strided like out */
    float *pred_rows;           /* [k, R] */
    float *succ_rows;           /* [k, R] */
    float *cond;                /* [R] */
    bool drafted;               /* a select has run */
};

/* A weight of the mapping as a tensor on the context's backend (its device copy if any). */
static tensor d2_weight(const dfl_context *d, const gguf_tensor *g) {
    tensor t = ctx_tensor_from_gguf(g);
    if (!d->weights_on_device) return t;
    const dfl_model *m = d->model;
    const uint8_t *lo = gguf_file_data(m->gguf) + gguf_data_offset(m->gguf);
    for (int i = 0; i < MODEL_MAX_DEVICE_COPIES; i++) {
        if (m->dev[i].be != d->be || m->dev[i].buf == NULL) continue;
        t.data = (uint8_t *)backend_buffer_base(m->dev[i].buf) + ((const uint8_t *)g->data - lo);
        t.buf = m->dev[i].buf;
    }
    return t;
}

void dflash2_state_free(dflash2_state *st) {
    if (st == NULL) return;
    backend_buffer_free(st->buf);
    backend_buffer_free(st->base_buf);
    free(st->attn_proj);
    free(st->ffn_proj);
    free(st->h_sidx);
    free(st->h_logits);
    free(st->h_gate);
    free(st->cand);
    free(st->cand_lg);
    free(st->lattice);
    free(st->probs);
    free(st->pred_rows);
    free(st->succ_rows);
    free(st->cond);
    free(st);
}

/* Lays out the scratch in buf (NULL: only the size). */
static size_t d2_layout(dflash2_state *st, backend_buffer *buf) {
    size_t off = 0;
#define PLACE(field, type, ne0, ne1)                                                    \
    do {                                                                                \
        if (buf) st->field = tensor_in_buffer(buf, off, type, (ne0), (ne1));            \
        off += (quant_row_size(type, (ne0)) * (size_t)(ne1) + 63) & ~(size_t)63;        \
    } while (0)
    PLACE(cv, QUANT_TYPE_F32, st->n_embd, st->n_ub + 1);
    PLACE(dyn, QUANT_TYPE_F32, 2 * st->K * st->G, st->n_ub);
    PLACE(w, QUANT_TYPE_F32, st->n_embd, st->K * st->n_ub);
    PLACE(sh, QUANT_TYPE_F32, st->n_embd, st->K * st->n_ub);
    PLACE(zero, QUANT_TYPE_F32, st->n_embd, st->K * st->n_ub);
    PLACE(sidx, QUANT_TYPE_I32, st->K * st->n_ub, 1);
    PLACE(gate, QUANT_TYPE_F32, st->R, st->n_rows_out);
#undef PLACE
    return off;
}

dflash2_state *dflash2_state_new(dfl_context *d, dfl_error *err) {
    const dfl_model *m = d->model;
    const model_dflash2 *d2 = m->d2;
    const dfl_hparams *hp = &m->hp;
    dflash2_state *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the DFlash2 drafter state");
        return NULL;
    }
    st->K = d2->conv_kernel;
    st->gs = d2->conv_group;
    st->G = hp->n_embd / d2->conv_group;
    st->R = d2->rank;
    st->k = d2->top_k;
    st->n_embd = hp->n_embd;
    st->n_ub = d->n_ub;
    st->n_vocab = d->n_vocab;
    st->n_rows_out = d->s.logits.ne[1];
    st->sel_pred = d2->sel_pred;
    st->sel_succ = d2->sel_succ;
    const int64_t n_rows = st->n_rows_out, k = st->k, R = st->R;
    st->attn_proj = calloc((size_t)hp->n_layer, sizeof(tensor));
    st->ffn_proj = calloc((size_t)hp->n_layer, sizeof(tensor));
    st->h_sidx = calloc((size_t)(st->K * st->n_ub), sizeof(int32_t));
    st->h_logits = malloc((size_t)(n_rows * st->n_vocab) * sizeof(float));
    st->h_gate = malloc((size_t)(n_rows * R) * sizeof(float));
    st->cand = calloc((size_t)(n_rows * k), sizeof(int32_t));
    st->cand_lg = calloc((size_t)(n_rows * k), sizeof(float));
    st->lattice = calloc((size_t)(n_rows * (k + k * k)), sizeof(float));
    st->probs = calloc((size_t)(d->kv.n_seq * hp->block_size), sizeof(float));
    st->pred_rows = malloc((size_t)(k * R) * sizeof(float));
    st->succ_rows = malloc((size_t)(k * R) * sizeof(float));
    st->cond = malloc((size_t)R * sizeof(float));
    float *bases = calloc((size_t)(hp->n_layer * 4 * st->K * st->n_embd), sizeof(float));
    if (!st->attn_proj || !st->ffn_proj || !st->h_sidx || !st->h_logits || !st->h_gate || !st->cand || !st->cand_lg ||
        !st->lattice || !st->probs || !st->pred_rows || !st->succ_rows || !st->cond || !bases) {
        free(bases);
        dflash2_state_free(st);
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the DFlash2 drafter state");
        return NULL;
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const model_dflash2_layer *L = &d2->layers[il];
        st->attn_proj[il] = d2_weight(d, L->attn_conv_proj);
        st->ffn_proj[il] = d2_weight(d, L->ffn_conv_proj);
        /* bases [n_embd, K, 2] (f32/f16/bf16) -> f32 rows ((il*2 + f)*2 + s)*K + t */
        const gguf_tensor *b[2] = {L->attn_conv_base, L->ffn_conv_base};
        for (int f = 0; f < 2; f++) {
            const size_t row_bytes = quant_row_size(b[f]->type, st->n_embd);
            for (int64_t r = 0; r < 2 * st->K; r++) {
                float *dst = bases + ((il * 2 + f) * 2 * st->K + r) * st->n_embd;
                quant_dequantize_row(b[f]->type, (const uint8_t *)b[f]->data + (size_t)r * row_bytes, dst, st->n_embd);
            }
        }
    }
    st->sel_hidden = d2_weight(d, d2->sel_hidden);
    const size_t n_base = (size_t)(hp->n_layer * 4 * st->K * st->n_embd) * sizeof(float);
    st->base_buf = backend_buffer_alloc(d->be, n_base, err);
    st->buf = st->base_buf != NULL ? backend_buffer_alloc(d->be, d2_layout(st, NULL), err) : NULL;
    if (st->buf == NULL) {
        free(bases);
        dflash2_state_free(st);
        return NULL;
    }
    backend_buffer_set(st->base_buf, 0, bases, n_base);
    free(bases);
    st->bases = tensor_in_buffer(st->base_buf, 0, QUANT_TYPE_F32, st->n_embd, hp->n_layer * 4 * st->K);
    d2_layout(st, st->buf);
    return st;
}

void dflash2_begin(dfl_context *d, dflash2_state *st, const batch_ubatch *ub, int64_t n) {
    for (int64_t r = 0; r < n; r++) {
        const int64_t e = d->h_perm[r];
        const int64_t pib = ub->pos[e * ub->n_pos_sections] - d->kv.seq_len[ub->seq_id[e]]; /* block position */
        for (int64_t t = 0; t < st->K; t++) {
            /* work rows of one sequence are consecutive with ascending positions */
            st->h_sidx[r * st->K + t] = pib >= t ? (int32_t)(r - t) : (int32_t)st->n_ub;
        }
    }
    op_write(d->queue, fwd_vec_head(&st->sidx, st->K * n), st->h_sidx, (size_t)(st->K * n) * sizeof(int32_t));
}

/* y [n_embd, n] = the side-s convolution of cv's rows 0..n-1 with the coefficients in dyn and the
 * bases of (layer il, sub-block f: 0 attention, 1 FFN). y must not be cv. */
static void d2_conv(dfl_context *d, dflash2_state *st, int64_t il, int f, int s, tensor y, int64_t n) {
    backend_queue *q = d->queue;
    const int64_t E = st->n_embd, K = st->K, G = st->G, gs = st->gs;
    const size_t fl = sizeof(float);
    /* w = the group coefficients of every tap, each over its group's channels   [gs, G, K, n] */
    const int64_t ne4[4] = {gs, G, K, n};
    const size_t nb4[4] = {fl, (size_t)gs * fl, (size_t)E * fl, (size_t)(E * K) * fl};
    const int64_t nec[4] = {1, G, K, n};
    const size_t nbc[4] = {fl, fl, (size_t)G * fl, st->dyn.nb[1]};
    tensor w4 = tensor_view(&st->w, ne4, nb4, 0);
    tensor coef = tensor_view(&st->dyn, nec, nbc, (size_t)(G * K * s) * fl);  /* [1, G, K, n] */
    op_add(q, w4, tensor_view(&st->zero, ne4, nb4, 0), coef);
    /* w += the static kernel rows of the K taps, broadcast over the rows       [E, K, n] */
    const int64_t ne3[4] = {E, K, n, 1};
    const size_t nb3[4] = {fl, (size_t)E * fl, (size_t)(E * K) * fl, (size_t)(E * K * n) * fl};
    tensor w3 = tensor_view(&st->w, ne3, nb3, 0);
    const int64_t neb[4] = {E, K, 1, 1};
    const size_t nbb[4] = {fl, (size_t)E * fl, (size_t)(E * K) * fl, (size_t)(E * K) * fl};
    tensor base = tensor_view(&st->bases, neb, nbb, (size_t)(((il * 2 + f) * 2 + s) * K) * st->bases.nb[1]);
    op_add(q, w3, w3, base);
    /* v[t, r] = row r - t of the same block (zero before the block start)      [E, K, n] */
    tensor v2 = tensor_rows(&st->sh, 0, K * n);
    op_get_rows(q, v2, st->cv, fwd_vec_head(&st->sidx, K * n));
    op_mul(q, w3, w3, tensor_view(&st->sh, ne3, nb3, 0));
    /* y = term_0 + term_1 + ... in tap order */
    const int64_t ne2[4] = {E, n, 1, 1};
    const size_t nb2[4] = {fl, (size_t)(E * K) * fl, (size_t)(E * K * n) * fl, (size_t)(E * K * n) * fl};
    tensor t0 = tensor_view(&st->w, ne2, nb2, 0);
    if (K == 1) {
        op_scale(q, y, t0, 1.0f);
        return;
    }
    op_add(q, y, t0, tensor_view(&st->w, ne2, nb2, (size_t)E * fl));
    for (int64_t t = 2; t < K; t++) op_add(q, y, y, tensor_view(&st->w, ne2, nb2, (size_t)(t * E) * fl));
}

void dflash2_layer(dfl_context *d, dflash2_state *st, int64_t il, tensor x, int64_t n, int64_t n_groups) {
    const dfl_hparams *hp = &d->model->hp;
    const ctx_layer_w *L = &d->w.layers[il];
    backend_queue *q = d->queue;
    ctx_scratch *s = &d->s;
    tensor c = tensor_rows(&st->cv, 0, n);                                /* [n_embd, n] */
    tensor h = tensor_rows(&s->h, 0, n);                                  /* [n_embd, n] */
    tensor dyn = tensor_rows(&st->dyn, 0, n);                             /* [2KG, n] */
    /* attention: x += conv1(Wo attn(conv0(h))) */
    op_rmsnorm(q, c, x, &L->attn_norm, hp->norm_eps);
    op_matmul(q, dyn, st->attn_proj[il], c);
    d2_conv(d, st, il, 0, 0, h, n);
    fwd_attention_core(d, il, h, c, n, n_groups, NULL, NULL);
    d2_conv(d, st, il, 0, 1, h, n);
    op_add(q, x, x, h);
    /* FFN: x += conv1(down(silu(gate conv0(h)) * up conv0(h))) */
    tensor gate = tensor_rows(&s->gate, 0, n);                            /* [n_ff, n] */
    tensor up = tensor_rows(&s->up, 0, n);                                /* [n_ff, n] */
    op_rmsnorm(q, c, x, &L->ffn_norm, hp->norm_eps);
    op_matmul(q, dyn, st->ffn_proj[il], c);
    d2_conv(d, st, il, 1, 0, h, n);
    op_matmul(q, gate, L->ffn_gate, h);
    op_matmul(q, up, L->ffn_up, h);
    op_swiglu(q, gate, gate, up);
    op_matmul(q, c, L->ffn_down, gate);
    d2_conv(d, st, il, 1, 1, h, n);
    op_add(q, x, x, h);
}

/* Inserts v (id i) into the descending top list vals / ids of cnt <= k entries: a value enters a
 * full list only above its last; equal values keep the lower id first. */
static void d2_insert(float *vals, int32_t *ids, int64_t *cnt, int64_t k, float v, int64_t i) {
    if (*cnt == k && !(v > vals[k - 1])) return;
    int64_t p = *cnt < k ? (*cnt)++ : k - 1;
    while (p > 0 && vals[p - 1] < v) {
        vals[p] = vals[p - 1];
        ids[p] = ids[p - 1];
        p--;
    }
    vals[p] = v;
    ids[p] = (int32_t)i;
}

/* Fewer than k numbers in the row: the lowest unused ids fill the set. */
static void d2_fill(int32_t *ids, int64_t cnt, int64_t k, int64_t n_vocab) {
    for (int32_t i = 0; cnt < k && i < n_vocab; i++) {
        bool used = false;
        for (int64_t j = 0; j < cnt; j++) used = used || ids[j] == i;
        if (!used) ids[cnt++] = i;
    }
}

void dflash2_top_k(const float *row, int64_t n_vocab, int64_t k, int32_t *ids) {
    float vals[64];
    int64_t cnt = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        if (row[i] != row[i]) continue; /* NaN: never a candidate */
        d2_insert(vals, ids, &cnt, k, row[i], i);
    }
    d2_fill(ids, cnt, k, n_vocab);
}

static bool d2_finite(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return (u & 0x7f800000u) != 0x7f800000u;
}

int64_t dflash2_scan_row(const float *row, int64_t n_vocab, int64_t k, int32_t *ids) {
    float vals[64];
    int64_t cnt = 0, i = 0;
    for (; i < n_vocab && cnt < k; i++) { /* the first k values enter as they come */
        if (!d2_finite(row[i])) return i;
        d2_insert(vals, ids, &cnt, k, row[i], i);
    }
    for (; i + 16 <= n_vocab; i += 16) {
        /* the block's largest value and whether it holds a NaN / Inf (fixed trip counts: the
         * compiler vectorizes both) */
        float m = row[i];
        uint32_t bad = 0;
        for (int j = 0; j < 16; j++) {
            const float v = row[i + j];
            m = v > m ? v : m;
            uint32_t u;
            memcpy(&u, &row[i + j], sizeof(u));
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (bad) {
            for (int j = 0; j < 16; j++) {
                if (!d2_finite(row[i + j])) return i + j;
            }
        }
        if (!(m > vals[k - 1])) continue;
        for (int j = 0; j < 16; j++) d2_insert(vals, ids, &cnt, k, row[i + j], i + j);
    }
    for (; i < n_vocab; i++) {
        if (!d2_finite(row[i])) return i;
        d2_insert(vals, ids, &cnt, k, row[i], i);
    }
    d2_fill(ids, cnt, k, n_vocab);
    return -1;
}

/* Codebook row `id` of a [R, n_vocab] selector tensor as R floats. */
static void d2_code_row(const gguf_tensor *t, int64_t R, int32_t id, float *dst) {
    const size_t row_bytes = quant_row_size(t->type, R);
    quant_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)id * row_bytes, dst, R);
}


/* The lattice row of output row r: candidates (st->cand of row r, from dflash2_scan_row), then
 * score[j][s] for the n_pred predecessors. */
static void d2_lattice_row(dflash2_state *st, int64_t r, const int32_t *pred, int64_t n_pred) {
    const int64_t k = st->k, R = st->R;
    const float *lg = st->cand_lg + r * k;
    const float *g = st->h_gate + r * R;
    const int32_t *cand = st->cand + r * k;
    float *row = st->lattice + r * (k + k * k);
    for (int64_t s = 0; s < k; s++) {
        row[s] = (float)cand[s];
        d2_code_row(st->sel_succ, R, cand[s], st->succ_rows + s * R);
    }
    for (int64_t j = 0; j < n_pred; j++) {
        d2_code_row(st->sel_pred, R, pred[j], st->pred_rows);
        for (int64_t i = 0; i < R; i++) st->cond[i] = st->pred_rows[i] * g[i];   /* f32, as llama.cpp */
        /* score s = sum over i ascending of succ_s[i] * cond[i] in f64: the k sums advance
         * together (k independent chains instead of one after the other; each in the same order) */
        double acc[64];
        for (int64_t s = 0; s < k; s++) acc[s] = 0.0;
        for (int64_t i = 0; i < R; i++) {
            const double c = (double)st->cond[i];
            for (int64_t s = 0; s < k; s++) acc[s] += (double)st->succ_rows[s * R + i] * c;
        }
        for (int64_t s = 0; s < k; s++) row[k + j * k + s] = (float)acc[s] + lg[s];
    }
    for (int64_t j = n_pred; j < k; j++) memcpy(row + k + j * k, row + k, (size_t)k * sizeof(float));
}

int64_t dflash2_top_k_count(const dflash2_state *st) { return st->k; }

dfl_status dflash2_select(dfl_context *d, dflash2_state *st, tensor x_out, tensor logits, int64_t n_out, int32_t n_active,
                          const int32_t *last, int32_t n_draft, const int32_t *lens, const int32_t *hot_ids,
                          int64_t n_hot, int32_t *out, float *logits_out, dfl_error *err) {
    backend_queue *q = d->queue;
    const int64_t k = st->k, V = st->n_vocab;
    const int64_t W = n_hot > 0 ? n_hot : V; /* logits per row: the reduced vocabulary's ids, or all */
    if (n_out > st->n_rows_out) {
        return error_set(err, DFL_ERR_INVALID, "DFlash2 select: %lld output rows exceed the %lld allocated",
                         (long long)n_out, (long long)st->n_rows_out);
    }
    tensor gate = tensor_rows(&st->gate, 0, n_out);                      /* [R, n_out] */
    op_matmul(q, gate, st->sel_hidden, x_out);
    op_read(q, st->h_logits, logits, (size_t)(n_out * W) * sizeof(float));
    op_read(q, st->h_gate, gate, (size_t)(n_out * st->R) * sizeof(float));
    backend_queue_synchronize(q);
    /* the final logit softcap (dflash.final_logit_softcapping), before the selector as in
     * llama.cpp: it changes the lattice scores, not only the probabilities */
    const float cap = d->model->dflash.final_logit_softcapping;
    if (cap > 0.0f) {
        for (size_t e = 0; e < (size_t)(n_out * W); e++) st->h_logits[e] = cap * tanhf(st->h_logits[e] / cap);
    }
    int64_t off = 0;
    for (int32_t i = 0; i < n_active; i++) {
        const int64_t L = lens != NULL ? lens[i] : n_draft;
        /* a position whose logits hold a NaN/Inf ends the walk; it and the rest are flagged as
         * -1 - (first such token), like the argmax of a DFlash drafter (the session reports it) */
        int64_t L_ok = L;
        int32_t flag = 0;
        for (int64_t p = 1; p <= L; p++) { /* and each row's candidates, their logits, their ids */
            const int64_t r = off + p - 1;
            const float *lg = st->h_logits + r * W;
            int32_t *cand = st->cand + r * k;
            const int64_t bad = dflash2_scan_row(lg, W, k, cand);
            if (bad >= 0) {
                L_ok = p - 1;
                flag = -1 - (n_hot > 0 ? hot_ids[bad] : (int32_t)bad);
                break;
            }
            for (int64_t s = 0; s < k; s++) {
                st->cand_lg[r * k + s] = lg[cand[s]];
                if (n_hot > 0) cand[s] = hot_ids[cand[s]]; /* ascending ids: the ties keep their order */
            }
        }
        /* position 1 follows the anchor; position p >= 2 the candidates of position p - 1 */
        for (int64_t p = 1; p <= L_ok; p++) {
            const int64_t r = off + p - 1;
            if (p == 1) d2_lattice_row(st, r, &last[i], 1);
            else d2_lattice_row(st, r, st->cand + (r - 1) * k, k);
        }
        for (int64_t p = L_ok + 1; p <= L; p++) {
            out[(size_t)i * (size_t)n_draft + (size_t)(p - 1)] = flag;
            st->probs[(size_t)i * (size_t)n_draft + (size_t)(p - 1)] = 0.0f;
        }
        /* the walk: the best successor of the previous pick (std::max_element: first maximum) */
        int64_t j = 0;
        for (int64_t p = 1; p <= L_ok; p++) {
            const int64_t r = off + p - 1;
            const float *sc = st->lattice + r * (k + k * k) + k + j * k;
            int64_t best = 0;
            for (int64_t s = 1; s < k; s++) {
                if (sc[best] < sc[s]) best = s;
            }
            float sum = 0.0f;
            for (int64_t s = 0; s < k; s++) sum += expf(sc[s] - sc[best]);
            out[(size_t)i * (size_t)n_draft + (size_t)(p - 1)] = st->cand[r * k + best];
            st->probs[(size_t)i * (size_t)n_draft + (size_t)(p - 1)] = 1.0f / sum;
            j = best;
        }
        for (int64_t p = 0; logits_out != NULL && p < L; p++) {
            float *dst = logits_out + ((size_t)i * (size_t)n_draft + (size_t)p) * (size_t)V;
            const float *src = st->h_logits + (off + p) * W;
            if (n_hot == 0) {
                memcpy(dst, src, (size_t)V * sizeof(float));
            } else {
                drafter_vocab_spread(dst, src, hot_ids, n_hot, V);
            }
        }
        off += L;
    }
    st->drafted = true;
    return DFL_OK;
}

const float *dflash2_last_lattice(const dfl_context *d, int64_t *row_len) {
    const dflash2_state *st = drafter_dflash2(d);
    if (st == NULL || !st->drafted) return NULL;
    if (row_len != NULL) *row_len = st->k + st->k * st->k;
    return st->lattice;
}

const float *dflash2_last_probs(const dfl_context *d) {
    const dflash2_state *st = drafter_dflash2(d);
    return st != NULL && st->drafted ? st->probs : NULL;
}
