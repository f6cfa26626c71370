/* bench_peak.c: `make bench-peak`: the int8 multiply rate this CPU gives the matmul kernels'
 * instruction, with no memory traffic: AVX-512 VNNI vpdpbusd on zmm registers where the CPU has
 * it, else the AVX2 kernels' pair vpmaddubsw + vpaddw on ymm registers (u8 x s8 products summed
 * in int16, as the AVX2 K-quant kernels do over a sub-block); 24 independent accumulator chains
 * per thread (enough to cover the latency), 1 thread and then n threads.
 * The figure is the ceiling the batch rows of `dflash bench` are compared with (the results files
 * in bench/results/); it moves with the clock of a shared VM, so take the best of a few runs.
 * Usage: bench_peak [n_threads (2)] [iterations per thread (20000000)] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define PEAK_CHAINS 24

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct peak_job {
    int64_t iters;
    int32_t sum; /* keeps the chains live */
} peak_job;

__attribute__((target("avx512f,avx512vnni"))) static void *peak_run(void *arg) {
    peak_job *job = arg;
    __m512i acc[PEAK_CHAINS];
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_set1_epi32(i);
    __m512i w = _mm512_set1_epi32(0x01010101), x = _mm512_set1_epi32(0x02020202);
    for (int64_t it = 0; it < job->iters; it++) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
        __asm__("" : "+v"(w)); /* not hoisted */
    }
    int32_t s = 0;
    for (int i = 0; i < PEAK_CHAINS; i++) s += _mm512_reduce_add_epi32(acc[i]);
    job->sum = s;
    return NULL;
}

/* The AVX2 ceiling: 32 u8 x s8 multiply-adds per vpmaddubsw, summed in int16 with vpaddw. */
__attribute__((target("avx2"))) static void *peak_run_avx2(void *arg) {
    peak_job *job = arg;
    __m256i acc[PEAK_CHAINS];
    for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm256_set1_epi16((short)i);
    __m256i w = _mm256_set1_epi8(1), x = _mm256_set1_epi8(2);
    for (int64_t it = 0; it < job->iters; it++) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_CHAINS; i++) acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(w, x));
        __asm__("" : "+x"(w)); /* not hoisted */
    }
    int32_t s = 0;
    for (int i = 0; i < PEAK_CHAINS; i++) s += _mm256_extract_epi16(acc[i], 0);
    job->sum = s;
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
    if (nth < 1 || nth > 256 || iters < 1) {
        fprintf(stderr, "usage: bench_peak [n_threads 1..256] [iterations >= 1]\n");
        return 2;
    }
    __builtin_cpu_init();
    const int vnni = __builtin_cpu_supports("avx512vnni");
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
        printf("%s, %d chains per thread, %d thread%s: %.3f int8 TOPS\n",
               vnni ? "vpdpbusd zmm" : "vpmaddubsw + vpaddw ymm (no VNNI)", PEAK_CHAINS, n, n == 1 ? "" : "s", tops);
    }
    return 0;
}

#else
int main(void) {
    fprintf(stderr, "bench_peak: x86-64 only\n");
    return 1;
}
#endif
