/* libFuzzer target over the request parsers: the HTTP head parser and the
 * JSON reader (with the lookups and unescaping the server does on what it
 * reads, and the writer on arbitrary bytes), and the tool-call parser over
 * the bytes as model output. Any crash, hang or sanitizer report is a bug.
 * Built and run by tests/test_fuzz.py:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I src \
 *         src/server/fuzz_parsers.c src/server/http.c src/server/json.c src/server/toolcall.c */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "http.h"
#include "json.h"
#include "toolcall.h"

#define MAX_TOKS 4096

static cb_json_tok toks[MAX_TOKS];
static char text[1 << 16];
static char out[1 << 17];

static void fuzz_http(const char *data, size_t len) {
    cb_http_request req;
    int r = cb_http_parse(data, len, &req);
    if (r > 0) {
        /* Everything the parser points at lies inside the input. */
        if (req.method < data || req.path + req.path_len > data + len) __builtin_trap();
        for (size_t i = 0; i < req.n_headers; i++)
            if (req.headers[i].value + req.headers[i].value_len > data + (size_t)r) __builtin_trap();
        cb_http_find_header(&req, "content-type");
        cb_http_path_is(&req, "/v1/chat/completions");
        cb_http_method_is(&req, "POST");
    }
    cb_http_parse_limit(data, len, len / 2 + 1, &req);
}

static void fuzz_json(const char *data, size_t len) {
    size_t err_at = 0;
    int n = cb_json_parse(data, len, toks, MAX_TOKS, &err_at);
    if (n < 0) {
        if (err_at > len) __builtin_trap();
        return;
    }
    if (cb_json_parse(data, len, NULL, 0, NULL) != n) __builtin_trap(); /* counting agrees */
    const char *keys[] = {"messages", "prompt", "stop", "temperature", "content"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) cb_json_find(data, toks, 0, keys[k]);
    cb_jw w;
    cb_jw_init(&w, out, sizeof out);
    cb_jw_begin_array(&w);
    for (int i = 0; i < n; i++) {
        const cb_json_tok *t = &toks[i];
        if (t->next <= i || t->next > n || t->start < 0 || (size_t)t->end > len) __builtin_trap();
        int64_t iv;
        double dv;
        int bv;
        cb_json_get_int64(data, t, &iv);
        cb_json_get_double(data, t, &dv);
        cb_json_get_bool(t, &bv);
        if (t->type == CB_JSON_ARRAY) cb_json_array_at(toks, i, t->size - 1);
        if (t->type == CB_JSON_STRING) {
            int m = cb_json_unescape(data, t, text, sizeof text);
            if (m > t->end - t->start) __builtin_trap();
            cb_json_str_eq(data, t, "text");
            if (m >= 0) cb_jw_str_n(&w, text, (size_t)m);
        }
        if (t->type == CB_JSON_NUMBER) cb_jw_double(&w, dv);
    }
    cb_jw_end_array(&w);
    if (!w.overflow && w.buf[w.len] != 0) __builtin_trap();
    /* The writer's output is itself valid JSON. */
    if (!w.overflow && cb_json_parse(w.buf, w.len, NULL, 0, NULL) < 1) __builtin_trap();
}

static size_t tool_bytes;

static int tool_content(void *ctx, const char *s, size_t n) {
    (void)ctx, (void)s;
    tool_bytes += n;
    return 0;
}

static int tool_call(void *ctx, int index, const char *name, size_t name_n, const char *args, size_t args_n) {
    (void)ctx, (void)index, (void)name;
    /* arguments handed out are always a JSON object's text */
    if (name_n == 0 || cb_json_parse(args, args_n, NULL, 0, NULL) < 1 || args[0] != '{') __builtin_trap();
    return 0;
}

/* The bytes as a model's output in every format, fed in pieces whose ends
 * the first byte picks; without calls all text comes back as content. */
static void fuzz_tools(const char *data, size_t len) {
    static char scratch[1 << 14];
    static cb_json_tok ptoks[1024];
    for (int f = CB_TOOLFMT_HERMES; f <= CB_TOOLFMT_LAST; f++) {
        cb_tool_parser p;
        cb_tool_sink sink = {NULL, tool_content, tool_call};
        cb_tool_parser_init(&p, (cb_tool_format)f, CB_MAX_TOOL_CALLS, scratch, sizeof scratch, ptoks, 1024);
        tool_bytes = 0;
        const size_t step = len ? (unsigned char)data[0] % 7 + 1 : 1;
        for (size_t at = step; at < len; at += step) cb_tool_parser_feed(&p, data, at, 0, &sink);
        cb_tool_parser_feed(&p, data, len, 1, &sink);
        if (!p.n_calls && tool_bytes != len) __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_tools((const char *)data, size);
    fuzz_http((const char *)data, size);
    fuzz_json((const char *)data, size);
    /* Also a body that follows a head, as the server sees it. */
    const char *body = memchr(data, '{', size);
    if (body) fuzz_json(body, size - (size_t)(body - (const char *)data));
    /* Arbitrary bytes through the writer must still give valid JSON. */
    cb_jw w;
    cb_jw_init(&w, out, sizeof out);
    cb_jw_str_n(&w, (const char *)data, size);
    if (!w.overflow && cb_json_parse(w.buf, w.len, NULL, 0, NULL) != 1) __builtin_trap();
    return 0;
}
