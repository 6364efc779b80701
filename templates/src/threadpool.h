/* A fixed pool of worker threads created at start-up. run() hands the same
 * task to every worker (the caller is worker 0) and returns when all are
 * done; each worker takes its share by index, so the split of work, and
 * hence every result, does not depend on timing. */
#ifndef CB_THREADPOOL_H
#define CB_THREADPOOL_H

typedef void (*cb_task_fn)(void *ctx, int worker, int n_workers);

typedef struct cb_threadpool cb_threadpool;

cb_threadpool *cb_threadpool_create(int n_threads);
void cb_threadpool_destroy(cb_threadpool *tp);
int cb_threadpool_size(const cb_threadpool *tp);
void cb_threadpool_run(cb_threadpool *tp, cb_task_fn fn, void *ctx);

/* [begin, end) of n items that worker w of n_workers owns. */
static inline void cb_split(int n, int w, int n_workers, int *begin, int *end) {
    int base = n / n_workers, extra = n % n_workers;
    *begin = w * base + (w < extra ? w : extra);
    *end = *begin + base + (w < extra ? 1 : 0);
}

#endif
