"""Property test: random programs of call_soon / call_at / cancel / stop run on
the loop produce exactly the trace of a reference model of asyncio's
``_run_once`` (snapshot of the ready queue per iteration, expired timers
appended after already-ready callbacks in deadline order, cancelled handles
skipped, stop() ends run_forever after the current iteration).

All timers are scheduled in the past (unique deadlines), so the trace does
not depend on wall-clock timing.
"""
from collections import deque

from loop_helpers import hypothesis_api

# (stand-ins in an isolated subinterpreter, where hypothesis does not load)
HealthCheck, given, settings, st = hypothesis_api()


class ModelHandle:
    def __init__(self, fn, when=None):
        self.fn = fn
        self.when = when
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


class ModelLoop:
    """Reference semantics of BaseEventLoop.run_forever/_run_once."""

    def __init__(self):
        self.ready = deque()
        self.timers = []
        self.stopping = False

    def call_soon(self, fn):
        h = ModelHandle(fn)
        self.ready.append(h)
        return h

    def call_at(self, when, fn):
        h = ModelHandle(fn, when)
        self.timers.append(h)
        return h

    def stop(self):
        self.stopping = True

    def time(self):
        return 1000.0

    def run_forever(self):
        while True:
            # every timer is in the past: all expire at this poll
            expired = sorted((h for h in self.timers if not h.cancelled), key=lambda h: h.when)
            self.timers = []
            self.ready.extend(expired)
            for _ in range(len(self.ready)):
                h = self.ready.popleft()
                if not h.cancelled:
                    h.fn()
            if self.stopping:
                break
        self.stopping = False


def run_program(engine, program, rounds=6):
    trace = []
    handles = {}
    counter = [0]
    base = engine.time() - 100.0

    def schedule(action):
        kind = action[0]
        if kind in ("soon", "at"):
            ident = counter[0]
            counter[0] += 1
            children = action[-1]

            def cb(ident=ident, children=children):
                trace.append(ident)
                for child in children:
                    schedule(child)

            if kind == "soon":
                handles[ident] = engine.call_soon(cb)
            else:
                # unique past deadline: offset groups, id breaks ties
                handles[ident] = engine.call_at(base + action[1] * 1e-3 + ident * 1e-7, cb)
        elif kind == "cancel":
            h = handles.get(action[1])
            if h is not None:
                h.cancel()
        elif kind == "stop":
            engine.stop()

    def tick(n):
        def cb():
            trace.append(("tick", n))
            if n == 0:
                engine.stop()
            else:
                engine.call_soon(tick(n - 1))
        return cb

    for action in program:
        schedule(action)
    for r in range(rounds):
        trace.append(("round", r))
        engine.call_soon(tick(2))
        engine.run_forever()
    return trace


leaf = st.one_of(
    st.just(("stop",)),
    st.tuples(st.just("cancel"), st.integers(0, 25)),
    st.tuples(st.just("soon"), st.just(())),
    st.tuples(st.just("at"), st.integers(0, 3), st.just(())),
)
actions = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.tuples(st.just("soon"), st.lists(inner, max_size=3).map(tuple)),
        st.tuples(st.just("at"), st.integers(0, 3), st.lists(inner, max_size=3).map(tuple)),
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=st.lists(actions, min_size=1, max_size=8))
def test_loop_matches_run_once_model(new_loop, program):
    expected = run_program(ModelLoop(), program)
    lp = new_loop()
    try:
        got = run_program(lp, program)
    finally:
        lp.close()
    assert got == expected


def test_model_example_fixed(new_loop):
    """A hand-written program, as a readable regression for the model test."""
    program = [
        ("soon", (("soon", ()), ("stop",))),  # id 0: when run, schedules id 4 and stops
        ("at", 1, (("cancel", 3),)),           # id 1: timer, later deadline than id 3
        ("soon", ()),                          # id 2
        ("at", 0, ()),                         # id 3: timer, earliest deadline
    ]
    expected = run_program(ModelLoop(), program)
    lp = new_loop()
    try:
        got = run_program(lp, program)
    finally:
        lp.close()
    assert got == expected
    # ready callbacks first, then expired timers in deadline order
    assert got[:7] == [("round", 0), 0, 2, ("tick", 2), 3, 1, ("round", 1)]
