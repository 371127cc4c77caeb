"""What `build` checks before it needs a Docker engine (containers.engine's preflight): the recipes and their
parents load, their bases are pinned or overridden, nothing in the chain is `unresolved`, and every wheel a context
will hold is in the cache with the lock's sha256.

Invariants:
- nothing here talks to an engine or builds: a problem is one RecipeError (or the fetch layer's error for a wheel)
  naming the file and line, before any image of the chain is built;
- a recipe or wheel pin marked `unresolved:` stops the whole chain (never a partial build of it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ..fetch.wheels import fetch_wheels
from ..lock import Lock, WheelPin, WheelsetPin
from .errors import RecipeError
from .recipe import Recipe, build_order, check_bases, load_all, resolve_lock_bases


def unresolved_line(lock: Lock, name: str) -> str | None:
    """`unresolved pin NAME VERSION (sha256 not in the lock: run ...)` for a wheel/wheelset pin the lock marks
    `unresolved:`, else None."""
    pin = lock.upstreams.get(name)
    if not isinstance(pin, (WheelPin, WheelsetPin)) or not pin.unresolved:
        return None
    return (
        f"unresolved pin {pin.describe()} (sha256 not in the lock: run `reprostack lock wheels {name}` "
        f"{pin.unresolved})"
    )


def check_resolved(recipes: Mapping[str, Recipe], order: Sequence[str], lock: Lock) -> None:
    """Before any engine work: no image of `order` is a recipe marked `unresolved:` or installs a wheel pin the lock
    marks `unresolved:`. Raises RecipeError naming the recipe line (never a partial build of that chain)."""
    for n in order:
        r = recipes[n]
        if r.unresolved:
            raise RecipeError(
                r.path, r.line("unresolved"), "unresolved", f"image {n} cannot be built yet: {r.unresolved}"
            )
        for i, w in enumerate(r.wheels):
            line = unresolved_line(lock, w.pin)
            if line:
                raise RecipeError(r.path, w.line, f"wheels[{i}].pin", line)


def verify_wheels(
    recipes: Mapping[str, Recipe],
    order: Sequence[str],
    lock: Lock,
    *,
    cache_root: Path | None,
    wheelhouses: Sequence[Path] = (),
    offline: bool = False,
) -> int:
    """Before any engine work: every wheel the images of `order` put into a context (`wheels:`), in the cache and
    sha256-checked against the lock (fetch.wheels: cache, wheelhouses, then pip unless offline), so a wrong or
    missing wheel stops the build in one line before the engine is asked and before any image of the chain is
    built. The context step checks the same bytes again as it writes them. Returns the number of wheels."""
    n = 0
    for name in order:
        for w in recipes[name].wheels:
            n += len(fetch_wheels(lock, w.pin, cache_root=cache_root, wheelhouses=wheelhouses, offline=offline))
    return n


def preflight(
    names: Sequence[str] | None, root: Path, lock: Lock, overrides: Mapping[str, str]
) -> tuple[dict[str, Recipe], list[str]]:
    """Everything `build` checks before it needs an engine: the recipes of `names` (default: all) and their parents
    load, their `lock:` bases are image pins with digests, every registry base is pinned or overridden, and nothing
    in the chain is unresolved. Returns (recipes, build order); raises RecipeError naming the file and line."""
    recipes = resolve_lock_bases(load_all(root, list(names) if names else None), lock)
    order = build_order(recipes, list(names) if names else list(recipes))
    check_bases({n: recipes[n] for n in order}, overrides)
    check_resolved(recipes, order, lock)
    return recipes, order
