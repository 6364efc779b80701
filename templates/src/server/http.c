/* HTTP/1.x request-head parser: see http.h for the contract. Grammar from
 * RFC 9110 (field syntax, tokens) and RFC 9112 (request line, framing). */
#include "http.h"

#include <limits.h>
#include <string.h>

/* tchar from RFC 9110 5.6.2: the bytes allowed in methods and field names. */
static int is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return 1;
    switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*':
    case '+': case '-': case '.': case '^': case '_': case '`': case '|': case '~':
        return 1;
    default:
        return 0;
    }
}

/* Request targets are visible ASCII; anything else must be percent-encoded. */
static int is_target_char(unsigned char c) { return c > 0x20 && c < 0x7f; }

/* Field values: blanks, visible ASCII and obs-text; no other control byte. */
static int is_value_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static unsigned char ascii_lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

/* s[0..n) equals the NUL-terminated lower-case `lit`, ignoring ASCII case. */
static int equals_nocase(const char *s, size_t n, const char *lit)
{
    size_t i;
    for (i = 0; i < n; i++) {
        if (lit[i] == '\0' || ascii_lower((unsigned char)s[i]) != (unsigned char)lit[i])
            return 0;
    }
    return lit[i] == '\0';
}

/* 1 when the comma-separated list s[0..n) holds `token` (lower case). */
static int list_has_token(const char *s, size_t n, const char *token)
{
    size_t i = 0;
    while (i < n) {
        size_t start, end;
        while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == ','))
            i++;
        start = i;
        while (i < n && s[i] != ',')
            i++;
        end = i;
        while (end > start && (s[end - 1] == ' ' || s[end - 1] == '\t'))
            end--;
        if (end > start && equals_nocase(s + start, end - start, token))
            return 1;
    }
    return 0;
}

/* Content-Length is 1*DIGIT (RFC 9110 8.6); a sign, blank or list is bad. */
static int parse_content_length(const char *s, size_t n, int64_t *out)
{
    int64_t v = 0;
    size_t i;
    if (n == 0)
        return -1;
    for (i = 0; i < n; i++) {
        int d;
        if (s[i] < '0' || s[i] > '9')
            return -1;
        d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* A malformed head: the reason goes to req->error. */
static int bad(cb_http_request *req, const char *why)
{
    req->error = why;
    return CB_HTTP_BAD;
}

/* Folds one field into the request's convenience members. */
static int note_header(cb_http_request *req, const cb_http_header *h,
                       int *conn_close, int *conn_keep)
{
    const char *v = h->value;
    size_t vn = h->value_len;

    if (equals_nocase(h->name, h->name_len, "content-length")) {
        int64_t cl;
        if (parse_content_length(v, vn, &cl) != 0)
            return bad(req, "Content-Length is not a decimal number of bytes (or overflows)");
        /* Differing lengths are the classic request-smuggling vector. */
        if (req->content_length >= 0 && req->content_length != cl)
            return bad(req, "two different Content-Length fields");
        req->content_length = cl;
    } else if (equals_nocase(h->name, h->name_len, "transfer-encoding")) {
        req->has_transfer_encoding = 1;
        if (list_has_token(v, vn, "chunked"))
            req->chunked = 1;
    } else if (equals_nocase(h->name, h->name_len, "connection")) {
        if (list_has_token(v, vn, "close"))
            *conn_close = 1;
        if (list_has_token(v, vn, "keep-alive"))
            *conn_keep = 1;
    } else if (equals_nocase(h->name, h->name_len, "authorization")) {
        if (req->authorization != NULL)
            return bad(req, "two Authorization fields");
        req->authorization = v;
        req->authorization_len = vn;
    } else if (equals_nocase(h->name, h->name_len, "expect")) {
        if (equals_nocase(v, vn, "100-continue"))
            req->expect_continue = 1;
    }
    return 0;
}

/* An absolute-form target ("http://host:port/path?q", RFC 9112 3.2.2),
 * which proxies send and servers must accept, is reduced to its path and
 * query, so routing sees the same target as in origin form. */
static void origin_form(cb_http_request *req)
{
    static const char root[] = "/";
    const char *t = req->path, *end = req->path + req->path_len, *p;
    size_t skip;
    if (req->path_len >= 7 && equals_nocase(t, 7, "http://"))
        skip = 7;
    else if (req->path_len >= 8 && equals_nocase(t, 8, "https://"))
        skip = 8;
    else
        return;
    for (p = t + skip; p < end && *p != '/' && *p != '?'; p++) {
    }
    if (p < end && *p == '/') {
        req->path = p;
        req->path_len = (size_t)(end - p);
    } else { /* an empty path is "/" (the query, if any, is dropped) */
        req->path = root;
        req->path_len = 1;
    }
}

/* Consumes CRLF at *p; `what` names the line for the error. */
static int take_crlf(cb_http_request *req, const char **p, const char *end, const char *what)
{
    if (*p == end)
        return CB_HTTP_INCOMPLETE;
    if (**p == '\n')
        return bad(req, "a line ends in a bare LF, not CRLF");
    if (**p != '\r')
        return bad(req, what);
    if (*p + 1 == end)
        return CB_HTTP_INCOMPLETE;
    if ((*p)[1] != '\n')
        return bad(req, "a CR not followed by LF");
    *p += 2;
    return 0;
}

/* Parses buf[0..len); never reads past len. Returns the head length,
 * CB_HTTP_BAD, CB_HTTP_TOO_LARGE (too many fields) or CB_HTTP_INCOMPLETE. */
static int parse_head(const char *buf, size_t len, cb_http_request *req)
{
    static const char version_prefix[] = "HTTP/";
    const char *p = buf, *end = buf + len, *start;
    int conn_close = 0, conn_keep = 0, major, r;
    size_t i;

    /* Empty lines before the request line (left by sloppy clients after a
     * body) are skipped, as RFC 9112 2.2 asks. */
    while (p < end && *p == '\r') {
        if ((r = take_crlf(req, &p, end, "a bare CR before the request line")) != 0)
            return r;
    }

    start = p;
    while (p < end && is_tchar((unsigned char)*p))
        p++;
    if (p == end)
        return CB_HTTP_INCOMPLETE;
    if (p == start || *p != ' ')
        return bad(req, "the request line is not 'METHOD SP target SP HTTP/1.1' (the method is not a token "
                        "followed by one space)");
    req->method = start;
    req->method_len = (size_t)(p - start);
    p++;

    start = p;
    while (p < end && is_target_char((unsigned char)*p))
        p++;
    if (p == end)
        return CB_HTTP_INCOMPLETE;
    if (p == start)
        return bad(req, "the request line has more than one space after the method");
    if (*p != ' ')
        return bad(req, "the request target holds a control or non-ASCII byte (percent-encode it)");
    req->path = start;
    req->path_len = (size_t)(p - start);
    origin_form(req);
    p++;

    /* HTTP-version is "HTTP/" DIGIT "." DIGIT (RFC 9112 2.3). */
    for (i = 0; i < sizeof version_prefix - 1; i++, p++) {
        if (p == end)
            return CB_HTTP_INCOMPLETE;
        if (*p != version_prefix[i])
            return bad(req, "the request line does not end in an HTTP version ('HTTP/1.1')");
    }
    for (i = 0; i < 3; i++) {
        if (p + i == end)
            return CB_HTTP_INCOMPLETE;
        if (i == 1 ? p[i] != '.' : (p[i] < '0' || p[i] > '9'))
            return bad(req, "the HTTP version is not 'HTTP/' digit '.' digit");
    }
    major = p[0] - '0';
    /* A later 1.x is served as 1.1, the highest this server implements
     * (RFC 9110 2.5). */
    req->minor_version = p[2] > '1' ? 1 : p[2] - '0';
    p += 3;
    if ((r = take_crlf(req, &p, end, "the request line does not end in CRLF after the version")) != 0)
        return r;
    if (major != 1)
        return CB_HTTP_VERSION;

    for (;;) {
        cb_http_header *h;
        const char *value_end;

        if (p == end)
            return CB_HTTP_INCOMPLETE;
        if (*p == '\r') {
            if ((r = take_crlf(req, &p, end, "a bare CR")) != 0)
                return r;
            req->keep_alive = conn_close ? 0 : (req->minor_version == 1 || conn_keep);
            return (int)(p - buf);
        }
        if (req->n_headers == CB_HTTP_MAX_HEADERS)
            return CB_HTTP_TOO_LARGE;
        h = &req->headers[req->n_headers];

        /* A field line starting with a blank (obs-fold) or having a blank
         * before the colon fails here: both are rejected by RFC 9112 5. */
        start = p;
        while (p < end && is_tchar((unsigned char)*p))
            p++;
        if (p == end)
            return CB_HTTP_INCOMPLETE;
        if (p == start)
            return bad(req, *p == ' ' || *p == '\t' ? "a header line starts with a blank (obsolete line folding)"
                           : *p == '\n'              ? "a line ends in a bare LF, not CRLF"
                                                     : "a header line has no name before its colon");
        if (*p != ':')
            return bad(req, *p == ' ' || *p == '\t' ? "a blank between a header name and its colon"
                           : *p == '\r' || *p == '\n' ? "a header line without a colon"
                                                     : "a header name holds a character not allowed in a token");
        h->name = start;
        h->name_len = (size_t)(p - start);
        p++;

        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        start = p;
        while (p < end && is_value_char((unsigned char)*p))
            p++;
        if (p == end)
            return CB_HTTP_INCOMPLETE;
        value_end = p;
        if ((r = take_crlf(req, &p, end, "a header value holds a control character")) != 0)
            return r;
        while (value_end > start && (value_end[-1] == ' ' || value_end[-1] == '\t'))
            value_end--;
        h->value = start;
        h->value_len = (size_t)(value_end - start);
        req->n_headers++;

        if ((r = note_header(req, h, &conn_close, &conn_keep)) != 0)
            return r;
    }
}

int cb_http_parse_limit(const char *buf, size_t len, size_t max_head_bytes,
                        cb_http_request *req)
{
    size_t window;
    int r;

    memset(req, 0, sizeof *req);
    req->content_length = -1;
    if (max_head_bytes > INT_MAX)
        max_head_bytes = INT_MAX;
    /* Parsing only the first max_head_bytes both bounds the work and makes
     * "head not finished within the limit" a plain INCOMPLETE below. */
    window = len < max_head_bytes ? len : max_head_bytes;
    r = parse_head(buf, window, req);
    if (r == CB_HTTP_INCOMPLETE && len >= max_head_bytes)
        return CB_HTTP_TOO_LARGE;
    return r;
}

int cb_http_parse(const char *buf, size_t len, cb_http_request *req)
{
    return cb_http_parse_limit(buf, len, CB_HTTP_MAX_HEADER_BYTES, req);
}

const cb_http_header *cb_http_find_header(const cb_http_request *req, const char *name)
{
    size_t i, n = strlen(name);
    for (i = 0; i < req->n_headers; i++) {
        const cb_http_header *h = &req->headers[i];
        size_t k;
        if (h->name_len != n)
            continue;
        for (k = 0; k < n; k++) {
            if (ascii_lower((unsigned char)h->name[k]) != ascii_lower((unsigned char)name[k]))
                break;
        }
        if (k == n)
            return h;
    }
    return NULL;
}

int cb_http_method_is(const cb_http_request *req, const char *method)
{
    size_t n = strlen(method);
    return req->method_len == n && memcmp(req->method, method, n) == 0;
}

int cb_http_path_is(const cb_http_request *req, const char *path)
{
    size_t n = strlen(path), plen = req->path_len;
    const char *q = memchr(req->path, '?', plen);
    if (q != NULL)
        plen = (size_t)(q - req->path);
    return plen == n && memcmp(req->path, path, n) == 0;
}

const char *cb_http_status_text(int code)
{
    switch (code) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
