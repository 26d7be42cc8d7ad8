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
