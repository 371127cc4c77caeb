"""Kernels prebuilt in an image (reprostack.kernels.prebuilt): the manifest the deepep image writes
(containers/deepep/record-kernels.py, run here for real on built-looking files in a folder laid out like the image),
checked against a real lock made from local git repos and the project's real kernels/*.yaml; then the micro gate
in container mode's in-image runner (`--kernels-manifest`): no fetch (the upstream servers are gone), no build
(the builders raise), test_ep from the image's tree, provenance saying prebuilt. And hostile manifests: one line."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import gaterun
from gaterun import run as run_gate_here

from conftest import without_progress
from reprostack.gates import kernelprep
from reprostack.cli import main
from reprostack.gates import registry
from reprostack.gates.container import container_plan, inner_argv
from reprostack.gates.plan import gate_plan
from reprostack.gates.base import RunContext
from reprostack.gates.options import GateOptions as GateArgs
from reprostack.kernels import prebuilt
from reprostack.kernels.prebuilt import PrebuiltError
from reprostack.kernels.recipe import load_recipe
from reprostack.lock import load
from test_gate_micro_flow import FIX, gpu_host, stand_in_python  # noqa: F401 (fixture)
from trialslog import real_ep1_texts, trials_log
from test_sources import make_stack, take_servers_away, write_project

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "containers" / "deepep" / "record-kernels.py"


def prebuilt_micro_options(root, lock, tmp_path, manifest, **kw):
    """gate micro's options for profile h200-ep1 with the kernels of an image's manifest (container mode's
    `prebuilt`), the cache and out folder under tmp_path."""
    return gaterun.options(
        "micro",
        root=root,
        lock=lock,
        tmp=tmp_path,
        profile="h200-ep1",
        prebuilt=manifest,
        **kw,
    )


def fake_image(
    img: Path,
    lock,
    *,
    nccl=(2, 30, 4),
    deepep_tree: str | None = None,
    arch: str = "90",
    root: Path = REPO,
    before_record=None,
) -> Path:
    """A folder laid out like the deepep image (trees, built NCCL, an installed deep_ep with _C, nvcc), then the
    real record-kernels.py writes kernels.json there as the Dockerfile does. Returns the manifest's path.
    `before_record(img)`: a step of the image before the manifest (the JIT kernels); it returns more arguments."""
    deepep, ncclpin = lock.get("deepep"), lock.get("nccl")
    (img / "src" / "nccl").mkdir(parents=True)
    (img / "src" / "deepep" / "tests" / "elastic").mkdir(parents=True)
    (img / "src" / "deepep" / "tests" / "elastic" / "test_ep.py").write_text("# the image's copy\n")
    inc, lib = img / "nccl" / "include", img / "nccl" / "lib"
    inc.mkdir(parents=True)
    lib.mkdir(parents=True)
    (inc / "nccl.h").write_text("".join(f"#define NCCL_{k} {v}\n" for k, v in zip(("MAJOR", "MINOR", "PATCH"), nccl)))
    (lib / "libnccl.so.2").write_bytes(b"\x7fELF nccl " + bytes(range(256)) * 64)
    pkg = img / "site" / "deep_ep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_C.cpython-310-x86_64-linux-gnu.so").write_bytes(b"\x7fELF deep_ep _C " + bytes(range(256)) * 16)
    nvcc = img / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    out = img / "kernels.json"
    argv = [
        sys.executable,
        str(RECORD),
        str(out),
        f"arch={arch}",
        "image=deepep",
        f"nccl.rev={ncclpin.rev}",
        f"nccl.patched_tree={ncclpin.patched_tree or ncclpin.tree}",
        f"nccl.recipe={load_recipe(root, 'nccl').digest}",
        f"nccl.src={img / 'src' / 'nccl'}",
        f"nccl.include={inc}",
        f"nccl.lib={lib / 'libnccl.so.2'}",
        f"deepep.rev={deepep.rev}",
        f"deepep.patched_tree={deepep_tree or deepep.patched_tree or deepep.tree}",
        f"deepep.recipe={load_recipe(root, 'deepep').digest}",
        f"deepep.src={img / 'src' / 'deepep'}",
        "deepep.package=python",
    ]
    if before_record is not None:
        argv += before_record(img)
    env = {**os.environ, "CUDA_HOME": str(img / "cuda"), "PYTHONPATH": str(img / "site")}
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture
def world(tmp_path):
    stack = make_stack(tmp_path / "srv")
    root = tmp_path / "project"
    lock = load(write_project(root, stack))
    return stack, root, lock


def one_line(e: Exception) -> str:
    msg = str(e)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_manifest_from_the_recipe_script_matches_the_lock(world, tmp_path):
    _, root, lock = world
    m = fake_image(tmp_path / "img", lock, root=root)
    d = json.loads(m.read_text())
    # no whole-lock sha256 (it rebuilt the image on any lock edit): each component is its own pin's identity
    assert d["image"] == "deepep" and "lock_sha256" not in d
    assert not any("lock_sha256" in c for c in d["components"].values())
    n, e = d["components"]["nccl"], d["components"]["deepep"]
    assert (n["nccl_version"], n["cuda_version"], n["arch"]) == ("2.30.4", "13.0", ["90"])
    assert e["nccl_version"] == "2.30.4" and e["paths"]["extension"].endswith("_C.cpython-310-x86_64-linux-gnu.so")
    assert n["recipe"] == load_recipe(root, "nccl").digest  # the same digest the host build key holds
    pre = prebuilt.check(m, lock, root, ("nccl", "deepep"), arch="90")
    t = pre.tree(lock, "deepep")
    assert t.path == tmp_path / "img" / "src" / "deepep" and t.tree == lock.get("deepep").patched_tree and t.patched
    assert pre.provenance()["mode"] == "image" and pre.kernels_provenance()["deepep"]["prebuilt"] is True
    assert "image_lock_sha256" not in pre.provenance()
    # a manifest of an image built before (with the lock's sha256, top and per component) is still read, the sha256
    # reported and never compared: another lock than this one is no reason to refuse the image
    old = tmp_path / "old-kernels.json"
    d_old = {**d, "lock_sha256": "a" * 64}
    d_old["components"] = {k: {**c, "lock_sha256": "a" * 64} for k, c in d["components"].items()}
    old.write_text(json.dumps(d_old))
    assert prebuilt.check(old, lock, root, ("nccl", "deepep"), arch="90").provenance()["image_lock_sha256"] == "a" * 64
    r = subprocess.run([sys.executable, str(RECORD), str(tmp_path / "k.json"), "lock_sha256=" + "a" * 64],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 1 and "lock_sha256=: a manifest names each component's own pin" in r.stderr
    assert not (tmp_path / "k.json").exists()
    # a child image (megatron) adds its source tree; the image that built the kernels stays named
    src = tmp_path / "img" / "src" / "megatron-lm"
    src.mkdir()
    pin = lock.get("deepep")  # any git pin of the lock stands in for megatron-lm here
    subprocess.run(
        [
            sys.executable,
            str(RECORD),
            str(m),
            f"megatron-lm.rev={pin.rev}",
            f"megatron-lm.patched_tree={pin.patched_tree}",
            f"megatron-lm.src={src}",
        ],
        check=True,
        capture_output=True,
    )
    d2 = json.loads(m.read_text())
    assert d2["image"] == "deepep" and d2["components"]["megatron-lm"]["kind"] == "source"
    assert d2["components"]["nccl"] == n


@pytest.mark.parametrize(
    "case, field",
    [
        ("patched_tree", "components.deepep.patched_tree"),
        ("recipe", "components.deepep.recipe"),
        ("nccl_floor", "components.nccl.nccl_version"),
        ("arch", "components.nccl.arch"),
        ("replaced_lib", "components.nccl.files["),
        ("missing_component", "components.megatron-lm"),
    ],
)
def test_a_mismatch_is_one_line_naming_the_field_and_both_values(world, tmp_path, case, field):
    _, root, lock = world
    kw, names, arch = {}, ("nccl", "deepep"), "90"
    if case == "patched_tree":
        kw["deepep_tree"] = lock.get("deepep").tree  # the tree before the patch series
    if case == "nccl_floor":
        kw["nccl"] = (2, 28, 9)
    m = fake_image(tmp_path / "img", lock, root=root, **kw)
    if case == "recipe":  # this checkout's recipe changed after the image was built
        p = root / "kernels" / "deepep.yaml"
        p.write_text(p.read_text().replace('LDFLAGS: "-Wl,--exclude-libs,ALL"', 'LDFLAGS: "-Wl,-O1"'))
    if case == "arch":
        arch = "100"
    if case == "replaced_lib":
        (tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"another NCCL")
    if case == "missing_component":
        names = ("megatron-lm", "nccl", "deepep")
    with pytest.raises(PrebuiltError) as ei:
        prebuilt.check(m, lock, root, names, arch=arch)
    msg = one_line(ei.value)
    assert msg.startswith(f"{m}: {field}"), msg
    want = {
        "patched_tree": (lock.get("deepep").tree, lock.get("deepep").patched_tree),
        "nccl_floor": ("2.28.9", ">= 2.30.4"),
        "arch": ("90", "100"),
    }.get(case)
    if want:
        assert f"the image has {want[0]}" in msg and f"has {want[1]}" in msg
    assert "reprostack build deepep" in msg or "CUDA_ARCH" in msg


def test_missing_manifest_is_one_line(world, tmp_path):
    _, root, lock = world
    with pytest.raises(PrebuiltError) as ei:
        prebuilt.check(tmp_path / "nope.json", lock, root, ("nccl", "deepep"))
    assert "no kernels manifest" in one_line(ei.value) and "--no-container" in str(ei.value)


def _hostile(tmp_path: Path, good: dict, case: str) -> Path:
    p = tmp_path / "hostile.json"
    d = json.loads(json.dumps(good))
    if case == "huge":
        p.write_text(json.dumps(d) + " " * (2 << 20))
        return p
    if case == "deep":
        p.write_text("[" * 200 + "]" * 200)
        return p
    if case == "nan":
        p.write_text(json.dumps(d).replace('"manifest_version": 1', '"manifest_version": NaN'))
        return p
    if case == "not_json":
        p.write_bytes(b"\xff\xfe{")
        return p
    if case == "dir":
        p.mkdir()
        return p
    if case == "version":
        d["manifest_version"] = 2
    if case == "dotdot":
        d["components"]["nccl"]["paths"]["lib"] = "/opt/reprostack/nccl/../../etc"
    if case == "relative_file":
        d["components"]["nccl"]["files"] = {"libnccl.so.2": "0" * 64}
    if case == "extra_key":
        d["components"]["deepep"]["run"] = "rm -rf /"
    if case == "pin_name":
        d["components"]["deepep"]["pin"] = "nccl"
    if case == "rev_type":
        d["components"]["deepep"]["rev"] = ["not", "a", "rev"]
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize(
    "case, says",
    [
        ("huge", "more than 1048576 bytes"),
        ("deep", "nested deeper"),
        ("nan", "NaN"),
        ("not_json", "not UTF-8"),
        ("dir", "not a regular file"),
        ("version", "manifest_version"),
        ("dotdot", "components.nccl.paths.lib"),
        ("relative_file", "components.nccl.files"),
        ("extra_key", "components.deepep"),
        ("pin_name", "components.deepep.pin"),
        ("rev_type", "components.deepep.rev"),
    ],
)
def test_hostile_manifest_is_one_line_naming_it(world, tmp_path, case, says):
    _, root, lock = world
    good = json.loads(fake_image(tmp_path / "img", lock, root=root).read_text())
    p = _hostile(tmp_path, good, case)
    with pytest.raises(PrebuiltError) as ei:
        prebuilt.check(p, lock, root, ("nccl", "deepep"))
    msg = one_line(ei.value)
    assert msg.startswith(str(p)) and says in msg, msg


def test_an_unreadable_built_file_is_one_line(world, tmp_path, monkeypatch):
    """A file the manifest lists that cannot be read (mode 0) is one PrebuiltError line naming it, not an OSError."""
    _, root, lock = world
    man = fake_image(tmp_path / "img", lock, root=root)
    lib = tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2"
    lib.chmod(0)
    if os.geteuid() == 0:  # root reads a mode-0 file: the read fails as it would for anyone else
        real = prebuilt.sha256_file

        def refuse(p):
            if Path(p) == lib:
                raise PermissionError(13, "Permission denied", str(p))
            return real(p)

        monkeypatch.setattr(prebuilt, "sha256_file", refuse)
    try:
        with pytest.raises(PrebuiltError) as ei:
            prebuilt.check(man, lock, root, ("nccl", "deepep"), arch="90")
        msg = one_line(ei.value)
        assert msg.startswith(str(man)) and f"components.nccl.files: {lib} cannot be read: Permission denied" in msg
    finally:
        lib.chmod(0o644)


def test_micro_in_image_uses_the_prebuilt_kernels_no_fetch_no_build(world, tmp_path, gpu_host, monkeypatch):  # noqa: F811
    stack, root, lock = world
    m = fake_image(tmp_path / "img", lock, root=root)
    take_servers_away(stack)  # any fetch would fail

    def no_build(*a, **k):
        raise AssertionError("a kernel build ran in container mode")

    monkeypatch.setattr(kernelprep.kbuild, "build_nccl", no_build)
    monkeypatch.setattr(kernelprep.kbuild, "build_deepep", no_build)
    (root / "gates" / "drivers").mkdir(parents=True, exist_ok=True)
    for d in ("dense_a2a.py", "micro_trials.py"):
        shutil.copy(REPO / "gates/drivers" / d, root / "gates/drivers" / d)
    py = stand_in_python(
        tmp_path,
        trials_log(real_ep1_texts(3)),  # the ranks mapped the image's pinned NCCL
        mapped=[os.path.realpath(tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2")],
    )
    cache = tmp_path / "cache"
    opts = prebuilt_micro_options(root, lock, tmp_path, m, python=py, trials=3)
    rep = run_gate_here(opts)
    assert rep.result == "pass", rep.reason
    kf = rep.provenance["kernels_from"]
    assert kf["mode"] == "image" and kf["manifest"] == str(m) and kf["image"] == "deepep"
    assert rep.provenance["kernels"]["nccl"]["prebuilt"] and "key" not in rep.provenance["kernels"]["nccl"]
    assert (
        str(tmp_path / "img" / "src" / "deepep" / "tests" / "elastic" / "test_ep.py")
        in (tmp_path / "calls").read_text()
    )
    assert not list(cache.rglob("*.pack")) and not (cache / "builds").exists()  # nothing fetched, nothing built
    assert "PYTHONPATH" not in rep.data["env"]  # the image's own deep_ep: no overlay, not the runner's code


def test_gate_with_a_bad_manifest_is_exit_2_and_writes_nothing(world, tmp_path, capsys):
    _, root, lock = world
    bad = tmp_path / "kernels.json"
    bad.write_text('{"manifest_version": 1}')
    out = tmp_path / "out"
    rc = main(
        [
            "gate",
            "micro",
            "--no-container",
            "--kernels-manifest",
            str(bad),
            "--lock",
            str(lock.path),
            "--cache",
            str(tmp_path / "cache"),
            "--out",
            str(out),
            "--offline",
        ]
    )
    err = without_progress(capsys.readouterr().err).strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"reprostack: error: {bad}:"), err
    assert not out.exists()
    rc = main(
        [
            "gate",
            "micro",
            "--container",
            "--kernels-manifest",
            str(bad),
            "--lock",
            str(lock.path),
            "--out",
            str(out),
            "--profile",
            "h200-ep1",
        ]
    )
    assert rc == 2 and "--kernels-manifest is the in-image runner's option" in capsys.readouterr().err


def test_container_runner_and_plan_name_the_prebuilt_kernels():
    lock = load(REPO / "upstreams.lock")
    for gate, uses in (("micro", True), ("megatron", True), ("vllm", False), ("nemo_rl", False)):
        g = registry.gate(gate)
        a = GateArgs(out=Path("/tmp/out"), profile=next(iter(g.load(REPO).profiles)))
        plan, _ = container_plan(g, a, lock, REPO, "reprostack/x:0123456789abcdef")
        argv = list(plan.commands[0].argv)
        assert ("--kernels-manifest" in argv) == uses, gate
        if uses:
            assert argv[argv.index("--kernels-manifest") + 1] == prebuilt.MANIFEST
    assert "--kernels-manifest" not in inner_argv(registry.gate("micro"), a, lock)
    p = gate_plan(registry.gate("micro"), REPO, lock, images_json=Path("/nonexistent"))
    pin = lock.get("deepep")
    assert p.kernels.startswith("prebuilt in image deepep: /opt/reprostack/kernels.json")
    assert f"deepep {pin.rev[:12]} patched tree {pin.patched_tree[:12]}" in p.kernels
    assert any(line.startswith("kernels: prebuilt in image deepep") for line in p.lines())
    assert p.to_dict()["kernels"] == p.kernels
    host = gate_plan(registry.gate("micro"), REPO, lock, mode="host")
    assert host.kernels.startswith("built on this host")
    assert gate_plan(registry.gate("vllm"), REPO, lock, images_json=Path("/x")).kernels.startswith(
        "the engine's DeepEP and NCCL in image vllm"
    )


def test_a_deepep_bump_names_the_serving_gates_and_every_image_built_on_deepep():
    from reprostack.bump.impact import impact

    imp = impact(REPO, "deepep")
    assert {"vllm", "sglang", "trtllm", "micro", "megatron"} <= set(imp.gates)
    assert {"deepep", "vllm", "sglang", "megatron", "nemo-rl"} <= set(imp.images) and "substrate" not in imp.images
    assert registry.gate("vllm").load(REPO).kernels == ("nccl", "deepep")


def test_plan_shows_the_comparison_arms_beside_the_deepep_arm():
    lock = load(REPO / "upstreams.lock")
    micro_plan = gate_plan(registry.gate("micro"), REPO, lock, profile="h200-ep1", images_json=Path("/x"))
    assert [(a.name, a.role) for a in micro_plan.arms] == [
        ("deepep", "deepep"),
        ("dense", "comparison, in the same launch as deepep (trial by trial, ABAB)"),
        ("legacy", "second-evidence"),
    ]
    assert micro_plan.arms[0].commands == micro_plan.commands
    # the dense arm is the trials launch with both arms (gates.micro), not a launch of its own
    dense = " ".join(micro_plan.arms[1].commands[0].argv)
    assert "/workspace/gates/drivers/micro_trials.py" in dense and "--arms deepep,dense --dense-warmup 20" in dense
    assert "dense_a2a.py" not in dense
    vllm = gate_plan(registry.gate("vllm"), REPO, lock, images_json=Path("/x"))
    roles = {a.name: a.role for a in vllm.arms}
    assert roles["deepep"] == "deepep" and "alternative" in roles.values()
    alt = next(a for a in vllm.arms if a.role == "alternative")
    assert "--all2all-backend" in alt.commands[0].argv and "deepep_v2" not in alt.commands[0].argv
    meg = gate_plan(registry.gate("megatron"), REPO, lock, images_json=Path("/x"))
    assert {a.role for a in meg.arms} == {"deepep", "reference"}
    text = "\n".join(vllm.lines())
    assert f"arm {alt.name}: ({alt.role}) node 0: vllm serve" in text
    assert [a["name"] for a in vllm.to_dict()["arms"]] == [a.name for a in vllm.arms]


def test_the_deepep_image_builds_with_the_kernel_recipes_values_and_refuses_shell(tmp_path):
    from reprostack.containers import render
    from reprostack.containers.errors import RecipeError

    vals = render.kernel_values(REPO)
    assert vals["kernels.nccl.make"] == 'NVCC_GENCODE="-gencode=arch=compute_${CUDA_ARCH},code=sm_${CUDA_ARCH}"'
    assert vals["kernels.deepep.env"] == (
        'TORCH_CUDA_ARCH_LIST="${CUDA_ARCH_DOTTED}" LDFLAGS="-Wl,--exclude-libs,ALL" '
        'NVCC_APPEND_FLAGS="--objdir-as-tempdir"'
    )
    assert vals["kernels.deepep.recipe"] == load_recipe(REPO, "deepep").digest
    shutil.copytree(REPO / "kernels", tmp_path / "kernels")
    p = tmp_path / "kernels" / "deepep.yaml"
    p.write_text(p.read_text().replace('LDFLAGS: "-Wl,--exclude-libs,ALL"', 'LDFLAGS: "x\\" $(touch /tmp/pwned) \\""'))
    with pytest.raises(RecipeError) as ei:
        render.kernel_values(tmp_path)
    assert one_line(ei.value).startswith(f"{p}: LDFLAGS: ") and "may hold only" in str(ei.value)


def test_container_run_stamps_the_image_id_on_prebuilt_kernels(tmp_path, monkeypatch):
    """run_in_container's read-back of a report whose kernels came from the image's manifest: kernels_from gets the
    image id, execution.kernels says prebuilt, the summary line names it (engine stood in; report file real)."""
    from types import SimpleNamespace

    from reprostack.gates import container
    from reprostack.hostenv import describe
    from reprostack.launch import docker as ld
    from reprostack.report import GateReport, utc_now, write_reports

    lock, root = load(REPO / "upstreams.lock"), REPO
    m = fake_image(tmp_path / "img", lock, root=root)
    pre = prebuilt.check(m, lock, root, ("nccl", "deepep"))
    out = tmp_path / "out"
    image_id = "sha256:" + "ab" * 32

    def run_node(client, plan, node, out_dir, **kw):
        assert "--kernels-manifest" in plan.commands[0].argv
        time_ok = utc_now()
        rep = GateReport(
            "micro",
            "h200-ep1",
            "skip",
            "no GPU",
            started=time_ok,
            ended=time_ok,
            duration_s=0.0,
            provenance={"kernels_from": pre.provenance(), "kernels": pre.kernels_provenance()},
        )
        write_reports([rep], out, required={"micro"})
        log = out_dir / plan.outputs.node_log(0)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("[node 0] done\n")
        return ld.NodeRun(0, 0, False, log, image_id, (), "c0ffee", 1.0)

    monkeypatch.setattr(ld, "run_node", run_node)
    monkeypatch.setattr(container, "_image", lambda client, ref, recipe: SimpleNamespace(labels={}))
    a = GateArgs(out=out, profile="h200-ep1", container=True, image="reprostack/deepep:0123456789abcdef")
    rep = container.run_in_container(registry.gate("micro"), a, RunContext(REPO, lock), client=object())
    kf = rep.provenance["kernels_from"]
    assert kf["mode"] == "image" and kf["image_id"] == image_id and kf["manifest_sha256"] == pre.sha256
    ex = rep.provenance["execution"]
    assert ex["kernels"] == {
        "mode": "prebuilt",
        "image_id": image_id,
        "manifest": str(m),
        "manifest_sha256": pre.sha256,
    }
    assert f"kernels prebuilt in the image, manifest {pre.sha256[:8]}" in describe(ex)


@pytest.mark.parametrize(
    "case, field",
    [
        ("lib-elsewhere", "components.nccl.paths.lib"),
        ("no-hashed-lib", "components.nccl.files"),
        ("two-hashed-libs", "components.nccl.files"),
        ("extension-unhashed", "components.deepep.paths.extension"),
        ("package-elsewhere", "components.deepep.paths.package"),
    ],
)
def test_every_path_a_gate_trusts_is_a_hashed_file_or_its_folder(world, tmp_path, case, field):
    """Issue 29 item 2: the manifest is checked whole. A `paths.lib` pointing at another folder (one holding torch's
    own libnccl.so.2, whose bytes nobody hashed) made the gate trust that folder: the one-NCCL check accepted any
    libnccl there. Now the NCCL folder is the folder of the one hashed libnccl file, and a free field that disagrees
    is one line naming it."""
    _, root, lock = world
    m = fake_image(tmp_path / "img", lock, root=root)
    d = json.loads(m.read_text())
    n, e = d["components"]["nccl"], d["components"]["deepep"]
    other = tmp_path / "torch" / "nvidia" / "nccl" / "lib"
    other.mkdir(parents=True)
    (other / "libnccl.so.2").write_bytes(b"\x7fELF torch's nccl 2.28.9")
    if case == "lib-elsewhere":
        n["paths"]["lib"] = str(other)
    elif case == "no-hashed-lib":
        n["files"] = {}
    elif case == "two-hashed-libs":
        n["files"][str(other / "libnccl.so.2")] = prebuilt.sha256_file(other / "libnccl.so.2")
    elif case == "extension-unhashed":
        e["paths"]["extension"] = str(other / "libnccl.so.2")
    elif case == "package-elsewhere":
        e["paths"]["package"] = str(other)
    m.write_text(json.dumps(d))
    with pytest.raises(PrebuiltError) as ei:
        prebuilt.check(m, lock, root, ("nccl", "deepep"), arch="90")
    msg = one_line(ei.value)
    assert f"{field}: " in msg, msg


def test_the_gate_trusts_only_the_hashed_nccl_file_not_its_folder(world, tmp_path):
    """The kernels of a prebuilt image: the one-NCCL judge accepts the file with the hashed bytes, not another
    libnccl that sits in the same folder (the manifest never hashed it)."""
    from reprostack.errors import BuildError
    from reprostack.kernels import runtime

    _, root, lock = world
    m = fake_image(tmp_path / "img", lock, root=root)
    pre = prebuilt.check(m, lock, root, ("nccl", "deepep"), arch="90")
    lib, sha = pre.nccl_file()
    assert lib == tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2"
    stray = lib.parent / "libnccl.so.2.28.9"
    stray.write_bytes(b"\x7fELF another nccl")
    ok = {"mapped": [str(lib)], "deleted": []}
    assert runtime.judge_one_nccl(ok, lib.parent, accept_sha256=sha) is ok
    with pytest.raises(BuildError, match="expected exactly one NCCL"):
        runtime.judge_one_nccl({"mapped": [str(stray)], "deleted": []}, lib.parent, accept_sha256=sha)


def release_wheel_image(world, tmp_path, *, nccl_released: bool = True):
    """The deepep image as its recipe builds it now: NCCL from the release wheel of the (unpatched, release) `nccl`
    git pin (lock pin nccl-wheel), unpacked by the recipe's unpack-nccl-wheel.py, the manifest written by
    record-kernels.py with the recipe's `nccl.wheel_pin=nccl-wheel ...` arguments. Returns (manifest, lock, wheel)."""
    from test_ncclwheel import WHEEL, make_wheel, sha, wheel_pin

    _, root, lock = world
    w = make_wheel(tmp_path / "house" / WHEEL)
    text = lock.path.read_text() + wheel_pin(sha(w))
    if (
        not nccl_released
    ):  # the nccl git pin is fetched from a branch, not its release tag: no release wheel stands for it
        text = text.replace("fetch-refs: [refs/tags/v2.30.4-1]", "fetch-refs: [refs/heads/master]")
    lock.path.write_text(text)
    lock = load(lock.path)
    img = tmp_path / "img"
    wdir = img / "wheels" / "substrate"
    wdir.mkdir(parents=True)
    shutil.copy(w, wdir / WHEEL)
    unpack = REPO / "containers" / "deepep-gin-gdaki" / "unpack-nccl-wheel.py"
    subprocess.run([sys.executable, str(unpack), str(wdir / WHEEL), str(img / "nccl"), "2.30.4"], check=True)
    (img / "src" / "deepep").mkdir(parents=True)
    pkg = img / "site" / "deep_ep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF deep_ep _C")
    nvcc = img / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    deepep, out = lock.get("deepep"), img / "kernels.json"
    argv = [
        sys.executable,
        str(RECORD),
        str(out),
        "arch=90",
        "image=deepep",
        "nccl.wheel_pin=nccl-wheel",
        f"nccl.wheel={WHEEL}",
        f"nccl.wheel_sha256={sha(w)}",
        "nccl.version=2.30.4",
        f"nccl.wheel_path={wdir / WHEEL}",
        f"nccl.include={img / 'nccl' / 'include'}",
        f"nccl.lib={img / 'nccl' / 'lib' / 'libnccl.so.2'}",
        f"deepep.rev={deepep.rev}",
        f"deepep.patched_tree={deepep.patched_tree or deepep.tree}",
        f"deepep.recipe={load_recipe(root, 'deepep').digest}",
        f"deepep.src={img / 'src' / 'deepep'}",
        "deepep.package=python",
    ]
    env = {**os.environ, "CUDA_HOME": str(img / "cuda"), "PYTHONPATH": str(img / "site")}
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out, lock, w


def test_the_release_wheel_of_an_unpatched_nccl_pin_is_accepted_as_the_images_nccl(world, tmp_path):
    """The deepep recipe takes NCCL from the release wheel kernels/nccl.yaml names (as the host build does, when the
    git pin is that release with no patch series): the gate accepts that manifest, trusting only the hashed lib."""
    from test_ncclwheel import sha

    m, lock, w = release_wheel_image(world, tmp_path)
    n = json.loads(m.read_text())["components"]["nccl"]
    assert (n["kind"], n["wheel_pin"], n["wheel_sha256"], n["nccl_version"]) == (
        "wheel",
        "nccl-wheel",
        sha(w),
        "2.30.4",
    )
    pre = prebuilt.check(m, lock, lock.path.parent, ("nccl", "deepep"), arch="90")
    assert pre.nccl_file()[0] == tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2"


@pytest.mark.parametrize("case", ["not_the_release", "other_pin", "other_sha256", "replaced_lib"])
def test_a_wheel_nccl_that_is_not_the_pins_release_wheel_is_refused_in_one_line(world, tmp_path, case):
    m, lock, w = release_wheel_image(world, tmp_path, nccl_released=case != "not_the_release")
    d = json.loads(m.read_text())
    if case == "other_pin":
        d["components"]["nccl"]["wheel_pin"] = "nccl-wheel-2-32"
    if case == "other_sha256":
        d["components"]["nccl"]["wheel_sha256"] = "0" * 64
    if case == "replaced_lib":
        (tmp_path / "img" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"another NCCL")
    m.write_text(json.dumps(d))
    with pytest.raises(PrebuiltError) as ei:
        prebuilt.check(m, lock, lock.path.parent, ("nccl", "deepep"), arch="90")
    msg = one_line(ei.value)
    field = {
        "not_the_release": "components.nccl.kind",
        "other_pin": "components.nccl.kind",
        "other_sha256": "components.nccl.wheel_sha256",
        "replaced_lib": "components.nccl.files[",
    }[case]
    assert msg.startswith(f"{m}: {field}"), msg
    if case == "other_pin":
        assert "git pin" in msg and "its release wheel: pin nccl-wheel" in msg
