/* The transports' shared object layout and machinery (transport.c).
 *
 * Every transport starts with TransportObject: registration, the write
 * queue, flow control, closing, extra info and the GC plumbing are written
 * once.  Where asyncio's transport classes differ, the type's ops table
 * (tl_transport_ops) says how; datagram and pipe transports add their own
 * fields after the shared ones.  The types: stream.c (TCP and Unix
 * sockets), dgram.c (UDP and Unix datagrams), pipe.c (the two ends of a
 * pipe); listener.c accepts connections for servers. */
#ifndef TIDELOOP_TRANSPORT_H
#define TIDELOOP_TRANSPORT_H

#include "internal.h"

#include <netinet/in.h>

#include <structmember.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define LOG_THRESHOLD_FOR_CONNLOST_WRITES 5
#define TL_WRITEV_MAX 64

typedef struct TransportObject TransportObject;

/* A protocol written in C that a stream transport feeds directly (tls.c's
 * engine, standing for an asyncio SSLProtocol; streams.c's feeder, for a
 * StreamReaderProtocol): the bytes just received, in the loop's TLS area,
 * as protocol.buffer_updated() or data_received() would get them. */
typedef struct tl_cproto tl_cproto;
struct tl_cproto {
    PyObject_HEAD
    int (*feed)(tl_cproto *self, const char *buf, Py_ssize_t n);
    const char *feed_error;      /* the fatal error's message when feed fails */
    /* After protocol.connection_lost(): drop the references that make
     * cycles with the protocol (cannot fail; errors are cleared). */
    void (*detach)(tl_cproto *self);
};

/* What differs between the transport types. */
typedef struct {
    tl_io_fn read_ready;         /* the reader (write pipes: the peer
                                    closing shows as readable) */
    tl_io_fn write_ready;        /* the writer; NULL: never writes */
    /* After a fatal error: asyncio's _force_close(exc) for sockets, the
     * pipes' _close(exc). */
    int (*close_after_error)(TransportObject *self, PyObject *exc);
    int quiet_errno;             /* a fatal OSError is only logged (debug
                                    mode) -- any (0) or only this errno */
    int is_socket;               /* socket/sockname/peername extra info; the
                                    fd is refused to add_reader */
    int unusable_buffer_loses;   /* write pipes: a write of a buffer that
                                    cannot be used counts as a lost write */
    /* The type's own fields (NULL: none). */
    int (*traverse)(TransportObject *self, visitproc visit, void *arg);
    void (*clear)(TransportObject *self);
} tl_transport_ops;

/* Shared methods and attributes, for the types' tables. */
#define TL_TR_BASE_METHODS \
    {"is_closing", (PyCFunction)tl_tr_is_closing_meth, METH_NOARGS, NULL}, \
    {"get_extra_info", (PyCFunction)(void (*)(void))tl_tr_get_extra_info, \
     METH_FASTCALL | METH_KEYWORDS, NULL}, \
    {"get_protocol", (PyCFunction)tl_tr_get_protocol, METH_NOARGS, NULL}, \
    {"set_protocol", (PyCFunction)tl_tr_set_protocol, METH_O, NULL}, \
    {"_call_connection_lost", (PyCFunction)tl_tr_call_connection_lost, METH_O, \
     NULL}
#define TL_TR_READ_METHODS \
    {"is_reading", (PyCFunction)tl_tr_is_reading_meth, METH_NOARGS, NULL}, \
    {"pause_reading", (PyCFunction)tl_tr_pause_reading, METH_NOARGS, NULL}, \
    {"_read_ready", (PyCFunction)tl_tr_read_ready_meth, METH_NOARGS, NULL}, \
    {"_start_reading", (PyCFunction)tl_tr_start_reading, METH_NOARGS, NULL}
#define TL_TR_WRITE_METHODS \
    {"get_write_buffer_size", (PyCFunction)tl_tr_get_write_buffer_size, \
     METH_NOARGS, NULL}, \
    {"get_write_buffer_limits", (PyCFunction)tl_tr_get_write_buffer_limits, \
     METH_NOARGS, NULL}, \
    {"set_write_buffer_limits", \
     (PyCFunction)(void (*)(void))tl_tr_set_write_buffer_limits, \
     METH_VARARGS | METH_KEYWORDS, NULL}, \
    {"_write_ready", (PyCFunction)tl_tr_write_ready_meth, METH_NOARGS, NULL}
#define TL_TR_SOCKET_METHODS \
    {"close", (PyCFunction)tl_tr_close, METH_NOARGS, NULL}, \
    {"abort", (PyCFunction)tl_tr_abort, METH_NOARGS, NULL}, \
    {"_force_close", (PyCFunction)tl_tr_force_close_meth, METH_O, NULL}
#define TL_TR_BASE_GETSET \
    {"_loop", (getter)tl_tr_get_loop_attr, NULL, NULL, NULL}, \
    {"_closing", (getter)tl_tr_get_closing_attr, NULL, NULL, NULL}, \
    {"_paused", (getter)tl_tr_get_paused_attr, NULL, NULL, NULL}, \
    {"_conn_lost", (getter)tl_tr_get_conn_lost, NULL, NULL, NULL}, \
    {"_protocol", (getter)tl_tr_get_protocol, NULL, NULL, NULL}, \
    {"_protocol_paused", (getter)tl_tr_get_protocol_paused, NULL, NULL, NULL}
#define TL_TR_SOCKET_GETSET \
    {"_sock_fd", (getter)tl_tr_get_fd_attr, NULL, NULL, NULL}, \
    {"_buffer_size", (getter)tl_tr_get_buffer_size_attr, NULL, NULL, NULL}

/* The transport types share their GC plumbing; each brings its repr,
 * methods, attributes and doc. */
#define TL_TR_SLOTS(repr, methods, getset, doc) \
    {Py_tp_dealloc, tl_tr_dealloc}, \
    {Py_tp_finalize, tl_tr_finalize}, \
    {Py_tp_traverse, tl_tr_traverse}, \
    {Py_tp_clear, tl_tr_clear}, \
    {Py_tp_members, tl_tr_members}, \
    {Py_tp_repr, repr}, \
    {Py_tp_methods, methods}, \
    {Py_tp_getset, getset}, \
    {Py_tp_doc, doc}, \
    {0, NULL}
/* Not Py_TPFLAGS_IMMUTABLETYPE: the bases are asyncio's (mutable) Python
 * classes, and 3.14 refuses an immutable type over a mutable base (3.12 and
 * 3.13 warn). */
#define TL_TR_SPEC(tpname, objtype, slots_) { \
    .name = tpname, \
    .basicsize = sizeof(objtype), \
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | \
             Py_TPFLAGS_DISALLOW_INSTANTIATION, \
    .slots = slots_, \
}

typedef struct {
    PyObject *obj;          /* bytes object owning the data */
    const char *data;
    Py_ssize_t len;
    PyObject *addr;         /* datagrams: the destination (NULL: none) */
} wchunk;

/* A socket address as accept()/getsockname() gave it: IPv4 and IPv6 ones
 * (what nearly every connection has) inline, anything longer (a Unix path)
 * on the heap -- a sockaddr_storage in every transport, twice, was 256
 * bytes of each idle connection. */
typedef struct {
    socklen_t len;              /* 0: none */
    union {
        struct sockaddr sa;
        struct sockaddr_in in4;
        struct sockaddr_in6 in6;
    } in;                       /* len <= sizeof(in) */
    struct sockaddr *big;       /* len > sizeof(in): PyMem_Malloc'd */
} tl_rawaddr;

static inline const struct sockaddr *
tl_rawaddr_sa(const tl_rawaddr *a)
{
    return a->big != NULL ? a->big : &a->in.sa;
}

/* Keep (sa, len); 0, or -1 with MemoryError. */
int tl_rawaddr_set(tl_rawaddr *a, const struct sockaddr *sa, socklen_t len);
void tl_rawaddr_clear(tl_rawaddr *a);

struct TransportObject {
    tl_transport_head head;     /* PyObject_HEAD + closing */
    LoopObject *loop;
    const tl_transport_ops *ops;
    int fd;                     /* -1 once the socket is closed */
    int family;
    int type;
    int proto;
    PyObject *sock;             /* socket.socket, created lazily if we got an
                                   fd; pipes: the pipe object */
    PyObject *protocol;
    tl_cproto *cproto;          /* stream transports: protocol's C engine */
    int buffered;               /* a BufferedProtocol */
    int protocol_connected;
    PyObject *server;
    PyObject *context;          /* 3.15+: the connection's Context, which
                                   every protocol callback runs in; NULL: a
                                   copy of the current one per callback */
    PyObject *empty_waiter;     /* sendfile: set when the queue drains */
    tl_io_watcher reader, writer;
    PyObject *sockname;         /* converted lazily from the raw addresses */
    PyObject *peername;
    PyObject *transport_socket;

    wchunk *wq;
    size_t wq_head, wq_len, wq_cap;
    Py_ssize_t wq_off;          /* bytes of the first chunk already sent */
    Py_ssize_t buffer_size;
    double high_water, low_water;   /* compared with buffer_size */
    PyObject *limits;           /* (low, high) as given, or NULL: defaults */

    int conn_lost;
    int paused;                 /* pause_reading() */
    int eof;                    /* write_eof() */
    int protocol_paused;        /* pause_writing() was called */
    int watching;               /* TL_POLL_READ | TL_POLL_WRITE registered */
    int small_reads;            /* the last read was of a size the loop keeps
                                   (recvbuf.c: the next one goes straight
                                   into the kept bytes) */

    tl_rawaddr local_addr, peer_addr;

    PyObject *dict;             /* instance attributes (tests patch methods) */
    PyObject *weakreflist;
};

#define tl_tr_add_reader(self) tl_tr_watch((self), TL_POLL_READ, 1)
#define tl_tr_remove_reader(self) tl_tr_watch((self), TL_POLL_READ, 0)
#define tl_tr_add_writer(self) tl_tr_watch((self), TL_POLL_WRITE, 1)
#define tl_tr_remove_writer(self) tl_tr_watch((self), TL_POLL_WRITE, 0)

/* A new transport of type tp for fd (and its socket or pipe object, when
 * there is one).  Schedules connection_made, the start of reading and the
 * waiter, as asyncio does.  On failure the fd stays with the caller. */
TransportObject *tl_tr_create(LoopObject *loop, PyTypeObject *tp,
                              const tl_transport_ops *ops, int fd,
                              PyObject *sock, int family, int type, int proto,
                              PyObject *protocol, PyObject *waiter,
                              PyObject *extra, PyObject *server,
                              const struct sockaddr *peer, socklen_t peer_len,
                              PyObject *context);

int tl_tr_is_reading(TransportObject *self);
void tl_tr_close_socket(TransportObject *self);
int tl_tr_watch(TransportObject *self, int which, int on);
/* The write queue: bytes are referenced, anything else copied. */
void tl_wq_clear(TransportObject *self);
int tl_wq_push(TransportObject *self, PyObject *obj, const char *data,
               Py_ssize_t len);
void tl_wq_consume(TransportObject *self, Py_ssize_t n);
void tl_wq_pop(TransportObject *self);
int tl_wq_iov(TransportObject *self, struct iovec *iov);
int tl_tr_is_fatal_base_exception(void);
/* asyncio's _fatal_error(exc, message). */
int tl_tr_fatal_error(TransportObject *self, PyObject *exc, const char *message);
/* After a failed call: SystemExit/KeyboardInterrupt propagate (-1), anything
 * else goes to tl_tr_fatal_error. */
int tl_tr_fail(TransportObject *self, const char *message);
/* tl_tr_fatal_error for the system error errno (an OSError). */
int tl_tr_fatal_errno(TransportObject *self, int err, const char *message);
int tl_tr_maybe_pause_protocol(TransportObject *self);
int tl_tr_maybe_resume_protocol(TransportObject *self);
int tl_tr_schedule_connection_lost(TransportObject *self, PyObject *exc);
int tl_tr_force_close(TransportObject *self, PyObject *exc);
/* protocol.connection_lost(exc), then the socket closed and the server
 * told; the protocol's result is dropped. */
int tl_tr_connection_lost(TransportObject *self, PyObject *exc);
/* A written object must be bytes, bytearray or memoryview (message prefix
 * from tideloop._compat). */
int tl_tr_check_writable_data(PyObject *prefix, PyObject *data);
/* A write of a buffer that cannot be used (PyObject_GetBuffer failed with a
 * BufferError): *lost is set when the connection was lost already (the
 * caller counts the write). */
int tl_tr_unusable_buffer(TransportObject *self, const char *fatal_message,
                          const char *queued_message, int *lost);
/* A write to a lost connection: counted, with asyncio's warning (its text
 * for the type) once the count is high. */
int tl_tr_count_lost_write(TransportObject *self, const char *warning);
int tl_tr_debug_log(TransportObject *self, const char *fmt);

/* Methods and getters the types share (through the tables above). */
PyObject *tl_tr_call_connection_lost(TransportObject *self, PyObject *exc);
PyObject *tl_tr_close(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_abort(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_force_close_meth(TransportObject *self, PyObject *exc);
PyObject *tl_tr_is_closing_meth(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_is_reading_meth(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_pause_reading(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_resume_reading(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_start_reading(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_read_ready_meth(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_write_ready_meth(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_get_write_buffer_size(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_get_write_buffer_limits(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_set_write_buffer_limits(TransportObject *self, PyObject *args, PyObject *kwds);
PyObject *tl_tr_set_protocol(TransportObject *self, PyObject *protocol);
PyObject *tl_tr_get_protocol(TransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_get_extra_info(TransportObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *tl_tr_repr(TransportObject *self);
PyObject *tl_tr_get_sock_attr(TransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_fd_attr(TransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_loop_attr(TransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_conn_lost(TransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_closing_attr(TransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_paused_attr(TransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_protocol_paused(TransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_buffer_size_attr(TransportObject *self, void *Py_UNUSED(c));
int tl_tr_traverse(TransportObject *self, visitproc visit, void *arg);
int tl_tr_clear(TransportObject *self);
void tl_tr_finalize(TransportObject *self);
void tl_tr_dealloc(TransportObject *self);
extern PyMemberDef tl_tr_members[];

/* The types and the Loop methods that make them (module.c adds those to the
 * Loop type). */
extern PyType_Spec tl_socket_transport_spec;          /* stream.c */
extern const PyMethodDef tl_stream_loop_methods[];
/* A stream transport for fd (TCP_NODELAY set as asyncio sets it). */
/* transport.write() of len bytes at buf, from C (tls.c). */
int tl_stream_write_buf(TransportObject *self, const char *buf, Py_ssize_t len);
TransportObject *tl_stream_new(LoopObject *loop, int fd, PyObject *sock,
                               int family, int type, int proto,
                               PyObject *protocol, PyObject *waiter,
                               PyObject *extra, PyObject *server,
                               const struct sockaddr *peer, socklen_t peer_len,
                               PyObject *context);
extern PyType_Spec tl_listener_spec;                  /* listener.c */
extern const PyMethodDef tl_listener_loop_methods[];
extern PyType_Spec tl_datagram_transport_spec;        /* dgram.c */
extern const PyMethodDef tl_dgram_loop_methods[];
extern PyType_Spec tl_read_pipe_transport_spec;       /* pipe.c */
extern PyType_Spec tl_write_pipe_transport_spec;
extern const PyMethodDef tl_pipe_loop_methods[];

#endif
