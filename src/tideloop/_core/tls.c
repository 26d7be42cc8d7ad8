/* TLS on stream transports: a C engine under asyncio's SSLProtocol.
 *
 * The interpreter's own sslproto.SSLProtocol stays the TLS state machine:
 * handshake, shutdown, timeouts, errors and flow-control decisions run its
 * code, so TLS behaves as on that interpreter's stock loop.  The engine
 * takes over the two paths every request crosses, in the WRAPPED state
 * only -- bytes arriving from the socket (buffer_updated + _do_read) and
 * the app's transport.write() -- and hands anything else (another state,
 * a paused reader, a BufferedProtocol app, a write backlog, an error) to
 * SSLProtocol's own method for it.  Errors are raised by _ssl itself: when
 * OpenSSL reports a fatal error the SSL object stays in its error state and
 * the same call made through _ssl raises the exception the stock loop sees.
 *
 * Two routes drive the TLS object of a connection:
 *   openssl   - SSL_read_ex/SSL_write_ex/BIO_* on the SSL* and BIO*s inside
 *               _ssl's objects, through the libssl that _ssl loaded; the
 *               layout is proven at import (tideloop/_tls.py, _tls_prove);
 *   sslobject - _ssl's methods (read into the loop's area, write, the
 *               MemoryBIOs' write/read), called from C.
 *
 * May call: stream.c (tl_stream_write_buf), transport.c, recvbuf.c. */
#define _GNU_SOURCE
#include "transport.h"

#include <dlfcn.h>
#include <limits.h>
#include <string.h>

/* OpenSSL's constants (stable since 1.1.1). */
#define TL_SSL_ERROR_WANT_READ 2
#define TL_SSL_ERROR_ZERO_RETURN 6
#define TL_SSL_RECEIVED_SHUTDOWN 2
#define TL_SSL_CTRL_CLEAR_MODE 78
#define TL_SSL_MODE_RELEASE_BUFFERS 0x10L
/* SSLProtocol.max_size: what one SSLObject.read() asks for. */
#define TL_SSLPROTO_MAX_SIZE (256 * 1024)

/* _ssl's object layouts (Modules/_ssl.c, 3.11-3.14): the SSL* follows the
 * Socket weakref in PySSLSocket; the BIO* and SSL_CTX* come first. */
#define TL_SSLSOCKET_SSL_OFFSET (sizeof(PyObject) + sizeof(PyObject *))
#define TL_MEMBIO_BIO_OFFSET (sizeof(PyObject))
#define TL_MEMBIO_EOF_OFFSET (sizeof(PyObject) + sizeof(void *))
#define TL_SSLCTX_CTX_OFFSET (sizeof(PyObject))

static inline void *
field_ptr(PyObject *obj, size_t offset)
{
    void *p;
    memcpy(&p, (char *)obj + offset, sizeof(p));
    return p;
}

typedef struct {
    tl_cproto head;
    tl_state *st;
    LoopObject *loop;
    int route;                  /* TL_TLS_SSLOBJECT or TL_TLS_OPENSSL */
    PyObject *proto;            /* the SSLProtocol */
    PyObject *pdict;            /* its __dict__ */
    PyObject *sslobj;           /* its _sslobj._sslobj: _ssl._SSLSocket */
    PyObject *incoming, *outgoing;      /* _ssl.MemoryBIO */
    PyObject *app_transport;    /* its _SSLProtocolTransport, or NULL */
    PyObject *adict;            /* and that one's __dict__ */
    void *ssl, *rbio, *wbio;    /* openssl route */
    int busy;                   /* entries (feed, app_write, do_read) running */
    int detach_pending;         /* connection_lost came while busy */
    PyObject *weakreflist;
} TLSEngineObject;

/* ---- SSLProtocol's attributes, read from its __dict__ ---- */

/* Borrowed; NULL with no error when missing. */
static inline PyObject *
pget(TLSEngineObject *self, PyObject *name)
{
    return PyDict_GetItemWithError(self->pdict, name);
}

/* *out = bool(attribute); a missing one is false. */
static int
ptrue(TLSEngineObject *self, PyObject *name, int *out)
{
    PyObject *v = pget(self, name);
    if (v == NULL) {
        *out = 0;
        return PyErr_Occurred() ? -1 : 0;
    }
    if (v == Py_True || v == Py_False) {
        *out = v == Py_True;
        return 0;
    }
    Py_INCREF(v);
    *out = PyObject_IsTrue(v);
    Py_DECREF(v);
    return *out < 0 ? -1 : 0;
}

/* *out = the attribute as a C size; 0 when it is not an exact int (the
 * caller then leaves the decision to SSLProtocol). */
static int
psize(TLSEngineObject *self, PyObject *name, Py_ssize_t *out)
{
    PyObject *v = pget(self, name);
    if (v == NULL || !PyLong_CheckExact(v))
        return 0;
    *out = PyLong_AsSsize_t(v);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int
pcall0(TLSEngineObject *self, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs(self->proto, name);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* SSLProtocol's `except Exception as ex: self._fatal_error(ex, message)`;
 * a BaseException that is not an Exception propagates. */
static int
fatal_error(TLSEngineObject *self, const char *message)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *exc = tl_err_get_raised();
    PyObject *msg = PyUnicode_FromString(message);
    if (msg == NULL) {
        Py_DECREF(exc);
        return -1;
    }
    PyObject *args[3] = {self->proto, exc, msg};
    PyObject *r = PyObject_VectorcallMethod(
        self->st->str_fatal_error, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(msg);
    Py_DECREF(exc);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* ---- the TLS object, by route ---- */

static int
incoming_eof_written(TLSEngineObject *self)
{
    int eof;
    memcpy(&eof, (char *)self->incoming + TL_MEMBIO_EOF_OFFSET, sizeof(eof));
    return eof;
}

/* self._incoming.write(buf[:n]) */
static int
bio_in(TLSEngineObject *self, const char *buf, Py_ssize_t n)
{
    if (self->route == TL_TLS_OPENSSL && n <= INT_MAX && !incoming_eof_written(self)) {
        if (self->st->ossl.BIO_write(self->rbio, buf, (int)n) == (int)n)
            return 0;
        PyErr_NoMemory();
        return -1;
    }
    PyObject *view = PyMemoryView_FromMemory((char *)buf, n, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodOneArg(self->incoming, self->st->str_write, view);
    Py_DECREF(view);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* self._outgoing.pending / self._incoming.pending; -1 on error. */
static Py_ssize_t
bio_pending(TLSEngineObject *self, int outgoing)
{
    if (self->route == TL_TLS_OPENSSL)
        return (Py_ssize_t)self->st->ossl.BIO_ctrl_pending(outgoing ? self->wbio
                                                                    : self->rbio);
    PyObject *v = PyObject_GetAttr(outgoing ? self->outgoing : self->incoming,
                                   self->st->str_pending);
    if (v == NULL)
        return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return n;
}

/* Is the raised exception one of SSLProtocol's SSLAgainErrors?  Then it
 * is cleared and 1 returned. */
static int
clear_again_error(TLSEngineObject *self)
{
    if (!PyErr_ExceptionMatches(self->st->tls_again_errors))
        return 0;
    PyErr_Clear();
    return 1;
}

/* One self._sslobj.read(len, buffer) into area[:len], through _ssl:
 * *got = bytes read (0: close_notify), or *again = 1. */
static int
sslobj_read_into(TLSEngineObject *self, char *area, Py_ssize_t len,
                 Py_ssize_t *got, int *again)
{
    *got = 0;
    *again = 0;
    PyObject *view = PyMemoryView_FromMemory(area, len, PyBUF_WRITE);
    if (view == NULL)
        return -1;
    PyObject *n = PyLong_FromSsize_t(len);
    if (n == NULL) {
        Py_DECREF(view);
        return -1;
    }
    PyObject *args[3] = {self->sslobj, n, view};
    PyObject *r = PyObject_VectorcallMethod(
        self->st->str_read, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(n);
    Py_DECREF(view);
    if (r == NULL) {
        *again = clear_again_error(self);
        return *again ? 0 : -1;
    }
    *got = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    return *got < 0 && PyErr_Occurred() ? -1 : 0;
}

/* One read of up to len bytes of plaintext into area. *got > 0: data;
 * *got == 0: close_notify (SSLObject.read() returned b''); *again: no more
 * for now.  Other errors are raised as _ssl raises them. */
static int
tls_read(TLSEngineObject *self, char *area, Py_ssize_t len, Py_ssize_t *got,
         int *again)
{
    if (self->route != TL_TLS_OPENSSL)
        return sslobj_read_into(self, area, len, got, again);
    const tl_ossl *o = &self->st->ossl;
    size_t n = 0;
    *got = 0;
    *again = 0;
    /* Nothing buffered in OpenSSL and no ciphertext left: the read would
     * only say "want read" (a record needs bytes; _ssl sets no read-ahead). */
    if (!o->SSL_has_pending(self->ssl) && o->BIO_ctrl_pending(self->rbio) == 0) {
        *again = 1;
        return 0;
    }
    if (o->SSL_read_ex(self->ssl, area, (size_t)len, &n)) {
        *got = (Py_ssize_t)n;
        return 0;
    }
    int e = o->SSL_get_error(self->ssl, 0);
    if (e == TL_SSL_ERROR_WANT_READ) {
        *again = 1;
        return 0;
    }
    if (e == TL_SSL_ERROR_ZERO_RETURN &&
        o->SSL_get_shutdown(self->ssl) == TL_SSL_RECEIVED_SHUTDOWN)
        return 0;
    /* Anything else: the same read through _ssl, which finds the error
     * state (and OpenSSL's error queue, left as it was) and raises. */
    return sslobj_read_into(self, area, len, got, again);
}

/* Plaintext of one write, all of it; or *fallback = 1 when SSLProtocol
 * must take the write (nothing was written). */
static int
tls_write(TLSEngineObject *self, PyObject *data, int *fallback)
{
    *fallback = 0;
    if (self->route == TL_TLS_OPENSSL) {
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();      /* SSLProtocol raises it in its own place */
            *fallback = 1;
            return 0;
        }
        const tl_ossl *o = &self->st->ossl;
        size_t w = 0;
        int ok = view.len > 0 &&
                 o->SSL_write_ex(self->ssl, view.buf, (size_t)view.len, &w) &&
                 w == (size_t)view.len;
        PyBuffer_Release(&view);
        /* Not written (want-read, error): SSLProtocol retries the same
         * write, which also raises an error as the stock loop sees it. */
        *fallback = !ok;
        return 0;
    }
    /* _ssl's write() writes all or raises (it enables no partial writes). */
    PyObject *r = PyObject_CallMethodOneArg(self->sslobj, self->st->str_write, data);
    if (r == NULL) {
        if (!clear_again_error(self))
            return -1;
        *fallback = 1;
        return 0;
    }
    Py_DECREF(r);
    return 0;
}

/* ---- SSLProtocol's paths, in C ---- */

/* SSLProtocol's _control_app_writing / _control_ssl_reading: the
 * thresholds are checked here, a change is made by SSLProtocol's method.
 * size: the buffered bytes; extra: an attribute added to them (or NULL). */
static int
control_flow(TLSEngineObject *self, Py_ssize_t size, PyObject *extra,
             PyObject *high_name, PyObject *low_name, PyObject *paused_name,
             PyObject *method)
{
    Py_ssize_t add = 0, high, low;
    int paused;
    if (size < 0)
        return -1;
    if ((extra != NULL && !psize(self, extra, &add)) || !psize(self, high_name, &high) ||
        !psize(self, low_name, &low))
        return pcall0(self, method);
    if (ptrue(self, paused_name, &paused) < 0)
        return -1;
    size += add;
    if ((size >= high && !paused) || (size <= low && paused))
        return pcall0(self, method);
    return 0;
}

static int
control_app_writing(TLSEngineObject *self)
{
    tl_state *st = self->st;
    return control_flow(self, bio_pending(self, 1), st->str_write_buffer_size,
                        st->str_outgoing_high_water, st->str_outgoing_low_water,
                        st->str_app_writing_paused, st->str_control_app_writing);
}

/* _process_outgoing: what OpenSSL wrote goes to the lower transport. */
static int
process_outgoing(TLSEngineObject *self)
{
    tl_state *st = self->st;
    int paused;
    if (ptrue(self, st->str_ssl_writing_paused, &paused) < 0)
        return -1;
    if (!paused) {
        PyObject *transport = pget(self, st->str_t_transport);
        if (transport == NULL && PyErr_Occurred())
            return -1;
        Py_XINCREF(transport);
        int rc = 0;
        if (self->route == TL_TLS_OPENSSL && transport != NULL &&
            Py_IS_TYPE(transport, st->SocketTransportType)) {
            char *area = tl_recv_tls_area(&self->loop->recv);
            size_t pending;
            if (area == NULL)
                rc = -1;
            while (rc == 0 && (pending = st->ossl.BIO_ctrl_pending(self->wbio)) > 0) {
                int want = pending < TL_TLS_AREA_SIZE ? (int)pending : TL_TLS_AREA_SIZE;
                int n = st->ossl.BIO_read(self->wbio, area, want);
                if (n <= 0)
                    break;
                rc = tl_stream_write_buf((TransportObject *)transport, area, n);
            }
        }
        else {
            /* data = self._outgoing.read(); if len(data): transport.write(data) */
            PyObject *data = PyObject_CallMethodNoArgs(self->outgoing, st->str_read);
            if (data == NULL)
                rc = -1;
            else {
                if (PyBytes_GET_SIZE(data) > 0) {
                    PyObject *r = PyObject_CallMethodOneArg(
                        transport != NULL ? transport : Py_None, st->str_write, data);
                    rc = r == NULL ? -1 : 0;
                    Py_XDECREF(r);
                }
                Py_DECREF(data);
            }
        }
        Py_XDECREF(transport);
        if (rc < 0)
            return -1;
    }
    return control_app_writing(self);
}

static int
control_ssl_reading(TLSEngineObject *self)
{
    tl_state *st = self->st;
    return control_flow(self, bio_pending(self, 0), NULL,
                        st->str_incoming_high_water, st->str_incoming_low_water,
                        st->str_ssl_reading_paused, st->str_control_ssl_reading);
}

/* *out = bool(self._write_backlog) */
static int
has_backlog(TLSEngineObject *self, int *out)
{
    return ptrue(self, self->st->str_write_backlog, out);
}

/* Append area[:n] to *chunks as bytes. */
static int
push_chunk(PyObject **chunks, const char *area, Py_ssize_t n)
{
    if (*chunks == NULL && (*chunks = PyList_New(0)) == NULL)
        return -1;
    PyObject *b = PyBytes_FromStringAndSize(area, n);
    if (b == NULL)
        return -1;
    int rc = PyList_Append(*chunks, b);
    Py_DECREF(b);
    return rc;
}

/* _do_read__copied: all the plaintext there is, to data_received() in
 * one call; then close_notify handling, as SSLProtocol orders them. */
static int
read_copied(TLSEngineObject *self)
{
    tl_state *st = self->st;
    char *area = tl_recv_tls_area(&self->loop->recv);
    if (area == NULL)
        return -1;
    Py_ssize_t off = 0, got = 0;
    PyObject *chunks = NULL, *data = NULL;
    int again = 0, close_notify = 0, rc = -1;
    for (;;) {
        if (off == TL_TLS_AREA_SIZE) {
            if (push_chunk(&chunks, area, off) < 0)
                goto done;
            off = 0;
        }
        if (tls_read(self, area + off, TL_TLS_AREA_SIZE - off, &got, &again) < 0)
            goto done;      /* raised before any delivery, as in SSLProtocol */
        if (again)
            break;
        if (got == 0) {
            close_notify = 1;
            break;
        }
        off += got;
    }
    if (chunks != NULL) {
        if (off > 0 && push_chunk(&chunks, area, off) < 0)
            goto done;
        Py_ssize_t total = 0, n = PyList_GET_SIZE(chunks);
        for (Py_ssize_t i = 0; i < n; i++)
            total += PyBytes_GET_SIZE(PyList_GET_ITEM(chunks, i));
        if ((data = PyBytes_FromStringAndSize(NULL, total)) == NULL)
            goto done;
        char *p = PyBytes_AS_STRING(data);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *c = PyList_GET_ITEM(chunks, i);
            memcpy(p, PyBytes_AS_STRING(c), PyBytes_GET_SIZE(c));
            p += PyBytes_GET_SIZE(c);
        }
    }
    else if (off > 0 && (data = PyBytes_FromStringAndSize(area, off)) == NULL)
        goto done;
    if (data != NULL) {
        PyObject *app = pget(self, st->str_app_protocol);
        if (app == NULL && PyErr_Occurred())
            goto done;
        app = app != NULL ? app : Py_None;
        PyObject *args[2] = {app, data};
        Py_INCREF(app);
        PyObject *r = PyObject_VectorcallMethod(
            st->str_data_received, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(app);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if (close_notify && (pcall0(self, st->str_call_eof_received) < 0 ||
                         pcall0(self, st->str_start_shutdown) < 0))
        goto done;
    rc = 0;
done:
    Py_XDECREF(chunks);
    Py_XDECREF(data);
    return rc;
}

/* _do_read__buffered: plaintext straight into the app's buffer.  Each
 * further read goes into the rest of the same buffer (asyncio reads into
 * buf[offset:], a copy when buf is a bytearray, and loses that data). */
static int
read_buffered(TLSEngineObject *self)
{
    tl_state *st = self->st;
    Py_ssize_t pending = bio_pending(self, 0);
    if (pending < 0)
        return -1;
    PyObject *get_buffer = pget(self, st->str_app_protocol_get_buffer);
    if (get_buffer == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_AttributeError, st->str_app_protocol_get_buffer);
        return -1;
    }
    PyObject *n = PyLong_FromSsize_t(pending);
    if (n == NULL)
        return -1;
    Py_INCREF(get_buffer);
    PyObject *buf = PyObject_CallOneArg(get_buffer, n);
    Py_DECREF(get_buffer);
    Py_DECREF(n);
    if (buf == NULL)
        return -1;
    Py_ssize_t offset = 0, count = 1, wants = PyObject_Size(buf);
    int rc = -1, again = 0;
    Py_buffer view;
    if (wants < 0 || PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0)
        goto done;
    if (wants > view.len)
        wants = view.len;
    if (wants == 0)
        count = 0;          /* _ssl's read(0, buf) returns 0: "close_notify" */
    else if (tls_read(self, view.buf, wants, &count, &again) < 0)
        goto release;
    if (again)
        count = 1;
    else if (count > 0) {
        offset = count;
        while (offset < wants) {
            if (tls_read(self, (char *)view.buf + offset, wants - offset, &count,
                         &again) < 0)
                goto release;
            if (again) {
                count = 1;
                break;
            }
            if (count <= 0)
                break;
            offset += count;
        }
        if (!again && offset >= wants) {
            /* The buffer filled up: more may be waiting. */
            PyObject *again_cb = PyObject_GetAttr(self->proto, st->str_do_read);
            if (again_cb == NULL)
                goto release;
            PyObject *r = PyObject_CallMethodOneArg((PyObject *)self->loop,
                                                    st->str_call_soon, again_cb);
            Py_DECREF(again_cb);
            if (r == NULL)
                goto release;
            Py_DECREF(r);
        }
    }
    PyBuffer_Release(&view);
    if (offset > 0) {
        PyObject *updated = pget(self, st->str_app_protocol_buffer_updated);
        if (updated == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_AttributeError,
                                st->str_app_protocol_buffer_updated);
            goto done;
        }
        Py_INCREF(updated);
        PyObject *nb = PyLong_FromSsize_t(offset);
        PyObject *r = nb ? PyObject_CallOneArg(updated, nb) : NULL;
        Py_XDECREF(nb);
        Py_DECREF(updated);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if (count == 0 && (pcall0(self, st->str_call_eof_received) < 0 ||
                       pcall0(self, st->str_start_shutdown) < 0))
        goto done;
    rc = 0;
    goto done;
release:
    PyBuffer_Release(&view);
done:
    Py_DECREF(buf);
    return rc;
}

/* SSLProtocol._do_read (the WRAPPED or FLUSHING state checked by the
 * caller), all of it in C.  adopt() installs it as the protocol's own
 * _do_read, so SSLProtocol's other paths (_do_flush, the end of the
 * handshake, resume_reading, a full app buffer's call_soon) come here too. */
static int
do_read(TLSEngineObject *self)
{
    tl_state *st = self->st;
    int paused, is_buffer;
    /* try: */
    if (ptrue(self, st->str_app_reading_paused, &paused) < 0)
        goto except;
    if (!paused) {
        if (ptrue(self, st->str_app_protocol_is_buffer, &is_buffer) < 0)
            goto except;
        if ((is_buffer ? read_buffered(self) : read_copied(self)) < 0)
            goto except;
        int backlog;
        if (has_backlog(self, &backlog) < 0 ||
            (backlog ? pcall0(self, st->str_do_write) : process_outgoing(self)) < 0)
            goto except;
    }
    if (control_ssl_reading(self) < 0)
        goto except;
    return 0;
except:
    return fatal_error(self, "Fatal error on SSL protocol");
}

static void engine_leave(TLSEngineObject *self);

/* protocol._do_read() */
static PyObject *
engine_do_read_impl(TLSEngineObject *self)
{
    if (self->proto == NULL)
        Py_RETURN_NONE;
    PyObject *state = pget(self, self->st->str_t_state);
    if (state == NULL && PyErr_Occurred())
        return NULL;
    if (state != self->st->tls_wrapped && state != self->st->tls_flushing)
        Py_RETURN_NONE;
    if (self->route == TL_TLS_OPENSSL)
        self->st->ossl.ERR_clear_error();      /* see engine_feed */
    if (do_read(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
engine_do_read_meth(TLSEngineObject *self, PyObject *Py_UNUSED(ignored))
{
    self->busy++;
    PyObject *r = engine_do_read_impl(self);
    engine_leave(self);
    return r;
}

/* SSLProtocol.buffer_updated(n), the bytes already in buf. */
static int
engine_feed_impl(TLSEngineObject *self, const char *buf, Py_ssize_t n)
{
    tl_state *st = self->st;
    if (self->proto == NULL)
        return 0;       /* detached: the connection is gone */
    /* SSL_get_error() needs an empty error queue before the calls it
     * judges; our calls leave it empty unless they fail (then _ssl takes
     * over), so once per entry is enough. */
    if (self->route == TL_TLS_OPENSSL)
        st->ossl.ERR_clear_error();
    if (bio_in(self, buf, n) < 0)
        return -1;
    PyObject *state = pget(self, st->str_t_state);
    if (state == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (state == st->tls_wrapped)
        return do_read(self);
    if (state == st->tls_do_handshake)
        return pcall0(self, st->str_do_handshake);
    if (state == st->tls_flushing)
        return pcall0(self, st->str_do_flush);
    if (state == st->tls_shutdown)
        return pcall0(self, st->str_do_shutdown);
    return 0;
}

static int
engine_feed(tl_cproto *cp, const char *buf, Py_ssize_t n)
{
    TLSEngineObject *self = (TLSEngineObject *)cp;
    self->busy++;
    int rc = engine_feed_impl(self, buf, n);
    engine_leave(self);
    return rc;
}

/* ---- the app transport's write() ---- */

static PyObject *
write_appdata(TLSEngineObject *self, PyObject *data)
{
    PyObject *tuple = PyTuple_Pack(1, data);
    if (tuple == NULL)
        return NULL;
    PyObject *r = PyObject_CallMethodOneArg(self->proto, self->st->str_write_appdata,
                                            tuple);
    Py_DECREF(tuple);
    return r;
}

/* _SSLProtocolTransport.write(data), installed on the app transport. */
static PyObject *
engine_app_write_impl(TLSEngineObject *self, PyObject *data)
{
    tl_state *st = self->st;
    if (self->proto == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the TLS connection is gone");
        return NULL;
    }
    if (!PyBytes_Check(data) && !PyByteArray_Check(data) && !PyMemoryView_Check(data)) {
        PyObject *name = PyType_GetName(Py_TYPE(data));   /* type(data).__name__ */
        if (name != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "data: expecting a bytes-like instance, got %U", name);
            Py_DECREF(name);
        }
        return NULL;
    }
    /* After a second close(), _SSLProtocolTransport.write() fails on its
     * _ssl_protocol = None: the stock method says how. */
    if (self->adict != NULL &&
        PyDict_GetItemWithError(self->adict, st->str_ssl_protocol) != self->proto) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_CallFunctionObjArgs(st->tls_app_write_stock,
                                            self->app_transport, data, NULL);
    }
    int nonempty = PyObject_IsTrue(data);
    if (nonempty <= 0)
        return nonempty < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *state = pget(self, st->str_t_state);
    if (state == NULL && PyErr_Occurred())
        return NULL;
    int backlog;
    if (has_backlog(self, &backlog) < 0)
        return NULL;
    if (state != st->tls_wrapped || backlog)
        return write_appdata(self, data);
    int fallback;
    if (self->route == TL_TLS_OPENSSL)
        st->ossl.ERR_clear_error();      /* see engine_feed */
    if (tls_write(self, data, &fallback) < 0)
        goto except;
    if (fallback)
        return write_appdata(self, data);
    if (process_outgoing(self) < 0)
        goto except;
    Py_RETURN_NONE;
except:
    if (fatal_error(self, "Fatal error on SSL protocol") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
engine_app_write(TLSEngineObject *self, PyObject *data)
{
    self->busy++;
    PyObject *r = engine_app_write_impl(self, data);
    engine_leave(self);
    return r;
}

static void engine_clear_refs(TLSEngineObject *self);

/* The connection is gone: out of the protocol's and the app transport's
 * __dict__, and every reference dropped, so that reference counting alone
 * frees them (asyncio's tests check that no garbage is left). */
static void
engine_detach_now(TLSEngineObject *self)
{
    PyObject *exc = PyErr_Occurred() ? tl_err_get_raised() : NULL;
    if (self->pdict != NULL) {
        if (PyDict_GetItemWithError(self->pdict, self->st->str_tl_engine) == (PyObject *)self)
            (void)PyDict_DelItem(self->pdict, self->st->str_tl_engine);
        PyObject *m = PyDict_GetItemWithError(self->pdict, self->st->str_do_read);
        if (m != NULL && PyCFunction_Check(m) && PyCFunction_GET_SELF(m) == (PyObject *)self)
            (void)PyDict_DelItem(self->pdict, self->st->str_do_read);
    }
    if (self->adict != NULL) {
        PyObject *w = PyDict_GetItemWithError(self->adict, self->st->str_write);
        if (w != NULL && PyCFunction_Check(w) && PyCFunction_GET_SELF(w) == (PyObject *)self)
            (void)PyDict_DelItem(self->adict, self->st->str_write);
    }
    PyErr_Clear();
    engine_clear_refs(self);
    if (exc != NULL)
        tl_err_set_raised(exc);
}

/* (A connection_lost() inside one of the engine's own calls -- a test
 * calling _call_connection_lost() from data_received(), say -- takes effect
 * when that call ends: its references stay valid until then.) */
static void
engine_detach(tl_cproto *cp)
{
    TLSEngineObject *self = (TLSEngineObject *)cp;
    if (self->busy > 0)
        self->detach_pending = 1;
    else
        engine_detach_now(self);
}

static void
engine_leave(TLSEngineObject *self)
{
    if (--self->busy == 0 && self->detach_pending) {
        self->detach_pending = 0;
        engine_detach_now(self);
    }
}

/* ---- the engine type ---- */

static PyObject *
dict_item(PyObject *d, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(d, name);
    if (v == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "SSLProtocol without %R", name);
    return Py_XNewRef(v);
}

/* TLSEngine(ssl_protocol, route): the engine of an SSLProtocol made by
 * this interpreter's asyncio (tideloop._tls.adopt). */
static PyObject *
engine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    tl_state *st = PyType_GetModuleState(type);
    PyObject *proto;
    const char *route;
    if (st == NULL || !PyArg_ParseTuple(args, "Os:TLSEngine", &proto, &route))
        return NULL;
    (void)kwds;
    int r;
    if (strcmp(route, "openssl") == 0)
        r = TL_TLS_OPENSSL;
    else if (strcmp(route, "sslobject") == 0)
        r = TL_TLS_SSLOBJECT;
    else
        return PyErr_Format(PyExc_ValueError, "unknown TLS route %R", PyTuple_GET_ITEM(args, 1));
    if (r == TL_TLS_OPENSSL && !st->ossl_proven)
        return PyErr_Format(PyExc_ValueError,
                            "the openssl TLS route is not available here");
    if (st->tls_again_errors == NULL)
        return PyErr_Format(PyExc_RuntimeError, "tideloop._tls is not set up");
    TLSEngineObject *self = (TLSEngineObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->head.feed = engine_feed;
    self->head.detach = engine_detach;
    self->st = st;
    self->route = r;
    self->proto = Py_NewRef(proto);
    PyObject *wrapper = NULL, *loop = NULL;
    if ((self->pdict = PyObject_GenericGetDict(proto, NULL)) == NULL ||
        !PyDict_Check(self->pdict) ||
        (loop = dict_item(self->pdict, st->str_t_loop)) == NULL ||
        (wrapper = dict_item(self->pdict, st->str_t_sslobj)) == NULL ||
        (self->sslobj = PyObject_GetAttr(wrapper, st->str_t_sslobj)) == NULL ||
        (self->incoming = dict_item(self->pdict, st->str_t_incoming)) == NULL ||
        (self->outgoing = dict_item(self->pdict, st->str_t_outgoing)) == NULL)
        goto error;
    if (!PyObject_TypeCheck(loop, st->LoopType)) {
        PyErr_SetString(PyExc_TypeError, "TLSEngine needs a tideloop loop");
        goto error;
    }
    self->loop = (LoopObject *)Py_NewRef(loop);
    PyObject *at = PyDict_GetItemWithError(self->pdict, st->str_app_transport);
    if (at == NULL && PyErr_Occurred())
        goto error;
    if (at != NULL && at != Py_None) {
        self->app_transport = Py_NewRef(at);
        if ((self->adict = PyObject_GenericGetDict(at, NULL)) == NULL)
            goto error;
    }
    if (!Py_IS_TYPE(self->sslobj, (PyTypeObject *)st->tls_sslsocket_type) ||
        !Py_IS_TYPE(self->incoming, (PyTypeObject *)st->tls_memorybio_type) ||
        !Py_IS_TYPE(self->outgoing, (PyTypeObject *)st->tls_memorybio_type)) {
        PyErr_SetString(PyExc_TypeError, "SSLProtocol without _ssl objects");
        goto error;
    }
    if (r == TL_TLS_OPENSSL) {
        const tl_ossl *o = &st->ossl;
        self->ssl = field_ptr(self->sslobj, TL_SSLSOCKET_SSL_OFFSET);
        self->rbio = field_ptr(self->incoming, TL_MEMBIO_BIO_OFFSET);
        self->wbio = field_ptr(self->outgoing, TL_MEMBIO_BIO_OFFSET);
        /* The same links _tls_prove checked, per connection (cheap). */
        if (self->ssl == NULL || o->SSL_get_rbio(self->ssl) != self->rbio ||
            o->SSL_get_wbio(self->ssl) != self->wbio ||
            o->SSL_get_ex_data(self->ssl, 0) != (void *)self->sslobj) {
            PyErr_SetString(PyExc_RuntimeError,
                            "the openssl TLS route found an unexpected SSL object");
            goto error;
        }
        /* _ssl asks OpenSSL to free its record buffers after each record
         * (SSL_MODE_RELEASE_BUFFERS): a malloc and free of ~17 KiB per
         * record each way.  The engine keeps them (~34 KiB per connection,
         * against the 256 KiB read buffer each stock SSLProtocol keeps). */
        o->SSL_ctrl(self->ssl, TL_SSL_CTRL_CLEAR_MODE, TL_SSL_MODE_RELEASE_BUFFERS, NULL);
    }
    Py_DECREF(loop);
    Py_DECREF(wrapper);
    return (PyObject *)self;
error:
    Py_XDECREF(loop);
    Py_XDECREF(wrapper);
    Py_DECREF(self);
    return NULL;
}

static int
engine_traverse(TLSEngineObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->loop);
    Py_VISIT(self->proto);
    Py_VISIT(self->pdict);
    Py_VISIT(self->sslobj);
    Py_VISIT(self->incoming);
    Py_VISIT(self->outgoing);
    Py_VISIT(self->app_transport);
    Py_VISIT(self->adict);
    return 0;
}

static void
engine_clear_refs(TLSEngineObject *self)
{
    /* The SSL* and BIO*s belong to the objects cleared here. */
    self->ssl = self->rbio = self->wbio = NULL;
    if (self->route == TL_TLS_OPENSSL)
        self->route = TL_TLS_SSLOBJECT;
    Py_CLEAR(self->loop);
    Py_CLEAR(self->proto);
    Py_CLEAR(self->pdict);
    Py_CLEAR(self->sslobj);
    Py_CLEAR(self->incoming);
    Py_CLEAR(self->outgoing);
    Py_CLEAR(self->app_transport);
    Py_CLEAR(self->adict);
}

static int
engine_clear(TLSEngineObject *self)
{
    engine_clear_refs(self);
    return 0;
}

static void
engine_dealloc(TLSEngineObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    engine_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
engine_get_route(TLSEngineObject *self, void *Py_UNUSED(c))
{
    return PyUnicode_FromString(self->route == TL_TLS_OPENSSL ? "openssl"
                                                              : "sslobject");
}

static PyMethodDef engine_methods[] = {
    {"app_write", (PyCFunction)engine_app_write, METH_O,
     "The app transport's write(data)."},
    {"do_read", (PyCFunction)engine_do_read_meth, METH_NOARGS,
     "The protocol's _do_read()."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"route", (getter)engine_get_route, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef engine_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(TLSEngineObject, weakreflist),
     READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_doc, "The C engine under one asyncio SSLProtocol (tideloop._tls)."},
    {Py_tp_new, engine_new},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_traverse, engine_traverse},
    {Py_tp_clear, engine_clear},
    {Py_tp_methods, engine_methods},
    {Py_tp_getset, engine_getset},
    {Py_tp_members, engine_members},
    {0, NULL},
};

PyType_Spec tl_tls_engine_spec = {
    .name = "tideloop._core.TLSEngine",
    .basicsize = sizeof(TLSEngineObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = engine_slots,
};

/* ---- setup, proof and route selection (module functions) ---- */

/* _tls_setup(SSLProtocol, (DO_HANDSHAKE, WRAPPED, FLUSHING, SHUTDOWN),
 *            SSLAgainErrors, _SSLProtocolTransport.write, adopt,
 *            _SSLSocket, MemoryBIO, ssl_module_file|None, OPENSSL_VERSION)
 * -> None when the OpenSSL functions were found in _ssl's libssl, else
 * the reason (str). */
static PyObject *
tls_setup(PyObject *module, PyObject *args)
{
    tl_state *st = PyModule_GetState(module);
    PyObject *proto_cls, *states, *again, *app_write, *adopt, *sock_t, *bio_t, *path;
    const char *version;
    if (!PyArg_ParseTuple(args, "OO!OOOOOOs:_tls_setup", &proto_cls, &PyTuple_Type,
                          &states, &again, &app_write, &adopt, &sock_t, &bio_t,
                          &path, &version))
        return NULL;
    if (PyTuple_GET_SIZE(states) != 4 || !PyType_Check(proto_cls) ||
        !PyType_Check(sock_t) || !PyType_Check(bio_t)) {
        PyErr_SetString(PyExc_TypeError, "_tls_setup: bad arguments");
        return NULL;
    }
    Py_XSETREF(st->SSLProtocol, Py_NewRef(proto_cls));
    Py_XSETREF(st->tls_do_handshake, Py_NewRef(PyTuple_GET_ITEM(states, 0)));
    Py_XSETREF(st->tls_wrapped, Py_NewRef(PyTuple_GET_ITEM(states, 1)));
    Py_XSETREF(st->tls_flushing, Py_NewRef(PyTuple_GET_ITEM(states, 2)));
    Py_XSETREF(st->tls_shutdown, Py_NewRef(PyTuple_GET_ITEM(states, 3)));
    Py_XSETREF(st->tls_again_errors, Py_NewRef(again));
    Py_XSETREF(st->tls_app_write_stock, Py_NewRef(app_write));
    Py_XSETREF(st->tls_sslsocket_type, Py_NewRef(sock_t));
    Py_XSETREF(st->tls_memorybio_type, Py_NewRef(bio_t));
    Py_XSETREF(st->tls_adopt, Py_NewRef(adopt));
    st->ossl_loaded = 0;
    st->ossl_proven = 0;

    /* The libssl that _ssl uses: lookups through _ssl's own handle (its
     * dependencies), or the process's when _ssl is built in. */
    void *h;
    if (path == Py_None)
        h = dlopen(NULL, RTLD_NOW);
    else {
        const char *p = PyUnicode_AsUTF8(path);
        if (p == NULL)
            return NULL;
        h = dlopen(p, RTLD_NOW | RTLD_NOLOAD);
    }
    if (h == NULL)
        return PyUnicode_FromString("_ssl's shared object is not loaded");
    tl_ossl o;
    const char *missing = NULL;
#define SYM(name) \
    if (missing == NULL && (*(void **)(&o.name) = dlsym(h, #name)) == NULL) \
        missing = #name;
    SYM(SSL_read_ex) SYM(SSL_write_ex) SYM(SSL_get_error) SYM(SSL_get_shutdown)
    SYM(SSL_get_rbio) SYM(SSL_get_wbio) SYM(SSL_get_SSL_CTX) SYM(SSL_get_ex_data)
    SYM(SSL_is_server) SYM(SSL_do_handshake) SYM(BIO_write) SYM(BIO_read)
    SYM(BIO_ctrl_pending) SYM(ERR_clear_error) SYM(OpenSSL_version)
    SYM(SSL_has_pending) SYM(SSL_ctrl)
#undef SYM
    dlclose(h);
    if (missing != NULL)
        return PyUnicode_FromFormat("%s not found in _ssl's libssl", missing);
    const char *have = o.OpenSSL_version(0);
    if (have == NULL || strcmp(have, version) != 0)
        return PyUnicode_FromFormat("libssl says %s, ssl.OPENSSL_VERSION %s",
                                    have ? have : "nothing", version);
    st->ossl = o;
    st->ossl_loaded = 1;
    Py_RETURN_NONE;
}

/* _tls_prove(sslsock, incoming, outgoing, context, server_side) -> None
 * when the SSL*, BIO*s and SSL_CTX* read at the known offsets are linked
 * to each other as _ssl links them, else the reason. */
static PyObject *
tls_prove(PyObject *module, PyObject *args)
{
    tl_state *st = PyModule_GetState(module);
    PyObject *sock, *in, *out, *ctx;
    int server_side;
    if (!PyArg_ParseTuple(args, "OOOOp:_tls_prove", &sock, &in, &out, &ctx, &server_side))
        return NULL;
    if (!st->ossl_loaded)
        return PyUnicode_FromString("OpenSSL functions not loaded");
    if (!Py_IS_TYPE(sock, (PyTypeObject *)st->tls_sslsocket_type) ||
        !Py_IS_TYPE(in, (PyTypeObject *)st->tls_memorybio_type) ||
        !Py_IS_TYPE(out, (PyTypeObject *)st->tls_memorybio_type) ||
        strcmp(Py_TYPE(ctx)->tp_base ? Py_TYPE(ctx)->tp_base->tp_name : "", "_ssl._SSLContext") != 0)
        return PyUnicode_FromString("unexpected _ssl types");
    if (Py_TYPE(sock)->tp_basicsize < (Py_ssize_t)(TL_SSLSOCKET_SSL_OFFSET + sizeof(void *)) ||
        Py_TYPE(in)->tp_basicsize < (Py_ssize_t)(TL_MEMBIO_EOF_OFFSET + sizeof(int)) ||
        Py_TYPE(ctx)->tp_base->tp_basicsize < (Py_ssize_t)(TL_SSLCTX_CTX_OFFSET + sizeof(void *)))
        return PyUnicode_FromString("_ssl objects smaller than the known layout");
    const tl_ossl *o = &st->ossl;
    void *ssl = field_ptr(sock, TL_SSLSOCKET_SSL_OFFSET);
    void *rb = field_ptr(in, TL_MEMBIO_BIO_OFFSET);
    void *wb = field_ptr(out, TL_MEMBIO_BIO_OFFSET);
    void *cx = field_ptr(ctx, TL_SSLCTX_CTX_OFFSET);
    if (ssl == NULL || rb == NULL || wb == NULL || cx == NULL)
        return PyUnicode_FromString("a NULL pointer at a known offset");
    if (o->SSL_get_rbio(ssl) != rb || o->SSL_get_wbio(ssl) != wb)
        return PyUnicode_FromString("SSL_get_rbio/wbio differ from the MemoryBIOs");
    if (o->SSL_get_SSL_CTX(ssl) != cx)
        return PyUnicode_FromString("SSL_get_SSL_CTX differs from the context");
    if (o->SSL_get_ex_data(ssl, 0) != (void *)sock)
        return PyUnicode_FromString("SSL app data is not the _SSLSocket");
    if (o->SSL_is_server(ssl) != server_side)
        return PyUnicode_FromString("SSL_is_server differs");
    Py_RETURN_NONE;
}

/* _tls_handshake_step(sslsock, data) -> SSL_get_error() code of one
 * SSL_do_handshake() after data was written into its incoming BIO, all
 * done through the openssl route (the proof's round trip). */
static PyObject *
tls_handshake_step(PyObject *module, PyObject *args)
{
    tl_state *st = PyModule_GetState(module);
    PyObject *sock;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "Oy*:_tls_handshake_step", &sock, &data))
        return NULL;
    if (!st->ossl_loaded || !Py_IS_TYPE(sock, (PyTypeObject *)st->tls_sslsocket_type)) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL functions not loaded");
        return NULL;
    }
    const tl_ossl *o = &st->ossl;
    void *ssl = field_ptr(sock, TL_SSLSOCKET_SSL_OFFSET);
    if (data.len > 0 && o->BIO_write(o->SSL_get_rbio(ssl), data.buf, (int)data.len) != data.len) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    PyBuffer_Release(&data);
    o->ERR_clear_error();
    int ret = o->SSL_do_handshake(ssl);
    return PyLong_FromLong(ret == 1 ? 0 : o->SSL_get_error(ssl, ret));
}

/* _tls_set_proven(bool): the Python side's verdict on the round trips. */
static PyObject *
tls_set_proven(PyObject *module, PyObject *arg)
{
    tl_state *st = PyModule_GetState(module);
    int v = PyObject_IsTrue(arg);
    if (v < 0)
        return NULL;
    if (v && !st->ossl_loaded) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL functions not loaded");
        return NULL;
    }
    st->ossl_proven = v;
    if (!v && st->tls_route == TL_TLS_OPENSSL)
        st->tls_route = TL_TLS_SSLOBJECT;
    Py_RETURN_NONE;
}

static const char *const route_names[] = {"asyncio", "sslobject", "openssl"};

static PyObject *
tls_route(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    tl_state *st = PyModule_GetState(module);
    return PyUnicode_FromString(route_names[st->tls_route]);
}

/* set_tls_route(name) -> the previous name.  "asyncio": asyncio's
 * SSLProtocol alone; "sslobject", "openssl": with the C engine. */
static PyObject *
set_tls_route(PyObject *module, PyObject *name)
{
    tl_state *st = PyModule_GetState(module);
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "route must be str, not %.200s",
                     Py_TYPE(name)->tp_name);
        return NULL;
    }
    int r = -1;
    for (int i = 0; i < 3; i++)
        if (PyUnicode_CompareWithASCIIString(name, route_names[i]) == 0)
            r = i;
    if (r < 0)
        return PyErr_Format(PyExc_ValueError, "unknown TLS route %R "
                            "(asyncio, sslobject, openssl)", name);
    if (r != TL_TLS_ASYNCIO && st->tls_adopt == NULL)
        return PyErr_Format(PyExc_ValueError, "TLS route %R needs the ssl module", name);
    if (r == TL_TLS_OPENSSL && !st->ossl_proven)
        return PyErr_Format(PyExc_ValueError, "TLS route 'openssl' is not "
                            "available on this interpreter (see tideloop._tls)");
    PyObject *prev = PyUnicode_FromString(route_names[st->tls_route]);
    if (prev != NULL)
        st->tls_route = r;
    return prev;
}

const PyMethodDef tl_tls_module_methods[] = {
    {"_tls_setup", tls_setup, METH_VARARGS, NULL},
    {"_tls_prove", tls_prove, METH_VARARGS, NULL},
    {"_tls_handshake_step", tls_handshake_step, METH_VARARGS, NULL},
    {"_tls_set_proven", tls_set_proven, METH_O, NULL},
    {"tls_route", tls_route, METH_NOARGS,
     "The TLS route new connections take: 'openssl', 'sslobject' or 'asyncio'."},
    {"set_tls_route", set_tls_route, METH_O,
     "set_tls_route(name) -> previous: the route for new TLS connections."},
    {NULL, NULL, 0, NULL},
};
