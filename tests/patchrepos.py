"""Local git repositories for the patch-stage tests: an upstream with a few commits, worktrees of it
as the fetch stage would leave them, and committed patch files. No network; everything through
reprostack.gitcmd.git (fixed identity and dates)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reprostack.gitcmd import git
from reprostack.lock import GitPin, PatchEntry

A_LINES = [f"line {i}" for i in range(1, 21)]


def text(lines: list[str], eol: str = "\n") -> bytes:
    return "".join(l + eol for l in lines).encode()


def commit(repo: Path, files: dict[str, bytes | None], message: str, date: int) -> str:
    """Write (bytes) or delete (None) `files` in `repo`, commit them, return the commit id."""
    for name, data in files.items():
        p = repo / name
        if data is None:
            git("rm", "-q", "--", name, cwd=repo)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        git("add", "--", name, cwd=repo)
    stamp = f"{1700000000 + date} +0000"
    git("commit", "-q", "-m", message, cwd=repo, env={"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})
    return git("rev-parse", "HEAD", cwd=repo)


def tree_of(repo: Path, rev: str) -> str:
    return git("rev-parse", f"{rev}^{{tree}}", cwd=repo)


@dataclass
class Upstream:
    """An upstream repo: `base` plus a linear feature line f1..f3, a rival r2 and two CRLF/binary commits.

    base: a.txt (20 lines), b.txt, crlf.txt (CRLF line ends), data.bin (binary)
    f1: a.txt line 3 changed        f2: b.txt changed            f3: a.txt line 15 changed
    r2 (on base, not on f-line): a.txt line 3 changed differently (conflicts with f1)
    c1 (on base): crlf.txt line 2 changed (CRLF kept)
    bin1 (on base): data.bin changed
    """

    path: Path
    commits: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> str:
        return self.commits[name]

    def tree(self, name: str) -> str:
        return tree_of(self.path, self.commits[name])


def make_upstream(root: Path) -> Upstream:
    repo = root / "upstream"
    repo.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=repo)
    up = Upstream(repo)
    a = list(A_LINES)
    up.commits["base"] = commit(
        repo,
        {
            "a.txt": text(a),
            "b.txt": b"bravo\n",
            "crlf.txt": text(["one", "two", "three"], "\r\n"),
            "data.bin": bytes(range(256)) * 4,
        },
        "base",
        0,
    )
    a1 = list(a)
    a1[2] = "line 3 changed by f1"
    up.commits["f1"] = commit(repo, {"a.txt": text(a1)}, "f1: change line 3\n\nUpstream-Status: Pending", 1)
    up.commits["f2"] = commit(
        repo,
        {"b.txt": b"bravo\ncharlie\n"},
        "f2: extend b\n\nSecond paragraph.\n\nUpstream-Status: Submitted [PR #2]",
        2,
    )
    a3 = list(a1)
    a3[14] = "line 15 changed by f3"
    up.commits["f3"] = commit(repo, {"a.txt": text(a3)}, "f3: change line 15", 3)

    git("checkout", "-q", "-b", "rival", up["base"], cwd=repo)
    ar = list(a)
    ar[2] = "line 3 changed by the rival"
    up.commits["r2"] = commit(repo, {"a.txt": text(ar)}, "r2: change line 3 differently", 4)

    git("checkout", "-q", "-b", "crlf", up["base"], cwd=repo)
    up.commits["c1"] = commit(
        repo,
        {"crlf.txt": text(["one", "TWO", "three"], "\r\n")},
        "c1: shout two\n\nUpstream-Status: Inappropriate [test only]",
        5,
    )

    git("checkout", "-q", "-b", "bin", up["base"], cwd=repo)
    up.commits["bin1"] = commit(repo, {"data.bin": bytes(range(255, -1, -1)) * 4}, "bin1: reverse data", 6)

    git("checkout", "-q", "--detach", up["base"], cwd=repo)
    git(
        "merge",
        "-q",
        "--no-ff",
        "-m",
        "merge f-line",
        up["f3"],
        cwd=repo,
        env={"GIT_AUTHOR_DATE": "1700000007 +0000", "GIT_COMMITTER_DATE": "1700000007 +0000"},
    )
    up.commits["merge"] = git("rev-parse", "HEAD", cwd=repo)
    git("checkout", "-q", "main", cwd=repo)
    return up


def worktree_at(up: Upstream, rev: str, path: Path) -> Path:
    """A work tree at `rev` sharing the upstream's objects, as the fetch stage leaves it."""
    git("clone", "-q", "--shared", "--no-checkout", str(up.path), str(path))
    git("checkout", "-q", "--detach", rev, cwd=path)
    return path


def format_patch(up: Upstream, rev: str, *extra: str) -> bytes:
    """`git format-patch -1 --stdout rev` bytes (a one-mail mbox)."""
    import subprocess

    from reprostack.gitcmd import git_env

    return subprocess.run(
        ["git", "format-patch", "-1", "--stdout", *extra, rev],
        cwd=up.path,
        env=git_env(),
        check=True,
        capture_output=True,
    ).stdout


def diff_bytes(up: Upstream, a: str, b: str, *extra: str) -> bytes:
    import subprocess

    from reprostack.gitcmd import git_env

    return subprocess.run(
        ["git", "diff", *extra, a, b], cwd=up.path, env=git_env(), check=True, capture_output=True
    ).stdout


SHA256: dict[str, str] = {}  # lock value -> sha256 of the bytes `write_patch` last wrote there (what a lock would pin)


def write_patch(project: Path, name: str, data: bytes) -> str:
    """Commit-style `patches/<name>` under `project`; returns the lock value `patches/<name>` (its sha256 in SHA256)."""
    import hashlib

    p = project / "patches" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    SHA256[f"patches/{name}"] = hashlib.sha256(data).hexdigest()
    return f"patches/{name}"


def pick(sha: str, status: str = "Pending", tree: str | None = None, index: int = 0) -> PatchEntry:
    return PatchEntry(
        kind="cherry-pick", value=sha, upstream_status=status, description=f"pick {sha[:7]}", tree=tree, index=index
    )


def pin_of(up: Upstream, entries: list[PatchEntry], patched_tree: str | None, name: str = "demo") -> GitPin:
    entries = [
        PatchEntry(
            kind=e.kind,
            value=e.value,
            upstream_status=e.upstream_status,
            ref=e.ref,
            description=e.description,
            tree=e.tree,
            index=i,
            sha256=e.sha256,
            where=e.where,
        )
        for i, e in enumerate(entries, 1)
    ]
    return GitPin(
        name=name,
        url=str(up.path),
        rev=up["base"],
        tree=up.tree("base"),
        patches=tuple(entries),
        patched_tree=patched_tree,
    )
