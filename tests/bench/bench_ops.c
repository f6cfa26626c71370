/* bench_ops.c: `make bench-ops`: matmul throughput of the CPU backend on the Qwen3-0.6B shapes
 * (weights read from memory: cycled copies > the caches, and cache-resident), 1 and 16 rows (F16 also 2-6),
 * in GB/s of weights and G(int)op/s, next to the machine limits given on the command line. The weights
 * are packed as a loaded model's are (column "layout"), so the rows time the kernels a model runs;
 * GB/s counts the bytes the kernel reads (a packed weight is up to 3% larger than its blocks).
 * Usage: bench_ops [n_threads (2)] [mem_GBps (34)] [int8_TOPS (1.87)] [n_shapes (all)] [first shape (0)]
 *        bench_ops attn [n_threads (2)]: causal attention over an F16 KV cache with the Qwen3-0.6B head
 *        shape (16 query heads, 8 kv heads, dim 128), 1-128 query rows after 128-4096 cells;
 *        bench_ops attn N_THREADS N_Q N_KV: that one row. */
#include "backend/backend.h"
#include "backend/cpu/cpu_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The attention table (bench_ops attn): one layer's attention op per row. */
static int bench_attention(backend *be, int64_t only_nq, int64_t only_nkv) {
    printf("%-5s %6s %9s %9s %9s %8s\n", "n_q", "n_kv", "ms", "ms min", "KV GB/s", "GFLOP/s");
    int64_t nq_list[4] = {1, 16, 64, 128}, nkv_list[4] = {128, 512, 1024, 4096};
    if (only_nq > 0) { /* one row */
        nq_list[0] = only_nq;
        nkv_list[0] = only_nkv - only_nq;
    }
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++) {
            backend_bench_result r;
            dfl_error err;
            memset(&err, 0, sizeof(err));
            const int64_t nkv = nkv_list[b] + nq_list[a];
            if (only_nq > 0 && (only_nq != nq_list[a] || only_nkv != nkv)) continue;
            if (backend_bench_attention(be, 16, 8, 128, nq_list[a], nkv, nq_list[a] > 16 ? 20 : 100, &r, &err) != DFL_OK) {
                fprintf(stderr, "bench_ops: %s\n", err.msg);
                return 1;
            }
            printf("%-5lld %6lld %9.3f %9.3f %9.1f %8.1f\n", (long long)nq_list[a], (long long)nkv, r.ms, r.ms_min, r.gbps,
                   r.gops);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const bool attn = argc > 1 && !strcmp(argv[1], "attn");
    if (attn) {
        argc--;
        argv++;
    }
    const int nt = argc > 1 ? atoi(argv[1]) : 2;
    const double mem = argc > 2 ? atof(argv[2]) : 34.0;
    const double tops = argc > 3 ? atof(argv[3]) : 1.87;
    backend_cpu_params p = backend_cpu_default_params();
    p.n_threads = nt;
    p.n_threads_batch = nt;
    dfl_error err;
    memset(&err, 0, sizeof(err));
    backend *be = backend_cpu_new(&p, &err);
    if (be == NULL) {
        fprintf(stderr, "bench_ops: %s\n", err.msg);
        return 1;
    }
    if (attn) {
        printf("cpu backend, %d threads: attention, 16 heads, 8 kv heads, dim 128, F16 cache, causal\n", nt);
        const int rc = bench_attention(be, argc > 3 ? atoll(argv[2]) : 0, argc > 3 ? atoll(argv[3]) : 0);
        backend_free(be);
        return rc;
    }
    backend_caps caps = backend_get_caps(be);
    printf("cpu backend, %d threads, features 0x%x; limits: memory %.1f GB/s, int8 %.2f TOPS\n", nt, caps.cpu_features,
           mem, tops);
    printf("%-6s %-16s %-6s %5s %-5s %9s %9s %9s %8s %7s %8s\n", "type", "shape", "layout", "rows", "mem", "ms",
           "ms min", "GB/s", "%mem", "GOP/s", "x 1 row");
    struct { uint32_t type; int64_t n_in, n_out; } shapes[] = {
        {QUANT_TYPE_Q8_0, 1024, 3072}, {QUANT_TYPE_Q8_0, 3072, 1024}, {QUANT_TYPE_Q8_0, 1024, 151936},
        {QUANT_TYPE_Q4_0, 1024, 3072}, {QUANT_TYPE_Q4_K, 1024, 3072}, {QUANT_TYPE_Q6_K, 1024, 3072},
        {QUANT_TYPE_F16, 1024, 3072},  {QUANT_TYPE_BF16, 1024, 3072}, {QUANT_TYPE_F32, 1024, 3072},
        /* the embedded pair's shapes (F16, n_embd 256, n_ff 768, vocab 4096) */
        {QUANT_TYPE_F16, 256, 768},    {QUANT_TYPE_F16, 768, 256},    {QUANT_TYPE_F16, 256, 4096},
        /* the types added for llama-quantize's presets (shapes 12..19) */
        {QUANT_TYPE_Q5_K, 1024, 3072}, {QUANT_TYPE_IQ4_XS, 1024, 3072}, {QUANT_TYPE_Q3_K, 1024, 3072},
        {QUANT_TYPE_Q2_K, 1024, 3072}, {QUANT_TYPE_Q5_0, 1024, 3072},   {QUANT_TYPE_Q4_1, 1024, 3072},
        {QUANT_TYPE_Q5_1, 1024, 3072}, {QUANT_TYPE_IQ4_NL, 1024, 3072},
    };
    const size_t n_all = sizeof(shapes) / sizeof(shapes[0]);
    const size_t n_shapes = argc > 4 && (size_t)atoi(argv[4]) < n_all ? (size_t)atoi(argv[4]) : n_all;
    const size_t first = argc > 5 && (size_t)atoi(argv[5]) < n_shapes ? (size_t)atoi(argv[5]) : 0;
    for (size_t s = first; s < n_shapes; s++) {
        for (int cold = 1; cold >= 0; cold--) {
            if (!cold && shapes[s].n_out > 100000) continue; /* does not fit a cache anyway */
            double ms1 = 0;
            /* 1 row (decode), 2-6 (adaptive verify and drafter passes), 16 (a full block) */
            const int rows_list[6] = {1, 2, 4, 6, 16, 64};
            for (int ri = 0; ri < 6; ri++) {
                const int64_t rows = rows_list[ri];
                if (rows == 64 && (!cold || shapes[s].type != QUANT_TYPE_Q8_0)) continue;
                if (rows > 1 && rows < 16 && shapes[s].type != QUANT_TYPE_F16) continue;
                backend_bench_result r;
                const int iters = shapes[s].n_out > 100000 ? 25 : 300;
                if (backend_bench_matmul(be, shapes[s].type, shapes[s].n_in, shapes[s].n_out, rows, iters, cold, &r,
                                         &err) != DFL_OK) {
                    fprintf(stderr, "bench_ops: %s\n", err.msg);
                    backend_free(be);
                    return 1;
                }
                if (rows == 1) ms1 = r.ms;
                char shape[32];
                snprintf(shape, sizeof(shape), "%lld->%lld", (long long)shapes[s].n_in, (long long)shapes[s].n_out);
                printf("%-6s %-16s %-6s %5lld %-5s %9.3f %9.3f %9.1f %7.0f%% %7.0f %7.2fx\n",
                       quant_type_get(shapes[s].type)->name, shape, r.packed ? "packed" : "plain", (long long)rows,
                       cold ? "cold" : "hot", r.ms, r.ms_min, r.gbps, 100.0 * r.gbps / mem, r.gops, r.ms / ms1);
            }
        }
    }
    backend_free(be);
    return 0;
}
