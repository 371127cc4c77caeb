"""The kernel cache's one seam to the project's signing (issue 39: in-toto / DSSE, ed25519 file keys, a committed
keyring): `sign` turns an entry's manifest into a signed envelope, `verify` gives the manifest back only from an
envelope a key of the keyring signed.

Until issue 39's signing API is merged, there is no signing here (never a second implementation): `sign` refuses,
and `verify` refuses every entry, so every pull is refused and the kernels are built from source. Plugging it in is
this module alone.

Invariants: `verify` returns the payload bytes only when the envelope is well formed, of PAYLOAD_TYPE, and signed by
a key of the keyring; everything else raises Unverified with one line saying which (unsigned, foreign key, bad
signature, malformed).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ReprostackError

PAYLOAD_TYPE = "application/vnd.reprostack.kernel-cache-entry.v1+json"
NOT_YET = "kernel cache signing needs issue 39's signing API (reprostack attest), which is not merged yet"


class Unverified(ReprostackError):
    """An entry's envelope is not signed by a key of the keyring (the message says how)."""


def sign(payload: bytes, key: Path) -> bytes:
    """A DSSE envelope (bytes) of `payload` (PAYLOAD_TYPE) signed with the private key file `key`."""
    raise ReprostackError(NOT_YET)


def verify(envelope: bytes, keyring: Path) -> tuple[bytes, str]:
    """(payload, key id of the signer) of `envelope` when a key of `keyring` signed it. Raises Unverified."""
    raise Unverified(NOT_YET)
