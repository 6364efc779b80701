#include "threadpool.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "platform/platform.h"

/* Waiting, in three stages: spin with pause for SPIN_NS (a decode step
 * issues short jobs back to back, microseconds apart), then yield the CPU
 * between checks until YIELD_NS (on a shared machine the thread we wait for
 * may need this core), then, for an idle worker, sleep on the condition
 * variable. The caller waiting for the last tasks never sleeps: they are
 * already running, it only yields. */
#define SPIN_NS 5000u
#define YIELD_NS 2000000u

typedef struct {
    cb_threadpool *tp;
    int index;
} worker_arg;

/* Tasks are split into one contiguous share per thread: a thread claims
 * its own share front to back, so consecutive tasks (adjacent weight rows)
 * stream from memory without a restart, and once it is empty it takes
 * tasks from the back of the others' shares, leaving their streams alone.
 * A share's word: generation (32 bits) | end (16) | next (16), so a claim
 * from either end is one compare-exchange that fails for a stale job. */
#define SHARE(gen, end, next) (((uint64_t)(gen) << 32) | ((uint64_t)(end) << 16) | (uint64_t)(next))
#define SHARE_GEN(w) ((uint32_t)((w) >> 32))
#define SHARE_END(w) ((uint32_t)((w) >> 16) & 0xFFFFu)
#define SHARE_NEXT(w) ((uint32_t)(w) & 0xFFFFu)

typedef struct {
    _Alignas(64) _Atomic uint64_t word;
} share;

struct cb_threadpool {
    int n;
    cb_thread **threads;
    worker_arg *args;
    cb_mutex *lock;
    cb_cond *wake;
    share *shares;                     /* [2][n]: first phase, second phase */
    _Alignas(64) _Atomic uint32_t gen; /* the current job; workers wake when it changes */
    _Alignas(64) atomic_int done;      /* tasks of the current job finished */
    _Alignas(64) atomic_int sleepers;  /* workers blocked on wake */
    atomic_int stop;
    /* Written by the caller before it publishes a job, read by workers only
     * after claiming one of its tasks: the job cannot finish (and these
     * change) before that task does. */
    cb_task_fn fn;
    void *ctx;
};

/* One task of share s for job gen, from its front or its back; -1 when the
 * share is empty (or holds another job). */
static int claim(share *s, uint32_t gen, int from_back) {
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    for (;;) {
        if (SHARE_GEN(w) != gen || SHARE_NEXT(w) >= SHARE_END(w)) return -1;
        const uint64_t taken = from_back ? w - (1u << 16) : w + 1;
        if (atomic_compare_exchange_weak_explicit(&s->word, &w, taken, memory_order_acq_rel, memory_order_acquire))
            return from_back ? (int)SHARE_END(w) - 1 : (int)SHARE_NEXT(w);
    }
}

/* Runs tasks of job gen, phase by phase, its own share first, until none
 * is left. */
static void run_tasks(cb_threadpool *tp, uint32_t gen, int worker) {
    for (int phase = 0; phase < 2; phase++)
        for (int k = 0; k < tp->n; k++) {
            share *s = &tp->shares[phase * tp->n + (worker + k) % tp->n];
            for (int task; (task = claim(s, gen, k != 0)) >= 0;) {
                tp->fn(tp->ctx, task, worker);
                atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
            }
        }
}

static void worker_main(void *p) {
    worker_arg *arg = p;
    cb_threadpool *tp = arg->tp;
    uint32_t seen = atomic_load(&tp->gen);
    for (;;) {
        uint64_t start = 0;
        uint32_t spins = 0, gen;
        while ((gen = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen) {
            if (atomic_load_explicit(&tp->stop, memory_order_relaxed)) return;
            if ((++spins & 63) != 0) {
                cb_cpu_relax();
                continue;
            }
            uint64_t now = cb_now_ns();
            if (!start) start = now;
            if (now - start < SPIN_NS) continue;
            if (now - start < YIELD_NS) {
                cb_thread_yield();
                continue;
            }
            cb_mutex_lock(tp->lock);
            atomic_fetch_add(&tp->sleepers, 1);
            while (atomic_load(&tp->gen) == seen && !atomic_load(&tp->stop)) cb_cond_wait(tp->wake, tp->lock);
            atomic_fetch_sub(&tp->sleepers, 1);
            cb_mutex_unlock(tp->lock);
            start = 0;
        }
        if (atomic_load(&tp->stop)) return;
        seen = gen;
        run_tasks(tp, gen, arg->index);
    }
}

cb_threadpool *cb_threadpool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    cb_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n = n_threads;
    tp->lock = cb_mutex_create();
    tp->wake = cb_cond_create();
    tp->threads = calloc((size_t)n_threads, sizeof *tp->threads);
    tp->args = calloc((size_t)n_threads, sizeof *tp->args);
    tp->shares = cb_aligned_alloc(2 * (size_t)n_threads * sizeof *tp->shares);
    if (!tp->lock || !tp->wake || !tp->threads || !tp->args || !tp->shares) {
        cb_threadpool_destroy(tp);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        tp->args[i] = (worker_arg){tp, i};
        tp->threads[i] = cb_thread_start(worker_main, &tp->args[i]);
        if (!tp->threads[i]) {
            cb_threadpool_destroy(tp);
            return NULL;
        }
    }
    return tp;
}

void cb_threadpool_destroy(cb_threadpool *tp) {
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    if (tp->lock) {
        cb_mutex_lock(tp->lock);
        cb_cond_broadcast(tp->wake);
        cb_mutex_unlock(tp->lock);
    }
    for (int i = 1; tp->threads && i < tp->n; i++)
        if (tp->threads[i]) cb_thread_join(tp->threads[i]);
    if (tp->lock) cb_mutex_destroy(tp->lock);
    if (tp->wake) cb_cond_destroy(tp->wake);
    free(tp->threads);
    free(tp->args);
    cb_aligned_free(tp->shares);
    free(tp);
}

int cb_threadpool_size(const cb_threadpool *tp) { return tp->n; }

void cb_wait_count(atomic_int *counter, int target) {
    uint64_t start = 0;
    uint32_t spins = 0;
    while (atomic_load_explicit(counter, memory_order_acquire) < target) {
        if ((++spins & 63) != 0) {
            cb_cpu_relax();
            continue;
        }
        uint64_t now = cb_now_ns();
        if (!start) start = now;
        if (now - start >= SPIN_NS) cb_thread_yield();
    }
}

void cb_threadpool_run2(cb_threadpool *tp, cb_task_fn fn, void *ctx, int n_first, int n_second) {
    const int n_tasks = n_first + n_second;
    if (n_tasks <= 0) return;
    if (tp->n == 1 || n_tasks == 1 || n_tasks > CB_MAX_TASKS) { /* callers keep n_tasks far below */
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    const uint32_t gen = atomic_load_explicit(&tp->gen, memory_order_relaxed) + 1;
    for (int w = 0; w < tp->n; w++) {
        int begin, end;
        cb_split(n_first, w, tp->n, &begin, &end);
        atomic_store_explicit(&tp->shares[w].word, SHARE(gen, end, begin), memory_order_relaxed);
        cb_split(n_second, w, tp->n, &begin, &end);
        atomic_store_explicit(&tp->shares[tp->n + w].word, SHARE(gen, n_first + end, n_first + begin),
                              memory_order_relaxed);
    }
    atomic_store(&tp->gen, gen); /* seq_cst: publishes the shares, ordered before the sleepers check */
    if (atomic_load(&tp->sleepers) > 0) {
        cb_mutex_lock(tp->lock);
        cb_cond_broadcast(tp->wake);
        cb_mutex_unlock(tp->lock);
    }
    run_tasks(tp, gen, 0);
    /* Every task is claimed; wait for the ones other workers are running. */
    cb_wait_count(&tp->done, n_tasks);
}

void cb_threadpool_run(cb_threadpool *tp, cb_task_fn fn, void *ctx, int n_tasks) {
    cb_threadpool_run2(tp, fn, ctx, n_tasks, 0);
}
