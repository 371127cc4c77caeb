"""The shared fill/check pipeline of `reprostack lock wheels|images`: resolve the named pins from their
source, then either compare with the lock (`--check`) or rewrite only those pins' lines, validate the
result by loading it, and write it atomically — on any error nothing is written."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from ..atomicfile import write_text_atomic
from ..errors import LockError, ReprostackError
from .. import lock as lockmod  # the pin model's public face (lock.model, lock.pins)


@dataclass(frozen=True)
class PinKind:
    """What differs between kinds: `what` ("wheel"), the filled field (`files`), the source ("the index"),
    and the kind's functions: names(lock, names), resolve(lock, name), describe(lock, resolved) -> str,
    check(lock, resolved) -> [problem], fill_text(text, resolved) -> text."""

    what: str
    field: str
    source: str
    names: Callable
    resolve: Callable
    describe: Callable
    check: Callable
    fill_text: Callable


def run(kind: PinKind, lock_path: Path, names: list[str], do_check: bool, out=print) -> int:
    """Fill (default) or check the `kind` pins named (all of that kind when none). Returns 0; raises
    ReprostackError listing every problem (check) or why nothing was written (fill)."""
    lock = lockmod.load(lock_path, allow_unfilled=True)
    todo = kind.names(lock, names)
    if not todo:
        out(f"{lock.path}: no {kind.what} pins")
        return 0
    resolved = []
    for n in todo:
        r = kind.resolve(lock, n)
        resolved.append(r)
        out(f"{n}: {kind.describe(lock, r)}")
    if do_check:
        problems = kind.check(lock, resolved)
        if problems:
            raise ReprostackError(f"{len(problems)} {kind.what} pin problem(s):\n" + "\n".join(problems))
        lockmod.load(lock_path)  # the strict load: every pin of the kind is filled
        out(f"{lock.path}: {len(resolved)} {kind.what} pin(s) match {kind.source}")
        return 0
    old = lock_path.read_bytes().decode("utf-8")
    new = kind.fill_text(old, resolved)
    if new == old:
        out(f"{lock.path}: unchanged")
        return 0
    with tempfile.TemporaryDirectory(prefix="reprostack-lock-") as tmp:
        probe = Path(tmp, lock_path.name)
        probe.write_text(new, encoding="utf-8")
        try:
            filled = lockmod.load(probe, root=lock_path.resolve().parent, allow_unfilled=True)
        except LockError as e:
            raise ReprostackError(f"internal error: the filled lock does not validate, nothing written: {e}") from None
        left = kind.check(filled, resolved)
        if left:
            raise ReprostackError(
                f"internal error: the filled lock differs from what {kind.source} gives, "
                "nothing written:\n" + "\n".join(left)
            )
    write_text_atomic(lock_path, new, mode=lock_path.stat().st_mode & 0o7777)
    out(f"{lock.path}: wrote {kind.field} of {', '.join(r.pin for r in resolved)}")
    return 0


def child(node: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node]:
    """(key node, value node) of `key` in a YAML mapping node; KeyError when absent."""
    for k, v in node.value:
        if k.value == key:
            return k, v
    raise KeyError(key)


def pin_node(text: str, name: str) -> yaml.Node:
    """The YAML node of `upstreams.<name>` in the lockfile text (lines and columns for in-place edits)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    return child(child(root, "upstreams")[1], name)[1]


def drop_unresolved(text: str, name: str) -> str:
    """`text` without the pin's `unresolved:` line (a filled pin is resolved: the schema refuses both)."""
    try:
        key, val = child(pin_node(text, name), "unresolved")
    except KeyError:
        return text
    if val.end_mark.line != key.start_mark.line:
        raise ReprostackError(f"upstreams.{name}.unresolved: spans several lines; write it on one line")
    lines = text.splitlines(keepends=True)
    del lines[key.start_mark.line]
    return "".join(lines)


def put_block(text: str, span: tuple[int, int, int, bool], new: list[str]) -> str:
    """`text` with the block at `span` (first line, last line, column, present: a pin's `_span`) replaced by the
    lines `new`, or, when not present, `new` inserted after the span's last line."""
    first, last, _, has = span
    lines = text.splitlines(keepends=True)
    if has:
        lines[first : last + 1] = new
    else:
        if last < len(lines) and not lines[last].endswith("\n"):
            lines[last] += "\n"
        lines[last + 1 : last + 1] = new
    return "".join(lines)
