/* cpu_bench.h: matmul and attention micro-benchmark entry points (used by tests/bench/bench_ops.c, `make bench-ops`). */
#ifndef DFL_BACKEND_CPU_BENCH_H
#define DFL_BACKEND_CPU_BENCH_H

#include "backend/backend.h"

typedef struct backend_bench_result {
    double ms;        /* median time of one matmul */
    double ms_min;    /* fastest run */
    double gbps;      /* weight bytes read per second (median), GB/s */
    double gops;      /* 2 * n_in * n_out * n_rows per second (median), G/s */
    size_t w_bytes;   /* bytes of one weight matrix as the matmul reads it (packed or plain) */
    int n_copies;     /* weight copies cycled through (cold: > last-level cache) */
    bool packed;      /* the weight was packed as a model's is at load (backend_weight_pack) */
} backend_bench_result;

/* Times op_matmul of a random [n_in, n_out] weight of type wtype with n_rows random rows on be,
 * n_iter times after a warm-up. The weight is packed where be packs that type when it loads a
 * model (backend_weight_pack: the kernels a model's matmuls run), else used as plain rows.
 * cold: cycle through copies of the weight totalling >= 512 MiB so every run reads it from
 * memory; else the same copy (cache-resident if it fits). */
dfl_status backend_bench_matmul(backend *be, uint32_t wtype, int64_t n_in, int64_t n_out, int64_t n_rows, int n_iter,
                                bool cold, backend_bench_result *res, dfl_error *err);

/* Times one causal attention op (op_attention_structured, BACKEND_ATTN_CAUSAL: the n_q queries
 * are the last n_q of n_kv cells, as a verify or prefill batch after its context) over an F16 KV
 * cache [head_dim, n_head_kv, n_kv] on be, n_iter times after a warm-up. res->gbps counts the K and
 * V bytes (w_bytes) once, res->gops the 4 * head_dim flops of each visible (query head, cell) pair. */
dfl_status backend_bench_attention(backend *be, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_q,
                                   int64_t n_kv, int n_iter, backend_bench_result *res, dfl_error *err);

#endif
