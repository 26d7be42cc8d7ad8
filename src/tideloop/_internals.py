"""Every CPython-private thing tideloop relies on, in one place: what it is,
what tideloop uses it for, the versions, how it is proven before use, the
fallback, and whether this interpreter runs on it now.

``TIDELOOP_PORTABLE=1`` in the environment (read at import) makes every
run-time choice below take its fallback; ``python -m tideloop info`` prints
this table for the running interpreter, and docs/compatibility.md has it
(tools/docs_tables.py).  The build-time choices (``compat.h``) are made per
CPython version when the extension is compiled; the version probes of
``_compat.py`` (what the stock loop of this interpreter does) are listed by
``info`` as well.
"""

import collections
import sys

from . import _compat
from . import _core

# tests, conformance: for a run-time choice, the behavioural tests (paths
# under tests/) and CPython's test_asyncio modules that exercise both of its
# sides: tests/portable.py runs them with TIDELOOP_PORTABLE=1 (the fallback).
Internal = collections.namedtuple(
    "Internal", "name kind what why versions proof fallback tests conformance",
    defaults=((), ()))

# kind: "run time" (chosen at import, TIDELOOP_PORTABLE takes the fallback),
# "build time" (compat.h, chosen per version when compiling), "names" (private
# names of asyncio's that asyncio's own loops use the same way).
REGISTRY = (
    Internal(
        "tls_openssl", "run time",
        "_ssl's object layouts (the SSL and BIO pointers inside _SSLSocket and MemoryBIO), "
        "OpenSSL's functions looked up in _ssl's shared object",
        "the openssl TLS route: OpenSSL called from C on _ssl's own objects",
        "3.11-3.15, proven per interpreter",
        "tideloop/_tls.py at import: the same OPENSSL_VERSION, the pointers linked as "
        "_ssl links them, a ClientHello made in C seen in Python's MemoryBIO, errors "
        "made in C equal to _ssl's",
        "the sslobject route (_ssl's methods called from C)",
        ("tests/net/test_tls.py", "tests/net/test_tls_close.py", "tests/net/test_tls_faults.py",
         "tests/net/test_tls_flow.py", "tests/net/test_tls_routes.py",
         "tests/net/test_tls_setup.py", "tests/net/test_tls_verify.py"),
        ("test_ssl", "test_sslproto")),
    Internal(
        "context_layout", "run time",
        "the Context object's fields and the thread state's current context",
        "a callback's context snapshot without PyContext_CopyCurrent()'s allocation",
        "3.11-3.15",
        "handle.c at import: a new Context entered and left, its fields read back",
        "PyContext_CopyCurrent() and PyContext_Enter()/Exit() (public)",
        ("tests/loop/test_context_snapshots.py", "tests/net/test_tcp_context.py",
         "tests/net/test_server_context.py", "tests/loop/test_scheduling.py",
         "tests/loop/test_threadsafe.py"),
        ("test_context", "test_tasks", "test_eager_task_factory")),
    Internal(
        "streams_c_path", "run time",
        "asyncio.streams' private attributes (StreamReader._buffer, _waiter, ...; "
        "StreamReaderProtocol._stream_reader_wr, _paused, _connection_lost, _drain_helper)",
        "asyncio streams' reads and the wait in drain() in C",
        "3.11-3.15",
        "tideloop/_streams.py at import: each method is asyncio.streams' own; the core "
        "checks the classes' version tags before every use",
        "asyncio's own StreamReader and StreamWriter code (also TIDELOOP_STREAMS=0)",
        ("tests/net/test_streams.py", "tests/net/test_streams_c.py",
         "tests/fuzz/test_streams_fuzz.py"),
        ("test_streams",)),
    Internal(
        "sslproto_state", "names",
        "asyncio.sslproto.SSLProtocol's private state and methods (_state, _sslobj, "
        "_incoming, _outgoing, _do_read, _do_write, ...)",
        "the C TLS engine drives SSLProtocol's own state machine (both engine routes)",
        "3.11-3.15",
        "tideloop/_tls.py at import: SSLProtocolState's members, the methods' owners",
        "TIDELOOP_TLS_ROUTE=asyncio: SSLProtocol's own code"),
    Internal(
        "asyncio_loop_protocol", "names",
        "asyncio's private loop protocol: _set_running_loop/_get_running_loop, "
        "_asyncgen_firstiter_hook/_finalizer_hook, _asyncio_future_blocking, Server._attach/"
        "_detach, a transport's _start_reading/_call_connection_lost, Handle._callback",
        "to be the loop asyncio's Tasks, Futures and Servers expect",
        "3.11-3.15",
        "_compat.py records each lookup; tests/compat run on every version",
        "none needed: asyncio's own loops use the same names"),
    Internal(
        "stop_iteration_value", "build time",
        "_PyGen_SetStopIterationValue; the fields of StopIteration and its args tuple",
        "a C awaitable returning its value (3.12+: one StopIteration raised again)",
        "3.11 (private), 3.12+: reused, free-threaded: fallback", "compiled per version",
        "StopIteration(value) raised as an instance"),
    Internal(
        "hash_double", "build time", "_Py_HashDouble", "TimerHandle.__hash__ as hash(float)",
        "3.11-3.12 (private), 3.13+: public Py_HashDouble", "compiled per version",
        "the public function"),
    Internal(
        "bytes_resize", "build time", "_PyBytes_Resize",
        "a read's bytes object shrunk in place", "3.11-3.14 (private), 3.15: fallback",
        "compiled per version", "a copy of the bytes read"),
    Internal(
        "ssl_eof_flag", "build time",
        "_ssl's PySSLSocket flag set once an SSLEOFError was raised (3.14+)",
        "the openssl route raises a second SSLEOFError as _ssl does",
        "3.14-3.15", "its offset proven with the openssl route", "the sslobject route"),
    Internal(
        "type_version", "build time", "PyTypeObject.tp_version_tag",
        "the C streams path sees a stream class changed since its check",
        "3.11-3.15", "compiled per version", "the C streams path off"),
    Internal(
        "bytearray_empty", "build time",
        "PyByteArrayObject's fields; its storage's allocator (PyObject_ to 3.12, PyMem_ from 3.13)",
        "a StreamReader buffer emptied, consumed and appended to without new storage; "
        "large storage lent to the next buffer that grows (with a GIL)", "3.11-3.14",
        "compiled per version", "bytearray resize (public)"),
)


def state():
    """What this interpreter runs on now: [(name, kind, active, why)]."""
    from . import _streams, _tls
    portable = bool(_core.portable)
    note = " (TIDELOOP_PORTABLE)" if portable else ""
    build = _core.compat
    rows = []
    route = _core.tls_route()
    rows.append(("tls_openssl", "run time",
                 "yes" if route == "openssl" else "no: route %s" % route,
                 _tls.TLS_ROUTE_PROOF or "proven at import" + note))
    rows.append(("context_layout", "run time",
                 "yes" if _core.context_snapshots else "no: PyContext_CopyCurrent()",
                 ("layout checked at import" if _core.context_snapshots else
                  "TIDELOOP_PORTABLE is set" if portable else "layout check failed or "
                  "not compiled (%s)" % build.get("context_layout"))))
    rows.append(("streams_c_path", "run time", "yes" if _streams.ENABLED else "no: asyncio's code",
                 "asyncio.streams' own methods" if _streams.ENABLED else
                 "TIDELOOP_PORTABLE is set" if portable else
                 "TIDELOOP_STREAMS or a method that is not asyncio's own"))
    rows.append(("sslproto_state", "names", "yes" if route != "asyncio" else "no", "-"))
    rows.append(("asyncio_loop_protocol", "names", "yes", "-"))
    for name, branch in _core.compat.items():
        rows.append((name, "build time", branch, "compiled for Python %d.%d" % sys.version_info[:2]))
    for name, (versions, branch, what) in _compat.ENTRIES.items():
        rows.append((name, "version probe", branch, what))
    return rows


def info(file=None):
    """``python -m tideloop info``: the interpreter, then each private path and
    whether it is active here."""
    from ._version import __version__
    file = file or sys.stdout
    print("tideloop %s on Python %s (%s), %s, %s interpreter" % (
        __version__, sys.version.split()[0], sys.executable,
        "free-threaded" if _core.free_threaded else "with the GIL",
        "main" if _core.main_interpreter else "sub"), file=file)
    print("poller: %s; portable mode (TIDELOOP_PORTABLE): %s" % (
        _core.poller_backend, "on" if _core.portable else "off"), file=file)
    print("TLS routes offered: %s; in use: %s" % (", ".join(_core.tls_routes) or "none",
                                                  _core.tls_route()), file=file)
    rows = state()
    width = max(len(r[0]) for r in rows)
    kinds = ("run time", "names", "build time", "version probe")
    for kind in kinds:
        print("\n%s:" % {"run time": "private layouts, chosen at import",
                         "names": "asyncio's private names",
                         "build time": "private C API, chosen when compiled",
                         "version probe": "what the stock loop of this interpreter does "
                                          "(_compat.py)"}[kind], file=file)
        for name, k, active, why in rows:
            if k == kind:
                print("  %s  %s%s" % (name.ljust(width), active,
                                      "" if why == "-" else "  (%s)" % why), file=file)
    return 0

