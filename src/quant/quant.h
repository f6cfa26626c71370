/* quant.h: ggml storage types (block layouts), row sizes, dequantize-row reference functions and
 * quantize functions for the types dflash writes (F32, F16, BF16, Q8_0, Q4_0). */
#ifndef DFL_QUANT_H
#define DFL_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml_type ids as stored in GGUF tensor infos. */
typedef enum quant_type {
    QUANT_TYPE_F32 = 0,
    QUANT_TYPE_F16 = 1,
    QUANT_TYPE_Q4_0 = 2,
    QUANT_TYPE_Q4_1 = 3,
    QUANT_TYPE_Q5_0 = 6,
    QUANT_TYPE_Q5_1 = 7,
    QUANT_TYPE_Q8_0 = 8,
    QUANT_TYPE_Q8_1 = 9,
    QUANT_TYPE_Q2_K = 10,
    QUANT_TYPE_Q3_K = 11,
    QUANT_TYPE_Q4_K = 12,
    QUANT_TYPE_Q5_K = 13,
    QUANT_TYPE_Q6_K = 14,
    QUANT_TYPE_Q8_K = 15,
    QUANT_TYPE_I8 = 24,
    QUANT_TYPE_I16 = 25,
    QUANT_TYPE_I32 = 26,
    QUANT_TYPE_I64 = 27,
    QUANT_TYPE_F64 = 28,
    QUANT_TYPE_BF16 = 30,
    QUANT_TYPE_COUNT = 41, /* ids >= this are unknown */
} quant_type;

#define QK4_0 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* Q4_0: 32 weights, y[j] = (lo_nibble(qs[j]) - 8) * d, y[j+16] = (hi_nibble(qs[j]) - 8) * d */
typedef struct block_q4_0 {
    uint16_t d;              /* f16 scale */
    uint8_t qs[QK4_0 / 2];   /* nibbles */
} block_q4_0;

/* Q8_0: 32 weights, y[j] = qs[j] * d */
typedef struct block_q8_0 {
    uint16_t d;              /* f16 scale */
    int8_t qs[QK8_0];
} block_q8_0;

/* Q4_K: 256 weights in 8 sub-blocks of 32; 6-bit scales and mins packed in scales[12] */
typedef struct block_q4_K {
    uint16_t d;                   /* f16 super-block scale for the scales */
    uint16_t dmin;                /* f16 super-block scale for the mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 scales + 8 mins, 6 bits each */
    uint8_t qs[QK_K / 2];         /* 4-bit quants */
} block_q4_K;

/* Q6_K: 256 weights in 16 sub-blocks of 16; the f16 d comes LAST */
typedef struct block_q6_K {
    uint8_t ql[QK_K / 2];      /* low 4 bits */
    uint8_t qh[QK_K / 4];      /* high 2 bits */
    int8_t scales[QK_K / 16];  /* 8-bit sub-block scales */
    uint16_t d;                /* f16 super-block scale */
} block_q6_K;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 is 18 bytes");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 is 34 bytes");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K is 144 bytes");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K is 210 bytes");

typedef struct quant_type_info {
    const char *name;     /* "q8_0", ... */
    int64_t blck_size;    /* elements per block */
    size_t type_size;     /* bytes per block */
    bool can_dequantize;  /* quant_dequantize_row supports it */
    bool can_quantize;    /* quant_quantize_row supports it */
} quant_type_info;

/* Info for a ggml type id, or NULL if the id is unknown (or a removed type). */
const quant_type_info *quant_type_get(uint32_t type);
/* Type id by name ("f32", "q8_0", ... case-insensitive); -1 if unknown. */
int quant_type_from_name(const char *name);
/* Bytes of a row of n elements (n must be a multiple of the block size); 0 if the type is unknown. */
size_t quant_row_size(uint32_t type, int64_t n);

/* Dequantizes n elements (a multiple of the block size) to f32. Returns false if unsupported. */
bool quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantizes n elements (a multiple of the block size); returns bytes written, 0 if unsupported. */
size_t quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

#endif
