"""`reprostack outdated`: per git pin, how many commits and days it is behind its policy target.

commits = `git rev-list --count PINNED..TARGET`; days = whole days between the pinned commit's and the
target's committer dates (0 when the target is not newer). A pin whose target cannot be read gets its
error in the row instead of numbers; the others are still reported.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ReprostackError
from ..lock import GitPin, Lock
from ..sources import FetchOptions
from .history import history
from .policy import resolve


@dataclass(frozen=True)
class Behind:
    """One row: pin, policy (in words), target ref and commit, pinned commit, commits/days behind, or error."""

    pin: str
    policy: str
    pinned: str
    target_ref: str | None = None
    target: str | None = None
    commits: int | None = None
    days: int | None = None
    pinned_date: str | None = None
    target_date: str | None = None
    error: str | None = None


def outdated(lock: Lock, names: list[str], opts: FetchOptions) -> list[Behind]:
    """Rows for the git pins `names` (all git pins when empty), in lock order. Raises LockError for an
    unknown or non-git pin; an unreachable upstream or missing target is an `error` in its row."""
    todo = names or [n for n, p in lock.upstreams.items() if isinstance(p, GitPin)]
    rows = []
    for n in todo:
        pin = lock.git(n)
        policy = pin.policy.describe() if pin.policy else "default branch head"
        try:
            with history(n, pin.url, opts.cache, opts.mirrors or {}, opts.timeout) as h:
                t = resolve(h, lock, pin)
                h.ensure_commits([pin.rev], pin.hint_refs())
                count = int(h.git("rev-list", "--count", f"{pin.rev}..{t.rev}"))
                days = max(0, (h.epoch(t.rev) - h.epoch(pin.rev)) // 86400)
                rows.append(Behind(n, policy, pin.rev, t.ref, t.rev, count, days, h.date(pin.rev), h.date(t.rev)))
        except ReprostackError as e:
            rows.append(Behind(n, policy, pin.rev, error=str(e)))
    return rows


def to_json(rows: list[Behind]) -> str:
    """The rows as a JSON document {"schema_version": 1, "pins": [...]}."""
    return json.dumps({"schema_version": 1, "pins": [asdict(r) for r in rows]}, indent=2) + "\n"


HEADERS = ["pin", "policy", "pinned", "target", "commits", "days"]


def cells(r: Behind) -> list[str]:
    """One row's cells, whole: the target commit with its ref; an error row says its error follows the table."""
    if r.error:
        return [r.pin, r.policy, r.pinned[:12], "error (below)", "-", "-"]
    target = f"{r.target[:12]} ({r.target_ref})" if r.target_ref else r.target[:12]
    return [r.pin, r.policy, r.pinned[:12], target, str(r.commits), str(r.days)]


def plain(rows: list[Behind]) -> str:
    """The table off a terminal: plain fixed-width text, every cell whole (ui.plain_table), no box characters."""
    from ..ui import plain_table

    return "upstreams behind their policy target\n" + plain_table(HEADERS, [cells(r) for r in rows]) + "\n"


def error_line(r: Behind) -> str:
    """`PIN: error: WHY`, the pin named once (the error may already start with it)."""
    why = r.error or ""
    return f"{r.pin}: error: {why.removeprefix(f'{r.pin}: ')}"


def table(rows: list[Behind]):
    """A rich Table of the rows (pin, policy, pinned, target, commits behind, days behind)."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="upstreams behind their policy target")
    for col, just in (
        ("pin", "left"),
        ("policy", "left"),
        ("pinned", "left"),
        ("target", "left"),
        ("commits", "right"),
        ("days", "right"),
    ):
        t.add_column(col, justify=just, overflow="fold")
    for r in rows:
        if r.error:
            t.add_row(r.pin, escape(r.policy), r.pinned[:12], "[red]error (below)[/red]", "-", "-")
        else:
            target = f"{r.target[:12]} ({r.target_ref})" if r.target_ref else r.target[:12]
            t.add_row(r.pin, escape(r.policy), r.pinned[:12], escape(target), str(r.commits), str(r.days))
    return t


def write_json(rows: list[Behind], path: Path) -> Path:
    """Write to_json(rows) to `path` (folders created)."""
    from ..atomicfile import write_text_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, to_json(rows))
