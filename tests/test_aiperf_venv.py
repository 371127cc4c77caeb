"""One pinned AIPerf venv for tests and gates (issue 17 item 4): both look under <reprostack cache>/tools, a finished
venv is found by its marker, a torn marker is not trusted (the venv is built again), and the tests' default root is
the gates' cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprostack import paths
from reprostack.errors import GateError
from reprostack.gates import aiperftool
from reprostack.lock import load

REPO = Path(__file__).resolve().parents[1]


def fake_venv(cache: Path, marker: str) -> Path:
    lock = load(REPO / "upstreams.lock")
    sha = lock.get("aiperf").files[0].sha256
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = cache / "tools" / f"aiperf-0.10.0-{sha[:12]}-py{py}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "aiperf").write_text("#!/bin/sh\n")
    (venv / aiperftool._MARKER).write_text(marker.replace("SHA", sha))
    return venv


def test_a_finished_venv_is_reused_by_its_marker(tmp_path):
    venv = fake_venv(tmp_path, json.dumps({"version": "0.10.0", "sha256": "SHA"}))
    tool = aiperftool.ensure_aiperf(load(REPO / "upstreams.lock"), tmp_path, REPO, base_python="/nonexistent/python")
    assert tool.venv == venv.resolve() and tool.exe == venv.resolve() / "bin" / "aiperf"


@pytest.mark.parametrize("marker", ['{"sha256": "SH', '["SHA"]', json.dumps({"sha256": "0" * 64})])
def test_a_torn_or_foreign_marker_is_built_again_not_trusted(tmp_path, marker):
    fake_venv(tmp_path, marker)
    with pytest.raises(GateError, match="cannot make the aiperf venv with /nonexistent/python"):
        aiperftool.ensure_aiperf(load(REPO / "upstreams.lock"), tmp_path, REPO, base_python="/nonexistent/python")


def test_tests_and_gates_share_the_reprostack_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REPROSTACK_TEST_TOOLS"}
    env["REPROSTACK_CACHE"] = str(tmp_path / "c")
    code = "import sys; sys.path.insert(0, 'tests'); import test_gate_serving as t; print(t.TOOLS)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(tmp_path / "c"), out.stderr
    assert paths.cache_dir() != Path(REPO / ".cache" / "test-tools")


def test_the_venv_bytecode_is_compiled_on_every_core_and_a_module_that_does_not_compile_is_skipped(tmp_path):
    """Issue 29 item 11: pip compiled AIPerf's ~14,000 modules on one core (about 40 of the 100 s of a warm-cache
    build on 2 cores); `_compile` runs compileall on every core. As with pip, a file that does not compile (a test
    file in an older syntax) is skipped and logged, the rest compiled."""
    site = tmp_path / "v" / "lib" / "python3.99" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    (site / "pkg" / "py2.py").write_text("print 'old syntax'\n")
    log = tmp_path / "install.log"
    log.write_text("")
    aiperftool._compile(Path(sys.executable), tmp_path / "v", log)
    assert list((site / "pkg" / "__pycache__").glob("__init__.*.pyc"))
    assert not list((site / "pkg" / "__pycache__").glob("py2.*.pyc")) and "py2.py" in log.read_text()
    with pytest.raises(GateError, match="compiling the AIPerf venv's bytecode failed"):
        aiperftool._compile(tmp_path / "no-python", tmp_path / "v", log)
