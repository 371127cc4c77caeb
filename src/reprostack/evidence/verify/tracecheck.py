"""Hold a report's provenance to this repository (`reprostack verify-report`, step 3 of evidence.verify.report): the lock
and the gate spec it records by sha256 are versions some commit holds (evidence.verify.trace.Versions), or a correction
written down for this report (results/provenance-corrections.yaml, evidence.verify.trace) says why and what stands for them,
and its claim is checked, never taken; a report that records `provenance.project` names a commit of this
repository, and when its tree was clean that commit's lock and spec are the recorded ones.

Invariants: nothing here writes; git is only read, through evidence.verify.trace.Versions; the report, the corrections and
the kept lock bytes are untrusted input (a recorded YAML is read with yamlsrc, never with a schema an older file need
not pass); each finding is one line added to the caller's findings (`Findings`: problems, traced, notes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ...digest import sha256_file
from ...errors import ReprostackError
from .trace import LOCK, Correction, Versions, spec_path

RESULTS_JUDGED = ("pass", "fail", "inconclusive")
CORRECTIONS_NAME = "results/provenance-corrections.yaml"


class Findings(Protocol):
    """Where a check puts what it found about one report (evidence.verify.report.Outcome): its path relative to the
    project root, and the problems, how it traced, and the notes, one line each."""

    path: str
    problems: list
    traced: list
    notes: list


def _correction(corrections: list[Correction], rel: str, report_sha: str, field_: str, recorded: str):
    return next(
        (
            c
            for c in corrections
            if c.report == rel and c.field == field_ and c.recorded == recorded and c.report_sha256 == report_sha
        ),
        None,
    )


def _lock_data(text: bytes, where: str):
    from ...yamlsrc import compose

    class _E(ReprostackError):
        def __init__(self, path, line, fld, msg):
            super().__init__(f"{path}:{line}: {fld}: {msg}")

    return compose(text, where, _E)[0]


def check_lock_correction(out: Findings, versions: Versions, root: Path, c: Correction, prov: dict) -> None:
    """A correction of `lock_sha256`: kept bytes that hash to it and parse to the commit's lock data, or (none kept)
    every recorded pin is the commit's."""
    committed = versions.at(c.commit, LOCK)
    if committed is None:
        out.problems.append(f"correction for lock {c.recorded[:8]}: commit {c.commit[:12]} has no {LOCK}")
        return
    if c.kept:
        kept = root / Path(out.path).parent / c.kept
        if not kept.is_file() or sha256_file(kept) != c.recorded:
            out.problems.append(f"correction for lock {c.recorded[:8]}: {c.kept} is missing or does not hash to it")
            return
        try:
            same_data = _lock_data(kept.read_bytes(), c.kept) == _lock_data(committed, f"{c.commit[:12]}:{LOCK}")
        except ReprostackError as e:
            out.problems.append(f"correction for lock {c.recorded[:8]}: {e}")
            return
        if not same_data:
            out.problems.append(
                f"correction for lock {c.recorded[:8]}: {c.kept} differs from {LOCK} at {c.commit[:12]} in more "
                f"than comments and layout"
            )
            return
        out.traced.append(
            f"lock {c.recorded[:8]} is no commit's: corrected ({c.kept}, kept beside the report, is {LOCK} of "
            f"{c.commit[:12]} but for comments; {CORRECTIONS_NAME})"
        )
    else:
        data = _lock_data(committed, f"{c.commit[:12]}:{LOCK}")
        pins = (data or {}).get("upstreams") or {}
        for name, up in (prov.get("upstreams") or {}).items():
            pin = pins.get(name) or {}
            for k, pk in (("rev", "rev"), ("tree", "tree"), ("patched_tree", "patched-tree")):
                if up.get(k) and up.get(k) != pin.get(pk):
                    out.problems.append(
                        f"correction for lock {c.recorded[:8]}: pin {name} {k} is not {c.commit[:12]}'s"
                    )
                    return
        out.traced.append(
            f"lock {c.recorded[:8]} is no commit's: corrected (its pins are those of {c.commit[:12]}; "
            f"{CORRECTIONS_NAME})"
        )
    out.notes.append(f"lock correction: {c.why}")


def check_provenance(
    out: Findings, doc: dict, rel: str, report_sha: str, root: Path, versions: Versions, corrections: list
) -> bytes | None:
    """The lock and spec traced to commits (or a checked correction); the project commit. Returns the recorded
    spec's bytes (None when no commit has them: the bars are then held to the corrected commit's spec)."""
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    gate = doc.get("gate")
    spec_bytes = None
    for field_, path in (("lock_sha256", LOCK), ("gate_spec_sha256", spec_path(gate))):
        sha = prov.get(field_)
        what = "lock" if field_ == "lock_sha256" else "spec"
        if not isinstance(sha, str) or not sha:
            if doc.get("result") in RESULTS_JUDGED:
                out.problems.append(f"no provenance.{field_}: a judged report names its {what}")
            continue
        commits = versions.commits(path, sha)
        if commits or versions.known(path, sha):
            out.traced.append(
                f"{what} {sha[:8]} = {path} of {len(commits)} commit(s), first {commits[0][:8] if commits else 'HEAD'}"
            )
            if field_ == "gate_spec_sha256":
                spec_bytes = versions.bytes_of(path, sha)
            continue
        c = _correction(corrections, rel, report_sha, field_, sha)
        if c is None:
            out.problems.append(
                f"{what} {sha[:8]}: no commit of this repository has this {path}{versions.why_missing()}"
            )
            continue
        if not versions.has_commit(c.commit):
            out.problems.append(f"correction for {what} {sha[:8]}: commit {c.commit[:12]} is not in this repository")
            continue
        if field_ == "lock_sha256":
            check_lock_correction(out, versions, root, c, prov)
        else:
            out.traced.append(
                f"spec {sha[:8]} is no commit's: its bars are held to {path} of {c.commit[:12]} ({CORRECTIONS_NAME})"
            )
            out.notes.append(f"spec correction: {c.why}")
            spec_bytes = versions.at(c.commit, path)
    proj = prov.get("project")
    if isinstance(proj, dict):
        commit = proj.get("commit")
        if commit is None:
            out.notes.append(f"provenance.project: no commit ({proj.get('why', 'no reason given')})")
        elif not versions.has_commit(commit if isinstance(commit, str) else ""):
            out.problems.append(f"provenance.project.commit {str(commit)[:12]}: not a commit of this repository")
        else:
            out.traced.append(f"project {commit[:8]}" + (" (dirty tree)" if proj.get("dirty") else " (clean)"))
            if proj.get("dirty") is False:
                for field_, path in (("lock_sha256", LOCK), ("gate_spec_sha256", spec_path(gate))):
                    at = versions.at(commit, path)
                    sha = prov.get(field_)
                    if sha and at is not None and _sha256(at) != sha:
                        out.problems.append(
                            f"provenance.project: a clean tree at {commit[:12]}, but its {path} is not the recorded "
                            f"{field_} {sha[:8]}"
                        )
    elif doc.get("result") in RESULTS_JUDGED:
        out.notes.append("no provenance.project (a report from before reports recorded the project commit)")
    return spec_bytes


def _sha256(b: bytes) -> str:
    import hashlib

    return hashlib.sha256(b).hexdigest()


def spec_mapping(raw: bytes | None, where: str):
    """The recorded spec's YAML as a mapping (no schema: an older spec need not pass today's), or None."""
    if raw is None:
        return None
    try:
        data = _lock_data(raw, where)
    except ReprostackError:
        return None
    return data if isinstance(data, dict) else None
