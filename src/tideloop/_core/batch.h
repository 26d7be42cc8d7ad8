/* Running one item of the ready queue, shared by the loop's two batch loops
 * (loop.c run_batch, timing.c tl_run_batch_timed): a Handle (inlined in
 * both: call_soon's cost is mostly this path) or an io watcher (ready.h).
 * Static in each of those two files, the only ones to include it, so that
 * the compiler sees what the batch loop calls. */
#ifndef TIDELOOP_BATCH_H
#define TIDELOOP_BATCH_H

#include "internal.h"

/* A callback run as asyncio's debug mode runs it: loop._current_handle set,
 * a slow one reported. */
static int
run_ready_debug(LoopObject *self, HandleObject *h)
{
    tl_state *st = self->state;
    Py_XSETREF(self->current_handle, Py_NewRef((PyObject *)h));
    double t0 = tl_monotonic();
    int rc = tl_handle_run(h);
    double dt = tl_monotonic() - t0;
    Py_CLEAR(self->current_handle);
    if (rc < 0)
        return -1;
    if (dt >= self->slow_callback_duration) {
        tl_count(&self->health.slow_callbacks, 1);
        PyObject *desc = PyObject_CallOneArg(st->format_handle, (PyObject *)h);
        if (desc == NULL)
            return -1;
        PyObject *r = PyObject_CallMethod(st->logger, "warning", "sOd",
                                          "Executing %s took %.3f seconds",
                                          desc, dt);
        Py_DECREF(desc);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Take the loop's threadsafe_lock for a handle whose cancel() may come from
 * another thread (see handle.c); only the loop thread holds it for long,
 * other threads just pass through it, so the first try nearly always
 * succeeds. */
static void
lock_threadsafe(LoopObject *loop)
{
    if (!PyThread_acquire_lock(loop->threadsafe_lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(loop->threadsafe_lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

/* A queued watcher's run (the loop's batches, batch.h).  In debug mode it
 * runs as a Handle would (current handle, slow-callback report).  Out of
 * line: the batch loop over Handles is the hot one (call_soon's cost). */
static int __attribute__((noinline))
run_io_item(LoopObject *self, tl_io_watcher *w, int *entered)
{
    /* Disarmed after its event was queued (stale), or queued while not
     * armed (a datagram transport resumed after its socket closed): asyncio
     * would find no reader Handle to run. */
    if (w->stale || !w->armed)
        return 0;
    tl_count(&self->health.callbacks, 1);
    if (!self->debug)
        return tl_io_run(self, w, entered);
    tl_batch_exit(self, entered);
    HandleObject *h = tl_io_make_handle(self, w);
    if (h == NULL)
        return -1;
    int rc = run_ready_debug(self, h);
    Py_DECREF(h);
    return rc;
}

static inline __attribute__((always_inline)) int
run_handle_item(LoopObject *self, HandleObject *h, int *entered)
{
    /* 3.14's _ThreadSafeHandle everywhere; on free-threaded builds every
     * handle call_soon_threadsafe() made (its cancel() may race the run). */
    int locked = Py_IS_TYPE(h, self->state->ThreadSafeHandleType) ||
                 (TL_FREE_THREADED && h->threadsafe);
    if (locked)
        lock_threadsafe(self);
    int rc = 0;
    if (tl_handle_cancelled(h)) {
        /* Cancelled by another thread, which left the callback to us. */
        if (TL_FREE_THREADED && h->callback != NULL)
            tl_handle_drop_call(h);
        goto done;
    }
    tl_count(&self->health.callbacks, 1);
    if (self->debug) {
        tl_batch_exit(self, entered);
        rc = run_ready_debug(self, h);
    }
    else {
        rc = tl_handle_run_batched(h, entered);
    }
done:
    if (locked)
        PyThread_release_lock(self->threadsafe_lock);
    return rc;
}

/* The item's run; *held: the reference the queue held (the caller drops
 * it), *w: its io watcher or NULL. */
static inline __attribute__((always_inline)) int
run_item(LoopObject *self, tl_ready_item it, PyObject **held, tl_io_watcher **w,
         int *entered)
{
    *w = tl_ready_io(it);
    if (__builtin_expect(*w == NULL, 1)) {
        *held = (PyObject *)it;
        return run_handle_item(self, (HandleObject *)it, entered);
    }
    *held = tl_io_unqueue(*w);     /* its one item, this one */
    return run_io_item(self, *w, entered);
}

/* After an item ran: the stall the watchdog caught in it, if any. */
static inline __attribute__((always_inline)) int
after_item(LoopObject *self, int rc, PyObject *held, tl_io_watcher *w)
{
    if (__builtin_expect(__atomic_load_n(&self->stall_flag, __ATOMIC_ACQUIRE), 0) && rc == 0)
        rc = tl_stall_report(self, held, w != NULL ? w->name : NULL);
    Py_DECREF(held);
    return rc;
}

#endif
