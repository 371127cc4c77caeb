"""`reprostack verify-report DIR...`: re-derive every gate report under the folders from its raw logs and check its
provenance (reprostack.report.rederive: figures, statistics, bars of the recorded spec, verdict; lock and spec
traced to commits of this repository, report.trace), one line per report.

Exit 0 when every report is verified, 1 when one is not (its line says why), 2 for bad input, one line, nothing
written (a folder that does not exist or holds no gate report, a project that is no git checkout, a malformed
corrections file). `--json FILE` writes every finding.

Invariants: every report, log and the corrections file is untrusted input (report.rederive, report.trace); the only
thing written is `--json FILE` (atomically, once every report was read); nothing runs but read-only git.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ReprostackError

HELP = "re-derive gate reports from their raw logs and trace them to commits (exit 1 when one does not hold)"
DESCRIPTION = (
    "Every <gate>.json under the folders (default: results/): its kept artifacts hash to their records, its "
    "figures and statistics are what its raw logs give, each bar is the one of the gate spec it records by sha256, "
    "its verdict follows from its checks, and its lock and spec are versions some commit of this repository holds "
    "(or results/provenance-corrections.yaml says why not, and its claim holds)."
)


def add_arguments(p) -> None:
    p.add_argument("folders", nargs="*", metavar="DIR", help="folders (or report files) to verify (default: results/)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write every finding as JSON to FILE")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the reports that do not hold")
    p.add_argument(
        "--notes",
        action="store_true",
        help="print each report's notes under it (default: a report that does not hold shows its notes; the "
        "others' notes are counted once each at the end)",
    )


def print_note_counts(outcomes) -> None:
    """What could not be re-derived in reports that hold, each note once with how many reports say it (a report's
    path in a note is left out so that the same note reads alike); `--notes` shows them per report."""
    import re
    from collections import Counter

    counts = Counter(re.sub(r"results/\S+", "REPORT", n) for o in outcomes for n in o.notes)
    if counts:
        print(f"notes ({sum(counts.values())}; per report: --notes):")
        for n, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {k} report(s): {n}")


def run(args) -> int:
    from .. import paths, ui
    from ..gates import registry
    from ..report.rederive import RederiveError, Rederived, reports_under, verify
    from ..report.trace import Versions, read_corrections

    root = paths.project_root()
    folders = [Path(f) for f in args.folders] or [root / "results"]
    for f in folders:
        if not f.exists():
            raise ReprostackError(f"{f}: no such folder or report")
    versions = Versions.read(root)
    corrections = read_corrections(root)

    def rederive(doc, folder, spec):
        try:
            g = registry.gate(str(doc.get("gate")))
        except ReprostackError:
            return Rederived(notes=[f"no gate {doc.get('gate')!r} in this project's registry: nothing re-derived"])
        try:
            return g.rederive(doc, folder, spec)
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
        ) as e:  # a report whose data is not what its kind writes
            raise RederiveError(f"{type(e).__name__}: {str(e)[:200]}") from None

    found = reports_under(folders)
    if not found:  # a CI step over a wrong or emptied folder must not pass with nothing checked
        raise ReprostackError(f"{', '.join(map(str, folders))}: no gate report (<gate>.json with gate, result, checks)")
    outcomes = []
    with ui.step("verify-report", total=len(found), unit="report") as st:
        for p in found:
            outcomes.append(verify(p, root=root, versions=versions, corrections=corrections, rederive=rederive))
            st.advance(1)
    bad = [o for o in outcomes if not o.ok]
    for o in outcomes:
        if o.ok and args.quiet:
            continue
        print(o.line())
        if args.notes or not o.ok:
            for n in o.notes:
                print(f"  note: {n}")
    if not args.notes and not args.quiet:
        print_note_counts([o for o in outcomes if o.ok])
    print(
        f"verify-report: {len(outcomes) - len(bad)} of {len(outcomes)} report(s) hold"
        + (f", {len(bad)} do not" if bad else "")
    )
    if args.json:
        from ..atomicfile import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps([o.to_dict() for o in outcomes], indent=1) + "\n")
    return 1 if bad else 0
