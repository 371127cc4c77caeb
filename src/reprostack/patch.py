"""Patch stage: replay an upstream's pinned patch series onto its pinned commit.

Invariants (each one is checked here, not assumed):

- zero fuzz: a cherry-pick is a plain 3-way merge whose conflicts are never resolved (no rerere, no
  `-X` strategy options); an `mbox` entry goes through `git am --keep-cr` and a `diff` entry through
  `git apply --index`, both without `--3way`, without `-C<n>` context reduction, without
  `--reject`, without `--ignore-whitespace` and with `--whitespace=nowarn` (whitespace is never
  "fixed"). Every context line must match byte for byte; git's only leeway is the line offset of a
  hunk. A hunk that would need fuzz is a failure.
- all-or-nothing: the whole series is checked before anything is written (every cherry-pick commit
  is in the object db and is not a merge, every committed patch file exists, parses, has no
  abbreviated binary hunk and carries an `Upstream-Status:` header equal to the lock's), then it is
  replayed in a fresh scratch repository next to `dest`. Only when every entry applied and the final
  tree equals the pinned `patched-tree` is the scratch renamed to `dest` (one `os.replace`). On any
  failure the scratch is removed and `dest` never appears.
- tree verified: the base commit must have the pinned base tree, every entry with a pinned `tree` is
  compared right after it applied, the final `HEAD^{tree}` must be `patched-tree`, and the working
  tree must be clean (what a build reads is what was verified).
- reproducible: git runs through `gitcmd.git()` (no user/system config, fixed identity and dates)
  with every behaviour-changing setting pinned on the command line, so the commit ids of a replay are
  the same on every machine; the *tree* is what is verified, the commit ids are reported.

`dest` shares its object database with `src` (`objects/info/alternates`, like `git clone --shared`):
`src` (and whatever it borrows from) must outlive `dest`. Submodules are not populated here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .errors import PatchError
from .gitcmd import GitFailed, git
from .lock import GitPin, PatchEntry

__all__ = [
    "AppliedEntry", "PatchHeader", "SeriesError", "SeriesResult",
    "apply_series", "check_patch_headers", "check_series",
]

# Every setting that could change what a replay produces, pinned (global/system config is already off).
_PINNED_CONFIG = (
    "core.autocrlf=false", "core.safecrlf=false", "core.quotePath=false", "core.hooksPath=/dev/null",
    "merge.renames=true", "merge.directoryRenames=conflict", "merge.conflictStyle=merge",
    "merge.renormalize=false", "diff.renames=true",
    "rerere.enabled=false", "rerere.autoUpdate=false",
    "apply.whitespace=nowarn", "apply.ignoreWhitespace=no",
    "am.threeWay=false", "am.keepcr=true", "am.messageId=false", "mailinfo.scissors=false",
    "commit.gpgSign=false", "gc.auto=0", "maintenance.auto=false", "advice.detachedHead=false",
    "init.defaultBranch=reprostack",
)
_CONFIG_ARGS = tuple(a for kv in _PINNED_CONFIG for a in ("-c", kv))

_FULL_OID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def _status_pattern() -> re.Pattern:
    # One source of truth: the lock schema's definition of an Upstream-Status value.
    try:
        schema = json.loads(resources.files("reprostack").joinpath("schemas/lock.schema.json").read_text())
        return re.compile(schema["$defs"]["upstream-status"]["pattern"])
    except (OSError, KeyError, ValueError):  # pragma: no cover - schema ships with the package
        return re.compile(r"^(Pending|Submitted \[.+\]|Accepted|Backport(ed)?( \[.+\])?|Denied|Inappropriate \[.+\])$")


STATUS_RE = _status_pattern()
_STATUS_LINE = re.compile(r"^\s*Upstream-Status:[ \t]*(.*?)\s*$", re.M)
_TRAILER = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)+:\s")  # Signed-off-by:, Upstream-Status:, ...


# --------------------------------------------------------------------------------------------------
# Results and errors


@dataclass(frozen=True)
class PatchHeader:
    """What a committed patch file says about itself.

    upstream_status: the `Upstream-Status:` value; description: the subject (mbox) or the first
    paragraph of the leading comment block (plain diff); kind: "mbox" or "diff"; messages: number of
    mails in an mbox (1 for a diff).
    """

    upstream_status: str
    description: str
    kind: str = "diff"
    messages: int = 1


@dataclass(frozen=True)
class AppliedEntry:
    """One series entry as replayed: `commit` is the new commit id in `dest`, `tree` its tree."""

    label: str
    kind: str
    value: str
    upstream_status: str
    commit: str
    tree: str


@dataclass(frozen=True)
class SeriesResult:
    """A verified patched tree at `path`: `head`/`tree` are the final commit and tree."""

    upstream: str
    base_rev: str
    base_tree: str
    entries: list[AppliedEntry]
    head: str
    tree: str
    path: Path


class SeriesError(PatchError):
    """A PatchError with the facts as attributes (the message already contains all of them).

    upstream; label ("#3 of 5 cherry-pick 146cc356aa00") and position (1-based) when one entry is at
    fault; upstream_status; files and hunks that failed; expected_tree/actual_tree for a tree mismatch;
    problems: every problem found by the pre-check.
    """

    def __init__(self, message: str, *, upstream: str, label: str | None = None, position: int | None = None,
                 upstream_status: str | None = None, files: tuple[str, ...] = (), hunks: tuple[str, ...] = (),
                 expected_tree: str | None = None, actual_tree: str | None = None,
                 problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.upstream, self.label, self.position, self.upstream_status = upstream, label, position, upstream_status
        self.files, self.hunks = tuple(files), tuple(hunks)
        self.expected_tree, self.actual_tree = expected_tree, actual_tree
        self.problems = tuple(problems)


# --------------------------------------------------------------------------------------------------
# Patch files: headers, structure


def _label(pos: int, total: int, entry: PatchEntry) -> str:
    short = entry.value[:12] if entry.kind == "cherry-pick" else entry.value
    return f"#{pos} of {total} {entry.kind} {short}"


def _looks_like_mail(text: str) -> bool:
    first = text.lstrip("\r\n").split("\n", 1)[0]
    return first.startswith("From ") or first.startswith("From:")


def _is_diff_start(lines: list[str], i: int) -> bool:
    line = lines[i].rstrip("\r")
    if line.startswith(("diff --git ", "diff -", "Index: ")):
        return True
    return line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _split_plain(text: str) -> tuple[list[str], str]:
    """(comment lines before the diff, the diff text); the diff text is "" when there is none."""
    lines = text.split("\n")
    for i in range(len(lines)):
        if _is_diff_start(lines, i):
            return lines[:i], "\n".join(lines[i:])
    return lines, ""


def _status_from(text: str, where: str, file: str) -> str:
    found = [m.group(1) for m in _STATUS_LINE.finditer(text)]
    if not found:
        raise PatchError(f"{file}: no `Upstream-Status:` header {where} (one of Pending, Submitted [where], "
                         f"Backport [from], Inappropriate [why], Denied, Accepted)")
    if len(set(found)) > 1:
        raise PatchError(f"{file}: conflicting Upstream-Status headers {where}: {', '.join(map(repr, found))}")
    status = found[0]
    if not STATUS_RE.match(status):
        raise PatchError(f"{file}: Upstream-Status {status!r} is not valid (expected one of Pending, "
                         f"Submitted [where], Backport [from], Inappropriate [why], Denied, Accepted)")
    return status


def _plain_header(text: str, file: str) -> PatchHeader:
    comment, diff = _split_plain(text)
    if not diff:
        raise PatchError(f"{file}: no diff found (expected `diff --git`, `--- a/...`/`+++ b/...` or `Index:`)")
    block = [re.sub(r"^#[ \t]?", "", line.rstrip("\r")) for line in comment]
    status = _status_from("\n".join(block), "in the comment block before the diff", file)
    description = ""
    para: list[str] = []
    for line in block + [""]:
        if line.strip():
            para.append(line.strip())
            continue
        words = [l for l in para if not _TRAILER.match(l)]
        para = []
        if words:
            description = " ".join(words)
            break
    if not description:
        raise PatchError(f"{file}: no description: the comment block before the diff needs a first paragraph "
                         f"saying what the patch does (besides `Upstream-Status: {status}`)")
    return PatchHeader(upstream_status=status, description=description, kind="diff")


def _mails(path: Path) -> list[tuple[dict[str, str], str, str]]:
    """Split an mbox exactly as `git am --keep-cr` does: [(info, message body, patch text)]."""
    with tempfile.TemporaryDirectory(prefix="reprostack-mbox-") as tmp:
        t = Path(tmp)
        try:
            count = int(git("mailsplit", "-b", "--keep-cr", f"-o{t}", "--", str(path.resolve()), cwd=t) or 0)
        except (GitFailed, ValueError) as e:
            raise PatchError(f"{path}: not a readable mbox: {_git_msg(e)}") from None
        out = []
        for n in range(1, count + 1):
            mail = t / f"{n:04d}"
            try:
                info_text = git("mailinfo", "-u", str(t / "msg"), str(t / "patch"), cwd=t,
                                input_bytes=mail.read_bytes())
            except GitFailed as e:
                raise PatchError(f"{path}: mail {n} of {count} cannot be read by git mailinfo: {_git_msg(e)}") from None
            info = {}
            for line in info_text.splitlines():
                k, _, v = line.partition(": ")
                if k and v:
                    info[k] = v.strip()
            out.append((info, (t / "msg").read_bytes().decode("utf-8", "replace"),
                        (t / "patch").read_bytes().decode("utf-8", "replace")))
        return out


def _mbox_header(path: Path, file: str) -> PatchHeader:
    mails = _mails(path)
    if not mails:
        raise PatchError(f"{file}: no mail in mbox")
    statuses, subjects = [], []
    for n, (info, msg, patch) in enumerate(mails, 1):
        which = f"mail {n} of {len(mails)}" if len(mails) > 1 else "the mail"
        missing = [h for h, ok in (("From:", info.get("Author") or info.get("Email")), ("Subject:", info.get("Subject")))
                   if not ok]
        if missing:
            raise PatchError(f"{file}: {which} has no {' / '.join(missing)} header: a committed mbox is a "
                             f"`git format-patch` file (a plain diff belongs under `diff:`)")
        if not _split_plain(patch)[1]:
            raise PatchError(f"{file}: {which} ({info['Subject']!r}) carries no diff")
        statuses.append(_status_from(msg, f"in the commit message body of {which}", file))
        subjects.append(info["Subject"])
    if len(set(statuses)) > 1:
        raise PatchError(f"{file}: the mails disagree on Upstream-Status: {', '.join(map(repr, statuses))}")
    return PatchHeader(upstream_status=statuses[0], description=subjects[0], kind="mbox", messages=len(mails))


def check_patch_headers(path: str | Path, kind: str | None = None) -> PatchHeader:
    """Read the self-description every committed patch file must carry.

    Args:
        path: the patch file.
        kind: "mbox" (a `git format-patch` file: `Upstream-Status:` must be in the commit message body
            of every mail; the description is the Subject) or "diff" (a plain diff: `Upstream-Status:`
            and a first-paragraph description in the comment block before the diff, lines may be
            prefixed with `#`). None: guessed from the file (a leading `From ` line means mbox).
    Returns:
        PatchHeader(upstream_status, description, kind, messages).
    Raises:
        PatchError naming the file: unreadable, no diff, an mbox without From/Subject, a missing,
        conflicting or invalid `Upstream-Status:`, or no description. A file declared `diff` that is
        really a mail is refused too (its author and message would be lost: declare it `mbox`).
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError as e:
        raise PatchError(f"{path}: cannot read patch file: {e.strerror or e}") from None
    is_mail = _looks_like_mail(text)
    kind = kind or ("mbox" if is_mail else "diff")
    if kind == "mbox":
        return _mbox_header(path, str(path))
    if kind == "diff":
        if is_mail:
            raise PatchError(f"{path}: is a mail (`git format-patch` output), not a plain diff: declare it `mbox:`")
        return _plain_header(text, str(path))
    raise PatchError(f"{path}: unknown patch kind {kind!r} (mbox or diff)")


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
        problems.append(f"does not parse as a patch: {_git_msg(e)}")
    text = path.read_bytes().decode("utf-8", "replace")
    for b in _abbreviated_binary(text):
        problems.append(f"binary hunk for {b} has no full index line, git cannot apply binary patch without "
                        f"full index line: regenerate it with `git {'format-patch' if kind == 'mbox' else 'diff'} "
                        f"--binary --full-index`")
    return problems


# --------------------------------------------------------------------------------------------------
# Pre-check of a whole series


def _git_msg(e: Exception) -> str:
    if isinstance(e, GitFailed):
        text = (e.stderr.strip() or e.stdout.strip() or str(e)).splitlines()
        return " / ".join(l.strip() for l in text[-6:] if l.strip())
    return str(e)


def _patch_file(project_root: Path, value: str) -> Path:
    root = project_root.resolve()
    p = (root / value).resolve()
    if p != root and root not in p.parents:
        raise PatchError(f"{value}: patch file is outside the project root {root}")
    return p


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

    picks = [(pos, e) for pos, e in enumerate(pin.patches, 1) if e.kind == "cherry-pick"]
    names = [f"{pin.rev}^{{commit}}", f"{pin.rev}^{{tree}}"] + [f"{e.value}^{{commit}}" for _, e in picks]
    try:
        out = git("cat-file", "--batch-check=%(objectname) %(objecttype)", cwd=src,
                  input_bytes=("\n".join(names) + "\n").encode()).splitlines()
    except GitFailed as e:
        raise SeriesError(f"{pin.name}: cannot read the object db of {src}: {_git_msg(e)}", upstream=pin.name) from None
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
        label = _label(pos, total, e)
        if not found.get(name, "").endswith(" commit"):
            where = f" (fetch it from {e.ref})" if e.ref else ""
            problems.append(f"{label}: commit {e.value} is not in the object db of {src}{where}")
        elif not found[name].startswith(e.value):
            problems.append(f"{label}: {e.value} resolves to {found[name].split()[0]}: give the full 40-hex commit")
        else:
            present.append((pos, e))
    if present:
        try:
            lines = git("rev-list", "--no-walk=unsorted", "--parents", *[e.value for _, e in present], cwd=src).splitlines()
        except GitFailed as e:
            raise SeriesError(f"{pin.name}: cannot read commits: {_git_msg(e)}", upstream=pin.name) from None
        parents = {l.split()[0]: l.split()[1:] for l in lines if l.strip()}
        for pos, e in present:
            if len(parents.get(e.value, [])) > 1:
                problems.append(f"{_label(pos, total, e)}: {e.value} is a merge commit; cherry-picking a merge "
                                f"needs a mainline the lock cannot express: pin its non-merge commits instead")

    for pos, e in enumerate(pin.patches, 1):
        label = _label(pos, total, e)
        if not STATUS_RE.match(e.upstream_status or ""):
            problems.append(f"{label}: upstream-status {e.upstream_status!r} is not a valid Upstream-Status")
        if e.kind == "cherry-pick":
            continue
        if e.kind not in ("mbox", "diff"):
            problems.append(f"{label}: unknown patch kind {e.kind!r}")
            continue
        try:
            path = _patch_file(project_root, e.value)
        except PatchError as err:
            problems.append(f"{label}: {err}")
            continue
        if not path.is_file():
            problems.append(f"{label}: patch file {path} not found")
            continue
        try:
            header = check_patch_headers(path, e.kind)
        except PatchError as err:
            problems.append(f"{label}: {err}")
            continue
        headers[pos] = header
        if header.upstream_status != e.upstream_status:
            problems.append(f"{label}: {path} says `Upstream-Status: {header.upstream_status}` but the lock says "
                            f"{e.upstream_status!r}: make them agree")
        problems.extend(f"{label}: {path}: {p}" for p in _parse_problems(path, e.kind, src))

    if problems:
        msg = (f"{pin.name}: patch series ({total} entries on {pin.rev}) fails its pre-check, nothing was applied:\n"
               + "\n".join(f"  - {p}" for p in problems))
        raise SeriesError(msg, upstream=pin.name, problems=tuple(problems))
    return headers


# --------------------------------------------------------------------------------------------------
# Failure analysis


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


def _apply_failure(out: str, patch_text: str) -> tuple[list[str], list[str], list[str]]:
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
        for pat in (r"^error: (.*): patch does not apply$", r"^error: (.*): does not exist in index$",
                    r"^error: (.*): already exists in (?:index|working directory)$",
                    r"^error: cannot apply binary patch to '(.*)' without full index line$",
                    r"^error: (.*): does not match index$", r"^error: (.*): No such file or directory$"):
            m = re.match(pat, line)
            if m:
                add(m.group(1))
                break
    return files, hunks, errors


def _conflict_hunks(work: Path, files: list[str]) -> list[str]:
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


# --------------------------------------------------------------------------------------------------
# Replay


class _Scratch:
    """The scratch repository: git with the pinned config, run in its work tree."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, *args: str, check: bool = True, input_bytes: bytes | None = None) -> str:
        return git(*_CONFIG_ARGS, *args, cwd=self.path, check=check, input_bytes=input_bytes)

    def head(self) -> tuple[str, str]:
        head, tree = self("rev-parse", "HEAD", "HEAD^{tree}").split()
        return head, tree


class _EntryFailed(Exception):
    def __init__(self, reason: str, files=(), hunks=(), details=(), tree: str | None = None, changed=()):
        self.reason, self.files, self.hunks, self.details, self.tree = reason, list(files), list(hunks), list(details), tree
        self.changed = list(changed)


def _objects_dir(src: Path) -> Path:
    p = Path(git("rev-parse", "--git-path", "objects", cwd=src))
    return (p if p.is_absolute() else src / p).resolve()


def _pick(g: _Scratch, e: PatchEntry) -> None:
    try:
        g("cherry-pick", "-x", "--strategy=ort", e.value)
    except GitFailed as err:
        out = f"{err.stdout}\n{err.stderr}"
        unmerged = [f for f in g("diff", "--name-only", "--diff-filter=U", check=False).splitlines() if f]
        conflicts = [l.strip() for l in out.splitlines() if l.startswith("CONFLICT")]
        if unmerged or conflicts:
            files = list(unmerged)
            for c in conflicts:
                m = re.search(r"Merge conflict in (.*)$", c)
                if m and m.group(1) not in files:
                    files.append(m.group(1))
            raise _EntryFailed("3-way merge conflict (zero fuzz: a conflict is never resolved)", files,
                               _conflict_hunks(g.path, unmerged), conflicts) from None
        if "now empty" in out or "nothing to commit" in out:
            raise _EntryFailed("the change is already in the base: the cherry-pick is empty (upstream may have "
                               "merged it: drop the entry or re-pin the base)") from None
        raise _EntryFailed("git cherry-pick failed", details=[_git_msg(err)]) from None


def _am(g: _Scratch, path: Path) -> None:
    try:
        g("am", "--keep-cr", "--no-3way", "--whitespace=nowarn", "--", str(path))
    except GitFailed as err:
        out = f"{err.stdout}\n{err.stderr}"
        files, hunks, errors = _apply_failure(out, path.read_bytes().decode("utf-8", "replace"))
        reason = "does not apply with zero fuzz (git am --keep-cr, no 3-way)"
        if "Patch is empty" in out:
            reason = "a mail of it is empty"
        raise _EntryFailed(reason, files, hunks, errors or [_git_msg(err)]) from None


def _apply_diff(g: _Scratch, path: Path, header: PatchHeader) -> None:
    text = path.read_bytes().decode("utf-8", "replace")
    try:
        g("apply", "--index", "--whitespace=nowarn", "--", str(path))
    except GitFailed as err:
        files, hunks, errors = _apply_failure(f"{err.stdout}\n{err.stderr}", text)
        raise _EntryFailed("does not apply with zero fuzz (git apply --index)", files, hunks,
                           errors or [_git_msg(err)]) from None
    comment, _ = _split_plain(text)
    block = "\n".join(re.sub(r"^#[ \t]?", "", l.rstrip("\r")) for l in comment).strip()
    message = block if block else f"{header.description}\n\nUpstream-Status: {header.upstream_status}"
    try:
        g("commit", "-q", "--no-verify", "--cleanup=strip", "-F", "-", input_bytes=(message + "\n").encode())
    except GitFailed as err:
        reason = "changes nothing on this base (already applied?)" if "nothing" in err.stdout + err.stderr else "commit failed"
        raise _EntryFailed(reason, details=[_git_msg(err)]) from None


def _changed(g: _Scratch, a: str, b: str, limit: int = 20) -> list[str]:
    if not _exists(g, f"{a}^{{tree}}"):
        return []
    out = g("diff-tree", "-r", "--name-status", "--no-renames", a, b, check=False).splitlines()
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def _exists(g: _Scratch, oid: str) -> bool:
    try:
        g("cat-file", "-e", oid)
        return True
    except GitFailed:
        return False


def apply_series(pin: GitPin, src: str | Path, dest: str | Path, project_root: str | Path) -> SeriesResult:
    """Replay `pin.patches` onto `pin.rev` and put the verified result at `dest`, or nothing at all.

    Args:
        pin: a git pin with its patch series and `patched_tree`.
        src: a repository at `pin.rev` whose object db already holds every cherry-pick commit (made by
            the fetch stage). Only its object db is read; its work tree is left alone.
        dest: where the patched work tree goes; it must not exist. Its parent is created if needed.
        project_root: the folder the lock's `patches/...` paths are relative to.
    Returns:
        SeriesResult(upstream, base_rev, base_tree, entries, head, tree, path=dest). `dest` is a git work
        tree at `head` (detached; `refs/reprostack/base` marks `pin.rev`) borrowing objects from `src`.
    Raises:
        PatchError (a SeriesError with the facts as attributes): `dest` exists; the pre-check failed
        (see `check_series`; nothing was created); an entry did not apply with zero fuzz; an entry's
        pinned `tree` or the final `patched_tree` differs from what was produced. The message names the
        upstream, the entry ("#3 of 5 cherry-pick 146cc356aa00"), its Upstream-Status, the files and
        hunks that failed, "pinned base <rev>, actual base <HEAD before the entry>" and, for a tree
        mismatch, the expected and actual trees. The scratch is removed and `dest` does not appear.
    """
    src, dest, project_root = Path(src), Path(dest), Path(project_root)
    if dest.exists() or dest.is_symlink():
        raise SeriesError(f"{pin.name}: destination {dest} already exists; the patch stage never overwrites",
                          upstream=pin.name)
    headers = check_series(pin, src, project_root)
    objects = _objects_dir(src)
    total = len(pin.patches)
    expected = pin.patched_tree if total else (pin.patched_tree or pin.tree)

    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dest.name}.patching-", dir=dest.parent))
    done = False
    try:
        g = _Scratch(scratch)
        g("init", "-q")
        alternates = Path(g("rev-parse", "--git-path", "objects/info/alternates"))
        alternates = alternates if alternates.is_absolute() else scratch / alternates
        alternates.write_text(f"{objects}\n")
        g("checkout", "-q", "--detach", pin.rev)
        base_rev, base_tree = g.head()
        if base_tree != pin.tree:  # check_series saw it already; this guards the checkout itself
            raise SeriesError(f"{pin.name}: base {base_rev} checked out with tree {base_tree}, pinned {pin.tree}",
                              upstream=pin.name, expected_tree=pin.tree, actual_tree=base_tree)
        g("update-ref", "refs/reprostack/base", base_rev)

        entries: list[AppliedEntry] = []
        for pos, e in enumerate(pin.patches, 1):
            label = _label(pos, total, e)
            before, before_tree = g.head()
            try:
                if e.kind == "cherry-pick":
                    _pick(g, e)
                elif e.kind == "mbox":
                    _am(g, _patch_file(project_root, e.value))
                else:
                    _apply_diff(g, _patch_file(project_root, e.value), headers[pos])
                head, tree = g.head()
                if head == before:
                    raise _EntryFailed("produced no commit")
                if e.tree and tree != e.tree:
                    raise _EntryFailed(f"tree checkpoint mismatch: expected tree {e.tree}, actual tree {tree}",
                                       changed=_changed(g, e.tree, tree) or
                                       [f"(expected tree {e.tree[:12]} is not in the object db; this entry changed:)"]
                                       + _changed(g, before_tree, tree), tree=tree)
            except _EntryFailed as f:
                raise _entry_error(pin, g, dest, pos, e, label, before, before_tree, f) from None
            entries.append(AppliedEntry(label=label, kind=e.kind, value=e.value, upstream_status=e.upstream_status,
                                        commit=head, tree=tree))

        head, tree = g.head()
        if tree != expected:
            changed = _changed(g, expected, tree) or [f"(expected tree {expected} is not in the object db; "
                                                      f"the series changed:)"] + _changed(g, base_tree, tree)
            msg = (f"{pin.name}: the series applied but produced the wrong tree: expected tree {expected} "
                   f"(patched-tree), actual tree {tree} (HEAD {head})\n"
                   f"  pinned base {pin.rev}, actual base {base_rev}; {total} entries applied\n"
                   + "".join(f"  {l}\n" for l in changed)
                   + f"  nothing was written: {dest} was not created")
            raise SeriesError(msg, upstream=pin.name, expected_tree=expected, actual_tree=tree)
        dirty = g("status", "--porcelain", "--untracked-files=all").splitlines()
        if dirty:
            raise SeriesError(f"{pin.name}: the work tree differs from the verified tree after the series:\n"
                              + "".join(f"  {l}\n" for l in dirty[:20])
                              + f"  nothing was written: {dest} was not created", upstream=pin.name)
        if dest.exists() or dest.is_symlink():
            raise SeriesError(f"{pin.name}: {dest} appeared while the series was applied; not overwritten",
                              upstream=pin.name)
        os.chmod(scratch, 0o755)
        try:
            os.replace(scratch, dest)
        except OSError as err:
            raise SeriesError(f"{pin.name}: cannot move the verified tree to {dest}: {err}", upstream=pin.name) from None
        done = True
    finally:
        if not done:
            shutil.rmtree(scratch, ignore_errors=True)
    return SeriesResult(upstream=pin.name, base_rev=base_rev, base_tree=base_tree, entries=entries,
                        head=head, tree=tree, path=dest)


def _entry_error(pin: GitPin, g: _Scratch, dest: Path, pos: int, e: PatchEntry, label: str, before: str,
                 before_tree: str, f: _EntryFailed) -> SeriesError:
    lines = [f"{pin.name}: {label} (Upstream-Status: {e.upstream_status}): {f.reason}"]
    if e.description:
        lines.append(f"description: {e.description}")
    if e.kind != "cherry-pick":
        lines.append(f"patch file: {e.value}")
    if f.files:
        lines.append(f"files: {', '.join(f.files)}")
    if f.hunks:
        lines.append(f"hunks: {'; '.join(f.hunks)}")
    base = f"pinned base {pin.rev}, actual base {before} (tree {before_tree}"
    base += ")" if pos == 1 else (", after entry #1)" if pos == 2 else f", after entries #1..#{pos - 1})")
    if e.kind == "cherry-pick":
        parent = g("rev-parse", "-q", "--verify", f"{e.value}^", check=False)
        if parent:
            base += f"; the commit's own parent is {parent}"
    lines.append(base)
    lines.extend(f"git: {d}" for d in f.details[:12])
    lines.extend(f.changed)
    lines.append(f"nothing was written: the scratch tree was removed and {dest} was not created")
    return SeriesError("\n  ".join(lines), upstream=pin.name, label=label, position=pos,
                       upstream_status=e.upstream_status, files=tuple(f.files), hunks=tuple(f.hunks),
                       expected_tree=e.tree if f.tree else None, actual_tree=f.tree)
