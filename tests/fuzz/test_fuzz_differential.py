"""Differential fuzzing: random programs run on stock asyncio AND on tideloop
must produce identical traces.

Each example builds a fresh loop of each kind inside the test body (the
parametrised ``loop_name`` fixture is deliberately not used) and compares the
ordered list of events.  Only orders asyncio itself guarantees are compared:

* call_soon is FIFO; a callback stop()ped ends run_forever after the current
  iteration;
* timers sit on a grid of ``STEP`` (2 ms) with unique slots per program, so
  their deadlines differ by >= 2 ms and soon-chains (microseconds) finish long
  before the next timer is due;
* tasks start in creation order; tasks woken by one future wake in the order
  they started waiting on it;
* readers: within one step only the multiset of (reader, bytes) is compared,
  never the order in which the selector reported the fds.

Wall-clock timing can still (very rarely, e.g. a multi-ms pause on a loaded
box) flip a grid order, so on a mismatch both loops are re-run; a real
difference is deterministic and reproduces every time.

Long mode: ``TIDELOOP_FUZZ_EXAMPLES=5000``.
"""
import asyncio
import gc
import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loop_helpers import SLOW

# A 2 ms grid; wider where the tests run slower (a free-threaded build, a
# sanitizer or valgrind run), whose hiccups reorder timers 2 ms apart.
STEP = 0.002 * SLOW
MAX_EXAMPLES = int(os.environ.get("TIDELOOP_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ATTEMPTS = 5


def _stock():
    return asyncio.SelectorEventLoop()


def _tide():
    import tideloop  # plain import: a broken build must FAIL, not skip

    return tideloop.new_event_loop()


def _run_on(factory, runner, program):
    loop = factory()
    loop.set_debug(False)
    was_enabled = gc.isenabled()
    gc.disable()  # avoid multi-ms pauses that could reorder the timer grid
    try:
        return runner(loop, program)
    finally:
        if was_enabled:
            gc.enable()
        if not loop.is_closed():
            loop.close()
        asyncio.set_event_loop(None)


def differential(runner, program):
    """Run program on both loops; assert identical traces (retry on mismatch
    so that only reproducible differences fail)."""
    last = None
    for _ in range(ATTEMPTS):
        expected = _run_on(_stock, runner, program)
        got = _run_on(_tide, runner, program)
        if expected == got:
            return expected
        last = (expected, got)
    expected, got = last
    assert got == expected, f"program={program!r}"


# ---------------------------------------------------------------------------
# 1. callbacks: call_soon / call_later / call_at / cancel / stop / raise
# ---------------------------------------------------------------------------

cb_action = st.deferred(
    lambda: st.one_of(
        st.tuples(st.just("soon"), st.lists(cb_action, max_size=3)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("stop")),
        st.tuples(st.just("raise"), st.sampled_from(["ValueError", "KeyError"])),
    )
)
nested_actions = st.lists(cb_action, max_size=3)
top_action = st.one_of(
    st.tuples(st.just("soon"), nested_actions),
    st.tuples(st.just("later"), st.integers(0, 3), nested_actions),
    st.tuples(st.just("at"), st.integers(0, 3), nested_actions),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("stop")),
)
cb_programs = st.lists(top_action, min_size=1, max_size=10)


def run_callbacks(loop, program):
    trace = []
    handles = []
    counter = [0]
    used_slots = set()
    base = loop.time()
    EXC = {"ValueError": ValueError, "KeyError": KeyError}

    def handler(lp, ctx):
        exc = ctx.get("exception")
        trace.append(("handler", type(exc).__name__ if exc else ctx.get("message")))

    loop.set_exception_handler(handler)

    def make_cb(ident, children):
        def cb(*args):
            trace.append(("run", ident, args))
            for child in children:
                do(child)
        return cb

    def do(action):
        kind = action[0]
        if kind == "soon":
            ident = counter[0]
            counter[0] += 1
            handles.append(loop.call_soon(make_cb(ident, action[-1]), ident))
        elif kind in ("later", "at"):
            slot = action[1]
            if slot in used_slots:
                # unique deadlines only: equal ones have no guaranteed order
                return do(("soon", action[-1]))
            used_slots.add(slot)
            ident = counter[0]
            counter[0] += 1
            cb = make_cb(ident, action[-1])
            if kind == "later":
                h = loop.call_later(slot * STEP, cb, ident)
            else:
                h = loop.call_at(base + slot * STEP, cb, ident)
            trace.append(("timer", ident))
            handles.append(h)
        elif kind == "cancel":
            if handles:
                h = handles[action[1] % len(handles)]
                h.cancel()
                trace.append(("cancel", action[1] % len(handles), h.cancelled()))
        elif kind == "stop":
            loop.stop()
            trace.append(("stop",))
        elif kind == "raise":
            trace.append(("raise", action[1]))
            raise EXC[action[1]]("boom")

    for action in program:
        do(action)

    final = []

    def finish():
        final.append(True)
        trace.append(("final",))
        loop.stop()

    loop.call_at(base + 6 * STEP, finish)
    runs = 0
    while not final and runs < 50:
        loop.run_forever()
        runs += 1
        trace.append(("returned", runs))
    trace.append(("cancelled", [h.cancelled() for h in handles]))
    return trace


@FUZZ
@given(cb_programs)
def test_callbacks_differential(program):
    differential(run_callbacks, program)


# ---------------------------------------------------------------------------
# 2. tasks and futures: sleep(0 / small), raise, cancel each other,
#    futures resolved / failed / cancelled, awaiting tasks and futures
# ---------------------------------------------------------------------------

N_FUTS = 3
GATE_SLOTS = (2, 4, 6)  # gates fire at 4, 8, 12 ms
SLEEP_SLOTS = (1, 3, 5)  # first-op sleeps end at 2, 6, 10 ms

task_op = st.one_of(
    st.tuples(st.just("sleep0")),
    st.tuples(st.just("sleep"), st.sampled_from(SLEEP_SLOTS)),
    st.tuples(st.just("gate"), st.integers(0, len(GATE_SLOTS) - 1)),
    st.tuples(st.just("await_fut"), st.integers(0, N_FUTS - 1)),
    st.tuples(st.just("set_result"), st.integers(0, N_FUTS - 1)),
    st.tuples(st.just("set_exc"), st.integers(0, N_FUTS - 1)),
    st.tuples(st.just("cancel_fut"), st.integers(0, N_FUTS - 1)),
    st.tuples(st.just("cancel_task"), st.integers(0, 5)),
    st.tuples(st.just("await_task"), st.integers(0, 5)),
    st.tuples(st.just("raise")),
    st.tuples(st.just("catch_cancel_sleep0")),
)
task_programs = st.lists(st.lists(task_op, max_size=6), min_size=1, max_size=5)


def _normalise_tasks(program):
    """Make timing deterministic: a real sleep(k*STEP) only as a task's first
    op with a slot unique in the program; otherwise it becomes sleep(0)."""
    used = set()
    out = []
    for ops in program:
        new = []
        for pos, op in enumerate(ops):
            if op[0] == "sleep":
                if pos == 0 and op[1] not in used:
                    used.add(op[1])
                else:
                    op = ("sleep0",)
            new.append(op)
        out.append(new)
    return out


def _outcome(fut):
    if not fut.done():
        return "pending"
    if fut.cancelled():
        return "cancelled"
    exc = fut.exception()
    if exc is not None:
        return ("exc", type(exc).__name__)
    return ("result", fut.result())


def run_tasks(loop, program):
    program = _normalise_tasks(program)
    trace = []

    def handler(lp, ctx):
        exc = ctx.get("exception")
        trace.append(("handler", type(exc).__name__ if exc else ctx.get("message")))

    loop.set_exception_handler(handler)

    async def main():
        base = loop.time()
        futs = [loop.create_future() for _ in range(N_FUTS)]
        gates = [loop.create_future() for _ in GATE_SLOTS]

        def open_gate(k):
            if not gates[k].done():
                gates[k].set_result(k)
            trace.append(("gate", k))

        for k, slot in enumerate(GATE_SLOTS):
            loop.call_at(base + slot * STEP, open_gate, k)

        tasks = []

        async def guarded(i, what, aw):
            try:
                r = await aw
            except asyncio.CancelledError:
                trace.append((i, what, "cancelled"))
                raise
            except Exception as e:
                trace.append((i, what, "exc", type(e).__name__))
            else:
                trace.append((i, what, "ok", r))

        async def body(i, ops):
            trace.append((i, "start"))
            for op in ops:
                kind = op[0]
                if kind == "sleep0":
                    await guarded(i, "sleep0", asyncio.sleep(0))
                elif kind == "sleep":
                    await guarded(i, "sleep", asyncio.sleep(op[1] * STEP, op[1]))
                elif kind == "gate":
                    await guarded(i, ("gate", op[1]), gates[op[1]])
                elif kind == "await_fut":
                    await guarded(i, ("fut", op[1]), futs[op[1]])
                elif kind == "set_result":
                    try:
                        futs[op[1]].set_result((i, op[1]))
                        trace.append((i, "set_result", op[1]))
                    except asyncio.InvalidStateError:
                        trace.append((i, "set_result", op[1], "ISE"))
                elif kind == "set_exc":
                    try:
                        futs[op[1]].set_exception(KeyError(i))
                        trace.append((i, "set_exc", op[1]))
                    except asyncio.InvalidStateError:
                        trace.append((i, "set_exc", op[1], "ISE"))
                elif kind == "cancel_fut":
                    trace.append((i, "cancel_fut", op[1], futs[op[1]].cancel()))
                elif kind == "cancel_task":
                    j = op[1] % len(tasks)
                    trace.append((i, "cancel_task", j, tasks[j].cancel()))
                elif kind == "await_task":
                    j = op[1] % len(tasks)
                    if j < i:  # acyclic
                        await guarded(i, ("task", j), tasks[j])
                elif kind == "raise":
                    trace.append((i, "raise"))
                    raise ValueError(i)
                elif kind == "catch_cancel_sleep0":
                    try:
                        await asyncio.sleep(0)
                        trace.append((i, "ccs", "ok"))
                    except asyncio.CancelledError:
                        trace.append((i, "ccs", "swallowed"))
            trace.append((i, "end"))
            return i

        def done_cb(t):
            trace.append(("done_cb", tasks.index(t), _outcome(t)))

        for i, ops in enumerate(program):
            t = loop.create_task(body(i, ops))
            t.add_done_callback(done_cb)
            tasks.append(t)
        for k, f in enumerate(futs):
            f.add_done_callback(lambda f, k=k: trace.append(("fut_cb", k, _outcome(f))))

        done, pending = await asyncio.wait(tasks, timeout=(max(GATE_SLOTS) + 4) * STEP)
        trace.append(("pending", sorted(tasks.index(t) for t in pending)))
        # In task order: a set's order follows object addresses, which
        # differ between runs (and would reorder the cancellation callbacks).
        for t in sorted(pending, key=tasks.index):
            t.cancel()
        if pending:
            await asyncio.wait(pending)
        trace.append(("tasks", [_outcome(t) for t in tasks]))
        for f in futs:
            if not f.done():
                f.cancel()
        await asyncio.sleep(0)
        # let every gate's timer fire so the tail does not depend on timing
        await asyncio.sleep(max(0.0, base + (max(GATE_SLOTS) + 1) * STEP - loop.time()))
        trace.append(("futs", [_outcome(f) for f in futs]))
        trace.append(("gates", [_outcome(g) for g in gates]))

    loop.run_until_complete(main())
    return trace


@FUZZ
@given(task_programs)
def test_tasks_futures_differential(program):
    differential(run_tasks, program)


# ---------------------------------------------------------------------------
# 3. readers on socketpairs: bytes written before each step, readers read them
# ---------------------------------------------------------------------------

N_PAIRS = 3
reader_op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, N_PAIRS - 1), st.booleans()),
    st.tuples(st.just("remove"), st.integers(0, N_PAIRS - 1)),
    st.tuples(st.just("write"), st.integers(0, N_PAIRS - 1), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("close"), st.integers(0, N_PAIRS - 1)),
    st.tuples(st.just("soon"),),
)
reader_programs = st.lists(st.lists(reader_op, max_size=6), min_size=1, max_size=5)


def run_readers(loop, program):
    trace = []
    pairs = [socket.socketpair() for _ in range(N_PAIRS)]
    for a, b in pairs:
        a.setblocking(False)
        b.setblocking(False)
    closed = set()
    labels = [0] * N_PAIRS
    try:
        for step_no, step in enumerate(program):
            got = {}  # pair -> list of (label, bytes)

            def make_reader(p, label, oneshot):
                def on_readable():
                    try:
                        data = pairs[p][0].recv(65536)
                    except BlockingIOError:
                        data = None
                    got.setdefault(p, []).append((label, data))
                    if data == b"" or oneshot:
                        loop.remove_reader(pairs[p][0].fileno())
                return on_readable

            # ops before the step (writes go straight into the kernel buffer)
            for op in step:
                kind = op[0]
                p = op[1] if len(op) > 1 else None
                if kind == "add":
                    labels[p] += 1
                    loop.add_reader(pairs[p][0].fileno(), make_reader(p, labels[p], op[2]))
                    trace.append((step_no, "add", p, labels[p]))
                elif kind == "remove":
                    trace.append((step_no, "remove", p, loop.remove_reader(pairs[p][0].fileno())))
                elif kind == "write" and p not in closed:
                    pairs[p][1].send(op[2])
                    trace.append((step_no, "write", p, op[2]))
                elif kind == "close" and p not in closed:
                    closed.add(p)
                    pairs[p][1].close()
                    trace.append((step_no, "close", p))
                elif kind == "soon":
                    loop.call_soon(trace.append, (step_no, "soon"))

            # run the step: enough iterations for every ready fd to be seen
            async def settle():
                for _ in range(4):
                    await asyncio.sleep(0)
                await asyncio.sleep(STEP)
                for _ in range(2):
                    await asyncio.sleep(0)

            loop.run_until_complete(settle())
            # per step: compare the multiset of reads, never the fd order;
            # concatenate per reader so split recvs do not matter
            summary = []
            for p in sorted(got):
                per_label = {}
                for label, data in got[p]:
                    per_label.setdefault(label, []).append(data)
                for label in sorted(per_label):
                    datas = per_label[label]
                    blob = b"".join(d for d in datas if d)
                    summary.append((p, label, blob, b"" in datas, None in datas))
            trace.append((step_no, "reads", summary))
        for p in range(N_PAIRS):
            loop.remove_reader(pairs[p][0].fileno())
    finally:
        for a, b in pairs:
            a.close()
            b.close()
    return trace


@FUZZ
@given(reader_programs)
def test_readers_differential(program):
    differential(run_readers, program)


# ---------------------------------------------------------------------------
# sanity: the harness actually produces non-trivial traces
# ---------------------------------------------------------------------------


def test_harness_smoke():
    t = differential(run_callbacks, [("soon", [("soon", [])]), ("later", 1, [("stop",)]), ("at", 2, [])])
    assert ("final",) in t and any(e[0] == "run" for e in t)
    t = differential(run_tasks, [[("sleep0",), ("raise",)], [("cancel_task", 0), ("await_fut", 0)]])
    assert any(e[0] == "tasks" for e in t)
    t = differential(run_readers, [[("add", 0, False), ("write", 0, b"xy")], [("close", 0)]])
    assert any(e[1] == "reads" and e[2] for e in t)
