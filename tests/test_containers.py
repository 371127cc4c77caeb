"""Stage `build` (images): recipes, the deterministic context, and real builds on a Docker engine.

The engine is the one of tests/dockerd.py (DOCKER_HOST, or a dockerd started for the session; containers
get no network). The base is the busybox image `reprostack-test/base:1` made from Debian's busybox-static,
never a registry. Sources are the local git stack of test_sources.py (a `deepep` pin with a one-commit
cherry-pick series and a submodule, an `nccl` pin), prepared by reprostack.sources into a cache in tmp_path.
Each test tags its images under its own namespace, so no test reuses another's images.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

import gitrepos as gr
import patchrepos
import dockerd
import registry as registry_mod
from reprostack import lock as lockmod
from reprostack import sources
from reprostack.containers import (
    BuildOptions,
    ImageBuildError,
    RecipeError,
    build_images,
    load_all,
    render_recipe,
    tree_in_image,
)
from reprostack.containers.context import Context
from reprostack.containers.engine import rfc3339
from reprostack.containers.render import instructions
from reprostack.containers.recipe import load_recipe, parse_overrides, recipe_digest, resolve_lock_bases
from reprostack.fetch import Cache
from test_sources import SUB, lock_text, make_stack

docker_client, test_base = dockerd.docker_client, dockerd.test_base  # session fixtures (tests/dockerd.py)

REPO_ROOT = Path(__file__).resolve().parents[1]
CUDA = "nvcr.io/nvidia/cuda:13.0.0-devel-ubuntu22.04"
IN_IMAGE = "/opt/reprostack/src/deepep"
GPU_RECIPES = (
    "substrate",
    "substrate-cuda-devel",
    "deepep",
    "deepep-gin-gdaki",
    "vllm",
    "sglang",
    "trtllm",
    "megatron",
    "nemo-rl",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("REPROSTACK_MIRRORS", "REPROSTACK_BASE_OVERRIDE", "SOURCE_DATE_EPOCH"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def stack(tmp_path):
    return make_stack(tmp_path / "srv")


def make_project(root: Path, stack, recipes=("selftest", "selftest-child")) -> Path:
    """A project root: the stack's lock plus copies of the committed recipes `recipes`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "upstreams.lock").write_text(lock_text(stack))
    for r in recipes:
        shutil.copytree(REPO_ROOT / "containers" / r, root / "containers" / r)
    return root


def add_recipe(root: Path, name: str, image_yaml: str, dockerfile: str, files: dict | None = None) -> Path:
    d = root / "containers" / name
    d.mkdir(parents=True)
    (d / "image.yaml").write_text(image_yaml)
    (d / "Dockerfile").write_text(dockerfile)
    for k, v in (files or {}).items():
        (d / k).write_text(v)
    return d


def options(root: Path, tmp_path: Path, client, ns: str, **kw) -> BuildOptions:
    kw.setdefault("console", Console(file=io.StringIO(), width=160))
    return BuildOptions(
        root=root,
        lock=lockmod.load(root / "upstreams.lock"),
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
        out_dir=tmp_path / "out",
        namespace=ns,
        client=client,
        **kw,
    )


@pytest.fixture
def ns(docker_client):
    """A tag namespace of this test's own; its tags are removed afterwards."""
    name = f"rstest-{uuid.uuid4().hex[:10]}"
    yield name
    for img in docker_client.images.list(filters={"reference": f"{name}/*"}):
        for t in img.tags:
            if t.startswith(name + "/"):
                docker_client.images.remove(t, force=True)


class BuildSpy:
    """Records the tag of every build call the engine makes (the no-op check is: no call at all)."""

    def __init__(self, client, monkeypatch):
        self.tags: list[str] = []
        orig = client.api.build

        def spy(*a, **kw):
            self.tags.append(kw.get("tag"))
            return orig(*a, **kw)

        monkeypatch.setattr(client.api, "build", spy)


def run_in(client, image: str, *cmd: str) -> str:
    return client.containers.run(image, list(cmd), network_mode="none", remove=True).decode()


def by_name(results) -> dict:
    return {r.name: r for r in results}


# --------------------------------------------------------------------------- context (no engine)


def tar_entries(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return t.getmembers()


def test_context_is_deterministic_whatever_the_disk_says(stack, tmp_path):
    root = make_project(tmp_path / "project", stack)
    lock = lockmod.load(root / "upstreams.lock")
    tree = sources.prepare(lock, "deepep", sources.FetchOptions(cache=Cache(tmp_path / "cache")), root)
    copy = tmp_path / "copy"
    shutil.copytree(tree.path, copy, symlinks=True)  # same tracked content, other inode/mtimes

    def ctx(path: Path) -> Context:
        c = Context(epoch=1_700_000_000)
        c.add_git_tree("src/deepep", path)
        c.add_file("files/hello.txt", root / "containers/selftest/hello.txt")
        c.add_bytes("Dockerfile", b"FROM x\n")
        return c

    first = ctx(tree.path).tar()
    for p in copy.rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.utime(p, (1234567890, 1234567890))
            p.chmod(p.stat().st_mode | 0o020)  # group-writable on disk: not what the tar says
    (copy / "untracked.o").write_bytes(b"build output")  # untracked: never in a context
    assert ctx(tree.path).tar() == first
    assert hashlib.sha256(ctx(copy).tar()).hexdigest() == hashlib.sha256(first).hexdigest()

    sha, size = ctx(copy).write_tar(tmp_path / "c.tar")
    assert (sha, size) == (hashlib.sha256(first).hexdigest(), len(first))

    entries = tar_entries(first)
    names = [e.name for e in entries]
    assert names == sorted(names, key=str.encode)
    assert not [n for n in names if n == ".git" or "/.git/" in n + "/" or n.endswith("/.git")]
    assert "src/deepep/untracked.o" not in names
    assert f"src/deepep/{SUB}/include/fmt/core.h" in names  # the submodule's checked-out files
    assert {(e.uid, e.gid, e.uname, e.gname, e.mtime) for e in entries} == {(0, 0, "", "", 1_700_000_000)}
    assert {e.mode for e in entries if e.isfile()} <= {0o644, 0o755}
    assert {e.mode for e in entries if e.isdir()} == {0o755}
    with tarfile.open(fileobj=io.BytesIO(first)) as t:
        assert t.extractfile("src/deepep/csrc/ep.cpp").read() == b"int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"

    later = ctx(tree.path)
    later.epoch = 1_700_000_001  # another SOURCE_DATE_EPOCH is another context
    assert later.tar() != first
    c = Context()
    c.add_bytes("a", b"1")
    with pytest.raises(Exception, match="given twice"):
        c.add_bytes("a", b"2")
    with pytest.raises(Exception, match="without '..'"):
        c.add_bytes("../x", b"2")


def test_file_with_a_pinned_sha256_is_checked_as_it_goes_into_the_tar(tmp_path):
    """A wheel verified by fetch_wheels, then changed on a shared disk before the context is written: refused."""
    from reprostack.containers.errors import ContainerError

    f = tmp_path / "a-1.0-py3-none-any.whl"
    f.write_bytes(b"wheel bytes")
    good = hashlib.sha256(b"wheel bytes").hexdigest()
    c = Context()
    c.add_file("w/a-1.0-py3-none-any.whl", f, sha256=good, origin="recipe: wheels s")
    assert [m.name for m in tar_entries(c.tar())] == ["w", "w/a-1.0-py3-none-any.whl"]
    f.write_bytes(b"wheel bytez")
    with pytest.raises(
        ContainerError,
        match=f"recipe: wheels s: {f} has sha256 [0-9a-f]{{64}} while it is put into the context, the lock pins {good}",
    ):
        c.tar()


def test_a_submodule_the_lock_does_not_pin_is_left_out_any_other_unfetched_one_is_an_error(tmp_path):
    """aws-ofi-nccl's 3rd-party/efa-dp-direct (GDAKI only) is not pinned, so not fetched: the context leaves it out
    when told which submodules the lock pins; a pinned submodule that is not checked out stays an error."""
    from reprostack.containers.errors import ContainerError
    from reprostack.gitcmd import git

    repo = gr.init_repo(tmp_path / "r")
    (repo / "a.txt").write_text("a\n")
    git("add", "a.txt", cwd=repo)
    git("update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},3rd-party/sub", cwd=repo)
    git("commit", "-q", "-m", "gitlink", cwd=repo)
    (repo / "3rd-party" / "sub").mkdir(parents=True)  # what a checkout without the submodule leaves: an empty folder
    with pytest.raises(ContainerError, match=r"r:3rd-party/sub: submodule not checked out"):
        Context().add_git_tree("t", repo)
    with pytest.raises(ContainerError, match=r"submodule not checked out"):
        Context().add_git_tree("t", repo, pinned_submodules=frozenset({"3rd-party/sub"}))
    c = Context()
    assert c.add_git_tree("t", repo, pinned_submodules=frozenset()) == 1
    assert c.paths() == ["t/a.txt"]


def test_executable_bit_and_symlinks_follow_git_not_disk(tmp_path):
    from reprostack.gitcmd import git

    repo = gr.init_repo(tmp_path / "r")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "data.txt").write_text("x\n")
    os.symlink("data.txt", repo / "link")
    git("add", "run.sh", "data.txt", "link", cwd=repo)
    git("commit", "-q", "-m", "files", cwd=repo)
    (repo / "data.txt").chmod(0o700)  # the disk says executable; git (the pinned tree) says 100644
    c = Context()
    c.add_git_tree("t", repo)
    e = {x.name: x for x in tar_entries(c.tar())}
    assert e["t/run.sh"].mode == 0o755 and e["t/data.txt"].mode == 0o644
    assert e["t/link"].issym() and e["t/link"].linkname == "data.txt"


# --------------------------------------------------------------------------- recipes (no engine)


def test_a_lock_edit_elsewhere_leaves_every_committed_recipe_rendering_the_same(tmp_path):
    """An image depends on the pins it names: an edit of the lock that none of its pins sees (here a comment, which
    changes the lock's sha256) renders every committed Dockerfile byte for byte as before, so nothing rebuilds. The
    deepep and megatron recipes wrote the lock's sha256 into kernels.json, and so rebuilt on every lock edit."""
    recipes = load_all(REPO_ROOT)
    text = (REPO_ROOT / "upstreams.lock").read_text()
    (tmp_path / "upstreams.lock").write_text(text + "# an edit no image's pin sees\n")
    (tmp_path / "patches").symlink_to(REPO_ROOT / "patches")  # the lock's patch series, as committed
    a, b = lockmod.load(REPO_ROOT / "upstreams.lock"), lockmod.load(tmp_path / "upstreams.lock")
    assert a.sha256 != b.sha256
    ga = lockmod.load(REPO_ROOT / "upstreams.lock", stack="gin-gdaki")
    gb = lockmod.load(tmp_path / "upstreams.lock", stack="gin-gdaki")
    parent = "sha256:" + "ab" * 32
    for name in sorted(set(GPU_RECIPES) | {"cuda-toolkit"}):
        la, lb = (ga, gb) if name == "deepep-gin-gdaki" else (a, b)
        assert render_recipe(recipes[name], la, from_ref=parent) == render_recipe(recipes[name], lb, from_ref=parent)


def test_committed_recipes_load_and_gpu_recipes_render_from_the_real_lock():
    recipes = load_all(REPO_ROOT)
    assert set(GPU_RECIPES) | {"selftest", "selftest-child", "gate-selftest", "cuda-toolkit"} == set(recipes)
    lock = lockmod.load(REPO_ROOT / "upstreams.lock")
    # the registry-free toolkit image: the base made from the pinned .debs, the toolkit from its pinned wheels
    assert recipes["cuda-toolkit"].base.text == "local:reprostack/debian-12-build:12"
    text, _, _ = render_recipe(recipes["cuda-toolkit"], lock, from_ref="sha256:" + "cd" * 32)
    assert "--require-hashes" in text and "check-toolkit.sh 13.0.88 90a" in text
    assert {f.version for f in lock.get("cuda-13-0-toolkit").files} == {"13.0.88", "13.0.96", "13.0.85", "13.0.87"}
    fake_parent = "sha256:" + "ab" * 32
    gin = lockmod.load(REPO_ROOT / "upstreams.lock", stack="gin-gdaki")  # deepep-gin-gdaki takes that stack's wheel
    for name in GPU_RECIPES:
        text, args, labels = render_recipe(
            recipes[name], gin if name == "deepep-gin-gdaki" else lock, from_ref=fake_parent
        )
        assert f"\nFROM {fake_parent}\n" in text
        assert "{{" not in text and "git clone" not in text
    text, args, labels = render_recipe(recipes["deepep"], lock, from_ref=fake_parent)
    nccl, deepep, nccl_wheel = lock.git("nccl"), lock.git("deepep"), lock.get("nccl-wheel")
    assert args == {
        "CUDA_ARCH": "90",
        "NCCL_VERSION": nccl_wheel.version,
        "DEEPEP_PATCHED_TREE": deepep.patched_tree,
        "OFI_REV": lock.git("aws-ofi-nccl").rev,
    }
    # NCCL from the release wheel (the substrate's copy, re-checked against the nccl-wheel pin), no source build;
    # every COPY puts one context folder onto / (stable folder mtimes)
    assert f'{nccl_wheel.files[0].sha256}  {nccl_wheel.files[0].filename}" | sha256sum -c -' in text
    assert "src/nccl" not in text.replace("src/nccl-tests", "") and "nccl.wheel_pin=nccl-wheel" in text
    # nccl-tests with MPI=1 against the substrate's Open MPI (the fabric gate's multi-node binaries): the recipe's make
    # vars, then MPI=1 (make takes the last), and a check that each binary loads the pinned NCCL and Open MPI's libmpi
    assert "COPY root/nccl-tests/ /" in text and 'MPI="0"' in text
    assert text.index('MPI="0"') < text.index("MPI=1 MPI_HOME=/opt/reprostack/openmpi")
    assert "libmpi.so.40 => /opt/reprostack/openmpi/lib/libmpi.so.40" in text
    # reproducible bytes (issue 37, `nox -s images` built twice): nvcc's tmpxft_<pid> file names reach the binaries'
    # symbols, so every nvcc-driving step names its compile files after the object (--objdir-as-tempdir) and runs one
    # job at a time; with `make -j` two from-scratch builds gave other nccl-tests bytes (deepep-twice.json, 22b2d12)
    nccl_tests = next(i.text for i in instructions(text) if i.keyword == "RUN" and "src/nccl-tests/src" in i.text)
    assert "NVCC_APPEND_FLAGS=--objdir-as-tempdir make -j1 " in nccl_tests and 'make -j"' not in nccl_tests
    assert "COPY root/deepep/ /" in text and "COPY root/aws-ofi-nccl/ /" in text
    assert all(i.text.endswith(" /") for i in instructions(text) if i.keyword == "COPY")
    # the gate images install their cp311 wheel set into the chain's /opt/venv, on top of the substrate's set, and
    # check every pin set of the image; their steps keep the chain's same-bytes rules
    for name in ("vllm", "sglang"):
        text, _, _ = render_recipe(recipes[name], lock, from_ref=fake_parent)
        assert "/opt/venv/bin/pip install" in text and "--require-hashes" in text and "--no-deps" in text
        # the venv's three sets by name: the toolkit's pins.json is another venv's (/opt/cuda-wheels)
        assert f"/opt/reprostack/pins/{name}-wheels-cp311.json" in text and "pins/*.json" not in text
        assert "/opt/reprostack/pins/substrate-wheels-cp311.json" in text and "pins/reprostack-wheels.json" in text
        assert [w.pin for w in recipes[name].wheels] == [f"{name}-wheels-cp311", "aiperf-wheels"]  # AIPerf: own venv
        pin = lock.get(f"{name}-wheels-cp311")
        assert recipes[name].parent == "deepep" and pin.installed_on == "substrate-wheels-cp311"
        assert pin.python_version == lock.get("substrate-wheels-cp311").python_version == "3.11"
        assert all(i.text.endswith(" /") for i in instructions(text) if i.keyword == "COPY")
        assert all(
            i.text.startswith("RUN /opt/reprostack/bin/epoch-mtimes.sh begin")
            and i.text.endswith("epoch-mtimes.sh end")
            for i in instructions(text)
            if i.keyword == "RUN"
        )
    text, args, _ = render_recipe(recipes["megatron"], lock, from_ref=fake_parent)
    assert args == {"MEGATRON_PATCHED_TREE": lock.git("megatron-lm").patched_tree}
    # megatron.core imports numpy at module level, which neither the substrate's nor reprostack's set holds
    assert [w.pin for w in recipes["megatron"].wheels] == ["megatron-wheels-cp311"]
    assert lock.get("megatron-wheels-cp311").installed_on == "substrate-wheels-cp311"
    assert [f.name for f in lock.get("megatron-wheels-cp311").files] == ["numpy"]
    assert "/opt/venv/bin/pip install" in text and "/opt/reprostack/pins/megatron-wheels-cp311.json" in text
    assert "pins/*.json" not in text
    assert labels["org.opencontainers.image.title"] == (
        f"reprostack deepep (DeepEP V2 over NCCL {nccl_wheel.version}, the {nccl.original} release wheel)"
    )
    assert recipes["deepep"].parent == "substrate"
    text, _, _ = render_recipe(recipes["deepep"], lock, from_ref=fake_parent)
    assert "--with-libfabric=/opt/reprostack/efa" in text and "/opt/amazon" not in text
    # the CUDA bases are image pins of the lock, by digest; the EFA userspace comes from git pins
    # the substrate is on the registry-free chain; the CUDA devel base by digest is the documented alternative
    assert recipes["substrate"].parent == "cuda-toolkit" and recipes["substrate"].base is None
    resolved = resolve_lock_bases(recipes, lock)
    assert resolved["substrate-cuda-devel"].base.text == (
        "docker.io/nvidia/cuda:13.0.0-devel-ubuntu22.04@sha256:1470d2d7904fac4e5cb3bdfd4993305c46d3ee76deb0213eaaf248e5cf9c7400"
    )
    assert resolved["trtllm"].base.text == (
        "docker.io/nvidia/cuda:12.9.0-devel-ubuntu24.04@sha256:632c7db01c6a392f1a4a51b575ee1c125d19e7656de83a285ac222fc35b80606"
    )
    assert resolved["substrate-cuda-devel"].base.pin == "cuda-13-0-devel"
    text, args, labels = render_recipe(recipes["substrate"], lock, from_ref=fake_parent)
    assert [w.pin for w in recipes["substrate"].wheels] == ["substrate-wheels-cp311"]
    assert lock.get("substrate-wheels-cp311").python_version == "3.11" and "/opt/venv/bin/pip install" in text
    assert all(i.text.endswith(" /") for i in instructions(text) if i.keyword == "COPY")
    assert all(
        i.text.startswith("RUN /opt/reprostack/bin/epoch-mtimes.sh begin") and i.text.endswith("epoch-mtimes.sh end")
        for i in instructions(text)
        if i.keyword == "RUN"
    )
    rdma, fab = lock.git("rdma-core"), lock.git("libfabric")
    assert (rdma.original, fab.original) == ("v64.0", "v2.6.0")
    assert args["RDMA_CORE_REV"] == rdma.rev and args["LIBFABRIC_TREE"] == fab.tree
    assert "COPY root/rdma-core/ /" in text and "--enable-efa=/opt/reprostack/efa" in text
    assert "record-built.py /opt/reprostack/built.json" in text and lock.git("gdrcopy").tree in text
    assert [s.upstream for s in recipes["substrate"].sources] == ["rdma-core", "libfabric", "gdrcopy", "openmpi"]
    # Open MPI from its git pin for the fabric gate's multi-node nccl-tests: srun --mpi=pmix needs its PMIx client,
    # recorded in built.json, its lib on the loader path of every image
    ompi = lock.git("openmpi")
    assert "COPY root/openmpi/ /" in text and "--with-pmix=internal" in text and "--with-slurm" in text
    assert f"openmpi={ompi.rev}:{ompi.tree}:/opt/reprostack/openmpi:" in text
    assert "LD_LIBRARY_PATH=/opt/reprostack/efa/lib:/opt/reprostack/efa/lib64:/opt/reprostack/openmpi/lib" in text
    # nemo-rl builds the pinned tree; trtllm installs the wheel pinned by name and version
    text, args, _ = render_recipe(recipes["nemo-rl"], lock, from_ref=fake_parent)
    assert args == {"NEMO_RL_REV": lock.git("nemo-rl").rev} and lock.git("nemo-rl").tree in text
    text, _, labels = render_recipe(recipes["trtllm"], lock, from_ref=fake_parent)
    assert "COPY wheels/trtllm /tmp/wheels" in text and labels["org.opencontainers.image.title"].endswith(
        "(tensorrt-llm 0.21.0)"
    )


def test_unresolved_pin_and_recipe_stop_the_build_before_any_engine_work(tmp_path, capsys):
    """TRT-LLM's wheel is pinned by name and version with no sha256 (NVIDIA's index is not reachable here) and
    NeMo-RL's locked dependencies are not pinned: `build` names the line and the pin, exit 2, nothing built."""
    lock = lockmod.load(REPO_ROOT / "upstreams.lock")
    pin = lock.get("trtllm-wheels")
    assert (pin.name, pin.version, pin.files) == ("tensorrt-llm", "0.21.0", ())
    opts = BuildOptions(root=REPO_ROOT, lock=lock, client=object(), out_dir=tmp_path / "out", base_overrides={})
    with pytest.raises(RecipeError) as ei:
        build_images(["trtllm"], opts)
    yaml_path = REPO_ROOT / "containers/trtllm/image.yaml"
    line = next(i for i, l in enumerate(yaml_path.read_text().splitlines(), 1) if "pin: trtllm-wheels" in l)
    assert str(ei.value) == (
        f"{yaml_path}:{line}: wheels[0].pin: unresolved pin tensorrt-llm 0.21.0 (sha256 not in "
        "the lock: run `reprostack lock wheels trtllm-wheels` where NVIDIA's index is reachable)"
    )
    with pytest.raises(
        RecipeError,
        match=r"nemo-rl/image.yaml:\d+: unresolved: image nemo-rl cannot be built yet: "
        r"NeMo-RL v0.7.0's uv.lock requires Python >=3.13.13",
    ):
        build_images(["nemo-rl"], opts)
    assert not (tmp_path / "out").exists()
    # the CLI: one line, exit 2, before it even looks for an engine
    from reprostack import cli

    old = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"
    try:
        assert cli.main(["build", "trtllm", "--out", str(tmp_path / "cli")]) == 2
    finally:  # restored, not dropped: a later docker_client fixture must find CI's engine ($DOCKER_HOST)
        if old is None:
            os.environ.pop("DOCKER_HOST")
        else:
            os.environ["DOCKER_HOST"] = old
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unresolved pin tensorrt-llm 0.21.0" in err[0] and "Traceback" not in err[0]
    # fetching its wheels says the same, naming the lock line
    import reprostack.errors as rerr
    from reprostack.fetch.wheels import fetch_wheels

    with pytest.raises(
        rerr.FetchError, match=r"upstreams.lock:\d+: upstreams.trtllm-wheels.unresolved: unresolved pin"
    ):
        fetch_wheels(lock, "trtllm-wheels", cache_root=tmp_path / "c", offline=True)


def test_missing_base_digest_is_an_error_naming_the_recipe(tmp_path, stack):
    """A recipe naming the CUDA base by tag only (no digest): building it fails before any engine work, naming
    its image.yaml and `base` line."""
    root = make_project(tmp_path / "project", stack, recipes=("substrate-cuda-devel", "substrate"))
    y = root / "containers/substrate-cuda-devel/image.yaml"
    y.write_text(y.read_text().replace("base: lock:cuda-13-0-devel", f"base: {CUDA}"))
    opts = BuildOptions(
        root=root,
        lock=lockmod.load(root / "upstreams.lock"),
        client=object(),
        out_dir=tmp_path / "out",
        base_overrides={},
    )
    with pytest.raises(RecipeError) as ei:
        build_images(["substrate-cuda-devel"], opts)
    msg = str(ei.value)
    base_line = next(
        i
        for i, l in enumerate((root / "containers/substrate-cuda-devel/image.yaml").read_text().splitlines(), 1)
        if l.startswith("base:")
    )
    assert msg.startswith(f"{root}/containers/substrate-cuda-devel/image.yaml:{base_line}: base: ")
    assert f"'{CUDA}' has no digest" in msg and "REPROSTACK_BASE_OVERRIDE" in msg and "nox -s lock" in msg
    # the override (by repo:tag) lifts exactly that requirement
    assert parse_overrides(f"{CUDA}=reprostack-test/base:1") == {CUDA: "reprostack-test/base:1"}


@pytest.mark.parametrize(
    "dockerfile, line, what",
    [
        ("FROM {{ from }}\nFROM ubuntu:22.04\n", 2, "an image is only ever FROM"),
        ("FROM {{ from }}\nRUN git clone https://github.com/x/y\n", 2, "no `git clone`"),
        ("FROM {{ from }}\nADD https://example.invalid/x.tar.gz /x\n", 2, "ADD of a URL"),
        ("FROM {{ from }}\n\nRUN echo {{ upstreams.nope.rev }}\n", 3, "unknown template field"),
        # the whole lock's sha256 is no template value: it rebuilt every image that named it on any lock edit
        ("FROM {{ from }}\nRUN echo {{ lock.sha256 }}\n", 2, "unknown template field"),
        ("# a comment\nRUN true\n", 2, "the first instruction must be FROM"),
    ],
)
def test_dockerfile_rules_name_the_line(tmp_path, stack, dockerfile, line, what):
    root = make_project(tmp_path / "project", stack, recipes=())
    add_recipe(root, "bad", "base: local:reprostack-test/base:1\n", dockerfile)
    with pytest.raises(RecipeError, match=what) as ei:
        render_recipe(load_recipe(root, "bad"), lockmod.load(root / "upstreams.lock"), from_ref="sha256:" + "0" * 64)
    assert str(ei.value).startswith(f"{root}/containers/bad/Dockerfile:{line}: ")


def test_stage_alias_and_recipe_errors(tmp_path, stack):
    root = make_project(tmp_path / "project", stack, recipes=())
    lock = lockmod.load(root / "upstreams.lock")
    add_recipe(
        root,
        "ok",
        "base: local:reprostack-test/base:1\n",
        "FROM {{ from }} AS build\nRUN true\nFROM build\nRUN echo {{ upstreams.nccl.rev }}\n",
    )
    text, _, _ = render_recipe(load_recipe(root, "ok"), lock, from_ref="sha256:" + "0" * 64)
    assert f"RUN echo {lock.git('nccl').rev}" in text
    add_recipe(root, "both", "base: local:x\nparent: ok\n", "FROM {{ from }}\n")
    with pytest.raises(RecipeError, match="exactly one of `parent`"):
        load_recipe(root, "both")
    add_recipe(root, "typo", "parnet: ok\n", "FROM {{ from }}\n")
    with pytest.raises(RecipeError, match=r"image.yaml:1: parnet: unknown key"):
        load_recipe(root, "typo")
    add_recipe(root, "orphan", "parent: nosuch\n", "FROM {{ from }}\n")
    with pytest.raises(RecipeError, match=r"orphan/image.yaml:1: parent: no recipe 'nosuch'"):
        load_all(root, ["orphan"])
    add_recipe(root, "cyc-a", "parent: cyc-b\n", "FROM {{ from }}\n")
    add_recipe(root, "cyc-b", "parent: cyc-a\n", "FROM {{ from }}\n")
    with pytest.raises(RecipeError, match="parent cycle"):
        build_images(["cyc-a"], BuildOptions(root=root, lock=lock, client=object()))
    add_recipe(root, "badsrc", "base: local:x\nsources: [{upstream: nosuch}]\n", "FROM {{ from }}\n")
    with pytest.raises(RecipeError, match=r"badsrc/image.yaml:2: sources\[0\].upstream: 'nosuch' is not in the lock"):
        render_recipe(load_recipe(root, "badsrc"), lock, from_ref="sha256:" + "0" * 64)
    add_recipe(root, "baddigest", "base: x/y:1@sha256:abc\n", "FROM {{ from }}\n")
    with pytest.raises(RecipeError, match=r"baddigest/image.yaml:1: base: 'sha256:abc' is not a digest"):
        load_recipe(root, "baddigest")


# --------------------------------------------------------------------------- builds on the engine


def test_selftest_chain_builds_with_labels_and_the_patched_tree_inside(stack, tmp_path, docker_client, test_base, ns):
    root = make_project(tmp_path / "project", stack)
    opts = options(root, tmp_path, docker_client, ns, source_date_epoch=1_767_225_600)
    results = build_images(["selftest-child"], opts)
    assert [(r.name, r.status) for r in results] == [("selftest", "built"), ("selftest-child", "built")]
    parent, child = results
    lock = opts.lock

    # tags are the content keys; FROM is the parent's image id
    for r in results:
        assert r.tag == f"{ns}/{r.name}:{r.key[:16]}" and docker_client.images.get(r.tag).id == r.image_id
        assert r.context_bytes > 0 and r.log.is_file() and r.epoch == 1_767_225_600
    assert parent.from_ref == test_base and child.from_ref == parent.image_id

    # labels
    L = docker_client.images.get(child.tag).labels
    assert L["org.opencontainers.image.created"] == "2026-01-01T00:00:00Z"
    assert L["org.opencontainers.image.source"] == stack.url("deepep")
    assert L["org.opencontainers.image.revision"] == stack.rev
    assert L["org.opencontainers.image.base.digest"] == parent.image_id
    assert L["org.opencontainers.image.base.name"] == parent.tag
    assert L["dev.reprostack.lock-sha256"] == lock.sha256
    assert L["dev.reprostack.recipe-sha256"] == recipe_digest(root / "containers/selftest-child")
    assert L["dev.reprostack.key"] == child.key
    ups = json.loads(L["dev.reprostack.upstreams"])
    assert ups == {
        "deepep": {
            "url": stack.url("deepep"),
            "rev": stack.rev,
            "tree": stack.tree,
            "patched-tree": stack.patched,
            "patches": 1,
            "submodules": {SUB: stack.fmt_rev},
        }
    }
    P = docker_client.images.get(parent.tag).labels
    assert P["org.opencontainers.image.base.name"] == "reprostack-test/base:1"
    assert P["org.opencontainers.image.base.digest"] == test_base
    assert P["dev.reprostack.upstreams"] == "{}"
    assert P["org.opencontainers.image.title"] == "reprostack selftest"

    # the patched source inside the image is the lock's patched tree (submodule as its gitlink), no .git
    inside = tree_in_image(docker_client, child.tag, IN_IMAGE, lock.git("deepep"))
    assert inside.tree == stack.patched == lock.git("deepep").patched_tree
    assert inside.submodule_trees == {SUB: stack.fmt_tree}
    assert run_in(docker_client, child.tag, "sh", "-c", f"find {IN_IMAGE} -name .git | wc -l").strip() == "0"
    assert run_in(docker_client, child.tag, "cat", f"{IN_IMAGE}/csrc/ep.cpp") == "int kMaxQps = 6;  // EP_EFA_MAX_QPS\n"
    assert run_in(docker_client, child.tag, "stat", "-c", "%Y %u:%g %a", f"{IN_IMAGE}/csrc/ep.cpp").split() == [
        "1767225600",
        "0:0",
        "644",
    ]
    assert run_in(docker_client, child.tag, "cat", "/opt/reprostack/src/deepep.patched-tree").strip() == stack.patched
    assert (
        run_in(docker_client, parent.tag, "cat", "/opt/reprostack/selftest/hello.txt")
        == (REPO_ROOT / "containers/selftest/hello.txt").read_text()
    )

    # the build log and the summary are kept
    log = child.log.read_text()
    assert "Step 1/" in log and "# ---- Dockerfile (rendered)" in log and "Successfully tagged" in log
    summary = json.loads((tmp_path / "out" / "images.json").read_text())
    assert summary["lock_sha256"] == lock.sha256
    assert [(i["name"], i["image_id"]) for i in summary["images"]] == [(r.name, r.image_id) for r in results]


def test_second_build_is_a_noop(stack, tmp_path, docker_client, test_base, ns, monkeypatch):
    root = make_project(tmp_path / "project", stack)
    first = build_images(["selftest-child"], options(root, tmp_path, docker_client, ns))
    spy = BuildSpy(docker_client, monkeypatch)
    again = build_images(["selftest-child"], options(root, tmp_path, docker_client, ns))
    assert spy.tags == []  # no build call at all
    assert [r.status for r in again] == ["reused", "reused"]
    assert [(r.tag, r.image_id, r.context_sha256) for r in again] == [
        (r.tag, r.image_id, r.context_sha256) for r in first
    ]
    assert all(r.log is None for r in again)


def test_one_byte_change_rebuilds_that_image_and_its_children_only(
    stack, tmp_path, docker_client, test_base, ns, monkeypatch
):
    root = make_project(tmp_path / "project", stack)
    first = by_name(build_images(["selftest-child"], options(root, tmp_path, docker_client, ns)))
    spy = BuildSpy(docker_client, monkeypatch)

    # one byte of the patch series changes (6 -> 7): a new pick, a new patched tree in the lock
    (pick2,) = gr.make_pull_ref(
        stack.srv / "deepep",
        613,
        stack.rev,
        [({"csrc/ep.cpp": "int kMaxQps = 7;  // EP_EFA_MAX_QPS\n"}, "EFA auto-QP cap v2")],
    )
    s2 = replace(stack, pick=pick2, patched=gr.tree_of(stack.srv / "deepep", pick2))
    (root / "upstreams.lock").write_text(lock_text(s2).replace("refs/pull/612/head", "refs/pull/613/head"))
    second = by_name(build_images(["selftest-child"], options(root, tmp_path, docker_client, ns)))
    assert second["selftest"].status == "reused" and second["selftest"].image_id == first["selftest"].image_id
    assert second["selftest-child"].status == "built"
    assert second["selftest-child"].image_id != first["selftest-child"].image_id
    assert spy.tags == [second["selftest-child"].tag]
    inside = tree_in_image(
        docker_client, second["selftest-child"].tag, IN_IMAGE, lockmod.load(root / "upstreams.lock").git("deepep")
    )
    assert inside.tree == s2.patched != stack.patched

    # one byte of a file only the parent's context holds: the parent and its child are rebuilt
    hello = root / "containers/selftest/hello.txt"
    hello.write_bytes(hello.read_bytes().replace(b"hello", b"jello", 1))
    spy.tags.clear()
    third = by_name(build_images(["selftest-child"], options(root, tmp_path, docker_client, ns)))
    assert [third[n].status for n in ("selftest", "selftest-child")] == ["built", "built"]
    assert spy.tags == [third["selftest"].tag, third["selftest-child"].tag]
    assert third["selftest-child"].from_ref == third["selftest"].image_id != first["selftest"].image_id
    assert third["selftest-child"].key != second["selftest-child"].key  # its FROM (the parent id) changed


def test_broken_step_names_the_image_the_step_and_the_log(stack, tmp_path, docker_client, test_base, ns):
    root = make_project(tmp_path / "project", stack, recipes=("selftest",))
    add_recipe(
        root,
        "broken",
        "parent: selftest\n",
        "FROM {{ from }}\n# the next step passes\nRUN echo before-the-failure\n"
        "RUN echo failing-step \\\n && exit 3\nRUN echo never-reached\n",
    )
    opts = options(root, tmp_path, docker_client, ns)
    with pytest.raises(ImageBuildError) as ei:
        build_images(["broken"], opts)
    e = ei.value
    assert e.image == "broken"
    assert e.step == f"3/4 `RUN echo failing-step && exit 3` ({root}/containers/broken/Dockerfile:4)"
    assert "returned a non-zero code: 3" in e.detail
    assert str(e).startswith("image broken: step 3/4 `RUN echo failing-step && exit 3`")
    assert f"full log: {e.log}" in str(e)
    log = e.log.read_text()
    assert e.log.parent == tmp_path / "out" / "logs" and "before-the-failure" in log and "failing-step" in log
    assert "never-reached\n" not in log.split("# ---- engine output")[1]
    assert not docker_client.images.list(filters={"reference": f"{ns}/broken"})
    # the parent was built and is kept: the next attempt reuses it
    assert docker_client.images.list(filters={"reference": f"{ns}/selftest"})


def test_base_override_and_default_epoch_from_the_source_commit(
    stack, tmp_path, docker_client, test_base, ns, monkeypatch
):
    """A registry base given by tag only builds when REPROSTACK_BASE_OVERRIDE substitutes a local image (and the
    image says so); without SOURCE_DATE_EPOCH the epoch is the newest committer time of the revs it copies."""
    up = patchrepos.make_upstream(tmp_path / "srv2")  # commits dated 1700000000 + n
    root = make_project(tmp_path / "project", stack, recipes=())
    (root / "upstreams.lock").write_text(
        lock_text(stack)
        + f"""\
  extra:
    kind: git
    url: {up.path}
    rev: {up["f2"]}
    tree: {up.tree("f2")}
"""
    )
    add_recipe(
        root,
        "cudalike",
        f"base: {CUDA}\nsource: extra\nsources: [{{upstream: extra, dest: src/extra}}]\n",
        "FROM {{ from }}\nCOPY {{ sources.extra.dest }} /opt/extra\n",
    )
    monkeypatch.setenv("REPROSTACK_BASE_OVERRIDE", f"{CUDA}=reprostack-test/base:1")
    (r,) = build_images(["cudalike"], options(root, tmp_path, docker_client, ns))
    L = r.labels
    assert r.status == "built" and r.from_ref == test_base and r.epoch == 1_700_000_002
    assert L["dev.reprostack.base-override"] == f"{CUDA} -> reprostack-test/base:1 ({test_base})"
    assert L["org.opencontainers.image.created"] == rfc3339(1_700_000_002) == "2023-11-14T22:13:22Z"
    assert L["org.opencontainers.image.source"] == str(up.path) and L["org.opencontainers.image.revision"] == up["f2"]
    assert run_in(docker_client, r.tag, "stat", "-c", "%Y", "/opt/extra/b.txt").strip() == "1700000002"
    assert run_in(docker_client, r.tag, "cat", "/opt/extra/b.txt") == "bravo\ncharlie\n"


def test_build_command_as_the_cli_wires_it(stack, tmp_path, docker_client, test_base, ns, capsys):
    """`reprostack build` = reprostack.cmd.build (its options and the shared source options, then run): builds,
    prints one line per image, and a second run reuses."""
    import argparse

    from reprostack.cmd import build

    root = make_project(tmp_path / "project", stack)
    p = argparse.ArgumentParser()
    build.add_arguments(p)
    argv = [
        "selftest",
        "--lock",
        str(root / "upstreams.lock"),
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--namespace",
        ns,
        "--test-base",
        "--offline",
    ]
    for status in ("built", "reused"):
        args = p.parse_args(argv)
        assert build.run(args) == 0
        cap = capsys.readouterr()
        out = cap.out.splitlines()
        assert out[0].startswith(f"selftest: {status} {ns}/selftest:") and out[1].startswith("summary: ")
        # each result printed once; then the build's attestation line (no key here: it says so, reprostack.evidence)
        assert len(out) == 3 and f"selftest: {status}" not in cap.err and out[2].startswith("unsigned: no key at ")
        # the operator's view on stderr: one ui step per image built (ETA, the log's path first), none when reused
        err = [x for x in cap.err.splitlines() if x.startswith("build image selftest:")]
        if status == "built":
            log = tmp_path / "out" / "logs" / f"selftest-{out[0].split(':')[2].split()[0]}.log"
            assert err[0] == f"build image selftest: started, first run, no estimate; full log {log}"
            assert err[1].startswith("build image selftest: ok in ") and len(err) == 2 and log.is_file()
            assert "Step 1/" in log.read_text() and "Step 1/" not in cap.err  # quiet: the engine's lines in the log
        else:
            assert err == []


# --------------------------------------------------------------------------- wheels and image bundles


def test_wheel_set_goes_into_the_image_verified(stack, tmp_path, docker_client, test_base, ns):
    """A recipe's `wheels:` puts the pinned wheels (taken from a wheelhouse, sha256 checked), requirements.txt
    with --hash lines and pins.json into the context; inside the image the bytes still match the lock."""
    from wheelindex import make_wheel, sha256 as wsha

    built = tmp_path / "house"
    built.mkdir()
    a, b = make_wheel(built, "app", "1.0", ("lib==1.0",)), make_wheel(built, "lib", "2.0")
    root = make_project(tmp_path / "project", stack, recipes=("selftest",))
    with open(root / "upstreams.lock", "a") as f:
        f.write(f"""\
  demo-set:
    kind: wheelset
    python-version: "3.11"
    platform-tags: [any]
    requirements: [app==1.0]
    overrides: [lib==2.0]
    files:
      - {{name: app, version: "1.0", filename: {a.name}, sha256: {wsha(a)}}}
      - {{name: lib, version: "2.0", filename: {b.name}, sha256: {wsha(b)}}}
""")
    add_recipe(
        root,
        "wheeled",
        "parent: selftest\nwheels:\n  - {pin: demo-set, dest: wheels/demo}\n",
        "FROM {{ from }}\nCOPY {{ wheels.demo-set.dest }} /opt/wheels\n"
        "RUN cd /opt/wheels && sed -n 's/^\\([^=]*\\)==\\([^ ]*\\) --hash=sha256:\\(.*\\)$/\\3/p' requirements.txt"
        " > want && ls *.whl | xargs sha256sum | cut -d' ' -f1 | sort > got && sort want | cmp - got\n",
    )
    opts = options(root, tmp_path, docker_client, ns, wheelhouses=[built], offline=True)
    results = by_name(build_images(["wheeled"], opts))
    tag = results["wheeled"].tag
    assert (
        run_in(docker_client, tag, "cat", "/opt/wheels/requirements.txt")
        == f"app==1.0 --hash=sha256:{wsha(a)}\nlib==2.0 --hash=sha256:{wsha(b)}\n"
    )
    pins = json.loads(run_in(docker_client, tag, "cat", "/opt/wheels/pins.json"))
    assert pins["packages"] == {"app": "1.0", "lib": "2.0"} and pins["overrides"] == ["lib"]
    ups = json.loads(docker_client.images.get(tag).labels["dev.reprostack.upstreams"])
    assert ups["demo-set"]["wheels"] == 2
    assert "lock-sha256" not in pins  # the set's own pins, never the whole lock's sha256 (next lines)
    # another pin of the lock changes (and so the lock's sha256): this image's inputs did not, so it is reused with
    # the same image id. It was rebuilt, with every image holding wheels, while pins.json recorded the lock's sha256
    with open(root / "upstreams.lock", "a") as f:
        f.write(
            '  unrelated:\n    kind: wheel\n    name: other\n    version: "1.0"\n    files:\n'
            f"      - {{filename: other-1.0-py3-none-any.whl, sha256: {'d' * 64}}}\n"
        )
    again = by_name(
        build_images(
            ["wheeled"], options(root, tmp_path / "relock", docker_client, ns, wheelhouses=[built], offline=True)
        )
    )
    assert again["wheeled"].status == "reused" and again["wheeled"].image_id == results["wheeled"].image_id
    # a wheel whose bytes differ from the lock never reaches a context
    (built / a.name).write_bytes(b.read_bytes())
    import reprostack.errors as rerr

    with pytest.raises(rerr.FetchError, match="sha256"):
        build_images(
            ["wheeled"], options(root, tmp_path / "again", docker_client, ns, wheelhouses=[built], offline=True)
        )


def test_images_bundle_saves_and_loads_with_ids_checked(stack, tmp_path, docker_client, test_base, ns, capsys):
    from reprostack.containers.bundle import load_bundle, save_bundle
    from reprostack.containers.errors import ContainerError

    root = make_project(tmp_path / "project", stack)
    results = build_images(["selftest-child"], options(root, tmp_path, docker_client, ns))
    child = results[-1]
    out = tmp_path / "images.tar"
    saved = save_bundle(docker_client, [(child.name, child.tag)], out)
    assert [(s.name, s.tag, s.image_id) for s in saved] == [(child.name, child.tag, child.image_id)]
    docker_client.images.remove(child.tag, force=True)
    loaded = load_bundle(docker_client, out)
    assert [(s.tag, s.image_id) for s in loaded] == [(child.tag, child.image_id)]
    assert docker_client.images.get(child.tag).id == child.image_id
    # a corrupt member is refused before the engine sees it
    raw = bytearray(out.read_bytes())
    i = raw.find(b"manifest.json")
    assert i > 0
    with tarfile.open(out) as t:
        m = t.getmember(f"images/{child.name}.tar")
    raw[m.offset_data + 100] ^= 0xFF
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ContainerError, match="corrupt bundle"):
        load_bundle(docker_client, bad)
    with pytest.raises(ContainerError, match="not in this engine"):
        save_bundle(docker_client, [("nope", f"{ns}/nope:0")], tmp_path / "x.tar")
    assert not (tmp_path / "x.tar").exists()


# --------------------------------------------------------------------------- a lock base: pulled by digest, checked


registry = registry_mod.registry  # session fixture (tests/registry.py)


def _lock_with_base(root: Path, stack, repo: str, digest: str, image_id: str | None = None) -> None:
    (root / "upstreams.lock").write_text(
        lock_text(stack)
        + f"""\
  tb:
    kind: image
    repo: {repo}
    tag: "1"
    digest: {digest}
"""
        + (f"    id: {image_id}\n" if image_id else "")
    )


def test_lock_base_is_pulled_by_digest_and_checked_after_pull_and_load(
    stack, tmp_path, docker_client, test_base, registry, ns
):
    """`base: lock:PIN`: the image is pulled by digest from a real registry (docker-registry on loopback) and its
    RepoDigests checked; a `docker load`ed image under the pin's repo:tag that is not the pinned one is refused
    naming the lock line; a loaded copy is accepted only when the lock pins its `id`."""
    import docker.errors
    from reprostack.containers.errors import ContainerError

    repo = f"{registry.host}/{ns}/cuda"
    assert docker_client.images.get(test_base).tag(repo, "1")
    errors = [ev for ev in docker_client.images.push(repo, tag="1", stream=True, decode=True) if "error" in ev]
    assert not errors, errors
    digest = next(
        d for d in docker_client.images.get(f"{repo}:1").attrs["RepoDigests"] if d.startswith(repo + "@")
    ).split("@", 1)[1]

    def forget(*refs):
        for ref in refs:
            try:
                docker_client.images.remove(ref)
            except docker.errors.ImageNotFound:
                pass  # went with the last tag of its repository

    forget(f"{repo}:1", f"{repo}@{digest}")  # not in the engine now: the build must pull it
    root = make_project(tmp_path / "project", stack, recipes=())
    _lock_with_base(root, stack, repo, digest)
    add_recipe(root, "onbase", "base: lock:tb\n", "FROM {{ from }}\nRUN echo built > /built\n")
    [res] = build_images(["onbase"], options(root, tmp_path / "a", docker_client, ns))
    assert res.status == "built" and res.labels["org.opencontainers.image.base.digest"] == digest
    assert res.labels["org.opencontainers.image.base.name"] == f"{repo}:1@{digest}"
    assert f"{repo}@{digest}" in docker_client.images.get(f"{repo}@{digest}").attrs["RepoDigests"]
    # the lock pins another image id: the pulled image is refused, naming upstreams.tb.id
    _lock_with_base(root, stack, repo, digest, image_id="sha256:" + "e" * 64)
    with pytest.raises(ContainerError) as ei:
        build_images(["onbase"], options(root, tmp_path / "b", docker_client, ns))
    lines = (root / "upstreams.lock").read_text().splitlines()
    id_line = next(i for i, l in enumerate(lines, 1) if l.strip().startswith("id: "))
    assert str(ei.value).startswith(f"{root}/upstreams.lock:{id_line}: upstreams.tb.id: ")
    assert "the lock pins id sha256:eeee" in str(ei.value)
    # an offline node: `docker load` brings another image under the pin's repo:tag (no RepoDigests)
    other = tmp_path / "other.tar"
    assert docker_client.images.get(res.image_id).tag(repo, "1")
    with open(other, "wb") as f:
        for chunk in docker_client.api.get_image(f"{repo}:1"):
            f.write(chunk)
    forget(f"{repo}:1", f"{repo}@{digest}")
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(f"{repo}@{digest}")
    with open(other, "rb") as f:
        docker_client.api.load_image(f)
    assert docker_client.images.get(f"{repo}:1").id == res.image_id
    _lock_with_base(root, stack, repo, digest)
    with pytest.raises(ContainerError) as ei:
        build_images(["onbase"], options(root, tmp_path / "c", docker_client, ns, offline=True))
    digest_line = next(
        i
        for i, l in enumerate((root / "upstreams.lock").read_text().splitlines(), 1)
        if l.strip().startswith("digest: ")
    )
    msg = str(ei.value)
    assert (
        msg.startswith(
            f"{root}/upstreams.lock:{digest_line}: upstreams.tb.digest: {repo}:1 in this engine is "
            f"{res.image_id}, which does not carry the pinned digest {digest}"
        )
        and "\n" not in msg
    )
    # the genuine image under that tag (as a load of it leaves it: no RepoDigests) passes once the lock pins its id
    forget(f"{repo}:1")
    assert docker_client.images.get(test_base).tag(repo, "1")
    with pytest.raises(ContainerError, match="the lock pins no `id`"):
        build_images(["onbase"], options(root, tmp_path / "d", docker_client, ns, offline=True))
    _lock_with_base(root, stack, repo, digest, image_id=test_base)
    [ok] = build_images(["onbase"], options(root, tmp_path / "e", docker_client, ns, offline=True))
    assert ok.image_id == res.image_id  # same base, same recipe: the same image
    forget(f"{repo}:1")


def test_a_recipe_shares_a_sibling_recipes_file_and_its_digest_covers_it(tmp_path):
    """`files: [{src: ../other/x.sh}]` takes another recipe's file instead of a copy; an edit of that file changes
    this recipe's digest (its image key); any other path outside the folder is one line naming the field."""
    from reprostack.containers.errors import RecipeError

    root = tmp_path
    for name in ("a", "b"):
        (root / "containers" / name).mkdir(parents=True)
        (root / "containers" / name / "Dockerfile").write_text("FROM scratch\n")
    (root / "containers" / "a" / "image.yaml").write_text("base: local:reprostack-test/base:1\n")
    (root / "containers" / "a" / "x.sh").write_text("echo a\n")
    (root / "containers" / "b" / "image.yaml").write_text(
        "base: local:reprostack-test/base:1\nfiles: [{src: ../a/x.sh, dest: files/x.sh}]\n"
    )
    before = load_recipe(root, "b")
    assert [(f.src, f.dest) for f in before.files] == [("../a/x.sh", "files/x.sh")]
    (root / "containers" / "a" / "x.sh").write_text("echo changed\n")
    assert load_recipe(root, "b").recipe_sha256 != before.recipe_sha256
    (root / "outside.sh").write_text("echo\n")
    (root / "containers" / "notarecipe").mkdir()
    (root / "containers" / "notarecipe" / "y.sh").write_text("echo\n")
    for bad in ("../../outside.sh", "../a/../../outside.sh", "/etc/passwd", "../notarecipe/y.sh", "../a/missing.sh"):
        (root / "containers" / "b" / "image.yaml").write_text(
            f"base: local:reprostack-test/base:1\nfiles: [{{src: '{bad}', dest: files/x.sh}}]\n"
        )
        with pytest.raises(RecipeError, match=r"image.yaml:\d+: files\[0\]\.src|image.yaml:\d+:"):
            load_recipe(root, "b")


# --------------------------------------------------------------------------- push: digests read back from the registry


def test_built_images_are_pushed_and_their_digest_read_back_from_the_registry(
    stack, tmp_path, docker_client, test_base, registry, ns, monkeypatch, capsys
):
    """Issue 26 item 5: `build --push REGISTRY` pushes each built image as REGISTRY/NAME:KEY and records the digest
    the registry serves for it, only after the image id that digest pulls as equals the image built; a node then
    pulls NAME@DIGEST. The record is out/build/pushed.json."""
    from reprostack.containers.push import push_images, write_pushed
    from reprostack.lock.images import registry_digest

    root = make_project(tmp_path / "project", stack)
    results = build_images(["selftest-child"], options(root, tmp_path, docker_client, ns))
    target = f"{registry.host}/{ns}"
    lines: list[str] = []
    pushed = push_images(docker_client, [(r.name, r.tag, r.image_id) for r in results], target, log=lines.append)
    assert [p.name for p in pushed] == ["selftest", "selftest-child"]
    for p, r in zip(pushed, results):
        key = r.tag.rsplit(":", 1)[1]
        assert p.ref == f"{target}/{r.name}:{key}" and p.image_id == r.image_id
        assert p.digest == registry_digest(f"{target}/{r.name}", key)  # what a node pulling the tag gets
        assert f"{r.name}: pushed {p.ref}@{p.digest}" in "\n".join(lines)
    # pulled back by digest on a clean engine state: the same image id
    docker_client.images.remove(pushed[1].ref, force=True)
    docker_client.images.remove(results[1].tag, force=True)
    img = docker_client.images.pull(f"{target}/selftest-child@{pushed[1].digest}")
    assert img.id == results[1].image_id
    doc = json.loads(write_pushed(tmp_path / "out", pushed).read_text())
    assert [d["digest"] for d in doc["pushed"]] == [p.digest for p in pushed]
    # the digest read back once more as an operator pins a pushed image: `lock images --check` on a lock whose
    # image pin is pushed.json's entry passes; the same pin with another image's digest or id fails, naming it
    from reprostack import cli
    from lockfiles import lock_head

    entry = doc["pushed"][1]
    repo, key = entry["ref"].rsplit(":", 1)

    def check(digest: str, image_id: str) -> int:
        lock = tmp_path / "pinned.lock"
        lock.write_text(
            lock_head()
            + f'  pushed:\n    kind: image\n    repo: {repo}\n    tag: "{key}"\n'
            + f"    digest: {digest}   # read back by build --push (out/build/pushed.json)\n    id: {image_id}\n"
        )
        return cli.main(["lock", "images", "--check", "--lock", str(lock)])

    capsys.readouterr()
    assert check(entry["digest"], entry["image_id"]) == 0
    assert check(doc["pushed"][0]["digest"], entry["image_id"]) == 2
    assert "pinned.lock:13: upstreams.pushed.digest" in capsys.readouterr().err
    assert check(entry["digest"], doc["pushed"][0]["image_id"]) == 2
    assert "pinned.lock:14: upstreams.pushed.id" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value", ["http://127.0.0.1:5000", "reprostack", "127.0.0.1:5000/Upper", "127.0.0.1:5000/x:tag", "a b", ""]
)
def test_a_push_target_that_is_no_registry_is_one_line_before_any_build(tmp_path, capsys, value):
    from reprostack import cli

    assert cli.main(["build", "selftest", "--push", value, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("reprostack: error: --push") and "not a registry" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
