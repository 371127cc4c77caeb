"""The two-node rehearsal (issue 25 item 2): the real rendered launchers of gate micro's 2 x p5en profile
(p5en-efa-ep16, EP16) run as two nodes here, each node's 8 ranks played by the GPU stand-in (tests/standins/gpu.py: the
plan's own torchrun line replayed per rank from a real H200 run, the campaign's p5en NCCL lines, a rendezvous at the
rendered master address), never evidence (exit 3, `PASS (GPU stand-in, not evidence)`).

- Slurm: `reprostack launch slurm micro --nodes 2 --runtime host` submitted to the local Slurm of .ci/slurm-up (two
  slurmd: n1, n2), the stand-in asked for through the submitter's environment (sbatch passes it to every task);
- Kubernetes: `reprostack launch k8s micro` (the Indexed Job + headless Service; also the pod-network variant),
  its pods run as containers on the local Docker engine by tests/podrun.py from the manifests alone.

Cases, each on both: every rank present -> one report, node 0's, PASS (stand-in); a worker that fails -> ERROR naming
node 1, its exit and its log; a worker that never starts -> node 0 waits (bounded) and reports ERROR naming node 1; the
time-limit signal (Slurm: the steps' SIGTERM that `#SBATCH --signal` sends; Kubernetes: the kubelet's SIGTERM) ->
a report is still written, ERROR naming the signal. `.ci/run` runs it (REPROSTACK_REQUIRE_SLURM and
REPROSTACK_REQUIRE_DOCKER make a missing Slurm or engine a failure, never a skip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import dockerd
import podrun
from reprostack import cli
from reprostack.gates.standin import ENV, NOTE
from reprostack.launch.torchrun import free_port  # noqa: F401 (test_rehearsal_pyxis imports it from here)
from test_gate_container import gate_image, lock  # noqa: F401 (fixtures)
from test_launch_slurm import _slurm_up

docker_client, test_base, debian_base = dockerd.docker_client, dockerd.test_base, dockerd.debian_base
REPO = Path(__file__).resolve().parents[1]
DIGEST = "registry.invalid/reprostack/deepep@sha256:" + "0" * 64  # rendered; the pods run the local gate image
RANKS = 16


def report_of(out: Path) -> dict:
    return json.loads((out / "micro.json").read_text())


def only_node0_wrote_reports(out: Path) -> None:
    """Reports exist once, in the out folder (node 0's), never in a worker's place."""
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name in ("micro.json", "summary.json"))
    assert written == ["micro.json", "summary.json"], written
    assert not list(out.rglob("junit.xml"))[1:], "a second junit.xml"


def contract_files(out: Path, nodes=(0, 1)) -> None:
    for n in nodes:
        assert (out / "logs" / f"node-{n}.log").is_file(), f"node {n}'s node log"
        assert (out / "logs" / f"node-{n}.rc").is_file(), f"node {n}'s rc"
        assert (out / "micro" / f"test_ep.node{n}.log").is_file(), f"node {n}'s rank log"


def passed_as_stand_in(out: Path) -> None:
    rep = report_of(out)
    assert (rep["result"], rep["evidence"], rep["profile"]) == ("pass", False, "p5en-efa-ep16"), rep["reason"]
    assert rep["reason"].startswith(NOTE) and rep["provenance"]["stand_in"]["recording"] == "h200"
    assert rep["data"]["trials"]["complete"] and not rep["data"]["trials"]["problems"]
    ranks = {r for t in rep["data"]["trials"]["per_trial"] for p in t["deepep"]["phases_us"].values() for r in [p["n"]]}
    assert ranks == {RANKS}, ranks  # every phase of every trial from all 16 ranks, both nodes
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gates"][0]["label"] == "PASS (GPU stand-in, not evidence)" and summary["exit_code"] == 3


# --------------------------------------------------------------------------- Slurm


SLURM_TESTS_LOCK = Path("/tmp/rs-slurm-tests.lock")


@pytest.fixture(scope="module")
def slurm_alone():
    """One test module at a time submits jobs to the local two-node Slurm: the pyxis rehearsal's containers and the
    host-mode rehearsal's jobs share its two slurmd and the host's enroot paths (a pyxis job on the other xdist
    worker lost its container's /dev and /out mid-run in a fresh-clone .ci/run, while each file passes alone).
    An flock across the xdist workers (reprostack.fetch.cache.flocked); held for the module."""
    from reprostack.fetch.cache import flocked

    with flocked(SLURM_TESTS_LOCK):
        yield


@pytest.fixture
def slurm_two_nodes(slurm_alone):
    why = _slurm_up()
    if why and os.environ.get("REPROSTACK_REQUIRE_SLURM"):
        pytest.fail(f"REPROSTACK_REQUIRE_SLURM is set but {why}")
    if why:
        pytest.skip(why)
    names = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    if len(set(names)) < 2 and os.environ.get("REPROSTACK_REQUIRE_SLURM"):
        pytest.fail("REPROSTACK_REQUIRE_SLURM is set but this Slurm has one node name: the rehearsal needs two")
    if len(set(names)) < 2:
        pytest.skip("this Slurm has one node name (.ci/slurm-up falls back to one when two slurmd cannot run)")


def render_slurm(out: Path) -> Path:
    rc = cli.main(
        [
            "launch",
            "slurm",
            "micro",
            "--nodes",
            "2",
            "--runtime",
            "host",
            "--no-preflight",  # preflight checks the real GPUs and EFA devices; the stand-in has none to show it
            "--out",
            str(out),
            "--master-port",
            str(free_port()),
        ]
    )
    assert rc == 0
    return out / "job.sbatch"


def sbatch(script: Path, env: dict) -> str:
    """Submit the rendered script as it is; on the command line only what this cluster lacks: its nodes have no
    GPUs to give (`#SBATCH --gpus-per-node=8` would be refused), so `--gpus-per-node=0` overrides that line."""
    p = subprocess.run(
        ["sbatch", "--parsable", "--gpus-per-node=0", str(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def job_end(job: str, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        p = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
        f = dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)
        if f.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return int(f["ExitCode"].split(":")[0])
        time.sleep(0.5)
    subprocess.run(["scancel", job])
    raise AssertionError(f"job {job} still running after {timeout_s} s")


def job_env(tmp_path: Path, standin: str, *, python: str | None = None) -> dict:
    return {**os.environ, ENV: standin, "REPROSTACK_PYTHON": python or sys.executable}


def batch_log(out: Path) -> str:
    return "".join(p.read_text() for p in (out / "logs").glob("batch-*.log"))


def test_slurm_every_rank_present_gives_one_report_from_node_0(slurm_two_nodes, tmp_path):
    out = tmp_path / "out"
    script = render_slurm(out)
    t0 = time.monotonic()
    rc = job_end(sbatch(script, job_env(tmp_path, "h200,rdzv=30")))
    assert rc == 3, batch_log(out)  # a stand-in PASS is never evidence: exit 3, like local-test
    passed_as_stand_in(out)
    only_node0_wrote_reports(out)
    contract_files(out)
    assert (out / "logs" / "node-1.rc").read_text().split()[0] == "0"
    assert "the verdict is node 0's" in (out / "logs" / "node-1.log").read_text()
    assert time.monotonic() - t0 < 90


def test_slurm_a_worker_that_fails_is_named_with_its_rc_and_log(slurm_two_nodes, tmp_path):
    out = tmp_path / "out"
    rc = job_end(sbatch(render_slurm(out), job_env(tmp_path, "h200,fail-node=1,rdzv=30,wait=30")))
    rep = report_of(out)
    assert rc == 1 and rep["result"] == "error", (rc, rep["reason"])
    assert "node 1" in rep["reason"] and "exit 1" in rep["reason"] and "logs/node-1.log" in rep["reason"]
    assert rep["reason"].startswith(NOTE)
    only_node0_wrote_reports(out)


def test_slurm_a_worker_that_never_starts_is_an_error_after_a_bounded_wait(slurm_two_nodes, tmp_path):
    """Node 1's agent never starts (its python hangs before it: an image that never comes up); node 0's ranks
    time out at the rendezvous, node 0 waits a bounded time for node 1's rc and reports ERROR naming it; node 0's
    failure ends the step (srun --kill-on-bad-exit), so the job does not sit until its time limit."""
    out = tmp_path / "out"
    hang = tmp_path / "python"
    hang.write_text(f'#!/bin/sh\n[ "$SLURM_NODEID" = 1 ] && exec sleep 600\nexec {sys.executable} "$@"\n')
    hang.chmod(0o755)
    t0 = time.monotonic()
    rc = job_end(sbatch(render_slurm(out), job_env(tmp_path, "h200,rdzv=4,wait=3", python=str(hang))))
    rep = report_of(out)
    assert rc == 1 and rep["result"] == "error", (rc, rep["reason"])
    assert "node 1" in rep["reason"] and "no rc" in rep["reason"], rep["reason"]
    assert time.monotonic() - t0 < 60
    only_node0_wrote_reports(out)


def test_slurm_the_time_limit_signal_still_writes_a_report(slurm_two_nodes, tmp_path):
    out = tmp_path / "out"
    script = render_slurm(out)
    assert "#SBATCH --signal=TERM@" in script.read_text()  # the time limit's warning reaches the steps' tasks
    job = sbatch(script, job_env(tmp_path, "h200,hang,rdzv=30"))
    log0 = out / "micro" / "test_ep.node0.log"
    deadline = time.monotonic() + 60
    while not (log0.is_file() and "hanging after trial" in log0.read_text()):
        assert time.monotonic() < deadline, batch_log(out)
        time.sleep(0.3)
    # what Slurm does at --signal's time: the signal to every task of the job's steps (not the batch shell)
    subprocess.run(["scancel", "--signal=TERM", job], check=True)
    rc = job_end(job)
    rep = report_of(out)
    assert rc == 1 and rep["result"] == "error", (rc, rep.get("reason"))
    assert "SIGTERM" in rep["reason"], rep["reason"]
    only_node0_wrote_reports(out)


# --------------------------------------------------------------------------- Kubernetes pods on Docker


def render_k8s(tmp_path: Path, out: Path, *extra: str) -> tuple[dict, dict | None]:
    mdir = tmp_path / "manifests"
    rc = cli.main(
        [
            "launch",
            "k8s",
            "micro",
            "--out",
            str(mdir),
            "--image",
            DIGEST,
            "--out-hostpath",
            str(out),
            "--host-path",
            f"project={REPO}",
            "--no-preflight",
            "--master-port",
            str(free_port()),
            *extra,
        ]
    )
    assert rc == 0
    job = yaml.safe_load((mdir / "job.yaml").read_text())
    svc = yaml.safe_load((mdir / "service.yaml").read_text())
    return job, svc


def run_pods(docker_client, gate_image, job, svc, standin: str, indexes=None) -> podrun.Pods:
    return podrun.run_job(
        docker_client,
        job,
        svc,
        image=gate_image.image_id,
        pvcs={},
        indexes=indexes,
        extra_env={ENV: standin},
        stand_in_devices={"/dev/gdrdrv": "/dev/zero"},  # the p5en pod maps GDRCopy's device; none on a CPU machine
    )


@pytest.mark.parametrize("variant", [(), ("--pod-network",)], ids=["host-network", "pod-network"])
def test_k8s_every_rank_present_gives_one_report_from_node_0(docker_client, gate_image, tmp_path, variant):
    out = tmp_path / "out"
    out.mkdir()
    job, svc = render_k8s(tmp_path, out, *variant)
    pods = run_pods(docker_client, gate_image, job, svc, "h200,rdzv=30")
    try:
        codes = pods.wait(120)
        assert codes == {0: 3, 1: 0}, (codes, pods.logs(0)[-3000:], pods.logs(1)[-3000:])
    finally:
        pods.remove()
    passed_as_stand_in(out)
    only_node0_wrote_reports(out)
    contract_files(out)


def test_k8s_a_worker_that_fails_is_named(docker_client, gate_image, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job, svc = render_k8s(tmp_path, out)
    pods = run_pods(docker_client, gate_image, job, svc, "h200,fail-node=1,rdzv=30,wait=30")
    try:
        codes = pods.run_policy(job, timeout_s=120)  # the Job's podFailurePolicy, as its controller applies it
    finally:
        pods.remove()
    rep = report_of(out)
    assert codes[1] == 1 and rep["result"] == "error", (codes, rep["reason"])
    assert "node 1" in rep["reason"] and "exit 1" in rep["reason"] and "logs/node-1.log" in rep["reason"]
    only_node0_wrote_reports(out)


def test_k8s_a_worker_that_never_starts_is_an_error_after_a_bounded_wait(docker_client, gate_image, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job, svc = render_k8s(tmp_path, out)
    pods = run_pods(docker_client, gate_image, job, svc, "h200,rdzv=4,wait=3", indexes=[0])  # pod 1 never scheduled
    try:
        codes = pods.wait(90)
    finally:
        pods.remove()
    rep = report_of(out)
    assert codes == {0: 1} and rep["result"] == "error", (codes, rep["reason"])
    assert "node 1" in rep["reason"] and "no rc" in rep["reason"], rep["reason"]
    only_node0_wrote_reports(out)


def test_k8s_termination_still_writes_a_report(docker_client, gate_image, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job, svc = render_k8s(tmp_path, out)
    spec = job["spec"]
    # the time limit runs inside the container (image pull does not count): the Job's own deadline is only a backstop
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 30
    pods = run_pods(docker_client, gate_image, job, svc, "h200,hang,rdzv=30")
    try:
        log0 = out / "micro" / "test_ep.node0.log"
        deadline = time.monotonic() + 60
        while not (log0.is_file() and "hanging after trial" in log0.read_text()):
            assert time.monotonic() < deadline, pods.logs(0)[-3000:]
            time.sleep(0.3)
        for i in (1, 0):  # what the kubelet does to the pods of a Job past its deadline: SIGTERM, then the grace
            pods.stop(i)
        codes = pods.wait(60)
    finally:
        pods.remove()
    rep = report_of(out)
    assert rep["result"] == "error" and "SIGTERM" in rep["reason"], (codes, rep["reason"])
    only_node0_wrote_reports(out)
