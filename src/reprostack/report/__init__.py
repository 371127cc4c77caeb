"""Reports: per-gate JSON with checks and provenance, summary JSON/Markdown, JUnit XML, exit code."""

from .model import (
    RESULTS,
    Artifact,
    Check,
    GateReport,
    Result,
    artifact_for,
    decide,
    evaluate,
    evaluate_interval,
    not_run,
    require_deepep_arm,
    skipped,
    utc_now,
)
from .writers import exit_code, validate_report, validate_summary, write_reports

__all__ = [
    "RESULTS",
    "Artifact",
    "Check",
    "GateReport",
    "Result",
    "artifact_for",
    "decide",
    "evaluate",
    "evaluate_interval",
    "not_run",
    "require_deepep_arm",
    "skipped",
    "utc_now",
    "exit_code",
    "validate_report",
    "validate_summary",
    "write_reports",
]
