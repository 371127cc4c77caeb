"""Rewrite one git pin's block of `upstreams.lock` in place: values swapped, entries dropped, keys added.

Every edit is a (start, end, replacement) range of the text found from the YAML node marks (as the lock
fillers do, `reprostack.lock.fill.pin_node`), applied from the end of the file backwards; every byte outside
the pin's block is kept, and so are comments and the layout of the block's untouched lines (a trailing
comment after a rewritten value stays). Block and flow style (`- {cherry-pick: ..., ref: ...}`) mappings
are both handled; a flow-style `patches: [...]` list is refused (write it in block style).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import yaml

from ..errors import LockError
from ..lock.fill import child, pin_node


@dataclass(frozen=True)
class PinEdit:
    """What changes in one pin.

    rev/tree: the new base; original: new `original:` text (None: untouched); fetch_refs: new list (None:
    untouched); submodules: {path: (rev, tree)}; series: one item per old entry, in order: None drops it,
    a tree id keeps it with that `tree:` checkpoint; patched_tree: None removes `patches:` and `patched-tree:`;
    patch_sha256: {0-based series index: sha256} of the patch files the bump rewrote (their `sha256:` follows).
    """

    rev: str
    tree: str
    original: str | None = None
    fetch_refs: tuple[str, ...] | None = None
    submodules: dict[str, tuple[str, str]] = field(default_factory=dict)
    series: list[str | None] = field(default_factory=list)
    patched_tree: str | None = None
    patch_sha256: dict[int, str] = field(default_factory=dict)


def _scalar(value: str) -> str:
    """A YAML plain scalar for an id (quoted when it would read as a number), or a double-quoted string."""
    if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", value):
        return f'"{value}"' if value.isdigit() else value
    if re.fullmatch(r"refs/[A-Za-z0-9._/+-]+", value):
        return value
    return json.dumps(value, ensure_ascii=False)


class _Editor:
    def __init__(self, text: str, path: str, name: str):
        self.text, self.path, self.name = text, path, name
        self.starts = [0]
        for m in re.finditer("\n", text):
            self.starts.append(m.end())
        self.edits: list[tuple[int, int, str]] = []

    def fail(self, node: yaml.Node, field_: str, msg: str) -> LockError:
        return LockError(self.path, node.start_mark.line + 1, f"upstreams.{self.name}.{field_}", msg)

    def line_end(self, line: int) -> int:
        """Index of the newline ending `line` (0-based), or the end of the text."""
        return self.starts[line + 1] - 1 if line + 1 < len(self.starts) else len(self.text)

    def line_span(self, first: int, last: int) -> tuple[int, int]:
        """[start of `first`, start of the line after `last`): whole lines, newline included."""
        end = self.starts[last + 1] if last + 1 < len(self.starts) else len(self.text)
        return self.starts[first], end

    def set(self, mapping: yaml.MappingNode, key: str, value: str, field_: str) -> None:
        """Replace the scalar value of `key`, or add `key: value` at the end of `mapping`."""
        try:
            _, v = child(mapping, key)
        except KeyError:
            self.add(mapping, key, value)
            return
        if not isinstance(v, yaml.ScalarNode):
            raise self.fail(v, field_, "expected a single value here")
        self.edits.append((v.start_mark.index, v.end_mark.index, _scalar(value)))

    def add(self, mapping: yaml.MappingNode, key: str, value: str) -> None:
        if mapping.flow_style:
            self.edits.append((mapping.end_mark.index - 1, mapping.end_mark.index - 1, f", {key}: {_scalar(value)}"))
            return
        col = mapping.value[0][0].start_mark.column
        at = self.line_end(last_line(mapping))
        self.edits.append((at, at, "\n" + " " * col + f"{key}: {_scalar(value)}"))

    def drop_key(self, mapping: yaml.MappingNode, key: str) -> None:
        try:
            k, v = child(mapping, key)
        except KeyError:
            return
        if mapping.flow_style:
            raise self.fail(k, key, "cannot remove a key from a flow-style mapping; write the pin in block style")
        self.edits.append((*self.line_span(k.start_mark.line, max(k.start_mark.line, last_line(v))), ""))

    def apply(self) -> str:
        text = self.text
        last = None
        for start, end, new in sorted(self.edits, key=lambda e: (e[0], e[1]), reverse=True):
            if last is not None and end > last:
                raise LockError(self.path, None, f"upstreams.{self.name}", "internal error: overlapping lock edits")
            text = text[:start] + new + text[end:]
            last = start
        return text


def last_line(node: yaml.Node) -> int:
    """The last line (0-based) that holds part of `node` (a block scalar's end mark is on the next line)."""
    if isinstance(node, yaml.ScalarNode):
        end = node.end_mark
        return end.line if end.column > 0 or end.line == node.start_mark.line else end.line - 1
    if isinstance(node, yaml.MappingNode) and node.value and not node.flow_style:
        return max(max(last_line(k), last_line(v)) for k, v in node.value)
    if isinstance(node, yaml.SequenceNode) and node.value and not node.flow_style:
        return max(last_line(v) for v in node.value)
    end = node.end_mark
    return end.line if end.column > 0 else end.line - 1


def edit_pin(text: str, name: str, change: PinEdit, path: str = "upstreams.lock") -> str:
    """Return `text` with pin `name` changed as `change` says; every byte outside that pin's block is kept.

    Raises LockError naming FILE:LINE: upstreams.NAME.FIELD when the block cannot be edited in place (no
    such pin, a flow-style patch list, a series of another length than `change.series`, a submodule of
    `change.submodules` missing from the lock).
    """
    ed = _Editor(text, path, name)
    try:
        pin = pin_node(text, name)
    except KeyError:
        raise LockError(path, None, f"upstreams.{name}", "no such pin") from None
    if not isinstance(pin, yaml.MappingNode) or pin.flow_style:
        raise ed.fail(pin, "(pin)", "a git pin to bump must be a block-style mapping")
    ed.set(pin, "rev", change.rev, "rev")
    ed.set(pin, "tree", change.tree, "tree")
    if change.original is not None:
        ed.set(pin, "original", change.original, "original")
    if change.fetch_refs is not None:
        _set_list(ed, pin, "fetch-refs", change.fetch_refs)
    if change.submodules:
        try:
            _, subs = child(pin, "submodules")
        except KeyError:
            raise ed.fail(pin, "submodules", "the lock lists no submodules to update") from None
        for spath, (srev, stree) in change.submodules.items():
            try:
                _, sub = child(subs, spath)
            except KeyError:
                raise ed.fail(subs, f"submodules.{spath}", "not in the lock") from None
            ed.set(sub, "rev", srev, f"submodules.{spath}.rev")
            ed.set(sub, "tree", stree, f"submodules.{spath}.tree")
    _series(ed, pin, change)
    new = ed.apply()
    _check_outside(text, new, name, path)
    return new


def _set_list(ed: _Editor, pin: yaml.MappingNode, key: str, items: tuple[str, ...]) -> None:
    flow = "[" + ", ".join(_scalar(i) for i in items) + "]"
    try:
        k, v = child(pin, key)
    except KeyError:
        if items:
            col = pin.value[0][0].start_mark.column
            at = ed.line_end(last_line(pin))
            ed.edits.append((at, at, "\n" + " " * col + f"{key}: {flow}"))
        return
    if not items:
        ed.drop_key(pin, key)
    elif v.flow_style or not isinstance(v, yaml.SequenceNode) or not v.value:
        ed.edits.append((v.start_mark.index, v.end_mark.index, flow))
    else:
        start, end = ed.line_span(k.start_mark.line, last_line(v))
        ed.edits.append((start, end, " " * k.start_mark.column + f"{key}: {flow}\n"))


def _series(ed: _Editor, pin: yaml.MappingNode, change: PinEdit) -> None:
    try:
        k, seq = child(pin, "patches")
    except KeyError:
        if change.series:
            raise ed.fail(pin, "patches", "the lock has no series to update") from None
        return
    if not isinstance(seq, yaml.SequenceNode) or (seq.flow_style and seq.value):
        raise ed.fail(seq, "patches", "a flow-style series cannot be edited in place: write it in block style")
    if len(seq.value) != len(change.series):
        raise ed.fail(seq, "patches", f"has {len(seq.value)} entries, the bump replayed {len(change.series)}")
    if change.patched_tree is None:
        ed.drop_key(pin, "patches")
        ed.drop_key(pin, "patched-tree")
        return
    for i, (item, tree) in enumerate(zip(seq.value, change.series)):
        if tree is None:
            ed.edits.append((*ed.line_span(item.start_mark.line, _item_end(ed, item)), ""))
        elif isinstance(item, yaml.MappingNode):
            ed.set(item, "tree", tree, f"patches[{i}].tree")
            if i in change.patch_sha256:
                ed.set(item, "sha256", change.patch_sha256[i], f"patches[{i}].sha256")
        else:
            raise ed.fail(item, f"patches[{i}]", "a series entry must be a mapping")
    ed.set(pin, "patched-tree", change.patched_tree, "patched-tree")


def _item_end(ed: _Editor, item: yaml.Node) -> int:
    """Last line of a block sequence item, with the comment lines indented under it (they belong to it)."""
    last = last_line(item)
    first = ed.text[ed.starts[item.start_mark.line] : ed.line_end(item.start_mark.line)]
    dash = first.find("-")
    while last + 1 < len(ed.starts):
        line = ed.text[ed.starts[last + 1] : ed.line_end(last + 1)]
        stripped = line.lstrip(" ")
        if stripped.startswith("#") and len(line) - len(stripped) > dash:
            last += 1
        else:
            break
    return last


def _check_outside(old: str, new: str, name: str, path: str) -> None:
    """The text before and after the pin's block is unchanged (an internal check of this module)."""
    a, b = pin_node(old, name), pin_node(new, name)
    key_line_a = _key_line(old, name)
    key_line_b = _key_line(new, name)
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    tail_a, tail_b = old_lines[last_line(a) + 1 :], new_lines[last_line(b) + 1 :]
    if old_lines[:key_line_a] != new_lines[:key_line_b] or tail_a != tail_b:
        raise LockError(
            path,
            key_line_a + 1,
            f"upstreams.{name}",
            "internal error: the edit would change lines outside this pin's block",
        )


def _key_line(text: str, name: str) -> int:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    k, _ = child(child(root, "upstreams")[1], name)
    return k.start_mark.line
