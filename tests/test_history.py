"""`reprostack history`: reports in SQLite, regressions by separated 95% intervals, plots, the bump PR table.

Synthetic reports are real report documents (GateReport.to_dict plus contract item 1's `data.statistics`)
written to real files; the committed results/ are ingested as they are.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from reprostack import cli
from reprostack.errors import ReprostackError
from reprostack.history import bumpview, store as storemod
from reprostack.history.command import ingest, scan
from reprostack.history.compare import analyse
from reprostack.history.reader import NotAReport, read_report
from reprostack.history.store import Store
from reprostack.report.model import GateReport, evaluate
from reprostack.evidence.bars.stats import t975

from reprostack.gitcmd import git
from test_bump import pristine, s  # noqa: F401 - the bump scenario's fixtures
from test_bump import run as bump_run
from test_fuzz_readers import mutate

ROOT = Path(__file__).resolve().parents[1]
LOCK_A, LOCK_B = "a" * 64, "b" * 64
NCCL_A, NCCL_B = "1933fdd6360a8bfccaa0166bd71bce363d32e5b6", "2044aee7471b9dcc8bb0277c8e8f712fa3c4f6c7"


def report(
    folder: Path,
    name: str,
    *,
    lock: str,
    date: str,
    stats: dict | None = None,
    value: float = 14.5,
    nccl: str = NCCL_A,
    metric: str = "dc_p50_us",
    gate: str = "micro",
) -> Path:
    """Write `<folder>/<name>/<gate>.json`: one `metric <= 30 us` check; `stats` = {metric: (mean, lo, hi, n)}."""
    prov = {
        "lock_sha256": lock,
        "upstreams": {"nccl": {"rev": nccl}, "deepep": {"rev": "b306af06" * 5}},
        "host": {"gpus": [{"name": "NVIDIA H200"}], "driver_version": "580.159.04"},
        "execution": {"mode": "host", "environment": {"freeze_sha256": "f" * 64}},
    }
    data = {}
    if stats:
        data["statistics"] = {m: consistent(mean, lo, hi, n) for m, (mean, lo, hi, n) in stats.items()}
    r = GateReport(
        gate,
        "h200-ep1",
        "pass",
        "ok",
        [evaluate(metric, "us", value, "<=", 30)],
        provenance=prov,
        started=date,
        ended=date,
        data=data,
    )
    p = folder / name / f"{gate}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(r.to_dict(), indent=2))
    return p


def consistent(mean: float, lo: float, hi: float, n: int) -> dict:
    """A `data.statistics` entry whose samples give exactly `mean`, `p50` = mean, its stdev and the t interval
    [lo, hi] (symmetric about the mean): pairs mean +- c, and the mean itself when n is odd."""
    half = abs(hi - lo) / 2
    sd = half * math.sqrt(n) / t975(n - 1)
    c = sd * math.sqrt((n - 1) / (2 * (n // 2)))
    samples = [mean - c] * (n // 2) + ([mean] if n % 2 else []) + [mean + c] * (n // 2)
    return {
        "n": n,
        "mean": mean,
        "p50": mean,
        "stdev": sd,
        "ci95": [lo, hi],
        "samples": samples,
        "unit": "us",
        "method": "t",
    }


UI_LINE = re.compile(
    r"^ *history: (ingest|compare|page): "
)  # the progress lines of reprostack.ui (plain, off a terminal)


def run(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr without the progress lines)."""
    rc = cli.main(["history", *map(str, args)])
    o = capsys.readouterr()
    return rc, o.out, "".join(x for x in o.err.splitlines(keepends=True) if not UI_LINE.match(x))


@pytest.fixture
def db(tmp_path):
    return tmp_path / "h.sqlite3"


def test_regression_flagged_when_intervals_separate_and_pins_named(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)}, nccl=NCCL_B)
    rc, out, err = run(capsys, res, "--db", db, "--out", tmp_path / "h", "--no-plots", "--all")
    assert rc == 0 and err == ""
    assert out.startswith("history: 2 report(s), 1 metric(s), 1 flagged regression(s)\n")
    assert "1 regression(s) flagged" in out
    assert (
        f"lock aaaaaaaa -> bbbbbbbb: regression: 14.35 [14.2, 14.5] n=5 -> 15.15 [15, 15.3] n=5; "
        f"pins changed: nccl {NCCL_A[:12]} -> {NCCL_B[:12]}"
    ) in out
    assert re.search(r"2026-12-02T00:00:00Z\s+bbbbbbbb\s+pass\s+5\s+15.15\s+\[15, 15.3\]\s+\w+\s+regression", out)


def test_a_drop_of_a_lower_is_better_metric_is_an_improvement(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)})
    report(res, "2", lock=LOCK_A, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    rc, out, _ = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 0 and "improvement" in out and "regression(s) flagged" not in out


def test_overlapping_intervals_are_not_flagged(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    report(
        res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (14.6, 14.45, 14.75, 5)}, nccl=NCCL_B
    )
    rc, out, _ = run(capsys, res, "--db", db, "--no-plots", "--all")
    assert rc == 0 and "no regression flagged" in out
    assert "lock aaaaaaaa -> bbbbbbbb: same:" in out


def test_single_sample_reports_are_shown_never_judged(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", value=14.3)
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", value=29.9, nccl=NCCL_B)  # twice as slow, n=1
    rc, out, _ = run(capsys, res, "--db", db, "--no-plots", "--all")
    assert rc == 0 and "no regression flagged" in out
    assert "lock aaaaaaaa -> bbbbbbbb: n=1, no interval: 14.3 (n=1) -> 29.9 (n=1)" in out
    assert out.count("n=1, no interval") >= 3


def test_ingest_is_idempotent_by_file_content(tmp_path, db, capsys):
    res = tmp_path / "results"
    p = report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    with Store.open(db) as s:
        first = s.count()
    assert first == (1, 1)
    shutil.copy(p, tmp_path / "copy.json")  # the same bytes elsewhere: the same report
    rc, out, _ = run(capsys, res, tmp_path / "copy.json", "--db", db, "--no-plots")
    assert rc == 0 and "ingested: 0 new, 2 already stored" in out
    with Store.open(db) as s:
        assert s.count() == first
        assert read_report(p).id == hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_newer_schema_is_refused_with_one_line_and_left_alone(tmp_path, db, capsys):
    Store.open(db).close()
    con = sqlite3.connect(db)
    con.execute("PRAGMA user_version = 99")
    con.commit()
    con.close()
    before = db.read_bytes()
    rc, out, err = run(capsys, tmp_path, "--db", db, "--no-plots")
    assert rc == 2 and out == ""
    assert err == (
        f"reprostack: error: {db}: history schema version 99 is newer than this reprostack reads "
        f"({storemod.SCHEMA_VERSION}): use a newer reprostack, or another --db\n"
    )
    assert db.read_bytes() == before


@pytest.mark.parametrize(
    "content,message",
    [
        (b"not a database at all" * 100, "not a history database (file is not a database)"),
        (None, "a SQLite database with tables (other) but no history schema version"),
    ],
)
def test_a_file_that_is_not_a_history_is_refused(tmp_path, db, capsys, content, message):
    if content is None:
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE other (x)")
        con.commit()
        con.close()
    else:
        db.write_bytes(content)
    rc, _, err = run(capsys, tmp_path, "--db", db, "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_a_damaged_row_is_one_line(tmp_path, db, capsys):
    """A row whose samples are not JSON: skipped with one line naming it, the rest printed, exit 2 (before: the
    whole run stopped at it, and every later run on that database)."""
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    report(res, "2", lock=LOCK_A, date="2026-12-02T00:00:00Z", metric="other_us")
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    con = sqlite3.connect(db)
    con.execute("UPDATE measurements SET samples = ? WHERE metric = 'dc_p50_us'", ("[1, 'x'",))
    con.commit()
    con.close()
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 2, err
    assert re.fullmatch(
        rf"{re.escape(str(db))}: skipped stored measurement 'dc_p50_us' of report [0-9a-f]{{12}} \(.*/1/micro\.json\): "
        r"samples are not JSON",
        lines[0],
    ), lines[0]
    assert lines[1] == "history: 1 stored row(s) skipped (named above); exit 2"
    assert out.startswith("history: 2 report(s), 1 metric(s), 0 flagged regression(s)\n")


def test_the_readme_links_the_committed_history():
    links = re.findall(r"\]\(\.\./(results/history/[^)]+)\)", (ROOT / "docs" / "history.md").read_text())
    assert any(x.endswith(".png") for x in links) and "results/history/index.html" in links
    assert all((ROOT / x).is_file() for x in links), links


def test_an_older_schema_is_migrated_step_by_step(tmp_path, db, monkeypatch):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    with Store.open(db) as s:  # a version 1 database with one report
        ingest(s, scan([res]))
    monkeypatch.setattr(storemod, "MIGRATIONS", storemod.MIGRATIONS + [("ALTER TABLE reports ADD COLUMN note TEXT",)])
    monkeypatch.setattr(storemod, "SCHEMA_VERSION", 2)
    with Store.open(db) as s:
        assert s.version() == 2
        assert s.conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [(1,), (2,)]
        assert s.count() == (1, 1)
        assert s.conn.execute("SELECT note FROM reports").fetchall() == [(None,)]


def test_plots_and_one_self_contained_html_page(tmp_path, db, capsys):
    res, out = tmp_path / "results", tmp_path / "plots"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)})
    report(res, "3", lock=LOCK_B, date="2026-12-03T00:00:00Z", metric="other_us", value=3.0)
    rc, text, _ = run(capsys, res, "--db", db, "--out", out)
    assert rc == 0 and f"page: {out / 'index.html'} with 2 PNG(s)" in text
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 2 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    page = (out / "index.html").read_text()
    srcs = re.findall(r"""src=["']([^"']*)""", page)
    assert len(srcs) == 2 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"https?://|<script|<link|url\(|@import", page, re.I)
    assert 'class="regression"' in page
    first = [p.read_bytes() for p in pngs] + [page]
    run(capsys, res, "--db", db, "--out", out)  # the same history gives the same bytes (no churn in git)
    assert [p.read_bytes() for p in pngs] + [(out / "index.html").read_text()] == first


def test_the_committed_results_ingest_without_error(tmp_path, db, capsys):
    rc, out, err = run(capsys, ROOT / "results", "--db", db, "--no-plots", "--all")
    assert rc == 0 and err == "", err
    m = re.search(r"ingested: (\d+) new, 0 already stored, \d+ other JSON file\(s\) passed over, 0 skipped", out)
    assert m and int(m.group(1)) >= 14, out
    assert "micro/h200-ep1 [campaign] dc_p50_us (us, lower is better)" in out
    assert "megatron/h200-ep1 [campaign] deepep.loss_drop" in out


def test_bad_reports_are_one_line_each_the_rest_ingested_exit_2(tmp_path, db, capsys):
    res = tmp_path / "results"
    good = report(res, "good", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    trunc = report(res, "trunc", lock=LOCK_B, date="2026-12-02T00:00:00Z")
    trunc.write_bytes(trunc.read_bytes()[:200])
    bad = report(res, "stats", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.0, 15.3, 15.0, 5)})
    d = json.loads(bad.read_text())
    d["data"]["statistics"]["dc_p50_us"]["ci95"] = [15.3, 15.0]
    bad.write_text(json.dumps(d))
    (res / "summary.json").write_text('{"schema_version": 1, "gates": []}')  # not a report: passed over
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2
    lines = err.splitlines()
    assert lines[0] == f"skipped {bad}: data.statistics.dc_p50_us.ci95: lo 15.3 is above hi 15.0"
    assert lines[1].startswith(f"skipped {trunc}:") and "not JSON" in lines[1]
    assert lines[2] == "history: 2 report(s) skipped (named above); exit 2" and len(lines) == 3
    assert "ingested: 1 new, 0 already stored, 1 other JSON file(s) passed over, 2 skipped" in out
    assert "Traceback" not in err + out
    assert read_report(good).gate == "micro"


def test_a_file_name_of_any_bytes_is_read_and_named_printably(tmp_path, db, capsys):
    res = tmp_path / "results"
    good = report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    good.rename(res / "1" / os.fsdecode(b"m\xff.json"))
    (res / os.fsdecode(b"b\xfe.json")).write_bytes(b'{"gate": "x", "result": "pass", "checks": [')
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and "ingested: 1 new," in out
    assert err.splitlines()[0] == f"skipped {res}/b?.json:1: not JSON: Expecting value (column 44)"


def test_a_missing_folder_is_one_line_nothing_written(tmp_path, db, capsys):
    rc, out, err = run(capsys, tmp_path / "nope", "--db", db)
    assert rc == 2 and out == "" and err == f"reprostack: error: {tmp_path / 'nope'}: no such folder or report\n"
    assert not db.exists()


def test_hostile_strings_are_escaped_in_the_page_and_stripped_for_the_terminal(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", metric="x<script>alert(1)</script>\x1b[2J")
    rc, out, _ = run(capsys, res, "--db", db, "--out", tmp_path / "p")
    assert rc == 0 and "\x1b" not in out
    page = (tmp_path / "p" / "index.html").read_text()
    assert "<script>" not in page and "x&lt;script&gt;alert(1)&lt;/script&gt;?[2J" in page


def test_bump_section_before_after_verdict(tmp_path):
    old, new = "lockfile-version: 1\n# old\n", "lockfile-version: 1\n# new\n"
    sha = lambda t: hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
    res = tmp_path / "results"
    report(res, "1", lock=sha(old), date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    no_db = tmp_path / "none.sqlite3"
    md = bumpview.section(tmp_path, old, new, ("micro",), db=no_db)
    assert (
        "| micro/h200-ep1 [campaign] | dc_p50_us (us) | 14.35 [14.2, 14.5] n=5 | not run yet | "
        "not run under the new lock |" in md
    )
    report(res, "2", lock=sha(new), date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)})
    md = bumpview.section(tmp_path, old, new, ("micro",), db=no_db)
    assert md.startswith("### Gate history\n")
    assert (
        "| micro/h200-ep1 [campaign] | dc_p50_us (us) | 14.35 [14.2, 14.5] n=5 | 15.15 [15, 15.3] n=5 | "
        "regression |" in md
    )
    assert bumpview.section(tmp_path, old, new, ("sglang",), db=no_db) is None  # no run of the gate
    assert not no_db.exists()


def test_bump_section_judges_the_new_run_against_each_baseline_bar(tmp_path):
    """Issue 27: the PR body shows each re-run gate's verdict against its baseline bar (micro h200-ep1: the median of
    the 15 accepted committed runs x 1.07), judged on the new lock's run's interval as the gate judges it."""
    shutil.copytree(ROOT / "gates", tmp_path / "gates")
    shutil.copytree(ROOT / "keys", tmp_path / "keys")  # h100-ep1's bar takes signed baseline runs only
    shutil.copytree(ROOT / "results", tmp_path / "results", ignore=shutil.ignore_patterns("history"))
    old, new = (ROOT / "upstreams.lock").read_text(), "lockfile-version: 1\n# bumped\n"
    sha = hashlib.sha256(new.encode()).hexdigest()
    no_db = tmp_path / "none.sqlite3"
    md = bumpview.section(tmp_path, old, new, ("micro",), db=no_db)
    assert "#### Verdict against the baseline" in md
    row = next(x for x in md.splitlines() if x.startswith("| micro/h200-ep1 [campaign] | dc_p50_us <= 15.6085 us |"))
    assert "median 14.59 us of 15 run(s) x (1 + 0.07)" in row and row.endswith(
        "| not run yet | not run under the new lock |"
    )
    res = tmp_path / "results" / "bump"
    report(res, "ok", lock=sha, date="2026-12-09T00:00:00Z", stats={"dc_p50_us": (14.6, 14.5, 14.7, 5)})
    assert "| 14.6 [14.5, 14.7] n=5 | PASS |" in bumpview.section(tmp_path, old, new, ("micro",), db=no_db)
    report(res, "slow", lock=sha, date="2026-12-10T00:00:00Z", stats={"dc_p50_us": (16.1, 16.0, 16.2, 5)})
    assert "| 16.1 [16, 16.2] n=5 | FAIL |" in bumpview.section(tmp_path, old, new, ("micro",), db=no_db)
    report(res, "edge", lock=sha, date="2026-12-11T00:00:00Z", stats={"dc_p50_us": (15.6, 15.4, 15.8, 5)})
    assert "| 15.6 [15.4, 15.8] n=5 | INCONCLUSIVE |" in bumpview.section(tmp_path, old, new, ("micro",), db=no_db)
    md = bumpview.section(tmp_path, old, new, ("megatron",), db=no_db)
    assert "| megatron | - | no baseline bar (its bars cite published figures, or none is set) | - | - |" in md
    (tmp_path / "results" / "gate_micro" / "2026-12-02-h200-ep1-k5" / "micro.json").write_text("{")
    md = bumpview.section(tmp_path, old, new, ("micro",), db=no_db)  # a baseline run that cannot be read: named
    assert "| micro | - | - | - | cannot be judged: micro.yaml: profiles.h200-ep1 bar dc_p50_us: " in md, md[-400:]


def test_baseline_history_is_the_accepted_runs_the_database_still_matches(tmp_path, capsys):
    """`gate micro --baseline history`: the command layer resolves the history database's accepted runs (pass, this
    gate and stack) into project paths; a report changed since it was ingested, or outside the project, is passed
    over and counted; no database or no run left is one line."""
    from reprostack.cmd.gate import history_runs
    from reprostack.errors import ReprostackError
    from reprostack.gates.spec import load_spec, resolve_bars

    root = tmp_path / "project"
    shutil.copytree(ROOT / "gates", root / "gates")
    for rel in (
        "results/gate_micro/2026-12-02-h200-ep1-k5",
        "results/gate_micro/2026-12-02-h200-ep1-k5-gin-gdaki",
        "results/bench/gate_micro-h200-2026-12-02-d",
        "results/gate_megatron/2026-11-29-h200-ep1",
    ):
        shutil.copytree(ROOT / rel, root / rel)
    cache = tmp_path / "cache"
    with pytest.raises(ReprostackError, match=r"^--baseline history: no results history at .*; ingest the results"):
        history_runs(root, cache, "campaign", "micro", "h200-ep1")
    db = cache / "history" / "history.sqlite3"
    assert run(capsys, root / "results", "--db", db, "--no-plots")[0] == 0
    got = history_runs(root, cache, "campaign", "micro", None)
    assert len(got) == 7 and all(g.startswith("results/") for g in got) and not any("gin-gdaki" in g for g in got)
    spec = load_spec(root, "micro")
    prof = resolve_bars(
        spec, spec.profile("h200-ep1"), root=root, stack="campaign", runs=got, runs_from="the results history"
    )
    assert len(prof.bars[0].baseline.runs) == 7 and "the accepted runs of the results history (7 of the 7 given)" in (
        prof.bars[0].reference
    )
    changed = root / got[0]
    changed.write_text(changed.read_text().replace('"reason": "', '"reason": "edited ', 1))
    capsys.readouterr()
    assert len(history_runs(root, cache, "campaign", "micro", "h200-ep1")) == 6
    err = capsys.readouterr().err
    assert "6 accepted run(s) of gate micro, stack campaign" in err
    assert "; 1 passed over (moved, changed since ingested, or outside the project)" in err
    with pytest.raises(ReprostackError, match="holds no accepted run of gate micro on stack nope"):
        history_runs(root, cache, "nope", "micro", None)


def test_bump_pr_body_has_the_gate_history(s, capsys):
    """A real bump (tests/test_bump.py's scenario, with the real gates/ and kernels/, nccl built from `demo`) in a
    project whose results/ hold a micro run under the old lock: the PR body's "Gate history" lists it."""
    shutil.copytree(ROOT / "gates", s.project / "gates")
    shutil.copytree(ROOT / "kernels", s.project / "kernels")
    nccl = s.project / "kernels" / "nccl.yaml"
    nccl.write_text(nccl.read_text().replace("\nsource: nccl\n", "\nsource: demo\n"))
    old_sha = hashlib.sha256(s.lock.read_bytes()).hexdigest()
    report(
        s.project / "results",
        "run1",
        lock=old_sha,
        date="2026-12-01T00:00:00Z",
        stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)},
    )
    git("add", "-A", cwd=s.project)
    git("commit", "-q", "-m", "gates, kernels, one run", cwd=s.project)
    assert bump_run(s) == 0, capsys.readouterr().err
    body = (s.project / f"out/bump/demo-{s.c['main'][:8]}.md").read_text()
    assert "### Gate history\n" in body
    assert (
        "| micro/h200-ep1 [campaign] | dc_p50_us (us) | 14.35 [14.2, 14.5] n=5 | not run yet | "
        "not run under the new lock |" in body
    )


N_FUZZ = 1000


def test_fuzz_the_report_reader_never_tracebacks(tmp_path):
    """1,000 deterministic mutations of the committed reports (test_fuzz_readers.mutate): each reads, is passed
    over as not a report, or is one ReprostackError line naming the file; through ingest, never a traceback."""
    originals = sorted(p for p in (ROOT / "results").rglob("*.json") if p.name != "summary.json")
    rng = random.Random("16-history")
    target = tmp_path / "r" / "micro.json"
    target.parent.mkdir()
    bad, refused = [], 0
    with Store.open(":memory:") as s:
        for i in range(N_FUZZ):
            target.write_bytes(mutate(originals[i % len(originals)].read_bytes(), rng, "json"))
            try:
                rec = read_report(target)
                s.ingest(rec)
            except NotAReport:
                pass
            except ReprostackError as e:
                refused += 1
                if not str(e).startswith(str(target)) or "\n" in str(e):
                    bad.append(f"#{i}: not one line naming the file: {e}")
            except Exception as e:  # noqa: BLE001 - the point is to catch everything else
                bad.append(f"#{i} ({originals[i % len(originals)].name}): {type(e).__name__}: {str(e)[:120]}")
        analyse(s)  # whatever went in can be compared
    assert not bad, f"{len(bad)}/{N_FUZZ}:\n" + "\n".join(bad[:20])
    assert refused >= 300


def test_without_matplotlib_the_page_is_written_and_one_line_says_how_to_get_plots(tmp_path, db):
    """Issue 29 item 8: the README's install (`pip install -e .`, no extras) has no matplotlib; `reprostack history`
    stopped there (exit 2). Now, in a process where matplotlib cannot be imported, over the committed results: exit
    0, the summary line first, the flagged regressions before anything else, a short output, the page written with
    its tables and without PNGs, and one line naming the extra as a checkout installs it (never
    `reprostack[plots]`, which pip would look up on the index); progress on stderr."""
    out = tmp_path / "page"
    code = (
        "import sys; sys.modules['matplotlib'] = None; from reprostack.cli import main; "
        f"sys.exit(main(['history', '--db', {str(db)!r}, '--out', {str(out)!r}]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert re.fullmatch(r"history: \d+ report\(s\), \d+ metric\(s\), \d+ flagged regression\(s\)", lines[0])
    flagged = int(lines[0].split(", ")[2].split()[0])
    assert flagged >= 1 and lines[1] == "flagged (two 95% intervals separate, the later one worse):"
    assert all(x.startswith("  ") and ": regression: " in x for x in lines[2 : 2 + flagged])
    assert 10 <= len(lines) <= 60, p.stdout  # tens of lines, not the 851 of before
    assert (
        f"page: {out / 'index.html'} (tables only: matplotlib is not installed; for the PNGs: pip install -e "
        "'.[plots]' in this checkout)" in lines
    )
    assert lines[-1] == "every run of every metric: reprostack history --all"
    assert not list(out.glob("*.png"))
    page = (out / "index.html").read_text()
    assert "No plots: matplotlib is not installed." in page and "<table>" in page and "<img" not in page
    assert "history: ingest: started" in p.stderr and "history: page: ok in" in p.stderr
    assert "Traceback" not in p.stderr


def test_the_default_output_is_short_and_every_run_is_behind_all(tmp_path, db, capsys):
    """Over the committed results: the default output is tens of lines, the flagged regressions first; `--all`
    prints every run of every metric (the hundreds of lines the command printed before)."""
    rc, out, _ = run(capsys, ROOT / "results", "--db", db, "--no-plots")
    lines = out.splitlines()
    assert rc == 0 and len(lines) <= 60
    assert lines[0].startswith("history: ") and lines[1].startswith("flagged (")
    assert lines.index("metrics with intervals: the latest run, and its verdict against the run before it") > 2
    assert not any(x.startswith("date  ") for x in lines)  # no per-run table
    rc, full, _ = run(capsys, ROOT / "results", "--db", db, "--no-plots", "--all")
    assert rc == 0 and full.splitlines()[0] == lines[0] and len(full.splitlines()) > 300
    assert "every run of every metric" not in full


# --- hostile-input trial (session 4): a history database someone else wrote


@pytest.mark.parametrize(
    "sql,what",
    [
        ("CREATE TRIGGER forge AFTER INSERT ON reports BEGIN UPDATE measurements SET mean = 1; END", "trigger forge"),
        ("CREATE VIEW v AS SELECT * FROM reports", "view v"),
    ],
)
def test_a_database_with_a_trigger_or_view_is_refused_and_left_alone(tmp_path, db, capsys, sql, what):
    Store.open(db).close()
    con = sqlite3.connect(db)
    con.execute(sql)
    con.commit()
    con.close()
    before = db.read_bytes()
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and f"holds {what}, which no reprostack history has" in err, err
    assert db.read_bytes() == before


def test_hostile_strings_and_non_finite_samples_in_the_database_never_reach_the_terminal(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    con = sqlite3.connect(db)
    con.execute("UPDATE reports SET profile = ?", ("p\x1b]0;owned\x07\x1b[2J",))
    con.commit()
    rc, out, err = run(capsys, res, "--db", db, "--no-plots", "--all")
    assert rc == 0 and "\x1b" not in out + err and "\x07" not in out + err and "p?]0;owned??[2J" in out
    con.execute("UPDATE measurements SET samples = ?", ("[NaN, 1e999]",))
    con.commit()
    con.close()
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and err.count("\n") == 2 and "a value that is not a finite number" in err, err


def test_two_hosts_that_differ_never_read_alike():
    """The new-user trial (session 5) saw `host differs (1x NVIDIA H200, driver 580.159.04 -> the same text)`: the
    description now shows every fact of the fingerprint (kernel, packages, image), so the difference is visible."""
    from reprostack.history.reader import host_fingerprint

    base = {
        "host": {"gpus": [{"name": "NVIDIA H200"}], "driver_version": "580.159.04", "kernel": "6.18.44-a"},
        "execution": {"mode": "host", "environment": {"freeze_sha256": "f" * 64}},
    }
    other = {**base, "host": {**base["host"], "kernel": "6.18.44-b"}}
    (fa, da), (fb, db_) = host_fingerprint(base), host_fingerprint(other)
    assert fa != fb and da != db_ and "kernel 6.18.44-a" in da and "packages ffffffffffff" in da


# --- issue 27 item 5: inconsistent statistics, stored rows, the database's integrity, scale


def test_a_mean_outside_its_interval_is_refused_at_ingest_and_never_crashes_history(tmp_path, db, capsys):
    """One report whose mean lies outside its own 95% interval used to go into the database and crash every later
    `history` run on it (matplotlib refuses a negative error bar: a traceback, no output). Now it is refused at
    ingest with the one reason, nothing of it stored, the others ingested and plotted, exit 2; the next run too."""
    res, out = tmp_path / "results", tmp_path / "page"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    bad = report(res, "2", lock=LOCK_A, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    d = json.loads(bad.read_text())
    d["data"]["statistics"]["dc_p50_us"]["mean"] = 16.0
    bad.write_text(json.dumps(d))
    for _ in range(2):
        rc, text, err = run(capsys, res, "--db", db, "--out", out)
        assert rc == 2 and "Traceback" not in err
        assert err.splitlines() == [
            f"skipped {bad}: data.statistics.dc_p50_us.mean: 16 lies outside its own 95% interval [14.2, 14.5]",
            "history: 1 report(s) skipped (named above); exit 2",
        ]
        assert text.startswith("history: 1 report(s), 1 metric(s), 0 flagged regression(s)\n")
        assert len(list(out.glob("*.png"))) == 1
    with Store.open(db) as s:
        assert s.count() == (1, 1)


def _edit_stat(path: Path, **change) -> Path:
    d = json.loads(path.read_text())
    st = d["data"]["statistics"]["dc_p50_us"]
    for k, v in change.items():
        if callable(v):
            st[k] = v(st[k])
        else:
            st[k] = v
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"n": 4}, "data.statistics.dc_p50_us.n: 4 but 5 samples listed"),
        ({"samples": lambda x: x[:4]}, "data.statistics.dc_p50_us.n: 5 but 4 samples listed"),
        (
            {"stdev": 0.5},
            "data.statistics.dc_p50_us.stdev: 0.5 but the 5 samples' standard deviation (n - 1) is 0.120808",
        ),
        (
            {"samples": lambda x: [v + 1 for v in x]},
            "data.statistics.dc_p50_us.mean: 14.35 but the 5 samples' mean is 15.35",
        ),
        ({"p50": 14.5}, "data.statistics.dc_p50_us.p50: 14.5 but the 5 samples' median is 14.35"),
        (
            {"ci95": [14.34, 14.36]},
            "data.statistics.dc_p50_us.ci95: [14.34, 14.36] is not mean +- t(0.975, 4) * stdev / sqrt(5) = [14.2, 14.5] "
            "(method t)",
        ),
        ({"samples": []}, "data.statistics.dc_p50_us.samples: none listed, so n=5 and the interval cannot be checked"),
    ],
)
def test_inconsistent_statistics_are_refused_at_ingest_with_the_one_reason(tmp_path, db, capsys, change, reason):
    """Statistics that contradict themselves (n vs samples, a stdev or a mean the samples do not give, an interval
    narrower than its own stdev allows: it would flag a regression by itself) are refused whole, one named reason;
    before, each was ingested and judged."""
    res = tmp_path / "results"
    good = report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    bad = _edit_stat(
        report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)}),
        **change,
    )
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and err.splitlines()[0] == f"skipped {bad}: {reason}", err
    assert "ingested: 1 new, 0 already stored, 0 other JSON file(s) passed over, 1 skipped" in out
    assert read_report(good).measurements[0].n == 5


def test_every_committed_report_has_consistent_statistics():
    """The reader's consistency checks hold for every report under results/ (stats.summarize writes them)."""
    reports = 0
    for p in sorted((ROOT / "results").rglob("*.json")):
        try:
            rec = read_report(p)
        except NotAReport:
            continue
        reports += 1
        assert all(m.samples or m.n == 1 for m in rec.measurements), p
    assert reports >= 14


def test_a_stored_row_an_older_version_took_is_skipped_with_a_warning(tmp_path, db, capsys):
    """A database written before the checks (here: the mean of a stored row set outside its interval, as an older
    reprostack stored such a report): `history` crashed on it on every run. Now that row is skipped with a line
    naming it; the rest is printed and drawn; exit 2."""
    res, out = tmp_path / "results", tmp_path / "page"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)})
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    con = sqlite3.connect(db)
    rid = con.execute("SELECT id FROM reports WHERE date LIKE '2026-12-02%'").fetchone()[0]
    con.execute("UPDATE measurements SET mean = 16.0 WHERE report_id = ?", (rid,))
    con.commit()
    con.close()
    rc, text, err = run(capsys, res, "--db", db, "--out", out)
    assert rc == 2 and "Traceback" not in err
    assert err.splitlines() == [
        f"{db}: skipped stored measurement 'dc_p50_us' of report {rid[:12]} ({res / '2' / 'micro.json'}): mean: 16 "
        "lies outside its own 95% interval [15, 15.3]",
        "history: 1 stored row(s) skipped (named above); exit 2",
    ]
    assert text.startswith("history: 2 report(s), 1 metric(s), 0 flagged regression(s)\n")
    assert len(list(out.glob("*.png"))) == 1 and (out / "index.html").is_file()


def test_a_stored_pin_of_the_wrong_type_is_skipped(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)}, nccl=NCCL_B)
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    con = sqlite3.connect(db)
    con.execute("UPDATE pins SET rev = x'ff00' WHERE name = 'nccl'")  # a BLOB in a TEXT column: SQLite keeps it
    con.commit()
    con.close()
    rc, text, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and "Traceback" not in err and "skipped a stored pin of report" in err
    assert "1 flagged regression(s)" in text.splitlines()[0]


def _damaged_copies(db: Path, tmp_path: Path):
    """Copies of `db` with 64 bytes of one page overwritten, for each page where PRAGMA quick_check then reports
    damage while a plain SELECT of every measurement still succeeds (what the history read before checking)."""
    con = sqlite3.connect(db)
    size, pages = con.execute("PRAGMA page_size").fetchone()[0], con.execute("PRAGMA page_count").fetchone()[0]
    con.close()
    for page in range(2, pages + 1):
        d = tmp_path / f"damaged-{page}.sqlite3"
        shutil.copy(db, d)
        with open(d, "r+b") as f:
            f.seek((page - 1) * size + 100)
            f.write(b"\xff" * 64)
        con = sqlite3.connect(f"file:{d}?mode=ro", uri=True)
        try:
            flagged = con.execute("PRAGMA quick_check").fetchall() != [("ok",)]
            con.execute("SELECT m.* FROM measurements m JOIN reports r ON r.id = m.report_id").fetchall()
        except sqlite3.DatabaseError:
            flagged = False
        finally:
            con.close()
        if flagged:
            yield d


def test_a_damaged_database_is_one_line_and_never_written(tmp_path, db, capsys):
    """A history file damaged on disk (bytes of a page overwritten) that SQLite still reads without an error: it
    was used as is. Now PRAGMA quick_check on opening refuses it: one line, exit 2, the file's bytes unchanged."""
    res = tmp_path / "results"
    for i in range(40):
        report(res, str(i), lock=LOCK_A, date=f"2026-12-{1 + i % 28:02d}T00:00:{i:02d}Z", value=14 + i / 100)
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    damaged = next(_damaged_copies(db, tmp_path))
    before = damaged.read_bytes()
    rc, out, err = run(capsys, res, "--db", damaged, "--out", tmp_path / "page")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"reprostack: error: {damaged}: a damaged SQLite file (PRAGMA quick_check: ")
    assert err.endswith("left as it is: move it away, or use another --db\n")
    assert damaged.read_bytes() == before and not (tmp_path / "page").exists()


def test_a_file_that_is_not_sqlite_is_never_written(tmp_path, db, capsys):
    db.write_bytes(b"SQLite format 3\x00" + b"\x07" * 5000)  # the header's magic, then nothing SQLite can use
    before = db.read_bytes()
    rc, out, err = run(capsys, tmp_path, "--db", db, "--no-plots")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "not a history database" in err, err
    assert db.read_bytes() == before


N_ROW_FUZZ = 300


def test_fuzz_stored_rows_never_crash_history(tmp_path):
    """300 databases, each with one cell of a stored row replaced by a hostile value (wrong type, NaN text, huge
    numbers, an inverted interval, broken JSON): comparing, printing and drawing them never raises; every row
    that cannot be used is one line naming it."""
    from reprostack.history import render

    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)}, nccl=NCCL_B)
    base = tmp_path / "base.sqlite3"
    with Store.open(base) as s:
        ingest(s, scan([res]))
    values = [
        None,
        0,
        -1,
        2**63 - 1,
        1e308,
        -1e308,
        1.7e308,
        5e-324,
        float("nan"),
        "NaN",
        "",
        "x" * 5000,
        b"\xff\xfe",
        "[1e999]",
        "[",
        "[1, 2, 3, 4, 5]",
        "{}",
        '["a"]',
        "lower",
        "\x1b[2J",
        3.5,
        str(10**30),
        10**18,
    ]
    cols = {
        "reports": [
            "path",
            "gate",
            "profile",
            "result",
            "stack",
            "lock_sha256",
            "image_digest",
            "host_fp",
            "host",
            "date",
        ],
        "measurements": ["metric", "unit", "n", "mean", "p50", "stdev", "lo", "hi", "method", "samples", "better"],
        "pins": ["name", "rev"],
    }
    rng = random.Random("27-rows")
    bad = []
    for i in range(N_ROW_FUZZ):
        d = tmp_path / "f.sqlite3"
        shutil.copy(base, d)
        table = rng.choice(list(cols))
        col, val = rng.choice(cols[table]), rng.choice(values)
        con = sqlite3.connect(d)
        try:
            con.execute(f"UPDATE {table} SET {col} = ? WHERE rowid = (SELECT min(rowid) FROM {table})", (val,))
            con.commit()
        except sqlite3.IntegrityError:  # NOT NULL
            continue
        finally:
            con.close()
        try:
            with Store.open(d) as s:
                series = analyse(s)
                render.text(series)
                if i % 10 == 0:
                    render.write(series, tmp_path / "page")
                if any("\n" in x for x in getattr(s, "skipped_rows", [])):
                    bad.append(f"#{i} {table}.{col}={val!r:.40}: a skip line of several lines")
        except ReprostackError:
            pass  # refused whole, one line (cli)
        except Exception as e:  # noqa: BLE001 - the point is to catch everything else
            bad.append(f"#{i} {table}.{col}={val!r:.40}: {type(e).__name__}: {str(e)[:160]}")
    assert not bad, f"{len(bad)}/{N_ROW_FUZZ}:\n" + "\n".join(bad[:20])


def test_the_readme_shows_what_history_prints(tmp_path, capsys):
    """docs/history.md's "Results history" block (generated by `reprostack docs`, checked against results/ by test_docsgen) is
    what the command prints on the committed results: every line of it, in order."""
    text = (ROOT / "docs" / "history.md").read_text()
    block = text.split("<!-- generated: history (reprostack docs; from results/, never typed) -->\n```\n", 1)[1]
    block = block.split("```", 1)[0]
    db = tmp_path / "h.sqlite3"
    rc, out, _ = run(capsys, "--db", db, "--no-plots")
    got = out.splitlines()
    shown = [x for x in block.splitlines() if not x.startswith("$ reprostack history")]
    assert len(shown) > 5 and shown == got[: len(shown)]
    assert "`--all` adds every run of every metric (a table per metric)" in text


def test_a_deliberate_variation_or_a_stand_in_is_never_a_point_of_the_history(tmp_path, capsys):
    """A run with `--num-sms K` (data.deliberate) or a stand-in's report (evidence false) is passed over like any
    other JSON file: it would otherwise be judged a regression of the stack (the 2026-12-03 H200 runs with 8 or 4 SMs
    were 17-24 us against 14.6)."""
    src = ROOT / "results/gate_micro/2026-12-03-h200-ep1-baseline"
    shutil.copytree(src, tmp_path / "r")
    rc, out, _ = run(capsys, "--db", tmp_path / "h.sqlite3", "--no-plots", tmp_path / "r")
    assert rc == 0 and out.startswith("history: 2 report(s)") and "0 flagged regression(s)" in out.splitlines()[0]


def test_aiperf_rates_are_higher_is_better(tmp_path, capsys):
    """AIPerf writes its rates as `tokens/sec` (the H200 vLLM and SGLang runs): higher is better, as GB/s is, so a
    drop between two runs is a regression and never "changed"."""
    db = tmp_path / "h.sqlite3"
    rc, out, _ = run(capsys, "--db", db, "--no-plots", "--all")  # every metric (the short list is cut)
    assert rc == 0 and "vllm/h200-ep1 [campaign] allgather.c1.agg_tok_s (tokens/sec, higher is better)" in out
    assert "sglang/h200-ep1 [campaign] dense.c8.agg_tok_s (tokens/sec, higher is better)" in out


# ------------------------------------------------- issue 40 items 3 and 11: where history writes, its db errors


def _status(path: Path) -> str:
    return git("status", "--porcelain", "--ignored", "--", str(path), cwd=ROOT)


def test_history_writes_to_the_cache_by_default_never_into_the_clone(tmp_path, capsys, monkeypatch):
    """Issue 40 item 3: a plain `reprostack history` wrote its page into the committed results/history/ (and,
    without matplotlib, stripped its plots), so the next report recorded a dirty tree. Now the database and the page
    go to the cache; the clone's results/history/ is written only with --out."""
    monkeypatch.setenv("REPROSTACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    res = tmp_path / "results"
    report(res, "a", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    before = _status(ROOT / "results" / "history")
    rc, out, _ = run(capsys, res)
    assert rc == 0, out
    page = tmp_path / "cache" / "history" / "page" / "index.html"
    assert page.is_file() and f"page: {page}" in out and f"database {tmp_path / 'cache'}" in out
    assert _status(ROOT / "results" / "history") == before
    assert "the committed page: --out results/history" in " ".join(_help("history").split())


def _help(cmd: str) -> str:
    p = subprocess.run([sys.executable, "-m", "reprostack", cmd, "--help"], capture_output=True, text=True, cwd=ROOT)
    return p.stdout


def test_a_page_with_plots_is_never_replaced_by_one_without(tmp_path, db):
    """Issue 40 item 3: without matplotlib, --out on a page whose index.html holds plots would strip them: one
    line, exit 2, nothing written."""
    res = tmp_path / "results"
    report(res, "a", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    out = tmp_path / "page"
    out.mkdir()
    (out / "index.html").write_text('<img src="data:image/png;base64,AAAA">')
    code = (
        "import sys; sys.modules['matplotlib'] = None; from reprostack.cli import main; "
        f"sys.exit(main(['history', {str(res)!r}, '--db', {str(db)!r}, '--out', {str(out)!r}]))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert p.stderr.splitlines()[-1] == (
        f"reprostack: error: --out {out}: its index.html has plots and matplotlib is not installed: a tables-only "
        "page would strip them; pip install -e '.[plots]' in this checkout, or --no-plots, or another --out"
    )
    assert (out / "index.html").read_text() == '<img src="data:image/png;base64,AAAA">' and not db.exists()


def test_a_folder_where_index_html_goes_is_one_line_naming_it(tmp_path, db, capsys):
    """Issue 40 item 11: a folder in the way of index.html was named by its temp file (`.index.html.xyz.tmp`)."""
    res = tmp_path / "results"
    report(res, "a", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    (tmp_path / "page" / "index.html").mkdir(parents=True)
    rc, out, err = run(capsys, res, "--db", db, "--out", tmp_path / "page")
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert (
        err
        == f"reprostack: error: --out {tmp_path / 'page'}: {tmp_path / 'page' / 'index.html'} is a folder (or not a file); move it away\n"
    )
    assert not db.exists() and os.listdir(tmp_path / "page") == ["index.html"]


def test_a_locked_database_is_called_locked(tmp_path, db, capsys):
    """Issue 40 item 11: a database another process holds locked was called `not a history database`."""
    res = tmp_path / "results"
    report(res, "a", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    report(res, "b", lock=LOCK_A, date="2026-12-02T00:00:00Z")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"reprostack: error: {db}: locked by another process (SQLite: database is locked); ")
    assert "not a history database" not in err


def test_a_read_only_database_with_new_reports_is_one_line_never_a_traceback(db, capsys):
    """Issue 40 item 11: a database the user cannot write, with new reports to store, gave a traceback
    (`internal error`). Run as an unprivileged user (root writes any file), the database root's and 0644."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the command as a user who cannot write the database")
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="rs-ro-"))  # pytest's tmp_path is 0700: the other user cannot enter it
    try:
        top.chmod(0o755)
        res, db = top / "results", top / "h.sqlite3"
        report(res, "a", lock=LOCK_A, date="2026-12-01T00:00:00Z")
        assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
        report(res, "b", lock=LOCK_A, date="2026-12-02T00:00:00Z")
        before = db.read_bytes()
        code = (
            "import sys; from reprostack.cli import main; "
            f"sys.exit(main(['history', {str(res)!r}, '--db', {str(db)!r}, '--no-plots']))"
        )
        env = {**os.environ, "HOME": str(top), "REPROSTACK_CACHE": str(top / "nobody-cache")}
        p = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
        )  # fmt: skip
        err = [x for x in p.stderr.splitlines() if not UI_LINE.match(x)]
        assert p.returncode == 2 and "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
        assert err == [
            f"reprostack: error: {db}: read-only (SQLite: attempt to write a readonly database); make it writable, "
            "or use another --db"
        ], p.stderr
        assert db.read_bytes() == before
    finally:
        shutil.rmtree(top)
