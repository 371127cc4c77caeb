"""A gate kind's own values between the stages of one run (gates.base.RunState.kind): each kind declares a subclass
of KindState holding exactly the values its later stages read, with their types (gates.micro.MicroState,
gates.fabric.FabricState, gates.serving.ServingState, gates.training.MegatronState, gates.nemo_rl.NemoRLState),
names it as its Gate's `state`, and reads it with `<Kind>State.of(st)`.

Invariants: the run makes the state when it starts (Gate.run: `kind=gate.state()`), so every field has a default
(None or empty: not reached yet); a kind's state is never a dict of loose keys; nothing here imports a gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

K = TypeVar("K", bound="KindState")


class _HasKind(Protocol):
    kind: KindState


@dataclass
class KindState:
    """The state of a kind that keeps nothing between its stages (the base of every kind's own)."""

    @classmethod
    def of(cls: type[K], st: _HasKind) -> K:
        """`st`'s (a gates.base.RunState) kind state as this class; AssertionError when the run made another."""
        if not isinstance(st.kind, cls):
            raise AssertionError(f"the run's kind state is {type(st.kind).__name__}, not {cls.__name__}")
        return st.kind
