"""The fabric gate's spec (gate 0): schemas/fabric.schema.json, file:line errors, the sha256 of its bytes.

Where: `gates/<SPEC_STEM>.yaml`, gates/fabric.yaml (the gate registry's FabricGate owns it).

What it holds (gates/fabric.yaml says why each value): the image and kernels, `trials` (nccl-tests' -N: the
sweep repeated in one launch), `report-sizes`, the tests (a binary of the nccl-tests build and its args), the env, and
profiles (gates.spec.Profile, made by gates.spec.profile_from) whose bars are FabricBar: `<test>.busbw_gbs` (or
`.algbw_gbs`, one GPU's local copy) at a size, threshold = published x (1 - tolerance), each with its source; or a
measured bar (`baseline:`): the median of the accepted runs committed under `runs-from` (this profile, on its
gpu-model: evidence.bars.baseline) x (1 - tolerance), made when a run is judged (`resolve_bars`); with fewer than `min-runs`
such runs the profile has no measured bar yet (FAIL, numbers reported, never PASS).

Invariants: every error is a GateSpecError `FILE:LINE: field: problem` (yamlsrc: bounded read, schema, then the
checks below), nothing runs before the spec loaded; a size is bytes or nccl-tests' own K/M/G (powers of 1024) and is
an int in the spec; a bar's metric names a test of the spec and its size must be one the test's sweep prints; a
published bar's source cites where the figure was read (an https:// address); a test's
args may not set what the gate sets (-g/--ngpus, -N/--run_cycles, -t/--nthreads, -J/--output_file); frozen
dataclasses.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GateError
from .spec import GateSpecError, Profile, profile_from, read_gate_yaml

GATE = "fabric"
SPEC_STEM = "fabric"  # gates/fabric.yaml, owned by the gate registry (gates.registry: FabricGate)
GATE_SET = {  # options node_commands sets; a spec's args may not set them too
    "-g": "GPUs per process (the profile's gpus-per-node)",
    "--ngpus": "GPUs per process (the profile's gpus-per-node)",
    "-N": "cycles (the spec's trials)",
    "--run_cycles": "cycles (the spec's trials)",
    "-t": "threads per process (one)",
    "--nthreads": "threads per process (one)",
    "-J": "JSON output (not used: the text is the evidence)",
    "--output_file": "JSON output (not used: the text is the evidence)",
}
_SIZE = re.compile(r"^([0-9]{1,13})([KMG]?)$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_bytes(v: int | str) -> int:
    """Bytes of a spec size: an int, or nccl-tests' own `8`, `64K`, `1M`, `1G` (powers of 1024, as its -b/-e read
    them). Raises ValueError for anything else."""
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a size")
    if isinstance(v, int):
        if v < 0:
            raise ValueError(f"{v!r} is not a size")
        return v
    m = _SIZE.match(v) if isinstance(v, str) else None
    if not m:
        raise ValueError(f"{v!r} is not a size (bytes, or a number with K, M or G)")
    return int(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class FabricBaseline:
    """A measured bar's `baseline:`: the accepted runs under `runs_from` (a project folder), at least `min_runs`."""

    runs_from: str
    tolerance: float
    why: str
    min_runs: int = 3


@dataclass(frozen=True)
class FabricBar:
    """`<test>.busbw_gbs` (or `.algbw_gbs`) at `size` bytes (`placement` out-of-place or in-place) `op` published x
    (1 - tolerance); a `baseline` bar's published figure is its runs' median once resolved (resolve_bars)."""

    metric: str
    size: int
    op: str
    published: float | None
    tolerance: float
    unit: str
    source: str
    placement: str = "out-of-place"
    baseline: FabricBaseline | None = None

    @property
    def test(self) -> str:
        return self.metric.split(".", 1)[0]

    @property
    def kind(self) -> str:
        """busbw_gbs or algbw_gbs"""
        return self.metric.split(".", 1)[1]

    @property
    def statistic(self) -> str:
        """Its key in a report's data.statistics (gates.fabric.figures)."""
        return f"{self.metric}@{self.size}"

    @property
    def threshold(self) -> float | None:
        return None if self.published is None else round(self.published * (1 - self.tolerance), 2)


def resolve_bars(
    root: Path, profile: Profile[FabricBar], *, gate: str = GATE, stack: str = "campaign"
) -> tuple[Profile[FabricBar], str]:
    """(profile, why): the profile with each baseline bar made from its accepted runs (published = their median,
    the source naming them), or, when a bar has fewer than its min-runs, the profile unmeasured with its resolvable
    bars only and `why` saying what is missing. Raises GateError for a runs-from outside the project."""
    import dataclasses

    from ..evidence.bars.baseline import accepted_runs, baseline

    out: list[FabricBar] = []
    missing: list[str] = []
    for b in profile.bars:
        if b.baseline is None:
            out.append(b)
            continue
        base = Path(root).resolve()
        folder = (base / b.baseline.runs_from).resolve()
        if not folder.is_relative_to(base):
            raise GateError(f"{b.metric}: baseline runs-from {b.baseline.runs_from!r} leads out of the project")
        kw = dict(gate=gate, profile=profile.name, metric=b.statistic, stack=stack, model=profile.gpu_model)
        runs = accepted_runs(base, folder, **kw) if folder.is_dir() else []
        if len(runs) < b.baseline.min_runs:
            missing.append(
                f"{b.metric} at {b.size} B: {len(runs)} accepted {profile.gpu_model or ''} run(s) of "
                f"{b.baseline.min_runs} under {b.baseline.runs_from}"
            )
            continue
        ref = baseline(base, runs, tolerance=b.baseline.tolerance, why=b.baseline.why, **kw)
        src = f"{b.source}; {ref.describe(b.op, b.unit)}"
        out.append(dataclasses.replace(b, published=round(ref.reference, 4), source=src))
    if not missing:
        return dataclasses.replace(profile, bars=tuple(out)), ""
    why = "no measured bar yet: " + "; ".join(missing) + " (scripts/device/gate_fabric.sh makes them)"
    return dataclasses.replace(profile, bars=tuple(out), bars_status="unmeasured", bars_status_why=why), why


@dataclass(frozen=True)
class FabricTest:
    """One nccl-tests binary run by the gate: `name` (all_reduce), `binary` (all_reduce_perf), its args."""

    name: str
    binary: str
    args: tuple[str, ...]
    description: str = ""

    def sweep(self) -> tuple[int, int, int | None, int | None]:
        """(minBytes, maxBytes, factor, step bytes) its args ask for, with nccl-tests' defaults (32M, 32M, none, 1M)."""
        lo = hi = 32 << 20
        factor, step = None, 1 << 20
        a = list(self.args)
        for i, tok in enumerate(a[:-1]):
            nxt = a[i + 1]
            try:
                if tok in ("-b", "--minbytes"):
                    lo = size_bytes(nxt)
                elif tok in ("-e", "--maxbytes"):
                    hi = size_bytes(nxt)
                elif tok in ("-f", "--stepfactor"):
                    factor = int(nxt)
                elif tok in ("-i", "--stepbytes"):
                    step = size_bytes(nxt)
            except ValueError:
                continue
        return lo, hi, factor if factor and factor > 1 else None, step

    def sizes(self) -> tuple[int, ...]:
        """The sizes of its sweep as nccl-tests steps them (src/common.cu TimeTest), at most 4096 of them."""
        lo, hi, factor, step = self.sweep()
        out, s = [], lo
        while s <= hi and len(out) < 4096:
            out.append(s)
            nxt = s * factor if factor else s + (step or 1)
            if nxt <= s:
                break
            s = nxt
        return tuple(out)


@dataclass(frozen=True)
class FabricSpec:
    gate: str
    path: Path
    sha256: str
    image: str
    kernels: tuple[str, ...]
    timeout_s: float
    trials: int
    report_sizes: tuple[int, ...]
    tests: dict
    env: dict
    profiles: dict[str, Profile[FabricBar]] = field(default_factory=dict)
    description: str = ""

    def profile(self, name: str) -> Profile[FabricBar]:
        """The profile `name`; raises GateError naming the known ones."""
        if name not in self.profiles:
            raise GateError(f"{self.path}: no profile {name!r} (known: {', '.join(sorted(self.profiles))})")
        return self.profiles[name]


def _where(lines: dict, *at) -> int | None:
    while at:
        if at in lines:
            return lines[at]
        at = at[:-1]
    return None


def load_fabric_spec(root: Path, stem: str = SPEC_STEM) -> FabricSpec:
    """Load and validate `<root>/gates/<stem>.yaml`. Raises GateSpecError (`FILE:LINE: field: problem`)."""
    path, raw, data, lines = read_gate_yaml(root, GATE, "fabric.schema.json", file_stem=stem)

    def err(at: tuple, field_: str, msg: str) -> GateSpecError:
        return GateSpecError(str(path), _where(lines, *at), field_, msg)

    tests = {}
    for name, t in data["tests"].items():
        for i, a in enumerate(t["args"]):
            flag = a.split("=", 1)[0]
            if flag in GATE_SET:
                raise err(
                    ("tests", name, "args", i), f"tests.{name}.args[{i}]", f"{a!r}: the gate sets {GATE_SET[flag]}"
                )
        tests[name] = FabricTest(name, t["binary"], tuple(t["args"]), t.get("description", ""))
    for name, test in tests.items():
        for opt in ("-b", "-e", "-i"):
            if opt in test.args[:-1]:
                val = test.args[test.args.index(opt) + 1]
                try:
                    size_bytes(val)
                except ValueError as e:
                    i = test.args.index(opt) + 1
                    raise err(("tests", name, "args", i), f"tests.{name}.args[{i}]", str(e)) from None
    report_sizes = tuple(size_bytes(s) for s in data.get("report-sizes", ()))
    profiles = {}
    for pname, p in data["profiles"].items():
        bars = []
        for i, b in enumerate(p["bars"]):
            at, f = ("profiles", pname, "bars", i), f"profiles.{pname}.bars[{i}]"
            e = b.get("baseline")
            base = (
                FabricBaseline(e["runs-from"], float(e["tolerance"]), e["why"], int(e.get("min-runs", 3)))
                if e
                else None
            )
            bar = FabricBar(
                metric=b["metric"],
                size=size_bytes(b["size"]),
                op=b["op"],
                published=float(b["published"]) if base is None else None,
                tolerance=float(b["tolerance"]) if base is None else base.tolerance,
                unit=b["unit"],
                source=b["source"],
                placement=b.get("placement", "out-of-place"),
                baseline=base,
            )
            if base is None and "https://" not in bar.source:
                raise err(
                    (*at, "source"), f + ".source", "a published figure cites where it was read (an https:// address)"
                )
            if bar.test not in tests:
                raise err((*at, "metric"), f + ".metric", f"no test {bar.test!r} (tests: {', '.join(tests)})")
            if bar.size not in tests[bar.test].sizes():
                raise err(
                    (*at, "size"),
                    f + ".size",
                    f"{bar.size} B is not a size the {bar.test} sweep prints ({tests[bar.test].args})",
                )
            bars.append(bar)
        profiles[pname] = profile_from(pname, p, tuple(bars))
    return FabricSpec(
        gate=GATE,
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        image=data["image"],
        kernels=tuple(data["kernels"]),
        timeout_s=float(data.get("timeout-s", 900)),
        trials=int(data["trials"]),
        report_sizes=report_sizes,
        tests=tests,
        env=dict(data.get("env", {})),
        profiles=profiles,
        description=data.get("description", ""),
    )
