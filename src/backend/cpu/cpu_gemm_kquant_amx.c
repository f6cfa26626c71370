/* cpu_gemm_kquant_amx.c: packed Q4_K / Q6_K x Q8_K matmul with AMX-INT8 tiles for calls of 9+
 * activation rows, giving the bits of the AVX-512 VNNI kernels (cpu_gemm_kquant_avx512.c).
 *
 * Those kernels compute, per (weight row, activation row) and super-block, an exact int32 S (the
 * sub-block scales times their integer dots) and for Q4_K an exact M (the mins times the sums of
 * the activations), then acc = fma(f32(S), d dx, acc) (and acc = fnmadd(f32(M), dmin dx, acc)).
 * Here S comes from the tile unit. A tile product accumulates whole rows of 64 bytes, which cross
 * sub-blocks, so the scales go into the weight bytes, split so that every byte is a valid operand:
 * - Q4_K: with sc = 16 h + l (l 0..15, h 0..3) the bytes q l (<= 225) and q h (<= 45) fit the
 *   unsigned operand, and S = sum_k x_k q_k l_j(k) + 16 sum_k x_k q_k h_j(k): two tile products
 *   over the super-block (tdpbsud: signed activations times unsigned weights);
 * - Q6_K: the product P = sc_j q_k (sc int8, q -32..31: |P| <= 4096) is split into its low byte
 *   as an unsigned value, lo = P - 256 hi (0..255), and hi = P >> 8 (-16..16, floor), and S =
 *   sum_k x_k lo_k + 256 sum_k x_k hi_k: two tile products (tdpbsud for lo, tdpbssd for hi).
 * Both splits give exact integers, so S is the VNNI kernel's S bit for bit (the Q6_K VNNI kernel
 * forms the same integer from biased activations and the record's NK). The Q4_K mins M come from
 * the Q8_K sums of 32 (act->bsums32), the same integer as the VNNI kernel's; the float steps are
 * its code. The result is therefore the same for every row count and row range, and calls
 * mix freely: those of fewer than AMX_MIN_ROWS rows go to the VNNI kernel.
 *
 * Tiles (16 rows x 64 bytes; set 1 fewer rows for a call's last part, amx_rows): A = 16
 * activation rows x 64 values (the Q8_K rows in place, stride n_in), B = 64 values x 16 weight
 * rows in VNNI order (dword i of a row = 4 values of weight row i: the packed record's quant
 * dwords after the scale multiply), C = [16 activation rows][16 weight rows] int32, the VNNI
 * kernel's accumulator layout. The tile intrinsics are asm statements without memory operands,
 * so compiler barriers fence the vector code's stores before tile loads and the tile stores
 * before vector loads (docs/quantization.md, "AMX-INT8 tiles"). */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#if defined(__x86_64__)
#include "backend/cpu/cpu_kquant_avx512.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define TAMX                                                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))
#define INL static inline __attribute__((always_inline))

#define AMX_W 16        /* weight rows per group (the packed record's lanes) */
#define AMX_TR 16       /* activation rows per tile */
/* Activation rows per sweep of a group's super-blocks (their f32 sums, 64 bytes a row, stay in L1;
 * each record is decoded once per sweep). SPR-class VM, 2 threads, 512 rows from cache, ms, 2
 * alternated rounds, 64 / 128 / 256: Q4_K [1024 x 3072] 2.35-2.36 / 2.27-2.31 / 2.18-2.22, Q6_K
 * [3072 x 1024] 2.05-2.07 / 1.80-1.81 / 1.77-1.79. */
#ifndef AMX_RCHUNK
#define AMX_RCHUNK 256
#endif

/* Records are prefetched into L2 AMX_PF_AHEAD super-blocks ahead and into L1 one ahead (the
 * next group's first ones at a group's end). SPR-class VM, 2 threads, [1024 x 3072] Q4_K at 16
 * rows from memory, ms, 3 alternated rounds: L2 2 ahead 0.138-0.144, L2 4 + L1 1 ahead
 * 0.132-0.133, L2 8 + L1 1 0.130-0.137; L2 only, 2 / 4 / 8 / 16 ahead, within 10% of each other. */
#ifndef AMX_PF_AHEAD
#define AMX_PF_AHEAD 4
#endif

/* Calls of fewer rows than this go to the VNNI kernel; from it on, every row goes on tiles (a last
 * part of fewer than 16 on set 1 configured with that many rows): one pass over the weights,
 * where a VNNI pass for the rest would read a cold weight twice. Sapphire-Rapids-class VM, 2
 * threads, [1024 x 3072] from cache, ms, VNNI for the rows past the whole 16s -> all on tiles:
 * Q6_K 8 rows 0.096 -> 0.094, 12 rows 0.145 -> 0.099, 15 rows 0.169 -> 0.112, 20 rows 0.195 ->
 * 0.138; Q4_K 8 rows 0.073 -> 0.067, 12 rows 0.116 -> 0.078; the cold 151,936-row Q6_K head at
 * 20 rows 14.05 -> 9.67; 4 rows 0.064 (VNNI) against 0.086 (tiles). From memory (2 rounds, ms,
 * VNNI -> tiles): Q4_K 8 rows 0.099-0.102 -> 0.105-0.112, 10 rows 0.118-0.121 -> 0.111-0.113;
 * Q6_K 8 rows 0.156-0.159 -> 0.170-0.171, 10 rows 0.177-0.179 -> 0.163-0.171: tiles from 9. */
#ifndef AMX_MIN_ROWS
#define AMX_MIN_ROWS 9
#endif

/* Q6_K calls of fewer rows than this decode one step ahead (amx_rows' pipe). SPR-class VM, 2
 * threads, ms, 3 alternated rounds, one step ahead -> in step: the cold [1024 x 151936] head at 9
 * rows 7.2-7.9 -> 8.2-8.4, 16 rows 8.1-8.5 -> 8.9-9.4, 32 rows 12.2-12.7 -> 12.8-13.5; [1024 x
 * 3072] from memory at 16 rows 0.163-0.167 -> 0.184-0.194, 64 rows 0.326-0.336 -> 0.337-0.367,
 * 128 rows 0.57-0.70 -> 0.578-0.584, 512 rows 2.16-2.20 -> 2.05-2.09. Q4_K, whose decode is about
 * a third of Q6_K's vector work, gains nothing: the cold [1024 x 151936] at 16 rows 6.3-7.0 ->
 * 6.1-6.3, [1024 x 3072] from memory at 20 rows 0.163-0.174 -> 0.140-0.144. */
#ifndef AMX_PIPE_ROWS
#define AMX_PIPE_ROWS 128
#endif

/* Cache lines of a Q4_K / Q6_K KQ_X16 record (2368 / 3456 bytes, tensor_kq_x16_record_bytes). */
#define AMX_Q4K_LINES 37
#define AMX_Q6K_LINES 54

#define AMX_BARRIER() __asm__ volatile("" ::: "memory")

/* ldtilecfg's 64-byte operand: palette 1, tiles 0..7 of 64-byte rows (amx_rows sets the rows). */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* One super-block of a group: the tile operands and what the vector steps need. */
typedef struct amx_dec {
    uint8_t bl[4][1024] __attribute__((aligned(64))); /* B tiles, values 64 t .. 64 t + 63: Q4_K q l_j, Q6_K lo */
    uint8_t bh[4][1024] __attribute__((aligned(64))); /* the same: Q4_K q h_j, Q6_K hi */
    __m512i mp[4];  /* Q4_K: int16 pairs (m_2p, m_2p+1) against the Q8_K sums-of-32 pairs */
    __m512 d, dmin; /* per lane (dmin: Q4_K) */
} amx_dec;

/* Touches lines [n_lines i / n, n_lines (i + 1) / n) of the records at far (into L2) and near
 * (into L1): step i of n of a decode loop, so that a record's prefetches are spread over the loop
 * (a burst of them at once waits for free fill buffers and stalls the decode). */
TAMX INL void amx_prefetch_share(const char *far, const char *near, const int n_lines, const int i, const int n) {
    for (int l = n_lines * i / n; l < n_lines * (i + 1) / n; l++) {
        _mm_prefetch(far + 64 * l, _MM_HINT_T1);
        _mm_prefetch(near + 64 * l, _MM_HINT_T0);
    }
}

/* The Q4_K record R (TENSOR_LAYOUT_KQ_X16, cpu_pack.c) of one super-block into D; touches the
 * records AMX_PF_AHEAD and 1 ahead (amx_prefetch_share). */
TAMX INL void amx_q4k_decode(const uint8_t *R, amx_dec *D) {
    const char *far = (const char *)R + AMX_PF_AHEAD * 64 * AMX_Q4K_LINES, *near = (const char *)R + 64 * AMX_Q4K_LINES;
    const int n_lines = AMX_Q4K_LINES;
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
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        const __m512i ma = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * (2 * p))));
        const __m512i mb = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q4K_M + 16 * (2 * p + 1))));
        D->mp[p] = _mm512_or_si512(ma, _mm512_slli_epi32(mb, 16));
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512i *bl = (__m512i *)D->bl, *bh = (__m512i *)D->bh; /* vector v: values 4 v .. 4 v + 3 */
#pragma GCC unroll 32
    for (int q = 0; q < 32; q++) {
        amx_prefetch_share(far, near, n_lines, q, 32);
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

/* The Q6_K record R (KQ_X16) of one super-block into D: per value, P = sc_j q (q -32..31) as the
 * byte pair lo (P's low byte, unsigned) and hi = P >> 8 (signed), so that P = lo + 256 hi. The
 * 16-bit halves of a dword hold values 2m and 2m + 1: vpmaddubsw of the unsigned codes u = q + 32
 * (0..63) against (sc, 0) and (0, sc) byte pairs gives u sc exactly (|u sc| <= 8064), minus 32 sc
 * that is P, whose high byte is hi and whose low byte is lo. (A signed lo would need P + 128 and a
 * flip of the low bytes: one more vector op per 64 bytes; 16 rows, 2 threads: Q6_K [1024 x 3072]
 * from memory 0.152-0.157 -> 0.147-0.149 ms.) */
TAMX INL void amx_q6k_decode(const uint8_t *R, amx_dec *D) {
    const char *far = (const char *)R + AMX_PF_AHEAD * 64 * AMX_Q6K_LINES, *near = (const char *)R + 64 * AMX_Q6K_LINES;
    const int n_lines = AMX_Q6K_LINES;
    D->d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)R));
    const __m512i *ql = (const __m512i *)(R + CPU_KQ_X16_Q6K_QL), *qh = (const __m512i *)(R + CPU_KQ_X16_Q6K_QH);
    const __m512i m8 = _mm512_set1_epi32(0xff), w_lo = _mm512_set1_epi32(0x00ff00ff);
    const __m512i m16 = _mm512_set1_epi32(0xffff);
    __m512i *bl = (__m512i *)D->bl, *bh = (__m512i *)D->bh; /* vector v: values 4 v .. 4 v + 3 */
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
#pragma GCC unroll 2
            for (int jj = 0; jj < 2; jj++) {
                /* sub-block j = 8 n + 2 s + jj holds the value vectors v = 4 j .. 4 j + 3 */
                const int j = 8 * n + 2 * s + jj;
                const __m512i sc = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(R + CPU_KQ_X16_Q6K_SC + 16 * j)));
                const __m512i t = _mm512_and_si512(sc, m8);
                const __m512i sce = _mm512_or_si512(t, _mm512_slli_epi32(t, 16)); /* bytes (sc, 0, sc, 0) */
                const __m512i sco = _mm512_slli_epi32(sce, 8);                   /* bytes (0, sc, 0, sc) */
                const __m512i k = _mm512_and_si512(_mm512_slli_epi32(sc, 5), m16);
                const __m512i kw = _mm512_or_si512(k, _mm512_slli_epi32(k, 16)); /* int16 32 sc, both halves */
#pragma GCC unroll 4
                for (int l4 = 0; l4 < 4; l4++) {
                    const int ll = 4 * jj + l4, v = 32 * n + 8 * s + ll;
                    amx_prefetch_share(far, near, n_lines, v, 64);
                    /* values 4 v ..: ql dword 16 n + 8 (s & 1) + ll (nibble s >> 1), qh dword 8 n + ll */
                    const __m512i u = q6K_vec(ql[16 * n + 8 * (s & 1) + ll], qh[8 * n + ll], s);
                    const __m512i pe = _mm512_sub_epi16(_mm512_maddubs_epi16(u, sce), kw); /* P, even values */
                    const __m512i po = _mm512_sub_epi16(_mm512_maddubs_epi16(u, sco), kw); /* odd values */
                    /* select: w_lo's bits from the first operand, the others from the second */
                    bh[v] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(pe, 8), po, w_lo, 0xE4);
                    bl[v] = _mm512_ternarylogic_epi32(pe, _mm512_slli_epi16(po, 8), w_lo, 0xE4);
                }
            }
        }
    }
}

TAMX INL __m512i amx_bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc[16 (r - rc) + lane] += super-block sb for the activation rows of the stored C tiles cl / ch
 * ([nrow rows][16 lanes] int32), rows ra .. ra + nrow - 1: the VNNI kernel's steps after its
 * integer dots. Q6: S = cl + 256 ch and no mins, else S = cl + 16 ch and the Q4_K mins. With out
 * (the last super-block) the sums go to out[row ds + lane] for the mask's lanes instead: the
 * stores to dst, which miss the caches, then drain while the next tile products run (a copy of
 * acc after the chunk waited for them all at once: about 7% of the Q4_K kernel's pp512 samples). */
TAMX INL void amx_finish(const amx_dec *D, const int Q6, const cpu_act *act, int64_t sb, int64_t ra, int nrow,
                         int64_t rc, const int32_t *cl, const int32_t *ch, float *acc, float *out, int64_t ds,
                         __mmask16 mask) {
    const int64_t nb32 = act->n_in / 32, nsb = act->n_in / QK_K;
#pragma GCC unroll 2
    for (int r = 0; r < nrow; r++) {
        const int64_t row = ra + r;
        const __m512i S = _mm512_add_epi32(_mm512_load_si512(cl + 16 * r), _mm512_slli_epi32(_mm512_load_si512(ch + 16 * r), Q6 ? 8 : 4));
        const __m512 dx = _mm512_set1_ps(act->d[row * nsb + sb]);
        float *a = acc + 16 * (row - rc);
        __m512 v = sb == 0 ? _mm512_setzero_ps() : _mm512_load_ps(a); /* the sums start from +0 */
        v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(D->d, dx), v);
        if (!Q6) {
            const int16_t *b32 = act->bsums32 + row * nb32 + sb * 8;
            __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) M = _mm512_dpwssd_epi32(M, D->mp[p], amx_bcast32(b32 + 2 * p)); /* m_2p bs32_2p + m_2p+1 bs32_2p+1 */
            v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(D->dmin, dx), v);
        }
        if (out) _mm512_mask_storeu_ps(out + row * ds, mask, v);
        else _mm512_store_ps(a, v);
    }
}

/* The tile products of super-block sb: set 0 (S0) for the 16 activation rows from ra (C tiles 0, 1,
 * A tile 2), set 1 (S1) for the rows from ra1 (C tiles 5, 6, A tile 7: the 16 rows after set 0's,
 * or a call's last rows, fewer than 16, as amx_rows configures them); B tiles 3 (bl), 4 (bh).
 * Q6: tdpbsud against lo and tdpbssd against hi, else tdpbsud. Stores set k's C tiles into c[k][0 / 1]. */
TAMX INL void amx_tiles(const amx_dec *D, const int Q6, const cpu_act *act, int64_t sb, const int S0, int64_t ra,
                        const int S1, int64_t ra1, int32_t c[2][2][256]) {
    const size_t stride = (size_t)act->n_in;
    const int8_t *x0 = act->qs + ra * act->n_in + sb * QK_K;
    const int8_t *x1 = act->qs + ra1 * act->n_in + sb * QK_K;
    if (S0) {
        _tile_zero(0);
        _tile_zero(1);
    }
    if (S1) {
        _tile_zero(5);
        _tile_zero(6);
    }
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        _tile_loadd(3, D->bl[t], 64);
        _tile_loadd(4, D->bh[t], 64);
        if (S0) {
            _tile_loadd(2, x0 + 64 * t, stride);
            _tile_dpbsud(0, 2, 3); /* lo: unsigned for both types */
            if (Q6) _tile_dpbssd(1, 2, 4); /* Q6_K hi: signed */
            else _tile_dpbsud(1, 2, 4);
        }
        if (S1) {
            _tile_loadd(7, x1 + 64 * t, stride);
            _tile_dpbsud(5, 7, 3); /* lo: unsigned for both types */
            if (Q6) _tile_dpbssd(6, 7, 4); /* Q6_K hi: signed */
            else _tile_dpbsud(6, 7, 4);
        }
    }
    if (S0) {
        _tile_stored(0, c[0][0], 64);
        _tile_stored(1, c[0][1], 64);
    }
    if (S1) {
        _tile_stored(5, c[1][0], 64);
        _tile_stored(6, c[1][1], 64);
    }
    AMX_BARRIER(); /* the tile stores before the vector loads of c */
}

/* A step of amx_rows' sweep: super-block sb of the group of outputs from o, for the chunk of
 * activation rows from rc. */
typedef struct amx_step {
    int64_t o, rc, sb;
} amx_step;

/* The step after *s (super-blocks, then row chunks, then groups); false after the last. */
INL bool amx_step_next(amx_step *s, int64_t nsb, int64_t r0, int64_t nr, int64_t o1) {
    if (++s->sb < nsb) return true;
    s->sb = 0;
    s->rc += AMX_RCHUNK;
    if (s->rc < r0 + nr) return true;
    s->rc = r0;
    s->o += AMX_W;
    return s->o < o1;
}

/* The record of step s into D. */
TAMX INL void amx_decode(const void *w, size_t w_nb1, const int Q6, size_t rec, const amx_step *s, amx_dec *D) {
    const uint8_t *R = (const uint8_t *)w + (size_t)s->o * w_nb1 + (size_t)s->sb * rec; /* the group's records from o */
    if (Q6) {
        amx_q6k_decode(R, D);
    } else {
        amx_q4k_decode(R, D);
    }
}

/* Rows r0 .. r0 + nr - 1 of the packed weight's outputs o0 .. o1 - 1. Whole 16s of rows go in
 * pairs of tile sets sharing the B tiles; a last part of fewer than 16 rows (nr % 16) gets set 1
 * configured with that many rows, and then the whole 16s go one set at a time. With pipe (Q6_K
 * calls of fewer than AMX_PIPE_ROWS rows) the records are decoded one step ahead into the second
 * amx_dec: the next step's decode runs after the step's last tile products are issued and before
 * their finish, so that the next record's loads and decode do not wait for the finish (which waits
 * for the tile stores); without, each step decodes its own record first. */
TAMX INL void amx_rows(const void *w, size_t w_nb1, const int Q6, const int pipe, const cpu_act *act, int64_t r0,
                       int64_t nr, float *dst, int64_t ds, int64_t o0, int64_t o1) {
    const int64_t nsb = act->n_in / QK_K;
    const size_t rec = tensor_kq_x16_record_bytes(Q6 ? QUANT_TYPE_Q6_K : QUANT_TYPE_Q4_K);
    DFL_ASSERT(rec == 64 * (size_t)(Q6 ? AMX_Q6K_LINES : AMX_Q4K_LINES));
    if (o0 >= o1 || nr <= 0) return; /* nothing to do: the first step's decode would read past the range */
    const int rem = (int)(nr % AMX_TR);
    amx_dec D[2];
    float acc[AMX_RCHUNK * 16] __attribute__((aligned(64)));
    int32_t c[2][2][256] __attribute__((aligned(64)));
    amx_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = (uint8_t)(rem > 0 && i >= 5 ? rem : 16); /* set 1: C 5, 6 and A 7 */
    }
    _tile_loadconfig(&cfg);
    amx_step s = {o0, r0, 0};
    if (pipe) amx_decode(w, w_nb1, Q6, rec, &s, &D[0]);
    for (int cur = 0;; cur ^= pipe) {
        if (!pipe) amx_decode(w, w_nb1, Q6, rec, &s, &D[0]);
        const amx_dec *Dc = &D[cur];
        const int64_t rc = s.rc, sb = s.sb;
        const int64_t nrc = r0 + nr - rc >= AMX_RCHUNK ? AMX_RCHUNK : r0 + nr - rc;
        const int64_t n16 = nrc / AMX_TR * AMX_TR; /* nrc - n16: rem in the last chunk, else 0 */
        const amx_step here = s;
        const bool more = amx_step_next(&s, nsb, r0, nr, o1);
        /* the chunk's last super-block writes dst (amx_finish) */
        float *out = sb == nsb - 1 ? dst + here.o : NULL;
        const int nw = o1 - here.o >= AMX_W ? AMX_W : (int)(o1 - here.o);
        const __mmask16 mask = (__mmask16)((1u << nw) - 1);
        AMX_BARRIER(); /* the B tiles' vector stores before the tile loads */
        for (int64_t g = 0; g < nrc;) {
            /* pair: two sets of 16 rows; one: set 0 for 16; last: set 1 for the call's last rem */
            const int64_t ra = rc + g;
            const int kind = g >= n16 ? 2 : rem == 0 && n16 - g >= 2 * AMX_TR ? 0 : 1;
            const int64_t g1 = kind == 0 ? g + 2 * AMX_TR : kind == 1 ? g + AMX_TR : nrc;
            if (kind == 0) amx_tiles(Dc, Q6, act, sb, 1, ra, 1, ra + AMX_TR, c);
            else if (kind == 1) amx_tiles(Dc, Q6, act, sb, 1, ra, 0, ra, c);
            else amx_tiles(Dc, Q6, act, sb, 0, ra, 1, ra, c);
            if (pipe && more && g1 >= nrc) amx_decode(w, w_nb1, Q6, rec, &s, &D[cur ^ 1]); /* the step's last products */
            if (kind == 2) {
                amx_finish(Dc, Q6, act, sb, ra, (int)(nrc - g), rc, c[1][0], c[1][1], acc, out, ds, mask);
            } else {
                amx_finish(Dc, Q6, act, sb, ra, AMX_TR, rc, c[0][0], c[0][1], acc, out, ds, mask);
                if (kind == 0) amx_finish(Dc, Q6, act, sb, ra + AMX_TR, AMX_TR, rc, c[1][0], c[1][1], acc, out, ds, mask);
            }
            AMX_BARRIER(); /* the vector loads of c before the next tile stores */
            g = g1;
        }
        if (!more) break;
    }
    _tile_release();
}

TAMX void cpu_mm_q4_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                              int64_t ds, int64_t o0, int64_t o1) {
    if (nr >= AMX_MIN_ROWS) amx_rows(w, w_nb1, 0, 0, act, r0, nr, dst, ds, o0, o1);
    else cpu_mm_q4_K_x16_avx512(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}

TAMX void cpu_mm_q6_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                              int64_t ds, int64_t o0, int64_t o1) {
    if (nr >= AMX_PIPE_ROWS) amx_rows(w, w_nb1, 1, 0, act, r0, nr, dst, ds, o0, o1);
    else if (nr >= AMX_MIN_ROWS) amx_rows(w, w_nb1, 1, 1, act, r0, nr, dst, ds, o0, o1); /* decode one step ahead */
    else cpu_mm_q6_K_x16_avx512(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}

#else
void cpu_mm_q4_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1) {
    cpu_mm_q4_K_x16_avx512(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
void cpu_mm_q6_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1) {
    cpu_mm_q6_K_x16_avx512(w, w_nb1, act, r0, nr, dst, ds, o0, o1);
}
#endif
