/* gguf_internal.h: the gguf_file struct and the name index, shared by the reader
 * (gguf_reader.c) and the getters (gguf_get.c). Internal to src/gguf/. */
#ifndef DFL_GGUF_INTERNAL_H
#define DFL_GGUF_INTERNAL_H

#include "base/fmap.h"
#include "gguf/gguf.h"

/* Open-addressing hash index from a name to an item index. */
typedef struct gguf_index {
    int64_t *slots; /* [cap] item index + 1, 0 = empty */
    uint64_t cap;   /* power of two, >= 2 * n items */
} gguf_index;

struct gguf_file {
    fmap map;               /* the mapping when opened from a path */
    const uint8_t *data;    /* [size] the file bytes */
    uint64_t size;
    char *label;            /* path or "<memory>" for messages */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;   /* start of the data section (may equal size when there are no tensors) */
    int64_t n_kv;
    gguf_kv *kvs;           /* [n_kv] in file order */
    int64_t n_tensors;
    gguf_tensor *tensors;   /* [n_tensors] in file order */
    gguf_index kv_index;    /* key -> kvs index */
    gguf_index tensor_index; /* name -> tensors index */
};

uint64_t gguf_hash(const char *p, uint64_t len);
/* Index of the item named (p, len), or -1. */
int64_t gguf_index_find(const gguf_index *ix, const char *p, uint64_t len,
                        gguf_str (*name_of)(const void *items, int64_t i), const void *items);

#endif
