/* epoll backend.  Level-triggered, like asyncio's EpollSelector. */
#define _GNU_SOURCE
#include "poller.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EVBUF 256

struct tl_poller {
    int epfd;
    int have_pwait2;   /* epoll_pwait2 gives ns timeouts; older kernels lack it */
    struct epoll_event evbuf[EVBUF];
};

tl_poller *
tl_poller_create(void)
{
    tl_poller *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (p->epfd < 0) {
        int e = errno;
        free(p);
        errno = e;
        return NULL;
    }
    p->have_pwait2 = 1;
    return p;
}

void
tl_poller_free(tl_poller *p)
{
    if (p == NULL)
        return;
    if (p->epfd >= 0)
        close(p->epfd);
    free(p);
}

void
tl_poller_abandon(tl_poller *p)
{
    tl_poller_free(p);
}

static uint32_t
to_epoll(int mask)
{
    uint32_t ev = 0;
    if (mask & TL_POLL_READ)
        ev |= EPOLLIN;
    if (mask & TL_POLL_WRITE)
        ev |= EPOLLOUT;
    if (mask & TL_POLL_ONESHOT)
        ev |= EPOLLONESHOT;
    return ev;
}

int
tl_poller_add(tl_poller *p, int fd, int mask)
{
    struct epoll_event ev = {.events = to_epoll(mask), .data.fd = fd};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) == 0)
        return 0;
    if (errno == EEXIST)   /* a stale registration of a reused fd number */
        return epoll_ctl(p->epfd, EPOLL_CTL_MOD, fd, &ev);
    return -1;
}

int
tl_poller_modify(tl_poller *p, int fd, int mask)
{
    struct epoll_event ev = {.events = to_epoll(mask), .data.fd = fd};
    if (epoll_ctl(p->epfd, EPOLL_CTL_MOD, fd, &ev) == 0)
        return 0;
    if (errno == ENOENT)   /* the fd was closed and reopened behind our back */
        return epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev);
    return -1;
}

int
tl_poller_remove(tl_poller *p, int fd)
{
    struct epoll_event ev = {0};
    if (epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, &ev) == 0)
        return 0;
    /* Already gone from the interest list (closed fd): nothing to undo. */
    if (errno == ENOENT || errno == EBADF)
        return 0;
    return -1;
}

int
tl_poller_poll(tl_poller *p, tl_poll_event *out, int max, int64_t timeout_ns)
{
    if (max > EVBUF)
        max = EVBUF;
    if (max < 1)
        max = 1;
    int n = -1;
#ifdef SYS_epoll_pwait2
    if (p->have_pwait2) {
        struct timespec ts, *tsp = NULL;
        if (timeout_ns >= 0) {
            ts.tv_sec = timeout_ns / 1000000000;
            ts.tv_nsec = timeout_ns % 1000000000;
            tsp = &ts;
        }
        /* The raw system call: glibc's wrapper is a 2.35 symbol, and the
         * only one that would keep the wheel from manylinux_2_34 (the
         * kernel's support is probed at run time anyway).  On 64-bit
         * Linux, struct timespec is the kernel's. */
        n = (int)syscall(SYS_epoll_pwait2, p->epfd, p->evbuf, max, tsp, NULL, (size_t)0);
        if (n < 0 && errno == ENOSYS)
            p->have_pwait2 = 0;
        else
            goto done;
    }
#endif
    {
        int ms;
        if (timeout_ns < 0)
            ms = -1;
        else if (timeout_ns > (int64_t)2000000000 * 1000000)
            ms = 2000000000;
        else    /* round up, so a timer never wakes us early */
            ms = (int)((timeout_ns + 999999) / 1000000);
        n = epoll_wait(p->epfd, p->evbuf, max, ms);
    }
#ifdef SYS_epoll_pwait2
done:
#endif
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        uint32_t e = p->evbuf[i].events;
        int mask = 0;
        /* Same mapping as selectors.EpollSelector: errors and hangups wake
         * both directions so that the callback sees the failure. */
        if (e & ~(uint32_t)EPOLLOUT)
            mask |= TL_POLL_READ;
        if (e & ~(uint32_t)EPOLLIN)
            mask |= TL_POLL_WRITE;
        out[i].fd = p->evbuf[i].data.fd;
        out[i].mask = mask;
    }
    return n;
}

const char *
tl_poller_name(void)
{
    return "epoll";
}
