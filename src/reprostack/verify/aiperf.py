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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ReprostackError

EXPORT_JSON = "profile_export_aiperf.json"
EXPORT_JSONL = "profile_export.jsonl"
SUPPORTED_SCHEMAS = ("1.0", "1.3")
STATS = ("avg", "min", "max", "std", "sum", "count", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99")
# Top-level keys of the flat layouts that are not metrics.
_NON_METRIC = {"schema_version", "aiperf_version", "benchmark_id", "input_config", "run_info", "telemetry_data",
               "was_cancelled", "error_summary", "start_time", "end_time", "execution_metadata", "ai_perf_v1"}


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
    layout: str                     # "1.3", "flat-1.0" or "legacy-records"
    schema_version: str | None
    aiperf_version: str | None
    metrics: dict = field(default_factory=dict)   # tag -> Metric
    error_count: int = 0            # sum of error_summary counts
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


def _errors(summary, path: Path) -> int:
    if summary in (None, []):
        return 0
    if not isinstance(summary, list):
        raise AiperfSchemaError(f"{path}: error_summary is {type(summary).__name__}, expected a list")
    total = 0
    for item in summary:
        if not isinstance(item, dict) or not isinstance(item.get("count"), int):
            raise AiperfSchemaError(f"{path}: error_summary entry {item!r} has no integer count")
        total += item["count"]
    return total


def parse_export(path: Path) -> AiperfExport:
    """Parse one `profile_export_aiperf.json` in any supported layout."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise AiperfSchemaError(f"{path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise AiperfSchemaError(f"{path}:{e.lineno}: not JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise AiperfSchemaError(f"{path}: top level is {type(data).__name__}, expected an object")
    version = data.get("schema_version")
    if version is not None:
        version = str(version)
        if version not in SUPPORTED_SCHEMAS:
            raise AiperfSchemaError(
                f"{path}: AIPerf export schema_version {version!r} (aiperf {data.get('aiperf_version', '?')}) is "
                f"not supported; supported: {', '.join(SUPPORTED_SCHEMAS)}, the unversioned flat layout and the "
                f"legacy nested 'records' layout")
        layout = "1.3" if version == "1.3" else "flat-1.0"
        raw, errs = data, data.get("error_summary")
    elif isinstance(data.get("records"), dict):
        layout, raw = "legacy-records", data["records"]
        errs = data.get("error_summary", data.get("errors_by_type"))
    elif "execution_metadata" in data or "ai_perf_v1" in data:
        layout, raw = "flat-1.0", data
        errs = (data.get("execution_metadata") or {}).get("error_summary")
    else:
        raise AiperfSchemaError(f"{path}: no schema_version, no 'records' and no 'execution_metadata': not an AIPerf "
                                f"export layout this parser knows")
    metrics = {}
    for tag, obj in raw.items():
        if layout != "legacy-records" and tag in _NON_METRIC:
            continue
        m = _metric(tag, obj, path)
        if m is not None:
            metrics[tag] = m
    if not metrics:
        raise AiperfSchemaError(f"{path}: layout {layout}: no metric objects ({{unit, avg, ...}}) found")
    cancelled = data.get("was_cancelled", (data.get("execution_metadata") or {}).get("was_cancelled"))
    return AiperfExport(path=path, layout=layout, schema_version=version, aiperf_version=data.get("aiperf_version"),
                        metrics=metrics, error_count=_errors(errs, path), was_cancelled=cancelled)


@dataclass(frozen=True)
class RecordCounts:
    path: Path
    total: int
    completed: int      # no error, not cancelled
    errors: int
    cancelled: int
    error_types: dict   # error type/code -> count


def parse_records(path: Path) -> RecordCounts:
    """Count the per-request records of a `profile_export.jsonl`: an `error` object (top level or in metadata)
    marks a failed request; `metadata.was_cancelled` a cancelled one; everything else completed."""
    path = Path(path)
    total = completed = errors = cancelled = 0
    types: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise AiperfSchemaError(f"{path}: {e.strerror or e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise AiperfSchemaError(f"{path}:{n}: not JSON: {e.msg}") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("metadata", {}), dict):
            raise AiperfSchemaError(f"{path}:{n}: a record must be an object with a 'metadata' object")
        meta = rec.get("metadata", {})
        total += 1
        err = rec.get("error") or meta.get("error")
        if err:
            errors += 1
            key = str(err.get("type") or err.get("code") or "error") if isinstance(err, dict) else str(err)
            types[key] = types.get(key, 0) + 1
        elif meta.get("was_cancelled"):
            cancelled += 1
        else:
            completed += 1
    return RecordCounts(path=path, total=total, completed=completed, errors=errors, cancelled=cancelled,
                        error_types=types)
