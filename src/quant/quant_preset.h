/* quant_preset.h: llama-quantize's file types ("presets": Q4_K_M, Q5_K_S, Q8_0, ...) and the
 * storage type each tensor of a model gets under one, with the same per-tensor choices and the
 * same fallbacks for rows that do not fit a block (docs/quantization.md). */
#ifndef DFL_QUANT_PRESET_H
#define DFL_QUANT_PRESET_H

#include <stdbool.h>
#include <stdint.h>

typedef enum quant_ftype { /* llama.cpp's llama_ftype values, stored as general.file_type */
    QUANT_FTYPE_F32 = 0,
    QUANT_FTYPE_F16 = 1,
    QUANT_FTYPE_Q4_0 = 2,
    QUANT_FTYPE_Q4_1 = 3,
    QUANT_FTYPE_Q8_0 = 7,
    QUANT_FTYPE_Q5_0 = 8,
    QUANT_FTYPE_Q5_1 = 9,
    QUANT_FTYPE_Q2_K = 10,
    QUANT_FTYPE_Q3_K_S = 11,
    QUANT_FTYPE_Q3_K_M = 12,
    QUANT_FTYPE_Q3_K_L = 13,
    QUANT_FTYPE_Q4_K_S = 14,
    QUANT_FTYPE_Q4_K_M = 15,
    QUANT_FTYPE_Q5_K_S = 16,
    QUANT_FTYPE_Q5_K_M = 17,
    QUANT_FTYPE_Q6_K = 18,
    QUANT_FTYPE_IQ4_NL = 25,
    QUANT_FTYPE_IQ4_XS = 30,
    QUANT_FTYPE_BF16 = 32,
} quant_ftype;

typedef struct quant_preset {
    const char *name;      /* as llama-quantize spells it: "Q4_K_M" */
    quant_ftype ftype;
    uint32_t default_type; /* QUANT_TYPE_*: the type of most matrices */
} quant_preset;

/* The preset named name (case-insensitive; also llama-quantize's aliases Q3_K, Q4_K, Q5_K for the
 * _M variants), or NULL. */
const quant_preset *quant_preset_find(const char *name);
/* "Q4_0, Q4_1, ..." (every preset name, for messages). */
const char *quant_preset_names(void);

/* Model facts the choices depend on and the running counters (llama-quantize's quantize_state). */
typedef struct quant_plan {
    const quant_preset *preset;
    bool pure;           /* every matrix in the default type (llama-quantize --pure) */
    bool tied;           /* no output.weight: token_embd is also the output */
    int n_layer;         /* <arch>.block_count */
    int n_gqa;           /* n_head / n_head_kv */
    int n_attn_v, i_attn_v; /* attn_v tensors: total, seen */
    int i_ffn_down;      /* ffn_down tensors seen */
    int n_fallback;      /* tensors whose rows forced a fallback type */
} quant_plan;

void quant_plan_init(quant_plan *p, const quant_preset *preset, bool pure, int n_layer, int n_gqa);
/* Counts one tensor of the model before any quant_plan_type call (attn_v tensors, output.weight). */
void quant_plan_count(quant_plan *p, const char *name);
/* Storage type of tensor `name` (n_dims after dropping trailing 1s, row length ne0, current type
 * cur_type) under the plan; cur_type if it is not quantized. Call for every tensor in llama's
 * order: by layer number (non-layer tensors first), then by name. */
uint32_t quant_plan_type(quant_plan *p, const char *name, int n_dims, int64_t ne0, uint32_t cur_type);
/* Whether tensor `name` (n_dims after dropping trailing 1s) is one llama-quantize re-encodes. */
bool quant_plan_eligible(const char *name, int n_dims);

#endif
