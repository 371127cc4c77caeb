"""Parse the output of our dense comparison driver, `gates/drivers/dense_a2a.py` (all_to_all_single).

The driver prints, per rank, one JSON object per line after the tag `[dense_a2a] ` (launcher prefixes such
as `[default3]:` are ignored, see logtext): a `config` line (rank 0), one `phase` line per phase
(`dispatch`, `cached dispatch`, `combine`: p50_us/mean_us/min_us/max_us over the rank's timed iterations,
`recv_bytes` of the bf16 rows it received), and a `done` line with `check` = "ok" | "mismatch".

With the trials driver (gates/drivers/micro_trials.py) each phase line carries `"trial": k`: parse one trial
at a time (`trial=k`).

Across ranks: per phase, p50 = statistics.median of the ranks' p50_us; GB/s p50 = median over ranks of
recv_bytes / p50_us / 1e3. Dense D+C = p50(dispatch) + p50(combine), the figure compared with DeepEP's.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from .logtext import tagged_json

PHASES = ("dispatch", "cached dispatch", "combine")
TAG = re.compile(r"\[dense_a2a\]\s(?P<json>.*)$")
_PHASE_KEYS = ("rank", "world", "phase", "p50_us", "mean_us", "min_us", "max_us", "iters", "recv_bytes")


@dataclass
class DenseParse:
    """Result of `parse_dense`: `phases[phase]` = {"n", "p50_us", "mean_of_p50_us", "min_us", "max_us",
    "p50_gbs"} across ranks; `dc_p50_us`; `complete` (every rank printed every phase and `done`);
    `problems` (each names its log line); `ok` = complete, no problem and every check "ok"."""

    world: int
    config: dict
    phases: dict
    dc_p50_us: float | None
    complete: bool
    problems: list[str] = field(default_factory=list)
    per_rank: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """complete and no problems."""
        return self.complete and not self.problems

    def to_dict(self) -> dict:
        """JSON-ready form for the report's `data.dense`."""
        return {
            "world": self.world,
            "config": self.config,
            "phases_us": self.phases,
            "dc_p50_us": self.dc_p50_us,
            "complete": self.complete,
            "ok": self.ok,
            "problems": list(self.problems),
            "per_rank_p50_us": {p: {str(r): v for r, v in sorted(d.items())} for p, d in self.per_rank.items()},
        }


def _records(text: str, problems: list[str]):
    for no, obj, err in tagged_json(text, TAG):
        if err is not None:
            problems.append(f"line {no}: not JSON after [dense_a2a]: {err}")
            continue
        if not isinstance(obj, dict) or "event" not in obj:
            problems.append(f"line {no}: [dense_a2a] record without an `event`")
            continue
        yield no, obj


def parse_dense(text: str, *, world: int, trial: int | None = None) -> DenseParse:
    """Parse the driver's merged output of `world` ranks.

    trial: only the phase lines of that trial (`"trial": k`, printed by the trials driver); the `config` and
    `done` lines are shared by every trial.

    Raises ValueError for world < 1; never raises on log content (see `problems`)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, not {world}")
    problems: list[str] = []
    config: dict = {}
    samples: dict[str, dict[int, tuple[int, dict]]] = {p: {} for p in PHASES}
    done: dict[int, str] = {}
    for no, obj in _records(text, problems):
        ev = obj["event"]
        if ev == "config":
            config = {k: v for k, v in obj.items() if k != "event"}
            if obj.get("world") != world:
                problems.append(f"line {no}: config world {obj.get('world')!r}, expected {world}")
        elif ev == "phase":
            if trial is not None and obj.get("trial") != trial:
                continue
            missing = [k for k in _PHASE_KEYS if k not in obj]
            rank, phase = obj.get("rank"), obj.get("phase")
            if (
                missing
                or phase not in PHASES
                or not isinstance(rank, int)
                or not 0 <= rank < world
                or obj["world"] != world
            ):
                problems.append(
                    f"line {no}: unusable phase record (missing {missing or 'nothing'}; "
                    f"phase {phase!r}, rank {rank!r}/{obj.get('world')!r}, expected /{world})"
                )
                continue
            if rank in samples[phase]:
                problems.append(f"line {no}: {phase}: rank {rank} duplicate of line {samples[phase][rank][0]}")
                continue
            samples[phase][rank] = (no, obj)
        elif ev == "done":
            done[obj.get("rank")] = obj.get("check")
    complete = True
    for p in PHASES:
        missing = [r for r in range(world) if r not in samples[p]]
        if missing:
            complete = False
            problems.append(f"{p}: rank(s) {', '.join(map(str, missing))} missing of {world}")
    not_done = [r for r in range(world) if r not in done]
    if not_done:
        complete = False
        problems.append(f"done: rank(s) {', '.join(map(str, not_done))} did not finish")
    problems += [f"rank {r}: correctness check {c!r}" for r, c in sorted(done.items(), key=str) if c != "ok"]
    phases, per_rank = {}, {}
    for p in PHASES:
        recs = [o for _n, o in samples[p].values()]
        if not recs:
            continue
        p50s = [float(o["p50_us"]) for o in recs]
        gbs = [o["recv_bytes"] / float(o["p50_us"]) / 1e3 for o in recs if float(o["p50_us"]) > 0]
        phases[p] = {
            "n": len(recs),
            "p50_us": round(statistics.median(p50s), 6),
            "mean_of_p50_us": round(statistics.fmean(p50s), 6),
            "min_us": min(float(o["min_us"]) for o in recs),
            "max_us": max(float(o["max_us"]) for o in recs),
            "p50_gbs": round(statistics.median(gbs), 6) if gbs else None,
        }
        per_rank[p] = {r: float(o["p50_us"]) for r, (_n, o) in samples[p].items()}
    dc = (
        round(phases["dispatch"]["p50_us"] + phases["combine"]["p50_us"], 6)
        if "dispatch" in phases and "combine" in phases
        else None
    )
    return DenseParse(world, config, phases, dc, complete, problems, per_rank)
