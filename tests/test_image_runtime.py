"""What the chain's images must hold for the real container runtime (issue 37 items 1-4 and 11): pyxis/enroot's
nvidia hook or the NVIDIA container toolkit, libfabric's HMEM dlopens, aws-ofi-nccl's AWS platform, a PYTHONPATH that
survives a launcher's export, the serving gates' AIPerf.

Static half (CI): the recipes rendered from the real lock, the image's effective ENV followed down the chain of
parents, the rendered Slurm script's own srun call (run by bash on a recording srun), and the in-image check scripts
on real inputs. In-image half: the same entry run in the images `nox -s images` built (results/images/chain.json's
image ids), where this engine holds them; else a skip that says so.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import dockerd
from reprostack import lock as lockmod
from reprostack.cluster import slurm
from reprostack.containers import load_all, render_recipe
from reprostack.containers.render import instructions
from reprostack.gates import registry
from test_launch_slurm import run_prologue

docker_client = dockerd.docker_client  # session fixture (tests/dockerd.py)

REPO = Path(__file__).resolve().parents[1]
CHAIN_ROOT = "cuda-toolkit"  # the registry-free chain's lowest image (NVIDIA's CUDA bases set the NVIDIA_* env)
SERVING = ("vllm", "sglang")  # the serving images that build (trtllm and nemo-rl do not: containers/README.md)


@pytest.fixture(scope="module")
def lock():
    return lockmod.load(REPO / "upstreams.lock")


@pytest.fixture(scope="module")
def recipes():
    return load_all(REPO)


def rendered(recipes, lock, name: str) -> str:
    if name == "deepep-gin-gdaki":  # its stack's lock pins NCCL as a wheel (as tests/test_containers.py renders it)
        lock = lockmod.load(REPO / "upstreams.lock", stack="gin-gdaki")
    return render_recipe(recipes[name], lock, from_ref="sha256:" + "ab" * 32)[0]


def chain(recipes, name: str) -> list[str]:
    """`name` and its parents, lowest first."""
    out = [name]
    while recipes[out[-1]].parent:
        out.append(recipes[out[-1]].parent)
    return out[::-1]


def image_env(recipes, lock, name: str) -> dict[str, str]:
    """The ENV an image of the chain ends with: every ENV of its recipes, parents first (`${X}` of an earlier value
    expanded as the builder does; an unset one is empty)."""
    env: dict[str, str] = {}
    for r in chain(recipes, name):
        for i in instructions(rendered(recipes, lock, r)):
            if i.keyword != "ENV":
                continue
            for word in shlex.split(i.text[len("ENV") :]):
                k, _, v = word.partition("=")
                for ref in sorted(env, key=len, reverse=True):
                    v = v.replace("${" + ref + "}", env[ref])
                env[k] = v.replace("${" + k + "}", "") if "${" in v else v
    return env


def chain_images(recipes) -> list[str]:
    return [n for n in recipes if CHAIN_ROOT in chain(recipes, n) and n != CHAIN_ROOT]


# --------------------------------------------------------------------------- 1: the driver gets injected


def test_every_image_of_the_chain_asks_the_runtime_for_the_gpu_as_nvidias_cuda_images_do(recipes, lock):
    """enroot's nvidia hook and the NVIDIA container toolkit inject the driver only when NVIDIA_VISIBLE_DEVICES is
    set, with the capabilities NVIDIA_DRIVER_CAPABILITIES names: every image on the chain (all the gate images) ends
    with `all` and `compute,utility`, set once in the lowest image, and the substrate's build checks them."""
    names = chain_images(recipes)
    assert {"substrate", "deepep", "vllm", "sglang", "megatron", "nemo-rl"} <= set(names)
    for name in [CHAIN_ROOT, *names]:
        env = image_env(recipes, lock, name)
        assert (env.get("NVIDIA_VISIBLE_DEVICES"), env.get("NVIDIA_DRIVER_CAPABILITIES")) == (
            "all",
            "compute,utility",
        ), name
    own = {n: rendered(recipes, lock, n) for n in names}
    assert not [n for n, t in own.items() if "ENV NVIDIA_" in t], "set once, in the chain's lowest image"
    assert '[ "${NVIDIA_VISIBLE_DEVICES:-}" = all ]' in own["substrate"]
    assert '[ "${NVIDIA_DRIVER_CAPABILITIES:-}" = compute,utility ]' in own["substrate"]


# --------------------------------------------------------------------------- 1b: PATH under enroot's login shell

PATH_FILE = "/etc/profile.d/00-image-path.sh"
PATH_WRITER = f'printf \'export PATH="%s"\\n\' "$PATH" > {PATH_FILE}'


def test_every_gate_image_restores_its_path_in_a_login_shell(recipes, lock):
    """enroot starts a container through a login shell (ENROOT_LOGIN_SHELL=yes), where Debian's /etc/profile sets PATH
    anew: without /etc/profile.d/00-image-path.sh written after the chain's last `ENV PATH`, python3 under pyxis is
    Debian's, not /opt/venv's (no such file on 8bb97a9: every image of the chain lost its PATH)."""
    for name in chain_images(recipes):
        last_env = last_writer = -1
        steps = [i for r in chain(recipes, name) for i in instructions(rendered(recipes, lock, r))]
        for n, i in enumerate(steps):
            if i.keyword == "ENV" and any(w.startswith("PATH=") for w in shlex.split(i.text[len("ENV") :])):
                last_env = n
            if i.keyword == "RUN" and PATH_WRITER in i.text:
                last_writer = n
        assert last_env >= 0 and last_writer > last_env, f"{name}: no {PATH_FILE} written after its last ENV PATH"


# --------------------------------------------------------------------------- 2: FI_HMEM's dlopens resolve

HMEM_TOOLKIT, HMEM_DRIVER = ("libcudart.so",), ("libcuda.so.1", "libnvidia-ml.so.1")  # libfabric src/hmem_cuda.c
CHECK_HMEM = REPO / "containers" / "substrate" / "check-hmem-dlopen.py"


def test_every_library_libfabric_dlopens_for_hmem_is_on_the_loader_path_and_probed(recipes, lock):
    """libfabric is built with --enable-cuda-dlopen and dlopens libcudart.so, libcuda.so.1 and libnvidia-ml.so.1 at
    run time (src/hmem_cuda.c of the pin); the toolkit's unversioned libcudart.so link (cuda-toolkit's Dockerfile) is
    in /usr/local/cuda/lib, which must be in ld.so's cache (not only LD_LIBRARY_PATH, which a launcher may replace),
    its link-time stub folder never; the substrate's build probes each name with libfabric's own log."""
    toolkit = rendered(recipes, lock, "cuda-toolkit")
    assert "ln -s libcudart.so.13 /usr/local/cuda/lib/libcudart.so" in toolkit
    sub = rendered(recipes, lock, "substrate")
    assert "--enable-cuda-dlopen" in sub
    step = next(i.text for i in instructions(sub) if i.keyword == "RUN" and "/etc/ld.so.conf.d/" in i.text)
    conf = [w for w in step.split("&&") if "/etc/ld.so.conf.d/" in w]
    assert conf == [" echo /usr/local/cuda/lib > /etc/ld.so.conf.d/cuda-13.conf "]
    assert "stubs" not in conf[0]
    assert step.index("/etc/ld.so.conf.d/") < step.index(" ldconfig ") < step.index("check-hmem-dlopen.py")
    probe = step[step.index("check-hmem-dlopen.py") :].split("&&")[0].split()
    assert probe[1:4] == [
        "/opt/reprostack/efa/lib/libfabric.so.1",
        "/opt/reprostack/efa/bin/fi_info",
        "/opt/reprostack/hmem-dlopen.json",
    ]
    assert probe[4:] == ["--toolkit", *HMEM_TOOLKIT, "--driver", *HMEM_DRIVER]


def test_the_hmem_probe_refuses_a_name_list_that_is_not_the_librarys(tmp_path):
    """The probe's first stage, on a library file that names libcudart.so but not libcuda.so.1: one line naming
    the missing name, exit 1, nothing written (before any stand-in is made)."""
    lib = tmp_path / "libfabric.so.1"
    lib.write_bytes(b"\x7fELF\0...\0libcudart.so\0Failed to dlopen %s\0")
    rec = tmp_path / "rec.json"
    r = subprocess.run(
        [sys.executable, str(CHECK_HMEM), str(lib), "/bin/true", str(rec), "--toolkit", "libcudart.so"]
        + ["--driver", "libcuda.so.1", "--inject-dir", str(tmp_path / "inject")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and r.stderr.strip() == (
        f"check-hmem-dlopen: {lib} names no libcuda.so.1: the list of names is not this libfabric's"
    )
    assert not rec.exists() and not (tmp_path / "inject").exists()


def test_the_hmem_probe_keeps_libfabrics_message_not_its_pid_or_time():
    """libfabric's log lines (`libfabric:PID:TIME::core:core:FUNC():LINE<LEVEL> MSG`, src/log.c) go into the image's
    record without the pid and time stamp, so the layer is the same bytes on every build."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_hmem", CHECK_HMEM)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    text = (
        "libfabric:4711:1765000000::core:core:cuda_hmem_dl_init():564<info> Failed to dlopen libcudart.so\n"
        "libfabric:4711:1765000000::core:core:ofi_hmem_init():420<info> Hmem iface FI_HMEM_CUDA not supported\n"
        "libfabric:4711:1765000000::core:core:ofi_register_provider():530<info> registering provider: shm (200.0)\n"
        "efa:\n"
    )
    assert m.log_lines(text) == [
        "cuda_hmem_dl_init():564<info> Failed to dlopen libcudart.so",
        "ofi_hmem_init():420<info> Hmem iface FI_HMEM_CUDA not supported",
    ]


# --------------------------------------------------------------------------- 3: aws-ofi-nccl for the AWS platform

CHECK_PLATFORM = REPO / "containers" / "deepep" / "check-ofi-platform.sh"


def test_aws_ofi_nccl_is_configured_for_the_aws_platform_and_the_summary_checked(recipes, lock):
    """Without --enable-platform-aws, configure probes whether the BUILD host is EC2 (m4/ax_platform_aws.m4 of the
    pin) and here prints `Enabled Platforms: Default`: no p5en topology or tuner. The deepep image configures as
    AWS's packages do, keeps configure's output and checks its summary before building."""
    text = rendered(recipes, lock, "deepep")
    step = next(
        i.text for i in instructions(text) if i.keyword == "RUN" and "./configure" in i.text and "ofi" in i.text
    )
    assert "--enable-platform-aws" in step and "--disable-platform-aws" not in step
    assert "> /opt/reprostack/built/aws-ofi-nccl.configure.log 2>&1" in step
    checked = "check-ofi-platform.sh /opt/reprostack/built/aws-ofi-nccl.configure.log AWS"
    assert step.index("./configure") < step.index(checked) < step.index("make -j")


@pytest.mark.parametrize(
    "summary, rc, says",
    [
        ("Default, AWS", 0, "check-ofi-platform: Enabled Platforms: Default, AWS"),
        ("Default", 1, "check-ofi-platform: configure says 'Enabled Platforms: Default', not AWS (LOG)"),
        (None, 1, "check-ofi-platform: LOG has no '* Enabled Platforms:' line (not aws-ofi-nccl's configure output?)"),
    ],
)
def test_the_platform_check_reads_configures_summary(tmp_path, summary, rc, says):
    """The summary as configure.ac of the pin prints it (`echo "* Enabled Platforms: ${ENABLED_PLATFORMS}"`)."""
    log = tmp_path / "configure.log"
    body = "checking for Libfabric 1.22.0 or greater... yes\n*\n* AWS OFI NCCL plugin has been configured.\n*\n"
    log.write_text(body + (f"* Enabled Platforms: {summary}\n*\n" if summary else ""))
    r = subprocess.run(["sh", str(CHECK_PLATFORM), str(log), "AWS"], capture_output=True, text=True)
    assert r.returncode == rc and (r.stdout + r.stderr).strip() == says.replace("LOG", str(log))


# --------------------------------------------------------------------------- 4: PYTHONPATH under the launcher


def pyxis_srun(tmp_path: Path, gate: str, lock) -> list[str]:
    """The gate's rendered pyxis sbatch, run by bash on a recording srun: the srun call of the gate step."""
    script = tmp_path / "job.sbatch"
    image = f"registry.invalid/reprostack/{gate}@sha256:" + "0" * 64
    kw = dict(images_json=Path(os.devnull), nodes=2, out=f"out/{gate}", image=image)
    script.write_text(slurm.script_for(registry.gate(gate), REPO, lock, **kw))
    calls = run_prologue(script, tmp_path, {})
    return next(c for c in calls if any(a.startswith("--container-image=") for a in c))


def exported(call: list[str]) -> dict[str, str]:
    """What srun's `--export=ALL,K=V,...` sets in the container (on top of the job's environment)."""
    spec = next(a for a in call if a.startswith("--export=")).split("=", 1)[1]
    return dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)


def test_the_megatron_tree_is_importable_under_what_the_slurm_script_exports(recipes, lock, tmp_path):
    """pyxis starts the container with `--export=ALL,PYTHONPATH=/opt/reprostack/code,...`: an image's own PYTHONPATH
    is replaced, so the megatron image's tree (and NeMo-RL's) must reach sys.path another way (a .pth in the
    interpreter's site-packages); no image of the chain may rely on ENV PYTHONPATH."""
    env = exported(pyxis_srun(tmp_path, "megatron", lock))
    assert env["PYTHONPATH"] == slurm.CODE
    for name in chain_images(recipes):
        assert "PYTHONPATH" not in image_env(recipes, lock, name), f"{name}: ENV PYTHONPATH, which the export replaces"
    for name, tree in (("megatron", "/opt/reprostack/src/megatron-lm"), ("nemo-rl", "/opt/reprostack/src/nemo-rl")):
        step = next(i.text for i in instructions(rendered(recipes, lock, name)) if ".pth" in i.text)
        assert f"echo {tree} > " in step and 'sysconfig.get_paths()["purelib"]' in step


def test_under_pyxis_the_task_sets_its_own_pythonpath(lock, tmp_path):
    """Seen in the real-image rehearsal (results/rehearsal/pyxis.md): pyxis gave the container the SUBMITTER's
    PYTHONPATH, not the value of srun's `--export=ALL,PYTHONPATH=...`, so `python3 -m reprostack` in the deepep image
    said "No module named reprostack" on both nodes whenever the operator's shell had a PYTHONPATH (a module system, a
    conda env). The task's own shell now exports it first: whatever the container starts with, the gate's python
    finds the mounted code."""
    call = pyxis_srun(tmp_path, "micro", lock)
    inner = call[-1]
    assert call[-3:-1] == ["bash", "-c"] and inner.startswith(f"export PYTHONPATH={slurm.CODE} PYTHONUNBUFFERED=1;")
    first = inner.split(";", 1)[0]
    got = subprocess.run(
        ["bash", "-c", first + '; printf "%s" "$PYTHONPATH"'],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": "/home/operator/conda/lib/python3.11"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert got.stdout == slurm.CODE


def chain_image(docker_client, name: str) -> str:
    """The id of image `name` as results/images/chain.json records it, when this engine holds it; else a skip."""
    rec = json.loads((REPO / "results" / "images" / "chain.json").read_text())
    step = next(
        (s for s in rec["steps"] if s.get("step") == f"build {name}" and s.get("status") in ("built", "reused")), None
    )
    if step is None:
        pytest.skip(f"results/images/chain.json has no built {name} image")
    import docker.errors

    try:
        return docker_client.images.get(step["image_id"]).id
    except docker.errors.ImageNotFound:
        pytest.skip(f"the {name} image of results/images/chain.json ({step['image_id'][:19]}) is not on this engine")


def run_in(docker_client, image: str, env: dict, argv: list[str]) -> tuple[int, str]:
    """`argv` in a container of `image` (no network), reprostack's package mounted at the launchers' CODE."""
    c = docker_client.containers.run(
        image,
        argv,
        environment=env,
        network_mode="none",
        volumes={str(REPO / "src" / "reprostack"): {"bind": f"{slurm.CODE}/reprostack", "mode": "ro"}},
        detach=True,
    )
    try:
        rc = c.wait(timeout=300)["StatusCode"]
        return rc, c.logs().decode(errors="replace")
    finally:
        c.remove(force=True)


def test_in_the_built_megatron_image_the_entry_imports_under_the_exported_environment(docker_client, lock, tmp_path):
    """The rendered sbatch's exported environment, in the megatron image `nox -s images` built: both the launcher's
    code (reprostack, from PYTHONPATH) and the image's Megatron-LM tree import (ModuleNotFoundError on 8bb97a9)."""
    image = chain_image(docker_client, "megatron")
    env = exported(pyxis_srun(tmp_path, "megatron", lock))
    rc, out = run_in(
        docker_client, image, env, ["python3", "-c", "import reprostack, megatron.core; print(megatron.core.__file__)"]
    )
    assert rc == 0 and out.strip().splitlines()[-1] == "/opt/reprostack/src/megatron-lm/megatron/core/__init__.py", out


@pytest.mark.parametrize("name", ["deepep", *SERVING, "megatron"])
def test_in_the_built_image_a_login_shell_keeps_the_images_path(docker_client, name):
    """`bash -l` in the image `nox -s images` built (enroot's way in) ends with the image's own ENV PATH, and python3
    is the venv's."""
    image = chain_image(docker_client, name)
    want = next(e[5:] for e in docker_client.images.get(image).attrs["Config"]["Env"] if e.startswith("PATH="))
    c = docker_client.containers.run(
        image, ["bash", "-lc", 'printf "%s\\n" "$PATH"; command -v python3'], network_mode="none", detach=True
    )
    try:
        rc = c.wait(timeout=120)["StatusCode"]
        out = c.logs().decode(errors="replace").split()
    finally:
        c.remove(force=True)
    assert rc == 0 and out[-2:] == [want, want.split(":")[0] + "/python3"], out


# --------------------------------------------------------------------------- 11: AIPerf in the serving images


def test_each_serving_image_holds_the_pinned_aiperf_in_its_own_venv(recipes, lock):
    """vllm and sglang install the lock's aiperf-wheels set (AIPerf 0.10.0's closure for the chain's CPython 3.11)
    into /opt/aiperf, apart from the engine's /opt/venv, and name it REPROSTACK_AIPERF_VENV, where the serving gate's
    aiperftool takes a prebuilt venv from."""
    from reprostack.gates import aiperftool

    aiperf = lock.get("aiperf-wheels")
    assert aiperf.python_version == lock.get("substrate-wheels-cp311").python_version
    assert {f.sha256 for f in aiperf.files if f.name == "aiperf"} == {f.sha256 for f in lock.get("aiperf").files}
    for name in SERVING:
        assert "aiperf-wheels" in [w.pin for w in recipes[name].wheels], name
        text = rendered(recipes, lock, name)
        assert "/opt/reprostack/bin/install-aiperf.sh /opt/reprostack/wheels/aiperf /opt/aiperf" in text
        assert image_env(recipes, lock, name)[aiperftool.VENV_ENV] == "/opt/aiperf"


def test_the_install_writes_the_marker_the_gate_accepts(tmp_path, lock, monkeypatch):
    """install-aiperf.sh's marker line, as the shell writes it for the lock's aiperf wheel, is one aiperftool's
    prebuilt-venv reader accepts (a venv without it is a GateError: test_gate_container)."""
    from reprostack.gates import aiperftool

    pin = lock.get("aiperf")
    script = (REPO / "containers" / "substrate" / "install-aiperf.sh").read_text()
    fmt = next(ln for ln in script.splitlines() if ln.startswith('printf \'{"version"'))
    venv = tmp_path / "aiperf"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "aiperf").write_text("#!/bin/sh\n")
    sh = fmt.replace('"$ver"', pin.version).replace('"$sha"', pin.files[0].sha256)
    sh = sh.replace('"$(basename "$1")"', pin.files[0].filename).replace('"$venv', f'"{venv}')
    subprocess.run(["sh", "-c", sh], check=True)
    monkeypatch.setenv(aiperftool.VENV_ENV, str(venv))
    tool = aiperftool.ensure_aiperf(lock, tmp_path / "cache", REPO)
    assert (tool.venv, tool.version, tool.sha256) == (venv, "0.10.0", pin.files[0].sha256)


@pytest.mark.parametrize("name", SERVING)
def test_in_the_built_serving_image_the_gate_finds_its_aiperf(docker_client, lock, name):
    """In the image `nox -s images` built, with only the image's env and reprostack's code mounted (as `gate G
    --container` runs it): the serving gate's aiperftool returns /opt/aiperf's AIPerf 0.10.0, never building one."""
    image = chain_image(docker_client, name)
    probe = (
        "from pathlib import Path; from reprostack.lock import load; from reprostack.gates.aiperftool import "
        "ensure_aiperf; t = ensure_aiperf(load('/workspace/upstreams.lock'), Path('/tmp/cache'), Path('/workspace')); "
        "print(t.exe, t.version)"
    )
    c = docker_client.containers.run(
        image,
        ["sh", "-c", f'python3 -c "{probe}" && /opt/aiperf/bin/aiperf --help > /dev/null'],
        environment={"PYTHONPATH": slurm.CODE},
        network_mode="none",
        volumes={
            str(REPO / "src" / "reprostack"): {"bind": f"{slurm.CODE}/reprostack", "mode": "ro"},
            str(REPO): {"bind": "/workspace", "mode": "ro"},  # the project, as the launchers mount it
        },
        detach=True,
    )
    try:
        rc = c.wait(timeout=600)["StatusCode"]
        out = c.logs().decode(errors="replace")
    finally:
        c.remove(force=True)
    assert rc == 0 and out.splitlines()[0] == "/opt/aiperf/bin/aiperf 0.10.0", out
