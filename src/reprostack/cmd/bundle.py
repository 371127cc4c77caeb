"""`reprostack bundle -o FILE [PIN...]`: fetched sources in one archive for nodes without network (fetch.bundle)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ReprostackError
from . import add_source_options, fetch_options, git_names, load_lock

HELP = "write fetched sources into one archive for nodes without network"


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*")
    p.add_argument("-o", "--output", required=True, help="archive to write (e.g. out/sources.tar)")
    add_source_options(p)


def run(args) -> int:
    from .. import sources
    from ..fetch import write_bundle

    lock, _ = load_lock(args)
    opts = fetch_options(args)
    if Path(args.output).is_dir():
        raise ReprostackError(f"-o {args.output}: is a folder; name the archive to write (e.g. out/sources.tar)")
    fetched = [sources.fetch(lock.git(n), opts) for n in git_names(lock, args.names)]
    out = write_bundle(fetched, Path(args.output))
    print(f"{out}: {out.stat().st_size} bytes ({', '.join(f.pin.name for f in fetched)})")
    return 0
