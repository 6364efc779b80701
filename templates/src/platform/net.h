/* Sockets, readiness and the loop's clock: the only interface that knows
 * the operating system's network API. net_posix.c implements it with BSD
 * sockets and epoll (Linux) or poll(2) (other POSIX systems); a net_win32.c
 * with Winsock and WSAPoll can replace it without touching its users.
 *
 * Every socket is non-blocking. Calls return a count or one of the
 * CB_NET_* codes below; errno is never part of the interface. */
#ifndef CB_NET_H
#define CB_NET_H

#include <stddef.h>
#include <stdint.h>

/* The printf archetype for __attribute__((format)) checks of the C
 * runtime's printf; the build sets gnu_printf where MinGW's C99 stdio is used. */
#ifndef CB_PRINTF_FORMAT
#define CB_PRINTF_FORMAT printf
#endif

/* Wide enough for a Winsock SOCKET (UINT_PTR) as well as a POSIX fd. */
typedef intptr_t cb_sock;
#define CB_SOCK_INVALID ((cb_sock)-1)

#define CB_NET_AGAIN (-1)  /* would block: wait for readiness */
#define CB_NET_CLOSED (-2) /* the peer closed its side (recv) or reset */
#define CB_NET_ERROR (-3)  /* anything else; close the socket */

/* Once per process, before any other call (WSAStartup on Windows). 0 on
 * success. */
int cb_net_init(void);

/* Listens on host:port with SO_REUSEADDR. host: an IPv4 dotted quad, an
 * IPv6 literal (brackets allowed), "localhost" (127.0.0.1), or NULL/""
 * (0.0.0.0). Names are not resolved: the server links glibc statically,
 * where getaddrinfo is unusable. port 0 picks a free port; read it back
 * with cb_net_local_port(). Returns 0, or -1 with a message in err. */
int cb_net_listen(const char *host, int port, int backlog, cb_sock *out,
                  char *err, size_t err_len);

/* Port the socket is bound to, or -1. */
int cb_net_local_port(cb_sock s);

/* Accepts one pending connection as a non-blocking socket with Nagle off
 * (streamed tokens must leave at once). Returns 0, CB_NET_AGAIN when none
 * is pending, or CB_NET_ERROR. When the process is out of descriptors the
 * pending connection is refused (accepted and closed) rather than left to
 * wake the poller forever. */
int cb_net_accept(cb_sock listener, cb_sock *out);

/* > 0: bytes moved. recv: CB_NET_CLOSED at end of stream. send never raises
 * SIGPIPE; a reset peer gives CB_NET_CLOSED. len 0 returns 0. */
ptrdiff_t cb_net_recv(cb_sock s, void *buf, size_t len);
ptrdiff_t cb_net_send(cb_sock s, const void *buf, size_t len);

/* Sends FIN but keeps reading (to close politely after an error reply). */
void cb_net_shutdown_write(cb_sock s);
void cb_net_close(cb_sock s);

/* Makes room for `want` open descriptors (sockets and files): raises the
 * soft limit (RLIMIT_NOFILE) up to the hard one when it is lower. Returns
 * how many the process may now hold, at most want. */
int cb_net_fd_room(int want);

/* Monotonic milliseconds, for deadlines. */
uint64_t cb_net_now_ms(void);

/* ---- readiness ---- */

/* Interest and event bits. CB_POLL_HANGUP is reported, never requested:
 * the connection is gone or failed. */
enum { CB_POLL_READ = 1, CB_POLL_WRITE = 2, CB_POLL_HANGUP = 4 };

typedef struct {
    uint64_t tag;    /* the caller's tag given to cb_poller_add() */
    unsigned events; /* CB_POLL_* */
} cb_poll_event;

typedef struct cb_poller cb_poller;

/* Allocates a poller for up to `capacity` sockets (allocation happens only
 * here). NULL on failure. */
cb_poller *cb_poller_create(int capacity);
void cb_poller_destroy(cb_poller *p);

/* Level-triggered interest in CB_POLL_READ / CB_POLL_WRITE (0 allowed).
 * Each returns 0 or -1. */
int cb_poller_add(cb_poller *p, cb_sock s, uint64_t tag, unsigned interest);
int cb_poller_mod(cb_poller *p, cb_sock s, uint64_t tag, unsigned interest);
int cb_poller_del(cb_poller *p, cb_sock s);

/* Waits up to timeout_ms (-1: no limit, 0: just look) and fills up to
 * max_events events. Returns their number (0 on timeout or a signal), or -1
 * when the poller itself failed. */
int cb_poller_wait(cb_poller *p, cb_poll_event *events, int max_events, int timeout_ms);

#endif
