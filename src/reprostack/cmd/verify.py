"""`reprostack verify DIR...`: recompute the published claims from raw AIPerf artifacts (reprostack.evidence.verify)."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import paths

HELP = "recompute published claims from raw AIPerf artifacts; verify.json + verify.md"
DESCRIPTION = (
    "Recompute every claim of --claims from the AIPerf artifacts under DIR (the first "
    "DIR holding all of a claim's artifacts is used). Exit 0: every claim matched or is "
    "a declared ambiguity; 1: a mismatch; 3: an artifact missing; 2: an artifact or the "
    "claims file could not be read."
)


def add_arguments(p) -> None:
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folder(s) of AIPerf artifacts (<arm>/<cell>/...)")
    p.add_argument("--claims", default=None, help="claims file (default: claims/published.yaml of the project root)")
    p.add_argument("--out", default="out/verify", help="report folder (default: out/verify)")


def run(args) -> int:
    from ..evidence.verify import run_verify

    claims = Path(args.claims) if args.claims else paths.project_root() / "claims" / "published.yaml"
    rc, results, written = run_verify([Path(d) for d in args.dirs], claims, Path(args.out))
    for r in results:
        if r.verdict != "match":
            print(f"{r.claim.id}: {r.verdict.upper()}" + (f" — {r.detail}" if r.detail else ""), file=sys.stderr)
    counts = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    print(f"verify: {len(results)} claims: " + ", ".join(f"{v} {n}" for v, n in counts.items()) + f"; exit {rc}")
    print(f"reports: {Path(args.out).resolve()} ({', '.join(sorted(written))})")
    return rc
