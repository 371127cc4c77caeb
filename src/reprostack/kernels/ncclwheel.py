"""NCCL from NVIDIA's pinned release wheel instead of a source build, when the lock asks for exactly that release.

Which NCCL (`choose`), first: a stack whose `nccl` pin is itself a wheel (lock override `nccl: {wheel: W}`,
reprostack.lock.stacks) takes NCCL from that wheel ALONE: there is no git source, tree or version.mk of NCCL in that
stack, the recipe's `wheel:` and the rules below do not apply, and `needs_source` is False (the gates prepare no
`nccl` tree). A wheel `nccl` pin without files is the same one-line error as below. Otherwise the recipe
(kernels/nccl.yaml) names a `kind: wheel` pin (`wheel: nccl-wheel`); the wheel is
used (a lock without that pin builds from source) only when the `nccl` git pin is a release with no patch series and the wheel's version equals it:
- the pin has no `patches` (a patch series can only be built from source);
- its `original` is a release tag `vX.Y.Z-N` that it is fetched from (`refs/tags/<original>` in `fetch-refs`), and the
  verified tree's `makefiles/version.mk` says X.Y.Z too (an unreleased rev names no tag, or its version.mk differs);
- the wheel pin's `version` is X.Y.Z.
Anything else builds from the git pin, and the reason is recorded. A recipe that names a pin that is not a wheel pin with files
is an error (one line naming the recipe key).

Unpacking (`unpack`): the wheel is fetched and sha256-checked by `fetch.wheels` (cache, wheelhouse, or pip), then
only its `nvidia/nccl/include/**` and `nvidia/nccl/lib/**` members are written to `<cache>/builds/nccl-<key16>/build/
{include,lib}`, the same layout as a source build, through the same keyed, rename-when-complete step
(build.reuse_or_build). key = sha256 of (wheel sha256, layout version): content-keyed, so DeepEP's build key (which
holds NCCL's key) differs between wheel and source NCCL. The wheel is untrusted: every member name must be a relative
path without `..`, NUL or backslash (any member, extracted or not), and only once; no symlinks; at most 4 GiB unpacked; it must hold
include/nccl.h whose version equals the pin's and lib/libnccl.so.2. Any of these -> one BuildError line naming the
wheel; no prefix is made (the temp dir is removed, the log stays in builds/logs).
"""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import BuildError, LockError
from ..lock import GitPin, Lock, WheelPin
from . import preflight
from .build import Built, reuse_or_build

PREFIX = "nvidia/nccl/"
PARTS = ("include", "lib")
LAYOUT = 1  # bump when the unpacked layout changes (part of the key)
MAX_UNPACKED = 4 << 30  # bytes; the 2.30.4 wheel unpacks to ~248 MB
_RELEASE = re.compile(r"^v(\d+\.\d+\.\d+)-\d+$")


@dataclass(frozen=True)
class Choice:
    """Where NCCL comes from: `kind` "wheel" (then `wheel_pin` names the lock pin) or "source"; `why` in words."""

    kind: str
    why: str
    wheel_pin: str | None = None
    version: str | None = None


def release_of(pin: GitPin) -> str | None:
    """X.Y.Z when `pin` is fetched from its release tag `original` = vX.Y.Z-N, else None."""
    m = _RELEASE.match(pin.original or "")
    return m.group(1) if m and f"refs/tags/{pin.original}" in pin.fetch_refs else None


def pinned_version(lock: Lock, source_pin: str = "nccl") -> str | None:
    """The NCCL version the lock's (stack's) `source_pin` pins: its wheel's version, or the release its git pin is
    fetched from (None: an unreleased rev)."""
    pin = lock.upstreams.get(source_pin)
    if isinstance(pin, WheelPin):
        return pin.version
    return release_of(pin) if isinstance(pin, GitPin) else None


def needs_source(lock: Lock, source_pin: str) -> bool:
    """False when the lock's (stack's) `source_pin` is a wheel pin: NCCL from that wheel alone, no git tree."""
    return not isinstance(lock.upstreams.get(source_pin), WheelPin)


def wheel_alone(lock: Lock, source_pin: str) -> str:
    """The lock pin to fetch for a wheel `source_pin`: the shared wheel pin its stack override names, else itself."""
    st = lock.stacks.get(lock.stack)
    return (st.wheel_of.get(source_pin) if st else None) or source_pin


def choose(
    lock: Lock, source_pin: str, wheel_pin: str | None, src_version: str | None, *, recipe_path: str = ""
) -> Choice:
    """Decide wheel or source build for the NCCL pin `source_pin` (see the module doc). `src_version`: the
    verified tree's version.mk (None when there is no tree: a wheel `source_pin`). Raises BuildError when the wheel
    to use is not a wheel pin with files."""
    own = lock.upstreams.get(source_pin)
    if isinstance(own, WheelPin):  # the stack's NCCL is a wheel: that wheel alone
        name = wheel_alone(lock, source_pin)
        if not own.files or own.unresolved:
            raise BuildError(
                f"{lock.where('upstreams', source_pin)}: {source_pin} is wheel pin {name} without files; "
                f"run `reprostack lock wheels {name}`"
            )
        return Choice(
            "wheel",
            f"stack {lock.stack} pins {source_pin} as wheel {name} ({own.name}=={own.version}) alone; no git source",
            name,
            own.version,
        )
    if not wheel_pin:
        return Choice("source", "the recipe names no wheel")
    try:
        wp = lock.get(wheel_pin)
    except LockError:  # a lock (or stack) without that wheel: build from source
        return Choice("source", f"the lock has no pin {wheel_pin}")
    if not isinstance(wp, WheelPin) or not wp.files or wp.unresolved:
        raise BuildError(f"{recipe_path}: wheel: {wheel_pin!r} is not a `kind: wheel` pin with files in the lock")
    pin = lock.get(source_pin)
    if not isinstance(pin, GitPin):
        return Choice("source", f"{source_pin} is not a git pin")
    if pin.patches:
        return Choice("source", f"{source_pin} has a patch series ({len(pin.patches)} entries)")
    rel = release_of(pin)
    if rel is None:
        return Choice("source", f"{source_pin} is not a release tag (original: {pin.original!r})")
    if rel != src_version:
        return Choice("source", f"{source_pin}: original says {rel}, its version.mk says {src_version}")
    if wp.version != rel:
        return Choice("source", f"wheel {wp.name} {wp.version} is not the pinned release {rel}")
    return Choice(
        "wheel", f"{source_pin} is release {pin.original} with no patch series; {wp.name}=={wp.version}", wheel_pin, rel
    )


def _member_problem(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    if not name or "\\" in name or "\x00" in name or name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "not a relative path"
    if any(p in ("..",) for p in PurePosixPath(name).parts):
        return "a path outside the prefix (..)"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "a symlink"
    return None


def unpack(wheel_path: Path, sha256: str, version: str, cache: Path) -> Built:
    """Unpack the verified wheel at `wheel_path` (sha256 `sha256`, already checked against the lock) into the keyed
    NCCL prefix under `cache` and return it as a Built (reused, no write, when that prefix is complete)."""
    fields = {"component": "nccl", "from": "wheel", "wheel_sha256": sha256, "layout": LAYOUT}
    name = Path(wheel_path).name

    def make(tmp: Path, log: Path) -> dict:
        dest = tmp / "build"
        with open(log, "a") as f:
            f.write(f"unpacking {wheel_path} (sha256 {sha256}) members {PREFIX}{{{','.join(PARTS)}}}/** -> {dest}\n")
        try:
            with zipfile.ZipFile(wheel_path) as z:
                infos = z.infolist()
                seen: set[str] = set()
                for info in infos:
                    why = _member_problem(info)
                    if why:
                        raise BuildError(f"{name}: member {info.filename!r} is {why}; not unpacked")
                    if info.filename in seen:  # which copy wins differs between unzip tools: never guess
                        raise BuildError(f"{name}: member {info.filename!r} is in the wheel twice; not unpacked")
                    seen.add(info.filename)
                wanted = [
                    i for i in infos if not i.is_dir() and any(i.filename.startswith(f"{PREFIX}{p}/") for p in PARTS)
                ]
                if sum(i.file_size for i in wanted) > MAX_UNPACKED:
                    raise BuildError(f"{name}: nvidia/nccl/ would unpack to more than {MAX_UNPACKED >> 30} GiB")
                for info in wanted:
                    out = dest / info.filename[len(PREFIX) :]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as src, open(out, "wb") as w:
                        shutil.copyfileobj(src, w, 1 << 20)
                    if info.filename.startswith(f"{PREFIX}lib/"):
                        out.chmod(0o755)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as e:
            raise BuildError(f"{name}: cannot unpack: {e}") from None
        missing = [p for p in ("include/nccl.h", "lib/libnccl.so.2") if not (dest / p).is_file()]
        if missing:
            raise BuildError(f"{name}: no {PREFIX}{' nor '.join(missing)} in the wheel; not an NCCL wheel")
        got = preflight.nccl_header_version(dest / "include")
        if got != version:
            raise BuildError(f"{name}: its nccl.h says {got}, the lock pins {version}")
        return {
            "version": version,
            "from": "wheel",
            "wheel": name,
            "wheel_sha256": sha256,
            "lib": "build/lib/libnccl.so.2",
            "include": "build/include",
        }

    return reuse_or_build(cache, "nccl", fields, make)
