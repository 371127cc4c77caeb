"""Write gate reports: `<gate>.json` each, `summary.json`, `summary.md`, `junit.xml`; and the exit code.

Every file is written atomically (temp file in the same folder, fsync, os.replace) and every JSON report is
validated against reprostack/schemas/report.schema.json before it is written.

Exit codes (`exit_code`): 0 every required gate is present and passed; 1 a required gate failed, errored or is
inconclusive (its trials' interval straddles a bar: evidence.bars.stats);
3 no required gate failed but one was skipped, not run (a gate it requires did not pass) or is missing (or nothing was required). 2 is left to the CLI
for operator errors (ReprostackError).
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import jsonschema

from ..atomicfile import write_text_atomic
from .model import SCHEMA_VERSION, GateReport, Result, utc_now
from .. import schemas

EXIT_PASS, EXIT_FAILED, EXIT_NOT_PROVEN = 0, 1, 3
_RESERVED = {"summary", "junit"}


@cache
def report_schema() -> dict:
    """The report JSON schema (its `$defs/summary` describes summary.json)."""
    return schemas.load("report")


def validate_report(d: dict) -> None:
    """Raise jsonschema.ValidationError when `d` is not a valid gate report."""
    jsonschema.Draft202012Validator(report_schema()).validate(d)


def validate_summary(d: dict) -> None:
    """Raise jsonschema.ValidationError when `d` is not a valid summary.json."""
    s = report_schema()
    jsonschema.Draft202012Validator({"$defs": s["$defs"], "$ref": "#/$defs/summary"}).validate(d)


def _required(reports: list[GateReport], required: set[str] | None) -> set[str]:
    return set(required) if required is not None else {r.gate for r in reports if r.required}


def exit_code(reports: list[GateReport], required: set[str] | None = None) -> int:
    """0 only when every required gate is present with result "pass" on evidence (see module doc for 1 and 3; a
    pass of a self-test profile, `evidence` false, gives 3 like a skip).

    required: gate names; None means the reports marked `required`. An empty required set gives 3: nothing
    was proven. Gates not required do not change the code.
    """
    need = _required(reports, required)
    by_gate = {r.gate: r for r in reports}
    if any(by_gate[g].result in (Result.FAIL, Result.ERROR, Result.INCONCLUSIVE) for g in need if g in by_gate):
        return EXIT_FAILED
    if not need or any(g not in by_gate or not by_gate[g].proven for g in need):  # a self-test pass proves nothing
        return EXIT_NOT_PROVEN
    return EXIT_PASS


def _finite(v):
    """Copy of a JSON-like value with non-finite floats as strings ("nan", "inf"): JSON has no NaN."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _cell(v) -> str:
    s = "" if v is None else str(v)
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


MAX_PROVENANCE_LINES = 400


def provenance_lines(prov: dict) -> list[str]:
    """The provenance as a Markdown list, one `- key.path: value` line per leaf (lists of scalars joined by commas,
    lists of objects indexed), never raw JSON; at most MAX_PROVENANCE_LINES lines, then how many more."""
    out: list[str] = []

    def leaf(v) -> str:
        if isinstance(v, bool) or v is None:
            return {True: "yes", False: "no", None: "—"}[v]
        return _cell(v).replace("`", "'")

    def walk(v, key: str) -> None:
        if isinstance(v, dict):
            if not v:
                out.append(f"- `{key}`: (empty)")
            for k in sorted(v, key=str):
                walk(v[k], f"{key}.{k}" if key else str(k))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                walk(x, f"{key}[{i}]")
        elif isinstance(v, list):
            out.append(f"- `{key}`: {', '.join(leaf(x) for x in v) if v else '(none)'}")
        else:
            out.append(f"- `{key}`: {leaf(v)}")

    walk(prov if isinstance(prov, dict) else {}, "")
    if len(out) > MAX_PROVENANCE_LINES:
        out = out[:MAX_PROVENANCE_LINES] + [f"- ... {len(out) - MAX_PROVENANCE_LINES} more (the report's JSON)"]
    return out


def _markdown(reports: list[GateReport], code: int, need: set[str]) -> str:
    out = [
        "# reprostack gate summary",
        "",
        f"Exit code {code} (0 pass, 1 a required gate failed, errored or is inconclusive, "
        "3 a required gate skipped, not run or missing).",
        "",
        "| gate | profile | result | reason |",
        "|---|---|---|---|",
    ]
    out += [
        f"| {_cell(r.gate)}{'' if r.gate in need else ' (optional)'} | {_cell(r.profile)} | "
        f"{r.label()} | {_cell(r.reason)} |"
        for r in reports
    ]
    out += [
        f"| {_cell(g)} | | MISSING | required gate has no report |" for g in sorted(need - {r.gate for r in reports})
    ]
    for r in reports:
        out += ["", f"## {r.gate}", ""]
        if r.checks:
            out += ["| metric | value | op | threshold | unit | pass |", "|---|---|---|---|---|---|"]
            out += [
                f"| {_cell(c.metric)} | {_cell(c.value)} | {_cell(c.op)} | {_cell(c.threshold)} | "
                f"{_cell(c.unit)} | {'yes' if c.passed else 'NO'} |"
                for c in r.checks
            ]
        else:
            out.append("No checks.")
        out += _statistics(r.data.get("statistics"))
        out += _measurements(r.data.get("metrics"))
        out += ["", f"Started {r.started}, ended {r.ended}, {r.duration_s} s."]
        if "execution" in r.provenance:
            from ..hostenv import describe

            out += ["", f"Ran in **{describe(r.provenance['execution'])}**."]
        out += ["", "### provenance", ""]
        out += provenance_lines(r.provenance) or ["(none)"]
        if r.artifacts:
            out += ["", "### artifacts", ""] + [
                f"- `{a.path}` sha256 {a.sha256} ({a.bytes} bytes)" for a in r.artifacts
            ]
    return "\n".join(out) + "\n"


def _statistics(stats) -> list[str]:
    """Markdown table of a report's `data.statistics` (evidence.bars.stats: n, mean, p50, stdev, 95% CI per metric)."""
    if not stats or not isinstance(stats, dict):
        return []
    out = [
        "",
        "### trials (one figure per trial; 95% CI of the mean)",
        "",
        "| metric | n | mean | p50 | stdev | 95% CI | unit | method |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, s in stats.items():
        if not isinstance(s, dict):
            continue
        ci = s.get("ci95") or [None, None]
        out.append(
            f"| {_cell(k)} | {_cell(s.get('n'))} | {_cell(_g(s.get('mean')))} | {_cell(_g(s.get('p50')))} | "
            f"{_cell(_g(s.get('stdev')))} | [{_cell(_g(ci[0]))}, {_cell(_g(ci[1]))}] | {_cell(s.get('unit'))} | "
            f"{_cell(s.get('method'))} |"
        )
    return out


def _g(v):
    """A float shown with 4 significant decimals (14.338000001 -> 14.338); anything else as is."""
    return round(v, 4) if isinstance(v, float) else v


def _measurements(rows) -> list[str]:
    """Markdown table of a report's `data.metrics` rows ({"metric", "unit", "value", "note"}), if any."""
    if not rows or not isinstance(rows, list):
        return []
    out = [
        "",
        "### measurements (reported; a bar only where a check above names the metric)",
        "",
        "| metric | value | unit | note |",
        "|---|---|---|---|",
    ]
    return out + [
        f"| {_cell(m.get('metric'))} | {_cell(m.get('value'))} | {_cell(m.get('unit'))} | {_cell(m.get('note'))} |"
        for m in rows
        if isinstance(m, dict)
    ]


def _junit(reports: list[GateReport]) -> str:
    suite = ET.Element("testsuite", name="reprostack", timestamp=utc_now())
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}

    def case(name: str, classname: str, time_s=None) -> ET.Element:
        counts["tests"] += 1
        return ET.SubElement(suite, "testcase", name=name, classname=classname, time=f"{time_s or 0:.3f}")

    for r in reports:
        tc = case(r.gate, f"reprostack.{r.gate}", r.duration_s)
        stats = r.data.get("statistics")
        if isinstance(stats, dict) and stats:  # per metric: n, mean, p50, stdev, ci95 as <property>s
            props = ET.SubElement(tc, "properties")
            for k, st in stats.items():
                for f in ("n", "mean", "p50", "stdev", "ci95", "unit", "method"):
                    if isinstance(st, dict) and f in st:
                        v = st[f]
                        ET.SubElement(
                            props,
                            "property",
                            name=f"{k}.{f}",
                            value=" ".join(map(str, v)) if isinstance(v, list) else str(v),
                        )
        if r.result in (Result.FAIL, Result.INCONCLUSIVE):
            counts["failures"] += 1
            ET.SubElement(tc, "failure", message=r.reason, type=r.result).text = r.reason
        elif r.result == Result.ERROR:
            counts["errors"] += 1
            ET.SubElement(tc, "error", message=r.reason, type="error").text = r.reason
        elif r.result in (Result.SKIP, Result.NOT_RUN) or not r.proven:
            counts["skipped"] += 1
            ET.SubElement(tc, "skipped", message=r.reason if r.result != Result.PASS else f"{r.label()}: {r.reason}")
        for c in r.checks:
            cc = case(f"{r.gate}.{c.metric}", f"reprostack.{r.gate}")
            if not c.passed:
                counts["failures"] += 1
                msg = c.describe() + (f": {c.note}" if c.note else "")
                ET.SubElement(cc, "failure", message=msg, type="inconclusive" if c.inconclusive else "check").text = msg
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("time", f"{sum(r.duration_s or 0 for r in reports):.3f}")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write_reports(
    reports: list[GateReport], out_dir: str | Path, *, required: set[str] | None = None
) -> dict[str, Path]:
    """Write all report files into out_dir (created); returns {file name: path}, e.g. {"micro.json": ...,
    "summary.json": ..., "summary.md": ..., "junit.xml": ...}.

    required: as for `exit_code` (recorded in summary.json with the exit code and the missing gates).
    Raises ValueError for duplicate or reserved gate names (`summary`, `junit`) and
    jsonschema.ValidationError for a report that does not match the schema (nothing is written then).
    """
    out = Path(out_dir)
    names = [r.gate for r in reports]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate gate names in reports: {sorted(n for n in set(names) if names.count(n) > 1)}")
    if _RESERVED & set(names):
        raise ValueError(f"reserved gate name(s): {sorted(_RESERVED & set(names))}")
    docs = [_finite(r.to_dict()) for r in reports]
    for d in docs:
        validate_report(d)
    need, code = _required(reports, required), exit_code(reports, required)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "generated": utc_now(),
        "exit_code": code,
        "required": sorted(need),
        "missing": sorted(need - set(names)),
        "gates": [
            {
                "gate": r.gate,
                "profile": r.profile,
                "result": r.result,
                "reason": r.reason,
                "required": r.gate in need,
                "report": f"{r.gate}.json",
                "checks_passed": sum(c.passed for c in r.checks),
                "checks_total": len(r.checks),
                "evidence": r.counts_as_evidence,
                "label": r.label(),
            }
            for r in reports
        ],
    }
    validate_summary(summary)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        f"{d['gate']}.json": write_text_atomic(
            out / f"{d['gate']}.json", json.dumps(d, indent=2, allow_nan=False) + "\n"
        )
        for d in docs
    }
    paths["summary.json"] = write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    paths["summary.md"] = write_text_atomic(out / "summary.md", _markdown(reports, code, need))
    paths["junit.xml"] = write_text_atomic(out / "junit.xml", _junit(reports))
    return paths
