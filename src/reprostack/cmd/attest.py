"""`reprostack attest DIR`: sign what was added to a signed run folder after its command signed it (the command's
console transcript, `gate ... --out DIR > DIR/cli.log`, complete only once it exited), with the configured key
(reprostack.evidence.keys). The folder's attestation must verify with a key of keys/ and every subject must still
hash to its record; the new statement keeps the predicate and names the added files (`added_after`).

Invariants: nothing is signed when a subject changed, the attestation does not verify, or no key is configured
(one line, exit 2); only `run.intoto.jsonl` is written.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ReprostackError

HELP = "sign the files added to a signed run folder after its command signed it (its console transcript)"


def add_arguments(p) -> None:
    p.add_argument("folder", metavar="DIR", help="a run folder its command signed (holds run.intoto.jsonl)")


def run(args) -> int:
    from .. import evidence, paths
    from ..evidence.runs import add_after

    signer, why = evidence.configured_signer()
    if signer is None:
        raise ReprostackError(why)
    from ..evidence.keys import Holder

    ring = evidence.Keyring.read(paths.project_root() / evidence.KEYRING_DIR)
    own = signer.public_key.keyid
    keyring = evidence.Keyring(
        {own: Holder(signer.public_key, "this operator", "(the configured key)"), **ring.holders}
    )
    path, added = add_after(Path(args.folder), signer, keyring)
    print(f"attested: {path} (key {signer.public_key.keyid[:12]}), added {', '.join(added)}")
    return 0
