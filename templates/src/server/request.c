/* Reading a /v1/chat/completions or /v1/completions body into a cb_request
 * (and /v1/responses, as the chat request responses.c rewrites it into):
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

/* fail() with the error's "param" and "code" (OpenAI's, e.g.
 * context_length_exceeded, which clients test for). */
static int fail_code(reader *r, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->err_len, fmt, ap);
    va_end(ap);
    r->a->err_param = param, r->a->err_code = code;
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

/* /v1/responses reads its body as the chat request it means (responses.c). */
static int chat_like(cb_endpoint ep) { return ep != CB_EP_COMPLETION; }

/* Parameters that would change the answer in ways this server does not
 * implement: refused together, by name. */
static int refuse_unsupported(reader *r, cb_endpoint ep) {
    static const char *never[] = {"functions", "function_call", "audio", "modalities", "prediction", "suffix"};
    char names[256] = "";
    size_t used = 0;
#define ADD(name) used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", name)
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        if (field(r, never[i]) >= 0) ADD(never[i]);
    if (ep == CB_EP_COMPLETION && field(r, "tools") >= 0) ADD("tools");
    if (ep == CB_EP_COMPLETION && field(r, "tool_choice") >= 0) ADD("tool_choice");
    int v;
    int64_t x;
    v = field(r, "best_of");
    if (v >= 0 && (cb_json_get_int64(r->body, &r->t[v], &x) != 0 || x != 1)) ADD("best_of");
    int flag = 0;
    v = field(r, "echo");
    if (ep == CB_EP_COMPLETION && v >= 0 && (cb_json_get_bool(&r->t[v], &flag) != 0 || flag)) ADD("echo");
#undef ADD
    if (used) return fail(r, "unsupported parameters: %s", names);
    return 0;
}

/* n: choices of one prompt, each in its own slot (a list of prompts' way),
 * so at most the slot count. */
static int read_n(reader *r, cb_request *q) {
    int64_t n = 1;
    int status = read_int(r, "n", 1, INT32_MAX, &n);
    if (status) return status;
    if (n > r->a->n_slots)
        return fail_code(r, "n", NULL, "'n' is %lld; this server runs at most %d choices (its slots) in one request",
                         (long long)n, r->a->n_slots);
    q->n_samples = (int)n;
    return 0;
}

/* Choice i > 0 of n samples its own random stream; choice 0 the seed's, as
 * the request alone. */
static uint64_t choice_seed(uint64_t seed, int choice) {
    if (choice == 0) return seed;
    uint64_t x = seed + (uint64_t)choice * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
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

/* tool_choice "required" (choice -1) or a named function (choice: its
 * object): the output is constrained to one call in the template's format
 * (cb_tool_constraint's prefix, schema and suffix; constrain.h), then the
 * end. */
static int force_tool_call(reader *r, cb_request *q, int tools, int choice) {
    const cb_json_tok *t = r->t;
    cb_app *a = r->a;
    char name[CB_TOOL_NAME_BYTES + 1] = "", prefix[CB_TOOL_NAME_BYTES + 96], suffix[64], err[384];
    if (choice >= 0) {
        int fn = cb_json_find(r->body, t, choice, "function");
        int nm = fn >= 0 && t[fn].type == CB_JSON_OBJECT ? cb_json_find(r->body, t, fn, "name") : -1;
        if (nm < 0 || t[nm].type != CB_JSON_STRING || t[nm].end - t[nm].start > CB_TOOL_NAME_BYTES ||
            (t[nm].flags & CB_JSON_F_ESCAPED))
            return fail(r, "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}} naming "
                           "one of the 'tools'");
        memcpy(name, r->body + t[nm].start, (size_t)(t[nm].end - t[nm].start));
    }
    if (q->constrained)
        return fail(r, "'tool_choice' %s and 'response_format' both constrain the output; send one of them",
                    choice >= 0 ? "naming a function" : "\"required\"");
    if (!a->chat_work) return fail(r, "'tools' needs the model's chat template, and this model has none");
    if (!a->tool_format || !a->tool_schema)
        return fail(r, "'tools': this model's chat template calls tools in a format this server cannot parse");
    if (cb_tool_constraint(a->tool_format, r->body, t, tools, choice >= 0 ? name : NULL, prefix, sizeof prefix,
                           a->tool_schema, CB_TOOL_SCHEMA_BYTES, suffix, sizeof suffix) != 0)
        return fail(r, "'tool_choice': %s", choice >= 0 && !cb_tool_format_builds_args(a->tool_format)
                                                ? "no tool in 'tools' has that name, or its 'parameters' are too big"
                                                : cb_tool_format_builds_args(a->tool_format)
                                                ? "this model's tool calls (XML parameters or key/value pairs) "
                                                  "cannot be constrained; send \"auto\""
                                                : cb_tool_format_names_outside(a->tool_format)
                                                ? "\"required\" with several tools cannot be constrained in this "
                                                  "model's format (the name is outside the JSON arguments); name the "
                                                  "function"
                                                : "the tools' parameters are too big to constrain");
    const int n = cb_json_parse(a->tool_schema, strlen(a->tool_schema), a->tool_toks, CB_TOOL_SCHEMA_TOKENS, NULL);
    if (n < 1) return fail(r, "'tools': the tools' parameters are too big to constrain");
    if (cb_con_compile(&q->con, prefix, strlen(prefix), a->tool_schema, a->tool_toks, 0, suffix, strlen(suffix), err,
                       sizeof err))
        return fail(r, "'tool_choice': the tools' parameters: %s", err);
    q->constrained = 1;
    return 0;
}

/* tools, tool_choice and parallel_tool_calls of a chat request: sets
 * q->tool_format when the answer is to be parsed for calls ("auto", the
 * default with tools). "none" still shows the tools to the template. */
static int read_tools(reader *r, cb_request *q) {
    const cb_json_tok *t = r->t;
    q->tool_format = CB_TOOLFMT_NONE;
    q->parallel_tools = 1;
    int status = read_bool(r, "parallel_tool_calls", &q->parallel_tools);
    if (status) return status;
    int tools = field(r, "tools"), choice = field(r, "tool_choice");
    if (tools >= 0 && t[tools].type != CB_JSON_ARRAY)
        return fail(r, "'tools' must be an array of {\"type\": \"function\", \"function\": {\"name\": ...}} objects");
    for (int i = 0, e = tools + 1; tools >= 0 && i < t[tools].size; i++, e = t[e].next) {
        int type = cb_json_find(r->body, t, e, "type"), fn = cb_json_find(r->body, t, e, "function");
        int name = fn >= 0 ? cb_json_find(r->body, t, fn, "name") : -1;
        if (t[e].type != CB_JSON_OBJECT || type < 0 || !cb_json_str_eq(r->body, &t[type], "function") || fn < 0 ||
            t[fn].type != CB_JSON_OBJECT)
            return fail(r, "'tools[%d]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        if (name < 0 || t[name].type != CB_JSON_STRING || t[name].end == t[name].start ||
            t[name].end - t[name].start > CB_TOOL_NAME_BYTES)
            return fail(r, "'tools[%d].function.name' must be a string of 1 to %d bytes", i, CB_TOOL_NAME_BYTES);
    }
    const int n_tools = tools >= 0 ? t[tools].size : 0;
    int parse = n_tools > 0;
    if (choice >= 0) {
        const int named = t[choice].type == CB_JSON_OBJECT;
        if (t[choice].type == CB_JSON_STRING && cb_json_str_eq(r->body, &t[choice], "none")) {
            parse = 0;
        } else if (t[choice].type == CB_JSON_STRING && cb_json_str_eq(r->body, &t[choice], "auto")) {
        } else if (named || (t[choice].type == CB_JSON_STRING && cb_json_str_eq(r->body, &t[choice], "required"))) {
            if (!n_tools) return fail(r, "'tool_choice' names a tool, and there are no 'tools'");
            if ((status = force_tool_call(r, q, tools, named ? choice : -1))) return status;
        } else {
            return fail(r, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}");
        }
    }
    if (!n_tools) return 0;
    if (!r->a->chat_work)
        return fail(r, "'tools' needs the model's chat template, and this model has none");
    if (!parse) return 0;
    if (!r->a->tool_format)
        return fail(r, "'tools': this model's chat template calls tools in a format this server cannot parse (it "
                       "parses Hermes <tool_call> JSON, Qwen3-Coder XML, Mistral [TOOL_CALLS], Llama 3.1 JSON "
                       "and gpt-oss harmony); send \"tool_choice\": \"none\" to only show the tools to the model");
    q->tool_format = r->a->tool_format;
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
        return fail_code(r, "response_format", NULL,
                         "'response_format' must be an object with 'type' \"text\", \"json_object\" or \"json_schema\"");
    if (cb_json_str_eq(r->body, &t[type], "text")) return 0;
    int schema = -1;
    if (cb_json_str_eq(r->body, &t[type], "json_schema")) {
        int js = cb_json_find(r->body, t, v, "json_schema");
        if (js < 0 || t[js].type != CB_JSON_OBJECT)
            return fail_code(r, "response_format.json_schema", NULL,
                             "'response_format.json_schema' must be an object with a 'schema'");
        int name = cb_json_find(r->body, t, js, "name");
        if (name >= 0 && t[name].type != CB_JSON_STRING)
            return fail_code(r, "response_format.json_schema.name", NULL, "'response_format.json_schema.name' must be a string");
        schema = cb_json_find(r->body, t, js, "schema"); /* absent: any JSON object */
        if (schema >= 0 && t[schema].type == CB_JSON_NULL) schema = -1;
    } else if (!cb_json_str_eq(r->body, &t[type], "json_object")) {
        return fail_code(r, "response_format.type", NULL,
                         "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    if (cb_engine_tokenizer(r->a->engine)->kind == CB_TOKENIZER_NONE)
        return fail_code(r, "response_format", NULL,
                         "'response_format' needs a tokenizer, and this model was converted without one");
    char err[384];
    if (cb_con_compile(&q->con, "", 0, r->body, t, schema, "", 0, err, sizeof err)) {
        /* the param names the refused field, as OpenAI's errors do */
        cb_app *a = r->a;
        if (schema < 0) snprintf(a->err_param_text, sizeof a->err_param_text, "response_format");
        else
            snprintf(a->err_param_text, sizeof a->err_param_text, "response_format.json_schema.schema%s%s",
                     q->con.err_at[0] ? "." : "", q->con.err_at);
        return fail_code(r, a->err_param_text, NULL, "'response_format': %s", err);
    }
    q->constrained = 1;
    return 0;
}

/* A prompt of n tokens must leave room for one generated token. Worded as
 * OpenAI words it ("maximum context length", code context_length_exceeded),
 * which clients (LangChain, LiteLLM) recognise to trim the history. */
static int check_prompt_length(reader *r, int n, int ctx) {
    if (n <= ctx - 1) return 0;
    const int chat = cb_json_find(r->body, r->t, 0, "messages") >= 0;
    return fail_code(r, chat ? "messages" : "prompt", "context_length_exceeded",
                     "This model's maximum context length is %d tokens. However, your %s resulted in %d tokens, "
                     "which leaves no room for the completion (at most %d prompt tokens). Please reduce the length "
                     "of the %s.", ctx, chat ? "messages" : "prompt", n, ctx - 1, chat ? "messages" : "prompt");
}

/* The prompt and an explicit max_tokens must fit the context together (as
 * OpenAI and vLLM refuse it; without max_tokens the answer may run to the
 * end of the context). */
static int check_context(reader *r, const cb_request *q, int64_t asked, int ctx) {
    if (asked <= 0 || q->n_prompt + asked <= ctx) return 0;
    const int chat = chat_like(q->endpoint);
    return fail_code(r, chat ? "messages" : "prompt", "context_length_exceeded",
                     "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                     "the %s, %lld in the completion). Please reduce the length of the %s or completion.",
                     ctx, (long long)(q->n_prompt + asked), q->n_prompt, chat ? "messages" : "prompt",
                     (long long)asked, chat ? "messages" : "prompt");
}

/* logit_bias: {"<token id>": a number from -100 to 100}, added to that
 * token's logit before penalties and sampling (greedy too), as OpenAI
 * defines it. Entries of one id add up. */
static int read_logit_bias(reader *r, cb_request *q) {
    const cb_json_tok *t = r->t;
    const int v = field(r, "logit_bias");
    const int64_t vocab = (int64_t)r->a->dims->vocab;
    q->n_bias = 0;
    q->sampling.n_bias = 0;
    if (v < 0) return 0;
    if (t[v].type != CB_JSON_OBJECT)
        return fail_code(r, "logit_bias", NULL, "'logit_bias' must be an object of token ids (as strings) to "
                         "numbers from -100 to 100, like {\"1234\": -100}");
    if (t[v].size > CB_MAX_LOGIT_BIAS)
        return fail_code(r, "logit_bias", NULL, "'logit_bias' has %d entries; at most %d are allowed", t[v].size,
                         CB_MAX_LOGIT_BIAS);
    for (int k = 0, i = v + 1; k < t[v].size; k++, i = t[i + 1].next) {
        const int klen = t[i].end - t[i].start < 40 ? t[i].end - t[i].start : 40;
        const char *key = r->body + t[i].start;
        int64_t id = 0;
        int digits = t[i].end - t[i].start;
        for (int j = 0; j < digits && id < vocab; j++) {
            if (key[j] < '0' || key[j] > '9' || (j == 0 && key[j] == '0' && digits > 1)) { id = -1; break; }
            id = id * 10 + (key[j] - '0');
        }
        if (digits == 0 || (t[i].flags & CB_JSON_F_ESCAPED) || id < 0 || id >= vocab)
            return fail_code(r, "logit_bias", NULL, "'logit_bias' key \"%.*s\" must be a token id from 0 to %lld",
                             klen, key, (long long)vocab - 1);
        double bias;
        if (cb_json_get_double(r->body, &t[i + 1], &bias) != 0 || !(bias >= -100 && bias <= 100))
            return fail_code(r, "logit_bias", NULL, "'logit_bias[\"%.*s\"]' must be a number from -100 to 100",
                             klen, key);
        q->bias_id[q->n_bias] = (int32_t)id;
        q->bias[q->n_bias++] = (float)bias;
    }
    q->sampling.bias_ids = q->bias_id, q->sampling.bias = q->bias, q->sampling.n_bias = q->n_bias;
    return 0;
}

/* 'prompt' as a list: a list of token ids is one prompt; a list of strings
 * or of lists of ids holds several, one choice each (each in its own slot,
 * all at once, so at most the slot count). q->choice picks one: its index
 * through *one, and the count in q->n_choices; or 400. */
static int pick_prompt(reader *r, cb_request *q, int v, int *one) {
    const cb_json_tok *t = r->t;
    *one = v;
    q->n_choices = 1;
    if (t[v].type != CB_JSON_ARRAY || t[v].size == 0) return 0;
    if (t[v + 1].type != CB_JSON_STRING && t[v + 1].type != CB_JSON_ARRAY) return 0; /* token ids */
    const int n = t[v].size;
    if (n > r->a->n_slots)
        return fail_code(r, "prompt", NULL, "'prompt' holds %d prompts; this server runs at most %d (its slots) in "
                         "one request: send the rest in another", n, r->a->n_slots);
    for (int i = 0, e = v + 1; i < n; i++, e = t[e].next)
        if (t[e].type != t[v + 1].type)
            return fail_code(r, "prompt", NULL, "'prompt[%d]': a list of prompts holds all strings or all arrays "
                             "of token ids", i);
    q->n_choices = n;
    *one = cb_json_array_at(t, v, q->choice);
    return 0;
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
        if ((status = chat_request(r, &cq, n_messages, 1))) return status;
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
    int v = cb_json_find(r->body, t, 0, "prompt"), status;
    if (v < 0) return fail(r, "'prompt' is required");
    if ((status = pick_prompt(r, q, v, &v))) return status;
    if (t[v].type == CB_JSON_STRING) {
        if ((status = no_tokenizer(r, "a text 'prompt'"))) return status;
        int n = cb_json_unescape(r->body, &t[v], r->a->scratch, r->a->scratch_cap);
        if (n < 0) return fail(r, "'prompt' holds an invalid string");
        /* Into a->ids, which holds any prompt the body can make: a failure
         * names its own cause, and a long prompt its real length. */
        char err[256];
        int got = cb_tokenize_ex(tok, r->a->scratch, (size_t)n, 1, r->a->ids, (int)r->a->scratch_cap, err,
                                 sizeof err);
        if (got < 0) return fail(r, "'prompt': %s", err);
        /* BOS, then the text, where the tokenizer adds one to plain text
         * (its add_bos; the synthetic byte tokenizer always does); Qwen's
         * adds none. */
        const int bos = tok->info.bos_id != CB_NO_TOKEN && (tok->kind == CB_TOKENIZER_BYTES || tok->add_bos);
        if ((status = check_prompt_length(r, got + bos, ctx))) return status;
        if (bos) q->prompt[0] = (int32_t)tok->info.bos_id;
        memcpy(q->prompt + bos, r->a->ids, (size_t)got * sizeof *q->prompt);
        q->n_prompt = got + bos;
        return 0;
    }
    if (t[v].type != CB_JSON_ARRAY) return fail(r, "'prompt' must be a string or an array of token ids");
    const int n = t[v].size;
    if (n == 0) return fail(r, "'prompt' must not be empty");
    if ((status = check_prompt_length(r, n, ctx))) return status;
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

int cb_request_next_prompt(cb_app *a, cb_request *q, const cb_request *first, const char *body, int choice,
                           char *err, size_t err_len) {
    reader rd = {a, body, a->toks, err, err_len};
    int32_t *prompt = q->prompt;
    *q = *first; /* every setting; its own prompt and bias */
    q->prompt = prompt;
    q->sampling.bias_ids = q->bias_id, q->sampling.bias = q->bias;
    q->choice = choice;
    if (first->n_samples > 1) { /* n: the same prompt, another random stream */
        memcpy(q->prompt, first->prompt, (size_t)first->n_prompt * sizeof *q->prompt);
        q->sampling.seed = choice_seed(first->sampling.seed, choice);
        return 0;
    }
    const int ctx = (int)a->dims->context_len;
    int status = read_prompt(&rd, q, ctx);
    if (!status) status = check_context(&rd, q, first->max_tokens < ctx ? first->max_tokens : 0, ctx);
    return status;
}

int cb_request_read(cb_app *a, cb_request *q, cb_endpoint ep, const char *body, size_t len, char *err,
                    size_t err_len) {
    reader rd = {a, body, a->toks, err, err_len}, *r = &rd;
    a->err_param = a->err_code = NULL;
    q->choice = 0, q->n_choices = 1;
    q->group_prompt = q->group_completion = q->group_cached = 0;
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
    if ((status = refuse_unsupported(r, ep)) || (status = read_n(r, q))) return status;

    int64_t x, asked = 0;
    const char *len_fields[] = {"max_tokens", "max_completion_tokens"};
    for (int f = 0; f < 2; f++) {
        x = 0;
        if ((status = read_int(r, len_fields[f], 1, INT32_MAX, &x))) return status;
        if (x > 0 && x < q->max_tokens) q->max_tokens = (int)x;
        if (x > 0 && (asked == 0 || x < asked)) asked = x;
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
    if (chat_like(ep)) {
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
    if ((status = read_logit_bias(r, q))) return status;
    if ((status = read_response_format(r, q))) return status;
    q->tool_format = CB_TOOLFMT_NONE;
    if (chat_like(ep) && (status = read_tools(r, q))) return status;
    status = chat_like(ep) ? read_messages(r, q, ctx) : read_prompt(r, q, ctx);
    if (!status) status = check_context(r, q, asked, ctx);
    if (!status && q->n_samples > 1) {
        if (q->n_choices > 1)
            return fail_code(r, "n", NULL, "'n' above 1 with a list of prompts is not supported: send one prompt, "
                             "or the list with n = 1");
        q->n_choices = q->n_samples;
    }
    if (!status && chat_like(ep)) cb_reasoning_request(a, q);
    return status;
}
