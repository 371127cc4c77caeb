"""The DeepEP/alternative agg tok/s ratio of a serving gate's cell with its 95% interval (issue 42).

The two arms are separate server sessions measured one after the other, so their profile runs are not paired (run k
of one arm has nothing in common with run k of the other): the interval is the one of a ratio of two independent
means, by the delta method. With D the DeepEP arm's samples (mean d, sample stdev s_d, n_d runs) and A the
alternative's (a, s_a, n_a): r = d / a, relative variances v_d = s_d^2 / (n_d d^2), v_a = s_a^2 / (n_a a^2),
se = r * sqrt(v_d + v_a), Welch-Satterthwaite df = (v_d + v_a)^2 / (v_d^2 / (n_d - 1) + v_a^2 / (n_a - 1)), and the
interval r +- t(0.975, floor(df)) * se (evidence.bars.stats.t975: never narrower than the exact quantile's). Both arms with
no spread give [r, r].

Invariants: an interval needs n >= 2 runs of the cell in both arms and positive means, else the cell has none (its
ratio of single figures stays in `ratios_deepep_over_alternative`); samples are finite (evidence.bars.stats.summarize).
"""

from __future__ import annotations

import math

from .stats import summarize, t975

METHOD = "delta (ratio of independent means, Welch df)"


def ratio_interval(num, den) -> dict | None:
    """{"ratio", "ci95": [lo, hi], "n": [n_num, n_den], "method"} of mean(num) / mean(den), or None when either
    side has fewer than 2 samples or a mean that is not positive. Raises ValueError for a non-finite sample."""
    if len(num) < 2 or len(den) < 2:
        return None
    d, a = summarize(num), summarize(den)
    if d.mean <= 0 or a.mean <= 0:
        return None
    r = d.mean / a.mean
    vd, va = d.stdev**2 / (d.n * d.mean**2), a.stdev**2 / (a.n * a.mean**2)
    if vd + va == 0:
        lo = hi = r
    else:
        df = (vd + va) ** 2 / (vd**2 / (d.n - 1) + va**2 / (a.n - 1))
        half = t975(max(1, math.floor(df))) * r * math.sqrt(vd + va)
        lo, hi = r - half, r + half
    return {"ratio": round(r, 6), "ci95": [round(lo, 6), round(hi, 6)], "n": [d.n, a.n], "method": METHOD}


def ratio_intervals(runs) -> dict:
    """{alternative arm: {cell: ratio_interval}} of the DeepEP arm over each alternative arm (gates.serving's
    ArmRun list), for the cells both arms measured with 2 or more profile runs."""
    deepep = next((r for r in runs if r.arm.role == "deepep"), None)
    if deepep is None:
        return {}
    out = {}
    for alt in (r for r in runs if r.arm.role == "alternative"):
        by = {c.cell.name: c.samples for c in alt.cells}
        cells = {}
        for c in deepep.cells:
            got = ratio_interval(c.samples, by.get(c.cell.name, []))
            if got is not None:
                cells[c.cell.name] = got
        out[alt.arm.name] = cells
    return out
