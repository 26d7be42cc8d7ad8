/*
 * loadgen: a closed-loop echo load generator (C, epoll, one thread).
 *
 *   loadgen HOST PORT --conns N --size BYTES --duration SECONDS
 *           [--warmup SECONDS] [--unix PATH] [--hold]
 *
 * Opens N connections to an echo server on the loopback interface (or to the
 * Unix socket PATH).  Each connection sends one message of SIZE bytes, reads
 * SIZE bytes back, checks them, and only then sends the next one: one request
 * outstanding per connection (closed loop).  Messages differ from one request
 * to the next (a window into a fixed pseudo-random pattern, at an offset that
 * moves with every request), so a stale, reordered, duplicated or truncated
 * echo is counted in "errors".
 *
 * Output on stdout:
 *   "START"             once the warm-up is over and the measured window begins
 *                       (the driver reads the server's CPU time at this line);
 *   one line of JSON    at the end: requests, seconds, rps, bytes, errors,
 *                       latency p50/p99/max (microseconds, completed requests
 *                       of the window), the client's own CPU seconds.
 * Requests completed during the warm-up are not counted.  At the end of the
 * window no new request is started; requests in flight are abandoned.
 *
 * --hold: after printing the JSON line, keep the connections open until stdin
 * reaches EOF, so that the server's CPU time can be read before it handles
 * the closing of N connections.
 *
 * Exit status: 0 when the run completed without errors, 1 when errors were
 * counted (the JSON line is printed anyway), 2 on usage / connect failures.
 * Loopback only: HOST must be a 127.0.0.0/8 address, ::1 or "localhost".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>

#include "loadgen_common.h"

struct conn {
    uint32_t id;
    int fd;
    int alive;
    int want_out;                 /* EPOLLOUT registered */
    uint64_t seq;                 /* request number on this connection */
    size_t offset;                /* where this request's bytes start in the pattern */
    size_t sent;                  /* bytes of the current request sent */
    size_t received;              /* bytes of the current request received */
    int mismatch;                 /* current request already had a bad byte */
    int64_t started_ns;           /* when the current request was started */
};

static unsigned char *pattern;    /* size + PATTERN_PERIOD bytes */
static unsigned char *scratch;
static size_t scratch_size;
static size_t msg_size;

static struct lg_latencies lat;  /* completed requests of the window */

static const struct lg_usage usage = {
    "loadgen",
    "usage: loadgen HOST PORT --conns N --size BYTES --duration SECONDS\n"
    "               [--warmup SECONDS] [--unix PATH] [--hold]\n",
};

static int open_conn(int family, const void *addr, long port, const char *unix_path)
{
    struct sockaddr_storage ss;
    socklen_t len = lg_sockaddr(&ss, family, addr, port, unix_path);
    if (!len)
        return -1;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    /* Blocking connect: on loopback it completes (or fails) at once. */
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!unix_path)
        lg_nodelay(fd);
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return fd;
}

static int epfd;
static uint64_t errors;

static void set_out(struct conn *c, int on)
{
    if (c->want_out == on)
        return;
    struct epoll_event ev;
    ev.events = EPOLLIN | (on ? EPOLLOUT : 0);
    ev.data.ptr = c;
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = on;
}

static void kill_conn(struct conn *c)
{
    if (!c->alive)
        return;
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->alive = 0;
}

/* Send as much of the current request as the socket takes. */
static void pump_out(struct conn *c)
{
    while (c->sent < msg_size) {
        ssize_t n = send(c->fd, pattern + c->offset + c->sent, msg_size - c->sent,
                         MSG_NOSIGNAL);
        if (n > 0) {
            c->sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_out(c, 1);
            return;
        }
        errors++;               /* EPIPE, ECONNRESET, ... */
        kill_conn(c);
        return;
    }
    set_out(c, 0);
}

static void start_request(struct conn *c, int64_t t)
{
    c->seq++;
    c->offset = (size_t)((c->seq * 7919u + c->id) % PATTERN_PERIOD);
    c->sent = 0;
    c->received = 0;
    c->mismatch = 0;
    c->started_ns = t;
    pump_out(c);
}

int main(int argc, char **argv)
{
    const char *unix_path = NULL;
    const char *pos[2] = {NULL, NULL};      /* HOST PORT */
    long conns = -1;
    long long size = -1;
    double duration = -1, warmup = 0;
    int hold = 0;
    const struct lg_opt opts[] = {
        {"--conns", LG_LONG, &conns}, {"--size", LG_LLONG, &size},
        {"--duration", LG_DOUBLE, &duration}, {"--warmup", LG_DOUBLE, &warmup},
        {"--unix", LG_STRING, &unix_path}, {"--hold", LG_FLAG, &hold}, {NULL, LG_FLAG, NULL},
    };
    lg_parse_args(argc, argv, opts, pos, 2, &usage);
    const char *host = pos[0];
    long port = pos[1] ? strtol(pos[1], NULL, 10) : -1;
    if (!host || port < 0 || conns <= 0 || size <= 0 || duration <= 0 || warmup < 0)
        lg_die_usage(&usage, "HOST, PORT, --conns, --size and --duration are required");
    if (port > 65535 || conns > 100000 || size > (1LL << 30) || duration > 3600)
        lg_die_usage(&usage, "argument out of range");

    int family = AF_INET;
    unsigned char addr[16];
    if (!unix_path && !lg_loopback(host, &family, addr))
        lg_die_usage(&usage, "HOST must be a loopback address (127.0.0.0/8, ::1, localhost)");

    signal(SIGPIPE, SIG_IGN);
    msg_size = (size_t)size;

    /* The pattern: xorshift bytes; request k of connection c is the window
     * [offset, offset + size) with offset moving by a prime each request. */
    pattern = lg_make_pattern(msg_size + PATTERN_PERIOD);
    scratch_size = msg_size < 262144 ? msg_size : 262144;
    scratch = malloc(scratch_size);
    struct conn *cs = calloc((size_t)conns, sizeof(*cs));
    if (!pattern || !scratch || !cs) {
        fprintf(stderr, "loadgen: out of memory\n");
        return 2;
    }
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) {
        perror("loadgen: epoll_create1");
        return 2;
    }
    for (long i = 0; i < conns; i++) {
        int fd = open_conn(family, addr, port, unix_path);
        if (fd < 0) {
            fprintf(stderr, "loadgen: connect #%ld to %s: %s\n", i,
                    unix_path ? unix_path : host, strerror(errno));
            return 2;
        }
        cs[i].id = (uint32_t)i;
        cs[i].fd = fd;
        cs[i].alive = 1;
        struct epoll_event ev;
        ev.events = EPOLLIN;
        ev.data.ptr = &cs[i];
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            perror("loadgen: epoll_ctl");
            return 2;
        }
    }

    int64_t t_begin = lg_now_ns();
    int64_t t_window = t_begin + (int64_t)(warmup * 1e9);
    int64_t t_end = t_window + (int64_t)(duration * 1e9);
    int measuring = warmup <= 0;
    int64_t t_measure = t_begin;
    uint64_t requests = 0, errors_at_window = 0;
    struct rusage ru0;

    if (measuring) {
        fputs("START\n", stdout);
        fflush(stdout);
    }
    getrusage(RUSAGE_SELF, &ru0);
    for (long i = 0; i < conns; i++)
        start_request(&cs[i], t_begin);

    struct epoll_event events[256];
    int64_t t = lg_now_ns();
    while (t < t_end) {
        if (!measuring && t >= t_window) {
            measuring = 1;
            t_measure = t;
            errors_at_window = errors;
            getrusage(RUSAGE_SELF, &ru0);
            fputs("START\n", stdout);
            fflush(stdout);
        }
        int64_t until = measuring ? t_end : t_window;
        int timeout_ms = (int)((until - t + 999999) / 1000000);
        if (timeout_ms < 0)
            timeout_ms = 0;
        int n = epoll_wait(epfd, events, 256, timeout_ms);
        if (n < 0) {
            if (errno == EINTR)
                n = 0;
            else {
                perror("loadgen: epoll_wait");
                return 2;
            }
        }
        t = lg_now_ns();
        for (int k = 0; k < n; k++) {
            struct conn *c = events[k].data.ptr;
            if (!c->alive)
                continue;
            uint32_t ev = events[k].events;
            if (ev & EPOLLOUT)
                pump_out(c);
            if (!c->alive || !(ev & (EPOLLIN | EPOLLERR | EPOLLHUP)))
                continue;
            /* Read what this request still expects; never more, so that a
             * surplus shows up as a mismatch of the next request. */
            for (;;) {
                size_t want = msg_size - c->received;
                if (want > scratch_size)
                    want = scratch_size;
                ssize_t r = recv(c->fd, scratch, want, 0);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break;
                if (r <= 0) {             /* EOF or error: the server dropped us */
                    errors++;
                    kill_conn(c);
                    break;
                }
                if (!c->mismatch &&
                    memcmp(scratch, pattern + c->offset + c->received, (size_t)r) != 0)
                    c->mismatch = 1;
                c->received += (size_t)r;
                if (c->received == msg_size) {
                    if (c->mismatch)
                        errors++;
                    if (measuring && t < t_end) {
                        requests++;
                        lg_add_latency(&lat, t - c->started_ns);
                    }
                    if (t >= t_end)
                        break;
                    start_request(c, t);
                    break;        /* level-triggered: come back if more is ready */
                }
                if ((size_t)r < want)
                    break;        /* drained for now */
            }
        }
        if (!measuring)
            continue;
        int any = 0;
        for (long i = 0; i < conns && !any; i++)
            any = cs[i].alive;
        if (!any)
            break;                /* every connection failed: stop early */
    }
    int64_t t_stop = lg_now_ns();
    if (t_stop > t_end)
        t_stop = t_end;
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);

    double seconds = measuring ? (double)(t_stop - t_measure) / 1e9 : 0.0;
    long alive = 0;
    for (long i = 0; i < conns; i++)
        alive += cs[i].alive;
    lg_print_head(requests, seconds, msg_size, errors - errors_at_window, errors_at_window);
    printf("\"conns\": %ld, \"conns_alive\": %ld, ", conns, alive);
    lg_print_tail(msg_size, &lat, lg_cpu_seconds(&ru0, &ru1));
    printf("}\n");
    fflush(stdout);

    if (hold)
        lg_hold();
    for (long i = 0; i < conns; i++)
        kill_conn(&cs[i]);
    return errors ? 1 : 0;
}
