"""The package's submodules never import the package itself.

``tideloop/__init__.py`` may import its submodules; a submodule takes what
it needs from a small module (``_loop``, ``_diag_state``, ``_compat``, ...),
never from the package -- function-level imports included.  Read from the
source (no import).  That no modules import one another in a circle is
tests/tooling/test_layering.py's check.
"""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "src" / "tideloop"

# Entry points that import the package as its users do; nothing imports them.
ENTRY_POINTS = {"tideloop.__main__", "tideloop.pytest_plugin", "tideloop._bench"}


def _modules():
    mods = {"tideloop._core": None}     # the C extension: imports _compat only
    for path in PKG.rglob("*.py"):
        parts = ("tideloop",) + path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name, path, mods):
    """The package's modules that ``name`` imports, anywhere in its code."""
    if path is None:
        return {"tideloop._compat"}
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                prefix = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                target = f"{prefix}.{target}" if target else prefix
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in mods else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in mods and m != name}


def _circles():
    mods = _modules()
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    circles = set()

    def walk(start, node, trail):
        for nxt in graph[node]:
            if nxt == start:
                circles.add(frozenset(trail))
            elif nxt not in trail and nxt > start:    # each circle from its least member
                walk(start, nxt, trail + [nxt])

    for name in graph:
        walk(name, name, [name])
    return graph, circles


def test_submodules_do_not_import_the_package():
    graph, _ = _circles()
    back = sorted(name for name, deps in graph.items()
                  if "tideloop" in deps and name not in ENTRY_POINTS
                  and not name.startswith("tideloop._bench."))
    assert not back, f"import the package back: {back}"


def test_loop_is_found_where_users_look():
    import tideloop
    from tideloop import _loop

    assert tideloop.Loop is _loop.Loop
    assert tideloop.new_event_loop is _loop.new_event_loop
    assert f"{tideloop.Loop.__module__}.{tideloop.Loop.__qualname__}" == "tideloop.Loop"
