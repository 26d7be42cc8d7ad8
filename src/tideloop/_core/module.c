/* Module init, module state, type registration: the module state's fields
 * come from the lists in internal.h; the Loop type gets the methods that
 * the fd table, the transports and the sock_* operations define.
 *
 * May call: every file (it registers their types and methods). */
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
        /* No _extra slot (another asyncio): the Python base class stays. */
        if (!PyErr_ExceptionMatches(PyExc_KeyError) &&
            !PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
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
/* _core.HISTOGRAM_BOUNDS: the lower bound of each bucket of the loop's
 * histograms, in seconds (health.h). */
static int
add_histogram_bounds(PyObject *m)
{
    PyObject *t = PyTuple_New(TL_HIST_BUCKETS);
    if (t == NULL)
        return -1;
    for (int i = 0; i < TL_HIST_BUCKETS; i++) {
        PyObject *v = PyFloat_FromDouble((double)tl_hist_lower_ns(i) * 1e-9);
        if (v == NULL) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    int rc = PyModule_AddObjectRef(m, "HISTOGRAM_BOUNDS", t);
    Py_DECREF(t);
    return rc;
}

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
    PyObject *names[3] = {st->str_loop, st->str_name, st->str_context};
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

/* Methods that other files define for the Loop type. */
static int
add_methods(PyTypeObject *tp, const PyMethodDef *defs)
{
    for (const PyMethodDef *d = defs; d->ml_name != NULL; d++) {
        PyObject *descr = PyDescr_NewMethod(tp, (PyMethodDef *)d);
        if (descr == NULL)
            return -1;
        int rc = PyObject_SetAttrString((PyObject *)tp, d->ml_name, descr);
        Py_DECREF(descr);
        if (rc < 0)
            return -1;
    }
    return 0;
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
    PyObject *compat = NULL;
    int rc = -1;

    /* Private names of asyncio come from one place, with fallbacks. */
    compat = PyImport_ImportModule("tideloop._compat");
    if (compat == NULL)
        return -1;
#define FROM_COMPAT(field, attr) \
    if ((st->field = PyObject_GetAttrString(compat, attr)) == NULL) \
        goto done;
    TL_STATE_FROM_COMPAT(FROM_COMPAT)
#undef FROM_COMPAT
#define IMPORT(field, module, attr) \
    if (import_attr(&st->field, module, attr) < 0) \
        goto done;
    TL_STATE_IMPORTED(IMPORT)
#undef IMPORT
#define INTERN(field, text) \
    if (intern(&st->str_##field, text) < 0) \
        goto done;
    TL_STATE_STRINGS(INTERN)
#undef INTERN
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
        compat_flag(compat, "DGRAM_SENDS_EMPTY", &st->dgram_sends_empty) < 0 ||
        compat_flag(compat, "TIMER_END_ULP", &st->timer_end_ulp) < 0)
        goto done;
    if (compat_flag(compat, "SERVER_ATTACH_TAKES_TRANSPORT",
                    &st->server_attach_takes_transport) < 0)
        goto done;

    if ((st->HandleType = add_type(m, &tl_handle_spec, NULL)) == NULL ||
        (st->TimerHandleType = add_type(m, &tl_timer_handle_spec,
                                        (PyObject *)st->HandleType)) == NULL ||
        (st->ThreadSafeHandle != Py_None &&
         (st->ThreadSafeHandleType = add_type(m, &tl_threadsafe_handle_spec,
                                              (PyObject *)st->HandleType)) == NULL) ||
        (st->LoopType = add_type(m, &tl_loop_spec, NULL)) == NULL ||
        add_transport_types(m, st, st->FlowControlMixin) < 0 ||
        (st->ListenerType = add_type(m, &tl_listener_spec, NULL)) == NULL ||
        (st->TLSEngineType = add_type(m, &tl_tls_engine_spec, NULL)) == NULL ||
        PyModule_AddFunctions(m, (PyMethodDef *)tl_tls_module_methods) < 0 ||
        PyModule_AddFunctions(m, (PyMethodDef *)tl_diag_module_methods) < 0)
        goto done;
    /* Not added to the module: sock_* awaitables are made by the loop only,
     * and the streams' types by streams.c. */
    if ((st->SockOpType = (PyTypeObject *)PyType_FromModuleAndSpec(
             m, &tl_sockop_spec, NULL)) == NULL ||
        (st->StreamMethodType = (PyTypeObject *)PyType_FromModuleAndSpec(
             m, &tl_stream_method_spec, NULL)) == NULL ||
        (st->StreamOpType = (PyTypeObject *)PyType_FromModuleAndSpec(
             m, &tl_stream_op_spec, NULL)) == NULL ||
        (st->StreamFeederType = (PyTypeObject *)PyType_FromModuleAndSpec(
             m, &tl_stream_feeder_spec, NULL)) == NULL ||
        PyModule_AddFunctions(m, (PyMethodDef *)tl_streams_module_methods) < 0)
        goto done;
    /* transport.c and loop.c reach streams.c, above them, through these. */
    st->streams_adopt = tl_streams_adopt;

    if ((st->events_module = PyImport_ImportModule("asyncio.events")) == NULL ||
        module_dict(&st->tasks_dict, "asyncio.tasks") < 0 ||
        module_dict(&st->futures_dict, "asyncio.futures") < 0)
        goto done;
    if (add_methods(st->LoopType, tl_fd_loop_methods) < 0 ||
        add_methods(st->LoopType, tl_stream_loop_methods) < 0 ||
        add_methods(st->LoopType, tl_listener_loop_methods) < 0 ||
        add_methods(st->LoopType, tl_dgram_loop_methods) < 0 ||
        add_methods(st->LoopType, tl_pipe_loop_methods) < 0 ||
        add_methods(st->LoopType, tl_sockop_loop_methods) < 0 ||
        add_methods(st->LoopType, tl_diag_loop_methods) < 0 ||
        add_methods(st->LoopType, tl_tasks_loop_methods) < 0)
        goto done;
    if (make_kwnames(st) < 0 ||
        PyModule_AddStringConstant(m, "poller_backend", tl_poller_name()) < 0 ||
        tl_context_init(st) < 0 ||
        PyModule_AddIntConstant(m, "context_snapshots", st->fast_context) < 0 ||
        add_compat_table(m) < 0 || add_histogram_bounds(m) < 0 ||
        PyModule_AddIntConstant(m, "main_interpreter",
                                PyInterpreterState_Get() == PyInterpreterState_Main()) < 0 ||
        PyModule_AddIntConstant(m, "interpreter_id",
                                (long)PyInterpreterState_GetID(PyInterpreterState_Get())) < 0 ||
        PyModule_AddIntConstant(m, "free_threaded", TL_FREE_THREADED) < 0 ||
        PyModule_AddIntConstant(m, "portable", tl_portable()) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(compat);
    return rc;
}

/* Traverse and clear every object field of the state (the lists of
 * internal.h). */
#define TL_EACH_STATE_OBJECT(st, OP)                         \
    do {                                                     \
        TL_STATE_TYPES(OP##_1)                               \
        TL_STATE_FROM_COMPAT(OP##_2)                         \
        TL_STATE_IMPORTED(OP##_3)                            \
        TL_STATE_STRINGS(OP##_STR)                           \
        TL_STATE_OTHER_OBJECTS(OP##_1)                       \
        for (int i_ = 0; i_ < 8; i_++)                       \
            OP((st)->kwnames[i_]);                           \
    } while (0)
#define VISIT(o) Py_VISIT(o)
#define VISIT_1(f) Py_VISIT(st->f);
#define VISIT_2(f, a) Py_VISIT(st->f);
#define VISIT_3(f, m, a) Py_VISIT(st->f);
#define VISIT_STR(f, s) Py_VISIT(st->str_##f);
#define CLEAR(o) Py_CLEAR(o)
#define CLEAR_1(f) Py_CLEAR(st->f);
#define CLEAR_2(f, a) Py_CLEAR(st->f);
#define CLEAR_3(f, m, a) Py_CLEAR(st->f);
#define CLEAR_STR(f, s) Py_CLEAR(st->str_##f);

static int
core_traverse(PyObject *m, visitproc visit, void *arg)
{
    tl_state *st = PyModule_GetState(m);
    if (st == NULL)
        return 0;
    TL_EACH_STATE_OBJECT(st, VISIT);
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
    if (st->StreamOpType != NULL)
        tl_streams_free_list(st);
    TL_EACH_STATE_OBJECT(st, CLEAR);
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
#ifdef Py_mod_multiple_interpreters
    /* 3.12+: a module object, its state and its types per interpreter; the
     * core keeps nothing in C statics, and what is per process (signals,
     * faulthandler, child reaping, the live view's socket) is handled in
     * the Python layer as the stock loop handles it (docs/design.md, "What
     * is per process"). */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_GIL_DISABLED
    /* The threading contract (README.md, _core/README.md): what another
     * thread may reach is made safe on purpose, nothing else is shared. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
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
