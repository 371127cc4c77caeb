"""Parse the output of NVIDIA's nccl-tests (`all_reduce_perf`, `alltoall_perf`, ...) together with the NCCL_DEBUG=INFO
lines of the same run: the run's header, every table row, the footer, and per rank the net plugin, the libfabric
provider and the transport its connections used (gate 0, fabric).

What nccl-tests prints (v2.19.6 src/util.cu; older releases are read too):
- header: `# nccl-tests version V nccl-headers=H nccl-library=L`, `# Collective test starting: NAME`,
  `# nThread T nGpus G minBytes B maxBytes E step: S(factor|bytes) warmup iters: W iters: N ...`, then one line per
  rank `#  Rank R Group G Pid P on HOST device D [BUS] NAME` (no `Group` before 2.13);
- the table: a column header `# size count type redop root time algbw busbw #wrong time algbw busbw #wrong` (older:
  `error` for `#wrong`, no `root`; `cputime` with -C; i_min/i_max/i_p99/i_cv% per placement with -I; a trailing
  timestamp with -S), then one row per size: out-of-place, then in-place; `#wrong` is `N/A` without a check (-c 0);
  `-N K` repeats the sweep K times: a row whose size is below the previous row's starts the next cycle;
- footer: `# Out of bounds values : 0 OK|FAILED`, `# Avg bus bandwidth : X`, `# Collective test concluded: NAME`;
- failures: `HOST: Test NCCL failure common.cu:L '...'`, `Test CUDA failure`, `Test failure`, `NCCL WARN` lines.

What NCCL prints with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET), each line `HOST:PID:TID [DEV] NCCL INFO MSG`:
`NCCL version X`, `NET/Plugin: Loaded net plugin NAME (vN)`, `Successfully loaded external network plugin PATH`,
`NET/Plugin: Could not find: ...` (no external plugin), aws-ofi-nccl's `NET/OFI Selected provider is P[, fabric is F]
(found N nics)` (`Provider` in older releases), `Using network NAME` (Socket, IB, Libfabric, AWS Libfabric),
`... comm 0x.. rank R nranks N cudaDev D ... Init START|COMPLETE` and `comm 0x.. rank R nRanks N nNodes M ...` (which
process and device is which rank), and per connection `Channel CC/c : R[d] -> S[e] [send|receive] via NET/NAME/...`,
`via P2P/...`, `via SHM/...`.

Per rank (`RankTransport`, gates.parsers.transport: the one reader of these lines, shared with micro, megatron and
nemo-rl): the process (host, pid) from the nccl-tests rank lines, else NCCL's init lines; that process's net
plugin, provider, networks and GIN state; the kinds of its connections; `transport` in words (`NET/OFI efa`,
`Socket`, `none: no network (one node)`, `unknown: ...`; that module's doc). A rank that needs EFA and shows
`Socket` here fell back to sockets (gates.transport fails it).

Invariants: never raises on content, whatever the bytes (the caller decodes with errors="replace"); bounded: at most
MAX_CHARS of text are read (more is a problem), lines longer than MAX_LINE are skipped and counted, at most MAX_ROWS
rows, MAX_RANKS ranks and MAX_PROBLEMS problems are kept (the rest counted); a number that does not parse, a negative
count, a row of the wrong width, a row before the column header, a rank listed twice with other facts, a row for a
size seen already in its cycle are problems, never a guess; NaN/inf figures are kept as floats (report.evaluate
never passes them) and named as problems. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from .logtext import split_prefix
from .transport import MAX_RANKS, NCCL_LINE, NONE_ONE_NODE, NcclLines, RankTransport

MAX_CHARS = 64 << 20
MAX_LINE = 4096
MAX_ROWS = 100_000
MAX_PROBLEMS = 50
__all__ = ["NONE_ONE_NODE", "MAX_RANKS", "NcclTestsParse", "RankTransport", "parse_nccl_tests"]

_INT = r"(-?\d{1,19})"
_VERSION = re.compile(r"^#\s*nccl-tests version (\S{1,40})(?: nccl-headers=(\d{1,9}))?(?: nccl-library=(\d{1,9}))?")
_STARTING = re.compile(r"^#\s*Collective test starting: (\S{1,80})")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded: (\S{1,80})")
_CONFIG = {
    "n_threads": re.compile(r"\bnThread (\d{1,9})\b"),
    "n_gpus": re.compile(r"\bnGpus (\d{1,9})\b"),
    "min_bytes": re.compile(r"\bminBytes (\d{1,20})\b"),
    "max_bytes": re.compile(r"\bmaxBytes (\d{1,20})\b"),
    "warmup_iters": re.compile(r"\bwarmup iters: (\d{1,9})\b"),
    "iters": re.compile(r"(?<!warmup )(?<!agg )\biters: (\d{1,9})\b"),
    "validation": re.compile(r"\bvalidation: (\d{1,9})\b"),
}
_STEP = re.compile(r"\bstep: (\d{1,20})\((factor|bytes)\)")
_RANK_LINE = re.compile(
    r"^#\s+Rank\s+(\d{1,9})(?:\s+Group\s+(\d{1,9}))?\s+Pid\s+(\d{1,10})\s+on\s+(\S{1,1024})\s+device\s+(\d{1,6})"
    r"\s+\[([^\]]{0,128})\]\s*(.{0,1024})$"
)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d{1,19})\s*(OK|FAILED)?")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S{1,40})")
_FAILURE = re.compile(
    r"Test (?:NCCL |CUDA )?failure|NCCL WARN|Test timeout|Invalid number of GPUs|Failed: |error while loading shared"
)


@dataclass(frozen=True)
class RankInfo:
    """One `#  Rank` line of nccl-tests: which process, host and device is rank `rank`."""

    rank: int
    group: int | None
    pid: int
    host: str
    device: int
    bus: str
    name: str


@dataclass(frozen=True)
class Placement:
    """One placement (out-of-place or in-place) of a row: time in us, algbw and busbw in GB/s, `wrong` the count of
    wrong elements (None: `N/A`, no check ran; a float for old releases' `error` column)."""

    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: float | int | None


@dataclass(frozen=True)
class Row:
    """One table row: size in bytes, element count, type, redop, root, its cycle (0-based, `-N`), the placements."""

    line: int
    cycle: int
    size: int
    count: int
    type: str
    redop: str
    root: int | None
    out_of_place: Placement
    in_place: Placement


@dataclass(frozen=True)
class NcclTestsParse:
    """The parse of one nccl-tests run's output (one binary). `problems`: what is wrong with the output itself."""

    program: str | None
    version: str | None
    nccl_headers: int | None
    nccl_library: int | None
    config: dict
    ranks: tuple[RankInfo, ...]
    columns: tuple[str, ...]
    rows: tuple[Row, ...]
    cycles: int
    out_of_bounds: int | None
    out_of_bounds_ok: bool | None
    avg_busbw_gbs: float | None
    concluded: bool
    failures: tuple[str, ...]
    nccl_versions: dict
    transports: tuple[RankTransport, ...]
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def nodes(self) -> int:
        """Hosts among the ranks (nccl-tests' rank lines, else NCCL's init lines); 0 when none is known."""
        hosts = {r.host for r in self.ranks} or {t.host for t in self.transports if t.host}
        return len(hosts)

    def rows_at(self, size: int) -> list[Row]:
        """Every row (one per cycle when the output is whole) whose size is `size`, in cycle order."""
        return [r for r in self.rows if r.size == size]

    @property
    def wrong_total(self) -> int | None:
        """Sum of `#wrong` over every row and placement; None when no row has a count (no check ran, or no row)."""
        counts = [p.wrong for r in self.rows for p in (r.out_of_place, r.in_place) if p.wrong is not None]
        if not counts:
            return None
        total = sum(counts)
        return int(total) if math.isfinite(total) and total == int(total) else total


class _Problems(list):
    """A list that keeps at most MAX_PROBLEMS entries and counts the rest."""

    dropped = 0

    def add(self, msg: str) -> None:
        if len(self) < MAX_PROBLEMS:
            self.append(msg[:300])
        else:
            self.dropped += 1


def _num(tok: str) -> float | None:
    try:
        v = float(tok)
    except ValueError:
        return None
    return v


def _placement(toks: list[str], no: int, problems: _Problems) -> Placement | None:
    vals = [_num(t) for t in toks[:3]]
    if any(v is None for v in vals):
        problems.add(f"line {no}: time/algbw/busbw {' '.join(toks[:3])!r} are not numbers")
        return None
    if any(not math.isfinite(v) for v in vals):
        problems.add(f"line {no}: a non-finite figure in {' '.join(toks[:3])!r}")
    if any(v < 0 for v in vals if math.isfinite(v)):
        problems.add(f"line {no}: a negative figure in {' '.join(toks[:3])!r}")
        return None
    wrong_tok = toks[3]
    wrong: float | int | None
    if wrong_tok == "N/A":
        wrong = None
    else:
        w = _num(wrong_tok)
        if w is None or not math.isfinite(w) or w < 0:
            problems.add(f"line {no}: #wrong {wrong_tok!r} is not a count")
            return None
        wrong = int(w) if w == int(w) and w < 1e18 else w
    return Placement(vals[0], vals[1], vals[2], wrong)


def _columns(body: str) -> tuple[str, ...] | None:
    """The column names of a table header line (`# size count type redop root time ...`), else None."""
    toks = body.lstrip("#").split()
    if len(toks) >= 10 and toks[0] == "size" and toks[1] == "count" and "busbw" in toks:
        return tuple(toks)
    return None


def _layout(cols: tuple[str, ...]) -> tuple[int, int] | None:
    """(index of the first time column, width of a placement) of a column header; None when it is not two equal
    placements each starting with time/cputime and holding algbw, busbw and #wrong/error."""
    times = [i for i, c in enumerate(cols) if c in ("time", "cputime")]
    if len(times) < 2:
        return None
    first, width = times[0], times[1] - times[0]
    if len(cols) < first + 2 * width or width < 4:
        return None
    for start in (first, first + width):
        if cols[start + 1 : start + 4] not in (("algbw", "busbw", "#wrong"), ("algbw", "busbw", "error")):
            return None
    return first, width


def _row(toks: list[str], cols: tuple[str, ...], no: int, cycle: int, problems: _Problems) -> Row | None:
    lay = _layout(cols)
    if lay is None:
        return None
    first, width = lay
    n = first + 2 * width
    if len(toks) not in (n, n + 2):  # +2: -S prints `YYYY-mm-dd HH:MM:SS` after the row
        problems.add(f"line {no}: a row of {len(toks)} fields, the table has {n}")
        return None
    pre = dict(zip(cols[:first], toks[:first]))
    try:
        size, count = int(pre["size"]), int(pre["count"])
        root = int(pre["root"]) if "root" in pre else None
    except (KeyError, ValueError):
        problems.add(f"line {no}: size/count/root {' '.join(toks[:first])!r} are not integers")
        return None
    if size < 0 or count < 0:
        problems.add(f"line {no}: a negative size or count")
        return None
    out = _placement(toks[first : first + width], no, problems)
    inp = _placement(toks[first + width : first + 2 * width], no, problems)
    if out is None or inp is None:
        return None
    return Row(no, cycle, size, count, pre.get("type", "")[:32], pre.get("redop", "")[:32], root, out, inp)


@dataclass
class _Reader:
    """One pass over a run's output (parse_nccl_tests): what its `#` lines say (header, rank lines, the table's
    columns, footer) and the table's rows, each row in its cycle; problems go to `problems`."""

    problems: _Problems
    program: str | None = None
    version: str | None = None
    headers: int | None = None
    library: int | None = None
    config: dict = field(default_factory=dict)
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    cols: tuple[str, ...] = ()
    rows: list[Row] = field(default_factory=list)
    cycle: int = 0
    last_size: int | None = None
    seen_in_cycle: set[int] = field(default_factory=set)
    oob: int | None = None
    oob_ok: bool | None = None
    avg: float | None = None
    concluded: bool = False
    failures: list[str] = field(default_factory=list)

    def comment(self, no: int, s: str) -> None:
        """A `#` line: the version, the test's start and end, its configuration, a rank, the column header, the
        footer's out-of-bounds count and average bus bandwidth (anything else is passed over)."""
        if m := _VERSION.match(s):
            self.version = m.group(1)
            self.headers = int(m.group(2)) if m.group(2) else None
            self.library = int(m.group(3)) if m.group(3) else None
        elif m := _STARTING.match(s):
            self.program = m.group(1)
        elif m := _CONCLUDED.match(s):
            self.concluded = True
            self.program = self.program or m.group(1)
        elif "nGpus" in s and "minBytes" in s:
            for key, rx in _CONFIG.items():
                if mm := rx.search(s):
                    self.config[key] = int(mm.group(1))
            if mm := _STEP.search(s):
                self.config["step"], self.config["step_kind"] = int(mm.group(1)), mm.group(2)
        elif m := _RANK_LINE.match(s):
            self.rank(no, m)
        elif c := _columns(s):
            if _layout(c) is None:
                self.problems.add(f"line {no}: a table header of an unknown shape: {' '.join(c)[:120]!r}")
            self.cols = c
        elif m := _OOB.match(s):
            self.oob, self.oob_ok = int(m.group(1)), (m.group(2) == "OK" if m.group(2) else None)
        elif m := _AVG.match(s):
            self.avg = _num(m.group(1))
            if self.avg is None:
                self.problems.add(f"line {no}: Avg bus bandwidth {m.group(1)!r} is not a number")

    def rank(self, no: int, m: re.Match) -> None:
        """A `#  Rank` line: kept once per rank (at most MAX_RANKS); the same rank with other facts is a problem."""
        info = RankInfo(
            int(m.group(1)),
            int(m.group(2)) if m.group(2) else None,
            int(m.group(3)),
            m.group(4),
            int(m.group(5)),
            m.group(6),
            m.group(7).strip(),
        )
        old = self.ranks.get(info.rank)
        if old is not None and old != info:
            self.problems.add(
                f"line {no}: rank {info.rank} listed twice ({old.host} pid {old.pid}, {info.host} pid {info.pid})"
            )
        elif old is None and len(self.ranks) < MAX_RANKS:
            self.ranks[info.rank] = info

    def row(self, no: int, s: str) -> bool:
        """A table row (a line starting with a digit), in its cycle; False once MAX_ROWS rows are kept (stop)."""
        if not self.cols:
            self.problems.add(f"line {no}: a table row before the table's column header")
            return True
        if len(self.rows) >= MAX_ROWS:
            self.problems.add(f"more than {MAX_ROWS} rows: the rest is not read")
            return False
        r = _row(s.split(), self.cols, no, self.cycle, self.problems)
        if r is None:
            return True
        if self.last_size is not None and r.size < self.last_size:
            self.cycle, self.seen_in_cycle = self.cycle + 1, set()
            r = replace(r, cycle=self.cycle)
        if r.size in self.seen_in_cycle and r.size > 0:
            self.problems.add(f"line {no}: a second row for size {r.size} in cycle {self.cycle + 1}")
            return True
        self.seen_in_cycle.add(r.size)
        self.last_size = r.size
        self.rows.append(r)
        return True


def parse_nccl_tests(text: str) -> NcclTestsParse:
    """Parse one run's output (stdout and stderr together, launcher prefixes allowed). Never raises on content."""
    problems = _Problems()
    if not isinstance(text, str):
        text = ""
        problems.add("output is not text")
    if len(text) > MAX_CHARS:
        problems.add(f"output over {MAX_CHARS} characters: the rest is not read")
        text = text[:MAX_CHARS]
    rd = _Reader(problems)
    nccl = NcclLines()
    long_lines = 0
    for no, raw in enumerate(text.split("\n"), start=1):
        if len(raw) > MAX_LINE:
            long_lines += 1
            continue
        _pre, body = split_prefix(raw.rstrip("\r"))
        if m := NCCL_LINE.search(body):
            nccl.line(m.group(1), int(m.group(2)), int(m.group(4)), m.group(5), m.group(6))
            if m.group(5) == "WARN" and len(rd.failures) < 20:
                rd.failures.append(body.strip()[:300])
            continue
        s = body.strip()
        if not s:
            continue
        if s.startswith("#"):
            rd.comment(no, s)
        elif _FAILURE.search(s):
            if len(rd.failures) < 20:
                rd.failures.append(s[:300])
        elif s[0].isdigit() and not rd.row(no, s):
            break
    if long_lines:
        problems.add(f"{long_lines} line(s) over {MAX_LINE} characters skipped")
    if problems.dropped:
        problems.append(f"... and {problems.dropped} more problem(s)")
    tp = nccl.transports({r.rank: (r.host, r.pid, r.device) for r in rd.ranks.values()})
    return NcclTestsParse(
        program=rd.program,
        version=rd.version,
        nccl_headers=rd.headers,
        nccl_library=rd.library,
        config=rd.config,
        ranks=tuple(rd.ranks[k] for k in sorted(rd.ranks)),
        columns=rd.cols,
        rows=tuple(rd.rows),
        cycles=(rd.rows[-1].cycle + 1) if rd.rows else 0,
        out_of_bounds=rd.oob,
        out_of_bounds_ok=rd.oob_ok,
        avg_busbw_gbs=rd.avg,
        concluded=rd.concluded,
        failures=tuple(rd.failures),
        nccl_versions=tp.nccl_versions,
        transports=tp.ranks,
        problems=tuple(problems),
    )
