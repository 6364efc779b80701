/* Tests of the HTTP parser, the JSON reader/writer and the connection loop.
 * Standalone (own main); built under ASan/UBSan from http.c, json.c,
 * netloop.c, this file and platform/net_posix.c (see the project's build
 * for the exact command). The loop tests run an echo application on a thread and talk to it over
 * plain sockets on 127.0.0.1. */
#define _GNU_SOURCE /* MSG_NOSIGNAL, strncasecmp, usleep */

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "platform/net.h"
#include "server/http.h"
#include "server/json.h"
#include "server/netloop.h"

static int n_passed, n_failed;

static void check(int ok, const char *what, const char *file, int line)
{
    if (ok) {
        n_passed++;
    } else {
        n_failed++;
        fprintf(stderr, "FAIL %s:%d: %s\n", file, line, what);
    }
}
#define CHECK(cond) check((cond) != 0, #cond, __FILE__, __LINE__)

/* Literal with its length, NULs included. */
#define LIT(s) s, sizeof(s) - 1

static int span_is(const char *p, size_t n, const char *s)
{
    return p != NULL && n == strlen(s) && memcmp(p, s, n) == 0;
}

static uint64_t now_ms(void) { return cb_net_now_ms(); }

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ================= HTTP parser ================= */

/* The request points into the copy: it stays until the next call. */
static char *parsed_copy;

static int parse_n(const char *s, size_t n, cb_http_request *req)
{
    /* An exact-size heap copy lets ASan catch any read past the end. */
    free(parsed_copy);
    parsed_copy = malloc(n ? n : 1);
    memcpy(parsed_copy, s, n);
    return cb_http_parse(parsed_copy, n, req);
}

static int parse_s(const char *s, cb_http_request *req) { return parse_n(s, strlen(s), req); }

static void test_http_good(void)
{
    cb_http_request req;
    const cb_http_header *h;
    const char *get = "GET /v1/models?x=1 HTTP/1.1\r\nHost: localhost:8080\r\nAccept: */*\r\n\r\n";
    const char *post = "POST /v1/chat/completions HTTP/1.1\r\ncontent-LENGTH: 13\r\n"
                       "Authorization:   Bearer sk-123  \r\nConnection: close\r\n"
                       "Content-Length: 13\r\n\r\n{\"a\":\"hello\"}";
    int n;

    n = cb_http_parse(get, strlen(get), &req);
    CHECK(n == (int)strlen(get));
    CHECK(span_is(req.method, req.method_len, "GET"));
    CHECK(span_is(req.path, req.path_len, "/v1/models?x=1"));
    CHECK(cb_http_path_is(&req, "/v1/models"));
    CHECK(!cb_http_path_is(&req, "/v1/model"));
    CHECK(cb_http_method_is(&req, "GET") && !cb_http_method_is(&req, "get"));
    CHECK(req.minor_version == 1);
    CHECK(req.n_headers == 2);
    CHECK(span_is(req.headers[0].name, req.headers[0].name_len, "Host"));
    CHECK(span_is(req.headers[0].value, req.headers[0].value_len, "localhost:8080"));
    CHECK(req.content_length == -1 && req.keep_alive == 1 && req.chunked == 0);
    CHECK(req.authorization == NULL);
    h = cb_http_find_header(&req, "ACCEPT");
    CHECK(h != NULL && span_is(h->value, h->value_len, "*/*"));
    CHECK(cb_http_find_header(&req, "accept-encoding") == NULL);

    n = cb_http_parse(post, strlen(post), &req);
    CHECK(n == (int)strlen(post) - 13);
    CHECK(req.content_length == 13);
    CHECK(req.keep_alive == 0);
    CHECK(span_is(req.authorization, req.authorization_len, "Bearer sk-123"));
    CHECK(span_is(post + n, 13, "{\"a\":\"hello\"}"));

    CHECK(parse_s("GET / HTTP/1.0\r\n\r\n", &req) > 0 && req.keep_alive == 0 && req.minor_version == 0);
    CHECK(parse_s("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &req) > 0 && req.keep_alive == 1);
    CHECK(parse_s("GET / HTTP/1.1\r\nConnection: keep-alive, CLOSE\r\n\r\n", &req) > 0 &&
          req.keep_alive == 0);
    CHECK(parse_s("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", &req) > 0 &&
          req.chunked == 1 && req.has_transfer_encoding == 1);
    CHECK(parse_s("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", &req) > 0 &&
          req.chunked == 0 && req.has_transfer_encoding == 1);
    CHECK(parse_s("POST / HTTP/1.1\r\nExpect: 100-Continue\r\n\r\n", &req) > 0 &&
          req.expect_continue == 1);
    CHECK(parse_s("\r\n\r\nGET / HTTP/1.1\r\n\r\n", &req) == 22);
    CHECK(parse_s("GET / HTTP/1.1\r\nX-Empty:\r\nX-Tab:\ta\tb\t\r\n\r\n", &req) > 0 &&
          req.headers[0].value_len == 0 && span_is(req.headers[1].value, req.headers[1].value_len, "a\tb"));
    CHECK(parse_s("GET / HTTP/1.1\r\nX-Utf8: caf\xc3\xa9\r\n\r\n", &req) > 0);
    /* Absolute-form targets (RFC 9112 3.2.2) route like their path. */
    CHECK(parse_s("GET http://127.0.0.1:8080/health HTTP/1.1\r\n\r\n", &req) > 0 &&
          span_is(req.path, req.path_len, "/health") && cb_http_path_is(&req, "/health"));
    CHECK(parse_s("GET HTTPS://h/v1/models?x=1 HTTP/1.1\r\n\r\n", &req) > 0 &&
          span_is(req.path, req.path_len, "/v1/models?x=1"));
    CHECK(parse_s("GET http://h:1 HTTP/1.1\r\n\r\n", &req) > 0 && span_is(req.path, req.path_len, "/"));
    CHECK(parse_s("GET http://h?q=1 HTTP/1.1\r\n\r\n", &req) > 0 && span_is(req.path, req.path_len, "/"));
    CHECK(parse_s("GET httpx://h/a HTTP/1.1\r\n\r\n", &req) > 0 &&
          span_is(req.path, req.path_len, "httpx://h/a"));
    CHECK(parse_s("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", &req) > 0 &&
          req.content_length == 5);
    CHECK(parse_s("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", &req) > 0 && req.content_length == 0);
    CHECK(parse_s("POST / HTTP/1.1\r\nContent-Length: 9223372036854775807\r\n\r\n", &req) > 0 &&
          req.content_length == INT64_MAX);
}

static void test_http_incremental(void)
{
    static const char *requests[] = {
        "GET / HTTP/1.1\r\n\r\n",
        "GET /v1/models HTTP/1.1\r\nHost: a\r\nUser-Agent: t/1.0\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nAuthorization: Bearer x\r\n\r\n{}",
        "\r\nDELETE /x HTTP/1.0\r\nX:y\r\n\r\n",
    };
    size_t k;
    for (k = 0; k < sizeof requests / sizeof requests[0]; k++) {
        const char *s = requests[k];
        cb_http_request req;
        int head = cb_http_parse(s, strlen(s), &req), all_incomplete = 1;
        size_t i;
        CHECK(head > 0);
        for (i = 0; i < (size_t)head; i++) {
            if (parse_n(s, i, &req) != CB_HTTP_INCOMPLETE) {
                fprintf(stderr, "  request %zu cut at %zu not incomplete\n", k, i);
                all_incomplete = 0;
            }
        }
        CHECK(all_incomplete);
        CHECK(parse_n(s, (size_t)head, &req) == head);
        CHECK(parse_n(s, strlen(s), &req) == head);
    }
}

static void test_http_bad(void)
{
    static const struct {
        const char *s;
        size_t n;
        const char *why; /* in the parser's reason */
    } bad[] = {
        {LIT("GET / HTTP/1.1\r\nHost\r\n\r\n"), "a header line without a colon"},
        {LIT("GET  / HTTP/1.1\r\n\r\n"), "more than one space after the method"},
        {LIT(" GET / HTTP/1.1\r\n\r\n"), "the request line is not"},
        {LIT("GET / HTTP/1\r\n\r\n"), "the HTTP version is not"},
        {LIT("GET / HTTP/1.10\r\n\r\n"), "does not end in CRLF after the version"},
        {LIT("GET / HTTP/x.1\r\n\r\n"), "the HTTP version is not"},
        {LIT("GET / http/1.1\r\n\r\n"), "does not end in an HTTP version"},
        {LIT("GET /\x01 HTTP/1.1\r\n\r\n"), "control or non-ASCII byte"},
        {LIT("G\0T / HTTP/1.1\r\n\r\n"), "the request line is not"},
        {LIT("GET / HTTP/1.1\r\nX: a\x01" "b\r\n\r\n"), "control character"},
        {LIT("GET / HTTP/1.1\r\nX: a\x7f\r\n\r\n"), "control character"},
        {LIT("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n"), "control character"},
        {LIT("GET / HTTP/1.1\nHost: x\n\n"), "bare LF"},
        {LIT("GET / HTTP/1.1\r\nHost: x\n\r\n"), "bare LF"},
        {LIT("GET / HTTP/1.1\r\r\n\r\n"), "CR not followed by LF"},
        {LIT("GET / HTTP/1.1\r\nHost : x\r\n\r\n"), "a blank between a header name and its colon"},
        {LIT("GET / HTTP/1.1\r\nX: a\r\n continued\r\n\r\n"), "obsolete line folding"},
        {LIT("GET / HTTP/1.1\r\n: x\r\n\r\n"), "no name before its colon"},
        {LIT("POST / HTTP/1.1\r\nContent-Length: 12a\r\n\r\n"), "Content-Length is not a decimal"},
        {LIT("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), "Content-Length is not a decimal"},
        {LIT("POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n"), "Content-Length is not a decimal"},
        {LIT("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n"), "Content-Length is not a decimal"},
        {LIT("POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n"), "Content-Length is not a decimal"},
        {LIT("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"), "Content-Length is not a decimal"},
        {LIT("POST / HTTP/1.1\r\nContent-Length: 9223372036854775808\r\n\r\n"), "Content-Length is not a decimal"},
        {LIT("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), "two different Content-Length"},
        {LIT("GET / HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n"), "two Authorization fields"},
        {LIT("GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n"), "control or non-ASCII byte"},
        {LIT("GET /\x01"), "control or non-ASCII byte"},  /* rejected before the head is complete */
        {LIT("GE\r\n"), "the request line is not"},
    };
    size_t k;
    cb_http_request req;
    for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int r = parse_n(bad[k].s, bad[k].n, &req);
        if (r != CB_HTTP_BAD || req.error == NULL || strstr(req.error, bad[k].why) == NULL)
            fprintf(stderr, "  bad request %zu: got %d (%s)\n", k, r, req.error ? req.error : "no reason");
        CHECK(r == CB_HTTP_BAD);
        CHECK(req.error != NULL && strstr(req.error, bad[k].why) != NULL);
    }
    /* Another major version is not malformed: 505, not 400. A later 1.x
     * is read as 1.1 (RFC 9110 2.5). */
    CHECK(parse_s("GET / HTTP/2.0\r\n\r\n", &req) == CB_HTTP_VERSION);
    CHECK(parse_s("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", &req) == CB_HTTP_VERSION);
    CHECK(parse_s("GET / HTTP/1.2\r\n\r\n", &req) > 0 && req.minor_version == 1 && req.keep_alive == 1);
    CHECK(parse_s("GET / HTTP/2.0\r\n", &req) == CB_HTTP_VERSION); /* known once the line is */
    CHECK(parse_s("GET / HTTP/2.0", &req) == CB_HTTP_INCOMPLETE);
    CHECK(parse_s("GET / HTTP/1.1", &req) == CB_HTTP_INCOMPLETE);
    CHECK(parse_s("", &req) == CB_HTTP_INCOMPLETE);
}

static void test_http_limits(void)
{
    char buf[24 * 1024];
    cb_http_request req;
    size_t n;
    int i;

    n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\n");
    for (i = 0; i < CB_HTTP_MAX_HEADERS; i++)
        n += (size_t)sprintf(buf + n, "X-%d: v\r\n", i);
    memcpy(buf + n, "\r\n", 3);
    CHECK(parse_n(buf, n + 2, &req) == (int)(n + 2) && req.n_headers == CB_HTTP_MAX_HEADERS);
    n += (size_t)sprintf(buf + n, "X-more: v\r\n\r\n");
    CHECK(parse_n(buf, n, &req) == CB_HTTP_TOO_LARGE);

    n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\nX: ");
    memset(buf + n, 'a', 20000);
    n += 20000;
    memcpy(buf + n, "\r\n\r\n", 4);
    n += 4;
    CHECK(parse_n(buf, n, &req) == CB_HTTP_TOO_LARGE);
    CHECK(parse_n(buf, 16 * 1024 - 1, &req) == CB_HTTP_INCOMPLETE);
    CHECK(parse_n(buf, 16 * 1024, &req) == CB_HTTP_TOO_LARGE);

    /* Caller's limit: a 40-byte head fits 40 but not 39. */
    {
        const char *s = "GET /abc HTTP/1.1\r\nHost: example.org\r\n\r\n";
        CHECK(strlen(s) == 40);
        CHECK(cb_http_parse_limit(s, 40, 40, &req) == 40);
        CHECK(cb_http_parse_limit(s, 40, 39, &req) == CB_HTTP_TOO_LARGE);
        CHECK(cb_http_parse_limit(s, 20, 39, &req) == CB_HTTP_INCOMPLETE);
        CHECK(cb_http_parse_limit(s, 39, 39, &req) == CB_HTTP_TOO_LARGE);
    }

    CHECK(strcmp(cb_http_status_text(200), "OK") == 0);
    CHECK(strcmp(cb_http_status_text(404), "Not Found") == 0);
    CHECK(strcmp(cb_http_status_text(413), "Content Too Large") == 0);
    CHECK(strcmp(cb_http_status_text(431), "Request Header Fields Too Large") == 0);
    CHECK(strcmp(cb_http_status_text(503), "Service Unavailable") == 0);
    CHECK(strcmp(cb_http_status_text(799), "Unknown") == 0);
}

/* ================= JSON reader ================= */

static int json_n(const char *s, size_t n, cb_json_tok *toks, int max, size_t *off)
{
    char *copy = malloc(n ? n : 1);
    int r;
    memcpy(copy, s, n);
    r = cb_json_parse(copy, n, toks, max, off);
    free(copy);
    return r;
}

static void test_json_cases(void)
{
    /* expect: 0 valid, else the error; offset -1: not checked */
    static const struct {
        const char *s;
        size_t n;
        int expect;
        long offset;
    } cases[] = {
        {LIT("{}"), 0, -1},
        {LIT("[]"), 0, -1},
        {LIT(" \t\n\r[ ] \n"), 0, -1},
        {LIT("0"), 0, -1},
        {LIT("-0"), 0, -1},
        {LIT("1.5e10"), 0, -1},
        {LIT("-1E-2"), 0, -1},
        {LIT("1e+2"), 0, -1},
        {LIT("0.25"), 0, -1},
        {LIT("123456789012345678901234567890"), 0, -1},
        {LIT("\"\""), 0, -1},
        {LIT("true"), 0, -1},
        {LIT("false"), 0, -1},
        {LIT("null"), 0, -1},
        {LIT("[1,{\"a\":[true,false,null]},\"s\"]"), 0, -1},
        {LIT("\"\\u00e9\\ud83d\\ude00\\n\\/\\\"\\\\\\b\\f\\r\\t\""), 0, -1},
        {LIT("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf\""), 0, -1},
        {LIT("{\"a\":1,\"a\":2}"), 0, -1},
        {LIT("\"\x7f\""), 0, -1},
        {LIT("{ \"k\" : [ 1 , 2 ] }"), 0, -1},

        {LIT(""), CB_JSON_ERR_EOF, 0},
        {LIT("   "), CB_JSON_ERR_EOF, 3},
        {LIT("["), CB_JSON_ERR_EOF, 1},
        {LIT("{\"a\":"), CB_JSON_ERR_EOF, 5},
        {LIT("{\"a\""), CB_JSON_ERR_EOF, 4},
        {LIT("[1,]"), CB_JSON_ERR_SYNTAX, 3},
        {LIT("{\"a\":1,}"), CB_JSON_ERR_SYNTAX, 7},
        {LIT("{,}"), CB_JSON_ERR_SYNTAX, 1},
        {LIT("[,1]"), CB_JSON_ERR_SYNTAX, 1},
        {LIT("[\"a\",]"), CB_JSON_ERR_SYNTAX, 5},
        {LIT("[01]"), CB_JSON_ERR_NUMBER, 2},
        {LIT("-01"), CB_JSON_ERR_NUMBER, 2},
        {LIT("-"), CB_JSON_ERR_NUMBER, 1},
        {LIT("-a"), CB_JSON_ERR_NUMBER, 1},
        {LIT("1."), CB_JSON_ERR_NUMBER, 2},
        {LIT("1.e5"), CB_JSON_ERR_NUMBER, 2},
        {LIT(".5"), CB_JSON_ERR_SYNTAX, 0},
        {LIT("1e"), CB_JSON_ERR_NUMBER, 2},
        {LIT("1e+"), CB_JSON_ERR_NUMBER, 3},
        {LIT("+1"), CB_JSON_ERR_SYNTAX, 0},
        {LIT("\"abc"), CB_JSON_ERR_EOF, 4},
        {LIT("\"\\x\""), CB_JSON_ERR_ESCAPE, 1},
        {LIT("\"\\u12\""), CB_JSON_ERR_ESCAPE, 1},
        {LIT("\"\\u12"), CB_JSON_ERR_EOF, 5},
        {LIT("\"\\ud800\""), CB_JSON_ERR_ESCAPE, 1},
        {LIT("\"\\udc00\""), CB_JSON_ERR_ESCAPE, 1},
        {LIT("\"\\ud800\\u0041\""), CB_JSON_ERR_ESCAPE, 1},
        {LIT("\"\\ud800\\n\""), CB_JSON_ERR_ESCAPE, 1},
        {LIT("\"\\ud83d\\ud83d\""), CB_JSON_ERR_ESCAPE, 1},
        {LIT("\"a\tb\""), CB_JSON_ERR_CONTROL, 2},
        {LIT("\"a\nb\""), CB_JSON_ERR_CONTROL, 2},
        {LIT("\"\0\""), CB_JSON_ERR_CONTROL, 1},
        {LIT("\"\xff\""), CB_JSON_ERR_UTF8, 1},
        {LIT("\"\x80\""), CB_JSON_ERR_UTF8, 1},
        {LIT("\"\xc0\x80\""), CB_JSON_ERR_UTF8, 1},
        {LIT("\"\xe0\x80\xaf\""), CB_JSON_ERR_UTF8, 1},
        {LIT("\"\xed\xa0\x80\""), CB_JSON_ERR_UTF8, 1},
        {LIT("\"\xf4\x90\x80\x80\""), CB_JSON_ERR_UTF8, 1},
        {LIT("\"\xe2\x82\""), CB_JSON_ERR_UTF8, 1},
        {LIT("\"ok\xc3"), CB_JSON_ERR_EOF, 4},
        {LIT("[1] x"), CB_JSON_ERR_TRAILING, 4},
        {LIT("[1]]"), CB_JSON_ERR_TRAILING, 3},
        {LIT("{} {}"), CB_JSON_ERR_TRAILING, 3},
        {LIT("tru"), CB_JSON_ERR_EOF, 3},
        {LIT("trux"), CB_JSON_ERR_SYNTAX, 3},
        {LIT("nul"), CB_JSON_ERR_EOF, 3},
        {LIT("True"), CB_JSON_ERR_SYNTAX, 0},
        {LIT("{\"a\" 1}"), CB_JSON_ERR_SYNTAX, 5},
        {LIT("{1:2}"), CB_JSON_ERR_SYNTAX, 1},
        {LIT("{\"a\":}"), CB_JSON_ERR_SYNTAX, 5},
        {LIT("[1 2]"), CB_JSON_ERR_SYNTAX, 3},
        {LIT("{\"a\":1 \"b\":2}"), CB_JSON_ERR_SYNTAX, 7},
        {LIT("NaN"), CB_JSON_ERR_SYNTAX, 0},
        {LIT("[Infinity]"), CB_JSON_ERR_SYNTAX, 1},
        {LIT("'a'"), CB_JSON_ERR_SYNTAX, 0},
        {LIT("\xef\xbb\xbf{}"), CB_JSON_ERR_SYNTAX, 0},
        {LIT("[1,\v2]"), CB_JSON_ERR_SYNTAX, 3},
    };
    cb_json_tok toks[64];
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t off = (size_t)-1;
        int r = json_n(cases[k].s, cases[k].n, toks, 64, &off);
        int ok = cases[k].expect == 0 ? r > 0 : r == cases[k].expect;
        if (ok && cases[k].expect != 0 && cases[k].offset >= 0)
            ok = off == (size_t)cases[k].offset;
        if (!ok)
            fprintf(stderr, "  json case %zu: got %d at %zu (%s)\n", k, r, off, cb_json_strerror(r));
        CHECK(ok);
    }
}

static void test_json_depth(void)
{
    char doc[2 * (CB_JSON_MAX_DEPTH + 1) + 16];
    cb_json_tok toks[80];
    size_t off = 0;
    int i, n;

    for (i = 0; i < CB_JSON_MAX_DEPTH; i++) {
        doc[i] = '[';
        doc[2 * CB_JSON_MAX_DEPTH - 1 - i] = ']';
    }
    n = json_n(doc, 2 * CB_JSON_MAX_DEPTH, toks, 80, &off);
    CHECK(n == CB_JSON_MAX_DEPTH);

    for (i = 0; i <= CB_JSON_MAX_DEPTH; i++) {
        doc[i] = '[';
        doc[2 * CB_JSON_MAX_DEPTH + 1 - i] = ']';
    }
    n = json_n(doc, 2 * (CB_JSON_MAX_DEPTH + 1), toks, 80, &off);
    CHECK(n == CB_JSON_ERR_DEPTH && off == CB_JSON_MAX_DEPTH);

    /* Objects count too: {"a":{"a":...}} 65 deep. */
    {
        char obj[65 * 6 + 70];
        size_t len = 0;
        for (i = 0; i < 65; i++)
            len += (size_t)sprintf(obj + len, "{\"a\":");
        obj[len++] = '1';
        for (i = 0; i < 65; i++)
            obj[len++] = '}';
        n = json_n(obj, len, NULL, 0, &off);
        CHECK(n == CB_JSON_ERR_DEPTH);
    }
}

static void test_json_tokens(void)
{
    const char *doc = "{\"a\":[1,2,{\"b\":null}],\"c\":\"x\\ty\",\"d\":-12,\"e\":2.5,\"f\":true}";
    cb_json_tok toks[32];
    char out[64];
    int64_t iv = 0;
    double dv = 0;
    int bv = -1, n, i;

    n = cb_json_parse(doc, strlen(doc), toks, 32, NULL);
    CHECK(n == 16);
    CHECK(cb_json_parse(doc, strlen(doc), NULL, 0, NULL) == 16);
    CHECK(cb_json_parse(doc, strlen(doc), toks, 5, NULL) == CB_JSON_ERR_NOMEM);
    n = cb_json_parse(doc, strlen(doc), toks, 32, NULL);
    CHECK(toks[0].type == CB_JSON_OBJECT && toks[0].size == 5 && toks[0].next == 16);
    CHECK(toks[0].start == 0 && toks[0].end == (int32_t)strlen(doc));
    CHECK(toks[2].type == CB_JSON_ARRAY && toks[2].size == 3 && cb_json_skip(toks, 2) == 8);
    CHECK(toks[5].type == CB_JSON_OBJECT && toks[5].size == 1 && toks[5].next == 8);
    CHECK(toks[1].type == CB_JSON_STRING && span_is(doc + toks[1].start, (size_t)(toks[1].end - toks[1].start), "a"));
    CHECK(toks[7].type == CB_JSON_NULL);
    CHECK(cb_json_array_at(toks, 2, 2) == 5 && cb_json_array_at(toks, 2, 3) == -1 &&
          cb_json_array_at(toks, 0, 0) == -1);

    i = cb_json_find(doc, toks, 0, "c");
    CHECK(i == 9 && (toks[i].flags & CB_JSON_F_ESCAPED));
    CHECK(cb_json_unescape(doc, &toks[i], out, sizeof out) == 3 && strcmp(out, "x\ty") == 0);
    CHECK(cb_json_find(doc, toks, 0, "zz") == -1);
    CHECK(cb_json_find(doc, toks, 2, "a") == -1);
    CHECK(cb_json_find(doc, toks, 5, "b") == 7);

    i = cb_json_find(doc, toks, 0, "d");
    CHECK(cb_json_get_int64(doc, &toks[i], &iv) == 0 && iv == -12);
    CHECK(cb_json_get_double(doc, &toks[i], &dv) == 0 && dv == -12.0);
    i = cb_json_find(doc, toks, 0, "e");
    CHECK(cb_json_get_int64(doc, &toks[i], &iv) == -1);
    CHECK(cb_json_get_double(doc, &toks[i], &dv) == 0 && dv == 2.5);
    i = cb_json_find(doc, toks, 0, "f");
    CHECK(cb_json_get_bool(&toks[i], &bv) == 0 && bv == 1);
    CHECK(cb_json_get_bool(&toks[9], &bv) == -1);
    CHECK(cb_json_get_int64(doc, &toks[9], &iv) == -1);
    CHECK(cb_json_get_double(doc, &toks[1], &dv) == -1);

    {
        const char *dup = "{\"a\":1,\"\\u0061\":2,\"\\u0062c\":3}";
        n = cb_json_parse(dup, strlen(dup), toks, 32, NULL);
        CHECK(n == 7);
        i = cb_json_find(dup, toks, 0, "a");
        CHECK(i == 4 && cb_json_get_int64(dup, &toks[i], &iv) == 0 && iv == 2);
        i = cb_json_find(dup, toks, 0, "bc");
        CHECK(i == 6);
    }
    {
        static const struct {
            const char *s;
            int ok;
            int64_t v;
        } ints[] = {
            {"9223372036854775807", 1, INT64_MAX}, {"9223372036854775808", 0, 0},
            {"-9223372036854775808", 1, INT64_MIN}, {"-9223372036854775809", 0, 0},
            {"-0", 1, 0}, {"1e3", 0, 0}, {"1.0", 0, 0}, {"42", 1, 42},
        };
        size_t k;
        for (k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            int r;
            iv = 7;
            n = cb_json_parse(ints[k].s, strlen(ints[k].s), toks, 4, NULL);
            r = n == 1 ? cb_json_get_int64(ints[k].s, &toks[0], &iv) : -9;
            CHECK(ints[k].ok ? (r == 0 && iv == ints[k].v) : r == -1);
        }
    }
    n = cb_json_parse("1e999", 5, toks, 4, NULL);
    CHECK(n == 1 && cb_json_get_double("1e999", &toks[0], &dv) == -1);
    n = cb_json_parse("-1.25e-2", 8, toks, 4, NULL);
    CHECK(n == 1 && cb_json_get_double("-1.25e-2", &toks[0], &dv) == 0 && dv == -0.0125);
}

static void test_json_unescape(void)
{
    static const struct {
        const char *doc;
        const char *want;
        size_t want_len;
    } cases[] = {
        {"\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", LIT("a\"b\\c/d\b\f\n\r\t")},
        {"\"\\u00e9\"", LIT("\xc3\xa9")},
        {"\"\\u20AC\"", LIT("\xe2\x82\xac")},
        {"\"\\ud83d\\ude00!\"", LIT("\xf0\x9f\x98\x80!")},
        {"\"\\uDBFF\\uDFFF\"", LIT("\xf4\x8f\xbf\xbf")},
        {"\"\\u0000x\"", LIT("\0x")},
        {"\"plain \xc3\xa9\"", LIT("plain \xc3\xa9")},
        {"\"\"", LIT("")},
    };
    cb_json_tok toks[4], fake;
    char out[32];
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int n = cb_json_parse(cases[k].doc, strlen(cases[k].doc), toks, 4, NULL), r;
        CHECK(n == 1);
        r = cb_json_unescape(cases[k].doc, &toks[0], out, sizeof out);
        CHECK(r == (int)cases[k].want_len && memcmp(out, cases[k].want, cases[k].want_len) == 0 &&
              out[r] == '\0');
        CHECK(cb_json_str_eq(cases[k].doc, &toks[0], cases[k].want) ==
              (strlen(cases[k].want) == cases[k].want_len));
    }
    /* Room: "abc" needs 4 bytes with its NUL. */
    cb_json_parse("\"abc\"", 5, toks, 4, NULL);
    CHECK(cb_json_unescape("\"abc\"", &toks[0], out, 3) == -1);
    CHECK(cb_json_unescape("\"abc\"", &toks[0], out, 4) == 3);
    CHECK(cb_json_unescape("\"abc\"", &toks[0], out, 0) == -1);
    cb_json_parse("\"\\u20ac\"", 8, toks, 4, NULL);
    CHECK(cb_json_unescape("\"\\u20ac\"", &toks[0], out, 3) == -1);
    CHECK(cb_json_unescape("\"\\u20ac\"", &toks[0], out, 4) == 3);
    /* A token never validated by the parser: lone surrogates are refused. */
    fake.type = CB_JSON_STRING;
    fake.flags = CB_JSON_F_ESCAPED;
    fake.start = 0;
    fake.end = 6;
    CHECK(cb_json_unescape("\\ud800", &fake, out, sizeof out) == -2);
    CHECK(cb_json_unescape("\\udc00", &fake, out, sizeof out) == -2);
    fake.end = 12;
    CHECK(cb_json_unescape("\\ud800\\u0041", &fake, out, sizeof out) == -2);
    fake.end = 2;
    CHECK(cb_json_unescape("\\q", &fake, out, sizeof out) == -2);
    cb_json_parse("12", 2, toks, 4, NULL);
    CHECK(cb_json_unescape("12", &toks[0], out, sizeof out) == -2);
}

/* ================= JSON writer ================= */

static void test_json_writer(void)
{
    char buf[512];
    cb_jw w;
    cb_json_tok toks[64];
    const char *want =
        "{\"s\":\"q\\\"b\\\\n\\n\\u0001\\u001f\\t\x7f\",\"a\":[1,-2,3.5,null,true,false,[]],"
        "\"e\":{},\"u\":\"\xc3\xa9\xf0\x9f\x98\x80\",\"bad\":\"\xef\xbf\xbd x\xef\xbf\xbd\","
        "\"nan\":null,\"inf\":null,\"raw\":{\"x\":1},\"min\":-9223372036854775808,\"f\":0.1}";

    cb_jw_init(&w, buf, sizeof buf);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "s");
    cb_jw_str(&w, "q\"b\\n\n\x01\x1f\t\x7f");
    cb_jw_key(&w, "a");
    cb_jw_begin_array(&w);
    cb_jw_int(&w, 1);
    cb_jw_int(&w, -2);
    cb_jw_double(&w, 3.5);
    cb_jw_null(&w);
    cb_jw_bool(&w, 1);
    cb_jw_bool(&w, 0);
    cb_jw_begin_array(&w);
    cb_jw_end_array(&w);
    cb_jw_end_array(&w);
    cb_jw_key(&w, "e");
    cb_jw_begin_object(&w);
    cb_jw_end_object(&w);
    cb_jw_key(&w, "u");
    cb_jw_str(&w, "\xc3\xa9\xf0\x9f\x98\x80");
    cb_jw_key(&w, "bad");
    cb_jw_str_n(&w, "\xff x\xe2\x82", 5); /* a stray byte and a cut character */
    cb_jw_key(&w, "nan");
    cb_jw_double(&w, NAN);
    cb_jw_key(&w, "inf");
    cb_jw_double(&w, -INFINITY);
    cb_jw_key(&w, "raw");
    cb_jw_raw(&w, "{\"x\":1}", 7);
    cb_jw_key(&w, "min");
    cb_jw_int(&w, INT64_MIN);
    cb_jw_key(&w, "f");
    cb_jw_double(&w, 0.1);
    cb_jw_end_object(&w);

    CHECK(!w.overflow);
    CHECK(strcmp(buf, want) == 0);
    if (strcmp(buf, want) != 0)
        fprintf(stderr, "  got  %s\n  want %s\n", buf, want);
    CHECK(w.len == strlen(want));
    CHECK(cb_json_parse(buf, w.len, toks, 64, NULL) > 0);

    /* Top-level array of strings: commas only between elements. */
    cb_jw_init(&w, buf, sizeof buf);
    cb_jw_begin_array(&w);
    cb_jw_str(&w, "a");
    cb_jw_str(&w, "");
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "k\"");
    cb_jw_str(&w, "v");
    cb_jw_key(&w, "k2");
    cb_jw_begin_array(&w);
    cb_jw_end_array(&w);
    cb_jw_end_object(&w);
    cb_jw_end_array(&w);
    CHECK(!w.overflow && strcmp(buf, "[\"a\",\"\",{\"k\\\"\":\"v\",\"k2\":[]}]") == 0);

    /* Overflow: the flag is set and nothing lands past cap. */
    {
        char small[32];
        int k, clean = 1;
        memset(small, 'Z', sizeof small);
        cb_jw_init(&w, small, 16);
        cb_jw_begin_object(&w);
        cb_jw_key(&w, "key");
        cb_jw_str(&w, "a long value that will not fit");
        cb_jw_end_object(&w);
        CHECK(w.overflow);
        CHECK(w.len < 16 && small[w.len] == '\0');
        for (k = 16; k < 32; k++)
            clean &= small[k] == 'Z';
        CHECK(clean);

        cb_jw_init(&w, small, 3);
        cb_jw_begin_array(&w);
        cb_jw_end_array(&w);
        CHECK(!w.overflow && strcmp(small, "[]") == 0);
        cb_jw_init(&w, small, 2);
        cb_jw_begin_array(&w);
        cb_jw_end_array(&w);
        CHECK(w.overflow);
        cb_jw_init(&w, small, 0);
        cb_jw_null(&w);
        CHECK(w.overflow);

        cb_jw_init(&w, small, sizeof small);
        cb_jw_end_object(&w); /* unbalanced */
        CHECK(w.overflow);
        cb_jw_init(&w, small, sizeof small);
        cb_jw_begin_object(&w);
        cb_jw_key(&w, "k");
        cb_jw_end_object(&w); /* key without value */
        CHECK(w.overflow);
    }
    /* Doubles. */
    cb_jw_init(&w, buf, sizeof buf);
    cb_jw_begin_array(&w);
    cb_jw_double(&w, 1e300);
    cb_jw_double(&w, -0.0);
    cb_jw_double(&w, 0.123456789123);
    cb_jw_end_array(&w);
    CHECK(strcmp(buf, "[1e+300,-0,0.123456789]") == 0);
    CHECK(cb_json_parse(buf, w.len, toks, 64, NULL) == 4);
}

/* ================= connection loop ================= */

typedef struct {
    cb_netloop *loop;
    atomic_int stop;
    atomic_int closes;
    atomic_int requests;
    atomic_ullong never_id;
    atomic_int never_closed;
    atomic_int flood_full;   /* times the flood met a full write buffer */
    atomic_int flood_closed; /* on_close seen for a flood */
    cb_conn_id deferred;     /* loop thread only, like the flood fields */
    cb_conn_id flood_id;
    size_t flood_sent, flood_total;
    atomic_size_t space_after_begin, space_after_write; /* /stream's write room */
} echo_app;

/* The flood's byte at offset i: a pattern a reader can check. */
static char flood_byte(size_t i) { return (char)('A' + i % 53 % 26); }

static void echo_on_request(void *arg, cb_conn *c, const cb_http_request *req, const char *body,
                            size_t body_len)
{
    echo_app *app = arg;
    atomic_fetch_add(&app->requests, 1);
    if (cb_http_path_is(req, "/stream")) {
        cb_conn_stream_begin(c, 200, "text/event-stream");
        app->space_after_begin = cb_conn_write_space(c);
        cb_conn_stream_write(c, "data: one\n\n", 11);
        app->space_after_write = cb_conn_write_space(c);
        cb_conn_stream_write(c, "data: two\n\n", 11);
        cb_conn_stream_write(c, "", 0);
        cb_conn_stream_write(c, "data: [DONE]\n\n", 14);
        cb_conn_stream_end(c);
    } else if (cb_http_path_is(req, "/flood")) {
        /* Streamed by the loop thread between rounds, as fast as the
         * write buffer takes it: ?n=<bytes>. */
        const char *q = memchr(req->path, '=', req->path_len);
        app->flood_total = q != NULL ? strtoul(q + 1, NULL, 10) : 0;
        app->flood_sent = 0;
        app->flood_id = cb_conn_handle(c);
        cb_conn_stream_begin(c, 200, "application/octet-stream");
    } else if (cb_http_path_is(req, "/later")) {
        app->deferred = cb_conn_handle(c); /* answered after the next poll */
    } else if (cb_http_path_is(req, "/never")) {
        atomic_store(&app->never_id, cb_conn_handle(c));
    } else if (cb_http_path_is(req, "/close")) {
        cb_conn_close(c);
    } else if (cb_http_path_is(req, "/bad-json")) {
        cb_conn_respond_error(c, 400, NULL, "messages: \"x\" is not valid");
    } else if (body_len > 0) {
        cb_conn_respond(c, 200, "application/octet-stream", body, body_len, "X-Echo: body\r\n");
    } else {
        char text[300];
        int n = snprintf(text, sizeof text, "path=%.*s", (int)req->path_len, req->path);
        cb_conn_respond(c, 200, "text/plain", text, (size_t)n, "X-Echo: path");
    }
}

static void echo_on_close(void *arg, cb_conn_id id)
{
    echo_app *app = arg;
    atomic_fetch_add(&app->closes, 1);
    if (id == (cb_conn_id)atomic_load(&app->never_id))
        atomic_store(&app->never_closed, 1);
    if (id == app->flood_id)
        atomic_fetch_add(&app->flood_closed, 1);
}

/* One "compute step" of the flood: write until the buffer is full. */
static void flood_step(echo_app *app)
{
    char piece[4096];
    cb_conn *c = cb_netloop_conn(app->loop, app->flood_id);
    if (c == NULL) {
        app->flood_id = 0;
        return;
    }
    while (app->flood_sent < app->flood_total) {
        size_t n = app->flood_total - app->flood_sent, k;
        if (n > sizeof piece)
            n = sizeof piece;
        if (n > cb_conn_write_space(c))
            n = cb_conn_write_space(c);
        if (n == 0 || (n > 1 && n < sizeof piece && app->flood_sent + n < app->flood_total)) {
            /* Wait for room rather than dribble: a full buffer is the
             * signal of a slow reader. */
            atomic_fetch_add(&app->flood_full, 1);
            return;
        }
        for (k = 0; k < n; k++)
            piece[k] = flood_byte(app->flood_sent + k);
        if (cb_conn_stream_write(c, piece, n) != CB_CONN_OK) {
            atomic_fetch_add(&app->flood_full, 1);
            return;
        }
        app->flood_sent += n;
    }
    cb_conn_stream_end(c);
    app->flood_id = 0;
}

static void *loop_thread(void *arg)
{
    echo_app *app = arg;
    while (!atomic_load(&app->stop)) {
        cb_netloop_poll(app->loop, 10);
        /* "compute" between rounds: answer the deferred request */
        if (app->deferred != 0) {
            cb_conn *c = cb_netloop_conn(app->loop, app->deferred);
            if (c != NULL)
                cb_conn_respond(c, 200, "text/plain", "later", 5, NULL);
            app->deferred = 0;
        }
        if (app->flood_id != 0)
            flood_step(app);
    }
    return NULL;
}

typedef struct {
    int fd;
    size_t len;
    char buf[32 * 1024];
} client;

typedef struct {
    int status;
    char head[2048];
    char body[16 * 1024];
    size_t body_len;
    int chunked;
} response;

static int client_open(client *cl, int port)
{
    struct sockaddr_in a;
    struct timeval tv = {3, 0};
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cl->len = 0;
    cl->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (cl->fd < 0)
        return -1;
    setsockopt(cl->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(cl->fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(cl->fd);
        cl->fd = -1;
        return -1;
    }
    return 0;
}

static void client_close(client *cl)
{
    if (cl->fd >= 0)
        close(cl->fd);
    cl->fd = -1;
}

static int client_send(client *cl, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(cl->fd, s, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

static int client_sends(client *cl, const char *s) { return client_send(cl, s, strlen(s)); }

/* One more recv into the buffer: > 0 bytes, 0 at EOF, -1 error/timeout. */
static int client_fill(client *cl)
{
    ssize_t k;
    if (cl->len == sizeof cl->buf)
        return -1;
    k = recv(cl->fd, cl->buf + cl->len, sizeof cl->buf - cl->len, 0);
    if (k > 0)
        cl->len += (size_t)k;
    return k > 0 ? (int)k : (k == 0 ? 0 : -1);
}

static const char *find_bytes(const char *hay, size_t n, const char *needle)
{
    size_t m = strlen(needle), i;
    for (i = 0; i + m <= n; i++) {
        if (memcmp(hay + i, needle, m) == 0)
            return hay + i;
    }
    return NULL;
}

/* Value of a response header (case-insensitive name) or NULL. */
static const char *head_value(const response *r, const char *name)
{
    const char *p = strstr(r->head, "\r\n");
    size_t n = strlen(name);
    while (p != NULL && p[2] != '\0') {
        p += 2;
        if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
            p += n + 1;
            while (*p == ' ')
                p++;
            return p;
        }
        p = strstr(p, "\r\n");
    }
    return NULL;
}

/* Reads one response. no_body: a reply to HEAD. 0 or -1. */
static int client_response(client *cl, response *r, int no_body)
{
    const char *end, *v;
    size_t head_len, used;

    memset(r, 0, sizeof *r);
    while ((end = find_bytes(cl->buf, cl->len, "\r\n\r\n")) == NULL) {
        if (client_fill(cl) <= 0)
            return -1;
    }
    head_len = (size_t)(end - cl->buf) + 4;
    if (head_len >= sizeof r->head)
        return -1;
    memcpy(r->head, cl->buf, head_len);
    r->head[head_len] = '\0';
    if (strncmp(r->head, "HTTP/1.1 ", 9) != 0)
        return -1;
    r->status = atoi(r->head + 9);
    used = head_len;
    v = head_value(r, "transfer-encoding");
    if (no_body || r->status / 100 == 1) {
        /* no body */
    } else if (v != NULL && strncmp(v, "chunked", 7) == 0) {
        r->chunked = 1;
        for (;;) {
            const char *eol;
            size_t size;
            while ((eol = find_bytes(cl->buf + used, cl->len - used, "\r\n")) == NULL) {
                if (client_fill(cl) <= 0)
                    return -1;
            }
            size = strtoul(cl->buf + used, NULL, 16);
            used = (size_t)(eol - cl->buf) + 2;
            while (cl->len < used + size + 2) {
                if (client_fill(cl) <= 0)
                    return -1;
            }
            if (r->body_len + size > sizeof r->body)
                return -1;
            memcpy(r->body + r->body_len, cl->buf + used, size);
            r->body_len += size;
            used += size + 2;
            if (size == 0)
                break;
        }
    } else if ((v = head_value(r, "content-length")) != NULL) {
        size_t n = strtoul(v, NULL, 10);
        if (n > sizeof r->body)
            return -1;
        while (cl->len < used + n) {
            if (client_fill(cl) <= 0)
                return -1;
        }
        memcpy(r->body, cl->buf + used, n);
        r->body_len = n;
        used += n;
    } else { /* delimited by close */
        int k;
        while ((k = client_fill(cl)) > 0) {
        }
        if (k < 0)
            return -1;
        r->body_len = cl->len - used;
        if (r->body_len > sizeof r->body)
            return -1;
        memcpy(r->body, cl->buf + used, r->body_len);
        used = cl->len;
    }
    memmove(cl->buf, cl->buf + used, cl->len - used);
    cl->len -= used;
    return 0;
}

/* 1 when the server closes the connection within ms (nothing else read). */
static int client_closed_within(client *cl, int ms)
{
    uint64_t until = now_ms() + (uint64_t)ms;
    for (;;) {
        struct pollfd p = {cl->fd, POLLIN, 0};
        int left = (int)(until - now_ms());
        char tmp[256];
        ssize_t k;
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return 0;
        k = recv(cl->fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno == ECONNRESET))
            return 1;
        if (k > 0)
            return 0;
    }
}

static int body_is(const response *r, const char *s)
{
    return r->body_len == strlen(s) && memcmp(r->body, s, r->body_len) == 0;
}

/* The error body is {"error":{"message":..,"type":..,"param":null,"code":null}}. */
static int is_openai_error(const response *r, const char *type)
{
    cb_json_tok toks[16];
    int n = cb_json_parse(r->body, r->body_len, toks, 16, NULL), e, m, t, p, c;
    if (n <= 0 || strncmp(head_value(r, "content-type") ? head_value(r, "content-type") : "",
                          "application/json", 16) != 0)
        return 0;
    e = cb_json_find(r->body, toks, 0, "error");
    if (e < 0)
        return 0;
    m = cb_json_find(r->body, toks, e, "message");
    t = cb_json_find(r->body, toks, e, "type");
    p = cb_json_find(r->body, toks, e, "param");
    c = cb_json_find(r->body, toks, e, "code");
    return m > 0 && toks[m].type == CB_JSON_STRING && toks[m].end > toks[m].start && t > 0 &&
           cb_json_str_eq(r->body, &toks[t], type) && p > 0 && toks[p].type == CB_JSON_NULL &&
           c > 0 && toks[c].type == CB_JSON_NULL;
}

static client cl_a, cl_b, cl_c, cl_s; /* big buffers: keep them off the stack */
static response resp;

static void test_loop_basic(const echo_app *app, int port)
{
    static const char *pieces[] = {"PO", "ST /echo HT", "TP/1.1\r\nHost: x\r\nContent-Le",
                                   "ngth: 11\r\n\r", "\nhello", " world"};
    size_t k;

    CHECK(client_open(&cl_a, port) == 0);
    for (k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        client_sends(&cl_a, pieces[k]);
        sleep_ms(10);
    }
    CHECK(client_response(&cl_a, &resp, 0) == 0);
    CHECK(resp.status == 200 && body_is(&resp, "hello world"));
    CHECK(head_value(&resp, "x-echo") != NULL && strncmp(head_value(&resp, "x-echo"), "body\r\n", 6) == 0);
    CHECK(strstr(resp.head, "Connection: keep-alive") != NULL);

    /* Same connection again (keep-alive), then two pipelined requests. */
    client_sends(&cl_a, "GET /ping HTTP/1.1\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 200 && body_is(&resp, "path=/ping"));
    client_sends(&cl_a, "GET /one HTTP/1.1\r\n\r\nPOST /two HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                        "HEAD /three HTTP/1.1\r\n\r\nGET /four HTTP/1.1\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && body_is(&resp, "path=/one"));
    CHECK(client_response(&cl_a, &resp, 0) == 0 && body_is(&resp, "abc"));
    CHECK(client_response(&cl_a, &resp, 1) == 0 && resp.status == 200 &&
          head_value(&resp, "content-length") != NULL);
    CHECK(client_response(&cl_a, &resp, 0) == 0 && body_is(&resp, "path=/four"));

    /* Streaming with chunked encoding, and the connection stays usable. */
    client_sends(&cl_a, "GET /stream HTTP/1.1\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 200 && resp.chunked);
    CHECK(body_is(&resp, "data: one\n\ndata: two\n\ndata: [DONE]\n\n"));
    CHECK(strstr(resp.head, "Content-Type: text/event-stream") != NULL);
    /* The head waited in the buffer for the first event, then both left. */
    CHECK(app->space_after_begin < app->space_after_write);

    /* Answer given in a later round. */
    client_sends(&cl_a, "POST /later HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && body_is(&resp, "later"));

    /* Application error, still keep-alive. */
    client_sends(&cl_a, "GET /bad-json HTTP/1.1\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 400 &&
          is_openai_error(&resp, "invalid_request_error"));
    client_sends(&cl_a, "GET /after HTTP/1.1\r\nConnection: close\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && body_is(&resp, "path=/after"));
    CHECK(strstr(resp.head, "Connection: close") != NULL);
    CHECK(client_closed_within(&cl_a, 1000));
    client_close(&cl_a);

    /* HTTP/1.0 stream: delimited by closing. */
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET /stream HTTP/1.0\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && !resp.chunked &&
          body_is(&resp, "data: one\n\ndata: two\n\ndata: [DONE]\n\n"));
    client_close(&cl_a);
}

static void test_loop_large_body(int port)
{
    static char body[6000];
    char head[256];
    size_t k;
    for (k = 0; k < sizeof body; k++)
        body[k] = (char)('a' + k % 26);
    snprintf(head, sizeof head,
             "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\nExpect: 100-continue\r\n\r\n", sizeof body);

    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, head);
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 100);
    client_send(&cl_a, body, 1000);
    sleep_ms(10);
    client_send(&cl_a, body + 1000, sizeof body - 1000);
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 200 &&
          resp.body_len == sizeof body && memcmp(resp.body, body, sizeof body) == 0);
    /* The large buffer went back: a second one works too, on the same connection. */
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", sizeof body);
    client_sends(&cl_a, head);
    client_send(&cl_a, body, sizeof body);
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 200 && resp.body_len == sizeof body);
    client_close(&cl_a);
}

static void test_loop_errors(int port)
{
    static char junk[1500];
    char big[1400];
    memset(junk, 'x', sizeof junk);

    /* Over max_body_size: 413, then the connection closes. */
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "POST /echo HTTP/1.1\r\nContent-Length: 100000\r\n\r\n");
    client_send(&cl_a, junk, sizeof junk);
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 413);
    CHECK(is_openai_error(&resp, "invalid_request_error"));
    CHECK(strstr(resp.head, "Connection: close") != NULL);
    CHECK(client_closed_within(&cl_a, 2000));
    client_close(&cl_a);

    /* Malformed: 400. */
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET / HTTP/x.9\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 400 &&
          is_openai_error(&resp, "invalid_request_error") &&
          strstr(resp.body, "malformed HTTP request: the HTTP version is not") != NULL);
    client_close(&cl_a);

    /* Another HTTP version: 505 saying so. */
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET / HTTP/9.9\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 505 &&
          is_openai_error(&resp, "server_error") && strstr(resp.body, "HTTP version not supported") != NULL);
    client_close(&cl_a);

    /* More header fields than the parser holds: 431 naming the count. */
    CHECK(client_open(&cl_a, port) == 0);
    {
        char many[2048] = "GET / HTTP/1.1\r\n";
        int k;
        for (k = 0; k < CB_HTTP_MAX_HEADERS + 1; k++)
            strcat(many, "X: y\r\n");
        strcat(many, "\r\n");
        client_sends(&cl_a, many);
    }
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 431 &&
          strstr(resp.body, "more than 32 header fields") != NULL);
    client_close(&cl_a);

    /* Head over max_header_size (1024 here): 431. */
    CHECK(client_open(&cl_a, port) == 0);
    memset(big, 'a', sizeof big);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    client_send(&cl_a, big, sizeof big);
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 431 &&
          is_openai_error(&resp, "invalid_request_error") &&
          strstr(resp.body, "over the limit of 1024 bytes") != NULL);
    client_close(&cl_a);

    /* Chunked request bodies are refused with 411. */
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && resp.status == 411 &&
          is_openai_error(&resp, "invalid_request_error"));
    client_close(&cl_a);

    /* Closed by the application inside the callback: no answer. */
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET /close HTTP/1.1\r\n\r\n");
    CHECK(client_closed_within(&cl_a, 1000));
    client_close(&cl_a);
}

static void test_loop_slow_client(int port)
{
    const char *slow = "GET /slow HTTP/1.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    uint64_t t0, dropped_after = 0;
    size_t k;
    int served = 0, dropped = 0, timed_out = 0;

    CHECK(client_open(&cl_s, port) == 0);
    t0 = now_ms();
    for (k = 0; slow[k] != '\0'; k++) {
        struct pollfd p = {cl_s.fd, POLLIN, 0};
        if (send(cl_s.fd, slow + k, 1, MSG_NOSIGNAL) != 1 || poll(&p, 1, 0) == 1) {
            /* Cut off mid-head: told so with 408, then closed. */
            dropped_after = now_ms() - t0;
            timed_out = client_response(&cl_s, &resp, 0) == 0 && resp.status == 408 &&
                        is_openai_error(&resp, "invalid_request_error") &&
                        strncmp(head_value(&resp, "connection"), "close", 5) == 0;
            dropped = client_closed_within(&cl_s, 1500);
            break;
        }
        if (k == 3) {
            /* Another client is served while the slow one holds its slot. */
            CHECK(client_open(&cl_b, port) == 0);
            client_sends(&cl_b, "GET /fast HTTP/1.1\r\n\r\n");
            served = client_response(&cl_b, &resp, 0) == 0 && body_is(&resp, "path=/fast");
            client_close(&cl_b);
        }
        sleep_ms(25);
    }
    if (!dropped && client_closed_within(&cl_s, 1000)) {
        dropped = 1;
        dropped_after = now_ms() - t0;
    }
    CHECK(served);
    CHECK(timed_out);
    CHECK(dropped);
    CHECK(dropped_after >= 250 && dropped_after < 1500);
    if (!(dropped_after >= 250 && dropped_after < 1500))
        fprintf(stderr, "  slow client dropped after %llu ms\n", (unsigned long long)dropped_after);
    client_close(&cl_s);

    /* A client that connects and sends nothing is dropped too, silently. */
    CHECK(client_open(&cl_s, port) == 0);
    CHECK(client_closed_within(&cl_s, 1500));
    client_close(&cl_s);

    /* A body that stops arriving: 408, then closed. */
    CHECK(client_open(&cl_s, port) == 0);
    client_sends(&cl_s, "POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\n1234");
    CHECK(client_response(&cl_s, &resp, 0) == 0 && resp.status == 408 &&
          strstr(resp.body, "300 ms") != NULL);
    CHECK(client_closed_within(&cl_s, 1500));
    client_close(&cl_s);
}

/* Reads a chunked flood of `total` bytes, checking every byte. */
static int client_check_flood(client *cl, size_t total)
{
    response head;
    size_t got = 0, used = 0;
    const char *end;
    int ok = 1;

    while ((end = find_bytes(cl->buf, cl->len, "\r\n\r\n")) == NULL) {
        if (client_fill(cl) <= 0)
            return 0;
    }
    memset(&head, 0, sizeof head);
    if (strncmp(cl->buf, "HTTP/1.1 200", 12) != 0 || find_bytes(cl->buf, (size_t)(end - cl->buf),
                                                                "Transfer-Encoding: chunked") == NULL)
        return 0;
    used = (size_t)(end - cl->buf) + 4;
    for (;;) {
        const char *eol;
        size_t size, k;
        /* Keep the buffer small: drop what was checked. */
        memmove(cl->buf, cl->buf + used, cl->len - used);
        cl->len -= used;
        used = 0;
        while ((eol = find_bytes(cl->buf, cl->len, "\r\n")) == NULL) {
            if (client_fill(cl) <= 0)
                return 0;
        }
        size = strtoul(cl->buf, NULL, 16);
        used = (size_t)(eol - cl->buf) + 2;
        if (used + size + 2 > sizeof cl->buf)
            return 0;
        while (cl->len < used + size + 2) {
            if (client_fill(cl) <= 0)
                return 0;
        }
        for (k = 0; k < size; k++)
            ok &= cl->buf[used + k] == flood_byte(got + k);
        got += size;
        used += size + 2;
        if (size == 0)
            break;
    }
    memmove(cl->buf, cl->buf + used, cl->len - used);
    cl->len -= used;
    return ok && got == total;
}

static void test_loop_backpressure(echo_app *app, int port)
{
    uint64_t until;

    /* A reader that starts late: the server meets EAGAIN and a full
     * buffer, waits for writability, and every byte still arrives. */
    atomic_store(&app->flood_full, 0);
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET /flood?n=6000000 HTTP/1.1\r\n\r\n");
    sleep_ms(300);
    CHECK(client_check_flood(&cl_a, 6000000));
    CHECK(atomic_load(&app->flood_full) > 0);
    client_sends(&cl_a, "GET /again HTTP/1.1\r\n\r\n");
    CHECK(client_response(&cl_a, &resp, 0) == 0 && body_is(&resp, "path=/again"));
    client_close(&cl_a);

    /* A reader that never reads: dropped after write_timeout_ms (1 s). */
    atomic_store(&app->flood_closed, 0);
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET /flood?n=1000000000 HTTP/1.1\r\n\r\n");
    until = now_ms() + 8000;
    while (!atomic_load(&app->flood_closed) && now_ms() < until)
        sleep_ms(10);
    CHECK(atomic_load(&app->flood_closed) == 1);
    client_close(&cl_a);
}

static void test_loop_disconnect(echo_app *app, int port)
{
    uint64_t until;
    atomic_store(&app->never_closed, 0);
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "POST /never HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
    until = now_ms() + 2000;
    while (atomic_load(&app->never_id) == 0 && now_ms() < until)
        sleep_ms(5);
    CHECK(atomic_load(&app->never_id) != 0);
    client_close(&cl_a);
    while (!atomic_load(&app->never_closed) && now_ms() < until)
        sleep_ms(5);
    CHECK(atomic_load(&app->never_closed));
}

static void poll_rounds(cb_netloop *loop, int n)
{
    int i;
    for (i = 0; i < n; i++)
        cb_netloop_poll(loop, 10);
}

/* One slot and one spare entry, polled from this thread. A full table
 * gives a quiet connection's slot to a new client; with every slot busy,
 * the spare entry serves the spare path (health) and answers anything else
 * 503 with Retry-After; with the spare taken too, 503 at once. */
static void test_loop_table_full(void)
{
    cb_netloop_config cfg;
    cb_netloop *loop;
    echo_app app;
    char err[256];
    int i, port;

    memset(&app, 0, sizeof app);
    cb_netloop_config_init(&cfg);
    cfg.port = 0;
    cfg.max_conns = 1;
    cfg.spare_conns = 1;
    cfg.spare_path = "/health";
    cfg.app = &app;
    cfg.on_request = echo_on_request;
    cfg.on_close = echo_on_close;
    loop = cb_netloop_create(&cfg, err, sizeof err);
    CHECK(loop != NULL);
    if (loop == NULL)
        return;
    port = cb_netloop_port(loop);

    /* A is busy: half its request head is in. */
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET /x HTTP/1.1\r\n");
    poll_rounds(loop, 5);
    CHECK(cb_netloop_active(loop) == 1);

    /* B lands on the spare entry: not the spare path, so 503 and closed. */
    CHECK(client_open(&cl_b, port) == 0);
    client_sends(&cl_b, "GET /other HTTP/1.1\r\n\r\n");
    poll_rounds(loop, 5);
    CHECK(client_response(&cl_b, &resp, 0) == 0 && resp.status == 503 &&
          is_openai_error(&resp, "server_error") && head_value(&resp, "retry-after") != NULL &&
          strncmp(head_value(&resp, "connection"), "close", 5) == 0);
    poll_rounds(loop, 5);
    CHECK(client_closed_within(&cl_b, 500));
    client_close(&cl_b);
    poll_rounds(loop, 5);

    /* The spare path is served on the spare entry (GET and HEAD alike). */
    CHECK(client_open(&cl_b, port) == 0);
    client_sends(&cl_b, "GET /health HTTP/1.1\r\n\r\n");
    poll_rounds(loop, 5);
    CHECK(client_response(&cl_b, &resp, 0) == 0 && resp.status == 200 && body_is(&resp, "path=/health") &&
          strncmp(head_value(&resp, "connection"), "close", 5) == 0);
    client_close(&cl_b);
    poll_rounds(loop, 5);
    CHECK(client_open(&cl_b, port) == 0);
    client_sends(&cl_b, "HEAD /health HTTP/1.1\r\n\r\n");
    poll_rounds(loop, 5);
    CHECK(client_response(&cl_b, &resp, 1) == 0 && resp.status == 200);
    client_close(&cl_b);
    poll_rounds(loop, 5);

    /* Slot and spare both taken (B is busy too): 503 at once. */
    CHECK(client_open(&cl_b, port) == 0);
    client_sends(&cl_b, "GET /y HTTP/1.1\r\n");
    poll_rounds(loop, 5);
    CHECK(cb_netloop_active(loop) == 2);
    CHECK(client_open(&cl_c, port) == 0);
    poll_rounds(loop, 5);
    CHECK(client_response(&cl_c, &resp, 0) == 0 && resp.status == 503 &&
          is_openai_error(&resp, "server_error"));
    client_close(&cl_c);
    client_close(&cl_b);
    poll_rounds(loop, 5);

    /* A's request completes: A now idles, kept alive. */
    client_sends(&cl_a, "\r\n");
    poll_rounds(loop, 5);
    CHECK(client_response(&cl_a, &resp, 0) == 0 && body_is(&resp, "path=/x"));
    CHECK(cb_netloop_active(loop) == 1);

    /* C takes A's slot: A is closed, C is served on a regular slot and
     * kept alive. */
    CHECK(client_open(&cl_c, port) == 0);
    client_sends(&cl_c, "GET /z HTTP/1.1\r\n\r\n");
    poll_rounds(loop, 5);
    CHECK(client_closed_within(&cl_a, 500));
    CHECK(client_response(&cl_c, &resp, 0) == 0 && body_is(&resp, "path=/z") &&
          strncmp(head_value(&resp, "connection"), "keep-alive", 10) == 0);
    client_close(&cl_a);
    client_close(&cl_c);
    for (i = 0; i < 20 && cb_netloop_active(loop) > 0; i++)
        cb_netloop_poll(loop, 10);
    CHECK(cb_netloop_active(loop) == 0);
    cb_netloop_destroy(loop);

    /* A new connection's slot is not given away before it had a second
     * to send its request; after that it is. */
    cfg.spare_conns = 1;
    loop = cb_netloop_create(&cfg, err, sizeof err);
    CHECK(loop != NULL);
    if (loop == NULL)
        return;
    port = cb_netloop_port(loop);
    CHECK(client_open(&cl_a, port) == 0);
    poll_rounds(loop, 5);
    CHECK(client_open(&cl_b, port) == 0);
    client_sends(&cl_b, "GET /x HTTP/1.1\r\n\r\n");
    poll_rounds(loop, 5);
    CHECK(client_response(&cl_b, &resp, 0) == 0 && resp.status == 503);
    client_close(&cl_b);
    poll_rounds(loop, 110); /* > 1 s */
    CHECK(client_open(&cl_c, port) == 0);
    client_sends(&cl_c, "GET /x HTTP/1.1\r\n\r\n");
    poll_rounds(loop, 5);
    CHECK(client_closed_within(&cl_a, 500));
    CHECK(client_response(&cl_c, &resp, 0) == 0 && body_is(&resp, "path=/x"));
    client_close(&cl_a);
    client_close(&cl_c);
    cb_netloop_destroy(loop);

    /* No spare entries: a full, busy table answers 503 at once. */
    cfg.spare_conns = 0;
    loop = cb_netloop_create(&cfg, err, sizeof err);
    CHECK(loop != NULL);
    if (loop == NULL)
        return;
    port = cb_netloop_port(loop);
    CHECK(client_open(&cl_a, port) == 0);
    client_sends(&cl_a, "GET /x HTTP/1.1\r\n");
    poll_rounds(loop, 5);
    CHECK(client_open(&cl_b, port) == 0);
    poll_rounds(loop, 5);
    CHECK(client_response(&cl_b, &resp, 0) == 0 && resp.status == 503 &&
          is_openai_error(&resp, "server_error"));
    client_close(&cl_b);
    client_close(&cl_a);
    cb_netloop_destroy(loop);
}

static void test_loop(void)
{
    cb_netloop_config cfg;
    echo_app app;
    pthread_t th;
    char err[256];
    int port, i;

    memset(&app, 0, sizeof app);
    cb_netloop_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.max_conns = 8;
    cfg.read_buf_size = 2048;
    cfg.write_buf_size = 16 * 1024;
    cfg.max_header_size = 1024;
    cfg.max_body_size = 8192;
    cfg.large_body_buffers = 1;
    cfg.request_timeout_ms = 300;
    cfg.idle_timeout_ms = 1000;
    cfg.write_timeout_ms = 1000;
    cfg.verbose = getenv("TEST_NET_VERBOSE") != NULL;
    cfg.app = &app;
    cfg.on_request = echo_on_request;
    cfg.on_close = echo_on_close;

    {
        cb_netloop_config bad = cfg;
        bad.max_header_size = 4096; /* over the read buffer */
        CHECK(cb_netloop_create(&bad, err, sizeof err) == NULL && err[0] != '\0');
        bad = cfg;
        bad.host = "not-an-ip";
        CHECK(cb_netloop_create(&bad, err, sizeof err) == NULL && strstr(err, "not an IP") != NULL);
    }

    app.loop = cb_netloop_create(&cfg, err, sizeof err);
    CHECK(app.loop != NULL);
    if (app.loop == NULL) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    port = cb_netloop_port(app.loop);
    CHECK(port > 0);
    pthread_create(&th, NULL, loop_thread, &app);

    test_loop_basic(&app, port);
    test_loop_large_body(port);
    test_loop_errors(port);
    test_loop_slow_client(port);
    test_loop_disconnect(&app, port);
    test_loop_backpressure(&app, port);

    atomic_store(&app.stop, 1);
    pthread_join(th, NULL);
    /* Every client is gone: after a few rounds no slot may stay taken. */
    for (i = 0; i < 200 && cb_netloop_active(app.loop) > 0; i++)
        cb_netloop_poll(app.loop, 10);
    CHECK(cb_netloop_active(app.loop) == 0);
    CHECK(atomic_load(&app.requests) > 10);
    cb_netloop_destroy(app.loop);

    test_loop_table_full();
}

/* ================= net.h directly ================= */

static void test_net_listen(void)
{
    cb_sock s;
    char err[256];
    CHECK(cb_net_init() == 0);
    CHECK(cb_net_listen("localhost", 0, 16, &s, err, sizeof err) == 0);
    CHECK(cb_net_local_port(s) > 0);
    cb_net_close(s);
    /* IPv6 may be absent on a build machine: only require a clean answer. */
    if (cb_net_listen("[::1]", 0, 16, &s, err, sizeof err) == 0) {
        CHECK(cb_net_local_port(s) > 0);
        cb_net_close(s);
    }
    CHECK(cb_net_listen("example.com", 0, 16, &s, err, sizeof err) == -1);
    CHECK(cb_net_listen("127.0.0.1", 70000, 16, &s, err, sizeof err) == -1);
}

int main(void)
{
    test_http_good();
    test_http_incremental();
    test_http_bad();
    test_http_limits();
    test_json_cases();
    test_json_depth();
    test_json_tokens();
    test_json_unescape();
    test_json_writer();
    test_net_listen();
    test_loop();
    free(parsed_copy);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
