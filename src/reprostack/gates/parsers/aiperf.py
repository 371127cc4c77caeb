"""AIPerf export parsers: `profile_export_aiperf.json` (aggregate statistics) and `profile_export.jsonl`
(one record per request).

Layouts of `profile_export_aiperf.json` accepted (each metric is an object `{unit, avg, p50, ...}`):

* schema 1.3 (AIPerf 0.10.0, as published): `schema_version: "1.3"`, metrics at the top level next to
  `input_config`, `error_summary` (a list of `{error_details, count}`), `was_cancelled`.
* flat 1.0: metrics at the top level with `schema_version: "1.0"`, or without `schema_version` in the
  GenAI-Perf-compatible layout of earlier AIPerf (`execution_metadata.error_summary`, `ai_perf_v1`).
* legacy nested: no `schema_version`, metrics under `records: {tag: {tag, header, unit, avg, ...}}`, errors in
  `error_summary` (or the older `errors_by_type`).

Any other `schema_version` is refused with an AiperfSchemaError that names the file and the version found:
a layout we have not read is never guessed at. Values are returned in the units the export states.

Both files are read through `jsonsrc` (size, depth, NaN/Infinity and type bounds; file:line messages).

`check_records` holds the aggregate to the raw records beside it: AIPerf 0.10.0 computes every per-request
statistic with numpy over the valid records (`np.percentile` linear interpolation, population `np.std`;
aiperf/metrics/metric_dicts.py), `benchmark_duration` as max(request_start_ns + request_latency) - min(request_start_ns) and the
throughputs from it, so each of those is recomputed here and compared with a relative tolerance of REL_TOL.
On the published exports every recomputed statistic agrees to 6.7e-15 relative (float summation order);
REL_TOL = 1e-6 leaves eight orders of margin and is still ~2,500x finer than half the finest published rounding
step (0.05 tok/s of 19.5, 2.6e-3 relative), so a record dropped, added or edited moves a statistic past it.
Before the statistics, the records themselves: a record of another phase than `profiling` (AIPerf's records
manager drops warm-up records before the export and the aggregate, so one in the file was put there) and a request
id (`metadata.x_request_id`) on more than one record (a record counted twice) are each named, with their lines.
List-valued metrics (`inter_chunk_latency`) are not recomputed: AIPerf aggregates them per chunk in its own
way (our recomputed c8 p99 differs by 1.6%), so agreeing with them would prove nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ... import jsonsrc
from ...errors import ReprostackError

EXPORT_JSON = "profile_export_aiperf.json"
EXPORT_JSONL = "profile_export.jsonl"
SUPPORTED_SCHEMAS = ("1.0", "1.3")
STATS = ("avg", "min", "max", "std", "sum", "count", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99")
# Top-level keys of the flat layouts that are not metrics.
_NON_METRIC = {
    "schema_version",
    "aiperf_version",
    "benchmark_id",
    "input_config",
    "run_info",
    "telemetry_data",
    "was_cancelled",
    "error_summary",
    "start_time",
    "end_time",
    "execution_metadata",
    "ai_perf_v1",
}


class AiperfSchemaError(ReprostackError):
    """An AIPerf export we cannot read: unknown schema version or malformed layout (message names the file)."""


@dataclass(frozen=True)
class Metric:
    tag: str
    unit: str
    stats: dict  # stat name -> number

    def stat(self, name: str) -> float:
        if name not in self.stats or self.stats[name] is None:
            raise KeyError(name)
        return float(self.stats[name])


@dataclass(frozen=True)
class AiperfExport:
    path: Path
    layout: str  # "1.3", "flat-1.0" or "legacy-records"
    schema_version: str | None
    aiperf_version: str | None
    metrics: dict = field(default_factory=dict)  # tag -> Metric
    error_count: int = 0  # sum of error_summary counts
    was_cancelled: bool | None = None

    def value(self, tag: str, stat: str = "avg") -> tuple[float, str]:
        """(value, unit) of one statistic of one metric; KeyError names what is missing."""
        if tag not in self.metrics:
            raise KeyError(f"{self.path}: no metric {tag!r} (layout {self.layout})")
        m = self.metrics[tag]
        try:
            return m.stat(stat), m.unit
        except KeyError:
            raise KeyError(f"{self.path}: metric {tag!r} has no statistic {stat!r}") from None

    @property
    def request_count(self) -> int:
        return int(self.value("request_count")[0])


def _metric(tag: str, obj, path: Path) -> Metric | None:
    if not isinstance(obj, dict) or "unit" not in obj:
        return None
    stats = {k: v for k, v in obj.items() if k in STATS and isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not stats:
        return None
    return Metric(tag=tag, unit=str(obj["unit"]), stats=stats)


def _meta(data: dict, path: Path) -> dict:
    meta = data.get("execution_metadata") or {}
    if not isinstance(meta, dict):
        raise AiperfSchemaError(f"{path}: execution_metadata is {jsonsrc.kind(meta)}, expected an object")
    return meta


def _errors(summary, path: Path) -> int:
    if summary in (None, []):
        return 0
    if not isinstance(summary, list):
        raise AiperfSchemaError(f"{path}: error_summary is {jsonsrc.kind(summary)}, expected a list")
    total = 0
    for item in summary:
        if not isinstance(item, dict) or type(item.get("count")) is not int or item["count"] < 0:
            raise AiperfSchemaError(f"{path}: error_summary entry {item!r:.100} has no count >= 0")
        total += item["count"]
    return total


def parse_export(path: Path) -> AiperfExport:
    """Parse one `profile_export_aiperf.json` in any supported layout."""
    path = Path(path)
    data = jsonsrc.load(path, AiperfSchemaError)
    version = data.get("schema_version")
    if version is not None:
        version = str(version)
        if version not in SUPPORTED_SCHEMAS:
            raise AiperfSchemaError(
                f"{path}: AIPerf export schema_version {version!r} (aiperf {data.get('aiperf_version', '?')}) is "
                f"not supported; supported: {', '.join(SUPPORTED_SCHEMAS)}, the unversioned flat layout and the "
                f"legacy nested 'records' layout"
            )
        layout = "1.3" if version == "1.3" else "flat-1.0"
        raw, errs = data, data.get("error_summary")
    elif isinstance(data.get("records"), dict):
        layout, raw = "legacy-records", data["records"]
        errs = data.get("error_summary", data.get("errors_by_type"))
    elif "execution_metadata" in data or "ai_perf_v1" in data:
        layout, raw = "flat-1.0", data
        errs = _meta(data, path).get("error_summary")
    else:
        raise AiperfSchemaError(
            f"{path}: no schema_version, no 'records' and no 'execution_metadata': not an AIPerf "
            f"export layout this parser knows"
        )
    metrics = {}
    for tag, obj in raw.items():
        if layout != "legacy-records" and tag in _NON_METRIC:
            continue
        m = _metric(tag, obj, path)
        if m is not None:
            metrics[tag] = m
    if not metrics:
        raise AiperfSchemaError(f"{path}: layout {layout}: no metric objects ({{unit, avg, ...}}) found")
    cancelled = data.get("was_cancelled", _meta(data, path).get("was_cancelled"))
    if cancelled is not None and not isinstance(cancelled, bool):
        raise AiperfSchemaError(f"{path}: was_cancelled is {jsonsrc.kind(cancelled)}, expected true or false")
    aiperf_version = data.get("aiperf_version")
    return AiperfExport(
        path=path,
        layout=layout,
        schema_version=version,
        aiperf_version=None if aiperf_version is None else str(aiperf_version),
        metrics=metrics,
        error_count=_errors(errs, path),
        was_cancelled=cancelled,
    )


@dataclass(frozen=True)
class RecordCounts:
    path: Path
    total: int
    completed: int  # no error, not cancelled
    errors: int
    cancelled: int
    error_types: dict  # error type/code -> count


@dataclass(frozen=True)
class Record:
    """One request of a `profile_export.jsonl`, reduced to what is checked: its scalar metrics and timestamps."""

    line: int
    error: str | None  # error type/code, None for none
    cancelled: bool
    metrics: dict  # tag -> (value, unit), numeric scalars only
    start_ns: int | None  # metadata.request_start_ns
    end_ns: int | None  # metadata.request_end_ns
    phase: str | None = None  # metadata.benchmark_phase ("warmup" | "profiling"); None when the record has none
    request_id: str | None = None  # metadata.x_request_id (unique per request); None when the record has none


def read_records(path: Path) -> list[Record]:
    """Every record of a `profile_export.jsonl` (bounded: see jsonsrc); AiperfSchemaError names FILE:LINE."""
    out = []
    for n, rec in jsonsrc.iter_jsonl(path, AiperfSchemaError):
        meta = rec.get("metadata", {})
        metrics = rec.get("metrics", {})
        if not isinstance(meta, dict) or not isinstance(metrics, dict):
            raise AiperfSchemaError(f"{path}:{n}: a record must be an object with 'metadata' and 'metrics' objects")
        err = rec.get("error") or meta.get("error")
        if err:
            err = str(err.get("type") or err.get("code") or "error") if isinstance(err, dict) else str(err)
        cancelled = meta.get("was_cancelled", False)
        if not isinstance(cancelled, bool):
            raise AiperfSchemaError(
                f"{path}:{n}: metadata.was_cancelled is {jsonsrc.kind(cancelled)}, expected true or false"
            )
        scalars = {}
        for tag, m in metrics.items():
            if not isinstance(m, dict) or "value" not in m:
                raise AiperfSchemaError(f"{path}:{n}: metrics.{tag} must be an object with a 'value'")
            if isinstance(m["value"], list):
                continue  # per-chunk lists: not recomputed (see the module doc)
            if not jsonsrc.number(m["value"]) or not isinstance(m.get("unit"), str):
                raise AiperfSchemaError(
                    f"{path}:{n}: metrics.{tag}.value is {jsonsrc.kind(m['value'])} "
                    f"with unit {m.get('unit')!r:.40}, expected a number and a unit"
                )
            scalars[tag] = (m["value"], m["unit"])
        stamps = []
        for k in ("request_start_ns", "request_end_ns"):
            v = meta.get(k)
            if v is not None and type(v) is not int:
                raise AiperfSchemaError(f"{path}:{n}: metadata.{k} is {jsonsrc.kind(v)}, expected an integer")
            stamps.append(v)
        ids = []
        for k in ("benchmark_phase", "x_request_id"):
            v = meta.get(k)
            if v is not None and not isinstance(v, str):
                raise AiperfSchemaError(f"{path}:{n}: metadata.{k} is {jsonsrc.kind(v)}, expected a string")
            ids.append(v)
        out.append(Record(n, err or None, cancelled, scalars, *stamps, *ids))
    return out


def parse_records(path: Path) -> RecordCounts:
    """Count the per-request records of a `profile_export.jsonl`: an `error` object (top level or in metadata)
    marks a failed request; `metadata.was_cancelled` a cancelled one; everything else completed."""
    path = Path(path)
    records = read_records(path)
    types: dict[str, int] = {}
    for r in records:
        if r.error:
            types[r.error] = types.get(r.error, 0) + 1
    errors = sum(1 for r in records if r.error)
    cancelled = sum(1 for r in records if r.cancelled and not r.error)
    return RecordCounts(
        path=path,
        total=len(records),
        completed=len(records) - errors - cancelled,
        errors=errors,
        cancelled=cancelled,
        error_types=types,
    )


REL_TOL = 1e-6
PROFILING = "profiling"  # AIPerf's CreditPhase.PROFILING; the other phase is "warmup"
_PCT = {"p1": 1, "p5": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90, "p95": 95, "p99": 99}


def _percentile(sorted_values: list, q: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _stats(values: list) -> dict:
    n = len(values)
    s = sorted(values)
    mean = math.fsum(values) / n
    out = {
        "avg": mean,
        "min": s[0],
        "max": s[-1],
        "sum": math.fsum(values),
        "count": n,
        "std": math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n),
    }
    out.update({k: _percentile(s, q) for k, q in _PCT.items()})
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) + 1e-9


def _lines(records: list, limit: int = 5) -> str:
    ns = [str(r.line) for r in records[:limit]]
    return ("line " if len(records) == 1 else "lines ") + ", ".join(ns) + (", ..." if len(records) > limit else "")


_NS_PER = {"ns": 1, "us": 1e3, "ms": 1e6, "sec": 1e9, "s": 1e9}


def _response_end_ns(r: Record) -> float | None:
    """When AIPerf 0.10.0 counts a request's response as final: its wall-clock start plus its request_latency
    (aiperf/metrics/types/max_response_metric.py: `record.timestamp_ns + request_latency`), not the record's
    `request_end_ns`, which is stamped later on the last request of a run (0.13 ms later on the H200's vLLM run,
    results/gate_vllm/2026-12-03-h200-ep1). Records without a request_latency in a known unit: `request_end_ns`."""
    lat = r.metrics.get("request_latency")
    if r.start_ns is not None and lat is not None and lat[1] in _NS_PER:
        return r.start_ns + lat[0] * _NS_PER[lat[1]]
    return r.end_ns


# how much later than request_start_ns + request_latency a record's own request_end_ns may be: at most 2.48 ms in the
# 574 records of results/ and tests/fixtures (AIPerf 0.10.0 on the H200's vLLM and the published runs), 40x margin
END_LATE_MS = 100.0


def _stamp_off(r: Record, end: float | None) -> bool:
    """Whether `r`'s request_end_ns is earlier than its response end (1 ms slack) or later by over END_LATE_MS."""
    if end is None or r.end_ns is None or end == r.end_ns:
        return False
    d = (r.end_ns - end) / 1e6
    return d < -1.0 or d > END_LATE_MS


def check_records(export_path: Path, records_path: Path) -> list[str]:
    """Why the raw records of `records_path` contradict the aggregate `export_path` (empty: they agree).

    Checked: the count of completed records against `request_count`; errored and cancelled records against the
    aggregate's error count; every statistic of every scalar per-request metric the aggregate also has (same
    unit); benchmark_duration and the throughputs derived from it. Raises AiperfSchemaError for a file that
    cannot be read."""
    export = parse_export(export_path)
    name = Path(records_path).name
    why, records = _foreign_records(name, read_records(records_path))
    why += _counts(name, export, records)
    done = [r for r in records if not r.error and not r.cancelled]
    if not done:
        return why
    tags = {}
    for r in done:
        for tag, (v, unit) in r.metrics.items():
            tags.setdefault(tag, ([], unit))[0].append(v)
    return why + _metric_stats(export, tags) + _timing(name, export, done, tags)


def _foreign_records(name: str, records: list) -> tuple[list[str], list]:
    """check_records: the records of another phase than profiling (named, and left out of what is recomputed) and
    the request ids on more than one record. (why, the profiling records)."""
    why = []
    # AIPerf's records manager drops every record of another phase before any processor sees it (the export and
    # the aggregate alike), so a warm-up record in the file was not written by the run: named, and left out of
    # what is recomputed so the remaining reasons are about the profiling records
    other = [r for r in records if r.phase is not None and r.phase != PROFILING]
    if other:
        phases = ", ".join(repr(p[:40]) for p in sorted({r.phase for r in other}))
        why.append(
            f"{name}: {len(other)} record{'s' * (len(other) != 1)} of the {phases} phase ({_lines(other)}); "
            f"AIPerf exports and aggregates '{PROFILING}' records only"
        )
        records = [r for r in records if r.phase is None or r.phase == PROFILING]
    lines_of: dict[str, list[int]] = {}
    for r in records:
        if r.request_id is not None:
            lines_of.setdefault(r.request_id, []).append(r.line)
    twice = [(rid, ns) for rid, ns in lines_of.items() if len(ns) > 1]
    if twice:
        shown = "; ".join(f"{rid[:40]!r} on lines {', '.join(map(str, ns[:5]))}" for rid, ns in twice[:3])
        more = f" (+{len(twice) - 3} more)" if len(twice) > 3 else ""
        why.append(
            f"{name}: {len(twice)} request id{'s' * (len(twice) != 1)} (x_request_id) on more than one record: "
            f"{shown}{more}"
        )
    return why, records


def _counts(name: str, export, records: list) -> list[str]:
    """check_records: the completed records against the aggregate's request_count, the errored and cancelled ones
    against its error count."""
    why = []
    errored = [r for r in records if r.error]
    cancelled = [r for r in records if r.cancelled and not r.error]
    done = [r for r in records if not r.error and not r.cancelled]
    if "request_count" in export.metrics:
        agg = export.request_count
        if len(done) != agg:
            kind = "records" if len(done) == len(records) else "completed records"
            why.append(f"{name} has {len(done)} {kind}, the aggregate says {agg}")
    if len(errored) + len(cancelled) != export.error_count:
        parts = (
            [f"{len(cancelled)} record{'s' * (len(cancelled) != 1)} cancelled ({_lines(cancelled)})"]
            if cancelled
            else []
        ) + ([f"{len(errored)} record{'s' * (len(errored) != 1)} errored ({_lines(errored)})"] if errored else [])
        why.append(
            f"{name}: {', '.join(parts) or 'no failed record'}; the aggregate counts {export.error_count} "
            f"error{'s' * (export.error_count != 1)}"
        )
    return why


def _metric_stats(export, tags: dict) -> list[str]:
    """check_records: every statistic of each per-request metric (`tags`: {tag: (values, unit)} of the completed
    records) recomputed against the aggregate's, when the aggregate has the metric."""
    why = []
    for tag, (values, unit) in tags.items():
        m = export.metrics.get(tag)
        if m is None:
            continue
        if m.unit != unit:
            why.append(f"{tag}: records in {unit!r}, the aggregate in {m.unit!r}")
            continue
        mine = _stats(values)
        for stat, theirs in m.stats.items():
            if stat in mine and not _close(mine[stat], theirs):
                u = "" if stat == "count" else f" {unit}"
                why.append(f"recomputed {stat} {tag} {_num(mine[stat])}{u} vs aggregate {_num(theirs)}{u}")
    return why


def _timing(name: str, export, done: list, tags: dict) -> list[str]:
    """check_records: each completed record's end stamp against its start + latency, and the benchmark duration and
    the throughputs derived from it (first start to last response end) against the aggregate's."""
    why = []
    starts = [r.start_ns for r in done if r.start_ns is not None]
    ends = [e for e in (_response_end_ns(r) for r in done) if e is not None]
    off = [(r, (r.end_ns - e) / 1e6) for r, e in zip(done, map(_response_end_ns, done)) if _stamp_off(r, e)]
    if off:
        shown = ", ".join(f"line {r.line}: {d:+.3f} ms" for r, d in off[:5]) + (", ..." if len(off) > 5 else "")
        why.append(
            f"{name}: request_end_ns disagrees with request_start_ns + request_latency on {len(off)} "
            f"record{'s' * (len(off) != 1)} ({shown}; AIPerf stamps it at most {END_LATE_MS:g} ms later)"
        )
    if len(starts) == len(ends) == len(done) and max(ends) > min(starts):
        dur = (max(ends) - min(starts)) / 1e9
        osl = tags.get("output_sequence_length", ([], ""))[0]
        isl = tags.get("input_sequence_length", ([], ""))[0]
        derived = {"benchmark_duration": dur, "request_throughput": len(done) / dur}
        if len(osl) == len(done):
            derived["output_token_throughput"] = math.fsum(osl) / dur
            if len(isl) == len(done):
                derived["total_token_throughput"] = (math.fsum(osl) + math.fsum(isl)) / dur
        for tag, v in derived.items():
            m = export.metrics.get(tag)
            if m is not None and "avg" in m.stats and not _close(v, m.stats["avg"]):
                why.append(f"recomputed {tag} {_num(v)} {m.unit} vs aggregate {_num(m.stats['avg'])} {m.unit}")
    return why


def _num(v: float) -> str:
    return f"{v:.6g}"
