/* The receive areas that a loop's transports share: a spare bytes object
 * for stream and pipe reads (handed over without a copy when a read fills
 * enough of it; a shorter read is copied out, into the last such copy its
 * protocol let go of when it fits, or read straight into that copy when
 * the reader's last read was of its size) and a plain area for recvmmsg()
 * batches of datagrams.
 *
 * May call: nothing of the core (a leaf). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The kept bytes lent as a new object of n bytes would be (its hash not
 * computed). */
static PyObject *
lend_kept(tl_recvbuf *rb, Py_ssize_t n)
{
    PyObject *d = rb->kept;
    rb->kept = NULL;
    Py_SET_SIZE(d, n);
    PyBytes_AS_STRING(d)[n] = '\0';
    _Py_COMP_DIAG_PUSH
    _Py_COMP_DIAG_IGNORE_DEPR_DECLS
    ((PyBytesObject *)d)->ob_shash = -1;
    _Py_COMP_DIAG_POP
    rb->lent = d;
    rb->lent_size = rb->kept_size;
    return d;
}

/* Whether a read of n bytes is of a size worth keeping: larger than
 * pymalloc's blocks, shorter than those handed over in the spare bytes. */
static int
keepable(Py_ssize_t n)
{
    return n >= TL_KEEP_MIN && n < TL_HANDOVER_MIN;
}

/* Whether a read of n bytes refills the kept bytes: it fits them and
 * leaves at most a quarter unused. */
static int
fits_kept(const tl_recvbuf *rb, Py_ssize_t n)
{
    return TL_KEEP_READS && rb->kept != NULL && n <= rb->kept_size &&
           n >= rb->kept_size - rb->kept_size / 4;
}

/* A new bytes object with a copy of buf[:n]; one that may be kept (the
 * reader gives its reads back) holds a quarter more. */
static PyObject *
copy_out(tl_recvbuf *rb, const char *buf, Py_ssize_t n, int may_keep)
{
    Py_ssize_t room = n;
    if (TL_KEEP_READS && may_keep && keepable(n))
        room = n + n / 4;
    PyObject *d = PyBytes_FromStringAndSize(NULL, room);
    if (d == NULL)
        return NULL;
    memcpy(PyBytes_AS_STRING(d), buf, (size_t)n);
    if (room != n) {
        Py_SET_SIZE(d, n);
        PyBytes_AS_STRING(d)[n] = '\0';
    }
    rb->lent = d;
    rb->lent_size = room;
    return d;
}

int
tl_recv_spare(tl_recvbuf *rb, int fd, size_t max, int use_read, int *small,
              PyObject **data, int *err)
{
    *data = NULL;
    *err = 0;
    rb->lent = NULL;
    /* The last read was small: this one goes straight into the kept bytes. */
    int direct = TL_KEEP_READS && small != NULL && *small && rb->kept != NULL &&
                 (size_t)rb->kept_size <= max;
    char *buf;
    if (direct) {
        buf = PyBytes_AS_STRING(rb->kept);
        max = (size_t)rb->kept_size;
    }
    else {
        if (rb->spare == NULL) {
            rb->spare = PyBytes_FromStringAndSize(NULL, TL_SPARE_SIZE);
            if (rb->spare == NULL)
                return -1;
        }
        buf = PyBytes_AS_STRING(rb->spare);
    }
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
    if (direct) {
        /* Full: bytes may be waiting, and the next read is larger. */
        *small = (size_t)n < max && keepable(n);
        if (fits_kept(rb, n))
            *data = lend_kept(rb, n);
        else
            *data = copy_out(rb, buf, n, 1);
        return *data == NULL ? -1 : 0;
    }
    if (small != NULL)
        *small = keepable(n);
    if (n >= TL_HANDOVER_MIN && Py_REFCNT(rb->spare) == 1) {
        /* Hand the object over, shrunk in place; a new one comes next. */
        PyObject *d = rb->spare;
        rb->spare = NULL;
        if (tl_bytes_resize(&d, n) < 0)
            return -1;
        *data = d;
        return 0;
    }
    if (fits_kept(rb, n)) {
        *data = lend_kept(rb, n);
        memcpy(PyBytes_AS_STRING(*data), buf, (size_t)n);
        return 0;
    }
    *data = copy_out(rb, buf, n, small != NULL);
    return *data == NULL ? -1 : 0;
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
