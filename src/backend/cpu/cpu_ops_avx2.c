/* cpu_ops_avx2.c: the light-op row kernels on AVX2 + FMA + F16C (rmsnorm, swiglu, add, mul,
 * argmax, f32 -> f16), each with the contract of its scalar reference in cpu_ops_ref.c: the same
 * products and roundings (rmsnorm's f64 sum of squares in another order; swiglu's e^x within a
 * few ulp), the tails one element at a time. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops_ref.h"
#include "backend/cpu/cpu_exp_avx2.h"
#include "base/fp16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#define T2 __attribute__((target("avx2,fma,f16c")))

T2 static void rmsnorm_row_avx2(float *d, const float *x, const float *w, int64_t n, float eps) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i), sq = _mm256_mul_ps(v, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    double sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    const __m256 sc = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), sc);
        if (w != NULL) y = _mm256_mul_ps(y, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(d + i, y);
    }
    for (; i < n; i++) {
        const float y = x[i] * scale;
        d[i] = w != NULL ? y * w[i] : y;
    }
}

/* silu(g) * u with e = e^-|g| (never overflows): g >= 0: g / (1 + e), else g e / (1 + e). */
T2 static void swiglu_row_avx2(float *d, const float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp_neg_avx2(_mm256_or_ps(gv, sign)); /* -|g| */
        const __m256 neg = _mm256_cmp_ps(gv, zero, _CMP_LT_OQ);
        const __m256 num = _mm256_blendv_ps(gv, _mm256_mul_ps(gv, e), neg);
        const __m256 s = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(d + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) d[i] = cpu_silu_ref(g[i]) * u[i];
}

T2 static void add_row_avx2(float *d, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) d[i] = a[i] + b[i];
}

T2 static void mul_row_avx2(float *d, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) d[i] = a[i] * b[i];
}

/* The first index of the maximum; a row with a NaN or an Inf (v - v is NaN exactly for those)
 * takes the reference's scan, which flags the first one. */
T2 static int32_t argmax_row_avx2(const float *x, int64_t n) {
    if (n < 8) return cpu_argmax_row_ref(x, n);
    __m256 mx = _mm256_loadu_ps(x);
    __m256 bad = _mm256_cmp_ps(_mm256_sub_ps(mx, mx), _mm256_setzero_ps(), _CMP_NEQ_UQ);
    int64_t i = 8;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
        mx = _mm256_max_ps(mx, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float best = _mm_cvtss_f32(m4);
    int any_bad = _mm256_movemask_ps(bad);
    for (int64_t j = i; j < n; j++) {
        if (!isfinite(x[j])) any_bad = 1;
        best = x[j] > best ? x[j] : best;
    }
    if (any_bad) return cpu_argmax_row_ref(x, n);
    const __m256 bv = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), bv, _CMP_EQ_OQ));
        if (eq) return (int32_t)(i + __builtin_ctz((unsigned)eq));
    }
    for (; i < n; i++) {
        if (x[i] == best) return (int32_t)i;
    }
    return 0;
}

/* Round to nearest even, as fp32_to_fp16 (NaNs keep a quiet NaN, maybe another payload). */
T2 static void f16_row_avx2(uint16_t *d, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(d + i), h);
    }
    for (; i < n; i++) d[i] = fp32_to_fp16(x[i]);
}

void cpu_kernels_init_light_avx2(cpu_kernels *k) {
    k->rmsnorm_row = rmsnorm_row_avx2;
    k->swiglu_row = swiglu_row_avx2;
    k->add_row = add_row_avx2;
    k->mul_row = mul_row_avx2;
    k->argmax_row = argmax_row_avx2;
    k->f16_row = f16_row_avx2;
}

#else
void cpu_kernels_init_light_avx2(cpu_kernels *k) { (void)k; }
#endif
