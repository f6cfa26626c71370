/* cpu_gemm_q4k_amx.c: packed Q4_K x Q8_K matmul with AMX-INT8 tiles for batches of 16+ activation
 * rows, giving the bits of the AVX-512 VNNI kernel (cpu_gemm_kquant_avx512.c).
 *
 * That kernel computes, per (weight row, activation row) and super-block, the exact int32 sums
 * S = sum_j sc_j dot_j (sub-block j's 6-bit scale times its 32-value integer dot) and
 * M = sum_j m_j bsum_j, then acc = fma(f32(S), d dx, acc) and acc = fnmadd(f32(M), dmin dx, acc).
 * Here S comes from the tile unit. A tile product accumulates whole rows of 64 bytes, which cross
 * sub-blocks, so the scales go into the weight bytes: with sc = 16 h + l (l 0..15, h 0..3) the
 * bytes q l (<= 225) and q h (<= 45) fit the unsigned operand, and
 *   S = sum_k x_k q_k l_j(k) + 16 sum_k x_k q_k h_j(k),
 * two tile products over the super-block (tdpbsud: signed activations times unsigned weights).
 * Both are exact integers, so S is the VNNI kernel's S bit for bit; M and the float steps are the
 * VNNI kernel's code. The result is therefore the same for every row count and row range, and a
 * call mixes tiles freely: rows past the last whole 16 go to the VNNI kernel.
 *
 * Tiles (all 16 rows x 64 bytes): A = 16 activation rows x 64 values (the Q8_K rows in place,
 * stride n_in), B = 64 values x 16 weight rows in VNNI order (dword i of a row = 4 values of weight
 * row i: exactly the packed record's quant dwords after the scale multiply), C = [16 activation
 * rows][16 weight rows] int32, the VNNI kernel's accumulator layout. The tile intrinsics are asm
 * statements without memory operands, so compiler barriers fence the vector code's stores before
 * tile loads and the tile stores before vector loads (docs/quantization.md, "AMX-INT8 tiles"). */
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define TAMX                                                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))
#define INL static inline __attribute__((always_inline))

#define AMX_W 16        /* weight rows per group (the packed record's lanes) */
#define AMX_TR 16       /* activation rows per tile */
#define AMX_RCHUNK 64   /* activation rows per sweep of a group's super-blocks (acc in L1) */

#define AMX_BARRIER() __asm__ volatile("" ::: "memory")

/* ldtilecfg's 64-byte operand: palette 1, tiles 0..4 all 16 rows x 64 bytes. */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* One super-block of a group: the tile operands and what the vector steps need. */
typedef struct amx_q4k_dec {
    uint8_t bl[4][1024] __attribute__((aligned(64))); /* B tiles, values 64 t .. 64 t + 63: q * l_j */
    uint8_t bh[4][1024] __attribute__((aligned(64))); /* the same, q * h_j */
    __m512i mp[8];  /* int16 pairs (m_j, m_j) against the Q8_K sums-of-16 pairs */
    __m512 d, dmin; /* per lane */
} amx_q4k_dec;

/* The record R (TENSOR_LAYOUT_KQ_X16, cpu_pack.c) of one super-block into D. */
TAMX INL void amx_q4k_decode(const uint8_t *R, amx_q4k_dec *D) {
    const __m512i h0 = _mm512_load_si512(R);
    D->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
    D->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
    __m512i L[8], H[8];
    const __m512i m15 = _mm512_set1_epi32(15);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_SC + 16 * j)));
        const __m512i l = _mm512_and_si512(sc, m15), h = _mm512_srli_epi32(sc, 4);
        L[j] = _mm512_or_si512(l, _mm512_slli_epi32(l, 16)); /* the multiplier in both 16-bit halves */
        H[j] = _mm512_or_si512(h, _mm512_slli_epi32(h, 16));
        const __m512i m = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * j)));
        D->mp[j] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512i *bl = (__m512i *)D->bl, *bh = (__m512i *)D->bh; /* vector v: values 4 v .. 4 v + 3 */
#pragma GCC unroll 32
    for (int q = 0; q < 32; q++) {
        const __m512i c = _mm512_load_si512(R + CPU_KQ_X16_QS + 64 * q);
        const int c2 = q / 8, kk = q % 8; /* qs dword q: values 64 c2 + 4 kk (low nibbles), + 32 (high) */
        const __m512i lo = _mm512_and_si512(c, low), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), low);
        /* a byte times l <= 225 (h <= 45): the 16-bit products never carry into the next byte */
        bl[16 * c2 + kk] = _mm512_mullo_epi16(lo, L[2 * c2]);
        bh[16 * c2 + kk] = _mm512_mullo_epi16(lo, H[2 * c2]);
        bl[16 * c2 + 8 + kk] = _mm512_mullo_epi16(hi, L[2 * c2 + 1]);
        bh[16 * c2 + 8 + kk] = _mm512_mullo_epi16(hi, H[2 * c2 + 1]);
    }
}

TAMX INL __m512i amx_bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc[16 (r - rc) + lane] += super-block sb for the activation rows of the stored C tiles cl / ch
 * ([16 rows][16 lanes] int32), rows ra .. ra + 15: the VNNI kernel's steps after its integer dots. */
TAMX INL void amx_q4k_finish(const amx_q4k_dec *D, const cpu_act *act, int64_t sb, int64_t ra, int64_t rc,
                             const int32_t *cl, const int32_t *ch, float *acc) {
    const int64_t nbs = act->n_in / 16, nsb = act->n_in / QK_K;
#pragma GCC unroll 2
    for (int r = 0; r < AMX_TR; r++) {
        const int64_t row = ra + r;
        const __m512i S = _mm512_add_epi32(_mm512_load_si512(cl + 16 * r), _mm512_slli_epi32(_mm512_load_si512(ch + 16 * r), 4));
        const int16_t *bs = act->bsums + row * nbs + sb * 16;
        __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) M = _mm512_dpwssd_epi32(M, D->mp[q], amx_bcast32(bs + 2 * q)); /* m_q (bs_2q + bs_2q+1) */
        const __m512 dx = _mm512_set1_ps(act->d[row * nsb + sb]);
        float *a = acc + 16 * (row - rc);
        __m512 v = _mm512_load_ps(a);
        v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(D->d, dx), v);
        v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(D->dmin, dx), v);
        _mm512_store_ps(a, v);
    }
}

/* The tile products of super-block sb for activation rows ra .. ra + 16 ng - 1 (ng 1 or 2): C tiles
 * 0, 1 (rows ra ..) and 5, 6 (rows ra + 16 ..); A tiles 2, 7; B tiles 3 (q l), 4 (q h). Stores
 * them into c[g][0 / 1]. */
TAMX INL void amx_q4k_tiles(const amx_q4k_dec *D, const cpu_act *act, int64_t sb, int64_t ra, const int ng,
                            int32_t c[2][2][256]) {
    const size_t stride = (size_t)act->n_in;
    const int8_t *x0 = act->qs + ra * act->n_in + sb * QK_K;
    const int8_t *x1 = x0 + AMX_TR * act->n_in;
    _tile_zero(0);
    _tile_zero(1);
    if (ng == 2) {
        _tile_zero(5);
        _tile_zero(6);
    }
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        _tile_loadd(2, x0 + 64 * t, stride);
        _tile_loadd(3, D->bl[t], 64);
        _tile_loadd(4, D->bh[t], 64);
        _tile_dpbsud(0, 2, 3);
        _tile_dpbsud(1, 2, 4);
        if (ng == 2) {
            _tile_loadd(7, x1 + 64 * t, stride);
            _tile_dpbsud(5, 7, 3);
            _tile_dpbsud(6, 7, 4);
        }
    }
    _tile_stored(0, c[0][0], 64);
    _tile_stored(1, c[0][1], 64);
    if (ng == 2) {
        _tile_stored(5, c[1][0], 64);
        _tile_stored(6, c[1][1], 64);
    }
    AMX_BARRIER(); /* the tile stores before the vector loads of c */
}

/* Rows r0 .. r0 + nr - 1 (nr a multiple of 16) of the packed weight's outputs o0 .. o1 - 1. */
TAMX static void amx_q4k_rows(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                              int64_t ds, int64_t o0, int64_t o1) {
    const int64_t nsb = act->n_in / QK_K;
    const size_t rec = tensor_kq_x16_record_bytes(QUANT_TYPE_Q4_K);
    amx_q4k_dec D;
    float acc[AMX_RCHUNK * 16] __attribute__((aligned(64)));
    int32_t c[2][2][256] __attribute__((aligned(64)));
    amx_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    _tile_loadconfig(&cfg);
    for (int64_t o = o0; o < o1; o += AMX_W) {
        const int nw = o1 - o >= AMX_W ? AMX_W : (int)(o1 - o);
        const __mmask16 mask = (__mmask16)((1u << nw) - 1);
        const uint8_t *grp = (const uint8_t *)w + (size_t)o * w_nb1; /* the group's first record */
        for (int64_t rc = r0; rc < r0 + nr; rc += AMX_RCHUNK) {
            const int64_t nrc = r0 + nr - rc >= AMX_RCHUNK ? AMX_RCHUNK : r0 + nr - rc;
            for (int64_t r = 0; r < nrc; r++) _mm512_store_ps(acc + 16 * r, _mm512_setzero_ps());
            for (int64_t sb = 0; sb < nsb; sb++) {
                const char *pf = (const char *)grp + (size_t)(sb + 2) * rec; /* two records ahead, into L2 */
                for (size_t l = 0; l < rec; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
                amx_q4k_decode(grp + (size_t)sb * rec, &D);
                AMX_BARRIER(); /* the B tiles' vector stores before the tile loads */
                for (int64_t g = 0; g < nrc; g += 2 * AMX_TR) {
                    const int64_t ra = rc + g;
                    if (nrc - g >= 2 * AMX_TR) {
                        amx_q4k_tiles(&D, act, sb, ra, 2, c);
                        amx_q4k_finish(&D, act, sb, ra, rc, c[0][0], c[0][1], acc);
                        amx_q4k_finish(&D, act, sb, ra + AMX_TR, rc, c[1][0], c[1][1], acc);
                    } else {
                        amx_q4k_tiles(&D, act, sb, ra, 1, c);
                        amx_q4k_finish(&D, act, sb, ra, rc, c[0][0], c[0][1], acc);
                    }
                    AMX_BARRIER(); /* the vector loads of c before the next tile stores */
                }
            }
            for (int64_t r = 0; r < nrc; r++) _mm512_mask_storeu_ps(dst + (rc + r) * ds + o, mask, _mm512_load_ps(acc + 16 * r));
        }
    }
    _tile_release();
}

void cpu_mm_q4_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1) {
    const int64_t n16 = nr / AMX_TR * AMX_TR;
    if (n16 > 0) amx_q4k_rows(w, w_nb1, act, r0, n16, dst, ds, o0, o1);
    if (nr > n16) cpu_mm_q4_K_x16_avx512(w, w_nb1, act, r0 + n16, nr - n16, dst, ds, o0, o1);
}

#else
void cpu_mm_q4_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1) {
    cpu_mm_q4_K_x16_avx512(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
#endif
