/* weights_device.h: a model's weights in the memory of a backend that cannot read the GGUF
 * mapping (caps.host_visible false, e.g. CUDA): uploaded once per (model, backend), shared by
 * every context of that model on that backend. */
#ifndef DFL_MODEL_WEIGHTS_DEVICE_H
#define DFL_MODEL_WEIGHTS_DEVICE_H

#include "model/context.h"

/* Points the weight tensors of w (bound into the mapping by ctx_weights_bind) at the model's copy
 * on be, uploading the GGUF data section first if this is the first context of the model on be.
 * DFL_ERR_NOMEM (device memory) / DFL_ERR_UNSUPPORTED (too many backends) with a message. */
dfl_status weights_device_acquire(dfl_model *model, backend *be, ctx_weights *w, dfl_error *err);
/* Drops one context's use of the copy on be; the last one frees it. */
void weights_device_release(dfl_model *model, backend *be);

#endif
