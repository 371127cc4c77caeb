"""The serving gates on several GPUs of one host (issue 42 item 1): profiles host-ep2/4/8 of gates/vllm.yaml and
gates/sglang.yaml render, through the real `reprostack gate G --plan --json`, vLLM with data parallel = EP = the GPU
count and `--all2all-backend deepep_v2` (its alternative allgather_reducescatter at the same EP), SGLang with
--tp/--dp/--ep-size = the GPU count, the DeepEP arm on the seam (SGLANG_DEEPEP_USE_V2=1, --deepep-mode normal), the
multicast-off variables and no NIC (SGLang's DeepEP arm listed, not launched, until the tiny model has an FP8
variant: SGLang 0.5.11 serves DeepEP normal mode only for FP8); a host of N GPUs picks host-epN; the profiles have
no bar, so they can never pass; the per-rank proof that ElasticBuffer carried the all-to-all is DeepEP's own dispatch
line, one per rank; and the DeepEP/alternative ratio has its 95% interval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprostack.gates import profiles
from reprostack.gates.base import verdict

from reprostack.gates.parsers.servelog import assert_backend
from reprostack.gates.registry import gate as gate_named
from reprostack.gates.servingspec import load_serving_spec
from reprostack.report import evaluate

REPO = Path(__file__).resolve().parents[1]
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def plan(gate: str, profile: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "reprostack", "gate", gate, "--plan", "--json", "--profile", profile],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def flag(argv: list, name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_vllm_host_profile_renders_data_parallel_equal_to_the_gpu_count(n):
    p = plan("vllm", f"host-ep{n}")
    arms = {a["name"]: a for a in p["arms"]}
    assert set(arms) == {"deepep", "allgather"}
    backends = {}
    for name, a in arms.items():
        (cmd,) = a["commands"]  # one host: one launch, vLLM starts its DP ranks itself
        argv = cmd["argv"]
        assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
        assert flag(argv, "--data-parallel-size") == str(n) and flag(argv, "--data-parallel-size-local") == str(n)
        assert flag(argv, "--tensor-parallel-size") == "1" and "--enable-expert-parallel" in argv
        assert "--enforce-eager" in argv and "--data-parallel-address" not in argv
        backends[name] = flag(argv, "--all2all-backend")
    assert backends == {"deepep": "deepep_v2", "allgather": "allgather_reducescatter"}
    env = dict(p["env"])
    assert {k: env[k] for k in MULTICAST_OFF} == MULTICAST_OFF
    assert env["EP_DISABLE_GIN"] == "1" and env["EP_BUFFER_DEBUG"] == "1" and "FI_PROVIDER" not in env


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sglang_host_profile_renders_ep_equal_to_the_gpu_count_on_the_seam(n):
    p = plan("sglang", f"host-ep{n}")
    arms = {a["name"]: a for a in p["arms"]}
    assert set(arms) == {"deepep", "dense"}
    backends = {}
    for name, a in arms.items():
        (cmd,) = a["commands"]
        argv = cmd["argv"]
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert [flag(argv, f) for f in ("--tp", "--dp", "--ep-size")] == [str(n)] * 3
        assert "--enable-dp-attention" in argv and flag(argv, "--deepep-mode") == "normal"
        # the seam's ElasticBuffer holds at most this many tokens a rank: the server's chunk must fit in it
        assert int(flag(argv, "--chunked-prefill-size")) <= 1024
        backends[name] = flag(argv, "--moe-a2a-backend")
    assert backends == {"deepep": "deepep", "dense": "none"}
    env = dict(p["env"])
    assert {k: env[k] for k in MULTICAST_OFF} == MULTICAST_OFF
    assert env["SGLANG_DEEPEP_USE_V2"] == "1" and env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "1024"
    assert env["SGLANG_DEEPEP_V2_CPU_TIMEOUT_SECS"] == env["SGLANG_DEEPEP_V2_GPU_TIMEOUT_SECS"] == "600"
    assert env["EP_DISABLE_GIN"] == "1" and "FI_PROVIDER" not in env
    # the DeepEP arm is rendered but not launched on the BF16 tiny model, saying why (SGLang's FP8-only normal path)
    (skip,) = [x for x in p["notes"] if x.startswith("arm deepep: not launched")]
    assert "FP8" in skip and "forward_deepgemm_contiguous is deprecated" in skip


@pytest.mark.parametrize("gate", ["vllm", "sglang"])
def test_host_profiles_have_no_bar_so_they_never_pass(gate):
    spec = load_serving_spec(REPO, gate)
    g = gate_named(gate)
    for n in (2, 4, 8):
        prof = spec.profile(f"host-ep{n}")
        assert (prof.nodes, prof.gpus_per_node, prof.ep_size, prof.needs_efa) == (1, n, n, False)
        assert profiles.resolve(spec, None, {"gpu_count": n, "efa_devices": []}, g.no_fit) is prof
        assert prof.bars_status == "unmeasured" and not prof.measured and prof.bars.published == {}
        assert [c.concurrency for c in spec.cells_for(prof)] == [1, 4, 8]
        # every check a run could make passes, and still: FAIL, naming the missing bar
        checks = [evaluate("deepep.c1.errors", "", 0, "==", 0), evaluate("backend_assertion", "", "ok", "==", "ok")]
        result, reason = verdict(prof, checks, f"gates/{gate}.yaml")
        assert result.value == "fail" and reason == f"profile host-ep{n} has no measured bar yet; numbers reported"
        assert checks[-1].metric == "bars_status" and not checks[-1].passed
        required, _, note = spec.assertion(prof)
        assert [r.name for r in required] == ["ElasticBuffer construction", "ElasticBuffer dispatch"]
        assert all(r.scope == "all" for r in required) and "Selected provider is efa" in note


def _log(ranks: int, dispatching: range) -> str:
    """A one-host server log: DeepEP's construction line per rank, its dispatch printf for the ranks in
    `dispatching` (csrc/elastic/buffer.hpp:993's shape: scaleup counts, `#`, expert counts), interleaved with
    engine lines that name no rank."""
    lines = [f"Initializing EP elastic buffer with 1073741824 bytes at rank EP {r}/{ranks}" for r in range(ranks)]
    for r in dispatching:
        lines += ['INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 OK']
        lines += [f"CPU side received count (scaleup: {r}): 3 5 # 8 0"] * 2
    return "\n".join(lines) + "\n"


def test_the_dispatch_line_proves_each_rank_of_one_host_and_names_a_silent_rank():
    spec = load_serving_spec(REPO, "sglang")
    required, forbidden, _ = spec.assertion(spec.profile("host-ep4"))

    def check(text, num_ranks=4, gpus=4):
        return assert_backend(
            text, num_ranks=num_ranks, gpus_per_node=gpus, required=list(required), forbidden=list(forbidden)
        )

    rep = check(_log(4, range(4)))
    assert rep.ok, rep.problems
    d = next(r for r in rep.required if r.name == "ElasticBuffer dispatch")
    assert d.per_rank == {r: 2 for r in range(4)}
    # rank 3 built its ElasticBuffer but never dispatched through it: not proven, named
    rep = check(_log(4, range(3)))
    assert rep.problems == ["required `ElasticBuffer dispatch`: ranks 3 missing (3 of 4 ranks printed it)"]
    # across nodes the scaleup index repeats (it is not the rank): the line proves no rank there
    rep = check(_log(16, range(8)), num_ranks=16, gpus=8)
    d = next(r for r in rep.required if r.name == "ElasticBuffer dispatch")
    assert d.per_rank == {None: 16} and d.missing_ranks == list(range(16))


def test_the_deepep_over_alternative_ratio_has_a_95_interval_from_both_arms_runs():
    from types import SimpleNamespace as NS

    from reprostack.evidence.bars.ratio import ratio_interval, ratio_intervals

    d, a = [100.0, 104.0, 96.0], [50.0, 51.0, 49.0, 50.0]
    got = ratio_interval(d, a)
    # by hand: r = 100 / 50; v_d = 16 / (3 * 100^2), v_a = (2/3) / (4 * 50^2); Welch df = 2.2... -> t(0.975, 2)
    vd, va = 16 / 3 / 100**2, (2 / 3) / 4 / 50**2
    half = 4.3027 * 2.0 * (vd + va) ** 0.5
    assert got["ratio"] == 2.0 and got["n"] == [3, 4]
    assert got["ci95"] == [round(2.0 - half, 6), round(2.0 + half, 6)]
    assert ratio_interval([10.0, 10.0], [5.0, 5.0])["ci95"] == [2.0, 2.0]
    assert ratio_interval([10.0], [5.0, 5.0]) is None and ratio_interval([0.0, 0.0], [5.0, 5.0]) is None

    def arm(name, role, cells):
        return NS(arm=NS(name=name, role=role), cells=[NS(cell=NS(name=c), samples=s) for c, s in cells.items()])

    runs = [
        arm("deepep", "deepep", {"c1": d, "c4": [1.0]}),
        arm("allgather", "alternative", {"c1": a, "c4": [1.0, 2.0]}),
    ]
    assert ratio_intervals(runs) == {"allgather": {"c1": got}}  # c4: one DeepEP run, no interval
