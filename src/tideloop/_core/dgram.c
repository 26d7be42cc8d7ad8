/* Datagram socket transports (UDP and Unix datagrams).
 *
 * Behaviour follows asyncio's _SelectorDatagramTransport
 * (selector_events.py): OSErrors on send and receive go to the protocol's
 * error_received(), anything else is fatal; what cannot be sent now is
 * queued as (bytes, address) and sent when the socket is writable, with
 * pause_writing()/resume_writing() at the watermarks.
 *
 * What differs is how: up to TL_DGRAM_BATCH datagrams are received per
 * readiness event with one recvmmsg(), the source address object is reused
 * while the source stays the same, and numeric IPv4/IPv6 and Unix
 * destinations are converted in C (anything else goes through
 * socket.sendto(), so its errors are the socket module's).
 *
 * May call: transport.c, loop.c, recvbuf.c, sockaddr.c. */
#define _GNU_SOURCE
#include "transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#define DGRAM_MAX_SIZE (256 * 1024)   /* asyncio's max_size for recvfrom() */
#if TL_DGRAM_AREA_SIZE < DGRAM_MAX_SIZE
#  error "the receive area must hold the largest Unix datagram asyncio reads"
#endif

typedef struct {
    TransportObject base;
    PyObject *address;          /* remote_addr given at creation, or NULL */
    PyObject *pending;          /* datagrams received in a batch but not
                                   delivered (reading paused meanwhile):
                                   a list of (data, addr) */
    PyObject *last_from;        /* the last source address handed out ... */
    struct sockaddr_storage last_from_sa;   /* ... and its raw form */
    socklen_t last_from_len;
} DatagramTransportObject;

#define DG(o) ((DatagramTransportObject *)(o))

/* ---- addresses ---- */

/* The source address as a Python object, reusing the last one when the
 * source is the same (an echo server sees the same few peers). */
static PyObject *
source_address(TransportObject *self, struct sockaddr_storage *sa,
               socklen_t len)
{
    if (DG(self)->last_from != NULL && len == DG(self)->last_from_len &&
        memcmp(sa, &DG(self)->last_from_sa, len) == 0)
        return Py_NewRef(DG(self)->last_from);
    PyObject *addr = tl_sockaddr_to_py((struct sockaddr *)sa, len);
    if (addr == NULL)
        return NULL;
    Py_XSETREF(DG(self)->last_from, Py_NewRef(addr));
    memcpy(&DG(self)->last_from_sa, sa, len);
    DG(self)->last_from_len = len;
    return addr;
}

/* Convert a destination in C when it is one of the common, unambiguous
 * forms: 1 when converted, 0 when it is left to socket.sendto() (which
 * words the errors of an address it refuses), -1 on another error (no
 * memory). */
static int
left_to_socket(PyObject *refused)
{
    if (!PyErr_ExceptionMatches(refused))
        return -1;
    PyErr_Clear();
    return 0;
}

static int
dest_address(TransportObject *self, PyObject *addr,
             struct sockaddr_storage *sa, socklen_t *len)
{
    if (addr == DG(self)->last_from && DG(self)->last_from != NULL) {
        memcpy(sa, &DG(self)->last_from_sa, DG(self)->last_from_len);
        *len = DG(self)->last_from_len;
        return 1;
    }
    memset(sa, 0, sizeof(*sa));
    if (self->family == AF_UNIX) {
        if (!PyUnicode_Check(addr))
            return 0;
        Py_ssize_t n;
        const char *path = PyUnicode_AsUTF8AndSize(addr, &n);
        if (path == NULL)
            return left_to_socket(PyExc_UnicodeEncodeError);
        struct sockaddr_un *un = (struct sockaddr_un *)sa;
        if (n == 0 || path[0] == '\0' || (size_t)n >= sizeof(un->sun_path))
            return 0;
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path, path, (size_t)n);
        *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
        return 1;
    }
    if (!PyTuple_CheckExact(addr) || PyTuple_GET_SIZE(addr) != 2)
        return 0;
    PyObject *host = PyTuple_GET_ITEM(addr, 0), *port = PyTuple_GET_ITEM(addr, 1);
    if (!PyUnicode_Check(host) || !PyLong_CheckExact(port))
        return 0;
    long p = PyLong_AsLong(port);
    if (p == -1 && PyErr_Occurred())
        return left_to_socket(PyExc_OverflowError);
    if (p < 0 || p > 65535)
        return 0;
    const char *h = PyUnicode_AsUTF8(host);
    if (h == NULL)
        return left_to_socket(PyExc_UnicodeEncodeError);
    if (self->family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        if (inet_pton(AF_INET, h, &in->sin_addr) != 1)
            return 0;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)p);
        *len = sizeof(*in);
        return 1;
    }
    if (self->family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
        if (strchr(h, '%') != NULL || inet_pton(AF_INET6, h, &in6->sin6_addr) != 1)
            return 0;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)p);
        *len = sizeof(*in6);
        return 1;
    }
    return 0;
}

/* ---- sending ---- */

/* Send one datagram; *sent is 0 when the socket would block.  An OSError
 * goes to the protocol's error_received (send_failed), anything else is
 * fatal. */
static int
send_one(TransportObject *self, PyObject *obj, const char *data,
         Py_ssize_t len, PyObject *addr, int *sent)
{
    *sent = 1;
    ssize_t n;
    /* asyncio sends without an address when extra['peername'] is true:
     * an unnamed Unix peer ('') does not count. */
    int connected = self->peer_addr.len > (self->family == AF_UNIX
                                          ? (socklen_t)offsetof(struct sockaddr_un,
                                                                sun_path)
                                          : 0);
    if (connected || addr == NULL || addr == Py_None) {
        if (!connected) {
            /* What socket.sendto(data, None) says, asyncio's path. */
            goto via_socket;
        }
        do {
            n = send(self->fd, data, (size_t)len, MSG_NOSIGNAL);
        } while (tl_retry_eintr(n));
    }
    else {
        struct sockaddr_storage sa;
        socklen_t salen;
        int converted = dest_address(self, addr, &sa, &salen);
        if (converted < 0)
            return -1;
        if (converted == 0)
            goto via_socket;
        do {
            n = sendto(self->fd, data, (size_t)len, MSG_NOSIGNAL,
                       (struct sockaddr *)&sa, salen);
        } while (tl_retry_eintr(n));
    }
    if (n >= 0)
        return 0;
    if (PyErr_Occurred())
        return -1;              /* a signal handler raised */
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *sent = 0;
        return 0;
    }
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;

via_socket:;
    PyObject *sock = PyObject_GetAttrString((PyObject *)self, "_sock");
    if (sock == NULL)
        return -1;
    PyObject *bytes = obj != NULL && PyBytes_CheckExact(obj)
                          ? Py_NewRef(obj)
                          : PyBytes_FromStringAndSize(data, len);
    PyObject *r = bytes ? PyObject_CallMethod(sock, "sendto", "OO", bytes,
                                              addr ? addr : Py_None)
                        : NULL;
    Py_XDECREF(bytes);
    Py_DECREF(sock);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    if (PyErr_ExceptionMatches(PyExc_BlockingIOError) ||
        PyErr_ExceptionMatches(PyExc_InterruptedError)) {
        PyErr_Clear();
        *sent = 0;
        return 0;
    }
    return -1;
}

/* protocol.error_received(exc) for the pending OSError.  An exception it
 * raises is the caller's, as in asyncio. */
static int
error_received(TransportObject *self)
{
    PyObject *exc = tl_err_get_raised();
    PyObject *r = PyObject_CallMethod(self->protocol, "error_received", "O", exc);
    Py_XDECREF(exc);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* After send_one failed: an OSError to error_received, anything else
 * fatal. */
static int
send_failed(TransportObject *self, const char *message)
{
    if (PyErr_ExceptionMatches(PyExc_OSError))
        return error_received(self);
    return tl_tr_fail(self, message);
}

/* sendto(data, addr=None), parsed by hand: it runs once per datagram. */
static PyObject *
dg_sendto(TransportObject *self, PyObject *const *args, Py_ssize_t nargs,
          PyObject *kwnames)
{
    PyObject *data = nargs > 0 ? args[0] : NULL;
    PyObject *addr = nargs > 1 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError,
                     "sendto() takes at most 2 arguments (%zd given)", nargs + nkw);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        PyObject **slot;
        if (PyUnicode_CompareWithASCIIString(k, "data") == 0)
            slot = &data;
        else if (PyUnicode_CompareWithASCIIString(k, "addr") == 0)
            slot = &addr;
        else {
            PyErr_Format(PyExc_TypeError,
                         "sendto() got an unexpected keyword argument '%U'", k);
            return NULL;
        }
        if (*slot != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "sendto() got multiple values for argument '%U'", k);
            return NULL;
        }
        *slot = args[nargs + i];
    }
    if (data == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "sendto() missing required argument 'data' (pos 1)");
        return NULL;
    }
    if (addr == NULL)
        addr = Py_None;
    if (tl_tr_check_writable_data(self->loop->state->sendto_type_error_prefix,
                                  data) < 0)
        return NULL;
    Py_buffer view;
    PyObject *copy = NULL;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        /* Not contiguous: socket.sendto() would refuse it (fatal, as in
         * asyncio); a queued datagram is bytes(data). */
        if (!PyErr_ExceptionMatches(PyExc_BufferError))
            return NULL;
        if (self->wq_len == 0 && !(DG(self)->address && self->conn_lost)) {
            if (tl_tr_fail(self, "Fatal write error on datagram transport") < 0)
                return NULL;
            Py_RETURN_NONE;
        }
        PyErr_Clear();
        copy = PyBytes_FromObject(data);
        if (copy == NULL || PyObject_GetBuffer(copy, &view, PyBUF_SIMPLE) < 0) {
            Py_XDECREF(copy);
            return NULL;
        }
        data = copy;
    }
    int rc = 0;
    if (view.len == 0 && !self->loop->state->dgram_sends_empty)
        goto done;          /* 3.11-3.12 drop empty datagrams */
    if (DG(self)->address != NULL) {
        if (addr != Py_None && addr != DG(self)->address) {
            int eq = PyObject_RichCompareBool(addr, DG(self)->address, Py_EQ);
            if (eq < 0) {
                rc = -1;
                goto done;
            }
            if (!eq) {
                PyErr_Format(PyExc_ValueError,
                             "Invalid address: must be None or %S", DG(self)->address);
                rc = -1;
                goto done;
            }
        }
        addr = DG(self)->address;
        if (self->conn_lost) {
            rc = tl_tr_count_lost_write(self, "socket.send() raised exception.");
            goto done;
        }
    }
    if (self->wq_len == 0) {
        int sent;
        if (send_one(self, data, view.buf, view.len, addr, &sent) < 0) {
            rc = send_failed(self, "Fatal write error on datagram transport");
            goto done;
        }
        if (sent)
            goto done;
        if (tl_tr_add_writer(self) < 0) {
            rc = -1;
            goto done;
        }
    }
    /* Queue an immutable copy, with its destination. */
    rc = tl_wq_push(self, data, view.buf, view.len);
    if (rc == 0) {
        wchunk *c = &self->wq[(self->wq_head + self->wq_len - 1) % self->wq_cap];
        c->addr = Py_NewRef(addr);
        rc = tl_tr_maybe_pause_protocol(self);
    }
done:
    PyBuffer_Release(&view);
    Py_XDECREF(copy);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
dg_write_ready(PyObject *obj)
{
    TransportObject *self = (TransportObject *)obj;
    while (self->wq_len && self->fd >= 0) {
        wchunk *c = &self->wq[self->wq_head];
        int sent;
        int rc = send_one(self, c->obj, c->data, c->len, c->addr, &sent);
        if (rc == 0 && !sent)
            break;
        /* Sent or failed: either way this datagram (possibly empty: 3.13+
         * sends those) leaves the queue. */
        self->buffer_size -= c->len;
        tl_wq_pop(self);
        if (rc < 0)
            return send_failed(self, "Fatal write error on datagram transport");
    }
    if (tl_tr_maybe_resume_protocol(self) < 0)   /* may queue more */
        return -1;
    if (self->wq_len == 0) {
        if (tl_tr_remove_writer(self) < 0)
            return -1;
        if (self->head.closing)
            return tl_tr_connection_lost(self, Py_None);
    }
    return 0;
}

/* ---- receiving ---- */

/* Hand datagram i of the batch to the protocol.  An exception from
 * datagram_received is the callback's, as in asyncio. */
static int
deliver(TransportObject *self, PyObject *data, PyObject *addr)
{
    PyObject *cargs[3] = {self->protocol, data, addr};
    PyObject *r = PyObject_VectorcallMethod(
        self->loop->state->str_datagram_received, cargs,
        3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
dg_can_deliver(TransportObject *self)
{
    return !self->conn_lost && self->fd >= 0 && tl_tr_is_reading(self);
}

/* Deliver what a batch left over (reading was paused in between); what is
 * still left stays for the next call. */
static int
deliver_pending(TransportObject *self)
{
    while (DG(self)->pending != NULL && PyList_GET_SIZE(DG(self)->pending) > 0) {
        if (!dg_can_deliver(self))
            return 0;
        PyObject *item = Py_NewRef(PyList_GET_ITEM(DG(self)->pending, 0));
        if (PyList_SetSlice(DG(self)->pending, 0, 1, NULL) < 0) {
            Py_DECREF(item);
            return -1;
        }
        int rc = deliver(self, PyTuple_GET_ITEM(item, 0),
                         PyTuple_GET_ITEM(item, 1));
        Py_DECREF(item);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* One recvmmsg() takes up to TL_DGRAM_BATCH datagrams (one syscall where
 * asyncio makes one recvfrom() per datagram and per loop iteration).  All
 * are turned into (bytes, address) before any is delivered: the receive
 * area is the loop's.  If a callback pauses reading, the rest waits in
 * DG(self)->pending; if it closes the transport, the rest is dropped, as the
 * kernel's queue would be. */
static int
dg_read_ready(PyObject *obj)
{
    TransportObject *self = (TransportObject *)obj;
    if (deliver_pending(self) < 0)
        return -1;
    if (!dg_can_deliver(self) ||
        (DG(self)->pending != NULL && PyList_GET_SIZE(DG(self)->pending) > 0))
        return 0;
    char *area = tl_recv_dgram_area(&self->loop->recv);
    if (area == NULL)
        return -1;
    /* A UDP datagram fits in 64 KiB; a Unix one may be larger (up to the
     * socket buffer), so those are received one at a time into all of it. */
    int vlen = self->family == AF_UNIX ? 1 : TL_DGRAM_BATCH;
    size_t slot = self->family == AF_UNIX ? DGRAM_MAX_SIZE : TL_DGRAM_SLOT_SIZE;
    struct mmsghdr msgs[TL_DGRAM_BATCH];
    struct iovec iov[TL_DGRAM_BATCH];
    struct sockaddr_storage addrs[TL_DGRAM_BATCH];
    for (int i = 0; i < vlen; i++) {
        iov[i].iov_base = area + (size_t)i * slot;
        iov[i].iov_len = slot;
        memset(&msgs[i].msg_hdr, 0, sizeof(msgs[i].msg_hdr));
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &addrs[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(addrs[i]);
    }
    int n;
    do {
        n = recvmmsg(self->fd, msgs, (unsigned int)vlen, 0, NULL);
    } while (tl_retry_eintr(n));
    if (n < 0) {
        if (PyErr_Occurred())
            return -1;          /* a signal handler raised */
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        PyErr_SetFromErrno(PyExc_OSError);
        return error_received(self);
    }
    PyObject *batch[TL_DGRAM_BATCH][2];
    for (int i = 0; i < n; i++) {
        batch[i][0] = PyBytes_FromStringAndSize(iov[i].iov_base,
                                                (Py_ssize_t)msgs[i].msg_len);
        batch[i][1] = batch[i][0] == NULL ? NULL
                      : source_address(self, &addrs[i], msgs[i].msg_hdr.msg_namelen);
        if (batch[i][1] == NULL) {
            for (int j = 0; j <= i; j++) {
                Py_XDECREF(batch[j][0]);
                Py_XDECREF(batch[j][1]);
            }
            return -1;
        }
    }
    int rc = 0, i = 0;
    for (; i < n && rc == 0; i++) {
        if (!dg_can_deliver(self)) {
            if (self->conn_lost || self->fd < 0)
                break;   /* closed: the rest is dropped */
            /* paused: keep the rest for resume_reading() */
            if (DG(self)->pending == NULL && (DG(self)->pending = PyList_New(0)) == NULL) {
                rc = -1;
                break;
            }
            for (; i < n && rc == 0; i++) {
                PyObject *t = PyTuple_Pack(2, batch[i][0], batch[i][1]);
                if (t == NULL || PyList_Append(DG(self)->pending, t) < 0)
                    rc = -1;
                Py_XDECREF(t);
                Py_DECREF(batch[i][0]);
                Py_DECREF(batch[i][1]);
            }
            break;
        }
        rc = deliver(self, batch[i][0], batch[i][1]);
        Py_DECREF(batch[i][0]);
        Py_DECREF(batch[i][1]);
    }
    for (; i < n; i++) {
        Py_DECREF(batch[i][0]);
        Py_DECREF(batch[i][1]);
    }
    return rc;
}

/* resume_reading(): what a batch left over is delivered first, soon. */
static PyObject *
dg_resume_reading(TransportObject *self, PyObject *Py_UNUSED(ignored))
{
    int was_paused = self->paused && !self->head.closing;
    PyObject *r = tl_tr_resume_reading(self, NULL);
    if (r == NULL || !was_paused || DG(self)->pending == NULL ||
        PyList_GET_SIZE(DG(self)->pending) == 0)
        return r;
    Py_DECREF(r);
    if (tl_ready_push_io(&self->loop->ready, &self->reader) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- construction ---- */

static int
dg_traverse(TransportObject *self, visitproc visit, void *arg)
{
    Py_VISIT(DG(self)->address);
    Py_VISIT(DG(self)->pending);
    Py_VISIT(DG(self)->last_from);
    return 0;
}

static void
dg_clear(TransportObject *self)
{
    Py_CLEAR(DG(self)->address);
    Py_CLEAR(DG(self)->pending);
    Py_CLEAR(DG(self)->last_from);
}

static const tl_transport_ops dgram_ops = {
    .read_ready = dg_read_ready,
    .write_ready = dg_write_ready,
    .close_after_error = tl_tr_force_close,
    .is_socket = 1,
    .traverse = dg_traverse,
    .clear = dg_clear,
};

/* Loop._make_datagram_transport(sock, protocol, address=None, waiter=None,
 * extra=None) */
static PyObject *
loop_make_datagram_transport(LoopObject *loop, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sock", "protocol", "address", "waiter", "extra",
                             NULL};
    PyObject *sock, *protocol, *address = Py_None, *waiter = Py_None,
             *extra = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OOO:_make_datagram_transport",
                                     kwlist, &sock, &protocol, &address, &waiter,
                                     &extra))
        return NULL;
    int fd, family, type, proto;
    if (tl_sock_info(loop->state, sock, &fd, &family, &type, &proto) < 0)
        return NULL;
    TransportObject *tr = tl_tr_create(
        loop, loop->state->DatagramTransportType, &dgram_ops, fd, sock, family,
        type, proto, protocol, waiter, extra, NULL, NULL, 0, NULL);
    if (tr == NULL)
        return NULL;
    int truth = PyObject_IsTrue(address);
    if (truth < 0) {
        Py_DECREF(tr);
        return NULL;
    }
    if (truth)
        DG(tr)->address = Py_NewRef(address);
    return (PyObject *)tr;
}

const PyMethodDef tl_dgram_loop_methods[] = {
    {"_make_datagram_transport",
     (PyCFunction)(void (*)(void))loop_make_datagram_transport,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL}
};

/* ---- attributes ---- */

static PyObject *
dg_get_address(TransportObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(DG(self)->address ? DG(self)->address : Py_None);
}

static PyObject *
dg_get_max_size(TransportObject *Py_UNUSED(self), void *Py_UNUSED(c))
{
    return PyLong_FromLong(DGRAM_MAX_SIZE);
}

static PyGetSetDef dg_getset[] = {
    {"_sock", (getter)tl_tr_get_sock_attr, NULL, NULL, NULL},
    {"_address", (getter)dg_get_address, NULL, NULL, NULL},
    {"max_size", (getter)dg_get_max_size, NULL, NULL, NULL},
    TL_TR_SOCKET_GETSET,
    TL_TR_BASE_GETSET,
    {NULL}
};

static PyMethodDef dg_methods[] = {
    {"sendto", (PyCFunction)(void (*)(void))dg_sendto,
     METH_FASTCALL | METH_KEYWORDS, "Send a datagram; never blocks."},
    {"resume_reading", (PyCFunction)dg_resume_reading, METH_NOARGS, NULL},
    TL_TR_SOCKET_METHODS,
    TL_TR_READ_METHODS,
    TL_TR_WRITE_METHODS,
    TL_TR_BASE_METHODS,
    {NULL}
};

static PyType_Slot dg_slots[] = {
    TL_TR_SLOTS(tl_tr_repr, dg_methods, dg_getset,
                "A UDP or Unix datagram socket transport.")
};

PyType_Spec tl_datagram_transport_spec =
    TL_TR_SPEC("tideloop.DatagramTransport", DatagramTransportObject, dg_slots);
