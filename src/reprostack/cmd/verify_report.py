"""`reprostack verify-report DIR...`: re-derive every gate report under the folders from its raw logs and check its
provenance (reprostack.evidence.verify.report: figures, statistics, bars of the recorded spec, verdict; lock and spec
traced to commits of this repository, evidence.verify.trace), one line per report.

First, for every report, its run's signature (reprostack.evidence.verify.signed): the attestation of its run folder verifies
with a key of keys/, every subject hashes to its record, no file of the folder is left uncovered, and the report
is judged at its run's own commit; an unsigned report must be the committed bytes and is shown UNSIGNED, never
a plain OK. A `*.json` that cannot be read (not UTF-8, not JSON, a NaN) is a FAIL naming it and why.

Exit 0 when every report is verified, 1 when one is not (its line says why), 2 for bad input, one line, nothing
written (a folder that does not exist or holds no gate report, a project that is no git checkout, a malformed
corrections file). `--json FILE` writes every finding.

Invariants: every report, log and the corrections file is untrusted input (evidence.rederive, evidence.verify.trace); the only
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
    from .. import evidence, paths, ui
    from ..gates import registry
    from ..evidence.verify.signed import SignatureCheck
    from ..evidence.rederive import RederiveError, Rederived, reports_under
    from ..evidence.verify.trace import Versions, read_corrections

    root = paths.project_root()
    folders = [Path(f) for f in args.folders] or [root / "results"]
    for f in folders:
        if not f.exists():
            raise ReprostackError(f"{f}: no such folder or report")
    if args.json and not Path(args.json).resolve().parent.is_dir():  # said before any work, naming the path asked for
        raise ReprostackError(f"--json {args.json}: no such folder {Path(args.json).resolve().parent}")
    versions = Versions.read(root)
    corrections = read_corrections(root)

    def rederive(doc: dict, folder: Path, spec: dict | None):
        try:
            g = registry.gate(str(doc.get("gate")))
        except ReprostackError:
            return Rederived(notes=[f"no gate {doc.get('gate')!r} in this project's registry: nothing re-derived"])
        try:
            return g.evidence.rederive(g, doc, folder, spec)
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
        ) as e:  # a report whose data is not what its kind writes
            raise RederiveError(f"{type(e).__name__}: {str(e)[:200]}") from None

    found = reports_under(folders, damaged=True)  # a damaged report is a FAIL naming why, never passed over
    if not found:  # a CI step over a wrong or emptied folder must not pass with nothing checked
        raise ReprostackError(f"{', '.join(map(str, folders))}: no gate report (<gate>.json with gate, result, checks)")
    keyring = evidence.Keyring.read(root / evidence.KEYRING_DIR)
    signed = SignatureCheck(root, keyring, versions)
    outcomes = []
    with ui.step("verify-report", total=len(found), unit="report") as st:
        for p in found:
            outcomes.append(_one(p, root, versions, corrections, rederive, signed))
            st.advance(1)
    bad = [o for o in outcomes if not o.ok]
    unsigned = [o for o in outcomes if o.ok and o.tag == "UNSIGNED"]
    chain = _log_problems(root, folders)
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
        + (f" ({len(outcomes) - len(bad) - len(unsigned)} signed, {len(unsigned)} UNSIGNED)" if outcomes else "")
        + (f", {len(bad)} do not" if bad else "")
    )
    for p in chain:  # the log of signed runs: a run removed, reordered or re-signed, a signed run not logged
        print(f"FAIL {p}")
    if args.json:
        from ..atomicfile import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps([o.to_dict() for o in outcomes], indent=1) + "\n")
    return 1 if bad or chain else 0


def _log_problems(root: Path, folders: list[Path]) -> list[str]:
    """The hash-chained log's problems (reprostack.evidence.attest.log): its chain and every entry's run, and every signed
    run folder under the verified folders that lies in results/ is logged."""
    from ..evidence.attest import log

    results = (root / "results").resolve()
    seen = []
    for f in folders:
        f = f.resolve()
        if f.is_dir() and (f == results or results in f.parents):
            seen += log.signed_folders(root, f)
    if not seen and not (root / log.LOG).is_file():
        return []
    problems, _ = log.check(root, root / log.LOG, folders_seen=seen)
    return problems


def _one(p: Path, root: Path, versions, corrections, rederive, signed):
    """One report: its signature and subjects first (verify.signed); a run whose attestation does not hold is a FAIL
    on that alone. Then the re-derivation (evidence.verify.report.verify), with the corrections only for an unsigned run."""
    from ..evidence.verify.report import Outcome, verify
    from ..evidence.rederive import RederiveError, load

    try:
        doc = load(p)
    except RederiveError:
        doc = None  # verify() says why, on the report's own line
    facts = signed.facts(p, doc)
    if facts.signed and facts.problems and facts.predicate is None:
        try:
            rel = p.resolve().relative_to(root).as_posix()
        except ValueError:
            rel = str(p)
        o = Outcome(rel, problems=list(facts.problems))
        if isinstance(doc, dict):
            o.gate, o.profile, o.result = str(doc.get("gate")), str(doc.get("profile")), str(doc.get("result"))
        return o
    o = verify(
        p,
        root=root,
        versions=versions,
        corrections=[] if facts.signed else corrections,
        rederive=rederive,
        operator_baseline=facts.operator_baseline,
    )
    o.problems[:0] = facts.problems
    o.tag = facts.tag()
    return o
