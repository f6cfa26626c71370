/* cpu_avx512.h: the target attribute of the AVX-512 kernels (T512: AVX-512 F/BW/VL/DQ/VNNI with
 * AVX2, FMA and F16C) and the always-inline marker, for the headers of shared AVX-512 helpers
 * (cpu_hsum_avx512.h, cpu_round_avx512.h); a file that defines them first keeps its own. */
#ifndef DFL_BACKEND_CPU_AVX512_H
#define DFL_BACKEND_CPU_AVX512_H

#if defined(__x86_64__)
#include <immintrin.h>

#ifndef T512
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#endif
#ifndef INL
#define INL static inline __attribute__((always_inline))
#endif
#endif

#endif
