"""scripts/device/seed_wheelhouse.sh: a wheel split into parts here, carried one part per call, joined on the device
and checked against the lock's sha256. Real bash, real files (a small wheel, parts of 4 KiB)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_ncclwheel import WHEEL, make_wheel, wheel_pin

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "device" / "seed_wheelhouse.sh"


def project(root: Path, sha: str) -> Path:
    (root / "scripts" / "device").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "device")
    (root / "upstreams.lock").write_text("lockfile-version: 1\nupstreams:\n" + wheel_pin(sha))
    return root


def sh(root: Path, *args: str, **env) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHON": sys.executable, "SEED_PART_BYTES": "4096", **env}
    return subprocess.run(
        ["bash", "scripts/device/seed_wheelhouse.sh", *args],
        cwd=root,
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
    )


def split(tmp_path: Path) -> tuple[Path, Path, str]:
    w = make_wheel(tmp_path / "house" / WHEEL, members={"nvidia/nccl/lib/libnccl.so.2": os.urandom(10000).hex()})
    sha = hashlib.sha256(w.read_bytes()).hexdigest()
    here = project(tmp_path / "here", sha)
    p = sh(here, "split", REPROSTACK_WHEELHOUSE=str(w.parent), REPROSTACK_CACHE=str(tmp_path / "cache"))
    assert p.returncode == 0, p.stderr
    return here, project(tmp_path / "device", sha), sha


def test_parts_travel_one_per_call_and_join_to_the_locked_wheel(tmp_path):
    here, dev, sha = split(tmp_path)
    parts = sorted(here.glob(".c*"))
    assert len(parts) >= 3 and all((p / "part").stat().st_size <= 4096 for p in parts)
    for i, part in enumerate(parts, 1):
        shutil.copytree(part, dev / part.name)
        p = sh(dev, "receive")
        assert p.returncode == 0, p.stderr
        shutil.rmtree(dev / part.name)  # the next call carries only the next part
        if i < len(parts):
            assert f"still missing part(s) {i + 1}" in p.stdout
    joined = dev / ".cache" / "wheelhouse" / WHEEL
    assert f"sha256 {sha} (as upstreams.lock pins)" in p.stdout
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == sha
    assert list((dev / ".cache" / "wheelhouse-parts").iterdir()) == []


def test_a_torn_part_or_a_foreign_wheel_is_one_line_and_joins_nothing(tmp_path):
    here, dev, sha = split(tmp_path)
    shutil.copytree(here / ".c1", dev / ".c1")
    with open(dev / ".c1" / "part", "r+b") as f:
        f.write(b"X")
    p = sh(dev, "receive")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "/.c1/part: sha256 differs from its meta (torn transfer)" in p.stderr
    shutil.rmtree(dev / ".c1")
    shutil.copytree(here / ".c2", dev / ".c2")
    meta = (dev / ".c2" / "meta").read_text().replace(sha, "0" * 64)
    (dev / ".c2" / "meta").write_text(meta)
    p = sh(dev, "receive")
    assert p.returncode == 2 and f"{WHEEL} sha256 {'0' * 64} is not the one upstreams.lock pins" in p.stderr
    assert not (dev / ".cache" / "wheelhouse" / WHEEL).exists()


def test_a_forged_meta_is_one_line_and_stores_nothing(tmp_path):
    """hostile-input trial (session 4): a meta whose FILENAME only matches the lock's as a regex (`.` for `_`),
    a path-like or shell-like FILENAME, or part numbers out of range: exit 2, one line, nothing stored or joined."""
    here, dev, sha = split(tmp_path)
    parts = sorted(here.glob(".c*"))
    forged = WHEEL.replace("_", ".", 1)
    for bad, needle in [
        (forged, f"{forged} sha256 {sha} is not the one upstreams.lock pins"),
        ("a|" + WHEEL, "bad wheel filename"),
        ("$(touch pwned)", "bad wheel filename"),
        ("../" + WHEEL, "bad wheel filename"),
    ]:
        shutil.rmtree(dev / ".c1", ignore_errors=True)
        shutil.copytree(parts[0], dev / ".c1")
        f, n, i, psha, wsha = (dev / ".c1" / "meta").read_text().split()
        (dev / ".c1" / "meta").write_text(f"{bad} {n} {i} {psha} {wsha}\n")
        p = sh(dev, "receive")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and needle in p.stderr, (bad, p.stderr)
    for n, i in [("0", "1"), ("2", "3"), ("", "1"), ("99999", "1")]:
        f, _, _, psha, wsha = (parts[0] / "meta").read_text().split()
        (dev / ".c1" / "meta").write_text(f"{f} {n} {i} {psha} {wsha}\n")
        p = sh(dev, "receive")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "part" in p.stderr, (n, i, p.stderr)
    assert not (dev / "pwned").exists()
    assert list((dev / ".cache" / "wheelhouse-parts").iterdir()) == []
    assert list((dev / ".cache" / "wheelhouse").iterdir()) == []
