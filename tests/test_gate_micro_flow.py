"""run_micro end to end on the CPU with the GPU parts stood in for: host inventory, toolchain, kernel builds
and the one-NCCL check are replaced; the 'interpreter' is a shell script that prints a log per program
(test_ep: the real EP1 log or an EP2 log built here; dense driver, test_intranode: the synthetic fixtures).
Real: sources (local git repos), launch argv, watchdog, parsers, metrics, verdict, report files."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from reprostack import sources
from reprostack.fetch import Cache
from reprostack.gates import micro
from reprostack.lock import load
from reprostack.report import exit_code, validate_report, write_reports
from test_sources import make_stack, write_project

REPO_ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "arms"
EP1_LOG = REPO_ROOT / "results/gate_micro/2026-11-29-h200-ep1-exclude-libs/micro/test_ep.log"
MARKS = (("*", "dispatch", "copy"), ("-", "expanded dispatch", "copy"), ("#", "cached dispatch", "copy"),
         ("@", "combine", "reduce"), ("+", "reduced combine", "reduce"))


def ep2_log() -> str:
    """An EP2 test_ep.py output in its printed shapes (numbers invented)."""
    out = ["Config:", " > Ranks: 1 x 2", " > Experts: 8/256", " > Tokens: 128 (max: 128), hidden: 7168",
           " > #SM: 132, #QPs: 129/129", "", "Running all test cases:",
           " > Testing with do_handle_copy=1, expert_alignment=128, use_fp8_dispatch=1, num_bias=0, "
           "with_previous_event=0, async_with_compute_stream=0, allocate_on_comm_stream=0 ..."]
    for i, (m, phase, aux) in enumerate(MARKS):
        for r in range(2):
            out.append(f"   {m} EP: {r:3}/2 | {phase}: 0 GB/s (SO), {200 + 10 * i + r} GB/s (SU), "
                       f"{20.0 + i + r:.3f} us, 1500000 bytes | {aux}: 800 GB/s, 3.000 us")
    return "\n".join(out) + "\n"


def stand_in_python(tmp_path: Path, test_ep_log: Path, dense_log: Path) -> str:
    p = tmp_path / "py"
    p.write_text("#!/bin/sh\n"
                 f'echo "$@" >> {tmp_path}/calls\n'
                 'case "$*" in\n'
                 f'  *dense_a2a.py*) cat {dense_log} ;;\n'
                 f'  *test_intranode.py*) cat {FIX / "legacy_ep8.log"} ;;\n'
                 f'  *test_ep.py*) cat {test_ep_log} ;;\n'
                 '  *) echo "unexpected: $*"; exit 9 ;;\n'
                 'esac\n')
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    """Patch what needs a GPU; returns a setter for the host's GPU count."""
    host = {"gpu_count": 1, "gpus": [], "efa_devices": []}

    def built(component: str) -> SimpleNamespace:
        out = tmp_path / "builds" / component
        (out / "build" / "lib").mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(component=component, key=f"{component}-key", out=out, reused=True,
                               info={"seconds": 0.0, "version": "2.30.4"}, log=out / "build.log")

    monkeypatch.setattr(micro.hostinfo, "collect", lambda: dict(host, gpus=[{"name": "NVIDIA H200"}] * host["gpu_count"]))
    monkeypatch.setattr(micro.toolchain, "detect", lambda py, arch=None: SimpleNamespace(key_fields=lambda: {"arch": "90"}))
    monkeypatch.setattr(micro.kbuild, "build_nccl", lambda *a, **k: built("nccl"))
    monkeypatch.setattr(micro.kbuild, "build_deepep", lambda *a, **k: built("deepep"))
    monkeypatch.setattr(micro.runtime, "check_one_nccl", lambda *a, **k: {
        "mapped": ["/x/libnccl.so.2.30.4"], "runtime": "2.30.4", "torch_built_with": "2.28.9"})
    return host


def options(tmp_path: Path, python: str, **kw) -> micro.MicroOptions:
    stack = make_stack(tmp_path / "srv")
    root = tmp_path / "project"
    lock = load(write_project(root, stack))
    (root / "gates" / "drivers").mkdir(parents=True, exist_ok=True)
    (root / "gates" / "micro.yaml").write_text((REPO_ROOT / "gates" / "micro.yaml").read_text())
    (root / "gates" / "drivers" / "dense_a2a.py").write_text((REPO_ROOT / "gates/drivers/dense_a2a.py").read_text())
    return micro.MicroOptions(root=root, lock=lock, fetch=sources.FetchOptions(cache=Cache(tmp_path / "cache")),
                              out_dir=tmp_path / "out", python=python, **kw)


def test_ep1_with_dense_arm_passes_on_the_real_log(tmp_path, gpu_host):
    py = stand_in_python(tmp_path, EP1_LOG, FIX / "dense_ep1.log")
    rep = micro.run_micro(options(tmp_path, py, profile="h200-ep1", arms=("deepep", "dense")))
    assert rep.result == "pass", rep.reason
    assert [c.metric for c in rep.checks] == ["ranks_x_phases_missing", "nccl_runtime", "dc_p50_us", "dense_arm_complete"]
    values = {m["metric"]: m["value"] for m in rep.data["metrics"]}
    assert values["dispatch_su_gbs_p50"] == 113 and values["dispatch_su_nvlink_ratio"] == pytest.approx(0.251111)
    assert values["deepep_over_dense_dc"] == pytest.approx(round(14.338 / values["dense_dc_p50_us"], 6))
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "test_ep.py --num-processes 1" in calls[0] and "--nnodes=1 --nproc-per-node=1 --node-rank=0 --master-addr=127.0.0.1" in calls[1]
    assert {a.path for a in rep.artifacts} >= {"micro/test_ep.log", "micro/dense_a2a.log"}
    write_reports([rep], tmp_path / "out", required={"micro"})
    validate_report(json.loads((tmp_path / "out" / "micro.json").read_text()))
    assert "| deepep_over_dense_dc |" in (tmp_path / "out" / "summary.md").read_text()


def test_nvl_ep2_is_detected_runs_every_arm_and_never_passes(tmp_path, gpu_host):
    gpu_host["gpu_count"] = 2
    log = tmp_path / "ep2.log"
    log.write_text(ep2_log())
    py = stand_in_python(tmp_path, log, FIX / "dense_ep2.log")
    rep = micro.run_micro(options(tmp_path, py, arms=("deepep", "dense"), legacy=True))  # profile detected
    assert rep.profile == "h200-nvl-ep2"
    assert rep.result == "fail" and rep.reason == "profile h200-nvl-ep2 has no measured bar yet; numbers reported"
    assert all(c.passed for c in rep.checks[:-1]) and rep.checks[-1].metric == "bars_status"
    assert [c.metric for c in rep.checks] == ["ranks_x_phases_missing", "nccl_runtime", "dense_arm_complete",
                                              "legacy_complete", "bars_status"]
    values = {m["metric"]: m["value"] for m in rep.data["metrics"]}
    assert values["dispatch_p50_us"] == 20.5 and values["combine_su_gbs_p50"] == 230.5
    assert values["combine_su_nvlink_ratio"] == pytest.approx(230.5 / 450, abs=1e-6)
    assert values["legacy_dc_us"] == rep.data["legacy"]["parse"]["dc_us"] and values["dense_dc_p50_us"] > 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "-m torch.distributed.run --nnodes=1 --nproc-per-node=1 --node-rank=0 --master-addr=127.0.0.1" in calls[0]
    assert "test_ep.py --num-processes 2" in calls[0] and "--nproc-per-node=2" in calls[1]
    assert "test_intranode.py --num-processes 2 --num-tokens 128" in calls[2]
    write_reports([rep], tmp_path / "out", required={"micro"})
    assert exit_code([rep], {"micro"}) == 1


def test_test_ep_crash_still_reports_the_dense_arm(tmp_path, gpu_host):
    crash = tmp_path / "crash.log"
    crash.write_text((REPO_ROOT / "tests/fixtures/test_ep/real/h200-ep1-sigsegv-in-dispatch.log").read_text())
    py = stand_in_python(tmp_path, crash, FIX / "dense_ep1.log")
    rep = micro.run_micro(options(tmp_path, py, profile="h200-ep1", arms=("deepep", "dense")))
    assert rep.result == "error" and rep.reason.startswith("sigsegv")
    assert rep.data["dense"]["parse"]["ok"]
    assert {m["metric"] for m in rep.data["metrics"]} >= {"dense_dc_p50_us", "dc_p50_us"}


def test_host_no_profile_fits_is_a_skip_naming_why(tmp_path, gpu_host):
    gpu_host["gpu_count"] = 3  # micro has EP1/2/4/8 profiles and the EFA EP16 one: none for 3 GPUs without EFA
    py = stand_in_python(tmp_path, EP1_LOG, FIX / "dense_ep1.log")
    rep = micro.run_micro(options(tmp_path, py))
    assert (rep.gate, rep.profile, rep.result, rep.checks) == ("micro", "-", "skip", [])
    assert "micro.yaml: no profile for this host (3 GPU(s), EFA: False); pass --profile (known: " in rep.reason
    assert not (tmp_path / "calls").exists()  # nothing was launched
    write_reports([rep], tmp_path / "out", required={"micro"})
    assert exit_code([rep], {"micro"}) == 3

