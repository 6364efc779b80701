/* The readiness table shared by the poll(2) backend (net_posix.c without
 * epoll) and the WSAPoll one (net_win32.c): a compact array of poll
 * descriptors with a tag each. The including file defines, before including:
 *   CB_POLLFD          the descriptor type (struct pollfd, WSAPOLLFD)
 *   CB_POLL_SOCKET(s)  cb_sock -> that type's fd field
 *   CB_POLL_IN_BITS, CB_POLL_OUT_BITS  the events for read / write interest
 * and then writes cb_poller_wait() itself (the OS calls differ). */
#ifndef CB_POLL_TABLE_H
#define CB_POLL_TABLE_H

#include <stdlib.h>

struct cb_poller {
    int capacity;
    int count;
    CB_POLLFD *fds; /* [capacity], the first `count` in use */
    uint64_t *tags; /* [capacity], parallel to fds */
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
    p->fds = calloc((size_t)capacity, sizeof *p->fds);
    p->tags = calloc((size_t)capacity, sizeof *p->tags);
    if (p->fds == NULL || p->tags == NULL) {
        cb_poller_destroy(p);
        return NULL;
    }
    return p;
}

void cb_poller_destroy(cb_poller *p)
{
    if (p == NULL)
        return;
    free(p->fds);
    free(p->tags);
    free(p);
}

static short poll_mask(unsigned interest)
{
    return (short)(((interest & CB_POLL_READ) ? CB_POLL_IN_BITS : 0) |
                   ((interest & CB_POLL_WRITE) ? CB_POLL_OUT_BITS : 0));
}

static int poll_find(const cb_poller *p, cb_sock s)
{
    int i;
    for (i = 0; i < p->count; i++) {
        if (p->fds[i].fd == CB_POLL_SOCKET(s))
            return i;
    }
    return -1;
}

int cb_poller_add(cb_poller *p, cb_sock s, uint64_t tag, unsigned interest)
{
    if (p->count == p->capacity || poll_find(p, s) >= 0)
        return -1;
    p->fds[p->count].fd = CB_POLL_SOCKET(s);
    p->fds[p->count].events = poll_mask(interest);
    p->fds[p->count].revents = 0;
    p->tags[p->count] = tag;
    p->count++;
    return 0;
}

int cb_poller_mod(cb_poller *p, cb_sock s, uint64_t tag, unsigned interest)
{
    int i = poll_find(p, s);
    if (i < 0)
        return -1;
    p->fds[i].events = poll_mask(interest);
    p->tags[i] = tag;
    return 0;
}

int cb_poller_del(cb_poller *p, cb_sock s)
{
    int i = poll_find(p, s);
    if (i < 0)
        return -1;
    p->count--;
    p->fds[i] = p->fds[p->count];
    p->tags[i] = p->tags[p->count];
    return 0;
}

#endif
