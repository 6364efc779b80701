/* libFuzzer target over the request parsers: the HTTP head parser and the
 * JSON reader (with the lookups and unescaping the server does on what it
 * reads, and the writer on arbitrary bytes). Any crash, hang or sanitizer
 * report is a bug. Built and run by tests/test_fuzz.py:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I src \
 *         src/server/fuzz_parsers.c src/server/http.c src/server/json.c */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "http.h"
#include "json.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
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
