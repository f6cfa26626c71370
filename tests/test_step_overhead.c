/* test_step_overhead.c: the per-step fixed costs of speculative decoding that were cut without
 * changing any result: the thread pool's caller runs the shares of a job that no worker has
 * started (a worker asleep or descheduled never holds a job up; run under TSan by `make check`,
 * whose filter `pool` selects these tests). */
#include "test.h"

#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

enum { HOLD_MAX = 3, HOLD_VALUES = 32 };

typedef struct hold_probe {
    int runs[HOLD_MAX];              /* runs of each share (each share writes only its own) */
    pthread_t who[HOLD_MAX];         /* the thread that ran it last */
    int in[HOLD_VALUES];             /* written by the caller before the job */
    int out[HOLD_MAX][HOLD_VALUES];  /* written by share ith, read by the caller after the job */
} hold_probe;

static void hold_fn(void *ctx, int ith, int nth) {
    (void)nth;
    hold_probe *p = ctx;
    p->runs[ith]++;
    p->who[ith] = pthread_self();
    for (int i = 0; i < HOLD_VALUES; i++) p->out[ith][i] = p->in[i] + ith;
}

/* `reps` jobs of nth shares; every share must run exactly once per job with the job's inputs;
 * shares in `caller_only` (a bit per ith) must have run on the calling thread. */
static void hold_jobs(test_ctx *t, cpu_pool *pool, int nth, int reps, unsigned caller_only) {
    static hold_probe p;
    memset(&p, 0, sizeof(p));
    for (int rep = 0; rep < reps; rep++) {
        for (int i = 0; i < HOLD_VALUES; i++) p.in[i] = rep * 31 + i;
        cpu_pool_run(pool, nth, hold_fn, &p);
        for (int ith = 0; ith < nth; ith++) {
            CHECK_EQ_INT(p.runs[ith], rep + 1);
            for (int i = 0; i < HOLD_VALUES; i++) {
                if (p.out[ith][i] != p.in[i] + ith) {
                    test_fail(t, __FILE__, __LINE__, "job %d: share %d saw a stale input", rep, ith);
                    return;
                }
            }
            if (caller_only & (1u << ith)) CHECK(pthread_equal(p.who[ith], pthread_self()));
        }
        if (rep % 10 == 9) { /* past the spinning: the free workers sleep and must be woken */
            struct timespec ts = {0, 2000000L};
            nanosleep(&ts, NULL);
        }
    }
}

TEST(pool_caller_runs_the_shares_of_held_workers) {
    dfl_error err = {0};
    cpu_pool *pool = cpu_pool_new(HOLD_MAX, &err);
    REQUIRE(pool != NULL);
    /* no worker takes a share: the caller runs all of them (a waiting caller would hang here) */
    cpu_pool_test_hold(pool, 1, true);
    cpu_pool_test_hold(pool, 2, true);
    hold_jobs(t, pool, 3, 40, 0x7u);
    hold_jobs(t, pool, 2, 20, 0x3u);
    /* one worker free: the held one's share still runs once per job, on the caller */
    cpu_pool_test_hold(pool, 1, false);
    hold_jobs(t, pool, 3, 40, 0x5u);
    /* all free again, after many jobs went by the held worker: nothing stale is run */
    cpu_pool_test_hold(pool, 2, false);
    hold_jobs(t, pool, 3, 40, 0x1u);
    hold_jobs(t, pool, 2, 20, 0x1u);
    cpu_pool_free(pool);
}
