"""Replay: a scratch repository next to `dest`, each entry applied and tree-checked, then moved into place."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..gitcmd import GitFailed, git
from ..lock import GitPin, PatchEntry, PatchFileError, read_patch_file
from .errors import SeriesError, git_msg
from .failures import apply_failure, conflict_hunks
from .headers import PatchHeader, comment_block, split_plain
from .precheck import entry_label, check_series

# Every setting that could change what a replay produces, pinned (global/system config is already off).
_PINNED_CONFIG = (
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.quotePath=false",
    "core.hooksPath=/dev/null",
    "merge.renames=true",
    "merge.directoryRenames=conflict",
    "merge.conflictStyle=merge",
    "merge.renormalize=false",
    "diff.renames=true",
    "rerere.enabled=false",
    "rerere.autoUpdate=false",
    "apply.whitespace=nowarn",
    "apply.ignoreWhitespace=no",
    "am.threeWay=false",
    "am.keepcr=true",
    "am.messageId=false",
    "mailinfo.scissors=false",
    "commit.gpgSign=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    "init.defaultBranch=reprostack",
)
CONFIG_ARGS = tuple(a for kv in _PINNED_CONFIG for a in ("-c", kv))


@dataclass(frozen=True)
class AppliedEntry:
    """One series entry as replayed: `commit` is the new commit id in `dest`, `tree` its tree."""

    label: str
    kind: str
    value: str
    upstream_status: str
    commit: str
    tree: str


@dataclass(frozen=True)
class SeriesResult:
    """A verified patched tree at `path`: `head`/`tree` are the final commit and tree."""

    upstream: str
    base_rev: str
    base_tree: str
    entries: list[AppliedEntry]
    head: str
    tree: str
    path: Path


class Scratch:
    """The scratch repository: git with the pinned config (CONFIG_ARGS), run in its work tree `path`.

    Shared with the bump stage (reprostack.bump.replay), which replays a series onto a new base the same way.
    """

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, *args: str, check: bool = True, input_bytes: bytes | None = None) -> str:
        return git(*CONFIG_ARGS, *args, cwd=self.path, check=check, input_bytes=input_bytes)

    def head(self) -> tuple[str, str]:
        head, tree = self("rev-parse", "HEAD", "HEAD^{tree}").split()
        return head, tree

    @classmethod
    def at(cls, path: Path, objects: Path, rev: str) -> "Scratch":
        """A new repository in the empty folder `path`, borrowing the object db `objects` (alternates, nothing
        copied), checked out detached at `rev`. Raises GitFailed when git cannot set it up."""
        g = cls(path)
        g("init", "-q")
        alternates = Path(g("rev-parse", "--git-path", "objects/info/alternates"))
        alternates = alternates if alternates.is_absolute() else path / alternates
        alternates.write_text(f"{objects}\n")
        g("checkout", "-q", "--detach", rev)
        return g


class EntryFailed(Exception):
    """One entry did not apply: `reason`, the `files`/`hunks` at fault, git's `details`."""

    def __init__(self, reason: str, files=(), hunks=(), details=(), tree: str | None = None, changed=()):
        self.reason, self.files, self.hunks, self.details, self.tree = (
            reason,
            list(files),
            list(hunks),
            list(details),
            tree,
        )
        self.changed = list(changed)


def objects_dir(src: Path) -> Path:
    """The absolute object directory of the repository `src` (bare or not), for `objects/info/alternates`."""
    p = Path(git("rev-parse", "--git-path", "objects", cwd=src))
    return (p if p.is_absolute() else src / p).resolve()


def pick(g: Scratch, e: PatchEntry) -> None:
    """Cherry-pick entry `e` (3-way, never resolved). Raises EntryFailed: conflict (files, hunks), empty, other."""
    try:
        g("cherry-pick", "-x", "--strategy=ort", e.value)
    except GitFailed as err:
        out = f"{err.stdout}\n{err.stderr}"
        unmerged = [f for f in g("diff", "--name-only", "--diff-filter=U", check=False).splitlines() if f]
        conflicts = [l.strip() for l in out.splitlines() if l.startswith("CONFLICT")]
        if unmerged or conflicts:
            files = list(unmerged)
            for c in conflicts:
                m = re.search(r"Merge conflict in (.*)$", c)
                if m and m.group(1) not in files:
                    files.append(m.group(1))
            raise EntryFailed(
                "3-way merge conflict (zero fuzz: a conflict is never resolved)",
                files,
                conflict_hunks(g.path, unmerged),
                conflicts,
            ) from None
        if "now empty" in out or "nothing to commit" in out:
            raise EntryFailed(
                "the change is already in the base: the cherry-pick is empty (upstream may have "
                "merged it: drop the entry or re-pin the base)"
            ) from None
        raise EntryFailed("git cherry-pick failed", details=[git_msg(err)]) from None


def am(g: Scratch, path: Path) -> None:
    """`git am --keep-cr --no-3way` the mbox `path`. Raises EntryFailed naming the files and hunks that failed."""
    try:
        g("am", "--keep-cr", "--no-3way", "--whitespace=nowarn", "--", str(path))
    except GitFailed as err:
        out = f"{err.stdout}\n{err.stderr}"
        files, hunks, errors = apply_failure(out, path.read_bytes().decode("utf-8", "replace"))
        reason = "does not apply with zero fuzz (git am --keep-cr, no 3-way)"
        if "Patch is empty" in out:
            reason = "a mail of it is empty"
        raise EntryFailed(reason, files, hunks, errors or [git_msg(err)]) from None


def apply_diff(g: Scratch, path: Path, header: PatchHeader) -> None:
    """`git apply --index` the plain diff `path` and commit it with its comment block as message.

    Raises EntryFailed naming the files and hunks that failed, or when it changes nothing."""
    text = path.read_bytes().decode("utf-8", "replace")
    try:
        g("apply", "--index", "--whitespace=nowarn", "--", str(path))
    except GitFailed as err:
        files, hunks, errors = apply_failure(f"{err.stdout}\n{err.stderr}", text)
        raise EntryFailed(
            "does not apply with zero fuzz (git apply --index)", files, hunks, errors or [git_msg(err)]
        ) from None
    comment, _ = split_plain(text)
    block = "\n".join(comment_block(comment)).strip()
    message = block if block else f"{header.description}\n\nUpstream-Status: {header.upstream_status}"
    try:
        g("commit", "-q", "--no-verify", "--cleanup=strip", "-F", "-", input_bytes=(message + "\n").encode())
    except GitFailed as err:
        reason = (
            "changes nothing on this base (already applied?)"
            if "nothing" in err.stdout + err.stderr
            else "commit failed"
        )
        raise EntryFailed(reason, details=[git_msg(err)]) from None


def _changed(g: Scratch, a: str, b: str, limit: int = 20) -> list[str]:
    if not _exists(g, f"{a}^{{tree}}"):
        return []
    out = g("diff-tree", "-r", "--name-status", "--no-renames", a, b, check=False).splitlines()
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def _exists(g: Scratch, oid: str) -> bool:
    try:
        g("cat-file", "-e", oid)
        return True
    except GitFailed:
        return False


def apply_series(pin: GitPin, src: str | Path, dest: str | Path, project_root: str | Path) -> SeriesResult:
    """Replay `pin.patches` onto `pin.rev` and put the verified result at `dest`, or nothing at all.

    Args:
        pin: a git pin with its patch series and `patched_tree`.
        src: a repository at `pin.rev` whose object db already holds every cherry-pick commit (made by
            the fetch stage). Only its object db is read; its work tree is left alone.
        dest: where the patched work tree goes; it must not exist. Its parent is created if needed.
        project_root: the folder the lock's `patches/...` paths are relative to.
    Returns:
        SeriesResult(upstream, base_rev, base_tree, entries, head, tree, path=dest). `dest` is a git work
        tree at `head` (detached; `refs/reprostack/base` marks `pin.rev`) borrowing objects from `src`.
    Raises:
        PatchError (a SeriesError with the facts as attributes): `dest` exists; the pre-check failed
        (see `check_series`; nothing was created); an entry did not apply with zero fuzz; an entry's
        pinned `tree` or the final `patched_tree` differs from what was produced. The message names the
        upstream, the entry ("#3 of 5 cherry-pick 146cc356aa00"), its Upstream-Status, the files and
        hunks that failed, "pinned base <rev>, actual base <HEAD before the entry>" and, for a tree
        mismatch, the expected and actual trees. The scratch is removed and `dest` does not appear.
    """
    src, dest, project_root = Path(src), Path(dest), Path(project_root)
    if dest.exists() or dest.is_symlink():
        raise SeriesError(
            f"{pin.name}: destination {dest} already exists; the patch stage never overwrites", upstream=pin.name
        )
    headers = check_series(pin, src, project_root)
    objects = objects_dir(src)
    total = len(pin.patches)
    expected = pin.patched_tree if total else (pin.patched_tree or pin.tree)

    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dest.name}.patching-", dir=dest.parent))
    done = False
    try:
        g = Scratch.at(scratch, objects, pin.rev)
        base_rev, base_tree = g.head()
        if base_tree != pin.tree:  # check_series saw it already; this guards the checkout itself
            raise SeriesError(
                f"{pin.name}: base {base_rev} checked out with tree {base_tree}, pinned {pin.tree}",
                upstream=pin.name,
                expected_tree=pin.tree,
                actual_tree=base_tree,
            )
        g("update-ref", "refs/reprostack/base", base_rev)

        entries = [_apply_entry(g, pin, pos, e, project_root, headers, dest) for pos, e in enumerate(pin.patches, 1)]
        head, tree = _check_result(g, pin, expected, base_rev, base_tree, dest)
        _publish(pin, scratch, dest)
        done = True
    finally:
        if not done:
            shutil.rmtree(scratch, ignore_errors=True)
    return SeriesResult(
        upstream=pin.name, base_rev=base_rev, base_tree=base_tree, entries=entries, head=head, tree=tree, path=dest
    )


def _apply_entry(
    g: Scratch, pin: GitPin, pos: int, e: PatchEntry, project_root: Path, headers: dict[int, PatchHeader], dest: Path
) -> AppliedEntry:
    """Apply entry `pos` of the series with zero fuzz; it must make a commit, with its pinned `tree` when it has one.
    SeriesError naming the entry (`_entry_error`) when it does not."""
    label = entry_label(pos, len(pin.patches), e)
    before, before_tree = g.head()
    try:
        if e.kind == "cherry-pick":
            pick(g, e)
        elif e.kind == "mbox":
            am(g, _private_copy(g, pos, project_root, e))
        else:
            apply_diff(g, _private_copy(g, pos, project_root, e), headers[pos])
        head, tree = g.head()
        if head == before:
            raise EntryFailed("produced no commit")
        if e.tree and tree != e.tree:
            raise EntryFailed(
                f"tree checkpoint mismatch: expected tree {e.tree}, actual tree {tree}",
                changed=_changed(g, e.tree, tree)
                or [f"(expected tree {e.tree[:12]} is not in the object db; this entry changed:)"]
                + _changed(g, before_tree, tree),
                tree=tree,
            )
    except EntryFailed as f:
        raise _entry_error(pin, g, dest, pos, e, label, before, before_tree, f) from None
    return AppliedEntry(
        label=label, kind=e.kind, value=e.value, upstream_status=e.upstream_status, commit=head, tree=tree
    )


def _check_result(g: Scratch, pin: GitPin, expected: str, base_rev: str, base_tree: str, dest: Path) -> tuple[str, str]:
    """(HEAD, tree) after the whole series: the tree must be `expected` and the work tree clean, else SeriesError
    naming the trees and the changed files (nothing written)."""
    head, tree = g.head()
    if tree != expected:
        changed = _changed(g, expected, tree) or [
            f"(expected tree {expected} is not in the object db; the series changed:)"
        ] + _changed(g, base_tree, tree)
        msg = (
            f"{pin.name}: the series applied but produced the wrong tree: expected tree {expected} "
            f"(patched-tree), actual tree {tree} (HEAD {head})\n"
            f"  pinned base {pin.rev}, actual base {base_rev}; {len(pin.patches)} entries applied\n"
            + "".join(f"  {l}\n" for l in changed)
            + f"  nothing was written: {dest} was not created"
        )
        raise SeriesError(msg, upstream=pin.name, expected_tree=expected, actual_tree=tree)
    dirty = g("status", "--porcelain", "--untracked-files=all").splitlines()
    if dirty:
        raise SeriesError(
            f"{pin.name}: the work tree differs from the verified tree after the series:\n"
            + "".join(f"  {l}\n" for l in dirty[:20])
            + f"  nothing was written: {dest} was not created",
            upstream=pin.name,
        )
    return head, tree


def _publish(pin: GitPin, scratch: Path, dest: Path) -> None:
    """Move the verified scratch tree to `dest` in one rename; never over something that appeared meanwhile."""
    if dest.exists() or dest.is_symlink():
        raise SeriesError(
            f"{pin.name}: {dest} appeared while the series was applied; not overwritten", upstream=pin.name
        )
    os.chmod(scratch, 0o755)
    try:
        os.replace(scratch, dest)
    except OSError as err:
        raise SeriesError(f"{pin.name}: cannot move the verified tree to {dest}: {err}", upstream=pin.name) from None


def _private_copy(g: Scratch, pos: int, project_root: Path, e: PatchEntry) -> Path:
    """The entry's patch bytes, checked against the lock's sha256 now (not only at the pre-check), copied into
    the scratch's .git: git applies exactly the bytes that were checked. Raises EntryFailed on a mismatch."""
    try:
        data = read_patch_file(project_root, e)
    except PatchFileError as err:
        raise EntryFailed(f"{e.where or 'the lock'}: {err}") from None
    d = g.path / ".git" / "reprostack-patches"
    d.mkdir(exist_ok=True)
    p = d / f"{pos:04d}-{Path(e.value).name}"
    p.write_bytes(data)
    return p


def _entry_error(
    pin: GitPin,
    g: Scratch,
    dest: Path,
    pos: int,
    e: PatchEntry,
    label: str,
    before: str,
    before_tree: str,
    f: EntryFailed,
) -> SeriesError:
    lines = [f"{pin.name}: {label} (Upstream-Status: {e.upstream_status}): {f.reason}"]
    if e.description:
        lines.append(f"description: {e.description}")
    if e.kind != "cherry-pick":
        lines.append(f"patch file: {e.value}")
    if f.files:
        lines.append(f"files: {', '.join(f.files)}")
    if f.hunks:
        lines.append(f"hunks: {'; '.join(f.hunks)}")
    base = f"pinned base {pin.rev}, actual base {before} (tree {before_tree}"
    base += ")" if pos == 1 else (", after entry #1)" if pos == 2 else f", after entries #1..#{pos - 1})")
    if e.kind == "cherry-pick":
        parent = g("rev-parse", "-q", "--verify", f"{e.value}^", check=False)
        if parent:
            base += f"; the commit's own parent is {parent}"
    lines.append(base)
    lines.extend(f"git: {d}" for d in f.details[:12])
    lines.extend(f.changed)
    lines.append(f"nothing was written: the scratch tree was removed and {dest} was not created")
    return SeriesError(
        "\n  ".join(lines),
        upstream=pin.name,
        label=label,
        position=pos,
        upstream_status=e.upstream_status,
        files=tuple(f.files),
        hunks=tuple(f.hunks),
        expected_tree=e.tree if f.tree else None,
        actual_tree=f.tree,
    )
