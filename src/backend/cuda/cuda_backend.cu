/* cuda_backend.cu: the CUDA backend object: creation (device checks), device-memory buffers,
 * queues (one non-blocking stream + one cuBLAS handle + a pinned staging ring + a grow-once
 * scratch each), events, op checks and dispatch to the kernels of cuda_ops.cu, cuda_matmul.cu
 * and cuda_attention.cu.
 *
 * Ordering: every op, op_write and op_read is enqueued on the queue's stream. op_write copies the
 * host bytes into the pinned ring at submit (the caller keeps them unchanged until the queue is
 * synchronized anyway) and enqueues an async copy, so it never blocks the host; when the ring
 * wraps, the stream is synchronized first (rare: the ring holds many steps of inputs). op_read
 * is a cudaMemcpyAsync into pageable host memory, which returns when the copy is done.
 * Events: record = cudaEventRecord, device wait = cudaStreamWaitEvent, host wait =
 * cudaEventSynchronize; a never-recorded event is complete. Every host synchronization also
 * checks the device error word (an index out of range in set_rows / get_rows aborts there). */
#include "backend/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#define CUDA_STAGE_BYTES ((size_t)8 << 20) /* pinned ring per queue for op_write */

[[noreturn]] void cuda_fatal(const char *file, int line, const char *what, const char *msg) {
    char buf[512];
    snprintf(buf, sizeof(buf), "cuda backend: %s failed: %s", what, msg);
    error_abort(file, line, buf);
}

void cuda_set_device(const cuda_backend *be) { CUDA_CHECK(cudaSetDevice(be->device)); }

static void check_device_errors(cuda_backend *be) {
    const unsigned int e = *(volatile unsigned int *)be->err_host;
    if (e == 0) return;
    if (e & CUDA_ERRF_SET_ROWS_INDEX) error_abort(__FILE__, __LINE__, "op set_rows: row index out of range (cuda)");
    error_abort(__FILE__, __LINE__, "op get_rows: row index out of range (cuda)");
}

/* ---- buffers ------------------------------------------------------------------------------ */

static backend_buffer *cuda_buffer_alloc(backend *bbe, size_t size, dfl_error *err) {
    cuda_backend *be = (cuda_backend *)bbe;
    cuda_set_device(be);
    backend_buffer *buf = (backend_buffer *)calloc(1, sizeof(*buf));
    if (buf == NULL) {
        error_set(err, DFL_ERR_NOMEM, "cuda backend: out of host memory for a buffer object");
        return NULL;
    }
    const size_t rounded = (size + 255) & ~(size_t)255;
    void *mem = NULL;
    cudaError_t e = rounded >= size ? cudaMalloc(&mem, rounded) : cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state of a failed allocation */
        free(buf);
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError(); /* best effort, for the message */
        error_set(err, DFL_ERR_NOMEM, "cuda backend: cannot allocate %.1f MiB of device memory (%.1f MiB free of %.1f): %s",
                  (double)size / 1048576.0, (double)free_b / 1048576.0, (double)total_b / 1048576.0,
                  cudaGetErrorString(e));
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(mem, 0, rounded, be->xfer));
    CUDA_CHECK(cudaStreamSynchronize(be->xfer));
    buf->be = bbe;
    buf->base = mem;
    buf->size = size;
    return buf;
}

static void cuda_buffer_free(backend_buffer *buf) {
    cuda_set_device((cuda_backend *)buf->be);
    CUDA_CHECK(cudaFree(buf->base)); /* waits for the device: no queued op still reads it */
    free(buf);
}

static void cuda_buffer_set(backend_buffer *buf, size_t offset, const void *src, size_t size) {
    cuda_backend *be = (cuda_backend *)buf->be;
    cuda_set_device(be);
    if (size == 0) return;
    CUDA_CHECK(cudaMemcpyAsync((char *)buf->base + offset, src, size, cudaMemcpyHostToDevice, be->xfer));
    CUDA_CHECK(cudaStreamSynchronize(be->xfer));
    cuda_host_gen_bump(be); /* the host changed device memory: no quantized activation survives */
}

static void cuda_buffer_get(const backend_buffer *buf, size_t offset, void *dst, size_t size) {
    cuda_backend *be = (cuda_backend *)buf->be;
    cuda_set_device(be);
    if (size == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, (const char *)buf->base + offset, size, cudaMemcpyDeviceToHost, be->xfer));
    CUDA_CHECK(cudaStreamSynchronize(be->xfer));
}

/* ---- queues ------------------------------------------------------------------------------- */

void *cuda_queue_scratch(cuda_queue *q, size_t bytes) {
    if (bytes <= q->scratch_size) return q->scratch;
    size_t n = bytes + bytes / 4;
    n = (n + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (q->scratch != NULL) CUDA_CHECK(cudaFree(q->scratch)); /* waits for the ops that use it */
    q->scratch = NULL;
    q->scratch_size = 0;
    cudaError_t e = cudaMalloc(&q->scratch, n);
    if (e != cudaSuccess) {
        char what[128];
        snprintf(what, sizeof(what), "cudaMalloc of %.1f MiB of op scratch", (double)n / 1048576.0);
        cuda_fatal(__FILE__, __LINE__, what, cudaGetErrorString(e));
    }
    q->scratch_size = n;
    return q->scratch;
}

static void cuda_queue_synchronize(backend_queue *bq) {
    cuda_queue *q = (cuda_queue *)bq;
    cuda_backend *be = (cuda_backend *)bq->be;
    q->xq_valid = false; /* the host may change x (backend_buffer_set) after this */
    cuda_set_device(be);
    CUDA_CHECK(cudaStreamSynchronize(q->stream));
    cuda_host_gen_bump(be);
    check_device_errors(be);
}

static void cuda_queue_free(backend_queue *bq) {
    cuda_queue *q = (cuda_queue *)bq;
    cuda_set_device((cuda_backend *)bq->be);
    if (q->stream != NULL) CUDA_CHECK(cudaStreamSynchronize(q->stream));
    if (q->blas != NULL) {
        const cuda_blas_api *api = &((cuda_backend *)bq->be)->blas;
        CUBLAS_CHECK(api, api->destroy(q->blas));
    }
    if (q->scratch != NULL) CUDA_CHECK(cudaFree(q->scratch));
    if (q->stage != NULL) CUDA_CHECK(cudaFreeHost(q->stage));
    if (q->stream != NULL) CUDA_CHECK(cudaStreamDestroy(q->stream));
    free(q);
}

static backend_queue *cuda_queue_new(backend *bbe, dfl_error *err) {
    cuda_backend *be = (cuda_backend *)bbe;
    cuda_set_device(be);
    cuda_queue *q = (cuda_queue *)calloc(1, sizeof(*q));
    if (q == NULL) {
        error_set(err, DFL_ERR_NOMEM, "cuda backend: out of host memory for a queue");
        return NULL;
    }
    q->base.be = bbe;
    cudaError_t e = cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&q->stage, CUDA_STAGE_BYTES, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        error_set(err, DFL_ERR_NOMEM, "cuda backend: cannot create a queue: %s", cudaGetErrorString(e));
        cudaGetLastError();
        cuda_queue_free(&q->base);
        return NULL;
    }
    q->stage_cap = CUDA_STAGE_BYTES;
    cublasStatus_t bs = be->blas.create(&q->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        q->blas = NULL;
        error_set(err, DFL_ERR_INTERNAL, "cuda backend: cublasCreate failed: %s", be->blas.status_string(bs));
        cuda_queue_free(&q->base);
        return NULL;
    }
    CUBLAS_CHECK(&be->blas, be->blas.set_stream(q->blas, q->stream));
    /* no TF32 unless a call asks for it */
    CUBLAS_CHECK(&be->blas, be->blas.set_math_mode(q->blas, CUBLAS_DEFAULT_MATH));
    return &q->base;
}

static void cuda_op_write(cuda_backend *be, cuda_queue *q, const backend_op *op) {
    const size_t size = op->size;
    if (size == 0) return;
    if (size > q->stage_cap / 2) {
        /* large: straight from pageable memory (the driver may synchronize; still ordered) */
        CUDA_CHECK(cudaMemcpyAsync(op->dst.data, op->host, size, cudaMemcpyHostToDevice, q->stream));
        return;
    }
    if (q->stage_head + size > q->stage_cap) {
        CUDA_CHECK(cudaStreamSynchronize(q->stream)); /* every earlier staged copy is done */
        cuda_host_gen_bump(be);
        q->stage_head = 0;
    }
    char *slot = q->stage + q->stage_head;
    memcpy(slot, op->host, size);
    CUDA_CHECK(cudaMemcpyAsync(op->dst.data, slot, size, cudaMemcpyHostToDevice, q->stream));
    q->stage_head += (size + 255) & ~(size_t)255;
}

static void cuda_queue_submit(backend_queue *bq, const backend_op *op) {
    cuda_queue *q = (cuda_queue *)bq;
    cuda_backend *be = (cuda_backend *)bq->be;
    cuda_set_device(be);
    if (op->kind != BACKEND_OP_MATMUL) q->xq_valid = false;
    switch (op->kind) {
    case BACKEND_OP_MATMUL: cuda_op_matmul(be, q, op); break;
    case BACKEND_OP_ATTENTION: cuda_op_attention(be, q, op); break;
    case BACKEND_OP_WRITE: cuda_op_write(be, q, op); break;
    case BACKEND_OP_READ:
        if (op->size > 0) {
            CUDA_CHECK(cudaMemcpyAsync(op->host, op->src[0].data, op->size, cudaMemcpyDeviceToHost, q->stream));
        }
        break;
    default: cuda_op_light(be, q, op); break;
    }
}

/* ---- events ------------------------------------------------------------------------------- */

static backend_event *cuda_event_new(backend *bbe, dfl_error *err) {
    cuda_backend *be = (cuda_backend *)bbe;
    cuda_set_device(be);
    cuda_event *ev = new (std::nothrow) cuda_event;
    if (ev == NULL) {
        error_set(err, DFL_ERR_NOMEM, "cuda backend: out of host memory for an event");
        return NULL;
    }
    ev->base.be = bbe;
    ev->recorded.store(false);
    cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        delete ev;
        error_set(err, DFL_ERR_INTERNAL, "cuda backend: cannot create an event: %s", cudaGetErrorString(e));
        return NULL;
    }
    return &ev->base;
}

static void cuda_event_free(backend_event *bev) {
    cuda_event *ev = (cuda_event *)bev;
    cuda_set_device((cuda_backend *)bev->be);
    CUDA_CHECK(cudaEventDestroy(ev->ev));
    delete ev;
}

static void cuda_event_record(backend_event *bev, backend_queue *bq) {
    cuda_event *ev = (cuda_event *)bev;
    cuda_set_device((cuda_backend *)bq->be);
    CUDA_CHECK(cudaEventRecord(ev->ev, ((cuda_queue *)bq)->stream));
    ev->recorded.store(true);
}

static void cuda_queue_wait_event(backend_queue *bq, backend_event *bev) {
    cuda_event *ev = (cuda_event *)bev;
    if (!ev->recorded.load()) return; /* never recorded: complete */
    ((cuda_queue *)bq)->xq_valid = false; /* another queue may have written x */
    cuda_set_device((cuda_backend *)bq->be);
    CUDA_CHECK(cudaStreamWaitEvent(((cuda_queue *)bq)->stream, ev->ev, 0));
}

static void cuda_event_synchronize(backend_event *bev) {
    cuda_event *ev = (cuda_event *)bev;
    if (!ev->recorded.load()) return;
    cuda_backend *be = (cuda_backend *)bev->be;
    cuda_set_device(be);
    CUDA_CHECK(cudaEventSynchronize(ev->ev));
    /* the host may now change what another queue's ops wrote or read (an x a queue quantized
     * before the wait): every queue's quantized activations become stale */
    cuda_host_gen_bump(be);
    check_device_errors(be);
}

/* ---- the backend -------------------------------------------------------------------------- */

static backend_caps cuda_caps(const backend *bbe) {
    (void)bbe;
    backend_caps c;
    memset(&c, 0, sizeof(c));
    c.name = "cuda";
    c.async = true;
    c.has_events = true;
    c.host_visible = false;
    return c;
}

/* Every tensor an op touches must lie inside a buffer of this backend. */
static dfl_status check_in_buffer(const backend *be, const backend_op *op, const char *name, const tensor *t,
                                  dfl_error *err) {
    if (t->data == NULL) return DFL_OK;
    if (t->buf == NULL || t->buf->be != be) {
        return error_set(err, DFL_ERR_INVALID,
                         "op %s: %s is not in a cuda buffer (host memory or another backend's buffer; upload "
                         "weights and use backend_buffer_alloc)", backend_op_name(op->kind), name);
    }
    const char *base = (const char *)t->buf->base, *p = (const char *)t->data;
    const size_t n = tensor_nbytes(t);
    if (p < base || (size_t)(p - base) > t->buf->size || n > t->buf->size - (size_t)(p - base)) {
        return error_set(err, DFL_ERR_INVALID, "op %s: %s spans outside its cuda buffer", backend_op_name(op->kind), name);
    }
    return DFL_OK;
}

static dfl_status cuda_op_supported(const backend *be, const backend_op *op, dfl_error *err) {
    static const char *const names[4] = {"src[0]", "src[1]", "src[2]", "src[3]"};
    dfl_status st = DFL_OK;
    if (op->kind != BACKEND_OP_READ) st = check_in_buffer(be, op, "dst", &op->dst, err);
    for (int i = 0; i < 4 && st == DFL_OK; i++) st = check_in_buffer(be, op, names[i], &op->src[i], err);
    if (st != DFL_OK) return st;
    if (op->kind == BACKEND_OP_MATMUL && op->src[0].layout != TENSOR_LAYOUT_PLAIN) {
        return error_set(err, DFL_ERR_UNSUPPORTED, "op matmul: the cuda backend reads weights in the plain layout only "
                         "(it packs none: backend_weight_pack_size is 0)");
    }
    if (op->kind == BACKEND_OP_MATMUL_ARGMAX) {
        return error_set(err, DFL_ERR_UNSUPPORTED, "op matmul_argmax: not implemented by the cuda backend "
                         "(backend_get_caps: matmul_argmax is false; use op_matmul, op_scale, op_argmax)");
    }
    if (op->kind == BACKEND_OP_ATTENTION && (op->src[0].ne[1] > 65535 || op->src[0].ne[2] > 65535 ||
                                             op->src[0].ne[0] > 8192)) {
        return error_set(err, DFL_ERR_UNSUPPORTED, "op attention: the cuda kernel takes <= 65535 heads and query rows "
                         "and head_dim <= 8192");
    }
    return DFL_OK;
}

static void cuda_free(backend *bbe) {
    cuda_backend *be = (cuda_backend *)bbe;
    cuda_set_device(be);
    if (be->xfer != NULL) CUDA_CHECK(cudaStreamDestroy(be->xfer));
    if (be->err_host != NULL) CUDA_CHECK(cudaFreeHost(be->err_host));
    cuda_blas_unload(&be->blas);
    free(be);
}

static const backend_vtable k_cuda_vtable = {
    /* .name = */ "cuda",
    /* .free = */ cuda_free,
    /* .caps = */ cuda_caps,
    /* .op_supported = */ cuda_op_supported,
    /* .weight_pack_size = */ NULL,
    /* .weight_pack = */ NULL,
    /* .buffer_alloc = */ cuda_buffer_alloc,
    /* .buffer_free = */ cuda_buffer_free,
    /* .buffer_set = */ cuda_buffer_set,
    /* .buffer_get = */ cuda_buffer_get,
    /* .queue_new = */ cuda_queue_new,
    /* .queue_free = */ cuda_queue_free,
    /* .queue_submit = */ cuda_queue_submit,
    /* .queue_synchronize = */ cuda_queue_synchronize,
    /* .event_new = */ cuda_event_new,
    /* .event_free = */ cuda_event_free,
    /* .event_record = */ cuda_event_record,
    /* .queue_wait_event = */ cuda_queue_wait_event,
    /* .event_synchronize = */ cuda_event_synchronize,
};

extern "C" backend_cuda_params backend_cuda_default_params(void) {
    backend_cuda_params p;
    memset(&p, 0, sizeof(p));
    return p;
}

/* "driver supports CUDA 13.0, runtime 13.0" ("no driver" when none is installed) */
static void cuda_versions(char *buf, size_t cap) {
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    cudaGetLastError();
    if (drv == 0) snprintf(buf, cap, "no CUDA driver, runtime %d.%d", rt / 1000, rt % 1000 / 10);
    else snprintf(buf, cap, "driver supports CUDA %d.%d, runtime %d.%d", drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
}

extern "C" int backend_cuda_device_count(dfl_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        char ver[96];
        cuda_versions(ver, sizeof(ver));
        error_set(err, DFL_ERR_UNSUPPORTED, "no usable CUDA device: %s (%s)", cudaGetErrorString(e), ver);
        return 0;
    }
    if (n == 0) error_set(err, DFL_ERR_UNSUPPORTED, "no CUDA device found");
    return n;
}

extern "C" const char *backend_cuda_device_name(const backend *bbe) {
    return ((const cuda_backend *)bbe)->desc;
}

#ifdef DFL_TEST_HOOKS
extern "C" void backend_cuda_set_test_chunk_rows(backend *bbe, int64_t rows) {
    ((cuda_backend *)bbe)->test_chunk_rows = rows > 0 ? rows : 0;
}
#endif

extern "C" backend *backend_cuda_new(const backend_cuda_params *params, dfl_error *err) {
    backend_cuda_params p = params ? *params : backend_cuda_default_params();
    const int n_dev = backend_cuda_device_count(err);
    if (n_dev <= 0) return NULL;
    if (p.device < 0 || p.device >= n_dev) {
        error_set(err, DFL_ERR_INVALID, "cuda backend: device %d does not exist (%d device%s)", p.device, n_dev,
                  n_dev == 1 ? "" : "s");
        return NULL;
    }
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, p.device);
    if (e != cudaSuccess) {
        error_set(err, DFL_ERR_UNSUPPORTED, "cuda backend: cannot query device %d: %s", p.device, cudaGetErrorString(e));
        return NULL;
    }
    if (prop.major < 9) {
        error_set(err, DFL_ERR_UNSUPPORTED, "cuda backend: device %d (%s) has compute capability %d.%d; this build "
                  "targets 9.0 and newer (sm_90 / compute_90)", p.device, prop.name, prop.major, prop.minor);
        return NULL;
    }
    cuda_backend *be = (cuda_backend *)calloc(1, sizeof(*be));
    if (be == NULL) {
        error_set(err, DFL_ERR_NOMEM, "cuda backend: out of host memory");
        return NULL;
    }
    be->base.vt = &k_cuda_vtable;
    be->device = p.device;
    be->n_sm = prop.multiProcessorCount;
    be->cc_major = prop.major;
    be->cc_minor = prop.minor;
    be->smem_optin = prop.sharedMemPerBlockOptin;
    be->mem_total = prop.totalGlobalMem;
    char ver[96];
    cuda_versions(ver, sizeof(ver));
    snprintf(be->desc, sizeof(be->desc), "%.256s, cc %d.%d, %d SMs, %.1f GiB, %s", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), ver);
    e = cudaSetDevice(p.device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&be->xfer, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&be->err_host, sizeof(unsigned int), cudaHostAllocMapped);
    if (e == cudaSuccess) {
        *be->err_host = 0;
        e = cudaHostGetDevicePointer((void **)&be->err_dev, be->err_host, 0);
    }
    if (e != cudaSuccess) {
        error_set(err, DFL_ERR_UNSUPPORTED, "cuda backend: cannot initialize device %d (%s): %s", p.device, prop.name,
                  cudaGetErrorString(e));
        cudaGetLastError();
        cuda_free(&be->base);
        return NULL;
    }
    if (be->smem_optin < 80 * 1024) {
        error_set(err, DFL_ERR_UNSUPPORTED, "cuda backend: device %d allows only %zu bytes of shared memory per block",
                  p.device, be->smem_optin);
        cuda_free(&be->base);
        return NULL;
    }
    if (cuda_blas_load(&be->blas, err) != DFL_OK) {
        cuda_free(&be->base);
        return NULL;
    }
    cuda_matmul_init(be);
    return &be->base;
}
