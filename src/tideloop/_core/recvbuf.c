/* The receive areas that a loop's transports share: a spare bytes object
 * for stream and pipe reads (handed over without a copy when a read fills
 * enough of it; a shorter read is copied out, into the last such copy its
 * protocol let go of when it fits) and a plain area for recvmmsg() batches
 * of datagrams.
 *
 * May call: nothing of the core (a leaf). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int
tl_recv_spare(tl_recvbuf *rb, int fd, size_t max, int use_read,
              PyObject **data, int *err)
{
    *data = NULL;
    *err = 0;
    rb->lent = NULL;
    if (rb->spare == NULL) {
        rb->spare = PyBytes_FromStringAndSize(NULL, TL_SPARE_SIZE);
        if (rb->spare == NULL)
            return -1;
    }
    char *buf = PyBytes_AS_STRING(rb->spare);
    ssize_t n;
    do {
        n = use_read ? read(fd, buf, max) : recv(fd, buf, max, 0);
    } while (tl_retry_eintr(n));
    if (n < 0) {
        if (PyErr_Occurred())
            return -1;          /* a signal handler raised */
        *err = errno;
    }
    if (n <= 0)
        return 0;
    if (n >= TL_HANDOVER_MIN && Py_REFCNT(rb->spare) == 1) {
        /* Hand the object over, shrunk in place; a new one comes next. */
        PyObject *d = rb->spare;
        rb->spare = NULL;
        if (tl_bytes_resize(&d, n) < 0)
            return -1;
        *data = d;
        return 0;
    }
    PyObject *d = rb->kept;
    if (TL_KEEP_READS && d != NULL && n <= rb->kept_size &&
        n >= rb->kept_size - rb->kept_size / 4) {
        /* Refilled as a new object would be made (its hash not computed). */
        rb->kept = NULL;
        Py_SET_SIZE(d, n);
        memcpy(PyBytes_AS_STRING(d), buf, (size_t)n);
        PyBytes_AS_STRING(d)[n] = '\0';
        _Py_COMP_DIAG_PUSH
        _Py_COMP_DIAG_IGNORE_DEPR_DECLS
        ((PyBytesObject *)d)->ob_shash = -1;
        _Py_COMP_DIAG_POP
        rb->lent_size = rb->kept_size;
    }
    else {
        d = PyBytes_FromStringAndSize(buf, n);
        if (d == NULL)
            return -1;
        rb->lent_size = n;
    }
    rb->lent = d;
    *data = d;
    return 0;
}

void
tl_recv_give_back(tl_recvbuf *rb, PyObject *data)
{
    if (TL_KEEP_READS && data == rb->lent && Py_REFCNT(data) == 1 &&
        rb->lent_size >= TL_KEEP_MIN) {
        rb->lent = NULL;
        if (rb->kept == NULL || rb->kept_size < rb->lent_size) {
            /* the larger of the two stays: it fits more reads */
            Py_XSETREF(rb->kept, data);
            rb->kept_size = rb->lent_size;
            return;
        }
    }
    Py_DECREF(data);
}

char *
tl_recv_dgram_area(tl_recvbuf *rb)
{
    if (rb->dgram == NULL) {
        rb->dgram = PyMem_Malloc(TL_DGRAM_AREA_SIZE);
        if (rb->dgram == NULL)
            PyErr_NoMemory();
    }
    return rb->dgram;
}

char *
tl_recv_tls_area(tl_recvbuf *rb)
{
    if (rb->tls == NULL) {
        rb->tls = PyMem_Malloc(TL_TLS_AREA_SIZE);
        if (rb->tls == NULL)
            PyErr_NoMemory();
    }
    return rb->tls;
}

void
tl_recvbuf_clear(tl_recvbuf *rb)
{
    Py_CLEAR(rb->spare);
    Py_CLEAR(rb->kept);
    rb->lent = NULL;
    PyMem_Free(rb->dgram);
    rb->dgram = NULL;
    PyMem_Free(rb->tls);
    rb->tls = NULL;
}
