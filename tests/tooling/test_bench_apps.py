"""bench/apps.py's pure parts: wrk's output parsed (its done() hook's line
and, without it, wrk's own report), medians, ratios and verdicts of a row,
and the exit status (a failed run fails the CI smoke, a slow figure does not).
"""
import pytest


@pytest.fixture(scope="module")
def apps():
    from bench import apps
    return apps


WRK_REPORT = """\
Running 4s test @ http://127.0.0.1:40007/text
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.03ms  412.10us   9.12ms   88.12%
    Req/Sec    24.81k     1.02k   26.40k    72.50%
  98765 requests in 4.00s, 14.79MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 7
Requests/sec:  24691.25
Transfer/sec:      3.70MB
"""


def test_wrk_done_hook_line_wins(apps):
    text = WRK_REPORT + (
        'WRKJSON {"requests": 98765, "duration_us": 4000250, "bytes": 15508000, '
        '"errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}, '
        '"latency_us": {"p50": 1990, "p99": 3500, "max": 9120}}\n')
    r = apps.parse_wrk(text)
    assert r["requests"] == 98765
    assert r["seconds"] == pytest.approx(4.00025)
    assert r["rps"] == pytest.approx(98765 / 4.00025)
    assert r["latency_us"]["p99"] == 3500
    assert not any(r["errors"].values())


def test_wrk_report_without_the_hook(apps):
    r = apps.parse_wrk(WRK_REPORT)
    assert r["requests"] == 98765
    assert r["seconds"] == pytest.approx(4.0)
    assert r["rps"] == pytest.approx(98765 / 4.0)
    assert r["errors"] == {"connect": 0, "read": 3, "write": 0, "status": 7, "timeout": 2}
    assert r["latency_us"] is None


@pytest.mark.parametrize("duration, seconds", [("1.00m", 60.0), ("999.50ms", 0.9995),
                                               ("2.01s", 2.01)])
def test_wrk_report_time_units(apps, duration, seconds):
    r = apps.parse_wrk(f"  10 requests in {duration}, 1.00KB read\n")
    assert r["seconds"] == pytest.approx(seconds)
    assert r["errors"] == dict.fromkeys(("connect", "read", "write", "status", "timeout"), 0)


def test_wrk_output_without_a_count_is_an_error(apps):
    with pytest.raises(ValueError, match="requests in"):
        apps.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")
    with pytest.raises(ValueError):
        apps.parse_wrk("")


def _samples(**cpu):
    return {loop: [{"rps": 1000.0 / x, "cpu_us_per_req": x} for x in xs]
            for loop, xs in cpu.items()}


def test_medians_ratios_and_verdict(apps):
    row = apps.summarise("uvicorn-text", "GET /text x50", "req", 13, 50,
                         _samples(asyncio=[50, 40, 45], uvloop=[30, 20, 31],
                                  tideloop=[27, 99, 26]), {})
    assert row["cpu_us_per_req"] == {"asyncio": 45, "uvloop": 30, "tideloop": 27}
    assert row["rps"]["tideloop"] == pytest.approx(1000 / 27)
    assert row["tl_vs_uvloop"] == pytest.approx(0.9)
    assert row["tl_vs_asyncio"] == pytest.approx(0.6)
    assert row["checked"] == {"uvloop": pytest.approx(0.9)}
    assert row["verdict"] == "PASS"              # 0.90 is on the target
    slow = apps.summarise("redis", "-", "cmd", None, 50,
                          _samples(uvloop=[10, 10, 10], tideloop=[9.5, 9.1, 9.2]), {})
    assert slow["tl_vs_uvloop"] == pytest.approx(0.92)
    assert slow["verdict"] == "FAIL"
    # net.py's row layout, which bench.plot reads
    for key in ("kind", "size", "conns", "rps", "cpu_us_per_req", "samples", "errors",
                "tl_vs_asyncio", "tl_vs_uvloop", "tl_vs_c", "targets", "target_metric",
                "checked", "verdict"):
        assert key in row, key


def test_errors_skips_and_exit_status(apps):
    ok = apps.summarise("a", "-", "req", None, 1, _samples(uvloop=[10], tideloop=[5]), {})
    fail = apps.summarise("b", "-", "req", None, 1, _samples(uvloop=[10], tideloop=[10]), {})
    err = apps.summarise("c", "-", "req", None, 1, _samples(uvloop=[10]),
                         {"tideloop": "server exited during the run"})
    uv_err = apps.summarise("d", "-", "req", None, 1, _samples(tideloop=[10]),
                            {"uvloop": "wrk failed"})
    skip = apps.summarise("e", "-", "req", None, 1, {}, {}, skipped="wrk is not installed")
    assert err["cpu_us_per_req"] == {"uvloop": 10}
    assert [r["verdict"] for r in (ok, fail, err, uv_err, skip)] == [
        "PASS", "FAIL", "ERROR", "ERROR", "SKIP"]
    assert apps.exit_status([ok, fail, skip]) == 0          # slow is not a failure
    assert apps.exit_status([ok, fail, skip], fail_on_miss=True) == 1
    assert apps.exit_status([ok, err]) == 1                 # a crash is
    assert apps.exit_status([uv_err]) == 1
    assert apps.exit_status([skip]) == 0


def test_without_uvloop_the_result_is_against_asyncio(apps):
    """uvloop not measured (not installed): the result column compares
    tideloop with asyncio instead of n/a."""
    faster = apps.summarise("a", "-", "req", None, 1, _samples(asyncio=[20], tideloop=[5]), {})
    slower = apps.summarise("b", "-", "req", None, 1, _samples(asyncio=[10], tideloop=[13]), {})
    header, body = apps.table([faster, slower], ["asyncio", "tideloop"])
    assert [cells[-1] for cells in body] == ["4.0x faster", "1.3x slower"]
    assert "n/a" not in apps.format_text([faster, slower], ["asyncio", "tideloop"])


# --- bench/apps_callgrind.py: the callgrind file summed per object, the verdict


@pytest.fixture(scope="module")
def cg():
    from bench import apps_callgrind
    return apps_callgrind


CALLGRIND_FILE = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 1234
cmd:  python3 apps_worker.py
part: 1

positions: line
events: Ir
summary: 1111

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) Python/ceval.c
fn=(1) _PyEval_EvalFrameDefault
10 500
+2 100
cob=(2) /site-packages/tideloop/_core.cpython-311-x86_64-linux-gnu.so
cfl=(2) loop.c
cfn=(2) loop_run_once
calls=1 20
* 9999
ob=(2)
fl=(2)
fn=(2)
20 300
fi=(3) include/inline.h
21 11
ob=(3) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(4) ???
fn=(3) epoll_wait
0 150
ob=(1)
fl=(1)
fn=(1)
-1 50
"""


def test_callgrind_self_cost_per_object(cg, tmp_path):
    path = tmp_path / "callgrind.out.1234.1"
    path.write_text(CALLGRIND_FILE)
    by_obj, by_fn, total = cg.read_callgrind(str(path))
    # the call's inclusive 9999 is not self cost; the inlined file's 11 is the function's
    assert by_obj == {"/usr/lib/libpython3.11.so.1.0": 650,
                      "/site-packages/tideloop/_core.cpython-311-x86_64-linux-gnu.so": 311,
                      "/usr/lib/x86_64-linux-gnu/libc.so.6": 150}
    assert total == sum(by_obj.values()) == 1111
    assert by_fn[("/usr/lib/x86_64-linux-gnu/libc.so.6", "epoll_wait")] == 150
    b = cg.breakdown(by_obj, by_fn, ops=10)
    assert b["ir_per_op"] == pytest.approx(111.1)
    assert b["categories"] == {"loop": 31.1, "interpreter": 65.0, "framework": 0.0,
                               "libc": 15.0, "other": 0.0}


@pytest.mark.parametrize("obj, category", [
    ("/x/src/tideloop/_core.cpython-311-x86_64-linux-gnu.so", "loop"),
    ("/v/lib/python3.11/site-packages/uvloop/loop.cpython-311-x86_64-linux-gnu.so", "loop"),
    ("/v/lib/python3.11/site-packages/httptools/parser/parser.cpython-311.so", "framework"),
    ("/v/lib/python3.11/site-packages/asyncpg/protocol/protocol.cpython-311.so", "framework"),
    ("/v/lib/libpython3.11.so.1.0", "interpreter"),
    ("/v/lib/python3.11/lib-dynload/_asyncio.cpython-311-x86_64-linux-gnu.so", "interpreter"),
    ("/usr/lib/x86_64-linux-gnu/libc.so.6", "libc"),
    ("???", "other"),
])
def test_callgrind_categories(cg, obj, category):
    assert cg.classify(obj, prefixes=("/nowhere",)) == category


def _bd(**cats):
    full = dict.fromkeys(("loop", "interpreter", "framework", "libc", "other"), 0.0)
    full.update(cats)
    return {"ir_per_op": sum(full.values()), "categories": full, "functions": {}}


def test_callgrind_verdict_names_where_the_difference_is(cg):
    in_loop = cg.compare(_bd(loop=3000, interpreter=10000), _bd(loop=1000, interpreter=10500))
    assert in_loop["largest"] == "loop" and in_loop["in_loop"]
    assert in_loop["gap_ir_per_op"] == 1500
    assert "most of the extra instructions are in the loop" in in_loop["verdict"]
    # tideloop without its loop's 3000: 10000 of uvloop's 11500
    assert in_loop["free_loop_bound"] == pytest.approx(10000 / 11500)
    outside = cg.compare(_bd(loop=900, interpreter=12000), _bd(loop=1000, interpreter=10000))
    assert outside["largest"] == "interpreter" and not outside["in_loop"]
    assert "outside the loop, in interpreter" in outside["verdict"]
    fewer = cg.compare(_bd(loop=500, interpreter=10000), _bd(loop=2000, interpreter=10000))
    assert fewer["gap_ir_per_op"] < 0
    assert "fewer user-space instructions" in fewer["verdict"]
