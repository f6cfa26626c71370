/* quant.h: ggml storage types (block layouts), row sizes, dequantize-row reference functions and
 * quantize functions. Read and written: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS (docs/quantization.md describes each layout). */
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
    QUANT_TYPE_IQ4_NL = 20,
    QUANT_TYPE_IQ4_XS = 23,
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

/* Q4_1: 32 weights, y[j] = lo_nibble(qs[j]) * d + m, y[j+16] = hi_nibble(qs[j]) * d + m */
typedef struct block_q4_1 {
    uint16_t d;              /* f16 scale */
    uint16_t m;              /* f16 min (added) */
    uint8_t qs[QK4_0 / 2];   /* nibbles */
} block_q4_1;

/* Q5_0: 32 weights, 5-bit q = nibble | (bit j of qh) << 4; y[j] = (q - 16) * d (j < 16 from the
 * low nibbles, j >= 16 from the high ones) */
typedef struct block_q5_0 {
    uint16_t d;              /* f16 scale */
    uint8_t qh[4];           /* 5th bits, bit j for weight j (little-endian u32) */
    uint8_t qs[QK4_0 / 2];   /* low 4 bits */
} block_q5_0;

/* Q5_1: as Q5_0 without the -16, plus a min: y[j] = q * d + m */
typedef struct block_q5_1 {
    uint16_t d;              /* f16 scale */
    uint16_t m;              /* f16 min */
    uint8_t qh[4];           /* 5th bits */
    uint8_t qs[QK4_0 / 2];   /* low 4 bits */
} block_q5_1;

/* Q2_K: 256 weights in 16 sub-blocks of 16; y = d * (sc & 15) * q - dmin * (sc >> 4), q 2 bits.
 * qs: two 128-weight halves of 32 bytes; weight 128n + 32k + l is bits 2k..2k+1 of qs[32n + l]. */
typedef struct block_q2_K {
    uint8_t scales[QK_K / 16]; /* 4-bit scale (low) and min (high) per sub-block */
    uint8_t qs[QK_K / 4];      /* 2-bit quants */
    uint16_t d;                /* f16 scale of the scales */
    uint16_t dmin;             /* f16 scale of the mins */
} block_q2_K;

/* Q3_K: 256 weights in 16 sub-blocks of 16; y = d * (s - 32) * (q2 - (hbit ? 0 : 4)), s 6 bits.
 * q2 as Q2_K's qs; the high bit of weight 32k + l (k 0..7) is bit k of hmask[l]. */
typedef struct block_q3_K {
    uint8_t hmask[QK_K / 8];   /* high bits */
    uint8_t qs[QK_K / 4];      /* low 2 bits */
    uint8_t scales[12];        /* 16 six-bit scales: low 4 bits in bytes 0..7, high 2 in 8..11 */
    uint16_t d;                /* f16 super-block scale */
} block_q3_K;

/* Q5_K: Q4_K plus a fifth bit: weight 64c + l (l < 32) has its high bit in bit 2c of qh[l],
 * weight 64c + 32 + l in bit 2c+1; y = d * sc * q - dmin * m as Q4_K. */
typedef struct block_q5_K {
    uint16_t d;                   /* f16 scale of the scales */
    uint16_t dmin;                /* f16 scale of the mins */
    uint8_t scales[K_SCALE_SIZE]; /* as Q4_K */
    uint8_t qh[QK_K / 8];         /* high bits */
    uint8_t qs[QK_K / 2];         /* low 4 bits, as Q4_K */
} block_q5_K;

/* IQ4_NL: 32 weights, y[j] = d * kvalues_iq4nl[nibble] (nibble order as Q4_0) */
typedef struct block_iq4_nl {
    uint16_t d;              /* f16 scale */
    uint8_t qs[QK4_0 / 2];   /* table indices */
} block_iq4_nl;

/* IQ4_XS: 256 weights in 8 sub-blocks of 32; 6-bit scale ls (low 4 bits in scales_l nibble ib,
 * high 2 bits at bits 2ib of scales_h), y = d * (ls - 32) * kvalues_iq4nl[nibble] */
typedef struct block_iq4_xs {
    uint16_t d;              /* f16 super-block scale */
    uint16_t scales_h;       /* high 2 bits of the 8 scales */
    uint8_t scales_l[QK_K / 64]; /* low 4 bits of the 8 scales */
    uint8_t qs[QK_K / 2];    /* table indices, 16 bytes per sub-block as IQ4_NL */
} block_iq4_xs;

/* The 16 values of IQ4_NL / IQ4_XS indices (ggml's kvalues_iq4nl). */
extern const int8_t quant_iq4nl_values[16];

_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 is 20 bytes");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 is 22 bytes");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 is 24 bytes");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K is 84 bytes");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K is 110 bytes");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K is 176 bytes");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl is 18 bytes");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs is 136 bytes");
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
