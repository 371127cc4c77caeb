"""A pytest plugin (loaded by conftest.py): under pytest-xdist the longest test files start first (issue 38 item 6).

`nox -s tests` / `nox -s tests_all` spread the files over 2 workers, one file per worker at a time (`--dist
loadfile`). xdist's own order hands out the files with the most tests first, which is not the longest first: on the
2-core CI machine the pyxis rehearsal (3 tests, the longest file) started last and ran alone at the end while the
other worker sat idle (results/bench/suite-ci-fresh-2026-12-06T102528Z.json: 1,058 s of tests in a 612 s pytest run
on 2 workers). With `--no-loadscope-reorder` (noxfile.xdist_args) xdist keeps the collection order, and this plugin
orders the collection longest file first (a greedy longest-processing-time schedule) by the seconds each file took
in the newest whole-suite timing record, results/bench/suite-*.json (scripts/bench_suite.py; the median over its
runs). A file the record does not know (new since) is placed as if it took the record's median file time.

Invariants:
- only the order of files changes, never what runs: every collected test is kept, and a file's tests keep their
  order (a stable sort by file);
- only on an xdist worker (every worker reads the same record, so all collect the same order, which xdist checks);
  a run in one process (`-p no:xdist`, `REPROSTACK_TEST_WORKERS=0`) keeps pytest's own order;
- no record, or none for the whole suite, or one that does not read: pytest's order, never an error.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results" / "bench"


SELECTING = ("-m", "-k", "--deselect", "--ignore", "--lf", "--last-failed")


def _whole_suite(rec) -> bool:
    """A record of every tier (`.ci/run` or `nox -s tests_all`), not of a selection (`-m unit`, `-k`, files)."""
    args = [str(a) for a in rec.get("pytest_args") or []]
    paths = [a for a in args if not a.startswith("-") and ("/" in a or "::" in a or a.startswith("tests"))]
    picked = bool(paths) or any(a.startswith(SELECTING) or ".py" in a for a in args)
    return rec.get("bench") == "suite" and not picked


def file_seconds(results: Path = RESULTS) -> dict[str, float]:
    """{test file (tests/test_x.py): median seconds over the runs} of the newest whole-suite record; {} if none."""
    newest: tuple[str, dict] | None = None
    for p in results.glob("suite-*.json"):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and _whole_suite(rec) and (newest is None or str(rec.get("started")) > newest[0]):
            newest = (str(rec.get("started")), rec)
    if newest is None:
        return {}
    per: dict[str, list[float]] = {}
    for run in newest[1].get("runs") or []:
        for f, s in (run.get("files_s") or {}).items():
            if isinstance(s, (int, float)):
                per.setdefault(f, []).append(float(s))
    return {f: statistics.median(v) for f, v in per.items()}


def longest_first(items, seconds: dict[str, float]) -> list:
    """`items` ordered by their file's recorded seconds, longest first; within a file, as collected."""
    if not seconds:
        return list(items)
    unknown = statistics.median(seconds.values())
    first_seen: dict[str, int] = {}
    for it in items:
        first_seen.setdefault(it.nodeid.split("::", 1)[0], len(first_seen))

    def key(it):
        f = it.nodeid.split("::", 1)[0]
        return (-seconds.get(f, unknown), first_seen[f])

    return sorted(items, key=key)


def pytest_collection_modifyitems(session, config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller schedules files in this order
        items[:] = longest_first(items, file_seconds())
