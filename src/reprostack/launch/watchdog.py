"""Run a gate's command with a hard time limit, keeping its merged output, and never leave processes behind.

The command runs in its own session (so its own process group, pgid == its pid), stdin from /dev/null,
stdout and stderr merged into one pipe that is written line by line to the log (and echoed). On timeout
every process of the run gets SIGTERM, then SIGKILL after `grace_s` if any is still alive; processes left
after a normal exit get the same treatment (torchrun workers holding GPUs must not outlive the gate).

"Every process of the run" is not only the process group: a child may call setsid() (its own session and
group) and its parent may exit, which orphans it. So (Linux, from /proc) a run's processes are
- the members of its process group;
- the descendants of its leader (walking PPid), whatever their session or group;
- every process below us that carries the run's cookie in its environment (`REPROSTACK_WATCHDOG_RUN=...`,
  inherited across fork/exec/setsid, as Jenkins' ProcessTreeKiller does). We make ourselves a child
  subreaper (prctl PR_SET_CHILD_SUBREAPER) so that an orphan is re-parented to us instead of init and
  stays below us; the killed orphans that became our children are reaped (waitpid) so no zombie is left.
A process that both escapes the tree and clears its environment is out of reach (a cgroup would reach it;
the hosts we run on do not always let us create one). Elsewhere than Linux only the group is known.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

WATCHDOG_TAG = "[reprostack watchdog]"
_LINE_MAX = 1 << 20  # bytes the log pump reads at a time (one line, or a piece of an overlong one)
COOKIE_ENV = "REPROSTACK_WATCHDOG_RUN"
_READER_JOIN_S = 5.0
_PR_SET_CHILD_SUBREAPER = 36
_subreaper: bool | None = None


@dataclass(frozen=True)
class RunOutcome:
    """How a watched command ended.

    returncode: the leader's exit status (negative: killed by that signal); timed_out: the time limit was hit;
    signal_name: e.g. "SIGKILL" when the leader died of a signal, else None; duration_s: wall seconds from
    start to the leader's exit (a timeout's grace period included); log_path: the merged log; killed_pids: group members alive when we signalled
    them (empty when nothing had to be killed); note: the watchdog line appended to the log, if any.
    """

    returncode: int
    timed_out: bool
    signal_name: str | None
    duration_s: float
    log_path: Path
    killed_pids: tuple[int, ...] = ()
    note: str | None = field(default=None)


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux prctl), once: orphaned descendants are re-parented to us, not
    to init. Returns whether it is one. Harmless elsewhere (False)."""
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                _subreaper = False
    return _subreaper


def _table() -> dict[int, tuple[str, int, int]]:
    """{pid: (state, ppid, pgid)} of every process in /proc; {} when /proc is absent."""
    out: dict[int, tuple[str, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # comm may hold spaces or parentheses
        if len(fields) >= 3:
            out[int(name)] = (fields[0], int(fields[1]), int(fields[2]))
    return out


def _descendants(table: dict[int, tuple[str, int, int]], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _has_cookie(pid: int, cookie: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return cookie in f.read().split(b"\0")
    except OSError:
        return False


def run_pids(leader: int | None, pgid: int, cookie: str | None) -> list[int]:
    """Live (non-zombie) processes of a run: its process group, the descendants of its `leader` (None once the
    leader was reaped: its pid may be reused), and (with `cookie`) the processes below us (every process, when
    we are not a subreaper) whose environment carries it."""
    table = _table()
    found = {pid for pid, (state, _, pg) in table.items() if pg == pgid}
    if leader is not None:
        found |= _descendants(table, {leader})
    if cookie:
        me = os.getpid()
        pool = _descendants(table, {me}) if _subreaper else set(table)
        token = f"{COOKIE_ENV}={cookie}".encode()
        found |= {pid for pid in pool - found if pid != me and _has_cookie(pid, token)}
    return sorted(pid for pid in found if pid in table and table[pid][0] not in ("Z", "X"))


def with_cookie(env: dict[str, str] | None) -> tuple[dict[str, str], str]:
    """`env` (None: ours) plus a fresh run cookie; returns (env, cookie). Makes us a subreaper first."""
    become_subreaper()
    cookie = uuid.uuid4().hex
    return {**(os.environ if env is None else env), COOKIE_ENV: cookie}, cookie


def _signal_run(pgid: int, pids: list[int], sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_orphans(pids) -> None:
    """waitpid() the given pids that became our children (re-parented orphans), so none stays a zombie."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _exiting(pids) -> list[int]:
    """The pids of `pids` that still run (not gone, not a zombie)."""
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[:1] not in (["Z"], ["X"]):
            out.append(pid)
    return out


def kill_run(proc: subprocess.Popen, pgid: int, cookie: str | None, grace_s: float) -> tuple[list[int], bool]:
    """SIGTERM every process of the run (`run_pids`), wait up to grace_s for them to go, then SIGKILL whatever is
    left (found again: a process may have forked meanwhile). Returns (pids seen, SIGKILL sent)."""

    def live() -> list[int]:
        return run_pids(proc.pid if proc.poll() is None else None, pgid, cookie)

    alive = live()
    seen = set(alive)
    if proc.poll() is None:
        seen.add(proc.pid)
    _signal_run(pgid, alive, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    sigkill = False
    while True:
        alive = live()
        seen.update(alive)
        reap_orphans(seen - {proc.pid})
        # a process of the run that is exiting can no longer be told by its cookie (its environ is gone with its
        # memory) yet still runs: wait for it too (never signalled on that ground alone: its pid could be reused)
        if not alive and proc.returncode is not None and not _exiting(seen - {proc.pid}):
            break
        if time.monotonic() >= deadline:
            sigkill = True
            _signal_run(pgid, alive, signal.SIGKILL)
            proc.wait()
            end = time.monotonic() + 5.0
            while time.monotonic() < end:  # SIGKILL is asynchronous; a fork in flight may add one more
                alive = live()
                seen.update(alive)
                reap_orphans(seen - {proc.pid})
                if not alive:
                    break
                _signal_run(pgid, alive, signal.SIGKILL)
                time.sleep(0.02)
            break
        time.sleep(0.05)
    return sorted(seen), sigkill


def _watch(proc, pgid: int, cookie: str, watch, every_s: float, stop: threading.Event, what: str) -> None:
    """run_with_watchdog's `watch` loop: the run's live pids to `watch`, now and every `every_s` s until `stop`."""
    while not stop.is_set() and proc.poll() is None:
        try:
            watch(run_pids(proc.pid, pgid, cookie))
        except Exception as e:  # a watcher's bug must never cost the run
            from .. import ui

            ui.warn(f"watching {what}'s processes stopped: {type(e).__name__}: {e}")
            return
        stop.wait(every_s)


class _LogPump:
    """The run's merged output into the log, in its own thread: each line as received (stamped with the seconds
    since `start` when asked), echoed, and handed to `on_line`; then the watchdog's last line, after the pipe."""

    def __init__(self, proc, log, argv0: str, *, start: float, stamp: bool, echo: bool, on_line):
        self.proc, self.log, self.argv0, self.start, self.stamp, self.echo = proc, log, argv0, start, stamp, echo
        self.lock, self.ends_with_newline, self.closed, self.callback = threading.Lock(), True, False, on_line
        self.thread = threading.Thread(target=self._pump, name=f"watchdog-log-{proc.pid}", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        # at most 1 MiB at a time: output without newlines (a binary dump) never piles up in memory; only a
        # piece that starts a line goes to the callback (the rest of an overlong line is no line of its own)
        for line in iter(lambda: self.proc.stdout.readline(_LINE_MAX), b""):
            with self.lock:
                if self.closed:
                    return
                starts_line = self.ends_with_newline
                if self.stamp and starts_line:
                    self.log.write(b"%7.1f " % (time.monotonic() - self.start))
                self.log.write(line)
                self.log.flush()
                self.ends_with_newline = line.endswith(b"\n")
            if self.echo:
                sys.stdout.write(line.decode(errors="replace"))
                sys.stdout.flush()
            if self.callback is not None and starts_line:
                try:
                    self.callback(line.decode(errors="replace").rstrip("\r\n"))
                except Exception as e:  # our display's bug must never cost the run its log
                    self.callback = None
                    from .. import ui

                    ui.warn(f"progress from {self.argv0}'s output stopped: {type(e).__name__}: {e}")

    def close(self, note: str | None) -> str | None:
        """Wait (a while) for the pipe's end, append `note` (and that the pipe is still open, when it is) as the
        log's last line; returns the note as written."""
        self.thread.join(_READER_JOIN_S)
        with self.lock:
            if self.thread.is_alive():  # a process outside the group still holds the pipe open
                note = (note + "; " if note else f"{WATCHDOG_TAG} ") + "output pipe still open, log may be incomplete"
            if note:
                self.log.write((b"" if self.ends_with_newline else b"\n") + note.encode() + b"\n")
                self.log.flush()
                if self.echo:
                    print(note, flush=True)
            self.closed = True
        if not self.thread.is_alive():
            self.proc.stdout.close()
        return note


def _wait(proc, pgid: int, cookie: str, timeout_s: float, grace_s: float, stop_watch: threading.Event):
    """Wait for the leader until `timeout_s`: (timed_out, killed pids, SIGKILL needed, note); at the timeout every
    process of the run is killed; on any exception (KeyboardInterrupt) too, before it propagates."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        killed, sigkill = kill_run(proc, pgid, cookie, grace_s)
        how = f"SIGKILL after {grace_s:g} s" if sigkill else f"group gone within {grace_s:g} s, no SIGKILL"
        return True, killed, sigkill, f"{WATCHDOG_TAG} timeout after {timeout_s:g} s: SIGTERM to pgid {pgid}, {how}"
    except BaseException:
        stop_watch.set()
        kill_run(proc, pgid, cookie, min(grace_s, 2.0))
        raise
    return False, [], False, None


def run_with_watchdog(
    argv: list[str],
    *,
    env: dict[str, str] | None,
    cwd: str | os.PathLike | None,
    timeout_s: float,
    log_path: str | os.PathLike,
    grace_s: float = 10.0,
    echo: bool | None = None,
    on_line: Callable[[str], None] | None = None,
    append: bool = False,
    stamp: bool = False,
    watch: Callable[[list[int]], None] | None = None,
    watch_every_s: float = 1.0,
) -> RunOutcome:
    """Run `argv` under a time limit of `timeout_s` seconds; returns a RunOutcome, never raises on timeout.

    env: the full environment (None: inherit ours); log_path: created (parents too) and truncated; bytes are
    written as received, one line at a time, and echoed to our stdout when `echo` (None: with -v, see
    reprostack.ui; quiet by default, the caller's ui.step shows the log's newest line). A final
    `[reprostack watchdog] ...` line records any kill. Raises OSError when argv cannot be started. On
    KeyboardInterrupt every process of the run is killed before the exception propagates.

    on_line: called in the reader thread with each line of output (decoded, newline dropped) after it is in the
    log, before the call returns; e.g. `reprostack.ui.line_counter` to advance a step on the command's own
    progress markers. A callback that raises is dropped with one warning; the log is written whatever it does.

    append: add to log_path instead of truncating it (a build log with its own header); stamp: each line starts with
    the seconds since the start (`   12.3 `: where a build's time went).

    watch: called in its own thread with the run's live pids (`run_pids`: the group, the leader's descendants, the
    cookie's carriers) right after the start and every `watch_every_s` seconds while the leader runs (e.g. reading
    each rank's /proc/<pid>/maps: launch.procmaps.sample). A callback that raises is dropped with one warning.
    """
    if echo is None:
        from .. import ui

        echo = ui.verbose() > 0
    env, cookie = with_cookie(env)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append else "wb") as log:
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        pgid = proc.pid
        pump = _LogPump(proc, log, argv[0], start=start, stamp=stamp, echo=echo, on_line=on_line)
        watcher, stop_watch = None, threading.Event()
        if watch is not None:
            watcher = threading.Thread(
                target=_watch, args=(proc, pgid, cookie, watch, watch_every_s, stop_watch, argv[0]), daemon=True
            )
            watcher.start()
        timed_out, killed, sigkill, note = _wait(proc, pgid, cookie, timeout_s, grace_s, stop_watch)
        duration = time.monotonic() - start
        if watcher is not None:
            stop_watch.set()
            watcher.join()
        if not timed_out and run_pids(None, pgid, cookie):  # the leader was reaped: its pid may be reused
            killed, sigkill = kill_run(proc, pgid, cookie, grace_s)
            note = f"{WATCHDOG_TAG} {len(killed)} process(es) left in pgid {pgid} after exit: SIGTERM" + (
                f", SIGKILL after {grace_s:g} s" if sigkill else ""
            )
        note = pump.close(note)
    rc = proc.returncode
    try:
        name = signal.Signals(-rc).name if rc < 0 else None
    except ValueError:
        name = f"signal {-rc}"
    return RunOutcome(rc, timed_out, name, round(duration, 3), log_path, tuple(killed), note)
