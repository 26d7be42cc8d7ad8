/* Pipe transports: the read end and the write end.
 *
 * Behaviour follows asyncio's _UnixReadPipeTransport and
 * _UnixWritePipeTransport (unix_events.py): the same callbacks in the same
 * order, the same errors and log messages.  The machinery (registration,
 * the write queue, flow control, extra info, finalisation) is the shared
 * one (transport.c); reads use the loop's spare bytes as the stream
 * transports do, writes are tried at once and the rest is flushed with
 * writev().
 *
 * May call: transport.c, loop.c, recvbuf.c. */
#define _GNU_SOURCE
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct {
    TransportObject base;
    int lost_scheduled;         /* connection_lost is on its way */
    int watch_peer;             /* write end: the peer closing is visible */
} PipeTransportObject;

#define PIPE(o) ((PipeTransportObject *)(o))

/* asyncio's pipe _close(exc): stop watching, drop the queue, and schedule
 * connection_lost -- once (asyncio would schedule it twice on a second
 * abort(), and the second call would fail on a cleared protocol). */
static int
pipe_close(TransportObject *self, PyObject *exc)
{
    self->head.closing = 1;
    if (PIPE(self)->lost_scheduled)
        return 0;
    if (self->wq_len) {
        if (tl_tr_remove_writer(self) < 0)
            return -1;
    }
    tl_wq_clear(self);
    if (tl_tr_remove_reader(self) < 0)
        return -1;
    PIPE(self)->lost_scheduled = 1;
    return tl_tr_schedule_connection_lost(self, exc);
}

static int
log_closed_by_peer(TransportObject *self)
{
    if (!self->loop->debug)
        return 0;
    PyObject *r = PyObject_CallMethod(self->loop->state->logger, "info", "sO",
                                      "%r was closed by peer", (PyObject *)self);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *
none_or_null(int rc)
{
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- the read end ---- */

static int
rp_read_ready(PyObject *obj)
{
    TransportObject *self = (TransportObject *)obj;
    if (self->fd < 0 || PIPE(self)->lost_scheduled)
        return 0;
    LoopObject *loop = self->loop;
    PyObject *data;
    int err;
    if (tl_recv_spare(&loop->recv, self->fd, TL_SPARE_SIZE, 1,
                      &self->small_reads, &data, &err) < 0)
        return -1;
    if (data == NULL && err != 0) {
        if (err == EAGAIN || err == EWOULDBLOCK)
            return 0;
        return tl_tr_fatal_errno(self, err, "Fatal read error on pipe transport");
    }
    if (data == NULL) {
        /* EOF: eof_received and connection_lost follow, each in its own
         * callback, whatever eof_received returns. */
        if (log_closed_by_peer(self) < 0)
            return -1;
        self->head.closing = 1;
        if (tl_tr_remove_reader(self) < 0)
            return -1;
        PyObject *eof = PyObject_GetAttr(self->protocol,
                                         loop->state->str_eof_received);
        if (eof == NULL)
            return -1;
        int rc = tl_loop_call_soon(loop, eof, NULL, 0, NULL);
        Py_DECREF(eof);
        if (rc < 0)
            return -1;
        PIPE(self)->lost_scheduled = 1;
        return tl_tr_schedule_connection_lost(self, NULL);
    }
    /* As in asyncio, an exception from data_received is the callback's. */
    PyObject *args[2] = {self->protocol, data};
    PyObject *r = PyObject_VectorcallMethod(
        loop->state->str_data_received, args,
        2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    tl_recv_give_back(&loop->recv, data);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *
rp_close(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->head.closing)
        Py_RETURN_NONE;
    return none_or_null(pipe_close(self, NULL));
}

static PyObject *
pipe_repr(TransportObject *self)
{
    const char *state = self->fd < 0 ? " closed" : self->head.closing ? " closing" : "";
    const char *name = tl_type_name(Py_TYPE(self));
    if (self->fd < 0)
        return PyUnicode_FromFormat("<%s%s fd=%d closed>", name, state,
                                    self->fd);
    if (self->loop->closed)   /* what asyncio shows without a selector */
        return PyUnicode_FromFormat("<%s%s fd=%d open>", name, state, self->fd);
    if (self->ops->write_ready == NULL)   /* the read end */
        return PyUnicode_FromFormat(
            "<%s%s fd=%d %s>", name, state, self->fd,
            (self->watching & TL_POLL_READ) ? "polling" : "idle");
    return PyUnicode_FromFormat(
        "<%s%s fd=%d %s bufsize=%zd>", name, state, self->fd,
        (self->watching & TL_POLL_WRITE) ? "polling" : "idle",
        self->buffer_size);
}

/* ---- the write end ---- */

static PyObject *
wp_write(TransportObject *self, PyObject *data)
{
    /* asyncio asserts the type here. */
    if (!PyBytes_Check(data) && !PyByteArray_Check(data) &&
        !PyMemoryView_Check(data)) {
        PyObject *r = PyObject_Repr(data);
        if (r != NULL) {
            PyErr_SetObject(PyExc_AssertionError, r);
            Py_DECREF(r);
        }
        return NULL;
    }
    /* As asyncio: nothing to do for no data; a write after the pipe was
     * lost or closed is only counted. */
    Py_ssize_t size = PyObject_Length(data);
    if (size <= 0)
        return size < 0 ? NULL : Py_NewRef(Py_None);
    if (self->conn_lost || self->head.closing)
        return none_or_null(tl_tr_count_lost_write(
            self, "pipe closed by peer or os.write(pipe, data) raised exception."));
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        int lost;
        return none_or_null(tl_tr_unusable_buffer(
            self, "Fatal write error on pipe transport",
            "can't concat memoryview to bytearray", &lost));
    }
    int rc = 0;
    const char *p = view.buf;
    Py_ssize_t len = view.len;
    if (self->wq_len == 0) {
        ssize_t n;
        do {
            n = write(self->fd, p, (size_t)len);
        } while (tl_retry_eintr(n));
        if (n < 0 && PyErr_Occurred()) {
            rc = -1;            /* a signal handler raised */
            goto done;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                int err = errno;
                self->conn_lost++;
                rc = tl_tr_fatal_errno(self, err,
                                       "Fatal write error on pipe transport");
                goto done;
            }
            n = 0;
        }
        if (n == len)
            goto done;
        p += n;
        len -= n;
        if (tl_tr_add_writer(self) < 0) {
            rc = -1;
            goto done;
        }
    }
    rc = tl_wq_push(self, data, p, len);
    if (rc == 0)
        rc = tl_tr_maybe_pause_protocol(self);
done:
    PyBuffer_Release(&view);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
wp_write_ready(PyObject *obj)
{
    TransportObject *self = (TransportObject *)obj;
    if (self->fd < 0 || self->wq_len == 0)
        return 0;
    struct iovec iov[TL_WRITEV_MAX];
    int cnt = tl_wq_iov(self, iov);
    ssize_t n;
    do {
        n = writev(self->fd, iov, cnt);
    } while (tl_retry_eintr(n));
    if (n < 0) {
        if (PyErr_Occurred())
            return -1;          /* a signal handler raised */
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        int err = errno;
        tl_wq_clear(self);
        self->conn_lost++;
        if (tl_tr_remove_writer(self) < 0)
            return -1;
        return tl_tr_fatal_errno(self, err, "Fatal write error on pipe transport");
    }
    tl_wq_consume(self, n);
    if (self->wq_len)
        return 0;
    if (tl_tr_remove_writer(self) < 0 ||
        tl_tr_maybe_resume_protocol(self) < 0)   /* may write more */
        return -1;
    if (self->head.closing && !PIPE(self)->lost_scheduled) {
        if (tl_tr_remove_reader(self) < 0)
            return -1;
        PIPE(self)->lost_scheduled = 1;
        return tl_tr_connection_lost(self, Py_None);
    }
    return 0;
}

/* The read end of the pipe going away shows as "readable" on the write
 * end (FIFOs and sockets): the peer closed. */
static int
wp_read_ready(PyObject *obj)
{
    TransportObject *self = (TransportObject *)obj;
    if (self->fd < 0 || PIPE(self)->lost_scheduled)
        return 0;
    if (log_closed_by_peer(self) < 0)
        return -1;
    if (self->wq_len == 0)
        return pipe_close(self, NULL);
    PyObject *exc = PyObject_CallNoArgs(PyExc_BrokenPipeError);
    if (exc == NULL)
        return -1;
    int rc = pipe_close(self, exc);
    Py_DECREF(exc);
    return rc;
}

/* Scheduled after connection_made: watch for the peer closing. */
static PyObject *
wp_start_reading(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (PIPE(self)->watch_peer && self->fd >= 0 && !PIPE(self)->lost_scheduled &&
        tl_tr_add_reader(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
wp_write_eof(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->head.closing)
        Py_RETURN_NONE;
    self->head.closing = 1;
    if (self->wq_len == 0 && !PIPE(self)->lost_scheduled) {
        if (tl_tr_remove_reader(self) < 0)
            return NULL;
        PIPE(self)->lost_scheduled = 1;
        if (tl_tr_schedule_connection_lost(self, NULL) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
wp_can_write_eof(TransportObject *Py_UNUSED(self),
                 PyObject *Py_UNUSED(ignored))
{
    Py_RETURN_TRUE;
}

static PyObject *
wp_close(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fd < 0 || self->head.closing)
        Py_RETURN_NONE;
    return wp_write_eof(self, NULL);
}

static PyObject *
wp_abort(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    return none_or_null(pipe_close(self, NULL));
}

/* ---- construction ---- */

/* Loop._make_read_pipe_transport / _make_write_pipe_transport(pipe,
 * protocol, waiter=None, extra=None) */
static const tl_transport_ops read_pipe_ops = {
    .read_ready = rp_read_ready,
    .close_after_error = pipe_close,
    .quiet_errno = EIO,     /* the read end only keeps quiet about EIO */
};

static const tl_transport_ops write_pipe_ops = {
    .read_ready = wp_read_ready,
    .write_ready = wp_write_ready,
    .close_after_error = pipe_close,
    .unusable_buffer_loses = 1,
};

static PyObject *
make_pipe_transport(PyObject *loopobj, PyObject *args, PyObject *kwds,
                    int readable)
{
    static char *kwlist[] = {"pipe", "protocol", "waiter", "extra", NULL};
    PyObject *pipe, *protocol, *waiter = Py_None, *extra = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OO:_make_pipe_transport",
                                     kwlist, &pipe, &protocol, &waiter, &extra))
        return NULL;
    LoopObject *loop = (LoopObject *)loopobj;
    tl_state *st = loop->state;
    /* pipe.fileno(), as asyncio calls it (a bare int is refused). */
    PyObject *fdo = PyObject_CallMethod(pipe, "fileno", NULL);
    if (fdo == NULL)
        return NULL;
    int fd = PyObject_AsFileDescriptor(fdo);
    Py_DECREF(fdo);
    if (fd < 0)
        return NULL;
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    int is_fifo = S_ISFIFO(sb.st_mode), is_sock = S_ISSOCK(sb.st_mode),
        is_char = S_ISCHR(sb.st_mode);
    if (!(is_fifo || is_sock || is_char)) {
        PyErr_SetString(PyExc_ValueError,
                        readable
                            ? "Pipe transport is for pipes/sockets only."
                            : "Pipe transport is only for pipes, sockets and "
                              "character devices");
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *xtra = PyDict_New();
    if (xtra == NULL)
        return NULL;
    if ((extra != Py_None && PyDict_Update(xtra, extra) < 0) ||
        PyDict_SetItemString(xtra, "pipe", pipe) < 0) {
        Py_DECREF(xtra);
        return NULL;
    }
    TransportObject *tr = tl_tr_create(
        loop, readable ? st->ReadPipeTransportType : st->WritePipeTransportType,
        readable ? &read_pipe_ops : &write_pipe_ops, fd, pipe, 0, 0, 0,
        protocol, waiter, xtra, NULL, NULL, 0, NULL);
    Py_DECREF(xtra);
    if (tr == NULL)
        return NULL;
    /* asyncio's AIX exception aside: FIFOs and sockets report the peer
     * closing as readability of the write end (watched from _start_reading,
     * which runs after connection_made). */
    PIPE(tr)->watch_peer = is_sock || is_fifo;
    return (PyObject *)tr;
}

static PyObject *
loop_make_read_pipe_transport(PyObject *loop, PyObject *args, PyObject *kwds)
{
    return make_pipe_transport(loop, args, kwds, 1);
}

static PyObject *
loop_make_write_pipe_transport(PyObject *loop, PyObject *args, PyObject *kwds)
{
    return make_pipe_transport(loop, args, kwds, 0);
}

const PyMethodDef tl_pipe_loop_methods[] = {
    {"_make_read_pipe_transport",
     (PyCFunction)(void (*)(void))loop_make_read_pipe_transport,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {"_make_write_pipe_transport",
     (PyCFunction)(void (*)(void))loop_make_write_pipe_transport,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL}
};

/* ---- attributes ---- */

static PyObject *
pipe_get_pipe(TransportObject *self, void *Py_UNUSED(c))
{
    if (self->fd < 0 || self->sock == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->sock);
}

/* `transport._pipe = None` forgets the pipe (asyncio's __del__ then has
 * nothing to warn about or close); the caller closes it. */
static int
pipe_set_pipe(TransportObject *self, PyObject *value, void *Py_UNUSED(c))
{
    if (value != Py_None) {
        PyErr_SetString(PyExc_AttributeError, "_pipe can only be set to None");
        return -1;
    }
    if (self->fd >= 0) {
        if (!self->loop->closed &&
            (tl_tr_remove_reader(self) < 0 || tl_tr_remove_writer(self) < 0))
            return -1;
        self->fd = -1;
    }
    Py_CLEAR(self->sock);
    return 0;
}

static PyObject *
pipe_get_fileno(TransportObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->fd);
}

static PyGetSetDef pipe_getset[] = {
    {"_pipe", (getter)pipe_get_pipe, (setter)pipe_set_pipe, NULL, NULL},
    {"_fileno", (getter)pipe_get_fileno, NULL, NULL, NULL},
    TL_TR_BASE_GETSET,
    {NULL}
};

static PyMethodDef rp_methods[] = {
    {"close", (PyCFunction)rp_close, METH_NOARGS, NULL},
    {"resume_reading", (PyCFunction)tl_tr_resume_reading, METH_NOARGS, NULL},
    TL_TR_READ_METHODS,
    TL_TR_BASE_METHODS,
    {NULL}
};

static PyMethodDef wp_methods[] = {
    {"write", (PyCFunction)wp_write, METH_O, "Write data; never blocks."},
    {"write_eof", (PyCFunction)wp_write_eof, METH_NOARGS, NULL},
    {"can_write_eof", (PyCFunction)wp_can_write_eof, METH_NOARGS, NULL},
    {"close", (PyCFunction)wp_close, METH_NOARGS, NULL},
    {"abort", (PyCFunction)wp_abort, METH_NOARGS, NULL},
    {"_read_ready", (PyCFunction)tl_tr_read_ready_meth, METH_NOARGS, NULL},
    {"_start_reading", (PyCFunction)wp_start_reading, METH_NOARGS, NULL},
    TL_TR_WRITE_METHODS,
    TL_TR_BASE_METHODS,
    {NULL}
};

static PyType_Slot rp_slots[] = {
    TL_TR_SLOTS(pipe_repr, rp_methods, pipe_getset,
                "The read end of a pipe (or a FIFO, socket or character device).")
};

static PyType_Slot wp_slots[] = {
    TL_TR_SLOTS(pipe_repr, wp_methods, pipe_getset,
                "The write end of a pipe (or a FIFO, socket or character device).")
};

PyType_Spec tl_read_pipe_transport_spec =
    TL_TR_SPEC("tideloop.ReadPipeTransport", PipeTransportObject, rp_slots);

PyType_Spec tl_write_pipe_transport_spec =
    TL_TR_SPEC("tideloop.WritePipeTransport", PipeTransportObject, wp_slots);
