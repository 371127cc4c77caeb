"""The PR body of a bump (Markdown): what moved, what the series became, the lock diff, what to re-run, how.

Pure formatting of a `engine.BumpResult`; nothing here touches git or the network.
"""

from __future__ import annotations

import difflib
import re
import shlex
from datetime import datetime

from .. import runs

_GITHUB = re.compile(r"^https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?$")
HEAD_TAIL = 3  # commits shown at each end of a long log


def web_url(url: str) -> str | None:
    """The repository's web URL when it is on GitHub (compare and commit links), else None."""
    m = _GITHUB.match(url)
    return f"https://github.com/{m.group(1)}/{m.group(2)}" if m else None


def compare_url(url: str, old: str, new: str) -> str | None:
    """`https://github.com/O/R/compare/OLD...NEW` for a GitHub URL, else None."""
    web = web_url(url)
    return f"{web}/compare/{old}...{new}" if web else None


def title(name: str, old: str, new: str, count: int) -> str:
    """`Roll NAME OLD8..NEW8 (N commits)`: the commit and PR title."""
    return f"Roll {name} {old[:8]}..{new[:8]} ({count} commit{'s' if count != 1 else ''})"


def _commit_link(url: str, sha: str, n: int = 8) -> str:
    web = web_url(url)
    return f"[`{sha[:n]}`]({web}/commit/{sha})" if web else f"`{sha[:n]}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _days(a: str, b: str) -> int:
    return int((datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds() // 86400)


def lock_diff(old: str, new: str, path: str = "upstreams.lock") -> str:
    """Unified diff (3 lines of context) between two lock texts."""
    return "".join(
        difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}")
    )


def rerun_lines(imp, upstream: str) -> list[str]:
    """The PR body's "Gates to re-run" lines for a bump.impact.Impact: each gate with its nox session (runs.session:
    `gate nemo-rl` is `nox -s gate_nemo_rl`), the kernels and images to rebuild, what always runs."""
    lines = [f"- gate `{g}`: `nox -s {runs.session(g)}` (GPU)" for g in imp.gates]
    if imp.kernels:
        lines.append(f"- kernels rebuilt by those gates: {', '.join(f'`{k}`' for k in imp.kernels)}")
    lines += [f"- image `{i}`: `nox -s build -- {i}`" for i in imp.images]
    if not lines:
        lines.append(f"No gate, kernel or image of this project uses `{upstream}`.")
    return [*lines, f"- always: `nox -s tests`, `nox -s patch -- {upstream}`"]


def _head(r, n: int) -> list[str]:
    """The title, the conflict notice, what moves (old -> new, commits, days) and the revs and trees."""
    out = [f"## {title(r.upstream, r.old_rev, r.new_rev, n)}\n"]
    if r.status == "conflict":
        c = r.replay.conflict
        out.append(
            f"> **Stopped at a conflict**: {c.label} ({c.entry.upstream_status}) does not apply to the new "
            f"revision with zero fuzz. `upstreams.lock`, `patches/` and the working tree were left as they were; "
            f"no branch was made. Resolve the entry (refresh the patch or re-pin it), then re-run the command below.\n"
        )
    out.append(
        f"`{r.upstream}` ({r.url}) moves from {_commit_link(r.url, r.old_rev)} to {_commit_link(r.url, r.new_rev)}: "
        f"**{n} commit{'s' if n != 1 else ''}**, {r.old_date[:10]} → {r.new_date[:10]} "
        f"({_days(r.old_date, r.new_date)} days of upstream history).\n"
    )
    out.append(f"- target: {r.target.how}")
    cmp = compare_url(r.url, r.old_rev, r.new_rev)
    out.append(f"- compare: {cmp}" if cmp else f"- compare: `git log {r.old_rev[:12]}..{r.new_rev[:12]}` in {r.url}")
    out.append(f"- old: `{r.old_rev}` (tree `{r.old_tree}`)")
    out.append(f"- new: `{r.new_rev}` (tree `{r.new_tree}`)")
    if r.status == "bumped":
        out.append(f"- patched tree: `{r.old_patched_tree or r.old_tree}` → `{r.patched_tree or r.new_tree}`")
    return [*out, ""]


def _commits(r, n: int) -> list[str]:
    """The upstream commits, newest first (the first and last HEAD_TAIL of a long log)."""
    out = [
        f"### Upstream commits ({n}, newest first"
        + (f"; the first and last {HEAD_TAIL} shown)" if n > 2 * HEAD_TAIL else ")")
        + "\n"
    ]
    if n:
        out += ["| commit | date | author | subject |", "|---|---|---|---|"]
        shown = r.commits if n <= 2 * HEAD_TAIL else r.commits[:HEAD_TAIL] + [None] + r.commits[-HEAD_TAIL:]
        for c in shown:
            if c is None:
                out.append(f"| … | | | *{n - 2 * HEAD_TAIL} more* |")
            else:
                out.append(f"| {_commit_link(r.url, c.sha)} | {c.date[:10]} | {_cell(c.author)} | {_cell(c.subject)} |")
        out.append("")
    return out


def _conflict(r) -> list[str]:
    """Where the replay stopped: the entry, its files and hunks, the upstream commits touching them, git's excerpt."""
    c = r.replay.conflict
    out = [f"\n**Conflict** in {c.label}:", f"- files: {', '.join(f'`{f}`' for f in c.files) or '(see detail)'}"]
    out += [f"- hunk: `{h}`" for h in c.hunks]
    if r.conflict_commits:
        out.append(
            "- upstream commits of this range that touch these files: "
            + ", ".join(f"{_commit_link(r.url, k.sha)} {_cell(k.subject)}" for k in r.conflict_commits)
        )
    if c.excerpt:
        fence = "~~~~" if "```" in c.excerpt else "```"
        out += [f"\nThe conflict as git left it:\n\n{fence}diff", c.excerpt, fence]
    return out


def _series(r) -> list[str]:
    """The patch series' entries with their outcome on the new revision, the counts, and a conflict."""
    out = ["### Patch series\n"]
    if not r.replay.outcomes:
        return [*out, "The pin has no patch series.\n"]
    out += ["| # | entry | Upstream-Status | outcome | detail | new tree |", "|---|---|---|---|---|---|"]
    for o in r.replay.outcomes:
        e = o.entry
        what = f"cherry-pick {_commit_link(r.url, e.value, 12)}" if e.kind == "cherry-pick" else f"{e.kind} `{e.value}`"
        if e.description:
            what += f"<br>{_cell(e.description)}"
        out.append(
            f"| {o.position} | {what} | {_cell(e.upstream_status)} | **{o.outcome}** | {_cell(o.detail)} | "
            + (f"`{o.tree[:12]}`" if o.tree else "")
            + " |"
        )
    counts = {
        k: sum(1 for o in r.replay.outcomes if o.outcome == k)
        for k in ("kept", "refreshed", "upstreamed", "conflict", "not-tried")
    }
    out.append("\n" + ", ".join(f"{v} {k}" for k, v in counts.items() if v or k != "not-tried") + ".")
    if r.status == "conflict":
        out += _conflict(r)
    return [*out, ""]


def _submodules(r) -> list[str]:
    """The lock's submodules at the old and new revision, and gitlinks the new revision adds."""
    out = []
    if r.submodules:
        out += ["### Submodules\n", "| path | old | new |", "|---|---|---|"]
        for s in r.submodules:
            moved = "unchanged" if s.old_rev == s.new_rev else _commit_link(s.url, s.new_rev)
            out.append(f"| `{s.path}` | {_commit_link(s.url, s.old_rev)} | {moved} (tree `{s.new_tree[:12]}`) |")
        out.append("")
    if r.new_gitlinks:
        out.append(
            "New gitlinks at the new revision, not pinned in the lock (add them if the build needs them): "
            + ", ".join(f"`{p}` → `{c[:12]}`" for p, c in r.new_gitlinks.items())
            + "\n"
        )
    return out


def _lock(r) -> list[str]:
    """The lock diff, the refreshed patch files and what was verified (a conflict: nothing was written)."""
    out = ["### Lock diff\n"]
    if r.status != "bumped":
        return [*out, "None: nothing was written.", ""]
    out += ["```diff", lock_diff(r.old_lock_text, r.new_lock_text, r.lock_name).rstrip("\n"), "```"]
    out += [f"\nRefreshed patch file: `{p}` (re-exported so that it applies at offset 0)." for p in r.refreshed]
    out.append(
        "\nVerified before anything was written: the new lock validates; `fetch` verified the new rev, tree, "
        "submodules and cherry-picks; the series replayed by the patch stage gives `patched-tree`"
        + (" with every entry at offset 0." if r.replay.remaining else ".")
    )
    return [*out, ""]


def _after(r) -> list[str]:
    """The tied pins left behind, the gates to re-run, the gates' history, and the command that made this body."""
    out = []
    if r.status == "bumped" and getattr(r, "left_behind", None):
        out += [
            "### Pins left behind\n",
            f"Tied to `{r.upstream}` (the same upstream's release), not moved by this bump:\n",
        ]
        out += [f"- `{lb.pin}` ({_cell(lb.what)}): {_cell(lb.why)}. Follow with: {lb.follow}" for lb in r.left_behind]
        out.append("")
    out += ["### Gates to re-run\n", *rerun_lines(r.impact, r.upstream), ""]
    if getattr(r, "history", None):  # the gates' runs before/after, from the results history
        out.append(r.history)
    args = " ".join(shlex.quote(a) for a in r.args)
    return [
        *out,
        "### Produced by\n",
        "```bash",
        f"{r.env_prefix}nox -s bump -- {args}".strip(),
        f"# the same: reprostack bump {args}",
        "```",
    ]


def render(r) -> str:
    """Markdown PR body of the BumpResult `r` (bumped or stopped at a conflict)."""
    n = len(r.commits)
    out = [*_head(r, n), *_commits(r, n), *_series(r), *_submodules(r), *_lock(r), *_after(r)]
    return "\n".join(out).rstrip("\n") + "\n"
