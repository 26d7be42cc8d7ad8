"""--sabotage: known bugs planted in the stock loop, one per scenario, so the
tests can show that each scenario detects a broken loop."""

from __future__ import annotations

import os
import threading


def apply_sabotage(scenario, loop):
    from asyncio import selector_events as se, transports
    if scenario == "a":  # flip a bit in one echoed message
        orig, count = se._SelectorSocketTransport.write, [0]

        def write(self, data):
            count[0] += 1
            if count[0] == 77:
                data = bytes(data[:-1]) + bytes([data[-1] ^ 1])
            return orig(self, data)
        se._SelectorSocketTransport.write = write
    elif scenario == "b":  # leak the socket of every 10th lost connection
        orig, count = se._SelectorTransport._call_connection_lost, [0]

        def lost(self, exc):
            count[0] += 1
            if count[0] % 10 == 0:
                os.dup(self._sock.fileno())  # a copy nobody closes
            return orig(self, exc)
        se._SelectorTransport._call_connection_lost = lost
    elif scenario == "c":  # never pause the protocol
        transports._FlowControlMixin._maybe_pause_protocol = lambda self: None
    elif scenario == "d":  # swallow the EMFILE report
        orig = loop.call_exception_handler
        loop.call_exception_handler = lambda ctx: (
            None if "out of system resource" in str(ctx.get("message")) else orig(ctx))
    elif scenario == "f":  # drop every signal
        loop._handle_signal = lambda sig: None
    elif scenario == "g":  # transports neither warn nor close when collected
        se._SelectorTransport.__del__ = lambda self: None
    elif scenario == "h":  # every 10th TLS connection never reports its loss
        from asyncio import sslproto
        orig, count = sslproto.SSLProtocol.connection_lost, [0]

        def lost(self, exc):
            count[0] += 1
            if count[0] % 10 == 0:
                return
            return orig(self, exc)
        sslproto.SSLProtocol.connection_lost = lost
    elif scenario == "i":  # drop one storm callback between two worker loops
        from asyncio import base_events
        orig, count, lock = base_events.BaseEventLoop.call_soon_threadsafe, [0], threading.Lock()

        def call_soon_threadsafe(self, callback, *args, **kw):
            if getattr(callback, "__name__", None) == "on_storm":
                with lock:
                    count[0] += 1
                    drop = count[0] == 100
                if drop:
                    return None
            return orig(self, callback, *args, **kw)
        base_events.BaseEventLoop.call_soon_threadsafe = call_soon_threadsafe
    # e is sabotaged inside scenario_e (it replaces call_soon_threadsafe), j inside
    # each interpreter it makes (scenario_j)
