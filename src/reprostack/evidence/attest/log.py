"""The append-only, hash-chained log of attestations (in the spirit of Rekor's transparency log): `results/
attestations.jsonl`, one JSON line per signed run folder committed under results/, in the order they were added.

Each entry: {"seq": N (0, 1, ...), "prev": sha256 of the previous line's bytes (64 zeros for the first), "folder":
the run folder's project path, "attestation_sha256": sha256 of its `run.intoto.jsonl` bytes, "keyid", "kind",
"verdict", "added": UTC time}. Removing or reordering an entry breaks the chain of `prev`; removing or re-signing a
run folder leaves an entry whose folder or attestation no longer matches; a signed folder that no entry names was
not logged. `check(root, log)` says each of these in one line (verify-report prints them).

Invariants: `append` only ever adds a line at the end (never rewrites one), after the folder's attestation verified
with the keyring; the log is untrusted input (bounded JSON Lines, every field checked); a line that is not what
`append` writes is one problem naming its line.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ...digest import sha256_file
from ...errors import ReprostackError
from .check import attestations, check_folder
from .statement import NAME, utc_now

LOG = "results/attestations.jsonl"
ZERO = "0" * 64
_SHA = re.compile(r"^[0-9a-f]{64}$")
FIELDS = {"seq", "prev", "folder", "attestation_sha256", "keyid", "kind", "verdict", "added"}


class LogError(ReprostackError):
    """The log cannot be appended to (one line)."""


def _lines(path: Path) -> list[bytes]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return [ln for ln in raw.split(b"\n") if ln.strip()]


def append(root: Path, folder: Path, keyring) -> dict:
    """Add the signed run `folder` (inside the project) to the log. Raises LogError when it does not verify, is
    already logged, or the log's chain is broken (fix that first: never build on a broken chain)."""
    root, folder = Path(root).resolve(), Path(folder).resolve()
    try:
        rel = folder.relative_to(root).as_posix()
    except ValueError:
        raise LogError(f"{folder}: not inside the project {root}") from None
    c = check_folder(folder, keyring)
    if not c.signed or not c.ok:
        raise LogError(f"{rel}: " + (c.problems[0] if c.problems else "unsigned: only a signed run folder is logged"))
    path = root / LOG
    problems, entries = check(root, path, keyring=None, folders_seen=None)
    if problems:
        raise LogError(f"{LOG}: {problems[0]} (the chain must hold before anything is added)")
    if any(e["folder"] == rel for e in entries):
        raise LogError(f"{rel}: already in {LOG}")
    sha = sha256_file(folder / NAME)
    if any(e["attestation_sha256"] == sha for e in entries):
        raise LogError(f"{rel}: its attestation is logged already for another folder (a copy of a signed run)")
    lines = _lines(path)
    entry = {
        "seq": len(lines),
        "prev": hashlib.sha256(lines[-1]).hexdigest() if lines else ZERO,
        "folder": rel,
        "attestation_sha256": sha,
        "keyid": c.opened.keyid,
        "kind": c.predicate["kind"],
        "verdict": c.predicate.get("verdict"),
        "added": utc_now(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:  # append only: an earlier line is never rewritten
        f.write(json.dumps(entry, sort_keys=True).encode() + b"\n")
    return entry


def check(root: Path, path: Path, keyring=None, folders_seen=None) -> tuple[list[str], list[dict]]:
    """(problems, entries) of the log at `path`: the chain of `prev`, `seq` in order, each entry's folder holding the
    attestation it names; `folders_seen` (signed run folders found, project paths): each must be logged."""
    from ... import jsonsrc

    problems, entries, prev = [], [], ZERO
    for n, raw in enumerate(_lines(path), 1):
        where = f"{LOG}:{n}"
        try:
            e = jsonsrc.loads(raw, LOG, LogError, n)
        except LogError as x:
            problems.append(str(x))
            break
        if set(e) != FIELDS or not all(isinstance(e.get(k), str) for k in ("prev", "folder", "attestation_sha256")):
            problems.append(f"{where}: not a log entry ({', '.join(sorted(FIELDS))})")
            break
        if e["seq"] != n - 1 or e["prev"] != prev:
            problems.append(
                f"{where}: the chain is broken (seq {e['seq']}, prev {str(e['prev'])[:12]}; expected seq {n - 1}, "
                f"prev {prev[:12]}): an entry was removed, reordered or changed"
            )
            break
        prev = hashlib.sha256(raw).hexdigest()
        entries.append(e)
        att = Path(root) / e["folder"] / NAME
        if ".." in Path(e["folder"]).parts or Path(e["folder"]).is_absolute():
            problems.append(f"{where}: folder {e['folder']!r} is not a project path")
        elif not att.is_file():
            problems.append(f"{where}: run {e['folder']} is logged but gone (removed from results/)")
        elif not _SHA.match(e["attestation_sha256"]) or sha256_file(att) != e["attestation_sha256"]:
            problems.append(f"{where}: run {e['folder']}'s attestation is not the one logged (re-signed or replaced)")
    seen_sha: dict[str, str] = {}
    for e in entries:  # one attestation, one run: a signed folder copied elsewhere is a replay
        other = seen_sha.setdefault(e["attestation_sha256"], e["folder"])
        if other != e["folder"]:
            problems.append(f"{LOG}: run {e['folder']} has the attestation of {other} (a copy of a signed run)")
    logged = {e["folder"] for e in entries}
    for rel in sorted(folders_seen or ()):
        if rel not in logged:
            problems.append(f"{rel}: a signed run not in {LOG} (reprostack log add {rel})")
    return problems, entries


def signed_folders(root: Path, top: Path) -> list[str]:
    """Project paths of every folder under `top` holding a run attestation."""
    root = Path(root).resolve()
    out = []
    for p in sorted(Path(top).rglob(NAME)):
        if attestations(p.parent):
            try:
                out.append(p.parent.resolve().relative_to(root).as_posix())
            except ValueError:
                continue
    return out
