"""Small helpers shared by the behavioural tests (import as loop_helpers)."""
import re


def stop_after(loop, seconds):
    """Safety net for run_forever tests: stop the loop after `seconds`."""
    return loop.call_later(seconds, loop.stop)


def norm(text):
    """Replace object addresses so reprs of two loops can be compared."""
    return re.sub(r"0?x[0-9a-fA-F]{4,}", "0xADDR", text)
