"""The six forgeries of issue 39, each made from a committed run in a clone of this repository, as a hostile reviewer
would, and a damaged report: `reprostack verify-report` rejects each with one FAIL line saying why, exit 1. On
8bb97a9 each of them said "hold" (exit 0) and a damaged report was passed over ("42 of 42").

The slowed run is results/gate_micro/2026-12-03-h200-ep1-baseline/call-b/sms8 (--num-sms 8: 17.07 us, FAIL against
the 15.61 us baseline bar). Every forgery is tried twice where it can be: edited in the working tree, and committed
by a forger with commit rights (then only history can tell: a judged unsigned report is the bytes first committed
at its path, and no unsigned run is committed after signing began). Should sms8 be re-attested (scripts/reattest.py),
the same forgeries fail on its signature instead: SIGNED_WHY."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from reprostack import cli

ROOT = Path(__file__).resolve().parents[1]
RUN = "results/gate_micro/2026-12-03-h200-ep1-baseline/call-b"
SMS8 = f"{RUN}/sms8/micro.json"
SMS4 = f"{RUN}/sms4/micro.json"
SIGNED_WHY = ("its sha256 is not the attested one", "no subject of the attestation covers it", "transcript beside")
OLD_SPEC_COMMIT = "c9cc10e"  # gates/micro.yaml before the baseline bar: dc_p50_us <= 30 us, a typed figure


def sh(cwd: Path, *argv: str) -> str:
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path, monkeypatch) -> Path:
    """A clone of this repository's HEAD (objects shared, full history), the cwd of the test."""
    c = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", "-s", str(ROOT), str(c))
    sh(c, "git", "config", "user.email", "forger@example.invalid")
    sh(c, "git", "config", "user.name", "forger")
    monkeypatch.chdir(c)
    return c


def verify(c: Path, capsys, *folders: str) -> tuple[int, str]:
    rc = cli.main(["verify-report", *(folders or (str(c / RUN),))])
    return rc, capsys.readouterr().out


def rejected(out: str, rel: str, *unsigned_why: str) -> bool:
    """The report's line is a FAIL: as an unsigned run (`unsigned, and` one of `unsigned_why`), or, should the run
    have been re-attested since, on its signature (SIGNED_WHY)."""
    line = line_of(out, rel)
    if not line.startswith(f"FAIL {rel}: "):
        return False
    return ("unsigned, and " in line and all(w in line for w in unsigned_why)) or any(w in line for w in SIGNED_WHY)


def line_of(out: str, rel: str) -> str:
    return next(ln for ln in out.splitlines() if ln.split(" ", 2)[1:2] == [f"{rel}:"])


def edit_json(c: Path, rel: str, fn) -> None:
    p = c / rel
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc, indent=1))


def commit(c: Path, what: str) -> None:
    sh(c, "git", "commit", "-q", "-a", "-m", what)


def downgrade(c: Path):
    old = sh(c, "git", "show", f"{OLD_SPEC_COMMIT}:gates/micro.yaml")
    assert "30" in old

    def fn(doc):
        doc["provenance"]["gate_spec_sha256"] = hashlib.sha256(old.encode()).hexdigest()
        ck = next(x for x in doc["checks"] if x["metric"] == "dc_p50_us")
        ck.update(threshold=30, **{"pass": True})
        doc["result"], doc["reason"] = "pass", "3 check(s) passed"

    return fn


@pytest.mark.parametrize("committed", [False, True])
def test_a_spec_downgrade_is_rejected(clone, capsys, committed):
    edit_json(clone, SMS8, downgrade(clone))
    if committed:
        commit(clone, "re-judge sms8 against the old spec")
    rc, out = verify(clone, capsys)
    assert rc == 1 and rejected(out, SMS8, "changed by commit" if committed else "is not the committed bytes"), out


@pytest.mark.parametrize("committed", [False, True])
def test_a_free_text_baseline_exemption_is_rejected(clone, capsys, committed):
    """sms8's bar remade from the slowed sms4 run (23.93 us x 1.07 = 25.6 us), its `why` saying --baseline."""
    sms4 = json.loads((clone / SMS4).read_text())
    mean = sms4["data"]["statistics"]["dc_p50_us"]["mean"]
    bar = round(mean * 1.07, 4)

    def fn(doc):
        b = next(x for x in doc["data"]["bars"] if x["metric"] == "dc_p50_us")
        b["baseline"]["runs"] = [
            {"path": SMS4, "sha256": hashlib.sha256((clone / SMS4).read_bytes()).hexdigest(), "mean": mean}
        ]
        b["baseline"]["why"] = "--baseline: judged against the runs named"
        b["threshold"] = bar
        ck = next(x for x in doc["checks"] if x["metric"] == "dc_p50_us")
        ck.update(threshold=bar, **{"pass": True})
        doc["result"], doc["reason"] = "pass", "3 check(s) passed"

    edit_json(clone, SMS8, fn)
    if committed:
        commit(clone, "sms8 against its own baseline")
    rc, out = verify(clone, capsys)
    line = line_of(out, SMS8)
    assert rc == 1 and line.startswith(f"FAIL {SMS8}: micro [h200-ep1] PASS: "), out
    exempt = "its runs are not the recorded spec's (and no signed --baseline/--baseline-run chose them)"
    assert exempt in line or any(w in line for w in SIGNED_WHY), line


@pytest.mark.parametrize("committed", [False, True])
def test_a_self_consistent_copy_of_a_run_is_rejected(clone, capsys, committed):
    """A whole passing run (raw logs and report together, every sha256 right) copied as a new run."""
    src, dst = clone / RUN / "normal", clone / "results/gate_micro/2026-12-06-h200-ep1-again/normal"
    dst.parent.mkdir(parents=True)
    sh(clone, "cp", "-r", str(src), str(dst))
    if committed:
        sh(clone, "git", "add", "-A")
        commit(clone, "another baseline run")
    rel = "results/gate_micro/2026-12-06-h200-ep1-again/normal/micro.json"
    rc, out = verify(clone, capsys, str(dst.parent))
    replay = f"FAIL {Path(rel).parent.as_posix()}: a signed run not in results/attestations.jsonl"  # a signed copy
    why = "after signing began" if committed else "is not the committed bytes"
    assert rc == 1 and (rejected(out, rel, why) or replay in out), out


@pytest.mark.parametrize("committed", [False, True])
def test_a_deliberate_run_made_ordinary_is_rejected(clone, capsys, committed):
    edit_json(clone, SMS8, lambda doc: doc["data"].pop("deliberate"))
    if committed:
        commit(clone, "sms8 is an ordinary run")
    rc, out = verify(clone, capsys)
    assert rc == 1 and rejected(out, SMS8), out


def test_a_correction_attaching_a_sha_is_rejected(clone, capsys):
    """sms8's lock replaced by any sha256, and a correction saying it stands for a commit whose pins it records."""
    sha = hashlib.sha256(b"any lock at all").hexdigest()
    edit_json(clone, SMS8, lambda doc: doc["provenance"].update(lock_sha256=sha))
    head = sh(clone, "git", "rev-parse", "HEAD").strip()
    with open(clone / "results/provenance-corrections.yaml", "a") as f:
        f.write(
            f"  - report: {SMS8}\n    report-sha256: {hashlib.sha256((clone / SMS8).read_bytes()).hexdigest()}\n"
            f"    field: lock_sha256\n    recorded: {sha}\n    commit: {head}\n    why: the lock as run\n"
        )
    commit(clone, "a correction")
    rc, out = verify(clone, capsys)
    assert rc == 1 and rejected(out, SMS8), out


@pytest.mark.parametrize("committed", [False, True])
def test_a_console_transcript_with_other_numbers_is_rejected(clone, capsys, committed):
    log = clone / RUN / "sms8.cli.log"
    text = log.read_text()
    assert "17.068" in text
    log.write_text(text.replace("17.068", "14.068").replace("FAIL", "PASS"))
    if committed:
        commit(clone, "the transcript")
    rc, out = verify(clone, capsys)
    assert rc == 1 and rejected(out, SMS8, "sms8.cli.log"), out


@pytest.mark.parametrize("damage, why", [(b"NaN", "NaN is not a number"), (b"\xff", "not UTF-8")])
def test_a_damaged_report_is_a_failure_that_names_it_and_the_count_stays(clone, capsys, damage, why):
    rc0, out0 = verify(clone, capsys)
    n = int(out0.strip().splitlines()[-1].split(" of ")[1].split()[0])
    p = clone / SMS8
    raw = p.read_bytes()
    p.write_bytes(raw.replace(b'"value": 17.068', b'"value": ' + damage, 1) if damage == b"NaN" else damage + raw)
    rc, out = verify(clone, capsys)
    assert rc == 1 and f" of {n} report(s) hold" in out.strip().splitlines()[-1], out
    line = line_of(out, SMS8)
    assert line.startswith(f"FAIL {SMS8}") and (why in line or any(w in line for w in SIGNED_WHY)), line
