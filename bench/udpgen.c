/*
 * udpgen: a UDP echo load generator with a window of datagrams in flight
 * (C, one thread, poll on one connected socket).
 *
 *   udpgen HOST PORT --inflight N --size BYTES --duration SECONDS
 *          [--warmup SECONDS] [--timeout-ms MS] [--hold]
 *
 * Keeps N datagrams of SIZE bytes outstanding to a UDP echo server on the
 * loopback interface.  Each of the N slots sends one datagram, waits for its
 * echo, checks it, then sends the slot's next datagram (closed loop per
 * slot).  A datagram carries its slot number and sequence number in its first
 * 12 bytes, then a window into a fixed pseudo-random pattern at an offset
 * that moves with every datagram, so a corrupted or truncated echo counts in
 * "errors".
 *
 * Lost datagrams: a slot whose datagram has not come back after --timeout-ms
 * (default 100) counts one "lost" and sends a new datagram with a new
 * sequence number; an echo that arrives for an older sequence number (the
 * server was only slow) counts as "late" and is otherwise ignored.  Send
 * errors (ENOBUFS, ECONNREFUSED from a server that went away, ...) count in
 * "send_errors" and the slot waits for its timeout.  So the generator never
 * waits forever, whatever the server drops.
 *
 * Output on stdout (as bench/loadgen.c):
 *   "START"             once the warm-up is over and the measured window begins;
 *   one line of JSON    at the end: requests (echoes received and verified in
 *                       the window), seconds, rps, bytes, errors, lost, late,
 *                       send_errors, latency p50/p99/max (microseconds), the
 *                       client's own CPU seconds.
 * At the end of the window no new datagram is sent; echoes still in flight
 * are not waited for.
 *
 * --hold: after printing the JSON line, keep the socket open until stdin
 * reaches EOF.
 *
 * Exit status: 0 without errors, 1 when errors were counted (the JSON line is
 * printed anyway), 2 on usage / socket failures.  Loopback only.
 */
#define _GNU_SOURCE
#include <poll.h>

#include "loadgen_common.h"

#define HEADER 12u                /* uint32 slot, uint64 seq (host order) */
#define MAX_DGRAM 65507u

struct slot {
    uint64_t seq;                 /* sequence number of the datagram in flight */
    int64_t sent_ns;              /* when it was sent; 0: idle (window over) */
};

static unsigned char *pattern;    /* size + PATTERN_PERIOD bytes */
static size_t msg_size;
static int fd;

static struct lg_latencies lat;  /* completed requests of the window */

static const struct lg_usage usage = {
    "udpgen",
    "usage: udpgen HOST PORT --inflight N --size BYTES --duration SECONDS\n"
    "              [--warmup SECONDS] [--timeout-ms MS] [--hold]\n",
};

static uint64_t errors, lost, late, send_errors;

static size_t offset_of(uint32_t id, uint64_t seq)
{
    return (size_t)((seq * 7919u + id) % PATTERN_PERIOD);
}

static unsigned char *sendbuf;

/* Send slot id's datagram number seq. */
static void send_dgram(struct slot *s, uint32_t id, int64_t t)
{
    s->sent_ns = t;
    memcpy(sendbuf, &id, 4);
    memcpy(sendbuf + 4, &s->seq, 8);
    memcpy(sendbuf + HEADER, pattern + offset_of(id, s->seq), msg_size - HEADER);
    for (;;) {
        ssize_t n = send(fd, sendbuf, msg_size, 0);
        if (n == (ssize_t)msg_size)
            return;
        if (n < 0 && errno == EINTR)
            continue;
        send_errors++;            /* the slot times out and sends again */
        return;
    }
}

int main(int argc, char **argv)
{
    const char *pos[2] = {NULL, NULL};      /* HOST PORT */
    long inflight = -1;
    long long size = -1;
    double duration = -1, warmup = 0, timeout_ms = 100;
    int hold = 0;
    const struct lg_opt opts[] = {
        {"--inflight", LG_LONG, &inflight}, {"--size", LG_LLONG, &size},
        {"--duration", LG_DOUBLE, &duration}, {"--warmup", LG_DOUBLE, &warmup},
        {"--timeout-ms", LG_DOUBLE, &timeout_ms}, {"--hold", LG_FLAG, &hold},
        {NULL, LG_FLAG, NULL},
    };
    lg_parse_args(argc, argv, opts, pos, 2, &usage);
    const char *host = pos[0];
    long port = pos[1] ? strtol(pos[1], NULL, 10) : -1;
    if (!host || port <= 0 || inflight <= 0 || size <= 0 || duration <= 0 || warmup < 0
            || timeout_ms <= 0)
        lg_die_usage(&usage, "HOST, PORT, --inflight, --size and --duration are required");
    if (port > 65535 || inflight > 65536 || duration > 3600)
        lg_die_usage(&usage, "argument out of range");
    if (size < (long long)HEADER + 4 || size > (long long)MAX_DGRAM)
        lg_die_usage(&usage, "--size must be between 16 and 65507");

    int family = AF_INET;
    unsigned char addr[16];
    if (!lg_loopback(host, &family, addr))
        lg_die_usage(&usage, "HOST must be a loopback address (127.0.0.0/8, ::1, localhost)");
    struct sockaddr_storage ss;
    socklen_t sslen = lg_sockaddr(&ss, family, addr, port, NULL);

    msg_size = (size_t)size;
    pattern = lg_make_pattern(msg_size + PATTERN_PERIOD);
    sendbuf = malloc(msg_size);
    unsigned char *rbuf = malloc(MAX_DGRAM + 1);
    struct slot *slots = calloc((size_t)inflight, sizeof(*slots));
    if (!pattern || !sendbuf || !rbuf || !slots) {
        fprintf(stderr, "udpgen: out of memory\n");
        return 2;
    }
    fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        perror("udpgen: socket");
        return 2;
    }
    int rcv = 4 << 20;            /* clamped to net.core.rmem_max */
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    if (connect(fd, (struct sockaddr *)&ss, sslen) < 0) {
        perror("udpgen: connect");
        return 2;
    }

    int64_t timeout_ns = (int64_t)(timeout_ms * 1e6);
    int64_t t_begin = lg_now_ns();
    int64_t t_window = t_begin + (int64_t)(warmup * 1e9);
    int64_t t_end = t_window + (int64_t)(duration * 1e9);
    int measuring = warmup <= 0;
    int64_t t_measure = t_begin;
    uint64_t requests = 0;
    uint64_t errors_at_window = 0, lost_at_window = 0, late_at_window = 0,
             send_errors_at_window = 0;
    struct rusage ru0;

    if (measuring) {
        fputs("START\n", stdout);
        fflush(stdout);
    }
    getrusage(RUSAGE_SELF, &ru0);
    for (long i = 0; i < inflight; i++) {
        slots[i].seq = 1;
        send_dgram(&slots[i], (uint32_t)i, t_begin);
    }

    int64_t t = lg_now_ns();
    int64_t next_scan = t + timeout_ns / 4;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (t < t_end) {
        if (!measuring && t >= t_window) {
            measuring = 1;
            t_measure = t;
            errors_at_window = errors;
            lost_at_window = lost;
            late_at_window = late;
            send_errors_at_window = send_errors;
            getrusage(RUSAGE_SELF, &ru0);
            fputs("START\n", stdout);
            fflush(stdout);
        }
        int64_t until = measuring ? t_end : t_window;
        if (next_scan < until)
            until = next_scan;
        int timeout = (int)((until - t + 999999) / 1000000);
        if (timeout < 0)
            timeout = 0;
        int n = poll(&pfd, 1, timeout);
        if (n < 0 && errno != EINTR) {
            perror("udpgen: poll");
            return 2;
        }
        t = lg_now_ns();
        if (n > 0) {
            /* Drain the socket (at most one window's worth, so the clock
             * is looked at again); every verified echo starts its slot's
             * next datagram at once. */
            for (long batch = 0; batch < inflight + 16; batch++) {
                ssize_t r = recv(fd, rbuf, MAX_DGRAM + 1, 0);
                if (r < 0) {
                    if (errno == EINTR)
                        continue;
                    if (errno == EAGAIN || errno == EWOULDBLOCK)
                        break;
                    send_errors++;        /* ECONNREFUSED: an ICMP error queued */
                    break;
                }
                uint32_t id;
                uint64_t seq;
                if ((size_t)r != msg_size) {
                    errors++;
                    continue;
                }
                t = lg_now_ns();
                memcpy(&id, rbuf, 4);
                memcpy(&seq, rbuf + 4, 8);
                if (id >= (uint32_t)inflight || seq == 0) {
                    errors++;
                    continue;
                }
                struct slot *s = &slots[id];
                if (seq != s->seq || s->sent_ns == 0) {
                    if (seq < s->seq)
                        late++;           /* an echo we had given up on */
                    else
                        errors++;         /* never sent: corrupted header */
                    continue;
                }
                if (memcmp(rbuf + HEADER, pattern + offset_of(id, seq),
                           msg_size - HEADER) != 0) {
                    errors++;
                    continue;             /* the slot times out and resends */
                }
                if (measuring && t < t_end) {
                    requests++;
                    lg_add_latency(&lat, t - s->sent_ns);
                }
                s->sent_ns = 0;
                if (t >= t_end)
                    continue;
                s->seq++;
                send_dgram(s, id, t);
            }
        }
        if (t >= next_scan) {
            for (long i = 0; i < inflight; i++) {
                struct slot *s = &slots[i];
                if (t - s->sent_ns >= timeout_ns && t < t_end) {
                    lost++;
                    s->seq++;
                    send_dgram(s, (uint32_t)i, t);
                }
            }
            next_scan = t + timeout_ns / 4;
        }
    }
    int64_t t_stop = lg_now_ns();
    if (t_stop > t_end)
        t_stop = t_end;
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);

    double seconds = measuring ? (double)(t_stop - t_measure) / 1e9 : 0.0;
    lg_print_head(requests, seconds, msg_size, errors - errors_at_window, errors_at_window);
    printf("\"lost\": %llu, \"late\": %llu, \"send_errors\": %llu, \"warmup_lost\": %llu, "
           "\"inflight\": %ld, ",
           (unsigned long long)(lost - lost_at_window),
           (unsigned long long)(late - late_at_window),
           (unsigned long long)(send_errors - send_errors_at_window),
           (unsigned long long)lost_at_window, inflight);
    lg_print_tail(msg_size, &lat, lg_cpu_seconds(&ru0, &ru1));
    printf("}\n");
    fflush(stdout);

    if (hold)
        lg_hold();
    close(fd);
    return errors ? 1 : 0;
}
