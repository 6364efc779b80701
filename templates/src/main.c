/* colibri-server: load the model, start the loop, serve until SIGINT/SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build_config.h"
#include "embedded.h"
#include "engine.h"
#include "platform/net.h"
#include "model_config.h"
#include "platform/cpu_features.h"
#include "platform/platform.h"
#include "server/app.h"
#include "server/netloop.h"
#include "sha256.h"

#define CB_MAX_CORS_ORIGINS 16

static volatile sig_atomic_t stop_requested;
static void request_stop(void) { stop_requested = 1; }

static void usage(FILE *out) {
    fprintf(out,
            "usage: colibri-server [--model DIR] [options]\n"
            "  --model DIR               model folder: model-config.json and the weights file it names; needed\n"
            "                            unless this executable carries its model (colibri-build\n"
            "                            --embed-weights), which --model then replaces\n"
            "  --host ADDR               address to bind (default 127.0.0.1)\n"
            "  --port N                  TCP port, 0 for any free one (default 8080)\n"
            "  --threads N               compute threads (default: one per CPU)\n"
            "  --slots N                 concurrent generations, at most %d (default %d)\n"
            "  --queue N                 requests that may wait for a slot; more get 429 (default 2 x slots)\n"
            "  --max-conns N             open connections (default 256); when full, the longest-idle one is\n"
            "                            closed for a newcomer; with all busy, 8 spare entries answer /health\n"
            "                            and 503 to the rest\n"
            "  --request-timeout-ms N    a request must arrive within this, else 408 (default 10000)\n"
            "  --idle-timeout-ms N       a kept-alive connection may idle this long (default 30000)\n"
            "  --grace-ms N              on SIGTERM/SIGINT, let running requests finish this long (default 5000)\n"
            "  --step-tokens N           most tokens a step carries while requests decode, prompt tokens filling\n"
            "                            what decoding leaves; 0: no limit (default: the slot count)\n"
            "  --kv-cache f32|f16        what the KV cache holds: f16 halves its memory and the bytes attention\n"
            "                            reads (default: the model config's kv_cache, else f16, f32 for f32\n"
            "                            weights: their parity bound); f16-llama (a GGUF conversion's default):\n"
            "                            f16 attended (and GELU rounded) as llama.cpp's CPU backend does: its\n"
            "                            answers on its GGUF files\n"
            "  --no-prefix-cache         compute every prompt whole: never start a request after the tokens a free\n"
            "                            slot's KV cache holds from its last request (the answer is the same)\n"
            "  --max-memory SIZE         RAM to fit in (512M, 8G, 8GiB or bytes; K/M/G/T are powers of 1024):\n"
            "                            fewer slots when the KV cache of all would not fit beside what one\n"
            "                            token needs, exit 1 when one slot does not fit (default %s)\n"
            "  --api-key KEY             require 'Authorization: Bearer KEY' on every endpoint but /health\n"
            "  --api-key-file PATH       the same, the key read from the file's first line (not shown in ps);\n"
            "                            either flag overrides $COLIBRI_API_KEY\n"
            "  --metrics-key KEY         /metrics also takes this key, e.g. for a scraper (also\n"
            "                            $COLIBRI_METRICS_KEY); with --api-key, /metrics needs one of the two\n"
            "  --metrics-public          /metrics needs no key even with --api-key\n"
            "  --cors-origin ORIGIN      let web pages of ORIGIN (https://app.example:8443; * for any) call the API\n"
            "                            from a browser: Access-Control-Allow-Origin on answers, preflight OPTIONS\n"
            "                            answered 204; repeat for several origins, at most %d (default: no CORS)\n"
            "  --verbose                 log connection events, and a line per generation request as it ends (id,\n"
            "                            status, tokens in/out, queue/prompt/decode ms)\n"
            "  --verify                  check the model folder and exit: what start-up checks, then the weights\n"
            "                            file's sha256 against model-config.json's weights.sha256 (reads the\n"
            "                            whole file); exit 0 and 'ok' when all agree (without --model: the\n"
            "                            model this executable carries, against the sha256 it records)\n"
            "built for %s, target %s, kernels %s, colibri %s\n",
            CB_MAX_SLOTS, CB_MAX_SLOTS, CB_DEFAULT_MAX_MEMORY ? CB_DEFAULT_MAX_MEMORY_TEXT " (set at build)" : "none",
            CB_MAX_CORS_ORIGINS,
            CB_SPECIALISED ? "model " CB_MODEL_NAME : "any model", CB_TARGET_NAME,
            CB_KERNELS_NAME, CB_TOOLKIT_VERSION);
}

/* A key from the first line of a file (trailing blanks and line end
 * dropped), so it shows in no process list. 0, or -1 with a message. */
static int read_key_file(const char *path, char *key, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "colibri-server: --api-key-file: cannot open '%s'\n", path);
        return -1;
    }
    size_t n = 0;
    int ch;
    while ((ch = fgetc(f)) != EOF && ch != '\n' && n + 1 < cap) key[n++] = (char)ch;
    const int too_long = ch != EOF && ch != '\n';
    fclose(f);
    while (n > 0 && (key[n - 1] == '\r' || key[n - 1] == ' ' || key[n - 1] == '\t')) n--;
    key[n] = 0;
    if (too_long || n == 0) {
        fprintf(stderr, "colibri-server: --api-key-file: '%s': %s\n", path,
                too_long ? "the first line is longer than 4095 bytes" : "the first line holds no key");
        return -1;
    }
    return 0;
}

typedef struct {
    uint64_t start_ns, next_report;
} verify_progress;

static void verify_report(void *p, uint64_t done) {
    verify_progress *v = p;
    if (done < v->next_report) return;
    v->next_report += 1ull << 30; /* a line a GiB: a big file takes seconds a GiB */
    const double s = (double)(cb_now_ns() - v->start_ns) / 1e9;
    fprintf(stderr, "colibri-server: verify: %.0f GiB read, %.0f MB/s\n", (double)done / (1ull << 30),
            (double)done / 1e6 / (s > 0 ? s : 1e-9));
}

/* --verify: the checks start-up makes (config against header, tensor
 * table, the shape this server was built for), then the weights file's
 * sha256 against the config's. Returns the exit status. */
static int verify_model(const char *model) {
    static cb_model_config cfg;
    char err[1024], path[4096], got[65];
    cb_engine *engine = cb_engine_open(model, 1, 1, CB_KV_F32, err, sizeof err);
    if (!engine || cb_model_config_load(&cfg, model, err, sizeof err) != 0 ||
        cb_model_config_weights_path(&cfg, model, path, sizeof path, err, sizeof err) != 0) {
        fprintf(stderr, "colibri-server: %s\n", err);
        cb_engine_close(engine);
        return 1;
    }
    cb_engine_close(engine);
    if (!cfg.sha256[0]) {
        fprintf(stderr, "colibri-server: %s has no weights.sha256: nothing to check %s against "
                "(colibri-build synth and convert record it)\n", cfg.path, path);
        return 1;
    }
    verify_progress prog = {cb_now_ns(), 1ull << 30};
    uint64_t bytes = 0;
    if (cb_sha256_file(path, got, &bytes, verify_report, &prog, err, sizeof err) != 0) {
        fprintf(stderr, "colibri-server: %s\n", err);
        return 1;
    }
    const double s = (double)(cb_now_ns() - prog.start_ns) / 1e9;
    fprintf(stderr, "colibri-server: verify: %s: %.1f MiB hashed in %.2f s (%.0f MB/s)\n", path,
            (double)bytes / (1 << 20), s, (double)bytes / 1e6 / (s > 0 ? s : 1e-9));
    if (strcmp(got, cfg.sha256) != 0) {
        fprintf(stderr, "colibri-server: %s: sha256 mismatch: expected %s (weights.sha256 in %s), got %s\n", path,
                cfg.sha256, cfg.path, got);
        return 1;
    }
    printf("%s: ok (sha256 %s)\n", path, got);
    return 0;
}

/* The sha256 of a mapped range, in 1 MiB pieces with a progress line a GiB. */
static void sha256_mapped(const cb_mapped_file *f, char hex[65], verify_progress *prog) {
    cb_sha256 s;
    uint8_t digest[32];
    cb_sha256_init(&s);
    for (uint64_t at = 0; at < f->size; at += 1u << 20) {
        const uint64_t n = f->size - at < (1u << 20) ? f->size - at : (1u << 20);
        cb_sha256_update(&s, f->data + at, (size_t)n);
        verify_report(prog, at + n);
    }
    cb_sha256_final(&s, digest);
    cb_sha256_hex(digest, hex);
}

/* --verify without --model: the model this executable carries. The start-up
 * checks, then the weights' sha256 against the one the executable records
 * (and the config's weights.sha256, when it has one). */
static int verify_embedded(void) {
    static cb_model_config cfg;
    static cb_embedded m;
    char err[1024], got[65];
    cb_engine *engine = cb_engine_open(NULL, 1, 1, CB_KV_F32, err, sizeof err);
    if (!engine) {
        fprintf(stderr, "colibri-server: %s\n", err);
        return 1;
    }
    cb_engine_close(engine);
    if (cb_embedded_open(&m, err, sizeof err) != 1) {
        fprintf(stderr, "colibri-server: %s\n", err);
        return 1;
    }
    cb_mapped_file weights;
    char *text = malloc(m.config_bytes + 1); /* NUL-terminated for the JSON reader */
    if (text) {
        memcpy(text, m.config, m.config_bytes);
        text[m.config_bytes] = 0;
    }
    if (!text || cb_model_config_parse(&cfg, text, m.config_bytes, m.label, err, sizeof err) != 0 ||
        cb_map_file_range(NULL, m.weights_offset, m.weights_bytes, &weights, err, sizeof err) != 0) {
        fprintf(stderr, "colibri-server: %s\n", text ? err : "out of memory");
        free(text);
        cb_embedded_close(&m);
        return 1;
    }
    free(text);
    verify_progress prog = {cb_now_ns(), 1ull << 30};
    sha256_mapped(&weights, got, &prog);
    cb_unmap_file(&weights);
    const double s = (double)(cb_now_ns() - prog.start_ns) / 1e9;
    fprintf(stderr, "colibri-server: verify: %s (embedded weights): %.1f MiB hashed in %.2f s (%.0f MB/s)\n",
            m.label, (double)m.weights_bytes / (1 << 20), s, (double)m.weights_bytes / 1e6 / (s > 0 ? s : 1e-9));
    const char *want = strcmp(got, m.weights_sha256) != 0 ? m.weights_sha256
                       : cfg.sha256[0] && strcmp(got, cfg.sha256) != 0 ? cfg.sha256 : NULL;
    if (want) {
        fprintf(stderr, "colibri-server: %s (embedded weights, bytes %llu..%llu): sha256 mismatch: expected %s (%s), "
                "got %s\n", m.label, (unsigned long long)m.weights_offset,
                (unsigned long long)(m.weights_offset + m.weights_bytes), want,
                want == cfg.sha256 ? "weights.sha256 in the embedded model-config.json" : "the embedded record", got);
        cb_embedded_close(&m);
        return 1;
    }
    printf("%s (embedded weights): ok (sha256 %s)\n", m.label, got);
    cb_embedded_close(&m);
    return 0;
}

/* Bytes as a person reads them. */
static const char *size_text(size_t bytes, char *buf, size_t len) {
    if (bytes >= (size_t)1 << 30) snprintf(buf, len, "%.2f GiB", (double)bytes / (1 << 30));
    else if (bytes >= (size_t)1 << 20) snprintf(buf, len, "%.1f MiB", (double)bytes / (1 << 20));
    else snprintf(buf, len, "%.1f KiB", (double)bytes / (1 << 10));
    return buf;
}

/* --max-memory's value: bytes, or a number with K, M, G or T (powers of
 * 1024), optionally followed by "B" or "iB". 0, or -1 with a message. */
static int parse_size(const char *flag, const char *text, size_t *out) {
    char *end;
    const double v = strtod(text, &end);
    double unit = 1;
    const char *u = end;
    if (*u == 'K' || *u == 'k') unit = 0x1p10, u++;
    else if (*u == 'M' || *u == 'm') unit = 0x1p20, u++;
    else if (*u == 'G' || *u == 'g') unit = 0x1p30, u++;
    else if (*u == 'T' || *u == 't') unit = 0x1p40, u++;
    if (unit > 1 && *u == 'i') u++;
    if (*u == 'B' || *u == 'b') u++;
    const double bytes = v * unit;
    if (end == text || *u != 0 || !(bytes >= 1) || bytes > 0x1p60) {
        fprintf(stderr, "colibri-server: %s: got '%s', expected a size such as 512M, 8G, 8GiB or a number of bytes\n",
                flag, text);
        return -1;
    }
    *out = (size_t)bytes;
    return 0;
}

/* The start-up (and --help --model) line: what the server needs. */
static void print_memory(const cb_memory_budget *m) {
    char need[32], dense[32], exp[32], kv[32], slot[32], arena[32], least[32];
    fprintf(stderr, "colibri-server: memory: needs %s (dense weights %s, experts %s, KV cache %s = %d slots x %s, "
            "arena %s); runs with at least %s (experts paged from disk)\n",
            size_text(m->needs, need, sizeof need), size_text(m->dense, dense, sizeof dense),
            size_text(m->experts, exp, sizeof exp), size_text((size_t)m->slots * m->kv_per_slot, kv, sizeof kv),
            m->slots, size_text(m->kv_per_slot, slot, sizeof slot), size_text(m->arena, arena, sizeof arena),
            size_text(m->least, least, sizeof least));
    char full[32], sliding[32];
    if (m->kv_window)
        fprintf(stderr, "colibri-server: memory: KV cache per slot %s: full-attention layers %s, sliding-window layers "
                "%s (a ring of %u positions for a window of %u)\n", slot,
                size_text(m->kv_full_per_slot, full, sizeof full),
                size_text(m->kv_sliding_per_slot, sliding, sizeof sliding), m->kv_sliding_rows, m->kv_window);
    else
        fprintf(stderr, "colibri-server: memory: KV cache per slot %s: full-attention layers %s, no sliding-window "
                "layers\n", slot, size_text(m->kv_full_per_slot, full, sizeof full));
}

/* The server's own buffers, beside the model's needs: allocated at start,
 * their pages touched as requests and connections use them. */
static void print_request_memory(const cb_app *app, const cb_netloop *loop) {
    cb_app_memory_info m;
    cb_app_memory(app, &m);
    size_t per_conn = 0, large = 0;
    const size_t net = cb_netloop_bytes(loop, &per_conn, &large);
    char total[32], slot[32], prompt[32], vocab[32], sampler[32], other[32], nets[32], conn[32], bodies[32];
    fprintf(stderr, "colibri-server: memory: request buffers %s beside that (%d slots x %s: a whole context's tokens, "
            "traces, log-probabilities and text; %d requests x %s of prompt; constrained-decoding tables %s; "
            "sampler %s; the rest %s), connections %s (%d x %s; large request bodies %s)\n",
            size_text(m.total_bytes, total, sizeof total), m.slots, size_text(m.slot_bytes, slot, sizeof slot),
            m.prompts, size_text(m.prompt_bytes, prompt, sizeof prompt), size_text(m.vocab_bytes, vocab, sizeof vocab),
            size_text(m.sampler_bytes, sampler, sizeof sampler), size_text(m.other_bytes, other, sizeof other),
            size_text(net, nets, sizeof nets), cb_netloop_conns(loop), size_text(per_conn, conn, sizeof conn),
            size_text(large, bodies, sizeof bodies));
}

/* Why a server under --max-memory may run slower than it could. */
static void print_memory_limit(const cb_memory_budget *m, size_t max_memory) {
    char a[32], b[32];
    if (max_memory && m->needs > max_memory)
        fprintf(stderr, "colibri-server: memory: --max-memory %s is below the %s it needs: experts the RAM cannot "
                "hold are read from disk again as tokens route to them\n", size_text(max_memory, a, sizeof a),
                size_text(m->needs, b, sizeof b));
}

/* With --max-memory: the slots whose KV caches fit beside what one token
 * needs (its weights and the arena), at most `want`; 0 when not even one
 * does (the message printed). The context per slot is compiled into the
 * cache's layout, so slots are what gives way. */
static int slots_within(const char *model, int threads, int want, enum cb_kv_type kv, size_t max_memory) {
    char err[1024], a[32], b[32], c[32], d2[32], e2[32];
    cb_engine *probe = cb_engine_open(model, threads, 1, kv, err, sizeof err);
    if (!probe) {
        fprintf(stderr, "colibri-server: %s\n", err);
        return 0;
    }
    cb_memory_budget m;
    cb_engine_memory(probe, &m);
    const unsigned ctx = cb_engine_dims(probe)->context_len;
    cb_engine_close(probe);
    if (m.least > max_memory) {
        fprintf(stderr, "colibri-server: --max-memory: needs at least %s (weights one token keeps resident %s, "
                "KV cache of 1 slot %s, arena %s), --max-memory is %s\n", size_text(m.least, a, sizeof a),
                size_text(m.least_weights, b, sizeof b), size_text(m.kv_per_slot, c, sizeof c),
                size_text(m.arena, d2, sizeof d2), size_text(max_memory, e2, sizeof e2));
        return 0;
    }
    const size_t fit = (max_memory - m.least_weights - m.arena) / m.kv_per_slot;
    if (fit >= (size_t)want) return want;
    fprintf(stderr, "colibri-server: --max-memory %s: %d slots instead of %d (KV cache %s a slot: its whole "
            "context of %u tokens)\n", size_text(max_memory, a, sizeof a), (int)fit, want,
            size_text(m.kv_per_slot, b, sizeof b), ctx);
    return (int)fit;
}

/* The engine with `slots` slots (0: as built), fewer when their KV caches
 * do not fit in max_memory (0: no limit); NULL, the reason printed, when it
 * cannot open or one slot does not fit. */
static cb_engine *open_within(const char *model, int threads, int slots, enum cb_kv_type kv, size_t max_memory) {
    char err[1024];
    if (max_memory) {
        slots = slots_within(model, threads, slots > 0 ? slots : CB_MAX_SLOTS, kv, max_memory);
        if (slots < 1) return NULL;
    }
    cb_engine *engine = cb_engine_open(model, threads, slots, kv, err, sizeof err);
    if (!engine) fprintf(stderr, "colibri-server: %s\n", err);
    return engine;
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
    int port = 8080, threads = 0, slots = 0, queue = -1, max_conns = 256, verbose = 0, verify = 0;
    const char *api_key_flag = NULL, *api_key_file = NULL, *metrics_key = getenv("COLIBRI_METRICS_KEY");
    const char *metrics_key_flag = NULL;
    static char api_key_buf[4096];
    int metrics_public = 0, help = 0, no_prefix_cache = 0;
    size_t max_memory = CB_DEFAULT_MAX_MEMORY;
    int request_timeout = 10000, idle_timeout = 30000, grace_ms = 5000, step_tokens = -1;
    enum cb_kv_type kv = CB_KV_AUTO;
    const char *cors[CB_MAX_CORS_ORIGINS];
    int n_cors = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            help = 1; /* after the other flags: with --model, the model's memory budget too */
            continue;
        }
        if (!strcmp(arg, "--version")) {
            printf("colibri-server %s (%s, %s)\n", CB_TOOLKIT_VERSION, CB_TARGET_NAME, CB_MODEL_CONFIG_HASH);
            return 0;
        }
        if (!strcmp(arg, "--verbose")) {
            verbose = 1;
            continue;
        }
        if (!strcmp(arg, "--metrics-public")) {
            metrics_public = 1;
            continue;
        }
        if (!strcmp(arg, "--no-prefix-cache")) {
            no_prefix_cache = 1;
            continue;
        }
        if (!strcmp(arg, "--verify")) {
            verify = 1;
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
            else if (!strcmp(value, "f16-llama")) kv = CB_KV_F16_LLAMA;
            else {
                fprintf(stderr, "colibri-server: --kv-cache: got '%s', expected f32, f16 or f16-llama\n", value);
                bad = 1;
            }
        }
        else if (!strcmp(arg, "--max-memory")) bad = parse_size(arg, value, &max_memory);
        else if (!strcmp(arg, "--api-key")) api_key_flag = value;
        else if (!strcmp(arg, "--api-key-file")) api_key_file = value;
        else if (!strcmp(arg, "--metrics-key")) metrics_key = metrics_key_flag = value;
        else if (!strcmp(arg, "--cors-origin")) {
            /* An origin is scheme://host[:port], sent back verbatim in a header line. */
            int ok = *value && n_cors < CB_MAX_CORS_ORIGINS;
            for (const char *p = value; ok && *p; p++) ok = *p > ' ' && *p < 127 && *p != ',';
            if (!ok) {
                fprintf(stderr, "colibri-server: --cors-origin: got '%s', expected one origin like "
                        "https://app.example.com (or *), at most %d of them\n", value, CB_MAX_CORS_ORIGINS);
                bad = 1;
            } else cors[n_cors++] = value;
        }
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
    /* Without --model, the model this executable carries (none: an error);
     * with it, that folder, even when the executable carries one (the file
     * then serves a re-converted model of the same shape; the build's shape
     * is still checked), and the executable itself is not opened (a sandbox
     * without /proc still runs it). */
    char embedded_err[1024];
    cb_embedded probe;
    const int carries = model ? 0 : cb_embedded_open(&probe, embedded_err, sizeof embedded_err);
    if (carries == 1) cb_embedded_close(&probe);
    if (!model && carries < 0) {
        fprintf(stderr, "colibri-server: %s\n", embedded_err);
        return 1;
    }
    if (help) {
        usage(stdout);
        if (!model && carries == 1) printf("model: carried by this executable (give --model DIR to serve another)\n");
        if (!model && carries != 1) {
#if CB_SPECIALISED
            const cb_dims *d = &cb_compiled_dims;
            char slot[32];
            const int f32 = d->weight_dtype == CB_F32; /* CB_KV_AUTO's choice */
            printf("memory: the KV cache takes %s a slot (%u tokens, %s; --kv-cache %s: %s); give --model DIR "
                   "with --help for the whole budget (weights, KV cache, arena)\n",
                   size_text(CB_KV_ELEMENTS_PER_SLOT * (f32 ? 4 : 2), slot, sizeof slot), d->context_len,
                   f32 ? "f32" : "f16", f32 ? "f16" : "f32", f32 ? "half" : "twice");
#else
            printf("memory: give --model DIR with --help for the model's budget (weights, KV cache, arena)\n");
#endif
            return 0;
        }
        fflush(stdout);
        cb_engine *engine = open_within(model, threads, slots, kv, max_memory);
        if (!engine) return 1;
        cb_memory_budget m;
        cb_engine_memory(engine, &m);
        cb_engine_close(engine);
        print_memory(&m);
        print_memory_limit(&m, max_memory);
        return 0;
    }
    if (!model && carries != 1) {
        fprintf(stderr, "colibri-server: --model DIR is required: %s\n", embedded_err);
        usage(stderr);
        return 2;
    }

    /* An empty key would silently serve without authentication: a flag that
     * asks for a key must give one (an empty $COLIBRI_API_KEY counts as unset). */
    if ((api_key_flag && !*api_key_flag) || (metrics_key_flag && !*metrics_key_flag)) {
        fprintf(stderr, "colibri-server: %s: the key is empty; give a key, or leave the flag out to serve "
                "without one\n", api_key_flag && !*api_key_flag ? "--api-key" : "--metrics-key");
        return 2;
    }
    if (api_key_flag && api_key_file) {
        fprintf(stderr, "colibri-server: --api-key and --api-key-file both given; use one\n");
        return 2;
    }
    if (api_key_file && read_key_file(api_key_file, api_key_buf, sizeof api_key_buf) != 0) return 2;
    if (api_key_file) api_key = api_key_buf;
    else if (api_key_flag) api_key = api_key_flag;
    if (verify) return model ? verify_model(model) : verify_embedded();
    if (api_key && !*api_key) api_key = NULL;
    if (metrics_key && !*metrics_key) metrics_key = NULL;
    /* Every connection (and spare entry) is a descriptor; the rest is the
     * listener, the poller, the model's files and stdio. */
    const int fd_spare = 8, fd_other = 64, fd_room = cb_net_fd_room(max_conns + fd_spare + fd_other);
    if (fd_room < max_conns + fd_spare + fd_other) {
        if (fd_room - fd_spare - fd_other < 1) {
            fprintf(stderr, "colibri-server: only %d file descriptors may be open (ulimit -n); need at least %d\n",
                    fd_room, fd_spare + fd_other + 1);
            return 1;
        }
        fprintf(stderr, "colibri-server: --max-conns %d needs %d file descriptors but the limit (ulimit -n) is %d: "
                "serving %d connections\n", max_conns, max_conns + fd_spare + fd_other, fd_room,
                fd_room - fd_spare - fd_other);
        max_conns = fd_room - fd_spare - fd_other;
    }

    cb_engine *engine = open_within(model, threads, slots, kv, max_memory);
    if (!engine) return 1;
    char err[1024];
    cb_memory_budget budget;
    cb_engine_memory(engine, &budget);
    const int n_slots = cb_engine_n_slots(engine);
    cb_app_options opt = {queue >= 0 ? queue : 2 * n_slots, api_key, step_tokens >= 0 ? step_tokens : n_slots,
                          metrics_key, metrics_public, verbose, cors, n_cors, no_prefix_cache};
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
    cfg.spare_conns = fd_spare;
    cfg.spare_path = "/health"; /* a load balancer's check answers even when every connection is busy */
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
            opt.queue_cap, CB_KERNELS_NAME, cb_engine_kv_name(engine),
            (double)cb_engine_kv_bytes(engine) / (1 << 20), api_key ? ", API key required" : "");
    if (!model) fprintf(stderr, "colibri-server: serving the model %s carries\n", cb_self_exe_path());
    print_memory(&budget);
    print_request_memory(app, loop);
    if (d->kv_lora_rank) /* MLA: what makes its cache small, as a figure to check */
        fprintf(stderr, "colibri-server: KV cache: %zu bytes a token a slot (MLA: the latent of %u and the rope key "
                "of %u per layer, %u layers, %s)\n", budget.kv_per_slot / d->context_len, d->kv_lora_rank,
                d->head_dim, d->n_layers, cb_engine_kv_name(engine));
    print_memory_limit(&budget, max_memory);
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
