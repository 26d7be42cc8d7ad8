"""Per-task accounting and the task-leak report (re-exported by
tideloop.diagnostics; the live view reads them too)."""
from __future__ import annotations

import asyncio
import atexit
import weakref

from . import _diag_state as _st

TRACKING_OFF = ("task tracking is off for this loop: TIDELOOP_DIAGNOSTICS=tasks "
                "(or tideloop.diagnostics.track_tasks()) turns it on")


def track_tasks(on=True, origins=False, loop=None):
    """Account each Task of the loop: CPU time (the sum of its steps'
    durations; an eager task's first step, run inside ``create_task``,
    counts as its own and not its creator's), steps, age, time since its
    last step, and whether it finished with nobody waiting for it or
    holding it (see :func:`task_leaks`).  Turns
    callback timing on while set.  ``origins``: also record where each task
    was created (the innermost frame outside asyncio that called
    ``create_task``; a frame walk per task).  Off forgets what was
    tracked.  Returns the previous setting.

    Tasks created before tracking began are seen from their next step on
    (their age counts from then)."""
    return _st.check_loop(loop)._set_task_tracking(bool(on), bool(origins))


def _state(task):
    if not task.done():
        return "pending"
    return "cancelled" if task.cancelled() else "done"


def _origin(task, origin):
    if origin is not None:
        return tuple(origin)
    tb = getattr(task, "_source_traceback", None)    # asyncio's debug mode
    for frame in reversed(tb or ()):
        if not frame.filename.startswith(_st.ASYNCIO_DIR):
            return (frame.filename, frame.lineno)
    return None


def _coro_name(task):
    coro = task.get_coro()
    return getattr(coro, "__qualname__", None) or type(coro).__name__


def _stats(loop):
    stats = loop._task_stats()
    if stats is None:
        raise RuntimeError(TRACKING_OFF)
    return stats


def task_stats(loop=None):
    """Every tracked Task that is still alive, as dicts: ``task`` (its
    name), ``id`` (``id()`` of the Task), ``coroutine`` (qualified name),
    ``state`` (pending, done, cancelled), ``cpu`` (s), ``steps``, ``age``
    (s since created), ``idle`` (s since its last step ended), ``origin``
    ((filename, line) where created, or None).  Call it on the loop's
    thread (another thread: ``loop.call_soon_threadsafe``)."""
    loop = _st.check_loop(loop)
    live, _, _ = _stats(loop)
    now = loop.time()
    return [{"task": task.get_name(), "id": id(task), "coroutine": _coro_name(task),
             "state": _state(task), "cpu": cpu, "steps": steps, "age": now - created,
             "idle": now - last, "origin": _origin(task, origin)}
            for task, cpu, steps, created, last, _, _, _, origin in live]


def top_tasks(n=10, loop=None):
    """The n tracked Tasks with the most CPU time, most first (see
    :func:`task_stats`)."""
    return sorted(task_stats(loop), key=lambda t: t["cpu"], reverse=True)[:n]


def _awaited(live):
    """ids of the tasks something waits for: awaited by a task (its
    ``_fut_waiter``), or with a done callback (an await, gather, wait,
    TaskGroup or run_until_complete)."""
    out = set()
    for row in live:
        task = row[0]
        waiter = getattr(task, "_fut_waiter", None)
        if waiter is not None:
            out.add(id(waiter))
        if not task.done() and getattr(task, "_callbacks", None):
            out.add(id(task))
    return out


def _add(table, key, task, extra=None, n=1):
    g = table.setdefault(key, dict({"count": 0, "tasks": []}, **(extra or {})))
    g["count"] += n
    if task is not None and len(g["tasks"]) < 5:
        g["tasks"].append(task.get_name())
    return g


def task_leaks(pending_for=60.0, loop=None):
    """Tasks that look leaked, grouped by coroutine and origin:
    ``unwaited`` -- tasks that finished while nobody waited for them (no
    done callback: not awaited, gathered, in a TaskGroup or waited on) and
    nobody held them (so that nobody could await them later):
    fire-and-forget tasks whose result or exception was lost, counted
    whether collected since or not; ``pending`` -- long-pending tasks:
    still pending after ``pending_for`` seconds with nothing waiting for
    them (not awaited by a task, no done callback) and not the task that
    asks.  A long-lived task that a live task awaits (a server's main
    task, workers gathered by it) is neither.  Unwaited tasks of asyncio's
    own coroutines are left out (asyncio starts some such tasks by
    design).  Each
    group: ``coroutine``, ``origin``, ``count``, ``tasks`` (names of up to
    5 live ones) and, for pending ones, ``oldest`` (s).  ``untracked``:
    tasks not tracked (over 65,536 alive at once)."""
    loop = _st.check_loop(loop)
    live, gone, untracked = _stats(loop)
    now = loop.time()
    caller = asyncio.current_task(loop)
    awaited = _awaited(live)
    pending, unwaited = {}, {}
    for task, _, _, created, _, finished, unwaited_flag, qualname, origin in live:
        if unwaited_flag:
            _add(unwaited, (qualname or _coro_name(task), _origin(task, origin)), task)
        elif (not finished and not task.done() and now - created >= pending_for
              and task is not caller and id(task) not in awaited):
            g = _add(pending, (_coro_name(task), _origin(task, origin)), task, {"oldest": 0.0})
            g["oldest"] = max(g["oldest"], now - created)
    for (qualname, origin), count in gone.items():
        key = (qualname, tuple(origin) if origin else None)
        _add(unwaited, key, None, n=count)

    def groups(table):
        out = [dict(coroutine=q, origin=o, **g) for (q, o), g in table.items()]
        return sorted(out, key=lambda g: g["count"], reverse=True)
    return {"pending": groups(pending), "unwaited": groups(unwaited), "untracked": untracked}


_leak_log = _st.RateLimit("task-leak")


def _log_group(kind, group, suffix, when):
    where = "%s:%d" % group["origin"] if group["origin"] else "an unknown line"
    names = (": " + ", ".join(group["tasks"])) if group["tasks"] else ""
    if kind == "pending":
        _st.logger.warning(
            "Long-pending tasks%s: %d task(s) of %s (created at %s) pending for up to "
            "%.1f s that no task awaits%s; a task meant to run for good is fine, else "
            "await or cancel it%s", when, group["count"], group["coroutine"], where,
            group["oldest"], names, suffix, extra={"tideloop_task_leak": group})
    else:
        _st.logger.warning(
            "Task leak%s: %d task(s) of %s (created at %s) finished with nobody awaiting "
            "them, their results and exceptions lost%s; keep a reference and await them "
            "(or use a TaskGroup)%s", when, group["count"], group["coroutine"], where,
            names, suffix, extra={"tideloop_task_leak": group})


def report_task_leaks(pending_for=60.0, loop=None):
    """:func:`task_leaks`, each group logged on :data:`logger` (WARNING,
    ``extra={"tideloop_task_leak": group}``, rate-limited) and handed to
    subscribers (kind ``"task_leak"``, the group with a ``kind`` key:
    pending or unwaited).  Returns the report."""
    return _report_leaks(pending_for, _st.check_loop(loop), "")


def _report_leaks(pending_for, loop, when):
    report = task_leaks(pending_for, loop)
    for kind in ("unwaited", "pending"):
        for group in report[kind]:
            group = dict(group, kind=kind)
            _st.publish("task_leak", loop, group)
            suffix = _leak_log.admit(loop)
            if suffix is not None:
                _log_group(kind, group, suffix, when)
    return report


# -- the report at close and at exit (TIDELOOP_DIAGNOSTICS=leaks) ------------

_at_close = weakref.WeakKeyDictionary()         # loop -> pending_for


def report_leaks_at_close(loop, pending_for=60.0):
    """Log the loop's task leaks when it closes (or at exit, if it is still
    open then): task tracking with origins is turned on."""
    track_tasks(True, origins=True, loop=loop)
    _at_close[loop] = pending_for
    loop._diag_on_close = _closing


def _closing(loop, when=" at loop close"):
    pending_for = _at_close.pop(loop, None)
    try:
        if pending_for is not None and loop._task_stats() is not None:
            _report_leaks(pending_for, loop, when)
    except Exception:       # noqa: BLE001 - a report must not stop the close
        _st.logger.exception("tideloop.diagnostics: the task-leak report failed")


@atexit.register
def _report_open_loops():
    for loop in list(_at_close):
        if not loop.is_running():
            _closing(loop, " at exit")
