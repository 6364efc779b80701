/* Single-threaded HTTP/1.1 connection loop over platform/net.h.
 *
 * The caller owns the thread: it calls cb_netloop_poll() for one round of
 * network work, runs a compute step, and repeats. Complete requests are
 * handed to on_request(); the application answers at once or in a later
 * round, by connection handle.
 *
 * Memory is fixed at cb_netloop_create() and nothing is allocated later:
 *   per connection  read_buf_size  : the request head, the body when it fits
 *                                    after the head, and pipelined bytes;
 *                   write_buf_size : the response being sent (a response
 *                                    must fit; a stream is sent piece by
 *                                    piece, so only the unsent part counts);
 *   shared          large_body_buffers x max_body_size : a body too large for
 *                                    the read buffer borrows one of these
 *                                    while it arrives and gives it back when
 *                                    on_request() returns. None free: 503.
 * Total = (max_conns + spare_conns) * (read_buf_size + write_buf_size)
 *       + large_body_buffers * max_body_size.
 *
 * A full table: a new client first takes the place of the longest-idle
 * connection that has no byte of a request (kept alive, or opened over a
 * second ago and silent), which is closed. When every connection is busy, the client gets
 * one of spare_conns spare entries: there a request for spare_path (GET or
 * HEAD, e.g. /health) is served and any other gets 503 with Retry-After,
 * and the connection is closed after the answer. With the spares taken too,
 * the client gets 503 at once.
 *
 * Requests on one connection are handled one at a time: the next pipelined
 * request is parsed only after the previous response has been sent.
 *
 * Streams (server-sent events) use chunked transfer encoding, so the
 * connection stays usable afterwards; an HTTP/1.0 client gets the stream
 * delimited by closing the connection instead.
 *
 * Time limits: a request (head and body) must arrive within
 * request_timeout_ms of its first byte (of the connection's opening for a
 * new one); a kept-alive connection may wait idle_timeout_ms for the next
 * request; pending response bytes must make progress every
 * write_timeout_ms. A request only partly received when its time is up is
 * answered 408 and the connection closed; an idle connection (no byte of a
 * request) and a stalled writer are closed without reply. */
#ifndef CB_NETLOOP_H
#define CB_NETLOOP_H

#include <stddef.h>
#include <stdint.h>

#include "http.h"

typedef struct cb_netloop cb_netloop;
typedef struct cb_conn cb_conn;

/* generation << 32 | slot. Stays unique for the loop's life in practice
 * (a slot is reused with a new generation); 0 is never a valid handle. */
typedef uint64_t cb_conn_id;

/* A complete request. req, body and the buffers they point into are valid
 * only during the call: copy what outlives it. body is never NULL. */
typedef void (*cb_on_request_fn)(void *app, cb_conn *c, const cb_http_request *req,
                                 const char *body, size_t body_len);

/* The loop closed a connection (peer left, error, time limit, or the end of
 * a "Connection: close" exchange); the handle is already dead. Not called
 * for cb_conn_close() or cb_netloop_destroy(). */
typedef void (*cb_on_close_fn)(void *app, cb_conn_id id);

typedef struct {
    const char *host;         /* see cb_net_listen(); default "127.0.0.1" */
    int port;                 /* 0: any free port; default 8080 */
    int backlog;              /* default 128 */
    int max_conns;            /* connection slots; default 256 */
    int spare_conns;          /* entries past max_conns for clients of a
                                 full table (see above); default 8 */
    const char *spare_path;   /* the path a spare entry serves; NULL: none */
    size_t read_buf_size;     /* per connection; default 64 KiB */
    size_t write_buf_size;    /* per connection; default 128 KiB */
    size_t max_header_size;   /* <= read_buf_size; default 16 KiB, over: 431 */
    size_t max_body_size;     /* default 1 MiB, over: 413 */
    int large_body_buffers;   /* default 4 (unused when bodies fit the read
                                 buffer) */
    int request_timeout_ms;   /* default 10000; 0: none */
    int idle_timeout_ms;      /* default 30000; 0: none */
    int write_timeout_ms;     /* default 30000; 0: none */
    int verbose;              /* log connection events to stderr */
    void *app;                /* first argument of the callbacks */
    cb_on_request_fn on_request;
    cb_on_close_fn on_close;  /* may be NULL */
} cb_netloop_config;

void cb_netloop_config_init(cb_netloop_config *cfg);

/* Binds, listens and allocates everything. NULL with a message in err. */
cb_netloop *cb_netloop_create(const cb_netloop_config *cfg, char *err, size_t err_len);
/* Closes every connection and the listener and frees the memory. */
void cb_netloop_destroy(cb_netloop *loop);

/* The bound port (the one picked when the configured port was 0). */
int cb_netloop_port(const cb_netloop *loop);
/* Bytes cb_netloop_create allocated; *per_conn: each connection's share
 * (its read and write buffers), *large: the buffers of bodies too large
 * for a connection's read buffer. */
size_t cb_netloop_bytes(const cb_netloop *loop, size_t *per_conn, size_t *large);
/* Connections it serves at once (max_conns + spare_conns). */
int cb_netloop_conns(const cb_netloop *loop);
/* Open connections (spare entries included). */
int cb_netloop_active(const cb_netloop *loop);
/* Connections with response bytes not yet sent (for a graceful exit). */
int cb_netloop_unsent(const cb_netloop *loop);

/* One round: accept, read, write, enforce time limits, call back. Waits at
 * most timeout_ms (0: do not wait, -1: until something happens) for the
 * network. Returns the number of network events handled, or -1 when the
 * poller failed. Must not be called from inside a callback. */
int cb_netloop_poll(cb_netloop *loop, int timeout_ms);

/* Handles. */
cb_conn_id cb_conn_handle(const cb_conn *c);
int cb_conn_alive(const cb_netloop *loop, cb_conn_id id);
/* The live connection behind a handle, or NULL once it has closed. */
cb_conn *cb_netloop_conn(cb_netloop *loop, cb_conn_id id);

/* Answers. Each returns CB_CONN_OK or a CB_CONN_ERR_* code; none blocks.
 * Sending starts at once and continues in later cb_netloop_poll() rounds. */
#define CB_CONN_OK 0
#define CB_CONN_ERR_STATE (-1) /* no request waiting for this kind of answer */
#define CB_CONN_ERR_FULL (-2)  /* does not fit the write buffer (now) */

/* A complete response with Content-Length. content_type may be NULL.
 * extra_headers: NULL or whole lines, e.g. "X-Request-Id: 7\r\n". A
 * response that cannot fit the write buffer fails with CB_CONN_ERR_FULL and
 * leaves the request waiting, so a smaller (error) answer can follow. */
int cb_conn_respond(cb_conn *c, int status, const char *content_type, const char *body,
                    size_t len, const char *extra_headers);

/* An OpenAI-shaped error: {"error":{"message":..., "type":..., "param":null,
 * "code":null}}. type NULL: "server_error" for 5xx, else
 * "invalid_request_error". */
int cb_conn_respond_error(cb_conn *c, int status, const char *type, const char *message);

/* Streaming: begin once, write pieces, end once. stream_write is all or
 * nothing: CB_CONN_ERR_FULL means the client reads slower than we write;
 * retry the same piece after a later poll (cb_conn_write_space() tells how
 * much fits) or give up with cb_conn_close(). stream_end always fits. */
int cb_conn_stream_begin(cb_conn *c, int status, const char *content_type);
int cb_conn_stream_write(cb_conn *c, const char *data, size_t len);
int cb_conn_stream_end(cb_conn *c);
/* Largest piece cb_conn_stream_write() would take now. */
size_t cb_conn_write_space(const cb_conn *c);

/* Header lines (e.g. "Access-Control-Allow-Origin: *\r\n") added to every
 * answer to the request being handled, streams included; copied (at most
 * CB_CONN_HEADER_BYTES - 1 bytes, else none). Cleared when the next
 * request arrives. */
#define CB_CONN_HEADER_BYTES 512
void cb_conn_set_headers(cb_conn *c, const char *lines);

/* Drops the connection now, unsent bytes included. on_close is not called. */
void cb_conn_close(cb_conn *c);

#endif
