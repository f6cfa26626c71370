/* cpu_backend.c: the CPU backend object: creation (feature detection, kernel selection, thread
 * pool), host-memory buffers, queues and events.
 *
 * Queues run in one of two modes, chosen by backend_cpu_params.async:
 * - synchronous: backend_queue_submit executes the op before returning; events complete when
 *   recorded; device-side waits are no-ops.
 * - asynchronous: each queue owns a worker thread and a ring of records (op | event record |
 *   event wait) executed in order, like a GPU stream. An event counts records (`recorded`, on the
 *   host) and completions (`completed`, by the worker); host waits block on its condvar. */
#include "backend/cpu/cpu_internal.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CPU_QUEUE_CAP 512 /* records in an async queue's ring */

/* ---- events ------------------------------------------------------------------------------ */

typedef struct cpu_event {
    backend_event base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded;  /* number of record calls so far (host side) */
    uint64_t completed; /* the highest record number whose preceding work is done */
} cpu_event;

static void cpu_event_complete(cpu_event *ev, uint64_t seq) {
    pthread_mutex_lock(&ev->mu);
    if (ev->completed < seq) ev->completed = seq;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

static void cpu_event_wait_seq(cpu_event *ev, uint64_t seq) {
    pthread_mutex_lock(&ev->mu);
    while (ev->completed < seq) pthread_cond_wait(&ev->cv, &ev->mu);
    pthread_mutex_unlock(&ev->mu);
}

static backend_event *cpu_event_new(backend *be, dfl_error *err) {
    cpu_event *ev = calloc(1, sizeof(*ev));
    if (ev == NULL) {
        error_set(err, DFL_ERR_NOMEM, "cpu backend: out of memory for an event");
        return NULL;
    }
    ev->base.be = be;
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    return &ev->base;
}

static void cpu_event_free(backend_event *bev) {
    cpu_event *ev = (cpu_event *)bev;
    pthread_cond_destroy(&ev->cv);
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

static void cpu_event_synchronize(backend_event *bev) {
    cpu_event *ev = (cpu_event *)bev;
    pthread_mutex_lock(&ev->mu);
    uint64_t seq = ev->recorded;
    while (ev->completed < seq) pthread_cond_wait(&ev->cv, &ev->mu);
    pthread_mutex_unlock(&ev->mu);
}

/* ---- queues ------------------------------------------------------------------------------ */


typedef enum cpu_rec_kind { CPU_REC_OP, CPU_REC_RECORD, CPU_REC_WAIT } cpu_rec_kind;

typedef struct cpu_rec {
    cpu_rec_kind kind;
    backend_op op;     /* CPU_REC_OP */
    cpu_event *ev;     /* CPU_REC_RECORD / CPU_REC_WAIT */
    uint64_t seq;      /* the event's record number to complete / wait for */
} cpu_rec;

typedef struct cpu_queue {
    backend_queue base;
    bool async;
    pthread_t worker;
    bool worker_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;  /* records available or stop */
    pthread_cond_t cv_space; /* a slot freed */
    pthread_cond_t cv_done;  /* a record completed */
    cpu_rec *ring;           /* [CPU_QUEUE_CAP] */
    uint64_t n_submitted;    /* records pushed (guarded by mu) */
    uint64_t n_taken;        /* records taken by the worker */
    uint64_t n_done;         /* records completed */
    bool stop;
#ifdef DFL_TEST_HOOKS
    uint64_t delay_rng;      /* the worker's own generator for test delays */
    uint32_t delay_max_us;   /* random delay bound before each record (0: none) */
#endif
} cpu_queue;

static void cpu_rec_run(cpu_queue *q, const cpu_rec *rec) {
    switch (rec->kind) {
    case CPU_REC_OP: cpu_exec_op((cpu_backend *)q->base.be, &rec->op); break;
    case CPU_REC_RECORD: cpu_event_complete(rec->ev, rec->seq); break;
    case CPU_REC_WAIT: cpu_event_wait_seq(rec->ev, rec->seq); break;
    }
}

static void *cpu_queue_worker(void *arg) {
    cpu_queue *q = arg;
    cpu_rec rec;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (q->n_taken == q->n_submitted && !q->stop) pthread_cond_wait(&q->cv_work, &q->mu);
        if (q->n_taken == q->n_submitted && q->stop) {
            pthread_mutex_unlock(&q->mu);
            break;
        }
        rec = q->ring[q->n_taken % CPU_QUEUE_CAP];
        q->n_taken++;
        pthread_mutex_unlock(&q->mu);
#ifdef DFL_TEST_HOOKS
        pthread_mutex_lock(&q->mu);
        const uint32_t max_us = q->delay_max_us;
        pthread_mutex_unlock(&q->mu);
        if (max_us > 0) { /* test hook: random delays expose missing ordering */
            q->delay_rng = q->delay_rng * 6364136223846793005ull + 1442695040888963407ull;
            const uint32_t r = (uint32_t)(q->delay_rng >> 33);
            const uint32_t us = (r & 15u) == 0 ? max_us * 10u : (r >> 4) % (max_us + 1); /* rare long stalls */
            if (us > 0) {
                struct timespec ts = {0, (long)us * 1000L};
                nanosleep(&ts, NULL);
            }
        }
#endif

        cpu_rec_run(q, &rec);

        pthread_mutex_lock(&q->mu);
        q->n_done++;
        pthread_cond_broadcast(&q->cv_done);
        pthread_cond_signal(&q->cv_space);
        pthread_mutex_unlock(&q->mu);
    }
    return NULL;
}

static void cpu_queue_push(cpu_queue *q, const cpu_rec *rec) {
    if (!q->async) {
        cpu_rec_run(q, rec);
        return;
    }
    pthread_mutex_lock(&q->mu);
    /* a slot is free once the record that used it completed (the worker copies before running,
     * but waiting for completion keeps at most CPU_QUEUE_CAP records in flight) */
    while (q->n_submitted - q->n_done >= CPU_QUEUE_CAP) pthread_cond_wait(&q->cv_space, &q->mu);
    q->ring[q->n_submitted % CPU_QUEUE_CAP] = *rec;
    q->n_submitted++;
    pthread_cond_signal(&q->cv_work);
    pthread_mutex_unlock(&q->mu);
}

static void cpu_queue_synchronize(backend_queue *bq) {
    cpu_queue *q = (cpu_queue *)bq;
    if (!q->async) return;
    pthread_mutex_lock(&q->mu);
    uint64_t target = q->n_submitted;
    while (q->n_done < target) pthread_cond_wait(&q->cv_done, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static void cpu_queue_free(backend_queue *bq) {
    cpu_queue *q = (cpu_queue *)bq;
    if (q->worker_started) {
        cpu_queue_synchronize(bq);
        pthread_mutex_lock(&q->mu);
        q->stop = true;
        pthread_cond_signal(&q->cv_work);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->worker, NULL);
    }
    pthread_cond_destroy(&q->cv_done);
    pthread_cond_destroy(&q->cv_space);
    pthread_cond_destroy(&q->cv_work);
    pthread_mutex_destroy(&q->mu);
    free(q->ring);
    free(q);
}

static backend_queue *cpu_queue_new(backend *bbe, dfl_error *err) {
    cpu_backend *be = (cpu_backend *)bbe;
    cpu_queue *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        error_set(err, DFL_ERR_NOMEM, "cpu backend: out of memory for a queue");
        return NULL;
    }
    q->base.be = bbe;
    q->async = be->params.async;
#ifdef DFL_TEST_HOOKS
    q->delay_rng = be->params.debug_seed ^ (uint64_t)(uintptr_t)q;
    q->delay_max_us = be->params.debug_max_delay_us;
#endif
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv_work, NULL);
    pthread_cond_init(&q->cv_space, NULL);
    pthread_cond_init(&q->cv_done, NULL);
    if (q->async) {
        q->ring = calloc(CPU_QUEUE_CAP, sizeof(cpu_rec));
        if (q->ring == NULL) {
            error_set(err, DFL_ERR_NOMEM, "cpu backend: out of memory for a queue");
            cpu_queue_free(&q->base);
            return NULL;
        }
        if (pthread_create(&q->worker, NULL, cpu_queue_worker, q) != 0) {
            error_set(err, DFL_ERR_INTERNAL, "cpu backend: cannot create a queue worker thread");
            cpu_queue_free(&q->base);
            return NULL;
        }
        q->worker_started = true;
    }
    return &q->base;
}

static void cpu_queue_submit(backend_queue *bq, const backend_op *op) {
    cpu_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.kind = CPU_REC_OP;
    rec.op = *op;
    cpu_queue_push((cpu_queue *)bq, &rec);
}

#ifdef DFL_TEST_HOOKS
void backend_cpu_queue_set_test_delay(backend_queue *bq, uint32_t max_us) {
    cpu_queue *q = (cpu_queue *)bq;
    pthread_mutex_lock(&q->mu);
    q->delay_max_us = max_us;
    pthread_mutex_unlock(&q->mu);
}
#endif

static void cpu_event_record(backend_event *bev, backend_queue *bq) {
    cpu_event *ev = (cpu_event *)bev;
    pthread_mutex_lock(&ev->mu);
    uint64_t seq = ++ev->recorded;
    pthread_mutex_unlock(&ev->mu);
    cpu_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.kind = CPU_REC_RECORD;
    rec.ev = ev;
    rec.seq = seq;
    cpu_queue_push((cpu_queue *)bq, &rec);
}

static void cpu_queue_wait_event(backend_queue *bq, backend_event *bev) {
    cpu_event *ev = (cpu_event *)bev;
    pthread_mutex_lock(&ev->mu);
    uint64_t seq = ev->recorded;
    pthread_mutex_unlock(&ev->mu);
    if (seq == 0) return; /* never recorded: complete */
    cpu_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.kind = CPU_REC_WAIT;
    rec.ev = ev;
    rec.seq = seq;
    cpu_queue_push((cpu_queue *)bq, &rec);
}

/* ---- buffers ----------------------------------------------------------------------------- */

/* Buffers of at least this size are aligned to it and asked to live in transparent huge pages
 * (packed weights, KV caches: fewer page faults when zeroed, fewer TLB misses when streamed). */
#define CPU_HUGE_PAGE ((size_t)2 << 20)

static backend_buffer *cpu_buffer_alloc(backend *be, size_t size, dfl_error *err) {
    backend_buffer *buf = calloc(1, sizeof(*buf));
    const size_t align = size >= CPU_HUGE_PAGE ? CPU_HUGE_PAGE : 64;
    size_t rounded = (size + align - 1) & ~(align - 1);
    void *mem = rounded >= size ? aligned_alloc(align, rounded) : NULL;
    if (buf == NULL || mem == NULL) {
        free(buf);
        free(mem);
        error_set(err, DFL_ERR_NOMEM, "cpu backend: cannot allocate a buffer of %zu bytes", size);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (align == CPU_HUGE_PAGE) (void)madvise(mem, rounded, MADV_HUGEPAGE); /* advice only */
#endif
    memset(mem, 0, rounded);
    buf->be = be;
    buf->base = mem;
    buf->size = size;
    return buf;
}

static void cpu_buffer_free(backend_buffer *buf) {
    free(buf->base);
    free(buf);
}

static void cpu_buffer_set(backend_buffer *buf, size_t offset, const void *src, size_t size) {
    memcpy((char *)buf->base + offset, src, size);
}

static void cpu_buffer_get(const backend_buffer *buf, size_t offset, void *dst, size_t size) {
    memcpy(dst, (const char *)buf->base + offset, size);
}

/* ---- the backend ------------------------------------------------------------------------- */

static backend_caps cpu_caps(const backend *bbe) {
    const cpu_backend *be = (const cpu_backend *)bbe;
    backend_caps c;
    memset(&c, 0, sizeof(c));
    c.name = "cpu";
    c.async = be->params.async;
    c.has_events = true;
    c.host_visible = true;
    c.cpu_features = be->features;
    c.n_threads = be->n_threads;
    c.n_threads_batch = be->n_threads_batch;
    c.matmul_argmax = true;
    return c;
}

static dfl_status cpu_op_supported(const backend *bbe, const backend_op *op, dfl_error *err) {
    const cpu_backend *be = (const cpu_backend *)bbe;
    if ((op->kind == BACKEND_OP_MATMUL || op->kind == BACKEND_OP_MATMUL_ARGMAX) &&
        be->kernels.matmul[op->src[0].type] == NULL) {
        return error_set(err, DFL_ERR_UNSUPPORTED, "op matmul: the cpu backend has no kernel for weight type %u",
                         op->src[0].type);
    }
    if ((op->kind == BACKEND_OP_MATMUL || op->kind == BACKEND_OP_MATMUL_ARGMAX) &&
        op->src[0].layout != TENSOR_LAYOUT_PLAIN &&
        (op->src[0].layout != be->kernels.pack_layout[op->src[0].type] || be->kernels.matmul_packed[op->src[0].type] == NULL)) {
        return error_set(err, DFL_ERR_UNSUPPORTED,
                         "op matmul: w is packed in layout %u, which this cpu backend's kernels do not read (pack it "
                         "with backend_weight_pack on this backend)",
                         op->src[0].layout);
    }
    return DFL_OK;
}

static size_t cpu_vt_weight_pack_size(const backend *be, const tensor *w) {
    return cpu_weight_pack_size(&((const cpu_backend *)be)->kernels, w);
}

typedef struct pack_job {
    const cpu_kernels *k;
    const tensor *w;
    void *dst;
} pack_job;

static void pack_fn(void *ctx, int ith, int nth) {
    const pack_job *j = ctx;
    cpu_weight_pack_part(j->k, j->w, j->dst, ith, nth);
}

/* on the backend's threads (one op at a time: the pool is shared with the queues) */
static tensor cpu_vt_weight_pack(backend *bbe, const tensor *w, void *dst) {
    cpu_backend *be = (cpu_backend *)bbe;
    pack_job job = {&be->kernels, w, dst};
    int nth = be->n_threads_batch < cpu_pool_size(be->pool) ? be->n_threads_batch : cpu_pool_size(be->pool);
    if (nth < 1) nth = 1;
    pthread_mutex_lock(&be->exec_mu);
    cpu_pool_run(be->pool, nth, pack_fn, &job);
    pthread_mutex_unlock(&be->exec_mu);
    return cpu_weight_packed_view(&be->kernels, w, dst);
}

static void cpu_free(backend *bbe) {
    cpu_backend *be = (cpu_backend *)bbe;
    cpu_pool_free(be->pool);
    free(be->shares);
    pthread_mutex_destroy(&be->exec_mu);
    free(be->scratch);
    free(be->rope_cs);
    free(be);
}

void *cpu_scratch(cpu_backend *be, size_t size) {
    if (size > be->scratch_size) {
        size_t n = (size + 4095) & ~(size_t)4095;
        void *mem = aligned_alloc(64, n);
        if (mem == NULL) error_abort(__FILE__, __LINE__, "cpu backend: out of memory for op scratch");
        free(be->scratch);
        be->scratch = mem;
        be->scratch_size = n;
    }
    return be->scratch;
}

static const backend_vtable k_cpu_vtable = {
    .name = "cpu",
    .free = cpu_free,
    .caps = cpu_caps,
    .op_supported = cpu_op_supported,
    .weight_pack_size = cpu_vt_weight_pack_size,
    .weight_pack = cpu_vt_weight_pack,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_set = cpu_buffer_set,
    .buffer_get = cpu_buffer_get,
    .queue_new = cpu_queue_new,
    .queue_free = cpu_queue_free,
    .queue_submit = cpu_queue_submit,
    .queue_synchronize = cpu_queue_synchronize,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .queue_wait_event = cpu_queue_wait_event,
    .event_synchronize = cpu_event_synchronize,
};

backend_cpu_params backend_cpu_default_params(void) {
    backend_cpu_params p;
    memset(&p, 0, sizeof(p));
    return p;
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
/* F16C through CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no "f16c"). */
static bool cpu_has_f16c(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & (1u << 29)) != 0;
}

/* AMX tiles with int8 (bf16) products: CPUID leaf 7 EDX bits 24 (AMX-TILE) and 25 (AMX-INT8; 22:
 * AMX-BF16), the OS
 * saving the tile state (XCR0 bits 17, 18), and on Linux the process's permission to use it
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; granted once for the whole process, which is
 * idempotent, so asking again at each detection changes nothing). */
static bool cpu_has_amx(unsigned bit) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if ((d & (1u << 24)) == 0 || (d & (1u << bit)) == 0) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return false; /* OSXSAVE */
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__)
    /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 (asm/prctl.h, Linux 5.16+) */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return false;
#endif
    return true;
}
#endif

uint32_t cpu_features_detect(void) {
    uint32_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
        f |= BACKEND_CPU_FEATURE_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
            f |= BACKEND_CPU_FEATURE_AVX512;
            if (__builtin_cpu_supports("avx512vnni")) f |= BACKEND_CPU_FEATURE_AVX512_VNNI;
            if (__builtin_cpu_supports("avx512bf16")) f |= BACKEND_CPU_FEATURE_AVX512_BF16;
            if (cpu_has_amx(25)) f |= BACKEND_CPU_FEATURE_AMX_INT8;
            if (cpu_has_amx(22)) f |= BACKEND_CPU_FEATURE_AMX_BF16;
        }
    }
#endif
    return f;
}

/* DFLASH_CPU_DISABLE (docs/quantization.md): a comma-separated list of code paths not to use, for
 * A/B timing of the same binary: "amx-bf16" (the F16 / BF16 tiles only), "amx", "avx512" (with VNNI,
 * BF16 and AMX), "avx2" (everything:
 * the scalar kernels). Adds their bits to *bits; false (and err) on an unknown name. */
static bool cpu_env_disable(uint32_t *bits, dfl_error *err) {
    const char *v = getenv("DFLASH_CPU_DISABLE");
    if (v == NULL) return true;
    const char *p = v;
    while (*p != '\0') {
        const char *e = strchr(p, ',');
        const size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
        if (n == 8 && strncmp(p, "amx-bf16", 8) == 0) {
            *bits |= BACKEND_CPU_FEATURE_AMX_BF16;
        } else if (n == 3 && strncmp(p, "amx", 3) == 0) {
            *bits |= BACKEND_CPU_FEATURE_AMX_INT8 | BACKEND_CPU_FEATURE_AMX_BF16;
        } else if (n == 6 && strncmp(p, "avx512", 6) == 0) {
            *bits |= BACKEND_CPU_FEATURE_AVX512;
        } else if (n == 4 && strncmp(p, "avx2", 4) == 0) {
            *bits |= BACKEND_CPU_FEATURE_AVX2;
        } else if (n > 0) {
            error_set(err, DFL_ERR_INVALID, "DFLASH_CPU_DISABLE=\"%s\": unknown code path \"%.*s\" (amx-bf16, amx, avx512, avx2)", v,
                      (int)n, p);
            return false;
        }
        p += n;
        if (*p == ',') p++;
    }
    return true;
}

static int cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > 256 ? 256 : (int)n);
}

backend *backend_cpu_new(const backend_cpu_params *params, dfl_error *err) {
    backend_cpu_params p = params ? *params : backend_cpu_default_params();
    if (p.n_threads > 1024 || p.n_threads_batch > 1024) {
        error_set(err, DFL_ERR_INVALID, "cpu backend: thread counts %d / %d exceed 1024", p.n_threads,
                  p.n_threads_batch);
        return NULL;
    }
    if (!cpu_env_disable(&p.disable_features, err)) return NULL;
    cpu_backend *be = calloc(1, sizeof(*be));
    if (be == NULL) {
        error_set(err, DFL_ERR_NOMEM, "cpu backend: out of memory");
        return NULL;
    }
    be->base.vt = &k_cpu_vtable;
    be->params = p;
    be->n_threads = p.n_threads > 0 ? p.n_threads : cpu_count();
    be->n_threads_batch = p.n_threads_batch > 0 ? p.n_threads_batch : cpu_count();
    be->features = cpu_features_detect() & ~p.disable_features;
    /* a feature level implies the ones below it */
    if (!(be->features & BACKEND_CPU_FEATURE_AVX2)) be->features = 0;
    if (!(be->features & BACKEND_CPU_FEATURE_AVX512)) {
        be->features &= ~(uint32_t)(BACKEND_CPU_FEATURE_AVX512_VNNI | BACKEND_CPU_FEATURE_AVX512_BF16 |
                                    BACKEND_CPU_FEATURE_AMX_INT8 | BACKEND_CPU_FEATURE_AMX_BF16);
    }
    cpu_kernels_select(&be->kernels, be->features);
    pthread_mutex_init(&be->exec_mu, NULL);
    int n_pool = be->n_threads > be->n_threads_batch ? be->n_threads : be->n_threads_batch;
    be->pool = cpu_pool_new(n_pool, err);
    be->shares = be->pool != NULL ? aligned_alloc(64, (size_t)cpu_pool_size(be->pool) * sizeof(cpu_share)) : NULL;
    if (be->pool == NULL || be->shares == NULL) {
        if (be->pool != NULL) error_set(err, DFL_ERR_NOMEM, "cpu backend: out of memory");
        cpu_pool_free(be->pool);
        free(be->shares);
        pthread_mutex_destroy(&be->exec_mu);
        free(be);
        return NULL;
    }
    for (int i = 0; i < cpu_pool_size(be->pool); i++) atomic_init(&be->shares[i].fb, 0);
    return &be->base;
}
