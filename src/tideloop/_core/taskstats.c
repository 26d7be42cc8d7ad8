/* Per-task accounting (tideloop.diagnostics.track_tasks): each Task's
 * CPU time (the sum of its steps' durations, eager first steps included),
 * step count, creation and last-step times, and whether it finished with
 * nobody waiting for it: no done callback was scheduled by its last step
 * and nothing else holds it (a fire-and-forget task).
 *
 * A table per loop, open addressing keyed by the Task's address.  It holds
 * a weak reference to each Task, not the Task: a tracked Task is collected
 * as it would be (asyncio's "Task was destroyed but it is pending!"
 * included), and an entry whose Task is gone is stale -- found again by a
 * new object at the same address, it is started afresh.  Memory is
 * bounded: dead entries are dropped when the table fills (those of tasks
 * that finished unwaited-for are counted by coroutine and origin first),
 * and past TL_TASKS_MAX live tasks new ones are not tracked (counted).
 *
 * Only the loop's thread touches the table: the run loop, create_task and
 * _task_stats, which refuses other threads while the loop runs.
 *
 * Also the attribution of a callback to the Task whose step it is
 * (tl_task_of_step) and where a Task is suspended (tl_task_where), for
 * the accounting and for slow-callback reports (watchdog.c). */
#include "internal.h"

#include <string.h>

#define TL_TASK_FINISHED 1
#define TL_TASK_UNWAITED 2      /* finished, no done callback, not held */
#define TL_TASKS_MIN 64
#define TL_TASK_REFS_WHILE_STEPPING 2
#define TL_TASKS_MAX (1 << 16)

typedef struct {
    PyObject *key;              /* the Task's address: identity, no reference */
    PyObject *ref;              /* a weak reference to it */
    uint64_t cpu_ns, steps;
    int64_t created_ns, last_ns;
    int flags;
    PyObject *qualname;         /* its coroutine's, taken when it finished unwaited */
    PyObject *origin;           /* (filename, line) that created it, or NULL */
} tl_task_entry;

struct tl_task_table {
    tl_task_entry *slots;
    size_t cap, used;
    int origins;                /* record where create_task was called */
    uint64_t untracked;         /* tasks not tracked: TL_TASKS_MAX live ones */
    PyObject *gone;             /* {(qualname, origin): count} of collected
                                   tasks that finished unwaited-for */
};

static size_t
slot_of(const struct tl_task_table *t, PyObject *key)
{
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (t->cap - 1);
}

/* The accounting answers without an error, so that diagnostics never stop
 * the loop.  The error it meets by design (`expected`: an object without the
 * attribute looked for, one that takes no weak reference) is dropped; any
 * other (no memory, a Task subclass's method raising) is reported through
 * sys.unraisablehook with the object concerned, and the figure left out. */
static void
tolerate(PyObject *expected, PyObject *obj)
{
    if (expected != NULL && PyErr_ExceptionMatches(expected))
        PyErr_Clear();
    else
        PyErr_WriteUnraisable(obj);
}

/* Is the entry's Task still alive?  (It is then the object at `key`.) */
static int
entry_alive(tl_task_entry *e)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj = NULL;
    int r = PyWeakref_GetRef(e->ref, &obj);
    if (r < 0)
        tolerate(NULL, e->ref);     /* not a weak reference: never */
    Py_XDECREF(obj);
    return r == 1;
#else
    return PyWeakref_GET_OBJECT(e->ref) != Py_None;
#endif
}

/* A dead entry's last word: counted in `gone` if its Task finished with
 * nobody waiting (no error: the count is reported lost on failure). */
static void
entry_release(struct tl_task_table *t, tl_task_entry *e)
{
    if ((e->flags & TL_TASK_UNWAITED) && t->gone != NULL) {
        PyObject *k = PyTuple_Pack(2, e->qualname ? e->qualname : Py_None,
                                   e->origin ? e->origin : Py_None);
        PyObject *n = k ? PyDict_GetItemWithError(t->gone, k) : NULL;
        PyObject *n1 = k && !PyErr_Occurred()
                       ? PyLong_FromSsize_t((n ? PyLong_AsSsize_t(n) : 0) + 1) : NULL;
        if (n1 == NULL || PyDict_SetItem(t->gone, k, n1) < 0)
            tolerate(NULL, t->gone);
        Py_XDECREF(n1);
        Py_XDECREF(k);
    }
    Py_CLEAR(e->ref);
    Py_CLEAR(e->qualname);
    Py_CLEAR(e->origin);
    e->key = NULL;
}

static void
entry_start(tl_task_entry *e, PyObject *task, PyObject *ref, int64_t now_ns)
{
    *e = (tl_task_entry){.key = task, .ref = ref, .created_ns = now_ns, .last_ns = now_ns};
}

/* A new table of `cap` slots with the live entries of the old one (dead
 * ones released).  -1 on a memory error (the old table stays). */
static int
rebuild(struct tl_task_table *t, size_t cap)
{
    tl_task_entry *slots = PyMem_Calloc(cap, sizeof(tl_task_entry));
    if (slots == NULL)
        return -1;
    tl_task_entry *old = t->slots;
    size_t oldcap = t->cap;
    t->slots = slots;
    t->cap = cap;
    t->used = 0;
    for (size_t i = 0; i < oldcap; i++) {
        tl_task_entry *e = &old[i];
        if (e->key == NULL)
            continue;
        if (!entry_alive(e)) {
            entry_release(t, e);
            continue;
        }
        size_t j = slot_of(t, e->key);
        while (slots[j].key != NULL)
            j = (j + 1) & (cap - 1);
        slots[j] = *e;
        t->used++;
    }
    PyMem_Free(old);
    return 0;
}

/* Room for one more entry (for `task`): dead ones dropped, the table
 * doubled while the live ones fill more than half of it.  0: no room (full,
 * or no memory: reported). */
static int
make_room(struct tl_task_table *t, PyObject *task)
{
    if ((t->used + 1) * 4 <= t->cap * 3)
        return 1;
    size_t live = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].key != NULL && entry_alive(&t->slots[i]))
            live++;
    size_t cap = TL_TASKS_MIN;
    while (cap < (live + 1) * 2 && cap < TL_TASKS_MAX * 2)
        cap *= 2;
    if (live + 1 > TL_TASKS_MAX)
        return 0;
    if (rebuild(t, cap) < 0) {
        tolerate(NULL, task);
        return 0;
    }
    return 1;
}

/* The task's entry, made if it has none (NULL: not tracked; no error). */
static tl_task_entry *
find(struct tl_task_table *t, PyObject *task, int64_t now_ns)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t i = slot_of(t, task);
        while (t->slots[i].key != NULL && t->slots[i].key != task)
            i = (i + 1) & (t->cap - 1);
        tl_task_entry *e = &t->slots[i];
        if (e->key == task) {
            if (entry_alive(e))
                return e;
            PyObject *ref = PyWeakref_NewRef(task, NULL);     /* a new object here */
            if (ref == NULL) {
                tolerate(PyExc_TypeError, task);
                return NULL;
            }
            entry_release(t, e);
            entry_start(e, task, ref, now_ns);
            return e;
        }
        if (attempt == 0 && (t->used + 1) * 4 > t->cap * 3) {
            if (!make_room(t, task)) {
                t->untracked++;
                return NULL;
            }
            continue;       /* the slots moved */
        }
        PyObject *ref = PyWeakref_NewRef(task, NULL);
        if (ref == NULL) {
            tolerate(PyExc_TypeError, task);
            return NULL;
        }
        entry_start(e, task, ref, now_ns);
        t->used++;
        return e;
    }
    return NULL;
}

/* ---- which Task a callback is a step of, and where it is suspended ----
 * (the loop notes them before a Handle runs while tasks are tracked or
 * slow callbacks reported) */

/* An instance of asyncio's C or Python Task (st->diag_task_types)? */
static int
is_task(tl_state *st, PyObject *obj)
{
    PyObject *types = st->diag_task_types;
    for (Py_ssize_t i = 0; types != NULL && i < PyTuple_GET_SIZE(types); i++)
        if (PyObject_TypeCheck(obj, (PyTypeObject *)PyTuple_GET_ITEM(types, i)))
            return 1;
    return 0;
}

/* The Task whose step or wakeup `callback` is (a new reference), or NULL
 * without an exception. */
PyObject *
tl_task_of_step(LoopObject *loop, PyObject *callback)
{
    tl_state *st = loop->state;
    PyObject *self = NULL;
    if (callback == NULL || PyFunction_Check(callback))
        return NULL;
    if (PyMethod_Check(callback))
        self = Py_NewRef(PyMethod_GET_SELF(callback));
    else if (PyCFunction_Check(callback))
        self = Py_XNewRef(PyCFunction_GET_SELF(callback));
    else if (strstr(Py_TYPE(callback)->tp_name, "MethWrapper") != NULL) {
        /* _asyncio's TaskStepMethWrapper (and 3.11's TaskWakeupMethWrapper) */
        self = PyObject_GetAttr(callback, st->str_self_attr);
        if (self == NULL)
            tolerate(PyExc_AttributeError, callback);
    }
    if (self == NULL)
        return NULL;
    /* The last type that was no Task: a batch of one kind of callback
     * (say bound methods of one object) is told apart in a compare. */
    if ((PyObject *)Py_TYPE(self) == loop->not_task_type || !is_task(st, self)) {
        if ((PyObject *)Py_TYPE(self) != loop->not_task_type)
            Py_XSETREF(loop->not_task_type, Py_NewRef((PyObject *)Py_TYPE(self)));
        Py_CLEAR(self);
    }
    return self;
}

/* Is this frame asyncio's own code (asyncio.sleep, a Queue's get)? */
static int
in_asyncio(tl_state *st, PyObject *frame)
{
    PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)frame);
    int r = st->diag_asyncio_dir != NULL &&
            PyUnicode_Tailmatch(code->co_filename, st->diag_asyncio_dir, 0,
                                PY_SSIZE_T_MAX, -1) == 1;
    Py_DECREF(code);
    return r;
}

/* Where the task is suspended: (qualname, filename, line, frame) -- the
 * first three of the innermost coroutine of its await chain that is not
 * asyncio's own code, the frame of its outermost one (whose line, once
 * the task is done, is where it returned) -- or None (a new reference;
 * no error). */
PyObject *
tl_task_where(tl_state *st, PyObject *task)
{
    PyObject *frame = NULL, *outer = NULL;
    PyObject *obj = PyObject_GetAttr(task, st->str_t_coro);
    for (int depth = 0; obj != NULL && depth < 64; depth++) {
        PyObject *f = PyObject_GetAttr(obj, st->str_cr_frame);
        if (f == NULL || !PyFrame_Check(f)) {
            Py_XDECREF(f);
            break;
        }
        if (outer == NULL)
            outer = Py_NewRef(f);
        if (frame == NULL || !in_asyncio(st, f))
            Py_XSETREF(frame, f);
        else
            Py_DECREF(f);
        Py_SETREF(obj, PyObject_GetAttr(obj, st->str_cr_await));
    }
    /* The chain ends at None or at an awaitable that is no coroutine (no
     * cr_frame or cr_await). */
    if (PyErr_Occurred())
        tolerate(PyExc_AttributeError, task);
    Py_XDECREF(obj);
    if (frame == NULL)
        Py_RETURN_NONE;
    PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)frame);
    PyObject *where = Py_BuildValue("(OOiO)", code->co_qualname, code->co_filename,
                                    PyFrame_GetLineNumber((PyFrameObject *)frame), outer);
    Py_DECREF(code);
    Py_DECREF(frame);
    Py_DECREF(outer);
    if (where == NULL) {
        tolerate(NULL, task);
        Py_RETURN_NONE;
    }
    return where;
}

/* Is this code (of asyncio's) the loop running a callback: what the
 * callback's caller frames are, and no creator of a task? */
static int
runs_the_loop(PyCodeObject *code)
{
    static const char *const names[] = {"run_forever", "run_until_complete", "_run_once",
                                        "_run", "run"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (PyUnicode_CompareWithASCIIString(code->co_name, names[i]) == 0)
            return 1;
    return 0;
}

/* Where create_task was called: the innermost frame outside asyncio's own
 * modules (asyncio.create_task, a TaskGroup), as (filename, line).  None
 * when asyncio itself made the task in a callback (a stream server's
 * connection handler): the frames past the loop's run are not its
 * creator's. */
static PyObject *
creation_site(tl_state *st, PyObject *task)
{
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    PyObject *site = NULL;
    for (int depth = 0; f != NULL && depth < 32; depth++) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int ours = st->diag_asyncio_dir == NULL ||
                   PyUnicode_Tailmatch(code->co_filename, st->diag_asyncio_dir, 0,
                                       PY_SSIZE_T_MAX, -1) != 1;
        if (ours) {
            site = Py_BuildValue("(Oi)", code->co_filename, PyFrame_GetLineNumber(f));
            Py_DECREF(code);
            break;
        }
        if (runs_the_loop(code)) {
            Py_DECREF(code);
            break;
        }
        Py_DECREF(code);
        Py_SETREF(f, PyFrame_GetBack(f));
    }
    Py_XDECREF(f);
    if (site == NULL && PyErr_Occurred())
        tolerate(NULL, task);
    return site;
}

/* The coroutine's qualified name of a Task (a new reference, or NULL
 * without an error).  *internal: the coroutine is asyncio's own (a
 * subprocess transport's _connect_pipes, say): its fire-and-forget tasks
 * are by design, their outcome goes elsewhere. */
static PyObject *
coro_qualname(tl_state *st, PyObject *task, int *internal)
{
    *internal = 0;
    PyObject *coro = PyObject_CallMethodNoArgs(task, st->str_get_coro);
    /* (an awaitable that is no coroutine may have no __qualname__) */
    PyObject *name = coro != NULL ? PyObject_GetAttr(coro, st->str_qualname) : NULL;
    if (name == NULL || !PyUnicode_Check(name)) {
        if (name == NULL)
            tolerate(PyExc_AttributeError, task);
        Py_CLEAR(name);
    }
    if (coro != NULL && PyCoro_CheckExact(coro) && st->diag_asyncio_dir != NULL) {
        PyObject *code = PyObject_GetAttrString(coro, "cr_code");
        if (code == NULL)
            tolerate(NULL, task);
        else if (PyCode_Check(code))
            *internal = PyUnicode_Tailmatch(((PyCodeObject *)code)->co_filename,
                                            st->diag_asyncio_dir, 0, PY_SSIZE_T_MAX, -1) == 1;
        Py_XDECREF(code);
    }
    Py_XDECREF(coro);
    return name;
}

/* 1: done, 0: not, -1: could not tell (no error). */
static int
task_done(tl_state *st, PyObject *task)
{
    PyObject *r = PyObject_CallMethodNoArgs(task, st->str_done);
    if (r == NULL) {
        tolerate(NULL, task);
        return -1;
    }
    int done = r == Py_True;
    Py_DECREF(r);
    return done;
}

/* Did the step schedule a done callback of the task -- something queued
 * with the task as its first argument (among the last `queued` items of
 * the ready queue, the ones the step added)?  Then somebody waits for it. */
static int
done_callback_queued(LoopObject *loop, PyObject *task, size_t queued)
{
    tl_ready_queue *q = &loop->ready;
    for (size_t k = q->len - queued; k < q->len; k++) {
        tl_ready_item it = q->items[(q->head + k) & (q->cap - 1)];
        if (tl_ready_io(it) != NULL)
            continue;
        HandleObject *h = (HandleObject *)it;
        PyObject *first = h->nargs == 0 ? NULL
                          : h->args_tuple != NULL ? PyTuple_GET_ITEM(h->args_tuple, 0)
                          : h->argv[0];
        if (first == task)
            return 1;
    }
    return 0;
}

/* A step of `task` took took_ns (eager first steps of tasks it created
 * not counted: loop->eager_ns); now_ns: about now (the batch's start);
 * queued: how many callbacks the step added to the ready queue. */
void
tl_tasks_step_done(LoopObject *loop, PyObject *task, int64_t took_ns, int64_t now_ns,
                   size_t queued)
{
    struct tl_task_table *t = loop->tasks;
    tl_task_entry *e = find(t, task, now_ns);
    if (e == NULL)
        return;
    int64_t own = took_ns - loop->eager_ns;
    e->cpu_ns += (uint64_t)(own > 0 ? own : 0);
    e->steps++;
    e->last_ns = now_ns;
    if (e->flags & TL_TASK_FINISHED || task_done(loop->state, task) != 1)
        return;
    e->flags |= TL_TASK_FINISHED;
    /* Unwaited: no done callback was scheduled, and nothing but the
     * running step's callback and this function hold the Task (2, on
     * every interpreter from 3.11 to 3.14: the tests check it) -- so
     * nobody can await it any more; its result or exception is lost. */
    if (Py_REFCNT(task) <= TL_TASK_REFS_WHILE_STEPPING &&
        !done_callback_queued(loop, task, queued)) {
        int internal;
        Py_XSETREF(e->qualname, coro_qualname(loop->state, task, &internal));
        if (!internal)
            e->flags |= TL_TASK_UNWAITED;
    }
}

/* create_task made `task` at created_ns; eager_ns: how long the task
 * factory took, inner_ns: of that, eager steps of tasks created inside. */
void
tl_tasks_created(LoopObject *loop, PyObject *task, int64_t created_ns, int64_t eager_ns,
                 int64_t inner_ns)
{
    tl_state *st = loop->state;
    struct tl_task_table *t = loop->tasks;
    if (!is_task(st, task))
        return;
    tl_task_entry *e = find(t, task, created_ns);
    if (e == NULL)
        return;
    e->created_ns = created_ns;
    if (t->origins && e->origin == NULL)
        e->origin = creation_site(st, task);
    if (eager_ns < 0)
        return;
    /* A task factory ran: did the task's first step run in it (an eager
     * task)?  Then it is done, or its coroutine is suspended. */
    int done = task_done(st, task);
    int ran = done == 1;
    if (!ran) {
        PyObject *coro = PyObject_CallMethodNoArgs(task, st->str_get_coro);
        PyObject *susp = coro ? PyObject_GetAttr(coro, st->str_cr_suspended) : NULL;
        ran = susp == Py_True;
        /* (an awaitable that is no coroutine has no cr_suspended) */
        if (susp == NULL)
            tolerate(PyExc_AttributeError, task);
        Py_XDECREF(susp);
        Py_XDECREF(coro);
    }
    if (!ran)
        return;
    int64_t own = eager_ns - inner_ns;
    e->cpu_ns += (uint64_t)(own > 0 ? own : 0);
    e->steps++;
    e->last_ns = created_ns + eager_ns;
    if (done == 1)      /* its creator holds it: not "unwaited" */
        e->flags |= TL_TASK_FINISHED;
}

void
tl_tasks_free(LoopObject *loop)
{
    struct tl_task_table *t = loop->tasks;
    if (t == NULL)
        return;
    loop->tasks = NULL;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].key != NULL) {
            Py_CLEAR(t->slots[i].ref);
            Py_CLEAR(t->slots[i].qualname);
            Py_CLEAR(t->slots[i].origin);
        }
    PyMem_Free(t->slots);
    Py_XDECREF(t->gone);
    PyMem_Free(t);
}

/* loop._set_task_tracking(on, origins) -> whether it was on.  Turning it
 * off forgets everything tracked. */
static PyObject *
loop_set_task_tracking(LoopObject *self, PyObject *args)
{
    int on, origins = 0;
    if (!PyArg_ParseTuple(args, "p|p:_set_task_tracking", &on, &origins))
        return NULL;
    int was = self->tasks != NULL;
    if (on && tl_check_closed(self) < 0)
        return NULL;
    if (!on) {
        tl_tasks_free(self);
        self->health.track_tasks = 0;
        return PyBool_FromLong(was);
    }
    if (self->tasks == NULL) {
        struct tl_task_table *t = PyMem_Calloc(1, sizeof(*t));
        tl_task_entry *slots = PyMem_Calloc(TL_TASKS_MIN, sizeof(tl_task_entry));
        PyObject *gone = PyDict_New();
        if (t == NULL || slots == NULL || gone == NULL) {
            PyMem_Free(t);
            PyMem_Free(slots);
            Py_XDECREF(gone);
            return PyErr_NoMemory();
        }
        t->slots = slots;
        t->cap = TL_TASKS_MIN;
        t->gone = gone;
        tl_health_start_timing(&self->health);
        self->tasks = t;
        self->health.track_tasks = 1;
    }
    self->tasks->origins = origins;
    return PyBool_FromLong(was);
}

/* loop._task_stats() -> (live, unwaited_gone, untracked), or None when
 * tracking is off.  live: [(task, cpu_s, steps, created, last_step,
 * finished, unwaited, qualname, origin)] (times on the loop's clock);
 * unwaited_gone: {(qualname, origin): count} of collected tasks that had
 * finished with nobody waiting. */
static PyObject *
loop_task_stats(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    struct tl_task_table *t = self->tasks;
    if (t == NULL)
        Py_RETURN_NONE;
    if (self->thread_id != 0 && PyThread_get_thread_ident() != self->thread_id) {
        PyErr_SetString(PyExc_RuntimeError,
                        "task statistics are read on the loop's own thread "
                        "(use loop.call_soon_threadsafe)");
        return NULL;
    }
    PyObject *live = PyList_New(0);
    PyObject *gone = PyDict_Copy(t->gone);
    if (live == NULL || gone == NULL)
        goto error;
    for (size_t i = 0; i < t->cap; i++) {
        tl_task_entry *e = &t->slots[i];
        if (e->key == NULL)
            continue;
        if (!entry_alive(e)) {
            if (!(e->flags & TL_TASK_UNWAITED))
                continue;
            PyObject *k = PyTuple_Pack(2, e->qualname ? e->qualname : Py_None,
                                       e->origin ? e->origin : Py_None);
            if (k == NULL)
                goto error;
            PyObject *n = PyDict_GetItemWithError(gone, k);
            PyObject *n1 = PyErr_Occurred() ? NULL
                           : PyLong_FromSsize_t((n ? PyLong_AsSsize_t(n) : 0) + 1);
            int rc = n1 == NULL ? -1 : PyDict_SetItem(gone, k, n1);
            Py_XDECREF(n1);
            Py_DECREF(k);
            if (rc < 0)
                goto error;
            continue;
        }
        PyObject *row = Py_BuildValue(
            "(OdKddOOOO)", e->key, (double)e->cpu_ns * 1e-9, (unsigned long long)e->steps,
            (double)e->created_ns * 1e-9, (double)e->last_ns * 1e-9,
            e->flags & TL_TASK_FINISHED ? Py_True : Py_False,
            e->flags & TL_TASK_UNWAITED ? Py_True : Py_False,
            e->qualname ? e->qualname : Py_None, e->origin ? e->origin : Py_None);
        if (row == NULL || PyList_Append(live, row) < 0) {
            Py_XDECREF(row);
            goto error;
        }
        Py_DECREF(row);
    }
    return Py_BuildValue("(NNK)", live, gone, (unsigned long long)t->untracked);
error:
    Py_XDECREF(live);
    Py_XDECREF(gone);
    return NULL;
}

const PyMethodDef tl_tasks_loop_methods[] = {
    {"_set_task_tracking", (PyCFunction)loop_set_task_tracking, METH_VARARGS, NULL},
    {"_task_stats", (PyCFunction)loop_task_stats, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
