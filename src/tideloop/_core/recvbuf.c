/* The receive areas that a loop's transports share: a spare bytes object
 * for stream and pipe reads (handed over without a copy when a read fills
 * enough of it) and a plain area for recvmmsg() batches of datagrams.
 *
 * May call: nothing of the core (a leaf). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

int
tl_recv_spare(tl_recvbuf *rb, int fd, size_t max, int use_read,
              PyObject **data, int *err)
{
    *data = NULL;
    *err = 0;
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
    *data = PyBytes_FromStringAndSize(buf, n);
    return *data == NULL ? -1 : 0;
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
    PyMem_Free(rb->dgram);
    rb->dgram = NULL;
    PyMem_Free(rb->tls);
    rb->tls = NULL;
}
