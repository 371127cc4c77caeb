"""Published-claim verification: each claim of `claims/*.yaml` is recomputed from the raw AIPerf artifacts
found under one of the given folders and judged.

Every claim read from an aggregate also lists which of the metric's statistics (avg, p50, p90, p99, min, max)
reproduce the published figure within its rounding (`reproduced_by`), and a mismatch that another statistic
reproduces says so ("published 1122.7 = avg 1122.7012, not p50 159.7084"): a table that printed an avg as a
p50 is named, not just failed.

Verdicts: `match` (|recomputed - published| <= rounding/2, i.e. the published figure is the recomputed value
rounded to its stated precision), `ambiguous` (the claim carries an `ambiguity:` note and is off by more than
half a rounding step but no more than one whole step, which is what a double rounding such as
67.2488 -> 67.25 -> 67.3 can do: surfaced in the table, not a failure), `mismatch`, `artifact missing`
(no folder holds every artifact the claim names) and `error` (an artifact exists but cannot be read, e.g. an
unsupported AIPerf schema).

The aggregate is not trusted alone: where a claim's folder holds `profile_export.jsonl` beside
`profile_export_aiperf.json`, the raw records are held to the aggregate (aiperf.check_records: request count,
errored/cancelled records, warm-up-phase records, duplicate request ids, every recomputable statistic) and any
contradiction makes the claim a `mismatch` whose detail says why, whatever the claimed figure. Records that should
be there and are not never let the aggregate stand alone either: a cell whose `profile_export.jsonl` is missing
while a sibling cell (another folder beside it holding an aggregate) has its own, or while the claims file
recomputes a claim from that cell's records, makes every claim read from the cell `artifact missing`, the detail
naming the file (deleting the records file used to pass every claim read from the aggregate).

Exit codes (run_verify): 0 every claim matched or is a declared ambiguity; 1 at least one mismatch;
3 no mismatch but an artifact is missing; 2 an artifact could not be read or the claims file is invalid.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from ... import schemas
from ...atomicfile import write_text_atomic
from ...errors import LocatedError, ReprostackError
from ...gates.parsers.aiperf import (
    EXPORT_JSON,
    EXPORT_JSONL,
    AiperfSchemaError,
    check_records,
    parse_export,
    parse_records,
)
from ...yamlsrc import load as load_yaml
from ...yamlsrc import validate

VERDICTS = ("match", "ambiguous", "mismatch", "artifact missing", "error")
EXIT_OK, EXIT_MISMATCH, EXIT_ERROR, EXIT_MISSING = 0, 1, 2, 3


class ClaimsError(LocatedError):
    """The claims file is malformed."""


@dataclass(frozen=True)
class Claim:
    id: str
    gate: str
    arm: str
    cell: str
    metric: str
    stat: str
    value: float
    unit: str
    rounding: float
    artifacts: tuple
    source: str
    ambiguity: str | None
    line: int | None


@dataclass
class Result:
    claim: Claim
    verdict: str
    recomputed: float | None = None
    unit: str | None = None
    ratio: float | None = None
    detail: str = ""
    artifacts: tuple = ()
    # {stat: value} of every statistic of the claim's metric the export has (NAMED_STATS), and which of them
    # reproduce the published figure within its rounding: says which statistic a published table really printed
    stats: dict = field(default_factory=dict)
    reproduced_by: tuple = ()


# the statistics a published table may have printed under a name (an avg printed as a p50 is a known pitfall)
NAMED_STATS = ("avg", "p50", "p90", "p99", "min", "max")


def load_claims(path: Path) -> list[Claim]:
    path = Path(path)
    data, lines = load_yaml(path, ClaimsError)
    schema = schemas.load("claims")
    validate(data, lines, schema, str(path), ClaimsError)
    claims, seen = [], {}
    for i, c in enumerate(data["claims"]):
        line = lines.get(("claims", i))
        if c["id"] in seen:
            raise ClaimsError(
                str(path),
                lines.get(("claims", i, "id")),
                f"claims[{i}].id",
                f"duplicate id {c['id']!r} (first at line {seen[c['id']]})",
            )
        seen[c["id"]] = line
        stat = c.get("stat", "avg")
        if c["metric"] in ("request_count", "error_count", "completed_requests") and "stat" in c:
            raise ClaimsError(
                str(path),
                lines.get(("claims", i, "stat")),
                f"claims[{i}].stat",
                f"{c['metric']} is a count summed over the artifacts; it takes no stat",
            )
        for j, rel in enumerate(c["artifacts"]):  # relative to the artifact folder the operator names, never out of it
            parts = PurePosixPath(rel).parts
            if rel.startswith("/") or "\\" in rel or ".." in parts or not parts:
                raise ClaimsError(
                    str(path),
                    lines.get(("claims", i, "artifacts", j)),
                    f"claims[{i}].artifacts[{j}]",
                    f"{rel!r} must be a path inside the artifact folder (relative, without '..')",
                )
        claims.append(
            Claim(
                id=c["id"],
                gate=c["gate"],
                arm=c["arm"],
                cell=c["cell"],
                metric=c["metric"],
                stat=stat,
                value=float(c["value"]),
                unit=c["unit"],
                rounding=float(c["rounding"]),
                artifacts=tuple(c["artifacts"]),
                source=c["source"],
                ambiguity=c.get("ambiguity"),
                line=line,
            )
        )
    return claims


def _find_in(dirs: list[Path], rels: tuple) -> tuple[Path, list[Path]] | None:
    """(the first folder that holds every artifact of the claim, the artifacts' paths): a claim is never
    recomputed from a mix of folders."""
    for d in dirs:
        paths = [Path(d) / r for r in rels]
        base = Path(d).resolve()
        # a link inside the folder that points out of it is not the folder's artifact either
        if all(p.is_file() and p.resolve().is_relative_to(base) for p in paths):
            return Path(d), paths
    return None


def _find(dirs: list[Path], rels: tuple) -> list[Path] | None:
    """The artifacts' paths in the first folder that holds every artifact of the claim (see _find_in)."""
    found = _find_in(dirs, rels)
    return None if found is None else found[1]


def _records_named(claims: list[Claim]) -> set[PurePosixPath]:
    """The cell folders (relative to a DIR) whose raw records some claim of the file is recomputed from."""
    return {PurePosixPath(r).parent for c in claims for r in c.artifacts if PurePosixPath(r).name == EXPORT_JSONL}


def _missing_records(base: Path, rels: tuple, named: set[PurePosixPath], seen: dict) -> list[str]:
    """Why the raw records of a cell the claim reads an aggregate from should be there and are not: a sibling
    cell (another folder beside it holding an aggregate) has its `profile_export.jsonl`, or the claims file
    recomputes a claim from that cell's records. Deleting the records file must never let the aggregate stand
    alone where the evidence shows it existed (memoized in `seen` by folder)."""
    why = []
    for rel in rels:
        cell = PurePosixPath(rel).parent
        if PurePosixPath(rel).name != EXPORT_JSON or (base, cell) in seen:
            why += seen.get((base, cell), [])
            continue
        folder = base / cell
        reason = []
        if not os.path.lexists(folder / EXPORT_JSONL):
            siblings = []
            if cell != PurePosixPath("."):  # the cells beside it, inside the DIR (never above it)
                parent = base / cell.parent
                try:
                    entries = sorted(parent.iterdir())
                except OSError:
                    entries = []
                siblings = [
                    x.name
                    for x in entries
                    if x.name != cell.name
                    and x.is_dir()
                    and (x / EXPORT_JSON).is_file()
                    and os.path.lexists(x / EXPORT_JSONL)
                ]
            if siblings:
                beside = f"{', '.join(siblings[:5])}{' ...' if len(siblings) > 5 else ''} beside it"
                reason.append(
                    f"{cell}/{EXPORT_JSONL} is missing while {beside} {'have' if len(siblings) > 1 else 'has'} "
                    f"theirs: the aggregate cannot be held to its records"
                )
            elif cell in named:
                reason.append(
                    f"{cell}/{EXPORT_JSONL} is missing, and the claims file recomputes a claim from it: the "
                    f"aggregate cannot be held to its records"
                )
        seen[(base, cell)] = reason
        why += reason
    return why


def _recompute(claim: Claim, paths: list[Path]) -> tuple[float, str]:
    if claim.metric in ("request_count", "error_count", "completed_requests"):
        total, unit = 0, "requests"
        for p in paths:
            if p.name == EXPORT_JSONL:
                rc = parse_records(p)
                total += {"request_count": rc.total, "error_count": rc.errors, "completed_requests": rc.completed}[
                    claim.metric
                ]
            elif p.name == EXPORT_JSON:
                ex = parse_export(p)
                if claim.metric == "request_count":
                    v, unit = ex.value("request_count")
                    total += int(v)
                elif claim.metric == "error_count":
                    total += ex.error_count
                else:
                    raise AiperfSchemaError(
                        f"{p}: completed_requests is counted from {EXPORT_JSONL}, not {EXPORT_JSON}"
                    )
            else:
                raise AiperfSchemaError(f"{p}: not an AIPerf export ({EXPORT_JSON} or {EXPORT_JSONL})")
        return float(total), unit
    if len(paths) != 1 or paths[0].name != EXPORT_JSON:
        raise AiperfSchemaError(f"claim {claim.id}: {claim.metric} is read from exactly one {EXPORT_JSON}")
    return parse_export(paths[0]).value(claim.metric, claim.stat)


def judge(claim: Claim, recomputed: float) -> str:
    diff = abs(recomputed - claim.value)
    eps = 1e-9 * max(1.0, abs(claim.value))
    if diff <= claim.rounding / 2 + eps:
        return "match"
    if claim.ambiguity and diff <= claim.rounding + eps:
        return "ambiguous"
    return "mismatch"


def _contradictions(paths: list[Path], seen: dict) -> list[str]:
    """check_records for each folder of `paths` holding both exports (memoized in `seen` by folder)."""
    why = []
    for folder in dict.fromkeys(p.parent for p in paths):
        if folder not in seen:
            agg, raw = folder / EXPORT_JSON, folder / EXPORT_JSONL
            if os.path.lexists(raw) and not (raw.is_file() and raw.resolve().is_relative_to(folder.resolve())):
                # records that are there but cannot be held to the aggregate (a FIFO, a device, a folder, a link
                # out of the folder) never let the aggregate stand alone
                seen[folder] = [
                    f"{raw}: present but not a regular file of this folder, so the aggregate cannot "
                    "be checked against it"
                ]
            else:
                seen[folder] = check_records(agg, raw) if agg.is_file() and raw.is_file() else []
        why += seen[folder]
    return why


def verify_claims(claims: list[Claim], dirs: list[Path]) -> list[Result]:
    out = []
    checked: dict = {}
    absent: dict = {}
    named = _records_named(claims)
    for c in claims:
        found = _find_in(dirs, c.artifacts)
        if found is None:
            missing = sorted({r for r in c.artifacts if not any((Path(d) / r).is_file() for d in dirs)}) or list(
                c.artifacts
            )
            out.append(
                Result(c, "artifact missing", detail=f"not under {', '.join(map(str, dirs))}: {', '.join(missing)}")
            )
            continue
        base, paths = found
        try:
            value, unit = _recompute(c, paths)
            contradictions = _contradictions(paths, checked)
            missing = _missing_records(base, c.artifacts, named, absent)
        except (AiperfSchemaError, KeyError) as e:
            out.append(Result(c, "error", detail=str(e).strip("'\""), artifacts=tuple(map(str, paths))))
            continue
        if unit != c.unit:
            out.append(
                Result(
                    c,
                    "mismatch",
                    value,
                    unit,
                    detail=f"unit: published {c.unit!r}, export {unit!r}",
                    artifacts=tuple(map(str, paths)),
                )
            )
            continue
        ratio = value / c.value if c.value else None  # no ratio to a published 0
        verdict = judge(c, value)
        detail = c.ambiguity if verdict == "ambiguous" else ""
        stats, by = _statistics(c, paths)
        if verdict == "mismatch" and by:  # the figure is another statistic of the same metric
            others = ", ".join(f"{k} {_fmt(stats[k], c.rounding)}" for k in by)
            detail = f"published {_fmt(c.value, c.rounding)} = {others}, not {c.stat} {_fmt(value, c.rounding)}"
        if contradictions:
            more = f" (+{len(contradictions) - 3} more)" if len(contradictions) > 3 else ""
            verdict, detail = (
                "mismatch",
                "raw records contradict the aggregate: " + "; ".join(contradictions[:3]) + more,
            )
        elif missing:  # not a match: what would check the figure is gone (the figure itself is still shown)
            more = f" (+{len(missing) - 2} more)" if len(missing) > 2 else ""
            verdict, detail = "artifact missing", "; ".join(missing[:2]) + more
        out.append(Result(c, verdict, value, unit, ratio, detail, tuple(map(str, paths)), stats, by))
    return out


def _statistics(claim: Claim, paths: list[Path]) -> tuple[dict, tuple]:
    """({stat: value} of NAMED_STATS present for the claim's metric, the stats that reproduce the published value
    within its rounding); ({}, ()) for counts and for claims not read from one aggregate."""
    if (
        claim.metric in ("request_count", "error_count", "completed_requests")
        or len(paths) != 1
        or paths[0].name != EXPORT_JSON
    ):
        return {}, ()
    m = parse_export(paths[0]).metrics.get(claim.metric)
    stats = {}
    for k in NAMED_STATS:
        try:
            stats[k] = m.stat(k) if m is not None else None
        except KeyError:
            continue
    stats = {k: v for k, v in stats.items() if v is not None}
    return stats, tuple(k for k, v in stats.items() if judge_value(claim, v))


def judge_value(claim: Claim, v: float) -> bool:
    """`v` rounds to the published value at the claim's precision."""
    return abs(v - claim.value) <= claim.rounding / 2 + 1e-9 * max(1.0, abs(claim.value))


def exit_code(results: list[Result]) -> int:
    verdicts = {r.verdict for r in results}
    if "error" in verdicts:
        return EXIT_ERROR
    if "mismatch" in verdicts:
        return EXIT_MISMATCH
    if "artifact missing" in verdicts:
        return EXIT_MISSING
    return EXIT_OK


def _fmt(v: float | None, rounding: float | None = None) -> str:
    if v is None:
        return "—"
    if rounding is not None and rounding >= 1 and float(v).is_integer():
        return str(int(v))
    return f"{v:.4f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.6g}"


def render_md(results: list[Result], claims_path: Path, dirs: list[Path], rc: int) -> str:
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    head = [
        "# Published-claim verification",
        "",
        f"claims: `{claims_path}`; artifacts: {', '.join(f'`{d}`' for d in dirs)}",
        "",
        "verdicts: " + ", ".join(f"{v} {n}" for v, n in counts.items() if n) + f"; exit code {rc}",
        "",
        "| claim | published | recomputed | ratio | reproduced by | verdict |",
        "|---|---|---|---|---|---|",
    ]
    rows = []
    for r in results:
        c = r.claim
        pub = f"{_fmt(c.value, c.rounding)} {c.unit} (±{_fmt(c.rounding / 2)})"
        rec = f"{_fmt(r.recomputed, c.rounding)} {r.unit}" if r.recomputed is not None else "—"
        ratio = f"{r.ratio:.4f}" if r.ratio is not None and math.isfinite(r.ratio) else "—"
        verdict = f"**{r.verdict}**" if r.verdict != "match" else r.verdict
        if r.detail:
            verdict += f": {r.detail}"
        name = f"`{c.id}` {c.arm} {c.cell} {c.metric}" + (
            f" {c.stat}" if c.metric not in ("request_count", "error_count", "completed_requests") else ""
        )
        by = ", ".join(r.reproduced_by) if r.stats else "—"
        rows.append(f"| {name} | {pub} | {rec} | {ratio} | {by or 'none'} | {verdict.replace('|', '/')} |")
    return "\n".join(head + rows) + "\n"


def render_json(results: list[Result], claims_path: Path, dirs: list[Path], rc: int) -> str:
    items = []
    for r in results:
        d = asdict(r.claim)
        d["artifacts"] = list(d["artifacts"])
        items.append(
            {
                "claim": d,
                "verdict": r.verdict,
                "recomputed": r.recomputed,
                "recomputed_unit": r.unit,
                "ratio": r.ratio if r.ratio is None or math.isfinite(r.ratio) else None,
                "detail": r.detail,
                "artifact_paths": list(r.artifacts),
                "statistics": r.stats,
                "reproduced_by": list(r.reproduced_by),
            }
        )
    return (
        json.dumps(
            {
                "claims_file": str(claims_path),
                "dirs": [str(d) for d in dirs],
                "exit_code": rc,
                "counts": {v: sum(r.verdict == v for r in results) for v in VERDICTS},
                "results": items,
            },
            indent=2,
        )
        + "\n"
    )


def run_verify(dirs: list[Path], claims_path: Path, out_dir: Path) -> tuple[int, list[Result], dict]:
    """Load claims, verify against `dirs`, write verify.json, verify.md and verify.html (plots of agg tok/s vs
    concurrency per arm, published vs recomputed; needs the `plots` extra, matplotlib) atomically into `out_dir`.
    Returns (exit code, results, {file name: path})."""
    dirs = [Path(d) for d in dirs]
    for d in dirs:
        if not d.is_dir():
            raise ReprostackError(f"{d}: not a folder (verify DIR... takes folders of AIPerf artifacts)")
    claims = load_claims(claims_path)
    results = verify_claims(claims, dirs)
    rc = exit_code(results)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = render_md(results, claims_path, dirs, rc)
    written = {
        "verify.json": write_text_atomic(out_dir / "verify.json", render_json(results, claims_path, dirs, rc)),
        "verify.md": write_text_atomic(out_dir / "verify.md", md),
    }
    try:
        from .html import render_html

        page = render_html(results, claims_path, dirs, rc, md)
    except ImportError as e:  # matplotlib is the optional extra `plots`
        page = (
            f"<!doctype html><p>No plots: {e}. Install the extra: pip install -e '.[plots]' in the checkout.</p>"
            f"<pre>{md.replace('<', '&lt;')}</pre>\n"
        )
    written["verify.html"] = write_text_atomic(out_dir / "verify.html", page)
    return rc, results, written
