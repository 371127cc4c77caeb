"""Tests of the report model, writers (JSON/Markdown/JUnit), schema validation and exit codes."""

from __future__ import annotations

import hashlib
import json
import math
import xml.etree.ElementTree as ET

import jsonschema
import pytest

from reprostack.report import (
    GateReport,
    artifact_for,
    decide,
    evaluate,
    exit_code,
    skipped,
    utc_now,
    validate_report,
    validate_summary,
    write_reports,
)


def micro(dc: float | None = 443.6, **kw) -> GateReport:
    checks = [evaluate("dc_p50_us", "us", dc, "<=", 740), evaluate("ranks_complete", "", True, "==", True)]
    result, reason = decide(checks, ran_ok=True)
    return GateReport(
        "micro",
        "ep16-2node",
        result,
        reason,
        checks,
        provenance={"lock_sha256": "ab" * 32, "host": {"gpus": [], "nccl_runtime": "2.30.4"}},
        started=utc_now(),
        ended=utc_now(),
        duration_s=12.5,
        data={"phases_us": {"dispatch": {"p50": 185.4}}},
        **kw,
    )


@pytest.mark.parametrize(
    "value,op,threshold,passed",
    [
        (443.6, "<=", 740, True),
        (740, "<=", 740, True),
        (740.1, "<=", 740, False),
        (1, "<", 1, False),
        (1e9, ">=", 1e9, True),
        (0, ">", 0, False),
        ("efa", "==", "efa", True),
        (None, "<=", 740, False),
        (math.nan, ">=", 0, False),
        ("x", "<", 3, False),
    ],
)
def test_evaluate(value, op, threshold, passed):
    c = evaluate("m", "u", value, op, threshold)
    assert c.passed is passed
    if value is None:
        assert c.note == "no value measured"


def test_evaluate_rejects_unknown_op():
    with pytest.raises(ValueError):
        evaluate("m", "u", 1, "!=", 2)


def test_decide():
    ok, bad = evaluate("a", "us", 1, "<=", 2), evaluate("b", "us", 3, "<=", 2)
    assert decide([ok], True) == ("pass", "1 check(s) passed")
    assert decide([], True)[0] == "fail"  # no evidence is not a pass
    result, reason = decide([ok, bad], True)
    assert result == "fail" and reason == "b = 3 us (needs <= 2)"
    assert decide([ok], False, "sigsegv at line 11") == ("error", "sigsegv at line 11")


def test_result_must_be_known():
    with pytest.raises(ValueError):
        GateReport("micro", "p", "passed")
    with pytest.raises(ValueError):
        skipped("micro", "p", "")


def test_artifact_for(tmp_path):
    f = tmp_path / "logs" / "run.log"
    f.parent.mkdir()
    f.write_bytes(b"hello\n")
    a = artifact_for(f, relative_to=tmp_path)
    assert (a.path, a.sha256, a.bytes) == ("logs/run.log", hashlib.sha256(b"hello\n").hexdigest(), 6)
    assert artifact_for(f).path == str(f)
    with pytest.raises(FileNotFoundError):
        artifact_for(tmp_path / "nope")


def test_write_reports_all_files_valid(tmp_path):
    log = tmp_path / "micro.log"
    log.write_text("x\n")
    good = micro()
    good.artifacts.append(artifact_for(log, relative_to=tmp_path))
    slow = micro(dc=812.25)
    slow.gate, slow.required = "micro-ep8", False
    skip = skipped("vllm", "c4-c8-c32", "no GPU on this host")
    err = GateReport("sglang", "c4", "error", "timeout | killed\nby watchdog", started=utc_now(), ended=utc_now())
    paths = write_reports([good, slow, skip, err], tmp_path / "out")
    assert set(paths) == {
        "micro.json",
        "micro-ep8.json",
        "vllm.json",
        "sglang.json",
        "summary.json",
        "summary.md",
        "junit.xml",
    }
    assert not list((tmp_path / "out").glob("*.tmp"))
    for name in ("micro", "micro-ep8", "vllm", "sglang"):
        validate_report(json.loads(paths[f"{name}.json"].read_text()))
    d = json.loads(paths["micro.json"].read_text())
    assert d["result"] == "pass" and d["checks"][0] == {
        "metric": "dc_p50_us",
        "unit": "us",
        "value": 443.6,
        "op": "<=",
        "threshold": 740,
        "pass": True,
        "note": None,
    }
    assert d["artifacts"][0]["path"] == "micro.log" and GateReport.from_dict(d).to_dict() == d

    summary = json.loads(paths["summary.json"].read_text())
    validate_summary(summary)
    assert summary["exit_code"] == 1  # sglang errored
    assert summary["required"] == ["micro", "sglang", "vllm"] and summary["missing"] == []
    assert [g["result"] for g in summary["gates"]] == ["pass", "fail", "skip", "error"]

    md = paths["summary.md"].read_text()
    assert "| micro | ep16-2node | PASS |" in md and "| micro-ep8 (optional) | ep16-2node | FAIL |" in md
    assert "| dc_p50_us | 812.25 | <= | 740 | us | NO |" in md
    assert "timeout \\| killed by watchdog" in md and "### provenance" in md and "lock_sha256" in md

    suite = ET.parse(paths["junit.xml"]).getroot()
    assert suite.tag == "testsuite" and suite.get("name") == "reprostack"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert {"micro", "micro.dc_p50_us", "micro-ep8.dc_p50_us", "vllm", "sglang"} <= set(cases)
    assert cases["micro"].find("failure") is None and cases["micro.dc_p50_us"].find("failure") is None
    assert cases["micro-ep8"].find("failure") is not None
    assert "812.25" in cases["micro-ep8.dc_p50_us"].find("failure").get("message")
    assert cases["vllm"].find("skipped").get("message") == "no GPU on this host"
    assert cases["sglang"].find("error") is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "8",
        "2",
        "1",
        "1",
    )


def test_non_finite_values_are_written_as_strings(tmp_path):
    r = micro(dc=math.nan)
    r.data["nan"] = math.inf
    paths = write_reports([r], tmp_path)
    d = json.loads(paths["micro.json"].read_text())
    assert d["checks"][0]["value"] == "nan" and d["data"]["nan"] == "inf" and d["result"] == "fail"


def test_invalid_report_is_not_written(tmp_path):
    r = micro()
    r.checks = []  # a "pass" without checks violates the schema
    with pytest.raises(jsonschema.ValidationError):
        write_reports([r], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError):
        write_reports([micro(), micro()], tmp_path / "out")
    bad = micro()
    bad.gate = "summary"
    with pytest.raises(ValueError):
        write_reports([bad], tmp_path / "out")


def test_rewrite_replaces_atomically(tmp_path):
    write_reports([micro(dc=900)], tmp_path)
    write_reports([micro()], tmp_path)
    assert json.loads((tmp_path / "micro.json").read_text())["result"] == "pass"


def test_exit_codes():
    good, skip = micro(), skipped("vllm", "p", "no GPU")
    failed = micro(dc=800)
    assert exit_code([good], {"micro"}) == 0
    assert exit_code([good, skip], {"micro"}) == 0  # vllm not required
    assert exit_code([good, skip], {"micro", "vllm"}) == 3  # a skipped required gate never passes
    assert exit_code([good], {"micro", "vllm"}) == 3  # missing
    assert exit_code([failed, skip], {"micro", "vllm"}) == 1
    assert exit_code([good, skip]) == 3  # None: the reports' own `required` flags
    assert exit_code([], set()) == 3 and exit_code([]) == 3  # nothing required, nothing proven
    err = GateReport("micro", "p", "error", "crash")
    assert exit_code([err], {"micro"}) == 1


def test_summary_records_missing_required(tmp_path):
    paths = write_reports([micro()], tmp_path, required={"micro", "megatron"})
    s = json.loads(paths["summary.json"].read_text())
    assert s["exit_code"] == 3 and s["missing"] == ["megatron"]
    assert "| megatron | | MISSING |" in paths["summary.md"].read_text()


def test_a_skip_is_never_evidence_and_summary_md_shows_no_raw_json(tmp_path):
    """Issue 40 item 8: a SKIP report said `evidence: true` (nothing was measured), and summary.md printed each
    provenance entry as raw JSON (`{"nccl": {"rev": ...}}`). Now a SKIP says evidence false (in its report and in
    summary.json), and the provenance is a Markdown list, one `key.path: value` line per leaf."""
    skip = skipped("vllm", "c4-c8-c32", "no GPU on this host")
    good = micro()
    good.provenance = {
        "lock_sha256": "a" * 64,
        "upstreams": {"nccl": {"rev": "1933fdd6", "tree": "a0dde796"}, "deepep": {"rev": "b306af06"}},
        "host": {"gpus": [{"name": "NVIDIA H200", "bus": "0000:18:00.0"}], "efa": []},
        "project": {"commit": "8bb97a9" + "0" * 33, "dirty": False, "source": "git", "changed": ["a|b", "c"]},
    }
    write_reports([good, skip], tmp_path)
    assert json.loads((tmp_path / "vllm.json").read_text())["evidence"] is False
    assert json.loads((tmp_path / "micro.json").read_text())["evidence"] is True
    by_gate = {g["gate"]: g for g in json.loads((tmp_path / "summary.json").read_text())["gates"]}
    assert (by_gate["vllm"]["evidence"], by_gate["micro"]["evidence"]) == (False, True)
    md = (tmp_path / "summary.md").read_text()
    assert '{"' not in md and "`{" not in md and '["' not in md
    for line in (
        "- `upstreams.nccl.rev`: 1933fdd6",
        "- `host.gpus[0].name`: NVIDIA H200",
        "- `host.efa`: (none)",
        "- `project.dirty`: no",
        "- `project.changed`: a\\|b, c",
    ):
        assert line in md.splitlines(), line
