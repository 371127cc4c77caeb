"""How the launchers start a gate kind (`Gate.launcher`, one `Launcher` per kind, declared as data): how many
watchdog-bounded launches a run makes, whether a profile is started by MPI, and whether a cluster renderer can start
it at all. Asked by container mode (gates.container), `launch slurm` (cluster.slurm) and `launch k8s` (cluster.k8s,
cluster.k8s_cli), and by the kind's own run (the fabric gate's MPI launch).

- `launches(spec, opts)`: how many watchdog-bounded launches one run makes (the container's time limit is that many
  times the spec's timeout, plus slack);
- `mpi_launch(spec, profile)`: the MPI launch a cluster renderer starts for `profile` (gates.fabric_mpi.MpiLaunch:
  the ranks run the image's MPI build, then the in-image runner judges what they wrote, --launched-logs), or None:
  the profile runs as one in-image runner per node;
- `unrenderable(spec, profile)`: why a cluster renderer cannot launch `profile` as one in-image runner per node, or
  None when it can.

Invariants: pure (spec, profile and options in, the answer out; nothing runs); a kind differs only by the functions
it declares, never by a kind string; `launches` is at least 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fabric_mpi import MpiLaunch
    from .options import GateOptions


def one_launch(spec: Any, opts: GateOptions | None) -> int:
    """One launch per run."""
    return 1


def per_arm(spec: Any, opts: GateOptions | None) -> int:
    """One launch per arm the run takes (`--arm`, else every arm of the spec)."""
    return len(opts.arms) if opts is not None and opts.arms else max(1, len(spec.arms))


def no_mpi(spec: Any, profile: Any) -> MpiLaunch | None:
    """Every profile runs as one in-image runner per node."""
    return None


def renderable(spec: Any, profile: Any) -> str | None:
    """A cluster renderer can start every profile."""
    return None


@dataclass(frozen=True)
class Launcher:
    """A kind's launch traits (module doc): `count` gives `launches`, `mpi` gives `mpi_launch`, `why_not` gives
    `unrenderable`."""

    count: Callable[[Any, GateOptions | None], int] = one_launch
    mpi: Callable[[Any, Any], MpiLaunch | None] = no_mpi
    why_not: Callable[[Any, Any], str | None] = renderable

    def launches(self, spec: Any, opts: GateOptions | None = None) -> int:
        """How many watchdog-bounded launches one run makes."""
        return self.count(spec, opts)

    def mpi_launch(self, spec: Any, profile: Any) -> MpiLaunch | None:
        """The MPI launch of `profile`, or None (one in-image runner per node)."""
        return self.mpi(spec, profile)

    def unrenderable(self, spec: Any, profile: Any) -> str | None:
        """Why a cluster renderer (Slurm, Kubernetes) cannot start `profile`, or None when it can."""
        return self.why_not(spec, profile)
