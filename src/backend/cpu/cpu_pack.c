/* cpu_pack.c: weights packed once, at load, for the CPU matmul kernels (backend_weight_pack).
 * TENSOR_LAYOUT_Q8_0_X16 (backend.h): a Q8_0 row's blocks in groups of 16, each group's 512
 * quants transposed like the prepared Q8_0 activations (byte cpu_q8_0_offset(i) of the row holds
 * value i plus 128) and the block scales after the last group. The kernels then read a weight
 * group with eight plain 64-byte loads instead of transposing and gathering 16 blocks in every
 * matmul (decode, verify, prefill alike). Same byte count as the Q8_0 row; rows are padded to 64
 * bytes (32 extra bytes for an odd number of groups). Packed rows give the same bits as plain
 * ones at every feature level (the kernels do the same integer and f32 operations). */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#include <string.h>

static size_t q8_0_x16_row_stride(int64_t n_in) {
    const size_t bytes = (size_t)(n_in / QK8_0) * sizeof(block_q8_0);
    return (bytes + 63) & ~(size_t)63;
}

bool cpu_weight_packable(const tensor *w) {
    return w->type == QUANT_TYPE_Q8_0 && w->layout == TENSOR_LAYOUT_PLAIN && w->ne[0] > 0 &&
           w->ne[0] % CPU_Q8_0_GROUP_VALUES == 0 && w->ne[1] > 0 && w->ne[2] == 1 && w->ne[3] == 1 &&
           w->nb[0] == sizeof(block_q8_0) && w->nb[1] == (size_t)(w->ne[0] / QK8_0) * sizeof(block_q8_0) &&
           w->data != NULL;
}

size_t cpu_weight_pack_size(const tensor *w) {
    return cpu_weight_packable(w) ? q8_0_x16_row_stride(w->ne[0]) * (size_t)w->ne[1] : 0;
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
    const size_t used = (size_t)nb * sizeof(block_q8_0), stride = q8_0_x16_row_stride(n_in);
    memset(dst + used, 0, stride - used);
}

tensor cpu_weight_pack(const tensor *w, void *dst) {
    DFL_ASSERT(cpu_weight_packable(w) && ((uintptr_t)dst & 63) == 0);
    const size_t stride = q8_0_x16_row_stride(w->ne[0]);
    for (int64_t o = 0; o < w->ne[1]; o++) {
        cpu_pack_q8_0_x16_row((uint8_t *)dst + (size_t)o * stride,
                              (const block_q8_0 *)((const char *)w->data + (size_t)o * w->nb[1]), w->ne[0]);
    }
    tensor t = *w;
    t.data = dst;
    t.buf = NULL;
    t.layout = TENSOR_LAYOUT_Q8_0_X16;
    t.nb[1] = stride;
    t.nb[2] = stride * (size_t)w->ne[1];
    t.nb[3] = t.nb[2];
    return t;
}
