/* zz_tmp_quant_ref.c: TEMPORARY (branch gguf only) quantize/dequantize until quant_ref.c lands.
 * Follows ggml's reference quantizers (q8_0: d = amax/127, q = round(x/d); q4_0: d = max/-8,
 * q = min(15, (int8)(x/d + 8.5))). */
#include "quant/quant_ref.h"
#include "base/fp16.h"
#include <math.h>
#include <string.h>

void dequantize_row_f32_ref(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
void dequantize_row_f16_ref(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src; for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(s[i]); }
void dequantize_row_bf16_ref(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src; for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(s[i]); }
void dequantize_row_q4_0_ref(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++) { float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; j++) { dst[i*32+j] = ((b[i].qs[j] & 15) - 8) * d; dst[i*32+j+16] = ((b[i].qs[j] >> 4) - 8) * d; } } }
void dequantize_row_q8_0_ref(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++) { float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 32; j++) dst[i*32+j] = b[i].qs[j] * d; } }
void dequantize_row_q4_K_ref(const void *src, float *dst, int64_t n) { (void)src; memset(dst, 0, (size_t)n * 4); }
void dequantize_row_q6_K_ref(const void *src, float *dst, int64_t n) { (void)src; memset(dst, 0, (size_t)n * 4); }

void quantize_row_f32_ref(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
void quantize_row_f16_ref(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst; for (int64_t i = 0; i < n; i++) d[i] = fp32_to_fp16(src[i]); }
void quantize_row_bf16_ref(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst; for (int64_t i = 0; i < n; i++) d[i] = fp32_to_bf16(src[i]); }
void quantize_row_q8_0_ref(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float amax = 0; for (int j = 0; j < 32; j++) { float a = fabsf(src[i*32+j]); if (a > amax) amax = a; }
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        for (int j = 0; j < 32; j++) b[i].qs[j] = (int8_t)roundf(src[i*32+j] * id);
    } }
void quantize_row_q4_0_ref(const float *src, void *dst, int64_t n) {
    block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) { float v = src[i*32+j]; if (fabsf(v) > amax) { amax = fabsf(v); max = v; } }
        float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            int x0 = (int)(int8_t)(src[i*32+j] * id + 8.5f), x1 = (int)(int8_t)(src[i*32+j+16] * id + 8.5f);
            x0 = x0 > 15 ? 15 : x0;
            x1 = x1 > 15 ? 15 : x1;
            b[i].qs[j] = (uint8_t)(x0 | (x1 << 4));
        }
    } }
