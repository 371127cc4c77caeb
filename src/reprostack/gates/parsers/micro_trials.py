"""Parse the trials driver's log (gates/drivers/micro_trials.py): K trials of test_ep.py and of the dense arm,
interleaved in one launch, into one parse per trial per arm and one figure per trial per metric.

The log holds test_ep.py's own lines (K repetitions of its case; parsers.test_ep attributes the k-th line of
(rank, phase) to trial k), the dense arm's `[dense_a2a]` lines with `"trial": k` (parsers.dense_a2a), and the
driver's `[micro_trials] {"event": "trial" | "nccl" | "done", ...}` markers (the `nccl` records, the one-NCCL evidence
of each measuring rank, are collected in `nccl` for the gate to judge; logs from before they existed have none). The markers are the count guard: every rank
announces each arm's trial exactly K times and says `done` once; a log cut short (a crash in trial 3) or
doubled (the same output twice) shows up here, whatever the phase lines look like.

Per-trial figures (metric names of gates.metrics, so the bars and `data.statistics` use the same names):
`dc_p50_us`, `dispatch_p50_us`, `combine_p50_us` (DeepEP: p50 across ranks of that trial), `dense_dc_p50_us`,
and the paired `deepep_over_dense_dc` = DeepEP D+C / dense D+C of the SAME trial (issue 16 item 2: its interval
comes from the per-trial ratios). A figure is listed only when every trial has it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from ...evidence.bars.stats import Summary, ratios, summarize
from .dense_a2a import DenseParse, parse_dense
from .logtext import split_prefix, tagged_json
from .test_ep import TestEpParse, parse_test_ep

TAG = re.compile(r"\[micro_trials\]\s(?P<json>.*)$")
UNITS = {
    "dc_p50_us": "us",
    "dispatch_p50_us": "us",
    "combine_p50_us": "us",
    "dense_dc_p50_us": "us",
    "deepep_over_dense_dc": "ratio",
}


@dataclass
class TrialsParse:
    """`deepep[k]` / `dense[k]`: trial k's parse (dense empty when that arm was not asked for);
    `problems`: the markers' (each names what is missing or surplus); `complete`: every DeepEP trial
    complete and the markers right; `figures`: metric -> one float per trial (see the module doc)."""

    trials: int
    arms: tuple[str, ...]
    deepep: list[TestEpParse]
    dense: list[DenseParse] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    nccl: list[dict] = field(default_factory=list)
    # (line, rank, host) of each `nccl` record out of its place: the driver prints a rank's record after that
    # rank's last trial of every arm and before its `done` (a line of test_ep's output that mimics the tag is not)
    nccl_misplaced: list[tuple[int, object, object]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.problems and all(p.complete for p in self.deepep)

    @property
    def dense_ok(self) -> bool:
        return bool(self.dense) and all(d.ok for d in self.dense)

    @property
    def figures(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        dc = [p.dc_p50_us for p in self.deepep]
        if all(v is not None for v in dc):
            out["dc_p50_us"] = dc
        for phase in ("dispatch", "combine"):
            v = [p.phases[phase].p50 if phase in p.phases else None for p in self.deepep]
            if all(x is not None for x in v):
                out[f"{phase}_p50_us"] = v
        dense = [d.dc_p50_us for d in self.dense]
        if self.dense and all(v is not None for v in dense):
            out["dense_dc_p50_us"] = dense
            if "dc_p50_us" in out and all(v > 0 for v in dense):
                out["deepep_over_dense_dc"] = [round(r, 9) for r in ratios(out["dc_p50_us"], dense)]
        return out

    def summaries(self) -> dict[str, Summary]:
        """metric -> evidence.bars.stats.Summary of its per-trial figures."""
        return {k: summarize(v, UNITS[k]) for k, v in self.figures.items()}

    def to_dict(self) -> dict:
        """JSON-ready (`data.trials`): per trial each arm's D+C and problems, the markers' problems."""
        return {
            "trials": self.trials,
            "arms": list(self.arms),
            "problems": list(self.problems),
            "complete": self.complete,
            "figures": self.figures,
            "per_trial": [
                {
                    "trial": k,
                    "deepep": {
                        "dc_p50_us": p.dc_p50_us,
                        "complete": p.complete,
                        "phases_us": {n: s.to_dict() for n, s in p.phases.items()},
                        "problems": list(p.problems),
                    },
                    **(
                        {
                            "dense": {
                                "dc_p50_us": self.dense[k].dc_p50_us,
                                "ok": self.dense[k].ok,
                                "phases_us": self.dense[k].phases,
                                "problems": list(self.dense[k].problems),
                            }
                        }
                        if self.dense
                        else {}
                    ),
                }
                for k, p in enumerate(self.deepep)
            ],
        }


def markers(text: str) -> list[tuple[int, dict]]:
    """The driver's `[micro_trials]` records, (line, object); unreadable ones come back as {"bad": reason}."""
    return [
        (
            no,
            {"bad": f"not JSON: {err}"}
            if err is not None
            else obj
            if isinstance(obj, dict)
            else {"bad": "not an object"},
        )
        for no, obj, err in tagged_json(text, TAG)
    ]


def deepep_trial_started(line: str) -> bool:
    """Whether one output line is rank 0's marker of a DeepEP trial starting (the live `trial k/K` of the gate's
    step: ui.line_counter). Launcher prefixes (`[default0]:`) are allowed; anything else (another rank or arm,
    a record that is no JSON, a line over 4 KiB) is not a start. Never raises; the count guard is
    parse_micro_trials, not this."""
    if len(line) > 4096 or "[micro_trials]" not in line:
        return False
    m = TAG.search(split_prefix(line)[1])
    try:
        obj = json.loads(m.group("json")) if m else None
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(obj, dict)
        and obj.get("event") == "trial"
        and obj.get("arm") == "deepep"
        and type(obj.get("rank")) is int
        and obj["rank"] == 0
    )


def _key(v: object) -> object:
    """A record's field as a Counter key: a JSON list or object (unhashable) by its repr."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)


def parse_micro_trials(
    text: str, *, num_ranks: int, trials: int, arms: tuple[str, ...] = ("deepep",), modes: str = "first"
) -> TrialsParse:
    """Parse the trials driver's merged output of `num_ranks` ranks. Raises ValueError for trials < 1 or
    num_ranks < 1; never raises on log content (see the problems of each parse)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, not {trials}")
    deepep = [parse_test_ep(text, num_ranks=num_ranks, modes=modes, trials=trials, trial=k) for k in range(trials)]
    dense = [parse_dense(text, world=num_ranks, trial=k) for k in range(trials)] if "dense" in arms else []
    problems: list[str] = []
    seen: Counter = Counter()
    done: Counter = Counter()
    nccl: list[dict] = []
    misplaced: list[tuple[int, object, object]] = []
    for no, obj in markers(text):
        if "bad" in obj:
            problems.append(f"line {no}: [micro_trials] record {obj['bad']}")
        elif obj.get("event") == "trial":
            seen[(_key(obj.get("rank")), _key(obj.get("arm")))] += 1
        elif obj.get("event") == "done":
            done[_key(obj.get("rank"))] += 1
        elif obj.get("event") == "nccl":
            nccl.append(obj)
            r = _key(obj.get("rank"))
            if done[r] or any(seen[(r, a)] < trials for a in arms):
                misplaced.append((no, obj.get("rank"), obj.get("host")))
    for arm in arms:
        for r in range(num_ranks):
            if seen[(r, arm)] != trials:
                problems.append(f"trial markers: rank {r} started {seen[(r, arm)]} {arm} trial(s), expected {trials}")
    extra = sorted((k for k in seen if k[0] not in range(num_ranks) or k[1] not in arms), key=repr)
    problems += [f"trial markers: unexpected rank/arm {r!r}/{a!r}" for r, a in extra[:4]]
    for r in range(num_ranks):
        if done[r] != 1:
            problems.append(f"trial markers: rank {r} said done {done[r]} time(s), expected once")
    return TrialsParse(trials, tuple(arms), deepep, dense, problems, nccl, misplaced)
