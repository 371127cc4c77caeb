"""The Megatron gate's judge (gates.training, MegatronGate): each arm's parsed log -> checks, per-step statistics,
the transport evidence, and the arms' agreement (cross-arm checks).

Invariants: each function is pure (no process, no file); a check never passes on a missing number
(report.evaluate); a bar names the arm it judges, else it judges every arm.
"""

from __future__ import annotations

import math

from ...gates import transport
from ...gates.parsers.training import loss_metrics, rel_diff_max
from ...gates.parsers.transport import parse_transport
from ...gates.spec import Profile
from ...gates.training_spec import TrainingBar, TrainingSpec
from ...report import evaluate

GB = 1e9  # the campaign's "EFA TX >= 1 GB": decimal gigabytes of hw_counters tx_bytes


def step_statistics(arm: str, parsed) -> dict:
    """`data.statistics` entries from an arm's per-step figures (issue 16: a training run's steps are already
    repeated samples): `<arm>.step_ms` and `<arm>.tokens_per_s` over the steps after the first (step 1 carries
    set-up and JIT), when at least two such steps have the figure (evidence.bars.stats; reported, no bar)."""
    from ..bars.stats import statistics_block, summarize

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


def arm_checks(
    spec: TrainingSpec, profile: Profile[TrainingBar], name: str, parsed, data: dict, nccl: dict | None = None
) -> list:
    """Structural checks and the profile's per-arm bars for one completed arm (metric `<arm>.<metric>`), and on an
    EFA profile `<arm>.transport` (arm_transport). `data`: the arm's report entry (gets `metrics` and
    `transport`); `nccl`: the one-NCCL check of the kernel setup."""
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
    checks += arm_transport(spec, profile, name, parsed, data)
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


def arm_transport(spec: TrainingSpec, profile: Profile[TrainingBar], name: str, parsed, data: dict) -> list:
    """The transport proof per rank of one arm (gates.transport) on an EFA profile: every rank of the run on
    `NET/OFI efa`, and GIN on for the DeepEP arm when the arm's env turns it on (the all-to-all arm uses no GIN);
    a rank on Socket, a second plugin, or GIN off fails `<arm>.transport` naming it. No check without a network:
    `data["transport"]` says why."""
    env = {**spec.env, **profile.env, **spec.arms[name].env}
    need = transport.need(profile, env, gin=spec.arms[name].deepep)
    if need is None:
        data["transport"] = {"checked": False, "why": transport.no_network(profile)}
        return []
    parsed_t = parsed.rank_transports or parse_transport("")
    data["transport"] = {"checked": True, "need": need.to_dict(), **parsed_t.to_dict()}
    return [transport.check(f"{name}.transport", need, parsed_t, where=f"{name} arm")]


def cross_arm(spec: TrainingSpec, results: dict) -> dict | None:
    """The arms' agreement when both completed: the max over steps of the relative loss difference, reported by
    every run whether or not a bar judges it (None when an arm is missing)."""
    a, b = spec.deepep_arm, spec.reference_arm
    if not (a and b and a in results and b in results):
        return None
    return {
        "loss_rel_diff_max": rel_diff_max(results[a]["parse"].losses, results[b]["parse"].losses),
        "how": f"max over steps of |loss[{a}] - loss[{b}]| / loss[{b}]",
    }


def cross_checks(spec: TrainingSpec, profile: Profile[TrainingBar], results: dict) -> list:
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
