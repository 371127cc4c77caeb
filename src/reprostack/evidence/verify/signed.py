"""verify-report's first step for every report: is its run signed, and does the signature hold? Then what the signed
predicate pins about the report (its commit, spec, lock, verdict, what the run was), and for an unsigned report,
that its folder is the committed bytes.

`SignatureCheck(root, keyring, versions).facts(report_path, doc)` -> Facts:
- signed: the nearest folder from the report's up to the project root that holds a `*.intoto.jsonl` is its run
  folder; its attestation must verify with a key of the keyring, every subject must hash to its record and every
  file of the folder must be a subject (evidence.check_folder). Then the predicate against the report: the report is
  one of its `gates`, with the same result and spec sha256; the lock sha256 is the predicate's; the project commit is
  a commit of this repository, and the spec and lock the report records are `git show COMMIT:gates/<gate>.yaml` and
  `COMMIT:upstreams.lock` (the run is judged at its own commit, never against another version some commit holds);
  the report records `data.deliberate` exactly when the predicate's purpose is `deliberate`; a correction
  (results/provenance-corrections.yaml) never applies to a signed run.
- unsigned: no attestation up to the root. Such a report is only what git holds: every file of its folder and the
  console transcripts beside it (cli.log) must be the committed bytes (`git status` shows nothing there, ignored
  and untracked files included), and a judged report, its kept artifacts and transcripts must be the bytes first
  committed at their paths (no later commit changed them), first committed before signing began (the commit that
  added keys/: every run committed since carries an attestation); its line says UNSIGNED, never a plain OK.

Invariants: reads only (git read-only); nothing of a statement is used before its signature verified; each problem
is one line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ... import evidence
from ...gitcmd import GitFailed, git
from .trace import LOCK, spec_path


@dataclass
class Facts:
    signed: bool = False
    folder: Path | None = None
    who: str | None = None
    keyid: str | None = None
    predicate: dict | None = None
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def operator_baseline(self) -> bool:
        """The signed command line chose the baseline runs (--baseline DIR|history, --baseline-run): the report's
        baseline bars may name other runs than the spec's, and verify-report still recomputes them from those runs."""
        argv = ((self.predicate or {}).get("command") or {}).get("argv") or []
        return any(a in ("--baseline", "--baseline-run") or a.startswith("--baseline=") for a in argv)

    def tag(self) -> str:
        if self.signed:
            return f"signed by {self.who} ({self.keyid[:12]})"
        return "UNSIGNED"


def transcripts(folder: Path) -> list[Path]:
    """The console transcripts a run's report may sit beside: `<folder>/cli.log`, `<folder>.cli.log` and the parent's
    `cli.log` (the layouts of the committed runs)."""
    return [folder / "cli.log", folder.parent / f"{folder.name}.cli.log", folder.parent / "cli.log"]


def _kept(doc) -> list[str]:
    """The relative artifact paths a report lists (those kept in its folder)."""
    arts = doc.get("artifacts") if isinstance(doc, dict) else None
    return [
        a["path"]
        for a in arts or []
        if isinstance(a, dict)
        and isinstance(a.get("path"), str)
        and not a["path"].startswith("/")
        and ".." not in a["path"]
    ]


class SignatureCheck:
    def __init__(self, root: Path, keyring, versions):
        self.root, self.keyring, self.versions = Path(root).resolve(), keyring, versions
        self._checks: dict[Path, evidence.FolderCheck] = {}
        self._memo: dict = {}  # what git's history says, read once

    def facts(self, path: Path, doc: dict | None) -> Facts:
        path = Path(path).resolve()
        folder = evidence.attested_folder(path.parent, self.root)
        if folder is None:
            return self._unsigned(path, doc)
        if folder not in self._checks:
            self._checks[folder] = evidence.check_folder(folder, self.keyring)
        c = self._checks[folder]
        f = Facts(signed=c.signed, folder=folder)
        if not c.ok:
            f.problems += c.problems
            return f
        f.who, f.keyid, f.predicate = c.opened.who, c.opened.keyid, c.predicate
        if isinstance(doc, dict):
            self._pinned(f, path, doc)
        self._beside(f, folder)
        return f

    def _beside(self, f: Facts, folder: Path) -> None:
        """A transcript beside a signed folder (`<folder>.cli.log`, no subject of it) is held as git holds it: the
        committed bytes, never changed since first committed (a re-attested run's transcript lies outside it)."""
        log = folder.parent / f"{folder.name}.cli.log"
        if not log.is_file():
            return
        try:
            rel = log.resolve().relative_to(self.root).as_posix()
            raw = git(
                "status", "--porcelain=v1", "--ignored=matching", "--untracked-files=all", "--", rel, cwd=self.root
            )
        except (ValueError, GitFailed, OSError):
            f.problems.append(f"{log}: a transcript beside the signed run, outside this repository's history")
            return
        if raw.strip():
            f.problems.append(f"{rel}: the transcript beside the signed run is not the committed bytes")
        elif rel in self.changed_after_added():
            f.problems.append(f"{rel}: the transcript beside the signed run was changed after it was first committed")

    def _unsigned(self, path: Path, doc) -> Facts:
        """An unsigned report is what git holds: its folder and the console transcripts beside it as committed, and
        a judged one (pass, fail, inconclusive) with its kept artifacts and transcripts never changed since the
        commit that first added them (a historical run is the bytes it was committed as)."""
        f = Facts(folder=path.parent)
        try:
            rel = path.parent.relative_to(self.root).as_posix() or "."
        except ValueError:
            f.problems.append(f"unsigned, and outside this repository ({path.parent}): nothing vouches for it")
            return f
        logs = [p for p in transcripts(path.parent) if p.is_file()]
        bound = [path, *logs] + [path.parent / a for a in _kept(doc)]
        try:
            raw = git(
                "status",
                "--porcelain=v1",
                "--ignored=matching",
                "--untracked-files=all",
                "--",
                rel,
                *(p.relative_to(self.root).as_posix() for p in logs),
                cwd=self.root,
            )
        except (GitFailed, OSError) as e:
            f.problems.append(f"unsigned, and git cannot say whether {rel} is committed ({str(e)[:120]})")
            return f
        changed = [ln[3:] for ln in raw.splitlines() if len(ln) > 3]
        if changed:
            f.problems.append(
                f"unsigned, and {changed[0]}"
                + (f" (and {len(changed) - 1} more file(s))" if len(changed) > 1 else "")
                + " is not the committed bytes: only a signature vouches for a run that is not what git holds"
            )
            return f
        since = self.signing_since()
        added = self.added_by().get(path.relative_to(self.root).as_posix())
        if since and added and added not in self.before_signing():
            f.problems.append(
                f"unsigned, and first committed by {added[:12]}, after signing began ({since[:12]} added keys/): "
                "every run committed since carries an attestation"
            )
            return f
        if isinstance(doc, dict) and doc.get("result") in ("pass", "fail", "inconclusive"):
            later = self.changed_after_added()
            for p in bound:
                r = p.resolve().relative_to(self.root).as_posix() if p.resolve().is_relative_to(self.root) else ""
                if r in later:
                    f.problems.append(
                        f"unsigned, and {r} was changed by commit {later[r][:12]} after it was first committed: a "
                        "historical run is the bytes it was committed as (only a signature vouches for new ones)"
                    )
                    break
        return f

    def _log(self, *args: str) -> str:
        try:
            return git("log", "--no-renames", *args, cwd=self.root, timeout=600)
        except (GitFailed, OSError):
            return ""

    def signing_since(self) -> str | None:
        """The commit that first added a file under keys/ (signing began there), None when none did."""
        if "since" not in self._memo:
            first = self._log("--reverse", "--diff-filter=A", "--format=%H", "--", evidence.KEYRING_DIR).split()
            self._memo["since"] = first[0] if first else None
        return self._memo["since"]

    def before_signing(self) -> set[str]:
        """The commits reachable from signing_since's parent (every commit that is not after it)."""
        if "before" not in self._memo:
            since = self.signing_since()
            try:
                out = git("rev-list", f"{since}^", cwd=self.root, timeout=600) if since else ""
            except (GitFailed, OSError):
                out = ""
            self._memo["before"] = set(out.split())
        return self._memo["before"]

    def added_by(self) -> dict[str, str]:
        """{path: the first commit of HEAD's history that added it}."""
        if "added" not in self._memo:
            added: dict[str, str] = {}
            commit = ""
            for ln in self._log("--reverse", "--diff-filter=A", "--name-only", "--format=C %H").splitlines():
                if ln.startswith("C "):
                    commit = ln[2:]
                elif ln.strip():
                    added.setdefault(ln.strip(), commit)
            self._memo["added"] = added
        return self._memo["added"]

    def changed_after_added(self) -> dict[str, str]:
        """{path: the latest commit that modified it} for every file some commit of HEAD's history modified after
        adding it (read once)."""
        if "later" not in self._memo:
            later: dict[str, str] = {}
            commit = ""
            for ln in self._log("--diff-filter=M", "--name-only", "--format=C %H").splitlines():
                if ln.startswith("C "):
                    commit = ln[2:]
                elif ln.strip():
                    later.setdefault(ln.strip(), commit)
            self._memo["later"] = later
        return self._memo["later"]

    def _pinned(self, f: Facts, path: Path, doc: dict) -> None:
        """What the signed predicate pins about the report (module doc)."""
        pred = f.predicate
        rel = path.relative_to(f.folder).as_posix()
        prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
        entry = next((g for g in pred.get("gates") or [] if g.get("report") == rel), None)
        if entry is None:
            f.problems.append(f"{rel}: not a report of its signed run (the predicate names {len(pred['gates'])} other)")
            return
        if entry["result"] != doc.get("result"):
            f.problems.append(f"result {doc.get('result')}, but its signed run says {entry['result']}")
        if entry["spec_sha256"] != prov.get("gate_spec_sha256"):
            f.problems.append("provenance.gate_spec_sha256 is not the one its signed run records")
        if pred.get("lock_sha256") != prov.get("lock_sha256"):
            f.problems.append("provenance.lock_sha256 is not the one its signed run records")
        deliberate = isinstance(doc.get("data"), dict) and doc["data"].get("deliberate") is not None
        if deliberate != (pred["purpose"]["kind"] == "deliberate"):
            f.problems.append(
                f"its signed run was {pred['purpose']['kind']}, but the report "
                + ("says it is a deliberate variation" if deliberate else "no longer records data.deliberate")
            )
        self._at_commit(f, doc, prov)

    def _at_commit(self, f: Facts, doc: dict, prov: dict) -> None:
        commit = (f.predicate.get("project") or {}).get("commit")
        if not commit:
            f.problems.append("its signed run records no project commit: it cannot be judged at its own commit")
            return
        if not self.versions.has_commit(commit):
            f.problems.append(f"its signed run's commit {commit[:12]} is not a commit of this repository")
            return
        for field_, rel in (("gate_spec_sha256", spec_path(str(doc.get("gate")))), ("lock_sha256", LOCK)):
            at = self.versions.at(commit, rel)
            have = prov.get(field_)
            if at is None:
                f.problems.append(f"{rel} does not exist at its run's commit {commit[:12]}")
            elif hashlib.sha256(at).hexdigest() != have:
                f.problems.append(
                    f"{rel} {str(have)[:8]} is not the one of its run's commit {commit[:12]} "
                    f"({hashlib.sha256(at).hexdigest()[:8]}): judged at its own commit only"
                )
