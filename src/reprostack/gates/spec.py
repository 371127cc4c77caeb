"""Gate specs: `gates/<gate>.yaml`, validated by schemas/gate.schema.json with file:line errors."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..errors import GateError, LocatedError
from ..yamlsrc import compose, validate


class GateSpecError(LocatedError, GateError):
    """`gates/<gate>.yaml` is malformed."""


@dataclass(frozen=True)
class Bar:
    metric: str
    op: str
    threshold: float
    unit: str
    source: str


@dataclass(frozen=True)
class Profile:
    """A hardware profile: EP size = nodes x gpus_per_node; bars say what passes on that hardware."""

    name: str
    nodes: int
    gpus_per_node: int
    needs_efa: bool
    args: tuple[str, ...]
    env: dict
    bars: tuple[Bar, ...]
    description: str = ""

    @property
    def ep_size(self) -> int:
        return self.nodes * self.gpus_per_node


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
    profiles: dict = field(default_factory=dict)
    description: str = ""

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise GateError(f"{self.path}: no profile {name!r} (known: {', '.join(sorted(self.profiles))})")
        return self.profiles[name]


def load_spec(root: Path, gate: str) -> GateSpec:
    """Load and validate `<root>/gates/<gate>.yaml`. Raises GateSpecError (file:line: field: problem)."""
    path = Path(root) / "gates" / f"{gate}.yaml"
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise GateSpecError(str(path), None, "(file)", e.strerror or str(e)) from None
    data, lines = compose(raw.decode(), str(path), GateSpecError)
    schema = json.loads(resources.files("reprostack").joinpath("schemas/gate.schema.json").read_text())
    validate(data, lines, schema, str(path), GateSpecError)
    if data["gate"] != gate:
        raise GateSpecError(str(path), lines.get(("gate",)), "gate", f"is {data['gate']!r}, file name says {gate!r}")
    profiles = {
        name: Profile(name=name, nodes=p["nodes"], gpus_per_node=p["gpus-per-node"],
                      needs_efa=p.get("needs-efa", False), args=tuple(p.get("args", ())), env=dict(p.get("env", {})),
                      bars=tuple(Bar(**b) for b in p["bars"]), description=p.get("description", ""))
        for name, p in data["profiles"].items()}
    return GateSpec(gate=gate, path=path, sha256=hashlib.sha256(raw).hexdigest(), script=data["script"],
                    args=tuple(data.get("args", ())), env=dict(data.get("env", {})),
                    timeout_s=float(data.get("timeout-s", 1800)), kernels=tuple(data.get("kernels", ())),
                    profiles=profiles, description=data.get("description", ""))
