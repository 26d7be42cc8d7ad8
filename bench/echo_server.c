/*
 * echo_server: the reference floor for the network benchmark.
 *
 *   echo_server PORT [--unix PATH]
 *
 * A minimal single-threaded epoll echo server in C: non-blocking sockets,
 * level-triggered epoll, TCP_NODELAY on accepted connections.  Each readable
 * connection is read into a 256 KiB per-connection buffer and the bytes are
 * written back; when the socket does not take them all, the rest stays in the
 * buffer, reading stops (EPOLLIN off) and EPOLLOUT waits until it is drained.
 * This is what an event loop must do for an echo at the least, with no
 * Python on the path: the Python loops are measured against it.
 *
 * Listens on 127.0.0.1:PORT (PORT 0 picks a free port) or on the Unix socket
 * PATH, then prints "READY <port>" (or "READY <path>") on stdout.  Runs until
 * killed (SIGTERM / SIGINT).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/epoll.h>

#include "loadgen_common.h"

#define BUF_SIZE (256 * 1024)

struct conn {
    int fd;
    size_t len;         /* bytes in buf not yet written back */
    size_t off;         /* of which the first off were written */
    unsigned char buf[BUF_SIZE];
};

static int epfd;

static void conn_close(struct conn *c)
{
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c);
}

static void conn_events(struct conn *c, uint32_t events)
{
    struct epoll_event ev;
    ev.events = events;
    ev.data.ptr = c;
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Write the pending bytes; 1 if all went out, 0 if some remain, -1 on error. */
static int conn_flush(struct conn *c)
{
    while (c->off < c->len) {
        ssize_t n = send(c->fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (n > 0) {
            c->off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return -1;
    }
    c->off = c->len = 0;
    return 1;
}

static void on_conn(struct conn *c, uint32_t events)
{
    if (c->len) {                       /* waiting for EPOLLOUT */
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int r = conn_flush(c);
        if (r < 0) {
            conn_close(c);
            return;
        }
        if (r == 0)
            return;
        conn_events(c, EPOLLIN);        /* drained: read again */
        return;
    }
    for (;;) {
        ssize_t n = recv(c->fd, c->buf, BUF_SIZE, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {                   /* EOF or error */
            conn_close(c);
            return;
        }
        c->len = (size_t)n;
        c->off = 0;
        int r = conn_flush(c);
        if (r < 0) {
            conn_close(c);
            return;
        }
        if (r == 0) {
            conn_events(c, EPOLLOUT);   /* stop reading until the echo is out */
            return;
        }
        if ((size_t)n < BUF_SIZE)
            return;                     /* level-triggered: more comes as an event */
    }
}

int main(int argc, char **argv)
{
    static const struct lg_usage usage = {"echo_server", "usage: echo_server PORT [--unix PATH]\n"};
    const char *unix_path = NULL;
    const char *port_arg = NULL;
    const struct lg_opt opts[] = {{"--unix", LG_STRING, &unix_path}, {NULL, LG_FLAG, NULL}};
    lg_parse_args(argc, argv, opts, &port_arg, 1, &usage);
    if (!port_arg && !unix_path)
        lg_die_usage(&usage, NULL);
    signal(SIGPIPE, SIG_IGN);

    char where[128];
    int lfd = lg_listen("echo_server", port_arg, unix_path, where, sizeof(where));
    if (lfd < 0)
        return lfd == -2 ? 2 : 1;
    epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev;
    ev.events = EPOLLIN;
    ev.data.ptr = NULL;                 /* NULL marks the listening socket */
    epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev);

    printf("READY %s\n", where);
    fflush(stdout);

    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(epfd, events, 256, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("echo_server: epoll_wait");
            return 1;
        }
        for (int k = 0; k < n; k++) {
            if (events[k].data.ptr) {
                on_conn(events[k].data.ptr, events[k].events);
                continue;
            }
            for (;;) {
                int fd = lg_accept(lfd, unix_path != NULL);
                if (fd < 0)
                    break;              /* EAGAIN, or EMFILE & co: retry on the next event */
                struct conn *c = malloc(sizeof(*c));
                if (!c) {
                    close(fd);
                    continue;
                }
                c->fd = fd;
                c->len = c->off = 0;
                ev.events = EPOLLIN;
                ev.data.ptr = c;
                epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
            }
        }
    }
}
