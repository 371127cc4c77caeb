"""Materialize a fetched pin as a fresh working tree: detached HEAD at pin.rev, submodules at their gitlinks.

Invariants:
- the working tree borrows objects from the cache repos through `objects/info/alternates` (what
  `git clone --shared` sets up), so nothing is copied and every cherry-pick commit fetched into the
  cache is reachable from the tree's object database. We `git init` + write alternates (+ copy the
  cache's `shallow` file) instead of calling `git clone --shared`: for a shallow source (our exact-SHA
  fetches) clone ignores --shared/--local and only transfers branches and tags, which a cache repo
  keyed by commit does not have;
- submodules come from their own cache repos at the gitlink the superproject records: never from the
  network, never from `.gitmodules` URLs. Each is a nested repository at dest/<path>;
- the result is checked (superproject tree == pin.tree, each submodule HEAD == its gitlink); on any
  failure dest is removed, so a dest that exists was fully materialized;
- `worktree_tree` is the tree hash of the files on disk (a fresh index: every file, untracked and ignored
  ones included, no skip-worktree/assume-unchanged bits, no stat cache): what "the files actually used"
  hash to, whatever a reused tree's own index claims; `commit_tree` checks that a commit object's bytes hash
  to its name before taking its tree (a tampered object store cannot substitute another commit);
- the tree depends on the cache: deleting the cache repos breaks it (run `git repack -a -d` in it to
  make it standalone).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..errors import FetchError
from ..gitcmd import GitFailed, git
from .verify import FetchedGit


def materialize(fetched: FetchedGit, dest: Path) -> Path:
    """Create a working tree of `fetched.pin` at `dest` (which must not exist) and return dest.

    HEAD is detached at pin.rev; each submodule is checked out at its gitlink from its cache repo.
    Raises FetchError: dest exists; a checkout fails; the result's tree or a submodule HEAD is not
    what the lock says.
    """
    pin = fetched.pin
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise FetchError(
            f"{pin.name}: {dest} already exists; materialize makes a fresh tree "
            f"(remove it or choose another destination)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        _shared_checkout(fetched.repo, dest, pin.rev)
        for sub in pin.submodules:
            _shared_checkout(fetched.submodules[sub.path], dest / sub.path, sub.rev)
        _check(dest, fetched)
    except GitFailed as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise FetchError(f"{pin.name}: materializing {pin.rev[:8]} into {dest} failed: {e}") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def checkout_submodules(fetched: FetchedGit, tree: Path) -> None:
    """Check out every submodule of `fetched.pin` at its gitlink inside the working tree `tree`.

    Used for a patched tree, whose superproject was rebuilt by the patch stage (a series must not move
    a gitlink: the submodule revs are the lock's). Raises FetchError when a checkout fails.
    """
    for sub in fetched.pin.submodules:
        path = Path(tree) / sub.path
        gitlink = git("ls-tree", "HEAD", "--", sub.path, cwd=tree).split()
        if len(gitlink) < 3 or gitlink[2] != sub.rev:
            raise FetchError(
                f"{fetched.pin.name}: {sub.path} gitlink in {tree} is "
                f"{gitlink[2] if len(gitlink) > 2 else 'absent'}, lock says {sub.rev}"
            )
        if (path / ".git").exists():
            continue
        try:
            _shared_checkout(fetched.submodules[sub.path], path, sub.rev)
        except GitFailed as e:
            raise FetchError(f"{fetched.pin.name}: submodule {sub.path} checkout failed: {e}") from None


def _shared_checkout(bare: Path, worktree: Path, rev: str) -> None:
    """`git init` worktree, borrow bare's objects (alternates, shallow list), check out rev detached."""
    git("init", "-q", "--template=", str(worktree))
    gitdir = worktree / ".git"
    info = gitdir / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text(f"{(Path(bare) / 'objects').resolve()}\n")
    if (Path(bare) / "shallow").is_file():
        shutil.copyfile(Path(bare) / "shallow", gitdir / "shallow")
    git("checkout", "-q", "--detach", rev, cwd=worktree)


def _check(dest: Path, fetched: FetchedGit) -> None:
    pin = fetched.pin
    tree = git("rev-parse", "HEAD^{tree}", cwd=dest)
    if tree != pin.tree:
        raise FetchError(f"{pin.name}: materialized tree at {pin.rev[:8]} is {tree}, lock says {pin.tree}")
    for sub in pin.submodules:
        head = git("rev-parse", "HEAD", cwd=dest / sub.path)
        if head != sub.rev:
            raise FetchError(f"{pin.name}: submodule {sub.path} checked out at {head}, lock says {sub.rev}")


def worktree_tree(path: Path, unpopulated: dict[str, str] | None = None) -> str:
    """The tree hash of the files under the working tree `path`, as they are on disk.

    `git add -A --force` into a temporary index (GIT_INDEX_FILE) then `git write-tree`: untracked and ignored
    files count, nested repositories count as gitlinks at their HEAD, the repo's own index (skip-worktree,
    assume-unchanged, stat cache) is not read. `unpopulated`: {path: commit} of gitlinks whose submodule the lock
    does not pin (never checked out): each is put in the index as that gitlink and its folder must be empty or
    absent on disk, else FetchError. Raises GitFailed when git cannot read the tree.
    """
    for sub in sorted(unpopulated or {}):
        d = Path(path) / sub
        if d.is_symlink() or (d.exists() and (not d.is_dir() or any(d.iterdir()))):
            raise FetchError(
                f"{path}: {sub} holds files, but the lock pins no submodule there (an unpopulated "
                "gitlink must stay empty)"
            )
    with tempfile.TemporaryDirectory(prefix="reprostack-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        for sub, commit in sorted((unpopulated or {}).items()):
            git("update-index", "--add", "--cacheinfo", f"160000,{commit},{sub}", cwd=path, env=env)
        git("add", "-A", "--force", "--", ".", cwd=path, env=env)
        return git("write-tree", cwd=path, env=env)


def gitlinks(repo: Path, tree: str) -> dict[str, str]:
    """{path: commit} of every gitlink (mode 160000) in `tree` of `repo`."""
    out = {}
    for line in git("ls-tree", "-r", "-z", "--", tree, cwd=repo, raw=True).split(b"\0"):
        if line.startswith(b"160000 "):
            meta, name = line.split(b"\t", 1)
            out[name.decode()] = meta.split()[2].decode()
    return out


def commit_tree(repo: Path, rev: str) -> str:
    """The tree of commit `rev` in `repo`, after checking that the commit object's bytes hash to `rev`.
    Raises GitFailed (missing object) or FetchError (the object store holds other bytes under that name)."""
    body = git("cat-file", "commit", rev, cwd=repo, raw=True)
    got = git("hash-object", "-t", "commit", "--stdin", "--literally", cwd=repo, input_bytes=body)
    if got != rev or not body.startswith(b"tree "):
        raise FetchError(f"{repo}: the object store holds a different commit under the name {rev} (hashes to {got})")
    return body.split(b"\n", 1)[0].split()[1].decode()
