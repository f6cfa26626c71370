/* cpu_hsum_avx512.h: the horizontal sums of the AVX-512 matmul kernels (cpu_kernels_avx512.c,
 * cpu_gemm_float_avx512.c). One definition, so that every kernel reduces a dot product's 16 lanes
 * in the same order: a row's result does not depend on the tile or the kernel that computed it. */
#ifndef DFL_BACKEND_CPU_HSUM_AVX512_H
#define DFL_BACKEND_CPU_HSUM_AVX512_H

#include "backend/cpu/cpu_avx512.h"

#if defined(__x86_64__)

/* Sum of the 16 lanes of v in the order of hsum16_tree: ((l0 + l2) + (l1 + l3)) inside each 128-bit
 * lane, then (L0 + L1) + (L2 + L3) across lanes (f32 addition is commutative, so the pairing is
 * what fixes the result). */
T512 INL float hsum16_one(__m512 v) {
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));                  /* l ^ 2 */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));                  /* l ^ 1 */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));            /* L ^ 1 */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));            /* L ^ 2 */
    return _mm512_cvtss_f32(v);
}

/* Lane r of the result = hsum16_one(a[r]) for r < NT (the other lanes 0), bit for bit. */
T512 INL __m512 hsum16_tree(const __m512 *a, const int NT) {
    __m512 s[8], t[4], u[2];
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const __m512 x = 2 * i < NT ? a[2 * i] : z, y = 2 * i + 1 < NT ? a[2 * i + 1] : z;
        s[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y)); /* [x02 y02 x13 y13] */
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(s[2 * i]), y = _mm512_castps_pd(s[2 * i + 1]);
        t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    u[0] = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xdd));
    u[1] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], 0x88), _mm512_shuffle_f32x4(t[2], t[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
}

#endif
#endif
