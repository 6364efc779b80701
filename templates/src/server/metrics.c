#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int status_codes[CB_METRIC_STATUSES] = {200, 400, 401, 404, 405, 408, 413, 429, 431, 500, 503, 504};
/* Seconds. Decoding a token of the tiny test model takes well under 1 ms,
 * of a real model tens of ms: the buckets span both. */
static const double ttft_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
static const double itl_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

int cb_metrics_init(cb_metrics *m, int layers, int experts) {
    memset(m, 0, sizeof *m);
    m->ttft.bounds = ttft_bounds;
    m->ttft.n_bounds = (int)(sizeof ttft_bounds / sizeof *ttft_bounds);
    m->itl.bounds = itl_bounds;
    m->itl.n_bounds = (int)(sizeof itl_bounds / sizeof *itl_bounds);
    m->layers = layers;
    m->experts = experts;
    m->expert_tokens = calloc((size_t)layers * (size_t)experts, sizeof *m->expert_tokens);
    return m->expert_tokens ? 0 : -1;
}

void cb_metrics_free(cb_metrics *m) {
    free(m->expert_tokens);
    m->expert_tokens = NULL;
}

void cb_metrics_status(cb_metrics *m, int status) {
    int i = 0;
    while (i < CB_METRIC_STATUSES && status_codes[i] != status) i++;
    m->by_status[i]++;
}

void cb_hist_observe(cb_histogram *h, double seconds) {
    int i = 0;
    while (i < h->n_bounds && seconds > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += seconds;
    h->count++;
}

typedef struct {
    char *buf;
    size_t cap, len;
    int full;
} text_out;

static void put(text_out *o, const char *fmt, ...) {
    if (o->full) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len) o->full = 1;
    else o->len += (size_t)n;
}

static void put_hist(text_out *o, const char *name, const char *help, const cb_histogram *h) {
    put(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)cum, name,
        h->sum, name, (unsigned long long)h->count);
}

size_t cb_metrics_write(const cb_metrics *m, const cb_metrics_gauges *g, char *buf, size_t cap) {
    text_out o = {buf, cap, 0, 0};
    put(&o, "# HELP colibri_requests_total Requests answered by the application, by HTTP status.\n"
            "# TYPE colibri_requests_total counter\n");
    for (int i = 0; i <= CB_METRIC_STATUSES; i++) {
        if (i < CB_METRIC_STATUSES)
            put(&o, "colibri_requests_total{status=\"%d\"} %llu\n", status_codes[i],
                (unsigned long long)m->by_status[i]);
        else
            put(&o, "colibri_requests_total{status=\"other\"} %llu\n", (unsigned long long)m->by_status[i]);
    }
    put(&o, "# HELP colibri_prompt_tokens_total Prompt tokens of admitted requests.\n"
            "# TYPE colibri_prompt_tokens_total counter\ncolibri_prompt_tokens_total %llu\n",
        (unsigned long long)m->prompt_tokens);
    put(&o, "# HELP colibri_prompt_tokens_cached_total Prompt tokens taken from a slot's KV cache (prefix cache), "
            "not computed.\n# TYPE colibri_prompt_tokens_cached_total counter\ncolibri_prompt_tokens_cached_total %llu\n",
        (unsigned long long)m->prompt_tokens_cached);
    put(&o, "# HELP colibri_prefix_cache_hits_total Requests that took part of their prompt from a slot's KV cache.\n"
            "# TYPE colibri_prefix_cache_hits_total counter\ncolibri_prefix_cache_hits_total %llu\n",
        (unsigned long long)m->prefix_cache_hits);
    put(&o, "# HELP colibri_generated_tokens_total Tokens generated.\n"
            "# TYPE colibri_generated_tokens_total counter\ncolibri_generated_tokens_total %llu\n",
        (unsigned long long)m->generated_tokens);
    put_hist(&o, "colibri_time_to_first_token_seconds", "From the request's arrival to its first token.",
             &m->ttft);
    put_hist(&o, "colibri_inter_token_latency_seconds", "Between consecutive tokens of a request.", &m->itl);
    put(&o, "# HELP colibri_slots Concurrent generation slots.\n# TYPE colibri_slots gauge\ncolibri_slots %d\n",
        g->slots);
    put(&o, "# HELP colibri_busy_slots Slots generating now.\n# TYPE colibri_busy_slots gauge\n"
            "colibri_busy_slots %d\n", g->busy_slots);
    put(&o, "# HELP colibri_queue_length Requests waiting for a slot.\n# TYPE colibri_queue_length gauge\n"
            "colibri_queue_length %d\n", g->queue_len);
    put(&o, "# HELP colibri_queue_capacity Most requests that may wait (then 429).\n"
            "# TYPE colibri_queue_capacity gauge\ncolibri_queue_capacity %d\n", g->queue_cap);
    put(&o, "# HELP colibri_open_connections Open client connections.\n"
            "# TYPE colibri_open_connections gauge\ncolibri_open_connections %d\n", g->connections);
    put(&o, "# HELP colibri_expert_activations_total Tokens routed to each expert, per layer.\n"
            "# TYPE colibri_expert_activations_total counter\n");
    for (int l = 0; l < m->layers; l++)
        for (int e = 0; e < m->experts; e++)
            put(&o, "colibri_expert_activations_total{layer=\"%d\",expert=\"%d\"} %llu\n", l, e,
                (unsigned long long)m->expert_tokens[(size_t)l * m->experts + e]);
    return o.full ? 0 : o.len;
}
