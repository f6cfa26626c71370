/* backend_cuda.h: the CUDA backend (NVIDIA GPUs), a C interface over the .cu files of this folder.
 * Only built when nvcc is found (make CUDA=1, or automatically); the build defines DFL_HAVE_CUDA
 * for the C code then. Without CUDA none of these functions exist.
 *
 * Memory: buffers are device memory (cudaMalloc, zeroed); caps.host_visible is false, so every
 * tensor an op touches must lie in a buffer of this backend (weights are uploaded once, see
 * src/model/weights_device.c). op_write / op_read move host bytes in stream order.
 * Queues are CUDA streams (one per queue, non-blocking), events are CUDA events: record =
 * cudaEventRecord, device-side wait = cudaStreamWaitEvent, host wait = cudaEventSynchronize.
 * Ops: see cuda_ops.cu, cuda_matmul.cu and cuda_attention.cu. A CUDA error inside an op (a
 * launch failure, an illegal address) is a broken invariant: it aborts with file:line and the
 * CUDA error string. */
#ifndef DFL_BACKEND_CUDA_H
#define DFL_BACKEND_CUDA_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct backend_cuda_params {
    int device;   /* CUDA device ordinal (default 0) */
} backend_cuda_params;

backend_cuda_params backend_cuda_default_params(void);

/* Number of usable CUDA devices: > 0, or 0 with err set to why none is usable (no driver, no
 * device, a driver older than the runtime). Never aborts. */
int backend_cuda_device_count(dfl_error *err);

/* Creates the CUDA backend on params->device. NULL + err (DFL_ERR_UNSUPPORTED) when there is no
 * usable device, or the device's compute capability is below 9.0 (the build targets sm_90 and
 * compute_90 PTX). */
backend *backend_cuda_new(const backend_cuda_params *params, dfl_error *err);

/* One line describing the device of a CUDA backend ("NVIDIA H200, cc 9.0, 132 SMs, 139.8 GiB, driver
 * supports CUDA 13.0, runtime 13.0"). */
const char *backend_cuda_device_name(const backend *be);

#ifdef DFL_TEST_HOOKS
/* Test hook: rows of W dequantized per chunk in the quantized matmul path above 64 activation
 * rows (cuda_matmul.cu; by default as many as fit 64 MiB of f32, so small tests have one chunk);
 * 0 restores the default. */
void backend_cuda_set_test_chunk_rows(backend *be, int64_t rows);
#endif

#ifdef __cplusplus
}
#endif

#endif
