"""The typed spec and profile (issue 38 item 2): every gate of the registry declares its kind's spec and profile types
(`Gate[SpecT, ProfileT]`, reprostack.gates.base), what its loader really returns is of those types, and every kind's
spec and profile answers the read-only protocols the shared code reads them through (reprostack.gates.spec: SpecOf,
HardwareProfile). mypy (`nox -s lint`) checks the same statically; this pins it to the specs as loaded."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from reprostack.gates import profiles, registry
from reprostack.gates.base import Gate, RunState
from reprostack.gates.spec import HardwareProfile, SpecOf
from reprostack.lock import load

REPO = Path(__file__).resolve().parents[1]
LOCK = load(REPO / "upstreams.lock")


def declared(g: Gate) -> tuple[type, type]:
    """(spec type, profile type) of the `Gate[...]` base the gate's class names (the profile's origin class when it is
    generic itself, `Profile[FabricBar]` -> Profile)."""
    for cls in type(g).__mro__:
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is Gate:
                spec_t, prof_t = typing.get_args(base)
                return spec_t, typing.get_origin(prof_t) or prof_t
    raise AssertionError(f"{type(g).__name__} names no Gate[spec, profile] base")


@pytest.mark.parametrize("name", registry.GATE_ORDER)
def test_each_gate_declares_the_types_its_loader_returns(name):
    g = registry.gate(name)
    spec_t, prof_t = declared(g)
    for spec in (g.load(REPO), g.spec_for(REPO, LOCK)):
        assert type(spec) is spec_t, (name, type(spec), spec_t)
        assert spec.profiles and all(type(p) is prof_t for p in spec.profiles.values()), name
        assert type(profiles.resolve(spec)) is prof_t


@pytest.mark.parametrize("name", registry.GATE_ORDER)
def test_every_spec_and_profile_answers_the_shared_protocols(name):
    g = registry.gate(name)
    spec = g.spec_for(REPO, LOCK)
    assert isinstance(spec, SpecOf)
    assert spec.gate in (g.name, g.stem) and spec.path == REPO / g.spec_file and len(spec.sha256) == 64
    assert isinstance(spec.timeout_s, float) and isinstance(spec.kernels, tuple) and isinstance(spec.image, str)
    for pname, p in spec.profiles.items():
        assert isinstance(p, HardwareProfile) and spec.profile(pname) is p and p.name == pname
        assert isinstance(p.nodes, int) and isinstance(p.gpus_per_node, int) and p.ep_size == p.nodes * p.gpus_per_node
        assert isinstance(p.needs_efa, bool) and isinstance(p.needs_gpu, bool)
        assert p.gpu_model is None or isinstance(p.gpu_model, str)
        assert p.measured == (p.bars_status == "measured") and isinstance(p.bars_status_why, str)


def test_a_value_missing_a_field_is_not_a_profile_or_spec():
    """The protocols name fields: an object without them (a mapping of the yaml, a bare name) answers neither."""
    g = registry.gate("micro")
    spec = g.load(REPO)
    assert not isinstance({"name": "p5en-efa-ep16", "nodes": 2}, HardwareProfile)
    assert not isinstance("p5en-efa-ep16", HardwareProfile)
    assert not isinstance(spec.profile("p5en-efa-ep16"), SpecOf)
    assert not isinstance(spec.profiles, SpecOf)


def test_a_run_state_holds_its_spec_from_the_start():
    """RunState.spec is set when the state is made (Gate.run passes the spec it loaded), never None in a stage."""
    g = registry.gate("micro")
    spec = g.load(REPO)
    with pytest.raises(TypeError):
        RunState(g, None, None)  # type: ignore[call-arg]  # the spec is required
    st = RunState(g, None, None, spec)  # type: ignore[arg-type]
    assert st.spec is spec and st.profile is None
