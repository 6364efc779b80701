/* Writing answers in OpenAI's shapes: chat.completion, text_completion and
 * their stream chunks (server-sent events; /v1/responses' own shapes are
 * written by responses.c, called from here), plus Colibri's additions:
 * expert_activations always, colibri_trace on request. All JSON is built in
 * the app's preallocated response buffer. */
#include <stdio.h>
#include <string.h>

#include "app_internal.h"

void cb_respond_json(cb_app *a, cb_conn *c, int status, cb_jw *w) {
    if (w->overflow) {
        cb_respond_error(a, c, 500, NULL, "response too large");
        return;
    }
    if (cb_conn_respond(c, status, "application/json", w->buf, w->len, NULL) != CB_CONN_OK) {
        cb_respond_error(a, c, 500, NULL, "response too large for the connection buffer");
        return;
    }
    cb_metrics_status(&a->metrics, status);
}

void cb_respond_error(cb_app *a, cb_conn *c, int status, const char *type, const char *message) {
    cb_metrics_status(&a->metrics, status);
    cb_conn_respond_error(c, status, type, message);
}

void cb_respond_error_ex(cb_app *a, cb_conn *c, int status, const char *type, const char *param, const char *code,
                         const char *message) {
    char body[2048];
    cb_jw w;
    cb_jw_init(&w, body, sizeof body);
    cb_jw_openai_error_ex(&w, message, type, param, code);
    if (w.overflow) {
        cb_respond_error(a, c, status, type, message); /* cut to fit there */
        return;
    }
    cb_metrics_status(&a->metrics, status);
    cb_conn_respond(c, status, "application/json", body, w.len, NULL);
}

/* ---- pieces ---- */

static void write_head(cb_app *a, cb_jw *w, const cb_request *q, int chunk) {
    char id[48];
    snprintf(id, sizeof id, "%s-%llu", q->endpoint == CB_EP_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)q->request_no);
    cb_jw_key(w, "id");
    cb_jw_str(w, id);
    cb_jw_key(w, "object");
    cb_jw_str(w, q->endpoint == CB_EP_COMPLETION ? "text_completion"
                 : chunk                         ? "chat.completion.chunk"
                                                 : "chat.completion");
    cb_jw_key(w, "created");
    cb_jw_int(w, q->created);
    cb_jw_key(w, "model");
    cb_jw_str(w, cb_engine_model_name(a->engine));
}

static void write_usage(cb_jw *w, const cb_slot *st) {
    cb_jw_key(w, "usage");
    cb_jw_begin_object(w);
    /* A list of prompts: over all of them (the others' counts are in req). */
    const int prompt = st->req->n_prompt + st->req->group_prompt;
    const int completion = st->n_generated + st->req->group_completion;
    cb_jw_key(w, "prompt_tokens");
    cb_jw_int(w, prompt);
    cb_jw_key(w, "completion_tokens");
    cb_jw_int(w, completion);
    cb_jw_key(w, "total_tokens");
    cb_jw_int(w, prompt + completion);
    cb_jw_key(w, "prompt_tokens_details"); /* OpenAI's: prompt tokens the prefix cache supplied */
    cb_jw_begin_object(w);
    cb_jw_key(w, "cached_tokens");
    cb_jw_int(w, st->cached + st->req->group_cached);
    cb_jw_end_object(w);
    cb_jw_end_object(w);
    cb_write_timings(w, st);
}

void cb_write_timings(cb_jw *w, const cb_slot *st) {
    /* Measured in the server, so a client's own overhead is not in them:
     * queue wait, prompt (admission to the first token), and generation
     * (first token to last, n_generated - 1 steps). */
    const double queued_ms = (double)(st->admitted_ns - st->req->arrived_ns) * 1e-6;
    const double prompt_ms = st->n_generated ? (double)(st->first_token_ns - st->admitted_ns) * 1e-6 : 0;
    const double decode_ms = st->n_generated > 1 ? (double)(st->last_token_ns - st->first_token_ns) * 1e-6 : 0;
    cb_jw_key(w, "timings");
    cb_jw_begin_object(w);
    cb_jw_key(w, "queued_ms");
    cb_jw_double(w, queued_ms);
    cb_jw_key(w, "prompt_ms");
    cb_jw_double(w, prompt_ms);
    cb_jw_key(w, "decode_ms");
    cb_jw_double(w, decode_ms);
    cb_jw_key(w, "prompt_tokens_per_second");
    cb_jw_double(w, prompt_ms > 0 ? st->req->n_prompt / prompt_ms * 1e3 : 0);
    cb_jw_key(w, "decode_tokens_per_second");
    cb_jw_double(w, decode_ms > 0 ? (st->n_generated - 1) / decode_ms * 1e3 : 0);
    cb_jw_key(w, "prompt_steps"); /* more than the prompt needs alone: other requests were decoding */
    cb_jw_int(w, st->prompt_steps);
    /* The loop thread's CPU time choosing the tokens (a constraint's masks
     * included): what a constraint costs a token, whatever was sampled. */
    cb_jw_key(w, "sample_ms");
    cb_jw_double(w, (double)st->sample_ns * 1e-6);
    if (st->req->trace) {
        /* When each token's text (its event, streaming) was handed to the
         * connection, ms after arrival: inter-token times free of a
         * client's own scheduling, beside the ones it measures. */
        cb_jw_key(w, "token_ms");
        cb_jw_begin_array(w);
        for (int i = 0; i < st->n_generated; i++)
            cb_jw_double(w, (double)(st->token_ns[i] - st->req->arrived_ns) * 1e-6);
        cb_jw_end_array(w);
    }
    cb_jw_end_object(w);
}

void cb_write_expert_activations(cb_app *a, cb_jw *w, const cb_slot *st) {
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

void cb_write_trace(cb_app *a, cb_jw *w, const cb_slot *st) {
    const int L = (int)a->dims->n_layers, k = (int)a->dims->top_k;
    const cb_request *q = st->req;
    cb_jw_key(w, "colibri_trace");
    cb_jw_begin_object(w);
    cb_jw_key(w, "prompt_tokens");
    cb_jw_begin_array(w);
    for (int i = 0; i < q->n_prompt; i++) cb_jw_int(w, q->prompt[i]);
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

static size_t token_text(cb_app *a, int32_t id, char *buf) {
    return cb_token_bytes(cb_engine_tokenizer(a->engine), id, buf, CB_TOKEN_BYTES);
}

static void write_token_entry(cb_app *a, cb_jw *w, int32_t id, float lp) {
    char text[CB_TOKEN_BYTES];
    size_t n = token_text(a, id, text);
    cb_jw_key(w, "token");
    cb_jw_str_n(w, text, n);
    cb_jw_key(w, "logprob");
    cb_jw_double(w, lp);
    cb_jw_key(w, "bytes");
    cb_jw_begin_array(w);
    for (size_t i = 0; i < n; i++) cb_jw_int(w, (uint8_t)text[i]);
    cb_jw_end_array(w);
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs}]} over tokens
 * [from, to). */
static void write_chat_logprobs(cb_app *a, cb_jw *w, const cb_slot *st, int from, int to) {
    const int top = st->req->top_logprobs;
    cb_jw_key(w, "logprobs");
    if (!st->req->logprobs) {
        cb_jw_null(w);
        return;
    }
    cb_jw_begin_object(w);
    cb_jw_key(w, "content");
    cb_jw_begin_array(w);
    for (int i = from; i < to; i++) {
        cb_jw_begin_object(w);
        write_token_entry(a, w, st->generated[i], st->lp[i]);
        cb_jw_key(w, "top_logprobs");
        cb_jw_begin_array(w);
        for (int j = 0; j < top; j++) {
            cb_jw_begin_object(w);
            write_token_entry(a, w, st->top_ids[(size_t)i * CB_MAX_TOP_LOGPROBS + j],
                              st->top_lp[(size_t)i * CB_MAX_TOP_LOGPROBS + j]);
            cb_jw_end_object(w);
        }
        cb_jw_end_array(w);
        cb_jw_end_object(w);
    }
    cb_jw_end_array(w);
    cb_jw_end_object(w);
}

/* Legacy completions: {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"} over tokens [from, to); offsets start at text_offset. */
static void write_legacy_logprobs(cb_app *a, cb_jw *w, const cb_slot *st, int from, int to, size_t text_offset) {
    char text[CB_TOKEN_BYTES + 1];
    cb_jw_key(w, "logprobs");
    if (!st->req->logprobs) {
        cb_jw_null(w);
        return;
    }
    cb_jw_begin_object(w);
    cb_jw_key(w, "tokens");
    cb_jw_begin_array(w);
    for (int i = from; i < to; i++) cb_jw_str_n(w, text, token_text(a, st->generated[i], text));
    cb_jw_end_array(w);
    cb_jw_key(w, "token_logprobs");
    cb_jw_begin_array(w);
    for (int i = from; i < to; i++) cb_jw_double(w, st->lp[i]);
    cb_jw_end_array(w);
    cb_jw_key(w, "top_logprobs");
    cb_jw_begin_array(w);
    for (int i = from; i < to; i++) {
        cb_jw_begin_object(w);
        for (int j = 0; j < st->req->top_logprobs; j++) {
            size_t n = token_text(a, st->top_ids[(size_t)i * CB_MAX_TOP_LOGPROBS + j], text);
            text[n] = 0; /* a key is a C string; a NUL byte token shows as "" */
            cb_jw_key(w, text);
            cb_jw_double(w, st->top_lp[(size_t)i * CB_MAX_TOP_LOGPROBS + j]);
        }
        cb_jw_end_object(w);
    }
    cb_jw_end_array(w);
    cb_jw_key(w, "text_offset");
    cb_jw_begin_array(w);
    for (int i = from; i < to; i++) {
        cb_jw_int(w, (int64_t)text_offset);
        text_offset += token_text(a, st->generated[i], text);
    }
    cb_jw_end_array(w);
    cb_jw_end_object(w);
}

/* ---- tool calls ---- */

/* A call's id: "call_" and 9 letters or digits (Mistral's templates want
 * exactly 9 and take the bare 9), unique per request and index. */
void cb_tool_call_id(const cb_request *q, int index, char out[16]) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t x = q->request_no * 0x9E3779B97F4A7C15ull + (uint64_t)index * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)q->created;
    x ^= x >> 31, x *= 0x94D049BB133111EBull, x ^= x >> 29;
    int n = 0;
    if (q->tool_format != CB_TOOLFMT_MISTRAL) memcpy(out, "call_", 5), n = 5;
    for (int i = 0; i < 9; i++, x /= 62) out[n++] = digits[x % 62];
    out[n] = 0;
}

static void write_tool_head(cb_jw *w, const cb_request *q, int index, const char *name, size_t name_len,
                            const char *args, size_t args_len) {
    char id[16];
    cb_tool_call_id(q, index, id);
    cb_jw_key(w, "index");
    cb_jw_int(w, index);
    cb_jw_key(w, "id");
    cb_jw_str(w, id);
    cb_jw_key(w, "type");
    cb_jw_str(w, "function");
    cb_jw_key(w, "function");
    cb_jw_begin_object(w);
    cb_jw_key(w, "name");
    cb_jw_str_n(w, name, name_len);
    cb_jw_key(w, "arguments");
    cb_jw_str_n(w, args, args_len);
    cb_jw_end_object(w);
}

/* After "content": the content (null when empty and there are calls, as
 * OpenAI answers), then "tool_calls" when there are any. */
static void write_tool_message(cb_jw *w, const cb_slot *st) {
    if (st->tool_content_len || !st->n_calls) cb_jw_str_n(w, st->tool_content, st->tool_content_len);
    else cb_jw_null(w);
    if (!st->n_calls) return;
    cb_jw_key(w, "tool_calls");
    cb_jw_begin_array(w);
    for (int i = 0; i < st->n_calls; i++) {
        const cb_tool_call_span *c = &st->calls[i];
        cb_jw_begin_object(w);
        write_tool_head(w, st->req, i, st->tool_calls + c->name_off, c->name_len, st->tool_calls + c->args_off,
                        c->args_len);
        cb_jw_end_object(w);
    }
    cb_jw_end_array(w);
}

/* ---- non-streaming ---- */

/* "content", and "reasoning_content" where the template marks thinking
 * text: what a thinking block held (null without one), the rest after it. */
static void write_message_text(cb_jw *w, const cb_slot *st) {
    size_t from = 0;
    if (st->think_state != CB_THINK_NONE) {
        const size_t end = st->think_state == CB_THINK_REASONING ? st->text_len : st->reasoning_end;
        cb_jw_key(w, "reasoning_content");
        if (st->had_reasoning) cb_jw_str_n(w, st->text, end);
        else cb_jw_null(w);
        if (st->had_reasoning) from = end;
    }
    cb_jw_key(w, "content");
    if (st->req->tool_format) write_tool_message(w, st);
    else cb_jw_str_n(w, st->text + from, st->text_len - from);
}

/* One choice of a plain answer. */
static void write_choice(cb_app *a, cb_jw *w, const cb_slot *st) {
    const cb_request *q = st->req;
    cb_jw_begin_object(w);
    cb_jw_key(w, "index");
    cb_jw_int(w, q->choice);
    if (q->endpoint == CB_EP_CHAT) {
        cb_jw_key(w, "message");
        cb_jw_begin_object(w);
        cb_jw_key(w, "role");
        cb_jw_str(w, "assistant");
        write_message_text(w, st);
        cb_jw_end_object(w);
        write_chat_logprobs(a, w, st, 0, st->n_generated);
    } else {
        cb_jw_key(w, "text");
        cb_jw_str_n(w, st->text, st->text_len);
        write_legacy_logprobs(a, w, st, 0, st->n_generated, 0);
    }
    cb_jw_key(w, "finish_reason");
    cb_jw_str(w, st->finish_reason);
    cb_jw_end_object(w);
}

void cb_respond_final(cb_app *a, cb_conn *c, const cb_slot *st) {
    if (st->req->endpoint == CB_EP_RESPONSES) cb_responses_final(a, c, st);
    else cb_respond_final_list(a, c, &st, 1, st);
}

void cb_respond_final_list(cb_app *a, cb_conn *c, const cb_slot *const *sts, int n, const cb_slot *st) {
    const cb_request *q = st->req;
    cb_jw w;
    cb_jw_init(&w, a->response, CB_RESPONSE_BYTES);
    cb_jw_begin_object(&w);
    write_head(a, &w, q, 0);
    cb_jw_key(&w, "choices");
    cb_jw_begin_array(&w);
    for (int i = 0; i < n; i++) write_choice(a, &w, sts[i]);
    cb_jw_end_array(&w);
    write_usage(&w, st);
    cb_write_expert_activations(a, &w, st);
    if (q->trace) cb_write_trace(a, &w, sts[0]);
    cb_jw_end_object(&w);
    cb_respond_json(a, c, 200, &w);
}

/* ---- streaming ---- */

/* Sends a->response[0..len) framed as one event: "data: <json>\n\n". The
 * JSON was written at a->response + 6. */
static int send_event(cb_app *a, cb_conn *c, cb_jw *w) {
    if (w->overflow) return CB_CONN_ERR_FULL;
    memcpy(a->response, "data: ", 6);
    memcpy(a->response + 6 + w->len, "\n\n", 2);
    return cb_conn_stream_write(c, a->response, w->len + 8);
}

static void begin_event(cb_app *a, cb_jw *w) { cb_jw_init(w, a->response + 6, CB_RESPONSE_BYTES - 8); }

/* A stream chunk up to its one choice's "index": 0. */
static void begin_choice_chunk(cb_app *a, cb_jw *w, const cb_request *q) {
    begin_event(a, w);
    cb_jw_begin_object(w);
    write_head(a, w, q, 1);
    cb_jw_key(w, "choices");
    cb_jw_begin_array(w);
    cb_jw_begin_object(w);
    cb_jw_key(w, "index");
    cb_jw_int(w, q->choice);
}

/* A stream chunk's choice after its fields: "finish_reason" (NULL: null),
 * then the choice and the choices closed; the caller closes the chunk (the
 * last one adds fields first). */
static void end_choice_chunk(cb_jw *w, const char *finish_reason) {
    cb_jw_key(w, "finish_reason");
    if (finish_reason) cb_jw_str(w, finish_reason);
    else cb_jw_null(w);
    cb_jw_end_object(w);
    cb_jw_end_array(w);
}

int cb_stream_delta(cb_app *a, cb_conn *c, cb_slot *st, const char *text, size_t len, int token) {
    const cb_request *q = st->req;
    if (q->endpoint == CB_EP_RESPONSES) return cb_responses_stream_text(a, c, st, text, len, token);
    cb_jw w;
    begin_choice_chunk(a, &w, q);
    if (q->endpoint == CB_EP_CHAT) {
        cb_jw_key(&w, "delta");
        cb_jw_begin_object(&w);
        if (token < 0) { /* the opening event */
            cb_jw_key(&w, "role");
            cb_jw_str(&w, "assistant");
        }
        /* Text of a thinking block goes out as reasoning_content. */
        cb_jw_key(&w, token >= 0 && st->think_state == CB_THINK_REASONING ? "reasoning_content" : "content");
        cb_jw_str_n(&w, text, len);
        cb_jw_end_object(&w);
        if (token >= 0) write_chat_logprobs(a, &w, st, token, token + 1);
        else {
            cb_jw_key(&w, "logprobs");
            cb_jw_null(&w);
        }
    } else {
        cb_jw_key(&w, "text");
        cb_jw_str_n(&w, text, len);
        if (token >= 0) write_legacy_logprobs(a, &w, st, token, token + 1, st->stream_text_len - len);
        else {
            cb_jw_key(&w, "logprobs");
            cb_jw_null(&w);
        }
    }
    end_choice_chunk(&w, NULL);
    cb_jw_end_object(&w);
    return send_event(a, c, &w);
}

int cb_stream_content(cb_app *a, cb_conn *c, cb_slot *st, const char *text, size_t len, int token) {
    if (st->req->endpoint == CB_EP_RESPONSES) return cb_responses_stream_text(a, c, st, text, len, 0);
    cb_jw w;
    begin_choice_chunk(a, &w, st->req);
    cb_jw_key(&w, "delta");
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "content");
    cb_jw_str_n(&w, text, len);
    cb_jw_end_object(&w);
    if (token >= 0) write_chat_logprobs(a, &w, st, token, token + 1);
    else {
        cb_jw_key(&w, "logprobs");
        cb_jw_null(&w);
    }
    end_choice_chunk(&w, NULL);
    cb_jw_end_object(&w);
    return send_event(a, c, &w);
}

int cb_stream_tool_call(cb_app *a, cb_conn *c, cb_slot *st, int index, const char *name, size_t name_len,
                        const char *args, size_t args_len) {
    if (st->req->endpoint == CB_EP_RESPONSES) return cb_responses_stream_call(a, c, st, index);
    /* OpenAI's shape: the head (arguments ""), then argument fragments; a
     * call is complete when it is parsed, so its arguments are one fragment */
    for (int part = 0; part < 2; part++) {
        cb_jw w;
        begin_choice_chunk(a, &w, st->req);
        cb_jw_key(&w, "delta");
        cb_jw_begin_object(&w);
        cb_jw_key(&w, "tool_calls");
        cb_jw_begin_array(&w);
        cb_jw_begin_object(&w);
        if (part == 0) {
            write_tool_head(&w, st->req, index, name, name_len, "", 0);
        } else {
            cb_jw_key(&w, "index");
            cb_jw_int(&w, index);
            cb_jw_key(&w, "function");
            cb_jw_begin_object(&w);
            cb_jw_key(&w, "arguments");
            cb_jw_str_n(&w, args, args_len);
            cb_jw_end_object(&w);
        }
        cb_jw_end_object(&w);
        cb_jw_end_array(&w);
        cb_jw_end_object(&w);
        cb_jw_key(&w, "logprobs");
        cb_jw_null(&w);
        end_choice_chunk(&w, NULL);
        cb_jw_end_object(&w);
        int r = send_event(a, c, &w);
        if (r != CB_CONN_OK) return r;
    }
    return CB_CONN_OK;
}

int cb_stream_finish_choice(cb_app *a, cb_conn *c, const cb_slot *st) {
    const cb_request *q = st->req;
    cb_jw w;
    begin_choice_chunk(a, &w, q);
    if (q->endpoint == CB_EP_CHAT) {
        cb_jw_key(&w, "delta");
        cb_jw_begin_object(&w);
        cb_jw_end_object(&w);
    } else {
        cb_jw_key(&w, "text");
        cb_jw_str(&w, "");
    }
    cb_jw_key(&w, "logprobs");
    cb_jw_null(&w);
    end_choice_chunk(&w, st->finish_reason);
    cb_write_expert_activations(a, &w, st);
    if (q->trace) cb_write_trace(a, &w, st);
    cb_jw_end_object(&w);
    return send_event(a, c, &w);
}

int cb_stream_finish(cb_app *a, cb_conn *c, cb_slot *st) {
    const cb_request *q = st->req;
    if (q->endpoint == CB_EP_RESPONSES) return cb_responses_stream_finish(a, c, st);
    cb_jw w;
    int r = cb_stream_finish_choice(a, c, st);
    if (r == CB_CONN_OK && q->include_usage) {
        /* OpenAI's last chunk: no choices, the usage. */
        begin_event(a, &w);
        cb_jw_begin_object(&w);
        write_head(a, &w, q, 1);
        cb_jw_key(&w, "choices");
        cb_jw_begin_array(&w);
        cb_jw_end_array(&w);
        write_usage(&w, st);
        cb_jw_end_object(&w);
        r = send_event(a, c, &w);
    }
    if (r == CB_CONN_OK) r = cb_conn_stream_write(c, "data: [DONE]\n\n", 14);
    if (r == CB_CONN_OK) r = cb_conn_stream_end(c);
    return r;
}

int cb_stream_error(cb_app *a, cb_conn *c, cb_slot *st, const char *message) {
    if (st->req->endpoint == CB_EP_RESPONSES) return cb_responses_stream_error(a, c, st, message);
    cb_jw w;
    begin_event(a, &w);
    cb_jw_openai_error(&w, message, "server_error");
    int r = send_event(a, c, &w);
    /* [DONE] as after any stream, so a client that reads to it stops there. */
    if (r == CB_CONN_OK) r = cb_conn_stream_write(c, "data: [DONE]\n\n", 14);
    if (r == CB_CONN_OK) r = cb_conn_stream_end(c);
    return r;
}
