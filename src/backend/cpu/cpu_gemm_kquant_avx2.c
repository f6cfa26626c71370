/* cpu_gemm_kquant_avx2.c: Q4_K / Q6_K x Q8_K matmul with AVX2 (no VNNI), the layout of
 * cpu_gemm_kquant_avx512.c on 8 lanes: a group of 8 weight rows is decoded one super-block at a
 * time (8x8 dword transposes, one weight row per 32-bit lane) into an L1 buffer that every
 * activation row of the call reuses; 4 activation bytes are broadcast to all lanes and vpmaddubsw
 * products are summed in int16 over a whole Q4_K sub-block (16 products per int16: at most
 * 16 * 15 * 127 = 30480) or over half a Q6_K sub-block (4 products of at most 63 * 127), then one
 * vpmaddwd with the lane's (scale, scale) pair gives the scaled int32 sum. Register tiles of up to
 * 4 activation rows share each weight vector.
 *
 * Per (weight row, activation row): per super-block the exact int32 sums S and M, then
 * acc = fma(f32(S), d * dx, acc) and (Q4_K) acc = fnmadd(f32(M), dmin * dx, acc), super-blocks in
 * order from +0, so the bits do not depend on the tile, the row or output range, or the lane.
 * Packed weights (cpu_pack.c: Q4_K as TENSOR_LAYOUT_KQ_X16, Q6_K as TENSOR_LAYOUT_Q6K_X16V, whose
 * values need one mask for three vectors of four and 8 operations for the fourth, against 4-5 per
 * vector from ql and qh): a group of 8 is one half of a 16-row record, decoded with loads into the
 * same lanes: into the L1 buffer (kq_decode2_x16) for Q6_K batches of 9+ rows, else straight into
 * registers per tile of up to 4 activation rows (kq2_fused_rows), with the next group's record
 * prefetched (Zen 2's hardware prefetch alone leaves memory idle while it computes: 1 row from
 * memory 0.158 -> 0.122 ms on Q6_K 1024 x 3072). Packed Q6_K takes biased activations (as the
 * AVX-512 kernel): the values q (-32..31) are vpmaddubsw's signed operand and act->qsu (q8 + 128)
 * the unsigned one, 4 products of at most 255 * 32 per int16, and S starts from the record's NK
 * instead of taking the offset from the sums of 16. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_decode_ext.h" /* dx_transpose8 */

#if defined(__x86_64__)
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

#define KQ2_W 8       /* weight rows per group (one per 32-bit lane) */
#define KQ2_NT 4      /* activation rows per register tile */
#define KQ2_RCHUNK 64 /* activation rows per sweep over a decoded super-block */
#define KQ2_PF 2        /* X16: records prefetched ahead */
/* Packed weights: kq2_fused_rows for every Q4_K batch and for Q6_K batches of at most
 * KQ2_FUSED_Q6 rows, else kq_decode2_x16 once + kq2_rows per row tile. Zen 2, 2 threads, 1024 x
 * 3072: Q4_K 16 rows 0.428 -> 0.388 ms and pp512 199 -> 213 tok/s fused; Q6_K (then read from ql
 * and qh) 16 rows fused 0.628 ms against 0.500, while the Q4_K_M 0.6B model's 8-row verify took
 * 58.1-58.8 ms with Q6_K fused up to 8 rows against 62.3-68.2 ms up to 4. From the Q6K_X16V
 * values (EPYC family 23, 1 thread, bench/kernel_ab.c): fused against the buffer at 9 rows 1.55
 * against 1.96 ms, 12 rows 1.99 / 2.33, 16 rows 2.68 / 2.93, 32 rows 5.21 / 5.27, 64 rows 10.40 /
 * 9.94. */
#define KQ2_FUSED_Q6 16

/* One super-block of a group of 8 weight rows; lane i = weight row i of the group. */
typedef struct kq2_dec {
    __m256i w[64];   /* w[v]: values 4v .. 4v+3 (unsigned bytes: Q4_K 0..15, Q6_K 0..63) */
    __m256i scp[16]; /* (sc_j, sc_j) int16 pairs: Q4_K j < 8 (6-bit), Q6_K j < 16 (int8) */
    __m256i mp[8];   /* int16 pairs against sums-of-16 pairs: Q4_K (m_j, m_j); Q6_K -32 (sc_2p, sc_2p+1) */
    __m256i nk;      /* Q6_K from a record (w then signed q, -32..31): its NK */
    __m256 d, dmin;  /* f16 d (and Q4_K dmin) as f32 */
} kq2_dec;

/* 32 bytes at offset off of each row's block, transposed: c[k] lane i = dword k of row i's. */
T2 INL void load_t8(const uint8_t *const p[8], size_t off, __m256i c[8]) {
    __m256i r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(p[i] + off));
    dx_transpose8(r, c);
}

/* 16 bytes at offset off of each row's block: h[t] lane i = dword t of row i's. */
T2 INL void heads8(const uint8_t *const p[8], size_t off, __m256i h[4]) {
    __m256i z[4];
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) { /* z[e], 128-bit lane L = row 4L + e */
        z[e] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p[e] + off))),
                                       _mm_loadu_si128((const __m128i *)(p[4 + e] + off)), 1);
    }
    const __m256i a = _mm256_unpacklo_epi32(z[0], z[1]), b = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i c = _mm256_unpacklo_epi32(z[2], z[3]), d = _mm256_unpackhi_epi32(z[2], z[3]);
    h[0] = _mm256_unpacklo_epi64(a, c);
    h[1] = _mm256_unpackhi_epi64(a, c);
    h[2] = _mm256_unpacklo_epi64(b, d);
    h[3] = _mm256_unpackhi_epi64(b, d);
}

T2 INL void prefetch8(const uint8_t *const p[8], size_t off, size_t bytes) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        for (size_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p[i] + off + b, _MM_HINT_T0);
        _mm_prefetch((const char *)p[i] + off + bytes - 1, _MM_HINT_T0);
    }
}

/* Byte b of each lane (0..255) repeated in both int16 halves. */
T2 INL __m256i byte_pair(__m256i v, int b) {
    const __m256i x = _mm256_and_si256(_mm256_srli_epi32(v, 8 * b), _mm256_set1_epi32(0xff));
    return _mm256_or_si256(x, _mm256_slli_epi32(x, 16));
}

/* f16 at byte offset off of each row's block, as f32. */
T2 INL __m256 f16_lanes(const uint8_t *const p[8], size_t off) {
    uint16_t h[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) memcpy(&h[i], p[i] + off, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

T2 INL void q4K_decode2(const uint8_t *const p[8], int64_t sb, kq2_dec *D) {
    const size_t base = (size_t)sb * sizeof(block_q4_K);
    D->d = f16_lanes(p, base + offsetof(block_q4_K, d));
    D->dmin = f16_lanes(p, base + offsetof(block_q4_K, dmin));
    __m256i h[4];
    heads8(p, base, h); /* h[1..3] = the 12 scale bytes */
    const __m256i m3f = _mm256_set1_epi32(0x3f3f3f3f), m0f = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i m03 = _mm256_set1_epi32(0x03030303);
    /* get_scale_min_k4 (cpu_matmul_ref.c) on whole words, lane by lane */
    const __m256i u0 = h[1], u1 = h[2], u2 = h[3];
    const __m256i o0 = _mm256_and_si256(u0, m3f);
    const __m256i o1 = _mm256_or_si256(_mm256_and_si256(u2, m0f),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m03), 4));
    const __m256i o2 = _mm256_and_si256(u1, m3f);
    const __m256i o3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m0f),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m03), 4));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        D->scp[j] = byte_pair(j < 4 ? o0 : o1, j % 4);
        D->mp[j] = byte_pair(j < 4 ? o2 : o3, j % 4);
    }
    const __m256i low = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int c2 = 0; c2 < 4; c2++) { /* qs dwords 8 c2 + kk: values 64 c2 + 4 kk (low), + 32 (high) */
        __m256i c[8];
        load_t8(p, base + offsetof(block_q4_K, qs) + 32 * (size_t)c2, c);
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; kk++) {
            D->w[8 * (2 * c2) + kk] = _mm256_and_si256(c[kk], low);
            D->w[8 * (2 * c2 + 1) + kk] = _mm256_and_si256(_mm256_srli_epi16(c[kk], 4), low);
        }
    }
}

/* Q6_K values 32 s + 4 ll .. + 3 of a half super-block (s < 4) in lanes, q + 32 (0..63), from
 * the ql dword l4 (nibble s >> 1) and the qh dword hv (bits 2 s, 2 s + 1). */
T2 INL __m256i q6K_vec2(__m256i l4, __m256i hv, const int s) {
    const __m256i low = _mm256_set1_epi8(0x0f), hmask = _mm256_set1_epi8(0x30);
    const __m256i lo4 = s >= 2 ? _mm256_and_si256(_mm256_srli_epi16(l4, 4), low) : _mm256_and_si256(l4, low);
    __m256i h2;
    switch (s) {
    case 0: h2 = _mm256_slli_epi16(hv, 4); break;
    case 1: h2 = _mm256_slli_epi16(hv, 2); break;
    case 2: h2 = hv; break;
    default: h2 = _mm256_srli_epi16(hv, 2); break;
    }
    return _mm256_or_si256(lo4, _mm256_and_si256(h2, hmask));
}

/* The 64 value vectors of a Q6_K super-block from its ql (dwords 0..31) and qh (dwords 0..15) in
 * lanes: value 4 v + e of lane i = byte e of D->w[v], q + 32 (0..63). */
T2 INL void q6K_assemble2(const __m256i ql[32], const __m256i qh[16], kq2_dec *D) {
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
#pragma GCC unroll 8
            for (int ll = 0; ll < 8; ll++) {
                /* values 128 n + 32 s + 4 ll: ql dword 16 n + 8 (s & 1) + ll, qh dword 8 n + ll */
                D->w[32 * n + 8 * s + ll] = q6K_vec2(ql[16 * n + 8 * (s & 1) + ll], qh[8 * n + ll], s);
            }
        }
    }
}

T2 INL void q6K_decode2(const uint8_t *const p[8], int64_t sb, kq2_dec *D) {
    const size_t base = (size_t)sb * sizeof(block_q6_K);
    D->d = f16_lanes(p, base + offsetof(block_q6_K, d));
    D->dmin = _mm256_setzero_ps();
    __m256i h[4];
    heads8(p, base + offsetof(block_q6_K, scales), h);
    __m256i sc[16];
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        sc[j] = _mm256_srai_epi32(_mm256_slli_epi32(h[j / 4], 24 - 8 * (j % 4)), 24);
        D->scp[j] = _mm256_or_si256(_mm256_and_si256(sc[j], lo16), _mm256_slli_epi32(sc[j], 16));
    }
#pragma GCC unroll 8
    for (int q = 0; q < 8; q++) {
        const __m256i na = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[2 * q], 5));
        const __m256i nb = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[2 * q + 1], 5));
        D->mp[q] = _mm256_or_si256(_mm256_and_si256(na, lo16), _mm256_slli_epi32(nb, 16));
    }
    __m256i ql[32], qh[16];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) load_t8(p, base + offsetof(block_q6_K, ql) + 32 * (size_t)i, ql + 8 * i);
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) load_t8(p, base + offsetof(block_q6_K, qh) + 32 * (size_t)i, qh + 8 * i);
    q6K_assemble2(ql, qh, D);
}

/* The 4 value vectors of sub-block j (values 16 j + 4 k .. + 3 in lanes, q + 32) from half h of a
 * Q6K_X16V record: three masks, and the fourth vector from the three dwords' top bits. */
T2 INL void q6K_x16v_vecs(const uint8_t *R, int j, int h, __m256i v[4]) {
    const __m256i m3f = _mm256_set1_epi8(0x3f);
    const uint8_t *g = R + CPU_Q6K_X16V_QV + 64 * (3 * (size_t)j) + 32 * (size_t)h;
    const __m256i a = _mm256_loadu_si256((const __m256i *)g);
    const __m256i b = _mm256_loadu_si256((const __m256i *)(g + 64));
    const __m256i c = _mm256_loadu_si256((const __m256i *)(g + 128));
    v[0] = _mm256_and_si256(a, m3f);
    v[1] = _mm256_and_si256(b, m3f);
    v[2] = _mm256_and_si256(c, m3f);
    /* bits 6..7 of each byte of a, b, c -> bits 0..1, 2..3, 4..5 (16-bit shifts, masked per byte) */
    v[3] = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 6), _mm256_set1_epi8(0x03)),
                                           _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0c))),
                           _mm256_and_si256(_mm256_srli_epi16(c, 2), _mm256_set1_epi8(0x30)));
}

/* The same decodes from half h (rows 8 h .. 8 h + 7) of a KQ_X16 (Q4_K) or Q6K_X16V (Q6_K) record
 * (cpu_pack.c): the lanes are the 32-byte halves of its 64-byte vectors, so the transposes become
 * loads; the same D, but Q6_K's values signed (q) with the record's NK instead of mp. */
T2 INL void kq_decode2_x16(const uint8_t *R, const int Q6, int h, kq2_dec *D) {
    uint16_t dh[8], mh[8];
    for (int i = 0; i < 8; i++) {
        memcpy(&dh[i], R + (Q6 ? 2 : 4) * (8 * h + i), 2);
        if (!Q6) memcpy(&mh[i], R + 4 * (8 * h + i) + 2, 2);
    }
    D->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
    D->dmin = Q6 ? _mm256_setzero_ps() : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    if (Q6) {
        __m256i sc[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            sc[j] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(R + CPU_KQ_X16_Q6K_SC + 16 * j + 8 * h)));
            D->scp[j] = _mm256_or_si256(_mm256_and_si256(sc[j], lo16), _mm256_slli_epi32(sc[j], 16));
        }
        D->nk = _mm256_loadu_si256((const __m256i *)(R + CPU_KQ_X16_Q6K_NK + 32 * h));
        const __m256i off32 = _mm256_set1_epi8(32);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) { /* values 16 j .. 16 j + 15 */
            q6K_x16v_vecs(R, j, h, D->w + 4 * j);
            for (int k = 0; k < 4; k++) D->w[4 * j + k] = _mm256_sub_epi8(D->w[4 * j + k], off32);
        }
        return;
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(R + CPU_KQ_X16_Q4K_SC + 16 * j + 8 * h)));
        const __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * j + 8 * h)));
        D->scp[j] = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
        D->mp[j] = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
    }
    const __m256i low = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 32
    for (int q = 0; q < 32; q++) { /* qs dword q = 8 c2 + kk: values 64 c2 + 4 kk (low), + 32 (high) */
        const __m256i c = _mm256_loadu_si256((const __m256i *)(R + CPU_KQ_X16_QS + 64 * q + 32 * h));
        D->w[8 * (2 * (q / 8)) + q % 8] = _mm256_and_si256(c, low);
        D->w[8 * (2 * (q / 8) + 1) + q % 8] = _mm256_and_si256(_mm256_srli_epi16(c, 4), low);
    }
}

T2 INL __m256i bcast32_2(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* acc[r] (8 lanes, in memory) += super-block sb of the group for activation rows r0 .. r0+NT-1.
 * BIAS (Q6_K from a record): D->w holds signed q against the biased activations qsu, and S starts
 * from D->nk instead of taking the offset from the sums of 16 (the same integer S). */
T2 INL void kq2_rows(const kq2_dec *D, const int Q6, const int BIAS, const cpu_act *act, int64_t sb, int64_t r0,
                     const int NT, float *acc) {
    const int8_t *x0 = act->qs + r0 * act->n_in + sb * QK_K; /* row r at + r * n_in */
    const uint8_t *xu0 = act->qsu + r0 * act->n_in + sb * QK_K;
    const int64_t n = act->n_in;
    __m256i S[KQ2_NT];
#pragma GCC unroll 4
    for (int r = 0; r < NT; r++) S[r] = BIAS ? D->nk : _mm256_setzero_si256();
    /* Q4_K: 8 sub-blocks of 8 dwords, one int16 sum each; Q6_K: 32 half sub-blocks of 2 dwords */
    const int nsum = Q6 ? 32 : 8, per = Q6 ? 2 : 8;
#pragma GCC unroll 1
    for (int j = 0; j < nsum; j++) {
        __m256i s16[KQ2_NT];
#pragma GCC unroll 8
        for (int k = 0; k < per; k++) {
            __m256i wv = D->w[per * j + k];
            __asm__("" : "+x"(wv)); /* one load, NT uses */
#pragma GCC unroll 4
            for (int r = 0; r < NT; r++) {
                const __m256i pr = BIAS ? _mm256_maddubs_epi16(bcast32_2(xu0 + r * n + 4 * (per * j + k)), wv)
                                        : _mm256_maddubs_epi16(wv, bcast32_2(x0 + r * n + 4 * (per * j + k)));
                s16[r] = k == 0 ? pr : _mm256_add_epi16(s16[r], pr);
            }
        }
        __m256i sc = D->scp[Q6 ? j / 2 : j];
        __asm__("" : "+x"(sc));
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(s16[r], sc));
    }
    __m256i M[KQ2_NT];
#pragma GCC unroll 4
    for (int r = 0; r < NT; r++) M[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int q = 0; q < 8 && !BIAS; q++) {
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) {
            const __m256i t = _mm256_madd_epi16(D->mp[q], bcast32_2(act->bsums + (r0 + r) * (n / 16) + sb * 16 + 2 * q));
            if (Q6) {
                S[r] = _mm256_add_epi32(S[r], t); /* -32 sc (bs_2q, bs_2q+1) */
            } else {
                M[r] = _mm256_add_epi32(M[r], t); /* m_q (bs_2q + bs_2q+1) */
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NT; r++) {
        const __m256 dx = _mm256_set1_ps(act->d[(r0 + r) * (n / QK_K) + sb]);
        __m256 a = _mm256_load_ps(acc + 8 * r);
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[r]), _mm256_mul_ps(D->d, dx), a);
        if (!Q6) a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M[r]), _mm256_mul_ps(D->dmin, dx), a);
        _mm256_store_ps(acc + 8 * r, a);
    }
}

/* The fused path for packed weights: half h of a KQ_X16 (Q4_K) or Q6K_X16V (Q6_K) record is
 * decoded in registers and multiplied at once with NT <= 4 activation rows (no kq2_dec round trip
 * through L1; which path runs: KQ2_FUSED_Q6). The int32 sums S and M are the exact integers
 * kq2_rows forms, so the bits are the same. */
T2 INL void kq2_fused_rows(const uint8_t *R, const int Q6, int h, const cpu_act *act, int64_t sb, int64_t r0,
                           const int NT, float *acc, const int PF, const char *pf, int L) {
    /* PF (a constant): pf is the same record of the next group (L lines), which half h prefetches,
     * its lines [h L/2, (h+1) L/2), one per main-loop iteration (32 of them), so that memory
     * streams during both halves; else (a later row tile: already prefetched) no prefetch code */
    const int Lh = (L + 1) / 2, lend = !PF ? 0 : L < (h + 1) * Lh ? L : (h + 1) * Lh;
    const int8_t *x0 = act->qs + r0 * act->n_in + sb * QK_K; /* row r at + r * n_in */
    const int64_t n = act->n_in;
    __m256i S[KQ2_NT], M[KQ2_NT];
#pragma GCC unroll 4
    for (int r = 0; r < NT; r++) S[r] = M[r] = _mm256_setzero_si256();
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256 d, dmin = _mm256_setzero_ps();
    if (Q6) {
        /* biased activations: S starts from the record's NK, no offset from the sums of 16 */
        const uint8_t *xu0 = act->qsu + r0 * n + sb * QK_K; /* row r at + r * n */
        const __m256i nk = _mm256_loadu_si256((const __m256i *)(R + CPU_KQ_X16_Q6K_NK + 32 * h));
        const __m256i off32 = _mm256_set1_epi8(32);
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) S[r] = nk;
        d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(R + 16 * h)));
#pragma GCC unroll 1
        for (int j = 0; j < 16; j++) { /* sub-block j: value vectors 4 j .. 4 j + 3 (Q6K_X16V) */
            /* (sc, sc) int16 pairs of scale j per lane */
            const __m128i b8 = _mm_loadl_epi64((const __m128i *)(R + CPU_KQ_X16_Q6K_SC + 16 * j + 8 * h));
            const __m256i scp = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b8, b8));
            __m256i wv[4];
            q6K_x16v_vecs(R, j, h, wv);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) wv[k] = _mm256_sub_epi8(wv[k], off32); /* q, the signed operand */
#pragma GCC unroll 2
            for (int t = 0; t < 2; t++) { /* value vectors v0 = 4 j + 2 t and v0 + 1 */
                const int v0 = 4 * j + 2 * t;
                const int li = 2 * j + t + h * Lh;
                if (PF && li < lend) _mm_prefetch(pf + 64 * li, _MM_HINT_T0);
#pragma GCC unroll 4
                for (int r = 0; r < NT; r++) {
                    const uint8_t *xr = xu0 + r * n + 4 * v0;
                    const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(bcast32_2(xr), wv[2 * t]),
                                                         _mm256_maddubs_epi16(bcast32_2(xr + 4), wv[2 * t + 1]));
                    S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(s16, scp));
                }
            }
        }
    } else {
        /* [0, 64): d | dmin << 16 per lane; half h = bytes 32 h .. 32 h + 31 */
        const __m256i dd = _mm256_loadu_si256((const __m256i *)(R + 32 * h));
        const __m256i ctl = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                                             13, 2, 3, 6, 7, 10, 11, 14, 15);
        const __m256i g = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dd, ctl), 0xd8); /* d0..7 | dmin0..7 */
        d = _mm256_cvtph_ps(_mm256_castsi256_si128(g));
        dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(g, 1));
#pragma GCC unroll 1
        for (int c2 = 0; c2 < 4; c2++) { /* qs dwords 8 c2 + kk: values 64 c2 + 4 kk (low), + 32 (high) */
            __m256i s16[2][KQ2_NT];
#pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++) {
                const __m256i c = _mm256_loadu_si256((const __m256i *)(R + CPU_KQ_X16_QS + 64 * (8 * c2 + kk) + 32 * h));
                const int li = 8 * c2 + kk + h * Lh;
                if (PF && li < lend) _mm_prefetch(pf + 64 * li, _MM_HINT_T0);
                const __m256i lo = _mm256_and_si256(c, low), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), low);
#pragma GCC unroll 4
                for (int r = 0; r < NT; r++) {
                    const int8_t *xr = x0 + r * n + 64 * c2 + 4 * kk;
                    const __m256i pl = _mm256_maddubs_epi16(lo, bcast32_2(xr));
                    const __m256i ph = _mm256_maddubs_epi16(hi, bcast32_2(xr + 32));
                    s16[0][r] = kk == 0 ? pl : _mm256_add_epi16(s16[0][r], pl);
                    s16[1][r] = kk == 0 ? ph : _mm256_add_epi16(s16[1][r], ph);
                    __asm__("" : "+x"(s16[0][r]), "+x"(s16[1][r])); /* a chain, not a tree */
                }
            }
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const int j = 2 * c2 + e;
                const __m128i b8 = _mm_loadl_epi64((const __m128i *)(R + CPU_KQ_X16_Q4K_SC + 16 * j + 8 * h));
                const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b8, b8)); /* (sc, sc) pairs */
#pragma GCC unroll 4
                for (int r = 0; r < NT; r++) S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(s16[e][r], sc));
            }
        }
    }
    /* Q4_K's mins: m_2p bs32_2p + m_2p+1 bs32_2p+1 against the sums of 32 (4 madd per row instead
     * of 8) */
#pragma GCC unroll 1
    for (int q = 0; q < 4 && !Q6; q++) {
        const __m128i a8 = _mm_loadl_epi64((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * (2 * q) + 8 * h));
        const __m128i b8 = _mm_loadl_epi64((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * (2 * q + 1) + 8 * h));
        const __m256i mp = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a8, b8)); /* (m_2q, m_2q+1) pairs */
        const int16_t *bsq = act->bsums32 + r0 * (n / 32) + sb * 8 + 2 * q; /* row r at + r * (n / 32) */
#pragma GCC unroll 4
        for (int r = 0; r < NT; r++) M[r] = _mm256_add_epi32(M[r], _mm256_madd_epi16(mp, bcast32_2(bsq + r * (n / 32))));
    }
#pragma GCC unroll 4
    for (int r = 0; r < NT; r++) {
        const __m256 dx = _mm256_set1_ps(act->d[(r0 + r) * (n / QK_K) + sb]);
        __m256 a = _mm256_load_ps(acc + 8 * r);
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[r]), _mm256_mul_ps(d, dx), a);
        if (!Q6) a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M[r]), _mm256_mul_ps(dmin, dx), a);
        _mm256_store_ps(acc + 8 * r, a);
    }
}

/* Half h of record R (super-block sb) for the rows rc .. rc + nrc - 1, tile by tile into acc (8
 * floats per row): the first tile prefetches pf (the next group's record sb, L lines). */
T2 INL void kq2_fused_tiles(const uint8_t *R, const int Q6, int h, const cpu_act *act, int64_t sb, int64_t rc,
                            int64_t nrc, float *acc, const char *pf, int L) {
    for (int64_t rt = 0; rt < nrc; rt += KQ2_NT) {
        const int nt = nrc - rt >= KQ2_NT ? KQ2_NT : (int)(nrc - rt);
        float *a = acc + 8 * rt;
#define FUSED(N, PF) kq2_fused_rows(R, Q6, h, act, sb, rc + rt, N, a, PF, pf, L)
        if (rt == 0) { /* the first tile prefetches */
            switch (nt) {
            case 1: FUSED(1, 1); break;
            case 2: FUSED(2, 1); break;
            case 3: FUSED(3, 1); break;
            default: FUSED(4, 1); break;
            }
        } else {
            switch (nt) {
            case 1: FUSED(1, 0); break;
            case 2: FUSED(2, 0); break;
            case 3: FUSED(3, 0); break;
            default: FUSED(4, 0); break;
            }
        }
#undef FUSED
    }
}

/* The fused rows of both halves of a 16-row group (X16, o % 16 == 0, both halves in the output
 * range), record by record: half 0 then half 1 of each record, each half into its own
 * accumulators, so that a record's lines are used whole while they are in L1 (half by half over
 * the whole group, the first half touched every line for 32 of its 64 bytes). The same calls per
 * (half, record, row tile) in the same record order as the half-by-half loop of mm_kq_avx2, so
 * the same bits; nw1: the second half's rows in range. */
T2 INL void kq2_group_pair(const uint8_t *grp, const int Q6, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                           int64_t ds, int64_t o, int nw1, int L, int64_t nsb, size_t rec) {
    float acc[2][KQ2_RCHUNK * 8] __attribute__((aligned(32)));
    for (int64_t rc = r0; rc < r0 + nr; rc += KQ2_RCHUNK) {
        const int64_t nrc = r0 + nr - rc >= KQ2_RCHUNK ? KQ2_RCHUNK : r0 + nr - rc;
        for (int64_t r = 0; r < nrc; r++) {
            _mm256_store_ps(acc[0] + 8 * r, _mm256_setzero_ps());
            _mm256_store_ps(acc[1] + 8 * r, _mm256_setzero_ps());
        }
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *R = grp + (size_t)sb * rec;
            const char *pf = (const char *)R + (size_t)nsb * rec; /* the next group's record sb */
            for (int h = 0; h < 2; h++) kq2_fused_tiles(R, Q6, h, act, sb, rc, nrc, acc[h], pf, L);
        }
        for (int64_t r = 0; r < nrc; r++) {
            _mm256_storeu_ps(dst + (rc + r) * ds + o, _mm256_load_ps(acc[0] + 8 * r));
            if (nw1 == KQ2_W) {
                _mm256_storeu_ps(dst + (rc + r) * ds + o + KQ2_W, _mm256_load_ps(acc[1] + 8 * r));
            } else {
                memcpy(dst + (rc + r) * ds + o + KQ2_W, acc[1] + 8 * r, (size_t)nw1 * sizeof(float));
            }
        }
    }
}

/* Calls of at most this many rows (decode, short verify, a few drafted rows) take kq2_group_pair.
 * Zen 4 VM on the AVX2 path (DFLASH_CPU_DISABLE=avx512), 2 threads, [1024 x 65536] from memory,
 * medians of 20, 3 alternated rounds: 1 row Q4_K 22-23 -> 24-30 GB/s, Q6_K 21-23 -> 30-33 GB/s; 2
 * rows Q4_K 1.7-3.3 -> 1.0 ms, 4 rows 2.0-2.1 -> 1.4 ms; from cache 1 row 0.056 -> 0.050 ms. The
 * Q4_K_M 0.6B model: tg 18.3-19.0 -> 13.9-14.8 ms, verify4 22.6-27.3 -> 16.8-18.7 ms (3 alternated
 * runs). At 8 and 16 rows the two orders were within the noise, so those keep the half loop. */
#ifndef KQ2_PAIR_ROWS
#define KQ2_PAIR_ROWS 4
#endif

/* X16: w is packed as TENSOR_LAYOUT_KQ_X16 (Q4_K) or Q6K_X16V (Q6_K) (o0 % 16 == 0; a group of 8
 * is half of a record). */
T2 INL void mm_kq_avx2(const void *w, size_t w_nb1, const int Q6, const int X16, const cpu_act *act, int64_t r0,
                       int64_t nr, float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t nsb = act->n_in / QK_K;
    const size_t bsz = Q6 ? sizeof(block_q6_K) : sizeof(block_q4_K);
    const size_t rec = tensor_kq_x16_record_bytes(Q6 ? QUANT_TYPE_Q6_K : QUANT_TYPE_Q4_K);
    const int L = (int)(rec / 64); /* cache lines per record */
    kq2_dec D;
    float acc[KQ2_RCHUNK * 8] __attribute__((aligned(32)));
    for (int64_t o = o0; o < o1; o += KQ2_W) {
        const int nw = o1 - o >= KQ2_W ? KQ2_W : (int)(o1 - o);
        const uint8_t *p[KQ2_W]; /* missing rows repeat the last one (their lanes are not stored) */
        const uint8_t *grp = (const uint8_t *)w + (size_t)(o / 16) * 16 * w_nb1; /* X16: the group's records */
        const int half = (int)((o / 8) % 2);
        if (X16 && half == 0 && o1 - o > KQ2_W && nr <= KQ2_PAIR_ROWS) { /* both halves at once */
            const int nw1 = o1 - o - KQ2_W >= KQ2_W ? KQ2_W : (int)(o1 - o - KQ2_W);
            kq2_group_pair(grp, Q6, act, r0, nr, dst, ds, o, nw1, L, nsb, rec);
            o += KQ2_W;
            continue;
        }
        if (!X16) {
            for (int i = 0; i < KQ2_W; i++) p[i] = (const uint8_t *)w + (size_t)(o + (i < nw ? i : nw - 1)) * w_nb1;
        }
        for (int64_t rc = r0; rc < r0 + nr; rc += KQ2_RCHUNK) {
            const int64_t nrc = r0 + nr - rc >= KQ2_RCHUNK ? KQ2_RCHUNK : r0 + nr - rc;
            for (int64_t r = 0; r < nrc; r++) _mm256_store_ps(acc + 8 * r, _mm256_setzero_ps());
            for (int64_t sb = 0; sb < nsb; sb++) {
                if (X16) {
                    if (!Q6 || nrc <= KQ2_FUSED_Q6) { /* decode in registers, per row tile */
                        const uint8_t *R = grp + (size_t)sb * rec;
                        const char *pf = (const char *)R + (size_t)nsb * rec; /* the next group's record sb */
                        kq2_fused_tiles(R, Q6, half, act, sb, rc, nrc, acc, pf, L);
                        continue;
                    }
                    const char *pf = (const char *)grp + (size_t)(sb + KQ2_PF) * rec + 32 * (size_t)half;
                    for (size_t b = 0; b < rec; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
                    kq_decode2_x16(grp + (size_t)sb * rec, Q6, half, &D);
                } else {
                    if (sb + 1 < nsb) prefetch8(p, (size_t)(sb + 1) * bsz, bsz);
                    if (Q6) {
                        q6K_decode2(p, sb, &D);
                    } else {
                        q4K_decode2(p, sb, &D);
                    }
                }
                for (int64_t rt = 0; rt < nrc; rt += KQ2_NT) {
                    const int nt = nrc - rt >= KQ2_NT ? KQ2_NT : (int)(nrc - rt);
                    float *a = acc + 8 * rt;
                    switch (nt) {
                    case 1: kq2_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 1, a); break;
                    case 2: kq2_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 2, a); break;
                    case 3: kq2_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 3, a); break;
                    default: kq2_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 4, a); break;
                    }
                }
            }
            for (int64_t r = 0; r < nrc; r++) {
                if (nw == KQ2_W) {
                    _mm256_storeu_ps(dst + (rc + r) * ds + o, _mm256_load_ps(acc + 8 * r));
                } else {
                    memcpy(dst + (rc + r) * ds + o, acc + 8 * r, (size_t)nw * sizeof(float));
                }
            }
        }
    }
}

T2 static void mm_q4_K_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_avx2(w, w_nb1, 0, 0, act, r0, nr, dst, ds, o0, o1);
}

T2 static void mm_q6_K_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_avx2(w, w_nb1, 1, 0, act, r0, nr, dst, ds, o0, o1);
}

T2 static void mm_q4_K_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                                int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_avx2(w, w_nb1, 0, 1, act, r0, nr, dst, ds, o0, o1);
}

T2 static void mm_q6_K_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                                int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_avx2(w, w_nb1, 1, 1, act, r0, nr, dst, ds, o0, o1);
}

void cpu_kernels_init_kquant_avx2(cpu_kernels *k) {
    k->matmul[QUANT_TYPE_Q4_K] = mm_q4_K_avx2;
    k->matmul[QUANT_TYPE_Q6_K] = mm_q6_K_avx2;
    k->matmul_packed[QUANT_TYPE_Q4_K] = mm_q4_K_x16_avx2;
    k->matmul_packed[QUANT_TYPE_Q6_K] = mm_q6_K_x16_avx2;
    k->pack_layout[QUANT_TYPE_Q4_K] = TENSOR_LAYOUT_KQ_X16;
    k->pack_layout[QUANT_TYPE_Q6_K] = TENSOR_LAYOUT_Q6K_X16V;
}

#else
void cpu_kernels_init_kquant_avx2(cpu_kernels *k) { (void)k; }
#endif
