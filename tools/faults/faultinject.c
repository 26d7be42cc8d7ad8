/* A fault injector for tideloop's fault runs (stress/faults.py): preloaded
 * (LD_PRELOAD), it makes some calls of the socket, pipe and epoll family fail
 * with an errno, or move fewer bytes than asked, at random, on the
 * non-blocking sockets and pipes a loop uses.  Everything else (files,
 * blocking fds, the interpreter's own I/O) is left alone.
 *
 * Environment (read at load):
 *   TL_FAULTS        kinds to inject, comma-separated: EINTR, EAGAIN, SHORT
 *                    (the loop must carry on as if nothing happened), and
 *                    ECONNRESET, EPIPE, ENOBUFS, ENOMEM, EMFILE, ECONNABORTED
 *                    (a connection, an accept, a registration fails)
 *   TL_FAULT_RATE    probability per eligible call (default 0.02)
 *   TL_FAULT_SEED    the random sequence's seed (default 1)
 *   TL_FAULT_REPORT  a path prefix: at exit, <prefix>.<pid>.json holds the
 *                    calls seen and the faults injected per call and kind
 *   TL_FAULT_ARM     file whose existence turns injection on (the workload
 *                    creates it once set up, removes it before checking)
 *
 * Not a tideloop source file: built by stress/faults.py with gcc -shared. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { K_EINTR, K_EAGAIN, K_SHORT, K_ECONNRESET, K_EPIPE, K_ENOBUFS, K_ENOMEM, K_EMFILE,
       K_ECONNABORTED, K_N };
static const char *const kind_names[K_N] = {"EINTR", "EAGAIN", "SHORT", "ECONNRESET", "EPIPE",
                                            "ENOBUFS", "ENOMEM", "EMFILE", "ECONNABORTED"};
static const int kind_errno[K_N] = {EINTR, EAGAIN, 0, ECONNRESET, EPIPE, ENOBUFS, ENOMEM, EMFILE,
                                    ECONNABORTED};

enum { C_SEND, C_RECV, C_SENDTO, C_RECVFROM, C_SENDMSG, C_RECVMSG, C_SENDMMSG, C_RECVMMSG,
       C_ACCEPT4, C_ACCEPT, C_READ, C_WRITE, C_READV, C_WRITEV, C_EPOLL_WAIT, C_EPOLL_CTL,
       C_EPOLL_PWAIT2, C_PIDFD_OPEN, C_N };
static const char *const call_names[C_N] = {
    "send", "recv", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg",
    "accept4", "accept", "read", "write", "readv", "writev", "epoll_wait", "epoll_ctl",
    "epoll_pwait2", "pidfd_open"};

/* Process-wide by nature (one preloaded library per process); guarded by mu. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned enabled;            /* bit per kind */
static double rate = 0.02;
static uint64_t rng = 1;
static const char *report, *arm;
static unsigned long seen[C_N], injected[C_N][K_N];
static int in_report;

static uint64_t
next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void
write_report(void)
{
    if (report == NULL)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d.json", report, (int)getpid());
    in_report = 1;
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return;
    fprintf(f, "{\"pid\": %d, \"calls\": {", (int)getpid());
    for (int c = 0; c < C_N; c++) {
        fprintf(f, "%s\"%s\": {\"seen\": %lu", c ? ", " : "", call_names[c], seen[c]);
        for (int k = 0; k < K_N; k++)
            if (injected[c][k])
                fprintf(f, ", \"%s\": %lu", kind_names[k], injected[c][k]);
        fprintf(f, "}");
    }
    fprintf(f, "}}\n");
    fclose(f);
}

__attribute__((constructor)) static void
setup(void)
{
    const char *kinds = getenv("TL_FAULTS");
    if (kinds != NULL)
        for (int k = 0; k < K_N; k++) {
            const char *p = strstr(kinds, kind_names[k]);
            if (p != NULL) {
                size_t n = strlen(kind_names[k]);
                if ((p == kinds || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
                    enabled |= 1u << k;
            }
        }
    const char *r = getenv("TL_FAULT_RATE");
    if (r != NULL)
        rate = atof(r);
    const char *s = getenv("TL_FAULT_SEED");
    rng = (s != NULL ? strtoull(s, NULL, 10) : 1) * 2654435761u + (uint64_t)getpid();
    if (rng == 0)
        rng = 1;
    report = getenv("TL_FAULT_REPORT");
    arm = getenv("TL_FAULT_ARM");
    atexit(write_report);
}

/* What fd is, if a loop polls it (non-blocking): F_NONE, F_PIPE, F_STREAM
 * (a stream socket) or F_DGRAM. */
enum { F_NONE, F_PIPE, F_STREAM, F_DGRAM };

static int
fd_class(int fd)
{
    if (fd <= 2)
        return F_NONE;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || !(fl & O_NONBLOCK))
        return F_NONE;
    struct stat st;
    if (fstat(fd, &st) < 0)
        return F_NONE;
    if (S_ISFIFO(st.st_mode))
        return F_PIPE;
    if (!S_ISSOCK(st.st_mode))
        return F_NONE;
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_DGRAM)
        return F_DGRAM;
    return F_STREAM;
}

static int
armed(void)
{
    return enabled != 0 && !in_report && (arm == NULL || access(arm, F_OK) == 0);
}

/* The fault to inject into this call: -1 none, else a kind among those
 * allowed (a bit mask) for the call. */
static int
choose(int call, unsigned allowed)
{
    /* trylock: a signal handler (the interpreter's, writing the wakeup fd)
     * may interrupt a thread that holds mu. */
    if (pthread_mutex_trylock(&mu) != 0)
        return -1;
    seen[call]++;
    int kind = -1;
    unsigned usable = allowed & enabled;
    if (usable && (double)(next_random() % 1000000) / 1e6 < rate) {
        int n = __builtin_popcount(usable);
        int pick = (int)(next_random() % (uint64_t)n);
        for (int k = 0; k < K_N; k++)
            if ((usable >> k) & 1u && pick-- == 0) {
                kind = k;
                break;
            }
        injected[call][kind]++;
    }
    pthread_mutex_unlock(&mu);
    return kind;
}

#define B(k) (1u << (k))
#define IO_SAFE (B(K_EINTR) | B(K_EAGAIN))
#define WRITE_FAIL (B(K_ECONNRESET) | B(K_EPIPE) | B(K_ENOBUFS))
#define READ_FAIL (B(K_ECONNRESET))

#define REAL(name) \
    static __typeof__(name) *real_##name; \
    if (real_##name == NULL) \
        real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

/* A fault for an I/O call on fd: -1 to make the real call as asked, else
 * the kind (SHORT: the caller shrinks its request). */
static int
io_fault(int call, int fd, int reading)
{
    if (!armed())
        return -1;
    int cls = fd_class(fd);
    if (cls == F_NONE)
        return -1;
    unsigned allowed = IO_SAFE;
    if (cls != F_DGRAM)             /* a datagram is never cut short */
        allowed |= B(K_SHORT);
    if (cls == F_STREAM)
        allowed |= reading ? READ_FAIL : WRITE_FAIL;
    else if (cls == F_PIPE && !reading)
        allowed |= B(K_EPIPE);
    return choose(call, allowed);
}

static ssize_t
fail(int kind)
{
    errno = kind_errno[kind];
    return -1;
}

static size_t
shorter(size_t len)
{
    return len > 1 ? 1 + (size_t)(next_random() % (len - 1)) : len;
}

ssize_t
send(int fd, const void *buf, size_t len, int flags)
{
    REAL(send);
    int k = io_fault(C_SEND, fd, 0);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return real_send(fd, buf, k == K_SHORT ? shorter(len) : len, flags);
}

ssize_t
recv(int fd, void *buf, size_t len, int flags)
{
    REAL(recv);
    int k = io_fault(C_RECV, fd, 1);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return real_recv(fd, buf, k == K_SHORT ? shorter(len) : len, flags);
}

ssize_t
sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *a, socklen_t al)
{
    REAL(sendto);
    int k = io_fault(C_SENDTO, fd, 0);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return real_sendto(fd, buf, k == K_SHORT ? shorter(len) : len, flags, a, al);
}

ssize_t
recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *a, socklen_t *al)
{
    REAL(recvfrom);
    int k = io_fault(C_RECVFROM, fd, 1);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return real_recvfrom(fd, buf, k == K_SHORT ? shorter(len) : len, flags, a, al);
}

/* SHORT on a message: the iovecs cut to a shorter total. */
static ssize_t
msg_short(ssize_t (*real)(int, const struct msghdr *, int), int fd, const struct msghdr *msg,
          int flags)
{
    size_t total = 0;
    for (size_t i = 0; i < msg->msg_iovlen; i++)
        total += msg->msg_iov[i].iov_len;
    size_t want = shorter(total);
    struct iovec iov[64];
    size_t n = 0;
    for (size_t i = 0; i < msg->msg_iovlen && n < 64 && want > 0; i++, n++) {
        iov[n] = msg->msg_iov[i];
        if (iov[n].iov_len > want)
            iov[n].iov_len = want;
        want -= iov[n].iov_len;
    }
    struct msghdr m = *msg;
    m.msg_iov = iov;
    m.msg_iovlen = n;
    return real(fd, &m, flags);
}

ssize_t
sendmsg(int fd, const struct msghdr *msg, int flags)
{
    REAL(sendmsg);
    int k = io_fault(C_SENDMSG, fd, 0);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return k == K_SHORT ? msg_short(real_sendmsg, fd, msg, flags) : real_sendmsg(fd, msg, flags);
}

ssize_t
recvmsg(int fd, struct msghdr *msg, int flags)
{
    REAL(recvmsg);
    int k = io_fault(C_RECVMSG, fd, 1);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return k == K_SHORT ? msg_short((ssize_t (*)(int, const struct msghdr *, int))real_recvmsg,
                                    fd, msg, flags)
                        : real_recvmsg(fd, msg, flags);
}

int
sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
    REAL(sendmmsg);
    int k = io_fault(C_SENDMMSG, fd, 0);
    if (k >= 0 && k != K_SHORT)
        return (int)fail(k);
    return real_sendmmsg(fd, v, k == K_SHORT && n > 1 ? (unsigned)shorter(n) : n, flags);
}

int
recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *t)
{
    REAL(recvmmsg);
    int k = io_fault(C_RECVMMSG, fd, 1);
    if (k >= 0 && k != K_SHORT)
        return (int)fail(k);
    return real_recvmmsg(fd, v, k == K_SHORT && n > 1 ? (unsigned)shorter(n) : n, flags, t);
}

static int
accept_fault(int call, int fd)
{
    if (!armed() || fd_class(fd) != F_STREAM)
        return -1;
    return choose(call, IO_SAFE | B(K_EMFILE) | B(K_ECONNABORTED) | B(K_ENOBUFS));
}

int
accept4(int fd, struct sockaddr *a, socklen_t *al, int flags)
{
    REAL(accept4);
    int k = accept_fault(C_ACCEPT4, fd);
    if (k >= 0)
        return (int)fail(k);
    return real_accept4(fd, a, al, flags);
}

int
accept(int fd, struct sockaddr *a, socklen_t *al)
{
    REAL(accept);
    int k = accept_fault(C_ACCEPT, fd);
    if (k >= 0)
        return (int)fail(k);
    return real_accept(fd, a, al);
}

ssize_t
read(int fd, void *buf, size_t len)
{
    REAL(read);
    int k = io_fault(C_READ, fd, 1);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return real_read(fd, buf, k == K_SHORT ? shorter(len) : len);
}

ssize_t
write(int fd, const void *buf, size_t len)
{
    REAL(write);
    int k = io_fault(C_WRITE, fd, 0);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    return real_write(fd, buf, k == K_SHORT ? shorter(len) : len);
}

static int
iov_cut(const struct iovec *iov, int cnt, struct iovec *out)
{
    size_t total = 0;
    for (int i = 0; i < cnt; i++)
        total += iov[i].iov_len;
    size_t want = shorter(total);
    int n = 0;
    for (int i = 0; i < cnt && n < 64 && want > 0; i++, n++) {
        out[n] = iov[i];
        if (out[n].iov_len > want)
            out[n].iov_len = want;
        want -= out[n].iov_len;
    }
    return n;
}

ssize_t
readv(int fd, const struct iovec *iov, int cnt)
{
    REAL(readv);
    int k = io_fault(C_READV, fd, 1);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    if (k == K_SHORT) {
        struct iovec cut[64];
        return real_readv(fd, cut, iov_cut(iov, cnt, cut));
    }
    return real_readv(fd, iov, cnt);
}

ssize_t
writev(int fd, const struct iovec *iov, int cnt)
{
    REAL(writev);
    int k = io_fault(C_WRITEV, fd, 0);
    if (k >= 0 && k != K_SHORT)
        return fail(k);
    if (k == K_SHORT) {
        struct iovec cut[64];
        return real_writev(fd, cut, iov_cut(iov, cnt, cut));
    }
    return real_writev(fd, iov, cnt);
}

int
epoll_wait(int ep, struct epoll_event *ev, int max, int timeout)
{
    REAL(epoll_wait);
    if (armed() && choose(C_EPOLL_WAIT, B(K_EINTR)) >= 0)
        return (int)fail(K_EINTR);
    return real_epoll_wait(ep, ev, max, timeout);
}

int
epoll_ctl(int ep, int op, int fd, struct epoll_event *ev)
{
    REAL(epoll_ctl);
    /* Only adding a watch may fail (ENOMEM, as the kernel may): removing
     * or changing one is what cleanup does. */
    if (op == EPOLL_CTL_ADD && armed() && choose(C_EPOLL_CTL, B(K_ENOMEM)) >= 0)
        return (int)fail(K_ENOMEM);
    return real_epoll_ctl(ep, op, fd, ev);
}

/* syscall(): tideloop polls with epoll_pwait2 and CPython opens pidfds
 * through it.  Six long arguments pass any system call on through
 * (x86-64's convention); only those two are faulted. */
long
syscall(long number, ...)
{
    static long (*real_syscall)(long, ...);
    if (real_syscall == NULL)
        real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
#ifdef SYS_epoll_pwait2
    if (number == SYS_epoll_pwait2 && armed() && choose(C_EPOLL_PWAIT2, B(K_EINTR)) >= 0)
        return fail(K_EINTR);
#endif
#ifdef SYS_pidfd_open
    if (number == SYS_pidfd_open && armed() && choose(C_PIDFD_OPEN, B(K_EMFILE)) >= 0)
        return fail(K_EMFILE);
#endif
    return real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
