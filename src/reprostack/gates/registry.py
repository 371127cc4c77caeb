"""The one registry of gates: name -> spec file, spec loader (its own schema), requirements, how to run it.

Every caller that reads `gates/<gate>.yaml` goes through here (the CLI, all-gates, the bump's impact step), so a
spec is always validated by its own gate's schema: micro by gates.spec (schemas/gate.schema.json), the serving
gates by gates.servingspec (serving.schema.json), the training gates by gates.training_spec
(training.schema.json). Invariants: GATES is in dependency order (a gate's requirements come before it); a
gate's `name` is what the operator types (`gate nemo-rl`), its `stem` names both its spec file and its report
(`gates/nemo_rl.yaml`, `nemo_rl.json`); a `gates/*.yaml` that no gate owns is a GateSpecError, never loaded
with another gate's schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .spec import GateSpecError


def _load_micro(root: Path, stem: str):
    from .spec import load_spec

    return load_spec(root, stem)


def _load_serving(root: Path, stem: str):
    from .servingspec import load_serving_spec

    return load_serving_spec(root, stem)


def _load_training(root: Path, stem: str):
    from .training_spec import load_training_spec

    return load_training_spec(root, stem)


@dataclass(frozen=True)
class Gate:
    """One gate. kind: micro | serving | training (picks the loader and the run function); requires: the gates
    that must pass first (None: the spec's own `requires:`, the serving gates)."""

    name: str
    stem: str
    kind: str
    requires: tuple[str, ...] | None = ()

    @property
    def report_name(self) -> str:
        return self.stem

    def spec_file(self, root: Path) -> Path:
        return Path(root) / "gates" / f"{self.stem}.yaml"

    def load(self, root: Path):
        """The validated spec (GateSpec / ServingSpec / TrainingSpec). Raises GateSpecError (file:line)."""
        return _LOADERS[self.kind](Path(root), self.stem)

    def requirements(self, root: Path) -> tuple[str, ...]:
        """Gate names that must pass before this one runs (the serving spec's `requires:`, each a gate earlier in
        GATE_ORDER). Raises GateSpecError for a bad spec or a name that is not an earlier gate."""
        if self.requires is not None:
            return self.requires
        spec = self.load(root)
        for i, r in enumerate(spec.requires):
            earlier = GATE_ORDER[: GATE_ORDER.index(self.name)]
            if r not in earlier:
                raise GateSpecError(
                    str(spec.path),
                    spec.lines.get(("requires", i)) or spec.lines.get(("requires",)),
                    f"requires[{i}]",
                    f"{r!r} is not a gate that runs before {self.name} (those: {', '.join(earlier) or 'none'})",
                )
        return tuple(spec.requires)


_LOADERS: dict[str, Callable] = {"micro": _load_micro, "serving": _load_serving, "training": _load_training}

GATES: tuple[Gate, ...] = (
    Gate("micro", "micro", "micro"),
    Gate("vllm", "vllm", "serving", None),
    Gate("sglang", "sglang", "serving", None),
    Gate("trtllm", "trtllm", "serving", None),
    Gate("megatron", "megatron", "training", ("micro",)),
    Gate("nemo-rl", "nemo_rl", "training", ("megatron",)),
)
BY_NAME: dict[str, Gate] = {g.name: g for g in GATES}
BY_STEM: dict[str, Gate] = {g.stem: g for g in GATES}
GATE_ORDER: tuple[str, ...] = tuple(BY_NAME)


def gate(name: str) -> Gate:
    """The gate `name` (CLI name or spec stem). Raises GateError naming the known gates."""
    g = BY_NAME.get(name) or BY_STEM.get(name)
    if g is None:
        from ..errors import GateError

        raise GateError(f"no gate {name!r} (gates: {', '.join(GATE_ORDER)})")
    return g


def present(root: Path) -> list[Gate]:
    """The gates whose spec file exists under `<root>/gates/`, in dependency order. Raises GateSpecError for a
    `gates/*.yaml` that no gate owns (it could only be read with another gate's schema)."""
    gdir = Path(root) / "gates"
    stray = sorted(p for p in gdir.glob("*.yaml") if p.stem not in BY_STEM) if gdir.is_dir() else []
    if stray:
        raise GateSpecError(str(stray[0]), None, "(file)", f"no gate owns this spec (gates: {', '.join(BY_STEM)})")
    return [g for g in GATES if g.spec_file(root).is_file()]


def load_all(root: Path) -> dict[str, object]:
    """{gate name: validated spec} of every gate present under `root`, each through its own loader.
    Raises GateSpecError (file:line) for the first spec that does not load."""
    return {g.name: g.load(root) for g in present(root)}
