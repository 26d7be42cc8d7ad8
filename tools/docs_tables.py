#!/usr/bin/env python3
"""Fill the generated regions of the documentation from the result files.

    python tools/docs_tables.py            # rewrite every generated region
    python tools/docs_tables.py --check    # exit 1 if one is out of date

A region is the text between a line ``<!-- generated: NAME ... -->`` and the
next ``<!-- end generated -->``; NAME selects the generator below, which
reads a file under results/.  Figures in the docs come from those files and
nowhere else.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

import matrix  # noqa: E402  (tools/matrix.py, beside this script: the table's one definition)

DOCS = ["README.md"]
REGION = re.compile(r"(<!-- generated: (\w+)[^\n]*-->\n)(.*?)(<!-- end generated -->)", re.S)


def _load(name):
    with open(os.path.join(REPO, "results", name)) as f:
        return json.load(f)


def matrix_table():
    return matrix.markdown_report(_load("matrix.json"))


GENERATORS = {"matrix": matrix_table}


def render(text):
    def fill(m):
        name = m.group(2)
        if name not in GENERATORS:
            raise SystemExit(f"docs_tables: no generator named {name!r}")
        return m.group(1) + GENERATORS[name]().rstrip("\n") + "\n" + m.group(4)
    return REGION.sub(fill, text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if out of date")
    args = ap.parse_args(argv)
    stale = []
    for rel in DOCS:
        path = os.path.join(REPO, rel)
        with open(path) as f:
            text = f.read()
        new = render(text)
        if new != text:
            stale.append(rel)
            if not args.check:
                with open(path, "w") as f:
                    f.write(new)
    if args.check and stale:
        print("docs_tables: out of date: " + ", ".join(stale) +
              " (run python tools/docs_tables.py)", file=sys.stderr)
        return 1
    print("docs_tables: " + ("up to date" if not stale else "rewrote " + ", ".join(stale)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
