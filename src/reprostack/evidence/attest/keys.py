"""Signing keys: the operator's ed25519 file key (private, never in git) and the committed keyring `keys/` (the
public keys of whoever produced committed evidence).

Where the key lives, defined once (`key_path`): `$REPROSTACK_SIGNING_KEY` (a file), else
`<user config dir>/reprostack/signing-key.pem` (platformdirs: `~/.config/reprostack/signing-key.pem` on Linux).
The file is a PEM PKCS#8 ed25519 private key (securesystemslib's `file2:` format), mode 0600. `reprostack keys new`
makes one and writes its public half into the keyring as `keys/<name>-<keyid 12>.pub.json`:

    {"keyid": "<64 hex>", "keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": "<64 hex>"},
     "who": "reprostack session 12 integrator", "added": "2026-12-06"}

Invariants:
- a private key is never overwritten and is written 0600 with O_EXCL (an existing file is one error line);
- a keyring entry is untrusted input: bounded JSON, schema `keyring-key`, its keyid must be the one the key's own
  bytes give (securesystemslib's default keyid: sha256 of its canonical JSON), so an entry cannot claim another
  key's id; a malformed entry is one error line naming the file;
- nothing here signs anything: evidence.attest.envelope does.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ...errors import ReprostackError

KEY_ENV = "REPROSTACK_SIGNING_KEY"
KEYRING_DIR = "keys"
KEY_FILE_NAME = "signing-key.pem"
MAX_KEY_BYTES = 64 << 10
_SLUG = re.compile(r"[^a-z0-9]+")


class KeyError_(ReprostackError):
    """A signing key or a keyring entry cannot be used (one line naming the file)."""


def key_path(environ=None) -> Path:
    """Where the operator's signing key is: $REPROSTACK_SIGNING_KEY, else the user config dir's signing-key.pem."""
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        return Path(env[KEY_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("reprostack")) / KEY_FILE_NAME


def new_key(path: Path):
    """Make an ed25519 key at `path` (0600, never over an existing file). Returns the securesystemslib signer."""
    from securesystemslib.signer import CryptoSigner

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    signer = CryptoSigner.generate_ed25519()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyError_(f"{path}: a key is already there; it is never overwritten (move it away first)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(signer.private_bytes)
    return signer


def load_signer(path: Path):
    """The signer of the key file at `path`. Raises KeyError_ (one line) for a file that is not an ed25519 PEM key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEY_BYTES + 1)
    except OSError as e:
        raise KeyError_(f"{path}: signing key: {e.strerror or e}") from None
    if len(raw) > MAX_KEY_BYTES:
        raise KeyError_(f"{path}: signing key: more than {MAX_KEY_BYTES} bytes, not a key file")
    try:
        key = load_pem_private_key(raw, None)
    except (ValueError, TypeError) as e:
        raise KeyError_(f"{path}: signing key: not an unencrypted PEM PKCS#8 key ({str(e)[:120]})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyError_(f"{path}: signing key: a {type(key).__name__}, not ed25519")
    return CryptoSigner(key)


def configured_signer(environ=None):
    """(signer, None) when a key is configured (the file at key_path exists), else (None, why: 'unsigned: no key
    ...'). A key file named by $REPROSTACK_SIGNING_KEY that does not exist is an error (a typo must not silently
    give unsigned evidence)."""
    env = os.environ if environ is None else environ
    path = key_path(env)
    if not path.exists():
        if env.get(KEY_ENV):
            raise KeyError_(f"{path}: ${KEY_ENV} names no file (make one: reprostack keys new)")
        return None, f"unsigned: no key at {path} (reprostack keys new; or ${KEY_ENV}=FILE)"
    return load_signer(path), None


def public_entry(signer, who: str, added: str | None = None) -> dict:
    """The keyring entry of `signer`'s public key, saying who holds it."""
    d = signer.public_key.to_dict()
    return {
        "keyid": signer.public_key.keyid,
        **d,
        "who": who,
        "added": added or datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }


def entry_name(entry: dict) -> str:
    """`keys/<who slug>-<keyid 12>.pub.json`'s file name."""
    slug = _SLUG.sub("-", entry["who"].lower()).strip("-")[:48] or "key"
    return f"{slug}-{entry['keyid'][:12]}.pub.json"


@dataclass(frozen=True)
class Holder:
    """One public key of the keyring: the securesystemslib key, who holds it, its file."""

    key: object
    who: str
    file: str


class Keyring:
    """The public keys in a keyring folder (default: the project's keys/), by keyid."""

    def __init__(self, holders: dict[str, Holder], folder: Path | None = None):
        self.holders, self.folder = holders, folder

    def __contains__(self, keyid: str) -> bool:
        return keyid in self.holders

    def get(self, keyid: str) -> Holder | None:
        return self.holders.get(keyid)

    @classmethod
    def read(cls, folder: Path) -> Keyring:
        """Every `*.pub.json` of `folder` (none: an empty keyring). Raises KeyError_ for a malformed entry."""
        folder = Path(folder)
        holders: dict[str, Holder] = {}
        if not folder.is_dir():
            return cls(holders, folder)
        for p in sorted(folder.glob("*.pub.json")):
            h = read_entry(p)
            if h.key.keyid in holders:
                raise KeyError_(f"{p}: keyid {h.key.keyid[:12]} is also {holders[h.key.keyid].file}")
            holders[h.key.keyid] = h
        return cls(holders, folder)


def read_entry(p: Path) -> Holder:
    """One keyring file as untrusted input. Raises KeyError_ (one line)."""
    import jsonschema
    from securesystemslib.signer import SSlibKey

    from ... import jsonsrc, schemas

    d = jsonsrc.load(p, KeyError_, max_bytes=MAX_KEY_BYTES)
    try:
        jsonschema.validate(d, schemas.load("keyring-key"))
    except jsonschema.ValidationError as e:
        where = ".".join(str(x) for x in e.absolute_path) or "(top)"
        raise KeyError_(f"{p}: {where}: {' '.join(e.message.split())[:160]}") from None
    body = {k: d[k] for k in ("keytype", "scheme", "keyval")}
    want = keyid_of(body)
    if d["keyid"] != want:
        raise KeyError_(f"{p}: keyid {d['keyid'][:12]}... is not its key's ({want[:12]}...)")
    return Holder(SSlibKey.from_dict(d["keyid"], json.loads(json.dumps(body))), d["who"], p.name)


def keyid_of(body: dict) -> str:
    """securesystemslib's default keyid of a public key dict: the sha256 of its canonical JSON (the rule of
    securesystemslib's SSlibKey.from_crypto, so an entry's id is the one its signatures carry)."""
    import hashlib

    from securesystemslib.formats import encode_canonical

    canon = encode_canonical({"keytype": body["keytype"], "scheme": body["scheme"], "keyval": body["keyval"]})
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()
