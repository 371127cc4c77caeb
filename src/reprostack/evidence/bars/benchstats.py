"""Bench figures as honest summaries: every recorded run, and the median with min/max and n (never the fastest run
alone); which machine each ran on, from what the run recorded (report.docsgen's `bench` block, `reprostack bench`).

A bench result file (`gate_micro-<host>.json`, reprostack.bench) records one cold and one warm run, or, from
`bench --repeat N`, every run in `repeats`. `bench_runs(folder)` reads each such file under `folder` once (a copy
with the same bytes, e.g. the latest one kept at the top, counts once) and returns every run, grouped by the code
that ran: the project commit the bench recorded (`project`), else its own file's folder (one invocation: runs of
unrecorded code are never pooled, since the bench's code changed between them).

Machine identity: a run says which machine it ran on only through recorded facts, `host_inventory.identity`
(machine id, boot id, GPU UUIDs: reprostack.hostinfo.identity); a run without them is `not recorded`, so two runs
are "other machines" only where their recorded identities differ.

Invariants: bench files are untrusted input (a file that is not a bench result is passed over with its path named in
`skipped`, never a crash); the summaries are pure functions of the values.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchRun:
    path: str  # the bench file, relative to results/bench's parent's parent (a project path)
    group: str
    date: str
    cold_s: float | None
    warm_s: float | None
    verdict: str
    machine: str
    seeded: int | None = None  # wheels pre-seeded in the wheelhouse (not in the cold figure); None: not recorded
    from_nothing_s: float | None = None  # fresh venv + install + the gate on a fresh cache; None: not measured
    stages: tuple = ()  # ((kind, {stage: seconds}), ...): the gate report's data.timings_s of the cold and warm run


def _f(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def machine(inventory) -> str:
    """The recorded identity of a run's machine, short: `machine-id 1a2b3c4d, boot 5e6f7a8b, GPU GPU-0c1d2e3f`, or
    `not recorded (...)` naming what was recorded instead (a host name and a PCI bus id identify no machine)."""
    inv = inventory if isinstance(inventory, dict) else {}
    ident = inv.get("identity") if isinstance(inv.get("identity"), dict) else {}
    parts = []
    if isinstance(ident.get("machine_id"), str):
        parts.append(f"machine-id {ident['machine_id'][:8]}")
    if isinstance(ident.get("boot_id"), str):
        parts.append(f"boot {ident['boot_id'][:8]}")
    uuids = [u for u in ident.get("gpu_uuids") or [] if isinstance(u, str)]
    if uuids:
        parts.append("GPU " + ", ".join(u[:12] for u in uuids[:2]) + (" ..." if len(uuids) > 2 else ""))
    if parts:
        return ", ".join(parts)
    gpus = inv.get("gpus") if isinstance(inv.get("gpus"), list) else []
    bus = gpus[0].get("pci_bus_id") if gpus and isinstance(gpus[0], dict) else None
    return f"not recorded (host name {inv.get('hostname', '?')}, GPU bus {bus or '?'})"


def _stages(runs) -> tuple:
    runs = runs if isinstance(runs, dict) else {}
    out = []
    for kind in ("cold", "warm"):
        st = (runs.get(kind) or {}).get("stages_s") if isinstance(runs.get(kind), dict) else None
        if isinstance(st, dict):
            out.append((kind, {k: v for k, v in st.items() if _f(v) is not None}))
    return tuple(out)


def _runs_of(doc: dict) -> list[tuple]:
    """(cold s, warm s, verdicts, from-nothing s, stages) of every run a bench file records."""
    reps = doc.get("repeats")
    if isinstance(reps, list) and reps:
        out = []
        for r in reps:
            if isinstance(r, dict):
                v = r.get("verdict") if isinstance(r.get("verdict"), dict) else {}
                fn = r.get("from_nothing") if isinstance(r.get("from_nothing"), dict) else {}
                out.append(
                    (
                        _f(r.get("cold_s")),
                        _f(r.get("warm_s")),
                        f"{v.get('cold')} / {v.get('warm')}",
                        _f(fn.get("total_s")),
                        _stages(r.get("runs")),
                    )
                )
        return out
    v = doc.get("verdict") if isinstance(doc.get("verdict"), dict) else {}
    return [
        (
            _f(doc.get("cold_s")),
            _f(doc.get("warm_s")),
            f"{v.get('cold')} / {v.get('warm')}",
            None,
            _stages(doc.get("runs")),
        )
    ]


def bench_runs(folder: Path, skipped: list | None = None) -> list[BenchRun]:
    """Every run of every gate bench file under `folder` (results/bench), sorted by group then date."""
    folder = Path(folder)
    root = folder.parent.parent
    seen, out = set(), []
    for p in sorted(folder.rglob("gate_*-*.json")):
        if not p.is_file() or p.is_symlink():
            continue
        raw = p.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not str(doc.get("bench", "")).startswith("gate_"):
            if skipped is not None:
                skipped.append(p.relative_to(root).as_posix())
            continue
        seen.add(digest)
        proj = doc.get("project") if isinstance(doc.get("project"), dict) else {}
        commit = proj.get("commit") if isinstance(proj.get("commit"), str) else None
        group = (
            f"project {commit[:8]}" + (" (dirty)" if proj.get("dirty") else "")
            if commit
            else p.parent.relative_to(root).as_posix()
        )
        for cold, warm, verdict, nothing, stages in _runs_of(doc):
            out.append(
                BenchRun(
                    p.relative_to(root).as_posix(),
                    group,
                    str(doc.get("date", "?")),
                    cold,
                    warm,
                    verdict,
                    machine(doc.get("host_inventory")),
                    len(doc["wheelhouse_preseeded"]) if isinstance(doc.get("wheelhouse_preseeded"), list) else None,
                    nothing,
                    stages,
                )
            )
    return sorted(out, key=lambda r: (r.group, r.date, r.path))


def summary(values) -> dict | None:
    """{n, median, min, max} of the numbers among `values`; None when there is none."""
    xs = [float(v) for v in values if _f(v) is not None]
    if not xs:
        return None
    return {"n": len(xs), "median": round(statistics.median(xs), 2), "min": min(xs), "max": max(xs)}


def spread(values) -> str:
    """`117.6 [110.5, 127.3] n=3` (median [min, max] n); `—` when there is no value."""
    s = summary(values)
    if s is None:
        return "—"
    return f"{s['median']:g} [{s['min']:g}, {s['max']:g}] n={s['n']}"
