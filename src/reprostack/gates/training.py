"""Gate 5 (megatron): lock -> sources (Megatron-LM tree, NCCL, DeepEP) -> kernels -> one training run per arm
-> parsed steps -> checks and bars -> report.

Each arm runs the driver under torchrun with the same seed; the DeepEP arm in the one-NCCL overlay of the
pinned NCCL + DeepEP build (kernels/), the comparison arm in the same environment, so the arms differ only
in Megatron's token dispatcher. The gate passes only on measured evidence: every step of every arm logged,
finite, every structural check (DeepEP's active buffer is `ElasticBuffer`, the only NCCL mapped is the
pinned one, both arms started from the same weights) and every bar of the profile met. No GPU (or too few,
or no EFA where the profile needs it, or no profile fits the host) -> SKIP with the reason, after sources were
fetched and verified. Only the comparison arm run (`--arm alltoall`) -> never a PASS (SKIP naming why).
An arm that crashes or times out -> ERROR naming that arm's classified failure; the other arm's checks are
still reported and stand on their own. In container mode (`prebuilt`, the image's kernels manifest) the Megatron-LM
tree and the kernels are the image's, checked against the lock (gates.micro.source_trees): nothing fetched or built.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import hostinfo, ui
from ..errors import ReprostackError
from ..kernels import runtime
from ..lock import Lock
from ..report import GateReport, artifact_for, decide, evaluate, require_deepep_arm, skipped, utc_now
from ..launch import torchrun
from .micro import GateRunOptions, choose_profile, setup_kernels, source_trees
from .parsers.failure import classify_failure
from .parsers.training import loss_metrics, parse_megatron, rel_diff_max
from .spec import NoProfileForHost
from .training_spec import TrainingSpec, load_training_spec
from ..launch.watchdog import run_with_watchdog

GB = 1e9  # the campaign's "EFA TX >= 1 GB": decimal gigabytes of hw_counters tx_bytes


@dataclass
class TrainingOptions(GateRunOptions):
    """GateRunOptions plus `arms`: run only these arms (default: every arm)."""

    arms: list[str] | None = None


def provenance(lock: Lock, spec: TrainingSpec, trees: dict) -> dict:
    """Lock and spec sha256, and url/rev/tree/patched tree/series of every source used."""
    ups = {
        n: {
            "url": st.pin.url,
            "rev": st.pin.rev,
            "tree": st.pin.tree,
            "patched_tree": st.pin.patched_tree,
            "series": [f"{p.kind} {p.value} ({p.upstream_status})" for p in st.pin.patches],
        }
        for n, st in trees.items()
    }
    return {"lock_sha256": lock.sha256, "gate_spec_sha256": spec.sha256, "upstreams": ups}


def host_skip(gate: str, spec: TrainingSpec, opts, host: dict, prov: dict, what: str):
    """(profile, None) when this host can run the gate, else (None, a SKIP report naming why)."""
    if host["gpu_count"] == 0:
        return None, skipped(
            gate, opts.profile or "-", f"no GPU on this host (nvidia-smi lists none): {what}", provenance=prov
        )
    try:
        profile = choose_profile(spec, opts.profile, host)
    except NoProfileForHost as e:
        return None, skipped(gate, "-", f"{e}: {what}", provenance=prov)
    if profile.gpus_per_node > host["gpu_count"]:
        return None, skipped(
            gate,
            profile.name,
            f"profile {profile.name} needs {profile.gpus_per_node} GPU(s) per node, this host has {host['gpu_count']}",
            provenance=prov,
        )
    if profile.needs_efa and not host["efa_devices"]:
        return None, skipped(
            gate, profile.name, f"profile {profile.name} needs EFA devices; none found", provenance=prov
        )
    return profile, None


def _kernels(
    opts: TrainingOptions, trees: dict, prov: dict, timings: dict, data: dict, pre=None
) -> tuple[dict, object]:
    """Build NCCL + DeepEP (cached), or take the image's (`pre`, container mode), and return (environment with
    exactly one NCCL, the Kernels). Raises ReprostackError (BuildError) when a build or the one-NCCL check fails."""
    kern = setup_kernels(opts, trees, prov, timings, pre)
    env = dict(kern.env)
    one = runtime.check_one_nccl(opts.python, env, kern.nccl_lib, accept_sha256=kern.accept_sha256)
    data["nccl"] = {
        "runtime": one["runtime"],
        "mapped": one["mapped"],
        "torch_built_with": one["torch_built_with"],
        "pinned": kern.nccl_version,
    }
    env["EP_JIT_CACHE_DIR"] = str(kern.jit_dir)
    return env, kern


def _launch(opts: TrainingOptions, spec: TrainingSpec, profile, script: str, args: list[str]):
    nodes = opts.nodes or profile.nodes
    torchrun.need_master(profile.name, nodes, opts.master_addr, opts.master_port)
    return torchrun.torchrun_workers(
        opts.python,
        script,
        args,
        gpus=profile.gpus_per_node,
        nodes=nodes,
        node_rank=opts.node_rank,
        master_addr=opts.master_addr,
        master_port=opts.master_port,
    ), nodes


def _run_arm(opts, spec, profile, arm, env: dict, run_dir: Path, artifacts: list) -> dict:
    """Start one arm, keep its log, parse it. Returns {"parse", "outcome", "failure"?, "log"}."""
    args = [*spec.args, *arm.args, *profile.args, *opts.extra_args]
    launch, nodes = _launch(opts, spec, profile, str(Path(opts.root) / spec.driver), args)
    arm_env = {**env, **spec.env, **profile.env, **arm.env, **launch.env}
    log = run_dir / (f"{arm.name}.node{opts.node_rank}.log" if nodes > 1 else f"{arm.name}.log")
    with ui.step(f"{spec.gate} {arm.name} [{profile.name}]", log=log):
        outcome = run_with_watchdog(
            launch.argv,
            env=arm_env,
            cwd=str(opts.out_dir),
            log_path=log,
            timeout_s=opts.timeout_s or spec.timeout_s,
            echo=False,
        )
    # one log per node; with a shared --out, node 0 reads every node's (transport lines are per node)
    logs = sorted(run_dir.glob(f"{arm.name}.node*.log")) if nodes > 1 else [log]
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    parsed = parse_megatron(text, expected_steps=spec.steps)
    artifacts.extend(artifact_for(p, relative_to=opts.out_dir) for p in logs)
    res = {
        "parse": parsed,
        "outcome": outcome,
        "command": launch.argv,
        "log": str(log.name),
        "env": {k: arm_env[k] for k in sorted({*spec.env, *profile.env, *arm.env, "PYTHONPATH"}) if k in arm_env},
    }
    if not parsed.complete:
        res["failure"] = classify_failure(text, outcome.returncode, outcome.timed_out)
    return res


def step_statistics(arm: str, parsed) -> dict:
    """`data.statistics` entries from an arm's per-step figures (issue 16: a training run's steps are already
    repeated samples): `<arm>.step_ms` and `<arm>.tokens_per_s` over the steps after the first (step 1 carries
    set-up and JIT), when at least two such steps have the figure (report.stats; reported, no bar)."""
    from ..report.stats import statistics_block, summarize

    out = {}
    for field_, unit in (("step_ms", "ms"), ("tokens_per_s", "tokens/sec")):
        vals = [getattr(s, field_) for s in parsed.steps[1:]]
        if len(vals) >= 2 and all(v is not None and math.isfinite(v) for v in vals):
            out[f"{arm}.{field_}"] = summarize(vals, unit)
    return statistics_block(out)


def transport_evidence(parsed, host: dict) -> str:
    """Which transport evidence an arm has: `hw_counters` (EFA tx_bytes measured), `provider log lines`
    (NCCL OFI `Selected provider is efa` only), or `no EFA device`."""
    if parsed.efa_tx_bytes is not None:
        return "hw_counters"
    if "efa" in parsed.providers:
        return "provider log lines"
    return "no EFA device" if not host.get("efa_devices") else "none (EFA present, no counters, no provider line)"


def arm_checks(spec: TrainingSpec, profile, name: str, parsed, data: dict, nccl: dict | None = None) -> list:
    """Structural checks and the profile's per-arm bars for one completed arm (metric `<arm>.<metric>`).
    `data`: the arm's report entry (gets `metrics`); `nccl`: the one-NCCL check of the kernel setup."""
    m = loss_metrics(parsed)
    m["efa_tx_gb"] = None if parsed.efa_tx_bytes is None else parsed.efa_tx_bytes / GB
    data["metrics"] = m
    checks = [
        evaluate(
            f"{name}.steps_problems", "lines", len(parsed.problems), "==", 0, note="; ".join(parsed.problems) or None
        ),
        evaluate(f"{name}.nonfinite", "values", m["nonfinite"], "==", 0, note="loss and grad_norm of every step"),
    ]
    if spec.arms[name].deepep:
        checks.append(
            evaluate(
                f"{name}.buffer_class",
                "",
                parsed.buffer_class,
                "==",
                "ElasticBuffer",
                note=f"fused_a2a._buffer after step 1 ({parsed.buffer_module}); never the legacy Buffer",
            )
        )
        nccl = nccl or {}
        checks.append(
            evaluate(
                f"{name}.nccl_runtime",
                "version",
                nccl.get("runtime"),
                "==",
                nccl.get("pinned") or "?",
                note=f"ncclGetVersion of the only NCCL mapped: {(nccl.get('mapped') or ['?'])[0]}",
            )
        )
    for bar in profile.bars:
        if bar.metric == "arms_loss_rel_diff_max":
            continue
        default_arm = spec.deepep_arm if bar.metric == "efa_tx_gb" else None
        if (bar.arm or default_arm) not in (None, name):
            continue
        checks.append(
            evaluate(f"{name}.{bar.metric}", bar.unit, m.get(bar.metric), bar.op, bar.threshold, note=bar.source)
        )
    return checks


def cross_checks(spec: TrainingSpec, profile, results: dict) -> list:
    """Checks that compare the DeepEP arm with the reference arm (both must have completed)."""
    a, b = spec.deepep_arm, spec.reference_arm
    if not (a and b and a in results and b in results):
        return []
    pa, pb = results[a]["parse"], results[b]["parse"]
    checks = [
        evaluate(
            "arms_init_checksum_equal",
            "",
            pa.init_checksum == pb.init_checksum and pa.init_checksum is not None,
            "==",
            True,
            note=f"{a} {pa.init_checksum} vs {b} {pb.init_checksum}",
        )
    ]
    for bar in profile.bars:
        if bar.metric == "arms_loss_rel_diff_max":
            checks.append(
                evaluate(
                    bar.metric,
                    bar.unit,
                    rel_diff_max(pa.losses, pb.losses),
                    bar.op,
                    bar.threshold,
                    note=f"max over steps of |loss[{a}] - loss[{b}]| / loss[{b}]; {bar.source}",
                )
            )
    return checks


def run_megatron(opts: TrainingOptions, gate: str = "megatron") -> GateReport:
    """Run gate 5 and return its report (not yet written). Raises ReprostackError only for operator errors
    found before anything ran (bad lock/spec, fetch or patch failure, missing --master-addr)."""
    t0, started = time.monotonic(), utc_now()
    spec = load_training_spec(opts.root, gate)
    if opts.profile:
        spec.profile(opts.profile)
    unknown = [a for a in opts.arms or [] if a not in spec.arms]
    if unknown:
        raise ReprostackError(f"{spec.path}: no arm {unknown[0]!r} (known: {', '.join(spec.arms)})")
    host, timings = hostinfo.collect(), {}
    t = time.monotonic()
    # container mode (opts.prebuilt): the image's trees and kernels, its manifest checked against the lock
    trees, pre = source_trees(opts, (spec.source, *spec.kernels))
    timings["sources_s"] = round(time.monotonic() - t, 2)
    prov = provenance(opts.lock, spec, trees)
    prov["host"] = host
    data: dict = {"timings_s": timings, "arms": {}}

    def finish(report: GateReport) -> GateReport:
        timings["total_s"] = round(time.monotonic() - t0, 2)
        report.data = {**data, **report.data}
        report.started, report.ended, report.duration_s = started, utc_now(), timings["total_s"]
        return report

    profile, skip = host_skip(
        gate,
        spec,
        opts,
        host,
        prov,
        f"sources verified ({spec.source} {trees[spec.source].tree[:12]}); kernels and training not run",
    )
    if skip:
        return finish(skip)
    run_dir = Path(opts.out_dir) / gate
    run_dir.mkdir(parents=True, exist_ok=True)
    base = {**os.environ, "PYTHONPATH": ""}
    setup_error = None
    try:
        t = time.monotonic()
        base, _kern = _kernels(opts, trees, prov, timings, data, pre)
        timings["kernels_s"] = round(time.monotonic() - t, 2)
        host["nccl_runtime"] = data["nccl"]["runtime"]
    except ReprostackError as e:
        setup_error = f"setup: {e}"
    base["PYTHONPATH"] = os.pathsep.join(p for p in (base.get("PYTHONPATH"), str(trees[spec.source].path)) if p)

    results, artifacts, checks, failures = {}, [], [], []
    for name, arm in spec.arms.items():
        if opts.arms and name not in opts.arms:
            continue
        if arm.deepep and setup_error:
            failures.append(f"{name} arm: {setup_error}")
            data["arms"][name] = {"failure": {"kind": "setup", "detail": setup_error}}
            continue
        t = time.monotonic()
        res = _run_arm(opts, spec, profile, arm, base, run_dir, artifacts)
        timings[f"{name}_s"] = round(time.monotonic() - t, 2)
        parsed = res["parse"]
        entry = {
            "command": res["command"],
            "log": res["log"],
            "env": res["env"],
            "returncode": res["outcome"].returncode,
            "timed_out": res["outcome"].timed_out,
            "transport_evidence": transport_evidence(parsed, host),
            "parse": parsed.to_dict(),
        }
        data["arms"][name] = entry
        if "failure" in res:
            fc = res["failure"]
            entry["failure"] = fc.to_dict()
            failures.append(f"{name} arm: {fc.kind}: {fc.detail} ({fc.first_line})")
            continue
        results[name] = res
        checks += arm_checks(spec, profile, name, parsed, entry, data.get("nccl"))
        data.setdefault("statistics", {}).update(step_statistics(name, parsed))
    checks += cross_checks(spec, profile, results)
    if failures:
        stood = [n for n in results]
        why = "; ".join(failures) + (
            f" — completed arm(s) {', '.join(stood)}: {sum(c.passed for c in checks)}/{len(checks)} check(s) passed"
            if stood
            else ""
        )
        result, reason = decide(checks, ran_ok=False, failure_reason=why)
    else:
        result, reason = decide(checks, ran_ok=True)
    result, reason = require_deepep_arm(result, reason, spec.deepep_arm, list(results))
    return finish(GateReport(gate, profile.name, result, reason, checks=checks, provenance=prov, artifacts=artifacts))
