"""Replay a pin's patch series onto a new upstream revision, entry by entry, in a scratch repository.

Each entry ends as one of:
- upstreamed: already in the new rev (see `upstreamed`; or, found here, an empty cherry-pick or a patch file
  that does not apply but reverse-applies): dropped from the series;
- kept: applies as it is (cherry-pick: a clean 3-way merge; patch file: every hunk at its own line);
- refreshed: a committed patch file (mbox / diff) that applies only with line offsets (never fuzz: every
  context line matches); it is re-exported from the replayed commit (`git format-patch --zero-commit` for an
  mbox, the file's own comment block + `git diff` for a plain diff) so that it applies at offset 0;
- conflict: does not apply with zero fuzz; the replay stops there (later entries: not tried).
The same pinned git settings and git commands as the patch stage (reprostack.patch.apply) are used, so a
kept entry replays later exactly as here. The scratch repository is always removed: nothing is written.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..gitcmd import GitFailed, git
from ..lock import GitPin, PatchEntry
from ..patch.apply import CONFIG_ARGS, EntryFailed, Scratch, am, apply_diff, objects_dir, pick
from ..patch.errors import git_msg
from ..patch.failures import apply_failure
from ..patch.headers import PatchHeader, split_plain
from ..patch.precheck import patch_file_in
from .upstreamed import Upstreamed

_OFFSET = re.compile(r"^Hunk #\d+ succeeded at \d+ \(offset -?\d+ lines?\)\.$", re.M)


@dataclass(frozen=True)
class Outcome:
    """What became of one series entry on the new base.

    position: 1-based in the old series; outcome: kept | refreshed | upstreamed | conflict | not-tried;
    detail: one line for the PR table; tree/commit: after the entry (kept, refreshed); offsets: git's
    "Hunk #N succeeded at L (offset K lines)." lines (refreshed); files/hunks: what failed (conflict);
    upstream_commit: the upstream commit that has it (upstreamed); refreshed: the re-exported file bytes.
    """

    position: int
    entry: PatchEntry
    outcome: str
    detail: str = ""
    tree: str | None = None
    commit: str | None = None
    offsets: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    hunks: tuple[str, ...] = ()
    upstream_commit: str | None = None
    refreshed: bytes | None = field(default=None, repr=False)
    excerpt: str = ""  # conflict: the start of `git diff` of the conflicted files (with the conflict markers)

    @property
    def label(self) -> str:
        return self.entry.label


@dataclass(frozen=True)
class Replay:
    """The whole replay: `outcomes` in series order; `tree` after the last applied entry (the base tree if none)."""

    base_rev: str
    base_tree: str
    outcomes: list[Outcome]
    tree: str

    @property
    def conflict(self) -> Outcome | None:
        return next((o for o in self.outcomes if o.outcome == "conflict"), None)

    @property
    def remaining(self) -> list[Outcome]:
        """Entries that stay in the series (kept and refreshed), in order."""
        return [o for o in self.outcomes if o.outcome in ("kept", "refreshed")]


def replay(
    pin: GitPin,
    src: Path,
    new_rev: str,
    project_root: Path,
    headers: dict[int, PatchHeader],
    upstreamed: dict[int, Upstreamed],
) -> Replay:
    """Replay `pin.patches` onto `new_rev` (see the module docstring); write nothing.

    Args:
        pin: the pin with its current series (entries' `tree` are ignored: they belong to the old base).
        src: a repository whose object db holds `new_rev` and every cherry-pick commit with its parent.
        new_rev: the new base commit.
        project_root: the folder the lock's `patches/...` paths are relative to.
        headers: {position: PatchHeader} of the committed patch files (from patch.check_series).
        upstreamed: {position: Upstreamed} already known (reachability, patch-id); these are not replayed.
    Returns:
        Replay(base_rev, base_tree, outcomes, tree); a conflict is an outcome (and the entries after it are
        `not-tried`), not an exception.
    Raises:
        PatchError-free by design; GitFailed only when the scratch repository itself cannot be set up.
    """
    total = len(pin.patches)
    scratch = Path(tempfile.mkdtemp(prefix=f".{pin.name}-bump-", dir=Path(src).parent))
    try:
        g = Scratch.at(scratch, objects_dir(Path(src)), new_rev)
        base_rev, base_tree = g.head()
        outcomes: list[Outcome] = []
        stopped = False
        for pos, e in enumerate(pin.patches, 1):
            if pos in upstreamed:
                u = upstreamed[pos]
                outcomes.append(Outcome(pos, e, "upstreamed", f"{u.how}: {u.detail}", upstream_commit=u.commit))
                continue
            if stopped:
                outcomes.append(Outcome(pos, e, "not-tried", "after the conflict"))
                continue
            o = _one(g, pos, total, e, project_root, headers.get(pos))
            outcomes.append(o)
            stopped = o.outcome == "conflict"
        _, tree = g.head()
        return Replay(base_rev, base_tree, outcomes, tree)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _one(g: Scratch, pos: int, total: int, e: PatchEntry, project_root: Path, header: PatchHeader | None) -> Outcome:
    before, _ = g.head()
    try:
        if e.kind == "cherry-pick":
            try:
                pick(g, e)
            except EntryFailed as f:
                if "empty" in f.reason:
                    _reset(g, before)
                    return Outcome(pos, e, "upstreamed", "empty on the new rev: its change is already there")
                raise
            offsets: list[str] = []
        else:
            path = patch_file_in(project_root, e.value)
            offsets = _check(g, path, e)
            if offsets is None:
                return Outcome(
                    pos, e, "upstreamed", "the patch reverses cleanly on the new rev: its change is already there"
                )
            if e.kind == "mbox":
                offsets = _am_each(g, path)
            else:
                apply_diff(g, path, header)
        head, tree = g.head()
        if head == before:
            raise EntryFailed("produced no commit")
    except EntryFailed as f:
        excerpt = _excerpt(g, f.files) if e.kind == "cherry-pick" and f.files else ""
        _reset(g, before)
        detail = (
            f.reason
            + (f"; files: {', '.join(f.files)}" if f.files else "")
            + (f"; hunks: {'; '.join(f.hunks)}" if f.hunks else "")
        )
        return Outcome(pos, e, "conflict", detail, files=tuple(f.files), hunks=tuple(f.hunks), excerpt=excerpt)
    if offsets and e.kind != "cherry-pick":
        data = _reexport(g, before, head, e, patch_file_in(project_root, e.value))
        return Outcome(
            pos, e, "refreshed", "; ".join(offsets), tree=tree, commit=head, offsets=tuple(offsets), refreshed=data
        )
    return Outcome(
        pos,
        e,
        "kept",
        "clean 3-way merge" if e.kind == "cherry-pick" else "applies at offset 0",
        tree=tree,
        commit=head,
    )


def _excerpt(g: Scratch, files: list[str], limit: int = 40) -> str:
    lines = g("diff", "--no-color", "--no-ext-diff", "--", *files, check=False).splitlines()
    return "\n".join(lines[:limit] + ([f"... ({len(lines) - limit} more lines)"] if len(lines) > limit else []))


def _apply_check(g: Scratch, path: Path, *extra: str) -> str:
    return git(
        *CONFIG_ARGS,
        "apply",
        "--check",
        "--verbose",
        "--whitespace=nowarn",
        *extra,
        "--",
        str(path),
        cwd=g.path,
        stderr=True,
    )


def _check(g: Scratch, path: Path, e: PatchEntry) -> list[str] | None:
    """Offsets git reports for the whole file on the current HEAD; None when it only reverse-applies.

    Raises EntryFailed (files, hunks) when it applies neither way. For an mbox the per-mail check in
    `_am_each` is what counts; this whole-file check only decides "already there".
    """
    try:
        return _OFFSET.findall(_apply_check(g, path))
    except GitFailed as err:
        try:
            _apply_check(g, path, "-R")
            return None
        except GitFailed:
            pass
        if e.kind == "mbox":
            return []  # several mails may touch one file: let `git am` mail by mail decide
        files, hunks, errors = apply_failure(
            f"{err.stdout}\n{err.stderr}", path.read_bytes().decode("utf-8", "replace")
        )
        raise EntryFailed("does not apply with zero fuzz (git apply)", files, hunks, errors or [git_msg(err)]) from None


def _am_each(g: Scratch, path: Path) -> list[str]:
    """`git am` the mails of `path` one by one, each checked first; returns the offsets git reported."""
    offsets: list[str] = []
    with tempfile.TemporaryDirectory(prefix="reprostack-mails-") as tmp:
        n = int(git("mailsplit", "-b", "--keep-cr", f"-o{tmp}", "--", str(path)) or 0)
        for i in range(1, n + 1):
            mail = Path(tmp) / f"{i:04d}"
            try:
                out = _apply_check(g, mail)
            except GitFailed as err:
                files, hunks, errors = apply_failure(
                    f"{err.stdout}\n{err.stderr}", mail.read_bytes().decode("utf-8", "replace")
                )
                raise EntryFailed(
                    f"mail {i} of {n} does not apply with zero fuzz (git am --keep-cr, no 3-way)",
                    files,
                    hunks,
                    errors or [git_msg(err)],
                ) from None
            offsets += [f"mail {i}: {o}" if n > 1 else o for o in _OFFSET.findall(out)]
            am(g, mail)
    return offsets


def _reexport(g: Scratch, before: str, head: str, e: PatchEntry, original: Path) -> bytes:
    """The entry's file re-exported from the replayed commits `before..head` (applies at offset 0)."""
    text = original.read_bytes()
    binary = b"GIT binary patch" in text or b"\nBinary files " in text
    if e.kind == "mbox":
        subject = "--no-numbered" if _has_patch_prefix(text) else "--keep-subject"  # as the original's Subject
        out = git(
            *CONFIG_ARGS,
            "format-patch",
            "--stdout",
            "--no-signature",
            "--zero-commit",
            subject,
            f"{before}..{head}",
            cwd=g.path,
        )
        return (out + "\n").encode()
    comment, _ = split_plain(text.decode("utf-8", "replace"))
    prefix = "".join(line + "\n" for line in comment)
    diff = git(
        *CONFIG_ARGS, "diff", "--no-color", "--no-ext-diff", *(["--binary"] if binary else []), before, head, cwd=g.path
    )
    return (prefix + diff + "\n").encode()


def _has_patch_prefix(text: bytes) -> bool:
    m = re.search(rb"^Subject: (.*)$", text, re.M)
    return bool(m and m.group(1).startswith(b"[PATCH"))


def _reset(g: Scratch, rev: str) -> None:
    for args in (("cherry-pick", "--abort"), ("am", "--abort")):
        g(*args, check=False)
    g("reset", "-q", "--hard", rev)
    g("clean", "-qfdx")
