"""The serving gates' one-GPU profile h200-ep1 (issue 28 item 3): its commands rendered from the real specs, and the
profile machinery it uses run end to end on the CPU through the pinned AIPerf against reprostack.gates.testserver:
an arm whose ready server never printed its `engaged` line is SKIP quoting the engine's own lines (no AIPerf run
on it) while the other arm runs; `skip-arms` never launches an arm; `bars-status: unmeasured` reports every number
and never passes; `requires-modules` the interpreter cannot import is a SKIP naming them; bad profile data is one
located line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gaterun
from reprostack import sources
from reprostack.fetch import Cache
from reprostack.gates.servingspec import load_serving_spec
from reprostack.gates.spec import GateSpecError
from reprostack.report import validate_report, write_reports
from test_gate_serving import REPO, TOOLS, aiperf, lock  # noqa: F401  (fixtures)

TEST_PROFILE = r"""  cpu-ep1:
    description: the h200-ep1 machinery on the CPU, the test server standing in for the engine
    nodes: 1
    gpus-per-node: 1
    needs-gpu: false
    model: "${root}/tiny-model"
    served-model: tiny-test
    tokenizer: test
    bars-status: unmeasured
    cells:
      - {name: c1, concurrency: 1, requests: 3}
    aiperf-args: [--no-server-metrics, --no-gpu-telemetry]
    vars: {token_interval_s: "0.01"}
    server:
      port: 0
      leader: ["${python}", -m, reprostack.gates.testserver, --port, "${port}", --model, "${served_model}",
               --token-interval-s, "${token_interval_s}", --ranks, "${ep}",
               --log-line, "Initializing a V1 LLM engine (v0.24.0) with config: model='${model}', data_parallel_size=1, backend=${all2all_backend}",
               --log-line, "Using TRITON Unquantized MoE backend out of potential backends: ['TRITON', 'BATCHED_TRITON']."]
    backend-assertion:
      note: one GPU and no NIC, so no provider line can appear (test)
      required:
        - {name: ElasticBuffer construction, pattern: 'Initializing EP elastic buffer', scope: all, source: "DeepEP elastic.py:179 (test)"}
      forbidden: []
    engaged:
      deepep:
        lines:
          - {name: DeepEP V2 all2all manager, pattern: 'Using DeepEPV2All2AllManager all2all manager', source: "vLLM 0.24.0 cuda_communicator.py:186"}
        quote: ['data_parallel_size=\d+', 'Using [\w ]+ Unquantized MoE backend out of potential backends: \[[^\]]*\]']
        why: vLLM builds an all2all manager only when data_parallel_size > 1 (the test's stand-in for the real why)
"""


def root_with(tmp_path: Path, profile: str = TEST_PROFILE, gate: str = "vllm") -> Path:
    text = (REPO / "gates" / f"{gate}.yaml").read_text()
    text = text.replace("\n  osl: 128\n", "\n  osl: 16\n")
    root = tmp_path / "root"
    (root / "gates").mkdir(parents=True)
    (root / "gates" / f"{gate}.yaml").write_text(text.rstrip("\n") + "\n" + profile)
    shutil.copy(REPO / "gates" / "aiperf-constraints.txt", root / "gates")
    shutil.copy(REPO / "upstreams.lock", root)
    return root


def run(root: Path, lock, out: Path, gate: str = "vllm", **kw):  # noqa: F811
    fetch = sources.FetchOptions(cache=Cache(TOOLS))
    return gaterun.run(gaterun.options(gate, root=root, lock=lock, fetch=fetch, out_dir=out, profile="cpu-ep1", **kw))


def test_h200_profiles_render_their_commands(tmp_path):
    for gate, module, flags in (
        ("vllm", "vllm.entrypoints.cli.main", ["serve", "--data-parallel-size", "1", "--enable-expert-parallel"]),
        ("sglang", "sglang.launch_server", ["--tp", "1", "--ep-size", "1"]),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "reprostack", "gate", gate, "--plan", "--json", "--profile", "h200-ep1"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        plan = json.loads(p.stdout)
        text = json.dumps(plan)
        assert "/.cache/models/tiny-qwen3-moe" in text and "tiny-qwen3-moe" in text
        arms = {a["name"]: a for a in plan["arms"]}
        assert set(arms) == ({"deepep", "allgather"} if gate == "vllm" else {"deepep", "dense"})
        for a in arms.values():
            (cmd,) = a["commands"]
            argv = cmd["argv"]
            assert argv[1:3] == ["-m", module] and all(f in argv for f in flags), argv
        if gate == "vllm":
            backends = {
                n: a["commands"][0]["argv"][a["commands"][0]["argv"].index("--all2all-backend") + 1]
                for n, a in arms.items()
            }
            assert backends == {"deepep": "deepep_v2", "allgather": "allgather_reducescatter"}
            env = dict(plan["env"])
            assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and env["EP_BUFFER_DEBUG"] == "1"
            assert "FI_PROVIDER" not in env and env["NCCL_NVLS_ENABLE"] == "0"
    spec = load_serving_spec(REPO, "vllm")
    p = spec.profile("h200-ep1")
    assert [(c.name, c.concurrency) for c in spec.cells_for(p)] == [("c1", 1), ("c4", 4), ("c8", 8)]
    assert (spec.aiperf["isl"], spec.aiperf["osl"], p.bars_status, p.measured) == (120, 128, "unmeasured", False)
    required, _, note = spec.assertion(p)
    assert [r.name for r in required] == ["ElasticBuffer construction"] and "Selected provider is efa" in note


def test_an_arm_the_engine_did_not_engage_is_skip_quoting_it_and_the_other_arm_runs(aiperf, lock, tmp_path):  # noqa: F811
    root = root_with(tmp_path)
    out = tmp_path / "out"
    rep = run(root, lock, out, trials=2)
    arms = rep.data["arms"]
    assert arms["deepep"]["cells"] == [] and arms["deepep"]["error"] is None
    why = arms["deepep"]["skipped"]
    assert why.startswith("the engine did not engage the arm's backend: its log has no `Using DeepEPV2All2AllManager")
    assert "it printed: data_parallel_size=1 | Using TRITON Unquantized MoE backend out of potential backends: " in why
    assert "['TRITON', 'BATCHED_TRITON']" in why and why.endswith("(the test's stand-in for the real why)")
    (cell,) = arms["allgather"]["cells"]
    assert cell["status"] == "ok" and cell["completed"] == 3 and len(cell["samples"]) == 2
    assert set(rep.data["statistics"]) == {"allgather.c1.agg_tok_s"}
    # unmeasured: every number reported, FAIL (never PASS), and the skipped DeepEP arm named in the reason
    assert rep.result == "fail"
    assert rep.reason.startswith("profile cpu-ep1 has no measured bar yet; numbers reported")
    assert "arm deepep SKIP: the engine did not engage" in rep.reason
    metrics = {c.metric: c for c in rep.checks}
    assert metrics["allgather.c1.errors"].passed and metrics["allgather.c1.completed_requests"].value == 3
    assert not any(m.startswith("deepep.") for m in metrics)  # a skipped arm has no checks
    assert metrics["bars_status"].value == "unmeasured" and not metrics["bars_status"].passed
    assert rep.provenance["model"] == str((root / "tiny-model").resolve())
    assert rep.data["bars"]["status"] == "unmeasured"
    assert rep.data["backend_assertion_note"].startswith("one GPU and no NIC")
    log = (out / "vllm" / "server.deepep.log").read_text()
    assert f"model='{(root / 'tiny-model').resolve()}'" in log and "backend=deepep_v2" in log
    validate_report(json.loads(write_reports([rep], out)["vllm.json"].read_text()))


def test_skip_arms_never_launches_the_arm(aiperf, lock, tmp_path):  # noqa: F811
    profile = TEST_PROFILE + "    skip-arms:\n      deepep: no pinned bytes can run this arm on this profile (test)\n"
    root = root_with(tmp_path, profile)
    out = tmp_path / "out"
    rep = run(root, lock, out, trials=1)
    assert rep.data["arms"]["deepep"]["skipped"] == (
        "not launched on profile cpu-ep1: no pinned bytes can run this arm on this profile (test)"
    )
    assert not (out / "vllm" / "server.deepep.log").exists()
    assert rep.data["arms"]["allgather"]["cells"][0]["status"] == "ok"
    assert rep.result == "fail" and "arm deepep SKIP: not launched on profile cpu-ep1" in rep.reason


def test_a_module_the_interpreter_cannot_import_is_a_skip_naming_it(aiperf, lock, tmp_path):  # noqa: F811
    profile = TEST_PROFILE.replace(
        "    bars-status: unmeasured\n", "    bars-status: unmeasured\n    requires-modules: [no_such_engine_xyz]\n"
    )
    root = root_with(tmp_path, profile)
    rep = run(root, lock, tmp_path / "out")
    assert rep.result == "skip" and "cannot import: no_such_engine_xyz" in rep.reason
    assert "scripts/device/seed_engine.sh" in rep.reason


@pytest.mark.parametrize(
    "old, new, match",
    [
        ("    bars-status: unmeasured\n", "", r"vllm.yaml:\d+: profiles.cpu-ep1: .*(bars|anyOf)"),
        (
            "    bars-status: unmeasured\n",
            "    bars-status: unmeasured\n    bars: {tolerance: 0.1, tolerance-why: twenty characters at least, source: a source text, published: {c1: 1.0}}\n",
            r"vllm.yaml:\d+: profiles.cpu-ep1.bars: a profile with bars-status: unmeasured has no published bars",
        ),
        (
            "      deepep:\n        lines:",
            "      nosuch:\n        lines:",
            r"profiles.cpu-ep1.engaged.nosuch: no such arm",
        ),
        (
            "quote: ['data_parallel_size=\\d+'",
            "quote: ['data_parallel_size=(\\d+'",
            r"engaged.deepep.quote\[0\]: not a regex",
        ),
        (
            "      - {name: c1, concurrency: 1, requests: 3}\n",
            "      - {name: c1, concurrency: 1, requests: 3}\n      - {name: c1, concurrency: 2, requests: 3}\n",
            r"profiles.cpu-ep1.cells\[1\].name: duplicate cell 'c1'",
        ),
        (
            '    model: "${root}/tiny-model"\n',
            '    model: "${nosuch}/tiny-model"\n',
            r"unknown template variable \$\{nosuch\}",
        ),
    ],
)
def test_bad_profile_data_is_one_located_error(tmp_path, old, new, match):
    assert old in TEST_PROFILE
    root = root_with(tmp_path, TEST_PROFILE.replace(old, new))
    with pytest.raises(GateSpecError, match=match):
        load_serving_spec(root, "vllm")
