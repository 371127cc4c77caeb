"""Bounded JSON and JSON Lines readers for files we did not write (AIPerf exports, artifacts copied off a node).

Every problem is one `error(message)` whose message starts `FILE:LINE:` (the JSON text's line for a syntax
error; the record's line for JSON Lines) or `FILE:` with the key path (`request_latency.p50`) when the problem is
a value inside a parsed object. Limits, checked before anything is built from the text:

* size: at most `max_bytes` per file (a JSON Lines file is read line by line, each line at most
  `max_line_bytes`, so memory is bounded by one record, not by the file);
* depth: nesting deeper than MAX_DEPTH is refused (the stdlib parser recurses; it never gets to);
* numbers: NaN, Infinity and floats that overflow to infinity are refused (AIPerf writes finite numbers or
  null), and integers of more than MAX_INT_DIGITS digits (no float holds them);
* text: strict UTF-8; the top level must be an object (a JSON Lines record too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

MAX_BYTES = 64 << 20  # one aggregate export is ~30 KB
MAX_JSONL_BYTES = 1 << 30  # a long AIPerf run: ~5 KB per request
MAX_LINE_BYTES = 4 << 20  # one request record (its inter_chunk_latency list grows with the OSL)
MAX_DEPTH = 32  # AIPerf nests <= 6 deep
MAX_INT_DIGITS = 40  # ns timestamps have 19; a float holds < 309


def _constant(name: str):
    raise ValueError(f"{name} is not a number a JSON export may hold")


def _float(text: str) -> float:
    """json's parse_float: a literal past a float's range (1e999) is refused as it is read (NaN and Infinity are
    parse_constant's)."""
    v = float(text)
    if v - v != 0.0:  # inf - inf is nan; every finite float gives 0.0
        raise ValueError(f"{v} is not a finite number")
    return v


def _int(text: str) -> int:
    """json's parse_int: an integer of more than MAX_INT_DIGITS digits is refused as it is read (one past Python's
    own limit keeps Python's message)."""
    v = int(text)
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (more than {MAX_INT_DIGITS})")
    return v


def _walk(obj, where: str, error) -> None:
    """Level by level (no recursion): refuse nesting past MAX_DEPTH (the numbers were checked as they were read:
    _float, _int)."""
    depth, level = 0, [obj]
    while True:
        level = [o for o in level if type(o) is dict or type(o) is list]
        if not level:
            return
        depth += 1
        if depth > MAX_DEPTH:
            raise error(f"{where}: nested deeper than {MAX_DEPTH} levels")
        level = [v for o in level for v in (o.values() if type(o) is dict else o)]


def loads(raw: bytes, path, error, line: int | None = None) -> dict:
    """Parse one JSON object: the whole file `path`, or its line `line` (JSON Lines); see the module doc."""
    where = f"{path}:{line}" if line else str(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        at = line or raw.count(b"\n", 0, e.start) + 1
        raise error(f"{path}:{at}: not UTF-8 (byte {raw[e.start]:#04x} at offset {e.start})") from None
    try:
        data = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{line or e.lineno}: not JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise error(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # NaN/Infinity, an int over Python's digit limit
        raise error(f"{where}: {str(e).split(';')[0]}") from None
    _walk(data, where, error)
    if not isinstance(data, dict):
        raise error(f"{where}: top level is {kind(data)}, expected an object")
    return data


def load(path: Path, error, max_bytes: int = MAX_BYTES) -> dict:
    """Read and parse one JSON object file; an unreadable or oversized file is `error("FILE: why")`."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_file():  # a FIFO would block open(), a device never ends
        raise error(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{path}: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise error(f"{path}: more than {max_bytes} bytes, the most a JSON export here may have")
    return loads(raw, path, error)


def iter_jsonl(
    path: Path, error, max_bytes: int = MAX_JSONL_BYTES, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-blank line of a JSON Lines file; each record must be an object."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise error(f"{path}: {e.strerror or e}") from None
    total = 0
    with f:
        n = 0
        while True:
            try:
                line = f.readline(max_line_bytes + 1)
            except OSError as e:
                raise error(f"{path}: {e.strerror or e}") from None
            if not line:
                return
            n += 1
            total += len(line)
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                raise error(f"{path}:{n}: a record of more than {max_line_bytes} bytes")
            if total > max_bytes:
                raise error(f"{path}:{n}: more than {max_bytes} bytes, the most a JSON Lines export here may have")
            if line.strip():
                yield n, loads(line, path, error, n)


def number(v) -> bool:
    """True for an int or a finite float (JSON numbers), False for a bool or anything else."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def kind(v) -> str:
    """How a JSON value is named in messages: 'an object', 'a string', 'null', ..."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number"
    )
