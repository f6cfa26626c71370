/* weights_device.c: the device copy of a model's weights. The GGUF data section (every tensor,
 * at its file offset) is copied byte for byte into one buffer of the backend the first time a
 * context of the model is created on it; each weight view is then rebased from the mapping into
 * that buffer (same offsets, so alignment and row strides are unchanged). The copy is reference
 * counted by contexts and freed with the last one, before its backend. Host-visible backends (the
 * CPU) never come here: they read the mapping zero-copy. Contexts of one model are created and
 * freed on one thread at a time (the counts are plain integers). */
#include "model/weights_device.h"
#include "base/error.h"

#include <string.h>

/* Rebases t if it points into the mapping's data section [lo, lo + n). */
static void rebase(tensor *t, const uint8_t *lo, size_t n, backend_buffer *buf) {
    const uint8_t *p = (const uint8_t *)t->data;
    if (p == NULL || p < lo || (size_t)(p - lo) >= n) return;
    t->data = (uint8_t *)backend_buffer_base(buf) + (p - lo);
    t->buf = buf;
}

static void rebase_all(ctx_weights *w, const dfl_model *m, const uint8_t *lo, size_t n, backend_buffer *buf) {
    rebase(&w->token_embd, lo, n, buf);
    rebase(&w->output_norm, lo, n, buf);
    rebase(&w->output, lo, n, buf);
    rebase(&w->fc, lo, n, buf);
    rebase(&w->enc_norm, lo, n, buf);
    rebase(&w->markov_w1, lo, n, buf);
    rebase(&w->markov_w2, lo, n, buf);
    for (int64_t il = 0; il < m->hp.n_layer; il++) {
        ctx_layer_w *L = &w->layers[il];
        tensor *ts[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->q_norm,
                        &L->k_norm, &L->ffn_norm, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) rebase(ts[i], lo, n, buf);
    }
}

dfl_status weights_device_acquire(dfl_model *m, backend *be, ctx_weights *w, dfl_error *err) {
    const uint64_t off = gguf_data_offset(m->gguf), size = gguf_file_size(m->gguf);
    const uint8_t *lo = gguf_file_data(m->gguf) + off;
    const size_t n = size > off ? (size_t)(size - off) : 0;
    if (n == 0) return DFL_OK; /* no tensor data */
    model_device_copy *c = NULL, *free_slot = NULL;
    for (int i = 0; i < MODEL_MAX_DEVICE_COPIES; i++) {
        if (m->dev[i].be == be) c = &m->dev[i];
        if (m->dev[i].be == NULL && free_slot == NULL) free_slot = &m->dev[i];
    }
    if (c == NULL) {
        if (free_slot == NULL) {
            return error_set(err, DFL_ERR_UNSUPPORTED, "%s: the weights are already on %d backends (the limit)", m->path,
                             MODEL_MAX_DEVICE_COPIES);
        }
        dfl_error e2;
        error_clear(&e2);
        backend_buffer *buf = backend_buffer_alloc(be, n, &e2);
        if (buf == NULL) {
            return error_set(err, e2.code, "%s: cannot upload %.2f GB of weights to the %s backend: %s", m->path,
                             (double)n / 1e9, backend_get_caps(be).name, e2.msg);
        }
        backend_buffer_set(buf, 0, lo, n);
        c = free_slot;
        c->be = be;
        c->buf = buf;
        c->refs = 0;
    }
    c->refs++;
    rebase_all(w, m, lo, n, c->buf);
    return DFL_OK;
}

void weights_device_release(dfl_model *m, backend *be) {
    for (int i = 0; i < MODEL_MAX_DEVICE_COPIES; i++) {
        model_device_copy *c = &m->dev[i];
        if (c->be != be) continue;
        if (--c->refs <= 0) {
            backend_buffer_free(c->buf);
            memset(c, 0, sizeof(*c));
        }
        return;
    }
}
