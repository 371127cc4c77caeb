"""`reprostack history [FOLDER...]`: ingest gate reports into the SQLite history; tables, regressions, plots
(reprostack.history)."""

from __future__ import annotations

HELP = "ingest gate reports into a SQLite history; tables, regressions, plots"
DESCRIPTION = (
    "Ingest every gate report (*.json) under FOLDER (default: results/) into the "
    "history database, flag a regression where two runs' or two lock versions' 95% intervals "
    "separate (naming the pins that changed), print the flagged ones first and one line per "
    "metric (--all: every run of every metric), write index.html and one PNG per metric "
    "(matplotlib, the `plots` extra) into --out (default: the cache, never the clone). Exit 0; 2 when a report or a stored row was "
    "skipped (each named on stderr) or the database cannot be used."
)


def add_arguments(p) -> None:
    p.add_argument("folders", nargs="*", metavar="FOLDER", help="folders (or report files) to ingest")
    p.add_argument(
        "--out",
        default=None,
        help="page folder (default: <cache dir>/history/page, outside the clone; the committed page: "
        "--out results/history)",
    )
    p.add_argument("--db", default=None, help="history database (default: <cache dir>/history/history.sqlite3)")
    p.add_argument("--no-plots", action="store_true", help="ingest and print only (no page)")
    p.add_argument("--all", action="store_true", help="print every run of every metric, every regression")


def run(args) -> int:
    from ..history.command import run as history_run

    return history_run(args.folders, args.out, args.db, plots=not args.no_plots, full=args.all)
