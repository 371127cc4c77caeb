"""`reprostack fetch [PIN...]`: fetch pinned sources into the cache and verify commit and tree (sources.fetch)."""

from __future__ import annotations

from . import add_source_options, fetch_options, git_names, load_lock

HELP = "fetch pinned sources into the cache and verify commit and tree"


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", help="pins (default: every git pin)")
    add_source_options(p)


def run(args) -> int:
    from .. import sources

    lock, _ = load_lock(args)
    opts = fetch_options(args)
    for n in git_names(lock, args.names):
        f = sources.fetch(lock.git(n), opts)
        print(f"{n}: {f.pin.rev} tree {f.pin.tree} ok ({len(f.submodules)} submodule(s))")
    return 0
