/* cpu_exp_avx2.h: e^x on 8 lanes for x <= 0, shared by the AVX2 softmax (cpu_kernels_avx2.c) and
 * swiglu (cpu_ops_avx2.c) kernels, so that both round the same way. */
#ifndef DFL_BACKEND_CPU_EXP_AVX2_H
#define DFL_BACKEND_CPU_EXP_AVX2_H

#if defined(__x86_64__)
#include <immintrin.h>

/* e^x for x <= 0 (after max subtraction): x = n ln2 + r, degree-7 Taylor polynomial for e^r, 2^n
 * built in the exponent field; x < -87 (2^n below the normal range) gives 0. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) __m256
exp_neg_avx2(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), ok);
}

#endif
#endif
