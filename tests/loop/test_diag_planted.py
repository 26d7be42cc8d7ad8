"""The diagnostics on a program with planted faults, run as a user would:
``python -m tideloop run examples/price_service.py`` with
TIDELOOP_DIAGNOSTICS set, in a child process; the reports are read from its
standard error.  (Tideloop only: the diagnostics are tideloop's.)

The program: every fourth price lookup blocks in ``time.sleep(0.2)`` (line
30), in a step of a ``fetch_price`` task created at line 47; every request
starts a fire-and-forget ``audit`` task at line 40; its long-lived tasks
(main, two workers, a ticker, the feeder) are gathered for the life of the
service.
"""
import json
import os
import subprocess
import sys
import time

from loop_helpers import child_env

PROGRAM = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples",
                       "price_service.py")
PROGRAM = os.path.abspath(PROGRAM)
SLEEP_LINE, AUDIT_LINE, FETCH_LINE = 30, 40, 47
TIMEOUT = 60


def run(spec, *args):
    r = subprocess.run([sys.executable, "-m", "tideloop", "run", PROGRAM, *args],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env=child_env({"TIDELOOP_DIAGNOSTICS": spec}))
    assert r.returncode == 0, r
    return r


def records(stderr, start):
    """The log records (with their continuation lines) that start so."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith(" "):
            out.append(line)
        elif out:
            out[-1] += "\n" + line
    return [r for r in out if r.startswith(start)]


def test_a_planted_stall_gives_one_report_naming_the_blocking_line():
    r = run("stalls=0.1,slow=0.15,tasks=origins")
    assert r.stdout == "served 12\n"
    stalls = records(r.stderr, "Event loop blocked for ")
    # Three lookups blocked: one report each, and no second, weaker one.
    assert len(stalls) == 3, r.stderr
    assert records(r.stderr, "Slow callback") == [], r.stderr
    for report in stalls:
        head, _, stack = report.partition("\n")
        # The blocking file:line and function, the task and where it was made.
        assert ("at %s:%d in lookup_price: time.sleep(0.2)" % (PROGRAM, SLEEP_LINE)) in head
        assert ("(fetch_price, created at %s:%d)" % (PROGRAM, FETCH_LINE)) in head
        assert " in task 'Task-" in head
        # The stack starts at the program, not at the runner's frames.
        assert stack.startswith('  File "%s", line ' % PROGRAM), stack
        assert "<frozen runpy>" not in stack and "__main__.py" not in stack
        assert stack.rstrip().endswith("time.sleep(0.2)                         "
                                       "# planted: blocks the loop")


def test_a_stall_report_alone_names_the_task_too():
    r = run("stalls=0.1")
    stalls = records(r.stderr, "Event loop blocked for ")
    assert len(stalls) == 3, r.stderr
    for report in stalls:
        head = report.partition("\n")[0]
        assert " in task 'Task-" in head and "(fetch_price) at %s:%d in lookup_price" % (
            PROGRAM, SLEEP_LINE) in head, head


def test_the_reports_the_rate_limit_held_back_are_counted():
    # 12 stalls: 10 logged in the minute, the last 2 counted at exit.
    r = run("stalls=0.1", "--requests", "48")
    assert len(records(r.stderr, "Event loop blocked for ")) == 10, r.stderr
    assert r.stderr.rstrip().endswith(
        "\n2 more stall reports held back by the log's rate limit (10 a minute per loop) "
        "and not logged"), r.stderr


def test_a_slow_step_without_a_stall_names_where_it_ended():
    # No watchdog: the slow-callback report alone says where the step
    # ended -- here the return from the finished task, never "-".
    r = run("slow=0.15")
    slow = records(r.stderr, "Slow callback: ")
    assert len(slow) == 3, r.stderr
    for report in slow:
        assert "step of task 'Task-" in report and "(fetch_price" in report
        assert "ended with the task done, at fetch_price (%s:42)" % PROGRAM in report, report
        assert " to -" not in report and "at -" not in report


def test_the_leak_report_at_close_names_the_fire_and_forget_tasks_only():
    r = run("leaks=0.3")
    leaks = records(r.stderr, "Task leak")
    assert leaks == ["Task leak at loop close: 12 task(s) of audit (created at %s:%d) finished "
                     "with nobody awaiting them, their results and exceptions lost; keep a "
                     "reference and await them (or use a TaskGroup)" % (PROGRAM, AUDIT_LINE)]
    assert "Long-pending" not in r.stderr, r.stderr


def test_a_leak_report_asked_for_by_a_task_of_a_running_server():
    # The asking task, main and the workers it gathers are long-lived, not leaks.
    r = run("tasks=origins", "--report")
    report = json.loads(r.stdout.splitlines()[0])
    assert report == {"pending": [], "unwaited": [["audit", 12, AUDIT_LINE]]}
    assert "Long-pending" not in r.stderr and "worker" not in r.stderr, r.stderr


def test_top_flags_the_suspected_leaks(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env = child_env({"TIDELOOP_DIAGNOSTICS": "serve,tasks=origins",
                     "XDG_RUNTIME_DIR": str(run_dir)})
    proc = subprocess.Popen([sys.executable, "-m", "tideloop", "run", PROGRAM,
                             "--seconds", "20"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        path = run_dir / "tideloop" / ("%d.sock" % proc.pid)
        deadline = time.monotonic() + TIMEOUT
        out = ""
        while "12 x audit" not in out and time.monotonic() < deadline:
            time.sleep(0.3)
            if not path.exists():
                continue
            top = subprocess.run([sys.executable, "-m", "tideloop", "top", str(proc.pid),
                                  "--once", "--interval", "0.2"], capture_output=True,
                                 text=True, env=env, timeout=TIMEOUT)
            out = top.stdout
    finally:
        proc.kill()
        proc.communicate()
    assert ("\n  LEAKS    finished with nobody awaiting them (results and exceptions lost):\n"
            "        12 x audit, created at ") in out, out
    assert out.split("LEAKS")[1].split("\n")[1].endswith("price_service.py:%d" % AUDIT_LINE)
    for name in ("worker", "ticker", "feed", "main"):
        assert "x %s," % name not in out, out


def test_the_environment_typo_warns_once_and_the_program_runs_on():
    r = run("stall=0.05,stalls=abc,leaks")
    assert r.stdout == "served 12\n"
    warned = records(r.stderr, "TIDELOOP_DIAGNOSTICS: ignoring")
    assert len(warned) == 2, r.stderr
    assert "'stall=0.05': unknown setting (did you mean 'stalls'?)" in warned[0]
    assert "'stalls=abc': not a number: 'abc'" in warned[1]
    assert all("stalls=SECONDS" in w for w in warned)
    assert len(records(r.stderr, "Task leak at loop close: 12 task(s) of audit")) == 1




def test_the_leak_report_comes_at_exit_for_a_loop_never_closed(tmp_path):
    prog = tmp_path / "never_closed.py"
    prog.write_text(
        "import asyncio\n"
        "async def forgotten():\n"
        "    return 1\n"
        "async def main():\n"
        "    asyncio.create_task(forgotten())\n"
        "    await asyncio.sleep(0.01)\n"
        "loop = asyncio.new_event_loop()\n"
        "loop.run_until_complete(main())\n")
    r = subprocess.run([sys.executable, "-m", "tideloop", "run", str(prog)],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env=child_env({"TIDELOOP_DIAGNOSTICS": "leaks"}))
    assert r.returncode == 0, r
    assert records(r.stderr, "Task leak") == [
        "Task leak at exit: 1 task(s) of forgotten (created at %s:5) finished with nobody "
        "awaiting them, their results and exceptions lost; keep a reference and await them "
        "(or use a TaskGroup)" % prog], r.stderr
