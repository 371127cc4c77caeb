"""The whole-series check, before anything is written: objects present, patch files sound, statuses agreeing."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import PatchError
from ..gitcmd import GitFailed, git
from ..lock import GitPin, PatchEntry, PatchFileError, read_patch_file
from .errors import SeriesError, git_msg
from .headers import STATUS_RE, PatchHeader, check_patch_headers
from .targets import target_problems

_FULL_OID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def entry_label(pos: int, total: int, entry: PatchEntry) -> str:
    """`#POS of TOTAL KIND VALUE` (a cherry-pick by its 12-hex prefix): how messages name a series entry."""
    short = entry.value[:12] if entry.kind == "cherry-pick" else entry.value
    return f"#{pos} of {total} {entry.kind} {short}"


def patch_file_in(project_root: Path, value: str) -> Path:
    """The resolved path of patch file `value` under `project_root`; PatchError when it resolves outside."""
    root = project_root.resolve()
    p = (root / value).resolve()
    if p != root and root not in p.parents:
        raise PatchError(f"{value}: patch file is outside the project root {root}")
    return p


def _symlinks(src: Path, rev: str) -> set[str]:
    """Repository paths of the symlinks in the tree of `rev`."""
    out = git("ls-tree", "-r", "-z", "--full-tree", rev, cwd=src)
    return {rec.split("\t", 1)[1] for rec in out.split("\0") if rec.startswith("120000 ")}


def _abbreviated_binary(text: str) -> list[str]:
    """Paths of binary hunks whose `index` line is not full: git cannot apply them."""
    bad, path, index, is_binary = [], None, None, False

    def close():
        if path is not None and is_binary and not (index and all(_FULL_OID.match(x) for x in index)):
            bad.append(f"{path} (index {'..'.join(index) if index else 'missing'})")

    for line in text.split("\n"):
        line = line.rstrip("\r")
        m = re.match(r"^diff --git a/(.*) b/(.*)$", line)
        if m:
            close()
            path, index, is_binary = m.group(2), None, False
            continue
        m = re.match(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", line)
        if m and path is not None:
            index = (m.group(1), m.group(2))
        elif line == "GIT binary patch" or (line.startswith("Binary files ") and line.endswith(" differ")):
            is_binary = True
    close()
    return bad


def _parse_problems(path: Path, kind: str, cwd: Path) -> list[str]:
    """Structural problems of a patch file that no base can fix (checked before anything is applied)."""
    problems = []
    try:
        numstat = git("apply", "--numstat", "--", str(path.resolve()), cwd=cwd)
        if not numstat.strip():
            problems.append("`git apply --numstat` finds no change in it")
    except GitFailed as e:
        problems.append(f"does not parse as a patch: {git_msg(e)}")
    text = path.read_bytes().decode("utf-8", "replace")
    for b in _abbreviated_binary(text):
        problems.append(
            f"binary hunk for {b} has no full index line, git cannot apply binary patch without "
            f"full index line: regenerate it with `git {'format-patch' if kind == 'mbox' else 'diff'} "
            f"--binary --full-index`"
        )
    return problems


def check_series(pin: GitPin, src: str | Path, project_root: str | Path) -> dict[int, PatchHeader]:
    """Check everything about `pin`'s series that can be checked without applying it.

    Args:
        pin: the git pin whose `patches` are checked.
        src: a repository (working tree or bare) whose object db holds `pin.rev` and every cherry-pick.
        project_root: the folder the lock's `patches/...` paths are relative to.
    Returns:
        {1-based position: PatchHeader} for every committed patch file entry.
    Raises:
        SeriesError (a PatchError) listing every problem found: a series without `patched-tree`, the
        base commit missing or not with the pinned tree, a cherry-pick commit missing, a merge
        commit, a patch file missing / unparsable / with an abbreviated binary hunk / without a valid
        `Upstream-Status:` and description, or whose header disagrees with the lock's `upstream-status`.
    """
    src, project_root = Path(src), Path(project_root)
    total = len(pin.patches)
    problems: list[str] = []
    headers: dict[int, PatchHeader] = {}
    if total and not pin.patched_tree:
        problems.append("the series has no `patched-tree` to verify against")
    base_ok = _check_commits(pin, src, problems)
    _check_files(pin, src, project_root, base_ok, problems, headers)
    if problems:
        msg = (
            f"{pin.name}: patch series ({total} entries on {pin.rev}) fails its pre-check, nothing was applied:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
        raise SeriesError(msg, upstream=pin.name, problems=tuple(problems))
    return headers


def _check_commits(pin: GitPin, src: Path, problems: list[str]) -> bool:
    """The base commit and its tree, and every cherry-pick: in `src`'s object db, a full commit id, no merge.
    Appends to `problems`; returns whether the base is a commit there. SeriesError when the db cannot be read."""
    total = len(pin.patches)
    picks = [(pos, e) for pos, e in enumerate(pin.patches, 1) if e.kind == "cherry-pick"]
    names = [f"{pin.rev}^{{commit}}", f"{pin.rev}^{{tree}}"] + [f"{e.value}^{{commit}}" for _, e in picks]
    try:
        out = git(
            "cat-file",
            "--batch-check=%(objectname) %(objecttype)",
            cwd=src,
            input_bytes=("\n".join(names) + "\n").encode(),
        ).splitlines()
    except GitFailed as e:
        raise SeriesError(f"{pin.name}: cannot read the object db of {src}: {git_msg(e)}", upstream=pin.name) from None
    found = dict(zip(names, out))
    base = found.get(names[0], "")
    if not base.endswith(" commit"):
        problems.append(f"pinned base {pin.rev} is not a commit in {src}")
    else:
        base_tree = found[names[1]].split(" ")[0]
        if base_tree != pin.tree:
            problems.append(f"pinned base {pin.rev} has tree {base_tree}, the lock pins tree {pin.tree}")
    present = []
    for (pos, e), name in zip(picks, names[2:]):
        label = entry_label(pos, total, e)
        if not found.get(name, "").endswith(" commit"):
            where = f" (fetch it from {e.ref})" if e.ref else ""
            problems.append(f"{label}: commit {e.value} is not in the object db of {src}{where}")
        elif not found[name].startswith(e.value):
            problems.append(f"{label}: {e.value} resolves to {found[name].split()[0]}: give the full 40-hex commit")
        else:
            present.append((pos, e))
    if present:
        try:
            lines = git(
                "rev-list", "--no-walk=unsorted", "--parents", *[e.value for _, e in present], cwd=src
            ).splitlines()
        except GitFailed as e:
            raise SeriesError(f"{pin.name}: cannot read commits: {git_msg(e)}", upstream=pin.name) from None
        parents = {l.split()[0]: l.split()[1:] for l in lines if l.strip()}
        for pos, e in present:
            if len(parents.get(e.value, [])) > 1:
                problems.append(
                    f"{entry_label(pos, total, e)}: {e.value} is a merge commit; cherry-picking a merge "
                    f"needs a mainline the lock cannot express: pin its non-merge commits instead"
                )
    return base.endswith(" commit")


def _check_files(
    pin: GitPin, src: Path, project_root: Path, base_ok: bool, problems: list[str], headers: dict[int, PatchHeader]
) -> None:
    """Each entry's Upstream-Status; each patch file's path, sha256, targets (no path through a symlink of the base),
    headers (agreeing with the lock) and hunks. Appends to `problems`, fills `headers` {position: header}."""
    total = len(pin.patches)
    links: set[str] | None = None
    for pos, e in enumerate(pin.patches, 1):
        label = entry_label(pos, total, e)
        if not STATUS_RE.match(e.upstream_status or ""):
            problems.append(f"{label}: upstream-status {e.upstream_status!r} is not a valid Upstream-Status")
        if e.kind == "cherry-pick":
            continue
        if e.kind not in ("mbox", "diff"):
            problems.append(f"{label}: unknown patch kind {e.kind!r}")
            continue
        try:
            path = patch_file_in(project_root, e.value)
        except PatchError as err:
            problems.append(f"{label}: {err}")
            continue
        if not path.is_file():
            problems.append(f"{label}: patch file {path} not found")
            continue
        try:
            data = read_patch_file(project_root, e)
        except PatchFileError as err:
            problems.append(f"{label}: {e.where or 'the lock'}: {err}")
            continue
        if links is None:
            try:
                links = _symlinks(src, pin.rev) if base_ok else set()
            except GitFailed as err:
                problems.append(f"cannot list the symlinks of {pin.rev}: {git_msg(err)}")
                links = set()
        escapes, links = target_problems(data.decode("utf-8", "replace"), links)
        if escapes:
            problems.extend(f"{label}: {e.value} {p}" for p in escapes)
            continue
        try:
            header = check_patch_headers(path, e.kind)
        except PatchError as err:
            problems.append(f"{label}: {err}")
            continue
        headers[pos] = header
        if header.upstream_status != e.upstream_status:
            problems.append(
                f"{label}: {path} says `Upstream-Status: {header.upstream_status}` but the lock says "
                f"{e.upstream_status!r}: make them agree"
            )
        problems.extend(f"{label}: {path}: {p}" for p in _parse_problems(path, e.kind, src))
