/* Server counters for GET /metrics (Prometheus text format 0.0.4). Fixed
 * memory: histograms have fixed buckets, expert counters one per
 * (layer, expert). */
#ifndef CB_METRICS_H
#define CB_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

#define CB_HIST_BUCKETS 12

typedef struct {
    const double *bounds;              /* upper bounds, seconds, ascending */
    int n_bounds;                      /* <= CB_HIST_BUCKETS; +Inf is implicit */
    uint64_t counts[CB_HIST_BUCKETS + 1];
    double sum;
    uint64_t count;
} cb_histogram;

/* Answers by status code; codes outside the table count as "other". */
#define CB_METRIC_STATUSES 12

typedef struct {
    uint64_t by_status[CB_METRIC_STATUSES + 1];
    uint64_t prompt_tokens, generated_tokens;
    uint64_t prompt_tokens_cached;     /* prompt tokens taken from a slot's KV cache, not computed */
    uint64_t prefix_cache_hits;        /* requests that took at least one */
    cb_histogram ttft, itl;            /* time to first token, inter-token latency */
    int layers, experts;
    uint64_t *expert_tokens;           /* [layers][experts]: tokens routed */
} cb_metrics;

int cb_metrics_init(cb_metrics *m, int layers, int experts); /* 0 or -1 */
void cb_metrics_free(cb_metrics *m);
void cb_metrics_status(cb_metrics *m, int status);
void cb_hist_observe(cb_histogram *h, double seconds);

/* Gauges sampled at the time of the scrape. */
typedef struct {
    int slots, busy_slots, queue_len, queue_cap, connections;
} cb_metrics_gauges;

/* Writes the exposition text into buf; returns its length, or 0 when it
 * does not fit. */
size_t cb_metrics_write(const cb_metrics *m, const cb_metrics_gauges *g, char *buf, size_t cap);

#endif
