"""Parse the output of DeepEP V2 `tests/elastic/test_ep.py` (deepseek-ai/DeepEP@b306af06) into per-phase timings.

What the upstream test prints (read at that commit; shapes only, nothing copied):
- once per node (local rank 0): a `Config:` block (` > Ranks: 2 x 8`, ` > Experts: 8/256` = topk/experts,
  ` > Tokens: 128 (max: 128), hidden: 7168`, ` > #SM: 4, #QPs: 6/6` = used/allocated) and, per EP mode,
  ` > Testing with do_handle_copy=1, expert_alignment=128, ... ...`. Tokens is `max(1, num_tokens - rank)`,
  so the second node's block shows fewer tokens than the first: `config` keeps the first block;
- per mode and per rank, five phase lines in a fixed order, each followed by a global barrier:
  `   * EP:   0/16 | dispatch: 5 GB/s (SO), 123 GB/s (SU), 185.400 us, 1234567 bytes | copy: 88 GB/s, 12.345 us`
  with markers `*` dispatch, `-` expanded dispatch, `#` cached dispatch, `@` combine, `+` reduced combine
  (combine lines end in `| reduce: N GB/s, T us`). Times are kineto kernel times in microseconds.

Attribution to modes: a rank prints its phases strictly in order, mode after mode, so the k-th `dispatch`
line of rank r belongs to mode k whatever the interleaving between ranks and nodes (launcher prefixes such as
`[rank3]: ` are ignored; several records glued on one line are split). Modes are numbered by the first
appearance of their ` > Testing with` settings (printed once per node; one pass yields each settings once).
Pressure-test output (`--do-pressure-test`, modes repeated per seed) is not supported.

Statistics: over ranks (and over modes when `modes="all"`), p50 = `statistics.median` (for an even count,
the mean of the two middle values), mean = arithmetic mean, both unrounded. D+C = p50(dispatch) +
p50(combine): the 2026-07 campaign's gate-1 figure (185.4 + 258.2 = 443.6 us, see
tests/fixtures/published-2026-07/micro/test_ep_ep16_summary.json), checked against its 740 us contract.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from .failure import FailureClass, classify_failure, evidence_kind
from .logtext import numbered_lines, prefix_rank

__all__ = [
    "PHASES",
    "PhaseSample",
    "PhaseStats",
    "EpMode",
    "TestEpParse",
    "parse_test_ep",
    "finished_cleanly",
    "dispatch_plus_combine_p50",
    "FailureClass",
    "classify_failure",
    "classify_test_ep_failure",
]

PHASES = ("dispatch", "expanded dispatch", "cached dispatch", "combine", "reduced combine")
MARKERS = {"*": "dispatch", "-": "expanded dispatch", "#": "cached dispatch", "@": "combine", "+": "reduced combine"}
_AUX = {p: ("reduce" if p.endswith("combine") else "copy") for p in PHASES}

_N = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_START = re.compile(r"(?P<marker>[*#@+-])\s+EP:\s*(?P<rank>\d+)\s*/\s*(?P<size>\d+)\s*\|")
_RECORD = re.compile(
    r"(?P<marker>[*#@+-])\s+EP:\s*(?P<rank>\d+)\s*/\s*(?P<size>\d+)\s*\|\s*"
    r"(?P<phase>expanded dispatch|cached dispatch|reduced combine|dispatch|combine):\s*"
    rf"(?P<so>{_N})\s*GB/s \(SO\),\s*(?P<su>{_N})\s*GB/s \(SU\),\s*(?P<us>{_N})\s*us,\s*(?P<bytes>{_N})\s*bytes\s*\|\s*"
    rf"(?P<aux>copy|reduce):\s*(?P<aux_gbs>{_N})\s*GB/s,\s*(?P<aux_us>{_N})\s*us\b"
)
_MODE = re.compile(r">\s*Testing with (?P<settings>.+?)\s*\.\.\.\s*$")
_CFG = {
    "ranks": re.compile(r">\s*Ranks:\s*(\d+)\s*x\s*(\d+)"),
    "experts": re.compile(r">\s*Experts:\s*(\d+)\s*/\s*(\d+)"),
    "tokens": re.compile(r">\s*Tokens:\s*(\d+)\s*\(max:\s*(\d+)\),\s*hidden:\s*(\d+)"),
    "sms": re.compile(r">\s*#SM:\s*(\d+),\s*#QPs:\s*(\d+)\s*/\s*(\d+)"),
}
_MAX_LISTED = 8  # per kind of problem, then "... and N more"


@dataclass(frozen=True)
class PhaseSample:
    """One rank's line for one phase: `us` kernel time (us), SO/SU bandwidth (GB/s), SU bytes, and the
    trailing copy/reduce epilogue (`aux_gbs` GB/s, `aux_us` us). `line` is the 1-based log line."""

    us: float
    so_gbs: float
    su_gbs: float
    bytes: int
    aux_gbs: float
    aux_us: float
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class PhaseStats:
    """Across ranks: `n` samples; p50 (statistics.median), mean, min, max of `us`; p50 of SO and SU GB/s.
    Values are rounded to 1e-6 (drops float noise such as 185.39999999999998; the log has 1e-3 us)."""

    n: int
    p50: float
    mean: float
    min: float
    max: float
    p50_so_gbs: float
    p50_su_gbs: float

    @classmethod
    def of(cls, samples: list[PhaseSample]) -> PhaseStats:
        """Stats of a non-empty list of samples (ValueError when empty)."""
        if not samples:
            raise ValueError("no samples")
        us = [s.us for s in samples]
        return cls(
            len(us),
            *(
                round(x, 6)
                for x in (
                    statistics.median(us),
                    statistics.fmean(us),
                    min(us),
                    max(us),
                    statistics.median([s.so_gbs for s in samples]),
                    statistics.median([s.su_gbs for s in samples]),
                )
            ),
        )

    def to_dict(self) -> dict:
        """`{"n", "p50", "mean", "min", "max", "p50_so_gbs", "p50_su_gbs"}` (times in us, as the published summary)."""
        return {
            "n": self.n,
            "p50": self.p50,
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
            "p50_so_gbs": self.p50_so_gbs,
            "p50_su_gbs": self.p50_su_gbs,
        }


@dataclass
class EpMode:
    """One EP mode: its index (0-based, order of first appearance), its settings string
    (`do_handle_copy=1, expert_alignment=128, ...`; None when no ` > Testing with` line named it) and
    `samples[phase][rank]`."""

    index: int
    settings: str | None
    samples: dict[str, dict[int, PhaseSample]] = field(default_factory=lambda: {p: {} for p in PHASES})


@dataclass
class TestEpParse:
    """Result of `parse_test_ep`.

    `complete`: every phase line of every rank of the checked mode(s) is present (coverage only);
    `problems`: every anomaly found (missing ranks/phases, duplicates, malformed lines, config mismatch);
    `ok`: complete and no problems. `completed_line`: the line of the last expected phase line when complete;
    `teardown_lines`: error-looking lines after it, `(line_no, text)`, which do not count as failures.
    """

    __test__ = False  # not a pytest test class

    num_ranks: int
    modes_checked: str
    config: dict
    modes: list[EpMode]
    phases: dict[str, PhaseStats]
    dc_p50_us: float | None
    problems: list[str]
    complete: bool
    completed_line: int | None = None
    teardown_lines: list[tuple[int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """complete and no problems."""
        return self.complete and not self.problems

    def checked(self) -> list[EpMode]:
        """The modes the stats and the completeness check cover."""
        return self.modes[:1] if self.modes_checked == "first" else list(self.modes)

    def to_dict(self) -> dict:
        """JSON-ready form (for a gate report's `data`); samples only for the checked modes."""
        checked = {m.index for m in self.checked()}
        return {
            "num_ranks": self.num_ranks,
            "modes_checked": self.modes_checked,
            "config": self.config,
            "modes": [
                {
                    "index": m.index,
                    "settings": m.settings,
                    **(
                        {"us": {p: {str(r): s.us for r, s in sorted(m.samples[p].items())} for p in PHASES}}
                        if m.index in checked
                        else {}
                    ),
                }
                for m in self.modes
            ],
            "phases_us": {p: s.to_dict() for p, s in self.phases.items()},
            "dc_p50_us": self.dc_p50_us,
            "complete": self.complete,
            "ok": self.ok,
            "problems": list(self.problems),
            "completed_line": self.completed_line,
            "teardown_lines": [list(t) for t in self.teardown_lines],
        }


def dispatch_plus_combine_p50(phases: Mapping[str, PhaseStats | Mapping | float]) -> float | None:
    """D+C = p50(dispatch) + p50(combine) in us, from PhaseStats, `{"p50": x}` dicts or bare numbers;
    None when either phase is absent. Rounded to 1e-6 only (the campaign rounded each p50 to 0.1 us before
    adding: compare at that precision)."""

    def p50(v):
        if v is None:
            return None
        if isinstance(v, PhaseStats):
            return v.p50
        return float(v["p50"]) if isinstance(v, Mapping) else float(v)

    d, c = p50(phases.get("dispatch")), p50(phases.get("combine"))
    return None if d is None or c is None else round(d + c, 6)


def _capped(items: list[str]) -> list[str]:
    return items if len(items) <= _MAX_LISTED else items[:_MAX_LISTED] + [f"... and {len(items) - _MAX_LISTED} more"]


def _scan(text: str, num_ranks: int):
    """One pass over the text: config blocks, mode settings, phase records (in log order) and line problems."""
    blocks: list[dict] = []
    current: dict[int | None, dict] = {}  # block being filled, per launcher-prefix rank (nodes may interleave)
    settings: list[str] = []
    records: list[tuple[int, int, str, PhaseSample]] = []  # (line, rank, phase, sample)
    malformed, wrong_size = [], []
    lines = numbered_lines(text)
    for no, prefix, body in lines:
        for key, rx in _CFG.items():
            m = rx.search(body)
            if not m:
                continue
            g, who = [int(x) for x in m.groups()], prefix_rank(prefix)
            if key == "ranks" or who not in current:
                current[who] = {}
                blocks.append(current[who])
            b = current[who]
            if key == "ranks":
                b.update(ranks=f"{g[0]} x {g[1]}", scaleout_ranks=g[0], scaleup_ranks=g[1])
            elif key == "experts":
                b.update(topk=g[0], experts=g[1])
            elif key == "tokens":
                b.update(tokens=g[0], max_tokens=g[1], hidden=g[2])
            else:
                b.update(sms=g[0], qps=g[1], allocated_qps=g[2])
        m = _MODE.search(body)
        if m and m.group("settings") not in settings:
            settings.append(m.group("settings"))
        for start in _START.finditer(body):
            rec = _RECORD.match(body, start.start())
            marker = start.group("marker")
            if not rec or MARKERS[marker] != rec.group("phase") or _AUX[rec.group("phase")] != rec.group("aux"):
                malformed.append(f"line {no}: malformed phase line: {body[start.start() :].strip()[:160]!r}")
                continue
            rank, size, phase = int(rec.group("rank")), int(rec.group("size")), rec.group("phase")
            if size != num_ranks or rank >= size:
                wrong_size.append(f"line {no}: {phase}: rank {rank}/{size}, expected /{num_ranks}")
                continue
            try:
                s = PhaseSample(
                    float(rec.group("us")),
                    float(rec.group("so")),
                    float(rec.group("su")),
                    int(rec.group("bytes")),
                    float(rec.group("aux_gbs")),
                    float(rec.group("aux_us")),
                    no,
                )
            except ValueError:
                s = None
            if s is None or not math.isfinite(s.us):
                malformed.append(
                    f"line {no}: {phase}: rank {rank}: unusable numbers {body[start.start() :].strip()[:160]!r}"
                )
                continue
            records.append((no, rank, phase, s))
    return lines, blocks, settings, records, malformed, wrong_size


def _config(blocks: list[dict], settings: list[str], num_ranks: int) -> tuple[dict, list[str]]:
    """The first node's `Config:` block and the problems of the config and mode lines (a node's block that differs
    from the first but for its tokens, Ranks that are not `num_ranks`, no block, no ` > Testing with` line)."""
    problems: list[str] = []
    config = dict(blocks[0]) if blocks else {}
    if not blocks:
        problems.append("config: no `Config:` block (` > Ranks: a x b`) found")
    else:
        for b in blocks[1:]:
            diff = [
                f"{k}: {config.get(k)!r} vs {b.get(k)!r}"
                for k in sorted(set(config) | set(b))
                if k != "tokens" and config.get(k) != b.get(k)
            ]
            if diff:
                problems.append("config differs between nodes: " + "; ".join(diff))
        if "scaleout_ranks" in config and config["scaleout_ranks"] * config["scaleup_ranks"] != num_ranks:
            problems.append(f"config: Ranks {config['ranks']} is not the expected {num_ranks} ranks")
    if not settings:
        problems.append("no ` > Testing with ...` mode line found")
    return config, problems


def _attribute(records, settings: list[str], trials: int | None, trial: int) -> tuple[list[EpMode], list[str]]:
    """The modes with their samples: the k-th line of (rank, phase) -> mode k (of trial `trial` when the log holds
    `trials` repetitions); identical repeats (without trials) and surplus lines are the duplicates returned."""
    ep_modes = [EpMode(i, s) for i, s in enumerate(settings)]
    count: dict[tuple[int, str], int] = defaultdict(int)
    seen: dict[tuple[int, str], dict[tuple, int]] = defaultdict(dict)
    duplicates = []
    nset = max(1, len(settings))
    for no, rank, phase, s in records:
        key, values = (rank, phase), (s.us, s.so_gbs, s.su_gbs, s.bytes, s.aux_gbs, s.aux_us)
        if trials is None and values in seen[key]:
            duplicates.append(f"line {no}: {phase}: rank {rank} duplicate of line {seen[key][values]}")
            continue
        k = count[key]
        if trials is not None:
            if k >= trials * nset:
                duplicates.append(
                    f"line {no}: {phase}: rank {rank} printed more often than {trials} trial(s) x "
                    f"{nset} announced mode(s)"
                )
                continue
            count[key] += 1
            if k // nset != trial:
                continue
            k %= nset
        elif settings and k >= len(settings):
            duplicates.append(
                f"line {no}: {phase}: rank {rank} printed more often than the {len(settings)} announced mode(s)"
            )
            continue
        else:
            count[key] += 1
        seen[key][values] = no
        while len(ep_modes) <= k:
            ep_modes.append(EpMode(len(ep_modes), None))
        ep_modes[k].samples[phase][rank] = s
    if not ep_modes:
        ep_modes.append(EpMode(0, None))
    return ep_modes, duplicates


def _coverage(
    ep_modes: list[EpMode], modes: str, expected_modes: int | None, num_ranks: int
) -> tuple[list[EpMode], bool, list[str]]:
    """(the checked modes, whether every rank printed every phase of them, the problems: fewer modes than
    `expected_modes`, a mode without phase lines, a phase missing, the ranks missing of a phase)."""
    problems: list[str] = []
    checked = ep_modes[:1] if modes == "first" else ep_modes
    complete = True
    if modes == "all" and expected_modes is not None and len(ep_modes) < expected_modes:
        problems.append(f"modes: {len(ep_modes)} seen, {expected_modes} expected")
        complete = False
    for m in checked:
        where = f"mode {m.index}: " if m.index else ""
        if not any(m.samples[p] for p in PHASES):
            problems.append(f"{where}no phase lines at all (expected {len(PHASES)} phases x {num_ranks} ranks)")
            complete = False
            continue
        for p in PHASES:
            missing = [r for r in range(num_ranks) if r not in m.samples[p]]
            if len(missing) == num_ranks:
                problems.append(f"{where}{p}: phase missing (no rank printed it)")
            elif missing:
                problems.append(
                    f"{where}{p}: rank{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(map(str, missing))} missing of {num_ranks}"
                )
            complete = complete and not missing
    return checked, complete, problems


def parse_test_ep(
    text: str,
    *,
    num_ranks: int,
    modes: str = "first",
    expected_modes: int | None = None,
    trials: int | None = None,
    trial: int = 0,
) -> TestEpParse:
    """Parse test_ep.py output (one node's, or several nodes' concatenated or interleaved).

    trials/trial: the log holds `trials` repetitions of the whole case (gates/drivers/micro_trials.py calls
    test_dispatch_combine K times in one launch); the k-th line of (rank, phase) then belongs to trial
    k // modes-announced and mode k % modes-announced, and this parse is trial `trial`'s. Lines beyond
    trials x modes are problems; identical repeats are NOT dropped as duplicates then (two trials may print
    the same figures): the count is the guard.

    num_ranks: the EP size the run must show (`EP: r/num_ranks`); modes: "first" (stats and completeness on
    mode 0, the campaign's "first EP mode case") or "all" (every announced/observed mode, stats pooled);
    expected_modes: when given with modes="all", fewer announced modes is a problem (the upstream
    enumerate_ep_modes yields 144 settings; `--test-first-only` runs 1).
    Raises ValueError for a bad `num_ranks` or `modes`; never raises on log content: see `problems`.
    """
    if modes not in ("first", "all"):
        raise ValueError(f"modes must be 'first' or 'all', not {modes!r}")
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, not {num_ranks}")
    lines, blocks, settings, records, malformed, wrong_size = _scan(text, num_ranks)
    config, problems = _config(blocks, settings, num_ranks)
    if trials is not None and not 0 <= trial < trials:
        raise ValueError(f"trial {trial} outside 0..{trials - 1}")
    ep_modes, duplicates = _attribute(records, settings, trials, trial)
    problems += _capped(malformed) + _capped(wrong_size) + _capped(duplicates)
    checked, complete, missing = _coverage(ep_modes, modes, expected_modes, num_ranks)
    problems += missing
    phases = {
        p: PhaseStats.of([s for m in checked for s in m.samples[p].values()])
        for p in PHASES
        if any(m.samples[p] for m in checked)
    }
    completed_line = max(s.line for m in checked for p in PHASES for s in m.samples[p].values()) if complete else None
    teardown = [
        (no, (pre + body)[:300])
        for no, pre, body in lines
        if completed_line is not None and no > completed_line and evidence_kind(body)
    ]
    return TestEpParse(
        num_ranks,
        modes,
        config,
        ep_modes,
        phases,
        dispatch_plus_combine_p50(phases),
        problems,
        complete,
        completed_line,
        teardown,
    )


def finished_cleanly(text: str, *, num_ranks: int, modes: str = "first") -> bool:
    """True when every expected phase line of every rank of the checked mode(s) is present.

    Lines after the last expected phase line (teardown noise: `gin_host.cc ... error 6`, NCCL warnings, a
    non-zero exit from destroy) do not count; the caller still decides what a non-zero exit code means.
    """
    return parse_test_ep(text, num_ranks=num_ranks, modes=modes).complete


def classify_test_ep_failure(
    text: str, returncode: int | None, timed_out: bool, *, num_ranks: int, modes: str = "first"
) -> FailureClass:
    """classify_failure for test_ep's output of `num_ranks` ranks: when it is complete, error lines after the last
    expected phase line of the checked mode(s) are ignored (teardown noise, or a later mode the gate does not
    check). Never raises on log content."""
    parse = parse_test_ep(text, num_ranks=num_ranks, modes=modes)
    return classify_failure(text, returncode, timed_out, parse=parse)
