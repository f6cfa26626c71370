/* kv_cache.h: the KV cache of a context: per layer K and V tensors in one backend buffer, and the
 * per-sequence bookkeeping. Sequence s owns the cells [s*n_ctx, (s+1)*n_ctx); its position p
 * lives at cell s*n_ctx + p, so a sequence is always the contiguous prefix [0, seq_len[s]) of its
 * region: rolling back ("remove positions >= p") is setting seq_len[s] = p, and attention for a
 * sequence reads one contiguous range of cells. All memory is allocated at init. */
#ifndef DFL_KV_CACHE_H
#define DFL_KV_CACHE_H

#include "backend/backend.h"
#include "dflash.h"

typedef struct kv_cache {
    int64_t n_layer;
    int64_t n_ctx;       /* cells per sequence */
    int64_t n_seq;
    int64_t n_embd_k;    /* n_head_kv * head_dim_k: floats of one K cell */
    int64_t n_embd_v;    /* n_head_kv * head_dim_v */
    uint32_t type;       /* QUANT_TYPE_F16 (default) or QUANT_TYPE_F32 */
    backend_buffer *buf; /* all K and V */
    tensor *k;           /* [n_layer] each [n_embd_k, n_ctx*n_seq] */
    tensor *v;           /* [n_layer] each [n_embd_v, n_ctx*n_seq] */
    int64_t *seq_len;    /* [n_seq] positions stored per sequence (the next position) */
} kv_cache;

dfl_status kv_cache_init(kv_cache *kv, backend *be, int64_t n_layer, int64_t n_ctx, int64_t n_seq, int64_t n_embd_k,
                         int64_t n_embd_v, uint32_t type, dfl_error *err);
void kv_cache_free(kv_cache *kv);
size_t kv_cache_bytes(int64_t n_layer, int64_t n_ctx, int64_t n_seq, int64_t n_embd_k, int64_t n_embd_v,
                      uint32_t type);

/* Cell index of (seq, pos). */
static inline int64_t kv_cell(const kv_cache *kv, int64_t seq, int64_t pos) { return seq * kv->n_ctx + pos; }

/* Keeps positions < p0 of seq (p0 <= 0 empties it). */
void kv_seq_remove(kv_cache *kv, int64_t seq, int64_t p0);
/* Copies the cells of src into dst's region (enqueued on q) and sets dst's length. */
void kv_seq_copy(kv_cache *kv, backend_queue *q, int64_t src, int64_t dst);
/* Views of layer il's K / V for seq, cells [0, n): [n_embd, n] rows of the region. */
tensor kv_k_view(const kv_cache *kv, int64_t il, int64_t seq, int64_t n);
tensor kv_v_view(const kv_cache *kv, int64_t il, int64_t seq, int64_t n);

#endif
