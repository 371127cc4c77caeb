"""`reprostack kernels push|pull`: the signed binary kernel cache (kernels.cache).

push: the complete kernel builds of this cache (or the build folders named), each signed (--key) and put into the
store --to (oci://HOST/NAME, file://PATH or a folder). pull: the entries KEY... (or --all) of the store --from,
each checked as a run checks it (signed by a key of the keyring, for this arch, every file's sha256), copied into the
store --to, e.g. a folder a node without a registry runs from ($REPROSTACK_KERNEL_CACHE / --kernel-cache).
Exit 2 when any entry was refused or missing (one line each).
"""

from __future__ import annotations

from pathlib import Path

from .. import paths
from ..errors import ReprostackError
from ..gates import options as gate_options

HELP = "push kernel builds to a signed binary cache (OCI registry or folder), or pull them from one"


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    push = sub.add_parser("push", help="sign builds of this cache and put them into a store")
    push.add_argument("items", nargs="*", metavar="BUILD", help="build folders (default: every complete build)")
    push.add_argument("--to", required=True, metavar="URL", help="the store (oci://HOST/NAME, file://PATH, a folder)")
    push.add_argument(
        "--key",
        default=None,
        metavar="FILE",
        help="the ed25519 key that signs each entry (default: the operator's key, as `reprostack keys` shows it: "
        "$REPROSTACK_SIGNING_KEY, else the user config dir's signing-key.pem)",
    )
    push.add_argument("--cache", default=None, help=f"cache root (default: ${paths.CACHE_ENV} or the user cache)")
    pull = sub.add_parser("pull", help="check entries of a store and copy them into another (e.g. a folder)")
    pull.add_argument("items", nargs="*", metavar="KEY", help="build keys (64 hex)")
    pull.add_argument("--from", dest="source", required=True, metavar="URL", help="the store read")
    pull.add_argument("--to", required=True, metavar="URL", help="the store written (a folder for offline nodes)")
    pull.add_argument("--all", action="store_true", help="every entry the store lists")
    gate_options.add_arguments(pull, ("arch", "kernel_keyring"), help={"arch": "refuse entries for another arch"})


def run(args) -> int:
    from ..kernels import cache as kcache

    if args.action == "push":
        root = Path(args.cache) if args.cache else paths.cache_dir()
        builds = [Path(b) for b in args.items] or kcache.builds(root)
        if not builds:
            raise ReprostackError(f"kernels push: no complete kernel build under {root}/builds")
        for b in builds:
            where, m = kcache.push(b, args.to, Path(args.key) if args.key else None)
            cub = m["cubins"]
            n = sum(len(v) for v in cub["objects"].values())
            print(
                f"{m['component']} {m['key']}: pushed to {where} ({len(m['files'])} files, "
                + (f"{n} cubin(s) listed by cuobjdump)" if cub["tool"] else f"no cubin list: {cub['why']})")
            )
        return 0
    return _pull(args, kcache)


def _pull(args, kcache) -> int:
    from ..kernels.cachestore import StoreRefused, open_store

    keys = list(args.items) or (open_store(args.source).keys() if args.all else [])
    if not keys:
        raise ReprostackError("kernels pull: name the build keys to pull, or --all")
    from ..evidence import KEYRING_DIR

    keyring = Path(args.kernel_keyring) if args.kernel_keyring else paths.project_root() / KEYRING_DIR
    bad = 0
    for key in keys:
        try:
            got = kcache.mirror(args.source, key, args.to, keyring=keyring, arch=args.arch)
        except (kcache.Refused, StoreRefused) as e:
            print(f"{args.source}: {key[:16]}: refused: {e}")
            bad += 1
            continue
        if got is None:
            print(f"{args.source}: {key[:16]}: no such entry")
            bad += 1
            continue
        m, signer, where = got
        print(f"{m['component']} {key}: verified (signed by {signer}, sm_{m['arch']}), copied to {where}")
    return 2 if bad else 0
