"""Verify commits in a cache repo against the lock, then (and only then) mark them good.

Invariants:
- a commit is *complete* when it is a commit object, its tree and every object under that tree are
  present (`git rev-list --quiet --objects`), and, for a cherry-pick, the same holds for its first
  parent's tree (cherry-pick is a 3-way merge with the parent as base);
- the root tree must equal the pinned tree hash, else FetchError "NAME: tree at REV8 is X, lock says Y";
- markers are written after all checks of one repository passed: cherry-picks first, `rev` last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import FetchError
from ..gitcmd import DEFAULT_TIMEOUT_S, GitFailed, git
from ..lock import GitPin
from .cache import Cache


@dataclass(frozen=True)
class Wanted:
    """One repository's worth of commits to have in the cache (a superproject or one submodule).

    label: names it in errors ("deepep", "deepep:third-party/fmt"); tree: pinned tree of `rev`
    (None: not pinned); cherry_picks: commits needed together with their first parent;
    hint_refs: refs that may reach these commits when the server refuses fetch-by-id.
    """

    label: str
    url: str
    rev: str
    tree: str | None = None
    cherry_picks: tuple[str, ...] = ()
    hint_refs: tuple[str, ...] = ()

    @property
    def commits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.rev, *self.cherry_picks)))  # each once: update-ref refuses a ref twice

    def object_names(self) -> list[str]:
        """Rev expressions that must resolve for this repository to be usable."""
        return [
            f"{self.rev}^{{tree}}",
            *(f"{c}^{{tree}}" for c in self.cherry_picks),
            *(f"{c}^1^{{tree}}" for c in self.cherry_picks),
        ]


def missing_objects(repo: Path, names: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """The rev expressions among `names` that do not resolve to an object in `repo` (all, if no repo)."""
    if not names:
        return []
    if not (repo / "HEAD").is_file():
        return list(names)
    out = git("cat-file", "--batch-check", cwd=repo, timeout=timeout, input_bytes=("\n".join(names) + "\n").encode())
    lines = out.splitlines()
    return [n for n, line in zip(names, lines) if line.endswith((" missing", " ambiguous"))]


def is_good(cache: Cache, repo: Path, want: Wanted, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """True when every commit of `want` has its marker (matching the pinned tree) and its objects are still there."""
    m = cache.read_marker(want.url, want.rev)
    if not m or (want.tree and m.get("tree") != want.tree):
        return False
    for c in want.cherry_picks:
        m = cache.read_marker(want.url, c)
        if not m or not m.get("with_parent"):
            return False
    return not missing_objects(repo, want.object_names(), timeout)


def _rev_parse(repo: Path, expr: str, timeout: float) -> str | None:
    try:
        return git("rev-parse", "--verify", "-q", expr, cwd=repo, timeout=timeout)
    except GitFailed:
        return None


def _object_type(repo: Path, sha: str, timeout: float) -> str | None:
    try:
        return git("cat-file", "-t", sha, cwd=repo, timeout=timeout)
    except GitFailed:
        return None


def verify_commits(repo: Path, want: Wanted, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
    """Check that every commit of `want` is complete in `repo` and `rev` has the pinned tree.

    Returns {commit: its tree} for rev and each cherry-pick.
    Raises FetchError naming want.label: a commit missing or not a commit, a tree that differs from the
    lock, a cherry-pick whose parent is absent, or objects missing under a tree.
    """
    trees: dict[str, str] = {}
    for c in want.commits:
        kind = _object_type(repo, c, timeout)
        if kind != "commit":
            what = "missing" if kind is None else f"a {kind}, not a commit"
            raise FetchError(f"{want.label}: {c} is {what} in the cache repo {repo}")
        trees[c] = _rev_parse(repo, f"{c}^{{tree}}", timeout) or ""
    if want.tree and trees[want.rev] != want.tree:
        raise FetchError(f"{want.label}: tree at {want.rev[:8]} is {trees[want.rev]}, lock says {want.tree}")
    tops = list(trees.values())
    for c in want.cherry_picks:
        parent_tree = _rev_parse(repo, f"{c}^1^{{tree}}", timeout)
        if parent_tree is None:
            raise FetchError(
                f"{want.label}: cherry-pick {c[:12]} is present but its parent is not "
                f"(shallow or incomplete); cherry-pick needs the parent's tree"
            )
        tops.append(parent_tree)
    try:
        git("rev-list", "--quiet", "--objects", *dict.fromkeys(tops), cwd=repo, timeout=timeout)
    except GitFailed as e:
        raise FetchError(
            f"{want.label}: objects missing under {want.rev[:8]} in the cache repo {repo}: {e.stderr.strip()[-500:]}"
        ) from None
    return trees


def mark_verified(
    cache: Cache, want: Wanted, trees: dict[str, str], repo: Path, timeout: float = DEFAULT_TIMEOUT_S
) -> None:
    """Pin each verified commit with a ref `refs/reprostack/<sha>` and write its marker (rev last)."""
    refs = "".join(f"update refs/reprostack/{c} {c}\n" for c in want.commits)
    git("update-ref", "--stdin", cwd=repo, timeout=timeout, input_bytes=refs.encode())
    for c in want.cherry_picks:
        cache.write_marker(want.url, c, tree=trees[c], with_parent=True)
    cache.write_marker(want.url, want.rev, tree=trees[want.rev])


@dataclass(frozen=True)
class FetchedGit:
    """A git pin present and verified in the cache: `repo` is the superproject's bare repo,
    `submodules` maps each submodule path to its own bare repo."""

    pin: GitPin
    repo: Path
    submodules: dict[str, Path] = field(default_factory=dict)


def cherry_picks(pin: GitPin) -> tuple[str, ...]:
    """The commit ids of the pin's cherry-pick entries, in series order."""
    return tuple(p.value for p in pin.patches if p.kind == "cherry-pick")
