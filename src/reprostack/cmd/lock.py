"""`reprostack lock check|wheels|debs|images`: validate the lockfile; fill or check wheel files (lock.wheels), Debian
package sets (`lock debs`: cmd.lockdebs, lock.debs) and image digests (lock.images)."""

from __future__ import annotations

import argparse

from . import load_lock, lock_path, lockdebs

HELP = (
    "validate upstreams.lock; `lock wheels` fills/checks wheel files and sha256 with pip; "
    "`lock debs` fills/checks Debian package sets from the archive's signed index; "
    "`lock images` fills/checks base image digests from the registry"
)


ACTIONS = {
    "check": "validate the lockfile (offline)",
    "wheels": "resolve each wheel pin's files with pip; fill (default) or --check their sha256",
    "debs": "resolve each debs pin from its archive's signed Packages index; fill (default) or --check it",
    "images": "resolve each image pin's repo:tag to its manifest digest; fill (default) or --check it",
}


def add_arguments(p) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=list(ACTIONS),
        help="check: validate the lockfile; wheels: resolve each wheel pin's files with pip and write "
        "their sha256 into the lock (only the `files:` blocks change); debs: resolve each debs pin from its "
        "archive's signed Packages index (only its `files:` block changes); images: resolve each image "
        "pin's repo:tag to its manifest digest (registry API v2) and write it (only `digest:` lines)",
    )
    p.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        help="wheels/debs/images: [PIN...] [--check] (see `lock wheels -h`, `lock debs -h`, `lock images -h`)",
    )
    p.add_argument("--lock", default=None)


def run(args) -> int:
    if args.action is None:  # `reprostack lock` alone: the actions, not argparse's "arguments are required"
        from ..errors import ReprostackError

        raise ReprostackError(
            "lock: name an action: " + "; ".join(f"`lock {a}`: {what}" for a, what in ACTIONS.items())
        )
    if args.action == "debs":
        dargs = lockdebs.parser(args.lock).parse_intermixed_args(args.rest)
        args.lock = dargs.lock
        return lockdebs.run(lock_path(args), dargs.names, dargs.check)
    desc = {
        "wheels": "resolve wheel pins with pip; fill (default) or --check their files",
        "images": "resolve image pins' repo:tag to the registry's manifest digest; fill (default) or --check "
        "their digest",
    }.get(args.action, "validate the lockfile")
    wp = argparse.ArgumentParser(prog=f"reprostack lock {args.action}", description=desc)
    wp.add_argument("--lock", default=args.lock)
    if args.action in ("wheels", "images"):
        wp.add_argument("names", nargs="*", help=f"pins (default: every {args.action[:-1]} pin)")
        wp.add_argument(
            "--check",
            action="store_true",
            help="compare the lock with what the index/registry serves and fail on any difference; write nothing",
        )
    wargs = wp.parse_intermixed_args(args.rest)
    args.lock = wargs.lock
    if args.action in ("wheels", "images"):
        from ..lock import images as lockimages, wheels as lockwheels

        mod = lockwheels if args.action == "wheels" else lockimages
        return mod.run(lock_path(args), wargs.names, wargs.check)
    lock, _ = load_lock(args)
    print(f"{lock.path}: ok ({len(lock.upstreams)} pins, sha256 {lock.sha256})")
    return 0
