"""Gate specs: `gates/<gate>.yaml`, validated by schemas/gate.schema.json with file:line errors.

The types the shared code reads (gates.base, plan, runner, registry, the cluster renderers): `Spec` and
`HardwareProfile`, two read-only Protocols that every kind's spec (GateSpec here, servingspec.ServingSpec,
training_spec.TrainingSpec, fabric_spec.FabricSpec) and profile (Profile here, servingspec.ServingProfile) satisfy;
a kind's own code reads its own dataclasses (gates.base.Gate is generic over them).

Invariants:
- every kind of spec (micro, serving, training, fabric) is read by `read_gate_yaml`: bounded, schema-validated,
  its `gate:` equal to its file name;
- no `env` anywhere in a spec (top level, a profile, an arm, `stacks.<name>.env`, `stacks.<name>.profiles.<p>.env`)
  sets a loader variable (`LD_PRELOAD`, `LD_LIBRARY_PATH`, any `LD_*`: they decide which NCCL every process loads):
  a spec's env goes over the lock stack's, so one there would override what `upstreams.lock` pins with its reason
  (`stacks.<name>.env-why`, lock.stacks); the error names the spec's line and says where such a variable belongs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ..errors import GateError, LocatedError
from ..lock.stacks import is_loader_var
from ..yamlsrc import compose, dotted, line_of, read_bytes, validate
from .. import schemas
from ..evidence.bars.baseline import Baseline, BaselineError, BaselineSpec, accepted_among, accepted_runs, baseline


class GateSpecError(LocatedError, GateError):
    """`gates/<gate>.yaml` is malformed."""


class NoProfileForHost(GateError):
    """No profile of a gate spec fits this host (and none was named): the gate is a SKIP with this message as
    its reason, never a pass and never a crash of all-gates."""


@runtime_checkable
class HardwareProfile(Protocol):
    """What the shared code reads of any kind's profile: its name, the hardware it runs on (nodes x GPUs per node,
    EFA, a GPU at all, the GPU model auto-detection requires) and whether its bars are measured (gates.base.verdict).
    Read-only: every profile is a frozen dataclass."""

    @property
    def name(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def needs_efa(self) -> bool: ...
    @property
    def needs_gpu(self) -> bool: ...
    @property
    def gpu_model(self) -> str | None: ...
    @property
    def bars_status(self) -> str: ...
    @property
    def bars_status_why(self) -> str: ...
    @property
    def ep_size(self) -> int: ...
    @property
    def measured(self) -> bool: ...


P_co = TypeVar("P_co", bound=HardwareProfile, covariant=True)


@runtime_checkable
class SpecOf(Protocol[P_co]):
    """What the shared code reads of any kind's spec whose profiles are `P_co`: the gate it belongs to, its file and
    the sha256 of its bytes, the image recipe it runs in, its watchdog timeout, the kernels whose bump re-runs it and
    its profiles by name (`profile(name)`: GateError naming the known ones). Read-only: every spec is a frozen
    dataclass. `Spec` is any kind's (profiles read as HardwareProfile)."""

    @property
    def gate(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def sha256(self) -> str: ...
    @property
    def image(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def kernels(self) -> tuple[str, ...]: ...
    @property
    def profiles(self) -> Mapping[str, P_co]: ...
    def profile(self, name: str) -> P_co: ...


Spec = SpecOf[HardwareProfile]  # any kind's spec, as the shared code reads it
# a kind's own spec and profile types: gates.base.Gate and RunState are generic over them (MicroGate is a
# Gate[GateSpec, Profile[Bar]], ServingGate a Gate[ServingSpec, ServingProfile])
SpecT = TypeVar("SpecT", bound=SpecOf[Any])
ProfileT = TypeVar("ProfileT", bound=HardwareProfile)


class Requiring(Protocol):
    """A spec with its own `requires:` (servingspec.ServingSpec): what gates.base.Gate.requirements reads of a gate
    made with requires=None."""

    @property
    def path(self) -> Path: ...
    @property
    def requires(self) -> tuple[str, ...]: ...
    @property
    def lines(self) -> dict: ...


@dataclass(frozen=True)
class Bar:
    """`metric op threshold` (unit), its `source`. A baseline bar (`baseline:` in the spec, evidence.bars.baseline) has no
    threshold until its runs are read (`resolve_bars`, when a run is judged); then `baseline` holds the Baseline."""

    metric: str
    op: str
    threshold: float | None
    unit: str
    source: str
    baseline: Baseline | BaselineSpec | None = None

    @property
    def reference(self) -> str:
        """What the bar's threshold comes from, for the check's note: the source, and the baseline when it has one."""
        if isinstance(self.baseline, Baseline):
            return f"{self.source}; {self.baseline.describe(self.op, self.unit)}"
        return self.source


BARS_MEASURED, BARS_UNMEASURED = "measured", "unmeasured"


B = TypeVar("B")  # a profile's bar type: Bar (micro), training_spec.TrainingBar, fabric_spec.FabricBar


@dataclass(frozen=True)
class Profile(Generic[B]):
    """A hardware profile: EP size = nodes x gpus_per_node; bars say what passes on that hardware.

    bars_status: "measured" (bars set from runs on this hardware) or "unmeasured" (no reference yet: the gate
    reports every number but never passes, see gates.base.verdict), `bars_status_why` saying why (the yaml's
    `bars-status-why`, shown in the verdict); scale_up_limit_gbs: the part's scale-up
    (NVLink) bandwidth per direction per GPU in GB/s, None when the yaml gives none, with its source;
    launcher: "local" (the script spawns its ranks) or "torchrun" (one torchrun agent per node);
    gpu_model: a substring every GPU name must hold for auto-detection (None: any)."""

    name: str
    nodes: int
    gpus_per_node: int
    needs_efa: bool
    args: tuple[str, ...]
    env: dict
    bars: tuple[B, ...]
    description: str = ""
    bars_status: str = BARS_MEASURED
    bars_status_why: str = ""
    scale_up_limit_gbs: float | None = None
    scale_up_limit_source: str | None = None
    launcher: str = "local"
    gpu_model: str | None = None
    needs_gpu: bool = True  # every GPU gate's profile (the serving gates' local-test profile is the one that is not)

    @property
    def ep_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def measured(self) -> bool:
        """True only when the yaml says the bars come from measurements on this hardware."""
        return self.bars_status == BARS_MEASURED


@dataclass(frozen=True)
class ArmSpec:
    """A second program run next to the gate's script (`dense:` / `legacy:` of the yaml).

    script: for `dense` a path under the project root (our driver), for `legacy` a path in the patched
    deepep tree; ep_sizes: the EP sizes it can run at (empty: any); timeout_s: watchdog seconds (None: the
    gate's)."""

    script: str
    args: tuple[str, ...] = ()
    timeout_s: float | None = None
    ep_sizes: tuple[int, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class GateSpec:
    gate: str
    path: Path
    sha256: str
    script: str
    args: tuple[str, ...]
    env: dict
    timeout_s: float
    kernels: tuple[str, ...]
    profiles: dict[str, Profile[Bar]] = field(default_factory=dict)
    description: str = ""
    dense: ArmSpec | None = None
    legacy: ArmSpec | None = None
    image: str = ""  # the recipe under containers/ the gate runs in
    stacks: dict = field(
        default_factory=dict
    )  # `stacks:` of the spec: per lock stack, env and per-profile env/bars-status
    stack: str | None = None  # the lock stack with_stack() applied (None: none applied)

    def with_stack(self, name: str, lock_env: dict | None = None) -> GateSpec:
        """This spec as stack `name` runs it (its `image` when the entry names one): env = the spec's, then the lock
        stack's `lock_env`, then the spec's
        `stacks.<name>.env`; each profile's env gets `stacks.<name>.profiles.<profile>.env` over its own, and its
        bars-status that entry's (a stack's run on hardware its bars were not measured with says so). A profile
        named there that the spec does not have is a GateSpecError naming the line."""
        import dataclasses

        entry = self.stacks.get(name) or {}
        env = {**self.env, **(lock_env or {}), **(entry.get("env") or {})}
        profiles = dict(self.profiles)
        for pname, pe in (entry.get("profiles") or {}).items():
            if pname not in profiles:
                raise GateError(
                    f"{self.path}: stacks.{name}.profiles.{pname}: no such profile "
                    f"(known: {', '.join(sorted(self.profiles))})"
                )
            p = profiles[pname]
            profiles[pname] = dataclasses.replace(
                p, env={**p.env, **(pe.get("env") or {})}, bars_status=pe.get("bars-status", p.bars_status)
            )
        return dataclasses.replace(self, env=env, profiles=profiles, stack=name, image=entry.get("image", self.image))

    def profile(self, name: str) -> Profile[Bar]:
        if name not in self.profiles:
            raise GateError(f"{self.path}: no profile {name!r} (known: {', '.join(sorted(self.profiles))})")
        return self.profiles[name]


def read_gate_yaml(root: Path, gate: str, schema: str, file_stem: str | None = None) -> tuple[Path, bytes, dict, dict]:
    """Read `<root>/gates/<file_stem or gate>.yaml`, validate it against `schemas/<schema>` and check its `gate:`
    names `gate`. Returns (path, raw bytes, data, {yaml path: line}). Raises GateSpecError (FILE:LINE: field)."""
    path = Path(root) / "gates" / f"{file_stem or gate}.yaml"
    try:
        raw = read_bytes(path, GateSpecError)  # at most yamlsrc.MAX_BYTES + 1
    except OSError as e:
        raise GateSpecError(str(path), None, "(file)", e.strerror or str(e)) from None
    data, lines = compose(raw, str(path), GateSpecError)  # bounded: size, depth, aliases, UTF-8
    validate(
        data,
        lines,
        schemas.load(schema),
        str(path),
        GateSpecError,
    )
    if data["gate"] != gate:
        raise GateSpecError(str(path), lines.get(("gate",)), "gate", f"is {data['gate']!r}, file name says {gate!r}")
    _refuse_loader_env(str(path), lines, data, ())
    return path, raw, data, lines


def _refuse_loader_env(path: str, lines: dict, node, at: tuple) -> None:
    """GateSpecError at the first `...env.LD_*` of the spec (any depth): loader variables belong to a lock stack's
    env, with their reason (lock.stacks)."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            _refuse_loader_env(path, lines, v, at + (i,))
        return
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        if k == "env" and isinstance(v, dict):
            for var in v:
                if is_loader_var(str(var)):
                    where = at + ("env", var)
                    raise GateSpecError(
                        path,
                        line_of(lines, where),
                        dotted(where),
                        f"{var} is a loader variable: it decides which libraries (which NCCL) every process of the "
                        "gate loads, and a spec's env goes over the lock's; set it in an upstreams.lock stack's env "
                        "with its reason under `env-why` (docs/stacks.md)",
                    )
        _refuse_loader_env(path, lines, v, at + (k,))


def load_spec(root: Path, gate: str) -> GateSpec:
    """Load and validate `<root>/gates/<gate>.yaml`. Raises GateSpecError (file:line: field: problem)."""
    path, raw, data, lines = read_gate_yaml(root, gate, "gate.schema.json")
    profiles = {name: profile_from(name, p, _bars(p["bars"])) for name, p in data["profiles"].items()}
    spec = GateSpec(
        gate=gate,
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        script=data["script"],
        args=tuple(data.get("args", ())),
        env=dict(data.get("env", {})),
        timeout_s=float(data.get("timeout-s", 1800)),
        kernels=tuple(data.get("kernels", ())),
        profiles=profiles,
        description=data.get("description", ""),
        dense=_arm(data.get("dense")),
        legacy=_arm(data.get("legacy")),
        image=data["image"],
        stacks=dict(data.get("stacks", {})),
    )
    for sname, entry in spec.stacks.items():  # a stack's profile must be one of the spec's (file:line)
        for pname in entry.get("profiles") or {}:
            if pname not in profiles:
                at = ("stacks", sname, "profiles", pname)
                raise GateSpecError(
                    str(path),
                    lines.get(at),
                    f"stacks.{sname}.profiles.{pname}",
                    f"no such profile (known: {', '.join(sorted(profiles))})",
                )
    return spec


def profile_from(name: str, p: dict, bars: tuple | None = None) -> Profile:
    """The Profile of a validated `profiles.<name>` mapping; `bars`: already made bars (the training gates' own kind),
    else the mapping's `bars` as Bar."""
    return Profile(
        name=name,
        nodes=p["nodes"],
        gpus_per_node=p["gpus-per-node"],
        needs_efa=p.get("needs-efa", False),
        args=tuple(p.get("args", ())),
        env=dict(p.get("env", {})),
        bars=tuple(Bar(**b) for b in p["bars"]) if bars is None else tuple(bars),
        description=p.get("description", ""),
        bars_status=p.get("bars-status", BARS_MEASURED),
        bars_status_why=p.get("bars-status-why", ""),
        scale_up_limit_gbs=p.get("scale-up-limit-gbs"),
        scale_up_limit_source=p.get("scale-up-limit-source"),
        launcher=p.get("launcher", "local"),
        gpu_model=p.get("gpu-model"),
    )


def _bars(bars: list) -> tuple[Bar, ...]:
    """The profile's bars as the spec says them (a `baseline:` bar unresolved: resolve_bars reads its runs)."""
    out = []
    for b in bars:
        if "baseline" not in b:
            out.append(Bar(**b))
            continue
        e = b["baseline"]
        spec = BaselineSpec(
            tuple(e["runs"]), float(e["tolerance"]), e["why"], e.get("stack", "campaign"), e.get("signed-only", False)
        )
        out.append(Bar(**{k: v for k, v in b.items() if k != "baseline"}, threshold=None, baseline=spec))
    return tuple(out)


def resolve_bars(
    spec: GateSpec,
    profile: Profile[Bar],
    *,
    root: Path,
    folder: Path | None = None,
    stack: str = "",
    runs: tuple[str, ...] = (),
    runs_from: str = "--baseline-run",
) -> Profile[Bar]:
    """`profile` with every baseline bar's threshold made from its runs: the spec's; with `folder` (`--baseline
    DIR`) the accepted runs of this gate, profile and `stack` under it; with `runs` (project paths: `--baseline-run`,
    or what the command layer resolved `--baseline history` to, named by `runs_from`) the accepted ones among them;
    at the bar's own tolerance. Raises BaselineError (one line naming the bar and the run) when a run cannot be used
    or none is accepted, and, with `folder` or `runs`, for a bar with a fixed threshold (no tolerance to take)."""
    import dataclasses

    given = folder is not None or bool(runs)
    bars = []
    for b in profile.bars:
        if not given and not isinstance(b.baseline, BaselineSpec):
            bars.append(b)
            continue
        if b.baseline is None:
            raise BaselineError(
                f"--baseline: bar {b.metric} of profile {profile.name} has a fixed threshold, no baseline tolerance"
            )
        own = b.baseline if isinstance(b.baseline, BaselineSpec) else None
        tol = b.baseline.tolerance
        where = f"{spec.path.name}: profiles.{profile.name} bar {b.metric}"
        model = profile.gpu_model
        key = dict(gate=spec.gate, profile=profile.name, metric=b.metric, stack=stack, model=model)
        try:
            if not given:
                got = own.resolve(root, gate=spec.gate, profile=profile.name, metric=b.metric, model=model)
            else:
                if folder is not None:
                    chosen = accepted_runs(root, folder, **key)
                    why = f"the accepted runs under {folder} (--baseline)"
                    if not chosen:
                        raise BaselineError(
                            f"no accepted {spec.gate} {profile.name} run of stack {stack} under {folder}"
                        )
                else:
                    chosen = accepted_among(root, runs, **key)
                    why = f"the accepted runs of {runs_from} ({len(chosen)} of the {len(runs)} given)"
                    if not chosen:
                        raise BaselineError(
                            f"no accepted {spec.gate} {profile.name} run of stack {stack} among the {len(runs)} "
                            f"run(s) of {runs_from}"
                        )
                got = baseline(
                    root,
                    chosen,
                    tolerance=tol,
                    why=why,
                    gate=spec.gate,
                    profile=profile.name,
                    metric=b.metric,
                    stack=stack,
                    model=model,
                )
        except BaselineError as e:
            raise BaselineError(f"{where}: {e}") from None
        bars.append(dataclasses.replace(b, threshold=got.threshold(b.op), baseline=got))
    return dataclasses.replace(profile, bars=tuple(bars))


def _arm(a: dict | None) -> ArmSpec | None:
    if a is None:
        return None
    return ArmSpec(
        script=a["script"],
        args=tuple(a.get("args", ())),
        timeout_s=float(a["timeout-s"]) if "timeout-s" in a else None,
        ep_sizes=tuple(a.get("ep-sizes", ())),
        description=a.get("description", ""),
    )
