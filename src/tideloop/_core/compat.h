/* compat.h -- every CPython name outside the stable public C API that the
 * core uses, resolved in one place.
 *
 * Each entry says which interpreters it applies to and what replaces it
 * elsewhere; a missing name selects its fallback at compile time, never a
 * build error.  TL_COMPAT_ENTRIES lists them with the branch this build
 * took; module init exports the list as tideloop._core.compat, and
 * tests/compat/test_compat.py asserts the branch expected for the running
 * interpreter.  (The Python side's entries live in tideloop/_compat.py.)
 *
 * Layouts of CPython objects the core relies on (the Context object, the
 * thread state's context fields, asyncio's _FlowControlMixin slots) are
 * also verified at run time before use: see tl_context_init (handle.c) and
 * transport_base_class (module.c). */
#ifndef TIDELOOP_COMPAT_H
#define TIDELOOP_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* -- StopIteration carrying a value (a C awaitable's send() returning) --
 * From 3.12 the interpreter's SEND calls tp_iternext (or send()) of an
 * awaited object that is not a generator -- 3.11's used am_send -- so each
 * await of a C op that ends with a value raises StopIteration(value): an
 * exception and its args made and freed, about a thousand instructions,
 * more than a buffered readline() itself.  On 3.12+ with a GIL, *cache
 * keeps one StopIteration to raise again while nothing else holds it
 * (reference count 1), refitted as a new one is: value, args, and no
 * traceback, context, cause, notes or attributes left from the last time.
 * Only bytes up to TL_STOP_ITERATION_KEEP are carried so (the cache keeps
 * the last value alive until the next: bytes have no finalizer, and the
 * size is bounded); other values, free-threaded builds (threads share the
 * cache) and a cache held elsewhere get a new exception each time.
 * 3.11: _PyGen_SetStopIterationValue (cpython/genobject.h; seldom
 * reached: its SEND uses am_send). */
#define TL_STOP_ITERATION_KEEP 65536
#if PY_VERSION_HEX < 0x030C0000
#  define TL_COMPAT_STOP_ITERATION "private"
static inline int
tl_set_stop_iteration_value(PyObject **cache, PyObject *value)
{
    (void)cache;
    return _PyGen_SetStopIterationValue(value);
}
#else
#  ifdef Py_GIL_DISABLED
#    define TL_COMPAT_STOP_ITERATION "fallback"
#  else
#    define TL_COMPAT_STOP_ITERATION "reused"
#  endif
static inline int
tl_set_stop_iteration_value(PyObject **cache, PyObject *value)
{
#  ifndef Py_GIL_DISABLED
    PyObject *e = *cache;
    if (e != NULL && Py_REFCNT(e) == 1 && PyBytes_CheckExact(value)
            && PyBytes_GET_SIZE(value) <= TL_STOP_ITERATION_KEEP) {
        PyBaseExceptionObject *b = (PyBaseExceptionObject *)e;
        PyStopIterationObject *si = (PyStopIterationObject *)e;
        /* Out of the cache while refitted: dropping what it held may run
         * code that raises a StopIteration of its own. */
        *cache = NULL;
        PyObject *old[8] = {si->value, b->traceback, b->context, b->cause,
                            b->notes, b->dict, NULL, NULL};
        PyObject *args = b->args;
        if (args != NULL && PyTuple_CheckExact(args) && Py_REFCNT(args) == 1
                && PyTuple_GET_SIZE(args) == 1) {
            /* (value,) held by nothing else: refilled.  Only bytes go in
             * (no GC tracking needed); 3.14+ caches a tuple's hash. */
            old[6] = PyTuple_GET_ITEM(args, 0);
            PyTuple_SET_ITEM(args, 0, Py_NewRef(value));
#    if PY_VERSION_HEX >= 0x030E0000
            ((PyTupleObject *)args)->ob_hash = -1;
#    endif
        }
        else {
            old[7] = args;
            b->args = PyTuple_Pack(1, value);
            if (b->args == NULL) {
                b->args = old[7];
                *cache = e;
                return -1;
            }
        }
        si->value = Py_NewRef(value);
        b->traceback = b->context = b->cause = b->notes = b->dict = NULL;
        b->suppress_context = 0;
        for (int i = 0; i < 8; i++)
            Py_XDECREF(old[i]);
        if (*cache == NULL)
            *cache = Py_NewRef(e);
        PyErr_SetRaisedException(e);
        return 0;
    }
#  endif
    if (value == Py_None) {          /* StopIteration(), as a coroutine's */
        PyErr_SetNone(PyExc_StopIteration);
        return 0;
    }
    PyObject *fresh = PyObject_CallOneArg(PyExc_StopIteration, value);
    if (fresh == NULL)
        return -1;
#  ifdef Py_GIL_DISABLED
    (void)cache;
#  else
    if (PyBytes_CheckExact(value) && PyBytes_GET_SIZE(value) <= TL_STOP_ITERATION_KEEP)
        Py_XSETREF(*cache, Py_NewRef(fresh));
#  endif
    PyErr_SetRaisedException(fresh);
    return 0;
}
#endif

/* -- A type's short name (reprs, error messages) --
 * _PyType_Name is private on every version: our own copy of its one line
 * (the part of tp_name after the last dot) on all of them. */
#define TL_COMPAT_TYPE_NAME "own"
static inline const char *
tl_type_name(PyTypeObject *tp)
{
    const char *dot = strrchr(tp->tp_name, '.');
    return dot != NULL ? dot + 1 : tp->tp_name;
}

/* -- Hash of a double, as hash(float) (TimerHandle.__hash__) --
 * 3.11-3.15: _Py_HashDouble(obj, v) (cpython/pyhash.h), which hashes NaN by
 * the object's identity as hash(float('nan')) does.  Elsewhere: hash a
 * float object for finite values, the handle's identity for NaN. */
#if PY_VERSION_HEX < 0x03100000
#  define TL_COMPAT_HASH_DOUBLE "private"
static inline Py_hash_t
tl_hash_double(PyObject *owner, double v)
{
    return _Py_HashDouble(owner, v);
}
#else
#  define TL_COMPAT_HASH_DOUBLE "fallback"
static inline Py_hash_t
tl_hash_double(PyObject *owner, double v)
{
    if (v != v)
        return Py_HashPointer(owner);
    PyObject *f = PyFloat_FromDouble(v);
    if (f == NULL)
        return -1;
    Py_hash_t h = PyObject_Hash(f);
    Py_DECREF(f);
    return h;
}
#endif

/* -- Shrinking a fresh bytes object in place (reads into a bytes buffer) --
 * _PyBytes_Resize is declared in cpython/bytesobject.h on 3.11-3.15 (it is
 * the documented way to build a bytes object of unknown size).  Fallback:
 * a copy of the prefix. */
#if PY_VERSION_HEX < 0x03100000
#  define TL_COMPAT_BYTES_RESIZE "private"
static inline int
tl_bytes_resize(PyObject **b, Py_ssize_t n)
{
    return _PyBytes_Resize(b, n);
}
#else
#  define TL_COMPAT_BYTES_RESIZE "fallback"
static inline int
tl_bytes_resize(PyObject **b, Py_ssize_t n)
{
    PyObject *c = PyBytes_FromStringAndSize(PyBytes_AS_STRING(*b), n);
    Py_SETREF(*b, c);
    return c == NULL ? -1 : 0;
}
#endif

/* -- The pending exception as one object --
 * 3.12+: PyErr_GetRaisedException / PyErr_SetRaisedException.
 * 3.11: PyErr_Fetch + PyErr_NormalizeException, the traceback attached to
 * the value (what the 3.12 functions do). */
#if PY_VERSION_HEX >= 0x030C0000
#  define TL_COMPAT_RAISED_EXCEPTION "public"
static inline PyObject *
tl_err_get_raised(void)
{
    return PyErr_GetRaisedException();
}

static inline void
tl_err_set_raised(PyObject *exc)
{
    PyErr_SetRaisedException(exc);
}
#else
#  define TL_COMPAT_RAISED_EXCEPTION "fallback"
static inline PyObject *
tl_err_get_raised(void)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (t == NULL)
        return NULL;
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL && v != NULL)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
}

static inline void
tl_err_set_raised(PyObject *exc)
{
    if (exc == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *tb = PyException_GetTraceback(exc);
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, tb);
}
#endif

/* As a raise in Python's `finally:`: the exception raised now (if any)
 * replaces `context` (a reference, stolen), which becomes its __context__;
 * with none raised, `context` is raised again. */
static inline void
tl_err_chain(PyObject *context)
{
    if (context == NULL)
        return;
    PyObject *exc = tl_err_get_raised();
    if (exc == NULL) {
        tl_err_set_raised(context);
        return;
    }
    if (exc != context)
        PyException_SetContext(exc, context);   /* steals context */
    else
        Py_DECREF(context);
    tl_err_set_raised(exc);
}

/* -- Context snapshots: the Context object layout and the thread state's
 * context/context_ver fields (see handle.c).  3.11-3.15 share the layout;
 * it is verified at import and the plain copy is used otherwise (and on
 * versions not listed here). */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x03100000
#  define TL_COMPAT_CONTEXT_LAYOUT "private-checked"
#  define TL_HAVE_CONTEXT_LAYOUT 1
#else
#  define TL_COMPAT_CONTEXT_LAYOUT "fallback"
#  define TL_HAVE_CONTEXT_LAYOUT 0
#endif

/* -- _ssl's PySSLSocket: the int set once an SSLEOFError was raised, after
 * which read() and write() raise it again without calling OpenSSL
 * (Modules/_ssl.c).  3.14: after `err` and `exc` (8 pointer-sized words
 * past the object header); 3.15 dropped both of those fields (6 words).
 * 3.11-3.13 have no such flag (0: not used).  tideloop._tls proves the
 * flag at import (it must go from 0 to 1 with such an error) before the
 * openssl route may use it. */
#if PY_VERSION_HEX >= 0x030F0000 && PY_VERSION_HEX < 0x03100000
#  define TL_COMPAT_SSL_EOF_FLAG "private-proven-3.15"
#  define TL_SSLSOCKET_EOF_OFFSET (sizeof(PyObject) + 6 * sizeof(void *))
#elif PY_VERSION_HEX >= 0x030E0000 && PY_VERSION_HEX < 0x030F0000
#  define TL_COMPAT_SSL_EOF_FLAG "private-proven-3.14"
#  define TL_SSLSOCKET_EOF_OFFSET (sizeof(PyObject) + 8 * sizeof(void *))
#else
#  define TL_COMPAT_SSL_EOF_FLAG "none"
#  define TL_SSLSOCKET_EOF_OFFSET 0
#endif

/* -- Free-threaded builds --
 * The module declares Py_mod_gil = Py_MOD_GIL_NOT_USED (module.c): loading
 * it leaves the GIL off.  PyMutex (loop.c's inbox) is 3.13's public API. */
#ifdef Py_GIL_DISABLED
#  define TL_COMPAT_FREE_THREADING "gil-not-used"
#else
#  define TL_COMPAT_FREE_THREADING "gil-build"
#endif

/* -- A weak reference's object (the stream methods hold their reader or
 * writer weakly, so that the instance dict they live in makes no cycle) --
 * 3.13+: PyWeakref_GetRef (a new reference).  3.11-3.12: PyWeakref_GetObject
 * (borrowed; Py_None when dead), then a new reference of it.
 * Returns 1 and *obj (a new reference), 0 when the object is gone, -1 on
 * error. */
#if PY_VERSION_HEX >= 0x030D0000
#  define TL_COMPAT_WEAKREF_GET "public"
static inline int
tl_weakref_get(PyObject *ref, PyObject **obj)
{
    return PyWeakref_GetRef(ref, obj);
}
#else
#  define TL_COMPAT_WEAKREF_GET "deprecated-borrowed"
static inline int
tl_weakref_get(PyObject *ref, PyObject **obj)
{
    PyObject *o = PyWeakref_GetObject(ref);
    if (o == NULL) {
        *obj = NULL;
        return -1;
    }
    if (o == Py_None) {
        *obj = NULL;
        return 0;
    }
    *obj = Py_NewRef(o);
    return 1;
}
#endif

/* -- A type's version tag (streams.c: asyncio's stream classes unchanged
 * since their methods were checked) --
 * tp_version_tag is a field of the PyTypeObject struct on 3.11-3.15; the
 * interpreter sets it to 0 whenever the type or a base is modified and
 * gives it a new value on the next method-cache lookup.  0 is never taken
 * as proof.  Free-threaded builds write it atomically. */
#define TL_COMPAT_TYPE_VERSION "struct-field"
static inline unsigned int
tl_type_version(PyTypeObject *tp)
{
    return __atomic_load_n(&tp->tp_version_tag, __ATOMIC_RELAXED);
}

/* -- A StreamReader's buffer: emptied, consumed, appended to (streams.c) --
 * 3.11-3.14: the PyByteArrayObject fields (cpython/bytearrayobject.h).
 * Emptied: size 0 and the start back at the storage's beginning, as a
 * "minor downsize" of PyByteArray_Resize leaves it, when no buffer is
 * exported and the storage is small; larger storage (a 100 KiB message's)
 * goes to a pool of the interpreter's (tl_storage_pool) for the next
 * buffer that must grow, instead of back to malloc: freed and made again
 * for every message, it made glibc give the top of its heap back and
 * fault it in again (11 page faults a request, a quarter of the server's
 * CPU, at 100 KiB).  The pool is bounded (TL_STORAGE_SLOTS of at most
 * TL_STORAGE_MAX) and emptied after a second with nothing to do
 * (loop.c) and with the module.  Free-threaded builds (their allocator
 * keeps pages per thread; threads would share the pool) and bytearrays
 * whose storage is not theirs to lend keep Resize(0), as clear() does.
 * The storage is bytearray's own allocation: PyObject_Malloc'd up to 3.12,
 * PyMem_Malloc'd from 3.13 (PYTHONMALLOC=debug tells the two apart).
 * 3.15: the storage is a bytes object that bytearray.take_bytes() hands
 * over whole instead (streams.c calls that); fallback: Resize(0). */
#define TL_BYTEARRAY_KEEP_MAX (64 * 1024)
#define TL_STORAGE_SLOTS 16
#define TL_STORAGE_MAX (512 * 1024)
typedef struct {
    char *bytes[TL_STORAGE_SLOTS];
    Py_ssize_t alloc[TL_STORAGE_SLOTS];
    int n;
    int closed;                  /* the module is going: nothing lent */
} tl_storage_pool;

#if PY_VERSION_HEX < 0x030D0000
#  define tl_bytearray_storage_free PyObject_Free
#else
#  define tl_bytearray_storage_free PyMem_Free
#endif

static inline void
tl_storage_pool_clear(tl_storage_pool *pool)
{
    while (pool->n > 0)
        tl_bytearray_storage_free(pool->bytes[--pool->n]);
}

#if PY_VERSION_HEX < 0x030F0000 && !defined(Py_GIL_DISABLED)
#  define TL_STORAGE_POOLED 1
#else
#  define TL_STORAGE_POOLED 0
#endif

#if PY_VERSION_HEX < 0x030F0000
#  define TL_COMPAT_BYTEARRAY_EMPTY "struct-fields"
static inline int
tl_bytearray_empty(PyObject *buf, tl_storage_pool *pool)
{
    PyByteArrayObject *b = (PyByteArrayObject *)buf;
    if (b->ob_exports == 0 && b->ob_bytes != NULL) {
        if (b->ob_alloc <= TL_BYTEARRAY_KEEP_MAX) {
            Py_SET_SIZE(b, 0);
            b->ob_start = b->ob_bytes;
            b->ob_bytes[0] = '\0';
            return 0;
        }
        if (TL_STORAGE_POOLED && pool->n < TL_STORAGE_SLOTS && !pool->closed
                && b->ob_alloc <= TL_STORAGE_MAX) {
            /* lent to the pool; the bytearray is as bytearray() makes it */
            pool->bytes[pool->n] = b->ob_bytes;
            pool->alloc[pool->n++] = b->ob_alloc;
            b->ob_bytes = b->ob_start = NULL;
            b->ob_alloc = 0;
            Py_SET_SIZE(b, 0);
            return 0;
        }
    }
    return PyByteArray_Resize(buf, 0);
}

/* del buf[:n] for 0 < n < len(buf): the start moves on, as bytearray's own
 * prefix deletion does, without its compaction (the next append that finds
 * no room, or the next emptying, gives the dead prefix back). */
static inline int
tl_bytearray_consume(PyObject *buf, Py_ssize_t n)
{
    PyByteArrayObject *b = (PyByteArrayObject *)buf;
    if (b->ob_exports != 0)
        return PySequence_DelSlice(buf, 0, n);
    b->ob_start += n;
    Py_SET_SIZE(b, Py_SIZE(b) - n);
    return 0;
}

/* buf.extend(data[:n]): into the storage's room when there is room, the
 * live bytes moved to its beginning if that makes room (PyByteArray_Resize
 * would copy them into new storage), else into storage from the pool that
 * is large enough, else through PyByteArray_Resize. */
static inline int
tl_bytearray_append(PyObject *buf, const char *data, Py_ssize_t n,
                    tl_storage_pool *pool)
{
    PyByteArrayObject *b = (PyByteArrayObject *)buf;
    Py_ssize_t len = Py_SIZE(b);
    if (b->ob_exports == 0) {
        if (b->ob_bytes != NULL && len + n + 1 <= b->ob_alloc) {
            if ((b->ob_start - b->ob_bytes) + len + n + 1 > b->ob_alloc) {
                memmove(b->ob_bytes, b->ob_start, (size_t)len);
                b->ob_start = b->ob_bytes;
            }
            memcpy(b->ob_start + len, data, (size_t)n);
            Py_SET_SIZE(b, len + n);
            b->ob_start[len + n] = '\0';
            return 0;
        }
        for (int i = TL_STORAGE_POOLED ? pool->n - 1 : -1; i >= 0; i--) {
            if (pool->alloc[i] < len + n + 1)
                continue;
            char *storage = pool->bytes[i], *old = b->ob_bytes;
            b->ob_alloc = pool->alloc[i];
            pool->n--;
            pool->bytes[i] = pool->bytes[pool->n];
            pool->alloc[i] = pool->alloc[pool->n];
            if (len > 0)
                memcpy(storage, b->ob_start, (size_t)len);
            memcpy(storage + len, data, (size_t)n);
            storage[len + n] = '\0';
            b->ob_bytes = b->ob_start = storage;
            Py_SET_SIZE(b, len + n);
            tl_bytearray_storage_free(old);
            return 0;
        }
    }
    if (PyByteArray_Resize(buf, len + n) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(buf) + len, data, (size_t)n);
    return 0;
}
#else
#  define TL_COMPAT_BYTEARRAY_EMPTY "fallback"
static inline int
tl_bytearray_empty(PyObject *buf, tl_storage_pool *pool)
{
    (void)pool;
    return PyByteArray_Resize(buf, 0);
}

static inline int
tl_bytearray_consume(PyObject *buf, Py_ssize_t n)
{
    return PySequence_DelSlice(buf, 0, n);
}

static inline int
tl_bytearray_append(PyObject *buf, const char *data, Py_ssize_t n,
                    tl_storage_pool *pool)
{
    (void)pool;
    Py_ssize_t len = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, len + n) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(buf) + len, data, (size_t)n);
    return 0;
}
#endif

/* The list exported as tideloop._core.compat: (name, branch). */
#define TL_COMPAT_ENTRIES(X)                                   \
    X("stop_iteration_value", TL_COMPAT_STOP_ITERATION)        \
    X("type_name", TL_COMPAT_TYPE_NAME)                        \
    X("hash_double", TL_COMPAT_HASH_DOUBLE)                    \
    X("bytes_resize", TL_COMPAT_BYTES_RESIZE)                  \
    X("raised_exception", TL_COMPAT_RAISED_EXCEPTION)          \
    X("context_layout", TL_COMPAT_CONTEXT_LAYOUT)              \
    X("ssl_eof_flag", TL_COMPAT_SSL_EOF_FLAG)                  \
    X("free_threading", TL_COMPAT_FREE_THREADING)              \
    X("weakref_get", TL_COMPAT_WEAKREF_GET)                    \
    X("type_version", TL_COMPAT_TYPE_VERSION)                  \
    X("bytearray_empty", TL_COMPAT_BYTEARRAY_EMPTY)

#endif
