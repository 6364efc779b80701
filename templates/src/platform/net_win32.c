/* net.h over Winsock 2, readiness with WSAPoll (Windows Vista and later;
 * runs under wine). Links ws2_32 only. */
#define WIN32_LEAN_AND_MEAN
#ifndef _WIN32_WINNT
#define _WIN32_WINNT 0x0601 /* WSAPoll, inet_pton, GetTickCount64 */
#endif
#include "net.h"

#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cb_net_init(void)
{
    static int started;
    WSADATA wsa;
    if (started)
        return 0;
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0)
        return -1;
    started = 1;
    return 0;
}

static const char *wsa_error(int code, char *buf, size_t len)
{
    DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL,
                             (DWORD)code, MAKELANGID(LANG_ENGLISH, SUBLANG_DEFAULT), buf, (DWORD)len,
                             NULL);
    if (n == 0)
        snprintf(buf, len, "Winsock error %d", code);
    else
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == '.'))
            buf[--n] = 0;
    return buf;
}

/* Non-blocking, not inherited by child processes, Nagle off for clients. */
static int prepare_socket(SOCKET s, int is_client)
{
    u_long on = 1;
    int one = 1;
    SetHandleInformation((HANDLE)s, HANDLE_FLAG_INHERIT, 0);
    if (is_client)
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, (const char *)&one, sizeof one);
    return ioctlsocket(s, FIONBIO, &on) == 0 ? 0 : -1;
}

int cb_net_listen(const char *host, int port, int backlog, cb_sock *out,
                  char *err, size_t err_len)
{
    struct sockaddr_storage ss;
    int ss_len, one = 1;
    char literal[64], why[256];
    SOCKET s;

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
            a4->sin_port = htons((u_short)port);
            ss_len = sizeof *a4;
        } else if (inet_pton(AF_INET6, literal, &a6->sin6_addr) == 1) {
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons((u_short)port);
            ss_len = sizeof *a6;
        } else {
            snprintf(err, err_len,
                     "host '%s' is not an IP address (names other than localhost are not resolved)",
                     host);
            return -1;
        }
    }

    s = socket(ss.ss_family, SOCK_STREAM, IPPROTO_TCP);
    if (s == INVALID_SOCKET) {
        snprintf(err, err_len, "socket: %s", wsa_error(WSAGetLastError(), why, sizeof why));
        return -1;
    }
    /* Windows' SO_REUSEADDR would let another process steal the port; the
     * exclusive flag is the safe default, and a restart is not held up by
     * TIME_WAIT on Windows anyway. */
    setsockopt(s, SOL_SOCKET, SO_EXCLUSIVEADDRUSE, (const char *)&one, sizeof one);
    if (bind(s, (struct sockaddr *)&ss, ss_len) == SOCKET_ERROR) {
        snprintf(err, err_len, "bind %s:%d: %s", host, port, wsa_error(WSAGetLastError(), why, sizeof why));
        closesocket(s);
        return -1;
    }
    if (listen(s, backlog > 0 ? backlog : 128) == SOCKET_ERROR || prepare_socket(s, 0) < 0) {
        snprintf(err, err_len, "listen %s:%d: %s", host, port, wsa_error(WSAGetLastError(), why, sizeof why));
        closesocket(s);
        return -1;
    }
    *out = (cb_sock)s;
    return 0;
}

int cb_net_local_port(cb_sock s)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (getsockname((SOCKET)s, (struct sockaddr *)&ss, &len) == SOCKET_ERROR)
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
        SOCKET s = accept((SOCKET)listener, NULL, NULL);
        if (s != INVALID_SOCKET) {
            if (prepare_socket(s, 1) < 0) {
                closesocket(s);
                continue;
            }
            *out = (cb_sock)s;
            return 0;
        }
        switch (WSAGetLastError()) {
        case WSAEINTR:
        case WSAECONNRESET: /* the client gave up while queued: next one */
            continue;
        case WSAEWOULDBLOCK:
            return CB_NET_AGAIN;
        default: /* WSAEMFILE / WSAENOBUFS: Windows has no descriptor limit to work around */
            return CB_NET_ERROR;
        }
    }
}

static ptrdiff_t io_error(void)
{
    switch (WSAGetLastError()) {
    case WSAEWOULDBLOCK:
    case WSAEINTR:
        return CB_NET_AGAIN;
    case WSAECONNRESET:
    case WSAECONNABORTED:
    case WSAENETRESET:
    case WSAESHUTDOWN:
        return CB_NET_CLOSED;
    default:
        return CB_NET_ERROR;
    }
}

/* Winsock counts in int: larger requests are cut to INT_MAX (a short read
 * or write, which callers handle anyway). */
static int clamp_len(size_t len) { return len > 0x7fffffff ? 0x7fffffff : (int)len; }

ptrdiff_t cb_net_recv(cb_sock s, void *buf, size_t len)
{
    int n;
    if (len == 0)
        return 0;
    n = recv((SOCKET)s, (char *)buf, clamp_len(len), 0);
    if (n > 0)
        return n;
    return n == 0 ? CB_NET_CLOSED : io_error();
}

ptrdiff_t cb_net_send(cb_sock s, const void *buf, size_t len)
{
    int n;
    if (len == 0)
        return 0;
    n = send((SOCKET)s, (const char *)buf, clamp_len(len), 0); /* Windows has no SIGPIPE */
    return n >= 0 ? n : io_error();
}

void cb_net_shutdown_write(cb_sock s) { shutdown((SOCKET)s, SD_SEND); }

void cb_net_close(cb_sock s)
{
    if (s != CB_SOCK_INVALID)
        closesocket((SOCKET)s);
}

/* Winsock sockets are kernel handles with no per-process count to raise. */
int cb_net_fd_room(int want) { return want; }

uint64_t cb_net_now_ms(void) { return GetTickCount64(); }

/* ---- readiness: WSAPoll over a compact array, like the poll(2) variant ---- */

/* WSAPoll rejects POLLPRI and friends: only the normal-data bits. */
#define CB_POLLFD WSAPOLLFD
#define CB_POLL_SOCKET(s) ((SOCKET)(s))
#define CB_POLL_IN_BITS POLLRDNORM
#define CB_POLL_OUT_BITS POLLWRNORM
#include "poll_table.h"

int cb_poller_wait(cb_poller *p, cb_poll_event *events, int max_events, int timeout_ms)
{
    int n, i, out = 0;
    if (p->count == 0) { /* WSAPoll fails on an empty set: just wait */
        if (timeout_ms != 0)
            Sleep(timeout_ms < 0 ? INFINITE : (DWORD)timeout_ms);
        return 0;
    }
    n = WSAPoll(p->fds, (ULONG)p->count, timeout_ms);
    if (n == SOCKET_ERROR)
        return WSAGetLastError() == WSAEINTR ? 0 : -1;
    for (i = 0; i < p->count && out < max_events; i++) {
        SHORT r = p->fds[i].revents;
        if (r == 0)
            continue;
        events[out].tag = p->tags[i];
        events[out].events = ((r & POLLRDNORM) ? CB_POLL_READ : 0u) |
                             ((r & POLLWRNORM) ? CB_POLL_WRITE : 0u) |
                             ((r & (POLLERR | POLLHUP | POLLNVAL)) ? CB_POLL_HANGUP : 0u);
        out++;
    }
    return out;
}
