"""The typed, immutable pins of `upstreams.lock` (one dataclass per `kind:`) and the checks of single field values
that every later stage repeats before it trusts a value from the lock (a patch file's path and bytes, a wheel
filename, a submodule path, a ref name).

Invariants:
- a pin is frozen: what lock.model.load typed is what every stage reads, never edited in place;
- `patch_path` never resolves outside `<root>/patches/`; `read_patch_file` returns only bytes whose sha256 is the
  lock's (read once: callers apply these bytes, never the file again);
- the `*_problem` checks return one line saying why a value is refused, or None; they never touch the disk;
- this module imports only the base layer (no lock.model, no stacks): the loader and every stage import it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename


@dataclass(frozen=True)
class Submodule:
    """A submodule pinned at its gitlink commit (the superproject tree is the authority for `rev`)."""

    path: str
    url: str
    rev: str
    tree: str | None = None
    fetch_refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class PatchEntry:
    """One entry of a patch series.

    kind: "cherry-pick" (value: a commit id in the upstream's history or a hint ref), "mbox"
    (a committed `git format-patch` file applied with `git am --keep-cr`) or "diff" (a plain diff
    applied with `git apply`). `tree` is the expected tree after this entry, when pinned.
    """

    kind: str
    value: str
    upstream_status: str
    ref: str | None = None
    description: str | None = None
    tree: str | None = None
    index: int = 0  # 1-based position in the series
    sha256: str | None = None  # mbox/diff: sha256 of the committed file's bytes (required in a lockfile)
    where: str | None = field(default=None, compare=False)  # "FILE:LINE" of the entry's sha256 (or of the entry)

    @property
    def label(self) -> str:
        short = self.value[:12] if self.kind == "cherry-pick" else self.value
        return f"#{self.index} {self.kind} {short}"


@dataclass(frozen=True)
class Policy:
    """Where `reprostack bump` moves a git pin to (the lock's optional `policy:`; absent: the default branch head).

    track: "branch" (`ref`, default the remote's default branch), "tag" (the newest tag, in git's version
    order, whose name matches the glob `pattern`) or "pr" (the head of pull request `number`).
    """

    track: str = "branch"
    ref: str | None = None
    pattern: str | None = None
    number: int | None = None

    def describe(self) -> str:
        """One line for reports: "branch refs/heads/main", "newest tag matching v*", "PR #612 head"."""
        if self.track == "tag":
            return f"newest tag matching {self.pattern}"
        if self.track == "pr":
            return f"PR #{self.number} head"
        return f"branch {self.ref}" if self.ref else "default branch head"


@dataclass(frozen=True)
class GitPin:
    """A git upstream pinned by commit and tree, with its submodules and patch series."""

    name: str
    url: str
    rev: str
    tree: str
    original: str | None = None
    fetch_refs: tuple[str, ...] = ()
    submodules: tuple[Submodule, ...] = ()
    patches: tuple[PatchEntry, ...] = ()
    patched_tree: str | None = None
    kind: str = "git"
    policy: Policy | None = None

    def hint_refs(self) -> tuple[str, ...]:
        """All refs that may carry this pin's commits: `fetch-refs` plus every patch entry's `ref`."""
        refs = list(self.fetch_refs)
        for p in self.patches:
            if p.ref and p.ref not in refs:
                refs.append(p.ref)
        return tuple(refs)


@dataclass(frozen=True)
class WheelFile:
    filename: str
    sha256: str


@dataclass(frozen=True)
class WheelPin:
    """A Python wheel pinned by version and the sha256 of each accepted file (pip --require-hashes)."""

    name: str
    version: str
    files: tuple[WheelFile, ...]
    index: str | None = None
    kind: str = "wheel"
    python_version: str | None = None  # target interpreter of `files` (pip --python-version); None: the running one
    platforms: tuple[str, ...] = ()  # target platform tags (pip --platform), one resolved file each
    unresolved: str | None = None  # why `files` is empty (an explicit `unresolved:` of the lock), else None

    def describe(self) -> str:
        return f"{self.name} {self.version}"


@dataclass(frozen=True)
class WheelsetFile:
    """One distribution of a wheelset: canonical project name, version, wheel file and its sha256."""

    name: str
    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class WheelsetPin:
    """A closed set of wheels for one target interpreter: `requirements` with every dependency pip resolves for
    them, then each `overrides` entry put in place of the distribution of the same name (resolved alone,
    without its dependencies: the campaign's NCCL/NVSHMEM wheels replace the versions torch pins). `files` is the
    whole set, one wheel per distribution, each with its sha256 (installed with pip --require-hashes --no-deps)."""

    name: str
    requirements: tuple[str, ...]
    python_version: str
    platform_tags: tuple[str, ...]
    files: tuple[WheelsetFile, ...]
    overrides: tuple[str, ...] = ()
    index: str | None = None
    installed_on: str | None = (
        None  # a wheelset this one is installed on top of: resolved against it, holds only the rest
    )
    kind: str = "wheelset"
    unresolved: str | None = None  # why `files` is empty (an explicit `unresolved:` of the lock), else None

    def describe(self) -> str:
        return " ".join(self.requirements)

    def file(self, dist: str) -> WheelsetFile | None:
        """The file of distribution `dist` (any spelling of its name), or None."""
        want = canonical_name(dist)
        return next((f for f in self.files if f.name == want), None)


_SEPARATORS = re.compile(r"[-_.]+")


def canonical_name(name: str) -> str:
    """PEP 503 normalized project name: runs of `-_.` become `-`, lower case."""
    return _SEPARATORS.sub("-", name).lower()


@dataclass(frozen=True)
class ImagePin:
    """A container image pinned by its registry manifest digest; `repo:tag` is only where it was resolved from."""

    name: str
    repo: str
    tag: str
    digest: str | None  # sha256:<64 hex>; None only in a lock loaded with allow_unfilled
    kind: str = "image"
    id: str | None = None  # the image id (config digest, linux/amd64) a `docker load`ed copy has, when pinned

    @property
    def ref(self) -> str:
        """`repo:tag@digest` (the pinned reference a Dockerfile FROM takes), `repo:tag` while unfilled."""
        return f"{self.repo}:{self.tag}" + (f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True)
class DebFile:
    """One binary package of a `kind: debs` pin: what the archive's signed Packages index says of it."""

    name: str
    version: str
    arch: str
    filename: str  # pool/... path under the archive (Debian's own layout, checked by lock.debian.POOL_PATH)
    size: int
    sha256: str

    @property
    def basename(self) -> str:
        return self.filename.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DebsPin:
    """A closed set of Debian binary packages (.debs) of one suite, component and architecture: debootstrap's
    `minbase` (every `Priority: required` package and apt) plus `include` with the dependencies debootstrap
    resolves, each pinned by name, version, pool filename, size and sha256 as the archive's Packages index says,
    whose InRelease is signed by a key of `signed_by` (primary key fingerprints, checked with gpgv against
    `keyring`). Filled and checked by `reprostack lock debs` (lock.debs)."""

    name: str
    archive: str
    suite: str
    component: str
    architecture: str
    keyring: str
    signed_by: tuple[str, ...]
    variant: str
    include: tuple[str, ...]
    files: tuple[DebFile, ...]
    kind: str = "debs"
    unresolved: str | None = None

    def describe(self) -> str:
        return f"{self.suite}/{self.component} {self.architecture} {self.variant} + {len(self.include)} included"

    def file(self, name: str) -> DebFile | None:
        return next((f for f in self.files if f.name == name), None)


DOCKER_HUB = "registry-1.docker.io"  # the registry API host of Docker Hub's names (docker.io serves no API)


def split_repo(repo: str) -> tuple[str, str]:
    """`repo` -> (registry host[:port], repository name inside it). Docker Hub's names (`docker.io/x/y`,
    `index.docker.io/x/y`, `x/y`, `ubuntu`) go to its registry API host, DOCKER_HUB; a bare name is `library/`."""
    first, sep, rest = repo.partition("/")
    if first in ("docker.io", "index.docker.io") and sep:  # before the dotted-host rule: docker.io serves no API
        repo = rest
    elif sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DOCKER_HUB, repo if "/" in repo else f"library/{repo}"


_CUDA_BUILD = re.compile(r"-cu(?:da)?\d+x?$")  # nvidia-nccl-cu12, cupy-cuda12x: one library built for one CUDA


def library_family(dist: str) -> str:
    """A distribution's native library without its CUDA build suffix: nvidia-nccl-cu12 and nvidia-nccl-cu13 are both
    `nvidia-nccl`; nvidia-cuda-runtime-cu12 and nvidia-cuda-runtime are both `nvidia-cuda-runtime`."""
    return _CUDA_BUILD.sub("", canonical_name(dist))


class PatchFileError(ValueError):
    """A committed patch file is not the one the lock vouches for (message: what is wrong with it)."""


def patch_path(root: str | Path, value: str) -> Path:
    """The file the lock value `value` (`patches/...`) names under `root`, resolved (symlinks followed).
    Raises PatchFileError when the value has a `..` or empty component, is absolute, or resolves outside
    `<root>/patches/`."""
    parts = value.split("/")
    if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts) or parts[0] != "patches":
        raise PatchFileError(f"{value!r} must be a plain relative path under patches/ (no '..', '.', '//' or '\\')")
    base = (Path(root) / "patches").resolve()
    p = (Path(root) / value).resolve()
    if base not in p.parents:
        raise PatchFileError(f"{value} resolves to {p}, outside {base} (a symlink out of the tree?)")
    return p


def read_patch_file(root: str | Path, entry: PatchEntry) -> bytes:
    """The bytes of `entry`'s committed patch file, after checking them against the entry's sha256.

    Read once: callers apply these bytes (never the file again), so what is applied is what was checked.
    Raises PatchFileError naming the file: path outside patches/, missing or unreadable, no sha256 in the
    entry, or a sha256 other than the lock's (the file changed after the lock was written)."""
    p = patch_path(root, entry.value)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PatchFileError(f"patch file {entry.value} cannot be read under {root}: {e.strerror or e}") from None
    if not entry.sha256:
        raise PatchFileError(
            f"patch file {entry.value} has no sha256 in the lock (add `sha256: "
            f"{hashlib.sha256(data).hexdigest()}` after reviewing it)"
        )
    got = hashlib.sha256(data).hexdigest()
    if got != entry.sha256:
        raise PatchFileError(
            f"patch file {entry.value} has sha256 {got}, the lock pins {entry.sha256}: it changed "
            f"after the lock was written (restore it, or review it and pin the new sha256)"
        )
    return data


def wheel_filename_problem(filename: str) -> str | None:
    """Why `filename` cannot be a wheel file in a folder of ours (a path, `..`, not `NAME-VER-...-PLAT.whl`), or None."""
    if "/" in filename or "\\" in filename or filename in (".", "..") or filename.startswith(".") or "\0" in filename:
        return f"{filename!r} is not a bare file name (no '/', '\\', leading '.')"
    try:
        parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        return f"{filename!r} is not a wheel filename ({e})"
    return None


def submodule_path_problem(path: str) -> str | None:
    """Why `path` cannot be a submodule path inside the superproject (absolute, `..`, `.git`, leading `-`), or None."""
    parts = path.split("/")
    if not path or path.startswith(("/", "-")) or "\\" in path or "\0" in path:
        return f"{path!r} must be a relative path not starting with '-' or '/'"
    if any(p in ("", ".", "..") or p.lower() == ".git" for p in parts):
        return f"{path!r} has a '', '.', '..' or '.git' component: it must stay inside the superproject"
    return None


def ref_problem(ref: str) -> str | None:
    """Why `ref` is not a ref name git accepts (git check-ref-format's rules that the schema's character class
    leaves open), or None: no empty component, none starting with '.' or ending with '.lock', no '..', no
    trailing '/' or '.'."""
    parts = ref.split("/")
    if ".." in ref or ref.endswith(("/", ".")) or any(not p for p in parts):
        return "is not a ref name git accepts ('..', '//', or a trailing '/' or '.')"
    if any(p.startswith(".") or p.endswith(".lock") for p in parts):
        return "is not a ref name git accepts (a component starting with '.' or ending with '.lock')"
    return None
