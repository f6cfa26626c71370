/* feature_link.c: the feature handoff between a target and its drafter (the protocol is the
 * numbered comment of feature_link.h). */
#include "speculative/feature_link.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void feature_link_free(feature_link *fl) {
    if (fl == NULL) return;
    if (fl->buf) backend_buffer_free(fl->buf);
    if (fl->ev_written) backend_event_free(fl->ev_written);
    if (fl->ev_read) backend_event_free(fl->ev_read);
    free(fl->host);
    free(fl);
}

feature_link *feature_link_new(backend *be, const int32_t *layers, int32_t n_capture, int64_t n_embd, int64_t n_batch,
                               int64_t n_ubatch, bool no_device_buffer, size_t max_bytes, dfl_error *err) {
    if (n_capture < 1 || n_capture > FEATURE_LINK_MAX_CAPTURE) {
        error_set(err, DFL_ERR_INVALID, "feature link: %d captured layers (expected 1..%d)", n_capture,
                  FEATURE_LINK_MAX_CAPTURE);
        return NULL;
    }
    feature_link *fl = calloc(1, sizeof(*fl));
    if (fl == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory for the feature capture");
        return NULL;
    }
    fl->n_capture = n_capture;
    memcpy(fl->capture_layers, layers, (size_t)n_capture * sizeof(int32_t));
    fl->n_embd = n_embd;
    fl->width = (int64_t)n_capture * n_embd;
    fl->n_rows_max = n_batch;
    fl->to_host = true;
    const size_t width = (size_t)fl->width;
    const size_t full = width * (size_t)n_batch * sizeof(float);
    if (no_device_buffer) {
        snprintf(fl->note, sizeof(fl->note), "the feature buffer is disabled by configuration");
    } else if (max_bytes > 0 && full > max_bytes) {
        snprintf(fl->note, sizeof(fl->note), "a feature buffer of %zu bytes is above the cap of %zu bytes", full, max_bytes);
    } else {
        dfl_error e2 = {0};
        fl->buf = backend_buffer_alloc(be, full, &e2);
        if (fl->buf == NULL) snprintf(fl->note, sizeof(fl->note), "the feature buffer could not be allocated: %.100s", e2.msg);
    }
    fl->device = fl->buf != NULL;
    if (fl->device) {
        fl->feat = tensor_in_buffer(fl->buf, 0, QUANT_TYPE_F32, fl->width, n_batch);
    } else {
        fl->buf = backend_buffer_alloc(be, width * (size_t)n_ubatch * sizeof(float), err);
        if (fl->buf == NULL) goto fail;
        fl->feat = tensor_in_buffer(fl->buf, 0, QUANT_TYPE_F32, fl->width, n_ubatch);
    }
    fl->host = calloc(width * (size_t)n_batch, sizeof(float));
    if (fl->host == NULL) {
        error_set(err, DFL_ERR_NOMEM, "out of memory for the feature capture");
        goto fail;
    }
    fl->ev_written = backend_event_new(be, err);
    fl->ev_read = fl->ev_written ? backend_event_new(be, err) : NULL;
    if (fl->ev_read == NULL) goto fail;
    return fl;
fail:
    feature_link_free(fl);
    return NULL;
}

void feature_link_write_begin(feature_link *fl, backend_queue *q) {
    if (!fl->device || !fl->read_recorded) return;
#ifdef DFL_TEST_HOOKS
    if (fl->test_faults & FEATURE_FAULT_SKIP_READ_WAIT) return;
#endif
    backend_queue_wait_event(q, fl->ev_read);
}

void feature_link_write_ubatch(feature_link *fl, backend_queue *q, int64_t i0, int64_t n) {
    if (fl->device) return;
    const size_t width = (size_t)fl->width;
    op_read(q, fl->host + (size_t)i0 * width, tensor_rows(&fl->feat, 0, n), width * (size_t)n * sizeof(float));
    fl->host_bytes += width * (size_t)n * sizeof(float);
}

bool feature_link_write_end(feature_link *fl, backend_queue *q, int64_t n_rows) {
    const size_t width = (size_t)fl->width;
    if (fl->device && fl->to_host) {
        fl->host_bytes += width * (size_t)n_rows * sizeof(float);
        op_read(q, fl->host, tensor_rows(&fl->feat, 0, n_rows), width * (size_t)n_rows * sizeof(float));
    }
    backend_event_record(fl->ev_written, q);
    fl->n_rows = n_rows;
    return fl->to_host || !fl->device;
}

void feature_link_read_begin(feature_link *fl, backend_queue *q) {
#ifdef DFL_TEST_HOOKS
    if (fl->test_faults & FEATURE_FAULT_SKIP_WRITTEN_WAIT) return;
#endif
    if (fl->wait_on_device) backend_queue_wait_event(q, fl->ev_written);
    else backend_event_synchronize(fl->ev_written);
}

void feature_link_read_end(feature_link *fl, backend_queue *q) {
    backend_event_record(fl->ev_read, q);
    fl->read_recorded = true;
}

const float *feature_link_host_row(const feature_link *fl, int64_t i) {
    if ((fl->device && !fl->to_host) || i < 0 || i >= fl->n_rows) return NULL;
    return fl->host + (size_t)i * (size_t)fl->width;
}
