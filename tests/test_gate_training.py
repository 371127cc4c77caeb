"""Training gates 5 (megatron) and 6 (nemo_rl) on the CPU: specs, the parsers on the real H200 logs and on broken
copies of them, checks and bars, the committed result, and skip-is-not-pass on a GPU-less host."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gitrepos as gr
import p5enlog
from reprostack import sources
from reprostack.cli import main as cli_main
from reprostack.fetch import Cache
import gaterun
from reprostack.gates.nemo_rl import nemo_rl_checks
from reprostack.gates.parsers.failure import classify_failure
from reprostack.gates.parsers.training import loss_metrics, parse_megatron, parse_nemo_rl, rel_diff_max
from reprostack.gates.spec import GateSpecError
from reprostack.gates.base import verdict as gate_verdict
from reprostack.evidence.judge.megatron import arm_checks, cross_checks
from reprostack.gates.training_spec import load_training_spec
from reprostack.lock import load
from reprostack.report import GateReport, decide, exit_code, validate_report, write_reports
from test_gate_micro import gpu_less  # noqa: F401  (fixture: PATH without nvidia-smi)
from test_sources import lock_text, make_stack

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN = REPO_ROOT / "results" / "gate_megatron" / "2026-11-29-h200-ep1"
FIXTURES = Path(__file__).parent / "fixtures" / "training"
NCCL_OK = {"runtime": "2.30.4", "pinned": "2.30.4", "mapped": ["/x/libnccl.so.2.30.4"]}


def real(arm: str, run: Path = RUN) -> str:
    return (run / "megatron" / f"{arm}.log").read_text()


def spec_and_profile(profile: str = "h200-ep1"):
    spec = load_training_spec(REPO_ROOT, "megatron")
    return spec, spec.profile(profile)


def verdict(deepep_text: str, alltoall_text: str, profile: str = "h200-ep1") -> tuple[str, list]:
    """The gate's verdict on two arm logs, as the gate computes it after the runs (a profile without a measured
    bar adds its failing `bars_status` check: gates.base.verdict)."""
    spec, prof = spec_and_profile(profile)
    results, checks = {}, []
    for arm, text in (("deepep", deepep_text), ("alltoall", alltoall_text)):
        p = parse_megatron(text, expected_steps=spec.steps)
        results[arm] = {"parse": p}
        checks += arm_checks(spec, prof, arm, p, {}, NCCL_OK)
    checks += cross_checks(spec, prof, results)
    return gate_verdict(prof, checks, "megatron.yaml")[0], checks


def failed(checks) -> set[str]:
    """The failed checks besides `bars_status` (h200-ep1 has no measured bar: that check always fails there)."""
    return {c.metric for c in checks if not c.passed and c.metric != "bars_status"}


# --------------------------------------------------------------------------- specs


def test_real_specs():
    spec, ep1 = spec_and_profile()
    assert (spec.kind, spec.source, spec.steps, spec.kernels) == (
        "megatron-driver",
        "megatron-lm",
        3,
        ("nccl", "deepep"),
    )
    assert spec.deepep_arm == "deepep" and spec.reference_arm == "alltoall"
    assert (REPO_ROOT / spec.driver).is_file() and "--allow-ep1-deepep" in ep1.args
    assert {b.metric for b in ep1.bars} == {"loss_increases", "loss_drop", "grad_norm_min", "arms_loss_rel_diff_max"}
    ep16 = spec.profile("p5en-efa-ep16")
    tx = next(b for b in ep16.bars if b.metric == "efa_tx_gb")
    assert (ep16.needs_efa, tx.arm, tx.op, tx.threshold) == (True, "deepep", ">=", 1)
    rl = load_training_spec(REPO_ROOT, "nemo_rl")
    assert rl.kind == "nemo-rl" and rl.source == "nemo-rl" and "grpo.max_num_steps=3" in rl.command
    assert "policy.megatron_cfg.moe_enable_deepep=true" in rl.command
    assert {b.metric for b in rl.profile("p5en-efa-2x8").bars} == {"rollout_gen_len", "rollout_s", "loss_drop"}


def broken_spec(tmp_path: Path, old: str, new: str) -> tuple[Path, str]:
    text = (REPO_ROOT / "gates" / "megatron.yaml").read_text()
    assert text.count(old) == 1, old
    p = tmp_path / "gates" / "megatron.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text.replace(old, new))
    (tmp_path / "gates" / "drivers").mkdir()
    shutil.copy(REPO_ROOT / "gates" / "drivers" / "megatron_moe.py", tmp_path / "gates" / "drivers")
    return p, text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_spec_bar_for_unknown_arm_names_file_and_line(tmp_path):
    p, text = broken_spec(tmp_path, "- {metric: efa_tx_gb, arm: deepep,", "- {metric: efa_tx_gb, arm: deep-ep,")
    with pytest.raises(GateSpecError) as ei:
        load_training_spec(tmp_path, "megatron")
    assert str(ei.value) == (
        f"{p}:{line_of(text, 'arm: deep-ep')}: profiles.p5en-efa-ep16.bars[3].arm: "
        f"no arm 'deep-ep' (known: deepep, alltoall)"
    )


def test_spec_unknown_metric_and_missing_driver(tmp_path):
    p, text = broken_spec(
        tmp_path,
        'metric: loss_increases, op: "<=", threshold: 0, unit: steps,\n',
        'metric: loss_rises, op: "<=", threshold: 0, unit: steps,\n',
    )
    with pytest.raises(
        GateSpecError, match=rf"^{p}:{line_of(text, 'loss_rises')}: profiles.p5en-efa-ep16.bars\[0\].metric: "
    ):
        load_training_spec(tmp_path, "megatron")
    p, text = broken_spec(tmp_path / "b", "driver: gates/drivers/megatron_moe.py", "driver: gates/drivers/nope.py")
    with pytest.raises(
        GateSpecError, match=rf"^{p}:{line_of(text, 'nope.py')}: driver: gates/drivers/nope.py does not exist"
    ):
        load_training_spec(tmp_path / "b", "megatron")


# --------------------------------------------------------------------------- parser on the real H200 logs


def test_parse_real_deepep_arm():
    p = parse_megatron(real("deepep"), expected_steps=3)
    assert p.complete and p.problems == []
    assert p.losses == [9.176064, 6.098557, 2.217528]
    assert [s.grad_norm for s in p.steps] == [0.709346, 0.770617, 0.838047]
    assert (p.buffer_class, p.buffer_module) == ("ElasticBuffer", "deep_ep.buffers.elastic")
    assert p.dispatcher.startswith("EP1FlexTokenDispatcher base=MoEFlexTokenDispatcher comm=_DeepepManager")
    assert p.init_checksum == -3.1789154359e03 and p.config["arm"] == "flex-deepep" and p.config["experts"] == "128"
    assert p.efa_tx_bytes is None and p.transport == ["node 0: no EFA device"] and p.providers == []
    m = loss_metrics(p)
    assert (m["loss_increases"], m["nonfinite"], m["grad_norm_min"]) == (0, 0, 0.709346)
    assert m["loss_drop"] == pytest.approx(6.958536) and m["tokens_per_s"] == 31906.3


def test_real_run_meets_every_bar_and_fails_only_because_h200_ep1_has_no_reference():
    """Issue 27: h200-ep1's arms bound was set after the run it judged and no accepted run qualifies as a baseline,
    so the profile is `bars-status: unmeasured`: every bar is judged and reported, the result is FAIL naming why."""
    result, checks = verdict(real("deepep"), real("alltoall"))
    assert result == "fail" and len(checks) == 15 and failed(checks) == set()
    diff = next(c for c in checks if c.metric == "arms_loss_rel_diff_max")
    assert diff.value == pytest.approx(abs(6.098557 - 6.098577) / 6.098577)
    status = next(c for c in checks if c.metric == "bars_status")
    assert not status.passed and "no reference yet" in status.note and "3.3e-6" in status.note
    spec, prof = spec_and_profile()
    assert prof.bars_status == "unmeasured" and prof.bars_status_why.startswith("no reference yet")
    # the p5en profile keeps the campaign's published bars only: no bar borrowed from h200-ep1
    assert "arms_loss_rel_diff_max" not in {b.metric for b in spec.profile("p5en-efa-ep16").bars}


def test_committed_report_is_the_pass_it_claims():
    doc = json.loads((RUN / "megatron.json").read_text())
    validate_report(doc)
    assert (doc["gate"], doc["profile"], doc["result"]) == ("megatron", "h200-ep1", "pass")
    assert all(c["pass"] for c in doc["checks"]) and len(doc["checks"]) == 14
    assert doc["provenance"]["upstreams"]["megatron-lm"]["patched_tree"] == "e6183f5ca72f2aca900a801b18ad09392f21f874"
    assert {a: v["transport_evidence"] for a, v in doc["data"]["arms"].items()} == {
        "deepep": "no EFA device",
        "alltoall": "no EFA device",
    }
    assert (
        load(REPO_ROOT / "upstreams.lock").git("megatron-lm").patched_tree
        == doc["provenance"]["upstreams"]["megatron-lm"]["patched_tree"]
    )


def test_first_device_call_deepep_arm_is_a_classified_failure():
    """Before patches/megatron-lm/0001: the PR head calls ElasticBuffer.set_num_sms, which DeepEP V2 lacks."""
    text = real("deepep", RUN / "call1-set_num_sms")
    p = parse_megatron(text, expected_steps=3)
    assert not p.complete and p.steps == [] and "no `done:` line: the run did not finish" in p.problems
    fc = classify_failure(text, 1, False)
    assert fc.kind == "python_exception"
    assert "AttributeError: type object 'ElasticBuffer' has no attribute 'set_num_sms'" in fc.detail
    doc = json.loads((RUN / "call1-set_num_sms" / "megatron.json").read_text())
    assert doc["result"] == "error" and doc["reason"].startswith("deepep arm: python_exception: AttributeError")
    assert [c["pass"] for c in doc["checks"]] == [True] * 5  # the all-to-all arm's checks stood on their own


# --------------------------------------------------------------------------- broken logs


def test_nan_loss_fails():
    bad = real("deepep").replace("loss 6.098557", "loss nan")
    p = parse_megatron(bad, expected_steps=3)
    assert any("step 2: loss is nan" in x for x in p.problems)
    result, checks = verdict(bad, real("alltoall"))
    assert result == "fail" and {
        "deepep.nonfinite",
        "deepep.steps_problems",
        "deepep.loss_drop",
        "arms_loss_rel_diff_max",
    } <= failed(checks)


def test_missing_step_fails():
    text = real("alltoall")
    bad = "\n".join(l for l in text.splitlines() if "step 2/3" not in l)
    p = parse_megatron(bad, expected_steps=3)
    assert not p.complete and "step(s) 2 of 3 missing" in p.problems
    result, checks = verdict(real("deepep"), bad)
    assert result == "fail" and "alltoall.steps_problems" in failed(checks)
    assert next(c for c in checks if c.metric == "arms_loss_rel_diff_max").value is None


def test_loss_going_up_fails():
    bad = real("deepep").replace("loss 2.217528", "loss 7.000000")
    result, checks = verdict(bad, real("alltoall"))
    assert result == "fail" and failed(checks) == {"deepep.loss_increases", "arms_loss_rel_diff_max"}


def test_wrong_buffer_class_fails():
    bad = real("deepep").replace(
        "buffer: ElasticBuffer module=deep_ep.buffers.elastic", "buffer: Buffer module=deep_ep.buffers.legacy"
    )
    result, checks = verdict(bad, real("alltoall"))
    assert result == "fail" and failed(checks) == {"deepep.buffer_class"}
    missing = "\n".join(l for l in real("deepep").splitlines() if "buffer:" not in l)
    assert failed(verdict(missing, real("alltoall"))[1]) == {"deepep.buffer_class"}


def test_zero_or_infinite_grad_norm_fails():
    zero = real("alltoall").replace("grad_norm 0.709346", "grad_norm 0.000000")
    assert failed(verdict(real("deepep"), zero)[1]) == {"alltoall.grad_norm_min"}
    inf = real("alltoall").replace("grad_norm 0.709346", "grad_norm inf")
    assert {"alltoall.grad_norm_min", "alltoall.nonfinite"} <= failed(verdict(real("deepep"), inf)[1])


def test_different_initial_weights_fail():
    bad = real("alltoall").replace("init_checksum: -3.1789154359e+03", "init_checksum: -3.1789154358e+03")
    assert failed(verdict(real("deepep"), bad)[1]) == {"arms_init_checksum_equal"}


def test_duplicate_step_and_wrong_step_count():
    text = real("deepep")
    line = next(l for l in text.splitlines() if "step 3/3" in l)
    p = parse_megatron(text + line + "\n", expected_steps=3)
    assert any("step 3 logged again" in x for x in p.problems)
    p = parse_megatron(text, expected_steps=4)
    assert "the log announces 3 steps, the gate expects 4" in p.problems and not p.complete


def test_efa_profile_needs_tx_bytes():
    """On the EP16 profile the same logs fail: the TX bar has no measured bytes (no EFA device)."""
    result, checks = verdict(real("deepep"), real("alltoall"), profile="p5en-efa-ep16")
    tx = next(c for c in checks if c.metric == "deepep.efa_tx_gb")
    assert result == "fail" and tx.value is None
    assert failed(checks) == {"deepep.efa_tx_gb", "deepep.transport", "alltoall.transport"}  # no rank's NCCL line
    assert not any(c.metric == "alltoall.efa_tx_gb" for c in checks)
    two_nodes = (
        real("deepep").replace(
            "transport: node=0 no EFA device", "transport: node=0 efa_tx_bytes=700000000 source=hw_counters devices=16"
        )
        + "[megatron-moe] transport: node=1 efa_tx_bytes=600000000 source=hw_counters devices=16\n"
        + "NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct\n"
    )
    p = parse_megatron(two_nodes, expected_steps=3)
    assert p.efa_tx_bytes == 1_300_000_000 and p.providers == ["efa"]
    # one provider line proves nothing per rank: every rank of both arms must show its own (test_transport.py)
    assert failed(verdict(two_nodes, real("alltoall"), profile="p5en-efa-ep16")[1]) == {
        "deepep.transport",
        "alltoall.transport",
    }
    ranks = "\n".join(p5enlog.nccl_lines()) + "\n"  # the 16 real p5en ranks' NCCL lines
    assert failed(verdict(two_nodes + ranks, real("alltoall") + ranks, profile="p5en-efa-ep16")[1]) == set()


def test_rel_diff_max():
    assert rel_diff_max([1.0, 2.0], [1.0, 2.2]) == pytest.approx(0.2 / 2.2)
    assert rel_diff_max([1.0], [1.0, 2.0]) is None and rel_diff_max([], []) is None
    assert math.isnan(rel_diff_max([float("nan")], [1.0]))


def test_parser_rejects_bad_step_count():
    with pytest.raises(ValueError, match="expected_steps must be >= 1"):
        parse_megatron("", expected_steps=0)


# --------------------------------------------------------------------------- NeMo-RL (synthetic log in grpo.py's format)


def test_nemo_rl_parser_and_bars():
    spec = load_training_spec(REPO_ROOT, "nemo_rl")
    prof = spec.profile("p5en-efa-2x8")
    bare = (FIXTURES / "nemo_rl_grpo_3steps.log").read_text()
    p = parse_nemo_rl(bare, expected_steps=3)
    assert p.complete and p.problems == [] and p.losses == [0.0412, 0.0275, 0.0198]
    assert [s.rollout_s for s in p.steps] == [412.35, 95.12, 93.8] and p.steps[0].gen_len == 612.5
    checks, _ = nemo_rl_checks(spec, prof, p)  # no rank's NCCL line: the transport is not proven (test_transport.py)
    assert failed(checks) == {"transport"}
    text = bare + "\n".join(p5enlog.nccl_lines()) + "\n"  # the 16 real p5en ranks' lines
    p = parse_nemo_rl(text, expected_steps=3)
    checks, m = nemo_rl_checks(spec, prof, p)
    assert decide(checks, ran_ok=True)[0] == "pass" and m["rollout_line"] == p.steps[0].line
    up = text.replace("• Loss: 0.0198", "• Loss: 0.0500")
    checks, _ = nemo_rl_checks(spec, prof, parse_nemo_rl(up, expected_steps=3))
    assert failed(checks) == {"loss_drop"}
    cut = text[: text.index("===== Step 3/3")]
    p = parse_nemo_rl(cut, expected_steps=3)
    assert not p.complete and "step(s) 3 of 3 missing" in p.problems
    nan = text.replace("• Loss: 0.0275", "• Loss: nan")
    checks, _ = nemo_rl_checks(spec, prof, parse_nemo_rl(nan, expected_steps=3))
    assert {"nonfinite", "steps_problems", "loss_drop"} <= failed(checks)


# --------------------------------------------------------------------------- skip is not pass


def training_project(tmp_path: Path) -> tuple[Path, object]:
    """A project whose lock adds small local `megatron-lm` and `nemo-rl` repos to the test stack."""
    stack = make_stack(tmp_path / "srv")
    extra = {}
    for name in ("megatron-lm", "nemo-rl"):
        repo = gr.init_repo(tmp_path / "srv" / name)
        rev = gr.commit_files(repo, {"README.md": f"{name}\n"}, name)
        extra[name] = (repo, rev, gr.tree_of(repo, rev))
    text = lock_text(stack) + "".join(
        f"  {n}:\n    kind: git\n    url: {r}\n    rev: {rev}\n    tree: {tree}\n"
        for n, (r, rev, tree) in extra.items()
    )
    root = tmp_path / "project"
    (root / "gates").mkdir(parents=True)
    for f in ("megatron.yaml", "nemo_rl.yaml"):
        shutil.copy(REPO_ROOT / "gates" / f, root / "gates" / f)
    shutil.copytree(REPO_ROOT / "gates" / "drivers", root / "gates" / "drivers")
    shutil.copytree(REPO_ROOT / "kernels", root / "kernels")
    (root / "upstreams.lock").write_text(text)
    return root, extra


def test_training_gates_without_gpu_are_skips_and_exit_3(tmp_path, gpu_less):
    root, extra = training_project(tmp_path)
    kw = dict(
        root=root,
        lock=load(root / "upstreams.lock"),
        out_dir=tmp_path / "out",
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
    )
    reps = [gaterun.run(gaterun.options("megatron", **kw)), gaterun.run(gaterun.options("nemo-rl", **kw))]
    assert [(r.gate, r.result, r.checks) for r in reps] == [("megatron", "skip", []), ("nemo_rl", "skip", [])]
    assert reps[0].reason.startswith(
        f"no GPU on this host (nvidia-smi lists none): sources verified (megatron-lm {extra['megatron-lm'][2][:12]})"
    )
    assert "2 nodes x 8 GPUs" in reps[1].reason
    assert reps[0].provenance["upstreams"]["megatron-lm"]["rev"] == extra["megatron-lm"][1]
    assert not (tmp_path / "cache" / "builds").exists()
    write_reports(reps, tmp_path / "out", required={"megatron", "nemo_rl"})
    for g in ("megatron", "nemo_rl"):
        validate_report(json.loads((tmp_path / "out" / f"{g}.json").read_text()))
    assert exit_code(reps, {"megatron", "nemo_rl"}) == 3
    # one skipped required gate among passes still is not a pass
    ok = GateReport("micro", "h200-ep1", "pass", "3 check(s) passed")
    assert exit_code([ok, reps[0]], {"micro", "megatron"}) == 3


def test_cli_gate_megatron_and_unknown_arm(tmp_path, gpu_less, capsys, monkeypatch):
    root, _ = training_project(tmp_path)
    monkeypatch.chdir(root)
    args = ["--lock", str(root / "upstreams.lock"), "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "o")]
    assert cli_main(["gate", "megatron", *args]) == 3
    assert "megatron [-]: SKIP — no GPU" in capsys.readouterr().out
    assert cli_main(["gate", "nemo-rl", *args]) == 3
    assert cli_main(["gate", "megatron", *args, "--arm", "deep-ep"]) == 2
    assert "no arm 'deep-ep' (known: deepep, alltoall)" in capsys.readouterr().err


def test_driver_is_valid_python_and_documents_its_lines():
    src = (REPO_ROOT / "gates" / "drivers" / "megatron_moe.py").read_text()
    compile(src, "megatron_moe.py", "exec")
    for needle in ("step i/N | loss L | grad_norm G", "buffer: <class>", "transport: node=<n>", "done: N steps"):
        assert needle in src
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "gates" / "drivers" / "megatron_moe.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--allow-ep1-deepep" in out.stdout


# --------------------------------------------------------------------------- no pass without the DeepEP arm


@pytest.fixture
def one_h200(tmp_path, monkeypatch, gpu_less):
    """run_megatron on a stood-in one-GPU H200: kernels not built, each arm's run replaced by its real H200 log."""
    from types import SimpleNamespace

    from reprostack.gates import training

    monkeypatch.setattr(
        "reprostack.hostinfo.collect",
        lambda **kw: {"gpu_count": 1, "efa_devices": [], "gpus": [{"name": "NVIDIA H200"}]},
    )

    def kernels(self, st):
        st.data["nccl"] = dict(NCCL_OK, torch_built_with="2.28.9")
        return {}

    def launch_arm(self, st, plan):  # the arm's real H200 log where the output contract puts it; the gate parses it
        log = st.rank_log(plan.name)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(real(plan.name))
        # (outcome, command, env, the maps seen while it ran, the one-NCCL preflight's failure or None)
        return SimpleNamespace(returncode=0, timed_out=False), SimpleNamespace(argv=("torchrun",)), {}, {}, None

    monkeypatch.setattr(training.MegatronGate, "_kernels", kernels)
    monkeypatch.setattr(training.MegatronGate, "_launch_arm", launch_arm)
    root, _ = training_project(tmp_path)
    return lambda arms: gaterun.options(
        "megatron",
        root=root,
        lock=load(root / "upstreams.lock"),
        out_dir=tmp_path / "out",
        fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
        arms=tuple(arms or ()),
    )


def test_megatron_comparison_arm_alone_never_passes(one_h200, measured_h200):
    both = gaterun.run(one_h200(None))
    assert both.result == "pass", both.reason  # the same logs with the DeepEP arm: a pass (bars measured here)
    assert both.data["cross_arm"]["loss_rel_diff_max"] == pytest.approx(abs(6.098557 - 6.098577) / 6.098577)
    rep = gaterun.run(one_h200(["alltoall"]))
    assert rep.result == "skip" and rep.checks and all(c.passed for c in rep.checks)
    assert rep.reason.startswith(
        "arm deepep (the gate's evidence) did not run: only alltoall ran, comparison evidence only"
    ) and rep.reason.endswith("run it with --arm deepep")
    assert exit_code([rep], {"megatron"}) == 3
    assert gaterun.run(one_h200(["deepep"])).result == "pass"


@pytest.fixture
def measured_h200(one_h200, tmp_path):
    """The one_h200 project with its h200-ep1 profile marked measured (the real spec says unmeasured)."""
    spec = tmp_path / "project" / "gates" / "megatron.yaml"
    text = spec.read_text()
    assert text.count("    bars-status: unmeasured\n") == 1
    spec.write_text(text.replace("    bars-status: unmeasured\n", ""))


def test_real_spec_h200_ep1_run_fails_naming_its_missing_reference(one_h200):
    rep = gaterun.run(one_h200(None))
    assert rep.result == "fail" and rep.reason == "profile h200-ep1 has no measured bar yet; numbers reported"
    assert [c.metric for c in rep.checks if not c.passed] == ["bars_status"]
    assert "no reference yet" in rep.checks[-1].note


def test_step_figures_after_the_first_are_the_statistics(one_h200):
    """Issue 16: a training run's steps are repeated samples; step 1 (set-up, JIT) is left out. On the real H200
    log: step_ms 137.9, 128.4 -> mean 133.15, t interval 133.15 -+ 12.7062 * stdev / sqrt(2) = -+ 4.75 * 12.7062."""
    from reprostack.evidence.judge.megatron import step_statistics

    st = step_statistics("deepep", parse_megatron(real("deepep"), expected_steps=3))
    ms = st["deepep.step_ms"]
    assert (ms["n"], ms["samples"], ms["mean"], ms["unit"]) == (2, [137.9, 128.4], 133.15, "ms")
    assert ms["ci95"] == pytest.approx([133.15 - 4.75 * 12.7062, 133.15 + 4.75 * 12.7062])
    assert st["deepep.tokens_per_s"]["samples"] == [29694.9, 31906.3]
    two = parse_megatron(real("deepep"), expected_steps=3)
    two.steps = two.steps[:2]  # one step after the first: no interval, no entry
    assert step_statistics("deepep", two) == {}
    rep = gaterun.run(one_h200(None))
    assert set(rep.data["statistics"]) == {
        "deepep.step_ms",
        "deepep.tokens_per_s",
        "alltoall.step_ms",
        "alltoall.tokens_per_s",
    }
