"""A pytest plugin (loaded by conftest.py): progress for long files (issue 29 item 11).

Under `-q` a file of slow tests (serving, containers) prints one dot per test, minutes apart. Every PROGRESS_S
seconds ($REPROSTACK_TEST_PROGRESS_S, default 30) spent in one file, one line says where the run is:
`[progress] tests/test_gate_serving.py: 12 of 40 tests, 65 s in this file, 4 min 10 s in all`.
"""

from __future__ import annotations

import os


def _fmt(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


PROGRESS_S = float(os.environ.get("REPROSTACK_TEST_PROGRESS_S") or 30)
_progress: dict = {"per_file": {}, "file": None, "file_start": 0.0, "last": 0.0, "done": 0, "start": 0.0}


def pytest_collection_modifyitems(session, config, items):
    counts: dict = {}
    for it in items:
        f = it.nodeid.split("::", 1)[0]
        counts[f] = counts.get(f, 0) + 1
    _progress["per_file"] = counts


def pytest_sessionstart(session):
    import time

    _progress["start"] = time.monotonic()


def pytest_runtest_logstart(nodeid, location):
    import time

    f = nodeid.split("::", 1)[0]
    if f != _progress["file"]:
        now = time.monotonic()
        _progress.update(file=f, file_start=now, last=now, done=0)


def pytest_runtest_logfinish(nodeid, location):
    import time

    now = time.monotonic()
    p = _progress
    p["done"] += 1
    if now - p["last"] < PROGRESS_S:
        return
    p["last"] = now
    rep = _terminal()
    if rep is not None:
        rep.write("\n")  # the dots of -q run on one line: the progress line on its own
        rep.write_line(
            f"[progress] {p['file']}: {p['done']} of {p['per_file'].get(p['file'], '?')} tests, "
            f"{_fmt(now - p['file_start'])} in this file, {_fmt(now - p['start'])} in all"
        )


def pytest_configure(config):
    _progress["config"] = config


def _terminal():
    cfg = _progress.get("config")
    return cfg.pluginmanager.get_plugin("terminalreporter") if cfg is not None else None
