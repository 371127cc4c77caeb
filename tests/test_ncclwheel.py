"""NCCL from the pinned wheel (kernels.ncclwheel): which NCCL the lock asks for, and the wheel unpacked as untrusted
input. Real inputs: the project's own upstreams.lock and kernels/nccl.yaml, wheels written here with zipfile (the
layout of nvidia_nccl_cu13-2.30.4), a real local git stack for the gate path (test_sources.make_stack)."""

from __future__ import annotations

import dataclasses
import hashlib
import stat
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import gaterun
from gaterun import GateRun, run as run_gate_here

from reprostack.gates import kernelprep
from reprostack import hostinfo as kernelprep_hostinfo
from reprostack import sources
from reprostack.errors import BuildError, FetchError
from reprostack.fetch import Cache
from reprostack.kernels import ncclwheel
from reprostack.kernels.recipe import load_recipe
from reprostack.lock import load
from test_kernels import nccl_h
from test_sources import make_stack, write_project

REPO = Path(__file__).resolve().parents[1]
WHEEL = "nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_18_x86_64.whl"


def make_wheel(
    path: Path, *, version: str = "2.30.4", members: dict | None = None, drop: tuple = (), symlink: str | None = None
) -> Path:
    """A wheel shaped like NVIDIA's: nvidia/nccl/{include,lib}/ plus dist-info; `members` adds or replaces entries."""
    m = {
        "nvidia/nccl/include/nccl.h": nccl_h(version),
        "nvidia/nccl/include/nccl_device.h": "// device API\n",
        "nvidia/nccl/include/nccl_device/gin.h": "// gin\n",
        "nvidia/nccl/lib/libnccl.so.2": "\x7fELF our nccl",
        "nvidia/nccl/lib/libnccl_device.bc": "bc",
        f"nvidia_nccl_cu13-{version}.dist-info/METADATA": "Name: x\n",
    }
    m.update(members or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, text in m.items():
            if name not in drop:
                z.writestr(name, text)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, "/etc/passwd")
    return path


def wheel_pin(
    sha256: str, *, name: str = "nccl-wheel", version: str = "2.30.4", filename: str = WHEEL, quoted: bool = False
) -> str:
    """The lock lines (under `upstreams:`) of an nvidia-nccl-cu13 wheel pin (`quoted`: the sha256 in quotes, for a
    made-up all-digit one; the real lock and the seed script read it bare)."""
    if quoted:
        sha256 = f'"{sha256}"'
    return f"""\
  {name}:
    kind: wheel
    name: nvidia-nccl-cu13
    version: "{version}"
    files:
      - filename: {filename}
        sha256: {sha256}
"""


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def nccl_dirs(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "builds").glob("*nccl*") if p.is_dir())


# --------------------------------------------------------------------------- choose


def test_the_projects_lock_takes_the_wheel():
    lock, recipe = load(REPO / "upstreams.lock"), load_recipe(REPO, "nccl")
    assert recipe.wheel == "nccl-wheel"
    c = ncclwheel.choose(lock, recipe.source, recipe.wheel, "2.30.4")
    assert (c.kind, c.wheel_pin, c.version) == ("wheel", "nccl-wheel", "2.30.4")
    assert lock.get("nccl-wheel").files[0].sha256 == "534dbf3058cadb625f08ab0d17f1dffad3b961a2bfa360d66633fcf21be53f57"


def with_pin(lock, name, **kw):
    return dataclasses.replace(lock, upstreams={**lock.upstreams, name: dataclasses.replace(lock.get(name), **kw)})


def test_patched_unreleased_or_other_version_builds_from_source():
    lock = load(REPO / "upstreams.lock")
    patched = with_pin(lock, "nccl", patches=lock.get("deepep").patches[:1])
    assert ncclwheel.choose(patched, "nccl", "nccl-wheel", "2.30.4").why == "nccl has a patch series (1 entries)"
    master = with_pin(lock, "nccl", original="master 1933fdd6", fetch_refs=("refs/heads/master",))
    assert ncclwheel.choose(master, "nccl", "nccl-wheel", "2.30.4").kind == "source"
    untagged = with_pin(lock, "nccl", fetch_refs=("refs/heads/master",))  # names a tag it is not fetched from
    assert ncclwheel.choose(untagged, "nccl", "nccl-wheel", "2.30.4").kind == "source"
    c = ncclwheel.choose(lock, "nccl", "nccl-wheel", "2.30.5")  # the verified tree says another version
    assert (c.kind, c.why) == ("source", "nccl: original says 2.30.4, its version.mk says 2.30.5")
    newer = with_pin(lock, "nccl-wheel", version="2.31.0")
    assert (
        ncclwheel.choose(newer, "nccl", "nccl-wheel", "2.30.4").why
        == "wheel nvidia-nccl-cu13 2.31.0 is not the pinned release 2.30.4"
    )
    assert ncclwheel.choose(lock, "nccl", "no-such", "2.30.4").why == "the lock has no pin no-such"
    assert ncclwheel.choose(lock, "nccl", None, "2.30.4").kind == "source"


def test_a_recipe_naming_a_pin_that_is_no_wheel_is_one_line():
    lock = load(REPO / "upstreams.lock")
    with pytest.raises(BuildError) as ei:
        ncclwheel.choose(lock, "nccl", "deepep", "2.30.4", recipe_path="kernels/nccl.yaml")
    assert str(ei.value) == "kernels/nccl.yaml: wheel: 'deepep' is not a `kind: wheel` pin with files in the lock"


# --------------------------------------------------------------------------- unpack


def test_unpack_makes_the_source_build_layout_then_reuses(tmp_path):
    w = make_wheel(tmp_path / "wh" / WHEEL)
    b = ncclwheel.unpack(w, sha(w), "2.30.4", tmp_path / "cache")
    assert not b.reused and b.info["from"] == "wheel" and b.info["version"] == "2.30.4"
    files = sorted(str(p.relative_to(b.out / "build")) for p in (b.out / "build").rglob("*") if p.is_file())
    assert files == [
        "include/nccl.h",
        "include/nccl_device.h",
        "include/nccl_device/gin.h",
        "lib/libnccl.so.2",
        "lib/libnccl_device.bc",
    ]  # no dist-info
    again = ncclwheel.unpack(w, sha(w), "2.30.4", tmp_path / "cache")
    assert again.reused and again.out == b.out and again.key == b.key
    other = make_wheel(tmp_path / "wh2" / WHEEL, members={"nvidia/nccl/lib/libnccl.so.2": "other bytes"})
    assert ncclwheel.unpack(other, sha(other), "2.30.4", tmp_path / "cache").key != b.key  # keyed by content


@pytest.mark.parametrize(
    "kw,needle",
    [
        (
            {"members": {"nvidia/nccl/../../evil.so": "x"}},
            "member 'nvidia/nccl/../../evil.so' is a path outside the prefix (..)",
        ),
        ({"members": {"/etc/cron.d/x": "x"}}, "member '/etc/cron.d/x' is not a relative path"),
        ({"symlink": "nvidia/nccl/lib/libnccl.so"}, "member 'nvidia/nccl/lib/libnccl.so' is a symlink"),
        (
            {"drop": ("nvidia/nccl/lib/libnccl.so.2",)},
            "no nvidia/nccl/lib/libnccl.so.2 in the wheel; not an NCCL wheel",
        ),
        ({"drop": ("nvidia/nccl/include/nccl.h",)}, "no nvidia/nccl/include/nccl.h in the wheel"),
        ({"members": {"nvidia/nccl/include/nccl.h": nccl_h("2.28.9")}}, "its nccl.h says 2.28.9, the lock pins 2.30.4"),
    ],
)
def test_a_bad_wheel_is_one_line_and_leaves_no_prefix(tmp_path, kw, needle):
    w = make_wheel(tmp_path / WHEEL, **kw)
    with pytest.raises(BuildError) as ei:
        ncclwheel.unpack(w, sha(w), "2.30.4", tmp_path / "cache")
    msg = str(ei.value)
    assert msg.startswith(f"{WHEEL}: ") and needle in msg and "\n" not in msg
    assert nccl_dirs(tmp_path / "cache") == [] and not (tmp_path / "escaped").exists()


def test_hostile_zip_tricks_are_one_line_and_leave_no_prefix(tmp_path):
    """hostile-input trial (session 4): a member twice (a second nccl.h after the good one), a member whose
    declared size is 1 byte but inflates to 20 MiB (a lying zip bomb), a member declared larger than the bound."""
    import re
    import struct
    import warnings

    dup = make_wheel(tmp_path / "dup" / WHEEL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name it is told to write
        with zipfile.ZipFile(dup, "a") as z:
            z.writestr("nvidia/nccl/include/nccl.h", nccl_h("2.28.9"))

    def resized(folder: str, size: int, local: bool) -> Path:
        w = make_wheel(tmp_path / folder / WHEEL, members={"nvidia/nccl/lib/big": "\0" * (20 << 20)})
        with zipfile.ZipFile(w) as z:
            header = z.getinfo("nvidia/nccl/lib/big").header_offset
        data = bytearray(w.read_bytes())
        for m in re.finditer(b"PK\x01\x02", data):  # the central directory entry's uncompressed size
            n = struct.unpack("<H", data[m.start() + 28 : m.start() + 30])[0]
            if data[m.start() + 46 : m.start() + 46 + n] == b"nvidia/nccl/lib/big":
                struct.pack_into("<I", data, m.start() + 24, size)
        if local:
            struct.pack_into("<I", data, header + 22, size)
        w.write_bytes(bytes(data))
        return w

    for w, needle in [
        (dup, "member 'nvidia/nccl/include/nccl.h' is in the wheel twice; not unpacked"),
        (resized("lies", 1, True), "cannot unpack: Bad CRC-32"),
        (resized("huge", 0xFFFFFFF0, False), "nvidia/nccl/ would unpack to more than 4 GiB"),
    ]:
        cache = tmp_path / w.parent.name / "cache"
        with pytest.raises(BuildError) as ei:
            ncclwheel.unpack(w, sha(w), "2.30.4", cache)
        assert str(ei.value).startswith(f"{WHEEL}: ") and needle in str(ei.value) and "\n" not in str(ei.value)
        assert nccl_dirs(cache) == []


def test_a_wheelhouse_file_swapped_after_its_check_never_reaches_the_cache(tmp_path, monkeypatch):
    """hostile-input trial (session 4): a shared wheelhouse whose file is replaced between the sha256 check and
    the copy into the cache (the copy is what is hashed now, so the swap is caught, nothing is cached)."""
    import shutil as real_shutil
    from reprostack.fetch import wheels

    good = make_wheel(tmp_path / "house" / WHEEL)
    digest = sha(good)
    lock_path = tmp_path / "upstreams.lock"
    lock_path.write_text("lockfile-version: 1\nupstreams:\n" + wheel_pin(digest))
    lock = load(lock_path)
    evil = make_wheel(tmp_path / "evil" / WHEEL, members={"nvidia/nccl/lib/libnccl.so.2": "evil"})
    copy = real_shutil.copyfile

    def swap_then_copy(src, dst, *a, **kw):
        good.write_bytes(evil.read_bytes())  # the attacker's swap, after the check, before the copy
        return copy(src, dst, *a, **kw)

    monkeypatch.setattr(wheels.shutil, "copyfile", swap_then_copy)
    with pytest.raises(FetchError) as ei:
        wheels.fetch_wheels(lock, "nccl-wheel", cache_root=tmp_path / "cache", wheelhouses=[good.parent], offline=True)
    assert f"sha256 {sha(evil)}, but" in str(ei.value) and "\n" not in str(ei.value)
    assert [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_not_a_zip_is_one_line(tmp_path):
    w = tmp_path / WHEEL
    w.write_bytes(b"<html>rate limited</html>")
    with pytest.raises(BuildError, match=rf"^{WHEEL}: cannot unpack: File is not a zip file$"):
        ncclwheel.unpack(w, sha(w), "2.30.4", tmp_path / "cache")


# --------------------------------------------------------------------------- the gate's kernels step


def gate_options(tmp_path: Path, wheel: Path) -> GateRun:
    """A project whose lock pins the release NCCL (a real local git repo) and `wheel` as nccl-wheel."""
    root = tmp_path / "project"
    lock_path = write_project(root, make_stack(tmp_path / "srv"))
    lock_path.write_text(lock_path.read_text() + wheel_pin(sha(wheel)))
    return gaterun.options(
        "micro",
        root=root,
        lock=load(lock_path),
        out_dir=tmp_path / "out",
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
    )


def prepared(opts: GateRun) -> tuple[dict, GateRun]:
    """The verified trees, and the run made offline (the wheel must come from the wheelhouse)."""
    c = opts.ctx
    trees = {n: sources.prepare(c.lock, n, c.fetch, c.root) for n in ("nccl", "deepep")}
    return trees, dataclasses.replace(
        opts, ctx=dataclasses.replace(c, fetch=dataclasses.replace(c.fetch, offline=True))
    )


@pytest.fixture
def no_gpu_builds(monkeypatch):
    calls = []
    monkeypatch.setattr(
        kernelprep.toolchain, "detect", lambda py, arch=None, **k: SimpleNamespace(key_fields=lambda: {"arch": "90"})
    )
    monkeypatch.setattr(kernelprep.kbuild, "build_nccl", lambda *a, **k: calls.append("make nccl"))
    monkeypatch.setattr(
        kernelprep.kbuild,
        "build_deepep",
        lambda src, tree, recipe, tc, nccl, cache, **k: SimpleNamespace(
            component="deepep", key="k", reused=True, origin="build", info={"seconds": 0}, nccl=nccl
        ),
    )
    return calls


def test_gate_uses_the_verified_wheel_from_a_wheelhouse(tmp_path, monkeypatch, no_gpu_builds):
    w = make_wheel(tmp_path / "house" / WHEEL)
    monkeypatch.setenv("REPROSTACK_WHEELHOUSE", str(tmp_path / "house"))
    opts = gate_options(tmp_path, w)
    trees, opts = prepared(opts)
    prov, timings = {}, {}
    _, nccl, deepep = kernelprep.build_kernels(opts.opts, opts.ctx, trees, prov, timings)
    assert no_gpu_builds == [] and deepep.nccl is nccl  # no make; DeepEP gets the unpacked wheel
    assert (nccl.out / "build" / "lib" / "libnccl.so.2").is_file() and nccl.info["wheel_sha256"] == sha(w)
    assert prov["nccl_from"]["kind"] == "wheel" and "nccl_build_s" in timings


def test_gate_refuses_a_wheelhouse_file_with_another_sha256(tmp_path, monkeypatch, no_gpu_builds):
    good = make_wheel(tmp_path / "good" / WHEEL)
    make_wheel(tmp_path / "house" / WHEEL, members={"nvidia/nccl/lib/libnccl.so.2": "tampered"})
    monkeypatch.setenv("REPROSTACK_WHEELHOUSE", str(tmp_path / "house"))
    opts = gate_options(tmp_path, good)
    trees, opts = prepared(opts)
    with pytest.raises(FetchError) as ei:
        kernelprep.build_kernels(opts.opts, opts.ctx, trees, {}, {})
    assert f"house/{WHEEL}: sha256 " in str(ei.value) and f"pins {WHEEL} as {sha(good)}" in str(ei.value)
    assert nccl_dirs(tmp_path / "cache") == [] and no_gpu_builds == []


def test_the_overlay_puts_the_unpacked_wheel_nccl_in_torchs_place(tmp_path):
    """The one-NCCL overlay (kernels.runtime) over a wheel-made prefix: torch's nvidia/nccl/lib/libnccl.so.2 is ours."""
    from reprostack.kernels import runtime
    from test_kernels import fake_site

    w = make_wheel(tmp_path / WHEEL)
    b = ncclwheel.unpack(w, sha(w), "2.30.4", tmp_path / "cache")
    dest = runtime.make_overlay(fake_site(tmp_path), b.out / "build" / "lib", tmp_path / "overlay")
    libs = sorted((dest / "nvidia" / "nccl" / "lib").iterdir())
    assert [p.name for p in libs] == ["libnccl.so.2"]
    assert libs[0].resolve() == (b.out / "build" / "lib" / "libnccl.so.2").resolve()


# --------------------------------------------------------------------------- a stack whose NCCL is a wheel alone

WHEEL_2_32 = "nvidia_nccl_cu13-2.32.3-py3-none-manylinux_2_27_x86_64.whl"


def alone_options(tmp_path: Path, wheel_sha: str) -> GateRun:
    """A project lock with wheel pin nccl-wheel-2-32 and a stack `gdaki` whose nccl is that wheel (no git NCCL);
    the nccl git pin's server is taken away, so anything that fetched it would fail."""
    root = tmp_path / "project"
    s = make_stack(tmp_path / "srv")
    lock_path = write_project(root, s)
    lock_path.write_text(
        lock_path.read_text()
        + wheel_pin(wheel_sha, name="nccl-wheel-2-32", version="2.32.3", filename=WHEEL_2_32, quoted=True)
        + """\
stacks:
  gdaki:
    description: NCCL 2.32.3 from its wheel alone
    overrides:
      nccl: {wheel: nccl-wheel-2-32}
"""
    )
    (tmp_path / "srv" / "nccl").rename(tmp_path / "srv" / "nccl-gone")
    return gaterun.options(
        "micro",
        root=root,
        lock=load(lock_path, stack="gdaki"),
        out_dir=tmp_path / "out",
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
    )


def test_a_wheel_alone_stack_builds_with_that_wheel_and_no_nccl_tree(tmp_path, monkeypatch, no_gpu_builds):
    w = make_wheel(tmp_path / "house" / WHEEL_2_32, version="2.32.3")
    monkeypatch.setenv("REPROSTACK_WHEELHOUSE", str(tmp_path / "house"))
    opts = alone_options(tmp_path, sha(w))
    trees, pre = kernelprep.source_trees(opts.opts, opts.ctx, ("nccl", "deepep"))
    assert set(trees) == {"deepep"} and pre is None  # no nccl git source fetched
    prov, timings = {}, {}
    _, nccl, deepep = kernelprep.build_kernels(opts.opts, opts.ctx, trees, prov, timings)
    assert no_gpu_builds == [] and deepep.nccl is nccl and nccl.info["version"] == "2.32.3"
    assert nccl.info["wheel"] == WHEEL_2_32 and nccl.info["wheel_sha256"] == sha(w)
    assert prov["nccl_from"] == {
        "kind": "wheel",
        "why": "stack gdaki pins nccl as wheel nccl-wheel-2-32 (nvidia-nccl-cu13==2.32.3) alone; no git source",
    }


def test_a_wheel_alone_with_another_sha256_is_one_line(tmp_path, monkeypatch, no_gpu_builds):
    make_wheel(tmp_path / "house" / WHEEL_2_32, version="2.32.3")
    monkeypatch.setenv("REPROSTACK_WHEELHOUSE", str(tmp_path / "house"))
    opts = alone_options(tmp_path, "0" * 64)
    trees, _ = kernelprep.source_trees(opts.opts, opts.ctx, ("nccl", "deepep"))
    opts = dataclasses.replace(
        opts, ctx=dataclasses.replace(opts.ctx, fetch=dataclasses.replace(opts.fetch, offline=True))
    )  # the wheel must come from the wheelhouse
    with pytest.raises(FetchError) as ei:
        kernelprep.build_kernels(opts.opts, opts.ctx, trees, {}, {})
    msg = str(ei.value)
    assert "\n" not in msg and f"house/{WHEEL_2_32}: sha256 " in msg and f"pins {WHEEL_2_32} as {'0' * 64}" in msg
    assert nccl_dirs(tmp_path / "cache") == [] and no_gpu_builds == []


def test_a_wheel_alone_whose_nccl_h_is_another_version_is_one_line(tmp_path, monkeypatch, no_gpu_builds):
    w = make_wheel(tmp_path / "house" / WHEEL_2_32, version="2.32.2")  # right name and sha256, wrong nccl.h
    monkeypatch.setenv("REPROSTACK_WHEELHOUSE", str(tmp_path / "house"))
    opts = alone_options(tmp_path, sha(w))
    trees, _ = kernelprep.source_trees(opts.opts, opts.ctx, ("nccl", "deepep"))
    with pytest.raises(BuildError) as ei:
        kernelprep.build_kernels(opts.opts, opts.ctx, trees, {}, {})
    assert str(ei.value) == f"{WHEEL_2_32}: its nccl.h says 2.32.2, the lock pins 2.32.3"
    assert nccl_dirs(tmp_path / "cache") == [] and no_gpu_builds == []


def test_a_wheel_alone_stack_skips_without_gpu_naming_the_wheel(tmp_path, monkeypatch):
    opts = alone_options(tmp_path, "1" * 64)
    monkeypatch.setattr(kernelprep_hostinfo, "collect", lambda: {"gpu_count": 0, "gpus": [], "efa_devices": []})
    report = run_gate_here(opts)
    assert report.result == "skip", report
    # the wheel is named, and never among what was verified (it is fetched only when kernels are built)
    assert (
        f"sources were verified and patched (deepep {opts.lock.git('deepep').patched_tree[:12]}); NCCL is the wheel "
        f"{WHEEL_2_32} of pin nccl-wheel-2-32, not fetched here" in report.reason
    )
    assert report.provenance["upstreams"]["nccl"] == {
        "wheel": "nccl-wheel-2-32",
        "version": "2.32.3",
        "files": [f"{WHEEL_2_32} {'1' * 64}"],
    }
