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
from reprostack.evidence import keys as keysmod
from reprostack.evidence.keys import KeyError_
from reprostack.evidence.statement import StatementError

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
