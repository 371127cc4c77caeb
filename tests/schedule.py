"""A pytest plugin (loaded by conftest.py): under pytest-xdist the longest test files start first (issue 38 item 6).

`nox -s tests` / `nox -s tests_all` spread the files over 2 workers, one file per worker at a time (`--dist
loadfile`). xdist's own order hands out the files with the most tests first, which is not the longest first: on the
2-core CI machine the pyxis rehearsal (3 tests, the longest file) started last and ran alone at the end while the
other worker sat idle (results/bench/suite-ci-fresh-2026-12-06T102528Z.json: 1,058 s of tests in a 612 s pytest run
on 2 workers). With `--no-loadscope-reorder` (noxfile.xdist_args) xdist keeps the collection order, and this plugin
orders the collection longest file first (a greedy longest-processing-time schedule) by the seconds each file took
in the newest whole-suite timing record, results/bench/suite-*.json (scripts/bench_suite.py; the median over its
runs). A file the record does not know (new since) is placed as if it took the record's median file time.

The files whose tests submit jobs to the local Slurm (a test or fixture of theirs takes the `slurm_alone` /
`slurm_two_nodes` fixtures of tests/test_rehearsal.py, which hold one flock across the workers) are one unit of
work: they run one after the other on one worker, so no worker sits blocked on that flock (with the longest files
first, the host-mode rehearsal could start on one worker while the pyxis rehearsal holds it on the other).

Invariants:
- only the order of files changes, never what runs: every collected test is kept, and a file's tests keep their
  order (a stable sort by file);
- only on an xdist worker (every worker reads the same record, so all collect the same order, which xdist checks);
  a run in one process (`-p no:xdist`, `REPROSTACK_TEST_WORKERS=0`) keeps pytest's own order;
- no record, or none for the whole suite, or one that does not read: pytest's order, never an error;
- the scheduler is xdist's own `--dist loadfile` one with one scope changed (the Slurm files'); any other `--dist`
  is xdist's, untouched.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

TESTS = Path(__file__).resolve().parent
RESULTS = TESTS.parent / "results" / "bench"
# a test or fixture that takes tests/test_rehearsal.py's Slurm flock fixtures (one flock across the workers)
SLURM_FIXTURES = re.compile(r"\bdef \w+\([^)]*\bslurm_(alone|two_nodes)\b")
SLURM_UNIT = "slurm jobs (one flock: one worker)"


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
    runs = newest[1].get("runs")
    for run in runs if isinstance(runs, list) else []:  # a record is a file like any other: any shape, no traceback
        files = run.get("files_s") if isinstance(run, dict) else None
        for f, s in files.items() if isinstance(files, dict) else ():
            if isinstance(s, (int, float)) and not isinstance(s, bool) and s == s and s >= 0:
                per.setdefault(str(f), []).append(float(s))
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


def slurm_files(tests: Path = TESTS) -> set[str]:
    """The test files (as nodeids name them: tests/test_x.py) with a test or fixture that takes the Slurm flock's
    fixtures."""
    root = tests.parent
    return {
        p.relative_to(root).as_posix()
        for p in sorted(tests.glob("test_*.py"))
        if SLURM_FIXTURES.search(p.read_text(encoding="utf-8", errors="replace"))
    }


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Scheduler(), "reprostack-schedule-xdist")


class _Scheduler:
    """pytest-xdist's controller hook (registered only where xdist is installed: an unknown hook is an error)."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadfile":
            return None  # xdist's own
        from xdist.scheduler import LoadFileScheduling

        together = slurm_files()

        class OneSlurmUnit(LoadFileScheduling):
            def _split_scope(self, nodeid: str) -> str:
                scope = super()._split_scope(nodeid)
                return SLURM_UNIT if scope in together else scope

        return OneSlurmUnit(config, log)
