/* bench/vnni_pipes.c: which AVX-512 instructions take issue slots from vpdpbusd. One thread runs a
 * loop of 12 independent vpdpbusd chains (enough to cover its latency on two pipes) with 4 other
 * instructions added per iteration, or with the activation dword broadcast from memory for every
 * vpdpbusd (a separate vpbroadcastd, or the embedded {1to16} form), and prints the vpdpbusd rate.
 * An added instruction that does not lower the rate runs on other pipes. Not part of the build:
 *   cc -O2 -mavx512f -mavx512vnni bench/vnni_pipes.c -o /tmp/vnni_pipes && /tmp/vnni_pipes
 * (x86-64 with AVX-512 VNNI only; the loops are assembly so that the compiler adds no moves).
 * Figures: bench/results/cpu-zen5-2026-12-06.md. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int8_t k_x[4096] __attribute__((aligned(64)));

#define DP(a) "vpdpbusd %%zmm13, %%zmm12, %%zmm" #a "\n\t"
#define DP12 DP(0) DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11)
#define CLOB                                                                                                       \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm14", "xmm15", \
        "xmm16", "xmm17", "cc", "memory"
/* a loop of 12 vpdpbusd plus EXTRA, n times */
#define LOOP(name, extra)                                                                                           \
    static void name(long n, const int8_t *x) {                                                                     \
        __asm__ volatile("1:\n\t" DP12 extra "dec %0\n\t jnz 1b\n" : "+r"(n) : "r"(x) : CLOB);                       \
    }
#define FOUR(op, a, b) op a ", %%zmm14\n\t" op a ", %%zmm15\n\t" op a ", %%zmm16\n\t" op a ", %%zmm17\n\t"

LOOP(l_base, "")
LOOP(l_and, FOUR("vpandd %%zmm12, ", "%%zmm13", ""))
LOOP(l_add, FOUR("vpaddd %%zmm12, ", "%%zmm13", ""))
LOOP(l_srl, FOUR("vpsrlw $4, ", "%%zmm12", ""))
LOOP(l_tern, FOUR("vpternlogd $0xf8, %%zmm12, ", "%%zmm13", ""))
LOOP(l_cvt, FOUR("vcvtdq2ps ", "%%zmm12", ""))
LOOP(l_zx, FOUR("vpmovzxbd ", "%%xmm12", ""))
LOOP(l_mull, FOUR("vpmulld %%zmm12, ", "%%zmm13", ""))
LOOP(l_wssd, FOUR("vpdpwssd %%zmm12, ", "%%zmm13", ""))
LOOP(l_fma, FOUR("vfmadd231ps %%zmm12, ", "%%zmm13", ""))
LOOP(l_mul, FOUR("vmulps %%zmm12, ", "%%zmm13", ""))
LOOP(l_sll, FOUR("vpslld $7, ", "%%zmm12", ""))
LOOP(l_mov, FOUR("vmovdqa32 ", "%%zmm12", ""))
LOOP(l_cvtph, FOUR("vcvtph2ps ", "%%ymm12", ""))
LOOP(l_shuf, FOUR("vshuff32x4 $0x4e, %%zmm12, ", "%%zmm13", ""))
LOOP(l_perm2, FOUR("vpermt2ps %%zmm12, ", "%%zmm13", ""))
LOOP(l_unpck, FOUR("vunpcklps %%zmm12, ", "%%zmm13", ""))
LOOP(l_addps, FOUR("vaddps %%zmm12, ", "%%zmm13", ""))
LOOP(l_store, "vmovdqu64 %%zmm12, 1024(%1)\n\t vmovdqu64 %%zmm12, 1088(%1)\n\t"
              "vmovdqu64 %%zmm12, 1152(%1)\n\t vmovdqu64 %%zmm12, 1216(%1)\n\t")

/* 12 vpdpbusd, each with its own activation dword: a vpbroadcastd from memory, or embedded */
#define BD(off, t, a) "vpbroadcastd " #off "(%1), %%zmm" #t "\n\t vpdpbusd %%zmm" #t ", %%zmm12, %%zmm" #a "\n\t"
static void l_bcast(long n, const int8_t *x) {
    __asm__ volatile("1:\n\t" BD(0, 14, 0) BD(64, 15, 1) BD(128, 16, 2) BD(192, 17, 3) BD(256, 14, 4) BD(320, 15, 5)
                         BD(384, 16, 6) BD(448, 17, 7) BD(512, 14, 8) BD(576, 15, 9) BD(640, 16, 10) BD(704, 17, 11)
                             "dec %0\n\t jnz 1b\n"
                     : "+r"(n)
                     : "r"(x)
                     : CLOB);
}
#define ED(off, a) "vpdpbusd " #off "(%1)%{1to16%}, %%zmm12, %%zmm" #a "\n\t"
static void l_embed(long n, const int8_t *x) {
    __asm__ volatile("1:\n\t" ED(0, 0) ED(64, 1) ED(128, 2) ED(192, 3) ED(256, 4) ED(320, 5) ED(384, 6) ED(448, 7)
                         ED(512, 8) ED(576, 9) ED(640, 10) ED(704, 11) "dec %0\n\t jnz 1b\n"
                     : "+r"(n)
                     : "r"(x)
                     : CLOB);
}

int main(void) {
    struct {
        const char *what;
        void (*fn)(long, const int8_t *);
    } rows[] = {
        {"12 vpdpbusd (registers)", l_base},   {"+ 4 vpandd", l_and},
        {"+ 4 vpaddd", l_add},                 {"+ 4 vpsrlw", l_srl},
        {"+ 4 vpternlogd", l_tern},            {"+ 4 vcvtdq2ps", l_cvt},
        {"+ 4 vpmovzxbd", l_zx},               {"+ 4 vpmulld", l_mull},
        {"+ 4 vpdpwssd", l_wssd},              {"+ 4 vfmadd231ps", l_fma},
        {"+ 4 vmulps", l_mul},                 {"+ 4 vpslld", l_sll},
        {"+ 4 vmovdqa32 (register copies)", l_mov}, {"+ 4 vcvtph2ps", l_cvtph},
        {"+ 4 vshuff32x4", l_shuf},            {"+ 4 vpermt2ps", l_perm2},
        {"+ 4 vunpcklps", l_unpck},            {"+ 4 vaddps", l_addps},
        {"+ 4 zmm stores", l_store},           {"each: vpbroadcastd from memory", l_bcast},
        {"each: embedded {1to16} operand", l_embed},
    };
    const long n = 20000000;
    for (size_t k = 0; k < sizeof(rows) / sizeof(rows[0]); k++) {
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            const double t0 = now();
            rows[k].fn(n, k_x);
            const double dt = now() - t0;
            if (dt < best) best = dt;
        }
        printf("%-32s %6.2f G vpdpbusd/s  %6.3f ns per loop\n", rows[k].what, 12.0 * (double)n / best * 1e-9,
               best / (double)n * 1e9);
    }
    return 0;
}
