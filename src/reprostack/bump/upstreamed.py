"""Which series entries the new upstream revision already has: by reachability, or by `git patch-id --stable`.

- a cherry-pick entry is upstreamed when its commit is reachable from the new rev (merged as is);
- any entry is upstreamed when its patch-id (git's own `patch-id --stable`, diffs without rename detection)
  equals that of a commit in old..new (rebased, squash-of-one or cherry-picked upstream); an mbox needs
  every mail's patch-id to be found.
What neither test catches but the replay finds (an empty cherry-pick, a patch file that reverse-applies) is
decided in `replay`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..gitcmd import git
from ..lock import GitPin
from .history import History

_DIFF = ("-c", "diff.renames=false", "-c", "core.quotePath=false")


@dataclass(frozen=True)
class Upstreamed:
    """Why an entry counts as upstreamed: `how` ("reachable", "patch-id", ...), the upstream `commit`, in words."""

    how: str
    commit: str | None
    detail: str


def patch_ids(h: History, old: str, new: str) -> dict[str, tuple[str, str]]:
    """{patch-id: (commit, subject)} of every non-merge commit in old..new (oldest commit wins a tie)."""
    log = h.git(*_DIFF, "log", "-p", "--no-merges", "--no-color", "--no-ext-diff", "--reverse", f"{old}..{new}")
    if not log:
        return {}
    out = h.git("patch-id", "--stable", input_bytes=(log + "\n").encode())
    subjects = dict(
        line.split("\x1f", 1)
        for line in h.git("log", "--no-merges", "--format=%H%x1f%s", f"{old}..{new}").splitlines()
        if line
    )
    ids: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        pid, _, sha = line.partition(" ")
        ids.setdefault(pid, (sha, subjects.get(sha, "")))
    return ids


def _ids_of(text: bytes, cwd: Path) -> list[str]:
    out = git("patch-id", "--stable", cwd=cwd, input_bytes=text)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def classify(h: History, pin: GitPin, new: str, project_root: Path) -> dict[int, Upstreamed]:
    """{1-based position: Upstreamed} for the entries of `pin.patches` already in `new`.

    Needs every cherry-pick commit in the history repo (History.ensure_commits). Raises GitFailed only
    for a broken repository (a missing object is a precondition violated).
    """
    ids = patch_ids(h, pin.rev, new) if pin.patches else {}
    found: dict[int, Upstreamed] = {}
    for pos, e in enumerate(pin.patches, 1):
        if e.kind == "cherry-pick":
            if h.is_ancestor(e.value, new):
                found[pos] = Upstreamed("reachable", e.value, f"{e.value[:12]} is in the history of {new[:12]}")
                continue
            text = h.git(*_DIFF, "show", "--no-color", "--no-ext-diff", e.value).encode() + b"\n"
        else:
            text = (project_root / e.value).read_bytes()
        mine = _ids_of(text, h.repo)
        hits = [ids.get(p) for p in mine]
        if mine and all(hits):
            first = hits[0]
            what = (
                f"same patch-id as {first[0][:12]} {first[1]!r}"
                if len(hits) == 1
                else "same patch-ids as " + ", ".join(c[:12] for c, _ in hits)
            )
            found[pos] = Upstreamed("patch-id", first[0], what)
    return found
