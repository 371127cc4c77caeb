"""Verification: the engines of the operator's checks (the commands layer).

- report: `verify-report`'s check of one report (artifacts, provenance, statistics, figures re-derived by its kind,
  bars, verdict) -> Outcome;
- trace, tracecheck: a report's provenance traced to commits of this repository (and its corrections);
- signed: a report's run folder held to its attestation and the signed command line;
- claims (the names below), html: `reprostack verify`, published figures recomputed from raw AIPerf artifacts.
"""

from ...gates.parsers.aiperf import AiperfExport, AiperfSchemaError, RecordCounts, parse_export, parse_records
from .claims import ClaimsError, load_claims, run_verify, verify_claims

__all__ = [
    "AiperfExport",
    "AiperfSchemaError",
    "RecordCounts",
    "parse_export",
    "parse_records",
    "ClaimsError",
    "load_claims",
    "run_verify",
    "verify_claims",
]
