"""A serving engine as a background process: own session (process group), merged output to a log file, and a
stop that leaves nothing behind (SIGTERM to every process of the run, SIGKILL after a grace period), like
watchdog.py does for foreground commands: the group, the leader's descendants and whatever carries the run's
cookie (a worker that called setsid and was orphaned included)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from .watchdog import WATCHDOG_TAG, kill_run, run_pids, with_cookie


class ServerProcess:
    """Start `argv` with `env` in `cwd`, stdout+stderr appended to `log_path` (created, truncated)."""

    def __init__(self, argv: list[str], *, env: dict, cwd: str | os.PathLike | None, log_path: Path):
        self.argv, self.log_path = list(argv), Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.started = time.monotonic()
        env, self.cookie = with_cookie(env)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError:
            self._log.close()
            raise
        self.pgid = self.proc.pid
        self.stopped_by_us = False

    def alive(self) -> bool:
        """True while the leader process runs."""
        return self.proc.poll() is None

    def pids(self) -> list[int]:
        """The live processes of the server's run (its group, the leader's descendants, the cookie's carriers):
        whose /proc/<pid>/maps a gate reads while it serves (launch.procmaps.sample)."""
        return run_pids(self.proc.pid if self.alive() else None, self.pgid, self.cookie)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop the whole process group; returns the leader's exit status as it was before we stopped it
        (None when it was still running, i.e. stopped by us). Appends a watchdog line to the log."""
        before = self.proc.poll()
        if before is None:
            self.stopped_by_us = True
        if before is None or run_pids(None, self.pgid, self.cookie):
            kill_run(self.proc, self.pgid, self.cookie, grace_s)
        self.proc.wait()
        self._log.write(f"{WATCHDOG_TAG} server stopped (exit status before stop: {before})\n".encode())
        self._log.close()
        return before
