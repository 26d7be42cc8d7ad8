/* The diagnostics' side of the ready phase: the batch with each callback
 * timed (tideloop.diagnostics: the callback histogram, slow-callback
 * reports, per-task accounting), on the CPU's tick counter, and that
 * counter's calibration against the monotonic clock.  loop.c runs the
 * plain batch; this one only while timing is on (tl_health_timed).
 *
 * May call: watchdog.c, taskstats.c, handle.c (batch.h) and below. */
#include "batch.h"

/* Could the callback be a Task's step or wakeup (tl_task_of_step)?  No
 * for a plain function and for a method (Python or builtin) of the last
 * type found not to be a Task: the common callbacks, told apart here in a
 * few loads. */
static inline int
maybe_task_step(LoopObject *loop, PyObject *callback)
{
    if (callback == NULL)           /* cancelled */
        return 0;
    PyTypeObject *tp = Py_TYPE(callback);
    PyObject *self;
    if (tp == &PyMethod_Type)
        self = PyMethod_GET_SELF(callback);
    else if (tp == &PyCFunction_Type)
        self = PyCFunction_GET_SELF(callback);
    else
        return tp != &PyFunction_Type;
    return self == NULL || (PyObject *)Py_TYPE(self) != loop->not_task_type;
}

/* The batch with each callback timed (callback timing or a slow-callback
 * threshold on; tideloop.diagnostics): the "callback" histogram, and the
 * report of a slow one -- a Task's step with where it started. */
int
tl_run_batch_timed(LoopObject *self, size_t ntodo, int64_t start_ns, int *entered)
{
    tl_health *health = &self->health;
    /* ns = ticks * ns_per_tick, in 32.32 fixed point (0: not measured yet,
     * the clock is read instead) */
    uint64_t tick_ns = health->tick_ns_fixed;
    uint64_t start_ticks = tick_ns ? tl_ticks() : 0;
    int64_t slow_ns = health->slow_ns;      /* a change counts from the next batch */
    int64_t batch_ns = start_ns;
    for (size_t i = 0; i < ntodo && self->ready.len; i++) {
        tl_ready_item it = tl_ready_pop(&self->ready);
        uint64_t ran_before = health->callbacks;
        PyObject *task = NULL, *task_where = NULL;
        size_t queued_before = 0;
        if ((slow_ns || self->tasks != NULL) && tl_ready_io(it) == NULL &&
            maybe_task_step(self, ((HandleObject *)it)->callback) &&
            (task = tl_task_of_step(self, ((HandleObject *)it)->callback)) != NULL) {
            if (slow_ns)
                task_where = tl_task_where(self->state, task);
            self->eager_ns = 0;
            queued_before = self->ready.len;
        }
        PyObject *held;
        tl_io_watcher *w;
        int rc = run_item(self, it, &held, &w, entered);
        int64_t took;
        if (tick_ns) {
            uint64_t t = tl_ticks();
            took = (int64_t)(((unsigned __int128)(t - start_ticks) * tick_ns) >> 32);
            start_ticks = t;
        }
        else {
            int64_t t = tl_now_ns();
            took = t - start_ns;
            start_ns = t;
        }
        /* A report (Python code, and a stall's wait for the watchdog) is
         * no part of the next callback's time: the clock restarts after. */
        int reporting = __atomic_load_n(&self->stall_flag, __ATOMIC_ACQUIRE);
        if (health->callbacks != ran_before) {      /* not a cancelled one */
            tl_hist_record(&health->callback, took);
            if (task != NULL && self->tasks != NULL)
                tl_tasks_step_done(self, task, took, batch_ns,
                                   self->ready.len - queued_before);
            if (slow_ns && took >= slow_ns && rc == 0) {
                reporting = 1;
                rc = tl_slow_report(self, held, w != NULL ? w->name : NULL, took, task,
                                    task_where);
            }
        }
        Py_XDECREF(task);
        Py_XDECREF(task_where);
        if (after_item(self, rc, held, w) < 0)
            return -1;
        if (reporting) {
            if (tick_ns)
                start_ticks = tl_ticks();
            else
                start_ns = tl_now_ns();
        }
    }
    return 0;
}

/* ns per tl_ticks() tick, from the monotonic clock and the ticks since
 * timing was turned on: measured once 50 ms have passed (below that a
 * microsecond of error would be 2e-5), refined each second after. */
void
tl_calibrate_ticks(tl_health *health, int64_t now_ns)
{
    int64_t since = now_ns - health->cal_ns;
    if (since < 50000000 || (health->ns_per_tick > 0 && since < 1000000000))
        return;
    uint64_t ticks = tl_ticks() - health->cal_ticks;
    if (ticks > 0) {
        health->ns_per_tick = (double)since / (double)ticks;
        health->tick_ns_fixed = (uint64_t)(health->ns_per_tick * 4294967296.0);
    }
    if (since >= 1000000000) {      /* a new base: follows a changing rate */
        health->cal_ns = now_ns;
        health->cal_ticks = tl_ticks();
    }
}
