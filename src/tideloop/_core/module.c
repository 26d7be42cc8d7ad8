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
 * tl_transport_head mirrors; else None, and the transports stand alone.
 * `base` is what tideloop._compat resolved (None where it is missing). */
static PyObject *
transport_base_class(PyObject *base)
{
    if (base == Py_None || !PyType_Check(base))
        Py_RETURN_NONE;
    PyObject *bt = NULL, *descr = NULL;
    if (import_attr(&bt, "asyncio", "BaseTransport") < 0)
        return NULL;
    descr = PyObject_GetAttrString(bt, "__dict__");
    Py_DECREF(bt);
    PyObject *member = descr ? PyMapping_GetItemString(descr, "_extra") : NULL;
    Py_XDECREF(descr);
    if (member == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int ok = Py_IS_TYPE(member, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)member)->d_member->offset ==
                 (Py_ssize_t)offsetof(tl_transport_head, extra) &&
             ((PyTypeObject *)base)->tp_basicsize ==
                 (Py_ssize_t)offsetof(tl_transport_head, closing) &&
             ((PyTypeObject *)base)->tp_dictoffset == 0;
    Py_DECREF(member);
    if (!ok)
        Py_RETURN_NONE;
    return Py_NewRef(base);
}

/* A new heap type of this module, added to it; NULL on error. */
static PyTypeObject *
add_type(PyObject *m, PyType_Spec *spec, PyObject *bases)
{
    PyObject *tp = PyType_FromModuleAndSpec(m, spec, bases);
    if (tp == NULL)
        return NULL;
    if (PyModule_AddType(m, (PyTypeObject *)tp) < 0) {
        Py_DECREF(tp);
        return NULL;
    }
    return (PyTypeObject *)tp;
}

/* The transport types, over asyncio's transport classes when their layout
 * is the one tl_transport_head mirrors. */
static int
add_transport_types(PyObject *m, tl_state *st, PyObject *flow_control_mixin)
{
    int rc = -1;
    PyObject *base = transport_base_class(flow_control_mixin);
    PyObject *read_base = NULL, *dgram_bases = NULL, *dt = NULL;
    if (base == NULL)
        return -1;
    PyObject *stream_base = base == Py_None ? NULL : base;
    /* The read end is a ReadTransport, datagrams also a DatagramTransport
     * (as in asyncio 3.12+). */
    if (stream_base != NULL) {
        if (import_attr(&read_base, "asyncio", "ReadTransport") < 0 ||
            import_attr(&dt, "asyncio", "DatagramTransport") < 0)
            goto done;
        dgram_bases = PyTuple_Pack(2, base, dt);
        if (dgram_bases == NULL)
            goto done;
    }
    if ((st->SocketTransportType = add_type(m, &tl_socket_transport_spec,
                                            stream_base)) == NULL ||
        (st->WritePipeTransportType = add_type(m, &tl_write_pipe_transport_spec,
                                               stream_base)) == NULL ||
        (st->ReadPipeTransportType = add_type(m, &tl_read_pipe_transport_spec,
                                              read_base)) == NULL ||
        (st->DatagramTransportType = add_type(m, &tl_datagram_transport_spec,
                                              dgram_bases)) == NULL)
        goto done;
    rc = 0;
done:
    Py_DECREF(base);
    Py_XDECREF(read_base);
    Py_XDECREF(dt);
    Py_XDECREF(dgram_bases);
    return rc;
}

/* tideloop._core.compat: the C-level compatibility entries (compat.h) and
 * the branch this build took. */
static int
add_compat_table(PyObject *m)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
#define TL_ADD_ENTRY(name, branch)                                  \
    do {                                                            \
        PyObject *v = PyUnicode_FromString(branch);                 \
        if (v == NULL || PyDict_SetItemString(d, name, v) < 0) {    \
            Py_XDECREF(v);                                          \
            Py_DECREF(d);                                           \
            return -1;                                              \
        }                                                           \
        Py_DECREF(v);                                               \
    } while (0);
    TL_COMPAT_ENTRIES(TL_ADD_ENTRY)
#undef TL_ADD_ENTRY
    int rc = PyModule_AddObjectRef(m, "compat", d);
    Py_DECREF(d);
    return rc;
}

/* st->kwnames[mask]: the tuple of "loop", "name", "context" chosen by the
 * TL_KW_* bits of mask, in that order (mask 0: NULL, no keywords). */
static int
make_kwnames(tl_state *st)
{
    PyObject *loop_str = PyUnicode_InternFromString("loop");
    if (loop_str == NULL)
        return -1;
    PyObject *names[3] = {loop_str, st->str_name, st->str_context};
    int rc = 0;
    for (int mask = 1; mask < 8 && rc == 0; mask++) {
        PyObject *t = PyTuple_New(((mask & 1) != 0) + ((mask & 2) != 0) + ((mask & 4) != 0));
        if (t == NULL) {
            rc = -1;
            break;
        }
        for (int b = 0, k = 0; b < 3; b++)
            if (mask & (1 << b))
                PyTuple_SET_ITEM(t, k++, Py_NewRef(names[b]));
        st->kwnames[mask] = t;
    }
    Py_DECREF(loop_str);
    return rc;
}

/* *out = a new reference to the __dict__ of module name. */
static int
module_dict(PyObject **out, const char *name)
{
    PyObject *m = PyImport_ImportModule(name);
    if (m == NULL)
        return -1;
    *out = Py_XNewRef(PyModule_GetDict(m));
    Py_DECREF(m);
    return *out == NULL ? -1 : 0;
}

/* *out = bool(compat.<name>); -1 with the error set. */
static int
compat_flag(PyObject *compat, const char *name, int *out)
{
    PyObject *v = PyObject_GetAttrString(compat, name);
    if (v == NULL)
        return -1;
    *out = PyObject_IsTrue(v);
    Py_DECREF(v);
    return *out < 0 ? -1 : 0;
}

/* Every step returns at the first error, with that error set. */
static int
core_exec(PyObject *m)
{
    tl_state *st = PyModule_GetState(m);
    PyObject *compat = NULL, *flow = NULL;
    int rc = -1;

    /* Private names of asyncio come from one place, with fallbacks. */
    compat = PyImport_ImportModule("tideloop._compat");
    if (compat == NULL)
        return -1;
#define FROM_COMPAT(field, attr) \
    ((st->field = PyObject_GetAttrString(compat, attr)) == NULL)
    if (FROM_COMPAT(format_callback_source, "format_callback_source") ||
        FROM_COMPAT(extract_stack, "extract_stack") ||
        FROM_COMPAT(format_handle, "format_handle") ||
        FROM_COMPAT(set_result_unless_cancelled, "set_result_unless_cancelled") ||
        FROM_COMPAT(TransportSocket, "TransportSocket") ||
        FROM_COMPAT(sendfile_try_native, "SENDFILE_TRY_NATIVE") ||
        FROM_COMPAT(iscoroutine, "iscoroutine") ||
        FROM_COMPAT(iscoroutinefunction, "iscoroutinefunction") ||
        FROM_COMPAT(write_type_error_prefix, "WRITE_TYPE_ERROR_PREFIX") ||
        FROM_COMPAT(sendto_type_error_prefix, "SENDTO_TYPE_ERROR_PREFIX") ||
        FROM_COMPAT(ThreadSafeHandle, "ThreadSafeHandle") ||
        FROM_COMPAT(create_task_stock, "create_task_stock") ||
        FROM_COMPAT(set_task_name, "set_task_name"))
        goto done;
#undef FROM_COMPAT
    if (!PyUnicode_Check(st->write_type_error_prefix) ||
        !PyUnicode_Check(st->sendto_type_error_prefix)) {
        PyErr_SetString(PyExc_TypeError,
                        "tideloop._compat: the type error prefixes must be str");
        goto done;
    }
    PyObject *style = PyObject_GetAttrString(compat, "CREATE_TASK_STYLE");
    if (style == NULL)
        goto done;
    st->create_task_style = (int)PyLong_AsLong(style);
    Py_DECREF(style);
    if (st->create_task_style == -1 && PyErr_Occurred())
        goto done;
    if (st->create_task_style < TL_CREATE_TASK_STOCK ||
        st->create_task_style > TL_CREATE_TASK_KWARGS ||
        (st->create_task_style == TL_CREATE_TASK_HELPER &&
         st->set_task_name == Py_None))
        st->create_task_style = TL_CREATE_TASK_STOCK;
    if (compat_flag(compat, "WRITELINES_VIEWS", &st->writelines_views) < 0 ||
        compat_flag(compat, "WRITELINES_SKIPS_EMPTY", &st->writelines_skips_empty) < 0 ||
        compat_flag(compat, "DGRAM_SENDS_EMPTY", &st->dgram_sends_empty) < 0)
        goto done;
    if ((flow = PyObject_GetAttrString(compat, "FlowControlMixin")) == NULL ||
        compat_flag(compat, "SERVER_ATTACH_TAKES_TRANSPORT",
                    &st->server_attach_takes_transport) < 0)
        goto done;

    if ((st->HandleType = add_type(m, &tl_handle_spec, NULL)) == NULL ||
        (st->TimerHandleType = add_type(m, &tl_timer_handle_spec,
                                        (PyObject *)st->HandleType)) == NULL ||
        (st->ThreadSafeHandle != Py_None &&
         (st->ThreadSafeHandleType = add_type(m, &tl_threadsafe_handle_spec,
                                              (PyObject *)st->HandleType)) == NULL) ||
        (st->LoopType = add_type(m, &tl_loop_spec, NULL)) == NULL ||
        add_transport_types(m, st, flow) < 0 ||
        (st->ListenerType = add_type(m, &tl_listener_spec, NULL)) == NULL)
        goto done;
    /* Not added to the module: sock_* awaitables are made by the loop only. */
    st->SockOpType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &tl_sockop_spec, NULL);
    if (st->SockOpType == NULL)
        goto done;

    if (import_attr(&st->Future, "asyncio", "Future") < 0 ||
        import_attr(&st->Task, "asyncio", "Task") < 0 ||
        (st->events_module = PyImport_ImportModule("asyncio.events")) == NULL ||
        import_attr(&st->logger, "asyncio.log", "logger") < 0 ||
        import_attr(&st->get_asyncgen_hooks, "sys", "get_asyncgen_hooks") < 0 ||
        import_attr(&st->set_asyncgen_hooks, "sys", "set_asyncgen_hooks") < 0 ||
        import_attr(&st->BufferedProtocol, "asyncio", "BufferedProtocol") < 0 ||
        import_attr(&st->socket_socket, "socket", "socket") < 0)
        goto done;

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
        intern(&st->str_get_running_loop, "_get_running_loop") < 0 ||
        intern(&st->str_Task, "Task") < 0 ||
        intern(&st->str_set_name, "set_name") < 0 ||
        intern(&st->str_Future, "Future") < 0 ||
        module_dict(&st->tasks_dict, "asyncio.tasks") < 0 ||
        module_dict(&st->futures_dict, "asyncio.futures") < 0)
        goto done;
    if (make_kwnames(st) < 0 ||
        PyModule_AddStringConstant(m, "poller_backend", tl_poller_name()) < 0 ||
        tl_context_init(st) < 0 ||
        PyModule_AddIntConstant(m, "context_snapshots", st->fast_context) < 0 ||
        add_compat_table(m) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(compat);
    Py_XDECREF(flow);
    return rc;
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
    Py_VISIT(st->ThreadSafeHandle);
    Py_VISIT(st->ThreadSafeHandleType);
    Py_VISIT(st->create_task_stock);
    Py_VISIT(st->set_task_name);
    Py_VISIT(st->str_Task);
    Py_VISIT(st->str_Future);
    Py_VISIT(st->tasks_dict);
    Py_VISIT(st->futures_dict);
    Py_VISIT(st->events_module);
    Py_VISIT(st->format_callback_source);
    Py_VISIT(st->extract_stack);
    Py_VISIT(st->iscoroutine);
    Py_VISIT(st->iscoroutinefunction);
    Py_VISIT(st->logger);
    Py_VISIT(st->format_handle);
    Py_VISIT(st->write_type_error_prefix);
    Py_VISIT(st->sendto_type_error_prefix);
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
    /* First, while the types the recycled handles point to are alive. */
    if (st->HandleType != NULL)
        tl_handle_free_list(st);
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
    Py_CLEAR(st->ThreadSafeHandle);
    Py_CLEAR(st->ThreadSafeHandleType);
    Py_CLEAR(st->str_Task);
    Py_CLEAR(st->str_Future);
    Py_CLEAR(st->tasks_dict);
    Py_CLEAR(st->futures_dict);
    Py_CLEAR(st->events_module);
    Py_CLEAR(st->format_callback_source);
    Py_CLEAR(st->extract_stack);
    Py_CLEAR(st->iscoroutine);
    Py_CLEAR(st->iscoroutinefunction);
    Py_CLEAR(st->logger);
    Py_CLEAR(st->format_handle);
    Py_CLEAR(st->write_type_error_prefix);
    Py_CLEAR(st->sendto_type_error_prefix);
    Py_CLEAR(st->get_asyncgen_hooks);
    Py_CLEAR(st->set_asyncgen_hooks);
    for (int i = 0; i < 8; i++)
        Py_CLEAR(st->kwnames[i]);
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
    Py_CLEAR(st->create_task_stock);
    Py_CLEAR(st->set_task_name);
    Py_CLEAR(st->str_set_name);
    return 0;
}

static void
core_free(void *m)
{
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
