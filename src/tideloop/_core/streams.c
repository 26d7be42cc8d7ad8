/* asyncio streams in C.
 *
 * asyncio.open_connection() and start_server() (and the Unix variants) make
 * a StreamReader, a StreamReaderProtocol and a StreamWriter: Python objects
 * whose methods are most of a streams program's cost on a fast loop.  When
 * a stream transport of this loop gets such a protocol -- the exact classes,
 * their methods asyncio's own (tl_type_version() says whether the classes
 * changed since that was proven) -- three things run in C instead, and the
 * objects stay what asyncio made (same types, same attributes):
 *
 *   - the feeder (a tl_cproto): received bytes go straight into
 *     reader._buffer, the reader's waiter is woken and reading is paused at
 *     twice the limit, as StreamReader.feed_data() does;
 *   - the reader's read/readline/readexactly/readuntil and the protocol's
 *     _drain_helper (what StreamWriter.drain() awaits): C callables put in
 *     each instance's __dict__ (which attribute lookup prefers to the
 *     class's functions), holding their object weakly so that no cycle
 *     keeps it alive.  They return a small awaitable (StreamOp) that
 *     asyncio takes for a coroutine; a read waits on a future in
 *     reader._waiter as StreamReader._wait_for_data() does.
 *
 * An idle connection's protocol holds an empty collections.deque,
 * _drain_waiters, that only _drain_helper() appends to: 760 bytes, a sixth
 * of what the connection costs.  While it is empty it is replaced by the
 * empty tuple (asyncio's other uses only iterate over it), and a deque is
 * put back before asyncio's own _drain_helper() runs (the C one delegates
 * to it when the connection is paused or lost).
 *
 * The StreamWriter keeps asyncio's own methods: the transport and the
 * protocol are handed to the transport, the writer is not (it is made
 * after connection_made() on the client side, and 3.13+ keeps no reference
 * to it on the protocol), and finding it would mean asking who called.
 *
 * Everything works on the objects' own attributes (_buffer, _waiter, _eof,
 * _paused, _limit, _exception, _transport), so asyncio's Python methods and
 * these may take turns on one reader.  Anything unusual when a call starts
 * (an exception set, read(-1), a separator that is not bytes, unexpected
 * arguments, an attribute of another type) runs asyncio's own coroutine
 * instead, before anything has changed; subclasses, replaced methods,
 * custom protocols and debug mode never get here.
 *
 * May call: stream.c, transport.c, loop.c and below. */
#include "transport.h"

#include <limits.h>
#include <string.h>

enum {
    K_READ, K_READLINE, K_READEXACTLY, K_READUNTIL,     /* the reader's */
    K_DRAIN_HELPER,                                     /* the protocol's */
    K_COUNT
};

static const char *const kind_qualname[K_COUNT] = {
    "StreamReader.read", "StreamReader.readline", "StreamReader.readexactly",
    "StreamReader.readuntil", "FlowControlMixin._drain_helper",
};

/* ---- what is proven about asyncio's classes ---- */

/* 1 when tp's methods in check ((name, function), ...) are asyncio's: at
 * once while tp's version tag is the one recorded (*tag), else looked up
 * again (and the new tag recorded).  0: something differs; -1: error. */
static int
class_check(PyTypeObject *tp, unsigned int *tag, PyObject *check)
{
    Py_ssize_t n = PyTuple_GET_SIZE(check);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(check, i);
        PyObject *got = PyObject_GetAttr((PyObject *)tp, PyTuple_GET_ITEM(pair, 0));
        if (got == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        int same = got == PyTuple_GET_ITEM(pair, 1);
        Py_DECREF(got);
        if (!same)
            return 0;
    }
    /* The lookups gave the type a tag if it had none; 0 stays unproven. */
    TL_ATOMIC_SET(tag, tl_type_version(tp));
    return 1;
}

static inline int
class_unchanged(PyTypeObject *tp, unsigned int *tag, PyObject *check)
{
    unsigned int v = tl_type_version(tp);
    if (v != 0 && v == TL_ATOMIC_GET(tag))
        return 1;
    return class_check(tp, tag, check);
}

/* Is obj an instance of asyncio's class (exact type, methods unchanged)? */
static inline int
is_reader(tl_state *st, PyObject *obj)
{
    return Py_IS_TYPE(obj, (PyTypeObject *)st->s_reader_type)
           ? class_unchanged(Py_TYPE(obj), &st->s_reader_tag, st->s_reader_check) : 0;
}

static inline int
is_protocol(tl_state *st, PyObject *obj)
{
    return Py_IS_TYPE(obj, (PyTypeObject *)st->s_protocol_type)
           ? class_unchanged(Py_TYPE(obj), &st->s_protocol_tag, st->s_protocol_check) : 0;
}

/* ---- attributes, read and written in the instance __dict__ ---- */

/* The object's __dict__ (a new reference; made if it was not yet). */
static inline PyObject *
obj_dict(PyObject *obj)
{
    return PyObject_GenericGetDict(obj, NULL);
}

/* obj.name from its __dict__ d (borrowed: the stream objects belong to the
 * loop's thread), AttributeError as Python words it when missing. */
static inline PyObject *
attr(PyObject *obj, PyObject *d, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(d, name);
    if (v == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%U'",
                     tl_type_name(Py_TYPE(obj)), name);
    return v;
}

static inline int
truth(PyObject *v)
{
    return v == Py_True ? 1 : v == Py_False || v == Py_None ? 0 : PyObject_IsTrue(v);
}

/* Does d hold its own value for name (an instance attribute that would
 * shadow the class's method)? -1: error. */
static inline int
shadowed(PyObject *d, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(d, name);
    return v != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

/* n > factor * limit (factor 1 or 2), as Python computes it for any
 * limit object; an exact int at once.  -1: error. */
static int
above_limit(Py_ssize_t n, PyObject *limit, int factor)
{
    if (PyLong_CheckExact(limit)) {
        int overflow;
        long long l = PyLong_AsLongLongAndOverflow(limit, &overflow);
        if (l == -1 && PyErr_Occurred())
            return -1;
        if (overflow)
            return overflow < 0;
        if (factor == 2) {
            if (l > LLONG_MAX / 2)
                return 0;
            if (l < LLONG_MIN / 2)
                return 1;
            l *= 2;
        }
        return (long long)n > l;
    }
    PyObject *o = PyLong_FromSsize_t(n), *f = NULL, *bound = NULL;
    int r = -1;
    if (o == NULL)
        goto done;
    if (factor == 1)
        bound = Py_NewRef(limit);
    else if ((f = PyLong_FromLong(factor)) != NULL)
        bound = PyNumber_Multiply(f, limit);
    if (bound != NULL)
        r = PyObject_RichCompareBool(o, bound, Py_GT);
done:
    Py_XDECREF(o);
    Py_XDECREF(f);
    Py_XDECREF(bound);
    return r;
}

/* ---- reader._buffer: a bytearray at once, anything else through its
 * methods (as asyncio's code would call them) ---- */

static Py_ssize_t
buf_len(PyObject *buf)
{
    return PyByteArray_CheckExact(buf) ? PyByteArray_GET_SIZE(buf) : PyObject_Size(buf);
}

/* buf.clear() */
static int
buf_clear(tl_state *st, PyObject *buf)
{
    if (PyByteArray_CheckExact(buf))
        return PyByteArray_Resize(buf, 0);
    PyObject *r = PyObject_CallMethodNoArgs(buf, st->str_clear);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* bytes(buf) */
static PyObject *
buf_bytes(PyObject *buf)
{
    if (PyByteArray_CheckExact(buf))
        return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(buf),
                                         PyByteArray_GET_SIZE(buf));
    return PyBytes_FromObject(buf);
}

/* data = bytes(buf[:n]); del buf[:n] (buf.clear() instead when all of it
 * goes and clear_all, as readexactly() does) -> data */
static PyObject *
buf_take(tl_state *st, PyObject *buf, Py_ssize_t n, int clear_all)
{
    if (PyByteArray_CheckExact(buf)) {
        Py_ssize_t len = PyByteArray_GET_SIZE(buf);
        if (n > len)
            n = len;
        if (st->s_take_bytes != NULL) {
            /* 3.15: what asyncio's reads call (whole: no copy) */
            PyObject *on = PyLong_FromSsize_t(n);
            if (on == NULL)
                return NULL;
            PyObject *args[2] = {buf, on};
            PyObject *data = PyObject_Vectorcall(st->s_take_bytes, args, 2, NULL);
            Py_DECREF(on);
            return data;
        }
        PyObject *data = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(buf), n);
        if (data == NULL)
            return NULL;
        /* All of it: emptied, its storage kept for the next feed (what
         * asyncio's del buf[:n] or clear() leave differs only in the
         * storage behind an empty bytearray). */
        int rc = 0;
        if (n == len)
            rc = tl_bytearray_empty(buf, &st->storage_pool);
        else if (n > 0)
            rc = tl_bytearray_consume(buf, n);
        if (rc < 0)
            Py_CLEAR(data);
        return data;
    }
    Py_ssize_t len = PyObject_Size(buf);
    if (len < 0)
        return NULL;
    PyObject *data;
    if (clear_all && n == len) {
        data = PyBytes_FromObject(buf);
        if (data != NULL && buf_clear(st, buf) < 0)
            Py_CLEAR(data);
        return data;
    }
    PyObject *part = PySequence_GetSlice(buf, 0, n);
    if (part == NULL)
        return NULL;
    data = PyBytes_FromObject(part);
    Py_DECREF(part);
    if (data != NULL && PySequence_DelSlice(buf, 0, n) < 0)
        Py_CLEAR(data);
    return data;
}

/* buf.find(sep, offset) */
static Py_ssize_t
buf_find(PyObject *buf, PyObject *sep, Py_ssize_t offset)
{
    if (PyByteArray_CheckExact(buf)) {
        Py_ssize_t len = PyByteArray_GET_SIZE(buf);
        Py_ssize_t seplen = PyBytes_GET_SIZE(sep);
        if (offset < 0)
            offset = 0;
        if (offset > len || len - offset < seplen)
            return -1;
        const char *base = PyByteArray_AS_STRING(buf);
        const char *hit = memmem(base + offset, (size_t)(len - offset),
                                 PyBytes_AS_STRING(sep), (size_t)seplen);
        return hit == NULL ? -1 : hit - base;
    }
    PyObject *r = PyObject_CallMethod(buf, "find", "On", sep, offset);
    if (r == NULL)
        return -2;
    Py_ssize_t i = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    return i == -1 && PyErr_Occurred() ? -2 : i;
}

/* ---- StreamReader's private methods, on its __dict__ rd ---- */

/* _maybe_resume_transport() */
static int
maybe_resume(tl_state *st, PyObject *reader, PyObject *rd)
{
    PyObject *paused = attr(reader, rd, st->str_s_paused);
    if (paused == NULL)
        return -1;
    int p = truth(paused);
    if (p <= 0)
        return p;
    PyObject *buf = attr(reader, rd, st->str_s_buffer), *limit;
    if (buf == NULL)
        return -1;
    Py_ssize_t len = buf_len(buf);
    if (len < 0 || (limit = attr(reader, rd, st->str_s_limit)) == NULL)
        return -1;
    int above = above_limit(len, limit, 1);
    if (above != 0)
        return above < 0 ? -1 : 0;
    if (PyDict_SetItem(rd, st->str_s_paused, Py_False) < 0)
        return -1;
    PyObject *tr = attr(reader, rd, st->str_t_transport);
    if (tr == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodNoArgs(tr, st->str_resume_reading);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* _wakeup_waiter() */
static int
wakeup_waiter(tl_state *st, PyObject *reader, PyObject *rd)
{
    PyObject *waiter = attr(reader, rd, st->str_s_waiter);
    if (waiter == NULL)
        return -1;
    if (waiter == Py_None)
        return 0;
    Py_INCREF(waiter);
    int rc = -1;
    if (PyDict_SetItem(rd, st->str_s_waiter, Py_None) < 0)
        goto done;
    /* asyncio's C Future: its methods called at once (no lookup) */
    int c_future = Py_IS_TYPE(waiter, (PyTypeObject *)st->Future);
    PyObject *args[2] = {waiter, Py_None};
    PyObject *c = c_future ? PyObject_Vectorcall(st->s_fut_cancelled, args, 1, NULL)
                           : PyObject_CallMethodNoArgs(waiter, st->str_cancelled);
    if (c == NULL)
        goto done;
    int cancelled = truth(c);
    Py_DECREF(c);
    if (cancelled < 0)
        goto done;
    if (!cancelled) {
        PyObject *r = c_future ? PyObject_Vectorcall(st->s_fut_set_result, args, 2, NULL)
                               : PyObject_CallMethodOneArg(waiter, st->str_set_result,
                                                           Py_None);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    rc = 0;
done:
    Py_DECREF(waiter);
    return rc;
}

/* ---- the feeder: StreamReaderProtocol.data_received() in C ---- */

typedef struct {
    tl_cproto head;
    LoopObject *loop;
    PyObject *protocol;
    /* protocol._stream_reader_wr as adopted: asyncio's protocol sets it in
     * __init__ and clears it in connection_lost, after the last feed. */
    PyObject *reader_ref;
} FeederObject;

/* protocol.data_received(bytes), asyncio's way (anything unusual). */
static int
feed_python(FeederObject *self, const char *data, Py_ssize_t n)
{
    PyObject *b = PyBytes_FromStringAndSize(data, n);
    if (b == NULL)
        return -1;
    PyObject *args[2] = {self->protocol, b};
    PyObject *r = PyObject_VectorcallMethod(self->loop->state->str_data_received, args,
                                            2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(b);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* StreamReader.feed_data(data) on reader (proven asyncio's), its __dict__
 * rd: 1 when done, 0 when asyncio's own must do it (feed after EOF, which
 * asserts; a buffer that is not a bytearray), -1 on error. */
static int
feed_data(tl_state *st, PyObject *reader, PyObject *rd, const char *data,
          Py_ssize_t n)
{
    PyObject *eof = attr(reader, rd, st->str_s_eof);
    if (eof == NULL)
        return -1;
    PyObject *buf = PyDict_GetItemWithError(rd, st->str_s_buffer);
    if (eof != Py_False || buf == NULL || !PyByteArray_CheckExact(buf))
        return PyErr_Occurred() ? -1 : 0;
    if (tl_bytearray_append(buf, data, n, &st->storage_pool) < 0)
        return -1;
    if (wakeup_waiter(st, reader, rd) < 0)
        return -1;
    /* Past twice the limit, reading pauses (a transport that cannot pause
     * is forgotten, and the buffer just grows): `transport is not None and
     * not paused and len(buffer) > 2 * limit`.  With an int limit the
     * order the three are read in cannot show, and the size is the test
     * that usually fails: it comes first. */
    PyObject *tr, *paused, *limit = attr(reader, rd, st->str_s_limit);
    if (limit == NULL)
        return -1;
    if (PyLong_CheckExact(limit)) {
        int above = above_limit(PyByteArray_GET_SIZE(buf), limit, 2);
        if (above <= 0)
            return above < 0 ? -1 : 1;
    }
    if ((tr = attr(reader, rd, st->str_t_transport)) == NULL)
        return -1;
    if (tr == Py_None)
        return 1;
    if ((paused = attr(reader, rd, st->str_s_paused)) == NULL)
        return -1;
    int p = truth(paused);
    if (p != 0)
        return p < 0 ? -1 : 1;
    if (!PyLong_CheckExact(limit)) {
        int above = above_limit(PyByteArray_GET_SIZE(buf), limit, 2);
        if (above <= 0)
            return above < 0 ? -1 : 1;
    }
    Py_INCREF(tr);
    PyObject *r = PyObject_CallMethodNoArgs(tr, st->str_pause_reading);
    Py_DECREF(tr);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_NotImplementedError))
            return -1;
        PyErr_Clear();
        return PyDict_SetItem(rd, st->str_t_transport, Py_None) < 0 ? -1 : 1;
    }
    Py_DECREF(r);
    return PyDict_SetItem(rd, st->str_s_paused, Py_True) < 0 ? -1 : 1;
}

/* The transport's bytes for the protocol: StreamReaderProtocol's
 * data_received() (reader = self._stream_reader; if reader is not None:
 * reader.feed_data(data)) when everything is asyncio's, else the protocol's
 * own method with a bytes object. */
static int
feeder_feed(tl_cproto *cp, const char *data, Py_ssize_t n)
{
    FeederObject *self = (FeederObject *)cp;
    tl_state *st = self->loop->state;
    PyObject *protocol = self->protocol, *reader = NULL, *rd = NULL;
    if (protocol == NULL)
        return 0;
    int rc = is_protocol(st, protocol);
    if (rc <= 0)
        goto python;
    if ((rc = tl_weakref_get(self->reader_ref, &reader)) <= 0)
        goto done;                   /* no reader: the data goes nowhere */
    if ((rc = is_reader(st, reader)) <= 0)
        goto python;
    if ((rd = obj_dict(reader)) == NULL) {
        rc = -1;
        goto done;
    }
    rc = feed_data(st, reader, rd, data, n);
    if (rc != 0)
        goto done;
python:
    if (rc >= 0) {
        TL_ATOMIC_ADD(&st->s_feeds_python, 1);
        rc = feed_python(self, data, n);
    }
done:
    Py_XDECREF(reader);
    Py_XDECREF(rd);
    return rc < 0 ? -1 : 0;
}

static void
feeder_detach(tl_cproto *cp)
{
    FeederObject *self = (FeederObject *)cp;
    Py_CLEAR(self->protocol);
    Py_CLEAR(self->reader_ref);
}

static int
feeder_traverse(FeederObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->loop);
    Py_VISIT(self->protocol);
    Py_VISIT(self->reader_ref);
    return 0;
}

static int
feeder_clear(FeederObject *self)
{
    Py_CLEAR(self->protocol);
    Py_CLEAR(self->reader_ref);
    return 0;
}

static void
feeder_dealloc(FeederObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    feeder_clear(self);
    Py_CLEAR(self->loop);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot feeder_slots[] = {
    {Py_tp_dealloc, feeder_dealloc},
    {Py_tp_traverse, feeder_traverse},
    {Py_tp_clear, feeder_clear},
    {Py_tp_doc, "Feeds an asyncio StreamReader from a tideloop transport, in C."},
    {0, NULL}
};

PyType_Spec tl_stream_feeder_spec = {
    .name = "tideloop.StreamFeeder",
    .basicsize = sizeof(FeederObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = feeder_slots,
};

/* ---- StreamOp: what the awaited methods return ---- */

enum { OP_NEW, OP_RUNNING, OP_WAITING, OP_DELEGATED, OP_DONE };

typedef struct OpObject OpObject;
struct OpObject {
    PyObject_HEAD
    PyObject *owner;             /* the reader or protocol */
    PyObject *arg;               /* n, the separator, or NULL */
    PyObject *sub;               /* WAITING: the waiter's iterator;
                                    DELEGATED: asyncio's coroutine */
    tl_state *state;
    Py_ssize_t n;
    Py_ssize_t offset;           /* readuntil: bytes known to hold no separator */
    int kind;
    int phase;
    int waited;                  /* read(): its one wait is over */
    int finalized;               /* its finalizer ran: never recycled */
    OpObject *next_free;
};
#define TL_STREAM_OP_FREELIST_MAX 64

/* IncompleteReadError(partial, expected) raised. */
static int
raise_incomplete(tl_state *st, PyObject *partial, PyObject *expected)
{
    PyObject *e = PyObject_CallFunctionObjArgs(st->s_incomplete, partial, expected, NULL);
    if (e != NULL) {
        PyErr_SetObject(st->s_incomplete, e);
        Py_DECREF(e);
    }
    return -1;
}

static int
raise_overrun(tl_state *st, const char *message, Py_ssize_t consumed)
{
    PyObject *e = PyObject_CallFunction(st->s_overrun, "sn", message, consumed);
    if (e != NULL) {
        PyErr_SetObject(st->s_overrun, e);
        Py_DECREF(e);
    }
    return -1;
}

/* Does loop.create_future() run tideloop's own (a tideloop loop whose
 * type and instance leave the method alone)?  1 yes, 0 no, -1 error. */
static int
loop_creates_futures(tl_state *st, PyObject *loop)
{
    if (!PyObject_TypeCheck(loop, st->LoopType) || st->s_loop_cf == NULL)
        return 0;
    PyObject *ld = ((LoopObject *)loop)->dict;
    if (ld != NULL && PyDict_GET_SIZE(ld) != 0) {
        int s = shadowed(ld, st->str_create_future);
        if (s != 0)
            return s < 0 ? -1 : 0;
    }
    /* What the loop's type was found to do is kept by the loop (its own
     * thread's), as the type and its version tag then: a type changed
     * since, or another type at that address, has another tag. */
    LoopObject *lp = (LoopObject *)loop;
    PyTypeObject *tp = Py_TYPE(loop);
    unsigned int v = tl_type_version(tp);
    if (v != 0 && tp == lp->streams_cf_type && v == lp->streams_cf_tag)
        return 1;
    PyObject *got = PyObject_GetAttr((PyObject *)tp, st->str_create_future);
    if (got == NULL)
        return -1;
    int same = got == st->s_loop_cf;
    Py_DECREF(got);
    if (same) {
        lp->streams_cf_type = tp;
        lp->streams_cf_tag = tl_type_version(tp);
    }
    return same;
}

/* _wait_for_data(name) up to its await: the future in reader._waiter,
 * the iterator that awaits it in self->sub. */
static int
op_start_wait(OpObject *self, PyObject *rd, const char *name)
{
    tl_state *st = self->state;
    PyObject *reader = self->owner;
    PyObject *waiter = attr(reader, rd, st->str_s_waiter);
    if (waiter == NULL)
        return -1;
    if (waiter != Py_None) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s() called while another coroutine is already waiting "
                     "for incoming data", name);
        return -1;
    }
    /* Waiting while paused would never end: resume. */
    PyObject *paused = attr(reader, rd, st->str_s_paused);
    if (paused == NULL)
        return -1;
    int p = truth(paused);
    if (p < 0)
        return -1;
    if (p) {
        if (PyDict_SetItem(rd, st->str_s_paused, Py_False) < 0)
            return -1;
        PyObject *tr = attr(reader, rd, st->str_t_transport);
        if (tr == NULL)
            return -1;
        PyObject *r = PyObject_CallMethodNoArgs(tr, st->str_resume_reading);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    PyObject *loop = attr(reader, rd, st->str_t_loop);
    if (loop == NULL)
        return -1;
    int ours = loop_creates_futures(st, loop);
    if (ours < 0)
        return -1;
    PyObject *fut = ours ? tl_loop_create_future((LoopObject *)loop)
                         : PyObject_CallMethodNoArgs(loop, st->str_create_future);
    if (fut == NULL)
        return -1;
    /* self._waiter = fut; await self._waiter (no code runs in between) */
    int rc = -1;
    if (PyDict_SetItem(rd, st->str_s_waiter, fut) < 0)
        goto done;
    PyAsyncMethods *am = Py_TYPE(fut)->tp_as_async;
    if (am == NULL || am->am_await == NULL) {
        PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression",
                     Py_TYPE(fut)->tp_name);
        goto done;
    }
    if ((self->sub = am->am_await(fut)) == NULL)
        goto done;
    self->phase = OP_WAITING;
    rc = 0;
done:
    Py_DECREF(fut);
    return rc;
}

/* The rest of a read after the waits: 0 and *out (the result), 1 when a
 * wait has begun (self->sub), -1 raised.  buf: reader._buffer when just
 * read from rd (else NULL). */
static int
op_read_run(OpObject *self, PyObject *rd, PyObject *buf, PyObject **out)
{
    tl_state *st = self->state;
    PyObject *reader = self->owner, *eof, *limit;
    if (buf == NULL && (buf = attr(reader, rd, st->str_s_buffer)) == NULL)
        return -1;
    Py_ssize_t len = buf_len(buf);
    if (len < 0)
        return -1;
    switch (self->kind) {
    case K_READ:
        if (self->n == 0) {
            *out = PyBytes_FromStringAndSize(NULL, 0);
            return *out == NULL ? -1 : 0;
        }
        if (!self->waited && len == 0) {
            if ((eof = attr(reader, rd, st->str_s_eof)) == NULL)
                return -1;
            int e = truth(eof);
            if (e < 0)
                return -1;
            if (!e) {
                self->waited = 1;
                return op_start_wait(self, rd, "read") < 0 ? -1 : 1;
            }
        }
        *out = buf_take(st, buf, self->n, 0);
        break;
    case K_READEXACTLY:
        if (self->n == 0) {
            *out = PyBytes_FromStringAndSize(NULL, 0);
            return *out == NULL ? -1 : 0;
        }
        if (len < self->n) {
            if ((eof = attr(reader, rd, st->str_s_eof)) == NULL)
                return -1;
            int e = truth(eof);
            if (e < 0)
                return -1;
            if (!e)
                return op_start_wait(self, rd, "readexactly") < 0 ? -1 : 1;
            PyObject *partial = buf_bytes(buf);
            if (partial == NULL)
                return -1;
            if (buf_clear(st, buf) == 0)
                raise_incomplete(st, partial, self->arg);
            Py_DECREF(partial);
            return -1;
        }
        *out = buf_take(st, buf, self->n, 1);
        break;
    default: {          /* K_READUNTIL, K_READLINE: the separator in arg */
        Py_ssize_t seplen = PyBytes_GET_SIZE(self->arg), isep;
        for (;;) {
            if (len - self->offset >= seplen) {
                isep = buf_find(buf, self->arg, self->offset);
                if (isep == -2)
                    return -1;
                if (isep != -1)
                    break;
                self->offset = len + 1 - seplen;
                if ((limit = attr(reader, rd, st->str_s_limit)) == NULL)
                    return -1;
                int above = above_limit(self->offset, limit, 1);
                if (above != 0)
                    return above < 0 ? -1 : raise_overrun(
                        st, "Separator is not found, and chunk exceed the limit",
                        self->offset);
            }
            /* A whole separator may have come with the EOF: checked after
             * the buffer. */
            if ((eof = attr(reader, rd, st->str_s_eof)) == NULL)
                return -1;
            int e = truth(eof);
            if (e < 0)
                return -1;
            if (!e)
                return op_start_wait(self, rd, "readuntil") < 0 ? -1 : 1;
            PyObject *chunk = buf_bytes(buf);
            if (chunk == NULL)
                return -1;
            if (buf_clear(st, buf) == 0)
                raise_incomplete(st, chunk, Py_None);
            Py_DECREF(chunk);
            return -1;
        }
        if ((limit = attr(reader, rd, st->str_s_limit)) == NULL)
            return -1;
        int above = above_limit(isep, limit, 1);
        if (above != 0)
            return above < 0 ? -1 : raise_overrun(
                st, "Separator is found, but chunk is longer than limit", isep);
        *out = buf_take(st, buf, isep + seplen, 0);
        break;
    }
    }
    if (*out == NULL)
        return -1;
    if (maybe_resume(st, reader, rd) < 0) {
        Py_CLEAR(*out);
        return -1;
    }
    return 0;
}

/* readline(): readuntil(b"\n")'s errors as readline turns them into a
 * result (IncompleteReadError: its partial) or a ValueError (the line
 * past the limit dropped).  0 and *out, or -1 with the error to raise. */
static int
readline_error(OpObject *self, PyObject **out)
{
    tl_state *st = self->state;
    if (PyErr_ExceptionMatches(st->s_incomplete)) {
        PyObject *e = tl_err_get_raised();
        *out = PyObject_GetAttrString(e, "partial");
        Py_DECREF(e);
        return *out == NULL ? -1 : 0;
    }
    if (!PyErr_ExceptionMatches(st->s_overrun))
        return -1;
    PyObject *e = tl_err_get_raised(), *rd = NULL, *consumed = NULL, *args = NULL;
    PyObject *ve = NULL;
    if ((rd = obj_dict(self->owner)) == NULL)
        goto done;
    PyObject *buf = attr(self->owner, rd, st->str_s_buffer);
    if (buf == NULL || (consumed = PyObject_GetAttrString(e, "consumed")) == NULL)
        goto done;
    PyObject *starts = PyObject_CallMethod(buf, "startswith", "OO", self->arg, consumed);
    int s = starts == NULL ? -1 : truth(starts);
    Py_XDECREF(starts);
    if (s < 0)
        goto done;
    if (s) {
        PyObject *one = PyLong_FromLong(1), *end = NULL, *slice = NULL;
        int rc = -1;
        if (one != NULL && (end = PyNumber_Add(consumed, one)) != NULL &&
            (slice = PySlice_New(NULL, end, NULL)) != NULL)
            rc = PyObject_DelItem(buf, slice);
        Py_XDECREF(one);
        Py_XDECREF(end);
        Py_XDECREF(slice);
        if (rc < 0)
            goto done;
    }
    else if (buf_clear(st, buf) < 0)
        goto done;
    if (maybe_resume(st, self->owner, rd) < 0 ||
        (args = PyObject_GetAttrString(e, "args")) == NULL)
        goto done;
    PyObject *first = PySequence_GetItem(args, 0);
    if (first == NULL)
        goto done;
    ve = PyObject_CallOneArg(PyExc_ValueError, first);
    Py_DECREF(first);
    if (ve != NULL) {
        /* raised inside `except LimitOverrunError as e:` */
        PyException_SetContext(ve, Py_NewRef(e));
        PyErr_SetObject(PyExc_ValueError, ve);
    }
done:
    Py_XDECREF(ve);
    Py_XDECREF(args);
    Py_XDECREF(consumed);
    Py_XDECREF(rd);
    Py_DECREF(e);
    return -1;
}

/* Is the call ordinary enough for C?  0: asyncio's own coroutine runs it.
 * *buf: the reader's buffer (reads; borrowed from d). */
static int
op_fast(OpObject *self, PyObject *d, PyObject **bufp)
{
    tl_state *st = self->state;
    if (self->kind == K_DRAIN_HELPER) {
        /* _drain_helper(): nothing to wait for -- the connection neither
         * lost nor paused (asyncio's own raises or waits otherwise). */
        int ok = is_protocol(st, self->owner);
        if (ok <= 0)
            return ok;
        PyObject *lost = PyDict_GetItemWithError(d, st->str_s_connection_lost);
        PyObject *paused = PyDict_GetItemWithError(d, st->str_s_paused);
        return PyErr_Occurred() ? -1 : lost == Py_False && paused == Py_False;
    }
    int ok = is_reader(st, self->owner);
    if (ok <= 0)
        return ok;
    PyObject *exc = PyDict_GetItemWithError(d, st->str_s_exception);
    PyObject *buf = PyDict_GetItemWithError(d, st->str_s_buffer);
    if (exc != Py_None || buf == NULL || !PyByteArray_CheckExact(buf))
        return PyErr_Occurred() ? -1 : 0;
    *bufp = buf;
    switch (self->kind) {
    case K_READ:
    case K_READEXACTLY:
        if (!PyLong_CheckExact(self->arg))
            return 0;
        self->n = PyLong_AsSsize_t(self->arg);
        if (self->n == -1 && PyErr_Occurred()) {
            /* A huge n: the Python method's business. */
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        return self->n >= 0;
    case K_READUNTIL:
        return PyBytes_CheckExact(self->arg) && PyBytes_GET_SIZE(self->arg) > 0;
    default:
        return 1;
    }
}

/* asyncio's coroutine for this call: its function with the same
 * arguments (nothing has happened yet, so it starts where we would). */
/* Before asyncio's own _drain_helper() runs on protocol: a deque in
 * _drain_waiters again if it holds the empty-tuple placeholder (see the
 * top).  -1: error. */
static int
real_drain_waiters(tl_state *st, PyObject *protocol)
{
    PyObject *d = PyObject_GenericGetDict(protocol, NULL);
    if (d == NULL)
        return -1;
    PyObject *w = PyDict_GetItemWithError(d, st->str_s_drain_waiters);
    int rc = 0;
    if (w == NULL && PyErr_Occurred())
        rc = -1;
    else if (w != NULL && PyTuple_CheckExact(w) && PyTuple_GET_SIZE(w) == 0) {
        PyObject *q = PyObject_CallNoArgs(st->s_deque);
        rc = q == NULL ? -1 : PyDict_SetItem(d, st->str_s_drain_waiters, q);
        Py_XDECREF(q);
    }
    Py_DECREF(d);
    return rc;
}

static PyObject *
op_delegate(OpObject *self)
{
    if (self->kind == K_DRAIN_HELPER && real_drain_waiters(self->state, self->owner) < 0)
        return NULL;
    PyObject *fn = PyTuple_GET_ITEM(self->state->s_originals, self->kind);
    PyObject *args[2] = {self->owner, self->arg};
    Py_ssize_t nargs = 1;
    if (self->kind == K_READ || self->kind == K_READEXACTLY || self->kind == K_READUNTIL)
        nargs = 2;
    return PyObject_Vectorcall(fn, args, nargs, NULL);
}

/* Send value into (or, with exc, throw exc into: taken over) the
 * sub-iterator: PYGEN_NEXT/RETURN with *res, or PYGEN_ERROR. */
static PySendResult
sub_send(PyObject *sub, PyObject *value, PyObject *exc, PyObject **res)
{
    if (exc == NULL)
        return PyIter_Send(sub, value, res);
    PyObject *meth = PyObject_GetAttrString(sub, "throw");
    if (meth == NULL) {
        Py_DECREF(exc);
        *res = NULL;
        return PYGEN_ERROR;
    }
    *res = PyObject_CallOneArg(meth, exc);
    Py_DECREF(meth);
    Py_DECREF(exc);
    if (*res != NULL)
        return PYGEN_NEXT;
    if (!PyErr_ExceptionMatches(PyExc_StopIteration))
        return PYGEN_ERROR;
    PyObject *stop = tl_err_get_raised();
    *res = PyObject_GetAttrString(stop, "value");
    Py_DECREF(stop);
    return *res == NULL ? PYGEN_ERROR : PYGEN_RETURN;
}

/* After the wait (or when it is abandoned): finally: self._waiter = None. */
static int
op_end_wait(OpObject *self, PyObject **rd)
{
    Py_CLEAR(self->sub);
    if (*rd == NULL && (*rd = obj_dict(self->owner)) == NULL)
        return -1;
    return PyDict_SetItem(*rd, self->state->str_s_waiter, Py_None);
}

/* One step of the operation: send value, or throw exc (a new reference
 * taken over).  *res: what to yield (PYGEN_NEXT) or the result. */
static PySendResult
op_step(OpObject *self, PyObject *value, PyObject *exc, PyObject **res)
{
    *res = NULL;
    PySendResult r;
    PyObject *d = NULL, *buf = NULL;    /* the owner's __dict__, _buffer */
    switch (self->phase) {
    case OP_DONE:
        Py_XDECREF(exc);
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return PYGEN_ERROR;
    case OP_NEW:
        if (exc != NULL) {
            /* thrown into before it started: it ends with that -- on 3.11
             * a StopIteration so thrown leaves a coroutine as RuntimeError
             * (PEP 479); from 3.12 it comes out as it is */
            self->phase = OP_DONE;
#if PY_VERSION_HEX < 0x030C0000
            if (PyObject_TypeCheck(exc, (PyTypeObject *)PyExc_StopIteration)) {
                PyObject *rt = PyObject_CallFunction(
                    PyExc_RuntimeError, "s", "coroutine raised StopIteration");
                if (rt != NULL) {
                    PyException_SetCause(rt, Py_NewRef(exc));
                    PyException_SetContext(rt, exc);    /* exc's reference */
                    PyErr_SetObject(PyExc_RuntimeError, rt);
                    Py_DECREF(rt);
                }
                else
                    Py_DECREF(exc);
                return PYGEN_ERROR;
            }
#endif
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
            return PYGEN_ERROR;
        }
        if (value != Py_None) {
            /* a coroutine stays unstarted (and can still be started) */
            PyErr_SetString(PyExc_TypeError,
                            "can't send non-None value to a just-started coroutine");
            return PYGEN_ERROR;
        }
        if ((d = obj_dict(self->owner)) == NULL)
            goto error;
        int fast = op_fast(self, d, &buf);
        if (fast < 0)
            goto error;
        if (!fast) {
            Py_DECREF(d);
            TL_ATOMIC_ADD(&self->state->s_ops_python, 1);
            self->sub = op_delegate(self);
            if (self->sub == NULL)
                goto error_nodict;
            self->phase = OP_DELEGATED;
            return op_step(self, Py_None, NULL, res);
        }
        TL_ATOMIC_ADD(&self->state->s_ops_c, 1);
        if (self->kind == K_DRAIN_HELPER) {
            Py_DECREF(d);
            self->phase = OP_DONE;
            *res = Py_NewRef(Py_None);
            return PYGEN_RETURN;
        }
        self->phase = OP_RUNNING;
        break;
    case OP_DELEGATED:
        r = sub_send(self->sub, value, exc, res);
        if (r != PYGEN_NEXT) {
            Py_CLEAR(self->sub);
            self->phase = OP_DONE;
        }
        return r;
    case OP_WAITING:
        self->phase = OP_RUNNING;
        r = sub_send(self->sub, value, exc, res);
        if (r == PYGEN_NEXT) {
            self->phase = OP_WAITING;
            return r;
        }
        /* the await is over, either way: finally: self._waiter = None */
        Py_CLEAR(*res);
        if (r == PYGEN_ERROR) {
            PyObject *err = tl_err_get_raised();
            if (op_end_wait(self, &d) == 0)
                tl_err_set_raised(err);
            else
                Py_XDECREF(err);
            goto error;
        }
        if (op_end_wait(self, &d) < 0)
            goto error;
        break;
    default:
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        Py_XDECREF(exc);
        return PYGEN_ERROR;
    }
    /* OP_RUNNING: on until the next wait or the end. */
    for (;;) {
        if (d == NULL && (d = obj_dict(self->owner)) == NULL)
            goto error;
        PyObject *out = NULL;
        int rc = op_read_run(self, d, buf, &out);
        buf = NULL;
        if (rc < 0)
            goto error;
        if (rc == 0) {
            Py_DECREF(d);
            self->phase = OP_DONE;
            *res = out;
            return PYGEN_RETURN;
        }
        /* a wait began: its first step yields the future */
        r = PyIter_Send(self->sub, Py_None, res);
        if (r == PYGEN_NEXT) {
            Py_DECREF(d);
            return r;
        }
        Py_CLEAR(*res);
        self->phase = OP_RUNNING;
        PyObject *err = r == PYGEN_ERROR ? tl_err_get_raised() : NULL;
        int ended = op_end_wait(self, &d);
        if (err != NULL && ended == 0)
            tl_err_set_raised(err);
        else
            Py_XDECREF(err);
        if (r == PYGEN_ERROR || ended < 0)
            goto error;
    }
error:
    Py_XDECREF(d);
error_nodict:
    self->phase = OP_DONE;
    Py_CLEAR(self->sub);
    if (self->kind == K_READLINE && readline_error(self, res) == 0)
        return PYGEN_RETURN;
    return PYGEN_ERROR;
}

static PySendResult
op_am_send(OpObject *self, PyObject *arg, PyObject **result)
{
    return op_step(self, arg, NULL, result);
}

/* The end of a send()/throw() step as a coroutine's own methods give it:
 * the yielded object, or NULL with StopIteration(result) (iternext: no
 * exception at all for a result of None, as iterators end). */
static PyObject *
op_step_out(OpObject *self, PySendResult r, PyObject *res, int iternext)
{
    if (r != PYGEN_RETURN)
        return r == PYGEN_NEXT ? res : NULL;
    if (res == Py_None) {
        if (!iternext)
            PyErr_SetNone(PyExc_StopIteration);
    }
    else
        tl_set_stop_iteration_value(&self->state->stop_iteration, res);
    Py_DECREF(res);
    return NULL;
}

static PyObject *
op_send(OpObject *self, PyObject *arg)
{
    PyObject *res;
    PySendResult r = op_step(self, arg, NULL, &res);
    return op_step_out(self, r, res, 0);
}

/* What the interpreter's SEND calls from 3.12 when a coroutine awaits this
 * (3.11's: am_send). */
static PyObject *
op_iternext(OpObject *self)
{
    PyObject *res;
    PySendResult r = op_step(self, Py_None, NULL, &res);
    return op_step_out(self, r, res, 1);
}

/* throw(exc) / throw(type[, value[, traceback]]) as a coroutine takes it. */
static PyObject *
op_throw(OpObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : NULL;
    PyObject *tb = nargs > 2 ? args[2] : NULL, *exc;
    if (tb == Py_None)
        tb = NULL;
    if (tb != NULL && !PyTraceBack_Check(tb)) {
        PyErr_SetString(PyExc_TypeError, "throw() third argument must be a traceback object");
        return NULL;
    }
    if (PyExceptionInstance_Check(typ)) {
        if (val != NULL && val != Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "instance exception may not have a separate value");
            return NULL;
        }
        exc = Py_NewRef(typ);
    }
    else if (PyExceptionClass_Check(typ)) {
        PyErr_SetObject(typ, val);
        exc = tl_err_get_raised();
        if (exc == NULL)
            return NULL;
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "exceptions must be classes or instances deriving from "
                     "BaseException, not %s", Py_TYPE(typ)->tp_name);
        return NULL;
    }
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);
    PyObject *res;
    PySendResult r = op_step(self, Py_None, exc, &res);
    return op_step_out(self, r, res, 0);
}

/* close(): GeneratorExit into the wait (its finally runs), or nothing. */
static PyObject *
op_close(OpObject *self, PyObject *Py_UNUSED(ignored))
{
    int phase = self->phase;
    self->phase = OP_DONE;
    if (self->sub == NULL)
        Py_RETURN_NONE;
    PyObject *sub = self->sub;
    self->sub = NULL;
    PyObject *r = PyObject_CallMethodNoArgs(sub, self->state->str_close);
    Py_DECREF(sub);
    if (phase == OP_WAITING) {
        PyObject *err = r == NULL ? tl_err_get_raised() : NULL;
        PyObject *rd = obj_dict(self->owner);
        int rc = rd == NULL ? -1 : PyDict_SetItem(rd, self->state->str_s_waiter, Py_None);
        Py_XDECREF(rd);
        if (rc < 0) {
            Py_XDECREF(err);
            Py_XDECREF(r);
            return NULL;
        }
        tl_err_set_raised(err);
    }
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyObject *
op_await(OpObject *self)
{
    return Py_NewRef(self);
}

static PyObject *
op_repr(OpObject *self)
{
    static const char *const phases[] = {"not started", "running", "waiting",
                                          "running asyncio's coroutine", "done"};
    return PyUnicode_FromFormat("<%s awaitable (tideloop) %s>", kind_qualname[self->kind],
                                phases[self->phase]);
}

static PyObject *
op_get_qualname(OpObject *self, void *Py_UNUSED(c))
{
    return PyUnicode_FromString(kind_qualname[self->kind]);
}

static PyObject *
op_get_name(OpObject *self, void *Py_UNUSED(c))
{
    return PyUnicode_FromString(strchr(kind_qualname[self->kind], '.') + 1);
}

/* The awaited future or coroutine, as a coroutine's cr_await says. */
static PyObject *
op_get_await(OpObject *self, void *Py_UNUSED(c))
{
    if (self->sub == NULL)
        Py_RETURN_NONE;
    if (self->phase == OP_WAITING) {
        PyObject *rd = obj_dict(self->owner);
        if (rd == NULL)
            return NULL;
        PyObject *w = PyDict_GetItemWithError(rd, self->state->str_s_waiter);
        Py_XINCREF(w);
        Py_DECREF(rd);
        return w != NULL || PyErr_Occurred() ? w : Py_NewRef(Py_None);
    }
    return Py_NewRef(self->sub);
}

/* No Python frame runs a C read: None, as a finished coroutine says.  Code
 * that walks cr_await chains (asyncio.graph on 3.14+, debuggers) reads
 * cr_frame on every link that has cr_await. */
static PyObject *
op_get_frame(OpObject *Py_UNUSED(self), void *Py_UNUSED(c))
{
    Py_RETURN_NONE;
}

static int
op_traverse(OpObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    Py_VISIT(self->arg);
    Py_VISIT(self->sub);
    return 0;
}

static int
op_clear(OpObject *self)
{
    Py_CLEAR(self->owner);
    Py_CLEAR(self->arg);
    Py_CLEAR(self->sub);
    return 0;
}

/* As a coroutine object: dropped before it ran, it says so; dropped while
 * waiting, it is closed (its finally runs). */
static void
op_finalize(OpObject *self)
{
    self->finalized = 1;
    PyObject *exc = tl_err_get_raised();
    if (self->phase == OP_NEW) {
        if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "coroutine '%s' was never awaited",
                             kind_qualname[self->kind]) < 0)
            PyErr_WriteUnraisable((PyObject *)self);
    }
    else if (self->sub != NULL && self->owner != NULL) {
        PyObject *r = op_close(self, NULL);
        if (r == NULL)
            PyErr_WriteUnraisable((PyObject *)self);
        Py_XDECREF(r);
    }
    tl_err_set_raised(exc);
}

/* Ended ops are recycled (GIL builds: any thread may drop one on
 * free-threaded builds); one whose finalizer ran is not, since the
 * interpreter would not run it again for a new life. */
static void
op_dealloc(OpObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    tl_state *st = self->state;
    if (self->phase == OP_NEW || self->sub != NULL) {
        if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
            return;
    }
    PyObject_GC_UnTrack(self);
    op_clear(self);
    if (!TL_FREE_THREADED && !self->finalized && !st->stream_op_freelist_closed &&
        st->stream_op_nfree < TL_STREAM_OP_FREELIST_MAX) {
        self->next_free = st->stream_op_freelist;
        st->stream_op_freelist = self;
        st->stream_op_nfree++;
    }
    else {
        tp->tp_free(self);
    }
    Py_DECREF(tp);
}

/* The module is going: the recycled ops are freed (while their type
 * lives: PyObject_GC_Del reads it). */
void
tl_streams_free_list(tl_state *st)
{
    st->stream_op_freelist_closed = 1;
    while (st->stream_op_freelist != NULL) {
        OpObject *op = st->stream_op_freelist;
        st->stream_op_freelist = op->next_free;
        Py_SET_TYPE(op, st->StreamOpType);
        PyObject_GC_Del(op);
    }
    st->stream_op_nfree = 0;
    st->storage_pool.closed = 1;
    tl_storage_pool_clear(&st->storage_pool);
}

static PyMethodDef op_methods[] = {
    {"send", (PyCFunction)op_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))op_throw, METH_FASTCALL, NULL},
    {"close", (PyCFunction)op_close, METH_NOARGS, NULL},
    {NULL}
};

static PyGetSetDef op_getset[] = {
    {"__qualname__", (getter)op_get_qualname, NULL, NULL, NULL},
    {"__name__", (getter)op_get_name, NULL, NULL, NULL},
    {"cr_await", (getter)op_get_await, NULL, NULL, NULL},
    {"cr_frame", (getter)op_get_frame, NULL, NULL, NULL},
    {NULL}
};

static PyType_Slot op_slots[] = {
    {Py_tp_dealloc, op_dealloc},
    {Py_tp_finalize, op_finalize},
    {Py_tp_traverse, op_traverse},
    {Py_tp_clear, op_clear},
    {Py_tp_repr, op_repr},
    {Py_tp_iter, op_await},
    {Py_tp_iternext, op_iternext},
    {Py_am_await, op_await},
    {Py_am_send, op_am_send},
    {Py_tp_methods, op_methods},
    {Py_tp_getset, op_getset},
    {Py_tp_doc, "An awaited asyncio stream method, run by tideloop in C."},
    {0, NULL}
};

PyType_Spec tl_stream_op_spec = {
    .name = "tideloop.StreamOp",
    .basicsize = sizeof(OpObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = op_slots,
};

static PyObject *
op_new(tl_state *st, int kind, PyObject *owner, PyObject *arg)
{
    OpObject *self = TL_FREE_THREADED ? NULL : st->stream_op_freelist;
    if (self != NULL) {
        st->stream_op_freelist = self->next_free;
        st->stream_op_nfree--;
        PyObject_Init((PyObject *)self, st->StreamOpType);
    }
    else if ((self = PyObject_GC_New(OpObject, st->StreamOpType)) == NULL)
        return NULL;
    memset((char *)self + sizeof(PyObject), 0, sizeof(*self) - sizeof(PyObject));
    self->owner = Py_NewRef(owner);
    self->arg = Py_XNewRef(arg);
    self->state = st;
    self->kind = kind;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* ---- the methods put in the reader's and the protocol's __dict__ ---- */

/* Five to a connection, so as small as it goes (48 bytes with the GC
 * header): the kind is told by which vectorcall function it has, the state
 * comes from the type (method_kind, method_state). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;   /* method_calls[kind] */
    PyObject *ref;               /* a weak reference to the reader or protocol */
} MethodObject;

static vectorcallfunc const method_calls[K_COUNT];

static inline int
method_kind(MethodObject *self)
{
    int k = 0;
    while (k < K_COUNT - 1 && method_calls[k] != self->vectorcall)
        k++;
    return k;
}

static inline tl_state *
method_state(MethodObject *self)
{
    return PyType_GetModuleState(Py_TYPE(self));
}

/* asyncio's method on owner with these arguments: its coroutine, its
 * result or the TypeError its signature gives. */
static PyObject *
method_python(MethodObject *self, PyObject *owner, PyObject *const *args,
              Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8], **all = small;
    int kind = method_kind(self);
    tl_state *st = method_state(self);
    if (kind == K_DRAIN_HELPER && real_drain_waiters(st, owner) < 0)
        return NULL;
    if (total + 1 > (Py_ssize_t)(sizeof(small) / sizeof(small[0]))) {
        all = PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
        if (all == NULL)
            return PyErr_NoMemory();
    }
    all[0] = owner;
    for (Py_ssize_t i = 0; i < total; i++)
        all[i + 1] = args[i];
    PyObject *fn = PyTuple_GET_ITEM(st->s_originals, kind);
    PyObject *r = PyObject_Vectorcall(fn, all, (size_t)nargs + 1, kwnames);
    if (all != small)
        PyMem_Free(all);
    return r;
}

static PyObject *
method_call(MethodObject *self, int kind, PyObject *const *args, size_t nargsf,
            PyObject *kwnames)
{
    tl_state *st = method_state(self);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *owner, *r;
    int alive = tl_weakref_get(self->ref, &owner);
    if (alive <= 0) {
        if (alive == 0)
            PyErr_SetString(PyExc_ReferenceError,
                            "weakly-referenced object no longer exists");
        return NULL;
    }
    int ok = kwnames == NULL;
    PyObject *arg = NULL;
    switch (kind) {
    case K_READ:
    case K_READUNTIL:
        ok = ok && nargs <= 1;
        if (ok)
            arg = nargs ? args[0] : kind == K_READ ? st->s_minus_one : st->s_newline;
        break;
    case K_READEXACTLY:
        ok = ok && nargs == 1;
        if (ok)
            arg = args[0];
        break;
    case K_READLINE:
        ok = ok && nargs == 0;
        arg = st->s_newline;
        break;
    default:
        ok = ok && nargs == 0;
    }
    if (!ok)
        r = method_python(self, owner, args, nargs, kwnames);
    else
        r = op_new(st, kind, owner, arg);
    Py_DECREF(owner);
    return r;
}

static PyObject *
method_call_read(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return method_call((MethodObject *)self, K_READ, args, nargsf, kwnames);
}

static PyObject *
method_call_readline(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return method_call((MethodObject *)self, K_READLINE, args, nargsf, kwnames);
}

static PyObject *
method_call_readexactly(PyObject *self, PyObject *const *args, size_t nargsf,
                        PyObject *kwnames)
{
    return method_call((MethodObject *)self, K_READEXACTLY, args, nargsf, kwnames);
}

static PyObject *
method_call_readuntil(PyObject *self, PyObject *const *args, size_t nargsf,
                      PyObject *kwnames)
{
    return method_call((MethodObject *)self, K_READUNTIL, args, nargsf, kwnames);
}

static PyObject *
method_call_drain_helper(PyObject *self, PyObject *const *args, size_t nargsf,
                         PyObject *kwnames)
{
    return method_call((MethodObject *)self, K_DRAIN_HELPER, args, nargsf, kwnames);
}

static vectorcallfunc const method_calls[K_COUNT] = {
    method_call_read, method_call_readline, method_call_readexactly,
    method_call_readuntil, method_call_drain_helper,
};

static PyObject *
method_get_self(MethodObject *self, void *Py_UNUSED(c))
{
    PyObject *owner;
    int alive = tl_weakref_get(self->ref, &owner);
    return alive < 0 ? NULL : alive ? owner : Py_NewRef(Py_None);
}

static PyObject *
method_get_func(MethodObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(PyTuple_GET_ITEM(method_state(self)->s_originals, method_kind(self)));
}

static PyObject *
method_get_qualname(MethodObject *self, void *Py_UNUSED(c))
{
    return PyUnicode_FromString(kind_qualname[method_kind(self)]);
}

static PyObject *
method_get_name(MethodObject *self, void *Py_UNUSED(c))
{
    return PyUnicode_FromString(strchr(kind_qualname[method_kind(self)], '.') + 1);
}

/* They answer inspect's and asyncio's "is it a coroutine function?" as
 * asyncio's do (3.12+: inspect's marker; asyncio's own up to 3.13). */
static PyObject *
method_marker(MethodObject *self, int which)
{
    PyObject *m = PyTuple_GET_ITEM(method_state(self)->s_markers, which);
    if (m == NULL || m == Py_None) {
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'",
                     "tideloop.StreamMethod", which ? "_is_coroutine" : "_is_coroutine_marker");
        return NULL;
    }
    return Py_NewRef(m);
}

static PyObject *
method_get_inspect_marker(MethodObject *self, void *Py_UNUSED(c))
{
    return method_marker(self, 0);
}

static PyObject *
method_get_asyncio_marker(MethodObject *self, void *Py_UNUSED(c))
{
    return method_marker(self, 1);
}

static PyObject *
method_repr(MethodObject *self)
{
    PyObject *owner;
    int alive = tl_weakref_get(self->ref, &owner);
    if (alive < 0)
        return NULL;
    if (!alive)
        return PyUnicode_FromFormat("<tideloop method %s of a dead object>",
                                    kind_qualname[method_kind(self)]);
    PyObject *r = PyUnicode_FromFormat("<tideloop method %s of %R>",
                                       kind_qualname[method_kind(self)], owner);
    Py_DECREF(owner);
    return r;
}

/* GC objects, though what they hold (a weak reference without a callback,
 * their type) cannot lead back to them: untracked, an isolated interpreter
 * of 3.13 destroyed after serving streams left a task's graph behind under
 * memcheck (tools/interpreters_check.sh); 16 bytes each is the price. */
static void
method_dealloc(MethodObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->ref);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static int
method_traverse(MethodObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->ref);
    return 0;
}

static int
method_clear(MethodObject *self)
{
    Py_CLEAR(self->ref);
    return 0;
}

static PyGetSetDef method_getset[] = {
    {"__self__", (getter)method_get_self, NULL, NULL, NULL},
    {"__func__", (getter)method_get_func, NULL, NULL, NULL},
    {"__qualname__", (getter)method_get_qualname, NULL, NULL, NULL},
    {"__name__", (getter)method_get_name, NULL, NULL, NULL},
    {"_is_coroutine_marker", (getter)method_get_inspect_marker, NULL, NULL, NULL},
    {"_is_coroutine", (getter)method_get_asyncio_marker, NULL, NULL, NULL},
    {NULL}
};

static PyMemberDef method_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(MethodObject, vectorcall),
     READONLY, NULL},
    {NULL}
};

static PyType_Slot method_slots[] = {
    {Py_tp_dealloc, method_dealloc},
    {Py_tp_traverse, method_traverse},
    {Py_tp_clear, method_clear},
    {Py_tp_repr, method_repr},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_getset, method_getset},
    {Py_tp_members, method_members},
    {Py_tp_doc, "An asyncio stream method run by tideloop in C (asyncio's own "
                "is __func__)."},
    {0, NULL}
};

PyType_Spec tl_stream_method_spec = {
    .name = "tideloop.StreamMethod",
    .basicsize = sizeof(MethodObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = method_slots,
};

/* Put the methods kinds [first, end) in obj's __dict__ d, unless one of
 * those names holds something else already (the instance's own: then none
 * is put).  1: put (or there already), 0: left alone, -1: error. */
static int
install_methods(tl_state *st, PyObject *obj, PyObject *d, int first, int end)
{
    for (int k = first; k < end; k++) {
        PyObject *v = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(st->s_method_names, k));
        if (v == NULL && PyErr_Occurred())
            return -1;
        if (v != NULL && !Py_IS_TYPE(v, st->StreamMethodType))
            return 0;
    }
    PyObject *ref = PyWeakref_NewRef(obj, NULL);
    if (ref == NULL)
        return -1;
    int rc = 1;
    for (int k = first; k < end && rc == 1; k++) {
        PyObject *name = PyTuple_GET_ITEM(st->s_method_names, k);
        MethodObject *m = PyObject_GC_New(MethodObject, st->StreamMethodType);
        if (m == NULL) {
            rc = -1;
            break;
        }
        m->vectorcall = method_calls[k];
        m->ref = Py_NewRef(ref);
        PyObject_GC_Track(m);
        if (PyDict_SetItem(d, name, (PyObject *)m) < 0)
            rc = -1;
        Py_DECREF(m);
    }
    Py_DECREF(ref);
    return rc;
}

/* Is d[name] something of the instance's own (not one of these methods)?
 * -1: error. */
static int
foreign(tl_state *st, PyObject *d, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(d, name);
    return v != NULL ? !Py_IS_TYPE(v, st->StreamMethodType) : PyErr_Occurred() ? -1 : 0;
}

/* The protocol's _drain_helper in its __dict__ d, which StreamWriter.drain()
 * awaits: found through the protocol, handed to the transport, whoever
 * made the writer.  Left alone when the instance has its own. */
static int
install_drain_helper(tl_state *st, PyObject *protocol, PyObject *d)
{
    int rc = foreign(st, d, st->str_drain_helper);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    rc = install_methods(st, protocol, d, K_DRAIN_HELPER, K_COUNT);
    if (rc > 0) {
        TL_ATOMIC_ADD(&st->s_drain_helpers, 1);
        /* asyncio's empty deque, 760 bytes, until something must wait */
        PyObject *w = PyDict_GetItemWithError(d, st->str_s_drain_waiters);
        if (w == NULL && PyErr_Occurred())
            return -1;
        if (w != NULL && Py_IS_TYPE(w, (PyTypeObject *)st->s_deque) && PyObject_Size(w) == 0) {
            PyObject *empty = PyTuple_New(0);
            int set = empty == NULL ? -1 : PyDict_SetItem(d, st->str_s_drain_waiters, empty);
            Py_XDECREF(empty);
            if (set < 0)
                return -1;
        }
    }
    return rc;
}

/* ---- TLS streams: tls.c's engine hands its plaintext over ---- */

/* The plaintext for SSLProtocol's app protocol: when that is asyncio's
 * StreamReaderProtocol over asyncio's StreamReader of this loop, the reader
 * is fed in C (its methods put in place on the first delivery).  1: done,
 * 0: the caller calls data_received(), -1: error. */
int
tl_streams_feed_app(LoopObject *loop, PyObject *protocol, const char *data, Py_ssize_t n)
{
    tl_state *st = loop->state;
    PyObject *pd = NULL, *reader = NULL, *rd = NULL;
    if (!TL_ATOMIC_GET(&st->streams_on) || loop->debug || n == 0 ||
        !Py_IS_TYPE(protocol, (PyTypeObject *)st->s_protocol_type))
        return 0;
    int rc = is_protocol(st, protocol);
    if (rc <= 0 || (pd = obj_dict(protocol)) == NULL)
        return rc;
    if ((rc = shadowed(pd, st->str_data_received)) != 0) {
        rc = rc < 0 ? -1 : 0;
        goto done;
    }
    PyObject *wr = PyDict_GetItemWithError(pd, st->str_s_reader_wr);
    if (wr == NULL || !PyWeakref_CheckRefExact(wr)) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if ((rc = tl_weakref_get(wr, &reader)) <= 0) {
        rc = rc < 0 ? -1 : 1;        /* no reader: the data goes nowhere */
        goto done;
    }
    if ((rc = is_reader(st, reader)) <= 0 || (rd = obj_dict(reader)) == NULL) {
        rc = rd == NULL && rc > 0 ? -1 : rc;
        goto done;
    }
    PyObject *rloop = PyDict_GetItemWithError(rd, st->str_t_loop);
    if (rloop != (PyObject *)loop || (rc = shadowed(rd, st->str_feed_data)) != 0) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    PyObject *have = PyDict_GetItemWithError(rd, PyTuple_GET_ITEM(st->s_method_names, K_READ));
    if (have == NULL) {
        if (PyErr_Occurred() || (rc = install_methods(st, reader, rd, 0, K_DRAIN_HELPER)) < 0 ||
            install_drain_helper(st, protocol, pd) < 0) {
            rc = -1;
            goto done;
        }
        if (rc > 0)
            TL_ATOMIC_ADD(&st->s_adopted, 1);
    }
    rc = feed_data(st, reader, rd, data, n);
done:
    Py_XDECREF(pd);
    Py_XDECREF(reader);
    Py_XDECREF(rd);
    return rc;
}

/* ---- adoption: a stream transport's new protocol ---- */

/* The transport's protocol is about to be `protocol`: *cproto is a new
 * feeder when it is asyncio's StreamReaderProtocol over asyncio's
 * StreamReader of this loop (whose methods are then put in place), else
 * NULL. */
int
tl_streams_adopt(LoopObject *loop, PyObject *protocol, PyObject **cproto)
{
    tl_state *st = loop->state;
    PyObject *pd = NULL, *reader = NULL, *rd = NULL;
    *cproto = NULL;
    if (!TL_ATOMIC_GET(&st->streams_on) || loop->debug)
        return 0;
    int rc = is_protocol(st, protocol);
    if (rc <= 0)
        return rc;
    if ((pd = obj_dict(protocol)) == NULL)
        return -1;
    /* Methods set on the instances themselves are theirs to run (checked
     * once: the core does not look again for each call). */
    if ((rc = shadowed(pd, st->str_data_received)) != 0 ||
        (rc = foreign(st, pd, st->str_drain_helper)) != 0) {
        rc = rc < 0 ? -1 : 0;
        goto done;
    }
    PyObject *wr = PyDict_GetItemWithError(pd, st->str_s_reader_wr);
    if (wr == NULL || !PyWeakref_CheckRefExact(wr)) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if ((rc = tl_weakref_get(wr, &reader)) <= 0 || (rc = is_reader(st, reader)) <= 0)
        goto done;
    if ((rd = obj_dict(reader)) == NULL) {
        rc = -1;
        goto done;
    }
    PyObject *rloop = PyDict_GetItemWithError(rd, st->str_t_loop);
    if (rloop != (PyObject *)loop) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if ((rc = shadowed(rd, st->str_feed_data)) != 0 ||
        (rc = shadowed(rd, st->str_exception)) != 0) {
        rc = rc < 0 ? -1 : 0;
        goto done;
    }
    if ((rc = install_methods(st, reader, rd, 0, K_DRAIN_HELPER)) <= 0 ||
        (rc = install_drain_helper(st, protocol, pd)) < 0)
        goto done;
    FeederObject *f = PyObject_GC_New(FeederObject, st->StreamFeederType);
    if (f == NULL) {
        rc = -1;
        goto done;
    }
    f->head.feed = feeder_feed;
    f->head.feed_error = "Fatal error: protocol.data_received() call failed.";
    f->head.detach = feeder_detach;
    f->loop = (LoopObject *)Py_NewRef((PyObject *)loop);
    f->protocol = Py_NewRef(protocol);
    f->reader_ref = Py_NewRef(wr);
    TL_ATOMIC_ADD(&st->s_adopted, 1);
    PyObject_GC_Track(f);
    *cproto = (PyObject *)f;
    rc = 0;
done:
    Py_XDECREF(pd);
    Py_XDECREF(reader);
    Py_XDECREF(rd);
    return rc < 0 ? -1 : 0;
}

/* ---- setup (tideloop._streams) ---- */

/* _streams_setup(on, StreamReader, StreamReaderProtocol, reader_check,
 *                protocol_check, originals, IncompleteReadError,
 *                LimitOverrunError,
 *                (inspect's coroutine mark, asyncio's _is_coroutine))
 * The checks are ((name, function), ...); originals are asyncio's function
 * per method kind (read, readline, readexactly, readuntil, _drain_helper). */
static PyObject *
streams_setup(PyObject *module, PyObject *args)
{
    tl_state *st = PyModule_GetState(module);
    int on;
    PyObject *rt, *pt, *rc, *pc, *orig, *inc, *over, *marks;
    if (!PyArg_ParseTuple(args, "pO!O!O!O!O!OOO!:_streams_setup", &on,
                          &PyType_Type, &rt, &PyType_Type, &pt,
                          &PyTuple_Type, &rc, &PyTuple_Type, &pc,
                          &PyTuple_Type, &orig, &inc, &over, &PyTuple_Type, &marks))
        return NULL;
    if (PyTuple_GET_SIZE(marks) != 2) {
        PyErr_SetString(PyExc_TypeError, "_streams_setup: two markers");
        return NULL;
    }
    PyObject *checks[2] = {rc, pc};
    for (int i = 0; i < 2; i++)
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(checks[i]); j++) {
            PyObject *pair = PyTuple_GET_ITEM(checks[i], j);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
                PyErr_SetString(PyExc_TypeError, "_streams_setup: checks are (name, function)");
                return NULL;
            }
        }
    if (PyTuple_GET_SIZE(orig) != K_COUNT || !PyExceptionClass_Check(inc) ||
        !PyExceptionClass_Check(over)) {
        PyErr_SetString(PyExc_TypeError, "_streams_setup: bad arguments");
        return NULL;
    }
    PyObject *names = PyTuple_New(K_COUNT);
    if (names == NULL)
        return NULL;
    for (int k = 0; k < K_COUNT; k++) {
        PyObject *name = PyUnicode_InternFromString(strchr(kind_qualname[k], '.') + 1);
        if (name == NULL) {
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, k, name);
    }
    if (st->s_minus_one == NULL &&
        ((st->s_minus_one = PyLong_FromLong(-1)) == NULL ||
         (st->s_newline = PyBytes_FromStringAndSize("\n", 1)) == NULL)) {
        Py_DECREF(names);
        return NULL;
    }
    PyObject *collections = PyImport_ImportModule("collections");
    PyObject *deque = collections ? PyObject_GetAttrString(collections, "deque") : NULL;
    Py_XDECREF(collections);
    if (deque == NULL || !PyType_Check(deque)) {
        if (deque != NULL)
            PyErr_SetString(PyExc_TypeError, "collections.deque is not a type");
        Py_XDECREF(deque);
        Py_DECREF(names);
        return NULL;
    }
    Py_XSETREF(st->s_deque, deque);
    Py_XSETREF(st->s_method_names, names);
    Py_XSETREF(st->s_markers, Py_NewRef(marks));
    PyObject *take = PyObject_GetAttrString((PyObject *)&PyByteArray_Type, "take_bytes");
    if (take == NULL) {
        /* bytearray.take_bytes() is new in 3.15. */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    Py_XSETREF(st->s_take_bytes, take);
    PyObject *fc = PyObject_GetAttrString(st->Future, "cancelled");
    PyObject *fs = fc ? PyObject_GetAttrString(st->Future, "set_result") : NULL;
    PyObject *lc = fs ? PyObject_GetAttr((PyObject *)st->LoopType, st->str_create_future) : NULL;
    if (lc == NULL) {
        Py_XDECREF(fc);
        Py_XDECREF(fs);
        return NULL;
    }
    Py_XSETREF(st->s_fut_cancelled, fc);
    Py_XSETREF(st->s_fut_set_result, fs);
    Py_XSETREF(st->s_loop_cf, lc);
    Py_XSETREF(st->s_reader_type, Py_NewRef(rt));
    Py_XSETREF(st->s_protocol_type, Py_NewRef(pt));
    Py_XSETREF(st->s_reader_check, Py_NewRef(rc));
    Py_XSETREF(st->s_protocol_check, Py_NewRef(pc));
    Py_XSETREF(st->s_originals, Py_NewRef(orig));
    Py_XSETREF(st->s_incomplete, Py_NewRef(inc));
    Py_XSETREF(st->s_overrun, Py_NewRef(over));
    TL_ATOMIC_SET(&st->s_reader_tag, 0u);
    TL_ATOMIC_SET(&st->s_protocol_tag, 0u);
    TL_ATOMIC_SET(&st->streams_on, on);
    Py_RETURN_NONE;
}

/* streams_fast_path() -> bool; set_streams_fast_path(on) -> previous. */
static PyObject *
streams_fast_path(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    tl_state *st = PyModule_GetState(module);
    return PyBool_FromLong(TL_ATOMIC_GET(&st->streams_on));
}

static PyObject *
set_streams_fast_path(PyObject *module, PyObject *arg)
{
    tl_state *st = PyModule_GetState(module);
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    if (on && st->s_originals == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tideloop._streams has not set up the fast path");
        return NULL;
    }
    return PyBool_FromLong(__atomic_exchange_n(&st->streams_on, on, __ATOMIC_RELAXED));
}

/* streams_stats() -> dict of the counts (tests, diagnostics). */
static PyObject *
streams_stats(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    tl_state *st = PyModule_GetState(module);
    return Py_BuildValue("{sKsKsKsKsKsi}",
                         "connections", (unsigned long long)TL_ATOMIC_GET(&st->s_adopted),
                         "drain_helpers", (unsigned long long)TL_ATOMIC_GET(&st->s_drain_helpers),
                         "calls_in_c", (unsigned long long)TL_ATOMIC_GET(&st->s_ops_c),
                         "calls_to_asyncio",
                         (unsigned long long)TL_ATOMIC_GET(&st->s_ops_python),
                         "feeds_to_asyncio",
                         (unsigned long long)TL_ATOMIC_GET(&st->s_feeds_python),
                         "storage_pooled", st->storage_pool.n);
}

const PyMethodDef tl_streams_module_methods[] = {
    {"streams_stats", streams_stats, METH_NOARGS,
     "Counts of asyncio streams' C data path since import: connections, drain_helpers, "
     "calls_in_c, calls_to_asyncio, feeds_to_asyncio; and storage_pooled, the "
     "readers' buffer storages kept for the next buffer that grows."},
    {"_streams_setup", streams_setup, METH_VARARGS, NULL},
    {"streams_fast_path", streams_fast_path, METH_NOARGS,
     "Whether new stream connections get asyncio streams' C data path."},
    {"set_streams_fast_path", set_streams_fast_path, METH_O,
     "set_streams_fast_path(on) -> previous: the C data path for new stream "
     "connections on or off."},
    {NULL}
};
