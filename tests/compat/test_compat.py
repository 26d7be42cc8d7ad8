"""The compatibility layer: every private name of CPython and asyncio that
tideloop uses is resolved in one C header (_core/compat.h, listed as
tideloop._core.compat) and one Python module (tideloop._compat), each with
the versions it applies to and a fallback.  These tests list every entry and
assert the branch the running interpreter must take, so a new interpreter
that moves a name shows up here, not as a crash.

Also checked: every asyncio method tideloop reuses exists on this
interpreter, and every attribute of the loop those methods read is there."""
import asyncio
import dis
import inspect
import subprocess
import sys
import sysconfig

import pytest

import tideloop
from tideloop import _compat, _core

PY = sys.version_info[:2]
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def expected_c_branches():
    return {
        "stop_iteration_value": ("private" if PY < (3, 12) else
                                 "fallback" if FREE_THREADED else "reused"),
        "type_name": "own",
        "hash_double": "private",
        "bytes_resize": "private",
        "raised_exception": "fallback" if PY < (3, 12) else "public",
        "context_layout": "private-checked",
        "ssl_eof_flag": ("none" if PY < (3, 14) else
                         "private-proven-3.14" if PY < (3, 15) else "private-proven-3.15"),
        "free_threading": "gil-not-used" if FREE_THREADED else "gil-build",
        "weakref_get": "public" if PY >= (3, 13) else "deprecated-borrowed",
        "type_version": "struct-field",
        "bytearray_empty": "struct-fields" if PY < (3, 15) else "fallback",
    }


def expected_py_branches():
    create_task_kwargs = "kwargs" if (
        PY >= (3, 14) or (PY == (3, 13) and sys.version_info >= (3, 13, 3))) else "name-context"
    return {
        "format_callback_source": "stock" if PY < (3, 13) else "stock-debug-arg",
        "extract_stack": "stock",
        "format_handle": "stock",
        "set_result_unless_cancelled": "stock",
        "is_debug_mode": "stock",
        "iscoroutinefunction": "public" if PY < (3, 14) else "private",
        "TransportSocket": "stock",
        "FlowControlMixin": "stock",
        "sendfile_mode": "stock",
        "server_attach": "no-argument" if PY < (3, 13) else "transport",
        "running_loop": "stock",
        "create_task_kwargs": create_task_kwargs,
        "child_watchers": "stock" if PY < (3, 14) else "none",
        "default_policy": "stock",
        "policy_api": "stock",
        "policy_deprecated": "current" if PY < (3, 14) else "deprecated",
        "unix_server_cleanup": "none" if PY < (3, 13) else "cleanup_socket",
        "runpy_run_module_as_main": "stock",
        "write_type_error": "probed",
        "sendto_type_error": "probed",
        "writelines": "joined" if PY < (3, 12) else "views",
        "writelines_skips_empty": "skips" if PY >= (3, 14) else "keeps",
        "dgram_empty": "dropped" if PY < (3, 13) else "sent",
        "stock_default_child_watcher": "threaded" if PY < (3, 12) else "pidfd",
        "threadsafe_handle": "stock" if PY >= (3, 14) else "none",
        "loop_watchers": "stock" if PY >= (3, 14) else "none",
        "child_exit_published": "at-once" if PY >= (3, 14) else "next-iteration",
        "create_task_factory": ("set_task_name-helper" if PY < (3, 13) else
                                "set_name" if PY < (3, 14) else "kwargs"),
        "connection_context": "per-connection" if PY >= (3, 15) else "per-callback",
        "timer_end_ulp": "ulp" if PY >= (3, 15) else "resolution",
        "script_main_cached": "absent" if PY >= (3, 15) else "none",
        "subinterpreters": ("none" if PY < (3, 12) else "_xxsubinterpreters" if PY < (3, 13)
                            else "_interpreters" if PY < (3, 14) else "concurrent.interpreters"),
        "daemon_threads": "allowed",    # the main interpreter
    }


def test_c_entries_and_branches():
    assert dict(_core.compat) == expected_c_branches()


def test_python_entries_and_branches():
    got = {name: branch for name, (_versions, branch, _what) in _compat.ENTRIES.items()}
    assert got == expected_py_branches()


def test_every_entry_says_where_it_applies():
    for name, (versions, branch, what) in _compat.ENTRIES.items():
        assert versions and what, name


def test_context_snapshots_verified_here():
    # The Context layout is the same from 3.11 to 3.15 and checked at import;
    # TIDELOOP_PORTABLE takes the public copy instead.
    assert _core.context_snapshots == (0 if _core.portable else 1)


def test_borrowed_methods_all_exist():
    missing = [k for k, v in _compat.BORROWED.items() if v != "stock"]
    assert missing == []


def _self_attributes(func):
    """Names read as self.<name> in func's code (and nested code)."""
    names = set()

    def walk(code):
        instrs = list(dis.get_instructions(code))
        for prev, ins in zip(instrs, instrs[1:]):
            if (prev.opname in ("LOAD_FAST", "LOAD_FAST_BORROW", "LOAD_DEREF",
                                "LOAD_FAST_CHECK")
                    and prev.argval == "self"
                    and ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR")):
                names.add(ins.argval)
            if (ins.opname in ("LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW")
                    and isinstance(ins.argval, tuple) and ins.argval[-1] == "self"):
                nxt = instrs[instrs.index(ins) + 1]
                if nxt.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                    names.add(nxt.argval)
        for const in code.co_consts:
            if inspect.iscode(const):
                walk(const)
    walk(func.__code__)
    return names


def test_attributes_read_by_borrowed_methods_exist():
    """asyncio's methods placed on tideloop.Loop read private attributes of
    the loop (self._ready, self._unix_server_sockets, ...): each must exist on
    a tideloop loop of this interpreter, or the method would fail when a user
    first calls it."""
    loop = tideloop.new_event_loop()
    try:
        missing = {}
        for attr_name in dir(tideloop.Loop):
            func = inspect.getattr_static(tideloop.Loop, attr_name)
            if not inspect.isfunction(func) or not func.__module__.startswith("asyncio"):
                continue
            for name in _self_attributes(func):
                if not hasattr(loop, name):
                    missing.setdefault(name, []).append(attr_name)
        # Attributes asyncio's methods only ever set before reading them.
        set_before_read = {"_asyncgens_shutdown_called", "_executor_shutdown_called"}
        for name in set_before_read:
            missing.pop(name, None)
        assert missing == {}
    finally:
        loop.close()


def test_the_check_above_can_fail():
    def method(self):
        return self._no_such_attribute_anywhere
    assert "_no_such_attribute_anywhere" in _self_attributes(method)


def test_import_raises_no_warning():
    """import tideloop and a loop's life under -W error: no DeprecationWarning
    from tideloop's own code on any interpreter (3.14 deprecates the policy
    API, asyncio.iscoroutinefunction and child watchers)."""
    code = ("import asyncio, tideloop\n"
            "tideloop.install()\n"
            "async def main():\n"
            "    await asyncio.sleep(0)\n"
            "    return type(asyncio.get_running_loop()).__module__\n"
            "print(tideloop.run(main()))\n")
    p = subprocess.run([sys.executable, "-W", "error", "-c", code],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "tideloop"


@pytest.mark.skipif(not FREE_THREADED, reason="a free-threaded build's question")
def test_import_leaves_the_gil_off():
    """tideloop._core declares Py_mod_gil = Py_MOD_GIL_NOT_USED: importing it
    in a free-threaded interpreter (whose GIL is off by default) keeps it
    off, with no RuntimeWarning (-W error), and a loop runs."""
    import os
    code = ("import sys, tideloop\n"
            "assert not sys._is_gil_enabled(), 'the GIL was enabled'\n"
            "print(tideloop.run(__import__('asyncio').sleep(0, 'ran')), sys._is_gil_enabled())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    p = subprocess.run([sys.executable, "-W", "error", "-c", code],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["ran", "False"]
