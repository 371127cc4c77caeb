"""What a gate kind does with the kernels its spec names (`Gate.kernels`, one `KernelUse` per kind, declared as data):
which it takes prebuilt from its image in container mode, which make it re-run when bumped, and the plan's line
saying where they come from.

- `prebuilt(spec)`: the kernels container mode takes from the image's kernels manifest (`--kernels-manifest`; asked
  by gates.container, gates.runner, cluster.slurm, cluster.k8s); () for a kind that builds nothing there or whose
  engine brings its own;
- `rebuilt_by(spec)`: the kernels (kernels/<c>.yaml) whose new revision re-runs the gate (bump.impact);
- `line(spec, lock, image, mode)`: where the plan's kernels come from, for a person (gates.plan; "" when none).

Invariants: pure (nothing is read or built); a kind differs only by the data it declares (`takes_prebuilt`, its
`describe` function), never by a kind string; `prebuilt(spec)` is a subset of `spec.kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..launch.plan import MODE_CONTAINER

if TYPE_CHECKING:
    from ..launch.plan import ImageRef
    from ..lock import Lock
    from .spec import Spec

# (spec, lock, image, mode) -> the plan's kernels line
Describe = Callable[[Any, "Lock", "ImageRef | None", str], str]


def no_line(spec: Any, lock: Lock, image: ImageRef | None, mode: str) -> str:
    """A kind that builds no kernels: no line."""
    return ""


def kernel_pins(spec: Spec, lock: Lock, pins: tuple[str, ...]) -> list[str]:
    """`pin rev12 patched tree tree12` (or `pin from wheel W (file sha256 ...)` for a stack's wheel NCCL) of each
    of `pins` that the lock has."""
    from ..kernels import ncclwheel
    from ..lock import WheelPin

    out = []
    for n in pins:
        pin = lock.upstreams.get(n)
        if pin is not None and getattr(pin, "rev", None):
            out.append(f"{n} {pin.rev[:12]} patched tree {(pin.patched_tree or pin.tree)[:12]}")
        elif isinstance(pin, WheelPin):  # the stack's NCCL is a wheel alone (kernels.ncclwheel)
            out.append(
                f"{n} from wheel {ncclwheel.wheel_alone(lock, n)} "
                f"({', '.join(f'{f.filename} sha256 {f.sha256[:12]}' for f in pin.files)})"
            )
    return out


def built_kernels_line(spec: Spec, lock: Lock, image: ImageRef | None, mode: str, *, pins: tuple[str, ...]) -> str:
    """Where a gate that builds kernels gets them (`pins`: its sources and kernels): prebuilt in its image
    (container mode; the manifest the in-image runner checks against these pins before anything runs) or built on
    the host (host mode)."""
    from ..kernels.prebuilt import MANIFEST

    if not spec.kernels:
        return ""
    words = "; ".join(kernel_pins(spec, lock, pins))
    if mode != MODE_CONTAINER:
        return f"built on this host from the fetched, patched trees ({words}), cached by build key"
    img = image.recipe if image else "?"
    return (
        f"prebuilt in image {img}: {MANIFEST}, checked at start against the lock "
        f"({words}) and kernels/*.yaml; no fetch, no build; a mismatch stops the gate"
    )


def built_from(source: bool) -> Describe:
    """The line of a kind that builds its spec's kernels on the host or takes them prebuilt from its image
    (`built_kernels_line`), naming its kernels' pins (and first its source's, when `source`)."""

    def describe(spec: Any, lock: Lock, image: ImageRef | None, mode: str) -> str:
        pins = (spec.source, *spec.kernels) if source else tuple(spec.kernels)
        return built_kernels_line(spec, lock, image, mode, pins=pins)

    return describe


@dataclass(frozen=True)
class KernelUse:
    """A kind's use of its spec's kernels (module doc). `takes_prebuilt`: container mode takes them from the image's
    kernels manifest; `describe`: the plan's line."""

    takes_prebuilt: bool = False
    describe: Describe = no_line

    def prebuilt(self, spec: Spec) -> tuple[str, ...]:
        """Kernels taken prebuilt from the image in container mode (its kernels manifest); () when none."""
        return tuple(spec.kernels) if self.takes_prebuilt else ()

    def rebuilt_by(self, spec: Spec) -> tuple[str, ...]:
        """Kernels (kernels/<c>.yaml) whose new revision makes this gate re-run (bump impact)."""
        return tuple(spec.kernels)

    def line(self, spec: Spec, lock: Lock, image: ImageRef | None, mode: str) -> str:
        """Where the plan's kernels come from, for a person ("" when the gate builds none)."""
        return self.describe(spec, lock, image, mode)
