#include "app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "json.h"

#define MAX_JSON_TOKENS 65536
#define MAX_MESSAGES 256
#define RESPONSE_BYTES (1u << 20)
#define DEFAULT_MAX_TOKENS 256

typedef struct {
    int busy;
    cb_conn_id conn;
    uint64_t request_no;
    int trace;                 /* opt-in per-token trace in the response */
    int32_t *prompt;           /* [context] */
    int n_prompt, n_fed;       /* prompt tokens, tokens already in the KV cache */
    int32_t *generated;        /* [context] */
    int n_generated, max_tokens;
    int32_t next_token;        /* sampled, not yet fed */
    const char *finish_reason;
    uint32_t *expert_counts;   /* [layers][experts] over every token fed */
    float *trace_logits;       /* [context]: logit of each generated token */
    int32_t *trace_experts;    /* [context][layers][top_k] */
} slot_state;

struct cb_app {
    cb_engine *engine;
    cb_netloop *loop;
    const cb_dims *dims;
    int n_slots;
    slot_state *slots;
    cb_batch_item *batch;
    int *batch_slot;           /* slot of each batch item */
    cb_json_tok *toks;
    char *scratch;             /* unescaped message text */
    size_t scratch_cap;
    cb_chat_message *messages;
    char *text;                /* a formatted prompt or detokenized text [text_cap] */
    size_t text_cap;
    int32_t *ids;              /* /tokenize and /detokenize [scratch_cap] */
    char *response;
    uint64_t requests;
};

static void *alloc_zeroed(size_t count, size_t size, int *ok) {
    void *p = calloc(count ? count : 1, size);
    if (!p) *ok = 0;
    return p;
}

cb_app *cb_app_create(cb_engine *engine) {
    int ok = 1;
    cb_app *a = alloc_zeroed(1, sizeof *a, &ok);
    if (!a) return NULL;
    a->engine = engine;
    a->dims = cb_engine_dims(engine);
    a->n_slots = cb_engine_n_slots(engine);
    const size_t ctx = a->dims->context_len, L = a->dims->n_layers;
    a->slots = alloc_zeroed((size_t)a->n_slots, sizeof *a->slots, &ok);
    a->batch = alloc_zeroed((size_t)cb_engine_max_batch(engine), sizeof *a->batch, &ok);
    a->batch_slot = alloc_zeroed((size_t)cb_engine_max_batch(engine), sizeof *a->batch_slot, &ok);
    a->toks = alloc_zeroed(MAX_JSON_TOKENS, sizeof *a->toks, &ok);
    a->scratch_cap = 1u << 20;
    a->scratch = alloc_zeroed(a->scratch_cap, 1, &ok);
    a->messages = alloc_zeroed(MAX_MESSAGES, sizeof *a->messages, &ok);
    a->text_cap = a->scratch_cap + (1u << 16);
    a->text = alloc_zeroed(a->text_cap, 1, &ok);
    a->ids = alloc_zeroed(a->scratch_cap, sizeof(int32_t), &ok);
    a->response = alloc_zeroed(RESPONSE_BYTES, 1, &ok);
    for (int s = 0; ok && s < a->n_slots; s++) {
        slot_state *st = &a->slots[s];
        st->prompt = alloc_zeroed(ctx, sizeof(int32_t), &ok);
        st->generated = alloc_zeroed(ctx, sizeof(int32_t), &ok);
        st->expert_counts = alloc_zeroed(L * a->dims->n_experts, sizeof(uint32_t), &ok);
        st->trace_logits = alloc_zeroed(ctx, sizeof(float), &ok);
        st->trace_experts = alloc_zeroed(ctx * L * a->dims->top_k, sizeof(int32_t), &ok);
    }
    if (!ok) {
        cb_app_destroy(a);
        return NULL;
    }
    return a;
}

void cb_app_destroy(cb_app *a) {
    if (!a) return;
    for (int s = 0; a->slots && s < a->n_slots; s++) {
        free(a->slots[s].prompt);
        free(a->slots[s].generated);
        free(a->slots[s].expert_counts);
        free(a->slots[s].trace_logits);
        free(a->slots[s].trace_experts);
    }
    free(a->slots);
    free(a->batch);
    free(a->batch_slot);
    free(a->toks);
    free(a->scratch);
    free(a->messages);
    free(a->text);
    free(a->ids);
    free(a->response);
    free(a);
}

void cb_app_attach(cb_app *a, cb_netloop *loop) { a->loop = loop; }

int cb_app_busy(const cb_app *a) {
    int n = 0;
    for (int s = 0; s < a->n_slots; s++) n += a->slots[s].busy;
    return n;
}

/* ---- simple endpoints ---- */

static void respond_json(cb_app *a, cb_conn *c, int status, cb_jw *w) {
    if (w->overflow) {
        cb_conn_respond_error(c, 500, NULL, "response too large");
        return;
    }
    if (cb_conn_respond(c, status, "application/json", w->buf, w->len, NULL) != CB_CONN_OK)
        cb_conn_respond_error(c, 500, NULL, "response too large for the connection buffer");
    (void)a;
}

static void handle_health(cb_app *a, cb_conn *c) {
    cb_jw w;
    cb_jw_init(&w, a->response, RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "status");
    cb_jw_str(&w, "ok");
    cb_jw_key(&w, "slots");
    cb_jw_int(&w, a->n_slots);
    cb_jw_key(&w, "busy_slots");
    cb_jw_int(&w, cb_app_busy(a));
    cb_jw_end_object(&w);
    respond_json(a, c, 200, &w);
}

static void handle_models(cb_app *a, cb_conn *c) {
    cb_jw w;
    cb_jw_init(&w, a->response, RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "object");
    cb_jw_str(&w, "list");
    cb_jw_key(&w, "data");
    cb_jw_begin_array(&w);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "id");
    cb_jw_str(&w, cb_engine_model_name(a->engine));
    cb_jw_key(&w, "object");
    cb_jw_str(&w, "model");
    cb_jw_key(&w, "created");
    cb_jw_int(&w, 0);
    cb_jw_key(&w, "owned_by");
    cb_jw_str(&w, "colibri");
    cb_jw_end_object(&w);
    cb_jw_end_array(&w);
    cb_jw_end_object(&w);
    respond_json(a, c, 200, &w);
}

/* ---- chat completions ---- */

static int bad_request(cb_conn *c, const char *fmt, const char *detail) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, detail);
    cb_conn_respond_error(c, 400, "invalid_request_error", msg);
    return -1;
}

/* Reads messages into a->messages (text unescaped into a->scratch). */
static int read_messages(cb_app *a, cb_conn *c, const char *body, int arr, int *n_out) {
    const cb_json_tok *t = a->toks;
    if (arr < 0) return bad_request(c, "'messages' is required%s", "");
    if (t[arr].type != CB_JSON_ARRAY) return bad_request(c, "'messages' must be an array%s", "");
    if (t[arr].size == 0) return bad_request(c, "'messages' must not be empty%s", "");
    if (t[arr].size > MAX_MESSAGES) return bad_request(c, "'messages' has more than 256 entries%s", "");
    size_t used = 0;
    for (int i = 0; i < t[arr].size; i++) {
        char where[48];
        snprintf(where, sizeof where, "messages[%d]", i);
        int m = cb_json_array_at(t, arr, i);
        if (t[m].type != CB_JSON_OBJECT) return bad_request(c, "'%s' must be an object", where);
        int role = cb_json_find(body, t, m, "role"), content = cb_json_find(body, t, m, "content");
        if (role < 0 || t[role].type != CB_JSON_STRING)
            return bad_request(c, "'%s.role' must be a string", where);
        if (content < 0 || t[content].type != CB_JSON_STRING)
            return bad_request(c, "'%s.content' must be a string", where);
        cb_chat_message *msg = &a->messages[i];
        for (int part = 0; part < 2; part++) {
            int tok = part ? content : role;
            int n = cb_json_unescape(body, &t[tok], a->scratch + used, a->scratch_cap - used);
            if (n < 0) return bad_request(c, "'%s' holds an invalid string", where);
            if (part) msg->content = a->scratch + used, msg->content_len = (size_t)n;
            else msg->role = a->scratch + used, msg->role_len = (size_t)n;
            used += (size_t)n + 1;
        }
    }
    *n_out = t[arr].size;
    return 0;
}

static int free_slot(const cb_app *a) {
    for (int s = 0; s < a->n_slots; s++)
        if (!a->slots[s].busy) return s;
    return -1;
}

static void handle_chat(cb_app *a, cb_conn *c, const char *body, size_t len) {
    size_t err_at = 0;
    int n_tok = cb_json_parse(body, len, a->toks, MAX_JSON_TOKENS, &err_at);
    if (n_tok < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "request body is not valid JSON: %s at byte %zu", cb_json_strerror(n_tok), err_at);
        cb_conn_respond_error(c, 400, "invalid_request_error", msg);
        return;
    }
    const cb_json_tok *t = a->toks;
    if (t[0].type != CB_JSON_OBJECT) {
        bad_request(c, "request body must be a JSON object%s", "");
        return;
    }
    int64_t max_tokens = DEFAULT_MAX_TOKENS;
    const char *int_fields[] = {"max_tokens", "max_completion_tokens"};
    for (int f = 0; f < 2; f++) {
        int v = cb_json_find(body, t, 0, int_fields[f]);
        if (v < 0 || t[v].type == CB_JSON_NULL) continue;
        if (cb_json_get_int64(body, &t[v], &max_tokens) != 0 || max_tokens < 1) {
            bad_request(c, "'%s' must be a positive integer", int_fields[f]);
            return;
        }
    }
    int stream = cb_json_find(body, t, 0, "stream"), trace = cb_json_find(body, t, 0, "colibri_trace");
    int flag = 0;
    if (stream >= 0 && (cb_json_get_bool(&t[stream], &flag) != 0 || flag)) {
        bad_request(c, "'stream' is not supported by this server yet; send stream: false%s", "");
        return;
    }
    int want_trace = 0;
    if (trace >= 0 && cb_json_get_bool(&t[trace], &want_trace) != 0) {
        bad_request(c, "'colibri_trace' must be a boolean%s", "");
        return;
    }
    int n_messages = 0;
    if (read_messages(a, c, body, cb_json_find(body, t, 0, "messages"), &n_messages) != 0) return;

    int s = free_slot(a);
    if (s < 0) {
        static const char busy[] = "{\"error\":{\"message\":\"all slots are busy; retry shortly\","
                                   "\"type\":\"rate_limit_error\",\"param\":null,\"code\":null}}";
        cb_conn_respond(c, 429, "application/json", busy, sizeof busy - 1, "Retry-After: 1\r\n");
        return;
    }
    slot_state *st = &a->slots[s];
    const int ctx = (int)a->dims->context_len;
    char err[256];
    /* Leave room for at least one generated token. */
    int n = cb_chat_format(cb_engine_tokenizer(a->engine), a->messages, n_messages, a->text, a->text_cap,
                           st->prompt, ctx - 1, err, sizeof err);
    if (n < 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s (context_length %d)", err, ctx);
        cb_conn_respond_error(c, 400, "invalid_request_error", msg);
        return;
    }
    st->busy = 1;
    st->conn = cb_conn_handle(c);
    st->request_no = ++a->requests;
    st->trace = want_trace;
    st->n_prompt = n;
    st->n_fed = 0;
    st->n_generated = 0;
    st->max_tokens = max_tokens > ctx - n ? ctx - n : (int)max_tokens;
    st->finish_reason = NULL;
    memset(st->expert_counts, 0, sizeof(uint32_t) * a->dims->n_layers * a->dims->n_experts);
}

/* ---- /tokenize, /detokenize, /apply-template (llama.cpp's shapes) ---- */

/* Parses body as a JSON object into a->toks; 0, or -1 after answering 400. */
static int parse_object(cb_app *a, cb_conn *c, const char *body, size_t len) {
    size_t err_at = 0;
    int n_tok = cb_json_parse(body, len, a->toks, MAX_JSON_TOKENS, &err_at);
    if (n_tok < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "request body is not valid JSON: %s at byte %zu", cb_json_strerror(n_tok), err_at);
        cb_conn_respond_error(c, 400, "invalid_request_error", msg);
        return -1;
    }
    if (a->toks[0].type != CB_JSON_OBJECT) return bad_request(c, "request body must be a JSON object%s", "");
    return 0;
}

static void handle_tokenize(cb_app *a, cb_conn *c, const char *body, size_t len) {
    if (parse_object(a, c, body, len) != 0) return;
    int content = cb_json_find(body, a->toks, 0, "content");
    if (content < 0 || a->toks[content].type != CB_JSON_STRING) {
        bad_request(c, "'content' must be a string%s", "");
        return;
    }
    int special = 1, sp = cb_json_find(body, a->toks, 0, "parse_special");
    if (sp >= 0 && cb_json_get_bool(&a->toks[sp], &special) != 0) {
        bad_request(c, "'parse_special' must be a boolean%s", "");
        return;
    }
    int n = cb_json_unescape(body, &a->toks[content], a->scratch, a->scratch_cap);
    if (n < 0) {
        bad_request(c, "'content' holds an invalid string%s", "");
        return;
    }
    char err[256];
    int got = cb_tokenize_ex(cb_engine_tokenizer(a->engine), a->scratch, (size_t)n, special, a->ids,
                             (int)a->scratch_cap, err, sizeof err);
    if (got < 0) {
        bad_request(c, "%s", err);
        return;
    }
    cb_jw w;
    cb_jw_init(&w, a->response, RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "tokens");
    cb_jw_begin_array(&w);
    for (int i = 0; i < got; i++) cb_jw_int(&w, a->ids[i]);
    cb_jw_end_array(&w);
    cb_jw_end_object(&w);
    respond_json(a, c, 200, &w);
}

static void handle_detokenize(cb_app *a, cb_conn *c, const char *body, size_t len) {
    if (parse_object(a, c, body, len) != 0) return;
    const cb_json_tok *t = a->toks;
    int arr = cb_json_find(body, t, 0, "tokens");
    if (arr < 0 || t[arr].type != CB_JSON_ARRAY) {
        bad_request(c, "'tokens' must be an array of token ids%s", "");
        return;
    }
    const cb_tokenizer *tok = cb_engine_tokenizer(a->engine);
    int n = t[arr].size;
    if ((size_t)n > a->scratch_cap) {
        bad_request(c, "'tokens' has too many entries%s", "");
        return;
    }
    for (int i = 0, el = arr + 1; i < n; i++, el = cb_json_skip(t, el)) {
        int64_t v;
        if (cb_json_get_int64(body, &t[el], &v) != 0 || v < 0 || v >= (int64_t)cb_tokenizer_size(tok)) {
            char what[64];
            snprintf(what, sizeof what, "%d", i);
            bad_request(c, "'tokens[%s]' is not a token id of this model", what);
            return;
        }
        a->ids[i] = (int32_t)v;
    }
    long got = cb_detokenize(tok, a->ids, n, a->text, a->text_cap, NULL);
    if (got < 0) {
        bad_request(c, "the text of 'tokens' is too long%s", "");
        return;
    }
    cb_jw w;
    cb_jw_init(&w, a->response, RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "content");
    cb_jw_str_n(&w, a->text, (size_t)got);
    cb_jw_end_object(&w);
    respond_json(a, c, 200, &w);
}

/* The prompt text the chat template makes of messages (no inference). */
static void handle_apply_template(cb_app *a, cb_conn *c, const char *body, size_t len) {
    if (parse_object(a, c, body, len) != 0) return;
    int n_messages = 0;
    if (read_messages(a, c, body, cb_json_find(body, a->toks, 0, "messages"), &n_messages) != 0) return;
    char err[256];
    long got = cb_chat_render(cb_engine_tokenizer(a->engine), a->messages, n_messages, a->text, a->text_cap, err,
                              sizeof err);
    if (got < 0) {
        bad_request(c, "%s", err);
        return;
    }
    cb_jw w;
    cb_jw_init(&w, a->response, RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "prompt");
    cb_jw_str_n(&w, a->text, (size_t)got);
    cb_jw_end_object(&w);
    respond_json(a, c, 200, &w);
}

void cb_app_on_request(void *app, cb_conn *c, const cb_http_request *req, const char *body, size_t len) {
    cb_app *a = app;
    if (cb_http_path_is(req, "/tokenize") || cb_http_path_is(req, "/detokenize") ||
        cb_http_path_is(req, "/apply-template")) {
        if (!cb_http_method_is(req, "POST")) cb_conn_respond_error(c, 405, NULL, "use POST");
        else if (cb_http_path_is(req, "/tokenize")) handle_tokenize(a, c, body, len);
        else if (cb_http_path_is(req, "/detokenize")) handle_detokenize(a, c, body, len);
        else handle_apply_template(a, c, body, len);
    } else if (cb_http_path_is(req, "/health")) {
        if (cb_http_method_is(req, "GET")) handle_health(a, c);
        else cb_conn_respond_error(c, 405, NULL, "use GET /health");
    } else if (cb_http_path_is(req, "/v1/models")) {
        if (cb_http_method_is(req, "GET")) handle_models(a, c);
        else cb_conn_respond_error(c, 405, NULL, "use GET /v1/models");
    } else if (cb_http_path_is(req, "/v1/chat/completions")) {
        if (cb_http_method_is(req, "POST")) handle_chat(a, c, body, len);
        else cb_conn_respond_error(c, 405, NULL, "use POST /v1/chat/completions");
    } else {
        cb_conn_respond_error(c, 404, NULL, "no such endpoint");
    }
}

void cb_app_on_close(void *app, cb_conn_id id) {
    cb_app *a = app;
    /* The client left: its slot is free at once. */
    for (int s = 0; s < a->n_slots; s++)
        if (a->slots[s].busy && a->slots[s].conn == id) a->slots[s].busy = 0;
}

/* ---- the response ---- */

static void write_expert_activations(cb_app *a, cb_jw *w, const slot_state *st) {
    const int L = (int)a->dims->n_layers, E = (int)a->dims->n_experts;
    cb_jw_key(w, "expert_activations");
    cb_jw_begin_array(w);
    for (int l = 0; l < L; l++) {
        const uint32_t *counts = st->expert_counts + (size_t)l * E;
        cb_jw_begin_object(w);
        cb_jw_key(w, "layer");
        cb_jw_int(w, l);
        cb_jw_key(w, "experts");
        cb_jw_begin_array(w);
        for (int e = 0; e < E; e++)
            if (counts[e]) cb_jw_int(w, e);
        cb_jw_end_array(w);
        cb_jw_key(w, "counts");
        cb_jw_begin_array(w);
        for (int e = 0; e < E; e++)
            if (counts[e]) cb_jw_int(w, counts[e]);
        cb_jw_end_array(w);
        cb_jw_end_object(w);
    }
    cb_jw_end_array(w);
}

static void write_trace(cb_app *a, cb_jw *w, const slot_state *st) {
    const int L = (int)a->dims->n_layers, k = (int)a->dims->top_k;
    cb_jw_key(w, "colibri_trace");
    cb_jw_begin_object(w);
    cb_jw_key(w, "prompt_tokens");
    cb_jw_begin_array(w);
    for (int i = 0; i < st->n_prompt; i++) cb_jw_int(w, st->prompt[i]);
    cb_jw_end_array(w);
    cb_jw_key(w, "completion_tokens");
    cb_jw_begin_array(w);
    for (int i = 0; i < st->n_generated; i++) cb_jw_int(w, st->generated[i]);
    cb_jw_end_array(w);
    cb_jw_key(w, "completion_logits");
    cb_jw_begin_array(w);
    for (int i = 0; i < st->n_generated; i++) cb_jw_double(w, st->trace_logits[i]);
    cb_jw_end_array(w);
    /* [position][layer][k]: experts of every token that went through the model. */
    cb_jw_key(w, "experts");
    cb_jw_begin_array(w);
    for (int p = 0; p < st->n_fed; p++) {
        cb_jw_begin_array(w);
        for (int l = 0; l < L; l++) {
            cb_jw_begin_array(w);
            for (int j = 0; j < k; j++) cb_jw_int(w, st->trace_experts[((size_t)p * L + l) * k + j]);
            cb_jw_end_array(w);
        }
        cb_jw_end_array(w);
    }
    cb_jw_end_array(w);
    cb_jw_end_object(w);
}

static void finish(cb_app *a, int s) {
    slot_state *st = &a->slots[s];
    cb_conn *c = cb_netloop_conn(a->loop, st->conn);
    st->busy = 0;
    if (!c) return;
    const cb_tokenizer *tok = cb_engine_tokenizer(a->engine);
    int n_text = 0;
    while (n_text < st->n_generated && !cb_is_end_token(tok, st->generated[n_text])) n_text++;
    /* Whole UTF-8 characters only; a cut one at the end becomes U+FFFD. */
    long got = cb_detokenize(tok, st->generated, n_text, a->scratch, a->scratch_cap, NULL);
    size_t text_len = got > 0 ? (size_t)got : 0;
    char id[48];
    snprintf(id, sizeof id, "chatcmpl-%llu", (unsigned long long)st->request_no);
    cb_jw w;
    cb_jw_init(&w, a->response, RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "id");
    cb_jw_str(&w, id);
    cb_jw_key(&w, "object");
    cb_jw_str(&w, "chat.completion");
    cb_jw_key(&w, "created");
    cb_jw_int(&w, (int64_t)time(NULL));
    cb_jw_key(&w, "model");
    cb_jw_str(&w, cb_engine_model_name(a->engine));
    cb_jw_key(&w, "choices");
    cb_jw_begin_array(&w);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "index");
    cb_jw_int(&w, 0);
    cb_jw_key(&w, "message");
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "role");
    cb_jw_str(&w, "assistant");
    cb_jw_key(&w, "content");
    cb_jw_str_n(&w, a->scratch, text_len);
    cb_jw_end_object(&w);
    cb_jw_key(&w, "finish_reason");
    cb_jw_str(&w, st->finish_reason);
    cb_jw_end_object(&w);
    cb_jw_end_array(&w);
    cb_jw_key(&w, "usage");
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "prompt_tokens");
    cb_jw_int(&w, st->n_prompt);
    cb_jw_key(&w, "completion_tokens");
    cb_jw_int(&w, st->n_generated);
    cb_jw_key(&w, "total_tokens");
    cb_jw_int(&w, st->n_prompt + st->n_generated);
    cb_jw_end_object(&w);
    write_expert_activations(a, &w, st);
    if (st->trace) write_trace(a, &w, st);
    cb_jw_end_object(&w);
    respond_json(a, c, 200, &w);
}

/* ---- the scheduler ---- */

int cb_app_step(cb_app *a) {
    const int max_batch = cb_engine_max_batch(a->engine);
    const int L = (int)a->dims->n_layers, E = (int)a->dims->n_experts, k = (int)a->dims->top_k;
    int n = 0;
    /* Decoding slots first (one token each, so their latency stays flat),
     * then prompt chunks fill the rest of the step. */
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 0; s < a->n_slots && n < max_batch; s++) {
            slot_state *st = &a->slots[s];
            if (!st->busy) continue;
            int prefilling = st->n_fed < st->n_prompt;
            if (pass == 0 && !prefilling) {
                a->batch[n] = (cb_batch_item){st->next_token, s, st->n_fed, 1};
                a->batch_slot[n++] = s;
            } else if (pass == 1 && prefilling) {
                int take = st->n_prompt - st->n_fed;
                if (take > max_batch - n) take = max_batch - n;
                for (int i = 0; i < take; i++) {
                    int pos = st->n_fed + i;
                    a->batch[n] = (cb_batch_item){st->prompt[pos], s, pos, pos == st->n_prompt - 1};
                    a->batch_slot[n++] = s;
                }
            }
        }
    }
    if (n == 0) return 0;
    char err[256];
    if (cb_engine_forward(a->engine, a->batch, n, err, sizeof err) != 0) {
        /* A bug, not a client error: fail the requests of this step loudly. */
        fprintf(stderr, "colibri-server: forward failed: %s\n", err);
        for (int i = 0; i < n; i++) {
            slot_state *st = &a->slots[a->batch_slot[i]];
            if (!st->busy) continue;
            cb_conn *c = cb_netloop_conn(a->loop, st->conn);
            if (c) cb_conn_respond_error(c, 500, NULL, err);
            st->busy = 0;
        }
        return 0;
    }
    int row = 0;
    for (int i = 0; i < n; i++) {
        slot_state *st = &a->slots[a->batch_slot[i]];
        const int pos = a->batch[i].pos;
        for (int l = 0; l < L; l++) {
            const int32_t *experts = cb_engine_routing(a->engine, i, l);
            for (int j = 0; j < k; j++) {
                st->expert_counts[(size_t)l * E + experts[j]]++;
                st->trace_experts[((size_t)pos * L + l) * k + j] = experts[j];
            }
        }
        st->n_fed = pos + 1;
        if (!a->batch[i].want_logits) continue;
        const float *logits = cb_engine_logits(a->engine, row++);
        if (!st->busy) continue; /* client left during the step */
        int32_t token = cb_argmax(logits, (int)a->dims->vocab);
        st->trace_logits[st->n_generated] = logits[token];
        st->generated[st->n_generated++] = token;
        st->next_token = token;
        if (cb_is_end_token(cb_engine_tokenizer(a->engine), token)) st->finish_reason = "stop";
        else if (st->n_generated >= st->max_tokens) st->finish_reason = "length";
        if (st->finish_reason) finish(a, a->batch_slot[i]);
    }
    return cb_app_busy(a) > 0;
}
