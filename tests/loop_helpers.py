"""Small helpers shared by the behavioural tests (import as loop_helpers)."""
import os
import re
from pathlib import Path

SRC_DIR = Path(__file__).resolve().parents[1] / "src"


def stop_after(loop, seconds):
    """Safety net for run_forever tests: stop the loop after `seconds`."""
    return loop.call_later(seconds, loop.stop)


def norm(text):
    """Replace object addresses so reprs of two loops can be compared."""
    return re.sub(r"0?x[0-9a-fA-F]{4,}", "0xADDR", text)


def _tideloop_root():
    """Where the tideloop under test comes from: the in-place build in src/
    when there is one, else wherever the parent imports it (site-packages)."""
    if list((SRC_DIR / "tideloop").glob("_core*.so")):
        return SRC_DIR
    import importlib.util

    spec = importlib.util.find_spec("tideloop")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parents[1]
    return SRC_DIR


def child_env(extra=None):
    env = dict(os.environ)
    parts = [str(_tideloop_root())]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.pop("PYTHONASYNCIODEBUG", None)
    env.pop("PYTHONDEVMODE", None)
    if extra:
        env.update(extra)
    return env
