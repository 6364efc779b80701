/* The HTTP application: routes, the request queue, and the scheduler that
 * runs every busy slot's next tokens as one engine batch per step
 * (continuous batching: a new request joins at the next step, a finished
 * or abandoned one frees its slot at once). */
#ifndef CB_APP_H
#define CB_APP_H

#include "engine.h"
#include "netloop.h"

typedef struct cb_app cb_app;

typedef struct {
    int queue_cap;       /* requests that may wait for a slot; more get 429 */
    const char *api_key; /* NULL: no auth; else "Authorization: Bearer KEY" everywhere but /health */
    int step_tokens;     /* most tokens a step carries while some requests decode (0: no limit) */
    const char *metrics_key; /* this key also opens /metrics (for scrapers); NULL: none */
    int metrics_public;  /* /metrics needs no key, even with api_key set */
    int verbose;         /* one line on stderr per generation request as it ends */
    const char *const *cors_origins; /* --cors-origin values ("*": any origin) */
    int n_cors_origins;  /* 0: no CORS headers, OPTIONS is 405 */
    int no_prefix_cache; /* never reuse a free slot's KV cache for a request that starts the same way */
} cb_app_options;

/* What cb_app_create allocated, for the start-up memory line: the pages
 * are touched as requests use them, so RSS approaches this under load. */
typedef struct {
    size_t total_bytes;
    int slots;
    size_t slot_bytes;   /* each slot's: a whole context's tokens, traces, log-probabilities, text */
    int prompts;
    size_t prompt_bytes; /* each running or queued request's prompt tokens */
    size_t vocab_bytes;  /* constrained decoding's vocabulary tables (0 without a tokenizer) */
    size_t sampler_bytes;
    size_t other_bytes;  /* request parsing, responses, chat templates, metrics */
} cb_app_memory_info;

/* Allocates every per-slot and per-queue-entry buffer; NULL on failure. */
cb_app *cb_app_create(cb_engine *engine, const cb_app_options *opt);
void cb_app_destroy(cb_app *app);
void cb_app_attach(cb_app *app, cb_netloop *loop);
void cb_app_memory(const cb_app *app, cb_app_memory_info *m);

/* netloop callbacks (app is the cb_app). */
void cb_app_on_request(void *app, cb_conn *c, const cb_http_request *req, const char *body, size_t len);
void cb_app_on_close(void *app, cb_conn_id id);

/* Runs one engine step over all busy slots; returns 1 while work remains. */
int cb_app_step(cb_app *app);
/* Slots generating, and requests waiting. */
int cb_app_busy(const cb_app *app);
int cb_app_queued(const cb_app *app);

/* Shutdown: refuse new requests (503) and drop the queue; running ones go
 * on. cb_app_cancel_all() then ends whatever still runs. */
void cb_app_drain(cb_app *app);
void cb_app_cancel_all(cb_app *app);

#endif
