"""Fetch a git pin (commit + tree, its cherry-pick commits, its submodules) into the source cache.

Invariants:
- we fetch by commit id, never by what a ref points at: a moved tag or force-pushed branch changes
  nothing; refs are only hints of where a commit can be found;
- order of sources for each repository: a good cache entry, then the given bundles, then the network
  (never with offline=True). Objects already in the cache but without a marker are verified again
  before they count;
- network order: exact-SHA shallow fetch (`git fetch --depth=1 URL SHA`; cherry-picks with --depth=2 so
  their parent comes along); if the server refuses SHA-in-want ("not our ref", "unadvertised object"),
  fetch each hint ref (`fetch-refs` plus patch entries' `ref`) in full, then all heads and tags. A
  transient failure (timeout, connection reset, early EOF, HTTP 5xx) is retried with backoff
  (gitcmd.git_remote); any other failure (unknown host, not a repository) is a FetchError at once;
- a commit fetched from the network counts only when it is reachable from a ref the server (or the mirror
  standing in for it) has at fetch time: the hint refs first, then every branch and tag (their history
  down to the commit is fetched; `--unshallow` when an earlier shallow fetch cuts the walk). GitHub serves a
  fork's commits from the upstream URL (one object store), so fetchable-by-id proves nothing. Offline, a
  commit whose objects are in the cache without a marker is verified by tree only (nothing to ask);
- the URL is checked (gitcmd.url_problem) and passed after `--`; a cache repo whose config has a key we
  never write is refused (check_cache_repo);
- mirrors use git's own URL rewriting: `git -c url.<MIRROR>.insteadOf=<PREFIX> fetch <public url>`;
  the longest matching prefix wins, the cache is still keyed by the public URL. A mirror that is a local
  path is made absolute. `REPROSTACK_MIRRORS=PREFIX=MIRROR[,PREFIX=MIRROR...]` adds mirrors
  (explicit `mirrors=` entries take precedence);
- a submodule is fetched into its own cache repo at the gitlink the superproject tree records;
  the lock's submodule rev must equal that gitlink;
- nothing counts as fetched until `verify.verify_commits` passed and the markers were written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import FetchError, SourceUnreachable
from ..gitcmd import GitFailed, git, git_remote, url_problem
from ..lock import GitPin
from . import verify
from .bundle import import_bundle
from .cache import Cache, check_cache_repo
from .verify import FetchedGit, Wanted, cherry_picks

MIRRORS_ENV = "REPROSTACK_MIRRORS"

# Server refused a fetch by id, or does not have it: try the hint refs next.
_REFUSED = re.compile(
    r"not our ref|unadvertised object|couldn't find remote ref|no such remote ref"
    r"|does not support shallow",
    re.I,
)
_NO_SUCH_REF = re.compile(r"couldn't find remote ref|no such remote ref", re.I)


def mirrors_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Parse `REPROSTACK_MIRRORS` = `PREFIX=MIRROR[,PREFIX=MIRROR...]` into {public prefix: mirror}.

    Returns {} when unset or empty. Raises FetchError on an entry without `=`.
    """
    raw = (os.environ if environ is None else environ).get(MIRRORS_ENV, "")
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in raw.split(","))):
        prefix, sep, mirror = item.partition("=")
        if not sep or not prefix.strip() or not mirror.strip():
            raise FetchError(f"{MIRRORS_ENV}: {item!r} is not PREFIX=MIRROR")
        why = url_problem(mirror.strip(), local=True)
        if why:
            raise FetchError(f"{MIRRORS_ENV}: mirror {mirror.strip()!r} {why}")
        out[prefix.strip()] = mirror.strip()
    return out


def wanted(pin: GitPin) -> tuple[Wanted, list[tuple[str, Wanted]]]:
    """What the cache must hold for `pin`: the superproject, and (path, Wanted) per submodule."""
    top = Wanted(pin.name, pin.url, pin.rev, pin.tree, cherry_picks(pin), pin.hint_refs())
    subs = [(s.path, Wanted(f"{pin.name}:{s.path}", s.url, s.rev, s.tree, (), s.fetch_refs)) for s in pin.submodules]
    return top, subs


def fetch_git(
    pin: GitPin,
    *,
    cache: Cache,
    offline: bool = False,
    mirrors: Mapping[str, str] | None = None,
    bundles: Sequence[Path] = (),
    timeout: float = 600,
) -> FetchedGit:
    """Make `pin` (rev, cherry-pick commits, submodules) present and verified in `cache`.

    Args:
      pin: the git pin from upstreams.lock.
      cache: the source cache to fill.
      offline: never touch the network; succeed only from the cache or from `bundles`.
      mirrors: {public URL prefix: mirror URL or local path}, on top of REPROSTACK_MIRRORS.
      bundles: archives written by `write_bundle`, imported when the cache lacks something.
      timeout: seconds allowed for each git command.
    Returns FetchedGit(pin, bare superproject repo, {submodule path: bare repo}).
    Raises FetchError: the URL is unreachable; the commit is gone from the server (names the hint refs
    tried); a tree differs from the lock; a submodule gitlink differs from the lock; offline and the
    pin is neither cached nor in a bundle; a bundle is corrupted.
    """
    mirror_map = {**mirrors_from_env(), **(mirrors or {})}
    top, subs = wanted(pin)
    if bundles and not all(_good(cache, w, timeout) for w in (top, *(w for _, w in subs))):
        for b in bundles:
            import_bundle(Path(b), cache, timeout)
    how = dict(cache=cache, offline=offline, mirrors=mirror_map, timeout=timeout, bundles=tuple(bundles))
    repo = _ensure(top, **how)
    _check_gitlinks(repo, pin, timeout)
    sub_repos = {path: _ensure(w, **how) for path, w in subs}
    return FetchedGit(pin=pin, repo=repo, submodules=sub_repos)


def fetch_commit(
    label: str,
    url: str,
    rev: str,
    *,
    cache: Cache,
    offline: bool = False,
    mirrors: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> tuple[Path, str]:
    """Make the one commit `rev` of `url` present and verified in `cache`, whatever its tree.

    Used where the tree is what we want to learn (a submodule's new gitlink during a bump).
    Returns (the URL's bare cache repo, the tree of `rev`). Raises FetchError as fetch_git does.
    """
    mirror_map = {**mirrors_from_env(), **(mirrors or {})}
    want = Wanted(label, url, rev)
    repo = _ensure(want, cache=cache, offline=offline, mirrors=mirror_map, timeout=timeout, bundles=())
    return repo, git("rev-parse", f"{rev}^{{tree}}", cwd=repo, timeout=timeout)


def insteadof_args(mirrors: Mapping[str, str]) -> list[str]:
    """`-c url.<MIRROR>.insteadOf=<PREFIX>` arguments for git (local mirror paths made absolute)."""
    return _insteadof_args(mirrors)


def via(url: str, mirrors: Mapping[str, str]) -> str:
    """ " (via mirror X)" when `url` is rewritten to a mirror, else "" (for error messages)."""
    return _via(url, mirrors)


def _good(cache: Cache, want: Wanted, timeout: float) -> bool:
    return verify.is_good(cache, cache.repo_dir(want.url), want, timeout)


def _ensure(
    want: Wanted, *, cache: Cache, offline: bool, mirrors: Mapping[str, str], timeout: float, bundles: tuple[Path, ...]
) -> Path:
    """Bring one repository's commits into the cache (under its lock) and mark them verified."""
    with cache.lock(want.url) as repo:
        check_cache_repo(repo, want.label)
        if verify.is_good(cache, repo, want, timeout):
            return repo
        if offline:
            if verify.missing_objects(repo, want.object_names(), timeout):
                raise SourceUnreachable(_offline_message(want, cache, bundles))
            # objects present (a fetch killed before its marker): verified again, reachability not provable offline
        else:
            why = url_problem(want.url)
            if why:
                raise FetchError(f"{want.label}: url {want.url!r} {why}")
            repo = cache.ensure_repo(want.url)
            _fetch_from_network(repo, want, mirrors, timeout)
        trees = verify.verify_commits(repo, want, timeout)
        verify.mark_verified(cache, want, trees, repo, timeout)
        return repo


def _offline_message(want: Wanted, cache: Cache, bundles: tuple[Path, ...]) -> str:
    where = f"the bundles {', '.join(map(str, bundles))} do not hold it" if bundles else "no bundle was given"
    return (
        f"{want.label}: {want.url} @ {want.rev[:12]} is not in the cache {cache.root} and {where} "
        f"(offline: the network is not used). On a node with network access run `reprostack fetch`, "
        f"then `reprostack bundle`, copy the bundle here and pass it with --bundle."
    )


def _insteadof_args(mirrors: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for prefix, mirror in mirrors.items():
        why = url_problem(mirror, local=True)
        if why:
            raise FetchError(f"mirror {mirror!r} for {prefix!r} {why}")
        target = _absolute_mirror(mirror)
        if "=" in target:
            raise FetchError(f"mirror {mirror!r} for {prefix!r}: '=' cannot be passed to git -c")
        args += ["-c", f"url.{target}.insteadOf={prefix}"]
    return args


def _absolute_mirror(mirror: str) -> str:
    if "://" in mirror or (":" in mirror.split("/", 1)[0] and not mirror.startswith((".", "/", "~"))):
        return mirror
    path = os.path.abspath(os.path.expanduser(mirror))
    # keep a trailing slash: `PREFIX/=DIR/` must rewrite PREFIX/x to DIR/x, not DIRx
    return path + "/" if mirror.endswith("/") and not path.endswith("/") else path


def _effective_url(url: str, mirrors: Mapping[str, str]) -> str:
    """`url` after insteadOf rewriting (longest prefix wins, as in git)."""
    best = max((p for p in mirrors if url.startswith(p)), key=len, default=None)
    return url if best is None else _absolute_mirror(mirrors[best]) + url[len(best) :]


class _Remote:
    """One network fetch session of `want` into `repo`: the fetch itself (by refspec, through the mirrors) and what
    is still missing (objects) or unproven (a commit no fetched ref reaches)."""

    def __init__(self, repo: Path, want: Wanted, mirrors: Mapping[str, str], timeout: float):
        self.repo, self.want, self.mirrors, self.timeout = repo, want, mirrors, timeout
        self.cfg = _insteadof_args(mirrors)

    def fetch(self, opts: tuple[str, ...], *refspecs: str) -> None:
        git_remote(
            *self.cfg,
            "fetch",
            "--no-tags",
            "--no-write-fetch-head",
            "--quiet",
            *opts,
            "--",
            self.want.url,
            *refspecs,
            cwd=self.repo,
            timeout=self.timeout,
        )

    def incomplete(self) -> list[str]:
        return verify.missing_objects(self.repo, self.want.object_names(), self.timeout)

    def unproven(self) -> list[str]:
        return [
            c
            for c in self.want.commits
            if not git(
                "for-each-ref",
                "--count=1",
                "--format=%(refname)",
                "--contains",
                c,
                *_REACH,
                cwd=self.repo,
                timeout=self.timeout,
            )
        ]

    def done(self) -> bool:
        return not self.incomplete() and not self.unproven()

    def fail(self, e: GitFailed) -> FetchError:
        return _unreachable(self.want, e, self.mirrors, self.timeout)


def _fetch_from_network(repo: Path, want: Wanted, mirrors: Mapping[str, str], timeout: float) -> None:
    """Fetch `want`'s commits by id; fall back to hint refs, then all heads and tags. Then prove each commit is
    reachable from a ref the server has now (hint refs first, then heads and tags). See module docstring."""
    r = _Remote(repo, want, mirrors, timeout)
    _drop_refs(repo, _REACH, timeout)  # the proof is against the server's refs of now, not of an earlier fetch
    _fetch_by_id(r)
    hints = _fetch_hint_refs(r)
    if hints is None:
        return
    tried, absent = hints
    everything = (
        "+refs/heads/*:refs/reprostack/heads/*",
        "+refs/tags/*:refs/reprostack/tags/*",
        *(f"+{ref}:refs/reprostack/hints/{ref.removeprefix('refs/')}" for ref in tried),
    )
    if not r.done():
        try:
            r.fetch((), *everything)
        except GitFailed as e:
            raise r.fail(e) from None
    gone = r.incomplete()
    if gone:
        raise FetchError(_gone_message(want, gone, tried, absent, mirrors))
    if r.unproven() and (repo / "shallow").is_file():
        # an earlier shallow fetch can cut the walk from a ref down to the commit: fetch the refs' full history
        try:
            r.fetch(("--unshallow",), *everything)
        except GitFailed as e:
            raise r.fail(e) from None
    orphans = r.unproven()
    if orphans:
        hints_text = ", ".join(want.hint_refs) or "none in the lock"
        raise FetchError(
            f"{want.label}: commit {', '.join(c[:12] for c in orphans)} is not reachable from any branch "
            f"or tag of {want.url}{_via(want.url, mirrors)}, nor from the hint refs ({hints_text}): a commit "
            f"that only a fork (a shared object store) or a mirror holds is refused. If the upstream "
            f"really has it, add the ref that reaches it to `fetch-refs` (e.g. refs/pull/N/head)."
        )


def _fetch_by_id(r: _Remote) -> None:
    """The exact-SHA shallow fetches: the rev (--depth=1) and the cherry-picks (--depth=2, their parent along) whose
    trees are absent; a server refusing SHA-in-want is no error here (the hint refs come next)."""
    want = r.want
    try:
        absent_now = set(r.incomplete())
        if f"{want.rev}^{{tree}}" in absent_now:
            r.fetch(("--depth=1",), f"+{want.rev}:refs/reprostack/{want.rev}")
        picks = [c for c in want.cherry_picks if {f"{c}^{{tree}}", f"{c}^1^{{tree}}"} & absent_now]
        if picks:
            r.fetch(("--depth=2",), *(f"+{c}:refs/reprostack/{c}" for c in picks))
    except GitFailed as e:
        if e.timed_out or not _REFUSED.search(e.stderr):
            raise r.fail(e) from None


def _fetch_hint_refs(r: _Remote) -> tuple[list[str], list[str]] | None:
    """Each hint ref fetched in full until every commit is there and proven: None when that happened, else (the
    refs fetched, the refs the server does not have)."""
    tried: list[str] = []
    absent: list[str] = []
    for ref in r.want.hint_refs:
        if r.done():
            return None
        try:
            r.fetch((), f"+{ref}:refs/reprostack/hints/{ref.removeprefix('refs/')}")
            tried.append(ref)
        except GitFailed as e:
            if e.timed_out or not _NO_SUCH_REF.search(e.stderr):
                raise r.fail(e) from None
            absent.append(ref)
    return tried, absent


_REACH = ("refs/reprostack/hints/", "refs/reprostack/heads/", "refs/reprostack/tags/")


def _drop_refs(repo: Path, prefixes: Sequence[str], timeout: float) -> None:
    refs = git("for-each-ref", "--format=%(refname)", *prefixes, cwd=repo, timeout=timeout).split()
    if refs:
        git(
            "update-ref",
            "--stdin",
            cwd=repo,
            timeout=timeout,
            input_bytes="".join(f"delete {r}\n" for r in refs).encode(),
        )


def _gone_message(
    want: Wanted, gone: list[str], tried: list[str], absent: list[str], mirrors: Mapping[str, str]
) -> str:
    commits = [c for c in want.commits if any(g.startswith(c) for g in gone)]
    what = ", ".join(c[:12] for c in commits) or ", ".join(gone)
    hints = ", ".join(tried) if tried else "none"
    if absent:
        hints += f"; not on the server: {', '.join(absent)}"
    if not want.hint_refs:
        hints = "none in the lock"
    eff = _effective_url(want.url, mirrors)
    if eff != want.url:  # only the mirror was asked: what the server holds is unknown, and force-pushing is a guess
        return (
            f"{want.label}: the mirror {eff} (REPROSTACK_MIRRORS, for {want.url}) does not hold commit {what}: "
            f"not by id, nor from the hint refs tried ({hints}), nor from any of its branches or tags. It is stale "
            f"or a mirror of another repository: update it from {want.url} (`git fetch` in the mirror), correct "
            f"its entry in REPROSTACK_MIRRORS, or fetch from a bundle that holds the commit."
        )
    return (
        f"{want.label}: commit {what} is gone from the server {want.url}: "
        f"it cannot be fetched by id, nor from the hint refs tried ({hints}), nor from any branch or tag "
        f"(force-pushed and pruned?). Pin a commit the server still has, add a `fetch-refs` hint that "
        f"reaches it, or fetch from a mirror or bundle that still holds it."
    )


def _via(url: str, mirrors: Mapping[str, str]) -> str:
    eff = _effective_url(url, mirrors)
    return f" (via mirror {eff})" if eff != url else ""


def _unreachable(want: Wanted, e: GitFailed, mirrors: Mapping[str, str], timeout: float) -> SourceUnreachable:
    if e.timed_out:
        why = f"git fetch timed out after {timeout:g}s"
    else:
        lines = [ln.strip() for ln in e.stderr.strip().splitlines() if ln.strip()]
        why = " / ".join(lines[:3]) or f"git exit {e.returncode}"
    return SourceUnreachable(
        f"{want.label}: cannot fetch {want.rev[:12]} from {want.url}{_via(want.url, mirrors)}: {why}"
    )


def _check_gitlinks(repo: Path, pin: GitPin, timeout: float) -> None:
    """Each lock submodule must be a gitlink (mode 160000) at its rev in the tree at pin.rev."""
    for sub in pin.submodules:
        entry = git("ls-tree", pin.rev, "--", sub.path, cwd=repo, timeout=timeout)
        fields = entry.split(None, 3)
        if len(fields) < 3 or fields[0] != "160000" or fields[1] != "commit":
            found = entry or "nothing"
            raise FetchError(
                f"{pin.name}: {sub.path} is not a submodule in the tree at {pin.rev[:8]} "
                f"(found {found}); the lock lists it as a submodule at {sub.rev}"
            )
        if fields[2] != sub.rev:
            raise FetchError(
                f"{pin.name}: tree at {pin.rev[:8]} has submodule {sub.path} at {fields[2]}, lock says {sub.rev}"
            )
