"""Run git non-interactively: no prompt, no stdin, a timeout, the user's global config ignored.

Every stage that touches git goes through `git()` so that a typo'd URL or a server that asks for
credentials fails fast with the command and git's own message, instead of hanging.

Invariants (untrusted locks, mirrors and caches; see docs/reliability.md):
- callers put `--` before positional URLs and refspecs, and `url_problem` refuses what git could read
  as an option or as a transport helper (`-...`, `ext::`, `fd::`, whitespace, control characters);
- transports are git's own allow-list (GIT_ALLOW_PROTOCOL): file, git, ssh, https only;
- repository-local config cannot run anything: hooks (`core.hooksPath=/dev/null`), fsmonitor, credential
  helpers and `core.sshCommand` (GIT_SSH_COMMAND wins over it) are overridden from the environment
  (GIT_CONFIG_COUNT, which ranks as `-c`), replace refs are ignored; `foreign_config` lists the keys of a
  repository's own config that reprostack never writes, so a cache repo that has them is refused;
- ssh never prompts: `-o BatchMode=yes -o ConnectTimeout=N` is appended to the ssh command (a user's own
  GIT_SSH_COMMAND is kept, the options appended to it; ssh takes an option's first value, so the user's
  own `-o` settings win);
- the timeout is `--git-timeout` / $REPROSTACK_GIT_TIMEOUT (default 600 s) per git command; `git_remote`
  retries transient network failures (timeouts, connection reset/refused, early EOF, HTTP 5xx) with
  exponential backoff, never "not found", "not our ref" or authentication errors;
- a repository owned by another uid (git: `detected dubious ownership`) fails with reprostack's advice, never git's
  `safe.directory` line alone (that global setting is ignored here).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

DEFAULT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 86400
TIMEOUT_ENV = "REPROSTACK_GIT_TIMEOUT"
ALLOWED_PROTOCOLS = "file:git:ssh:https"
SSH_CONNECT_TIMEOUT_S = 30
RETRIES = 3  # extra attempts of a network git command after a transient failure
RETRY_BACKOFF_S = 2.0  # first wait; doubled after each attempt

# git's config as set on the command line (GIT_CONFIG_COUNT ranks with `-c`, above a repo's own config):
# nothing a repository's config says may run a program.
_OVERRIDES = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("credential.helper", ""),
    ("core.askPass", "/bin/true"),
    ("core.attributesFile", os.devnull),
)

_SCHEME_URL = re.compile(r"^(https|ssh|git|file)://(?P<host>[^/]*)(?P<path>/.*)?$")
_AUTHORITY = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._~+%-]+)@)?(?P<host>[A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$"
)
_SCP_LIKE = re.compile(r"^(?:[A-Za-z0-9._~+-]+@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*):(?!:)(?P<path>.*)$")
_TRANSIENT = re.compile(
    r"early EOF|connection (?:was )?reset|connection refused|connection timed out|timed out"
    r"|the remote end hung up unexpectedly|RPC failed|HTTP 5\d\d|returned error: 5\d\d"
    r"|temporary failure|unexpected disconnect|broken pipe",
    re.I,
)
_PERMANENT = re.compile(
    r"not found|does not exist|not our ref|unadvertised object|couldn't find remote ref"
    r"|no such remote ref|authentication failed|permission denied|could not read username"
    r"|not appear to be a git repository|repository .* not found|HTTP 40\d|returned error: 40\d",
    re.I,
)


class GitFailed(Exception):
    """git exited non-zero or timed out. `.stderr` holds git's message, `.argv` the command."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str, timed_out: bool = False):
        self.argv, self.returncode, self.stdout, self.stderr, self.timed_out = (
            list(argv),
            returncode,
            stdout,
            stderr,
            timed_out,
        )
        what = "timed out" if timed_out else f"exit {returncode}"
        super().__init__(f"git {' '.join(argv[1:])}: {what}: {stderr.strip()[-2000:]}")


def url_problem(url: str, *, local: bool = False) -> str | None:
    """Why git must not be given `url` as a repository, or None when it may.

    Allowed: https://, ssh://, git://, file:// URLs, scp-like `[user@]host:path` (ssh), absolute paths
    and (`local=True`, for mirrors named by the operator) relative paths. Refused: an empty URL, a leading
    `-` (git would read an option such as --upload-pack), whitespace or control characters, `X::` transport
    helpers (ext::, fd::), any other scheme, a host starting with `-`.
    """
    if not url:
        return "is empty"
    if url.startswith("-"):
        return "starts with '-' (git would read it as an option)"
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        return "contains whitespace or control characters"
    if "::" in url.split("/", 1)[0]:
        return "names a git transport helper (`X::`), which is never allowed"
    m = _SCHEME_URL.match(url)
    if m:  # user, host and path each: never a leading '-' (ssh and git read them as options), only plain characters
        auth = m.group("host")
        if auth.startswith("-") or auth.rpartition("@")[2].startswith("-"):
            return "has a user or host starting with '-'"
        a = _AUTHORITY.match(auth)
        if not a:
            return "has a user or host part that is not plain letters, digits, '.', '-' (or an [IPv6] address)"
        if any((part or "").startswith("-") for part in (a.group("user"), a.group("host"))):
            return "has a user or host starting with '-'"
        if (m.group("path") or "/").lstrip("/").startswith("-"):
            return "has a path starting with '-'"
        if m.group(1) != "file" and not a.group("host"):
            return "has no host"
        if not (m.group("path") or "").strip("/"):
            return "has no repository path"
        return None
    if "://" in url:
        return f"uses scheme {url.split('://', 1)[0]!r}; allowed (lower case): https, ssh, git, file"
    if url.startswith("/"):
        return None
    scp = _SCP_LIKE.match(url)
    if scp and "/" not in url.split(":", 1)[0]:
        return "has a path starting with '-'" if scp.group("path").startswith("-") else None
    if local and not url.split("/", 1)[0].count(":"):
        return None
    return "is neither an https/ssh/git/file URL, nor `host:path`, nor an absolute path"


def default_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds allowed per git command: $REPROSTACK_GIT_TIMEOUT, else 600. Raises ValueError (naming the
    variable) when it is not a positive number."""
    raw = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
    return parse_timeout(raw, TIMEOUT_ENV) if raw else DEFAULT_TIMEOUT_S


def parse_timeout(raw: str, what: str) -> float:
    """`raw` as a number of seconds from 1 to 86400 (a day); ValueError `WHAT: ... is not a number of seconds
    from 1 to 86400` (0.001 would fail every command, 1e300 overflows the subprocess timer)."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1 <= value <= MAX_TIMEOUT_S:
        raise ValueError(f"{what}: {raw!r} is not a number of seconds from 1 to {MAX_TIMEOUT_S}")
    return value


def ssh_command(timeout: float, environ: Mapping[str, str] | None = None) -> str:
    """The ssh command git runs: the user's GIT_SSH_COMMAND (or `ssh`) plus BatchMode and ConnectTimeout."""
    base = (os.environ if environ is None else environ).get("GIT_SSH_COMMAND", "").strip() or "ssh"
    connect = max(1, min(int(timeout), SSH_CONNECT_TIMEOUT_S))
    return f"{base} -o BatchMode=yes -o ConnectTimeout={connect}"


# what `git init` (bare or not) writes into a repository's config
GIT_INIT_CONFIG_KEYS = (
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
)


def foreign_config(gitdir: str | Path, allowed: Sequence[str]) -> list[str]:
    """Keys set in `gitdir`/config that are not in `allowed` (lower-case names; includes are not followed,
    an include.* key is itself foreign). An unreadable config is reported as ["(unreadable config)"].

    What makes git read configuration from elsewhere is foreign too, since reprostack never writes it: a gitdir that
    is a symlink or a file (`gitdir: PATH`), a `commondir` file (git then reads that folder's config), a
    `config.worktree` or a `worktrees/` folder, a config that is not a plain file."""
    gd = Path(gitdir)
    if gd.is_symlink() or (gd.exists() and not gd.is_dir()):
        return [f"({gd.name} is a link or a gitfile, not the folder reprostack made)"]
    found = [f"({n})" for n in ("commondir", "config.worktree", "worktrees") if os.path.lexists(gd / n)]
    cfg = gd / "config"
    if cfg.is_symlink() or (os.path.lexists(cfg) and not cfg.is_file()):
        return found + ["(config is not a plain file)"]
    if found:
        return found
    if not cfg.is_file():
        return []
    try:
        out = git("config", "--file", str(cfg), "--null", "--name-only", "--list", timeout=60)
    except GitFailed:
        return ["(unreadable config)"]
    keys = [k.lower() for k in out.split("\0") if k]
    ok = {a.lower() for a in allowed}
    return list(dict.fromkeys(k for k in keys if k not in ok))


def git_env(
    extra: Mapping[str, str] | None = None, *, user: bool = False, timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, str]:
    """Environment for git: no terminal prompt, no askpass, no system/global config, fixed identity.

    user=True keeps the user's own config, GIT_* variables, identity and clock (only prompts stay off):
    for the one commit that is the user's (a bump branch), never for anything that must be reproducible.
    """
    env = dict(os.environ)
    if user:
        env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", **(extra or {})})
        return env
    for k in list(env):
        if k.startswith("GIT_") and k not in ("GIT_SSL_CAINFO",):
            del env[k]
    env.update(
        {
            "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS,
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_SSH_COMMAND": ssh_command(timeout),
            "GIT_CONFIG_COUNT": str(len(_OVERRIDES)),
            **{f"GIT_CONFIG_KEY_{i}": k for i, (k, _) in enumerate(_OVERRIDES)},
            **{f"GIT_CONFIG_VALUE_{i}": v for i, (_, v) in enumerate(_OVERRIDES)},
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "/bin/true",
            "SSH_ASKPASS": "/bin/true",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": "reprostack",
            "GIT_AUTHOR_EMAIL": "reprostack@localhost",
            "GIT_COMMITTER_NAME": "reprostack",
            "GIT_COMMITTER_EMAIL": "reprostack@localhost",
            "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
            "LC_ALL": "C",
        }
    )
    if extra:
        env.update(extra)
    return env


def git(
    *args: str,
    cwd: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    input_bytes: bytes | None = None,
    user: bool = False,
    stderr: bool = False,
    raw: bool = False,
):
    """Run `git ARGS` in `cwd` and return stdout (text, stripped of the final newline).

    Raises GitFailed on non-zero exit (when `check`) or on timeout (the process is killed).
    `env` adds variables on top of git_env(). Commit dates are fixed so cherry-picks are reproducible;
    `user=True`: the user's config, identity and clock instead (see git_env). `stderr=True`: git's stderr
    is appended to what is returned (for what git reports only there, e.g. `apply --verbose`). `raw=True`:
    stdout as bytes, untouched (for object contents that must hash to their name).
    """
    argv = ["git", *args]
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=git_env(env, user=user, timeout=timeout),
            timeout=timeout,
            stdin=subprocess.DEVNULL if input_bytes is None else None,
            input=input_bytes,
            capture_output=True,
        )
    except subprocess.TimeoutExpired as e:
        raise GitFailed(argv, None, _text(e.stdout), _text(e.stderr), timed_out=True) from None
    out, err = _text(proc.stdout), _text(proc.stderr)
    if check and proc.returncode != 0:
        raise GitFailed(argv, proc.returncode, out, err if user else foreign_owner_advice(err))
    if raw:
        return proc.stdout
    if stderr:
        out += err
    return out[:-1] if out.endswith("\n") else out


_DUBIOUS = re.compile(r"detected dubious ownership in repository at '(?P<path>[^'\n]*)'")


def foreign_owner_advice(err: str) -> str:
    """git's stderr, or, when git refused a repository owned by another uid (`detected dubious ownership`), one line
    that says what works with reprostack: git's own advice (`git config --global --add safe.directory`) cannot,
    since reprostack runs git without the user's global config (git_env)."""
    m = _DUBIOUS.search(err)
    if not m:
        return err
    path = m.group("path")
    try:
        owner = os.stat(path).st_uid
    except OSError:
        owner = None
    me = os.geteuid()
    who = f"uid {owner} ({_user_name(owner)})" if owner is not None else "another uid"
    return (
        f"{path} is owned by {who}, not by uid {me} ({_user_name(me)}) who runs reprostack, so git refuses it: use a "
        f"cache of your own (--cache DIR or REPROSTACK_CACHE=DIR), run as its owner, or chown -R {me} it; git's "
        f"`safe.directory` advice cannot help (reprostack ignores the global git config)"
    )


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return "no user name"


def transient(e: GitFailed) -> bool:
    """True for a failure worth retrying: a timeout or a network error git reports (connection reset or
    refused, early EOF, HTTP 5xx); never for a missing repository/ref or an authentication error."""
    if e.timed_out:
        return True
    return bool(_TRANSIENT.search(e.stderr)) and not _PERMANENT.search(e.stderr)


def git_remote(
    *args: str,
    cwd: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    retries: int | None = None,
    input_bytes: bytes | None = None,
) -> str:
    """`git(*args)` for a command that talks to a server (fetch, ls-remote): a transient failure
    (see `transient`) is retried up to `retries` (default RETRIES) more times, waiting RETRY_BACKOFF_S,
    then twice as long each time. The last failure is raised as GitFailed."""
    n = RETRIES if retries is None else retries
    for attempt in range(n + 1):
        try:
            return git(*args, cwd=cwd, timeout=timeout, input_bytes=input_bytes)
        except GitFailed as e:
            if attempt == n or not transient(e):
                raise
            time.sleep(RETRY_BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode("utf-8", "replace")
