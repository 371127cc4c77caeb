"""Training gate specs (`gates/megatron.yaml`, `gates/nemo_rl.yaml`): schemas/training.schema.json, file:line errors.

Bars are the micro gate's (metric op threshold, unit, source) plus `arm`: the arm a bar judges (default:
every arm; `arms_loss_rel_diff_max` compares the arms and has none; `efa_tx_gb` defaults to the DeepEP arm).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GateError
from .spec import Bar, GateSpecError, Profile, profile_from, read_gate_yaml


@dataclass(frozen=True)
class TrainingBar(Bar):
    arm: str | None = None


@dataclass(frozen=True)
class Arm:
    """One way of running the same training: `args`/`env` added to the gate's; `deepep`: needs the DeepEP
    kernels (and is the arm the transport bars judge); `reference`: the comparison arm of cross-arm bars."""

    name: str
    args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    deepep: bool = False
    reference: bool = False
    description: str = ""


@dataclass(frozen=True)
class TrainingSpec:
    """A training gate. kind `megatron-driver`: `driver` (a project file) is started once per arm;
    kind `nemo-rl`: `command` runs inside the `source` pin's tree. `steps`: logged steps the run must show."""

    gate: str
    path: Path
    sha256: str
    kind: str
    source: str
    steps: int
    timeout_s: float
    kernels: tuple[str, ...] = ()
    driver: str | None = None
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    arms: dict = field(default_factory=dict)
    profiles: dict[str, Profile[TrainingBar]] = field(default_factory=dict)
    description: str = ""
    image: str = ""  # the recipe under containers/ the gate runs in

    def profile(self, name: str) -> Profile[TrainingBar]:
        """The profile `name`; raises GateError naming the known ones."""
        if name not in self.profiles:
            raise GateError(f"{self.path}: no profile {name!r} (known: {', '.join(sorted(self.profiles))})")
        return self.profiles[name]

    @property
    def deepep_arm(self) -> str | None:
        return next((a.name for a in self.arms.values() if a.deepep), None)

    @property
    def reference_arm(self) -> str | None:
        return next((a.name for a in self.arms.values() if a.reference), None)


def load_training_spec(root: Path, gate: str) -> TrainingSpec:
    """Load and validate `<root>/gates/<gate>.yaml`. Raises GateSpecError (`FILE:LINE: field: problem`) for
    schema errors, a file name that disagrees with `gate:`, a bar naming an unknown arm, or a missing driver."""
    path, raw, data, lines = read_gate_yaml(root, gate, "training.schema.json")
    arms = {
        n: Arm(
            n,
            tuple(a.get("args", ())),
            dict(a.get("env", {})),
            a.get("deepep", False),
            a.get("reference", False),
            a.get("description", ""),
        )
        for n, a in (data.get("arms") or {}).items()
    }
    profiles = {}
    for name, p in data["profiles"].items():
        bars = []
        for i, b in enumerate(p["bars"]):
            if "arm" in b and b["arm"] not in arms:
                raise GateSpecError(
                    str(path),
                    lines.get(("profiles", name, "bars", i, "arm")),
                    f"profiles.{name}.bars[{i}].arm",
                    f"no arm {b['arm']!r} (known: {', '.join(arms) or 'none'})",
                )
            bars.append(TrainingBar(**b))
        profiles[name] = profile_from(name, p, bars)
    if data.get("driver") and not (Path(root) / data["driver"]).is_file():
        raise GateSpecError(str(path), lines.get(("driver",)), "driver", f"{data['driver']} does not exist")
    return TrainingSpec(
        gate=gate,
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        kind=data["kind"],
        source=data["source"],
        steps=data["steps"],
        timeout_s=float(data.get("timeout-s", 1800)),
        kernels=tuple(data.get("kernels", ())),
        driver=data.get("driver"),
        command=tuple(data.get("command", ())),
        args=tuple(data.get("args", ())),
        env=dict(data.get("env", {})),
        arms=arms,
        profiles=profiles,
        description=data.get("description", ""),
        image=data["image"],
    )
