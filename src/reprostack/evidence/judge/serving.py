"""The judge of the serving gates (gates.serving): what each arm's run produced (ArmRun) -> checks -> verdict ->
report. Per arm that asserts it: the backend lines on every rank (scope all) or at least once, the forbidden ones
never (parsers.servelog), and on an EFA profile the transport proof per rank (gates.transport); per cell: no errors,
every request completed, and on the bars' arm the agg tok/s bar, judged on the profile runs' 95% interval (one run
of a GPU profile: INCONCLUSIVE, never PASS; the local-test profile's one run: on its figure). The report's data: each
arm's cells, backend assertion and transport, the DeepEP/alternative ratios and their intervals (evidence.bars.ratio),
the statistics of every cell with two or more runs (evidence.bars.stats), the bars and where they come from.

Invariants: an arm that could not measure makes the gate an ERROR (report.decide), never a FAIL or PASS; a skipped
arm is named in the reason and a gate whose DeepEP arm did not run never passes (report.require_deepep_arm); a
profile whose bars are unmeasured never passes (gates.base.verdict); nothing here runs or writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...gates import transport
from ...gates.aiperfrun import CellResult
from ...gates.base import RunState, verdict
from ...gates.parsers.servelog import ServeLogReport
from ...gates.parsers.transport import parse_transport
from ...gates.servingspec import Arm, ServingProfile, ServingSpec
from ...report import Check, GateReport, Result, decide, evaluate, evaluate_interval, require_deepep_arm
from ..bars.ratio import ratio_intervals
from ..bars.stats import statistics_block, summarize


@dataclass
class ArmRun:
    """What one arm produced: cells, the backend assertion (deepep arm), server log(s), and `error` (str) when the
    arm could not produce a trustworthy measurement."""

    arm: Arm
    cells: list[CellResult] = field(default_factory=list)
    backend: ServeLogReport | None = None
    logs: list[Path] = field(default_factory=list)
    error: str | None = None
    probe_s: float | None = None
    server_exit: int | None = None
    skipped: str | None = None  # why the arm is SKIP (the engine did not engage its backend), else None
    transport: dict | None = None
    transport_check: Check | None = None
    nccl: dict = field(default_factory=dict)  # {pid: procmaps record} of the server's processes, read while it ran


def judge(
    st: RunState[ServingSpec, ServingProfile], runs: list[ArmRun], stem: str, tokenizer: str | None
) -> GateReport:
    """The report of gate `stem` from its arms' runs (their AIPerf's `tokenizer`): every arm's data (cells, backend,
    transport), the ratios and their intervals, the statistics, the bars; its checks; the verdict (ERROR when an arm could not measure; a
    skipped arm named; never PASS without the DeepEP arm; the first rank that died named on a FAIL)."""
    spec, profile = st.spec, st.profile
    data = {
        "arms": {
            r.arm.name: {
                "role": r.arm.role,
                "error": r.error,
                "skipped": r.skipped,
                "probe_s": r.probe_s,
                "server_exit_before_stop": r.server_exit,
                "cells": [c.to_dict() for c in r.cells],
                "backend": r.backend.to_dict() if r.backend else None,
                "transport": r.transport,
            }
            for r in runs
        },
        "ratios_deepep_over_alternative": _ratios(runs),
        "ratio_intervals_deepep_over_alternative": ratio_intervals(runs),
        "profile": profile.description,
        "statistics": _statistics(runs),
        "trials": st.opts.trials,
        "tokenizer": tokenizer,
        "bars": {
            "status": profile.bars_status,
            "tolerance": profile.bars.tolerance,
            "why": profile.bars.why,
            "published": profile.bars.published,
            "source": profile.bars.source,
        },
        "backend_assertion_note": spec.assertion(profile)[2] or None,
    }
    checks = checks_of(spec, profile, runs)
    errors = [f"arm {r.arm.name}: {r.error}" for r in runs if r.error]
    if errors:
        result, reason = decide(checks, ran_ok=False, failure_reason="; ".join(errors))
    else:
        result, reason = verdict(profile, checks, spec.path.name)
    skips = [f"arm {r.arm.name} SKIP: {r.skipped}" for r in runs if r.skipped]
    if skips:
        reason = "; ".join([reason, *skips])
    deepep = next(a.name for a in spec.arms.values() if a.role == "deepep")
    ran = [r.arm.name for r in runs if not r.skipped]
    result, reason = require_deepep_arm(result, reason, deepep, ran)
    if result == Result.FAIL:
        dead = next((r.backend for r in runs if r.backend and r.backend.first_dead_rank is not None), None)
        if dead is not None:
            reason += f"; first rank that died: {dead.first_dead_rank} ({dead.death})"
    return GateReport(
        stem,
        profile.name,
        result,
        reason,
        checks=checks,
        provenance=st.prov,
        artifacts=st.artifacts,
        data=data,
    )


def checks_of(spec: ServingSpec, profile: ServingProfile, runs: list[ArmRun]) -> list[Check]:
    """Every arm's backend assertion (the arms that assert it) and every cell's checks."""
    bar_arm = profile.bars.arm or next(a.name for a in spec.arms.values() if a.role == "deepep")
    out: list[Check] = []
    for run in runs:
        if run.arm.assert_backend and run.backend is not None and not run.skipped:
            out += _backend_checks(profile, run.arm.name, run.backend)
        if run.transport_check is not None and not run.skipped:
            out.append(run.transport_check)
        for c in run.cells:
            out += _cell_checks(profile, run.arm.name, c, bars=run.arm.name == bar_arm)
    return out


def arm_transport(profile: ServingProfile, env: dict, arm: str, text: str) -> tuple[dict, Check | None]:
    """The transport proof per rank (gates.transport) of the arm that runs DeepEP, from the NCCL INFO lines of every
    node's server log: on an EFA profile every rank on `NET/OFI efa`, no second plugin, GIN on when the env turns it
    on (the type the stack asks for when it is GPU-initiated); each process's rank from NCCL's init lines (the
    widest communicator). (data, check); on a profile without a network: why nothing is checked, no check."""
    need = transport.need(profile, env, gin=True)
    if need is None:
        return {"checked": False, "why": transport.no_network(profile)}, None
    parsed = parse_transport(text, {})
    data = {"checked": True, "need": need.to_dict(), **parsed.to_dict()}
    return data, transport.check(f"{arm}.transport", need, parsed, where=f"the {arm} arm's server log(s)")


def _backend_checks(profile: ServingProfile, arm: str, backend: ServeLogReport) -> list[Check]:
    """Each required line on every rank (scope all) or at least once, and each forbidden line never."""
    checks = []
    for r in backend.required:
        example = r.examples[0] if r.examples else None
        if r.scope == "all":
            missing = f"missing ranks {r.missing_ranks}" if r.missing_ranks else None
            note = "; ".join(x for x in (missing, example) if x) or None
            got = profile.ep_size - len(r.missing_ranks)
            checks.append(evaluate(f"{arm}.backend.{r.name}", "ranks", got, "==", profile.ep_size, note=note))
        else:
            checks.append(evaluate(f"{arm}.backend.{r.name}", "lines", r.total, ">=", 1, note=example))
    for f in backend.forbidden:
        note = f.examples[0] if f.examples else None
        checks.append(evaluate(f"{arm}.backend.forbidden.{f.name}", "lines", f.total, "==", 0, note=note))
    return checks


def _cell_checks(profile: ServingProfile, arm: str, c: CellResult, *, bars: bool) -> list[Check]:
    """A cell's errors and completed requests, and (the bars' arm) its agg tok/s bar: on the runs' interval, or on
    the one run of the local-test profile."""
    n = f"{arm}.{c.cell.name}"
    err_note = ", ".join(f"{k}: {v}" for k, v in sorted(c.error_types.items())) or None
    checks = [
        evaluate(f"{n}.errors", "requests", c.errors, "==", 0, note=err_note),
        evaluate(f"{n}.completed_requests", "requests", c.completed, "==", c.cell.requests),
    ]
    bar = profile.bars.threshold(c.cell.name) if bars else None
    if bar is None:
        return checks
    note = f"published {profile.bars.published[c.cell.name]} x (1 - {profile.bars.tolerance}); {profile.bars.source}"
    if len(c.samples) >= (1 if profile.needs_gpu else 2):  # a GPU profile's one run: INCONCLUSIVE, never PASS
        checks.append(evaluate_interval(f"{n}.agg_tok_s", summarize(c.samples, "tokens/sec"), ">=", bar, note=note))
    else:
        value = None if c.agg_tok_s is None else round(c.agg_tok_s, 4)
        checks.append(evaluate(f"{n}.agg_tok_s", "tokens/sec", value, ">=", bar, note=note))
    return checks


def _statistics(runs: list[ArmRun]) -> dict:
    """`data.statistics`: `<arm>.<cell>.agg_tok_s` of every cell with two or more profile runs (evidence.bars.stats)."""
    return statistics_block(
        {
            f"{r.arm.name}.{c.cell.name}.agg_tok_s": summarize(c.samples, "tokens/sec")
            for r in runs
            for c in r.cells
            if len(c.samples) >= 2
        }
    )


def _ratios(runs: list[ArmRun]) -> dict:
    deepep = next((r for r in runs if r.arm.role == "deepep"), None)
    out = {}
    if deepep is None:
        return out
    for alt in (r for r in runs if r.arm.role == "alternative"):
        by = {c.cell.name: c.agg_tok_s for c in alt.cells if c.agg_tok_s}
        out[alt.arm.name] = {
            c.cell.name: round(c.agg_tok_s / by[c.cell.name], 4)
            for c in deepep.cells
            if c.agg_tok_s and c.cell.name in by
        }
    return out
