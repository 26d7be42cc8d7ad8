#!/usr/bin/env python3
"""Read valgrind memcheck XML reports and decide: exit 0 when no error has a
frame in our code and the program under test ran to the end and exited
cleanly, 1 otherwise.

    python tools/memcheck_verdict.py memcheck.*.xml --ours tideloop/_core \\
        [--main-ppid PID] [--pytest-rc N]

One report per process (valgrind's --xml-file=...%p.xml): the main process
is the one whose parent is --main-ppid (the shell that started valgrind; by
default the report with the lowest pid), and its report must be complete.
Reports of forked children may stop early (a child that execs leaves
valgrind), so they are read as far as they go.

A frame is ours when its object file or its source path contains one of the
--ours substrings.  The report names each of our errors with its stack;
errors with no frame of ours (the interpreter's own: its GC and libc's
vectorised string compares trip memcheck by design) are summarised by kind.
Leaks are not judged by default: the interpreter does not free everything at
exit, and tests/stress/test_leaks.py checks ours.  --leaks judges the blocks
valgrind calls definitely lost (--leak-check=full) whose allocation stack has
a frame of ours (tools/interpreters_check.sh: the interpreters made and
destroyed by stress scenario j).
"""
import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET

ERROR_RE = re.compile(r"<error>.*?</error>", re.S)


def frames(error):
    for stack in error.iter("stack"):
        for fr in stack.iter("frame"):
            yield {
                "fn": fr.findtext("fn") or "?",
                "obj": fr.findtext("obj") or "",
                "dir": fr.findtext("dir") or "",
                "file": fr.findtext("file") or "",
                "line": fr.findtext("line") or "",
            }


def is_ours(frame, needles):
    where = " ".join((frame["obj"], frame["dir"] + "/" + frame["file"]))
    return any(n in where for n in needles)


def read_report(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    pid = re.search(r"<pid>(\d+)</pid>", text)
    ppid = re.search(r"<ppid>(\d+)</ppid>", text)
    states = re.findall(r"<state>(\w+)</state>", text)
    complete = text.rstrip().endswith("</valgrindoutput>")
    errors = []
    for m in ERROR_RE.finditer(text):
        try:
            errors.append(ET.fromstring(m.group(0)))
        except ET.ParseError:
            pass
    return {
        "path": path, "errors": errors, "complete": complete,
        "finished": bool(states) and states[-1] == "FINISHED",
        "pid": int(pid.group(1)) if pid else None,
        "ppid": int(ppid.group(1)) if ppid else None,
    }


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("xml", nargs="+")
    ap.add_argument("--ours", action="append", default=[],
                    help="substring of our object/source paths (repeatable)")
    ap.add_argument("--main-ppid", type=int, default=None)
    ap.add_argument("--pytest-rc", type=int, default=0,
                    help="exit status of the program valgrind ran")
    ap.add_argument("--leaks", action="store_true",
                    help="also fail on definitely lost blocks allocated by our code")
    ap.add_argument("--leak-ignore", action="append", default=[], metavar="FN",
                    help="with --leaks: not a leak of ours when FN is on the allocation "
                         "stack (repeatable)")
    args = ap.parse_args(argv)
    reports = []
    for path in args.xml:
        try:
            reports.append(read_report(path))
        except OSError as exc:
            print(f"memcheck: cannot read {path}: {exc}")
            return 1
    if args.main_ppid is not None:
        mains = [r for r in reports if r["ppid"] == args.main_ppid]
    else:
        mains = sorted((r for r in reports if r["pid"] is not None),
                       key=lambda r: r["pid"])[:1]
    ok = True
    if len(mains) != 1:
        print(f"memcheck: cannot tell the main process's report among {len(reports)}")
        ok = False
    elif not (mains[0]["complete"] and mains[0]["finished"]):
        # valgrind stops writing when the process dies badly.
        print(f"memcheck: the main process's report is incomplete ({mains[0]['path']})")
        ok = False
    ours, theirs = [], collections.Counter()
    for r in reports:
        for err in r["errors"]:
            kind = err.findtext("kind") or "?"
            if kind.startswith("Leak_") and not (args.leaks and kind == "Leak_DefinitelyLost"):
                continue
            fs = list(frames(err))
            if kind.startswith("Leak_") and any(f["fn"] in args.leak_ignore for f in fs):
                theirs[kind + " (ignored)"] += 1
                continue
            if any(is_ours(f, args.ours) for f in fs):
                what = err.findtext("what") or err.findtext("xwhat/text") or kind
                ours.append((r["pid"], kind, what, fs))
            else:
                theirs[kind] += 1
    for pid, kind, what, fs in ours:
        print(f"memcheck: pid {pid}: {kind}: {what}")
        for f in fs[:24]:
            loc = f"{f['file']}:{f['line']}" if f["file"] else f["obj"]
            print(f"    {f['fn']}  ({loc})")
    print(f"memcheck: {len(reports)} process report(s); {len(ours)} error(s) with a "
          f"frame in tideloop's extension; {sum(theirs.values())} in the interpreter "
          f"or libc alone" + (f" ({dict(theirs)})" if theirs else ""))
    if args.pytest_rc != 0:
        print(f"memcheck: the program under valgrind exited with {args.pytest_rc}")
    ok = ok and not ours and args.pytest_rc == 0
    print("memcheck: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
