#!/usr/bin/env python3
"""How long the test suite takes here: the README's test command N times, every run recorded.

    python3 scripts/bench_suite.py [--runs N] [--label L] [--results DIR] [--pytest PY | --ci] [-- PYTEST ARGS]

Run it where `.ci/run` would run the tests (its Docker engine and Slurm started, their variables exported:
DOCKER_HOST, SLURM_CONF, REPROSTACK_REQUIRE_DOCKER/SLURM), from a checkout with `.venv` made as the README says.
Each run is the README's `.venv/bin/nox -s tests_all -- -q -p no:cacheprovider --junitxml=...` (its install phase
included: the first run on a fresh machine builds the AIPerf venv and the Debian test base, later runs reuse them),
or with `--pytest PY` only `PY -m pytest ...` (no install phase), or with `--ci` the whole `.ci/run` (the pytest
arguments through PYTEST_ADDOPTS: what CI costs, lint, docs check and verify-report included), with the load average read before and after, so
a busy machine is visible in the record, never hidden in a headline. The pytest seconds and the per-file seconds
come from pytest's own JUnit XML (setup + call + teardown of each test, summed per file); each run's CPU seconds
(what it started and waited for) say how busy the cores were.

Writes results/bench/suite-<label>-<UTC date time>.json: the project commit it ran on (and whether the tree was
dirty), cpus, python, every run (wall seconds, counts, load averages, CPU seconds, per-file seconds), the median
wall time as the headline and the slowest files by their median. Prints one line per run and the slowest files.

Invariants:
- the record is written once, at the end, atomically (a temporary file renamed), and only when every run finished;
  a run that failed tests is still recorded, with its failure count (the numbers are the suite's, not a verdict);
- nothing is typed: every number comes from the clock, pytest's XML or os.getloadavg().
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def commit() -> dict:
    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def per_file(junit: Path) -> tuple[dict, dict]:
    """({test file: seconds}, counts) from pytest's JUnit XML: a testcase's `classname` is the dotted module path
    (tests.test_x[.Class]), its `time` setup + call + teardown."""
    root = ET.parse(junit).getroot()
    files: dict[str, float] = {}
    counts = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts["pytest_s"] = round(sum(float(s.get("time") or 0) for s in suites), 1)
    for case in root.iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        mod = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        name = "/".join(parts[: mod + 1]) + ".py"
        files[name] = files.get(name, 0.0) + float(case.get("time") or 0)
        counts["tests"] += 1
        for tag, key in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            if case.find(tag) is not None:
                counts[key] += 1
    return {k: round(v, 2) for k, v in sorted(files.items())}, counts


def one_run(pytest_py: str | None, extra: list[str], i: int, n: int, ci: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        junit = Path(tmp) / "junit.xml"
        args = ["-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *extra]
        env = dict(os.environ)
        if ci:  # the whole of .ci/run (installs, services, lint, docs, verify-report, tests): pytest args by env
            cmd = [str(ROOT / ".ci" / "run")]
            env["PYTEST_ADDOPTS"] = " ".join([env.get("PYTEST_ADDOPTS", ""), *args]).strip()
        elif pytest_py:
            cmd = [pytest_py, "-m", "pytest", *args]
        else:
            cmd = [str(ROOT / ".venv" / "bin" / "nox"), "-s", "tests_all", "--", *args]
        before, cpu0 = loadavg(), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        wall = round(time.monotonic() - t0, 1)
        after, cpu1 = loadavg(), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = round((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 1)
        if not junit.is_file():
            sys.exit(f"bench_suite: run {i}/{n}: pytest exited {rc} and wrote no JUnit XML; nothing recorded")
        files, counts = per_file(junit)
    print(
        f"bench_suite: run {i}/{n}: {wall:.0f} s ({counts['pytest_s']:.0f} s in pytest), {counts['tests']} tests, "
        f"{counts['failed']} failed, {counts['errors']} errors, {cpu:.0f} cpu s, load {before} -> {after}",
        flush=True,
    )
    return {
        "command": " ".join(cmd[: cmd.index("--") if "--" in cmd else 3]),
        "wall_s": wall,
        "rc": rc,
        **counts,
        "loadavg_before": before,
        "loadavg_after": after,
        # user + system CPU seconds of the processes the run started and waited for (getrusage RUSAGE_CHILDREN):
        # beside wall_s x cpus it says whether the cores were busy; a lower bound (a Docker container's or a Slurm
        # job's CPU is its daemon's, not counted)
        "cpu_s": cpu,
        "files_s": files,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--label", default=platform.node().split(".")[0] or "host")
    ap.add_argument("--results", default=str(ROOT / "results" / "bench"))
    ap.add_argument("--pytest", metavar="PY", default=None, help="run only `PY -m pytest` (default: nox -s tests_all)")
    ap.add_argument("--ci", action="store_true", help="time the whole `.ci/run` (as root; it starts its own services)")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args(argv)
    if not 1 <= a.runs <= 20:
        ap.error("--runs: 1..20")
    if a.ci and a.pytest:
        ap.error("--ci and --pytest: pick one")
    need = str(ROOT / ".ci" / "run") if a.ci else a.pytest or str(ROOT / ".venv" / "bin" / "nox")
    if not Path(need).exists():
        ap.error(f"{need}: no such file (make .venv as the README says)")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env = {
        k: os.environ.get(k)
        for k in ("DOCKER_HOST", "SLURM_CONF", "REPROSTACK_REQUIRE_DOCKER", "REPROSTACK_REQUIRE_SLURM")
    }
    runs = [one_run(a.pytest, a.pytest_args, i + 1, a.runs, a.ci) for i in range(a.runs)]
    names = sorted({f for r in runs for f in r["files_s"]})
    med = {f: round(statistics.median(r["files_s"].get(f, 0.0) for r in runs), 1) for f in names}
    slowest = sorted(med.items(), key=lambda kv: -kv[1])[:15]
    doc = {
        "bench": "suite",
        "started": started,
        "project": commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pytest_args": a.pytest_args,
        "what": ".ci/run" if a.ci else "pytest" if a.pytest else "nox -s tests_all",
        # nox -s tests spreads the files over $REPROSTACK_TEST_WORKERS pytest-xdist workers (noxfile.xdist_args)
        "test_workers": None if a.pytest else os.environ.get("REPROSTACK_TEST_WORKERS") or "2",
        "services": {k: v is not None for k, v in env.items()},
        "runs": runs,
        "headline": {
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_pytest_s": statistics.median(r["pytest_s"] for r in runs),
            "runs": len(runs),
            "every_wall_s": [r["wall_s"] for r in runs],
            "every_pytest_s": [r["pytest_s"] for r in runs],
        },
        "slowest_files_median_s": dict(slowest),
    }
    out = Path(a.results) / f"suite-{a.label}-{started.replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    h = doc["headline"]
    print(
        f"bench_suite: median {h['median_wall_s']:.0f} s ({h['median_pytest_s']:.0f} s in pytest) over "
        f"{len(runs)} run(s) {h['every_wall_s']}; {out}"
    )
    for f, s in slowest:
        print(f"  {s:7.1f} s  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
