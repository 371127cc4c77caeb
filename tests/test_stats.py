"""evidence.bars.stats on known data (t intervals computed by hand below), the interval verdict on synthetic trials
whose intervals are known, INCONCLUSIVE in the report model, and its rendering (JSON, Markdown, JUnit)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import jsonschema
import pytest

from reprostack.report import (
    Check,
    GateReport,
    Result,
    decide,
    evaluate,
    evaluate_interval,
    exit_code,
    validate_report,
    write_reports,
)
from reprostack.evidence.bars.stats import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    T975,
    interval_verdict,
    ratios,
    statistics_block,
    summarize,
    t975,
)


def test_t_quantiles_of_the_table_and_between_rows():
    assert (t975(1), t975(4), t975(30), t975(120)) == (12.7062, 2.7764, 2.0423, 1.9799)
    assert t975(35) == T975[30] and t975(100) == T975[60]  # between rows: the lower df's (wider) quantile
    assert t975(10_000) == 1.96
    with pytest.raises(ValueError, match="degrees of freedom must be >= 1"):
        t975(0)


def test_t_interval_of_one_to_five_by_hand():
    # mean 3; sample variance (4+1+0+1+4)/4 = 2.5; half width = t(0.975, 4) * sqrt(2.5) / sqrt(5)
    #  = 2.7764 * sqrt(0.5) = 2.7764 * 0.70710678 = 1.96321126
    s = summarize([1, 2, 3, 4, 5], "us")
    assert (s.n, s.mean, s.p50, s.unit, s.method) == (5, 3.0, 3.0, "us", "t")
    assert s.stdev == pytest.approx(1.58113883, abs=1e-8)
    assert s.ci95 == pytest.approx((1.03678874, 4.96321126), abs=1e-8)


def test_t_interval_of_two_samples_by_hand():
    # mean 11, stdev sqrt(2); half width = 12.7062 * sqrt(2) / sqrt(2) = 12.7062
    s = summarize([10, 12])
    assert s.ci95 == pytest.approx((-1.7062, 23.7062), abs=1e-9)
    assert s.to_dict() == {
        "n": 2,
        "mean": 11.0,
        "p50": 11.0,
        "stdev": pytest.approx(math.sqrt(2)),
        "ci95": [pytest.approx(-1.7062), pytest.approx(23.7062)],
        "samples": [10.0, 12.0],
        "unit": "",
        "method": "t",
    }


def test_constant_trials_have_a_zero_width_interval():
    s = summarize([14.338] * 4)
    assert s.stdev == 0 and s.ci95 == (14.338, 14.338)


def test_one_trial_has_no_interval_and_no_statistics_entry():
    s = summarize([14.36], "us")
    assert (s.n, s.ci95, s.describe()) == (1, None, "one trial: 14.36 us (no interval)")
    assert statistics_block({"dc_p50_us": s, "two": summarize([1, 2])}) == {"two": summarize([1, 2]).to_dict()}


@pytest.mark.parametrize(
    "bad, msg", [([], "no samples"), ([1.0, float("nan")], "non-finite"), ([float("inf"), 1.0], "non-finite")]
)
def test_refused_samples(bad, msg):
    with pytest.raises(ValueError, match=msg):
        summarize(bad)


def test_paired_ratios():
    assert ratios([10, 30], [20, 60]) == [0.5, 0.5]
    with pytest.raises(ValueError, match="differ in number"):
        ratios([1], [1, 2])
    with pytest.raises(ValueError, match="zero or non-finite"):
        ratios([1], [0])


# interval of [1..5] is 3 -+ 2.7764 * sqrt(0.5) = [1.03678874, 4.96321126]
@pytest.mark.parametrize(
    "op, threshold, want",
    [
        ("<=", 5, PASS),
        ("<=", 4.9632, INCONCLUSIVE),
        ("<=", 3, INCONCLUSIVE),
        ("<=", 1.0, FAIL),
        ("<", 4.97, PASS),
        ("<", 1.0368, INCONCLUSIVE),
        (">=", 1.0, PASS),
        (">=", 3, INCONCLUSIVE),
        (">=", 5, FAIL),
        (">", 4.97, FAIL),
        (">", 1.03, PASS),
    ],
)
def test_interval_verdict_on_a_known_interval(op, threshold, want):
    assert interval_verdict(summarize([1, 2, 3, 4, 5]), op, threshold) == want


def test_one_trial_is_inconclusive_whatever_its_value():
    for value in (0.1, 1e9):
        assert interval_verdict(summarize([value]), "<=", 30) == INCONCLUSIVE
    with pytest.raises(ValueError, match="needs <=, <, >= or >"):
        interval_verdict(summarize([1, 2]), "==", 1)


def test_evaluate_interval_and_decide():
    inside = evaluate_interval("dc_p50_us", summarize([1, 2, 3, 4, 5], "us"), "<=", 3, note="bar source")
    assert (inside.passed, inside.inconclusive, inside.value) == (False, True, 3.0)
    assert inside.note == "mean 3.0 us, 95% CI [1.0368, 4.9632] (t, n=5): the interval straddles the bar; bar source"
    clear = evaluate_interval("dc_p50_us", summarize([1, 2, 3, 4, 5], "us"), "<=", 30)
    past = evaluate_interval("dc_p50_us", summarize([1, 2, 3, 4, 5], "us"), "<=", 0.5)
    assert clear.passed and not clear.inconclusive and not past.passed and not past.inconclusive
    ok = evaluate("x", "", 0, "==", 0)
    assert decide([ok, clear], ran_ok=True) == ("pass", "2 check(s) passed")
    result, reason = decide([ok, inside], ran_ok=True)
    assert result == "inconclusive" and reason.startswith("dc_p50_us = 3.0 us (needs <= 3): mean 3.0 us")
    assert decide([inside, past], ran_ok=True)[0] == "fail"  # anything clearly past wins
    assert Check.from_dict(inside.to_dict()) == inside and "inconclusive" not in clear.to_dict()


def _report(result: str, checks, stats=None) -> GateReport:
    return GateReport(
        "micro",
        "h200-ep1",
        result,
        "why",
        checks=checks,
        started="2026-12-02T03:00:00Z",
        ended="2026-12-02T03:01:00Z",
        duration_s=60.0,
        data={"statistics": stats} if stats is not None else {},
    )


def test_inconclusive_report_is_not_a_pass_and_renders_its_statistics(tmp_path):
    s = summarize([14.36, 14.338, 14.725], "us")
    bar = evaluate_interval("dc_p50_us", s, "<=", 14.5)
    rep = _report(Result.INCONCLUSIVE, [bar], statistics_block({"dc_p50_us": s}))
    assert rep.result == "inconclusive" and not rep.proven and rep.label() == "INCONCLUSIVE"
    assert exit_code([rep], {"micro"}) == 1
    write_reports([rep], tmp_path, required={"micro"})
    doc = json.loads((tmp_path / "micro.json").read_text())
    validate_report(doc)
    assert doc["checks"][0]["inconclusive"] is True and doc["data"]["statistics"]["dc_p50_us"]["n"] == 3
    md = (tmp_path / "summary.md").read_text()
    assert "| micro | h200-ep1 | INCONCLUSIVE | why |" in md
    assert "| metric | n | mean | p50 | stdev | 95% CI | unit | method |" in md
    lo, hi = s.ci95
    assert f"| dc_p50_us | 3 | 14.4743 | 14.36 | 0.2174 | [{round(lo, 4)}, {round(hi, 4)}] | us | t |" in md
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    case = suite.find("testcase[@name='micro']")
    assert case.find("failure").get("type") == "inconclusive" and suite.get("failures") == "2"
    props = {p.get("name"): p.get("value") for p in case.find("properties")}
    assert props["dc_p50_us.n"] == "3" and props["dc_p50_us.method"] == "t"
    assert props["dc_p50_us.ci95"] == f"{lo} {hi}"
    assert suite.find("testcase[@name='micro.dc_p50_us']/failure").get("type") == "inconclusive"


@pytest.mark.parametrize(
    "bad",
    [
        {
            "n": 1,
            "mean": 1.0,
            "p50": 1.0,
            "stdev": 0.0,
            "ci95": [1.0, 1.0],
            "samples": [1.0],
            "unit": "us",
            "method": "t",
        },
        {
            "n": 2,
            "mean": 1.0,
            "p50": 1.0,
            "stdev": 0.0,
            "ci95": [1.0],
            "samples": [1.0, 1.0],
            "unit": "us",
            "method": "t",
        },
        {
            "n": 2,
            "mean": 1.0,
            "p50": 1.0,
            "stdev": 0.0,
            "ci95": [1.0, 1.0],
            "samples": [1.0, 1.0],
            "unit": "us",
            "method": "guess",
        },
    ],
)
def test_schema_refuses_a_statistics_entry_off_the_contract(bad):
    doc = _report("fail", [evaluate("x", "", 1, "==", 0)], {"dc_p50_us": bad}).to_dict()
    with pytest.raises(jsonschema.ValidationError):
        validate_report(doc)
