/* colibri-server: load the model, start the loop, serve until SIGINT/SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build_config.h"
#include "engine.h"
#include "platform/platform.h"
#include "server/app.h"
#include "server/netloop.h"

static volatile sig_atomic_t stop_requested;
static void request_stop(void) { stop_requested = 1; }

static void usage(FILE *out) {
    fprintf(out,
            "usage: colibri-server --model DIR [--host ADDR] [--port N] [--threads N] [--slots N]\n"
            "  --model DIR    model folder (model-config.json, weights.cbw)\n"
            "  --host ADDR    address to bind (default 127.0.0.1)\n"
            "  --port N       TCP port, 0 for any free one (default 8080)\n"
            "  --threads N    compute threads (default: one per CPU)\n"
            "  --slots N      concurrent requests, at most %d (default %d)\n"
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
    const char *model = NULL, *host = "127.0.0.1";
    int port = 8080, threads = 0, slots = 0;
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
        if (i + 1 >= argc) {
            fprintf(stderr, "colibri-server: %s needs a value (see --help)\n", arg);
            return 2;
        }
        const char *value = argv[++i];
        if (!strcmp(arg, "--model")) model = value;
        else if (!strcmp(arg, "--host")) host = value;
        else if (!strcmp(arg, "--port")) { if (parse_int(arg, value, 0, 65535, &port)) return 2; }
        else if (!strcmp(arg, "--threads")) { if (parse_int(arg, value, 0, 1024, &threads)) return 2; }
        else if (!strcmp(arg, "--slots")) { if (parse_int(arg, value, 1, CB_MAX_SLOTS, &slots)) return 2; }
        else {
            fprintf(stderr, "colibri-server: unknown option '%s' (see --help)\n", arg);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "colibri-server: --model DIR is required\n");
        usage(stderr);
        return 2;
    }

    char err[1024];
    cb_engine *engine = cb_engine_open(model, threads, slots, err, sizeof err);
    if (!engine) {
        fprintf(stderr, "colibri-server: %s\n", err);
        return 1;
    }
    cb_app *app = cb_app_create(engine);
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
    cfg.max_conns = 32;
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
    fprintf(stderr, "colibri-server: model %s (%u layers, %u experts top-%u), %d slots, kernels %s\n",
            cb_engine_model_name(engine), d->n_layers, d->n_experts, d->top_k, cb_engine_n_slots(engine),
            CB_KERNELS_NAME);
    fprintf(stderr, "colibri-server: listening on http://%s:%d\n", host, cb_netloop_port(loop));

    int status = 0;
    while (!stop_requested) {
        /* Busy: poll without waiting, then run the next step. Idle: sleep in
         * the poller until a request arrives. */
        if (cb_netloop_poll(loop, cb_app_busy(app) ? 0 : 200) < 0) {
            fprintf(stderr, "colibri-server: network poller failed\n");
            status = 1;
            break;
        }
        cb_app_step(app);
    }
    fprintf(stderr, "colibri-server: shutting down\n");
    cb_netloop_destroy(loop);
    cb_app_destroy(app);
    cb_engine_close(engine);
    return status;
}
