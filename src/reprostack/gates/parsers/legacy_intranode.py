"""Parse DeepEP's legacy `tests/legacy/test_intranode.py` (deepseek-ai/DeepEP@b306af06) output.

What the upstream test prints, from local rank 0 only (read at that commit; shapes only, nothing copied):
- `[config] num_tokens=128, hidden=7168, num_topk=8`;
- `[layout] Kernel performance: 0.012 ms`;
- per correctness case `[testing] Running with BF16, with top-k (async=False, previous=False) ... passed`
  (2 previous x 2 async x 3 inputs x 2 top-k = 24 cases when FP8 is compiled in, 16 without);
- three tuning sweeps, in order: dispatch with FP8 input (if compiled), dispatch with BF16 input, combine;
  each line `[tuning] SMs 24, NVL chunk 6: 151.23 GB/s (NVL), 95.12 us` (`NVL chunk default` for the
  default config), each sweep closed by its best:
  `[tuning] Best dispatch (FP8): SMs 24, NVL chunk 10, 160.00 GB/s (NVL), t: 90.00 us` and
  `[tuning] Best combine: SMs 24, NVL chunk 4: 140.00 GB/s (NVL), t: 100.00 us`.
Times are `deep_ep.utils.testing.bench` means over 50 CUDA-event-timed runs (after 50 warm-ups) on rank 0;
GB/s is rank 0's NVLink receive (dispatch) or send (combine) bytes over that time.

Legacy D+C = best FP8 dispatch + best combine (test_ep's first mode also dispatches FP8); BF16 dispatch +
combine when no FP8 sweep was printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .logtext import numbered_lines

SECTIONS = ("dispatch (FP8)", "dispatch (BF16)", "combine")
_N = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_CONFIG = re.compile(r"\[config\] num_tokens=(\d+), hidden=(\d+), num_topk=(\d+)")
_LAYOUT = re.compile(rf"\[layout\] Kernel performance: ({_N}) ms")
_TESTING = re.compile(
    r"\[testing\] Running with (FP8|BF16), (with|without) top-k \(async=(\w+), previous=(\w+)\) \.\.\.(.*)$"
)
_SWEEP = re.compile(rf"\[tuning\] SMs (\d+), NVL chunk (\d+|default): ({_N}) GB/s \(NVL\), ({_N}) us")
_BEST = re.compile(
    rf"\[tuning\] Best (dispatch \((?:FP8|BF16)\)|combine): SMs (\d+), NVL chunk (\d+)[,:] "
    rf"({_N}) GB/s \(NVL\), t: ({_N}) us"
)


@dataclass
class LegacyParse:
    """Result of `parse_legacy`: `sections[name]` = {"best": {"sms", "nvl_chunk", "gbs", "us", "line"},
    "default": {"gbs", "us"} | None, "sweep_points": n}; `dc_us` (see module doc) with `dc_basis`;
    `tests_passed`/`tests_run`; `complete` = config, the BF16 dispatch and combine bests printed;
    `problems` each name a line or what is missing."""

    config: dict
    layout_ms: float | None
    tests_run: int
    tests_passed: int
    sections: dict
    dc_us: float | None
    dc_basis: str | None
    complete: bool
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """complete and no problems."""
        return self.complete and not self.problems

    def to_dict(self) -> dict:
        """JSON-ready form for the report's `data.legacy`."""
        return {
            "config": self.config,
            "layout_ms": self.layout_ms,
            "tests_run": self.tests_run,
            "tests_passed": self.tests_passed,
            "sections": self.sections,
            "dc_us": self.dc_us,
            "dc_basis": self.dc_basis,
            "complete": self.complete,
            "ok": self.ok,
            "problems": list(self.problems),
            "scope": "local rank 0 only; best over the NVL chunk sweep; bench() mean of 50 runs",
        }


def parse_legacy(text: str) -> LegacyParse:
    """Parse the merged output of one test_intranode.py run (all its ranks; only rank 0 prints figures).

    Never raises on log content: anomalies are listed in `problems`."""
    config, layout, problems = {}, None, []
    tests_run = tests_passed = 0
    sweep: list[tuple[int, dict]] = []
    sections: dict[str, dict] = {}
    for no, _pre, body in numbered_lines(text):
        if m := _CONFIG.search(body):
            config = {"num_tokens": int(m[1]), "hidden": int(m[2]), "num_topk": int(m[3])}
        elif m := _LAYOUT.search(body):
            layout = float(m[1])
        elif m := _TESTING.search(body):
            tests_run += 1
            if "passed" in m[5]:
                tests_passed += 1
        elif m := _BEST.search(body):
            name = m[1]
            if name in sections:
                problems.append(
                    f"line {no}: second `Best {name}` line (first at line {sections[name]['best']['line']})"
                )
                continue
            default = next(({"gbs": p["gbs"], "us": p["us"]} for _n, p in sweep if p["nvl_chunk"] == "default"), None)
            sections[name] = {
                "best": {"sms": int(m[2]), "nvl_chunk": int(m[3]), "gbs": float(m[4]), "us": float(m[5]), "line": no},
                "default": default,
                "sweep_points": len(sweep),
            }
            sweep = []
        elif m := _SWEEP.search(body):
            chunk = m[2] if m[2] == "default" else int(m[2])
            sweep.append((no, {"sms": int(m[1]), "nvl_chunk": chunk, "gbs": float(m[3]), "us": float(m[4])}))
        elif "[tuning]" in body or "[testing]" in body:
            problems.append(f"line {no}: unrecognised line: {body.strip()[:160]!r}")
    if not config:
        problems.append("no `[config] num_tokens=...` line")
    missing = [s for s in ("dispatch (BF16)", "combine") if s not in sections]
    problems += [f"`Best {s}` line missing" for s in missing]
    if sweep:
        problems.append(f"{len(sweep)} tuning line(s) after the last `Best` line (sweep cut short)")
    if tests_run and tests_passed < tests_run:
        problems.append(f"{tests_run - tests_passed} of {tests_run} correctness case(s) without `passed`")
    disp = "dispatch (FP8)" if "dispatch (FP8)" in sections else "dispatch (BF16)"
    dc = basis = None
    if disp in sections and "combine" in sections:
        dc = round(sections[disp]["best"]["us"] + sections["combine"]["best"]["us"], 6)
        basis = f"best {disp} + best combine"
    return LegacyParse(
        config, layout, tests_run, tests_passed, sections, dc, basis, bool(config) and not missing, problems
    )
