/* Module init, module state, type registration. */
#include "transport.h"

#include <structmember.h>

static int
import_attr(PyObject **out, const char *module, const char *attr)
{
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL)
        return -1;
    *out = PyObject_GetAttrString(m, attr);
    Py_DECREF(m);
    return *out == NULL ? -1 : 0;
}

static int
intern(PyObject **out, const char *s)
{
    *out = PyUnicode_InternFromString(s);
    return *out == NULL ? -1 : 0;
}

static PyObject *
after_fork_child(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    tl_state *st = PyModule_GetState(module);
    st->fork_generation++;
    Py_RETURN_NONE;
}

/* Installed with signal.signal() for signals that have a loop handler: the
 * interpreter's C handler writes the number to the wakeup fd, the loop reads
 * it there; the Python-level handler has nothing left to do. */
static PyObject *
sighandler_noop(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    (void)args;
    (void)nargs;
    Py_RETURN_NONE;
}

/* asyncio's _FlowControlMixin (a Transport), when its layout is the one
 * tl_transport_head mirrors; else None, and the transports stand alone. */
static PyObject *
transport_base_class(void)
{
    PyObject *base = NULL, *bt = NULL, *descr = NULL;
    if (import_attr(&base, "asyncio.transports", "_FlowControlMixin") < 0 ||
        import_attr(&bt, "asyncio", "BaseTransport") < 0)
        goto fail;
    descr = PyObject_GetAttrString(bt, "__dict__");
    PyObject *member = descr ? PyMapping_GetItemString(descr, "_extra") : NULL;
    Py_XDECREF(descr);
    if (member == NULL)
        goto fail;
    int ok = Py_IS_TYPE(member, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)member)->d_member->offset ==
                 (Py_ssize_t)offsetof(tl_transport_head, extra) &&
             ((PyTypeObject *)base)->tp_basicsize ==
                 (Py_ssize_t)offsetof(tl_transport_head, closing) &&
             ((PyTypeObject *)base)->tp_dictoffset == 0;
    Py_DECREF(member);
    Py_DECREF(bt);
    if (!ok) {
        Py_DECREF(base);
        Py_RETURN_NONE;
    }
    return base;
fail:
    Py_XDECREF(base);
    Py_XDECREF(bt);
    return NULL;
}

static int
core_exec(PyObject *m)
{
    tl_state *st = PyModule_GetState(m);

    st->HandleType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_handle_spec, NULL);
    if (st->HandleType == NULL)
        return -1;
    st->TimerHandleType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_timer_handle_spec, (PyObject *)st->HandleType);
    if (st->TimerHandleType == NULL)
        return -1;
    st->LoopType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_loop_spec, NULL);
    if (st->LoopType == NULL)
        return -1;
    PyObject *transport_base = transport_base_class();
    if (transport_base == NULL)
        return -1;
    st->SocketTransportType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_socket_transport_spec,
        transport_base == Py_None ? NULL : transport_base);
    st->WritePipeTransportType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_write_pipe_transport_spec,
        transport_base == Py_None ? NULL : transport_base);
    /* The read end is a ReadTransport, datagrams also a DatagramTransport
     * (as in asyncio 3.12+), when the layout check above passed. */
    PyObject *read_base = NULL, *dgram_bases = NULL;
    if (transport_base != Py_None) {
        PyObject *dt = NULL;
        if (import_attr(&read_base, "asyncio", "ReadTransport") < 0 ||
            import_attr(&dt, "asyncio", "DatagramTransport") < 0) {
            Py_XDECREF(read_base);
            Py_DECREF(transport_base);
            return -1;
        }
        dgram_bases = PyTuple_Pack(2, transport_base, dt);
        Py_DECREF(dt);
        if (dgram_bases == NULL) {
            Py_DECREF(read_base);
            Py_DECREF(transport_base);
            return -1;
        }
    }
    st->ReadPipeTransportType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_read_pipe_transport_spec, read_base);
    st->DatagramTransportType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_datagram_transport_spec, dgram_bases);
    Py_XDECREF(read_base);
    Py_XDECREF(dgram_bases);
    Py_DECREF(transport_base);
    if (st->SocketTransportType == NULL || st->WritePipeTransportType == NULL ||
        st->ReadPipeTransportType == NULL || st->DatagramTransportType == NULL)
        return -1;
    st->ListenerType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_listener_spec, NULL);
    if (st->ListenerType == NULL)
        return -1;
    st->SockOpType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_sockop_spec, NULL);
    if (st->SockOpType == NULL)
        return -1;
    if (PyModule_AddType(m, st->HandleType) < 0 ||
        PyModule_AddType(m, st->TimerHandleType) < 0 ||
        PyModule_AddType(m, st->LoopType) < 0 ||
        PyModule_AddType(m, st->SocketTransportType) < 0 ||
        PyModule_AddType(m, st->DatagramTransportType) < 0 ||
        PyModule_AddType(m, st->ReadPipeTransportType) < 0 ||
        PyModule_AddType(m, st->WritePipeTransportType) < 0 ||
        PyModule_AddType(m, st->ListenerType) < 0)
        return -1;

    if (import_attr(&st->Future, "asyncio", "Future") < 0 ||
        import_attr(&st->Task, "asyncio", "Task") < 0 ||
        (st->events_module = PyImport_ImportModule("asyncio.events")) == NULL ||
        import_attr(&st->set_task_name, "asyncio.tasks", "_set_task_name") < 0 ||
        import_attr(&st->format_callback_source, "asyncio.format_helpers",
                    "_format_callback_source") < 0 ||
        import_attr(&st->extract_stack, "asyncio.format_helpers",
                    "extract_stack") < 0 ||
        import_attr(&st->iscoroutine, "asyncio.coroutines", "iscoroutine") < 0 ||
        import_attr(&st->iscoroutinefunction, "asyncio.coroutines",
                    "iscoroutinefunction") < 0 ||
        import_attr(&st->logger, "asyncio.log", "logger") < 0 ||
        import_attr(&st->format_handle, "asyncio.base_events",
                    "_format_handle") < 0 ||
        import_attr(&st->get_asyncgen_hooks, "sys", "get_asyncgen_hooks") < 0 ||
        import_attr(&st->set_asyncgen_hooks, "sys", "set_asyncgen_hooks") < 0 ||
        import_attr(&st->BufferedProtocol, "asyncio", "BufferedProtocol") < 0 ||
        import_attr(&st->TransportSocket, "asyncio.trsock", "TransportSocket") < 0 ||
        import_attr(&st->socket_socket, "socket", "socket") < 0 ||
        import_attr(&st->set_result_unless_cancelled, "asyncio.futures",
                    "_set_result_unless_cancelled") < 0)
        return -1;
    PyObject *mode = NULL;
    if (import_attr(&mode, "asyncio.constants", "_SendfileMode") < 0)
        return -1;
    st->sendfile_try_native = PyObject_GetAttrString(mode, "TRY_NATIVE");
    Py_DECREF(mode);
    if (st->sendfile_try_native == NULL)
        return -1;

    if (intern(&st->str_context, "context") < 0 ||
        intern(&st->str_name, "name") < 0 ||
        intern(&st->str_call_exception_handler, "call_exception_handler") < 0 ||
        intern(&st->str_message, "message") < 0 ||
        intern(&st->str_exception, "exception") < 0 ||
        intern(&st->str_handle, "handle") < 0 ||
        intern(&st->str_source_traceback, "source_traceback") < 0 ||
        intern(&st->str_firstiter, "firstiter") < 0 ||
        intern(&st->str_finalizer, "finalizer") < 0 ||
        intern(&st->str_asyncgen_firstiter_hook, "_asyncgen_firstiter_hook") < 0 ||
        intern(&st->str_asyncgen_finalizer_hook, "_asyncgen_finalizer_hook") < 0 ||
        intern(&st->str_set_coroutine_origin_tracking,
               "_set_coroutine_origin_tracking") < 0 ||
        intern(&st->str_remove_signal_handler, "remove_signal_handler") < 0 ||
        intern(&st->str_set_running_loop, "_set_running_loop") < 0 ||
        intern(&st->str_data_received, "data_received") < 0 ||
        intern(&st->str_datagram_received, "datagram_received") < 0 ||
        intern(&st->str_done, "done") < 0 ||
        intern(&st->str_fileno, "fileno") < 0 ||
        intern(&st->str_result, "result") < 0 ||
        intern(&st->str_set_result, "set_result") < 0 ||
        intern(&st->str_set_exception, "set_exception") < 0 ||
        intern(&st->str_future_blocking, "_asyncio_future_blocking") < 0 ||
        intern(&st->str_get_buffer, "get_buffer") < 0 ||
        intern(&st->str_buffer_updated, "buffer_updated") < 0 ||
        intern(&st->str_get_running_loop, "_get_running_loop") < 0)
        return -1;
    PyObject *loop_str = PyUnicode_InternFromString("loop");
    if (loop_str == NULL)
        return -1;
    st->kw_loop = PyTuple_Pack(1, loop_str);
    Py_DECREF(loop_str);
    if (st->kw_loop == NULL)
        return -1;
    if (PyModule_AddStringConstant(m, "poller_backend", tl_poller_name()) < 0)
        return -1;
    if (tl_context_init(st) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "context_snapshots", st->fast_context) < 0)
        return -1;
    return 0;
}

static int
core_traverse(PyObject *m, visitproc visit, void *arg)
{
    tl_state *st = PyModule_GetState(m);
    if (st == NULL)
        return 0;
    Py_VISIT(st->LoopType);
    Py_VISIT(st->HandleType);
    Py_VISIT(st->TimerHandleType);
    Py_VISIT(st->SocketTransportType);
    Py_VISIT(st->DatagramTransportType);
    Py_VISIT(st->ReadPipeTransportType);
    Py_VISIT(st->WritePipeTransportType);
    Py_VISIT(st->ListenerType);
    Py_VISIT(st->SockOpType);
    Py_VISIT(st->BufferedProtocol);
    Py_VISIT(st->TransportSocket);
    Py_VISIT(st->socket_socket);
    Py_VISIT(st->SSLSocket);
    Py_VISIT(st->set_result_unless_cancelled);
    Py_VISIT(st->sendfile_try_native);
    Py_VISIT(st->Future);
    Py_VISIT(st->Task);
    Py_VISIT(st->events_module);
    Py_VISIT(st->set_task_name);
    Py_VISIT(st->format_callback_source);
    Py_VISIT(st->extract_stack);
    Py_VISIT(st->iscoroutine);
    Py_VISIT(st->iscoroutinefunction);
    Py_VISIT(st->logger);
    Py_VISIT(st->format_handle);
    Py_VISIT(st->get_asyncgen_hooks);
    Py_VISIT(st->set_asyncgen_hooks);
    Py_VISIT(st->empty_vars);
    return 0;
}

static int
core_clear(PyObject *m)
{
    tl_state *st = PyModule_GetState(m);
    if (st == NULL)
        return 0;
    Py_CLEAR(st->LoopType);
    Py_CLEAR(st->HandleType);
    Py_CLEAR(st->TimerHandleType);
    Py_CLEAR(st->SocketTransportType);
    Py_CLEAR(st->DatagramTransportType);
    Py_CLEAR(st->ReadPipeTransportType);
    Py_CLEAR(st->WritePipeTransportType);
    Py_CLEAR(st->ListenerType);
    Py_CLEAR(st->SockOpType);
    Py_CLEAR(st->BufferedProtocol);
    Py_CLEAR(st->TransportSocket);
    Py_CLEAR(st->socket_socket);
    Py_CLEAR(st->SSLSocket);
    Py_CLEAR(st->set_result_unless_cancelled);
    Py_CLEAR(st->sendfile_try_native);
    Py_CLEAR(st->Future);
    Py_CLEAR(st->Task);
    Py_CLEAR(st->events_module);
    Py_CLEAR(st->set_task_name);
    Py_CLEAR(st->format_callback_source);
    Py_CLEAR(st->extract_stack);
    Py_CLEAR(st->iscoroutine);
    Py_CLEAR(st->iscoroutinefunction);
    Py_CLEAR(st->logger);
    Py_CLEAR(st->format_handle);
    Py_CLEAR(st->get_asyncgen_hooks);
    Py_CLEAR(st->set_asyncgen_hooks);
    Py_CLEAR(st->kw_loop);
    Py_CLEAR(st->empty_vars);
    Py_CLEAR(st->str_context);
    Py_CLEAR(st->str_name);
    Py_CLEAR(st->str_call_exception_handler);
    Py_CLEAR(st->str_message);
    Py_CLEAR(st->str_exception);
    Py_CLEAR(st->str_handle);
    Py_CLEAR(st->str_source_traceback);
    Py_CLEAR(st->str_firstiter);
    Py_CLEAR(st->str_finalizer);
    Py_CLEAR(st->str_asyncgen_firstiter_hook);
    Py_CLEAR(st->str_asyncgen_finalizer_hook);
    Py_CLEAR(st->str_set_coroutine_origin_tracking);
    Py_CLEAR(st->str_remove_signal_handler);
    Py_CLEAR(st->str_set_running_loop);
    Py_CLEAR(st->str_data_received);
    Py_CLEAR(st->str_done);
    Py_CLEAR(st->str_fileno);
    Py_CLEAR(st->str_result);
    Py_CLEAR(st->str_set_result);
    Py_CLEAR(st->str_set_exception);
    Py_CLEAR(st->str_future_blocking);
    Py_CLEAR(st->str_get_buffer);
    Py_CLEAR(st->str_buffer_updated);
    Py_CLEAR(st->str_datagram_received);
    Py_CLEAR(st->str_get_running_loop);
    return 0;
}

static void
core_free(void *m)
{
    tl_state *st = PyModule_GetState((PyObject *)m);
    if (st != NULL)
        tl_handle_free_list(st);
    core_clear((PyObject *)m);
}

static PyMethodDef core_functions[] = {
    {"_after_fork_child", after_fork_child, METH_NOARGS,
     "Mark loops created before os.fork() as unusable (child side)."},
    {"_sighandler_noop", (PyCFunction)(void (*)(void))sighandler_noop,
     METH_FASTCALL, NULL},
    {NULL}
};

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
    {0, NULL}
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tideloop._core",
    .m_doc = "The tideloop event loop core, in C.",
    .m_size = sizeof(tl_state),
    .m_methods = core_functions,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
