"""`reprostack history [--out DIR] [--db PATH] [--no-plots] [--all] [FOLDER ...]`: ingest, compare, print, plot.

Every `*.json` under the folders (default: the project's results/; symlinked folders are not followed) is read
as a gate report (reader.read_report). A JSON document that is not a gate report (summary.json, an AIPerf
export) is passed over. A bad report does not stop the others: it is one line `skipped FILE: why` on stderr,
nothing of it is stored, and the command exits 2 at the end (after ingesting, printing and plotting the good
ones), so a script sees that an input was refused; a stored row the history cannot use is skipped the same way
(one line naming it, exit 2). A folder named on the command line that does not exist, or a database that cannot
be used (damaged, not SQLite, newer schema, not a history), is one error line and exit 2 before anything is
written. Otherwise exit 0: regressions are reported, not an exit status (the history holds old regressions too;
a bump PR shows its own comparison).

Where it writes: the database and the page go to the reprostack cache (`<cache>/history/history.sqlite3`,
`<cache>/history/page/`), never into the clone: the committed page results/history/ is written only when asked
(`--out results/history`, or `reprostack docs --page`), and a page whose index.html holds plots is never replaced
by one without them (matplotlib missing here: one line, exit 2, nothing written). A folder where index.html should
be, a read-only or locked database: one line each, exit 2.

What it prints (stdout), short by default: the summary line (N reports, M metrics, K flagged), the flagged
regressions first, one line per metric with intervals, then where the page is; `--all` adds every run of every
metric. Progress goes to stderr (reprostack.ui: a live display on a terminal, plain lines elsewhere). Without
matplotlib (the README's plain install) the PNGs are skipped with one line saying how to get them; the page
(index.html, its tables) is still written.

Invariants: the file's sha256 is computed before it is parsed, so a report already stored costs one read and
no parse; new reports go into the database in batches of INGEST_BATCH, each one transaction (10,000 reports:
ten transactions, not 10,000 fsyncs).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from .. import paths, ui
from ..errors import ReprostackError
from . import compare, render
from .reader import NotAReport, ReportError, parse_report, read_bytes
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


INGEST_BATCH = 1000  # reports read, parsed and stored per transaction


def ingest(store: Store, files: list[Path], warn=None, progress=None) -> tuple[int, int, int, list[str]]:
    """(new, already stored, not reports, skipped lines) of ingesting `files`; `warn(line)` is called per skip,
    `progress()` once per file. A file whose sha256 is stored is not parsed again; new reports are stored
    INGEST_BATCH at a time, each batch one transaction. (Worker processes for the parsing were tried and dropped:
    on the busy 2-core CI machine they made 10,000 reports slower, not faster.)"""
    new = known = other = 0
    skipped: list[str] = []
    stored = store.ids()
    batch: list = []
    for f in files:
        try:
            shown, raw = read_bytes(f)
            sha = hashlib.sha256(raw).hexdigest()
            if sha in stored:
                known += 1
                continue
            rec = parse_report(shown, raw)
        except NotAReport:
            other += 1
            continue
        except ReportError as e:
            line = f"skipped {e}"
            skipped.append(line)
            if warn:
                warn(line)
            continue
        finally:
            if progress:
                progress()
        stored.add(sha)
        batch.append(rec)
        if len(batch) >= INGEST_BATCH:
            new += store.ingest_many(batch)
            batch = []
    if batch:
        new += store.ingest_many(batch)
    return new, known, other, skipped


class _Ticks:
    """Advances a ui step: every item on a live display; plain lines at most every PLAIN_EVERY_S seconds (a long
    ingest shows it is alive, a short one prints only its start and end lines)."""

    PLAIN_EVERY_S = 5.0

    def __init__(self, step):
        self.step, self.live, self.pending, self.last = step, ui.live_display(), 0, time.monotonic()

    def __call__(self) -> None:
        self.pending += 1
        now = time.monotonic()
        if self.live or now - self.last >= self.PLAIN_EVERY_S:
            self.step.advance(self.pending)
            self.pending, self.last = 0, now


def default_page() -> Path:
    """`<cache>/history/page/`: the page of a plain `reprostack history` (outside the clone)."""
    return default_db().parent / "page"


def check_page(out_dir: Path) -> None:
    """Refuse, before anything is written, a page folder that cannot take the page: a file in its place, a folder
    where index.html goes, or (matplotlib missing) an index.html with plots that a tables-only page would strip."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ReprostackError(f"--out {out_dir}: exists and is not a folder")
    index = out_dir / "index.html"
    if index.is_dir() or (index.exists() and not index.is_file()):
        raise ReprostackError(f"--out {out_dir}: {index} is a folder (or not a file); move it away")
    missing = render.plots_missing()
    if missing is not None and index.is_file() and b"data:image/png" in index.read_bytes()[: 64 << 20]:
        raise ReprostackError(
            f"--out {out_dir}: its index.html has plots and {missing}: a tables-only page would strip them; "
            f"pip install -e '.[plots]' in this checkout, or --no-plots, or another --out"
        )


def run(folders: list[str], out: str | None, db: str | None, plots: bool = True, full: bool = False) -> int:
    root = paths.project_root()
    given = [Path(f) for f in folders]
    for f in given:
        if not f.exists():
            raise ReprostackError(f"{f}: no such folder or report")
    if not given and (root / "results").is_dir():
        given = [root / "results"]
    db_path = Path(db) if db else default_db()
    out_dir = Path(out) if out else default_page()
    if plots:
        check_page(out_dir)

    def warn(line: str) -> None:
        ui.info(line)

    with Store.open(db_path) as store:
        files = scan(given, exclude=out_dir)
        with ui.step("history: ingest", total=len(files), unit="file") as st:
            new, known, other, skipped = ingest(store, files, warn=warn, progress=_Ticks(st))
        reports, _ = store.count()
        with ui.step("history: compare"):
            series = compare.analyse(store)
        for line in store.skipped_rows:
            warn(line)
        bad_rows = list(store.skipped_rows)
    written = []
    if plots:
        with ui.step("history: page", total=len(series), unit="plot") as st:
            written = render.write(series, out_dir, reports=reports, progress=_Ticks(st), warn=warn)
    print(render.short(series, reports, full=full), end="")
    print(
        f"ingested: {new} new, {known} already stored, {other} other JSON file(s) passed over, "
        f"{len(skipped)} skipped; database {db_path}"
    )
    if plots:
        pngs = sum(1 for p in written if p.suffix == ".png")
        missing = render.plots_missing()
        print(
            f"page: {written[-1]} with {pngs} PNG(s)"
            if missing is None
            else f"page: {written[-1]} (tables only: {missing}; for the PNGs: pip install -e '.[plots]' "
            f"in this checkout)"
        )
    if not full:
        print("every run of every metric: reprostack history --all")
    if skipped or bad_rows:
        what = [f"{len(skipped)} report(s)"] if skipped else []
        what += [f"{len(bad_rows)} stored row(s)"] if bad_rows else []
        print(f"history: {' and '.join(what)} skipped (named above); exit 2", file=sys.stderr)
        return 2
    return 0
