"""scripts/bench_suite.py: per-file seconds and counts come from pytest's own JUnit XML (issue 29 item 11)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _mod():
    spec = importlib.util.spec_from_file_location("bench_suite", REPO / "scripts" / "bench_suite.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4" time="5.5">
<testcase classname="tests.test_a" name="test_1" time="1.25"/>
<testcase classname="tests.test_a.TestK" name="test_2" time="0.75"><failure message="x"/></testcase>
<testcase classname="tests.test_b" name="test_3" time="3.0"><skipped message="no gpu"/></testcase>
<testcase classname="tests.test_b" name="test_4" time="0.5"><error message="fixture"/></testcase>
</testsuite></testsuites>"""


def test_per_file_sums_each_test_file_and_counts_outcomes(tmp_path):
    j = tmp_path / "junit.xml"
    j.write_text(JUNIT)
    files, counts = _mod().per_file(j)
    assert files == {"tests/test_a.py": 2.0, "tests/test_b.py": 3.5}
    assert counts == {"tests": 4, "failed": 1, "errors": 1, "skipped": 1, "pytest_s": 5.5}


def test_a_real_run_records_every_run_and_the_median(tmp_path):
    """Two real pytest runs of a tiny test folder: the record lists both, the headline is their median."""
    t = tmp_path / "t"
    t.mkdir()
    (t / "test_x.py").write_text("def test_ok():\n    assert True\n")
    out = tmp_path / "res"
    m = _mod()
    assert (
        m.main(
            [
                "--runs",
                "2",
                "--label",
                "t",
                "--results",
                str(out),
                "--pytest",
                sys.executable,
                "--",
                str(t),
                "-o",
                "addopts=",
                "-p",
                "no:progress",
            ]
        )
        == 0
    )
    (rec,) = out.glob("suite-t-*.json")
    doc = json.loads(rec.read_text())
    assert len(doc["runs"]) == 2 and all(r["tests"] == 1 and r["failed"] == 0 for r in doc["runs"])
    assert doc["headline"]["runs"] == 2 and len(doc["headline"]["every_wall_s"]) == 2
    assert doc["runs"][0]["command"].endswith("-m pytest") and doc["headline"]["median_pytest_s"] >= 0
    assert doc["project"]["commit"] and len(doc["runs"][0]["loadavg_before"]) == 3
    assert all(0 < r["cpu_s"] < 600 for r in doc["runs"])  # a pytest process's CPU: more than nothing


def test_ci_mode_times_the_whole_ci_run_and_reads_pytest_through_its_addopts(tmp_path, monkeypatch):
    """`--ci` times `.ci/run` itself (what the README's 15-minute budget is about), the pytest arguments (JUnit XML)
    reaching its `nox -s tests` through PYTEST_ADDOPTS. A stand-in `.ci/run` in a scratch root runs a real pytest."""
    m = _mod()
    root = tmp_path / "root"
    (root / ".ci").mkdir(parents=True)
    (root / "t").mkdir()
    (root / "t" / "test_y.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    run = root / ".ci" / "run"
    run.write_text(f"#!/bin/sh\nexec {sys.executable} -m pytest -o addopts= -p no:progress t\n")
    run.chmod(0o755)
    monkeypatch.setattr(m, "ROOT", root)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    assert m.main(["--ci", "--runs", "1", "--label", "c", "--results", str(tmp_path / "res")]) == 0
    (rec,) = (tmp_path / "res").glob("suite-c-*.json")
    doc = json.loads(rec.read_text())
    assert doc["what"] == ".ci/run" and doc["runs"][0]["command"].endswith("/.ci/run")
    assert doc["runs"][0]["tests"] == 2 and doc["runs"][0]["files_s"].keys() == {"t/test_y.py"}


def test_xdist_schedule_starts_the_longest_files_first_by_the_newest_whole_suite_record(tmp_path):
    """Issue 38 item 6: under xdist (`--dist loadfile --no-loadscope-reorder`) tests/schedule.py orders the files by
    the newest whole-suite record's median seconds, longest first (xdist's own order, most tests first, left the
    longest file, 3 tests, to run alone at the end); a file's tests keep their order, none is dropped; a record of
    a selection (`-m unit`) or one that does not read is not used; a file the record lacks counts as the median."""
    sys.path.insert(0, str(REPO / "tests"))
    import schedule

    def rec(started, args, *runs):
        return {"bench": "suite", "started": started, "pytest_args": args, "runs": [{"files_s": r} for r in runs]}

    b = tmp_path / "bench"
    b.mkdir()
    (b / "suite-old.json").write_text(json.dumps(rec("2026-01-01T00:00:00Z", [], {"tests/test_a.py": 99.0})))
    new = rec("2026-02-01T00:00:00Z", ["-q"], {"tests/test_a.py": 1.0, "tests/test_b.py": 9.0, "tests/test_c.py": 5.0})
    new["runs"].append({"files_s": {"tests/test_a.py": 3.0, "tests/test_b.py": 7.0, "tests/test_c.py": 5.0}})
    new["runs"].append({"files_s": {"tests/test_a.py": 2.0, "tests/test_b.py": 8.0, "tests/test_c.py": 5.0}})
    (b / "suite-new.json").write_text(json.dumps(new))
    (b / "suite-unit.json").write_text(json.dumps(rec("2026-03-01T00:00:00Z", ["-m", "unit"], {"tests/test_a.py": 50})))
    (b / "suite-files.json").write_text(json.dumps(rec("2026-03-02T00:00:00Z", ["tests/test_a.py"], {})))
    (b / "suite-bad.json").write_text("{not json")
    seconds = schedule.file_seconds(b)
    assert seconds == {"tests/test_a.py": 2.0, "tests/test_b.py": 8.0, "tests/test_c.py": 5.0}

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    ids = ["tests/test_a.py::t1", "tests/test_a.py::t2", "tests/test_b.py::t1", "tests/test_new.py::t1"]
    ids += ["tests/test_c.py::t2", "tests/test_c.py::t1", "tests/test_b.py::t0"]
    got = [i.nodeid for i in schedule.longest_first([Item(n) for n in ids], seconds)]
    assert got == [
        "tests/test_b.py::t1",
        "tests/test_b.py::t0",
        "tests/test_new.py::t1",  # not in the record: the median, 5.0, a tie with test_c: collection order
        "tests/test_c.py::t2",
        "tests/test_c.py::t1",
        "tests/test_a.py::t1",
        "tests/test_a.py::t2",
    ]
    assert sorted(got) == sorted(ids)
    assert [i.nodeid for i in schedule.longest_first([Item(n) for n in ids], {})] == ids  # no record: as collected
    assert schedule.file_seconds(tmp_path / "none") == {}
    real = schedule.file_seconds()  # the committed records: the pyxis rehearsal, 3 tests, is among the first files
    assert real and sorted(real, key=real.get, reverse=True).index("tests/test_rehearsal_pyxis.py") < 3


SLURM_WORLD = {
    # two files that take the Slurm flock's fixtures (one directly, one through a fixture of its own), one that does not
    # (the fixture names come in at write time: written here, they would make this file one of schedule's Slurm files)
    "test_pyxis_like.py": "def test_a(ALONE):\n    pass\n\ndef test_b(ALONE):\n    pass\n",
    "test_host_like.py": (
        "import pytest\n\n@pytest.fixture\ndef cluster(TWO):\n    return 2\n\ndef test_c(cluster):\n    pass\n"
    ),
    "test_other.py": "def test_d():\n    pass\n\ndef test_e():\n    pass\n",
}


def test_xdist_runs_the_slurm_files_on_one_worker_one_after_the_other(tmp_path):
    """Issue 38 item 6: the files that hold the Slurm flock (a test or fixture takes `slurm_alone` / `slurm_two_nodes`)
    are one unit of work under `--dist loadfile` (tests/schedule.py's scheduler): with the longest files first the
    pyxis rehearsal and the host-mode rehearsal would otherwise start together, one worker blocked on the flock. A
    real xdist run of the project's scheduler over a small tests/ folder of its own (the real rehearsals take minutes:
    a first version of this test ran them again, 3 minutes of every .ci/run, and under bench_suite's PYTEST_ADDOPTS -q
    it read no test lines): both Slurm files on one worker, the longer first by the record, the other file on the
    other worker."""
    sys.path.insert(0, str(REPO / "tests"))
    import schedule

    assert schedule.slurm_files() == {"tests/test_rehearsal.py", "tests/test_rehearsal_pyxis.py"}
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(REPO / "tests" / "schedule.py", tests / "schedule.py")
    (tests / "conftest.py").write_text(
        'import pytest\n\npytest_plugins = ["schedule"]\n\n'
        "@pytest.fixture\ndef slurm_alone():\n    return 1\n\n@pytest.fixture\ndef slurm_two_nodes():\n    return 2\n"
    )
    for name, text in SLURM_WORLD.items():
        (tests / name).write_text(text.replace("ALONE", "slurm_" + "alone").replace("TWO", "slurm_" + "two_nodes"))
    bench = tmp_path / "results" / "bench"
    bench.mkdir(parents=True)
    files_s = {"tests/test_pyxis_like.py": 150.0, "tests/test_host_like.py": 40.0, "tests/test_other.py": 100.0}
    rec = {"bench": "suite", "started": "2026-12-06T00:00:00Z", "pytest_args": [], "runs": [{"files_s": files_s}]}
    (bench / "suite-x.json").write_text(json.dumps(rec))
    assert schedule.slurm_files(tests) == {"tests/test_pyxis_like.py", "tests/test_host_like.py"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPROSTACK_REQUIRE", "PYTEST_"))}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"]
        + ["--no-loadscope-reorder", "--rootdir", str(tmp_path), "tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = [m.groups() for m in re.finditer(r"^\[(gw\d+)\] .*? (tests/\S+?\.py)::", r.stdout, re.M)]
    assert len(ran) == 5 == r.stdout.count("\n[gw"), r.stdout[-2000:]  # every test's line read
    worker = {f: {w for w, n in ran if n == f} for f in files_s}
    pyxis, host, other = files_s
    assert worker[pyxis] == worker[host] and len(worker[pyxis]) == 1
    assert worker[other] and worker[other].isdisjoint(worker[pyxis])
    (w,) = worker[pyxis]
    order = [n for v, n in ran if v == w]
    assert order == sorted(order, key=lambda f: f != pyxis), order


@pytest.mark.parametrize(
    "runs",
    [
        "not a list",
        {"files_s": {}},
        ["a run that is a string", 7, None],
        [{"files_s": "x"}, {"files_s": [1, 2]}, {"files_s": None}],
        [{"files_s": {"tests/test_a.py": "9", "tests/test_b.py": True, "tests/test_c.py": float("nan")}}],
        [{"files_s": {"tests/test_a.py": -5}}],
    ],
)
def test_a_malformed_suite_record_gives_the_collection_order_not_a_traceback(tmp_path, runs):
    """tests/schedule.py reads results/bench/suite-*.json at every xdist collection: a record of any other shape
    (from a PR, a hand edit) orders nothing and breaks nothing (schedule.file_seconds gives {} for it)."""
    sys.path.insert(0, str(REPO / "tests"))
    import schedule

    rec = {"bench": "suite", "started": "2026-12-06T00:00:00Z", "pytest_args": [], "runs": runs}
    (tmp_path / "suite-x.json").write_text(json.dumps(rec))
    assert schedule.file_seconds(tmp_path) == {}
