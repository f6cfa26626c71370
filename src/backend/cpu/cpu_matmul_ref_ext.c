/* cpu_matmul_ref_ext.c: the scalar reference matmul (exact integer block sums, f64 scaling) for the
 * weight types added after the first set: Q4_1, Q5_0, Q5_1, IQ4_NL against Q8_0 activations and
 * Q2_K, Q3_K, Q5_K, IQ4_XS against Q8_K activations (the pairing llama.cpp's x86 build uses; the
 * Q8_1 sums that Q4_1 / Q5_1 need are the Q8_0 activation's block sums, cpu_act.ns). Written from
 * the block formats directly (not from the SIMD decoders it checks). */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "base/fp16.h"

#include <string.h>

/* Weight value j (0..31) of a 32-block as the integer the block's scale multiplies, and the
 * additive part: w = d * v + m (m = 0 for the symmetric types). */
static int block32_value(uint32_t wtype, const void *blk, int j) {
    switch (wtype) {
    case QUANT_TYPE_Q4_1: {
        const block_q4_1 *b = blk;
        return j < 16 ? b->qs[j] & 0x0f : b->qs[j - 16] >> 4;
    }
    case QUANT_TYPE_Q5_0:
    case QUANT_TYPE_Q5_1: {
        const uint8_t *qs = wtype == QUANT_TYPE_Q5_0 ? ((const block_q5_0 *)blk)->qs : ((const block_q5_1 *)blk)->qs;
        const uint8_t *qh4 = wtype == QUANT_TYPE_Q5_0 ? ((const block_q5_0 *)blk)->qh : ((const block_q5_1 *)blk)->qh;
        uint32_t qh;
        memcpy(&qh, qh4, 4);
        const int lo = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
        const int v = lo | (int)(((qh >> j) & 1u) << 4);
        return wtype == QUANT_TYPE_Q5_0 ? v - 16 : v;
    }
    case QUANT_TYPE_IQ4_NL: {
        const block_iq4_nl *b = blk;
        return quant_iq4nl_values[j < 16 ? b->qs[j] & 0x0f : b->qs[j - 16] >> 4];
    }
    default:
        DFL_ASSERT(0 && "block32_value: type");
    }
    return 0;
}

static size_t block32_size(uint32_t wtype) { return quant_type_get(wtype)->type_size; }

/* d (and m) of a 32-block: the first f16 is d, Q4_1 / Q5_1 have m second. */
static void block32_dm(uint32_t wtype, const void *blk, double *d, double *m) {
    uint16_t h[2];
    memcpy(h, blk, 4);
    *d = fp16_to_fp32(h[0]);
    *m = (wtype == QUANT_TYPE_Q4_1 || wtype == QUANT_TYPE_Q5_1) ? fp16_to_fp32(h[1]) : 0.0;
}

/* The 256 integer values of a K-type super-block, the integer scale of each 16 values, the integer
 * min of each 16 values (w = d * sc * v - dmin * mn), and d / dmin. */
static void superblock_values(uint32_t wtype, const void *blk, int *v, int *sc, int *mn, double *d, double *dmin) {
    switch (wtype) {
    case QUANT_TYPE_Q2_K: {
        const block_q2_K *b = blk;
        for (int e = 0; e < QK_K; e++) v[e] = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        for (int j = 0; j < 16; j++) {
            sc[j] = b->scales[j] & 0x0f;
            mn[j] = b->scales[j] >> 4;
        }
        *d = fp16_to_fp32(b->d);
        *dmin = fp16_to_fp32(b->dmin);
        return;
    }
    case QUANT_TYPE_Q3_K: {
        const block_q3_K *b = blk;
        for (int e = 0; e < QK_K; e++) {
            const int q2 = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            const int h = (b->hmask[e % 32] >> (e / 32)) & 1;
            v[e] = q2 - (h ? 0 : 4);
        }
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? b->scales[j] & 0x0f : b->scales[j - 8] >> 4;
            const int hi = (b->scales[8 + j % 4] >> (2 * (j / 4))) & 3;
            sc[j] = (lo | (hi << 4)) - 32;
            mn[j] = 0;
        }
        *d = fp16_to_fp32(b->d);
        *dmin = 0.0;
        return;
    }
    case QUANT_TYPE_Q5_K: {
        const block_q5_K *b = blk;
        for (int e = 0; e < QK_K; e++) {
            const int j = e / 32, l = e % 32;
            const uint8_t byte = b->qs[32 * (j / 2) + l];
            v[e] = ((j & 1) ? byte >> 4 : byte & 0x0f) + 16 * ((b->qh[l] >> j) & 1);
        }
        for (int j = 0; j < 8; j++) {
            int s, m;
            if (j < 4) {
                s = b->scales[j] & 63;
                m = b->scales[j + 4] & 63;
            } else {
                s = (b->scales[j + 4] & 0x0f) | ((b->scales[j - 4] >> 6) << 4);
                m = (b->scales[j + 4] >> 4) | ((b->scales[j] >> 6) << 4);
            }
            sc[2 * j] = sc[2 * j + 1] = s;
            mn[2 * j] = mn[2 * j + 1] = m;
        }
        *d = fp16_to_fp32(b->d);
        *dmin = fp16_to_fp32(b->dmin);
        return;
    }
    case QUANT_TYPE_IQ4_XS: {
        const block_iq4_xs *b = blk;
        for (int e = 0; e < QK_K; e++) {
            const int j = e / 32, l = e % 32;
            const uint8_t byte = b->qs[16 * j + l % 16];
            v[e] = quant_iq4nl_values[l < 16 ? byte & 0x0f : byte >> 4];
        }
        for (int j = 0; j < 8; j++) {
            const int ls = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((b->scales_h >> (2 * j)) & 3) << 4);
            sc[2 * j] = sc[2 * j + 1] = ls - 32;
            mn[2 * j] = mn[2 * j + 1] = 0;
        }
        *d = fp16_to_fp32(b->d);
        *dmin = 0.0;
        return;
    }
    default:
        DFL_ASSERT(0 && "superblock_values: type");
    }
}

double cpu_dot_row_ext_ref(uint32_t wtype, const void *wrow, const cpu_act *act, int64_t r) {
    const int64_t n = act->n_in;
    double sum = 0.0;
    if (act->dot == CPU_DOT_Q8_0) {
        const int8_t *qx = act->qs + r * act->row_len; /* transposed layout: cpu_q8_0_offset */
        const float *dx = act->d + r * (act->row_len / QK8_0);
        const int32_t *ns = act->ns + r * (act->row_len / QK8_0);
        for (int64_t b = 0; b < n / QK8_0; b++) {
            const void *blk = (const char *)wrow + (size_t)b * block32_size(wtype);
            int64_t isum = 0;
            for (int j = 0; j < QK8_0; j++) isum += block32_value(wtype, blk, j) * qx[cpu_q8_0_offset(b * QK8_0 + j)];
            double d, m;
            block32_dm(wtype, blk, &d, &m);
            /* sum of the block's activation q = -ns */
            sum += d * (double)dx[b] * (double)isum - m * (double)dx[b] * (double)ns[b];
        }
        return sum;
    }
    DFL_ASSERT(act->dot == CPU_DOT_Q8_K);
    const int8_t *qx = act->qs + r * n;
    const float *dx = act->d + r * (n / QK_K);
    const int16_t *bs = act->bsums + r * (n / 16);
    const size_t bsize = quant_type_get(wtype)->type_size;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int v[QK_K], sc[16], mn[16];
        double d, dmin;
        superblock_values(wtype, (const char *)wrow + (size_t)b * bsize, v, sc, mn, &d, &dmin);
        int64_t isc = 0, imin = 0;
        for (int j = 0; j < 16; j++) {
            int32_t dot = 0;
            for (int l = 0; l < 16; l++) dot += v[16 * j + l] * qx[b * QK_K + 16 * j + l];
            isc += (int64_t)sc[j] * dot;
            imin += (int64_t)mn[j] * bs[b * 16 + j];
        }
        sum += d * (double)dx[b] * (double)isc - dmin * (double)dx[b] * (double)imin;
    }
    return sum;
}

/* ---- the scalar kernel set's entries ------------------------------------------------------- */

#define MM_REF(name, T)                                                                                        \
    static void name(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,     \
                     int64_t dst_stride, int64_t o0, int64_t o1) {                                            \
        cpu_matmul_q_ref(T, w, w_nb1, act, r0, nr, dst, dst_stride, o0, o1);                                   \
    }
MM_REF(mm_q4_1_ref, QUANT_TYPE_Q4_1)
MM_REF(mm_q5_0_ref, QUANT_TYPE_Q5_0)
MM_REF(mm_q5_1_ref, QUANT_TYPE_Q5_1)
MM_REF(mm_iq4_nl_ref, QUANT_TYPE_IQ4_NL)
MM_REF(mm_q2_K_ref, QUANT_TYPE_Q2_K)
MM_REF(mm_q3_K_ref, QUANT_TYPE_Q3_K)
MM_REF(mm_q5_K_ref, QUANT_TYPE_Q5_K)
MM_REF(mm_iq4_xs_ref, QUANT_TYPE_IQ4_XS)
#undef MM_REF

void cpu_kernels_init_ext_ref(cpu_kernels *k) {
    k->matmul[QUANT_TYPE_Q4_1] = mm_q4_1_ref;
    k->matmul[QUANT_TYPE_Q5_0] = mm_q5_0_ref;
    k->matmul[QUANT_TYPE_Q5_1] = mm_q5_1_ref;
    k->matmul[QUANT_TYPE_IQ4_NL] = mm_iq4_nl_ref;
    k->matmul[QUANT_TYPE_Q2_K] = mm_q2_K_ref;
    k->matmul[QUANT_TYPE_Q3_K] = mm_q3_K_ref;
    k->matmul[QUANT_TYPE_Q5_K] = mm_q5_K_ref;
    k->matmul[QUANT_TYPE_IQ4_XS] = mm_iq4_xs_ref;
    k->act_row[QUANT_TYPE_Q4_1] = k->act_row[QUANT_TYPE_Q5_0] = k->act_row[QUANT_TYPE_Q5_1] =
        k->act_row[QUANT_TYPE_IQ4_NL] = cpu_act_row_q8_0_ref;
    k->act_row[QUANT_TYPE_Q2_K] = k->act_row[QUANT_TYPE_Q3_K] = k->act_row[QUANT_TYPE_Q5_K] =
        k->act_row[QUANT_TYPE_IQ4_XS] = cpu_act_row_q8_K_ref;
}
