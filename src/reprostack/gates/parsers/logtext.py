"""Launcher line prefixes: split `[rank3]: text` into the prefix and the text the program printed.

Known prefixes (any number of them, in any order, at the start of a line):
- ISO-8601 timestamps, bare (`2026-07-06T22:54:01.123Z `, kubectl `--timestamps`) or bracketed;
- torchrun: `[rank3]: ` (failing ranks' stderr) and `[default3]:` (`--tee` / log prefix);
- OpenMPI `--tag-output`: `[1,3]<stdout>:`;
- Slurm `srun --label`: `3: `.
"""

from __future__ import annotations

import json
import re

_PREFIX = re.compile(
    r"""^(?:
        \s*\d{4}-\d{2}-\d{2}[T\ ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+
      | \s*\[\d{4}-\d{2}-\d{2}[T\ ][^\]]*\]\s*
      | \s*\[(?:rank|default)\d+\]:\ ?
      | \s*\[\d+,\d+\]<std(?:out|err)>:\ ?
      | \s*\d+:\ 
    )+""",
    re.X,
)
_RANK = re.compile(r"\[(?:rank|default)(\d+)\]:|\[\d+,(\d+)\]<std|^\s*(\d+):\s")


def split_prefix(line: str) -> tuple[str, str]:
    """`(prefix, body)` of one log line; prefix is "" when the line carries none of the known ones."""
    m = _PREFIX.match(line)
    if not m:
        return "", line
    return m.group(0), line[m.end() :]


def prefix_rank(prefix: str) -> int | None:
    """The rank (or task id) named by a launcher prefix, e.g. 3 for `[rank3]: `; None when none is named."""
    m = _RANK.search(prefix)
    if not m:
        return None
    return int(next(g for g in m.groups() if g is not None))


def numbered_lines(text: str) -> list[tuple[int, str, str]]:
    """`(line_no, prefix, body)` for every line of `text`.

    Line numbers are 1-based and count `\\n` only (as `grep -n` does); a trailing `\\r` is dropped.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out = []
    for i, raw in enumerate(lines, start=1):
        prefix, body = split_prefix(raw.rstrip("\r"))
        out.append((i, prefix, body))
    return out


def tagged_json(text: str, tag: re.Pattern) -> list[tuple[int, object, str | None]]:
    """The JSON records our drivers print after their tag (`tag` has a group `json`), as (line number, value, None),
    or (line number, None, JSON error message) for a tagged line whose rest is no JSON. Never raises on content."""
    out = []
    for no, _pre, body in numbered_lines(text):
        m = tag.search(body)
        if not m:
            continue
        try:
            out.append((no, json.loads(m.group("json")), None))
        except json.JSONDecodeError as e:
            out.append((no, None, e.msg))
        except RecursionError:  # `[[[[...`: deeper than the decoder recurses
            out.append((no, None, "nested too deeply"))
    return out
