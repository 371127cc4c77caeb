"""Build small local git repositories for tests: init, commit files, submodules, PR-style refs, pruning.

Generic helpers, no fixtures: every function takes paths and returns commit ids. All git runs go through
`reprostack.gitcmd.git`, so commits have a fixed identity and date (same content -> same id: give each
commit a distinct message when that matters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from reprostack.gitcmd import git


def init_repo(path: Path, *, bare: bool = False, branch: str = "main") -> Path:
    """Create an empty repository at `path` whose initial branch is `branch`; returns path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    git("init", "-q", f"--initial-branch={branch}", *(["--bare"] if bare else []), str(path))
    return path


def commit_files(repo: Path, files: Mapping[str, str | bytes | None], message: str) -> str:
    """Write `files` ({relative path: content, None deletes}) in work tree `repo`, commit them; returns the id."""
    for rel, content in files.items():
        p = Path(repo) / rel
        if content is None:
            git("rm", "-q", "--cached", "--ignore-unmatch", rel, cwd=repo)
            p.unlink(missing_ok=True)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        git("add", "--", rel, cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", message, cwd=repo)
    return head(repo)


def head(repo: Path, rev: str = "HEAD") -> str:
    """The commit id `rev` names in `repo`."""
    return git("rev-parse", f"{rev}^{{commit}}", cwd=repo)


def tree_of(repo: Path, rev: str = "HEAD") -> str:
    """The tree id of commit `rev`."""
    return git("rev-parse", f"{rev}^{{tree}}", cwd=repo)


def add_submodule(repo: Path, path: str, url: str, commit: str, message: str | None = None) -> str:
    """Record a gitlink `path` -> `commit` plus its .gitmodules entry (no clone, no network); commits it."""
    gm = Path(repo) / ".gitmodules"
    text = gm.read_text() if gm.exists() else ""
    text += f'[submodule "{path}"]\n\tpath = {path}\n\turl = {url}\n'
    gm.write_text(text)
    git("add", ".gitmodules", cwd=repo)
    git("update-index", "--add", "--cacheinfo", f"160000,{commit},{path}", cwd=repo)
    git("commit", "-q", "-m", message or f"add submodule {path}", cwd=repo)
    return head(repo)


def set_gitlink(repo: Path, path: str, commit: str, message: str) -> str:
    """Move an existing submodule gitlink to `commit` and commit it."""
    git("update-index", "--cacheinfo", f"160000,{commit},{path}", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return head(repo)


def make_pull_ref(repo: Path, number: int, base: str, commits: list[tuple[Mapping[str, str], str]]) -> list[str]:
    """Commit `commits` ([(files, message)]) on top of `base` reachable only from `refs/pull/N/head`.

    The current branch is restored afterwards. Returns the new commit ids in order.
    """
    branch = git("symbolic-ref", "--short", "HEAD", cwd=repo)
    git("checkout", "-q", "--detach", base, cwd=repo)
    ids = [commit_files(repo, files, msg) for files, msg in commits]
    git("update-ref", f"refs/pull/{number}/head", ids[-1], cwd=repo)
    git("checkout", "-q", branch, cwd=repo)
    return ids


def tag(repo: Path, name: str, rev: str, *, force: bool = False) -> None:
    """Create (or with force, move) a lightweight tag."""
    git("tag", *(["-f"] if force else []), name, rev, cwd=repo)


def set_config(repo: Path, key: str, value: str) -> None:
    git("config", key, value, cwd=repo)


def force_push_away(repo: Path, branch: str, to: str) -> None:
    """Reset `branch` to `to` (as a force-push would) and prune everything no longer reachable."""
    git("update-ref", f"refs/heads/{branch}", to, cwd=repo)
    prune_unreachable(repo)


def prune_unreachable(repo: Path) -> None:
    """Expire reflogs and gc so that unreachable objects are really gone."""
    git("reflog", "expire", "--expire=now", "--all", cwd=repo)
    git("gc", "-q", "--prune=now", cwd=repo)


def has_object(repo: Path, obj: str) -> bool:
    """True when `obj` (any rev expression) exists in `repo`."""
    out = git("cat-file", "--batch-check", cwd=repo, input_bytes=f"{obj}\n".encode())
    return not out.endswith("missing")
