#include "threadpool.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "platform/platform.h"

/* Workers spin briefly on the generation counter (a decode step issues many
 * short tasks back to back), then sleep on the condition variable. */
#define SPIN_ROUNDS 20000

typedef struct {
    cb_threadpool *tp;
    int index;
} worker_arg;

struct cb_threadpool {
    int n;
    cb_thread **threads;
    worker_arg *args;
    cb_mutex *lock;
    cb_cond *wake;
    atomic_uint generation;
    atomic_int pending;
    atomic_int stop;
    cb_task_fn fn;
    void *ctx;
};

static void worker_main(void *p) {
    worker_arg *arg = p;
    cb_threadpool *tp = arg->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ROUNDS) {
                cb_cpu_relax();
                continue;
            }
            cb_mutex_lock(tp->lock);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                cb_cond_wait(tp->wake, tp->lock);
            cb_mutex_unlock(tp->lock);
            spins = 0;
            if (atomic_load(&tp->stop)) return;
        }
        if (atomic_load(&tp->stop)) return;
        seen = gen;
        tp->fn(tp->ctx, arg->index, tp->n);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
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
    if (!tp->lock || !tp->wake || !tp->threads || !tp->args) {
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
        atomic_fetch_add(&tp->generation, 1);
        cb_cond_broadcast(tp->wake);
        cb_mutex_unlock(tp->lock);
    }
    for (int i = 1; tp->threads && i < tp->n; i++)
        if (tp->threads[i]) cb_thread_join(tp->threads[i]);
    if (tp->lock) cb_mutex_destroy(tp->lock);
    if (tp->wake) cb_cond_destroy(tp->wake);
    free(tp->threads);
    free(tp->args);
    free(tp);
}

int cb_threadpool_size(const cb_threadpool *tp) { return tp->n; }

void cb_threadpool_run(cb_threadpool *tp, cb_task_fn fn, void *ctx) {
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_release);
    cb_mutex_lock(tp->lock);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_acq_rel);
    cb_cond_broadcast(tp->wake);
    cb_mutex_unlock(tp->lock);
    fn(ctx, 0, tp->n);
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) cb_cpu_relax();
}
