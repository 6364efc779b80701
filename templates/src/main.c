/* colibri-server: load the model, start the loop, serve until SIGINT/SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build_config.h"
#include "engine.h"
#include "platform/cpu_features.h"
#include "platform/platform.h"
#include "server/app.h"
#include "server/netloop.h"

static volatile sig_atomic_t stop_requested;
static void request_stop(void) { stop_requested = 1; }

static void usage(FILE *out) {
    fprintf(out,
            "usage: colibri-server --model DIR [options]\n"
            "  --model DIR               model folder (model-config.json, weights.cbw)\n"
            "  --host ADDR               address to bind (default 127.0.0.1)\n"
            "  --port N                  TCP port, 0 for any free one (default 8080)\n"
            "  --threads N               compute threads (default: one per CPU)\n"
            "  --slots N                 concurrent generations, at most %d (default %d)\n"
            "  --queue N                 requests that may wait for a slot; more get 429 (default 2 x slots)\n"
            "  --max-conns N             open connections; more get 503 (default 64)\n"
            "  --request-timeout-ms N    a request must arrive within this (default 10000)\n"
            "  --idle-timeout-ms N       a kept-alive connection may idle this long (default 30000)\n"
            "  --grace-ms N              on SIGTERM/SIGINT, let running requests finish this long (default 5000)\n"
            "  --step-tokens N           most tokens a step carries while requests decode, prompt tokens filling\n"
            "                            what decoding leaves; 0: no limit (default: the slot count)\n"
            "  --kv-cache f32|f16        what the KV cache holds: f16 halves its memory (default f32)\n"
            "  --api-key KEY             require 'Authorization: Bearer KEY' on /v1/ (also $COLIBRI_API_KEY)\n"
            "  --verbose                 log connection events\n"
            "built for %s, target %s, kernels %s, colibri %s\n",
            CB_MAX_SLOTS, CB_MAX_SLOTS, CB_SPECIALISED ? "model " CB_MODEL_NAME : "any model", CB_TARGET_NAME,
            CB_KERNELS_NAME, CB_TOOLKIT_VERSION);
}

static int parse_int(const char *flag, const char *text, int min, int max, int *out) {
    char *end;
    long v = strtol(text, &end, 10);
    if (*text == 0 || *end != 0 || v < min || v > max) {
        fprintf(stderr, "colibri-server: %s: got '%s', expected an integer in %d..%d\n", flag, text, min, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv) {
    cb_cpu_require("colibri-server"); /* first: exits 1, not SIGILL, on a CPU that lacks the build's ISA */
    const char *model = NULL, *host = "127.0.0.1", *api_key = getenv("COLIBRI_API_KEY");
    int port = 8080, threads = 0, slots = 0, queue = -1, max_conns = 64, verbose = 0;
    int request_timeout = 10000, idle_timeout = 30000, grace_ms = 5000, step_tokens = -1;
    enum cb_kv_type kv = CB_KV_F32;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(arg, "--version")) {
            printf("colibri-server %s (%s, %s)\n", CB_TOOLKIT_VERSION, CB_TARGET_NAME, CB_MODEL_CONFIG_HASH);
            return 0;
        }
        if (!strcmp(arg, "--verbose")) {
            verbose = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "colibri-server: %s needs a value (see --help)\n", arg);
            return 2;
        }
        const char *value = argv[++i];
        int bad = 0;
        if (!strcmp(arg, "--model")) model = value;
        else if (!strcmp(arg, "--host")) host = value;
        else if (!strcmp(arg, "--kv-cache")) {
            if (!strcmp(value, "f16")) kv = CB_KV_F16;
            else if (!strcmp(value, "f32")) kv = CB_KV_F32;
            else {
                fprintf(stderr, "colibri-server: --kv-cache: got '%s', expected f32 or f16\n", value);
                bad = 1;
            }
        }
        else if (!strcmp(arg, "--api-key")) api_key = value;
        else if (!strcmp(arg, "--port")) bad = parse_int(arg, value, 0, 65535, &port);
        else if (!strcmp(arg, "--threads")) bad = parse_int(arg, value, 0, 1024, &threads);
        else if (!strcmp(arg, "--slots")) bad = parse_int(arg, value, 1, CB_MAX_SLOTS, &slots);
        else if (!strcmp(arg, "--queue")) bad = parse_int(arg, value, 0, 65536, &queue);
        else if (!strcmp(arg, "--max-conns")) bad = parse_int(arg, value, 1, 65536, &max_conns);
        else if (!strcmp(arg, "--request-timeout-ms")) bad = parse_int(arg, value, 1, 3600000, &request_timeout);
        else if (!strcmp(arg, "--idle-timeout-ms")) bad = parse_int(arg, value, 1, 3600000, &idle_timeout);
        else if (!strcmp(arg, "--grace-ms")) bad = parse_int(arg, value, 0, 3600000, &grace_ms);
        else if (!strcmp(arg, "--step-tokens")) bad = parse_int(arg, value, 0, 1 << 20, &step_tokens);
        else {
            fprintf(stderr, "colibri-server: unknown option '%s' (see --help)\n", arg);
            return 2;
        }
        if (bad) return 2;
    }
    if (!model) {
        fprintf(stderr, "colibri-server: --model DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (api_key && !*api_key) api_key = NULL;

    char err[1024];
    cb_engine *engine = cb_engine_open(model, threads, slots, kv, err, sizeof err);
    if (!engine) {
        fprintf(stderr, "colibri-server: %s\n", err);
        return 1;
    }
    const int n_slots = cb_engine_n_slots(engine);
    cb_app_options opt = {queue >= 0 ? queue : 2 * n_slots, api_key, step_tokens >= 0 ? step_tokens : n_slots};
    cb_app *app = cb_app_create(engine, &opt);
    if (!app) {
        fprintf(stderr, "colibri-server: out of memory for request buffers\n");
        cb_engine_close(engine);
        return 1;
    }
    cb_netloop_config cfg;
    cb_netloop_config_init(&cfg);
    cfg.host = host;
    cfg.port = port;
    cfg.write_buf_size = 1u << 20; /* a whole response (with trace) must fit */
    cfg.max_conns = max_conns;
    cfg.request_timeout_ms = request_timeout;
    cfg.idle_timeout_ms = idle_timeout;
    cfg.verbose = verbose;
    cfg.app = app;
    cfg.on_request = cb_app_on_request;
    cfg.on_close = cb_app_on_close;
    cb_netloop *loop = cb_netloop_create(&cfg, err, sizeof err);
    if (!loop) {
        fprintf(stderr, "colibri-server: %s\n", err);
        cb_app_destroy(app);
        cb_engine_close(engine);
        return 1;
    }
    cb_app_attach(app, loop);
    cb_install_stop_handler(request_stop);
    const cb_dims *d = cb_engine_dims(engine);
    fprintf(stderr, "colibri-server: model %s (%u layers, %u experts top-%u), %d slots, queue %d, kernels %s, "
            "KV cache %s %.1f MiB%s\n",
            cb_engine_model_name(engine), d->n_layers, d->n_experts, d->top_k, n_slots,
            opt.queue_cap, CB_KERNELS_NAME, kv == CB_KV_F16 ? "f16" : "f32",
            (double)cb_engine_kv_bytes(engine) / (1 << 20), api_key ? ", API key required" : "");
    fprintf(stderr, "colibri-server: listening on http://%s:%d\n", host, cb_netloop_port(loop));

    int status = 0;
    uint64_t stop_at = 0; /* when draining: the end of the grace period */
    for (;;) {
        if (stop_requested && !stop_at) {
            /* Graceful: refuse new work, let running requests finish. */
            fprintf(stderr, "colibri-server: stopping: %d running requests get up to %d ms\n", cb_app_busy(app),
                    grace_ms);
            cb_app_drain(app);
            stop_at = cb_now_ns() + (uint64_t)grace_ms * 1000000u + 1;
        }
        if (stop_at) {
            if (cb_now_ns() >= stop_at) cb_app_cancel_all(app);
            if (!cb_app_busy(app)) break;
        }
        /* Busy: poll without waiting, then run the next step. Idle: sleep in
         * the poller until a request arrives. */
        if (cb_netloop_poll(loop, cb_app_busy(app) || cb_app_queued(app) ? 0 : 200) < 0) {
            fprintf(stderr, "colibri-server: network poller failed\n");
            status = 1;
            break;
        }
        cb_app_step(app);
    }
    /* Let the last answers leave (bounded: a client that does not read
     * loses them). */
    for (uint64_t until = cb_now_ns() + 500000000u; !status && cb_netloop_unsent(loop) && cb_now_ns() < until;)
        cb_netloop_poll(loop, 10);
    fprintf(stderr, "colibri-server: shut down\n");
    cb_netloop_destroy(loop);
    cb_app_destroy(app);
    cb_engine_close(engine);
    return status;
}
