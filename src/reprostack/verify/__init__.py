"""Third-party verification: recompute published figures from raw AIPerf artifacts (`reprostack verify`)."""

from ..gates.parsers.aiperf import AiperfExport, AiperfSchemaError, RecordCounts, parse_export, parse_records
from .engine import ClaimsError, load_claims, run_verify, verify_claims

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
