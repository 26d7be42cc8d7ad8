"""Layering, checked from the code rather than stated.

C: the core's files are compiled to object files (the same include path and
standard as setup.py) and ``nm`` tells which file defines and which uses
each ``tl_*`` symbol; every use must be allowed by the "may call" column of
the map's table (src/tideloop/_core/README.md).

Python: no import circle among the modules of src/tideloop (imports parsed
with ``ast``, those inside functions included).
"""
import ast
import collections
import re
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "src" / "tideloop" / "_core"
MAP = CORE / "README.md"
PACKAGE = ROOT / "src" / "tideloop"

# Import circles known today, each a set of modules; a circle passes while it
# lies within one of them.  None: the set may only stay empty.
KNOWN_CIRCLES = set()

# The map's "may call" cells: file names in backticks, "and below" (those
# files' rows and every row under them), "everything below" (the rows under
# this one), "leaves" (the rows that may call nothing: "—").
_CELL_WORDS = re.compile(r"`[^`]+`|everything below|and below|the leaves|leaves|—|,")


def _names(cell):
    return re.findall(r"`([\w.]+\.[ch])`", cell)


def read_map():
    """[(files of the row, may-call cell)] in the table's order."""
    rows = []
    in_table = False
    for line in MAP.read_text().splitlines():
        if line.startswith("| file | owns | may call |"):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            break
        if line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"the map's row does not have 3 cells: {line}"
        files = _names(cells[0])
        assert files, f"a map row names no file: {line}"
        rows.append((files, cells[2]))
    assert rows, f"no layering table in {MAP}"
    return rows


def allowed_calls(rows):
    """file -> the files it may call (its own row's included)."""
    index = {f: i for i, (files, _) in enumerate(rows) for f in files}
    leaves = {i for i, (_, cell) in enumerate(rows) if cell == "—"}
    allowed = {}
    for i, (files, cell) in enumerate(rows):
        rest = _CELL_WORDS.sub("", cell).replace("and", "").strip()
        assert rest == "", f"the map's may-call cell {cell!r} does not parse ({rest!r})"
        may = {i}
        named = [index[n] for n in _names(cell) if n in index]
        assert len(named) == len(_names(cell)), f"{cell!r} names a file not on the map"
        if "everything below" in cell:
            may |= set(range(i + 1, len(rows)))
        if "and below" in cell:
            may |= set(range(min(named), len(rows)))
        may |= set(named)
        if "leaves" in cell:
            may |= leaves
        for f in files:
            allowed[f] = {g for j in may for g in rows[j][0]}
    return allowed


def _compile(src, out):
    cc = sysconfig.get_config_var("CC") or "cc"
    cmd = cc.split() + ["-c", str(src), "-o", str(out), "-std=c11", "-fPIC",
                        "-fvisibility=hidden", "-w",
                        "-I" + sysconfig.get_paths()["include"],
                        "-I" + sysconfig.get_paths()["platinclude"]]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)


def symbol_uses(tmp_path):
    """(definer of each tl_* symbol, {file: {symbols it uses}})."""
    sources = sorted(CORE.glob("*.c"))
    objs = [tmp_path / (s.stem + ".o") for s in sources]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(_compile, sources, objs))
    defined, used = {}, collections.defaultdict(set)
    for src, obj in zip(sources, objs):
        out = subprocess.run(["nm", str(obj)], check=True, capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            kind, name = parts[-2], parts[-1]
            if not name.startswith("tl_"):
                continue
            if kind == "U":
                used[src.name].add(name)
            elif kind in "TDBR":
                assert name not in defined, f"{name} defined twice"
                defined[name] = src.name
    return defined, used


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_c_calls_follow_the_map(tmp_path):
    rows = read_map()
    allowed = allowed_calls(rows)
    on_map = {f for files, _ in rows for f in files}
    missing = sorted(s.name for s in CORE.glob("*.[ch]") if s.name not in on_map)
    assert not missing, f"files not on the core's map ({MAP.name}): {missing}"
    defined, used = symbol_uses(tmp_path)
    assert defined, "no tl_* symbol found: did the object files build?"
    wrong = []
    for user, symbols in sorted(used.items()):
        for sym in sorted(symbols):
            owner = defined.get(sym)
            if owner is None:
                wrong.append(f"{user} uses {sym}, defined nowhere")
            elif owner not in allowed[user]:
                wrong.append(f"{user} calls {owner} ({sym}): not in its may-call cell")
    assert not wrong, "\n".join(wrong)


def test_map_parser_reads_the_cells():
    # The grammar on a small table: the parser is what the C check rests on.
    rows = [(["a.c"], "everything below"), (["b.c"], "`d.c` and below"),
            (["c.c"], "`e.c`, the leaves"), (["d.c"], "leaves"), (["e.c", "e.h"], "—")]
    allowed = allowed_calls(rows)
    assert allowed["a.c"] == {"a.c", "b.c", "c.c", "d.c", "e.c", "e.h"}
    assert allowed["b.c"] == {"b.c", "d.c", "e.c", "e.h"}
    assert allowed["c.c"] == {"c.c", "e.c", "e.h"}
    assert allowed["d.c"] == {"d.c", "e.c", "e.h"}
    assert allowed["e.h"] == {"e.c", "e.h"}
    with pytest.raises(AssertionError):
        allowed_calls([(["a.c"], "whatever is handy")])


# ---- Python imports ----

def python_modules():
    """module name -> (path, is a package)."""
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        mods[".".join(parts)] = (path, is_pkg)
    # The C extension: imported, imports nothing of ours.
    mods["tideloop._core"] = (None, False)
    return mods


def import_graph(mods):
    """module -> the modules of ours it imports, anywhere in its code."""
    def ours(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, (path, is_pkg) in mods.items():
        targets = set()
        if path is not None:
            pkg = name if is_pkg else name.rpartition(".")[0]
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    targets.update(ours(a.name) for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                        full = ".".join(base + ([node.module] if node.module else []))
                    else:
                        full = node.module
                    for a in node.names:
                        sub = f"{full}.{a.name}"
                        targets.add(sub if sub in mods else ours(full))
        targets.discard(None)
        targets.discard(name)
        graph[name] = targets
    return graph


def circles(graph):
    """The strongly connected components of more than one module."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_no_new_python_import_circle():
    graph = import_graph(python_modules())
    assert "tideloop" in graph and graph["tideloop"], "the package imports nothing?"
    new = [sorted(c) for c in circles(graph)
           if not any(c <= known for known in KNOWN_CIRCLES)]
    assert not new, f"import circles among tideloop's modules: {new}"


def test_circle_finder_sees_function_level_imports(tmp_path):
    # The circle check on a made-up package: a circle closed by an import
    # inside a function counts.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import a\n")
    (tmp_path / "pkg" / "a.py").write_text("from .b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.b\n")
    mods = {}
    for path in sorted((tmp_path / "pkg").glob("*.py")):
        name = "pkg" if path.stem == "__init__" else f"pkg.{path.stem}"
        mods[name] = (path, path.stem == "__init__")
    graph = import_graph(mods)
    assert graph["pkg.c"] == {"pkg.b"}
    assert circles(graph) == [frozenset({"pkg.a", "pkg.b"})]
