"""Kernel build recipes: `kernels/<component>.yaml`, validated, with `{arch}` placeholders.

A recipe enters the build key by its content (`Recipe.digest`: sha256 of the parsed mapping as canonical
JSON), not its bytes: a comment or layout edit rebuilds nothing, a changed value rebuilds what depends on it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import BuildError

_KEYS = {"component", "source", "needs", "make", "env", "nccl-floor"}


@dataclass(frozen=True)
class Recipe:
    """One component's recipe. `digest` (its parsed content, see the module doc) is part of the build key."""

    component: str
    source: str
    path: Path
    text: str
    needs: tuple[str, ...] = ()
    make_targets: tuple[str, ...] = ()
    make_vars: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    nccl_floor: str | None = None
    digest: str = ""


def load_recipe(root: Path, component: str) -> Recipe:
    """Read `<root>/kernels/<component>.yaml`. Raises BuildError naming the file and the bad key."""
    path = Path(root) / "kernels" / f"{component}.yaml"
    try:
        text = path.read_text()
        d = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as e:
        raise BuildError(f"{path}: cannot read recipe: {e}") from None
    if not isinstance(d, dict):
        raise BuildError(f"{path}: a recipe is a mapping")
    unknown = set(d) - _KEYS
    if unknown:
        raise BuildError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    for k in ("component", "source"):
        if not isinstance(d.get(k), str):
            raise BuildError(f"{path}: `{k}` (a string) is required")
    if d["component"] != component:
        raise BuildError(f"{path}: component is {d['component']!r}, file name says {component!r}")
    make = d.get("make") or {}
    return Recipe(component=component, source=d["source"], path=path, text=text,
                  needs=tuple(d.get("needs") or ()), make_targets=tuple(make.get("targets") or ()),
                  make_vars=dict(make.get("vars") or {}), env={k: str(v) for k, v in (d.get("env") or {}).items()},
                  nccl_floor=d.get("nccl-floor"),
                  digest=hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest())


def render(value: str, arch: str) -> str:
    """Fill `{arch}` (e.g. "90") and `{arch_dotted}` (e.g. "9.0") in a recipe value."""
    return value.format(arch=arch, arch_dotted=f"{arch[:-1]}.{arch[-1]}")
