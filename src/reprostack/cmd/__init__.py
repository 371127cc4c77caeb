"""One module per `reprostack` command (cli.COMMANDS is the table): each has HELP (and DESCRIPTION where the
command has one), `add_arguments(parser)` and `run(args) -> int`, and calls the domain code. What several commands
share lives here: the source options (--lock --cache --offline --bundle --mirror --git-timeout), loading the lock,
the fetch options and the default list of git pins.

Invariants:
- a command module parses nothing itself and decides no exit code of a failure: bad input raises ReprostackError
  (cli maps it to exit 2 with one line); run() returns the command's own exit code;
- the lock is loaded (load_lock) before the fetch options are made (fetch_options), so a bad lock is reported
  before a bad --mirror or --cache, in every command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import gitcmd, paths, sources
from .. import lock as lockmod
from ..errors import ReprostackError


def add_source_options(p: argparse.ArgumentParser) -> None:
    """--lock --cache --offline --bundle --mirror --git-timeout: where the pins come from."""
    p.add_argument("--lock", default=None, help="lockfile (default: upstreams.lock of the project root)")
    p.add_argument("--cache", default=None, help=f"cache root (default: ${paths.CACHE_ENV} or the user cache dir)")
    p.add_argument("--offline", action="store_true", help="use only the cache and --bundle archives, never the network")
    p.add_argument(
        "--bundle", action="append", default=[], metavar="FILE", help="source bundle written by `reprostack bundle`"
    )
    p.add_argument(
        "--mirror",
        action="append",
        default=[],
        metavar="URL=PATH",
        help="fetch URL (prefix) from PATH instead (git insteadOf); also $REPROSTACK_MIRRORS",
    )
    p.add_argument(
        "--git-timeout",
        default=None,
        metavar="S",
        help="seconds allowed per git command (default: $REPROSTACK_GIT_TIMEOUT or 600); transient network "
        "failures are retried with backoff",
    )


def lock_path(args) -> Path:
    """--lock, else upstreams.lock of the project root."""
    return Path(args.lock) if args.lock else paths.project_root() / lockmod.LOCKFILE


def load_lock(args) -> tuple[lockmod.Lock, Path]:
    """(the lock of --lock, loaded for the selected stack; the folder holding it: the project root)."""
    path = lock_path(args)
    return lockmod.load(path), path.resolve().parent


def key_values(items: list[str], flag: str, form: str) -> dict[str, str]:
    """`["K=V", ...]` of a repeatable option -> {K: V}; raises ReprostackError naming the option and the item."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ReprostackError(f"{flag} {item!r}: expected {form}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def fetch_options(args) -> sources.FetchOptions:
    """The fetch options of the source options; also points ui's step timings at the cache."""
    mirrors = key_values(args.mirror, "--mirror", "URL=PATH")
    timeout = None
    if args.git_timeout is not None:
        try:
            timeout = gitcmd.parse_timeout(args.git_timeout, "--git-timeout")
        except ValueError as e:
            raise ReprostackError(str(e)) from None
    if args.cache and Path(args.cache).exists() and not Path(args.cache).is_dir():
        raise ReprostackError(f"--cache {args.cache}: exists and is not a folder")
    opts = sources.FetchOptions.make(
        Path(args.cache) if args.cache else None,
        offline=args.offline,
        mirrors=mirrors,
        bundles=args.bundle,
        timeout=timeout,
    )
    from .. import ui

    ui.configure(cache=opts.cache.root)  # the step durations (ETAs) live next to what they time
    return opts


def git_names(lock: lockmod.Lock, names: list[str]) -> list[str]:
    """`names`, else every git pin of the lock's stack."""
    return names or [n for n, p in lock.upstreams.items() if isinstance(p, lockmod.GitPin)]
