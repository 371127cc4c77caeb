"""`reprostack build [IMAGE...]`: the CLI side of the image stage (cli.py adds the parser and calls `run`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from ..lock import Lock
from ..sources import FetchOptions
from .engine import BuildOptions, build_images, connect
from .recipe import OVERRIDE_ENV, overrides_from_env, parse_overrides
from .testbase import TEST_BASE, ensure_test_base


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `build` besides the shared source options (--lock --cache --offline --bundle --mirror)."""
    p.add_argument("images", nargs="*", metavar="IMAGE", help="recipes of containers/ (default: all) and their parents")
    p.add_argument("--out", default="out/build", help="build logs and images.json (default: out/build)")
    p.add_argument("--namespace", default="reprostack", help="tag prefix: NAMESPACE/IMAGE:KEY (default: reprostack)")
    p.add_argument("--base-override", action="append", default=[], metavar="BASE=IMAGE",
                   help=f"build on local IMAGE instead of a recipe's BASE (repo:tag, with or without digest); "
                        f"also ${OVERRIDE_ENV}=BASE=IMAGE,...")
    p.add_argument("--test-base", action="store_true",
                   help=f"first import {TEST_BASE} (busybox from Debian's busybox-static) into the engine")


def run(args: argparse.Namespace, lock: Lock, root: Path, fetch: FetchOptions) -> int:
    """Build `args.images`; print one line per image; 0 when all are built or reused (errors raise)."""
    console = Console(stderr=True)
    overrides = overrides_from_env()
    overrides.update(parse_overrides(",".join(args.base_override)))
    client = connect()
    if args.test_base:
        console.print(f"test base {TEST_BASE}: {ensure_test_base(client)}")
    results = build_images(args.images or None, BuildOptions(
        root=root, lock=lock, fetch=fetch, out_dir=Path(args.out), namespace=args.namespace,
        offline=args.offline, base_overrides=overrides, client=client, console=console))
    for r in results:
        print(f"{r.name}: {r.status} {r.tag} {r.image_id} ({r.seconds:.1f} s, context {r.context_bytes} bytes)")
    print(f"summary: {(Path(args.out) / 'images.json').resolve()}")
    return 0
