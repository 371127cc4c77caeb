"""`reprostack build [IMAGE...]`: build images from containers/<image>/ on the Docker engine (reprostack.containers)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from ..containers.bundle import load_bundle, save_bundle
from ..containers.push import check_registry, push_images, write_pushed
from ..containers.engine import BuildOptions, build_images, connect, preflight, verify_wheels
from ..containers.recipe import OVERRIDE_ENV, overrides_from_env, parse_overrides
from ..containers.testbase import TEST_BASE, ensure_test_base
from ..fetch.wheels import wheelhouses_from_env
from ..lock import Lock
from ..sources import FetchOptions
from . import add_source_options, fetch_options, load_lock

HELP = "build images from containers/<image>/ on the Docker engine ($DOCKER_HOST)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `build`, then the shared source options (--lock --cache --offline --bundle --mirror)."""
    p.add_argument("images", nargs="*", metavar="IMAGE", help="recipes of containers/ (default: all) and their parents")
    p.add_argument("--out", default="out/build", help="build logs and images.json (default: out/build)")
    p.add_argument("--namespace", default="reprostack", help="tag prefix: NAMESPACE/IMAGE:KEY (default: reprostack)")
    p.add_argument(
        "--base-override",
        action="append",
        default=[],
        metavar="BASE=IMAGE",
        help=f"build on local IMAGE instead of a recipe's BASE (repo:tag, with or without digest); "
        f"also ${OVERRIDE_ENV}=BASE=IMAGE,...",
    )
    p.add_argument(
        "--save",
        metavar="FILE",
        help="after the build, `docker save` the named images (default: all built) into one archive "
        "for nodes without registry access (`reprostack build --load FILE` there)",
    )
    p.add_argument(
        "--push",
        metavar="REGISTRY",
        help="after the build, push the named images (default: all built) to REGISTRY (HOST[:PORT][/PATH]) as "
        "REGISTRY/IMAGE:KEY and read each digest back from the registry; out/build/pushed.json lists them",
    )
    p.add_argument(
        "--load",
        metavar="FILE",
        help="first `docker load` an images archive made with --save (sha256 and image ids checked)",
    )
    p.add_argument(
        "--wheelhouse",
        action="append",
        default=[],
        metavar="DIR",
        help="folder of pinned wheels (checked by sha256) before downloading; also $REPROSTACK_WHEELHOUSE",
    )
    p.add_argument(
        "--test-base",
        action="store_true",
        help=f"first import {TEST_BASE} (busybox from Debian's busybox-static) into the engine",
    )
    add_source_options(p)


def run(args: argparse.Namespace) -> int:
    lock, root = load_lock(args)
    return build(args, lock, root, fetch_options(args))


def build(args: argparse.Namespace, lock: Lock, root: Path, fetch: FetchOptions) -> int:
    """Build `args.images`; print one line per image; 0 when all are built or reused (errors raise)."""
    from ..report import utc_now

    started = utc_now()
    console = Console(stderr=True)
    registry = check_registry(args.push) if args.push is not None else None  # a bad target: before any build
    overrides = overrides_from_env()
    overrides.update(parse_overrides(",".join(args.base_override)))
    recipes, order = preflight(args.images or None, root, lock, overrides)  # recipe / pin errors: before the engine
    wheelhouses = [Path(p) for p in args.wheelhouse] + wheelhouses_from_env()
    verify_wheels(
        recipes, order, lock, cache_root=fetch.cache.root, wheelhouses=wheelhouses, offline=args.offline
    )  # so is a wheel with other bytes than the lock's
    client = connect()
    if args.test_base:
        console.print(f"test base {TEST_BASE}: {ensure_test_base(client)}")
    if args.load:
        for b in load_bundle(client, Path(args.load)):
            print(f"{b.name}: loaded {b.tag} {b.image_id} from {args.load}")
    results = build_images(
        args.images or None,
        BuildOptions(
            root=root,
            lock=lock,
            fetch=fetch,
            out_dir=Path(args.out),
            namespace=args.namespace,
            offline=args.offline,
            base_overrides=overrides,
            client=client,
            console=console,
            wheelhouses=wheelhouses,
        ),
    )
    for r in results:
        print(f"{r.name}: {r.status} {r.tag} {r.image_id} ({r.seconds:.1f} s, context {r.context_bytes} bytes)")
    print(f"summary: {(Path(args.out) / 'images.json').resolve()}")
    wanted = set(args.images) if args.images else {r.name for r in results}
    if registry:
        pushed = push_images(client, [(r.name, r.tag, r.image_id) for r in results if r.name in wanted], registry)
        print(f"pushed: {write_pushed(Path(args.out), pushed).resolve()}")
    if args.save:
        saved = save_bundle(client, [(r.name, r.tag) for r in results if r.name in wanted], Path(args.save))
        print(
            f"{args.save}: {len(saved)} image(s), {sum(b.bytes for b in saved)} bytes "
            f"({', '.join(b.name for b in saved)})"
        )
    print(_attest(Path(args.out), results, root, lock, started))  # the build's folder: logs and images.json
    return 0


def _attest(out: Path, results, root: Path, lock, started: str) -> str:
    """Sign the build's folder (reprostack.evidence.attest.runs.finish_run): `attested: ...` or `unsigned: no key ...`."""
    from .. import project
    from ..digest import sha256_file
    from ..evidence.attest.runs import finish_run
    from ..report import utc_now

    return finish_run(
        out,
        kind="image-build",
        verdict="ok",
        exit_code=0,
        project=project.state(root),
        started=started,
        ended=utc_now(),
        lock_sha256=sha256_file(lock.path) if getattr(lock, "path", None) else None,
        stack=lock.stack,
        images=[{"name": r.name, "id": r.image_id, "digest": None} for r in results],
    )
