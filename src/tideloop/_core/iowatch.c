/* Running a C io watcher (iowatch.h): its function in the context it was
 * armed in, its errors reported as asyncio reports a reader Handle's; and
 * the Handle that stands for it in debug mode, reports and _selector.
 *
 * May call: handle.c (a Handle made, an error reported). */
#include "internal.h"

/* What debug mode runs, a report names and _selector shows for a watcher:
 * a Handle of the owner's method, in the watcher's context. */
HandleObject *
tl_io_make_handle(LoopObject *loop, tl_io_watcher *w)
{
    PyObject *meth = PyObject_GetAttrString(w->owner, w->name);
    if (meth == NULL)
        return NULL;
    tl_state *st = loop->state;
    PyObject *ctx = w->context;
    HandleObject *h = tl_handle_new(st, st->HandleType, loop, meth, NULL, 0,
                                    ctx, ctx == NULL);
    Py_DECREF(meth);
    return h;
}

/* The watcher's function in the context it was armed in.  Errors other than
 * SystemExit/KeyboardInterrupt are reported as asyncio's Handle._run
 * reports them, by the Handle that stands for the watcher, outside the
 * callback's context and outside the batch (*entered, see below). */
int
tl_io_run(LoopObject *loop, tl_io_watcher *w, int *entered)
{
    /* Ours for the call: the callback may re-arm w with a new context.
     * (A watcher runs only while armed, so it has one: run_io_item.) */
    assert(w->armed && !w->stale && w->context != NULL);
    PyObject *ctx = Py_NewRef(w->context);
    int rc = -1;
    if (PyContext_Enter(ctx) == 0) {
        rc = w->fn(w->owner);
        PyObject *exc = rc < 0 ? tl_err_get_raised() : NULL;
        if (PyContext_Exit(ctx) < 0) {
            Py_XDECREF(exc);
            exc = tl_err_get_raised();
            rc = -1;
        }
        if (exc != NULL)        /* (none: nothing to restore, nor to clear) */
            tl_err_set_raised(exc);
    }
    Py_DECREF(ctx);
    if (rc == 0)
        return 0;
    tl_batch_exit(loop, entered);
    if (PyErr_ExceptionMatches(PyExc_SystemExit) ||
        PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
        return -1;
    PyObject *exc = tl_err_get_raised();
    HandleObject *h = tl_io_make_handle(loop, w);
    if (h == NULL) {
        Py_XDECREF(exc);
        return -1;
    }
    tl_err_set_raised(exc);
    PyObject *args = PyTuple_New(0);
    rc = args ? tl_handle_report_error(h, h->callback, args) : -1;
    Py_XDECREF(args);
    Py_DECREF(h);
    return rc;
}
