/* test_backend_queue.c: CPU backend buffers, queues and events, in synchronous and asynchronous
 * queue mode: host <-> buffer copies, in-order execution of enqueued ops, event record / device-side
 * wait / host wait across two queues (the feature handoff pattern of docs/feature-protocol.md), a ring that
 * fills up, and creation errors. `make tsan` runs these under ThreadSanitizer. */
#include "test.h"

#include "backend/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static backend *queue_test_backend(bool async, int n_threads) {
    backend_cpu_params p = backend_cpu_default_params();
    p.async = async;
    p.n_threads = n_threads;
    p.n_threads_batch = n_threads;
    dfl_error err;
    memset(&err, 0, sizeof(err));
    return backend_cpu_new(&p, &err);
}

TEST(backend_buffer_set_get) {
    backend *be = queue_test_backend(false, 1);
    REQUIRE(be);
    dfl_error err;
    memset(&err, 0, sizeof(err));
    backend_buffer *buf = backend_buffer_alloc(be, 1000, &err);
    REQUIRE(buf);
    CHECK_EQ_INT(backend_buffer_size(buf), 1000);
    CHECK(((uintptr_t)backend_buffer_base(buf) & 63) == 0);
    const uint8_t *base = backend_buffer_base(buf);
    bool zero = true;
    for (int i = 0; i < 1000; i++) zero = zero && base[i] == 0;
    CHECK_MSG(zero, "a new buffer is zeroed");
    char in[10] = "abcdefghi", out[10] = {0};
    backend_buffer_set(buf, 990, in, 10);
    backend_buffer_get(buf, 990, out, 10);
    CHECK(memcmp(in, out, 10) == 0);
    tensor t2 = tensor_in_buffer(buf, 64, QUANT_TYPE_F32, 10, 3);
    CHECK(t2.buf == buf);
    CHECK(t2.data == (char *)backend_buffer_base(buf) + 64);
    backend_buffer_free(buf);

    memset(&err, 0, sizeof(err));
    CHECK(backend_buffer_alloc(be, 0, &err) == NULL);
    CHECK_EQ_INT(err.code, DFL_ERR_INVALID);
    memset(&err, 0, sizeof(err));
    CHECK(backend_buffer_alloc(be, SIZE_MAX - 10, &err) == NULL);
    CHECK_EQ_INT(err.code, DFL_ERR_NOMEM);
    backend_caps c = backend_get_caps(be);
    CHECK(strcmp(c.name, "cpu") == 0);
    CHECK(c.has_events && c.host_visible && !c.async);
    backend_free(be);

    backend_cpu_params p = backend_cpu_default_params();
    p.n_threads = 5000;
    memset(&err, 0, sizeof(err));
    CHECK(backend_cpu_new(&p, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "thread");
}

/* A chain of ops on one queue: write, scale, add, read; in order whatever the mode. */
static void chain_case(test_ctx *t, bool async) {
    backend *be = queue_test_backend(async, 2);
    REQUIRE(be);
    dfl_error err;
    memset(&err, 0, sizeof(err));
    backend_queue *q = backend_queue_new(be, &err);
    backend_buffer *buf = backend_buffer_alloc(be, 3 * 256 * sizeof(float), &err);
    REQUIRE(q && buf);
    tensor a = tensor_in_buffer(buf, 0, QUANT_TYPE_F32, 256, 1);
    tensor b = tensor_in_buffer(buf, 256 * 4, QUANT_TYPE_F32, 256, 1);
    static float host[1100][256];
    float in[256];
    for (int i = 0; i < 256; i++) in[i] = (float)i;
    op_write(q, a, in, sizeof(in));
    /* 1100 steps (more than the async ring holds): b = a * 1; a = a + b -> a doubles each step
     * until it would overflow; read a snapshot after each step */
    for (int s = 0; s < 1100; s++) {
        op_scale(q, b, a, s < 100 ? 1.0f : 0.0f);
        op_add(q, a, a, b);
        op_read(q, host[s], a, sizeof(host[s]));
    }
    backend_queue_synchronize(q);
    for (int s = 0; s < 1100; s++) {
        const float expect = (float)7 * ldexpf(1.0f, s < 100 ? s + 1 : 100);
        if (host[s][7] != expect) {
            test_fail(t, __FILE__, __LINE__, "%s: step %d: %g, expected %g", async ? "async" : "sync", s, host[s][7], expect);
            break;
        }
    }
    backend_buffer_free(buf);
    backend_queue_free(q);
    backend_free(be);
}

TEST(backend_queue_in_order) {
    chain_case(t, false);
    chain_case(t, true);
}

/* Two queues, the handoff of docs/feature-protocol.md: the producer writes a buffer and records `written`;
 * the consumer host-waits `written`, reads the rows, records `read`; the producer waits `read` on
 * its queue (device-side) before overwriting. Each round's values must arrive intact. */
static void handoff_case(test_ctx *t, bool async) {
    backend *be = queue_test_backend(async, 2);
    REQUIRE(be);
    dfl_error err;
    memset(&err, 0, sizeof(err));
    backend_queue *qp = backend_queue_new(be, &err), *qc = backend_queue_new(be, &err);
    backend_event *written = backend_event_new(be, &err), *read = backend_event_new(be, &err);
    backend_buffer *buf = backend_buffer_alloc(be, 2 * 512 * sizeof(float), &err);
    REQUIRE(qp && qc && written && read && buf);
    tensor feat = tensor_in_buffer(buf, 0, QUANT_TYPE_F32, 512, 1);
    tensor gathered = tensor_in_buffer(buf, 512 * 4, QUANT_TYPE_F32, 512, 1);
    static float src[200][512], out[200][512];
    /* never-recorded events are complete */
    backend_event_synchronize(written);
    backend_queue_wait_event(qp, read);
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 512; i++) src[round][i] = (float)(round * 1000 + i);
        backend_queue_wait_event(qp, read);        /* don't overwrite before the consumer read */
        op_write(qp, feat, src[round], sizeof(src[round]));
        op_scale(qp, feat, feat, 2.0f);
        backend_event_record(written, qp);
        backend_event_synchronize(written);        /* host wait, as the drafter does */
        op_scale(qc, gathered, feat, 0.5f);
        op_read(qc, out[round], gathered, sizeof(out[round]));
        backend_event_record(read, qc);
    }
    backend_queue_synchronize(qp);
    backend_queue_synchronize(qc);
    int bad = 0;
    for (int round = 0; round < 200 && bad == 0; round++) {
        if (memcmp(src[round], out[round], sizeof(src[round])) != 0) bad = round + 1;
    }
    CHECK_MSG(bad == 0, "%s: round %d read other values than written", async ? "async" : "sync", bad - 1);
    backend_buffer_free(buf);
    backend_event_free(written);
    backend_event_free(read);
    backend_queue_free(qp);
    backend_queue_free(qc);
    backend_free(be);
}

TEST(backend_queue_event_handoff) {
    handoff_case(t, false);
    handoff_case(t, true);
}

/* Device-side wait: queue B's ops must not run before queue A's recorded work, even though the
 * host enqueues B's ops first thing after recording. */
TEST(backend_queue_device_wait_orders) {
    backend *be = queue_test_backend(true, 1);
    REQUIRE(be);
    CHECK(backend_get_caps(be).async);
    dfl_error err;
    memset(&err, 0, sizeof(err));
    backend_queue *qa = backend_queue_new(be, &err), *qb = backend_queue_new(be, &err);
    backend_event *ev = backend_event_new(be, &err);
    backend_buffer *buf = backend_buffer_alloc(be, 2 * 4096 * sizeof(float), &err);
    REQUIRE(qa && qb && ev && buf);
    tensor x = tensor_in_buffer(buf, 0, QUANT_TYPE_F32, 4096, 1);
    tensor y = tensor_in_buffer(buf, 4096 * 4, QUANT_TYPE_F32, 4096, 1);
    static float ones[4096], res[4096];
    for (int i = 0; i < 4096; i++) ones[i] = 1.0f;
    for (int round = 0; round < 50; round++) {
        op_write(qa, x, ones, sizeof(ones));
        for (int k = 0; k < 20; k++) op_add(qa, x, x, x); /* x = 2^20 when A is done */
        backend_event_record(ev, qa);
        backend_queue_wait_event(qb, ev);
        op_copy(qb, y, x);
        op_read(qb, res, y, sizeof(res));
        backend_queue_synchronize(qb);
        CHECK_MSG(res[4095] == 1048576.0f, "round %d: queue B ran before A's recorded work (%g)", round, res[4095]);
        backend_queue_synchronize(qa);
    }
    backend_buffer_free(buf);
    backend_event_free(ev);
    backend_queue_free(qa);
    backend_queue_free(qb);
    backend_free(be);
}
