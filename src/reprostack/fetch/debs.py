"""The .debs of a `kind: debs` pin, fetched into the cache and verified by size and sha256 before any use.

Layout under the cache root: `debs/<sha256>/<pool basename>`, written atomically (temp file + rename) and only after
its size and sha256 matched the lock. The cache may sit on a shared disk, so a file there is re-hashed before every
use; one whose bytes no longer match is removed and fetched again like a missing one.

Where a missing .deb comes from, in order: a debhouse folder (`--debhouse DIR`, `$REPROSTACK_DEBHOUSE`: a flat folder
of .debs, e.g. another cache's copies or `apt-get download`'s; a file of the right name with other bytes is an error,
never used), then, unless offline, the pin's archive (`<archive>/<pool filename>`; `$REPROSTACK_DEBIAN_MIRROR`
replaces the archive URL, e.g. a local mirror). Nodes without network get the debs like wheels: a folder carried with
the project (`python -m reprostack.fetch.debs CACHE PIN --house DIR` fills a cache and copies the verified .debs into
DIR; `--debhouse DIR` there).

Invariants: a file name is the pool basename the lock's schema and model checked (`NAME_VERSION_ARCH.deb`, no `/`);
a download is read at most the pinned size + 1 bytes; nothing unverified is ever placed in the cache or returned.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import paths
from ..digest import sha256_file
from ..errors import FetchError
from ..lock import DebsPin, Lock

DEBHOUSE_ENV = "REPROSTACK_DEBHOUSE"
MIRROR_ENV = "REPROSTACK_DEBIAN_MIRROR"
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LocalDeb:
    """One verified .deb in the cache."""

    name: str
    version: str
    arch: str
    filename: str  # pool path
    sha256: str
    size: int
    path: Path


def debhouses_from_env() -> list[Path]:
    return [Path(p) for p in os.environ.get(DEBHOUSE_ENV, "").split(os.pathsep) if p]


def archive_url(pin: DebsPin) -> str:
    """The pin's archive, or $REPROSTACK_DEBIAN_MIRROR when set (a mirror of the same archive)."""
    return (os.environ.get(MIRROR_ENV) or pin.archive).rstrip("/")


def _place(src_stream, dest: Path, sha: str, size: int) -> tuple[str, int]:
    """Copy at most size+1 bytes of `src_stream` to a temp file beside `dest`, hash it, and rename it to `dest` only
    when its sha256 and size are the pinned ones; returns (sha256, bytes) of what was read."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
    h, n = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            while n <= size:
                b = src_stream.read(min(1 << 20, size + 1 - n))
                if not b:
                    break
                h.update(b)
                n += len(b)
                out.write(b)
        got = h.hexdigest()
        if got == sha and n == size:
            os.replace(tmp, dest)
        return got, n
    finally:
        Path(tmp).unlink(missing_ok=True)


def fetch_debs(
    lock: Lock,
    name: str,
    *,
    cache_root: Path | None = None,
    debhouses: Sequence[Path] = (),
    offline: bool = False,
    timeout_s: float = TIMEOUT_S,
    progress=None,
) -> list[LocalDeb]:
    """Every .deb of pin `name`, verified, in the cache, in the lock's order. Raises FetchError naming the pin's
    file entry and where it looked when a .deb is missing (offline), unreachable, or has other bytes."""
    pin = lock.get(name)
    if not isinstance(pin, DebsPin):
        raise FetchError(f"{lock.where('upstreams', name)}: is kind {pin.kind}, not a debs pin")
    if pin.unresolved or not pin.files:
        raise FetchError(
            f"{lock.where('upstreams', name)}: no files pinned yet (run `reprostack lock debs {name}`)"
            + (f": {pin.unresolved}" if pin.unresolved else "")
        )
    root = Path(cache_root) if cache_root is not None else paths.cache_dir()
    base = archive_url(pin)
    out, missing = [], []
    for i, f in enumerate(pin.files):
        where = lock.where("upstreams", name, "files", i)
        dest = root / "debs" / f.sha256 / f.basename
        if dest.is_file() and (dest.stat().st_size != f.size or sha256_file(dest) != f.sha256):
            dest.unlink(missing_ok=True)  # changed on a shared disk: never used, fetched again
        if not dest.is_file():
            for house in debhouses:
                cand = Path(house) / f.basename
                if cand.is_file():
                    with open(cand, "rb") as src:
                        got, n = _place(src, dest, f.sha256, f.size)
                    if not dest.is_file():
                        raise FetchError(
                            f"{cand}: {n} bytes sha256 {got}, but {where} pins {f.basename} as {f.size} bytes "
                            f"sha256 {f.sha256}"
                        )
                    break
        if not dest.is_file():
            if offline:
                missing.append(f.basename)
                continue
            url = f"{base}/{f.filename}"
            try:
                with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout_s) as r:
                    got, n = _place(r, dest, f.sha256, f.size)
            except urllib.error.HTTPError as e:
                raise FetchError(
                    f"{where}: GET {url}: HTTP {e.code} {e.reason} (an archive drops superseded versions: a "
                    f"debhouse or a mirror holding {f.basename} ({REPROSTACK_DEBHOUSE_HINT}))"
                ) from None
            except (OSError, ValueError) as e:
                raise FetchError(f"{where}: GET {url}: {getattr(e, 'reason', None) or e}") from None
            if not dest.is_file():
                raise FetchError(
                    f"{where}: {url} gave {n} bytes sha256 {got}, the lock pins {f.size} bytes sha256 {f.sha256}"
                )
        if progress:
            progress(i + 1, len(pin.files), f.basename)
        out.append(LocalDeb(f.name, f.version, f.arch, f.filename, f.sha256, f.size, dest))
    if missing:
        looked = ", ".join(str(h) for h in debhouses) or "no debhouse given"
        raise FetchError(
            f"{lock.where('upstreams', name)}: {len(missing)} .deb(s) not in the cache or a debhouse ({looked}) and "
            f"--offline forbids downloading: " + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        )
    return out


REPROSTACK_DEBHOUSE_HINT = f"${DEBHOUSE_ENV}, ${MIRROR_ENV}"


def copy_house(debs: Sequence[LocalDeb], dest: Path) -> Path:
    """Copy verified `debs` into the flat folder `dest` (a debhouse to carry to a node without network)."""
    dest.mkdir(parents=True, exist_ok=True)
    for d in debs:
        shutil.copyfile(d.path, dest / Path(d.filename).name)
    return dest


def main(argv: list[str] | None = None) -> int:
    """`python -m reprostack.fetch.debs CACHE_ROOT PIN... [--house DIR]`: fetch (once) the .debs of the lock's debs
    pins into CACHE_ROOT/debs/ (and copy them into a debhouse DIR to carry)."""
    from ..errors import ReprostackError
    from ..lock import load

    args = sys.argv[1:] if argv is None else list(argv)
    house = None
    if "--house" in args:
        i = args.index("--house")
        house = Path(args[i + 1]) if i + 1 < len(args) else None
        del args[i : i + 2]
    if len(args) < 2:
        print("usage: python -m reprostack.fetch.debs CACHE_ROOT PIN... [--house DIR]", file=sys.stderr)
        return 2
    try:
        lock = load(Path("upstreams.lock"))
        for name in args[1:]:
            got = fetch_debs(lock, name, cache_root=Path(args[0]), debhouses=debhouses_from_env())
            print(f"{name}: {len(got)} .deb(s), {sum(d.size for d in got)} bytes in {Path(args[0]) / 'debs'}")
            if house:
                print(f"{name}: copied into {copy_house(got, house)}")
    except ReprostackError as e:
        print(f"reprostack: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
