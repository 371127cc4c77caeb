"""The one registry of gates: one line per gate, an object of its kind's Gate class (gates.base).

Every caller that reads `gates/<gate>.yaml` or runs, plans or renders a gate goes through here (the CLI, all-gates,
the launchers, preflight, the bump's impact step), so a spec is always validated by its own gate's schema and a
gate is always asked through the protocol, never by a kind string. Adding a gate: its spec under gates/, its module
(a Gate subclass, or an object of an existing kind) and one line in GATES.

Invariants: GATES is in dependency order (a gate's requirements come before it); a gate's `name` is what the
operator types (`gate nemo-rl`), its `stem` names both its spec file and its report (`gates/nemo_rl.yaml`,
`nemo_rl.json`); a `gates/*.yaml` that no gate owns is a GateSpecError, never loaded with another gate's schema.
"""

from __future__ import annotations

from pathlib import Path

from . import profiles
from .base import Gate
from .fabric import FabricGate
from .micro import MicroGate
from .nemo_rl import NemoRLGate
from .serving import ServingGate
from .spec import GateSpecError, Spec
from .training import MegatronGate

GATES: tuple[Gate, ...] = (
    FabricGate("fabric"),  # gate 0: NCCL itself over the fabric (nccl-tests); micro needs it on EFA profiles
    MicroGate("micro"),
    ServingGate("vllm"),
    ServingGate("sglang"),
    ServingGate("trtllm"),
    MegatronGate("megatron", requires=("micro",)),
    NemoRLGate("nemo-rl", "nemo_rl", requires=("megatron",)),
)
BY_NAME: dict[str, Gate] = {g.name: g for g in GATES}
BY_STEM: dict[str, Gate] = {g.stem: g for g in GATES}
GATE_ORDER: tuple[str, ...] = tuple(BY_NAME)
GATE_STEMS: tuple[str, ...] = tuple(BY_STEM)  # also accepted where a gate is named (a report's `nemo_rl`)
for _i, _g in enumerate(GATES):  # what a spec's `requires:` may name: the gates before it
    _g.earlier = GATE_ORDER[:_i]


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
    return [g for g in GATES if (Path(root) / g.spec_file).is_file()]


def load_all(root: Path) -> dict[str, Spec]:
    """{gate name: validated spec} of every gate present under `root`, each through its own loader.
    Raises GateSpecError (file:line) for the first spec that does not load."""
    return {g.name: g.load(root) for g in present(root)}


def rendered(root: Path) -> list[Gate]:
    """The gates present under `root` whose published profile the cluster renderers (`launch slurm`, `launch k8s`)
    render (Gate.launcher.unrenderable is None; fabric's p5en profile renders as an MPI launch), in dependency order:
    the gates of the committed examples (docs/examples/). Raises GateSpecError for a spec that does not load."""
    out = []
    for g in present(root):
        spec: Spec = g.load(root)
        if g.launcher.unrenderable(spec, profiles.resolve(spec)) is None:
            out.append(g)
    return out
