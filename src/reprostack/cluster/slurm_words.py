"""Values into an sbatch script's shell words (cluster.slurm and its helpers): quoting, with placeholders for the
expansions only the job knows (the node rank, the master, the runtime's out and work paths, the job id), and the
checks that refuse a value the script cannot carry.

Invariants: a value with a control character, an env name that is not a shell name, a path with a character its
consumer splits on (`,` and `:` in a mount spec, `%` in `#SBATCH --output`) or an image that is not one reference is
a SlurmRenderError naming it (one line, exit 2); every literal part of a word is shlex.quote'd; a placeholder is
expanded by the shell (double-quoted), never a value.
"""

from __future__ import annotations

import re
import shlex

from ..errors import ReprostackError

_CTRL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# placeholders for shell expansions inside a rendered word (never in a value: values with control chars are refused)
_VARS = {
    "\x01rank\x01": "${SLURM_NODEID}",
    "\x01master\x01": "${MASTER_ADDR}",
    "\x01out\x01": "${RS_OUT}",
    "\x01work\x01": "${RS_WORK}",
    "\x01job\x01": "${SLURM_JOB_ID}",
}
RANK, MASTER, OUTV, WORKV, JOBV = _VARS


class SlurmRenderError(ReprostackError):
    """A plan or option that cannot be rendered safely into an sbatch script (one line, names the value)."""


def checked(value, what: str) -> str:
    """`value` as a string; a control character in it (which would break the script) is a SlurmRenderError."""
    s = str(value)
    if _CTRL.search(s):
        raise SlurmRenderError(f"{what}: {s[:60]!r} holds a control character; refused (it would break the script)")
    return s


# what the consumers of a path split on: pyxis --container-mounts (`,` between mounts; `:` between source, target
# and flags, as docker -v and enroot --mount do); `#SBATCH --output` expands `%` patterns (the out dir's batch log)
_SPLITS = {
    ",": "pyxis splits --container-mounts on ','",
    ":": "a mount spec (pyxis --container-mounts, enroot --mount, docker -v) splits on ':'",
}
_IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@#+-]*$")


def path_arg(value, flag: str, *, percent: bool = False) -> str:
    """A path that reaches a mount spec (or, `percent`, an `#SBATCH --output` pattern), as one word; a character
    its consumer splits on is one SlurmRenderError line naming the option, before anything is written."""
    s = checked(value, flag)
    splits = {**_SPLITS, **({"%": "#SBATCH --output expands '%' patterns"} if percent else {})}
    for ch, why in splits.items():
        if ch in s:
            raise SlurmRenderError(f"{flag} {s[:80]!r}: holds {ch!r} and {why}; refused (name a path without it)")
    return s


def image_arg(value, flag: str = "--image") -> str:
    """An image reference (REPO[:TAG][@sha256:HEX], enroot's REGISTRY#IMAGE): nothing a shell, pyxis or docker
    would read as more than one reference."""
    s = checked(value, flag)
    if not _IMAGE_REF.match(s):
        raise SlurmRenderError(
            f"{flag} {s[:80]!r}: not an image reference (letters, digits and . _ / : @ # + - only, not starting "
            "with '-'); refused"
        )
    return s


def word(value, what: str = "value") -> str:
    """One shell word: literal parts quoted with shlex.quote, placeholders as double-quoted expansions."""
    s = str(value)
    checked(re.sub("|".join(map(re.escape, _VARS)), "", s), what)
    parts = re.split("(" + "|".join(map(re.escape, _VARS)) + ")", s)
    out = "".join(f'"{_VARS[p]}"' if p in _VARS else shlex.quote(p) for p in parts if p)
    return out or "''"


def words(argv, what: str) -> str:
    """The words of `argv` (each as `word`), space-separated."""
    return " ".join(word(a, what) for a in argv)


def env_name(k: str, what: str) -> str:
    """`k` when it is a shell variable name; else a SlurmRenderError naming it."""
    if not _NAME.match(str(k)):
        raise SlurmRenderError(f"{what}: env name {str(k)[:60]!r} is not a shell variable name; refused")
    return k
