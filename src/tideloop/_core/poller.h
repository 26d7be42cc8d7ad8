/* The polling backend interface.  The loop only knows these functions, so a
 * new backend (io_uring, kqueue) is one new file.  No Python.h here. */
#ifndef TIDELOOP_POLLER_H
#define TIDELOOP_POLLER_H

#include <stdint.h>

#define TL_POLL_READ  1
#define TL_POLL_WRITE 2
/* Report one event, then disable the fd until it is modified again. */
#define TL_POLL_ONESHOT 4

typedef struct tl_poller tl_poller;

typedef struct {
    int fd;
    int mask;          /* TL_POLL_READ | TL_POLL_WRITE */
} tl_poll_event;

/* All functions return -1 and set errno on failure. */
tl_poller *tl_poller_create(void);
void tl_poller_free(tl_poller *p);
/* Close the backend's fds without touching the kernel object's interest list
 * (used in a forked child, where the object is shared with the parent). */
void tl_poller_abandon(tl_poller *p);
int tl_poller_add(tl_poller *p, int fd, int mask);
int tl_poller_modify(tl_poller *p, int fd, int mask);
int tl_poller_remove(tl_poller *p, int fd);
/* Wait up to timeout_ns (-1: forever) and fill at most max events.
 * Returns the number of events; -1 with errno EINTR when interrupted. */
int tl_poller_poll(tl_poller *p, tl_poll_event *out, int max, int64_t timeout_ns);
const char *tl_poller_name(void);

#endif
