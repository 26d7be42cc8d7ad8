/* TLS on stream transports: a C engine under asyncio's SSLProtocol.
 *
 * The interpreter's own sslproto.SSLProtocol stays the TLS state machine:
 * handshake, shutdown, timeouts, errors and flow-control decisions run its
 * code, so TLS behaves as on that interpreter's stock loop.  The engine
 * takes over the two paths every request crosses, in the WRAPPED state
 * only -- bytes arriving from the socket (buffer_updated + _do_read) and
 * the app's transport.write() -- and hands anything else (another state,
 * a paused reader, a BufferedProtocol app, a write backlog, an error) to
 * SSLProtocol's own method for it.  Errors are _ssl's: the sslobject route
 * calls _ssl, and the openssl route raises what _ssl's read()/write() would
 * raise for the same failed call (raise_ssl_error, proven at import).
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
#include <errno.h>
#include <limits.h>
#include <string.h>

/* OpenSSL's constants (stable since 3.0; the route needs 3.0+). */
#define TL_SSL_ERROR_SSL 1
#define TL_SSL_ERROR_WANT_READ 2
#define TL_SSL_ERROR_WANT_WRITE 3
#define TL_SSL_ERROR_WANT_X509_LOOKUP 4
#define TL_SSL_ERROR_SYSCALL 5
#define TL_SSL_ERROR_ZERO_RETURN 6
#define TL_SSL_ERROR_WANT_CONNECT 7
#define TL_ERR_LIB_SYS 2
#define TL_ERR_LIB_SSL 20
#define TL_SSL_R_CERTIFICATE_VERIFY_FAILED 134
#define TL_SSL_R_UNEXPECTED_EOF_WHILE_READING 294
#define TL_X509_V_ERR_HOSTNAME_MISMATCH 62
#define TL_X509_V_ERR_IP_ADDRESS_MISMATCH 64
#define TL_SSL_RECEIVED_SHUTDOWN 2
#define TL_SSL_CTRL_CLEAR_MODE 78
#define TL_SSL_MODE_RELEASE_BUFFERS 0x10L
#define TL_BIO_C_SET_BUF_MEM 114
#define TL_BIO_CLOSE 0x01
/* SSLProtocol.max_size: what one SSLObject.read() asks for. */
#define TL_SSLPROTO_MAX_SIZE (256 * 1024)

/* _ssl's object layouts (Modules/_ssl.c, 3.11-3.14): the SSL* follows the
 * Socket weakref in PySSLSocket; the BIO* and SSL_CTX* come first. */
#define TL_SSLSOCKET_SSL_OFFSET (sizeof(PyObject) + sizeof(PyObject *))
#define TL_MEMBIO_BIO_OFFSET (sizeof(PyObject))
#define TL_MEMBIO_EOF_OFFSET (sizeof(PyObject) + sizeof(void *))
#define TL_SSLCTX_CTX_OFFSET (sizeof(PyObject))
/* 3.14+'s PySSLSocket keeps an "SSLEOFError raised" int at
 * TL_SSLSOCKET_EOF_OFFSET (compat.h).  Used only where the proof saw it
 * behave so (ssl_line_eof). */

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
    int used;                   /* entries since the last idle check (saturating) */
    int keep_buffers;           /* busy: the record buffers stay between entries */
    PyObject *idle_timer;       /* the pending idle check's TimerHandle */
    Py_ssize_t buffers_released;    /* times the idle check freed them */
    PyObject *weakreflist;
} TLSEngineObject;

/* OpenSSL's record buffers (openssl route), ~17 KiB each way.  _ssl has
 * OpenSSL free them after each record (SSL_MODE_RELEASE_BUFFERS): a
 * malloc and a free per record.  The engine frees them after each of its
 * entries instead (SSL_free_buffers) until the connection is busy --
 * TL_TLS_BUSY_ENTRIES entries since the last idle check -- and keeps them
 * from then on; a connection with nothing to do for a whole check gives
 * them back and is freed after each entry again.  Buffers kept for a
 * second by connections that then idle for good would leave 34 KiB holes
 * in the heap behind everything allocated meanwhile (4-13 KiB of RSS a
 * connection at 500-2,000 idle connections); freed at once, as on the
 * stock loop, the next connection reuses them.  The idle check also frees
 * the MemoryBIOs' grown storage (BIO_set_mem_buf with an empty BUF_MEM:
 * ~1.4 KiB a connection after a handshake).  Without SSL_free_buffers (an
 * OpenSSL before the CVE-2024-4741 fix) the buffers are kept throughout. */
#define TL_TLS_IDLE_CHECK_S 0.5
#define TL_TLS_BUSY_ENTRIES 16

static int schedule_idle_check(TLSEngineObject *self);

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

/* *out = the attribute as a C size: 1; 0 when it is not an exact int that
 * fits (the caller then leaves the decision to SSLProtocol); -1 on error. */
static int
psize(TLSEngineObject *self, PyObject *name, Py_ssize_t *out)
{
    PyObject *v = pget(self, name);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyLong_CheckExact(v))
        return 0;
    *out = PyLong_AsSsize_t(v);
    if (*out == -1 && PyErr_Occurred()) {
        /* Too large for C: SSLProtocol decides. */
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
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

/* ---- _ssl's exceptions, raised from C (the openssl route) ----
 *
 * After a failed call _ssl's PySSL_SetError picks the exception from
 * SSL_get_error(), errno and the last queued OpenSSL error, and names the
 * library and reason from the dicts in its module state.  raise_ssl_error
 * does the same from the same inputs, with those dicts (_tls_errors finds
 * them).  Making the call again through _ssl is no way to get them:
 * OpenSSL 3.6 drops the error of an SSL object in its error state on the
 * next call, which then reports "want read". */

/* st->tls_errtab: _ssl's exceptions and dicts, in this order. */
enum {
    ERRTAB_SSL, ERRTAB_CERT_VERIFY, ERRTAB_ZERO_RETURN, ERRTAB_WANT_READ,
    ERRTAB_WANT_WRITE, ERRTAB_SYSCALL, ERRTAB_EOF, ERRTAB_CODE_NAMES,
    ERRTAB_LIB_NAMES, ERRTAB_SIZE
};
/* _ssl.c's py_ssl_error beyond OpenSSL's SSL_ERROR_* codes. */
#define TL_PY_SSL_ERROR_EOF 8
#define TL_PY_SSL_ERROR_INVALID_ERROR_CODE 10

/* OpenSSL 3's ERR_GET_LIB/ERR_GET_REASON (inline functions, so not
 * found by dlsym): bit 31 marks a system error whose reason is errno. */
static int
err_lib(unsigned long e)
{
    return (e & 0x80000000UL) ? TL_ERR_LIB_SYS : (int)((e >> 23) & 0xFF);
}

static int
err_reason(unsigned long e)
{
    return (int)((e & 0x80000000UL) ? (e & 0x7FFFFFFFUL) : (e & 0x7FFFFFUL));
}

/* _ssl's fill_and_set_sslerror(): the exception of type `type` with
 * (p, "[LIB: REASON] text (_ssl.c:line)") and its attributes. */
static void
set_ssl_error(tl_state *st, PyObject *sslsock, void *ssl, PyObject *type, int p,
              const char *errstr, int line, unsigned long e)
{
    const tl_ossl *o = &st->ossl;
    PyObject *tab = st->tls_errtab;
    PyObject *reason = NULL, *lib = NULL;       /* borrowed from the dicts */
    if (p == TL_PY_SSL_ERROR_EOF && st->ssl_line_eof > 0) {
        int one = 1;
        memcpy((char *)sslsock + TL_SSLSOCKET_EOF_OFFSET, &one, sizeof(one));
    }
    PyObject *verify = NULL, *verify_code = NULL, *msg = NULL, *value = NULL;
    if (e != 0) {
        PyObject *key = Py_BuildValue("ii", err_lib(e), err_reason(e));
        if (key == NULL)
            return;
        reason = PyDict_GetItemWithError(PyTuple_GET_ITEM(tab, ERRTAB_CODE_NAMES), key);
        Py_DECREF(key);
        if (reason == NULL && PyErr_Occurred())
            return;
        if ((key = PyLong_FromLong(err_lib(e))) == NULL)
            return;
        lib = PyDict_GetItemWithError(PyTuple_GET_ITEM(tab, ERRTAB_LIB_NAMES), key);
        Py_DECREF(key);
        if (lib == NULL && PyErr_Occurred())
            return;
        if (errstr == NULL)
            errstr = o->ERR_reason_error_string(e);
    }
    if (errstr == NULL)
        errstr = "unknown error";
    int cert = type == PyTuple_GET_ITEM(tab, ERRTAB_CERT_VERIFY);
    if (cert) {
        long code = o->SSL_get_verify_result(ssl);
        if ((verify_code = PyLong_FromLong(code)) == NULL)
            goto done;
        if (code == TL_X509_V_ERR_HOSTNAME_MISMATCH || code == TL_X509_V_ERR_IP_ADDRESS_MISMATCH) {
            PyObject *host = PyObject_GetAttr(sslsock, st->str_server_hostname);
            if (host == NULL)
                goto done;
            verify = PyUnicode_FromFormat(
                code == TL_X509_V_ERR_HOSTNAME_MISMATCH
                    ? "Hostname mismatch, certificate is not valid for '%S'."
                    : "IP address mismatch, certificate is not valid for '%S'.",
                host);
            Py_DECREF(host);
        }
        else {
            const char *text = o->X509_verify_cert_error_string(code);
            verify = text != NULL ? PyUnicode_FromString(text) : Py_NewRef(Py_None);
        }
        if (verify == NULL)
            goto done;
    }
    if (verify != NULL && reason != NULL && lib != NULL)
        msg = PyUnicode_FromFormat("[%S: %S] %s: %S (_ssl.c:%d)", lib, reason, errstr,
                                   verify, line);
    else if (reason != NULL && lib != NULL)
        msg = PyUnicode_FromFormat("[%S: %S] %s (_ssl.c:%d)", lib, reason, errstr, line);
    else if (lib != NULL)
        msg = PyUnicode_FromFormat("[%S] %s (_ssl.c:%d)", lib, errstr, line);
    else
        msg = PyUnicode_FromFormat("%s (_ssl.c:%d)", errstr, line);
    if (msg == NULL)
        goto done;
    value = PyObject_CallFunction(type, "iO", p, msg);
    if (value == NULL ||
        PyObject_SetAttr(value, st->str_reason, reason ? reason : Py_None) < 0 ||
        PyObject_SetAttr(value, st->str_library, lib ? lib : Py_None) < 0)
        goto done;
    if (cert && (PyObject_SetAttr(value, st->str_verify_code, verify_code) < 0 ||
                 PyObject_SetAttr(value, st->str_verify_message, verify) < 0))
        goto done;
    PyErr_SetObject(type, value);
done:
    Py_XDECREF(value);
    Py_XDECREF(msg);
    Py_XDECREF(verify);
    Py_XDECREF(verify_code);
}

/* _ssl's PySSL_SetError() for a call on ssl that failed with
 * SSL_get_error() = ssl_err and errno = c_errno right after it; `line` is
 * the _ssl.c line of that call's method.  Always raises. */
static void
raise_ssl_error(tl_state *st, PyObject *sslsock, void *ssl, int ssl_err, int c_errno,
                int line)
{
    const tl_ossl *o = &st->ossl;
    PyObject *tab = st->tls_errtab;
    PyObject *type = PyTuple_GET_ITEM(tab, ERRTAB_SSL);
    const char *errstr = NULL;
    int p = ssl_err;
    unsigned long e = o->ERR_peek_last_error();
    int cert_failed = e != 0 && err_lib(e) == TL_ERR_LIB_SSL &&
                      err_reason(e) == TL_SSL_R_CERTIFICATE_VERIFY_FAILED;
    switch (ssl_err) {
    case TL_SSL_ERROR_ZERO_RETURN:
        errstr = "TLS/SSL connection has been closed (EOF)";
        type = PyTuple_GET_ITEM(tab, ERRTAB_ZERO_RETURN);
        break;
    case TL_SSL_ERROR_WANT_READ:
        errstr = "The operation did not complete (read)";
        type = PyTuple_GET_ITEM(tab, ERRTAB_WANT_READ);
        break;
    case TL_SSL_ERROR_WANT_WRITE:
        errstr = "The operation did not complete (write)";
        type = PyTuple_GET_ITEM(tab, ERRTAB_WANT_WRITE);
        break;
    case TL_SSL_ERROR_WANT_X509_LOOKUP:
        errstr = "The operation did not complete (X509 lookup)";
        break;
    case TL_SSL_ERROR_WANT_CONNECT:
        errstr = "The operation did not complete (connect)";
        break;
    case TL_SSL_ERROR_SYSCALL:
        if (e == 0) {       /* the BIO reported an I/O error */
            o->ERR_clear_error();
            if (c_errno != 0) {
                errno = c_errno;
                PyErr_SetFromErrno(PyExc_OSError);
                return;
            }
            p = TL_PY_SSL_ERROR_EOF;
            type = PyTuple_GET_ITEM(tab, ERRTAB_EOF);
            errstr = "EOF occurred in violation of protocol";
            break;
        }
        if (cert_failed)
            type = PyTuple_GET_ITEM(tab, ERRTAB_CERT_VERIFY);
        if (err_lib(e) == TL_ERR_LIB_SYS) {
            errno = err_reason(e);
            PyErr_SetFromErrno(PyExc_OSError);
            return;
        }
        break;
    case TL_SSL_ERROR_SSL:
        if (e == 0)
            errstr = "A failure in the SSL library occurred";
        if (cert_failed)
            type = PyTuple_GET_ITEM(tab, ERRTAB_CERT_VERIFY);
        if (e != 0 && err_lib(e) == TL_ERR_LIB_SSL &&
            err_reason(e) == TL_SSL_R_UNEXPECTED_EOF_WHILE_READING) {
            p = TL_PY_SSL_ERROR_EOF;
            type = PyTuple_GET_ITEM(tab, ERRTAB_EOF);
            errstr = "EOF occurred in violation of protocol";
        }
        if (err_lib(e) == TL_ERR_LIB_SYS) {
            errno = err_reason(e);
            PyErr_SetFromErrno(PyExc_OSError);
            return;
        }
        break;
    default:
        p = TL_PY_SSL_ERROR_INVALID_ERROR_CODE;
        errstr = "Invalid error code";
    }
    set_ssl_error(st, sslsock, ssl, type, p, errstr, line, e);
    o->ERR_clear_error();
}

/* 3.14's read() and write() after an SSLEOFError: 1 and that error raised
 * again (as _ssl raises it, OpenSSL not called), else 0. */
static int
eof_flag(tl_state *st, PyObject *sslsock)
{
    int flag = 0;
    if (st->ssl_line_eof > 0)
        memcpy(&flag, (char *)sslsock + TL_SSLSOCKET_EOF_OFFSET, sizeof(flag));
    return flag != 0;
}

static int
eof_already_raised(tl_state *st, PyObject *sslsock)
{
    if (!eof_flag(st, sslsock))
        return 0;
    set_ssl_error(st, sslsock, NULL, PyTuple_GET_ITEM(st->tls_errtab, ERRTAB_EOF),
                  TL_PY_SSL_ERROR_EOF, "EOF occurred in violation of protocol",
                  st->ssl_line_eof, 0);
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
    if (eof_already_raised(self->st, self->sslobj))
        return -1;
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
    int c_errno = errno;
    int e = o->SSL_get_error(self->ssl, 0);
    if (e == TL_SSL_ERROR_WANT_READ) {      /* SSLWantReadError: "again" */
        *again = 1;
        return 0;
    }
    if (e == TL_SSL_ERROR_ZERO_RETURN &&
        o->SSL_get_shutdown(self->ssl) == TL_SSL_RECEIVED_SHUTDOWN)
        return 0;
    /* What _ssl's read() raises; SSLProtocol's SSLAgainErrors mean "again". */
    raise_ssl_error(self->st, self->sslobj, self->ssl, e, c_errno, self->st->ssl_line_read);
    *again = clear_again_error(self);
    return *again ? 0 : -1;
}

/* SSLProtocol._write_appdata's `self._write_backlog.append(data);
 * self._write_buffer_size += len(data)`. */
static int
backlog_append(TLSEngineObject *self, PyObject *data)
{
    tl_state *st = self->st;
    PyObject *backlog = pget(self, st->str_write_backlog);
    PyObject *size = pget(self, st->str_write_buffer_size);
    if (backlog == NULL || size == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "SSLProtocol without a write backlog");
        return -1;
    }
    Py_ssize_t len = PyObject_Size(data);
    PyObject *r = len < 0 ? NULL : PyObject_CallMethodOneArg(backlog, st->str_append, data);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    PyObject *n = PyLong_FromSsize_t(len);
    PyObject *sum = n ? PyNumber_Add(size, n) : NULL;
    Py_XDECREF(n);
    int rc = sum ? PyDict_SetItem(self->pdict, st->str_write_buffer_size, sum) : -1;
    Py_XDECREF(sum);
    return rc;
}

/* Plaintext of one write, all of it; or *fallback = 1 when SSLProtocol
 * must take the write (nothing was written).  When the TLS object refuses
 * it, as SSLProtocol's _write_appdata + _do_write: the data waits in the
 * backlog, and _ssl's error is "again" (SSLAgainErrors: 0 returned, the
 * backlog is retried later) or raised. */
static int
tls_write(TLSEngineObject *self, PyObject *data, int *fallback)
{
    *fallback = 0;
    if (self->route == TL_TLS_OPENSSL) {
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
            /* SSLProtocol raises a refused buffer in its own place */
            if (!PyErr_ExceptionMatches(PyExc_TypeError) &&
                !PyErr_ExceptionMatches(PyExc_BufferError))
                return -1;
            PyErr_Clear();
            *fallback = 1;
            return 0;
        }
        const tl_ossl *o = &self->st->ossl;
        size_t w = 0;
        if (view.len == 0) {
            PyBuffer_Release(&view);
            *fallback = 1;
            return 0;
        }
        int eof = eof_flag(self->st, self->sslobj);
        /* _ssl enables no partial writes: all is written, or nothing. */
        int ok = !eof && o->SSL_write_ex(self->ssl, view.buf, (size_t)view.len, &w);
        int c_errno = errno;
        PyBuffer_Release(&view);
        if (ok)
            return 0;
        int e = eof ? 0 : o->SSL_get_error(self->ssl, 0);
        if (backlog_append(self, data) < 0)
            return -1;
        if (!eof_already_raised(self->st, self->sslobj))
            raise_ssl_error(self->st, self->sslobj, self->ssl, e, c_errno,
                            self->st->ssl_line_write);
        return clear_again_error(self) ? 0 : -1;
    }
    /* _ssl's write() writes all or raises (it enables no partial writes). */
    PyObject *r = PyObject_CallMethodOneArg(self->sslobj, self->st->str_write, data);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    /* The backlog as on the openssl route; its error is _ssl's own. */
    PyObject *exc = tl_err_get_raised();
    if (backlog_append(self, data) < 0) {
        Py_DECREF(exc);
        return -1;
    }
    tl_err_set_raised(exc);
    return clear_again_error(self) ? 0 : -1;
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
    int known = extra != NULL ? psize(self, extra, &add) : 1;
    if (known > 0)
        known = psize(self, high_name, &high);
    if (known > 0)
        known = psize(self, low_name, &low);
    if (known < 0)
        return -1;
    if (known == 0)
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
        Py_INCREF(app);
        /* asyncio streams over TLS: the reader fed in C (streams.c) */
        int fed = tl_streams_feed_app(self->loop, app, PyBytes_AS_STRING(data),
                                      PyBytes_GET_SIZE(data));
        PyObject *r = NULL;
        if (fed == 0) {
            PyObject *args[2] = {app, data};
            r = PyObject_VectorcallMethod(
                st->str_data_received, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        }
        Py_DECREF(app);
        if (fed < 0 || (fed == 0 && r == NULL))
            goto done;
        Py_XDECREF(r);
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
    /* (str keys: nothing above fails in practice; void: reported if so) */
    if (PyErr_Occurred())
        PyErr_WriteUnraisable((PyObject *)self);
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
    if (self->used < INT_MAX)
        self->used++;
    if (self->ssl == NULL || self->busy > 0 || self->st->ossl.SSL_free_buffers == NULL)
        return;
    if (!self->keep_buffers) {
        /* Not (yet) busy since the last idle check: the buffers go after
         * each entry, as _ssl's per-record release would have them go (0
         * when a record is still in them: they stay); busy: they stay. */
        if (self->used >= TL_TLS_BUSY_ENTRIES)
            self->keep_buffers = 1;
        else
            (void)self->st->ossl.SSL_free_buffers(self->ssl);
    }
    if (self->idle_timer == NULL) {
        PyObject *exc = PyErr_Occurred() ? tl_err_get_raised() : NULL;
        /* (a check not scheduled costs memory, not correctness: a closed
         * loop says so here, and the entry's own result stands) */
        if (schedule_idle_check(self) < 0)
            PyErr_Clear();
        if (exc != NULL)
            tl_err_set_raised(exc);
    }
}

/* An empty memory BIO's storage (grown to the largest flight it held)
 * goes: BIO_set_mem_buf() frees the old BUF_MEM, its data with it, and
 * takes an empty one, which the next write grows again. */
static void
release_bio_storage(TLSEngineObject *self, void *bio)
{
    const tl_ossl *o = &self->st->ossl;
    if (o->BUF_MEM_new == NULL || o->BIO_ctrl_pending(bio) != 0)
        return;
    void *bm = o->BUF_MEM_new();
    if (bm != NULL)
        o->BIO_ctrl(bio, TL_BIO_C_SET_BUF_MEM, TL_BIO_CLOSE, bm);
}

/* The idle check: busy since the last one, or the buffers go back. */
static PyObject *
engine_idle_check(TLSEngineObject *self, PyObject *Py_UNUSED(ignored))
{
    Py_CLEAR(self->idle_timer);
    if (self->ssl == NULL || self->busy > 0)
        Py_RETURN_NONE;             /* detached, or (cannot happen) inside an entry */
    const tl_ossl *o = &self->st->ossl;
    if (self->used) {
        self->used = 0;
        if (schedule_idle_check(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    self->keep_buffers = 0;
    /* 0 when a record is still in them: they stay (and go after the next
     * entry) */
    if (o->SSL_free_buffers(self->ssl))
        self->buffers_released++;
    release_bio_storage(self, self->rbio);
    release_bio_storage(self, self->wbio);
    Py_RETURN_NONE;
}

static PyMethodDef engine_idle_check_def = {
    "_idle_check", (PyCFunction)engine_idle_check, METH_NOARGS,
    "Free OpenSSL's record buffers of a connection idle since the last check."};

static int
schedule_idle_check(TLSEngineObject *self)
{
    PyObject *fn = PyCFunction_New(&engine_idle_check_def, (PyObject *)self);
    if (fn == NULL)
        return -1;
    self->idle_timer = tl_loop_call_later(self->loop, TL_TLS_IDLE_CHECK_S, fn);
    Py_DECREF(fn);
    return self->idle_timer == NULL ? -1 : 0;
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
    self->head.feed_error = "Fatal error: protocol.buffer_updated() call failed.";
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
         * (SSL_MODE_RELEASE_BUFFERS); the engine decides when instead
         * (engine_leave, the idle check).  Cleared now, before the
         * handshake: since OpenSSL 3.2 each record layer takes the mode
         * when it is made and a later clear does not reach it. */
        o->SSL_ctrl(self->ssl, TL_SSL_CTRL_CLEAR_MODE, TL_SSL_MODE_RELEASE_BUFFERS, NULL);
        self->used = 1;
        if (o->SSL_free_buffers != NULL && schedule_idle_check(self) < 0)
            goto error;
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
    Py_VISIT(self->idle_timer);
    return 0;
}

static void
engine_clear_refs(TLSEngineObject *self)
{
    /* The SSL* and BIO*s belong to the objects cleared here. */
    self->ssl = self->rbio = self->wbio = NULL;
    if (self->route == TL_TLS_OPENSSL)
        self->route = TL_TLS_SSLOBJECT;
    if (self->idle_timer != NULL) {
        /* cancel() drops the handle's reference to the check (and so to
         * this engine) */
        PyObject *timer = self->idle_timer;
        self->idle_timer = NULL;
        PyObject *r = PyObject_CallMethod(timer, "cancel", NULL);
        if (r == NULL)
            PyErr_WriteUnraisable(timer);
        Py_XDECREF(r);
        Py_DECREF(timer);
    }
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
    {"buffers_released", T_PYSSIZET, offsetof(TLSEngineObject, buffers_released), READONLY,
     "How often an idle check gave OpenSSL's record buffers back (openssl route)."},
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
    SYM(SSL_has_pending) SYM(SSL_ctrl) SYM(ERR_peek_last_error)
    SYM(ERR_reason_error_string) SYM(SSL_get_verify_result)
    SYM(X509_verify_cert_error_string) SYM(OpenSSL_version_num)
#undef SYM
    *(void **)(&o.SSL_free_buffers) = dlsym(h, "SSL_free_buffers");     /* optional */
    *(void **)(&o.BIO_ctrl) = dlsym(h, "BIO_ctrl");                     /* optional */
    *(void **)(&o.BUF_MEM_new) = dlsym(h, "BUF_MEM_new");
    if (o.BIO_ctrl == NULL)
        o.BUF_MEM_new = NULL;
    dlclose(h);
    if (missing != NULL)
        return PyUnicode_FromFormat("%s not found in _ssl's libssl", missing);
    if (o.OpenSSL_version_num() < 0x30000000UL)
        return PyUnicode_FromString("OpenSSL older than 3.0 (its error codes differ)");
    /* Optional: SSL_free_buffers() freed a buffer still in use before
     * 3.0.14, 3.1.6, 3.2.2 and 3.3.1 (CVE-2024-4741); older ones keep the
     * buffers of idle connections. */
    unsigned long v = o.OpenSSL_version_num();
    unsigned long fixed = v < 0x30100000UL ? 0x300000E0UL : v < 0x30200000UL ? 0x30100060UL
                          : v < 0x30300000UL ? 0x30200020UL : 0x30300010UL;
    if (v < fixed)
        o.SSL_free_buffers = NULL;
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

/* The SSL* of an _SSLSocket for the proof's steps, its error queue
 * cleared; NULL with an exception when the route's pieces are missing
 * (errors: raise_ssl_error's tables needed too). */
static void *
proof_ssl(tl_state *st, PyObject *sock, int errors)
{
    if (!st->ossl_loaded || (errors && st->tls_errtab == NULL) ||
        !Py_IS_TYPE(sock, (PyTypeObject *)st->tls_sslsocket_type)) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL functions or _ssl's errors not found");
        return NULL;
    }
    st->ossl.ERR_clear_error();
    return field_ptr(sock, TL_SSLSOCKET_SSL_OFFSET);
}

/* _tls_handshake_step(sslsock) -> SSL_get_error() code of one
 * SSL_do_handshake() through the openssl route (the proof's round trip). */
static PyObject *
tls_handshake_step(PyObject *module, PyObject *sock)
{
    tl_state *st = PyModule_GetState(module);
    void *ssl = proof_ssl(st, sock, 0);
    if (ssl == NULL)
        return NULL;
    int ret = st->ossl.SSL_do_handshake(ssl);
    return PyLong_FromLong(ret == 1 ? 0 : st->ossl.SSL_get_error(ssl, ret));
}

/* _tls_errors(_ssl, expected, read_line, write_line, names) -> None when
 * _ssl's module state starts as _ssl.h lays it out (3.11-3.14): its five
 * types and seven exceptions, the objects in `expected` in that order,
 * then (3.12+) the dicts err_codes_to_names and lib_codes_to_names; else
 * the reason.  names: those two dicts where _ssl still exposes them (3.11),
 * else None.  The exceptions and dicts are kept for raise_ssl_error, with
 * the _ssl.c lines of read() and write(). */
static PyObject *
tls_errors(PyObject *module, PyObject *args)
{
    tl_state *st = PyModule_GetState(module);
    PyObject *ssl_mod, *expected, *names;
    int line_read, line_write, line_eof;
    if (!PyArg_ParseTuple(args, "O!O!iiOi:_tls_errors", &PyModule_Type, &ssl_mod,
                          &PyTuple_Type, &expected, &line_read, &line_write, &names,
                          &line_eof))
        return NULL;
    enum { KNOWN = 12 };
    PyModuleDef *def = PyModule_GetDef(ssl_mod);   /* (a module: no error) */
    if (def == NULL) {
        assert(!PyErr_Occurred());
        return PyUnicode_FromString("_ssl has no module definition");
    }
    PyObject **slots = PyModule_GetState(ssl_mod);
    if (slots == NULL || def->m_size < (Py_ssize_t)((KNOWN + 2) * sizeof(PyObject *)))
        return PyUnicode_FromString("_ssl's module state is smaller than the known layout");
    if (PyTuple_GET_SIZE(expected) != KNOWN)
        return PyUnicode_FromString("_tls_errors: expected 12 objects");
    for (int i = 0; i < KNOWN; i++)
        if (slots[i] != PyTuple_GET_ITEM(expected, i))
            return PyUnicode_FromFormat("_ssl's module state holds something else "
                                        "than %R at slot %d", PyTuple_GET_ITEM(expected, i), i);
    PyObject *code_names = slots[KNOWN], *lib_names = slots[KNOWN + 1];
    if (names != Py_None) {
        if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != 2) {
            PyErr_SetString(PyExc_TypeError, "_tls_errors: names must be a pair or None");
            return NULL;
        }
        code_names = PyTuple_GET_ITEM(names, 0);
        lib_names = PyTuple_GET_ITEM(names, 1);
    }
    if (code_names == NULL || lib_names == NULL ||
        !PyDict_CheckExact(code_names) || !PyDict_CheckExact(lib_names))
        return PyUnicode_FromString("no error-name dicts in _ssl's module state");
    PyObject *tab = PyTuple_New(ERRTAB_SIZE);
    if (tab == NULL)
        return NULL;
    for (int i = 0; i < ERRTAB_CODE_NAMES; i++)
        PyTuple_SET_ITEM(tab, i, Py_NewRef(slots[5 + i]));
    PyTuple_SET_ITEM(tab, ERRTAB_CODE_NAMES, Py_NewRef(code_names));
    PyTuple_SET_ITEM(tab, ERRTAB_LIB_NAMES, Py_NewRef(lib_names));
    Py_XSETREF(st->tls_errtab, tab);
    st->ssl_line_read = line_read;
    st->ssl_line_write = line_write;
    st->ssl_line_eof = 0;
    if (line_eof > 0) {
        if (((PyTypeObject *)st->tls_sslsocket_type)->tp_basicsize <
            (Py_ssize_t)(TL_SSLSOCKET_EOF_OFFSET + sizeof(int)))
            return PyUnicode_FromString("_SSLSocket has no room for an EOF flag");
        st->ssl_line_eof = line_eof;
    }
    Py_RETURN_NONE;
}

/* _tls_eof_flag(sslsock) -> the int where 3.14's _SSLSocket keeps "an
 * SSLEOFError was raised", or None when the object is too small for it
 * (the proof checks it changes from 0 to 1 with such an error). */
static PyObject *
tls_eof_flag(PyObject *module, PyObject *sock)
{
    tl_state *st = PyModule_GetState(module);
    if (st->tls_sslsocket_type == NULL || !Py_IS_TYPE(sock, (PyTypeObject *)st->tls_sslsocket_type)) {
        PyErr_SetString(PyExc_TypeError, "_tls_eof_flag: an _ssl._SSLSocket is needed");
        return NULL;
    }
    if (TL_SSLSOCKET_EOF_OFFSET == 0
        || Py_TYPE(sock)->tp_basicsize < (Py_ssize_t)(TL_SSLSOCKET_EOF_OFFSET + sizeof(int)))
        Py_RETURN_NONE;
    int flag;
    memcpy(&flag, (char *)sock + TL_SSLSOCKET_EOF_OFFSET, sizeof(flag));
    return PyLong_FromLong(flag);
}

/* _tls_fail_step(sslsock, write) -> the count of one SSL_read_ex (or
 * SSL_write_ex of b"x") through the openssl route; when it fails, raises
 * what raise_ssl_error makes of it (the proof compares that with what _ssl
 * raises for the same bytes in the incoming MemoryBIO). */
static PyObject *
tls_fail_step(PyObject *module, PyObject *args)
{
    tl_state *st = PyModule_GetState(module);
    PyObject *sock;
    int write;
    if (!PyArg_ParseTuple(args, "Op:_tls_fail_step", &sock, &write))
        return NULL;
    void *ssl = proof_ssl(st, sock, 1);
    if (ssl == NULL)
        return NULL;
    const tl_ossl *o = &st->ossl;
    if (eof_already_raised(st, sock))
        return NULL;
    char buf[64];
    size_t n = 0;
    int ok = write ? o->SSL_write_ex(ssl, "x", 1, &n) : o->SSL_read_ex(ssl, buf, sizeof(buf), &n);
    if (ok)
        return PyLong_FromSize_t(n);
    int c_errno = errno;
    raise_ssl_error(st, sock, ssl, o->SSL_get_error(ssl, 0), c_errno,
                    write ? st->ssl_line_write : st->ssl_line_read);
    return NULL;
}

/* _tls_set_proven(bool): the Python side's verdict on the round trips. */
static PyObject *
tls_set_proven(PyObject *module, PyObject *arg)
{
    tl_state *st = PyModule_GetState(module);
    int v = PyObject_IsTrue(arg);
    if (v < 0)
        return NULL;
    if (v && (!st->ossl_loaded || st->tls_errtab == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL functions not loaded");
        return NULL;
    }
    st->ossl_proven = v;
    if (!v && TL_ATOMIC_GET(&st->tls_route) == TL_TLS_OPENSSL)
        TL_ATOMIC_SET(&st->tls_route, TL_TLS_SSLOBJECT);
    Py_RETURN_NONE;
}

static const char *const route_names[] = {"asyncio", "sslobject", "openssl"};

static PyObject *
tls_route(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    tl_state *st = PyModule_GetState(module);
    return PyUnicode_FromString(route_names[TL_ATOMIC_GET(&st->tls_route)]);
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
    PyObject *prev = PyUnicode_FromString(route_names[TL_ATOMIC_GET(&st->tls_route)]);
    if (prev != NULL)
        TL_ATOMIC_SET(&st->tls_route, r);
    return prev;
}

const PyMethodDef tl_tls_module_methods[] = {
    {"_tls_setup", tls_setup, METH_VARARGS, NULL},
    {"_tls_prove", tls_prove, METH_VARARGS, NULL},
    {"_tls_handshake_step", tls_handshake_step, METH_O, NULL},
    {"_tls_errors", tls_errors, METH_VARARGS, NULL},
    {"_tls_fail_step", tls_fail_step, METH_VARARGS, NULL},
    {"_tls_eof_flag", tls_eof_flag, METH_O, NULL},
    {"_tls_set_proven", tls_set_proven, METH_O, NULL},
    {"tls_route", tls_route, METH_NOARGS,
     "The TLS route new connections take: 'openssl', 'sslobject' or 'asyncio'."},
    {"set_tls_route", set_tls_route, METH_O,
     "set_tls_route(name) -> previous: the route for new TLS connections."},
    {NULL, NULL, 0, NULL},
};
