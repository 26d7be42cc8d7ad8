/* The C io watcher: a transport's or listener's reader or writer, in C.
 *
 * Its life, in one place: armed in an fd slot (fdtable.c calls
 * tl_io_arm/tl_io_rearm/tl_io_disarm), queued on the ready queue by an event
 * (ready.h: tl_io_mark_queued, once per run), run in the context it was armed
 * in (iowatch.c: tl_io_run), or shown as a Handle (tl_io_make_handle).  A
 * readable transport costs no Python object per event this way.  Leaf: the
 * functions here change only the watcher's own flags and references. */
#ifndef TIDELOOP_IOWATCH_H
#define TIDELOOP_IOWATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <assert.h>

/* 0, or -1 with an exception set (as every function of the core). */
typedef int (*tl_io_fn)(PyObject *owner);

typedef struct {
    tl_io_fn fn;              /* the owner's reader or writer, in C */
    const char *name;         /* its Python method ("_read_ready"): for
                                 reports, debug mode and _selector */
    PyObject *owner;          /* the object it lives in (borrowed) */
    PyObject *context;        /* a copy of the context at arm time, as
                                 asyncio's add_reader Handle takes one */
    unsigned char armed;      /* in the fd table (which holds a reference
                                 to the owner meanwhile) */
    unsigned char queued;     /* in the ready queue (holding a reference) */
    unsigned char stale;      /* disarmed while queued: skip that item, as
                                 asyncio skips a cancelled Handle */
} tl_io_watcher;

/* The states' invariant: each flag 0 or 1 (stale means something only
 * while queued: a push clears it, a skipped item leaves it). */
static inline int
tl_io_watcher_ok(const tl_io_watcher *w)
{
    return w->fn != NULL && w->owner != NULL && w->armed <= 1 &&
           w->queued <= 1 && w->stale <= 1;
}

/* Armed in an fd slot: runs in ctx (stolen); the table holds a reference
 * to the owner meanwhile. */
static inline void
tl_io_arm(tl_io_watcher *w, PyObject *ctx)
{
    assert(!w->armed && tl_io_watcher_ok(w));
    Py_XSETREF(w->context, ctx);
    w->armed = 1;
    Py_INCREF(w->owner);
}

/* Armed again, as asyncio's add_reader replaces its Handle: the context is
 * ctx (stolen), and an event already queued is dropped (the poller reports
 * the fd again if it is still ready). */
static inline void
tl_io_rearm(tl_io_watcher *w, PyObject *ctx)
{
    assert(w->armed && tl_io_watcher_ok(w));
    Py_XSETREF(w->context, ctx);
    if (w->queued)
        w->stale = 1;
}

/* Out of its slot: an item already queued is skipped (as asyncio skips a
 * cancelled Handle); the table's reference to the owner goes. */
static inline void
tl_io_disarm(tl_io_watcher *w)
{
    assert(w->armed && tl_io_watcher_ok(w));
    assert(Py_REFCNT(w->owner) > 1 || !w->queued);   /* the table's and the queue's */
    w->armed = 0;
    if (w->queued)
        w->stale = 1;
    Py_CLEAR(w->context);
    Py_DECREF(w->owner);
}

/* An event queues the watcher once (a second event before it ran is the
 * same): 1 if the caller queues it now, with a new reference to the owner
 * for the queue; 0 if it is queued already. */
static inline int
tl_io_mark_queued(tl_io_watcher *w)
{
    assert(tl_io_watcher_ok(w));
    w->stale = 0;
    if (w->queued)
        return 0;
    w->queued = 1;
    Py_INCREF(w->owner);
    return 1;
}

/* Its item left the ready queue (to run, or cleared): the queue's
 * reference to the owner passes to the caller. */
static inline PyObject *
tl_io_unqueue(tl_io_watcher *w)
{
    assert(w->queued);
    w->queued = 0;
    return w->owner;
}

#endif
