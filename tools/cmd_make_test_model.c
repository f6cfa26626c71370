/* cmd_make_test_model.c: `dflash make-test-model`: writes a random tiny Qwen3 (or Llama) target
 * and a DFlash drafter for it, both carrying the small test BPE vocabulary (tools/test_vocab.c).
 * Weights are ~N(0, std) from a seeded xoshiro256** stream per tensor (same seed -> identical
 * bytes), norms are around 1.0; 2D matrices use the chosen type, norms stay f32. Shapes and keys
 * follow docs/target.md and docs/drafter.md (ne[0] is the input dimension). */
#define _POSIX_C_SOURCE 200809L
#include "cmds.h"
#include "test_vocab.h"
#include "cli_common.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TM_MAX_TARGET_LAYERS 64

typedef struct tm_opts {
    const char *out_dir;
    const char *target_path;
    const char *drafter_path;
    const char *arch;        /* "qwen3" or "llama" (the target) */
    int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    int64_t draft_layers, block_size;
    int32_t target_layers[TM_MAX_TARGET_LAYERS];
    int n_target_layers;     /* 0: choose a default spread */
    uint32_t wtype;          /* type of the 2D matrices */
    bool tied;
    uint64_t seed;
    double std;
    /* drafter variants (docs/drafter.md, "DSpark", "Drafter options") */
    int64_t dspark_rank;     /* 0: plain DFlash; else the Markov rank R */
    bool dspark_conf;        /* confidence head (default on) */
    bool bonus_anchor;       /* dflash.sample_from_anchor = false */
    double markov_std;       /* std of markov_w1 / markov_w2 (default 0.5: a bias that matters) */
    float markov_scale;      /* markov_w2.scale; 0: not written */
    bool causal;             /* dflash.attention.causal = true */
    int64_t swa;             /* dflash.attention.sliding_window; 0: none */
    bool swa_pattern[TM_MAX_TARGET_LAYERS]; /* per drafter layer (default: alternate, layer 0 sliding) */
    bool swa_pattern_set;
    float logit_scale, softcap, embedding_scale; /* 0: not written */
    /* DFlash2 drafter (docs/drafter.md "DFlash2"): conv kernel K, group size, selector rank and
     * top-k; d2_kernel 0 = a plain DFlash drafter */
    int64_t d2_kernel, d2_group, d2_rank, d2_top_k;
} tm_opts;

/* ---- PRNG: splitmix64 seeding xoshiro256** ---------------------------------------------------- */

typedef struct tm_rng {
    uint64_t s[4];
} tm_rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(tm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* A stream per (seed, file tag, tensor name), so a tensor's values do not depend on the others. */
static void rng_init(tm_rng *r, uint64_t seed, const char *tag, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = tag; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ '/') * 1099511628211ull;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    uint64_t x = seed ^ h;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

/* Approximately standard normal: the sum of four uniform 16-bit values (Irwin-Hall, mean 2,
 * variance 1/3), centred and scaled; one PRNG step and no transcendental function per value
 * (a 0.6B-parameter model takes seconds, not a minute). Range about +-3.46. */
static double rng_normal(tm_rng *r) {
    uint64_t x = rng_next(r);
    double sum = (double)(x & 0xffff) + (double)((x >> 16) & 0xffff) + (double)((x >> 32) & 0xffff) +
                 (double)(x >> 48);
    return (sum * (1.0 / 65536.0) - 2.0 + 2.0 / 65536.0) * 1.7320508075688772;
}

/* ---- one output file ------------------------------------------------------------------------- */

typedef struct tm_file {
    gguf_writer *w;
    const char *tag;     /* "target" / "drafter": part of every tensor's seed */
    uint64_t seed;
    void **bufs;         /* tensor data kept alive until the write */
    size_t n_bufs, cap_bufs;
    uint64_t n_bytes;
    dfl_error err;
} tm_file;

static void *tm_alloc(tm_file *f, size_t n) {
    if (f->n_bufs == f->cap_bufs) {
        size_t cap = f->cap_bufs ? 2 * f->cap_bufs : 64;
        void **p = realloc(f->bufs, cap * sizeof(*p));
        if (p == NULL) return NULL;
        f->bufs = p;
        f->cap_bufs = cap;
    }
    void *b = malloc(n ? n : 1);
    if (b != NULL) f->bufs[f->n_bufs++] = b;
    return b;
}

static void tm_file_free(tm_file *f) {
    for (size_t i = 0; i < f->n_bufs; i++) free(f->bufs[i]);
    free(f->bufs);
    gguf_writer_free(f->w);
}

/* A weight [ne0, ne1] (ne0 = input dim) of N(0, std), stored as `type`. */
static bool add_matrix(tm_file *f, const char *name, int64_t ne0, int64_t ne1, uint32_t type, double std) {
    size_t row_bytes = quant_row_size(type, ne0);
    float *row = malloc((size_t)ne0 * sizeof(float));
    uint8_t *data = row ? tm_alloc(f, row_bytes * (size_t)ne1) : NULL;
    if (row == NULL || data == NULL) {
        free(row);
        fprintf(stderr, "make-test-model: out of memory for %s [%lld, %lld]\n", name, (long long)ne0, (long long)ne1);
        return false;
    }
    tm_rng r;
    rng_init(&r, f->seed, f->tag, name);
    for (int64_t i = 0; i < ne1; i++) {
        for (int64_t j = 0; j < ne0; j++) row[j] = (float)(std * rng_normal(&r));
        if (quant_quantize_row(type, row, data + (size_t)i * row_bytes, ne0) != row_bytes) {
            free(row);
            fprintf(stderr, "make-test-model: cannot quantize %s to %s\n", name, quant_type_get(type)->name);
            return false;
        }
    }
    free(row);
    int64_t ne[2] = {ne0, ne1};
    if (gguf_writer_add_tensor(f->w, name, type, 2, ne, data, row_bytes * (size_t)ne1, &f->err) != DFL_OK) {
        fprintf(stderr, "make-test-model: %s\n", f->err.msg);
        return false;
    }
    f->n_bytes += row_bytes * (size_t)ne1;
    return true;
}

/* Adds an f32 tensor of shape ne[0..n_dims) whose data (from tm_alloc) is already filled. */
static bool add_f32_tensor(tm_file *f, const char *name, int n_dims, const int64_t *ne, const float *data) {
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= ne[d];
    if (gguf_writer_add_tensor(f->w, name, QUANT_TYPE_F32, n_dims, ne, data, (size_t)n * sizeof(float), &f->err) != DFL_OK) {
        fprintf(stderr, "make-test-model: %s\n", f->err.msg);
        return false;
    }
    f->n_bytes += (uint64_t)n * sizeof(float);
    return true;
}

/* A norm weight [n] in f32, around 1.0. */
static bool add_norm(tm_file *f, const char *name, int64_t n) {
    float *data = tm_alloc(f, (size_t)n * sizeof(float));
    if (data == NULL) {
        fprintf(stderr, "make-test-model: out of memory for %s\n", name);
        return false;
    }
    tm_rng r;
    rng_init(&r, f->seed, f->tag, name);
    for (int64_t i = 0; i < n; i++) data[i] = (float)(1.0 + 0.1 * rng_normal(&r));
    const int64_t ne[1] = {n};
    return add_f32_tensor(f, name, 1, ne, data);
}

/* The hparam keys under `prefix` ("qwen3", "llama", "dflash"). */
static void write_hparams(gguf_writer *w, const char *prefix, const tm_opts *o, int64_t n_layer) {
    char key[128];
#define KEY(s) (snprintf(key, sizeof(key), "%s." s, prefix), key)
    gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)n_layer);
    gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)o->n_ctx_train);
    gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)o->n_embd);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)o->n_ff);
    gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)o->n_head);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)o->n_head_kv);
    gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)o->head_dim);
    gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)o->head_dim);
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), 1000000.0f);
#undef KEY
}

/* One Qwen3 (or Llama: no q/k norms) block's tensors. */
static bool add_block(tm_file *f, const tm_opts *o, int64_t il, bool qk_norm) {
    const int64_t n_q = o->n_head * o->head_dim, n_kv = o->n_head_kv * o->head_dim;
    char name[96];
    bool ok = true;
#define NAME(s) (snprintf(name, sizeof(name), "blk.%lld." s, (long long)il), name)
    ok = ok && add_norm(f, NAME("attn_norm.weight"), o->n_embd);                     /* [n_embd] */
    ok = ok && add_matrix(f, NAME("attn_q.weight"), o->n_embd, n_q, o->wtype, o->std);      /* [n_embd, n_head*head_dim] */
    ok = ok && add_matrix(f, NAME("attn_k.weight"), o->n_embd, n_kv, o->wtype, o->std);     /* [n_embd, n_kv*head_dim] */
    ok = ok && add_matrix(f, NAME("attn_v.weight"), o->n_embd, n_kv, o->wtype, o->std);     /* [n_embd, n_kv*head_dim] */
    ok = ok && add_matrix(f, NAME("attn_output.weight"), n_q, o->n_embd, o->wtype, o->std); /* [n_head*head_dim, n_embd] */
    if (qk_norm) {
        ok = ok && add_norm(f, NAME("attn_q_norm.weight"), o->head_dim);             /* [head_dim] */
        ok = ok && add_norm(f, NAME("attn_k_norm.weight"), o->head_dim);             /* [head_dim] */
    }
    ok = ok && add_norm(f, NAME("ffn_norm.weight"), o->n_embd);                      /* [n_embd] */
    ok = ok && add_matrix(f, NAME("ffn_gate.weight"), o->n_embd, o->n_ff, o->wtype, o->std); /* [n_embd, n_ff] */
    ok = ok && add_matrix(f, NAME("ffn_up.weight"), o->n_embd, o->n_ff, o->wtype, o->std);   /* [n_embd, n_ff] */
    ok = ok && add_matrix(f, NAME("ffn_down.weight"), o->n_ff, o->n_embd, o->wtype, o->std); /* [n_ff, n_embd] */
#undef NAME
    return ok;
}

/* ---- DFlash2 parts ---------------------------------------------------------------------------- */

/* A conv base [n_embd, K, 2] in f32: tap 0 around 1 (the row passes through), the others small. */
static bool add_conv_base(tm_file *f, const char *name, int64_t n_embd, int64_t K) {
    const int64_t n = n_embd * K * 2;
    float *data = tm_alloc(f, (size_t)n * sizeof(float));
    if (data == NULL) {
        fprintf(stderr, "make-test-model: out of memory for %s\n", name);
        return false;
    }
    tm_rng r;
    rng_init(&r, f->seed, f->tag, name);
    for (int64_t i = 0; i < n; i++) {
        const int64_t tap = (i / n_embd) % K;
        data[i] = (float)((tap == 0 ? 1.0 : 0.0) + 0.3 * rng_normal(&r));
    }
    const int64_t ne[3] = {n_embd, K, 2};
    return add_f32_tensor(f, name, 3, ne, data);
}

/* The DFlash2 keys and tensors of a drafter (the layout of llama.cpp's converter). */
static bool add_dflash2(tm_file *f, const tm_opts *o) {
    gguf_writer_set_u32(f->w, "dflash.conv_kernel_size", (uint32_t)o->d2_kernel);
    gguf_writer_set_u32(f->w, "dflash.conv_group_size", (uint32_t)o->d2_group);
    gguf_writer_set_u32(f->w, "dflash.selector_rank", (uint32_t)o->d2_rank);
    gguf_writer_set_u32(f->w, "dflash.selector_top_k", (uint32_t)o->d2_top_k);
    const int64_t E = o->n_embd, K = o->d2_kernel, G = o->n_embd / o->d2_group, R = o->d2_rank;
    char name[96];
    bool ok = true;
    for (int64_t il = 0; ok && il < o->draft_layers; il++) {
#define NAME(s) (snprintf(name, sizeof(name), "blk.%lld." s, (long long)il), name)
        ok = ok && add_conv_base(f, NAME("attn_conv_base"), E, K);                                 /* [n_embd, K, 2] */
        ok = ok && add_matrix(f, NAME("attn_conv_proj.weight"), E, 2 * K * G, o->wtype, o->std * 4); /* [n_embd, 2KG] */
        ok = ok && add_conv_base(f, NAME("ffn_conv_base"), E, K);                                  /* [n_embd, K, 2] */
        ok = ok && add_matrix(f, NAME("ffn_conv_proj.weight"), E, 2 * K * G, o->wtype, o->std * 4);  /* [n_embd, 2KG] */
#undef NAME
    }
    ok = ok && add_matrix(f, "selector_predecessor.weight", R, o->n_vocab, o->wtype, 1.0); /* [R, n_vocab] */
    ok = ok && add_matrix(f, "selector_successor.weight", R, o->n_vocab, o->wtype, 1.0);   /* [R, n_vocab] */
    ok = ok && add_matrix(f, "selector_hidden.weight", E, R, o->wtype, o->std * 10);       /* [n_embd, R] */
    return ok;
}

static bool write_file(tm_file *f, const char *path) {
    if (gguf_writer_write(f->w, path, &f->err) != DFL_OK) {
        fprintf(stderr, "make-test-model: %s\n", f->err.msg);
        return false;
    }
    return true;
}

static bool make_target(const tm_opts *o, const test_vocab *v, const char *path) {
    tm_file f = {.w = gguf_writer_new(), .tag = "target", .seed = o->seed};
    if (f.w == NULL) {
        fprintf(stderr, "make-test-model: out of memory\n");
        return false;
    }
    gguf_writer_set_str(f.w, "general.architecture", o->arch);
    gguf_writer_set_str(f.w, "general.name", "dflash-test-target");
    gguf_writer_set_u32(f.w, "general.alignment", GGUF_DEFAULT_ALIGNMENT);
    write_hparams(f.w, o->arch, o, o->n_layer);
    test_vocab_write(v, f.w);
    bool ok = add_matrix(&f, "token_embd.weight", o->n_embd, o->n_vocab, o->wtype, o->std); /* [n_embd, n_vocab] */
    if (ok && !o->tied) {
        ok = add_matrix(&f, "output.weight", o->n_embd, o->n_vocab, o->wtype, o->std);      /* [n_embd, n_vocab] */
    }
    ok = ok && add_norm(&f, "output_norm.weight", o->n_embd);                              /* [n_embd] */
    for (int64_t il = 0; ok && il < o->n_layer; il++) {
        ok = add_block(&f, o, il, strcmp(o->arch, "qwen3") == 0);
    }
    ok = ok && write_file(&f, path);
    if (ok) {
        printf("wrote %s: %s target, %lld layers, n_embd %lld, n_vocab %lld, %s weights, %s output, %.2f MB\n",
               path, o->arch, (long long)o->n_layer, (long long)o->n_embd, (long long)o->n_vocab,
               quant_type_get(o->wtype)->name, o->tied ? "tied" : "untied", (double)f.n_bytes / 1e6);
    }
    tm_file_free(&f);
    return ok;
}

/* A [n] f32 tensor of N(0, std) (a scalar bias / scale: n = 1, or an explicit value). */
static bool add_f32_values(tm_file *f, const char *name, int64_t n, const float *values) {
    float *data = tm_alloc(f, (size_t)n * sizeof(float));
    if (data == NULL) return false;
    memcpy(data, values, (size_t)n * sizeof(float));
    const int64_t ne[1] = {n};
    return add_f32_tensor(f, name, 1, ne, data);
}

/* The drafter options' keys and the DSpark heads in the converter's layout (docs/drafter.md). */
static bool add_drafter_variants(tm_file *f, const tm_opts *o) {
    gguf_writer *w = f->w;
    if (o->causal) gguf_writer_set_bool(w, "dflash.attention.causal", true);
    if (o->swa > 0) {
        gguf_writer_set_u32(w, "dflash.attention.sliding_window", (uint32_t)o->swa);
        bool pat[TM_MAX_TARGET_LAYERS];
        for (int64_t i = 0; i < o->draft_layers; i++) pat[i] = o->swa_pattern_set ? o->swa_pattern[i] : i % 2 == 0;
        gguf_writer_set_arr_num(w, "dflash.attention.sliding_window_pattern", GGUF_TYPE_BOOL, pat, (size_t)o->draft_layers);
    }
    if (o->logit_scale != 0.0f) gguf_writer_set_f32(w, "dflash.logit_scale", o->logit_scale);
    if (o->softcap != 0.0f) gguf_writer_set_f32(w, "dflash.final_logit_softcapping", o->softcap);
    if (o->embedding_scale != 0.0f) gguf_writer_set_f32(w, "dflash.embedding_scale", o->embedding_scale);
    if (o->dspark_rank <= 0) return true;
    const int64_t R = o->dspark_rank;
    gguf_writer_set_bool(w, "dflash.sample_from_anchor", !o->bonus_anchor);
    gguf_writer_set_bool(w, "dflash.has_confidence_head", o->dspark_conf);
    bool ok = add_matrix(f, "markov_w1.weight", R, o->n_vocab, o->wtype, o->markov_std); /* [R, n_vocab] */
    ok = ok && add_matrix(f, "markov_w2.weight", R, o->n_vocab, o->wtype, o->markov_std); /* [R, n_vocab] */
    if (ok && o->markov_scale != 0.0f) ok = add_f32_values(f, "markov_w2.scale", 1, &o->markov_scale); /* [1] */
    if (ok && o->dspark_conf) {
        ok = add_matrix(f, "conf_proj.weight", o->n_embd + R, 1, o->wtype, 0.3); /* [n_embd + R, 1] */
        tm_rng r;
        rng_init(&r, f->seed, f->tag, "conf_proj.bias");
        const float b = (float)(0.5 * rng_normal(&r));
        ok = ok && add_f32_values(f, "conf_proj.bias", 1, &b); /* [1] */
    }
    return ok;
}

static bool make_drafter(const tm_opts *o, const test_vocab *v, const char *path) {
    tm_file f = {.w = gguf_writer_new(), .tag = "drafter", .seed = o->seed};
    if (f.w == NULL) {
        fprintf(stderr, "make-test-model: out of memory\n");
        return false;
    }
    gguf_writer_set_str(f.w, "general.architecture", "dflash");
    gguf_writer_set_str(f.w, "general.name", "dflash-test-drafter");
    gguf_writer_set_u32(f.w, "general.alignment", GGUF_DEFAULT_ALIGNMENT);
    write_hparams(f.w, "dflash", o, o->draft_layers);
    gguf_writer_set_u32(f.w, "dflash.block_size", (uint32_t)o->block_size);
    gguf_writer_set_arr_i32(f.w, "dflash.target_layers", o->target_layers, (size_t)o->n_target_layers);
    test_vocab_write(v, f.w);
    bool ok = add_matrix(&f, "fc.weight", o->n_target_layers * o->n_embd, o->n_embd, o->wtype, o->std); /* [n_tl*n_embd, n_embd] */
    ok = ok && add_norm(&f, "enc.output_norm.weight", o->n_embd); /* [n_embd] the fusion norm */
    ok = ok && add_norm(&f, "output_norm.weight", o->n_embd);     /* [n_embd] */
    for (int64_t il = 0; ok && il < o->draft_layers; il++) {
        ok = add_block(&f, o, il, true);
    }
    ok = ok && add_drafter_variants(&f, o);
    if (ok && o->d2_kernel > 0) ok = add_dflash2(&f, o);
    ok = ok && write_file(&f, path);
    if (ok) {
        printf("wrote %s: %s drafter, %lld layers, block size %lld, target layers", path,
               o->d2_kernel > 0 ? "dflash2" : "dflash", (long long)o->draft_layers, (long long)o->block_size);
        for (int i = 0; i < o->n_target_layers; i++) printf("%s%d", i ? "," : " ", o->target_layers[i]);
        if (o->dspark_rank > 0) {
            printf(", DSpark rank %lld%s%s", (long long)o->dspark_rank, o->dspark_conf ? " + confidence" : "",
                   o->bonus_anchor ? ", bonus anchor" : ", anchor-first");
        }
        printf(", %.2f MB\n", (double)f.n_bytes / 1e6);
    }
    tm_file_free(&f);
    return ok;
}

/* ---- options --------------------------------------------------------------------------------- */

static void usage(FILE *out) {
    fprintf(out,
            "usage: dflash make-test-model -o DIR [options]\n"
            "       dflash make-test-model --target PATH --drafter PATH [options]\n"
            "Writes a random tiny target (DIR/target.gguf) and a DFlash drafter for it (DIR/drafter.gguf).\n"
            "  -o DIR                output directory (created if missing)\n"
            "  --target PATH         target file (only this one if --drafter is not given and no -o)\n"
            "  --drafter PATH        drafter file\n"
            "  --arch qwen3|llama    target architecture (default qwen3)\n"
            "  --n-embd N            (default 64)\n"
            "  --n-layer N           target layers (default 4)\n"
            "  --n-head N            (default 4)\n"
            "  --n-head-kv N         (default 2)\n"
            "  --head-dim N          (default 16, even)\n"
            "  --n-ff N              (default 128)\n"
            "  --n-vocab N           (default 1024; at least the test vocabulary's size)\n"
            "  --n-ctx-train N       context_length key (default 4096)\n"
            "  --draft-layers N      drafter layers (default 1)\n"
            "  --block-size N        drafter block size, 2..64 (default 16)\n"
            "  --target-layers L,..  layer-input ids of the target, 1..n_layer (default spread)\n"
            "  --type T              f32|f16|bf16|q8_0|q4_0: type of the 2D weights (default f32)\n"
            "  --tied | --untied     output head tied to token_embd (default tied)\n"
            "  --dflash2 K,GS,R,TOPK a DFlash2 drafter: conv kernel K, conv group size GS (divides n_embd),\n"
            "                        selector rank R, selector top-k TOPK (n_embd >= TOPK*(TOPK+1))\n"
            "  --seed N              (default 42)\n"
            "  --std S               weight standard deviation (default 0.02)\n"
            "drafter variants (docs/drafter.md, \"DSpark\" and \"Drafter options\"):\n"
            "  --dspark-rank R       a DSpark drafter with Markov rank R (default 0: plain DFlash)\n"
            "  --no-confidence       DSpark without the confidence head\n"
            "  --bonus-anchor        DSpark with dflash.sample_from_anchor = false (default true)\n"
            "  --markov-std S        std of markov_w1/markov_w2 (default 0.5)\n"
            "  --markov-scale S      write markov_w2.scale = S\n"
            "  --causal              dflash.attention.causal = true\n"
            "  --swa N               dflash.attention.sliding_window = N\n"
            "  --swa-pattern B,..    per drafter layer 1 (sliding) or 0 (default: 1,0,1,..)\n"
            "  --logit-scale S       dflash.logit_scale\n"
            "  --softcap C           dflash.final_logit_softcapping\n"
            "  --embedding-scale S   dflash.embedding_scale\n");
}

static bool parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (s == NULL || *s == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi) {
        fprintf(stderr, "make-test-model: %s expects an integer in %lld..%lld, got '%s'\n", opt, (long long)lo,
                (long long)hi, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

static bool parse_layers(const char *s, tm_opts *o) {
    o->n_target_layers = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno != 0 || (*end != ',' && *end != '\0') || v < INT32_MIN || v > INT32_MAX) {
            fprintf(stderr, "make-test-model: --target-layers expects comma-separated integers, got '%s'\n", s);
            return false;
        }
        if (o->n_target_layers == TM_MAX_TARGET_LAYERS) {
            fprintf(stderr, "make-test-model: --target-layers: at most %d ids\n", TM_MAX_TARGET_LAYERS);
            return false;
        }
        o->target_layers[o->n_target_layers++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0') {
            fprintf(stderr, "make-test-model: --target-layers: trailing comma in '%s'\n", s);
            return false;
        }
    }
    if (o->n_target_layers == 0) {
        fprintf(stderr, "make-test-model: --target-layers is empty\n");
        return false;
    }
    return true;
}

/* Default layer-input ids spread over the target: 1, the middle, n_layer-1 (or fewer). */
static void default_layers(tm_opts *o) {
    int64_t L = o->n_layer;
    if (L <= 1) {
        o->target_layers[0] = 1;
        o->n_target_layers = 1;
    } else if (L <= 3) {
        o->target_layers[0] = 1;
        o->target_layers[1] = 2;
        o->n_target_layers = 2;
    } else {
        o->target_layers[0] = 1;
        o->target_layers[1] = (int32_t)(1 + (L - 2) / 2);
        o->target_layers[2] = (int32_t)(L - 1);
        o->n_target_layers = 3;
    }
}

/* Checks the combination of options; prints what is wrong. */
static bool validate(tm_opts *o, size_t min_vocab) {
    if (o->n_head % o->n_head_kv != 0) {
        fprintf(stderr, "make-test-model: --n-head %lld is not a multiple of --n-head-kv %lld\n",
                (long long)o->n_head, (long long)o->n_head_kv);
        return false;
    }
    if (o->head_dim % 2 != 0) {
        fprintf(stderr, "make-test-model: --head-dim %lld must be even (RoPE rotates pairs)\n", (long long)o->head_dim);
        return false;
    }
    const quant_type_info *ti = quant_type_get(o->wtype);
    if (ti->blck_size > 1) {
        const struct { const char *what; int64_t v; } dims[] = {
            {"n_embd", o->n_embd}, {"n_head*head_dim", o->n_head * o->head_dim}, {"n_ff", o->n_ff},
        };
        for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
            if (dims[i].v % ti->blck_size != 0) {
                fprintf(stderr, "make-test-model: --type %s needs %s (%lld) to be a multiple of its block size %lld\n",
                        ti->name, dims[i].what, (long long)dims[i].v, (long long)ti->blck_size);
                return false;
            }
        }
    }
    if (o->swa > 0 && o->draft_layers > TM_MAX_TARGET_LAYERS) {
        fprintf(stderr, "make-test-model: --swa with more than %d drafter layers\n", TM_MAX_TARGET_LAYERS);
        return false;
    }
    if (o->dspark_rank > 0 && ti->blck_size > 1 && o->dspark_rank % ti->blck_size != 0) {
        fprintf(stderr, "make-test-model: --type %s needs --dspark-rank (%lld) to be a multiple of its block size %lld\n",
                ti->name, (long long)o->dspark_rank, (long long)ti->blck_size);
        return false;
    }
    if (o->n_target_layers == 0) default_layers(o);
    for (int i = 0; i < o->n_target_layers; i++) {
        if (o->target_layers[i] < 1 || o->target_layers[i] > o->n_layer) {
            fprintf(stderr,
                    "make-test-model: --target-layers: id %d is out of 1..%lld (layer-input ids of the target; "
                    "%lld = the last layer's output)\n", o->target_layers[i], (long long)o->n_layer,
                    (long long)o->n_layer);
            return false;
        }
        for (int j = 0; j < i; j++) {
            if (o->target_layers[j] == o->target_layers[i]) {
                fprintf(stderr, "make-test-model: --target-layers: id %d appears twice\n", o->target_layers[i]);
                return false;
            }
        }
    }
    if (o->d2_kernel > 0) {
        if (o->n_embd % o->d2_group != 0 || o->n_embd < o->d2_top_k * (o->d2_top_k + 1) || o->d2_top_k > o->n_vocab) {
            fprintf(stderr, "make-test-model: --dflash2: the group size must divide n_embd (%lld), n_embd must be >= "
                    "TOPK*(TOPK+1) and TOPK <= n_vocab\n", (long long)o->n_embd);
            return false;
        }
        if (ti->blck_size > 1 && (o->d2_rank % ti->blck_size != 0)) {
            fprintf(stderr, "make-test-model: --type %s needs the selector rank (%lld) to be a multiple of its block "
                    "size %lld\n", ti->name, (long long)o->d2_rank, (long long)ti->blck_size);
            return false;
        }
    }
    if ((size_t)o->n_vocab < min_vocab) {
        fprintf(stderr, "make-test-model: --n-vocab %lld is too small: the test vocabulary needs at least %zu tokens\n",
                (long long)o->n_vocab, min_vocab);
        return false;
    }
    /* refuse sizes that would not fit in memory by accident (largest matrix and the total) */
    double n = (double)o->n_embd * (double)o->n_vocab * (o->tied ? 1 : 2) +
               (double)o->n_layer * ((double)o->n_embd * (double)(o->n_head + 2 * o->n_head_kv) * (double)o->head_dim * 2 +
                                     3.0 * (double)o->n_embd * (double)o->n_ff);
    if (n * 4 > 32e9) {
        fprintf(stderr, "make-test-model: the target would have %.3g parameters: too large for a test model\n", n);
        return false;
    }
    return true;
}

int cmd_make_test_model(int argc, char **argv) {
    tm_opts o = {
        .arch = "qwen3", .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 16,
        .n_ff = 128, .n_vocab = 1024, .n_ctx_train = 4096, .draft_layers = 1, .block_size = 16,
        .wtype = QUANT_TYPE_F32, .tied = true, .seed = 42, .std = 0.02,
        .dspark_conf = true, .markov_std = 0.5,
    };
    const int64_t big = (int64_t)1 << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--tied") == 0) {
            o.tied = true;
            takes = false;
        } else if (strcmp(a, "--untied") == 0) {
            o.tied = false;
            takes = false;
        } else if (strcmp(a, "--no-confidence") == 0) {
            o.dspark_conf = false;
            takes = false;
        } else if (strcmp(a, "--bonus-anchor") == 0) {
            o.bonus_anchor = true;
            takes = false;
        } else if (strcmp(a, "--causal") == 0) {
            o.causal = true;
            takes = false;
        } else if (val == NULL) {
            static const char *const k_valued[] = {"-o", "--target", "--drafter", "--arch", "--n-embd", "--n-layer",
                                                   "--n-head", "--n-head-kv", "--head-dim", "--n-ff", "--n-vocab",
                                                   "--n-ctx-train", "--draft-layers", "--block-size", "--target-layers",
                                                   "--type", "--seed", "--std", "--dspark-rank", "--markov-std",
                                                   "--markov-scale", "--swa", "--swa-pattern", "--logit-scale",
                                                   "--softcap", "--embedding-scale", "--dflash2"};
            bool known = false;
            for (size_t k = 0; k < sizeof(k_valued) / sizeof(k_valued[0]); k++) known |= strcmp(a, k_valued[k]) == 0;
            if (known) fprintf(stderr, "make-test-model: option %s needs a value\n", a);
            else fprintf(stderr, "make-test-model: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (strcmp(a, "-o") == 0) {
            o.out_dir = val;
        } else if (strcmp(a, "--target") == 0) {
            o.target_path = val;
        } else if (strcmp(a, "--drafter") == 0) {
            o.drafter_path = val;
        } else if (strcmp(a, "--arch") == 0) {
            if (strcmp(val, "qwen3") != 0 && strcmp(val, "llama") != 0) {
                fprintf(stderr, "make-test-model: --arch must be qwen3 or llama, got '%s'\n", val);
                return 2;
            }
            o.arch = val;
        } else if (strcmp(a, "--n-embd") == 0) {
            ok = parse_int(a, val, 1, big, &o.n_embd);
        } else if (strcmp(a, "--n-layer") == 0) {
            ok = parse_int(a, val, 1, 512, &o.n_layer);
        } else if (strcmp(a, "--n-head") == 0) {
            ok = parse_int(a, val, 1, 4096, &o.n_head);
        } else if (strcmp(a, "--n-head-kv") == 0) {
            ok = parse_int(a, val, 1, 4096, &o.n_head_kv);
        } else if (strcmp(a, "--head-dim") == 0) {
            ok = parse_int(a, val, 2, 4096, &o.head_dim);
        } else if (strcmp(a, "--n-ff") == 0) {
            ok = parse_int(a, val, 1, big, &o.n_ff);
        } else if (strcmp(a, "--n-vocab") == 0) {
            ok = parse_int(a, val, 1, (int64_t)1 << 24, &o.n_vocab);
        } else if (strcmp(a, "--n-ctx-train") == 0) {
            ok = parse_int(a, val, 1, (int64_t)1 << 30, &o.n_ctx_train);
        } else if (strcmp(a, "--draft-layers") == 0) {
            ok = parse_int(a, val, 1, 512, &o.draft_layers);
        } else if (strcmp(a, "--block-size") == 0) {
            ok = parse_int(a, val, 2, 64, &o.block_size);
        } else if (strcmp(a, "--target-layers") == 0) {
            ok = parse_layers(val, &o);
        } else if (strcmp(a, "--type") == 0) {
            int t = quant_type_from_name(val);
            if (t != QUANT_TYPE_F32 && t != QUANT_TYPE_F16 && t != QUANT_TYPE_BF16 && t != QUANT_TYPE_Q8_0 &&
                t != QUANT_TYPE_Q4_0) {
                fprintf(stderr, "make-test-model: --type must be f32, f16, bf16, q8_0 or q4_0, got '%s'\n", val);
                return 2;
            }
            o.wtype = (uint32_t)t;
        } else if (strcmp(a, "--dflash2") == 0) {
            long long v[4];
            char tail;
            if (sscanf(val, "%lld,%lld,%lld,%lld%c", &v[0], &v[1], &v[2], &v[3], &tail) != 4 || v[0] < 1 || v[0] > 64 ||
                v[1] < 1 || v[2] < 1 || v[2] > 4096 || v[3] < 1 || v[3] > 64) {
                fprintf(stderr, "make-test-model: --dflash2 expects K,GS,R,TOPK (K 1..64, GS >= 1, R 1..4096, TOPK 1..64), "
                        "got '%s'\n", val);
                return 2;
            }
            o.d2_kernel = v[0];
            o.d2_group = v[1];
            o.d2_rank = v[2];
            o.d2_top_k = v[3];
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(val, &end, 0);
            if (*val == '\0' || *val == '-' || *end != '\0' || errno != 0) {
                fprintf(stderr, "make-test-model: --seed expects a non-negative integer, got '%s'\n", val);
                return 2;
            }
            o.seed = s;
        } else if (strcmp(a, "--dspark-rank") == 0) {
            ok = parse_int(a, val, 0, 4096, &o.dspark_rank);
        } else if (strcmp(a, "--swa") == 0) {
            ok = parse_int(a, val, 1, (int64_t)1 << 30, &o.swa);
        } else if (strcmp(a, "--swa-pattern") == 0) {
            int64_t n = 0;
            for (const char *p = val; ok && *p; p++) {
                if ((*p == '0' || *p == '1') && n < TM_MAX_TARGET_LAYERS) o.swa_pattern[n++] = *p == '1';
                else if (*p != ',') ok = false;
            }
            o.swa_pattern_set = true;
            if (!ok || n == 0) {
                fprintf(stderr, "make-test-model: --swa-pattern expects comma-separated 0/1, got '%s'\n", val);
                return 2;
            }
        } else if (strcmp(a, "--markov-std") == 0 || strcmp(a, "--markov-scale") == 0 || strcmp(a, "--logit-scale") == 0 ||
                   strcmp(a, "--softcap") == 0 || strcmp(a, "--embedding-scale") == 0) {
            char *end;
            const double v = strtod(val, &end);
            if (*val == '\0' || *end != '\0' || !(v > 0.0 && v < 1e6)) {
                fprintf(stderr, "make-test-model: %s expects a positive number, got '%s'\n", a, val);
                return 2;
            }
            if (strcmp(a, "--markov-std") == 0) o.markov_std = v;
            else if (strcmp(a, "--markov-scale") == 0) o.markov_scale = (float)v;
            else if (strcmp(a, "--logit-scale") == 0) o.logit_scale = (float)v;
            else if (strcmp(a, "--softcap") == 0) o.softcap = (float)v;
            else o.embedding_scale = (float)v;
        } else if (strcmp(a, "--std") == 0) {
            char *end;
            o.std = strtod(val, &end);
            if (*val == '\0' || *end != '\0' || !(o.std > 0.0 && o.std < 100.0)) {
                fprintf(stderr, "make-test-model: --std expects a number in (0, 100), got '%s'\n", val);
                return 2;
            }
        } else {
            fprintf(stderr, "make-test-model: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) return 2;
        if (takes) i++;
    }
    char target_buf[4096], drafter_buf[4096];
    if (o.out_dir != NULL) {
        if (mkdir(o.out_dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "make-test-model: cannot create %s: %s\n", o.out_dir, strerror(errno));
            return 1;
        }
        if (o.target_path == NULL) {
            if (!cli_path_join(target_buf, sizeof(target_buf), o.out_dir, "target.gguf", "make-test-model")) return 1;
            o.target_path = target_buf;
        }
        if (o.drafter_path == NULL) {
            if (!cli_path_join(drafter_buf, sizeof(drafter_buf), o.out_dir, "drafter.gguf", "make-test-model")) return 1;
            o.drafter_path = drafter_buf;
        }
    }
    if (o.target_path == NULL && o.drafter_path == NULL) {
        fprintf(stderr, "make-test-model: give -o DIR or --target PATH / --drafter PATH\n");
        usage(stderr);
        return 2;
    }
    size_t min_vocab = test_vocab_min_size();
    if (!validate(&o, min_vocab)) {
        return 2;
    }
    test_vocab v;
    char msg[256];
    if (test_vocab_build(&v, (size_t)o.n_vocab, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "make-test-model: %s\n", msg);
        return 1;
    }
    bool ok = true;
    if (o.target_path != NULL) ok = make_target(&o, &v, o.target_path);
    if (ok && o.drafter_path != NULL) ok = make_drafter(&o, &v, o.drafter_path);
    test_vocab_free(&v);
    return ok ? 0 : 1;
}
