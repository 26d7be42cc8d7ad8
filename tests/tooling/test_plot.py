"""Pictures of benchmark results (issue 14 part 5): bench/plot.py,
``python -m bench.plot`` and the benchmarks' ``--plot PATH``.

A picture is checked by reading its SVG: it parses, names every row, has
one bar (an element with id "bar-<loop>-<row>") per row and loop other than
asyncio, and the value beside a bar is asyncio's cost over the loop's (so
higher is better).  Without matplotlib (an optional extra) the drawing tests
skip, and the error that names the extra is checked with matplotlib hidden.
"""
import builtins
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from loop_helpers import child_env
from bench import plot

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120
SVG = "{http://www.w3.org/2000/svg}"


def _head(fmt):
    return {"format": fmt, "command": "python3 ...", "argv": [], "elapsed_s": 1.0,
            "started": "2026-01-02T03:04:05+0000", "repeat": 3,
            "environment": {"python": "3.11.7", "cpus": 2}}


def micro_doc():
    doc = _head("tideloop-microbench/1")
    doc["clock"] = "wall"
    doc["results"] = [
        {"name": "call_soon", "label": "call_soon + run noop (100k)",
         "ns_per_op": {"asyncio": 400.0, "uvloop": 200.0, "tideloop": 100.0}},
        {"name": "future", "label": "future via call_soon, awaited (100k)",
         "ns_per_op": {"asyncio": 900.0, "uvloop": 600.0, "tideloop": 300.0}},
        {"name": "queue", "label": "Queue(1) producer/consumer (50k)",
         "ns_per_op": {"asyncio": 1000.0, "uvloop": 800.0, "tideloop": 625.0}},
    ]
    return doc


def net_doc():
    doc = _head("tideloop-netbench/2")
    doc["results"] = [
        {"kind": "protocol", "size": 1024, "conns": 10, "rps": {"asyncio": 1.0},
         "cpu_us_per_req": {"asyncio": 30.0, "uvloop": 10.0, "tideloop": 7.5, "c": 5.0}},
        {"kind": "tls-streams", "size": 16384, "conns": 100, "rps": {"asyncio": 1.0},
         "cpu_us_per_req": {"asyncio": 80.0, "uvloop": 100.0, "tideloop": 40.0, "c": 20.0}},
    ]
    return doc


def io_doc():
    doc = _head("tideloop-iobench/1")
    doc["results"] = [
        {"workload": "udp", "label": "64 B x16",
         "cpu_per_unit": {"asyncio": 12.0, "uvloop": 6.0, "tideloop": 4.0}},
        {"workload": "pipe_read", "label": "1 GiB",
         "cpu_per_unit": {"asyncio": 300.0, "uvloop": 150.0, "tideloop": 120.0,
                          "blocking": 100.0}},
    ]
    return doc


# (document, the labels its rows must show, {(loop, row): value beside the bar})
DOCS = {
    "micro": (micro_doc, ["call_soon + run noop (100k)",
                          "future via call_soon, awaited (100k)",
                          "Queue(1) producer/consumer (50k)"],
              {("uvloop", 0): "2.00x", ("tideloop", 0): "4.00x", ("tideloop", 2): "1.60x"}),
    "net": (net_doc, ["protocol 1 KiB x10", "tls-streams 16 KiB x100"],
            {("uvloop", 1): "0.80x", ("tideloop", 0): "4.00x"}),
    "io": (io_doc, ["udp 64 B x16", "pipe_read 1 GiB"],
           {("tideloop", 0): "3.00x", ("tideloop", 1): "2.50x"}),
}


def _svg(path):
    """(all text of the picture, {bar id: bar element})."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    texts = ["".join(el.itertext()) for el in root.iter(f"{SVG}text")]
    bars = {el.get("id"): el for el in root.iter(f"{SVG}g")
            if (el.get("id") or "").startswith("bar-")}
    return texts, bars


@pytest.fixture
def matplotlib():
    return pytest.importorskip("matplotlib")


@pytest.mark.parametrize("fmt", sorted(DOCS))
def test_each_format_draws_a_bar_per_row_and_loop(fmt, tmp_path, matplotlib):
    make, labels, values = DOCS[fmt]
    out = tmp_path / f"{fmt}.svg"
    chart = plot.draw(make(), out)
    texts, bars = _svg(out)

    assert chart.reference == "asyncio" and chart.series == ["uvloop", "tideloop"]
    for label in labels:
        assert label in texts, (label, texts)
    # One bar per row and loop; the floors ("c", "blocking") are not drawn.
    assert sorted(bars) == sorted(f"bar-{loop}-{i}" for loop in ("uvloop", "tideloop")
                                  for i in range(len(labels)))
    for bar in bars.values():
        assert bar.find(f"{SVG}path") is not None
    # The value beside a bar: asyncio's cost / the loop's (higher is better).
    for (loop, row), text in values.items():
        assert chart.rows[row][1][loop] == pytest.approx(float(text[:-1]))
        assert f" {text}" in texts
    assert any("higher is better" in t for t in texts)


def test_bars_grow_with_the_speed_up(tmp_path, matplotlib):
    """A loop twice as fast has a bar twice as long (horizontal bars from 0)."""
    out = tmp_path / "micro.svg"
    plot.draw(micro_doc(), out)
    _, bars = _svg(out)

    def length(bar_id):
        d = bars[bar_id].find(f"{SVG}path").get("d").replace("\n", " ").split()
        xs = [float(d[i]) for i in range(1, len(d), 3) if d[i - 1] in ("M", "L")]
        return max(xs) - min(xs)

    assert length("bar-tideloop-0") == pytest.approx(2 * length("bar-uvloop-0"), rel=1e-3)


def test_svg_is_deterministic(tmp_path, matplotlib):
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    plot.draw(net_doc(), first)
    plot.draw(net_doc(), second)
    assert first.read_bytes() == second.read_bytes()
    assert b"<dc:date>" not in first.read_bytes()


def test_another_format_with_the_same_row_shape_is_read(tmp_path, matplotlib):
    """A new driver (bench/apps.py: harness.json_head, net.py's rows) needs no
    change here; a document may name its figure, and a rate reads as loop / asyncio."""
    doc = _head("tideloop-appsbench/1")
    doc["results"] = [
        {"kind": "starlette", "conns": 50, "rps": {"asyncio": 1000.0, "tideloop": 2500.0},
         "cpu_us_per_req": {"asyncio": 90.0, "tideloop": 45.0}},
    ]
    chart = plot.draw(doc, tmp_path / "apps.svg")
    assert chart.rows == [("starlette x50", {"tideloop": pytest.approx(2.0)})]
    assert chart.title == "tideloop appsbench"
    texts, bars = _svg(tmp_path / "apps.svg")
    assert list(bars) == ["bar-tideloop-0"] and "starlette x50" in texts

    doc["figure"] = "rps"
    chart = plot.read_chart(doc)
    assert chart.rows[0][1]["tideloop"] == pytest.approx(2.5)
    assert "requests per second" in chart.axis_label


def test_missing_figures_leave_a_gap_not_a_bar(tmp_path, matplotlib):
    doc = micro_doc()
    doc["results"][1]["ns_per_op"].pop("uvloop")          # uvloop errored on that row
    plot.draw(doc, tmp_path / "gap.svg")
    texts, bars = _svg(tmp_path / "gap.svg")
    assert "bar-uvloop-1" not in bars and len(bars) == 5
    assert "n/a" in texts


@pytest.mark.parametrize("doc, message", [
    ([1, 2], "not a results document"),
    ({"results": []}, "not a tideloop results document"),
    ({"format": "pytest-benchmark/4", "results": []}, "expected 'tideloop-<name>/<version>'"),
    ({"format": "tideloop-microbench/1", "results": []}, "non-empty list of rows"),
    ({"format": "tideloop-appsbench/1", "results": [{"kind": "x", "p99_ms": {"asyncio": 1}}]},
     "per-loop figure one of ns_per_op"),
    ({"format": "tideloop-netbench/2", "results": [{"kind": "x", "rps": {"asyncio": 1}}]},
     "per-loop figure 'cpu_us_per_req'"),
    ({"format": "tideloop-microbench/1", "results": [{"ns_per_op": {"asyncio": 1, "tideloop": 2}}]},
     "a row has no name"),
    ({"format": "tideloop-microbench/1", "results": [{"label": "x", "ns_per_op": {"tideloop": 2}}]},
     "fewer than two loops"),
])
def test_unknown_shapes_are_refused_with_a_reason(doc, message):
    with pytest.raises(plot.PlotError) as info:
        plot.read_chart(doc)
    assert message in str(info.value)


def test_cli_redraws_a_saved_document(tmp_path, matplotlib):
    saved, out = tmp_path / "results.json", tmp_path / "out.svg"
    saved.write_text(json.dumps(io_doc()))
    p = subprocess.run([sys.executable, "-m", "bench.plot", str(saved), str(out),
                        "--title", "I/O on a test machine"], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"wrote {out}"
    assert p.stderr == ""                   # no runpy warning about a double import
    texts, bars = _svg(out)
    assert "I/O on a test machine" in texts and len(bars) == 4

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other/1", "results": []}))
    p = subprocess.run([sys.executable, "-m", "bench.plot", str(bad), str(out)],
                       cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 1
    assert "plot: error:" in p.stderr and "not a tideloop results document" in p.stderr


def test_without_matplotlib_the_error_names_the_extra(monkeypatch, tmp_path, capsys):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(plot.MatplotlibMissing) as info:
        plot.draw(micro_doc(), tmp_path / "x.svg")
    assert "pip install 'tideloop[plot]'" in str(info.value)
    assert isinstance(info.value, ImportError)
    assert not (tmp_path / "x.svg").exists()

    # --plot checks before a benchmark measures anything: a usage error.
    assert plot.check_plot_option(str(tmp_path / "x.svg")) == 2
    assert "pip install 'tideloop[plot]'" in capsys.readouterr().err
    assert plot.check_plot_option(None) is None


# --- the benchmarks' --plot ----------------------------------------------------

HIDE_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; "


@pytest.mark.parametrize("command", [
    ["-c", HIDE_MATPLOTLIB + "from tideloop.__main__ import main; "
           "sys.exit(main(['bench', '--quick', '--repeat', '1', '--plot', 'out.svg']))"],
    ["-c", HIDE_MATPLOTLIB + "import runpy; "
           "sys.argv = ['bench.net', '--quick', '--plot', 'out.svg']; "
           "runpy.run_module('bench.net', run_name='__main__', alter_sys=True)"],
    ["-c", HIDE_MATPLOTLIB + "import runpy; "
           "sys.argv = ['bench.io', '--quick', '--plot', 'out.svg']; "
           "runpy.run_module('bench.io', run_name='__main__', alter_sys=True)"],
    ["-c", HIDE_MATPLOTLIB + "import runpy; "
           "sys.argv = ['bench.threads', '--quick', '--plot', 'out.svg']; "
           "runpy.run_module('bench.threads', run_name='__main__', alter_sys=True)"],
], ids=["micro", "net", "io", "threads"])
def test_plot_option_without_matplotlib_fails_before_measuring(command, tmp_path):
    p = subprocess.run([sys.executable, *command], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "--plot:" in p.stderr and "pip install 'tideloop[plot]'" in p.stderr
    assert "median" not in p.stdout and "reproduce:" not in p.stdout    # nothing measured
    assert not (ROOT / "out.svg").exists()


def test_bench_plot_option_draws_the_run(tmp_path, matplotlib):
    pytest.importorskip("uvloop")
    out, saved = tmp_path / "micro.svg", tmp_path / "micro.json"
    p = subprocess.run(
        [sys.executable, "-m", "tideloop", "bench", "--quick", "--repeat", "1",
         "--scale", "0.1", "--no-warmup", "--only", "call_soon,future",
         "--json", str(saved), "--plot", str(out)],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    assert f"wrote {out}" in p.stdout
    texts, bars = _svg(out)
    assert "call_soon + run noop (1k)" in texts and "future via call_soon, awaited (1k)" in texts
    assert sorted(bars) == ["bar-tideloop-0", "bar-tideloop-1", "bar-uvloop-0", "bar-uvloop-1"]
    # The picture is the run's: redrawing its JSON gives the same bytes.
    again = tmp_path / "again.svg"
    plot.draw(json.loads(saved.read_text()), again)
    assert again.read_bytes() == out.read_bytes()


def test_io_plot_option_draws_the_run(tmp_path, matplotlib):
    """bench/io.py's --plot on its cheapest row (20 /bin/true per loop)."""
    out = tmp_path / "io.svg"
    p = subprocess.run(
        [sys.executable, "-m", "bench.io", "--loops", "asyncio,tideloop",
         "--only", "spawn", "--count", "20", "--concurrency", "5", "--repeat", "1",
         "--plot", str(out)],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr[-3000:]
    texts, bars = _svg(out)
    assert "spawn 20 /5" in texts and list(bars) == ["bar-tideloop-0"]


def test_plot_option_into_a_missing_directory_is_a_usage_error(tmp_path, matplotlib):
    p = subprocess.run(
        [sys.executable, "-m", "tideloop", "bench", "--quick", "--plot",
         str(tmp_path / "no" / "such" / "dir.svg")],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 2 and "no such directory" in p.stderr
    assert "reproduce:" not in p.stdout
