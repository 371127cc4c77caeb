"""SeriesError, and how a git failure is worded in the messages of the patch stage."""

from __future__ import annotations

from ..errors import PatchError
from ..gitcmd import GitFailed


class SeriesError(PatchError):
    """A PatchError with the facts as attributes (the message already contains all of them).

    upstream; label ("#3 of 5 cherry-pick 146cc356aa00") and position (1-based) when one entry is at
    fault; upstream_status; files and hunks that failed; expected_tree/actual_tree for a tree mismatch;
    problems: every problem found by the pre-check.
    """

    def __init__(
        self,
        message: str,
        *,
        upstream: str,
        label: str | None = None,
        position: int | None = None,
        upstream_status: str | None = None,
        files: tuple[str, ...] = (),
        hunks: tuple[str, ...] = (),
        expected_tree: str | None = None,
        actual_tree: str | None = None,
        problems: tuple[str, ...] = (),
    ):
        super().__init__(message)
        self.upstream, self.label, self.position, self.upstream_status = upstream, label, position, upstream_status
        self.files, self.hunks = tuple(files), tuple(hunks)
        self.expected_tree, self.actual_tree = expected_tree, actual_tree
        self.problems = tuple(problems)


def git_msg(e: Exception) -> str:
    """One line of what git said (its last 6 non-empty stderr or stdout lines, ` / `-joined) for a GitFailed; else str(e)."""
    if isinstance(e, GitFailed):
        text = (e.stderr.strip() or e.stdout.strip() or str(e)).splitlines()
        return " / ".join(l.strip() for l in text[-6:] if l.strip())
    return str(e)
