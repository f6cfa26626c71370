/* cpu_internal.h: the CPU backend's internals shared by its files: the backend object, the
 * prepared-activation formats of matmul, the kernel table selected at run time by CPU features,
 * and the op executor. */
#ifndef DFL_BACKEND_CPU_INTERNAL_H
#define DFL_BACKEND_CPU_INTERNAL_H

#include "backend/backend_impl.h"
#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>

/* Elementwise ops (rmsnorm, swiglu, add, rope, ...) of fewer elements than this run on the
 * calling thread alone; larger ones are split over the pool. A job costs the pool about a
 * microsecond of hand-off; a 16-row verify's ops (16 x 1024 .. 16 x 3072 values) take 5-30 us. */
#ifndef CPU_LIGHT_MIN_ELEMS
#define CPU_LIGHT_MIN_ELEMS 8192
#endif

/* ---- prepared activations (the "dot type" of a weight type) -------------------------------- */

typedef enum cpu_dot_type {
    CPU_DOT_F32 = 0, /* f32 rows; values rounded to f16 / bf16 for F16 / BF16 weights */
    CPU_DOT_Q8_0 = 1, /* blocks of 32: int8 q, f32 d (an f16 value), as llama.cpp's x86 quantizer */
    CPU_DOT_Q8_K = 2, /* blocks of 256: int8 q, f32 d, int16 sums of each 16 q (llama.cpp's Q8_K) */
    CPU_DOT_BF16T = 3, /* P16_X16 weights (AMX-BF16 tiles): rows of bf16 pairs, n_in padded to 32 with
                        * zeros; BF16 weights: the bf16-rounded value (th); F16 weights: the
                        * f16-rounded value v as th = v's top 16 bits and tl = v - th (exact) */
} cpu_dot_type;

/* Q8_0 activations are stored in groups of 16 blocks (512 values) "transposed": byte
 * g*512 + k*64 + j*4 + e of a row holds value 4k + e (k 0..7, e 0..3) of block 16g + j, so that
 * 32-bit lane j of the k-th 64-byte vector of a group belongs to block j: an integer dot product
 * instruction accumulates each block in its own lane and one f32 scale per lane applies. Rows are
 * padded to whole groups with zero blocks (q = 0, d = 0). */
#define CPU_Q8_0_GROUP 16
#define CPU_Q8_0_GROUP_VALUES (CPU_Q8_0_GROUP * QK8_0)

static inline int64_t cpu_q8_0_row_pad(int64_t n_in) {
    return (n_in + CPU_Q8_0_GROUP_VALUES - 1) / CPU_Q8_0_GROUP_VALUES * CPU_Q8_0_GROUP_VALUES;
}

/* Q8_0 and Q8_K activation blocks with amax below this get q = 0 and d = 0 (a Q8_0 d = amax / 127
 * rounds to f16 0 for all of them anyway, and 127 / amax stays finite); blocks with a NaN / Inf get
 * d = NaN, q = 0 and zero sums (cpu_act.c, the same in every quantizer). */
#define CPU_Q8_0_AMAX_MIN 0x1p-100f

/* Byte offset of value i of a Q8_0 activation row in the transposed layout. */
static inline int64_t cpu_q8_0_offset(int64_t i) {
    const int64_t b = i / QK8_0, w = i % QK8_0;
    return (b / CPU_Q8_0_GROUP) * CPU_Q8_0_GROUP_VALUES + (w / 4) * 64 + (b % CPU_Q8_0_GROUP) * 4 + w % 4;
}

/* Activation rows [n_in, n_rows] prepared for one matmul. Per-row lengths:
 * f [n_in]; Q8_0: qs [row_len] (transposed, padded), d [row_len / 32], ns [row_len / 32];
 * Q8_K: qs [n_in] (plain order), d [n_in / 256], bsums [n_in / 16], bsums32 [n_in / 32], qsu [n_in]. */
typedef struct cpu_act {
    cpu_dot_type dot;
    int64_t n_in;
    int64_t n_rows;
    int64_t row_len;  /* values per row in qs (n_in, or padded to a whole group for Q8_0) */
    float *f;         /* [n_rows][n_in]            CPU_DOT_F32 */
    int8_t *qs;       /* [n_rows][row_len]         CPU_DOT_Q8_0, CPU_DOT_Q8_K */
    float *d;         /* [n_rows][row_len / block] CPU_DOT_Q8_0 (block 32), CPU_DOT_Q8_K (block 256) */
    int32_t *ns;      /* [n_rows][row_len / 32]    CPU_DOT_Q8_0: minus the sum of each block's q */
    int16_t *bsums;   /* [n_rows][n_in / 16]       CPU_DOT_Q8_K */
    int16_t *bsums32; /* [n_rows][n_in / 32]       CPU_DOT_Q8_K: bsums[2j] + bsums[2j+1] (a sub-block of 32) */
    uint8_t *qsu;     /* [n_rows][n_in]            CPU_DOT_Q8_K: qs + 128 (1..255), the unsigned operand of
                       * the AVX-512 packed Q6_K kernel (its weights are the signed one) */
    uint16_t *th, *tl; /* [n_rows][row_len]        CPU_DOT_BF16T (row_len = n_in rounded up to 32) */
    int pf_l1_rows;   /* the packed AVX-512 kernels' row tiles of at most this many rows prefetch the
                       * weights ahead into L1, larger ones into L2 (cpu_kernels.pf_l1_rows; 2 from
                       * cpu_act_layout) */
} cpu_act;

/* The dot type a weight type is multiplied with (plain layout). */
cpu_dot_type cpu_dot_type_of(uint32_t wtype);
/* The dot type of a matmul's weight: its type's, or CPU_DOT_BF16T for a P16_X16 one. */
cpu_dot_type cpu_dot_type_of_weight(const tensor *w);
/* Bytes of scratch cpu_act_layout needs for n_rows rows of n_in. */
size_t cpu_act_bytes(cpu_dot_type dot, int64_t n_in, int64_t n_rows);
/* Points the arrays of act into mem (64-byte aligned pieces). */
void cpu_act_layout(cpu_act *act, cpu_dot_type dot, int64_t n_in, int64_t n_rows, void *mem);

/* Prepares one activation row r of act from x [n_in] (scalar reference versions). */
void cpu_act_row_f16_ref(cpu_act *act, int64_t r, const float *x);  /* f16-rounded f32 */
void cpu_act_row_bf16_ref(cpu_act *act, int64_t r, const float *x); /* bf16-rounded f32 */
void cpu_act_row_f16_tile_ref(cpu_act *act, int64_t r, const float *x);  /* CPU_DOT_BF16T, F16 weights */
void cpu_act_row_bf16_tile_ref(cpu_act *act, int64_t r, const float *x); /* CPU_DOT_BF16T, BF16 weights */
void cpu_act_row_q8_0_ref(cpu_act *act, int64_t r, const float *x);
void cpu_act_row_q8_K_ref(cpu_act *act, int64_t r, const float *x);
/* Row r's bsums32 from its bsums (the last step of every Q8_K row producer; each producer writes
 * qsu beside qs). */
void cpu_act_q8_K_sums32(cpu_act *act, int64_t r);
/* Bytes of one row's prepared activations that a matmul kernel reads (cpu_act_bytes of one row,
 * less Q8_K's qsu: a kernel reads qs or qsu, never both). */
size_t cpu_act_row_hot_bytes(cpu_dot_type dot, int64_t n_in);

/* ---- kernels ----------------------------------------------------------------------------- */

/* Matmul kernel: dst[r * dst_stride + o] for o in [o0, o1) and r in [r0, r0 + nr), from weight
 * rows w (row o at w + o * w_nb1) and prepared activations act. */
typedef void (*cpu_matmul_fn)(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                              float *dst, int64_t dst_stride, int64_t o0, int64_t o1);
/* Activation preparation of one row. */
typedef void (*cpu_act_row_fn)(cpu_act *act, int64_t r, const float *x);
/* Dot product of n f32 with n F16 (or F32) values (attention scores). */
typedef float (*cpu_dot_f16_fn)(const float *x, const uint16_t *y, int64_t n);
/* y[i] += a * x[i] for n F16 values x (attention: accumulate v rows). */
typedef void (*cpu_axpy_f16_fn)(float *y, float a, const uint16_t *x, int64_t n);
/* Row softmax p = softmax(s) over n scores (-INFINITY = excluded; all excluded gives zeros; a NaN
 * or +INFINITY score makes the row NaN); p may
 * be s. Same contract as cpu_softmax_row_ref, exp within a few ulp. */
typedef void (*cpu_softmax_fn)(float *p, const float *s, int64_t n);
/* A score row of the f16 attention with a structured mask, in place: t_j = s_j * scale + 0.0f for
 * j < n_vis and -inf after, p = softmax_row(t), each p_j rounded to f16 (act_row[F16]): bit for
 * bit those three steps with the same level's kernels, in fewer passes (NULL: none at this level;
 * cpu_ops.c then runs the steps). */
typedef void (*cpu_attn_probs_fn)(float *s, int64_t n, int64_t n_vis, float scale);

/* Attention values: out[r * ldo + i] = sum over j = 0 .. n_kv-1 (in that order) of
 * p[r * ldp + j] * v_j[i], for r < nq, i < hd; value row j (f16) at v + j * v_nb bytes. Terms
 * with p = 0 are skipped (a masked key adds nothing, even where its value is inf). The caller
 * vouches that value rows [0, n_fin) are finite (0 <= n_fin <= n_kv: a kernel that checks the rows
 * need check only the others; the AVX-512 one checks all of them unless n_fin = n_kv, in the pass
 * that multiplies them); returns a count of leading rows now known finite, at least n_fin
 * (n_kv when the kernel checked the rest and found them finite). The f16 attention hands the
 * count to the next item of the same kv head (cpu_ops.c). acc: out already holds the sums over
 * earlier keys, which these keys' terms continue in order: calls over consecutive key ranges
 * with acc from the second on give the same bits as one call over them all (each sum is one
 * chain of fmas over the keys), which lets a decode step read several heads' value rows per
 * block of cells. */
typedef int64_t (*cpu_attn_pv_fn)(float *out, int64_t ldo, const float *p, int64_t ldp, int64_t nq, const void *v,
                                  size_t v_nb, int64_t n_kv, int64_t hd, int64_t n_fin, bool acc);

/* Light-op rows (contiguous f32 rows; same contracts as the reference ops in cpu_ops_ref.c):
 * rmsnorm d = x / sqrt(mean(x^2) + eps) * w (w may be NULL); swiglu d = silu(g) * u;
 * add/mul d = a op b; argmax: the first index of the maximum; f16 d = x rounded to nearest even. */
typedef void (*cpu_rmsnorm_row_fn)(float *d, const float *x, const float *w, int64_t n, float eps);
typedef void (*cpu_swiglu_row_fn)(float *d, const float *g, const float *u, int64_t n);
typedef void (*cpu_binary_row_fn)(float *d, const float *a, const float *b, int64_t n);
typedef int32_t (*cpu_argmax_row_fn)(const float *x, int64_t n);
typedef void (*cpu_f16_row_fn)(uint16_t *d, const float *x, int64_t n);
/* rope: dr = xr rotated by the (cos, sin) pairs cs (cpu_rope_row's contract; dr may be xr). */
typedef void (*cpu_rope_row_fn)(float *dr, const float *xr, const float *cs, int64_t hd, int32_t n_rot, bool norm);

typedef struct cpu_kernels {
    const char *name;                     /* "scalar", "avx2", "avx512" */
    cpu_matmul_fn matmul[QUANT_TYPE_COUNT]; /* by weight type; NULL = unsupported */
    /* weights packed by cpu_weight_pack (cpu_pack.c): Q8_0 in TENSOR_LAYOUT_Q8_0_X16, Q4_K in
     * TENSOR_LAYOUT_KQ_X16, Q6_K in KQ_X16 (AVX-512) or Q6K_X16V (AVX2); NULL: that type is not
     * packed at this level */
    cpu_matmul_fn matmul_packed[QUANT_TYPE_COUNT];
    uint32_t pack_layout[QUANT_TYPE_COUNT]; /* the tensor_layout matmul_packed reads */
    cpu_act_row_fn act_row[QUANT_TYPE_COUNT]; /* by weight type */
    cpu_act_row_fn act_row_packed[QUANT_TYPE_COUNT]; /* for packed weights whose dot type differs (P16_X16) */
    cpu_dot_f16_fn dot_f16;
    cpu_axpy_f16_fn axpy_f16;
    cpu_softmax_fn softmax_row;
    cpu_attn_probs_fn attn_probs_row;
    cpu_attn_pv_fn attn_pv_f16;
    cpu_rmsnorm_row_fn rmsnorm_row;
    cpu_swiglu_row_fn swiglu_row;
    cpu_binary_row_fn add_row, mul_row;
    cpu_argmax_row_fn argmax_row;
    cpu_f16_row_fn f16_row;
    cpu_rope_row_fn rope_row;
    /* cpu_act.pf_l1_rows for the matmuls (cpu_kernels_select: 0 on Intel, 2 elsewhere). Intel
     * Xeon VM with AMX, 2 threads, cold weights, 1 row: [1024 x 12288] Q4_K 0.357 ms with 1-2
     * row tiles prefetching into L1 -> 0.285 into L2, the [1024 x 151936] Q6_K head 7.72 ->
     * 5.96; 2 rows likewise. On Zen 4 L1 was the faster for 1-2 rows (bench/results/
     * cpu-prefetch-l2.md). */
    int pf_l1_rows;
    /* Query rows per item of the f16 attention (cpu_ops.c; a multiple of 4): 16. Zen 4 VM, 2
     * threads, bench_ops attn (16 / 8 heads, dim 128), 3-4 alternated rounds, min ms, 8 -> 16:
     * 16 x 4112 3.24-3.47 -> 2.99-3.12, 8 x 4104 (now the kv-head path) 1.64-1.69 -> 1.53-1.56,
     * 16 x 528 0.41 -> 0.38, 128 x 4224 26.3-26.9 -> 24.1-24.7; 1 thread 16 x 4112 6.9 -> 6.0
     * (fewer items per kv head: its key and value rows are read fewer times). AMX Xeon VM, 2
     * threads, Q4_K_M, 512 tokens after 64, 3 alternated rounds: 8 711-731 ms, 16 643-700. Zen 5
     * measured 8 against 12 only (pp512, 8 faster in 6 of 8 pairs, by 0-8%). */
    int attn_rows;
} cpu_kernels;

/* The activation preparation of a matmul's weight w: act_row_packed for a P16_X16 weight (dot type
 * CPU_DOT_BF16T), else act_row of its type. */
static inline cpu_act_row_fn cpu_act_prep_of(const cpu_kernels *k, const tensor *w) {
    return w->layout == TENSOR_LAYOUT_P16_X16 ? k->act_row_packed[w->type] : k->act_row[w->type];
}

/* Fills k for the feature bits (backend_cpu_feature) usable on this machine. */
void cpu_kernels_select(cpu_kernels *k, uint32_t features);
void cpu_kernels_init_ref(cpu_kernels *k);
void cpu_kernels_init_avx2(cpu_kernels *k);   /* requires BACKEND_CPU_FEATURE_AVX2 */
void cpu_kernels_init_avx512(cpu_kernels *k); /* requires AVX512 + AVX512_VNNI */
/* The AVX2 / AVX-512 matmul kernels of F32 / F16 / BF16 weights (cpu_gemm_float_avx2.c,
 * cpu_gemm_float_avx512.c). */
void cpu_mm_f32_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                     int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_f16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                     int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_bf16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                      int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_f32_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                       int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_f16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                       int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_bf16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                        int64_t ds, int64_t o0, int64_t o1);
/* The Q4_K / Q6_K matmul entries of the AVX-512 level (cpu_gemm_kquant_avx512.c). */
void cpu_kernels_init_kquant_avx512(cpu_kernels *k);
void cpu_kernels_init_kquant_avx2(cpu_kernels *k); /* the AVX2 level's (cpu_gemm_kquant_avx2.c) */
/* Feature bits this CPU has (backend_cpu_feature). */
uint32_t cpu_features_detect(void);

/* ---- packed weights (cpu_pack.c) --------------------------------------------------------- */

/* The layout w gets packed for kernels k (PLAIN: not packed): a plain contiguous 2-d weight of a
 * type k has a packed kernel for; Q8_0 needs n_in a multiple of 512. */
uint32_t cpu_weight_pack_layout(const cpu_kernels *k, const tensor *w);
/* Bytes of w packed (0: not packed). */
size_t cpu_weight_pack_size(const cpu_kernels *k, const tensor *w);
/* Packs w into dst (64-byte aligned, cpu_weight_pack_size bytes); returns the packed view. */
tensor cpu_weight_pack(const cpu_kernels *k, const tensor *w, void *dst);
/* Part part of n_parts of that work (disjoint rows / groups: parts may run on several threads),
 * and the view of the whole packed copy. */
void cpu_weight_pack_part(const cpu_kernels *k, const tensor *w, void *dst, int part, int n_parts);
tensor cpu_weight_packed_view(const cpu_kernels *k, const tensor *w, void *dst);
/* KQ_X16 record offsets (lane i = row i of the group; tensor_kq_x16_record_bytes in all):
 * Q4_K: [0, 64) d | dmin << 16 per lane; SC + 16 j + i, M + 16 j + i: sub-block j's 6-bit scale and
 * min (j < 8); QS + 64 q + 4 i: qs dword q (q < 32).
 * Q6_K: [0, 32) d (f16) per lane; SC + 16 j + i: scale j (int8, j < 16); QL + 64 q + 4 i: ql dword q
 * (q < 32); QH + 64 q + 4 i: qh dword q (q < 16): the block's bits, only moved into lanes (the
 * kernels assemble the 6-bit values as the plain Q6_K decode does); NK + 4 i: int32
 * -128 * sum_j scale_j * (sum of sub-block j's signed values q, -32..31), what the biased
 * activations qs + 128 add to a super-block's scaled dots (in the Q6K_X16V records too). */
#define CPU_KQ_X16_Q4K_SC 64
#define CPU_KQ_X16_Q4K_M 192
#define CPU_KQ_X16_Q6K_SC 64
#define CPU_KQ_X16_QS 320
#define CPU_KQ_X16_Q6K_QL 320
#define CPU_KQ_X16_Q6K_QH 2368
#define CPU_KQ_X16_Q6K_NK 3392
/* Q6K_X16V records: d and SC as Q6_K's above; QV + 64 (3 j + k) + 4 i: dword k (k < 3) of
 * sub-block j (j < 16) of row i, byte e = (q + 32 of value 4 k + e of the sub-block) | (bits
 * 2 k, 2 k + 1 of q + 32 of value 12 + e) << 6. */
#define CPU_Q6K_X16V_QV 320
/* Q4_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes (ggml's
 * get_scale_min_k4). */
void cpu_q4_K_scale_min(int j, const uint8_t *q, int *sc, int *m);
/* Q6_K: the signed 6-bit value (-32..31) of element e (0..255) of a block. */
int cpu_q6_K_value(const block_q6_K *b, int e);
/* All 256 of them at once (the same values, in element order). */
void cpu_q6_K_values(const block_q6_K *b, int8_t v[QK_K]);
/* The AVX-512 KQ_X16 kernels (cpu_gemm_kquant_avx512.c; the AVX2 ones are in cpu_gemm_kquant_avx2.c);
 * o0 a multiple of 16. */
void cpu_mm_q4_K_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_q6_K_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1);
/* The AMX-INT8 Q4_K / Q6_K KQ_X16 kernels (cpu_gemm_kquant_amx.c): tiles for calls of 8+ rows, the
 * AVX-512 kernel for fewer; the AVX-512 kernel's bits. Require BACKEND_CPU_FEATURE_AMX_INT8. */
void cpu_mm_q4_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_q6_K_x16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1);
/* The AMX-BF16 matmul of P16_X16 weights (cpu_gemm_p16_amx.c) against CPU_DOT_BF16T activations,
 * every row count; o0 a multiple of 16. Require BACKEND_CPU_FEATURE_AMX_BF16. */
void cpu_mm_f16_p16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                        int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_bf16_p16_amx(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                         int64_t ds, int64_t o0, int64_t o1);
void cpu_act_row_f16_tile_512(cpu_act *act, int64_t r, const float *x);
void cpu_act_row_bf16_tile_512(cpu_act *act, int64_t r, const float *x);
/* Scalar reference of the P16_X16 layout: per output the f64 sum of the products of the packed
 * values and th (+ tl), rounded to f32 once. */
void cpu_matmul_p16_x16_ref(uint32_t wtype, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr,
                            float *dst, int64_t ds, int64_t o0, int64_t o1);
/* Scalar reference of the KQ_X16 and Q6K_X16V layouts (the f64 sums of cpu_matmul_q_ref on the
 * plain rows). */
void cpu_matmul_kq_x16_ref(uint32_t wtype, uint32_t layout, const void *w, size_t w_nb1, const cpu_act *act,
                           int64_t r0, int64_t nr, float *dst, int64_t ds, int64_t o0, int64_t o1);
/* One row: n_in / 32 Q8_0 blocks -> its packed bytes (the row stride, padding zeroed). */
void cpu_pack_q8_0_x16_row(uint8_t *dst, const block_q8_0 *src, int64_t n_in);
/* The Q8_0 x16 matmul kernels (cpu_gemm_q8_0_x16_avx512.c, cpu_gemm_q8_0_x16_avx2.c). */
void cpu_mm_q8_0_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_q8_0_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                          int64_t ds, int64_t o0, int64_t o1);
/* Scalar reference of the packed layout: the same f64 sums as cpu_matmul_q_ref on the plain rows. */
void cpu_matmul_q8_0_x16_ref(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1);
/* The same for Q4_0 (TENSOR_LAYOUT_Q4_0_X16; AVX2 and AVX-512: cpu_kernels_avx2.c,
 * cpu_gemm_q8_0_x16_avx512.c). */
void cpu_pack_q4_0_x16_row(uint8_t *dst, const block_q4_0 *src, int64_t n_in);
void cpu_mm_q4_0_x16_avx512(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                            int64_t ds, int64_t o0, int64_t o1);
void cpu_mm_q4_0_x16_avx2(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                          int64_t ds, int64_t o0, int64_t o1);
void cpu_matmul_q4_0_x16_ref(const void *w, size_t w_nb1, const cpu_act *act, int64_t r0, int64_t nr, float *dst,
                             int64_t ds, int64_t o0, int64_t o1);

/* Scalar reference matmul over prepared activations (the exact quantized computation). */
void cpu_matmul_q_ref(uint32_t wtype, const void *w, size_t w_nb1, const cpu_act *act, int64_t r0,
                      int64_t nr, float *dst, int64_t dst_stride, int64_t o0, int64_t o1);
/* The reference dot of one weight row with activation row r for Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K,
 * Q3_K, Q5_K, IQ4_XS (cpu_matmul_ref_ext.c). */
double cpu_dot_row_ext_ref(uint32_t wtype, const void *wrow, const cpu_act *act, int64_t r);
/* Kernel entries of those types, set after the matching cpu_kernels_init_* (cpu_kernels_ext_*.c). */
void cpu_kernels_init_ext_ref(cpu_kernels *k);
void cpu_kernels_init_ext_avx2(cpu_kernels *k);
/* The AVX2 light-op row kernels (cpu_ops_avx2.c). */
void cpu_kernels_init_light_avx2(cpu_kernels *k);
void cpu_kernels_init_ext_avx512(cpu_kernels *k);

/* ---- the backend object ------------------------------------------------------------------ */

/* One thread's share of a matmul's tiles (cpu_matmul.c): positions [front, back) of its list, in
 * one word (front | back << 32) so that its owner (from the front) and a thread that has finished
 * its own (from the back) never take the same tile. A cache line each. */
typedef struct cpu_share {
    _Alignas(64) atomic_uint_fast64_t fb;
} cpu_share;

typedef struct cpu_backend {
    backend base;
    backend_cpu_params params;
    int n_threads;
    int n_threads_batch;
    uint32_t features;
    cpu_kernels kernels;
    cpu_pool *pool;
    cpu_share *shares;       /* [pool size] (cpu_matmul.c) */
    pthread_mutex_t exec_mu; /* one op at a time: the pool and the scratch are shared */
    void *scratch;           /* matmul activations etc.; grows to the largest op, then stays */
    size_t scratch_size;
    /* The activations a matmul prepared in the scratch stay valid for the next op if it is a
     * matmul of the same x with the same preparation (q, k, v of one layer; gate, up) and the
     * first one's output does not overlap x: that one skips the preparation (cpu_matmul.c). */
    uint64_t op_seq;         /* ops run so far (cpu_exec_op) */
    uint64_t act_seq;        /* op_seq of the matmul whose activations the scratch holds; 0: none */
    const char *act_x;       /* its x: first byte, row stride, n_in, rows; its preparation */
    size_t act_nb1;
    int64_t act_n_in, act_n_rows;
    cpu_act_row_fn act_prep;
    const char *act_dst_lo, *act_dst_hi; /* the bytes its output spans */
    /* rope (cpu_rope.c): cos / sin of positions [0, rope_n) for (rope_base, rope_rot) */
    float *rope_cs;          /* [rope_n][rope_rot]: cos, sin of pair i at 2i, 2i + 1 */
    int64_t rope_n, rope_cap;/* rows filled; floats allocated */
    float rope_base;
    int32_t rope_rot;
} cpu_backend;

/* Runs one validated op now, on the calling thread plus the pool (takes exec_mu). */
void cpu_exec_op(cpu_backend *be, const backend_op *op);
/* Scratch of at least size bytes (exec_mu held); aborts if out of memory. */
void *cpu_scratch(cpu_backend *be, size_t size);

/* rope through the backend's position table (cpu_rope.c): exec_mu held; false (nothing done) when
 * the table does not apply (a position out of its range, no memory): then the reference runs. */
bool cpu_op_rope(cpu_backend *be, const backend_op *op);
/* matmul (cpu_matmul.c): exec_mu held. */
void cpu_op_matmul(cpu_backend *be, const backend_op *op);
/* matmul + scale + argmax without the logits (cpu_matmul.c): exec_mu held. */
void cpu_op_matmul_argmax(cpu_backend *be, const backend_op *op);

#endif
