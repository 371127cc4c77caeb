"""The kernel cache's one seam to the project's signing (reprostack.evidence, issue 39): an entry's manifest is the
predicate of an in-toto Statement v1 (predicate type PREDICATE_TYPE) whose subjects are the entry's files by sha256,
in a DSSE envelope signed with an ed25519 file key, exactly as a run is attested; `verify` gives the manifest back
only from an envelope that a key of the keyring (keys/) signed.

Invariants: `verify` returns a manifest only when the envelope is well formed, a key of the keyring signed it, its
statement is of PREDICATE_TYPE and its subjects are exactly the manifest's files; everything else raises Unverified
with one line saying which (no signature, a key not in the keyring, a signature that does not verify, malformed).
No signing code of its own: reprostack.evidence signs and verifies.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import evidence
from ..errors import ReprostackError

PREDICATE_TYPE = "https://reprostack.dev/kernel-cache-entry/v1"
MAX_ENVELOPE_BYTES = 4 << 20


class Unverified(ReprostackError):
    """An entry's envelope is not signed by a key of the keyring (the message says how)."""


def _subjects(manifest: dict) -> list[dict]:
    return [{"name": f["path"], "digest": {"sha256": f["sha256"]}} for f in manifest["files"]]


def sign(manifest: dict, key: Path | None) -> bytes:
    """The DSSE envelope (bytes) of `manifest` signed with the private key file `key` (None: the operator's
    configured key, evidence.key_path). Raises ReprostackError (no key, not an ed25519 key)."""
    if key is None:
        signer, why = evidence.configured_signer()
        if signer is None:
            raise ReprostackError(f"kernels push: no signing key: {why}")
    else:
        signer = evidence.load_signer(Path(key))
    st = evidence.statement(_subjects(manifest), manifest, PREDICATE_TYPE)
    return json.dumps(evidence.sign(st, signer), sort_keys=True).encode()


def verify(envelope: bytes, keyring: Path) -> tuple[dict, str]:
    """(manifest, `keyid12 (who)` of the signer) of `envelope` when a key of the keyring folder signed it. Raises
    Unverified."""
    if len(envelope) > MAX_ENVELOPE_BYTES:
        raise Unverified(f"envelope over {MAX_ENVELOPE_BYTES} bytes")
    try:
        env = json.loads(envelope.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Unverified("not a DSSE envelope (not JSON): unsigned") from None
    try:
        ring = evidence.Keyring.read(Path(keyring))
        opened = evidence.open_envelope(env, ring, "envelope")
    except ReprostackError as e:
        raise Unverified(str(e)) from None
    except RecursionError:  # evidence.open_envelope's json.loads of a payload nested too deep (tests/test_fuzz_readers)
        raise Unverified("envelope: its payload is nested too deep to be a statement") from None
    st = opened.statement
    if st.get("predicateType") != PREDICATE_TYPE or not isinstance(st.get("predicate"), dict):
        raise Unverified(f"signed statement is a {str(st.get('predicateType'))[:80]!r}, not a kernel cache entry")
    m = st["predicate"]
    try:
        same = st.get("subject") == _subjects(m)
    except (KeyError, TypeError):
        same = False
    if not same:
        raise Unverified("signed statement's subjects are not its manifest's files")
    return m, f"{opened.keyid[:12]} ({opened.who})"
