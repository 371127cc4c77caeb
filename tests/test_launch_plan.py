"""The gate launch plan as data and its docker SDK rendering (reprostack.launch.plan)."""

import json

import pytest

from reprostack.launch.plan import ImageRef, LaunchPlan, Mount, NodeCommand, docker_run_kwargs


def _plan(**kw):
    base = dict(
        gate="micro",
        profile="p5en-efa-ep16",
        mode="container",
        image=ImageRef(
            "deepep",
            tag="reprostack/deepep:0123456789abcdef",
            image_id="sha256:" + "ab" * 32,
            base="docker.io/nvidia/cuda:13.0.0-devel-ubuntu22.04@sha256:" + "14" * 32,
        ),
        nodes=2,
        gpus_per_node=8,
        commands=(
            NodeCommand(0, "leader", ("python", "test_ep.py", "--num-processes", "8"), (("RANK", "0"),)),
            NodeCommand(1, "worker", ("python", "test_ep.py", "--num-processes", "8"), (("RANK", "1"),)),
        ),
        env=(("NCCL_GIN_TYPE", "2"), ("FI_PROVIDER", "efa")),
        efa_devices_per_node=16,
        mounts=(Mount("/srv/out", "/out", read_only=False, what="out"), Mount("/srv/cache", "/cache", what="cache")),
        timeout_s=1800,
        lock_sha256="f" * 64,
    )
    base.update(kw)
    return LaunchPlan(**base)


def test_gpu_plan_renders_gpus_efa_ulimits_host_network_for_docker():
    kw = docker_run_kwargs(_plan(), 1, efa_devices=[f"/dev/infiniband/uverbs{i}" for i in range(16)])
    assert kw["image"] == "sha256:" + "ab" * 32
    assert kw["device_requests"][0].count == -1 and kw["device_requests"][0].capabilities == [["gpu"]]
    assert len(kw["devices"]) == 16 and kw["devices"][0] == "/dev/infiniband/uverbs0:/dev/infiniband/uverbs0:rwm"
    assert kw["network_mode"] == "host" and kw["ipc_mode"] == "host" and kw["shm_size"] == "32g"
    assert {(u["Name"], u["Soft"]) for u in kw["ulimits"]} == {("memlock", -1), ("stack", 67108864)}
    assert kw["environment"] == {"NCCL_GIN_TYPE": "2", "FI_PROVIDER": "efa", "RANK": "1"}
    assert [(m["Target"], m["ReadOnly"]) for m in kw["mounts"]] == [("/out", False), ("/cache", True)]
    assert "IPC_LOCK" in kw["cap_add"] and kw["labels"]["dev.reprostack.node"] == "1"


def test_plan_json_and_lines_say_everything():
    p = _plan()
    d = json.loads(p.to_json())
    assert d["ep_size"] == 16 and d["image"]["image_id"].startswith("sha256:") and d["efa_devices_per_node"] == 16
    assert d["commands"][1]["env"] == {"RANK": "1"} and d["ulimits"][0] == {"name": "memlock", "soft": -1, "hard": -1}
    text = "\n".join(p.lines())
    assert "2 node(s) x 8 GPU(s) = EP16" in text and "memlock=unlimited" in text and "/srv/out -> /out (rw)" in text


def test_unbuilt_image_is_never_given_an_id():
    p = _plan(image=ImageRef("vllm"))
    assert "(not built here)" in p.image.describe()
    assert docker_run_kwargs(p, 0)["image"] == "reprostack/vllm"


def test_host_mode_is_labelled_and_has_no_container():
    p = _plan(mode="host", image=None)
    assert any(line.startswith("mode: host (labelled") for line in p.lines())
    with pytest.raises(ValueError, match="host-mode plan has no container"):
        docker_run_kwargs(p, 0)


@pytest.mark.parametrize(
    "mounts, why",
    [
        ((Mount("/srv/cache", "/cache", read_only=False, what="cache"),), "only the out dir"),
        ((Mount("/srv/out", "out", read_only=False, what="out"),), "absolute"),
    ],
)
def test_mount_invariants(mounts, why):
    with pytest.raises(ValueError, match=why):
        _plan(mounts=mounts)


def test_container_plan_needs_an_image_and_known_node():
    with pytest.raises(ValueError, match="needs an image"):
        _plan(image=None)
    with pytest.raises(ValueError, match="no command for node 5"):
        docker_run_kwargs(_plan(), 5)
