"""SGLang's DeepEP V2 seam (issue 42 item 1): patches/sglang/0001 is a `git format-patch` mail with `Upstream-Status:`
and the why, and it replays with zero fuzz through the patch stage (reprostack.patch.apply_series) onto a minimal git
repository holding just the patched file at the pinned bytes (the file of the pinned sglang 0.5.11 wheel, taken from
the wheel the lock pins by sha256), giving the patch's target blob; scripts/device/sglang_seam.sh, what the device
run uses to overlay it onto the installed wheel, does the same and refuses any other file.

The sgl-project/sglang repository is not pinned by git (its snapshot is too big to fetch here: gates/sglang.yaml says
so), so the base is the wheel's file, whose git blob the patch's `index` line names. The wheel is upstream code and
is not committed: the tests that need it read it from the reprostack cache (`reprostack fetch`'s wheels folder) and
are skipped, saying how to get it, where it is absent.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from reprostack import paths
from reprostack.gitcmd import git
from reprostack.lock import GitPin, PatchEntry
from reprostack.lock import load
from reprostack.patch import apply_series, check_patch_headers

REPO = Path(__file__).resolve().parents[1]
PATCH = REPO / "patches" / "sglang" / "0001-deepep-normal-dispatcher-on-DeepEP-V2-ElasticBuffer.patch"
REL = "sglang/srt/layers/moe/token_dispatcher/deepep.py"  # python/REL in the SGLang repository
SCRIPT = REPO / "scripts" / "device" / "sglang_seam.sh"
WHEEL_PINS = ("sglang-wheels-cp311", "sglang-h200-wheels")
# The tree of a repository holding only python/REL at the patch's target blob (what the replay must give).
PATCHED_TREE = "e638d0f36856f3cf16207ccc87db6a2b89b96211"


def blobs() -> tuple[str, str]:
    """(base, target) git blobs of the patch's one file, from its `index` line."""
    (m,) = re.findall(r"^index ([0-9a-f]{40})\.\.([0-9a-f]{40}) ", PATCH.read_text(), re.M)
    return m


def wheel_file() -> bytes:
    """The wheel's deepep.py, read from a pinned sglang wheel in the reprostack cache (sha256 checked), else skip."""
    lock = load(REPO / "upstreams.lock", REPO)
    tried = []
    for name in WHEEL_PINS:
        f = lock.upstreams[name].file("sglang")
        path = paths.cache_dir() / "wheels" / f.sha256 / f.filename
        tried.append(str(path))
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == f.sha256:
            with zipfile.ZipFile(path) as z:
                return z.read(REL)
    pytest.skip(
        "the pinned sglang 0.5.11 wheel is not in the reprostack cache (upstream code, never committed): "
        f"`reprostack fetch {WHEEL_PINS[0]}` where PyPI is reachable puts it at {tried[0]}"
    )


def blob_of(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_seam_is_a_format_patch_mail_with_upstream_status_and_its_why():
    h = check_patch_headers(PATCH)
    assert h.kind == "mbox" and h.messages == 1
    assert h.upstream_status.startswith("Inappropriate [")
    assert h.description == "moe/deepep: normal-mode dispatcher on DeepEP V2 ElasticBuffer"
    text = PATCH.read_text()
    # the why, and what is not mapped said in the header rather than guessed
    for words in ("never runs on ElasticBuffer", "What is not mapped", "low-latency mode", "--deepep-mode normal"):
        assert words in text, words
    assert re.findall(r"^diff --git a/(\S+) ", text, re.M) == [f"python/{REL}"]
    base, target = blobs()
    assert base != target


def test_the_seam_replays_with_zero_fuzz_onto_the_pinned_wheels_file(tmp_path):
    data = wheel_file()
    base, target = blobs()
    assert blob_of(data) == base  # the patch was made on exactly the pinned wheel's bytes
    up = tmp_path / "sglang"
    git("init", "-q", "--initial-branch=main", str(up))
    (up / "python" / REL).parent.mkdir(parents=True)
    (up / "python" / REL).write_bytes(data)
    git("add", "-A", cwd=up)
    git("commit", "-q", "-m", "sglang 0.5.11 wheel: deepep.py", cwd=up)
    rev, tree = git("rev-parse", "HEAD", cwd=up), git("rev-parse", "HEAD^{tree}", cwd=up)
    entry = PatchEntry(
        kind="mbox",
        value=str(PATCH.relative_to(REPO)),
        upstream_status=check_patch_headers(PATCH).upstream_status,
        index=1,
        sha256=hashlib.sha256(PATCH.read_bytes()).hexdigest(),
        tree=PATCHED_TREE,
    )
    pin = GitPin(
        "sglang", "https://github.com/sgl-project/sglang", rev, tree, patches=(entry,), patched_tree=PATCHED_TREE
    )
    res = apply_series(pin, up, tmp_path / "dest", REPO)
    assert res.tree == PATCHED_TREE
    assert git("rev-parse", f"HEAD:python/{REL}", cwd=tmp_path / "dest") == target


def test_the_device_overlay_patches_the_installed_wheel_once_and_refuses_another_file(tmp_path):
    data = wheel_file()
    base, target = blobs()
    site = tmp_path / "site"
    f = site / REL
    f.parent.mkdir(parents=True)
    f.write_bytes(data)

    def overlay():
        return subprocess.run(["bash", str(SCRIPT), str(site)], capture_output=True, text=True, timeout=60)

    p = overlay()
    assert p.returncode == 0, p.stderr
    assert f"blob {base} -> {target}" in p.stdout and blob_of(f.read_bytes()) == target
    p = overlay()  # already patched: left as it is
    assert p.returncode == 0 and "already the patched file" in p.stdout
    f.write_bytes(data + b"# another build\n")
    p = overlay()
    assert p.returncode == 2 and "not the pinned wheel's" in p.stderr and "not patched" in p.stderr
    assert f.read_bytes() == data + b"# another build\n"  # nothing written
