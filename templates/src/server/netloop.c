/* The connection loop: see netloop.h for the contract and memory layout.
 *
 * Each connection is a small state machine driven by conn_advance(), which
 * runs only inside cb_netloop_poll(). The application's answer functions
 * just append to the write buffer and try one non-blocking send; anything
 * that could call back into the application (finishing an exchange and
 * starting the next pipelined request, closing after an error) waits for
 * the next poll round, so callbacks never nest. */
#include "netloop.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "platform/net.h"

#define LISTENER_TAG 0        /* connection handles are never 0 */
#define ACCEPTS_PER_ROUND 64  /* bounds the work one poll round spends accepting */
#define REQUESTS_PER_ROUND 8  /* pipelined requests one connection starts per round */
#define READS_PER_EVENT 8     /* recv calls per readiness event, for fairness */
#define LINGER_MS 1000        /* after an error reply: wait this long for the client's FIN */
#define FRESH_MS 1000         /* a new connection's time to start its request before its slot
                                 may go to another newcomer */
#define CHUNK_END "0\r\n\r\n"
#define CHUNK_END_LEN 5
#define CHUNK_FRAMING 20      /* upper bound of a chunk's "<hex>\r\n" + "\r\n" */

enum conn_state {
    ST_FREE,
    ST_READ_HEAD,  /* waiting for a complete request head */
    ST_READ_BODY,  /* head parsed, waiting for Content-Length bytes */
    ST_WAIT_APP,   /* request handed over, no answer yet */
    ST_STREAMING,  /* stream begun, not ended */
    ST_SENDING,    /* answer complete, bytes still queued */
    ST_LINGER,     /* error reply sent and FIN sent: draining until the client closes */
};

struct cb_conn {
    cb_netloop *loop;
    cb_sock sock;
    uint32_t slot;
    uint32_t gen;
    enum conn_state state;
    unsigned interest; /* what the poller watches for this socket now */

    /* Read side. A request always starts at rbuf[0]: the buffer is compacted
     * when an exchange ends, so the head's pointers never move under it. */
    char *rbuf;
    size_t rlen;     /* bytes in rbuf */
    size_t scanned;  /* rbuf[0, scanned) holds no line end the parser has not seen */
    size_t consumed; /* bytes of rbuf the current request used */
    cb_http_request req;
    size_t head_len;
    size_t body_len;
    char *body;       /* rbuf + head_len, or a large buffer */
    size_t body_have; /* bytes received into a large buffer */
    int large;        /* index of the borrowed large buffer, or -1 */

    /* Write side: wbuf[wpos, wlen) is still to be sent. */
    char *wbuf;
    size_t wpos;
    size_t wlen;

    uint64_t deadline_ms;       /* while reading or lingering; 0: none */
    uint64_t write_progress_ms; /* last time queued bytes moved */
    uint64_t quiet_since;       /* loop->quiet_seq when opened or its last exchange ended:
                                   a clock, not ms, so the order is exact */
    uint64_t opened_ms;

    char app_headers[CB_CONN_HEADER_BYTES]; /* cb_conn_set_headers(): lines for this request's answers */

    uint8_t minor_version;
    uint8_t keep_alive;
    uint8_t close_after_send;
    uint8_t head_only;     /* HEAD request: headers but never a body */
    uint8_t chunked;       /* the open stream uses chunked encoding */
    uint8_t idle;          /* kept alive, no byte of the next request yet */
    uint8_t peer_eof;      /* the client closed its sending side */
    uint8_t broken;        /* a send failed outside the loop: close next round */
    uint8_t needs_service; /* conn_advance() must run next round */
    uint8_t spare;         /* holds a spare entry: serves spare_path only, then closes */
};

struct cb_netloop {
    cb_netloop_config cfg;
    cb_sock listener;
    int port;
    cb_poller *poller;
    cb_poll_event *events;
    int max_events;
    cb_conn *conns;       /* [n_conns = max_conns + spare_conns] */
    int n_conns;
    int n_main;           /* open connections not on a spare entry */
    uint32_t *free_slots; /* stack of unused slot numbers */
    int n_free;
    char *read_slab;      /* n_conns * read_buf_size */
    char *write_slab;     /* n_conns * write_buf_size */
    char *large_slab;     /* n_large * max_body_size */
    int *free_large;      /* stack of unused large buffers */
    int n_large;
    int n_free_large;
    uint64_t now; /* the clock at the start of the current round's work */
    uint64_t quiet_seq;   /* counts connections becoming quiet (see cb_conn) */
    char busy_reply[512]; /* 503 sent to a client when every slot is taken */
    size_t busy_reply_len;
};

static void loop_log(const cb_netloop *loop, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(CB_PRINTF_FORMAT, 2, 3)))
#endif
    ;

static void loop_log(const cb_netloop *loop, const char *fmt, ...)
{
    va_list ap;
    if (!loop->cfg.verbose)
        return;
    fputs("colibri-net: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void cb_netloop_config_init(cb_netloop_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->port = 8080;
    cfg->backlog = 128;
    cfg->max_conns = 256;
    cfg->spare_conns = 8;
    cfg->read_buf_size = 64 * 1024;
    cfg->write_buf_size = 128 * 1024;
    cfg->max_header_size = CB_HTTP_MAX_HEADER_BYTES;
    cfg->max_body_size = 1024 * 1024;
    cfg->large_body_buffers = 4;
    cfg->request_timeout_ms = 10000;
    cfg->idle_timeout_ms = 30000;
    cfg->write_timeout_ms = 30000;
}

/* ---- handles ---- */

cb_conn_id cb_conn_handle(const cb_conn *c)
{
    return ((uint64_t)c->gen << 32) | c->slot;
}

cb_conn *cb_netloop_conn(cb_netloop *loop, cb_conn_id id)
{
    uint32_t slot = (uint32_t)(id & 0xffffffffu), gen = (uint32_t)(id >> 32);
    cb_conn *c;
    if (slot >= (uint32_t)loop->n_conns)
        return NULL;
    c = &loop->conns[slot];
    return (c->state != ST_FREE && c->gen == gen) ? c : NULL;
}

int cb_conn_alive(const cb_netloop *loop, cb_conn_id id)
{
    return cb_netloop_conn((cb_netloop *)loop, id) != NULL;
}

int cb_netloop_conns(const cb_netloop *loop) { return loop->n_conns; }

size_t cb_netloop_bytes(const cb_netloop *loop, size_t *per_conn, size_t *large) {
    const size_t n = (size_t)loop->n_conns;
    const size_t each = loop->cfg.read_buf_size + loop->cfg.write_buf_size + sizeof *loop->conns +
                        sizeof *loop->free_slots;
    const size_t bodies = (size_t)loop->n_large * (loop->cfg.max_body_size + sizeof *loop->free_large);
    if (per_conn) *per_conn = each;
    if (large) *large = bodies;
    return sizeof *loop + n * each + (size_t)loop->max_events * sizeof *loop->events + bodies;
}

int cb_netloop_port(const cb_netloop *loop) { return loop->port; }

int cb_netloop_active(const cb_netloop *loop)
{
    return loop->n_conns - loop->n_free;
}

int cb_netloop_unsent(const cb_netloop *loop)
{
    int i, n = 0;
    for (i = 0; i < loop->n_conns; i++) {
        const cb_conn *c = &loop->conns[i];
        n += c->state != ST_FREE && (c->wpos < c->wlen || c->state == ST_SENDING);
    }
    return n;
}

/* ---- small helpers ---- */

static uint64_t deadline_after(const cb_netloop *loop, int ms)
{
    return ms > 0 ? loop->now + (uint64_t)ms : 0;
}

static void release_large(cb_netloop *loop, cb_conn *c)
{
    if (c->large >= 0) {
        loop->free_large[loop->n_free_large++] = c->large;
        c->large = -1;
        c->body = NULL;
    }
}

static void conn_close(cb_netloop *loop, cb_conn *c, int notify, const char *why)
{
    cb_conn_id id = cb_conn_handle(c);
    if (c->state == ST_FREE)
        return;
    if (why != NULL)
        loop_log(loop, "conn %u closed: %s", c->slot, why);
    cb_poller_del(loop->poller, c->sock);
    cb_net_close(c->sock);
    c->sock = CB_SOCK_INVALID;
    release_large(loop, c);
    c->state = ST_FREE;
    if (!c->spare)
        loop->n_main--;
    c->gen++;
    if (c->gen == 0) /* keep handles non-zero after wrapping */
        c->gen = 1;
    loop->free_slots[loop->n_free++] = c->slot;
    if (notify && loop->cfg.on_close != NULL)
        loop->cfg.on_close(loop->cfg.app, id);
}

static void update_interest(cb_conn *c)
{
    cb_netloop *loop = c->loop;
    unsigned want = 0;

    switch (c->state) {
    case ST_READ_HEAD:
    case ST_READ_BODY:
    case ST_LINGER:
        want = CB_POLL_READ;
        break;
    case ST_WAIT_APP:
    case ST_STREAMING:
    case ST_SENDING:
        /* Reading ahead keeps pipelined bytes and, above all, notices a
         * client that leaves while its answer is being computed. */
        if (c->rlen < loop->cfg.read_buf_size)
            want = CB_POLL_READ;
        break;
    case ST_FREE:
        return;
    }
    if (c->peer_eof) /* level-triggered EOF would wake us forever */
        want &= ~(unsigned)CB_POLL_READ;
    if (c->wpos < c->wlen)
        want |= CB_POLL_WRITE;
    if (want != c->interest) {
        if (cb_poller_mod(loop->poller, c->sock, cb_conn_handle(c), want) == 0) {
            c->interest = want;
        } else {
            c->broken = 1;
            c->needs_service = 1;
        }
    }
}

/* Sends what the write buffer holds until the socket would block. */
static int flush(cb_conn *c)
{
    while (c->wpos < c->wlen) {
        ptrdiff_t n = cb_net_send(c->sock, c->wbuf + c->wpos, c->wlen - c->wpos);
        if (n > 0) {
            c->wpos += (size_t)n;
            c->write_progress_ms = cb_net_now_ms();
        } else if (n == CB_NET_AGAIN || n == 0) {
            break;
        } else {
            return -1;
        }
    }
    if (c->wpos == c->wlen)
        c->wpos = c->wlen = 0;
    return 0;
}

/* After the application queued bytes: send what we can now, and have the
 * loop finish the exchange (or close) in its next round. */
static void kick(cb_conn *c)
{
    if (flush(c) < 0)
        c->broken = 1;
    if (c->broken || (c->state == ST_SENDING && c->wpos == c->wlen))
        c->needs_service = 1;
    if (!c->broken)
        update_interest(c);
}

/* ---- building responses in the write buffer ---- */

typedef struct {
    char *p;
    size_t cap;
    size_t len;
    int full;
} out_buf;

static void out_open(out_buf *o, cb_conn *c)
{
    if (c->wpos > 0) { /* slide pending bytes to the front for room */
        memmove(c->wbuf, c->wbuf + c->wpos, c->wlen - c->wpos);
        c->wlen -= c->wpos;
        c->wpos = 0;
    }
    o->p = c->wbuf + c->wlen;
    o->cap = c->loop->cfg.write_buf_size - c->wlen;
    o->len = 0;
    o->full = 0;
}

static void out_put(out_buf *o, const char *s, size_t n)
{
    if (o->full || n > o->cap - o->len) {
        o->full = 1;
        return;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void out_str(out_buf *o, const char *s) { out_put(o, s, strlen(s)); }

static void out_uint(out_buf *o, uint64_t v, int base)
{
    char tmp[24];
    int n = 0, k;
    do {
        tmp[n++] = "0123456789abcdef"[v % (unsigned)base];
        v /= (unsigned)base;
    } while (v != 0);
    for (k = n - 1; k >= 0; k--)
        out_put(o, &tmp[k], 1);
}

/* Commits o into the write buffer, keeping `reserve` bytes free after it. */
static int out_commit(cb_conn *c, const out_buf *o, size_t reserve)
{
    if (o->full || reserve > o->cap - o->len)
        return CB_CONN_ERR_FULL;
    if (c->wpos == c->wlen)
        c->write_progress_ms = cb_net_now_ms();
    c->wlen += o->len;
    return CB_CONN_OK;
}

static void out_status_line(out_buf *o, int status)
{
    out_str(o, "HTTP/1.1 ");
    out_uint(o, (uint64_t)(status >= 100 && status <= 999 ? status : 500), 10);
    out_str(o, " ");
    out_str(o, cb_http_status_text(status));
    out_str(o, "\r\n");
}

static void out_extra_headers(out_buf *o, const char *extra)
{
    size_t n;
    if (extra == NULL || extra[0] == '\0')
        return;
    n = strlen(extra);
    out_put(o, extra, n);
    if (n < 2 || extra[n - 2] != '\r' || extra[n - 1] != '\n')
        out_str(o, "\r\n");
}

static size_t error_json(char *buf, size_t cap, int status, const char *type,
                         const char *message)
{
    cb_jw w;
    if (type == NULL)
        type = status >= 500 ? "server_error" : "invalid_request_error";
    cb_jw_init(&w, buf, cap);
    cb_jw_openai_error(&w, message, type);
    return w.overflow ? 0 : w.len;
}

/* ---- answers (application side) ---- */

static int queue_response(cb_conn *c, int status, const char *content_type,
                          const char *body, size_t len, const char *extra_headers)
{
    out_buf o;
    int r;
    out_open(&o, c);
    out_status_line(&o, status);
    if (content_type != NULL) {
        out_str(&o, "Content-Type: ");
        out_str(&o, content_type);
        out_str(&o, "\r\n");
    }
    if (status != 204) { /* RFC 9110 8.6: no Content-Length in a 204 */
        out_str(&o, "Content-Length: ");
        out_uint(&o, len, 10);
        out_str(&o, "\r\n");
    }
    out_str(&o, c->keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
    out_extra_headers(&o, extra_headers);
    out_extra_headers(&o, c->app_headers);
    out_str(&o, "\r\n");
    if (!c->head_only)
        out_put(&o, body, len);
    r = out_commit(c, &o, 0);
    if (r == CB_CONN_OK) {
        c->state = ST_SENDING;
        c->close_after_send = !c->keep_alive;
    }
    return r;
}

int cb_conn_respond(cb_conn *c, int status, const char *content_type, const char *body,
                    size_t len, const char *extra_headers)
{
    int r;
    if (c->state != ST_WAIT_APP)
        return CB_CONN_ERR_STATE;
    r = queue_response(c, status, content_type, body != NULL ? body : "", len, extra_headers);
    if (r == CB_CONN_OK)
        kick(c);
    return r;
}

int cb_conn_respond_error(cb_conn *c, int status, const char *type, const char *message)
{
    char body[2048];
    size_t n = error_json(body, sizeof body, status, type, message);
    if (n == 0) /* a message too long for the buffer: keep the shape */
        n = error_json(body, sizeof body, status, type, cb_http_status_text(status));
    return cb_conn_respond(c, status, "application/json", body, n, NULL);
}

int cb_conn_stream_begin(cb_conn *c, int status, const char *content_type)
{
    out_buf o;
    int r;
    if (c->state != ST_WAIT_APP)
        return CB_CONN_ERR_STATE;
    /* HTTP/1.0 has no chunked encoding: the stream ends when we close. */
    c->chunked = c->minor_version >= 1;
    if (!c->chunked)
        c->keep_alive = 0;
    out_open(&o, c);
    out_status_line(&o, status);
    if (content_type != NULL) {
        out_str(&o, "Content-Type: ");
        out_str(&o, content_type);
        out_str(&o, "\r\n");
    }
    out_str(&o, "Cache-Control: no-cache\r\n");
    out_extra_headers(&o, c->app_headers);
    if (c->chunked)
        out_str(&o, "Transfer-Encoding: chunked\r\n");
    out_str(&o, c->keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
    r = out_commit(c, &o, c->chunked ? CHUNK_END_LEN : 0);
    if (r != CB_CONN_OK)
        return r;
    c->state = ST_STREAMING;
    /* No send yet: the head leaves with the first piece (one send), so a
     * client or proxy never holds a 200 whose instance died before its first
     * event (nginx cannot retry it then). The next poll sends it otherwise. */
    update_interest(c);
    return CB_CONN_OK;
}

size_t cb_conn_write_space(const cb_conn *c)
{
    size_t used, reserve, framing, cap = c->loop->cfg.write_buf_size;
    if (c->state != ST_STREAMING)
        return 0;
    used = c->wlen - c->wpos;
    reserve = c->chunked ? CHUNK_END_LEN : 0;
    framing = c->chunked ? CHUNK_FRAMING : 0;
    return cap > used + reserve + framing ? cap - used - reserve - framing : 0;
}

int cb_conn_stream_write(cb_conn *c, const char *data, size_t len)
{
    out_buf o;
    int r;
    if (c->state != ST_STREAMING)
        return CB_CONN_ERR_STATE;
    if (len == 0 || c->head_only) /* a zero-length chunk would end the stream */
        return CB_CONN_OK;
    if (len > cb_conn_write_space(c)) {
        if (flush(c) < 0) {
            c->broken = 1;
            c->needs_service = 1;
            return CB_CONN_ERR_STATE;
        }
        if (len > cb_conn_write_space(c))
            return CB_CONN_ERR_FULL;
    }
    out_open(&o, c);
    if (c->chunked) {
        out_uint(&o, len, 16);
        out_str(&o, "\r\n");
    }
    out_put(&o, data, len);
    if (c->chunked)
        out_str(&o, "\r\n");
    r = out_commit(c, &o, c->chunked ? CHUNK_END_LEN : 0);
    if (r == CB_CONN_OK)
        kick(c);
    return r;
}

int cb_conn_stream_end(cb_conn *c)
{
    if (c->state != ST_STREAMING)
        return CB_CONN_ERR_STATE;
    if (c->chunked && !c->head_only) {
        out_buf o;
        out_open(&o, c);
        out_put(&o, CHUNK_END, CHUNK_END_LEN);
        if (out_commit(c, &o, 0) != CB_CONN_OK) /* cannot happen: reserved */
            return CB_CONN_ERR_FULL;
    }
    c->state = ST_SENDING;
    c->close_after_send = !c->keep_alive;
    kick(c);
    return CB_CONN_OK;
}

void cb_conn_set_headers(cb_conn *c, const char *lines)
{
    size_t n = strlen(lines);
    if (n >= sizeof c->app_headers)
        n = 0;
    memcpy(c->app_headers, lines, n);
    c->app_headers[n] = '\0';
}

void cb_conn_close(cb_conn *c)
{
    conn_close(c->loop, c, 0, "closed by the application");
}

/* ---- the state machine (loop side) ---- */

/* Refuses the request with an OpenAI-shaped error and closes afterwards. */
static void fail_request_with(cb_conn *c, int status, const char *message, const char *extra_headers)
{
    char body[512];
    size_t n = error_json(body, sizeof body, status, NULL, message);
    loop_log(c->loop, "conn %u: %d %s", c->slot, status, message);
    c->keep_alive = 0;
    c->state = ST_WAIT_APP;
    if (n == 0 || cb_conn_respond(c, status, "application/json", body, n, extra_headers) != CB_CONN_OK)
        c->broken = 1;
}

static void fail_request(cb_conn *c, int status, const char *message)
{
    fail_request_with(c, status, message, NULL);
}

/* A request only partly here when its time ran out: say so, then close. */
static void time_out_request(cb_netloop *loop, cb_conn *c)
{
    char msg[128];
    release_large(loop, c);
    snprintf(msg, sizeof msg, "the request did not arrive in full within %d ms",
             loop->cfg.request_timeout_ms);
    fail_request(c, 408, msg);
}

/* Not a byte of a request has arrived (a new or a kept-alive connection). */
static int conn_quiet(const cb_conn *c)
{
    return c->state == ST_READ_HEAD && c->rlen == 0;
}

/* 400 naming what the parser found wrong. */
static void fail_malformed(cb_conn *c)
{
    char msg[192];
    snprintf(msg, sizeof msg, "malformed HTTP request: %s",
             c->req.error != NULL ? c->req.error : "bad request head");
    fail_request(c, 400, msg);
}

/* 431 naming which limit: the field count (the head is shorter than the
 * byte limit) or the byte limit. */
static void fail_head_too_large(cb_netloop *loop, cb_conn *c)
{
    char msg[96];
    if (c->rlen < loop->cfg.max_header_size)
        snprintf(msg, sizeof msg, "more than %d header fields", CB_HTTP_MAX_HEADERS);
    else
        snprintf(msg, sizeof msg, "request head over the limit of %zu bytes", loop->cfg.max_header_size);
    fail_request(c, 431, msg);
}

/* The head is parsed (head_len bytes): check the framing, find room for
 * the body. */
static void start_request(cb_netloop *loop, cb_conn *c, size_t head_len)
{
    const cb_http_request *req = &c->req;
    size_t rcap = loop->cfg.read_buf_size, have;
    char msg[160];

    c->head_len = head_len;
    c->keep_alive = (uint8_t)req->keep_alive;
    c->minor_version = (uint8_t)req->minor_version;
    c->head_only = (uint8_t)cb_http_method_is(req, "HEAD");
    c->large = -1;

    if (c->spare) {
        /* Every regular slot is busy: only the spare path is served here. */
        if (loop->cfg.spare_path == NULL || !cb_http_path_is(req, loop->cfg.spare_path) ||
            !(cb_http_method_is(req, "GET") || c->head_only)) {
            fail_request_with(c, 503, "server busy: every connection is in use; retry shortly",
                              "Retry-After: 1\r\n");
            return;
        }
        c->keep_alive = 0;
    }

    if (req->has_transfer_encoding) {
        /* Both framings at once is how requests get smuggled. */
        if (req->content_length >= 0)
            fail_request(c, 400, "Transfer-Encoding and Content-Length together");
        else if (req->chunked)
            fail_request(c, 411, "chunked request bodies are not supported; send Content-Length");
        else
            fail_request(c, 501, "unsupported Transfer-Encoding");
        return;
    }
    /* Checked before narrowing to size_t, which may be 32 bits. */
    if (req->content_length > 0 && (uint64_t)req->content_length > loop->cfg.max_body_size) {
        snprintf(msg, sizeof msg, "request body of %lld bytes is over the limit of %zu bytes",
                 (long long)req->content_length, loop->cfg.max_body_size);
        fail_request(c, 413, msg);
        return;
    }
    c->body_len = req->content_length > 0 ? (size_t)req->content_length : 0;
    if (head_len + c->body_len <= rcap) {
        c->body = c->rbuf + head_len;
        have = c->rlen - head_len;
    } else {
        if (loop->n_free_large == 0) {
            fail_request(c, 503, "too many large requests in progress; retry later");
            return;
        }
        c->large = loop->free_large[--loop->n_free_large];
        c->body = loop->large_slab + (size_t)c->large * loop->cfg.max_body_size;
        /* Everything after the head is body here: the body is longer than
         * what the read buffer can hold after the head. */
        have = c->rlen - head_len;
        memcpy(c->body, c->rbuf + head_len, have);
        c->body_have = have;
        c->rlen = head_len;
    }
    if (req->expect_continue && c->minor_version >= 1 && have < c->body_len) {
        out_buf o;
        out_open(&o, c);
        out_str(&o, "HTTP/1.1 100 Continue\r\n\r\n");
        out_commit(c, &o, 0);
    }
    c->state = ST_READ_BODY;
}

static size_t body_received(const cb_conn *c)
{
    return c->large >= 0 ? c->body_have : c->rlen - c->head_len;
}

static void dispatch(cb_netloop *loop, cb_conn *c)
{
    uint32_t gen = c->gen;
    c->state = ST_WAIT_APP;
    c->consumed = c->large >= 0 ? c->head_len : c->head_len + c->body_len;
    c->app_headers[0] = '\0';
    loop->cfg.on_request(loop->cfg.app, c, &c->req, c->body, c->body_len);
    if (c->state == ST_FREE || c->gen != gen) /* closed by the application */
        return;
    release_large(loop, c);
}

/* The answer is out: close, or keep the pipelined bytes and read on. */
static void finish_exchange(cb_netloop *loop, cb_conn *c)
{
    if (c->close_after_send || c->peer_eof) {
        /* A FIN first, then wait for the client's: closing with unread
         * bytes would send a reset that can destroy the reply in flight. */
        cb_net_shutdown_write(c->sock);
        c->state = ST_LINGER;
        c->rlen = 0;
        c->deadline_ms = loop->now + LINGER_MS;
        return;
    }
    memmove(c->rbuf, c->rbuf + c->consumed, c->rlen - c->consumed);
    c->rlen -= c->consumed;
    c->consumed = 0;
    c->scanned = 0;
    c->head_only = 0;
    c->app_headers[0] = '\0';
    c->state = ST_READ_HEAD;
    c->idle = c->rlen == 0;
    c->quiet_since = ++loop->quiet_seq;
    c->deadline_ms = deadline_after(loop, c->idle ? loop->cfg.idle_timeout_ms
                                                  : loop->cfg.request_timeout_ms);
}

/* Parsing is worth trying only once a new line end arrived (or the limit
 * is reached): this keeps a byte-by-byte client at linear cost. */
static int head_worth_parsing(const cb_netloop *loop, cb_conn *c)
{
    if (c->rlen >= loop->cfg.max_header_size)
        return 1;
    if (c->scanned < c->rlen && memchr(c->rbuf + c->scanned, '\n', c->rlen - c->scanned))
        return 1;
    c->scanned = c->rlen;
    return 0;
}

static void conn_advance(cb_netloop *loop, cb_conn *c)
{
    int started = 0;
    c->needs_service = 0;
    for (;;) {
        if (c->state == ST_FREE)
            return;
        if (c->broken) {
            conn_close(loop, c, 1, "send failed");
            return;
        }
        if (c->wpos < c->wlen && flush(c) < 0) {
            conn_close(loop, c, 1, "send failed");
            return;
        }
        switch (c->state) {
        case ST_READ_HEAD: {
            int r;
            if (!head_worth_parsing(loop, c)) {
                if (c->peer_eof) {
                    conn_close(loop, c, 1, c->rlen ? "client left mid-request" : "client left");
                    return;
                }
                goto wait;
            }
            if (started == REQUESTS_PER_ROUND) { /* let other clients in */
                c->needs_service = 1;
                goto wait;
            }
            r = cb_http_parse_limit(c->rbuf, c->rlen, loop->cfg.max_header_size, &c->req);
            if (r == CB_HTTP_INCOMPLETE)
                c->scanned = c->rlen;
            else if (r == CB_HTTP_BAD)
                fail_malformed(c);
            else if (r == CB_HTTP_TOO_LARGE)
                fail_head_too_large(loop, c);
            else if (r == CB_HTTP_VERSION)
                fail_request(c, 505, "HTTP version not supported: send HTTP/1.1 or HTTP/1.0");
            else
                start_request(loop, c, (size_t)r);
            continue;
        }
        case ST_READ_BODY:
            if (body_received(c) < c->body_len) {
                if (c->peer_eof) {
                    conn_close(loop, c, 1, "client left mid-body");
                    return;
                }
                goto wait;
            }
            dispatch(loop, c);
            started++;
            continue;
        case ST_WAIT_APP:
        case ST_STREAMING:
            if (c->peer_eof) {
                conn_close(loop, c, 1, "client left before the answer was complete");
                return;
            }
            goto wait;
        case ST_SENDING:
            if (c->wpos < c->wlen)
                goto wait;
            finish_exchange(loop, c);
            continue;
        case ST_LINGER:
            if (c->peer_eof) {
                conn_close(loop, c, 1, NULL);
                return;
            }
            goto wait;
        case ST_FREE:
            return;
        }
    }
wait:
    update_interest(c);
}

static void on_readable(cb_netloop *loop, cb_conn *c)
{
    char discard[4096];
    int k;
    for (k = 0; k < READS_PER_EVENT; k++) {
        char *dst;
        size_t room;
        ptrdiff_t n;
        int into_large = c->state == ST_READ_BODY && c->large >= 0;
        if (c->state == ST_LINGER) {
            dst = discard;
            room = sizeof discard;
        } else if (into_large) {
            /* Exactly the body: later bytes stay in the socket. */
            dst = c->body + c->body_have;
            room = c->body_len - c->body_have;
        } else {
            dst = c->rbuf + c->rlen;
            room = loop->cfg.read_buf_size - c->rlen;
        }
        if (room == 0)
            break;
        n = cb_net_recv(c->sock, dst, room);
        if (n == CB_NET_AGAIN || n == 0)
            break;
        if (n == CB_NET_CLOSED) {
            c->peer_eof = 1;
            break;
        }
        if (n < 0) {
            c->broken = 1;
            break;
        }
        if (c->state == ST_LINGER)
            continue;
        if (into_large)
            c->body_have += (size_t)n;
        else
            c->rlen += (size_t)n;
        if (c->idle && c->state == ST_READ_HEAD) {
            /* The first byte of the next request starts its clock. */
            c->idle = 0;
            c->deadline_ms = deadline_after(loop, loop->cfg.request_timeout_ms);
        }
        if ((size_t)n < room)
            break;
    }
    conn_advance(loop, c);
}

static uint64_t conn_deadline(const cb_netloop *loop, const cb_conn *c)
{
    switch (c->state) {
    case ST_READ_HEAD:
    case ST_READ_BODY:
    case ST_LINGER:
        return c->deadline_ms;
    case ST_WAIT_APP:
    case ST_STREAMING:
    case ST_SENDING:
        if (c->wpos < c->wlen && loop->cfg.write_timeout_ms > 0)
            return c->write_progress_ms + (uint64_t)loop->cfg.write_timeout_ms;
        return 0;
    case ST_FREE:
        break;
    }
    return 0;
}

/* The table is full: close the connection that has been quiet longest
 * (no byte of a request) to make room. 0 when every one is busy. A new
 * connection gets FRESH_MS to start its request first: in a burst of
 * clients, the early ones are not dropped before they could send (the
 * late ones get a spare entry's 503 instead). */
static int reclaim_quiet(cb_netloop *loop)
{
    cb_conn *oldest = NULL;
    int i;
    for (i = 0; i < loop->n_conns; i++) {
        cb_conn *c = &loop->conns[i];
        if (!c->spare && conn_quiet(c) && (c->idle || loop->now - c->opened_ms >= FRESH_MS) &&
            (oldest == NULL || c->quiet_since < oldest->quiet_since))
            oldest = c;
    }
    if (oldest == NULL)
        return 0;
    conn_close(loop, oldest, 1, "idle, its slot went to a new connection");
    return 1;
}

/* Every slot and spare entry is taken: answer 503 at once and hang up. */
static void refuse_busy(cb_netloop *loop, cb_sock s)
{
    char discard[4096];
    int k;
    /* Reading what already arrived avoids a reset that would eat the 503. */
    for (k = 0; k < 4 && cb_net_recv(s, discard, sizeof discard) > 0; k++) {
    }
    cb_net_send(s, loop->busy_reply, loop->busy_reply_len);
    cb_net_shutdown_write(s);
    cb_net_close(s);
    loop_log(loop, "connection refused: all %d slots and %d spare entries busy", loop->cfg.max_conns,
             loop->cfg.spare_conns);
}

static void accept_clients(cb_netloop *loop)
{
    int k;
    for (k = 0; k < ACCEPTS_PER_ROUND; k++) {
        cb_sock s;
        cb_conn *c;
        int spare, r = cb_net_accept(loop->listener, &s);
        if (r == CB_NET_AGAIN)
            return;
        if (r != 0) {
            loop_log(loop, "accept failed");
            return;
        }
        spare = loop->n_main >= loop->cfg.max_conns && !reclaim_quiet(loop);
        if (loop->n_free == 0) {
            refuse_busy(loop, s);
            continue;
        }
        c = &loop->conns[loop->free_slots[--loop->n_free]];
        c->spare = (uint8_t)spare;
        if (!spare)
            loop->n_main++;
        c->quiet_since = ++loop->quiet_seq;
        c->opened_ms = loop->now;
        c->sock = s;
        c->state = ST_READ_HEAD;
        c->interest = CB_POLL_READ;
        c->rlen = c->scanned = c->consumed = 0;
        c->wpos = c->wlen = 0;
        c->app_headers[0] = '\0';
        c->large = -1;
        c->body = NULL;
        c->body_have = 0;
        c->keep_alive = c->close_after_send = c->head_only = c->chunked = 0;
        c->idle = c->peer_eof = c->broken = c->needs_service = 0;
        c->deadline_ms = deadline_after(loop, loop->cfg.request_timeout_ms);
        if (cb_poller_add(loop->poller, s, cb_conn_handle(c), CB_POLL_READ) != 0) {
            cb_net_close(s);
            c->sock = CB_SOCK_INVALID;
            c->state = ST_FREE;
            if (!spare)
                loop->n_main--;
            loop->free_slots[loop->n_free++] = c->slot;
            continue;
        }
        loop_log(loop, spare ? "conn %u opened on a spare entry" : "conn %u opened", c->slot);
    }
}

int cb_netloop_poll(cb_netloop *loop, int timeout_ms)
{
    uint64_t next = UINT64_MAX;
    int urgent = 0, wait_ms = timeout_ms, n, i;

    loop->now = cb_net_now_ms();
    for (i = 0; i < loop->n_conns; i++) {
        cb_conn *c = &loop->conns[i];
        uint64_t dl;
        if (c->state != ST_FREE && c->needs_service)
            conn_advance(loop, c);
        if (c->state == ST_FREE)
            continue;
        dl = conn_deadline(loop, c);
        if (dl != 0 && dl <= loop->now) {
            /* RFC 9110 15.5.9: a request cut short gets 408; a quiet
             * connection may simply be closed. */
            if ((c->state == ST_READ_HEAD && c->rlen > 0) || c->state == ST_READ_BODY) {
                time_out_request(loop, c);
                conn_advance(loop, c);
                if (c->state != ST_FREE)
                    urgent |= c->needs_service;
                continue;
            }
            conn_close(loop, c, 1, "time limit");
            continue;
        }
        if (dl != 0 && dl < next)
            next = dl;
        if (c->needs_service)
            urgent = 1;
    }
    if (urgent) {
        wait_ms = 0;
    } else if (next != UINT64_MAX) {
        uint64_t until = next - loop->now;
        if (wait_ms < 0 || until < (uint64_t)wait_ms)
            wait_ms = (int)until;
    }

    n = cb_poller_wait(loop->poller, loop->events, loop->max_events, wait_ms);
    if (n < 0)
        return -1;
    loop->now = cb_net_now_ms();
    for (i = 0; i < n; i++) {
        const cb_poll_event *ev = &loop->events[i];
        cb_conn *c;
        if (ev->tag == LISTENER_TAG) {
            accept_clients(loop);
            continue;
        }
        /* A stale event for a connection closed earlier in this batch
         * carries the old generation and finds nothing. */
        c = cb_netloop_conn(loop, ev->tag);
        if (c == NULL)
            continue;
        if (ev->events & CB_POLL_HANGUP)
            conn_close(loop, c, 1, "hung up");
        else if (ev->events & CB_POLL_READ)
            on_readable(loop, c);
        else if (ev->events & CB_POLL_WRITE)
            conn_advance(loop, c);
    }
    return n;
}

/* ---- creation ---- */

static int mul_fits(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

static void build_busy_reply(cb_netloop *loop)
{
    char body[256];
    size_t n = error_json(body, sizeof body, 503, NULL, "server busy: too many connections");
    int len = snprintf(loop->busy_reply, sizeof loop->busy_reply,
                       "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s",
                       n, body);
    loop->busy_reply_len = len > 0 && (size_t)len < sizeof loop->busy_reply ? (size_t)len : 0;
}

cb_netloop *cb_netloop_create(const cb_netloop_config *cfg, char *err, size_t err_len)
{
    cb_netloop *loop;
    size_t n_conns, read_bytes, write_bytes, large_bytes = 0;
    int n_large = 0, i;

    if (cfg->on_request == NULL || cfg->max_conns < 1 || cfg->max_conns > (1 << 20) ||
        cfg->spare_conns < 0 || cfg->spare_conns > (1 << 10) ||
        cfg->read_buf_size < 1024 || cfg->write_buf_size < 1024 ||
        cfg->max_header_size < 64 || cfg->max_header_size > cfg->read_buf_size ||
        cfg->large_body_buffers < 0) {
        snprintf(err, err_len,
                 "invalid network configuration (need on_request, 1 <= max_conns, 0 <= spare_conns <= 1024, "
                 "buffers >= 1 KiB, 64 <= max_header_size <= read_buf_size)");
        return NULL;
    }
    n_conns = (size_t)cfg->max_conns + (size_t)cfg->spare_conns;
    /* Bodies that fit after any head never need a large buffer. */
    if (cfg->max_header_size + cfg->max_body_size > cfg->read_buf_size)
        n_large = cfg->large_body_buffers;
    if (!mul_fits(n_conns, cfg->read_buf_size, &read_bytes) ||
        !mul_fits(n_conns, cfg->write_buf_size, &write_bytes) ||
        !mul_fits((size_t)n_large, cfg->max_body_size, &large_bytes)) {
        snprintf(err, err_len, "network buffers too large");
        return NULL;
    }

    loop = calloc(1, sizeof *loop);
    if (loop == NULL) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    loop->cfg = *cfg;
    loop->listener = CB_SOCK_INVALID;
    loop->n_large = n_large;
    loop->n_conns = (int)n_conns;
    loop->max_events = loop->n_conns + 1;
    loop->conns = calloc(n_conns, sizeof *loop->conns);
    loop->free_slots = calloc(n_conns, sizeof *loop->free_slots);
    loop->events = calloc((size_t)loop->max_events, sizeof *loop->events);
    loop->read_slab = malloc(read_bytes);
    loop->write_slab = malloc(write_bytes);
    if (n_large > 0) {
        loop->large_slab = malloc(large_bytes);
        loop->free_large = calloc((size_t)n_large, sizeof *loop->free_large);
    }
    if (loop->conns == NULL || loop->free_slots == NULL || loop->events == NULL ||
        loop->read_slab == NULL || loop->write_slab == NULL ||
        (n_large > 0 && (loop->large_slab == NULL || loop->free_large == NULL))) {
        snprintf(err, err_len, "out of memory for %d connections", cfg->max_conns);
        cb_netloop_destroy(loop);
        return NULL;
    }
    for (i = 0; i < loop->n_conns; i++) {
        cb_conn *c = &loop->conns[i];
        c->loop = loop;
        c->sock = CB_SOCK_INVALID;
        c->slot = (uint32_t)i;
        c->gen = 1;
        c->state = ST_FREE;
        c->large = -1;
        c->rbuf = loop->read_slab + (size_t)i * cfg->read_buf_size;
        c->wbuf = loop->write_slab + (size_t)i * cfg->write_buf_size;
        loop->free_slots[i] = (uint32_t)(loop->n_conns - 1 - i); /* slot 0 first */
    }
    loop->n_free = loop->n_conns;
    for (i = 0; i < n_large; i++)
        loop->free_large[i] = i;
    loop->n_free_large = n_large;
    build_busy_reply(loop);

    if (cb_net_init() != 0) {
        snprintf(err, err_len, "network initialisation failed");
        cb_netloop_destroy(loop);
        return NULL;
    }
    if (cb_net_listen(cfg->host, cfg->port, cfg->backlog, &loop->listener, err, err_len) != 0) {
        cb_netloop_destroy(loop);
        return NULL;
    }
    loop->port = cb_net_local_port(loop->listener);
    loop->poller = cb_poller_create(loop->max_events);
    if (loop->poller == NULL ||
        cb_poller_add(loop->poller, loop->listener, LISTENER_TAG, CB_POLL_READ) != 0) {
        snprintf(err, err_len, "cannot create the readiness poller");
        cb_netloop_destroy(loop);
        return NULL;
    }
    loop_log(loop, "listening on %s:%d, %d connections + %d spare, %zu MiB of buffers",
             cfg->host ? cfg->host : "0.0.0.0", loop->port, cfg->max_conns, cfg->spare_conns,
             (read_bytes + write_bytes + large_bytes) >> 20);
    return loop;
}

void cb_netloop_destroy(cb_netloop *loop)
{
    int i;
    if (loop == NULL)
        return;
    if (loop->conns != NULL) {
        for (i = 0; i < loop->n_conns; i++) {
            cb_conn *c = &loop->conns[i];
            if (c->state != ST_FREE && loop->free_slots != NULL)
                conn_close(loop, c, 0, NULL);
        }
    }
    if (loop->poller != NULL)
        cb_poller_destroy(loop->poller);
    cb_net_close(loop->listener);
    free(loop->conns);
    free(loop->free_slots);
    free(loop->events);
    free(loop->read_slab);
    free(loop->write_slab);
    free(loop->large_slab);
    free(loop->free_large);
    free(loop);
}
