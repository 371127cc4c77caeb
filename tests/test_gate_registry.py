"""The gate registry and runner: every spec through its own gate's schema; `all-gates` always ends with the combined
report of all six gates (a host no profile fits is that gate's SKIP, a bad spec or a crash is that gate's ERROR);
a single `gate G` with bad input still exits 2 with one line. Real specs, real local git sources; only what needs
a GPU (the host inventory, micro's and megatron's runs) is stood in for."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.bump.impact import impact
from reprostack.errors import GateError
from reprostack.gates import registry, runner
from reprostack.gates.runner import run_gate as real_run_gate
from reprostack.gates.fabric_spec import FabricSpec
from reprostack.gates.servingspec import ServingSpec
from reprostack.gates.spec import GateSpec, GateSpecError
from reprostack.gates.training_spec import TrainingSpec
from reprostack.report import RESULTS, GateReport, Result, evaluate
from conftest import without_progress
from test_gate_micro import gpu_less  # noqa: F401  (fixture: PATH without nvidia-smi)
from test_gate_training import training_project

REPO_ROOT = Path(__file__).resolve().parents[1]
H200 = {"gpu_count": 1, "gpus": [{"name": "NVIDIA H200"}], "efa_devices": []}


def test_registry_loads_each_spec_through_its_own_schema():
    specs = registry.load_all(REPO_ROOT)
    assert list(specs) == ["fabric", "micro", "vllm", "sglang", "trtllm", "megatron", "nemo-rl"]
    assert list(specs) == list(registry.GATE_ORDER)
    kinds = {n: type(s) for n, s in specs.items()}
    assert kinds == {
        "fabric": FabricSpec,
        "micro": GateSpec,
        "vllm": ServingSpec,
        "sglang": ServingSpec,
        "trtllm": ServingSpec,
        "megatron": TrainingSpec,
        "nemo-rl": TrainingSpec,
    }
    assert [registry.gate(n).requirements(REPO_ROOT) for n in specs] == [
        (),
        (),
        ("micro",),
        ("micro",),
        ("micro",),
        ("micro",),
        ("megatron",),
    ]
    micro, spec = registry.gate("micro"), specs["micro"]
    assert micro.requirements(REPO_ROOT, spec.profile("p5en-efa-ep16")) == ("fabric",)  # on EFA: the fabric first
    assert micro.requirements(REPO_ROOT, spec.profile("h200-ep1")) == ()  # one GPU, no fabric to prove
    assert registry.gate("nemo_rl") is registry.gate("nemo-rl")
    with pytest.raises(GateError, match="no gate 'nemo'"):
        registry.gate("nemo")


def test_result_enum_keeps_the_json_strings():
    assert RESULTS == ("pass", "fail", "skip", "error", "not-run", "inconclusive")
    rep = GateReport("micro", "-", Result.NOT_RUN, "x")
    assert rep.result == "not-run" and type(rep.result) is str and rep.to_dict()["result"] == "not-run"


def test_stray_spec_is_not_read_with_another_gates_schema(tmp_path):
    (tmp_path / "gates").mkdir()
    (tmp_path / "gates" / "extra.yaml").write_text("gate: extra\n")
    with pytest.raises(GateSpecError, match=r"gates/extra.yaml: \(file\): no gate owns this spec"):
        impact(tmp_path, "deepep")


def test_impact_reads_every_real_spec():
    # before the registry, this died on gates/megatron.yaml:50 ('loss_increases' is not one of micro's metrics)
    # the serving gates name `kernels: [nccl, deepep]` too: their engines' EP path runs DeepEP V2
    assert impact(REPO_ROOT, "deepep").gates == ("megatron", "micro", "sglang", "trtllm", "vllm")
    assert impact(REPO_ROOT, "nemo-rl").gates == ()


# --------------------------------------------------------------------------- all-gates on the one-GPU H200


def six_gate_project(tmp_path: Path) -> Path:
    """A project with every gate's spec (the fabric gate's too), its lock the training tests' local sources."""
    root, _ = training_project(tmp_path)
    for f in ("fabric.yaml", "micro.yaml", "vllm.yaml", "sglang.yaml", "trtllm.yaml", "aiperf-constraints.txt"):
        shutil.copy(REPO_ROOT / "gates" / f, root / "gates" / f)
    shutil.copytree(REPO_ROOT / "gates" / "trtllm", root / "gates" / "trtllm")
    return root


def passed(g) -> GateReport:
    return GateReport(g.stem, "h200-ep1", "pass", "1 check(s) passed", checks=[evaluate("x", "", 1, "==", 1)])


def unmeasured(g) -> GateReport:  # the fabric gate on one H200: every number reported, its bars unmeasured
    why = "profile h200-ep1 has no measured bar yet; numbers reported"
    return GateReport(
        g.stem, "h200-ep1", "fail", why, checks=[evaluate("bars_status", "", "unmeasured", "==", "measured")]
    )


@pytest.fixture
def h200(monkeypatch, gpu_less):
    """A one-GPU H200 without EFA; micro and megatron (which would build kernels) pass as they did there, the
    fabric gate reports its numbers without a bar (h200-ep1 is unmeasured)."""
    monkeypatch.setattr("reprostack.hostinfo.collect", lambda **kw: dict(H200))

    def run(g, *a):
        if g.name == "fabric":
            return unmeasured(g)
        return passed(g) if g.name in ("micro", "megatron") else real_run_gate(g, *a)

    monkeypatch.setattr(runner, "run_gate", run)


def all_gates(root: Path, tmp_path: Path, capsys, *extra: str) -> tuple[int, str, str, Path]:
    out = tmp_path / "reports"
    code = cli.main(
        [
            "all-gates",
            "--lock",
            str(root / "upstreams.lock"),
            "--cache",
            str(tmp_path / "cache"),
            "--out",
            str(out),
            *extra,
        ]
    )
    o, e = capsys.readouterr()
    return code, o, e, out


def test_all_gates_on_one_h200_ends_with_the_combined_report(tmp_path, h200, capsys):
    root = six_gate_project(tmp_path)
    code, out, err, reports = all_gates(root, tmp_path, capsys)
    assert code == 1, err  # the fabric gate's unmeasured profile: numbers, never a pass
    summary = json.loads((reports / "summary.json").read_text())
    assert [(g["gate"], g["result"]) for g in summary["gates"]] == [
        ("fabric", "fail"),
        ("micro", "pass"),
        ("vllm", "skip"),
        ("sglang", "skip"),
        ("trtllm", "skip"),
        ("megatron", "pass"),
        ("nemo_rl", "skip"),
    ]
    assert summary["missing"] == [] and summary["exit_code"] == 1
    rl = json.loads((reports / "nemo_rl.json").read_text())
    assert rl["result"] == "skip" and "nemo_rl.yaml: no profile for this host (1 GPU(s), EFA: False)" in rl["reason"]
    assert "known: p5en-efa-2x8" in rl["reason"]
    # the serving gates' one-GPU profile fits this host; without the engine installed they are SKIP naming it
    assert "profile h200-ep1 serves with modules " in summary["gates"][2]["reason"]
    assert "cannot import: vllm (the engine is not installed" in summary["gates"][2]["reason"]
    assert "nemo-rl [-]: SKIP — " in out and "nemo_rl [" not in out  # the name it is typed by
    md = (reports / "summary.md").read_text()
    assert "| nemo_rl | - | SKIP |" in md and "MISSING" not in md
    cases = ET.parse(reports / "junit.xml").getroot()
    assert {c.get("name") for c in cases if c.find("skipped") is not None} == {"vllm", "sglang", "trtllm", "nemo_rl"}


def test_all_gates_with_a_named_profile_skips_the_gates_without_it(tmp_path, h200, capsys):
    root = six_gate_project(tmp_path)
    code, out, err, reports = all_gates(root, tmp_path, capsys, "--profile", "h200-ep1")
    assert code == 1, err
    by = {g["gate"]: g for g in json.loads((reports / "summary.json").read_text())["gates"]}
    assert [r["result"] for r in by.values()] == ["fail", "pass", "skip", "skip", "skip", "pass", "skip"]
    assert (
        "profile h200-ep1 serves with modules " in by["vllm"]["reason"]
        and "cannot import: vllm" in by["vllm"]["reason"]
    )
    assert by["trtllm"]["reason"] == "trtllm.yaml has no profile 'h200-ep1' (known: p5en-efa-ep16, local-test)"
    assert by["nemo_rl"]["reason"] == "nemo_rl.yaml has no profile 'h200-ep1' (known: p5en-efa-2x8)"


def test_all_gates_bad_spec_and_crash_become_error_reports(tmp_path, h200, monkeypatch, capsys):
    root = six_gate_project(tmp_path)
    vllm = root / "gates" / "vllm.yaml"
    vllm.write_text(vllm.read_text().replace("requires: [micro]", "requires: [megatron]"))
    fake = runner.run_gate  # the h200 stand-in

    def crash_sglang(g, *a):
        if g.name == "sglang":
            raise RuntimeError("boom")
        return fake(g, *a)

    monkeypatch.setattr(runner, "run_gate", crash_sglang)
    code, out, err, reports = all_gates(root, tmp_path, capsys)
    assert code == 1
    by = {g["gate"]: g for g in json.loads((reports / "summary.json").read_text())["gates"]}
    assert [(g, r["result"]) for g, r in by.items()] == [
        ("fabric", "fail"),
        ("micro", "pass"),
        ("vllm", "error"),
        ("sglang", "error"),
        ("trtllm", "skip"),
        ("megatron", "pass"),
        ("nemo_rl", "skip"),
    ]
    assert (
        by["vllm"]["reason"].startswith("spec: ")
        and "vllm.yaml:9: requires[0]: 'megatron' is not a gate that runs before vllm (those: fabric, micro)"
        in by["vllm"]["reason"]
    )
    assert by["sglang"]["reason"] == "internal error: RuntimeError: boom (traceback on stderr)"
    assert "Traceback" in err and "RuntimeError: boom" in err
    assert "sglang [-]: ERROR — internal error: RuntimeError: boom" in out
    assert (reports / "summary.md").is_file() and (reports / "junit.xml").is_file()


def test_all_gates_with_a_bad_micro_spec_reports_it_and_blocks_its_dependents(tmp_path, gpu_less, capsys):
    root = six_gate_project(tmp_path)
    micro = root / "gates" / "micro.yaml"
    micro.write_text(micro.read_text().replace("timeout-s:", "timeout-sec:", 1))
    code, out, err, reports = all_gates(root, tmp_path, capsys)
    assert code == 1, err
    by = {g["gate"]: g for g in json.loads((reports / "summary.json").read_text())["gates"]}
    assert by["micro"]["result"] == "error" and "micro.yaml:18: " in by["micro"]["reason"]
    assert "timeout-sec" in by["micro"]["reason"] and "\n" not in by["micro"]["reason"]
    assert {g: r["result"] for g, r in by.items() if g not in ("fabric", "micro")} == dict.fromkeys(
        ["vllm", "sglang", "trtllm", "megatron", "nemo_rl"], "not-run"
    )
    assert by["nemo_rl"]["reason"].endswith("(root cause: gate micro)")


def test_single_gate_with_bad_spec_still_exits_2_with_one_line(tmp_path, gpu_less, capsys):
    root = six_gate_project(tmp_path)
    micro = root / "gates" / "micro.yaml"
    micro.write_text(micro.read_text().replace("timeout-s:", "timeout-sec:", 1))
    out = tmp_path / "reports"
    code = cli.main(
        ["gate", "micro", "--lock", str(root / "upstreams.lock"), "--cache", str(tmp_path / "cache"), "--out", str(out)]
    )
    err = without_progress(capsys.readouterr().err)
    assert code == 2 and err.startswith("reprostack: error: ") and "micro.yaml:" in err and len(err.splitlines()) == 1
    assert not out.exists()
