/* test_views.c: tensor-view guards for the backend op tests (see test_views.h). */
#include "test_views.h"

#include "base/error.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

void tv_arena_init(tv_arena *a, size_t size) {
    memset(a, 0, sizeof(*a));
    a->mem = calloc(1, size);
    DFL_ASSERT(a->mem != NULL);
    a->size = size;
}

void *tv_arena_take(tv_arena *a, size_t n) {
    const size_t off = (a->used + 255) & ~(size_t)255;
    DFL_ASSERT(off + n <= a->size);
    DFL_ASSERT(a->n_regions < TV_MAX_REGIONS);
    a->off[a->n_regions] = off;
    a->len[a->n_regions] = n;
    a->n_regions++;
    a->used = off + n;
    return a->mem + off;
}

void tv_arena_free(tv_arena *a) {
    free(a->mem);
    memset(a, 0, sizeof(*a));
}

size_t tv_view_extent(const tensor *v) {
    const quant_type_info *ti = quant_type_get(v->type);
    if (ti == NULL || ti->blck_size <= 0) return 0;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) {
        if (v->ne[d] <= 0) return 0;
    }
    size_t n;
    if (ti->blck_size == 1 && v->nb[0] != ti->type_size) {
        n = (size_t)(v->ne[0] - 1) * v->nb[0] + ti->type_size; /* strided dim 0 (e.g. positions) */
    } else {
        n = (size_t)(v->ne[0] / ti->blck_size) * ti->type_size;
    }
    for (int d = 1; d < TENSOR_MAX_DIMS; d++) n += (size_t)(v->ne[d] - 1) * v->nb[d];
    return n;
}

bool tv_view_check(test_ctx *t, const tensor *v, const void *base, size_t size, const char *what, const char *name) {
    const uint8_t *p = v->data, *b = base;
    const size_t ext = tv_view_extent(v);
    if (p == NULL || p < b || (size_t)(p - b) > size || ext > size - (size_t)(p - b)) {
        test_fail(t, __FILE__, __LINE__,
                  "%s: %s view [%lld, %lld, %lld, %lld] spans %zu bytes at offset %lld of a %zu-byte array: "
                  "it does not fit (a test bug: size the array for the view)",
                  what, name, (long long)v->ne[0], (long long)v->ne[1], (long long)v->ne[2], (long long)v->ne[3], ext,
                  p == NULL ? -1LL : (long long)(p - b), size);
        return false;
    }
    return true;
}

bool tv_op_check(test_ctx *t, const backend_op *op, const tv_arena *a, const char *what) {
    static const char *const names[5] = {"dst", "src0", "src1", "src2", "src3"};
    const tensor *ts[5] = {&op->dst, &op->src[0], &op->src[1], &op->src[2], &op->src[3]};
    bool ok = true;
    for (int i = 0; i < 5; i++) {
        const uint8_t *p = ts[i]->data;
        if (p == NULL) continue;
        int r = -1;
        for (int k = 0; k < a->n_regions; k++) {
            if (p >= a->mem + a->off[k] && p < a->mem + a->off[k] + a->len[k]) {
                r = k;
                break;
            }
        }
        if (r < 0) {
            test_fail(t, __FILE__, __LINE__, "%s: %s points outside every array of the test's arena", what, names[i]);
            ok = false;
            continue;
        }
        ok = tv_view_check(t, ts[i], a->mem + a->off[r], a->len[r], what, names[i]) && ok;
    }
    return ok;
}

/* The guard itself: the rope layout that once overran its arrays ([128, 16, 40] views over arrays
 * sized for [1024, 70]) is refused, naming the view; a view that fits, a strided position view and
 * an in-place op pass. Failures land on a scratch context, so this test sees them. */
TEST(test_views_guard) {
    tv_arena a;
    tv_arena_init(&a, 1 << 20);
    float *x = tv_arena_take(&a, 1024 * 70 * 4), *d = tv_arena_take(&a, 1024 * 70 * 4);
    int32_t *pos = tv_arena_take(&a, 160 * 4);
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = BACKEND_OP_ROPE_NEOX;
    op.dst = tensor_3d(QUANT_TYPE_F32, d, 128, 16, 40);
    op.src[0] = tensor_3d(QUANT_TYPE_F32, x, 128, 16, 40);
    op.src[1] = tensor_1d(QUANT_TYPE_I32, pos, 40);
    test_ctx scratch;
    memset(&scratch, 0, sizeof(scratch));
    scratch.name = "scratch";
    scratch.quiet = true;
    CHECK(!tv_op_check(&scratch, &op, &a, "overrun"));
    CHECK_EQ_INT(scratch.n_fail, 2); /* dst and src0, not the positions */
    op.dst = tensor_3d(QUANT_TYPE_F32, d, 128, 16, 35);
    op.src[0] = op.dst; /* in place, fits */
    op.src[1].nb[0] = 16;  /* positions with a stride of 4: 40 of them need 628 bytes of 640 */
    memset(&scratch, 0, sizeof(scratch));
    scratch.name = "scratch";
    scratch.quiet = true;
    CHECK(tv_op_check(&scratch, &op, &a, "fits"));
    CHECK_EQ_INT(scratch.n_fail, 0);
    op.src[1].ne[0] = 41;  /* 41 strided positions: 644 bytes */
    memset(&scratch, 0, sizeof(scratch));
    scratch.name = "scratch";
    scratch.quiet = true;
    CHECK(!tv_op_check(&scratch, &op, &a, "strided overrun"));
    float outside[4] = {0};
    op.src[1] = tensor_1d(QUANT_TYPE_F32, outside, 4); /* not from the arena */
    memset(&scratch, 0, sizeof(scratch));
    scratch.name = "scratch";
    scratch.quiet = true;
    CHECK(!tv_op_check(&scratch, &op, &a, "outside"));
    tv_arena_free(&a);
}
