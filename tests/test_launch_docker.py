"""A gate node in its image through the docker SDK (reprostack.launch.docker) on a real engine, CPU only."""

import dataclasses
import resource

import pytest

import dockerd
from reprostack.launch.docker import LaunchError, run_node
from reprostack.launch.plan import ImageRef, LaunchPlan, Mount, NodeCommand

docker_client, test_base = dockerd.docker_client, dockerd.test_base  # session fixtures (tests/dockerd.py)


# This sandbox (and CI's) may refuse raising RLIMIT_MEMLOCK to unlimited as a p5en plan asks: the test passes
# the host's own limit through the plan's ulimits, which checks they reach the container all the same.
MEMLOCK = resource.getrlimit(resource.RLIMIT_MEMLOCK)


def _plan(out, argv, *, image="reprostack-test/base:1", timeout=60):
    return LaunchPlan(
        ulimits=(("memlock", *MEMLOCK),),
        gate="selftest",
        profile="cpu",
        mode="container",
        image=ImageRef("selftest", tag=image),
        nodes=1,
        gpus_per_node=0,
        commands=(NodeCommand(0, "leader", tuple(argv), (("NODE", "0"),)),),
        env=(("GATE_ENV", "campaign"),),
        mounts=(Mount(str(out), "/out", read_only=False, what="out"),),
        timeout_s=timeout,
        lock_sha256="0" * 64,
    )


def test_node_runs_in_the_image_writes_through_the_out_mount_and_logs_with_prefix(docker_client, test_base, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    plan = _plan(
        out,
        [
            "sh",
            "-c",
            'echo "env=$GATE_ENV node=$NODE"; echo to-stderr >&2; '
            "ulimit -l > /out/memlock; echo report > /out/report.txt",
        ],
    )
    run = run_node(docker_client, plan, 0, tmp_path / "logs", gpus=False)
    assert run.exit_code == 0 and not run.timed_out
    assert run.image_id == docker_client.images.get("reprostack-test/base:1").id  # what ran is the built image
    log = run.log.read_text().splitlines()
    assert "[node 0] env=campaign node=0" in log and "[node 0] to-stderr" in log
    assert (out / "report.txt").read_text() == "report\n"
    want = "unlimited" if MEMLOCK[0] == resource.RLIM_INFINITY else str(MEMLOCK[0] // 1024)
    assert (out / "memlock").read_text().strip() == want
    assert not docker_client.containers.list(all=True, filters={"id": run.container_id})  # removed


def test_timeout_kills_the_container_and_keeps_what_it_printed(docker_client, test_base, tmp_path):
    plan = _plan(tmp_path, ["sh", "-c", "echo started; sleep 600"], timeout=2)
    run = run_node(docker_client, plan, 0, tmp_path / "logs", gpus=False, grace_s=1)
    assert run.timed_out and run.exit_code is None
    assert "[node 0] started" in run.log.read_text()
    assert run.seconds < 60
    assert not docker_client.containers.list(all=True, filters={"id": run.container_id})


def test_missing_image_is_one_line_and_nothing_starts(docker_client, tmp_path):
    before = len(docker_client.containers.list(all=True))
    with pytest.raises(LaunchError, match="image reprostack/nope:0 is not on this engine"):
        run_node(docker_client, _plan(tmp_path, ["true"], image="reprostack/nope:0"), 0, tmp_path, gpus=False)
    assert len(docker_client.containers.list(all=True)) == before


def test_a_plan_with_efa_gets_the_gdrcopy_device(docker_client, test_base, tmp_path):
    """issue 37 item 5: GIN on EFA opens /dev/gdrdrv (gdrcopy src/gdrapi.c gdr_open, O_RDWR) inside the container;
    `gate --container` gave it none. A plan with EFA maps the host's device at /dev/gdrdrv (this CPU machine has no
    gdrdrv module: the host's /dev/zero stands in as the character device mapped there, opened read-write by the
    container); a plan without EFA maps nothing."""
    out = tmp_path / "out"
    out.mkdir()
    probe = "if [ -c /dev/gdrdrv ] && echo x > /dev/gdrdrv; then echo mapped; else echo absent; fi > /out/gdrdrv"
    plan = dataclasses.replace(_plan(out, ["sh", "-c", probe]), efa_devices_per_node=1)
    run = run_node(docker_client, plan, 0, tmp_path / "logs", gpus=False, gdrdrv="/dev/zero")
    assert run.exit_code == 0 and (out / "gdrdrv").read_text() == "mapped\n", run.log.read_text()
    run = run_node(
        docker_client, _plan(out, ["sh", "-c", probe]), 0, tmp_path / "logs2", gpus=False, gdrdrv="/dev/zero"
    )
    assert run.exit_code == 0 and (out / "gdrdrv").read_text() == "absent\n"
