"""`reprostack launch slurm` (reprostack.cluster.slurm): a gate's launch plan as one sbatch script.

Pure rendering (no Slurm): every runtime's script parses (`bash -n`), carries the plan's nodes, GPUs, time, env,
mounts and image, takes the rendezvous from SLURM_*; hostile values from a spec are refused with one line or
survive as literals; the committed examples under docs/examples/slurm/ are exactly what rendering gives today.
On a real Slurm (`.ci/slurm-up`, started by `.ci/run`; skipped when no controller answers): the serving gate's
local-test profile (the test server with two ranks + the pinned AIPerf) submitted with --submit, followed to its
end, its report and per-node logs checked.

Regenerate the examples after a deliberate change: REPROSTACK_UPDATE_EXAMPLES=1 pytest tests/test_launch_slurm.py
"""

from __future__ import annotations

import json
import re
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from reprostack import cli
from reprostack.gates import profiles, registry
from reprostack.gates.registry import GATE_ORDER
from reprostack.gates.spec import GateSpecError
from reprostack.cluster import slurm, slurm_submit
from reprostack.lock import load
from test_gate_serving import TOOLS, small_root

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples" / "slurm"


@pytest.fixture(scope="module")
def lock():
    return load(REPO / "upstreams.lock")


def render(gate, lock, root=REPO, **kw):
    kw.setdefault("nodes", 2)
    kw.setdefault("out", f"out/slurm/{gate}")
    return slurm.script_for(registry.gate(gate), root, lock, images_json=Path(os.devnull), **kw)


def bash_n(text: str, tmp_path: Path) -> None:
    p = tmp_path / "job.sbatch"
    p.write_text(text)
    r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("runtime", slurm.RUNTIMES)
def test_every_runtime_renders_a_script_bash_parses(runtime, lock, tmp_path):
    image = "reprostack/deepep:0123456789abcdef" if runtime == "docker" else None  # docker needs a known image
    text = render("micro", lock, runtime=runtime, partition="p5en", image=image)
    bash_n(text, tmp_path)
    head = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert head[:4] == [
        "#SBATCH --job-name=rs-micro",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
    ]
    assert "#SBATCH --partition=p5en" in head and "#SBATCH --gpus-per-node=8" in head
    assert "#SBATCH --time=0-00:30:00" in head  # micro's 1200 s watchdog + the container slack, in minutes
    assert 'MASTER_NODE=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)' in text
    assert '--node-rank "${SLURM_NODEID}"' in text and '--master-addr "${MASTER_ADDR}"' in text
    assert "export NCCL_GIN_TYPE=2" in text and "export FI_PROVIDER=efa" in text  # the campaign's env
    assert text.count("srun ") == 2 and "reprostack preflight micro" in text  # preflight first, then the gate
    assert text.index("reprostack preflight") < text.index("reprostack gate micro")
    assert ("HOST MODE" in text) == (runtime == "host")
    if runtime == "pyxis":
        assert '--container-image="${IMAGE}"' in text and '"${OUT}":/out,"${PROJECT}":/workspace:ro' in text
    if runtime == "docker":
        assert "docker run --rm" in text and "--ulimit memlock=-1:-1" in text and "--gpus all" in text


@pytest.mark.parametrize("runtime", ["pyxis", "enroot", "docker"])
def test_a_plan_with_efa_maps_the_gdrcopy_device_in_every_runtime(runtime, lock, tmp_path):
    """issue 37 item 5: GIN on EFA opens /dev/gdrdrv inside the container; no runtime maps it by itself. Each
    container runtime's task maps it for the p5en (EFA) profile, in both steps (the preflight opens it); a CPU profile
    without EFA maps nothing."""
    image = "reprostack/deepep:0123456789abcdef" if runtime == "docker" else None
    text = render("micro", lock, runtime=runtime, image=image)
    bash_n(text, tmp_path)
    tasks = [x for x in text.splitlines() if x.startswith("  --container-image") or x.startswith("  bash -c ")]
    assert len(tasks) == 2  # the preflight's task and the gate's
    for task in tasks:
        words = shlex.split(task)
        if runtime == "pyxis":
            mounts = next(w for w in words if w.startswith("--container-mounts=")).split("=", 1)[1].split(",")
            assert "/dev/gdrdrv:/dev/gdrdrv" in mounts
        else:
            inner = shlex.split(words[2])  # `bash -c RUN`: the runtime's command line as bash reads it
            run = " ".join(inner)
            want = "--mount /dev/gdrdrv:/dev/gdrdrv" if runtime == "enroot" else "efa+=(--device=/dev/gdrdrv)"
            assert want in run, run
    cpu = render("vllm", lock, nodes=1, profile="local-test", runtime=runtime, image=image)
    assert "gdrdrv" not in cpu


DIGEST_REF = "123456789012.dkr.ecr.us-east-1.amazonaws.com/reprostack/deepep@sha256:" + "ab" * 32
# enroot's docker:// grammar before 4.0, as NVIDIA/enroot v3.4.1 doc/cmd/import.md states it
# (`docker://[USER@][REGISTRY#]IMAGE[:TAG]`) with the classes of its src/docker.sh: REGISTRY any but `#`, IMAGE
# lowercase/digits/`/._-`, TAG alnum and `._:-`, USER its URI characters without `/` (so a digest can only be a
# `sha256:HEX` tag, never `@sha256:`)
ENROOT3_URI = re.compile(
    r"^docker://(([A-Za-z0-9_.!~*'()%;:&=+$,@-]+)@)?(([^#]+)#)?([a-z0-9/._-]+)(:([A-Za-z0-9._:-]+))?$"
)


def _import_task(text: str) -> str:
    line = next(x for x in text.splitlines() if x.startswith("srun ") and "import-node-%n.log" in x)
    words = shlex.split(line.removesuffix("\\"))  # the line goes on with `|| { ... }`
    return words[words.index("bash") + 2]


def test_enroot_import_is_the_enroot_3_path_by_digest(lock, tmp_path):
    """issue 37 item 6: `--container-image=REPO@sha256:` needs enroot >= 4, HyperPod ships 3.4.1. With --enroot-import
    DIR every node first imports the image by its digest into DIR/<hex>.sqsh through a URI enroot 3.x parses
    (docker://REGISTRY#IMAGE:sha256:HEX), then every step runs that file; the step's task imports once per file
    (a stand-in enroot records its calls and writes the -o file) and a failed import is one line, exit 2."""
    text = render("micro", lock, image=DIGEST_REF, enroot_import="/fsx/enroot")
    bash_n(text, tmp_path)
    hexd = "ab" * 32
    assert f"export SQSH=/fsx/enroot/{hexd}.sqsh" in text.splitlines()
    uri = next(x for x in text.splitlines() if x.startswith("export IMAGE_URI=")).split("=", 1)[1]
    uri = shlex.split(uri)[0]
    assert uri == f"docker://123456789012.dkr.ecr.us-east-1.amazonaws.com#reprostack/deepep:sha256:{hexd}"
    assert ENROOT3_URI.match(uri) and not ENROOT3_URI.match("docker://" + DIGEST_REF)  # 3.x refuses @sha256:
    assert text.index("import-node-%n.log") < text.index("reprostack preflight") < text.index("reprostack gate")
    assert 'export IMAGE="${SQSH}"' in text and f"export IMAGE={DIGEST_REF}" not in text
    assert text.count('--container-image="${IMAGE}"') == 2
    # the task, as each node runs it: one import per file, a rename that never overwrites
    task = _import_task(text)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "enroot.calls"
    (bin_ / "enroot").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = import ] && [ "$2" = -o ] && echo sqsh > "$3"\n'
    )
    (bin_ / "enroot").chmod(0o755)
    sqsh = tmp_path / "shared" / f"{hexd}.sqsh"
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "SQSH": str(sqsh), "IMAGE_URI": uri}
    for node in ("0", "1"):
        r = subprocess.run(["bash", "-c", task], env={**env, "SLURM_NODEID": node}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert calls.read_text().split("\n")[:-1] == [
        f"import -o {sqsh}.node0.{calls.read_text().split('.node0.')[1].split()[0]} {uri}"
    ]
    assert sqsh.read_text() == "sqsh\n" and sorted(p.name for p in sqsh.parent.iterdir()) == [sqsh.name]
    sqsh.unlink()
    (bin_ / "enroot").write_text("#!/bin/sh\necho '[ERROR] Invalid image reference' >&2\nexit 1\n")
    r = subprocess.run(["bash", "-c", task], env={**env, "SLURM_NODEID": "1"}, capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[-1].startswith(f"reprostack: node 1: enroot import {uri} into {sqsh} failed")
    assert not sqsh.exists() and list(sqsh.parent.iterdir()) == []


@pytest.mark.parametrize(
    "kw, says",
    [
        (
            {"image": "reprostack/deepep:latest"},
            "--enroot-import: image 'reprostack/deepep:latest' is not named by digest",
        ),
        ({"image": None}, "is not named by digest"),  # no repo digest in the plan (nothing pushed)
        ({"image": DIGEST_REF, "runtime": "docker"}, "--enroot-import: pyxis's path on enroot 3.x"),
        ({"image": DIGEST_REF, "enroot_import": "/fsx/a,b"}, "--enroot-import '/fsx/a,b': holds ','"),
    ],
)
def test_enroot_import_without_a_digest_or_for_another_runtime_is_one_line(lock, kw, says):
    kw = {"enroot_import": "/fsx/enroot", **kw}
    with pytest.raises(Exception) as e:
        render("micro", lock, **kw)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_enroot_import_through_the_cli_writes_the_script_or_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["launch", "slurm", "micro", "--nodes", "2", "--out", str(out), "--enroot-import", "images"]
    assert cli.main([*argv, "--image", DIGEST_REF]) == 0
    assert f'export SQSH="${{PROJECT}}"/images/{"ab" * 32}.sqsh' in (out / "job.sbatch").read_text()
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert cli.main([*argv[:6], str(bad), *argv[7:], "--image", "reprostack/deepep:latest"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not named by digest" in err[0] and not (bad / "job.sbatch").exists()


def test_no_preflight_omits_the_step(lock):
    text = render("micro", lock, preflight=False)
    assert "preflight" not in text.split("set -euo pipefail")[1] and text.count("srun ") == 1


def test_the_image_by_digest_when_known(lock, tmp_path):
    ref = "registry.example/reprostack/deepep@sha256:" + "a" * 64
    assert f"export IMAGE={ref}   # --image" in render("micro", lock, image=ref)
    summary = tmp_path / "images.json"
    summary.write_text(
        json.dumps(
            {
                "images": [
                    {"name": "deepep", "tag": "reprostack/deepep:0123456789abcdef", "image_id": "sha256:" + "b" * 64}
                ]
            }
        )
    )
    text = slurm.script_for(registry.gate("micro"), REPO, lock, nodes=2, out="o", runtime="docker", images_json=summary)
    assert "export IMAGE=sha256:" + "b" * 64 + "   # image id" in text


def test_a_cpu_profile_asks_for_no_gpus_and_host_mode_says_so(lock, tmp_path):
    text = render("vllm", lock, nodes=1, profile="local-test", runtime="host", preflight=False, cache="/c d")
    bash_n(text, tmp_path)
    assert "--gpus-per-node" not in text and "HOST MODE" in text.splitlines()[1]
    task = next(x for x in text.splitlines() if x.startswith("  bash -c "))
    inner = shlex.split(shlex.split(task)[2])  # the command each task runs, as bash reads it
    assert inner[inner.index("--cache") + 1] == "/c d"  # the operator's cache, one word


def test_nodes_must_match_the_profile_and_docker_needs_a_known_image(lock):
    with pytest.raises(slurm.SlurmRenderError, match="spans 2 node"):
        render("micro", lock, nodes=3)
    with pytest.raises(slurm.SlurmRenderError, match="image deepep is not built here"):
        render("micro", lock, runtime="docker")


def test_hostile_spec_values_are_refused_or_stay_literal(lock, tmp_path):
    root = tmp_path / "root"
    (root / "gates").mkdir(parents=True)
    for d in ("containers", "patches"):
        (root / d).symlink_to(REPO / d)
    shutil.copy(REPO / "upstreams.lock", root)
    spec = (REPO / "gates" / "micro.yaml").read_text()
    (root / "gates" / "micro.yaml").write_text(
        spec.replace('EP_EFA_RDMA_GBS: "25"', "EP_EFA_RDMA_GBS: \"25'; touch /tmp/pwned; '$(id)`x`\"")
    )
    text = render("micro", lock, root=root)
    bash_n(text, tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("export EP_EFA_RDMA_GBS="))
    got = subprocess.run(["bash", "-c", line + '; printf %s "$EP_EFA_RDMA_GBS"'], capture_output=True, text=True)
    assert got.stdout == "25'; touch /tmp/pwned; '$(id)`x`"  # a literal, nothing ran
    (root / "gates" / "micro.yaml").write_text(
        spec.replace('EP_EFA_RDMA_GBS: "25"', 'EP_EFA_RDMA_GBS: "25\\nrm -rf /"')
    )
    # refused where they are written (the gate spec's schema, since the hostile-input trial of session 4), with
    # the renderer's own checks behind it
    with pytest.raises(GateSpecError, match=r"micro.yaml:\d+: profiles.p5en-efa-ep16.env.EP_EFA_RDMA_GBS: "):
        render("micro", lock, root=root)
    (root / "gates" / "micro.yaml").write_text(spec.replace('EP_EFA_RDMA_GBS: "25"', '"X;id": "1"'))
    with pytest.raises(GateSpecError, match=r"micro.yaml:\d+: profiles.p5en-efa-ep16.env: 'X;id' does not match"):
        render("micro", lock, root=root)
    with pytest.raises(slurm.SlurmRenderError, match="env A: .*control character"):
        slurm._validate(SimpleNamespace(env=(("A", "1\nid"),), commands=()))
    with pytest.raises(slurm.SlurmRenderError, match="not a shell variable name"):
        slurm._validate(SimpleNamespace(env=(("X;id", "1"),), commands=()))


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli.main(["launch", "slurm", "micro", "--nodes", "2", "--partition", "a\nb", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--partition" in err and "control character" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--out", "out/x,/:/hostroot:rw,out/y"], "--out 'out/x,/:/hostroot:rw,out/y': holds ','"),
        (["--out", "out/a:b"], "--out 'out/a:b': holds ':'"),
        (["--out", "out/%j"], "--out 'out/%j': holds '%'"),
        (["--sqsh", "img,x.sqsh"], "--sqsh 'img,x.sqsh': holds ','"),
        (["--image", "repo/x,/:/hostroot"], "--image 'repo/x,/:/hostroot': not an image reference"),
        (["--image", "-e x"], "--image '-e x': not an image reference"),
        (["--image", "repo/x:1 --privileged"], "not an image reference"),
        (["--nodes", "1000000000"], "--nodes 1000000000"),
        (["--nodes", "1"], "--nodes 1"),
        (["--models", "/data/hf"], "--models: gate micro serves no model"),
    ],
    ids=[
        "out-comma-mount",
        "out-colon",
        "out-percent",
        "sqsh-comma",
        "image-comma",
        "image-dash",
        "image-space",
        "nodes-absurd",
        "nodes-one",
        "models-not-serving",
    ],
)
def test_launcher_input_a_consumer_splits_on_is_one_line_and_writes_nothing(tmp_path, capsys, flags, says):
    """issue 25 item 4: pyxis splits --container-mounts on ',' and ':' (the first case would mount the host's / read
    and write), `#SBATCH --output` expands '%': refused before anything is written, in one line naming the option."""
    out = tmp_path / "o"
    argv = ["launch", "slurm", "micro", "--nodes", "2", "--out", str(out), *flags]
    t = __import__("time").monotonic()
    assert cli.main(argv) == 2
    assert __import__("time").monotonic() - t < 10  # before any work
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err, err
    assert not out.exists() and not (REPO / "out" / "x,").exists()


@pytest.mark.parametrize("flags", [["--models", "/data/a,b"], ["--models", "/data/a:b"]], ids=["comma", "colon"])
def test_models_a_mount_splits_on_is_one_line(tmp_path, capsys, flags):
    out = tmp_path / "o"
    assert cli.main(["launch", "slurm", "vllm", "--nodes", "2", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--models" in err and "refused" in err, err
    assert not out.exists()


def run_prologue(script: Path, tmp_path: Path, env: dict) -> list[list[str]]:
    """The rendered script run by bash up to its sruns, on a fake srun/scontrol that record their argv (no Slurm
    here): what pyxis would be handed, after bash expanded it. Returns the srun calls."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    (bin_ / "srun").write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\037" "$a"; done >> {calls}\necho >> {calls}\n'
    )
    (bin_ / "scontrol").write_text("#!/bin/sh\necho n1\n")
    for f in ("srun", "scontrol"):
        (bin_ / f).chmod(0o755)
    base = {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_SUBMIT_DIR": str(REPO)}
    base |= {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}
    subprocess.run(["bash", str(script)], env={**base, **env}, capture_output=True, text=True, timeout=60)
    return [c.split("\037")[:-1] for c in calls.read_text().splitlines()] if calls.exists() else []


def mounts_of(call: list[str]) -> list[str]:
    return next(a for a in call if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")


def test_serving_sbatch_mounts_the_models_folder_it_names(tmp_path, capsys):
    """issue 25 item 3: the serving sbatch exported HF_HOME=/models before building its mount from HF_HOME, so
    pyxis was handed `/models:/models:ro`. Now `--models DIR`, else the submitter's HF_HOME, is the source."""
    models = tmp_path / "hf"
    models.mkdir()
    image = "registry.invalid/reprostack/vllm@sha256:" + "0" * 64
    out = tmp_path / "o"
    args = ["launch", "slurm", "vllm", "--nodes", "2", "--out", str(out), "--image", image]
    assert cli.main([*args, "--models", str(models)]) == 0
    first = run_prologue(out / "job.sbatch", tmp_path, {"HF_HOME": "/somewhere/else"})
    assert first and all(f"{models}:/models:ro" in mounts_of(c) for c in first), first
    (tmp_path / "calls").unlink()
    assert cli.main(args) == 0  # no --models: the submitter's HF_HOME, never the container's /models
    first = run_prologue(out / "job.sbatch", tmp_path, {"HF_HOME": str(models)})
    assert first and all(f"{models}:/models:ro" in mounts_of(c) for c in first), first
    assert "image: " + image in capsys.readouterr().out  # where the image comes from, said at rendering
    (tmp_path / "calls").unlink()
    assert not run_prologue(out / "job.sbatch", tmp_path, {"HF_HOME": str(tmp_path / "none")})  # no folder: no srun


def test_submit_without_sbatch_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    out = tmp_path / "o"
    assert cli.main(["launch", "slurm", "micro", "--nodes", "2", "--out", str(out), "--submit"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "reprostack: error: --submit: sbatch not found on PATH (run on a Slurm login node, or render only)"
    assert (out / "job.sbatch").is_file()  # the script was rendered; only the submission could not happen


def test_launch_slurm_without_image_says_where_the_image_will_come_from(tmp_path, capsys):
    """Issue 29 item 9: `launch slurm micro` without --image printed only the script's path; where the job's image
    would come from (an enroot squashfs that does not exist yet, made from an image not built here) was in a script
    comment alone. Now the CLI prints the script's `# image from:` line; --image and host mode say theirs."""
    out = tmp_path / "o"
    base = ["launch", "slurm", "micro", "--nodes", "2", "--profile", "p5en-efa-ep16", "--out", str(out)]
    assert cli.main(base) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "image: the enroot squashfs out/images/deepep.sqsh, which must exist before the job runs: made from image "
        "deepep with `reprostack build deepep --save` and `enroot import` (the script's comment) (image deepep is not "
        "built here: `reprostack build deepep` first); or --image REF"
    )
    assert "# image from: the enroot squashfs out/images/deepep.sqsh" in (out / "job.sbatch").read_text()
    ref = "registry.example/deepep@sha256:" + "a" * 64
    assert cli.main([*base, "--image", ref]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"image: {ref} (--image)"
    assert cli.main([*base, "--runtime", "host"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "image: none: host mode, each node's own packages (not the pinned image)"
    )


# --------------------------------------------------------------------------- committed examples


EXAMPLE_GATES = [g.name for g in registry.rendered(REPO)]


@pytest.mark.parametrize("gate", EXAMPLE_GATES)
def test_committed_example_is_what_rendering_gives(gate, lock):
    """docs/examples/slurm/<gate>.sbatch: the published 2 x p5en EP16 run (pyxis), re-rendered byte for byte."""
    text = render(gate, lock, partition="p5en")
    path = EXAMPLES / f"{gate}.sbatch"
    if os.environ.get("REPROSTACK_UPDATE_EXAMPLES"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path} is stale: REPROSTACK_UPDATE_EXAMPLES=1 pytest {__file__}"


# --------------------------------------------------------------------------- a real Slurm


def _slurm_up() -> str | None:
    """Why no Slurm answers (None: one does). SLURM_CONF from the environment or .ci/slurm-up's default."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return "no Slurm client (sbatch, scontrol): apt-get install slurm-wlm munge; .ci/slurm-up"
    conf = os.environ.get("SLURM_CONF") or "/tmp/rs-slurm/slurm.conf"
    if not Path(conf).is_file():
        return f'no slurm.conf at {conf}: start one with `eval "$(.ci/slurm-up)"`'
    os.environ.setdefault("SLURM_CONF", conf)
    r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    return None if "is UP" in r.stdout else f"no slurmctld answers ({conf}): start one with .ci/slurm-up"


def test_local_test_gate_runs_as_a_slurm_job(lock, tmp_path, monkeypatch, capsys):
    why = _slurm_up()
    if why and os.environ.get("REPROSTACK_REQUIRE_SLURM"):  # .ci/run: the job must really run
        pytest.fail(f"REPROSTACK_REQUIRE_SLURM is set but {why}")
    if why:
        pytest.skip(why)
    root = small_root(tmp_path, "vllm")  # one cell (c4) keeps the job short
    for d in ("containers", "patches"):
        (root / d).symlink_to(REPO / d)
    monkeypatch.setenv("REPROSTACK_PYTHON", os.environ.get("REPROSTACK_PYTHON") or __import__("sys").executable)
    rc = cli.main(
        [
            "launch",
            "slurm",
            "vllm",
            "--nodes",
            "1",
            "--profile",
            "local-test",
            "--runtime",
            "host",
            "--arm",
            "deepep",
            "--lock",
            str(root / "upstreams.lock"),
            "--cache",
            str(TOOLS),
            "--submit",
        ]
    )
    printed = capsys.readouterr().out
    out = root / "out" / "slurm" / "vllm"
    assert "submitted job" in printed and ": RUNNING" in printed, printed
    assert rc == 3, printed  # a local-test PASS is labelled and exits 3, in a job as on the host
    assert "vllm [local-test]: PASS (local-test, not evidence)" in printed, printed  # not just "FAILED, exit 3"
    report = json.loads((out / "vllm.json").read_text())
    assert (report["result"], report["profile"], report["evidence"]) == ("pass", "local-test", False)
    assert report["provenance"]["execution"]["mode"] == "host"
    verdict = json.loads((out / "preflight" / "verdict.json").read_text())  # the first srun step ran and passed
    assert verdict["result"] == "pass", verdict
    node0 = (out / "logs" / "node-0.log").read_text()  # the per-node log srun wrote (%n)
    assert "vllm [local-test]: PASS (local-test, not evidence)" in node0
    assert (out / "logs" / "node-0.rc").read_text().split()[0] == "3"  # `RC JOB_ID` (launch.plan.rc_text)
    batch = next((out / "logs").glob("batch-*.log")).read_text()
    assert re.search(r"gate vllm job \d+: exit 3;", batch), batch
    server = (out / "vllm" / "server.deepep.log").read_text()  # both ranks of the test server
    assert "rank EP 0/2" in server and "rank EP 1/2" in server


def test_submit_verdict_lines_read_only_this_jobs_summary(tmp_path):
    """After --submit the CLI prints the gate's verdict from the summary.json the job wrote; a missing, older or
    malformed one is one line saying there is no verdict (never a verdict the job did not write)."""
    import time
    from reprostack.cmd.launch import _slurm_verdicts
    from reprostack.report.model import GateReport, evaluate
    from reprostack.report.writers import write_reports

    p = tmp_path / "summary.json"
    assert _slurm_verdicts(p, since=0) == [f"{p}: not written (no verdict; see the logs)"]
    write_reports(
        [
            GateReport(
                "vllm",
                "local-test",
                "pass",
                "20 check(s) passed",
                [evaluate("deepep.c4.errors", "requests", 0, "==", 0)],
                evidence=False,
            )
        ],
        tmp_path,
    )
    assert _slurm_verdicts(p, since=0) == ["vllm [local-test]: PASS (local-test, not evidence) — 20 check(s) passed"]
    assert "not written by this job" in _slurm_verdicts(p, since=time.time() + 60)[0]
    p.write_text('{"gates": [{"gate": "x"}]')
    assert _slurm_verdicts(p, since=0) == [f"{p}: unreadable (JSONDecodeError; no verdict; see the logs)"]
    p.write_text('{"gates": []}')
    assert "unreadable (ValidationError" in _slurm_verdicts(p, since=0)[0]


def test_rendezvous_lines_on_a_two_node_allocation(lock, tmp_path):
    """The script's own rendezvous lines, run in a real 2-node job: every task sees the same master (the NodeAddr
    of the first node) and its own node rank 0 / 1 (needs the two node names .ci/slurm-up makes)."""
    why = _slurm_up()
    if why:
        pytest.skip(why)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    if len(set(nodes)) < 2:
        pytest.skip("this Slurm has one node name (.ci/slurm-up falls back to one when two slurmd cannot run)")
    text = render("micro", lock)
    lines = text.splitlines()
    start = lines.index(
        "# rendezvous from Slurm: the first node of the allocation is the leader (node rank = SLURM_NODEID)"
    )
    end = next(i for i, x in enumerate(lines) if x.startswith("export MASTER_PORT="))
    job = tmp_path / "rdv.sbatch"
    job.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                "#SBATCH --nodes=2 --ntasks-per-node=1 --exclusive",
                f"#SBATCH --output={tmp_path}/batch.log",
                "set -euo pipefail",
                *lines[start : end + 1],
                f"srun --output={tmp_path}/node-%n.log bash -c "
                "'echo \"rank=${SLURM_NODEID} master=${MASTER_ADDR}:${MASTER_PORT}\"'",
                "",
            ]
        )
    )
    rc = slurm_submit.submit(str(job), cwd=str(tmp_path), poll_s=0.5, echo=lambda s: None)
    assert rc == 0, (tmp_path / "batch.log").read_text()
    got = sorted((tmp_path / f"node-{n}.log").read_text().strip() for n in (0, 1))
    assert got == ["rank=0 master=127.0.0.1:29500", "rank=1 master=127.0.0.1:29500"]


@pytest.mark.parametrize("gate", EXAMPLE_GATES)
def test_every_command_the_script_runs_is_one_the_cli_takes(gate, lock):
    """The script's `reprostack preflight G` and `reprostack gate G` name the gate as the CLI knows it (nemo-rl, not
    the report name nemo_rl, which argparse refuses: the job would end in exit 2 on every node)."""
    text = render(gate, lock)
    for sub in ("preflight", "gate"):
        named = re.findall(rf"-m reprostack {sub} ([A-Za-z0-9_-]+)", text)
        assert named, f"no `reprostack {sub}` in the {gate} script"
        for n in named:
            assert n in GATE_ORDER, f"{sub} {n}"


def test_fabric_across_nodes_is_srun_mpi_pmix_one_rank_per_gpu_then_node_0_judges(lock, tmp_path):
    """Issue 37 item 9: the fabric gate's 2 x p5en profile, which the renderer refused, runs the way operators run
    nccl-tests under pyxis (awsome-distributed-training nccl-tests-container.sbatch): per test one `srun --mpi=pmix`
    step of 16 ranks (8 per node, `-g 1`) of the image's MPI build, its output and rc into the out dir, then node 0's
    in-image runner judges those files (--launched-logs)."""
    text = render("fabric", lock, partition="p5en", image="registry.example/reprostack/deepep@sha256:" + "ab" * 32)
    bash_n(text, tmp_path)
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gpus-per-node=8" in text
    steps = [ln for ln in text.splitlines() if ln.startswith("srun ") and "--mpi=pmix" in ln]
    assert len(steps) == 2 and all("--nodes=2 --ntasks-per-node=8 --mpi=pmix --cpu-bind=none" in s for s in steps)
    for test, binary in (("all_reduce", "all_reduce_perf"), ("alltoall", "alltoall_perf")):
        line = next(
            ln
            for ln in text.splitlines()
            if f"/opt/reprostack/nccl-tests/bin/{binary} " in ln and "srun" not in ln and not ln.startswith("#")
        )
        assert '--container-image="${IMAGE}"' in line and " -g 1 -N 5" in line
        assert line.endswith(f'> "${{OUT}}"/fabric-mpi/{test}.log 2>&1')
        assert f'echo "$? ${{SLURM_JOB_ID}}" > "${{OUT}}"/fabric-mpi/{test}.rc' in text
    judge = next(ln for ln in text.splitlines() if "-m reprostack gate fabric" in ln)
    assert "--launched-logs /out/fabric-mpi" in judge and '--run-id "${SLURM_JOB_ID}"' in judge
    first = text.index("srun --nodes=2 --ntasks-per-node=8 --mpi=pmix")
    assert text.index("reprostack preflight fabric") < first < text.index("--launched-logs /out")
    assert "export PMIX_MCA_gds=hash" in text and "export FI_PROVIDER=efa" in text
    # pyxis on enroot 3.x (--enroot-import): the ranks run the squashfs the import step made, by digest
    text = render(
        "fabric", lock, image="registry.example/reprostack/deepep@sha256:" + "ab" * 32, enroot_import="/fsx/e"
    )
    assert text.index('export IMAGE="${SQSH}"') < text.index("srun --nodes=2 --ntasks-per-node=8 --mpi=pmix")
    # the MPI steps need pyxis (its PMIx support): another runtime is one line, nothing written
    for runtime in ("docker", "enroot", "host"):
        with pytest.raises(slurm.SlurmRenderError, match=f"--runtime {runtime}: profile p5en-efa-ep16 .* pyxis only"):
            render("fabric", lock, runtime=runtime, image="reprostack/deepep:0123456789abcdef")
    # a one-GPU profile stays the in-image runner on one node
    text = slurm.script_for(registry.gate("fabric"), REPO, lock, nodes=1, out="out/x", profile="h200-ep1")
    assert "-m reprostack gate fabric" in text and "--mpi=pmix" not in text


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "x@sha256:" + "a" * 63,
        "x@sha256:" + "A" * 64,
        "reg.example/a@sha256:" + "a" * 64 + "\n",
        "reg.example/$(id)@sha256:" + "a" * 64,
        "reg.example/UPPER@sha256:" + "a" * 64,
        "reg.example/a:tag@sha256:" + "a" * 64,
        "-x@sha256:" + "a" * 64,
        "r/" * 5000 + "a@sha256:" + "a" * 64,
        "ünï@sha256:" + "a" * 64,
    ],
)
def test_import_uri_of_hostile_references_is_one_line_or_an_enroot_uri(ref):
    """The reader of cluster.enroot: anything but REPO@sha256:<64 hex> is one EnrootError line; what it accepts is a
    URI enroot 3.x parses, with nothing a shell would expand (every character from the reference's classes)."""
    from reprostack.cluster.enroot import EnrootError, import_uri

    try:
        uri, hexd = import_uri(ref)
    except EnrootError as e:
        assert "\n" not in str(e) and str(e).startswith("--enroot-import: ")
        return
    assert ENROOT3_URI.match(uri) and len(hexd) == 64 and not re.search(r"[$`\s;&|]", uri)


@pytest.mark.parametrize("runtime", [r for r in slurm.RUNTIMES if r != "host"])
def test_in_an_image_the_agent_takes_the_images_prebuilt_kernels(runtime, lock):
    """Found with the real deepep image under pyxis (results/rehearsal/pyxis.md): the rendered in-image runner had no
    `--kernels-manifest`, so on a cluster every node would have fetched and built DeepEP from source (compute nodes
    without internet: a fetch error) instead of taking the image's checked prebuilt kernels, as `gate G --container`
    does. Every gate that takes prebuilt kernels names the image's manifest in the Slurm script and in the Kubernetes
    manifests; host mode builds on the node, as before."""
    from reprostack.gates.container import MANIFEST

    for g in registry.rendered(REPO):
        spec = g.load(REPO)
        takes = bool(g.kernels.prebuilt(spec))
        if runtime != "pyxis" and g.launcher.mpi_launch(spec, profiles.resolve(spec)) is not None:
            continue  # a profile MPI starts renders under pyxis only
        text = render(g.name, lock, runtime=runtime, image="registry.invalid/r@sha256:" + "0" * 64)
        assert (f"--kernels-manifest {MANIFEST}" in text) is takes, (g.name, runtime)
        if runtime == "pyxis":  # the committed manifests are what rendering gives (test_launch_k8s checks)
            yamls = "".join(
                f.read_text() for f in sorted((REPO / "docs" / "examples" / "k8s").glob(f"{g.name}*/*.yaml"))
            )
            assert yamls and ("--kernels-manifest" in yamls) is takes, g.name
    host = render("micro", lock, runtime="host")
    assert "--kernels-manifest" not in host
