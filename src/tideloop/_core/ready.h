/* The ready queue and what it holds: Handles, and the C readers and writers
 * of transports and listeners (io watchers, iowatch.h).
 *
 * The fd table (fdtable.c) queues a watcher here on an event; the loop
 * (loop.c) runs it (iowatch.c: tl_io_run) in the same order as asyncio's
 * reader Handle would run.  Leaf: includes only Python.h, health.h and
 * iowatch.h. */
#ifndef TIDELOOP_READY_H
#define TIDELOOP_READY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <assert.h>
#include <stdint.h>

#include "health.h"
#include "iowatch.h"

/* A queued item is one word, as a ring of Handle pointers would be (call_soon
 * costs little more than this ring's memory): a Handle, or a watcher with
 * the low bit set.  Either way the queue holds a reference: to the Handle,
 * or to the watcher's owner. */
typedef void *tl_ready_item;
#define TL_READY_IO ((uintptr_t)1)
_Static_assert(_Alignof(tl_io_watcher) >= 2, "the low bit tags watchers");

static inline tl_io_watcher *
tl_ready_io(tl_ready_item it)
{
    uintptr_t v = (uintptr_t)it;
    return (v & TL_READY_IO) ? (tl_io_watcher *)(v & ~TL_READY_IO) : NULL;
}

/* The object the queue holds a reference to. */
static inline PyObject *
tl_ready_obj(tl_ready_item it)
{
    tl_io_watcher *w = tl_ready_io(it);
    return w != NULL ? w->owner : (PyObject *)it;
}

typedef struct {
    tl_ready_item *items;     /* a ring */
    size_t head, len, cap;    /* cap: a power of two */
    int64_t first_ns;         /* when the first item since the loop's last
                                 batch was queued (0: none yet): one clock
                                 read per batch gives its scheduling lag */
} tl_ready_queue;

static inline int
tl_ready_grow(tl_ready_queue *q)
{
    size_t cap = q->cap ? q->cap * 2 : 256;
    tl_ready_item *buf = PyMem_Malloc(cap * sizeof(*buf));
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < q->len; i++)
        buf[i] = q->items[(q->head + i) & (q->cap - 1)];
    PyMem_Free(q->items);
    q->items = buf;
    q->head = 0;
    q->cap = cap;
    return 0;
}

static inline int
tl_ready_push_item(tl_ready_queue *q, tl_ready_item it)
{
    assert(it != NULL && tl_ready_obj(it) != NULL);
    if (q->len == q->cap && tl_ready_grow(q) < 0) {
        Py_DECREF(tl_ready_obj(it));
        return -1;
    }
    /* The ring: cap a power of two, room for one more. */
    assert(q->cap != 0 && (q->cap & (q->cap - 1)) == 0 && q->len < q->cap);
    /* The queue's own reference (the pusher's, or the one push_io took). */
    assert(Py_REFCNT(tl_ready_obj(it)) > 0);
    q->items[(q->head + q->len) & (q->cap - 1)] = it;
    /* One writer at a time; stored atomically because loop.diagnostics()
     * and the inbox's check read it from other threads. */
    __atomic_store_n(&q->len, q->len + 1, __ATOMIC_RELAXED);
    if (q->first_ns == 0)
        q->first_ns = tl_now_ns();
    return 0;
}

/* Queue a Handle; steals the reference (dropped if the queue cannot grow). */
static inline int
tl_ready_push(tl_ready_queue *q, PyObject *handle)
{
    return tl_ready_push_item(q, handle);
}

/* Queue a watcher's run (once: a second event before it ran is the same). */
static inline int
tl_ready_push_io(tl_ready_queue *q, tl_io_watcher *w)
{
    if (!tl_io_mark_queued(w))
        return 0;
    return tl_ready_push_item(q, (tl_ready_item)((uintptr_t)w | TL_READY_IO));
}

/* The next item, as queued (see tl_ready_io); a watcher's item must be
 * marked as no longer queued by the caller (tl_ready_clear shows how). */
static inline tl_ready_item
tl_ready_pop(tl_ready_queue *q)
{
    assert(q->len > 0 && q->len <= q->cap && q->head < q->cap);
    tl_ready_item it = q->items[q->head];
    assert(it != NULL);
    /* A queued watcher says so (its one item: see tl_ready_push_io). */
    assert(tl_ready_io(it) == NULL ||
           (tl_ready_io(it)->queued && tl_io_watcher_ok(tl_ready_io(it))));
    q->head = (q->head + 1) & (q->cap - 1);
    __atomic_store_n(&q->len, q->len - 1, __ATOMIC_RELAXED);
    return it;
}

/* Take everything queued, leaving q empty (the caller owns the items). */
static inline tl_ready_queue
tl_ready_take(tl_ready_queue *q)
{
    tl_ready_queue all = *q;
    q->items = NULL;
    q->head = q->cap = 0;
    q->first_ns = 0;
    __atomic_store_n(&q->len, 0, __ATOMIC_RELAXED);
    return all;
}

/* Exchange two queues (their buffers too); lengths stored atomically. */
static inline void
tl_ready_swap(tl_ready_queue *a, tl_ready_queue *b)
{
    tl_ready_queue t = *a;
    size_t alen = b->len, blen = t.len;
    *a = *b;
    *b = t;
    __atomic_store_n(&a->len, alen, __ATOMIC_RELAXED);
    __atomic_store_n(&b->len, blen, __ATOMIC_RELAXED);
}

static inline void
tl_ready_clear(tl_ready_queue *q)
{
    while (q->len) {
        tl_ready_item it = tl_ready_pop(q);
        tl_io_watcher *w = tl_ready_io(it);
        if (w != NULL)
            Py_DECREF(tl_io_unqueue(w));
        else
            Py_DECREF((PyObject *)it);
    }
}

static inline int
tl_ready_traverse(tl_ready_queue *q, visitproc visit, void *arg)
{
    for (size_t i = 0; i < q->len; i++)
        Py_VISIT(tl_ready_obj(q->items[(q->head + i) & (q->cap - 1)]));
    return 0;
}

#endif
