"""The registry of CPython-private dependencies (tideloop/_internals.py),
TIDELOOP_PORTABLE=1 (every run-time choice takes its public fallback) and
``python -m tideloop info``."""
import json
import subprocess
import sys

import pytest

from loop_helpers import child_env

from tideloop import _compat, _core, _internals

# Build-time entries that are public API on every version (not in the registry).
PUBLIC_BUILD_ENTRIES = {"type_name", "raised_exception", "free_threading", "weakref_get"}


def test_every_private_build_time_choice_is_registered():
    registered = {i.name for i in _internals.REGISTRY}
    assert set(_core.compat) - PUBLIC_BUILD_ENTRIES <= registered
    for entry in _internals.REGISTRY:
        assert all(entry[:7]), entry        # every field said
        assert entry.kind in ("run time", "build time", "names")


def test_every_run_time_choice_names_the_tests_of_its_fallback():
    # tests/portable.py runs them with TIDELOOP_PORTABLE=1 on every leg
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for entry in _internals.REGISTRY:
        if entry.kind != "run time":
            assert not entry.tests and not entry.conformance, entry.name
            continue
        assert entry.tests and entry.conformance, entry.name
        for path in entry.tests:
            assert os.path.isfile(os.path.join(root, path)), path
        for module in entry.conformance:
            assert module.startswith("test_"), module


def test_state_covers_the_registry_and_the_probes():
    names = [row[0] for row in _internals.state()]
    assert {i.name for i in _internals.REGISTRY if i.kind != "build time"} <= set(names)
    assert set(_core.compat) <= set(names) and set(_compat.ENTRIES) <= set(names)


PROBE = """
import json, tideloop, tideloop._core as c, tideloop._streams as s, tideloop._tls as t
print(json.dumps([c.portable, c.context_snapshots, c.tls_route(), list(c.tls_routes),
                  s.ENABLED, t.TLS_ROUTE_PROOF]))
"""


def probe(env):
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       env=child_env(env), timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_portable_mode_takes_every_run_time_fallback():
    portable, snapshots, route, routes, streams, proof = probe({"TIDELOOP_PORTABLE": "1"})
    assert portable == 1 and snapshots == 0 and streams is False
    assert route == "sslobject" and routes == ["sslobject"]
    assert "TIDELOOP_PORTABLE" in proof


@pytest.mark.parametrize("value", ["0", "off", ""])
def test_portable_mode_off(value):
    portable, snapshots, route, routes, streams, proof = probe({"TIDELOOP_PORTABLE": value})
    assert portable == 0 and streams is True
    assert snapshots == (_core.compat["context_layout"] == "private-checked")
    assert route == routes[0] and (route == "openssl") == (proof is None)


@pytest.mark.parametrize("portable", ["0", "1"])
def test_info_says_what_runs_here(portable):
    p = subprocess.run([sys.executable, "-m", "tideloop", "info"], capture_output=True,
                       text=True, env=child_env({"TIDELOOP_PORTABLE": portable}), timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    out = p.stdout
    assert out.startswith("tideloop ") and "Python %d.%d." % sys.version_info[:2] in out
    assert "portable mode (TIDELOOP_PORTABLE): %s" % ("on" if portable == "1" else "off") in out
    for name in [i.name for i in _internals.REGISTRY if i.kind != "build time"] + \
            list(_core.compat) + list(_compat.ENTRIES):
        assert "\n  %s " % name in out, name
    if portable == "1":
        assert "  tls_openssl" in out and "no: route sslobject" in out
        assert "no: PyContext_CopyCurrent()" in out and "no: asyncio's code" in out


def test_the_portable_run_selects_what_the_registry_names():
    # tests/portable.py reads the registry without importing tideloop
    import portable
    paths, modules = portable.selection()
    named = [p for entry in _internals.REGISTRY for p in entry.tests]
    assert set(paths) == set(named) | set(portable.ALWAYS)
    wanted = {m for entry in _internals.REGISTRY for m in entry.conformance}
    assert set(modules) <= wanted and {"test_ssl", "test_streams", "test_tasks"} <= set(modules)
    assert [row[0] for row in portable.registry()] == [e.name for e in _internals.REGISTRY]
