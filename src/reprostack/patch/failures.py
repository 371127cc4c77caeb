"""Failure analysis: the files and hunks git could not apply or merge, named from its output and the patch."""

from __future__ import annotations

import re
from pathlib import Path


def _hunk_index(text: str) -> dict[str, list[tuple[int, str]]]:
    """{path: [(old start line, '@@ ... @@' header)]} of a patch text, for naming failed hunks."""
    hunks: dict[str, list[tuple[int, str]]] = {}
    old = new = None
    path = None
    for line in text.split("\n"):
        line = line.rstrip("\r")
        m = re.match(r"^diff --git a/(.*) b/(.*)$", line)
        if m:
            old, new = m.group(1), m.group(2)
            path = new
            continue
        if line.startswith("--- "):
            p = line[4:].split("\t")[0]
            old = p[2:] if p.startswith("a/") else (None if p == "/dev/null" else p)
            path = old or path
        elif line.startswith("+++ "):
            p = line[4:].split("\t")[0]
            new = p[2:] if p.startswith("b/") else (None if p == "/dev/null" else p)
            path = new or old or path
        m = re.match(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
        if m and path:
            for p in {old, new} - {None}:
                hunks.setdefault(p, []).append((int(m.group(1)), line))
    return hunks


def apply_failure(out: str, patch_text: str) -> tuple[list[str], list[str], list[str]]:
    """From git apply/am output: (files, hunks, git's error lines)."""
    files: list[str] = []
    hunks: list[str] = []
    errors = [l.strip() for l in out.splitlines() if l.startswith(("error:", "fatal:", "Patch failed at"))]
    index = _hunk_index(patch_text)

    def add(f):
        if f and f not in files:
            files.append(f)

    for line in out.splitlines():
        m = re.match(r"^error: patch failed: (.*):(\d+)$", line)
        if m:
            f, n = m.group(1), int(m.group(2))
            add(f)
            header = next((h for start, h in index.get(f, []) if start == n), None)
            hunks.append(f"{f}:{n}" + (f" (hunk {header})" if header else ""))
            continue
        for pat in (
            r"^error: (.*): patch does not apply$",
            r"^error: (.*): does not exist in index$",
            r"^error: (.*): already exists in (?:index|working directory)$",
            r"^error: cannot apply binary patch to '(.*)' without full index line$",
            r"^error: (.*): does not match index$",
            r"^error: (.*): No such file or directory$",
        ):
            m = re.match(pat, line)
            if m:
                add(m.group(1))
                break
    return files, hunks, errors


def conflict_hunks(work: Path, files: list[str]) -> list[str]:
    """`FILE:FIRST-LAST (conflict)` for each `<<<<<<<` ... `>>>>>>>` block left in `files` under `work`."""
    hunks = []
    for f in files:
        try:
            data = (work / f).read_bytes()
        except OSError:
            continue
        start = None
        for n, line in enumerate(data.split(b"\n"), 1):
            if line.startswith(b"<<<<<<<"):
                start = n
            elif line.startswith(b">>>>>>>") and start is not None:
                hunks.append(f"{f}:{start}-{n} (conflict)")
                start = None
    return hunks
