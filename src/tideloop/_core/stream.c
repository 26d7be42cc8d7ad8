/* Stream socket transports: TCP and Unix.
 *
 * Behaviour follows asyncio's _SelectorSocketTransport (selector_events.py):
 * the same callbacks in the same order, the same errors and log messages.
 * What differs is how: reads go into the loop's spare bytes and become one
 * bytes object (recvbuf.c); writes are tried at once and the rest is queued
 * as references to immutable bytes (mutable buffers are copied) and flushed
 * with writev(); the fd table calls the reader and writer in C.
 *
 * May call: transport.c, loop.c, fdtable.c, recvbuf.c, sockaddr.c. */
#define _GNU_SOURCE
#include "transport.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>


/* ---- reading ---- */

static int
on_eof(TransportObject *self)
{
    if (self->loop->debug) {
        PyObject *r = PyObject_CallMethod(self->loop->state->logger, "debug",
                                          "sO", "%r received EOF",
                                          (PyObject *)self);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    PyObject *keep = PyObject_CallMethodNoArgs(self->protocol,
                                               self->loop->state->str_eof_received);
    if (keep == NULL)
        return tl_tr_fail(self, "Fatal error: protocol.eof_received() call failed.");
    int k = PyObject_IsTrue(keep);
    Py_DECREF(keep);
    if (k < 0)
        return tl_tr_fail(self, "Fatal error: protocol.eof_received() call failed.");
    if (k)
        return tl_tr_remove_reader(self);
    PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self,
                                            self->loop->state->str_close);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* A read that brought no data: n == 0 is the peer's EOF, n < 0 failed
 * with err (would block: nothing to do). */
static int
read_ended(TransportObject *self, ssize_t n, int err)
{
    if (n == 0)
        return on_eof(self);
    if (err == EAGAIN || err == EWOULDBLOCK)
        return 0;
    return tl_tr_fatal_errno(self, err, "Fatal read error on socket transport");
}

static int
read_buffered(TransportObject *self)
{
    PyObject *arg = PyLong_FromLong(-1);
    if (arg == NULL)
        return -1;
    /* Looked up per call, as asyncio does: a protocol may swap methods. */
    PyObject *cargs[2] = {self->protocol, arg};
    PyObject *buf = PyObject_VectorcallMethod(
        self->loop->state->str_get_buffer, cargs,
        2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(arg);
    if (buf == NULL)
        return tl_tr_fail(self, "Fatal error: protocol.get_buffer() call failed.");
    /* asyncio checks len(buf) here and lets recv_into() judge the rest. */
    Py_ssize_t blen = PyObject_Size(buf);
    if (blen <= 0) {
        Py_DECREF(buf);
        if (blen == 0)
            PyErr_SetString(PyExc_RuntimeError,
                            "get_buffer() returned an empty buffer");
        return tl_tr_fail(self, "Fatal error: protocol.get_buffer() call failed.");
    }
    Py_buffer view;
    if (tl_recv_into_buffer(buf, &view) < 0) {
        Py_DECREF(buf);
        return tl_tr_fail(self, "Fatal read error on socket transport");
    }
    ssize_t n;
    do {
        n = recv(self->fd, view.buf, (size_t)view.len, 0);
    } while (tl_retry_eintr(n));
    int err = errno;
    PyBuffer_Release(&view);
    Py_DECREF(buf);
    if (n < 0 && PyErr_Occurred())
        return -1;              /* a signal handler raised */
    if (n <= 0)
        return read_ended(self, n, err);
    PyObject *nb = PyLong_FromSsize_t(n);
    if (nb == NULL)
        return -1;
    PyObject *uargs[2] = {self->protocol, nb};
    PyObject *r = PyObject_VectorcallMethod(
        self->loop->state->str_buffer_updated, uargs,
        2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(nb);
    if (r == NULL)
        return tl_tr_fail(self, "Fatal error: protocol.buffer_updated() call failed.");
    Py_DECREF(r);
    return 0;
}

/* A C protocol (tls.c's engine): one recv into the loop's TLS area, fed
 * to it as SSLProtocol.buffer_updated() would be. */
static int
read_cproto(TransportObject *self)
{
    char *area = tl_recv_tls_area(&self->loop->recv);
    if (area == NULL)
        return -1;
    ssize_t n;
    do {
        n = recv(self->fd, area, TL_TLS_AREA_SIZE, 0);
    } while (tl_retry_eintr(n));
    if (n < 0 && PyErr_Occurred())
        return -1;              /* a signal handler raised */
    if (n <= 0)
        return read_ended(self, n, errno);
    tl_cproto *p = (tl_cproto *)Py_NewRef(self->cproto);
    int rc = p->feed(p, area, n);
    if (rc < 0)
        rc = tl_tr_fail(self, p->feed_error);
    Py_DECREF(p);
    return rc;
}

/* asyncio's _read_ready: one read, handed to the protocol. */
static int
stream_read_ready(PyObject *obj)
{
    TransportObject *self = (TransportObject *)obj;
    if (self->conn_lost || self->fd < 0)
        return 0;
    if (self->cproto != NULL)
        return read_cproto(self);
    if (self->buffered)
        return read_buffered(self);
    PyObject *data;
    int err;
    if (tl_recv_spare(&self->loop->recv, self->fd, TL_SPARE_SIZE, 0,
                      &self->small_reads, &data, &err) < 0)
        return -1;
    if (data == NULL)
        return read_ended(self, err == 0 ? 0 : -1, err);
    PyObject *dargs[2] = {self->protocol, data};
    PyObject *r = PyObject_VectorcallMethod(
        self->loop->state->str_data_received, dargs,
        2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    tl_recv_give_back(&self->loop->recv, data);
    if (r == NULL)
        return tl_tr_fail(self, "Fatal error: protocol.data_received() call failed.");
    Py_DECREF(r);
    return 0;
}

/* ---- writing ---- */

static int
write_bytes(TransportObject *self, PyObject *obj, const char *data,
            Py_ssize_t len)
{
    if (self->conn_lost)
        return tl_tr_count_lost_write(self, "socket.send() raised exception.");
    if (self->wq_len == 0) {
        /* Nothing queued: try to send now. */
        ssize_t n;
        do {
            n = send(self->fd, data, (size_t)len, MSG_NOSIGNAL);
        } while (tl_retry_eintr(n));
        if (n < 0 && PyErr_Occurred())
            return -1;          /* a signal handler raised */
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return tl_tr_fatal_errno(self, errno,
                                         "Fatal write error on socket transport");
            n = 0;
        }
        if (n == len)
            return 0;
        data += n;
        len -= n;
        if (tl_tr_add_writer(self) < 0)
            return -1;
    }
    if (tl_wq_push(self, obj, data, len) < 0)
        return -1;
    return tl_tr_maybe_pause_protocol(self);
}

/* writelines(): queued only; the caller sends the whole queue after (a
 * lost connection counts the write as write_bytes() does). */
static int
queue_bytes(TransportObject *self, PyObject *obj, const char *data,
            Py_ssize_t len)
{
    if (self->conn_lost)
        return write_bytes(self, obj, data, len);
    return tl_wq_push(self, obj, data, len);
}

/* method: "write" or "writelines", as the stock messages name it. */
static int
check_can_write(TransportObject *self, const char *method)
{
    if (self->eof) {
        PyErr_Format(PyExc_RuntimeError, "Cannot call %s() after write_eof()", method);
        return -1;
    }
    if (self->empty_waiter != NULL) {
        PyErr_Format(PyExc_RuntimeError,
                     "unable to %s; sendfile is in progress", method);
        return -1;
    }
    return 0;
}

/* Inlined: write() is the hot caller, and queue_only is a constant there. */
static inline __attribute__((always_inline)) int
write_object(TransportObject *self, PyObject *data, int queue_only)
{
    if (PyBytes_CheckExact(data)) {
        Py_ssize_t len = PyBytes_GET_SIZE(data);
        if (len == 0)
            return 0;
        return queue_only ? queue_bytes(self, data, PyBytes_AS_STRING(data), len)
                          : write_bytes(self, data, PyBytes_AS_STRING(data), len);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        int lost;
        if (tl_tr_unusable_buffer(self, "Fatal write error on socket transport",
                                  "can't set bytearray slice from memoryview",
                                  &lost) < 0)
            return -1;
        return lost ? write_bytes(self, NULL, NULL, 1) : 0;
    }
    int rc = 0;
    if (view.len > 0)
        rc = queue_only ? queue_bytes(self, data, view.buf, view.len)
                        : write_bytes(self, data, view.buf, view.len);
    PyBuffer_Release(&view);
    return rc;
}

int
tl_stream_write_buf(TransportObject *self, const char *buf, Py_ssize_t len)
{
    if (check_can_write(self, "write") < 0)
        return -1;
    return len == 0 ? 0 : write_bytes(self, NULL, buf, len);
}

static PyObject *
tl_stream_write(TransportObject *self, PyObject *data)
{
    if (tl_tr_check_writable_data(self->loop->state->write_type_error_prefix,
                                  data) < 0 ||
        check_can_write(self, "write") < 0)
        return NULL;
    if (write_object(self, data, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int stream_write_ready(PyObject *obj);

/* Write the items of seq (checked already) as the stock writelines()
 * does, in one send: 3.12+ queue them all and send the queue with one
 * sendmsg() (_write_ready), 3.11 joins them and writes once (behind a
 * queue, it only queues, as write() does).  What is left waits for the
 * writer; the protocol is paused (or not) once, after. */
static PyObject *
write_items(TransportObject *self, PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (n == 1 || self->conn_lost) {
        for (Py_ssize_t i = 0; i < n; i++)
            if (write_object(self, items[i], 0) < 0)
                return NULL;
        Py_RETURN_NONE;
    }
    size_t queued = self->wq_len;
    for (Py_ssize_t i = 0; i < n && !self->conn_lost; i++)
        if (write_object(self, items[i], 1) < 0)
            return NULL;
    if (self->wq_len == queued || self->conn_lost)
        Py_RETURN_NONE;             /* nothing to send, or a buffer refused */
    int send_now = queued == 0 || self->loop->state->writelines_views;
    if (send_now && stream_write_ready((PyObject *)self) < 0)
        return NULL;
    if (self->wq_len && !self->conn_lost && !(self->watching & TL_POLL_WRITE) &&
        tl_tr_add_writer(self) < 0)
        return NULL;
    if (tl_tr_maybe_pause_protocol(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* 3.12+: the stock socket transport's own writelines(): a false argument
 * writes nothing, a lost connection counts one write, every item must give
 * a memoryview (later releases drop false items first), then all are
 * queued.  tideloop copies mutable buffers where the stock transport keeps
 * views of them (a deliberate difference: the caller may reuse its buffer). */
static PyObject *
writelines_views(TransportObject *self, PyObject *list)
{
    if (check_can_write(self, "writelines") < 0)
        return NULL;
    int truth = PyObject_IsTrue(list);
    if (truth <= 0)
        return truth < 0 ? NULL : Py_NewRef(Py_None);
    if (self->conn_lost) {
        if (write_bytes(self, NULL, NULL, 0) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *it = PyObject_GetIter(list);
    if (it == NULL)
        return NULL;
    PyObject *kept = PyList_New(0), *item;
    if (kept == NULL) {
        Py_DECREF(it);
        return NULL;
    }
    while ((item = PyIter_Next(it)) != NULL) {
        int keep = 1;
        if (self->loop->state->writelines_skips_empty)
            keep = PyObject_IsTrue(item);
        if (keep > 0 && !PyObject_CheckBuffer(item)) {
            PyErr_Format(PyExc_TypeError,
                         "memoryview: a bytes-like object is required, not '%.200s'",
                         tl_type_name(Py_TYPE(item)));
            keep = -1;
        }
        if (keep > 0 && PyList_Append(kept, item) < 0)
            keep = -1;
        Py_DECREF(item);
        if (keep < 0)
            break;
    }
    Py_DECREF(it);
    PyObject *r = PyErr_Occurred() ? NULL : write_items(self, kept);
    Py_DECREF(kept);
    return r;
}

static PyObject *
tl_stream_writelines(TransportObject *self, PyObject *list)
{
    if (self->loop->state->writelines_views)
        return writelines_views(self, list);
    /* 3.11: WriteTransport.writelines joins the items first: check them all
     * before writing any. */
    PyObject *seq = PySequence_Fast(list, "writelines() argument must be iterable");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_CheckBuffer(items[i])) {
            PyErr_Format(PyExc_TypeError,
                         "sequence item %zd: expected a bytes-like object, "
                         "%.80s found", i, Py_TYPE(items[i])->tp_name);
            Py_DECREF(seq);
            return NULL;
        }
    }
    if (check_can_write(self, "write") < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    if (self->conn_lost) {
        /* One joined write for asyncio: one lost write to count. */
        Py_ssize_t total = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t len = PyObject_Length(items[i]);
            if (len < 0) {
                /* A buffer without len() (b''.join takes it) */
                if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                    Py_DECREF(seq);
                    return NULL;
                }
                PyErr_Clear();
                len = 1;
            }
            total += len;
        }
        Py_DECREF(seq);
        if (total && write_bytes(self, NULL, NULL, 0) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *r = write_items(self, seq);
    Py_DECREF(seq);
    return r;
}

/* asyncio's _write_ready: flush the queue with one sendmsg(). */
static int
stream_write_ready(PyObject *obj)
{
    TransportObject *self = (TransportObject *)obj;
    tl_state *st = self->loop->state;
    if (self->conn_lost || self->fd < 0 || self->wq_len == 0)
        return 0;
    struct iovec iov[TL_WRITEV_MAX];
    int cnt = tl_wq_iov(self, iov);
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    ssize_t n;
    do {
        n = sendmsg(self->fd, &msg, MSG_NOSIGNAL);
    } while (tl_retry_eintr(n));
    if (n < 0) {
        if (PyErr_Occurred())
            return -1;          /* a signal handler raised */
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        PyErr_SetFromErrno(PyExc_OSError);
        PyObject *exc = tl_err_get_raised();
        int rc = tl_tr_remove_writer(self);
        tl_wq_clear(self);
        if (rc == 0)
            rc = tl_tr_fatal_error(self, exc, "Fatal write error on socket transport");
        if (rc == 0 && self->empty_waiter != NULL) {
            PyObject *r = PyObject_CallMethodOneArg(self->empty_waiter,
                                                    st->str_set_exception, exc);
            if (r == NULL)
                rc = -1;
            Py_XDECREF(r);
        }
        Py_XDECREF(exc);
        return rc;
    }
    if (n > 0)
        tl_wq_consume(self, n);
    if (tl_tr_maybe_resume_protocol(self) < 0)   /* may write more */
        return -1;
    if (self->wq_len)
        return 0;
    if (tl_tr_remove_writer(self) < 0)
        return -1;
    if (self->empty_waiter != NULL) {
        PyObject *r = PyObject_CallMethodOneArg(self->empty_waiter,
                                                st->str_set_result, Py_None);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    if (self->head.closing)
        return tl_tr_connection_lost(self, Py_None);
    if (self->eof && self->fd >= 0 && shutdown(self->fd, SHUT_WR) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static PyObject *
stream_write_eof(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->head.closing || self->eof)
        Py_RETURN_NONE;
    self->eof = 1;
    if (self->wq_len == 0 && self->fd >= 0) {
        if (shutdown(self->fd, SHUT_WR) < 0)
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *
stream_can_write_eof(TransportObject *Py_UNUSED(self),
                 PyObject *Py_UNUSED(ignored))
{
    Py_RETURN_TRUE;
}

static PyObject *
make_empty_waiter(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->empty_waiter != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Empty waiter is already set");
        return NULL;
    }
    PyObject *fut = PyObject_CallMethod((PyObject *)self->loop, "create_future",
                                        NULL);
    if (fut == NULL)
        return NULL;
    self->empty_waiter = fut;
    if (self->wq_len == 0) {
        PyObject *r = PyObject_CallMethod(fut, "set_result", "O", Py_None);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    return Py_NewRef(fut);
}

static PyObject *
reset_empty_waiter(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    Py_CLEAR(self->empty_waiter);
    Py_RETURN_NONE;
}

/* sendfile() hands the fd to sock_sendfile for a while: the public
 * add_writer must not see it as a transport's meanwhile. */
static PyObject *
release_fd(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    tl_fd_clear_transport(self->loop, self->fd, &self->head);
    Py_RETURN_NONE;
}

static PyObject *
claim_fd(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fd >= 0 &&
        tl_fd_set_transport(self->loop, self->fd, &self->head) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Setting _sock (tests wrap the socket to watch it): the new object must own
 * the same file descriptor, which is what this transport works on. */
static int
set_sock_attr(TransportObject *self, PyObject *value,
                    void *Py_UNUSED(c))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete _sock");
        return -1;
    }
    int fd;
    if (tl_call_fileno(self->loop->state, value, &fd) < 0)
        return -1;
    if (fd != self->fd) {
        PyErr_Format(PyExc_ValueError,
                     "_sock must own this transport's file descriptor %d, not %d",
                     self->fd, fd);
        return -1;
    }
    Py_XSETREF(self->sock, Py_NewRef(value));
    return 0;
}

/* asyncio's socket transport keeps the callback its reader calls in
 * _read_ready_cb, None once close() was called or the connection lost. */
static PyObject *
get_read_ready_cb(TransportObject *self, void *Py_UNUSED(c))
{
    if (self->head.closing || self->conn_lost)
        Py_RETURN_NONE;
    return PyObject_GetAttrString((PyObject *)self, "_read_ready");
}

static PyObject *
get_server_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(self->server ? self->server : Py_None);
}

static PyObject *
get_eof_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->eof);
}

/* 3.15's transport._context: the connection's Context, or None. */
static PyObject *
get_context_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(self->context != NULL ? self->context : Py_None);
}

static PyObject *
get_sendfile_compatible(TransportObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(self->loop->state->sendfile_try_native);
}

static PyObject *
get_start_tls_compatible(TransportObject *Py_UNUSED(self),
                            void *Py_UNUSED(c))
{
    Py_RETURN_TRUE;
}

static const tl_transport_ops stream_ops = {
    .read_ready = stream_read_ready,
    .write_ready = stream_write_ready,
    .close_after_error = tl_tr_force_close,
    .is_socket = 1,
};

TransportObject *
tl_stream_new(LoopObject *loop, int fd, PyObject *sock, int family, int type,
              int proto, PyObject *protocol, PyObject *waiter, PyObject *extra,
              PyObject *server, const struct sockaddr *peer, socklen_t peer_len,
              PyObject *context)
{
    /* TCP_NODELAY, as asyncio's _set_nodelay decides it. */
    if ((family == AF_INET || family == AF_INET6) && type == SOCK_STREAM &&
        proto == IPPROTO_TCP) {
        int one = 1;
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return NULL;
        }
    }
    return tl_tr_create(loop, loop->state->SocketTransportType, &stream_ops,
                        fd, sock, family, type, proto, protocol, waiter, extra,
                        server, peer, peer_len, context);
}

/* Loop._make_socket_transport(sock, protocol, waiter=None, *, extra=None,
 * server=None, context=None); context (3.15+): the Context every protocol
 * callback of the connection runs in. */
static PyObject *
loop_make_socket_transport(LoopObject *loop, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sock", "protocol", "waiter", "extra", "server",
                             "context", NULL};
    PyObject *sock, *protocol, *waiter = Py_None, *extra = Py_None,
             *server = Py_None, *context = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O$OOO:_make_socket_transport",
                                     kwlist, &sock, &protocol, &waiter, &extra,
                                     &server, &context))
        return NULL;
    if (tl_check_context_arg(context) < 0)
        return NULL;
    int fd, family, type, proto;
    if (tl_sock_info(loop->state, sock, &fd, &family, &type, &proto) < 0)
        return NULL;
    return (PyObject *)tl_stream_new(loop, fd, sock, family, type, proto,
                                     protocol, waiter, extra, server, NULL, 0,
                                     context);
}

const PyMethodDef tl_stream_loop_methods[] = {
    {"_make_socket_transport",
     (PyCFunction)(void (*)(void))loop_make_socket_transport,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL}
};

static PyMethodDef stream_methods[] = {
    {"write", (PyCFunction)tl_stream_write, METH_O, "Write data; never blocks."},
    {"writelines", (PyCFunction)tl_stream_writelines, METH_O, NULL},
    {"write_eof", (PyCFunction)stream_write_eof, METH_NOARGS, NULL},
    {"can_write_eof", (PyCFunction)stream_can_write_eof, METH_NOARGS, NULL},
    {"resume_reading", (PyCFunction)tl_tr_resume_reading, METH_NOARGS, NULL},
    {"_make_empty_waiter", (PyCFunction)make_empty_waiter, METH_NOARGS, NULL},
    {"_reset_empty_waiter", (PyCFunction)reset_empty_waiter, METH_NOARGS, NULL},
    {"_release_fd", (PyCFunction)release_fd, METH_NOARGS, NULL},
    {"_claim_fd", (PyCFunction)claim_fd, METH_NOARGS, NULL},
    TL_TR_SOCKET_METHODS,
    TL_TR_READ_METHODS,
    TL_TR_WRITE_METHODS,
    TL_TR_BASE_METHODS,
    {NULL}
};

static PyGetSetDef stream_getset[] = {
    {"_sock", (getter)tl_tr_get_sock_attr, (setter)set_sock_attr, NULL, NULL},
    {"_read_ready_cb", (getter)get_read_ready_cb, NULL, NULL, NULL},
    {"_server", (getter)get_server_attr, NULL, NULL, NULL},
    {"_eof", (getter)get_eof_attr, NULL, NULL, NULL},
    {"_context", (getter)get_context_attr, NULL, NULL, NULL},
    {"_sendfile_compatible", (getter)get_sendfile_compatible, NULL, NULL, NULL},
    {"_start_tls_compatible", (getter)get_start_tls_compatible, NULL, NULL,
     NULL},
    TL_TR_SOCKET_GETSET,
    TL_TR_BASE_GETSET,
    {NULL}
};

static PyType_Slot stream_slots[] = {
    TL_TR_SLOTS(tl_tr_repr, stream_methods, stream_getset,
                "A TCP or Unix stream socket transport.")
};

PyType_Spec tl_socket_transport_spec =
    TL_TR_SPEC("tideloop.SocketTransport", TransportObject, stream_slots);
