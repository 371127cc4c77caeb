"""Serving gate specs: `gates/<engine>.yaml` of kind `serving` (schemas/serving.schema.json), file:line errors.

Templates: every server argv element, env value and the profile's tokenizer may use `${name}` (string.Template).
Known names at run time: model, served_model, port, leader_addr, rpc_port, nodes, node_rank, gpus_per_node, ep,
python, run_dir, arm, root (the project folder), plus the spec's `vars`, the profile's `vars`, the arm's `vars` and `--var K=V` (later wins).
An unknown `${name}` is an error naming the file and line, raised before anything runs.
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GateError
from .parsers.servelog import Requirement
from .spec import GateSpecError, read_gate_yaml

RUNTIME_VARS = (
    "model",
    "served_model",
    "port",
    "leader_addr",
    "rpc_port",
    "nodes",
    "node_rank",
    "gpus_per_node",
    "ep",
    "python",
    "run_dir",
    "arm",
    "root",
)


@dataclass(frozen=True)
class Cell:
    """One AIPerf sweep cell: `name` (e.g. c4), `concurrency` (in-flight requests), `requests` (count)."""

    name: str
    concurrency: int
    requests: int


@dataclass(frozen=True)
class Arm:
    """A server variant: role `deepep` (the measured path, backend asserted, bars apply) or `alternative`
    (the engine's dense/allgather path, for the DeepEP/alternative ratio)."""

    name: str
    role: str
    assert_backend: bool
    vars: dict
    env: dict
    description: str = ""


@dataclass(frozen=True)
class Bars:
    """Throughput bars: agg output tok/s of cell >= published[cell] x (1 - tolerance), on arm `arm`."""

    tolerance: float
    why: str
    source: str
    published: dict
    arm: str | None = None

    def threshold(self, cell: str) -> float | None:
        """The bar for `cell` in tokens/sec (None when no figure is published for it), rounded to 1e-6."""
        v = self.published.get(cell)
        return None if v is None else round(v * (1 - self.tolerance), 6)


@dataclass(frozen=True)
class ServingProfile:
    name: str
    nodes: int
    gpus_per_node: int
    needs_efa: bool
    needs_gpu: bool
    env: dict
    vars: dict
    server: dict | None
    tokenizer: str | None
    aiperf_args: tuple
    requests: dict
    bars: Bars
    description: str = ""

    @property
    def ep_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ServingSpec:
    gate: str
    path: Path
    sha256: str
    model: str
    served_model: str
    requires: tuple
    engine: dict
    timeout_s: float
    elastic_buffer: dict
    vars: dict
    server: dict
    probe: dict
    aiperf: dict
    cells: tuple
    required: tuple
    forbidden: tuple
    arms: dict
    profiles: dict
    lines: dict = field(default_factory=dict, repr=False)
    description: str = ""
    image: str = ""  # the recipe under containers/ the gate runs in
    kernels: tuple = ()  # kernels/<c>.yaml the engine's DeepEP path uses (a bump of their pins reruns the gate)

    def profile(self, name: str) -> ServingProfile:
        """The named profile; GateError naming the known ones."""
        if name not in self.profiles:
            raise GateError(f"{self.path}: no profile {name!r} (known: {', '.join(sorted(self.profiles))})")
        return self.profiles[name]

    def cells_for(self, profile: ServingProfile) -> list[Cell]:
        """The sweep cells with the profile's request counts applied."""
        return [Cell(c.name, c.concurrency, profile.requests.get(c.name, c.requests)) for c in self.cells]


def _template_names(value: str) -> set[str]:
    return {
        m.group("named") or m.group("braced")
        for m in string.Template.pattern.finditer(value)
        if m.group("named") or m.group("braced")
    }


def _check_templates(data: dict, lines: dict, path: str) -> None:
    known = set(RUNTIME_VARS) | set(data.get("vars", {}))
    for p in data["profiles"].values():
        known |= set(p.get("vars", {}))
    for a in data["arms"].values():
        known |= set(a.get("vars", {}))

    def walk(node, where):
        if isinstance(node, str):
            bad = sorted(_template_names(node) - known)
            if bad:
                raise GateSpecError(
                    path,
                    _line(lines, where),
                    _dotted(where),
                    f"unknown template variable ${{{bad[0]}}} (known: {', '.join(sorted(known))})",
                )
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, where + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, where + (i,))

    for key in ("server", "vars"):
        walk(data.get(key, {}), (key,))
    for name, p in data["profiles"].items():
        for key in ("server", "env", "vars", "tokenizer"):
            if key in p:
                walk(p[key], ("profiles", name, key))
    for name, a in data["arms"].items():
        walk(a.get("env", {}), ("arms", name, "env"))


def _line(lines: dict, p: tuple) -> int | None:
    while p and p not in lines:
        p = p[:-1]
    return lines.get(p)


def _dotted(p: tuple) -> str:
    return ".".join(str(x) for x in p)


def load_serving_spec(root: Path, gate: str) -> ServingSpec:
    """Load and validate `<root>/gates/<gate>.yaml` (kind serving).

    Raises GateSpecError (`FILE:LINE: field: problem`) for YAML/schema errors, a gate name that differs from the
    file name, a regex that does not compile, an unknown `${var}`, a bar for a cell the sweep does not have,
    duplicate cell names, or a bars.arm that is not an arm; nothing is run or written then.
    """
    path, raw, data, lines = read_gate_yaml(root, gate, "serving.schema.json")
    sp = str(path)
    reqs = {}
    for kind in ("required", "forbidden"):
        out = []
        for i, item in enumerate(data["backend-assertion"].get(kind, [])):
            try:
                re.compile(item["pattern"])
            except re.error as e:
                raise GateSpecError(
                    sp,
                    _line(lines, ("backend-assertion", kind, i, "pattern")),
                    f"backend-assertion.{kind}[{i}].pattern",
                    f"not a regex: {e}",
                ) from None
            out.append(Requirement(item["name"], item["pattern"], item.get("scope", "all"), item["source"]))
        reqs[kind] = tuple(out)
    cells = tuple(Cell(c["name"], c["concurrency"], c["requests"]) for c in data["aiperf"]["cells"])
    names = [c.name for c in cells]
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise GateSpecError(
                sp, _line(lines, ("aiperf", "cells", i, "name")), f"aiperf.cells[{i}].name", f"duplicate cell {n!r}"
            )
    _check_templates(data, lines, sp)
    arms = {
        n: Arm(
            n,
            a["role"],
            a.get("assert-backend", a["role"] == "deepep"),
            dict(a.get("vars", {})),
            dict(a.get("env", {})),
            a.get("description", ""),
        )
        for n, a in data["arms"].items()
    }
    if sum(a.role == "deepep" for a in arms.values()) != 1:
        raise GateSpecError(sp, _line(lines, ("arms",)), "arms", "exactly one arm must have role: deepep")
    profiles = {}
    for name, p in data["profiles"].items():
        b = p["bars"]
        where = ("profiles", name, "bars")
        for cell in b["published"]:
            if cell not in names:
                raise GateSpecError(
                    sp,
                    _line(lines, where + ("published", cell)),
                    f"{_dotted(where)}.published.{cell}",
                    f"no such cell (cells: {', '.join(names)})",
                )
        for cell in p.get("requests", {}):
            if cell not in names:
                raise GateSpecError(
                    sp,
                    _line(lines, ("profiles", name, "requests", cell)),
                    f"profiles.{name}.requests.{cell}",
                    f"no such cell (cells: {', '.join(names)})",
                )
        arm = b.get("arm")
        if arm is not None and arm not in arms:
            raise GateSpecError(
                sp, _line(lines, where + ("arm",)), f"{_dotted(where)}.arm", f"no such arm (arms: {', '.join(arms)})"
            )
        profiles[name] = ServingProfile(
            name=name,
            nodes=p["nodes"],
            gpus_per_node=p["gpus-per-node"],
            needs_efa=p.get("needs-efa", False),
            needs_gpu=p.get("needs-gpu", True),
            env=dict(p.get("env", {})),
            vars=dict(p.get("vars", {})),
            server=p.get("server"),
            tokenizer=p.get("tokenizer"),
            aiperf_args=tuple(p.get("aiperf-args", ())),
            requests=dict(p.get("requests", {})),
            bars=Bars(b["tolerance"], b["tolerance-why"], b["source"], dict(b["published"]), arm),
            description=p.get("description", ""),
        )
    return ServingSpec(
        gate=gate,
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        model=data["model"],
        served_model=data.get("served-model", data["model"]),
        requires=tuple(data.get("requires", ())),
        engine=dict(data.get("engine", {})),
        timeout_s=float(data.get("timeout-s", 3600)),
        elastic_buffer=dict(data.get("elastic-buffer", {})),
        vars=dict(data.get("vars", {})),
        server=data["server"],
        probe=dict(data["probe"]),
        aiperf=dict(data["aiperf"]),
        cells=cells,
        required=reqs["required"],
        forbidden=reqs["forbidden"],
        arms=arms,
        profiles=profiles,
        lines=lines,
        description=data.get("description", ""),
        image=data["image"],
        kernels=tuple(data.get("kernels", ())),
    )


def render(value: str, variables: dict, where: str = "") -> str:
    """Substitute `${name}` in `value`; GateError naming `where` for a name with no value."""
    try:
        return string.Template(value).substitute(variables)
    except KeyError as e:
        raise GateError(f"{where}: no value for template variable ${{{e.args[0]}}}") from None
    except ValueError as e:
        raise GateError(f"{where}: bad template {value!r}: {e}") from None
