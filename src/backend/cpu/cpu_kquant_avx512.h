/* cpu_kquant_avx512.h: the AVX-512 helper the Q6_K kernels share (cpu_gemm_kquant_avx512.c, the
 * VNNI kernels; cpu_gemm_kquant_amx.c, the AMX-INT8 ones): the 6-bit values of a KQ_X16 record's
 * ql / qh dwords, 16 weight rows in 32-bit lanes. x86-64 only; include after <immintrin.h>. */
#ifndef DFLASH_CPU_KQUANT_AVX512_H
#define DFLASH_CPU_KQUANT_AVX512_H

#if defined(__x86_64__)
#include <immintrin.h>

/* One Q6_K value vector, q + 32 (0..63) per byte: the nibble s >> 1 of the ql dwords l4 and the
 * bits 2 s, 2 s + 1 of each byte of the qh dwords hv (s = 0..3). */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline __m512i q6K_vec(__m512i l4, __m512i hv,
                                                                                         const int s) {
    const __m512i low = _mm512_set1_epi8(0x0f), hmask = _mm512_set1_epi8(0x30);
    const __m512i lo4 = s >= 2 ? _mm512_and_si512(_mm512_srli_epi16(l4, 4), low) : _mm512_and_si512(l4, low);
    __m512i h2;
    switch (s) {
    case 0: h2 = _mm512_slli_epi16(hv, 4); break;
    case 1: h2 = _mm512_slli_epi16(hv, 2); break;
    case 2: h2 = hv; break;
    default: h2 = _mm512_srli_epi16(hv, 2); break;
    }
    return _mm512_ternarylogic_epi32(lo4, h2, hmask, 0xF8); /* lo4 | (h2 & hmask) */
}
#endif

#endif
