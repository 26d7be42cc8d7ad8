/* The transports' shared object layout and machinery.
 *
 * One struct serves four types -- stream sockets (stream.c), datagram
 * sockets (dgram.c), and the read and write ends of pipes (pipe.c) -- so
 * registration, the write queue, flow control, closing, extra info and the
 * GC plumbing are written once.  `kind` says which behaviour applies where
 * asyncio's classes differ. */
#ifndef TIDELOOP_TRANSPORT_H
#define TIDELOOP_TRANSPORT_H

#include "internal.h"

#include <structmember.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define LOG_THRESHOLD_FOR_CONNLOST_WRITES 5
#define TL_WRITEV_MAX 64

/* The four transport types share their layout and GC plumbing; each brings
 * its repr, methods, attributes and doc. */
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
#define TL_TR_SPEC(tpname, slots_) { \
    .name = tpname, \
    .basicsize = sizeof(SocketTransportObject), \
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | \
             Py_TPFLAGS_DISALLOW_INSTANTIATION, \
    .slots = slots_, \
}

enum {
    TL_TR_STREAM = 0,
    TL_TR_DGRAM,
    TL_TR_READ_PIPE,
    TL_TR_WRITE_PIPE,
};

typedef struct {
    PyObject *obj;          /* bytes object owning the data */
    const char *data;
    Py_ssize_t len;
    PyObject *addr;         /* datagrams: the destination (NULL: none) */
} wchunk;

typedef struct {
    tl_transport_head head;     /* PyObject_HEAD + closing */
    LoopObject *loop;
    int kind;                   /* TL_TR_* */
    int fd;                     /* -1 once the socket is closed */
    int family;
    int type;
    int proto;
    PyObject *sock;             /* socket.socket, created lazily if we got an
                                   fd; pipes: the pipe object */
    PyObject *protocol;
    int buffered;
    int protocol_connected;
    PyObject *server;
    PyObject *read_ready;       /* bound self._read_ready, the reader callback */
    PyObject *write_ready;
    PyObject *empty_waiter;
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
    int lost_scheduled;         /* pipes: connection_lost is on its way */
    int pipe_watch_peer;        /* write pipes: the peer closing is visible */
    int paused;                 /* pause_reading() */
    int eof;                    /* write_eof() */
    int protocol_paused;        /* pause_writing() was called */
    int watching;               /* TL_POLL_READ | TL_POLL_WRITE registered */

    struct sockaddr_storage local_addr, peer_addr;
    socklen_t local_len, peer_len;

    /* datagrams */
    PyObject *address;          /* remote_addr given at creation, or NULL */
    PyObject *pending;          /* datagrams received in a batch but not
                                   delivered (reading paused meanwhile):
                                   a list of (data, addr) */
    PyObject *last_from;        /* the last source address handed out ... */
    struct sockaddr_storage last_from_sa;   /* ... and its raw form */
    socklen_t last_from_len;

    PyObject *dict;             /* instance attributes (tests patch methods) */
    PyObject *weakreflist;
} SocketTransportObject;

#define tl_tr_add_reader(self) tl_tr_watch((self), TL_POLL_READ, 1)
#define tl_tr_remove_reader(self) tl_tr_watch((self), TL_POLL_READ, 0)
#define tl_tr_add_writer(self) tl_tr_watch((self), TL_POLL_WRITE, 1)
#define tl_tr_remove_writer(self) tl_tr_watch((self), TL_POLL_WRITE, 0)

int tl_tr_is_reading(SocketTransportObject *self);
void tl_tr_close_socket(SocketTransportObject *self);
int tl_tr_watch(SocketTransportObject *self, int which, int on);
void tl_wq_clear(SocketTransportObject *self);
int tl_wq_push(SocketTransportObject *self, PyObject *obj, const char *data, Py_ssize_t len);
void tl_wq_consume(SocketTransportObject *self, Py_ssize_t n);
void tl_wq_pop(SocketTransportObject *self);
int tl_wq_iov(SocketTransportObject *self, struct iovec *iov);
int tl_tr_is_fatal_base_exception(void);
PyObject *tl_tr_fetch_exception(void);
int tl_tr_fatal_error(SocketTransportObject *self, PyObject *exc, const char *message);
int tl_tr_fail(SocketTransportObject *self, const char *message);
int tl_tr_maybe_pause_protocol(SocketTransportObject *self);
int tl_tr_maybe_resume_protocol(SocketTransportObject *self);
int tl_tr_schedule_connection_lost(SocketTransportObject *self, PyObject *exc);
int tl_tr_force_close(SocketTransportObject *self, PyObject *exc);
PyObject *tl_tr_call_connection_lost(SocketTransportObject *self, PyObject *exc);
PyObject *tl_tr_os_error(void);
int tl_tr_check_writable_data(PyObject *prefix, PyObject *data);
PyObject *tl_tr_close(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_abort(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_force_close_meth(SocketTransportObject *self, PyObject *exc);
PyObject *tl_tr_is_closing_meth(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_is_reading_meth(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
int tl_tr_debug_log(SocketTransportObject *self, const char *fmt);
PyObject *tl_tr_pause_reading(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_resume_reading(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_start_reading(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_get_write_buffer_size(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_get_write_buffer_limits(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_set_write_buffer_limits(SocketTransportObject *self, PyObject *args, PyObject *kwds);
PyObject *tl_tr_set_protocol(SocketTransportObject *self, PyObject *protocol);
PyObject *tl_tr_get_protocol(SocketTransportObject *self, PyObject *Py_UNUSED(ignored));
PyObject *tl_tr_extra_value(SocketTransportObject *self, const char *name);
PyObject *tl_tr_get_extra_info(SocketTransportObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *tl_tr_repr(SocketTransportObject *self);
PyObject *tl_tr_get_sock_attr(SocketTransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_fd_attr(SocketTransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_loop_attr(SocketTransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_conn_lost(SocketTransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_closing_attr(SocketTransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_paused_attr(SocketTransportObject *self, void *Py_UNUSED(c));
PyObject *tl_tr_get_protocol_paused(SocketTransportObject *self, void *Py_UNUSED(c));
SocketTransportObject *tl_tr_create(LoopObject *loop, PyTypeObject *tp, int kind, int fd, PyObject *sock, int family, int type, int proto, PyObject *protocol, PyObject *waiter, PyObject *extra, PyObject *server, const struct sockaddr *peer, socklen_t peer_len);
int tl_tr_traverse(SocketTransportObject *self, visitproc visit, void *arg);
int tl_tr_clear(SocketTransportObject *self);
void tl_tr_finalize(SocketTransportObject *self);
void tl_tr_dealloc(SocketTransportObject *self);

extern PyMemberDef tl_tr_members[];

/* pipe.c, dgram.c */
int tl_pipe_close(SocketTransportObject *self, PyObject *exc);
int tl_tr_unusable_buffer(SocketTransportObject *self, const char *fatal_message,
                          const char *queued_message);
PyObject *tl_loop_make_read_pipe_transport(PyObject *loop, PyObject *args, PyObject *kwds);
PyObject *tl_loop_make_write_pipe_transport(PyObject *loop, PyObject *args, PyObject *kwds);
PyObject *tl_loop_make_datagram_transport(PyObject *loop, PyObject *args, PyObject *kwds);
extern PyType_Spec tl_read_pipe_transport_spec;
extern PyType_Spec tl_write_pipe_transport_spec;
extern PyType_Spec tl_datagram_transport_spec;

#endif
