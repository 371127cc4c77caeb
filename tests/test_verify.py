"""Third-party verification on the real published AIPerf 0.10.0 exports (schema 1.3) in tests/fixtures."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.evidence.verify import (
    AiperfSchemaError,
    ClaimsError,
    load_claims,
    parse_export,
    parse_records,
    run_verify,
)
from reprostack.gates.parsers.aiperf import check_records

ROOT = Path(__file__).resolve().parents[1]
PUB = ROOT / "tests" / "fixtures" / "published-2026-07"
CLAIMS = ROOT / "claims" / "published.yaml"
ARMS = ("vllm-epnc1", "sglang", "trtllm-shim")


def _by_id(results):
    return {r.claim.id: r for r in results}


def test_parser_reads_published_schema_13_with_units():
    ex = parse_export(PUB / "sglang" / "c8" / "profile_export_aiperf.json")
    assert (ex.layout, ex.schema_version, ex.aiperf_version) == ("1.3", "1.3", "0.10.0")
    assert ex.value("output_token_throughput") == (pytest.approx(67.24880243965279), "tokens/sec")
    assert ex.value("output_token_throughput_per_user", "p50") == (pytest.approx(8.544811658539162), "tokens/sec/user")
    assert ex.value("time_to_first_token", "p50") == (pytest.approx(365.0808795), "ms")
    assert ex.value("inter_token_latency", "p50") == (pytest.approx(117.03008094094487), "ms")
    assert ex.request_count == 64 and ex.error_count == 0 and ex.was_cancelled is False
    # input_config / run_info / telemetry are not metrics
    assert "input_config" not in ex.metrics and "telemetry_data" not in ex.metrics


@pytest.mark.parametrize("arm,c32", [("vllm-epnc1", 144.6), ("sglang", 255.2), ("trtllm-shim", 586.7)])
def test_c32_agg_figures_rederived(arm, c32):
    v, unit = parse_export(PUB / arm / "c32" / "profile_export_aiperf.json").value("output_token_throughput")
    assert unit == "tokens/sec" and round(v, 1) == c32


def test_request_counts_per_arm_232_and_records():
    for arm in ARMS:
        counts = [parse_export(PUB / arm / c / "profile_export_aiperf.json").request_count for c in ("c4", "c8", "c32")]
        assert counts == [40, 64, 128]
    for c, n in (("c4", 40), ("c8", 64), ("c32", 128)):
        rc = parse_records(PUB / "trtllm-shim" / c / "profile_export.jsonl")
        assert (rc.total, rc.completed, rc.errors, rc.cancelled) == (n, n, 0, 0)


def test_records_count_errors_and_cancelled(tmp_path):
    src = (PUB / "trtllm-shim" / "c4" / "profile_export.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in src[:5]]
    recs[1]["error"] = {"code": 500, "type": "HTTPError", "message": "boom"}
    recs[2]["error"] = {"code": 500, "type": "HTTPError", "message": "boom"}
    recs[3]["metadata"]["was_cancelled"] = True
    p = tmp_path / "profile_export.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    rc = parse_records(p)
    assert (rc.total, rc.completed, rc.errors, rc.cancelled, rc.error_types) == (5, 2, 2, 1, {"HTTPError": 2})


def _flat_and_legacy(tmp_path):
    """The two older layouts, derived from the published 1.3 export (same metric objects, different envelope)."""
    d = json.loads((PUB / "sglang" / "c8" / "profile_export_aiperf.json").read_text())
    skip = {
        "schema_version",
        "aiperf_version",
        "benchmark_id",
        "input_config",
        "run_info",
        "telemetry_data",
        "was_cancelled",
        "error_summary",
        "start_time",
        "end_time",
    }
    metrics = {k: v for k, v in d.items() if k not in skip}
    flat = dict(
        metrics,
        input_config=d["input_config"],
        execution_metadata={"was_cancelled": False, "error_summary": [{"error_details": {"code": 500}, "count": 3}]},
        ai_perf_v1={k: {"tag": k, "header": k} for k in metrics},
    )
    legacy = {
        "input_config": d["input_config"],
        "was_cancelled": False,
        "error_summary": [],
        "records": {k: dict(v, tag=k, header=k) for k, v in metrics.items()},
    }
    v10 = dict(metrics, schema_version="1.0", error_summary=[])
    out = {}
    for name, data in (("flat", flat), ("legacy", legacy), ("v10", v10)):
        p = tmp_path / name / "profile_export_aiperf.json"
        p.parent.mkdir()
        p.write_text(json.dumps(data))
        out[name] = p
    return out


def test_flat_and_legacy_layouts(tmp_path):
    files = _flat_and_legacy(tmp_path)
    for name, layout, errors in (("flat", "flat-1.0", 3), ("legacy", "legacy-records", 0), ("v10", "flat-1.0", 0)):
        ex = parse_export(files[name])
        assert ex.layout == layout and ex.error_count == errors
        assert ex.value("output_token_throughput") == (pytest.approx(67.24880243965279), "tokens/sec")
        assert ex.value("time_to_first_token", "p50")[1] == "ms" and ex.request_count == 64


def test_unsupported_schema_is_a_clear_error(tmp_path):
    d = json.loads((PUB / "vllm-epnc1" / "c4" / "profile_export_aiperf.json").read_text())
    d["schema_version"] = "2.0"
    p = tmp_path / "vllm-epnc1" / "c4" / "profile_export_aiperf.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(d))
    with pytest.raises(AiperfSchemaError, match=r"schema_version '2\.0' .*not supported; supported: 1\.0, 1\.3"):
        parse_export(p)
    with pytest.raises(AiperfSchemaError, match="not an AIPerf export layout"):
        (tmp_path / "x.json").write_text("{}")
        parse_export(tmp_path / "x.json")
    # in verify: the claim is an error naming file and version, exit 2
    out = tmp_path / "out"
    assert cli.main(["verify", str(tmp_path), str(PUB), "--out", str(out)]) == 2
    assert json.loads((out / "verify.json").read_text())["exit_code"] == 2
    r = _by_id(run_verify([tmp_path, PUB], CLAIMS, out)[1])
    assert r["vllm-epnc1.c4.agg"].verdict == "error" and "'2.0'" in r["vllm-epnc1.c4.agg"].detail
    assert r["sglang.c32.agg"].verdict == "match"  # other arms come from the second DIR


def test_published_fixtures_all_match_and_6723_surfaced(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["verify", str(PUB), "--out", str(out)]) == 0
    data = json.loads((out / "verify.json").read_text())
    verdicts = {r["claim"]["id"]: r["verdict"] for r in data["results"]}
    assert verdicts.pop("sglang.c8.agg.alt") == "ambiguous"
    assert set(verdicts.values()) == {"match"}
    for cid in ("vllm-epnc1.c32.agg", "sglang.c32.agg", "trtllm-shim.c32.agg", "sglang.c8.agg"):
        assert cid in verdicts
    assert {verdicts[f"{a}.requests"] for a in ARMS} == {"match"}
    md = (out / "verify.md").read_text()
    assert "| claim | published | recomputed | ratio | reproduced by | verdict |" in md
    row67 = [l for l in md.splitlines() if "sglang.c8.agg" in l]
    assert len(row67) == 2 and any("67.2 tokens/sec" in l and "| match |" in l for l in row67)
    assert any("67.3 tokens/sec" in l and "**ambiguous**" in l and "67.2488" in l for l in row67)
    assert "sglang.c8.agg.alt: AMBIGUOUS" in capsys.readouterr().err
    assert not list(out.glob(".*.tmp"))


def test_missing_artifact(tmp_path):
    d = tmp_path / "pub"
    shutil.copytree(PUB, d)
    (d / "trtllm-shim" / "c32" / "profile_export.jsonl").unlink()
    (d / "vllm-epnc1" / "c8" / "profile_export_aiperf.json").unlink()
    out = tmp_path / "out"
    assert cli.main(["verify", str(d), "--out", str(out)]) == 3
    r = {x["claim"]["id"]: x for x in json.loads((out / "verify.json").read_text())["results"]}
    assert r["vllm-epnc1.c8.agg"]["verdict"] == "artifact missing"
    assert r["vllm-epnc1.requests"]["verdict"] == "artifact missing"  # never summed from 2 of 3 cells
    assert "vllm-epnc1/c8/profile_export_aiperf.json" in r["vllm-epnc1.c8.agg"]["detail"]
    assert r["trtllm-shim.completed.records"]["verdict"] == "artifact missing"
    # the aggregates of trtllm-shim/c32 are there, but the records that check them are not (issue 27 item 5)
    assert r["trtllm-shim.requests"]["verdict"] == "artifact missing"
    assert "trtllm-shim/c32/profile_export.jsonl is missing" in r["trtllm-shim.requests"]["detail"]
    assert r["trtllm-shim.c4.agg"]["verdict"] == "match"


def test_tampered_number_is_a_mismatch(tmp_path):
    d = tmp_path / "pub"
    shutil.copytree(PUB, d)
    p = d / "trtllm-shim" / "c32" / "profile_export_aiperf.json"
    text = p.read_text()
    assert '"avg": 586.6902013375798' in text
    p.write_text(text.replace('"avg": 586.6902013375798', '"avg": 586.6402013375798'))  # 586.64 rounds to 586.6
    jl = d / "sglang" / "c8" / "profile_export_aiperf.json"
    jl.write_text(jl.read_text().replace('"avg": 67.24880243965279', '"avg": 67.1488'))  # beyond one step of 67.3
    out = tmp_path / "out"
    assert cli.main(["verify", str(d), "--out", str(out)]) == 1
    r = {x["claim"]["id"]: x for x in json.loads((out / "verify.json").read_text())["results"]}
    assert r["trtllm-shim.c32.agg"]["verdict"] == "mismatch"
    assert r["trtllm-shim.c32.agg"]["recomputed"] == pytest.approx(586.6402013375798)
    assert r["sglang.c8.agg.alt"]["verdict"] == "mismatch"  # a declared ambiguity does not hide a real change
    assert r["sglang.c8.agg"]["verdict"] == "mismatch"
    assert "**mismatch**" in (out / "verify.md").read_text()


def test_every_claim_value_is_printed_in_its_source_document():
    for c in load_claims(CLAIMS):
        text = (ROOT / c.source).read_text()
        shown = str(int(c.value)) if c.rounding >= 1 else f"{c.value:.1f}"
        assert re.search(rf"(?<![\d.]){re.escape(shown)}(?![\d])", text), (c.id, shown, c.source)
    ids = {c.id for c in load_claims(CLAIMS)}
    assert {f"{a}.{c}.agg" for a in ARMS for c in ("c4", "c8", "c32")} <= ids


def test_claims_file_errors_name_file_and_line(tmp_path):
    p = tmp_path / "claims.yaml"
    p.write_text(CLAIMS.read_text().replace("    rounding: 0.1\n", "    rounding: -1\n", 1))
    with pytest.raises(ClaimsError, match=r"claims\.yaml:\d+: claims\[0\]\.rounding"):
        load_claims(p)
    assert cli.main(["verify", str(PUB), "--claims", str(p), "--out", str(tmp_path / "o")]) == 2


def test_html_page_plots_agg_tok_s_per_arm_published_vs_recomputed(tmp_path):
    from reprostack.evidence.verify.html import _series

    rc, results, written = run_verify([PUB], CLAIMS, tmp_path)
    assert rc == 0 and set(written) == {"verify.json", "verify.md", "verify.html"}
    page = written["verify.html"].read_text()
    assert page.count("<svg") == 1 and "agg output tok/s vs concurrency" in page
    for arm in ("vllm-epnc1", "sglang", "trtllm-shim"):
        assert f"{arm} published" in page and f"{arm} recomputed" in page
    assert "ambiguous" in page and "67.3" in page  # the double-published figure is in the table, not hidden
    s = _series(results)
    assert [x for x, _ in s["sglang"]["published"]] == [4, 8, 32]
    assert s["sglang"]["published"][1] == (8, 67.2)  # the primary figure; 67.3 is the declared ambiguity
    assert abs(s["trtllm-shim"]["recomputed"][2][1] - 586.69) < 0.01


# --- the raw records against the aggregate (profile_export.jsonl beside profile_export_aiperf.json) ---


def _tampered(tmp_path, cell: str, edit) -> tuple[int, dict]:
    """Copy the published fixtures, let `edit(records)` change trtllm-shim/<cell>/profile_export.jsonl (a list of
    parsed records, edited in place), run `reprostack verify` on the copy; (exit code, results by id)."""
    d = tmp_path / "pub"
    shutil.copytree(PUB, d)
    p = d / "trtllm-shim" / cell / "profile_export.jsonl"
    recs = [json.loads(x) for x in p.read_text().splitlines()]
    edit(recs)
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "out"
    rc = cli.main(["verify", str(d), "--out", str(out)])
    return rc, {x["claim"]["id"]: x for x in json.loads((out / "verify.json").read_text())["results"]}


def test_published_records_agree_with_their_aggregates():
    for c in ("c4", "c8", "c32"):
        d = PUB / "trtllm-shim" / c
        assert check_records(d / "profile_export_aiperf.json", d / "profile_export.jsonl") == []


def test_a_dropped_record_is_a_mismatch(tmp_path):
    rc, r = _tampered(tmp_path, "c8", lambda recs: recs.pop(17))
    assert rc == 1
    detail = r["trtllm-shim.c8.agg"]["detail"]
    assert r["trtllm-shim.c8.agg"]["verdict"] == "mismatch"
    assert detail.startswith(
        "raw records contradict the aggregate: profile_export.jsonl has 63 records, the aggregate says 64"
    )
    # every claim recomputed from that folder is held to it; the other cells are untouched
    assert r["trtllm-shim.requests"]["verdict"] == "mismatch" and r["trtllm-shim.c4.agg"]["verdict"] == "match"


def test_a_cancelled_record_is_a_mismatch(tmp_path):
    def cancel(recs):
        recs[6]["metadata"]["was_cancelled"] = True

    rc, r = _tampered(tmp_path, "c4", cancel)
    assert rc == 1 and r["trtllm-shim.c4.agg"]["verdict"] == "mismatch"
    assert (
        "profile_export.jsonl: 1 record cancelled (line 7); the aggregate counts 0 errors"
        in r["trtllm-shim.c4.agg"]["detail"]
    )


def test_an_errored_record_is_a_mismatch(tmp_path):
    def fail(recs):
        recs[0]["error"] = {"code": 500, "type": "HTTPError", "message": "boom"}

    rc, r = _tampered(tmp_path, "c32", fail)
    assert rc == 1
    assert "1 record errored (line 1); the aggregate counts 0 errors" in r["trtllm-shim.c32.agg"]["detail"]
    assert r["trtllm-shim.errors"]["verdict"] == "mismatch"


def test_a_changed_value_is_a_mismatch_naming_the_statistic(tmp_path):
    def slower(recs):
        recs[3]["metrics"]["time_to_first_token"]["value"] += 40.0

    rc, r = _tampered(tmp_path, "c4", slower)
    assert rc == 1
    detail = r["trtllm-shim.c4.agg"]["detail"]
    assert re.search(r"recomputed avg time_to_first_token 1123\.7\d* ms vs aggregate 1122\.7\d* ms", detail), detail
    assert r["trtllm-shim.c4.agg"]["recomputed"] == pytest.approx(66.46206595635347)  # the claimed figure itself

    # a latency made longer: the duration (AIPerf's: start + request_latency) and the throughputs disagree
    def later(recs):
        last = max(
            recs, key=lambda x: x["metadata"]["request_start_ns"] + x["metrics"]["request_latency"]["value"] * 1e6
        )
        last["metrics"]["request_latency"]["value"] += 2000.0

    rc, r = _tampered(tmp_path / "t2", "c4", later)
    d = tmp_path / "t2" / "pub" / "trtllm-shim" / "c4"
    why = check_records(d / "profile_export_aiperf.json", d / "profile_export.jsonl")
    assert rc == 1 and "recomputed benchmark_duration 79.0364 sec vs aggregate 77.0364 sec" in why, why

    # an end stamp moved alone: no aggregate reads it, but the record contradicts itself
    def stamp(recs):
        recs[-1]["metadata"]["request_end_ns"] += 2_000_000_000

    rc, r = _tampered(tmp_path / "t3", "c4", stamp)
    detail = r["trtllm-shim.c4.agg"]["detail"]
    assert rc == 1 and "request_end_ns disagrees with request_start_ns + request_latency on 1 record" in detail, detail
    assert "+2000.000 ms" in detail


def test_unreadable_records_beside_an_aggregate_are_an_error(tmp_path):
    def garble(recs):
        recs[2]["metrics"]["request_latency"] = {"value": "slow", "unit": "ms"}

    rc, r = _tampered(tmp_path, "c8", garble)
    assert rc == 2 and r["trtllm-shim.c8.agg"]["verdict"] == "error"
    assert r["trtllm-shim.c8.agg"]["detail"].endswith(
        "trtllm-shim/c8/profile_export.jsonl:3: metrics.request_latency.value is a string with unit 'ms', "
        "expected a number and a unit"
    )


@pytest.mark.parametrize("artifact", ["/etc/passwd", "../outside/profile_export_aiperf.json", "c4/../../x.json"])
def test_a_claim_artifact_outside_the_folder_is_refused(tmp_path, artifact):
    """A claims file whose artifacts point out of the folder given to verify (absolute, `..`) made an empty folder
    verify 17 claims against files elsewhere (hostile trial, issue 14): now the claims file is refused, FILE:LINE."""
    from reprostack import cli

    claims = Path(__file__).resolve().parents[1] / "claims" / "published.yaml"
    text = claims.read_text()
    first = text.split("artifacts:", 1)[1].split("\n", 1)[0]
    bad = tmp_path / "claims.yaml"
    bad.write_text(text.replace("artifacts:" + first, f"artifacts: [{artifact!r}]", 1))
    assert cli.main(["verify", str(tmp_path), "--claims", str(bad), "--out", str(tmp_path / "out")]) == 2


def test_a_link_out_of_the_folder_is_not_its_artifact(tmp_path):
    from reprostack.evidence.verify.claims import _find

    (tmp_path / "d" / "c4").mkdir(parents=True)
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (tmp_path / "d" / "c4" / "profile_export_aiperf.json").symlink_to(outside)
    assert _find([tmp_path / "d"], ("c4/profile_export_aiperf.json",)) is None


@pytest.mark.parametrize("kind", ["fifo", "dir", "devzero"])
def test_records_that_cannot_be_read_never_let_the_aggregate_stand_alone(tmp_path, kind):
    """A `profile_export.jsonl` that is a FIFO, a folder or a link to /dev/zero silently skipped the records check
    (hostile trial, issue 14): the claim is a mismatch saying so."""
    import os
    import shutil
    from reprostack.evidence.verify.claims import _contradictions

    src = Path(__file__).resolve().parent / "fixtures" / "published-2026-07" / "trtllm-shim" / "c4"
    d = tmp_path / "c4"
    d.mkdir()
    shutil.copy(src / "profile_export_aiperf.json", d)
    raw = d / "profile_export.jsonl"
    if kind == "fifo":
        os.mkfifo(raw)
    elif kind == "dir":
        raw.mkdir()
    else:
        raw.symlink_to("/dev/zero")
    why = _contradictions([d / "profile_export_aiperf.json"], {})
    assert why and "present but not a regular file" in why[0]


def test_verify_names_the_statistic_a_published_figure_is(tmp_path):
    """Issue 16: a figure published as a p50 that is AIPerf's avg is a mismatch saying so; every claim lists the
    statistics that reproduce it (TTFT of the published TRT-LLM c4 export: avg 1122.7 ms, p50 159.7 ms)."""
    from reprostack.evidence.verify.claims import run_verify

    claims = tmp_path / "claims.yaml"
    claims.write_text("""\
schema: 1
claims:
  - id: trtllm.c4.ttft
    gate: trtllm
    arm: trtllm-shim
    cell: c4
    metric: time_to_first_token
    stat: p50
    value: 1122.7
    unit: ms
    rounding: 0.1
    artifacts: [trtllm-shim/c4/profile_export_aiperf.json]
    source: a table that printed AIPerf's avg under p50
  - id: trtllm.c4.itl
    gate: trtllm
    arm: trtllm-shim
    cell: c4
    metric: inter_token_latency
    stat: avg
    value: 51.8
    unit: ms
    rounding: 0.1
    artifacts: [trtllm-shim/c4/profile_export_aiperf.json]
    source: test
""")
    fixtures = Path(__file__).resolve().parent / "fixtures" / "published-2026-07"
    rc, results, written = run_verify([fixtures], claims, tmp_path / "out")
    ttft, itl = results
    assert rc == 1 and ttft.verdict == "mismatch" and ttft.reproduced_by == ("avg",)
    assert ttft.detail == "published 1122.7 = avg 1122.7012, not p50 159.7084"
    assert itl.verdict == "match" and itl.reproduced_by == ("avg", "p50")  # 51.789 and 51.824 both round to 51.8
    data = json.loads(written["verify.json"].read_text())
    assert data["results"][0]["reproduced_by"] == ["avg"] and set(data["results"][0]["statistics"]) >= {
        "avg",
        "p50",
        "p99",
    }
    assert "| avg, p50 | match |" in written["verify.md"].read_text()


# --- issue 27 item 5: records that are missing, of the warm-up phase, or counted twice


def test_a_deleted_records_file_never_lets_an_edited_aggregate_pass(tmp_path):
    """The aggregate of trtllm-shim/c32 edited (its TTFT avg, which the records would contradict) and its
    profile_export.jsonl deleted while c4 and c8 keep theirs: before, every claim read from that aggregate was a
    match and verify exited 0 (deleting the file defeated every record check); now each is `artifact missing`
    naming the file, exit 3."""
    d = tmp_path / "pub"
    shutil.copytree(PUB, d)
    agg = d / "trtllm-shim" / "c32" / "profile_export_aiperf.json"
    data = json.loads(agg.read_text())
    data["time_to_first_token"]["avg"] *= 0.5
    agg.write_text(json.dumps(data))
    assert check_records(agg, agg.parent / "profile_export.jsonl")  # the records would have said so
    (agg.parent / "profile_export.jsonl").unlink()
    out = tmp_path / "out"
    assert cli.main(["verify", str(d), "--out", str(out)]) == 3
    r = {x["claim"]["id"]: x for x in json.loads((out / "verify.json").read_text())["results"]}
    for cid in ("trtllm-shim.c32.agg", "trtllm-shim.requests", "trtllm-shim.errors"):
        assert r[cid]["verdict"] == "artifact missing", (cid, r[cid])
        assert r[cid]["detail"] == (
            "trtllm-shim/c32/profile_export.jsonl is missing while c4, c8 beside it have theirs: the aggregate "
            "cannot be held to its records"
        )
    assert r["trtllm-shim.c32.agg"]["recomputed"] == pytest.approx(586.6902013375798)  # the figure still shown
    assert r["trtllm-shim.c4.agg"]["verdict"] == r["trtllm-shim.c8.agg"]["verdict"] == "match"
    assert r["vllm-epnc1.c32.agg"]["verdict"] == "match"  # an arm published without records is not held to any


def test_every_records_file_of_an_arm_deleted_is_named_by_the_claims_file(tmp_path):
    """No sibling left to compare with: the claims file itself recomputes claims from those records."""
    d = tmp_path / "pub"
    shutil.copytree(PUB, d)
    for c in ("c4", "c8", "c32"):
        (d / "trtllm-shim" / c / "profile_export.jsonl").unlink()
    rc, results, _ = run_verify([d], CLAIMS, tmp_path / "out")
    r = _by_id(results)
    assert rc == 3
    assert r["trtllm-shim.c4.agg"].verdict == "artifact missing"
    assert r["trtllm-shim.c4.agg"].detail == (
        "trtllm-shim/c4/profile_export.jsonl is missing, and the claims file recomputes a claim from it: the "
        "aggregate cannot be held to its records"
    )
    assert r["sglang.c4.agg"].verdict == "match"


def test_a_warm_up_record_is_a_mismatch_naming_its_phase(tmp_path):
    """One record of c4 marked as of AIPerf's warm-up phase (its values unchanged): before, a match (the phase was
    never read); AIPerf drops warm-up records before both the export and the aggregate, so one in the file is
    named, and the profiling records are what is recomputed."""

    def warmup(recs):
        recs[5]["metadata"]["benchmark_phase"] = "warmup"

    rc, r = _tampered(tmp_path, "c4", warmup)
    assert rc == 1 and r["trtllm-shim.c4.agg"]["verdict"] == "mismatch"
    assert r["trtllm-shim.c4.agg"]["detail"].startswith(
        "raw records contradict the aggregate: profile_export.jsonl: 1 record of the 'warmup' phase (line 6); "
        "AIPerf exports and aggregates 'profiling' records only; profile_export.jsonl has 39 records, the "
        "aggregate says 40"
    )
    assert r["trtllm-shim.c8.agg"]["verdict"] == "match"


def test_a_duplicate_request_id_is_a_mismatch_naming_the_lines(tmp_path):
    """Record 8's x_request_id made that of record 4 (nothing else changed): before, a match; now the id and both
    lines are named."""

    def twice(recs):
        recs[7]["metadata"]["x_request_id"] = recs[3]["metadata"]["x_request_id"]

    src = PUB / "trtllm-shim" / "c8" / "profile_export.jsonl"
    rid = json.loads(src.read_text().splitlines()[3])["metadata"]["x_request_id"]
    rc, r = _tampered(tmp_path, "c8", twice)
    assert rc == 1 and r["trtllm-shim.c8.agg"]["verdict"] == "mismatch"
    assert r["trtllm-shim.c8.agg"]["detail"] == (
        f"raw records contradict the aggregate: profile_export.jsonl: 1 request id (x_request_id) on more than one "
        f"record: {rid!r} on lines 4, 8"
    )
    assert r["trtllm-shim.requests"]["verdict"] == "mismatch" and r["trtllm-shim.c4.agg"]["verdict"] == "match"


@pytest.mark.parametrize("key,value", [("benchmark_phase", 1), ("x_request_id", ["a"])])
def test_a_phase_or_request_id_of_the_wrong_type_is_an_error(tmp_path, key, value):
    def bad(recs):
        recs[2]["metadata"][key] = value

    rc, r = _tampered(tmp_path, "c4", bad)
    assert rc == 2 and r["trtllm-shim.c4.agg"]["verdict"] == "error"
    assert r["trtllm-shim.c4.agg"]["detail"].endswith(
        f"trtllm-shim/c4/profile_export.jsonl:3: metadata.{key} is {'a number' if value == 1 else 'an array'}, "
        "expected a string"
    )
