"""Gate 1's multi-GPU path on the CPU: NVLink profiles and their schema, unmeasured bars never pass, the
per-phase GB/s and NVLink-ratio figures on the real EP1 log, the legacy test_intranode parser (synthetic
fixtures), and the report's measurements table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprostack.errors import GateError
from reprostack.gates import arms, metrics
from reprostack.gates.base import verdict
from reprostack.gates.parsers.legacy_intranode import parse_legacy
from reprostack.gates.parsers.test_ep import parse_test_ep
from reprostack.gates.spec import GateSpecError, load_spec
from reprostack.report import GateReport, evaluate, exit_code, validate_report, write_reports
from test_gate_micro import broken_spec, line_of, spec_error

REPO_ROOT = Path(__file__).resolve().parents[1]
EP1_LOG = REPO_ROOT / "results/gate_micro/2026-11-29-h200-ep1-exclude-libs/micro/test_ep.log"
FIX = Path(__file__).parent / "fixtures" / "arms"
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.fixture(scope="module")
def spec():
    return load_spec(REPO_ROOT, "micro")


# --------------------------------------------------------------------------- profiles


@pytest.mark.parametrize("n", [2, 4, 8])
def test_nvl_profiles(spec, n):
    p = spec.profile(f"h200-nvl-ep{n}")
    assert (p.nodes, p.gpus_per_node, p.ep_size, p.needs_efa, p.launcher) == (1, n, n, False, "torchrun")
    assert p.bars_status == "unmeasured" and not p.measured and p.bars == ()
    assert p.env["EP_DISABLE_GIN"] == "1" and p.gpu_model == "H200"
    assert {**spec.env, **p.env}.items() >= MULTICAST_OFF.items()  # what the process gets: multicast off
    assert p.scale_up_limit_gbs == 450 and "18 links x 25 GB/s" in p.scale_up_limit_source


def test_measured_profiles_keep_their_bars(spec):
    for name in ("p5en-efa-ep16", "h200-ep1"):
        p = spec.profile(name)
        assert p.measured and p.bars and p.scale_up_limit_gbs == 450
    assert spec.dense.script == "gates/drivers/dense_a2a.py" and "--dense-iters" in spec.dense.args
    assert spec.legacy.script == "tests/legacy/test_intranode.py" and spec.legacy.ep_sizes == (2, 4, 8)


def test_spec_measured_profile_needs_a_bar(tmp_path):
    old = "    bars-status: unmeasured\n    bars: []\n  h200-nvl-ep8:"
    p, text = broken_spec(tmp_path, old, "    bars: []\n  h200-nvl-ep8:")
    msg = spec_error(tmp_path)
    assert msg.startswith(f"{p}:") and "profiles.h200-nvl-ep4.bars: [] should be non-empty" in msg


def test_spec_bad_bars_status_and_lonely_limit(tmp_path):
    old = "    bars-status: unmeasured\n    bars: []\n  h200-nvl-ep8:"
    p, text = broken_spec(tmp_path, old, "    bars-status: maybe\n    bars: []\n  h200-nvl-ep8:")
    assert spec_error(tmp_path).startswith(
        f"{p}:{line_of(text, 'bars-status: maybe')}: profiles.h200-nvl-ep4.bars-status: "
    )
    old = '    scale-up-limit-gbs: 450\n    scale-up-limit-source: *nvl4\n    env:\n      EP_DISABLE_GIN: "1"\n      #'
    text = (REPO_ROOT / "gates/micro.yaml").read_text()
    assert text.count(old) == 3
    bad = text.replace(old, '    scale-up-limit-gbs: 450\n    env:\n      EP_DISABLE_GIN: "1"\n      #', 1)
    (tmp_path / "gates/micro.yaml").write_text(bad)
    with pytest.raises(GateSpecError, match=r"profiles\.h200-nvl-ep2: 'scale-up-limit-source' is a dependency"):
        load_spec(tmp_path, "micro")


# --------------------------------------------------------------------------- unmeasured never passes


def _passing_checks():
    return [
        evaluate("ranks_x_phases_missing", "lines", 0, "==", 0),
        evaluate("nccl_runtime", "version", "2.30.4", "==", "2.30.4"),
    ]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_unmeasured_profile_never_passes(spec, n, tmp_path):
    checks = _passing_checks()
    result, reason = verdict(spec.profile(f"h200-nvl-ep{n}"), checks)
    assert result == "fail" and reason == f"profile h200-nvl-ep{n} has no measured bar yet; numbers reported"
    bar = checks[-1]
    assert (bar.metric, bar.value, bar.threshold, bar.passed) == ("bars_status", "unmeasured", "measured", False)
    rep = GateReport(
        "micro",
        f"h200-nvl-ep{n}",
        result,
        reason,
        checks=checks,
        data={"metrics": [{"metric": "dc_p50_us", "unit": "us", "value": 42.0, "note": None}]},
    )
    write_reports([rep], tmp_path, required={"micro"})
    assert exit_code([rep], {"micro"}) == 1
    doc = json.loads((tmp_path / "micro.json").read_text())
    validate_report(doc)
    assert doc["result"] == "fail" and doc["data"]["metrics"][0]["value"] == 42.0


def test_unmeasured_reason_keeps_other_failures(spec):
    checks = _passing_checks() + [
        evaluate("dense_arm_complete", "", False, "==", True, note="done: rank(s) 3 did not finish")
    ]
    result, reason = verdict(spec.profile("h200-nvl-ep2"), checks)
    assert result == "fail" and reason.startswith(
        "profile h200-nvl-ep2 has no measured bar yet; numbers reported; also: "
    )
    assert "dense_arm_complete = False" in reason


def test_measured_profile_passes_on_passing_checks(spec):
    checks = _passing_checks()
    assert verdict(spec.profile("h200-ep1"), checks) == ("pass", "2 check(s) passed") and len(checks) == 2


# --------------------------------------------------------------------------- GB/s and NVLink ratio on the real EP1 log


def test_scale_up_figures_on_the_real_ep1_log(spec):
    parsed = parse_test_ep(EP1_LOG.read_text(), num_ranks=1)
    v = metrics.deepep_metrics(parsed, spec.profile("h200-ep1").scale_up_limit_gbs)
    # the log: dispatch 113 GB/s (SU), cached 185, combine 312, reduced combine 96; SO 0 (one rank)
    assert v["dispatch_su_gbs_p50"] == 113 and v["cached_dispatch_su_gbs_p50"] == 185
    assert v["combine_su_gbs_p50"] == 312 and v["reduced_combine_su_gbs_p50"] == 96
    assert all(v[f"{metrics.slug(p)}_so_gbs_p50"] == 0 for p in parsed.phases)
    assert v["dispatch_su_nvlink_ratio"] == pytest.approx(113 / 450) and v["combine_su_nvlink_ratio"] == pytest.approx(
        312 / 450
    )
    assert v["dispatch_p50_us"] == 8.449 and v["combine_p50_us"] == 5.889 and round(v["dc_p50_us"], 3) == 14.338
    assert metrics.deepep_metrics(parsed, None)["dispatch_su_nvlink_ratio"] is None
    rows = metrics.rows(v, spec.profile("h200-ep1").scale_up_limit_source)
    ratio = next(r for r in rows if r["metric"] == "dispatch_su_nvlink_ratio")
    assert ratio["unit"] == "ratio" and "450 GB/s" in ratio["note"]
    assert {r["unit"] for r in rows if r["metric"].endswith("_gbs_p50")} == {"GB/s"}


def test_measurements_table_in_markdown(spec, tmp_path):
    parsed = parse_test_ep(EP1_LOG.read_text(), num_ranks=1)
    rows = metrics.rows(metrics.deepep_metrics(parsed, 450), "src")
    rep = GateReport("micro", "h200-ep1", "pass", "ok", checks=_passing_checks(), data={"metrics": rows})
    write_reports([rep], tmp_path, required={"micro"})
    md = (tmp_path / "summary.md").read_text()
    assert "### measurements (reported; a bar only where a check above names the metric)" in md
    assert "| dispatch_su_nvlink_ratio | 0.251111 | ratio |" in md


# --------------------------------------------------------------------------- legacy test_intranode


def test_legacy_ep8_complete():
    p = parse_legacy((FIX / "legacy_ep8.log").read_text())
    assert p.ok, p.problems
    assert p.config == {"num_tokens": 128, "hidden": 7168, "num_topk": 8} and p.layout_ms == 0.011
    assert (p.tests_run, p.tests_passed) == (24, 24)
    assert list(p.sections) == ["dispatch (FP8)", "dispatch (BF16)", "combine"]
    fp8, comb = p.sections["dispatch (FP8)"], p.sections["combine"]
    assert fp8["sweep_points"] == 16 and comb["sweep_points"] == 17 and fp8["default"] is not None
    best_line = next(ln for ln in (FIX / "legacy_ep8.log").read_text().splitlines() if "Best combine" in ln)
    assert f"t: {comb['best']['us']:.2f} us" in best_line and f"NVL chunk {comb['best']['nvl_chunk']}:" in best_line
    assert p.dc_us == pytest.approx(fp8["best"]["us"] + comb["best"]["us"]) and p.dc_basis.startswith(
        "best dispatch (FP8)"
    )
    v = metrics.legacy_metrics(p)
    assert v["legacy_dispatch_fp8_us"] == fp8["best"]["us"] and v["legacy_dc_us"] == p.dc_us
    assert v["legacy_combine_gbs"] == comb["best"]["gbs"]


def test_legacy_crash_is_incomplete():
    p = parse_legacy((FIX / "legacy_ep8_crash.log").read_text())
    assert not p.complete and p.dc_us is None
    assert "`Best combine` line missing" in p.problems
    assert "4 tuning line(s) after the last `Best` line (sweep cut short)" in p.problems


def test_legacy_without_fp8_uses_bf16():
    text = "\n".join(ln for ln in (FIX / "legacy_ep8.log").read_text().splitlines() if "FP8" not in ln)
    p = parse_legacy(text)
    assert "dispatch (FP8)" not in p.sections and p.dc_basis == "best dispatch (BF16) + best combine"


def test_legacy_request_checks(spec):
    arms.check_request(spec, spec.profile("h200-nvl-ep4"), ("deepep", "dense"), legacy=True)
    with pytest.raises(GateError, match=r"runs at EP 2, 4, 8 only .*legacy.ep-sizes\); profile h200-ep1 is EP1"):
        arms.check_request(spec, spec.profile("h200-ep1"), ("deepep",), legacy=True)
    arms.check_request(spec, spec.profile("h200-ep1"), ("deepep", "dense"), legacy=False)
    assert arms.parse_arms("deepep, dense,deepep") == ("deepep", "dense")
