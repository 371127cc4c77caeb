"""Evidence: where a result is attested, judged, re-derived and verified. One package, by what it does:

- `attest/`: every run folder (a gate run, a bench, an image build) ends with an in-toto Statement v1 in a DSSE
  envelope, signed with the operator's ed25519 file key (statement, envelope, keys, check, runs, log);
- `bars/`: bars and the statistics a value is judged on (stats, baseline bars from accepted runs, ratios, bench
  statistics);
- `judge/`: each gate kind's judge, what its run produced -> checks -> verdict (serving, fabric, megatron);
- `rederive/`: a committed report read back as untrusted input (the shared readers) and each kind's re-derivation
  from the raw logs it keeps (micro, serving, fabric, megatron);
- `kind.py`: `Evidence`, what a gate kind declares as data (`Evidence(from_logs=..., baselines=...)`): the one face
  verify-report and the bump PR body ask, whatever the kind;
- `verify/`: verification, the commands' engines: a report folder held to its logs, bars, provenance and
  signature (`verify-report`: report, trace, tracecheck, signed) and published claims recomputed from AIPerf
  artifacts (`reprostack verify`: claims, html).

The entry points other packages call:

- sign / attest (here, the names below): `attest_folder(folder, predicate, signer)` -> the `run.intoto.jsonl` path,
  `check_folder(folder, keyring)` -> FolderCheck, `attested_folder(start, top)`; keys: `key_path()` (where the
  operator's key lives: $REPROSTACK_SIGNING_KEY, else the user config dir's signing-key.pem), `configured_signer()`,
  `new_key()`, `load_signer()`, `public_entry()`, `Keyring.read(root/keys)`; statements: `subjects(folder)`,
  `run_predicate(...)`, `purpose(kind, how, why)`, `statement(subjects, predicate, predicate_type)` (any in-toto
  Statement v1: a kernel cache entry can use its own predicate type); envelopes: `sign(statement, signer)` -> DSSE
  dict, `write(path, [envelopes])`, `read(path)`, `open_envelope(env, keyring, where)` -> Opened (statement, keyid,
  who), EvidenceError; run folders signed as commands end: `attest.runs`; the log: `attest.log`;
- judge a value against a bar: `bars.stats.summarize(samples)` and `bars.stats.interval_verdict(summary, op,
  threshold)` (report.evaluate / report.evaluate_interval make the Check); a kind's checks: `judge.<kind>`;
- resolve baseline bars: `Gate.evidence.baseline_bars(root, spec)` (kind.Evidence), made by `bars.baseline`;
- re-derive a report: `Gate.evidence.rederive(gate, doc, folder, spec)` -> `rederive.Rederived`; read reports:
  `rederive.load(path)`, `rederive.reports_under(folders)`;
- verify a report folder: `verify.report.verify(path, root=, versions=, corrections=, rederive=)` -> Outcome, with
  `verify.trace.Versions` (provenance) and `verify.signed` (the attestation); claims: `verify.run_verify`.

Layers (reprostack.layers): attest, bars, kind and the rederive readers need no gate and sit low (the gates and the
reports import them); judge and each kind's re-derivation read the kind's parsers and spec and sit with the gates,
which declare them; verify sits with the commands.

Predicate type PREDICATE_TYPE (https://reprostack.dev/run/v1), schema `schemas/run-attestation.schema.json`;
payload type `application/vnd.in-toto+json`. Keyless signing (Sigstore) needs a network: docs/evidence.md says how an
operator with one adds a Sigstore bundle beside the file-key signature.

Invariants: signing happens once per run folder, after the last file of the run is written (the attestation's
subjects are every file there); an attestation file is never among its own subjects; reports, logs and recorded
specs are untrusted input; judging and re-deriving write nothing; a verdict is decided by the judge of a run and
re-decided by verify-report, never by the attestation.
"""

from __future__ import annotations

from pathlib import Path

from .attest.check import FolderCheck, attested_folder, check_folder
from .attest.envelope import EvidenceError, Opened, open_envelope, read, sign, write
from .attest.keys import KEY_ENV, KEYRING_DIR, Keyring, configured_signer, key_path, load_signer, new_key, public_entry
from .attest.statement import NAME, PAYLOAD_TYPE, PREDICATE_TYPE, purpose, run_predicate, statement, subjects

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
