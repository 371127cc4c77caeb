"""The paths a committed patch file touches must stay inside the work tree it is applied to.

git itself refuses some escapes when it applies (`invalid path '../x'`, `.git/...`, "affected file is beyond a
symbolic link"), but only half-way through a series and without naming the lock entry; others it lets through:
`+++ /abs/path` is stripped to a relative path (-p1) and applied, and a new symlink may point anywhere
(`../../..`, `/etc`), which a later build step then follows. This pre-check reads every path of every file
section (the `diff --git` line, `---`/`+++`, `rename`/`copy from`/`to`) and refuses, before anything is applied:
- an absolute path (`---`/`+++` other than /dev/null), a `..`, `.` or empty component, a `.git` component
  (any case) or a backslash;
- a path below a symlink: one in the base tree, or one a file entry of the series creates;
- a new symlink (mode 120000) whose target is absolute or climbs out of the tree.
"""

from __future__ import annotations

import posixpath
import re

_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "\\": "\\"}


def _unquote(s: str) -> str:
    """git's C-style quoted path (`"a/x\\ty"`, octal escapes) -> the path; an unquoted one unchanged."""
    m = _QUOTED.fullmatch(s)
    if not m:
        return s
    body, out, i = m.group(1), bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            n = body[i + 1]
            if n in "01234567" and re.match(r"[0-7]{3}", body[i + 1 : i + 4]):
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            out += _ESC.get(n, n).encode()
            i += 2
            continue
        out += c.encode()
        i += 1
    return out.decode("utf-8", "replace")


def _strip_ab(path: str) -> str | None:
    """The repository path of a header path (`a/x` -> `x`); None for /dev/null. An absolute path stays absolute."""
    if path == "/dev/null":
        return None
    if path.startswith(("a/", "b/")):
        return path[2:]
    return path


def _git_line_paths(rest: str) -> list[str]:
    """Paths of `diff --git <a> <b>` (quoted or not; unquoted with spaces: split where a/X == b/X)."""
    rest = rest.strip()
    if rest.startswith('"') or rest.endswith('"'):
        toks = [t for t in re.findall(r'"(?:[^"\\]|\\.)*"|\S+', rest)]
        return [_unquote(t) for t in toks[:2]]
    m = re.match(r"^a/(.*) b/(.*)$", rest)
    return [f"a/{m.group(1)}", f"b/{m.group(2)}"] if m else rest.split()[:2]


def path_problem(path: str) -> str | None:
    """Why the repository path `path` would leave (or reach into the .git of) the work tree, or None."""
    if path.startswith("/"):
        return "is absolute"
    if "\\" in path:
        return "has a backslash"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has a '..', '.' or empty component"
    if any(p.lower() == ".git" for p in parts):
        return "reaches into .git"
    return None


def _symlink_escapes(link: str, target: str) -> bool:
    if target.startswith("/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    return joined == ".." or joined.startswith("../")


def target_problems(text: str, symlinks: set[str]) -> tuple[list[str], set[str]]:
    """Problems of the patch `text` (an mbox or a plain diff) against the tree's `symlinks` (repository paths of
    the symlinks present before it applies). Returns (problems, the symlinks present after it)."""
    problems: list[str] = []
    links = set(symlinks)
    sections: list[dict] = []
    cur: dict | None = None
    lines = text.split("\n")
    old_left = new_left = 0  # lines still to come in the current hunk (counted from its @@ header)
    for i, raw in enumerate(lines):
        line = raw.rstrip("\r")
        if old_left > 0 or new_left > 0:
            tag = line[:1]
            if tag == "\\":
                continue
            if tag in (" ", ""):
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
                if cur is not None:
                    cur["added"].append(line[1:])
            else:
                old_left = new_left = 0  # a short hunk: git will refuse it; keep reading headers
            if old_left > 0 or new_left > 0 or tag in ("+", "-", " ", ""):
                continue
        if line.startswith("diff --git "):
            cur = {"paths": [], "mode": None, "added": []}
            sections.append(cur)
            cur["paths"] += [p for p in map(_strip_ab, _git_line_paths(line[len("diff --git ") :])) if p is not None]
            continue
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if cur is None or cur.get("hunks"):
                cur = {"paths": [], "mode": None, "added": []}
                sections.append(cur)
            for hdr in (line[4:], lines[i + 1].rstrip("\r")[4:]):
                p = _strip_ab(_unquote(hdr.split("\t", 1)[0].strip()))
                if p is not None:
                    cur["paths"].append(p)
            continue
        if cur is None:
            continue
        m = re.match(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@", line)
        if m:
            cur["hunks"] = True
            old_left = int(m.group(1)) if m.group(1) is not None else 1
            new_left = int(m.group(2)) if m.group(2) is not None else 1
            continue
        m = re.match(r"^(rename|copy) (from|to) (.*)$", line)
        if m:
            cur["paths"].append(_unquote(m.group(3)))
            continue
        m = re.match(r"^(new file mode|new mode) ([0-7]+)$", line)
        if m:
            cur["mode"] = m.group(2)

    for s in sections:
        for p in dict.fromkeys(s["paths"]):
            why = path_problem(p)
            if why:
                problems.append(f"touches {p!r}, which {why}: outside the work tree")
                continue
            parts = p.split("/")
            under = next(("/".join(parts[:k]) for k in range(1, len(parts)) if "/".join(parts[:k]) in links), None)
            if under:
                problems.append(f"touches {p!r} through the symlink {under!r}")
        if s["mode"] == "120000" and s["paths"]:
            link = s["paths"][-1]
            target = "".join(s["added"][:1])
            if _symlink_escapes(link, target):
                problems.append(f"makes {link!r} a symlink to {target!r}, outside the work tree")
            links.add(link)
        elif s["mode"] and s["paths"]:
            links.discard(s["paths"][-1])
    return problems, links
