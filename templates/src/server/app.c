#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app_internal.h"
#include "platform/platform.h"

/* ---- lifecycle ---- */

/* Whether every allocation so far succeeded, and their bytes. */
typedef struct {
    int ok;
    size_t bytes;
} alloc_tally;

static void *alloc_zeroed(size_t count, size_t size, alloc_tally *t) {
    void *p = calloc(count ? count : 1, size);
    if (!p) t->ok = 0;
    else t->bytes += (count ? count : 1) * size;
    return p;
}

cb_app *cb_app_create(cb_engine *engine, const cb_app_options *opt) {
    alloc_tally mem = {1, 0};
    cb_app *a = alloc_zeroed(1, sizeof *a, &mem);
    if (!a) return NULL;
    a->engine = engine;
    a->dims = cb_engine_dims(engine);
    a->n_slots = cb_engine_n_slots(engine);
    a->api_key = opt->api_key;
    a->metrics_key = opt->metrics_key;
    a->metrics_public = opt->metrics_public;
    a->step_tokens = opt->step_tokens;
    a->verbose = opt->verbose;
    a->cors_origins = opt->n_cors_origins > 0 ? opt->cors_origins : NULL;
    a->n_cors_origins = opt->n_cors_origins;
    cb_reasoning_init(a);
    a->prefix_cache = !opt->no_prefix_cache;
    a->llama_attn = !strcmp(cb_engine_kv_name(engine), "f16-llama");
    const size_t ctx = a->dims->context_len, L = a->dims->n_layers, B = (size_t)cb_engine_max_batch(engine);
    a->slots = alloc_zeroed((size_t)a->n_slots, sizeof *a->slots, &mem);
    a->batch = alloc_zeroed(B, sizeof *a->batch, &mem);
    a->batch_slot = alloc_zeroed(B, sizeof *a->batch_slot, &mem);
    a->list = alloc_zeroed((size_t)a->n_slots, sizeof *a->list, &mem);
    a->toks = alloc_zeroed(CB_MAX_JSON_TOKENS, sizeof *a->toks, &mem);
    a->scratch_cap = 1u << 20;
    a->scratch = alloc_zeroed(a->scratch_cap, 1, &mem);
    a->messages = alloc_zeroed(CB_MAX_MESSAGES, sizeof *a->messages, &mem);
    a->response = alloc_zeroed(CB_RESPONSE_BYTES, 1, &mem);
    /* a Responses body as a chat request: the same text, a few dozen bytes
     * more per message and tool */
    a->translated_cap = (2u << 20) + (64u << 10);
    a->translated = alloc_zeroed(a->translated_cap, 1, &mem);
    a->text_cap = a->scratch_cap + (1u << 16);
    a->text = alloc_zeroed(a->text_cap, 1, &mem);
    a->ids = alloc_zeroed(a->scratch_cap, sizeof(int32_t), &mem);
    const cb_tokenizer *tok = cb_engine_tokenizer(engine);
    if (tok->chat_tpl) {
        a->chat_work_cap = CB_CHAT_WORK_BYTES;
        a->chat_work = alloc_zeroed(a->chat_work_cap, 1, &mem);
        a->tool_format = cb_tool_format_detect(tok->chat[0], tok->chat_len[0]);
        if (a->tool_format) {
            a->tool_schema = alloc_zeroed(CB_TOOL_SCHEMA_BYTES, 1, &mem);
            a->tool_toks = alloc_zeroed(CB_TOOL_SCHEMA_TOKENS, sizeof *a->tool_toks, &mem);
        }
    }
    const size_t before_slots = mem.bytes;
    for (int s = 0; mem.ok && s < a->n_slots; s++) {
        cb_slot *st = &a->slots[s];
        st->generated = alloc_zeroed(ctx, sizeof(int32_t), &mem);
        st->token_ns = alloc_zeroed(ctx, sizeof(uint64_t), &mem);
        st->kv_tokens = alloc_zeroed(ctx, sizeof(int32_t), &mem);
        st->expert_counts = alloc_zeroed(L * a->dims->n_experts, sizeof(uint32_t), &mem);
        st->trace_logits = alloc_zeroed(ctx, sizeof(float), &mem);
        st->trace_experts = alloc_zeroed(ctx * L * a->dims->top_k, sizeof(int32_t), &mem);
        st->lp = alloc_zeroed(ctx, sizeof(float), &mem);
        st->top_ids = alloc_zeroed(ctx * CB_MAX_TOP_LOGPROBS, sizeof(int32_t), &mem);
        st->top_lp = alloc_zeroed(ctx * CB_MAX_TOP_LOGPROBS, sizeof(float), &mem);
        /* Text of a whole answer; a token is a few bytes on average. */
        st->text_cap = ctx * 16 + CB_TOKEN_BYTES;
        st->text = alloc_zeroed(st->text_cap, 1, &mem);
        if (a->tool_format) {
            /* content is part of the text; arguments are the text's own
             * bytes, except XML's and GLM's, built as JSON (escapes: up to 6x) */
            st->tool_content = alloc_zeroed(st->text_cap, 1, &mem);
            st->tool_calls_cap = st->text_cap * (cb_tool_format_builds_args(a->tool_format) ? 6 : 1) + 4096;
            st->tool_calls = alloc_zeroed(st->tool_calls_cap, 1, &mem);
            st->tool_scratch_cap = cb_tool_format_builds_args(a->tool_format) ? st->tool_calls_cap : 4096;
            st->tool_scratch = alloc_zeroed(st->tool_scratch_cap, 1, &mem);
        }
    }
    a->memory.slot_bytes = a->n_slots ? (mem.bytes - before_slots) / (size_t)a->n_slots : 0;
    a->queue_cap = opt->queue_cap > 0 ? opt->queue_cap : 0;
    a->pool_size = a->n_slots + a->queue_cap;
    a->pool = alloc_zeroed((size_t)a->pool_size, sizeof *a->pool, &mem);
    a->pool_free = alloc_zeroed((size_t)a->pool_size, sizeof *a->pool_free, &mem);
    a->queue = alloc_zeroed((size_t)a->queue_cap, sizeof *a->queue, &mem);
    const size_t before_prompts = mem.bytes;
    for (int i = 0; mem.ok && i < a->pool_size; i++) {
        a->pool[i].prompt = alloc_zeroed(ctx, sizeof(int32_t), &mem);
        a->pool_free[a->n_pool_free++] = a->pool_size - 1 - i;
    }
    a->memory.prompt_bytes = a->pool_size ? (mem.bytes - before_prompts) / (size_t)a->pool_size : 0;
    if (mem.ok && cb_sampler_init(&a->sampler, (int)a->dims->vocab) != 0) mem.ok = 0;
    if (mem.ok && cb_engine_tokenizer(engine)->kind != CB_TOKENIZER_NONE &&
        cb_con_vocab_init(&a->con_vocab, cb_engine_tokenizer(engine), (int)a->dims->vocab) != 0)
        mem.ok = 0;
    if (mem.ok && cb_metrics_init(&a->metrics, (int)L, (int)a->dims->n_experts) != 0) mem.ok = 0;
    if (!mem.ok) {
        cb_app_destroy(a);
        return NULL;
    }
    a->memory.slots = a->n_slots;
    a->memory.prompts = a->pool_size;
    a->memory.sampler_bytes = cb_sampler_bytes(&a->sampler);
    a->memory.vocab_bytes = a->con_vocab.vocab ? cb_con_vocab_bytes(&a->con_vocab) : 0;
    const size_t metrics_bytes = L * a->dims->n_experts * sizeof *a->metrics.expert_tokens;
    a->memory.other_bytes = mem.bytes - a->memory.slot_bytes * (size_t)a->n_slots -
                            a->memory.prompt_bytes * (size_t)a->pool_size + metrics_bytes;
    a->memory.total_bytes = mem.bytes + a->memory.sampler_bytes + a->memory.vocab_bytes + metrics_bytes;
    return a;
}

void cb_app_destroy(cb_app *a) {
    if (!a) return;
    for (int s = 0; a->slots && s < a->n_slots; s++) {
        cb_slot *st = &a->slots[s];
        free(st->generated);
        free(st->token_ns);
        free(st->kv_tokens);
        free(st->expert_counts);
        free(st->trace_logits);
        free(st->trace_experts);
        free(st->lp);
        free(st->top_ids);
        free(st->top_lp);
        free(st->text);
        free(st->tool_content);
        free(st->tool_calls);
        free(st->tool_scratch);
    }
    for (int i = 0; a->pool && i < a->pool_size; i++) free(a->pool[i].prompt);
    free(a->pool);
    free(a->pool_free);
    free(a->queue);
    free(a->slots);
    free(a->batch);
    free(a->batch_slot);
    free(a->list);
    free(a->toks);
    free(a->scratch);
    free(a->messages);
    free(a->text);
    free(a->chat_work);
    free(a->tool_schema);
    free(a->tool_toks);
    free(a->ids);
    free(a->response);
    free(a->translated);
    cb_sampler_free(&a->sampler);
    cb_con_vocab_free(&a->con_vocab);
    cb_metrics_free(&a->metrics);
    free(a);
}

void cb_app_attach(cb_app *a, cb_netloop *loop) { a->loop = loop; }

void cb_app_memory(const cb_app *a, cb_app_memory_info *m) { *m = a->memory; }

int cb_app_busy(const cb_app *a) {
    int n = 0;
    for (int s = 0; s < a->n_slots; s++) n += a->slots[s].req != NULL;
    return n;
}

int cb_app_queued(const cb_app *a) { return a->queue_len; }

/* ---- the request pool and the queue ---- */

static void pool_put(cb_app *a, cb_request *q) { a->pool_free[a->n_pool_free++] = (int)(q - a->pool); }

/* --verbose: one line on stderr per generation request as it ends: id
 * ("-" for one refused before it got one), endpoint, HTTP status (499: the
 * client left first, as nginx counts it), how it ended, tokens in and out,
 * queue / prompt / decode ms. Formatted on the stack and written at once. */
static void log_request(const cb_app *a, const cb_request *q, const cb_slot *st, cb_endpoint ep, int status,
                        const char *outcome) {
    if (!a->verbose) return;
    char id[24] = "-";
    double queue_ms = 0, prompt_ms = 0, decode_ms = 0;
    int in = 0, out = 0;
    if (q) {
        snprintf(id, sizeof id, "%llu", (unsigned long long)q->request_no);
        in = q->n_prompt;
        ep = q->endpoint;
        queue_ms = (double)((st ? st->admitted_ns : cb_now_ns()) - q->arrived_ns) * 1e-6;
    }
    if (st) {
        out = st->n_generated;
        if (out) prompt_ms = (double)(st->first_token_ns - st->admitted_ns) * 1e-6;
        if (out > 1) decode_ms = (double)(st->last_token_ns - st->first_token_ns) * 1e-6;
    }
    char line[256];
    snprintf(line, sizeof line,
             "colibri-server: request id=%s endpoint=%s status=%d outcome=%s tokens_in=%d tokens_out=%d "
             "queue_ms=%.1f prompt_ms=%.1f decode_ms=%.1f\n",
             id, ep == CB_EP_CHAT ? "chat" : ep == CB_EP_RESPONSES ? "responses" : "completions", status, outcome,
             in, out, queue_ms, prompt_ms, decode_ms);
    fputs(line, stderr);
}

/* Frees slot s; status and outcome: what its request's log line says. */
static void release_slot(cb_app *a, int s, int status, const char *outcome) {
    cb_slot *st = &a->slots[s];
    if (!st->req) return;
    log_request(a, st->req, st, st->req->endpoint, status, outcome);
    cb_prefix_keep(a, s);
    pool_put(a, st->req);
    st->req = NULL;
}

static cb_request *queue_at(const cb_app *a, int i) { return &a->pool[a->queue[(a->queue_head + i) % a->queue_cap]]; }

static void queue_remove(cb_app *a, int i) {
    for (; i + 1 < a->queue_len; i++)
        a->queue[(a->queue_head + i) % a->queue_cap] = a->queue[(a->queue_head + i + 1) % a->queue_cap];
    a->queue_len--;
}

/* ---- simple endpoints ---- */

static void handle_health(cb_app *a, cb_conn *c, const char *body, size_t len) {
    (void)body, (void)len;
    cb_jw w;
    cb_jw_init(&w, a->response, CB_RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "status");
    cb_jw_str(&w, a->draining ? "draining" : "ok");
    cb_jw_key(&w, "slots");
    cb_jw_int(&w, a->n_slots);
    cb_jw_key(&w, "busy_slots");
    cb_jw_int(&w, cb_app_busy(a));
    cb_jw_key(&w, "queue_length");
    cb_jw_int(&w, a->queue_len);
    cb_jw_key(&w, "queue_capacity");
    cb_jw_int(&w, a->queue_cap);
    cb_jw_end_object(&w);
    /* 503 while stopping: load balancers and readiness probes read the
     * status code, and new work would only get 503 here. */
    cb_respond_json(a, c, a->draining ? 503 : 200, &w);
}

/* The model object: OpenAI's fields, and the context length (prompt and
 * completion together) under the names vLLM (max_model_len) and others
 * (context_length) give it. */
static void write_model(cb_app *a, cb_jw *w) {
    cb_jw_begin_object(w);
    cb_jw_key(w, "id");
    cb_jw_str(w, cb_engine_model_name(a->engine));
    cb_jw_key(w, "object");
    cb_jw_str(w, "model");
    cb_jw_key(w, "created");
    cb_jw_int(w, 0);
    cb_jw_key(w, "owned_by");
    cb_jw_str(w, "colibri");
    cb_jw_key(w, "context_length");
    cb_jw_int(w, a->dims->context_len);
    cb_jw_key(w, "max_model_len");
    cb_jw_int(w, a->dims->context_len);
    cb_jw_end_object(w);
}

static void handle_models(cb_app *a, cb_conn *c, const char *body, size_t len) {
    (void)body, (void)len;
    cb_jw w;
    cb_jw_init(&w, a->response, CB_RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "object");
    cb_jw_str(&w, "list");
    cb_jw_key(&w, "data");
    cb_jw_begin_array(&w);
    write_model(a, &w);
    cb_jw_end_array(&w);
    cb_jw_end_object(&w);
    cb_respond_json(a, c, 200, &w);
}

static int hex_digit(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* GET /v1/models/{id}: the model object, or OpenAI's 404 (model_not_found).
 * The id is percent-decoded, so "org%2Fname" and "org/name" both match. */
static void handle_model(cb_app *a, cb_conn *c, const cb_http_request *req) {
    static const char prefix[] = "/v1/models/";
    char id[256], message[400];
    size_t n = 0, i = sizeof prefix - 1;
    for (; i < req->path_len && req->path[i] != '?' && n + 1 < sizeof id; i++) {
        const char *p = req->path + i;
        int hi, lo;
        if (*p == '%' && i + 2 < req->path_len && (hi = hex_digit(p[1])) >= 0 && (lo = hex_digit(p[2])) >= 0)
            id[n++] = (char)(hi * 16 + lo), i += 2;
        else id[n++] = *p;
    }
    id[n] = 0;
    const char *name = cb_engine_model_name(a->engine);
    if (strlen(name) == n && !memcmp(name, id, n)) {
        cb_jw w;
        cb_jw_init(&w, a->response, CB_RESPONSE_BYTES);
        write_model(a, &w);
        cb_respond_json(a, c, 200, &w);
        return;
    }
    snprintf(message, sizeof message, "The model '%.200s' does not exist; this server serves '%.100s'", id, name);
    cb_respond_error_ex(a, c, 404, "invalid_request_error", "model", "model_not_found", message);
}

static void handle_metrics(cb_app *a, cb_conn *c, const char *body, size_t len) {
    (void)body, (void)len;
    cb_metrics_gauges g = {a->n_slots, cb_app_busy(a), a->queue_len, a->queue_cap,
                           a->loop ? cb_netloop_active(a->loop) : 0};
    size_t n = cb_metrics_write(&a->metrics, &g, a->response, CB_RESPONSE_BYTES);
    if (n == 0) {
        cb_respond_error(a, c, 500, NULL, "metrics do not fit the response buffer");
        return;
    }
    cb_metrics_status(&a->metrics, 200);
    cb_conn_respond(c, 200, "text/plain; version=0.0.4", a->response, n, NULL);
}

/* ---- generation requests ---- */

/* Slot s takes q, its cache's first reuse positions as they are. */
static void admit(cb_app *a, int s, cb_request *q, int reuse) {
    cb_slot *st = &a->slots[s];
    const int ctx = (int)a->dims->context_len;
    st->req = q;
    st->admitted_ns = cb_now_ns();
    st->used_at = ++a->admissions;
    st->n_fed = st->n_generated = st->prompt_steps = 0;
    st->sample_ns = 0;
    st->max_tokens = q->max_tokens > ctx - q->n_prompt ? ctx - q->n_prompt : q->max_tokens;
    st->finish_reason = NULL;
    st->stopped = st->held_done = 0;
    st->held_len = st->text_len = st->stream_text_len = 0;
    st->tool_content_len = st->tool_calls_len = 0;
    st->n_calls = 0;
    st->n_resp_items = st->reasoning_tokens = 0;
    /* the parser's JSON tokens: a->toks, free once requests are read (the
     * event loop reads a request and runs a step, never both at once) */
    if (q->tool_format)
        cb_tool_parser_init(&st->tools, q->tool_format, q->parallel_tools ? CB_MAX_TOOL_CALLS : 1, st->tool_scratch,
                            st->tool_scratch_cap, a->toks, CB_MAX_JSON_TOKENS);
    cb_detok_init(&st->detok);
    cb_reasoning_slot(a, st);
    cb_rng_seed(&st->rng, q->sampling.seed);
    if (q->constrained) cb_con_start(&q->con, &st->con);
    memset(st->expert_counts, 0, sizeof(uint32_t) * a->dims->n_layers * a->dims->n_experts);
    cb_prefix_reuse(a, s, reuse);
    a->metrics.prompt_tokens += (uint64_t)q->n_prompt;
    a->metrics.prompt_tokens_cached += (uint64_t)reuse;
    a->metrics.prefix_cache_hits += reuse > 0;
    if (!q->stream) return;
    cb_conn *c = cb_netloop_conn(a->loop, q->conn);
    /* A list's later prompts join the stream its first one began. */
    if (c && (q->choice > 0 || cb_conn_stream_begin(c, 200, "text/event-stream") == CB_CONN_OK) &&
        cb_stream_delta(a, c, st, "", 0, -1) == CB_CONN_OK) {
        if (q->choice == 0) cb_metrics_status(&a->metrics, 200);
        return;
    }
    if (c) cb_conn_close(c);
    release_slot(a, s, 499, "closed");
}

static int free_slots(const cb_app *a) { return a->n_slots - cb_app_busy(a); }

static void admit_queued(cb_app *a) {
    int s, reuse;
    while (a->queue_len > 0 && (s = cb_prefix_pick(a, queue_at(a, 0), &reuse)) >= 0) {
        cb_request *q = queue_at(a, 0);
        /* A list of prompts starts whole (its prompts follow it in the
         * queue): slots held by its finished prompts then never wait for
         * the others to get one. */
        if (q->choice == 0 && q->n_choices > free_slots(a)) break;
        a->queue_head = (a->queue_head + 1) % a->queue_cap;
        a->queue_len--;
        admit(a, s, q, reuse);
    }
}

static void respond_busy(cb_app *a, cb_conn *c, cb_endpoint ep) {
    static const char busy[] = "{\"error\":{\"message\":\"all slots are busy and the queue is full; "
                               "retry shortly\",\"type\":\"rate_limit_error\",\"param\":null,\"code\":null}}";
    cb_metrics_status(&a->metrics, 429);
    cb_conn_respond(c, 429, "application/json", busy, sizeof busy - 1, "Retry-After: 1\r\n");
    log_request(a, NULL, NULL, ep, 429, "queue-full");
}

/* A list of prompts (q read with prompt 0): a request per prompt, queued
 * together in order (admit_queued starts them together). The others take
 * q's settings; a prompt that fails takes the whole list back. */
static void queue_list(cb_app *a, cb_conn *c, cb_request *q, const char *body) {
    const int n = q->n_choices;
    char err[512];
    if (a->n_pool_free < n - 1 || a->queue_cap - a->queue_len < n) {
        pool_put(a, q);
        respond_busy(a, c, q->endpoint);
        return;
    }
    int status = 0, pushed = 1;
    a->queue[(a->queue_head + a->queue_len++) % a->queue_cap] = (int)(q - a->pool);
    for (int i = 1; i < n && !status; i++, pushed++) {
        cb_request *m = &a->pool[a->pool_free[--a->n_pool_free]];
        a->queue[(a->queue_head + a->queue_len++) % a->queue_cap] = (int)(m - a->pool);
        status = cb_request_next_prompt(a, m, q, body, i, err, sizeof err);
    }
    if (!status) return;
    while (pushed-- > 0) pool_put(a, &a->pool[a->queue[(a->queue_head + --a->queue_len) % a->queue_cap]]);
    cb_respond_error_ex(a, c, status, "invalid_request_error", a->err_param, a->err_code, err);
    log_request(a, NULL, NULL, q->endpoint, status, "invalid");
}

static void handle_generate(cb_app *a, cb_conn *c, cb_endpoint ep, const char *body, size_t len) {
    if (a->draining) {
        cb_respond_error(a, c, 503, NULL, "the server is shutting down");
        log_request(a, NULL, NULL, ep, 503, "draining");
        return;
    }
    if (a->n_pool_free == 0) {
        respond_busy(a, c, ep);
        return;
    }
    cb_request *q = &a->pool[a->pool_free[--a->n_pool_free]];
    char err[512];
    int status = ep == CB_EP_RESPONSES ? cb_responses_read(a, q, body, len, err, sizeof err)
                                       : cb_request_read(a, q, ep, body, len, err, sizeof err);
    if (status) {
        pool_put(a, q);
        cb_respond_error_ex(a, c, status, "invalid_request_error", a->err_param, a->err_code, err);
        log_request(a, NULL, NULL, ep, status, "invalid");
        return;
    }
    q->conn = cb_conn_handle(c);
    q->request_no = ++a->requests;
    q->arrived_ns = cb_now_ns();
    q->created = (int64_t)time(NULL);
    if (q->n_choices > 1) {
        queue_list(a, c, q, body);
        return;
    }
    int reuse, s = a->queue_len == 0 ? cb_prefix_pick(a, q, &reuse) : -1;
    if (s >= 0) {
        admit(a, s, q, reuse);
        return;
    }
    a->queue[(a->queue_head + a->queue_len++) % a->queue_cap] = (int)(q - a->pool);
}

static void handle_chat(cb_app *a, cb_conn *c, const char *body, size_t len) {
    handle_generate(a, c, CB_EP_CHAT, body, len);
}

static void handle_completions(cb_app *a, cb_conn *c, const char *body, size_t len) {
    handle_generate(a, c, CB_EP_COMPLETION, body, len);
}

static void handle_responses(cb_app *a, cb_conn *c, const char *body, size_t len) {
    handle_generate(a, c, CB_EP_RESPONSES, body, len);
}

/* ---- routing ---- */

typedef void (*route_fn)(cb_app *a, cb_conn *c, const char *body, size_t len);

/* ---- /tokenize, /detokenize, /apply-template (llama.cpp's shapes) ---- */

/* An answer of /tokenize, /detokenize or /apply-template too large for the
 * response buffer: the client asked for too much at once (413), not a
 * server fault. */
static void respond_too_large(cb_app *a, cb_conn *c, const char *what) {
    char msg[192];
    snprintf(msg, sizeof msg, "%s: the answer would be over the %u-byte response limit; send less at once", what,
             CB_RESPONSE_BYTES);
    cb_respond_error(a, c, 413, "invalid_request_error", msg);
}

/* {"<key>": a->text[0..len)} */
static void respond_text(cb_app *a, cb_conn *c, const char *what, const char *key, size_t len) {
    cb_jw w;
    cb_jw_init(&w, a->response, CB_RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, key);
    cb_jw_str_n(&w, a->text, len);
    cb_jw_end_object(&w);
    if (w.overflow) respond_too_large(a, c, what);
    else cb_respond_json(a, c, 200, &w);
}

/* A model converted without a tokenizer has no text side: say so rather
 * than answer with empty text or a misleading error. */
static int refuse_without_tokenizer(cb_app *a, cb_conn *c, const char *what) {
    if (cb_engine_tokenizer(a->engine)->kind != CB_TOKENIZER_NONE) return 0;
    char msg[192];
    snprintf(msg, sizeof msg, "%s needs a tokenizer, and this model was converted without one", what);
    cb_respond_error(a, c, 400, "invalid_request_error", msg);
    return 1;
}

/* Most token ids a /tokenize answer holds: each is at most the digits of
 * the largest id, plus a comma. */
static int tokenize_answer_limit(const cb_app *a) {
    int digits = 1;
    for (uint32_t v = a->dims->vocab; v >= 10; v /= 10) digits++;
    return (int)((CB_RESPONSE_BYTES - 64) / (unsigned)(digits + 1));
}

static void handle_tokenize(cb_app *a, cb_conn *c, const char *body, size_t len) {
    char err[256];
    if (refuse_without_tokenizer(a, c, "/tokenize")) return;
    if (cb_request_parse_object(a, body, len, err, sizeof err)) {
        cb_respond_error(a, c, 400, "invalid_request_error", err);
        return;
    }
    int content = cb_json_find(body, a->toks, 0, "content");
    if (content < 0 || a->toks[content].type != CB_JSON_STRING) {
        cb_respond_error(a, c, 400, "invalid_request_error", "'content' must be a string");
        return;
    }
    int special = 1, sp = cb_json_find(body, a->toks, 0, "parse_special");
    if (sp >= 0 && cb_json_get_bool(&a->toks[sp], &special) != 0) {
        cb_respond_error(a, c, 400, "invalid_request_error", "'parse_special' must be a boolean");
        return;
    }
    int n = cb_json_unescape(body, &a->toks[content], a->scratch, a->scratch_cap);
    if (n < 0) {
        cb_respond_error(a, c, 400, "invalid_request_error", "'content' holds an invalid string");
        return;
    }
    int got = cb_tokenize_ex(cb_engine_tokenizer(a->engine), a->scratch, (size_t)n, special, a->ids,
                             (int)a->scratch_cap, err, sizeof err);
    if (got < 0) {
        cb_respond_error(a, c, 400, "invalid_request_error", err);
        return;
    }
    const int most = tokenize_answer_limit(a);
    if (got > most) {
        snprintf(err, sizeof err, "'content' is %d tokens; /tokenize answers at most %d at once", got, most);
        cb_respond_error(a, c, 413, "invalid_request_error", err);
        return;
    }
    cb_jw w;
    cb_jw_init(&w, a->response, CB_RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "tokens");
    cb_jw_begin_array(&w);
    for (int i = 0; i < got; i++) cb_jw_int(&w, a->ids[i]);
    cb_jw_end_array(&w);
    cb_jw_end_object(&w);
    cb_respond_json(a, c, 200, &w);
}

static void handle_detokenize(cb_app *a, cb_conn *c, const char *body, size_t len) {
    char err[256];
    if (refuse_without_tokenizer(a, c, "/detokenize")) return;
    if (cb_request_parse_object(a, body, len, err, sizeof err)) {
        cb_respond_error(a, c, 400, "invalid_request_error", err);
        return;
    }
    const cb_json_tok *t = a->toks;
    int arr = cb_json_find(body, t, 0, "tokens");
    if (arr < 0 || t[arr].type != CB_JSON_ARRAY) {
        cb_respond_error(a, c, 400, "invalid_request_error", "'tokens' must be an array of token ids");
        return;
    }
    const cb_tokenizer *tok = cb_engine_tokenizer(a->engine);
    int n = t[arr].size;
    if ((size_t)n > a->scratch_cap) {
        cb_respond_error(a, c, 400, "invalid_request_error", "'tokens' has too many entries");
        return;
    }
    for (int i = 0, el = arr + 1; i < n; i++, el = cb_json_skip(t, el)) {
        int64_t v;
        if (cb_json_get_int64(body, &t[el], &v) != 0 || v < 0 || v >= (int64_t)cb_tokenizer_size(tok)) {
            snprintf(err, sizeof err, "'tokens[%d]' is not a token id of this model", i);
            cb_respond_error(a, c, 400, "invalid_request_error", err);
            return;
        }
        a->ids[i] = (int32_t)v;
    }
    long got = cb_detokenize(tok, a->ids, n, a->text, a->text_cap, NULL);
    if (got < 0) {
        snprintf(err, sizeof err, "the text of 'tokens' is over %zu bytes", a->text_cap);
        cb_respond_error(a, c, 413, "invalid_request_error", err);
        return;
    }
    respond_text(a, c, "/detokenize", "content", (size_t)got);
}

/* The prompt text the chat template makes of messages (no inference). */
static void handle_apply_template(cb_app *a, cb_conn *c, const char *body, size_t len) {
    char err[512];
    cb_chat_request q;
    if (refuse_without_tokenizer(a, c, "/apply-template")) return;
    if (cb_request_template(a, body, len, &q, err, sizeof err)) {
        cb_respond_error(a, c, 400, "invalid_request_error", err);
        return;
    }
    long got = cb_chat_apply(cb_engine_tokenizer(a->engine), &q, a->chat_work, a->chat_work_cap, a->text, a->text_cap,
                             err, sizeof err);
    if (got < 0) {
        cb_respond_error(a, c, 400, "invalid_request_error", err);
        return;
    }
    respond_text(a, c, "/apply-template", "prompt", (size_t)got);
}

/* Who may call an endpoint: anyone (health checks of load balancers), the
 * holder of the API key, or (/metrics) of the API key or the metrics key. */
enum { AUTH_NONE, AUTH_API, AUTH_METRICS };

/* One line per endpoint; a GET endpoint answers HEAD as well. */
static const struct {
    const char *method, *path;
    route_fn fn;
    int auth;
} routes[] = {
    {"GET", "/health", handle_health, AUTH_NONE},
    {"GET", "/metrics", handle_metrics, AUTH_METRICS},
    {"GET", "/v1/models", handle_models, AUTH_API},
    {"POST", "/v1/chat/completions", handle_chat, AUTH_API},
    {"POST", "/v1/completions", handle_completions, AUTH_API},
    {"POST", "/v1/responses", handle_responses, AUTH_API},
    {"POST", "/tokenize", handle_tokenize, AUTH_API},
    {"POST", "/detokenize", handle_detokenize, AUTH_API},
    {"POST", "/apply-template", handle_apply_template, AUTH_API},
};

/* The credentials of "Authorization: Bearer KEY": the scheme is
 * case-insensitive and may be followed by several spaces (RFC 9110 11.1,
 * 11.4). 0 when the field is absent or another scheme. */
static int bearer_token(const cb_http_request *req, const char **tok, size_t *len) {
    static const char scheme[] = "bearer";
    const char *v = req->authorization;
    size_t n = req->authorization_len, i = 0;
    if (!v || n <= sizeof scheme) return 0;
    for (; i < sizeof scheme - 1; i++)
        if ((v[i] | 0x20) != scheme[i]) return 0;
    if (v[i] != ' ') return 0;
    while (i < n && v[i] == ' ') i++;
    *tok = v + i, *len = n - i;
    return 1;
}

/* tok equals key, compared in constant time for keys of the same length. */
static int key_matches(const char *key, const char *tok, size_t len) {
    if (!key || strlen(key) != len) return 0;
    unsigned diff = 0;
    for (size_t i = 0; i < len; i++) diff |= (unsigned char)(tok[i] ^ key[i]);
    return diff == 0;
}

static int authorized(const cb_app *a, const cb_http_request *req, int auth) {
    if (auth == AUTH_NONE) return 1;
    if (auth == AUTH_METRICS && (a->metrics_public || (!a->api_key && !a->metrics_key))) return 1;
    if (auth == AUTH_API && !a->api_key) return 1;
    const char *tok;
    size_t len;
    if (!bearer_token(req, &tok, &len)) return 0;
    return key_matches(a->api_key, tok, len) || (auth == AUTH_METRICS && key_matches(a->metrics_key, tok, len));
}

/* 405 with the Allow field RFC 9110 15.5.6 asks for: the path's methods. */
static void respond_not_allowed(cb_app *a, cb_conn *c, const cb_http_request *req) {
    char allow[64] = "Allow: ", body[256];
    size_t used = strlen(allow);
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        if (!cb_http_path_is(req, routes[i].path)) continue;
        const int get = !strcmp(routes[i].method, "GET");
        used += (size_t)snprintf(allow + used, sizeof allow - used, "%s%s%s", used > 7 ? ", " : "",
                                 routes[i].method, get ? ", HEAD" : "");
    }
    snprintf(allow + used, sizeof allow - used, "\r\n");
    cb_jw w;
    cb_jw_init(&w, body, sizeof body);
    cb_jw_openai_error(&w, "method not allowed for this endpoint", "invalid_request_error");
    cb_metrics_status(&a->metrics, 405);
    cb_conn_respond(c, 405, "application/json", body, w.len, allow);
}

/* /v1/models/{id}, which the exact paths of routes[] do not hold. */
static int is_model_path(const cb_http_request *req) {
    static const char prefix[] = "/v1/models/";
    return req->path_len > sizeof prefix - 1 && !memcmp(req->path, prefix, sizeof prefix - 1) &&
           req->path[sizeof prefix - 1] != '?';
}

static int known_path(const cb_http_request *req) {
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (cb_http_path_is(req, routes[i].path)) return 1;
    return is_model_path(req);
}

void cb_app_on_request(void *app, cb_conn *c, const cb_http_request *req, const char *body, size_t len) {
    cb_app *a = app;
    int path_known = 0;
    if (a->cors_origins) { /* --cors-origin: every answer to this request carries the Access-Control lines */
        char lines[512];
        cb_cors_headers(a, req, lines, sizeof lines);
        cb_conn_set_headers(c, lines);
        if (cb_http_method_is(req, "OPTIONS") && known_path(req) && cb_cors_preflight(a, c, req)) return;
    }
    /* HEAD is GET without the body: the netloop drops the body and keeps
     * its Content-Length. */
    const int head = cb_http_method_is(req, "HEAD");
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        if (!cb_http_path_is(req, routes[i].path)) continue;
        path_known = 1;
        if (!cb_http_method_is(req, routes[i].method) && !(head && !strcmp(routes[i].method, "GET"))) continue;
        if (!authorized(a, req, routes[i].auth)) {
            cb_respond_error(a, c, 401, "invalid_request_error",
                             routes[i].auth == AUTH_METRICS
                                 ? "missing or incorrect key for /metrics: send 'Authorization: Bearer <key>' "
                                   "with the API key or the metrics key"
                                 : "missing or incorrect API key: send 'Authorization: Bearer <key>'");
            return;
        }
        routes[i].fn(a, c, body, len);
        return;
    }
    if (!path_known && is_model_path(req)) {
        if (!cb_http_method_is(req, "GET") && !head) {
            static const char body405[] = "{\"error\":{\"message\":\"method not allowed for this endpoint\","
                                          "\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}";
            cb_metrics_status(&a->metrics, 405);
            cb_conn_respond(c, 405, "application/json", body405, sizeof body405 - 1, "Allow: GET, HEAD\r\n");
        } else if (!authorized(a, req, AUTH_API)) {
            cb_respond_error(a, c, 401, "invalid_request_error",
                             "missing or incorrect API key: send 'Authorization: Bearer <key>'");
        } else {
            handle_model(a, c, req);
        }
        return;
    }
    static const char stored[] = "/v1/responses/"; /* GET, DELETE, cancel of a stored response */
    if (path_known) respond_not_allowed(a, c, req);
    else if (req->path_len > sizeof stored - 1 && !memcmp(req->path, stored, sizeof stored - 1))
        cb_respond_error(a, c, 404, NULL, "no such response: this server keeps no responses (a response is "
                                          "answered once; send the whole conversation in 'input')");
    else cb_respond_error(a, c, 404, NULL, "no such endpoint");
}

void cb_app_on_close(void *app, cb_conn_id id) {
    cb_app *a = app;
    /* The client left: its slot, or its place in the queue, is free at once. */
    for (int s = 0; s < a->n_slots; s++)
        if (a->slots[s].req && a->slots[s].req->conn == id) release_slot(a, s, 499, "closed");
    for (int i = 0; i < a->queue_len; i++) {
        cb_request *q = queue_at(a, i);
        if (q->conn != id) continue;
        queue_remove(a, i--); /* a list of prompts has several */
        log_request(a, q, NULL, q->endpoint, 499, "closed-in-queue");
        pool_put(a, q);
    }
}

void cb_app_drain(cb_app *a) {
    a->draining = 1;
    while (a->queue_len > 0) {
        cb_request *q = queue_at(a, 0);
        a->queue_head = (a->queue_head + 1) % a->queue_cap;
        a->queue_len--;
        cb_conn *c = cb_netloop_conn(a->loop, q->conn);
        if (c) cb_respond_error(a, c, 503, NULL, "the server is shutting down");
        log_request(a, q, NULL, q->endpoint, 503, "draining");
        pool_put(a, q);
    }
}

void cb_app_cancel_all(cb_app *a) {
    for (int s = 0; s < a->n_slots; s++) {
        cb_slot *st = &a->slots[s];
        if (!st->req) continue;
        cb_conn *c = cb_netloop_conn(a->loop, st->req->conn);
        /* A stream cannot change its status any more: an error event (cb_stream_error). */
        if (c && st->req->stream) { /* (a list's other prompts find the stream ended: ERR_STATE) */
            if (cb_stream_error(a, c, st, "the server shut down before the answer was complete") == CB_CONN_ERR_FULL)
                cb_conn_close(c);
        } else if (c) cb_respond_error(a, c, 503, NULL, "the server shut down before the answer was complete");
        release_slot(a, s, 503, "shutdown");
    }
}

/* ---- text: stop sequences and UTF-8 ---- */

static size_t find(const char *hay, size_t n, const char *needle, size_t m) {
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, m)) return i;
    return SIZE_MAX;
}

/* Bytes at the end of s[0..n) that start a UTF-8 character not complete
 * yet (0 when the tail is complete, or invalid: invalid bytes go out and
 * become U+FFFD rather than wait forever). */
static size_t utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look for the lead */
        size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* How much of held[] may go to the client now. A stop sequence found ends
 * the text before it (st->stopped); otherwise hold back a tail that may
 * still become a stop sequence or an incomplete character. */
static size_t releasable(cb_slot *st, int final) {
    const cb_request *q = st->req;
    const size_t n = st->held_len;
    size_t first = SIZE_MAX;
    for (int i = 0; i < q->n_stop; i++) {
        size_t at = find(st->held, n, q->stop_text + q->stop_off[i], q->stop_len[i]);
        if (at < first) first = at;
    }
    if (first != SIZE_MAX) {
        st->stopped = 1;
        st->held_len = first;
        return first;
    }
    if (final) return n;
    size_t hold = utf8_incomplete_tail(st->held, n);
    for (int i = 0; i < q->n_stop; i++) {
        const char *stop = q->stop_text + q->stop_off[i];
        size_t m = (size_t)q->stop_len[i] - 1 < n ? (size_t)q->stop_len[i] - 1 : n;
        for (; m > hold; m--)
            if (!memcmp(st->held + n - m, stop, m)) break;
        if (m > hold) hold = m;
    }
    return n - hold;
}

/* ---- finishing ---- */

/* A prompt of a list finished. Its counts go to the prompts still running
 * (the last to finish holds them all, for usage). Streamed: its last chunk,
 * and from the last prompt the usage and [DONE]. Plain: its slot is held
 * until the last one finishes, which answers for all. */
static void finish_list_prompt(cb_app *a, int s) {
    cb_slot *st = &a->slots[s];
    const cb_request *q = st->req;
    const size_t LE = (size_t)a->dims->n_layers * a->dims->n_experts;
    cb_conn *c = cb_netloop_conn(a->loop, q->conn);
    int running = 0;
    for (int t = 0; t < a->n_slots; t++) {
        cb_slot *o = &a->slots[t];
        if (t == s || !o->req || o->req->conn != q->conn || o->req->request_no != q->request_no || o->held_done)
            continue;
        running++;
        /* n samples of one prompt count it once, as OpenAI's usage does */
        if (q->n_samples == 1) o->req->group_prompt += q->n_prompt, o->req->group_cached += st->cached;
        o->req->group_completion += st->n_generated;
        if (!q->stream)
            for (size_t i = 0; i < LE; i++) o->expert_counts[i] += st->expert_counts[i];
    }
    if (q->stream) {
        int r = !c ? CB_CONN_OK : running ? cb_stream_finish_choice(a, c, st) : cb_stream_finish(a, c, st);
        if (c && r != CB_CONN_OK) cb_conn_close(c);
        release_slot(a, s, c ? 200 : 499, st->finish_reason);
        return;
    }
    st->held_done = 1;
    if (running) return;
    for (int k = 0; k < q->n_choices; k++) {
        a->list[k] = NULL;
        for (int t = 0; t < a->n_slots; t++) {
            const cb_request *o = a->slots[t].req;
            if (o && o->conn == q->conn && o->request_no == q->request_no && o->choice == k) a->list[k] = &a->slots[t];
        }
        if (!a->list[k]) c = NULL; /* one failed and was answered (non-finite): nothing more to say */
    }
    if (c) cb_respond_final_list(a, c, a->list, q->n_choices, st);
    for (int t = 0; t < a->n_slots; t++) {
        const cb_request *o = a->slots[t].req;
        if (t != s && o && o->conn == q->conn && o->request_no == q->request_no)
            release_slot(a, t, c ? 200 : 499, a->slots[t].finish_reason);
    }
    release_slot(a, s, c ? 200 : 499, st->finish_reason);
}

static void finish(cb_app *a, int s) {
    cb_slot *st = &a->slots[s];
    if (st->req->n_choices > 1) {
        finish_list_prompt(a, s);
        return;
    }
    cb_conn *c = cb_netloop_conn(a->loop, st->req->conn);
    if (c && st->req->stream) {
        if (cb_stream_finish(a, c, st) != CB_CONN_OK) cb_conn_close(c);
    } else if (c) {
        cb_respond_final(a, c, st);
    }
    release_slot(a, s, c ? 200 : 499, st->finish_reason);
}

/* Sends (a stream: an event, for token's logprobs too when `always`) or
 * keeps held[0..n), without the newlines that open a thinking part; 0, or
 * -1 when the client was given up and the slot freed. */
static int release_text(cb_app *a, int s, size_t n, int token, int always) {
    cb_slot *st = &a->slots[s];
    const cb_request *q = st->req;
    const size_t skip = cb_reasoning_skip(st, st->held, n);
    if (!q->stream || q->endpoint == CB_EP_RESPONSES) { /* a Responses stream ends with the whole text */
        size_t room = st->text_cap - st->text_len, take = n - skip < room ? n - skip : room;
        memcpy(st->text + st->text_len, st->held + skip, take);
        st->text_len += take;
    }
    if (q->stream) {
        cb_conn *c = cb_netloop_conn(a->loop, q->conn);
        st->stream_text_len += n - skip;
        int r = CB_CONN_OK;
        if (c && (n > skip || always) && (r = cb_stream_delta(a, c, st, st->held + skip, n - skip, token)) != CB_CONN_OK) {
            /* The client reads slower than we write: give up on it. (Not
             * streaming any more: another prompt of its list ended it.) */
            if (r != CB_CONN_ERR_STATE) cb_conn_close(c);
            release_slot(a, s, 499, r != CB_CONN_ERR_STATE ? "slow-client" : "closed");
            return -1;
        }
    }
    memmove(st->held, st->held + n, st->held_len - n);
    st->held_len -= n;
    return 0;
}

/* ---- tool calls: the released text through the parser ---- */

typedef struct {
    cb_app *a;
    cb_conn *c;          /* NULL: a non-streamed answer, kept in the slot */
    cb_slot *st;
    int token;           /* this token's logprobs still to send (streams), or -1 */
} tool_out;

/* A Responses answer's items in order: content joins the message before
 * it, or begins one after a call. */
static void record_item(cb_slot *st, int kind, uint32_t off, uint32_t len) {
    cb_resp_item *last = st->n_resp_items ? &st->resp_items[st->n_resp_items - 1] : NULL;
    if (kind == CB_RESP_ITEM_MESSAGE && last && last->kind == CB_RESP_ITEM_MESSAGE) last->len += len;
    else if (st->n_resp_items < CB_RESP_MAX_ITEMS)
        st->resp_items[st->n_resp_items++] = (cb_resp_item){(uint8_t)kind, off, len};
}

static int tool_content(void *ctx, const char *s, size_t n) {
    tool_out *o = ctx;
    cb_slot *st = o->st;
    if (st->req->endpoint == CB_EP_RESPONSES) { /* kept in both modes: the stream's last event has it all */
        if (n > st->text_cap - st->tool_content_len) return -1;
        memcpy(st->tool_content + st->tool_content_len, s, n);
        st->tool_content_len += n;
        if (n) record_item(st, CB_RESP_ITEM_MESSAGE, (uint32_t)(st->tool_content_len - n), (uint32_t)n);
        if (!o->c) return 0;
    }
    if (o->c) {
        int r = cb_stream_content(o->a, o->c, st, s, n, o->token);
        o->token = -1;
        return r == CB_CONN_OK ? 0 : -1;
    }
    if (n > st->text_cap - st->tool_content_len) return -1;
    memcpy(st->tool_content + st->tool_content_len, s, n);
    st->tool_content_len += n;
    return 0;
}

static int tool_call(void *ctx, int index, const char *name, size_t name_n, const char *args, size_t args_n) {
    tool_out *o = ctx;
    cb_slot *st = o->st;
    st->n_calls = index + 1;
    const int keep = st->req->endpoint == CB_EP_RESPONSES; /* the stream's items refer to it */
    if (o->c && !keep)
        return cb_stream_tool_call(o->a, o->c, st, index, name, name_n, args, args_n) == CB_CONN_OK ? 0 : -1;
    if (name_n + args_n > st->tool_calls_cap - st->tool_calls_len) return -1;
    cb_tool_call_span *c = &st->calls[index];
    c->name_off = (uint32_t)st->tool_calls_len, c->name_len = (uint32_t)name_n;
    memcpy(st->tool_calls + st->tool_calls_len, name, name_n);
    st->tool_calls_len += name_n;
    c->args_off = (uint32_t)st->tool_calls_len, c->args_len = (uint32_t)args_n;
    memcpy(st->tool_calls + st->tool_calls_len, args, args_n);
    st->tool_calls_len += args_n;
    if (keep) record_item(st, CB_RESP_ITEM_CALL, (uint32_t)index, 0);
    if (o->c) return cb_stream_tool_call(o->a, o->c, st, index, name, name_n, args, args_n) == CB_CONN_OK ? 0 : -1;
    return 0;
}

/* Released text held[0..n) of token i of a request with tools: onto text[],
 * then through the parser (content and calls streamed, or kept). An answer
 * that made calls ends with finish_reason "tool_calls"; with
 * parallel_tool_calls false it ends at its first call. Returns -1 when the
 * slot was released (the client left or reads too slowly). */
static int tool_text(cb_app *a, int s, size_t n, int i) {
    cb_slot *st = &a->slots[s];
    const cb_request *q = st->req;
    /* past a thinking block (reasoning.c): its opening newlines dropped, and
     * the parser reads the text after the block (reasoning_end; 0 without) */
    const size_t skip = cb_reasoning_skip(st, st->held, n);
    size_t room = st->text_cap - st->text_len, take = n - skip < room ? n - skip : room;
    memcpy(st->text + st->text_len, st->held + skip, take);
    st->text_len += take;
    cb_conn *c = q->stream ? cb_netloop_conn(a->loop, q->conn) : NULL;
    if (q->stream && !c) return 0; /* gone: on_close frees the slot */
    tool_out o = {a, c, st, q->logprobs ? i : -1};
    cb_tool_sink sink = {&o, tool_content, tool_call};
    const int r = cb_tool_parser_feed(&st->tools, st->text + st->reasoning_end, st->text_len - st->reasoning_end,
                                        st->finish_reason != NULL, &sink);
    if (r == 0 && c && o.token >= 0 && cb_stream_content(a, c, st, "", 0, o.token) != CB_CONN_OK) o.token = -2;
    if (r != 0 || o.token == -2) {
        if (c) {
            cb_conn_close(c);
            release_slot(a, s, 499, "slow-client");
        } else {
            c = cb_netloop_conn(a->loop, q->conn);
            if (c) cb_respond_error(a, c, 500, NULL, "the answer's tool calls do not fit the server's buffers");
            release_slot(a, s, 500, "tool-calls-too-large");
        }
        return -1;
    }
    if (st->tools.done || (st->finish_reason && st->n_calls)) st->finish_reason = "tool_calls";
    return 0;
}

/* Released text held[0..n) of token i: through the tool-call parser when the
 * request has tools (past any thinking block), else as text (release_text). */
static int release(cb_app *a, int s, size_t n, int i, int always) {
    cb_slot *st = &a->slots[s];
    if (!st->req->tool_format || st->think_state == CB_THINK_REASONING) return release_text(a, s, n, i, always);
    if (tool_text(a, s, n, i) != 0) return -1;
    memmove(st->held, st->held + n, st->held_len - n);
    st->held_len -= n;
    return 0;
}

static void fail_slot(cb_app *a, int s, const char *message, const char *outcome);

/* The next token of a constrained request (response_format): only tokens
 * that keep its output a valid prefix, within its max_tokens where it
 * can be; -1 when the vocabulary has none. Advances the matcher. */
static int32_t constrained_token(cb_app *a, cb_slot *st, const float *logits) {
    const cb_request *q = st->req;
    const cb_tokenizer *tok = cb_engine_tokenizer(a->engine);
    const int strip = tok->kind != CB_TOKENIZER_BYTES && (tok->flags & CB_TOKF_STRIP_SPACE) && !st->detok.text_started;
    const int i = st->n_generated;
    int32_t token = cb_con_sample(&a->con_vocab, &q->con, &st->con, &a->sampler, logits, &q->sampling,
                                  st->generated, i, &st->rng, st->max_tokens - i, strip);
    if (token >= 0) cb_con_advance(&a->con_vocab, &q->con, &st->con, token, strip);
    return token;
}

/* A new token for slot s: sample, record, release its text. */
static void take_token(cb_app *a, int s, const float *logits, uint64_t now) {
    cb_slot *st = &a->slots[s];
    const cb_request *q = st->req;
    const cb_tokenizer *tok = cb_engine_tokenizer(a->engine);
    const int i = st->n_generated;
    const uint64_t t0 = cb_thread_cpu_ns();
    int32_t token = q->constrained ? constrained_token(a, st, logits)
                                   : cb_sample(&a->sampler, logits, &q->sampling, st->generated, i, &st->rng);
    st->sample_ns += cb_thread_cpu_ns() - t0;
    if (token < 0) {
        fail_slot(a, s, "no token of the model's vocabulary continues the output the response_format asks for",
                  "constraint-dead-end");
        return;
    }
    st->trace_logits[i] = logits[token];
    if (q->logprobs)
        st->lp[i] = cb_logprobs(&a->sampler, logits, token, q->top_logprobs,
                                st->top_ids + (size_t)i * CB_MAX_TOP_LOGPROBS,
                                st->top_lp + (size_t)i * CB_MAX_TOP_LOGPROBS);
    st->generated[st->n_generated++] = token;
    st->reasoning_tokens += st->think_state == CB_THINK_REASONING;
    st->next_token = token;
    a->metrics.generated_tokens++;
    if (i == 0) st->first_token_ns = now;
    if (i == 0) cb_hist_observe(&a->metrics.ttft, (double)(now - q->arrived_ns) * 1e-9);
    else cb_hist_observe(&a->metrics.itl, (double)(now - st->last_token_ns) * 1e-9);
    st->last_token_ns = now;

    /* A constrained output ends where its document does (ignore_eos or not). */
    const int end = (q->constrained || !q->ignore_eos) && cb_is_end_token(tok, token);
    int released = 0;
    if (!end && cb_reasoning_marker(a, st, token)) {
        /* A thinking block opens or closes: what is held belongs before it. */
        int got = cb_detok_flush(&st->detok, st->held + st->held_len, CB_TOKEN_BYTES);
        if (got > 0) st->held_len += (size_t)got;
        const size_t before = releasable(st, 1);
        released = before > 0;
        if (release(a, s, before, i, 0) != 0) return;
        cb_reasoning_switch(a, st, token);
    } else if (!end && cb_harmony_header(a, st, token)) {
        /* a gpt-oss message header ("assistant", the channel): not text */
    } else if (!end) {
        int got = cb_detok_step(tok, &st->detok, token, st->held + st->held_len, CB_TOKEN_BYTES);
        if (got > 0) st->held_len += (size_t)got;
    }
    if (end || (q->constrained && cb_con_complete(&st->con))) st->finish_reason = "stop";
    else if (st->n_generated >= st->max_tokens) st->finish_reason = "length";
    if (st->finish_reason) { /* a character cut off at the end becomes U+FFFD */
        int got = cb_detok_flush(&st->detok, st->held + st->held_len, CB_TOKEN_BYTES);
        if (got > 0) st->held_len += (size_t)got;
    }
    size_t n = releasable(st, st->finish_reason != NULL);
    if (st->stopped) st->finish_reason = "stop";
    /* An event per token when logprobs are wanted, else per text. */
    if (release(a, s, n, i, q->logprobs && !released) != 0) return;
    st->token_ns[i] = cb_now_ns();
    if (st->finish_reason) finish(a, s);
}

/* Fails slot s's request with a 500 (a streamed one: an error event, then
 * the end); the slot is free for the next request (which rewrites the
 * cache before reading it). */
static void fail_slot(cb_app *a, int s, const char *message, const char *outcome) {
    cb_slot *st = &a->slots[s];
    fprintf(stderr, "colibri-server: request failed: %s\n", message);
    cb_conn *c = cb_netloop_conn(a->loop, st->req->conn);
    if (c && st->req->stream) {
        if (cb_stream_error(a, c, st, message) != CB_CONN_OK) cb_conn_close(c);
    } else if (c) {
        cb_respond_error(a, c, 500, NULL, message);
    }
    release_slot(a, s, 500, outcome);
    cb_prefix_forget(a, s);
}

/* ... naming where its numbers went non-finite. */
static void fail_non_finite(cb_app *a, int s, int fault) {
    char where[48], message[160];
    cb_engine_fault_text(a->engine, fault, where, sizeof where);
    snprintf(message, sizeof message, "the model produced non-finite values (NaN/inf) %s for this request", where);
    fail_slot(a, s, message, "non-finite");
}

/* ---- the scheduler ---- */

int cb_app_step(cb_app *a) {
    admit_queued(a);
    const int max_batch = cb_engine_max_batch(a->engine);
    const int L = (int)a->dims->n_layers, E = (int)a->dims->n_experts, k = (int)a->dims->top_k;
    int n = 0, limit = max_batch;
    /* Decoding slots first (one token each), then prompt chunks. While some
     * requests decode, a step carries at most step_tokens tokens (default
     * the slot count: a full decode step), prompt tokens filling what the
     * decoding slots leave and at least one: each token a MoE step carries
     * reads experts the others did not pick, so a step with a prompt chunk
     * on top of the decoding slots is longer and delays all their next
     * tokens (flat inter-token latency; time to first token pays). */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && n > 0 && a->step_tokens > 0) {
            const int cap = a->step_tokens > n ? a->step_tokens : n + 1;
            if (cap < limit) limit = cap;
        }
        for (int s = 0; s < a->n_slots && n < limit; s++) {
            cb_slot *st = &a->slots[s];
            if (!st->req || st->held_done) continue;
            const int n_prompt = st->req->n_prompt, prefilling = st->n_fed < n_prompt;
            if (pass == 0 && !prefilling) {
                a->batch[n] = (cb_batch_item){st->next_token, s, st->n_fed, 1, n_prompt, 1};
                a->batch_slot[n++] = s;
            } else if (pass == 1 && prefilling) {
                int take = n_prompt - st->n_fed;
                if (take > limit - n) take = limit - n;
                st->prompt_steps++;
                for (int i = 0; i < take; i++) {
                    int pos = st->n_fed + i;
                    /* rope_len: dynamic NTK RoPE rotates the whole prompt for its length */
                    /* llama_ubatch: the whole prompt's, reused prefix or not (prefix_cache.c) */
                    a->batch[n] = (cb_batch_item){st->req->prompt[pos], s, pos, pos == n_prompt - 1, n_prompt,
                                                  cb_llama_ubatch(pos, n_prompt)};
                    a->batch_slot[n++] = s;
                }
            }
        }
    }
    if (n == 0) return 0;
    char err[256];
    const int faults = cb_engine_forward(a->engine, a->batch, n, err, sizeof err);
    if (faults < 0) {
        /* A bug, not a client error: fail the requests of this step loudly. */
        fprintf(stderr, "colibri-server: forward failed: %s\n", err);
        for (int i = 0; i < n; i++) {
            cb_slot *st = &a->slots[a->batch_slot[i]];
            if (!st->req) continue;
            cb_conn *c = cb_netloop_conn(a->loop, st->req->conn);
            if (c && st->req->stream) cb_conn_close(c);
            else if (c) cb_respond_error(a, c, 500, NULL, err);
            release_slot(a, a->batch_slot[i], 500, "forward-failed");
            cb_prefix_forget(a, a->batch_slot[i]);
        }
        return 0;
    }
    /* Items that met a NaN or inf fail their own request only. */
    for (int i = 0; faults > 0 && i < n; i++) {
        const int fault = cb_engine_item_fault(a->engine, i);
        if (fault >= 0 && a->slots[a->batch_slot[i]].req) fail_non_finite(a, a->batch_slot[i], fault);
    }
    const uint64_t now = cb_now_ns();
    int row = 0;
    for (int i = 0; i < n; i++) {
        const int s = a->batch_slot[i];
        cb_slot *st = &a->slots[s];
        const int pos = a->batch[i].pos;
        const float *logits = a->batch[i].want_logits ? cb_engine_logits(a->engine, row++) : NULL;
        if (!st->req) continue;
        for (int l = 0; l < L; l++) {
            const int32_t *experts = cb_engine_routing(a->engine, i, l);
            for (int j = 0; j < k; j++) {
                if (experts[j] >= 0) { /* -1: a dense layer routes nowhere */
                    st->expert_counts[(size_t)l * E + experts[j]]++;
                    a->metrics.expert_tokens[(size_t)l * E + experts[j]]++;
                }
                st->trace_experts[((size_t)pos * L + l) * k + j] = experts[j];
            }
        }
        st->n_fed = pos + 1;
        if (logits) take_token(a, s, logits, now);
    }
    return cb_app_busy(a) > 0 || a->queue_len > 0;
}
