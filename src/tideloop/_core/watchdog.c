/* The stall watchdog: a C thread per watched loop that notices the loop has
 * been inside one callback for longer than a threshold, and has the loop
 * thread's Python stack captured at that moment.  And slow callbacks,
 * attributed to the Task whose step they were (below).
 *
 * The loop pays nothing for it but the progress counters it keeps anyway
 * (health.iterations, health.callbacks: relaxed atomic words) and one test
 * of `stall_flag` per callback.  The watchdog needs no GIL to watch: it
 * wakes every quarter threshold and compares the counters; a loop that is
 * running, not asleep in the poller, and has made no progress for the
 * threshold is stalled.  Only then does it take the GIL (which the loop
 * thread gives up within the switch interval when it runs Python code, and
 * at once when it blocks in a call that releases it: time.sleep, socket
 * I/O) and calls tideloop.diagnostics' capture function for the loop
 * thread's frames.
 *
 * When C code holds the GIL (a long sum(), a regex, a C library call that
 * does not release it), the GIL would come only after the stall, with the
 * loop thread's frames moved on.  So, faulthandler's way: before it waits
 * for the GIL, the watchdog arms a one-shot timer that sends a signal to
 * the loop thread (`nudge_ns` later; cancelled if the GIL comes first).
 * tideloop.diagnostics has registered that signal with faulthandler, whose
 * handler writes the thread's Python stack to a file without the GIL, from
 * inside the stalled thread.  Its frames are the stall's.
 *
 * The loop thread reports the stall, once, when the callback returns
 * (tideloop.diagnostics' report function: the callback, how long, the
 * stack or whether the signal's dump holds it, and the slow-callback
 * details of the same callback when slow callbacks are reported too: one
 * incident, one report).  The watchdog flags the
 * stall as soon as it sees it; the report first waits (without the GIL)
 * for the watchdog's capture attempt to end, and tells it the callback is
 * over, so that it does not capture frames of what runs next.
 *
 * May call: loop.c's shared functions (internal.h), handle.c. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

struct tl_watchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;                   /* under mu */
    int64_t threshold_ns, period_ns;
    LoopObject *loop;           /* borrowed: the loop stops us before it goes */
    /* The loop's interpreter: the watchdog takes the GIL of that one.  In a
     * subinterpreter PyGILState_Ensure() would attach to the main
     * interpreter (its GIL, its objects), so there the thread makes a
     * thread state of its own in the loop's interpreter for each capture. */
    PyInterpreterState *interp;
    int main_interp;
    /* The stall being reported: written by the watchdog under mu, taken
     * by the loop thread under mu once attempt_done (tl_stall_report). */
    int64_t since_ns;           /* the first check that saw no progress */
    int64_t captured_ns;        /* when the stack was taken (or the signal sent) */
    PyObject *stack;            /* the capture function's result */
    int signum;                 /* faulthandler's signal (0: none) */
    int64_t nudge_ns;           /* how long the GIL may take before it is sent */
    int nudged;                 /* it was sent for this stall */
    int over;                   /* the callback returned (atomic) */
    int attempt_done;           /* the capture attempt ended (under mu) */
    /* The loop thread's own (the GIL held): the slow-callback report of
     * the stalled callback, (duration, task, where), kept for the stall's
     * report -- one incident, one report (tl_slow_report). */
    PyObject *slow;
};

static uint64_t
progress(LoopObject *loop)
{
    return TL_ATOMIC_GET(&loop->health.iterations) + TL_ATOMIC_GET(&loop->health.callbacks);
}

/* The loop thread's current frame (a new reference), or None where only
 * sys._current_frames() may read it: on a free-threaded build that stops
 * the world, and another thread's frame may be read only then.  With a GIL
 * the loop thread is detached while we hold it (it cannot leave the
 * callback without the GIL), so its frame stands still; and in a
 * subinterpreter of 3.12/3.13 sys._current_frames() walks every
 * interpreter's threads, frames of other interpreters included. */
static PyObject *
loop_thread_frame(LoopObject *loop)
{
#ifdef Py_GIL_DISABLED
    (void)loop;
    Py_RETURN_NONE;
#else
    PyThreadState *ts = loop->run_tstate;
    PyFrameObject *f = ts != NULL ? PyThreadState_GetFrame(ts) : NULL;
    return f != NULL ? (PyObject *)f : Py_NewRef(Py_None);
#endif
}

/* With the GIL: the capture, if the stall still goes on. */
static void
capture(tl_watchdog *wd, uint64_t seen)
{
    LoopObject *loop = wd->loop;
    tl_state *st = loop->state;
    unsigned long tid = TL_ATOMIC_GET(&loop->thread_id);
    if (tid == 0 || progress(loop) != seen || __atomic_load_n(&wd->over, __ATOMIC_ACQUIRE) ||
        st->diag_capture == NULL)
        return;             /* over (or never watched) while we waited for the GIL */
    PyObject *frame = loop_thread_frame(loop);
    PyObject *stack = PyObject_CallFunction(st->diag_capture, "kN", tid, frame);
    if (stack == NULL) {
        PyErr_WriteUnraisable(st->diag_capture);
        return;
    }
    /* Under mu: without a GIL the loop thread may be taking the last
     * report's fields meanwhile (tl_stall_report). */
    PyObject *old;
    pthread_mutex_lock(&wd->mu);
    wd->captured_ns = tl_now_ns();
    old = wd->stack;
    wd->stack = stack;
    pthread_mutex_unlock(&wd->mu);
    Py_XDECREF(old);
}

/* A one-shot timer that signals the loop thread (faulthandler dumps its
 * stack) unless disarmed within nudge_ns; 0 if armed. */
static int
arm_nudge(tl_watchdog *wd, timer_t *timer)
{
    pid_t tid = TL_ATOMIC_GET(&wd->loop->os_tid);
    if (wd->signum <= 0 || tid <= 0)
        return -1;
    /* Only while faulthandler (or anyone) handles it: the default action
     * of a real-time signal ends the process. */
    struct sigaction now;
    if (sigaction(wd->signum, NULL, &now) != 0 || now.sa_handler == SIG_DFL ||
        now.sa_handler == SIG_IGN)
        return -1;
    struct sigevent ev;
    memset(&ev, 0, sizeof(ev));
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = wd->signum;
    ev.sigev_notify_thread_id = tid;
    if (timer_create(CLOCK_MONOTONIC, &ev, timer) != 0)
        return -1;
    struct itimerspec when = {.it_value = {.tv_sec = wd->nudge_ns / 1000000000,
                                           .tv_nsec = wd->nudge_ns % 1000000000}};
    if (timer_settime(*timer, 0, &when, NULL) != 0) {
        timer_delete(*timer);
        return -1;
    }
    return 0;
}

/* Disarm it: 1 if it had fired already. */
static int
disarm_nudge(timer_t timer)
{
    struct itimerspec off = {0}, left;
    int fired = timer_settime(timer, 0, &off, &left) == 0 &&
                left.it_value.tv_sec == 0 && left.it_value.tv_nsec == 0;
    timer_delete(timer);
    return fired;
}

static void *
watchdog_main(void *arg)
{
    tl_watchdog *wd = arg;
    LoopObject *loop = wd->loop;
    uint64_t last = progress(loop);
    int64_t same_since = tl_now_ns();
    int reported = 0;
    pthread_mutex_lock(&wd->mu);
    while (!wd->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        int64_t ns = until.tv_nsec + wd->period_ns;
        until.tv_sec += ns / 1000000000;
        until.tv_nsec = ns % 1000000000;
        int rc = 0;
        while (!wd->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&wd->cv, &wd->mu, &until);
        if (wd->stop)
            break;
        int64_t now = tl_now_ns();
        uint64_t p = progress(loop);
        if (p != last || TL_ATOMIC_GET(&loop->thread_id) == 0 ||
            TL_ATOMIC_GET(&loop->sleeping)) {
            last = p;
            same_since = now;
            reported = 0;
            continue;
        }
        if (reported || now - same_since < wd->threshold_ns - wd->period_ns)
            continue;
        reported = 1;       /* once per stall */
        wd->since_ns = same_since - wd->period_ns / 2;
        wd->nudged = 0;
        wd->attempt_done = 0;
        __atomic_store_n(&wd->over, 0, __ATOMIC_RELAXED);
        /* From here the loop thread reports the stall after its callback. */
        __atomic_store_n(&loop->stall_flag, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&wd->mu);
        timer_t timer;
        int armed = arm_nudge(wd, &timer) == 0;
        int64_t asked = tl_now_ns();
        /* The capture may wait as well as the GIL: a free-threaded build
         * stops the world for sys._current_frames(), which C code holding
         * on delays the same way. */
        PyGILState_STATE g = PyGILState_UNLOCKED;
        PyThreadState *ts = NULL;
        if (wd->main_interp)
            g = PyGILState_Ensure();
        else {
            ts = PyThreadState_New(wd->interp);
            PyEval_RestoreThread(ts);
        }
        capture(wd, p);
        int dumped = armed && disarm_nudge(timer);      /* the dump came first */
        PyObject *dropped = NULL;
        pthread_mutex_lock(&wd->mu);
        if (dumped) {
            wd->nudged = 1;
            wd->captured_ns = asked + wd->nudge_ns;
            dropped = wd->stack;
            wd->stack = NULL;
        }
        pthread_mutex_unlock(&wd->mu);
        Py_XDECREF(dropped);
        if (ts == NULL)
            PyGILState_Release(g);
        else {
            PyThreadState_Clear(ts);
            PyThreadState_DeleteCurrent();
        }
        pthread_mutex_lock(&wd->mu);
        wd->attempt_done = 1;
        pthread_cond_broadcast(&wd->cv);
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

/* Stop and free the loop's watchdog, if any (the GIL is let go while it
 * ends: it may be waiting for it). */
void
tl_watchdog_stop(LoopObject *loop)
{
    tl_watchdog *wd = loop->watchdog;
    if (wd == NULL)
        return;
    loop->watchdog = NULL;
    pthread_mutex_lock(&wd->mu);
    wd->stop = 1;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(wd->thread, NULL);
    Py_END_ALLOW_THREADS
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
    Py_CLEAR(wd->stack);
    Py_CLEAR(wd->slow);
    loop->stall_flag = 0;
    PyMem_RawFree(wd);
}

static int
watchdog_start(LoopObject *loop, double threshold, int signum)
{
    tl_watchdog *wd = PyMem_RawCalloc(1, sizeof(*wd));
    if (wd == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    wd->loop = loop;
    wd->interp = PyInterpreterState_Get();
    wd->main_interp = wd->interp == PyInterpreterState_Main();
    wd->threshold_ns = (int64_t)(threshold * 1e9);
    wd->period_ns = wd->threshold_ns / 4 > 1000000 ? wd->threshold_ns / 4 : 1000000;
    /* Python code hands the GIL over within the switch interval (5 ms):
     * the signal is for C code that does not. */
    wd->signum = signum;
    wd->nudge_ns = 20000000;
    wd->attempt_done = 1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&wd->mu, NULL);
    int rc = pthread_create(&wd->thread, NULL, watchdog_main, wd);
    if (rc != 0) {
        pthread_cond_destroy(&wd->cv);
        pthread_mutex_destroy(&wd->mu);
        PyMem_RawFree(wd);
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_setname_np(wd->thread, "tideloop-watch");     /* in ps, /proc, gdb */
    loop->watchdog = wd;
    return 0;
}

/* The loop thread, right after the callback that stalled (`what`: its
 * Handle, or the owner of a C reader/writer): the report, then ready for
 * the next one.  0, or -1 with an exception set. */
int
tl_stall_report(LoopObject *loop, PyObject *what, const char *io_name)
{
    tl_watchdog *wd = loop->watchdog;
    __atomic_store_n(&loop->stall_flag, 0, __ATOMIC_RELAXED);
    tl_state *st = loop->state;
    if (wd == NULL)
        return 0;
    int64_t end = tl_now_ns();
    /* The callback is over: the watchdog's capture attempt (waiting for
     * the GIL we hold, or for the signal's dump) ends without taking what
     * runs next. */
    __atomic_store_n(&wd->over, 1, __ATOMIC_RELEASE);
    /* The report's fields are taken under mu, once the attempt ended: the
     * watchdog may see a next stall while the report's Python code runs. */
    int64_t since, captured;
    int nudged;
    PyObject *stack;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&wd->mu);
    while (!wd->attempt_done && !wd->stop)
        pthread_cond_wait(&wd->cv, &wd->mu);
    since = wd->since_ns;
    captured = wd->captured_ns;
    nudged = wd->nudged;
    stack = wd->stack;
    wd->stack = NULL;
    pthread_mutex_unlock(&wd->mu);
    Py_END_ALLOW_THREADS
    PyObject *slow = wd->slow;
    wd->slow = NULL;
    if (st->diag_report == NULL) {
        Py_XDECREF(stack);
        Py_XDECREF(slow);
        return 0;
    }
    PyObject *r = PyObject_CallFunction(
        st->diag_report, "OOsdddOiO", (PyObject *)loop, what, io_name,
        (double)(end - since) * 1e-9, (double)since * 1e-9,
        (double)(captured - since) * 1e-9, stack != NULL ? stack : Py_None, nudged,
        slow != NULL ? slow : Py_None);
    Py_XDECREF(stack);
    Py_XDECREF(slow);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ---- slow callbacks ----
 *
 * With a slow-callback threshold every callback is timed; before a Handle
 * runs, the Task whose step it is (if any) and where it is suspended are
 * noted (taskstats.c: tl_task_of_step, tl_task_where), so that a slow step
 * can be reported with where it started and where it ended. */

/* A callback took took_ns (at least the threshold): tideloop.diagnostics
 * reports it.  task: the Task whose step it was (or NULL), where: where it
 * was suspended before the step (tl_task_where, or NULL). */
int
tl_slow_report(LoopObject *loop, PyObject *what, const char *io_name, int64_t took_ns,
               PyObject *task, PyObject *where)
{
    tl_state *st = loop->state;
    tl_count(&loop->health.slow_callbacks, 1);
    if (st->diag_slow == NULL)
        return 0;
    tl_watchdog *wd = loop->watchdog;
    if (wd != NULL && __atomic_load_n(&loop->stall_flag, __ATOMIC_ACQUIRE)) {
        /* The watchdog caught this callback stalled: its report, right
         * after this, carries the slow step's details too. */
        PyObject *slow = Py_BuildValue("(dOO)", (double)took_ns * 1e-9,
                                       task != NULL ? task : Py_None,
                                       where != NULL ? where : Py_None);
        if (slow == NULL)
            return -1;
        Py_XSETREF(wd->slow, slow);
        return 0;
    }
    PyObject *r = PyObject_CallFunction(st->diag_slow, "OOzdOO", (PyObject *)loop, what,
                                        io_name, (double)took_ns * 1e-9,
                                        task != NULL ? task : Py_None,
                                        where != NULL ? where : Py_None);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* *seconds = the threshold `arg` gives (0: None, off).  `what` names it in
 * the error. */
static int
parse_threshold(LoopObject *loop, PyObject *arg, const char *what, double *seconds)
{
    *seconds = 0;
    if (arg == Py_None)
        return 0;
    *seconds = PyFloat_AsDouble(arg);
    if (*seconds == -1 && PyErr_Occurred())
        return -1;
    if (!(*seconds > 0) || *seconds > 86400) {
        PyErr_Format(PyExc_ValueError, "the %s threshold must be a number of seconds "
                     "above 0 (and at most a day), or None", what);
        return -1;
    }
    if (loop->state->diag_report == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "import tideloop.diagnostics first");
        return -1;
    }
    return 0;
}

/* loop._set_slow_callback_threshold(seconds|None) -> the previous one:
 * report callbacks that take at least this long (callback timing on). */
static PyObject *
loop_set_slow_callback_threshold(LoopObject *self, PyObject *arg)
{
    double seconds;
    if (parse_threshold(self, arg, "slow-callback", &seconds) < 0)
        return NULL;
    PyObject *prev = self->health.slow_ns == 0
                     ? Py_NewRef(Py_None)
                     : PyFloat_FromDouble((double)self->health.slow_ns * 1e-9);
    if (prev == NULL)
        return NULL;
    if (seconds > 0)
        tl_health_start_timing(&self->health);
    self->health.slow_ns = (int64_t)(seconds * 1e9);
    return prev;
}

/* loop._set_stall_threshold(seconds|None) -> the previous one (None: not
 * watched).  A new threshold restarts the watchdog. */
static PyObject *
loop_set_stall_threshold(LoopObject *self, PyObject *args)
{
    PyObject *arg;
    int signum = 0;
    if (!PyArg_ParseTuple(args, "O|i:_set_stall_threshold", &arg, &signum))
        return NULL;
    double threshold;
    if (parse_threshold(self, arg, "stall", &threshold) < 0 ||
        (arg != Py_None && tl_check_closed(self) < 0))
        return NULL;
    PyObject *prev = self->watchdog == NULL
                     ? Py_NewRef(Py_None)
                     : PyFloat_FromDouble((double)self->watchdog->threshold_ns * 1e-9);
    if (prev == NULL)
        return NULL;
    tl_watchdog_stop(self);
    if (arg != Py_None && watchdog_start(self, threshold, signum) < 0) {
        Py_DECREF(prev);
        return NULL;
    }
    return prev;
}

/* _core._diag_setup(capture, report, slow, asyncio_dir, task_types):
 * tideloop.diagnostics' functions (see the top of this file and the slow
 * callbacks above), the directory of asyncio's own modules and the Task
 * classes (C and Python). */
static PyObject *
diag_setup(PyObject *module, PyObject *args)
{
    tl_state *st = PyModule_GetState(module);
    PyObject *cap, *rep, *slow, *dir, *types;
    if (!PyArg_ParseTuple(args, "OOOUO!:_diag_setup", &cap, &rep, &slow, &dir,
                          &PyTuple_Type, &types))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++)
        if (!PyType_Check(PyTuple_GET_ITEM(types, i))) {
            PyErr_SetString(PyExc_TypeError, "_diag_setup: task types must be types");
            return NULL;
        }
    Py_XSETREF(st->diag_asyncio_dir, Py_NewRef(dir));
    Py_XSETREF(st->diag_task_types, Py_NewRef(types));
    Py_XSETREF(st->diag_capture, Py_NewRef(cap));
    Py_XSETREF(st->diag_report, Py_NewRef(rep));
    Py_XSETREF(st->diag_slow, Py_NewRef(slow));
    Py_RETURN_NONE;
}

/* loop._thread_frame() -> the frame the loop's thread is in now, read
 * from its thread state (GIL builds), or None: not running, or a
 * free-threaded build (where only sys._current_frames() may read it).
 * The live view's "where is it now" for a loop that does not answer. */
static PyObject *
loop_thread_frame_method(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    if (TL_ATOMIC_GET(&self->thread_id) == 0)
        Py_RETURN_NONE;
    return loop_thread_frame(self);
}

const PyMethodDef tl_diag_loop_methods[] = {
    {"_thread_frame", (PyCFunction)loop_thread_frame_method, METH_NOARGS, NULL},
    {"_set_stall_threshold", (PyCFunction)loop_set_stall_threshold, METH_VARARGS, NULL},
    {"_set_slow_callback_threshold", (PyCFunction)loop_set_slow_callback_threshold, METH_O,
     NULL},
    {NULL, NULL, 0, NULL},
};

const PyMethodDef tl_diag_module_methods[] = {
    {"_diag_setup", diag_setup, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};
