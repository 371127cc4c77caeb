"""`reprostack docs [--check]`: write the docs' generated blocks (README.md, docs/*.md) from results/, upstreams.lock
and the gate registry (reprostack.report.docsgen; the `history` and `gates` generators are added here, from the layers
above); `--check` writes nothing and exits 1 naming each block that differs.

Exit 0 when the docs are what results/ gives (or were written), 1 with `--check` when a block differs, 2 for a doc
whose markers are broken or a block that cannot be made (one line).

Invariants: the blocks are a pure function of results/ and the gate registry with its specs (report.docsgen); only the docs' generated blocks are
written, atomically, and only when they differ.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..gates.spec import HardwareProfile, Spec

HELP = "write the docs' figures from results/ and the lock (README.md and docs/*.md generated blocks)"
DESCRIPTION = (
    "Every `<!-- generated: NAME -->` block of README.md and docs/*.md is made again from results/ (the git pins: "
    "from upstreams.lock); --check "
    "writes nothing and fails (1) naming each block that differs (CI runs it)."
)


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a block differs from results/")
    p.add_argument(
        "--page",
        action="store_true",
        help="also write the history page results/history/ (its PNGs depend on the matplotlib build: not checked)",
    )


def history_block(root: Path, args: list[str]) -> str:
    """The `history` block: `reprostack history`'s summary of results/ (ingested into a fresh database in a
    temporary folder, so the block depends on results/ alone), in a code block."""
    from ..history import compare, render
    from ..history.command import ingest, scan
    from ..history.store import Store

    with tempfile.TemporaryDirectory(prefix="reprostack-docs-") as d:
        with Store.open(Path(d) / "history.sqlite3") as store:
            files = scan([root / "results"], exclude=root / "results" / "history")
            _, _, _, skipped = ingest(store, files)
            reports, _ = store.count()
            series = compare.analyse(store)
    text = render.short(series, reports, full=False)
    tail = "".join(f"skipped {s}\n" for s in skipped)
    return (
        "```\n$ reprostack history --no-plots --db /tmp/h.sqlite3   # on the committed results/\n"
        + text
        + tail
        + "```\n"
    )


def gates_block(root: Path, args: list[str]) -> str:
    """The `gates` block (docs/architecture.md): one row per gate of the registry (gates.registry.GATES), in its
    order: its number, the name the operator types, its nox session (runs.session), its spec and class, the gates it
    requires on its published profile, that profile, its image and its spec's description."""
    from .. import runs
    from ..gates import profiles, registry

    rows = [
        "| # | gate | nox session | spec | class | requires (published profile) | published profile | image | what |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, g in enumerate(registry.GATES):
        spec: Spec = g.load(root)
        profile: HardwareProfile = profiles.resolve(spec)
        needs = ", ".join(f"`{r}`" for r in g.requirements(root, profile)) or "—"
        cells = [
            str(i),
            f"`{g.name}`",
            f"`{runs.session(g.name)}`",
            f"`gates/{g.stem}.yaml`",
            f"`{type(g).__name__}`",
            needs,
            f"`{profile.name}`",
            f"`{spec.image}`",
            spec.description.replace("|", "\\|"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def write_page(root: Path) -> str:
    """The committed history page (results/history/index.html and its PNGs) from results/; a line saying what."""
    from ..history import compare, render
    from ..history.command import check_page, ingest, scan
    from ..history.store import Store

    out = root / "results" / "history"
    check_page(out)  # never a tables-only page over the committed plots
    with tempfile.TemporaryDirectory(prefix="reprostack-docs-") as d:
        with Store.open(Path(d) / "history.sqlite3") as store:
            ingest(store, scan([root / "results"], exclude=out))
            reports, _ = store.count()
            series = compare.analyse(store)
        render.write(series, out, reports=reports)
    missing = render.plots_missing()
    return f"docs: wrote {out}/index.html" + (f" (tables only: {missing})" if missing else "")


def run(args) -> int:
    from .. import paths
    from ..report.docsgen import generate

    root = paths.project_root()
    drift = generate(root, check=args.check, extra={"history": history_block, "gates": gates_block})
    for d in drift:
        print(d.line() if args.check else f"docs: wrote {d.path} block `{d.block}`")
    if not drift:
        print("docs: every generated block is what results/ gives")
    if args.page and not args.check:
        print(write_page(root))
    return 1 if drift and args.check else 0
