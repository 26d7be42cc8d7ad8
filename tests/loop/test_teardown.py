"""Interpreter exit with tideloop loaded, under the debug allocator and in
development mode (`python -X dev`, `PYTHONMALLOC=debug`): the ways the asyncio
documentation tells users to debug.  Module teardown must free every
recycled object while the types they point to are alive; a use-after-free
there crashed every program at exit (rc 139, '*** OUCH')."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loop_helpers import child_env

ROOT = Path(__file__).resolve().parents[2]

PROGRAMS = {
    "issue-one-liner": """
        import tideloop
        l = tideloop.new_event_loop(); l.call_soon(l.stop); l.run_forever(); l.close()
    """,
    # Handles and timer handles on the freelist, a loop left unclosed
    # (closed by __del__ at exit), a live TCP transport.
    "busy-then-exit": """
        import asyncio, socket, tideloop
        async def main():
            loop = asyncio.get_running_loop()
            for _ in range(3000):
                loop.call_soon(int)
                loop.call_later(0, int).cancel()
            await asyncio.sleep(0)
            srv = await asyncio.start_server(lambda r, w: w.write(b"x"), "127.0.0.1", 0)
            r, w = await asyncio.open_connection(*srv.sockets[0].getsockname())
            assert await r.read(1) == b"x"
            w.close(); srv.close()
        tideloop.run(main())
        leftover = tideloop.new_event_loop()
        leftover.call_later(10, int)
    """,
    # The module objects dropped before the loops that reference them.
    "modules-cleared-first": """
        import sys, gc, tideloop
        loops = [tideloop.new_event_loop() for _ in range(3)]
        for l in loops:
            l.call_soon(int); l.call_later(1, int)
        del sys.modules["tideloop._core"], sys.modules["tideloop"]
        gc.collect()
        for l in loops:
            l.close()
        del loops
        gc.collect()
    """,
}


@pytest.mark.parametrize("flags", [("-X", "dev"), ()], ids=["dev", "plain"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_clean_exit_under_debug_allocator(name, flags):
    code = textwrap.dedent(PROGRAMS[name])
    proc = subprocess.run(
        [sys.executable, *flags, "-W", "ignore::ResourceWarning", "-c", code],
        capture_output=True, text=True, timeout=60,
        env=child_env({"PYTHONMALLOC": "debug"}))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "OUCH" not in proc.stderr
    assert "Debug memory block" not in proc.stderr
    assert "Fatal Python error" not in proc.stderr


def test_memcheck_verdict_fails_on_an_error_in_our_frames(tmp_path):
    """tools/memcheck_verdict.py (CI's valgrind step) fails on an error with a
    frame in the extension, passes on interpreter-only errors and leaks."""
    def report(frames_xml, kind="InvalidRead"):
        return f"""<?xml version="1.0"?>
<valgrindoutput>
<pid>100</pid>
<ppid>99</ppid>
<status><state>RUNNING</state></status>
<error><kind>UninitValue</kind><what>x</what><stack>
  <frame><fn>gc_collect</fn><obj>/usr/bin/python3.11</obj></frame></stack></error>
<error><kind>{kind}</kind><what>Invalid read of size 8</what><stack>
{frames_xml}</stack></error>
<status><state>FINISHED</state></status>
</valgrindoutput>"""
    ours = ("<frame><fn>PyObject_GC_Del</fn><obj>/usr/lib/libpython3.11.so</obj></frame>"
            "<frame><fn>tl_handle_free_list</fn><obj>/x/site-packages/tideloop/"
            "_core.cpython-311-x86_64-linux-gnu.so</obj><dir>/b/src/tideloop/_core</dir>"
            "<file>handle.c</file><line>232</line></frame>")
    theirs = "<frame><fn>PyObject_GC_Del</fn><obj>/usr/lib/libpython3.11.so</obj></frame>"
    tool = [sys.executable, str(ROOT / "tools" / "memcheck_verdict.py")]
    cases = [(ours, "InvalidRead", 0, 1), (theirs, "InvalidRead", 0, 0),
             (ours, "Leak_PossiblyLost", 0, 0), (theirs, "InvalidRead", 139, 1)]
    for frames, kind, prog_rc, want in cases:
        xml = tmp_path / "r.xml"
        xml.write_text(report(frames, kind))
        p = subprocess.run(tool + [str(xml), "--ours", "tideloop/_core", "--main-ppid", "99",
                                   "--pytest-rc", str(prog_rc)],
                           capture_output=True, text=True)
        assert p.returncode == want, (frames, kind, prog_rc, p.stdout)
    # The main process died mid-run: its report stops early.
    xml.write_text("<valgrindoutput><pid>100</pid><ppid>99</ppid><status><state>RUNNING</state>")
    p = subprocess.run(tool + [str(xml), "--ours", "tideloop/_core", "--main-ppid", "99"],
                       capture_output=True, text=True)
    assert p.returncode == 1
    # A forked child's report may stop early; an error in it still counts.
    main_ok = tmp_path / "main.xml"
    main_ok.write_text(report(theirs))
    child = tmp_path / "child.xml"
    child.write_text(report(ours).replace("<pid>100</pid>", "<pid>101</pid>")
                     .replace("<ppid>99</ppid>", "<ppid>100</ppid>")
                     .split("<status><state>FINISHED")[0])
    opts = ["--ours", "tideloop/_core", "--main-ppid", "99"]
    assert subprocess.run(tool + opts + [str(main_ok)], capture_output=True).returncode == 0
    assert subprocess.run(tool + opts + [str(main_ok), str(child)],
                          capture_output=True).returncode == 1
