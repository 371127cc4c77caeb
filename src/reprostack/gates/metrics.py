"""Gate 1's reported figures: per phase latency, scale-up / scale-out GB/s and the NVLink ratio, the dense
arm and the legacy run. Reported numbers, not bars: a profile's bars may name some of them
(schemas/gate.schema.json lists which), and only then do they decide anything.

Names (units by suffix: `_us` microseconds, `_gbs_p50` GB/s, `_ratio` / `_over_` dimensionless):
- `<phase>_p50_us`, `<phase>_su_gbs_p50`, `<phase>_so_gbs_p50`: p50 across ranks of test_ep's per-rank
  figure (phase with `_` for spaces: dispatch, expanded_dispatch, cached_dispatch, combine, reduced_combine);
- `<phase>_su_nvlink_ratio` = `<phase>_su_gbs_p50` / the profile's `scale-up-limit-gbs`;
- `dc_p50_us` = dispatch_p50_us + combine_p50_us;
- `dense_<phase>_p50_us`, `dense_<phase>_gbs_p50`, `dense_dc_p50_us`, `deepep_over_dense_dc` = dc_p50_us /
  dense_dc_p50_us (< 1: DeepEP is faster);
- `legacy_<section>_us` / `legacy_<section>_gbs` (rank 0, best of its sweep), `legacy_dc_us`.
"""

from __future__ import annotations

from .parsers.dense_a2a import DenseParse
from .parsers.legacy_intranode import LegacyParse
from .parsers.test_ep import TestEpParse


def slug(name: str) -> str:
    """`cached dispatch` -> `cached_dispatch`; `dispatch (FP8)` -> `dispatch_fp8`."""
    return name.lower().replace(" (", "_").replace(")", "").replace(" ", "_")


def unit_of(metric: str) -> str:
    """The unit a metric name implies (see the module doc)."""
    if metric.endswith("_us"):
        return "us"
    if metric.endswith("_gbs_p50") or metric.endswith("_gbs"):
        return "GB/s"
    return "ratio"


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else round(num / den, 6)


def deepep_metrics(parsed: TestEpParse, scale_up_limit_gbs: float | None) -> dict[str, float | None]:
    """Per phase p50 us, SU/SO GB/s p50 and SU / limit, plus dc_p50_us, from whatever phases were parsed
    (a phase no rank printed is absent). The ratio is None when the profile gives no limit."""
    out: dict[str, float | None] = {"dc_p50_us": parsed.dc_p50_us}
    for phase, st in parsed.phases.items():
        s = slug(phase)
        out[f"{s}_p50_us"] = st.p50
        out[f"{s}_su_gbs_p50"] = st.p50_su_gbs
        out[f"{s}_so_gbs_p50"] = st.p50_so_gbs
        out[f"{s}_su_nvlink_ratio"] = _ratio(st.p50_su_gbs, scale_up_limit_gbs)
    return out


def dense_metrics(dense: DenseParse, deepep_dc_p50_us: float | None) -> dict[str, float | None]:
    """Dense p50 per phase and GB/s, dense D+C and DeepEP D+C / dense D+C (None when either is missing)."""
    out: dict[str, float | None] = {}
    for phase, st in dense.phases.items():
        out[f"dense_{slug(phase)}_p50_us"] = st["p50_us"]
        out[f"dense_{slug(phase)}_gbs_p50"] = st["p50_gbs"]
    out["dense_dc_p50_us"] = dense.dc_p50_us
    out["deepep_over_dense_dc"] = _ratio(deepep_dc_p50_us, dense.dc_p50_us)
    return out


def legacy_metrics(legacy: LegacyParse) -> dict[str, float | None]:
    """Rank 0's best time and GB/s per section, and the legacy D+C (see parsers.legacy_intranode)."""
    out: dict[str, float | None] = {}
    for name, sec in legacy.sections.items():
        out[f"legacy_{slug(name)}_us"] = sec["best"]["us"]
        out[f"legacy_{slug(name)}_gbs"] = sec["best"]["gbs"]
    out["legacy_dc_us"] = legacy.dc_us
    return out


NOTES = {
    "su_nvlink_ratio": "scale-up GB/s p50 / the profile's scale-up-limit-gbs",
    "dense_": "ours: all_to_all_single, CUDA-event p50 per iteration (launches and a host sync included), "
    "p50 across ranks",
    "legacy_": "test_intranode.py, local rank 0 only, best of its NVL chunk sweep",
    "deepep_over_dense_dc": "DeepEP D+C p50 (kineto kernel times) / dense D+C p50 (CUDA events)",
}


def rows(values: dict[str, float | None], limit_source: str | None = None) -> list[dict]:
    """Report rows `{"metric", "unit", "value", "note"}` in the given order (value None: not measured)."""
    out = []
    for k, v in values.items():
        note = next((n for key, n in NOTES.items() if key in k), None)
        if k.endswith("su_nvlink_ratio") and limit_source:
            note = f"{note} ({limit_source})"
        out.append({"metric": k, "unit": unit_of(k), "value": v, "note": note})
    return out
