/* CORS (--cors-origin), so a web page on another origin may call the API
 * from a browser. Off by default: without the flag no Access-Control line
 * is sent and OPTIONS gets 405 like any other method an endpoint lacks.
 * With it, every answer to a request whose Origin is allowed (any, for
 * "*") says so, streams and errors included; a preflight OPTIONS on a
 * known path is answered 204 with the methods and headers allowed, before
 * any key is checked (browsers send preflights without credentials). */
#include <stdio.h>
#include <string.h>

#include "app_internal.h"

static int origin_allowed(const cb_app *a, const cb_http_header *origin, int *any) {
    *any = 0;
    for (int i = 0; i < a->n_cors_origins; i++) {
        const char *o = a->cors_origins[i];
        if (!strcmp(o, "*")) {
            *any = 1;
            return 1;
        }
        if (origin && strlen(o) == origin->value_len && !memcmp(o, origin->value, origin->value_len)) return 1;
    }
    return 0;
}

void cb_cors_headers(const cb_app *a, const cb_http_request *req, char *out, size_t cap) {
    const cb_http_header *origin = cb_http_find_header(req, "Origin");
    int any;
    out[0] = 0;
    if (!origin_allowed(a, origin, &any)) {
        snprintf(out, cap, "Vary: Origin\r\n"); /* a cache must not serve this answer to an allowed origin */
        return;
    }
    if (any) snprintf(out, cap, "Access-Control-Allow-Origin: *\r\n");
    else if (origin->value_len < cap - 64)
        snprintf(out, cap, "Access-Control-Allow-Origin: %.*s\r\nVary: Origin\r\n", (int)origin->value_len,
                 origin->value);
}

int cb_cors_preflight(cb_app *a, cb_conn *c, const cb_http_request *req) {
    /* The headers the browser asks for are allowed (the openai JS client
     * sends several X-Stainless-* beside Authorization); the parser has
     * already refused control characters in them. */
    const cb_http_header *asked = cb_http_find_header(req, "Access-Control-Request-Headers");
    char lines[1024];
    if (asked && asked->value_len > 0 && asked->value_len < 700)
        snprintf(lines, sizeof lines, "Access-Control-Allow-Methods: GET, HEAD, POST, OPTIONS\r\n"
                 "Access-Control-Allow-Headers: %.*s\r\nAccess-Control-Max-Age: 600\r\n",
                 (int)asked->value_len, asked->value);
    else
        snprintf(lines, sizeof lines, "Access-Control-Allow-Methods: GET, HEAD, POST, OPTIONS\r\n"
                 "Access-Control-Allow-Headers: Authorization, Content-Type\r\nAccess-Control-Max-Age: 600\r\n");
    cb_metrics_status(&a->metrics, 204);
    return cb_conn_respond(c, 204, NULL, "", 0, lines) == CB_CONN_OK;
}
