/* weights_pack.h: a model's matmul weights packed for the kernels of a host-visible backend
 * that asks for it (backend_weight_pack_size, e.g. the CPU's Q8_0 x16 layout): packed once per
 * (model, backend), shared by every context of that model on that backend. */
#ifndef DFL_MODEL_WEIGHTS_PACK_H
#define DFL_MODEL_WEIGHTS_PACK_H

#include "model/context.h"

/* Points the packable matmul weights of w (the head and the layers' projections, bound into the
 * mapping by ctx_weights_bind) at the model's packed copy on be, packing them first if this is
 * the first context of the model on be. Returns whether w now uses the copy (release it then).
 * Packing only speeds things up: when the copy cannot be made (no memory for it, or the model is
 * packed for MODEL_MAX_DEVICE_COPIES backends already) w stays as bound and it returns false. */
/* f16: F16 / BF16 weights too (the CPU packs them for AMX-BF16 tiles, which every row count then
 * takes: faster from about 8 rows, slower for a 1-row decode, so a drafter asks for it, whose
 * matmuls have a block of rows; a target does not). The first context of a model decides. */
bool weights_pack_acquire(dfl_model *model, backend *be, ctx_weights *w, bool f16);
/* Drops one context's use of the copy on be; the last one frees it. */
void weights_pack_release(dfl_model *model, backend *be);

#endif
