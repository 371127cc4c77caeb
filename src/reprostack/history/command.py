"""`reprostack history [--out DIR] [--db PATH] [--no-plots] [FOLDER ...]`: ingest, compare, print, plot.

Every `*.json` under the folders (default: the project's results/; symlinked folders are not followed) is read
as a gate report (reader.read_report). A JSON document that is not a gate report (summary.json, an AIPerf
export) is passed over. A bad report does not stop the others: it is one line `skipped FILE: why` on stderr,
nothing of it is stored, and the command exits 2 at the end (after ingesting, printing and plotting the good
ones), so a script sees that an input was refused. A folder named on the command line that does not exist, or
a database that cannot be used (newer schema, not a history), is one error line and exit 2 before anything is
written. Otherwise exit 0: regressions are reported, not an exit status (the history holds old regressions
too; a bump PR shows its own comparison).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .. import paths
from ..errors import ReprostackError
from . import compare, render
from .reader import NotAReport, ReportError, read_report
from .store import Store, default_db

MAX_FILES = 100_000  # *.json files scanned per run


def scan(folders: list[Path], exclude: Path | None = None) -> list[Path]:
    """The `*.json` files under `folders` (a file named directly is taken as is), sorted, never following a
    symlinked folder, skipping `exclude` (the output folder)."""
    out: list[Path] = []
    ex = exclude.resolve() if exclude else None
    for folder in folders:
        if folder.is_file():
            out.append(folder)
            continue
        for dirpath, dirnames, filenames in os.walk(folder):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if not (ex and (here / d).resolve() == ex))
            out += [here / f for f in sorted(filenames) if f.endswith(".json")]
            if len(out) > MAX_FILES:
                raise ReprostackError(f"{folder}: more than {MAX_FILES} JSON files; name a smaller folder")
    return out


def ingest(store: Store, files: list[Path], warn=None) -> tuple[int, int, int, list[str]]:
    """(new, already stored, not reports, skipped lines) of ingesting `files`; `warn(line)` is called per skip."""
    new = known = other = 0
    skipped: list[str] = []
    for f in files:
        try:
            rec = read_report(f)
        except NotAReport:
            other += 1
            continue
        except ReportError as e:
            line = f"skipped {e}"
            skipped.append(line)
            if warn:
                warn(line)
            continue
        if store.ingest(rec):
            new += 1
        else:
            known += 1
    return new, known, other, skipped


def run(folders: list[str], out: str | None, db: str | None, plots: bool = True) -> int:
    root = paths.project_root()
    given = [Path(f) for f in folders]
    for f in given:
        if not f.exists():
            raise ReprostackError(f"{f}: no such folder or report")
    if not given and (root / "results").is_dir():
        given = [root / "results"]
    out_dir = Path(out) if out else root / "results" / "history"
    if out_dir.exists() and not out_dir.is_dir():
        raise ReprostackError(f"--out {out_dir}: exists and is not a folder")
    if plots and importlib.util.find_spec("matplotlib") is None:
        raise ReprostackError(
            "history plots need matplotlib, the `plots` extra: pip install -e '.[plots]' in this "
            "checkout, or pass --no-plots"
        )
    db_path = Path(db) if db else default_db()
    with Store.open(db_path) as store:
        files = scan(given, exclude=out_dir)
        new, known, other, skipped = ingest(store, files, warn=lambda line: print(line, file=sys.stderr))
        reports, _ = store.count()
        series = compare.analyse(store)
    print(
        f"history: {db_path}: {new} new report(s), {known} already stored, {other} other JSON file(s) passed over, "
        f"{len(skipped)} skipped; {reports} report(s), {len(series)} series"
    )
    print(render.text(series), end="")
    if plots:
        written = render.write(series, out_dir)
        print(f"plots: {len(written) - 1} PNG(s) and {written[-1]}")
    if skipped:
        print(f"history: {len(skipped)} report(s) skipped (named above); exit 2", file=sys.stderr)
        return 2
    return 0
