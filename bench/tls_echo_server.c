/*
 * tls_echo_server: the TLS floor of the network benchmark.
 *
 *   tls_echo_server PORT --cert PEM [--unix PATH]
 *
 * A minimal single-threaded epoll TLS echo server in C with OpenSSL: TLS 1.3
 * only, OpenSSL's default cipher suites, groups and session tickets (as
 * Python's ssl module has them), non-blocking sockets, level-triggered epoll,
 * TCP_NODELAY on accepted connections.  PEM holds the certificate chain and
 * the private key (tests/certs/server-ecdsa.pem or server-rsa.pem).
 *
 * What it does per readable connection, with as few syscalls and copies as
 * OpenSSL allows: the SSL object reads the socket itself (read-ahead into a
 * 256 KiB buffer, so one read() takes whatever the socket holds), every
 * record that is there is decrypted into one plaintext buffer, that
 * plaintext is encrypted back with one SSL_write into the connection's
 * output buffer (a small BIO of this file's own: no copy, never blocks), and
 * the output goes out with one send().  When the socket does not take it
 * all, the rest stays queued, reading stops (EPOLLIN off) and EPOLLOUT waits
 * until it is drained; records already read but not yet decrypted are then
 * handled without waiting for the socket.  A close_notify from the peer is
 * answered with one and the connection closed.
 *
 * This is what a TLS echo needs at the least, with no Python and no event
 * loop on the path: the Python loops' TLS servers are measured against it.
 *
 * Listens on 127.0.0.1:PORT (PORT 0 picks a free port) or on the Unix socket
 * PATH, then prints "READY <port>" (or "READY <path>") on stdout.  Runs until
 * killed (SIGTERM / SIGINT).  --version prints the OpenSSL it runs with.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/epoll.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "loadgen_common.h"

#define PLAIN_SIZE (256 * 1024)     /* plaintext decrypted per batch, at most */
#define READ_AHEAD (256 * 1024)     /* the SSL object's socket read buffer */

struct conn {
    int fd;
    SSL *ssl;
    int handshaken;
    uint32_t events;                /* registered epoll events */
    unsigned char *out;             /* TLS bytes not yet sent */
    size_t out_len, out_off, out_cap;
};

static int epfd;
static unsigned char plain[PLAIN_SIZE];
static BIO_METHOD *out_method;

/* -- the output BIO: appends to the connection's buffer ----------------- */

static int out_write_ex(BIO *b, const char *data, size_t len, size_t *written)
{
    struct conn *c = BIO_get_data(b);
    if (c->out_len + len > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 65536;
        while (cap < c->out_len + len)
            cap *= 2;
        unsigned char *p = realloc(c->out, cap);
        if (!p)
            return 0;
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    *written = len;
    return 1;
}

static long out_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int out_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

/* -- connections ---------------------------------------------------------- */

static void conn_close(struct conn *c)
{
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    SSL_free(c->ssl);               /* frees both BIOs; the socket BIO does not close fd */
    close(c->fd);
    free(c->out);
    free(c);
}

static void conn_events(struct conn *c, uint32_t events)
{
    if (c->events == events)
        return;
    struct epoll_event ev;
    ev.events = events;
    ev.data.ptr = c;
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->events = events;
}

/* Send the queued output; 1 if all went out, 0 if some remains, -1 on error. */
static int conn_flush(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return -1;
    }
    c->out_off = c->out_len = 0;
    return 1;
}

/* Handshake, then decrypt what is there and echo it; returns -1 when the
 * connection is to be closed (error, EOF, or close_notify answered). */
static int conn_process(struct conn *c)
{
    if (!c->handshaken) {
        int r = SSL_do_handshake(c->ssl);
        if (r != 1) {
            int err = SSL_get_error(c->ssl, r);
            if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
                return -1;
            int f = conn_flush(c);
            if (f == 0)
                conn_events(c, EPOLLOUT);
            return f < 0 ? -1 : 0;
        }
        c->handshaken = 1;
    }
    for (;;) {
        size_t got = 0;
        int err = SSL_ERROR_NONE;
        /* Every record already read; no read() that would find the socket
         * empty (level-triggered epoll calls again when more comes). */
        do {
            int n = SSL_read(c->ssl, plain + got, (int)(PLAIN_SIZE - got));
            if (n <= 0) {
                err = SSL_get_error(c->ssl, n);
                break;
            }
            got += (size_t)n;
        } while (got < PLAIN_SIZE && SSL_has_pending(c->ssl));
        if (got && SSL_write(c->ssl, plain, (int)got) != (int)got)
            return -1;
        if (err == SSL_ERROR_ZERO_RETURN) {     /* close_notify: answer it, close */
            SSL_shutdown(c->ssl);
            conn_flush(c);
            return -1;
        }
        if (err != SSL_ERROR_NONE && err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
            return -1;                          /* EOF without close_notify, or an error */
        int r = conn_flush(c);
        if (r < 0)
            return -1;
        if (r == 0) {
            conn_events(c, EPOLLOUT);           /* stop reading until the echo is out */
            return 0;
        }
        if (err != SSL_ERROR_NONE || !SSL_has_pending(c->ssl))
            return 0;
        /* the plaintext buffer was full and records are still buffered: go on */
    }
}

static void on_conn(struct conn *c, uint32_t events)
{
    if (c->out_len) {                   /* waiting for EPOLLOUT */
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int r = conn_flush(c);
        if (r < 0) {
            conn_close(c);
            return;
        }
        if (r == 0)
            return;
        conn_events(c, EPOLLIN);        /* drained: read again, starting with */
    }                                   /* what the SSL object already holds */
    if (conn_process(c) < 0)
        conn_close(c);
}

static struct conn *conn_new(SSL_CTX *ctx, int fd)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->fd = fd;
    c->ssl = SSL_new(ctx);
    BIO *in = BIO_new_socket(fd, BIO_NOCLOSE);
    BIO *out = BIO_new(out_method);
    if (!c->ssl || !in || !out) {
        SSL_free(c->ssl);
        BIO_free(in);
        BIO_free(out);
        free(c);
        return NULL;
    }
    BIO_set_data(out, c);
    SSL_set_bio(c->ssl, in, out);
    SSL_set_accept_state(c->ssl);
    return c;
}

static SSL_CTX *make_ctx(const char *pem)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        return NULL;
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION)
            || SSL_CTX_use_certificate_chain_file(ctx, pem) != 1
            || SSL_CTX_use_PrivateKey_file(ctx, pem, SSL_FILETYPE_PEM) != 1
            || SSL_CTX_check_private_key(ctx) != 1) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_default_read_buffer_len(ctx, READ_AHEAD);
    return ctx;
}

static const struct lg_usage usage = {
    "tls_echo_server",
    "usage: tls_echo_server PORT --cert PEM [--unix PATH]\n"
    "       tls_echo_server --version\n",
};

int main(int argc, char **argv)
{
    const char *unix_path = NULL, *port_arg = NULL, *pem = NULL;
    int version = 0;
    const struct lg_opt opts[] = {
        {"--unix", LG_STRING, &unix_path}, {"--cert", LG_STRING, &pem},
        {"--version", LG_FLAG, &version}, {NULL, LG_FLAG, NULL},
    };
    lg_parse_args(argc, argv, opts, &port_arg, 1, &usage);
    if (version) {
        printf("%s\n", OpenSSL_version(OPENSSL_VERSION));
        return 0;
    }
    if ((!port_arg && !unix_path) || !pem)
        lg_die_usage(&usage, NULL);
    signal(SIGPIPE, SIG_IGN);

    SSL_CTX *ctx = make_ctx(pem);
    out_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "echo output");
    if (!ctx || !out_method
            || !BIO_meth_set_write_ex(out_method, out_write_ex)
            || !BIO_meth_set_ctrl(out_method, out_ctrl)
            || !BIO_meth_set_create(out_method, out_create)) {
        fprintf(stderr, "tls_echo_server: cannot set up TLS with %s:\n", pem);
        ERR_print_errors_fp(stderr);
        return 1;
    }

    char where[128];
    int lfd = lg_listen("tls_echo_server", port_arg, unix_path, where, sizeof(where));
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
            perror("tls_echo_server: epoll_wait");
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
                struct conn *c = conn_new(ctx, fd);
                if (!c) {
                    close(fd);
                    continue;
                }
                c->events = EPOLLIN;
                ev.events = EPOLLIN;
                ev.data.ptr = c;
                epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
            }
        }
    }
}
