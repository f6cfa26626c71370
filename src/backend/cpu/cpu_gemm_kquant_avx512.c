/* cpu_gemm_kquant_avx512.c: Q4_K / Q6_K x Q8_K matmul with AVX-512 VNNI, one code path for every
 * number of activation rows (decode, verify, prefill), so a row's result never depends on the batch.
 *
 * Weight rows go in 32-bit lanes: a group of 16 weight rows is decoded one super-block at a time
 * (16x16 dword transposes of the packed quants, nibbles / 6-bit values unpacked, sub-block scales
 * as int32 lanes) into an L1 buffer (kq_dec, ~6 KiB); every activation row of the call then reuses
 * it. For one activation row, 4 activation bytes are broadcast to all lanes and vpdpbusd
 * accumulates a whole sub-block (32 values for Q4_K, 16 for Q6_K) per lane before one vpmulld by
 * the lane's scale, so the integer work is about one vpdpbusd per 64 multiply-adds (the former
 * two-rows-per-vector kernel needed a vpdpwssd per vpdpbusd). Register tiles of up to 8 activation
 * rows share each weight vector. The Q4_K mins and the Q6_K -32 offset come from the Q8_K sums of
 * 16 (vpdpwssd with int16 pairs per lane); in the fused Q4_K path from the sums of 32. Packed
 * Q6_K (fused and buffer paths) needs no sums: its weights q are the signed operand and the
 * activations q8 + 128 (act->qsu) the unsigned one, and the 128 sum q that adds is the record's
 * NK (docs/quantization.md).
 * Packed (KQ_X16) sweeps (a call's rows go in sweeps of up to KQ_RCHUNK) of Q4_K, and of Q6_K
 * with <= 24 rows (KQ_FUSED_Q4 / KQ_FUSED_Q6), skip the buffer: kq_fused_rows decodes the record
 * in registers per tile of up to 8 rows and multiplies at once. Zen 5, one thread,
 * [1024 x 3072] from cache, best of 3 x 300 alternated: Q4_K 1 row 0.046
 * -> 0.034 ms, 4 rows 0.073 -> 0.055, 8 rows 0.112 -> 0.101; Q6_K 1 row 0.065 -> 0.049, 2 rows
 * 0.075 -> 0.072, 4 rows 0.090 -> 0.097 (so the buffer from 3 rows). The Q4_K_M 0.6B model's
 * decode step 11.1 -> 9.8 ms (2 threads, 6 alternated runs).
 *
 * Per (weight row, activation row) the computation is fixed: per super-block the exact int32 sums
 * S (scaled dots, plus the Q6_K offset) and M (Q4_K mins), then acc = fma(f32(S), d * dx, acc) and
 * (Q4_K) acc = fnmadd(f32(M), dmin * dx, acc), super-blocks in order, acc from +0. Lanes never mix,
 * and the integer sums are exact whatever the order, so the bits do not depend on the tile size,
 * the row range, the output range or the lane a row lands in (tests/test_gemm_kquant.c). */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_kquant_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

#define KQ_W 16       /* weight rows per group (one per 32-bit lane) */
#define KQ_NT 8       /* activation rows per register tile */
#define KQ_RCHUNK 64  /* activation rows per sweep (their Q8_K rows, sums and the decoded weights fit L1) */
/* activation rows per register tile of the fused path (kq_fused_rows), at most 8 */
#ifndef KQ_FT_Q4
#define KQ_FT_Q4 8 /* Q4_K: 2 NT + NT + 4 live vectors */
#endif
#ifndef KQ_FT_Q6
#define KQ_FT_Q6 8
#endif
#define KQ_FT_MAX 8
#if KQ_FT_Q4 < 1 || KQ_FT_Q4 > KQ_FT_MAX || KQ_FT_Q6 < 1 || KQ_FT_Q6 > KQ_FT_MAX
#error "KQ_FT_Q4 / KQ_FT_Q6 must be 1 .. KQ_FT_MAX (the register tiles' arrays)"
#endif
/* Packed records are prefetched this many super-blocks ahead (Zen 5, cold [1024 x 131072] Q4_K
 * and the Q6_K head: 2, 4 and 8 within the VM's noise at 1, 4 and 16 rows). */
#ifndef KQ_PF_AHEAD
#define KQ_PF_AHEAD 2
#endif
/* Packed sweeps (the rows of one KQ_RCHUNK chunk of a call) of at most this many rows take the
 * fused path (Q4_K: all of them; Q6_K up to 24 rows, above which the buffer's round trip costs
 * less than assembling the 6-bit values once per row tile). Zen 5, 2 threads, Q4_K [1024 x 3072] from cache, GOP/s at the best
 * of 1000 runs, buffer for 9+ rows (KQ_FUSED_Q4 8, 4-row fused tiles) -> fused 8-row tiles for
 * all, two alternated rounds: 8 rows 867/928 -> 1016/939, 16 rows 861/888 -> 1070/992, 32 rows
 * 995/1000 -> 1063/988, 128 rows 978/1047 -> 1054/987; [3072 x 1024] 16 rows 917/897 ->
 * 1112/1056, 64 rows 1068/1058 -> 1142/1064. Q6_K, buffer from 3 rows -> 8-row fused tiles for
 * all sweeps (once the fused tiles stopped reading a spilled copy of the record from the stack),
 * 2 threads, [1024 x 3072] from cache, best of 1000, three or five alternated rounds: 4 rows
 * 354/360/379 -> 513/511/536, 8 rows 571/537/569 -> 694/676/657, 16 rows 756/696/735/691/698 ->
 * 838/832/785/786/812, 24 rows 845/809/775 -> 933/883/827, 32 rows 913/858/857 -> 873/888/869,
 * 48 rows 938/924/820 -> 878/848/803, 64 rows 860/833/870 -> 832/787/816; 1 row equal. */
/* Fused Q6_K tiles of at most this many rows (decode, 2-row verify) spread the prefetches of the
 * record ahead over its 16 sub-blocks, ~3 lines each, instead of two bursts of ~26 (one per half,
 * which filled the miss buffers: the 1-row kernel streamed at about half the rate of Q8_0's).
 * Zen 4 VM, 2 threads, the [1024 x 151936] head from memory, 1 row, medians of 20, alternated:
 * 6.9-10.1 -> 3.1-6.3 ms over 8 rounds; 4 rows equal; the larger tiles keep the bursts (their
 * share of the record is already spread over the tiles). */
#ifndef KQ_Q6_PF_SPREAD
#define KQ_Q6_PF_SPREAD 2
#endif
#ifndef KQ_FUSED_Q4
#define KQ_FUSED_Q4 KQ_RCHUNK
#endif
#ifndef KQ_FUSED_Q6
#define KQ_FUSED_Q6 24
#endif

/* One super-block of a group of 16 weight rows; lane i = weight row i of the group. */
typedef struct kq_dec {
    __m512i w[64];  /* w[v]: values 4v .. 4v+3 (bytes: Q4_K 0..15, Q6_K 0..63; Q6_K from a record -32..31) */
    __m512i sc[16]; /* sub-block scales as int32: Q4_K 0..7 (6-bit), Q6_K 0..15 (int8) */
    __m512i mp[8];  /* int16 pairs against sums-of-16 pairs: Q4_K (m_j, m_j); Q6_K -32 (sc_2p, sc_2p+1) */
    __m512i nk;     /* Q6_K from a record (w then signed q, -32..31): its NK */
    __m512 d, dmin; /* f16 d (and Q4_K dmin) as f32 */
} kq_dec;

/* ---- decoding ------------------------------------------------------------------------------- */

/* 16x16 dword transpose: c[k] lane i = dword k of r[i]. */
T512 INL void transpose16(const __m512i r[16], __m512i c[16]) {
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* u[4i + e], 128-bit lane L: element 4L + e of rows 4i .. 4i + 3 */
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xee);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xee);
        c[e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        c[4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        c[8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        c[12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
}

/* 16 bytes at offset off of each row's block (p[i] + off): h[t] lane i = dword t of row i's. */
T512 INL void heads16(const uint8_t *const p[16], size_t off, __m512i h[4]) {
    __m512i z[4];
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) { /* z[e], 128-bit lane L = row 4L + e */
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p[e] + off)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[4 + e] + off)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[8 + e] + off)), 2);
        z[e] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[12 + e] + off)), 3);
    }
    const __m512i a = _mm512_unpacklo_epi32(z[0], z[1]), b = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i c = _mm512_unpacklo_epi32(z[2], z[3]), d = _mm512_unpackhi_epi32(z[2], z[3]);
    h[0] = _mm512_unpacklo_epi64(a, c);
    h[1] = _mm512_unpackhi_epi64(a, c);
    h[2] = _mm512_unpacklo_epi64(b, d);
    h[3] = _mm512_unpackhi_epi64(b, d);
}

/* 64 bytes at offset off of each row's block, transposed: c[k] lane i = dword k of row i's. */
T512 INL void load_t16(const uint8_t *const p[16], size_t off, __m512i c[16]) {
    __m512i r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(p[i] + off);
    transpose16(r, c);
}

/* Touches the next super-block of the 16 rows (p[i] + off, bytes bytes each). */
T512 INL void prefetch16(const uint8_t *const p[16], size_t off, size_t bytes) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        for (size_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p[i] + off + b, _MM_HINT_T0);
        _mm_prefetch((const char *)p[i] + off + bytes - 1, _MM_HINT_T0);
    }
}

T512 INL __m512i byte_of(__m512i v, int b) { return _mm512_and_si512(_mm512_srli_epi32(v, 8 * b), _mm512_set1_epi32(0xff)); }

/* Super-block sb of the rows p[i] (Q4_K). */
T512 INL void q4K_decode(const uint8_t *const p[16], int64_t sb, kq_dec *D) {
    const size_t base = (size_t)sb * sizeof(block_q4_K);
    __m512i h[4];
    heads16(p, base, h); /* h[0] = d | dmin << 16, h[1..3] = scales */
    D->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
    D->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)));
    const __m512i m3f = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i m03 = _mm512_set1_epi32(0x03030303);
    /* get_scale_min_k4 (cpu_matmul_ref.c) on whole words, lane by lane */
    const __m512i u0 = h[1], u1 = h[2], u2 = h[3];
    const __m512i o0 = _mm512_and_si512(u0, m3f);
    const __m512i o1 = _mm512_or_si512(_mm512_and_si512(u2, m0f),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m03), 4));
    const __m512i o2 = _mm512_and_si512(u1, m3f);
    const __m512i o3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m03), 4));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        D->sc[j] = byte_of(j < 4 ? o0 : o1, j % 4);
        const __m512i m = byte_of(j < 4 ? o2 : o3, j % 4);
        D->mp[j] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 2
    for (int hh = 0; hh < 2; hh++) {
        __m512i c[16];
        load_t16(p, base + offsetof(block_q4_K, qs) + 64 * (size_t)hh, c);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) {
            const int q = 16 * hh + k, c2 = q / 8, kk = q % 8; /* qs dword q: values 64 c2 + 4 kk (+32) */
            D->w[8 * (2 * c2) + kk] = _mm512_and_si512(c[k], low);
            D->w[8 * (2 * c2 + 1) + kk] = _mm512_and_si512(_mm512_srli_epi16(c[k], 4), low);
        }
    }
}

/* Q6_K's -32 offset of sub-blocks 2q, 2q+1 as int16 pairs (-32 sc_2q, -32 sc_2q+1) per lane,
 * against the Q8_K sums of 16 (bs_2q, bs_2q+1). */
T512 INL __m512i q6K_offset_pair(__m512i sc_a, __m512i sc_b) {
    const __m512i a = _mm512_slli_epi32(sc_a, 5), b = _mm512_slli_epi32(sc_b, 5);
    const __m512i na = _mm512_sub_epi32(_mm512_setzero_si512(), a), nb = _mm512_sub_epi32(_mm512_setzero_si512(), b);
    return _mm512_or_si512(_mm512_and_si512(na, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(nb, 16));
}

/* Q6_K's -32 offset as int16 pairs (-32 sc_2q, -32 sc_2q+1) against the Q8_K sums of 16. */
T512 INL void q6K_offsets(kq_dec *D) {
#pragma GCC unroll 8
    for (int q = 0; q < 8; q++) D->mp[q] = q6K_offset_pair(D->sc[2 * q], D->sc[2 * q + 1]);
}

/* The 64 value vectors of a Q6_K super-block from its ql (dwords 0..31) and qh (dwords 0..15) in
 * lanes: value 4 v + e of lane i = byte e of D->w[v], q + 32 (0..63), or (SIGNED) q (-32..31). */
T512 INL void q6K_assemble(const __m512i ql[32], const __m512i qh[16], const int SIGNED, kq_dec *D) {
    const __m512i off = _mm512_set1_epi8(SIGNED ? 32 : 0);
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
#pragma GCC unroll 8
            for (int ll = 0; ll < 8; ll++) {
                /* values 128 n + 32 s + 4 ll: ql dword 16 n + 8 (s & 1) + ll (nibble s >> 1), qh dword
                 * 8 n + ll (bits 2 s, 2 s + 1 of each byte) */
                const __m512i v = q6K_vec(ql[16 * n + 8 * (s & 1) + ll], qh[8 * n + ll], s);
                D->w[32 * n + 8 * s + ll] = SIGNED ? _mm512_sub_epi8(v, off) : v;
            }
        }
    }
}

/* Super-block sb of the rows p[i] (Q6_K). */
T512 INL void q6K_decode(const uint8_t *const p[16], int64_t sb, kq_dec *D) {
    const size_t base = (size_t)sb * sizeof(block_q6_K);
    uint16_t dh[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) memcpy(&dh[i], p[i] + base + offsetof(block_q6_K, d), 2);
    D->d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
    D->dmin = _mm512_setzero_ps();
    __m512i h[4];
    heads16(p, base + offsetof(block_q6_K, scales), h);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) D->sc[j] = _mm512_srai_epi32(_mm512_slli_epi32(h[j / 4], 24 - 8 * (j % 4)), 24);
    q6K_offsets(D);
    __m512i ql[32], qh[16];
    load_t16(p, base + offsetof(block_q6_K, ql), ql);
    load_t16(p, base + offsetof(block_q6_K, ql) + 64, ql + 16);
    load_t16(p, base + offsetof(block_q6_K, qh), qh);
    q6K_assemble(ql, qh, 0, D);
}

/* The same decodes from a KQ_X16 record (cpu_pack.c), whose lanes are already row by row: loads,
 * byte widening, nibble masks and (Q6_K) the bit assembly, no transposes; the same D. */
T512 INL void q4K_decode_x16(const uint8_t *R, kq_dec *D) {
    const __m512i h0 = _mm512_load_si512(R);
    D->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
    D->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        D->sc[j] = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_SC + 16 * j)));
        const __m512i m = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * j)));
        D->mp[j] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 32
    for (int q = 0; q < 32; q++) {
        const __m512i c = _mm512_load_si512(R + CPU_KQ_X16_QS + 64 * q);
        const int c2 = q / 8, kk = q % 8; /* qs dword q: values 64 c2 + 4 kk (+32) */
        D->w[8 * (2 * c2) + kk] = _mm512_and_si512(c, low);
        D->w[8 * (2 * c2 + 1) + kk] = _mm512_and_si512(_mm512_srli_epi16(c, 4), low);
    }
}

/* Q6_K from a record: the values as signed q (-32..31) and the record's NK, for biased activations
 * (kq_rows with BIAS; no mp). */
T512 INL void q6K_decode_x16(const uint8_t *R, kq_dec *D) {
    D->d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)R));
    D->dmin = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        D->sc[j] = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q6K_SC + 16 * j)));
    }
    D->nk = _mm512_load_si512(R + CPU_KQ_X16_Q6K_NK);
    /* the record's ql / qh vectors are the transposes' output already (64-byte aligned) */
    q6K_assemble((const __m512i *)(R + CPU_KQ_X16_Q6K_QL), (const __m512i *)(R + CPU_KQ_X16_Q6K_QH), 1, D);
}

/* ---- the row tiles ---------------------------------------------------------------------------- */

T512 INL __m512i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc[r] (16 lanes) += the super-block's f32 step for activation rows r0 .. r0+NT-1 from the exact
 * int32 sums: fma(f32(S), d * dx, acc), then (Q4_K) fnmadd(f32(M), dmin * dx, acc). */
T512 INL void kq_acc_rows(const __m512i *S, const __m512i *M, __m512 d, __m512 dmin, const int Q6, const cpu_act *act,
                          int64_t sb, int64_t r0, const int NT, float *acc) {
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) {
        const __m512 dx = _mm512_set1_ps(act->d[(r0 + r) * (act->n_in / QK_K) + sb]);
        __m512 a = _mm512_load_ps(acc + 16 * r);
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[r]), _mm512_mul_ps(d, dx), a);
        if (!Q6) a = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[r]), _mm512_mul_ps(dmin, dx), a);
        _mm512_store_ps(acc + 16 * r, a);
    }
}

/* acc[r] (16 lanes, in memory) += super-block sb of the group for activation rows r0 .. r0+NT-1.
 * Q6: Q6_K (16 sub-blocks of 16, offset -32), else Q4_K (8 sub-blocks of 32, mins). BIAS (Q6_K
 * from a record): D->w holds signed q against the biased activations qsu, and S starts from
 * D->nk instead of taking the offset from the sums of 16 (the same integer S). */
/* pf / npf: cache lines to prefetch during the call, spread over its sub-blocks (packed weights:
 * a share of the record KQ_PF_AHEAD super-blocks ahead; a burst of them at once stalled the
 * rows). Into L1 for tiles of up to act->pf_l1_rows rows (2 on AMD, 0 on Intel: cpu_kernels), into
 * L2 for more (as the packed Q8_0 kernel: there the lines ahead evicted the record in use from L1);
 * the 0.6B Q4_K_M model's 4-row verify 25-30 -> 22-24 ms, alternated. */
T512 INL void kq_rows(const kq_dec *D, const int Q6, const int BIAS, const cpu_act *act, int64_t sb, int64_t r0,
                      const int NT, float *acc, const char *pf, int npf) {
    const int8_t *x0 = act->qs + r0 * act->n_in + sb * QK_K; /* row r at + r * n_in */
    const uint8_t *xu0 = act->qsu + r0 * act->n_in + sb * QK_K;
    const int16_t *bs[KQ_NT];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) bs[r] = act->bsums + (r0 + r) * (act->n_in / 16) + sb * 16;
    const int nsub = Q6 ? 16 : 8, per = Q6 ? 4 : 8; /* sub-blocks, dwords per sub-block */
    __m512i S[KQ_NT];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) S[r] = BIAS ? D->nk : _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < nsub; j++) { /* a loop, not unrolled: 2 NT + 3 live vectors, no spills */
        for (int l = npf * j / nsub; l < npf * (j + 1) / nsub; l++) { /* L2 for 3+ rows (below) */
            if (NT <= act->pf_l1_rows) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
            else _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
        }
        __m512i dot[KQ_NT];
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) dot[r] = _mm512_setzero_si512();
        const int8_t *xj = x0 + 4 * per * j;
        const uint8_t *xuj = xu0 + 4 * per * j;
#pragma GCC unroll 8
        for (int k = 0; k < per; k++) {
            __m512i wv = D->w[per * j + k];
            __asm__("" : "+v"(wv)); /* one load, NT uses */
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) {
                dot[r] = BIAS ? _mm512_dpbusd_epi32(dot[r], bcast32(xuj + r * act->n_in + 4 * k), wv)
                              : _mm512_dpbusd_epi32(dot[r], wv, bcast32(xj + r * act->n_in + 4 * k));
            }
        }
        __m512i sc = D->sc[j];
        __asm__("" : "+v"(sc));
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(dot[r], sc));
    }
    __m512i M[KQ_NT];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) M[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int q = 0; q < 8 && !BIAS; q++) {
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) {
            if (Q6) {
                S[r] = _mm512_dpwssd_epi32(S[r], D->mp[q], bcast32(bs[r] + 2 * q)); /* -32 sc (bs_2q, bs_2q+1) */
            } else {
                M[r] = _mm512_dpwssd_epi32(M[r], D->mp[q], bcast32(bs[r] + 2 * q)); /* m_q (bs_2q + bs_2q+1) */
            }
        }
    }
    kq_acc_rows(S, M, D->d, D->dmin, Q6, act, sb, r0, NT, acc);
}

/* The fused path for packed weights (KQ_X16 records, NT <= KQ_FT_MAX activation rows): the record is
 * decoded in registers and multiplied at once, with no kq_dec round trip through L1 (64 stores
 * and loads per super-block, which bound the one-row kernel below the memory's rate). The int32
 * sums S and M are the exact integers kq_rows forms and the f32 steps are the same, so the bits
 * are the same. pf / npf: as kq_rows, spread over the sub-blocks (Q6_K) or the 32 qs dwords
 * (Q4_K). */
T512 INL void kq_fused_rows(const uint8_t *R, const int Q6, const cpu_act *act, int64_t sb, int64_t r0, const int NT,
                            float *acc, const char *pf, int npf) {
    int64_t n = act->n_in;
    const int8_t *x0 = act->qs + r0 * n + sb * QK_K; /* row r at + r * n */
    /* opaque to the optimizer: else it hoists the record's loads and the rows' addresses out of
     * the caller's row-tile loop and spills them (the Q6_K tiles read their record from the stack) */
    __asm__("" : "+r"(R), "+r"(x0), "+r"(n));
    __m512i S[KQ_FT_MAX], M[KQ_FT_MAX];
#pragma GCC unroll 8
    for (int r = 0; r < NT; r++) S[r] = M[r] = _mm512_setzero_si512();
    __m512 d, dmin = _mm512_setzero_ps();
    if (Q6) {
        /* biased activations: sum_j sc_j sum_i (x_i + 128) q_i = S - NK, so S starts from NK (the
         * record's -128 sum_j sc_j sum_i q_i) and needs no sums of 16 */
        const uint8_t *xu0 = act->qsu + r0 * n + sb * QK_K; /* row r at + r * n */
        __asm__("" : "+r"(xu0));
        const __m512i nk = _mm512_load_si512(R + CPU_KQ_X16_Q6K_NK), off32 = _mm512_set1_epi8(32);
#pragma GCC unroll 8
        for (int r = 0; r < NT; r++) S[r] = nk;
        d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)R));
        const __m512i *ql = (const __m512i *)(R + CPU_KQ_X16_Q6K_QL), *qh = (const __m512i *)(R + CPU_KQ_X16_Q6K_QH);
        const uint8_t *sc8 = R + CPU_KQ_X16_Q6K_SC;
        /* sub-block 8 nn + j, j = 2 s + h: values 128 nn + 16 j .. + 15, value vectors 32 nn + 4 j + t
         * (ql dword 16 nn + 8 (s & 1) + 4 h + t, qh dword 8 nn + 4 h + t, as q6K_assemble). The
         * halves are a loop (not unrolled) so that the compiler keeps each value vector in one
         * register for its NT uses (unrolled, it spilled) */
#pragma GCC unroll 1
        for (int nn = 0; nn < 2; nn++) {
            /* tiles of more than KQ_Q6_PF_SPREAD rows prefetch their share of the record ahead in
             * two bursts, one per half (below: the smaller ones, per sub-block) */
            for (int l = npf * nn / 2; NT > KQ_Q6_PF_SPREAD && l < npf * (nn + 1) / 2; l++) {
                if (NT <= act->pf_l1_rows) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
                else _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
            }
            const __m512i *qln = ql + 16 * nn, *qhn = qh + 8 * nn;
            const uint8_t *xn = xu0 + 128 * nn;
            const uint8_t *scn = sc8 + 128 * nn;
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const int j = 2 * s + h;
                    if (NT <= KQ_Q6_PF_SPREAD) { /* step 8 nn + j of 16: its share of the lines */
                        const int st = 8 * nn + j;
                        for (int l = npf * st / 16; l < npf * (st + 1) / 16; l++) {
                            if (NT <= act->pf_l1_rows) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
                            else _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
                        }
                    }
                    __m512i dot[KQ_FT_MAX];
#pragma GCC unroll 8
                    for (int r = 0; r < NT; r++) dot[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int t = 0; t < 4; t++) {
                        const int ll = 4 * h + t;
                        /* q = (q + 32) - 32, the signed operand (the activations are the unsigned one) */
                        __m512i wv = _mm512_sub_epi8(
                            q6K_vec(_mm512_load_si512(qln + 8 * (s & 1) + ll), _mm512_load_si512(qhn + ll), s), off32);
                        __asm__("" : "+v"(wv)); /* one vector, NT uses */
#pragma GCC unroll 8
                        for (int r = 0; r < NT; r++) dot[r] = _mm512_dpbusd_epi32(dot[r], bcast32(xn + r * n + 16 * j + 4 * t), wv);
                    }
                    __m512i sc = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(scn + 16 * j)));
                    __asm__("" : "+v"(sc));
#pragma GCC unroll 8
                    for (int r = 0; r < NT; r++) {
                        S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(dot[r], sc));
                        __asm__("" : "+v"(S[r])); /* in order: no tree of the sub-blocks' products */
                    }
                }
            }
        }
    } else {
        const __m512i h0 = _mm512_load_si512(R);
        d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
        dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
        const __m512i low = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 1
        for (int c2 = 0; c2 < 4; c2++) { /* qs dwords 8 c2 + kk: values 64 c2 + 4 kk (low nibbles), + 32 (high) */
            __m512i dl[KQ_FT_MAX], dh[KQ_FT_MAX];
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) dl[r] = dh[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++) {
                const int l = 8 * c2 + kk;
                for (int li = npf * l / 32; li < npf * (l + 1) / 32; li++) {
                    if (NT <= act->pf_l1_rows) _mm_prefetch(pf + 64 * li, _MM_HINT_T0);
                    else _mm_prefetch(pf + 64 * li, _MM_HINT_T1);
                }
                const __m512i c = _mm512_load_si512(R + CPU_KQ_X16_QS + 64 * l);
                const __m512i lo = _mm512_and_si512(c, low), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), low);
#pragma GCC unroll 8
                for (int r = 0; r < NT; r++) {
                    const int8_t *xr = x0 + r * n + 64 * c2 + 4 * kk;
                    dl[r] = _mm512_dpbusd_epi32(dl[r], lo, bcast32(xr));
                    dh[r] = _mm512_dpbusd_epi32(dh[r], hi, bcast32(xr + 32));
                }
            }
            const __m512i sl = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_SC + 16 * (2 * c2))));
            const __m512i sh =
                _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_SC + 16 * (2 * c2 + 1))));
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) {
                S[r] = _mm512_add_epi32(S[r], _mm512_add_epi32(_mm512_mullo_epi32(dl[r], sl), _mm512_mullo_epi32(dh[r], sh)));
            }
        }
        /* M = sum_q m_q bs32_q: int16 pairs (m_2p, m_2p+1) against the sums of 32 (bs32_2p,
         * bs32_2p+1), 4 vpdpwssd per row instead of 8 against the sums of 16 (a broken build
         * without the mins bounded what they cost at 15-20% of the kernel) */
        const int16_t *b32 = act->bsums32 + r0 * (n / 32) + sb * 8; /* row r at + r * (n / 32) */
#pragma GCC unroll 1
        for (int q2 = 0; q2 < 4; q2++) {
            const __m512i ma = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * (2 * q2))));
            const __m512i mb =
                _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * (2 * q2 + 1))));
            const __m512i mp = _mm512_or_si512(ma, _mm512_slli_epi32(mb, 16));
#pragma GCC unroll 8
            for (int r = 0; r < NT; r++) M[r] = _mm512_dpwssd_epi32(M[r], mp, bcast32(b32 + r * (n / 32) + 2 * q2));
        }
    }
    kq_acc_rows(S, M, d, dmin, Q6, act, sb, r0, NT, acc);
}

/* X16: w is packed as TENSOR_LAYOUT_KQ_X16 (group g's records from w + 16 g w_nb1; o0 % 16 == 0). */
T512 INL void mm_kq_512(const void *w, size_t w_nb1, const int Q6, const int X16, const cpu_act *act, int64_t r0,
                        int64_t nr, float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t nsb = act->n_in / QK_K;
    const size_t bsz = Q6 ? sizeof(block_q6_K) : sizeof(block_q4_K);
    const size_t rec = tensor_kq_x16_record_bytes(Q6 ? QUANT_TYPE_Q6_K : QUANT_TYPE_Q4_K);
    kq_dec D;
    float acc[KQ_RCHUNK * 16] __attribute__((aligned(64)));
    for (int64_t o = o0; o < o1; o += KQ_W) {
        const int nw = o1 - o >= KQ_W ? KQ_W : (int)(o1 - o);
        const __mmask16 mask = (__mmask16)((1u << nw) - 1);
        const uint8_t *p[KQ_W]; /* missing rows repeat the last one (their lanes are not stored) */
        const uint8_t *grp = (const uint8_t *)w + (size_t)o * w_nb1; /* X16: the group's first record */
        if (!X16) {
            for (int i = 0; i < KQ_W; i++) p[i] = (const uint8_t *)w + (size_t)(o + (i < nw ? i : nw - 1)) * w_nb1;
        }
        for (int64_t rc = r0; rc < r0 + nr; rc += KQ_RCHUNK) {
            const int64_t nrc = r0 + nr - rc >= KQ_RCHUNK ? KQ_RCHUNK : r0 + nr - rc;
            for (int64_t r = 0; r < nrc; r++) _mm512_store_ps(acc + 16 * r, _mm512_setzero_ps());
            for (int64_t sb = 0; sb < nsb; sb++) {
                /* X16: the record KQ_PF_AHEAD ahead (the next group's first ones at the end of a
                 * group), a share in each row tile */
                const char *pf = (const char *)grp + (size_t)(sb + KQ_PF_AHEAD) * rec;
                const int n_pf = X16 ? (int)(rec / 64) : 0, n_tiles = (int)((nrc + KQ_NT - 1) / KQ_NT);
                if (X16 && nrc <= (Q6 ? KQ_FUSED_Q6 : KQ_FUSED_Q4)) { /* decode in registers, per row tile */
                    const uint8_t *R = grp + (size_t)sb * rec;
                    const int ft = Q6 ? KQ_FT_Q6 : KQ_FT_Q4, nft = (int)((nrc + ft - 1) / ft);
                    for (int64_t rt = 0; rt < nrc; rt += ft) {
                        const int nt = nrc - rt >= ft ? ft : (int)(nrc - rt);
                        float *a = acc + 16 * rt;
                        const int t = (int)(rt / ft), l0 = n_pf * t / nft, np = n_pf * (t + 1) / nft - l0;
                        const char *p0 = pf + 64 * l0;
                        switch (nt) {
                        case 1: kq_fused_rows(R, Q6, act, sb, rc + rt, 1, a, p0, np); break;
                        case 2: kq_fused_rows(R, Q6, act, sb, rc + rt, 2, a, p0, np); break;
                        case 3: kq_fused_rows(R, Q6, act, sb, rc + rt, 3, a, p0, np); break;
                        case 4: kq_fused_rows(R, Q6, act, sb, rc + rt, 4, a, p0, np); break;
                        case 5: kq_fused_rows(R, Q6, act, sb, rc + rt, 5, a, p0, np); break;
                        case 6: kq_fused_rows(R, Q6, act, sb, rc + rt, 6, a, p0, np); break;
                        case 7: kq_fused_rows(R, Q6, act, sb, rc + rt, 7, a, p0, np); break;
                        default: kq_fused_rows(R, Q6, act, sb, rc + rt, 8, a, p0, np); break;
                        }
                    }
                    continue;
                }
                if (X16) {
                    if (Q6) {
                        q6K_decode_x16(grp + (size_t)sb * rec, &D);
                    } else {
                        q4K_decode_x16(grp + (size_t)sb * rec, &D);
                    }
                } else {
                    if (sb + 1 < nsb) prefetch16(p, (size_t)(sb + 1) * bsz, bsz);
                    if (Q6) {
                        q6K_decode(p, sb, &D);
                    } else {
                        q4K_decode(p, sb, &D);
                    }
                }
                for (int64_t rt = 0; rt < nrc; rt += KQ_NT) {
                    const int nt = nrc - rt >= KQ_NT ? KQ_NT : (int)(nrc - rt);
                    float *a = acc + 16 * rt;
                    const int t = (int)(rt / KQ_NT), l0 = n_pf * t / n_tiles, l1 = n_pf * (t + 1) / n_tiles;
                    const char *p0 = pf + 64 * l0;
                    const int np = l1 - l0;
                    switch (nt) {
                    case 1: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 1, a, p0, np); break;
                    case 2: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 2, a, p0, np); break;
                    case 3: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 3, a, p0, np); break;
                    case 4: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 4, a, p0, np); break;
                    case 5: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 5, a, p0, np); break;
                    case 6: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 6, a, p0, np); break;
                    case 7: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 7, a, p0, np); break;
                    default: kq_rows(&D, Q6, Q6 && X16, act, sb, rc + rt, 8, a, p0, np); break;
                    }
                }
            }
            for (int64_t r = 0; r < nrc; r++) _mm512_mask_storeu_ps(dst + (rc + r) * ds + o, mask, _mm512_load_ps(acc + 16 * r));
        }
    }
}

T512 static void mm_q4_K_512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_512(w, w_nb1, 0, 0, act, r0, nr, dst, ds, o0, o1);
}

T512 static void mm_q6_K_512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_512(w, w_nb1, 1, 0, act, r0, nr, dst, ds, o0, o1);
}

T512 void cpu_mm_q4_K_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                                 int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_512(w, w_nb1, 0, 1, act, r0, nr, dst, ds, o0, o1);
}

T512 void cpu_mm_q6_K_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                                 int64_t ds, int64_t o0, int64_t o1) {
    mm_kq_512(w, w_nb1, 1, 1, act, r0, nr, dst, ds, o0, o1);
}

void cpu_kernels_init_kquant_avx512(cpu_kernels *k) {
    k->matmul[QUANT_TYPE_Q4_K] = mm_q4_K_512;
    k->matmul[QUANT_TYPE_Q6_K] = mm_q6_K_512;
    k->matmul_packed[QUANT_TYPE_Q4_K] = cpu_mm_q4_K_x16_avx512;
    k->matmul_packed[QUANT_TYPE_Q6_K] = cpu_mm_q6_K_x16_avx512;
    k->pack_layout[QUANT_TYPE_Q4_K] = TENSOR_LAYOUT_KQ_X16;
    k->pack_layout[QUANT_TYPE_Q6_K] = TENSOR_LAYOUT_KQ_X16;
}

#else
void cpu_kernels_init_kquant_avx512(cpu_kernels *k) { (void)k; }
void cpu_mm_q4_K_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_kq_x16_ref(QUANT_TYPE_Q4_K, TENSOR_LAYOUT_KQ_X16, w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
void cpu_mm_q6_K_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1) {
    cpu_matmul_kq_x16_ref(QUANT_TYPE_Q6_K, TENSOR_LAYOUT_KQ_X16, w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
#endif
