"""YAML with line numbers, validated by a JSON schema: errors say `FILE:LINE: field: problem`.

Used for every file an operator edits (upstreams.lock, gates/*.yaml, claims/*.yaml, containers/*/image.yaml,
kernels/*.yaml); duplicate keys are errors.

Bounded (every such file may come from a PR): `compose` refuses, with one located error and before any
construction, input over MAX_BYTES, more than MAX_NODES nodes, nesting deeper than MAX_DEPTH, an alias of a
mapping or sequence (the billion-laughs expansion; an alias of a scalar, which gates/micro.yaml uses, expands
nothing) or more than MAX_ALIASES aliases, bytes that are not UTF-8, characters YAML forbids, and values that
construct badly (a non-finite float, an impossible timestamp, an int of thousands of digits). Memory and time are
bounded by the caps, never by the input. libyaml's parser is used when PyYAML has it (the composer stays ours).
"""

from __future__ import annotations

import math

import jsonschema
import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.resolver import Resolver

MAX_BYTES = 4 << 20  # upstreams.lock is ~85 KB
MAX_DEPTH = 64  # our files nest <= 8 deep
MAX_NODES = 100_000  # 3,610 in upstreams.lock; 100,000 compose in ~2 s
MAX_ALIASES = 1_000

try:  # libyaml's scanner/parser (events) under our Python composer: ~8x faster, same marks
    from yaml._yaml import CParser as _Parser

    def _init_parser(self, text):
        _Parser.__init__(self, text)

    _LIBYAML = True
except ImportError:  # PyYAML without libyaml
    from yaml.parser import Parser as _Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, _Parser):  # noqa: F811
        pass

    def _init_parser(self, text):
        Reader.__init__(self, text)
        Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)

    _LIBYAML = False


class _BoundedLoader(Composer, _Parser, SafeConstructor, Resolver):
    """SafeLoader semantics with the caps of the module doc enforced while composing."""

    def __init__(self, text: str):
        _init_parser(self, text)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        Composer.__init__(self)
        self._depth = self._nodes = self._aliases = 0

    def _refuse(self, problem: str, mark):
        raise yaml.composer.ComposerError(None, None, problem, mark)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                self._refuse(f"more than {MAX_ALIASES} aliases", event.start_mark)
            target = self.anchors.get(event.anchor)
            if target is not None and not isinstance(target, yaml.ScalarNode):
                what = "mapping" if isinstance(target, yaml.MappingNode) else "sequence"
                self._refuse(
                    f"alias *{event.anchor} names a {what}: only aliases of scalars are allowed (an alias of "
                    f"a collection can expand exponentially)",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        self._nodes += 1
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH or self._nodes > MAX_NODES:
                self._refuse(
                    f"nested deeper than {MAX_DEPTH} levels"
                    if self._depth > MAX_DEPTH
                    else f"more than {MAX_NODES} nodes",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError) as e:
            tag = node.tag.rsplit(":", 1)[-1]
            raise ConstructorError(
                None, None, f"cannot read {_short(node.value)} as {tag}: {str(e).split(';')[0]}", node.start_mark
            ) from None

    def construct_yaml_float(self, node):
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise ConstructorError(None, None, f"{_short(node.value)} is not a finite number", node.start_mark)
        return value


def _short(value) -> str:
    return repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:30] + "...")


_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _BoundedLoader.construct_yaml_float)


def decode(raw: bytes, path: str, error) -> str:
    """UTF-8 text of `raw` (at most MAX_BYTES); `error(path, line, "(file)", msg)` names the first bad byte's line."""
    if len(raw) > MAX_BYTES:
        raise error(path, None, "(file)", f"more than the {MAX_BYTES} bytes a YAML file here may have")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(
            path,
            raw.count(b"\n", 0, e.start) + 1,
            "(file)",
            f"not UTF-8 (byte {raw[e.start]:#04x} at offset {e.start})",
        ) from None


def read_bytes(path, error) -> bytes:
    """The bytes of `path`, reading no more than MAX_BYTES + 1 (compose refuses that many); an unreadable file is
    `error(path, None, "(file)", why)`."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_BYTES + 1)
    except OSError as e:
        raise error(str(path), None, "(file)", e.strerror or str(e)) from None


def load(path, error) -> tuple[object, dict[tuple, int]]:
    """Read `path` (read_bytes) and compose it (see `compose`)."""
    return compose(read_bytes(path, error), str(path), error)


def compose(text: str | bytes, path: str, error=None) -> tuple[object, dict[tuple, int]]:
    """Parse YAML keeping the line (1-based) of every node, keyed by path tuple; `error(path, line, field, msg)` is
    raised for syntax errors, duplicate keys and anything over the module's caps."""
    if isinstance(text, bytes):
        text = decode(text, path, error)
    elif len(text) > MAX_BYTES:
        raise error(
            path, None, "(file)", f"{len(text)} characters, more than the {MAX_BYTES} a YAML file here may have"
        )
    try:
        loader = _BoundedLoader(text)
    except yaml.YAMLError as e:  # the pure-Python reader checks characters as it starts
        raise error(path, _line_of_error(e, text), "(yaml)", _problem(e)) from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise error(path, 1, "(file)", "empty file")
        data = loader.construct_document(node)
    except yaml.YAMLError as e:
        raise error(path, _line_of_error(e, text), "(yaml)", _problem(e)) from None
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}

    def walk(n, p):
        lines[p] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            seen = {}
            for k, v in n.value:
                key = k.value if isinstance(k, yaml.ScalarNode) else repr(k.value)
                if key in seen:
                    raise error(
                        path, k.start_mark.line + 1, dotted(p + (key,)), f"duplicate key (first at line {seen[key]})"
                    )
                seen[key] = k.start_mark.line + 1
                walk(v, p + (key,))
                lines[p + (key,)] = k.start_mark.line + 1
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, p + (i,))

    walk(node, ())
    return data, lines


def _line_of_error(e: yaml.YAMLError, text: str) -> int | None:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is not None:
        return mark.line + 1
    if isinstance(e, yaml.reader.ReaderError):  # libyaml counts bytes, the Python reader characters
        head = text.encode("utf-8")[: e.position] if _LIBYAML else text[: e.position]
        return head.count(b"\n" if _LIBYAML else "\n") + 1
    return None


def _problem(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.reader.ReaderError):
        ch = chr(e.character) if isinstance(e.character, int) else e.character
        return f"character {ch!r} is not allowed in YAML"
    return str(getattr(e, "problem", None) or e).replace("\n", " ")


def dotted(p: tuple) -> str:
    out = ""
    for part in p:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def explain(err: jsonschema.ValidationError) -> str:
    if err.validator == "additionalProperties":
        return err.message.replace("Additional properties are not allowed", "unknown key")
    if err.validator == "pattern" and isinstance(err.instance, str):
        hint = ""
        if "{40}" in err.validator_value and (err.instance.startswith("refs/") or len(err.instance) < 40):
            hint = " (a mutable ref or short id is not a pin: give the full 40-hex commit and put the ref in `ref`/`fetch-refs`)"
        return f"{err.instance!r} does not match {err.validator_value!r}{hint}"
    if err.validator == "type" and isinstance(err.instance, int) and err.validator_value == "string":
        return f"{err.instance!r} was read as a number: quote it"
    if err.validator == "dependentRequired" and "sha256" in err.message:
        return (
            "a patch file entry needs `sha256:` (the sha256 of the committed file, `sha256sum FILE`): "
            "the lock vouches for those bytes"
        )
    if err.validator == "oneOf":
        return "a patch entry needs exactly one of cherry-pick / mbox / diff"
    return err.message


def best_error(errors: list[jsonschema.ValidationError]) -> jsonschema.ValidationError:
    # The deepest error points at the offending field instead of at a whole `allOf` branch.
    def depth(e):
        leaf = e
        while leaf.context:
            leaf = max(leaf.context, key=lambda c: len(c.absolute_path))
        return len(leaf.absolute_path)

    err = max(errors, key=depth)
    while err.context and err.validator not in ("oneOf",):
        err = max(err.context, key=lambda c: len(c.absolute_path))
    return err


def line_of(lines: dict[tuple, int], p: tuple) -> int | None:
    while p and p not in lines:
        p = p[:-1]
    return lines.get(p)


def validate(data, lines: dict, schema: dict, path: str, error) -> None:
    """Validate `data` against `schema`; raise `error(path, line, field, message)` for the deepest problem."""
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    if not errors:
        return
    err = best_error(errors)
    p = tuple(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        if extra:
            p = p + (extra[0],)
    raise error(path, line_of(lines, p), dotted(p), explain(err))
