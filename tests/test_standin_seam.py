"""The GPU stand-in is test code (tests/standins/gpu.py), reached only through the gates' seam
(reprostack.gates.standin): the package holds none of it, a checkout without it refuses in one line, and nothing is
loaded without REPROSTACK_STANDIN. Its end-to-end use is the rehearsals' (test_rehearsal*.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.errors import ReprostackError
from reprostack.gates import standin

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "reprostack"


def test_the_package_holds_no_gpu_stand_in():
    """Issue 38 item 4: the replay, the p5en host it plays and the recordings it reads live under tests/, not in the
    package an image or a wheel installs (before: src/reprostack/gates/standin.py, 466 lines)."""
    assert not hasattr(standin, "replay") and not hasattr(standin, "host_facts")
    for marker in ("TRIALS_LOG", "def replay(launch", "P5EN_GPUS", "def rendezvous(launch"):
        found = [str(p.relative_to(REPO)) for p in SRC.rglob("*.py") if marker in p.read_text()]
        assert not found, (marker, found)
    plugin = standin.load(REPO)
    assert plugin.__file__ == str((REPO / standin.PLUGIN).resolve())
    assert standin.load(REPO) is plugin  # loaded once per path


def _checkout_without_the_stand_in(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(REPO / "upstreams.lock", root)
    for d in ("gates", "patches"):
        shutil.copytree(REPO / d, root / d)
    return root


def test_a_checkout_without_the_stand_in_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    """An installed reprostack (or any checkout without tests/standins/gpu.py) asked for the stand-in: one line,
    exit 2, no run folder; never a run that looks like a real one."""
    root = _checkout_without_the_stand_in(tmp_path)
    monkeypatch.setenv(standin.ENV, "h200")
    out = tmp_path / "out"
    argv = ["gate", "micro", "--lock", str(root / "upstreams.lock"), "--profile", "h200-ep1", "--no-container"]
    assert cli.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"reprostack: error: {standin.ENV} is set (the GPU stand-in) but {(root / standin.PLUGIN).resolve()} is not "
        f"there: the stand-in is test code of a reprostack checkout, never part of an installed reprostack; unset "
        f"{standin.ENV} for a real run"
    )
    assert not out.exists()


@pytest.mark.parametrize("value", ["a100", "h200,fail-node=x", "h200,rdzv=0", "h200,wait=99999", "h200,bogus"])
def test_a_value_the_stand_in_does_not_take_is_one_line(tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv(standin.ENV, value)
    out = tmp_path / "out"
    argv = ["gate", "micro", "--lock", str(REPO / "upstreams.lock"), "--profile", "h200-ep1", "--no-container"]
    assert cli.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"reprostack: error: {standin.ENV}=") and "expected h200[,fail-node=R]" in err[-1]
    assert not out.exists()


def test_without_the_variable_nothing_is_loaded(tmp_path):
    before = {m for m in sys.modules if m.startswith("_reprostack_standin_")}
    assert standin.from_env(tmp_path, {}) is None  # no checkout there: never looked for
    assert standin.from_env(REPO, {standin.ENV: ""}) is None
    assert {m for m in sys.modules if m.startswith("_reprostack_standin_")} == before
    with pytest.raises(ReprostackError, match="is not there"):
        standin.from_env(tmp_path, {standin.ENV: "h200"})
