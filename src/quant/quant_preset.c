/* quant_preset.c: llama-quantize's per-tensor type choices for its common file types, for dense
 * models (Qwen3 / Llama targets; DFlash drafters follow the same rules by tensor name). The rules,
 * from llama.cpp's src/llama-quant.cpp (llama_tensor_get_type_impl, tensor_type_fallback):
 * - output.weight (and token_embd.weight when tied) -> Q6_K, or Q8_0 if its rows do not fit the
 *   preset's block; Q8_0 presets keep Q8_0;
 * - attn_v: Q2_K -> Q3_K (Q4_K when n_gqa >= 4); Q3_K_M -> Q5_K for the first two, then Q4_K;
 *   Q3_K_L -> Q5_K; IQ4_NL / IQ4_XS -> Q5_K when n_gqa >= 4; Q4_K_M / Q5_K_M -> Q6_K on the
 *   "more bits" layers; Q4_K_S -> Q5_K for the first four;
 * - ffn_down (layer i of n): Q2_K -> Q3_K; Q3_K_M -> Q5_K for i < n/16, else Q4_K; Q3_K_L -> Q5_K;
 *   Q4_K_M / Q5_K_M -> Q6_K on the more-bits layers; IQ4_NL / IQ4_XS / Q4_K_S -> Q5_K for i < n/8;
 * - attn_output: Q2_K -> Q3_K, Q3_K_M -> Q4_K, Q3_K_L -> Q5_K;
 * "more bits" layers: i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2. Rows not a multiple of the
 * chosen type's block: Q2_K / Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS ->
 * IQ4_NL, and F16 when even that does not fit. No importance matrix is ever used. */
#include "quant/quant_preset.h"

#include "quant/quant.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const quant_preset k_presets[] = {
    {"Q4_0", QUANT_FTYPE_Q4_0, QUANT_TYPE_Q4_0},       {"Q4_1", QUANT_FTYPE_Q4_1, QUANT_TYPE_Q4_1},
    {"Q5_0", QUANT_FTYPE_Q5_0, QUANT_TYPE_Q5_0},       {"Q5_1", QUANT_FTYPE_Q5_1, QUANT_TYPE_Q5_1},
    {"IQ4_NL", QUANT_FTYPE_IQ4_NL, QUANT_TYPE_IQ4_NL}, {"IQ4_XS", QUANT_FTYPE_IQ4_XS, QUANT_TYPE_IQ4_XS},
    {"Q2_K", QUANT_FTYPE_Q2_K, QUANT_TYPE_Q2_K},       {"Q3_K_S", QUANT_FTYPE_Q3_K_S, QUANT_TYPE_Q3_K},
    {"Q3_K_M", QUANT_FTYPE_Q3_K_M, QUANT_TYPE_Q3_K},   {"Q3_K_L", QUANT_FTYPE_Q3_K_L, QUANT_TYPE_Q3_K},
    {"Q4_K_S", QUANT_FTYPE_Q4_K_S, QUANT_TYPE_Q4_K},   {"Q4_K_M", QUANT_FTYPE_Q4_K_M, QUANT_TYPE_Q4_K},
    {"Q5_K_S", QUANT_FTYPE_Q5_K_S, QUANT_TYPE_Q5_K},   {"Q5_K_M", QUANT_FTYPE_Q5_K_M, QUANT_TYPE_Q5_K},
    {"Q6_K", QUANT_FTYPE_Q6_K, QUANT_TYPE_Q6_K},       {"Q8_0", QUANT_FTYPE_Q8_0, QUANT_TYPE_Q8_0},
    {"F16", QUANT_FTYPE_F16, QUANT_TYPE_F16},          {"BF16", QUANT_FTYPE_BF16, QUANT_TYPE_BF16},
    {"F32", QUANT_FTYPE_F32, QUANT_TYPE_F32},
};

const quant_preset *quant_preset_find(const char *name) {
    static const struct { const char *alias, *name; } aliases[] = {{"Q3_K", "Q3_K_M"}, {"Q4_K", "Q4_K_M"}, {"Q5_K", "Q5_K_M"}};
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
        if (strcasecmp(name, aliases[i].alias) == 0) name = aliases[i].name;
    }
    for (size_t i = 0; i < sizeof(k_presets) / sizeof(k_presets[0]); i++) {
        if (strcasecmp(name, k_presets[i].name) == 0) return &k_presets[i];
    }
    return NULL;
}

const char *quant_preset_names(void) {
    return "Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, "
           "Q6_K, Q8_0, F16, BF16, F32 (Q3_K, Q4_K, Q5_K: the _M ones)";
}

typedef enum category {
    CAT_OTHER, CAT_OUTPUT, CAT_TOKEN_EMBD, CAT_ATTN_QKV, CAT_ATTN_KV_B, CAT_ATTN_V, CAT_ATTN_K, CAT_ATTN_Q,
    CAT_ATTN_OUTPUT, CAT_FFN_UP, CAT_FFN_GATE, CAT_FFN_DOWN,
} category;

/* llama-quant.cpp's tensor_get_category: exact names, then substrings in this order. */
static category category_of(const char *name) {
    if (strcmp(name, "output.weight") == 0) return CAT_OUTPUT;
    if (strcmp(name, "token_embd.weight") == 0 || strcmp(name, "per_layer_token_embd.weight") == 0) return CAT_TOKEN_EMBD;
    static const struct { const char *sub; category cat; } subs[] = {
        {"attn_qkv.weight", CAT_ATTN_QKV}, {"attn_kv_b.weight", CAT_ATTN_KV_B}, {"attn_v.weight", CAT_ATTN_V},
        {"attn_k.weight", CAT_ATTN_K},     {"attn_q.weight", CAT_ATTN_Q},       {"attn_output.weight", CAT_ATTN_OUTPUT},
        {"ffn_up", CAT_FFN_UP},            {"ffn_gate", CAT_FFN_GATE},          {"ffn_down", CAT_FFN_DOWN},
    };
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        if (strstr(name, subs[i].sub) != NULL) return subs[i].cat;
    }
    return CAT_OTHER;
}

static bool is_attn_v(category c) { return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B; }

void quant_plan_init(quant_plan *p, const quant_preset *preset, bool pure, int n_layer, int n_gqa) {
    memset(p, 0, sizeof(*p));
    p->preset = preset;
    p->pure = pure;
    p->tied = true;
    p->n_layer = n_layer;
    p->n_gqa = n_gqa;
}

void quant_plan_count(quant_plan *p, const char *name) {
    const category c = category_of(name);
    if (is_attn_v(c)) p->n_attn_v++;
    if (c == CAT_OUTPUT) p->tied = false;
}

bool quant_plan_eligible(const char *name, int n_dims) {
    const size_t n = strlen(name);
    if (n_dims < 2 || n < 6 || strcmp(name + n - 6, "weight") != 0) return false;
    return strstr(name, "_norm.weight") == NULL && strstr(name, "ffn_gate_inp.weight") == NULL;
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static bool is_quantized(uint32_t type) {
    return type != QUANT_TYPE_F32 && type != QUANT_TYPE_F16 && type != QUANT_TYPE_BF16;
}

/* llama_tensor_get_type_impl for a dense model of these presets. */
static uint32_t choose(quant_plan *p, const char *name, int64_t ne0, uint32_t t) {
    const quant_ftype ft = p->preset->ftype;
    const category c = category_of(name);
    if (c == CAT_OUTPUT || (p->tied && c == CAT_TOKEN_EMBD)) {
        if (ne0 % quant_type_get(t)->blck_size != 0) return QUANT_TYPE_Q8_0;
        return t != QUANT_TYPE_Q8_0 ? QUANT_TYPE_Q6_K : t;
    }
    if (c == CAT_TOKEN_EMBD) return t;
    if (is_attn_v(c)) {
        const int i = p->i_attn_v++;
        if (ft == QUANT_FTYPE_Q2_K) t = p->n_gqa >= 4 ? QUANT_TYPE_Q4_K : QUANT_TYPE_Q3_K;
        else if (ft == QUANT_FTYPE_Q3_K_M) t = i < 2 ? QUANT_TYPE_Q5_K : QUANT_TYPE_Q4_K;
        else if (ft == QUANT_FTYPE_Q3_K_L) t = QUANT_TYPE_Q5_K;
        else if ((ft == QUANT_FTYPE_IQ4_NL || ft == QUANT_FTYPE_IQ4_XS) && p->n_gqa >= 4) t = QUANT_TYPE_Q5_K;
        else if ((ft == QUANT_FTYPE_Q4_K_M || ft == QUANT_FTYPE_Q5_K_M) && use_more_bits(i, p->n_attn_v)) t = QUANT_TYPE_Q6_K;
        else if (ft == QUANT_FTYPE_Q4_K_S && i < 4) t = QUANT_TYPE_Q5_K;
        return t;
    }
    if (c == CAT_FFN_DOWN) {
        const int i = p->i_ffn_down++, n = p->n_layer;
        if (ft == QUANT_FTYPE_Q2_K) t = QUANT_TYPE_Q3_K;
        else if (ft == QUANT_FTYPE_Q3_K_M) t = i < n / 16 ? QUANT_TYPE_Q5_K : QUANT_TYPE_Q4_K;
        else if (ft == QUANT_FTYPE_Q3_K_L) t = QUANT_TYPE_Q5_K;
        else if (ft == QUANT_FTYPE_Q4_K_M) { if (use_more_bits(i, n)) t = QUANT_TYPE_Q6_K; }
        else if (i < n / 8 && (ft == QUANT_FTYPE_IQ4_NL || ft == QUANT_FTYPE_IQ4_XS)) t = QUANT_TYPE_Q5_K;
        else if (ft == QUANT_FTYPE_Q5_K_M && use_more_bits(i, n)) t = QUANT_TYPE_Q6_K;
        else if (ft == QUANT_FTYPE_Q4_K_S && i < n / 8) t = QUANT_TYPE_Q5_K;
        return t;
    }
    if (c == CAT_ATTN_OUTPUT) {
        if (ft == QUANT_FTYPE_Q2_K) t = QUANT_TYPE_Q3_K;
        else if (ft == QUANT_FTYPE_Q3_K_M) t = QUANT_TYPE_Q4_K;
        else if (ft == QUANT_FTYPE_Q3_K_L) t = QUANT_TYPE_Q5_K;
        return t;
    }
    if (c == CAT_ATTN_QKV) {
        if (ft == QUANT_FTYPE_Q3_K_M || ft == QUANT_FTYPE_Q3_K_L) t = QUANT_TYPE_Q4_K;
        else if (ft == QUANT_FTYPE_Q4_K_M) t = QUANT_TYPE_Q5_K;
        else if (ft == QUANT_FTYPE_Q5_K_M) t = QUANT_TYPE_Q6_K;
    }
    return t;
}

/* tensor_type_fallback: a type whose block divides ne0. */
static uint32_t fallback(quant_plan *p, int64_t ne0, uint32_t t) {
    if (ne0 % quant_type_get(t)->blck_size == 0) return t;
    p->n_fallback++;
    uint32_t r = t;
    switch (t) {
    case QUANT_TYPE_IQ4_XS: r = QUANT_TYPE_IQ4_NL; break;
    case QUANT_TYPE_Q2_K:
    case QUANT_TYPE_Q3_K: r = QUANT_TYPE_Q4_0; break;
    case QUANT_TYPE_Q4_K: r = QUANT_TYPE_Q5_0; break;
    case QUANT_TYPE_Q5_K: r = QUANT_TYPE_Q5_1; break;
    case QUANT_TYPE_Q6_K: r = QUANT_TYPE_Q8_0; break;
    default: break; /* a 32-block type: F16 below */
    }
    return ne0 % quant_type_get(r)->blck_size == 0 ? r : QUANT_TYPE_F16;
}

uint32_t quant_plan_type(quant_plan *p, const char *name, int n_dims, int64_t ne0, uint32_t cur_type) {
    if (!quant_plan_eligible(name, n_dims)) return cur_type;
    const uint32_t def = p->preset->default_type;
    if (!is_quantized(def)) return def;
    const uint32_t t = p->pure ? def : choose(p, name, ne0, def);
    return fallback(p, ne0, t);
}
