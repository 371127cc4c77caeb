"""Where a bump goes: the pin's `policy:` (or `--to REF`) resolved to one commit of the upstream, fetched.

- no policy: the head of the server's default branch (its HEAD symref);
- `{track: branch, ref: refs/heads/X}`: the head of that branch;
- `{track: tag, pattern: GLOB}`: the newest tag whose name (without refs/tags/) matches GLOB, in git's own
  version order (`ls-remote --sort=-version:refname`), peeled to its commit;
- `{track: pr, number: N}`: the head of refs/pull/N/head;
- `--to REF` overrides the policy: a full 40-hex commit id, a full ref (refs/...), or a branch or tag name.
A target that the server does not have is an error naming where it came from (the lock line, or --to).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ..errors import BumpError, LockError
from ..lock import GitPin, Lock, Policy
from .history import History

_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Target:
    """The commit a bump moves to: `rev`, the `ref` it was read from (None for a bare id), `how` in words."""

    rev: str
    ref: str | None
    how: str


def resolve(h: History, lock: Lock, pin: GitPin, to: str | None = None) -> Target:
    """Resolve and fetch (full history) the target of `pin`: `to` when given, else the pin's policy.

    Returns Target(rev, ref, how). Raises LockError (FILE:LINE: upstreams.NAME.policy) when the policy's
    branch, tag or PR is not on the server; BumpError when `to` names nothing there; FetchError when the
    server cannot be reached.
    """
    if to:
        return _explicit(h, pin, to)
    policy = pin.policy or Policy()

    def missing(what: str) -> LockError:
        at = ("upstreams", pin.name, "policy")
        return LockError(
            str(lock.path),
            lock.line_of(at) if pin.policy else lock.line_of(("upstreams", pin.name)),
            "upstreams." + pin.name + (".policy" if pin.policy else ""),
            f"{what} on {h.where()}; nothing was written",
        )

    if policy.track == "tag":
        tags = [
            (r, s)
            for r, s in h.ls_remote(tags=True, sort="-version:refname")
            if fnmatch.fnmatchcase(r.removeprefix("refs/tags/"), policy.pattern or "*")
        ]
        if not tags:
            raise missing(f"no tag matches {policy.pattern!r}")
        ref = tags[0][0]
        return _fetched(h, ref, f"newest tag matching {policy.pattern} ({ref.removeprefix('refs/tags/')})", missing)
    if policy.track == "pr":
        ref = f"refs/pull/{policy.number}/head"
        return _fetched(h, ref, f"PR #{policy.number} head ({ref})", missing)
    if policy.ref:
        return _fetched(h, policy.ref, f"branch {policy.ref}", missing)
    ref = h.default_branch()
    return _fetched(h, ref, f"default branch head ({ref})", missing)


def _fetched(h: History, ref: str, how: str, missing) -> Target:
    rev = h.fetch_ref(ref)
    if rev is None:
        raise missing(f"{ref} is not")
    return Target(rev=rev, ref=ref, how=how)


def _explicit(h: History, pin: GitPin, to: str) -> Target:
    if _SHA.match(to):
        h.ensure_commits([to], pin.hint_refs())
        return Target(rev=to, ref=None, how=f"--to {to}")
    if to.startswith("refs/"):
        rev = h.fetch_ref(to)
        if rev is None:
            raise BumpError(f"{pin.name}: --to {to}: no such ref on {h.where()}; nothing was written")
        return Target(rev=rev, ref=to, how=f"--to {to}")
    found = [
        r for r, _ in h.ls_remote(f"refs/heads/{to}", f"refs/tags/{to}") if r in (f"refs/heads/{to}", f"refs/tags/{to}")
    ]
    if not found:
        raise BumpError(
            f"{pin.name}: --to {to}: neither refs/heads/{to} nor refs/tags/{to} is on {h.where()} "
            f"(a commit must be given as its full 40-hex id); nothing was written"
        )
    if len(found) > 1:
        raise BumpError(f"{pin.name}: --to {to} is ambiguous on {h.where()} ({' and '.join(found)}): give the full ref")
    rev = h.fetch_ref(found[0])
    if rev is None:  # deleted between the listing and the fetch
        raise BumpError(
            f"{pin.name}: --to {to}: {found[0]} disappeared from {h.where()} while fetching; nothing was written"
        )
    return Target(rev=rev, ref=found[0], how=f"--to {to} ({found[0]})")
