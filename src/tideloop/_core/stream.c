/* Stream socket transports (TCP and Unix) and the accept path of servers.
 *
 * Behaviour follows asyncio's _SelectorSocketTransport (selector_events.py):
 * the same callbacks in the same order, the same errors and log messages.
 * What differs is how: reads go into the loop's buffer and become one bytes
 * object; writes are tried at once and the rest is queued as references to
 * immutable bytes (mutable buffers are copied) and flushed with writev(). */
#define _GNU_SOURCE
#include "transport.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <structmember.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define TR(o) ((SocketTransportObject *)(o))

int
tl_tr_is_reading(SocketTransportObject *self)
{
    return !self->head.closing && !self->paused;
}

/* ---- socket object and extra info ---- */

/* The socket.socket object; made from our fd the first time it is needed. */
static PyObject *
tl_tr_get_sock(SocketTransportObject *self)
{
    if (self->sock != NULL)
        return Py_NewRef(self->sock);
    if (self->fd < 0)
        Py_RETURN_NONE;
    tl_state *st = self->loop->state;
    PyObject *s = PyObject_CallFunction(st->socket_socket, "iiii",
                                        self->family,
                                        self->type | SOCK_NONBLOCK,
                                        self->proto, self->fd);
    if (s == NULL)
        return NULL;
    self->sock = Py_NewRef(s);
    return s;
}


void
tl_tr_close_socket(SocketTransportObject *self)
{
    if (self->fd < 0)
        return;
    /* Nothing of ours may stay registered under an fd number the kernel
     * will hand out again. */
    if (tl_tr_remove_reader(self) < 0 || tl_tr_remove_writer(self) < 0)
        PyErr_Clear();
    tl_loop_clear_fd_transport(self->loop, self->fd, &self->head);
    if (self->sock != NULL) {
        PyObject *r = PyObject_CallMethod(self->sock, "close", NULL);
        if (r == NULL)
            PyErr_WriteUnraisable(self->sock);
        Py_XDECREF(r);
    }
    else {
        close(self->fd);
    }
    self->fd = -1;
}

/* ---- loop registration ---- */

/* Start (on) or stop watching the fd for one direction. */
int
tl_tr_watch(SocketTransportObject *self, int which, int on)
{
    if (self->fd < 0 || (!on && !(self->watching & which)))
        return 0;
    if (!on) {
        self->watching &= ~which;
        return tl_loop_remove_io(self->loop, self->fd, which) < 0 ? -1 : 0;
    }
    PyObject *cb = which == TL_POLL_READ ? self->read_ready : self->write_ready;
    if (tl_loop_add_io(self->loop, self->fd, which, cb) < 0)
        return -1;
    self->watching |= which;
    return 0;
}


/* ---- write queue ---- */

void
tl_wq_clear(SocketTransportObject *self)
{
    for (size_t i = 0; i < self->wq_len; i++) {
        wchunk *c = &self->wq[(self->wq_head + i) % self->wq_cap];
        Py_CLEAR(c->obj);
        Py_CLEAR(c->addr);
    }
    self->wq_head = self->wq_len = 0;
    self->wq_off = 0;
    self->buffer_size = 0;
}

/* Queue data[0:len] of obj: bytes are referenced, anything else copied. */
int
tl_wq_push(SocketTransportObject *self, PyObject *obj, const char *data,
        Py_ssize_t len)
{
    if (self->wq_len == self->wq_cap) {
        size_t cap = self->wq_cap ? self->wq_cap * 2 : 16;
        wchunk *q = PyMem_Malloc(cap * sizeof(*q));
        if (q == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < self->wq_len; i++)
            q[i] = self->wq[(self->wq_head + i) % self->wq_cap];
        PyMem_Free(self->wq);
        self->wq = q;
        self->wq_head = 0;
        self->wq_cap = cap;
    }
    PyObject *owner;
    if (PyBytes_CheckExact(obj)) {
        owner = Py_NewRef(obj);
    }
    else {
        owner = PyBytes_FromStringAndSize(data, len);
        if (owner == NULL)
            return -1;
        data = PyBytes_AS_STRING(owner);
    }
    wchunk *c = &self->wq[(self->wq_head + self->wq_len) % self->wq_cap];
    c->obj = owner;
    c->data = data;
    c->len = len;
    c->addr = NULL;
    self->wq_len++;
    self->buffer_size += len;
    return 0;
}

/* The queued data as up to TL_WRITEV_MAX iovecs; returns how many. */
int
tl_wq_iov(SocketTransportObject *self, struct iovec *iov)
{
    int cnt = 0;
    for (size_t i = 0; i < self->wq_len && cnt < TL_WRITEV_MAX; i++, cnt++) {
        wchunk *c = &self->wq[(self->wq_head + i) % self->wq_cap];
        Py_ssize_t off = i == 0 ? self->wq_off : 0;
        iov[cnt].iov_base = (char *)c->data + off;
        iov[cnt].iov_len = (size_t)(c->len - off);
    }
    return cnt;
}

/* Drop the chunk at the front of the queue (its bytes are not counted). */
void
tl_wq_pop(SocketTransportObject *self)
{
    wchunk *c = &self->wq[self->wq_head];
    Py_CLEAR(c->obj);
    Py_CLEAR(c->addr);
    self->wq_head = (self->wq_head + 1) % self->wq_cap;
    self->wq_len--;
    self->wq_off = 0;
}

/* Drop n sent bytes from the front of the queue. */
void
tl_wq_consume(SocketTransportObject *self, Py_ssize_t n)
{
    self->buffer_size -= n;
    while (n > 0 && self->wq_len) {
        Py_ssize_t left = self->wq[self->wq_head].len - self->wq_off;
        if (n < left) {
            self->wq_off += n;
            return;
        }
        n -= left;
        tl_wq_pop(self);
    }
}

/* ---- protocol callbacks with asyncio's error handling ---- */

int
tl_tr_is_fatal_base_exception(void)
{
    return PyErr_ExceptionMatches(PyExc_SystemExit) ||
           PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
}

PyObject *
tl_tr_fetch_exception(void)
{
    return tl_err_get_raised();
}


/* asyncio's _fatal_error: OSErrors are only logged in debug mode, anything
 * else goes to the exception handler; then the transport is force-closed. */
int
tl_tr_fatal_error(SocketTransportObject *self, PyObject *exc, const char *message)
{
    tl_state *st = self->loop->state;
    int quiet = PyObject_IsInstance(exc, PyExc_OSError) == 1;
    if (quiet && self->kind == TL_TR_READ_PIPE) {
        /* The read end of a pipe only keeps quiet about EIO. */
        PyObject *e = PyObject_GetAttrString(exc, "errno");
        quiet = e != NULL && PyLong_Check(e) && PyLong_AsLong(e) == EIO;
        Py_XDECREF(e);
        PyErr_Clear();
    }
    if (quiet) {
        if (self->loop->debug) {
            PyObject *kw = Py_BuildValue("{sO}", "exc_info", exc);
            PyObject *args = Py_BuildValue("(sOs)", "%r: %s", (PyObject *)self,
                                           message);
            PyObject *meth = PyObject_GetAttrString(st->logger, "debug");
            PyObject *r = (kw && args && meth) ? PyObject_Call(meth, args, kw)
                                               : NULL;
            Py_XDECREF(kw);
            Py_XDECREF(args);
            Py_XDECREF(meth);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    }
    else if (tl_loop_report(self->loop, message, exc, "transport",
                            (PyObject *)self, "protocol", self->protocol,
                            NULL) < 0) {
        return -1;
    }
    if (self->kind == TL_TR_READ_PIPE || self->kind == TL_TR_WRITE_PIPE)
        return tl_pipe_close(self, exc);
    return tl_tr_force_close(self, exc);
}

/* After a failed call: propagate SystemExit/KeyboardInterrupt, else hand
 * the exception to tl_tr_fatal_error.  Returns -1 only to propagate. */
int
tl_tr_fail(SocketTransportObject *self, const char *message)
{
    if (tl_tr_is_fatal_base_exception())
        return -1;
    PyObject *exc = tl_tr_fetch_exception();
    int rc = tl_tr_fatal_error(self, exc, message);
    Py_XDECREF(exc);
    return rc;
}

static int
tl_tr_call_flow(SocketTransportObject *self, const char *meth, const char *fail)
{
    PyObject *r = PyObject_CallMethod(self->protocol, meth, NULL);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    if (tl_tr_is_fatal_base_exception())
        return -1;
    PyObject *exc = tl_tr_fetch_exception();
    int rc = tl_loop_report(self->loop, fail, exc, "transport", (PyObject *)self,
                            "protocol", self->protocol, NULL);
    Py_XDECREF(exc);
    return rc;
}

int
tl_tr_maybe_pause_protocol(SocketTransportObject *self)
{
    if ((double)self->buffer_size <= self->high_water || self->protocol_paused)
        return 0;
    self->protocol_paused = 1;
    return tl_tr_call_flow(self, "pause_writing", "protocol.pause_writing() failed");
}

int
tl_tr_maybe_resume_protocol(SocketTransportObject *self)
{
    if (!self->protocol_paused || (double)self->buffer_size > self->low_water)
        return 0;
    self->protocol_paused = 0;
    return tl_tr_call_flow(self, "resume_writing", "protocol.resume_writing() failed");
}

/* ---- closing ---- */

int
tl_tr_schedule_connection_lost(SocketTransportObject *self, PyObject *exc)
{
    PyObject *meth = PyObject_GetAttrString((PyObject *)self,
                                            "_call_connection_lost");
    if (meth == NULL)
        return -1;
    PyObject *arg = exc ? exc : Py_None;
    int rc = tl_loop_call_soon(self->loop, meth, &arg, 1);
    Py_DECREF(meth);
    return rc;
}

int
tl_tr_force_close(SocketTransportObject *self, PyObject *exc)
{
    if (self->conn_lost)
        return 0;
    if (self->wq_len) {
        tl_wq_clear(self);
        if (tl_tr_remove_writer(self) < 0)
            return -1;
    }
    if (!self->head.closing) {
        self->head.closing = 1;
        if (tl_tr_remove_reader(self) < 0)
            return -1;
    }
    self->conn_lost++;
    return tl_tr_schedule_connection_lost(self, exc);
}

PyObject *
tl_tr_call_connection_lost(SocketTransportObject *self, PyObject *exc)
{
    PyObject *r = NULL;
    if (self->protocol_connected && self->protocol != NULL) {
        r = PyObject_CallMethod(self->protocol, "connection_lost", "O", exc);
    }
    else {
        r = Py_NewRef(Py_None);
    }
    /* finally: */
    PyObject *pending = tl_err_get_raised();
    tl_tr_close_socket(self);
    Py_CLEAR(self->protocol);
    PyObject *server = self->server;
    self->server = NULL;
    if (server != NULL) {
        /* 3.13+: Server._detach(transport) (it tracks its clients). */
        PyObject *d = self->loop->state->server_attach_takes_transport
                          ? PyObject_CallMethod(server, "_detach", "O", self)
                          : PyObject_CallMethod(server, "_detach", NULL);
        Py_DECREF(server);
        if (d == NULL) {
            if (pending == NULL)
                pending = tl_err_get_raised();
            else
                PyErr_Clear();
        }
        Py_XDECREF(d);
    }
    if (self->empty_waiter != NULL) {
        PyObject *cerr = PyObject_CallFunction(PyExc_ConnectionError, "s",
                                               "Connection is closed by peer");
        PyObject *d = cerr ? PyObject_CallMethod(self->empty_waiter,
                                                 "set_exception", "O", cerr)
                           : NULL;
        Py_XDECREF(cerr);
        if (d == NULL) {
            if (pending == NULL)
                pending = tl_err_get_raised();
            else
                PyErr_Clear();
        }
        Py_XDECREF(d);
    }
    if (pending != NULL) {
        Py_XDECREF(r);
        tl_err_set_raised(pending);
        return NULL;
    }
    return r;
}

/* ---- reading ---- */

static int
tl_tr_on_eof(SocketTransportObject *self)
{
    if (self->loop->debug) {
        PyObject *r = PyObject_CallMethod(self->loop->state->logger, "debug",
                                          "sO", "%r received EOF",
                                          (PyObject *)self);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    PyObject *keep = PyObject_CallMethod(self->protocol, "eof_received", NULL);
    if (keep == NULL)
        return tl_tr_fail(self, "Fatal error: protocol.eof_received() call failed.");
    int k = PyObject_IsTrue(keep);
    Py_DECREF(keep);
    if (k < 0)
        return tl_tr_fail(self, "Fatal error: protocol.eof_received() call failed.");
    if (k)
        return tl_tr_remove_reader(self);
    PyObject *r = PyObject_CallMethod((PyObject *)self, "close", NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

PyObject *
tl_tr_os_error(void)
{
    PyErr_SetFromErrno(PyExc_OSError);
    return tl_tr_fetch_exception();
}

static int
tl_tr_read_buffered(SocketTransportObject *self)
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
    if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0) {
        /* Word it as socket.recv_into() would. */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "recv_into() argument 'buffer' must be read-write "
                     "bytes-like object, not %.50s", Py_TYPE(buf)->tp_name);
        Py_DECREF(buf);
        return tl_tr_fail(self, "Fatal read error on socket transport");
    }
    ssize_t n;
    do {
        n = recv(self->fd, view.buf, (size_t)view.len, 0);
    } while (n < 0 && errno == EINTR);
    int err = errno;
    PyBuffer_Release(&view);
    Py_DECREF(buf);
    if (n < 0) {
        if (err == EAGAIN || err == EWOULDBLOCK)
            return 0;
        errno = err;
        PyObject *exc = tl_tr_os_error();
        int rc = tl_tr_fatal_error(self, exc, "Fatal read error on socket transport");
        Py_XDECREF(exc);
        return rc;
    }
    if (n == 0)
        return tl_tr_on_eof(self);
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

static PyObject *
tl_tr_read_ready(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->conn_lost || self->fd < 0)
        Py_RETURN_NONE;
    int rc;
    if (self->buffered) {
        rc = tl_tr_read_buffered(self);
    }
    else {
        PyObject *data;
        ssize_t n = tl_loop_read_spare(self->loop, self->fd, TL_SPARE_SIZE, 0,
                                       &data);
        if (n == -2)
            return NULL;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                Py_RETURN_NONE;
            PyObject *exc = tl_tr_os_error();
            rc = tl_tr_fatal_error(self, exc, "Fatal read error on socket transport");
            Py_XDECREF(exc);
        }
        else if (n == 0) {
            rc = tl_tr_on_eof(self);
        }
        else {
            PyObject *dargs[2] = {self->protocol, data};
            PyObject *r = PyObject_VectorcallMethod(
                self->loop->state->str_data_received, dargs,
                2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(data);
            if (r == NULL) {
                rc = tl_tr_fail(self,
                             "Fatal error: protocol.data_received() call failed.");
            }
            else {
                Py_DECREF(r);
                rc = 0;
            }
        }
    }
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- writing ---- */

static int
tl_tr_write_bytes(SocketTransportObject *self, PyObject *obj, const char *data,
               Py_ssize_t len)
{
    if (self->conn_lost) {
        if (self->conn_lost >= LOG_THRESHOLD_FOR_CONNLOST_WRITES) {
            PyObject *r = PyObject_CallMethod(self->loop->state->logger,
                                              "warning", "s",
                                              "socket.send() raised exception.");
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
        self->conn_lost++;
        return 0;
    }
    if (self->wq_len == 0) {
        /* Nothing queued: try to send now. */
        ssize_t n;
        do {
            n = send(self->fd, data, (size_t)len, MSG_NOSIGNAL);
        } while (n < 0 && errno == EINTR);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                PyObject *exc = tl_tr_os_error();
                int rc = tl_tr_fatal_error(self, exc,
                                        "Fatal write error on socket transport");
                Py_XDECREF(exc);
                return rc;
            }
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

/* write() accepts bytes, bytearray and memoryview; the message is the one
 * this interpreter's stock transport words (prefix from tideloop._compat). */
int
tl_tr_check_writable_data(PyObject *prefix, PyObject *data)
{
    if (!PyBytes_Check(data) && !PyByteArray_Check(data) &&
        !PyMemoryView_Check(data)) {
        PyErr_Format(PyExc_TypeError, "%U'%.200s'", prefix,
                     tl_type_name(Py_TYPE(data)));
        return -1;
    }
    return 0;
}

/* method: "write" or "writelines", as the stock messages name it. */
static int
check_can_write(SocketTransportObject *self, const char *method)
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

/* A write of a buffer that is not contiguous (a strided memoryview), with
 * the exception of PyObject_GetBuffer pending: asyncio's first send() would
 * raise it, a fatal write error; with data already queued, its bytearray
 * refuses the buffer with a TypeError out of write().  Returns 0 when
 * handled, 1 when the connection is already lost (the caller counts the
 * write), -1 with an exception set. */
int
tl_tr_unusable_buffer(SocketTransportObject *self, const char *fatal_message,
                      const char *queued_message)
{
    if (!PyErr_ExceptionMatches(PyExc_BufferError))
        return -1;
    if (self->conn_lost) {
        PyErr_Clear();
        return 1;
    }
    if (self->wq_len) {
        PyErr_SetString(PyExc_TypeError, queued_message);
        return -1;
    }
    if (self->kind == TL_TR_WRITE_PIPE)
        self->conn_lost++;
    return tl_tr_fail(self, fatal_message);
}

static int
tl_tr_write_object(SocketTransportObject *self, PyObject *data)
{
    if (PyBytes_CheckExact(data)) {
        Py_ssize_t len = PyBytes_GET_SIZE(data);
        if (len == 0)
            return 0;
        return tl_tr_write_bytes(self, data, PyBytes_AS_STRING(data), len);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        int rc = tl_tr_unusable_buffer(self, "Fatal write error on socket transport",
                                       "can't set bytearray slice from memoryview");
        return rc > 0 ? tl_tr_write_bytes(self, NULL, NULL, 1) : rc;
    }
    int rc = 0;
    if (view.len > 0)
        rc = tl_tr_write_bytes(self, data, view.buf, view.len);
    PyBuffer_Release(&view);
    return rc;
}

static PyObject *
tl_tr_write(SocketTransportObject *self, PyObject *data)
{
    if (tl_tr_check_writable_data(self->loop->state->write_type_error_prefix,
                                  data) < 0 ||
        check_can_write(self, "write") < 0)
        return NULL;
    if (tl_tr_write_object(self, data) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Write the items of seq (checked already) in order; after the first
 * write that loses the connection, the rest has nowhere to go. */
static PyObject *
write_items(SocketTransportObject *self, PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int was_lost = self->conn_lost;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (tl_tr_write_object(self, items[i]) < 0)
            return NULL;
        if (!was_lost && self->conn_lost)
            break;   /* one failure, one report */
    }
    Py_RETURN_NONE;
}

/* 3.12+: the stock socket transport's own writelines(): a false argument
 * writes nothing, a lost connection counts one write, every item must give
 * a memoryview (later releases drop false items first), then all are
 * queued.  tideloop copies mutable buffers where the stock transport keeps
 * views of them (a deliberate difference: the caller may reuse its buffer). */
static PyObject *
tl_tr_writelines_views(SocketTransportObject *self, PyObject *list)
{
    if (check_can_write(self, "writelines") < 0)
        return NULL;
    int truth = PyObject_IsTrue(list);
    if (truth <= 0)
        return truth < 0 ? NULL : Py_NewRef(Py_None);
    if (self->conn_lost) {
        if (tl_tr_write_bytes(self, NULL, NULL, 0) < 0)
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
tl_tr_writelines(SocketTransportObject *self, PyObject *list)
{
    if (self->loop->state->writelines_views)
        return tl_tr_writelines_views(self, list);
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
                PyErr_Clear();
                len = 1;
            }
            total += len;
        }
        Py_DECREF(seq);
        if (total && tl_tr_write_bytes(self, NULL, NULL, 0) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *r = write_items(self, seq);
    Py_DECREF(seq);
    return r;
}

static PyObject *
tl_tr_write_ready(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->conn_lost || self->fd < 0 || self->wq_len == 0)
        Py_RETURN_NONE;
    struct iovec iov[TL_WRITEV_MAX];
    int cnt = tl_wq_iov(self, iov);
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    ssize_t n;
    do {
        n = sendmsg(self->fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            Py_RETURN_NONE;
        PyObject *exc = tl_tr_os_error();
        int rc = tl_tr_remove_writer(self);
        tl_wq_clear(self);
        if (rc == 0)
            rc = tl_tr_fatal_error(self, exc, "Fatal write error on socket transport");
        if (rc == 0 && self->empty_waiter != NULL) {
            PyObject *r = PyObject_CallMethod(self->empty_waiter,
                                              "set_exception", "O", exc);
            if (r == NULL)
                rc = -1;
            Py_XDECREF(r);
        }
        Py_XDECREF(exc);
        if (rc < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (n > 0)
        tl_wq_consume(self, n);
    if (tl_tr_maybe_resume_protocol(self) < 0)   /* may write more */
        return NULL;
    if (self->wq_len == 0) {
        if (tl_tr_remove_writer(self) < 0)
            return NULL;
        if (self->empty_waiter != NULL) {
            PyObject *r = PyObject_CallMethod(self->empty_waiter, "set_result",
                                              "O", Py_None);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
        }
        if (self->head.closing) {
            PyObject *r = tl_tr_call_connection_lost(self, Py_None);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
        }
        else if (self->eof && self->fd >= 0) {
            if (shutdown(self->fd, SHUT_WR) < 0)
                return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    Py_RETURN_NONE;
}

/* ---- public transport API ---- */

PyObject *
tl_tr_close(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->head.closing)
        Py_RETURN_NONE;
    self->head.closing = 1;
    if (tl_tr_remove_reader(self) < 0)
        return NULL;
    if (self->wq_len == 0) {
        self->conn_lost++;
        if (tl_tr_remove_writer(self) < 0)
            return NULL;
        if (tl_tr_schedule_connection_lost(self, NULL) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *
tl_tr_abort(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (tl_tr_force_close(self, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_force_close_meth(SocketTransportObject *self, PyObject *exc)
{
    if (tl_tr_force_close(self, exc == Py_None ? NULL : exc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_is_closing_meth(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->head.closing);
}

PyObject *
tl_tr_is_reading_meth(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(tl_tr_is_reading(self));
}

int
tl_tr_debug_log(SocketTransportObject *self, const char *fmt)
{
    if (!self->loop->debug)
        return 0;
    PyObject *r = PyObject_CallMethod(self->loop->state->logger, "debug", "sO",
                                      fmt, (PyObject *)self);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

PyObject *
tl_tr_pause_reading(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!tl_tr_is_reading(self))
        Py_RETURN_NONE;
    self->paused = 1;
    if (tl_tr_remove_reader(self) < 0 || tl_tr_debug_log(self, "%r pauses reading") < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_resume_reading(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->head.closing || !self->paused)
        Py_RETURN_NONE;
    self->paused = 0;
    if (tl_tr_add_reader(self) < 0 || tl_tr_debug_log(self, "%r resumes reading") < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Scheduled right after connection_made: start reading unless paused. */
PyObject *
tl_tr_start_reading(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!tl_tr_is_reading(self))
        Py_RETURN_NONE;
    if (tl_tr_add_reader(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
tl_tr_write_eof(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
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
tl_tr_can_write_eof(SocketTransportObject *Py_UNUSED(self),
                 PyObject *Py_UNUSED(ignored))
{
    Py_RETURN_TRUE;
}

PyObject *
tl_tr_get_write_buffer_size(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->buffer_size);
}

PyObject *
tl_tr_get_write_buffer_limits(SocketTransportObject *self,
                           PyObject *Py_UNUSED(ignored))
{
    if (self->limits != NULL)
        return Py_NewRef(self->limits);
    return Py_BuildValue("ii", 16 * 1024, 64 * 1024);
}

static int
tl_tr_set_limits(SocketTransportObject *self, PyObject *high, PyObject *low)
{
    PyObject *h = NULL, *l = NULL;
    int rc = -1;
    /* The same arithmetic as asyncio's _set_write_buffer_limits. */
    if (high == Py_None) {
        if (low == Py_None) {
            h = PyLong_FromLong(64 * 1024);
        }
        else {
            PyObject *four = PyLong_FromLong(4);
            h = four ? PyNumber_Multiply(four, low) : NULL;
            Py_XDECREF(four);
        }
    }
    else {
        h = Py_NewRef(high);
    }
    if (h == NULL)
        return -1;
    if (low == Py_None) {
        PyObject *four = PyLong_FromLong(4);
        l = four ? PyNumber_FloorDivide(h, four) : NULL;
        Py_XDECREF(four);
    }
    else {
        l = Py_NewRef(low);
    }
    if (l == NULL)
        goto done;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        goto done;
    int ge1 = PyObject_RichCompareBool(h, l, Py_GE);
    int ge2 = ge1 == 1 ? PyObject_RichCompareBool(l, zero, Py_GE) : ge1;
    Py_DECREF(zero);
    if (ge1 < 0 || ge2 < 0)
        goto done;
    if (!(ge1 && ge2)) {
        PyErr_Format(PyExc_ValueError, "high (%R) must be >= low (%R) must be >= 0",
                     h, l);
        goto done;
    }
    double hv = PyFloat_AsDouble(h);
    if (hv == -1.0 && PyErr_Occurred())
        goto done;
    double lv = PyFloat_AsDouble(l);
    if (lv == -1.0 && PyErr_Occurred())
        goto done;
    PyObject *limits = PyTuple_Pack(2, l, h);
    if (limits == NULL)
        goto done;
    Py_XSETREF(self->limits, limits);
    self->high_water = hv;
    self->low_water = lv;
    rc = 0;
done:
    Py_XDECREF(h);
    Py_XDECREF(l);
    return rc;
}

PyObject *
tl_tr_set_write_buffer_limits(SocketTransportObject *self, PyObject *args,
                           PyObject *kwds)
{
    static char *kwlist[] = {"high", "low", NULL};
    PyObject *high = Py_None, *low = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:set_write_buffer_limits",
                                     kwlist, &high, &low))
        return NULL;
    if (tl_tr_set_limits(self, high, low) < 0 || tl_tr_maybe_pause_protocol(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
tl_tr_set_protocol_impl(SocketTransportObject *self, PyObject *protocol)
{
    tl_state *st = self->loop->state;
    int buffered = PyObject_IsInstance(protocol, st->BufferedProtocol);
    if (buffered < 0)
        return -1;
    self->buffered = buffered;
    Py_XSETREF(self->protocol, Py_NewRef(protocol));
    self->protocol_connected = 1;
    return 0;
}

PyObject *
tl_tr_set_protocol(SocketTransportObject *self, PyObject *protocol)
{
    if (tl_tr_set_protocol_impl(self, protocol) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_get_protocol(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(self->protocol ? self->protocol : Py_None);
}

/* The address as the socket module shows it, converted once. */
static PyObject *
tl_tr_cached_address(PyObject **cache, struct sockaddr_storage *addr, socklen_t len)
{
    if (*cache == NULL) {
        *cache = len ? tl_sockaddr_to_py((struct sockaddr *)addr, len)
                     : Py_NewRef(Py_None);
        if (*cache == NULL)
            return NULL;
    }
    return Py_NewRef(*cache);
}

PyObject *
tl_tr_extra_value(SocketTransportObject *self, const char *name)
{
    if (strcmp(name, "socket") == 0) {
        if (self->transport_socket == NULL) {
            PyObject *s = tl_tr_get_sock(self);
            if (s == NULL)
                return NULL;
            if (s == Py_None)
                return s;
            self->transport_socket =
                PyObject_CallOneArg(self->loop->state->TransportSocket, s);
            Py_DECREF(s);
            if (self->transport_socket == NULL)
                return NULL;
        }
        return Py_NewRef(self->transport_socket);
    }
    if (strcmp(name, "sockname") == 0)
        return tl_tr_cached_address(&self->sockname, &self->local_addr,
                              self->local_len);
    if (strcmp(name, "peername") == 0)
        return tl_tr_cached_address(&self->peername, &self->peer_addr,
                              self->peer_len);
    return NULL;
}

PyObject *
tl_tr_get_extra_info(SocketTransportObject *self, PyObject *const *args,
                  Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *name = NULL, *dflt = Py_None;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (PyUnicode_CompareWithASCIIString(k, "name") == 0)
                name = args[nargs + i];
            else if (PyUnicode_CompareWithASCIIString(k, "default") == 0)
                dflt = args[nargs + i];
            else {
                PyErr_Format(PyExc_TypeError,
                             "get_extra_info() got an unexpected keyword "
                             "argument '%U'", k);
                return NULL;
            }
        }
    }
    if (nargs >= 1)
        name = args[0];
    if (nargs >= 2)
        dflt = args[1];
    if (name == NULL || nargs > 2) {
        PyErr_SetString(PyExc_TypeError,
                        "get_extra_info() takes name and an optional default");
        return NULL;
    }
    /* asyncio looks the name up in a dict: unhashable names raise. */
    if (PyObject_Hash(name) == -1)
        return NULL;
    if (self->head.extra != NULL) {
        PyObject *v = PyDict_GetItemWithError(self->head.extra, name);
        if (v != NULL)
            return Py_NewRef(v);
        if (PyErr_Occurred())
            return NULL;
    }
    if (PyUnicode_Check(name) &&
        (self->kind == TL_TR_STREAM || self->kind == TL_TR_DGRAM)) {
        const char *s = PyUnicode_AsUTF8(name);
        if (s == NULL)
            return NULL;
        PyObject *v = tl_tr_extra_value(self, s);
        if (v != NULL || PyErr_Occurred())
            return v;
    }
    return Py_NewRef(dflt);
}

static PyObject *
tl_tr_make_empty_waiter(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
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
tl_tr_reset_empty_waiter(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    Py_CLEAR(self->empty_waiter);
    Py_RETURN_NONE;
}

/* sendfile() hands the fd to sock_sendfile for a while: the public
 * add_writer must not see it as a transport's meanwhile. */
static PyObject *
tl_tr_release_fd(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    tl_loop_clear_fd_transport(self->loop, self->fd, &self->head);
    Py_RETURN_NONE;
}

static PyObject *
tl_tr_claim_fd(SocketTransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fd >= 0 &&
        tl_loop_set_fd_transport(self->loop, self->fd, &self->head) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_repr(SocketTransportObject *self)
{
    const char *state = self->fd < 0 ? " closed" : self->head.closing ? " closing" : "";
    if (self->fd < 0 || self->loop->closed)
        return PyUnicode_FromFormat("<%s%s fd=%d>", tl_type_name(Py_TYPE(self)),
                                    state, self->fd);
    return PyUnicode_FromFormat("<%s%s fd=%d read=%s write=<%s, bufsize=%zd>>",
                                tl_type_name(Py_TYPE(self)), state, self->fd,
                                (self->watching & TL_POLL_READ) ? "polling" : "idle",
                                (self->watching & TL_POLL_WRITE) ? "polling" : "idle",
                                self->buffer_size);
}

PyObject *
tl_tr_get_sock_attr(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return tl_tr_get_sock(self);
}

/* Setting _sock (tests wrap the socket to watch it): the new object must own
 * the same file descriptor, which is what this transport works on. */
static int
tl_tr_set_sock_attr(SocketTransportObject *self, PyObject *value,
                    void *Py_UNUSED(c))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete _sock");
        return -1;
    }
    long fd;
    if (tl_call_fileno(self->loop->state, value, &fd) < 0)
        return -1;
    if (fd != self->fd) {
        PyErr_Format(PyExc_ValueError,
                     "_sock must own this transport's file descriptor %d, not %ld",
                     self->fd, fd);
        return -1;
    }
    Py_XSETREF(self->sock, Py_NewRef(value));
    return 0;
}

/* asyncio's socket transport keeps the callback its reader calls in
 * _read_ready_cb, None once close() was called or the connection lost. */
static PyObject *
tl_tr_get_read_ready_cb(SocketTransportObject *self, void *Py_UNUSED(c))
{
    if (self->head.closing || self->conn_lost || self->read_ready == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->read_ready);
}

PyObject *
tl_tr_get_fd_attr(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->fd);
}

PyObject *
tl_tr_get_loop_attr(SocketTransportObject *self, void *Py_UNUSED(c))
{
    if (self->fd < 0 && self->conn_lost)
        Py_RETURN_NONE;   /* asyncio drops _loop after connection_lost */
    return Py_NewRef((PyObject *)self->loop);
}

static PyObject *
tl_tr_get_server_attr(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(self->server ? self->server : Py_None);
}

PyObject *
tl_tr_get_conn_lost(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->conn_lost);
}

PyObject *
tl_tr_get_closing_attr(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->head.closing);
}

PyObject *
tl_tr_get_paused_attr(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->paused);
}

static PyObject *
tl_tr_get_eof_attr(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->eof);
}

static PyObject *
tl_tr_get_sendfile_compatible(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(self->loop->state->sendfile_try_native);
}

static PyObject *
tl_tr_get_start_tls_compatible(SocketTransportObject *Py_UNUSED(self),
                            void *Py_UNUSED(c))
{
    Py_RETURN_TRUE;
}

PyObject *
tl_tr_get_protocol_paused(SocketTransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->protocol_paused);
}

/* ---- construction ---- */

/* A transport for fd (and its socket object, when there is one).  Schedules
 * connection_made, the start of reading and the waiter, as asyncio does. */
SocketTransportObject *
tl_tr_create(LoopObject *loop, PyTypeObject *tp, int kind, int fd,
             PyObject *sock, int family, int type, int proto,
             PyObject *protocol, PyObject *waiter, PyObject *extra,
             PyObject *server, const struct sockaddr *peer, socklen_t peer_len)
{
    tl_state *st = loop->state;
    if (tl_loop_check_closed(loop) < 0)
        return NULL;
    SocketTransportObject *self = PyObject_GC_New(SocketTransportObject, tp);
    if (self == NULL)
        return NULL;
    /* Zero everything after the header. */
    memset((char *)self + sizeof(PyObject), 0,
           sizeof(*self) - sizeof(PyObject));
    self->kind = kind;
    self->fd = fd;
    self->loop = (LoopObject *)Py_NewRef((PyObject *)loop);
    self->family = family;
    self->type = type;
    self->proto = proto;
    self->sock = Py_XNewRef(sock);
    self->high_water = 64 * 1024;
    self->low_water = 16 * 1024;
    if (extra != NULL && extra != Py_None) {
        self->head.extra = PyDict_Copy(extra);
        if (self->head.extra == NULL)
            goto error;
    }
    int is_socket = kind == TL_TR_STREAM || kind == TL_TR_DGRAM;
    self->local_len = sizeof(self->local_addr);
    if (!is_socket ||
        getsockname(fd, (struct sockaddr *)&self->local_addr, &self->local_len) < 0)
        self->local_len = 0;
    if (!is_socket) {
        self->peer_len = 0;
    }
    else if (peer != NULL) {
        memcpy(&self->peer_addr, peer, peer_len);
        self->peer_len = peer_len;
    }
    else {
        self->peer_len = sizeof(self->peer_addr);
        if (getpeername(fd, (struct sockaddr *)&self->peer_addr,
                        &self->peer_len) < 0)
            self->peer_len = 0;
    }
    PyObject_GC_Track(self);
    if (tl_tr_set_protocol_impl(self, protocol) < 0)
        goto error;
    self->read_ready = PyObject_GetAttrString((PyObject *)self, "_read_ready");
    if (self->read_ready == NULL)
        goto error;
    if (kind != TL_TR_READ_PIPE) {
        self->write_ready = PyObject_GetAttrString((PyObject *)self,
                                                   "_write_ready");
        if (self->write_ready == NULL)
            goto error;
    }
    /* TCP_NODELAY, as asyncio's _set_nodelay decides it. */
    if (kind == TL_TR_STREAM && (family == AF_INET || family == AF_INET6) &&
        type == SOCK_STREAM && proto == IPPROTO_TCP) {
        int one = 1;
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto error;
        }
    }
    if (server != NULL && server != Py_None) {
        self->server = Py_NewRef(server);
        PyObject *r = loop->state->server_attach_takes_transport
                          ? PyObject_CallMethod(server, "_attach", "O", self)
                          : PyObject_CallMethod(server, "_attach", NULL);
        if (r == NULL)
            goto error;
        Py_DECREF(r);
    }
    /* asyncio's add_reader refuses the fds of socket transports only. */
    if (is_socket && tl_loop_set_fd_transport(loop, fd, &self->head) < 0)
        goto error;

    PyObject *made = PyObject_GetAttrString(protocol, "connection_made");
    if (made == NULL)
        goto error;
    PyObject *arg = (PyObject *)self;
    int rc = tl_loop_call_soon(loop, made, &arg, 1);
    Py_DECREF(made);
    if (rc < 0)
        goto error;
    PyObject *start = PyObject_GetAttrString((PyObject *)self, "_start_reading");
    if (start == NULL)
        goto error;
    rc = tl_loop_call_soon(loop, start, NULL, 0);
    Py_DECREF(start);
    if (rc < 0)
        goto error;
    if (waiter != NULL && waiter != Py_None) {
        PyObject *wargs[2] = {waiter, Py_None};
        if (tl_loop_call_soon(loop, st->set_result_unless_cancelled, wargs, 2) < 0)
            goto error;
    }
    return self;
error:
    /* The fd stays with the caller. */
    tl_loop_clear_fd_transport(loop, fd, &self->head);
    self->fd = -1;
    Py_DECREF(self);
    return NULL;
}

static PyObject *
py_int_attr(PyObject *o, const char *name, int *out)
{
    PyObject *v = PyObject_GetAttrString(o, name);
    if (v == NULL)
        return NULL;
    long l = PyLong_AsLong(v);
    Py_DECREF(v);
    if (l == -1 && PyErr_Occurred())
        return NULL;
    *out = (int)l;
    return Py_None;
}

/* Loop._make_socket_transport(sock, protocol, waiter=None, *, extra=None,
 * server=None) */
PyObject *
tl_loop_make_socket_transport(PyObject *loop, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sock", "protocol", "waiter", "extra", "server", NULL};
    PyObject *sock, *protocol, *waiter = Py_None, *extra = Py_None,
             *server = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O$OO:_make_socket_transport",
                                     kwlist, &sock, &protocol, &waiter, &extra,
                                     &server))
        return NULL;
    int family, type, proto;
    if (py_int_attr(sock, "family", &family) == NULL ||
        py_int_attr(sock, "type", &type) == NULL ||
        py_int_attr(sock, "proto", &proto) == NULL)
        return NULL;
    long fd;
    if (tl_call_fileno(((LoopObject *)loop)->state, sock, &fd) < 0)
        return NULL;
    return (PyObject *)tl_tr_create((LoopObject *)loop,
                                    ((LoopObject *)loop)->state->SocketTransportType,
                                    TL_TR_STREAM, (int)fd, sock, family, type, proto,
                                    protocol, waiter, extra, server, NULL, 0);
}

/* ---- type plumbing ---- */

int
tl_tr_traverse(SocketTransportObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->loop);
    Py_VISIT(self->sock);
    Py_VISIT(self->protocol);
    Py_VISIT(self->head.extra);
    Py_VISIT(self->limits);
    Py_VISIT(self->server);
    Py_VISIT(self->read_ready);
    Py_VISIT(self->write_ready);
    Py_VISIT(self->empty_waiter);
    Py_VISIT(self->sockname);
    Py_VISIT(self->peername);
    Py_VISIT(self->transport_socket);
    Py_VISIT(self->address);
    Py_VISIT(self->last_from);
    Py_VISIT(self->pending);
    Py_VISIT(self->dict);
    for (size_t i = 0; i < self->wq_len; i++) {
        Py_VISIT(self->wq[(self->wq_head + i) % self->wq_cap].obj);
        Py_VISIT(self->wq[(self->wq_head + i) % self->wq_cap].addr);
    }
    return 0;
}

int
tl_tr_clear(SocketTransportObject *self)
{
    Py_CLEAR(self->protocol);
    Py_CLEAR(self->head.extra);
    Py_CLEAR(self->limits);
    Py_CLEAR(self->server);
    Py_CLEAR(self->read_ready);
    Py_CLEAR(self->write_ready);
    Py_CLEAR(self->empty_waiter);
    Py_CLEAR(self->sockname);
    Py_CLEAR(self->peername);
    Py_CLEAR(self->transport_socket);
    Py_CLEAR(self->address);
    Py_CLEAR(self->last_from);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->dict);
    if (self->wq != NULL)
        tl_wq_clear(self);
    return 0;
}

/* asyncio's __del__: an unclosed transport warns and closes its socket. */
void
tl_tr_finalize(SocketTransportObject *self)
{
    if (self->fd < 0)
        return;
    PyObject *exc = tl_err_get_raised();
    PyObject *r = PyObject_Repr((PyObject *)self);
    if (r != NULL) {
        if (PyErr_ResourceWarning((PyObject *)self, 1, "unclosed transport %U",
                                  r) < 0)
            PyErr_WriteUnraisable((PyObject *)self);
        Py_DECREF(r);
    }
    else {
        PyErr_Clear();
    }
    if (self->loop != NULL)
        tl_loop_clear_fd_transport(self->loop, self->fd, &self->head);
    if (self->sock != NULL) {
        PyObject *c = PyObject_CallMethod(self->sock, "close", NULL);
        if (c == NULL)
            PyErr_WriteUnraisable(self->sock);
        Py_XDECREF(c);
    }
    else {
        close(self->fd);
    }
    self->fd = -1;
    tl_err_set_raised(exc);
}

void
tl_tr_dealloc(SocketTransportObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return;
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    tl_tr_clear(self);
    Py_CLEAR(self->sock);
    Py_CLEAR(self->loop);
    PyMem_Free(self->wq);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef tl_tr_methods[] = {
    {"write", (PyCFunction)tl_tr_write, METH_O, "Write data; never blocks."},
    {"writelines", (PyCFunction)tl_tr_writelines, METH_O, NULL},
    {"write_eof", (PyCFunction)tl_tr_write_eof, METH_NOARGS, NULL},
    {"can_write_eof", (PyCFunction)tl_tr_can_write_eof, METH_NOARGS, NULL},
    {"close", (PyCFunction)tl_tr_close, METH_NOARGS, NULL},
    {"abort", (PyCFunction)tl_tr_abort, METH_NOARGS, NULL},
    {"is_closing", (PyCFunction)tl_tr_is_closing_meth, METH_NOARGS, NULL},
    {"is_reading", (PyCFunction)tl_tr_is_reading_meth, METH_NOARGS, NULL},
    {"pause_reading", (PyCFunction)tl_tr_pause_reading, METH_NOARGS, NULL},
    {"resume_reading", (PyCFunction)tl_tr_resume_reading, METH_NOARGS, NULL},
    {"get_extra_info", (PyCFunction)(void (*)(void))tl_tr_get_extra_info,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"set_write_buffer_limits", (PyCFunction)(void (*)(void))tl_tr_set_write_buffer_limits,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {"get_write_buffer_limits", (PyCFunction)tl_tr_get_write_buffer_limits,
     METH_NOARGS, NULL},
    {"get_write_buffer_size", (PyCFunction)tl_tr_get_write_buffer_size, METH_NOARGS,
     NULL},
    {"get_protocol", (PyCFunction)tl_tr_get_protocol, METH_NOARGS, NULL},
    {"set_protocol", (PyCFunction)tl_tr_set_protocol, METH_O, NULL},
    {"_read_ready", (PyCFunction)tl_tr_read_ready, METH_NOARGS, NULL},
    {"_write_ready", (PyCFunction)tl_tr_write_ready, METH_NOARGS, NULL},
    {"_start_reading", (PyCFunction)tl_tr_start_reading, METH_NOARGS, NULL},
    {"_call_connection_lost", (PyCFunction)tl_tr_call_connection_lost, METH_O, NULL},
    {"_force_close", (PyCFunction)tl_tr_force_close_meth, METH_O, NULL},
    {"_make_empty_waiter", (PyCFunction)tl_tr_make_empty_waiter, METH_NOARGS, NULL},
    {"_reset_empty_waiter", (PyCFunction)tl_tr_reset_empty_waiter, METH_NOARGS, NULL},
    {"_release_fd", (PyCFunction)tl_tr_release_fd, METH_NOARGS, NULL},
    {"_claim_fd", (PyCFunction)tl_tr_claim_fd, METH_NOARGS, NULL},
    {NULL}
};

static PyGetSetDef tl_tr_getset[] = {
    {"_sock", (getter)tl_tr_get_sock_attr, (setter)tl_tr_set_sock_attr, NULL, NULL},
    {"_read_ready_cb", (getter)tl_tr_get_read_ready_cb, NULL, NULL, NULL},
    {"_sock_fd", (getter)tl_tr_get_fd_attr, NULL, NULL, NULL},
    {"_loop", (getter)tl_tr_get_loop_attr, NULL, NULL, NULL},
    {"_server", (getter)tl_tr_get_server_attr, NULL, NULL, NULL},
    {"_conn_lost", (getter)tl_tr_get_conn_lost, NULL, NULL, NULL},
    {"_closing", (getter)tl_tr_get_closing_attr, NULL, NULL, NULL},
    {"_paused", (getter)tl_tr_get_paused_attr, NULL, NULL, NULL},
    {"_eof", (getter)tl_tr_get_eof_attr, NULL, NULL, NULL},
    {"_protocol_paused", (getter)tl_tr_get_protocol_paused, NULL, NULL, NULL},
    {"_protocol", (getter)tl_tr_get_protocol, NULL, NULL, NULL},
    {"_sendfile_compatible", (getter)tl_tr_get_sendfile_compatible, NULL, NULL, NULL},
    {"_start_tls_compatible", (getter)tl_tr_get_start_tls_compatible, NULL, NULL,
     NULL},
    {NULL}
};

PyMemberDef tl_tr_members[] = {
    {"__weaklistoffset__", T_PYSSIZET,
     offsetof(SocketTransportObject, weakreflist), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(SocketTransportObject, dict),
     READONLY, NULL},
    {NULL}
};

static PyType_Slot tl_tr_slots[] = {
    TL_TR_SLOTS(tl_tr_repr, tl_tr_methods, tl_tr_getset,
                "A TCP or Unix stream socket transport.")
};

PyType_Spec tl_socket_transport_spec =
    TL_TR_SPEC("tideloop.SocketTransport", tl_tr_slots);

/* ==== the accept path ==== */

typedef struct {
    PyObject_HEAD
    LoopObject *loop;
    PyObject *sock;             /* the listening socket.socket */
    int fd;
    int family, type, proto;
    PyObject *protocol_factory;
    PyObject *server;
    PyObject *accept_ready;     /* bound self._accept_ready */
    PyObject *retry_handle;     /* pending call_later after EMFILE */
    int backlog;
    int closed;
} ListenerObject;

static PyObject *
listener_start(ListenerObject *self, PyObject *Py_UNUSED(ignored))
{
    Py_CLEAR(self->retry_handle);
    if (self->closed)
        Py_RETURN_NONE;
    if (tl_loop_add_io(self->loop, self->fd, TL_POLL_READ, self->accept_ready) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
listener_out_of_resources(ListenerObject *self)
{
    tl_state *st = self->loop->state;
    PyErr_SetFromErrno(PyExc_OSError);
    PyObject *exc = tl_tr_fetch_exception();
    PyObject *tsock = PyObject_CallOneArg(st->TransportSocket, self->sock);
    int rc = tsock ? tl_loop_report(self->loop,
                                    "socket.accept() out of system resource",
                                    exc, "socket", tsock, NULL)
                   : -1;
    Py_XDECREF(tsock);
    Py_XDECREF(exc);
    if (rc < 0)
        return -1;
    /* Linux keeps reporting the fd as ready: stop watching it for a while
     * (asyncio's ACCEPT_RETRY_DELAY) and keep serving the others. */
    if (tl_loop_remove_io(self->loop, self->fd, TL_POLL_READ) < 0)
        return -1;
    PyObject *start = PyObject_GetAttrString((PyObject *)self, "_start");
    if (start == NULL)
        return -1;
    PyObject *h = tl_loop_call_later(self->loop, 1.0, start);
    Py_DECREF(start);
    if (h == NULL)
        return -1;
    Py_XSETREF(self->retry_handle, h);
    return 0;
}

static int
listener_new_connection(ListenerObject *self, int cfd, struct sockaddr *addr,
                        socklen_t alen)
{
    LoopObject *loop = self->loop;
    if (loop->debug) {
        PyObject *peer = tl_sockaddr_to_py(addr, alen);
        PyObject *r = peer ? PyObject_CallMethod(loop->state->logger, "debug",
                                                 "sOOi",
                                                 "%r got a new connection from %r: fd=%d",
                                                 self->server, peer, cfd)
                           : NULL;
        Py_XDECREF(peer);
        if (r == NULL) {
            close(cfd);
            return -1;
        }
        Py_DECREF(r);
    }
    PyObject *protocol = PyObject_CallNoArgs(self->protocol_factory);
    SocketTransportObject *tr = NULL;
    if (protocol != NULL) {
        tr = tl_tr_create(loop, loop->state->SocketTransportType, TL_TR_STREAM,
                          cfd, NULL, self->family, self->type, self->proto,
                          protocol, NULL, NULL, self->server, addr, alen);
    }
    if (tr != NULL) {
        Py_DECREF(protocol);
        Py_DECREF(tr);
        return 0;
    }
    close(cfd);
    if (tl_tr_is_fatal_base_exception()) {
        Py_XDECREF(protocol);
        return -1;
    }
    PyObject *exc = tl_tr_fetch_exception();
    int rc = 0;
    if (loop->debug)
        rc = tl_loop_report(loop, "Error on transport creation for incoming "
                            "connection", exc, "protocol", protocol, NULL);
    Py_XDECREF(exc);
    Py_XDECREF(protocol);
    return rc;
}

static PyObject *
listener_accept_ready(ListenerObject *self, PyObject *Py_UNUSED(ignored))
{
    for (int i = 0; i < self->backlog && !self->closed; i++) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof(addr);
        int cfd = accept4(self->fd, (struct sockaddr *)&addr, &alen,
                          SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR ||
                e == ECONNABORTED)
                Py_RETURN_NONE;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                if (listener_out_of_resources(self) < 0)
                    return NULL;
                Py_RETURN_NONE;
            }
            /* The loop reports it ('Exception in callback ...'). */
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (listener_new_connection(self, cfd, (struct sockaddr *)&addr, alen) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
listener_close(ListenerObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed)
        Py_RETURN_NONE;
    self->closed = 1;
    if (self->retry_handle != NULL) {
        PyObject *r = PyObject_CallMethod(self->retry_handle, "cancel", NULL);
        Py_XDECREF(r);
        if (r == NULL)
            return NULL;
        Py_CLEAR(self->retry_handle);
    }
    if (tl_loop_remove_io(self->loop, self->fd, TL_POLL_READ) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Loop._serve(protocol_factory, sock, server, backlog) -> Listener */
PyObject *
tl_loop_serve(PyObject *loopobj, PyObject *args)
{
    LoopObject *loop = (LoopObject *)loopobj;
    PyObject *factory, *sock, *server;
    int backlog;
    if (!PyArg_ParseTuple(args, "OOOi:_serve", &factory, &sock, &server, &backlog))
        return NULL;
    tl_state *st = loop->state;
    ListenerObject *self = PyObject_GC_New(ListenerObject, st->ListenerType);
    if (self == NULL)
        return NULL;
    memset((char *)self + sizeof(PyObject), 0, sizeof(*self) - sizeof(PyObject));
    self->loop = (LoopObject *)Py_NewRef(loopobj);
    self->sock = Py_NewRef(sock);
    self->protocol_factory = Py_NewRef(factory);
    self->server = Py_NewRef(server);
    self->backlog = backlog > 0 ? backlog : 1;
    self->fd = -1;
    PyObject_GC_Track(self);
    PyObject *fdo = PyObject_CallMethod(sock, "fileno", NULL);
    if (fdo == NULL)
        goto error;
    self->fd = (int)PyLong_AsLong(fdo);
    Py_DECREF(fdo);
    if (self->fd == -1 && PyErr_Occurred())
        goto error;
    if (py_int_attr(sock, "family", &self->family) == NULL ||
        py_int_attr(sock, "type", &self->type) == NULL ||
        py_int_attr(sock, "proto", &self->proto) == NULL)
        goto error;
    self->accept_ready = PyObject_GetAttrString((PyObject *)self, "_accept_ready");
    if (self->accept_ready == NULL)
        goto error;
    PyObject *r = listener_start(self, NULL);
    if (r == NULL)
        goto error;
    Py_DECREF(r);
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static int
listener_traverse(ListenerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->loop);
    Py_VISIT(self->sock);
    Py_VISIT(self->protocol_factory);
    Py_VISIT(self->server);
    Py_VISIT(self->accept_ready);
    Py_VISIT(self->retry_handle);
    return 0;
}

static int
listener_clear(ListenerObject *self)
{
    Py_CLEAR(self->loop);
    Py_CLEAR(self->sock);
    Py_CLEAR(self->protocol_factory);
    Py_CLEAR(self->server);
    Py_CLEAR(self->accept_ready);
    Py_CLEAR(self->retry_handle);
    return 0;
}

static void
listener_dealloc(ListenerObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    listener_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef listener_methods[] = {
    {"_accept_ready", (PyCFunction)listener_accept_ready, METH_NOARGS, NULL},
    {"_start", (PyCFunction)listener_start, METH_NOARGS, NULL},
    {"close", (PyCFunction)listener_close, METH_NOARGS, NULL},
    {NULL}
};

static PyType_Slot listener_slots[] = {
    {Py_tp_dealloc, listener_dealloc},
    {Py_tp_traverse, listener_traverse},
    {Py_tp_clear, listener_clear},
    {Py_tp_methods, listener_methods},
    {Py_tp_doc, "Accepts connections on a listening socket for a Server."},
    {0, NULL}
};

PyType_Spec tl_listener_spec = {
    .name = "tideloop.Listener",
    .basicsize = sizeof(ListenerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = listener_slots,
};

