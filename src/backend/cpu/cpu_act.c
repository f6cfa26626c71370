/* cpu_act.c: matmul activation preparation, scalar reference versions. Each weight type has a
 * dot type; the activation rows are converted to it once per matmul, exactly as llama.cpp's x86
 * build does, so that the integer dot products see the same values:
 * - Q8_0 (for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL weights): per 32 values amax, d = amax / 127 stored as f16,
 *   q = round_half_even(x * (127 / amax)) (ggml's AVX quantize_row_q8_0). Not in ggml: a block with a NaN
 *   or Inf gets d = NaN, q = 0 (its dot products are NaN, which the context reports), and a block
 *   with amax < CPU_Q8_0_AMAX_MIN gets q = 0 (its f16 d is 0 anyway; 127 / amax would overflow).
 * - Q8_K (for Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS weights): per 256 values max = the value of largest magnitude (first),
 *   iscale = -127 / max, q = min(127, nearest_int(iscale * x)), d = 1 / iscale (f32), and the sums
 *   of each 16 q (ggml's quantize_row_q8_K_ref, which x86 uses), then of each 32 (pairs of those;
 *   cpu_act_q8_K_sums32, the last step of every Q8_K producer), and a biased copy q + 128 (qsu,
 *   written beside q).
 * - f16 / bf16 (for F16 / BF16 weights): x rounded to the type (nearest even), kept as f32.
 * - bf16 tiles (for F16 / BF16 weights packed as P16_X16, AMX-BF16): the same rounded value as bf16
 *   pairs, rows padded with zeros to a multiple of 32: BF16 as is (th; tl unused); F16's 11 significant bits
 *   as th = the f32's top 16 bits and tl = the rest (v - th: at most 3 bits, exact as bf16), so
 *   that th + tl = v and the tile products meet exactly the f16 value (docs/quantization.md). */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/fp16.h"
#include "backend/cpu/cpu_ops_ref.h"

#include <math.h>
#include <string.h>

cpu_dot_type cpu_dot_type_of(uint32_t wtype) {
    switch (wtype) {
    case QUANT_TYPE_Q8_0:
    case QUANT_TYPE_Q4_0:
    case QUANT_TYPE_Q4_1:
    case QUANT_TYPE_Q5_0:
    case QUANT_TYPE_Q5_1:
    case QUANT_TYPE_IQ4_NL: return CPU_DOT_Q8_0;
    case QUANT_TYPE_Q2_K:
    case QUANT_TYPE_Q3_K:
    case QUANT_TYPE_Q4_K:
    case QUANT_TYPE_Q5_K:
    case QUANT_TYPE_Q6_K:
    case QUANT_TYPE_IQ4_XS: return CPU_DOT_Q8_K;
    default: return CPU_DOT_F32;
    }
}

cpu_dot_type cpu_dot_type_of_weight(const tensor *w) {
    return w->layout == TENSOR_LAYOUT_P16_X16 ? CPU_DOT_BF16T : cpu_dot_type_of(w->type);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t cpu_act_bytes(cpu_dot_type dot, int64_t n_in, int64_t n_rows) {
    const size_t n = (size_t)n_in * (size_t)n_rows;
    switch (dot) {
    case CPU_DOT_F32: return align64(n * sizeof(float));
    case CPU_DOT_Q8_0: {
        const size_t np = (size_t)cpu_q8_0_row_pad(n_in) * (size_t)n_rows;
        return align64(np) + 2 * align64(np / QK8_0 * sizeof(float));
    }
    case CPU_DOT_Q8_K:
        return align64(n) + align64(n / QK_K * sizeof(float)) + align64(n / 16 * sizeof(int16_t)) +
               align64(n / 32 * sizeof(int16_t)) + align64(n);
    case CPU_DOT_BF16T: return 2 * align64((size_t)tensor_p16_x16_n_pad(n_in) * (size_t)n_rows * sizeof(uint16_t));
    }
    return 0;
}

void cpu_act_layout(cpu_act *act, cpu_dot_type dot, int64_t n_in, int64_t n_rows, void *mem) {
    memset(act, 0, sizeof(*act));
    act->dot = dot;
    act->n_in = n_in;
    act->n_rows = n_rows;
    act->row_len = n_in;
    act->pf_l1_rows = 2;
    const size_t n = (size_t)n_in * (size_t)n_rows;
    char *p = mem;
    switch (dot) {
    case CPU_DOT_F32:
        act->f = (float *)p;
        break;
    case CPU_DOT_Q8_0: {
        act->row_len = cpu_q8_0_row_pad(n_in);
        const size_t np = (size_t)act->row_len * (size_t)n_rows;
        act->qs = (int8_t *)p;
        act->d = (float *)(p + align64(np));
        act->ns = (int32_t *)(p + align64(np) + align64(np / QK8_0 * sizeof(float)));
        break;
    }
    case CPU_DOT_Q8_K:
        act->qs = (int8_t *)p;
        act->d = (float *)(p + align64(n));
        act->bsums = (int16_t *)(p + align64(n) + align64(n / QK_K * sizeof(float)));
        act->bsums32 = (int16_t *)((char *)act->bsums + align64(n / 16 * sizeof(int16_t)));
        act->qsu = (uint8_t *)((char *)act->bsums32 + align64(n / 32 * sizeof(int16_t)));
        break;
    case CPU_DOT_BF16T:
        act->row_len = tensor_p16_x16_n_pad(n_in);
        act->th = (uint16_t *)p;
        act->tl = (uint16_t *)(p + align64((size_t)act->row_len * (size_t)n_rows * sizeof(uint16_t)));
        break;
    }
}

void cpu_act_row_f16_ref(cpu_act *act, int64_t r, const float *x) {
    float *f = act->f + r * act->n_in;
    for (int64_t i = 0; i < act->n_in; i++) f[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
}

void cpu_act_row_bf16_ref(cpu_act *act, int64_t r, const float *x) {
    float *f = act->f + r * act->n_in;
    for (int64_t i = 0; i < act->n_in; i++) f[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

/* Row r of a CPU_DOT_BF16T act from the rounded values v (F16: th and tl; BF16: th). */
static void act_row_tile_ref(cpu_act *act, int64_t r, const float *x, bool f16) {
    uint16_t *th = act->th + r * act->row_len, *tl = act->tl + r * act->row_len;
    for (int64_t i = 0; i < act->row_len; i++) {
        if (i >= act->n_in) {
            th[i] = 0;
            if (f16) tl[i] = 0;
            continue;
        }
        const float v = f16 ? fp16_to_fp32(fp32_to_fp16(x[i])) : bf16_to_fp32(fp32_to_bf16(x[i]));
        uint32_t u;
        memcpy(&u, &v, 4);
        th[i] = (uint16_t)(u >> 16);
        const float h = bf16_to_fp32(th[i]), l = v - h; /* exact: v has 11 significant bits */
        memcpy(&u, &l, 4);
        if (f16) tl[i] = isfinite(v) ? (uint16_t)(u >> 16) : 0; /* Inf: th alone (Inf - Inf would be NaN) */
    }
}

void cpu_act_row_f16_tile_ref(cpu_act *act, int64_t r, const float *x) { act_row_tile_ref(act, r, x, true); }
void cpu_act_row_bf16_tile_ref(cpu_act *act, int64_t r, const float *x) { act_row_tile_ref(act, r, x, false); }

void cpu_act_row_q8_0_ref(cpu_act *act, int64_t r, const float *x) {
    const int64_t nb = act->n_in / QK8_0, nb_pad = act->row_len / QK8_0;
    int8_t *qs = act->qs + r * act->row_len;
    float *d = act->d + r * nb_pad;
    int32_t *ns = act->ns + r * nb_pad;
    for (int64_t b = 0; b < nb_pad; b++) {
        if (b >= nb) { /* padding block */
            for (int j = 0; j < QK8_0; j++) qs[cpu_q8_0_offset(b * QK8_0 + j)] = 0;
            d[b] = 0.0f;
            ns[b] = 0;
            continue;
        }
        const float *xb = x + b * QK8_0;
        float amax = 0.0f;
        bool bad = false;
        for (int j = 0; j < QK8_0; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
            bad |= !isfinite(xb[j]);
        }
        if (bad) { /* a NaN / Inf input: the block's scale is NaN, so every dot with it is NaN */
            for (int j = 0; j < QK8_0; j++) qs[cpu_q8_0_offset(b * QK8_0 + j)] = 0;
            d[b] = NAN;
            ns[b] = 0;
            continue;
        }
        const float db = amax / 127.0f;
        const float id = amax >= CPU_Q8_0_AMAX_MIN ? 127.0f / amax : 0.0f;
        d[b] = fp16_to_fp32(fp32_to_fp16(db));
        int32_t sum = 0;
        for (int j = 0; j < QK8_0; j++) {
            const int8_t q = (int8_t)rintf(xb[j] * id);
            qs[cpu_q8_0_offset(b * QK8_0 + j)] = q;
            sum += q;
        }
        ns[b] = -sum;
    }
}

/* ggml's nearest_int: round half to even through the f32 mantissa (|v| < 2^22). */
static inline int nearest_int(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

void cpu_act_row_q8_K_ref(cpu_act *act, int64_t r, const float *x) {
    const int64_t nb = act->n_in / QK_K;
    int8_t *qs = act->qs + r * act->n_in;
    float *d = act->d + r * nb;
    int16_t *bsums = act->bsums + r * (act->n_in / 16);
    uint8_t *qu = act->qsu + r * act->n_in;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK_K;
        int8_t *qb = qs + b * QK_K;
        uint8_t *qub = qu + b * QK_K;
        float max = 0.0f, amax = 0.0f;
        bool bad = false;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(xb[j]);
            bad |= !isfinite(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (bad || amax < CPU_Q8_0_AMAX_MIN) { /* NaN / Inf: d = NaN (every dot with it is NaN); tiny: d = 0 */
            d[b] = bad ? NAN : 0.0f;
            memset(qb, 0, QK_K);
            memset(qub, 128, QK_K);
            for (int j = 0; j < QK_K / 16; j++) bsums[b * (QK_K / 16) + j] = 0;
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = nearest_int(iscale * xb[j]);
            qb[j] = (int8_t)(v < 127 ? v : 127);
            qub[j] = (uint8_t)(qb[j] + 128); /* -127..127 -> 1..255 */
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += qb[j * 16 + l];
            bsums[b * (QK_K / 16) + j] = (int16_t)sum;
        }
        d[b] = 1.0f / iscale;
    }
    cpu_act_q8_K_sums32(act, r);
}

void cpu_act_q8_K_sums32(cpu_act *act, int64_t r) {
    const int16_t *bs = act->bsums + r * (act->n_in / 16);
    int16_t *b32 = act->bsums32 + r * (act->n_in / 32);
    for (int64_t j = 0; j < act->n_in / 32; j++) b32[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]); /* |sum| <= 32 * 127 */
}

size_t cpu_act_row_hot_bytes(cpu_dot_type dot, int64_t n_in) {
    return cpu_act_bytes(dot, n_in, 1) - (dot == CPU_DOT_Q8_K ? align64((size_t)n_in) : 0);
}

static void act_row_f32_copy(cpu_act *act, int64_t r, const float *x) {
    memcpy(act->f + r * act->n_in, x, (size_t)act->n_in * sizeof(float));
}

/* ---- the scalar kernel set ---------------------------------------------------------------- */

static void matmul_q_ref_f32(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                             float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    cpu_matmul_q_ref(QUANT_TYPE_F32, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);
}
static void matmul_q_ref_f16(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                             float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    cpu_matmul_q_ref(QUANT_TYPE_F16, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);
}
static void matmul_q_ref_bf16(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                              float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    cpu_matmul_q_ref(QUANT_TYPE_BF16, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);
}
static void matmul_q_ref_q8_0(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                              float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    cpu_matmul_q_ref(QUANT_TYPE_Q8_0, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);
}
static void matmul_q_ref_q4_0(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                              float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    cpu_matmul_q_ref(QUANT_TYPE_Q4_0, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);
}
static void matmul_q_ref_q4_K(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                              float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    cpu_matmul_q_ref(QUANT_TYPE_Q4_K, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);
}
static void matmul_q_ref_q6_K(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                              float *dst, int64_t dst_stride, int64_t o0, int64_t o1) {
    cpu_matmul_q_ref(QUANT_TYPE_Q6_K, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);
}

static float dot_f16_ref(const float *x, const uint16_t *y, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * fp16_to_fp32(y[i]);
    return sum;
}

static void axpy_f16_ref(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * fp16_to_fp32(x[i]);
}

static int64_t attn_pv_f16_ref(float *out, int64_t ldo, const float *p, int64_t ldp, int64_t nq, const void *v,
                               size_t v_nb, int64_t n_kv, int64_t hd, int64_t n_fin, bool acc) {
    for (int64_t r = 0; r < nq; r++) {
        float *o = out + r * ldo;
        if (!acc)
            for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
        for (int64_t j = 0; j < n_kv; j++) {
            if (p[r * ldp + j] == 0.0f) continue; /* a zero probability adds nothing, even to inf */
            const uint16_t *vr = (const uint16_t *)((const char *)v + (size_t)j * v_nb);
            for (int64_t i = 0; i < hd; i++) o[i] += p[r * ldp + j] * fp16_to_fp32(vr[i]);
        }
    }
    return n_fin; /* no check here */
}

void cpu_kernels_init_ref(cpu_kernels *k) {
    memset(k, 0, sizeof(*k));
    k->name = "scalar";
    k->matmul[QUANT_TYPE_F32] = matmul_q_ref_f32;
    k->matmul[QUANT_TYPE_F16] = matmul_q_ref_f16;
    k->matmul[QUANT_TYPE_BF16] = matmul_q_ref_bf16;
    k->matmul[QUANT_TYPE_Q8_0] = matmul_q_ref_q8_0;
    k->matmul[QUANT_TYPE_Q4_0] = matmul_q_ref_q4_0;
    k->matmul[QUANT_TYPE_Q4_K] = matmul_q_ref_q4_K;
    k->matmul[QUANT_TYPE_Q6_K] = matmul_q_ref_q6_K;
    k->matmul_packed[QUANT_TYPE_Q8_0] = cpu_matmul_q8_0_x16_ref;
    k->pack_layout[QUANT_TYPE_Q8_0] = TENSOR_LAYOUT_Q8_0_X16;
    k->act_row[QUANT_TYPE_F32] = act_row_f32_copy;
    k->act_row[QUANT_TYPE_F16] = cpu_act_row_f16_ref;
    k->act_row[QUANT_TYPE_BF16] = cpu_act_row_bf16_ref;
    k->act_row[QUANT_TYPE_Q8_0] = cpu_act_row_q8_0_ref;
    k->act_row[QUANT_TYPE_Q4_0] = cpu_act_row_q8_0_ref;
    k->act_row[QUANT_TYPE_Q4_K] = cpu_act_row_q8_K_ref;
    k->act_row[QUANT_TYPE_Q6_K] = cpu_act_row_q8_K_ref;
    k->dot_f16 = dot_f16_ref;
    k->axpy_f16 = axpy_f16_ref;
    k->softmax_row = cpu_softmax_row_ref;
    k->attn_pv_f16 = attn_pv_f16_ref;
    k->rmsnorm_row = cpu_rmsnorm_row_ref;
    k->swiglu_row = cpu_swiglu_row_ref;
    k->add_row = cpu_add_row_ref;
    k->mul_row = cpu_mul_row_ref;
    k->argmax_row = cpu_argmax_row_ref;
    k->f16_row = cpu_f16_row_ref;
    k->rope_row = cpu_rope_row;
    cpu_kernels_init_ext_ref(k);
}

void cpu_kernels_select(cpu_kernels *k, uint32_t features) {
    cpu_kernels_init_ref(k);
    k->pf_l1_rows = 2;
    k->attn_rows = 16;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("intel")) k->pf_l1_rows = 0;
    if (features & BACKEND_CPU_FEATURE_AVX2) {
        cpu_kernels_init_avx2(k);
        cpu_kernels_init_ext_avx2(k);
        cpu_kernels_init_light_avx2(k);
    }
    if ((features & BACKEND_CPU_FEATURE_AVX512) && (features & BACKEND_CPU_FEATURE_AVX512_VNNI)) {
        cpu_kernels_init_avx512(k);
        cpu_kernels_init_ext_avx512(k);
    }
    if ((features & BACKEND_CPU_FEATURE_AVX512) && (features & BACKEND_CPU_FEATURE_AVX512_VNNI) &&
        (features & BACKEND_CPU_FEATURE_AMX_INT8)) {
        k->matmul_packed[QUANT_TYPE_Q4_K] = cpu_mm_q4_K_x16_amx;
        k->pack_layout[QUANT_TYPE_Q4_K] = TENSOR_LAYOUT_KQ_X16;
        k->matmul_packed[QUANT_TYPE_Q6_K] = cpu_mm_q6_K_x16_amx;
        k->pack_layout[QUANT_TYPE_Q6_K] = TENSOR_LAYOUT_KQ_X16;
        k->name = "avx512+amx";
    }
    if ((features & BACKEND_CPU_FEATURE_AVX512) && (features & BACKEND_CPU_FEATURE_AVX512_VNNI) &&
        (features & BACKEND_CPU_FEATURE_AMX_BF16)) {
        k->matmul_packed[QUANT_TYPE_F16] = cpu_mm_f16_p16_amx;
        k->pack_layout[QUANT_TYPE_F16] = TENSOR_LAYOUT_P16_X16;
        k->act_row_packed[QUANT_TYPE_F16] = cpu_act_row_f16_tile_512;
        k->matmul_packed[QUANT_TYPE_BF16] = cpu_mm_bf16_p16_amx;
        k->pack_layout[QUANT_TYPE_BF16] = TENSOR_LAYOUT_P16_X16;
        k->act_row_packed[QUANT_TYPE_BF16] = cpu_act_row_bf16_tile_512;
        k->name = "avx512+amx";
    }
#else
    (void)features;
#endif
#ifdef ATTN_ROWS
    k->attn_rows = ATTN_ROWS;
#endif
}
