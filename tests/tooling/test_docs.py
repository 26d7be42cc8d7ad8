"""The user documentation: README.md is short and names no issue numbers, its
figures (and bench/README.md's) all come from generated regions, the MkDocs site builds with
--strict, and the README's usage snippets run."""
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from loop_helpers import child_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".git")),
                                reason="not a checkout (an sdist): the docs site is not here")

GENERATED = re.compile(r"<!-- generated: .*?<!-- end generated -->", re.S)
ISSUE_NUMBER = re.compile(r"issue\s*#?\s*\d+|\(#\d+\)|(?<![\w&/])#\d+\b|\bgh-\d+", re.I)
# Figures that only a measurement can give: ratios (0.85x), counts with a
# thousands separator (1,762), durations and percentages of runs.
TYPED_FIGURE = re.compile(r"\b\d+\.\d+x\b|\b\d{1,3}(,\d{3})+\b|\b\d+(\.\d+)? ?(ms|µs|us|ns)\b"
                          r"|\b\d+(\.\d+)? ?%")


def user_docs():
    pages = sorted(os.path.join("docs", f) for f in os.listdir(DOCS) if f.endswith(".md"))
    return ["README.md"] + pages


def checked_docs():
    """The user docs and bench/README.md, the maintainers' reference to the
    benchmarks: it types no figure either (docs/benchmarks.md has them)."""
    return user_docs() + ["bench/README.md"]


def read(rel):
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def test_readme_is_at_most_300_lines():
    n = len(read("README.md").splitlines())
    assert n <= 300, f"README.md has {n} lines; move reference material to docs/"


@pytest.mark.parametrize("rel", checked_docs())
def test_user_docs_name_no_issue_numbers_or_runs(rel):
    text = read(rel)
    assert not ISSUE_NUMBER.findall(text), ISSUE_NUMBER.findall(text)
    assert not re.search(r"\b(latest|last) (CI )?run\b", text, re.I), "a run diary"


@pytest.mark.parametrize("rel", checked_docs())
def test_figures_are_generated_not_typed(rel):
    """Outside the regions tools/docs_tables.py fills, no measured figure."""
    prose = GENERATED.sub("", read(rel))
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)     # code: options, not results
    found = [m.group(0) for m in TYPED_FIGURE.finditer(prose)]
    assert not found, f"hand-typed figures in {rel}: {found}"


def test_readme_links_point_to_files_and_headings_that_exist():
    """README.md is read outside the site (GitHub, PyPI's sdist): its
    relative links are checked here, the site's by mkdocs --strict."""
    def slug(heading):
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    for target in re.findall(r"\]\(([^)\s]+)\)", read("README.md")):
        if re.match(r"\w+:", target):
            continue
        path, _, anchor = target.partition("#")
        assert os.path.exists(os.path.join(REPO, path)), target
        if anchor and path.endswith(".md"):
            headings = re.findall(r"(?m)^#+ (.*)$", read(path))
            assert anchor in {slug(h) for h in headings}, target


def test_the_test_command_is_what_ci_runs():
    """The README's test command: the suite and the conformance runner as
    .ci/run runs them (its own options besides)."""
    readme = read("README.md")
    line = next(x for x in readme.splitlines() if x.startswith('pip install ".[test]"'))
    line = line.split("  #")[0]           # without its comment
    ci = read(".ci/run")
    for part in line.split(" && ")[1:]:
        words = part.split()[1:]          # without the interpreter's name
        assert " ".join(words[:3]) in ci.replace('"$PY" ', ""), part
        assert all(w in ci for w in words), part


# --- mkdocs ------------------------------------------------------------------

def mkdocs(*args, cwd=REPO):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install '.[docs]'; CI installs it)")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_mkdocs_build_strict(tmp_path):
    p = mkdocs("--site-dir", str(tmp_path / "site"))
    assert p.returncode == 0, p.stdout + p.stderr
    for page in ("index", "usage", "diagnostics", "tls", "compatibility", "benchmarks",
                 "design", "contributing"):
        path = tmp_path / "site" / ("" if page == "index" else page) / "index.html"
        assert path.exists(), page


def test_mkdocs_strict_fails_on_a_broken_link(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(os.path.join(REPO, "mkdocs.yml"), tmp_path)
    with open(tmp_path / "docs" / "usage.md", "a") as f:
        f.write("\nSee [nowhere](no-such-page.md).\n")
    p = mkdocs("--site-dir", str(tmp_path / "site"), cwd=tmp_path)
    assert p.returncode != 0 and "no-such-page.md" in p.stdout + p.stderr


# --- the README's commands ---------------------------------------------------

def blocks(lang):
    return re.findall(r"```" + lang + r"\n(.*?)```", read("README.md"), re.S)


def run_env():
    # The tideloop these tests import: the checkout built in place (what
    # PYTHONPATH=src means in the README) or, in CI, the installed one.
    env = child_env()
    env.pop("TIDELOOP_DIAGNOSTICS", None)
    return env


def python_block(needle):
    found = [b for b in blocks("python") if needle in b]
    assert len(found) == 1, f"the README has no single python block with {needle!r}"
    return found[0]


def run_python(code, tmp_path, timeout=60):
    script = tmp_path / "snippet.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], cwd=REPO, env=run_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_readme_usage_snippet_runs(tmp_path):
    p = run_python(python_block("tideloop.install()"), tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["done"] * 3


def test_readme_diagnostics_snippet_reports_the_blocking_call(tmp_path):
    p = run_python(python_block("watch_stalls"), tmp_path)
    assert p.returncode == 0, p.stderr
    assert "1 slow step(s)" in p.stdout
    assert "tideloop.diagnostics" in p.stderr and "time.sleep(0.1)" in p.stderr
    assert "work" in p.stdout.splitlines()[1], p.stdout     # the top task by CPU


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_threads_snippet_serves_and_stops_on_sigint(tmp_path):
    code = python_block("tideloop.threads.run(main)")
    assert "8000" in code
    port = free_port()
    script = tmp_path / "threads_snippet.py"
    script.write_text(code.replace("8000", str(port)))
    p = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=run_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                assert p.poll() is None, p.communicate()[1]
                assert time.monotonic() < deadline, "the threads snippet never listened"
                time.sleep(0.05)
        with conn:
            conn.sendall(b"hello\n")
            assert conn.makefile("rb").readline() == b"hello\n"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err


def test_readme_server_snippets_are_run_by_the_servers_test():
    """The server lines start uvicorn, aiohttp and anyio programs:
    tests/ecosystem/test_servers.py runs each in a real process."""
    servers = read(os.path.join("tests", "ecosystem", "test_servers.py"))
    block = python_block("uvicorn.run(")
    for line in block.splitlines():
        code = line.split("#")[0].strip()
        call = code.split("(", 1)[0].split(".")[-1]
        assert call + "(" in servers, f"{code!r} is not run by test_servers.py"


CHEAP = re.compile(r"^(PYTHONPATH=src )?python (-m tideloop run |-c |examples/)")


def cheap_shell_commands():
    cmds = []
    for b in blocks("sh"):
        for line in b.splitlines():
            cmd = line.split("  #")[0].strip()
            if CHEAP.match(cmd):
                cmds.append(cmd)
    return cmds


def test_readme_has_cheap_shell_commands_to_run():
    assert len(cheap_shell_commands()) >= 3, cheap_shell_commands()


@pytest.mark.parametrize("cmd", cheap_shell_commands())
def test_readme_shell_command_runs(cmd):
    argv = cmd.split()
    if argv[0].startswith("PYTHONPATH="):
        argv = argv[1:]
    argv[0] = sys.executable
    p = subprocess.run(argv, cwd=REPO, env=run_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    if "-m tideloop run" in cmd:
        assert "tideloop" in p.stdout, p.stdout


def test_ci_installs_the_docs_extras_mkdocs():
    import tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["docs"]
    ci = read(".ci/run")
    assert any(f'pip install -q "{req}"' in ci or "[docs]" in ci for req in extra), extra
    assert "mkdocs build --strict" in ci
