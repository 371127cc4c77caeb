"""One AIPerf sweep cell: a fresh artifact folder, the pinned `aiperf profile` under the watchdog, then the
exports parsed with gates.parsers.aiperf (schema 1.3 / flat 1.0 / legacy records; `profile_export.jsonl` per request).

A cell is `error` when AIPerf exits non-zero, times out, or writes no `profile_export_aiperf.json` (its log is
kept and its tail quoted); otherwise its numbers are returned for the gate's bars. The folder is deleted and
created again before the run, so an export left by an earlier run can never be read.

Trials (issue 16): `runs` K > 1 asks the pinned AIPerf (0.10.0 has it) for `--num-profile-runs K` (its defaults:
warm-up before the first run only, one random seed for every run, so the runs see the same workload). It then
writes each run's exports under `<artifact dir>/profile_runs/run_NNNN/`; each is parsed like a single run's,
and the cell's figures become: agg_tok_s = mean of the runs (the runs' values in `samples`, for the interval),
errors = the sum over runs, completed / request_count = the fewest any run completed (so `== requests` means
every run completed all). A run export that is missing or unreadable makes the cell an error. AIPerf's own
aggregate (`aggregate/`) is not read: our statistics come from the per-run exports (evidence.bars.stats).

Progress: AIPerf (0.10.0) logs `[v0 t1] Executing run_0002...` as each profile run starts (its orchestrator,
one line per run, `--ui none` too); `profile_run_started` recognises it for the gate's `run k/K` (ui.line_counter
through run_cell's `on_line`). Only a display: the runs are counted from their exports, never from this line.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .parsers.aiperf import EXPORT_JSON, EXPORT_JSONL, AiperfSchemaError, parse_export, parse_records
from .aiperftool import AiperfTool
from .servingspec import Cell
from ..launch.watchdog import run_with_watchdog

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_RUN_STARTED = re.compile(r"\sINFO\s+\[v\d+ t\d+\] Executing run_\d{4,}\.\.\.")


def profile_run_started(line: str) -> bool:
    """Whether one line of AIPerf's output is its log line of a profile run starting (module doc)."""
    return len(line) <= 4096 and _RUN_STARTED.search(line) is not None


@dataclass
class CellResult:
    """Outcome of one cell. status: `ok` or `error`; agg_tok_s: output_token_throughput avg (tokens/sec);
    requests_expected: the cell's request count; request_count: the export's successful requests;
    export_errors: sum of the export's error_summary counts; records_*: counts from profile_export.jsonl (None
    when absent); error_types: {type or code: count}; detail: why it is an error; log: AIPerf's output file."""

    arm: str
    cell: Cell
    status: str
    dir: Path
    log: Path
    returncode: int | None = None
    agg_tok_s: float | None = None
    request_count: int | None = None
    export_errors: int | None = None
    records_total: int | None = None
    records_completed: int | None = None
    records_errors: int | None = None
    error_types: dict = field(default_factory=dict)
    per_user_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    itl_p50_ms: float | None = None
    duration_s: float | None = None
    layout: str | None = None
    detail: str = ""
    samples: list = field(default_factory=list)  # agg_tok_s of each profile run (runs > 1)
    runs: list = field(default_factory=list)  # each profile run's figures (runs > 1)

    @property
    def errors(self) -> int | None:
        """Failed requests: the larger of the export's error_summary total and the per-request records' count."""
        vals = [v for v in (self.export_errors, self.records_errors) if v is not None]
        return max(vals) if vals else None

    @property
    def completed(self) -> int | None:
        """Completed requests: from profile_export.jsonl when present, else the export's request_count."""
        return self.records_completed if self.records_completed is not None else self.request_count

    def to_dict(self) -> dict:
        return {
            "arm": self.arm,
            "cell": self.cell.name,
            "concurrency": self.cell.concurrency,
            "requests_expected": self.cell.requests,
            "status": self.status,
            "dir": str(self.dir),
            "returncode": self.returncode,
            "agg_tok_s": self.agg_tok_s,
            "request_count": self.request_count,
            "errors": self.errors,
            "export_errors": self.export_errors,
            "completed": self.completed,
            "records_total": self.records_total,
            "records_errors": self.records_errors,
            "error_types": self.error_types,
            "per_user_tok_s": self.per_user_tok_s,
            "ttft_p50_ms": self.ttft_p50_ms,
            "itl_p50_ms": self.itl_p50_ms,
            "duration_s": self.duration_s,
            "layout": self.layout,
            "detail": self.detail,
            **({"samples": list(self.samples), "runs": list(self.runs)} if self.runs else {}),
        }


def aiperf_argv(
    tool: AiperfTool,
    *,
    url: str,
    model: str,
    tokenizer: str,
    aiperf: dict,
    cell: Cell,
    artifact_dir: Path,
    extra: tuple = (),
) -> list[str]:
    """The `aiperf profile` command of one cell (the campaign's flags; see gates/vllm.yaml `aiperf:`)."""
    argv = [
        str(tool.exe),
        "profile",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--url",
        url,
        "--endpoint-type",
        aiperf["endpoint-type"],
    ]
    if aiperf["streaming"]:
        argv.append("--streaming")
    argv += [
        "--concurrency",
        str(cell.concurrency),
        "--request-count",
        str(cell.requests),
        "--synthetic-input-tokens-mean",
        str(aiperf["isl"]),
        "--output-tokens-mean",
        str(aiperf["osl"]),
    ]
    for x in aiperf.get("extra-inputs", ()):
        argv += ["--extra-inputs", x]
    if "request-timeout-s" in aiperf:
        argv += ["--request-timeout-seconds", f"{aiperf['request-timeout-s']:g}"]
    argv += ["--artifact-dir", str(artifact_dir), "--ui", "none", *aiperf.get("args", ()), *extra]
    return argv


def _tail(path: Path, n: int = 12) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(x.strip() for x in lines[-n:] if x.strip())[-1500:]


def run_cell(
    tool: AiperfTool,
    *,
    arm: str,
    cell: Cell,
    url: str,
    model: str,
    tokenizer: str,
    aiperf: dict,
    cell_dir: Path,
    extra: tuple = (),
    env: dict | None = None,
    echo: bool | None = None,
    runs: int = 1,
    on_line=None,
) -> CellResult:
    """Run one cell into `cell_dir` (removed first, then created) and parse what AIPerf wrote; with runs K > 1,
    AIPerf's K profile runs (module doc). `on_line`: each line of AIPerf's output (watchdog.run_with_watchdog).

    Returns a CellResult; never raises for AIPerf failures or unreadable exports (status `error` with the
    detail). timeout: aiperf `timeout-s` (default 1800 s) of the spec."""
    cell_dir = Path(cell_dir)
    shutil.rmtree(cell_dir, ignore_errors=True)
    cell_dir.mkdir(parents=True)
    artifacts = cell_dir / "aiperf"
    log = cell_dir / "aiperf.out.log"
    if runs < 1:
        raise ValueError(f"runs must be >= 1, not {runs}")
    more = ("--num-profile-runs", str(runs)) if runs > 1 else ()
    argv = aiperf_argv(
        tool,
        url=url,
        model=model,
        tokenizer=tokenizer,
        aiperf=aiperf,
        cell=cell,
        artifact_dir=artifacts,
        extra=(*extra, *more),
    )
    out = run_with_watchdog(
        argv,
        env=_aiperf_env(env, argv, tokenizer),
        cwd=str(cell_dir),
        timeout_s=float(aiperf.get("timeout-s", 1800)),
        log_path=log,
        echo=echo,
        on_line=on_line,
    )
    res = CellResult(arm, cell, "error", cell_dir, log, out.returncode, duration_s=out.duration_s)
    return _outcome(res, out, artifacts, runs, aiperf)


def _outcome(res: CellResult, out, artifacts: Path, runs: int, aiperf: dict) -> CellResult:
    """The cell's result from AIPerf's exit and its exports (never raises: status `error` with the detail)."""
    log = res.log
    if out.timed_out:
        res.detail = f"aiperf timed out after {aiperf.get('timeout-s', 1800)} s; log {log}: {_tail(log)}"
        return res
    if out.returncode != 0:
        res.detail = f"aiperf exited {out.returncode}; log {log}: {_tail(log)}"
        return res
    if runs > 1:
        return _read_runs(res, artifacts, runs)
    if not (artifacts / EXPORT_JSON).is_file():
        res.detail = f"aiperf exited 0 but wrote no {EXPORT_JSON}; log {log}: {_tail(log)}"
        return res
    return _read(res, artifacts)


def read_cell(arm: str, cell: Cell, cell_dir: Path, runs: int = 1) -> CellResult:
    """The figures of a cell AIPerf already ran into `cell_dir` (its `aiperf/` exports, each profile run's when
    `runs` > 1), read as run_cell reads them; status `error` with the detail when one is missing or unreadable
    (verify-report re-derives a serving report this way)."""
    cell_dir = Path(cell_dir)
    res = CellResult(arm, cell, "error", cell_dir, cell_dir / "aiperf.out.log")
    artifacts = cell_dir / "aiperf"
    return _read_runs(res, artifacts, runs) if runs > 1 else _read(res, artifacts)


def _aiperf_env(env: dict | None, argv: list[str], tokenizer: str) -> dict:
    """AIPerf's environment: `env` (default ours) without the offline variables when the tokenizer is a local
    folder (see aiperftool: offline mode makes AIPerf 0.10.0 refuse it), with no metrics flush period when there
    are no server metrics to flush (AIPerf would still wait its 2 s)."""
    run_env = dict(os.environ if env is None else env)
    if Path(tokenizer).is_dir():
        for k in _OFFLINE_VARS:
            run_env.pop(k, None)
    if "--no-server-metrics" in argv:
        run_env.setdefault("AIPERF_SERVER_METRICS_COLLECTION_FLUSH_PERIOD", "0")
    return run_env


def _read_runs(res: CellResult, artifacts: Path, runs: int) -> CellResult:
    """The K profile runs' exports into `res` (module doc); an error naming the first run that is missing or
    unreadable."""
    parts = []
    for i in range(1, runs + 1):
        d = artifacts / "profile_runs" / f"run_{i:04d}"
        one = _read(CellResult(res.arm, res.cell, "error", d, res.log), d)
        if one.status != "ok":
            res.detail = f"profile run {i} of {runs} ({d}): {one.detail or 'no ' + EXPORT_JSON}"
            return res
        parts.append(one)
    res.samples = [p.agg_tok_s for p in parts]
    res.runs = [
        {
            k: v
            for k, v in p.to_dict().items()
            if k not in ("arm", "cell", "concurrency", "requests_expected", "returncode", "duration_s")
        }
        for p in parts
    ]
    res.layout = parts[0].layout
    res.agg_tok_s = sum(res.samples) / runs
    res.request_count = min(p.request_count or 0 for p in parts)
    res.export_errors = sum(p.export_errors or 0 for p in parts)
    if all(p.records_total is not None for p in parts):
        res.records_total = min(p.records_total for p in parts)
        res.records_completed = min(p.records_completed for p in parts)
        res.records_errors = sum(p.records_errors for p in parts)
    for p in parts:
        for k, v in p.error_types.items():
            res.error_types[k] = res.error_types.get(k, 0) + v
    for attr in ("per_user_tok_s", "ttft_p50_ms", "itl_p50_ms"):
        vals = [getattr(p, attr) for p in parts]
        setattr(res, attr, sum(vals) / runs if all(v is not None for v in vals) else None)
    res.status = "ok"
    return res


def _read(res: CellResult, artifacts: Path) -> CellResult:
    """One run's exports in `artifacts` into `res` (status ok), or status error with the detail."""
    export = artifacts / EXPORT_JSON
    if not export.is_file():
        res.detail = f"no {EXPORT_JSON}"
        return res
    try:
        ex = parse_export(export)
        res.layout = ex.layout
        res.agg_tok_s = ex.value("output_token_throughput")[0]
        res.request_count = ex.request_count if "request_count" in ex.metrics else 0
        res.export_errors = ex.error_count
        for attr, tag, stat in (
            ("per_user_tok_s", "output_token_throughput_per_user", "avg"),
            ("ttft_p50_ms", "time_to_first_token", "p50"),
            ("itl_p50_ms", "inter_token_latency", "p50"),
        ):
            try:
                setattr(res, attr, ex.value(tag, stat)[0])
            except KeyError:
                pass
        if (artifacts / EXPORT_JSONL).is_file():
            rc = parse_records(artifacts / EXPORT_JSONL)
            res.records_total, res.records_completed, res.records_errors = rc.total, rc.completed, rc.errors
            res.error_types = dict(rc.error_types)
    except (AiperfSchemaError, KeyError) as e:
        res.detail = f"export unreadable: {str(e).strip(chr(39))}"
        return res
    res.status = "ok"
    return res
