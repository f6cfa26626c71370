/* cpu_pool.c: the persistent thread pool of the CPU backend (see cpu_pool.h).
 *
 * Protocol: the caller publishes a job by writing (fn, ctx) and then the job word
 * (generation << 16 | nth, release). Share ith >= 1 of job generation g is claimed exactly once,
 * by a compare-exchange of that worker's `claim` word from below g to g: either by its worker,
 * which then runs it and counts it in `n_done`, or by the caller, which after running share 0
 * claims every share no worker has started yet and runs it itself. The caller then waits only for
 * the shares workers claimed. So a worker that is asleep, or descheduled on a loaded machine, never
 * holds a job up: the caller does its part instead (the shares of a job must not wait for each
 * other, cpu_pool.h). A worker reads fn and ctx only after winning a claim, and the caller writes
 * them again only after every share of the previous job is done, so a worker that wakes late (its
 * share already taken, or several jobs gone by) reads nothing stale: it sees a claim at or past
 * the generation it saw and waits for the next job word.
 * Workers spin on the job word for a while (pause, then yield) and then sleep on `cv`; the caller
 * only takes the mutex and broadcasts when one sleeps (n_sleeping, seq_cst on both sides: a worker
 * announces itself and then rechecks the job word; the caller publishes and then checks
 * n_sleeping, so one of the two sees the other). */
#include "backend/cpu/cpu_pool.h"
#include "base/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define POOL_SPIN_PAUSES 20000 /* ~ a few hundred microseconds of pausing before yielding */
#define POOL_SPIN_YIELDS 200   /* then some sched_yield() rounds before sleeping */
#define POOL_NTH_BITS 16       /* the job word: generation << 16 | nth (nth <= 1024) */
#define POOL_LINE 64

typedef struct pool_worker {
    _Alignas(POOL_LINE) atomic_uint_fast64_t claim; /* the last generation whose share ith was claimed */
    struct cpu_pool *pool;
    int ith;
    pthread_t thread;
#ifdef DFL_TEST_HOOKS
    atomic_bool held; /* test hook: the worker takes no share (as if never scheduled) */
#endif
} pool_worker;

struct cpu_pool {
    int n_threads;
    pool_worker *workers; /* [n_threads - 1], one cache line each */
    int n_started;
    uint64_t gen;         /* the caller's generation counter (callers are serialized) */

    /* the current job: written by the caller before the job word, read by a worker that claimed a share */
    cpu_pool_fn fn;
    void *ctx;

    _Alignas(POOL_LINE) atomic_uint_fast64_t job; /* generation << POOL_NTH_BITS | nth */
    atomic_bool stop;
    _Alignas(POOL_LINE) atomic_int n_done;        /* shares of the current job finished by workers */
    atomic_int n_sleeping;

    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Waits for a job word other than `seen` and returns it. */
static uint_fast64_t pool_wait_job(cpu_pool *p, uint_fast64_t seen) {
    for (int i = 0; i < POOL_SPIN_PAUSES; i++) {
        uint_fast64_t j = atomic_load_explicit(&p->job, memory_order_acquire);
        if (j != seen) return j;
        CPU_RELAX();
    }
    for (int i = 0; i < POOL_SPIN_YIELDS; i++) {
        uint_fast64_t j = atomic_load_explicit(&p->job, memory_order_acquire);
        if (j != seen) return j;
        sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->n_sleeping, 1, memory_order_seq_cst);
    uint_fast64_t j;
    while ((j = atomic_load_explicit(&p->job, memory_order_seq_cst)) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub_explicit(&p->n_sleeping, 1, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
    return j;
}

/* Claims share w->ith of generation g for the calling thread; false when it is already claimed. */
static bool pool_claim(pool_worker *w, uint_fast64_t g) {
    uint_fast64_t c = atomic_load_explicit(&w->claim, memory_order_relaxed);
    while (c < g) {
        if (atomic_compare_exchange_weak_explicit(&w->claim, &c, g, memory_order_acq_rel, memory_order_relaxed)) return true;
    }
    return false;
}

static void *pool_worker_main(void *arg) {
    pool_worker *w = arg;
    cpu_pool *p = w->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        seen = pool_wait_job(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        const int nth = (int)(seen & (((uint_fast64_t)1 << POOL_NTH_BITS) - 1));
#ifdef DFL_TEST_HOOKS
        if (atomic_load_explicit(&w->held, memory_order_relaxed)) continue;
#endif
        if (w->ith >= nth || !pool_claim(w, seen >> POOL_NTH_BITS)) continue;
        p->fn(p->ctx, w->ith, nth);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
    return NULL;
}

static void pool_publish(cpu_pool *p, uint_fast64_t word) {
    atomic_store_explicit(&p->job, word, memory_order_seq_cst);
    if (atomic_load_explicit(&p->n_sleeping, memory_order_seq_cst) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void pool_wait_done(cpu_pool *p, int n) {
    int spins = 0;
    while (atomic_load_explicit(&p->n_done, memory_order_acquire) < n) {
        if (++spins < POOL_SPIN_PAUSES) {
            CPU_RELAX();
        } else {
            sched_yield();
        }
    }
}

cpu_pool *cpu_pool_new(int n_threads, dfl_error *err) {
    if (n_threads < 1 || n_threads > 1024) {
        error_set(err, DFL_ERR_INVALID, "thread pool: %d threads is out of range [1, 1024]", n_threads);
        return NULL;
    }
    cpu_pool *p = aligned_alloc(POOL_LINE, (sizeof(*p) + POOL_LINE - 1) / POOL_LINE * POOL_LINE);
    if (p == NULL) {
        error_set(err, DFL_ERR_NOMEM, "thread pool: out of memory");
        return NULL;
    }
    memset(p, 0, sizeof(*p));
    p->n_threads = n_threads;
    atomic_init(&p->job, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->n_sleeping, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        const size_t bytes = (size_t)(n_threads - 1) * sizeof(pool_worker); /* a multiple of the line */
        p->workers = aligned_alloc(POOL_LINE, bytes);
        if (p->workers == NULL) {
            error_set(err, DFL_ERR_NOMEM, "thread pool: out of memory");
            cpu_pool_free(p);
            return NULL;
        }
        memset(p->workers, 0, bytes);
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i + 1;
        atomic_init(&p->workers[i].claim, 0);
#ifdef DFL_TEST_HOOKS
        atomic_init(&p->workers[i].held, false);
#endif
        if (pthread_create(&p->workers[i].thread, NULL, pool_worker_main, &p->workers[i]) != 0) {
            error_set(err, DFL_ERR_INTERNAL, "thread pool: cannot create thread %d of %d", i + 2, n_threads);
            cpu_pool_free(p);
            return NULL;
        }
        p->n_started++;
    }
    return p;
}

void cpu_pool_free(cpu_pool *p) {
    if (p == NULL) return;
    if (p->n_started > 0) {
        atomic_store_explicit(&p->stop, true, memory_order_release);
        pthread_mutex_lock(&p->mu);
        p->gen++;
        atomic_store_explicit(&p->job, p->gen << POOL_NTH_BITS, memory_order_seq_cst); /* nth 0: no share */
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].thread, NULL);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int cpu_pool_size(const cpu_pool *p) { return p->n_threads; }

#ifdef DFL_TEST_HOOKS
void cpu_pool_test_hold(cpu_pool *p, int ith, bool on) {
    if (ith >= 1 && ith < p->n_threads) atomic_store_explicit(&p->workers[ith - 1].held, on, memory_order_relaxed);
}
#endif

void cpu_pool_run(cpu_pool *p, int nth, cpu_pool_fn fn, void *ctx) {
    DFL_ASSERT(nth >= 1 && nth <= p->n_threads);
    if (nth == 1 || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    const uint_fast64_t g = ++p->gen;
    pool_publish(p, g << POOL_NTH_BITS | (uint_fast64_t)nth);
    fn(ctx, 0, nth);
    /* the shares no worker has started: run here rather than wait for a sleeping or descheduled thread */
    int n_workers = 0;
    for (int i = 1; i < nth; i++) {
        if (pool_claim(&p->workers[i - 1], g)) fn(ctx, i, nth);
        else n_workers++;
    }
    pool_wait_done(p, n_workers);
}
