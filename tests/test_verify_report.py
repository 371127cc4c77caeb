"""`reprostack verify-report` (reprostack.evidence.verify.report, evidence.verify.trace, each Gate.evidence): every committed report
re-derives from its raw logs and traces to commits of this repository; tampered copies (a changed figure, a changed
log byte, a lax threshold, a flipped verdict, a lock no commit has, a project commit that is not one) fail with one
line naming what; a new report made here (micro with its trials log, the serving gate through the pinned AIPerf)
verifies inside its own git checkout."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.gates import registry
from reprostack.evidence.rederive import RederiveError
from reprostack.evidence.verify.report import verify
from reprostack.evidence.bars.stats import summarize
from reprostack.evidence.verify.trace import Correction, Versions, read_corrections
from test_gate_micro_flow import gpu_host  # noqa: F401  (fixture: the stand-in GPU host)

ROOT = Path(__file__).resolve().parents[1]
K5 = ROOT / "results" / "gate_micro" / "2026-12-02-h200-ep1-k5"
MEG = ROOT / "results" / "gate_megatron" / "2026-11-29-h200-ep1"
FAB = ROOT / "results" / "gate_fabric" / "2026-12-03-h200-ep1"


@pytest.fixture(scope="module")
def versions():
    return Versions.read(ROOT)


def rederive(doc, folder, spec):
    try:
        g = registry.gate(doc["gate"])
        return g.evidence.rederive(g, doc, folder, spec)
    except (ValueError, TypeError, KeyError) as e:
        raise RederiveError(f"{type(e).__name__}: {e}") from None


def check(path: Path, versions, root: Path = ROOT, corrections=None):
    c = read_corrections(ROOT) if corrections is None else corrections
    return verify(path, root=root, versions=versions, corrections=c, rederive=rederive)


def test_every_committed_report_holds(capsys, monkeypatch):
    """CI: verify-report over results/ (every gate report there) exits 0."""
    monkeypatch.chdir(ROOT)
    rc = cli.main(["verify-report", "-q"])
    out = capsys.readouterr().out
    assert rc == 0, out
    n = sum(1 for p in (ROOT / "results").rglob("*.json") if '"checks"' in p.read_text(errors="replace"))
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"verify-report: {n} of {n} report(s) hold (") and n >= 31, last
    signed, unsigned = (int(x.split()[0]) for x in last.rsplit("(", 1)[1].rstrip(")").split(", "))
    assert signed + unsigned == n and "UNSIGNED" in last  # every unsigned run is named as one


def test_the_megatron_reports_hold_only_through_their_written_corrections(versions):
    """The lock of the 2026-11-29 Megatron PASS matches no committed upstreams.lock: it was the working tree's,
    18b78dd's plus 9090c1f's fifth megatron-lm entry with 18b78dd's comment; kept beside the report, it hashes to the
    recorded sha256 and parses to 9090c1f's lock. Without its correction the report does not hold."""
    kept = MEG / "upstreams.lock.as-run"
    assert hashlib.sha256(kept.read_bytes()).hexdigest().startswith("c5c3c1ec")
    o = check(MEG / "megatron.json", versions)
    assert o.ok, o.problems
    assert any("lock c5c3c1ec is no commit's: corrected (upstreams.lock.as-run" in t for t in o.traced)
    assert any(n.startswith("lock correction: The third device call") for n in o.notes)
    bare = check(MEG / "megatron.json", versions, corrections=[])
    assert bare.problems == ["lock c5c3c1ec: no commit of this repository has this upstreams.lock"]
    call1 = check(MEG / "call1-set_num_sms" / "megatron.json", versions)
    assert call1.ok and any("spec 76f21246 is no commit's" in t for t in call1.traced)


def tampered(tmp_path: Path, src: Path, report: str, edit) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    p = dst / report
    doc = json.loads(p.read_text())
    edit(doc, dst)
    p.write_text(json.dumps(doc, indent=1))
    return p


def test_a_changed_figure_fails_even_when_its_statistics_agree_with_it(tmp_path, versions):
    def edit(doc, _):
        st = doc["data"]["statistics"]["dc_p50_us"]
        st["samples"][0] = 13.9  # a faster first trial, and every figure made to agree with it
        s = summarize(st["samples"], "us")
        st.update(mean=s.mean, p50=s.p50, stdev=s.stdev, ci95=list(s.ci95))
        doc["data"]["trials"]["figures"]["dc_p50_us"][0] = 13.9
        next(c for c in doc["checks"] if c["metric"] == "dc_p50_us")["value"] = round(s.mean, 6)

    o = check(tampered(tmp_path, K5, "micro.json", edit), versions)
    assert not o.ok
    assert "statistics dc_p50_us: samples [13.9, 14.423, 14.381, 14.421, 14.368] but the logs give [14.439," in (
        " ".join(o.problems)
    )
    assert any(p.startswith("data.trials.figures: ") for p in o.problems)
    assert "check dc_p50_us: value 14.2986 but the logs give 14.4064" in o.problems


def test_a_changed_cell_figure_of_a_comparison_arm_fails(tmp_path, versions):
    """A new user's trial: a signer could raise the committed vLLM run's allgather c1 agg_tok_s (445.49 -> 668.23,
    re-signed with a key of the keyring) and verify-report still said OK: the cells' own figures were never held to
    the AIPerf exports, only the checks and the statistics were. Now each cell's agg_tok_s and samples are."""
    run = ROOT / "results" / "gate_vllm" / "2026-12-03-h200-ep1" / "run"

    def edit(doc, _):
        doc["data"]["arms"]["allgather"]["cells"][0]["agg_tok_s"] *= 1.5

    o = check(tampered(tmp_path, run, "vllm.json", edit), versions)
    assert not o.ok
    assert "vllm/allgather/c1: agg_tok_s 668.22878353233" in " ".join(o.problems)

    def edit_samples(doc, _):
        doc["data"]["arms"]["allgather"]["cells"][1]["samples"][0] += 100

    o = check(tampered(tmp_path / "s", run, "vllm.json", edit_samples), versions)
    assert not o.ok and "vllm/allgather/c4: samples [" in " ".join(o.problems)


def test_a_changed_log_byte_fails_with_or_without_its_sha256(tmp_path, versions):
    def edit(doc, dst):
        log = dst / "micro" / "test_ep.log"
        text = log.read_text()
        assert text.count("8.524 us") == 1
        log.write_text(text.replace("8.524 us", "8.324 us"))

    p = tampered(tmp_path, K5, "micro.json", edit)
    o = check(p, versions)
    assert o.problems == [
        "artifact micro/test_ep.log: its bytes are not the recorded ones (sha256 or size differs)"
    ] + [x for x in o.problems[1:]] and o.problems[0].startswith("artifact micro/test_ep.log")
    doc = json.loads(p.read_text())  # the sha256 written in too: the figures still give it away
    log = p.parent / "micro" / "test_ep.log"
    doc["artifacts"][0].update(sha256=hashlib.sha256(log.read_bytes()).hexdigest(), bytes=log.stat().st_size)
    p.write_text(json.dumps(doc))
    o = check(p, versions)
    assert not o.ok and not any(x.startswith("artifact") for x in o.problems)
    assert any("statistics dispatch_p50_us: samples [8.524," in x for x in o.problems)
    assert any(x.startswith("statistics dc_p50_us: samples") for x in o.problems)


def test_a_lock_no_commit_has_a_lax_bar_and_a_flipped_verdict_fail(tmp_path, versions):
    def lock(doc, _):
        doc["provenance"]["lock_sha256"] = hashlib.sha256(b"a lock no commit has").hexdigest()

    o = check(tampered(tmp_path / "a", K5, "micro.json", lock), versions)
    sha = hashlib.sha256(b"a lock no commit has").hexdigest()
    assert o.problems == [f"lock {sha[:8]}: no commit of this repository has this upstreams.lock"]

    def lax(doc, _):
        next(c for c in doc["checks"] if c["metric"] == "dc_p50_us")["threshold"] = 300

    o = check(tampered(tmp_path / "b", K5, "micro.json", lax), versions)
    assert o.problems == ["check dc_p50_us: threshold 300 but the recorded spec's bar is 30"]

    def flip(doc, _):  # a PASS the schema accepts: every check marked passed
        doc["result"], doc["reason"] = "pass", "10 check(s) passed"
        next(c for c in doc["checks"] if c["metric"] == "bars_status")["pass"] = True

    o = check(tampered(tmp_path / "c", FAB, "fabric.json", flip), versions)
    assert o.problems == [
        "check bars_status: recorded pass, recomputed fail",
        "result pass, but the recorded spec says this profile has no measured bar",
        "result pass, but its checks give fail",
    ]

    def pass_flag(doc, _):
        c = next(c for c in doc["checks"] if c["metric"] == "bars_status")
        c["pass"] = True

    o = check(tampered(tmp_path / "d", FAB, "fabric.json", pass_flag), versions)
    assert "check bars_status: recorded pass, recomputed fail" in o.problems


def test_a_project_commit_must_be_one_and_a_clean_one_must_hold_the_recorded_lock(tmp_path, versions):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    def none(doc, _):
        doc["provenance"]["project"] = {"commit": "f" * 40, "dirty": False, "source": "git"}

    o = check(tampered(tmp_path / "a", K5, "micro.json", none), versions)
    assert o.problems == [f"provenance.project.commit {'f' * 12}: not a commit of this repository"]

    def clean(doc, _):
        doc["provenance"]["project"] = {"commit": head, "dirty": False, "source": "git"}

    o = check(tampered(tmp_path / "b", K5, "micro.json", clean), versions)
    assert any(
        x.startswith(f"provenance.project: a clean tree at {head[:12]}, but its upstreams.lock is not")
        for x in o.problems
    )

    def dirty(doc, _):
        doc["provenance"]["project"] = {"commit": head, "dirty": True, "source": "git", "changed": ["upstreams.lock"]}

    o = check(tampered(tmp_path / "c", K5, "micro.json", dirty), versions)
    assert o.ok and any(t == f"project {head[:8]} (dirty tree)" for t in o.traced)


def test_a_correction_holds_only_for_its_claim(tmp_path, versions):
    dst = tmp_path / MEG.name
    shutil.copytree(MEG, dst)
    good = next(c for c in read_corrections(ROOT) if c.field == "lock_sha256")

    def moved(c: Correction, **kw) -> list:
        return [Correction(**{**c.__dict__, "report": str(dst / "megatron.json"), **kw})]

    assert check(dst / "megatron.json", versions, corrections=moved(good)).ok
    kept = dst / "upstreams.lock.as-run"
    kept.write_text(kept.read_text().replace("a581e42fc8efaef71fc87aa26a5d43616957774f", "0" * 40, 1))
    o = check(dst / "megatron.json", versions, corrections=moved(good))
    assert o.problems == ["correction for lock c5c3c1ec: upstreams.lock.as-run is missing or does not hash to it"]
    o = check(dst / "megatron.json", versions, corrections=moved(good, report_sha256="0" * 64))
    assert o.problems == ["lock c5c3c1ec: no commit of this repository has this upstreams.lock"]  # other bytes
    shutil.copy(MEG / "upstreams.lock.as-run", kept)
    o = check(
        dst / "megatron.json",
        versions,
        corrections=moved(good, kept=None, commit="18b78dd9fa10548a2e7ae7f07daef8da6934dde4"),
    )
    assert o.problems == ["correction for lock c5c3c1ec: pin megatron-lm patched_tree is not 18b78dd9fa10's"]


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "not JSON"),
        ("[1, 2]", "top level is an array, expected an object"),
        ('{"gate": "micro", "result": "pass", "checks": []}', "not a valid report: (top): "),
        ("{" * 5000, "not JSON"),
    ],
)
def test_a_hostile_report_is_one_line(tmp_path, versions, text, why):
    p = tmp_path / "micro.json"
    p.write_text(text)
    o = check(p, versions)
    assert not o.ok and len(o.problems) == 1 and why in o.problems[0] and "\n" not in o.problems[0]


def test_a_report_whose_data_is_not_its_kind_is_a_line_not_a_traceback(tmp_path, versions, capsys, monkeypatch):
    def bad(doc, _):
        doc["data"]["test_ep"]["num_ranks"] = "many"

    p = tampered(tmp_path, K5, "micro.json", bad)
    monkeypatch.chdir(ROOT)
    rc = cli.main(["verify-report", str(p)])
    out = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out.out + out.err
    assert "raw logs: ValueError: invalid literal for int()" in out.out
    assert cli.main(["verify-report", str(tmp_path / "nope")]) == 2
    assert "nope: no such folder or report" in capsys.readouterr().err
    # a new user's trial: `--json` into a missing folder named a temporary file, after every report was printed
    assert cli.main(["verify-report", str(p), "--json", str(tmp_path / "no" / "x.json")]) == 2
    out = capsys.readouterr()
    assert (
        out.out == ""
        and out.err.strip()
        == f"reprostack: error: --json {tmp_path / 'no' / 'x.json'}: no such folder {tmp_path / 'no'}"
    )


def commit_all(root: Path) -> str:
    for argv in (
        ["git", "init", "-q", "-b", "main", str(root)],
        ["git", "-C", str(root), "add", "-A"],
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "project"],
    ):
        subprocess.run(argv, check=True)
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_a_new_micro_report_verifies_in_its_own_checkout(tmp_path, gpu_host):
    """A report made now (the trials driver's log, the dense arm, the baseline bar, provenance.project) holds; a
    changed dense figure in the log does not."""
    import gaterun
    from reprostack.report import write_reports
    from test_gate_micro_flow import FIX, options, stand_in_python
    from trialslog import real_ep1_texts, trials_log

    text = trials_log(real_ep1_texts(3), dense_fixture=FIX / "dense_ep1.log", dense_scales=[1.0, 1.1, 0.9])
    run = options(tmp_path, stand_in_python(tmp_path, text), profile="h200-ep1", arms=("deepep", "dense"), trials=3)
    head = commit_all(run.root)
    rep = gaterun.run(run)
    assert rep.result == "pass", rep.reason
    assert rep.provenance["project"] == {
        "commit": head,
        "dirty": False,
        "changed": [],
        "changed_count": 0,
        "source": "git",
    }
    write_reports([rep], run.out_dir)
    o = verify(
        run.out_dir / "micro.json", root=run.root, versions=Versions.read(run.root), corrections=[], rederive=rederive
    )
    assert o.ok, o.problems
    assert f"project {head[:8]} (clean)" in o.traced and "1 bar(s) are the recorded spec's" in o.rederived
    assert "4 check value(s) re-derived from the logs" in o.rederived  # completeness, one NCCL, D+C, the dense arm
    log = run.out_dir / "micro" / "test_ep.log"
    doc = json.loads((run.out_dir / "micro.json").read_text())
    log.write_text(log.read_text().replace('"p50_us": 104.17', '"p50_us": 94.17', 1))
    doc["artifacts"][0].update(sha256=hashlib.sha256(log.read_bytes()).hexdigest(), bytes=log.stat().st_size)
    (run.out_dir / "micro.json").write_text(json.dumps(doc))
    o = verify(
        run.out_dir / "micro.json", root=run.root, versions=Versions.read(run.root), corrections=[], rederive=rederive
    )
    assert any(x.startswith("statistics dense_dc_p50_us: samples") for x in o.problems), o.problems


def test_a_one_trial_micro_report_verifies_as_inconclusive(tmp_path, gpu_host):
    """Found on the H200 (shadow_nccl.sh's control, --trials 1): the gate judges a one-trial bar inconclusive (no
    interval), but verify-report recomputed it as `value op threshold`, a pass, and failed a faithful report
    ("recorded inconclusive, recomputed pass"). A one-trial report now holds as it was recorded."""
    import gaterun
    from reprostack.report import write_reports
    from test_gate_micro_flow import options, stand_in_python
    from trialslog import real_ep1_texts, trials_log

    run = options(tmp_path, stand_in_python(tmp_path, trials_log(real_ep1_texts(1))), profile="h200-ep1", trials=1)
    commit_all(run.root)
    rep = gaterun.run(run)
    assert rep.result == "inconclusive", rep.reason
    assert "one trial gives no interval" in rep.reason
    write_reports([rep], run.out_dir)
    o = verify(
        run.out_dir / "micro.json", root=run.root, versions=Versions.read(run.root), corrections=[], rederive=rederive
    )
    assert o.ok, o.problems


def test_a_new_serving_report_verifies_from_its_aiperf_exports(tmp_path):
    """The vllm gate's local-test profile through the pinned AIPerf against the test server: its report holds (cells
    re-read from the exports, the backend lines from the server log, the tok/s bar of the recorded spec); one export
    whose throughput is changed does not."""
    from reprostack.gates.aiperftool import ensure_aiperf
    from reprostack.lock import load
    from reprostack.report import write_reports
    from test_gate_serving import TOOLS, serve, small_root

    lock = load(ROOT / "upstreams.lock")
    ensure_aiperf(lock, TOOLS, ROOT)
    root = small_root(tmp_path, "vllm")
    commit_all(root)
    out = tmp_path / "out"
    rep = serve("vllm", root, lock, out, arms=["deepep"])  # the same lock bytes: root holds a copy
    assert rep.result == "pass", rep.reason
    write_reports([rep], out)
    o = verify(out / "vllm.json", root=root, versions=Versions.read(root), corrections=[], rederive=rederive)
    assert o.ok, o.problems
    n = len([c for c in rep.checks])
    assert (
        f"{n} check value(s) re-derived from the logs" in o.rederived
        and "1 bar(s) are the recorded spec's" in o.rederived
    )
    export = out / "vllm" / "deepep" / "c4" / "aiperf" / "profile_export_aiperf.json"
    doc = json.loads(export.read_text())
    raw = json.dumps(doc)
    key = '"output_token_throughput"'
    assert key in raw
    ex = json.loads(raw)
    ex["output_token_throughput"]["avg"] = ex["output_token_throughput"]["avg"] * 2  # schema 1.3: metric -> stats
    export.write_text(json.dumps(ex))
    o = verify(out / "vllm.json", root=root, versions=Versions.read(root), corrections=[], rederive=rederive)
    assert any(x.startswith("artifact vllm/deepep/c4/aiperf/profile_export_aiperf.json") for x in o.problems)
    # the cell's own figure is held to the exports first (before the checks): that is where the doubled export shows
    assert any(x.startswith("raw logs: vllm/deepep/c4: agg_tok_s ") for x in o.problems), o.problems


def git_project(tmp_path: Path, corrections: str | None = None) -> Path:
    """A small project checkout: this repository's lock, one empty results folder, and (optionally) a corrections
    file."""
    root = tmp_path / "proj"
    (root / "results").mkdir(parents=True)
    shutil.copy(ROOT / "upstreams.lock", root / "upstreams.lock")
    if corrections is not None:
        (root / "results" / "provenance-corrections.yaml").write_text(corrections)
    return root


@pytest.mark.parametrize(
    "where, why",
    [
        ("empty", "no gate report (<gate>.json with gate, result, checks)"),
        ("summaries-only", "no gate report (<gate>.json with gate, result, checks)"),
        ("missing", "nope: no such folder or report"),
        ("no-git", "not a git checkout: reports are traced to its commits"),
    ],
)
def test_a_hostile_folder_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, where, why):
    """A folder with no gate report (a CI step over an emptied or wrong folder never passes with nothing checked), one
    that does not exist, a project that is no git checkout: one line, exit 2, no --json written."""
    root = git_project(tmp_path)
    folder = root / "results"
    if where == "summaries-only":
        (folder / "summary.json").write_text('{"gates": []}')  # a damaged *.json is a FAIL: test_forgeries
    if where == "missing":
        folder = root / "nope"
    if where != "no-git":
        commit_all(root)
    if where == "no-git":
        shutil.copytree(K5, folder / K5.name)
    monkeypatch.chdir(root)
    rc = cli.main(["verify-report", str(folder), "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr()
    assert rc == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and "Traceback" not in out.out + out.err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    "text, why",
    [
        ("corrections: {}\n", "(file): one key, `corrections:`, a list"),
        ("corrections:\n  - report: a\n", "needs commit, field, recorded, report, report-sha256, why"),
        (
            "corrections:\n  - {report: r, report-sha256: "
            + "c" * 64
            + ", field: lock_sha256, recorded: "
            + "b" * 64
            + ", commit: abc, why: w}\n",
            "corrections.0.commit: a full commit id (40 lowercase hex)",
        ),
        (
            "corrections:\n  - {report: ../x, report-sha256: "
            + "c" * 64
            + ", field: lock_sha256, recorded: "
            + "b" * 64
            + ", commit: "
            + "a" * 40
            + ", why: w}\n",
            "corrections.0.report: a path inside the project, without '..'",
        ),
        (
            "corrections:\n  - {report: r, report-sha256: "
            + "c" * 64
            + ", field: gate_spec_sha256, recorded: "
            + "b" * 64
            + ", commit: "
            + "a" * 40
            + ", why: w, kept: x}\n",
            "corrections.0.kept: only a lock's bytes are kept",
        ),
        ("corrections:\n  - {report: r, field: result, x: 1}\n", "unknown: x"),
        ("corrections: [\n", "(yaml)"),
        ("a: &a x\nb: *a\ncorrections: []\n", "one key, `corrections:`"),
    ],
)
def test_a_malformed_corrections_file_is_file_line_and_exit_2(tmp_path, capsys, monkeypatch, text, why):
    root = git_project(tmp_path, corrections=text)
    shutil.copytree(K5, root / "results" / K5.name)
    commit_all(root)
    monkeypatch.chdir(root)
    rc = cli.main(["verify-report"])
    out = capsys.readouterr()
    assert rc == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "provenance-corrections.yaml" in lines[0] and why in lines[0], lines
    assert out.out == ""


def test_a_profile_with_its_own_backend_assertion_is_rederived_with_it(tmp_path):
    """A serving profile that carries its own backend assertion (issue 28's h200-ep1: no provider line on one GPU)
    is re-derived with that assertion, not the spec's: every check value comes back from the logs."""
    from reprostack.gates.aiperftool import ensure_aiperf
    from reprostack.lock import load
    from reprostack.report import write_reports
    from test_gate_serving import TOOLS
    from test_gate_serving_h200 import TEST_PROFILE, root_with, run

    lock = load(ROOT / "upstreams.lock")
    ensure_aiperf(lock, TOOLS, ROOT)
    i = TEST_PROFILE.index("    engaged:\n")
    profile = TEST_PROFILE[:i].replace(
        "{name: ElasticBuffer construction, pattern: 'Initializing EP elastic buffer'",
        "{name: EP buffer (profile's own), pattern: 'Initializing EP elastic buffer'",
    )
    root = root_with(tmp_path, profile)
    commit_all(root)
    out = tmp_path / "out"
    rep = run(root, lock, out, trials=1, arms=["deepep"])
    assert "deepep.backend.EP buffer (profile's own)" in {c.metric for c in rep.checks}, rep.reason
    write_reports([rep], out)
    o = verify(out / "vllm.json", root=root, versions=Versions.read(root), corrections=[], rederive=rederive)
    assert o.ok, o.problems
    valued = [c for c in rep.checks if c.metric != "bars_status"]
    assert f"{len(valued)} check value(s) re-derived from the logs" in o.rederived, (o.rederived, valued)


def test_notes_of_reports_that_hold_are_counted_once_not_printed_per_report(capsys, monkeypatch):
    """Issue 40 item 8: verify-report printed every note of every report (88 lines over results/) even when every
    report held. Now a report that holds is one line; its notes are counted once each at the end; --notes shows
    them per report."""
    monkeypatch.chdir(ROOT)
    folder = "results/gate_micro"
    assert cli.main(["verify-report", folder]) == 0
    out = capsys.readouterr().out.splitlines()
    assert not [x for x in out if x.startswith("  note: ")]
    head = next(i for i, x in enumerate(out) if x.startswith("notes ("))
    counted = [x for x in out[head + 1 : -1]]
    assert counted and all(re.match(r"  \d+ report\(s\): ", x) for x in counted)
    assert len(counted) == len(set(counted)) and out[-1].startswith("verify-report: ")
    assert cli.main(["verify-report", "--notes", folder]) == 0
    per = capsys.readouterr().out.splitlines()
    assert sum(int(x.split()[0]) for x in counted) == len([x for x in per if x.startswith("  note: ")])
