"""Gate report model: checks with thresholds, artifacts with sha256, and the pass/fail/skip/error verdict.

A gate passes only when it ran to completion, produced at least one check, and every check passed: a gate
without evidence is not a pass ("a number without that evidence is not evidence").
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

from ..digest import sha256_stream

SCHEMA_VERSION = 1


class Result(str, Enum):
    """A gate's result. A `str` Enum: members compare equal to (and serialize as) the JSON strings of RESULTS."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"
    NOT_RUN = "not-run"  # a gate it depends on did not pass
    # the trials' 95% interval straddles a bar (evidence.bars.stats): never a pass; exit code as a failure
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value


RESULTS = tuple(r.value for r in Result)
OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


def utc_now() -> str:
    """Current time as ISO-8601 UTC with seconds, e.g. `2026-07-06T22:54:01Z`."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_value(v):
    """Non-finite floats become strings ("nan", "inf"): JSON has no NaN."""
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


@dataclass(frozen=True)
class Check:
    """One measured metric against its threshold: `value op threshold`, e.g. dc_p50_us 443.6 <= 740 (us)."""

    metric: str
    unit: str
    value: float | int | str | bool | None
    op: str
    threshold: float | int | str | bool
    passed: bool
    note: str | None = None
    # a bar judged on an interval (evaluate_interval) that neither clears it nor is clearly past it
    inconclusive: bool = False

    def describe(self) -> str:
        """One line: `dc_p50_us = 443.6 us (needs <= 740)`."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.metric} = {self.value}{unit} (needs {self.op} {self.threshold})"

    def to_dict(self) -> dict:
        """Schema form: the `passed` field is written as `pass`; non-finite floats as strings."""
        d = {
            "metric": self.metric,
            "unit": self.unit,
            "value": _json_value(self.value),
            "op": self.op,
            "threshold": _json_value(self.threshold),
            "pass": self.passed,
            "note": self.note,
        }
        if self.inconclusive:
            d["inconclusive"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Check:
        """Inverse of to_dict."""
        return cls(
            d["metric"],
            d["unit"],
            d["value"],
            d["op"],
            d["threshold"],
            d["pass"],
            d.get("note"),
            bool(d.get("inconclusive", False)),
        )


def evaluate(metric: str, unit: str, value, op: str, threshold, note: str | None = None) -> Check:
    """Build a Check: passed is `value <op> threshold`. A None or NaN value, or values that cannot be
    compared, never pass (the note says why). Raises ValueError for an op not in `<= < >= > ==`."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; one of {', '.join(OPS)}")
    if value is None:
        return Check(metric, unit, None, op, threshold, False, note or "no value measured")
    if isinstance(value, float) and math.isnan(value):
        return Check(metric, unit, value, op, threshold, False, note or "value is NaN")
    try:
        passed = bool(OPS[op](value, threshold))
    except TypeError as e:
        return Check(metric, unit, value, op, threshold, False, note or f"not comparable: {e}")
    return Check(metric, unit, value, op, threshold, passed, note)


def evaluate_interval(metric: str, summary, op: str, threshold, note: str | None = None) -> Check:
    """A bar judged on trials (evidence.bars.stats.Summary): value = the trials' mean, passed only when the whole 95%
    interval clears the bar; `inconclusive` when it straddles it or there is one trial only; a plain failure
    when the whole interval is past it. The note gives the interval (and `note`, e.g. the bar's source).
    Raises ValueError for an op that is not an inequality."""
    from ..evidence.bars.stats import FAIL, PASS, interval_verdict

    v = interval_verdict(summary, op, threshold)
    why = (
        summary.describe()
        + {
            PASS: ": the whole interval clears the bar",
            FAIL: ": the whole interval is past the bar",
            "inconclusive": (
                ": the interval straddles the bar"
                if summary.ci95
                else ": one trial gives no interval (run --trials >= 2)"
            ),
        }[v]
    )
    return Check(
        metric,
        summary.unit,
        round(summary.mean, 6),
        op,
        threshold,
        v == PASS,
        why + (f"; {note}" if note else ""),
        inconclusive=v not in (PASS, FAIL),
    )


@dataclass(frozen=True)
class Artifact:
    """A kept file: `path` (as given, or relative to the report folder), lowercase hex `sha256`, size `bytes`."""

    path: str
    sha256: str
    bytes: int

    def to_dict(self) -> dict:
        """`{"path", "sha256", "bytes"}`."""
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}


def artifact_for(path: str | Path, *, relative_to: str | Path | None = None) -> Artifact:
    """Hash a file (streamed, 1 MiB chunks). Raises FileNotFoundError/OSError when it cannot be read."""
    p = Path(path)
    with open(p, "rb") as f:
        sha, n = sha256_stream(f)
    shown = p
    if relative_to is not None:
        try:
            shown = p.resolve().relative_to(Path(relative_to).resolve())
        except ValueError:
            shown = p
    return Artifact(str(shown), sha, n)


def decide(checks: list[Check], ran_ok: bool, failure_reason: str | None = None) -> tuple[Result, str]:
    """(result, reason) of a gate that was attempted (a skip is decided by the caller, see `skipped`).

    - not ran_ok (crash, timeout, setup failure: no trustworthy measurement) -> "error", failure_reason;
    - ran but no checks (no evidence) -> "fail";
    - any check failed outright -> "fail", naming the failed checks;
    - else any inconclusive check (an interval straddling its bar) -> "inconclusive", naming them;
    - else "pass".
    """
    if not ran_ok:
        return Result.ERROR, failure_reason or "the gate did not run to completion"
    if not checks:
        return Result.FAIL, failure_reason or "no checks were evaluated (no evidence)"
    failed = [c for c in checks if not c.passed]
    if any(not c.inconclusive for c in failed):
        return Result.FAIL, "; ".join(c.describe() + (f": {c.note}" if c.note else "") for c in failed)
    if failed:
        return Result.INCONCLUSIVE, "; ".join(c.describe() + (f": {c.note}" if c.note else "") for c in failed)
    return Result.PASS, f"{len(checks)} check(s) passed"


def require_deepep_arm(result: str, reason: str, deepep_arm: str | None, ran: list[str]) -> tuple[str, str]:
    """(result, reason) with the DeepEP rule applied: every gate exists to show DeepEP works, so a gate whose
    DeepEP arm (`deepep_arm`) is not among the arms that ran (`ran`) never passes; its other arms are
    comparison evidence. A would-be PASS becomes SKIP naming the arms that ran; FAIL and ERROR stand."""
    if result != Result.PASS or (deepep_arm is not None and deepep_arm in ran):
        return result, reason
    what = f"arm {deepep_arm}" if deepep_arm else "a DeepEP arm"
    return (
        Result.SKIP.value,
        f"{what} (the gate's evidence) did not run: only {', '.join(ran) or 'no arm'} ran, "
        f"comparison evidence only ({reason}); run it with --arm {deepep_arm or 'deepep'}",
    )


@dataclass
class GateReport:
    """One gate's report (schema: reprostack/schemas/report.schema.json).

    result: pass | fail | inconclusive | skip | error | not-run (not attempted because a gate it requires did not pass);
    provenance: lock sha256, revs, patched trees, image digests, host
    inventory (see reprostack.hostinfo); data: gate-specific tables (e.g. test_ep phase stats); started/ended:
    ISO-8601 UTC; duration_s: seconds; required: whether the gate counts for the exit code.
    """

    gate: str
    profile: str
    result: str
    reason: str = ""
    checks: list[Check] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)
    started: str | None = None
    ended: str | None = None
    duration_s: float | None = None
    data: dict = field(default_factory=dict)
    required: bool = True
    schema_version: int = SCHEMA_VERSION
    # False for a self-test profile (the serving gates' local-test: a stand-in server on a CPU): its checks say the
    # gate machinery works, nothing about the stack; such a pass is never counted as one (see writers.exit_code)
    evidence: bool = True

    def __post_init__(self):
        if self.result not in RESULTS:
            raise ValueError(f"gate {self.gate!r}: result must be one of {RESULTS}, not {self.result!r}")
        self.result = Result(self.result).value  # a Result member is kept as its JSON string

    def to_dict(self) -> dict:
        """The `<gate>.json` document (validated by the writers against report.schema.json)."""
        return {
            "schema_version": self.schema_version,
            "gate": self.gate,
            "profile": self.profile,
            "result": self.result,
            "reason": self.reason,
            "required": self.required,
            "checks": [c.to_dict() for c in self.checks],
            "provenance": self.provenance,
            "artifacts": [a.to_dict() for a in self.artifacts],
            "started": self.started,
            "ended": self.ended,
            "duration_s": self.duration_s,
            "data": self.data,
            "evidence": self.counts_as_evidence,
        }

    @classmethod
    def from_dict(cls, d: dict) -> GateReport:
        """Read a `<gate>.json` document back (no validation; see writers.validate_report)."""
        return cls(
            d["gate"],
            d["profile"],
            d["result"],
            d.get("reason", ""),
            [Check.from_dict(c) for c in d.get("checks", [])],
            d.get("provenance", {}),
            [Artifact(**a) for a in d.get("artifacts", [])],
            d.get("started"),
            d.get("ended"),
            d.get("duration_s"),
            d.get("data", {}),
            d.get("required", True),
            d.get("schema_version", SCHEMA_VERSION),
            d.get("evidence", True),
        )

    @property
    def proven(self) -> bool:
        """A pass that counts: result pass on evidence (never a self-test profile's pass)."""
        return self.result == Result.PASS and self.evidence

    @property
    def counts_as_evidence(self) -> bool:
        """What a report's `evidence` says: its figures count (never a self-test's, a stand-in's or a deliberate
        variation's), and something was measured: a SKIP ran nothing, so it is never evidence."""
        return bool(self.evidence) and self.result != Result.SKIP

    def label(self) -> str:
        """The result as printed everywhere: `PASS`, or `PASS (local-test, not evidence)` for a self-test profile
        (`PASS (GPU stand-in, not evidence)` for a run of the GPU stand-in, gates.standin)."""
        word = str(self.result).upper()
        who = "GPU stand-in" if isinstance(self.provenance.get("stand_in"), dict) else self.profile
        return f"{word} ({who}, not evidence)" if self.result == Result.PASS and not self.evidence else word


def skipped(
    gate: str, profile: str, reason: str, *, required: bool = True, provenance: dict | None = None
) -> GateReport:
    """A skip report; `reason` is mandatory (a skipped required gate never lets the run pass)."""
    if not reason:
        raise ValueError(f"gate {gate!r}: a skip needs a reason")
    now = utc_now()
    return GateReport(
        gate,
        profile,
        Result.SKIP,
        reason,
        provenance=provenance or {},
        started=now,
        ended=now,
        duration_s=0.0,
        required=required,
    )


def not_run(gate: str, blocker: GateReport, *, required: bool = True) -> GateReport:
    """The report of a gate that was not attempted because `blocker` (a gate it requires) did not pass.
    Never a pass; the reason names the blocker and its result."""
    now = utc_now()
    root = blocker.data.get("root_cause") if blocker.result == Result.NOT_RUN else None
    if root:  # a chain: name the gate that did not pass, not the whole nested reason
        why = f"not run: required gate {blocker.gate} was not run either (root cause: gate {root})"
    else:
        root = blocker.gate
        # the blocker's label, never its reason again (it is in the blocker's own row: one reason, said once)
        why = f"not run: required gate {blocker.gate} did not pass ({blocker.label()})"
    return GateReport(
        gate,
        blocker.profile,
        Result.NOT_RUN,
        why,
        started=now,
        ended=now,
        duration_s=0.0,
        required=required,
        data={"blocked_by": blocker.gate, "root_cause": root},
    )
