/* cpu_pack.c: weights packed once, at load, for the CPU matmul kernels (backend_weight_pack).
 * - TENSOR_LAYOUT_Q8_0_X16 (backend.h): a Q8_0 row's blocks in groups of 16, each group's 512
 *   quants transposed like the prepared Q8_0 activations (byte cpu_q8_0_offset(i) of the row holds
 *   value i plus 128) and the block scales after the last group. The kernels then read a weight
 *   group with eight plain 64-byte loads instead of transposing and gathering 16 blocks in every
 *   matmul (decode, verify, prefill alike). Same byte count as the Q8_0 row; rows are padded to 64
 *   bytes (32 extra bytes for an odd number of groups).
 * - TENSOR_LAYOUT_Q4_0_X16: the same for Q4_0 (AVX2 and AVX-512): a group's 16 blocks of 16 quant
 *   bytes as 4 vectors of 64 bytes whose lane j holds dword k of block j as stored (its low nibbles
 *   are values 4k .. 4k+3, its high nibbles 16 + 4k ..), then the scales; the kernel splits the
 *   nibbles with a mask and a shift where the plain kernel transposes 16 blocks per group.
 * - TENSOR_LAYOUT_KQ_X16: Q4_K / Q6_K rows in groups of 16, one record per super-block with row i
 *   of the group in 32-bit lane i: the f16 scales, the 6-bit (Q4_K) or int8 (Q6_K) sub-block scales
 *   one byte per row, and the quants dword by dword (Q4_K's qs; Q6_K's ql and qh) (record offsets
 *   in cpu_internal.h and docs/quantization.md). The kernels load the lanes they decoded with 16x16
 *   transposes before. Q4_K and Q6_K records are 3% larger than the blocks (Q6_K's with the
 *   correction its AVX-512 kernel needs for biased activations, cpu_internal.h).
 * - TENSOR_LAYOUT_Q6K_X16V: Q6_K as KQ_X16 with the quants as ready 6-bit values, four in every
 *   three bytes (cpu_internal.h: CPU_Q6K_X16V_QV): the AVX2 kernels take a value vector with one
 *   mask (three of four) instead of assembling it from ql and qh.
 * - TENSOR_LAYOUT_P16_X16: F16 / BF16 rows in groups of 16 as the AMX-BF16 tile operands want
 *   them (backend.h): per block of 32 inputs, 16 lines of 64 bytes, one per pair of inputs; BF16
 *   in the tiles' pair order, F16 with each pair's first inputs of the 16 rows in the low half of
 *   the line and the second in the high half, so that the kernel's split into bf16 parts puts the
 *   pairs together with one shift and one OR. Same bytes as the rows, plus the padding.
 * The first four give the same bits as plain weights (the kernels do the same integer and f32
 * operations on the same values). A type is packed only where the level has a kernel for it
 * (cpu_kernels.pack_layout names the layout): Q8_0 at every level, Q4_0, Q4_K and Q6_K at AVX2 and
 * AVX-512, F16 / BF16 with AMX-BF16 (whose tiles sum differently from the plain F16 kernels: every
 * row count of such a backend takes them, so a row's result still does not depend on its batch). */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#include <string.h>

/* Bytes of a Q8_0_X16 / Q4_0_X16 row: the type's row of blocks, padded to 64. */
static size_t x16_row_stride(uint32_t type, int64_t n_in) { return (quant_row_size(type, n_in) + 63) & ~(size_t)63; }

uint32_t cpu_weight_pack_layout(const cpu_kernels *k, const tensor *w) {
    const quant_type_info *ti = quant_type_get(w->type);
    if (ti == NULL || w->layout != TENSOR_LAYOUT_PLAIN || w->ne[0] <= 0 || w->ne[1] <= 0 || w->ne[2] != 1 ||
        w->ne[3] != 1 || w->data == NULL || w->ne[0] % ti->blck_size != 0 || w->nb[0] != ti->type_size ||
        w->nb[1] != (size_t)(w->ne[0] / ti->blck_size) * ti->type_size || k->matmul_packed[w->type] == NULL) {
        return TENSOR_LAYOUT_PLAIN;
    }
    const uint32_t layout = k->pack_layout[w->type];
    if (layout == TENSOR_LAYOUT_Q8_0_X16) {
        return w->type == QUANT_TYPE_Q8_0 && w->ne[0] % CPU_Q8_0_GROUP_VALUES == 0 ? layout : TENSOR_LAYOUT_PLAIN;
    }
    if (layout == TENSOR_LAYOUT_Q4_0_X16) {
        return w->type == QUANT_TYPE_Q4_0 && w->ne[0] % CPU_Q8_0_GROUP_VALUES == 0 ? layout : TENSOR_LAYOUT_PLAIN;
    }
    if (layout == TENSOR_LAYOUT_KQ_X16) return tensor_kq_x16_record_bytes(w->type) != 0 ? layout : TENSOR_LAYOUT_PLAIN;
    if (layout == TENSOR_LAYOUT_Q6K_X16V) return w->type == QUANT_TYPE_Q6_K ? layout : TENSOR_LAYOUT_PLAIN;
    if (layout == TENSOR_LAYOUT_P16_X16) {
        return w->type == QUANT_TYPE_F16 || w->type == QUANT_TYPE_BF16 ? layout : TENSOR_LAYOUT_PLAIN;
    }
    return TENSOR_LAYOUT_PLAIN;
}

static size_t p16_x16_group_bytes(int64_t n_in) { return 16 * 2 * (size_t)tensor_p16_x16_n_pad(n_in); }

size_t cpu_weight_pack_size(const cpu_kernels *k, const tensor *w) {
    switch (cpu_weight_pack_layout(k, w)) {
    case TENSOR_LAYOUT_Q8_0_X16:
    case TENSOR_LAYOUT_Q4_0_X16: return x16_row_stride(w->type, w->ne[0]) * (size_t)w->ne[1];
    case TENSOR_LAYOUT_KQ_X16:
    case TENSOR_LAYOUT_Q6K_X16V:
        return (size_t)((w->ne[1] + 15) / 16) * (size_t)(w->ne[0] / QK_K) * tensor_kq_x16_record_bytes(w->type);
    case TENSOR_LAYOUT_P16_X16: return (size_t)((w->ne[1] + 15) / 16) * p16_x16_group_bytes(w->ne[0]);
    default: return 0;
    }
}

void cpu_pack_q8_0_x16_row(uint8_t *dst, const block_q8_0 *src, int64_t n_in) {
    const int64_t nb = n_in / QK8_0;
    for (int64_t b = 0; b < nb; b++) {
        /* values 4k .. 4k+3 of block b -> bytes (b / 16) * 512 + k * 64 + (b % 16) * 4 (cpu_q8_0_offset) */
        uint8_t *g = dst + (b / CPU_Q8_0_GROUP) * CPU_Q8_0_GROUP_VALUES + (b % CPU_Q8_0_GROUP) * 4;
        for (int k = 0; k < QK8_0 / 4; k++) {
            uint32_t v;
            memcpy(&v, src[b].qs + 4 * k, 4);
            v ^= 0x80808080u; /* q + 128 as unsigned bytes */
            memcpy(g + 64 * k, &v, 4);
        }
        memcpy(dst + (size_t)n_in + (size_t)b * sizeof(uint16_t), &src[b].d, sizeof(uint16_t));
    }
    const size_t used = (size_t)nb * sizeof(block_q8_0), stride = x16_row_stride(QUANT_TYPE_Q8_0, n_in);
    memset(dst + used, 0, stride - used);
}

void cpu_pack_q4_0_x16_row(uint8_t *dst, const block_q4_0 *src, int64_t n_in) {
    const int64_t nb = n_in / QK4_0;
    for (int64_t b = 0; b < nb; b++) {
        /* quant bytes 4k .. 4k+3 of block b -> bytes (b / 16) * 256 + k * 64 + (b % 16) * 4 */
        uint8_t *g = dst + (b / CPU_Q8_0_GROUP) * (CPU_Q8_0_GROUP_VALUES / 2) + (b % CPU_Q8_0_GROUP) * 4;
        for (int k = 0; k < QK4_0 / 8; k++) memcpy(g + 64 * k, src[b].qs + 4 * k, 4);
        memcpy(dst + (size_t)(n_in / 2) + (size_t)b * sizeof(uint16_t), &src[b].d, sizeof(uint16_t));
    }
    const size_t used = (size_t)nb * sizeof(block_q4_0), stride = x16_row_stride(QUANT_TYPE_Q4_0, n_in);
    memset(dst + used, 0, stride - used);
}

/* One KQ_X16 (v: Q6K_X16V) record: super-block sb of rows[0..15] (cpu_internal.h: CPU_KQ_X16_*,
 * CPU_Q6K_X16V_* offsets). */
static void pack_kq_record(uint8_t *R, uint32_t type, bool v, const uint8_t *const rows[16], int64_t sb) {
    memset(R, 0, tensor_kq_x16_record_bytes(type));
    for (int i = 0; i < 16; i++) {
        if (type == QUANT_TYPE_Q4_K) {
            const block_q4_K *b = (const block_q4_K *)rows[i] + sb;
            memcpy(R + 4 * i, &b->d, 2);
            memcpy(R + 4 * i + 2, &b->dmin, 2);
            for (int j = 0; j < 8; j++) {
                int sc, m;
                cpu_q4_K_scale_min(j, b->scales, &sc, &m);
                R[CPU_KQ_X16_Q4K_SC + 16 * j + i] = (uint8_t)sc;
                R[CPU_KQ_X16_Q4K_M + 16 * j + i] = (uint8_t)m;
            }
            for (int q = 0; q < QK_K / 8; q++) memcpy(R + CPU_KQ_X16_QS + 64 * q + 4 * i, b->qs + 4 * q, 4);
        } else {
            const block_q6_K *b = (const block_q6_K *)rows[i] + sb;
            memcpy(R + 2 * i, &b->d, 2);
            for (int j = 0; j < 16; j++) R[CPU_KQ_X16_Q6K_SC + 16 * j + i] = (uint8_t)b->scales[j];
            int8_t vals[QK_K];
            cpu_q6_K_values(b, vals);
            int32_t nk = 0; /* |nk| <= 128 * 16 * 128 * 512 = 2^27 */
            for (int j = 0; j < 16; j++) {
                int32_t sq = 0;
                for (int e = 0; e < 16; e++) sq += vals[16 * j + e];
                nk -= 128 * b->scales[j] * sq;
            }
            memcpy(R + CPU_KQ_X16_Q6K_NK + 4 * i, &nk, 4);
            if (v) {
                for (int j = 0; j < 16; j++) {
                    /* dword kk of sub-block j as one little-endian word: values 4 kk .. 4 kk + 3,
                     * and bits 2 kk, 2 kk + 1 of values 12 .. 15 in each byte's bits 6 and 7; a
                     * byte q (-32..31) becomes q + 32 as (q ^ 0x80) - 0x60, which never borrows */
                    uint32_t d4;
                    memcpy(&d4, vals + 16 * j + 12, 4);
                    d4 = (d4 ^ 0x80808080u) - 0x60606060u;
                    for (int kk = 0; kk < 3; kk++) {
                        uint32_t a4;
                        memcpy(&a4, vals + 16 * j + 4 * kk, 4);
                        const uint32_t word = ((a4 ^ 0x80808080u) - 0x60606060u) | ((d4 >> (2 * kk)) & 0x03030303u) << 6;
                        memcpy(R + CPU_Q6K_X16V_QV + 64 * (3 * j + kk) + 4 * i, &word, 4);
                    }
                }
                continue;
            }
            for (int q = 0; q < QK_K / 8; q++) memcpy(R + CPU_KQ_X16_Q6K_QL + 64 * q + 4 * i, b->ql + 4 * q, 4);
            for (int q = 0; q < QK_K / 16; q++) memcpy(R + CPU_KQ_X16_Q6K_QH + 64 * q + 4 * i, b->qh + 4 * q, 4);
        }
    }
}

void cpu_weight_pack_part(const cpu_kernels *k, const tensor *w, void *dst, int part, int n_parts) {
    const uint32_t layout = cpu_weight_pack_layout(k, w);
    DFL_ASSERT(layout != TENSOR_LAYOUT_PLAIN && ((uintptr_t)dst & 63) == 0 && part >= 0 && part < n_parts);
    if (layout == TENSOR_LAYOUT_Q8_0_X16 || layout == TENSOR_LAYOUT_Q4_0_X16) {
        const bool q4 = layout == TENSOR_LAYOUT_Q4_0_X16;
        const size_t stride = x16_row_stride(w->type, w->ne[0]);
        const int64_t n = w->ne[1], o0 = n * part / n_parts, o1 = n * (part + 1) / n_parts;
        for (int64_t o = o0; o < o1; o++) {
            const void *row = (const char *)w->data + (size_t)o * w->nb[1];
            if (q4) cpu_pack_q4_0_x16_row((uint8_t *)dst + (size_t)o * stride, (const block_q4_0 *)row, w->ne[0]);
            else cpu_pack_q8_0_x16_row((uint8_t *)dst + (size_t)o * stride, (const block_q8_0 *)row, w->ne[0]);
        }
        return;
    }
    if (layout == TENSOR_LAYOUT_P16_X16) {
        const int64_t n_in = w->ne[0], n_out = w->ne[1], n_g = (n_out + 15) / 16, nb = tensor_p16_x16_n_pad(n_in) / 32;
        const int64_t g0 = n_g * part / n_parts, g1 = n_g * (part + 1) / n_parts;
        const bool bf16 = w->type == QUANT_TYPE_BF16;
        for (int64_t g = g0; g < g1; g++) {
            uint16_t *G = (uint16_t *)((uint8_t *)dst + (size_t)g * p16_x16_group_bytes(n_in));
            for (int64_t t = 0; t < nb; t++) {
                for (int p = 0; p < 16; p++) {
                    uint16_t *line = G + (size_t)t * 512 + (size_t)p * 32;
                    for (int c = 0; c < 16; c++) {
                        for (int e = 0; e < 2; e++) { /* e: the pair's first (0) or second input */
                            const int64_t o = 16 * g + c, i = 32 * t + 2 * p + e;
                            uint16_t v = 0;
                            if (o < n_out && i < n_in) memcpy(&v, (const char *)w->data + (size_t)o * w->nb[1] + 2 * (size_t)i, 2);
                            line[bf16 ? 2 * c + e : 16 * e + c] = v;
                        }
                    }
                }
            }
        }
        return;
    }
    const size_t rec = tensor_kq_x16_record_bytes(w->type);
    const int64_t nsb = w->ne[0] / QK_K, n_out = w->ne[1], n_g = (n_out + 15) / 16;
    const int64_t g0 = n_g * part / n_parts, g1 = n_g * (part + 1) / n_parts;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *rows[16]; /* the last group repeats the last row */
        for (int i = 0; i < 16; i++) {
            const int64_t o = 16 * g + i < n_out ? 16 * g + i : n_out - 1;
            rows[i] = (const uint8_t *)w->data + (size_t)o * w->nb[1];
        }
        uint8_t *R = (uint8_t *)dst + (size_t)(g * nsb) * rec;
        for (int64_t sb = 0; sb < nsb; sb++, R += rec) pack_kq_record(R, w->type, layout == TENSOR_LAYOUT_Q6K_X16V, rows, sb);
    }
}

tensor cpu_weight_packed_view(const cpu_kernels *k, const tensor *w, void *dst) {
    const uint32_t layout = cpu_weight_pack_layout(k, w);
    DFL_ASSERT(layout != TENSOR_LAYOUT_PLAIN);
    tensor t = *w;
    t.data = dst;
    t.buf = NULL;
    t.layout = layout;
    t.nb[1] = layout == TENSOR_LAYOUT_Q8_0_X16 || layout == TENSOR_LAYOUT_Q4_0_X16 ? x16_row_stride(w->type, w->ne[0])
              : layout == TENSOR_LAYOUT_P16_X16 ? p16_x16_group_bytes(w->ne[0]) / 16
                                                : tensor_kq_x16_record_bytes(w->type) * (size_t)(w->ne[0] / QK_K) / 16;
    t.nb[2] = t.nb[1] * (size_t)w->ne[1];
    t.nb[3] = t.nb[2];
    return t;
}

tensor cpu_weight_pack(const cpu_kernels *k, const tensor *w, void *dst) {
    cpu_weight_pack_part(k, w, dst, 0, 1);
    return cpu_weight_packed_view(k, w, dst);
}
