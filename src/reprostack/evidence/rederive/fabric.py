"""The fabric gate's re-derivation (FabricGate.evidence, evidence.kind): its reports held to the nccl-tests logs they
keep and to the recorded spec's bars.

Invariants: the report, its logs and the recorded spec are untrusted input (evidence.rederive); nothing here writes.
"""

from __future__ import annotations

from pathlib import Path

from ...gates import fabric_mpi
from ..judge.fabric import parse, transport_check


def rederive_fabric(doc: dict, folder: Path, spec: dict | None, stem: str):
    """FabricGate.evidence: each test's kept nccl-tests log parsed again: its row count (and whether the rows are
    complete: every cycle of the spec's sizes), #wrong, out-of-bounds, the NCCL it loaded, the transport of every
    rank, the busbw/algbw samples of each statistic; each bar's threshold (published x (1 - tolerance)) from the
    recorded spec."""
    from ...gates.fabric_spec import FabricTest
    from ...gates.spec import profile_from
    from . import Rederived, RederiveError, log_text, spec_profile

    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    stack = (doc.get("provenance") or {}).get("stack") or "campaign"
    prof, unmeasured = spec_profile(spec, doc.get("profile", ""), stack)
    got = Rederived(unmeasured=unmeasured)
    for b in (prof or {}).get("bars") or []:
        if isinstance(b, dict) and {"metric", "published", "tolerance"} <= set(b):
            got.thresholds[b["metric"]] = round(float(b["published"]) * (1 - float(b["tolerance"])), 2)
    runs = data.get("runs") if isinstance(data.get("runs"), dict) else {}
    if not runs:
        got.notes.append("no nccl-tests run in the report: nothing to re-derive from logs")
        return got
    launched = isinstance(data.get("launch"), dict) and data["launch"].get("launcher") == "mpi"
    where = fabric_mpi.LOGS if launched else stem  # an MPI launch's logs: where the rendered steps wrote them
    parsed = parse({name: log_text(folder, doc, where, [f"{name}.log"]) for name in runs})
    tests = (spec or {}).get("tests") if isinstance((spec or {}).get("tests"), dict) else {}
    trials = (spec or {}).get("trials")
    for name, p in parsed.tests.items():
        got.values.update(
            {
                f"{name}.rows": len(p.rows),
                f"{name}.wrong_total": p.wrong_total,
                f"{name}.out_of_bounds": p.out_of_bounds,
                f"{name}.nccl_library": p.nccl_library,
            }
        )
        t = tests.get(name)
        if isinstance(t, dict) and isinstance(trials, int):
            n = len(FabricTest(name, str(t.get("binary")), tuple(str(a) for a in t.get("args") or ())).sizes())
            per_cycle = [sum(r.cycle == c for r in p.rows) for c in range(p.cycles)]
            got.passes[f"{name}.rows"] = (
                not p.problems and p.cycles == trials and all(k == n for k in per_cycle) and bool(p.rows)
            )
    if isinstance(prof, dict):
        try:
            profile = profile_from(doc.get("profile", ""), {**prof, "bars": []}, ())
        except KeyError as e:
            raise RederiveError(f"the recorded spec's profile lacks {e}") from None
        c = transport_check(profile, parsed)
        got.values["transport"], got.passes["transport"] = c.value, c.passed
    for key in data.get("statistics") or {}:
        test, _, rest = str(key).partition(".")
        kind, _, size = rest.partition("@")
        p = parsed.get(test)
        if p is None or kind not in ("busbw_gbs", "algbw_gbs") or not size.isdigit():
            continue
        rows = p.rows_at(int(size))
        got.figures[key] = [getattr(r.out_of_place, kind) for r in rows]
    return got
