"""Run the substrate recipe's rdma-core and libfabric build steps, as the recipe renders them, on a Debian 12 base.

The CUDA base of the substrate needs a registry; these two steps need only a compiler, so they are checked here on
the project's Debian base (reprostack.containers.debianbase: debootstrap from Debian's mirror, `docker import`)
with the build tools included as Debian packages, and the verified trees of pins `rdma-core` and `libfabric`
(`reprostack fetch/patch rdma-core libfabric` first) copied into the context. The build has no network.
One deviation, printed: no CUDA toolkit on this base, so libfabric's `--with-cuda=... --enable-cuda-dlopen` are
dropped. Prints each step's wall time and the build's `fi_info --version`; exit 1 when a step fails.

    DOCKER_HOST=unix:///tmp/rsd-x/docker.sock python scripts/substrate_efa_steps.py [--root .] [--lock upstreams.lock]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from reprostack import lock as lockmod
from reprostack import sources
from reprostack.containers import render as R
from reprostack.containers.context import Context
from reprostack.containers.debianbase import ensure_debian_base
from reprostack.containers.engine import connect, render_recipe
from reprostack.containers.recipe import load_all
from reprostack.fetch import Cache

TAG = "reprostack-test/debian-efa-build:12"
PACKAGES = (
    "python3",
    "cmake",
    "ninja-build",
    "pkg-config",
    "gcc",
    "g++",
    "make",
    "libc6-dev",
    "libnl-3-dev",
    "libnl-route-3-dev",
    "autoconf",
    "automake",
    "libtool",
    "file",
)
NO_CUDA = ("--with-cuda=/usr/local/cuda", "--enable-cuda-dlopen")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    ap.add_argument("--lock", default="upstreams.lock")
    args = ap.parse_args()
    root, lock = Path(args.root), lockmod.load(Path(args.root) / args.lock)
    client = connect()
    t0 = time.monotonic()
    base = ensure_debian_base(client, TAG, packages=PACKAGES)
    print(f"base {TAG} {base} ({time.monotonic() - t0:.0f} s)")
    recipe = load_all(root, ["substrate"])["substrate"]
    text, _, _ = render_recipe(recipe, lock, from_ref=base)
    steps = R.instructions(text)
    first = next(i for i, s in enumerate(steps) if s.keyword == "COPY" and "/opt/reprostack/src/rdma-core" in s.text)
    last = next(i for i, s in enumerate(steps) if s.keyword == "ENV" and "/opt/reprostack/efa/bin" in s.text)
    body = []
    for s in steps[first:last]:
        t = s.text
        for flag in NO_CUDA:
            t = t.replace(f" {flag}", "")
        body.append(t)
    print(f"deviation: libfabric without {' '.join(NO_CUDA)} (no CUDA toolkit on this base)")
    dockerfile = (
        "\n".join(
            [
                f"FROM {base}",
                "RUN mkdir -p /opt/reprostack/src /opt/reprostack/built",
                *body,
                "RUN /opt/reprostack/efa/bin/fi_info --version && ls /opt/reprostack/efa/lib*",
            ]
        )
        + "\n"
    )
    fetch = sources.FetchOptions(
        cache=Cache(Path(os.environ.get("REPROSTACK_CACHE") or Path.home() / ".cache/reprostack")), offline=True
    )
    ctx = Context(0)
    for s in recipe.sources:
        if s.upstream in ("rdma-core", "libfabric"):
            t = sources.prepare(lock, s.upstream, fetch, root)
            ctx.add_git_tree(s.dest, t.path, origin=f"pin {s.upstream} tree {t.tree}")
            print(f"{s.upstream}: {t.pin.original} {t.pin.rev} tree {t.tree}")
    ctx.add_bytes("Dockerfile", dockerfile.encode(), origin="substrate steps")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "ctx.tar"
        ctx.write_tar(tar)
        t_step, name, ok = time.monotonic(), "context", True
        t_build = time.monotonic()
        with open(tar, "rb") as f:
            for ev in client.api.build(
                fileobj=f,
                custom_context=True,
                tag="reprostack-test/substrate-efa-steps:1",
                network_mode="none",
                pull=False,
                rm=True,
                forcerm=True,
                decode=True,
            ):
                line = ev.get("stream", "")
                if line.startswith("Step "):
                    now = time.monotonic()
                    print(f"  {now - t_step:7.1f} s  {name[:110]}")
                    t_step, name = now, line.strip()
                elif "fi_info" in line or "libfabric:" in line or line.startswith("/opt/reprostack/efa/lib"):
                    print("  | " + line.rstrip()[:200])
                if "error" in ev:
                    print(f"FAILED at {name}: {ev['error'].strip()[:2000]}", file=sys.stderr)
                    ok = False
        print(f"  {time.monotonic() - t_step:7.1f} s  {name[:110]}")
        print(f"build {'ok' if ok else 'FAILED'} in {time.monotonic() - t_build:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
