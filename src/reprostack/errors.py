"""Errors that name where the bad input is (file:line, pin, patch) so an operator can fix it."""

from __future__ import annotations


class ReprostackError(Exception):
    """Base error: the message is complete and meant for the operator; the CLI prints it and exits 2."""


class LocatedError(ReprostackError):
    """An operator-edited file is malformed: message is `FILE:LINE: FIELD: what is wrong`."""

    def __init__(self, path: str, line: int | None, field: str, message: str):
        self.path, self.line, self.field = path, line, field
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {field}: {message}")


class LockError(LocatedError):
    """`upstreams.lock` is malformed."""


class FetchError(ReprostackError):
    """A pinned source could not be fetched or did not verify (wrong commit or tree hash)."""


class SourceUnreachable(FetchError):
    """A source could not be had from where it was looked for: its host failed (or, offline, neither the cache
    nor a bundle holds it). The CLI adds how to fetch through mirrors or a bundle."""


class PatchError(ReprostackError):
    """A patch series entry does not apply with zero fuzz, or the result is not the pinned tree."""


class BumpError(ReprostackError):
    """A bump could not be planned or written (target ref missing or moved, a dirty lock, a branch that exists)."""


class BuildError(ReprostackError):
    """A kernel build failed its preflight or its compiler step; names the step and the log."""


class GateError(ReprostackError):
    """A gate spec is malformed or a gate could not be set up (not a gate FAIL: that is a report)."""


class Signalled(BaseException):
    """A gate run was told to stop (SIGTERM: a job's time limit, Slurm's --signal, a pod's termination). A
    BaseException, like KeyboardInterrupt: nothing on the way catches it as an error; the watchdog stops the run's
    processes and the CLI still writes the gate's report (ERROR naming the signal)."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")
