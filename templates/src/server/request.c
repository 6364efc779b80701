/* Reading a /v1/chat/completions or /v1/completions body into a cb_request:
 * every field OpenAI defines is either honoured, ignored because it does
 * not change the answer (user, metadata...), or refused by name; unknown
 * fields are ignored. Errors name the field and what was expected. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "app_internal.h"

typedef struct {
    cb_app *a;
    const char *body;
    const cb_json_tok *t;
    char *err;
    size_t err_len;
} reader;

static int fail(reader *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->err_len, fmt, ap);
    va_end(ap);
    return 400;
}

/* The value of a top-level field, or -1 when absent or null. */
static int field(reader *r, const char *name) {
    int v = cb_json_find(r->body, r->t, 0, name);
    return v >= 0 && r->t[v].type != CB_JSON_NULL ? v : -1;
}

static int read_number(reader *r, const char *name, double lo, double hi, float *out) {
    int v = field(r, name);
    double x;
    if (v < 0) return 0;
    if (cb_json_get_double(r->body, &r->t[v], &x) != 0 || x < lo || x > hi)
        return fail(r, "'%s' must be a number from %g to %g", name, lo, hi);
    *out = (float)x;
    return 0;
}

static int read_int(reader *r, const char *name, int64_t lo, int64_t hi, int64_t *out) {
    int v = field(r, name);
    if (v < 0) return 0;
    if (cb_json_get_int64(r->body, &r->t[v], out) != 0 || *out < lo || *out > hi)
        return fail(r, "'%s' must be an integer from %lld to %lld", name, (long long)lo, (long long)hi);
    return 0;
}

static int read_bool(reader *r, const char *name, int *out) {
    int v = field(r, name);
    if (v >= 0 && cb_json_get_bool(&r->t[v], out) != 0) return fail(r, "'%s' must be true or false", name);
    return 0;
}

/* Parameters that would change the answer in ways this server does not
 * implement: refused together, by name. */
static int refuse_unsupported(reader *r, cb_endpoint ep) {
    static const char *never[] = {"tools", "tool_choice", "functions", "function_call", "audio", "modalities",
                                  "prediction", "suffix"};
    char names[256] = "";
    size_t used = 0;
#define ADD(name) used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", name)
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        if (field(r, never[i]) >= 0) ADD(never[i]);
    int v = field(r, "logit_bias");
    if (v >= 0 && !(r->t[v].type == CB_JSON_OBJECT && r->t[v].size == 0)) ADD("logit_bias");
    int64_t x;
    v = field(r, "best_of");
    if (v >= 0 && (cb_json_get_int64(r->body, &r->t[v], &x) != 0 || x != 1)) ADD("best_of");
    int flag = 0;
    v = field(r, "echo");
    if (ep == CB_EP_COMPLETION && v >= 0 && (cb_json_get_bool(&r->t[v], &flag) != 0 || flag)) ADD("echo");
#undef ADD
    if (used) return fail(r, "unsupported parameters: %s", names);
    v = field(r, "n");
    if (v >= 0 && (cb_json_get_int64(r->body, &r->t[v], &x) != 0 || x != 1))
        return fail(r, "'n': only n=1 is supported");
    return 0;
}

static int read_stop(reader *r, cb_request *q) {
    int v = field(r, "stop");
    q->n_stop = 0;
    if (v < 0) return 0;
    const cb_json_tok *t = r->t;
    int one = t[v].type == CB_JSON_STRING, n = one ? 1 : t[v].size;
    if (!one && t[v].type != CB_JSON_ARRAY) return fail(r, "'stop' must be a string or an array of strings");
    if (n > CB_MAX_STOP) return fail(r, "'stop' has %d entries; at most %d are allowed", n, CB_MAX_STOP);
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        int s = one ? v : cb_json_array_at(t, v, i);
        if (t[s].type != CB_JSON_STRING) return fail(r, "'stop[%d]' must be a string", i);
        int len = cb_json_unescape(r->body, &t[s], q->stop_text + used, sizeof q->stop_text - used);
        if (len == -1) return fail(r, "'stop' holds more than %d bytes in all", CB_STOP_BYTES - CB_MAX_STOP);
        if (len < 0) return fail(r, "'stop[%d]' holds an invalid string", i);
        if (len == 0) return fail(r, "'stop[%d]' must not be empty", i);
        q->stop_off[i] = (uint16_t)used;
        q->stop_len[i] = (uint16_t)len;
        used += (size_t)len + 1;
    }
    q->n_stop = n;
    return 0;
}

/* "messages" into a->messages (their text in a->scratch, for the byte
 * tokenizer's framing); returns the count through *n_out. The template gets
 * the messages as JSON, so other fields (tool_calls, tool_call_id, name,
 * reasoning_content) reach it too. */
static int parse_messages(reader *r, int *n_out) {
    cb_app *a = r->a;
    const cb_json_tok *t = r->t;
    int arr = cb_json_find(r->body, t, 0, "messages");
    if (arr < 0) return fail(r, "'messages' is required");
    if (t[arr].type != CB_JSON_ARRAY) return fail(r, "'messages' must be an array");
    if (t[arr].size == 0) return fail(r, "'messages' must not be empty");
    if (t[arr].size > CB_MAX_MESSAGES) return fail(r, "'messages' has more than %d entries", CB_MAX_MESSAGES);
    size_t used = 0;
    for (int i = 0; i < t[arr].size; i++) {
        int m = cb_json_array_at(t, arr, i);
        if (t[m].type != CB_JSON_OBJECT) return fail(r, "'messages[%d]' must be an object", i);
        int role = cb_json_find(r->body, t, m, "role"), content = cb_json_find(r->body, t, m, "content");
        if (role < 0 || t[role].type != CB_JSON_STRING) return fail(r, "'messages[%d].role' must be a string", i);
        cb_chat_message *msg = &a->messages[i];
        int n = cb_json_unescape(r->body, &t[role], a->scratch + used, a->scratch_cap - used);
        if (n < 0) return fail(r, "'messages[%d].role' holds an invalid string", i);
        msg->role = a->scratch + used, msg->role_len = (size_t)n;
        used += (size_t)n + 1;
        /* content: a string, or an array of {"type":"text","text":...} parts
         * (joined); null or absent only in an assistant turn (of tool calls),
         * as OpenAI's API has it. */
        const int assistant = n == 9 && !memcmp(msg->role, "assistant", 9);
        if (!assistant && (content < 0 || t[content].type == CB_JSON_NULL))
            return fail(r, "'messages[%d].content' is required for role '%.*s' (a string or an array of text parts)",
                        i, (int)msg->role_len < 32 ? (int)msg->role_len : 32, msg->role);
        msg->content = a->scratch + used, msg->content_len = 0;
        if (content >= 0 && t[content].type == CB_JSON_STRING) {
            n = cb_json_unescape(r->body, &t[content], a->scratch + used, a->scratch_cap - used);
            if (n < 0) return fail(r, "'messages[%d].content' holds an invalid string", i);
            msg->content_len = (size_t)n;
        } else if (content >= 0 && t[content].type == CB_JSON_ARRAY) {
            for (int p = 0; p < t[content].size; p++) {
                int part = cb_json_array_at(t, content, p);
                int type = cb_json_find(r->body, t, part, "type"), text = cb_json_find(r->body, t, part, "text");
                if (type < 0 || !cb_json_str_eq(r->body, &t[type], "text") || text < 0 ||
                    t[text].type != CB_JSON_STRING)
                    return fail(r, "'messages[%d].content[%d]' must be a {\"type\": \"text\", \"text\": ...} part", i,
                                p);
                n = cb_json_unescape(r->body, &t[text], a->scratch + used + msg->content_len,
                                     a->scratch_cap - used - msg->content_len);
                if (n < 0) return fail(r, "'messages[%d].content[%d].text' holds an invalid string", i, p);
                msg->content_len += (size_t)n;
            }
        } else if (content >= 0 && t[content].type != CB_JSON_NULL) {
            return fail(r, "'messages[%d].content' must be a string or an array of text parts", i);
        }
        used += msg->content_len + 1;
    }
    *n_out = t[arr].size;
    return 0;
}

/* The template's inputs from the body: messages, tools (only where the
 * caller allows them), chat_template_kwargs, add_generation_prompt and
 * continue_final_message. A final assistant message is continued (prefill)
 * unless the body asks for a new turn. */
static int chat_request(reader *r, cb_chat_request *q, int n_messages, int allow_tools) {
    const cb_json_tok *t = r->t;
    q->json = r->body, q->toks = t;
    q->messages = cb_json_find(r->body, t, 0, "messages");
    q->tools = allow_tools ? field(r, "tools") : -1;
    if (q->tools >= 0 && t[q->tools].type != CB_JSON_ARRAY) return fail(r, "'tools' must be an array");
    q->kwargs = field(r, "chat_template_kwargs");
    if (q->kwargs >= 0 && t[q->kwargs].type != CB_JSON_OBJECT)
        return fail(r, "'chat_template_kwargs' must be an object");
    const cb_chat_message *last = &r->a->messages[n_messages - 1];
    int last_assistant = last->role_len == 9 && !memcmp(last->role, "assistant", 9);
    int gen = -1, cont = -1, status;
    if ((status = read_bool(r, "add_generation_prompt", &gen)) || (status = read_bool(r, "continue_final_message", &cont)))
        return status;
    if (cont < 0) cont = last_assistant && gen != 1;
    if (gen < 0) gen = !cont;
    if (gen && cont)
        return fail(r, "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    q->add_generation_prompt = gen, q->continue_final = cont;
    return 0;
}

/* response_format: text (nothing to do), json_object (any JSON object) or
 * json_schema (its "schema", compiled into q->con; the subset the
 * matcher supports, anything else refused by name). */
static int read_response_format(reader *r, cb_request *q) {
    const cb_json_tok *t = r->t;
    q->constrained = 0;
    int v = field(r, "response_format");
    if (v < 0) return 0;
    int type = t[v].type == CB_JSON_OBJECT ? cb_json_find(r->body, t, v, "type") : -1;
    if (type < 0 || t[type].type != CB_JSON_STRING)
        return fail(r, "'response_format' must be an object with 'type' \"text\", \"json_object\" or \"json_schema\"");
    if (cb_json_str_eq(r->body, &t[type], "text")) return 0;
    int schema = -1;
    if (cb_json_str_eq(r->body, &t[type], "json_schema")) {
        int js = cb_json_find(r->body, t, v, "json_schema");
        if (js < 0 || t[js].type != CB_JSON_OBJECT)
            return fail(r, "'response_format.json_schema' must be an object with a 'schema'");
        int name = cb_json_find(r->body, t, js, "name");
        if (name >= 0 && t[name].type != CB_JSON_STRING) return fail(r, "'response_format.json_schema.name' must be a string");
        schema = cb_json_find(r->body, t, js, "schema"); /* absent: any JSON object */
        if (schema >= 0 && t[schema].type == CB_JSON_NULL) schema = -1;
    } else if (!cb_json_str_eq(r->body, &t[type], "json_object")) {
        return fail(r, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    if (cb_engine_tokenizer(r->a->engine)->kind == CB_TOKENIZER_NONE)
        return fail(r, "'response_format' needs a tokenizer, and this model was converted without one");
    char err[384];
    if (cb_con_compile(&q->con, "", 0, r->body, t, schema, "", 0, err, sizeof err))
        return fail(r, "'response_format': %s", err);
    q->constrained = 1;
    return 0;
}

/* A prompt of n tokens must leave room for one generated token. */
static int check_prompt_length(reader *r, int n, int ctx) {
    if (n <= ctx - 1) return 0;
    return fail(r, "the prompt is %d tokens (context_length %d, so at most %d prompt tokens)", n, ctx, ctx - 1);
}

/* The text side of a request on a model converted without a tokenizer. */
static int no_tokenizer(reader *r, const char *what) {
    if (cb_engine_tokenizer(r->a->engine)->kind != CB_TOKENIZER_NONE) return 0;
    return fail(r, "%s needs a tokenizer, and this model was converted without one: send token ids to "
                   "/v1/completions ('prompt': [ids])", what);
}

static int read_messages(reader *r, cb_request *q, int ctx) {
    cb_app *a = r->a;
    const cb_tokenizer *tok = cb_engine_tokenizer(a->engine);
    int n_messages, status, n;
    if ((status = parse_messages(r, &n_messages))) return status;
    if ((status = no_tokenizer(r, "/v1/chat/completions"))) return status;
    char err[512];
    /* Tokenized into a->ids, which holds any prompt the body can make, so a
     * failure is about the messages (role, template) and the length check
     * below can give the real count. */
    if (tok->kind == CB_TOKENIZER_BYTES) {
        n = cb_chat_format(tok, a->messages, n_messages, a->ids, (int)a->scratch_cap, err, sizeof err);
    } else {
        cb_chat_request cq;
        if ((status = chat_request(r, &cq, n_messages, 0))) return status;
        long len = cb_chat_apply(tok, &cq, a->chat_work, a->chat_work_cap, a->text, a->text_cap, err, sizeof err);
        if (len < 0) return fail(r, "%s", err);
        n = cb_tokenize_ex(tok, a->text, (size_t)len, 1, a->ids, (int)a->scratch_cap, err, sizeof err);
        if (n < 0 && strstr(err, "more than")) snprintf(err, sizeof err, "the prompt is longer than %zu tokens", a->scratch_cap);
    }
    if (n < 0) return fail(r, "%s", err);
    if ((status = check_prompt_length(r, n, ctx))) return status;
    memcpy(q->prompt, a->ids, (size_t)n * sizeof *q->prompt);
    q->n_prompt = n;
    return 0;
}

static int read_prompt(reader *r, cb_request *q, int ctx) {
    const cb_json_tok *t = r->t;
    const cb_tokenizer *tok = cb_engine_tokenizer(r->a->engine);
    int v = cb_json_find(r->body, t, 0, "prompt");
    if (v < 0) return fail(r, "'prompt' is required");
    if (t[v].type == CB_JSON_STRING) {
        int status = no_tokenizer(r, "a text 'prompt'");
        if (status) return status;
        int n = cb_json_unescape(r->body, &t[v], r->a->scratch, r->a->scratch_cap);
        if (n < 0) return fail(r, "'prompt' holds an invalid string");
        /* Into a->ids, which holds any prompt the body can make: a failure
         * names its own cause, and a long prompt its real length. */
        char err[256];
        int got = cb_tokenize_ex(tok, r->a->scratch, (size_t)n, 1, r->a->ids, (int)r->a->scratch_cap, err,
                                 sizeof err);
        if (got < 0) return fail(r, "'prompt': %s", err);
        if ((status = check_prompt_length(r, got + 1, ctx))) return status;
        /* BOS, then the text, as a plain completion would start. */
        q->prompt[0] = (int32_t)tok->info.bos_id;
        memcpy(q->prompt + 1, r->a->ids, (size_t)got * sizeof *q->prompt);
        q->n_prompt = got + 1;
        return 0;
    }
    if (t[v].type != CB_JSON_ARRAY) return fail(r, "'prompt' must be a string or an array of token ids");
    const int n = t[v].size;
    if (n == 0) return fail(r, "'prompt' must not be empty");
    int status = check_prompt_length(r, n, ctx);
    if (status) return status;
    for (int i = 0, e = v + 1; i < n; i++, e = t[e].next) {
        int64_t id;
        if (cb_json_get_int64(r->body, &t[e], &id) != 0 || id < 0 || id >= (int64_t)r->a->dims->vocab)
            return fail(r, "'prompt[%d]' must be a token id from 0 to %u", i, r->a->dims->vocab - 1);
        q->prompt[i] = (int32_t)id;
    }
    q->n_prompt = n;
    return 0;
}

int cb_request_parse_object(cb_app *a, const char *body, size_t len, char *err, size_t err_len) {
    size_t err_at = 0;
    int n_tok = cb_json_parse(body, len, a->toks, CB_MAX_JSON_TOKENS, &err_at);
    reader rd = {a, body, a->toks, err, err_len}, *r = &rd;
    if (n_tok < 0) return fail(r, "request body is not valid JSON: %s at byte %zu", cb_json_strerror(n_tok), err_at);
    if (a->toks[0].type != CB_JSON_OBJECT) return fail(r, "request body must be a JSON object");
    return 0;
}

int cb_request_template(cb_app *a, const char *body, size_t len, cb_chat_request *q, char *err, size_t err_len) {
    int status = cb_request_parse_object(a, body, len, err, err_len), n_messages;
    reader rd = {a, body, a->toks, err, err_len};
    if (status || (status = parse_messages(&rd, &n_messages))) return status;
    return chat_request(&rd, q, n_messages, 1);
}

int cb_request_read(cb_app *a, cb_request *q, cb_endpoint ep, const char *body, size_t len, char *err,
                    size_t err_len) {
    reader rd = {a, body, a->toks, err, err_len}, *r = &rd;
    int parsed = cb_request_parse_object(a, body, len, err, err_len);
    if (parsed) return parsed;
    const int ctx = (int)a->dims->context_len;
    int status;
    memset(&q->sampling, 0, sizeof q->sampling);
    q->sampling.top_p = 1.0f;
    q->sampling.seed = CB_DEFAULT_SEED;
    q->endpoint = ep;
    q->stream = q->include_usage = q->trace = q->ignore_eos = q->logprobs = q->top_logprobs = 0;
    q->max_tokens = ctx;
    if ((status = refuse_unsupported(r, ep))) return status;

    int64_t x;
    const char *len_fields[] = {"max_tokens", "max_completion_tokens"};
    for (int f = 0; f < 2; f++) {
        x = 0;
        if ((status = read_int(r, len_fields[f], 1, INT32_MAX, &x))) return status;
        if (x > 0 && x < q->max_tokens) q->max_tokens = (int)x;
    }
    cb_sampling *s = &q->sampling;
    if ((status = read_number(r, "temperature", 0, 2, &s->temperature))) return status;
    if ((status = read_number(r, "top_p", 0, 1, &s->top_p))) return status;
    if ((status = read_number(r, "min_p", 0, 1, &s->min_p))) return status;
    if ((status = read_number(r, "presence_penalty", -2, 2, &s->presence_penalty))) return status;
    if ((status = read_number(r, "frequency_penalty", -2, 2, &s->frequency_penalty))) return status;
    if (s->top_p <= 0.0f) return fail(r, "'top_p' must be a number from 0 (excluded) to 1");
    x = 0;
    if ((status = read_int(r, "top_k", 0, INT32_MAX, &x))) return status;
    s->top_k = (int)x;
    x = CB_DEFAULT_SEED;
    if ((status = read_int(r, "seed", INT64_MIN, INT64_MAX, &x))) return status;
    s->seed = (uint64_t)x;

    if ((status = read_bool(r, "stream", &q->stream))) return status;
    int so = field(r, "stream_options");
    if (so >= 0) {
        int inc = cb_json_find(body, a->toks, so, "include_usage");
        if (a->toks[so].type != CB_JSON_OBJECT ||
            (inc >= 0 && cb_json_get_bool(&a->toks[inc], &q->include_usage) != 0))
            return fail(r, "'stream_options' must be an object like {\"include_usage\": true}");
    }
    if ((status = read_bool(r, "colibri_trace", &q->trace))) return status;
    if ((status = read_bool(r, "ignore_eos", &q->ignore_eos))) return status;
    if (ep == CB_EP_CHAT) {
        if ((status = read_bool(r, "logprobs", &q->logprobs))) return status;
        x = 0;
        if ((status = read_int(r, "top_logprobs", 0, CB_MAX_TOP_LOGPROBS, &x))) return status;
        q->top_logprobs = (int)x;
        if (q->top_logprobs && !q->logprobs) return fail(r, "'top_logprobs' needs 'logprobs': true");
    } else {
        /* Legacy completions: logprobs is how many top tokens to list. */
        x = -1;
        if ((status = read_int(r, "logprobs", 0, 5, &x))) return status;
        q->logprobs = x >= 0;
        q->top_logprobs = x > 0 ? (int)x : 0;
    }
    int model = field(r, "model");
    if (model >= 0 && a->toks[model].type != CB_JSON_STRING) return fail(r, "'model' must be a string");
    if ((status = read_stop(r, q))) return status;
    if ((status = read_response_format(r, q))) return status;
    return ep == CB_EP_CHAT ? read_messages(r, q, ctx) : read_prompt(r, q, ctx);
}
