"""What project a run ran: the commit of this checkout and whether its tree was dirty (a report's
`provenance.project`), so every new report traces to a commit of this repository.

Two ways to know it:
- a git checkout (the project root is the top of its work tree): `HEAD` and `git status --porcelain` (tracked changes
  and untracked files git does not ignore: a gate spec not yet committed is a change); `source: "git"`;
- a copy without `.git` (the lent GPU machine gets the working tree's files only): a stamp written on the machine
  that has the checkout (`scripts/device/project_stamp.sh`: the commit and `git ls-tree -r` of it), named by
  $REPROSTACK_PROJECT_STAMP (named, it is used even where a `.git` is present: a copy may carry a stale one); each
  tracked file of the stamp is hashed here as a git blob and compared, so `dirty`
  says whether these files are the commit's, whatever the stamp's writer believed; `source: "stamp FILE"`.
Otherwise `commit` and `dirty` are None with the reason (`why`): never a guessed commit.

Invariants: never raises (a run is not stopped for its provenance); the stamp is untrusted input (bounded size, a
commit must be 40 hex, a path with `..` or absolute counts as changed, never read); at most MAX_CHANGED paths are
listed (`changed_count` says how many there are).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path, PurePosixPath

from .gitcmd import GitFailed, git

STAMP_ENV = "REPROSTACK_PROJECT_STAMP"
MAX_CHANGED = 20
MAX_STAMP_BYTES = 16 << 20
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_TREE_LINE = re.compile(r"^(?P<mode>[0-7]{6}) (?P<type>blob|commit|tree) (?P<id>[0-9a-f]{40})\t(?P<path>.+)$")


def state(root: Path, environ=None) -> dict:
    """`provenance.project` of a run from `root` (see the module doc)."""
    env = os.environ if environ is None else environ
    root = Path(root).resolve()
    stamp = env.get(STAMP_ENV)
    if stamp:  # named on purpose: it wins over a `.git` the copy may carry (the lent GPU's copy held the session's
        # first commit, 8bb97a9, under every later tree: its runs said "8bb97a9, dirty, 301 files changed")
        return _from_stamp(root, Path(stamp))
    got = _from_git(root)
    if got is not None:
        return got
    return {
        "commit": None,
        "dirty": None,
        "source": "none",
        "why": f"{root} is not a git checkout and ${STAMP_ENV} names no stamp (scripts/device/project_stamp.sh)",
    }


def _changed(paths: list[str]) -> dict:
    return {"dirty": bool(paths), "changed": paths[:MAX_CHANGED], "changed_count": len(paths)}


def _from_git(root: Path) -> dict | None:
    try:
        top = git("rev-parse", "--show-toplevel", cwd=root, timeout=60)
    except (GitFailed, OSError):
        return None
    if Path(top).resolve() != root:
        return None  # a folder inside some other checkout is not this project's checkout
    try:
        commit = git("rev-parse", "--verify", "HEAD^{commit}", cwd=root, timeout=60)
        raw = git(
            "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=normal", cwd=root, raw=True
        )
    except (GitFailed, OSError) as e:
        return {"commit": None, "dirty": None, "source": "git", "why": f"git could not say: {str(e)[:200]}"}
    items = raw.split(b"\0")
    paths, i = [], 0
    while i < len(items):
        e = items[i]
        i += 1
        if len(e) < 4:
            continue
        paths.append(os.fsdecode(e[3:]))
        if e[:1] in (b"R", b"C"):  # a rename or copy: the next item is its old path
            i += 1
    return {"commit": commit, **_changed(paths), "source": "git"}


def blob_id(data: bytes) -> str:
    """git's object id of a blob with these bytes (sha1 of `blob <size>\\0` + the bytes)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _from_stamp(root: Path, stamp: Path) -> dict:
    where = f"stamp {stamp}"
    try:
        if not stamp.is_file() or stamp.stat().st_size > MAX_STAMP_BYTES:
            raise OSError("not a file of at most 16 MiB")
        lines = stamp.read_text(errors="replace").splitlines()
    except OSError as e:
        return {"commit": None, "dirty": None, "source": where, "why": f"cannot read it: {e.strerror or e}"}
    commit = lines[0].strip() if lines else ""
    if not _HEX40.match(commit):
        return {"commit": None, "dirty": None, "source": where, "why": "its first line is not a 40-hex commit id"}
    changed = []
    for line in lines[1:]:
        m = _TREE_LINE.match(line)
        if m is None:
            changed.append(f"(stamp line not `mode type id<TAB>path`: {line[:60]!r})")
            continue
        if m["type"] != "blob":
            continue  # a submodule (commit) is not a file of this tree
        rel = PurePosixPath(m["path"])
        if rel.is_absolute() or ".." in rel.parts:
            changed.append(m["path"])
            continue
        p = root / rel
        try:
            data = os.readlink(p).encode() if m["mode"] == "120000" else p.read_bytes()
        except OSError:
            changed.append(m["path"])  # missing here
            continue
        if blob_id(data) != m["id"]:
            changed.append(m["path"])
    return {"commit": commit, **_changed(changed), "source": where}
