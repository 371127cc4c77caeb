"""What gate 1 (micro) re-derives of one of its reports for `reprostack verify-report` (MicroGate.evidence,
evidence.rederive): from the test_ep log(s) the report keeps (the trials driver's, or a single run's from before
trials), every trial's figures (`data.trials.figures`, the statistics' samples), the count of missing rank x phase
lines, the dense arm's completeness and the one-NCCL record's runtime where the log holds them; the bars from the
spec the report records (a baseline bar: its tolerance and runs, judged by evidence.verify.report).

Invariants: the report, its logs and the recorded spec are untrusted input (a log that is not kept is a
RederiveError naming it); the logs are read with the parsers the run used (parsers.micro_trials, parsers.test_ep,
parsers.dense_a2a); nothing here writes or runs anything.
"""

from __future__ import annotations

from pathlib import Path

from ...gates.parsers.dense_a2a import parse_dense
from ...gates.parsers.micro_trials import parse_micro_trials
from ...gates.parsers.test_ep import parse_test_ep
from ..bars.stats import summarize
from . import BaselineRef, Rederived, begin, kept_logs, log_text


def rederive_micro(doc: dict, folder: Path, spec: dict | None, stem: str) -> Rederived:
    """MicroGate.evidence: a report of gate `stem`: from the kept test_ep log(s) (the trials driver's, or a single
    run's before trials): every trial's figures (data.trials.figures, the statistics' samples), the completeness
    count, the dense arm's, the one-NCCL record's runtime where the log holds it; the bars from the recorded spec (a
    baseline bar: its tolerance and runs)."""
    data, prof, got = begin(doc, spec)
    for b in (prof or {}).get("bars") or []:
        if isinstance(b, dict) and isinstance(b.get("baseline"), dict):
            e = b["baseline"]
            got.thresholds[b["metric"]] = BaselineRef(float(e.get("tolerance", -1)), tuple(e.get("runs") or ()))
        elif isinstance(b, dict) and "metric" in b:
            got.thresholds[b["metric"]] = b.get("threshold")
    te = data.get("test_ep")
    if not isinstance(te, dict):
        got.notes.append("no test_ep data: the test did not run")
        return got
    test_ep_logs = kept_logs(doc, stem, lambda p: p.startswith(f"{stem}/test_ep") and p.endswith(".log"))
    text = log_text(folder, doc, stem, test_ep_logs)
    ranks, modes = int(te.get("num_ranks") or 0), te.get("modes_checked") or "first"
    trials = data.get("trials")
    if isinstance(trials, dict):
        arms = tuple(trials.get("arms") or ("deepep",))
        tp = parse_micro_trials(text, num_ranks=ranks, trials=int(trials.get("trials") or 0), arms=arms, modes=modes)
        figs = tp.figures
        got.figures.update(figs)
        got.fields.update({"data.trials.figures": figs, "data.trials.complete": tp.complete})
        got.values.update({k: round(summarize(v).mean, 6) for k, v in figs.items()})
        problems = tp.problems + [p for t in tp.deepep for p in t.problems]
        got.values["ranks_x_phases_missing"] = len(problems)
        if "dense" in arms:
            got.values["dense_arm_complete"] = tp.dense_ok
        first = tp.deepep[0]
        runtimes = {r.get("runtime") for r in tp.nccl}
        if len(runtimes) == 1:
            got.values["nccl_runtime"] = runtimes.pop()
        else:
            got.notes.append("nccl_runtime: no single one-NCCL record in the log (measured apart before issue 17)")
    else:
        first = parse_test_ep(text, num_ranks=ranks, modes=modes)
        got.values.update({"dc_p50_us": first.dc_p50_us, "ranks_x_phases_missing": len(first.problems)})
        got.notes.append("nccl_runtime: measured in its own process before issue 17, not in the kept log")
        dense = data.get("dense")
        if isinstance(dense, dict) and isinstance(dense.get("parse"), dict):
            d = parse_dense(log_text(folder, doc, stem, ["dense_a2a.log"]), world=ranks)
            got.fields["data.dense.parse.dc_p50_us"] = d.dc_p50_us
            got.values["dense_arm_complete"] = d.ok
    got.fields.update({"data.test_ep.dc_p50_us": first.dc_p50_us, "data.test_ep.complete": first.complete})
    return got
