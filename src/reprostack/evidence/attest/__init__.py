"""Attestation: every run folder signed as an in-toto Statement v1 in a DSSE envelope (the face: reprostack.evidence).

- statement: the statement of a folder (`subjects`, `run_predicate`, `purpose`, `statement`) and its schema check;
- envelope: DSSE `sign`, `write`, `read`, `open_envelope` (EvidenceError);
- keys: the operator's ed25519 file key (`key_path`, `configured_signer`, `new_key`) and the keyring (`Keyring`);
- check: a folder against its attestation (`check_folder` -> FolderCheck, `attested_folder`);
- runs: signing a run folder as the commands end (gate, bench, build), with the command line that made it;
- log: results/attestations.jsonl, the append-only hash chain of the committed attestations (`reprostack log`).

Invariants: signing happens once per run folder, after its last file is written; an attestation file is never among
its own subjects; nothing here decides a verdict.
"""
