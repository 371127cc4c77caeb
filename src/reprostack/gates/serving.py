"""Serving gates (vLLM, SGLang, TRT-LLM): spec -> server per arm -> readiness probe -> AIPerf sweep -> backend
assertion on the server log -> checks -> report.

Verdict (report.decide): ERROR when a server or AIPerf could not produce a trustworthy measurement (server not
ready in time or dead, AIPerf non-zero or no export); FAIL when it ran and a check failed (errors, incomplete
requests, agg tok/s below the bar, backend assertion); PASS only when every check passed and the deepep arm ran
(an alternative arm alone is comparison evidence: a SKIP naming that). SKIP (never a pass) when the host lacks
what the profile needs or no profile fits it. On a worker node (`node_rank > 0`) the gate only serves: it starts
the worker command and waits for it; its report is a SKIP that says the verdict is node 0's.
Trials: `--trials K` (K >= 2) runs each cell as AIPerf's K profile runs (gates.aiperfrun) and judges the tok/s bar
on their 95% interval (INCONCLUSIVE when it straddles the bar; `data.statistics` per `<arm>.<cell>.agg_tok_s`);
the errors and completed-requests checks then cover every run. Default: DEFAULT_TRIALS (3) runs per cell on a GPU
profile, where one run (`--trials 1`) is INCONCLUSIVE on its bar, never PASS; one run on the local-test profile
(the stand-in server's PASS is never evidence anyway).
"""

from __future__ import annotations


import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import hostinfo, ui
from ..errors import GateError, ReprostackError
from ..lock import Lock
from ..report import (
    Check,
    GateReport,
    artifact_for,
    decide,
    evaluate,
    evaluate_interval,
    require_deepep_arm,
    skipped,
    utc_now,
)
from ..report.stats import statistics_block, summarize
from ..launch import torchrun
from .aiperfrun import CellResult, profile_run_started, run_cell
from .aiperftool import AiperfTool, ensure_aiperf, make_test_tokenizer
from .parsers.failure import classify_failure
from .parsers.servelog import ServeLogReport, assert_backend
from .probe import wait_ready
from ..launch.server import ServerProcess
from .servingspec import Arm, ServingProfile, ServingSpec, load_serving_spec, render

DEFAULT_TRIALS = 3  # AIPerf profile runs per cell on a GPU profile when --trials is not given


@dataclass
class ServingOptions:
    """What the operator chose. arms: arm names to run (default: all, the deepep arm first); vars: `--var K=V`
    template values; extra_server_args: appended to the server command (the test server's fault flags)."""

    root: Path
    lock: Lock
    out_dir: Path
    cache_root: Path
    profile: str | None = None
    node_rank: int = 0
    leader_addr: str | None = None
    arms: list[str] = field(default_factory=list)
    vars: dict = field(default_factory=dict)
    extra_server_args: list[str] = field(default_factory=list)
    python: str = sys.executable
    echo: bool | None = None  # AIPerf's and the workers' output on our stdout (None: with -v)
    # --trials K: AIPerf's K profile runs per cell (aiperfrun); the tok/s bar is judged on the runs' 95% interval
    # (PASS / FAIL / INCONCLUSIVE, report.stats). None: DEFAULT_TRIALS on a GPU profile, one run on the local-test
    # profile (a stand-in server, never evidence). One run on a GPU profile is INCONCLUSIVE on its bar, never PASS.
    trials: int | None = None


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


def choose_profile(spec: ServingSpec, name: str | None, host: dict) -> ServingProfile | None:
    """The named profile, else the GPU profile matching this host (EFA and GPU count), else None (-> SKIP)."""
    if name:
        return spec.profile(name)
    gpus, efa = host.get("gpu_count", 0), bool(host.get("efa_devices"))
    for p in spec.profiles.values():
        if p.needs_gpu and p.gpus_per_node == gpus and p.needs_efa == efa:
            return p
    return None


def _variables(
    spec: ServingSpec, profile: ServingProfile, arm: Arm, opts: ServingOptions, port: int, run_dir: Path
) -> dict:
    v = {
        "model": spec.model,
        "served_model": spec.served_model,
        "port": str(port),
        "leader_addr": opts.leader_addr or "127.0.0.1",
        "nodes": str(profile.nodes),
        "node_rank": str(opts.node_rank),
        "gpus_per_node": str(profile.gpus_per_node),
        "ep": str(profile.ep_size),
        "python": opts.python,
        "run_dir": str(run_dir),
        "arm": arm.name,
        "root": str(Path(opts.root).resolve()),
    }
    v.update(spec.vars)
    v.update(profile.vars)
    v.update(arm.vars)
    v.update(opts.vars)
    return v


def _server_command(spec: ServingSpec, profile: ServingProfile, arm: Arm, opts: ServingOptions, run_dir: Path):
    server = profile.server or spec.server
    port = server.get("port", 8000) or torchrun.free_port()
    variables = _variables(spec, profile, arm, opts, port, run_dir)
    role = "leader" if opts.node_rank == 0 else "worker"
    if role == "worker" and "worker" not in server:
        raise ReprostackError(
            f"{spec.path}: {spec.gate} launches every node from the leader (no server.worker): "
            f"run the gate on node 0 only"
        )
    where = f"{spec.path}: server.{role}"
    argv = [render(a, variables, where) for a in server[role]] + list(opts.extra_server_args)
    env = dict(os.environ)
    for src, name in (
        (server.get("env", {}), "server.env"),
        (profile.env, f"profiles.{profile.name}.env"),
        (arm.env, f"arms.{arm.name}.env"),
    ):
        env.update({k: render(v, variables, f"{spec.path}: {name}.{k}") for k, v in src.items()})
    return argv, env, port, variables


def _arm_order(spec: ServingSpec, names: list[str]) -> list[Arm]:
    for n in names:
        if n not in spec.arms:
            raise ReprostackError(f"{spec.path}: no arm {n!r} (arms: {', '.join(spec.arms)})")
    chosen = [spec.arms[n] for n in (names or spec.arms)]
    return sorted(chosen, key=lambda a: a.role != "deepep")


def _run_arm(spec, profile, arm, opts, run_dir, tool: AiperfTool, tokenizer: str) -> ArmRun:
    run = ArmRun(arm)
    argv, env, port, _ = _server_command(spec, profile, arm, opts, run_dir)
    suffix = f".node{opts.node_rank}" if profile.nodes > 1 else ""
    log = run_dir / f"server.{arm.name}{suffix}.log"
    run.logs = [log]
    try:
        server = ServerProcess(argv, env=env, cwd=str(opts.root), log_path=log)
    except OSError as e:
        run.error = f"server command could not start: {argv[0]}: {e.strerror or e}"
        return run
    try:
        url = f"http://127.0.0.1:{port}"
        with ui.step(f"{spec.gate} {arm.name}: server ready [{profile.name}]", log=log):
            pr = wait_ready(
                url,
                spec.probe["path"],
                timeout_s=float(spec.probe["timeout-s"]),
                interval_s=float(spec.probe.get("interval-s", 5)),
                alive=server.alive,
            )
        run.probe_s = pr.seconds
        if not pr.ready:
            run.error = (
                f"server not ready at {url}{spec.probe['path']} after {pr.seconds} s ({pr.attempts} probes): {pr.last}"
            )
            return run
        for cell in spec.cells_for(profile):
            if not server.alive():
                run.error = f"server exited {server.returncode} before cell {cell.name}"
                break
            runs = f" x{opts.trials} runs" if opts.trials > 1 else ""  # one AIPerf process; its ETA per K
            many = opts.trials > 1  # `run k/K` as AIPerf starts each profile run (aiperfrun.profile_run_started)
            with ui.step(
                f"{spec.gate} {arm.name} {cell.name}: aiperf [{profile.name}]{runs}",
                total=opts.trials if many else None,
                unit="run",
            ) as st:
                res = run_cell(
                    tool,
                    arm=arm.name,
                    cell=cell,
                    url=url,
                    model=spec.served_model,
                    tokenizer=tokenizer,
                    aiperf=spec.aiperf,
                    cell_dir=run_dir / arm.name / cell.name,
                    extra=profile.aiperf_args,
                    echo=opts.echo,
                    runs=opts.trials,
                    on_line=ui.line_counter(st, profile_run_started) if many else None,
                )
                st.outcome = res.status
            run.cells.append(res)
            if res.status != "ok":
                dead = "" if server.alive() else f"; server exited {server.returncode}"
                run.error = f"cell {cell.name}: {res.detail}{dead}"
                break
    finally:
        run.server_exit = server.stop()
    if run.server_exit is not None and run.error is None:
        run.error = f"server exited {run.server_exit} during the sweep"
    if profile.nodes > 1:
        run.logs = sorted(run_dir.glob(f"server.{arm.name}.node*.log"))
    text = "\n".join(p.read_text(errors="replace") for p in run.logs if p.is_file())
    run.backend = assert_backend(
        text,
        num_ranks=profile.ep_size,
        gpus_per_node=profile.gpus_per_node,
        required=list(spec.required),
        forbidden=list(spec.forbidden),
    )
    if run.error and run.server_exit is not None:
        fc = classify_failure(text, run.server_exit, False)
        run.error += f" ({fc.kind}: {fc.detail}" + (f"; {fc.first_line}" if fc.first_line else "") + ")"
    if run.error and run.backend.first_dead_rank is not None:
        run.error += f"; first rank that died: {run.backend.first_dead_rank} ({run.backend.death})"
    return run


def _checks(spec: ServingSpec, profile: ServingProfile, runs: list[ArmRun]) -> list[Check]:
    checks: list[Check] = []
    bar_arm = profile.bars.arm or next(a.name for a in spec.arms.values() if a.role == "deepep")
    for run in runs:
        a = run.arm.name
        if run.arm.assert_backend and run.backend is not None:
            for r in run.backend.required:
                if r.scope == "all":
                    got = profile.ep_size - len(r.missing_ranks)
                    checks.append(
                        evaluate(
                            f"{a}.backend.{r.name}",
                            "ranks",
                            got,
                            "==",
                            profile.ep_size,
                            note="; ".join(
                                filter(
                                    None,
                                    [
                                        f"missing ranks {r.missing_ranks}" if r.missing_ranks else None,
                                        r.examples[0] if r.examples else None,
                                    ],
                                )
                            )
                            or None,
                        )
                    )
                else:
                    checks.append(
                        evaluate(
                            f"{a}.backend.{r.name}",
                            "lines",
                            r.total,
                            ">=",
                            1,
                            note=r.examples[0] if r.examples else None,
                        )
                    )
            for f in run.backend.forbidden:
                checks.append(
                    evaluate(
                        f"{a}.backend.forbidden.{f.name}",
                        "lines",
                        f.total,
                        "==",
                        0,
                        note=f.examples[0] if f.examples else None,
                    )
                )
        for c in run.cells:
            n = f"{a}.{c.cell.name}"
            err_note = ", ".join(f"{k}: {v}" for k, v in sorted(c.error_types.items())) or None
            checks.append(evaluate(f"{n}.errors", "requests", c.errors, "==", 0, note=err_note))
            checks.append(evaluate(f"{n}.completed_requests", "requests", c.completed, "==", c.cell.requests))
            if a == bar_arm:
                bar = profile.bars.threshold(c.cell.name)
                if bar is not None and len(c.samples) >= (1 if profile.needs_gpu else 2):  # GPU, 1 run: INCONCLUSIVE
                    pub = profile.bars.published[c.cell.name]
                    checks.append(
                        evaluate_interval(
                            f"{n}.agg_tok_s",
                            summarize(c.samples, "tokens/sec"),
                            ">=",
                            bar,
                            note=f"published {pub} x (1 - {profile.bars.tolerance}); {profile.bars.source}",
                        )
                    )
                elif bar is not None:
                    pub = profile.bars.published[c.cell.name]
                    checks.append(
                        evaluate(
                            f"{n}.agg_tok_s",
                            "tokens/sec",
                            None if c.agg_tok_s is None else round(c.agg_tok_s, 4),
                            ">=",
                            bar,
                            note=f"published {pub} x (1 - {profile.bars.tolerance}); {profile.bars.source}",
                        )
                    )
    return checks


def _statistics(runs: list[ArmRun]) -> dict:
    """`data.statistics`: `<arm>.<cell>.agg_tok_s` of every cell with two or more profile runs (report.stats)."""
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


def run_serving(gate: str, opts: ServingOptions) -> GateReport:
    """Run serving gate `gate` (vllm, sglang, trtllm) and return its report (not yet written).

    Raises ReprostackError/GateSpecError for operator errors found before anything ran (bad spec, unknown
    profile or arm, missing --leader-addr for a multi-node profile); everything later ends in a report.
    """
    t0, started = time.monotonic(), utc_now()
    spec = load_serving_spec(opts.root, gate)
    if opts.profile:
        spec.profile(opts.profile)
    arms = _arm_order(spec, opts.arms)
    host = hostinfo.collect()
    prov = {
        "lock_sha256": opts.lock.sha256,
        "gate_spec_sha256": spec.sha256,
        "engine": spec.engine,
        "model": spec.model,
        "host": host,
    }

    def finish(rep: GateReport) -> GateReport:
        rep.started, rep.ended, rep.duration_s = started, utc_now(), round(time.monotonic() - t0, 2)
        if profile is not None and not profile.needs_gpu:  # local-test: a stand-in server, never evidence
            rep.evidence = False
            rep.provenance["engine"] = {
                "name": "reprostack.gates.testserver",
                "stands_in_for": dict(spec.engine),
                "note": "the engine was not run",
            }
        return rep

    profile = choose_profile(spec, opts.profile, host)
    if profile is None:
        why = (
            f"no profile of {spec.path.name} matches this host ({host.get('gpu_count', 0)} GPU(s), EFA: "
            f"{bool(host.get('efa_devices'))}); --profile local-test runs the gate against the test server"
        )
        return finish(skipped(gate, opts.profile or "-", why, provenance=prov))
    if profile.needs_gpu and host.get("gpu_count", 0) < profile.gpus_per_node:
        return finish(
            skipped(
                gate,
                profile.name,
                f"profile {profile.name} needs {profile.gpus_per_node} GPU(s) per "
                f"node, this host has {host.get('gpu_count', 0)}",
                provenance=prov,
            )
        )
    if profile.needs_efa and not host.get("efa_devices"):
        return finish(
            skipped(gate, profile.name, f"profile {profile.name} needs EFA devices; none found", provenance=prov)
        )
    if profile.nodes > 1 and not opts.leader_addr:
        raise ReprostackError(
            f"profile {profile.name} spans {profile.nodes} nodes: give --master-addr (the leader's "
            f"address) and --node-rank on each node"
        )
    if opts.trials is None:
        opts = replace(opts, trials=DEFAULT_TRIALS if profile.needs_gpu else 1)
    run_dir = Path(opts.out_dir).resolve() / gate  # absolute: AIPerf runs inside each cell's folder
    run_dir.mkdir(parents=True, exist_ok=True)
    if opts.node_rank > 0:
        return finish(_serve_worker(spec, profile, arms, opts, run_dir, prov))
    try:
        tool = ensure_aiperf(opts.lock, opts.cache_root, opts.root, base_python=sys.executable)
        prov["aiperf"] = {"version": tool.version, "wheel_sha256": tool.sha256}
        tok = profile.tokenizer or spec.model
        if tok == "test":
            tokenizer = str(make_test_tokenizer(tool, run_dir / "tokenizer"))
        else:
            tokenizer = render(
                tok,
                _variables(spec, profile, arms[0], opts, 0, run_dir),
                f"{spec.path}: profiles.{profile.name}.tokenizer",
            )
    except GateError as e:
        return finish(GateReport(gate, profile.name, "error", f"setup: {e}", provenance=prov))

    runs = [_run_arm(spec, profile, arm, opts, run_dir, tool, tokenizer) for arm in arms]
    artifacts = []
    for r in runs:
        for p in r.logs:
            if p.is_file():
                artifacts.append(artifact_for(p, relative_to=opts.out_dir))
        for c in r.cells:
            runs_dirs = sorted((c.dir / "aiperf" / "profile_runs").glob("run_*")) if c.runs else []
            for p in (
                c.log,
                *(
                    d / f
                    for d in (c.dir / "aiperf", *runs_dirs)
                    for f in ("profile_export_aiperf.json", "profile_export.jsonl")
                ),
            ):
                if p.is_file():
                    artifacts.append(artifact_for(p, relative_to=opts.out_dir))
    data = {
        "arms": {
            r.arm.name: {
                "role": r.arm.role,
                "error": r.error,
                "probe_s": r.probe_s,
                "server_exit_before_stop": r.server_exit,
                "cells": [c.to_dict() for c in r.cells],
                "backend": r.backend.to_dict() if r.backend else None,
            }
            for r in runs
        },
        "ratios_deepep_over_alternative": _ratios(runs),
        "profile": profile.description,
        "statistics": _statistics(runs),
        "trials": opts.trials,
        "tokenizer": tokenizer,
        "bars": {
            "tolerance": profile.bars.tolerance,
            "why": profile.bars.why,
            "published": profile.bars.published,
            "source": profile.bars.source,
        },
    }
    checks = _checks(spec, profile, runs)
    errors = [f"arm {r.arm.name}: {r.error}" for r in runs if r.error]
    result, reason = decide(checks, ran_ok=not errors, failure_reason="; ".join(errors))
    deepep = next(a.name for a in spec.arms.values() if a.role == "deepep")
    result, reason = require_deepep_arm(result, reason, deepep, [r.arm.name for r in runs])
    if result == "fail":
        dead = next((r.backend for r in runs if r.backend and r.backend.first_dead_rank is not None), None)
        if dead is not None:
            reason += f"; first rank that died: {dead.first_dead_rank} ({dead.death})"
    return finish(
        GateReport(gate, profile.name, result, reason, checks=checks, provenance=prov, artifacts=artifacts, data=data)
    )


def _serve_worker(spec, profile, arms, opts, run_dir, prov) -> GateReport:
    """Worker node: run the worker command of the first chosen arm until it exits or the spec's timeout."""
    from ..launch.watchdog import run_with_watchdog

    arm = arms[0]
    argv, env, _port, _ = _server_command(spec, profile, arm, opts, run_dir)
    log = run_dir / f"server.{arm.name}.node{opts.node_rank}.log"
    out = run_with_watchdog(argv, env=env, cwd=str(opts.root), timeout_s=spec.timeout_s, log_path=log, echo=opts.echo)
    rep = skipped(
        spec.gate,
        profile.name,
        f"worker node {opts.node_rank} served arm {arm.name} (exit {out.returncode}); the verdict is node 0's report",
        provenance=prov,
    )
    rep.artifacts = [artifact_for(log, relative_to=opts.out_dir)]
    return rep
