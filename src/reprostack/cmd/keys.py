"""`reprostack keys new|show|list`: the operator's signing key (reprostack.evidence.attest.keys: where it lives is defined
there once) and the committed keyring keys/.

- `keys new --who TEXT [--key FILE] [--keyring DIR]`: make an ed25519 key at FILE (default: where runs look for it,
  evidence.key_path()), never over an existing one, and write its public half into the keyring folder (default: the
  project's keys/) with who holds it; commit that file so others can verify what the key signs;
- `keys show [--key FILE]`: the key runs would sign with (its path, how it was chosen, its keyid, and whether the
  keyring holds its public half), or "unsigned: no key";
- `keys list [--keyring DIR]`: the keyring's keys and who holds them.

Invariants: a private key is never printed, never overwritten, never written inside the keyring folder; exit 2
with one line for bad input (a malformed keyring entry, an existing key file).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ReprostackError

HELP = "the operator's signing key and the committed keyring keys/ (new, show, list)"


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="keys_cmd", required=True)
    n = sub.add_parser("new", help="make an ed25519 signing key and put its public half into the keyring")
    n.add_argument("--who", required=True, help="who holds the key (kept in the keyring entry)")
    n.add_argument("--key", default=None, metavar="FILE", help="where to write the private key (default: key_path)")
    n.add_argument("--keyring", default=None, metavar="DIR", help="keyring folder (default: the project's keys/)")
    s = sub.add_parser("show", help="the key runs sign with, or 'unsigned: no key'")
    s.add_argument("--key", default=None, metavar="FILE")
    s.add_argument("--keyring", default=None, metavar="DIR")
    ls = sub.add_parser("list", help="the keyring's keys and who holds them")
    ls.add_argument("--keyring", default=None, metavar="DIR")


def _keyring_dir(args) -> Path:
    from .. import paths
    from ..evidence import KEYRING_DIR

    return Path(args.keyring) if args.keyring else paths.project_root() / KEYRING_DIR


def run(args) -> int:
    from ..atomicfile import write_text_atomic
    from ..evidence import Keyring, configured_signer, key_path, load_signer, new_key, public_entry
    from ..evidence.attest.keys import entry_name

    ring = _keyring_dir(args)
    if args.keys_cmd == "new":
        path = Path(args.key) if args.key else key_path()
        if ring.resolve() in (path.resolve(), *path.resolve().parents):
            raise ReprostackError(f"--key {path}: inside the keyring folder {ring}; a private key never goes there")
        Keyring.read(ring)  # a malformed keyring is one line before anything is written
        signer = new_key(path)
        entry = public_entry(signer, args.who)
        ring.mkdir(parents=True, exist_ok=True)
        pub = write_text_atomic(ring / entry_name(entry), json.dumps(entry, indent=1) + "\n")
        print(f"key {entry['keyid'][:12]}: private {path} (0600, never commit it); public {pub} (commit it)")
        return 0
    keyring = Keyring.read(ring)
    if args.keys_cmd == "list":
        for kid, h in sorted(keyring.holders.items(), key=lambda kv: kv[1].file):
            print(f"{kid[:12]}  {h.who}  ({ring / h.file})")
        print(f"{len(keyring.holders)} key(s) in {ring}")
        return 0
    if args.key:
        signer, why = load_signer(Path(args.key)), None
    else:
        signer, why = configured_signer()
    if signer is None:
        print(why)
        return 0
    kid = signer.public_key.keyid
    held = keyring.get(kid)
    print(
        f"key {kid[:12]} at {Path(args.key) if args.key else key_path()}: "
        + (f"in the keyring as {held.who} ({held.file})" if held else f"NOT in the keyring {ring}")
    )
    return 0
