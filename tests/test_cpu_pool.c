/* test_cpu_pool.c: the CPU backend's thread pool on its own (run under TSan by `make check`, whose
 * filter `pool` selects these tests): every thread index runs once per job, the job's inputs
 * written before cpu_pool_run are seen by the workers and their outputs by the caller after it
 * (plain, non-atomic memory: TSan reports a missing happens-before), workers that fell asleep
 * wake up, jobs may come from several threads (serialized by the caller), bad sizes are refused. */
#include "test.h"

#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

enum { POOL_MAX = 4, POOL_VALUES = 64 };

typedef struct pool_probe {
    int nth_seen[POOL_MAX];          /* nth as each index saw it */
    int runs[POOL_MAX];              /* runs of each index (each index writes only its own) */
    int in[POOL_VALUES];             /* written by the caller before the job */
    int out[POOL_MAX][POOL_VALUES];  /* written by index ith, read by the caller after the job */
} pool_probe;

static void probe_fn(void *ctx, int ith, int nth) {
    pool_probe *p = ctx;
    p->nth_seen[ith] = nth;
    p->runs[ith]++;
    for (int i = 0; i < POOL_VALUES; i++) p->out[ith][i] = p->in[i] * (ith + 1);
}

static void nap_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs `reps` jobs of nth threads on pool and checks every output; naps now and then so that the
 * workers go to sleep on the condition variable and must be woken. */
static void run_probe(test_ctx *t, cpu_pool *pool, pool_probe *p, int nth, int reps, int seed) {
    memset(p, 0, sizeof(*p));
    for (int rep = 0; rep < reps; rep++) {
        for (int i = 0; i < POOL_VALUES; i++) p->in[i] = seed + rep * 7 + i;
        cpu_pool_run(pool, nth, probe_fn, p);
        for (int ith = 0; ith < nth; ith++) {
            for (int i = 0; i < POOL_VALUES; i++) {
                if (p->out[ith][i] != p->in[i] * (ith + 1)) {
                    test_fail(t, __FILE__, __LINE__, "pool %d/%d, job %d: index %d saw a stale input",
                              nth, cpu_pool_size(pool), rep, ith);
                    return;
                }
            }
            CHECK_EQ_INT(p->nth_seen[ith], nth);
        }
        if (rep % 15 == 14) nap_ms(2); /* past the spinning: the workers sleep */
    }
    for (int ith = 0; ith < POOL_MAX; ith++) CHECK_EQ_INT(p->runs[ith], ith < nth ? reps : 0);
}

TEST(pool_runs_each_index_once) {
    static pool_probe probe;
    for (int size = 1; size <= POOL_MAX; size++) {
        dfl_error err = {0};
        cpu_pool *pool = cpu_pool_new(size, &err);
        REQUIRE(pool != NULL);
        CHECK_EQ_INT(cpu_pool_size(pool), size);
        for (int nth = 1; nth <= size; nth++) run_probe(t, pool, &probe, nth, 40, size * 100 + nth);
        /* a smaller job after a larger one: the idle workers stay out of it */
        if (size > 2) run_probe(t, pool, &probe, 2, 20, 9);
        cpu_pool_free(pool);
    }
}

typedef struct pool_client {
    test_ctx *t;
    cpu_pool *pool;
    pthread_mutex_t *mu;
    pool_probe probe;
    int seed;
} pool_client;

static void *pool_client_main(void *arg) {
    pool_client *c = arg;
    for (int rep = 0; rep < 25; rep++) {
        pthread_mutex_lock(c->mu); /* the CPU backend's exec lock plays this part */
        run_probe(c->t, c->pool, &c->probe, 3, 2, c->seed + rep);
        pthread_mutex_unlock(c->mu);
    }
    return NULL;
}

TEST(pool_jobs_from_several_threads) {
    dfl_error err = {0};
    cpu_pool *pool = cpu_pool_new(3, &err);
    REQUIRE(pool != NULL);
    pthread_mutex_t mu;
    pthread_mutex_init(&mu, NULL);
    static pool_client clients[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        memset(&clients[i], 0, sizeof(clients[i]));
        clients[i].t = t;
        clients[i].pool = pool;
        clients[i].mu = &mu;
        clients[i].seed = 1000 * (i + 1);
        REQUIRE(pthread_create(&th[i], NULL, pool_client_main, &clients[i]) == 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&mu);
    cpu_pool_free(pool);
}

TEST(pool_refuses_bad_sizes) {
    dfl_error err = {0};
    CHECK(cpu_pool_new(0, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "out of range");
    memset(&err, 0, sizeof(err));
    CHECK(cpu_pool_new(-3, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "-3");
    /* created and freed without a job */
    cpu_pool *pool = cpu_pool_new(4, &err);
    REQUIRE(pool != NULL);
    cpu_pool_free(pool);
}
