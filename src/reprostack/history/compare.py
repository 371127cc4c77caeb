"""Regressions across the history: two runs, or two lock versions, of one series compared by their 95% intervals.

A series is one (gate, profile, stack, metric), its points ordered by date. Two comparisons are made:
- runs: each point against the one before it;
- locks: the lock versions of the series in the order they first appear, each against the one before it, by
  the latest point of each lock that has an interval (else its latest point); the pins whose rev differs
  between the two reports' provenance are named.

Verdicts (VERDICTS): a point without an interval (n=1: no data.statistics) is never judged ("n=1, no
interval"); two intervals that overlap are "same"; separated intervals are a "regression" or an "improvement"
when the metric says which way is better (reader.Measurement.better), else "changed". Nothing but a
separation of two 95% intervals ever flags a regression.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .store import Point, Store

NO_INTERVAL = "n=1, no interval"
VERDICTS = ("regression", "improvement", "changed", "same", NO_INTERVAL)


def verdict(a: Point, b: Point) -> str:
    """How `b` compares with the earlier `a` (see the module doc)."""
    x, y = a.m, b.m
    if not (x.has_interval and y.has_interval):
        return NO_INTERVAL
    if not (x.hi < y.lo or y.hi < x.lo):
        return "same"
    up = y.mean > x.mean
    if x.better == "lower" or (x.better is None and y.better == "lower"):
        return "regression" if up else "improvement"
    if x.better == "higher" or (x.better is None and y.better == "higher"):
        return "improvement" if up else "regression"
    return "changed"


def pins_changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """`name old12 -> new12` for each pin whose rev differs; `name added`/`name removed` for the others."""
    out = []
    for n in sorted(set(before) | set(after)):
        a, b = before.get(n), after.get(n)
        if a == b:
            continue
        out.append(
            f"{n} added ({b[:12]})" if a is None else f"{n} removed" if b is None else f"{n} {a[:12]} -> {b[:12]}"
        )
    return out


@dataclass(frozen=True)
class Comparison:
    """`after` against `before`: the verdict, the pins that changed, whether the hosts differ."""

    kind: str  # "run" | "lock"
    before: Point
    after: Point
    verdict: str
    pins: tuple[str, ...] = ()

    @property
    def host_differs(self) -> bool:
        return self.before.host_fp != self.after.host_fp


@dataclass
class Series:
    """One (gate, profile, stack, metric) across runs."""

    key: tuple[str, str, str, str]
    points: list[Point]
    runs: list[Comparison] = field(default_factory=list)
    locks: list[Comparison] = field(default_factory=list)

    @property
    def unit(self) -> str:
        return self.points[-1].m.unit

    @property
    def better(self) -> str | None:
        return next((p.m.better for p in reversed(self.points) if p.m.better), None)

    @property
    def regressions(self) -> list[Comparison]:
        seen, out = set(), []
        for c in self.runs + self.locks:
            k = (c.before.report_id, c.after.report_id)
            if c.verdict == "regression" and k not in seen:
                seen.add(k)
                out.append(c)
        return out

    def title(self) -> str:
        g, prof, stack, metric = self.key
        how = {"lower": ", lower is better", "higher": ", higher is better"}.get(self.better or "", "")
        return f"{g}/{prof} [{stack}] {metric} ({self.unit or 'no unit'}{how})"


def representative(points: list[Point]) -> Point:
    """The point that stands for a group of runs: the last one with a 95% interval, else the last one."""
    with_ci = [p for p in points if p.m.has_interval]
    return (with_ci or points)[-1]


def analyse(store: Store, gates: tuple[str, ...] | None = None) -> list[Series]:
    """Every series of the store (of `gates` only, when given) with its run and lock comparisons."""
    by_key: dict[tuple, list[Point]] = {}
    for p in store.points(gates):
        by_key.setdefault(p.key, []).append(p)
    pin_cache: dict[str, dict[str, str]] = {}

    def pins(rid: str) -> dict[str, str]:
        if rid not in pin_cache:
            pin_cache[rid] = store.pins(rid)
        return pin_cache[rid]

    out = []
    for key, pts in by_key.items():
        s = Series(key, pts)
        for a, b in zip(pts, pts[1:]):
            changed = (
                tuple(pins_changed(pins(a.report_id), pins(b.report_id))) if a.lock_sha256 != b.lock_sha256 else ()
            )
            s.runs.append(Comparison("run", a, b, verdict(a, b), changed))
        order: list[str] = []
        for p in pts:
            if p.lock_sha256 not in order:
                order.append(p.lock_sha256)
        reps = [representative([p for p in pts if p.lock_sha256 == lk]) for lk in order]
        for a, b in zip(reps, reps[1:]):
            s.locks.append(
                Comparison("lock", a, b, verdict(a, b), tuple(pins_changed(pins(a.report_id), pins(b.report_id))))
            )
        out.append(s)
    return out


def fmt(v: float | None) -> str:
    """A number as printed in tables: 4 significant digits, up to 6 for large values."""
    if v is None:
        return "-"
    return f"{v:.6g}" if abs(v) >= 1000 else f"{v:.4g}"


def value(p: Point) -> str:
    """`14.59` (n=1) or `14.59 [14.41, 14.77] n=5`."""
    m = p.m
    if m.has_interval:
        return f"{fmt(m.mean)} [{fmt(m.lo)}, {fmt(m.hi)}] n={m.n}"
    return f"{fmt(m.mean)} (n={m.n})"


def describe(c: Comparison) -> str:
    """One line: `lock 5ef86495 -> 0a1b2c3d: regression: 14.6 [..] -> 15.2 [..]; pins changed: nccl a -> b`."""
    b, a = c.before, c.after
    head = (
        f"lock {b.lock_sha256[:8] or '?'} -> {a.lock_sha256[:8] or '?'}"
        if c.kind == "lock"
        else f"run {b.date or '?'} -> {a.date or '?'}"
    )
    line = f"{head}: {c.verdict}: {value(b)} -> {value(a)}"
    if c.pins:
        line += f"; pins changed: {', '.join(c.pins)}"
    elif c.kind == "lock":
        line += "; no recorded pin rev changed (the locks differ elsewhere: wheels, images, patches)"
    if c.host_differs:
        line += f"; host differs ({b.host} -> {a.host})"
    return line
