"""A pytest plugin (loaded by conftest.py): progress for long files (issue 29 item 11).

Under `-q` a file of slow tests (serving, containers) prints one dot per test, minutes apart. Every PROGRESS_S
seconds ($REPROSTACK_TEST_PROGRESS_S, default 30) of the run, the next test to finish prints one line saying where
its file is: `[progress] tests/test_gate_serving.py: 12 of 40 tests, 65 s in this file, 4 min 10 s in all`.

Invariants:
- per-file state (first start, tests done): with pytest-xdist (`nox -s tests` runs files on 2 workers) the reports
  of two files interleave in the controller, and a file's time and count never reset when the other file reports;
- the counts come from collection: this process's own, or under xdist the first worker's collected ids (every
  worker collects the same items); a file whose count is not known says `?`, never a guess;
- only the process that writes the terminal prints (under xdist the controller; the workers' hooks are quiet).
"""

from __future__ import annotations

import os
import time


def _fmt(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


PROGRESS_S = float(os.environ.get("REPROSTACK_TEST_PROGRESS_S") or 30)
_progress: dict = {"per_file": {}, "started": {}, "done": {}, "last": 0.0, "start": 0.0}


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _count(nodeids) -> dict:
    counts: dict = {}
    for n in nodeids:
        counts[_file(n)] = counts.get(_file(n), 0) + 1
    return counts


def pytest_collection_modifyitems(session, config, items):
    _progress["per_file"] = _count(it.nodeid for it in items)


def pytest_sessionstart(session):
    _progress["start"] = _progress["last"] = time.monotonic()


def pytest_configure(config):
    _progress["config"] = config
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistCounts(), "reprostack-progress-xdist")


class _XdistCounts:
    """pytest-xdist's controller hook (registered only where xdist is installed: an unknown hook is an error)."""

    def pytest_xdist_node_collection_finished(self, node, ids):
        if not _progress["per_file"]:
            _progress["per_file"] = _count(ids)


def pytest_runtest_logstart(nodeid, location):
    _progress["started"].setdefault(_file(nodeid), time.monotonic())


def pytest_runtest_logfinish(nodeid, location):
    now, p, f = time.monotonic(), _progress, _file(nodeid)
    p["done"][f] = p["done"].get(f, 0) + 1
    if now - p["last"] < PROGRESS_S:
        return
    rep = _terminal()
    if rep is None:
        return
    p["last"] = now
    rep.write("\n")  # the dots of -q run on one line: the progress line on its own
    rep.write_line(
        f"[progress] {f}: {p['done'][f]} of {p['per_file'].get(f, '?')} tests, "
        f"{_fmt(now - p['started'].get(f, now))} in this file, {_fmt(now - p['start'])} in all"
    )


def _terminal():
    cfg = _progress.get("config")
    if cfg is None or hasattr(cfg, "workerinput"):  # an xdist worker: the controller prints
        return None
    return cfg.pluginmanager.get_plugin("terminalreporter")
