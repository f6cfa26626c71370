/* quant_ref.h: scalar reference (de)quantization per block format (n: multiple of the block size). */
#ifndef DFL_QUANT_REF_H
#define DFL_QUANT_REF_H

#include "quant/quant.h"

void dequantize_row_f32_ref(const void *src, float *dst, int64_t n);
void dequantize_row_f16_ref(const void *src, float *dst, int64_t n);
void dequantize_row_bf16_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q4_0_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q8_0_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q4_K_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q6_K_ref(const void *src, float *dst, int64_t n);
/* quant_ref_ext.c */
void dequantize_row_q4_1_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q5_0_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q5_1_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q2_K_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q3_K_ref(const void *src, float *dst, int64_t n);
void dequantize_row_q5_K_ref(const void *src, float *dst, int64_t n);
void dequantize_row_iq4_nl_ref(const void *src, float *dst, int64_t n);
void dequantize_row_iq4_xs_ref(const void *src, float *dst, int64_t n);

void quantize_row_f32_ref(const float *src, void *dst, int64_t n);
void quantize_row_f16_ref(const float *src, void *dst, int64_t n);
void quantize_row_bf16_ref(const float *src, void *dst, int64_t n);
void quantize_row_q4_0_ref(const float *src, void *dst, int64_t n);
void quantize_row_q8_0_ref(const float *src, void *dst, int64_t n);
/* quant_ref_ext.c */
void quantize_row_q4_1_ref(const float *src, void *dst, int64_t n);
void quantize_row_q5_0_ref(const float *src, void *dst, int64_t n);
void quantize_row_q5_1_ref(const float *src, void *dst, int64_t n);
void quantize_row_iq4_nl_ref(const float *src, void *dst, int64_t n);
void quantize_row_iq4_xs_ref(const float *src, void *dst, int64_t n);
/* quant_kquant.c */
void quantize_row_q2_K_ref(const float *src, void *dst, int64_t n);
void quantize_row_q3_K_ref(const float *src, void *dst, int64_t n);
void quantize_row_q4_K_ref(const float *src, void *dst, int64_t n);
void quantize_row_q5_K_ref(const float *src, void *dst, int64_t n);
void quantize_row_q6_K_ref(const float *src, void *dst, int64_t n);

#endif
