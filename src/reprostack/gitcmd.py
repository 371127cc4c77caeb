"""Run git non-interactively: no prompt, no stdin, a timeout, the user's global config ignored.

Every stage that touches git goes through `git()` so that a typo'd URL or a server that asks for
credentials fails fast with the command and git's own message, instead of hanging.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

DEFAULT_TIMEOUT_S = 600.0


class GitFailed(Exception):
    """git exited non-zero or timed out. `.stderr` holds git's message, `.argv` the command."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str, timed_out: bool = False):
        self.argv, self.returncode, self.stdout, self.stderr, self.timed_out = list(argv), returncode, stdout, stderr, timed_out
        what = "timed out" if timed_out else f"exit {returncode}"
        super().__init__(f"git {' '.join(argv[1:])}: {what}: {stderr.strip()[-2000:]}")


def git_env(extra: Mapping[str, str] | None = None, *, user: bool = False) -> dict[str, str]:
    """Environment for git: no terminal prompt, no askpass, no system/global config, fixed identity.

    user=True keeps the user's own config, GIT_* variables, identity and clock (only prompts stay off):
    for the one commit that is the user's (a bump branch), never for anything that must be reproducible.
    """
    env = dict(os.environ)
    if user:
        env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", **(extra or {})})
        return env
    for k in list(env):
        if k.startswith("GIT_") and k not in ("GIT_SSL_CAINFO", "GIT_SSH_COMMAND"):
            del env[k]
    env.update({
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/true",
        "SSH_ASKPASS": "/bin/true",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "reprostack", "GIT_AUTHOR_EMAIL": "reprostack@localhost",
        "GIT_COMMITTER_NAME": "reprostack", "GIT_COMMITTER_EMAIL": "reprostack@localhost",
        "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
        "LC_ALL": "C",
    })
    if extra:
        env.update(extra)
    return env


def git(*args: str, cwd: str | Path | None = None, timeout: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None, check: bool = True, input_bytes: bytes | None = None,
        user: bool = False, stderr: bool = False) -> str:
    """Run `git ARGS` in `cwd` and return stdout (text, stripped of the final newline).

    Raises GitFailed on non-zero exit (when `check`) or on timeout (the process is killed).
    `env` adds variables on top of git_env(). Commit dates are fixed so cherry-picks are reproducible;
    `user=True`: the user's config, identity and clock instead (see git_env). `stderr=True`: git's stderr
    is appended to what is returned (for what git reports only there, e.g. `apply --verbose`).
    """
    argv = ["git", *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, env=git_env(env, user=user), timeout=timeout,
                              stdin=subprocess.DEVNULL if input_bytes is None else None,
                              input=input_bytes, capture_output=True)
    except subprocess.TimeoutExpired as e:
        raise GitFailed(argv, None, _text(e.stdout), _text(e.stderr), timed_out=True) from None
    out, err = _text(proc.stdout), _text(proc.stderr)
    if check and proc.returncode != 0:
        raise GitFailed(argv, proc.returncode, out, err)
    if stderr:
        out += err
    return out[:-1] if out.endswith("\n") else out


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode("utf-8", "replace")
