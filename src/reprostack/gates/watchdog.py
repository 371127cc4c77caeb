"""Run a gate's command with a hard time limit, keeping its merged output, and never leave processes behind.

The command runs in its own session (so its own process group, pgid == its pid), stdin from /dev/null,
stdout and stderr merged into one pipe that is written line by line to the log (and echoed). On timeout
the whole group gets SIGTERM, then SIGKILL after `grace_s` if anything in it is still alive; processes left
in the group after a normal exit get the same treatment (torchrun workers holding GPUs must not outlive
the gate). Group members are found in /proc (Linux); elsewhere only the leader is known.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

WATCHDOG_TAG = "[reprostack watchdog]"
_READER_JOIN_S = 5.0


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


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`, from /proc; [] when /proc is absent."""
    out = []
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
        # pid (comm) state ppid pgrp ...; comm may hold spaces or parentheses: split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(name))
    return sorted(out)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_group(proc: subprocess.Popen, pgid: int, grace_s: float) -> tuple[list[int], bool]:
    """SIGTERM the group, wait up to grace_s for it to empty, then SIGKILL it. Returns (pids seen, SIGKILL sent)."""
    seen = set(group_pids(pgid))
    if proc.poll() is None:
        seen.add(proc.pid)
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        alive = group_pids(pgid)
        seen.update(alive)
        if not alive and proc.returncode is not None:
            return sorted(seen), False
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5.0
    while group_pids(pgid) and time.monotonic() < deadline:  # SIGKILL is asynchronous
        time.sleep(0.02)
    return sorted(seen), True


def run_with_watchdog(argv: list[str], *, env: dict[str, str] | None, cwd: str | os.PathLike | None,
                      timeout_s: float, log_path: str | os.PathLike, grace_s: float = 10.0,
                      echo: bool = True) -> RunOutcome:
    """Run `argv` under a time limit of `timeout_s` seconds; returns a RunOutcome, never raises on timeout.

    env: the full environment (None: inherit ours); log_path: created (parents too) and truncated; bytes are
    written as received, one line at a time, and echoed to our stdout when `echo`. A final
    `[reprostack watchdog] ...` line records any kill. Raises OSError when argv cannot be started. On
    KeyboardInterrupt the group is killed before the exception propagates.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    with open(log_path, "wb") as log:
        start = time.monotonic()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        pgid, ends_with_newline, closed = proc.pid, [True], [False]

        def pump() -> None:
            for line in iter(proc.stdout.readline, b""):
                with lock:
                    if closed[0]:
                        return
                    log.write(line)
                    log.flush()
                    ends_with_newline[0] = line.endswith(b"\n")
                if echo:
                    sys.stdout.write(line.decode(errors="replace"))
                    sys.stdout.flush()

        reader = threading.Thread(target=pump, name=f"watchdog-log-{pgid}", daemon=True)
        reader.start()
        timed_out, killed, sigkill, note = False, [], False, None
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            killed, sigkill = _reap_group(proc, pgid, grace_s)
            how = f"SIGKILL after {grace_s:g} s" if sigkill else f"group gone within {grace_s:g} s, no SIGKILL"
            note = f"{WATCHDOG_TAG} timeout after {timeout_s:g} s: SIGTERM to pgid {pgid}, {how}"
        except BaseException:
            _reap_group(proc, pgid, min(grace_s, 2.0))
            raise
        duration = time.monotonic() - start
        if not timed_out and group_pids(pgid):
            killed, sigkill = _reap_group(proc, pgid, grace_s)
            note = (f"{WATCHDOG_TAG} {len(killed)} process(es) left in pgid {pgid} after exit: SIGTERM"
                    + (f", SIGKILL after {grace_s:g} s" if sigkill else ""))
        reader.join(_READER_JOIN_S)
        with lock:
            if reader.is_alive():  # a process outside the group still holds the pipe open
                note = (note + "; " if note else f"{WATCHDOG_TAG} ") + "output pipe still open, log may be incomplete"
            if note:
                log.write((b"" if ends_with_newline[0] else b"\n") + note.encode() + b"\n")
                log.flush()
                if echo:
                    print(note, flush=True)
            closed[0] = True
        if not reader.is_alive():
            proc.stdout.close()
    rc = proc.returncode
    try:
        name = signal.Signals(-rc).name if rc < 0 else None
    except ValueError:
        name = f"signal {-rc}"
    return RunOutcome(rc, timed_out, name, round(duration, 3), log_path, tuple(killed), note)
