"""A gate kind's own values between its stages (issue 38 item 2): each gate of the registry names a typed state
(gates.state.KindState subclass, a dataclass whose every field has a real type and a default, so the run can make it
as it starts), read back as that class only; RunState carries it in `kind` and has no dict of loose keys."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

import pytest

from reprostack.gates import registry
from reprostack.gates.base import RunState
from reprostack.gates.options import GateOptions
from reprostack.gates.state import KindState

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", registry.GATE_ORDER)
def test_every_gate_names_a_typed_state_the_run_can_make(name):
    g = registry.gate(name)
    cls = g.state
    assert issubclass(cls, KindState) and dataclasses.is_dataclass(cls), f"{name}: {cls}"
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        assert hint not in (object, typing.Any, dict), f"{cls.__name__}.{f.name}: {hint} is no real type"
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, (
            f"{cls.__name__}.{f.name} has no default: the run makes the state before any stage"
        )
    assert isinstance(cls(), KindState)


def test_each_kind_keeps_its_own_class_and_reads_no_other():
    own = {g.state for g in registry.GATES if g.state is not KindState}  # a kind that keeps nothing: the base
    assert len(own) == len({type(g) for g in registry.GATES if g.state is not KindState})  # never another's class
    micro, fabric = registry.gate("micro"), registry.gate("fabric")
    st = RunState(micro, GateOptions(), None, micro.load(REPO), kind=micro.state())  # the spec: required (typed)
    assert micro.state.of(st) is st.kind
    with pytest.raises(AssertionError, match=f"not {fabric.state.__name__}"):
        fabric.state.of(st)


def test_run_state_has_no_untyped_bag():
    names = {f.name for f in dataclasses.fields(RunState)}
    assert "scratch" not in names and "kind" in names
    micro = registry.gate("micro")
    assert isinstance(RunState(micro, GateOptions(), None, micro.load(REPO)).kind, KindState)
