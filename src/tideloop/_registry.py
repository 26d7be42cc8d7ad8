"""Every tideloop loop alive, for tideloop.diagnostics.loops() (the live view
lists them without the program naming them).

A small module of its own so that the loop (which registers itself) and the
diagnostics (which read the list) share it without importing each other.
"""

import threading
import weakref

# id -> weak reference.  Loops are made and freed in any thread (a WeakSet
# changes size under an iteration in another thread); the lock is reentrant
# because a loop freed while the lock is held runs its weak reference's
# callback there.
_LOOPS = {}
_LOOPS_LOCK = threading.RLock()


def _forget(ref, _loops=_LOOPS, _lock=_LOOPS_LOCK):
    with _lock:
        for key, value in list(_loops.items()):
            if value is ref:
                del _loops[key]


def register(loop):
    """Count ``loop`` among the live ones until it is freed."""
    with _LOOPS_LOCK:
        _LOOPS[id(loop)] = weakref.ref(loop, _forget)


def live_loops():
    """The loops alive now (strong references, in no particular order)."""
    with _LOOPS_LOCK:
        refs = list(_LOOPS.values())
    return [lp for lp in (r() for r in refs) if lp is not None]
