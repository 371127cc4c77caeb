"""What a committed patch file says about itself: `Upstream-Status:` and description, mbox or plain diff."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import PatchError
from ..gitcmd import GitFailed, git
from .errors import git_msg
from .. import schemas


def _status_pattern() -> re.Pattern:
    # One source of truth: the lock schema's definition of an Upstream-Status value.
    try:
        schema = schemas.load("lock")
        return re.compile(schema["$defs"]["upstream-status"]["pattern"])
    except (OSError, KeyError, ValueError):  # pragma: no cover - schema ships with the package
        return re.compile(r"^(Pending|Submitted \[.+\]|Accepted|Backport(ed)?( \[.+\])?|Denied|Inappropriate \[.+\])$")


STATUS_RE = _status_pattern()
_STATUS_LINE = re.compile(r"^\s*Upstream-Status:[ \t]*(.*?)\s*$", re.M)
_TRAILER = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)+:\s")  # Signed-off-by:, Upstream-Status:, ...


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


def _looks_like_mail(text: str) -> bool:
    first = text.lstrip("\r\n").split("\n", 1)[0]
    return first.startswith("From ") or first.startswith("From:")


def _is_diff_start(lines: list[str], i: int) -> bool:
    line = lines[i].rstrip("\r")
    if line.startswith(("diff --git ", "diff -", "Index: ")):
        return True
    return line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def split_plain(text: str) -> tuple[list[str], str]:
    """(comment lines before the diff, the diff text); the diff text is "" when there is none."""
    lines = text.split("\n")
    for i in range(len(lines)):
        if _is_diff_start(lines, i):
            return lines[:i], "\n".join(lines[i:])
    return lines, ""


def comment_block(comment: list[str]) -> list[str]:
    """The comment lines before a plain diff, without their `#` prefix and CR."""
    return [re.sub(r"^#[ \t]?", "", line.rstrip("\r")) for line in comment]


def _status_from(text: str, where: str, file: str) -> str:
    found = [m.group(1) for m in _STATUS_LINE.finditer(text)]
    if not found:
        raise PatchError(
            f"{file}: no `Upstream-Status:` header {where} (one of Pending, Submitted [where], "
            f"Backport [from], Inappropriate [why], Denied, Accepted)"
        )
    if len(set(found)) > 1:
        raise PatchError(f"{file}: conflicting Upstream-Status headers {where}: {', '.join(map(repr, found))}")
    status = found[0]
    if not STATUS_RE.match(status):
        raise PatchError(
            f"{file}: Upstream-Status {status!r} is not valid (expected one of Pending, "
            f"Submitted [where], Backport [from], Inappropriate [why], Denied, Accepted)"
        )
    return status


def _plain_header(text: str, file: str) -> PatchHeader:
    comment, diff = split_plain(text)
    if not diff:
        raise PatchError(f"{file}: no diff found (expected `diff --git`, `--- a/...`/`+++ b/...` or `Index:`)")
    block = comment_block(comment)
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
        raise PatchError(
            f"{file}: no description: the comment block before the diff needs a first paragraph "
            f"saying what the patch does (besides `Upstream-Status: {status}`)"
        )
    return PatchHeader(upstream_status=status, description=description, kind="diff")


def _mails(path: Path) -> list[tuple[dict[str, str], str, str]]:
    """Split an mbox exactly as `git am --keep-cr` does: [(info, message body, patch text)]."""
    with tempfile.TemporaryDirectory(prefix="reprostack-mbox-") as tmp:
        t = Path(tmp)
        try:
            count = int(git("mailsplit", "-b", "--keep-cr", f"-o{t}", "--", str(path.resolve()), cwd=t) or 0)
        except (GitFailed, ValueError) as e:
            raise PatchError(f"{path}: not a readable mbox: {git_msg(e)}") from None
        out = []
        for n in range(1, count + 1):
            mail = t / f"{n:04d}"
            try:
                info_text = git(
                    "mailinfo", "-u", str(t / "msg"), str(t / "patch"), cwd=t, input_bytes=mail.read_bytes()
                )
            except GitFailed as e:
                raise PatchError(f"{path}: mail {n} of {count} cannot be read by git mailinfo: {git_msg(e)}") from None
            info = {}
            for line in info_text.splitlines():
                k, _, v = line.partition(": ")
                if k and v:
                    info[k] = v.strip()
            out.append(
                (
                    info,
                    (t / "msg").read_bytes().decode("utf-8", "replace"),
                    (t / "patch").read_bytes().decode("utf-8", "replace"),
                )
            )
        return out


def _mbox_header(path: Path, file: str) -> PatchHeader:
    mails = _mails(path)
    if not mails:
        raise PatchError(f"{file}: no mail in mbox")
    statuses, subjects = [], []
    for n, (info, msg, patch) in enumerate(mails, 1):
        which = f"mail {n} of {len(mails)}" if len(mails) > 1 else "the mail"
        missing = [
            h
            for h, ok in (("From:", info.get("Author") or info.get("Email")), ("Subject:", info.get("Subject")))
            if not ok
        ]
        if missing:
            raise PatchError(
                f"{file}: {which} has no {' / '.join(missing)} header: a committed mbox is a "
                f"`git format-patch` file (a plain diff belongs under `diff:`)"
            )
        if not split_plain(patch)[1]:
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
