"""Statistics of repeated trials and the bar verdict from a 95% confidence interval (issue 16 item 1).

Stdlib only. One metric measured K times (one figure per trial: e.g. micro's D+C p50 of each trial) is
summarised as `Summary`: n, mean, p50 (statistics.median), stdev (sample standard deviation, n - 1),
ci95 and the samples. The report's `data.statistics` holds `Summary.to_dict()` per metric name (the bar's
metric names: `dc_p50_us`, ...), the shape fixed in the team contract: {"n", "mean", "p50", "stdev", "ci95":
[lo, hi], "samples", "unit", "method"}.

Interval, `method` "t": the Student t interval of the mean, mean +- t(0.975, n - 1) * stdev / sqrt(n), with
t from `T975` (two-sided 95% quantiles, 4 decimals, df 1..30, 40, 60, 120, then the normal 1.9600; a df
between two listed ones takes the lower df's larger quantile: never narrower than the exact interval). The
trials are taken as independent draws of one figure; a paired figure (DeepEP D+C over dense D+C in the
same trial) gets its interval from the per-trial ratios.

Invariants:
- n >= 2 for an interval; n = 1 has none (`ci95` None) and is written nowhere into `data.statistics`
  (a report without an entry for a metric is a single-sample report: contract item 1);
- `interval_verdict` is PASS only when the whole interval is on the bar's good side, FAIL only when the
  whole interval is on the wrong side, otherwise INCONCLUSIVE; one trial (no interval) is always
  INCONCLUSIVE, whatever its value: one sample can neither clear nor clearly miss a bar on noisy hardware;
- non-finite samples are refused (ValueError): a NaN trial is a failed trial, not a number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# two-sided 95% Student t quantiles t(0.975, df)
T975 = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    4: 2.7764,
    5: 2.5706,
    6: 2.4469,
    7: 2.3646,
    8: 2.3060,
    9: 2.2622,
    10: 2.2281,
    11: 2.2010,
    12: 2.1788,
    13: 2.1604,
    14: 2.1448,
    15: 2.1314,
    16: 2.1199,
    17: 2.1098,
    18: 2.1009,
    19: 2.0930,
    20: 2.0860,
    21: 2.0796,
    22: 2.0739,
    23: 2.0687,
    24: 2.0639,
    25: 2.0595,
    26: 2.0555,
    27: 2.0518,
    28: 2.0484,
    29: 2.0452,
    30: 2.0423,
    40: 2.0211,
    60: 2.0003,
    120: 1.9799,
}
Z975 = 1.9600

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


def t975(df: int) -> float:
    """t(0.975, df) from T975; between listed df the lower listed df's quantile; above 120 the normal's.
    Raises ValueError for df < 1."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {df}")
    if df in T975:
        return T975[df]
    if df > 120:
        return Z975
    return T975[max(k for k in T975 if k < df)]


@dataclass(frozen=True)
class Summary:
    """One metric over n trials (see the module doc). `ci95` is None for n = 1."""

    n: int
    mean: float
    p50: float
    stdev: float
    ci95: tuple[float, float] | None
    samples: tuple[float, ...]
    unit: str = ""
    method: str = "t"

    def to_dict(self) -> dict:
        """The contract's `data.statistics` entry (n >= 2 only; see `statistics_block`)."""
        return {
            "n": self.n,
            "mean": self.mean,
            "p50": self.p50,
            "stdev": self.stdev,
            "ci95": list(self.ci95) if self.ci95 else None,
            "samples": list(self.samples),
            "unit": self.unit,
            "method": self.method,
        }

    def describe(self) -> str:
        """`mean 14.5 us, 95% CI [14.2, 14.8] (t, n=5)` or `one trial: 14.5 us (no interval)`."""
        u = f" {self.unit}" if self.unit else ""
        if self.ci95 is None:
            return f"one trial: {_r(self.mean)}{u} (no interval)"
        return f"mean {_r(self.mean)}{u}, 95% CI [{_r(self.ci95[0])}, {_r(self.ci95[1])}] ({self.method}, n={self.n})"


def _r(x: float) -> float:
    return round(x, 4)


def summarize(samples, unit: str = "") -> Summary:
    """Summary of the trial figures `samples` (one float per trial). Raises ValueError when empty or when a
    sample is not a finite number."""
    xs = [float(x) for x in samples]
    if not xs:
        raise ValueError("no samples")
    bad = [x for x in xs if not math.isfinite(x)]
    if bad:
        raise ValueError(f"non-finite sample(s): {bad}")
    n, mean, p50 = len(xs), statistics.fmean(xs), statistics.median(xs)
    if n == 1:
        return Summary(1, mean, p50, 0.0, None, tuple(xs), unit)
    sd = statistics.stdev(xs)
    half = t975(n - 1) * sd / math.sqrt(n)
    return Summary(
        n, round(mean, 9), round(p50, 9), round(sd, 9), (round(mean - half, 9), round(mean + half, 9)), tuple(xs), unit
    )


def ratios(num, den) -> list[float]:
    """Per-trial ratios num[k] / den[k] (paired trials). Raises ValueError for unequal lengths or a zero
    or non-finite denominator."""
    num, den = list(num), list(den)
    if len(num) != len(den):
        raise ValueError(f"paired trials differ in number: {len(num)} vs {len(den)}")
    if any(not math.isfinite(d) or d == 0 for d in den):
        raise ValueError(f"denominator trial(s) zero or non-finite: {den}")
    return [a / b for a, b in zip(num, den)]


def interval_verdict(s: Summary, op: str, threshold: float) -> str:
    """PASS / FAIL / INCONCLUSIVE of the bar `metric op threshold` from the interval (module doc).

    op `<=` / `<`: PASS when hi clears it, FAIL when lo is past it; `>=` / `>` mirrored. Raises ValueError for
    another op (an `==` bar is not a measured quantity)."""
    if op not in ("<=", "<", ">=", ">"):
        raise ValueError(f"an interval verdict needs <=, <, >= or >, not {op!r}")
    if s.ci95 is None:
        return INCONCLUSIVE
    lo, hi = s.ci95
    good = {
        "<=": lambda x: x <= threshold,
        "<": lambda x: x < threshold,
        ">=": lambda x: x >= threshold,
        ">": lambda x: x > threshold,
    }[op]
    low_side = op in ("<=", "<")
    best, worst = (lo, hi) if low_side else (hi, lo)
    if good(worst):
        return PASS
    if not good(best):
        return FAIL
    return INCONCLUSIVE


def statistics_block(summaries: dict[str, Summary]) -> dict:
    """`data.statistics`: metric -> Summary.to_dict() for the metrics with n >= 2 (contract item 1)."""
    return {k: s.to_dict() for k, s in summaries.items() if s.n >= 2}
