/* Shared declarations of the tideloop core. */
#ifndef TIDELOOP_INTERNAL_H
#define TIDELOOP_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <sys/types.h>

#include "compat.h"
#include "heap.h"
#include "poller.h"

/* Arguments up to this count live inside the handle: no tuple per call. */
#define TL_INLINE_ARGS 3
#define TL_HANDLE_FREELIST_MAX 1024
/* Transports receive into a bytes object of TL_SPARE_SIZE; reads at least
 * TL_HANDOVER_MIN long are handed over in it (shrunk in place), shorter ones
 * are copied out.  The size stays under glibc's default mmap threshold
 * (128 KiB): a larger block would be an mmap/mremap/munmap per read. */
#define TL_SPARE_SIZE (128 * 1024 - 256)
#define TL_HANDOVER_MIN (16 * 1024)

typedef struct LoopObject LoopObject;

enum { TL_KW_LOOP = 1, TL_KW_NAME = 2, TL_KW_CONTEXT = 4 };

/* What BaseEventLoop.create_task does with a task factory (tideloop._compat). */
enum {
    TL_CREATE_TASK_STOCK = 0,    /* unknown: always call the stock method */
    TL_CREATE_TASK_HELPER,       /* factory, then tasks._set_task_name() */
    TL_CREATE_TASK_SET_NAME,     /* factory, then task.set_name(name) */
    TL_CREATE_TASK_KWARGS,       /* factory(loop, coro, **kwargs) */
};
typedef struct HandleObject HandleObject;

/* Module state: every Python object the core needs, looked up once. */
typedef struct {
    PyTypeObject *LoopType;
    PyTypeObject *HandleType;
    PyTypeObject *TimerHandleType;
    PyTypeObject *SocketTransportType;
    PyTypeObject *DatagramTransportType;
    PyTypeObject *ReadPipeTransportType;
    PyTypeObject *WritePipeTransportType;
    PyTypeObject *ListenerType;
    PyTypeObject *SockOpType;

    PyObject *Future;                 /* asyncio.Future */
    PyObject *Task;                   /* asyncio.Task */
    PyObject *events_module;          /* asyncio.events: the running-loop
                                         functions are looked up per run, as
                                         asyncio does (tests swap them) */
    /* From tideloop._compat (asyncio's private names, with fallbacks): */
    PyObject *format_callback_source; /* (func, args, debug) -> str */
    PyObject *extract_stack;          /* asyncio.format_helpers.extract_stack */
    PyObject *iscoroutine;            /* asyncio.coroutines.iscoroutine */
    PyObject *iscoroutinefunction;    /* asyncio.coroutines.iscoroutinefunction */
    PyObject *logger;                 /* asyncio.log.logger */
    PyObject *format_handle;          /* asyncio.base_events._format_handle */
    PyObject *get_asyncgen_hooks;     /* sys.get_asyncgen_hooks */
    PyObject *BufferedProtocol;       /* asyncio.BufferedProtocol */
    PyObject *TransportSocket;        /* asyncio.trsock.TransportSocket */
    PyObject *socket_socket;          /* socket.socket */
    PyObject *SSLSocket;              /* ssl.SSLSocket, imported on first need */
    PyObject *set_result_unless_cancelled;  /* asyncio.futures */
    PyObject *sendfile_try_native;    /* constants._SendfileMode.TRY_NATIVE */
    PyObject *set_asyncgen_hooks;     /* sys.set_asyncgen_hooks */

    /* Keyword-name tuples for vectorcalls, by which of loop=, name=,
     * context= are passed (TL_KW_* bits, in that order). */
    PyObject *kwnames[8];
    PyObject *str_context;
    PyObject *str_name;
    PyObject *str_call_exception_handler;
    PyObject *str_message;
    PyObject *str_exception;
    PyObject *str_handle;
    PyObject *str_source_traceback;
    PyObject *str_firstiter;
    PyObject *str_finalizer;
    PyObject *str_asyncgen_firstiter_hook;
    PyObject *str_asyncgen_finalizer_hook;
    PyObject *str_set_coroutine_origin_tracking;
    PyObject *str_remove_signal_handler;
    PyObject *str_set_running_loop;
    PyObject *str_data_received;
    PyObject *str_datagram_received;
    PyObject *str_done;
    PyObject *str_fileno;
    PyObject *str_result;
    PyObject *str_set_result;
    PyObject *str_set_exception;
    PyObject *str_future_blocking;
    PyObject *str_get_buffer;
    PyObject *str_buffer_updated;
    PyObject *str_get_running_loop;
    PyObject *create_task_stock;  /* BaseEventLoop.create_task of this interpreter */
    int create_task_style;       /* how it uses a task factory: TL_CREATE_TASK_* */
    PyObject *set_task_name;     /* 3.11-3.12: asyncio.tasks._set_task_name */
    PyObject *str_set_name;
    PyObject *str_Task;
    PyObject *ThreadSafeHandle;  /* 3.14: asyncio.events._ThreadSafeHandle, else None */
    PyTypeObject *ThreadSafeHandleType;  /* ours, where that class exists, else NULL */
    PyObject *str_Future;
    PyObject *tasks_dict;        /* asyncio.tasks.__dict__ (Task at call time) */
    PyObject *futures_dict;      /* asyncio.futures.__dict__ */

    int server_attach_takes_transport;   /* 3.13+: Server._attach(transport) */
    /* How this interpreter's stock transports treat what is written (see
     * tideloop._compat: probed from the stock classes). */
    PyObject *write_type_error_prefix;   /* str: "data argument must be ..., not " */
    PyObject *sendto_type_error_prefix;
    int writelines_views;        /* 3.12+: writelines() of its own (no join) */
    int writelines_skips_empty;  /* later releases: false items are dropped */
    int dgram_sends_empty;       /* 3.13+: sendto(b"") sends an empty datagram */

    /* Recycled handle memory (GC-untracked, type reference dropped). */
    HandleObject *handle_freelist;
    int handle_nfree;
    int handle_freelist_closed;      /* module being torn down */

    /* Context snapshots (see handle.c): 1 when this interpreter's
     * Context layout was verified at import. */
    int fast_context;
    PyObject *empty_vars;             /* the variables of an empty Context */

    /* Bumped in the child after os.fork(): loops from before are unusable. */
    uint64_t fork_generation;
} tl_state;

struct HandleObject {
    PyObject_HEAD
    PyObject *callback;          /* NULL once cancelled, like asyncio's None */
    PyObject *args_tuple;        /* only when nargs > TL_INLINE_ARGS */
    PyObject *argv[TL_INLINE_ARGS];
    Py_ssize_t nargs;
    PyObject *context;           /* explicit Context, or materialized one */
    PyObject *ctx_vars;          /* else: the variables at schedule time */
    LoopObject *loop;
    PyObject *source_traceback;  /* debug mode only */
    PyObject *repr_cache;        /* debug mode: repr kept after cancel */
    PyObject *weakreflist;
    double when;                 /* timers: the deadline as given */
    tl_heap_node node;           /* timers: heap position */
    char cancelled;
    char scheduled;              /* timers: currently in the heap */
    char running;                /* cancel() defers dropping the callback */
    HandleObject *next_free;
};

/* Every transport type starts with this, so the loop can tell whether an fd
 * belongs to a live transport (add_reader refuses those, as asyncio does).
 * The stream transports derive from asyncio.transports._FlowControlMixin
 * (isinstance checks in asyncio and in libraries), whose instance fields are
 * five slots after the object header: '_extra', then '_loop',
 * '_protocol_paused', '_high_water', '_low_water'.  The layout is checked at
 * import (module.c).  Our getters shadow the last four; they stay NULL. */
typedef struct {
    PyObject_HEAD
    PyObject *extra;             /* asyncio's BaseTransport._extra */
    PyObject *flow_slots[4];     /* _FlowControlMixin's slots, unused */
    int closing;
} tl_transport_head;

typedef struct {
    HandleObject *reader;
    HandleObject *writer;
    int mask;                    /* interest armed in the poller (0: none),
                                    or about to be (dirty) */
    int oneshot;                 /* armed with TL_POLL_ONESHOT */
    int dormant;                 /* known to the poller, disarmed: re-arming
                                    is a modify, and removing costs nothing */
    int internal;                /* 1: wakeup eventfd, 2: signal pipe */
    int dirty;                   /* mask differs from what the poller has
                                    (kmask); applied before the next poll */
    int kmask;
    tl_transport_head *transport;   /* borrowed; cleared when it lets go */
} tl_fdentry;

#define TL_FD_WAKEUP 1
#define TL_FD_SIGNAL 2

struct LoopObject {
    PyObject_HEAD
    tl_state *state;
    tl_poller *poller;
    int wakeup_fd;               /* eventfd for call_soon_threadsafe */
    int signal_rfd;              /* read end of the signal wakeup pipe, or -1 */
    int signal_wfd;
    int sleeping;                /* in the poll call with the GIL released */
    int closed;
    int stopping;
    int debug;
    unsigned long thread_id;     /* 0: not running */
    /* 3.14: held by the loop thread while a _ThreadSafeHandle's callback
     * runs, so that its cancel()/cancelled() from another thread wait for
     * the callback to end (allocated on first use). */
    PyThread_type_lock threadsafe_lock;
    uint64_t fork_generation;

    /* Ready queue: a ring of strong references. */
    HandleObject **ready;
    size_t ready_head;
    size_t ready_len;
    size_t ready_cap;            /* power of two */

    tl_heap timers;              /* strong references to TimerHandles */
    uint64_t timer_seq;

    tl_fdentry *fds;
    size_t fds_cap;
    size_t fds_registered;
    size_t fds_internal;         /* how many of those are the loop's own */
    tl_poll_event *events;
    int events_cap;
    int *dirty_fds;              /* fds with a deferred interest change */
    size_t dirty_len, dirty_cap;

    char *dgram_buf;             /* datagram transports receive here
                                    (PyMem, made on first use, see dgram.c) */
    PyObject *spare_bytes;       /* a TL_SPARE_SIZE bytes object that
                                    transports receive into (see stream.c) */

    double clock_resolution;
    double slow_callback_duration;
    PyObject *current_handle;
    PyObject *run_ctx;           /* reusable Context for snapshot handles */
    PyObject *task_factory;
    PyObject *signal_handlers;   /* dict: signum -> Handle */
    PyObject *dict;
    PyObject *weakreflist;

    /* Counters for loop metrics. */
    uint64_t n_iterations;
    uint64_t n_callbacks;
    uint64_t n_io_events;
    uint64_t n_polls;
    uint64_t n_timers_fired;
    uint64_t n_slow_callbacks;
    double poll_time;
};

/* handle.c */
extern PyType_Spec tl_handle_spec;
extern PyType_Spec tl_timer_handle_spec;
extern PyType_Spec tl_threadsafe_handle_spec;
int tl_loop_lock_threadsafe(LoopObject *loop);
/* reusable: the handle may run more than once (readers, writers, signals),
 * so it gets a real Context copy whose changes persist between runs. */
HandleObject *tl_handle_new(tl_state *st, PyTypeObject *type, LoopObject *loop,
                            PyObject *callback, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *context, int reusable);
int tl_context_init(tl_state *st);
PyObject *tl_context_from_vars(PyObject *vars);
/* 0: ran (errors went to the exception handler); -1: exception to propagate */
int tl_handle_run(HandleObject *h);
int tl_handle_cancel(HandleObject *h);   /* -1 only if debug repr fails */
int tl_handle_run_batched(HandleObject *h, int *entered);
void tl_batch_exit(LoopObject *loop, int *entered);
void tl_handle_free_list(tl_state *st);

/* stream.c */
extern PyType_Spec tl_socket_transport_spec;
extern PyType_Spec tl_listener_spec;
PyObject *tl_loop_make_socket_transport(PyObject *loop, PyObject *args,
                                        PyObject *kwds);
PyObject *tl_loop_serve(PyObject *loop, PyObject *args);

/* sockops.c */
extern PyType_Spec tl_sockop_spec;
PyObject *tl_loop_sock_recv(PyObject *loop, PyObject *const *args, Py_ssize_t n,
                            PyObject *kwnames);
PyObject *tl_loop_sock_recv_into(PyObject *loop, PyObject *const *args,
                                 Py_ssize_t n, PyObject *kwnames);
PyObject *tl_loop_sock_sendall(PyObject *loop, PyObject *const *args,
                               Py_ssize_t n, PyObject *kwnames);
PyObject *tl_loop_sock_accept(PyObject *loop, PyObject *const *args,
                              Py_ssize_t n, PyObject *kwnames);

/* sockaddr.c */
struct sockaddr;
PyObject *tl_sockaddr_to_py(const struct sockaddr *sa, unsigned int len);

/* loop.c */
extern PyType_Spec tl_loop_spec;
/* Internal API for transports (no transport check, handles reusable). */
int tl_loop_add_io(LoopObject *loop, int fd, int which, PyObject *callback);
/* For a callback that expects one event (sock_* waits): the poller disarms
 * the fd after reporting it, so finishing needs no syscall and waiting
 * again is one. */
HandleObject *tl_loop_add_io_oneshot(LoopObject *loop, int fd, int which,
                                     PyObject *callback);   /* new ref */
int tl_loop_remove_io(LoopObject *loop, int fd, int which);   /* 1: removed */
int tl_loop_call_soon(LoopObject *loop, PyObject *callback,
                      PyObject *const *args, Py_ssize_t nargs);
PyObject *tl_loop_call_later(LoopObject *loop, double delay,
                             PyObject *callback);
int tl_loop_set_fd_transport(LoopObject *loop, int fd, tl_transport_head *t);
void tl_loop_clear_fd_transport(LoopObject *loop, int fd, tl_transport_head *t);
int tl_loop_check_closed(LoopObject *loop);
ssize_t tl_loop_read_spare(LoopObject *loop, int fd, size_t max, int use_read,
                           PyObject **data);
int tl_loop_check_fd_transport(LoopObject *loop, int fd);
PyObject *tl_loop_create_future(LoopObject *loop);
/* loop.call_exception_handler({message, exception, **pairs}); pairs are
 * (const char *key, PyObject *value) ending with NULL. */
int tl_loop_report(LoopObject *loop, const char *message, PyObject *exc, ...);
void tl_loop_unschedule_timer(LoopObject *loop, HandleObject *h);
double tl_monotonic(void);

static inline tl_state *
tl_get_state_from_type(PyTypeObject *tp)
{
    return (tl_state *)PyType_GetModuleState(tp);
}

/* *fd = obj.fileno(); -1 with the error set. */
static inline int
tl_call_fileno(tl_state *st, PyObject *obj, long *fd)
{
    PyObject *fdo = PyObject_CallMethodNoArgs(obj, st->str_fileno);
    if (fdo == NULL)
        return -1;
    *fd = PyLong_AsLong(fdo);
    Py_DECREF(fdo);
    return (*fd == -1 && PyErr_Occurred()) ? -1 : 0;
}

#endif
