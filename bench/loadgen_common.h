/* What the benchmarks' C programs share: bench/loadgen.c, tls_loadgen.c and
 * udpgen.c (the load generators), echo_server.c and tls_echo_server.c (the
 * C floor servers).
 *
 *   lg_now_ns                 CLOCK_MONOTONIC in nanoseconds
 *   lg_parse_args             the command line: --options from a table,
 *                             positional arguments, the usage text on error
 *   lg_make_pattern           the xorshift bytes the echoes are checked with
 *   lg_loopback, lg_sockaddr  a loopback HOST (or a Unix path) as an address
 *   lg_listen, lg_accept      the servers' listening socket and connections
 *   struct lg_latencies       latencies of the measured window, percentiles
 *   lg_cpu_seconds            user + system time between two getrusage()s
 *   lg_print_head/_tail       the result line's JSON: the fields every load
 *                             generator prints, in their order
 *   lg_hold                   --hold: wait until stdin is closed
 *
 * Header only (each program is one translation unit: bench/procs.py compiles
 * NAME.c alone), every function static inline.  The programs are built with
 * -Wall -Wextra -Werror.
 */
#ifndef TIDELOOP_BENCH_LOADGEN_COMMON_H
#define TIDELOOP_BENCH_LOADGEN_COMMON_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PATTERN_PERIOD 4093u      /* a prime: request k starts at offset k*P % ... */

static inline int64_t lg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------------
 * The command line
 * ------------------------------------------------------------------------ */

struct lg_usage {
    const char *prog;             /* "loadgen" */
    const char *text;             /* "usage: loadgen HOST PORT ...\n" */
};

/* "PROG: MSG" (when MSG), the usage text, exit status 2. */
static inline void lg_die_usage(const struct lg_usage *u, const char *msg)
{
    if (msg)
        fprintf(stderr, "%s: %s\n", u->prog, msg);
    fputs(u->text, stderr);
    exit(2);
}

enum lg_kind { LG_LONG, LG_LLONG, LG_DOUBLE, LG_STRING, LG_FLAG };

struct lg_opt {
    const char *name;             /* "--conns" */
    enum lg_kind kind;
    void *dst;                    /* long, long long, double, const char *, int */
};

/* Fills the options of ``opts`` (ended by a {NULL} entry) and up to
 * ``npos`` positional arguments into pos[] (left as they are when absent);
 * -h/--help, an unknown option, a missing value or one positional argument
 * too many end the program with the usage text. */
static inline void lg_parse_args(int argc, char **argv, const struct lg_opt *opts,
                                 const char **pos, int npos, const struct lg_usage *u)
{
    int seen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            lg_die_usage(u, NULL);
        if (a[0] == '-' && a[1] == '-') {
            const struct lg_opt *o = opts;
            while (o->name && strcmp(o->name, a) != 0)
                o++;
            if (!o->name || (o->kind != LG_FLAG && i + 1 >= argc))
                lg_die_usage(u, "unknown option or missing value");
            switch (o->kind) {
            case LG_LONG: *(long *)o->dst = strtol(argv[++i], NULL, 10); break;
            case LG_LLONG: *(long long *)o->dst = strtoll(argv[++i], NULL, 10); break;
            case LG_DOUBLE: *(double *)o->dst = strtod(argv[++i], NULL); break;
            case LG_STRING: *(const char **)o->dst = argv[++i]; break;
            case LG_FLAG: *(int *)o->dst = 1; break;
            }
        } else if (seen < npos) {
            pos[seen++] = a;
        } else {
            lg_die_usage(u, "too many arguments");
        }
    }
}

/* ------------------------------------------------------------------------
 * Addresses and sockets
 * ------------------------------------------------------------------------ */

/* 1 and *family, addr (16 bytes) set if HOST is a loopback address
 * (127.0.0.0/8, ::1, localhost), else 0. */
static inline int lg_loopback(const char *host, int *family, void *addr)
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

/* The socket address of ``unix_path`` if given, else of (family, addr,
 * port); its length, or 0 with errno ENAMETOOLONG for a path too long. */
static inline socklen_t lg_sockaddr(struct sockaddr_storage *ss, int family, const void *addr,
                                    long port, const char *unix_path)
{
    memset(ss, 0, sizeof(*ss));
    if (unix_path) {
        struct sockaddr_un *sun = (struct sockaddr_un *)ss;
        if (strlen(unix_path) >= sizeof(sun->sun_path)) {
            errno = ENAMETOOLONG;
            return 0;
        }
        sun->sun_family = AF_UNIX;
        strcpy(sun->sun_path, unix_path);
        return sizeof(*sun);
    }
    if (family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        memcpy(&sin->sin_addr, addr, sizeof(sin->sin_addr));
        return sizeof(*sin);
    }
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons((uint16_t)port);
    memcpy(&sin6->sin6_addr, addr, sizeof(sin6->sin6_addr));
    return sizeof(*sin6);
}

static inline void lg_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* The servers' non-blocking listening socket: on ``unix_path`` (replacing a
 * stale file) or on 127.0.0.1:PORT (0: any free port); ``where`` gets the
 * path or the port for the READY line.  -1 after saying why (perror), -2
 * for a path too long. */
static inline int lg_listen(const char *prog, const char *port_arg, const char *unix_path,
                            char *where, size_t where_size)
{
    struct sockaddr_storage ss;
    static const unsigned char lo4[4] = {127, 0, 0, 1};
    socklen_t len = lg_sockaddr(&ss, AF_INET, lo4, unix_path ? 0 : atol(port_arg), unix_path);
    if (!len) {
        fprintf(stderr, "%s: path too long\n", prog);
        return -2;
    }
    if (unix_path)
        unlink(unix_path);
    int lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd >= 0 && !unix_path) {
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&ss, len) < 0) {
        fprintf(stderr, "%s: bind: %s\n", prog, strerror(errno));
        return -1;
    }
    if (unix_path) {
        snprintf(where, where_size, "%s", unix_path);
    } else {
        struct sockaddr_in sin;
        socklen_t slen = sizeof(sin);
        getsockname(lfd, (struct sockaddr *)&sin, &slen);
        snprintf(where, where_size, "%d", ntohs(sin.sin_port));
    }
    if (listen(lfd, 1024) < 0) {
        fprintf(stderr, "%s: listen: %s\n", prog, strerror(errno));
        return -1;
    }
    return lfd;
}

/* A connection accepted on ``lfd``, non-blocking (TCP_NODELAY over TCP),
 * or -1: EAGAIN, or EMFILE & co (retried on the next event). */
static inline int lg_accept(int lfd, int is_unix)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0 && !is_unix)
        lg_nodelay(fd);
    return fd;
}

/* ------------------------------------------------------------------------
 * The pattern, latencies, CPU time, the result line
 * ------------------------------------------------------------------------ */

/* ``n`` xorshift bytes (malloc'ed; NULL when out of memory): request k of
 * a connection is a window of it starting at an offset moving by a prime. */
static inline unsigned char *lg_make_pattern(size_t n)
{
    unsigned char *p = malloc(n ? n : 1);
    if (!p)
        return NULL;
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)(x >> 11);
    }
    return p;
}

struct lg_latencies {
    int64_t *ns;                  /* completed requests of the window */
    size_t n, cap;
};

static inline void lg_add_latency(struct lg_latencies *l, int64_t ns)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 65536;
        int64_t *p = realloc(l->ns, cap * sizeof(*p));
        if (!p)
            return;             /* percentiles get less precise, nothing else */
        l->ns = p;
        l->cap = cap;
    }
    l->ns[l->n++] = ns;
}

static inline int lg_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Quantile q of the sorted latencies (lg_print_tail sorts), in us. */
static inline double lg_percentile_us(const struct lg_latencies *l, double q)
{
    if (!l->n)
        return 0.0;
    size_t i = (size_t)(q * (double)(l->n - 1) + 0.5);
    if (i >= l->n)
        i = l->n - 1;
    return (double)l->ns[i] / 1000.0;
}

static inline double lg_cpu_seconds(const struct rusage *r0, const struct rusage *r1)
{
    return (double)(r1->ru_utime.tv_sec - r0->ru_utime.tv_sec)
         + (double)(r1->ru_utime.tv_usec - r0->ru_utime.tv_usec) / 1e6
         + (double)(r1->ru_stime.tv_sec - r0->ru_stime.tv_sec)
         + (double)(r1->ru_stime.tv_usec - r0->ru_stime.tv_usec) / 1e6;
}

/* The result line's first fields, up to and including "warmup_errors"
 * (the program's own fields follow, then lg_print_tail). */
static inline void lg_print_head(uint64_t requests, double seconds, size_t msg_size,
                                 uint64_t errors, uint64_t warmup_errors)
{
    printf("{\"requests\": %llu, \"seconds\": %.6f, \"rps\": %.1f, \"bytes\": %llu, "
           "\"errors\": %llu, \"warmup_errors\": %llu, ",
           (unsigned long long)requests, seconds,
           seconds > 0 ? (double)requests / seconds : 0.0,
           (unsigned long long)(requests * (uint64_t)msg_size * 2u),
           (unsigned long long)errors, (unsigned long long)warmup_errors);
}

/* "size", "latency_us" (p50, p99, max: ``lat`` sorted here) and
 * "client_cpu_s"; the caller closes the object (or adds fields first). */
static inline void lg_print_tail(size_t msg_size, struct lg_latencies *lat, double cpu)
{
    qsort(lat->ns, lat->n, sizeof(*lat->ns), lg_cmp_i64);
    printf("\"size\": %zu, \"latency_us\": {\"p50\": %.1f, \"p99\": %.1f, \"max\": %.1f}, "
           "\"client_cpu_s\": %.4f",
           msg_size, lg_percentile_us(lat, 0.50), lg_percentile_us(lat, 0.99),
           lat->n ? (double)lat->ns[lat->n - 1] / 1000.0 : 0.0, cpu);
}

/* --hold: keep the connections (and the process) until stdin is closed. */
static inline void lg_hold(void)
{
    char buf[256];
    while (read(0, buf, sizeof(buf)) > 0)
        ;
}

#endif /* TIDELOOP_BENCH_LOADGEN_COMMON_H */
