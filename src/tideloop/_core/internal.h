/* Shared declarations of the tideloop core.
 *
 * THE ERROR CONVENTION, everywhere in the core:
 *   - a function returning int returns 0 on success and -1 with a Python
 *     exception set on failure; other results go through out-parameters
 *     (an errno, "removed", "would block", a count).  The one exception: a
 *     yes/no question that cannot fail (tl_tr_is_reading, is_kw, ...)
 *     answers 1 or 0, and its comment says so;
 *   - a function returning PyObject * returns a new reference, or NULL with
 *     an exception set;
 *   - cleanup after a failure goes through one `goto error` (or `goto done`
 *     when success and failure share it) at the end of the function;
 *   - the pending exception is taken and put back as one object with
 *     tl_err_get_raised()/tl_err_set_raised() (compat.h), never with
 *     PyErr_Fetch/PyErr_Restore.
 * src/tideloop/_core/README.md maps the files: what each owns and what it
 * may call. */
#ifndef TIDELOOP_INTERNAL_H
#define TIDELOOP_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "compat.h"
#include "heap.h"
#include "poller.h"
#include "ready.h"
#include "health.h"

/* A system call that failed with EINTR is retried only after Python's
 * signal handlers ran: a call on an fd that blocks (a blocking socket given
 * to sock_recv(), say) must let Ctrl-C and a SIGALRM handler in, as the
 * socket module's calls do.  do n = recv(...); while (tl_retry_eintr(n));
 * then n < 0 with an exception set: a handler raised.  Needs an attached
 * thread state; elsewhere than the main thread of the main interpreter
 * PyErr_CheckSignals() does nothing. */
#include <errno.h>
static inline int
tl_retry_eintr(ssize_t n)
{
    return n < 0 && errno == EINTR && PyErr_CheckSignals() == 0;
}

/* TIDELOOP_PORTABLE=1 in the environment: every path that relies on
 * CPython's private layouts takes its public fallback (the context copy
 * here; the TLS route and the C streams path in tideloop/_tls.py and
 * _streams.py).  Read at import; tideloop/_internals.py lists them all. */
#include <stdlib.h>
#include <string.h>
static inline int
tl_portable(void)
{
    const char *v = getenv("TIDELOOP_PORTABLE");
    return v != NULL && *v != '\0' && strcmp(v, "0") != 0 && strcmp(v, "off") != 0 &&
           strcmp(v, "no") != 0;
}

/* Free-threaded builds (3.13t+): the few places where another thread may
 * reach a loop are made safe on purpose (the threading contract in
 * README.md: a loop belongs to the thread running it).  GIL builds compile
 * none of it. */
#ifdef Py_GIL_DISABLED
#  define TL_FREE_THREADED 1
#else
#  define TL_FREE_THREADED 0
#endif

/* Arguments up to this count live inside the handle: no tuple per call. */
#define TL_INLINE_ARGS 3
#define TL_HANDLE_FREELIST_MAX 1024

typedef struct LoopObject LoopObject;

/* The OpenSSL functions tls.c calls, by pointer: the extension does not
 * link libssl, it uses the copy that CPython's _ssl module loaded. */
typedef struct {
    int (*SSL_read_ex)(void *ssl, void *buf, size_t num, size_t *readbytes);
    int (*SSL_write_ex)(void *ssl, const void *buf, size_t num, size_t *written);
    int (*SSL_get_error)(const void *ssl, int ret);
    int (*SSL_get_shutdown)(const void *ssl);
    void *(*SSL_get_rbio)(const void *ssl);
    void *(*SSL_get_wbio)(const void *ssl);
    void *(*SSL_get_SSL_CTX)(const void *ssl);
    void *(*SSL_get_ex_data)(const void *ssl, int idx);
    int (*SSL_is_server)(const void *ssl);
    int (*SSL_has_pending)(const void *ssl);
    long (*SSL_ctrl)(void *ssl, int cmd, long larg, void *parg);
    int (*SSL_do_handshake)(void *ssl);
    int (*BIO_write)(void *bio, const void *data, int len);
    int (*BIO_read)(void *bio, void *data, int len);
    size_t (*BIO_ctrl_pending)(void *bio);
    void (*ERR_clear_error)(void);
    unsigned long (*ERR_peek_last_error)(void);
    const char *(*ERR_reason_error_string)(unsigned long e);
    long (*SSL_get_verify_result)(const void *ssl);
    const char *(*X509_verify_cert_error_string)(long n);
    const char *(*OpenSSL_version)(int t);
    unsigned long (*OpenSSL_version_num)(void);
    /* NULL: not offered, or not safe in this OpenSSL (tls.c) */
    int (*SSL_free_buffers)(void *ssl);
    /* for the idle check's BIO_set_mem_buf (with SSL_free_buffers) */
    long (*BIO_ctrl)(void *bio, int cmd, long larg, void *parg);
    void *(*BUF_MEM_new)(void);
} tl_ossl;

enum { TL_TLS_ASYNCIO = 0, TL_TLS_SSLOBJECT = 1, TL_TLS_OPENSSL = 2 };
typedef struct HandleObject HandleObject;

enum { TL_KW_LOOP = 1, TL_KW_NAME = 2, TL_KW_CONTEXT = 4 };

/* What BaseEventLoop.create_task does with a task factory (tideloop._compat). */
enum {
    TL_CREATE_TASK_STOCK = 0,    /* unknown: always call the stock method */
    TL_CREATE_TASK_HELPER,       /* factory, then tasks._set_task_name() */
    TL_CREATE_TASK_SET_NAME,     /* factory, then task.set_name(name) */
    TL_CREATE_TASK_KWARGS,       /* factory(loop, coro, **kwargs) */
};

/* ---- module state ----
 * Every Python object the core needs, looked up once.  The fields are
 * listed once, here; the struct, module.c's init, traverse and clear are
 * generated from these lists. */

/* The core's types: field. */
#define TL_STATE_TYPES(X)                                                  \
    X(LoopType) X(HandleType) X(TimerHandleType)                           \
    X(ThreadSafeHandleType)  /* 3.14 (where asyncio has the class) */      \
    X(SocketTransportType) X(DatagramTransportType)                        \
    X(ReadPipeTransportType) X(WritePipeTransportType)                     \
    X(ListenerType) X(SockOpType) X(TLSEngineType)                        \
    X(StreamMethodType) X(StreamOpType) X(StreamFeederType)

/* From tideloop._compat (asyncio's private names, with fallbacks):
 * field, attribute. */
#define TL_STATE_FROM_COMPAT(X)                                            \
    X(format_callback_source, "format_callback_source")                    \
    X(extract_stack, "extract_stack")                                      \
    X(format_handle, "format_handle")        /* base_events._format_handle */ \
    X(set_result_unless_cancelled, "set_result_unless_cancelled")          \
    X(TransportSocket, "TransportSocket")                                  \
    X(sendfile_try_native, "SENDFILE_TRY_NATIVE")                          \
    X(iscoroutine, "iscoroutine")                                          \
    X(iscoroutinefunction, "iscoroutinefunction")                          \
    /* str: "data argument must be ..., not " as this interpreter words it */ \
    X(write_type_error_prefix, "WRITE_TYPE_ERROR_PREFIX")                  \
    X(sendto_type_error_prefix, "SENDTO_TYPE_ERROR_PREFIX")                \
    X(ThreadSafeHandle, "ThreadSafeHandle")  /* 3.14's class, else None */ \
    X(create_task_stock, "create_task_stock")  /* BaseEventLoop's */      \
    X(set_task_name, "set_task_name")        /* 3.11-3.12 helper */        \
    X(FlowControlMixin, "FlowControlMixin")

/* Imported at init: field, module, attribute. */
#define TL_STATE_IMPORTED(X)                                               \
    X(Future, "asyncio", "Future")                                         \
    X(Task, "asyncio", "Task")                                             \
    X(logger, "asyncio.log", "logger")                                     \
    X(BufferedProtocol, "asyncio", "BufferedProtocol")                     \
    X(get_asyncgen_hooks, "sys", "get_asyncgen_hooks")                     \
    X(set_asyncgen_hooks, "sys", "set_asyncgen_hooks")                     \
    X(socket_socket, "socket", "socket")

/* Interned names: str_<field>, text. */
#define TL_STATE_STRINGS(X)                                                \
    X(context, "context") X(name, "name") X(loop, "loop")                  \
    X(call_exception_handler, "call_exception_handler")                    \
    X(message, "message") X(exception, "exception") X(handle, "handle")    \
    X(source_traceback, "source_traceback")                                \
    X(firstiter, "firstiter") X(finalizer, "finalizer")                    \
    X(asyncgen_firstiter_hook, "_asyncgen_firstiter_hook")                 \
    X(asyncgen_finalizer_hook, "_asyncgen_finalizer_hook")                 \
    X(set_coroutine_origin_tracking, "_set_coroutine_origin_tracking")     \
    X(remove_signal_handler, "remove_signal_handler")                      \
    X(set_running_loop, "_set_running_loop")                               \
    X(get_running_loop, "_get_running_loop")                               \
    X(data_received, "data_received")                                      \
    X(datagram_received, "datagram_received")                              \
    X(eof_received, "eof_received")                                        \
    X(connection_made, "connection_made")                                  \
    X(connection_lost, "connection_lost")                                  \
    X(get_buffer, "get_buffer") X(buffer_updated, "buffer_updated")        \
    X(done, "done") X(fileno, "fileno") X(result, "result")                \
    X(set_result, "set_result") X(set_exception, "set_exception")          \
    X(future_blocking, "_asyncio_future_blocking")                         \
    X(Task, "Task") X(Future, "Future") X(set_name, "set_name")            \
    X(family, "family") X(type, "type") X(proto, "proto")                  \
    /* per connection (interned: no new name object per call) */          \
    X(close, "close") X(attach, "_attach") X(detach, "_detach")            \
    X(start_reading, "_start_reading")                                     \
    X(call_connection_lost, "_call_connection_lost")                       \
    /* tls.c: SSLProtocol's attributes and methods */                      \
    X(tl_engine, "_tl_engine") X(t_state, "_state")                        \
    X(app_reading_paused, "_app_reading_paused")                           \
    X(app_protocol_is_buffer, "_app_protocol_is_buffer")                   \
    X(app_protocol, "_app_protocol") X(write_backlog, "_write_backlog")    \
    X(append, "append") X(server_hostname, "server_hostname")              \
    X(library, "library") X(reason, "reason")                              \
    X(t_coro, "_coro") X(cr_frame, "cr_frame") X(self_attr, "__self__")    \
    X(cr_await, "cr_await") X(cr_suspended, "cr_suspended")                \
    X(get_coro, "get_coro") X(qualname, "__qualname__")                    \
    X(verify_code, "verify_code") X(verify_message, "verify_message")      \
    X(app_protocol_get_buffer, "_app_protocol_get_buffer")                 \
    X(app_protocol_buffer_updated, "_app_protocol_buffer_updated")         \
    X(call_soon, "call_soon")                                              \
    X(ssl_writing_paused, "_ssl_writing_paused")                           \
    X(app_writing_paused, "_app_writing_paused")                           \
    X(write_buffer_size, "_write_buffer_size")                             \
    X(outgoing_high_water, "_outgoing_high_water")                         \
    X(outgoing_low_water, "_outgoing_low_water")                           \
    X(ssl_reading_paused, "_ssl_reading_paused")                           \
    X(incoming_high_water, "_incoming_high_water")                         \
    X(incoming_low_water, "_incoming_low_water")                           \
    X(t_transport, "_transport") X(ssl_protocol, "_ssl_protocol")          \
    X(app_transport, "_app_transport") X(t_sslobj, "_sslobj")              \
    X(t_incoming, "_incoming") X(t_outgoing, "_outgoing")                  \
    X(t_loop, "_loop")                                                     \
    X(do_handshake, "_do_handshake") X(do_read, "_do_read")                \
    X(do_flush, "_do_flush") X(do_shutdown, "_do_shutdown")                \
    X(do_write, "_do_write") X(write_appdata, "_write_appdata")            \
    X(control_app_writing, "_control_app_writing")                         \
    X(control_ssl_reading, "_control_ssl_reading")                         \
    X(call_eof_received, "_call_eof_received")                             \
    X(start_shutdown, "_start_shutdown") X(fatal_error, "_fatal_error")    \
    X(read, "read") X(write, "write") X(pending, "pending")                \
    /* streams.c: asyncio's stream objects' attributes and methods */      \
    X(s_buffer, "_buffer") X(s_eof, "_eof") X(s_waiter, "_waiter")         \
    X(s_exception, "_exception") X(s_paused, "_paused")                    \
    X(s_limit, "_limit") X(s_reader_wr, "_stream_reader_wr")               \
    X(s_connection_lost, "_connection_lost") X(cancelled, "cancelled")     \
    X(s_drain_waiters, "_drain_waiters")                                   \
    X(pause_reading, "pause_reading") X(resume_reading, "resume_reading")  \
    X(create_future, "create_future") X(feed_data, "feed_data")            \
    X(clear, "clear")                                                      \
    X(drain_helper, "_drain_helper")

/* The rest, set up by hand in module.c: field. */
#define TL_STATE_OTHER_OBJECTS(X)                                          \
    X(events_module)   /* asyncio.events: the running-loop functions are   \
                          looked up per run, as asyncio does (tests swap) */ \
    X(tasks_dict)      /* asyncio.tasks.__dict__ (Task at call time) */    \
    X(futures_dict)    /* asyncio.futures.__dict__ */                      \
    X(SSLSocket)       /* ssl.SSLSocket, imported on first need */         \
    X(empty_vars)      /* the variables of an empty Context */          \
    X(stop_iteration)  /* a StopIteration raised again (compat.h) */    \
    /* tls.c, set by _tls_setup() (tideloop._tls); NULL before: */         \
    X(SSLProtocol)     /* asyncio.sslproto.SSLProtocol: adopted exactly */ \
    X(tls_adopt)       /* tideloop._tls.adopt(protocol) -> engine|None */  \
    X(tls_app_write_stock)  /* _SSLProtocolTransport.write */              \
    X(tls_again_errors)     /* sslproto.SSLAgainErrors */                  \
    X(tls_do_handshake) X(tls_wrapped) X(tls_flushing) X(tls_shutdown)     \
    X(tls_sslsocket_type) X(tls_memorybio_type)  /* _ssl's own types */ \
    X(tls_errtab)      /* _ssl's exception types and code-to-name dicts,  \
                          from its module state (_tls_errors; tls.c) */   \
    /* watchdog.c, set by tideloop.diagnostics (_diag_setup); NULL before: */  \
    X(diag_capture)    /* (thread_id, frame|None) -> its stack */         \
    X(diag_report)     /* (loop, what, io_name, duration, since, delay,   \
                          stack, signalled, slow): a stall is over */     \
    X(diag_slow)       /* (loop, what, io_name, duration, task, where):   \
                          a callback took longer than the threshold */    \
    X(diag_asyncio_dir)     /* asyncio's directory, with a trailing / */  \
    X(diag_task_types)      /* (asyncio.Task, asyncio.tasks._PyTask) */  \
    /* streams.c, set by _streams_setup() (tideloop._streams); NULL before: */ \
    X(s_reader_type) X(s_protocol_type)  /* asyncio's */ \
    X(s_reader_check) X(s_protocol_check)  /* ((name,   \
                          asyncio's function), ...): the methods relied on */ \
    X(s_originals)     /* asyncio's function per stream method kind */    \
    X(s_incomplete)    /* asyncio.IncompleteReadError */                  \
    X(s_overrun)       /* asyncio.LimitOverrunError */                    \
    X(s_method_names)  /* the instance attribute per method kind */      \
    X(s_minus_one) X(s_newline)   /* read()'s and readuntil()'s defaults */ \
    X(s_deque)         /* collections.deque: _drain_waiters made real */ \
    X(s_take_bytes)    /* bytearray.take_bytes (3.15+), else NULL */      \
    X(s_markers)       /* (inspect's coroutine mark, asyncio's) or Nones */ \
    X(s_fut_cancelled) X(s_fut_set_result)  /* asyncio.Future's methods */ \
    X(s_loop_cf)       /* the Loop type's create_future descriptor */

typedef struct {
#define TL_DECLARE_TYPE(f) PyTypeObject *f;
#define TL_DECLARE_2(f, a) PyObject *f;
#define TL_DECLARE_3(f, m, a) PyObject *f;
#define TL_DECLARE_STR(f, s) PyObject *str_##f;
#define TL_DECLARE_1(f) PyObject *f;
    TL_STATE_TYPES(TL_DECLARE_TYPE)
    TL_STATE_FROM_COMPAT(TL_DECLARE_2)
    TL_STATE_IMPORTED(TL_DECLARE_3)
    TL_STATE_STRINGS(TL_DECLARE_STR)
    TL_STATE_OTHER_OBJECTS(TL_DECLARE_1)
#undef TL_DECLARE_TYPE
#undef TL_DECLARE_2
#undef TL_DECLARE_3
#undef TL_DECLARE_STR
#undef TL_DECLARE_1
    /* Keyword-name tuples for vectorcalls, by which of loop=, name=,
     * context= are passed (TL_KW_* bits, in that order). */
    PyObject *kwnames[8];

    int create_task_style;       /* how create_task uses a task factory */
    int server_attach_takes_transport;   /* 3.13+: Server._attach(transport) */
    /* How this interpreter's stock transports treat what is written (see
     * tideloop._compat: probed from the stock classes). */
    int writelines_views;        /* 3.12+: writelines() of its own (no join) */
    int writelines_skips_empty;  /* later releases: false items are dropped */
    int dgram_sends_empty;       /* 3.13+: sendto(b"") sends an empty datagram */
    /* 3.15+: an iteration's timers are due before now + max(clock
     * resolution, ulp(now)) (probed from BaseEventLoop._run_once). */
    int timer_end_ulp;

    /* Recycled handle memory (GC-untracked, type reference dropped).
     * Unused on free-threaded builds: handles are made and freed by any
     * thread there (call_soon_threadsafe), and the interpreter's allocator
     * keeps per-thread pages already. */
    HandleObject *handle_freelist;
    int handle_nfree;
    int handle_freelist_closed;      /* module being torn down */

    /* Context snapshots (see handle.c): 1 when this interpreter's
     * Context layout was verified at import. */
    int fast_context;

    /* Bumped in the child after os.fork(): loops from before are unusable. */
    uint64_t fork_generation;

    /* tls.c: the OpenSSL functions of the libssl that _ssl uses (resolved
     * through _ssl's own handle), and which TLS route new connections
     * take (TL_TLS_*). */
    tl_ossl ossl;
    int ossl_loaded;             /* the table is complete */
    int ossl_proven;             /* _tls_prove() passed on this interpreter */
    int tls_route;
    /* The _ssl.c lines its read() and write() report errors at (learnt
     * at import: the openssl route raises _ssl's exceptions itself), and
     * where 3.14's raise an SSLEOFError again (0: not this interpreter). */
    int ssl_line_read, ssl_line_write, ssl_line_eof;

    /* streams.c: the C data path of asyncio streams is on (_streams_setup
     * proved asyncio's classes; TIDELOOP_STREAMS did not turn it off), and
     * the version tags of asyncio's three stream classes when their
     * methods were last found to be asyncio's own (0: not yet). */
    int streams_on;
    struct OpObject *stream_op_freelist;   /* recycled StreamOps */
    tl_storage_pool storage_pool;          /* readers' buffer storage
                                              (compat.h) */
    int stream_op_nfree;
    int stream_op_freelist_closed;
    /* Counts since import (relaxed atomics): connections whose reader got
     * the C path, writers found, awaited calls run in C, calls handed to
     * asyncio's own coroutine, feeds asyncio's own code took. */
    uint64_t s_adopted, s_drain_helpers, s_ops_c, s_ops_python, s_feeds_python;
    unsigned int s_reader_tag, s_protocol_tag;
    /* Set by module.c: how transport.c and loop.c, which sit below
     * streams.c, reach it (no upward calls between the files). */
    int (*streams_adopt)(LoopObject *loop, PyObject *protocol,
                         PyObject **cproto);
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
    double when;                 /* timers: the deadline */
    PyObject *when_given;        /* timers: call_at()'s argument when it is
                                    not a float (asyncio keeps the object:
                                    an int stays an int), else NULL */
    tl_heap_node node;           /* timers: heap position */
    char cancelled;
    char scheduled;              /* timers: currently in the heap */
    char running;                /* cancel() defers dropping the callback */
    char threadsafe;             /* made by call_soon_threadsafe(): another
                                    thread's cancel() waits for its run */
    HandleObject *next_free;
};

/* h->cancelled where another thread may set it (free-threaded builds:
 * Handle.cancel() from a thread other than the loop's). */
static inline int
tl_handle_cancelled(HandleObject *h)
{
    return __atomic_load_n(&h->cancelled, __ATOMIC_ACQUIRE);
}

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

/* One direction of an fd: a Handle (add_reader/add_writer, sock_* waits)
 * or a C io watcher (transports, listeners; ready.h).  At most one is set. */
typedef struct {
    HandleObject *handle;
    tl_io_watcher *io;           /* the table holds a reference to its owner */
} tl_fdslot;

/* The slot's invariant: a Handle or an io watcher, not both; a watcher
 * in the table is armed. */
static inline int
tl_fdslot_ok(const tl_fdslot *s)
{
    return !(s->handle != NULL && s->io != NULL) &&
           (s->io == NULL || (s->io->armed && tl_io_watcher_ok(s->io)));
}

static inline int
tl_fdslot_used(const tl_fdslot *s)
{
    assert(tl_fdslot_ok(s));
    return s->handle != NULL || s->io != NULL;
}

typedef struct {
    tl_fdslot rd, wr;
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

/* Receive areas shared by the loop's transports (recvbuf.c). */
typedef struct {
    PyObject *spare;             /* a TL_SPARE_SIZE bytes object */
    PyObject *kept;              /* a copied-out read that its protocol let
                                    go of (tl_recv_give_back), or NULL */
    Py_ssize_t kept_size;        /* the bytes it can hold */
    PyObject *lent;              /* the last copied-out read (borrowed: */
    Py_ssize_t lent_size;        /*  only compared), and what it can hold */
    char *dgram;                 /* TL_DGRAM_AREA_SIZE bytes (PyMem) */
    char *tls;                   /* TL_TLS_AREA_SIZE bytes (PyMem): TLS
                                    ciphertext in and out, plaintext in */
} tl_recvbuf;

/* Transports receive into a bytes object of TL_SPARE_SIZE; reads at least
 * TL_HANDOVER_MIN long are handed over in it (shrunk in place), shorter ones
 * are copied out.  The size stays under glibc's default mmap threshold
 * (128 KiB): a larger block would be an mmap/mremap/munmap per read. */
#define TL_SPARE_SIZE (128 * 1024 - 256)
#define TL_HANDOVER_MIN (16 * 1024)
/* A copied-out read longer than pymalloc's largest block (512 bytes) is a
 * malloc and a free, ~700 instructions in glibc at 1 KiB: one that the
 * protocol let go of is kept and refilled by the next read of a size it
 * fits without wasting more than a quarter of it.  Such a read is made a
 * quarter larger than its bytes, so that the next read of the same size
 * can go straight into it (no copy) and still leave room: a read that
 * fills it may have left bytes in the socket.  The GIL builds only: a
 * free-threaded build's reference count is not one word to compare. */
#define TL_KEEP_MIN 513
#ifdef Py_GIL_DISABLED
#  define TL_KEEP_READS 0
#else
#  define TL_KEEP_READS 1
#endif
#define TL_DGRAM_BATCH 8
#define TL_DGRAM_SLOT_SIZE (64 * 1024)   /* any UDP datagram fits */
#define TL_DGRAM_AREA_SIZE (TL_DGRAM_BATCH * TL_DGRAM_SLOT_SIZE)
/* One recv per readable event, as asyncio reads (SSLProtocol.max_size);
 * allocated once per loop, so above the mmap threshold costs nothing. */
#define TL_TLS_AREA_SIZE (256 * 1024)

/* What a loop has done, always kept (health.h; read by loop.c's
 * _diagnostics): counters, where the time went, and histograms.  Written by
 * the loop's thread only, with relaxed atomic stores (see health.h). */
typedef struct {
    uint64_t iterations, callbacks, io_events, polls, timers_fired, slow_callbacks;
    uint64_t poll_ns;           /* blocked in the poller */
    uint64_t run_ns;            /* the rest of each iteration */
    tl_hist iteration;          /* one iteration, the poller's sleep excluded */
    tl_hist poll;               /* one blocking poll */
    tl_hist lag;                /* scheduling lag: the oldest callback of a
                                   batch, from being queued to the batch */
    tl_hist lateness;           /* a timer: from its deadline to being queued */
    tl_hist callback;           /* one callback (only while timing is on) */
    /* Not reset: everything from here on (TL_HEALTH_RESET_SIZE). */
    int64_t since_ns;           /* the last reset (or the loop's creation) */
    int timing;                 /* time each callback */
    int64_t slow_ns;            /* report callbacks this long (0: off; on
                                   turns timing on) */
    int track_tasks;            /* per-task accounting (taskstats.c; on
                                   turns timing on) */
    /* Callback timing reads tl_ticks(); ns_per_tick comes from comparing
     * it with the monotonic clock since (cal_ns, cal_ticks), taken when
     * timing was turned on (0: not measured yet, callbacks read the clock). */
    double ns_per_tick;
    uint64_t tick_ns_fixed;     /* the same in 32.32 fixed point (0: not yet) */
    int64_t cal_ns;
    uint64_t cal_ticks;
} tl_health;

/* What _reset_diagnostics zeroes: the counters and histograms. */
#define TL_HEALTH_RESET_SIZE offsetof(tl_health, since_ns)

/* Is each callback timed (run_batch_timed)? */
static inline int
tl_health_timed(const tl_health *h)
{
    return h->timing || h->slow_ns || h->track_tasks;
}

/* Callback timing is being turned on: its tick rate is measured anew. */
static inline void
tl_health_start_timing(tl_health *h)
{
    if (tl_health_timed(h))
        return;
    h->ns_per_tick = 0;
    h->tick_ns_fixed = 0;
    h->cal_ns = tl_now_ns();
    h->cal_ticks = tl_ticks();
}

/* What an iteration records (loop.c run_once), one call per fact. */
static inline void
tl_health_slept(tl_health *h, int64_t ns)           /* a blocking poll */
{
    tl_hist_record(&h->poll, ns);
    tl_count(&h->poll_ns, (uint64_t)ns);
}

static inline void
tl_health_timer_fired(tl_health *h, double late_s)  /* a timer queued */
{
    tl_count(&h->timers_fired, 1);
    tl_hist_record(&h->lateness, (int64_t)(late_s * 1e9));
}

static inline void
tl_health_batch_lag(tl_health *h, size_t ntodo, int64_t start_ns,
                    int64_t first_ns)               /* a batch starts */
{
    if (ntodo && first_ns != 0)
        tl_hist_record(&h->lag, start_ns - first_ns);
}

static inline void
tl_health_ran(tl_health *h, int64_t ns)             /* an iteration's work */
{
    tl_hist_record(&h->iteration, ns);
    tl_count(&h->run_ns, (uint64_t)ns);
}

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
    int time_overridden;         /* a 'time' attribute set on the instance
                                    (mock.patch.object(loop, "time")) */
    unsigned long thread_id;     /* 0: not running */
    /* Held by the loop thread while a _ThreadSafeHandle's callback runs
     * (3.14; on free-threaded builds any handle call_soon_threadsafe()
     * made), so that its cancel()/cancelled() from another thread wait for
     * the callback to end. */
    PyThread_type_lock threadsafe_lock;
#if TL_FREE_THREADED
    /* What other threads schedule (call_soon_threadsafe, or a call_soon/
     * call_later from a thread not running the loop) waits here, under
     * inbox_lock, until the loop thread moves it to the ready queue or the
     * timer heap (loop.c: inbox_drain).  inbox_lock also orders `sleeping`
     * against those pushes and `closed` against the wakeup fd. */
    PyMutex inbox_lock;
    tl_ready_queue inbox;        /* strong references */
    tl_ready_queue inbox_taken;  /* the loop thread's: the inbox it took last
                                    (swapped, so no buffer is made per drain) */
    int inbox_draining;
#endif
    uint64_t fork_generation;

    tl_ready_queue ready;        /* strong references */
    tl_heap timers;              /* strong references to TimerHandles */
    uint64_t timer_seq;

    tl_fdentry *fds;             /* fdtable.c */
    size_t fds_cap;
    size_t fds_registered;
    size_t fds_internal;         /* how many of those are the loop's own */
    tl_poll_event *events;
    int events_cap;
    int *dirty_fds;              /* fds with a deferred interest change */
    size_t dirty_len, dirty_cap;

    tl_recvbuf recv;

    double clock_resolution;
    double slow_callback_duration;
    PyObject *current_handle;
    PyObject *run_ctx;           /* reusable Context for snapshot handles */
    PyObject *task_factory;
    PyObject *signal_handlers;   /* dict: signum -> Handle */
    PyObject *fileobjs;          /* dict: fd -> the non-int object add_reader/
                                    add_writer got, or NULL (fdtable.c) */
    PyObject *dict;
    PyObject *weakreflist;

    tl_health health;
    /* When the last batch of callbacks ended (its clock read), while no
     * system call came after it: a sleep that follows counts from then.
     * 0: read the clock. */
    int64_t ran_ns;
    struct tl_watchdog *watchdog;   /* watchdog.c: the stall watchdog, or NULL */
    /* taskstats.c: per-task accounting, or NULL (off); while a Task's
     * step runs, the time that eager tasks' first steps took inside it. */
    struct tl_task_table *tasks;
    int64_t eager_ns;
    int stall_flag;             /* set by the watchdog: a stall was seen */
    PyObject *not_task_type;    /* taskstats.c: the last callback __self__
                                   type seen not to be a Task (a cache) */
    pid_t os_tid;               /* the running thread's kernel id (watchdog.c) */
    PyThreadState *run_tstate;  /* the running thread's state (watchdog.c reads
                                   its frame with the GIL held), or NULL */
    int signals_unchecked;       /* a signal may have cut a blocking call
                                    short without its handler running (a
                                    partial send()): run_once checks before
                                    it sleeps (sockops.c, loop.c) */
    PyTypeObject *streams_cf_type;   /* streams.c: this loop's type, and its */
    unsigned int streams_cf_tag;     /* version tag, when its create_future
                                        was found to be the core's (borrowed:
                                        compared only, with the tag) */
};

/* ---- checks every entry point makes ---- */

static inline int
tl_check_closed(LoopObject *loop)
{
    if (TL_ATOMIC_GET(&loop->closed)) {       /* any thread may ask */
        PyErr_SetString(PyExc_RuntimeError, "Event loop is closed");
        return -1;
    }
    return 0;
}

/* Whether the calling thread may use the loop's single-threaded state (its
 * ready queue, timers, fd table): the loop runs in this thread, or runs in
 * none (then whoever calls it owns it, as with the stock loop).  Always 1
 * with a GIL. */
static inline int
tl_loop_owned_here(LoopObject *loop)
{
#if TL_FREE_THREADED
    unsigned long tid = __atomic_load_n(&loop->thread_id, __ATOMIC_ACQUIRE);
    return tid == 0 || tid == PyThread_get_thread_ident();
#else
    (void)loop;
    return 1;
#endif
}

static inline int
tl_loop_is_forked(LoopObject *loop)
{
    return loop->fork_generation != loop->state->fork_generation;
}

static inline int
tl_check_fork(LoopObject *loop)
{
    if (tl_loop_is_forked(loop)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this tideloop event loop was created before "
                        "os.fork() and cannot be used in the child process; "
                        "create a new event loop in the child");
        return -1;
    }
    return 0;
}

static inline tl_state *
tl_get_state_from_type(PyTypeObject *tp)
{
    return (tl_state *)PyType_GetModuleState(tp);
}

/* ---- what each file offers (lower files first; a file may call only the
 * files listed above it, see README.md) ---- */

/* recvbuf.c: receiving into the loop's shared areas. */
/* One read/recv of up to max (<= TL_SPARE_SIZE) bytes from fd: *data is the
 * bytes read (NULL on EOF or on a system error, whose errno is in *err;
 * *err is 0 otherwise).  small: the reader's hint, kept across its reads,
 * for those given back (tl_recv_give_back); NULL for a read whose bytes go
 * to the caller for good. */
int tl_recv_spare(tl_recvbuf *rb, int fd, size_t max, int use_read,
                  int *small, PyObject **data, int *err);
/* Releases data, a read tl_recv_spare gave: kept for the next read if
 * nothing else holds it. */
void tl_recv_give_back(tl_recvbuf *rb, PyObject *data);
char *tl_recv_dgram_area(tl_recvbuf *rb);   /* NULL: MemoryError */
char *tl_recv_tls_area(tl_recvbuf *rb);     /* NULL: MemoryError */
void tl_recvbuf_clear(tl_recvbuf *rb);

/* sockaddr.c: addresses and socket objects. */
struct sockaddr;
PyObject *tl_sockaddr_to_py(const struct sockaddr *sa, unsigned int len);
/* obj.fileno() as an int. */
int tl_call_fileno(tl_state *st, PyObject *obj, int *fd);
/* sock.family, .type, .proto and .fileno() (any of the pointers may be
 * NULL). */
int tl_sock_info(tl_state *st, PyObject *sock, int *fd, int *family,
                 int *type, int *proto);
/* A writable view of buf, refused in socket.recv_into()'s words. */
int tl_recv_into_buffer(PyObject *buf, Py_buffer *view);

/* handle.c: Handles, TimerHandles and how callbacks run. */
extern PyType_Spec tl_handle_spec;
extern PyType_Spec tl_timer_handle_spec;
extern PyType_Spec tl_threadsafe_handle_spec;
/* reusable: the handle may run more than once (readers, writers, signals),
 * so it gets a real Context copy whose changes persist between runs. */
HandleObject *tl_handle_new(tl_state *st, PyTypeObject *type, LoopObject *loop,
                            PyObject *callback, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *context, int reusable);
int tl_context_init(tl_state *st);
PyObject *tl_context_from_vars(PyObject *vars);
/* A context= argument the callbacks will run in: None or a
 * contextvars.Context (else TypeError, worded as 3.15's Task words it). */
int tl_check_context_arg(PyObject *context);
/* -1 only to propagate (SystemExit, KeyboardInterrupt, a failing report):
 * other errors of the callback go to the exception handler. */
int tl_handle_run(HandleObject *h);
int tl_handle_run_batched(HandleObject *h, int *entered);
void tl_batch_exit(LoopObject *loop, int *entered);
int tl_handle_cancel(HandleObject *h);
/* Drop the callback and its arguments (a handle another thread cancelled). */
void tl_handle_drop_call(HandleObject *h);
void tl_handle_free_list(tl_state *st);
/* Report the error raised by callback(*args) as asyncio's Handle._run
 * does (to loop.call_exception_handler); 0, or -1 for what must propagate. */
int tl_handle_report_error(HandleObject *h, PyObject *callback, PyObject *args);

/* iowatch.c: running the C io watchers (iowatch.h). */
/* Run a watcher's function in its context, with tl_handle_run's error
 * handling. */
int tl_io_run(LoopObject *loop, tl_io_watcher *w, int *entered);
/* A Handle standing for a watcher (debug mode, reports, _selector): it
 * calls the owner's method of that name in the watcher's context. */
HandleObject *tl_io_make_handle(LoopObject *loop, tl_io_watcher *w);
/* timing.c: the ready batch with each callback timed (diagnostics). */
int tl_run_batch_timed(LoopObject *loop, size_t ntodo, int64_t start_ns, int *entered);
void tl_calibrate_ticks(tl_health *health, int64_t now_ns);

/* fdtable.c: fd registrations. */
int tl_fd_from_object(PyObject *fileobj);   /* the fd, or -1 with an error */
/* h (not stolen) becomes fd's reader or writer; the one it replaces is
 * cancelled.  oneshot: the poller disarms the fd after one event (sock_*
 * waits: finishing costs no syscall, waiting again one). */
int tl_fd_add_handle(LoopObject *loop, int fd, int which, HandleObject *h,
                     int oneshot);
/* Arm w (its owner's fn) for fd; it runs in context (NULL: a copy of this
 * call's context, as asyncio's add_reader Handle takes one).  Armed again:
 * the new context, and an event already queued is dropped (as asyncio's
 * add_reader replaces its Handle). */
int tl_fd_watch(LoopObject *loop, int fd, int which, tl_io_watcher *w,
                PyObject *context);
/* Empty fd's reader or writer slot; *removed (may be NULL): there was one. */
int tl_fd_remove(LoopObject *loop, int fd, int which, int *removed);
int tl_fd_dispatch(LoopObject *loop, int fd, int mask);
void tl_fd_flush_dirty(LoopObject *loop);
int tl_fd_register_internal(LoopObject *loop, int fd, int kind);
void tl_fd_unregister_internal(LoopObject *loop, int fd);
void tl_fd_clear_all(LoopObject *loop);
int tl_fd_traverse(LoopObject *loop, visitproc visit, void *arg);
int tl_fd_set_transport(LoopObject *loop, int fd, tl_transport_head *t);
void tl_fd_clear_transport(LoopObject *loop, int fd, tl_transport_head *t);
int tl_fd_check_no_transport(LoopObject *loop, int fd);
extern const PyMethodDef tl_fd_loop_methods[];

/* loop.c: the Loop type, iteration, ready queue, timers. */
extern PyType_Spec tl_loop_spec;
/* call_soon(callback, *args, context=context); NULL: a copy of the
 * current context. */
int tl_loop_call_soon(LoopObject *loop, PyObject *callback,
                      PyObject *const *args, Py_ssize_t nargs,
                      PyObject *context);
PyObject *tl_loop_call_later(LoopObject *loop, double delay,
                             PyObject *callback);
PyObject *tl_loop_create_future(LoopObject *loop);
/* loop.call_exception_handler({message, exception, **pairs}); pairs are
 * (const char *key, PyObject *value) ending with NULL. */
int tl_loop_report(LoopObject *loop, const char *message, PyObject *exc, ...);

/* transport.c, stream.c, listener.c, dgram.c, pipe.c: see transport.h. */
/* sockops.c: sock_recv, sock_recv_into, sock_sendall, sock_accept. */
extern PyType_Spec tl_sockop_spec;
extern const PyMethodDef tl_sockop_loop_methods[];

/* streams.c: asyncio streams in C (the reader's feeding, its awaited reads,
 * the writer's writes and drain); module functions _streams_setup, ... */
extern PyType_Spec tl_stream_method_spec, tl_stream_op_spec, tl_stream_feeder_spec;
extern const PyMethodDef tl_streams_module_methods[];
int tl_streams_adopt(LoopObject *loop, PyObject *protocol, PyObject **cproto);
void tl_streams_free_list(tl_state *st);
int tl_streams_feed_app(LoopObject *loop, PyObject *protocol, const char *data, Py_ssize_t n);

/* tls.c: the C engine under asyncio's SSLProtocol; its module functions
 * (_tls_setup, _tls_prove, tls_route, set_tls_route, ...). */
extern PyType_Spec tl_tls_engine_spec;
extern const PyMethodDef tl_tls_module_methods[];

/* watchdog.c: the stall watchdog */
typedef struct tl_watchdog tl_watchdog;
void tl_watchdog_stop(LoopObject *loop);
int tl_stall_report(LoopObject *loop, PyObject *what, const char *io_name);
int tl_slow_report(LoopObject *loop, PyObject *what, const char *io_name, int64_t took_ns,
                   PyObject *task, PyObject *where);
extern const PyMethodDef tl_diag_loop_methods[];

/* taskstats.c: per-task CPU time, steps, age; tasks that finished with
 * nobody waiting (tideloop.diagnostics.track_tasks). */
void tl_tasks_step_done(LoopObject *loop, PyObject *task, int64_t took_ns, int64_t now_ns,
                        size_t queued);
void tl_tasks_created(LoopObject *loop, PyObject *task, int64_t created_ns, int64_t eager_ns,
                      int64_t inner_ns);
void tl_tasks_free(LoopObject *loop);
PyObject *tl_task_of_step(LoopObject *loop, PyObject *callback);
PyObject *tl_task_where(tl_state *st, PyObject *task);
extern const PyMethodDef tl_tasks_loop_methods[];
extern const PyMethodDef tl_diag_module_methods[];

#endif
