"""verify-report on SIGNED runs (reprostack.evidence.verify.signed): a micro run made here (the stand-in GPU host), signed with
a key of the project's keyring, holds and names who signed it; a file added after signing, a report re-signed by
an insider against a spec its commit does not hold, a deliberate run re-signed as ordinary data, a commit that is
not in the repository and a key outside the keyring each fail with one line."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

from reprostack import cli, evidence
from reprostack.evidence.attest.keys import entry_name
from reprostack.evidence.attest.runs import finish_run
from test_evidence import HOST
from test_gate_micro_flow import gpu_host  # noqa: F401  (fixture: the stand-in GPU host)
from test_verify_report import commit_all


def git(root: Path, *argv: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *argv],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def signed_run(tmp_path: Path, purpose_=None, **kw):
    """A passing micro run at a clean commit, its folder signed with a key of the project's keys/."""
    import gaterun
    from reprostack.report import write_reports, utc_now
    from test_gate_micro_flow import options, stand_in_python
    from trialslog import real_ep1_texts, trials_log

    run = options(tmp_path, stand_in_python(tmp_path, trials_log(real_ep1_texts(3))), threshold="30", trials=3, **kw)
    run = run.with_(profile="h200-ep1")
    signer = evidence.new_key(tmp_path / "op.pem")
    entry = evidence.public_entry(signer, "an operator")
    (run.root / "keys").mkdir()
    (run.root / "keys" / entry_name(entry)).write_text(json.dumps(entry))
    commit_all(run.root)
    started = utc_now()
    rep = gaterun.run(run)
    assert rep.result == "pass", rep.reason
    write_reports([rep], run.out_dir)
    env = {"REPROSTACK_SIGNING_KEY": str(tmp_path / "op.pem")}
    line = finish_run(
        run.out_dir,
        kind="gate",
        verdict="pass",
        exit_code=0,
        project=rep.provenance["project"],
        started=started,
        ended=utc_now(),
        reports=[rep.to_dict()],
        purpose_=purpose_,
        argv=["reprostack", "gate", "micro"],
        host=HOST,
        environ=env,
    )
    assert line.startswith("attested: ")
    return run, signer


def vr(run, capsys) -> tuple[int, str]:
    rc = cli.main(["verify-report", str(run.out_dir)])
    return rc, capsys.readouterr().out


def resign(run, signer, edit_report=None, edit_predicate=None):
    """An insider's re-signing: the report edited, the predicate edited, the folder signed again with a keyring key."""
    att = run.out_dir / "run.intoto.jsonl"
    st = json.loads(base64.b64decode(json.loads(att.read_text())["payload"]))
    if edit_report:
        p = run.out_dir / "micro.json"
        doc = json.loads(p.read_text())
        edit_report(doc)
        p.write_text(json.dumps(doc, indent=1))
    pred = st["predicate"]
    if edit_predicate:
        edit_predicate(pred)
    evidence.attest_folder(run.out_dir, pred, signer)


def test_a_signed_run_holds_and_says_who_signed(tmp_path, gpu_host, capsys, monkeypatch):
    run, signer = signed_run(tmp_path)
    monkeypatch.chdir(run.root)
    rc, out = vr(run, capsys)
    assert rc == 0, out
    assert f"(signed by an operator ({signer.public_key.keyid[:12]}))" in out
    assert out.strip().splitlines()[-1] == "verify-report: 1 of 1 report(s) hold (1 signed, 0 UNSIGNED)"


def test_a_file_added_or_changed_after_signing_fails(tmp_path, gpu_host, capsys, monkeypatch):
    run, _ = signed_run(tmp_path)
    monkeypatch.chdir(run.root)
    (run.out_dir / "cli.log").write_text("micro [h200-ep1]: PASS 9.9 us\n")
    rc, out = vr(run, capsys)
    assert rc == 1 and "cli.log: no subject of the attestation covers it (added after signing)" in out, out
    (run.out_dir / "cli.log").unlink()
    log = run.out_dir / "micro" / "test_ep.log"
    log.write_text(log.read_text() + "\n")
    rc, out = vr(run, capsys)
    assert rc == 1 and "test_ep.log: its sha256 is not the attested one (changed after signing)" in out, out


def test_a_report_re_signed_against_another_spec_is_judged_at_its_own_commit(tmp_path, gpu_host, capsys, monkeypatch):
    run, signer = signed_run(tmp_path)
    monkeypatch.chdir(run.root)
    spec = run.root / "gates" / "micro.yaml"
    spec.write_text(spec.read_text().replace("threshold: 30\n", "threshold: 300\n"))
    git(run.root, "commit", "-qam", "a laxer bar, later")
    import hashlib

    lax = hashlib.sha256(spec.read_bytes()).hexdigest()

    def report(doc):
        doc["provenance"]["gate_spec_sha256"] = lax
        next(c for c in doc["checks"] if c["metric"] == "dc_p50_us")["threshold"] = 300

    resign(run, signer, report, lambda p: p["gates"][0].update(spec_sha256=lax))
    rc, out = vr(run, capsys)
    line = next(ln for ln in out.splitlines() if ln.startswith(("OK", "FAIL")))
    assert rc == 1 and line.startswith("FAIL") and "is not the one of its run's commit" in line, out


def test_a_deliberate_run_re_signed_without_its_flag_fails(tmp_path, gpu_host, capsys, monkeypatch):
    run, signer = signed_run(tmp_path, purpose_=evidence.purpose("deliberate", {"num_sms": 8}))
    monkeypatch.chdir(run.root)
    resign(run, signer)
    rc, out = vr(run, capsys)
    assert rc == 1 and "its signed run was deliberate, but the report no longer records data.deliberate" in out, out


def test_a_commit_not_in_the_repository_and_a_key_not_in_the_keyring_fail(tmp_path, gpu_host, capsys, monkeypatch):
    run, signer = signed_run(tmp_path)
    monkeypatch.chdir(run.root)
    resign(run, signer, edit_predicate=lambda p: p["project"].update(commit="f" * 40))
    rc, out = vr(run, capsys)
    assert rc == 1 and f"its signed run's commit {'f' * 12} is not a commit of this repository" in out, out
    stranger = evidence.new_key(tmp_path / "stranger.pem")
    resign(run, stranger)
    rc, out = vr(run, capsys)
    assert rc == 1 and "which is not in the keyring" in out, out


def test_verify_report_holds_the_log_of_signed_runs_under_results(tmp_path, gpu_host, capsys, monkeypatch):
    """A signed run committed under results/ must be in results/attestations.jsonl (reprostack log add); removing
    its entry (or the run) is one FAIL line of verify-report."""
    run, _ = signed_run(tmp_path, out_dir=tmp_path / "project" / "results" / "run1")
    monkeypatch.chdir(run.root)
    rc = cli.main(["verify-report", "results/run1"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL results/run1: a signed run not in results/attestations.jsonl" in out, out
    assert cli.main(["log", "add", "results/run1"]) == 0
    git(run.root, "add", "-A")
    git(run.root, "commit", "-qm", "the signed run and its log entry")
    capsys.readouterr()
    rc = cli.main(["verify-report", "results/run1"])
    out = capsys.readouterr().out
    assert rc == 0 and out.strip().endswith("1 of 1 report(s) hold (1 signed, 0 UNSIGNED)"), out
    (run.root / "results" / "attestations.jsonl").write_text("")  # the entry removed
    rc = cli.main(["verify-report", "results/run1"])
    assert rc == 1 and "FAIL results/run1: a signed run not in results/attestations.jsonl" in capsys.readouterr().out


def test_a_committed_run_re_attested_now_says_so_and_is_judged_at_the_commit_that_added_it(
    tmp_path, capsys, monkeypatch
):
    """Issue 39 item 8, in a clone: the slowed sms8 run (its spec and lock those of the commit that first added it) is
    re-attested now from what its report recorded, logged, and holds, signed and marked re-attested with the date; the
    K=5 run of 2026-12-02 (its recorded spec is not the one of the commit that added it) cannot be re-attested into
    holding: it FAILs on that line, so it stays unsigned."""
    from test_forgeries import ROOT, RUN, sh

    c = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", "-s", str(ROOT), str(c))
    signer = evidence.new_key(tmp_path / "k.pem")
    entry = evidence.public_entry(signer, "re-attester")
    (c / "keys" / entry_name(entry)).write_text(json.dumps(entry))
    monkeypatch.chdir(c)
    monkeypatch.setenv("REPROSTACK_SIGNING_KEY", str(tmp_path / "k.pem"))
    # the clone as it was before the integrator re-attested the committed runs (scripts/reattest.py): sms8 unsigned,
    # the log without it
    signed = f"{RUN}/sms8/run.intoto.jsonl"
    if (c / signed).exists():
        added = sh(c, "git", "log", "--format=%H", "--diff-filter=A", "-1", "--", signed).strip()
        sh(c, "git", "rm", "-q", signed)
        log = "results/attestations.jsonl"
        if sh(c, "git", "ls-tree", f"{added}^", "--", log).strip():
            sh(c, "git", "checkout", f"{added}^", "--", log)
        else:  # the log began with that commit
            sh(c, "git", "rm", "-q", log)
    why = "re-derived now: verify-report holds its figures to its raw logs"
    assert cli.main(["attest", f"{RUN}/sms8", "--re-attest", why]) == 0
    assert cli.main(["log", "add", f"{RUN}/sms8"]) == 0
    capsys.readouterr()
    rc = cli.main(["verify-report", f"{RUN}/sms8"])
    out = capsys.readouterr().out
    assert rc == 0 and "(signed by re-attester (" in out, out
    ck = evidence.check_folder(c / RUN / "sms8", evidence.Keyring.read(c / "keys"))
    assert ck.predicate["re_attested"]["why"] == why and ck.predicate["purpose"]["kind"] == "deliberate"
    assert ck.predicate["project"]["source"] == "re-attested: the commit that first added it"
    k5 = "results/gate_micro/2026-12-02-h200-ep1-k5"
    assert cli.main(["attest", k5, "--re-attest", why]) == 0
    capsys.readouterr()
    rc = cli.main(["verify-report", k5])
    out = capsys.readouterr().out
    assert rc == 1 and "gates/micro.yaml" in out and "is not the one of its run's commit" in out, out


def _predicate(folder: Path) -> dict:
    env = json.loads((folder / "run.intoto.jsonl").read_text())
    return json.loads(base64.b64decode(env["payload"]))["predicate"]


def _sign(folder: Path, tmp_path: Path, reports: list[dict]) -> dict:
    if not (tmp_path / "k.pem").exists():
        evidence.new_key(tmp_path / "k.pem")
    line = finish_run(
        folder,
        kind="gate",
        verdict="pass",
        exit_code=0,
        project={"commit": "0" * 40, "dirty": False},
        started="2026-12-06T00:00:00Z",
        ended="2026-12-06T00:00:01Z",
        reports=reports,
        argv=["reprostack", "gate", "micro"],
        environ={"REPROSTACK_SIGNING_KEY": str(tmp_path / "k.pem")},
    )
    assert line.startswith("attested: ")
    return _predicate(folder)


def test_the_attestation_names_the_host_inventory_the_run_recorded(tmp_path, monkeypatch):
    """One inventory per run: the attestation's host facts are those the run's reports recorded at its start, not a
    second round of nvidia-smi calls at its end (three per gate run, on the warm path's clock); a stand-in run's
    reports play a p5en host, so its attestation still names this machine."""
    from reprostack import hostinfo
    from reprostack.evidence.attest.statement import host_facts

    calls = []
    real = dict(HOST, hostname="this-machine")
    monkeypatch.setattr(hostinfo, "collect", lambda **kw: calls.append(1) or real)
    recorded = dict(HOST, hostname="the-gpu-node")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "micro.json").write_text("{}")
    rep = {"gate": "micro", "profile": "h200-ep1", "result": "pass", "provenance": {"host": recorded}}
    assert _sign(folder, tmp_path, [rep])["host"] == host_facts(recorded) and calls == []

    standin = {**rep, "provenance": {"host": {**recorded, "stand_in": True}, "stand_in": {"recording": "h200"}}}
    for reports in ([standin], [rep, {"gate": "vllm", "result": "error", "provenance": {}}], []):
        (folder / "run.intoto.jsonl").unlink()
        assert _sign(folder, tmp_path, reports)["host"]["hostname"] == "this-machine"
    assert len(calls) == 3
