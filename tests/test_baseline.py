"""Bars from a baseline (reprostack.evidence.bars.baseline, gates.spec.resolve_bars): the h200-ep1 micro bar is made from the
accepted committed runs and can fail; a baseline run is untrusted input (one line naming it, never a threshold made of
the rest); `--baseline DIR` takes the accepted runs under a folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reprostack.gates.spec import load_spec, resolve_bars
from reprostack.report import evaluate_interval
from reprostack.evidence.bars.baseline import BaselineError, accepted_runs, baseline
from reprostack.evidence.bars.stats import summarize

REPO = Path(__file__).resolve().parents[1]
K5 = "results/gate_micro/2026-12-02-h200-ep1-k5/micro.json"


def test_the_h200_bar_is_the_median_of_the_accepted_runs_and_can_fail():
    spec = load_spec(REPO, "micro")
    prof = resolve_bars(spec, spec.profile("h200-ep1"), root=REPO)
    (bar,) = prof.bars
    means = bar.baseline.means
    assert len(means) == 15 and min(means) > 14.4 and max(means) < 14.75
    assert bar.threshold == round(sorted(means)[7] * 1.07, 4)  # the median of 15 runs x (1 + 7%)
    assert "baseline: median 14.59 us of 15 accepted run(s)" in bar.reference and K5 in bar.reference

    def judged(samples):
        return evaluate_interval(bar.metric, summarize(samples, "us"), bar.op, bar.threshold, note=bar.reference)

    slowest = [14.70, 14.74, 14.78, 14.72, 14.76]  # the slowest machine seen: passes
    assert judged(slowest).passed
    ten_pct = [x * 1.10 for x in [14.57, 14.59, 14.61, 14.58, 14.60]]  # 10% slower: wholly past the bar
    c = judged(ten_pct)
    assert not c.passed and not c.inconclusive
    straddle = [15.4, 15.9, 15.5, 15.8, 15.6]  # straddles it: never a pass
    assert judged(straddle).inconclusive


def write(root: Path, rel: str, doc) -> str:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return rel


def report(mean=14.5, n=5, **kw) -> dict:
    d = {
        "gate": "micro",
        "profile": "h200-ep1",
        "result": "pass",
        "provenance": {"stack": "campaign", "host": {"gpus": [{"name": "NVIDIA H200"}]}},
        "data": {"statistics": {"dc_p50_us": {"mean": mean, "n": n}}},
    }
    for k, v in kw.items():
        d[k] = v
    return d


@pytest.mark.parametrize(
    "rel, doc, why",
    [
        ("../outside.json", None, "a path inside the project"),
        ("/etc/passwd", None, "a path inside the project"),
        ("r/none.json", None, "not a file"),
        ("r/text.json", "not json", "r/text.json"),
        ("r/list.json", [1], "r/list.json"),
        ("r/fail.json", report(result="fail"), "result 'fail'"),
        ("r/other.json", report(gate="vllm"), "is gate 'vllm'"),
        ("r/ep8.json", report(profile="h200-nvl-ep8"), "profile 'h200-nvl-ep8'"),
        ("r/stack.json", report(provenance={"stack": "gin-gdaki"}), "ran on stack 'gin-gdaki'"),
        ("r/n1.json", report(n=1), "n is 1"),
        ("r/nan.json", report(mean="14"), "not a finite positive number"),
        ("r/nostats.json", report(data={}), "has no data.statistics.dc_p50_us"),
        ("r/stand-in.json", report(evidence=False), "never an accepted run"),
    ],
)
def test_a_baseline_run_that_cannot_be_used_is_one_line(tmp_path, rel, doc, why):
    if doc is not None:
        write(tmp_path, rel, doc)
    good = write(tmp_path, "r/good.json", report())
    with pytest.raises(BaselineError) as e:
        baseline(
            tmp_path,
            [good, rel],
            tolerance=0.07,
            gate="micro",
            profile="h200-ep1",
            metric="dc_p50_us",
            stack="campaign",
        )
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_link_out_of_the_project_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(report()))
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "link.json").symlink_to(outside)
    with pytest.raises(BaselineError, match="leads out of the project"):
        baseline(
            tmp_path / "p",
            ["link.json"],
            tolerance=0.07,
            gate="micro",
            profile="h200-ep1",
            metric="dc_p50_us",
            stack="campaign",
        )


def test_a_bar_whose_run_is_gone_names_the_bar_when_judged_not_when_loaded(tmp_path):
    """A copied spec loads (the plan, bump impact need no runs); judging its bar names the missing run."""
    (tmp_path / "gates").mkdir()
    shutil.copy(REPO / "gates" / "micro.yaml", tmp_path / "gates" / "micro.yaml")
    spec = load_spec(tmp_path, "micro")
    with pytest.raises(
        BaselineError, match=rf"micro.yaml: profiles.h200-ep1 bar dc_p50_us: baseline run {K5}: not a file"
    ):
        resolve_bars(spec, spec.profile("h200-ep1"), root=tmp_path)


def test_baseline_dir_takes_the_accepted_runs_under_it(tmp_path):
    for i, m in enumerate((14.0, 14.2, 14.4)):
        write(tmp_path, f"runs/{i}/micro.json", report(mean=m))
    write(tmp_path, "runs/bad/micro.json", report(result="fail", mean=99.0))  # passed over, not accepted
    write(tmp_path, "runs/other/micro.json", report(profile="p5en-efa-ep16", mean=400.0))
    (tmp_path / "gates").mkdir()
    shutil.copy(REPO / "gates" / "micro.yaml", tmp_path / "gates" / "micro.yaml")
    spec = load_spec(tmp_path, "micro")
    assert accepted_runs(
        tmp_path, tmp_path / "runs", gate="micro", profile="h200-ep1", metric="dc_p50_us", stack="campaign"
    ) == [
        "runs/0/micro.json",
        "runs/1/micro.json",
        "runs/2/micro.json",
    ]
    prof = resolve_bars(spec, spec.profile("h200-ep1"), root=tmp_path, folder=tmp_path / "runs", stack="campaign")
    assert prof.bars[0].threshold == round(14.2 * 1.07, 4) and "(--baseline)" in prof.bars[0].reference
    with pytest.raises(BaselineError, match="no accepted micro h200-ep1 run of stack gin-gdaki"):
        resolve_bars(spec, spec.profile("h200-ep1"), root=tmp_path, folder=tmp_path / "runs", stack="gin-gdaki")
    with pytest.raises(BaselineError, match="has a fixed threshold, no baseline tolerance"):
        resolve_bars(spec, spec.profile("p5en-efa-ep16"), root=tmp_path, folder=tmp_path / "runs", stack="campaign")


def test_the_committed_deliberate_runs_are_never_accepted():
    """The H200 runs with --num-sms K (results/gate_micro/2026-12-03-h200-ep1-baseline) are passed over by --baseline:
    only the normal runs of that folder are accepted."""
    folder = REPO / "results/gate_micro/2026-12-03-h200-ep1-baseline"
    runs = accepted_runs(REPO, folder, gate="micro", profile="h200-ep1", metric="dc_p50_us", stack="campaign")
    assert [r.split("/")[-3:-1] for r in runs] == [["call-a", "normal"], ["call-b", "normal"]]
    bad = "results/gate_micro/2026-12-03-h200-ep1-baseline/call-a/sms64/micro.json"
    with pytest.raises(BaselineError, match="deliberate variation"):
        baseline(REPO, [bad], tolerance=0.07, gate="micro", profile="h200-ep1", metric="dc_p50_us", stack="campaign")


def test_the_slowed_h200_runs_failed_their_bar_and_the_normal_ones_passed():
    """The evidence of issue 27 item 1, as committed: DeepEP given 8 or 4 SMs at EP1 is wholly past the baseline bar
    (FAIL), the normal runs of the same calls clear it (PASS)."""
    folder = REPO / "results/gate_micro/2026-12-03-h200-ep1-baseline"
    got = {}
    for p in sorted(folder.glob("call-*/*/micro.json")):
        d = json.loads(p.read_text())
        bar = next(c for c in d["checks"] if c["metric"] == "dc_p50_us")
        got[f"{p.parent.parent.name}/{p.parent.name}"] = (d["result"], bar["threshold"], bar["pass"])
    assert got["call-a/normal"][0] == got["call-b/normal"][0] == "pass"
    assert got["call-b/sms8"][:1] == ("fail",) and got["call-b/sms4"][:1] == ("fail",)
    assert {t for _, t, _ in got.values()} == {15.6085}  # one bar, from the 15 accepted runs


def test_baseline_runs_given_take_the_accepted_ones_among_them(tmp_path):
    """`--baseline-run` (what the command layer resolves `--baseline history` to): the accepted runs among those
    given; none accepted is one line; the gate refuses `history` it was not given runs for, and DIR with runs."""
    from reprostack.errors import ReprostackError
    from reprostack.gates.micro import MicroGate
    from reprostack.gates.options import GateOptions

    runs = [write(tmp_path, f"runs/{i}/micro.json", report(mean=m)) for i, m in enumerate((14.0, 14.2, 14.4))]
    runs.append(write(tmp_path, "runs/bad/micro.json", report(result="fail", mean=99.0)))
    (tmp_path / "gates").mkdir()
    shutil.copy(REPO / "gates" / "micro.yaml", tmp_path / "gates" / "micro.yaml")
    spec = load_spec(tmp_path, "micro")
    prof = resolve_bars(spec, spec.profile("h200-ep1"), root=tmp_path, runs=tuple(runs), stack="campaign")
    assert prof.bars[0].threshold == round(14.2 * 1.07, 4)
    assert "the accepted runs of --baseline-run (3 of the 4 given)" in prof.bars[0].reference
    with pytest.raises(BaselineError, match="no accepted micro h200-ep1 run of stack campaign among the 1 run"):
        resolve_bars(spec, spec.profile("h200-ep1"), root=tmp_path, runs=(runs[-1],), stack="campaign")
    g = MicroGate("micro")
    with pytest.raises(ReprostackError, match="^--baseline history: no accepted run was resolved"):
        g.check_options(GateOptions(baseline="history"))
    with pytest.raises(ReprostackError, match="^--baseline DIR and --baseline-run: give one of them"):
        g.check_options(GateOptions(baseline=str(tmp_path), baseline_runs=tuple(runs)))
    assert g.check_options(GateOptions(baseline="history", baseline_runs=tuple(runs))).baseline_runs == tuple(runs)


def test_a_baseline_checks_the_gpu_model_of_each_run(tmp_path):
    """Issue 39: evidence/bars/baseline.py would accept an H100 run as an H200 baseline run. With the profile's model, a run
    whose recorded GPUs are another model (or none) is refused by name; the committed H200 runs still count."""
    import json
    import shutil

    from reprostack.evidence.bars.baseline import BaselineError, read_run

    repo = Path(__file__).resolve().parents[1]
    src = repo / "results" / "gate_micro" / "2026-12-02-h200-ep1-k5" / "micro.json"
    (tmp_path / "upstreams.lock").write_text("")
    shutil.copy(src, tmp_path / "h200.json")
    doc = json.loads(src.read_text())
    doc["provenance"]["host"]["gpus"] = [{"name": "NVIDIA H100 80GB HBM3"}]
    (tmp_path / "h100.json").write_text(json.dumps(doc))
    key = dict(gate="micro", profile="h200-ep1", metric="dc_p50_us", stack="campaign", model="H200")
    assert read_run(tmp_path, "h200.json", **key)[1] > 14
    with pytest.raises(BaselineError, match="h100.json: ran on NVIDIA H100 80GB HBM3, not the profile's H200"):
        read_run(tmp_path, "h100.json", **key)


def test_the_baseline_says_where_and_when_its_runs_ran_from_their_reports():
    """Issue 39: the spec described the baseline as "three lent machines and two days"; its 15 runs started on one
    day, host name vm, no machine id recorded. The origin is now generated from the runs' reports, never typed."""
    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root, "micro")
    ep1 = resolve_bars(spec, spec.profile("h200-ep1"), root=root, stack="campaign")
    note = ep1.bars[0].baseline.describe("<=", "us")
    assert "three lent machines" not in note and "two days" not in note
    assert "origin (from the runs' reports): started 2026-12-02T03:47:29Z .. 2026-12-02T07:57:22Z, 1 day(s)" in note
    assert "host name(s) vm, no machine id recorded" in note


def test_a_signed_only_baseline_takes_signed_baseline_runs_only(tmp_path):
    """Issue 39: a baseline made of signed baseline runs (`signed-only: true`): an unsigned run, a run signed as an
    ordinary one, and a run whose folder changed after signing are each refused by name."""
    from reprostack import evidence
    from reprostack.evidence.attest.keys import entry_name
    from reprostack.evidence.bars.baseline import BaselineSpec, signed_baseline_run
    from test_evidence import predicate

    signer = evidence.new_key(tmp_path / "k.pem")
    entry = evidence.public_entry(signer, "baseliner")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / entry_name(entry)).write_text(json.dumps(entry))
    for name, purpose in (("a", "baseline"), ("b", "ordinary"), ("u", None)):
        f = tmp_path / "runs" / name
        write(tmp_path, f"runs/{name}/micro.json", report())
        if purpose:
            pred = predicate(purpose_=evidence.purpose(purpose))
            pred["gates"][0]["report"] = "micro.json"
            evidence.attest_folder(f, pred, signer)
    assert signed_baseline_run(tmp_path, "runs/a/micro.json") == "baseliner"
    with pytest.raises(BaselineError, match="runs/b/micro.json: signed as a ordinary run, not a baseline run"):
        signed_baseline_run(tmp_path, "runs/b/micro.json")
    with pytest.raises(BaselineError, match="runs/u/micro.json: unsigned; this bar takes signed baseline runs only"):
        signed_baseline_run(tmp_path, "runs/u/micro.json")
    spec = BaselineSpec(("runs/a/micro.json", "runs/u/micro.json"), 0.07, "why it is so", signed_only=True)
    with pytest.raises(BaselineError, match="unsigned"):
        spec.resolve(tmp_path, gate="micro", profile="h200-ep1", metric="dc_p50_us")
    (tmp_path / "runs" / "a" / "micro.json").write_text(json.dumps(report(mean=9.0)))
    with pytest.raises(BaselineError, match="its sha256 is not the attested one"):
        signed_baseline_run(tmp_path, "runs/a/micro.json")
