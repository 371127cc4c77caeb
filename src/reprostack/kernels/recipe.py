"""Kernel build recipes: `kernels/<component>.yaml`, validated, with `{arch}` placeholders.

A recipe enters the build key by its content (`Recipe.digest`: sha256 of the parsed mapping as canonical
JSON), not its bytes: a comment or layout edit rebuilds nothing, a changed value rebuilds what depends on it.
Read through yamlsrc (bounded, file:line errors) and validated by schemas/kernel.schema.json."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BuildError, LocatedError
from ..yamlsrc import load as load_yaml
from ..yamlsrc import validate
from .. import schemas

_KEYS = {"component", "source", "needs", "make", "env", "nccl-floor", "wheel"}


class RecipeError(LocatedError, BuildError):
    """A kernel recipe is malformed: `FILE:LINE: field: problem`."""

    def __init__(self, path: str, line: int | None, field: str, message: str):
        super().__init__(path, line, field, message)
        if field in ("(yaml)", "(file)"):  # `FILE[:LINE]: cannot read recipe: why`
            self.args = ((f"{path}:{line}" if line else str(path)) + f": cannot read recipe: {message}",)


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
    wheel: str | None = None  # a `kind: wheel` pin that may stand in for the source build (kernels.ncclwheel)
    digest: str = ""


def has_recipe(root: Path, component: str) -> bool:
    """Whether `component` is a kernel this checkout builds: `<root>/kernels/<component>.yaml` exists."""
    return (Path(root) / "kernels" / f"{component}.yaml").is_file()


def load_recipe(root: Path, component: str) -> Recipe:
    """Read `<root>/kernels/<component>.yaml`. Raises BuildError naming the file and the bad key."""
    path = Path(root) / "kernels" / f"{component}.yaml"
    d, lines = load_yaml(path, RecipeError)
    text = path.read_text(encoding="utf-8")
    if not isinstance(d, dict):
        raise BuildError(f"{path}: a recipe is a mapping")
    unknown = set(d) - _KEYS
    if unknown:
        raise BuildError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    for k in ("component", "source"):
        if not isinstance(d.get(k), str):
            raise BuildError(f"{path}: `{k}` (a string) is required")
    schema = schemas.load("kernel")
    validate(d, lines, schema, str(path), RecipeError)
    if d["component"] != component:
        raise BuildError(f"{path}: component is {d['component']!r}, file name says {component!r}")
    make = d.get("make") or {}
    return Recipe(
        component=component,
        source=d["source"],
        path=path,
        text=text,
        needs=tuple(d.get("needs") or ()),
        make_targets=tuple(make.get("targets") or ()),
        make_vars=dict(make.get("vars") or {}),
        env={k: str(v) for k, v in (d.get("env") or {}).items()},
        nccl_floor=d.get("nccl-floor"),
        wheel=d.get("wheel"),
        digest=hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest(),
    )


def render(value: str, arch: str) -> str:
    """Fill `{arch}` (e.g. "90") and `{arch_dotted}` (e.g. "9.0") in a recipe value."""
    return value.format(arch=arch, arch_dotted=f"{arch[:-1]}.{arch[-1]}")
