/* OpenAI's Responses API (POST /v1/responses) on the chat path.
 *
 * A request is rewritten as the chat completion it means (instructions and
 * input items as messages, flat function tools as chat tools, text.format
 * as response_format) into a->translated, then read by cb_request_read()
 * like any chat request: one engine path, one set of checks. Fields with no
 * meaning here are ignored (store, metadata, include...), those that would
 * need state the server does not keep (previous_response_id, background)
 * are refused by name. The answer and its stream events are written in the
 * Responses shapes: items (reasoning, message, function_call) with ids that
 * the stream and the final response share. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "app_internal.h"

/* ---- the request ---- */

typedef struct {
    cb_app *a;
    const char *body;
    const cb_json_tok *t;
    char *err;
    size_t err_len;
    const char *param; /* the error's "param" */
    cb_jw w;           /* the chat request being written */
    int n_messages;
    char *text;        /* a->scratch: joined text parts */
    size_t text_cap;
} tr;

static int fail(tr *r, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->err_len, fmt, ap);
    va_end(ap);
    r->param = param;
    return 400;
}

static int field(const tr *r, int obj, const char *name) {
    int v = cb_json_find(r->body, r->t, obj, name);
    return v >= 0 && r->t[v].type != CB_JSON_NULL ? v : -1;
}

static int is_str(const tr *r, int v, const char *s) {
    return v >= 0 && r->t[v].type == CB_JSON_STRING && cb_json_str_eq(r->body, &r->t[v], s);
}

/* Token v's JSON text as it was sent (a string with its quotes). */
static void raw(tr *r, int v) {
    const cb_json_tok *k = &r->t[v];
    if (k->type == CB_JSON_STRING) cb_jw_raw(&r->w, r->body + k->start - 1, (size_t)(k->end - k->start) + 2);
    else cb_jw_raw(&r->w, r->body + k->start, (size_t)(k->end - k->start));
}

/* Every member of object obj but `skip`, as key and raw value. */
static void members(tr *r, int obj, const char *skip) {
    const cb_json_tok *t = r->t;
    char key[256];
    for (int k = 0, i = obj + 1; k < t[obj].size; k++, i = t[i + 1].next) {
        int n = cb_json_unescape(r->body, &t[i], key, sizeof key);
        if (n < 0 || (skip && !strcmp(key, skip))) continue; /* a key too long to be one we read */
        cb_jw_key(&r->w, key);
        raw(r, i + 1);
    }
}

/* The text of a content value: a string, or an array of text parts
 * (input_text, output_text, summary_text, reasoning_text; a refusal's
 * "refusal"), joined into r->text: 0, or 400 when a part is not text. */
static int content_text(tr *r, int v, const char *where, size_t *len) {
    const cb_json_tok *t = r->t;
    *len = 0;
    if (t[v].type == CB_JSON_STRING) {
        int n = cb_json_unescape(r->body, &t[v], r->text, r->text_cap);
        if (n < 0) return fail(r, "input", "'%s' holds an invalid string", where);
        *len = (size_t)n;
        return 0;
    }
    if (t[v].type != CB_JSON_ARRAY) return fail(r, "input", "'%s' must be a string or an array of text parts", where);
    for (int p = 0, e = v + 1; p < t[v].size; p++, e = t[e].next) {
        int type = t[e].type == CB_JSON_OBJECT ? field(r, e, "type") : -1;
        int text = -1;
        if (is_str(r, type, "input_text") || is_str(r, type, "output_text") || is_str(r, type, "text") ||
            is_str(r, type, "summary_text") || is_str(r, type, "reasoning_text"))
            text = field(r, e, "text");
        else if (is_str(r, type, "refusal"))
            text = field(r, e, "refusal");
        else if (type >= 0 && t[type].type == CB_JSON_STRING)
            return fail(r, "input", "'%s[%d]' is a %.*s part; this server reads text parts only (input_text, "
                        "output_text)", where, p, t[type].end - t[type].start < 40 ? t[type].end - t[type].start : 40,
                        r->body + t[type].start);
        if (text < 0 || t[text].type != CB_JSON_STRING)
            return fail(r, "input", "'%s[%d]' must be a {\"type\": \"input_text\", \"text\": ...} part", where, p);
        int n = cb_json_unescape(r->body, &t[text], r->text + *len, r->text_cap - *len);
        if (n < 0) return fail(r, "input", "'%s[%d].text' holds an invalid string", where, p);
        *len += (size_t)n;
    }
    return 0;
}

static int begin_message(tr *r, const char *role) {
    if (++r->n_messages > CB_MAX_MESSAGES)
        return fail(r, "input", "'input' makes more than %d messages", CB_MAX_MESSAGES);
    cb_jw_begin_object(&r->w);
    cb_jw_key(&r->w, "role");
    cb_jw_str(&r->w, role);
    return 0;
}

/* The chat "messages": instructions as a system message, then the input.
 * Consecutive assistant items (a message, function calls) make one
 * assistant message, as the chat API holds a turn; a reasoning item goes
 * to the next assistant message as its reasoning_content. */
static int write_messages(tr *r, int input) {
    const cb_json_tok *t = r->t;
    cb_jw *w = &r->w;
    char where[64];
    size_t len;
    int status;
    cb_jw_key(w, "messages");
    cb_jw_begin_array(w);
    int instructions = field(r, 0, "instructions");
    if (instructions >= 0) {
        if (t[instructions].type != CB_JSON_STRING) return fail(r, "instructions", "'instructions' must be a string");
        if ((status = begin_message(r, "system"))) return status;
        cb_jw_key(w, "content");
        raw(r, instructions);
        cb_jw_end_object(w);
    }
    if (t[input].type == CB_JSON_STRING) {
        if ((status = begin_message(r, "user"))) return status;
        cb_jw_key(w, "content");
        raw(r, input);
        cb_jw_end_object(w);
        cb_jw_end_array(w);
        return 0;
    }
    if (t[input].type != CB_JSON_ARRAY) return fail(r, "input", "'input' must be a string or an array of items");
    if (t[input].size == 0) return fail(r, "input", "'input' must not be empty");
    /* an assistant message open; its tool_calls open; a reasoning item waiting for it */
    int assistant = 0, calls = 0, reasoning = -1, reasoning_at = 0;
    for (int i = 0, e = input + 1; i < t[input].size; i++, e = t[e].next) {
        if (t[e].type != CB_JSON_OBJECT) return fail(r, "input", "'input[%d]' must be an object", i);
        int type = field(r, e, "type"), role = field(r, e, "role");
        if (type >= 0 && t[type].type != CB_JSON_STRING)
            return fail(r, "input", "'input[%d].type' must be a string", i);
        const int message = type < 0 || is_str(r, type, "message"), call = is_str(r, type, "function_call");
        const int asst = call || (message && is_str(r, role, "assistant"));
        if (assistant && (!asst || message)) { /* the open turn ends: calls join the message before them */
            if (calls) cb_jw_end_array(w);
            cb_jw_end_object(w);
            assistant = calls = 0;
        }
        if (is_str(r, type, "reasoning")) {
            reasoning = e, reasoning_at = i;
            continue;
        }
        if (asst && !assistant) {
            if ((status = begin_message(r, "assistant"))) return status;
            assistant = 1;
            if (reasoning >= 0) {
                int c = field(r, reasoning, "content");
                if (c < 0 || (t[c].type == CB_JSON_ARRAY && t[c].size == 0)) c = field(r, reasoning, "summary");
                snprintf(where, sizeof where, "input[%d].%s", reasoning_at,
                         c == field(r, reasoning, "content") ? "content" : "summary");
                if (c >= 0 && (status = content_text(r, c, where, &len))) return status;
                cb_jw_key(w, "reasoning_content");
                cb_jw_str_n(w, r->text, c >= 0 ? len : 0);
            }
            if (call) {
                cb_jw_key(w, "content");
                cb_jw_null(w);
            }
        }
        reasoning = -1;
        if (message) {
            if (role < 0 || t[role].type != CB_JSON_STRING)
                return fail(r, "input", "'input[%d].role' must be \"user\", \"assistant\", \"system\" or "
                            "\"developer\"", i);
            int content = field(r, e, "content");
            if (content < 0) return fail(r, "input", "'input[%d].content' is required", i);
            snprintf(where, sizeof where, "input[%d].content", i);
            if ((status = content_text(r, content, where, &len))) return status;
            if (!asst) {
                char name[32];
                int n = cb_json_unescape(r->body, &t[role], name, sizeof name);
                if (n < 0 || (strcmp(name, "user") && strcmp(name, "system") && strcmp(name, "developer")))
                    return fail(r, "input", "'input[%d].role' must be \"user\", \"assistant\", \"system\" or "
                                "\"developer\"", i);
                if ((status = begin_message(r, name))) return status;
            }
            cb_jw_key(w, "content");
            cb_jw_str_n(w, r->text, len);
            if (!asst) cb_jw_end_object(w);
        } else if (call) {
            int id = field(r, e, "call_id"), name = field(r, e, "name"), args = field(r, e, "arguments");
            if (id < 0 || t[id].type != CB_JSON_STRING || name < 0 || t[name].type != CB_JSON_STRING || args < 0 ||
                t[args].type != CB_JSON_STRING)
                return fail(r, "input", "'input[%d]' (a function_call) needs 'call_id', 'name' and 'arguments' as "
                            "strings", i);
            if (!calls) {
                cb_jw_key(w, "tool_calls");
                cb_jw_begin_array(w);
                calls = 1;
            }
            cb_jw_begin_object(w);
            cb_jw_key(w, "id");
            raw(r, id);
            cb_jw_key(w, "type");
            cb_jw_str(w, "function");
            cb_jw_key(w, "function");
            cb_jw_begin_object(w);
            cb_jw_key(w, "name");
            raw(r, name);
            cb_jw_key(w, "arguments");
            raw(r, args);
            cb_jw_end_object(w);
            cb_jw_end_object(w);
        } else if (is_str(r, type, "function_call_output")) {
            int id = field(r, e, "call_id"), out = field(r, e, "output");
            if (id < 0 || t[id].type != CB_JSON_STRING || out < 0)
                return fail(r, "input", "'input[%d]' (a function_call_output) needs 'call_id' and 'output'", i);
            snprintf(where, sizeof where, "input[%d].output", i);
            if ((status = content_text(r, out, where, &len))) return status;
            if ((status = begin_message(r, "tool"))) return status;
            cb_jw_key(w, "tool_call_id");
            raw(r, id);
            cb_jw_key(w, "content");
            cb_jw_str_n(w, r->text, len);
            cb_jw_end_object(w);
        } else if (is_str(r, type, "item_reference")) {
            return fail(r, "input", "'input[%d]' is an item_reference; this server keeps no responses, so send the "
                        "item itself", i);
        } else {
            return fail(r, "input", "'input[%d].type' \"%.*s\" is not supported here (message, function_call, "
                        "function_call_output and reasoning items are)", i,
                        t[type].end - t[type].start < 40 ? t[type].end - t[type].start : 40, r->body + t[type].start);
        }
    }
    if (calls) cb_jw_end_array(w);
    if (assistant) cb_jw_end_object(w);
    cb_jw_end_array(w);
    return 0;
}

/* Function tools, flat ({"type": "function", "name": ...}) as the chat
 * API nests them; the chat shape is taken as it is. Hosted tools (web
 * search, file search...) do not exist here. */
static int write_tools(tr *r, int tools) {
    const cb_json_tok *t = r->t;
    if (t[tools].type != CB_JSON_ARRAY)
        return fail(r, "tools", "'tools' must be an array of {\"type\": \"function\", \"name\": ...} objects");
    cb_jw_key(&r->w, "tools");
    cb_jw_begin_array(&r->w);
    for (int i = 0, e = tools + 1; i < t[tools].size; i++, e = t[e].next) {
        int type = t[e].type == CB_JSON_OBJECT ? field(r, e, "type") : -1, name = type >= 0 ? field(r, e, "name") : -1;
        if (!is_str(r, type, "function"))
            return fail(r, "tools", "'tools[%d]': only function tools ({\"type\": \"function\", \"name\": ...}) are "
                        "supported", i);
        if (field(r, e, "function") >= 0) { /* already the chat shape */
            raw(r, e);
            continue;
        }
        if (name < 0 || t[name].type != CB_JSON_STRING || t[name].end == t[name].start ||
            t[name].end - t[name].start > CB_TOOL_NAME_BYTES)
            return fail(r, "tools", "'tools[%d].name' must be a string of 1 to %d bytes", i, CB_TOOL_NAME_BYTES);
        cb_jw_begin_object(&r->w);
        cb_jw_key(&r->w, "type");
        cb_jw_str(&r->w, "function");
        cb_jw_key(&r->w, "function");
        cb_jw_begin_object(&r->w);
        members(r, e, "type");
        cb_jw_end_object(&r->w);
        cb_jw_end_object(&r->w);
    }
    cb_jw_end_array(&r->w);
    return 0;
}

static int write_tool_choice(tr *r, int v, cb_request *q) {
    const cb_json_tok *t = r->t;
    q->resp.tool_choice = CB_RESP_CHOICE_AUTO;
    if (v < 0) return 0;
    if (is_str(r, v, "auto") || is_str(r, v, "none") || is_str(r, v, "required")) {
        q->resp.tool_choice = is_str(r, v, "none") ? CB_RESP_CHOICE_NONE
                              : is_str(r, v, "required") ? CB_RESP_CHOICE_REQUIRED : CB_RESP_CHOICE_AUTO;
        cb_jw_key(&r->w, "tool_choice");
        raw(r, v);
        return 0;
    }
    int type = t[v].type == CB_JSON_OBJECT ? field(r, v, "type") : -1, name = type >= 0 ? field(r, v, "name") : -1;
    int fn = type >= 0 ? field(r, v, "function") : -1; /* the chat shape, taken too */
    if (name < 0 && fn >= 0 && t[fn].type == CB_JSON_OBJECT) name = field(r, fn, "name");
    if (!is_str(r, type, "function") || name < 0 || t[name].type != CB_JSON_STRING ||
        cb_json_unescape(r->body, &t[name], q->resp.tool_name, sizeof q->resp.tool_name) < 1)
        return fail(r, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                    "\"function\", \"name\": ...}");
    q->resp.tool_choice = CB_RESP_CHOICE_NAMED;
    cb_jw_key(&r->w, "tool_choice");
    cb_jw_begin_object(&r->w);
    cb_jw_key(&r->w, "type");
    cb_jw_str(&r->w, "function");
    cb_jw_key(&r->w, "function");
    cb_jw_begin_object(&r->w);
    cb_jw_key(&r->w, "name");
    raw(r, name);
    cb_jw_end_object(&r->w);
    cb_jw_end_object(&r->w);
    return 0;
}

/* text.format as the chat API's response_format. */
static int write_format(tr *r, cb_request *q) {
    const cb_json_tok *t = r->t;
    int text = field(r, 0, "text");
    int format = text >= 0 && t[text].type == CB_JSON_OBJECT ? field(r, text, "format") : -1;
    q->resp.format = CB_RESP_TEXT;
    if (text >= 0 && t[text].type != CB_JSON_OBJECT)
        return fail(r, "text", "'text' must be an object like {\"format\": ...}");
    if (format < 0) return 0;
    int type = t[format].type == CB_JSON_OBJECT ? field(r, format, "type") : -1;
    if (is_str(r, type, "text")) return 0;
    cb_jw_key(&r->w, "response_format");
    cb_jw_begin_object(&r->w);
    cb_jw_key(&r->w, "type");
    if (is_str(r, type, "json_object")) {
        q->resp.format = CB_RESP_JSON_OBJECT;
        cb_jw_str(&r->w, "json_object");
    } else if (is_str(r, type, "json_schema")) {
        q->resp.format = CB_RESP_JSON_SCHEMA;
        cb_jw_str(&r->w, "json_schema");
        cb_jw_key(&r->w, "json_schema");
        cb_jw_begin_object(&r->w);
        members(r, format, "type");
        cb_jw_end_object(&r->w);
    } else {
        return fail(r, "text.format", "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    cb_jw_end_object(&r->w);
    return 0;
}

/* chat_template_kwargs as sent, with reasoning.effort as reasoning_effort
 * (gpt-oss's template reads it) unless the kwargs set it themselves. */
static int write_kwargs(tr *r) {
    const cb_json_tok *t = r->t;
    int kwargs = field(r, 0, "chat_template_kwargs"), reasoning = field(r, 0, "reasoning");
    int effort = reasoning >= 0 && t[reasoning].type == CB_JSON_OBJECT ? field(r, reasoning, "effort") : -1;
    if (reasoning >= 0 && t[reasoning].type != CB_JSON_OBJECT)
        return fail(r, "reasoning", "'reasoning' must be an object like {\"effort\": \"low\"}");
    if (effort >= 0 && t[effort].type != CB_JSON_STRING)
        return fail(r, "reasoning.effort", "'reasoning.effort' must be a string");
    if (kwargs >= 0 && t[kwargs].type != CB_JSON_OBJECT) {
        cb_jw_key(&r->w, "chat_template_kwargs"); /* refused by the chat reader, by name */
        raw(r, kwargs);
        return 0;
    }
    if (kwargs < 0 && effort < 0) return 0;
    cb_jw_key(&r->w, "chat_template_kwargs");
    cb_jw_begin_object(&r->w);
    if (kwargs >= 0) members(r, kwargs, NULL);
    if (effort >= 0 && (kwargs < 0 || cb_json_find(r->body, t, kwargs, "reasoning_effort") < 0)) {
        cb_jw_key(&r->w, "reasoning_effort");
        raw(r, effort);
    }
    cb_jw_end_object(&r->w);
    return 0;
}

/* What cannot be honoured: refused together, by name. */
static int refuse(tr *r) {
    const cb_json_tok *t = r->t;
    char names[192] = "";
    size_t used = 0;
#define ADD(name) used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", name)
    if (field(r, 0, "previous_response_id") >= 0) ADD("previous_response_id");
    if (field(r, 0, "conversation") >= 0) ADD("conversation");
    if (field(r, 0, "prompt") >= 0) ADD("prompt");
    int v = field(r, 0, "background"), flag = 0;
    if (v >= 0 && (cb_json_get_bool(&t[v], &flag) != 0 || flag)) ADD("background");
    int64_t x;
    v = field(r, 0, "top_logprobs");
    if (v >= 0 && (cb_json_get_int64(r->body, &t[v], &x) != 0 || x != 0)) ADD("top_logprobs");
    v = field(r, 0, "include");
    for (int i = 0, e = v + 1; v >= 0 && t[v].type == CB_JSON_ARRAY && i < t[v].size; i++, e = t[e].next)
        if (is_str(r, e, "message.output_text.logprobs")) ADD("include: message.output_text.logprobs");
#undef ADD
    if (used)
        return fail(r, NULL, "unsupported parameters: %s (this server keeps no responses and sends no "
                    "log-probabilities here: send the whole conversation in 'input'; log-probabilities are on "
                    "/v1/chat/completions)", names);
    return 0;
}

static int translate(tr *r, cb_request *q) {
    const cb_json_tok *t = r->t;
    int status, input = cb_json_find(r->body, t, 0, "input");
    if ((status = refuse(r))) return status;
    if (input < 0 || t[input].type == CB_JSON_NULL) return fail(r, "input", "'input' is required");
    cb_jw_begin_object(&r->w);
    /* the same meaning in both APIs (and Colibri's and llama.cpp's extras) */
    static const char *same[] = {"model", "stream", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                 "presence_penalty", "frequency_penalty", "logit_bias", "parallel_tool_calls",
                                 "colibri_trace", "ignore_eos", "add_generation_prompt", "continue_final_message"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        int v = field(r, 0, same[i]);
        if (v < 0) continue;
        cb_jw_key(&r->w, same[i]);
        raw(r, v);
    }
    q->resp.max_output = 0;
    int v = field(r, 0, "max_output_tokens");
    if (v >= 0) {
        int64_t x;
        if (cb_json_get_int64(r->body, &t[v], &x) != 0 || x < 1 || x > INT32_MAX)
            return fail(r, "max_output_tokens", "'max_output_tokens' must be an integer from 1 to %d", INT32_MAX);
        q->resp.max_output = (int)x;
        cb_jw_key(&r->w, "max_tokens");
        raw(r, v);
    }
    if ((status = write_format(r, q)) || (status = write_kwargs(r))) return status;
    int tools = field(r, 0, "tools");
    if (tools >= 0 && (status = write_tools(r, tools))) return status;
    if ((status = write_tool_choice(r, field(r, 0, "tool_choice"), q))) return status;
    if ((status = write_messages(r, input))) return status;
    cb_jw_end_object(&r->w);
    return 0;
}

/* The chat reader's words for a field, in the Responses API's. */
static void rename_field(char *err, size_t cap, const char *from, const char *to) {
    const size_t n = strlen(from), m = strlen(to), len = strlen(err);
    char *at = strstr(err, from);
    if (!at || len - n + m + 1 > cap) return;
    memmove(at + m, at + n, len - (size_t)(at - err) - n + 1);
    memcpy(at, to, m);
}

int cb_responses_read(cb_app *a, cb_request *q, const char *body, size_t len, char *err, size_t err_len) {
    a->err_param = a->err_code = NULL;
    int status = cb_request_parse_object(a, body, len, err, err_len);
    if (status) return status;
    tr rd = {a, body, a->toks, err, err_len, NULL, {0}, 0, a->scratch, a->scratch_cap};
    cb_jw_init(&rd.w, a->translated, a->translated_cap);
    status = translate(&rd, q);
    if (!status && rd.w.overflow) {
        snprintf(err, err_len, "the request is too large to read (over %zu bytes as a chat request)",
                 a->translated_cap);
        status = 413;
    }
    if (status) {
        a->err_param = rd.param;
        return status;
    }
    status = cb_request_read(a, q, CB_EP_RESPONSES, a->translated, rd.w.len, err, err_len); /* q->resp stays */
    if (status) {
        rename_field(err, err_len, "'response_format", "'text.format");
        rename_field(err, err_len, "in the messages", "in the input");
        rename_field(err, err_len, "the messages", "the input");
        if (a->err_param && !strcmp(a->err_param, "messages")) a->err_param = "input";
        else if (a->err_param && !strncmp(a->err_param, "response_format", 15)) a->err_param = "text.format";
    }
    return status;
}

/* ---- the answer ---- */

/* An output item's kind; a stream's open item (cb_slot.resp_open) is one
 * of the first three. */
enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

typedef struct {
    int kind;
    const char *text;            /* reasoning, message: the text so far */
    size_t len;
    int call;                    /* a call's index */
} item;

/* The thinking block's text (empty without one). */
static size_t reasoning_len(const cb_slot *st) {
    if (!st->had_reasoning) return 0;
    return st->think_state == CB_THINK_REASONING ? st->text_len : st->reasoning_end;
}

/* Output item k of the answer so far: the reasoning (when it has text),
 * then the message of a plain answer or the items of one with tools; an
 * answer with none has one empty message. 0 past the last. */
static int item_at(const cb_slot *st, int k, item *it) {
    const size_t rlen = reasoning_len(st);
    memset(it, 0, sizeof *it);
    if (rlen && k-- == 0) {
        it->kind = ITEM_REASONING, it->text = st->text, it->len = rlen;
        return 1;
    }
    int n;
    if (st->req->tool_format) {
        n = st->n_resp_items;
        if (k < n) {
            const cb_resp_item *r = &st->resp_items[k];
            if (r->kind == CB_RESP_ITEM_MESSAGE) {
                it->kind = ITEM_MESSAGE, it->text = st->tool_content + r->off, it->len = r->len;
            } else {
                it->kind = ITEM_CALL, it->call = (int)r->off;
            }
            return 1;
        }
    } else {
        const size_t from = st->had_reasoning ? rlen : 0;
        n = st->text_len > from;
        if (k < n) {
            it->kind = ITEM_MESSAGE, it->text = st->text + from, it->len = st->text_len - from;
            return 1;
        }
    }
    if (k == n && n == 0 && !rlen) {
        it->kind = ITEM_MESSAGE, it->text = "", it->len = 0;
        return 1;
    }
    return 0;
}

static void item_id(const cb_request *q, const item *it, int index, char out[48]) {
    if (it->kind == ITEM_REASONING) snprintf(out, 48, "rs_%llu", (unsigned long long)q->request_no);
    else if (it->kind == ITEM_MESSAGE) snprintf(out, 48, "msg_%llu_%d", (unsigned long long)q->request_no, index);
    else snprintf(out, 48, "fc_%llu_%d", (unsigned long long)q->request_no, it->call);
}

static void write_part(cb_jw *w, const item *it, int with_text) {
    cb_jw_begin_object(w);
    cb_jw_key(w, "type");
    cb_jw_str(w, it->kind == ITEM_REASONING ? "reasoning_text" : "output_text");
    cb_jw_key(w, "text");
    cb_jw_str_n(w, it->text, with_text ? it->len : 0);
    if (it->kind == ITEM_MESSAGE) {
        cb_jw_key(w, "annotations");
        cb_jw_begin_array(w);
        cb_jw_end_array(w);
        cb_jw_key(w, "logprobs");
        cb_jw_begin_array(w);
        cb_jw_end_array(w);
    }
    cb_jw_end_object(w);
}

/* An output item: whole (done), or as it begins (no text, in_progress). */
static void write_item(const cb_slot *st, cb_jw *w, const item *it, int index, int done, const char *status) {
    const cb_request *q = st->req;
    char id[48];
    item_id(q, it, index, id);
    cb_jw_begin_object(w);
    cb_jw_key(w, "id");
    cb_jw_str(w, id);
    cb_jw_key(w, "type");
    if (it->kind == ITEM_CALL) {
        const cb_tool_call_span *c = &st->calls[it->call];
        char call_id[16];
        cb_tool_call_id(q, it->call, call_id);
        cb_jw_str(w, "function_call");
        cb_jw_key(w, "call_id");
        cb_jw_str(w, call_id);
        cb_jw_key(w, "name");
        cb_jw_str_n(w, st->tool_calls + c->name_off, c->name_len);
        cb_jw_key(w, "arguments");
        cb_jw_str_n(w, st->tool_calls + c->args_off, done ? c->args_len : 0);
    } else {
        cb_jw_str(w, it->kind == ITEM_REASONING ? "reasoning" : "message");
        if (it->kind == ITEM_REASONING) {
            cb_jw_key(w, "summary");
            cb_jw_begin_array(w);
            cb_jw_end_array(w);
        } else {
            cb_jw_key(w, "role");
            cb_jw_str(w, "assistant");
        }
        cb_jw_key(w, "content");
        cb_jw_begin_array(w);
        if (done) write_part(w, it, 1);
        cb_jw_end_array(w);
    }
    cb_jw_key(w, "status");
    cb_jw_str(w, done ? status : "in_progress");
    cb_jw_end_object(w);
}

static int incomplete(const cb_slot *st) { return st->finish_reason && !strcmp(st->finish_reason, "length"); }

/* The response object. status "in_progress" has no output or usage yet;
 * "failed" carries error_message. */
static void write_response(cb_app *a, cb_jw *w, const cb_slot *st, const char *status, const char *error_message) {
    const cb_request *q = st->req;
    const int done = !strcmp(status, "completed") || !strcmp(status, "incomplete");
    char id[48];
    snprintf(id, sizeof id, "resp_%llu", (unsigned long long)q->request_no);
    cb_jw_begin_object(w);
    cb_jw_key(w, "id");
    cb_jw_str(w, id);
    cb_jw_key(w, "object");
    cb_jw_str(w, "response");
    cb_jw_key(w, "created_at");
    cb_jw_int(w, q->created);
    cb_jw_key(w, "status");
    cb_jw_str(w, status);
    cb_jw_key(w, "background");
    cb_jw_bool(w, 0);
    cb_jw_key(w, "error");
    if (error_message) {
        cb_jw_begin_object(w);
        cb_jw_key(w, "code");
        cb_jw_str(w, "server_error");
        cb_jw_key(w, "message");
        cb_jw_str(w, error_message);
        cb_jw_end_object(w);
    } else {
        cb_jw_null(w);
    }
    cb_jw_key(w, "incomplete_details");
    if (!strcmp(status, "incomplete")) {
        cb_jw_begin_object(w);
        cb_jw_key(w, "reason");
        cb_jw_str(w, "max_output_tokens");
        cb_jw_end_object(w);
    } else {
        cb_jw_null(w);
    }
    cb_jw_key(w, "instructions"); /* not kept once the request is read */
    cb_jw_null(w);
    cb_jw_key(w, "max_output_tokens");
    if (q->resp.max_output) cb_jw_int(w, q->resp.max_output);
    else cb_jw_null(w);
    cb_jw_key(w, "model");
    cb_jw_str(w, cb_engine_model_name(a->engine));
    cb_jw_key(w, "output");
    cb_jw_begin_array(w);
    item it;
    for (int k = 0; done && item_at(st, k, &it); k++) {
        item next;
        const int cut = !strcmp(status, "incomplete") && it.kind != ITEM_CALL && !item_at(st, k + 1, &next);
        write_item(st, w, &it, k, 1, cut ? "incomplete" : "completed");
    }
    cb_jw_end_array(w);
    cb_jw_key(w, "parallel_tool_calls");
    cb_jw_bool(w, q->parallel_tools);
    cb_jw_key(w, "previous_response_id");
    cb_jw_null(w);
    cb_jw_key(w, "reasoning");
    cb_jw_begin_object(w);
    cb_jw_key(w, "effort");
    cb_jw_null(w);
    cb_jw_key(w, "summary");
    cb_jw_null(w);
    cb_jw_end_object(w);
    cb_jw_key(w, "store");
    cb_jw_bool(w, 0);
    cb_jw_key(w, "temperature"); /* as used: 0 is greedy, the default here */
    cb_jw_double(w, q->sampling.temperature);
    cb_jw_key(w, "text");
    cb_jw_begin_object(w);
    cb_jw_key(w, "format");
    cb_jw_begin_object(w);
    cb_jw_key(w, "type");
    cb_jw_str(w, q->resp.format == CB_RESP_JSON_SCHEMA ? "json_schema"
                 : q->resp.format == CB_RESP_JSON_OBJECT ? "json_object" : "text");
    cb_jw_end_object(w);
    cb_jw_end_object(w);
    cb_jw_key(w, "tool_choice");
    if (q->resp.tool_choice == CB_RESP_CHOICE_NAMED) {
        cb_jw_begin_object(w);
        cb_jw_key(w, "type");
        cb_jw_str(w, "function");
        cb_jw_key(w, "name");
        cb_jw_str(w, q->resp.tool_name);
        cb_jw_end_object(w);
    } else {
        cb_jw_str(w, q->resp.tool_choice == CB_RESP_CHOICE_NONE ? "none"
                     : q->resp.tool_choice == CB_RESP_CHOICE_REQUIRED ? "required" : "auto");
    }
    cb_jw_key(w, "tools"); /* not kept once the request is read */
    cb_jw_begin_array(w);
    cb_jw_end_array(w);
    cb_jw_key(w, "top_p");
    cb_jw_double(w, q->sampling.top_p);
    cb_jw_key(w, "truncation");
    cb_jw_str(w, "disabled");
    cb_jw_key(w, "metadata");
    cb_jw_begin_object(w);
    cb_jw_end_object(w);
    cb_jw_key(w, "usage");
    if (done) {
        const int in = q->n_prompt, out = st->n_generated;
        cb_jw_begin_object(w);
        cb_jw_key(w, "input_tokens");
        cb_jw_int(w, in);
        cb_jw_key(w, "input_tokens_details");
        cb_jw_begin_object(w);
        cb_jw_key(w, "cached_tokens");
        cb_jw_int(w, st->cached);
        cb_jw_end_object(w);
        cb_jw_key(w, "output_tokens");
        cb_jw_int(w, out);
        cb_jw_key(w, "output_tokens_details");
        cb_jw_begin_object(w);
        cb_jw_key(w, "reasoning_tokens");
        cb_jw_int(w, st->reasoning_tokens);
        cb_jw_end_object(w);
        cb_jw_key(w, "total_tokens");
        cb_jw_int(w, in + out);
        cb_jw_end_object(w);
        cb_write_timings(w, st);
        cb_write_expert_activations(a, w, st);
        if (q->trace) cb_write_trace(a, w, st);
    } else {
        cb_jw_null(w);
    }
    cb_jw_end_object(w);
}

void cb_responses_final(cb_app *a, cb_conn *c, const cb_slot *st) {
    cb_jw w;
    cb_jw_init(&w, a->response, CB_RESPONSE_BYTES);
    write_response(a, &w, st, incomplete(st) ? "incomplete" : "completed", NULL);
    cb_respond_json(a, c, 200, &w);
}

/* ---- the stream: "event: TYPE" and "data: JSON" per event ---- */

#define EVENT_HEAD 64 /* room before the JSON for "event: TYPE\ndata: " */

static void begin_event(cb_app *a, cb_slot *st, cb_jw *w, const char *type) {
    cb_jw_init(w, a->response + EVENT_HEAD, CB_RESPONSE_BYTES - EVENT_HEAD - 2);
    cb_jw_begin_object(w);
    cb_jw_key(w, "type");
    cb_jw_str(w, type);
    cb_jw_key(w, "sequence_number");
    cb_jw_int(w, st->resp_seq++);
}

static int send_event(cb_app *a, cb_conn *c, cb_jw *w, const char *type) {
    cb_jw_end_object(w);
    if (w->overflow) return CB_CONN_ERR_FULL;
    char head[EVENT_HEAD];
    const int n = snprintf(head, sizeof head, "event: %s\ndata: ", type);
    char *at = a->response + EVENT_HEAD - n;
    memcpy(at, head, (size_t)n);
    memcpy(a->response + EVENT_HEAD + w->len, "\n\n", 2);
    return cb_conn_stream_write(c, at, (size_t)n + w->len + 2);
}

/* Item fields every item event has. */
static void item_place(cb_jw *w, const cb_request *q, const item *it, int index, int content) {
    char id[48];
    item_id(q, it, index, id);
    cb_jw_key(w, "item_id");
    cb_jw_str(w, id);
    cb_jw_key(w, "output_index");
    cb_jw_int(w, index);
    if (content) {
        cb_jw_key(w, "content_index");
        cb_jw_int(w, 0);
    }
}

static int lifecycle(cb_app *a, cb_conn *c, cb_slot *st, const char *type, const char *status, const char *error) {
    cb_jw w;
    begin_event(a, st, &w, type);
    cb_jw_key(&w, "response");
    write_response(a, &w, st, status, error);
    return send_event(a, c, &w, type);
}

/* The open item as it stands (its text so far). */
static void open_item(const cb_slot *st, item *it) {
    item_at(st, st->resp_begun - 1, it);
}

static int item_added(cb_app *a, cb_conn *c, cb_slot *st, const item *it) {
    const int index = st->resp_begun++;
    cb_jw w;
    int r;
    begin_event(a, st, &w, "response.output_item.added");
    cb_jw_key(&w, "output_index");
    cb_jw_int(&w, index);
    cb_jw_key(&w, "item");
    write_item(st, &w, it, index, 0, NULL);
    if ((r = send_event(a, c, &w, "response.output_item.added")) != CB_CONN_OK || it->kind == ITEM_CALL) return r;
    begin_event(a, st, &w, "response.content_part.added");
    item_place(&w, st->req, it, index, 1);
    cb_jw_key(&w, "part");
    write_part(&w, it, 0);
    return send_event(a, c, &w, "response.content_part.added");
}

static int item_done(cb_app *a, cb_conn *c, cb_slot *st, const item *it, const char *status) {
    const int index = st->resp_begun - 1;
    cb_jw w;
    int r;
    if (it->kind != ITEM_CALL) {
        const char *type = it->kind == ITEM_REASONING ? "response.reasoning_text.done" : "response.output_text.done";
        begin_event(a, st, &w, type);
        item_place(&w, st->req, it, index, 1);
        cb_jw_key(&w, "text");
        cb_jw_str_n(&w, it->text, it->len);
        if (it->kind == ITEM_MESSAGE) {
            cb_jw_key(&w, "logprobs");
            cb_jw_begin_array(&w);
            cb_jw_end_array(&w);
        }
        if ((r = send_event(a, c, &w, type)) != CB_CONN_OK) return r;
        begin_event(a, st, &w, "response.content_part.done");
        item_place(&w, st->req, it, index, 1);
        cb_jw_key(&w, "part");
        write_part(&w, it, 1);
        if ((r = send_event(a, c, &w, "response.content_part.done")) != CB_CONN_OK) return r;
    }
    begin_event(a, st, &w, "response.output_item.done");
    cb_jw_key(&w, "output_index");
    cb_jw_int(&w, index);
    cb_jw_key(&w, "item");
    write_item(st, &w, it, index, 1, status);
    st->resp_open = ITEM_NONE;
    return send_event(a, c, &w, "response.output_item.done");
}

static int close_open(cb_app *a, cb_conn *c, cb_slot *st, const char *status) {
    if (st->resp_open == ITEM_NONE) return CB_CONN_OK;
    item it;
    open_item(st, &it);
    return item_done(a, c, st, &it, status);
}

/* Text of the reasoning (kind ITEM_REASONING) or a message as a delta of
 * the open item, which begins here when another (or none) is open. */
static int text_delta(cb_app *a, cb_conn *c, cb_slot *st, int kind, const char *text, size_t len) {
    int r;
    if (st->resp_open != kind) {
        if ((r = close_open(a, c, st, "completed")) != CB_CONN_OK) return r;
        item it;
        memset(&it, 0, sizeof it);
        it.kind = kind, it.text = "";
        st->resp_open = kind;
        if ((r = item_added(a, c, st, &it)) != CB_CONN_OK) return r;
    }
    item it;
    open_item(st, &it);
    const char *type = kind == ITEM_REASONING ? "response.reasoning_text.delta" : "response.output_text.delta";
    cb_jw w;
    begin_event(a, st, &w, type);
    item_place(&w, st->req, &it, st->resp_begun - 1, 1);
    cb_jw_key(&w, "delta");
    cb_jw_str_n(&w, text, len);
    if (kind == ITEM_MESSAGE) {
        cb_jw_key(&w, "logprobs");
        cb_jw_begin_array(&w);
        cb_jw_end_array(&w);
    }
    return send_event(a, c, &w, type);
}

int cb_responses_stream_text(cb_app *a, cb_conn *c, cb_slot *st, const char *text, size_t len, int token) {
    if (token < 0 && !len) { /* the opening */
        st->resp_seq = st->resp_begun = 0, st->resp_open = ITEM_NONE;
        int r = lifecycle(a, c, st, "response.created", "in_progress", NULL);
        return r != CB_CONN_OK ? r : lifecycle(a, c, st, "response.in_progress", "in_progress", NULL);
    }
    if (!len) return CB_CONN_OK;
    return text_delta(a, c, st, st->think_state == CB_THINK_REASONING ? ITEM_REASONING : ITEM_MESSAGE, text, len);
}

int cb_responses_stream_call(cb_app *a, cb_conn *c, cb_slot *st, int index) {
    int r = close_open(a, c, st, "completed");
    if (r != CB_CONN_OK) return r;
    item it;
    memset(&it, 0, sizeof it);
    it.kind = ITEM_CALL, it.call = index;
    if ((r = item_added(a, c, st, &it)) != CB_CONN_OK) return r;
    const cb_tool_call_span *call = &st->calls[index];
    cb_jw w;
    /* a call is sent once parsed whole: its arguments are one delta */
    begin_event(a, st, &w, "response.function_call_arguments.delta");
    item_place(&w, st->req, &it, st->resp_begun - 1, 0);
    cb_jw_key(&w, "delta");
    cb_jw_str_n(&w, st->tool_calls + call->args_off, call->args_len);
    if ((r = send_event(a, c, &w, "response.function_call_arguments.delta")) != CB_CONN_OK) return r;
    begin_event(a, st, &w, "response.function_call_arguments.done");
    item_place(&w, st->req, &it, st->resp_begun - 1, 0);
    cb_jw_key(&w, "name");
    cb_jw_str_n(&w, st->tool_calls + call->name_off, call->name_len);
    cb_jw_key(&w, "arguments");
    cb_jw_str_n(&w, st->tool_calls + call->args_off, call->args_len);
    if ((r = send_event(a, c, &w, "response.function_call_arguments.done")) != CB_CONN_OK) return r;
    return item_done(a, c, st, &it, "completed");
}

int cb_responses_stream_finish(cb_app *a, cb_conn *c, cb_slot *st) {
    const int cut = incomplete(st);
    int r = close_open(a, c, st, cut ? "incomplete" : "completed");
    if (r == CB_CONN_OK && st->resp_begun == 0) { /* nothing said: an empty message, as the answer has */
        item it;
        item_at(st, 0, &it);
        st->resp_open = ITEM_MESSAGE;
        r = item_added(a, c, st, &it);
        if (r == CB_CONN_OK) r = item_done(a, c, st, &it, cut ? "incomplete" : "completed");
    }
    if (r == CB_CONN_OK)
        r = lifecycle(a, c, st, cut ? "response.incomplete" : "response.completed", cut ? "incomplete" : "completed",
                      NULL);
    if (r == CB_CONN_OK) r = cb_conn_stream_end(c);
    return r;
}

int cb_responses_stream_error(cb_app *a, cb_conn *c, cb_slot *st, const char *message) {
    int r = lifecycle(a, c, st, "response.failed", "failed", message);
    if (r == CB_CONN_OK) r = cb_conn_stream_end(c);
    return r;
}
