/* The accept path of servers: a Listener accepts connections on a
 * listening socket and makes a stream transport for each, as asyncio's
 * _accept_connection does (up to backlog per readiness event, a pause after
 * running out of file descriptors, the same log messages).
 *
 * May call: stream.c, transport.c, loop.c, fdtable.c, sockaddr.c. */
#define _GNU_SOURCE
#include "transport.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    LoopObject *loop;
    PyObject *sock;             /* the listening socket.socket */
    int fd;
    int family, type, proto;
    PyObject *protocol_factory;
    PyObject *server;
    PyObject *context;          /* 3.15+: the Server's context; each
                                   connection runs in a copy of it */
    tl_io_watcher accept;       /* listener_accept_ready, in C */
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
    if (tl_fd_watch(self->loop, self->fd, TL_POLL_READ, &self->accept, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
listener_out_of_resources(ListenerObject *self)
{
    tl_state *st = self->loop->state;
    PyErr_SetFromErrno(PyExc_OSError);
    PyObject *exc = tl_err_get_raised();
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
    if (tl_fd_remove(self->loop, self->fd, TL_POLL_READ, NULL) < 0)
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
    /* 3.15+: as asyncio's accept task, the protocol is made in the
     * connection's own copy of the server's context, and the transport runs
     * every protocol callback in that copy. */
    PyObject *conn_context = NULL;
    if (self->context != NULL) {
        conn_context = PyContext_Copy(self->context);
        if (conn_context == NULL || PyContext_Enter(conn_context) < 0) {
            Py_XDECREF(conn_context);
            close(cfd);
            return -1;
        }
    }
    PyObject *protocol = PyObject_CallNoArgs(self->protocol_factory);
    TransportObject *tr = NULL;
    if (protocol != NULL) {
        tr = tl_stream_new(loop, cfd, NULL, self->family, self->type,
                           self->proto, protocol, NULL, NULL, self->server,
                           addr, alen, conn_context);
    }
    if (conn_context != NULL) {
        PyObject *exc = tl_err_get_raised();
        if (PyContext_Exit(conn_context) < 0) {
            /* Cannot happen (entered above, nothing else exits it). */
            Py_XDECREF(exc);
            exc = tl_err_get_raised();
            Py_CLEAR(tr);
        }
        tl_err_set_raised(exc);
        Py_DECREF(conn_context);
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
    PyObject *exc = tl_err_get_raised();
    int rc = 0;
    if (loop->debug)
        rc = tl_loop_report(loop, "Error on transport creation for incoming "
                            "connection", exc, "protocol", protocol, NULL);
    Py_XDECREF(exc);
    Py_XDECREF(protocol);
    return rc;
}

/* Up to backlog connections per readiness event, as asyncio's
 * _accept_connection. */
static int
listener_accept_ready(PyObject *obj)
{
    ListenerObject *self = (ListenerObject *)obj;
    for (int i = 0; i < self->backlog && !self->closed; i++) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof(addr);
        int cfd = accept4(self->fd, (struct sockaddr *)&addr, &alen,
                          SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR ||
                e == ECONNABORTED)
                return 0;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
                return listener_out_of_resources(self);
            /* The loop reports it ('Exception in callback ...'). */
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (listener_new_connection(self, cfd, (struct sockaddr *)&addr, alen) < 0)
            return -1;
    }
    return 0;
}

static PyObject *
listener_accept_ready_meth(ListenerObject *self, PyObject *Py_UNUSED(ignored))
{
    if (listener_accept_ready((PyObject *)self) < 0)
        return NULL;
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
    if (tl_fd_remove(self->loop, self->fd, TL_POLL_READ, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Loop._serve(protocol_factory, sock, server, backlog, context=None)
 * -> Listener */
static PyObject *
loop_serve(LoopObject *loop, PyObject *args)
{
    PyObject *factory, *sock, *server, *context = Py_None;
    int backlog;
    if (!PyArg_ParseTuple(args, "OOOi|O:_serve", &factory, &sock, &server,
                          &backlog, &context))
        return NULL;
    if (tl_check_context_arg(context) < 0)
        return NULL;
    tl_state *st = loop->state;
    ListenerObject *self = PyObject_GC_New(ListenerObject, st->ListenerType);
    if (self == NULL)
        return NULL;
    memset((char *)self + sizeof(PyObject), 0, sizeof(*self) - sizeof(PyObject));
    self->loop = (LoopObject *)Py_NewRef((PyObject *)loop);
    self->sock = Py_NewRef(sock);
    self->protocol_factory = Py_NewRef(factory);
    self->server = Py_NewRef(server);
    self->context = context != Py_None ? Py_NewRef(context) : NULL;
    self->backlog = backlog > 0 ? backlog : 1;
    self->fd = -1;
    self->accept = (tl_io_watcher){.fn = listener_accept_ready,
                                   .name = "_accept_ready",
                                   .owner = (PyObject *)self};
    PyObject_GC_Track(self);
    if (tl_sock_info(st, sock, &self->fd, &self->family, &self->type,
                     &self->proto) < 0)
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
    Py_VISIT(self->context);
    Py_VISIT(self->accept.context);
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
    Py_CLEAR(self->context);
    Py_CLEAR(self->accept.context);
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
    {"_accept_ready", (PyCFunction)listener_accept_ready_meth, METH_NOARGS, NULL},
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
/* Loop._unlink_unix_socket(path, ino) -> None: a stopped Unix server's
 * socket file is removed if it is still the one the server made (the
 * same inode), as asyncio's _stop_serving does; a file already gone is
 * fine, any other OSError is raised.  In C: blocking-call detectors
 * (blockbuster) allow this stat() in asyncio's own method, not in ours. */
static PyObject *
loop_unlink_unix_socket(LoopObject *Py_UNUSED(loop), PyObject *args)
{
    PyObject *path;
    unsigned long long ino;
    if (!PyArg_ParseTuple(args, "O&K:_unlink_unix_socket",
                          PyUnicode_FSConverter, &path, &ino))
        return NULL;
    struct stat stbuf;
    const char *p = PyBytes_AS_STRING(path);
    int rc = stat(p, &stbuf);
    if (rc == 0 && (unsigned long long)stbuf.st_ino == ino)
        rc = unlink(p);
    if (rc < 0 && errno != ENOENT) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    Py_RETURN_NONE;
}

const PyMethodDef tl_listener_loop_methods[] = {
    {"_serve", (PyCFunction)loop_serve, METH_VARARGS,
     "Start accepting on a listening socket; returns the Listener."},
    {"_unlink_unix_socket", (PyCFunction)loop_unlink_unix_socket, METH_VARARGS,
     NULL},
    {NULL}
};
