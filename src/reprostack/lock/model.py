"""Load and validate `upstreams.lock` into typed, immutable pins.

Invariants (checked here, relied on by every later stage):
- every git pin is a 40-hex commit id plus its 40-hex tree hash; a ref (`refs/...`) is only a hint of
  where that commit can be fetched from, never what is built;
- a patch series names each entry by commit id (cherry-pick) or by a committed file under `patches/`
  with the sha256 of its bytes (`read_patch_file` checks it: here at load, and again by every stage
  before it uses the file); a series always comes with the `patched-tree` it must produce;
- paths taken from the lock never leave their folder: a submodule path is relative, without `..`,
  `.git` or a leading `-`; a patch file resolves under `<root>/patches/`; a wheel filename is a bare
  file name that parses as a wheel filename (PEP 427);
- every URL passes `gitcmd.url_problem` (https/ssh/git/file, `host:path` or an absolute path; never a
  leading `-`, a transport helper `X::`, whitespace or control characters);
- unknown keys, duplicate keys and wrong types are errors that name `FILE:LINE: field`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from .. import schemas
from ..errors import LockError
from ..gitcmd import url_problem
from ..yamlsrc import compose, dotted as _dotted, line_of as _line, read_bytes, validate
from . import stacks as lockstacks

LOCKFILE = "upstreams.lock"


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


@dataclass(frozen=True)
class Lock:
    """The whole lockfile. `sha256` is of the file's bytes and goes into every report's provenance."""

    path: Path
    sha256: str
    upstreams: dict[str, GitPin | WheelPin | WheelsetPin | ImagePin | DebsPin] = field(default_factory=dict)
    lines: dict[tuple, int] = field(default_factory=dict, repr=False, compare=False)
    # the stack these `upstreams` are (lockstacks: the shared pins with its overrides merged in) and every stack
    stack: str = lockstacks.DEFAULT
    stacks: dict[str, lockstacks.Stack] = field(default_factory=dict, repr=False, compare=False)

    @property
    def env(self) -> dict[str, str]:
        """The selected stack's env (empty for a stack without one)."""
        st = self.stacks.get(self.stack)
        return dict(st.env) if st else {}

    def get(self, name: str) -> GitPin | WheelPin | WheelsetPin | ImagePin | DebsPin:
        """Return the pin named `name`; raises LockError naming the known pins when absent."""
        if name not in self.upstreams:
            known = ", ".join(sorted(self.upstreams))
            raise LockError(str(self.path), None, f"upstreams.{name}", f"no such pin (known: {known})")
        return self.upstreams[name]

    def git(self, name: str) -> GitPin:
        pin = self.get(name)
        if not isinstance(pin, GitPin):
            raise LockError(
                str(self.path),
                self.line_of(("upstreams", name)),
                f"upstreams.{name}",
                f"is kind {pin.kind}, a git pin is needed here",
            )
        return pin

    def line_of(self, path: tuple) -> int | None:
        """Line (1-based) of the YAML node at `path` (keys and list indices), or its nearest parent."""
        return _line(self.lines, path)

    def where(self, *path) -> str:
        """`FILE:LINE: field` (or `FILE: field`) of the node at `path`, e.g. ("upstreams", "aiperf", "files")."""
        line = self.line_of(path)
        return f"{self.path}:{line}: {_dotted(path)}" if line else f"{self.path}: {_dotted(path)}"


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


def _schema() -> dict:
    return schemas.load("lock")


def load(
    path: str | Path = LOCKFILE,
    root: str | Path | None = None,
    *,
    allow_unfilled: bool = False,
    stack: str | None = None,
) -> Lock:
    """Read, validate and type `path`.

    root: project root against which `patches/...` files are checked (default: the lockfile's folder).
    Returns a Lock. Raises LockError naming `FILE:LINE: field` for the first problem found: YAML syntax,
    duplicate keys, unknown keys, a non-immutable pin, a missing patch file, a submodule or patch
    series inconsistent with itself.
    allow_unfilled: accept wheel, wheelset and debs pins without `files` and image pins without `digest` (only
    `reprostack lock wheels` / `lock debs` / `lock images`, which fill them).
    stack: the stack whose pins `upstreams` holds (default: lockstacks.selected(), i.e. `--stack`, else "campaign");
    every stack's overrides are validated on every load, like the shared pins.
    """
    path = Path(path)
    root = Path(root) if root is not None else path.resolve().parent
    try:
        raw = read_bytes(path, LockError)  # at most yamlsrc.MAX_BYTES + 1
    except OSError as e:
        raise LockError(str(path), None, "(file)", e.strerror or str(e)) from None
    data, lines = compose(raw, str(path), LockError)  # bounded: size, depth, aliases, UTF-8
    schema = _schema()
    if allow_unfilled:
        schema["$defs"]["wheel"]["else"] = {}
        schema["$defs"]["image"]["required"].remove("digest")
        schema["$defs"]["wheelset"]["else"] = {}
        schema["$defs"]["debs"]["else"] = {}
    ups = data.get("upstreams") if isinstance(data, dict) else None
    for name, u in ups.items() if isinstance(ups, dict) else ():
        if isinstance(u, dict) and "unresolved" in u and "files" in u:
            at = ("upstreams", name, "unresolved")
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                "a pin with `files` is resolved: drop `unresolved` (`lock wheels` does when it fills)",
            )
    validate(data, lines, schema, str(path), LockError)
    _check_refs(data, path, lines)

    want = stack or lockstacks.selected()
    if not isinstance(data, dict):  # not reached: the schema above wants a mapping
        raise LockError(str(path), None, "(file)", "the lock is not a mapping")
    shared = _type_pins(data["upstreams"], path, root, lines, strict=not allow_unfilled)
    stacks: dict[str, lockstacks.Stack] = {}
    chosen = None
    for sname in lockstacks.names(data):  # every stack validates, whichever is selected
        ups, eff_lines, st = lockstacks.effective(data, lines, str(path), sname)
        stacks[sname] = st
        mine = {p: ups[p] for p in st.overrides}  # only the overridden pins: the rest were checked as shared pins
        try:
            if mine:
                validate({"lockfile-version": 1, "upstreams": mine}, eff_lines, schema, str(path), LockError)
            typed = {**shared, **_type_pins(mine, path, root, eff_lines, others=shared, strict=not allow_unfilled)}
        except LockError as e:
            raise lockstacks.relocate(e, str(path), sname, st.overrides) from None
        if sname == want:
            chosen = (typed, eff_lines)
    if chosen is None:  # an unknown name: the same one-line error as effective() gives
        lockstacks.effective(data, lines, str(path), want)
        raise LockError(str(path), None, "stacks", f"no stack {want!r}")  # not reached: effective() raised
    upstreams, eff_lines = chosen
    return Lock(
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        upstreams=upstreams,
        lines=eff_lines,
        stack=want,
        stacks=stacks,
    )


def _type_pins(ups: dict, path: Path, root: Path, lines: dict, others: dict | None = None, strict: bool = True) -> dict:
    """Typed pins of a schema-valid `upstreams` mapping (`others`: typed pins it may refer to by `installed-on`);
    LockError naming FILE:LINE."""
    upstreams: dict[str, GitPin | WheelPin | WheelsetPin | ImagePin | DebsPin] = {}
    for name, u in ups.items():
        if u["kind"] == "git":
            upstreams[name] = _git_pin(name, u, path, root, lines)
        elif u["kind"] == "wheelset":
            _check_wheel_filenames(name, u, path, lines, strict)
            upstreams[name] = _wheelset_pin(name, u, path, lines, strict)
        elif u["kind"] == "debs":
            upstreams[name] = _debs_pin(name, u, path, lines)
        elif u["kind"] == "image":
            upstreams[name] = ImagePin(
                name=name, repo=u["repo"], tag=str(u["tag"]), digest=u.get("digest"), id=u.get("id")
            )
        else:
            _check_wheel_filenames(name, u, path, lines, strict)
            upstreams[name] = WheelPin(
                name=u["name"],
                version=str(u["version"]),
                index=u.get("index"),
                files=tuple(WheelFile(f["filename"], f["sha256"]) for f in u.get("files", ())),
                python_version=u.get("python-version"),
                platforms=tuple(u.get("platforms", ())),
                unresolved=u.get("unresolved"),
            )
    for name, pin in upstreams.items():
        if isinstance(pin, WheelsetPin) and pin.installed_on is not None:
            base = upstreams.get(pin.installed_on, (others or {}).get(pin.installed_on))
            if not isinstance(base, WheelsetPin) or pin.installed_on == name:
                at = ("upstreams", name, "installed-on")
                raise LockError(
                    str(path), _line(lines, at), _dotted(at), f"{pin.installed_on!r} is not another wheelset pin"
                )
            if (base.python_version, base.platform_tags) != (pin.python_version, pin.platform_tags):
                at = ("upstreams", name, "python-version")
                raise LockError(
                    str(path),
                    _line(lines, at),
                    _dotted(at),
                    f"differs from the target of {pin.installed_on!r} (python-version and platform-tags must match)",
                )
    for name, pin in upstreams.items():
        if isinstance(pin, WheelsetPin):
            _check_skew(name, pin, {**(others or {}), **upstreams}, path, lines)
    return upstreams


_CUDA_BUILD = re.compile(r"-cu(?:da)?\d+x?$")  # nvidia-nccl-cu12, cupy-cuda12x: one library built for one CUDA


def library_family(dist: str) -> str:
    """A distribution's native library without its CUDA build suffix: nvidia-nccl-cu12 and nvidia-nccl-cu13 are both
    `nvidia-nccl`; nvidia-cuda-runtime-cu12 and nvidia-cuda-runtime are both `nvidia-cuda-runtime`."""
    return _CUDA_BUILD.sub("", canonical_name(dist))


def _check_skew(name: str, pin: WheelsetPin, pins: dict, path: Path, lines: dict) -> None:
    """A wheelset's files against the sets it is installed on (`installed-on`, its whole chain): none re-pins a
    distribution a base pins at another version (installed on top with --no-deps, it would replace the base's torch),
    and none adds a second family of a native library (another CUDA build: nvidia-nccl-cu12 next to the base's cu13
    NCCL, a second CUDA runtime), nor does one set hold two of one family. LockError at the file's line."""
    below: list[tuple[str, WheelsetFile]] = []
    seen, cur = {name}, pin
    while cur.installed_on and cur.installed_on not in seen and isinstance(pins.get(cur.installed_on), WheelsetPin):
        seen.add(cur.installed_on)
        cur = pins[cur.installed_on]
        below += [(cur.name, f) for f in cur.files]
    by_name = {f.name: (b, f) for b, f in below}
    for i, f in enumerate(pin.files):
        if f.name in by_name and by_name[f.name][1].version != f.version:
            b, g = by_name[f.name]
            at = ("upstreams", name, "files", i, "version")
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f.name}=={f.version} re-pins {g.name}=={g.version} of {b} (installed-on): installed on top of it "
                f"this set would replace what {b} pins; keep the base's version (resolve again: `reprostack lock "
                f"wheels {name}`) or move the base",
            )
    families: dict[str, list[tuple[str, WheelsetFile]]] = {}  # family -> its files, bases first (one pass: linear)
    for b, g in [*below, *((name, g) for g in pin.files)]:
        families.setdefault(library_family(g.name), []).append((b, g))
    for i, f in enumerate(pin.files):
        fam = library_family(f.name)
        other = next(((b, g) for b, g in families[fam] if g.name != f.name and g is not f), None)
        if other is not None:
            b, g = other
            at = ("upstreams", name, "files", i, "name")
            where = "this set" if b == name else f"{b} (installed-on)"
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f.name}=={f.version} adds a second {fam} next to {g.name}=={g.version} of {where}: two CUDA builds "
                f"of one native library end in one process (a second NCCL or CUDA runtime); pin the base's "
                f"build only",
            )


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


def _check_refs(data, path: Path, lines: dict) -> None:
    """Every `ref:` and `fetch-refs` entry anywhere in the lock is a ref name git accepts (LockError FILE:LINE)."""

    def walk(node, at):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "ref" and isinstance(v, str):
                    check(v, at + (k,))
                elif k == "fetch-refs" and isinstance(v, list):
                    for i, r in enumerate(v):
                        if isinstance(r, str):
                            check(r, at + (k, i))
                else:
                    walk(v, at + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, at + (i,))

    def check(ref, at):
        why = ref_problem(ref)
        if why:
            raise LockError(str(path), _line(lines, at), _dotted(at), f"{ref!r} {why}")

    walk(data, ())


def _check_wheel_filenames(name: str, u: dict, path: Path, lines: dict, strict: bool = True) -> None:
    """Each file is a bare wheel filename; `strict` (every load but `lock wheels`' own, which refills them): of the
    distribution and version the pin says (a wheel pin's `name`/`version`, a wheelset file's own fields), so a
    `version:` moved by hand (a bump's tied wheel) without `lock wheels` never passes with the old release's files."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    for i, f in enumerate(u.get("files", ())):
        at = ("upstreams", name, "files", i, "filename")
        problem = wheel_filename_problem(f["filename"])
        if problem:
            raise LockError(str(path), _line(lines, at), _dotted(at), problem)
        if not strict:
            continue
        dist, version = (u["name"], u["version"]) if u.get("kind") == "wheel" else (f["name"], f["version"])
        got_name, got_version, _, _ = parse_wheel_filename(f["filename"])
        try:
            same = canonicalize_name(got_name) == canonicalize_name(str(dist)) and got_version == Version(str(version))
        except InvalidVersion:
            same = False
        if not same:
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f['filename']} is {got_name} {got_version}, the pin says {dist} {version}: run `reprostack lock "
                f"wheels {name}` (it resolves the files of the pinned version)",
            )


def _git_pin(name: str, u: dict, path: Path, root: Path, lines: dict) -> GitPin:
    for sp in u.get("submodules") or {}:
        problem = submodule_path_problem(sp)
        if problem:
            at: tuple = ("upstreams", name, "submodules", sp)
            raise LockError(str(path), _line(lines, at), _dotted(at), problem)
    urls = [
        (("upstreams", name, "url"), u["url"]),
        *((("upstreams", name, "submodules", sp, "url"), s["url"]) for sp, s in (u.get("submodules") or {}).items()),
    ]
    for at, url in urls:  # a URL git could read as an option or a transport helper never reaches git
        why = url_problem(url)
        if why:
            raise LockError(str(path), _line(lines, at), _dotted(at), f"{url!r} {why}")
    subs = tuple(
        Submodule(path=sp, url=s["url"], rev=s["rev"], tree=s.get("tree"), fetch_refs=tuple(s.get("fetch-refs", ())))
        for sp, s in (u.get("submodules") or {}).items()
    )
    patches: list[PatchEntry] = []
    for i, p in enumerate(u.get("patches") or (), start=1):
        kind = next(k for k in ("cherry-pick", "mbox", "diff") if k in p)
        at = ("upstreams", name, "patches", i - 1)
        if kind == "cherry-pick" and "sha256" in p:
            raise LockError(
                str(path),
                _line(lines, at + ("sha256",)),
                _dotted(at + ("sha256",)),
                "only a patch file (mbox/diff) has a sha256; a cherry-pick is named by its commit id",
            )
        if kind == "cherry-pick":
            _check_pick(name, p[kind], u["rev"], [e for e in patches if e.kind == "cherry-pick"], at, path, lines)
        sha_at = at + ("sha256",) if "sha256" in p else at
        entry = PatchEntry(
            kind=kind,
            value=p[kind],
            upstream_status=p["upstream-status"],
            ref=p.get("ref"),
            description=p.get("description"),
            tree=p.get("tree"),
            index=i,
            sha256=p.get("sha256"),
            where=f"{path}:{_line(lines, sha_at)}",
        )
        if kind != "cherry-pick":
            try:
                patch_path(root, p[kind])
            except PatchFileError as e:
                raise LockError(str(path), _line(lines, at + (kind,)), _dotted(at + (kind,)), str(e)) from None
            if not (root / p[kind]).is_file():
                raise LockError(
                    str(path),
                    _line(lines, at + (kind,)),
                    _dotted(at + (kind,)),
                    f"patch file {p[kind]} not found under {root}",
                )
            try:
                read_patch_file(root, entry)
            except PatchFileError as e:
                raise LockError(str(path), _line(lines, sha_at), _dotted(sha_at), str(e)) from None
        patches.append(entry)
    if patches and patches[-1].tree and patches[-1].tree != u["patched-tree"]:
        at = ("upstreams", name, "patched-tree")
        raise LockError(
            str(path), _line(lines, at), _dotted(at), f"differs from the last series entry's tree {patches[-1].tree}"
        )
    return GitPin(
        name=name,
        url=u["url"],
        rev=u["rev"],
        tree=u["tree"],
        original=u.get("original"),
        fetch_refs=tuple(u.get("fetch-refs", ())),
        submodules=subs,
        patches=tuple(patches),
        patched_tree=u.get("patched-tree"),
        policy=Policy(**u["policy"]) if "policy" in u else None,
    )


def _check_pick(name: str, value: str, rev: str, earlier: list, at: tuple, path: Path, lines: dict) -> None:
    """A cherry-pick of the pinned rev itself (empty: the base holds it) or of a commit an earlier entry picks is
    refused naming the pin and the entry (git's own words were `multiple updates for ref`, naming neither)."""
    where = (str(path), _line(lines, at + ("cherry-pick",)), _dotted(at + ("cherry-pick",)))
    if value.lower() == str(rev).lower():
        raise LockError(
            *where,
            f"{value} is the pinned rev of {name} itself: the base already holds it, so this cherry-pick would be empty; "
            f"drop the entry, or pin `rev` at its parent to apply it as a patch",
        )
    for e in earlier:
        if e.value.lower() == value.lower():
            raise LockError(*where, f"{value} is also picked by entry {e.label} of {name}: a commit is picked once")


def _debs_pin(name: str, u: dict, path: Path, lines: dict) -> DebsPin:
    files = tuple(
        DebFile(f["name"], str(f["version"]), f["arch"], f["filename"], int(f["size"]), f["sha256"])
        for f in u.get("files", ())
    )
    seen: dict[str, int] = {}
    for i, f in enumerate(files):
        at = ("upstreams", name, "files", i)
        if f.name in seen:
            raise LockError(
                str(path),
                _line(lines, at + ("name",)),
                _dotted(at + ("name",)),
                f"{f.name} is pinned twice (also files[{seen[f.name]}]): a debs pin holds one version of a package",
            )
        seen[f.name] = i
        # the pool filename says which package, version and arch it is (the version without its epoch)
        want = f"{f.name}_{f.version.split(':', 1)[-1]}_{f.arch}.deb"
        if f.basename != want or ".." in f.filename.split("/"):
            raise LockError(
                str(path),
                _line(lines, at + ("filename",)),
                _dotted(at + ("filename",)),
                f"{f.filename!r} is not the pool file of {f.name} {f.version} ({f.arch}): its name would be {want}",
            )
        if f.arch not in (u["architecture"], "all"):
            raise LockError(
                str(path),
                _line(lines, at + ("arch",)),
                _dotted(at + ("arch",)),
                f"{f.arch!r}: the pin is for {u['architecture']} (and `all`)",
            )
    return DebsPin(
        name=name,
        archive=u["archive"].rstrip("/"),
        suite=u["suite"],
        component=u["component"],
        architecture=u["architecture"],
        keyring=u["keyring"],
        signed_by=tuple(u["signed-by"]),
        variant=u["variant"],
        include=tuple(u.get("include", ())),
        files=files,
        unresolved=u.get("unresolved"),
    )


def _wheelset_pin(name: str, u: dict, path: Path, lines: dict, strict: bool = True) -> WheelsetPin:
    """The typed pin; LockError at the line of a distribution pinned twice and, when `strict` (every load but `lock
    wheels`' own, which refills `files` from the requirements), of a requirement or override `files` disagrees with:
    a requirement edited by hand is refilled by `lock wheels PIN`, never refused by the load that command needs."""
    files = tuple(WheelsetFile(f["name"], str(f["version"]), f["filename"], f["sha256"]) for f in u.get("files", ()))
    seen: dict[str, int] = {}
    for i, f in enumerate(files):
        if f.name in seen:
            at: tuple = ("upstreams", name, "files", i, "name")
            raise LockError(
                str(path),
                _line(lines, at),
                _dotted(at),
                f"{f.name} is pinned twice (also files[{seen[f.name]}]): a wheelset has one wheel per distribution",
            )
        seen[f.name] = i
    by_name = {f.name: f for f in files}  # one lookup per requirement (a wheelset pins ~200 of each)
    for key in ("requirements", "overrides"):
        for i, req in enumerate(u.get(key, ())):
            dist, version = req.split("==", 1)
            have = by_name.get(canonical_name(dist))
            if strict and files and (have is None or have.version != version):
                at = ("upstreams", name, key, i)
                got = f"{have.name}=={have.version}" if have else "nothing"
                raise LockError(
                    str(path),
                    _line(lines, at),
                    _dotted(at),
                    f"{req} but `files` pins {got} (run `reprostack lock wheels {name}`)",
                )
    return WheelsetPin(
        name=name,
        requirements=tuple(u["requirements"]),
        python_version=str(u["python-version"]),
        platform_tags=tuple(u["platform-tags"]),
        files=files,
        overrides=tuple(u.get("overrides", ())),
        index=u.get("index"),
        installed_on=u.get("installed-on"),
        unresolved=u.get("unresolved"),
    )
