"""Claims for `reprostack verify` from a serving gate's committed run (issue 28 item 4): every figure the run states,
each pointing at the raw AIPerf export it must re-derive from.

    python scripts/claims_from_run.py RUN_DIR --id-prefix h200-ep1.vllm --gate vllm [--report REPORT.json]
                                      [--rounding 0.01] [--source TEXT] --out claims/h200-ep1-vllm.yaml
    .venv/bin/reprostack verify RUN_DIR --claims claims/h200-ep1-vllm.yaml

RUN_DIR holds AIPerf exports in either layout (found by walking it, in name order):
  `ARM/CELL/profile_export_aiperf.json`                                  (the published fixtures)
  `[GATE/]ARM/CELL/aiperf/profile_export_aiperf.json`                    (a gate cell, one AIPerf run)
  `[GATE/]ARM/CELL/aiperf/profile_runs/run_NNNN/profile_export_aiperf.json` (a gate cell, AIPerf's K profile runs)
Per export: the agg output tok/s (`output_token_throughput` avg) rounded to --rounding; per arm: the requests and
the errors summed over its exports (and the completed requests over its `profile_export.jsonl` files, where every
export has one). With --report (the gate's JSON report of that run) every figure is the report's own (each profile
run's `runs[k].agg_tok_s`, each cell's `request_count` and `errors`), so `verify` holds what the report says to the raw
exports, and an export the report does not state (or a figure without an export) is an error; without it the figures
are read from the exports themselves (what a table of the run would print).

Invariants: nothing is written unless every figure was found (atomic write); artifact paths are relative to RUN_DIR;
ids are unique; the output loads with reprostack.evidence.verify.claims.load_claims. Every problem is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from reprostack.atomicfile import write_text_atomic  # noqa: E402
from reprostack.gates.parsers.aiperf import EXPORT_JSON, EXPORT_JSONL, AiperfSchemaError, parse_export  # noqa: E402


class ClaimsFromRunError(Exception):
    pass


def exports(run: Path) -> list[dict]:
    """Every export under `run` with its arm, cell and profile run (1 when AIPerf made one run)."""
    out = []
    for p in sorted(run.rglob(EXPORT_JSON)):
        rel = p.relative_to(run).parts
        if "profile_runs" in rel:
            i = rel.index("profile_runs")
            arm, cell, k = rel[i - 3], rel[i - 2], rel[i + 1]
            if not k.startswith("run_") or not k[4:].isdigit():
                raise ClaimsFromRunError(f"{p}: not under profile_runs/run_NNNN/")
            k = int(k[4:])
        elif len(rel) >= 4 and rel[-2] == "aiperf":
            arm, cell, k = rel[-4], rel[-3], 1
        elif len(rel) == 3:
            arm, cell, k = rel[0], rel[1], 1
        else:
            raise ClaimsFromRunError(f"{p}: not in a layout this script knows (module doc)")
        if "aggregate" in rel:  # AIPerf's own aggregate of the K runs: our figures come from each run's export
            continue
        out.append({"path": p, "rel": "/".join(rel), "arm": arm, "cell": cell, "run": k})
    if not out:
        raise ClaimsFromRunError(f"{run}: no {EXPORT_JSON} under it")
    return out


def _report_figures(report: Path) -> dict:
    """{(arm, cell, run): agg tok/s} and {(arm, cell): (requests, errors)} of a serving gate's report."""
    try:
        data = json.loads(report.read_text())["data"]["arms"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ClaimsFromRunError(f"{report}: not a serving gate report with data.arms ({e})") from None
    agg, counts = {}, {}
    for arm, a in data.items():
        for c in a.get("cells") or []:
            runs = c.get("runs") or [{"agg_tok_s": c.get("agg_tok_s")}]
            for k, r in enumerate(runs, 1):
                agg[(arm, c["cell"], k)] = r.get("agg_tok_s")
            n = len(runs)
            counts[(arm, c["cell"])] = (
                sum(r.get("request_count") or 0 for r in runs) if c.get("runs") else c.get("request_count"),
                c.get("errors"),
                n,
            )
    return {"agg": agg, "counts": counts}


def _round(v: float, step: float) -> float:
    places = max(0, -int(math.floor(math.log10(step))))
    return round(round(v / step) * step, places)


def claims(run: Path, prefix: str, gate: str, rounding: float, source: str, report: Path | None) -> list[dict]:
    found = exports(run)
    fig = _report_figures(report) if report else None
    out = []
    for e in found:
        try:
            value = parse_export(e["path"]).value("output_token_throughput", "avg")[0]
        except (AiperfSchemaError, KeyError) as err:
            raise ClaimsFromRunError(f"{e['path']}: {str(err).strip(chr(39))}") from None
        if fig is not None:
            key = (e["arm"], e["cell"], e["run"])
            if fig["agg"].get(key) is None:
                raise ClaimsFromRunError(f"{report}: states no agg tok/s for {'/'.join(map(str, key))} ({e['rel']})")
            value = fig["agg"].pop(key)
        run_part = f".run{e['run']}" if "profile_runs" in e["rel"] else ""
        out.append(
            {
                "id": f"{prefix}.{e['arm']}.{e['cell']}{run_part}.agg",
                "gate": gate,
                "arm": e["arm"],
                "cell": e["cell"],
                "metric": "output_token_throughput",
                "stat": "avg",
                "value": _round(value, rounding),
                "unit": "tokens/sec",
                "rounding": rounding,
                "artifacts": [e["rel"]],
                "source": source,
            }
        )
    if fig is not None and fig["agg"]:
        left = ", ".join("/".join(map(str, k)) for k in sorted(fig["agg"]))
        raise ClaimsFromRunError(f"{report}: states figures with no export under {run}: {left}")
    for arm in dict.fromkeys(e["arm"] for e in found):
        mine = [e for e in found if e["arm"] == arm]
        paths = [e["rel"] for e in mine]
        cells = "+".join(dict.fromkeys(e["cell"] for e in mine))
        if fig is not None:
            per = [fig["counts"][(arm, c)] for c in dict.fromkeys(e["cell"] for e in mine)]
            requests, errors = sum(p[0] or 0 for p in per), sum(p[1] or 0 for p in per)
        else:
            requests = sum(int(parse_export(e["path"]).value("request_count")[0]) for e in mine)
            errors = sum(parse_export(e["path"]).error_count for e in mine)
        for metric, value, arts in (
            ("request_count", requests, paths),
            ("error_count", errors, paths),
        ):
            out.append(
                {
                    "id": f"{prefix}.{arm}.{metric.split('_')[0]}s",
                    "gate": gate,
                    "arm": arm,
                    "cell": cells,
                    "metric": metric,
                    "value": value,
                    "unit": "requests",
                    "rounding": 1,
                    "artifacts": arts,
                    "source": source,
                }
            )
        records = [str(Path(p).parent / EXPORT_JSONL) for p in paths]
        if all((run / r).is_file() for r in records) and fig is None:
            from reprostack.gates.parsers.aiperf import parse_records

            done = sum(parse_records(run / r).completed for r in records)
            out.append(
                {
                    "id": f"{prefix}.{arm}.completed",
                    "gate": gate,
                    "arm": arm,
                    "cell": cells,
                    "metric": "completed_requests",
                    "value": done,
                    "unit": "requests",
                    "rounding": 1,
                    "artifacts": records,
                    "source": source,
                }
            )
    return out


def to_yaml(items: list[dict], description: str) -> str:
    lines = [
        "# Generated by scripts/claims_from_run.py from a committed run: each figure and the raw AIPerf export",
        "# `reprostack verify` re-derives it from (paths relative to the run folder given to verify).",
        "schema: 1",
        f"description: {json.dumps(description)}",
        "claims:",
    ]
    for c in items:
        lines.append(f"  - id: {c['id']}")
        for k in ("gate", "arm", "cell", "metric", "stat", "value", "unit", "rounding", "artifacts", "source"):
            if k in c:
                lines.append(f"    {k}: {json.dumps(c[k])}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="claims_from_run.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--id-prefix", required=True)
    ap.add_argument("--gate", required=True)
    ap.add_argument("--report", type=Path, default=None)
    ap.add_argument("--rounding", type=float, default=0.01)
    ap.add_argument("--source", default=None, help="where the figures are stated (default: the report, or RUN_DIR)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        if not a.run.is_dir():
            raise ClaimsFromRunError(f"{a.run}: not a folder")
        if not (0 < a.rounding <= 10) or not math.isfinite(a.rounding):
            raise ClaimsFromRunError(f"--rounding {a.rounding}: must be in (0, 10]")
        source = a.source or str(a.report or a.run)
        items = claims(a.run, a.id_prefix, a.gate, a.rounding, source, a.report)
        ids = [c["id"] for c in items]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ClaimsFromRunError(f"{a.run}: two exports give the claim id {dup[0]}")
        text = to_yaml(items, f"figures of {a.run.name} ({a.gate}), re-derived from its raw AIPerf exports")
        from reprostack.evidence.verify.claims import ClaimsError, load_claims
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:  # the output must load as a claims file before it is written
            probe = Path(tmp) / "claims.yaml"
            probe.write_text(text)
            try:
                load_claims(probe)
            except ClaimsError as e:
                raise ClaimsFromRunError(f"the generated claims do not load: {e}") from None
        write_text_atomic(a.out, text)
    except ClaimsFromRunError as e:
        print(f"claims_from_run: {e}", file=sys.stderr)
        return 2
    print(f"{a.out}: {len(items)} claims from {a.run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
