/* The Loop type: one iteration = poll timeout -> poll -> dispatch fds ->
 * expired timers -> run the callbacks that were ready when it began.
 *
 * Owns the iteration, the ready queue, the timers, call_soon/call_later/
 * call_at, run_forever/stop/close, signals' wakeup pipe, create_future/
 * create_task.  The fd methods (add_reader, ...) are fdtable.c's, the
 * transport factories and sock_* methods the transports' and sockops.c's;
 * module.c adds them to the Loop type.
 *
 * May call: fdtable.c, handle.c, recvbuf.c, heap, poller. */
#define _GNU_SOURCE
#include "batch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <math.h>
#include <structmember.h>
#include <sys/eventfd.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAXIMUM_SELECT_TIMEOUT (24.0 * 3600.0)

#define HANDLE_OF_NODE(n) \
    ((HandleObject *)((char *)(n) - offsetof(HandleObject, node)))

/* ---- checks shared by the public methods ---- */

static int
check_thread(LoopObject *self)
{
    if (self->thread_id == 0)
        return 0;
    if (PyThread_get_thread_ident() != self->thread_id) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Non-thread-safe operation invoked on an event loop "
                        "other than the current one");
        return -1;
    }
    return 0;
}

static int
check_callback(LoopObject *self, PyObject *callback, const char *method)
{
    tl_state *st = self->state;
    PyObject *r = PyObject_CallOneArg(st->iscoroutine, callback);
    if (r == NULL)
        return -1;
    int is_coro = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (!is_coro) {
        r = PyObject_CallOneArg(st->iscoroutinefunction, callback);
        if (r == NULL)
            return -1;
        is_coro = PyObject_IsTrue(r);
        Py_DECREF(r);
    }
    if (is_coro < 0)
        return -1;
    if (is_coro) {
        PyErr_Format(PyExc_TypeError, "coroutines cannot be used with %s()",
                     method);
        return -1;
    }
    if (!PyCallable_Check(callback)) {
        PyErr_Format(PyExc_TypeError,
                     "a callable object was expected by %s(), got %R", method,
                     callback);
        return -1;
    }
    return 0;
}

/* Keyword names arrive as interned strings, but not always as our own
 * object (CPython's Task passes its own "context"): compare cheaply. */
static inline int
is_kw(PyObject *k, PyObject *interned, const char *s, Py_ssize_t len)
{
    if (k == interned)
        return 1;
    return PyUnicode_IS_COMPACT_ASCII(k) && PyUnicode_GET_LENGTH(k) == len &&
           memcmp(PyUnicode_DATA(k), s, (size_t)len) == 0;
}

/* Parse (fixed positionals..., callback, *args, context=None). */
static int
parse_callback_call(LoopObject *self, const char *method, PyObject *const *args,
                    Py_ssize_t nargs, PyObject *kwnames, Py_ssize_t nfixed,
                    const char *const *fixed_names, PyObject **context)
{
    *context = NULL;
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nkw; i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (is_kw(k, self->state->str_context, "context", 7)) {
                *context = args[nargs + i];
            }
            else {
                PyErr_Format(PyExc_TypeError,
                             "%s() got an unexpected keyword argument '%U'",
                             method, k);
                return -1;
            }
        }
    }
    if (nargs < nfixed + 1) {
        Py_ssize_t missing = nfixed + 1 - nargs;
        const char *name = nargs < nfixed ? fixed_names[nargs] : "callback";
        PyErr_Format(PyExc_TypeError,
                     "%s() missing %zd required positional argument%s: '%s'",
                     method, missing, missing > 1 ? "s" : "", name);
        return -1;
    }
    if (*context == Py_None)
        *context = NULL;
    return 0;
}

/* ---- ready queue (ready.h) ---- */

/* Steals the reference to h. */
static inline int
ready_push(LoopObject *self, HandleObject *h)
{
    return tl_ready_push(&self->ready, (PyObject *)h);
}

/* ---- the inbox: what other threads schedule (free-threaded builds) ---- */

static void write_wakeup(LoopObject *self);
static int timer_push(LoopObject *self, HandleObject *h);

#if TL_FREE_THREADED
/* From a thread that does not own the loop: h (a Handle to run, or a
 * TimerHandle to schedule; stolen) waits in the inbox; the loop is woken if
 * it sleeps.  Under inbox_lock, so that close() cannot close the wakeup fd
 * meanwhile and the loop cannot start sleeping without seeing h. */
static int
inbox_push(LoopObject *self, HandleObject *h)
{
    PyMutex_Lock(&self->inbox_lock);
    int rc, wake = 0;
    if (self->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Event loop is closed");
        rc = -1;
    }
    else {
        Py_INCREF(h);
        rc = tl_ready_push(&self->inbox, (PyObject *)h);
        wake = rc == 0 && TL_ATOMIC_GET(&self->sleeping);
        if (wake)
            write_wakeup(self);
    }
    PyMutex_Unlock(&self->inbox_lock);
    Py_DECREF(h);
    return rc;
}

static inline int
inbox_waiting(LoopObject *self)
{
    return __atomic_load_n(&self->inbox.len, __ATOMIC_ACQUIRE) != 0;
}

/* On the loop's thread: move the inbox, in arrival order, to the ready
 * queue and the timer heap.  The items are taken under the lock (the inbox
 * and the queue taken last trade places) and moved outside it: dropping a
 * cancelled one may run Python code, which may schedule (not drain again
 * meanwhile). */
static int
inbox_drain(LoopObject *self)
{
    if (self->inbox_draining)
        return 0;
    PyMutex_Lock(&self->inbox_lock);
    tl_ready_swap(&self->inbox, &self->inbox_taken);
    PyMutex_Unlock(&self->inbox_lock);
    self->inbox_draining = 1;
    tl_ready_queue *q = &self->inbox_taken;
    int rc = 0;
    while (q->len) {
        HandleObject *h = (HandleObject *)tl_ready_pop(q);
        if (rc < 0 || tl_handle_cancelled(h)) {
            Py_DECREF(h);
        }
        else if (Py_IS_TYPE(h, self->state->TimerHandleType)) {
            rc = timer_push(self, h);
        }
        else {
            rc = ready_push(self, h);
        }
    }
    self->inbox_draining = 0;
    return rc;
}

/* Before the poll: 1 when the loop may sleep (nothing in the inbox; from
 * now on every push wakes it), else 0. */
static int
inbox_begin_sleep(LoopObject *self)
{
    PyMutex_Lock(&self->inbox_lock);
    int empty = self->inbox.len == 0;
    if (empty)
        TL_ATOMIC_SET(&self->sleeping, 1);
    PyMutex_Unlock(&self->inbox_lock);
    return empty;
}
#else
static inline int inbox_waiting(LoopObject *self) { (void)self; return 0; }
static inline int inbox_drain(LoopObject *self) { (void)self; return 0; }
static inline int
inbox_begin_sleep(LoopObject *self)
{
    TL_ATOMIC_SET(&self->sleeping, 1);
    return 1;
}
#endif

/* ---- timers ---- */

/* Into the heap, after every timer scheduled before it; steals h (the
 * heap's reference). */
static int
timer_push(LoopObject *self, HandleObject *h)
{
    assert(!h->scheduled && h->node.index == TL_HEAP_NOT_IN);
    h->node.seq = self->timer_seq++;
    if (tl_heap_push(&self->timers, &h->node) < 0) {
        Py_DECREF(h);
        PyErr_NoMemory();
        return -1;
    }
    h->scheduled = 1;
    return 0;
}

static void
timers_clear(LoopObject *self)
{
    tl_heap_node *n;
    while ((n = tl_heap_pop(&self->timers)) != NULL) {
        HandleObject *h = HANDLE_OF_NODE(n);
        assert(h->scheduled);   /* scheduled: in the heap, which holds h */
        h->scheduled = 0;
        Py_DECREF(h);
    }
}

static int
ensure_events_buffer(LoopObject *self)
{
    int want = (int)self->fds_registered + 1;
    if (want > 256)
        want = 256;
    if (want <= self->events_cap)
        return 0;
    tl_poll_event *ev = PyMem_Realloc(self->events, want * sizeof(*ev));
    if (ev == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->events = ev;
    self->events_cap = want;
    return 0;
}

/* ---- wakeup ---- */

/* The wakeup eventfd and the signal pipe are non-blocking and ours: their
 * calls cannot wait for a signal, and write_wakeup() may run in any thread
 * (call_soon_threadsafe), so their EINTR retries run no signal handlers
 * (the loop's poll does, tl_retry_eintr everywhere else). */

static void
write_wakeup(LoopObject *self)
{
    if (self->wakeup_fd < 0 || tl_loop_is_forked(self))
        return;
    uint64_t one = 1;
    ssize_t r;
    do {
        r = write(self->wakeup_fd, &one, sizeof(one));
    } while (r < 0 && errno == EINTR);
    /* EAGAIN: the counter is already non-zero, so a wakeup is pending. */
}

static void
drain_wakeup(LoopObject *self)
{
    uint64_t v;
    ssize_t r;
    do {
        r = read(self->wakeup_fd, &v, sizeof(v));
    } while (r < 0 && errno == EINTR);
}

/* Signal numbers written by the interpreter's C signal handler. */
static int
drain_signal_pipe(LoopObject *self)
{
    unsigned char buf[256];
    for (;;) {
        ssize_t n = read(self->signal_rfd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == 0)
                continue;
            PyObject *sig = PyLong_FromLong(buf[i]);
            if (sig == NULL)
                return -1;
            PyObject *h = PyDict_GetItemWithError(self->signal_handlers, sig);
            if (h == NULL) {
                Py_DECREF(sig);
                if (PyErr_Occurred())
                    return -1;
                continue;   /* a handler removed while the byte was in flight */
            }
            if (((HandleObject *)h)->cancelled) {
                PyObject *r = PyObject_CallMethodOneArg(
                    (PyObject *)self, self->state->str_remove_signal_handler,
                    sig);
                Py_DECREF(sig);
                if (r == NULL)
                    return -1;
                Py_DECREF(r);
                continue;
            }
            Py_DECREF(sig);
            Py_INCREF(h);
            if (ready_push(self, (HandleObject *)h) < 0)
                return -1;
        }
    }
}

/* ---- one iteration ---- */

static int
dispatch_events(LoopObject *self, int n)
{
    for (int i = 0; i < n; i++) {
        int fd = self->events[i].fd;
        int mask = self->events[i].mask;
        if (fd < 0 || (size_t)fd >= self->fds_cap)
            continue;
        tl_fdentry *e = &self->fds[fd];
        if (e->internal == TL_FD_WAKEUP) {
            drain_wakeup(self);
            continue;
        }
        if (e->internal == TL_FD_SIGNAL) {
            if (drain_signal_pipe(self) < 0)
                return -1;
            continue;
        }
        tl_count(&self->health.io_events, 1);
        if (tl_fd_dispatch(self, fd, mask) < 0)
            return -1;
    }
    return 0;
}

/* The batch: the ntodo callbacks that were ready when it began. */
static int
run_batch(LoopObject *self, size_t ntodo, int *entered)
{
    for (size_t i = 0; i < ntodo && self->ready.len; i++) {
        PyObject *held;
        tl_io_watcher *w;
        int rc = run_item(self, tl_ready_pop(&self->ready), &held, &w, entered);
        if (after_item(self, rc, held, w) < 0)
            return -1;
    }
    return 0;
}

/* The time the loop's timers are measured against: the C clock, or the
 * instance's own time() where one was set on the instance.  The stock loop
 * calls self.time() in call_later() and in each iteration, and tests patch
 * it (mock.patch.object(loop, "time")) to move a loop's clock. */
static int
loop_clock(LoopObject *self, double *now)
{
    if (!self->time_overridden) {
        *now = tl_monotonic();
        return 0;
    }
    PyObject *r = PyObject_CallMethod((PyObject *)self, "time", NULL);
    if (r == NULL)
        return -1;
    *now = PyFloat_AsDouble(r);
    Py_DECREF(r);
    return *now == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int
loop_setattro(LoopObject *self, PyObject *name, PyObject *value)
{
    if (PyObject_GenericSetAttr((PyObject *)self, name, value) < 0)
        return -1;
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "time") == 0)
        self->time_overridden = value != NULL;
    return 0;
}

/* One iteration, in phases (asyncio's _run_once, libuv's uv_run): the poll
 * timeout, the poll and what it woke, the expired timers, the ready
 * callbacks.  The phases are inlined: run_once is the loop's hot path. */
#define TL_PHASE static inline __attribute__((always_inline))

/* Phase 1: how long the poll may wait (0: something is ready or stopping;
 * -1: no timer, wait for I/O). */
TL_PHASE int
compute_timeout(LoopObject *self, int64_t *timeout_ns)
{
    *timeout_ns = -1;
    if (self->ready.len || TL_ATOMIC_GET(&self->stopping)) {
        *timeout_ns = 0;
        return 0;
    }
    tl_heap_node *top = tl_heap_top(&self->timers);
    if (top == NULL)
        return 0;
    double now;                         /* the phase's clock read */
    if (loop_clock(self, &now) < 0)
        return -1;
    double t = top->key - now;
    if (!(t > 0))
        *timeout_ns = 0;
    else if (t > MAXIMUM_SELECT_TIMEOUT)
        *timeout_ns = (int64_t)(MAXIMUM_SELECT_TIMEOUT * 1e9);
    else
        *timeout_ns = (int64_t)ceil(t * 1e9);
    return 0;
}

/* The poll itself: the number of events, or -1 with an exception set;
 * *woke_ns: when it returned. */
TL_PHASE int
poll_events(LoopObject *self, int64_t timeout_ns, int64_t *woke_ns)
{
    tl_health *health = &self->health;
    int n;
    *woke_ns = 0;
    if (timeout_ns == 0 && self->fds_registered == self->fds_internal &&
        self->signal_rfd < 0) {
        /* Callbacks are ready and no fd but our wakeup eventfd is watched:
         * a zero-timeout poll could only report that eventfd, which is
         * written only while we sleep.  Skip the syscall (~0.5 us). */
        n = 0;
    }
    else if (timeout_ns == 0) {
        /* Nothing to wait for: poll without giving up the GIL. */
        tl_count(&health->polls, 1);
        n = tl_poller_poll(self->poller, self->events, self->events_cap, 0);
    }
    else if (self->signals_unchecked && (self->signals_unchecked = 0, PyErr_CheckSignals() < 0)) {
        /* A signal that cut a blocking send() short (sockops.c) has its
         * Python handler run before the loop sleeps, as Python code runs it
         * at its next instruction; Ctrl-C raises here.  Only then: the
         * check costs every sleep. */
        return -1;
    }
    else if (self->ready.len || TL_ATOMIC_GET(&self->stopping) || !inbox_begin_sleep(self)) {
        /* A handler (or another thread) scheduled something: do not sleep. */
        tl_count(&health->polls, 1);
        n = tl_poller_poll(self->poller, self->events, self->events_cap, 0);
    }
    else {
        /* sleeping is set (read by call_soon_threadsafe and the watchdog) */
        int64_t t0 = self->ran_ns ? self->ran_ns : tl_now_ns();
        tl_count(&health->polls, 1);
        Py_BEGIN_ALLOW_THREADS
        n = tl_poller_poll(self->poller, self->events, self->events_cap,
                           timeout_ns);
        Py_END_ALLOW_THREADS
        TL_ATOMIC_SET(&self->sleeping, 0);
        *woke_ns = tl_now_ns();
        tl_health_slept(health, *woke_ns - t0);
        /* A second with nothing to do: the readers' lent buffer storage
         * goes back to the allocator (compat.h). */
        if (self->state->storage_pool.n && *woke_ns - t0 >= 1000000000)
            tl_storage_pool_clear(&self->state->storage_pool);
    }
    if (*woke_ns == 0)
        *woke_ns = tl_now_ns();
    if (n < 0) {
        if (errno != EINTR) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        /* A signal: run its Python handler now (Ctrl-C raises here). */
        if (PyErr_CheckSignals() < 0)
            return -1;
        n = 0;
    }
    return n;
}

/* Phase 2: poll, and queue what it woke (and what other threads sent). */
TL_PHASE int
poll_phase(LoopObject *self, int64_t timeout_ns, int64_t *woke_ns)
{
    if (ensure_events_buffer(self) < 0)
        return -1;
    if (self->dirty_len) {
        tl_fd_flush_dirty(self);
        self->ran_ns = 0;       /* its system calls are not sleep */
    }
    int n = poll_events(self, timeout_ns, woke_ns);
    if (n < 0)
        return -1;
    /* The I/O callbacks queued now were ready when the poll returned:
     * their wait counts from then, without another clock read. */
    if (n > 0 && self->ready.first_ns == 0)
        self->ready.first_ns = *woke_ns;
    if (n > 0 && dispatch_events(self, n) < 0)
        return -1;
    if (inbox_waiting(self) && inbox_drain(self) < 0)
        return -1;
    return 0;
}

/* Phase 3: the expired timers queued, in deadline order (ties in
 * scheduling order).  *start_ns: when the batch starts (the phase's clock
 * read, or the poll's return when there is no timer). */
TL_PHASE int
expire_timers(LoopObject *self, int64_t woke_ns, int64_t *start_ns)
{
    *start_ns = woke_ns;
    if (self->timers.len == 0)
        return 0;
    double now = tl_monotonic();
    *start_ns = (int64_t)(now * 1e9);
    double timer_now = now;
    if (self->time_overridden && loop_clock(self, &timer_now) < 0)
        return -1;
    double step = self->clock_resolution;
    if (self->state->timer_end_ulp) {
        /* 3.15: end_time strictly after now even where the clock's
         * resolution is below a double's spacing (a long uptime). */
        double ulp = nextafter(timer_now, INFINITY) - timer_now;
        if (ulp > step)
            step = ulp;
    }
    double end_time = timer_now + step;
    tl_heap_node *top;
    while ((top = tl_heap_top(&self->timers)) != NULL && top->key < end_time) {
        tl_heap_pop(&self->timers);
        HandleObject *h = HANDLE_OF_NODE(top);
        assert(h->scheduled && top->index == TL_HEAP_NOT_IN);
        h->scheduled = 0;
        tl_health_timer_fired(&self->health, timer_now - top->key);
        if (ready_push(self, h) < 0)   /* the heap's reference moves */
            return -1;
    }
    return 0;
}

/* Phase 4: the callbacks that were ready now (those they schedule wait
 * for the next iteration). */
TL_PHASE int
run_ready(LoopObject *self, int64_t woke_ns, int64_t start_ns)
{
    tl_health *health = &self->health;
    size_t ntodo = self->ready.len;
    tl_health_batch_lag(health, ntodo, start_ns, self->ready.first_ns);
    self->ready.first_ns = 0;
    int timing = tl_health_timed(health);
    int entered = 0;
    int rc = __builtin_expect(timing, 0)
                 ? tl_run_batch_timed(self, ntodo, start_ns, &entered)
                 : run_batch(self, ntodo, &entered);
    tl_batch_exit(self, &entered);
    int64_t end_ns = tl_now_ns();       /* the phase's clock read */
    self->ran_ns = end_ns;
    tl_health_ran(health, end_ns - woke_ns);
    if (timing)
        tl_calibrate_ticks(health, end_ns);
    return rc;
}

static int
run_once(LoopObject *self)
{
    tl_count(&self->health.iterations, 1);
    if (inbox_waiting(self) && inbox_drain(self) < 0)
        return -1;
    int64_t timeout_ns, woke_ns, start_ns;
    if (compute_timeout(self, &timeout_ns) < 0 ||
        poll_phase(self, timeout_ns, &woke_ns) < 0 ||
        expire_timers(self, woke_ns, &start_ns) < 0)
        return -1;
    return run_ready(self, woke_ns, start_ns);
}

/* ---- Python methods ---- */

static PyObject *
loop_time(LoopObject *Py_UNUSED(self), PyObject *Py_UNUSED(ignored))
{
    return PyFloat_FromDouble(tl_monotonic());
}

static PyObject *
schedule_soon(LoopObject *self, const char *method, PyObject *const *args,
              Py_ssize_t nargsf, PyObject *kwnames, int threadsafe)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *context = NULL;
    if (kwnames != NULL || nargs == 0) {
        if (parse_callback_call(self, method, args, nargs, kwnames, 0, NULL,
                                &context) < 0)
            return NULL;
    }
    if (tl_check_closed(self) < 0)
        return NULL;
    if (self->debug) {
        if (!threadsafe && check_thread(self) < 0)
            return NULL;
        if (check_callback(self, args[0], method) < 0)
            return NULL;
    }
    tl_state *st = self->state;
    /* 3.14: call_soon_threadsafe() gives a _ThreadSafeHandle (handle.c). */
    PyTypeObject *type = threadsafe && st->ThreadSafeHandleType != NULL
                         ? st->ThreadSafeHandleType : st->HandleType;
    HandleObject *h = tl_handle_new(st, type, self, args[0],
                                    args + 1, nargs - 1, context, 0);
    if (h == NULL)
        return NULL;
    h->threadsafe = (char)threadsafe;
    Py_INCREF(h);
#if TL_FREE_THREADED
    /* The ready queue is the loop thread's: from any other thread (and a
     * threadsafe call while the loop runs nowhere) through the inbox. */
    unsigned long tid = __atomic_load_n(&self->thread_id, __ATOMIC_ACQUIRE);
    unsigned long me = PyThread_get_thread_ident();
    if (tid != me && (threadsafe || tid != 0)) {
        if (inbox_push(self, h) < 0) {
            Py_DECREF(h);
            return NULL;
        }
        return (PyObject *)h;
    }
    /* Earlier threadsafe calls first, as they came. */
    if (inbox_waiting(self) && inbox_drain(self) < 0) {
        Py_DECREF(h);
        Py_DECREF(h);
        return NULL;
    }
#endif
    if (ready_push(self, h) < 0) {
        Py_DECREF(h);
        return NULL;
    }
    if (threadsafe && TL_ATOMIC_GET(&self->sleeping))
        write_wakeup(self);
    return (PyObject *)h;
}

static PyObject *
loop_call_soon(LoopObject *self, PyObject *const *args, Py_ssize_t nargsf,
               PyObject *kwnames)
{
    return schedule_soon(self, "call_soon", args, nargsf, kwnames, 0);
}

static PyObject *
loop_call_soon_threadsafe(LoopObject *self, PyObject *const *args,
                          Py_ssize_t nargsf, PyObject *kwnames)
{
    return schedule_soon(self, "call_soon_threadsafe", args, nargsf, kwnames, 1);
}

static int
number_to_double(PyObject *o, double *out)
{
    if (PyFloat_CheckExact(o)) {
        *out = PyFloat_AS_DOUBLE(o);
        return 0;
    }
    /* The stock loop takes any `when` and fails later, comparing it in the
     * timer heap or with time() (a TypeError too): say what is wrong now. */
    if (!PyNumber_Check(o) || PyComplex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "when must be a real number, not %.200s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = PyFloat_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred())
        return -1;
    return 0;
}

static PyObject *
schedule_at(LoopObject *self, const char *method, double when,
            PyObject *const *args, Py_ssize_t nargs, PyObject *context)
{
    if (tl_check_closed(self) < 0)
        return NULL;
    if (self->debug) {
        if (check_thread(self) < 0)
            return NULL;
        if (check_callback(self, args[0], method) < 0)
            return NULL;
    }
    tl_state *st = self->state;
    HandleObject *h = tl_handle_new(st, st->TimerHandleType, self, args[0],
                                    args + 1, nargs - 1, context, 0);
    if (h == NULL)
        return NULL;
    h->when = when;
    h->node.key = isnan(when) ? -INFINITY : when;
    Py_INCREF(h);   /* one reference for the heap, one for the caller */
#if TL_FREE_THREADED
    if (!tl_loop_owned_here(self)) {
        /* Another thread runs the loop: the heap is its own. */
        if (inbox_push(self, h) < 0) {
            Py_DECREF(h);
            return NULL;
        }
        return (PyObject *)h;
    }
#endif
    if (timer_push(self, h) < 0) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

PyObject *
tl_loop_call_later(LoopObject *self, double delay, PyObject *callback)
{
    PyObject *args[1] = {callback};
    double now;
    if (loop_clock(self, &now) < 0)
        return NULL;
    return schedule_at(self, "call_later", now + delay, args, 1, NULL);
}

static PyObject *
loop_call_later(LoopObject *self, PyObject *const *args, Py_ssize_t nargsf,
                PyObject *kwnames)
{
    static const char *const fixed[] = {"delay"};
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *context;
    if (parse_callback_call(self, "call_later", args, nargs, kwnames, 1, fixed,
                            &context) < 0)
        return NULL;
    if (args[0] == Py_None) {
        PyErr_SetString(PyExc_TypeError, "delay must not be None");
        return NULL;
    }
    double now, when;
    if (loop_clock(self, &now) < 0)
        return NULL;
    PyObject *delay = args[0];
    if (PyFloat_CheckExact(delay)) {
        when = now + PyFloat_AS_DOUBLE(delay);
    }
    else if (PyLong_CheckExact(delay)) {
        double d = PyLong_AsDouble(delay);
        if (d == -1.0 && PyErr_Occurred())
            return NULL;
        when = now + d;
    }
    else {
        /* asyncio computes self.time() + delay: same result, same errors. */
        PyObject *pnow = PyFloat_FromDouble(now);
        if (pnow == NULL)
            return NULL;
        PyObject *sum = PyNumber_Add(pnow, delay);
        Py_DECREF(pnow);
        if (sum == NULL)
            return NULL;
        int rc = number_to_double(sum, &when);
        Py_DECREF(sum);
        if (rc < 0)
            return NULL;
    }
    return schedule_at(self, "call_at", when, args + 1, nargs - 1, context);
}

static PyObject *
loop_call_at(LoopObject *self, PyObject *const *args, Py_ssize_t nargsf,
             PyObject *kwnames)
{
    static const char *const fixed[] = {"when"};
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *context;
    if (parse_callback_call(self, "call_at", args, nargs, kwnames, 1, fixed,
                            &context) < 0)
        return NULL;
    if (args[0] == Py_None) {
        PyErr_SetString(PyExc_TypeError, "when cannot be None");
        return NULL;
    }
    double when;
    if (number_to_double(args[0], &when) < 0)
        return NULL;
    PyObject *h = schedule_at(self, "call_at", when, args + 1, nargs - 1, context);
    if (h != NULL && !PyFloat_CheckExact(args[0]))
        ((HandleObject *)h)->when_given = Py_NewRef(args[0]);
    return h;
}

static PyObject *
loop_stop(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    TL_ATOMIC_SET(&self->stopping, 1);    /* any thread may call it */
    Py_RETURN_NONE;
}

static PyObject *
loop_is_running(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(TL_ATOMIC_GET(&self->thread_id) != 0);
}

/* What asyncio's create_task and friends call first (borrowed methods too). */
static PyObject *
loop_check_closed(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    if (tl_check_closed(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
loop_is_closed(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(TL_ATOMIC_GET(&self->closed));
}

static PyObject *
loop_get_debug(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->debug);
}

static PyObject *
loop_set_debug_flag(LoopObject *self, PyObject *enabled)
{
    int v = PyObject_IsTrue(enabled);
    if (v < 0)
        return NULL;
    self->debug = v;
    Py_RETURN_NONE;
}

static PyObject *
loop_run_once(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    if (tl_check_closed(self) < 0 || tl_check_fork(self) < 0)
        return NULL;
    self->ran_ns = 0;
    if (run_once(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Call self.<name>(arg), tolerating a missing method (bare core loop). */
static int
call_optional_method(LoopObject *self, PyObject *name, PyObject *arg)
{
    PyObject *meth = PyObject_GetAttr((PyObject *)self, name);
    if (meth == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    PyObject *r = PyObject_CallOneArg(meth, arg);
    Py_DECREF(meth);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
install_asyncgen_hooks(LoopObject *self)
{
    tl_state *st = self->state;
    PyObject *first = PyObject_GetAttr((PyObject *)self,
                                       st->str_asyncgen_firstiter_hook);
    PyObject *fin = first ? PyObject_GetAttr((PyObject *)self,
                                             st->str_asyncgen_finalizer_hook)
                          : NULL;
    if (fin == NULL) {
        Py_XDECREF(first);
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    PyObject *kw = Py_BuildValue("{OOOO}", st->str_firstiter, first,
                                 st->str_finalizer, fin);
    Py_DECREF(first);
    Py_DECREF(fin);
    if (kw == NULL)
        return -1;
    PyObject *empty = PyTuple_New(0);
    PyObject *r = empty ? PyObject_Call(st->set_asyncgen_hooks, empty, kw) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(kw);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* While the loop runs, a bound call_soon in the instance's __dict__ (an
 * instance that has one and no call_soon of its own there): found before
 * the class's method, it spares 3.11's C Task and Future a new bound method
 * per step and done callback (they fetch loop.call_soon with a plain
 * getattr), and 3.12+ call it quicker.  Only while it runs: the bound method
 * is a cycle through the dict, and a loop that is not running must be freed
 * as soon as its last user lets go, not at the next collection.  *bound:
 * what unbind_call_soon takes back (NULL: nothing was put there). */
static int
bind_call_soon(LoopObject *self, PyObject **bound)
{
    *bound = NULL;
    if (Py_TYPE(self)->tp_dictoffset == 0)
        return 0;                       /* the C type itself: no __dict__ */
    PyObject *name = self->state->str_call_soon;
    PyObject *d = PyObject_GenericGetDict((PyObject *)self, NULL);
    if (d == NULL)
        return -1;
    int rc = PyDict_Contains(d, name);
    if (rc == 0) {
        PyObject *m = PyObject_GetAttr((PyObject *)self, name);
        rc = m == NULL || PyDict_SetItem(d, name, m) < 0 ? -1 : 0;
        if (rc == 0)
            *bound = m;
        else
            Py_XDECREF(m);
    }
    Py_DECREF(d);
    return rc < 0 ? -1 : 0;
}

/* Take back what bind_call_soon put there, unless something replaced it. */
static int
unbind_call_soon(LoopObject *self, PyObject *bound)
{
    if (bound == NULL)
        return 0;
    PyObject *name = self->state->str_call_soon;
    PyObject *d = PyObject_GenericGetDict((PyObject *)self, NULL);
    int rc = d == NULL ? -1 : 0;
    if (rc == 0) {
        PyObject *cur = PyDict_GetItemWithError(d, name);    /* borrowed */
        if (cur == bound)
            rc = PyDict_DelItem(d, name);
        else if (cur == NULL && PyErr_Occurred())
            rc = -1;
    }
    Py_XDECREF(d);
    Py_DECREF(bound);
    return rc;
}

/* A step of run_forever()'s cleanup: done once more if it failed (a failed
 * allocation must not leave asyncio thinking this loop still runs, or its
 * hooks installed), the first failure kept as the step's error.  -1 when
 * the first try failed. */
static int
cleanup_step(PyObject *(*step)(PyObject *, PyObject *), PyObject *a, PyObject *b)
{
    PyObject *r = step(a, b);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    PyObject *err = tl_err_get_raised();
    r = step(a, b);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    tl_err_set_raised(err);
    return -1;
}

static PyObject *
reset_running_loop(PyObject *events, PyObject *name)
{
    return PyObject_CallMethodOneArg(events, name, Py_None);
}

static PyObject *
restore_asyncgen_hooks(PyObject *set_hooks, PyObject *old_hooks)
{
    return PyObject_Call(set_hooks, old_hooks, NULL);
}

static PyObject *
loop_run_forever(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    tl_state *st = self->state;
    if (tl_check_closed(self) < 0 || tl_check_fork(self) < 0)
        return NULL;
    if (self->thread_id != 0) {
        PyErr_SetString(PyExc_RuntimeError, "This event loop is already running");
        return NULL;
    }
    PyObject *running = PyObject_CallMethodNoArgs(st->events_module,
                                                  st->str_get_running_loop);
    if (running == NULL)
        return NULL;
    Py_DECREF(running);
    if (running != Py_None) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Cannot run the event loop while another loop is running");
        return NULL;
    }
    if (call_optional_method(self, st->str_set_coroutine_origin_tracking,
                             self->debug ? Py_True : Py_False) < 0)
        return NULL;
    PyObject *old_hooks = PyObject_CallNoArgs(st->get_asyncgen_hooks);
    if (old_hooks == NULL)
        return NULL;

    PyObject *bound_call_soon;
    if (bind_call_soon(self, &bound_call_soon) < 0) {
        Py_DECREF(old_hooks);
        return NULL;
    }

    int failed = 0;
    TL_ATOMIC_SET(&self->thread_id, PyThread_get_thread_ident());
    TL_ATOMIC_SET(&self->os_tid, (pid_t)syscall(SYS_gettid));
    self->run_tstate = PyThreadState_Get();
    if (install_asyncgen_hooks(self) < 0) {
        failed = 1;
    }
    else {
        PyObject *r = PyObject_CallMethodOneArg(
            st->events_module, st->str_set_running_loop, (PyObject *)self);
        if (r == NULL) {
            failed = 1;
        }
        else {
            Py_DECREF(r);
            self->ran_ns = 0;
            for (;;) {
                if (run_once(self) < 0) {
                    failed = 1;
                    break;
                }
                if (TL_ATOMIC_GET(&self->stopping))
                    break;
            }
        }
    }

    /* finally: */
    PyObject *exc = tl_err_get_raised();
    TL_ATOMIC_SET(&self->stopping, 0);
    TL_ATOMIC_SET(&self->thread_id, 0UL);
    self->run_tstate = NULL;
    if (cleanup_step(reset_running_loop, st->events_module, st->str_set_running_loop) < 0)
        failed = 2;
    if (failed != 2 &&
        call_optional_method(self, st->str_set_coroutine_origin_tracking,
                             Py_False) < 0)
        failed = 2;
    if (failed != 2 &&
        cleanup_step(restore_asyncgen_hooks, st->set_asyncgen_hooks, old_hooks) < 0)
        failed = 2;
    Py_DECREF(old_hooks);
    /* Always taken back (a cleanup error above is kept, and wins). */
    PyObject *cleanup_exc = tl_err_get_raised();
    if (unbind_call_soon(self, bound_call_soon) < 0) {
        failed = 2;
        if (cleanup_exc == NULL)
            cleanup_exc = tl_err_get_raised();
        else
            PyErr_WriteUnraisable((PyObject *)self);
    }
    tl_err_set_raised(cleanup_exc);
    if (exc != NULL) {
        /* As asyncio's `finally:`: an error of the cleanup replaces the
         * one that ended the run, which becomes its __context__. */
        tl_err_chain(exc);
        return NULL;
    }
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
loop_write_to_self(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    write_wakeup(self);
    Py_RETURN_NONE;
}

/* The core part of close(); tideloop.Loop.close adds executor and signal
 * cleanup around it. */
static PyObject *
loop_close(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->thread_id != 0) {
        PyErr_SetString(PyExc_RuntimeError, "Cannot close a running event loop");
        return NULL;
    }
    if (self->closed)
        Py_RETURN_NONE;
#if TL_FREE_THREADED
    PyMutex_Lock(&self->inbox_lock);
    TL_ATOMIC_SET(&self->closed, 1);
    tl_ready_queue pending = tl_ready_take(&self->inbox);
    PyMutex_Unlock(&self->inbox_lock);
    tl_ready_clear(&pending);
    PyMem_Free(pending.items);
    tl_ready_clear(&self->inbox_taken);
#else
    self->closed = 1;
#endif
    tl_watchdog_stop(self);
    tl_ready_clear(&self->ready);
    timers_clear(self);
    tl_fd_clear_all(self);
    for (size_t fd = 0; fd < self->fds_cap; fd++) {
        tl_fdentry *e = &self->fds[fd];
        e->mask = 0;
        e->oneshot = 0;
        e->dormant = 0;
        e->dirty = 0;
        e->internal = 0;
        e->transport = NULL;
    }
    self->dirty_len = 0;
    self->fds_registered = 0;
    self->fds_internal = 0;
    if (self->poller != NULL) {
        if (tl_loop_is_forked(self))
            tl_poller_abandon(self->poller);
        else
            tl_poller_free(self->poller);
        self->poller = NULL;
    }
#if TL_FREE_THREADED
    PyMutex_Lock(&self->inbox_lock);
#endif
    if (self->wakeup_fd >= 0) {
        close(self->wakeup_fd);
        self->wakeup_fd = -1;
    }
#if TL_FREE_THREADED
    PyMutex_Unlock(&self->inbox_lock);
#endif
    Py_RETURN_NONE;
}

int
tl_loop_call_soon(LoopObject *self, PyObject *callback, PyObject *const *args,
                  Py_ssize_t nargs, PyObject *context)
{
    if (tl_check_closed(self) < 0)
        return -1;
    tl_state *st = self->state;
    HandleObject *h = tl_handle_new(st, st->HandleType, self, callback, args,
                                    nargs, context, 0);
    if (h == NULL)
        return -1;
#if TL_FREE_THREADED
    if (!tl_loop_owned_here(self))
        return inbox_push(self, h);
    if (inbox_waiting(self) && inbox_drain(self) < 0) {
        Py_DECREF(h);
        return -1;
    }
#endif
    return ready_push(self, h);
}

int
tl_loop_report(LoopObject *self, const char *message, PyObject *exc, ...)
{
    tl_state *st = self->state;
    PyObject *ctx = PyDict_New();
    if (ctx == NULL)
        return -1;
    PyObject *msg = PyUnicode_FromString(message);
    if (msg == NULL || PyDict_SetItem(ctx, st->str_message, msg) < 0) {
        Py_XDECREF(msg);
        Py_DECREF(ctx);
        return -1;
    }
    Py_DECREF(msg);
    if (exc != NULL && PyDict_SetItem(ctx, st->str_exception, exc) < 0) {
        Py_DECREF(ctx);
        return -1;
    }
    va_list va;
    va_start(va, exc);
    for (;;) {
        const char *key = va_arg(va, const char *);
        if (key == NULL)
            break;
        PyObject *value = va_arg(va, PyObject *);
        if (value != NULL && PyDict_SetItemString(ctx, key, value) < 0) {
            va_end(va);
            Py_DECREF(ctx);
            return -1;
        }
    }
    va_end(va);
    PyObject *r = PyObject_CallMethodOneArg((PyObject *)self,
                                            st->str_call_exception_handler, ctx);
    Py_DECREF(ctx);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* callable(*pos, loop=loop, name=name, context=context), each keyword left
 * out when NULL (npos <= 2); the keyword-name tuples are made at import. */
static PyObject *
call_with_keywords(tl_state *st, PyObject *callable, PyObject *const *pos,
                   Py_ssize_t npos, PyObject *loop, PyObject *name,
                   PyObject *context)
{
    PyObject *argv[5];
    Py_ssize_t n = 0;
    int mask = 0;
    for (Py_ssize_t i = 0; i < npos; i++)
        argv[n++] = pos[i];
    if (loop != NULL) {
        argv[n++] = loop;
        mask |= TL_KW_LOOP;
    }
    if (name != NULL) {
        argv[n++] = name;
        mask |= TL_KW_NAME;
    }
    if (context != NULL) {
        argv[n++] = context;
        mask |= TL_KW_CONTEXT;
    }
    return PyObject_Vectorcall(callable, argv, npos, st->kwnames[mask]);
}

/* A new reference to module_dict[name]: the class the stock loop would call
 * (it reads asyncio.futures.Future / asyncio.tasks.Task at call time, and
 * tests and applications replace them), else the one seen at import. */
static PyObject *
current_class(PyObject *module_dict, PyObject *name, PyObject *imported)
{
    PyObject *cls = PyDict_GetItemWithError(module_dict, name);
    if (cls == NULL && PyErr_Occurred())
        return NULL;
    return Py_NewRef(cls != NULL ? cls : imported);
}

PyObject *
tl_loop_create_future(LoopObject *self)
{
    tl_state *st = self->state;
    PyObject *cls = current_class(st->futures_dict, st->str_Future, st->Future);
    if (cls == NULL)
        return NULL;
    /* Future(loop=self), or Future() when this thread runs this loop:
     * Future's own lookup of the running loop finds it, and no keyword
     * dict is made (type objects take keywords through a dict). */
    PyObject *fut = self->thread_id == PyThread_get_thread_ident()
                        ? PyObject_CallNoArgs(cls)
                        : call_with_keywords(st, cls, NULL, 0, (PyObject *)self,
                                             NULL, NULL);
    Py_DECREF(cls);
    return fut;
}

static PyObject *
loop_create_future(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    return tl_loop_create_future(self);
}

/* create_task(coro[, name=][, context=]) with a task factory, as this
 * interpreter's BaseEventLoop.create_task does it (st->create_task_style,
 * read off that method by tideloop._compat):
 *   HELPER    3.11-3.12: factory(loop, coro[, context=]), then
 *             tasks._set_task_name(task, name);
 *   SET_NAME  3.13: the same, then task.set_name(name), even for None;
 *   KWARGS    3.14: factory(loop, coro, name=..., context=...) as given. */
static PyObject *
create_task_with_factory(LoopObject *self, PyObject *coro, PyObject *name,
                         PyObject *context)
{
    tl_state *st = self->state;
    int kwargs_style = st->create_task_style == TL_CREATE_TASK_KWARGS;
    PyObject *fargs[2] = {(PyObject *)self, coro};
    PyObject *factory = Py_NewRef(self->task_factory);
    PyObject *task = call_with_keywords(
        st, factory, fargs, 2, NULL,
        kwargs_style && name != Py_None ? name : NULL,
        context != Py_None ? context : NULL);
    Py_DECREF(factory);
    if (task == NULL || kwargs_style)
        return task;
    PyObject *r;
    if (st->create_task_style == TL_CREATE_TASK_HELPER) {
        if (name == Py_None)
            return task;
        r = PyObject_CallFunctionObjArgs(st->set_task_name, task, name, NULL);
    }
    else {
        r = PyObject_CallMethodOneArg(task, st->str_set_name, name);
    }
    if (r == NULL)
        Py_CLEAR(task);
    Py_XDECREF(r);
    return task;
}

/* func(self, *args, **kw) for a vectorcall's arguments (the caller's spare
 * slot before args is used when it offers one). */
static PyObject *
call_with_self(PyObject *func, PyObject *self, PyObject *const *args,
               Py_ssize_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    if (nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET) {
        PyObject **slot = (PyObject **)args - 1;
        PyObject *saved = *slot;
        *slot = self;
        PyObject *r = PyObject_Vectorcall(func, slot, nargs + 1, kwnames);
        *slot = saved;
        return r;
    }
    PyObject *small[8];
    PyObject **buf = total + 1 <= 8 ? small
                                    : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    if (buf == NULL)
        return PyErr_NoMemory();
    buf[0] = self;
    for (Py_ssize_t i = 0; i < total; i++)
        buf[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall(func, buf, nargs + 1, kwnames);
    if (buf != small)
        PyMem_Free(buf);
    return r;
}

static PyObject *
loop_create_task(LoopObject *self, PyObject *const *args, Py_ssize_t nargsf,
                 PyObject *kwnames)
{
    /* The common case in C: no task factory, create_task(coro[, name=,
     * context=]).  Everything else (a task factory, other keywords such as
     * 3.14's eager_start, wrong calls) goes through the stock
     * BaseEventLoop.create_task of this interpreter, so its semantics and
     * error messages are the stock loop's, version by version. */
    tl_state *st = self->state;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *name = Py_None, *context = Py_None;
    int fast = nargs == 1 && (self->task_factory == NULL ||
                              st->create_task_style != TL_CREATE_TASK_STOCK);
    if (fast && kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (is_kw(k, st->str_name, "name", 4))
                name = args[nargs + i];
            else if (is_kw(k, st->str_context, "context", 7))
                context = args[nargs + i];
            else
                fast = 0;
        }
    }
    if (!fast)
        return call_with_self(st->create_task_stock, (PyObject *)self, args,
                              nargsf, kwnames);
    if (tl_check_closed(self) < 0)
        return NULL;
    if (self->task_factory != NULL) {
        if (self->tasks == NULL)
            return create_task_with_factory(self, args[0], name, context);
        /* Tracked: the factory may run the task's first step (an eager
         * task), which is the task's time, not the caller's. */
        int64_t t0 = tl_now_ns(), outer = self->eager_ns;
        self->eager_ns = 0;
        PyObject *task = create_task_with_factory(self, args[0], name, context);
        int64_t took = tl_now_ns() - t0, inner = self->eager_ns;
        self->eager_ns = outer + took;
        if (task != NULL && self->tasks != NULL)
            tl_tasks_created(self, task, t0, took, inner);
        return task;
    }
    PyObject *cls = current_class(st->tasks_dict, st->str_Task, st->Task);
    if (cls == NULL)
        return NULL;
    PyObject *task = call_with_keywords(st, cls, args, 1, (PyObject *)self,
                                        name != Py_None ? name : NULL,
                                        context != Py_None ? context : NULL);
    Py_DECREF(cls);
    if (task != NULL && self->tasks != NULL)
        tl_tasks_created(self, task, tl_now_ns(), -1, 0);
    return task;
}

static PyObject *
loop_set_task_factory(LoopObject *self, PyObject *factory)
{
    if (factory != Py_None && !PyCallable_Check(factory)) {
        PyErr_SetString(PyExc_TypeError,
                        "task factory must be a callable or None");
        return NULL;
    }
    Py_XSETREF(self->task_factory,
               factory == Py_None ? NULL : Py_NewRef(factory));
    Py_RETURN_NONE;
}

static PyObject *
loop_get_task_factory(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef(self->task_factory ? self->task_factory : Py_None);
}

/* Open the pipe the interpreter's signal handler writes signal numbers to;
 * returns its write end for signal.set_wakeup_fd(). */
static PyObject *
loop_signal_pipe_open(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    if (tl_check_closed(self) < 0 || tl_check_fork(self) < 0)
        return NULL;
    if (self->signal_wfd >= 0)
        return PyLong_FromLong(self->signal_wfd);
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (tl_fd_register_internal(self, p[0], TL_FD_SIGNAL) < 0) {
        close(p[0]);
        close(p[1]);
        return NULL;
    }
    self->signal_rfd = p[0];
    self->signal_wfd = p[1];
    return PyLong_FromLong(self->signal_wfd);
}

static PyObject *
loop_signal_pipe_close(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->signal_rfd >= 0) {
        if (!self->closed)
            tl_fd_unregister_internal(self, self->signal_rfd);
        close(self->signal_rfd);
        close(self->signal_wfd);
        self->signal_rfd = self->signal_wfd = -1;
    }
    Py_RETURN_NONE;
}

/* An unscheduled Handle, for signal handlers (asyncio builds them with
 * events.Handle(callback, args, loop, None)). */
static PyObject *
loop_make_handle(LoopObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "_make_handle() needs a callback");
        return NULL;
    }
    tl_state *st = self->state;
    return (PyObject *)tl_handle_new(st, st->HandleType, self, args[0],
                                     args + 1, nargs - 1, NULL, 1);
}

/* One histogram as plain data: {"counts": [64 ints], "sum": seconds,
 * "max": seconds}; the buckets' lower bounds are _core.HISTOGRAM_BOUNDS. */
static PyObject *
hist_to_dict(const tl_hist *h)
{
    PyObject *counts = PyList_New(TL_HIST_BUCKETS);
    if (counts == NULL)
        return NULL;
    for (int i = 0; i < TL_HIST_BUCKETS; i++) {
        PyObject *c = PyLong_FromUnsignedLongLong(TL_ATOMIC_GET(&h->counts[i]));
        if (c == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SET_ITEM(counts, i, c);
    }
    return Py_BuildValue("{sNsdsd}", "counts", counts,
                         "sum", (double)TL_ATOMIC_GET(&h->sum_ns) * 1e-9,
                         "max", (double)TL_ATOMIC_GET(&h->max_ns) * 1e-9);
}

/* loop._diagnostics() -> the loop's health as plain data (see
 * tideloop.diagnostics); safe from any thread. */
static PyObject *
loop_diagnostics(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    tl_health *h = &self->health;
    PyObject *hists = Py_BuildValue(
        "{sNsNsNsNsN}",
        "iteration", hist_to_dict(&h->iteration),
        "poll", hist_to_dict(&h->poll),
        "scheduling_lag", hist_to_dict(&h->lag),
        "timer_lateness", hist_to_dict(&h->lateness),
        "callback", hist_to_dict(&h->callback));
    if (hists == NULL)
        return NULL;
    return Py_BuildValue(
        "{sKsKsKsKsKsKsdsdsnsnsnsssOsdsN}",
        "iterations", (unsigned long long)TL_ATOMIC_GET(&h->iterations),
        "polls", (unsigned long long)TL_ATOMIC_GET(&h->polls),
        "callbacks", (unsigned long long)TL_ATOMIC_GET(&h->callbacks),
        "io_events", (unsigned long long)TL_ATOMIC_GET(&h->io_events),
        "timers_fired", (unsigned long long)TL_ATOMIC_GET(&h->timers_fired),
        "slow_callbacks", (unsigned long long)TL_ATOMIC_GET(&h->slow_callbacks),
        "time_polling", (double)TL_ATOMIC_GET(&h->poll_ns) * 1e-9,
        "time_running", (double)TL_ATOMIC_GET(&h->run_ns) * 1e-9,
        "ready", (Py_ssize_t)TL_ATOMIC_GET(&self->ready.len),
        "timers", (Py_ssize_t)TL_ATOMIC_GET(&self->timers.len),
        "fds", (Py_ssize_t)(TL_ATOMIC_GET(&self->fds_registered) -
                            TL_ATOMIC_GET(&self->fds_internal)),
        "backend", tl_poller_name(),
        "callback_timing", tl_health_timed(h) ? Py_True : Py_False,
        "since", (double)TL_ATOMIC_GET(&h->since_ns) * 1e-9,
        "histograms", hists);
}

/* loop._reset_diagnostics(): counters and histograms back to zero (the
 * settings stay). */
static PyObject *
loop_reset_diagnostics(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    /* Word by word, atomically: the loop thread may be recording. */
    _Static_assert(TL_HEALTH_RESET_SIZE % sizeof(uint64_t) == 0, "words");
    uint64_t *w = (uint64_t *)&self->health;
    for (size_t i = 0; i < TL_HEALTH_RESET_SIZE / sizeof(uint64_t); i++)
        TL_ATOMIC_SET(&w[i], 0);
    TL_ATOMIC_SET(&self->health.since_ns, tl_now_ns());
    Py_RETURN_NONE;
}

/* loop._set_callback_timing(on) -> the previous setting: time each
 * callback (the "callback" histogram), at a tick-counter read per callback. */
static PyObject *
loop_set_callback_timing(LoopObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    PyObject *prev = PyBool_FromLong(self->health.timing);
    if (on)
        tl_health_start_timing(&self->health);
    self->health.timing = on;
    return prev;
}

static PyObject *
loop_get_current_handle(LoopObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(self->current_handle ? self->current_handle : Py_None);
}

static PyObject *
loop_get_signal_handlers(LoopObject *self, void *Py_UNUSED(c))
{
    return Py_NewRef(self->signal_handlers);
}

static PyObject *
loop_get_thread_id(LoopObject *self, void *Py_UNUSED(c))
{
    if (self->thread_id == 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(self->thread_id);
}

static PyObject *
loop_get_stopping(LoopObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(TL_ATOMIC_GET(&self->stopping));
}

static PyObject *
loop_get_debug_attr(LoopObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->debug);
}

static PyObject *
loop_get_closed(LoopObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->closed);
}

static PyObject *
loop_get_clock_resolution(LoopObject *self, void *Py_UNUSED(c))
{
    return PyFloat_FromDouble(self->clock_resolution);
}

static PyObject *
loop_get_slow(LoopObject *self, void *Py_UNUSED(c))
{
    return PyFloat_FromDouble(self->slow_callback_duration);
}

static int
loop_set_slow(LoopObject *self, PyObject *v, void *Py_UNUSED(c))
{
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError,
                        "cannot delete slow_callback_duration");
        return -1;
    }
    double d = PyFloat_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred())
        return -1;
    self->slow_callback_duration = d;
    return 0;
}

/* ---- type plumbing ---- */

static PyObject *
loop_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)args;
    (void)kwds;
    LoopObject *self = (LoopObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    /* tp_alloc zeroed the object. */
    self->wakeup_fd = self->signal_rfd = self->signal_wfd = -1;
    self->slow_callback_duration = 0.1;
    self->health.since_ns = tl_now_ns();
    PyObject *m = NULL;
    for (PyTypeObject *t = type; t != NULL; t = t->tp_base) {
        if (t->tp_flags & Py_TPFLAGS_HEAPTYPE) {
            m = PyType_GetModule(t);
            if (m != NULL)
                break;
            /* A heap type of another module (a subclass): look further. */
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                Py_DECREF(self);
                return NULL;
            }
            PyErr_Clear();
        }
    }
    if (m == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_TypeError, "tideloop core module not found");
        return NULL;
    }
    self->state = (tl_state *)PyModule_GetState(m);
    self->fork_generation = self->state->fork_generation;
    struct timespec res;
    clock_getres(CLOCK_MONOTONIC, &res);
    self->clock_resolution = (double)res.tv_sec + (double)res.tv_nsec * 1e-9;
    self->signal_handlers = PyDict_New();
    if (self->signal_handlers == NULL)
        goto error;
    self->run_ctx = PyContext_New();
    if (self->run_ctx == NULL)
        goto error;
    self->poller = tl_poller_create();
    if (self->poller == NULL) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto error;
    }
    self->wakeup_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->wakeup_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto error;
    }
    if (tl_fd_register_internal(self, self->wakeup_fd, TL_FD_WAKEUP) < 0)
        goto error;
    self->threadsafe_lock = PyThread_allocate_lock();
    if (self->threadsafe_lock == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static int
loop_traverse(LoopObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    int rc = tl_ready_traverse(&self->ready, visit, arg);
#if TL_FREE_THREADED
    if (rc == 0)
        rc = tl_ready_traverse(&self->inbox, visit, arg);
    if (rc == 0)
        rc = tl_ready_traverse(&self->inbox_taken, visit, arg);
#endif
    if (rc == 0)
        rc = tl_fd_traverse(self, visit, arg);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < self->timers.len; i++)
        Py_VISIT(HANDLE_OF_NODE(self->timers.nodes[i]));
    Py_VISIT(self->current_handle);
    Py_VISIT(self->run_ctx);
    Py_VISIT(self->task_factory);
    Py_VISIT(self->signal_handlers);
    Py_VISIT(self->fileobjs);
    Py_VISIT(self->not_task_type);
    Py_VISIT(self->dict);
    return 0;
}

static int
loop_clear(LoopObject *self)
{
#if TL_FREE_THREADED
    tl_ready_clear(&self->inbox);
#endif
    tl_ready_clear(&self->ready);
    timers_clear(self);
    tl_fd_clear_all(self);
    Py_CLEAR(self->current_handle);
    tl_recvbuf_clear(&self->recv);
    Py_CLEAR(self->run_ctx);
    Py_CLEAR(self->task_factory);
    Py_CLEAR(self->signal_handlers);
    Py_CLEAR(self->fileobjs);
    Py_CLEAR(self->not_task_type);
    Py_CLEAR(self->dict);
    return 0;
}

static void
loop_dealloc(LoopObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tl_watchdog_stop(self);
    tl_tasks_free(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    loop_clear(self);
    if (self->poller != NULL) {
        if (tl_loop_is_forked(self))
            tl_poller_abandon(self->poller);
        else
            tl_poller_free(self->poller);
    }
    if (self->wakeup_fd >= 0)
        close(self->wakeup_fd);
    if (self->signal_rfd >= 0) {
        close(self->signal_rfd);
        close(self->signal_wfd);
    }
    if (self->threadsafe_lock != NULL)
        PyThread_free_lock(self->threadsafe_lock);
    PyMem_Free(self->ready.items);
#if TL_FREE_THREADED
    PyMem_Free(self->inbox.items);
    PyMem_Free(self->inbox_taken.items);
#endif
    PyMem_Free(self->fds);
    PyMem_Free(self->events);
    PyMem_Free(self->dirty_fds);
    tl_recvbuf_clear(&self->recv);
    tl_heap_free(&self->timers);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef loop_methods[] = {
    {"time", (PyCFunction)loop_time, METH_NOARGS,
     "Return the time according to the loop's clock (time.monotonic())."},
    {"call_soon", (PyCFunction)(void (*)(void))loop_call_soon,
     METH_FASTCALL | METH_KEYWORDS,
     "call_soon(callback, *args, context=None) -> Handle"},
    {"call_soon_threadsafe", (PyCFunction)(void (*)(void))loop_call_soon_threadsafe,
     METH_FASTCALL | METH_KEYWORDS,
     "Like call_soon(), but thread-safe: wakes the loop if it sleeps."},
    {"call_later", (PyCFunction)(void (*)(void))loop_call_later,
     METH_FASTCALL | METH_KEYWORDS,
     "call_later(delay, callback, *args, context=None) -> TimerHandle"},
    {"call_at", (PyCFunction)(void (*)(void))loop_call_at,
     METH_FASTCALL | METH_KEYWORDS,
     "call_at(when, callback, *args, context=None) -> TimerHandle"},
    {"stop", (PyCFunction)loop_stop, METH_NOARGS,
     "Stop after the current iteration."},
    {"is_running", (PyCFunction)loop_is_running, METH_NOARGS, NULL},
    {"is_closed", (PyCFunction)loop_is_closed, METH_NOARGS, NULL},
    {"_check_closed", (PyCFunction)loop_check_closed, METH_NOARGS, NULL},
    {"get_debug", (PyCFunction)loop_get_debug, METH_NOARGS, NULL},
    {"_set_debug_flag", (PyCFunction)loop_set_debug_flag, METH_O, NULL},
    {"run_forever", (PyCFunction)loop_run_forever, METH_NOARGS,
     "Run until stop() is called."},
    {"_run_once", (PyCFunction)loop_run_once, METH_NOARGS,
     "Run one iteration of the loop."},
    {"_write_to_self", (PyCFunction)loop_write_to_self, METH_NOARGS, NULL},
    {"close", (PyCFunction)loop_close, METH_NOARGS,
     "Close the loop: drop queued callbacks and release the poller."},
    {"create_future", (PyCFunction)loop_create_future, METH_NOARGS,
     "Create a Future attached to the loop."},
    {"create_task", (PyCFunction)(void (*)(void))loop_create_task,
     METH_FASTCALL | METH_KEYWORDS,
     "create_task(coro, *, name=None, context=None) -> Task"},
    {"set_task_factory", (PyCFunction)loop_set_task_factory, METH_O, NULL},
    {"get_task_factory", (PyCFunction)loop_get_task_factory, METH_NOARGS, NULL},
    {"_signal_pipe_open", (PyCFunction)loop_signal_pipe_open, METH_NOARGS, NULL},
    {"_signal_pipe_close", (PyCFunction)loop_signal_pipe_close, METH_NOARGS, NULL},
    {"_make_handle", (PyCFunction)(void (*)(void))loop_make_handle,
     METH_FASTCALL, NULL},
    {"_diagnostics", (PyCFunction)loop_diagnostics, METH_NOARGS,
     "The loop's health as plain data (tideloop.diagnostics)."},
    {"_reset_diagnostics", (PyCFunction)loop_reset_diagnostics, METH_NOARGS, NULL},
    {"_set_callback_timing", (PyCFunction)loop_set_callback_timing, METH_O, NULL},
    {NULL}
};

static PyGetSetDef loop_getset[] = {
    /* What asyncio's create_task (used for the non-fast cases) reads. */
    {"_task_factory", (getter)loop_get_task_factory, NULL, NULL, NULL},
    {"_current_handle", (getter)loop_get_current_handle, NULL, NULL, NULL},
    {"_signal_handlers", (getter)loop_get_signal_handlers, NULL, NULL, NULL},
    {"_thread_id", (getter)loop_get_thread_id, NULL, NULL, NULL},
    {"_stopping", (getter)loop_get_stopping, NULL, NULL, NULL},
    {"_debug", (getter)loop_get_debug_attr, NULL, NULL, NULL},
    {"_closed", (getter)loop_get_closed, NULL, NULL, NULL},
    {"_clock_resolution", (getter)loop_get_clock_resolution, NULL, NULL, NULL},
    {"slow_callback_duration", (getter)loop_get_slow, (setter)loop_set_slow,
     "Callbacks slower than this (seconds) are logged in debug mode.", NULL},
    {NULL}
};

static PyMemberDef loop_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(LoopObject, weakreflist),
     READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(LoopObject, dict), READONLY, NULL},
    {NULL}
};

static PyType_Slot loop_slots[] = {
    {Py_tp_new, loop_new},
    {Py_tp_dealloc, loop_dealloc},
    {Py_tp_setattro, loop_setattro},
    {Py_tp_traverse, loop_traverse},
    {Py_tp_clear, loop_clear},
    {Py_tp_methods, loop_methods},
    {Py_tp_getset, loop_getset},
    {Py_tp_members, loop_members},
    {Py_tp_doc, "The tideloop event loop core (use tideloop.Loop)."},
    {0, NULL}
};

PyType_Spec tl_loop_spec = {
    .name = "tideloop._core.Loop",
    .basicsize = sizeof(LoopObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .slots = loop_slots,
};
