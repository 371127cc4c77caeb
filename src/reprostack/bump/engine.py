"""`reprostack bump`: plan a pin's move to a new upstream revision, verify it, then write lock, patches, branch.

plan_bump (writes nothing but the cache):
    lock -> target (policy / --to) -> old..new commits -> upstreamed entries (reachable / patch-id) ->
    replay on the new rev (kept / refreshed / upstreamed / conflict) -> new submodule gitlinks and trees ->
    the pin's block rewritten -> verified: the new lock loads, `fetch` verifies the new pin, the patch stage
    replays the new series to `patched-tree`, and our replay finds every entry kept at offset 0.
write_bump (only after a verified plan): refreshed patch files and the lock written atomically, then a commit
on a new branch titled `Roll NAME OLD8..NEW8 (N commits)` with `Bump-*` trailers.
A conflict is a plan with status "conflict": its report is written, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import lock as lockmod
from ..atomicfile import write_text_atomic
from ..errors import BumpError, LockError, PatchError
from ..fetch import fetch_commit, materialize
from ..gitcmd import GitFailed, git
from ..lock import GitPin
from ..patch import apply_series, check_series
from ..sources import FetchOptions, fetch
from .history import Commit, History, history
from .impact import Impact, impact
from .lockedit import PinEdit, edit_pin
from .policy import Target, resolve
from .prbody import render, title
from .replay import Replay, replay
from .tied import LeftBehind, left_behind
from .upstreamed import classify


@dataclass(frozen=True)
class SubmoduleMove:
    """A lock submodule at the old and the new superproject revision (`new_tree`: its commit's tree)."""

    path: str
    url: str
    old_rev: str
    new_rev: str
    new_tree: str


@dataclass
class BumpResult:
    """Everything a bump found; `status`: "bumped" (verified, ready to write), "conflict" or "current"."""

    upstream: str
    url: str
    status: str
    target: Target
    old_rev: str
    old_tree: str
    old_date: str
    new_rev: str
    new_tree: str
    new_date: str
    commits: list[Commit]
    replay: Replay
    impact: Impact
    lock_path: Path
    lock_name: str
    old_lock_text: str
    args: list[str]
    env_prefix: str = ""
    old_patched_tree: str | None = None
    patched_tree: str | None = None
    new_lock_text: str | None = None
    submodules: list[SubmoduleMove] = field(default_factory=list)
    new_gitlinks: dict[str, str] = field(default_factory=dict)
    refreshed: dict[str, bytes] = field(default_factory=dict)  # lock path of a patch file -> new bytes
    branch: str | None = None
    commit: str | None = None
    conflict_commits: list[Commit] = field(default_factory=list)  # upstream commits in old..new touching its files
    history: str | None = None  # "### Gate history" Markdown (reprostack.history.bumpview), when runs exist
    left_behind: list[LeftBehind] = field(default_factory=list)  # tied pins that stay where they were (bump.tied)

    @property
    def title(self) -> str:
        return title(self.upstream, self.old_rev, self.new_rev, len(self.commits))

    def summary(self) -> dict:
        """A JSON-able summary (out/bump/<pin>-<new8>.json)."""
        return {
            "upstream": self.upstream,
            "url": self.url,
            "status": self.status,
            "title": self.title,
            "old_rev": self.old_rev,
            "new_rev": self.new_rev,
            "old_tree": self.old_tree,
            "new_tree": self.new_tree,
            "target": {"ref": self.target.ref, "how": self.target.how},
            "commits": len(self.commits),
            "patched_tree": self.patched_tree,
            "branch": self.branch,
            "commit": self.commit,
            "entries": [
                {
                    "position": o.position,
                    "kind": o.entry.kind,
                    "value": o.entry.value,
                    "upstream_status": o.entry.upstream_status,
                    "outcome": o.outcome,
                    "detail": o.detail,
                    "tree": o.tree,
                    "files": list(o.files),
                    "hunks": list(o.hunks),
                    "upstream_commit": o.upstream_commit,
                }
                for o in self.replay.outcomes
            ],
            "submodules": [s.__dict__ for s in self.submodules],
            "refreshed": sorted(self.refreshed),
            "left_behind": [lb.__dict__ for lb in self.left_behind],
        }


class BumpConflict(PatchError):
    """The replay stopped at an entry that does not apply with zero fuzz; `.result` holds the whole plan."""

    def __init__(self, result: BumpResult):
        c = result.replay.conflict
        lines = [
            f"{result.upstream}: bump to {result.new_rev[:12]} ({result.target.how}) stops at {c.label} "
            f"(Upstream-Status: {c.entry.upstream_status}): {c.detail}"
        ]
        if c.files:
            lines.append(f"files: {', '.join(c.files)}")
        if c.hunks:
            lines.append(f"hunks: {'; '.join(c.hunks)}")
        lines.append(f"nothing was written: {result.lock_path} and patches/ are as they were, no branch was made")
        super().__init__("\n  ".join(lines))
        self.result = result


def plan_bump(
    lock_path: Path,
    name: str,
    opts: FetchOptions,
    *,
    to: str | None = None,
    project_root: Path | None = None,
    allow_rewind: bool = False,
    args: list[str] | None = None,
) -> BumpResult:
    """Work out and verify the bump of pin `name` (see the module docstring); write nothing but the cache.

    Args:
        lock_path: the lockfile; project_root: the folder of `patches/` (default: the lock's folder).
        opts: how to reach the upstreams (mirrors); `opts.offline` is refused (a bump needs the upstream).
        to: target override (40-hex id, refs/..., branch or tag name); default: the pin's policy.
        allow_rewind: accept a target that does not descend from the pinned rev.
        args: the command's arguments, for the report.
    Returns:
        BumpResult with status "bumped" (new_lock_text, refreshed files: verified), "current" (already there)
        or "conflict" (the replay stopped; also raised as BumpConflict by `bump`).
    Raises:
        LockError (bad lock, policy target missing: FILE:LINE), BumpError (--to missing, target moved or
        behind, offline), FetchError, PatchError (the pre-check of the current series failed).
    """
    lock_path = Path(lock_path)
    root = Path(project_root) if project_root else lock_path.resolve().parent
    lock = lockmod.load(lock_path, root)
    pin = lock.git(name)
    _check_online(name, opts)
    old_text = lock_path.read_bytes().decode("utf-8")
    with history(name, pin.url, opts.cache, opts.mirrors or {}, opts.timeout) as h:
        target = resolve(h, lock, pin, to)
        picks = [e.value for e in pin.patches if e.kind == "cherry-pick"]
        h.ensure_commits([pin.rev, *picks], pin.hint_refs())
        _check_pinned_tree(h, lock, pin)
        _check_direction(h, pin, target, allow_rewind)
        headers = check_series(pin, h.repo, root) if pin.patches else {}
        commits = h.commits(pin.rev, target.rev)
        found = classify(h, pin, target.rev, root)
        rp = replay(pin, h.repo, target.rev, root, headers, found)
        new_tree = h.tree_of(target.rev)
        result = BumpResult(
            upstream=name,
            url=pin.url,
            status="bumped",
            target=target,
            old_rev=pin.rev,
            old_tree=pin.tree,
            old_date=h.date(pin.rev),
            new_rev=target.rev,
            new_tree=new_tree,
            new_date=h.date(target.rev),
            commits=commits,
            replay=rp,
            impact=impact(root, name),
            lock_path=lock_path,
            lock_name=lock_path.name,
            old_lock_text=old_text,
            args=list(args or [name]),
            env_prefix=_env_prefix(opts),
            old_patched_tree=pin.patched_tree,
        )
        if target.rev == pin.rev:
            result.status = "current"
            return result
        if rp.conflict:
            result.status = "conflict"
            if rp.conflict.files:
                result.conflict_commits = h.commits(pin.rev, target.rev, rp.conflict.files)
            return result
        links = h.gitlinks(target.rev)
    result.submodules, result.new_gitlinks = _submodules(pin, links, opts, lock)
    _rewrite_pin(result, pin, lock, root)
    _verify(result, pin, root, opts)
    return result


def _check_online(name: str, opts: FetchOptions) -> None:
    """BumpError when `opts` keep the bump off the network (--offline, --bundle): a bump reads the upstream itself."""
    if opts.offline or opts.bundles:
        raise BumpError(
            f"{name}: a bump reads the upstream itself; --offline / --bundle cannot be used "
            f"(point the URL at a local mirror with --mirror or REPROSTACK_MIRRORS instead)"
        )


def _check_pinned_tree(h: History, lock, pin: GitPin) -> None:
    """LockError at the pin's `tree:` line unless the pinned rev's tree on the upstream is the lock's."""
    old_tree = h.tree_of(pin.rev)
    if old_tree != pin.tree:
        raise LockError(
            str(lock.path),
            lock.line_of(("upstreams", pin.name, "tree")),
            f"upstreams.{pin.name}.tree",
            f"the pinned rev {pin.rev[:12]} has tree {old_tree} on {h.where()}, the lock says {pin.tree}",
        )


def _rewrite_pin(result: BumpResult, pin: GitPin, lock, root: Path) -> None:
    """The pin's block rewritten for the replayed move (rev, tree, original, fetch hint, submodules, series trees,
    patched tree, refreshed patches' sha256) into `result.new_lock_text`, and the tied pins it leaves behind."""
    rp, target = result.replay, result.target
    result.refreshed = {o.entry.value: o.refreshed for o in rp.outcomes if o.outcome == "refreshed"}
    result.patched_tree = rp.tree if rp.remaining else None
    edit = PinEdit(
        rev=target.rev,
        tree=result.new_tree,
        original=_original(target, result.new_date),
        # a target outside branches and tags (a PR head) is written as a hint: the fetch stage only accepts
        # a commit reachable from a ref of the URL, and the lock must say which one
        fetch_refs=((target.ref,) if target.ref else ()) if pin.fetch_refs or _needs_hint(target.ref) else None,
        submodules={s.path: (s.new_rev, s.new_tree) for s in result.submodules},
        series=[o.tree if o.outcome in ("kept", "refreshed") else None for o in rp.outcomes],
        patched_tree=result.patched_tree,
        patch_sha256={
            i: hashlib.sha256(o.refreshed).hexdigest() for i, o in enumerate(rp.outcomes) if o.outcome == "refreshed"
        },
    )
    result.new_lock_text = edit_pin(result.old_lock_text, pin.name, edit, str(result.lock_path))
    moved = replace(
        pin, original=edit.original, fetch_refs=pin.fetch_refs if edit.fetch_refs is None else edit.fetch_refs
    )
    result.left_behind = left_behind(root, lock, pin, moved)


def _check_direction(h: History, pin: GitPin, target: Target, allow_rewind: bool) -> None:
    if target.rev == pin.rev or h.is_ancestor(pin.rev, target.rev):
        return
    if h.is_ancestor(target.rev, pin.rev):
        raise BumpError(
            f"{pin.name}: the target {target.rev[:12]} ({target.how}) is behind the pinned rev "
            f"{pin.rev[:12]} (an ancestor of it): the ref was moved back; nothing was written"
        )
    if not allow_rewind:
        raise BumpError(
            f"{pin.name}: the target {target.rev[:12]} ({target.how}) does not descend from the pinned "
            f"rev {pin.rev[:12]}: the ref was moved (force-pushed or rewritten) or is on another line; "
            f"nothing was written (--allow-rewind bumps across anyway)"
        )


def _original(target: Target, date: str) -> str:
    """The new `original:` (what a human would name): the tag, or `BRANCH @ DATE (REV8)`, or `REV8 @ DATE`."""
    if target.ref and target.ref.startswith("refs/tags/"):
        return target.ref.removeprefix("refs/tags/")
    if target.ref:
        return f"{target.ref.removeprefix('refs/heads/')} @ {date[:10]} ({target.rev[:8]})"
    return f"{target.rev[:8]} @ {date[:10]}"


def _submodules(pin: GitPin, links: dict[str, str], opts: FetchOptions, lock) -> tuple[list[SubmoduleMove], dict]:
    moves = []
    for s in pin.submodules:
        if s.path not in links:
            raise LockError(
                str(lock.path),
                lock.line_of(("upstreams", pin.name, "submodules", s.path)),
                f"upstreams.{pin.name}.submodules.{s.path}",
                "is no longer a submodule (gitlink) at the new revision: edit the lock by hand",
            )
        rev = links[s.path]
        _, tree = fetch_commit(
            f"{pin.name}:{s.path}", s.url, rev, cache=opts.cache, mirrors=opts.mirrors, timeout=opts.timeout
        )
        moves.append(SubmoduleMove(s.path, s.url, s.rev, rev, tree))
    extra = {p: c for p, c in links.items() if p not in {s.path for s in pin.submodules}}
    return moves, extra


def _verify(r: BumpResult, old_pin: GitPin, root: Path, opts: FetchOptions) -> None:
    """The new lock as the other stages will read it: loads, fetches, patches to `patched-tree`, replays at offset 0."""
    with tempfile.TemporaryDirectory(prefix="reprostack-bump-") as tmp:
        staged = Path(tmp) / "project"
        staged.mkdir()
        # every pin's committed patch files (the whole lock is validated, and the lock vouches for each file by
        # sha256), links kept as links so the loader still refuses one that leaves patches/; then the refreshed
        # files of the bumped pin in place of theirs
        if (root / "patches").is_dir():
            shutil.copytree(root / "patches", staged / "patches", symlinks=True)
        for e in old_pin.patches:
            if e.kind != "cherry-pick":
                dst = staged / e.value
                dst.parent.mkdir(parents=True, exist_ok=True)
                if e.value in r.refreshed:
                    dst.unlink(missing_ok=True)
                    dst.write_bytes(r.refreshed[e.value])
                elif not dst.exists():
                    shutil.copyfile(root / e.value, dst)
        probe = staged / r.lock_name
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text(r.new_lock_text, encoding="utf-8")
        try:
            new = lockmod.load(probe, staged).git(r.upstream)
        except LockError as e:
            raise BumpError(f"internal error: the bumped lock does not validate, nothing written: {e}") from None
        if (new.rev, new.tree, new.patched_tree) != (r.new_rev, r.new_tree, r.patched_tree):
            raise BumpError(
                f"internal error: the bumped lock reads back as {new.rev} / {new.tree} / "
                f"{new.patched_tree}, nothing written"
            )
        fetched = fetch(new, opts)
        if new.patches:
            src = materialize(fetched, Path(tmp) / "src")
            try:
                apply_series(new, src, Path(tmp) / "patched", staged)
            except PatchError as e:
                raise BumpError(
                    f"internal error: the bumped series does not replay through the patch stage, "
                    f"nothing written:\n  {e}"
                ) from None
            again = replay(new, src, r.new_rev, staged, check_series(new, src, staged), {})
            bad = [o for o in again.outcomes if o.outcome != "kept"]
            if bad:
                raise BumpError(
                    "internal error: after the refresh, entries still do not apply at offset 0: "
                    + "; ".join(f"{o.label}: {o.outcome} {o.detail}" for o in bad)
                    + "; nothing written"
                )


def _env_prefix(opts: FetchOptions) -> str:
    raw = os.environ.get("REPROSTACK_MIRRORS")
    return f'REPROSTACK_MIRRORS="{raw}" ' if raw else ""


# ---------------------------------------------------------------------------------------------- writing


def preflight(r: BumpResult, branch: str | None) -> None:
    """Before writing: the lock and refreshed files are unmodified in git, `branch` does not exist yet.

    Raises BumpError naming the file or branch; nothing is written. With branch None only files are checked
    (and only when they are in a git work tree).
    """
    top = _toplevel(r.lock_path.resolve().parent)
    if top is None:
        if branch:
            raise BumpError(f"{r.lock_path}: not in a git work tree, so no branch can be made: pass --no-commit")
        return
    paths = _written_paths(r)
    dirty = git("status", "--porcelain", "--", *map(str, paths), cwd=top)
    if dirty:
        raise BumpError(
            "uncommitted changes in what the bump would write (commit or stash them first):\n  "
            + "\n  ".join(dirty.splitlines())
        )
    if branch and git("rev-parse", "--verify", "-q", f"refs/heads/{branch}", cwd=top, check=False):
        raise BumpError(f"branch {branch} already exists in {top}: delete it or pass --branch NAME")


def _toplevel(path: Path) -> Path | None:
    try:
        return Path(git("rev-parse", "--show-toplevel", cwd=path))
    except GitFailed:
        return None


def _written_paths(r: BumpResult) -> list[Path]:
    root = r.lock_path.resolve().parent
    return [r.lock_path.resolve(), *(root / p for p in sorted(r.refreshed))]


def write_bump(r: BumpResult, branch: str | None) -> None:
    """Write the verified plan `r`: refreshed patch files, then the lock (each atomically); then, when `branch`,
    `git switch -c branch` and commit exactly those files (title, body, `Bump-*` trailers) with the user's
    identity. Raises BumpError (nothing written) when preflight fails; on a failed commit the files are restored
    from HEAD and the previous branch is checked out again."""
    if r.status != "bumped" or r.new_lock_text is None:
        raise BumpError(f"{r.upstream}: nothing to write ({r.status})")
    preflight(r, branch)
    top = _toplevel(r.lock_path.resolve().parent) if branch else None
    previous = git("rev-parse", "--abbrev-ref", "HEAD", cwd=top) if top else None
    if top:
        try:
            git("switch", "-q", "-c", branch, cwd=top, user=True)
        except GitFailed as e:
            raise BumpError(f"cannot create branch {branch} in {top} (nothing written): {e.stderr.strip()}") from None
    root = r.lock_path.resolve().parent
    try:
        for rel, data in sorted(r.refreshed.items()):
            p = root / rel
            write_text_atomic(p, data.decode("utf-8"), mode=p.stat().st_mode & 0o7777)
        write_text_atomic(r.lock_path, r.new_lock_text, mode=r.lock_path.stat().st_mode & 0o7777)
        if top:
            paths = [str(p) for p in _written_paths(r)]
            git("add", "--", *paths, cwd=top)
            git(
                "-c",
                "commit.gpgSign=false",
                "commit",
                "-q",
                "--no-verify",
                "-F",
                "-",
                "--",
                *paths,
                cwd=top,
                user=True,
                input_bytes=commit_message(r).encode(),
            )
            r.branch, r.commit = branch, git("rev-parse", "HEAD", cwd=top)
    except (GitFailed, OSError) as e:
        if top:
            git("checkout", "-q", "HEAD", "--", *map(str, _written_paths(r)), cwd=top, check=False)
            git("switch", "-q", previous, cwd=top, check=False, user=True)
            git("branch", "-D", branch, cwd=top, check=False)
        raise BumpError(f"{r.upstream}: writing the bump failed, the files were restored: {e}") from None


def commit_message(r: BumpResult) -> str:
    """Title, a short body and the trailers naming the upstream and the old/new revs."""
    counts: dict[str, int] = {}
    for o in r.replay.outcomes:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    body = [
        r.title,
        "",
        f"{r.url}: {r.old_rev[:12]}..{r.new_rev[:12]} ({r.target.how}).",
        "Patch series: " + (", ".join(f"{v} {k}" for k, v in counts.items()) or "none") + ".",
    ]
    if r.patched_tree:
        body.append(f"patched-tree {r.patched_tree}.")
    body += ["", f"Bump-Upstream: {r.upstream}", f"Bump-Old-Rev: {r.old_rev}", f"Bump-New-Rev: {r.new_rev}"]
    return "\n".join(body) + "\n"


def write_report(r: BumpResult, out_dir: Path) -> Path:
    """Write the PR body (`<pin>-<new8>.md`) and its JSON summary next to it under `out_dir`; returns the .md path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{r.upstream}-{r.new_rev[:8]}.md"
    write_text_atomic(md, render(r))
    write_text_atomic(md.with_suffix(".json"), json.dumps(r.summary(), indent=2) + "\n")
    return md


def _needs_hint(ref: str | None) -> bool:
    """True for a ref that `git fetch` of all branches and tags would not bring (refs/pull/N/head, ...)."""
    return bool(ref) and not ref.startswith(("refs/heads/", "refs/tags/"))
