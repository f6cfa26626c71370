/* feature_link.h: the one owner of the feature handoff between a target context (the writer:
 * its decode captures the inputs of the drafter's target layers) and its drafter (the reader:
 * its injection turns those rows into K/V). It holds the feature rows, the two events that order
 * writer and reader, the row count of the last batch and the host/device decision.
 *
 * The protocol (docs/feature-protocol.md), in order, for every target batch:
 *   1. writer begin (feature_link_write_begin, on the target's queue): once a `read` event was
 *      recorded, the target's queue waits for it (device-side) before the batch overwrites rows;
 *   2. the forward scatters each captured layer input of batch entry r into row r (device path:
 *      one buffer [width, n_batch] in backend memory; host path: a staging buffer [width,
 *      n_ubatch], copied to host rows after each micro-batch by feature_link_write_ubatch);
 *   3. writer end (feature_link_write_end): host copies where needed, then `written` is recorded
 *      on the target's queue, and the number of rows of the batch is kept (the reader may read
 *      rows 0..n_rows-1 only);
 *   4. reader begin (feature_link_read_begin, drafter side): waits for `written`, on the host
 *      (default: a device-side wait would stall the drafter's queue for the whole target batch)
 *      or on the drafter's queue (wait_on_device);
 *   5. the drafter gathers rows (device path: get_rows from the buffer in place; host path:
 *      copies the host rows into its own staging), fuses them and writes K/V, on its queue;
 *   6. reader end (feature_link_read_end): `read` is recorded on the drafter's queue; step 1 of
 *      the next target batch waits for it. */
#ifndef DFL_SPECULATIVE_FEATURE_LINK_H
#define DFL_SPECULATIVE_FEATURE_LINK_H

#include "backend/backend.h"
#include "dflash.h"

#define FEATURE_LINK_MAX_CAPTURE 64

#ifdef DFL_TEST_HOOKS
/* Test-only faults (never in release builds): prove the ordering tests detect a missing wait. */
#define FEATURE_FAULT_SKIP_READ_WAIT 1u    /* the writer does not wait for `read` */
#define FEATURE_FAULT_SKIP_WRITTEN_WAIT 2u /* the reader does not wait for `written` */
#endif

typedef struct feature_link {
    int32_t n_capture;                 /* layer ids captured, in column order */
    int32_t capture_layers[FEATURE_LINK_MAX_CAPTURE];
    int64_t n_embd;
    int64_t width;                     /* n_capture * n_embd floats per row */
    int64_t n_rows_max;                /* rows of the device buffer / host copy (n_batch) */
    backend_buffer *buf;
    tensor feat;                       /* device path [width, n_batch]; host path: staging [width, n_ubatch] */
    bool device;                       /* the device path (one buffer read in place) */
    char note[160];                    /* why there is no device buffer */
    backend_event *ev_written;         /* recorded by the writer after each batch */
    backend_event *ev_read;            /* recorded by the reader after it consumed the rows */
    bool read_recorded;
    bool wait_on_device;               /* the reader waits for `written` on its queue */
    float *host;                       /* [width, n_batch] host rows (host path, dfl_get_features) */
    bool to_host;                      /* device path: also copy the rows to host after each batch */
    uint64_t host_bytes;               /* feature bytes copied to host memory so far */
    int64_t n_rows;                    /* rows written by the last batch */
#ifdef DFL_TEST_HOOKS
    uint32_t test_faults;              /* FEATURE_FAULT_* bits */
#endif
} feature_link;

/* Creates the link of a target context on backend be: the device buffer unless disabled, above
 * max_bytes (0: no cap) or impossible to allocate (then the host path; note says why). NULL + err
 * on failure. */
feature_link *feature_link_new(backend *be, const int32_t *layers, int32_t n_capture, int64_t n_embd, int64_t n_batch,
                               int64_t n_ubatch, bool no_device_buffer, size_t max_bytes, dfl_error *err);
void feature_link_free(feature_link *fl);

/* 1. before a target batch is enqueued on q */
void feature_link_write_begin(feature_link *fl, backend_queue *q);
/* 2. host path: after micro-batch [i0, i0 + n) of the batch, its staged rows to host memory */
void feature_link_write_ubatch(feature_link *fl, backend_queue *q, int64_t i0, int64_t n);
/* 3. after the batch of n_rows entries: host copies (device path with to_host), `written`.
 * Returns true when the host must wait for q before it reads the host rows. */
bool feature_link_write_end(feature_link *fl, backend_queue *q, int64_t n_rows);
/* 4. before the reader enqueues reads of the device rows on its queue q */
void feature_link_read_begin(feature_link *fl, backend_queue *q);
/* 6. after the reads are enqueued on q */
void feature_link_read_end(feature_link *fl, backend_queue *q);
/* Host row i of the last batch ([width] floats), NULL where the rows stay in backend memory. */
const float *feature_link_host_row(const feature_link *fl, int64_t i);

#endif
