"""The Gate protocol (reprostack.gates.base) and the one options model (reprostack.gates.options): every gate of the
registry answers the protocol from its real spec; nothing outside the gate classes branches on a kind or probes a
spec; an option is defined once and its command line gives back the same options; the stages stay short."""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import sys
from pathlib import Path

import pytest

from reprostack.gates import options as gate_options
from reprostack.gates import profiles, registry
from reprostack.gates.base import IMAGE_PATHS, Gate
from reprostack.evidence.kind import Evidence
from reprostack.gates.kerneluse import KernelUse
from reprostack.gates.launcher import Launcher
from reprostack.gates.options import GateOptions
from reprostack.gates.spec import NoProfileForHost
from reprostack.lock import load

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "reprostack"
LOCK = load(REPO / "upstreams.lock")
# the modules of the gate classes: the only place a kind's own spec fields are read
KIND_MODULES = {Path(sys.modules[type(g).__module__].__file__).name for g in registry.GATES}
# the staged run and what it is made of: its functions stay short
STAGE_MODULES = KIND_MODULES | {
    "base.py",
    "runner.py",
    "plan.py",
    "container.py",
    "kernelprep.py",
    "options.py",
    "registry.py",
    "arms.py",
    "aiperfrun.py",
}


@pytest.mark.parametrize("name", registry.GATE_ORDER)
def test_every_gate_answers_the_protocol(name):
    g = registry.gate(name)
    assert isinstance(g, Gate) and type(g).load is not Gate.load and type(g).plan_parts is not Gate.plan_parts
    spec = g.spec_for(REPO, LOCK)
    published = profiles.resolve(spec)  # no name, no host: the published hardware
    assert published.name == profiles.published(spec) and published.nodes == 2 and published.needs_efa
    for profile in spec.profiles.values():
        parts = g.plan_parts(spec, profile, GateOptions(profile=profile.name), IMAGE_PATHS)
        assert [c.node for c in parts.commands] == list(range(profile.nodes)), profile.name
        assert all(c.argv for c in parts.commands)
        for arm in parts.arms:
            assert [c.node for c in arm.commands] in (list(range(profile.nodes)), [0]), (profile.name, arm.name)
    assert g.launcher.launches(spec, GateOptions()) >= 1
    assert g.launcher.unrenderable(spec, published) is None  # every published profile renders (docs/examples)
    assert isinstance(g.kernels.prebuilt(spec), tuple) and set(g.kernels.prebuilt(spec)) <= set(spec.kernels)
    assert set(g.kernels.rebuilt_by(spec)) <= set(spec.kernels)
    assert g.requirements(REPO) == tuple(r for r in g.requirements(REPO) if r in g.earlier)


# the Gate protocol: the spec, the requirements, the plan and the staged run; nothing else is a method of Gate
PROTOCOL = {
    "__init__",
    "__repr__",
    "load",
    "spec_for",
    "requirements",
    "plan_parts",
    "run",
    "check_options",
    "check_request",
    "sources",
    "skip",
    "prepare",
    "launch_and_judge",
    "finish",
}
# each other role is one typed object a kind declares as data, asked through it (never the gate): Gate.<face>.<question>
ROLES = {"kernels": KernelUse, "launcher": Launcher, "evidence": Evidence}
ASKED = {
    "kernels": {"prebuilt", "rebuilt_by", "line"},
    "launcher": {"launches", "mpi_launch", "unrenderable"},
    "evidence": {"rederive", "baseline_bars"},
}


def _methods(cls) -> set[str]:
    return {n for n, v in vars(cls).items() if inspect.isfunction(v) or isinstance(v, property)}


@pytest.mark.parametrize("name", registry.GATE_ORDER)
def test_gate_is_small_and_its_roles_are_objects(name):
    """Gate holds the protocol only (about a dozen methods); a kind adds no public method of its own (its helpers are
    private) and declares its kernels, launch traits and evidence as the typed objects of gates.kerneluse,
    gates.launcher and evidence.kind."""
    assert _methods(Gate) == PROTOCOL
    g = registry.gate(name)
    assert {m for m in _methods(type(g)) if not m.startswith("_")} <= PROTOCOL, type(g).__name__
    for face, cls in ROLES.items():
        assert type(getattr(g, face)) is cls, (name, face)
    assert (g.report_name, g.spec_file) == (g.stem, Path("gates") / f"{g.stem}.yaml")


def test_the_roles_are_asked_through_their_objects():
    """Nobody asks a gate a role's question directly (`g.rederive(...)`, `g.launches(...)`): only `g.evidence.rederive`,
    `g.launcher.launches`, `g.kernels.prebuilt`; and each face is asked only its own questions."""
    questions = set().union(*ASKED.values()) | {"prebuilt_kernels", "kernels_line", "skip_with"}
    bad = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            f = node.func
            if isinstance(f.value, ast.Name) and f.value.id in ("g", "gate") and f.attr in questions:
                bad.append(f"{path.relative_to(SRC)}:{node.lineno}: {f.value.id}.{f.attr}(...)")
            face = f.value.attr if isinstance(f.value, ast.Attribute) else None
            if face in ASKED and isinstance(f.value.value, ast.Name) and f.value.value.id in ("g", "gate", "self"):
                if f.attr not in ASKED[face]:
                    bad.append(f"{path.relative_to(SRC)}:{node.lineno}: {face}.{f.attr}(...)")
    assert bad == []


def test_the_profile_rule_is_one_rule():
    g = registry.gate("micro")
    spec = g.spec_for(REPO, LOCK)
    h200 = {"gpu_count": 1, "gpus": [{"name": "NVIDIA H200"}], "efa_devices": []}
    assert profiles.resolve(spec, None, h200).name == "h200-ep1"  # a run here: this host's
    assert profiles.resolve(spec).name == "p5en-efa-ep16"  # a plan, a launcher, preflight: the published one
    assert profiles.resolve(spec, "h200-nvl-ep8", h200).name == "h200-nvl-ep8"  # named: that one, anywhere


def _parser(names=gate_options.RUN_OPTIONS) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("gate")
    p.add_argument("--lock")
    p.add_argument("--cache")
    gate_options.add_arguments(p, names)
    return p


@pytest.mark.parametrize(
    "opts",
    [
        GateOptions(),
        GateOptions(profile="h200-ep1", trials=3, arms=("deepep", "dense"), legacy=True, modes="all", timeout=90.0),
        GateOptions(
            profile="p5en-efa-ep16",
            nodes=2,
            node_rank=1,
            master_addr="10.0.0.1",
            master_port=29500,
            jobs=8,
            arch="90",
            vars=(("trtllm_seam", "/x"), ("k", "a=b")),
            server_args=("--fail-every=3",),
        ),
        GateOptions(baseline_runs=("results/a/micro.json", "results/b/micro.json"), num_sms=24, purpose="baseline"),
    ],
)
def test_the_runner_command_line_gives_back_the_same_options(opts):
    argv = opts.runner_argv("micro", out="/out", lock="/workspace/upstreams.lock")
    assert argv[:6] == ["python3", "-m", "reprostack", "gate", "micro", "--no-container"]
    back = GateOptions.from_args(_parser().parse_args(argv[4:]))
    assert back.with_(out=opts.out, python=opts.python) == opts
    assert back.out == Path("/out")


def test_each_option_is_defined_once_and_taken_by_name():
    p = argparse.ArgumentParser()
    gate_options.add_arguments(p, ("profile", "nodes"), required=("nodes",), help={"nodes": "the job's nodes"})
    a = p.parse_args(["--nodes", "2"])
    assert (a.profile, a.nodes) == (None, 2)
    with pytest.raises(SystemExit):
        p.parse_args([])  # --nodes required here
    text = p.format_help()
    assert "the job's nodes" in text and gate_options.PROFILE_RULE.split(" (")[0] in text
    assert set(gate_options.RUN_OPTIONS) - {"container"} | set(gate_options.LAUNCH_OPTIONS) == set(gate_options.OPTIONS)
    assert not set(gate_options.RUN_OPTIONS) & set(gate_options.LAUNCH_OPTIONS)


def _modules():
    for p in sorted(SRC.rglob("*.py")):
        yield p, ast.parse(p.read_text())


def test_no_kind_branch_and_no_spec_probe_outside_the_gate_classes():
    """A kind string is shown, never branched on (`g.kind == "serving"`); a spec's fields are the gate class's to
    read (no `getattr(spec, ...)` / `getattr(prof, ...)` probes elsewhere)."""
    bad = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Attribute) and side.attr == "kind" and isinstance(side.value, ast.Name):
                        if side.value.id in ("g", "gate", "self") and path.parent.name in ("gates", "cluster", "bump"):
                            bad.append(f"{path.relative_to(SRC)}:{node.lineno}: branches on {side.value.id}.kind")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Name) and first.id in ("spec", "prof", "profile"):
                    if not (path.parent.name == "gates" and path.name in KIND_MODULES):
                        bad.append(f"{path.relative_to(SRC)}:{node.lineno}: getattr({first.id}, ...)")
    assert bad == []


def test_the_stages_stay_short():
    long = []
    for path in sorted((SRC / "gates").glob("*.py")):
        if path.name not in STAGE_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append(f"gates/{path.name}:{node.lineno}: {node.name} is {n} lines")
    assert long == []


def test_profile_is_defined_once_for_every_command():
    """`--profile` (and every other gate option) comes from gates.options: no command adds its own."""
    bad = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args:
                first = node.args[0]
                flags = {f"--{k.replace('_', '-')}" for k in gate_options.OPTIONS} | {"--arm", "--var", "--server-arg"}
                # kernels/jitimage.py runs inside an image build from a copy of a few modules (jitimage.MODULES,
                # no gates/): its `--arch` and `--jobs` cannot come from gates.options
                own = path.name == "options.py" or (path.name == "jitimage.py" and first.value in ("--arch", "--jobs"))
                if isinstance(first, ast.Constant) and first.value in flags and not own:
                    bad.append(f"{path.relative_to(SRC)}:{node.lineno}: {first.value}")
    allowed = {"--out", "--image", "--timeout", "--json"}  # meanings that differ per command (manifests, waits)
    assert [b for b in bad if b.rsplit(": ", 1)[1] not in allowed] == []


@pytest.mark.parametrize("name", registry.GATE_ORDER)
def test_every_kind_takes_the_one_profile_rule(name):
    """gates.profiles is the one rule for every kind: no Gate class chooses profiles its own way; a host shaped like
    a GPU profile fits a profile of its shape and hardware; a profile that needs no GPU (local-test) is taken by name
    only; a host no profile fits is the kind's own `no_fit` line (data, never a second rule)."""
    g = registry.gate(name)
    assert not {"choose_profile", "resolve_profile", "published_profile", "hardware_gap"} & set(vars(type(g)))
    spec = g.spec_for(REPO, LOCK)
    for prof in spec.profiles.values():
        gpus = [{"name": f"NVIDIA {prof.gpu_model or 'H200'}"}] * prof.gpus_per_node
        host = {"gpu_count": prof.gpus_per_node, "gpus": gpus, "efa_devices": [{"name": "rdmap0"}] * prof.needs_efa}
        if not prof.needs_gpu:  # taken by name only: this host fits another profile, or none (a SKIP)
            with contextlib.suppress(NoProfileForHost):
                assert profiles.resolve(spec, None, host, g.no_fit) is not prof
            continue
        fit = profiles.resolve(spec, None, host, g.no_fit)
        assert profiles.hardware_mismatch(fit, host) is None and profiles.hardware_gap(fit, host) is None, prof.name
    with pytest.raises(NoProfileForHost) as e:
        profiles.resolve(spec, None, {"gpu_count": 3}, g.no_fit)
    known = ", ".join(spec.profiles)
    assert str(e.value) == g.no_fit.format(path=spec.path, name=spec.path.name, gpus=3, efa=False, known=known)
