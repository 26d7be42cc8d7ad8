/* Socket addresses as Python objects, the way the socket module shows them,
 * and what the core reads off a socket object.
 *
 * May call: nothing of the core (a leaf). */
#include "internal.h"

#include <limits.h>
#include <netdb.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

PyObject *
tl_sockaddr_to_py(const struct sockaddr *sa, unsigned int len)
{
    if (len == 0)
        Py_RETURN_NONE;
    switch (sa->sa_family) {
    case AF_INET:
    case AF_INET6: {
        char host[NI_MAXHOST];
        int rc = getnameinfo(sa, len, host, sizeof(host), NULL, 0,
                             NI_NUMERICHOST);
        if (rc != 0) {
            PyErr_Format(PyExc_OSError, "getnameinfo failed: %s",
                         gai_strerror(rc));
            return NULL;
        }
        if (sa->sa_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
            return Py_BuildValue("si", host, ntohs(a->sin_port));
        }
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        return Py_BuildValue("siII", host, ntohs(a->sin6_port),
                             ntohl(a->sin6_flowinfo), a->sin6_scope_id);
    }
    case AF_UNIX: {
        const struct sockaddr_un *a = (const struct sockaddr_un *)sa;
        size_t plen = len - offsetof(struct sockaddr_un, sun_path);
        if ((socklen_t)offsetof(struct sockaddr_un, sun_path) >= len)
            return PyUnicode_FromString("");
        if (a->sun_path[0] == '\0')   /* Linux abstract namespace */
            return PyBytes_FromStringAndSize(a->sun_path, (Py_ssize_t)plen);
        plen = strnlen(a->sun_path, plen);
        return PyUnicode_DecodeFSDefaultAndSize(a->sun_path, (Py_ssize_t)plen);
    }
    default:
        return Py_BuildValue("(iy#)", sa->sa_family, sa->sa_data,
                             (Py_ssize_t)sizeof(sa->sa_data));
    }
}

/* An int attribute or method result of obj as a C int. */
static int
as_int(PyObject *v, int *out)
{
    if (v == NULL)
        return -1;
    long l = PyLong_AsLong(v);
    Py_DECREF(v);
    if (l == -1 && PyErr_Occurred())
        return -1;
    if (l < INT_MIN || l > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value out of range for a C int");
        return -1;
    }
    *out = (int)l;
    return 0;
}

int
tl_call_fileno(tl_state *st, PyObject *obj, int *fd)
{
    return as_int(PyObject_CallMethodNoArgs(obj, st->str_fileno), fd);
}

int
tl_sock_info(tl_state *st, PyObject *sock, int *fd, int *family, int *type,
             int *proto)
{
    if ((family != NULL &&
         as_int(PyObject_GetAttr(sock, st->str_family), family) < 0) ||
        (type != NULL && as_int(PyObject_GetAttr(sock, st->str_type), type) < 0) ||
        (proto != NULL &&
         as_int(PyObject_GetAttr(sock, st->str_proto), proto) < 0) ||
        (fd != NULL && tl_call_fileno(st, sock, fd) < 0))
        return -1;
    return 0;
}

/* The error socket.recv_into(buf) raises on this interpreter, word for word
 * (the stock loop calls it; its wording differs between versions): it comes
 * from the argument parsing, asked of a socket object that has no fd (made
 * by __new__ alone), so that nothing could be read even if buf were taken.
 * Any other outcome leaves a message in the older versions' wording. */
static void
set_recv_into_buffer_error(PyObject *buf)
{
    PyObject *mod = PyImport_ImportModule("_socket");
    if (mod == NULL)
        return;
    PyObject *type = PyObject_GetAttrString(mod, "socket");
    Py_DECREF(mod);
    if (type == NULL)
        return;
    PyObject *probe = PyObject_CallMethod(type, "__new__", "O", type);
    Py_DECREF(type);
    if (probe == NULL)
        return;
    PyObject *r = PyObject_CallMethod(probe, "recv_into", "O", buf);
    Py_DECREF(probe);
    if (r == NULL && !PyErr_ExceptionMatches(PyExc_OSError))
        return;                 /* the TypeError (or whatever stopped it) */
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "recv_into() argument 1 must be read-write bytes-like "
                 "object, not %.50s",
                 buf == Py_None ? "None" : Py_TYPE(buf)->tp_name);
}

int
tl_recv_into_buffer(PyObject *buf, Py_buffer *view)
{
    if (PyObject_GetBuffer(buf, view, PyBUF_WRITABLE) == 0)
        return 0;
    /* A refused buffer is worded as socket.recv_into() would; any other
     * error (MemoryError) propagates. */
    if (!PyErr_ExceptionMatches(PyExc_TypeError) &&
        !PyErr_ExceptionMatches(PyExc_BufferError))
        return -1;
    PyErr_Clear();
    set_recv_into_buffer_error(buf);
    return -1;
}
