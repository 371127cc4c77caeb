"""DeepEP's JIT kernels compiled into the deepep image at build time (issue 26; reprostack.kernels.jitimage, the
recipe's `jit:`): the rendered recipe and its context (only reprostack's needed modules, the recorded manifests of the
image's tree and arch), the in-image step run for real from that context on a folder laid out like the image (a
stand-in nvcc), kernels.json listing the kernels (record-kernels.py, hashed again), prebuilt.check refusing other
bytes, and the in-image runner of the micro gate using them without compiling them again; a SKIP on a host with no
GPU names them."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gaterun import run as run_gate_here
from reprostack import lock as lockmod
from reprostack.containers.context import Context
from reprostack.containers.engine import add_jit, render_recipe
from reprostack.containers.recipe import load_recipe
from reprostack.containers.render import instructions
from reprostack.gates import kernelprep
from reprostack.kernels import jit, jitimage, prebuilt
from reprostack.kernels.prebuilt import PrebuiltError
from test_gate_micro_flow import gpu_host, stand_in_python  # noqa: F401 (fixture)
from test_jit import FAKE_NVCC
from test_prebuilt_kernels import fake_image, prebuilt_micro_options, world  # noqa: F401 (fixture)
from test_sources import take_servers_away
from trialslog import real_ep1_texts, trials_log

REPO = Path(__file__).resolve().parents[1]
DEST = "root/jit/opt/reprostack/jit-build"


def test_the_deepep_recipe_compiles_the_recorded_manifests_with_reprostacks_own_modules():
    recipe = load_recipe(REPO, "deepep")
    lock = lockmod.load(REPO / "upstreams.lock")
    assert (recipe.jit.upstream, recipe.jit.arch, recipe.jit.dest) == ("deepep", "90", DEST)
    text, args, _ = render_recipe(recipe, lock, from_ref="sha256:" + "ab" * 32)
    assert args["CUDA_ARCH"] == recipe.jit.arch
    steps = [i.text for i in instructions(text)]
    env = steps.index("ENV EP_JIT_CACHE_DIR=/opt/reprostack/jit")
    jit_step = next(i for i, t in enumerate(steps) if "-m reprostack.kernels.jitimage" in t)
    wheels = next(i for i, t in enumerate(steps) if "requirements.txt" in t)  # jsonschema for load_manifest
    record = next(i for i, t in enumerate(steps) if "record-kernels.py" in t)
    assert wheels < env < jit_step < record and steps[jit_step - 1] == "COPY root/jit/ /"
    assert (
        "PYTHONPATH=/opt/reprostack/jit-build" in steps[jit_step] and '--tree "$DEEPEP_PATCHED_TREE"' in steps[jit_step]
    )
    assert "jit=/opt/reprostack/jit.json" in steps[record]
    ctx = Context(0)
    sel = add_jit(ctx, recipe, lock.git("deepep").patched_tree, REPO)
    assert sel["picked"] == ["h100-ep1", "h200-ep1"] and sel["left_out"] == {}  # the recorded ones (no p5en one yet)
    assert set(ctx.paths()) == {
        *(f"{DEST}/reprostack/{m}" for m in jitimage.MODULES),
        f"{DEST}/manifests/h100-ep1.json",
        f"{DEST}/manifests/h200-ep1.json",
        f"{DEST}/selection.json",
    }
    # nothing else of reprostack goes in: another module's edit leaves the image key alone
    assert not any("gates" in p or "containers" in p for p in ctx.paths())


def test_the_modules_in_the_context_are_all_the_step_imports(tmp_path):
    """The copy runs on its own: importing jitimage and loading a manifest pulls in no reprostack module outside it."""
    ctx = Context(0)
    add_jit(ctx, load_recipe(REPO, "deepep"), lockmod.load(REPO / "upstreams.lock").git("deepep").patched_tree, REPO)
    tarfile.open(fileobj=io.BytesIO(ctx.tar())).extractall(tmp_path, filter="data")
    build = tmp_path / DEST
    prog = (
        f"import sys; sys.path.insert(0, {str(build)!r})\n"
        "import reprostack.kernels.jitimage as ji\n"
        "from reprostack.kernels import jit\n"
        f"jit.load_manifest({str(build / 'manifests' / 'h200-ep1.json')!r})\n"
        "mods = sorted(m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == 'reprostack')\n"
        "print('\\n'.join(mods))\n"
    )
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True).stdout.split()
    assert out and all(p.startswith(str(build)) for p in out), out


@pytest.mark.parametrize("case", ["other_tree", "other_arch"])
def test_manifests_of_another_tree_or_arch_stay_out_and_are_named(tmp_path, case):
    root = tmp_path / "project"
    shutil.copytree(REPO / "kernels", root / "kernels")
    m = json.loads((root / "kernels/jit/h200-ep1.json").read_text())
    m["profile"] = "other"
    if case == "other_tree":
        m["deepep_tree"] = "0" * 40
    else:
        m["arch"] = "100f"
    (root / "kernels/jit/other.json").write_text(json.dumps(m))
    ctx = Context(0)
    sel = add_jit(ctx, load_recipe(REPO, "deepep"), "8413dba0c3904906c4f616b8eb6f502b4be6b14b", root)
    assert sel["picked"] == ["h100-ep1", "h200-ep1"] and list(sel["left_out"]) == ["other"]
    assert ("0" * 40 if case == "other_tree" else "sm_100f") in sel["left_out"]["other"]
    assert f"{DEST}/manifests/other.json" not in ctx.paths()
    (root / "kernels/jit/bad.json").write_text('{"schema": "reprostack.deepep-jit/1"}')  # untrusted: one line
    with pytest.raises(jit.ManifestError, match=r"bad\.json: \(top\)"):
        add_jit(Context(0), load_recipe(REPO, "deepep"), "8413dba0c3904906c4f616b8eb6f502b4be6b14b", root)


def _world_manifest(root: Path, tree: str, n: int = 2) -> dict:
    """The recorded h200-ep1 manifest's first `n` kernels, as if recorded for the test world's deepep tree."""
    m = json.loads((REPO / "kernels/jit/h200-ep1.json").read_text())
    m.update(deepep_tree=tree, kernels=m["kernels"][:n])
    (root / "kernels/jit/h200-ep1.json").write_text(json.dumps(m, indent=1))
    return m


def _jit_step(root: Path, tree: str, nvcc: str = FAKE_NVCC):
    """A `before_record` for fake_image: the image's JIT step, run for real from the context reprostack build writes
    (its copy of reprostack's modules on PYTHONPATH, as the Dockerfile runs it), with a stand-in nvcc."""

    def step(img: Path) -> list[str]:
        ctx = Context(0)
        add_jit(ctx, load_recipe(REPO, "deepep"), tree, root)
        tarfile.open(fileobj=io.BytesIO(ctx.tar())).extractall(img / "ctx", filter="data")
        (img / "cuda" / "bin" / "nvcc").write_text(nvcc)
        (img / "site" / "deep_ep" / "include").mkdir(exist_ok=True)
        (img / "site" / "deep_ep" / "envs.py").write_text(  # as DeepEP's setup.py persists the image's build env
            f"persistent_envs = dict()\npersistent_envs['EP_NCCL_ROOT_DIR'] = '{img / 'nccl'}'\n"
        )
        build = img / "ctx" / DEST
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(img),
            "CUDA_HOME": str(img / "cuda"),
            "EP_JIT_CACHE_DIR": str(img / "jit"),  # the Dockerfile's ENV
            "PYTHONPATH": f"{build}:{img / 'site'}",
        }
        argv = [sys.executable, "-m", "reprostack.kernels.jitimage", str(img / "jit.json"), str(build)]
        p = subprocess.run([*argv, "--arch", "90", "--tree", tree], env=env, capture_output=True, text=True)
        (img / "jit-step.log").write_text(f"rc {p.returncode}\n{p.stdout}{p.stderr}")
        return [f"jit={img / 'jit.json'}"]

    return step


def _runner_context(img: Path) -> jit.Context:
    env = {"PATH": os.environ["PATH"], "HOME": str(img), "CUDA_HOME": str(img / "cuda")}
    ctx, why = jit.Context.of(img / "site", {**env, "EP_JIT_CACHE_DIR": str(img / "jit")}, "90")
    assert ctx is not None, why
    return ctx


def test_the_image_step_compiles_into_the_folders_deepep_asks_for_and_kernels_json_lists_them(world, tmp_path):  # noqa: F811
    _, root, lock = world
    tree = lock.get("deepep").patched_tree
    m = _world_manifest(root, tree)
    img = tmp_path / "img"
    out = fake_image(img, lock, root=root, before_record=_jit_step(root, tree))
    assert (img / "jit-step.log").read_text().startswith("rc 0"), (img / "jit-step.log").read_text()
    j = json.loads(out.read_text())["jit"]
    ctx = _runner_context(img)  # what the in-image runner computes for the test (kernelprep.jit_prewarm)
    want = {ctx.folder(k["name"], k["code"]).name for k in m["kernels"]}
    assert {k["folder"] for k in j["kernels"]} == want and len(want) == 2
    assert (j["arch"], j["signature"], j["cache_dir"]) == ("90a", "NVCC13.0", str(img / "jit"))
    assert j["profiles"]["h200-ep1"]["kernels"] == 2 and j["deepep_patched_tree"] == tree
    for k in j["kernels"]:
        assert (img / "jit" / "cache" / k["folder"] / "kernel.cubin").is_file()
    pre = prebuilt.check(out, lock, root, ("nccl", "deepep"), arch="90")
    assert pre.jit_words().startswith("2 prebuilt DeepEP JIT kernel(s) of h200-ep1 (sm_90a, NVCC13.0)")
    assert set(pre.provenance()["jit"]["kernels"]) == want
    # other bytes in a kernel's folder than the manifest records: one line naming the kernel's field
    cubin = img / "jit" / "cache" / j["kernels"][1]["folder"] / "kernel.cubin"
    cubin.write_bytes(b"other")
    with pytest.raises(PrebuiltError, match=r"jit\.kernels\[1\]\.cubin_sha256") as e:
        prebuilt.check(out, lock, root, ("nccl", "deepep"), arch="90")
    assert "\n" not in str(e.value)
    # and record-kernels.py, hashing them again, refuses to write a manifest over them
    r = subprocess.run(
        [sys.executable, str(REPO / "containers/deepep/record-kernels.py"), str(tmp_path / "k.json"), f"jit={img / 'jit.json'}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 1 and "kernel.cubin: not the file" in r.stderr and not (tmp_path / "k.json").exists()


@pytest.mark.parametrize("case", ["nvcc_fails", "flag_var", "other_tree_in_folder"])
def test_the_image_step_fails_the_build_in_one_line(world, tmp_path, case):  # noqa: F811
    _, root, lock = world
    tree = lock.get("deepep").patched_tree
    _world_manifest(root, tree)
    nvcc = FAKE_NVCC
    if case == "nvcc_fails":
        nvcc = FAKE_NVCC.replace("src=$1; out=$4", 'echo "kernel.cu(5): error: out of registers" >&2; exit 2')
    step = _jit_step(root, tree, nvcc)

    def spoiled(
        img: Path,
    ) -> list[str]:  # an image whose DeepEP flags differ, or a manifest the engine never puts there
        if case == "nvcc_fails":
            return step(img)
        if case == "flag_var":
            return _rerun_with_flag(img, root, tree)
        return _rerun_with_other_manifest(img, root, tree)

    img = tmp_path / "img"
    with pytest.raises(AssertionError):  # record-kernels.py then finds no jit.json: the build stops there too
        fake_image(img, lock, root=root, before_record=spoiled)
    log = (img / "jit-step.log").read_text().splitlines()
    assert log[0] == "rc 1" and not (img / "jit.json").exists()
    last = log[-1]
    if case == "nvcc_fails":
        assert (
            last.startswith("jitimage: 2 kernel(s) did not compile: barrier: nvcc exit 2")
            and "out of registers" in last
        )
    elif case == "flag_var":
        assert "DeepEP's JIT context cannot be known: EP_JIT_WITH_LINEINFO set" in last
    else:
        assert "recorded for deepep tree" in last and "this image is tree" in last


def _rerun(img: Path, tree: str) -> list[str]:
    build = img / "ctx" / DEST
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(img),
        "CUDA_HOME": str(img / "cuda"),
        "EP_JIT_CACHE_DIR": str(img / "jit2"),
        "PYTHONPATH": f"{build}:{img / 'site'}",
    }
    (img / "jit.json").unlink(missing_ok=True)
    argv = [sys.executable, "-m", "reprostack.kernels.jitimage", str(img / "jit.json"), str(build)]
    p = subprocess.run([*argv, "--arch", "90", "--tree", tree], env=env, capture_output=True, text=True)
    (img / "jit-step.log").write_text(f"rc {p.returncode}\n{p.stdout}{p.stderr}")
    return [f"jit={img / 'jit.json'}"]


def _rerun_with_flag(img: Path, root: Path, tree: str) -> list[str]:
    _jit_step(root, tree)(img)
    with open(img / "site" / "deep_ep" / "envs.py", "a") as f:
        f.write("persistent_envs['EP_JIT_WITH_LINEINFO'] = '1'\n")
    return _rerun(img, tree)


def _rerun_with_other_manifest(img: Path, root: Path, tree: str) -> list[str]:
    _jit_step(root, tree)(img)
    p = img / "ctx" / DEST / "manifests" / "h200-ep1.json"
    m = json.loads(p.read_text())
    m["deepep_tree"] = "1" * 40
    p.write_text(json.dumps(m))
    return _rerun(img, tree)


def test_a_stale_manifest_leaves_the_image_without_prebuilt_kernels_and_says_why(world, tmp_path):  # noqa: F811
    """After a DeepEP bump the recorded manifest names the old tree: the image builds, holds no prebuilt kernel of
    that profile, and kernels.json says why (the gate then compiles them as DeepEP would at first use)."""
    _, root, lock = world
    _world_manifest(root, "2" * 40)
    tree = lock.get("deepep").patched_tree
    out = fake_image(tmp_path / "img", lock, root=root, before_record=_jit_step(root, tree))
    j = json.loads(out.read_text())["jit"]
    assert j["kernels"] == [] and j["profiles"] == {}
    assert j["left_out"]["h200-ep1"] == f"recorded for deepep tree {'2' * 40}, the image's is {tree}"
    assert set(j["left_out"]) == {p.stem for p in (root / "kernels/jit").glob("*.json")}  # the world's tree is none
    assert prebuilt.check(out, lock, root, ("nccl", "deepep")).jit_words().startswith("0 prebuilt DeepEP JIT")


def test_micro_in_the_image_uses_the_prebuilt_jit_kernels_and_compiles_none(world, tmp_path, gpu_host, monkeypatch):  # noqa: F811
    stack, root, lock = world
    tree = lock.get("deepep").patched_tree
    _world_manifest(root, tree)
    img = tmp_path / "img"
    m = fake_image(img, lock, root=root, before_record=_jit_step(root, tree))
    take_servers_away(stack)
    monkeypatch.setenv("CUDA_HOME", str(img / "cuda"))  # the image's ENV
    monkeypatch.setenv("REPROSTACK_CUDA_ARCH", "90")
    compiled = []
    real = jit._compile_tmp
    monkeypatch.setattr(jit, "_compile_tmp", lambda *a: compiled.append(a[1]) or real(*a))
    (root / "gates" / "drivers").mkdir(parents=True, exist_ok=True)
    for d in ("dense_a2a.py", "micro_trials.py"):
        shutil.copy(REPO / "gates/drivers" / d, root / "gates/drivers" / d)
    py = stand_in_python(
        tmp_path,
        trials_log(real_ep1_texts(3)),
        mapped=[os.path.realpath(img / "nccl" / "lib" / "libnccl.so.2")],
    )
    opts = prebuilt_micro_options(root, lock, tmp_path, m, python=py, trials=3)
    rep = run_gate_here(opts)
    assert rep.result == "pass", rep.reason
    block = rep.data["jit"]
    assert block["prebuilt"]["found"] == 2 and block["prebuilt"]["kernels"] == 2
    assert block["prewarm"]["present"] == 2 and block["prewarm"]["compiled"] == 0 and compiled == []
    assert rep.data["env"]["EP_JIT_CACHE_DIR"] == str(img / "jit")  # DeepEP looks in the image's folder
    assert rep.provenance["kernels_from"]["jit"]["arch"] == "90a"


def test_a_skip_with_no_gpu_names_the_images_jit_kernels(world, tmp_path, gpu_host, monkeypatch):  # noqa: F811
    stack, root, lock = world
    tree = lock.get("deepep").patched_tree
    _world_manifest(root, tree)
    m = fake_image(tmp_path / "img", lock, root=root, before_record=_jit_step(root, tree))
    take_servers_away(stack)
    gpu_host["gpu_count"] = 0
    monkeypatch.setenv("REPROSTACK_CUDA_ARCH", "90")
    opts = prebuilt_micro_options(root, lock, tmp_path, m)
    rep = run_gate_here(opts)
    assert rep.result == "skip"
    assert "the image holds 2 prebuilt DeepEP JIT kernel(s) of h200-ep1 (sm_90a, NVCC13.0)" in rep.reason
    assert kernelprep is not None
