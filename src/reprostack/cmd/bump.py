"""`reprostack bump UPSTREAM`: move a git pin to a newer upstream revision, replay its series, write the lock, a
branch and the PR body (reprostack.bump)."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import lock as lockmod
from ..errors import ReprostackError
from . import add_source_options, fetch_options, load_lock, lock_path

HELP = "move a git pin to a newer upstream revision, replay its series, write lock + branch + PR body"
DESCRIPTION = (
    "Move pin UPSTREAM to its policy target (or --to REF), replay the patch series "
    "there (kept / refreshed / upstreamed / conflict, zero fuzz), verify, then write "
    "upstreams.lock and refreshed patches and commit them on a new branch. The PR body "
    "goes to --out. Exit 0: bumped or already current; 1: stopped at a conflict (report "
    "written, nothing else); 2: bad input or an error (nothing written)."
)


def add_arguments(p) -> None:
    p.add_argument("upstream", help="the git pin to bump")
    p.add_argument(
        "--to",
        default=None,
        metavar="REF",
        help="target: a 40-hex commit, refs/..., or a branch or tag name (default: the pin's policy)",
    )
    p.add_argument("--branch", default=None, help="branch to commit on (default: bump-<pin>-<new8>)")
    p.add_argument("--no-commit", action="store_true", help="write the lock and patch files only, no branch/commit")
    p.add_argument(
        "--allow-rewind",
        action="store_true",
        help="accept a target that does not descend from the pinned rev (a rewritten upstream)",
    )
    p.add_argument("--out", default="out/bump", help="report folder (default: out/bump)")
    add_source_options(p)


def argv_of(args) -> list[str]:
    """The bump's own arguments as typed (for the PR body's "Produced by")."""
    out = [args.upstream]
    for flag, value in (("--to", args.to), ("--branch", args.branch), ("--lock", args.lock)):
        if value:
            out += [flag, value]
    out += [f for f, on in (("--no-commit", args.no_commit), ("--allow-rewind", args.allow_rewind)) if on]
    return out


def run(args) -> int:
    from ..bump import BumpConflict, plan_bump, write_bump, write_report

    _, root = load_lock(args)  # the selected stack's lock must load before anything is asked of an upstream
    opts = fetch_options(args)
    path = lock_path(args)
    lk = lockmod.load(path)
    if args.upstream in lk.stacks[lk.stack].overrides:  # bump edits upstreams: (the shared pin), not an override
        raise ReprostackError(
            f"{lk.where('upstreams', args.upstream)}: stack {lk.stack} overrides pin "
            f"{args.upstream}; bump moves the shared pin only: edit stacks.{lk.stack}.overrides."
            f"{args.upstream} (rev and tree, checked by `reprostack --stack {lk.stack} fetch "
            f"{args.upstream}`)"
        )
    r = plan_bump(
        path, args.upstream, opts, to=args.to, project_root=root, allow_rewind=args.allow_rewind, args=argv_of(args)
    )
    if r.status == "current":
        print(f"{r.upstream}: already at {r.new_rev} ({r.target.how}); nothing to do")
        return 0
    if r.status == "conflict":
        md = write_report(r, Path(args.out))
        print(f"reprostack: error: {BumpConflict(r)}", file=sys.stderr)
        print(f"report: {md.resolve()}")
        return 1
    from ..history.bumpview import section as history_section

    r.history = history_section(root, r.old_lock_text, r.new_lock_text, r.impact.gates)
    branch = None if args.no_commit else (args.branch or f"bump-{r.upstream}-{r.new_rev[:8]}")
    write_bump(r, branch)
    md = write_report(r, Path(args.out))
    counts = {}
    for o in r.replay.outcomes:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    print(f"{r.title}: " + (", ".join(f"{v} {k}" for k, v in counts.items()) or "no patch series"))
    print(
        f"{r.lock_path}: rev {r.new_rev} tree {r.new_tree}"
        + (f" patched-tree {r.patched_tree}" if r.patched_tree else "")
    )
    for lb in r.left_behind:
        print(lb.line())
    if r.branch:
        print(f"branch: {r.branch} (commit {r.commit})")
    print(f"PR body: {md.resolve()}")
    return 0
