"""The Megatron gate's re-derivation (MegatronGate.evidence, evidence.kind): its reports held to each arm's kept
training log and to the recorded spec's bars.

Invariants: the report, its logs and the recorded spec are untrusted input (evidence.rederive); nothing here writes.
"""

from __future__ import annotations

from pathlib import Path

from ...gates.parsers.training import loss_metrics, parse_megatron, rel_diff_max
from ..judge.megatron import GB, step_statistics


def rederive_megatron(doc: dict, folder: Path, spec: dict | None, stem: str):
    """MegatronGate's re-derivation (evidence.kind): from each arm's kept log its steps (losses, grad norms), the
    structural checks, the loss metrics the bars name, the per-step statistics, and the arms' agreement; the bars from
    the recorded spec (each arm's, the DeepEP arm's for EFA TX, the cross-arm one once). The one-NCCL check ran in its
    own process: noted."""
    from . import begin, kept_logs, log_text

    data, prof, got = begin(doc, spec)
    arms = data.get("arms") if isinstance(data.get("arms"), dict) else {}
    spec_arms = (spec or {}).get("arms") if isinstance((spec or {}).get("arms"), dict) else {}
    deepep = next((n for n, a in spec_arms.items() if isinstance(a, dict) and a.get("deepep")), "deepep")
    ref = next((n for n, a in spec_arms.items() if isinstance(a, dict) and a.get("reference")), "alltoall")
    done = {}
    for name, entry in arms.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("parse"), dict):
            continue  # an arm that never started (setup failure): its report entry says why
        logs = kept_logs(doc, stem, lambda p, n=name: p == f"{stem}/{n}.log" or p.startswith(f"{stem}/{n}.node"))
        parsed = parse_megatron(
            log_text(folder, doc, stem, logs), expected_steps=int(entry["parse"].get("expected_steps") or 0)
        )
        rec = entry["parse"]
        got.fields.update(
            {
                f"data.arms.{name}.parse.complete": parsed.complete,
                f"data.arms.{name}.parse.problems": list(parsed.problems),
                f"data.arms.{name}.parse.init_checksum": parsed.init_checksum,
                f"data.arms.{name}.parse.buffer_class": parsed.buffer_class,
            }
        )
        if [s.get("loss") for s in rec.get("steps") or [] if isinstance(s, dict)] != parsed.losses:
            got.fields[f"data.arms.{name}.parse.steps"] = [s.__dict__ for s in parsed.steps]
        if "failure" in entry:
            continue  # its checks were not made (the verdict is an error naming it)
        done[name] = parsed
        m = loss_metrics(parsed)
        m["efa_tx_gb"] = None if parsed.efa_tx_bytes is None else parsed.efa_tx_bytes / GB
        got.values.update({f"{name}.{k}": v for k, v in m.items()})
        got.values[f"{name}.steps_problems"] = len(parsed.problems)
        if name == deepep:
            got.values[f"{name}.buffer_class"] = parsed.buffer_class
            got.notes.append(
                f"{name}.nccl_runtime: the one-NCCL check ran in its own process (data.nccl), not in the logs"
            )
        for k, s in step_statistics(name, parsed).items():
            got.figures[k] = s["samples"]
    if deepep in done and ref in done:
        a, b = done[deepep], done[ref]
        got.values["arms_init_checksum_equal"] = a.init_checksum == b.init_checksum and a.init_checksum is not None
        got.values["arms_loss_rel_diff_max"] = rel_diff_max(a.losses, b.losses)
    _bar_thresholds(got, prof, list(done), deepep, both=deepep in done and ref in done)
    return got


def _bar_thresholds(got, prof: dict | None, done: list[str], deepep: str, both: bool) -> None:
    """rederive_megatron: the recorded spec's bars, each on the arms it judges (its own arm, the DeepEP arm's for
    EFA TX, every arm's otherwise), the cross-arm bound once when both arms ran."""
    for bar in (prof or {}).get("bars") or []:
        if not isinstance(bar, dict) or "metric" not in bar:
            continue
        metric = bar["metric"]
        if metric == "arms_loss_rel_diff_max":
            if both:
                got.thresholds[metric] = bar.get("threshold")
            continue
        own = bar.get("arm") or (deepep if metric == "efa_tx_gb" else None)
        for name in done:
            if own in (None, name):
                got.thresholds[f"{name}.{metric}"] = bar.get("threshold")
