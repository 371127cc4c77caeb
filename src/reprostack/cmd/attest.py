"""`reprostack attest DIR`: sign what was added to a signed run folder after its command signed it (the command's
console transcript, `gate ... --out DIR > DIR/cli.log`, complete only once it exited), with the configured key
(reprostack.evidence.attest.keys). The folder's attestation must verify with a key of keys/ and every subject must still
hash to its record; the new statement keeps the predicate and names the added files (`added_after`).

Invariants: nothing is signed when a subject changed, the attestation does not verify, or no key is configured
(one line, exit 2); only `run.intoto.jsonl` is written.

`--re-attest WHY`: an unsigned historical run signed now from what its reports recorded (evidence.attest.runs.re_attest),
marked `re_attested` with the date and WHY; verify-report still judges it at its recorded commit, so a run whose
spec or lock is not its commit's cannot be re-attested into holding.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ReprostackError

HELP = "sign the files added to a signed run folder after its command signed it (its console transcript)"


def add_arguments(p) -> None:
    p.add_argument("folder", metavar="DIR", help="a run folder its command signed (holds run.intoto.jsonl)")
    p.add_argument(
        "--re-attest",
        metavar="WHY",
        default=None,
        help="sign an UNSIGNED run folder now from what its reports recorded, saying so (re_attested: today, WHY); "
        "verify-report then judges it at its recorded commit (or the commit that first added it)",
    )


def run(args) -> int:
    from .. import evidence, paths
    from ..evidence.attest.runs import add_after

    signer, why = evidence.configured_signer()
    if signer is None:
        raise ReprostackError(why)
    from ..evidence.attest.keys import Holder

    if args.re_attest is not None:
        return _re_attest(Path(args.folder), signer, args.re_attest)

    ring = evidence.Keyring.read(paths.project_root() / evidence.KEYRING_DIR)
    own = signer.public_key.keyid
    keyring = evidence.Keyring(
        {own: Holder(signer.public_key, "this operator", "(the configured key)"), **ring.holders}
    )
    path, added = add_after(Path(args.folder), signer, keyring)
    print(f"attested: {path} (key {signer.public_key.keyid[:12]}), added {', '.join(added)}")
    return 0


def _re_attest(folder: Path, signer, why: str) -> int:
    from .. import paths
    from ..evidence.attest.runs import re_attest
    from ..gitcmd import GitFailed, git

    if len(why.strip()) < 10:
        raise ReprostackError(
            "--re-attest WHY: say why this run's recorded facts are the run's (10 characters or more)"
        )
    root = paths.project_root()
    commit = None
    try:
        rel = folder.resolve().relative_to(root).as_posix()
        added = git("log", "--reverse", "--diff-filter=A", "--format=%H", "--", rel, cwd=root).split()
        commit = added[0] if added else None
    except (ValueError, GitFailed, OSError):
        pass
    path = re_attest(folder, signer, why.strip(), commit)
    print(f"re-attested: {path} (key {signer.public_key.keyid[:12]}; recorded commit {str(commit)[:12]})")
    return 0
