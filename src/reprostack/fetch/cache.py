"""Content-addressed source cache: one bare repository per upstream URL, one *verified* marker per (url, rev).

Layout under the cache root (default `paths.cache_dir()`):

    git/<key>.git                 bare repo holding every commit fetched for that URL (from any mirror/bundle)
    git/<key>.lock                flock'ed while anything writes git/<key>.git (fetch + verify + marker)
    verified/<key>/<rev>.json     marker: commit <rev> was verified complete (records its tree, and
                                  whether its first parent's tree is present too, for cherry-picks)
    trees/<key>/                  a verified (patched) source tree (reprostack.sources.tree_key: <name>-<tree>, and
                                  the series key after a patched tree's)
    locks/trees/<key>.lock        flock'ed while that tree is checked, reused, removed or made
    tmp/<prefix>XXXX/             scratch space for bundle imports and wheel downloads (same filesystem as
                                  the repos), each folder held by an flock on its `.owner` file

where <key> = sha256(normalised url)[:16] + "-" + the URL's basename.

Invariants:
- an entry (url, rev) is *good* only when its marker exists. Markers are written atomically (temp file +
  os.replace) and only after verification, so a fetch killed half-way never leaves a good entry,
  whatever objects it left behind;
- a bare repo is created atomically (init in a temp dir, then rename): it either exists whole or not at all;
- a marker records facts about a commit (its tree, parent present), never about a pin: callers compare
  those facts with the lock;
- the cache never drops objects by itself: gc.auto=0, and each verified commit is held by a ref
  `refs/reprostack/<sha>`;
- the key is the pin's public URL, never a mirror's, so changing mirrors never changes the cache;
- interrupted work is cleaned up, never trusted: whoever takes a repo's flock first removes what a killed
  git left in it (`shallow.lock`, `*.lock` under refs, `objects/pack/tmp_pack_*` / `tmp_idx_*`, quarantine
  folders, a half-made `.<key>.git.XXXX`): under the flock no other writer can own them. A scratch folder
  under tmp/ whose `.owner` flock can be taken has no live owner and is removed (`clean_scratch`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .. import jsonsrc, paths
from ..atomicfile import write_text_atomic
from ..errors import FetchError
from ..gitcmd import GIT_INIT_CONFIG_KEYS, foreign_config, git

MARKER_MAX_BYTES = 64 * 1024


class _Unreadable(Exception):
    """A marker that cannot be read as a small JSON object: treated as absent (the commit is verified again)."""


_REPO_CONFIG = (("gc.auto", "0"), ("maintenance.auto", "false"), ("core.logAllRefUpdates", "false"))


def normalise_url(url: str) -> str:
    """Canonical form of a repository URL: scheme and host lower-cased, no trailing `/` or `.git`;
    a local path becomes an absolute `file://` URL. Two spellings of one repository share one cache entry."""
    u = url.strip()
    if "://" in u:
        scheme, rest = u.split("://", 1)
        host, sep, path = rest.partition("/")
        u = f"{scheme.lower()}://{host.lower()}{sep}{path}"
    elif not _is_scp_like(u):
        u = "file://" + os.path.abspath(os.path.expanduser(u))
    u = u.rstrip("/")
    if u.endswith(".git"):
        u = u[:-4].rstrip("/")
    return u


def _is_scp_like(u: str) -> bool:
    head = u.split(":", 1)[0]
    return ":" in u and "/" not in head and not u.startswith((".", "~"))


def url_key(url: str) -> str:
    """`<sha256 of normalised url>[:16]-<basename>`: the name of the URL's repo and marker folder."""
    norm = normalise_url(url)
    base = re.sub(r"[^A-Za-z0-9._-]", "_", re.split(r"[/:]", norm)[-1]) or "repo"
    return f"{hashlib.sha256(norm.encode()).hexdigest()[:16]}-{base.lstrip('.') or 'repo'}"


class Cache:
    """The source cache rooted at `root` (default `paths.cache_dir()`); see the module docstring."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else paths.cache_dir()

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    def repo_dir(self, url: str) -> Path:
        """Path of the bare repo for `url` (it may not exist yet)."""
        return self.root / "git" / f"{url_key(url)}.git"

    def scratch_dir(self) -> Path:
        """A folder on the cache's filesystem for temporary files (created on demand)."""
        d = self.root / "tmp"
        d.mkdir(parents=True, exist_ok=True)
        return d

    @contextmanager
    def lock(self, url: str) -> Iterator[Path]:
        """Hold the exclusive flock of `url`'s repo for the `with` block; yields the repo path.

        Every writer (fetch, bundle import, bundle export) takes it, so two processes never fetch
        into one repo at once. Blocks until the lock is free.
        """
        repo = self.repo_dir(url)
        repo.parent.mkdir(parents=True, exist_ok=True)
        with flocked(repo.with_name(f"{url_key(url)}.lock")):
            clean_stale(repo)
            yield repo

    @contextmanager
    def tree_lock(self, key: str) -> Iterator[Path]:
        """Hold the exclusive flock of the patched tree `trees/<key>` for the block; yields its path. Scratch
        folders `trees/.<key>.*` (a killed run's) are removed once it is held."""
        trees = self.root / "trees"
        locks = self.root / "locks" / "trees"
        trees.mkdir(parents=True, exist_ok=True)
        locks.mkdir(parents=True, exist_ok=True)
        with flocked(locks / f"{key}.lock"):
            for stale in trees.glob(f".{key}.*"):
                _remove(stale)
            yield trees / key

    @contextmanager
    def scratch(self, prefix: str) -> Iterator[Path]:
        """A fresh folder under tmp/ for the block, removed after it. An flock on its `.owner` file is held
        meanwhile, so that `clean_scratch` (run here first) can tell a killed run's folder from a live one."""
        self.clean_scratch()
        d = Path(tempfile.mkdtemp(prefix=prefix, dir=self.scratch_dir()))
        try:
            with flocked(d / ".owner"):
                yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def clean_scratch(self, min_age_s: float = 3600.0) -> list[Path]:
        """Remove the folders under tmp/ that no live process holds (their `.owner` flock can be taken; a
        folder without `.owner` when older than `min_age_s`). Returns what was removed."""
        removed = []
        try:
            entries = list(self.scratch_dir().iterdir())
        except OSError:
            return removed
        for d in entries:
            if not d.is_dir() or d.is_symlink():
                continue
            owner = d / ".owner"
            try:
                fh = open(owner, "r")
            except FileNotFoundError:
                try:
                    old = time.time() - d.stat().st_mtime > min_age_s
                except OSError:
                    continue
                if old:
                    shutil.rmtree(d, ignore_errors=True)
                    removed.append(d)
                continue
            except OSError:
                continue
            with fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live owner holds it
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
        return removed

    def ensure_repo(self, url: str) -> Path:
        """Return `url`'s bare repo, creating it (atomically) when absent. Call under `lock(url)`."""
        repo = self.repo_dir(url)
        if (repo / "HEAD").is_file():
            return repo
        repo.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=repo.parent))
        git("init", "--bare", "-q", str(tmp))
        for key, value in (*_REPO_CONFIG, ("reprostack.url", url)):
            git("config", key, value, cwd=tmp)
        os.rename(tmp, repo)
        return repo

    def marker_path(self, url: str, rev: str) -> Path:
        return self.root / "verified" / url_key(url) / f"{rev}.json"

    def read_marker(self, url: str, rev: str) -> dict | None:
        """The verified marker of (url, rev) as a dict (url, rev, tree, with_parent), or None."""
        try:  # bounded: a marker on a shared disk may be a FIFO, huge or nested without end (then: not verified)
            data = jsonsrc.load(self.marker_path(url, rev), _Unreadable, max_bytes=MARKER_MAX_BYTES)
        except _Unreadable:
            return None
        return data if data.get("rev") == rev else None

    def write_marker(self, url: str, rev: str, *, tree: str, with_parent: bool = False) -> Path:
        """Record that `rev` was verified complete with tree `tree` (atomic). Call only after verifying.

        `with_parent` is sticky: once a commit was verified with its parent, a later plain
        verification does not downgrade the marker.
        """
        old = self.read_marker(url, rev) or {}
        data = {
            "url": url,
            "rev": rev,
            "tree": tree,
            "with_parent": bool(with_parent or (old.get("with_parent") and old.get("tree") == tree)),
        }
        path = self.marker_path(url, rev)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_text_atomic(path, json.dumps(data, sort_keys=True))


@contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created when absent) for the block; blocks until it is free. The
    kernel drops it when the holder dies (kill -9 included), so a lock file left behind is never stale."""
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# What a killed git leaves in a repository (lock files, half-written packs, quarantine folders). Removed only
# while the repo's flock is held: then no other writer of ours is running in it.
_STALE_FILES = (
    "shallow.lock",
    "index.lock",
    "packed-refs.lock",
    "config.lock",
    "HEAD.lock",
    "FETCH_HEAD.lock",
    "ORIG_HEAD.lock",
)
_STALE_OBJECTS = (
    "pack/tmp_pack_*",
    "pack/tmp_idx_*",
    "pack/tmp_rev_*",
    "pack/*.keep.tmp",
    "tmp_objdir-*",
    "incoming-*",
    "*/tmp_obj_*",
)


def clean_stale(repo: Path) -> list[Path]:
    """Remove the leftovers of an interrupted git run in the bare repo `repo` and half-made `.<repo>.XXXX`
    folders next to it. Call only under the repo's flock. Returns what was removed."""
    removed: list[Path] = []
    for stale in repo.parent.glob(f".{repo.name}.*"):
        _remove(stale)
        removed.append(stale)
    if not repo.is_dir():
        return removed
    found = [repo / n for n in _STALE_FILES]
    found += [p for pat in _STALE_OBJECTS for p in (repo / "objects").glob(pat)]
    found += list((repo / "refs").rglob("*.lock")) if (repo / "refs").is_dir() else []
    for p in found:
        if p.exists() or p.is_symlink():
            _remove(p)
            removed.append(p)
    return removed


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


# what reprostack (and `git init --bare`) write into a cache repo's config; anything else is refused
CACHE_CONFIG_KEYS = (
    *GIT_INIT_CONFIG_KEYS,
    "protocol.version",
    "gc.auto",
    "maintenance.auto",
    "reprostack.url",
)


def check_cache_repo(repo: Path, label: str) -> None:
    """Refuse a cache repo whose config sets a key reprostack never writes (core.fsmonitor, core.sshCommand,
    include.path, url.*.insteadOf, filter.*, ...): FetchError naming the repo and the key."""
    if (repo / "HEAD").is_file():
        bad = foreign_config(repo, CACHE_CONFIG_KEYS)
        if bad:
            raise FetchError(
                f"{label}: the cache repo {repo} has config {', '.join(bad[:3])} that reprostack never "
                f"writes (a tampered or foreign cache?); nothing was run in it: remove {repo} and fetch again"
            )
