"""Wheels of a `kind: wheelset` (or `kind: wheel`) pin, fetched into the cache and verified by sha256.

Layout under the cache root: `wheels/<sha256>/<filename>`, written atomically (temp file + rename) and only
after its sha256 matched the lock. The cache may sit on a shared disk, so a file there is re-hashed before
every use (as pip --require-hashes re-hashes what it installs); one whose bytes no longer match is removed
and fetched again like a missing one. A filename is used as a path only after `lock.wheel_filename_problem`
found it a bare wheel filename.

Where a missing wheel comes from, in order: a wheelhouse folder (`--wheelhouse`, `$REPROSTACK_WHEELHOUSE`;
a file of the right name whose sha256 differs is an error, never used), then, unless offline, pip itself
(`pip download --no-deps --require-hashes` from the pin's index, pip's config files not read).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import paths
from ..digest import sha256_file
from ..errors import FetchError
from ..lock import Lock, WheelPin, WheelsetPin, wheel_filename_problem
from .cache import Cache

WHEELHOUSE_ENV = "REPROSTACK_WHEELHOUSE"


@dataclass(frozen=True)
class LocalWheel:
    """One verified wheel in the cache: distribution name, version, filename, sha256, path."""

    name: str
    version: str
    filename: str
    sha256: str
    path: Path


def wheelhouses_from_env(environ=None) -> list[Path]:
    """Folders named by $REPROSTACK_WHEELHOUSE (os.pathsep-separated, as the device scripts set it: `A:B`). Every
    reader of the variable takes this list (pip gets one `--find-links` per folder: pip_find_links)."""
    env = os.environ if environ is None else environ
    return [Path(p) for p in env.get(WHEELHOUSE_ENV, "").split(os.pathsep) if p]


def pip_find_links(folders) -> list[str]:
    """pip's arguments to install from `folders` alone: `--no-index --find-links A --find-links B` (one flag per
    folder: pip reads `A:B` as one path that does not exist and ignores it); [] without a folder."""
    out: list[str] = []
    for f in folders:
        out += ["--find-links", str(f)]
    return ["--no-index", *out] if out else []


def _entries(pin) -> list[tuple[str, str, str, str]]:
    if isinstance(pin, WheelsetPin):
        return [(f.name, f.version, f.filename, f.sha256) for f in pin.files]
    return [(pin.name, pin.version, f.filename, f.sha256) for f in pin.files]


def fetch_wheels(
    lock: Lock,
    name: str,
    *,
    cache_root: Path | None = None,
    wheelhouses: Sequence[Path] = (),
    offline: bool = False,
    timeout_s: float = 3600.0,
) -> list[LocalWheel]:
    """Every wheel of pin `name`, verified, in the cache; returns them in the lock's order.
    Raises FetchError naming the pin, the file and where it looked when a wheel is missing (offline) or a
    file's sha256 differs from the lock."""
    pin = lock.get(name)
    if isinstance(pin, (WheelPin, WheelsetPin)) and pin.unresolved:
        raise FetchError(
            f"{lock.where('upstreams', name, 'unresolved')}: unresolved pin {pin.describe()} (sha256 not "
            f"in the lock: run `reprostack lock wheels {name}` {pin.unresolved})"
        )
    if not isinstance(pin, (WheelPin, WheelsetPin)) or not pin.files:
        raise FetchError(f"{lock.where('upstreams', name)}: not a wheel/wheelset pin with files")
    root = Path(cache_root) if cache_root is not None else paths.cache_dir()
    out, missing, bad = [], [], {}
    for i, (dist, version, filename, sha) in enumerate(_entries(pin)):
        problem = wheel_filename_problem(filename)
        if problem:
            raise FetchError(f"{lock.where('upstreams', name, 'files', i, 'filename')}: {problem}")
        dest = root / "wheels" / sha / filename
        if dest.is_file():
            got = sha256_file(dest)
            if got != sha:  # tampered or torn on a shared disk: never used, fetched again
                dest.unlink(missing_ok=True)
                bad[filename] = got
        if not dest.is_file():
            for house in wheelhouses:
                cand = Path(house) / filename
                if cand.is_file():
                    got = _place(cand, dest, sha)  # the copy is hashed, not the wheelhouse file (it can change)
                    if got != sha:
                        raise FetchError(
                            f"{cand}: sha256 {got}, but {lock.where('upstreams', name, 'files')} pins "
                            f"{filename} as {sha}"
                        )
                    break
        if dest.is_file():
            out.append(LocalWheel(dist, version, filename, sha, dest))
        else:
            missing.append((dist, version, filename, sha, dest))
    if missing and offline:
        looked = ", ".join(str(h) for h in wheelhouses) or "no wheelhouse given"
        was_bad = "; ".join(
            f"the cached {f} had sha256 {g} (removed)" for f, g in bad.items() if any(m[2] == f for m in missing)
        )
        raise FetchError(
            f"{lock.where('upstreams', name)}: {len(missing)} wheel(s) not in the cache or a wheelhouse "
            f"({looked}) and --offline forbids downloading: "
            + ", ".join(m[2] for m in missing[:5])
            + (" ..." if len(missing) > 5 else "")
            + (f"; {was_bad}" if was_bad else "")
        )
    if missing:
        _download(lock, name, pin, missing, root, timeout_s)
        out += [LocalWheel(d, v, f, s, p) for d, v, f, s, p in missing]
    order = {e[2]: i for i, e in enumerate(_entries(pin))}
    return sorted(out, key=lambda w: order[w.filename])


def _place(src: Path, dest: Path, sha: str) -> str:
    """Copy `src` to a temp file beside `dest`, hash the copy, and rename it to `dest` only when its sha256 is
    `sha`; returns the copy's sha256. Hashing the copy (not `src`, then copying) leaves no window in which a
    wheelhouse or download file swapped after its check could land in the cache."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        got = sha256_file(Path(tmp))
        if got == sha:
            os.replace(tmp, dest)
        return got
    finally:
        Path(tmp).unlink(missing_ok=True)


def _download(lock: Lock, name: str, pin, missing, root: Path, timeout_s: float) -> None:
    from ..lock.pip import pip_env

    with Cache(root).scratch("wheels-") as tmp:
        req = Path(tmp, "requirements.txt")
        req.write_text("".join(f"{d}=={v} --hash=sha256:{s}\n" for d, v, _, s, _ in missing))
        args = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "-d",
            str(Path(tmp, "dl")),
            "-r",
            str(req),
        ]
        if pin.index:
            args += ["--index-url", pin.index]
        if pin.python_version:
            args += ["--python-version", pin.python_version]
        for tag in getattr(pin, "platform_tags", ()) or getattr(pin, "platforms", ()):
            args += ["--platform", tag]
        try:
            cp = subprocess.run(args, capture_output=True, text=True, env=pip_env(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise FetchError(
                f"{lock.where('upstreams', name)}: pip download did not finish in {timeout_s:.0f}s"
            ) from None
        if cp.returncode != 0:
            tail = "\n  ".join(cp.stderr.strip().splitlines()[-6:])
            raise FetchError(f"{lock.where('upstreams', name)}: pip download failed (exit {cp.returncode}):\n  {tail}")
        for d, v, f, s, dest in missing:
            got_path = Path(tmp, "dl", f)
            if not got_path.is_file() or _place(got_path, dest, s) != s:
                raise FetchError(f"{lock.where('upstreams', name)}: pip download did not give {f} with sha256 {s}")


def main(argv: list[str] | None = None) -> int:
    """`python -m reprostack.fetch.wheels CACHE_ROOT PIN...`: fetch (once) the wheels of the lock's pins into
    CACHE_ROOT/wheels/ (the tests session's install step, before the image tests build offline from there)."""
    from ..errors import ReprostackError
    from ..lock import load

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m reprostack.fetch.wheels CACHE_ROOT PIN...", file=sys.stderr)
        return 2
    try:
        lock = load(Path("upstreams.lock"))
        for name in args[1:]:
            got = fetch_wheels(lock, name, cache_root=Path(args[0]), wheelhouses=wheelhouses_from_env())
            print(f"{name}: {len(got)} wheel(s) in {Path(args[0]) / 'wheels'}")
    except ReprostackError as e:
        print(f"reprostack: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
