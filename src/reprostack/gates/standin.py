"""The gates' seam for the GPU stand-in: what a gate asks of it, and where it comes from. The stand-in itself is test
code, never part of this package.

`REPROSTACK_STANDIN=h200[,...]` in the environment of `reprostack gate G` (CI's rehearsals of the rendered Slurm
script and Kubernetes manifests on machines with no GPU and no EFA) makes the gate load the stand-in from the checkout
it runs from, `tests/standins/gpu.py` under the project root (that file's doc says what it plays and how), and ask
it, instead of this host and the real build: the host facts, the source trees, a stand-in NCCL library, and the
command that replays the plan's own command per rank. Everything else of the run (plan, launch, rendezvous address,
output contract, judging, reports, signing) is the gate's own code.

Invariants:
- without the variable nothing here loads or runs anything, and no stand-in code is imported;
- with it, a checkout without the stand-in (an installed reprostack, an image's copy) is one ReprostackError line
  naming the file: never a run that looks like a real one;
- a run that used the stand-in is never evidence: every report it touched starts its reason with NOTE, records
  `provenance.stand_in` and has `evidence` false (gates.base.RunState.finish).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Protocol

from ..errors import ReprostackError

ENV = "REPROSTACK_STANDIN"
NOTE = "GPU stand-in (recorded H200 output replayed per rank, no GPU ran; not evidence)"
PLUGIN = Path("tests") / "standins" / "gpu.py"  # under the project root: test code, not the package's


class StandIn(Protocol):
    """What the gates ask of the stand-in (tests/standins/gpu.py: StandIn)."""

    wait_s: float | None  # the output contract's bounded wait of node 0 for the others, when set
    recorded_arch: str  # the CUDA arch of the recording it replays (a prebuilt-kernels manifest is checked for it)

    def record(self) -> dict:
        """`provenance.stand_in` of every report the run touched."""
        ...

    def host_facts(self) -> dict:
        """The host inventory it plays (hostinfo.collect()'s shape)."""
        ...

    def trees(self, lock, names, out_dir: Path) -> dict:
        """{pin: sources.SourceTree} as the lock pins them, nothing fetched."""
        ...

    def nccl_version(self, lock) -> str:
        """The pinned NCCL's version the replayed ranks report."""
        ...

    def stand_in_lib(self, folder: Path) -> Path:
        """A folder holding the stand-in libnccl the replayed ranks map."""
        ...

    def wrap(self, argv: list[str], *, root: Path, nccl_lib: Path, version: str) -> list[str]:
        """The command that replays `argv` (the plan's command for this node)."""
        ...


def from_env(root: Path, environ=None) -> StandIn | None:
    """The stand-in the environment asks for, loaded from `root` (None: a real run). Raises ReprostackError (one
    line): the checkout has no stand-in, or the value is not one it takes."""
    value = (os.environ if environ is None else environ).get(ENV)
    if not value:
        return None
    return load(root).parse(value)


def load(root: Path) -> ModuleType:
    """tests/standins/gpu.py of the checkout at `root`, imported once per path."""
    path = (Path(root) / PLUGIN).resolve()
    name = "_reprostack_standin_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise ReprostackError(
            f"{ENV} is set (the GPU stand-in) but {path} is not there: the stand-in is test code of a reprostack "
            f"checkout, never part of an installed reprostack; unset {ENV} for a real run"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ReprostackError(f"{ENV}: cannot load the GPU stand-in from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
