"""The documentation's generated tables match the result files they come
from (tools/docs_tables.py), and the generator notices a stale one."""
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, cwd=REPO):
    return subprocess.run([sys.executable, os.path.join(cwd, "tools", "docs_tables.py"), *args],
                          cwd=cwd, capture_output=True, text=True)


def test_docs_are_up_to_date():
    p = run("--check")
    assert p.returncode == 0, p.stderr


def test_a_stale_table_is_found_and_rewritten(tmp_path):
    for d in ("tools", "results"):
        shutil.copytree(os.path.join(REPO, d), tmp_path / d)
    (tmp_path / "bench").mkdir()
    shutil.copy(os.path.join(REPO, "bench", "README.md"), tmp_path / "bench")
    readme = open(os.path.join(REPO, "README.md")).read()
    start = readme.index("<!-- generated: matrix")
    line_end = readme.index("\n", start) + 1
    stale = readme[:line_end] + "| a stale row |\n" + readme[readme.index("<!-- end generated -->", start):]
    (tmp_path / "README.md").write_text(stale)
    p = run("--check", cwd=tmp_path)
    assert p.returncode == 1 and "README.md" in p.stderr
    assert (tmp_path / "README.md").read_text() == stale      # --check changes nothing
    assert run(cwd=tmp_path).returncode == 0
    assert (tmp_path / "README.md").read_text() == readme


def copy_tree_for_tables(tmp_path):
    """What tools/docs_tables.py reads and writes, copied under tmp_path."""
    for d in ("tools", "results", "docs"):
        shutil.copytree(os.path.join(REPO, d), tmp_path / d)
    (tmp_path / "bench").mkdir()
    shutil.copy(os.path.join(REPO, "bench", "README.md"), tmp_path / "bench")
    shutil.copy(os.path.join(REPO, "README.md"), tmp_path)
    core = tmp_path / "src" / "tideloop" / "_core"
    core.mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "src", "tideloop", "_core", "README.md"), core)
    shutil.copy(os.path.join(REPO, "src", "tideloop", "_internals.py"), core.parent)


def test_a_changed_result_file_makes_the_docs_stale(tmp_path):
    """The figures in README.md and docs/ are the result files' own: change
    one figure in results/micro.json and both go out of date; the script
    rewrites them with the new figure."""
    import json
    copy_tree_for_tables(tmp_path)
    path = tmp_path / "results" / "micro.json"
    doc = json.loads(path.read_text())
    doc["results"][0]["ns_per_op"]["asyncio"] = 123456.0
    path.write_text(json.dumps(doc))
    p = run("--check", cwd=tmp_path)
    assert p.returncode == 1
    assert "README.md" in p.stderr and "docs/benchmarks.md" in p.stderr
    assert run(cwd=tmp_path).returncode == 0
    for rel in ("README.md", "docs/benchmarks.md"):
        assert "| 123,456 |" in (tmp_path / rel).read_text()


def test_a_stale_docs_page_is_found(tmp_path):
    copy_tree_for_tables(tmp_path)
    page = tmp_path / "docs" / "design.md"
    text = page.read_text()
    page.write_text(text.replace("| `loop.c` |", "| `loop.c` (stale) |"))
    p = run("--check", cwd=tmp_path)
    assert p.returncode == 1 and "docs/design.md" in p.stderr
    assert run(cwd=tmp_path).returncode == 0
    assert page.read_text() == text      # the core's map, from src/tideloop/_core/README.md


def test_every_generator_fills_a_region_and_every_region_has_one():
    import re
    from tools import docs_tables
    used = set()
    for rel in docs_tables.docs_files():
        with open(os.path.join(REPO, rel)) as f:
            used |= set(re.findall(r"<!-- generated: (\w+)", f.read()))
    assert used == set(docs_tables.GENERATORS)


def test_interpreter_imports_groups_what_refuses_first(tmp_path):
    """results/interpreter-imports.json -> docs/usage.md: a module that
    starts refusing isolated interpreters moves, with its package, from the
    table of those that import to that of those that refuse; one that
    crashes the process says so."""
    import json
    copy_tree_for_tables(tmp_path)
    path = tmp_path / "results" / "interpreter-imports.json"
    doc = json.loads(path.read_text())
    newest = list(doc["interpreters"])[-1]
    for rec in doc["interpreters"][newest]["modules"]:
        if rec["module"] == "tideloop._core":
            rec["isolated"] = {"result": "error", "type": "ImportError",
                               "message": "module tideloop._core does not support loading "
                                          "in subinterpreters"}
        if rec["module"] == "sniffio":
            rec["isolated"] = {"result": "crash", "signal": "SIGSEGV", "when": "import"}
    path.write_text(json.dumps(doc))
    p = run("--check", cwd=tmp_path)
    assert p.returncode == 1 and "docs/usage.md" in p.stderr
    assert run(cwd=tmp_path).returncode == 0
    text = (tmp_path / "docs" / "usage.md").read_text()
    refuse = text[text.index("**Refuse to load**"):text.index("**Import** in")]
    assert "| `tideloop` (tideloop" in refuse and "| `tideloop._core` |" in refuse
    row = next(ln for ln in refuse.splitlines() if ln.startswith("| `tideloop._core` |"))
    assert row.rstrip(" |").endswith("refuses")
    assert "crashes the process (SIGSEGV)" in refuse
