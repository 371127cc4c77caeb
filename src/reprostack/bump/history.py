"""The bump's own full-history repository of one upstream: refs fetched by name, commits by id, history walks.

The fetch stage's cache repos are shallow (a pin needs only its commit); a bump needs old..new, reachability
and patch-ids across that range, so it keeps a separate, full-history bare repository per URL:

    <cache>/bump/<url key>.git      refs/bump/... only (never a branch), gc.auto=0
    <cache>/bump/<url key>.lock     flock'ed for the whole bump/outdated of that URL

Mirrors apply exactly as in the fetch stage (git's own `url.<mirror>.insteadOf`); nothing here reads a
mirror's path directly. As there: the URL is checked and passed after `--`, transient network failures are
retried (gitcmd.git_remote), and a repo whose config has a key we never write is refused.
"""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from ..errors import FetchError
from ..fetch import Cache, insteadof_args, via
from ..fetch.cache import clean_stale, flocked, url_key
from ..fetch.cache import check_cache_repo
from ..gitcmd import GitFailed, git, git_remote, url_problem

_NO_REF = re.compile(r"couldn't find remote ref|no such remote ref|not our ref|unadvertised object", re.I)


@dataclass(frozen=True)
class Commit:
    """One upstream commit: id, author name, committer date (ISO 8601, UTC offset kept) and subject."""

    sha: str
    author: str
    date: str
    subject: str


class History:
    """A full-history bare repository of `url` (see the module docstring); `label` names it in errors."""

    def __init__(self, label: str, url: str, repo: Path, mirrors: Mapping[str, str], timeout: float):
        self.label, self.url, self.repo, self.mirrors, self.timeout = label, url, repo, dict(mirrors), timeout

    def git(self, *args: str, check: bool = True, input_bytes: bytes | None = None) -> str:
        """git in the history repo (no network)."""
        return git(*args, cwd=self.repo, timeout=self.timeout, check=check, input_bytes=input_bytes)

    def where(self) -> str:
        """`URL` plus " (via mirror X)" when a mirror serves it."""
        return f"{self.url}{via(self.url, self.mirrors)}"

    def _remote(self, *args: str) -> str:
        why = url_problem(self.url)
        if why:
            raise FetchError(f"{self.label}: url {self.url!r} {why}")
        return git_remote(*insteadof_args(self.mirrors), *args, cwd=self.repo, timeout=self.timeout)

    def _fetch_quiet(self, *refspecs: str) -> str:
        """`git fetch` of `refspecs` from the pin's URL: no tags, no FETCH_HEAD, nothing printed."""
        return self._remote("fetch", "--no-tags", "--no-write-fetch-head", "--quiet", "--", self.url, *refspecs)

    # ------------------------------------------------------------------ remote
    def ls_remote(self, *patterns: str, tags: bool = False, sort: str | None = None) -> list[tuple[str, str]]:
        """[(ref, commit id)] the server advertises for `patterns` (only tags with `tags`; annotated tags
        peeled), in the server's or in `sort` order (a `git ls-remote --sort` key).

        Raises FetchError when the URL cannot be read.
        """
        opts = (["--tags"] if tags else []) + ([f"--sort={sort}"] if sort else [])
        try:
            out = self._remote("ls-remote", *opts, "--", self.url, *patterns)
        except GitFailed as e:
            raise FetchError(f"{self.label}: cannot list refs of {self.where()}: {_short(e)}") from None
        refs: dict[str, str] = {}
        order: list[str] = []
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            peeled = ref.endswith("^{}")
            ref = ref.removesuffix("^{}")
            if ref not in refs:
                order.append(ref)
            if peeled or ref not in refs:
                refs[ref] = sha
        return [(r, refs[r]) for r in order]

    def default_branch(self) -> str:
        """The ref the server's HEAD points at (e.g. refs/heads/main). Raises FetchError when it has none."""
        try:
            out = self._remote("ls-remote", "--symref", "--", self.url, "HEAD")
        except GitFailed as e:
            raise FetchError(f"{self.label}: cannot read HEAD of {self.where()}: {_short(e)}") from None
        m = re.search(r"^ref: (refs/\S+)\tHEAD$", out, re.M)
        if not m:
            raise FetchError(
                f"{self.label}: {self.where()} advertises no default branch (HEAD is not a symbolic ref): "
                f"give a `policy:` with a branch ref, or --to"
            )
        return m.group(1)

    def fetch_ref(self, ref: str) -> str | None:
        """Fetch `ref` (full history) to refs/bump/<ref without refs/>; return its commit, None when the server lacks it.

        Raises FetchError for any other failure (unreachable URL, timeout).
        """
        local = f"refs/bump/{ref.removeprefix('refs/')}"
        try:
            self._fetch_quiet(f"+{ref}:{local}")
        except GitFailed as e:
            if not e.timed_out and _NO_REF.search(e.stderr):
                return None
            raise FetchError(f"{self.label}: cannot fetch {ref} from {self.where()}: {_short(e)}") from None
        return self.git("rev-parse", f"{local}^{{commit}}")

    def ensure_commits(self, commits: list[str], hint_refs: tuple[str, ...] = ()) -> None:
        """Make every commit of `commits` present with its history: by id, then via `hint_refs`, then all heads/tags.

        Raises FetchError naming the commits that no source holds.
        """

        def missing() -> list[str]:
            return [c for c in dict.fromkeys(commits) if not self.has_commit(c)]

        todo = missing()
        if not todo:
            return
        try:
            self._fetch_quiet(*(f"+{c}:refs/bump/commits/{c}" for c in todo))
        except GitFailed as e:
            if e.timed_out or not _NO_REF.search(e.stderr):
                raise FetchError(
                    f"{self.label}: cannot fetch {', '.join(c[:12] for c in todo)} from {self.where()}: {_short(e)}"
                ) from None
        for ref in hint_refs:
            if not missing():
                return
            self.fetch_ref(ref)
        if missing():
            try:
                self._fetch_quiet("+refs/heads/*:refs/bump/heads/*", "+refs/tags/*:refs/bump/tags/*")
            except GitFailed as e:
                raise FetchError(f"{self.label}: cannot fetch from {self.where()}: {_short(e)}") from None
        gone = missing()
        if gone:
            raise FetchError(
                f"{self.label}: commit(s) {', '.join(c[:12] for c in gone)} are not on {self.where()}: "
                f"not fetchable by id, nor from the hint refs ({', '.join(hint_refs) or 'none'}), nor "
                f"from any branch or tag"
            )

    # ------------------------------------------------------------------ local
    def has_commit(self, sha: str) -> bool:
        """True when `sha` is a commit in the history repo."""
        return self.git("cat-file", "-t", sha, check=False) == "commit"

    def tree_of(self, rev: str) -> str:
        """The tree id of commit `rev`."""
        return self.git("rev-parse", f"{rev}^{{tree}}")

    def is_ancestor(self, a: str, b: str) -> bool:
        """True when commit `a` is reachable from `b` (or is `b`)."""
        return _rc_zero(self.repo, a, b, self.timeout)

    def commits(self, old: str, new: str, paths: list[str] | tuple[str, ...] = ()) -> list[Commit]:
        """Commits reachable from `new` and not from `old` (touching `paths`, when given), newest first."""
        out = self.git(
            "log", "--no-color", "--format=%H%x1f%an%x1f%cI%x1f%s", f"{old}..{new}", *(["--", *paths] if paths else [])
        )
        return [Commit(*line.split("\x1f", 3)) for line in out.splitlines() if line]

    def date(self, rev: str) -> str:
        """Committer date of `rev`, ISO 8601."""
        return self.git("log", "-1", "--format=%cI", rev)

    def epoch(self, rev: str) -> int:
        """Committer date of `rev`, seconds since the epoch."""
        return int(self.git("log", "-1", "--format=%ct", rev))

    def gitlinks(self, rev: str) -> dict[str, str]:
        """{path: commit} of every submodule gitlink (mode 160000) in the tree of `rev`."""
        out = self.git("ls-tree", "-r", "-z", rev)
        links = {}
        for item in out.split("\0"):
            meta, _, path = item.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[0] == "160000":
                links[path] = parts[2]
        return links


def _rc_zero(repo: Path, a: str, b: str, timeout: float) -> bool:
    try:
        git("merge-base", "--is-ancestor", a, b, cwd=repo, timeout=timeout)
        return True
    except GitFailed as e:
        if e.returncode == 1:
            return False
        raise


def _short(e: GitFailed) -> str:
    lines = [l.strip() for l in (e.stderr or e.stdout).strip().splitlines() if l.strip()]
    return " / ".join(lines[-3:]) or ("timed out" if e.timed_out else f"git exit {e.returncode}")


@contextmanager
def history(
    label: str, url: str, cache: Cache, mirrors: Mapping[str, str], timeout: float = 600.0
) -> Iterator[History]:
    """Open (creating atomically when absent) the full-history repo of `url` under `cache`, locked for the block."""
    root = cache.root / "bump"
    root.mkdir(parents=True, exist_ok=True)
    key = url_key(url)
    repo = root / f"{key}.git"
    with flocked(root / f"{key}.lock"):
        clean_stale(repo)  # what a killed run left (shallow.lock, tmp_pack_*, a half-made .<key>.git.XXXX)
        if not (repo / "HEAD").is_file():
            tmp = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=root))
            git("init", "--bare", "-q", str(tmp))
            for k, v in (
                ("gc.auto", "0"),
                ("maintenance.auto", "false"),
                ("core.logAllRefUpdates", "false"),
                ("reprostack.url", url),
            ):
                git("config", k, v, cwd=tmp)
            os.rename(tmp, repo)
        check_cache_repo(repo, label)
        yield History(label, url, repo, mirrors, timeout)
