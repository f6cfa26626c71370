/* cpu_pool.c: the persistent thread pool of the CPU backend (see cpu_pool.h).
 *
 * Protocol: the caller publishes a job (fn, ctx, nth), sets `pending` to the number of workers and
 * bumps `gen` (release). Every worker, participating or not, acknowledges each generation by
 * decrementing `pending` after running its share, so a job's fields are never overwritten while a
 * worker may still read them. Workers spin on `gen` for a while (pause, then yield) and then sleep
 * on `cv`; the caller only broadcasts when someone sleeps. */
#include "backend/cpu/cpu_pool.h"
#include "base/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define POOL_SPIN_PAUSES 20000 /* ~ a few hundred microseconds of pausing before yielding */
#define POOL_SPIN_YIELDS 200   /* then some sched_yield() rounds before sleeping */

typedef struct pool_worker {
    cpu_pool *pool;
    int ith;
    pthread_t thread;
} pool_worker;

struct cpu_pool {
    int n_threads;
    pool_worker *workers; /* [n_threads - 1] */
    int n_started;

    /* the current job (written by the caller before gen is bumped) */
    cpu_pool_fn fn;
    void *ctx;
    int nth;

    atomic_uint_fast64_t gen;
    atomic_int pending;
    atomic_bool stop;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_sleeping; /* guarded by mu */
};

static uint_fast64_t pool_wait_gen(cpu_pool *p, uint_fast64_t seen) {
    for (int i = 0; i < POOL_SPIN_PAUSES; i++) {
        uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        CPU_RELAX();
    }
    for (int i = 0; i < POOL_SPIN_YIELDS; i++) {
        uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    p->n_sleeping++;
    uint_fast64_t g;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
        pthread_cond_wait(&p->cv, &p->mu);
    }
    p->n_sleeping--;
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *pool_worker_main(void *arg) {
    pool_worker *w = arg;
    cpu_pool *p = w->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        seen = pool_wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        if (w->ith < p->nth) p->fn(p->ctx, w->ith, p->nth);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

static void pool_publish(cpu_pool *p) {
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    if (p->n_sleeping > 0) pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void pool_wait_done(cpu_pool *p) {
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
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
    cpu_pool *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        error_set(err, DFL_ERR_NOMEM, "thread pool: out of memory");
        return NULL;
    }
    p->n_threads = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->workers = calloc((size_t)(n_threads - 1), sizeof(pool_worker));
        if (p->workers == NULL) {
            error_set(err, DFL_ERR_NOMEM, "thread pool: out of memory");
            cpu_pool_free(p);
            return NULL;
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i + 1;
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
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
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

void cpu_pool_run(cpu_pool *p, int nth, cpu_pool_fn fn, void *ctx) {
    DFL_ASSERT(nth >= 1 && nth <= p->n_threads);
    if (nth == 1 || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->nth = nth;
    pool_publish(p);
    fn(ctx, 0, nth);
    pool_wait_done(p);
}
