"""Pins tied to a bumped git pin: the same upstream's release as a wheel, left behind when only the git pin moves.

A `kind: wheel` pin is tied to git pin P when a kernel recipe built from P names it as its stand-in (`wheel: W` in
kernels/<c>.yaml, source P: kernels.ncclwheel) and its version is P's release (P's `original` vX.Y.Z-N, fetched from
that tag). A wheelset is tied through it when its `requirements` or `overrides` pin that wheel's distribution at the
same version (`nvidia-nccl-cu13==2.30.4`). `bump nccl` moves only the git pin; these stay behind, and while they do the
gates lose the wheel's fast path (NCCL built from source, 3-4 min). The bump names each with the command that follows.

Invariants:
- read from the project's own files only (the lock, kernels/*.yaml), no network;
- a pin is reported only when it was tied before the bump (same version) and the new release differs;
- nothing is edited here: a wheel's files need `reprostack lock wheels` (pip, sha256) to move.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .. import lock as lockmod
from ..kernels.ncclwheel import release_of
from ..kernels.recipe import load_recipe


@dataclass(frozen=True)
class LeftBehind:
    """A pin tied to the bumped one that stays where it was: `pin` (the lock name), `what` it pins, `why` tied and
    what staying costs, `follow`: the command that moves it."""

    pin: str
    what: str
    why: str
    follow: str

    def line(self) -> str:
        return f"left behind: {self.pin} ({self.what}): {self.why}; follow with: {self.follow}"


def left_behind(root: Path, lock: lockmod.Lock, old: lockmod.GitPin, new: lockmod.GitPin) -> list[LeftBehind]:
    """The pins tied to git pin `old` (see the module doc) that a move to `new` leaves behind."""
    was, now = release_of(old), release_of(new)
    if was is None or now == was:
        return []
    out: list[LeftBehind] = []
    for path in sorted((Path(root) / "kernels").glob("*.yaml")):
        recipe = load_recipe(root, path.stem)
        w = lock.upstreams.get(recipe.wheel or "")
        if recipe.source != old.name or not isinstance(w, lockmod.WheelPin) or w.version != was:
            continue
        cost = f"until it moves the gates build {old.name} from source instead of unpacking the wheel"
        if now is None:
            why = (
                f"the wheel of {old.name}'s release {was} (kernels/{path.name}: wheel: {recipe.wheel}); the new rev "
                f"is no release tag, so no wheel of it exists and the gates build {old.name} from source"
            )
            follow = f"nothing to move until {old.name} is pinned at a release tag again"
        else:
            why = f"the wheel of {old.name}'s release {was} (kernels/{path.name}: wheel: {recipe.wheel}), now {now}: {cost}"
            follow = f'set upstreams.{recipe.wheel}.version to "{now}", then `reprostack lock wheels {recipe.wheel}`'
        out.append(LeftBehind(recipe.wheel, f"{w.name} {w.version}", why, follow))
        pinned = re.compile(rf"^{re.escape(w.name)}\s*==\s*{re.escape(was)}$", re.I)
        for name, s in lock.upstreams.items():
            if not isinstance(s, lockmod.WheelsetPin):
                continue
            for field, reqs in (("overrides", s.overrides), ("requirements", s.requirements)):
                hit = next((r for r in reqs if pinned.match(r.strip())), None)
                if hit is None:
                    continue
                out.append(
                    LeftBehind(
                        name,
                        f"{field}: {hit}",
                        f"pins {w.name} at {old.name}'s old release {was}, like {recipe.wheel}",
                        (
                            f"set {w.name}=={now} in upstreams.{name}.{field}, then `reprostack lock wheels {name}`"
                            if now
                            else f"keep it with {recipe.wheel} (no wheel of the new rev exists)"
                        ),
                    )
                )
    return out
