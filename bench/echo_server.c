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
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

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
    const char *unix_path = NULL;
    const char *port_arg = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--unix") == 0 && i + 1 < argc)
            unix_path = argv[++i];
        else if (!port_arg && argv[i][0] != '-')
            port_arg = argv[i];
        else {
            fprintf(stderr, "usage: echo_server PORT [--unix PATH]\n");
            return 2;
        }
    }
    if (!port_arg && !unix_path) {
        fprintf(stderr, "usage: echo_server PORT [--unix PATH]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    int lfd;
    char where[128];
    if (unix_path) {
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        if (strlen(unix_path) >= sizeof(sun.sun_path)) {
            fprintf(stderr, "echo_server: path too long\n");
            return 2;
        }
        strcpy(sun.sun_path, unix_path);
        unlink(unix_path);
        lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
            perror("echo_server: bind");
            return 1;
        }
        snprintf(where, sizeof(where), "%s", unix_path);
    } else {
        struct sockaddr_in sin;
        memset(&sin, 0, sizeof(sin));
        sin.sin_family = AF_INET;
        sin.sin_port = htons((unsigned short)atoi(port_arg));
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
            perror("echo_server: bind");
            return 1;
        }
        socklen_t len = sizeof(sin);
        getsockname(lfd, (struct sockaddr *)&sin, &len);
        snprintf(where, sizeof(where), "%d", ntohs(sin.sin_port));
    }
    if (listen(lfd, 1024) < 0) {
        perror("echo_server: listen");
        return 1;
    }
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
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    break;              /* EAGAIN, or EMFILE & co: retry on the next event */
                if (!unix_path) {
                    int one = 1;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                }
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
