/* net.h over BSD sockets. Readiness uses epoll on Linux and poll(2)
 * elsewhere (define CB_NET_USE_POLL to force the latter, e.g. to test it). */
#define _GNU_SOURCE /* accept4, SOCK_NONBLOCK, MSG_NOSIGNAL */

#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__) && !defined(CB_NET_USE_POLL)
#define CB_NET_EPOLL 1
#include <sys/epoll.h>
#else
#define CB_NET_EPOLL 0
#include <poll.h>
#endif

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* BSD/macOS: SO_NOSIGPIPE is set per socket instead */
#endif

/* A descriptor held in reserve: when accept() fails with EMFILE the pending
 * connection stays queued and a level-triggered poller would report it
 * forever. Releasing the spare lets us accept and close it. */
static int spare_fd = -1;

int cb_net_init(void)
{
    if (spare_fd < 0)
        spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return 0;
}

int cb_net_fd_room(int want)
{
    struct rlimit lim;
    rlim_t need = (rlim_t)(want > 0 ? want : 0);
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need)
        return want;
    /* Up to the hard limit, not just to want: files the engine opens
     * later need room too. Some kernels refuse RLIM_INFINITY. */
    lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? need : lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need)
        return want;
    return (int)lim.rlim_cur;
}

static int set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return -1;
    return fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ? -1 : 0;
}

static void set_socket_options(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
}

int cb_net_listen(const char *host, int port, int backlog, cb_sock *out,
                  char *err, size_t err_len)
{
    struct sockaddr_storage ss;
    socklen_t ss_len;
    char literal[64];
    int fd, one = 1;

    memset(&ss, 0, sizeof ss);
    if (port < 0 || port > 65535) {
        snprintf(err, err_len, "port %d out of range", port);
        return -1;
    }
    if (host == NULL || host[0] == '\0')
        host = "0.0.0.0";
    else if (strcmp(host, "localhost") == 0)
        host = "127.0.0.1";

    {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        size_t n = strlen(host);
        /* "[::1]" is how URLs write IPv6 hosts; inet_pton wants "::1". */
        if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof literal) {
            memcpy(literal, host + 1, n - 2);
            literal[n - 2] = '\0';
        } else if (n < sizeof literal) {
            memcpy(literal, host, n + 1);
        } else {
            snprintf(err, err_len, "host '%.64s...' is not an IP address", host);
            return -1;
        }
        if (inet_pton(AF_INET, literal, &a4->sin_addr) == 1) {
            a4->sin_family = AF_INET;
            a4->sin_port = htons((uint16_t)port);
            ss_len = sizeof *a4;
        } else if (inet_pton(AF_INET6, literal, &a6->sin6_addr) == 1) {
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons((uint16_t)port);
            ss_len = sizeof *a6;
        } else {
            snprintf(err, err_len,
                     "host '%s' is not an IP address (names other than localhost are not resolved)",
                     host);
            return -1;
        }
    }

    fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return -1;
    }
    /* Restarting the server must not wait out TIME_WAIT of the last run. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, ss_len) < 0) {
        snprintf(err, err_len, "bind %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    if (listen(fd, backlog > 0 ? backlog : 128) < 0 || set_nonblocking(fd) < 0) {
        snprintf(err, err_len, "listen %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    *out = fd;
    return 0;
}

int cb_net_local_port(cb_sock s)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname((int)s, (struct sockaddr *)&ss, &len) < 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

int cb_net_accept(cb_sock listener, cb_sock *out)
{
    for (;;) {
#ifdef __linux__
        int fd = accept4((int)listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
#else
        int fd = accept((int)listener, NULL, NULL);
        if (fd >= 0 && set_nonblocking(fd) < 0) {
            close(fd);
            continue;
        }
#endif
        if (fd >= 0) {
            set_socket_options(fd);
            *out = fd;
            return 0;
        }
        switch (errno) {
        case EINTR:
        case ECONNABORTED: /* the client gave up while queued: next one */
            continue;
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            return CB_NET_AGAIN;
        case EMFILE:
        case ENFILE:
            if (spare_fd >= 0) {
                close(spare_fd);
                fd = accept((int)listener, NULL, NULL);
                if (fd >= 0)
                    close(fd);
                spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                return CB_NET_AGAIN;
            }
            return CB_NET_ERROR;
        default:
            return CB_NET_ERROR;
        }
    }
}

static ptrdiff_t io_error(void)
{
    switch (errno) {
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case EINTR:
        return CB_NET_AGAIN;
    case ECONNRESET:
    case EPIPE:
        return CB_NET_CLOSED;
    default:
        return CB_NET_ERROR;
    }
}

ptrdiff_t cb_net_recv(cb_sock s, void *buf, size_t len)
{
    ssize_t n;
    if (len == 0)
        return 0;
    n = recv((int)s, buf, len, 0);
    if (n > 0)
        return n;
    return n == 0 ? CB_NET_CLOSED : io_error();
}

ptrdiff_t cb_net_send(cb_sock s, const void *buf, size_t len)
{
    ssize_t n;
    if (len == 0)
        return 0;
    n = send((int)s, buf, len, MSG_NOSIGNAL);
    return n >= 0 ? n : io_error();
}

void cb_net_shutdown_write(cb_sock s) { shutdown((int)s, SHUT_WR); }

void cb_net_close(cb_sock s)
{
    if (s != CB_SOCK_INVALID)
        close((int)s);
}

uint64_t cb_net_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- readiness ---- */

#if CB_NET_EPOLL

struct cb_poller {
    int epfd;
    int capacity;
    struct epoll_event *ready; /* [capacity] */
};

cb_poller *cb_poller_create(int capacity)
{
    cb_poller *p;
    if (capacity < 1)
        capacity = 1;
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->capacity = capacity;
    p->ready = calloc((size_t)capacity, sizeof *p->ready);
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (p->ready == NULL || p->epfd < 0) {
        cb_poller_destroy(p);
        return NULL;
    }
    return p;
}

void cb_poller_destroy(cb_poller *p)
{
    if (p == NULL)
        return;
    if (p->epfd >= 0)
        close(p->epfd);
    free(p->ready);
    free(p);
}

static int epoll_apply(cb_poller *p, int op, cb_sock s, uint64_t tag, unsigned interest)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = ((interest & CB_POLL_READ) ? EPOLLIN : 0u) |
                ((interest & CB_POLL_WRITE) ? EPOLLOUT : 0u);
    ev.data.u64 = tag;
    return epoll_ctl(p->epfd, op, (int)s, &ev) < 0 ? -1 : 0;
}

int cb_poller_add(cb_poller *p, cb_sock s, uint64_t tag, unsigned interest)
{
    return epoll_apply(p, EPOLL_CTL_ADD, s, tag, interest);
}

int cb_poller_mod(cb_poller *p, cb_sock s, uint64_t tag, unsigned interest)
{
    return epoll_apply(p, EPOLL_CTL_MOD, s, tag, interest);
}

int cb_poller_del(cb_poller *p, cb_sock s)
{
    struct epoll_event unused; /* kernels before 2.6.9 wanted non-NULL */
    return epoll_ctl(p->epfd, EPOLL_CTL_DEL, (int)s, &unused) < 0 ? -1 : 0;
}

int cb_poller_wait(cb_poller *p, cb_poll_event *events, int max_events, int timeout_ms)
{
    int n, i;
    if (max_events > p->capacity)
        max_events = p->capacity;
    if (max_events < 1)
        return 0;
    n = epoll_wait(p->epfd, p->ready, max_events, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -1;
    for (i = 0; i < n; i++) {
        uint32_t e = p->ready[i].events;
        events[i].tag = p->ready[i].data.u64;
        events[i].events = ((e & EPOLLIN) ? CB_POLL_READ : 0u) |
                           ((e & EPOLLOUT) ? CB_POLL_WRITE : 0u) |
                           ((e & (EPOLLERR | EPOLLHUP)) ? CB_POLL_HANGUP : 0u);
    }
    return n;
}

#else /* poll(2) */

#define CB_POLLFD struct pollfd
#define CB_POLL_SOCKET(s) ((int)(s))
#define CB_POLL_IN_BITS POLLIN
#define CB_POLL_OUT_BITS POLLOUT
#include "poll_table.h"

int cb_poller_wait(cb_poller *p, cb_poll_event *events, int max_events, int timeout_ms)
{
    int n, i, out = 0;
    n = poll(p->fds, (nfds_t)p->count, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -1;
    for (i = 0; i < p->count && out < max_events; i++) {
        short r = p->fds[i].revents;
        if (r == 0)
            continue;
        events[out].tag = p->tags[i];
        events[out].events = ((r & POLLIN) ? CB_POLL_READ : 0u) |
                             ((r & POLLOUT) ? CB_POLL_WRITE : 0u) |
                             ((r & (POLLERR | POLLHUP | POLLNVAL)) ? CB_POLL_HANGUP : 0u);
        out++;
    }
    return out;
}

#endif
