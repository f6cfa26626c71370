/* cpu_ops_ref.h: scalar reference implementations of every backend op (plain loops, one thread,
 * f64 sums where a sum is long). They define what each op computes; the optimized executor is
 * tested against them. They run an op record directly (no queue) on host memory. */
#ifndef DFL_BACKEND_CPU_OPS_REF_H
#define DFL_BACKEND_CPU_OPS_REF_H

#include "backend/backend.h"

#include <string.h>

/* Runs any op with the reference implementations. */
void cpu_op_ref(const backend_op *op);

/* matmul with f32 activations and weights dequantized by quant_dequantize_row (f64 sums). */
void cpu_op_matmul_ref(const backend_op *op);
void cpu_op_matmul_argmax_ref(const backend_op *op);
void cpu_op_rmsnorm_ref(const backend_op *op);
void cpu_op_rope_neox_ref(const backend_op *op);
void cpu_op_attention_ref(const backend_op *op);
void cpu_op_set_rows_ref(const backend_op *op);
void cpu_op_get_rows_ref(const backend_op *op);
void cpu_op_add_ref(const backend_op *op);
void cpu_op_mul_ref(const backend_op *op);
void cpu_op_swiglu_ref(const backend_op *op);
void cpu_op_scale_ref(const backend_op *op);
void cpu_op_copy_ref(const backend_op *op);
void cpu_op_softmax_ref(const backend_op *op);
void cpu_op_argmax_ref(const backend_op *op);

/* Element access helpers shared with the optimized executor. */
static inline char *cpu_row_ptr(const tensor *t, int64_t ir) {
    const int64_t i1 = ir % t->ne[1];
    const int64_t i2 = (ir / t->ne[1]) % t->ne[2];
    const int64_t i3 = ir / (t->ne[1] * t->ne[2]);
    return (char *)t->data + (size_t)i1 * t->nb[1] + (size_t)i2 * t->nb[2] + (size_t)i3 * t->nb[3];
}

/* Entry i of an I32 or I64 index vector. */
static inline int64_t cpu_load_index(const tensor *idx, int64_t i) {
    const char *p = (const char *)idx->data + (size_t)i * idx->nb[0];
    if (idx->type == QUANT_TYPE_I64) {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The NEOX rope angles of one position, as llama.cpp computes them: theta_i = p * s^i with
 * s = freq_base^(-2/n_rot), accumulated by repeated f32 multiplication; cs[2i] = cos, cs[2i+1] = sin. */
void cpu_rope_cache(float *cs, float p, float freq_base, int32_t n_rot);
/* One head of one token rotated by the angles cs (cpu_rope_cache): pairs (i, i + n_rot/2), or
 * (2i, 2i+1) when norm; dims n_rot .. hd - 1 copied. dr may be xr. */
void cpu_rope_row(float *dr, const float *xr, const float *cs, int64_t hd, int32_t n_rot, bool norm);
/* silu(x) = x / (1 + e^-x) as llama.cpp computes it in f32. */
float cpu_silu_ref(float x);
/* The row kernels of the light ops (cpu_kernels' scalar versions; the ops above use them). */
void cpu_rmsnorm_row_ref(float *d, const float *x, const float *w, int64_t n, float eps);
void cpu_swiglu_row_ref(float *d, const float *g, const float *u, int64_t n);
void cpu_add_row_ref(float *d, const float *a, const float *b, int64_t n);
void cpu_mul_row_ref(float *d, const float *a, const float *b, int64_t n);
int32_t cpu_argmax_row_ref(const float *x, int64_t n);
void cpu_f16_row_ref(uint16_t *d, const float *x, int64_t n);
/* Row softmax of n scores s (already scaled and masked; -INFINITY = excluded) into p (f64 sum,
 * max-subtracted). A row with all scores -INFINITY gives zeros; a row with a NaN or +INFINITY
 * score gives NaN everywhere (broken inputs propagate, as in IEEE arithmetic, never hidden). */
void cpu_softmax_row_ref(float *p, const float *s, int64_t n);

#endif
