"""kernels.bytecode: the test processes' bytecode compiled into the PYTHONPYCACHEPREFIX while DeepEP builds.

Real interpreter, real imports: a small site-packages with a `torch` package and an `nvidia` wheel folder, the
one-NCCL overlay made by runtime.make_overlay, the prewarm, then a process importing through the overlay with
`python -v`, which says for each module whether its code came from a .pyc ("matches") or was compiled ("wrote").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reprostack.kernels import bytecode, runtime


def _site(tmp: Path) -> tuple[Path, Path, Path]:
    site = tmp / "site-packages"
    (site / "torch" / "nn").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("from . import nn\nimport otherpkg\n")
    (site / "torch" / "nn" / "__init__.py").write_text("X = 1\n")
    (site / "torch" / "broken.py").write_text("def (:\n")  # never imported; must not stop the prewarm
    (site / "otherpkg").mkdir()
    (site / "otherpkg" / "__init__.py").write_text("Y = 2\n")
    (site / "nvidia" / "cublas").mkdir(parents=True)
    (site / "nvidia" / "cublas" / "__init__.py").write_text("")
    lib = tmp / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"\x7fELF not really")
    std = tmp / "stdlib"
    std.mkdir()
    (std / "mystd.py").write_text("Z = 3\n")
    return site, lib, std


def _import_verbose(overlay: Path, site: Path, std: Path, prefix: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=os.pathsep.join([str(overlay), str(site), str(std)]), PYTHONPYCACHEPREFIX=str(prefix))
    p = subprocess.run(
        [sys.executable, "-v", "-c", "import torch, mystd, nvidia.cublas"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stderr


def test_prewarm_compiles_what_the_test_imports_through_the_overlay_into_the_prefix_only(tmp_path):
    site, lib, std = _site(tmp_path)
    overlay = runtime.make_overlay(site, lib, tmp_path / "build" / "overlay")
    prefix = tmp_path / "cache" / "pycache"
    got = bytecode.start(sys.executable, prefix, site, overlay, jobs=2, stdlib_dirs=[str(std)]).finish()
    assert got["cut"] is False and got["compiled"] >= 5, got
    log = _import_verbose(overlay, site, std, prefix)
    for mod in (
        f"{overlay}/torch/__init__.py",
        f"{overlay}/torch/nn/__init__.py",
        f"{site}/otherpkg/__init__.py",
        f"{std}/mystd.py",
    ):
        assert f"matches {mod}" in log, (mod, log[-3000:])
    wrote = [ln for ln in log.splitlines() if ln.startswith("# wrote")]
    assert all(ln.startswith(f"# wrote '{prefix}/") for ln in wrote), wrote  # only ever into the prefix
    assert not [ln for ln in wrote if str(tmp_path / "site-packages") in ln or str(std) in ln], wrote
    assert not list(tmp_path.glob("site-packages/**/__pycache__")) and not list(overlay.glob("**/__pycache__"))
    # warm: nothing compiled again
    again = bytecode.start(sys.executable, prefix, site, overlay, jobs=2, stdlib_dirs=[str(std)]).finish()
    assert again["compiled"] == 0, again


def test_a_changed_source_is_compiled_again(tmp_path):
    site, lib, std = _site(tmp_path)
    overlay = runtime.make_overlay(site, lib, tmp_path / "overlay")
    prefix = tmp_path / "pycache"
    bytecode.start(sys.executable, prefix, site, overlay, jobs=1, stdlib_dirs=[str(std)]).finish()
    src = site / "otherpkg" / "__init__.py"
    src.write_text("Y = 22  # longer\n")
    os.utime(src, (1_700_000_000, 1_700_000_000))
    again = bytecode.start(sys.executable, prefix, site, overlay, jobs=1, stdlib_dirs=[str(std)]).finish()
    assert again["compiled"] == 1, again
    assert f"matches {site}/otherpkg/__init__.py" in _import_verbose(overlay, site, std, prefix)


def test_a_prewarm_cut_at_its_bound_leaves_no_process(tmp_path):
    site, lib, std = _site(tmp_path)
    overlay = runtime.make_overlay(site, lib, tmp_path / "overlay")
    w = bytecode.start(sys.executable, tmp_path / "pycache", site, overlay, jobs=1, stdlib_dirs=[str(std)])
    got = w.finish(bound_s=0)
    assert w.proc.poll() is not None
    assert got["cut"] or got["compiled"] is not None


def test_no_torch_site_means_no_prewarm_and_a_reason(tmp_path):
    got = bytecode.start(sys.executable, tmp_path / "p", None, tmp_path / "o", jobs=1, stdlib_dirs=["/x"]).finish()
    assert got == {"compiled": None, "seconds": 0.0, "cut": False, "note": "no torch site-packages known"}
    got = bytecode.start(sys.executable, tmp_path / "p", tmp_path, tmp_path / "o", jobs=1, stdlib_dirs=None).finish()
    assert got["compiled"] is None and "stdlib is not known" in got["note"]
    assert not (tmp_path / "p").exists()
