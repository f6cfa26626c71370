/* cpu_ops_ref.c: scalar reference implementations of every backend op (see cpu_ops_ref.h).
 * Numerics follow llama.cpp's CPU ops where the choice matters for matching its greedy tokens:
 * rmsnorm sums squares in f64, rope angles are accumulated in f32, silu is x / (1 + expf(-x)),
 * attention with an F16 cache rounds q (and the probabilities multiplying an F16 V) to f16 like
 * ggml's mul_mat does with its f16 dot type. */
#include "backend/cpu/cpu_ops_ref.h"
#include "base/error.h"
#include "base/fp16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *ref_alloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    if (p == NULL) error_abort(__FILE__, __LINE__, "reference op: out of memory");
    return p;
}

static float load_elem(uint32_t type, const void *p) {
    switch (type) {
    case QUANT_TYPE_F32: { float v; memcpy(&v, p, 4); return v; }
    case QUANT_TYPE_F16: { uint16_t h; memcpy(&h, p, 2); return fp16_to_fp32(h); }
    case QUANT_TYPE_BF16: { uint16_t h; memcpy(&h, p, 2); return bf16_to_fp32(h); }
    default: DFL_ASSERT(0 && "load_elem: type");
    }
    return 0.0f;
}

static void store_elem(uint32_t type, void *p, float v) {
    switch (type) {
    case QUANT_TYPE_F32: memcpy(p, &v, 4); break;
    case QUANT_TYPE_F16: { uint16_t h = fp32_to_fp16(v); memcpy(p, &h, 2); break; }
    case QUANT_TYPE_BF16: { uint16_t h = fp32_to_bf16(v); memcpy(p, &h, 2); break; }
    default: DFL_ASSERT(0 && "store_elem: type");
    }
}

/* Pointer to element (i0, i1, i2, i3) of a non-block type. */
static char *elem_ptr(const tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (char *)t->data + (size_t)i0 * t->nb[0] + (size_t)i1 * t->nb[1] + (size_t)i2 * t->nb[2] +
           (size_t)i3 * t->nb[3];
}

void cpu_op_matmul_ref(const backend_op *op) {
    const tensor *w = &op->src[0], *x = &op->src[1], *d = &op->dst;
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n_rows = x->ne[1];
    float *wrow = ref_alloc((size_t)n_in * sizeof(float));
    for (int64_t o = 0; o < n_out; o++) {
        bool ok = quant_dequantize_row(w->type, (const char *)w->data + (size_t)o * w->nb[1], wrow, n_in);
        DFL_ASSERT(ok);
        for (int64_t r = 0; r < n_rows; r++) {
            const float *xr = (const float *)((const char *)x->data + (size_t)r * x->nb[1]);
            double sum = 0.0;
            for (int64_t i = 0; i < n_in; i++) sum += (double)wrow[i] * (double)xr[i];
            float *dr = (float *)((char *)d->data + (size_t)r * d->nb[1]);
            dr[o] = (float)sum;
        }
    }
    free(wrow);
}

void cpu_rmsnorm_row_ref(float *d, const float *x, const float *w, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) {
        float y = x[i] * scale;
        d[i] = w ? y * w[i] : y;
    }
}

void cpu_op_rmsnorm_ref(const backend_op *op) {
    const tensor *x = &op->src[0], *w = &op->src[1], *d = &op->dst;
    const int64_t n = x->ne[0], nrows = tensor_nrows(x);
    for (int64_t ir = 0; ir < nrows; ir++) {
        cpu_rmsnorm_row_ref((float *)cpu_row_ptr(d, ir), (const float *)cpu_row_ptr(x, ir), (const float *)w->data, n,
                            op->f[0]);
    }
}

void cpu_rope_cache(float *cs, float p, float freq_base, int32_t n_rot) {
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = p;
    for (int32_t i = 0; i < n_rot / 2; i++) {
        cs[2 * i] = cosf(theta);
        cs[2 * i + 1] = sinf(theta);
        theta *= theta_scale;
    }
}

void cpu_rope_row(float *dr, const float *xr, const float *cs, int64_t hd, int32_t n_rot, bool norm) {
    const int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        const int32_t i0 = norm ? 2 * i : i, i1 = norm ? 2 * i + 1 : i + half;
        const float x0 = xr[i0], x1 = xr[i1];
        const float c = cs[2 * i], s = cs[2 * i + 1];
        dr[i0] = x0 * c - x1 * s;
        dr[i1] = x0 * s + x1 * c;
    }
    for (int64_t i = n_rot; i < hd; i++) dr[i] = xr[i];
}

void cpu_op_rope_neox_ref(const backend_op *op) {
    const tensor *x = &op->src[0], *pos = &op->src[1], *d = &op->dst;
    const int64_t hd = x->ne[0], nh = x->ne[1], nt = x->ne[2];
    const int32_t n_rot = op->i[0] == 0 ? (int32_t)hd : op->i[0];
    const bool norm = op->i[1] == 1; /* NORM mode (llama): adjacent pairs (2i, 2i+1) */
    float *cs = ref_alloc((size_t)n_rot * sizeof(float));
    for (int64_t it = 0; it < nt; it++) {
        int32_t p;
        memcpy(&p, (const char *)pos->data + (size_t)it * pos->nb[0], 4);
        cpu_rope_cache(cs, (float)p, op->f[0], n_rot);
        for (int64_t ih = 0; ih < nh; ih++) {
            const float *xr = (const float *)elem_ptr(x, 0, ih, it, 0);
            float *dr = (float *)elem_ptr(d, 0, ih, it, 0);
            cpu_rope_row(dr, xr, cs, hd, n_rot, norm);
        }
    }
    free(cs);
}

void cpu_softmax_row_ref(float *p, const float *s, int64_t n) {
    float max = -INFINITY;
    bool bad = false;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] > max) max = s[i];
        bad |= !(s[i] < INFINITY); /* NaN or +Inf */
    }
    if (bad) { /* a NaN or +Inf score is not a probability: the row is NaN (never hidden) */
        for (int64_t i = 0; i < n; i++) p[i] = NAN;
        return;
    }
    if (max == -INFINITY) {
        for (int64_t i = 0; i < n; i++) p[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - max);
        p[i] = e;
        sum += (double)e;
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) p[i] *= inv;
}

void cpu_op_attention_ref(const backend_op *op) {
    const tensor *q = &op->src[0], *k = &op->src[1], *v = &op->src[2], *mask = &op->src[3], *d = &op->dst;
    const int64_t hd = q->ne[0], nh = q->ne[1], nq = q->ne[2];
    const int64_t nh_kv = k->ne[1], n_kv = k->ne[2], hd_v = v->ne[0];
    const int64_t group = nh / nh_kv;
    const float scale = op->f[0] != 0.0f ? op->f[0] : 1.0f / sqrtf((float)hd);
    float *qv = ref_alloc((size_t)hd * sizeof(float));
    float *s = ref_alloc((size_t)n_kv * sizeof(float));
    float *p = ref_alloc((size_t)n_kv * sizeof(float));
    double *acc = ref_alloc((size_t)hd_v * sizeof(double));
    const int32_t kind = op->i[0];
    for (int64_t iq = 0; iq < nq; iq++) {
        /* a mask tensor's row, or the cells [0, n_vis) a structured kind shows this row */
        const float *mrow = kind == BACKEND_ATTN_MASK ? (const float *)elem_ptr(mask, 0, iq, 0, 0) : NULL;
        const int64_t n_vis = kind == BACKEND_ATTN_MASK ? n_kv : backend_attn_n_visible(kind, iq, nq, n_kv);
        for (int64_t h = 0; h < nh; h++) {
            const int64_t hk = h / group;
            const float *qr = (const float *)elem_ptr(q, 0, h, iq, 0);
            for (int64_t i = 0; i < hd; i++) {
                qv[i] = k->type == QUANT_TYPE_F16 ? fp16_to_fp32(fp32_to_fp16(qr[i])) : qr[i];
            }
            for (int64_t j = 0; j < n_kv; j++) {
                const float mv = mrow != NULL ? mrow[j] : j < n_vis ? 0.0f : -INFINITY;
                if (mv == -INFINITY) {
                    s[j] = -INFINITY;
                    continue;
                }
                double dot = 0.0;
                for (int64_t i = 0; i < hd; i++) {
                    dot += (double)qv[i] * (double)load_elem(k->type, elem_ptr(k, i, hk, j, 0));
                }
                s[j] = (float)dot * scale + mv;
            }
            cpu_softmax_row_ref(p, s, n_kv);
            for (int64_t i = 0; i < hd_v; i++) acc[i] = 0.0;
            for (int64_t j = 0; j < n_kv; j++) {
                if (p[j] == 0.0f) continue;
                const float pj = v->type == QUANT_TYPE_F16 ? fp16_to_fp32(fp32_to_fp16(p[j])) : p[j];
                for (int64_t i = 0; i < hd_v; i++) {
                    acc[i] += (double)pj * (double)load_elem(v->type, elem_ptr(v, i, hk, j, 0));
                }
            }
            float *dr = (float *)elem_ptr(d, 0, h, iq, 0);
            for (int64_t i = 0; i < hd_v; i++) dr[i] = (float)acc[i];
        }
    }
    free(acc);
    free(p);
    free(s);
    free(qv);
}

void cpu_op_set_rows_ref(const backend_op *op) {
    const tensor *src = &op->src[0], *idx = &op->src[1], *d = &op->dst;
    for (int64_t r = 0; r < src->ne[1]; r++) {
        const int64_t id = cpu_load_index(idx, r);
        if (id < 0 || id >= d->ne[1]) error_abort(__FILE__, __LINE__, "op set_rows: row index out of range");
        const float *sr = (const float *)((const char *)src->data + (size_t)r * src->nb[1]);
        for (int64_t i = 0; i < src->ne[0]; i++) store_elem(d->type, elem_ptr(d, i, id, 0, 0), sr[i]);
    }
}

void cpu_op_get_rows_ref(const backend_op *op) {
    const tensor *src = &op->src[0], *idx = &op->src[1], *d = &op->dst;
    for (int64_t r = 0; r < d->ne[1]; r++) {
        const int64_t id = cpu_load_index(idx, r);
        if (id < 0 || id >= src->ne[1]) error_abort(__FILE__, __LINE__, "op get_rows: row index out of range");
        bool ok = quant_dequantize_row(src->type, (const char *)src->data + (size_t)id * src->nb[1],
                                       (float *)((char *)d->data + (size_t)r * d->nb[1]), src->ne[0]);
        DFL_ASSERT(ok);
    }
}

static void binary_ref(const backend_op *op, int mul) {
    const tensor *a = &op->src[0], *b = &op->src[1], *d = &op->dst;
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    const float av = *(const float *)elem_ptr(a, i0, i1, i2, i3);
                    const float bv = *(const float *)elem_ptr(b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2],
                                                              i3 % b->ne[3]);
                    *(float *)elem_ptr(d, i0, i1, i2, i3) = mul ? av * bv : av + bv;
                }
}

void cpu_op_add_ref(const backend_op *op) { binary_ref(op, 0); }
void cpu_op_mul_ref(const backend_op *op) { binary_ref(op, 1); }

float cpu_silu_ref(float x) { return x / (1.0f + expf(-x)); }

void cpu_swiglu_row_ref(float *d, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = cpu_silu_ref(g[i]) * u[i];
}

void cpu_add_row_ref(float *d, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = a[i] + b[i];
}

void cpu_mul_row_ref(float *d, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = a[i] * b[i];
}

int32_t cpu_argmax_row_ref(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return (int32_t)(-1 - i); /* the first NaN/Inf, flagged */
    }
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = (int32_t)i;
    }
    return best;
}

void cpu_f16_row_ref(uint16_t *d, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = fp32_to_fp16(x[i]);
}

void cpu_op_swiglu_ref(const backend_op *op) {
    const tensor *g = &op->src[0], *u = &op->src[1], *d = &op->dst;
    for (int64_t ir = 0; ir < tensor_nrows(g); ir++) {
        const float *gr = (const float *)cpu_row_ptr(g, ir), *ur = (const float *)cpu_row_ptr(u, ir);
        cpu_swiglu_row_ref((float *)cpu_row_ptr(d, ir), gr, ur, g->ne[0]);
    }
}

void cpu_op_scale_ref(const backend_op *op) {
    const tensor *a = &op->src[0], *d = &op->dst;
    for (int64_t ir = 0; ir < tensor_nrows(a); ir++) {
        const float *ar = (const float *)cpu_row_ptr(a, ir);
        float *dr = (float *)cpu_row_ptr(d, ir);
        for (int64_t i = 0; i < a->ne[0]; i++) dr[i] = ar[i] * op->f[0];
    }
}

void cpu_op_copy_ref(const backend_op *op) {
    const tensor *s = &op->src[0], *d = &op->dst;
    for (int64_t i3 = 0; i3 < s->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < s->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < s->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < s->ne[0]; i0++) {
                    store_elem(d->type, elem_ptr(d, i0, i1, i2, i3), load_elem(s->type, elem_ptr(s, i0, i1, i2, i3)));
                }
}

void cpu_op_softmax_ref(const backend_op *op) {
    const tensor *a = &op->src[0], *d = &op->dst;
    float *tmp = ref_alloc((size_t)a->ne[0] * sizeof(float));
    for (int64_t ir = 0; ir < tensor_nrows(a); ir++) {
        cpu_softmax_row_ref(tmp, (const float *)cpu_row_ptr(a, ir), a->ne[0]);
        memcpy(cpu_row_ptr(d, ir), tmp, (size_t)a->ne[0] * sizeof(float));
    }
    free(tmp);
}

void cpu_op_argmax_ref(const backend_op *op) {
    const tensor *a = &op->src[0], *d = &op->dst;
    for (int64_t r = 0; r < a->ne[1]; r++) {
        const float *ar = (const float *)((const char *)a->data + (size_t)r * a->nb[1]);
        int32_t *dr = (int32_t *)elem_ptr(d, r, 0, 0, 0);
        *dr = cpu_argmax_row_ref(ar, a->ne[0]);
    }
}

/* matmul into a temporary [n_out, n_rows], times the scale, argmax per row: the three ops' references */
void cpu_op_matmul_argmax_ref(const backend_op *op) {
    const tensor *w = &op->src[0], *x = &op->src[1], *d = &op->dst;
    const int64_t n_out = w->ne[1], n_rows = x->ne[1];
    float *logits = ref_alloc((size_t)n_out * (size_t)n_rows * sizeof(float));
    backend_op mm;
    memset(&mm, 0, sizeof(mm));
    mm.kind = BACKEND_OP_MATMUL;
    mm.src[0] = *w;
    mm.src[1] = *x;
    mm.dst = tensor_2d(QUANT_TYPE_F32, logits, n_out, n_rows);
    cpu_op_matmul_ref(&mm);
    for (int64_t r = 0; r < n_rows; r++) {
        float *lr = logits + r * n_out;
        for (int64_t o = 0; o < n_out; o++) lr[o] = lr[o] * op->f[0];
        *(int32_t *)elem_ptr(d, r, 0, 0, 0) = cpu_argmax_row_ref(lr, n_out);
        if (op->src[2].data != NULL) {
            for (int64_t o = 0; o < n_out; o++) *(float *)elem_ptr(&op->src[2], o, r, 0, 0) = lr[o];
        }
    }
    free(logits);
}

void cpu_op_ref(const backend_op *op) {
    switch (op->kind) {
    case BACKEND_OP_MATMUL: cpu_op_matmul_ref(op); break;
    case BACKEND_OP_RMSNORM: cpu_op_rmsnorm_ref(op); break;
    case BACKEND_OP_ROPE_NEOX: cpu_op_rope_neox_ref(op); break;
    case BACKEND_OP_ATTENTION: cpu_op_attention_ref(op); break;
    case BACKEND_OP_SET_ROWS: cpu_op_set_rows_ref(op); break;
    case BACKEND_OP_GET_ROWS: cpu_op_get_rows_ref(op); break;
    case BACKEND_OP_ADD: cpu_op_add_ref(op); break;
    case BACKEND_OP_MUL: cpu_op_mul_ref(op); break;
    case BACKEND_OP_SWIGLU: cpu_op_swiglu_ref(op); break;
    case BACKEND_OP_SCALE: cpu_op_scale_ref(op); break;
    case BACKEND_OP_COPY: cpu_op_copy_ref(op); break;
    case BACKEND_OP_SOFTMAX: cpu_op_softmax_ref(op); break;
    case BACKEND_OP_ARGMAX: cpu_op_argmax_ref(op); break;
    case BACKEND_OP_MATMUL_ARGMAX: cpu_op_matmul_argmax_ref(op); break;
    case BACKEND_OP_WRITE: memcpy(op->dst.data, op->host, op->size); break;
    case BACKEND_OP_READ: memcpy(op->host, op->src[0].data, op->size); break;
    case BACKEND_OP_NONE:
    case BACKEND_OP_COUNT: DFL_ASSERT(0 && "cpu_op_ref: bad kind");
    }
}
