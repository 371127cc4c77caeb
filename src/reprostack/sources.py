"""Stage `sources`: a pin of the lock -> a verified, patched working tree in the cache.

fetch (reprostack.fetch) -> materialize at the pinned rev -> apply the patch series
(reprostack.patch) -> check out submodules at their gitlinks. The result lives at
`<cache>/trees/<name>-<patched tree>-<series key>` (`tree_key`: the tree it must have and the series it was replayed
from: the base rev and every entry's kind, id and sha256; `<name>-<tree>` for a pin without a series). Nothing is
written there unless the whole series applied and the tree is the lock's; a changed series is replayed again even
when a folder of its target tree exists.

The cache is untrusted (a shared disk): a tree is reused only when the files on disk hash to the pinned tree
(checkout.worktree_tree: a fresh index, untracked/ignored/skip-worktree files included), each submodule's
files hash to the tree of its gitlink commit, and no repo in it has config keys or info/attributes that
reprostack never writes; otherwise it is made again. A freshly made tree is checked the same way (which
also catches a tampered object in the cache's object store).

Every call, cold or warm, first checks each committed patch file against the sha256 the lock pins (a
reused tree is only as good as the files it was made from, and the file on disk is what the lock vouches
for). The tree is checked, reused, removed or made under its own flock (`Cache.tree_lock`), so two
processes preparing one pin wait for each other and the second reuses the first's tree; scratch folders
of a killed run (`trees/.<name>-<tree>.*`) are removed under that lock. A tree that no longer verifies is
first renamed aside, then deleted: it never exists half-deleted under its final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .errors import FetchError
from .fetch import Cache, FetchedGit, checkout_submodules, fetch_git, materialize, mirrors_from_env
from .fetch.bundle import check_bundle
from .errors import PatchError
from .fetch.checkout import commit_tree, gitlinks, worktree_tree
from .gitcmd import DEFAULT_TIMEOUT_S, GIT_INIT_CONFIG_KEYS, GitFailed, default_timeout, foreign_config, git
from .lock import GitPin, Lock, PatchFileError, read_patch_file
from .patch import apply_series


@dataclass(frozen=True)
class SourceTree:
    """A ready source tree: `path` is a git working tree whose HEAD^{tree} is `tree`."""

    pin: GitPin
    path: Path
    tree: str
    patched: bool
    reused: bool


@dataclass(frozen=True)
class FetchOptions:
    """How to get sources: cache root, offline (cache and bundles only), mirrors, bundle archives, seconds per
    git command."""

    cache: Cache
    offline: bool = False
    mirrors: Mapping[str, str] | None = None
    bundles: Sequence[Path] = ()
    timeout: float = DEFAULT_TIMEOUT_S

    @classmethod
    def make(
        cls,
        cache_root: Path | None = None,
        *,
        offline: bool = False,
        mirrors: Mapping[str, str] | None = None,
        bundles: Sequence[Path] = (),
        timeout: float | None = None,
    ) -> "FetchOptions":
        """Options with mirrors from `mirrors` on top of $REPROSTACK_MIRRORS (PREFIX=MIRROR,...); `timeout`
        (seconds per git command) defaults to $REPROSTACK_GIT_TIMEOUT, else 600. Every bundle
        is checked here (readable, each member's sha256 as its manifest says), also when the cache already holds
        every pin and the bundle would never be opened. Raises FetchError naming the bundle or a bad timeout."""
        if timeout is None:
            try:
                timeout = default_timeout()
            except ValueError as e:
                raise FetchError(str(e)) from None
        for b in bundles:
            check_bundle(Path(b))
        m = dict(mirrors_from_env())
        m.update(mirrors or {})
        return cls(
            Cache(cache_root), offline=offline, mirrors=m, bundles=tuple(Path(b) for b in bundles), timeout=timeout
        )


def fetch(pin: GitPin, opts: FetchOptions) -> FetchedGit:
    """Fetch `pin` (rev, series commits, submodules) into the cache, verified. Raises FetchError."""
    from . import ui

    with ui.step(f"fetch {pin.name}"):
        return fetch_git(
            pin,
            cache=opts.cache,
            offline=opts.offline,
            mirrors=opts.mirrors,
            bundles=opts.bundles,
            timeout=opts.timeout,
        )


def prepare(lock: Lock, name: str, opts: FetchOptions, project_root: Path) -> SourceTree:
    """Return the patched (or plain, when the pin has no series) source tree of pin `name`.

    Raises LockError (unknown pin), FetchError (fetch/verify), PatchError (a patch file is not the bytes the
    lock pins: `LOCK:LINE: #N mbox FILE: ...`; series does not apply or the tree is not `patched-tree`).
    """
    from . import ui

    pin = lock.git(name)
    check_patch_files(pin, project_root)
    want = pin.patched_tree or pin.tree
    with opts.cache.tree_lock(tree_key(pin)) as final:
        # a tree in the cache is checked in a second, a fresh one fetched and patched: each its own ETA
        with ui.step(f"sources {name}", key=f"sources {name}" + (" (in cache)" if final.is_dir() else "")) as s:
            st = _prepare_locked(pin, final, want, opts, project_root)
            s.outcome = f"tree {want[:12]} {'reused' if st.reused else 'verified'}"
            return st


def series_id(pin: GitPin) -> list:
    """What a patched tree was replayed from: the base rev and every series entry's kind, id (commit or file) and
    sha256 (a committed file's bytes), in order."""
    return [pin.rev, *([p.kind, p.value, p.sha256] for p in pin.patches)]


def tree_key(pin: GitPin) -> str:
    """The cache folder of pin's verified tree: `<name>-<tree>` without a series; with one,
    `<name>-<patched tree>-<the first 12 hex of sha256(series_id)>`, so a tree is reused only under the series it was
    replayed from: a changed entry (another commit, a patch file with other bytes) or another base rev is replayed
    again even when the lock's `patched-tree` (and a folder of that tree) stays the same."""
    want = pin.patched_tree or pin.tree
    if not pin.patches:
        return f"{pin.name}-{want}"
    digest = hashlib.sha256(json.dumps(series_id(pin), separators=(",", ":")).encode()).hexdigest()
    return f"{pin.name}-{want}-{digest[:12]}"


def check_patch_files(pin: GitPin, project_root: Path) -> None:
    """Every committed patch file of `pin` has the sha256 the lock pins. Raises PatchError naming the lock's
    FILE:LINE, the entry and the file."""
    for e in pin.patches:
        if e.kind != "cherry-pick":
            try:
                read_patch_file(project_root, e)
            except PatchFileError as err:
                raise PatchError(f"{e.where or 'the lock'}: {pin.name} {e.label}: {err}") from None


def _prepare_locked(pin: GitPin, final: Path, want: str, opts: FetchOptions, project_root: Path) -> SourceTree:
    name = pin.name
    if final.is_dir():
        if _intact(final, pin, want):
            return SourceTree(pin, final, want, bool(pin.patches), reused=True)
        aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
        os.replace(final, aside / "tree")  # a tree that no longer verifies is never reused
        shutil.rmtree(aside, ignore_errors=True)
    fetched = fetch(pin, opts)
    with tempfile.TemporaryDirectory(prefix=f".{final.name}.", dir=final.parent) as tmp:
        src = materialize(fetched, Path(tmp) / "src")
        if pin.patches:
            staged = Path(tmp) / "patched"
            res = apply_series(pin, src, staged, project_root)
            checkout_submodules(fetched, staged)
            (staged / ".git" / SERIES_RECORD).write_text(json.dumps(_series_record(pin, [e.tree for e in res.entries])))
        else:
            staged = src
        _detach_objects(staged)
        bad = _files_problem(staged, pin, want)
        if bad:
            raise FetchError(f"{name}: prepared tree {bad}")
        staged.rename(final)
    return SourceTree(pin, final, want, bool(pin.patches), reused=False)


SERIES_RECORD = "reprostack-series.json"  # in a patched tree's .git: the series as replayed there


def _series_record(pin: GitPin, trees: list[str]) -> dict:
    """What a reused patched tree must still agree with: each entry (kind, value, sha256) and the tree it gave."""
    return {"rev": pin.rev, "entries": [[p.kind, p.value, p.sha256, t] for p, t in zip(pin.patches, trees)]}


def _series_agrees(path: Path, pin: GitPin) -> bool:
    """The series replayed into `path` is the lock's, and every entry `tree` the lock pins is the one it gave
    (a lock edited after the replay is replayed again, so its checkpoints are checked, not trusted)."""
    try:
        rec = json.loads((path / ".git" / SERIES_RECORD).read_text())
    except (OSError, ValueError):
        return False
    entries = rec.get("entries") or []
    if rec.get("rev") != pin.rev or len(entries) != len(pin.patches):
        return False
    return all(
        isinstance(e, list)
        and len(e) == 4
        and [p.kind, p.value, p.sha256] == e[:3]
        and (p.tree is None or p.tree == e[3])
        for p, e in zip(pin.patches, entries)
    )


def _intact(path: Path, pin: GitPin, want: str) -> bool:
    """HEAD's tree is `want`, the replayed series agrees with the lock's, and the files on disk are the pinned
    ones (see _files_problem). Nothing runs git in the tree before its repos' config was checked (a tampered
    config, gitfile or commondir could make git run a program)."""
    if path.is_symlink() or _config_problem(path, pin):
        return False
    if _tree_of(path) != want:
        return False
    if pin.patches and not _series_agrees(path, pin):
        return False
    return _files_problem(path, pin, want) is None


# what `git init` writes into a working tree's config; reprostack writes nothing else there
_TREE_CONFIG_KEYS = GIT_INIT_CONFIG_KEYS


def _config_problem(path: Path, pin: GitPin) -> str | None:
    """What in the tree's repos (superproject and submodules) reprostack never writes and git would read: config
    keys, a gitfile, a commondir, info/attributes; None when there is nothing. Runs no git in the tree."""
    repos = [(path, "")] + [(path / s.path, f"submodule {s.path} ") for s in pin.submodules]
    for repo, what in repos:
        bad = foreign_config(repo / ".git", _TREE_CONFIG_KEYS)
        if bad:
            return f"{what}has config {', '.join(bad[:3])} that reprostack never writes"
        if os.path.lexists(repo / ".git" / "info" / "attributes"):
            return f"{what}has .git/info/attributes, which reprostack never writes"
    return None


def _files_problem(path: Path, pin: GitPin, want: str) -> str | None:
    """None when the files under `path` hash to `want` (superproject, gitlinks included) and each submodule's
    files to the tree of its gitlink commit, and no repo there has config or info/attributes we never write;
    else what differs, in words."""
    bad = _config_problem(path, pin)
    if bad:
        return bad
    try:
        pinned = {sub.path for sub in pin.submodules}
        unpopulated = {p: c for p, c in gitlinks(path, want).items() if p not in pinned}
        got = worktree_tree(path, unpopulated)
        if got != want:
            return f"files hash to {got}, lock says {want}"
        for s in pin.submodules:
            sub = path / s.path
            sub_want = commit_tree(sub, s.rev)
            sub_got = worktree_tree(sub)
            if sub_got != sub_want:
                return f"submodule {s.path} files hash to {sub_got}, its commit {s.rev[:12]} has {sub_want}"
    except GitFailed as e:
        return f"cannot be read: {e}"
    except FetchError as e:
        return str(e)
    return None


def _tree_of(path: Path) -> str | None:
    try:
        return git("rev-parse", "HEAD^{tree}", cwd=path)
    except Exception:
        return None


def _detach_objects(tree: Path) -> None:
    """Point every repo in `tree` straight at the cache's object stores (not at the scratch `src`).

    The scratch checkouts borrow objects through chains of `objects/info/alternates`; the chain is
    flattened to the object dirs that outlive the scratch (the cache repos, which are shallow, so no
    repack), keeping the tree usable after its scratch source is deleted.
    """
    for gitdir in [tree / ".git", *[p for p in tree.glob("*/**/.git")]]:
        alt = gitdir / "objects" / "info" / "alternates"
        if alt.is_file():
            dirs = _alternates_closure(gitdir / "objects", tree)
            alt.write_text("".join(f"{d}\n" for d in dirs))
            # the cache repos are shallow: their boundary commits must be known here too, or history
            # walks (git log, fsck) stop with "missing parent"
            shallow = sorted(
                {
                    c
                    for d in dirs
                    if (d.parent / "shallow").is_file()
                    for c in (d.parent / "shallow").read_text().split()
                }
                | set((gitdir / "shallow").read_text().split() if (gitdir / "shallow").is_file() else ())
            )
            if shallow:
                (gitdir / "shallow").write_text("".join(f"{c}\n" for c in shallow))


def _alternates_closure(objects: Path, scratch_root: Path) -> list[Path]:
    seen: list[Path] = []
    todo = [objects]
    while todo:
        alt = todo.pop(0) / "info" / "alternates"
        if not alt.is_file():
            continue
        for line in alt.read_text().splitlines():
            d = Path(line.strip()).resolve()
            if line.strip() and d not in seen and d != objects:
                seen.append(d)
                todo.append(d)
    scratch = scratch_root.resolve().parent
    return [d for d in seen if scratch not in d.parents]
