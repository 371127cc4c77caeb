"""The fabric gate's judge (gates.fabric, FabricGate): what its nccl-tests runs printed -> checks and figures.

- parse(text_by_test): gates.parsers.nccl_tests per test;
- checks(spec, profile, parsed, nccl_version=): per test `<test>.rows` (every size of the sweep in each of the
  `trials` cycles), `<test>.wrong_total` == 0 (-c 1 checked every result), `<test>.out_of_bounds` == 0,
  `<test>.nccl_library` == the pinned NCCL (nccl-tests' `nccl-library=`), each bar `<test>.busbw_gbs` at its size
  on the interval of its per-cycle samples (report.evaluate_interval), then `transport`;
- transport_check(profile, parsed): every rank of every test on the transport the profile needs (gates.transport,
  the per-rank judge shared with micro, megatron and nemo-rl);
- figures(spec, profile, parsed): busbw per cycle at the report sizes and the bar sizes, with evidence.bars.stats
  summaries (`data.statistics`), reported on every profile, bars or not.

Invariants: each function is pure (no process, no file); checks never pass on a missing or non-finite number
(report.evaluate); every check names its metric once per test (`all_reduce.busbw_gbs`, ...) and `transport` once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...gates import transport
from ...gates.fabric_spec import FabricBar, FabricSpec
from ...gates.parsers.nccl_tests import NONE_ONE_NODE, NcclTestsParse, parse_nccl_tests
from ...gates.parsers.transport import TransportParse
from ...gates.spec import Profile
from ...report import Check, evaluate, evaluate_interval
from ..bars.stats import Summary, summarize


@dataclass(frozen=True)
class FabricParse:
    """One parse per test (gates.parsers.nccl_tests), keyed by the spec's test name."""

    tests: dict = field(default_factory=dict)

    def get(self, test: str) -> NcclTestsParse | None:
        return self.tests.get(test)


def parse(text_by_test: dict) -> FabricParse:
    """Parse each test's output (the raw log's text). Never raises on content."""
    return FabricParse({name: parse_nccl_tests(text) for name, text in text_by_test.items()})


def nccl_version_code(version: str) -> int | None:
    """NCCL's NCCL_VERSION_CODE of "2.30.4" (23004; 2.9+ scheme), the value nccl-tests prints as nccl-library=."""
    try:
        major, minor, patch = (int(x) for x in version.split(".")[:3])
    except (ValueError, AttributeError):
        return None
    return major * 10000 + minor * 100 + patch


def _samples(p: NcclTestsParse, size: int, placement: str, kind: str = "busbw_gbs") -> list[float]:
    rows = p.rows_at(size)
    return [getattr(r.out_of_place if placement == "out-of-place" else r.in_place, kind) for r in rows]


def _summary(samples: list[float]) -> Summary | None:
    if not samples or not all(math.isfinite(x) for x in samples):
        return None
    return summarize(samples, "GB/s")


def _size_words(size: int) -> str:
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= n and size % n == 0:
            return f"{size // n} {unit}"
    return f"{size} B"


def _test_checks(spec: FabricSpec, name: str, p: NcclTestsParse | None, want_nccl: int | None) -> list[Check]:
    """The health checks of one test's output (rows complete, no wrong element, the pinned NCCL)."""
    sizes = spec.tests[name].sizes()
    if p is None:
        return [evaluate(f"{name}.rows", "", None, "==", spec.trials * len(sizes), "no output for this test")]
    per_cycle = [sum(r.cycle == c for r in p.rows) for c in range(p.cycles)]
    note = f"{p.cycles} cycle(s) of {per_cycle or [0]} rows; {len(sizes)} sizes x {spec.trials} trials expected"
    if p.problems:
        note += f"; output problems: {'; '.join(p.problems[:3])}"
    if p.failures:
        note += f"; failure: {p.failures[0]}"
    rows_ok = not p.problems and p.cycles == spec.trials and all(n == len(sizes) for n in per_cycle)
    out = [
        Check(f"{name}.rows", "", len(p.rows), "==", spec.trials * len(sizes), rows_ok and bool(p.rows), note),
        evaluate(
            f"{name}.wrong_total",
            "",
            p.wrong_total,
            "==",
            0,
            None if p.wrong_total is not None else "no #wrong count in the output (-c 0, or no row)",
        ),
        evaluate(
            f"{name}.out_of_bounds", "", p.out_of_bounds, "==", 0, None if p.out_of_bounds is not None else "no footer"
        ),
    ]
    if want_nccl is not None:
        out.append(
            evaluate(
                f"{name}.nccl_library",
                "",
                p.nccl_library,
                "==",
                want_nccl,
                "NCCL_VERSION_CODE of the library nccl-tests loaded (its header line)",
            )
        )
    return out


def checks(
    spec: FabricSpec, profile: Profile[FabricBar], parsed: FabricParse, *, nccl_version: str | None = None
) -> list[Check]:
    """Every check of a run (module doc): per test the health checks, the profile's bars on their interval, then
    `transport`. A profile without bars gets the health and transport checks only (its numbers: `figures`)."""
    want = nccl_version_code(nccl_version) if nccl_version else None
    out: list[Check] = []
    for name in spec.tests:
        out += _test_checks(spec, name, parsed.get(name), want)
    for bar in profile.bars:
        if bar.threshold is None:  # a baseline bar not made from its runs (resolve_bars): never a silent pass
            why = f"{bar.baseline.runs_from}: its accepted runs were not read (gates.fabric_spec.resolve_bars)"
            out.append(evaluate(bar.metric, "GB/s", None, bar.op, None, why))
            continue
        p = parsed.get(bar.test)
        samples = _samples(p, bar.size, bar.placement, bar.kind) if p else []
        figure = "measured (median of the accepted runs)" if bar.baseline else "published"
        where = f"at {_size_words(bar.size)} ({bar.size} B), {bar.placement}; {bar.published} GB/s {figure} x (1 - {bar.tolerance}); {bar.source}"
        s = _summary(samples)
        if s is None:
            why = "no row at this size" if not samples else f"non-finite sample(s) {samples}"
            out.append(evaluate(bar.metric, "GB/s", None, bar.op, bar.threshold, f"{why}; {where}"))
        else:
            out.append(evaluate_interval(bar.metric, s, bar.op, bar.threshold, where))
    out.append(transport_check(profile, parsed))
    return out


def transport_check(profile: Profile[FabricBar], parsed: FabricParse) -> Check:
    """`transport` == what the profile needs, for every rank of every test (gates.transport, the judge every gate on
    an EFA profile shares): `NET/OFI efa` on an EFA profile (a rank on Socket, IB, another provider, a second
    plugin or unknown fails, named with its host), `none: no network (one node)` on one node (one GPU: no peer at
    all; NVLink: P2P/SHM only, no NET connection). Ranks missing from a test's output fail too (the profile's
    nodes x gpus-per-node are expected). nccl-tests uses no GIN: none is asked of it."""
    want = transport.need(profile) or transport.TransportNeed(
        NONE_ONE_NODE if profile.nodes == 1 else None, profile.nodes * profile.gpus_per_node
    )
    bad, seen, why = [], 0, []
    for name, p in parsed.tests.items():
        bad += [f"{name}: {x}" for x in transport.problems(want, TransportParse(p.transports, (), None, {}))]
        seen += len(p.transports)
        if p.transports and profile.nodes == 1 and profile.gpus_per_node == 1:
            why.append(f"{name}: one GPU, no peer: {p.transports[0].why}")
    if not parsed.tests:
        bad.append("no test output")
    shown = want.network or "one network"
    value = shown if not bad else "; ".join(bad[:8]) + (f"; ... {len(bad) - 8} more" if len(bad) > 8 else "")
    note = f"{seen} rank(s) over {len(parsed.tests)} test(s)" + (f"; {'; '.join(why)}" if why else "")
    return Check("transport", "", value[:600], "==", shown, not bad, note[:600])


def figures(spec: FabricSpec, profile: Profile[FabricBar], parsed: FabricParse) -> dict:
    """{`<test>.busbw_gbs@<size>` and `<test>.algbw_gbs@<size>` (a one-rank run has no bus traffic: busbw 0, algbw the
    local copy): {"samples": [...], "statistics": Summary.to_dict() or None}} at the spec's report
    sizes and the profile's bar sizes (out-of-place), plus `<test>.avg_busbw_gbs` (nccl-tests' own average over
    every size and cycle) and the transport per rank: what every run reports, bars or not."""
    out: dict = {}
    sizes = {(b.test, b.size) for b in profile.bars} | {(t, s) for t in spec.tests for s in spec.report_sizes}
    for test, size in sorted(sizes):
        p = parsed.get(test)
        samples = _samples(p, size, "out-of-place") if p else []
        s = _summary(samples)
        out[f"{test}.busbw_gbs@{size}"] = {"samples": samples, "statistics": s.to_dict() if s else None}
        alg = [r.out_of_place.algbw_gbs for r in p.rows_at(size)] if p else []  # one rank: a local copy, busbw 0
        a = _summary(alg)
        out[f"{test}.algbw_gbs@{size}"] = {"samples": alg, "statistics": a.to_dict() if a else None}
    for test, p in parsed.tests.items():
        out[f"{test}.avg_busbw_gbs"] = p.avg_busbw_gbs
        out[f"{test}.transports"] = [t.to_dict() for t in p.transports]
    return out
