"""The test pyramid's tiers (tests/tiers.py, issue 38 item 6): each test gets exactly one tier from what its source
touches, a tier marker given by hand wins, and a unit test that starts a process anyway fails naming it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

SAMPLE = """
import subprocess
import pytest
import helper


def test_pure():
    assert 1 + 1 == 2


def test_runs_a_process():
    subprocess.run(["true"], check=True)


def test_through_a_helper_of_tests():
    helper.make_repo()


def test_behind_the_tests_back():
    helper.hidden()  # the library call starts a process: the source does not say so


@pytest.mark.integration
def test_marked_by_hand():
    helper.hidden()


def test_the_cli(tmp_path):
    from reprostack import cli
    assert cli.main(["--help"]) == 0
"""
HELPER = """
import subprocess


def make_repo():
    git("init")


def git(*a):
    return a
"""
# a module outside tests/ that starts a process: what the derivation cannot see and the guard catches
LIBRARY = """
import subprocess


def hidden():
    subprocess.run(["true"], check=True)
"""


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "p"
    (root / "tests").mkdir(parents=True)
    (root / "lib").mkdir()
    shutil.copy(TESTS / "tiers.py", root / "tests" / "tiers.py")
    (root / "tests" / "conftest.py").write_text('pytest_plugins = ["tiers"]\n')
    (root / "tests" / "test_sample.py").write_text(SAMPLE)
    (root / "tests" / "helper.py").write_text(HELPER + "\nfrom hiddenlib import hidden  # noqa\n")
    (root / "lib" / "hiddenlib.py").write_text(LIBRARY)
    (root / "pytest.ini").write_text(
        "[pytest]\ntestpaths = tests\naddopts = -p no:cacheprovider -p no:xdist --strict-markers\nmarkers =\n"
        "    unit: u\n    integration: i\n    e2e: e\n    docker: d\n    slurm: s\n    git: g\n"
    )
    return root


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    # hermetic: the outer run's PYTEST_ADDOPTS (scripts/bench_suite.py's --junitxml, -n ...) is not the sample's
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "lib"), str(REPO / "src")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", *args], cwd=root, env=env, capture_output=True, text=True
    )


def test_each_test_gets_one_tier_from_what_it_touches(tmp_path):
    root = _project(tmp_path)
    tiers = {}
    for tier in ("unit", "integration", "e2e", "git"):
        p = _pytest(root, "--collect-only", "-m", tier)
        tiers[tier] = sorted(ln.split("::")[1] for ln in p.stdout.splitlines() if "::" in ln)
    assert tiers == {
        "unit": ["test_behind_the_tests_back", "test_pure"],
        "integration": ["test_marked_by_hand", "test_runs_a_process", "test_through_a_helper_of_tests"],
        "e2e": ["test_the_cli"],
        "git": ["test_through_a_helper_of_tests"],  # helper.make_repo calls git(...): followed into tests/helper.py
    }


def test_a_unit_test_that_starts_a_process_fails_naming_it(tmp_path):
    root = _project(tmp_path)
    p = _pytest(root, "-m", "unit")
    assert p.returncode == 1, p.stdout
    assert "PASSED tests/test_sample.py::test_pure" in p.stdout
    assert "2 passed, 4 deselected, 1 error" in p.stdout
    assert "ERROR at teardown of test_behind_the_tests_back" in p.stdout
    assert (
        "tests/test_sample.py::test_behind_the_tests_back is in the unit tier but started a process (true): mark it "
        "@pytest.mark.integration (or e2e), or keep it pure"
    ) in p.stdout
    p = _pytest(root, "-m", "integration")  # the same call in a test marked integration by hand: no complaint
    assert p.returncode == 0 and "3 passed" in p.stdout, p.stdout


def test_two_tier_markers_are_refused(tmp_path):
    root = _project(tmp_path)
    (root / "tests" / "test_two.py").write_text(
        "import pytest\n\n\n@pytest.mark.unit\n@pytest.mark.e2e\ndef test_both():\n    pass\n"
    )
    p = _pytest(root, "--collect-only")
    assert p.returncode != 0 and "tests/test_two.py::test_both: more than one tier marker (unit, e2e)" in (
        p.stdout + p.stderr
    )
