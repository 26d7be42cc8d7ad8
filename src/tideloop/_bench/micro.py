"""Micro-benchmarks: stock asyncio vs uvloop vs tideloop, measured in one run.

Run it as ``python -m tideloop bench``.

How a figure is made (see "How we measure" in the architecture guide):

* every loop runs the same workload in the same process, interleaved: for each
  benchmark, repetition ``r`` runs the loops in a rotated order, so slow drift of
  the machine (thermal, other processes) is spread over all loops equally;
* each measurement gets a fresh loop, closed afterwards, after a ``gc.collect()``;
* the cyclic GC is off while a measurement runs (as ``timeit`` does; ``--gc`` keeps
  it on): with 100k live handles or 50k live tasks, generation-2 collections
  otherwise make up most of the time (uvloop's call_soon row: ~240 vs ~830 ns/op),
  and they measure the benchmark's own object count more than the loop;
* one warm-up run (a tenth of the size) per benchmark and loop is discarded;
* the clock is ``time.perf_counter_ns()``, read inside the running loop, so loop
  creation and ``run_until_complete`` start-up are not counted;
* the figure is the median over the repetitions of elapsed-ns / operations;
* the driver code that feeds the loop (scheduling 100k callbacks, posting from a
  thread) iterates in C (``deque(map(...), maxlen=0)``) and the trivial callback is
  a C no-op, so the per-operation cost is the loop's, not the benchmark's.

Standard library only (the loops are imported by name when measured; --plot
uses the source checkout's bench/plot.py).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import functools
import gc
import operator
import os
import platform
import random
import signal
import sys
import threading
import time
from collections import deque
from itertools import repeat

from . import harness
from .harness import ALL_LOOPS, RunError, exc_reason

__all__ = ["BENCHMARKS", "add_arguments", "main", "run_from_args"]

SEED = 20240611

# A callback that costs next to nothing and is the same C call for every loop:
# clearing a list that is always empty.  (A Python ``def noop(): pass`` adds
# ~20-40 ns of frame set-up per call, which would hide loop differences.)
_NOOP = [].clear
_cancel = operator.methodcaller("cancel")


class BenchTimeout(KeyboardInterrupt):
    """Raised by SIGALRM when one measurement runs too long.

    A KeyboardInterrupt subclass on purpose: asyncio's Handle._run and Task
    step re-raise KeyboardInterrupt instead of reporting it to the exception
    handler, so it unwinds out of run_until_complete on every loop.
    """


def _consume(iterable):
    deque(iterable, maxlen=0)


@functools.lru_cache(maxsize=None)
def _random_delays(n, high):
    rnd = random.Random(SEED)
    return tuple(rnd.uniform(0.0, high) for _ in range(n))


# --------------------------------------------------------------------------
# The workloads.  Each is ``async def bench(loop, n) -> elapsed_ns`` and does
# exactly ``n`` operations (the unit is documented per benchmark).
# --------------------------------------------------------------------------

CALL_SOON_BATCH = 1000


async def bench_call_soon(loop, n):
    """n x call_soon(noop) in batches of 1,000 per loop iteration, all run.

    A batch is what a busy loop's ready queue holds; the burst variant below
    puts all n in the queue at once, which mostly measures allocating n live
    handles (memory bandwidth), not the loop."""
    done = loop.create_future()
    call_soon = loop.call_soon
    batches = [CALL_SOON_BATCH] * (n // CALL_SOON_BATCH)
    if n % CALL_SOON_BATCH:
        batches.append(n % CALL_SOON_BATCH)
    it = iter(batches)

    def step():
        size = next(it, None)
        if size is None:
            done.set_result(None)
            return
        _consume(map(call_soon, repeat(_NOOP, size)))
        call_soon(step)

    t0 = time.perf_counter_ns()
    step()
    await done
    return time.perf_counter_ns() - t0


async def bench_call_soon_burst(loop, n):
    """n x call_soon(noop), all scheduled from inside one callback, all run."""
    done = loop.create_future()
    call_soon = loop.call_soon
    t0 = time.perf_counter_ns()
    _consume(map(call_soon, repeat(_NOOP, n)))
    call_soon(done.set_result, None)
    await done
    return time.perf_counter_ns() - t0


TIMER_MAX_DELAY = 0.001


async def bench_call_later(loop, n):
    """n x call_later(random delay in [0, 1 ms)), every other one cancelled,
    run until the remaining n/2 have fired."""
    delays = _random_delays(n, TIMER_MAX_DELAY)
    # handles[::2] are cancelled, so the survivors are delays[1::2].
    last = max(delays[1::2]) if n > 1 else 0.0
    expected = n // 2
    fired = []
    done = loop.create_future()

    def check():
        if len(fired) >= expected:
            done.set_result(None)
        else:   # a loop that rounds deadlines may run this one a bit early
            loop.call_soon(check)

    t0 = time.perf_counter_ns()
    handles = list(map(loop.call_later, delays, repeat(fired.append), repeat(None)))
    _consume(map(_cancel, handles[::2]))
    loop.call_later(last, check)
    await done
    elapsed = time.perf_counter_ns() - t0
    if len(fired) != expected:
        raise AssertionError(f"{len(fired)} timers fired, expected {expected}")
    return elapsed


SWITCH_TASKS = 100


async def bench_task_switch(loop, n):
    """100 tasks, each doing n/100 x ``await asyncio.sleep(0)``; unit: one switch."""
    per_task = max(1, n // SWITCH_TASKS)
    sleep = asyncio.sleep

    async def worker():
        for _ in range(per_task):
            await sleep(0)

    t0 = time.perf_counter_ns()
    tasks = [loop.create_task(worker()) for _ in range(SWITCH_TASKS)]
    for t in tasks:
        await t
    return time.perf_counter_ns() - t0


async def bench_future(loop, n):
    """n x (fut = create_future(); call_soon(fut.set_result, None); await fut)."""
    create_future = loop.create_future
    call_soon = loop.call_soon
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fut = create_future()
        call_soon(fut.set_result, None)
        await fut
    return time.perf_counter_ns() - t0


async def bench_threadsafe(loop, n):
    """Another thread posts n x call_soon_threadsafe(noop); until all ran."""
    done = loop.create_future()
    post = loop.call_soon_threadsafe

    def poster():
        try:
            _consume(map(post, repeat(_NOOP, n)))
            post(done.set_result, None)
        except BaseException as exc:
            _THREAD_ERRORS.append(exc)
            try:
                post(done.set_exception, exc)
            except BaseException:
                pass    # the loop cannot be woken: the measurement times out

    thread = threading.Thread(target=poster, name="bench-poster", daemon=True)
    t0 = time.perf_counter_ns()
    thread.start()
    try:
        await done
        return time.perf_counter_ns() - t0
    finally:
        thread.join(10)


_THREAD_ERRORS = []      # exceptions raised in bench_threadsafe's poster thread


SLEEP_MAX_DELAY = 0.05


async def bench_sleepers(loop, n):
    """n tasks each ``await asyncio.sleep(uniform(0, 0.05))`` (fixed seed);
    from the first create_task to the last task finished; unit: one task."""
    delays = _random_delays(n, SLEEP_MAX_DELAY)
    sleep = asyncio.sleep
    left = [n]
    done = loop.create_future()

    async def sleeper(delay):
        await sleep(delay)
        left[0] -= 1
        if not left[0]:
            done.set_result(None)

    t0 = time.perf_counter_ns()
    tasks = list(map(loop.create_task, map(sleeper, delays)))
    await done
    elapsed = time.perf_counter_ns() - t0
    del tasks
    return elapsed


async def bench_queue(loop, n, maxsize=1):
    """n items from a producer task to a consumer task through
    asyncio.Queue(maxsize=1): every item is a hand-off between the two tasks
    through the loop; unit: one item."""
    queue = asyncio.Queue(maxsize=maxsize)

    async def producer():
        put = queue.put
        for _ in range(n):
            await put(None)

    async def consumer():
        get = queue.get
        for _ in range(n):
            await get()

    t0 = time.perf_counter_ns()
    prod = loop.create_task(producer())
    cons = loop.create_task(consumer())
    await cons
    elapsed = time.perf_counter_ns() - t0
    await prod
    return elapsed


async def bench_queue100(loop, n):
    """As bench_queue with maxsize=100: the tasks run 100 items between
    switches, so Queue's own Python code is nearly all of the time."""
    return await bench_queue(loop, n, maxsize=100)


async def bench_eager_task(loop, n):
    """n x ``await loop.create_task(coro())`` under asyncio.eager_task_factory
    (3.12+), where coro() returns without suspending: the task runs to the end
    inside create_task, and no callback goes through the loop."""
    async def finish_at_once():
        return None

    old_factory = loop.get_task_factory()
    loop.set_task_factory(asyncio.eager_task_factory)
    create_task = loop.create_task
    try:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            task = create_task(finish_at_once())
            if not task.done():     # the loop did not let the task run eagerly
                raise AssertionError("create_task() returned an eager task that is "
                                     "not done: the task did not start eagerly")
            await task
        return time.perf_counter_ns() - t0
    finally:
        loop.set_task_factory(old_factory)


class Benchmark:
    __slots__ = ("name", "label", "func", "n", "quick_n", "target", "unit")

    def __init__(self, name, label, func, n, quick_n, target, unit):
        self.name = name          # short id, used by --only and in JSON
        self.label = label        # table row text; {n} is the size
        self.func = func
        self.n = n                # default size (operations per measurement)
        self.quick_n = quick_n    # size with --quick
        self.target = target      # pass if tideloop/uvloop <= target
        self.unit = unit          # what one "op" is


# Sizes: the default run of all rows x 3 loops x 5 repetitions takes well
# under a minute on a 2-core VM, the slowest loop (asyncio) dominating.
BENCHMARKS = (
    Benchmark("call_soon", "call_soon + run noop ({n})", bench_call_soon,
              100_000, 10_000, 0.35, "callback"),
    Benchmark("call_soon_burst", "call_soon burst, all queued ({n})",
              bench_call_soon_burst, 100_000, 10_000, None, "callback"),
    Benchmark("call_later", "call_later, half cancelled ({n})", bench_call_later,
              100_000, 10_000, 0.8, "timer scheduled"),
    Benchmark("task_switch", "task switch: sleep(0) ({n})", bench_task_switch,
              100_000, 10_000, 0.8, "switch"),
    Benchmark("future", "future via call_soon, awaited ({n})", bench_future,
              100_000, 10_000, 0.8, "future"),
    Benchmark("threadsafe", "call_soon_threadsafe ({n})", bench_threadsafe,
              100_000, 10_000, 0.8, "callback"),
    Benchmark("sleepers", "tasks sleeping to random deadlines ({n})", bench_sleepers,
              50_000, 5_000, 0.8, "task"),
    Benchmark("queue", "Queue(1) producer/consumer ({n})", bench_queue,
              50_000, 5_000, 0.8, "item"),
    Benchmark("queue100", "Queue(100) producer/consumer ({n})", bench_queue100,
              50_000, 5_000, None, "item"),
) + ((
    # Eager tasks exist from 3.12 on; on 3.11 the row is not there.  No
    # target: the loop's share is the create_task call; the rest (the Task,
    # eager_task_factory's Python frame, the coroutine) is the same on every
    # loop.
    Benchmark("eager_task", "eager create_task, done without suspending ({n})",
              bench_eager_task, 100_000, 10_000, None, "task"),
) if hasattr(asyncio, "eager_task_factory") else ())
_BY_NAME = {b.name: b for b in BENCHMARKS}


def _fmt_count(n):
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


# --------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------

def _on_alarm(signum, frame):
    raise BenchTimeout()


def _measure(spec, bench, n, timeout, keep_gc=False):
    """One measurement on a fresh loop. Returns (wall, cpu) ns/op or raises RunError."""
    gc.collect()
    gc_was_enabled = gc.isenabled()
    if not keep_gc:
        gc.disable()
    loop = spec.factory()
    errors = []

    def exception_handler(lp, context):
        errors.append(context)
        lp.stop()

    del _THREAD_ERRORS[:]
    previous = None
    use_alarm = timeout and threading.current_thread() is threading.main_thread()
    try:
        loop.set_exception_handler(exception_handler)
        if use_alarm:
            previous = signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            # Last resort if the loop sits in C and never looks at signals.
            faulthandler.dump_traceback_later(timeout + 30, exit=True)
        cpu0 = time.process_time_ns()
        elapsed = loop.run_until_complete(bench.func(loop, n))
        cpu = time.process_time_ns() - cpu0
    except BenchTimeout:
        why = f"timed out after {timeout:g} s"
        if _THREAD_ERRORS:
            why += f" (poster thread failed: {exc_reason(_THREAD_ERRORS[0])})"
        raise RunError(why) from None
    except Exception as exc:
        if errors:
            ctx = errors[0]
            detail = ctx.get("message", "")
            if ctx.get("exception") is not None:
                detail += f" ({exc_reason(ctx['exception'])})"
            raise RunError(f"exception handler called: {detail}") from None
        raise RunError(exc_reason(exc)) from None
    finally:
        if gc_was_enabled:
            gc.enable()
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.cancel_dump_traceback_later()
            signal.signal(signal.SIGALRM, previous)
        try:
            loop.close()
        except Exception:
            pass
    if errors:
        raise RunError(f"exception handler called: {errors[0].get('message', '')}")
    return elapsed / n, cpu / n


def bench_size(bench, quick, scale):
    """Operations per measurement of ``bench`` for --quick / --scale."""
    return max(2, int((bench.quick_n if quick else bench.n) * scale))


def run_benchmarks(specs, benches, repeat_count, quick, scale, timeout,
                   warmup=True, keep_gc=False, clock="wall", log=None, on_row=None):
    """Run everything; returns a list of per-benchmark result dicts.

    ``clock`` chooses the figure the table, ratios and verdicts use: "wall"
    (perf_counter_ns inside the loop) or "cpu" (process CPU time, all threads);
    both are kept in the results. ``log(text)`` gets the progress (benchmark
    name and size, a dot per repetition, a newline when done); ``on_row(row)``
    gets each result as soon as its benchmark is done."""
    names = [s.name for s in specs]
    by_name = {s.name: s for s in specs}
    results = []
    for bench in benches:
        n = bench_size(bench, quick, scale)
        errors = {}
        if log:
            log(f"  {bench.name:<12} n={n:<8}")
        if warmup:
            for spec in specs:
                try:
                    _measure(spec, bench, max(2, n // 10), timeout, keep_gc)
                except RunError as exc:
                    errors[spec.name] = str(exc)
        pairs, errors = harness.interleave(
            names, repeat_count,
            lambda name: _measure(by_name[name], bench, n, timeout, keep_gc),
            errors=errors, log=log)
        samples = {name: [wall for wall, _ in xs] for name, xs in pairs.items()}
        cpu_samples = {name: [cpu for _, cpu in xs] for name, xs in pairs.items()}
        wall = {name: harness.median(samples[name]) for name in names
                if name not in errors and samples[name]}
        cpu = {name: harness.median(cpu_samples[name]) for name in names
               if name not in errors and cpu_samples[name]}
        medians = cpu if clock == "cpu" else wall
        row = {
            "name": bench.name,
            "label": bench.label.format(n=_fmt_count(n)),
            "n": n,
            "unit": bench.unit,
            "target_vs_uvloop": bench.target,
            "clock": clock,
            "ns_per_op": medians,           # the figure of the table: wall or cpu
            "wall_ns_per_op": wall,
            "samples_ns_per_op": {k: v for k, v in samples.items() if v},
            # Process CPU time (all threads) around run_until_complete: less
            # disturbed than wall time when other work shares the machine.
            "cpu_ns_per_op": cpu,
            "cpu_samples_ns_per_op": {k: v for k, v in cpu_samples.items() if v},
            "errors": errors,
        }
        tl, aio, uv = medians.get("tideloop"), medians.get("asyncio"), medians.get("uvloop")
        row["ratio_vs_asyncio"] = harness.ratio(tl, aio)
        row["ratio_vs_uvloop"] = harness.ratio(tl, uv)
        if bench.target is None:
            row["verdict"] = "info" if "tideloop" not in errors else "ERROR"
        elif row["ratio_vs_uvloop"] is not None:
            row["verdict"] = "PASS" if row["ratio_vs_uvloop"] <= bench.target else "FAIL"
        elif "tideloop" in errors:
            row["verdict"] = "ERROR"
        else:
            row["verdict"] = None
        results.append(row)
        if log:
            log("\n")
        if on_row:
            on_row(row)
    return results


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def _fmt_ns(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}"


def _header_cells(clock, loop_names):
    first = "benchmark (CPU ns/op, median)" if clock == "cpu" else "benchmark (ns/op, median)"
    return [first] + list(loop_names) + ["tl/asyncio", "tl/uvloop", "target", "result"]


def _fmt_target(target):
    return f"<={target}x" if target else "-"


def _row_cells(r, loop_names):
    cells = [r["label"]]
    for name in loop_names:
        if name in r["errors"]:
            cells.append("ERROR")
        else:
            cells.append(_fmt_ns(r["ns_per_op"].get(name)))
    cells += [harness.fmt_ratio(r["ratio_vs_asyncio"]), harness.fmt_ratio(r["ratio_vs_uvloop"]),
              _fmt_target(r["target_vs_uvloop"]),
              harness.result_cell(r["verdict"], r["ratio_vs_asyncio"], loop_names)]
    return cells


def _table_rows(results, loop_names):
    clock = results[0]["clock"] if results else "wall"
    return _header_cells(clock, loop_names), [_row_cells(r, loop_names) for r in results]


def format_text(results, loop_names):
    return harness.text_table(*_table_rows(results, loop_names))


def format_markdown(results, loop_names):
    return harness.markdown_table(*_table_rows(results, loop_names))


class TableWriter:
    """Prints the table a row at a time, each row as soon as its benchmark is
    done (flushed), so a long run shows its figures as it goes and an
    interrupted one keeps those it made. The text table's column widths are
    fixed up front from the labels and loop names (a figure wider than its
    column shifts that row only)."""

    FIGURE_WIDTH = 8        # "123,456" ns/op and "ERROR" fit

    def __init__(self, loop_names, labels, targets, clock="wall", markdown=False,
                 stream=None):
        self.loop_names = list(loop_names)
        self.markdown = markdown
        self.stream = stream
        self.header = _header_cells(clock, self.loop_names)
        figures = [max(len(name), self.FIGURE_WIDTH) for name in self.loop_names]
        self.widths = ([max([len(self.header[0])] + [len(x) for x in labels])] + figures
                       + [len("tl/asyncio"), len("tl/uvloop"),
                          max([len("target")] + [len(_fmt_target(t)) for t in targets]),
                          len("result") if "uvloop" in self.loop_names
                          else len("100.0x faster")])

    def _print(self, line):
        stream = self.stream or sys.stdout
        print(line, file=stream)
        stream.flush()

    def start(self):
        if self.markdown:
            self._print(harness.markdown_line(self.header))
            self._print(harness.markdown_rule(len(self.header)))
        else:
            self._print(harness.text_line(self.header, self.widths))
            self._print(harness.text_rule(self.widths))

    def row(self, result):
        cells = _row_cells(result, self.loop_names)
        self._print(harness.markdown_line(cells) if self.markdown
                    else harness.text_line(cells, self.widths))


def reproduce_command(args, invocation, loop_names):
    parts = harness.command_prefix(invocation, loop_names, args.quick, args.repeat)
    if args.only:
        parts += ["--only", args.only]
    if args.scale != 1.0:
        parts += ["--scale", f"{args.scale:g}"]
    if args.gc:
        parts.append("--gc")
    if args.clock != "wall":
        parts += ["--clock", args.clock]
    if not args.warmup:
        parts.append("--no-warmup")
    return " ".join(parts)


def _environment(specs, skipped):
    cpus = harness.usable_cpus()
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": cpus,
        "git": harness.git_revision(),
        "loops": {s.name: s.info for s in specs},
        "skipped": {s.name: s.error for s in skipped},
        "dev_mode": bool(sys.flags.dev_mode),
        "asyncio_debug_env": os.environ.get("PYTHONASYNCIODEBUG", ""),
    }


_DEBUG_WARNING = ("warning: asyncio debug mode is on (-X dev / PYTHONASYNCIODEBUG); "
                  "figures are not representative")


def _plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def header_lines(args, environment, benches, started):
    """What was measured, where and how: printed above the table."""
    env = environment
    when = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started))
    lines = [f"tideloop micro-benchmarks, {when}",
             f"python:   {env['implementation']} {' '.join(sys.version.split())}",
             f"          {sys.executable or '?'}",
             f"machine:  {env['platform']}, {env['machine']}, "
             + (f"{_plural(env['cpus'], 'CPU')} usable" if env["cpus"] else "CPUs: ?")]
    if env.get("git"):
        lines.append(f"git:      {env['git']}")
    for i, (name, info) in enumerate(env["loops"].items()):
        lines.append(f"{'loops:' if i == 0 else '':<10}{name:<9} {info}")
    for name, error in env["skipped"].items():
        lines.append(f"skipped:  {name}: {error}")
    sizes = "--quick sizes" if args.quick else "full sizes"
    if args.scale != 1.0:
        sizes += f" x {args.scale:g}"
    lines.append(
        f"method:   median of {_plural(args.repeat, 'run')} per benchmark and loop, "
        f"loops interleaved, fresh loop each, "
        f"{'one warm-up run discarded' if args.warmup else 'no warm-up'}, "
        f"GC {'on' if args.gc else 'off'} while timing, "
        f"{'process CPU' if args.clock == 'cpu' else 'wall'} clock; {sizes}; "
        f"{_plural(len(benches), 'benchmark')}")
    lines += harness.verdict_legend(env["loops"], "tideloop's ns/op")
    if env["dev_mode"] or env["asyncio_debug_env"]:
        lines.append(_DEBUG_WARNING)
    return lines


def footer_lines(args):
    """How to read the table: printed below it."""
    if args.clock == "cpu":
        unit = ("CPU ns/op = process CPU time (all threads) in nanoseconds per "
                "operation: lower is better")
    else:
        unit = "ns/op = nanoseconds per operation (wall clock): lower is better"
    return [
        f"{unit}; each figure is the median over {_plural(args.repeat, 'interleaved run')}, "
        f"fresh loop each, GC {'on' if args.gc else 'off'} while timing.",
        "tl/asyncio, tl/uvloop = tideloop's time / the other loop's (below 1.00x: "
        "tideloop is faster); target = the tl/uvloop a PASS needs (this project's goal).",
    ]


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def _rows_help():
    return "; ".join(f"{b.name} (<= {b.target}x uvloop)" if b.target
                     else f"{b.name} (informational)" for b in BENCHMARKS)


def add_arguments(parser):
    harness.add_loops_option(
        parser, help="comma-separated loops to measure, from: %(default)s "
                     "(default: all; a loop that cannot be imported is skipped with a note)")
    parser.add_argument(
        "--repeat", "-r", type=int, default=None, metavar="N",
        help="repetitions per benchmark and loop; the figure is the median "
             "(default: 5, or 3 with --quick)")
    parser.add_argument(
        "--quick", action="store_true",
        help="a tenth of the default sizes: a few seconds in all, for CI smoke runs")
    parser.add_argument(
        "--only", default=None, metavar="LIST",
        help="comma-separated benchmarks to run (default: all): " + _rows_help())
    parser.add_argument(
        "--scale", type=float, default=1.0, metavar="F",
        help="multiply every benchmark size by F (default: 1)")
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="figure for the table, ratios and verdicts: wall time "
             "(perf_counter_ns, the default) or process CPU time, which other "
             "load on the machine disturbs less; JSON keeps both")
    harness.add_output_options(
        parser, json_help="also write all results (every sample, environment) as JSON to PATH",
        markdown_help="print the table as Markdown (README-ready) instead of plain text")
    parser.add_argument(
        "--plot", default=None, metavar="PATH",
        help="also draw the results as bars of each loop's speed relative to asyncio "
             "to PATH (.svg, .png) with bench/plot.py: run from the root of a tideloop "
             "source checkout; needs matplotlib: pip install 'tideloop[plot]'")
    parser.add_argument(
        "--timeout", type=float, default=120.0, metavar="S",
        help="give up on one measurement after S seconds (default: %(default)g)")
    parser.add_argument(
        "--gc", action="store_true",
        help="keep the cyclic garbage collector enabled while measuring "
             "(default: disabled during each measurement, as timeit does)")
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false",
        help="skip the discarded warm-up run per benchmark and loop")
    harness.add_verdict_options(parser)
    return parser


def _plot_module():
    """The checkout's bench/plot.py for --plot (not part of the installed
    package), or None after a usage error saying where to run from."""
    try:
        from bench import plot
    except ImportError as exc:
        harness.usage_error(
            "--plot: drawing needs bench/plot.py of a tideloop source checkout: run "
            "from its root, or save the run with --json PATH and draw it there with "
            f"python -m bench.plot PATH OUT.svg ({harness.exc_reason(exc)})")
        return None
    return plot


def build_parser(prog=None):
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Micro-benchmarks of the event loop: stock asyncio, uvloop and "
                    "tideloop, measured in one run, interleaved, median of N. "
                    "Reports ns per operation, tideloop's ratios and PASS/FAIL "
                    "against the targets (ratio to uvloop).")
    add_arguments(parser)
    return parser


def run_from_args(args, invocation=("-m", "tideloop", "bench")):
    """Run the benchmarks for parsed ``args``; returns the exit status."""
    started = time.time()
    if args.repeat is None:
        args.repeat = 3 if args.quick else 5
    if args.repeat < 1:
        return harness.usage_error("--repeat must be at least 1")
    if args.scale <= 0:
        return harness.usage_error("--scale must be positive")
    plot = None
    if args.plot:
        plot = _plot_module()
        if plot is None:
            return 2
        bad_plot = plot.check_plot_option(args.plot)
        if bad_plot is not None:
            return bad_plot

    wanted = harness.expand_loops(args.loops)
    if not wanted:
        return harness.usage_error("--loops names no loop")
    benches = list(BENCHMARKS)
    if args.only:
        chosen = harness.pick(args.only, _BY_NAME, "benchmark")
        if chosen is None:
            return 2
        benches = [_BY_NAME[name] for name in chosen]

    specs, skipped = [], []
    for name in wanted:
        spec = harness.load_loop(name)
        (skipped if spec.error else specs).append(spec)
    if not specs:
        for spec in skipped:
            print(f"note: skipping {spec.name}: {spec.error}", file=sys.stderr)
        print("no loop to measure", file=sys.stderr)
        return 2
    loop_names = [s.name for s in specs]
    environment = _environment(specs, skipped)

    debug = sys.flags.dev_mode or os.environ.get("PYTHONASYNCIODEBUG")
    if debug:
        print(_DEBUG_WARNING, file=sys.stderr)

    # Everything that says what was measured goes to stdout with the table, so
    # that a saved table (python -m tideloop bench > out.txt) carries it;
    # stderr only gets the progress.
    for line in header_lines(args, environment, benches, started):
        print(line)
    print(flush=True)

    log = harness.Progress()

    table = TableWriter(loop_names,
                        [b.label.format(n=_fmt_count(bench_size(b, args.quick, args.scale)))
                         for b in benches],
                        [b.target for b in benches], clock=args.clock,
                        markdown=args.markdown)
    table.start()
    results = run_benchmarks(specs, benches, args.repeat, args.quick, args.scale,
                             args.timeout, warmup=args.warmup, keep_gc=args.gc,
                             clock=args.clock, log=log, on_row=table.row)
    elapsed = time.time() - started
    command = reproduce_command(args, invocation, loop_names)

    print()
    for r in results:
        for name, err in r["errors"].items():
            print(f"error: {r['name']} on {name}: {err}")
    for spec in skipped:
        print(f"note: {spec.name} skipped: {spec.error}")
    if args.verbose:
        for r in results:
            for name, xs in r["samples_ns_per_op"].items():
                cpu = r["cpu_samples_ns_per_op"].get(name, [])
                print(f"samples {r['name']:<12} {name:<9} wall "
                      + " ".join(_fmt_ns(x) for x in xs)
                      + "  cpu " + " ".join(_fmt_ns(x) for x in cpu))
    for line in footer_lines(args):
        print(line)
    harness.print_reproduce(command, elapsed)

    doc = harness.json_head("tideloop-microbench/1", command, started, elapsed)
    doc.update({
        "repeat": args.repeat,
        "quick": args.quick,
        "scale": args.scale,
        "gc_enabled_while_measuring": args.gc,
        "clock": args.clock,
        "warmup": args.warmup,
        "environment": environment,
        "results": results,
    })
    if args.json:
        harness.write_json(args.json, doc)
    if plot is not None and plot.draw_run(doc, args.plot):
        return 1

    return harness.missed(results) if args.fail_on_miss else 0


def main(argv=None, prog=None, invocation=("-m", "tideloop", "bench")):
    args = build_parser(prog).parse_args(argv)
    return run_from_args(args, invocation)

