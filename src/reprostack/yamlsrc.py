"""YAML with line numbers, validated by a JSON schema: errors say `FILE:LINE: field: problem`.

Used for every file an operator edits (upstreams.lock, gates/*.yaml); duplicate keys are errors.
"""

from __future__ import annotations

import jsonschema
import yaml


def compose(text: str, path: str, error=None) -> tuple[object, dict[tuple, int]]:
    """Parse YAML keeping the line (1-based) of every node, keyed by path tuple; `error(path, line, field, msg)` is
    raised for syntax errors and duplicate keys."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise error(path, 1, "(file)", "empty lockfile")
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark else None
        raise error(path, line, "(yaml)", str(e.problem)) from None
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}

    def walk(n, p):
        lines[p] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            seen = {}
            for k, v in n.value:
                key = k.value
                if key in seen:
                    raise error(path, k.start_mark.line + 1, dotted(p + (key,)),
                                    f"duplicate key (first at line {seen[key]})")
                seen[key] = k.start_mark.line + 1
                walk(v, p + (key,))
                lines[p + (key,)] = k.start_mark.line + 1
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, p + (i,))

    walk(node, ())
    return data, lines


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
        return ("a patch file entry needs `sha256:` (the sha256 of the committed file, `sha256sum FILE`): "
                "the lock vouches for those bytes")
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
