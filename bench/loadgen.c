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
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PATTERN_PERIOD 4093u      /* a prime: request k starts at offset k*P % ... */

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

static int64_t *latencies;        /* ns, completed requests of the window */
static size_t n_lat, cap_lat;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die_usage(const char *msg)
{
    if (msg)
        fprintf(stderr, "loadgen: %s\n", msg);
    fprintf(stderr,
            "usage: loadgen HOST PORT --conns N --size BYTES --duration SECONDS\n"
            "               [--warmup SECONDS] [--unix PATH] [--hold]\n");
    exit(2);
}

static void add_latency(int64_t ns)
{
    if (n_lat == cap_lat) {
        size_t cap = cap_lat ? cap_lat * 2 : 65536;
        int64_t *p = realloc(latencies, cap * sizeof(*p));
        if (!p)
            return;             /* percentiles get less precise, nothing else */
        latencies = p;
        cap_lat = cap;
    }
    latencies[n_lat++] = ns;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double percentile_us(double q)
{
    if (!n_lat)
        return 0.0;
    size_t i = (size_t)(q * (double)(n_lat - 1) + 0.5);
    if (i >= n_lat)
        i = n_lat - 1;
    return (double)latencies[i] / 1000.0;
}

static int is_loopback(const char *host, int *family, void *addr)
{
    if (strcmp(host, "localhost") == 0)
        host = "127.0.0.1";
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        if ((ntohl(a4.s_addr) >> 24) != 127)
            return 0;
        *family = AF_INET;
        memcpy(addr, &a4, sizeof(a4));
        return 1;
    }
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        if (!IN6_IS_ADDR_LOOPBACK(&a6))
            return 0;
        *family = AF_INET6;
        memcpy(addr, &a6, sizeof(a6));
        return 1;
    }
    return 0;
}

static int open_conn(int family, const void *addr, int port, const char *unix_path)
{
    int fd;
    if (unix_path) {
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        if (strlen(unix_path) >= sizeof(sun.sun_path)) {
            errno = ENAMETOOLONG;
            return -1;
        }
        strcpy(sun.sun_path, unix_path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
    } else {
        struct sockaddr_storage ss;
        socklen_t len;
        memset(&ss, 0, sizeof(ss));
        if (family == AF_INET) {
            struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
            sin->sin_family = AF_INET;
            sin->sin_port = htons((uint16_t)port);
            memcpy(&sin->sin_addr, addr, sizeof(sin->sin_addr));
            len = sizeof(*sin);
        } else {
            struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
            sin6->sin6_family = AF_INET6;
            sin6->sin6_port = htons((uint16_t)port);
            memcpy(&sin6->sin6_addr, addr, sizeof(sin6->sin6_addr));
            len = sizeof(*sin6);
        }
        fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        /* Blocking connect: on loopback it completes (or fails) at once. */
        if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
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
    const char *host = NULL, *unix_path = NULL;
    long port = -1, conns = -1;
    long long size = -1;
    double duration = -1, warmup = 0;
    int hold = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--conns") == 0 && i + 1 < argc)
            conns = strtol(argv[++i], NULL, 10);
        else if (strcmp(a, "--size") == 0 && i + 1 < argc)
            size = strtoll(argv[++i], NULL, 10);
        else if (strcmp(a, "--duration") == 0 && i + 1 < argc)
            duration = strtod(argv[++i], NULL);
        else if (strcmp(a, "--warmup") == 0 && i + 1 < argc)
            warmup = strtod(argv[++i], NULL);
        else if (strcmp(a, "--unix") == 0 && i + 1 < argc)
            unix_path = argv[++i];
        else if (strcmp(a, "--hold") == 0)
            hold = 1;
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            die_usage(NULL);
        else if (a[0] == '-' && a[1] == '-')
            die_usage("unknown option or missing value");
        else if (!host)
            host = a;
        else if (port < 0)
            port = strtol(a, NULL, 10);
        else
            die_usage("too many arguments");
    }
    if (!host || port < 0 || conns <= 0 || size <= 0 || duration <= 0 || warmup < 0)
        die_usage("HOST, PORT, --conns, --size and --duration are required");
    if (port > 65535 || conns > 100000 || size > (1LL << 30) || duration > 3600)
        die_usage("argument out of range");

    int family = AF_INET;
    unsigned char addr[16];
    if (!unix_path && !is_loopback(host, &family, addr))
        die_usage("HOST must be a loopback address (127.0.0.0/8, ::1, localhost)");

    signal(SIGPIPE, SIG_IGN);
    msg_size = (size_t)size;

    /* The pattern: xorshift bytes; request k of connection c is the window
     * [offset, offset + size) with offset moving by a prime each request. */
    pattern = malloc(msg_size + PATTERN_PERIOD);
    scratch_size = msg_size < 262144 ? msg_size : 262144;
    scratch = malloc(scratch_size);
    struct conn *cs = calloc((size_t)conns, sizeof(*cs));
    if (!pattern || !scratch || !cs) {
        fprintf(stderr, "loadgen: out of memory\n");
        return 2;
    }
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < msg_size + PATTERN_PERIOD; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        pattern[i] = (unsigned char)(x >> 11);
    }

    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) {
        perror("loadgen: epoll_create1");
        return 2;
    }
    for (long i = 0; i < conns; i++) {
        int fd = open_conn(family, addr, (int)port, unix_path);
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

    int64_t t_begin = now_ns();
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
    int64_t t = now_ns();
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
        t = now_ns();
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
                        add_latency(t - c->started_ns);
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
    int64_t t_stop = now_ns();
    if (t_stop > t_end)
        t_stop = t_end;
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);

    double seconds = measuring ? (double)(t_stop - t_measure) / 1e9 : 0.0;
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec)
               + (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6
               + (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec)
               + (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    long alive = 0;
    for (long i = 0; i < conns; i++)
        alive += cs[i].alive;
    qsort(latencies, n_lat, sizeof(*latencies), cmp_i64);
    uint64_t window_errors = errors - errors_at_window;
    printf("{\"requests\": %llu, \"seconds\": %.6f, \"rps\": %.1f, \"bytes\": %llu, "
           "\"errors\": %llu, \"warmup_errors\": %llu, \"conns\": %ld, \"conns_alive\": %ld, "
           "\"size\": %zu, \"latency_us\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
           "\"client_cpu_s\": %.4f}\n",
           (unsigned long long)requests, seconds,
           seconds > 0 ? (double)requests / seconds : 0.0,
           (unsigned long long)(requests * (uint64_t)msg_size * 2u),
           (unsigned long long)window_errors, (unsigned long long)errors_at_window,
           conns, alive, msg_size,
           percentile_us(0.50), percentile_us(0.99),
           n_lat ? (double)latencies[n_lat - 1] / 1000.0 : 0.0, cpu);
    fflush(stdout);

    if (hold) {
        char buf[256];
        while (read(0, buf, sizeof(buf)) > 0)
            ;
    }
    for (long i = 0; i < conns; i++)
        kill_conn(&cs[i]);
    return errors ? 1 : 0;
}
