"""Reports: per-gate JSON with checks and provenance, summary JSON/Markdown, JUnit XML, exit code."""

from .model import Artifact, Check, GateReport, artifact_for, decide, evaluate, not_run, skipped, utc_now
from .writers import exit_code, validate_report, validate_summary, write_reports

__all__ = ["Artifact", "Check", "GateReport", "artifact_for", "decide", "evaluate", "not_run", "skipped", "utc_now",
           "exit_code", "validate_report", "validate_summary", "write_reports"]
