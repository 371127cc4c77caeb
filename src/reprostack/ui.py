"""What the operator sees while reprostack works: one line per step from its first second, with the step's ETA
from the last run on this host, a live display (rich) on a terminal and plain lines everywhere else.

Use:
    with ui.step("build nccl", log=log_path) as s:   # prints the start line with the ETA and the log's path
        ...                                         # the live line shows the log's newest line, summarised
    with ui.step("trials", total=5, unit="trial") as s:
        s.advance()                                 # `trials: trial 1/5`, 2/5, ...
    with ui.step("test_ep", total=5, unit="trial", log=log) as s:    # progress from the output's own markers:
        run_with_watchdog(..., on_line=ui.line_counter(s, is_marker))  # each line is_marker accepts advances it
    ui.detail("only with -v")

Invariants:
- Quiet by default: a step prints a start line (name, ETA) and an end line (name, ok/failed, seconds); every
  other line (`detail`, the log lines of a step) only with `-v` (`configure(verbose=1)`).
- Live display only when stdout and stderr are terminals and neither NO_COLOR nor CI is set (and TERM is not
  dumb); else plain lines, one event per line, so logs and tests stay readable. Everything goes to stderr:
  stdout keeps the commands' results (`--json` stays parseable).
- ETAs: the seconds each step took, keyed by host and step, in `<cache>/timings.json` (written atomically,
  recorded only for a step that finished without an exception). A step never seen on this host says "first
  run, no estimate". The timings file is untrusted: read bounded (MAX_TIMINGS_BYTES), anything that is not the
  expected shape is ignored with ONE warning line naming the file (never a traceback) and rewritten whole at the
  next record; a record that cannot be written (read-only cache) is skipped with a `-v` detail.
Run folders and their `latest` link: reprostack.runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import stat
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

TIMINGS_FILE = "timings.json"
MAX_TIMINGS_BYTES = 256 * 1024
MAX_SECONDS = 7 * 24 * 3600.0  # a stored duration above a week is not a duration of ours
_TIMINGS_VERSION = 1


class _State:
    verbose = 0
    stream: IO[str] | None = None  # None: sys.stderr at the time of writing
    live: bool | None = None  # None: decide from the environment
    cache: Path | None = None  # None: reprostack.paths.cache_dir()
    warned: set = set()
    progress = None  # the rich Progress of the live display, while a step is open
    depth = 0


_S = _State()
_EMIT_LOCK = threading.Lock()


def configure(
    verbose: int | None = None, *, cache: Path | None = None, live: bool | None = None, stream: IO[str] | None = None
) -> None:
    """Set the verbosity (0 quiet, 1+ details), the cache root holding timings.json, and (tests) force the live
    display on or off and the stream written to. Arguments left None keep their value."""
    if verbose is not None:
        _S.verbose = int(verbose)
    if cache is not None:
        _S.cache = Path(cache)
    if live is not None:
        _S.live = live
    if stream is not None:
        _S.stream = stream


def reset() -> None:
    """Back to the defaults (tests)."""
    _S.verbose, _S.stream, _S.live, _S.cache, _S.progress, _S.depth = 0, None, None, None, None, 0
    _S.warned = set()


def _out() -> IO[str]:
    return _S.stream or sys.stderr


def live_display() -> bool:
    """Whether a live (rich) display is used: see the module doc."""
    if _S.live is not None:
        return _S.live
    if os.environ.get("NO_COLOR") or os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stdout.isatty() and _out().isatty()
    except (AttributeError, ValueError):
        return False


def plain_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width table (two spaces between columns, a dashed rule under the header): every cell whole, no
    box characters, no colour. What a table is off a terminal (see live_display), in a log or a pipe."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def verbose() -> int:
    return _S.verbose


def _emit(line: str) -> None:
    with _EMIT_LOCK:
        if _S.progress is not None:
            from rich.markup import escape

            _S.progress.console.print(escape(line), highlight=False, soft_wrap=True)
            return
        out = _out()
        out.write(line + "\n")
        out.flush()


def info(msg: str) -> None:
    """A line always shown (quiet mode too)."""
    _emit(msg)


def detail(msg: str) -> None:
    """A line shown only with -v."""
    if _S.verbose:
        _emit(msg)


def warn(msg: str, *, once: str | None = None) -> None:
    """`reprostack: warning: MSG`, always shown; with `once`, shown at most once per process for that key."""
    if once is not None:
        if once in _S.warned:
            return
        _S.warned.add(once)
    _emit(f"reprostack: warning: {msg}")


# --------------------------------------------------------------------------- durations and ETAs


def fmt_s(seconds: float) -> str:
    """`0.4 s`, `42 s`, `3 min 05 s`, `1 h 02 min`."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def host() -> str:
    """The key of this machine in the timings file."""
    return socket.gethostname() or "localhost"


def timings_path() -> Path:
    if _S.cache is not None:
        return _S.cache / TIMINGS_FILE
    from .paths import cache_dir

    return cache_dir() / TIMINGS_FILE


def load_timings(path: Path | None = None) -> dict[str, dict[str, float]]:
    """{host: {step: seconds}} from the timings file; {} when it is absent. Anything else that is not that shape
    (too large, not UTF-8 JSON, wrong types, non-finite or negative seconds) is ignored with one warning naming
    the file: whole when the file or its top level is bad, per entry otherwise."""
    path = Path(path) if path is not None else timings_path()
    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        fifo = False
    if fifo:  # open() would wait for a writer forever (a device is read up to the bound below)
        warn(f"{path}: a FIFO, not a file; no step estimates", once=str(path))
        return {}
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TIMINGS_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as e:
        warn(f"{path}: cannot read ({e.strerror or e}); no step estimates", once=str(path))
        return {}
    why = None
    doc = None
    if len(raw) > MAX_TIMINGS_BYTES:
        why = f"larger than {MAX_TIMINGS_BYTES} bytes"
    else:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            why = f"not JSON ({type(e).__name__})"
    if why is None and not (
        isinstance(doc, dict) and doc.get("version") == _TIMINGS_VERSION and isinstance(doc.get("hosts"), dict)
    ):
        why = f'not a timings file (expected {{"version": {_TIMINGS_VERSION}, "hosts": {{...}}}})'
    if why is not None:
        warn(f"{path}: {why}; step estimates ignored (the file is rewritten after the next step)", once=str(path))
        return {}
    out: dict[str, dict[str, float]] = {}
    bad = 0
    for h, steps in doc["hosts"].items():
        if not isinstance(steps, dict):
            bad += 1
            continue
        for name, v in steps.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_SECONDS:
                out.setdefault(h, {})[name] = float(v)
            else:
                bad += 1
    if bad:
        warn(f"{path}: {bad} entr{'y' if bad == 1 else 'ies'} not a number of seconds, ignored", once=str(path))
    return out


def estimate(step: str) -> float | None:
    """Seconds `step` took the last time it finished on this host, or None."""
    return load_timings().get(host(), {}).get(step)


def eta_text(step: str) -> str:
    """`ETA 3 min 12 s (last run)` or `first run, no estimate`."""
    last = estimate(step)
    return "first run, no estimate" if last is None else f"ETA {fmt_s(last)} (last run)"


def record(step: str, seconds: float) -> None:
    """Store `seconds` as the last duration of `step` on this host (atomic rewrite of the timings file)."""
    from .atomicfile import write_text_atomic

    path = timings_path()
    hosts = load_timings(path)
    hosts.setdefault(host(), {})[step] = round(float(seconds), 2)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"version": _TIMINGS_VERSION, "hosts": hosts}, indent=1, sort_keys=True))
    except OSError as e:
        detail(f"reprostack: {path}: durations not stored ({e.strerror or e})")


# --------------------------------------------------------------------------- steps

_COMPILE = re.compile(r"(?:^|\s)(?:\S*/)?(nvcc|g\+\+|gcc|c\+\+|cc|clang\+\+|clang|ld|ar)\s")
_SOURCE = re.compile(r"(\S+\.(?:cu|cc|cpp|cxx|c|cuh|so|a|o))\b")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def summarise(line: str, width: int = 100) -> str:
    """One short line for a build log line: `nvcc src/transport/net.cc` for a compiler command (the tool and the
    file it works on), else the line itself, terminal colour codes dropped, whitespace collapsed and cut to
    `width`."""
    line = " ".join(_ANSI.sub("", line).split())
    m = _COMPILE.search(" " + line)
    if m:
        files = _SOURCE.findall(line)
        srcs = [f for f in files if not f.endswith((".o", ".so", ".a"))]
        what = (srcs or files or [""])[-1]
        if what:
            line = f"{m.group(1)} {what}"
    return line if len(line) <= width else line[: width - 1] + "…"


class Step:
    """An open step (see `step`). `update(text)`: the live line (shown as a line only with -v when plain);
    `advance(n, text)`: progress of a step with a `total` (plain: one line `  name: unit done/total [text]`,
    never the log's newest line); `no_record()`: do not store this run's duration (e.g. a build that reused its
    cache and took no time)."""

    def __init__(self, name: str, key: str, total: int | None, unit: str | None = None):
        self.name, self.key, self.total, self.unit = name, key, total, unit
        self.done = 0
        self.text = ""
        self.record = True
        self.outcome: str | None = None  # printed instead of "ok" at the end (e.g. a gate's result label)
        self.t0 = time.monotonic()
        self._task = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def update(self, text: str) -> None:
        self.text = text
        if _S.progress is not None and self._task is not None:
            _S.progress.update(self._task, status=text)
        elif _S.verbose:
            _emit(f"  {self.name}: {text}")

    def advance(self, n: int = 1, text: str | None = None) -> None:
        self.done += n
        if text is not None:
            self.text = text
        if _S.progress is not None and self._task is not None:
            _S.progress.update(self._task, advance=n, status=self.text)
        else:
            of = f"/{self.total}" if self.total else ""
            unit = f"{self.unit} " if self.unit else ""
            _emit(f"  {self.name}: {unit}{self.done}{of}" + (f" {text}" if text else ""))

    def no_record(self) -> None:
        self.record = False


def _start_live():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=_out(), highlight=False)
    p = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}"),
        TextColumn("[dim]{task.fields[status]}"),
        console=console,
        transient=False,
    )
    p.start()
    return p


@contextmanager
def step(
    name: str, *, key: str | None = None, total: int | None = None, unit: str | None = None, log: Path | None = None
) -> Iterator[Step]:
    """A long step: prints `name: started, ETA ... (last run)` (or `first run, no estimate`), then `name: ok in
    12 s` or `name: failed after 3.1 s`. `key`: the timings key (default `name`); `total`: items for
    `advance`, and `unit` their name in its lines (`trial 2/5`); `log`: a file the step's work writes (its path
    is printed; its newest line, summarised, is the live line, and with -v in plain mode every line)."""
    from rich.markup import escape

    s = Step(name, key or name, total, unit)
    eta = eta_text(s.key)
    live = live_display()
    opened = False
    if live and _S.progress is None:
        _S.progress = _start_live()
        opened = True
    _S.depth += 1
    if _S.progress is not None:
        s._task = _S.progress.add_task(escape(name), total=total, eta=escape(eta), status="")
        if log is not None:
            _emit(f"{name}: full log {log}")
    else:
        _emit(f"{name}: started, {eta}" + (f"; full log {log}" if log is not None else ""))
    follower = _Follower(Path(log), s) if log is not None else None
    ok = False
    try:
        yield s
        ok = True
    finally:
        if follower is not None:
            follower.stop()
        _S.depth -= 1
        took = s.elapsed
        word = (s.outcome or "ok") if ok else "failed"
        end = f"{name}: {word} {'in' if ok else 'after'} {fmt_s(took)}"
        if _S.progress is not None and s._task is not None:
            _S.progress.update(s._task, status=escape(word), eta="")
            _S.progress.stop_task(s._task)
        if opened:
            _S.progress.stop()
            _S.progress = None
        if not live or not ok or log is not None or s.outcome:
            _emit(end + (f"; full log {log}" if log is not None and not ok else ""))
        if ok and s.record:
            record(s.key, took)


def line_counter(s: Step, match: Callable[[str], bool]) -> Callable[[str], None]:
    """A line callback (e.g. `launch.watchdog.run_with_watchdog(on_line=...)`) that advances `s` by one for each
    line of a command's output that `match` accepts, up to `s.total` (a repeated marker in a hostile or doubled
    output never shows `6/5`). `match` gets the line without its newline and must not raise."""

    def on_line(line: str) -> None:
        if (s.total is None or s.done < s.total) and match(line):
            s.advance()

    return on_line


class _Follower:
    """Tails `log` in a thread: each new complete line goes to `step.update(summarise(line))`; reads at most
    1 MiB per poll (a runaway log never fills memory)."""

    def __init__(self, log: Path, s: Step, interval: float = 0.25):
        self.log, self.s, self.interval = log, s, interval
        self.pos = 0
        self.partial = b""
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _poll(self) -> None:
        try:
            with open(self.log, "rb") as f:
                f.seek(self.pos)
                chunk = f.read(1 << 20)
        except OSError:
            return
        if not chunk:
            return
        self.pos += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()[-4096:]
        lines = [x for x in lines if x.strip()]
        if not lines:
            return
        if _S.progress is None and _S.verbose:
            for x in lines:
                self.s.update(summarise(x.decode("utf-8", "replace")))
        else:
            self.s.update(summarise(lines[-1].decode("utf-8", "replace")))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def stop(self) -> None:
        self._stop.set()
        self._t.join()
        self._poll()
