/* drafter_dspark.c: the DSpark heads (docs/drafter.md, "DSpark") on top of the DFlash block
 * forward, composed of existing backend ops so they run on the drafter's backend:
 *
 *   sequences sorted by draft length (longest first), so the sequences still drafting at block
 *   row j are a prefix of that order; per row j, for those n_j sequences:
 *     e_j   = get_rows(markov_w1, prev_j)          [R, n_j]    prev_0 = the anchors (last)
 *     b_j   = markov_w2 e_j  (* markov_w2.scale)   [n_vocab, n_j]
 *     z_j   = get_rows(logits, rows_j) + b_j       [n_vocab, n_j]
 *     prev_{j+1} = argmax z_j                      [n_j] i32 (stays on the device)
 *     logits[rows_j] = z_j                         (set_rows: the biased rows replace the raw ones)
 *   the argmax ids of every row come back in one read; the confidence head (a dot product of
 *   n_embd + R per row) runs on the host afterwards from the read-back head inputs and the
 *   markov_w1 rows of the drafted tokens (in the file mapping).
 *   With a reduced draft vocabulary H (dspark_set_vocab) the rows are H's: b_j and z_j are
 *   [|H|, n_j] (markov_w2's rows of H), prev_{j+1} is an index into H and e_{j+1} its row of
 *   markov_w1's rows of H; e_0 still comes from the whole markov_w1 (an anchor may be outside H). */
#include "speculative/drafter_dspark.h"
#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dspark_state {
    backend_buffer *buf;
    tensor z;        /* [n_vocab, n_seq] rows of one block position */
    tensor bias;     /* [n_vocab, n_seq] */
    tensor e;        /* [R, n_seq] markov_w1 rows of the previous tokens */
    tensor prev;     /* [n_seq] i32 the anchors (sorted order) */
    tensor rows;     /* [n_seq * n_pos] i32 per row j: the logits rows of the sequences drafting j */
    tensor amax;     /* [n_seq * n_pos] i32 per row j: argmax of those rows */
    int64_t n_seq, n_pos;
    int32_t *order;  /* [n_seq] sequences by draft length, longest first */
    int32_t *rank;   /* [n_seq] position of sequence i in order */
    int32_t *h_prev; /* [n_seq] */
    int32_t *h_rows; /* [n_seq * n_pos] */
    int32_t *h_amax; /* [n_seq * n_pos] */
    float *h_x;      /* [n_embd, n_seq * n_pos] head inputs (confidence head only) */
    float *conf_w;   /* [n_embd + R] dequantized conf_proj (confidence head only) */
    float *e_row;    /* [R] one dequantized markov_w1 row */
    /* a reduced draft vocabulary (dspark_set_vocab; n_hot 0: none) */
    const int32_t *hot_ids; /* [n_hot] ascending token ids (the drafter state's) */
    int64_t n_hot;
    backend_buffer *w1_buf, *w2_buf;
    tensor w1_hot;   /* [R, n_hot] markov_w1 rows of hot_ids */
    tensor w2_hot;   /* [R, n_hot] markov_w2 rows of hot_ids */
};

void dspark_state_free(dspark_state *st) {
    if (st == NULL) return;
    if (st->buf) backend_buffer_free(st->buf);
    if (st->w1_buf) backend_buffer_free(st->w1_buf);
    if (st->w2_buf) backend_buffer_free(st->w2_buf);
    free(st->order);
    free(st->rank);
    free(st->h_prev);
    free(st->h_rows);
    free(st->h_amax);
    free(st->h_x);
    free(st->conf_w);
    free(st->e_row);
    free(st);
}

/* The chain indexes markov_w1 with the argmax of biased rows: the Markov weights must be finite
 * and small enough that a bias cannot overflow (|bias| <= R max|w1| max|w2| |scale| < 1e30). */
static dfl_status dspark_check_weights(const dfl_model *m, dfl_error *err) {
    const model_dspark *ds = &m->dspark;
    const int64_t R = ds->rank;
    float *row = malloc((size_t)R * sizeof(float));
    if (row == NULL) return error_set(err, DFL_ERR_NOMEM, "out of memory checking the DSpark weights");
    const gguf_tensor *ws[2] = {ds->markov_w1, ds->markov_w2};
    double amax[2] = {0.0, 0.0};
    for (int w = 0; w < 2; w++) {
        const size_t rb = quant_row_size(ws[w]->type, R);
        for (int64_t v = 0; v < ws[w]->ne[1]; v++) {
            quant_dequantize_row(ws[w]->type, (const uint8_t *)ws[w]->data + (size_t)v * rb, row, R);
            for (int64_t c = 0; c < R; c++) {
                if (!isfinite(row[c])) {
                    free(row);
                    return error_set(err, DFL_ERR_FORMAT, "%s: %s row %lld holds a NaN or Inf", m->path,
                                     w == 0 ? "markov_w1.weight" : "markov_w2.weight", (long long)v);
                }
                const double a = fabs((double)row[c]);
                amax[w] = a > amax[w] ? a : amax[w];
            }
        }
    }
    free(row);
    const double bound = (double)R * amax[0] * amax[1] * fabs((double)ds->markov_scale);
    if (!isfinite(ds->markov_scale) || !(bound < 1e30)) {
        return error_set(err, DFL_ERR_FORMAT, "%s: the DSpark Markov weights are too large (a bias could reach %.3g)",
                         m->path, bound);
    }
    return DFL_OK;
}

dspark_state *dspark_state_new(dfl_context *d, dfl_error *err) {
    const dfl_model *m = d->model;
    if (dspark_check_weights(m, err) != DFL_OK) return NULL;
    const model_dspark *ds = &m->dspark;
    const int64_t n_seq = d->kv.n_seq, n_pos = m->hp.n_draft_max, R = ds->rank, V = d->n_vocab;
    const int64_t E = m->hp.n_embd;
    dspark_state *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the DSpark state");
        return NULL;
    }
    st->n_seq = n_seq;
    st->n_pos = n_pos;
    size_t off = 0;
    const size_t sz_z = ((size_t)V * (size_t)n_seq * sizeof(float) + 63) & ~(size_t)63;
    const size_t sz_e = ((size_t)R * (size_t)n_seq * sizeof(float) + 63) & ~(size_t)63;
    const size_t sz_p = ((size_t)n_seq * sizeof(int32_t) + 63) & ~(size_t)63;
    const size_t sz_r = ((size_t)(n_seq * n_pos) * sizeof(int32_t) + 63) & ~(size_t)63;
    st->buf = backend_buffer_alloc(d->be, 2 * sz_z + sz_e + sz_p + 2 * sz_r, err);
    if (st->buf == NULL) {
        dspark_state_free(st);
        return NULL;
    }
    st->z = tensor_in_buffer(st->buf, off, QUANT_TYPE_F32, V, n_seq), off += sz_z;
    st->bias = tensor_in_buffer(st->buf, off, QUANT_TYPE_F32, V, n_seq), off += sz_z;
    st->e = tensor_in_buffer(st->buf, off, QUANT_TYPE_F32, R, n_seq), off += sz_e;
    st->prev = tensor_in_buffer(st->buf, off, QUANT_TYPE_I32, n_seq, 1), off += sz_p;
    st->rows = tensor_in_buffer(st->buf, off, QUANT_TYPE_I32, n_seq * n_pos, 1), off += sz_r;
    st->amax = tensor_in_buffer(st->buf, off, QUANT_TYPE_I32, n_seq * n_pos, 1);
    st->order = calloc((size_t)n_seq, sizeof(int32_t));
    st->rank = calloc((size_t)n_seq, sizeof(int32_t));
    st->h_prev = calloc((size_t)n_seq, sizeof(int32_t));
    st->h_rows = calloc((size_t)(n_seq * n_pos), sizeof(int32_t));
    st->h_amax = calloc((size_t)(n_seq * n_pos), sizeof(int32_t));
    st->e_row = calloc((size_t)R, sizeof(float));
    bool ok = st->order && st->rank && st->h_prev && st->h_rows && st->h_amax && st->e_row;
    if (ok && ds->conf_proj != NULL) {
        st->h_x = calloc((size_t)E * (size_t)(n_seq * n_pos), sizeof(float));
        st->conf_w = calloc((size_t)(E + R), sizeof(float));
        ok = st->h_x && st->conf_w &&
             quant_dequantize_row(ds->conf_proj->type, ds->conf_proj->data, st->conf_w, E + R);
    }
    if (!ok) {
        dspark_state_free(st);
        error_set(err, DFL_ERR_NOMEM, "out of memory creating the DSpark state");
        return NULL;
    }
    return st;
}

dfl_status dspark_set_vocab(dfl_context *d, dspark_state *st, const int32_t *hot_ids, int64_t n_hot, dfl_error *err) {
    const model_dspark *ds = &d->model->dspark;
    dfl_status s = drafter_gather_rows(d, ds->markov_w1, hot_ids, n_hot, false, "DSpark markov_w1 rows", &st->w1_buf,
                                       &st->w1_hot, err);
    if (s == DFL_OK) {
        s = drafter_gather_rows(d, ds->markov_w2, hot_ids, n_hot, false, "DSpark markov_w2 rows", &st->w2_buf, &st->w2_hot,
                                err);
    }
    if (s != DFL_OK) return s;
    st->hot_ids = hot_ids;
    st->n_hot = n_hot;
    return DFL_OK;
}

/* A [ne0, ne1] f32 view at the start of t (the reduced vocabulary's rows in a whole one's room). */
static tensor f32_front(const tensor *t, int64_t ne0, int64_t ne1) {
    tensor v = tensor_2d(QUANT_TYPE_F32, t->data, ne0, ne1);
    v.buf = t->buf;
    return v;
}

/* A view of n int32 entries of t starting at entry i0. */
static tensor i32_span(const tensor *t, int64_t i0, int64_t n) {
    tensor v = *t;
    v.data = (int32_t *)t->data + i0;
    v.ne[0] = n;
    return v;
}

void dspark_chain_enqueue(dfl_context *d, dspark_state *st, tensor logits, tensor x_out, int32_t n, const int32_t *last,
                          const int32_t *lens) {
    const model_dspark *ds = &d->model->dspark;
    backend_queue *q = d->queue;
    /* longest draft first (stable), so the sequences drafting row j are a prefix */
    int32_t n_max = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t r = i;
        while (r > 0 && lens[st->order[r - 1]] < lens[i]) {
            st->order[r] = st->order[r - 1];
            r--;
        }
        st->order[r] = i;
        n_max = lens[i] > n_max ? lens[i] : n_max;
    }
    int64_t off_of[256];
    int64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        off_of[i] = off;
        off += lens[i];
    }
    for (int32_t r = 0; r < n; r++) {
        st->rank[st->order[r]] = r;
        st->h_prev[r] = last[st->order[r]];
    }
    /* rows_j: entries [j*n_seq, j*n_seq + n_j) */
    for (int32_t j = 0; j < n_max; j++) {
        for (int32_t r = 0; r < n && lens[st->order[r]] > j; r++) {
            st->h_rows[(int64_t)j * st->n_seq + r] = (int32_t)(off_of[st->order[r]] + j);
        }
    }
    op_write(q, i32_span(&st->prev, 0, n), st->h_prev, (size_t)n * sizeof(int32_t));
    op_write(q, i32_span(&st->rows, 0, (int64_t)n_max * st->n_seq), st->h_rows,
             (size_t)n_max * (size_t)st->n_seq * sizeof(int32_t));
    for (int32_t j = 0; j < n_max; j++) {
        int32_t n_j = 0;
        while (n_j < n && lens[st->order[n_j]] > j) n_j++;
        tensor prev = j == 0 ? i32_span(&st->prev, 0, n_j) : i32_span(&st->amax, (int64_t)(j - 1) * st->n_seq, n_j);
        tensor rows = i32_span(&st->rows, (int64_t)j * st->n_seq, n_j);
        const int64_t W = st->n_hot > 0 ? st->n_hot : st->z.ne[0]; /* rows' width: H's ids, or V */
        tensor e = tensor_rows(&st->e, 0, n_j);            /* [R, n_j] */
        tensor bias = f32_front(&st->bias, W, n_j);        /* [W, n_j] */
        tensor z = f32_front(&st->z, W, n_j);              /* [W, n_j] */
        /* prev: the anchors' token ids (row 0), else the previous row's argmax (an index into H) */
        op_get_rows(q, e, j > 0 && st->n_hot > 0 ? st->w1_hot : d->w.markov_w1, prev);
        op_matmul(q, bias, st->n_hot > 0 ? st->w2_hot : d->w.markov_w2, e);
        if (ds->markov_scale != 1.0f) op_scale(q, bias, bias, ds->markov_scale);
        op_get_rows(q, z, logits, rows);
        op_add(q, z, z, bias);
        op_argmax(q, i32_span(&st->amax, (int64_t)j * st->n_seq, n_j), z);
        op_set_rows(q, logits, z, rows);
    }
    op_read(q, st->h_amax, i32_span(&st->amax, 0, (int64_t)n_max * st->n_seq),
            (size_t)n_max * (size_t)st->n_seq * sizeof(int32_t));
    if (st->h_x != NULL) op_read(q, st->h_x, x_out, (size_t)off * (size_t)x_out.ne[0] * sizeof(float));
}

void dspark_finish(const dfl_context *d, const dspark_state *st, int32_t n, const int32_t *last, const int32_t *lens,
                   int32_t *out, float *conf) {
    const model_dspark *ds = &d->model->dspark;
    const int64_t E = d->model->hp.n_embd, R = ds->rank;
    const size_t w1_row = quant_row_size(ds->markov_w1->type, R);
    int64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t r = st->rank[i];
        for (int32_t j = 0; j < lens[i]; j++) {
            const int32_t a = st->h_amax[(int64_t)j * st->n_seq + r];
            out[off + j] = st->n_hot > 0 ? st->hot_ids[a] : a;
        }
        if (conf != NULL && st->h_x != NULL) {
            for (int32_t j = 0; j < lens[i]; j++) {
                const int32_t prev = j == 0 ? last[i] : out[off + j - 1];
                quant_dequantize_row(ds->markov_w1->type, (const uint8_t *)ds->markov_w1->data + (size_t)prev * w1_row, st->e_row, R);
                const float *h = st->h_x + (size_t)(off + j) * (size_t)E;
                double acc = ds->conf_bias;
                for (int64_t c = 0; c < E; c++) acc += (double)st->conf_w[c] * (double)h[c];
                for (int64_t c = 0; c < R; c++) acc += (double)st->conf_w[E + c] * (double)st->e_row[c];
                conf[off + j] = (float)(1.0 / (1.0 + exp(-acc)));
            }
        }
        off += lens[i];
    }
}
