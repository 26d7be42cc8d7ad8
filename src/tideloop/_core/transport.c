/* The transports' shared machinery (transport.h): registration with the
 * fd table, the write queue, protocol callbacks with asyncio's error
 * handling, flow control, closing, extra info, construction and the GC
 * plumbing.  Per-type behaviour comes from the type's ops table.
 *
 * May call: loop.c, fdtable.c, sockaddr.c. */
#define _GNU_SOURCE
#include "transport.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>


int
tl_tr_is_reading(TransportObject *self)
{
    return !self->head.closing && !self->paused;
}

/* ---- socket object and extra info ---- */

/* The socket.socket object; made from our fd the first time it is needed. */
static PyObject *
tl_tr_get_sock(TransportObject *self)
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


/* Close our fd (through its socket object when there is one); errors are
 * unraisable. */
static void
close_fd(TransportObject *self)
{
    if (self->loop != NULL)
        tl_fd_clear_transport(self->loop, self->fd, &self->head);
    if (self->sock != NULL) {
        /* (self->loop may be gone here: then by name.) */
        tl_state *st = self->loop != NULL ? self->loop->state : NULL;
        PyObject *r = st ? PyObject_CallMethodNoArgs(self->sock, st->str_close)
                         : PyObject_CallMethod(self->sock, "close", NULL);
        if (r == NULL)
            PyErr_WriteUnraisable(self->sock);
        Py_XDECREF(r);
    }
    else {
        close(self->fd);
    }
    self->fd = -1;
}

void
tl_tr_close_socket(TransportObject *self)
{
    if (self->fd < 0)
        return;
    /* Nothing of ours may stay registered under an fd number the kernel
     * will hand out again. */
    if (tl_tr_remove_reader(self) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    if (tl_tr_remove_writer(self) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    close_fd(self);
}

/* ---- loop registration ---- */

/* Start (on) or stop watching the fd for one direction. */
int
tl_tr_watch(TransportObject *self, int which, int on)
{
    if (self->fd < 0 || (!on && !(self->watching & which)))
        return 0;
    if (!on) {
        self->watching &= ~which;
        return tl_fd_remove(self->loop, self->fd, which, NULL);
    }
    tl_io_watcher *w = which == TL_POLL_READ ? &self->reader : &self->writer;
    if (tl_fd_watch(self->loop, self->fd, which, w, self->context) < 0)
        return -1;
    self->watching |= which;
    return 0;
}


/* ---- write queue ---- */

void
tl_wq_clear(TransportObject *self)
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
tl_wq_push(TransportObject *self, PyObject *obj, const char *data,
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
    if (obj != NULL && PyBytes_CheckExact(obj)) {
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
tl_wq_iov(TransportObject *self, struct iovec *iov)
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
tl_wq_pop(TransportObject *self)
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
tl_wq_consume(TransportObject *self, Py_ssize_t n)
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


/* asyncio's _fatal_error: OSErrors are only logged in debug mode, anything
 * else goes to the exception handler; then the transport is force-closed. */
int
tl_tr_fatal_error(TransportObject *self, PyObject *exc, const char *message)
{
    tl_state *st = self->loop->state;
    int quiet = PyObject_IsInstance(exc, PyExc_OSError) == 1;
    if (quiet && self->ops->quiet_errno) {
        /* The read end of a pipe only keeps quiet about EIO. */
        PyObject *e = PyObject_GetAttrString(exc, "errno");
        if (e == NULL)
            return -1;   /* as asyncio's exc.errno */
        long n = PyLong_Check(e) ? PyLong_AsLong(e) : 0;
        Py_DECREF(e);
        if (n == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();   /* a huge errno: not the quiet one */
        }
        quiet = n == self->ops->quiet_errno;
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
    return self->ops->close_after_error(self, exc);
}

/* After a failed call: propagate SystemExit/KeyboardInterrupt, else hand
 * the exception to tl_tr_fatal_error.  Returns -1 only to propagate. */
int
tl_tr_fail(TransportObject *self, const char *message)
{
    if (tl_tr_is_fatal_base_exception())
        return -1;
    PyObject *exc = tl_err_get_raised();
    int rc = tl_tr_fatal_error(self, exc, message);
    Py_XDECREF(exc);
    return rc;
}

static int
tl_tr_call_flow(TransportObject *self, const char *meth, const char *fail)
{
    PyObject *r = PyObject_CallMethod(self->protocol, meth, NULL);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    if (tl_tr_is_fatal_base_exception())
        return -1;
    PyObject *exc = tl_err_get_raised();
    int rc = tl_loop_report(self->loop, fail, exc, "transport", (PyObject *)self,
                            "protocol", self->protocol, NULL);
    Py_XDECREF(exc);
    return rc;
}

int
tl_tr_maybe_pause_protocol(TransportObject *self)
{
    if ((double)self->buffer_size <= self->high_water || self->protocol_paused)
        return 0;
    self->protocol_paused = 1;
    return tl_tr_call_flow(self, "pause_writing", "protocol.pause_writing() failed");
}

int
tl_tr_maybe_resume_protocol(TransportObject *self)
{
    if (!self->protocol_paused || (double)self->buffer_size > self->low_water)
        return 0;
    self->protocol_paused = 0;
    return tl_tr_call_flow(self, "resume_writing", "protocol.resume_writing() failed");
}

/* ---- closing ---- */

int
tl_tr_schedule_connection_lost(TransportObject *self, PyObject *exc)
{
    PyObject *meth = PyObject_GetAttr((PyObject *)self,
                                      self->loop->state->str_call_connection_lost);
    if (meth == NULL)
        return -1;
    PyObject *arg = exc ? exc : Py_None;
    int rc = tl_loop_call_soon(self->loop, meth, &arg, 1, self->context);
    Py_DECREF(meth);
    return rc;
}

int
tl_tr_force_close(TransportObject *self, PyObject *exc)
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

/* In a finally-like sequence, as in asyncio's `finally:`: a later error
 * replaces the pending one, which becomes its __context__. */
static void
keep_last_error(PyObject **pending)
{
    tl_err_chain(*pending);
    *pending = tl_err_get_raised();
}

int
tl_tr_connection_lost(TransportObject *self, PyObject *exc)
{
    tl_state *st = self->loop->state;
    PyObject *pending = NULL;
    if (self->protocol_connected && self->protocol != NULL) {
        PyObject *args[2] = {self->protocol, exc};
        PyObject *r = PyObject_VectorcallMethod(
            st->str_connection_lost, args,
            2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL)
            keep_last_error(&pending);
        Py_XDECREF(r);
    }
    /* finally: */
    tl_tr_close_socket(self);
    if (self->cproto != NULL) {
        /* The protocol is done: the C engine lets go of it (no cycles
         * left for the GC, as with asyncio's own SSLProtocol). */
        tl_cproto *p = self->cproto;
        self->cproto = NULL;
        p->detach(p);
        Py_DECREF(p);
    }
    Py_CLEAR(self->protocol);
    PyObject *server = self->server;
    self->server = NULL;
    if (server != NULL) {
        /* 3.13+: Server._detach(transport) (it tracks its clients). */
        PyObject *d = st->server_attach_takes_transport
                          ? PyObject_CallMethodOneArg(server, st->str_detach,
                                                      (PyObject *)self)
                          : PyObject_CallMethodNoArgs(server, st->str_detach);
        Py_DECREF(server);
        if (d == NULL)
            keep_last_error(&pending);
        Py_XDECREF(d);
    }
    if (self->empty_waiter != NULL) {
        PyObject *cerr = PyObject_CallFunction(PyExc_ConnectionError, "s",
                                               "Connection is closed by peer");
        PyObject *d = cerr ? PyObject_CallMethodOneArg(
                                 self->empty_waiter, st->str_set_exception, cerr)
                           : NULL;
        Py_XDECREF(cerr);
        if (d == NULL)
            keep_last_error(&pending);
        Py_XDECREF(d);
    }
    if (pending != NULL) {
        tl_err_set_raised(pending);
        return -1;
    }
    return 0;
}

PyObject *
tl_tr_call_connection_lost(TransportObject *self, PyObject *exc)
{
    if (tl_tr_connection_lost(self, exc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

int
tl_tr_fatal_errno(TransportObject *self, int err, const char *message)
{
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    PyObject *exc = tl_err_get_raised();
    int rc = tl_tr_fatal_error(self, exc, message);
    Py_XDECREF(exc);
    return rc;
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

/* A write of a buffer that is not contiguous (a strided memoryview), with
 * the exception of PyObject_GetBuffer pending: asyncio's first send() would
 * raise it, a fatal write error; with data already queued, its bytearray
 * refuses the buffer with a TypeError out of write(). */
int
tl_tr_unusable_buffer(TransportObject *self, const char *fatal_message,
                      const char *queued_message, int *lost)
{
    *lost = 0;
    if (!PyErr_ExceptionMatches(PyExc_BufferError))
        return -1;
    if (self->conn_lost) {
        PyErr_Clear();
        *lost = 1;
        return 0;
    }
    if (self->wq_len) {
        PyErr_SetString(PyExc_TypeError, queued_message);
        return -1;
    }
    if (self->ops->unusable_buffer_loses)
        self->conn_lost++;
    return tl_tr_fail(self, fatal_message);
}

int
tl_tr_count_lost_write(TransportObject *self, const char *warning)
{
    if (self->conn_lost >= LOG_THRESHOLD_FOR_CONNLOST_WRITES) {
        PyObject *r = PyObject_CallMethod(self->loop->state->logger, "warning",
                                          "s", warning);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    self->conn_lost++;
    return 0;
}

/* ---- public transport API ---- */

/* _read_ready() / _write_ready(), as asyncio's tests call them by hand. */
PyObject *
tl_tr_read_ready_meth(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->ops->read_ready((PyObject *)self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_write_ready_meth(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->ops->write_ready((PyObject *)self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_close(TransportObject *self, PyObject *Py_UNUSED(ignored))
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
tl_tr_abort(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (tl_tr_force_close(self, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_force_close_meth(TransportObject *self, PyObject *exc)
{
    if (tl_tr_force_close(self, exc == Py_None ? NULL : exc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_is_closing_meth(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->head.closing);
}

PyObject *
tl_tr_is_reading_meth(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(tl_tr_is_reading(self));
}

int
tl_tr_debug_log(TransportObject *self, const char *fmt)
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
tl_tr_pause_reading(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!tl_tr_is_reading(self))
        Py_RETURN_NONE;
    self->paused = 1;
    if (tl_tr_remove_reader(self) < 0 || tl_tr_debug_log(self, "%r pauses reading") < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_resume_reading(TransportObject *self, PyObject *Py_UNUSED(ignored))
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
tl_tr_start_reading(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!tl_tr_is_reading(self))
        Py_RETURN_NONE;
    if (tl_tr_add_reader(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_get_write_buffer_size(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->buffer_size);
}

PyObject *
tl_tr_get_write_buffer_limits(TransportObject *self,
                           PyObject *Py_UNUSED(ignored))
{
    if (self->limits != NULL)
        return Py_NewRef(self->limits);
    return Py_BuildValue("ii", 16 * 1024, 64 * 1024);
}

static int
tl_tr_set_limits(TransportObject *self, PyObject *high, PyObject *low)
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
tl_tr_set_write_buffer_limits(TransportObject *self, PyObject *args,
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
tl_tr_set_protocol_impl(TransportObject *self, PyObject *protocol)
{
    tl_state *st = self->loop->state;
    int buffered = PyObject_IsInstance(protocol, st->BufferedProtocol);
    if (buffered < 0)
        return -1;
    /* An asyncio SSLProtocol over a stream socket is adopted by tls.c: its
     * C engine takes the received bytes (no get_buffer/buffer_updated). */
    tl_cproto *cproto = NULL;
    if (st->tls_adopt != NULL && Py_IS_TYPE(protocol, (PyTypeObject *)st->SSLProtocol) &&
        Py_IS_TYPE(self, st->SocketTransportType)) {
        PyObject *eng = PyObject_CallOneArg(st->tls_adopt, protocol);
        if (eng == NULL)
            return -1;
        if (PyObject_TypeCheck(eng, st->TLSEngineType))
            cproto = (tl_cproto *)eng;
        else
            Py_DECREF(eng);
    }
    /* asyncio's StreamReaderProtocol: streams.c feeds its reader in C. */
    else if (Py_IS_TYPE(self, st->SocketTransportType) && st->s_protocol_type != NULL &&
             Py_IS_TYPE(protocol, (PyTypeObject *)st->s_protocol_type)) {
        PyObject *feeder;
        if (st->streams_adopt(self->loop, protocol, &feeder) < 0)
            return -1;
        cproto = (tl_cproto *)feeder;
    }
    self->buffered = buffered;
    Py_XSETREF(self->cproto, cproto);
    Py_XSETREF(self->protocol, Py_NewRef(protocol));
    self->protocol_connected = 1;
    return 0;
}

PyObject *
tl_tr_set_protocol(TransportObject *self, PyObject *protocol)
{
    if (tl_tr_set_protocol_impl(self, protocol) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
tl_tr_get_protocol(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(self->protocol ? self->protocol : Py_None);
}

int
tl_rawaddr_set(tl_rawaddr *a, const struct sockaddr *sa, socklen_t len)
{
    tl_rawaddr_clear(a);
    if (len > (socklen_t)sizeof(a->in)) {
        if ((a->big = PyMem_Malloc(len)) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(a->big, sa, len);
    }
    else if (len > 0)
        memcpy(&a->in, sa, len);
    a->len = len;
    return 0;
}

void
tl_rawaddr_clear(tl_rawaddr *a)
{
    PyMem_Free(a->big);
    a->big = NULL;
    a->len = 0;
}

/* The socket's own address (getsockname) or its peer's (getpeername) into
 * a; none when the call fails, as asyncio's extra info is then None. */
static int
rawaddr_from_fd(tl_rawaddr *a, int fd, int peer)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int r = peer ? getpeername(fd, (struct sockaddr *)&ss, &len)
                 : getsockname(fd, (struct sockaddr *)&ss, &len);
    return tl_rawaddr_set(a, (struct sockaddr *)&ss, r < 0 ? 0 : len);
}

/* The address as the socket module shows it, converted once. */
static PyObject *
tl_tr_cached_address(PyObject **cache, const tl_rawaddr *addr)
{
    if (*cache == NULL) {
        *cache = addr->len ? tl_sockaddr_to_py(tl_rawaddr_sa(addr), addr->len)
                           : Py_NewRef(Py_None);
        if (*cache == NULL)
            return NULL;
    }
    return Py_NewRef(*cache);
}

PyObject *
tl_tr_extra_value(TransportObject *self, const char *name)
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
        return tl_tr_cached_address(&self->sockname, &self->local_addr);
    if (strcmp(name, "peername") == 0)
        return tl_tr_cached_address(&self->peername, &self->peer_addr);
    return NULL;
}

PyObject *
tl_tr_get_extra_info(TransportObject *self, PyObject *const *args,
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
        self->ops->is_socket) {
        const char *s = PyUnicode_AsUTF8(name);
        if (s == NULL)
            return NULL;
        PyObject *v = tl_tr_extra_value(self, s);
        if (v != NULL || PyErr_Occurred())
            return v;
    }
    return Py_NewRef(dflt);
}

PyObject *
tl_tr_repr(TransportObject *self)
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
tl_tr_get_sock_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return tl_tr_get_sock(self);
}

PyObject *
tl_tr_get_fd_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->fd);
}

PyObject *
tl_tr_get_loop_attr(TransportObject *self, void *Py_UNUSED(c))
{
    if (self->fd < 0 && self->conn_lost)
        Py_RETURN_NONE;   /* asyncio drops _loop after connection_lost */
    return Py_NewRef((PyObject *)self->loop);
}

PyObject *
tl_tr_get_conn_lost(TransportObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->conn_lost);
}

PyObject *
tl_tr_get_closing_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->head.closing);
}

PyObject *
tl_tr_get_paused_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->paused);
}

/* asyncio's _buffer_size: the datagram transports' on every version, the
 * socket transports' from 3.15 (get_write_buffer_size() in O(1)). */
PyObject *
tl_tr_get_buffer_size_attr(TransportObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(self->buffer_size);
}

PyObject *
tl_tr_get_protocol_paused(TransportObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->protocol_paused);
}

/* ---- construction ---- */

TransportObject *
tl_tr_create(LoopObject *loop, PyTypeObject *tp, const tl_transport_ops *ops,
             int fd, PyObject *sock, int family, int type, int proto,
             PyObject *protocol, PyObject *waiter, PyObject *extra,
             PyObject *server, const struct sockaddr *peer, socklen_t peer_len,
             PyObject *context)
{
    tl_state *st = loop->state;
    if (tl_check_closed(loop) < 0)
        return NULL;
    TransportObject *self = PyObject_GC_New(TransportObject, tp);
    if (self == NULL)
        return NULL;
    /* Zero everything after the header, the type's own fields too. */
    memset((char *)self + sizeof(PyObject), 0,
           (size_t)tp->tp_basicsize - sizeof(PyObject));
    self->ops = ops;
    self->fd = fd;
    self->loop = (LoopObject *)Py_NewRef((PyObject *)loop);
    self->family = family;
    self->type = type;
    self->proto = proto;
    self->sock = Py_XNewRef(sock);
    if (context != NULL && context != Py_None)
        self->context = Py_NewRef(context);
    self->high_water = 64 * 1024;
    self->low_water = 16 * 1024;
    self->reader = (tl_io_watcher){.fn = ops->read_ready, .name = "_read_ready",
                                   .owner = (PyObject *)self};
    self->writer = (tl_io_watcher){.fn = ops->write_ready,
                                   .name = "_write_ready",
                                   .owner = (PyObject *)self};
    if (extra != NULL && extra != Py_None) {
        self->head.extra = PyDict_Copy(extra);
        if (self->head.extra == NULL)
            goto error;
    }
    if (ops->is_socket) {
        if (rawaddr_from_fd(&self->local_addr, fd, 0) < 0 ||
            (peer != NULL ? tl_rawaddr_set(&self->peer_addr, peer, peer_len)
                          : rawaddr_from_fd(&self->peer_addr, fd, 1)) < 0)
            goto error;
    }
    PyObject_GC_Track(self);
    if (tl_tr_set_protocol_impl(self, protocol) < 0)
        goto error;
    if (server != NULL && server != Py_None) {
        self->server = Py_NewRef(server);
        PyObject *r = st->server_attach_takes_transport
                          ? PyObject_CallMethodOneArg(server, st->str_attach,
                                                      (PyObject *)self)
                          : PyObject_CallMethodNoArgs(server, st->str_attach);
        if (r == NULL)
            goto error;
        Py_DECREF(r);
    }
    /* asyncio's add_reader refuses the fds of socket transports only. */
    if (ops->is_socket && tl_fd_set_transport(loop, fd, &self->head) < 0)
        goto error;

    PyObject *made = PyObject_GetAttr(protocol, st->str_connection_made);
    if (made == NULL)
        goto error;
    PyObject *arg = (PyObject *)self;
    int rc = tl_loop_call_soon(loop, made, &arg, 1, self->context);
    Py_DECREF(made);
    if (rc < 0)
        goto error;
    PyObject *start = PyObject_GetAttr((PyObject *)self, st->str_start_reading);
    if (start == NULL)
        goto error;
    rc = tl_loop_call_soon(loop, start, NULL, 0, self->context);
    Py_DECREF(start);
    if (rc < 0)
        goto error;
    if (waiter != NULL && waiter != Py_None) {
        PyObject *wargs[2] = {waiter, Py_None};
        if (tl_loop_call_soon(loop, st->set_result_unless_cancelled, wargs, 2,
                              self->context) < 0)
            goto error;
    }
    return self;
error:
    /* The fd stays with the caller. */
    tl_fd_clear_transport(loop, fd, &self->head);
    self->fd = -1;
    Py_DECREF(self);
    return NULL;
}

/* ---- type plumbing ---- */

int
tl_tr_traverse(TransportObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->loop);
    Py_VISIT(self->sock);
    Py_VISIT(self->protocol);
    Py_VISIT(self->cproto);
    Py_VISIT(self->head.extra);
    Py_VISIT(self->limits);
    Py_VISIT(self->server);
    Py_VISIT(self->context);
    Py_VISIT(self->reader.context);
    Py_VISIT(self->writer.context);
    Py_VISIT(self->empty_waiter);
    Py_VISIT(self->sockname);
    Py_VISIT(self->peername);
    Py_VISIT(self->transport_socket);
    Py_VISIT(self->dict);
    if (self->ops->traverse != NULL) {
        int rc = self->ops->traverse(self, visit, arg);
        if (rc != 0)
            return rc;
    }
    for (size_t i = 0; i < self->wq_len; i++) {
        Py_VISIT(self->wq[(self->wq_head + i) % self->wq_cap].obj);
        Py_VISIT(self->wq[(self->wq_head + i) % self->wq_cap].addr);
    }
    return 0;
}

int
tl_tr_clear(TransportObject *self)
{
    Py_CLEAR(self->protocol);
    Py_CLEAR(self->cproto);
    Py_CLEAR(self->head.extra);
    Py_CLEAR(self->limits);
    Py_CLEAR(self->server);
    Py_CLEAR(self->context);
    Py_CLEAR(self->reader.context);
    Py_CLEAR(self->writer.context);
    Py_CLEAR(self->empty_waiter);
    Py_CLEAR(self->sockname);
    Py_CLEAR(self->peername);
    Py_CLEAR(self->transport_socket);
    Py_CLEAR(self->dict);
    if (self->ops != NULL && self->ops->clear != NULL)
        self->ops->clear(self);
    if (self->wq != NULL)
        tl_wq_clear(self);
    return 0;
}

/* asyncio's __del__: an unclosed transport warns and closes its socket. */
void
tl_tr_finalize(TransportObject *self)
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
        PyErr_WriteUnraisable((PyObject *)self);   /* (a finalizer) */
    }
    close_fd(self);
    tl_err_set_raised(exc);
}

void
tl_tr_dealloc(TransportObject *self)
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
    tl_rawaddr_clear(&self->local_addr);
    tl_rawaddr_clear(&self->peer_addr);
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyMemberDef tl_tr_members[] = {
    {"__weaklistoffset__", T_PYSSIZET,
     offsetof(TransportObject, weakreflist), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(TransportObject, dict),
     READONLY, NULL},
    {NULL}
};