/* quant_types.c: the table of ggml storage types (name, block size, bytes per block) and the
 * dispatch of dequantize/quantize to the per-format reference functions. */
#include "quant/quant.h"
#include "quant/quant_ref.h"

#include <ctype.h>
#include <string.h>

/* Indexed by ggml type id; entries with name NULL are unknown or removed types. */
static const quant_type_info k_types[QUANT_TYPE_COUNT] = {
    [QUANT_TYPE_F32] = {"f32", 1, 4, true, true},
    [QUANT_TYPE_F16] = {"f16", 1, 2, true, true},
    [QUANT_TYPE_Q4_0] = {"q4_0", 32, 18, true, true},
    [QUANT_TYPE_Q4_1] = {"q4_1", 32, 20, true, true},
    [QUANT_TYPE_Q5_0] = {"q5_0", 32, 22, true, true},
    [QUANT_TYPE_Q5_1] = {"q5_1", 32, 24, true, true},
    [QUANT_TYPE_Q8_0] = {"q8_0", 32, 34, true, true},
    [QUANT_TYPE_Q8_1] = {"q8_1", 32, 36, false, false},
    [QUANT_TYPE_Q2_K] = {"q2_K", 256, 84, true, true},
    [QUANT_TYPE_Q3_K] = {"q3_K", 256, 110, true, true},
    [QUANT_TYPE_Q4_K] = {"q4_K", 256, 144, true, true},
    [QUANT_TYPE_Q5_K] = {"q5_K", 256, 176, true, true},
    [QUANT_TYPE_Q6_K] = {"q6_K", 256, 210, true, true},
    [QUANT_TYPE_Q8_K] = {"q8_K", 256, 292, false, false},
    [16] = {"iq2_xxs", 256, 66, false, false},
    [17] = {"iq2_xs", 256, 74, false, false},
    [18] = {"iq3_xxs", 256, 98, false, false},
    [19] = {"iq1_s", 256, 50, false, false},
    [QUANT_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, true, true},
    [21] = {"iq3_s", 256, 110, false, false},
    [22] = {"iq2_s", 256, 82, false, false},
    [QUANT_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, true, true},
    [QUANT_TYPE_I8] = {"i8", 1, 1, false, false},
    [QUANT_TYPE_I16] = {"i16", 1, 2, false, false},
    [QUANT_TYPE_I32] = {"i32", 1, 4, false, false},
    [QUANT_TYPE_I64] = {"i64", 1, 8, false, false},
    [QUANT_TYPE_F64] = {"f64", 1, 8, false, false},
    [29] = {"iq1_m", 256, 56, false, false},
    [QUANT_TYPE_BF16] = {"bf16", 1, 2, true, true},
    [34] = {"tq1_0", 256, 54, false, false},
    [35] = {"tq2_0", 256, 66, false, false},
    [39] = {"mxfp4", 32, 17, false, false},
};

const quant_type_info *quant_type_get(uint32_t type) {
    if (type >= QUANT_TYPE_COUNT || k_types[type].name == NULL) {
        return NULL;
    }
    return &k_types[type];
}

int quant_type_from_name(const char *name) {
    for (int i = 0; i < QUANT_TYPE_COUNT; i++) {
        if (k_types[i].name != NULL && strcasecmp(k_types[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

size_t quant_row_size(uint32_t type, int64_t n) {
    const quant_type_info *ti = quant_type_get(type);
    if (ti == NULL || n < 0 || n % ti->blck_size != 0) {
        return 0;
    }
    return (size_t)(n / ti->blck_size) * ti->type_size;
}

bool quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const quant_type_info *ti = quant_type_get(type);
    if (ti == NULL || !ti->can_dequantize || n % ti->blck_size != 0) {
        return false;
    }
    switch (type) {
    case QUANT_TYPE_F32: dequantize_row_f32_ref(src, dst, n); return true;
    case QUANT_TYPE_F16: dequantize_row_f16_ref(src, dst, n); return true;
    case QUANT_TYPE_BF16: dequantize_row_bf16_ref(src, dst, n); return true;
    case QUANT_TYPE_Q4_0: dequantize_row_q4_0_ref(src, dst, n); return true;
    case QUANT_TYPE_Q8_0: dequantize_row_q8_0_ref(src, dst, n); return true;
    case QUANT_TYPE_Q4_K: dequantize_row_q4_K_ref(src, dst, n); return true;
    case QUANT_TYPE_Q6_K: dequantize_row_q6_K_ref(src, dst, n); return true;
    case QUANT_TYPE_Q4_1: dequantize_row_q4_1_ref(src, dst, n); return true;
    case QUANT_TYPE_Q5_0: dequantize_row_q5_0_ref(src, dst, n); return true;
    case QUANT_TYPE_Q5_1: dequantize_row_q5_1_ref(src, dst, n); return true;
    case QUANT_TYPE_Q2_K: dequantize_row_q2_K_ref(src, dst, n); return true;
    case QUANT_TYPE_Q3_K: dequantize_row_q3_K_ref(src, dst, n); return true;
    case QUANT_TYPE_Q5_K: dequantize_row_q5_K_ref(src, dst, n); return true;
    case QUANT_TYPE_IQ4_NL: dequantize_row_iq4_nl_ref(src, dst, n); return true;
    case QUANT_TYPE_IQ4_XS: dequantize_row_iq4_xs_ref(src, dst, n); return true;
    default: return false;
    }
}

size_t quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    const quant_type_info *ti = quant_type_get(type);
    if (ti == NULL || !ti->can_quantize || n % ti->blck_size != 0) {
        return 0;
    }
    switch (type) {
    case QUANT_TYPE_F32: quantize_row_f32_ref(src, dst, n); break;
    case QUANT_TYPE_F16: quantize_row_f16_ref(src, dst, n); break;
    case QUANT_TYPE_BF16: quantize_row_bf16_ref(src, dst, n); break;
    case QUANT_TYPE_Q4_0: quantize_row_q4_0_ref(src, dst, n); break;
    case QUANT_TYPE_Q8_0: quantize_row_q8_0_ref(src, dst, n); break;
    case QUANT_TYPE_Q4_1: quantize_row_q4_1_ref(src, dst, n); break;
    case QUANT_TYPE_Q5_0: quantize_row_q5_0_ref(src, dst, n); break;
    case QUANT_TYPE_Q5_1: quantize_row_q5_1_ref(src, dst, n); break;
    case QUANT_TYPE_Q2_K: quantize_row_q2_K_ref(src, dst, n); break;
    case QUANT_TYPE_Q3_K: quantize_row_q3_K_ref(src, dst, n); break;
    case QUANT_TYPE_Q4_K: quantize_row_q4_K_ref(src, dst, n); break;
    case QUANT_TYPE_Q5_K: quantize_row_q5_K_ref(src, dst, n); break;
    case QUANT_TYPE_Q6_K: quantize_row_q6_K_ref(src, dst, n); break;
    case QUANT_TYPE_IQ4_NL: quantize_row_iq4_nl_ref(src, dst, n); break;
    case QUANT_TYPE_IQ4_XS: quantize_row_iq4_xs_ref(src, dst, n); break;
    default: return 0;
    }
    return quant_row_size(type, n);
}
