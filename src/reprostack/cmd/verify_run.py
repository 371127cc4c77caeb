"""`reprostack verify-run DIR... --keyring KEYS`: verify signed run folders with nothing but a keyring (no checkout
of this repository: `pip install` of the project is enough). Per folder: its attestation verifies with a key of
the keyring, every subject hashes to its record, no file is left uncovered; then what the signed predicate says
(gate, profile, result, what the run was, project commit, lock, host, times), one line.

What it does not do (verify-report does, in a checkout): re-derive the figures from the raw logs and judge the
report against the spec and lock at the run's commit, which needs that commit's files.

Exit 0 every folder holds, 1 one does not (its line says why), 2 bad input (a folder that does not exist, a
malformed keyring), one line. Invariants: reads only; nothing of a statement is shown before its signature verified.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ReprostackError

HELP = "verify signed run folders with only a keyring (no checkout): signature, every subject, what the run was"


def add_arguments(p) -> None:
    p.add_argument("folders", nargs="+", metavar="DIR", help="run folders (each holds run.intoto.jsonl)")
    p.add_argument(
        "--keyring", default=None, metavar="KEYS", help="folder of *.pub.json (default: the project's keys/)"
    )


def summary(pred: dict) -> str:
    """One line of what a verified predicate says."""
    gates = ", ".join(f"{g['gate']} [{g['profile']}] {g['result'].upper()}" for g in pred.get("gates") or [])
    proj = pred.get("project") or {}
    commit = proj.get("commit")
    where = f"commit {commit[:12]}" + (" (dirty tree)" if proj.get("dirty") else " (clean)") if commit else "no commit"
    host = pred.get("host") or {}
    gpus = (
        ", ".join(f"{g['name']} {g.get('uuid') or '(UUID not recorded)'}" for g in host.get("gpus") or []) or "no GPU"
    )
    re_att = pred.get("re_attested")
    if isinstance(re_att, dict):  # {date, why}: a sentence, not a Python dict
        re_att = f"{re_att.get('date')}: {re_att.get('why')}"
    purpose = pred["purpose"]["kind"] + (f" {pred['purpose']['how']}" if pred["purpose"].get("how") else "")
    return (
        f"{pred['kind']} {gates or pred.get('verdict')}; {purpose}; {where}; lock {str(pred.get('lock_sha256'))[:8]}; "
        f"{gpus}, driver {host.get('driver_version')}, CUDA {host.get('cuda_driver_version')}; "
        f"{pred['started']} .. {pred['ended']}" + (f"; re-attested {re_att}" if re_att else "")
    )


def run(args) -> int:
    from .. import evidence, paths

    ring_dir = Path(args.keyring) if args.keyring else paths.project_root() / evidence.KEYRING_DIR
    if not ring_dir.is_dir():
        what = "not a folder" if ring_dir.exists() else "no such folder"
        raise ReprostackError(f"--keyring {ring_dir}: {what} (the keys/ of the project that made the runs)")
    keyring = evidence.Keyring.read(ring_dir)
    bad = 0
    for f in map(Path, args.folders):
        if not f.is_dir():
            raise ReprostackError(f"{f}: no such run folder")
        c = evidence.check_folder(f, keyring)
        if not c.signed and c.ok:
            bad += 1
            print(f"FAIL {f}: unsigned (no *.intoto.jsonl): nothing vouches for it")
        elif not c.ok:
            bad += 1
            print(f"FAIL {f}: {c.line()}")
        else:
            print(f"OK {f}: {c.line()}; {summary(c.predicate)}")
    print(f"verify-run: {len(args.folders) - bad} of {len(args.folders)} run folder(s) hold")
    return 1 if bad else 0
