"""Load and validate `upstreams.lock` into typed, immutable pins (`load` -> `Lock`).

The pins themselves and the checks of single values are lock.pins; typing each `kind:` with the checks a schema
cannot state is lock.typed; this module reads the file, validates it against the schema and types every stack (the pins are imported from
lock.pins, or from the package `reprostack.lock`).

Invariants (checked here and in lock.typed, relied on by every later stage):
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
- every `ref:` and `fetch-refs` entry is a ref name git accepts;
- unknown keys, duplicate keys and wrong types are errors that name `FILE:LINE: field`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from .. import schemas
from ..errors import LockError
from ..yamlsrc import compose, dotted as _dotted, line_of as _line, read_bytes, validate
from . import stacks as lockstacks
from .pins import (
    DebsPin,
    GitPin,
    ImagePin,
    WheelPin,
    WheelsetPin,
    ref_problem,
)
from .typed import type_pins


LOCKFILE = "upstreams.lock"


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
    shared = type_pins(data["upstreams"], path, root, lines, strict=not allow_unfilled)
    stacks: dict[str, lockstacks.Stack] = {}
    chosen = None
    for sname in lockstacks.names(data):  # every stack validates, whichever is selected
        ups, eff_lines, st = lockstacks.effective(data, lines, str(path), sname)
        stacks[sname] = st
        mine = {p: ups[p] for p in st.overrides}  # only the overridden pins: the rest were checked as shared pins
        try:
            if mine:
                validate({"lockfile-version": 1, "upstreams": mine}, eff_lines, schema, str(path), LockError)
            typed = {**shared, **type_pins(mine, path, root, eff_lines, others=shared, strict=not allow_unfilled)}
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
