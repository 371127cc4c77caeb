"""The pyxis rehearsal in CI (issue 37): real enroot + pyxis, built from their pins in upstreams.lock
(tests/enrootpyxis.py), loaded by the two-slurmd Slurm of .ci/slurm-up (its plugstack.conf), run an image made here
(containers/gate-selftest on the Debian test base, plus the two variables NVIDIA's CUDA images set for the driver
hook, NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=compute,utility) pushed to the loopback registry:

- `srun --container-image=127.0.0.1:PORT/REPO@sha256:DIGEST` on both nodes: enroot imports by digest, enroot's own
  98-nvidia.sh asks the recording nvidia-container-cli (tests/standins) for the devices and capabilities the image
  names, and the stub libcuda it mounts answers dlopen("libcuda.so.1") inside the container;
- the enroot 3.x path (HyperPod ships enroot 3.4.1, which has no digest form): the rendered
  `launch slurm micro --runtime pyxis --image REF --enroot-import DIR` (each node imports the image by digest into
  DIR/<hex>.sqsh once, then `--container-image=` that file): the plan's own srun line reaches the gate's ranks on
  both nodes (the GPU stand-in, never evidence: exit 3, `PASS (GPU stand-in, not evidence)`), and its preflight step
  runs `reprostack preflight` inside the image on both nodes, which fails on what this host lacks (GPUs, EFA),
  never on the image or the lock.

The REAL images (deepep, an engine image) through the same path: scripts/rehearse_pyxis.py, transcript under
results/rehearsal/ (they take ~20 min to build, too long for CI). `.ci/run` installs enroot + pyxis and sets
REPROSTACK_REQUIRE_PYXIS, so their absence fails here instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

import dockerd
import enrootpyxis
import registry as registry_mod
from reprostack import cli
from reprostack.cluster.preflight import NODE_CHECKS
from reprostack.gates.standin import ENV
from test_gate_container import gate_image, lock  # noqa: F401 (fixtures)
from test_rehearsal import (
    batch_log,
    contract_files,
    free_port,
    job_end,
    only_node0_wrote_reports,
    passed_as_stand_in,
    slurm_alone,  # noqa: F401 (fixture)
    slurm_two_nodes,  # noqa: F401 (fixture)
)

docker_client, debian_base = dockerd.docker_client, dockerd.debian_base
registry = registry_mod.registry
REPO = Path(__file__).resolve().parents[1]
REQUIRE_ENV = "REPROSTACK_REQUIRE_PYXIS"
NVIDIA_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
GDRDRV = "/dev/gdrdrv"
NODES = ("n1", "n2")  # .ci/slurm-up's node names
HARDWARE_CHECKS = {"gpus", "efa", "provider", "smoke", *NODE_CHECKS}  # what a host without GPUs and EFA fails


def _unavailable(why: str):
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def pyxis_built(slurm_alone):
    """enroot + pyxis of the lock's pins installed (before any image is built or pushed for them)."""
    why = enrootpyxis.why_not()
    if why:
        _unavailable(why)
    return enrootpyxis.installed()


@pytest.fixture
def pyxis(pyxis_built, slurm_two_nodes):  # noqa: F811
    p = subprocess.run(["srun", "--help"], capture_output=True, text=True)
    if "--container-image" not in p.stdout:
        _unavailable("srun has no --container-image: pyxis is not in the plugstack.conf (.ci/slurm-up writes it)")
    before = {n: _containers(n) for n in NODES}
    yield pyxis_built
    for n in NODES:  # a step srun --kill-on-bad-exit ended leaves its container behind (pyxis's cleanup is cut short)
        for c in _containers(n) - before[n]:
            subprocess.run(["enroot", "remove", "-f", c], env=enrootpyxis.node_env(n), capture_output=True)


def _containers(node: str) -> set[str]:
    """pyxis's containers in `node`'s enroot data path (tests/enrootpyxis.py: one per node)."""
    p = subprocess.run(["enroot", "list"], env=enrootpyxis.node_env(node), capture_output=True, text=True)
    return {c for c in p.stdout.split() if c.startswith("pyxis_")}


@pytest.fixture(scope="module")
def image_ref(pyxis_built, docker_client, gate_image, registry, tmp_path_factory):  # noqa: F811
    """The gate image plus NVIDIA's two variables and the plan's workdir (pyxis's --container-workdir must exist: the
    real images have it, the gate image not), pushed: `127.0.0.1:PORT/reprostack-test/pyxis@sha256:...`."""
    text = render(tmp_path_factory.mktemp("plan") / "out", "--image", "x@sha256:" + "0" * 64).read_text()
    (workdir,) = set(re.findall(r"--container-workdir=(\S+)", text))
    env = f"WORKDIR {workdir}\n" + "".join(f"ENV {k}={v}\n" for k, v in NVIDIA_ENV.items())
    repo = f"{registry.host}/reprostack-test/pyxis"
    img, _ = docker_client.images.build(fileobj=_bytes(f"FROM {gate_image.image_id}\n{env}"), tag=f"{repo}:1", rm=True)
    errors = [e for e in docker_client.images.push(repo, tag="1", stream=True, decode=True) if "error" in e]
    assert not errors, errors
    (digest,) = [d for d in docker_client.images.get(f"{repo}:1").attrs["RepoDigests"] if d.startswith(repo + "@")]
    yield digest
    docker_client.images.remove(f"{repo}:1")


def _bytes(text: str):
    import io

    return io.BytesIO(text.encode())


def srun(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        cwd=REPO,
    )


PROBE = (
    "import ctypes, json, os; cuda = ctypes.CDLL('libcuda.so.1'); "
    "print(json.dumps({'node': os.environ['SLURM_NODEID'], 'cuInit': cuda.cuInit(0), "
    "'nvidia': {k: v for k, v in os.environ.items() if k.startswith('NVIDIA_')}}))"
)


def test_pyxis_runs_the_image_by_digest_on_both_nodes_and_asks_for_the_driver(pyxis, image_ref, tmp_path):
    record = tmp_path / "nvidia-container-cli.jsonl"
    p = srun(f"--container-image={image_ref}", "python3", "-c", PROBE, env={"RS_NVIDIA_RECORD": str(record)})
    assert p.returncode == 0, p.stderr[-3000:]
    rows = sorted((json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")), key=lambda r: r["node"])
    assert [r["node"] for r in rows] == ["0", "1"], p.stdout
    for r in rows:  # the stub libcuda answers as a driver with no GPU does; the image's variables are there
        assert r["cuInit"] == 100 and r["nvidia"] == NVIDIA_ENV, r
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(c["slurmd_nodename"] for c in calls) == ["n1", "n2"], calls  # once per node, from enroot's hook
    for c in calls:
        argv = c["argv"]
        assert argv[:2] == ["--user", "configure"] and {
            "--no-cgroups",
            "--device=all",
            "--compute",
            "--utility",
        } <= set(argv), argv
        assert any(a.startswith("--ldconfig=@") for a in argv) and argv[-1].startswith("/"), argv  # then the rootfs
        assert c["env"] == NVIDIA_ENV, c


def render(out: Path, *extra: str) -> Path:
    argv = ["launch", "slurm", "micro", "--nodes", "2", "--runtime", "pyxis", "--out", str(out)]
    assert cli.main([*argv, "--master-port", str(free_port()), *extra]) == 0
    return out / "job.sbatch"


def sbatch(script: Path, env: dict) -> str:
    """As test_rehearsal.sbatch: the rendered script as it is, `--gpus-per-node=0` for nodes with no GPUs."""
    p = subprocess.run(
        ["sbatch", "--parsable", "--gpus-per-node=0", str(script)],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def import_dir(tmp_path_factory):
    """Where `--enroot-import DIR` keeps the .sqsh of each digest: shared by the tests below (the first job imports,
    the next one finds the file)."""
    return tmp_path_factory.mktemp("enroot-import")


@pytest.fixture(scope="module")
def gdrdrv():
    """The rendered pyxis steps mount /dev/gdrdrv (GIN on EFA); this host has no GDRCopy driver: a character device
    standing in (/dev/zero's numbers, as tests/podrun.py does for the pods) where the path does not exist."""
    made = not os.path.lexists(GDRDRV)
    if made:
        os.mknod(GDRDRV, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    yield GDRDRV
    if made:
        os.unlink(GDRDRV)


def test_the_rendered_pyxis_launch_reaches_the_gates_ranks(pyxis, image_ref, import_dir, gdrdrv, tmp_path):
    """The rendered script of the enroot 3.x path (`--enroot-import DIR`: every node imports the image by digest into
    DIR/<hex>.sqsh once, then `--container-image=` that file, as on HyperPod's enroot 3.4.1) reaches every rank of
    both nodes."""
    out = tmp_path / "out"
    script = render(out, "--image", image_ref, "--enroot-import", str(import_dir), "--no-preflight")
    assert '--container-image="${IMAGE}"' in script.read_text()
    rc = job_end(sbatch(script, {ENV: "h200,rdzv=120", "RS_NVIDIA_RECORD": str(tmp_path / "nv.jsonl")}), 900)
    assert rc == 3, batch_log(out)[-4000:]  # the stand-in's PASS is never evidence
    passed_as_stand_in(out)
    only_node0_wrote_reports(out)
    contract_files(out)
    assert [p.name for p in import_dir.iterdir()] == [image_ref.split("sha256:")[1] + ".sqsh"]  # one file, by digest


def test_preflight_runs_inside_the_image_under_pyxis_and_fails_on_the_missing_hardware(
    pyxis, image_ref, import_dir, gdrdrv, tmp_path
):
    out = tmp_path / "out"
    script = render(out, "--image", image_ref, "--enroot-import", str(import_dir))
    rc = job_end(sbatch(script, {"RS_NVIDIA_RECORD": str(tmp_path / "nv.jsonl")}), 900)
    verdict_file = out / "preflight" / "verdict.json"
    assert verdict_file.is_file(), batch_log(out)[-4000:]
    verdict = json.loads(verdict_file.read_text())
    assert rc == 2, (rc, batch_log(out)[-3000:])  # preflight's failure ends the job before the gate
    assert not (out / "micro.json").exists()
    assert verdict["result"] == "fail" and verdict["nodes"] == 2, verdict
    failed = {r["check"] for r in verdict["failures"]}
    assert failed and failed <= HARDWARE_CHECKS, verdict["failures"]  # what this host lacks, never lock or image
    for n in (0, 1):
        facts = json.loads((out / "preflight" / f"node-{n}.json").read_text())
        assert facts["node"] == n, facts
