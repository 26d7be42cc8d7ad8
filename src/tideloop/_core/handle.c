/* Handle and TimerHandle: what call_soon / call_later return, and what the
 * ready queue and the timer heap hold; and how every callback runs, with
 * asyncio's context and error handling (a watcher's run: iowatch.c).
 *
 * May call: heap (a cancelled timer leaves the loop's heap). */
#include "internal.h"

#include <structmember.h>
#include <time.h>

/* Context snapshots.
 *
 * asyncio runs each callback in a copy of the context current at scheduling
 * time.  A copy is a new Context object per call_soon.  Instead we keep the
 * copy's only content -- the immutable variables mapping (a HAMT) -- and at
 * run time install it into one reusable Context owned by the loop.  Each
 * callback starts from its own snapshot and its changes are dropped after it
 * returns, exactly as with a throwaway copy.  If anything keeps a reference
 * to the reusable Context (a Token from ContextVar.set), the loop replaces it
 * so that Context's identity is never shared between callbacks.
 *
 * This needs the Context object layout, which is not public API; it is
 * checked at import (tl_context_init) and the plain copy is used otherwise. */
typedef struct {
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars;
    PyObject *ctx_weakreflist;
    int ctx_entered;
} tl_context_layout;

#define CTX(o) ((tl_context_layout *)(o))

int
tl_context_init(tl_state *st)
{
    st->fast_context = 0;
    if (tl_portable())
        return 0;           /* TIDELOOP_PORTABLE: the public copy only */
#if TL_HAVE_CONTEXT_LAYOUT
    PyObject *ctx = PyContext_New();
    if (ctx == NULL)
        return -1;
    PyObject *vars = CTX(ctx)->ctx_vars;
    int ok = vars != NULL && strcmp(Py_TYPE(vars)->tp_name, "hamt") == 0 &&
             CTX(ctx)->ctx_entered == 0 && CTX(ctx)->ctx_prev == NULL;
    if (ok) {
        if (PyContext_Enter(ctx) < 0) {
            Py_DECREF(ctx);
            return -1;
        }
        ok = CTX(ctx)->ctx_entered == 1 &&
             PyThreadState_Get()->context == ctx;
        if (PyContext_Exit(ctx) < 0) {
            Py_DECREF(ctx);
            return -1;
        }
        ok = ok && CTX(ctx)->ctx_entered == 0;
    }
    if (ok) {
        st->empty_vars = Py_NewRef(vars);
        st->fast_context = 1;
    }
    Py_DECREF(ctx);
#endif
    return 0;
}

int
tl_check_context_arg(PyObject *context)
{
    if (context == Py_None || PyContext_CheckExact(context))
        return 0;
    PyErr_Format(PyExc_TypeError, "a contextvars.Context was expected, got %s",
                 tl_type_name(Py_TYPE(context)));
    return -1;
}

/* A new Context holding vars (a snapshot). */
PyObject *
tl_context_from_vars(PyObject *vars)
{
    PyObject *ctx = PyContext_New();
    if (ctx == NULL)
        return NULL;
    Py_SETREF(CTX(ctx)->ctx_vars, Py_NewRef(vars));
    return ctx;
}

static inline PyObject *
current_vars(tl_state *st)
{
    PyObject *cur = PyThreadState_GET()->context;
    return cur != NULL ? CTX(cur)->ctx_vars : st->empty_vars;
}

/* Drop the callback and its arguments (cancel, dealloc, clear). */
static void handle_clear_call(HandleObject *h);

void
tl_handle_drop_call(HandleObject *h)
{
    handle_clear_call(h);
}

static void
handle_clear_call(HandleObject *h)
{
    Py_CLEAR(h->callback);
    if (h->args_tuple != NULL) {
        Py_CLEAR(h->args_tuple);
    }
    else {
        for (Py_ssize_t i = 0; i < h->nargs; i++)
            Py_CLEAR(h->argv[i]);
    }
    h->nargs = 0;
}

HandleObject *
tl_handle_new(tl_state *st, PyTypeObject *type, LoopObject *loop,
              PyObject *callback, PyObject *const *args, Py_ssize_t nargs,
              PyObject *context, int reusable)
{
    HandleObject *h = TL_FREE_THREADED ? NULL : st->handle_freelist;
    if (h != NULL) {
        st->handle_freelist = h->next_free;
        st->handle_nfree--;
        h->next_free = NULL;
        PyObject_Init((PyObject *)h, type);
    }
    else {
        h = PyObject_GC_New(HandleObject, type);
        if (h == NULL)
            return NULL;
        h->callback = h->args_tuple = NULL;
        for (Py_ssize_t i = 0; i < TL_INLINE_ARGS; i++)
            h->argv[i] = NULL;
        h->weakreflist = NULL;
        h->next_free = NULL;
    }
    /* (A recycled handle comes back with every reference field NULL.) */
    h->source_traceback = NULL;
    h->repr_cache = NULL;
    h->when_given = NULL;
    h->cancelled = 0;
    h->scheduled = 0;
    h->running = 0;
    h->threadsafe = 0;
    h->ctx_vars = NULL;
    h->node.index = TL_HEAP_NOT_IN;
    h->nargs = nargs;
    if (nargs <= TL_INLINE_ARGS) {
        for (Py_ssize_t i = 0; i < nargs; i++)
            h->argv[i] = Py_NewRef(args[i]);
    }
    else {
        PyObject *t = PyTuple_New(nargs);
        if (t == NULL) {
            h->nargs = 0;
            h->loop = NULL;
            h->context = NULL;
            h->callback = NULL;
            Py_DECREF(h);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < nargs; i++)
            PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
        h->args_tuple = t;
    }
    h->callback = Py_NewRef(callback);
    h->loop = (LoopObject *)Py_NewRef(loop);
    if ((context == NULL || context == Py_None) && st->fast_context &&
        !reusable) {
        h->context = NULL;
        h->ctx_vars = Py_NewRef(current_vars(st));
    }
    else if (context == NULL || context == Py_None) {
        h->context = PyContext_CopyCurrent();
        if (h->context == NULL) {
            Py_DECREF(h);
            return NULL;
        }
    }
    else {
        h->context = Py_NewRef(context);
    }
    PyObject_GC_Track(h);
    if (loop->debug) {
        /* Where the handle was created, for repr and error reports. */
        PyFrameObject *f = PyEval_GetFrame();
        if (f != NULL) {
            h->source_traceback =
                PyObject_CallOneArg(st->extract_stack, (PyObject *)f);
            if (h->source_traceback == NULL) {
                Py_DECREF(h);
                return NULL;
            }
        }
    }
    return h;
}

static int
handle_traverse(HandleObject *h, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(h));
    Py_VISIT(h->callback);
    Py_VISIT(h->args_tuple);
    for (Py_ssize_t i = 0; i < TL_INLINE_ARGS; i++)
        Py_VISIT(h->argv[i]);
    Py_VISIT(h->context);
    Py_VISIT(h->ctx_vars);
    Py_VISIT(h->loop);
    Py_VISIT(h->source_traceback);
    Py_VISIT(h->repr_cache);
    Py_VISIT(h->when_given);
    return 0;
}

static int
handle_clear(HandleObject *h)
{
    handle_clear_call(h);
    Py_CLEAR(h->context);
    Py_CLEAR(h->ctx_vars);
    Py_CLEAR(h->loop);
    Py_CLEAR(h->source_traceback);
    Py_CLEAR(h->repr_cache);
    Py_CLEAR(h->when_given);
    return 0;
}

static void
handle_dealloc(HandleObject *h)
{
    PyTypeObject *tp = Py_TYPE(h);
    tl_state *st = h->loop != NULL ? h->loop->state : tl_get_state_from_type(tp);
    PyObject_GC_UnTrack(h);
    if (h->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)h);
    handle_clear(h);
    if (!TL_FREE_THREADED && st != NULL && !st->handle_freelist_closed &&
        st->handle_nfree < TL_HANDLE_FREELIST_MAX) {
        h->next_free = st->handle_freelist;
        st->handle_freelist = h;
        st->handle_nfree++;
    }
    else {
        PyObject_GC_Del(h);
    }
    Py_DECREF(tp);
}

/* Called from the module's clear, while the Handle types are still alive:
 * PyObject_GC_Del reads the object's type (its pre-header size), and a
 * recycled handle no longer owns a reference to it.  Handles that die after
 * this are freed directly, never recycled again. */
void
tl_handle_free_list(tl_state *st)
{
    st->handle_freelist_closed = 1;
    while (st->handle_freelist != NULL) {
        HandleObject *h = st->handle_freelist;
        st->handle_freelist = h->next_free;
        /* Either type will do (same layout); this one is alive. */
        Py_SET_TYPE(h, st->HandleType);
        PyObject_GC_Del(h);
    }
    st->handle_nfree = 0;
}

/* The arguments as a tuple (built on demand for inline arguments). */
static PyObject *
handle_args_tuple(HandleObject *h)
{
    if (h->args_tuple != NULL)
        return Py_NewRef(h->args_tuple);
    PyObject *t = PyTuple_New(h->nargs);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < h->nargs; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(h->argv[i]));
    return t;
}

/* Report an exception raised by the callback the way asyncio's Handle._run
 * does: 'Exception in callback ...' to loop.call_exception_handler(). */
int
tl_handle_report_error(HandleObject *h, PyObject *callback, PyObject *args)
{
    tl_state *st = h->loop->state;
    PyObject *value = tl_err_get_raised();

    int rc = -1;
    PyObject *context = NULL, *src = NULL, *msg = NULL, *res = NULL;
    src = PyObject_CallFunctionObjArgs(st->format_callback_source, callback,
                                       args, h->loop->debug ? Py_True : Py_False,
                                       NULL);
    if (src == NULL)
        goto done;
    msg = PyUnicode_FromFormat("Exception in callback %U", src);
    if (msg == NULL)
        goto done;
    context = PyDict_New();
    if (context == NULL)
        goto done;
    if (PyDict_SetItem(context, st->str_message, msg) < 0 ||
        PyDict_SetItem(context, st->str_exception, value ? value : Py_None) < 0 ||
        PyDict_SetItem(context, st->str_handle, (PyObject *)h) < 0)
        goto done;
    if (h->source_traceback != NULL && PyObject_IsTrue(h->source_traceback) &&
        PyDict_SetItem(context, st->str_source_traceback,
                       h->source_traceback) < 0)
        goto done;
    res = PyObject_CallMethodOneArg((PyObject *)h->loop,
                                    st->str_call_exception_handler, context);
    if (res != NULL)
        rc = 0;
done:
    Py_XDECREF(value);
    Py_XDECREF(src);
    Py_XDECREF(msg);
    Py_XDECREF(context);
    Py_XDECREF(res);
    return rc;
}

/* Pieces shared by the plain and the batched run. */

static inline PyObject *const *
handle_callargs(HandleObject *h)
{
    return h->args_tuple != NULL ? &PyTuple_GET_ITEM(h->args_tuple, 0)
                                 : h->argv;
}

/* Make the shared Context hold h's snapshot (consecutive callbacks mostly
 * share one, so usually nothing changes).  1 if the variables changed. */
static inline int
install_snapshot(PyObject *rc, HandleObject *h)
{
    if (CTX(rc)->ctx_vars == h->ctx_vars)
        return 0;
    Py_INCREF(h->ctx_vars);
    Py_SETREF(CTX(rc)->ctx_vars, h->ctx_vars);
    return 1;
}

/* A snapshot handle whose callback raised: from now on it holds the
 * Context the callback ran in, as left by the callback, so that
 * handle.get_context() -- where 3.13+'s call_exception_handler runs a
 * custom handler -- sees what the callback set (asyncio's handle owns that
 * very Context).  ctx: the Context the callback ran in. */
static int
keep_failed_context(HandleObject *h, PyObject *ctx)
{
    if (h->context != NULL || h->ctx_vars == NULL)
        return 0;
    PyObject *exc = tl_err_get_raised();
    h->context = tl_context_from_vars(CTX(ctx)->ctx_vars);
    if (h->context == NULL) {
        Py_XDECREF(exc);
        return -1;
    }
    Py_CLEAR(h->ctx_vars);
    tl_err_set_raised(exc);
    return 0;
}

/* After the call, outside the callback's context: SystemExit and
 * KeyboardInterrupt propagate (-1), anything else goes to the exception
 * handler as asyncio's Handle._run does. */
static inline int
handle_finish(HandleObject *h, PyObject *res)
{
    int rc = 0;
    if (res != NULL) {
        Py_DECREF(res);
    }
    else if (PyErr_ExceptionMatches(PyExc_SystemExit) ||
             PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        rc = -1;
    }
    else {
        PyObject *t = handle_args_tuple(h);
        rc = t ? tl_handle_report_error(h, h->callback, t) : -1;
        Py_XDECREF(t);
    }
    /* While running, cancel() left callback and arguments in place (they
     * were borrowed by the call); drop them now. */
    h->running = 0;
    if (tl_handle_cancelled(h))
        handle_clear_call(h);
    return rc;
}

/* If anything beyond `expected` references keeps the shared Context (a Token
 * from ContextVar.set, say), give it away and use a fresh one from now on,
 * so its identity is never shared between callbacks. */
static int
renew_shared_if_kept(LoopObject *loop, PyObject *ctx, Py_ssize_t expected)
{
    if (ctx != loop->run_ctx || Py_REFCNT(ctx) <= expected)
        return 0;
    PyObject *fresh = PyContext_New();
    if (fresh == NULL)
        return -1;
    Py_SETREF(loop->run_ctx, fresh);
    return 0;
}

int
tl_handle_run(HandleObject *h)
{
    if (h->callback == NULL || h->running)
        return 0;
    LoopObject *loop = h->loop;
    PyObject *ctx = h->context;
    PyObject *owned_ctx = NULL;
    int shared = 0;
    if (ctx == NULL) {
        PyObject *rc = loop->run_ctx;
        if (rc != NULL && !CTX(rc)->ctx_entered) {
            install_snapshot(rc, h);
            ctx = rc;
            shared = 1;
        }
        else {
            /* Nested run (handle._run() from a callback): a private copy. */
            owned_ctx = ctx = tl_context_from_vars(h->ctx_vars);
            if (ctx == NULL)
                return -1;
        }
    }
    h->running = 1;
    PyObject *res = NULL;
    if (PyContext_Enter(ctx) == 0) {
        res = PyObject_Vectorcall(h->callback, handle_callargs(h), h->nargs,
                                  NULL);
        if (PyContext_Exit(ctx) < 0)
            Py_CLEAR(res);
        if (res == NULL && keep_failed_context(h, ctx) < 0)
            Py_CLEAR(res);
    }
    int rc = handle_finish(h, res);
    if (shared && renew_shared_if_kept(loop, ctx, 1) < 0)
        rc = -1;
    Py_XDECREF(owned_ctx);
    return rc;
}

/* Run a snapshot handle (no explicit Context) inside a batch: consecutive
 * snapshot handles share one entry into the loop's reusable Context, and
 * between them only the variables are swapped (with the thread's context
 * version bumped, so ContextVar caches see the change).  *entered tells
 * whether the batch currently has that Context entered; the caller exits it
 * (tl_batch_exit) before running anything else.  A failing callback leaves
 * the batch first, so errors are reported outside the callback's context, as
 * asyncio's ctx.run() returning would. */
void
tl_batch_exit(LoopObject *loop, int *entered)
{
    if (!*entered)
        return;
    *entered = 0;
    PyObject *exc = tl_err_get_raised();
    if (PyContext_Exit(loop->run_ctx) < 0)
        PyErr_WriteUnraisable(loop->run_ctx);
    tl_err_set_raised(exc);
}

int
tl_handle_run_batched(HandleObject *h, int *entered)
{
    LoopObject *loop = h->loop;
    PyObject *rc = loop->run_ctx;
    if (h->callback == NULL || h->running || h->context != NULL ||
        h->ctx_vars == NULL || rc == NULL) {
        tl_batch_exit(loop, entered);
        return tl_handle_run(h);
    }
    PyThreadState *ts = PyThreadState_Get();
    if (*entered && ts->context != rc)
        tl_batch_exit(loop, entered);   /* someone switched under us */
    if (!*entered) {
        if (CTX(rc)->ctx_entered)
            return tl_handle_run(h);    /* nested iteration */
        install_snapshot(rc, h);
        if (PyContext_Enter(rc) < 0)
            return -1;
        *entered = 1;
    }
    else if (install_snapshot(rc, h)) {
        ts->context_ver++;              /* ContextVar caches must see it */
    }
    h->running = 1;
    PyObject *res = PyObject_Vectorcall(h->callback, handle_callargs(h),
                                        h->nargs, NULL);
    if (res == NULL) {
        tl_batch_exit(loop, entered);   /* report outside the callback */
        if (keep_failed_context(h, rc) < 0)
            return -1;
    }
    int ret = handle_finish(h, res);
    if (rc == loop->run_ctx && Py_REFCNT(rc) > (*entered ? 2 : 1)) {
        tl_batch_exit(loop, entered);
        if (renew_shared_if_kept(loop, rc, 1) < 0)
            return -1;
    }
    return ret;
}

/* ---- Python-visible methods ---- */

static PyObject *
handle_repr_info(HandleObject *h)
{
    tl_state *st = tl_get_state_from_type(Py_TYPE(h));
    PyObject *info = PyList_New(0);
    if (info == NULL)
        return NULL;
    PyObject *s = PyUnicode_FromString(tl_type_name(Py_TYPE(h)));
    if (s == NULL || PyList_Append(info, s) < 0)
        goto error;
    Py_CLEAR(s);
    if (h->cancelled) {
        s = PyUnicode_FromString("cancelled");
        if (s == NULL || PyList_Append(info, s) < 0)
            goto error;
        Py_CLEAR(s);
    }
    if (h->loop != NULL && Py_TYPE(h) == st->TimerHandleType) {
        PyObject *w = h->when_given ? Py_NewRef(h->when_given)
                                    : PyFloat_FromDouble(h->when);
        if (w == NULL)
            goto error;
        s = PyUnicode_FromFormat("when=%S", w);   /* f"when={self._when}" */
        Py_DECREF(w);
        if (s == NULL || PyList_Append(info, s) < 0)
            goto error;
        Py_CLEAR(s);
    }
    if (h->callback != NULL) {
        PyObject *args = handle_args_tuple(h);
        if (args == NULL)
            goto error;
        /* 3.13+ show the arguments in debug mode only (_compat decides). */
        PyObject *debug = h->loop != NULL && h->loop->debug ? Py_True : Py_False;
        s = PyObject_CallFunctionObjArgs(st->format_callback_source,
                                         h->callback, args, debug, NULL);
        Py_DECREF(args);
        if (s == NULL || PyList_Append(info, s) < 0)
            goto error;
        Py_CLEAR(s);
    }
    if (h->source_traceback != NULL && PyList_Check(h->source_traceback) &&
        PyList_GET_SIZE(h->source_traceback) > 0) {
        PyObject *frame = PyList_GET_ITEM(
            h->source_traceback, PyList_GET_SIZE(h->source_traceback) - 1);
        PyObject *fn = PySequence_GetItem(frame, 0);
        PyObject *ln = fn ? PySequence_GetItem(frame, 1) : NULL;
        if (ln != NULL)
            s = PyUnicode_FromFormat("created at %S:%S", fn, ln);
        Py_XDECREF(fn);
        Py_XDECREF(ln);
        if (s == NULL || PyList_Append(info, s) < 0)
            goto error;
        Py_CLEAR(s);
    }
    return info;
error:
    Py_XDECREF(s);
    Py_DECREF(info);
    return NULL;
}

static PyObject *
handle_repr(HandleObject *h)
{
    if (h->repr_cache != NULL)
        return Py_NewRef(h->repr_cache);
    PyObject *info = handle_repr_info(h);
    if (info == NULL)
        return NULL;
    PyObject *sep = PyUnicode_FromString(" ");
    PyObject *joined = sep ? PyUnicode_Join(sep, info) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(info);
    if (joined == NULL)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("<%U>", joined);
    Py_DECREF(joined);
    return r;
}

int
tl_handle_cancel(HandleObject *h)
{
    if (tl_handle_cancelled(h) || h->loop == NULL)
        return 0;
    if (h->scheduled) {
        /* Out of the loop's heap; its reference goes (the caller has one). */
        assert(h->node.index != TL_HEAP_NOT_IN);
        tl_heap_remove(&h->loop->timers, &h->node);
        assert(Py_REFCNT(h) > 1);   /* the heap's and the caller's */
        h->scheduled = 0;
        Py_DECREF(h);
    }
    __atomic_store_n(&h->cancelled, 1, __ATOMIC_RELEASE);
    if (h->loop->debug) {
        /* Keep the description: 'Executing <Handle...> took 2.5 seconds'. */
        PyObject *r = handle_repr(h);
        if (r == NULL) {
            if (!h->running)
                handle_clear_call(h);
            return -1;
        }
        Py_XSETREF(h->repr_cache, r);
    }
    if (!h->running)
        handle_clear_call(h);
    return 0;
}

/* cancel() called by a thread other than the one running the handle's
 * loop (free-threaded builds; with a GIL the loop thread is never between
 * two steps when another thread runs).  A handle call_soon_threadsafe()
 * made is cancelled under the loop's threadsafe_lock, so a callback that
 * already started ends first (3.14's semantics, gh-128340).  Any other
 * handle belongs to the loop thread, which may be running it or moving it
 * in the timer heap: it is only marked, and the loop drops its callback
 * when it comes to it (a cancelled timer leaves the heap when due). */
static int
handle_cancel_from_other_thread(HandleObject *h)
{
    LoopObject *loop = h->loop;
    if (h->threadsafe || Py_IS_TYPE(h, loop->state->ThreadSafeHandleType)) {
        int rc;
        Py_INCREF(loop);
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(loop->threadsafe_lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
        rc = tl_handle_cancel(h);     /* never a timer: not in the heap */
        PyThread_release_lock(loop->threadsafe_lock);
        Py_DECREF(loop);
        return rc;
    }
    __atomic_store_n(&h->cancelled, 1, __ATOMIC_RELEASE);
    return 0;
}

static int
handle_cancel_any_thread(HandleObject *h)
{
    if (TL_FREE_THREADED && h->loop != NULL && !tl_loop_owned_here(h->loop))
        return handle_cancel_from_other_thread(h);
    return tl_handle_cancel(h);
}

static PyObject *
handle_cancel(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    if (handle_cancel_any_thread(h) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
handle_cancelled(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(__atomic_load_n(&h->cancelled, __ATOMIC_ACQUIRE));
}

static PyObject *
handle_get_context(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    if (h->context == NULL) {
        if (h->ctx_vars == NULL)
            Py_RETURN_NONE;
        /* From now on the handle runs in this very object, as asyncio's
         * would, so changes made through it are seen by the callback. */
        h->context = tl_context_from_vars(h->ctx_vars);
        if (h->context == NULL)
            return NULL;
        Py_CLEAR(h->ctx_vars);
    }
    return Py_NewRef(h->context);
}

static PyObject *
handle_run_method(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    if (h->loop == NULL)
        Py_RETURN_NONE;
    if (tl_handle_run(h) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
handle_when(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    if (h->when_given != NULL)
        return Py_NewRef(h->when_given);
    return PyFloat_FromDouble(h->when);
}

static PyObject *
handle_get_callback(HandleObject *h, void *Py_UNUSED(c))
{
    return Py_NewRef(h->callback ? h->callback : Py_None);
}

static PyObject *
handle_get_args(HandleObject *h, void *Py_UNUSED(c))
{
    if (h->callback == NULL)
        Py_RETURN_NONE;
    return handle_args_tuple(h);
}

static PyObject *
handle_get_loop(HandleObject *h, void *Py_UNUSED(c))
{
    return Py_NewRef(h->loop ? (PyObject *)h->loop : Py_None);
}

static PyObject *
handle_get_source_traceback(HandleObject *h, void *Py_UNUSED(c))
{
    return Py_NewRef(h->source_traceback ? h->source_traceback : Py_None);
}

static PyObject *
handle_get_cancelled_attr(HandleObject *h, void *Py_UNUSED(c))
{
    return PyBool_FromLong(tl_handle_cancelled(h));
}

static PyObject *
handle_get_scheduled(HandleObject *h, void *Py_UNUSED(c))
{
    return PyBool_FromLong(h->scheduled);
}

static PyObject *
timer_richcompare(HandleObject *a, PyObject *bo, int op)
{
    tl_state *st = tl_get_state_from_type(Py_TYPE(a));
    if (Py_TYPE(bo) != st->TimerHandleType)
        Py_RETURN_NOTIMPLEMENTED;
    HandleObject *b = (HandleObject *)bo;
    int eq = 0;
    if (op == Py_EQ || op == Py_NE || op == Py_LE || op == Py_GE) {
        eq = a->when == b->when && a->cancelled == b->cancelled;
        if (eq) {
            PyObject *ca = a->callback ? a->callback : Py_None;
            PyObject *cb = b->callback ? b->callback : Py_None;
            int r = PyObject_RichCompareBool(ca, cb, Py_EQ);
            if (r < 0)
                return NULL;
            eq = r;
        }
        if (eq) {
            PyObject *ta = a->callback ? handle_args_tuple(a) : Py_NewRef(Py_None);
            if (ta == NULL)
                return NULL;
            PyObject *tb = b->callback ? handle_args_tuple(b) : Py_NewRef(Py_None);
            if (tb == NULL) {
                Py_DECREF(ta);
                return NULL;
            }
            int r = PyObject_RichCompareBool(ta, tb, Py_EQ);
            Py_DECREF(ta);
            Py_DECREF(tb);
            if (r < 0)
                return NULL;
            eq = r;
        }
    }
    switch (op) {
    case Py_LT: return PyBool_FromLong(a->when < b->when);
    case Py_GT: return PyBool_FromLong(a->when > b->when);
    case Py_LE: return PyBool_FromLong(a->when < b->when || eq);
    case Py_GE: return PyBool_FromLong(a->when > b->when || eq);
    case Py_EQ: return PyBool_FromLong(eq);
    case Py_NE: return PyBool_FromLong(!eq);
    }
    Py_RETURN_NOTIMPLEMENTED;
}

static Py_hash_t
timer_hash(HandleObject *h)
{
    return tl_hash_double((PyObject *)h, h->when);
}

static PyMethodDef handle_methods[] = {
    {"cancel", (PyCFunction)handle_cancel, METH_NOARGS, "Cancel the call."},
    {"cancelled", (PyCFunction)handle_cancelled, METH_NOARGS,
     "Return True if the call was cancelled."},
    {"get_context", (PyCFunction)handle_get_context, METH_NOARGS,
     "Return the contextvars.Context the callback runs in."},
    {"_run", (PyCFunction)handle_run_method, METH_NOARGS, NULL},
    {NULL}
};

static PyMethodDef timer_methods[] = {
    {"when", (PyCFunction)handle_when, METH_NOARGS,
     "Return the scheduled time, on the loop.time() clock."},
    {NULL}
};

static PyGetSetDef handle_getset[] = {
    {"_callback", (getter)handle_get_callback, NULL, NULL, NULL},
    {"_args", (getter)handle_get_args, NULL, NULL, NULL},
    {"_loop", (getter)handle_get_loop, NULL, NULL, NULL},
    {"_context", (getter)handle_get_context, NULL, NULL, NULL},
    {"_cancelled", (getter)handle_get_cancelled_attr, NULL, NULL, NULL},
    {"_source_traceback", (getter)handle_get_source_traceback, NULL, NULL, NULL},
    {NULL}
};

static PyGetSetDef timer_getset[] = {
    {"_scheduled", (getter)handle_get_scheduled, NULL, NULL, NULL},
    {"_when", (getter)handle_when, NULL, NULL, NULL},
    {NULL}
};

static PyMemberDef handle_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(HandleObject, weakreflist),
     READONLY, NULL},
    {NULL}
};

static PyType_Slot handle_slots[] = {
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_traverse, handle_traverse},
    {Py_tp_clear, handle_clear},
    {Py_tp_repr, handle_repr},
    {Py_tp_methods, handle_methods},
    {Py_tp_getset, handle_getset},
    {Py_tp_members, handle_members},
    {Py_tp_doc, "Object returned by callback registration methods."},
    {0, NULL}
};

PyType_Spec tl_handle_spec = {
    .name = "tideloop.Handle",
    .basicsize = sizeof(HandleObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = handle_slots,
};

static PyType_Slot timer_slots[] = {
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_traverse, handle_traverse},
    {Py_tp_clear, handle_clear},
    {Py_tp_repr, handle_repr},
    {Py_tp_richcompare, timer_richcompare},
    {Py_tp_hash, timer_hash},
    {Py_tp_methods, timer_methods},
    {Py_tp_getset, timer_getset},
    {Py_tp_doc, "Object returned by timed callback registration methods."},
    {0, NULL}
};

PyType_Spec tl_timer_handle_spec = {
    .name = "tideloop.TimerHandle",
    .basicsize = sizeof(HandleObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = timer_slots,
};

/* ---- 3.14's _ThreadSafeHandle: what call_soon_threadsafe() returns ---- */

/* Called from a thread other than the loop's while the handle's callback
 * runs: wait until it has returned (the loop thread holds the loop's
 * threadsafe_lock for as long as it runs one).  The loop thread itself
 * (a callback cancelling its own handle) does not wait. */
static void
threadsafe_wait_while_running(HandleObject *h)
{
    LoopObject *loop = h->loop;
    if (loop == NULL || !h->running ||
        loop->thread_id == PyThread_get_thread_ident())
        return;
    Py_INCREF(loop);
    Py_INCREF(h);
    while (h->running && loop->threadsafe_lock != NULL) {
        PyThread_type_lock lock = loop->threadsafe_lock;
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(lock, WAIT_LOCK);
        PyThread_release_lock(lock);
        Py_END_ALLOW_THREADS
        if (h->running) {
            /* Still running once the lock was ours: run by other means
             * (handle._run()); do not spin. */
            struct timespec ms = {0, 1000000};
            Py_BEGIN_ALLOW_THREADS
            nanosleep(&ms, NULL);
            Py_END_ALLOW_THREADS
        }
    }
    Py_DECREF(h);
    Py_DECREF(loop);
}

static PyObject *
threadsafe_cancel(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    if (TL_FREE_THREADED)
        return handle_cancel(h, NULL);   /* under the lock (above) */
    threadsafe_wait_while_running(h);
    if (tl_handle_cancel(h) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
threadsafe_cancelled(HandleObject *h, PyObject *Py_UNUSED(ignored))
{
    LoopObject *loop = h->loop;
    if (TL_FREE_THREADED && loop != NULL && !tl_loop_owned_here(loop)) {
        /* Wait for a callback that already started, as cancel() does. */
        Py_INCREF(loop);
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(loop->threadsafe_lock, WAIT_LOCK);
        PyThread_release_lock(loop->threadsafe_lock);
        Py_END_ALLOW_THREADS
        Py_DECREF(loop);
    }
    else if (!TL_FREE_THREADED) {
        threadsafe_wait_while_running(h);
    }
    return PyBool_FromLong(__atomic_load_n(&h->cancelled, __ATOMIC_ACQUIRE));
}

/* isinstance(handle, asyncio.events._ThreadSafeHandle) holds, as for the
 * stock loop's handles: this type implements that class's contract (a
 * cancel() from another thread waits for the running callback) in C, and
 * declares it through __class__, which isinstance() consults.  type()
 * still shows this type. */
static PyObject *
threadsafe_get_class(HandleObject *h, void *Py_UNUSED(c))
{
    tl_state *st = tl_get_state_from_type(Py_TYPE(h));
    if (st == NULL || st->ThreadSafeHandle == NULL || st->ThreadSafeHandle == Py_None)
        return Py_NewRef((PyObject *)Py_TYPE(h));
    return Py_NewRef(st->ThreadSafeHandle);
}

static PyMethodDef threadsafe_methods[] = {
    {"cancel", (PyCFunction)threadsafe_cancel, METH_NOARGS,
     "Cancel the call; from another thread, wait for a running callback first."},
    {"cancelled", (PyCFunction)threadsafe_cancelled, METH_NOARGS,
     "Return True if the call was cancelled (waits as cancel() does)."},
    {NULL}
};

static PyGetSetDef threadsafe_getset[] = {
    {"__class__", (getter)threadsafe_get_class, NULL, NULL, NULL},
    {NULL}
};

static PyType_Slot threadsafe_slots[] = {
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_traverse, handle_traverse},
    {Py_tp_clear, handle_clear},
    {Py_tp_repr, handle_repr},
    {Py_tp_methods, threadsafe_methods},
    {Py_tp_getset, threadsafe_getset},
    {Py_tp_doc, "Object returned by call_soon_threadsafe() (Python 3.14+)."},
    {0, NULL}
};

PyType_Spec tl_threadsafe_handle_spec = {
    .name = "tideloop._ThreadSafeHandle",
    .basicsize = sizeof(HandleObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = threadsafe_slots,
};
