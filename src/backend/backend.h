/* backend.h: the backend interface the model forward is written against: tensor views, buffers,
 * queues (ordered op streams, like GPU streams), events, capabilities and the ops.
 *
 * Every op is enqueued on a queue as a small record (backend_op: kind + tensor views by value +
 * params) through backend_queue_submit(); the typed wrappers op_matmul(), op_rmsnorm(), ... fill
 * the record. A synchronous queue runs the op before submit returns; an asynchronous queue runs
 * records in order on a worker thread. Callers never depend on which: host memory touched by an
 * op (a host-pointer tensor, an op_write/op_read buffer) must stay valid and untouched until the
 * queue is synchronized (or an event recorded after the op has completed).
 *
 * Shapes use ggml order: ne[0] is the innermost (contiguous) dimension; nb[i] are byte strides
 * (nb[0] = bytes of one element, or of one block for block-quantized types; nb[1] = row bytes).
 * All activations are f32 unless an op says otherwise. Op shape/type errors are programming errors
 * of the caller: backend_queue_submit() aborts with a message naming the op and the shapes; use
 * backend_op_validate() to check a record without aborting. */
#ifndef DFL_BACKEND_H
#define DFL_BACKEND_H

#include "dflash.h"
#include "quant/quant.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct backend backend;
typedef struct backend_buffer backend_buffer;
typedef struct backend_queue backend_queue;
typedef struct backend_event backend_event;

/* ---- tensor views ----------------------------------------------------------------------- */

#define TENSOR_MAX_DIMS 4

/* A view of memory: no ownership. data is an address in the memory of buf's backend (for the
 * CPU backend, plain host memory); buf is NULL for host memory not owned by a backend buffer
 * (e.g. weights in the GGUF mmap, which the CPU backend reads zero-copy). */
typedef struct tensor {
    uint32_t type;                /* quant_type: QUANT_TYPE_F32, F16, BF16, Q8_0, ..., I32, I64 */
    int64_t ne[TENSOR_MAX_DIMS];  /* elements per dimension, unused dims = 1 */
    size_t nb[TENSOR_MAX_DIMS];   /* byte strides */
    void *data;                   /* first element */
    backend_buffer *buf;          /* owning buffer or NULL */
    uint32_t layout;              /* tensor_layout: TENSOR_LAYOUT_PLAIN, or a packed weight */
} tensor;

/* How the bytes of a tensor are arranged. PLAIN is the GGUF / ggml layout every op reads. A
 * packed layout is a weight rearranged once, at load, for one backend's matmul kernels
 * (backend_weight_pack); only op_matmul / op_matmul_argmax accept it, as their weight.
 * TENSOR_LAYOUT_Q8_0_X16 (CPU): a Q8_0 weight with n_in a multiple of 512; row o (nb[1] bytes
 * apart, a multiple of 64) holds its n_in / 512 groups of 16 blocks, each as 512 bytes where byte
 * k*64 + j*4 + e is value 4k + e of block j plus 128 (as an unsigned byte; k 0..7, j 0..15,
 * e 0..3), followed by the n_in / 32 block scales (f16, block order). The same bytes as the row's
 * Q8_0 blocks, transposed like the prepared Q8_0 activations (docs/quantization.md).
 * TENSOR_LAYOUT_Q4_0_X16 (CPU, AVX2 and AVX-512): a Q4_0 weight with n_in a multiple of 512; row o (nb[1]
 * bytes apart, a multiple of 64) holds its n_in / 512 groups of 16 blocks, each as 256 bytes where
 * byte k*64 + j*4 + e is byte 4k + e of block j's quants as stored (low nibble: value 4k + e, high
 * nibble: value 16 + 4k + e; k 0..3), followed by the n_in / 32 block scales (f16, block order).
 * TENSOR_LAYOUT_KQ_X16 (CPU): a Q4_K or Q6_K weight in groups of 16 rows (rows 16G .. 16G + 15
 * from byte 16 G nb[1]; the last group padded with copies of the last row), each group as one
 * record per super-block in which 32-bit lane i is row i's: its scales unpacked to one byte each
 * and its quants dword by dword (docs/quantization.md: the byte offsets). nb[1] = the record
 * bytes x super-blocks / 16; row addresses exist for multiples of 16 only, so a matmul over a
 * packed weight takes output ranges that start at a group (AVX2 and AVX-512 kernels).
 * TENSOR_LAYOUT_Q6K_X16V (CPU): a Q6_K weight as KQ_X16 (the same groups, record bytes, d and
 * scales), but the quants as ready 6-bit values: per sub-block of 16 values three dwords per lane,
 * values 0..11 in bits 0..5 of their bytes and the 2-bit pieces of values 12..15 in bits 6..7
 * (docs/quantization.md). The AVX2 kernels read it; AVX-512 reads KQ_X16.
 * TENSOR_LAYOUT_P16_X16 (CPU, AMX-BF16): an F16 or BF16 weight in groups of 16 rows (the last
 * padded with zero rows), each row's n_in padded with zeros to a multiple of 32 (n_pad); nb[1] =
 * 2 n_pad, group G from byte 16 G nb[1], as n_pad / 32 blocks of 1024 bytes (inputs 32 t .. 32 t
 * + 31), 16 lines of 64 bytes each: line p holds inputs 32 t + 2 p and 32 t + 2 p + 1 of the 16
 * rows; BF16 as the pair (2 p, 2 p + 1) of row c at byte 4 c (a tile's operand order), F16 as
 * input 2 p of rows 0..15 in bytes 0..31 and input 2 p + 1 in bytes 32..63 (docs/quantization.md,
 * "F16 and BF16 on AMX tiles"). Output ranges start at a group. */
typedef enum tensor_layout {
    TENSOR_LAYOUT_PLAIN = 0,
    TENSOR_LAYOUT_Q8_0_X16 = 1,
    TENSOR_LAYOUT_KQ_X16 = 2,
    TENSOR_LAYOUT_Q6K_X16V = 3,
    TENSOR_LAYOUT_P16_X16 = 4,
    TENSOR_LAYOUT_Q4_0_X16 = 5,
} tensor_layout;

/* Inputs per row of a P16_X16 weight: n_in rounded up to a multiple of 32. */
int64_t tensor_p16_x16_n_pad(int64_t n_in);

/* Bytes of one KQ_X16 (or Q6K_X16V) record (16 rows, one super-block): Q4_K 2368, Q6_K 3392; 0 for
 * other types. */
size_t tensor_kq_x16_record_bytes(uint32_t type);

/* A contiguous n-d view (ne1..ne3 = 1 when absent). ne0 must be a multiple of the block size. */
tensor tensor_1d(uint32_t type, void *data, int64_t ne0);
tensor tensor_2d(uint32_t type, void *data, int64_t ne0, int64_t ne1);
tensor tensor_3d(uint32_t type, void *data, int64_t ne0, int64_t ne1, int64_t ne2);
tensor tensor_4d(uint32_t type, void *data, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
/* A contiguous view at byte offset `offset` of a buffer (data = buffer base + offset). */
tensor tensor_in_buffer(backend_buffer *buf, size_t offset, uint32_t type, int64_t ne0, int64_t ne1);
/* Row i1 (of dim 1, dims 2-3 at 0) as a 1-d view [ne0]. */
tensor tensor_row(const tensor *t, int64_t i1);
/* Rows [i1, i1 + n) of a 2-d tensor as a view [ne0, n] with the same strides. */
tensor tensor_rows(const tensor *t, int64_t i1, int64_t n);
/* A strided view: shape ne (4 dims), strides nb (4 dims), starting `offset` bytes into t. */
tensor tensor_view(const tensor *t, const int64_t ne[TENSOR_MAX_DIMS],
                   const size_t nb[TENSOR_MAX_DIMS], size_t offset);
/* The same memory reshaped (t must be contiguous; element counts must agree). */
tensor tensor_reshape_2d(const tensor *t, int64_t ne0, int64_t ne1);
tensor tensor_reshape_3d(const tensor *t, int64_t ne0, int64_t ne1, int64_t ne2);
int64_t tensor_nelements(const tensor *t);
int64_t tensor_nrows(const tensor *t);       /* ne1 * ne2 * ne3 */
size_t tensor_nbytes(const tensor *t);       /* bytes spanned by the view */
bool tensor_is_contiguous(const tensor *t);
bool tensor_same_shape(const tensor *a, const tensor *b);

/* ---- backends --------------------------------------------------------------------------- */

/* CPU feature bits (for forcing a code path in tests and benchmarks). */
typedef enum backend_cpu_feature {
    BACKEND_CPU_FEATURE_AVX2 = 1u << 0,        /* avx2 + fma + f16c */
    BACKEND_CPU_FEATURE_AVX512 = 1u << 1,      /* avx512 f + bw + vl */
    BACKEND_CPU_FEATURE_AVX512_VNNI = 1u << 2, /* avx512 vnni (vpdpbusd) */
    BACKEND_CPU_FEATURE_AVX512_BF16 = 1u << 3, /* avx512 bf16 (vdpbf16ps) */
    BACKEND_CPU_FEATURE_AMX_INT8 = 1u << 4,    /* amx tile + int8, with the OS's permission (Linux) */
    BACKEND_CPU_FEATURE_AMX_BF16 = 1u << 5,    /* amx tile + bf16, with the OS's permission (Linux) */
} backend_cpu_feature;

typedef struct backend_cpu_params {
    int n_threads;          /* threads for ops on one activation row (decode); <= 0: auto */
    int n_threads_batch;    /* threads for ops on more rows (prompt, verify); <= 0: auto */
    uint32_t disable_features; /* backend_cpu_feature bits NOT to use even if the CPU has them */
    bool async;             /* queues execute ops on a worker thread (default: synchronous) */
#ifdef DFL_TEST_HOOKS
    uint32_t debug_max_delay_us; /* async workers sleep a random 0..max us before each record */
    uint64_t debug_seed;
#endif
} backend_cpu_params;

backend_cpu_params backend_cpu_default_params(void);
#ifdef DFL_TEST_HOOKS
/* Test hook: the random delay bound of one async CPU queue's worker (overrides the backend's). */
void backend_cpu_queue_set_test_delay(backend_queue *q, uint32_t max_us);
#endif

/* Creates the CPU backend with its thread pool (created once, reused by every op). */
backend *backend_cpu_new(const backend_cpu_params *params, dfl_error *err);
void backend_free(backend *be);

typedef struct backend_caps {
    const char *name;      /* "cpu", "cuda" */
    bool async;            /* ops may still run after submit returns */
    bool has_events;       /* events work (record / device-side wait / host wait) */
    bool host_visible;     /* buffer memory is host memory (tensor data readable by the CPU) */
    uint32_t cpu_features; /* CPU backend: backend_cpu_feature bits in use */
    int n_threads;         /* CPU backend: decode / batch thread counts */
    int n_threads_batch;
    bool matmul_argmax;    /* op_matmul_argmax is implemented (else: op_matmul, op_scale, op_argmax) */
} backend_caps;

backend_caps backend_get_caps(const backend *be);

/* Packed weights. backend_weight_pack_size: the bytes a copy of matmul weight w [n_in, n_out]
 * (PLAIN, contiguous rows, host-readable) takes in the layout be's matmul kernels read fastest,
 * or 0 when be reads w as it is (then use w). backend_weight_pack writes that copy into dst (host
 * memory of be, 64-byte aligned, pack_size bytes), on be's threads, and returns the view of it to pass to
 * op_matmul instead of w; the results are the same bits as with w. */
size_t backend_weight_pack_size(const backend *be, const tensor *w);
tensor backend_weight_pack(backend *be, const tensor *w, void *dst);

/* ---- buffers ---------------------------------------------------------------------------- */

/* Allocates size bytes of backend memory (64-byte aligned, zeroed). NULL + err on failure. */
backend_buffer *backend_buffer_alloc(backend *be, size_t size, dfl_error *err);
void backend_buffer_free(backend_buffer *buf);
void *backend_buffer_base(const backend_buffer *buf); /* address of byte 0 (backend memory) */
size_t backend_buffer_size(const backend_buffer *buf);
/* Blocking copies host <-> buffer (the range must lie inside the buffer). They do not order with
 * queued ops: synchronize the queues that use the range first, or use op_write / op_read. */
void backend_buffer_set(backend_buffer *buf, size_t offset, const void *src, size_t size);
void backend_buffer_get(const backend_buffer *buf, size_t offset, void *dst, size_t size);

/* ---- queues and events ------------------------------------------------------------------ */

backend_queue *backend_queue_new(backend *be, dfl_error *err);
void backend_queue_free(backend_queue *q); /* synchronizes first */
/* Host waits until every op enqueued so far has completed. */
void backend_queue_synchronize(backend_queue *q);

backend_event *backend_event_new(backend *be, dfl_error *err);
void backend_event_free(backend_event *ev);
/* The event completes when every op enqueued on q before this call has completed. */
void backend_event_record(backend_event *ev, backend_queue *q);
/* Device-side wait: ops enqueued on q after this call run only after ev completed; the host does
 * not wait. A never-recorded event is complete. */
void backend_queue_wait_event(backend_queue *q, backend_event *ev);
/* Host waits until ev completed (returns at once if never recorded). */
void backend_event_synchronize(backend_event *ev);

/* ---- ops -------------------------------------------------------------------------------- */

typedef enum backend_op_kind {
    BACKEND_OP_NONE = 0,
    BACKEND_OP_MATMUL,     /* dst = x W^T */
    BACKEND_OP_RMSNORM,    /* dst = x / sqrt(mean(x^2) + eps) * w */
    BACKEND_OP_ROPE_NEOX,  /* dst = rope(x, pos) */
    BACKEND_OP_ATTENTION,  /* dst = softmax(q k^T * scale + mask) v (mask: a tensor or causal / full) */
    BACKEND_OP_SET_ROWS,   /* dst[idx[r]] = src[r] */
    BACKEND_OP_GET_ROWS,   /* dst[r] = dequant(src[idx[r]]) */
    BACKEND_OP_ADD,        /* dst = a + b */
    BACKEND_OP_MUL,        /* dst = a * b */
    BACKEND_OP_SWIGLU,     /* dst = silu(gate) * up */
    BACKEND_OP_SCALE,      /* dst = a * s */
    BACKEND_OP_COPY,       /* dst = convert(src) (f32 <-> f16 / bf16, any strides) */
    BACKEND_OP_SOFTMAX,    /* dst = softmax(a) per row */
    BACKEND_OP_ARGMAX,     /* dst[r] = first index of max(a[r]) as int32; a row holding a NaN or
                            * an Inf gives -1 - (index of its first such value) instead */
    BACKEND_OP_MATMUL_ARGMAX, /* dst[r] = argmax(scale * (x W^T)[r]): matmul, scale, argmax fused
                               * (src[2]: the logits too, where its data is not NULL) */
    BACKEND_OP_WRITE,      /* dst = host bytes (host -> backend memory, ordered on the queue) */
    BACKEND_OP_READ,       /* host bytes = src (backend memory -> host, ordered on the queue) */
    BACKEND_OP_COUNT,
} backend_op_kind;

/* One op record. src[] meaning per kind is documented at each op_* wrapper below. */
typedef struct backend_op {
    backend_op_kind kind;
    tensor dst;
    tensor src[4];
    float f[2];    /* eps (rmsnorm), freq_base (rope), scale (scale, attention) */
    int32_t i[2];  /* n_rot (rope); the mask kind (attention, backend_attn_mask) */
    void *host;    /* host memory of op_write / op_read */
    size_t size;   /* bytes of op_write / op_read */
} backend_op;

/* Checks an op record (kinds, types, shapes, strides). DFL_OK or DFL_ERR_INVALID + message. */
dfl_status backend_op_validate(const backend *be, const backend_op *op, dfl_error *err);
/* Enqueues an op (validated first; aborts with the validation message if invalid). */
void backend_queue_submit(backend_queue *q, const backend_op *op);
const char *backend_op_name(backend_op_kind kind);
/* Weight types op_matmul and op_get_rows accept: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K. */
bool backend_matmul_type_supported(uint32_t type);

/* matmul: dst [n_out, n_rows] f32 = for each row r and output o: sum_i w[o][i] * x[r][i].
 * w [n_in, n_out] F32, F16, BF16, Q8_0, Q4_0, Q4_K or Q6_K (rows contiguous, e.g. in the mmap);
 * x [n_in, n_rows] f32 (rows may be strided; ne[0] contiguous). Like llama.cpp the optimized
 * path quantizes x once per op to the weight's dot type (Q8_0 for Q8_0/Q4_0, Q8_K for
 * Q4_K/Q6_K, f16 for F16, bf16 for BF16) and uses integer / low-precision dot products. The CPU
 * backend skips that step for a matmul right after a matmul of the same x (q, k, v; gate, up),
 * which relies on backend memory being written by ops only. */
void op_matmul(backend_queue *q, tensor dst, tensor w, tensor x);

/* rmsnorm over ne[0]: dst [n, rows] = x / sqrt(mean(x^2) + eps) * w; w [n] f32 or NULL (= 1).
 * Per-head norm: view x as [head_dim, n_head * n_tok] and pass w [head_dim]. dst may be x. */
void op_rmsnorm(backend_queue *q, tensor dst, tensor x, const tensor *w, float eps);

/* NEOX rope: x [head_dim, n_head, n_tok] f32 (dst same shape, may be x). pos [n_tok] int32; its
 * nb[0] may be a stride (e.g. section 0 of 4-section positions). Rotates pairs (i, i + n_rot/2)
 * for i < n_rot/2 with theta = pos * freq_base^(-2i/n_rot); dims >= n_rot are copied.
 * n_rot = 0 means head_dim. */
void op_rope_neox(backend_queue *q, tensor dst, tensor x, tensor pos, float freq_base, int32_t n_rot);
/* The same with NORM pairing (i[1] = 1 in the record): adjacent pairs (2i, 2i+1), as llama.cpp
 * uses for arch llama (GGUF llama weights are permuted for it). */
void op_rope_norm(backend_queue *q, tensor dst, tensor x, tensor pos, float freq_base, int32_t n_rot);

/* attention: dst [head_dim_v, n_head, n_q] f32; q [head_dim, n_head, n_q] f32;
 * k [head_dim, n_head_kv, n_kv] and v [head_dim_v, n_head_kv, n_kv] F16 or F32 (the KV cache);
 * mask [n_kv, n_q] f32 additive (0, a bias or -INFINITY; any pattern); cells whose mask is
 * -INFINITY are skipped. GQA: head h uses kv head h / (n_head / n_head_kv). scale 0 means
 * 1/sqrt(head_dim). Softmax in f32 with max-subtraction. A query row with every cell masked gets
 * zeros. The record's i[0] is BACKEND_ATTN_MASK (src[3] the mask). */
void op_attention(backend_queue *q, tensor dst, tensor qry, tensor k, tensor v, tensor mask, float scale);

/* Which cells a query row of an attention op sees (the record's i[0]). The structured kinds need
 * no mask tensor (src[3] has no data): the kernels compute the visible cells from the row index,
 * so a micro-batch builds and uploads no [n_kv, n_q] mask. One op covers one sequence's cells. */
typedef enum backend_attn_mask {
    BACKEND_ATTN_MASK = 0,   /* the additive mask src[3] */
    BACKEND_ATTN_CAUSAL = 1, /* the queries are the last n_q cells, in order: row iq sees cells
                              * [0, n_kv - n_q + iq] (needs n_q <= n_kv) */
    BACKEND_ATTN_FULL = 2,   /* every row sees every cell (a non-causal drafter block) */
} backend_attn_mask;

/* The number of leading cells query row iq sees under a structured kind (BACKEND_ATTN_CAUSAL or
 * BACKEND_ATTN_FULL); the others are masked: the mask tensor of the same kind is 0 on [0, n) and
 * -INFINITY after. */
static inline int64_t backend_attn_n_visible(int32_t kind, int64_t iq, int64_t n_q, int64_t n_kv) {
    return kind == BACKEND_ATTN_CAUSAL ? n_kv - n_q + iq + 1 : n_kv;
}

/* attention as op_attention with a structured mask kind (BACKEND_ATTN_CAUSAL or
 * BACKEND_ATTN_FULL) instead of a mask tensor: the same values, bit for bit, as op_attention
 * with the mask that kind describes. */
void op_attention_structured(backend_queue *q, tensor dst, tensor qry, tensor k, tensor v, backend_attn_mask kind,
                             float scale);

/* set_rows: dst [n, n_dst_rows] (F32, F16 or BF16) row idx[r] = src row r, src [n, n_rows] f32;
 * idx [n_rows] I32 or I64. Indices out of range abort (invariant). */
void op_set_rows(backend_queue *q, tensor dst, tensor src, tensor idx);

/* get_rows: dst [n, n_idx] f32 row r = dequantize(src row idx[r]); src [n, n_src_rows] any
 * storage type matmul accepts; idx [n_idx] I32. */
void op_get_rows(backend_queue *q, tensor dst, tensor src, tensor idx);

/* Elementwise, f32: dst may alias a. b broadcasts: each b->ne[d] equals a->ne[d] or is 1. */
void op_add(backend_queue *q, tensor dst, tensor a, tensor b);
void op_mul(backend_queue *q, tensor dst, tensor a, tensor b);
/* dst = silu(gate) * up, all the same shape. */
void op_swiglu(backend_queue *q, tensor dst, tensor gate, tensor up);
/* dst = a * s */
void op_scale(backend_queue *q, tensor dst, tensor a, float s);
/* dst = src converted to dst's type (F32, F16, BF16 each way); same shape, any strides.
 * This is also the f32 -> f16 "cpy" (e.g. into a KV cache view). */
void op_copy(backend_queue *q, tensor dst, tensor src);
/* Row softmax over ne[0] (f32, max-subtracted); dst may be a. */
void op_softmax(backend_queue *q, tensor dst, tensor a);
/* dst [n_rows] I32 = index of the max of each row of a [n, n_rows] f32 (first max on ties). */
void op_argmax(backend_queue *q, tensor dst, tensor a);

/* matmul_argmax: dst [n_rows] i32 = argmax over o of scale * (sum_i w[o][i] x[r][i]), the same
 * value as op_matmul into [n_out, n_rows] f32, op_scale by scale (1: none) and op_argmax (first
 * index of the max; -1 - index of the first NaN/Inf), without writing the logits: a greedy head
 * over a large vocabulary (the drafter's) keeps each chunk of logits in cache. w and x as in
 * op_matmul. Only where backend_get_caps says matmul_argmax (the CPU backend). */
void op_matmul_argmax(backend_queue *q, tensor dst, tensor w, tensor x, float scale);
/* op_matmul_argmax that also writes the scaled logits to logits [n_out, n_rows] f32 (op_matmul's
 * dst, rows contiguous): each chunk is stored while it is in cache, and dst's ids (with their
 * NaN/Inf flags) come with them, so no second pass over the logits finds the max or checks them.
 * The op record carries logits as src[2] (data NULL: none, op_matmul_argmax). */
void op_matmul_argmax_logits(backend_queue *q, tensor dst, tensor w, tensor x, float scale, tensor logits);

/* Ordered host transfers: copy `size` bytes host -> dst.data (op_write) or src.data -> host
 * (op_read) when the queue reaches the op. dst/src: a contiguous tensor in backend memory. */
void op_write(backend_queue *q, tensor dst, const void *host, size_t size);
void op_read(backend_queue *q, void *host, tensor src, size_t size);

#endif
