"""`reprostack docs [--check]`: write the docs' generated blocks (README.md, docs/stacks.md) from results/
(reprostack.report.docsgen); `--check` writes nothing and exits 1 naming each block that differs.

Exit 0 when the docs are what results/ gives (or were written), 1 with `--check` when a block differs, 2 for a doc
whose markers are broken or a block that cannot be made (one line).

Invariants: the blocks are a pure function of results/ (report.docsgen); only the docs' generated blocks are
written, atomically, and only when they differ.
"""

from __future__ import annotations

HELP = "write the docs' figures from results/ (README result lines, docs/stacks.md tables, the bench table)"
DESCRIPTION = (
    "Every `<!-- generated: NAME -->` block of README.md and docs/stacks.md is made again from results/; --check "
    "writes nothing and fails (1) naming each block that differs (CI runs it)."
)


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a block differs from results/")


def run(args) -> int:
    from .. import paths
    from ..report.docsgen import generate

    root = paths.project_root()
    drift = generate(root, check=args.check)
    for d in drift:
        print(d.line() if args.check else f"docs: wrote {d.path} block `{d.block}`")
    if not drift:
        print("docs: every generated block is what results/ gives")
    return 1 if drift and args.check else 0
