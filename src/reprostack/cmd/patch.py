"""`reprostack patch [PIN...]`: build the patched trees (fetch first) and verify patched-tree (sources.prepare)."""

from __future__ import annotations

from . import add_source_options, fetch_options, git_names, load_lock

HELP = "build the patched trees (fetch first) and verify patched-tree"


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", help="pins (default: every git pin)")
    add_source_options(p)


def run(args) -> int:
    from .. import sources

    lock, root = load_lock(args)
    opts = fetch_options(args)
    for n in git_names(lock, args.names):
        st = sources.prepare(lock, n, opts, root)
        print(f"{n}: {st.path} tree {st.tree} {'(reused)' if st.reused else ''}".rstrip())
    return 0
