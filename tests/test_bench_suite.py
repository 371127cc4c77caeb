"""scripts/bench_suite.py: per-file seconds and counts come from pytest's own JUnit XML (issue 29 item 11)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

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
