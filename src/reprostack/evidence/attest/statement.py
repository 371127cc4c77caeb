"""The in-toto Statement v1 of a run: its subjects (the sha256 of every file of the run folder) and its predicate
(type PREDICATE_TYPE, schema `run-attestation`: gate(s), verdict, command line as run, project commit and dirty flag,
lock and spec sha256, image digests, host facts, times, and `purpose`: what this run was).

Invariants:
- subjects are every regular file under the folder (recursively, sorted by path), the attestation files
  (`*.intoto.jsonl`) excepted; a symlink or other non-regular entry is never a subject (verify flags it);
- a Statement is validated against the schema before it is signed (evidence.attest.envelope) and after it is read;
- nothing here writes.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from ...digest import sha256_file
from ...errors import ReprostackError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://reprostack.dev/run/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SUFFIX = ".intoto.jsonl"
NAME = "run" + SUFFIX  # the attestation of a run folder
PURPOSES = ("ordinary", "baseline", "deliberate")


class StatementError(ReprostackError):
    """A statement is not the shape the schema says (one line)."""


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_attestation(name: str) -> bool:
    return name.endswith(SUFFIX)


def folder_entries(folder: Path) -> tuple[list[str], list[str]]:
    """(regular files, other entries: symlinks, FIFOs ...) under `folder`, as sorted POSIX paths relative to it,
    attestation files left out. Symlinked folders are not followed."""
    files, others = [], []
    folder = Path(folder)
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        d = Path(dirpath)
        for n in list(dirnames):
            if (d / n).is_symlink():
                others.append((d / n).relative_to(folder).as_posix())
                dirnames.remove(n)
        for n in filenames:
            p = d / n
            rel = p.relative_to(folder).as_posix()
            if is_attestation(n) and d == folder:
                continue
            if p.is_symlink() or not p.is_file():
                others.append(rel)
            else:
                files.append(rel)
    return sorted(files), sorted(others)


def subjects(folder: Path, exclude: tuple[str, ...] = ()) -> list[dict]:
    """[{name, digest: {sha256}}] of every regular file of the run folder (module doc) but those in `exclude` (the
    command's own transcript, still being written: evidence.attest.runs)."""
    files, _ = folder_entries(folder)
    return [{"name": rel, "digest": {"sha256": sha256_file(Path(folder) / rel)}} for rel in files if rel not in exclude]


def host_facts(host: dict) -> dict:
    """The predicate's host facts from reprostack.hostinfo.collect()'s inventory."""
    ident = host.get("identity") or {}
    uuids = list(ident.get("gpu_uuids") or [])
    gpus = [
        {"name": str(g.get("name", "")), "uuid": uuids[i] if i < len(uuids) else None}
        for i, g in enumerate(host.get("gpus") or [])
    ]
    return {
        "hostname": host.get("hostname"),
        "kernel": host.get("kernel"),
        "machine_id": ident.get("machine_id"),
        "boot_id": ident.get("boot_id"),
        "gpus": gpus,
        "driver_version": host.get("driver_version"),
        "cuda_driver_version": host.get("cuda_driver_version"),
        "efa_devices": len(host.get("efa_devices") or []),
    }


def purpose(kind: str = "ordinary", how: dict | None = None, why: str | None = None) -> dict:
    """The predicate's `purpose`: what this run was (PURPOSES), how (a deliberate variation's options), why."""
    if kind not in PURPOSES:
        raise StatementError(f"purpose {kind!r}: one of {', '.join(PURPOSES)}")
    out: dict = {"kind": kind}
    if how:
        out["how"] = dict(how)
    if why:
        out["why"] = why[:500]
    return out


def run_predicate(
    *,
    kind: str,
    argv: list[str],
    verdict: str | None,
    project: dict,
    host: dict,
    started: str,
    ended: str,
    purpose_: dict | None = None,
    exit_code: int | None = None,
    gates: list[dict] | None = None,
    lock_sha256: str | None = None,
    stack: str | None = None,
    images: list[dict] | None = None,
    cwd: str | None = None,
    re_attested: dict | None = None,
) -> dict:
    """The run predicate (schema `run-attestation`, $defs/run). `host`: hostinfo.collect()'s inventory."""
    proj = {k: project.get(k) for k in ("commit", "dirty")}
    for k in ("source", "why"):
        if isinstance(project.get(k), str):
            proj[k] = project[k]
    pred = {
        "kind": kind,
        "purpose": purpose_ or purpose(),
        "command": {"argv": [str(a) for a in argv], **({"cwd": cwd} if cwd else {})},
        "verdict": verdict,
        "exit_code": exit_code,
        "gates": list(gates or []),
        "project": proj,
        "lock_sha256": lock_sha256,
        "stack": stack,
        "images": list(images or []),
        "host": host_facts(host),
        "started": started,
        "ended": ended,
        "attested": utc_now(),
    }
    if re_attested:
        pred["re_attested"] = re_attested
    return pred


def statement(subjects_: list[dict], predicate: dict, predicate_type: str = PREDICATE_TYPE) -> dict:
    """An in-toto Statement v1 (a run statement is validated against its schema)."""
    st = {"_type": STATEMENT_TYPE, "subject": subjects_, "predicateType": predicate_type, "predicate": predicate}
    if predicate_type == PREDICATE_TYPE:
        validate(st)
    return st


def validate(st: dict, where: str = "statement") -> None:
    """Raise StatementError (one line) unless `st` is a run statement of the schema."""
    import jsonschema

    from ... import schemas

    try:
        jsonschema.validate(st, schemas.load("run-attestation"))
    except jsonschema.ValidationError as e:
        at = ".".join(str(x) for x in e.absolute_path) or "(top)"
        raise StatementError(f"{where}: {at}: {' '.join(e.message.split())[:200]}") from None
