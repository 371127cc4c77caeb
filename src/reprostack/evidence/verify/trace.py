"""Trace a report's provenance to commits of this repository: which commits hold the `upstreams.lock` and the
`gates/<gate>.yaml` whose sha256 the report records, the bytes of that version (to read the bars it judged by),
and the corrections written down for reports whose recorded files no commit has.

`Versions(root)` reads the history once: every version of the tracked files of interest (the lock, every gate
spec) that any commit reachable from any ref holds (`git log --all -m --raw`: merges included), each version's
sha256 (its bytes through `git cat-file --batch`), and the commits that introduced it. A shallow clone lacks old
versions: `shallow` says so and the lines that fail name it.

Corrections (`results/provenance-corrections.yaml`): one entry per report field whose recorded sha256 no commit
has, with the reason and what stands for it, never silent:

    corrections:
      - report: results/gate_megatron/2026-11-29-h200-ep1/megatron.json   # a project path
        report-sha256: <sha256 of the report file>   # the entry is for these bytes only
        field: lock_sha256 | gate_spec_sha256
        recorded: <the sha256 the report records>
        commit: <a commit of this repository>          # the version it stands for
        kept: upstreams.lock.as-run                    # lock only, optional: the exact bytes, next to the report
        why: ...

verify-report checks each claim: the commit exists; for the lock, `kept` hashes to `recorded` and parses to the
same data as the commit's lock (only comments and layout differ), or without `kept` every pin the report records
(rev, tree, patched tree) is the commit's; for a spec, the report's bar checks equal the bars of the commit's spec
(reprostack.evidence.verify.report).

Invariants: git is asked through reprostack.gitcmd (no prompt, a timeout); the corrections file is untrusted input
(yamlsrc: bounded, file:line errors; every field checked); nothing here writes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import LocatedError, ReprostackError
from ...gitcmd import GitFailed, git

LOCK = "upstreams.lock"
CORRECTIONS = "results/provenance-corrections.yaml"
_HEX = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class TraceError(ReprostackError):
    """The repository's history cannot be read (no git checkout): one line."""


class CorrectionsError(LocatedError, ReprostackError):
    """results/provenance-corrections.yaml is malformed (FILE:LINE: field: problem)."""


def spec_path(gate: str) -> str:
    return f"gates/{gate}.yaml"


@dataclass
class Versions:
    """Every version of the lock and the gate specs in this repository's history (see the module doc)."""

    root: Path
    by_sha: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (path, sha256) -> commits, oldest first
    blob_of: dict[tuple[str, str], str] = field(default_factory=dict)  # (path, sha256) -> blob id
    shallow: bool = False

    @classmethod
    def read(cls, root: Path) -> Versions:
        """Raises TraceError when `root` is not a git checkout."""
        root = Path(root).resolve()
        try:
            top = git("rev-parse", "--show-toplevel", cwd=root, timeout=120)
        except (GitFailed, OSError) as e:
            raise TraceError(f"{root}: not a git checkout: reports are traced to its commits ({str(e)[:160]})")
        if Path(top).resolve() != root:
            raise TraceError(f"{root}: not the top of its git checkout ({top} is)")
        v = cls(root)
        v.shallow = git("rev-parse", "--is-shallow-repository", cwd=root, timeout=120) == "true"
        log = git(
            "log",
            "--all",
            "-m",
            "--raw",
            "--no-abbrev",
            "--no-renames",
            "--reverse",
            "--format=commit %H",
            "--",
            LOCK,
            "gates",
            cwd=root,
            timeout=600,
        )
        blobs: dict[str, set[tuple[str, str]]] = {}  # blob -> {(path, commit)}
        commit = ""
        for line in log.splitlines():
            if line.startswith("commit "):
                commit = line[7:]
            elif line.startswith(":") and "\t" in line:
                meta, path = line.split("\t", 1)
                new = meta.split()[3]
                if set(new) != {"0"} and _tracked(path):
                    blobs.setdefault(new, set()).add((path, commit))
        for path, blob in v.heads().items():  # versions no commit's diff shows: a grafted (shallow) history's root
            blobs.setdefault(blob, set()).add((path, ""))
        shas = _sha256_of(root, sorted(blobs))
        order = {c: i for i, c in enumerate(git("rev-list", "--all", "--reverse", cwd=root, timeout=600).split())}
        for blob, uses in blobs.items():
            for path, c in uses:
                key = (path, shas[blob])
                v.blob_of[key] = blob
                v.by_sha.setdefault(key, [])
                if c and c not in v.by_sha[key]:
                    v.by_sha[key].append(c)
        for key in v.by_sha:
            v.by_sha[key].sort(key=lambda c: order.get(c, 0))
        return v

    def heads(self) -> dict[str, str]:
        """{path: blob} of the lock and gate specs at HEAD (the version a fresh clone holds)."""
        out = {}
        raw = git("ls-tree", "-r", "HEAD", "--", LOCK, "gates", cwd=self.root, timeout=120)
        for line in raw.splitlines():
            meta, path = line.split("\t", 1)
            if _tracked(path):
                out[path] = meta.split()[2]
        return out

    def commits(self, path: str, sha256: str) -> list[str]:
        """The commits (oldest first) whose `path` has these bytes ([] when none has)."""
        return list(self.by_sha.get((path, sha256), ()))

    def known(self, path: str, sha256: str) -> bool:
        return (path, sha256) in self.blob_of

    def bytes_of(self, path: str, sha256: str) -> bytes | None:
        blob = self.blob_of.get((path, sha256))
        return None if blob is None else git("cat-file", "blob", blob, cwd=self.root, timeout=120, raw=True)

    def at(self, commit: str, path: str) -> bytes | None:
        """The bytes of `path` at `commit` (None: the commit or the path is not there)."""
        try:
            return git("cat-file", "blob", f"{commit}:{path}", cwd=self.root, timeout=120, raw=True)
        except (GitFailed, OSError):
            return None

    def has_commit(self, commit: str) -> bool:
        if not _HEX.match(commit or ""):
            return False
        try:
            git("cat-file", "-e", f"{commit}^{{commit}}", cwd=self.root, timeout=60)
            return True
        except (GitFailed, OSError):
            return False

    def why_missing(self) -> str:
        return " (a shallow clone lacks older versions: git fetch --unshallow)" if self.shallow else ""


def _tracked(path: str) -> bool:
    """The files whose versions are traced: the lock and each gate spec (gates/<gate>.yaml)."""
    return path == LOCK or (path.startswith("gates/") and path.endswith(".yaml") and path.count("/") == 1)


def _sha256_of(root: Path, blobs: list[str]) -> dict[str, str]:
    """{blob id: sha256 of its bytes}, one `git cat-file --batch` for all."""
    if not blobs:
        return {}
    raw = git(
        "cat-file", "--batch", cwd=root, timeout=600, raw=True, input_bytes="".join(b + "\n" for b in blobs).encode()
    )
    out, i = {}, 0
    for b in blobs:
        nl = raw.index(b"\n", i)
        head = raw[i:nl].split()
        size = int(head[2])
        out[b] = hashlib.sha256(raw[nl + 1 : nl + 1 + size]).hexdigest()
        i = nl + 1 + size + 1
    return out


@dataclass(frozen=True)
class Correction:
    report: str
    report_sha256: str
    field: str
    recorded: str
    commit: str
    why: str
    kept: str | None = None
    line: int | None = None


FIELDS = ("lock_sha256", "gate_spec_sha256")


def read_corrections(root: Path) -> list[Correction]:
    """The entries of results/provenance-corrections.yaml ([] when there is none). Raises CorrectionsError."""
    from ...yamlsrc import compose, read_bytes

    path = Path(root) / CORRECTIONS
    if not path.exists():
        return []
    raw = read_bytes(path, CorrectionsError)
    data, lines = compose(raw, str(path), CorrectionsError)

    def bad(at: tuple, what: str) -> CorrectionsError:
        return CorrectionsError(str(path), lines.get(at), ".".join(str(x) for x in at) or "(file)", what)

    if not isinstance(data, dict) or set(data) != {"corrections"} or not isinstance(data["corrections"], list):
        raise bad((), "one key, `corrections:`, a list")
    out = []
    for i, e in enumerate(data["corrections"]):
        at = ("corrections", i)
        if not isinstance(e, dict):
            raise bad(at, "an entry is a mapping")
        need = {"report", "report-sha256", "field", "recorded", "commit", "why"}
        extra = set(e) - need - {"kept"}
        if need - set(e) or extra:
            raise bad(
                at,
                f"needs {', '.join(sorted(need))} (and `kept` for a lock); "
                + (
                    f"unknown: {', '.join(sorted(map(str, extra)))}"
                    if extra
                    else f"missing: {', '.join(sorted(need - set(e)))}"
                ),
            )
        for k in need | ({"kept"} & set(e)):
            if not isinstance(e[k], str) or not e[k].strip():
                raise bad((*at, k), "a non-empty string")
        if e["field"] not in FIELDS:
            raise bad((*at, "field"), f"one of {', '.join(FIELDS)}")
        for k in ("report-sha256", "recorded"):
            if not _SHA256.match(e[k]):
                raise bad((*at, k), "a sha256 (64 lowercase hex)")
        if not _HEX.match(e["commit"]):
            raise bad((*at, "commit"), "a full commit id (40 lowercase hex)")
        for k in ("report", "kept"):
            if k in e and (e[k].startswith("/") or ".." in e[k].split("/")):
                raise bad((*at, k), "a path inside the project, without '..'")
        if "kept" in e and e["field"] != "lock_sha256":
            raise bad((*at, "kept"), "only a lock's bytes are kept")
        out.append(
            Correction(
                e["report"],
                e["report-sha256"],
                e["field"],
                e["recorded"],
                e["commit"],
                e["why"],
                e.get("kept"),
                lines.get(at),
            )
        )
    return out
