"""reprostack.evidence: a run folder signed with an ed25519 file key (DSSE envelope around an in-toto Statement v1,
predicate https://reprostack.dev/run/v1) and checked against a keyring: every subject, every uncovered file, a
changed statement, an unknown key, a keyring entry claiming another key's id; `reprostack keys new|show|list`.
Real keys (securesystemslib + pyca/cryptography), real files, no network."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from reprostack import cli, evidence
from test_gate_micro import gpu_less  # noqa: F401  (fixture: PATH without nvidia-smi)
from reprostack.evidence.attest import keys as keysmod
from reprostack.evidence.attest.keys import KeyError_
from reprostack.evidence.attest.statement import StatementError

ROOT = Path(__file__).resolve().parents[1]
HOST = {
    "hostname": "vm",
    "kernel": "6.8.0",
    "gpus": [{"name": "NVIDIA H200", "index": 0}],
    "driver_version": "580.159.04",
    "cuda_driver_version": "13.0",
    "efa_devices": [],
    "identity": {"gpu_uuids": ["GPU-0b5e3c1a-1111-2222-3333-444455556666"], "machine_id": None, "boot_id": None},
}


def make_key(tmp_path: Path, who: str = "tester") -> tuple[object, Path]:
    """A fresh key at tmp/key.pem and its public half in tmp/keys/."""
    signer = evidence.new_key(tmp_path / "key.pem")
    entry = evidence.public_entry(signer, who)
    ring = tmp_path / "keys"
    ring.mkdir(exist_ok=True)
    (ring / keysmod.entry_name(entry)).write_text(json.dumps(entry))
    return signer, ring


def predicate(**over) -> dict:
    kw = dict(
        kind="gate",
        argv=["reprostack", "gate", "micro"],
        verdict="pass",
        project={"commit": "8bb97a9" + "0" * 33, "dirty": False, "source": "git"},
        host=HOST,
        started="2026-12-06T01:00:00Z",
        ended="2026-12-06T01:01:00Z",
        gates=[
            {
                "gate": "micro",
                "profile": "h200-ep1",
                "result": "pass",
                "report": "micro.json",
                "spec_sha256": "a" * 64,
                "evidence": True,
            }
        ],
        lock_sha256="b" * 64,
        stack="campaign",
    )
    kw.update(over)
    return evidence.run_predicate(**kw)


def run_folder(tmp_path: Path) -> Path:
    f = tmp_path / "run"
    (f / "micro").mkdir(parents=True)
    (f / "micro.json").write_text('{"gate": "micro"}\n')
    (f / "micro" / "test_ep.log").write_text("D+C 14.41 us\n")
    (f / "cli.log").write_text("micro [h200-ep1]: PASS\n")
    return f


def test_a_signed_folder_holds_and_names_who_signed(tmp_path):
    signer, ring = make_key(tmp_path, "reprostack session 12 integrator")
    f = run_folder(tmp_path)
    att = evidence.attest_folder(f, predicate(), signer)
    assert att.name == "run.intoto.jsonl" and len(att.read_text().splitlines()) == 1
    c = evidence.check_folder(f, evidence.Keyring.read(ring))
    assert c.ok and c.signed and c.files == 3 and not c.uncovered, c.problems
    st = c.opened.statement
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://reprostack.dev/run/v1"
    assert sorted(s["name"] for s in st["subject"]) == ["cli.log", "micro.json", "micro/test_ep.log"]
    assert c.predicate["host"]["gpus"] == [{"name": "NVIDIA H200", "uuid": "GPU-0b5e3c1a-1111-2222-3333-444455556666"}]
    assert c.predicate["purpose"] == {"kind": "ordinary"}
    assert "reprostack session 12 integrator" in c.line()


def test_a_changed_file_a_missing_one_and_an_added_one_are_each_one_line(tmp_path):
    signer, ring = make_key(tmp_path)
    f = run_folder(tmp_path)
    evidence.attest_folder(f, predicate(), signer)
    (f / "cli.log").write_text("micro [h200-ep1]: PASS 9.0 us\n")  # the console transcript says other numbers
    (f / "micro" / "test_ep.log").unlink()
    (f / "extra.json").write_text("{}")
    c = evidence.check_folder(f, evidence.Keyring.read(ring))
    assert not c.ok
    text = "\n".join(c.problems)
    assert "cli.log: its sha256 is not the attested one" in text
    assert "test_ep.log: a subject of the attestation, missing" in text
    assert "extra.json: no subject of the attestation covers it" in text
    assert c.uncovered == ["extra.json"]


def test_an_edited_statement_or_an_unknown_key_never_verifies(tmp_path):
    signer, ring = make_key(tmp_path)
    f = run_folder(tmp_path)
    att = evidence.attest_folder(f, predicate(), signer)
    env = json.loads(att.read_text())
    st = json.loads(base64.b64decode(env["payload"]))
    st["predicate"]["purpose"] = {"kind": "baseline"}  # a deliberate run made a baseline one
    env["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    att.write_text(json.dumps(env) + "\n")
    c = evidence.check_folder(f, evidence.Keyring.read(ring))
    assert c.problems == [f"{att}:1: the signature does not verify (the statement was changed after signing)"]
    other = evidence.new_key(tmp_path / "other.pem")  # signed by a key nobody committed
    evidence.attest_folder(f, predicate(), other)
    c = evidence.check_folder(f, evidence.Keyring.read(ring))
    assert len(c.problems) == 1 and "which is not in the keyring" in c.problems[0]


@pytest.mark.parametrize(
    "raw, why",
    [
        (b'{"payload": NaN}\n', "NaN is not a number"),
        (b"\xff\xfe{}\n", "not UTF-8"),
        (b"", "no envelope in it"),
        (b'{"payload": "e30=", "payloadType": "text/plain", "signatures": []}\n', "payloadType 'text/plain'"),
        (b"[1]\n", "top level is"),
    ],
)
def test_a_damaged_attestation_is_one_line_naming_it(tmp_path, raw, why):
    _, ring = make_key(tmp_path)
    f = run_folder(tmp_path)
    (f / "run.intoto.jsonl").write_bytes(raw)
    c = evidence.check_folder(f, evidence.Keyring.read(ring))
    assert not c.signed and len(c.problems) == 1 and "run.intoto.jsonl" in c.problems[0] and why in c.problems[0]


def test_an_unsigned_folder_says_so_and_is_no_problem_here(tmp_path):
    c = evidence.check_folder(run_folder(tmp_path), evidence.Keyring({}))
    assert not c.signed and c.ok and c.line() == "unsigned (no *.intoto.jsonl)"


def test_a_keyring_entry_claiming_another_keys_id_is_refused(tmp_path):
    signer, ring = make_key(tmp_path)
    other = evidence.new_key(tmp_path / "other.pem")
    p = next(ring.glob("*.pub.json"))
    d = json.loads(p.read_text())
    d["keyval"] = other.public_key.to_dict()["keyval"]
    p.write_text(json.dumps(d))
    with pytest.raises(KeyError_, match=r"keyid .* is not its key's"):
        evidence.Keyring.read(ring)
    p.write_text('{"keyid": 1}')
    with pytest.raises(KeyError_, match=r"\.pub\.json: \(top\): 'keytype' is a required property"):
        evidence.Keyring.read(ring)


def test_the_predicate_is_held_to_its_schema(tmp_path):
    with pytest.raises(StatementError, match="purpose 'holiday'"):
        evidence.purpose("holiday")
    bad = predicate()
    bad["purpose"] = {"kind": "ordinary", "free": "text"}  # no free text beside the structured fields
    with pytest.raises(StatementError, match="predicate.purpose"):
        evidence.statement([{"name": "a", "digest": {"sha256": "0" * 64}}], bad)


def test_where_the_key_lives_is_one_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("REPROSTACK_SIGNING_KEY", str(tmp_path / "k.pem"))
    assert evidence.key_path() == tmp_path / "k.pem"
    with pytest.raises(KeyError_, match=r"REPROSTACK_SIGNING_KEY names no file"):
        evidence.configured_signer()
    monkeypatch.delenv("REPROSTACK_SIGNING_KEY")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert evidence.key_path() == tmp_path / "cfg" / "reprostack" / "signing-key.pem"
    signer, why = evidence.configured_signer()
    assert signer is None and why.startswith("unsigned: no key at ")


def test_keys_new_show_list_through_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    key, ring = tmp_path / "op.pem", tmp_path / "ring"
    assert cli.main(["keys", "new", "--who", "an operator", "--key", str(key), "--keyring", str(ring)]) == 0
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    (pub,) = ring.glob("an-operator-*.pub.json")
    assert "PRIVATE" not in pub.read_text() and json.loads(pub.read_text())["who"] == "an operator"
    assert cli.main(["keys", "new", "--who", "x", "--key", str(key), "--keyring", str(ring)]) == 2
    assert "is already there; it is never overwritten" in capsys.readouterr().err
    monkeypatch.setenv("REPROSTACK_SIGNING_KEY", str(key))
    assert cli.main(["keys", "show", "--keyring", str(ring)]) == 0
    assert "in the keyring as an operator" in capsys.readouterr().out
    assert cli.main(["keys", "list", "--keyring", str(ring)]) == 0
    assert "1 key(s)" in capsys.readouterr().out
    key.write_text("not a key")
    assert cli.main(["keys", "show", "--keyring", str(ring)]) == 2
    assert "not an unencrypted PEM PKCS#8 key" in capsys.readouterr().err


def test_the_committed_keyring_loads_and_names_the_integrator():
    ring = evidence.Keyring.read(ROOT / "keys")
    assert "reprostack session 12 integrator" in {h.who for h in ring.holders.values()}


def test_a_private_key_refused_inside_the_keyring(tmp_path, capsys):
    k = tmp_path / "k"
    assert cli.main(["keys", "new", "--who", "x", "--key", str(k / "a.pem"), "--keyring", str(k)]) == 2
    assert "a private key never goes there" in capsys.readouterr().err and not (k / "a.pem").exists()


# --------------------------------------------------------------------------- a gate run ends with its attestation


def test_a_gate_run_is_signed_when_a_key_is_configured_and_says_unsigned_otherwise(
    tmp_path, gpu_less, capsys, monkeypatch
):
    from test_gate_training import training_project

    root, _ = training_project(tmp_path)
    monkeypatch.chdir(root)
    args = ["--lock", str(root / "upstreams.lock"), "--cache", str(tmp_path / "cache")]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nocfg"))
    monkeypatch.delenv("REPROSTACK_SIGNING_KEY", raising=False)
    assert cli.main(["gate", "megatron", *args, "--out", str(tmp_path / "a")]) == 3
    assert capsys.readouterr().out.splitlines()[-1].startswith("unsigned: no key at ")
    assert not list((tmp_path / "a").glob("*.intoto.jsonl"))
    signer, ring = make_key(tmp_path, "gate runner")
    monkeypatch.setenv("REPROSTACK_SIGNING_KEY", str(tmp_path / "key.pem"))
    assert cli.main(["gate", "megatron", *args, "--out", str(tmp_path / "b"), "--purpose", "baseline"]) == 3
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"attested: {tmp_path / 'b' / 'run.intoto.jsonl'} (key {signer.public_key.keyid[:12]})")
    c = evidence.check_folder(tmp_path / "b", evidence.Keyring.read(ring))
    assert c.ok and c.signed, c.problems
    p = c.predicate
    assert p["kind"] == "gate" and p["verdict"] == "skip" and p["exit_code"] == 3
    assert p["purpose"] == {"kind": "baseline"}
    assert [g["gate"] for g in p["gates"]] == ["megatron"] and p["gates"][0]["spec_sha256"]
    assert "commit" in p["project"] and p["lock_sha256"] and p["stack"] == "campaign"
    assert {"megatron.json", "summary.json", "summary.md", "junit.xml"} <= {
        s["name"] for s in c.opened.statement["subject"]
    }
    monkeypatch.setenv("REPROSTACK_SIGNING_KEY", str(tmp_path / "typo.pem"))  # a named key that is not there
    assert cli.main(["gate", "megatron", *args, "--out", str(tmp_path / "c")]) == 2
    assert "REPROSTACK_SIGNING_KEY names no file" in capsys.readouterr().err


def test_a_deliberate_variation_is_signed_as_one_whatever_was_asked():
    from reprostack.evidence.attest.runs import purpose_of

    rep = {"data": {"deliberate": {"num_sms": 16, "why": "--num-sms: DeepEP given this many SMs"}}}
    assert purpose_of([rep], "baseline") == {
        "kind": "deliberate",
        "how": {"num_sms": 16},
        "why": "--num-sms: DeepEP given this many SMs",
    }
    assert purpose_of([{"data": {}}], "baseline") == {"kind": "baseline"}


def test_a_transcript_written_while_the_run_signs_is_left_out_then_bound_by_attest(tmp_path, gpu_less, monkeypatch):
    """`gate ... --out D > D/cli.log`: the gate signs before its transcript is complete, so it leaves cli.log out and
    says so; verify flags it until `reprostack attest D` signs it, every other subject checked first."""
    import os
    import subprocess
    import sys

    from test_gate_training import training_project

    root, _ = training_project(tmp_path)
    signer, ring = make_key(tmp_path, "transcript test")
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "REPROSTACK_SIGNING_KEY": str(tmp_path / "key.pem")}
    argv = [sys.executable, "-m", "reprostack", "gate", "megatron", "--lock", str(root / "upstreams.lock")]
    argv += ["--cache", str(tmp_path / "cache"), "--out", str(out)]
    with open(out / "cli.log", "w") as log:
        rc = subprocess.run(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    text = (out / "cli.log").read_text()
    assert rc == 3 and "this output (cli.log) is not signed yet" in text, text
    c = evidence.check_folder(out, evidence.Keyring.read(ring))
    assert c.uncovered == ["cli.log"] and c.predicate["unsigned_transcript"] == "cli.log"
    (root / "keys").mkdir()
    for p in ring.glob("*.pub.json"):
        (root / "keys" / p.name).write_text(p.read_text())
    (out / "megatron.json").write_text((out / "megatron.json").read_text() + " ")  # a subject changed: refused
    r = subprocess.run([*argv[:3], "attest", str(out)], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "megatron.json: its sha256 is not the attested one" in r.stderr, r.stderr
    (out / "megatron.json").write_text((out / "megatron.json").read_text()[:-1])
    r = subprocess.run([*argv[:3], "attest", str(out)], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "added cli.log" in r.stdout, r.stderr
    c = evidence.check_folder(out, evidence.Keyring.read(ring))
    assert c.ok and [a["name"] for a in c.predicate["added_after"]] == ["cli.log"]
    assert "unsigned_transcript" not in c.predicate


@pytest.mark.integration  # project.state and hostinfo.collect start git and nvidia-smi
def test_an_image_build_folder_is_signed_with_its_images(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from reprostack.cmd.build import _attest
    from reprostack.lock import load

    signer, ring = make_key(tmp_path, "builder")
    monkeypatch.setenv("REPROSTACK_SIGNING_KEY", str(tmp_path / "key.pem"))
    out = tmp_path / "build"
    out.mkdir()
    (out / "images.json").write_text("{}")
    (out / "deepep.log").write_text("step 1/26\n")
    built = [SimpleNamespace(name="deepep", image_id="sha256:" + "c" * 64)]
    line = _attest(out, built, ROOT, load(ROOT / "upstreams.lock"), "2026-12-06T01:00:00Z")
    assert line.startswith(f"attested: {out / 'run.intoto.jsonl'}")
    c = evidence.check_folder(out, evidence.Keyring.read(ring))
    assert c.ok and c.predicate["kind"] == "image-build" and c.predicate["verdict"] == "ok"
    assert c.predicate["images"] == [{"name": "deepep", "id": "sha256:" + "c" * 64, "digest": None}]
    assert c.predicate["lock_sha256"] and c.predicate["project"]["commit"]


def test_a_stranger_with_only_the_keyring_and_a_run_folder_verifies_it(tmp_path):
    """README: `reprostack verify-run RUN --keyring keys` where there is no checkout (no git, no upstreams.lock): the
    signature, every subject and what the run was; a changed byte is one FAIL line, exit 1."""
    import shutil
    import subprocess
    import sys

    signer, ring = make_key(tmp_path, "the integrator")
    f = run_folder(tmp_path)
    evidence.attest_folder(f, predicate(purpose_=evidence.purpose("deliberate", {"num_sms": 8})), signer)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    shutil.copytree(f, stranger / "run")
    shutil.copytree(ring, stranger / "keys")
    argv = [sys.executable, "-m", "reprostack", "verify-run", "run", "--keyring", "keys"]
    r = subprocess.run(argv, cwd=stranger, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("OK run: signed by the integrator (")
    assert "gate micro [h200-ep1] PASS; deliberate {'num_sms': 8}; commit 8bb97a900000 (clean)" in r.stdout
    assert "NVIDIA H200 GPU-0b5e3c1a-1111-2222-3333-444455556666, driver 580.159.04, CUDA 13.0" in r.stdout
    (stranger / "run" / "micro.json").write_text('{"gate": "micro", "result": "pass"}\n')
    r = subprocess.run(argv, cwd=stranger, capture_output=True, text=True)
    assert r.returncode == 1 and "micro.json: its sha256 is not the attested one" in r.stdout
    r = subprocess.run([*argv[:-1], "nope"], cwd=stranger, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--keyring nope: no such folder" in r.stderr
    one_key = next((stranger / "keys").glob("*.pub.json")).relative_to(stranger)  # a key file, not the keyring folder
    r = subprocess.run([*argv[:-1], str(one_key)], cwd=stranger, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"--keyring {one_key}: not a folder" in r.stderr


def test_verify_run_says_a_re_attestation_and_a_missing_gpu_uuid_in_words():
    """A new user's trial: `verify-run` of a committed re-attested run printed `NVIDIA H200 ?` and `re-attested
    {'date': ..., 'why': ...}` (a Python dict); now the UUID's absence and the re-attestation read as words."""
    from reprostack.cmd.verify_run import summary

    pred = predicate()
    pred["host"]["gpus"] = [{"name": "NVIDIA H200", "uuid": None}]
    pred["re_attested"] = {"date": "2026-12-06", "why": "signed after the run, by the integrator"}
    line = summary(pred)
    assert "NVIDIA H200 (UUID not recorded), driver" in line and " ?" not in line
    assert line.endswith("; re-attested 2026-12-06: signed after the run, by the integrator"), line
    assert "{" not in line.split("re-attested")[1]


# --------------------------------------------------------------------------- the hash-chained log (results/)


def _logged_project(tmp_path):
    from reprostack.evidence.attest import log

    signer, ring = make_key(tmp_path, "logger")
    root = tmp_path / "proj"
    for name in ("a", "b"):
        f = root / "results" / name
        f.mkdir(parents=True)
        (f / "micro.json").write_text(f'{{"run": "{name}"}}\n')
        evidence.attest_folder(f, predicate(), signer)
        log.append(root, f, evidence.Keyring.read(ring))
    return root, signer, ring, log


def test_the_log_chains_every_signed_run_and_says_what_was_removed_reordered_or_re_signed(tmp_path):
    root, signer, ring, log = _logged_project(tmp_path)
    path = root / log.LOG
    seen = log.signed_folders(root, root / "results")
    assert log.check(root, path, folders_seen=seen)[0] == [] and seen == ["results/a", "results/b"]
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[1])  # the first run's entry removed
    assert "the chain is broken" in log.check(root, path)[0][0]
    path.write_bytes(lines[1] + lines[0])  # reordered
    assert "the chain is broken" in log.check(root, path)[0][0]
    path.write_bytes(b"".join(lines))
    evidence.attest_folder(root / "results" / "a", predicate(verdict="fail"), signer)  # re-signed after logging
    assert log.check(root, path)[0] == [
        f"{log.LOG}:1: run results/a's attestation is not the one logged (re-signed or replaced)"
    ]
    import shutil

    shutil.rmtree(root / "results" / "b")  # a run removed from results/
    assert f"{log.LOG}:2: run results/b is logged but gone (removed from results/)" in log.check(root, path)[0]
    (root / "results" / "c").mkdir()
    (root / "results" / "c" / "micro.json").write_text("{}")
    evidence.attest_folder(root / "results" / "c", predicate(), signer)  # signed, never logged
    probs, _ = log.check(root, path, folders_seen=log.signed_folders(root, root / "results"))
    assert f"results/c: a signed run not in {log.LOG} (reprostack log add results/c)" in probs


def test_log_add_refuses_unsigned_twice_and_a_broken_chain(tmp_path):
    from reprostack.evidence.attest.log import LogError

    root, signer, ring, log = _logged_project(tmp_path)
    keyring = evidence.Keyring.read(ring)
    with pytest.raises(LogError, match="already in results/attestations.jsonl"):
        log.append(root, root / "results" / "a", keyring)
    (root / "results" / "u").mkdir()
    (root / "results" / "u" / "x.json").write_text("{}")
    with pytest.raises(LogError, match="results/u: unsigned: only a signed run folder is logged"):
        log.append(root, root / "results" / "u", keyring)
    path = root / log.LOG
    path.write_bytes(path.read_bytes().splitlines(keepends=True)[1])
    evidence.attest_folder(root / "results" / "u", predicate(), signer)
    with pytest.raises(LogError, match="the chain must hold before anything is added"):
        log.append(root, root / "results" / "u", keyring)


def test_a_signed_payload_nested_past_the_bound_is_one_line(tmp_path):
    """Found by the kernel cache's fuzz (issue 41): a payload nested thousands deep, signed by a keyring key, was a
    RecursionError out of open_envelope; now one line."""
    from securesystemslib.dsse import Envelope

    signer, ring = make_key(tmp_path)
    env = Envelope(b"[" * 5000 + b"]" * 5000, evidence.PAYLOAD_TYPE, {})
    env.sign(signer)
    with pytest.raises(evidence.EvidenceError, match="nested deeper than"):
        evidence.open_envelope(env.to_dict(), evidence.Keyring.read(ring), "x")


@pytest.mark.e2e  # the CLI's gate run over real local git repositories (test_cli's world)
def test_a_gate_run_that_died_at_a_stage_is_signed_as_one(tmp_path, capsys, monkeypatch):
    """A run that died at its fetch (offline, empty cache) writes its ERROR report (issue 40) and is signed too: the
    predicate says error, exit 2."""
    from test_cli import run, world  # noqa: F401  (world: a fixture)

    args = world.__wrapped__(tmp_path)[2] if hasattr(world, "__wrapped__") else None
    if args is None:
        pytest.skip("the world fixture of test_cli cannot be called directly here")
    signer, ring = make_key(tmp_path, "died")
    monkeypatch.setenv("REPROSTACK_SIGNING_KEY", str(tmp_path / "key.pem"))
    out = tmp_path / "reports"
    code, stdout, err = run(capsys, "gate", "micro", *args, "--offline", "--out", str(out))
    assert code == 2 and "is not in the cache" in err
    c = evidence.check_folder(out, evidence.Keyring.read(ring))
    assert c.ok and c.signed and c.predicate["verdict"] == "error" and c.predicate["exit_code"] == 2, c.problems
