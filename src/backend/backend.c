/* backend.c: the backend-independent part of the interface: tensor views, op-record validation,
 * the typed op wrappers, and dispatch of buffers / queues / events through a backend's vtable. */
#include "backend/backend_impl.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- tensor views ----------------------------------------------------------------------- */

tensor tensor_4d(uint32_t type, void *data, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    tensor t;
    memset(&t, 0, sizeof(t));
    const quant_type_info *ti = quant_type_get(type);
    DFL_ASSERT(ti != NULL);
    DFL_ASSERT(ne0 % ti->blck_size == 0);
    t.type = type;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = ne2;
    t.ne[3] = ne3;
    t.nb[0] = ti->type_size;
    t.nb[1] = (size_t)(ne0 / ti->blck_size) * ti->type_size;
    t.nb[2] = t.nb[1] * (size_t)ne1;
    t.nb[3] = t.nb[2] * (size_t)ne2;
    t.data = data;
    t.buf = NULL;
    return t;
}

tensor tensor_1d(uint32_t type, void *data, int64_t ne0) { return tensor_4d(type, data, ne0, 1, 1, 1); }
tensor tensor_2d(uint32_t type, void *data, int64_t ne0, int64_t ne1) {
    return tensor_4d(type, data, ne0, ne1, 1, 1);
}
tensor tensor_3d(uint32_t type, void *data, int64_t ne0, int64_t ne1, int64_t ne2) {
    return tensor_4d(type, data, ne0, ne1, ne2, 1);
}

tensor tensor_in_buffer(backend_buffer *buf, size_t offset, uint32_t type, int64_t ne0, int64_t ne1) {
    tensor t = tensor_2d(type, (char *)buf->base + offset, ne0, ne1);
    DFL_ASSERT(offset + tensor_nbytes(&t) <= buf->size);
    t.buf = buf;
    return t;
}

tensor tensor_row(const tensor *t, int64_t i1) {
    DFL_ASSERT(i1 >= 0 && i1 < t->ne[1]);
    tensor r = *t;
    r.data = (char *)t->data + (size_t)i1 * t->nb[1];
    r.ne[1] = r.ne[2] = r.ne[3] = 1;
    r.nb[2] = r.nb[1];
    r.nb[3] = r.nb[1];
    return r;
}

tensor tensor_rows(const tensor *t, int64_t i1, int64_t n) {
    DFL_ASSERT(i1 >= 0 && n >= 0 && i1 + n <= t->ne[1]);
    tensor r = *t;
    r.data = (char *)t->data + (size_t)i1 * t->nb[1];
    r.ne[1] = n;
    return r;
}

tensor tensor_view(const tensor *t, const int64_t ne[TENSOR_MAX_DIMS], const size_t nb[TENSOR_MAX_DIMS],
                   size_t offset) {
    tensor r = *t;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) {
        r.ne[d] = ne[d];
        r.nb[d] = nb[d];
    }
    r.data = (char *)t->data + offset;
    return r;
}

tensor tensor_reshape_2d(const tensor *t, int64_t ne0, int64_t ne1) {
    DFL_ASSERT(tensor_is_contiguous(t));
    tensor r = tensor_2d(t->type, t->data, ne0, ne1);
    DFL_ASSERT(tensor_nelements(&r) == tensor_nelements(t));
    r.buf = t->buf;
    return r;
}

tensor tensor_reshape_3d(const tensor *t, int64_t ne0, int64_t ne1, int64_t ne2) {
    DFL_ASSERT(tensor_is_contiguous(t));
    tensor r = tensor_3d(t->type, t->data, ne0, ne1, ne2);
    DFL_ASSERT(tensor_nelements(&r) == tensor_nelements(t));
    r.buf = t->buf;
    return r;
}

int64_t tensor_nelements(const tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
int64_t tensor_nrows(const tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t tensor_nbytes(const tensor *t) {
    const quant_type_info *ti = quant_type_get(t->type);
    if (ti == NULL) return 0;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) {
        if (t->ne[d] <= 0) return 0;
    }
    size_t n = (size_t)(t->ne[0] / ti->blck_size) * ti->type_size;
    for (int d = 1; d < TENSOR_MAX_DIMS; d++) {
        n += (size_t)(t->ne[d] - 1) * t->nb[d];
    }
    return n;
}

bool tensor_is_contiguous(const tensor *t) {
    const quant_type_info *ti = quant_type_get(t->type);
    if (ti == NULL) return false;
    size_t expect = ti->type_size;
    if (t->nb[0] != expect) return false;
    expect = (size_t)(t->ne[0] / ti->blck_size) * ti->type_size;
    for (int d = 1; d < TENSOR_MAX_DIMS; d++) {
        if (t->ne[d] != 1 && t->nb[d] != expect) return false;
        expect *= (size_t)t->ne[d];
    }
    return true;
}

bool tensor_same_shape(const tensor *a, const tensor *b) {
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) {
        if (a->ne[d] != b->ne[d]) return false;
    }
    return true;
}

/* ---- op validation ---------------------------------------------------------------------- */

static const char *const k_op_names[BACKEND_OP_COUNT] = {
    [BACKEND_OP_NONE] = "none",         [BACKEND_OP_MATMUL] = "matmul",
    [BACKEND_OP_RMSNORM] = "rmsnorm",   [BACKEND_OP_ROPE_NEOX] = "rope_neox",
    [BACKEND_OP_ATTENTION] = "attention", [BACKEND_OP_SET_ROWS] = "set_rows",
    [BACKEND_OP_GET_ROWS] = "get_rows", [BACKEND_OP_ADD] = "add",
    [BACKEND_OP_MUL] = "mul",           [BACKEND_OP_SWIGLU] = "swiglu",
    [BACKEND_OP_SCALE] = "scale",       [BACKEND_OP_COPY] = "copy",
    [BACKEND_OP_SOFTMAX] = "softmax",   [BACKEND_OP_ARGMAX] = "argmax", [BACKEND_OP_MATMUL_ARGMAX] = "matmul_argmax",
    [BACKEND_OP_WRITE] = "write",       [BACKEND_OP_READ] = "read",
};

const char *backend_op_name(backend_op_kind kind) {
    if ((int)kind < 0 || kind >= BACKEND_OP_COUNT) return "unknown";
    return k_op_names[kind];
}

static const char *type_name(uint32_t type) {
    const quant_type_info *ti = quant_type_get(type);
    return ti ? ti->name : "unknown";
}

static void shape_str(const tensor *t, char *buf, size_t cap) {
    snprintf(buf, cap, "%s [%lld, %lld, %lld, %lld]", type_name(t->type), (long long)t->ne[0],
             (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
}

/* Sets err with "op <name>: <what>" and returns DFL_ERR_INVALID. */
static dfl_status bad(dfl_error *err, const backend_op *op, const char *what) {
    return error_set(err, DFL_ERR_INVALID, "op %s: %s", backend_op_name(op->kind), what);
}

/* Checks that t is a usable tensor: known type, positive dims, data set, ne0 a whole number of
 * blocks, elements (blocks) of a row contiguous. */
static dfl_status check_tensor(dfl_error *err, const backend_op *op, const char *name, const tensor *t) {
    const quant_type_info *ti = quant_type_get(t->type);
    if (ti == NULL) {
        return error_set(err, DFL_ERR_INVALID, "op %s: %s has unknown type %u", backend_op_name(op->kind),
                         name, t->type);
    }
    const char *what = NULL;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) {
        if (t->ne[d] <= 0) what = "has a dimension <= 0";
    }
    if (what == NULL && t->ne[0] % ti->blck_size != 0) what = "ne[0] is not a multiple of the block size";
    if (what == NULL && t->nb[0] != ti->type_size) what = "rows must be contiguous (nb[0] = the element/block size)";
    if (what == NULL && t->data == NULL) what = "has no data";
    if (what == NULL && t->layout != TENSOR_LAYOUT_PLAIN) what = "is a packed weight (only a matmul's w may be one)";
    if (what == NULL) return DFL_OK;
    char s[128];
    shape_str(t, s, sizeof(s)); /* formatted only on error: this runs for every op */
    return error_set(err, DFL_ERR_INVALID, "op %s: %s %s %s", backend_op_name(op->kind), name, s, what);
}

/* A matmul weight: a plain tensor (check_tensor), or a packed one whose layout fits its type and
 * shape (backend.h: tensor_layout). */
static dfl_status check_weight(dfl_error *err, const backend_op *op, const tensor *w) {
    if (w->layout == TENSOR_LAYOUT_PLAIN) return check_tensor(err, op, "w", w);
    const char *what = NULL;
    char msg[128];
    if (w->layout == TENSOR_LAYOUT_KQ_X16 || w->layout == TENSOR_LAYOUT_Q6K_X16V) {
        const size_t rec = tensor_kq_x16_record_bytes(w->type);
        if (rec == 0) {
            what = "is packed as k-quant x16 but is neither q4_K nor q6_K";
        } else if (w->layout == TENSOR_LAYOUT_Q6K_X16V && w->type != QUANT_TYPE_Q6_K) {
            what = "is packed as q6_K x16 values but is not q6_K";
        } else if (w->ne[0] <= 0 || w->ne[0] % QK_K != 0 || w->ne[1] <= 0 || w->ne[2] != 1 || w->ne[3] != 1) {
            what = "is packed as k-quant x16: needs 2 dims with ne[0] a multiple of 256";
        } else if (w->nb[1] != rec * (size_t)(w->ne[0] / QK_K) / 16 || w->data == NULL || ((uintptr_t)w->data & 63) != 0) {
            what = "is packed as k-quant x16: needs nb[1] = record bytes x super-blocks / 16 and 64-byte aligned data";
        }
    } else if (w->layout == TENSOR_LAYOUT_P16_X16) {
        if (w->type != QUANT_TYPE_F16 && w->type != QUANT_TYPE_BF16) {
            what = "is packed as p16 x16 but is neither f16 nor bf16";
        } else if (w->ne[0] <= 0 || w->ne[1] <= 0 || w->ne[2] != 1 || w->ne[3] != 1) {
            what = "is packed as p16 x16: needs 2 dims";
        } else if (w->nb[1] != 2 * (size_t)tensor_p16_x16_n_pad(w->ne[0]) || w->data == NULL || ((uintptr_t)w->data & 63) != 0) {
            what = "is packed as p16 x16: needs nb[1] = 2 x ne[0] rounded up to 32 and 64-byte aligned data";
        }
    } else if (w->layout == TENSOR_LAYOUT_Q8_0_X16 || w->layout == TENSOR_LAYOUT_Q4_0_X16) {
        /* the same group layout for both: rows of the type's block bytes, 64-byte aligned */
        const uint32_t want = w->layout == TENSOR_LAYOUT_Q4_0_X16 ? QUANT_TYPE_Q4_0 : QUANT_TYPE_Q8_0;
        const char *tn = type_name(want);
        if (w->type != want) {
            snprintf(msg, sizeof(msg), "is packed as %s x16 but is not %s", tn, tn);
            what = msg;
        } else if (w->ne[0] <= 0 || w->ne[0] % 512 != 0 || w->ne[1] <= 0 || w->ne[2] != 1 || w->ne[3] != 1) {
            snprintf(msg, sizeof(msg), "is packed as %s x16: needs 2 dims with ne[0] a multiple of 512", tn);
            what = msg;
        } else if (w->nb[1] % 64 != 0 || w->nb[1] < quant_row_size(want, w->ne[0]) || w->data == NULL ||
                   ((uintptr_t)w->data & 63) != 0) {
            snprintf(msg, sizeof(msg), "is packed as %s x16: rows must be 64-byte aligned and hold ne[0] %s blocks",
                     tn, tn);
            what = msg;
        }
    } else {
        what = "has an unknown layout";
    }
    if (what == NULL) return DFL_OK;
    char s[128];
    shape_str(w, s, sizeof(s));
    return error_set(err, DFL_ERR_INVALID, "op %s: w %s %s", backend_op_name(op->kind), s, what);
}

static dfl_status check_type(dfl_error *err, const backend_op *op, const char *name, const tensor *t,
                             uint32_t t0, uint32_t t1, uint32_t t2) {
    if (t->type == t0 || t->type == t1 || t->type == t2) return DFL_OK;
    return error_set(err, DFL_ERR_INVALID, "op %s: %s has type %s (expected %s%s%s%s%s)", backend_op_name(op->kind),
                     name, type_name(t->type), type_name(t0), t1 != t0 ? " or " : "", t1 != t0 ? type_name(t1) : "",
                     t2 != t1 ? " or " : "", t2 != t1 ? type_name(t2) : "");
}

static dfl_status check_shape(dfl_error *err, const backend_op *op, const char *name, const tensor *t,
                              int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    if (t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == ne2 && t->ne[3] == ne3) return DFL_OK;
    char s[128];
    shape_str(t, s, sizeof(s));
    return error_set(err, DFL_ERR_INVALID, "op %s: %s is %s, expected [%lld, %lld, %lld, %lld]",
                     backend_op_name(op->kind), name, s, (long long)ne0, (long long)ne1, (long long)ne2,
                     (long long)ne3);
}

static dfl_status check_same(dfl_error *err, const backend_op *op, const char *na, const tensor *a,
                             const char *nb, const tensor *b) {
    if (tensor_same_shape(a, b)) return DFL_OK;
    char sa[128], sb[128];
    shape_str(a, sa, sizeof(sa));
    shape_str(b, sb, sizeof(sb));
    return error_set(err, DFL_ERR_INVALID, "op %s: %s %s and %s %s differ in shape", backend_op_name(op->kind),
                     na, sa, nb, sb);
}

bool backend_matmul_type_supported(uint32_t type) {
    switch (type) {
    case QUANT_TYPE_F32: case QUANT_TYPE_F16: case QUANT_TYPE_BF16: case QUANT_TYPE_Q8_0:
    case QUANT_TYPE_Q4_0: case QUANT_TYPE_Q4_K: case QUANT_TYPE_Q6_K: case QUANT_TYPE_Q4_1:
    case QUANT_TYPE_Q5_0: case QUANT_TYPE_Q5_1: case QUANT_TYPE_IQ4_NL: case QUANT_TYPE_Q2_K:
    case QUANT_TYPE_Q3_K: case QUANT_TYPE_Q5_K: case QUANT_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

#define TRY(x) do { dfl_status st_ = (x); if (st_ != DFL_OK) return st_; } while (0)
#define F32 QUANT_TYPE_F32
#define F16 QUANT_TYPE_F16
#define BF16 QUANT_TYPE_BF16
#define I32 QUANT_TYPE_I32
#define I64 QUANT_TYPE_I64

static dfl_status validate_generic(const backend_op *op, dfl_error *err) {
    const tensor *d = &op->dst;
    const tensor *s0 = &op->src[0], *s1 = &op->src[1], *s2 = &op->src[2], *s3 = &op->src[3];
    switch (op->kind) {
    case BACKEND_OP_MATMUL: {
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_weight(err, op, s0));
        TRY(check_tensor(err, op, "x", s1));
        if (!backend_matmul_type_supported(s0->type)) {
            return error_set(err, DFL_ERR_INVALID,
                             "op matmul: weight type %s is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_xs)",
                             type_name(s0->type));
        }
        TRY(check_type(err, op, "x", s1, F32, F32, F32));
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        TRY(check_shape(err, op, "w", s0, s0->ne[0], s0->ne[1], 1, 1));
        TRY(check_shape(err, op, "x", s1, s0->ne[0], s1->ne[1], 1, 1));
        TRY(check_shape(err, op, "dst", d, s0->ne[1], s1->ne[1], 1, 1));
        return DFL_OK;
    }
    case BACKEND_OP_RMSNORM:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "x", s0));
        TRY(check_type(err, op, "x", s0, F32, F32, F32));
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        TRY(check_same(err, op, "dst", d, "x", s0));
        if (s1->data != NULL) {
            TRY(check_tensor(err, op, "w", s1));
            TRY(check_type(err, op, "w", s1, F32, F32, F32));
            TRY(check_shape(err, op, "w", s1, s0->ne[0], 1, 1, 1));
        }
        if (!(op->f[0] >= 0.0f)) return bad(err, op, "eps must be >= 0");
        return DFL_OK;
    case BACKEND_OP_ROPE_NEOX: {
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "x", s0));
        TRY(check_type(err, op, "x", s0, F32, F32, F32));
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        TRY(check_same(err, op, "dst", d, "x", s0));
        TRY(check_shape(err, op, "x", s0, s0->ne[0], s0->ne[1], s0->ne[2], 1));
        TRY(check_type(err, op, "pos", s1, I32, I32, I32));
        if (s1->data == NULL || s1->ne[0] < s0->ne[2] || s1->nb[0] < 4) {
            return error_set(err, DFL_ERR_INVALID, "op rope_neox: pos needs %lld int32 entries (has %lld)",
                             (long long)s0->ne[2], (long long)s1->ne[0]);
        }
        int32_t n_rot = op->i[0] == 0 ? (int32_t)s0->ne[0] : op->i[0];
        if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > s0->ne[0]) {
            return error_set(err, DFL_ERR_INVALID, "op rope_neox: n_rot %d must be even and in (0, head_dim %lld]",
                             (int)n_rot, (long long)s0->ne[0]);
        }
        if (!(op->f[0] > 0.0f)) return bad(err, op, "freq_base must be > 0");
        return DFL_OK;
    }
    case BACKEND_OP_ATTENTION: {
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "q", s0));
        TRY(check_tensor(err, op, "k", s1));
        TRY(check_tensor(err, op, "v", s2));
        const int32_t kind = op->i[0];
        if (kind != BACKEND_ATTN_MASK && kind != BACKEND_ATTN_CAUSAL && kind != BACKEND_ATTN_FULL) {
            return error_set(err, DFL_ERR_INVALID, "op attention: mask kind %d is unknown (0 tensor, 1 causal, 2 full)",
                             (int)kind);
        }
        if (kind == BACKEND_ATTN_MASK) {
            TRY(check_tensor(err, op, "mask", s3));
            TRY(check_type(err, op, "mask", s3, F32, F32, F32));
        } else if (s3->data != NULL) {
            return error_set(err, DFL_ERR_INVALID, "op attention: a %s mask kind takes no mask tensor (src[3] has data)",
                             kind == BACKEND_ATTN_CAUSAL ? "causal" : "full");
        }
        TRY(check_type(err, op, "q", s0, F32, F32, F32));
        TRY(check_type(err, op, "k", s1, F16, F32, F32));
        TRY(check_type(err, op, "v", s2, F16, F32, F32));
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        const int64_t hd = s0->ne[0], nh = s0->ne[1], nq = s0->ne[2];
        const int64_t nh_kv = s1->ne[1], n_kv = s1->ne[2], hd_v = s2->ne[0];
        TRY(check_shape(err, op, "q", s0, hd, nh, nq, 1));
        TRY(check_shape(err, op, "k", s1, hd, nh_kv, n_kv, 1));
        TRY(check_shape(err, op, "v", s2, hd_v, nh_kv, n_kv, 1));
        if (kind == BACKEND_ATTN_MASK) TRY(check_shape(err, op, "mask", s3, n_kv, nq, 1, 1));
        if (kind == BACKEND_ATTN_CAUSAL && nq > n_kv) {
            return error_set(err, DFL_ERR_INVALID, "op attention: causal with %lld query rows over %lld cells (the "
                             "queries must be the last cells)", (long long)nq, (long long)n_kv);
        }
        TRY(check_shape(err, op, "dst", d, hd_v, nh, nq, 1));
        if (nh % nh_kv != 0) {
            return error_set(err, DFL_ERR_INVALID, "op attention: n_head %lld is not a multiple of n_head_kv %lld",
                             (long long)nh, (long long)nh_kv);
        }
        return DFL_OK;
    }
    case BACKEND_OP_SET_ROWS:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "src", s0));
        TRY(check_tensor(err, op, "idx", s1));
        TRY(check_type(err, op, "dst", d, F32, F16, BF16));
        TRY(check_type(err, op, "src", s0, F32, F32, F32));
        TRY(check_type(err, op, "idx", s1, I32, I64, I64));
        TRY(check_shape(err, op, "dst", d, s0->ne[0], d->ne[1], 1, 1));
        TRY(check_shape(err, op, "src", s0, s0->ne[0], s0->ne[1], 1, 1));
        TRY(check_shape(err, op, "idx", s1, s0->ne[1], 1, 1, 1));
        return DFL_OK;
    case BACKEND_OP_GET_ROWS:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "src", s0));
        TRY(check_tensor(err, op, "idx", s1));
        if (!backend_matmul_type_supported(s0->type)) {
            return error_set(err, DFL_ERR_INVALID, "op get_rows: src type %s is not supported", type_name(s0->type));
        }
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        TRY(check_type(err, op, "idx", s1, I32, I32, I32));
        TRY(check_shape(err, op, "src", s0, s0->ne[0], s0->ne[1], 1, 1));
        TRY(check_shape(err, op, "idx", s1, d->ne[1], 1, 1, 1));
        TRY(check_shape(err, op, "dst", d, s0->ne[0], s1->ne[0], 1, 1));
        return DFL_OK;
    case BACKEND_OP_ADD:
    case BACKEND_OP_MUL:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "a", s0));
        TRY(check_tensor(err, op, "b", s1));
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        TRY(check_type(err, op, "a", s0, F32, F32, F32));
        TRY(check_type(err, op, "b", s1, F32, F32, F32));
        TRY(check_same(err, op, "dst", d, "a", s0));
        for (int k = 0; k < TENSOR_MAX_DIMS; k++) {
            if (s1->ne[k] != s0->ne[k] && s1->ne[k] != 1) {
                char sa[128], sb[128];
                shape_str(s0, sa, sizeof(sa));
                shape_str(s1, sb, sizeof(sb));
                return error_set(err, DFL_ERR_INVALID, "op %s: b %s does not broadcast to a %s",
                                 backend_op_name(op->kind), sb, sa);
            }
        }
        return DFL_OK;
    case BACKEND_OP_SWIGLU:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "gate", s0));
        TRY(check_tensor(err, op, "up", s1));
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        TRY(check_type(err, op, "gate", s0, F32, F32, F32));
        TRY(check_type(err, op, "up", s1, F32, F32, F32));
        TRY(check_same(err, op, "dst", d, "gate", s0));
        TRY(check_same(err, op, "up", s1, "gate", s0));
        return DFL_OK;
    case BACKEND_OP_SCALE:
    case BACKEND_OP_SOFTMAX:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "a", s0));
        TRY(check_type(err, op, "dst", d, F32, F32, F32));
        TRY(check_type(err, op, "a", s0, F32, F32, F32));
        TRY(check_same(err, op, "dst", d, "a", s0));
        return DFL_OK;
    case BACKEND_OP_COPY:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "src", s0));
        TRY(check_type(err, op, "dst", d, F32, F16, BF16));
        TRY(check_type(err, op, "src", s0, F32, F16, BF16));
        TRY(check_same(err, op, "dst", d, "src", s0));
        return DFL_OK;
    case BACKEND_OP_MATMUL_ARGMAX:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_weight(err, op, s0));
        TRY(check_tensor(err, op, "x", s1));
        if (!backend_matmul_type_supported(s0->type)) {
            return error_set(err, DFL_ERR_INVALID, "op matmul_argmax: weight type %s is not supported",
                             type_name(s0->type));
        }
        TRY(check_type(err, op, "x", s1, F32, F32, F32));
        TRY(check_type(err, op, "dst", d, I32, I32, I32));
        TRY(check_shape(err, op, "w", s0, s0->ne[0], s0->ne[1], 1, 1));
        TRY(check_shape(err, op, "x", s1, s0->ne[0], s1->ne[1], 1, 1));
        TRY(check_shape(err, op, "dst", d, s1->ne[1], 1, 1, 1));
        if (op->src[2].data != NULL) {
            TRY(check_tensor(err, op, "logits", &op->src[2]));
            TRY(check_type(err, op, "logits", &op->src[2], F32, F32, F32));
            TRY(check_shape(err, op, "logits", &op->src[2], s0->ne[1], s1->ne[1], 1, 1));
        }
        if (!isfinite(op->f[0])) return bad(err, op, "scale must be finite");
        return DFL_OK;
    case BACKEND_OP_ARGMAX:
        TRY(check_tensor(err, op, "dst", d));
        TRY(check_tensor(err, op, "a", s0));
        TRY(check_type(err, op, "a", s0, F32, F32, F32));
        TRY(check_type(err, op, "dst", d, I32, I32, I32));
        TRY(check_shape(err, op, "a", s0, s0->ne[0], s0->ne[1], 1, 1));
        TRY(check_shape(err, op, "dst", d, s0->ne[1], 1, 1, 1));
        return DFL_OK;
    case BACKEND_OP_WRITE:
    case BACKEND_OP_READ: {
        const tensor *t = op->kind == BACKEND_OP_WRITE ? d : s0;
        const char *name = op->kind == BACKEND_OP_WRITE ? "dst" : "src";
        TRY(check_tensor(err, op, name, t));
        if (!tensor_is_contiguous(t)) return error_set(err, DFL_ERR_INVALID, "op %s: %s must be contiguous", backend_op_name(op->kind), name);
        if (op->host == NULL) return bad(err, op, "no host memory");
        if (op->size > tensor_nbytes(t)) {
            return error_set(err, DFL_ERR_INVALID, "op %s: %zu bytes exceed the tensor's %zu bytes",
                             backend_op_name(op->kind), op->size, tensor_nbytes(t));
        }
        return DFL_OK;
    }
    case BACKEND_OP_NONE:
    case BACKEND_OP_COUNT:
        break;
    }
    return error_set(err, DFL_ERR_INVALID, "op: unknown kind %d", (int)op->kind);
}

dfl_status backend_op_validate(const backend *be, const backend_op *op, dfl_error *err) {
    TRY(validate_generic(op, err));
    if (be != NULL && be->vt->op_supported != NULL) {
        TRY(be->vt->op_supported(be, op, err));
    }
    return DFL_OK;
}

/* ---- dispatch --------------------------------------------------------------------------- */

void backend_free(backend *be) {
    if (be != NULL) be->vt->free(be);
}

backend_caps backend_get_caps(const backend *be) { return be->vt->caps(be); }

size_t tensor_kq_x16_record_bytes(uint32_t type) {
    /* Q4_K: d|dmin x 16 (64) + 8 scales and 8 mins x 16 (256) + 32 qs dwords x 16 (2048);
     * Q6_K: d x 16 (32, padded to 64) + 16 scales x 16 (256) + 32 ql dwords x 16 (2048) + 16 qh dwords x 16 (1024)
     * + the biased activations' correction x 16 (64) */
    return type == QUANT_TYPE_Q4_K ? 2368 : type == QUANT_TYPE_Q6_K ? 3456 : 0;
}

int64_t tensor_p16_x16_n_pad(int64_t n_in) { return (n_in + 31) / 32 * 32; }

size_t backend_weight_pack_size(const backend *be, const tensor *w) {
    if (be->vt->weight_pack_size == NULL || w->layout != TENSOR_LAYOUT_PLAIN) return 0;
    return be->vt->weight_pack_size(be, w);
}

tensor backend_weight_pack(backend *be, const tensor *w, void *dst) {
    DFL_ASSERT(be->vt->weight_pack != NULL && ((uintptr_t)dst & 63) == 0);
    return be->vt->weight_pack(be, w, dst);
}

backend_buffer *backend_buffer_alloc(backend *be, size_t size, dfl_error *err) {
    if (size == 0) {
        error_set(err, DFL_ERR_INVALID, "backend %s: cannot allocate a buffer of 0 bytes", be->vt->name);
        return NULL;
    }
    return be->vt->buffer_alloc(be, size, err);
}

void backend_buffer_free(backend_buffer *buf) {
    if (buf != NULL) buf->be->vt->buffer_free(buf);
}

void *backend_buffer_base(const backend_buffer *buf) { return buf->base; }
size_t backend_buffer_size(const backend_buffer *buf) { return buf->size; }

void backend_buffer_set(backend_buffer *buf, size_t offset, const void *src, size_t size) {
    DFL_ASSERT(offset <= buf->size && size <= buf->size - offset);
    buf->be->vt->buffer_set(buf, offset, src, size);
}

void backend_buffer_get(const backend_buffer *buf, size_t offset, void *dst, size_t size) {
    DFL_ASSERT(offset <= buf->size && size <= buf->size - offset);
    buf->be->vt->buffer_get(buf, offset, dst, size);
}

backend_queue *backend_queue_new(backend *be, dfl_error *err) { return be->vt->queue_new(be, err); }

void backend_queue_free(backend_queue *q) {
    if (q != NULL) q->be->vt->queue_free(q);
}

void backend_queue_synchronize(backend_queue *q) { q->be->vt->queue_synchronize(q); }

backend_event *backend_event_new(backend *be, dfl_error *err) { return be->vt->event_new(be, err); }

void backend_event_free(backend_event *ev) {
    if (ev != NULL) ev->be->vt->event_free(ev);
}

void backend_event_record(backend_event *ev, backend_queue *q) {
    DFL_ASSERT(ev->be == q->be);
    q->be->vt->event_record(ev, q);
}

void backend_queue_wait_event(backend_queue *q, backend_event *ev) {
    DFL_ASSERT(ev->be == q->be);
    q->be->vt->queue_wait_event(q, ev);
}

void backend_event_synchronize(backend_event *ev) { ev->be->vt->event_synchronize(ev); }

void backend_queue_submit(backend_queue *q, const backend_op *op) {
    dfl_error err;
    error_clear(&err);
    if (backend_op_validate(q->be, op, &err) != DFL_OK) {
        error_abort(__FILE__, __LINE__, err.msg);
    }
    q->be->vt->queue_submit(q, op);
}

/* ---- typed op wrappers ------------------------------------------------------------------ */

static backend_op op_init(backend_op_kind kind, const tensor *dst) {
    backend_op op;
    memset(&op, 0, sizeof(op));
    op.kind = kind;
    if (dst != NULL) op.dst = *dst;
    return op;
}

void op_matmul(backend_queue *q, tensor dst, tensor w, tensor x) {
    backend_op op = op_init(BACKEND_OP_MATMUL, &dst);
    op.src[0] = w;
    op.src[1] = x;
    backend_queue_submit(q, &op);
}

void op_rmsnorm(backend_queue *q, tensor dst, tensor x, const tensor *w, float eps) {
    backend_op op = op_init(BACKEND_OP_RMSNORM, &dst);
    op.src[0] = x;
    if (w != NULL) op.src[1] = *w;
    op.f[0] = eps;
    backend_queue_submit(q, &op);
}

void op_rope_neox(backend_queue *q, tensor dst, tensor x, tensor pos, float freq_base, int32_t n_rot) {
    backend_op op = op_init(BACKEND_OP_ROPE_NEOX, &dst);
    op.src[0] = x;
    op.src[1] = pos;
    op.f[0] = freq_base;
    op.i[0] = n_rot;
    backend_queue_submit(q, &op);
}

void op_rope_norm(backend_queue *q, tensor dst, tensor x, tensor pos, float freq_base, int32_t n_rot) {
    backend_op op = op_init(BACKEND_OP_ROPE_NEOX, &dst);
    op.src[0] = x;
    op.src[1] = pos;
    op.f[0] = freq_base;
    op.i[0] = n_rot;
    op.i[1] = 1; /* NORM pairing */
    backend_queue_submit(q, &op);
}

void op_attention(backend_queue *q, tensor dst, tensor qry, tensor k, tensor v, tensor mask, float scale) {
    backend_op op = op_init(BACKEND_OP_ATTENTION, &dst);
    op.src[0] = qry;
    op.src[1] = k;
    op.src[2] = v;
    op.src[3] = mask;
    op.f[0] = scale;
    op.i[0] = BACKEND_ATTN_MASK;
    backend_queue_submit(q, &op);
}

void op_attention_structured(backend_queue *q, tensor dst, tensor qry, tensor k, tensor v, backend_attn_mask kind,
                             float scale) {
    backend_op op = op_init(BACKEND_OP_ATTENTION, &dst);
    op.src[0] = qry;
    op.src[1] = k;
    op.src[2] = v;
    op.f[0] = scale;
    op.i[0] = (int32_t)kind;
    backend_queue_submit(q, &op);
}

void op_set_rows(backend_queue *q, tensor dst, tensor src, tensor idx) {
    backend_op op = op_init(BACKEND_OP_SET_ROWS, &dst);
    op.src[0] = src;
    op.src[1] = idx;
    backend_queue_submit(q, &op);
}

void op_get_rows(backend_queue *q, tensor dst, tensor src, tensor idx) {
    backend_op op = op_init(BACKEND_OP_GET_ROWS, &dst);
    op.src[0] = src;
    op.src[1] = idx;
    backend_queue_submit(q, &op);
}

static void op_binary(backend_queue *q, backend_op_kind kind, tensor dst, tensor a, tensor b) {
    backend_op op = op_init(kind, &dst);
    op.src[0] = a;
    op.src[1] = b;
    backend_queue_submit(q, &op);
}

void op_add(backend_queue *q, tensor dst, tensor a, tensor b) { op_binary(q, BACKEND_OP_ADD, dst, a, b); }
void op_mul(backend_queue *q, tensor dst, tensor a, tensor b) { op_binary(q, BACKEND_OP_MUL, dst, a, b); }
void op_swiglu(backend_queue *q, tensor dst, tensor gate, tensor up) {
    op_binary(q, BACKEND_OP_SWIGLU, dst, gate, up);
}

void op_scale(backend_queue *q, tensor dst, tensor a, float s) {
    backend_op op = op_init(BACKEND_OP_SCALE, &dst);
    op.src[0] = a;
    op.f[0] = s;
    backend_queue_submit(q, &op);
}

void op_copy(backend_queue *q, tensor dst, tensor src) {
    backend_op op = op_init(BACKEND_OP_COPY, &dst);
    op.src[0] = src;
    backend_queue_submit(q, &op);
}

void op_softmax(backend_queue *q, tensor dst, tensor a) {
    backend_op op = op_init(BACKEND_OP_SOFTMAX, &dst);
    op.src[0] = a;
    backend_queue_submit(q, &op);
}

void op_argmax(backend_queue *q, tensor dst, tensor a) {
    backend_op op = op_init(BACKEND_OP_ARGMAX, &dst);
    op.src[0] = a;
    backend_queue_submit(q, &op);
}

void op_matmul_argmax_logits(backend_queue *q, tensor dst, tensor w, tensor x, float scale, tensor logits) {
    backend_op op = op_init(BACKEND_OP_MATMUL_ARGMAX, &dst);
    op.src[0] = w;
    op.src[1] = x;
    op.src[2] = logits;
    op.f[0] = scale;
    backend_queue_submit(q, &op);
}

void op_matmul_argmax(backend_queue *q, tensor dst, tensor w, tensor x, float scale) {
    tensor none;
    memset(&none, 0, sizeof(none));
    op_matmul_argmax_logits(q, dst, w, x, scale, none);
}

void op_write(backend_queue *q, tensor dst, const void *host, size_t size) {
    backend_op op = op_init(BACKEND_OP_WRITE, &dst);
    op.host = (void *)host;
    op.size = size;
    backend_queue_submit(q, &op);
}

void op_read(backend_queue *q, void *host, tensor src, size_t size) {
    backend_op op = op_init(BACKEND_OP_READ, NULL);
    op.src[0] = src;
    op.host = host;
    op.size = size;
    backend_queue_submit(q, &op);
}
