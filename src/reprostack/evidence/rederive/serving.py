"""What a serving gate (vllm, sglang, trtllm) re-derives of one of its reports for `reprostack verify-report`
(ServingGate.evidence, evidence.rederive): every completed cell's AIPerf exports read again (errors, completed
requests, agg tok/s and each profile run's figure), each asserting arm's backend lines from its kept server log(s)
against the patterns of the spec the report records, and each tok/s bar (published x (1 - tolerance)) of that spec.

Invariants: the report, its kept exports and logs and the recorded spec are untrusted input (a cell whose exports do
not read, a figure they do not give, or a recorded backend-assertion that does not compile is a RederiveError naming
it); the exports and logs are read with the readers the run used (gates.aiperfrun.read_cell, parsers.servelog);
nothing here writes or runs anything.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...gates.aiperfrun import read_cell
from ...gates.parsers.servelog import Requirement, assert_backend
from ...gates.servingspec import Cell
from ..bars.stats import summarize
from . import Rederived, RederiveError, begin, kept_logs, log_text, same


def rederive_serving(doc: dict, folder: Path, spec: dict | None, stem: str) -> Rederived:
    """ServingGate.evidence: every completed cell's AIPerf exports read again (errors, completed requests, agg tok/s
    and each profile run's figure), each asserting arm's backend lines from its kept server log(s) against the
    recorded spec's patterns, and each tok/s bar (published x (1 - tolerance)) of the recorded spec."""
    data, prof, got = begin(doc, spec)
    arms = data.get("arms") if isinstance(data.get("arms"), dict) else {}
    spec_arms = (spec or {}).get("arms") if isinstance((spec or {}).get("arms"), dict) else {}
    bars = (prof or {}).get("bars") if isinstance((prof or {}).get("bars"), dict) else {}
    deepep = next((n for n, a in spec_arms.items() if isinstance(a, dict) and a.get("role") == "deepep"), None)
    bar_arm = bars.get("arm") or deepep
    for arm, entry in arms.items():
        for c in (entry or {}).get("cells") or []:
            if not isinstance(c, dict) or c.get("status") != "ok":
                continue
            cell = Cell(str(c.get("cell")), int(c.get("concurrency") or 0), int(c.get("requests_expected") or 0))
            runs = len(c.get("runs") or []) or 1
            res = read_cell(arm, cell, folder / stem / arm / cell.name, runs)
            if res.status != "ok":
                raise RederiveError(f"{stem}/{arm}/{cell.name}: {res.detail}")
            for k, mine in (("agg_tok_s", res.agg_tok_s), ("samples", res.samples or None)):  # the cell's own figures
                if k in c and mine is not None and not same(c[k], mine):
                    raise RederiveError(f"{stem}/{arm}/{cell.name}: {k} {c[k]!r} but its AIPerf exports give {mine!r}")
            n = f"{arm}.{cell.name}"
            got.values[f"{n}.errors"], got.values[f"{n}.completed_requests"] = res.errors, res.completed
            if res.samples:
                got.values[f"{n}.agg_tok_s"] = round(summarize(res.samples, "tokens/sec").mean, 6)
                got.figures[f"{n}.agg_tok_s"] = list(res.samples)
            elif res.agg_tok_s is not None:
                got.values[f"{n}.agg_tok_s"] = round(res.agg_tok_s, 4)
            pub = (bars.get("published") or {}).get(cell.name) if arm == bar_arm else None
            if pub is not None:
                got.thresholds[f"{n}.agg_tok_s"] = round(float(pub) * (1 - float(bars.get("tolerance", 0))), 6)
        sa = spec_arms.get(arm) if isinstance(spec_arms.get(arm), dict) else {}
        if entry and entry.get("backend") and sa.get("assert-backend", sa.get("role") == "deepep"):
            _rederive_backend(got, doc, folder, spec, prof, stem, arm)
    return got


def _rederive_backend(got, doc: dict, folder: Path, spec: dict | None, prof: dict | None, stem: str, arm: str) -> None:
    """rederive_serving: one asserting arm's backend lines from its kept server log(s), the recorded spec's patterns."""
    logs = kept_logs(doc, stem, lambda p: p == f"{stem}/server.{arm}.log" or p.startswith(f"{stem}/server.{arm}.node"))
    own = (prof or {}).get("backend-assertion")  # the profile's own assertion, else the spec's (ServingSpec.assertion)
    ba = own if isinstance(own, dict) else (spec or {}).get("backend-assertion") or {}
    try:
        reqs = {
            k: [Requirement(r["name"], r["pattern"], r.get("scope", "all")) for r in ba.get(k) or []]
            for k in ("required", "forbidden")
        }
        nodes, gpus = int((prof or {}).get("nodes") or 1), int((prof or {}).get("gpus-per-node") or 1)
        rep = assert_backend(
            log_text(folder, doc, stem, logs),
            num_ranks=nodes * gpus,
            gpus_per_node=gpus,
            required=reqs["required"],
            forbidden=reqs["forbidden"],
        )
    except (KeyError, TypeError, re.error) as e:
        raise RederiveError(f"the recorded spec's backend-assertion: {e}") from None
    for r in rep.required:
        got.values[f"{arm}.backend.{r.name}"] = nodes * gpus - len(r.missing_ranks) if r.scope == "all" else r.total
    for f in rep.forbidden:
        got.values[f"{arm}.backend.forbidden.{f.name}"] = f.total
