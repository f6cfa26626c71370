/* cpu_bench.c: the matmul and attention micro-benchmarks (see cpu_bench.h): random weights of any matmul type,
 * optional cycling through copies bigger than the caches, median of n_iter timed runs. */
#include "backend/cpu/cpu_bench.h"
#include "base/error.h"
#include "base/fp16.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Random but valid blocks: every f16 scale finite and small, other bytes random. */
static void fill_weight(uint8_t *w, uint32_t type, size_t bytes, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < bytes; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (uint8_t)(s >> 56);
    }
    const uint16_t d = fp32_to_fp16(0.01f);
    const size_t bs = quant_type_get(type)->type_size;
    for (size_t off = 0; off + bs <= bytes; off += bs) {
        switch (type) {
        case QUANT_TYPE_Q8_0: case QUANT_TYPE_Q4_0: memcpy(w + off, &d, 2); break;
        case QUANT_TYPE_Q4_K: memcpy(w + off, &d, 2); memcpy(w + off + 2, &d, 2); break;
        case QUANT_TYPE_Q6_K: memcpy(w + off + 208, &d, 2); break;
        case QUANT_TYPE_Q5_0: case QUANT_TYPE_IQ4_NL: case QUANT_TYPE_IQ4_XS: memcpy(w + off, &d, 2); break;
        case QUANT_TYPE_Q4_1: case QUANT_TYPE_Q5_1: case QUANT_TYPE_Q5_K:
            memcpy(w + off, &d, 2); memcpy(w + off + 2, &d, 2); break;
        case QUANT_TYPE_Q2_K: memcpy(w + off + 80, &d, 2); memcpy(w + off + 82, &d, 2); break;
        case QUANT_TYPE_Q3_K: memcpy(w + off + 108, &d, 2); break;
        case QUANT_TYPE_F16: memcpy(w + off, &d, 2); break;
        case QUANT_TYPE_BF16: { uint16_t b = fp32_to_bf16(0.01f); memcpy(w + off, &b, 2); break; }
        case QUANT_TYPE_F32: { float f = 0.01f; memcpy(w + off, &f, 4); break; }
        default: break;
        }
    }
}

dfl_status backend_bench_matmul(backend *be, uint32_t wtype, int64_t n_in, int64_t n_out, int64_t n_rows, int n_iter,
                                bool cold, backend_bench_result *res, dfl_error *err) {
    memset(res, 0, sizeof(*res));
    if (!backend_matmul_type_supported(wtype) || n_in <= 0 || n_out <= 0 || n_rows <= 0 || n_iter <= 0 ||
        n_in % quant_type_get(wtype)->blck_size != 0) {
        return error_set(err, DFL_ERR_INVALID, "bench matmul: bad arguments (type %u, %lld x %lld x %lld)", wtype,
                         (long long)n_in, (long long)n_out, (long long)n_rows);
    }
    const size_t row = quant_row_size(wtype, n_in);
    const size_t wbytes = row * (size_t)n_out;
    /* the weight as a model's matmul reads it: packed where the backend packs this type at load
     * (backend_weight_pack), else the plain rows; stride = the bytes of one copy, 64-aligned */
    uint8_t *plain = aligned_alloc(64, (wbytes + 63) & ~(size_t)63);
    if (plain == NULL) return error_set(err, DFL_ERR_NOMEM, "bench matmul: out of memory (%zu bytes of weights)", wbytes);
    tensor tw0 = tensor_2d(wtype, plain, n_in, n_out);
    const size_t psize = backend_weight_pack_size(be, &tw0);
    const size_t copy_bytes = psize > 0 ? psize : wbytes, stride = (copy_bytes + 63) & ~(size_t)63;
    if (psize == 0) { /* plain copies are filled in place */
        free(plain);
        plain = NULL;
    }
    int n_copies = 1;
    if (cold) {
        const size_t target = (size_t)512 << 20;
        n_copies = (int)((target + copy_bytes - 1) / copy_bytes);
        if (n_copies < 2) n_copies = 2;
    }
    uint8_t *w = aligned_alloc(64, stride * (size_t)n_copies);
    tensor *tw = malloc((size_t)n_copies * sizeof(tensor));
    /* x | y in one backend buffer, as a model's activations are (huge pages when large: the
     * output rows' stores then meet the TLB as in a forward pass) */
    const size_t x_bytes = ((size_t)(n_in * n_rows) * sizeof(float) + 63) & ~(size_t)63;
    backend_buffer *xy = backend_buffer_alloc(be, x_bytes + (size_t)(n_out * n_rows) * sizeof(float), err);
    float *x = xy != NULL ? (float *)backend_buffer_base(xy) : NULL;
    float *y = xy != NULL ? (float *)((char *)backend_buffer_base(xy) + x_bytes) : NULL;
    double *t = malloc((size_t)n_iter * sizeof(double));
    backend_queue *q = backend_queue_new(be, err);
    if (w == NULL || tw == NULL || xy == NULL || t == NULL || q == NULL) {
        free(plain); free(w); free(tw); free(t);
        if (xy != NULL) backend_buffer_free(xy);
        backend_queue_free(q);
        return error_set(err, DFL_ERR_NOMEM, "bench matmul: out of memory (%zu bytes of weights, %zu of rows and outputs)",
                         stride * (size_t)n_copies, x_bytes + (size_t)(n_out * n_rows) * sizeof(float));
    }
    for (int c = 0; c < n_copies; c++) {
        uint8_t *dst = w + stride * (size_t)c;
        fill_weight(psize > 0 ? plain : dst, wtype, wbytes, 1234u + (unsigned)c);
        if (psize > 0) {
            tw[c] = backend_weight_pack(be, &tw0, dst);
        } else {
            tw[c] = tensor_2d(wtype, dst, n_in, n_out);
        }
    }
    free(plain);
    for (int64_t i = 0; i < n_in * n_rows; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * 0.001f;
    tensor tx = tensor_2d(QUANT_TYPE_F32, x, n_in, n_rows);
    tensor ty = tensor_2d(QUANT_TYPE_F32, y, n_out, n_rows);
    for (int it = -2; it < n_iter; it++) {
        const double t0 = now_ms();
        op_matmul(q, ty, tw[(it + 2) % n_copies], tx);
        backend_queue_synchronize(q);
        if (it >= 0) t[it] = now_ms() - t0;
    }
    qsort(t, (size_t)n_iter, sizeof(double), cmp_double);
    res->ms = t[n_iter / 2];
    res->ms_min = t[0];
    res->w_bytes = copy_bytes;
    res->gbps = (double)copy_bytes / (res->ms * 1e-3) * 1e-9;
    res->gops = 2.0 * (double)n_in * (double)n_out * (double)n_rows / (res->ms * 1e-3) * 1e-9;
    res->n_copies = n_copies;
    res->packed = psize > 0;
    backend_queue_free(q);
    free(w); free(tw); free(t);
    backend_buffer_free(xy);
    return DFL_OK;
}

dfl_status backend_bench_attention(backend *be, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_q,
                                   int64_t n_kv, int n_iter, backend_bench_result *res, dfl_error *err) {
    memset(res, 0, sizeof(*res));
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || head_dim <= 0 || n_q <= 0 || n_kv < n_q ||
        n_iter <= 0) {
        return error_set(err, DFL_ERR_INVALID, "bench attention: bad arguments (%lld heads, %lld kv heads, dim %lld, "
                         "%lld queries, %lld cells)", (long long)n_head, (long long)n_head_kv, (long long)head_dim,
                         (long long)n_q, (long long)n_kv);
    }
    /* q [head_dim, n_head, n_q] f32 | k, v [head_dim, n_head_kv, n_kv] f16 | out [head_dim, n_head, n_q] f32 */
    const size_t q_bytes = ((size_t)(head_dim * n_head * n_q) * sizeof(float) + 63) & ~(size_t)63;
    const size_t kv_bytes = ((size_t)(head_dim * n_head_kv * n_kv) * sizeof(uint16_t) + 63) & ~(size_t)63;
    backend_buffer *buf = backend_buffer_alloc(be, 2 * q_bytes + 2 * kv_bytes, err);
    double *t = malloc((size_t)n_iter * sizeof(double));
    backend_queue *q = backend_queue_new(be, err);
    if (buf == NULL || t == NULL || q == NULL) {
        if (buf != NULL) backend_buffer_free(buf);
        free(t);
        backend_queue_free(q);
        return error_set(err, DFL_ERR_NOMEM, "bench attention: out of memory (%zu bytes)", 2 * q_bytes + 2 * kv_bytes);
    }
    char *base = backend_buffer_base(buf);
    float *qd = (float *)base;
    uint16_t *kd = (uint16_t *)(base + q_bytes), *vd = (uint16_t *)(base + q_bytes + kv_bytes);
    float *od = (float *)(base + q_bytes + 2 * kv_bytes);
    uint64_t s = 99;
    for (int64_t i = 0; i < head_dim * n_head * n_q; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        qd[i] = (float)((int64_t)(s >> 40) % 2001 - 1000) * 0.001f;
    }
    for (int64_t i = 0; i < head_dim * n_head_kv * n_kv; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        kd[i] = fp32_to_fp16((float)((int64_t)(s >> 40) % 2001 - 1000) * 0.001f);
        vd[i] = fp32_to_fp16((float)((int64_t)(s >> 20) % 2001 - 1000) * 0.001f);
    }
    const tensor tq = tensor_3d(QUANT_TYPE_F32, qd, head_dim, n_head, n_q);
    const tensor tk = tensor_3d(QUANT_TYPE_F16, kd, head_dim, n_head_kv, n_kv);
    const tensor tv = tensor_3d(QUANT_TYPE_F16, vd, head_dim, n_head_kv, n_kv);
    const tensor to = tensor_3d(QUANT_TYPE_F32, od, head_dim, n_head, n_q);
    for (int it = -2; it < n_iter; it++) {
        const double t0 = now_ms();
        op_attention_structured(q, to, tq, tk, tv, BACKEND_ATTN_CAUSAL, 0.0f);
        backend_queue_synchronize(q);
        if (it >= 0) t[it] = now_ms() - t0;
    }
    qsort(t, (size_t)n_iter, sizeof(double), cmp_double);
    res->ms = t[n_iter / 2];
    res->ms_min = t[0];
    res->w_bytes = 2 * (size_t)(head_dim * n_head_kv * n_kv) * sizeof(uint16_t);
    res->gbps = (double)res->w_bytes / (res->ms * 1e-3) * 1e-9;
    /* causal: query row iq sees n_kv - n_q + iq + 1 cells; 2 flops per multiply-add, Q K^T and P V */
    const double cells = (double)n_q * (double)(n_kv - n_q) + (double)n_q * (double)(n_q + 1) / 2.0;
    res->gops = 4.0 * (double)head_dim * (double)n_head * cells / (res->ms * 1e-3) * 1e-9;
    res->n_copies = 1;
    backend_queue_free(q);
    free(t);
    backend_buffer_free(buf);
    return DFL_OK;
}
