"""`reprostack outdated [PIN...]`: per git pin, commits and days behind its policy target (bump.outdated)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ReprostackError
from . import add_source_options, fetch_options, load_lock

HELP = "per git pin: commits and days behind its policy target (table + JSON)"


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", help="pins (default: every git pin)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--out", default="out/bump", help="folder of outdated.json (default: out/bump)")
    add_source_options(p)


def run(args) -> int:
    from ..bump.outdated import error_line, outdated, plain, table, to_json, write_json

    lock, _ = load_lock(args)
    opts = fetch_options(args)
    if opts.offline:
        raise ReprostackError("outdated asks each upstream (or its --mirror) for its refs: it cannot run --offline")
    rows = outdated(lock, args.names, opts)
    out = write_json(rows, Path(args.out) / "outdated.json")
    if args.json:
        print(to_json(rows), end="")
    else:
        from .. import ui

        if ui.live_display():
            from rich.console import Console

            Console().print(table(rows))
        else:  # off a terminal (a pipe, CI, NO_COLOR): plain text, every cell whole
            print(plain(rows), end="")
        for r in rows:  # in full: a table cell would cut them
            if r.error:
                print(error_line(r), file=sys.stderr)
        print(f"json: {out.resolve()}")
    return 2 if any(r.error for r in rows) else 0
