"""toolchain.detect's probe cache: the interpreter's probe (an import of torch) kept in <cache>/toolchain and reused
only while what it stands on is unchanged; a hostile cache file is probed again, never trusted.

Real processes: a stand-in 'python' (a shell script) that prints a probe and counts its runs; a fake nvcc; the arch
given (no GPU here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reprostack.kernels import toolchain


def _world(tmp_path: Path, monkeypatch) -> tuple[str, Path, Path]:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.11.0'\n")
    count = tmp_path / "runs"
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    probe = {
        "python": str(py),
        "python_version": "3.12.3",
        "purelib": str(site),
        "stdlib": "/usr/lib/python3.12",
        "torch": "2.11.0+cu130",
        "torch_cuda": "13.0",
        "torch_site": str(site),
    }
    py.write_text(
        f"#!/bin/sh\necho \"x $PYTHONPYCACHEPREFIX $PYTHONDONTWRITEBYTECODE\" >> {count}\necho '{json.dumps(probe)}'\n"
    )
    py.chmod(0o755)
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{nvcc.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    return str(py), site, count


def _runs(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_the_probe_is_reused_until_what_it_stands_on_changes(tmp_path, monkeypatch):
    py, site, count = _world(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    a = toolchain.detect(py, arch="90", cache=cache)
    b = toolchain.detect(py, arch="90", cache=cache)
    assert _runs(count) == 1 and a == b and a.torch == "2.11.0+cu130" and a.stdlib == "/usr/lib/python3.12"
    (site / "torch" / "version.py").write_text("__version__ = '2.12.0'  # reinstalled\n")
    toolchain.detect(py, arch="90", cache=cache)
    assert _runs(count) == 2
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")  # moves sys.path: another torch may be found
    toolchain.detect(py, arch="90", cache=cache)
    assert _runs(count) == 3
    toolchain.detect(py, arch="90")  # no cache: always probed
    assert _runs(count) == 4
    # the probe's import of torch writes bytecode into the cache's prefix, or nowhere; never beside the image's torch
    lines = count.read_text().splitlines()
    assert lines[0] == f"x {cache / 'pycache'} " and lines[-1] == "x  1"


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '{"probe": "x"}',
        '{"probe": {"torch": 1}, "witness": {}}',
        '{"probe": {"torch": "9", "evil": "x"}, "witness": {}}',
        "x" * (70 * 1024),
    ],
)
def test_a_hostile_cache_file_is_probed_again_and_rewritten(tmp_path, monkeypatch, content):
    py, _, count = _world(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    toolchain.detect(py, arch="90", cache=cache)
    (f,) = (cache / "toolchain").iterdir()
    f.write_text(content)
    tc = toolchain.detect(py, arch="90", cache=cache)
    assert _runs(count) == 2 and tc.torch == "2.11.0+cu130"
    assert json.loads(f.read_text())["probe"]["torch"] == "2.11.0+cu130"


def test_a_forged_probe_with_a_matching_witness_cannot_smuggle_a_field(tmp_path, monkeypatch):
    """Even a file whose witness matches holds only the known string fields; a stored probe for another torch than
    the files say is only as good as the witness (a reinstall changes it)."""
    py, _, count = _world(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    toolchain.detect(py, arch="90", cache=cache)
    (f,) = (cache / "toolchain").iterdir()
    d = json.loads(f.read_text())
    d["probe"]["torch_site"] = {"not": "a string"}
    f.write_text(json.dumps(d))
    toolchain.detect(py, arch="90", cache=cache)
    assert _runs(count) == 2
