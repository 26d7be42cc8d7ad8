/*
 * tls_loadgen: a closed-loop TLS echo load generator (C, OpenSSL, epoll, one
 * thread): bench/loadgen.c over TLS 1.3.
 *
 *   tls_loadgen HOST PORT --conns N --size BYTES --ca PEM
 *               (--duration SECONDS [--warmup SECONDS] | --requests R [--duration LIMIT])
 *               [--handshake] [--sni NAME] [--unix PATH] [--hold]
 *
 * Echo mode (the default): opens N connections to a TLS echo server on the
 * loopback interface (or the Unix socket PATH), makes the TLS 1.3 handshake
 * on each, then each connection sends one message of SIZE bytes, reads SIZE
 * bytes back, checks them and only then sends the next one: one request
 * outstanding per connection.  Messages are windows into a pseudo-random
 * pattern at an offset that moves with every request (as in loadgen), so a
 * stale, shifted, duplicated or truncated echo counts in "errors".
 *
 * --handshake: every request is a fresh connection: connect, TLS 1.3
 * handshake (full: no session is resumed), one message of SIZE bytes echoed
 * and checked, close_notify sent, the server's close awaited, socket closed;
 * then the slot opens the next connection.  N slots at a time; requests/s is
 * handshakes per second.
 *
 * The server's certificate must verify against the CA in PEM
 * (tests/certs/ca.pem) for the name NAME (--sni, default "localhost"), which
 * is also sent as SNI.  Protocol version TLS 1.3 only; cipher suites and
 * groups are OpenSSL's defaults.
 *
 * Measuring: --duration S measures S seconds after --warmup seconds
 * (requests completed in the warm-up are not counted; at the end of the
 * window no new request starts and requests in flight are abandoned).
 * --requests R instead runs exactly R requests from the start (no warm-up;
 * handshakes of echo mode included in the run) and stops; --duration is
 * then a time limit (exit status 1 if it cuts the run short).
 *
 * Output on stdout, as loadgen:
 *   "START"             once the warm-up is over and the measured window begins;
 *   one line of JSON    at the end: requests, seconds, rps, bytes, errors,
 *                       latency p50/p99/max (microseconds; a handshake-mode
 *                       request is timed from connect() to the verified echo),
 *                       the client's own CPU seconds, the mode, and the TLS
 *                       version, cipher suite and group the first connection
 *                       negotiated.
 *
 * --hold: after printing the JSON line, keep the connections open until stdin
 * reaches EOF (then send close_notify and close them), so that the server's
 * CPU time can be read before it handles the closing.
 *
 * Exit status: 0 when the run completed without errors, 1 when errors were
 * counted or --requests was not reached (the JSON line is printed anyway),
 * 2 on usage / setup / first-connect failures.  Loopback only: HOST must be a
 * 127.0.0.0/8 address, ::1 or "localhost".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "loadgen_common.h"

#define READ_AHEAD (64 * 1024)    /* the SSL objects' socket read buffer */

enum { ST_CONNECTING, ST_HANDSHAKE, ST_ECHO, ST_SHUTDOWN, ST_IDLE };

struct conn {
    uint32_t id;
    int fd;                       /* -1 between connections (handshake mode) */
    SSL *ssl;
    int state;
    int alive;                    /* 0 once dropped by the server or an error */
    int want_out;                 /* the current write waits for EPOLLOUT */
    uint32_t events;              /* registered epoll events */
    uint64_t seq;                 /* request number on this slot */
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
    "tls_loadgen",
    "usage: tls_loadgen HOST PORT --conns N --size BYTES --ca PEM\n"
    "           (--duration SECONDS [--warmup SECONDS] | --requests R [--duration LIMIT])\n"
    "           [--handshake] [--sni NAME] [--unix PATH] [--hold]\n",
};

static SSL_CTX *ctx;
static const char *sni = "localhost";
static int handshake_mode;
static int epfd;
static uint64_t errors;
static int ssl_error_shown;

/* Where to connect. */
static int family = AF_INET;
static unsigned char addr[16];
static long port = -1;
static const char *unix_path;

/* The run's state. */
static int measuring;
static int64_t t_end;             /* INT64_MAX without a time limit */
static uint64_t limit;            /* --requests, 0: none */
static uint64_t started, completed, requests;
static char tls_version[32] = "", tls_cipher[64] = "", tls_group[32] = "";

/* A non-blocking socket connecting (or connected) to the server; -1 with
 * errno on failure.  *pending is set when the connect is still under way. */
static int open_socket(int blocking_connect, int *pending)
{
    struct sockaddr_storage ss;
    socklen_t len = lg_sockaddr(&ss, family, addr, port, unix_path);
    if (!len)
        return -1;
    int fd = socket(ss.ss_family,
                    SOCK_STREAM | SOCK_CLOEXEC | (blocking_connect ? 0 : SOCK_NONBLOCK), 0);
    if (fd < 0)
        return -1;
    if (!unix_path)
        lg_nodelay(fd);
    *pending = 0;
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
        if (!blocking_connect && errno == EINPROGRESS) {
            *pending = 1;
        } else {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
    }
    if (blocking_connect) {
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    }
    return fd;
}

static void show_ssl_error(const char *what)
{
    if (ssl_error_shown++)
        return;
    fprintf(stderr, "tls_loadgen: %s:\n", what);
    ERR_print_errors_fp(stderr);
}

static void set_events(struct conn *c)
{
    uint32_t want;
    switch (c->state) {
    case ST_CONNECTING:
        want = EPOLLOUT;
        break;
    case ST_HANDSHAKE:
    case ST_ECHO:
        want = EPOLLIN | (c->want_out ? EPOLLOUT : 0);
        break;
    default:
        want = EPOLLIN;
    }
    if (c->events == want)
        return;
    struct epoll_event ev;
    ev.events = want;
    ev.data.ptr = c;
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->events = want;
}

/* Close the socket and free the SSL object (close_notify sent if asked). */
static void release(struct conn *c, int notify)
{
    if (c->fd < 0)
        return;
    if (notify && c->ssl && (c->state == ST_ECHO || c->state == ST_SHUTDOWN))
        SSL_shutdown(c->ssl);           /* best effort, non-blocking */
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    SSL_free(c->ssl);
    c->ssl = NULL;
    c->fd = -1;
}

static void kill_conn(struct conn *c)
{
    release(c, 0);
    c->alive = 0;
    c->state = ST_IDLE;
}

static int may_start(int64_t t)
{
    return t < t_end && (!limit || started < limit);
}

/* Open a connection on slot c and start its handshake.  0, or -1 (errno set
 * or a TLS setup failure) with the slot left without a socket. */
static int conn_open(struct conn *c, int blocking_connect)
{
    int pending;
    int fd = open_socket(blocking_connect, &pending);
    if (fd < 0)
        return -1;
    SSL *ssl = SSL_new(ctx);
    if (!ssl || !SSL_set_fd(ssl, fd) || !SSL_set_tlsext_host_name(ssl, sni)
            || !SSL_set1_host(ssl, sni)) {
        show_ssl_error("cannot set up a TLS connection");
        SSL_free(ssl);
        close(fd);
        errno = EINVAL;
        return -1;
    }
    SSL_set_connect_state(ssl);
    c->fd = fd;
    c->ssl = ssl;
    c->state = pending ? ST_CONNECTING : ST_HANDSHAKE;
    c->want_out = 1;                    /* the ClientHello goes first */
    c->events = c->state == ST_CONNECTING ? EPOLLOUT : EPOLLIN | EPOLLOUT;
    struct epoll_event ev;
    ev.events = c->events;
    ev.data.ptr = c;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int e = errno;
        SSL_free(ssl);
        close(fd);
        c->fd = -1;
        c->ssl = NULL;
        errno = e;
        return -1;
    }
    return 0;
}

/* Send as much of the current request as the connection takes. */
static void pump_out(struct conn *c)
{
    while (c->sent < msg_size) {
        int n = SSL_write(c->ssl, pattern + c->offset + c->sent, (int)(msg_size - c->sent));
        if (n > 0) {
            c->sent += (size_t)n;
            continue;
        }
        int err = SSL_get_error(c->ssl, n);
        if (err == SSL_ERROR_WANT_WRITE) {
            c->want_out = 1;
            set_events(c);
            return;
        }
        if (err == SSL_ERROR_WANT_READ)
            break;                      /* the read side drives it on */
        if (err == SSL_ERROR_SSL)
            show_ssl_error("SSL_write");
        errors++;                       /* EPIPE, ECONNRESET, ... */
        kill_conn(c);
        return;
    }
    c->want_out = 0;
    set_events(c);
}

/* The next message on an established connection (c->started_ns set by the caller). */
static void start_echo(struct conn *c)
{
    c->seq++;
    c->offset = (size_t)((c->seq * 7919u + c->id) % PATTERN_PERIOD);
    c->sent = 0;
    c->received = 0;
    c->mismatch = 0;
    c->state = ST_ECHO;
    pump_out(c);
}

/* A slot with nothing more to do (window over, request budget spent). */
static void go_idle(struct conn *c)
{
    c->state = ST_IDLE;
    if (c->fd >= 0)
        set_events(c);
}

/* Handshake mode: the next connection of slot c, or idle. */
static void next_connection(struct conn *c, int64_t t)
{
    release(c, 0);
    if (!may_start(t)) {
        c->state = ST_IDLE;
        return;
    }
    started++;
    c->started_ns = t;
    if (conn_open(c, 0) < 0) {
        fprintf(stderr, "tls_loadgen: connect: %s\n", strerror(errno));
        errors++;
        c->alive = 0;
        c->state = ST_IDLE;
    }
}

static void request_done(struct conn *c, int64_t t)
{
    if (c->mismatch)
        errors++;
    completed++;
    if (measuring && t < t_end) {
        requests++;
        lg_add_latency(&lat, t - c->started_ns);
    }
}

static void on_shutdown_readable(struct conn *c, int64_t t)
{
    for (;;) {
        int n = SSL_read(c->ssl, scratch, (int)scratch_size);
        if (n > 0) {
            errors++;                   /* more than the echo: a surplus */
            continue;
        }
        int err = SSL_get_error(c->ssl, n);
        if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)
            return;
        break;                          /* close_notify, EOF or reset: closed */
    }
    next_connection(c, t);
}

static void on_echo_readable(struct conn *c, int64_t t)
{
    /* Read what this request still expects; never more, so that a surplus
     * shows up as a mismatch of the next request. */
    for (;;) {
        size_t want = msg_size - c->received;
        if (want > scratch_size)
            want = scratch_size;
        int r = SSL_read(c->ssl, scratch, (int)want);
        if (r <= 0) {
            int err = SSL_get_error(c->ssl, r);
            if (err == SSL_ERROR_WANT_READ)
                return;
            if (err == SSL_ERROR_WANT_WRITE) {
                c->want_out = 1;
                set_events(c);
                return;
            }
            if (err == SSL_ERROR_SSL)
                show_ssl_error("SSL_read");
            errors++;                   /* EOF, close_notify or error: dropped */
            kill_conn(c);
            return;
        }
        if (!c->mismatch &&
            memcmp(scratch, pattern + c->offset + c->received, (size_t)r) != 0)
            c->mismatch = 1;
        c->received += (size_t)r;
        if (c->received < msg_size) {
            if (!SSL_has_pending(c->ssl) && (size_t)r < want)
                return;                 /* drained for now */
            continue;
        }
        request_done(c, t);
        if (handshake_mode) {
            c->state = ST_SHUTDOWN;
            SSL_shutdown(c->ssl);       /* close_notify; then wait for the server's close */
            set_events(c);
            on_shutdown_readable(c, t);
            return;
        }
        if (!may_start(t)) {
            go_idle(c);
            return;
        }
        started++;
        c->started_ns = t;
        start_echo(c);
        if (c->state != ST_ECHO || !SSL_has_pending(c->ssl))
            return;                     /* level-triggered: come back if more is ready */
    }
}

static void on_event(struct conn *c, uint32_t ev, int64_t t)
{
    switch (c->state) {
    case ST_CONNECTING: {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            fprintf(stderr, "tls_loadgen: connect: %s\n", strerror(err));
            errors++;
            kill_conn(c);
            return;
        }
        c->state = ST_HANDSHAKE;
    }
        /* fall through */
    case ST_HANDSHAKE: {
        int r = SSL_do_handshake(c->ssl);
        if (r != 1) {
            int err = SSL_get_error(c->ssl, r);
            if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
                c->want_out = err == SSL_ERROR_WANT_WRITE;
                set_events(c);
                return;
            }
            show_ssl_error("TLS handshake failed");
            errors++;
            kill_conn(c);
            return;
        }
        if (!tls_version[0]) {
            snprintf(tls_version, sizeof(tls_version), "%s", SSL_get_version(c->ssl));
            snprintf(tls_cipher, sizeof(tls_cipher), "%s", SSL_get_cipher_name(c->ssl));
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
            const char *g = SSL_group_to_name(c->ssl, SSL_get_negotiated_group(c->ssl));
            snprintf(tls_group, sizeof(tls_group), "%s", g ? g : "?");
#endif
        }
        if (!handshake_mode) {          /* echo mode: requests start now */
            if (!may_start(t)) {
                go_idle(c);
                return;
            }
            started++;
            c->started_ns = t;
        }
        start_echo(c);
        if (c->state == ST_ECHO && SSL_has_pending(c->ssl))
            on_echo_readable(c, t);
        return;
    }
    case ST_ECHO:
        /* the rest of the message: when writable, or after a write that
         * waited for the read side (want_out clear) */
        if (c->sent < msg_size && (!c->want_out || (ev & EPOLLOUT)))
            pump_out(c);
        if (c->state == ST_ECHO && (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)))
            on_echo_readable(c, t);
        return;
    case ST_SHUTDOWN:
        on_shutdown_readable(c, t);
        return;
    default:                            /* idle: whatever comes is not measured */
        return;
    }
}

static SSL_CTX *make_ctx(const char *ca)
{
    SSL_CTX *c = SSL_CTX_new(TLS_client_method());
    if (!c)
        return NULL;
    if (!SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION)
            || !SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION)
            || SSL_CTX_load_verify_locations(c, ca, NULL) != 1) {
        SSL_CTX_free(c);
        return NULL;
    }
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);   /* every handshake is a full one */
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
    SSL_CTX_set_options(c, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
    SSL_CTX_set_read_ahead(c, 1);
    SSL_CTX_set_default_read_buffer_len(c, READ_AHEAD);
    return c;
}

int main(int argc, char **argv)
{
    const char *ca = NULL;
    const char *pos[2] = {NULL, NULL};      /* HOST PORT */
    long conns = -1;
    long long size = -1, req_limit = 0;
    double duration = 0, warmup = 0;
    int hold = 0;
    const struct lg_opt opts[] = {
        {"--conns", LG_LONG, &conns}, {"--size", LG_LLONG, &size},
        {"--duration", LG_DOUBLE, &duration}, {"--warmup", LG_DOUBLE, &warmup},
        {"--requests", LG_LLONG, &req_limit}, {"--ca", LG_STRING, &ca},
        {"--sni", LG_STRING, &sni}, {"--unix", LG_STRING, &unix_path},
        {"--handshake", LG_FLAG, &handshake_mode}, {"--hold", LG_FLAG, &hold},
        {NULL, LG_FLAG, NULL},
    };
    lg_parse_args(argc, argv, opts, pos, 2, &usage);
    const char *host = pos[0];
    if (pos[1])
        port = strtol(pos[1], NULL, 10);
    if (!host || port < 0 || conns <= 0 || size <= 0 || !ca)
        lg_die_usage(&usage, "HOST, PORT, --conns, --size and --ca are required");
    if (req_limit < 0 || duration < 0 || warmup < 0 || (!req_limit && duration <= 0))
        lg_die_usage(&usage, "--duration (positive) or --requests is required");
    if (req_limit && warmup > 0)
        lg_die_usage(&usage, "--requests runs from the start: no --warmup");
    if (port > 65535 || conns > 100000 || size > (1LL << 30) || duration > 3600
            || size > 0x7fffffffLL)
        lg_die_usage(&usage, "argument out of range");
    if (!unix_path && !lg_loopback(host, &family, addr))
        lg_die_usage(&usage, "HOST must be a loopback address (127.0.0.0/8, ::1, localhost)");

    signal(SIGPIPE, SIG_IGN);
    msg_size = (size_t)size;
    limit = (uint64_t)req_limit;

    ctx = make_ctx(ca);
    if (!ctx) {
        fprintf(stderr, "tls_loadgen: cannot set up TLS with CA %s:\n", ca);
        ERR_print_errors_fp(stderr);
        return 2;
    }

    pattern = lg_make_pattern(msg_size + PATTERN_PERIOD);
    scratch_size = msg_size < 262144 ? msg_size : 262144;
    if (scratch_size < 16384)
        scratch_size = 16384;           /* room for whatever a shutdown read brings */
    scratch = malloc(scratch_size);
    struct conn *cs = calloc((size_t)conns, sizeof(*cs));
    if (!pattern || !scratch || !cs) {
        fprintf(stderr, "tls_loadgen: out of memory\n");
        return 2;
    }
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) {
        perror("tls_loadgen: epoll_create1");
        return 2;
    }

    int64_t t_begin = lg_now_ns();
    int64_t t_window = t_begin + (int64_t)(warmup * 1e9);
    t_end = duration > 0 ? t_window + (int64_t)(duration * 1e9) : INT64_MAX;
    measuring = warmup <= 0;
    int64_t t_measure = t_begin;
    uint64_t errors_at_window = 0;
    struct rusage ru0;

    if (measuring) {
        fputs("START\n", stdout);
        fflush(stdout);
    }
    getrusage(RUSAGE_SELF, &ru0);
    /* The first connection of every slot: a blocking connect, so that a
     * server that is not there is a setup failure (status 2). */
    for (long i = 0; i < conns; i++) {
        cs[i].id = (uint32_t)i;
        cs[i].fd = -1;
        cs[i].alive = 1;
        cs[i].state = ST_IDLE;
        if (handshake_mode) {
            if (!may_start(t_begin))
                continue;
            started++;
        }
        cs[i].started_ns = t_begin;
        if (conn_open(&cs[i], 1) < 0) {
            fprintf(stderr, "tls_loadgen: connect #%ld to %s: %s\n", i,
                    unix_path ? unix_path : host, strerror(errno));
            return 2;
        }
        on_event(&cs[i], EPOLLOUT, t_begin);    /* send the ClientHello */
    }

    struct epoll_event events[256];
    int64_t t = lg_now_ns();
    while (t < t_end && !(limit && completed >= limit)) {
        if (!measuring && t >= t_window) {
            measuring = 1;
            t_measure = t;
            errors_at_window = errors;
            getrusage(RUSAGE_SELF, &ru0);
            fputs("START\n", stdout);
            fflush(stdout);
        }
        int64_t until = measuring ? t_end : t_window;
        int timeout_ms = until == INT64_MAX ? 1000 : (int)((until - t + 999999) / 1000000);
        if (timeout_ms < 0)
            timeout_ms = 0;
        int n = epoll_wait(epfd, events, 256, timeout_ms);
        if (n < 0) {
            if (errno == EINTR)
                n = 0;
            else {
                perror("tls_loadgen: epoll_wait");
                return 2;
            }
        }
        t = lg_now_ns();
        for (int k = 0; k < n; k++) {
            struct conn *c = events[k].data.ptr;
            if (c->alive && c->fd >= 0)
                on_event(c, events[k].events, t);
        }
        int any = 0;
        for (long i = 0; i < conns && !any; i++)
            any = cs[i].alive && cs[i].state != ST_IDLE;
        if (!any)
            break;                /* every slot failed or has nothing left to do */
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
    printf(", \"mode\": \"%s\", \"requests_limit\": %llu, "
           "\"tls\": {\"version\": \"%s\", \"cipher\": \"%s\", \"group\": \"%s\"}}\n",
           handshake_mode ? "handshake" : "echo", (unsigned long long)limit,
           tls_version, tls_cipher, tls_group);
    fflush(stdout);

    if (hold)
        lg_hold();
    for (long i = 0; i < conns; i++)
        release(&cs[i], 1);
    SSL_CTX_free(ctx);
    return errors || (limit && completed < limit) ? 1 : 0;
}
