"""Run folders: each gate command without `--out` writes into a new `out/gate_<G>/<UTC time>/` (all-gates:
`out/all_gates/<UTC time>/`); `latest` next to it names the newest run that wrote its summary, and moves only
when a run's reports are written (finish()); `--out DIR` is used as given (the folder every node of one run
shares), with no `latest`.

Use:
    run = runs.start(base, given=bool(args.out))    # base: --out DIR, else runs.default_base(gate)
    try:
        ...                                         # write the reports into run.path
    except ReprostackError:
        run.abandon()                               # bad input, nothing written: no trace of this run
        raise
    write_reports(..., run.path); run.finish()      # only now `latest` names this run

Invariants:
- `latest` is a relative symlink swapped in by one rename of a fresh link: a reader finds the old run or the new
  one, never none and never a mix; it names a run whose summary was written, never one that died (a failed
  fetch, a crash): a reader that wants this run's verdict compares `latest` before and after (noxfile's _gate),
  and a run that died is told apart from an earlier one's verdict;
- a new run folder is new and empty (`<stamp>-2`, ... when that second is taken), never an existing one;
- `latest` that is a real folder (not ours) is left alone: OSError naming it before the run starts;
- abandon() removes only a stamped run folder that is still empty; a folder given with --out is never removed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


def session(gate: str | None) -> str:
    """The nox session of gate G (`gate_<G>`, `-` as `_`: `gate nemo-rl` is `nox -s gate_nemo_rl`; noxfile.py makes
    one per gate of the registry), `all_gates` for `all-gates` (gate None)."""
    return "all_gates" if gate is None else f"gate_{gate.replace('-', '_')}"


def default_base(gate: str | None) -> Path:
    """The folder of a gate command's runs: out/<its nox session> (session) for gate G, out/all_gates for
    `all-gates` (gate None)."""
    return Path("out") / session(gate)


def latest_target(base: Path) -> str | None:
    """What `base/latest` points at, None when it is absent or not a symlink."""
    try:
        return os.readlink(Path(base) / "latest")
    except OSError:
        return None


@dataclass(frozen=True)
class RunDir:
    """Where one run writes: `path` (base itself when given with --out, else a new stamped folder of base) and
    what `latest` named before the run (`before`), so that abandon() can put it back."""

    base: Path
    path: Path
    stamped: bool
    before: str | None

    def abandon(self) -> bool:
        """Undo start() for a run that wrote nothing: remove the stamped folder (`latest` was never moved). True
        when it did; False (nothing touched) for a folder given as --out or one that holds anything."""
        if not self.stamped or any(self.path.iterdir()):
            return False
        self.path.rmdir()
        return True

    def finish(self) -> Path | None:
        """The run's summary is written: point `latest` at its folder (a stamped run only). The link, or None."""
        return point_latest(self.base, self.path.name) if self.stamped else None


def start(base: Path, *, given: bool) -> RunDir:
    """The run's folder: `base` as given (--out DIR), else new_run_dir(base) (`latest` moves at finish())."""
    base = Path(base)
    before = latest_target(base)
    if given:
        return RunDir(base, base, False, before)
    link = base / "latest"
    if link.exists() and not link.is_symlink():  # found now, not after a run of minutes
        raise IsADirectoryError(0, "exists and is not a symlink; move it away", str(link))
    return RunDir(base, new_run_dir(base), True, before)


def run_stamp(now: datetime | None = None) -> str:
    """`2026-12-02T03-10-00Z`: the UTC time, without `:` (safe in every file system and in docker -v)."""
    return (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H-%M-%SZ")


def new_run_dir(base: Path, now: datetime | None = None) -> Path:
    """Make a new, empty run folder `base/<stamp>` (`<stamp>-2`, ... when that second is taken); `latest` is not
    touched (RunDir.finish moves it). Raises OSError (the CLI: one line)."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    stamp = run_stamp(now)
    for n in range(1, 1000):
        d = base / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            d.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{base}: no free run folder name for {stamp}")
    return d


def point_latest(base: Path, name: str) -> Path:
    """Atomically make `base/latest` a symlink to `name` (a folder of base): a fresh link is made under a temp
    name and renamed over `latest`, so a reader finds the old run or the new one, never none or a mix. A
    `latest` that is a real folder (not ours) is left alone and an OSError names it."""
    link = Path(base) / "latest"
    if link.exists() and not link.is_symlink():
        raise IsADirectoryError(0, "exists and is not a symlink; move it away", str(link))
    tmp = Path(base) / f".latest.{os.getpid()}.{time.monotonic_ns()}"
    os.symlink(name, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return link
