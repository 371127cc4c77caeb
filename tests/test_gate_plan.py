"""`gate G --plan`: every gate's launch plan from its real spec, the real lock and the real recipes, on a CPU
machine, running nothing (reprostack.gates.plan, cli)."""

import json
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.gates import registry
from reprostack.gates.plan import gate_plan
from reprostack.launch.plan import docker_run_kwargs
from reprostack.lock import load

ROOT = Path(__file__).resolve().parents[1]
LOCK = load(ROOT / "upstreams.lock")
IMAGES = {
    "fabric": "deepep",
    "micro": "deepep",
    "vllm": "vllm",
    "sglang": "sglang",
    "trtllm": "trtllm",
    "megatron": "megatron",
    "nemo-rl": "nemo-rl",
}


@pytest.mark.parametrize("gate", list(IMAGES))
def test_every_gate_plans_the_published_2x_p5en_run_in_its_image_by_digest(gate, tmp_path):
    p = gate_plan(registry.gate(gate), ROOT, LOCK, out_dir=tmp_path / "out", images_json=tmp_path / "none.json")
    assert p.mode == "container" and p.image.recipe == IMAGES[gate]
    assert (p.nodes, p.gpus_per_node, p.ep_size) == (2, 8, 16) and p.profile.startswith("p5en-efa")
    if gate == "trtllm":  # its own CUDA base, by digest
        assert p.image.base == LOCK.get("cuda-12-9-devel").ref and "@sha256:" in p.image.base
    else:  # the registry-free chain: the Debian base made from the pinned .debs (containers/substrate)
        assert p.image.base == "local:reprostack/debian-12-build:12"
    assert p.image.image_id is None and any("not built on this machine" in n for n in p.notes)
    assert [c.node for c in p.commands] == [0, 1] and p.commands[0].role == "leader"
    assert p.efa_devices_per_node == 16
    assert ("memlock", -1, -1) in p.ulimits and p.host_network and p.host_ipc
    assert p.lock_sha256 == LOCK.sha256 and p.timeout_s > 0
    assert [m.what for m in p.mounts if not m.read_only] == ["out"]
    kw = docker_run_kwargs(p, 1, efa_devices=[f"/dev/infiniband/uverbs{i}" for i in range(16)])
    assert kw["device_requests"][0].capabilities == [["gpu"]] and len(kw["devices"]) == 16


def test_plan_commands_are_the_gates_own(tmp_path):
    micro = gate_plan(registry.gate("micro"), ROOT, LOCK, out_dir=tmp_path, images_json=tmp_path / "x")
    argv = micro.commands[1].argv
    assert "torch.distributed.run" in argv and "--node-rank=1" in argv
    assert argv[argv.index("--num-processes") - 1] == "/workspace/gates/drivers/micro_trials.py"
    assert argv[argv.index("--test-ep") + 1] == "/opt/reprostack/src/deepep/tests/elastic/test_ep.py"
    assert argv[argv.index("--trials") + 1] == "5"
    assert dict(micro.env)["NCCL_GIN_TYPE"] == "2"
    vllm = gate_plan(registry.gate("vllm"), ROOT, LOCK, out_dir=tmp_path, images_json=tmp_path / "x")
    assert vllm.commands[0].argv[:2] == ("vllm", "serve") and "--headless" in vllm.commands[1].argv
    assert dict(vllm.env)["FI_PROVIDER"] == "efa" and "PATH" not in dict(vllm.env)  # the spec's env only
    models = next(m for m in vllm.mounts if m.what == "models")
    assert dict(vllm.env)["HF_HOME"] == models.target == "/models" and models.read_only
    assert models.source.startswith("/") and "$" not in models.source
    trt = gate_plan(registry.gate("trtllm"), ROOT, LOCK, out_dir=tmp_path, images_json=tmp_path / "x")
    assert trt.commands[0].argv[0] == "mpirun" and trt.commands[1].argv[0] == "/usr/sbin/sshd"
    assert any("unresolved" in n or "cannot be built yet" in n for n in trt.notes)
    meg = gate_plan(registry.gate("megatron"), ROOT, LOCK, out_dir=tmp_path, images_json=tmp_path / "x")
    assert "/workspace/gates/drivers/megatron_moe.py" in meg.commands[0].argv


def test_one_gpu_profile_and_a_build_summary_give_the_built_image(tmp_path):
    summary = tmp_path / "images.json"
    summary.write_text(
        json.dumps(
            {
                "images": [
                    {"name": "deepep", "tag": "reprostack/deepep:0123456789abcdef", "image_id": "sha256:" + "ab" * 32}
                ]
            }
        )
    )
    p = gate_plan(registry.gate("micro"), ROOT, LOCK, profile="h200-ep1", out_dir=tmp_path, images_json=summary)
    assert (p.nodes, p.gpus_per_node, p.efa_devices_per_node) == (1, 1, 0)
    assert p.image.image_id == "sha256:" + "ab" * 32 and docker_run_kwargs(p, 0)["image"] == p.image.image_id
    summary.write_text("{not json")  # a stale or foreign summary loses the ids, never the plan
    assert gate_plan(registry.gate("micro"), ROOT, LOCK, out_dir=tmp_path, images_json=summary).image.image_id is None


def test_cli_plan_prints_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "gates"
    assert cli.main(["gate", "trtllm", "--plan", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        "launch plan: gate trtllm [p5en-efa-ep16] (nothing was run)" in text and "cuda:12.9.0-devel-ubuntu24.04" in text
    )
    assert not out.exists()
    assert cli.main(["all-gates", "--plan", "--json", "--profile", "h200-ep1", "--out", str(out)]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert {p["gate"]: p["profile"] for p in plans} == {
        "fabric": "h200-ep1",
        "micro": "h200-ep1",
        "vllm": "h200-ep1",  # the serving gates' one-GPU profile (issue 28)
        "sglang": "h200-ep1",
        "trtllm": "p5en-efa-ep16",
        "megatron": "h200-ep1",
        "nemo_rl": "p5en-efa-2x8",
    }
    assert cli.main(["all-gates", "--plan", "--out", str(out)]) == 0
    text = capsys.readouterr().out  # titles name each gate as `reprostack gate NAME` takes it
    assert "launch plan: gate nemo-rl [p5en-efa-2x8]" in text and "gate nemo_rl [" not in text
    assert text.index("launch plan: gate fabric [p5en-efa-ep16]") < text.index("launch plan: gate micro [")  # gate 0
    assert cli.main(["gate", "micro", "--plan", "--profile", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no profile 'nope'" in err[0]


def test_a_one_node_torchrun_plan_is_the_launch_the_gate_makes(tmp_path):
    """The plan once drew its own launch for one-node torchrun profiles (one process per GPU) while the gate starts
    one torchrun agent whose test_ep spawns the GPUs' ranks; both now come from gates.micro.test_ep_launch."""
    from reprostack.gates import micro
    from reprostack.gates.spec import load_spec

    plan = gate_plan(
        registry.gate("micro"), ROOT, LOCK, profile="h200-nvl-ep2", out_dir=tmp_path, images_json=tmp_path / "x"
    )
    (cmd,) = plan.commands
    argv = list(cmd.argv)
    script = "/workspace/gates/drivers/micro_trials.py"
    args = argv[argv.index(script) + 3 :]  # after `--num-processes 2`
    gate = micro.test_ep_launch(
        load_spec(ROOT, "micro").profile("h200-nvl-ep2"),
        "python3",
        script,
        args,
        nodes=1,
        master_addr="127.0.0.1",
        master_port=int(dict(cmd.env)["MASTER_PORT"]),
    )
    assert argv == gate.argv and "--nproc-per-node=1" in argv and argv[argv.index("--num-processes") + 1] == "2"


def test_an_arm_the_profile_never_launches_says_so_in_the_plan(tmp_path, capsys):
    """sglang h200-ep1 lists its deepep arm in `skip-arms` (no DeepEP V2 path in the pinned SGLang): the plan says
    the arm is not launched and why, beside its command, as the run's SKIP does."""
    assert cli.main(["gate", "sglang", "--plan", "--profile", "h200-ep1", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "note: arm deepep: not launched on profile h200-ep1: SGLang 0.5.11 as pinned" in text
    assert cli.main(["gate", "vllm", "--plan", "--profile", "h200-ep1", "--out", str(tmp_path / "o")]) == 0
    assert "not launched" not in capsys.readouterr().out  # vLLM's deepep arm is launched (and judged by its log)
