/* bench_peak.c: `make bench-peak`: the int8 multiply rate this CPU gives the matmul kernels'
 * instruction, with no memory traffic: AVX-512 VNNI vpdpbusd on zmm registers where the CPU has
 * it, else the AVX2 kernels' pair vpmaddubsw + vpaddw on ymm registers (u8 x s8 products summed
 * in int16, as the AVX2 K-quant kernels do over a sub-block); 12 independent accumulator chains
 * per thread in assembly (enough to cover the latency), 1 thread and then n threads.
 * The figure is the ceiling the batch rows of `dflash bench` are compared with (the results files
 * in bench/results/); it moves with the clock of a shared VM, so take the best of a few runs.
 * Usage: bench_peak [n_threads (2)] [iterations per thread (20000000)] [avx2: the AVX2 pair even
 * where the CPU has VNNI] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>

/* 12 chains cover the latency of two multiply pipes (4-6 cycles each). The loops are written in
 * assembly: GCC 12 spilled 24 intrinsic chains to the stack (Zen 5: 0.34 TOPS per thread with
 * 24 chains, 0.64 with 16, 12 or 8; the matmul kernels reached 0.59). */
#define PEAK_CHAINS 12 /* must match the number of vpdpbusd / vpmaddubsw lines in each loop below */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct peak_job {
    int64_t iters;
    int32_t sum; /* keeps the chains live */
} peak_job;

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void *peak_run(void *arg) {
    peak_job *job = arg;
    int32_t out[16];
    __asm__ volatile(
        "vpternlogd $0xff, %%zmm13, %%zmm13, %%zmm13\n\t" /* x = all ones (-1), w = 1; chains from 0 */
        "vpabsb %%zmm13, %%zmm12\n\t"
        "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
        "vmovdqa64 %%zmm0, %%zmm1\n\t vmovdqa64 %%zmm0, %%zmm2\n\t vmovdqa64 %%zmm0, %%zmm3\n\t"
        "vmovdqa64 %%zmm0, %%zmm4\n\t vmovdqa64 %%zmm0, %%zmm5\n\t vmovdqa64 %%zmm0, %%zmm6\n\t"
        "vmovdqa64 %%zmm0, %%zmm7\n\t vmovdqa64 %%zmm0, %%zmm8\n\t vmovdqa64 %%zmm0, %%zmm9\n\t"
        "vmovdqa64 %%zmm0, %%zmm10\n\t vmovdqa64 %%zmm0, %%zmm11\n\t"
        "1:\n\t"
        "vpdpbusd %%zmm13, %%zmm12, %%zmm0\n\t vpdpbusd %%zmm13, %%zmm12, %%zmm1\n\t"
        "vpdpbusd %%zmm13, %%zmm12, %%zmm2\n\t vpdpbusd %%zmm13, %%zmm12, %%zmm3\n\t"
        "vpdpbusd %%zmm13, %%zmm12, %%zmm4\n\t vpdpbusd %%zmm13, %%zmm12, %%zmm5\n\t"
        "vpdpbusd %%zmm13, %%zmm12, %%zmm6\n\t vpdpbusd %%zmm13, %%zmm12, %%zmm7\n\t"
        "vpdpbusd %%zmm13, %%zmm12, %%zmm8\n\t vpdpbusd %%zmm13, %%zmm12, %%zmm9\n\t"
        "vpdpbusd %%zmm13, %%zmm12, %%zmm10\n\t vpdpbusd %%zmm13, %%zmm12, %%zmm11\n\t"
        "dec %[n]\n\t jnz 1b\n\t"
        "vpaddd %%zmm1, %%zmm0, %%zmm0\n\t vpaddd %%zmm11, %%zmm0, %%zmm0\n\t"
        "vmovdqu32 %%zmm0, %[out]\n\t"
        : [n] "+r"(job->iters), [out] "=m"(out)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "cc");
    job->sum = out[0];
    return NULL;
}

/* The AVX2 ceiling: 32 u8 x s8 multiply-adds per vpmaddubsw, summed in int16 with vpaddw. */
__attribute__((target("avx2"))) static void *peak_run_avx2(void *arg) {
    peak_job *job = arg;
    int16_t out[16];
    __asm__ volatile(
        "vpcmpeqb %%ymm13, %%ymm13, %%ymm13\n\t" /* x = all ones (-1), w = 1 */
        "vpabsb %%ymm13, %%ymm12\n\t"
        "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
        "vmovdqa %%ymm0, %%ymm1\n\t vmovdqa %%ymm0, %%ymm2\n\t vmovdqa %%ymm0, %%ymm3\n\t"
        "vmovdqa %%ymm0, %%ymm4\n\t vmovdqa %%ymm0, %%ymm5\n\t vmovdqa %%ymm0, %%ymm6\n\t"
        "vmovdqa %%ymm0, %%ymm7\n\t vmovdqa %%ymm0, %%ymm8\n\t vmovdqa %%ymm0, %%ymm9\n\t"
        "vmovdqa %%ymm0, %%ymm10\n\t vmovdqa %%ymm0, %%ymm11\n\t"
        "1:\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm14\n\t vpaddw %%ymm14, %%ymm0, %%ymm0\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm15\n\t vpaddw %%ymm15, %%ymm1, %%ymm1\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm14\n\t vpaddw %%ymm14, %%ymm2, %%ymm2\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm15\n\t vpaddw %%ymm15, %%ymm3, %%ymm3\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm14\n\t vpaddw %%ymm14, %%ymm4, %%ymm4\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm15\n\t vpaddw %%ymm15, %%ymm5, %%ymm5\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm14\n\t vpaddw %%ymm14, %%ymm6, %%ymm6\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm15\n\t vpaddw %%ymm15, %%ymm7, %%ymm7\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm14\n\t vpaddw %%ymm14, %%ymm8, %%ymm8\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm15\n\t vpaddw %%ymm15, %%ymm9, %%ymm9\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm14\n\t vpaddw %%ymm14, %%ymm10, %%ymm10\n\t"
        "vpmaddubsw %%ymm13, %%ymm12, %%ymm15\n\t vpaddw %%ymm15, %%ymm11, %%ymm11\n\t"
        "dec %[n]\n\t jnz 1b\n\t"
        "vpaddw %%ymm1, %%ymm0, %%ymm0\n\t vpaddw %%ymm11, %%ymm0, %%ymm0\n\t"
        "vmovdqu %%ymm0, %[out]\n\t"
        : [n] "+r"(job->iters), [out] "=m"(out)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "cc");
    job->sum = out[0];
    return NULL;
}

/* int8 ops (2 per multiply-add) per second of nth threads, in TOPS; < 0 when a thread fails.
 * macs: multiply-adds per instruction (64 for vpdpbusd zmm, 32 for vpmaddubsw ymm). */
static double peak_tops(int nth, int64_t iters, void *(*run)(void *), double macs) {
    pthread_t th[256];
    peak_job jobs[256];
    const double t0 = now_s();
    int started = 0;
    for (int i = 0; i < nth; i++) {
        jobs[i].iters = iters;
        if (pthread_create(&th[i], NULL, run, &jobs[i]) != 0) break;
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (started != nth) return -1.0;
    const double dt = now_s() - t0;
    return (double)nth * (double)iters * PEAK_CHAINS * macs * 2.0 / dt * 1e-12;
}

int main(int argc, char **argv) {
    const int nth = argc > 1 ? atoi(argv[1]) : 2;
    const int64_t iters = argc > 2 ? atoll(argv[2]) : 20000000;
    const int force_avx2 = argc > 3 && strcmp(argv[3], "avx2") == 0;
    if (nth < 1 || nth > 256 || iters < 1 || (argc > 3 && !force_avx2) || argc > 4) {
        fprintf(stderr, "usage: bench_peak [n_threads 1..256] [iterations >= 1] [avx2]\n");
        return 2;
    }
    __builtin_cpu_init();
    const int has_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    const int vnni = has_vnni && !force_avx2;
    if (!vnni && !__builtin_cpu_supports("avx2")) {
        fprintf(stderr, "bench_peak: this CPU has neither AVX-512 VNNI nor AVX2\n");
        return 1;
    }
    for (int n = 1; n <= nth; n = n == 1 && nth > 1 ? nth : nth + 1) { /* 1 thread, then nth */
        const double tops = vnni ? peak_tops(n, iters, peak_run, 64.0) : peak_tops(n, iters, peak_run_avx2, 32.0);
        if (tops < 0) {
            fprintf(stderr, "bench_peak: cannot start %d threads\n", n);
            return 1;
        }
        const char *what = vnni       ? "vpdpbusd zmm"
                           : has_vnni ? "vpmaddubsw + vpaddw ymm (AVX2 forced)"
                                      : "vpmaddubsw + vpaddw ymm (no VNNI)";
        printf("%s, %d chains per thread, %d thread%s: %.3f int8 TOPS\n", what, PEAK_CHAINS, n, n == 1 ? "" : "s",
               tops);
    }
    return 0;
}

#else
int main(void) {
    fprintf(stderr, "bench_peak: x86-64 only\n");
    return 1;
}
#endif
