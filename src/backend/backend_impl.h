/* backend_impl.h: what a backend implementation provides (the vtable) and the common header of
 * its objects. Only backend implementations (src/backend/<name>/) and backend.c include this. */
#ifndef DFL_BACKEND_IMPL_H
#define DFL_BACKEND_IMPL_H

#include "backend/backend.h"

typedef struct backend_vtable {
    const char *name;
    void (*free)(backend *be);
    backend_caps (*caps)(const backend *be);
    /* extra per-backend op checks after the generic ones (may be NULL) */
    dfl_status (*op_supported)(const backend *be, const backend_op *op, dfl_error *err);
    /* packed weights (backend_weight_pack_size / backend_weight_pack; both NULL: none) */
    size_t (*weight_pack_size)(const backend *be, const tensor *w);
    tensor (*weight_pack)(backend *be, const tensor *w, void *dst);

    backend_buffer *(*buffer_alloc)(backend *be, size_t size, dfl_error *err);
    void (*buffer_free)(backend_buffer *buf);
    void (*buffer_set)(backend_buffer *buf, size_t offset, const void *src, size_t size);
    void (*buffer_get)(const backend_buffer *buf, size_t offset, void *dst, size_t size);

    backend_queue *(*queue_new)(backend *be, dfl_error *err);
    void (*queue_free)(backend_queue *q);
    void (*queue_submit)(backend_queue *q, const backend_op *op); /* op already validated */
    void (*queue_synchronize)(backend_queue *q);

    backend_event *(*event_new)(backend *be, dfl_error *err);
    void (*event_free)(backend_event *ev);
    void (*event_record)(backend_event *ev, backend_queue *q);
    void (*queue_wait_event)(backend_queue *q, backend_event *ev);
    void (*event_synchronize)(backend_event *ev);
} backend_vtable;

/* Every backend object starts with one of these (implementations embed it as first member). */
struct backend {
    const backend_vtable *vt;
};

struct backend_buffer {
    backend *be;
    void *base;   /* address of byte 0 in backend memory */
    size_t size;
};

struct backend_queue {
    backend *be;
};

struct backend_event {
    backend *be;
};

#endif
