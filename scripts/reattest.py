"""Re-attest the committed runs that can be honestly re-attested (issue 39 item 8), with the configured key
($REPROSTACK_SIGNING_KEY: the integrator's), deepest run folder first:

    python3 scripts/reattest.py [--why TEXT] [--dry-run]

For each folder under results/ that holds a gate report and no attestation: `reprostack attest DIR --re-attest WHY`
(signed now from what its reports recorded, marked re_attested with the date), then `reprostack verify-report DIR`;
a folder whose only problem is that the log does not name it yet is kept and logged (`reprostack log add DIR`);
any other problem (its recorded spec or lock is not the one of its commit, a report that does not re-derive) and
its attestation is removed again: that run stays unsigned, and its line says why. `--dry-run` removes every
attestation it made (nothing logged): the lists only. Prints one line per folder and the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

WHY = (
    "re-derived from its raw logs and judged at its recorded commit (or the commit that first added it) by "
    "verify-report before signing; signed after the run, by the integrator"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--why", default=WHY)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    from reprostack import cli, evidence
    from reprostack.evidence.attest import log
    from reprostack.evidence.rederive import reports_under

    root = Path.cwd()
    folders = sorted({p.parent for p in reports_under([root / "results"])}, key=lambda p: (-len(p.parts), p.as_posix()))
    kept, left = [], []
    for f in folders:
        rel = f.relative_to(root).as_posix()
        if evidence.attested_folder(f, root) is not None:
            continue
        if cli.main(["attest", rel, "--re-attest", args.why]) != 0:
            left.append((rel, "attest refused it"))
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli.main(["verify-report", rel])
        bad = [
            ln
            for ln in out.getvalue().splitlines()
            if ln.startswith("FAIL") and f"a signed run not in {log.LOG}" not in ln
        ]
        if bad or args.dry_run:
            (f / evidence.NAME).unlink()
            if bad:
                left.append((rel, bad[0][:300]))
                continue
        kept.append(rel)
        if not args.dry_run:
            cli.main(["log", "add", rel])
    for rel, why in left:
        print(f"stays unsigned: {rel}: {why}")
    print(
        f"reattest: {len(kept)} run folder(s) re-attested{' (dry run)' if args.dry_run else ''}, {len(left)} stay unsigned"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
