/* Incremental, zero-copy parser for an HTTP/1.x request head.
 *
 * The parser keeps no state between calls: when cb_http_parse() answers
 * CB_HTTP_INCOMPLETE, call it again with the same buffer once more bytes have
 * arrived; it re-reads from the start (the head is at most a few KiB). It
 * reports a malformed head as soon as the first bad byte is in the buffer.
 * Every pointer it stores points into the caller's buffer, so a request is
 * only valid while that buffer is unchanged. Nothing is allocated. */
#ifndef CB_HTTP_H
#define CB_HTTP_H

#include <stddef.h>
#include <stdint.h>

#define CB_HTTP_MAX_HEADERS 32
#define CB_HTTP_MAX_HEADER_BYTES (16 * 1024)

/* Answers of cb_http_parse() besides the head length (> 0). */
#define CB_HTTP_BAD (-1)        /* malformed request: answer 400 */
#define CB_HTTP_INCOMPLETE (-2) /* the head is not all there yet */
#define CB_HTTP_TOO_LARGE (-3)  /* head over the byte limit or more than
                                   CB_HTTP_MAX_HEADERS fields: answer 431 */
#define CB_HTTP_VERSION (-4)    /* a well-formed request line of an HTTP
                                   version other than 1.x: answer 505 */

typedef struct {
    const char *name; /* as sent; compare with cb_http_find_header() */
    size_t name_len;
    const char *value; /* leading and trailing blanks removed */
    size_t value_len;
} cb_http_header;

typedef struct {
    const char *method;
    size_t method_len;
    const char *path; /* request target, "?query" included; an absolute-form
                         target ("http://host/p") is reduced to its path */
    size_t path_len;
    int minor_version; /* 0 or 1 (HTTP/1.2 and later 1.x count as 1.1) */
    cb_http_header headers[CB_HTTP_MAX_HEADERS];
    size_t n_headers;

    /* Settled from the headers while parsing. */
    int64_t content_length;    /* -1 when absent */
    int keep_alive;            /* 1.1: unless "Connection: close"; 1.0: only with
                                  "Connection: keep-alive" */
    int has_transfer_encoding; /* any Transfer-Encoding field */
    int chunked;               /* Transfer-Encoding lists "chunked" */
    int expect_continue;       /* "Expect: 100-continue" */
    const char *authorization; /* value of Authorization, NULL when absent */
    size_t authorization_len;
    const char *error;         /* CB_HTTP_BAD: what is wrong, for the 400 */
} cb_http_request;

/* Parses the request head at the start of buf with the default limit of
 * CB_HTTP_MAX_HEADER_BYTES. Returns the head length in bytes (the body, if
 * any, starts at buf + result), CB_HTTP_INCOMPLETE, CB_HTTP_BAD or
 * CB_HTTP_TOO_LARGE or CB_HTTP_VERSION. HTTP/1.x with x > 1 is read as
 * HTTP/1.1. Rejected as bad: a request line that is not
 * "METHOD SP target SP HTTP/d.d CRLF", control characters, bare LF,
 * whitespace before a colon, folded lines, a Content-Length that is not all
 * digits or overflows or differs between two fields, two Authorization
 * fields. Empty lines before the request line are skipped (RFC 9112 2.2). */
int cb_http_parse(const char *buf, size_t len, cb_http_request *req);

/* The same with the caller's limit on the head length (CRLFCRLF included). */
int cb_http_parse_limit(const char *buf, size_t len, size_t max_head_bytes,
                        cb_http_request *req);

/* First header whose name equals `name` ignoring ASCII case, or NULL. */
const cb_http_header *cb_http_find_header(const cb_http_request *req,
                                          const char *name);

/* 1 when the method is exactly `method` (methods are case-sensitive). */
int cb_http_method_is(const cb_http_request *req, const char *method);

/* 1 when the target without its "?query" is exactly `path`. */
int cb_http_path_is(const cb_http_request *req, const char *path);

/* Reason phrase of a status code ("Not Found"); "Unknown" for others. */
const char *cb_http_status_text(int code);

#endif
