"""Issue 40 items 1, 2 and 10: the nox sessions a new user calls.

- `--plan` runs nothing and reads no verdict, through nox too (`nox -s all_gates -- --plan` exited 1 with "no
  summary.json"; `gate_micro -- --plan` printed the previous run's verdict after the plan);
- a run that wrote no summary (a failed fetch, a crash) is said to be one, never read as the earlier run that
  `latest` still names;
- `nox --no-venv -s lock|fetch|gate_micro` (inside an image that already has the project) skips the install with a
  log line instead of dying in nox's session.install.
The session functions run against a recording session (the reprostack command stands in); the --no-venv and --plan
calls are real nox processes on this checkout (they write nothing under out/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import noxmod

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _noxfile():
    return noxmod.load()  # once per process (a second import re-registers the sessions: nox's FutureWarning)


class _Stop(Exception):
    pass


class _Session:
    """What the session functions use of nox.Session; `run` calls `on_run` (the command's stand-in)."""

    def __init__(self, posargs, on_run=lambda args: None, backend="virtualenv"):
        self.posargs, self.on_run, self.venv_backend = posargs, on_run, backend
        self.calls, self.logs, self.env = [], [], {}

    def run(self, *args, **kw):
        self.calls.append(args)
        self.on_run(args)

    def log(self, msg):
        self.logs.append(msg)

    def error(self, msg):
        raise _Stop(msg)

    def skip(self, msg):
        raise _Stop(f"skip: {msg}")

    def install(self, *a, **kw):
        raise AttributeError("'PassthroughEnv' object has no attribute 'install'")  # what nox --no-venv did


def _earlier_run(tmp_path) -> Path:
    old = tmp_path / "out" / "gate_micro" / "2026-12-01T00-00-00Z"
    old.mkdir(parents=True)
    summary = {"exit_code": 0, "gates": [{"gate": "micro", "result": "pass", "reason": "an earlier run's verdict"}]}
    (old / "summary.json").write_text(json.dumps(summary))
    os.symlink(old.name, old.parent / "latest")
    return old


def test_plan_through_nox_reads_no_verdict(tmp_path, monkeypatch):
    nf = _noxfile()
    monkeypatch.chdir(tmp_path)
    _earlier_run(tmp_path)
    s = _Session(["--plan"])
    assert nf._gate(s, "gate", "micro") is None  # no verdict: not the earlier run's PASS
    assert len(s.calls) == 1 and "--plan" in s.calls[0]
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    nf.gate_micro(_Session(["--plan"], backend="none"))  # the session returns: nothing skipped, nothing failed
    nf.all_gates(_Session(["--plan"], backend="none"))  # exited 1 with "no summary.json" before


def test_a_run_that_wrote_no_summary_is_never_read_as_the_earlier_one(tmp_path, monkeypatch):
    nf = _noxfile()
    monkeypatch.chdir(tmp_path)
    old = _earlier_run(tmp_path)
    died = _Session([])  # the command failed (a failed fetch: exit 2) and wrote nothing: `latest` did not move
    with pytest.raises(_Stop, match=r"this run wrote no summary: .*an earlier run, not this one's verdict"):
        nf._gate(died, "gate", "micro")

    def finishes(args):
        new = old.parent / "2026-12-02T00-00-00Z"
        new.mkdir()
        (new / "summary.json").write_text(json.dumps({"exit_code": 3, "gates": [
            {"gate": "micro", "result": "skip", "reason": "no GPU"}]}))  # fmt: skip
        os.replace(_symlink(old.parent, new.name), old.parent / "latest")

    assert nf._gate(_Session([], finishes), "gate", "micro") == (3, ["micro: SKIP — no GPU"])


def _symlink(base: Path, name: str) -> Path:
    tmp = base / ".l"
    os.symlink(name, tmp)
    return tmp


def test_no_venv_skips_the_install_with_a_line(monkeypatch):
    nf = _noxfile()
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    s = _Session([], backend="none")
    nf._install(s)  # no AttributeError from session.install
    assert len(s.logs) == 1 and s.logs[0].startswith("nox --no-venv: no install, using the reprostack on PATH")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(_Stop, match=r"^nox --no-venv: no `reprostack` on PATH"):
        nf._install(_Session([], backend="none"))


@pytest.mark.parametrize(
    "argv",
    [["-s", "lock"], ["-s", "gate_micro", "--", "--plan"], ["-s", "all_gates", "--", "--plan"]],
    ids=["lock", "gate_micro-plan", "all_gates-plan"],
)
def test_real_nox_no_venv_sessions_work(argv):
    if not (BIN / "nox").is_file():
        pytest.skip(f"no nox next to {sys.executable} (the test extra installs it)")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(
        [str(BIN / "nox"), "--no-venv", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    assert "nox --no-venv: no install" in out and "AttributeError" not in out and "ValueError" not in out
    if "--plan" in argv:
        assert "(nothing was run)" in out and "summary" not in out and "— " not in out  # no verdict line
