/* The fd table: which fds the loop watches, for whom, and what the poller
 * has been told.
 *
 * Each fd has a reader and a writer slot.  A slot holds either a Handle
 * (add_reader/add_writer, the sock_* waits) or a C io watcher (transports,
 * listeners: see iowatch.h).  An event queues the slot's occupant on the ready
 * queue; changing interest is deferred to just before the next poll where
 * that saves a syscall (fd_apply).  The Loop's public fd methods live here
 * too (added to the Loop type by module.c).
 *
 * May call: iowatch.c, handle.c, poller, ready.h. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>

/* The fd of an int or of an object with fileno(); *gone is set when
 * fileno() answered with a negative number (a closed socket says -1). */
static int
fd_of(PyObject *fileobj, int *gone)
{
    long fd;
    *gone = 0;
    if (PyLong_Check(fileobj)) {
        fd = PyLong_AsLong(fileobj);
        if (fd == -1 && PyErr_Occurred())
            return -1;
    }
    else {
        PyObject *r = PyObject_CallMethod(fileobj, "fileno", NULL);
        PyObject *i = r ? PyNumber_Long(r) : NULL;
        Py_XDECREF(r);
        if (i == NULL) {
            if (PyErr_ExceptionMatches(PyExc_AttributeError) ||
                PyErr_ExceptionMatches(PyExc_TypeError) ||
                PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "Invalid file object: %R",
                             fileobj);
            }
            return -1;
        }
        fd = PyLong_AsLong(i);
        Py_DECREF(i);
        if (fd == -1 && PyErr_Occurred())
            return -1;
    }
    if (fd < 0) {
        *gone = !PyLong_Check(fileobj);
        PyErr_Format(PyExc_ValueError, "Invalid file descriptor: %ld", fd);
        return -1;
    }
    if (fd > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "file descriptor out of range");
        return -1;
    }
    return (int)fd;
}

int
tl_fd_from_object(PyObject *fileobj)
{
    int gone;
    return fd_of(fileobj, &gone);
}

/* asyncio's selector keeps the object a registration was made with and,
 * when that object no longer has an fd (a socket closed before
 * remove_reader()), finds the registration by the object itself.  The loop
 * keeps the same: self->fileobjs maps fd -> the non-int object of the
 * registration that created the fd's entry (as the selector's key does);
 * ints, by far the common case, cost nothing. */
static void
fileobj_forget(LoopObject *self, int fd)
{
    if (self->fileobjs == NULL)
        return;
    PyObject *key = PyLong_FromLong(fd);
    if (key == NULL || PyDict_DelItem(self->fileobjs, key) < 0) {
        /* An fd registered with an int has no entry; nothing else may be
         * lost silently (callers cannot fail: reported). */
        if (key != NULL && PyErr_ExceptionMatches(PyExc_KeyError))
            PyErr_Clear();
        else
            PyErr_WriteUnraisable((PyObject *)self);
    }
    Py_XDECREF(key);
}

/* A new registration on fd was made with fileobj. */
static int
fileobj_note(LoopObject *self, int fd, PyObject *fileobj)
{
    if (PyLong_Check(fileobj)) {
        fileobj_forget(self, fd);
        return 0;
    }
    if (self->fileobjs == NULL && (self->fileobjs = PyDict_New()) == NULL)
        return -1;
    PyObject *key = PyLong_FromLong(fd);
    if (key == NULL)
        return -1;
    int rc = PyDict_SetItem(self->fileobjs, key, fileobj);
    Py_DECREF(key);
    return rc;
}

/* The fd whose registration was made with this very object, or -1. */
static int
fileobj_find(LoopObject *self, PyObject *fileobj)
{
    if (self->fileobjs == NULL)
        return -1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(self->fileobjs, &pos, &key, &value)) {
        if (value == fileobj)
            return (int)PyLong_AsLong(key);
    }
    return -1;
}

static int
fd_reserve(LoopObject *self, int fd)
{
    if ((size_t)fd < self->fds_cap)
        return 0;
    size_t cap = self->fds_cap ? self->fds_cap : 64;
    while (cap <= (size_t)fd)
        cap *= 2;
    tl_fdentry *t = PyMem_Realloc(self->fds, cap * sizeof(*t));
    if (t == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(t + self->fds_cap, 0, (cap - self->fds_cap) * sizeof(*t));
    self->fds = t;
    self->fds_cap = cap;
    return 0;
}

/* Tell the poller the interest for fd; OSError on failure. */
static int
fd_apply(LoopObject *self, int fd, int mask, int oneshot)
{
    assert(fd >= 0 && (size_t)fd < self->fds_cap);
    assert((mask & ~(TL_POLL_READ | TL_POLL_WRITE)) == 0);
    assert(self->dirty_len <= self->dirty_cap);
    tl_fdentry *e = &self->fds[fd];
    oneshot = oneshot && mask;
    if (e->mask == mask && e->oneshot == oneshot)
        return 0;
    if (e->mask && mask && !oneshot && !e->oneshot) {
        /* Between two non-empty level-triggered interests (a writer coming
         * and going on a reading fd): applied just before the next poll,
         * so a write queue that drains and refills within an iteration
         * costs no epoll_ctl.  Changes to or from nothing stay immediate:
         * an fd may be closed and its number reused right after. */
        if (!e->dirty) {
            if (self->dirty_len == self->dirty_cap) {
                size_t cap = self->dirty_cap ? self->dirty_cap * 2 : 16;
                int *d = PyMem_Realloc(self->dirty_fds, cap * sizeof(int));
                if (d == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                self->dirty_fds = d;
                self->dirty_cap = cap;
            }
            self->dirty_fds[self->dirty_len++] = fd;
            e->dirty = 1;
            e->kmask = e->mask;
        }
        e->mask = mask;
        return 0;
    }
    e->dirty = 0;   /* superseded by what follows (the poller has the fd) */
    int kmask = mask | (oneshot ? TL_POLL_ONESHOT : 0);
    int rc;
    if (mask == 0)
        rc = tl_poller_remove(self->poller, fd);
    else if (e->mask == 0 && !e->dormant)
        rc = tl_poller_add(self->poller, fd, kmask);
    else
        rc = tl_poller_modify(self->poller, fd, kmask);
    if (rc < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (e->mask == 0 && mask)
        TL_ATOMIC_SET(&self->fds_registered, self->fds_registered + 1);
    else if (e->mask && mask == 0)
        TL_ATOMIC_SET(&self->fds_registered, self->fds_registered - 1);
    e->mask = mask;
    e->oneshot = oneshot;
    e->dormant = 0;
    return 0;
}

/* Apply the deferred interest changes (see fd_apply). */
void
tl_fd_flush_dirty(LoopObject *self)
{
    for (size_t i = 0; i < self->dirty_len; i++) {
        int fd = self->dirty_fds[i];
        if ((size_t)fd >= self->fds_cap)
            continue;
        tl_fdentry *e = &self->fds[fd];
        if (!e->dirty)
            continue;
        e->dirty = 0;
        if (e->mask == e->kmask)
            continue;
        if (tl_poller_modify(self->poller, fd, e->mask) < 0) {
            /* The fd was closed while still watched (a caller's error): the
             * kernel forgot it, so must we. */
            TL_ATOMIC_SET(&self->fds_registered, self->fds_registered - 1);
            e->mask = 0;
        }
    }
    self->dirty_len = 0;
}

static int
fd_set_mask(LoopObject *self, int fd, int mask)
{
    return fd_apply(self, fd, mask, 0);
}


/* The interest the fd's slots want. */
static inline int
fd_wanted(tl_fdentry *e)
{
    return (tl_fdslot_used(&e->rd) ? TL_POLL_READ : 0) |
           (tl_fdslot_used(&e->wr) ? TL_POLL_WRITE : 0);
}

static inline tl_fdslot *
fd_slot(tl_fdentry *e, int which)
{
    assert(which == TL_POLL_READ || which == TL_POLL_WRITE);
    return which == TL_POLL_READ ? &e->rd : &e->wr;
}

/* Empty a slot: a Handle is cancelled (as asyncio's remove_reader does), a
 * watcher disarmed (an item of it already queued is skipped). */
static int
slot_clear(tl_fdslot *s)
{
    HandleObject *h = s->handle;
    tl_io_watcher *w = s->io;
    assert(tl_fdslot_ok(s));
    s->handle = NULL;
    s->io = NULL;
    if (w != NULL)
        tl_io_disarm(w);
    if (h == NULL)
        return 0;
    int rc = tl_handle_cancel(h);
    Py_DECREF(h);
    return rc;
}

int
tl_fd_register_internal(LoopObject *self, int fd, int kind)
{
    if (fd_reserve(self, fd) < 0)
        return -1;
    if (fd_set_mask(self, fd, TL_POLL_READ) < 0)
        return -1;
    self->fds[fd].internal = kind;
    TL_ATOMIC_SET(&self->fds_internal, self->fds_internal + 1);
    return 0;
}

void
tl_fd_unregister_internal(LoopObject *self, int fd)
{
    if (fd < 0 || (size_t)fd >= self->fds_cap)
        return;
    if (self->poller != NULL && self->fds[fd].mask && !tl_loop_is_forked(self))
        tl_poller_remove(self->poller, fd);
    if (self->fds[fd].mask)
        TL_ATOMIC_SET(&self->fds_registered, self->fds_registered - 1);
    if (self->fds[fd].internal)
        TL_ATOMIC_SET(&self->fds_internal, self->fds_internal - 1);
    self->fds[fd].mask = 0;
    self->fds[fd].internal = 0;
}

/* Make room for fd and refuse the loop's own fds; then the poller interest
 * for `which` plus whatever the other slot wants. */
static int
slot_prepare(LoopObject *self, int fd, int which, int oneshot)
{
    if (tl_check_closed(self) < 0 || tl_check_fork(self) < 0 ||
        fd_reserve(self, fd) < 0)
        return -1;
    tl_fdentry *e = &self->fds[fd];
    if (e->internal) {
        PyErr_Format(PyExc_RuntimeError,
                     "File descriptor %d is used internally by the event loop",
                     fd);
        return -1;
    }
    int other = which == TL_POLL_READ ? TL_POLL_WRITE : TL_POLL_READ;
    int want = which | (fd_wanted(e) & other);
    /* One-shot only while it is the fd's only interest. */
    return fd_apply(self, fd, want, oneshot && !(want & other));
}

int
tl_fd_add_handle(LoopObject *self, int fd, int which, HandleObject *h,
                 int oneshot)
{
    if (slot_prepare(self, fd, which, oneshot) < 0)
        return -1;
    /* Re-read: fd_reserve may have moved the table. */
    tl_fdslot *s = fd_slot(&self->fds[fd], which);
    tl_fdslot old = *s;
    s->handle = (HandleObject *)Py_NewRef((PyObject *)h);
    s->io = NULL;
    assert(tl_fdslot_ok(s));
    return slot_clear(&old);
}

int
tl_fd_watch(LoopObject *self, int fd, int which, tl_io_watcher *w,
            PyObject *context)
{
    PyObject *ctx = context != NULL ? Py_NewRef(context)
                                    : PyContext_CopyCurrent();
    if (ctx == NULL)
        return -1;
    if (w->armed) {
        tl_io_rearm(w, ctx);
        return 0;
    }
    if (slot_prepare(self, fd, which, 0) < 0) {
        Py_DECREF(ctx);
        return -1;
    }
    tl_fdslot *s = fd_slot(&self->fds[fd], which);
    tl_fdslot old = *s;
    assert(old.io != w);   /* not armed: in no slot */
    s->handle = NULL;
    s->io = w;
    tl_io_arm(w, ctx);
    assert(tl_fdslot_ok(s));
    return slot_clear(&old);
}

int
tl_fd_remove(LoopObject *self, int fd, int which, int *removed)
{
    if (removed != NULL)
        *removed = 0;
    if (self->closed)
        return 0;
    if (tl_check_fork(self) < 0)
        return -1;
    if (fd < 0 || (size_t)fd >= self->fds_cap)
        return 0;
    tl_fdentry *e = &self->fds[fd];
    if (e->internal)
        return 0;
    tl_fdslot *s = fd_slot(e, which);
    tl_fdslot old = *s;
    s->handle = NULL;
    s->io = NULL;
    if (fd_set_mask(self, fd, e->mask & fd_wanted(e)) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_OSError)) {
            *s = old;   /* no memory: nothing removed */
            return -1;
        }
        /* The kernel forgot the fd already (closed); keep our table honest. */
        PyErr_Clear();
        if (e->mask)
            TL_ATOMIC_SET(&self->fds_registered, self->fds_registered - 1);
        e->mask = 0;
        e->oneshot = 0;
        e->dormant = 0;
    }
    if (removed != NULL)
        *removed = old.handle != NULL || old.io != NULL;
    return slot_clear(&old);
}

/* Queue what an event on fd wakes (the poller reported `mask`). */
int
tl_fd_dispatch(LoopObject *self, int fd, int mask)
{
    assert(fd >= 0 && (size_t)fd < self->fds_cap);
    tl_fdentry *e = &self->fds[fd];
    if (e->oneshot && e->mask) {
        /* The poller disarmed it after this event. */
        e->mask = 0;
        e->oneshot = 0;
        e->dormant = 1;
        TL_ATOMIC_SET(&self->fds_registered, self->fds_registered - 1);
    }
    for (int which = TL_POLL_READ; which <= TL_POLL_WRITE; which <<= 1) {
        if (!(mask & which))
            continue;
        e = &self->fds[fd];   /* re-read, as after any call: the table is
                                 the loop's and may be reallocated */
        tl_fdslot *s = fd_slot(e, which);
        if (s->io != NULL) {
            if (tl_ready_push_io(&self->ready, s->io) < 0)
                return -1;
        }
        else if (s->handle != NULL) {
            HandleObject *h = s->handle;
            if (h->cancelled) {
                /* Cancelled by its owner without remove_reader(). */
                s->handle = NULL;
                int rc = fd_set_mask(self, fd, e->mask & fd_wanted(e));
                Py_DECREF(h);
                if (rc < 0) {
                    /* An fd closed under its registration: the kernel
                     * forgot it.  Any other error (no memory) is raised. */
                    if (!PyErr_ExceptionMatches(PyExc_OSError))
                        return -1;
                    PyErr_Clear();
                }
            }
            else if (tl_ready_push(&self->ready,
                                   Py_NewRef((PyObject *)h)) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* Loop close and clear: every slot emptied (without a poller call). */
void
tl_fd_clear_all(LoopObject *self)
{
    Py_CLEAR(self->fileobjs);
    for (size_t fd = 0; fd < self->fds_cap; fd++) {
        /* (an error of a Handle's cancel() cannot propagate from here) */
        if (slot_clear(&self->fds[fd].rd) < 0)
            PyErr_WriteUnraisable((PyObject *)self);
        if (slot_clear(&self->fds[fd].wr) < 0)
            PyErr_WriteUnraisable((PyObject *)self);
    }
}

int
tl_fd_traverse(LoopObject *self, visitproc visit, void *arg)
{
    for (size_t fd = 0; fd < self->fds_cap; fd++) {
        tl_fdentry *e = &self->fds[fd];
        Py_VISIT(e->rd.handle);
        Py_VISIT(e->wr.handle);
        if (e->rd.io != NULL)
            Py_VISIT(e->rd.io->owner);
        if (e->wr.io != NULL)
            Py_VISIT(e->wr.io->owner);
    }
    return 0;
}

int
tl_fd_set_transport(LoopObject *self, int fd, tl_transport_head *t)
{
    if (fd_reserve(self, fd) < 0)
        return -1;
    self->fds[fd].transport = t;
    return 0;
}

void
tl_fd_clear_transport(LoopObject *self, int fd, tl_transport_head *t)
{
    if (fd >= 0 && (size_t)fd < self->fds_cap && self->fds[fd].transport == t)
        self->fds[fd].transport = NULL;
}

/* asyncio's _ensure_fd_no_transport: the public reader/writer methods
 * refuse an fd that a live transport owns. */
static int
check_no_transport(LoopObject *self, int fd, PyObject *fileobj)
{
    if ((size_t)fd >= self->fds_cap)
        return 0;
    tl_transport_head *t = self->fds[fd].transport;
    if (t != NULL && !t->closing) {
        PyErr_Format(PyExc_RuntimeError,
                     "File descriptor %R is used by transport %R", fileobj,
                     (PyObject *)t);
        return -1;
    }
    return 0;
}


int
tl_fd_check_no_transport(LoopObject *self, int fd)
{
    PyObject *fdo = PyLong_FromLong(fd);
    if (fdo == NULL)
        return -1;
    int rc = check_no_transport(self, fd, fdo);
    Py_DECREF(fdo);
    return rc;
}

/* ---- the Loop's fd methods ---- */

/* The internal forms take context= (3.15's _add_reader/_add_writer: the
 * Handle runs in that Context instead of a copy of the current one). */
static int
add_io_context(const char *method, PyObject *const *kwargs, PyObject *kwnames,
               PyObject **context)
{
    *context = NULL;
    if (kwnames == NULL)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(k, "context") != 0) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got an unexpected keyword argument '%S'",
                         method, k);
            return -1;
        }
        *context = kwargs[i];
    }
    if (*context == Py_None)
        *context = NULL;
    return *context != NULL ? tl_check_context_arg(*context) : 0;
}

static PyObject *
add_io(LoopObject *self, PyObject *const *args, Py_ssize_t nargs,
       PyObject *context, const char *method, int which, int ret_handle)
{
    if (nargs < 2) {
        PyErr_Format(PyExc_TypeError,
                     "%s() missing required positional argument: '%s'",
                     method, nargs == 0 ? "fd" : "callback");
        return NULL;
    }
    int fd = tl_fd_from_object(args[0]);
    if (fd < 0)
        return NULL;
    if (!ret_handle && check_no_transport(self, fd, args[0]) < 0)
        return NULL;
    if (tl_check_closed(self) < 0 || tl_check_fork(self) < 0)
        return NULL;
    tl_state *st = self->state;
    HandleObject *h = tl_handle_new(st, st->HandleType, self, args[1], args + 2,
                                    nargs - 2, context, 1);
    if (h == NULL)
        return NULL;
    /* A new registration (no other slot in use) takes this object as its
     * key, as a selector's register() does; modify() keeps the old one. */
    int new_key = (size_t)fd >= self->fds_cap || fd_wanted(&self->fds[fd]) == 0;
    if (tl_fd_add_handle(self, fd, which, h, 0) < 0) {
        Py_DECREF(h);
        return NULL;
    }
    if (new_key && fileobj_note(self, fd, args[0]) < 0) {
        Py_DECREF(h);
        return NULL;
    }
    if (ret_handle)
        return (PyObject *)h;
    Py_DECREF(h);
    Py_RETURN_NONE;
}

static PyObject *
remove_io(LoopObject *self, PyObject *fileobj, int which, int public)
{
    int gone;
    int fd = fd_of(fileobj, &gone);
    if (fd < 0) {
        /* The public methods refuse an object whose fileno() fails, before
         * anything else (asyncio's _ensure_fd_no_transport); then a closed
         * loop has nothing to remove, and a registration is looked up by
         * the object itself (the selector's _fileobj_lookup). */
        if (!(gone || (!public && PyErr_ExceptionMatches(PyExc_ValueError))))
            return NULL;
        assert(PyErr_ExceptionMatches(PyExc_ValueError));   /* the one cleared */
        if (self->closed) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        fd = fileobj_find(self, fileobj);
        if (fd < 0)
            return NULL;
        PyErr_Clear();
        /* The object was closed.  Taking one interest off while the other
         * stays is a selector modify() of the dead fd: it fails, and the
         * selector drops the whole registration; so here. */
        tl_fdentry *e = &self->fds[fd];
        if (tl_fdslot_used(fd_slot(e, which)) && (fd_wanted(e) & ~which) &&
            tl_poller_modify(self->poller, fd, fd_wanted(e) & ~which) < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            PyObject *exc = tl_err_get_raised();
            /* (the poller's error is the one raised: others are reported) */
            if (tl_fd_remove(self, fd, TL_POLL_READ, NULL) < 0)
                PyErr_WriteUnraisable((PyObject *)self);
            if (tl_fd_remove(self, fd, TL_POLL_WRITE, NULL) < 0)
                PyErr_WriteUnraisable((PyObject *)self);
            fileobj_forget(self, fd);
            tl_err_set_raised(exc);
            return NULL;
        }
    }
    else if (public && check_no_transport(self, fd, fileobj) < 0)
        return NULL;
    int removed;
    if (tl_fd_remove(self, fd, which, &removed) < 0)
        return NULL;
    if ((size_t)fd < self->fds_cap && fd_wanted(&self->fds[fd]) == 0)
        fileobj_forget(self, fd);
    return PyBool_FromLong(removed);
}

static PyObject *
loop_add_reader(LoopObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return add_io(self, args, nargs, NULL, "add_reader", TL_POLL_READ, 0);
}

static PyObject *
loop_add_writer(LoopObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return add_io(self, args, nargs, NULL, "add_writer", TL_POLL_WRITE, 0);
}

/* The internal forms (asyncio's _add_reader): no transport check, and the
 * Handle is returned. */
static PyObject *
loop__add_reader(LoopObject *self, PyObject *const *args, Py_ssize_t nargsf,
                 PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *context;
    if (add_io_context("_add_reader", args + nargs, kwnames, &context) < 0)
        return NULL;
    return add_io(self, args, nargs, context, "_add_reader", TL_POLL_READ, 1);
}

static PyObject *
loop__add_writer(LoopObject *self, PyObject *const *args, Py_ssize_t nargsf,
                 PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *context;
    if (add_io_context("_add_writer", args + nargs, kwnames, &context) < 0)
        return NULL;
    return add_io(self, args, nargs, context, "_add_writer", TL_POLL_WRITE, 1);
}

static PyObject *
loop_remove_reader(LoopObject *self, PyObject *fd)
{
    return remove_io(self, fd, TL_POLL_READ, 1);
}

static PyObject *
loop_remove_writer(LoopObject *self, PyObject *fd)
{
    return remove_io(self, fd, TL_POLL_WRITE, 1);
}

static PyObject *
loop__remove_reader(LoopObject *self, PyObject *fd)
{
    return remove_io(self, fd, TL_POLL_READ, 0);
}

static PyObject *
loop__remove_writer(LoopObject *self, PyObject *fd)
{
    return remove_io(self, fd, TL_POLL_WRITE, 0);
}

static PyObject *
loop_check_fd_transport(LoopObject *self, PyObject *fileobj)
{
    int fd = tl_fd_from_object(fileobj);
    if (fd < 0 || check_no_transport(self, fd, fileobj) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* What a slot shows as a Handle: its own, or one made for a watcher. */
static PyObject *
slot_handle(LoopObject *self, tl_fdslot *s)
{
    if (s->io != NULL)
        return (PyObject *)tl_io_make_handle(self, s->io);
    if (s->handle != NULL && !s->handle->cancelled)
        return Py_NewRef((PyObject *)s->handle);
    return Py_NewRef(Py_None);
}

/* (fd, reader handle or None, writer handle or None) for a watched fd, else
 * None: what tideloop.Loop._selector.get_key() shows. */
static PyObject *
loop_fd_handles(LoopObject *self, PyObject *fileobj)
{
    int fd = tl_fd_from_object(fileobj);
    if (fd < 0)
        return NULL;
    if (self->closed || (size_t)fd >= self->fds_cap)
        Py_RETURN_NONE;
    tl_fdentry *e = &self->fds[fd];
    if (e->internal)
        Py_RETURN_NONE;
    PyObject *r = slot_handle(self, &e->rd);
    PyObject *w = r ? slot_handle(self, &e->wr) : NULL;
    PyObject *res = NULL;
    if (w != NULL)
        res = (r == Py_None && w == Py_None) ? Py_NewRef(Py_None)
                                             : Py_BuildValue("(iOO)", fd, r, w);
    Py_XDECREF(r);
    Py_XDECREF(w);
    return res;
}

/* The fds with a reader or writer (not the loop's own). */
static PyObject *
loop_watched_fds(LoopObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(0);
    if (list == NULL || self->closed)
        return list;
    for (size_t fd = 0; fd < self->fds_cap; fd++) {
        tl_fdentry *e = &self->fds[fd];
        if (e->internal || !fd_wanted(e))
            continue;
        PyObject *v = PyLong_FromSize_t(fd);
        if (v == NULL || PyList_Append(list, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(v);
    }
    return list;
}

const PyMethodDef tl_fd_loop_methods[] = {
    {"add_reader", (PyCFunction)(void (*)(void))loop_add_reader, METH_FASTCALL,
     "add_reader(fd, callback, *args)"},
    {"add_writer", (PyCFunction)(void (*)(void))loop_add_writer, METH_FASTCALL,
     "add_writer(fd, callback, *args)"},
    {"_add_reader", (PyCFunction)(void (*)(void))loop__add_reader,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_add_writer", (PyCFunction)(void (*)(void))loop__add_writer,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"remove_reader", (PyCFunction)loop_remove_reader, METH_O, NULL},
    {"remove_writer", (PyCFunction)loop_remove_writer, METH_O, NULL},
    {"_remove_reader", (PyCFunction)loop__remove_reader, METH_O, NULL},
    {"_remove_writer", (PyCFunction)loop__remove_writer, METH_O, NULL},
    {"_check_fd_transport", (PyCFunction)loop_check_fd_transport, METH_O, NULL},
    {"_fd_handles", (PyCFunction)loop_fd_handles, METH_O, NULL},
    {"_watched_fds", (PyCFunction)loop_watched_fds, METH_NOARGS, NULL},
    {NULL}
};
