"""reprostack.runs on a real file system: a new stamped folder per run, `latest` swapped atomically (a reader never
finds it missing), a `latest` that is a real folder left alone, and abandon(): a run that wrote nothing leaves no
folder and `latest` where it was; a folder given with --out is never stamped nor removed."""

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


def test_new_run_dir_and_latest(tmp_path):
    when = datetime(2026, 12, 2, 3, 10, 0, tzinfo=timezone.utc)
    a = runs.new_run_dir(tmp_path / "gate_micro", now=when)
    b = runs.new_run_dir(tmp_path / "gate_micro", now=when)  # the same second: a new folder all the same
    assert (a.name, b.name) == ("2026-12-02T03-10-00Z", "2026-12-02T03-10-00Z-2")
    latest = tmp_path / "gate_micro" / "latest"
    assert os.readlink(latest) == b.name and latest.resolve() == b.resolve()  # relative: the tree can move
    assert sorted(p.name for p in (tmp_path / "gate_micro").iterdir()) == [a.name, b.name, "latest"]


def test_latest_is_swapped_atomically(tmp_path):
    base = tmp_path / "runs"
    runs.new_run_dir(base)
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
        runs.new_run_dir(tmp_path)
    assert (tmp_path / "latest" / "keep").read_text() == "x" and os.listdir(tmp_path) == ["latest"]


def test_start_points_latest_at_the_new_run_and_abandon_puts_it_back(tmp_path):
    base = tmp_path / "gate_micro"
    first = runs.new_run_dir(base, now=WHEN)
    (first / "summary.json").write_text("{}")
    run = runs.start(base, given=False)
    assert run.stamped and run.before == first.name and run.path.parent == base and not any(run.path.iterdir())
    assert os.readlink(base / "latest") == run.path.name  # before anything runs: never the earlier run's summary
    assert run.abandon() is True
    assert not run.path.exists() and os.readlink(base / "latest") == first.name
    assert sorted(p.name for p in base.iterdir()) == [first.name, "latest"]
    assert (first / "summary.json").read_text() == "{}"


def test_abandon_of_the_first_run_removes_latest(tmp_path):
    base = tmp_path / "all_gates"
    run = runs.start(base, given=False)
    assert run.before is None and (base / "latest").is_symlink()
    assert run.abandon() is True
    assert list(base.iterdir()) == []


def test_abandon_keeps_a_run_that_wrote_anything(tmp_path):
    base = tmp_path / "gate_vllm"
    run = runs.start(base, given=False)
    (run.path / "vllm.json").write_text("{}")
    assert run.abandon() is False
    assert (run.path / "vllm.json").is_file() and os.readlink(base / "latest") == run.path.name


def test_a_given_folder_is_used_as_is_never_stamped_nor_removed(tmp_path):
    given = tmp_path / "shared"
    given.mkdir()
    run = runs.start(given, given=True)
    assert run.path == given and not run.stamped and not (given / "latest").exists()
    assert run.abandon() is False and given.is_dir()
    missing = runs.start(tmp_path / "not-yet", given=True)  # made by the reports' writer, not here
    assert missing.path == tmp_path / "not-yet" and not missing.path.exists() and missing.abandon() is False
