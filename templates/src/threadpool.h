/* A fixed pool of worker threads created at start-up. run() splits a job
 * into n_tasks numbered tasks, one contiguous share of them per thread; the
 * caller (worker 0) and the workers claim their own share's tasks in order,
 * then what is left of the others' (from the back), and run() returns when
 * all are finished. Callers number tasks in memory order, so a thread's
 * tasks read one long stream of weights. A task's result must depend only on its
 * number, never on which worker ran it, so results do not depend on timing
 * or on the thread count; a worker that is descheduled (a busy, shared
 * machine) just claims fewer tasks instead of stalling everyone. */
#ifndef CB_THREADPOOL_H
#define CB_THREADPOOL_H

#include <stdatomic.h>

/* worker (0 .. size-1) is only for per-thread scratch space. */
typedef void (*cb_task_fn)(void *ctx, int task, int worker);

typedef struct cb_threadpool cb_threadpool;

#define CB_MAX_TASKS 65535 /* per run() */

cb_threadpool *cb_threadpool_create(int n_threads);
void cb_threadpool_destroy(cb_threadpool *tp);
int cb_threadpool_size(const cb_threadpool *tp);
/* Runs fn(ctx, task, worker) for task = 0 .. n_tasks-1 (n_tasks <= CB_MAX_TASKS). */
void cb_threadpool_run(cb_threadpool *tp, cb_task_fn fn, void *ctx, int n_tasks);
/* One job in two phases: tasks 0 .. n_first-1, then n_first ..
 * n_first+n_second-1, each phase split into shares as run() splits a job.
 * A thread moves on to the second phase once every first-phase task is
 * claimed, so a second-phase task may wait (cb_wait_count) for first-phase
 * results: what it waits for is already running. This saves the caller's
 * wait for the slowest thread, and a new job, between two dependent steps. */
void cb_threadpool_run2(cb_threadpool *tp, cb_task_fn fn, void *ctx, int n_first, int n_second);
/* Waits until *counter >= target (acquire): spins briefly, then yields the
 * core, which on a shared machine the thread being waited for may need. */
void cb_wait_count(atomic_int *counter, int target);

/* [begin, end) of n items that part p of n_parts owns. */
static inline void cb_split(int n, int p, int n_parts, int *begin, int *end) {
    int base = n / n_parts, extra = n % n_parts;
    *begin = p * base + (p < extra ? p : extra);
    *end = *begin + base + (p < extra ? 1 : 0);
}

#endif
