"""`upstreams.lock`: the pin model (lock.model) and its stacks (lock.stacks), re-exported here, and the commands that
edit the lock: `lock wheels` (lock.wheels, lock.wheelset, resolved by pip through lock.pip) and `lock images`
(lock.images), both through lock.fill's one fill/check pipeline.

Invariants:
- `from reprostack.lock import Lock, GitPin, load, LOCKFILE, ...` is the model's public face: every name below is
  lock.model's (`load`, `Lock`, LOCKFILE) or lock.pins' (the pins, typed by lock.typed); the editing commands are
  imported by name (`from reprostack.lock import wheels`), never here,
  so loading a lock never imports pip's or a registry's code paths;
- the package imports only the base layer (reprostack.layers): fetch, containers and gates read the lock, it
  reads none of them.
"""

from . import stacks
from .model import LOCKFILE, Lock, load
from .pins import (
    DOCKER_HUB,
    DebFile,
    DebsPin,
    GitPin,
    ImagePin,
    PatchEntry,
    PatchFileError,
    Policy,
    Submodule,
    WheelFile,
    WheelPin,
    WheelsetFile,
    WheelsetPin,
    canonical_name,
    patch_path,
    read_patch_file,
    ref_problem,
    split_repo,
    submodule_path_problem,
    wheel_filename_problem,
)

__all__ = [
    "DOCKER_HUB",
    "LOCKFILE",
    "DebFile",
    "DebsPin",
    "GitPin",
    "ImagePin",
    "Lock",
    "PatchEntry",
    "PatchFileError",
    "Policy",
    "Submodule",
    "WheelFile",
    "WheelPin",
    "WheelsetFile",
    "WheelsetPin",
    "canonical_name",
    "load",
    "patch_path",
    "read_patch_file",
    "ref_problem",
    "split_repo",
    "stacks",
    "submodule_path_problem",
    "wheel_filename_problem",
]
