"""The pytest plugin of tests/interpreters/run_suite.py (``-p tests.interpreters.si_report``).

It runs inside the isolated subinterpreter, where no object can reach the
runner: it writes one JSON object a line to the file named by
``TIDELOOP_SI_EVENTS`` (appended with one write() each, so a line is whole
even when the process dies right after it), as the run goes:

  session    the interpreter it runs in (main or not), pytest's version
  item       per collected test: nodeid, loop side ("asyncio"/"tideloop" or
             None), key (the test id without its loop parameter) and variant
             (the id of that parameter: "tideloop-openssl", ...)
  collect_error  a file that did not collect, with the message
  collect_skip   a file skipped whole, with the reason
  collected  how many tests will run
  start      a test begins (a crash after it and before its result is that test's)
  result     its outcome, the worst of its phases: passed, failed, skipped,
             xfailed, xpassed; the message (a failure's, a skip's reason)
  finish     pytest's exit status

``TIDELOOP_SI_DESELECT`` names a JSON list of node ids not to run (the tests
that a crashed earlier attempt got through, and the one that crashed).
"""
import json
import os
import sys
import time

import pytest

_fd = None
_outcomes = {}
_messages = {}
_durations = {}


def _emit(**event):
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["TIDELOOP_SI_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                      0o644)
    event["t"] = time.time()
    os.write(_fd, (json.dumps(event) + "\n").encode())


def _split(item):
    """(side, key, variant): the test's loop and its id without it."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None, item.nodeid, None
    side = callspec.params.get("loop_name")
    if side not in ("asyncio", "tideloop"):
        return None, item.nodeid, None
    ids = list(getattr(callspec, "_idlist", None) or [callspec.id])
    variant = next((i for i in ids if i == side or i.startswith(side + "-")), None)
    if variant is None:     # an id pytest made up: keep it whole
        return side, item.nodeid, callspec.id
    rest = list(ids)
    rest.remove(variant)
    base = item.nodeid[: len(item.nodeid) - len(item.name)] + item.originalname
    return side, base + (f"[{'-'.join(rest)}]" if rest else ""), variant


def _in_main_interpreter():
    from loop_helpers import IN_MAIN_INTERPRETER
    return IN_MAIN_INTERPRETER


def pytest_sessionstart(session):
    _emit(event="session", main_interpreter=_in_main_interpreter(), pytest=pytest.__version__,
          python=sys.version.split()[0])


def pytest_collectreport(report):
    if report.failed:
        _emit(event="collect_error", nodeid=report.nodeid, message=_message(report, full=True))
    elif report.skipped:        # a whole module skipped (pytest.skip(allow_module_level=True))
        _emit(event="collect_skip", nodeid=report.nodeid, message=_message(report))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    path = os.environ.get("TIDELOOP_SI_DESELECT")
    skip = set(json.load(open(path))) if path else set()
    if skip:
        drop = [i for i in items if i.nodeid in skip]
        items[:] = [i for i in items if i.nodeid not in skip]
        if drop:
            config.hook.pytest_deselected(items=drop)
    for item in items:
        side, key, variant = _split(item)
        _emit(event="item", nodeid=item.nodeid, side=side, key=key, variant=variant)
    _emit(event="collected", n=len(items))


def pytest_runtest_logstart(nodeid, location):
    _emit(event="start", nodeid=nodeid)


_RANK = {"passed": 0, "xpassed": 0, "skipped": 1, "xfailed": 1, "failed": 2}


def _message(report, full=False):
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):         # a skip: (path, line, reason)
        reason = str(longrepr[2])
        return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and not full:
        return crash.message[:2000]
    return str(longrepr)[-4000:]


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    else:
        outcome = report.outcome
    if outcome == "failed" and report.when != "call":
        message = f"error in {report.when}: {_message(report)}"
    else:
        message = _message(report) if outcome != "passed" else ""
    _durations[nodeid] = _durations.get(nodeid, 0.0) + report.duration
    previous = _outcomes.get(nodeid)
    if previous is None or _RANK[outcome] > _RANK[previous]:
        _outcomes[nodeid] = outcome
        if message or outcome == "xfailed":
            _messages[nodeid] = message or getattr(report, "wasxfail", "")
    if report.when == "teardown":
        _emit(event="result", nodeid=nodeid, outcome=_outcomes.pop(nodeid),
              message=_messages.pop(nodeid, ""), duration=round(_durations.pop(nodeid), 3))


def pytest_sessionfinish(session, exitstatus):
    _emit(event="finish", exitstatus=int(exitstatus))
