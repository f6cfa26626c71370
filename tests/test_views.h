/* test_views.h: guards for the backend op tests. A tensor view over host memory must fit the
 * allocation it was made for: a view that runs past its array silently overlaps the next one
 * (input over output, output over the positions), and the result then depends on the order in
 * which a backend happens to run. Every op test places its arrays with tv_arena_take (each one
 * recorded as a region) and checks the op with tv_op_check before running it; a view that is
 * not inside one region fails the test with the tensor's name, extent and region. */
#ifndef DFL_TEST_VIEWS_H
#define DFL_TEST_VIEWS_H

#include "test.h"
#include "backend/backend.h"

#define TV_MAX_REGIONS 256

typedef struct tv_arena {
    uint8_t *mem;                 /* one zeroed host block */
    size_t size, used;
    int n_regions;
    size_t off[TV_MAX_REGIONS];   /* region i: [mem + off[i], mem + off[i] + len[i]) */
    size_t len[TV_MAX_REGIONS];
} tv_arena;

/* A zeroed arena of `size` bytes (asserts on allocation failure). */
void tv_arena_init(tv_arena *a, size_t size);
/* A new region of n bytes, 256-byte aligned, recorded; asserts that it fits the arena. */
void *tv_arena_take(tv_arena *a, size_t n);
void tv_arena_free(tv_arena *a);

/* Bytes from v->data to one past the last byte the view touches (strides of every dim included,
 * a strided dim 0 too); 0 for an empty view or an unknown type. */
size_t tv_view_extent(const tensor *v);
/* True if view v lies in [base, base + size); otherwise fails t ("what: <name> ... does not fit"). */
bool tv_view_check(test_ctx *t, const tensor *v, const void *base, size_t size, const char *what, const char *name);
/* True if every tensor of op with data (dst, src[0..3]) lies inside one region of a. A tensor whose
 * data is outside the arena altogether also fails (every op input must come from the arena). */
bool tv_op_check(test_ctx *t, const backend_op *op, const tv_arena *a, const char *what);

#endif
