"""`reprostack lock debs [PIN...] [--check]`: resolve each `kind: debs` pin from its archive's signed Packages index
(reprostack.lock.debs) and fill its `files:` block, or with `--check` only compare; `reprostack lock` hands the
action here."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = (
    "resolve debs pins (debootstrap minbase + include) from the archive's signed InRelease and Packages index; "
    "fill (default) or --check their files (name, version, pool filename, size, sha256 of each .deb)"
)


def parser(lock_default: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reprostack lock debs", description=DESCRIPTION)
    p.add_argument("--lock", default=lock_default)
    p.add_argument("names", nargs="*", help="debs pins (default: every debs pin)")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare the lock with what the archive's signed index says and fail on any difference; write nothing",
    )
    return p


def run(lock_path: Path, names: list[str], check: bool) -> int:
    from ..lock import debs as lockdebs

    return lockdebs.run(lock_path, names, check)
