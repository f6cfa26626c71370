/* kv_cache.c: KV cache allocation (one backend buffer for all layers) and sequence bookkeeping. */
#include "kv/kv_cache.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

static size_t kv_row_bytes(int64_t n_embd, uint32_t type) {
    return quant_row_size(type, n_embd);
}

size_t kv_cache_bytes(int64_t n_layer, int64_t n_ctx, int64_t n_seq, int64_t n_embd_k, int64_t n_embd_v,
                      uint32_t type) {
    size_t cells = (size_t)n_ctx * (size_t)n_seq;
    return (size_t)n_layer * cells * (kv_row_bytes(n_embd_k, type) + kv_row_bytes(n_embd_v, type));
}

dfl_status kv_cache_init(kv_cache *kv, backend *be, int64_t n_layer, int64_t n_ctx, int64_t n_seq, int64_t n_embd_k,
                         int64_t n_embd_v, uint32_t type, dfl_error *err) {
    memset(kv, 0, sizeof(*kv));
    if (type != QUANT_TYPE_F16 && type != QUANT_TYPE_F32) {
        return error_set(err, DFL_ERR_INVALID, "KV cache type must be f16 or f32");
    }
    if (n_layer <= 0 || n_ctx <= 0 || n_seq <= 0 || n_embd_k <= 0 || n_embd_v <= 0) {
        return error_set(err, DFL_ERR_INVALID, "KV cache: invalid size (n_ctx %lld, n_seq %lld)", (long long)n_ctx,
                         (long long)n_seq);
    }
    if (n_ctx > ((int64_t)1 << 31) / n_seq) {
        return error_set(err, DFL_ERR_INVALID, "KV cache: n_ctx %lld x n_seq %lld cells is too many", (long long)n_ctx,
                         (long long)n_seq);
    }
    kv->n_layer = n_layer;
    kv->n_ctx = n_ctx;
    kv->n_seq = n_seq;
    kv->n_embd_k = n_embd_k;
    kv->n_embd_v = n_embd_v;
    kv->type = type;
    const size_t total = kv_cache_bytes(n_layer, n_ctx, n_seq, n_embd_k, n_embd_v, type);
    kv->k = calloc((size_t)n_layer, sizeof(tensor));
    kv->v = calloc((size_t)n_layer, sizeof(tensor));
    kv->seq_len = calloc((size_t)n_seq, sizeof(int64_t));
    if (kv->k == NULL || kv->v == NULL || kv->seq_len == NULL) {
        kv_cache_free(kv);
        return error_set(err, DFL_ERR_NOMEM, "KV cache: out of memory");
    }
    kv->buf = backend_buffer_alloc(be, total, err);
    if (kv->buf == NULL) {
        kv_cache_free(kv);
        return err != NULL ? err->code : DFL_ERR_NOMEM;
    }
    const int64_t cells = n_ctx * n_seq;
    size_t off = 0;
    for (int64_t il = 0; il < n_layer; il++) {
        kv->k[il] = tensor_in_buffer(kv->buf, off, type, n_embd_k, cells);
        off += (size_t)cells * kv_row_bytes(n_embd_k, type);
        kv->v[il] = tensor_in_buffer(kv->buf, off, type, n_embd_v, cells);
        off += (size_t)cells * kv_row_bytes(n_embd_v, type);
    }
    return DFL_OK;
}

void kv_cache_free(kv_cache *kv) {
    if (kv->buf != NULL) backend_buffer_free(kv->buf);
    free(kv->k);
    free(kv->v);
    free(kv->seq_len);
    memset(kv, 0, sizeof(*kv));
}

void kv_seq_remove(kv_cache *kv, int64_t seq, int64_t p0) {
    DFL_ASSERT(seq >= 0 && seq < kv->n_seq);
    if (p0 < 0) p0 = 0;
    if (p0 < kv->seq_len[seq]) kv->seq_len[seq] = p0;
}

tensor kv_k_view(const kv_cache *kv, int64_t il, int64_t seq, int64_t n) {
    return tensor_rows(&kv->k[il], seq * kv->n_ctx, n);
}

tensor kv_v_view(const kv_cache *kv, int64_t il, int64_t seq, int64_t n) {
    return tensor_rows(&kv->v[il], seq * kv->n_ctx, n);
}

void kv_seq_copy(kv_cache *kv, backend_queue *q, int64_t src, int64_t dst) {
    DFL_ASSERT(src >= 0 && src < kv->n_seq && dst >= 0 && dst < kv->n_seq);
    if (src == dst) return;
    const int64_t n = kv->seq_len[src];
    if (n > 0) {
        for (int64_t il = 0; il < kv->n_layer; il++) {
            op_copy(q, kv_k_view(kv, il, dst, n), kv_k_view(kv, il, src, n));
            op_copy(q, kv_v_view(kv, il, dst, n), kv_v_view(kv, il, src, n));
        }
    }
    kv->seq_len[dst] = n;
}
