"""Serving gate specs: `gates/<engine>.yaml` of kind `serving` (schemas/serving.schema.json), file:line errors.

Templates: every server argv element, env value and the profile's tokenizer may use `${name}` (string.Template).
Known names at run time: model, served_model, port, leader_addr, rpc_port, nodes, node_rank, gpus_per_node, ep,
python, run_dir, arm, root (the project folder), plus the spec's `vars`, the profile's `vars`, the arm's `vars` and `--var K=V` (later wins).
An unknown `${name}` is an error naming the file and line, raised before anything runs.

A profile may replace what the published contract fixes (issue 28: a small model on one GPU): `model` / `served-model`
(templated: `${root}/...`), the sweep `cells`, the `backend-assertion` (with a `note` saying why it differs),
`bars-status: unmeasured` (no `bars`: every number is reported and the gate never passes, gates.base.verdict),
`requires-modules` (Python modules the server's interpreter must import, else SKIP naming them), `engaged`: per arm,
the lines the engine prints when it really uses the arm's backend; an arm whose ready server has not printed them is
SKIP with `why` and the engine's own words matched by `quote` (gates.serving), and `skip-arms`: an arm that cannot be
what it claims on this profile from pinned bytes (never launched; SKIP with that reason).

Invariants: every regex of the spec compiles (checked at load, file:line); every cell, arm and template name a profile
uses exists; a profile without `bars` is unmeasured.
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
class Engaged:
    """What shows that the engine used an arm's backend: `lines` (scope any: one process prints them), `quote`
    (regexes of the engine's own lines to quote when it did not), `why` (the engine source that explains it)."""

    lines: tuple
    quote: tuple
    why: str


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
    model: str | None = None  # a template (`${root}/...`); None: the spec's
    served_model: str | None = None
    cells: tuple | None = None  # None: the spec's
    bars_status: str = "measured"
    bars_status_why: str = ""  # why a profile is unmeasured (`bars-status-why`), shown in the verdict
    required: tuple | None = None  # the profile's backend assertion (None: the spec's)
    forbidden: tuple | None = None
    assertion_note: str = ""
    requires_modules: tuple = ()
    engaged: dict = field(default_factory=dict)  # arm name -> Engaged
    skip_arms: dict = field(default_factory=dict)  # arm name -> why it cannot run on this profile (never launched)
    gpu_model: str | None = None  # no serving profile names one yet: the model is not checked (gates.profiles)

    @property
    def ep_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def measured(self) -> bool:
        """True unless the yaml says `bars-status: unmeasured` (then the gate never passes, gates.base.verdict)."""
        return self.bars_status == "measured"


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
    profiles: dict[str, ServingProfile]
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
        """The sweep cells (the profile's, else the spec's) with the profile's request counts applied."""
        cells = self.cells if profile.cells is None else profile.cells
        return [Cell(c.name, c.concurrency, profile.requests.get(c.name, c.requests)) for c in cells]

    def assertion(self, profile: ServingProfile) -> tuple[tuple, tuple, str]:
        """(required, forbidden, note) of the backend assertion on `profile`: its own, else the spec's."""
        if profile.required is None:
            return self.required, self.forbidden, ""
        return profile.required, profile.forbidden, profile.assertion_note


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
        for key in ("server", "env", "vars", "tokenizer", "model", "served-model"):
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


def _field(p: tuple) -> str:
    """`a.b[1].c`: a field path as the errors name it (list indices in brackets)."""
    out = ""
    for x in p:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def load_serving_spec(root: Path, gate: str) -> ServingSpec:
    """Load and validate `<root>/gates/<gate>.yaml` (kind serving).

    Raises GateSpecError (`FILE:LINE: field: problem`) for YAML/schema errors, a gate name that differs from the
    file name, a regex that does not compile, an unknown `${var}`, a bar for a cell the sweep does not have,
    duplicate cell names, a bars.arm or engaged arm that is not an arm, or bars on an unmeasured profile; nothing is
    run or written then.
    """
    path, raw, data, lines = read_gate_yaml(root, gate, "serving.schema.json")
    sp = str(path)
    reqs = _assertion(data["backend-assertion"], ("backend-assertion",), lines, sp)
    cells = _cells(data["aiperf"]["cells"], ("aiperf", "cells"), lines, sp)
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
    profiles = {name: _profile(name, p, cells, arms, lines, sp) for name, p in data["profiles"].items()}
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


def _profile(name: str, p: dict, cells: tuple, arms: dict, lines: dict, sp: str) -> ServingProfile:
    """One profile of the spec, validated against the spec's cells and arms (GateSpecError naming the line)."""
    at = ("profiles", name)
    pcells = _cells(p["cells"], at + ("cells",), lines, sp) if "cells" in p else None
    names = [c.name for c in (pcells or cells)]
    unmeasured = p.get("bars-status") == "unmeasured"
    b = p.get("bars") or {"tolerance": 0.0, "tolerance-why": "", "source": "", "published": {}}
    if unmeasured and b["published"]:
        raise GateSpecError(
            sp,
            _line(lines, at + ("bars",)),
            f"profiles.{name}.bars",
            "a profile with bars-status: unmeasured has no published bars",
        )
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
    preq = (
        _assertion(p["backend-assertion"], at + ("backend-assertion",), lines, sp) if "backend-assertion" in p else {}
    )
    return ServingProfile(
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
        model=p.get("model"),
        served_model=p.get("served-model"),
        cells=pcells,
        bars_status="unmeasured" if unmeasured else "measured",
        bars_status_why=p.get("bars-status-why", ""),
        required=preq.get("required"),
        forbidden=preq.get("forbidden"),
        assertion_note=(p.get("backend-assertion") or {}).get("note", ""),
        requires_modules=tuple(p.get("requires-modules", ())),
        engaged=_engaged(p.get("engaged", {}), arms, at + ("engaged",), lines, sp),
        skip_arms=_skip_arms(p.get("skip-arms", {}), arms, at + ("skip-arms",), lines, sp),
    )


def _regex(pattern: str, at: tuple, lines: dict, sp: str) -> None:
    try:
        re.compile(pattern)
    except re.error as e:
        raise GateSpecError(sp, _line(lines, at), _field(at), f"not a regex: {e}") from None


def _assertion(block: dict, at: tuple, lines: dict, sp: str) -> dict:
    """{"required": (Requirement, ...), "forbidden": (...)} of a backend-assertion block; regexes checked."""
    out = {}
    for kind in ("required", "forbidden"):
        items = []
        for i, item in enumerate(block.get(kind, [])):
            _regex(item["pattern"], at + (kind, i, "pattern"), lines, sp)
            items.append(Requirement(item["name"], item["pattern"], item.get("scope", "all"), item["source"]))
        out[kind] = tuple(items)
    return out


def _cells(items: list, at: tuple, lines: dict, sp: str) -> tuple:
    cells = tuple(Cell(c["name"], c["concurrency"], c["requests"]) for c in items)
    names = [c.name for c in cells]
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise GateSpecError(sp, _line(lines, at + (i, "name")), _field(at + (i, "name")), f"duplicate cell {n!r}")
    return cells


def _engaged(block: dict, arms: dict, at: tuple, lines: dict, sp: str) -> dict:
    out = {}
    for arm, e in block.items():
        if arm not in arms:
            raise GateSpecError(
                sp, _line(lines, at + (arm,)), f"{_dotted(at)}.{arm}", f"no such arm (arms: {', '.join(arms)})"
            )
        reqs = []
        for i, item in enumerate(e["lines"]):
            _regex(item["pattern"], at + (arm, "lines", i, "pattern"), lines, sp)
            reqs.append(Requirement(item["name"], item["pattern"], "any", item["source"]))
        for i, q in enumerate(e.get("quote", ())):
            _regex(q, at + (arm, "quote", i), lines, sp)
        out[arm] = Engaged(tuple(reqs), tuple(e.get("quote", ())), e["why"])
    return out


def _skip_arms(block: dict, arms: dict, at: tuple, lines: dict, sp: str) -> dict:
    for arm in block:
        if arm not in arms:
            raise GateSpecError(
                sp, _line(lines, at + (arm,)), f"{_dotted(at)}.{arm}", f"no such arm (arms: {', '.join(arms)})"
            )
    return {arm: " ".join(why.split()) for arm, why in block.items()}


def render(value: str, variables: dict, where: str = "") -> str:
    """Substitute `${name}` in `value`; GateError naming `where` for a name with no value."""
    try:
        return string.Template(value).substitute(variables)
    except KeyError as e:
        raise GateError(f"{where}: no value for template variable ${{{e.args[0]}}}") from None
    except ValueError as e:
        raise GateError(f"{where}: bad template {value!r}: {e}") from None
