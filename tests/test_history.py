"""`reprostack history`: reports in SQLite, regressions by separated 95% intervals, plots, the bump PR table.

Synthetic reports are real report documents (GateReport.to_dict plus contract item 1's `data.statistics`)
written to real files; the committed results/ are ingested as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
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
        data["statistics"] = {
            m: {
                "n": n,
                "mean": mean,
                "p50": mean,
                "stdev": 0.1,
                "ci95": [lo, hi],
                "samples": [mean] * n,
                "unit": "us",
                "method": "t",
            }
            for m, (mean, lo, hi, n) in stats.items()
        }
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


def run(capsys, *args) -> tuple[int, str, str]:
    rc = cli.main(["history", *map(str, args)])
    o = capsys.readouterr()
    return rc, o.out, o.err


@pytest.fixture
def db(tmp_path):
    return tmp_path / "h.sqlite3"


def test_regression_flagged_when_intervals_separate_and_pins_named(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", stats={"dc_p50_us": (14.35, 14.2, 14.5, 5)})
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", stats={"dc_p50_us": (15.15, 15.0, 15.3, 5)}, nccl=NCCL_B)
    rc, out, err = run(capsys, res, "--db", db, "--out", tmp_path / "h", "--no-plots")
    assert rc == 0 and err == ""
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
    rc, out, _ = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 0 and "no regression flagged" in out
    assert "lock aaaaaaaa -> bbbbbbbb: same:" in out


def test_single_sample_reports_are_shown_never_judged(tmp_path, db, capsys):
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z", value=14.3)
    report(res, "2", lock=LOCK_B, date="2026-12-02T00:00:00Z", value=29.9, nccl=NCCL_B)  # twice as slow, n=1
    rc, out, _ = run(capsys, res, "--db", db, "--no-plots")
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
    assert rc == 0 and "0 new report(s), 2 already stored" in out
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
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    assert run(capsys, res, "--db", db, "--no-plots")[0] == 0
    con = sqlite3.connect(db)
    con.execute("UPDATE measurements SET samples = ?", ("[1, 'x'",))
    con.commit()
    con.close()
    rc, _, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and err.count("\n") == 1
    assert "measurement 'dc_p50_us' of report" in err and "a damaged history database" in err


def test_the_readme_links_the_committed_history():
    links = re.findall(r"\]\((results/history/[^)]+)\)", (ROOT / "README.md").read_text())
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
    assert rc == 0 and "plots: 2 PNG(s)" in text
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
    rc, out, err = run(capsys, ROOT / "results", "--db", db, "--no-plots")
    assert rc == 0 and err == "", err
    m = re.search(r"(\d+) new report\(s\), 0 already stored, \d+ other JSON file\(s\) passed over, 0 skipped", out)
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
    assert "1 new report(s), 0 already stored, 1 other JSON file(s) passed over, 2 skipped" in out
    assert "Traceback" not in err + out
    assert read_report(good).gate == "micro"


def test_a_file_name_of_any_bytes_is_read_and_named_printably(tmp_path, db, capsys):
    res = tmp_path / "results"
    good = report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    good.rename(res / "1" / os.fsdecode(b"m\xff.json"))
    (res / os.fsdecode(b"b\xfe.json")).write_bytes(b'{"gate": "x", "result": "pass", "checks": [')
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and "1 new report(s)" in out
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


def test_without_matplotlib_one_line_names_the_checkout_extra(tmp_path, db, capsys, monkeypatch):
    """A venv made by the README's line (`pip install -e .`, no extras) has no matplotlib: one line, exit 2,
    naming the extra as a checkout installs it (never `reprostack[plots]`, which pip would look up on the index)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    res = tmp_path / "results"
    report(res, "1", lock=LOCK_A, date="2026-12-01T00:00:00Z")
    rc, out, err = run(capsys, res, "--db", db, "--out", tmp_path / "h")
    assert rc == 2
    assert err.strip().splitlines() == [
        "reprostack: error: history plots need matplotlib, the `plots` extra: pip install -e '.[plots]' in this "
        "checkout, or pass --no-plots"
    ]
    assert not db.exists() and not (tmp_path / "h").exists()


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
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 0 and "\x1b" not in out + err and "\x07" not in out + err and "p?]0;owned??[2J" in out
    con.execute("UPDATE measurements SET samples = ?", ("[NaN, 1e999]",))
    con.commit()
    con.close()
    rc, out, err = run(capsys, res, "--db", db, "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and "not a finite number" in err, err


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
