"""Bump stage: move a git pin to a newer upstream revision and replay its patch series there.

Modules: `policy` (where to: branch head, newest tag, PR head, --to), `history` (a full-history repo of
the upstream), `upstreamed` (entries the new rev already has: reachable or same patch-id), `replay` (kept /
refreshed / upstreamed / conflict, zero fuzz), `lockedit` (rewrite one pin's block in place), `impact`
(gates, kernels, images to re-run), `prbody` (the PR's Markdown), `engine` (plan, verify, write, commit),
`outdated` (how far each pin is behind its policy target).

Invariants: nothing is written (lock, patch files, branch) unless the whole plan verified; a conflict
writes only its report; every git operation is git itself through `reprostack.gitcmd`.
"""

from .engine import BumpConflict, BumpResult, commit_message, plan_bump, preflight, write_bump, write_report
from .outdated import Behind, outdated

__all__ = [
    "Behind",
    "BumpConflict",
    "BumpResult",
    "commit_message",
    "outdated",
    "plan_bump",
    "preflight",
    "write_bump",
    "write_report",
]
