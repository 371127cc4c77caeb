"""`reprostack log add DIR...` / `reprostack log check`: the append-only hash-chained log of the signed runs committed
under results/ (reprostack.evidence.attest.log: `results/attestations.jsonl`). `add` appends one entry per signed run
folder (its attestation verified with keys/ first; never one already logged; never onto a broken chain); `check`
says whether the chain holds, every logged run is still there with its attestation, and every signed run under
results/ is logged. verify-report runs the same check over results/.

Exit 0 ok, 1 the log does not hold (each problem one line), 2 bad input (a folder that is not a signed run).
"""

from __future__ import annotations

from pathlib import Path

HELP = "the append-only hash-chained log of signed runs under results/ (add DIR..., check)"


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="log_cmd", required=True)
    a = sub.add_parser("add", help="append signed run folders (under results/) to results/attestations.jsonl")
    a.add_argument("folders", nargs="+", metavar="DIR")
    sub.add_parser("check", help="the chain, every logged run still there, every signed run logged")


def run(args) -> int:
    from .. import evidence, paths
    from ..evidence.attest import log

    root = paths.project_root()
    keyring = evidence.Keyring.read(root / evidence.KEYRING_DIR)
    if args.log_cmd == "add":
        for f in args.folders:
            e = log.append(root, Path(f), keyring)
            print(f"{log.LOG}: #{e['seq']} {e['folder']} ({e['kind']}, {e['verdict']})")
        return 0
    problems, entries = log.check(root, root / log.LOG, folders_seen=log.signed_folders(root, root / "results"))
    for p in problems:
        print(p)
    print(
        f"{log.LOG}: {len(entries)} entr(y/ies)"
        + (f", {len(problems)} problem(s)" if problems else ", the chain holds")
    )
    return 1 if problems else 0
