"""What a new revision of an upstream invalidates: the kernels built from it (and those that need them), the
gates that run those kernels, the images whose recipes copy its source. Read from the project's own files
(`kernels/*.yaml` source/needs, `gates/*.yaml` kernels, `containers/*/image.yaml` source/sources). Gate specs are
read through gates.registry, each with its own gate's schema."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import LocatedError, ReprostackError
from ..gates import registry
from ..kernels.recipe import load_recipe
from ..yamlsrc import load as load_yaml


@dataclass(frozen=True)
class Impact:
    """Sorted names: kernels to rebuild, gates to re-run, images to rebuild (each empty when none)."""

    kernels: tuple[str, ...]
    gates: tuple[str, ...]
    images: tuple[str, ...]


def impact(root: Path, upstream: str) -> Impact:
    """The kernels, gates and images of the project at `root` that depend on pin `upstream`.

    Raises ReprostackError (a BuildError / GateSpecError naming the file) for a recipe or spec that does not load.
    """
    root = Path(root)
    recipes = {p.stem: load_recipe(root, p.stem) for p in sorted((root / "kernels").glob("*.yaml"))}
    kernels = {n for n, r in recipes.items() if r.source == upstream}
    grown = True
    while grown:  # a kernel built against an affected kernel is affected too
        more = {n for n, r in recipes.items() if set(r.needs) & kernels} - kernels
        kernels |= more
        grown = bool(more)
    specs = registry.load_all(root)  # each spec through its own gate's schema (gates.registry)
    gates = sorted(
        registry.gate(n).stem for n, spec in specs.items() if set(registry.gate(n).kernels.rebuilt_by(spec)) & kernels
    )
    images, parents = [], {}
    for p in sorted((root / "containers").glob("*/image.yaml")):
        d = load_yaml(p, LocatedError)[0]
        if not isinstance(d, dict):
            raise ReprostackError(f"{p}: a recipe is a mapping")
        sources = d.get("sources") if isinstance(d.get("sources"), list) else ()
        used = {d.get("source")} | {s.get("upstream") for s in sources if isinstance(s, dict)}
        if upstream in used:
            images.append(p.parent.name)
        if isinstance(d.get("parent"), str):
            parents[p.parent.name] = d["parent"]
    grown = True
    while grown:  # an image built FROM an affected image (vllm on deepep) is rebuilt too
        more = sorted(n for n, par in parents.items() if par in images and n not in images)
        images += more
        grown = bool(more)
    return Impact(tuple(sorted(kernels)), tuple(gates), tuple(sorted(images)))
