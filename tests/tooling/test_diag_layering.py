"""The Python diagnostics layer is acyclic: no module of it imports (at
load or lazily, inside a function) a module that imports it back, directly
or through others -- the package's __init__ included.  Read from the
sources' import statements, so a cycle is found whether or not the import
runs."""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "src", "tideloop")
LAYER = ("diagnostics", "_diag_live", "_diag_otel")


def _modules():
    """name -> its file (None for the C extension and subpackages)."""
    out = {}
    for name in os.listdir(PACKAGE):
        path = os.path.join(PACKAGE, name)
        if name.endswith(".py"):
            out[name[:-3]] = path
        elif os.path.isdir(path) or name.endswith(".so"):
            out.setdefault(name.split(".")[0], None)
    return out


def _imports(path, modules):
    """The package's modules that the file imports anywhere in it."""
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or node.module == "tideloop" or \
                    (node.module or "").startswith("tideloop."):
                base = node.module or ""
                base = base[len("tideloop."):] if base.startswith("tideloop.") else base
                if base in ("", "tideloop"):
                    for alias in node.names:            # from . import X
                        out.add(alias.name if alias.name in modules else "__init__")
                else:
                    out.add(base.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tideloop" and len(parts) > 1:
                    out.add(parts[1])
    return {m for m in out if m in modules}


def _cycle_through(start, graph):
    """A path from start back to start, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


@pytest.mark.parametrize("module", LAYER + ("_diag_state",))
def test_no_import_cycle_through_the_diagnostics_layer(module):
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()
             if path is not None}
    assert _cycle_through(module, graph) is None


def test_the_public_names_stay_where_they_were():
    from tideloop import diagnostics
    for name in diagnostics.__all__:
        assert hasattr(diagnostics, name), name
    for name in ("snapshot", "stalls", "slow_callbacks", "subscribe", "task_leaks",
                 "report_task_leaks", "top_tasks", "OpenTelemetryMetrics", "serve", "loops",
                 "summary", "diff", "logger", "HISTOGRAM_BOUNDS", "PrometheusCollector"):
        assert name in diagnostics.__all__
