"""scripts/claims_from_run.py: claims generated from a run's raw AIPerf exports, which `reprostack verify` then
re-derives. On the published fixtures the generated figures are the published ones (claims/published.yaml) and
verify matches every one; a changed export is a mismatch; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprostack.evidence.verify.claims import load_claims

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "claims_from_run.py"
PUBLISHED = REPO / "tests" / "fixtures" / "published-2026-07"


def gen(run: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(run), "--id-prefix", "t", "--gate", "vllm", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def verify(run: Path, claims: Path, out: Path) -> tuple[int, dict]:
    p = subprocess.run(
        [sys.executable, "-m", "reprostack", "verify", str(run), "--claims", str(claims), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return p.returncode, json.loads((out / "verify.json").read_text())


def test_on_the_published_exports_the_generated_figures_are_the_published_ones(tmp_path):
    out = tmp_path / "claims.yaml"
    p = gen(PUBLISHED, out, "--rounding", "0.1")
    assert p.returncode == 0, p.stderr
    mine = {(c.arm, c.cell, c.metric): c for c in load_claims(out)}
    published = [c for c in load_claims(REPO / "claims" / "published.yaml") if c.metric == "output_token_throughput"]
    assert len(published) == 10  # 9 cells and sglang c8's second printing (67.3, a declared ambiguity)
    for c in published:
        if not c.ambiguity:
            assert mine[(c.arm, c.cell, c.metric)].value == c.value, c.id
    assert mine[("sglang", "c8", "output_token_throughput")].value == 67.2  # 67.2488: the published base figure
    assert mine[("vllm-epnc1", "c32+c4+c8", "request_count")].value == 232
    assert mine[("vllm-epnc1", "c32+c4+c8", "error_count")].value == 0
    assert mine[("trtllm-shim", "c32+c4+c8", "completed_requests")].value == 232  # the one arm with records
    code, rep = verify(PUBLISHED, out, tmp_path / "v")
    assert code == 0 and {r["verdict"] for r in rep["results"]} == {"match"}


def test_a_changed_export_is_a_mismatch(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(PUBLISHED / "vllm-epnc1", run / "vllm-epnc1")
    out = tmp_path / "claims.yaml"
    assert gen(run, out).returncode == 0
    f = run / "vllm-epnc1" / "c4" / "profile_export_aiperf.json"
    data = json.loads(f.read_text())
    data["output_token_throughput"]["avg"] *= 1.01
    f.write_text(json.dumps(data))
    code, rep = verify(run, out, tmp_path / "v")
    by = {r["claim"]["id"]: r["verdict"] for r in rep["results"]}
    assert code == 1 and by["t.vllm-epnc1.c4.agg"] == "mismatch" and by["t.vllm-epnc1.c8.agg"] == "match"


@pytest.mark.parametrize(
    "layout, says",
    [
        ({}, "no profile_export_aiperf.json under it"),
        ({"a/b/c/d/e/profile_export_aiperf.json": "{}"}, "not in a layout this script knows"),
        ({"arm/c1/profile_export_aiperf.json": "{not json"}, "arm/c1/profile_export_aiperf.json: "),
    ],
)
def test_bad_runs_are_one_line_and_write_nothing(tmp_path, layout, says):
    run = tmp_path / "run"
    run.mkdir()
    for rel, text in layout.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    out = tmp_path / "claims.yaml"
    p = gen(run, out)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr
    assert not out.exists()


def test_a_report_that_states_a_figure_with_no_export_is_refused(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(PUBLISHED / "vllm-epnc1", run / "vllm-epnc1")
    cells = [{"cell": c, "agg_tok_s": 1.0, "request_count": 40, "errors": 0} for c in ("c4", "c8", "c32", "c64")]
    report = tmp_path / "vllm.json"
    report.write_text(json.dumps({"data": {"arms": {"vllm-epnc1": {"cells": cells}}}}))
    p = gen(run, tmp_path / "claims.yaml", "--report", str(report))
    assert p.returncode == 2 and "states figures with no export under" in p.stderr and "vllm-epnc1/c64/1" in p.stderr
    report.write_text(json.dumps({"data": {"arms": {"vllm-epnc1": {"cells": cells[:2]}}}}))
    p = gen(run, tmp_path / "claims.yaml", "--report", str(report))
    assert p.returncode == 2 and "states no agg tok/s for vllm-epnc1/c32/1" in p.stderr


H200_VLLM = REPO / "results" / "gate_vllm" / "2026-12-03-h200-ep1" / "run"


def test_the_h200_vllm_run_verifies_and_its_committed_claims_are_what_generation_gives(tmp_path):
    """The first real engine run (vLLM 0.24.0 on the lent H200): its 9 AIPerf profile runs' records agree with their
    aggregates (benchmark_duration as AIPerf 0.10.0 computes it: start + request_latency, the last record's
    request_end_ns is later), and claims/h200-ep1-vllm.yaml is what the script writes from the report."""
    out = tmp_path / "claims.yaml"
    p = gen(H200_VLLM, out, "--report", str(H200_VLLM / "vllm.json"), "--id-prefix", "h200-ep1.vllm")
    assert p.returncode == 0, p.stderr
    mine = [(c.id, c.value) for c in load_claims(out)]
    assert mine == [(c.id, c.value) for c in load_claims(REPO / "claims" / "h200-ep1-vllm.yaml")]
    code, rep = verify(H200_VLLM, REPO / "claims" / "h200-ep1-vllm.yaml", tmp_path / "v")
    assert code == 0 and len(rep["results"]) == 11 and {r["verdict"] for r in rep["results"]} == {"match"}


def test_an_edited_record_of_the_h200_run_is_a_mismatch(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(H200_VLLM, run)
    f = run / "vllm" / "allgather" / "c4" / "aiperf" / "profile_runs" / "run_0002" / "profile_export.jsonl"
    lines = f.read_text().splitlines()
    rec = json.loads(lines[-1])
    rec["metrics"]["request_latency"]["value"] += 5.0  # 5 ms longer: the last response later than the aggregate's
    f.write_text("\n".join([*lines[:-1], json.dumps(rec)]) + "\n")
    code, rep = verify(run, REPO / "claims" / "h200-ep1-vllm.yaml", tmp_path / "v")
    by = {r["claim"]["id"]: r for r in rep["results"]}
    assert code == 1 and by["h200-ep1.vllm.allgather.c4.run2.agg"]["verdict"] == "mismatch"
    assert by["h200-ep1.vllm.allgather.c1.run1.agg"]["verdict"] == "match"
