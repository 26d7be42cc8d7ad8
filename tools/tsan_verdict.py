#!/usr/bin/env python3
"""Read ThreadSanitizer logs and decide: exit 0 when no report has a frame of
ours, no process crashed and pytest passed; 1 otherwise.

    python tools/tsan_verdict.py LOG... [--suppressions FILE] [--pytest-rc N]
        [--json OUT]

LOG: TSan's log_path files (one per process, tsan.PID), or any text holding
reports (a pytest log, when TSan wrote to stderr).  A report is a
"WARNING: ThreadSanitizer: KIND" block up to its closing "=====" line; a
crash is TSan's "==PID==ERROR: ThreadSanitizer: SEGV ..." block.

A frame is ours when its module is tideloop's extension (_core.*.so) or its
source file is under tideloop/_core/.  Each report is one of:

  tideloop   an access (or crash) stack has a frame of ours with no Python
             evaluation frame above it: our C code made the access, or a C
             function it called directly did.  Fails the run; never
             suppressed (a suppression that would match is named).
  beneath    frames of ours only below a Python evaluation frame (Python code
             that our loop was running made the access: every callback runs
             under the loop's C frames), or only in the allocation and
             thread-creation stacks.  Listed, not failed on.
  cpython    no frame of ours at all.  Listed, not failed on.

The suppressions (TSan's own format: "race:PATTERN", "race_top:PATTERN",
"thread:", "mutex:", "signal:", "deadlock:"; "#" comments) are applied here,
the way TSan applies them (race: any frame of any stack, by function, file or
module; race_top: the top frame of a stack; * wildcards, ^ and $ anchors),
to the reports that are not "tideloop": TSan itself is given none, so that a
too broad suppression cannot hide one of ours.

Dedup: tideloop reports by kind and the top frame of ours of each access
stack (the first stack of each is printed); the others by kind and top frame.
"""
import argparse
import collections
import json
import os
import re
import sys

OURS_MODULE = re.compile(r"^_core(\..*)?\.so$")
OURS_PATH = "tideloop/_core/"
# A Python frame being evaluated: what is above it is that Python code's doing.
EVAL_FUNCS = ("_PyEval_EvalFrameDefault", "_PyEval_EvalFrame", "PyEval_EvalCode",
              "_PyEval_Vector")

SEP = re.compile(r"^={10,}\s*$")
WARNING = re.compile(r"^WARNING: ThreadSanitizer: (.*?)(?: \(pid=(\d+)\))?\s*$")
CRASH = re.compile(r"^==(\d+)==ERROR: ThreadSanitizer: (.*?)\s*$")
FATAL = re.compile(r"^(?:==\d+==)?(?:FATAL: ThreadSanitizer|ThreadSanitizer: CHECK failed)(.*)$")
PYFATAL = re.compile(r"Fatal Python error: (.*)$")
FRAME = re.compile(r"^\s+#(\d+) (.*?) \(([^()]*?)\+0x[0-9a-f]+\)\s*$")
FRAME_NOMOD = re.compile(r"^\s+#(\d+) (.*?)\s*$")
SECTION = re.compile(r"^  (\S.*?):?\s*$")
ACCESS = re.compile(r"^(Previous )?(Atomic )?(read|write|Read|Write)\b")
CONTEXT = re.compile(r"^(Thread T\d+|Main thread|Location is|Mutex M\d+ \(.*\) created at)")

SUPP_TYPES = {
    "data race": "race", "heap-use-after-free": "race", "race on vptr": "race",
    "heap-use-after-free (virtual call vs free)": "race",
    "thread leak": "thread",
    "lock-order-inversion (potential deadlock)": "deadlock",
    "signal-unsafe call inside of a signal": "signal",
    "signal handler spoils errno": "signal",
}
KNOWN_SUPP = {"race", "race_top", "thread", "mutex", "signal", "deadlock", "called_from_lib"}


def supp_type(kind):
    if kind in SUPP_TYPES:
        return SUPP_TYPES[kind]
    return "mutex" if "mutex" in kind else None


def parse_frame(line):
    m = FRAME.match(line)
    if m:
        idx, mid, module = m.groups()
    else:
        m = FRAME_NOMOD.match(line)
        if not m:
            return None
        (idx, mid), module = m.groups(), ""
    func, _, where = mid.rpartition(" ")
    if not func or not ("/" in where or ":" in where or where == "<null>"):
        func, where = mid, ""
    if where == "<null>":
        where = ""
    return {"n": int(idx), "func": func, "file": where, "module": module}


class Report:
    def __init__(self, kind, pid, source, crash=False):
        self.kind, self.pid, self.source, self.crash = kind, pid, source, crash
        self.lines = []
        self.stacks = []    # (section header, [frames])

    def add(self, line):
        self.lines.append(line)
        fr = parse_frame(line)
        if fr is not None and line.startswith("    #"):
            if not self.stacks or (fr["n"] == 0 and self.stacks[-1][1]):
                self.stacks.append(("", []))
            self.stacks[-1][1].append(fr)
            return
        m = SECTION.match(line)
        if m and not line.startswith("   "):
            self.stacks.append((m.group(1), []))

    def access_stacks(self):
        if self.kind == "signal handler spoils errno":
            # the handler is the top frame; below it, whatever it interrupted
            return [fs[:1] for _, fs in self.stacks if fs][:1]
        if self.crash:
            return [fs for _, fs in self.stacks if fs][:1]
        acc = [fs for head, fs in self.stacks if fs and ACCESS.match(head)]
        if acc:
            return acc
        # lock-order inversion, mutex misuse: the stacks of the acts reported
        # (not where a thread was created or a block allocated), else the first
        # (a thread leak has only its thread's creation stack)
        acts = [fs for head, fs in self.stacks
                if fs and not CONTEXT.match(head)]
        return acts or [fs for _, fs in self.stacks if fs][:1]


def read_reports(path):
    reports, fatal, pyfatal = [], [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    cur = None
    for line in lines:
        if cur is not None:
            if SEP.match(line) or (cur.crash and re.match(r"^==\d+==ABORTING", line)):
                reports.append(cur)
                cur = None
                continue
            cur.add(line)
            if cur.crash and line.startswith("SUMMARY: ThreadSanitizer"):
                reports.append(cur)
                cur = None
            continue
        m = WARNING.match(line)
        if m:
            cur = Report(m.group(1), m.group(2), path)
            cur.lines.append(line)
            continue
        m = CRASH.match(line)
        if m:
            # "SEGV on unknown address 0x10 (pc ...)": the kind without addresses
            kind = re.sub(r"\s*(\(pc .*\)|0x[0-9a-f]+)", "", m.group(2)).strip()
            cur = Report(kind, m.group(1), path, crash=True)
            cur.lines.append(line)
            continue
        if FATAL.match(line):
            fatal.append(f"{path}: {line.strip()}")
        m = PYFATAL.search(line)
        if m:
            pyfatal.append(f"{path}: {line.strip()}")
    if cur is not None:      # cut short: the process died while writing it
        reports.append(cur)
    return reports, fatal, pyfatal


def is_ours(fr):
    return bool(OURS_MODULE.match(os.path.basename(fr["module"]))) or OURS_PATH in fr["file"]


def is_eval(fr):
    """A frame that what is above it is not ours: a Python evaluation frame,
    or TSan's delivery of a signal (above it runs the handler, below it the
    code the signal interrupted)."""
    return fr["func"] in EVAL_FUNCS or (
        "libtsan" in fr["module"] and ("CallUserSignalHandler" in fr["func"]
                                       or fr["func"] == "sighandler"))


def top_ours(frames):
    """The first frame of ours above any Python evaluation frame, or None."""
    for fr in frames:
        if is_ours(fr):
            return fr
        if is_eval(fr):
            return None
    return None


def classify(rep):
    if not any(fs for _, fs in rep.stacks):
        return "unknown"        # a crash cut short before its stack
    if any(top_ours(fs) for fs in rep.access_stacks()):
        return "tideloop"
    if any(is_ours(fr) for _, fs in rep.stacks for fr in fs):
        return "beneath"
    return "cpython"


def where(fr):
    f = fr["file"]
    if OURS_PATH in f:
        f = f[f.index(OURS_PATH) + len("tideloop/"):]
    else:
        f = os.path.basename(f)
    return f"{fr['func']} {f}" if f else f"{fr['func']} ({fr['module']})"


def strip_col(s):
    return re.sub(r"(:\d+):\d+$", r"\1", s)


def key_frame(frames, cls):
    """The frame a report is known by: for ours, the top frame of ours (past
    CPython's inline functions compiled into our module, to the first one in
    our own sources); else the top frame."""
    if cls != "tideloop":
        return frames[0] if frames else None
    fr = top_ours(frames)
    if fr is None or OURS_PATH in fr["file"]:
        return fr
    for f in frames[frames.index(fr):]:
        if is_eval(f):
            break
        if OURS_PATH in f["file"]:
            return f
    return fr


def func_of(fr):
    """'function file' without the line: reports are deduplicated by it."""
    return re.sub(r":\d+(:\d+)?$", "", where(fr))


def dedup_key(rep, cls):
    frames = [key_frame(fs, cls) for fs in rep.access_stacks()]
    return (rep.kind, tuple(sorted({func_of(fr) for fr in frames if fr is not None})))


def lines_of(rep, cls):
    frames = [key_frame(fs, cls) for fs in rep.access_stacks()]
    return {strip_col(where(fr)) for fr in frames if fr is not None}


# -- suppressions ---------------------------------------------------------

def read_suppressions(path):
    supps = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            typ, sep, pat = line.partition(":")
            if not sep or typ not in KNOWN_SUPP or not pat:
                raise ValueError(f"{path}:{n}: not a suppression: {raw.rstrip()}")
            supps.append({"type": typ, "pattern": pat, "text": line, "line": n,
                          "re": template_re(pat)})
    return supps


def template_re(pat):
    start, end = pat.startswith("^"), pat.endswith("$") and len(pat) > 1
    core = pat[1 if start else 0:len(pat) - 1 if end else len(pat)]
    body = ".*".join(re.escape(p) for p in core.split("*"))
    return re.compile(("^" if start else "") + body + ("$" if end else ""))


def frame_matches(s, fr):
    return any(v and s["re"].search(v) for v in (fr["func"], fr["file"], fr["module"]))


def suppression_for(rep, supps):
    stype = supp_type(rep.kind)
    if stype is None or rep.crash:
        return None
    for _, fs in rep.stacks:
        for s in supps:
            if s["type"] == stype and any(frame_matches(s, fr) for fr in fs):
                return s
    if stype == "race":
        for _, fs in rep.stacks:
            for s in supps:
                if s["type"] == "race_top" and fs and frame_matches(s, fs[0]):
                    return s
    return None


# -- verdict --------------------------------------------------------------

def _line_order(s):
    m = re.match(r"^(.*?):(\d+)$", s)
    return (m.group(1), int(m.group(2))) if m else (s, 0)


def short_block(rep, max_frames=14):
    out, shown = [], 0
    for line in rep.lines:
        if line.startswith("    #"):
            shown += 1
            if shown > max_frames:
                if shown == max_frames + 1:
                    out.append("    ...")
                continue
        else:
            shown = 0
        out.append(line)
    return out


def verdict(paths, supp_path=None, pytest_rc=0, out=print):
    supps = read_suppressions(supp_path) if supp_path else []
    reports, fatal, pyfatal = [], [], []
    for p in paths:
        r, f, pf = read_reports(p)
        reports += r
        fatal += f
        pyfatal += pf
    ours = collections.OrderedDict()        # key -> [first report, count, lines seen]
    others = collections.Counter()
    other_cls = {}
    suppressed = collections.Counter()
    too_broad = collections.Counter()
    crashes = []
    for rep in reports:
        cls = classify(rep)
        s = suppression_for(rep, supps)
        if rep.crash:
            crashes.append((rep, cls))
        if cls == "tideloop":
            if s is not None:
                too_broad[s["text"]] += 1
            key = dedup_key(rep, cls)
            entry = ours.setdefault(key, [rep, 0, set()])
            entry[1] += 1
            entry[2] |= lines_of(rep, cls)
        elif s is not None:
            suppressed[s["text"]] += 1
        elif not rep.crash:
            key = dedup_key(rep, cls)
            others[key] += 1
            other_cls[key] = cls
    n_ours = sum(c for _, c, _ in ours.values())
    n_beneath = sum(c for k, c in others.items() if other_cls[k] == "beneath")
    n_cpython = sum(c for k, c in others.items() if other_cls[k] == "cpython")
    out(f"tsan: {len(paths)} log(s), {len(reports)} report(s): {n_ours} with a frame of "
        f"tideloop ({len(ours)} distinct), {n_beneath} with tideloop frames only beneath "
        f"Python code, {n_cpython} CPython-only, {sum(suppressed.values())} suppressed; "
        f"{len(crashes)} crash(es)")
    for i, ((kind, key), (rep, count, seen)) in enumerate(ours.items(), 1):
        out("")
        out(f"tsan: tideloop report {i}/{len(ours)}: {kind} at {' / '.join(key) or '?'}"
            f"  (x{count}; first in {rep.source})")
        out(f"tsan:   lines: {', '.join(sorted(seen, key=_line_order))}")
        for line in short_block(rep):
            out("  " + line)
    if others:
        out("")
        out("tsan: reports without a frame of ours above Python code (not failed on):")
        for (kind, key), c in others.most_common():
            out(f"  {c:4d}  {other_cls[(kind, key)]:7s}  {kind}: {' / '.join(key) or '?'}")
    if suppressed:
        out("")
        out("tsan: suppressed (tools/tsan-suppressions.txt):")
        for text, c in suppressed.most_common():
            out(f"  {c:4d}  {text}")
    unused = [s["text"] for s in supps if s["text"] not in suppressed]
    if unused:
        out(f"tsan: suppressions that matched nothing: {', '.join(unused)}")
    for text, c in too_broad.items():
        out(f"tsan: suppression '{text}' also matches {c} tideloop report(s): not applied "
            f"to them (given to TSan, it would have hidden them)")
    for rep, cls in crashes:
        out(f"tsan: CRASH ({cls}): {rep.kind} in pid {rep.pid} ({rep.source})")
        if cls != "tideloop":
            for line in short_block(rep):
                out("  " + line)
    for line in fatal:
        out(f"tsan: TSan failed: {line}")
    for line in pyfatal:
        out(f"tsan: {line}")
    if pytest_rc != 0:
        out(f"tsan: pytest exited with {pytest_rc}")
    ok = not ours and not crashes and not fatal and not pyfatal and pytest_rc == 0
    out("tsan: " + ("PASS" if ok else "FAIL"))
    summary = {
        "ok": ok, "reports": len(reports), "tideloop": n_ours, "beneath": n_beneath,
        "cpython": n_cpython, "suppressed": dict(suppressed), "crashes": len(crashes),
        "tideloop_distinct": [{"kind": k, "frames": list(key), "count": c,
                               "lines": sorted(seen, key=_line_order),
                               "first": "\n".join(rep.lines)}
                              for (k, key), (rep, c, seen) in ours.items()],
        "others": [{"kind": k, "frames": list(key), "class": other_cls[(k, key)], "count": c}
                   for (k, key), c in others.most_common()],
        "fatal": fatal + pyfatal, "pytest_rc": pytest_rc,
    }
    return ok, summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="*")
    ap.add_argument("--suppressions")
    ap.add_argument("--pytest-rc", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        ok, summary = verdict(args.logs, args.suppressions, args.pytest_rc)
    except (OSError, ValueError) as exc:
        print(f"tsan_verdict: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
