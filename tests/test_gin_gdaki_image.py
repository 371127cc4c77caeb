"""The gin-gdaki stack's image (containers/deepep-gin-gdaki): NCCL from the stack's pinned wheel alone.

Real inputs, no registry, no engine: a project made of the local git stack of test_sources (deepep with its series;
the nccl server doubles as the aws-ofi-nccl pin), a small wheel shaped like nvidia-nccl-cu13 2.32.3 (test_ncclwheel:
the real one is 305 MB) pinned as `nccl-wheel-2-32` with its real sha256, a stack `gin-gdaki` whose `nccl` is that
wheel, copies of the committed deepep and deepep-gin-gdaki recipes and a one-line substrate on the local test base.
The context is planned by the build engine itself (containers.engine, with the parent image given as already
built); the in-image scripts (unpack-nccl-wheel.py, deepep's record-kernels.py with the wheel's NCCL) run for real
on a folder laid out like the image; kernels.prebuilt.check reads what they wrote."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import gaterun
from reprostack.gates import kernelprep
from rich.console import Console

from reprostack import cli, sources
from reprostack.containers.engine import BuildOptions, ImageResult, _Builder
from reprostack.containers.recipe import load_all
from reprostack.fetch import Cache
from reprostack.kernels import prebuilt
from reprostack.kernels.prebuilt import PrebuiltError
from reprostack.kernels.recipe import load_recipe
from reprostack.lock import load
from test_ncclwheel import WHEEL_2_32, make_wheel, sha, wheel_pin
from test_sources import make_stack, write_project

REPO = Path(__file__).resolve().parents[1]
GDAKI = REPO / "containers" / "deepep-gin-gdaki"
RECORD = REPO / "containers" / "deepep" / "record-kernels.py"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in (
        "REPROSTACK_MIRRORS",
        "REPROSTACK_BASE_OVERRIDE",
        "SOURCE_DATE_EPOCH",
        "REPROSTACK_WHEELHOUSE",
        "REPROSTACK_STACK",
    ):
        monkeypatch.delenv(k, raising=False)


def project(tmp_path: Path, wheel_sha: str) -> Path:
    """The project root described in the module doc; returns the lock's path."""
    root = tmp_path / "project"
    s = make_stack(tmp_path / "srv")
    lock_path = write_project(root, s)
    text = lock_path.read_text()
    ofi = text[text.index("  nccl:\n") :].replace("  nccl:\n", "  aws-ofi-nccl:\n", 1)
    lock_path.write_text(
        text
        + ofi
        + wheel_pin(wheel_sha, name="nccl-wheel-2-32", version="2.32.3", filename=WHEEL_2_32)
        + """\
stacks:
  gin-gdaki:
    description: NCCL 2.32.3 from its wheel alone
    overrides:
      nccl: {wheel: nccl-wheel-2-32}
"""
    )
    for r in ("deepep", "deepep-gin-gdaki"):
        shutil.copytree(REPO / "containers" / r, root / "containers" / r)
    sub = root / "containers" / "substrate"
    sub.mkdir()
    (sub / "image.yaml").write_text("description: test substrate\nbase: local:reprostack-test/base:1\n")
    (sub / "Dockerfile").write_text("FROM {{ from }}\n")
    return lock_path


def builder(lock_path: Path, tmp_path: Path, **kw) -> _Builder:
    """The build engine's planner for that project, its substrate taken as built (no engine is asked)."""
    lock = load(lock_path, stack="gin-gdaki")
    kw.setdefault("client", object())
    opts = BuildOptions(
        root=lock_path.parent,
        lock=lock,
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
        out_dir=tmp_path / "out",
        console=Console(file=io.StringIO()),
        **kw,
    )
    b = _Builder(opts)
    b.done["substrate"] = ImageResult(
        "substrate", "t/substrate:1", "sha256:" + "cd" * 32, "reused", 0.0, 0, "", "", "", 0, None
    )
    return b


def one_line(msg: str) -> str:
    assert "\n" not in msg.strip() and "Traceback" not in msg
    return msg.strip()


def test_context_holds_the_stacks_wheel_and_the_dockerfile_checks_its_sha256(tmp_path):
    w = make_wheel(tmp_path / "house" / WHEEL_2_32, version="2.32.3")
    lock_path = project(tmp_path, sha(w))
    b = builder(lock_path, tmp_path, wheelhouses=[tmp_path / "house"])  # the wheel: from the wheelhouse
    recipe = load_all(lock_path.parent)["deepep-gin-gdaki"]
    p = b.plan(recipe)
    with tarfile.open(fileobj=io.BytesIO(p.context.tar())) as t:
        names = t.getnames()
        got = hashlib.sha256(t.extractfile(f"wheels/nccl/{WHEEL_2_32}").read()).hexdigest()
        dockerfile = t.extractfile("Dockerfile").read().decode()
        reqs = t.extractfile("wheels/nccl/requirements.txt").read().decode()
    assert got == sha(w) == b.o.lock.get("nccl-wheel-2-32").files[0].sha256
    line = re.search(r'echo "([0-9a-f]{64})  (\S+)" \| sha256sum -c -', dockerfile)
    assert line and line.groups() == (sha(w), WHEEL_2_32)
    assert reqs == f"nvidia-nccl-cu13==2.32.3 --hash=sha256:{sha(w)}\n"
    assert not any(n.startswith("src/nccl") for n in names) and "src/deepep/README.md" in names
    assert {"files/unpack-nccl-wheel.py", "files/record-kernels.py"} <= set(names)
    assert p.args["NCCL_VERSION"] == "2.32.3" and "wheel_pin=nccl-wheel-2-32" in dockerfile
    assert p.upstreams["nccl"]["kind"] == "wheel" and p.upstreams["nccl"]["wheels"] == 1
    # the wheel's sha256 is part of what keys the image: the rendered Dockerfile holds it
    assert sha(w) in p.dockerfile


@pytest.mark.parametrize("where", ["wheelhouse", "cache"])
def test_a_wheel_with_other_bytes_is_refused_in_one_line_before_the_engine(tmp_path, capsys, where):
    good = make_wheel(tmp_path / "good" / WHEEL_2_32, version="2.32.3")
    lock_path = project(tmp_path, sha(good))
    bad = make_wheel(tmp_path / "house" / WHEEL_2_32, version="2.32.2")  # right name, other bytes
    cache = tmp_path / "cache"
    argv = [
        "--stack",
        "gin-gdaki",
        "build",
        "deepep-gin-gdaki",
        "--lock",
        str(lock_path),
        "--cache",
        str(cache),
        "--offline",
        "--out",
        str(tmp_path / "out"),
    ]
    if where == "wheelhouse":
        argv += ["--wheelhouse", str(tmp_path / "house")]
    else:  # a shared cache whose copy was changed after it was verified
        slot = cache / "wheels" / sha(good) / WHEEL_2_32
        slot.parent.mkdir(parents=True)
        shutil.copy(bad, slot)
    assert cli.main(argv) == 2
    err = one_line(capsys.readouterr().err)
    if where == "wheelhouse":
        assert f"house/{WHEEL_2_32}: sha256 {sha(bad)}" in err and f"pins {WHEEL_2_32} as {sha(good)}" in err
    else:
        assert f"the cached {WHEEL_2_32} had sha256 {sha(bad)} (removed)" in err and "--offline" in err
    assert "upstreams.lock" in err and "no Docker engine" not in err
    assert not (tmp_path / "out").exists() and not (cache / "wheels" / sha(good) / WHEEL_2_32).exists()


def wheel_args(img: Path, wheel_sha: str) -> list[str]:
    """record-kernels.py's `nccl.*` arguments as the deepep-gin-gdaki Dockerfile passes them."""
    return [
        "nccl.wheel_pin=nccl-wheel-2-32",
        f"nccl.wheel={WHEEL_2_32}",
        f"nccl.wheel_sha256={wheel_sha}",
        f"nccl.wheel_path={img / 'wheels' / 'nccl' / WHEEL_2_32}",
        "nccl.version=2.32.3",
        f"nccl.include={img / 'nccl' / 'include'}",
        f"nccl.lib={img / 'nccl' / 'lib' / 'libnccl.so.2'}",
    ]


def fake_image(img: Path, wheel: Path, lock) -> Path:
    """A folder laid out like the deepep-gin-gdaki image after its RUN steps: the wheel unpacked by the recipe's
    unpack-nccl-wheel.py, a deep_ep with _C, nvcc; the manifest written by record-kernels.py as the recipe runs it."""
    wdir = img / "wheels" / "nccl"
    wdir.mkdir(parents=True)
    shutil.copy(wheel, wdir / WHEEL_2_32)
    subprocess.run(
        [sys.executable, str(GDAKI / "unpack-nccl-wheel.py"), str(wdir / WHEEL_2_32), str(img / "nccl"), "2.32.3"],
        check=True,
        capture_output=True,
    )
    (img / "src" / "deepep").mkdir(parents=True)
    pkg = img / "site" / "deep_ep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_C.cpython-310-x86_64-linux-gnu.so").write_bytes(b"\x7fELF deep_ep _C")
    nvcc = img / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    out, deepep = img / "kernels.json", lock.get("deepep")
    env = {**os.environ, "CUDA_HOME": str(img / "cuda"), "PYTHONPATH": str(img / "site")}
    subprocess.run(
        [
            sys.executable,
            str(RECORD),
            str(out),
            *wheel_args(img, lock.get("nccl").files[0].sha256),
            "arch=90",
            "image=deepep-gin-gdaki",
            f"deepep.rev={deepep.rev}",
            f"deepep.patched_tree={deepep.patched_tree}",
            f"deepep.recipe={load_recipe(lock.path.parent, 'deepep').digest}",
            f"deepep.src={img / 'src' / 'deepep'}",
            "deepep.package=python",
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    return out


@pytest.fixture
def image(tmp_path):
    w = make_wheel(tmp_path / "house" / WHEEL_2_32, version="2.32.3")
    lock_path = project(tmp_path, sha(w))
    gin = load(lock_path, stack="gin-gdaki")
    return fake_image(tmp_path / "img", w, gin), gin, w


def test_prebuilt_check_accepts_the_wheel_nccl_the_stack_pins(image, tmp_path):
    m, gin, w = image
    d = json.loads(m.read_text())
    n = d["components"]["nccl"]
    assert (n["kind"], n["wheel_pin"], n["wheel"], n["wheel_sha256"], n["nccl_version"]) == (
        "wheel",
        "nccl-wheel-2-32",
        WHEEL_2_32,
        sha(w),
        "2.32.3",
    )
    assert "rev" not in n and d["components"]["deepep"]["nccl_version"] == "2.32.3"
    lib = str(tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2")
    assert n["files"] == {lib: sha(Path(lib))}
    pre = prebuilt.check(m, gin, gin.path.parent, ("nccl", "deepep"), arch="90")
    assert pre.kernels_provenance()["nccl"]["wheel_sha256"] == sha(w)
    # the micro gate in container mode: no nccl tree, the manifest's nccl checked and used
    opts = gaterun.options(
        "micro",
        root=gin.path.parent,
        lock=gin,
        out_dir=tmp_path / "out",
        prebuilt=m,
        arch="90",
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
    )
    trees, pre = kernelprep.source_trees(opts.opts, opts.ctx, ("nccl", "deepep"))
    assert set(trees) == {"deepep"} and pre.components["nccl"]["kind"] == "wheel"
    assert pre.nccl_file()[0].parent == Path(lib).parent


@pytest.mark.parametrize(
    "case, field, have, want",
    [
        ("wheel_pin", "components.nccl.wheel_pin", "nccl-wheel", "nccl-wheel-2-32"),
        ("wheel_sha256", "components.nccl.wheel_sha256", "0" * 64, None),
        ("nccl_version", "components.nccl.nccl_version", "2.32.2", "2.32.3"),
        ("campaign", "components.nccl.kind", f"nccl from wheel {WHEEL_2_32}", "git pin"),
        ("replaced_lib", "components.nccl.files[", None, None),
    ],
)
def test_prebuilt_check_refuses_another_wheel_nccl_in_one_line(image, tmp_path, case, field, have, want):
    m, gin, w = image
    d = json.loads(m.read_text())
    n, lock = d["components"]["nccl"], gin
    if case in ("wheel_pin", "wheel_sha256", "nccl_version"):
        n[case] = have
        d["components"]["deepep"]["nccl_version"] = n["nccl_version"]
    if case == "campaign":
        lock = load(gin.path, stack="campaign")
    if case == "replaced_lib":
        (tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"another NCCL")
    m.write_text(json.dumps(d))
    with pytest.raises(PrebuiltError) as ei:
        prebuilt.check(m, lock, lock.path.parent, ("nccl", "deepep"), arch="90")
    msg = one_line(str(ei.value))
    assert msg.startswith(f"{m}: {field}"), msg
    if have:
        assert f"the image has {have}" in msg
    if want:
        assert want in msg
    if case == "wheel_sha256":
        assert f"has {sha(w)}" in msg and "stack gin-gdaki" in msg


def test_a_campaign_manifest_is_refused_under_the_wheel_stack_in_one_line(image, tmp_path):
    m, gin, _ = image
    d = json.loads(m.read_text())
    pin = load(gin.path, stack="campaign").get("nccl")
    d["components"]["nccl"] = {
        **{k: v for k, v in d["components"]["deepep"].items() if k != "paths"},
        "pin": "nccl",
        "rev": pin.rev,
        "patched_tree": pin.tree,
        "paths": {"src": str(tmp_path)},
        "files": {},
    }
    m.write_text(json.dumps(d))
    with pytest.raises(PrebuiltError) as ei:
        prebuilt.check(m, gin, gin.path.parent, ("nccl", "deepep"), arch="90")
    msg = one_line(str(ei.value))
    assert msg.startswith(f"{m}: components.nccl.kind: the image has nccl kernel from rev {pin.rev}")
    assert "nvidia-nccl-cu13 2.32.3 from its wheel alone" in msg and "another stack" in msg


def test_in_image_scripts_refuse_a_hostile_or_changed_wheel_and_write_nothing(tmp_path):
    script = GDAKI / "unpack-nccl-wheel.py"
    evil = make_wheel(tmp_path / "evil.whl", version="2.32.3", members={"nvidia/nccl/lib/../../../x": "boom"})
    r = subprocess.run(
        [sys.executable, str(script), str(evil), str(tmp_path / "p1"), "2.32.3"], capture_output=True, text=True
    )
    assert r.returncode == 1 and "is a path outside the prefix (..)" in one_line(r.stderr)
    assert not (tmp_path / "p1").exists() and not (tmp_path / "p1.part").exists()
    other = make_wheel(tmp_path / "other.whl", version="2.32.2")
    r = subprocess.run(
        [sys.executable, str(script), str(other), str(tmp_path / "p2"), "2.32.3"], capture_output=True, text=True
    )
    assert r.returncode == 1 and "its nccl.h says 2.32.2, the lock pins 2.32.3" in one_line(r.stderr)
    assert not (tmp_path / "p2").exists() and not (tmp_path / "p2.part").exists()
    good = make_wheel(tmp_path / "w" / WHEEL_2_32, version="2.32.3")
    subprocess.run(
        [sys.executable, str(script), str(good), str(tmp_path / "p3"), "2.32.3"], check=True, capture_output=True
    )
    assert (tmp_path / "p3" / "lib" / "libnccl.so.2").is_file() and (tmp_path / "p3" / "include" / "nccl.h").is_file()
    # the manifest writer re-hashes the image's copy of the wheel: other bytes than the lock's -> exit 1, no manifest
    (tmp_path / "img" / "wheels" / "nccl").mkdir(parents=True)
    shutil.copy(good, tmp_path / "img" / "wheels" / "nccl" / WHEEL_2_32)
    shutil.copytree(tmp_path / "p3", tmp_path / "img" / "nccl")
    r = subprocess.run(
        [
            sys.executable,
            str(RECORD),
            str(tmp_path / "k.json"),
            *wheel_args(tmp_path / "img", "0" * 64),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and f"sha256 {sha(good)}, the lock pins {'0' * 64}" in one_line(r.stderr)
    assert not (tmp_path / "k.json").exists()


# --------------------------------------------------------------------------- on a Docker engine (the busybox test base)

from dockerd import docker_client, test_base  # noqa: E402,F401 (session fixtures)


def test_the_recipes_sha256_line_passes_in_a_real_build_on_the_test_base(tmp_path, docker_client, test_base):
    """The committed recipe's own `sha256sum -c` line (the CUDA steps around it cannot run here) in a real build on
    the busybox test base, under the stack: the context's wheel has the lock's bytes inside the image."""
    import uuid

    from reprostack.containers import build_images

    w = make_wheel(tmp_path / "house" / WHEEL_2_32, version="2.32.3")
    lock_path = project(tmp_path, sha(w))
    line = re.search(
        r"^RUN cd /opt/reprostack/wheels/nccl \\\n && (echo .*sha256sum -c -)", (GDAKI / "Dockerfile").read_text(), re.M
    ).group(1)
    d = lock_path.parent / "containers" / "nccl-wheel-check"
    d.mkdir()
    (d / "image.yaml").write_text("parent: substrate\nwheels:\n  - {pin: nccl, dest: wheels/nccl}\n")
    (d / "Dockerfile").write_text(
        "FROM {{ from }}\nCOPY {{ wheels.nccl.dest }} /opt/reprostack/wheels/nccl\n"
        f"RUN cd /opt/reprostack/wheels/nccl && {line} > /opt/reprostack/sha256sum.out\n"
    )
    ns = f"rstest-{uuid.uuid4().hex[:10]}"
    try:
        b = builder(
            lock_path,
            tmp_path,
            wheelhouses=[tmp_path / "house"],
            namespace=ns,
            client=docker_client,
            show_progress=False,
        )
        results = build_images(["nccl-wheel-check"], b.o)
        tag = results[-1].tag
        out = docker_client.containers.run(
            tag, ["cat", "/opt/reprostack/sha256sum.out"], network_mode="none", remove=True
        ).decode()
        assert out == f"{WHEEL_2_32}: OK\n"
        assert json.loads(docker_client.images.get(tag).labels["dev.reprostack.upstreams"])["nccl"]["kind"] == "wheel"
    finally:
        for img in docker_client.images.list(filters={"reference": f"{ns}/*"}):
            for t in img.tags:
                docker_client.images.remove(t, force=True)
