"""DSSE envelopes (securesystemslib.dsse) around in-toto Statements: sign one with the operator's key, write it as
one line of a `*.intoto.jsonl` file, read and verify one against the keyring.

Invariants:
- an envelope file is untrusted input: bounded size and lines (jsonsrc), strict UTF-8, no NaN; every problem is one
  EvidenceError line naming the file and line;
- a statement is returned only after its signature verified with a keyring key (threshold 1) and its payload type
  is in-toto's; a run statement is also held to its schema;
- written atomically (atomicfile), one envelope per line.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import ReprostackError
from .statement import PAYLOAD_TYPE, PREDICATE_TYPE, STATEMENT_TYPE, StatementError, validate

MAX_BYTES = 16 << 20
MAX_LINE_BYTES = 16 << 20


class EvidenceError(ReprostackError):
    """An attestation cannot be read or does not verify (one line naming the file)."""


def sign(statement: dict, signer) -> dict:
    """The DSSE envelope (JSON-ready dict) of `statement`, signed by `signer` (a securesystemslib Signer)."""
    from securesystemslib.dsse import Envelope

    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    env = Envelope(payload, PAYLOAD_TYPE, {})
    env.sign(signer)
    return env.to_dict()


def write(path: Path, envelopes: list[dict]) -> Path:
    """Write `envelopes` as JSON Lines at `path` (atomically)."""
    from ...atomicfile import write_text_atomic

    return write_text_atomic(Path(path), "".join(json.dumps(e, sort_keys=True) + "\n" for e in envelopes))


def read(path: Path) -> list[tuple[int, dict]]:
    """(line, envelope dict) of each line of an attestation file. Raises EvidenceError."""
    from ... import jsonsrc

    out = list(jsonsrc.iter_jsonl(Path(path), EvidenceError, max_bytes=MAX_BYTES, max_line_bytes=MAX_LINE_BYTES))
    if not out:
        raise EvidenceError(f"{path}: no envelope in it")
    return out


@dataclass(frozen=True)
class Opened:
    """A verified envelope: its statement, the key that signed it and who holds that key."""

    statement: dict
    keyid: str
    who: str

    @property
    def predicate(self) -> dict:
        return self.statement["predicate"]


def open_envelope(env: dict, keyring, where: str) -> Opened:
    """The statement of envelope `env` once its signature verifies with a key of `keyring` (evidence.attest.keys.Keyring).
    Raises EvidenceError (one line, starting with `where`)."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    if not isinstance(env, dict) or set(env) - {"payload", "payloadType", "signatures"}:
        raise EvidenceError(f"{where}: not a DSSE envelope (payload, payloadType, signatures)")
    if env.get("payloadType") != PAYLOAD_TYPE:
        raise EvidenceError(f"{where}: payloadType {str(env.get('payloadType'))[:60]!r}, not {PAYLOAD_TYPE}")
    sigs = env.get("signatures")
    if not isinstance(sigs, list) or not sigs or not all(isinstance(s, dict) for s in sigs):
        raise EvidenceError(f"{where}: no signature")
    ids = [str(s.get("keyid", "")) for s in sigs]
    keys = [keyring.get(i).key for i in ids if i in keyring]
    if not keys:
        raise EvidenceError(
            f"{where}: signed by key {', '.join(i[:12] for i in ids)}, which is not in the keyring"
            + (f" ({keyring.folder})" if getattr(keyring, "folder", None) else "")
        )
    try:
        e = Envelope.from_dict(json.loads(json.dumps(env)))  # from_dict changes its argument
        verified = e.verify(keys, 1)
    except VerificationError:
        raise EvidenceError(f"{where}: the signature does not verify (the statement was changed after signing)")
    except (KeyError, ValueError, TypeError, binascii.Error) as x:
        raise EvidenceError(f"{where}: not a DSSE envelope ({type(x).__name__}: {str(x)[:120]})") from None
    keyid = next(iter(verified))
    from ... import jsonsrc

    try:
        raw = base64.b64decode(env["payload"], validate=True)
    except (ValueError, binascii.Error):
        raise EvidenceError(f"{where}: its payload is not base64") from None
    st = jsonsrc.loads(raw, f"{where}: payload", EvidenceError)  # bounded depth, no NaN: one line, never a traceback
    if not isinstance(st, dict) or st.get("_type") != STATEMENT_TYPE:
        raise EvidenceError(f"{where}: its payload is not an in-toto Statement v1")
    if st.get("predicateType") == PREDICATE_TYPE:
        try:
            validate(st, where)
        except StatementError as x:
            raise EvidenceError(str(x)) from None
    return Opened(st, keyid, keyring.get(keyid).who)
