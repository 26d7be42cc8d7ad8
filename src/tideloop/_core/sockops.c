/* loop.sock_recv / sock_recv_into / sock_sendall / sock_accept.
 *
 * Each call returns a small awaitable (a coroutine as far as asyncio can
 * tell: it has __await__, send, throw and close) that tries the syscall when
 * first run and only when it would block creates a future, watches the fd
 * and yields the future to the task.  The fd callback retries the syscall
 * and resolves the future; a cancelled wait leaves no reader or writer.
 *
 * The wait is a one-shot Handle in the fd table, as asyncio's sock_* methods
 * wait through add_reader: another add_reader on the fd replaces (cancels)
 * it, and the operation sees that.
 *
 * May call: fdtable.c, handle.c, loop.c, recvbuf.c, sockaddr.c. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

enum { ST_NEW, ST_WAITING, ST_DONE };

typedef struct SockOpObject SockOpObject;

/* What each operation does: its argument checks (when first run, as in
 * asyncio's coroutines) and one try of its syscall (*res: the result, or
 * NULL when it would block). */
typedef struct {
    const char *name;           /* "sock_recv" */
    const char *argname;        /* its argument after sock, or NULL */
    int which;                  /* the fd event it waits for */
    int (*prepare)(SockOpObject *self);
    int (*attempt)(SockOpObject *self, PyObject **res);
} sockop_def;

struct SockOpObject {
    PyObject_HEAD
    LoopObject *loop;
    PyObject *sock;
    PyObject *data;             /* recv_into buffer / sendall data */
    PyObject *fut;
    PyObject *ready_cb;         /* bound self._ready, the fd callback */
    HandleObject *handle;       /* our registration; cancelled if replaced */
    Py_buffer view;
    Py_ssize_t nbytes;          /* recv size */
    Py_ssize_t pos;             /* sendall progress */
    int fd;
    const sockop_def *op;
    int state;
    int have_view;
    int registered;             /* TL_POLL_READ / TL_POLL_WRITE or 0 */
};


static PyObject *
accept_result(SockOpObject *self, int cfd, struct sockaddr *addr, socklen_t alen)
{
    tl_state *st = self->loop->state;
    int family, type, proto;
    PyObject *conn = NULL;
    /* SOCK_NONBLOCK in the type tells socket.socket() the fd is already
     * non-blocking (timeout 0.0, as asyncio's conn.setblocking(False)). */
    if (tl_sock_info(st, self->sock, NULL, &family, &type, &proto) == 0)
        conn = PyObject_CallFunction(st->socket_socket, "iiii", family,
                                     type | SOCK_NONBLOCK, proto, cfd);
    if (conn == NULL) {
        close(cfd);
        return NULL;
    }
    PyObject *peer = tl_sockaddr_to_py(addr, alen);
    if (peer == NULL) {
        Py_DECREF(conn);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, conn, peer);
    Py_DECREF(conn);
    Py_DECREF(peer);
    return r;
}

/* One try of the operation: *res is its result, or NULL when it would
 * block. */
/* *res = result (a new reference, or NULL with an error set). */
static inline int
done(PyObject **res, PyObject *result)
{
    *res = result;
    return result == NULL ? -1 : 0;
}

/* After a failed syscall: "would block" (0, *res stays NULL) or OSError. */
static int
blocked_or_error(int err)
{
    if (err == EAGAIN || err == EWOULDBLOCK)
        return 0;
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
}

static int
recv_prepare(SockOpObject *self)
{
    Py_ssize_t n = PyNumber_AsSsize_t(self->data, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative buffersize in recv");
        return -1;
    }
    self->nbytes = n;
    return 0;
}

static int
recv_attempt(SockOpObject *self, PyObject **res)
{
    *res = NULL;
    if (self->nbytes == 0)   /* socket.recv(0) makes no syscall */
        return done(res, PyBytes_FromStringAndSize(NULL, 0));
    if (self->nbytes <= TL_SPARE_SIZE) {
        /* As the transports do: receive into the loop's spare bytes and
         * hand a large read over without copying. */
        PyObject *data;
        int err;
        if (tl_recv_spare(&self->loop->recv, self->fd, (size_t)self->nbytes,
                          0, NULL, &data, &err) < 0)
            return -1;
        if (data != NULL)
            return done(res, data);
        if (err == 0)
            return done(res, PyBytes_FromStringAndSize(NULL, 0));
        return blocked_or_error(err);
    }
    PyObject *b = PyBytes_FromStringAndSize(NULL, self->nbytes);
    if (b == NULL)
        return -1;
    ssize_t n;
    do {
        n = recv(self->fd, PyBytes_AS_STRING(b), (size_t)self->nbytes, 0);
    } while (tl_retry_eintr(n));
    if (n < 0) {
        int err = errno;
        Py_DECREF(b);
        return PyErr_Occurred() ? -1 : blocked_or_error(err);
    }
    if (n != self->nbytes && tl_bytes_resize(&b, n) < 0)
        return -1;
    return done(res, b);
}

static int
recv_into_prepare(SockOpObject *self)
{
    if (tl_recv_into_buffer(self->data, &self->view) < 0)
        return -1;
    self->have_view = 1;
    return 0;
}

static int
recv_into_attempt(SockOpObject *self, PyObject **res)
{
    *res = NULL;
    if (self->view.len == 0)   /* nor does recv_into() an empty buffer */
        return done(res, PyLong_FromLong(0));
    ssize_t n;
    do {
        n = recv(self->fd, self->view.buf, (size_t)self->view.len, 0);
    } while (tl_retry_eintr(n));
    if (n < 0)
        return PyErr_Occurred() ? -1 : blocked_or_error(errno);
    return done(res, PyLong_FromSsize_t(n));
}

static int
sendall_prepare(SockOpObject *self)
{
    if (PyObject_GetBuffer(self->data, &self->view, PyBUF_SIMPLE) < 0)
        return -1;
    self->have_view = 1;
    return 0;
}

/* One send() per try, as asyncio's sock.send(): even for b"" (its errors,
 * a closed or unconnected socket, are the caller's), and after a partial
 * send the rest waits for the socket to be writable.  A non-blocking socket
 * would refuse more anyway; a blocking one returns a partial count when a
 * signal came, and the wait lets the task be cancelled (Ctrl-C). */
static int
sendall_attempt(SockOpObject *self, PyObject **res)
{
    *res = NULL;
    ssize_t n;
    do {
        n = send(self->fd, (char *)self->view.buf + self->pos,
                 (size_t)(self->view.len - self->pos), MSG_NOSIGNAL);
    } while (tl_retry_eintr(n));
    if (n < 0)
        return PyErr_Occurred() ? -1 : blocked_or_error(errno);
    self->pos += n;
    if (self->pos < self->view.len) {
        /* A blocking socket's send() cut short by a signal ran no handler:
         * the loop checks before it sleeps. */
        self->loop->signals_unchecked = 1;
        return 0;
    }
    return done(res, Py_NewRef(Py_None));
}

static int
accept_prepare(SockOpObject *Py_UNUSED(self))
{
    return 0;
}

static int
accept_attempt(SockOpObject *self, PyObject **res)
{
    *res = NULL;
    struct sockaddr_storage addr;
    socklen_t alen = sizeof(addr);
    int cfd;
    do {
        alen = sizeof(addr);
        cfd = accept4(self->fd, (struct sockaddr *)&addr, &alen,
                      SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (tl_retry_eintr(cfd));
    if (cfd < 0)
        return PyErr_Occurred() ? -1 : blocked_or_error(errno);
    return done(res, accept_result(self, cfd, (struct sockaddr *)&addr, alen));
}

static const sockop_def op_recv = {"sock_recv", "n", TL_POLL_READ,
                                    recv_prepare, recv_attempt};
static const sockop_def op_recv_into = {"sock_recv_into", "buf", TL_POLL_READ,
                                         recv_into_prepare, recv_into_attempt};
static const sockop_def op_sendall = {"sock_sendall", "data", TL_POLL_WRITE,
                                       sendall_prepare, sendall_attempt};
static const sockop_def op_accept = {"sock_accept", NULL, TL_POLL_READ,
                                      accept_prepare, accept_attempt};

static void
op_release(SockOpObject *self)
{
    if (self->have_view) {
        PyBuffer_Release(&self->view);
        self->have_view = 0;
    }
}

/* Stop watching the fd, unless another operation has taken it over in the
 * meantime (asyncio's _sock_read_done checks its handle the same way). */
static int
op_unregister(SockOpObject *self)
{
    if (!self->registered)
        return 0;
    int which = self->registered;
    self->registered = 0;
    HandleObject *h = self->handle;
    self->handle = NULL;
    int rc = 0;
    if (h == NULL || !h->cancelled)
        rc = tl_fd_remove(self->loop, self->fd, which, NULL);
    Py_XDECREF(h);
    return rc;
}

static int
op_register(SockOpObject *self, int which)
{
    tl_state *st = self->loop->state;
    HandleObject *h = tl_handle_new(st, st->HandleType, self->loop,
                                    self->ready_cb, NULL, 0, NULL, 1);
    if (h == NULL)
        return -1;
    if (tl_fd_add_handle(self->loop, self->fd, which, h, 1) < 0) {
        Py_DECREF(h);
        return -1;
    }
    Py_XSETREF(self->handle, h);
    self->registered = which;
    return 0;
}

/* The fd is ready: retry, and resolve the future when done. */
static PyObject *
op_ready(SockOpObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fut == NULL || self->state != ST_WAITING)
        Py_RETURN_NONE;
    tl_state *st = self->loop->state;
    PyObject *done = PyObject_CallMethodNoArgs(self->fut, st->str_done);
    if (done == NULL)
        return NULL;
    int isdone = PyObject_IsTrue(done);
    Py_DECREF(done);
    if (isdone) {
        /* Cancelled while waiting: stop watching the fd. */
        if (op_unregister(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *res;
    int rc = self->op->attempt(self, &res);
    if (rc == 0 && res == NULL) {
        /* A spurious wakeup: the one-shot interest is spent, arm it again. */
        if (op_register(self, self->registered) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (op_unregister(self) < 0) {
        Py_XDECREF(res);
        return NULL;
    }
    PyObject *r;
    if (res != NULL) {
        r = PyObject_CallMethodOneArg(self->fut, st->str_set_result, res);
        Py_DECREF(res);
    }
    else {
        if (PyErr_ExceptionMatches(PyExc_SystemExit) ||
            PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
            return NULL;
        PyObject *v = tl_err_get_raised();
        r = PyObject_CallMethodOneArg(self->fut, st->str_set_exception, v);
        Py_XDECREF(v);
    }
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static int
check_socket(SockOpObject *self)
{
    tl_state *st = self->loop->state;
    if (Py_TYPE(self->sock) != (PyTypeObject *)st->socket_socket) {
        /* ssl.SSLSocket, looked up once (None where ssl is unavailable). */
        if (st->SSLSocket == NULL) {
            PyObject *ssl = PyImport_ImportModule("ssl");
            if (ssl == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_ImportError))
                    return -1;
                PyErr_Clear();
                st->SSLSocket = Py_NewRef(Py_None);
            }
            else {
                st->SSLSocket = PyObject_GetAttrString(ssl, "SSLSocket");
                Py_DECREF(ssl);
                if (st->SSLSocket == NULL)
                    return -1;
            }
        }
        if (st->SSLSocket != Py_None) {
            int is_ssl = PyObject_IsInstance(self->sock, st->SSLSocket);
            if (is_ssl < 0)
                return -1;
            if (is_ssl) {
                PyErr_SetString(PyExc_TypeError,
                                "Socket cannot be of type SSLSocket");
                return -1;
            }
        }
    }
    if (self->loop->debug) {
        PyObject *t = PyObject_CallMethod(self->sock, "gettimeout", NULL);
        if (t == NULL)
            return -1;
        int nonblocking = PyFloat_Check(t) && PyFloat_AS_DOUBLE(t) == 0.0;
        Py_DECREF(t);
        if (!nonblocking) {
            PyErr_SetString(PyExc_ValueError, "the socket must be non-blocking");
            return -1;
        }
    }
    return tl_call_fileno(st, self->sock, &self->fd);
}

/* Advance the operation; *out gets the value (*yielded 0) or the future to
 * yield (*yielded 1). */
static int
op_step(SockOpObject *self, PyObject **out, int *yielded)
{
    *yielded = 0;
    if (self->state == ST_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return -1;
    }
    if (self->state == ST_WAITING) {
        self->state = ST_DONE;
        PyObject *fut = self->fut;
        self->fut = NULL;
        op_unregister(self);
        op_release(self);
        *out = PyObject_CallMethodNoArgs(fut, self->loop->state->str_result);
        Py_DECREF(fut);
        return *out == NULL ? -1 : 0;
    }
    self->state = ST_DONE;
    PyObject *fut = NULL;
    if (check_socket(self) < 0 || self->op->prepare(self) < 0 ||
        self->op->attempt(self, out) < 0)
        goto error;
    if (*out != NULL) {
        op_release(self);
        return 0;
    }
    /* Would block: wait for the fd. */
    if (tl_fd_check_no_transport(self->loop, self->fd) < 0)
        goto error;
    fut = tl_loop_create_future(self->loop);
    if (fut == NULL)
        goto error;
    int which = self->op->which;
    if (self->ready_cb == NULL)
        self->ready_cb = PyObject_GetAttrString((PyObject *)self, "_ready");
    if (self->ready_cb == NULL || op_register(self, which) < 0 ||
        PyObject_SetAttr(fut, self->loop->state->str_future_blocking,
                         Py_True) < 0) {
        op_unregister(self);
        goto error;
    }
    self->fut = fut;
    self->state = ST_WAITING;
    *out = Py_NewRef(fut);
    *yielded = 1;
    return 0;
error:
    Py_XDECREF(fut);
    op_release(self);
    return -1;
}

static PySendResult
op_am_send(SockOpObject *self, PyObject *arg, PyObject **result)
{
    (void)arg;
    int yielded;
    if (op_step(self, result, &yielded) < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    return yielded ? PYGEN_NEXT : PYGEN_RETURN;
}

/* send()'s and iternext's end: the yielded future, or NULL with
 * StopIteration(result) (iternext, which SEND calls from 3.12: no
 * exception at all for None, as iterators end). */
static PyObject *
op_send_out(SockOpObject *self, int iternext)
{
    PyObject *out = NULL;
    int yielded;
    if (op_step(self, &out, &yielded) < 0)
        return NULL;
    if (yielded)
        return out;
    if (out != Py_None || !iternext)
        tl_set_stop_iteration_value(&self->loop->state->stop_iteration, out);
    Py_DECREF(out);
    return NULL;
}

static PyObject *
op_send(SockOpObject *self, PyObject *Py_UNUSED(arg))
{
    return op_send_out(self, 0);
}

static PyObject *
op_iternext(SockOpObject *self)
{
    return op_send_out(self, 1);
}

static PyObject *
op_throw(SockOpObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    op_unregister(self);
    op_release(self);
    Py_CLEAR(self->fut);
    self->state = ST_DONE;
    PyObject *typ = args[0];
    PyObject *val = nargs > 1 ? args[1] : NULL;
    PyObject *tb = nargs > 2 ? args[2] : NULL;
    if (PyExceptionInstance_Check(typ)) {
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
        if (tb != NULL && tb != Py_None)
            PyException_SetTraceback(typ, tb);
        return NULL;
    }
    if (PyExceptionClass_Check(typ)) {
        PyErr_SetObject(typ, val);
        return NULL;
    }
    PyErr_SetString(PyExc_TypeError,
                    "exceptions must be classes or instances deriving from "
                    "BaseException");
    return NULL;
}

static PyObject *
op_close(SockOpObject *self, PyObject *Py_UNUSED(ignored))
{
    if (op_unregister(self) < 0)
        return NULL;
    op_release(self);
    Py_CLEAR(self->fut);
    self->state = ST_DONE;
    Py_RETURN_NONE;
}

static PyObject *
op_await(SockOpObject *self)
{
    return Py_NewRef(self);
}

static PyObject *
op_repr(SockOpObject *self)
{
    return PyUnicode_FromFormat("<%s awaitable %s>", self->op->name,
                                self->state == ST_NEW ? "not started"
                                : self->state == ST_WAITING ? "waiting"
                                                            : "done");
}

static int
op_traverse(SockOpObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->loop);
    Py_VISIT(self->sock);
    Py_VISIT(self->data);
    Py_VISIT(self->fut);
    Py_VISIT(self->ready_cb);
    Py_VISIT(self->handle);
    return 0;
}

static int
op_clear(SockOpObject *self)
{
    op_release(self);
    Py_CLEAR(self->sock);
    Py_CLEAR(self->data);
    Py_CLEAR(self->fut);
    Py_CLEAR(self->ready_cb);
    Py_CLEAR(self->handle);
    Py_CLEAR(self->loop);
    return 0;
}

/* Like a coroutine object: dropping one that never ran says so. */
static void
op_finalize(SockOpObject *self)
{
    if (self->state != ST_NEW)
        return;
    PyObject *exc = tl_err_get_raised();
    if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                         "coroutine 'Loop.%s' was never awaited",
                         self->op->name) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    tl_err_set_raised(exc);
}

static void
op_dealloc(SockOpObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return;
    PyObject_GC_UnTrack(self);
    op_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef op_methods[] = {
    {"send", (PyCFunction)op_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))op_throw, METH_FASTCALL, NULL},
    {"close", (PyCFunction)op_close, METH_NOARGS, NULL},
    {"_ready", (PyCFunction)op_ready, METH_NOARGS, NULL},
    {NULL}
};

static PyType_Slot op_slots[] = {
    {Py_tp_dealloc, op_dealloc},
    {Py_tp_finalize, op_finalize},
    {Py_tp_traverse, op_traverse},
    {Py_tp_clear, op_clear},
    {Py_tp_repr, op_repr},
    {Py_tp_iter, op_await},
    {Py_tp_iternext, op_iternext},
    {Py_am_await, op_await},
    {Py_am_send, op_am_send},
    {Py_tp_methods, op_methods},
    {Py_tp_doc, "An awaitable socket operation of the tideloop loop."},
    {0, NULL}
};

PyType_Spec tl_sockop_spec = {
    .name = "tideloop.SockOp",
    .basicsize = sizeof(SockOpObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = op_slots,
};

static SockOpObject *
op_new(LoopObject *loop, const sockop_def *op, PyObject *sock)
{
    SockOpObject *self = PyObject_GC_New(SockOpObject, loop->state->SockOpType);
    if (self == NULL)
        return NULL;
    memset((char *)self + sizeof(PyObject), 0, sizeof(*self) - sizeof(PyObject));
    self->loop = (LoopObject *)Py_NewRef((PyObject *)loop);
    self->sock = Py_NewRef(sock);
    self->op = op;
    self->fd = -1;
    PyObject_GC_Track(self);
    return self;
}

static PyObject *
make_op(PyObject *loop, const sockop_def *op, PyObject *const *args,
        Py_ssize_t nargs, PyObject *kwnames)
{
    const char *name = op->name;
    const char *argname = op->argname;
    PyObject *vals[2] = {NULL, NULL};
    Py_ssize_t want = argname ? 2 : 1;
    if (nargs > want) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes %zd positional arguments but %zd were given",
                     name, want + 1, nargs + 1);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        vals[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        Py_ssize_t slot = -1;
        if (PyUnicode_CompareWithASCIIString(k, "sock") == 0)
            slot = 0;
        else if (argname && PyUnicode_CompareWithASCIIString(k, argname) == 0)
            slot = 1;
        if (slot < 0) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got an unexpected keyword argument '%U'", name, k);
            return NULL;
        }
        if (vals[slot] != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got multiple values for argument '%U'", name, k);
            return NULL;
        }
        vals[slot] = args[nargs + i];
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        if (vals[i] == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() missing 1 required positional argument: '%s'",
                         name, i == 0 ? "sock" : argname);
            return NULL;
        }
    }
    SockOpObject *self = op_new((LoopObject *)loop, op, vals[0]);
    if (self != NULL && argname != NULL)
        self->data = Py_NewRef(vals[1]);
    return (PyObject *)self;
}

static PyObject *
loop_sock_recv(PyObject *loop, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames)
{
    return make_op(loop, &op_recv, args, nargs, kwnames);
}

static PyObject *
loop_sock_recv_into(PyObject *loop, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    return make_op(loop, &op_recv_into, args, nargs, kwnames);
}

static PyObject *
loop_sock_sendall(PyObject *loop, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    return make_op(loop, &op_sendall, args, nargs, kwnames);
}

static PyObject *
loop_sock_accept(PyObject *loop, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames)
{
    return make_op(loop, &op_accept, args, nargs, kwnames);
}

const PyMethodDef tl_sockop_loop_methods[] = {
    {"sock_recv", (PyCFunction)(void (*)(void))loop_sock_recv,
     METH_FASTCALL | METH_KEYWORDS,
     "sock_recv(sock, n): receive up to n bytes (awaitable)."},
    {"sock_recv_into", (PyCFunction)(void (*)(void))loop_sock_recv_into,
     METH_FASTCALL | METH_KEYWORDS,
     "sock_recv_into(sock, buf): receive into buf (awaitable)."},
    {"sock_sendall", (PyCFunction)(void (*)(void))loop_sock_sendall,
     METH_FASTCALL | METH_KEYWORDS,
     "sock_sendall(sock, data): send all of data (awaitable)."},
    {"sock_accept", (PyCFunction)(void (*)(void))loop_sock_accept,
     METH_FASTCALL | METH_KEYWORDS,
     "sock_accept(sock): accept a connection (awaitable)."},
    {NULL}
};
