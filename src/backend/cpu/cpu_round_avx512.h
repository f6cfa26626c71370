/* cpu_round_avx512.h: the activation roundings of the F16 / BF16 matmuls (nearest even, as
 * fp32_to_fp16 / fp32_to_bf16 in base/fp16.h) and the exact split of an f16 value into two bf16
 * parts, on AVX-512. One definition for the plain kernels' preparation (cpu_kernels_avx512.c) and
 * the AMX-BF16 tiles' (cpu_gemm_p16_amx.c), so that both round the same values the same way. */
#ifndef DFL_BACKEND_CPU_ROUND_AVX512_H
#define DFL_BACKEND_CPU_ROUND_AVX512_H

#include "backend/cpu/cpu_avx512.h"

#if defined(__x86_64__)

/* 16 f32 rounded to f16 (nearest even), as f32. */
T512 INL __m512 round_f16_512(__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* 16 f32 rounded to bf16 (nearest even: (u + 0x7fff + ((u >> 16) & 1)) with the low 16 bits
 * cleared; a NaN stays a NaN, made quiet), as f32. */
T512 INL __m512 round_bf16_512(__m512 v) {
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_set1_epi32((int)0xffff0000u);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, hi));
}

/* An f32 vector of f16 values (11 significant bits) as h = its top 16 bits and l = v - h (at most 3
 * bits: exact, and exactly a bf16 value); both keep their bf16 bits in the high half of each dword. */
T512 INL void split_bf16_512(__m512 v, __m512i *h, __m512i *l) {
    *h = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0xffff0000u));
    *l = _mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(*h)));
}

#endif
#endif
