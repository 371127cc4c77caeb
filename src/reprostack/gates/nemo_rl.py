"""Gate 6 (nemo_rl): NeMo-RL GRPO from the pinned tree -> rollout smoke + a few training steps -> report.

The command of gates/nemo_rl.yaml runs on the head node of a Ray cluster (2 nodes x 8 GPUs, the NeMo-RL
image, the model's weights), inside the pinned NeMo-RL tree. Rollout smoke: step 1's rollout returned
(a `generation` timing and a mean generation length > 0; its line is the pass line), duration = that
`generation` time. Training: every step's loss logged and finite, and the profile's bars. Without the
hardware the gate is a SKIP with the reason (never a pass); the parser is tested on logs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .. import hostinfo, sources
from ..report import GateReport, artifact_for, decide, evaluate, utc_now
from .parsers.failure import classify_failure
from .parsers.training import loss_metrics, parse_nemo_rl
from .training import TrainingOptions, host_skip, provenance
from .training_spec import load_training_spec
from ..launch.watchdog import run_with_watchdog

GATE = "nemo_rl"


def rollout_metrics(parsed) -> dict:
    """`rollout_s` (s) and `rollout_gen_len` (tokens) of step 1, `rollout_line` (the pass line), from the parse."""
    first = next((s for s in parsed.steps if s.step == 1), None)
    if first is None:
        return {"rollout_s": None, "rollout_gen_len": None, "rollout_line": None}
    return {"rollout_s": first.rollout_s, "rollout_gen_len": first.gen_len, "rollout_line": first.line}


def nemo_rl_checks(spec, profile, parsed) -> tuple[list, dict]:
    """(checks, metrics) of a completed run: steps complete, finite losses, then the profile's bars."""
    m = {**loss_metrics(parsed), **rollout_metrics(parsed)}
    checks = [
        evaluate("steps_problems", "lines", len(parsed.problems), "==", 0, note="; ".join(parsed.problems) or None),
        evaluate("nonfinite", "values", m["nonfinite"], "==", 0, note="loss of every step"),
    ]
    for bar in profile.bars:
        checks.append(evaluate(bar.metric, bar.unit, m.get(bar.metric), bar.op, bar.threshold, note=bar.source))
    return checks, m


def run_nemo_rl(opts: TrainingOptions) -> GateReport:
    """Run gate 6 (head node) and return its report. Raises ReprostackError only for operator errors found
    before anything ran (bad lock/spec, fetch failure)."""
    t0, started = time.monotonic(), utc_now()
    spec = load_training_spec(opts.root, GATE)
    if opts.profile:
        spec.profile(opts.profile)
    host = hostinfo.collect()
    tree = sources.prepare(opts.lock, spec.source, opts.fetch, opts.root)
    prov = provenance(opts.lock, spec, {spec.source: tree})
    prov["host"] = host
    data: dict = {}

    def finish(report: GateReport) -> GateReport:
        report.data = {**data, **report.data}
        report.started, report.ended = started, utc_now()
        report.duration_s = round(time.monotonic() - t0, 2)
        return report

    profile, skip = host_skip(
        GATE,
        spec,
        opts,
        host,
        prov,
        f"NeMo-RL {tree.tree[:12]} verified; GRPO needs "
        f"a Ray cluster of 2 nodes x 8 GPUs with EFA, the NeMo-RL image and the model",
    )
    if skip:
        return finish(skip)
    log = Path(opts.out_dir) / GATE / "grpo.log"
    argv = [opts.python, *spec.command, *profile.args, *opts.extra_args]
    env = {**os.environ, **spec.env, **profile.env}
    outcome = run_with_watchdog(
        argv, env=env, cwd=str(tree.path), log_path=log, timeout_s=opts.timeout_s or spec.timeout_s
    )
    text = log.read_text(errors="replace")
    parsed = parse_nemo_rl(text, expected_steps=spec.steps)
    data.update(command=argv, returncode=outcome.returncode, timed_out=outcome.timed_out, parse=parsed.to_dict())
    artifacts = [artifact_for(log, relative_to=opts.out_dir)]
    if not parsed.complete:
        fc = classify_failure(text, outcome.returncode, outcome.timed_out)
        data["failure"] = fc.to_dict()
        result, reason = decide([], ran_ok=False, failure_reason=f"{fc.kind}: {fc.detail} ({fc.first_line})")
        return finish(GateReport(GATE, profile.name, result, reason, provenance=prov, artifacts=artifacts))
    checks, data["metrics"] = nemo_rl_checks(spec, profile, parsed)
    result, reason = decide(checks, ran_ok=True)
    return finish(GateReport(GATE, profile.name, result, reason, checks=checks, provenance=prov, artifacts=artifacts))
