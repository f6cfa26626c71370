/* weights_pack.c: the packed copy of a model's matmul weights on a host-visible backend
 * (weights_pack.h). The weights a forward pass multiplies with (output head; per layer q, k, v,
 * o, gate, up, down) are enumerated in one fixed order ("slots"); every slot the backend wants
 * packed gets a 64-byte aligned piece of one buffer, filled once from the mapping. A context's
 * views are then pointed at the pieces; the plain views stay for everything else (the token
 * embedding of a tied head is read by get_rows, which reads the mapping). Reference counted by
 * contexts like the device copies; contexts of one model are created and freed on one thread at a
 * time. */
#include "model/weights_pack.h"
#include "base/error.h"
#include "base/fmap.h"

#include <stdlib.h>
#include <string.h>

#define PACK_SLOTS_PER_LAYER 7

static int64_t pack_n_slots(const dfl_model *m) { return 1 + PACK_SLOTS_PER_LAYER * m->hp.n_layer; }

/* The slot's tensor of w (slot 0: the head; then 7 per layer). */
static tensor *pack_slot(ctx_weights *w, int64_t s) {
    if (s == 0) return &w->output;
    ctx_layer_w *L = &w->layers[(s - 1) / PACK_SLOTS_PER_LAYER];
    switch ((s - 1) % PACK_SLOTS_PER_LAYER) {
    case 0: return &L->wq;
    case 1: return &L->wk;
    case 2: return &L->wv;
    case 3: return &L->wo;
    case 4: return &L->ffn_gate;
    case 5: return &L->ffn_up;
    default: return &L->ffn_down;
    }
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The bytes of t's packed copy on be, 0 when it stays as bound (f16: see weights_pack_acquire). */
static size_t pack_size(backend *be, const tensor *t, bool f16) {
    if (t->data == NULL || (!f16 && (t->type == QUANT_TYPE_F16 || t->type == QUANT_TYPE_BF16))) return 0;
    return backend_weight_pack_size(be, t);
}

/* Packs the slots of w on be into a new copy c (c->buf NULL when nothing is packable); false when
 * its memory cannot be allocated (c is then cleared). */
static bool pack_create(const dfl_model *m, backend *be, ctx_weights *w, bool f16, model_pack_copy *c) {
    const int64_t n = pack_n_slots(m);
    size_t total = 0;
    for (int64_t s = 0; s < n; s++) total += align64(pack_size(be, pack_slot(w, s), f16));
    memset(c, 0, sizeof(*c));
    c->be = be;
    if (total == 0) return true;
    dfl_error e2;
    error_clear(&e2);
    c->packed = calloc((size_t)n, sizeof(tensor));
    c->buf = c->packed != NULL ? backend_buffer_alloc(be, total, &e2) : NULL;
    if (c->buf == NULL) {
        free(c->packed);
        memset(c, 0, sizeof(*c));
        return false;
    }
    char *base = backend_buffer_base(c->buf);
    size_t off = 0;
    for (int64_t s = 0; s < n; s++) {
        const tensor *t = pack_slot(w, s);
        const size_t sz = pack_size(be, t, f16);
        if (sz == 0) continue;
        c->packed[s] = backend_weight_pack(be, t, base + off);
        c->packed[s].buf = c->buf;
        off += align64(sz);
    }
    c->n_slots = n;
    /* the mapping's copies of the packed weights are not read again (a tied head's rows are: the
     * token embedding); drop their pages so that the model is not resident twice */
    for (int64_t s = 0; s < n; s++) {
        const tensor *t = pack_slot(w, s);
        if (c->packed[s].layout == TENSOR_LAYOUT_PLAIN || t->data == w->token_embd.data) continue;
        fmap_release(t->data, t->nb[1] * (size_t)t->ne[1]);
    }
    return true;
}

bool weights_pack_acquire(dfl_model *m, backend *be, ctx_weights *w, bool f16) {
    model_pack_copy *c = NULL, *free_slot = NULL;
    for (int i = 0; i < MODEL_MAX_DEVICE_COPIES; i++) {
        if (m->pack[i].be == be) c = &m->pack[i];
        if (m->pack[i].be == NULL && free_slot == NULL) free_slot = &m->pack[i];
    }
    if (c == NULL) {
        /* packing only speeds things up: with every slot taken, or no memory for the copy, the
         * context reads the weights as stored */
        if (free_slot == NULL || !pack_create(m, be, w, f16, free_slot)) return false;
        c = free_slot;
    }
    c->refs++;
    for (int64_t s = 0; s < c->n_slots; s++) {
        if (c->packed[s].layout != TENSOR_LAYOUT_PLAIN) *pack_slot(w, s) = c->packed[s];
    }
    return true;
}

void weights_pack_release(dfl_model *m, backend *be) {
    for (int i = 0; i < MODEL_MAX_DEVICE_COPIES; i++) {
        model_pack_copy *c = &m->pack[i];
        if (c->be != be) continue;
        if (--c->refs <= 0) {
            if (c->buf != NULL) backend_buffer_free(c->buf);
            free(c->packed);
            memset(c, 0, sizeof(*c));
        }
        return;
    }
}
