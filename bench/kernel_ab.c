/* bench/kernel_ab.c: kernel-level A/B of the CPU matmul kernels, plain vs packed weights (cpu_pack.c),
 * both copies in the same kind of memory (argv[6]: 1 = madvised huge pages, 0 = 4 KiB pages), one
 * thread, best of argv[5] alternating repetitions. Not part of the build; see
 * bench/results/cpu-packed-weights.md for the build line. Usage: kernel_ab q4_K|q6_K|q8_0 N_IN N_OUT ROWS REPS HUGE
 * [avx2] (avx2: the AVX2 kernels only) */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void *big(size_t n, int huge) {
    void *p = aligned_alloc(2 << 20, (n + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1));
    if (huge)
        madvise(p, (n + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1), MADV_HUGEPAGE);
    else
        madvise(p, (n + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1), MADV_NOHUGEPAGE);
    memset(p, 0, n);
    return p;
}
int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: kernel_ab q4_K|q6_K|q8_0 N_IN N_OUT ROWS REPS HUGE [avx2]\n");
        return 2;
    }
    uint32_t type = !strcmp(argv[1], "q4_K")   ? QUANT_TYPE_Q4_K
                    : !strcmp(argv[1], "q6_K") ? QUANT_TYPE_Q6_K
                                               : QUANT_TYPE_Q8_0;
    int64_t n_in = atoi(argv[2]), n_out = atoi(argv[3]), nr = atoi(argv[4]);
    int reps = atoi(argv[5]);
    int huge = atoi(argv[6]);
    size_t row = quant_row_size(type, n_in);
    uint8_t *w = big(row * n_out, huge);
    srand(1);
    for (size_t i = 0; i < row * n_out; i++)
        w[i] = (uint8_t)rand();
    /* sane f16 scales */
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *r = w + o * row;
        if (type == QUANT_TYPE_Q8_0)
            for (int64_t b = 0; b < n_in / 32; b++)
                ((block_q8_0 *)r)[b].d = 0x1400;
        else if (type == QUANT_TYPE_Q4_K)
            for (int64_t b = 0; b < n_in / 256; b++) {
                ((block_q4_K *)r)[b].d = 0x1400;
                ((block_q4_K *)r)[b].dmin = 0x1000;
            }
        else
            for (int64_t b = 0; b < n_in / 256; b++)
                ((block_q6_K *)r)[b].d = 0x1400;
    }
    cpu_kernels k;
    uint32_t feat = cpu_features_detect();
    if (argc == 8 && !strcmp(argv[7], "avx2")) { /* the AVX2 kernels only */
        feat &= ~(uint32_t)(BACKEND_CPU_FEATURE_AVX512 | BACKEND_CPU_FEATURE_AVX512_VNNI | BACKEND_CPU_FEATURE_AVX512_BF16);
    }
    cpu_kernels_select(&k, feat);
    tensor tw = tensor_2d(type, w, n_in, n_out);
    size_t ps = cpu_weight_pack_size(&k, &tw);
    uint8_t *p = big(ps, huge);
    tensor tp = cpu_weight_pack(&k, &tw, p);
    float *x = malloc(sizeof(float) * n_in * nr);
    for (int64_t i = 0; i < n_in * nr; i++)
        x[i] = (rand() % 1000) / 500.0f - 1;
    cpu_dot_type dt = cpu_dot_type_of(type);
    size_t ab = cpu_act_bytes(dt, n_in, nr);
    void *am = aligned_alloc(64, (ab + 63) / 64 * 64);
    cpu_act act;
    cpu_act_layout(&act, dt, n_in, nr, am);
    for (int64_t r = 0; r < nr; r++)
        k.act_row[type](&act, r, x + r * n_in);
    float *y = malloc(sizeof(float) * n_out * nr);
    double best[2] = {1e9, 1e9};
    for (int it = 0; it < reps; it++)
        for (int v = 0; v < 2; v++) {
            double t0 = now();
            if (v == 0)
                k.matmul[type](w, row, &act, 0, nr, y, n_out, 0, n_out);
            else
                k.matmul_packed[type](p, tp.nb[1], &act, 0, nr, y, n_out, 0, n_out);
            double t = now() - t0;
            if (t < best[v])
                best[v] = t;
        }
    double gop = 2.0 * n_in * n_out * nr / 1e9;
    printf("%s [%ld x %ld] rows %ld %s: plain %.3f ms (%.0f GOP/s, %.1f GB/s) | packed %.3f ms (%.0f GOP/s, %.1f GB/s) "
           "| %.2fx\n",
           argv[1], (long)n_in, (long)n_out, (long)nr, huge ? "THP" : "4K", best[0] * 1e3, gop / best[0],
           row * n_out / best[0] / 1e9, best[1] * 1e3, gop / best[1], ps / best[1] / 1e9, best[0] / best[1]);
    return 0;
}
