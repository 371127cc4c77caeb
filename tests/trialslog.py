"""Multi-trial logs of the trials driver (gates/drivers/micro_trials.py), built from real committed logs: the
test_ep.py output of K runs on the lent H200 (results/gate_micro/), one per trial, with the driver's markers,
and the dense arm's lines of a fixture (tests/fixtures/arms) marked with their trial and scaled per trial."""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "results" / "gate_micro"
# the three committed H200 EP1 runs that completed: D+C p50 14.360, 14.338, 14.725 us
REAL_EP1 = [
    RESULTS / "2026-11-29-h200-ep1-dense-arm/micro/test_ep.log",
    RESULTS / "2026-11-29-h200-ep1-exclude-libs/micro/test_ep.log",
    RESULTS / "2026-12-02-h200-ep1-nox-cold/micro/test_ep.log",
]
REAL_EP1_DC = [14.36, 14.338, 14.725]
DENSE_FIX = REPO_ROOT / "tests" / "fixtures" / "arms"


def dense_records(fixture: Path) -> tuple[dict, list[dict], list[dict]]:
    """(config, phase records, done records) of a dense fixture log."""
    recs = [
        json.loads(line.split("[dense_a2a] ", 1)[1])
        for line in fixture.read_text().splitlines()
        if "[dense_a2a] " in line
    ]
    return (
        next(r for r in recs if r["event"] == "config"),
        [r for r in recs if r["event"] == "phase"],
        [r for r in recs if r["event"] == "done"],
    )


def dense_trial(phases: list[dict], k: int, scale: float) -> list[dict]:
    """The phase records of trial k: p50/mean/min/max times `scale`, `"trial": k`."""
    out = []
    for r in phases:
        r = dict(r, trial=k)
        for f in ("p50_us", "mean_us", "min_us", "max_us"):
            r[f] = round(r[f] * scale, 3)
        out.append(r)
    return out


def marker(**kw) -> str:
    return "[micro_trials] " + json.dumps(kw, sort_keys=True)


def trials_log(
    test_ep_texts: list[str],
    *,
    num_ranks: int = 1,
    dense_fixture: Path | None = None,
    dense_scales: list[float] | None = None,
    done: bool = True,
) -> str:
    """The driver's output for len(test_ep_texts) trials: per trial each rank's deepep marker, that trial's
    test_ep text, then (with a dense fixture) each rank's dense marker and the fixture's phase lines scaled by
    dense_scales[k]; at the end the dense `done` lines and each rank's driver `done`."""
    k_all = len(test_ep_texts)
    out = []
    cfg, phases, dones = dense_records(dense_fixture) if dense_fixture else (None, [], [])
    for k, text in enumerate(test_ep_texts):
        out += [marker(event="trial", rank=r, trial=k, trials=k_all, arm="deepep") for r in range(num_ranks)]
        out.append(text.rstrip("\n"))
        if dense_fixture:
            out += [marker(event="trial", rank=r, trial=k, trials=k_all, arm="dense") for r in range(num_ranks)]
            if k == 0:
                out.append("[dense_a2a] " + json.dumps(cfg, sort_keys=True))
            scale = (dense_scales or [1.0] * k_all)[k]
            out += ["[dense_a2a] " + json.dumps(r, sort_keys=True) for r in dense_trial(phases, k, scale)]
    if done:
        out += ["[dense_a2a] " + json.dumps(d, sort_keys=True) for d in dones]
        out += [marker(event="done", rank=r, trials=k_all) for r in range(num_ranks)]
    return "\n".join(out) + "\n"


def real_ep1_texts(k: int) -> list[str]:
    """k test_ep.py outputs, cycling through the three real H200 EP1 logs."""
    return [REAL_EP1[i % len(REAL_EP1)].read_text() for i in range(k)]
