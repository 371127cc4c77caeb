"""The fabric gate across nodes (profile launcher `mpi`): the MPI launch a cluster renderer writes, and the reading
of what that launch left for the judge.

nccl-tests has no bootstrap between processes without MPI (kernels/nccl-tests.yaml), so a multi-node profile runs
the deepep image's nccl-tests built with MPI=1 (containers/deepep, against the substrate's Open MPI: IMAGE_BIN), one
MPI rank per GPU (`-g 1`, ranks per node = the profile's gpus-per-node), the way operators run it
(awsome-distributed-training micro-benchmarks/nccl-tests: `srun --mpi=pmix` under Slurm with pyxis, an MPIJob's
`mpirun` on EKS). This runner cannot start an MPI job itself: the renderers (cluster.slurm, cluster.k8s) start one
launch per test from `mpi_launch`, each writing every rank's output into `<out>/LOGS/<test>.log` and its exit
status into `<out>/LOGS/<test>.rc` (`RC RUN_ID`), then run the in-image runner once with `--launched-logs
<out>/LOGS`, which judges those files exactly as a local run's output (gates.fabric: rows, #wrong, the pinned NCCL,
the bars on their interval, the transport of every rank).

Invariants: `mpi_launch` is pure (spec and profile in, the launch out; nothing runs); `read_launched` reads each file
bounded (MAX_LOG_BYTES), never raises on content, and names what is missing (a test with no log or no rc of this run
is a crash of that test, never a pass); the commands are the ones `gates.fabric.node_commands` makes, so a plan, a
rendering and the judged run agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fabric_spec import FabricBar, FabricSpec
    from .spec import Profile

IMAGE_BIN = "/opt/reprostack/nccl-tests/bin"  # containers/deepep: nccl-tests built with MPI=1
LOGS = "fabric-mpi"  # under the run's out dir: <test>.log (every rank's output) and <test>.rc
MAX_LOG_BYTES = 64 << 20
# Open MPI's own settings for the bootstrap it carries (the reference's image: awsome-distributed-training
# micro-benchmarks/nccl-tests/nccl-tests.Dockerfile): TCP and self between ranks, never the container bridge or
# loopback; PMIx's hash store (open-mpi/ompi#7516: the shared-memory store's error under srun)
MPI_ENV = (
    ("OMPI_MCA_pml", "ob1"),
    ("OMPI_MCA_btl", "tcp,self,vader"),
    ("OMPI_MCA_btl_tcp_if_exclude", "lo,docker0,veth_def_agent"),
    ("PMIX_MCA_gds", "hash"),
)


@dataclass(frozen=True)
class MpiStep:
    """One test's MPI launch: every rank runs `argv`; `log` and `rc` are paths under the out dir."""

    test: str
    argv: tuple[str, ...]
    log: str
    rc: str


@dataclass(frozen=True)
class MpiLaunch:
    """What a renderer starts for a profile with launcher `mpi`: `nodes` x `ranks_per_node` ranks per step, the
    steps in order, the env every rank gets (the spec's, the profile's, then MPI_ENV), each step's time limit."""

    nodes: int
    ranks_per_node: int
    steps: tuple[MpiStep, ...]
    env: tuple[tuple[str, str], ...]
    timeout_s: float
    logs: str = LOGS

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def mpi_launch(spec: FabricSpec, profile: Profile[FabricBar], cmds: list) -> MpiLaunch:
    """The launch of every test of `spec` over `profile` (launcher mpi), one rank per GPU: `cmds`, the commands of
    gates.fabric.node_commands for IMAGE_BIN (the image's MPI build, `-g 1`)."""
    steps = tuple(MpiStep(c.test, c.argv, f"{LOGS}/{c.test}.log", f"{LOGS}/{c.test}.rc") for c in cmds)
    env = dict(cmds[0].env) if cmds else {}
    env.update(MPI_ENV)
    return MpiLaunch(profile.nodes, profile.gpus_per_node, steps, tuple(env.items()), spec.timeout_s)


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_LOG_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def read_launched(folder: Path, launch: MpiLaunch, run_id: str | None) -> tuple[dict, dict, list[Path]]:
    """(ran, text, logs) of the launch's steps as `folder` (the out dir's LOGS) holds them: per test {"command",
    "returncode", "timed_out"} and the output's text. A missing log is empty text; a missing rc, one that is not
    `RC RUN_ID` or one of another run is returncode None (an ERROR of that test, named)."""
    ran, text, logs = {}, {}, []
    for step in launch.steps:
        log = Path(folder) / Path(step.log).name
        text[step.test] = _read(log) or ""
        if log.is_file():
            logs.append(log)
        words = (_read(Path(folder) / Path(step.rc).name) or "").split()
        rc = None
        if words and words[0].lstrip("-").isdigit() and (run_id is None or words[1:2] == [str(run_id)]):
            rc = int(words[0])
        ran[step.test] = {
            "command": list(step.argv),
            "returncode": rc,
            "timed_out": rc in (124, 137),
            "why": None if rc is not None else f"no rc of this run in {Path(folder) / Path(step.rc).name}",
        }
    return ran, text, logs
