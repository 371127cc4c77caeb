"""Verify a run folder's attestation: the signature first (a key of the keyring), then every subject (the file is
there with its sha256), then the folder's files that no subject covers.

`check_folder(folder, keyring)` -> FolderCheck: `signed` (an attestation verified), `problems` (each one line;
a folder with problems does not hold), `uncovered` (files no subject names: flagged, a problem), the verified
statement's predicate, and who signed. A folder without any `*.intoto.jsonl` is `signed=False` with no problem:
the caller says "unsigned" (verify-report never reports it as holding without that flag).

`attested_folder(path, top)`: the nearest folder from a report's folder up to `top` that holds an attestation
(a run folder), None when none does.

Invariants: reads only; an attestation is untrusted input (evidence.attest.envelope); nothing is taken from a statement
before its signature verified.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ...digest import sha256_file
from .envelope import EvidenceError, Opened, open_envelope, read
from .statement import folder_entries, is_attestation


@dataclass
class FolderCheck:
    folder: Path
    signed: bool = False
    problems: list = field(default_factory=list)
    uncovered: list = field(default_factory=list)
    opened: Opened | None = None
    files: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def predicate(self) -> dict | None:
        return self.opened.predicate if self.opened else None

    def line(self) -> str:
        if not self.signed and not self.problems:
            return "unsigned (no *.intoto.jsonl)"
        if self.problems:
            return "; ".join(self.problems[:4]) + (
                f"; ... {len(self.problems) - 4} more" if len(self.problems) > 4 else ""
            )
        return f"signed by {self.opened.who} ({self.opened.keyid[:12]}), {self.files} subject(s) hold"


def attestations(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if is_attestation(p.name)) if Path(folder).is_dir() else []


def attested_folder(start: Path, top: Path) -> Path | None:
    """The nearest folder from `start` up to `top` (both included) holding a `*.intoto.jsonl`."""
    start, top = Path(start).resolve(), Path(top).resolve()
    for d in (start, *start.parents):
        if attestations(d):
            return d
        if d == top or top not in d.parents:
            return None
    return None


def check_folder(folder: Path, keyring) -> FolderCheck:
    """See the module doc."""
    folder = Path(folder)
    out = FolderCheck(folder)
    files = attestations(folder)
    if not files:
        return out
    if len(files) > 1:
        out.problems.append(
            f"{folder}: {len(files)} attestation files ({', '.join(p.name for p in files)}); one run, one"
        )
        return out
    att = files[0]
    try:
        lines = read(att)
        if len(lines) != 1:
            raise EvidenceError(f"{att}: {len(lines)} envelopes; a run folder's attestation holds one")
        n, env = lines[0]
        out.opened = open_envelope(env, keyring, f"{att}:{n}")
    except EvidenceError as e:
        out.problems.append(str(e))
        return out
    out.signed = True
    named = set()
    for s in out.opened.statement["subject"]:
        rel = s["name"]
        pp = PurePosixPath(rel)
        if pp.is_absolute() or ".." in pp.parts:
            out.problems.append(f"{att}: subject {rel!r}: not a path inside the run folder")
            continue
        named.add(rel)
        p = folder / rel
        if p.is_symlink() or not p.is_file():
            out.problems.append(f"{folder / rel}: a subject of the attestation, missing from the folder")
        elif sha256_file(p) != s["digest"]["sha256"]:
            out.problems.append(f"{folder / rel}: its sha256 is not the attested one (changed after signing)")
        else:
            out.files += 1
    present, others = folder_entries(folder)
    out.uncovered = [r for r in present if r not in named] + others
    for r in out.uncovered:
        out.problems.append(f"{folder / r}: no subject of the attestation covers it (added after signing)")
    return out
