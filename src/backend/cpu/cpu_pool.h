/* cpu_pool.h: a persistent thread pool, created once with the CPU backend. A job is a function run
 * once for each share ith in [0, nth): the calling thread runs share 0, then every share no worker
 * has started yet (a worker asleep or descheduled does not hold the job up), and waits for the
 * shares the workers took. So the shares of a job must not wait for each other (no barrier inside
 * a job); they may run one after the other on one thread. Workers spin briefly between jobs, then
 * sleep on a condition variable. Jobs from several threads are serialized by the caller (cpu
 * backend's exec lock); the pool itself runs one job at a time. */
#ifndef DFL_BACKEND_CPU_POOL_H
#define DFL_BACKEND_CPU_POOL_H

#include "dflash.h"

typedef struct cpu_pool cpu_pool;

/* ith in [0, nth): this thread's index. */
typedef void (*cpu_pool_fn)(void *ctx, int ith, int nth);

/* A pool of n_threads threads (n_threads - 1 workers plus the caller). NULL + err on failure. */
cpu_pool *cpu_pool_new(int n_threads, dfl_error *err);
void cpu_pool_free(cpu_pool *pool);
int cpu_pool_size(const cpu_pool *pool);
/* Runs fn(ctx, ith, nth) once for each ith in [0, nth) (1 <= nth <= size), on up to nth threads,
 * and returns when all are done (their writes visible to the caller). */
void cpu_pool_run(cpu_pool *pool, int nth, cpu_pool_fn fn, void *ctx);
#ifdef DFL_TEST_HOOKS
#include <stdbool.h>
/* Test hook: worker ith (1 <= ith < size) takes no share while on (as if it were never scheduled). */
void cpu_pool_test_hold(cpu_pool *pool, int ith, bool on);
#endif

#endif
