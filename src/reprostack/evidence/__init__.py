"""Evidence that proves itself: every run folder (a gate run, a bench, an image build) ends with an in-toto
Statement v1 in a DSSE envelope, signed with the operator's ed25519 file key; verify-report checks it first.

The face of the package (everything else imports these names, never a submodule's internals):

- keys: `key_path()` (where the operator's key lives: $REPROSTACK_SIGNING_KEY, else the user config dir's
  signing-key.pem), `configured_signer()`, `new_key()`, `load_signer()`, `public_entry()`, `Keyring.read(root/keys)`;
- statements: `subjects(folder)`, `run_predicate(...)`, `purpose(kind, how, why)`, `statement(subjects, predicate,
  predicate_type)` (any in-toto Statement v1: a kernel cache entry can use its own predicate type);
- envelopes: `sign(statement, signer)` -> DSSE dict, `write(path, [envelopes])`, `read(path)`,
  `open_envelope(env, keyring, where)` -> Opened (statement, keyid, who), EvidenceError;
- run folders: `attest_folder(folder, predicate, signer)` -> the `run.intoto.jsonl` path, `check_folder(folder,
  keyring)` -> FolderCheck, `attested_folder(start, top)`.

Predicate type PREDICATE_TYPE (https://reprostack.dev/run/v1), schema `schemas/run-attestation.schema.json`;
payload type `application/vnd.in-toto+json`. Keyless signing (Sigstore) needs a network: docs/evidence.md says how an
operator with one adds a Sigstore bundle beside the file-key signature.

Invariants: signing happens once per run folder, after the last file of the run is written (the attestation's
subjects are every file there); an attestation file is never among its own subjects; nothing here decides a
verdict: verify-report does, from what this package verified.
"""

from __future__ import annotations

from pathlib import Path

from .check import FolderCheck, attested_folder, check_folder
from .envelope import EvidenceError, Opened, open_envelope, read, sign, write
from .keys import KEY_ENV, KEYRING_DIR, Keyring, configured_signer, key_path, load_signer, new_key, public_entry
from .statement import NAME, PAYLOAD_TYPE, PREDICATE_TYPE, purpose, run_predicate, statement, subjects

__all__ = [
    "KEY_ENV",
    "KEYRING_DIR",
    "NAME",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "EvidenceError",
    "FolderCheck",
    "Keyring",
    "Opened",
    "attest_folder",
    "attested_folder",
    "check_folder",
    "configured_signer",
    "key_path",
    "load_signer",
    "new_key",
    "open_envelope",
    "public_entry",
    "purpose",
    "read",
    "run_predicate",
    "sign",
    "statement",
    "subjects",
    "write",
]


def attest_folder(folder: Path, predicate: dict, signer) -> Path:
    """Sign a run statement of every file of `folder` with `predicate` and write it as `folder/run.intoto.jsonl`.
    Returns its path."""
    folder = Path(folder)
    st = statement(subjects(folder), predicate)
    return write(folder / NAME, [sign(st, signer)])
