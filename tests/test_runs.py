"""reprostack.runs on a real file system: a new stamped folder per run, `latest` swapped atomically (a reader never
finds it missing) and moved only when a run's summary is written (issue 40: a failed fetch left `latest` on the
previous run, whose summary was then read as this run's), a `latest` that is a real folder left alone, and
abandon(): a run that wrote nothing leaves no folder; a folder given with --out is never stamped nor removed."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from reprostack import runs

WHEN = datetime(2026, 12, 2, 3, 10, 0, tzinfo=timezone.utc)


def test_default_base_is_the_nox_session_name():
    assert runs.default_base("micro") == Path("out/gate_micro")
    assert runs.default_base("nemo-rl") == Path("out/gate_nemo_rl")
    assert runs.default_base(None) == Path("out/all_gates")


def test_new_run_dir_is_new_and_leaves_latest_alone(tmp_path):
    a = runs.new_run_dir(tmp_path / "gate_micro", now=WHEN)
    b = runs.new_run_dir(tmp_path / "gate_micro", now=WHEN)  # the same second: a new folder all the same
    assert (a.name, b.name) == ("2026-12-02T03-10-00Z", "2026-12-02T03-10-00Z-2")
    assert sorted(p.name for p in (tmp_path / "gate_micro").iterdir()) == [a.name, b.name]  # no `latest` yet


def test_latest_is_swapped_atomically(tmp_path):
    base = tmp_path / "runs"
    runs.point_latest(runs.new_run_dir(base).parent, runs.latest_target(base) or sorted(os.listdir(base))[0])
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.append(os.readlink(base / "latest"))
            except FileNotFoundError:
                seen.append(None)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            (base / f"r{i}").mkdir()
            runs.point_latest(base, f"r{i}")
    finally:
        stop.set()
        t.join()
    assert None not in seen and os.readlink(base / "latest") == "r199"
    assert not [p for p in base.iterdir() if p.name.startswith(".latest")]  # no temp links left


def test_latest_that_is_a_real_folder_is_left_alone(tmp_path):
    (tmp_path / "latest").mkdir()
    (tmp_path / "latest" / "keep").write_text("x")
    with pytest.raises(OSError, match="not a symlink"):
        runs.start(tmp_path, given=False)  # before the run, not after it
    assert (tmp_path / "latest" / "keep").read_text() == "x" and os.listdir(tmp_path) == ["latest"]


def test_latest_moves_only_when_the_run_writes_its_summary(tmp_path):
    base = tmp_path / "gate_micro"
    first = runs.start(base, given=False)
    (first.path / "summary.json").write_text("{}")
    first.finish()
    run = runs.start(base, given=False)
    assert run.stamped and run.before == first.path.name and run.path.parent == base and not any(run.path.iterdir())
    assert os.readlink(base / "latest") == first.path.name  # the run has not written its summary yet
    assert run.abandon() is True  # it died before writing anything (a failed fetch): no trace
    assert not run.path.exists() and os.readlink(base / "latest") == first.path.name
    died = runs.start(base, given=False)
    (died.path / "micro.log").write_text("crashed")  # a run that died after writing something: kept, not latest
    assert died.abandon() is False and os.readlink(base / "latest") == first.path.name
    done = runs.start(base, given=False)
    (done.path / "summary.json").write_text("{}")
    assert done.finish() == base / "latest" and os.readlink(base / "latest") == done.path.name


def test_abandon_of_the_first_run_leaves_nothing(tmp_path):
    base = tmp_path / "all_gates"
    run = runs.start(base, given=False)
    assert run.before is None and not (base / "latest").exists()
    assert run.abandon() is True
    assert list(base.iterdir()) == []


def test_a_given_folder_is_used_as_is_never_stamped_nor_removed(tmp_path):
    given = tmp_path / "shared"
    given.mkdir()
    run = runs.start(given, given=True)
    assert run.path == given and not run.stamped and not (given / "latest").exists()
    assert run.abandon() is False and given.is_dir() and run.finish() is None
    missing = runs.start(tmp_path / "not-yet", given=True)  # made by the reports' writer, not here
    assert missing.path == tmp_path / "not-yet" and not missing.path.exists() and missing.abandon() is False
