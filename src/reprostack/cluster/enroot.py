"""The enroot 3.x path of `launch slurm --runtime pyxis --enroot-import DIR` (issue 37 item 6): the image by digest
imported once into DIR/<digest hex>.sqsh, then `srun --container-image=` that file.

Why: pyxis hands `--container-image` to `enroot import docker://...`; enroot before 4.0 parses that URI as
`docker://[USER@][REGISTRY#]IMAGE[:TAG]` (NVIDIA/enroot v3.4.1 src/docker.sh, the `reg_image` / `reg_tag` regexes):
`REPO@sha256:HEX` is "Invalid image reference" there (enroot 4.0 added `@DIGEST`, commit f380b11). HyperPod's
Slurm nodes ship enroot 3.4.1. Its tag may hold `:` (`[[:alnum:]._:-]+`), and the tag is the manifest reference
of the registry API (`/v2/IMAGE/manifests/TAG`), so `docker://REGISTRY#IMAGE:sha256:HEX` fetches the manifest by
its digest on enroot 3.x and 4.x alike (4.x keeps that form: its last `REGISTRY#IMAGE[:TAG]` branch); enroot checks
every layer blob against its sha256. The file is keyed by the digest, so a later job reuses it.

`import_uri(ref)` turns `REGISTRY/IMAGE@sha256:HEX` into that URI (a registry is the first path component when it
holds `.` or `:` or is `localhost`, as docker reads a reference; otherwise Docker Hub, `library/` for one
component); `import_step(...)` the script lines: one srun task per node, each importing only when the file is not
there yet, into a per-node temporary file renamed without overwriting (`mv -n`: on shared storage the first import
stays, the others are dropped), a failure one line naming the node and exit 2.

Invariants: pure (text in, text out); a reference that is not `REPO@sha256:<64 hex>` is EnrootError naming the option
(nothing is written); every value reaches the script shell-quoted (cluster.slurm_words.word).
"""

from __future__ import annotations

import re

from ..errors import ReprostackError

_DIGEST_REF = re.compile(r"^([a-z0-9][a-z0-9._:/-]*)@sha256:([0-9a-f]{64})$")
_IMAGE = re.compile(r"^[a-z0-9/._-]+$")  # enroot 3.4.1's reg_image: [[:lower:][:digit:]/._-]+
DOCKER_HUB = "registry-1.docker.io"


class EnrootError(ReprostackError):
    """An image that cannot be imported by digest (one line, names the option and the reference)."""


def import_uri(ref: str) -> tuple[str, str]:
    """(`docker://REGISTRY#IMAGE:sha256:HEX`, HEX) of an image by digest; EnrootError for anything else."""
    m = _DIGEST_REF.fullmatch(ref or "")
    if not m:
        raise EnrootError(
            f"--enroot-import: image {ref!r} is not named by digest (REPO@sha256:<64 hex>): push it and pass "
            "--image REPO@sha256:<digest of your push>"
        )
    repo, hexdigest = m.groups()
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, image = first, rest
    else:
        registry, image = DOCKER_HUB, repo if rest else f"library/{repo}"
    if not _IMAGE.fullmatch(image):
        raise EnrootError(f"--enroot-import: image name {image!r} of {ref!r} is not one enroot 3.x reads")
    return f"docker://{registry}#{image}:sha256:{hexdigest}", hexdigest


def check(runtime: str, folder: str, ref: str | None) -> None:
    """--enroot-import DIR is pyxis's path (EnrootError naming the runtime otherwise) for an image by digest."""
    if runtime != "pyxis":
        raise EnrootError(f"--enroot-import: pyxis's path on enroot 3.x (--runtime pyxis, not {runtime})")
    import_uri(ref or "")


def import_step(ref: str, folder: str, *, srun: list[str], output: str, word) -> list[str]:
    """The script lines of the import (module docstring): SQSH and IMAGE set to DIR/<hex>.sqsh after every node has it.
    `folder`: --enroot-import DIR (relative: to the submit dir, PROJECT); `srun`: the step's srun words; `output`:
    its --output; `word`: the shell quoting of cluster.slurm."""
    uri, hexdigest = import_uri(ref)
    where = word(folder) if folder.startswith("/") else '"${PROJECT}"/' + word(folder)
    task = (
        'mkdir -p "${SQSH%/*}" && if [ ! -f "${SQSH}" ]; then t="${SQSH}.node${SLURM_NODEID}.$$.tmp"; '
        'enroot import -o "${t}" "${IMAGE_URI}"; rc=$?; [ "${rc}" != 0 ] || mv -n "${t}" "${SQSH}" 2>/dev/null; '
        'rm -f "${t}"; [ -f "${SQSH}" ] || { echo "reprostack: node ${SLURM_NODEID}: enroot import ${IMAGE_URI} into '
        '${SQSH} failed (exit ${rc}; registry login: ENROOT_CONFIG_PATH/.credentials, docs/examples/README.md)" >&2; '
        "exit 2; }; fi"
    )
    return [
        "# enroot 3.x (HyperPod: 3.4.1) cannot pull REPO@sha256: (its docker:// grammar has no @digest before enroot",
        "# 4.0): every node imports the image once by its digest (docker://REGISTRY#IMAGE:sha256:HEX, the manifest by",
        "# digest) into a file keyed by that digest, reused by later jobs; on shared storage one import serves all",
        f"export SQSH={where}/{hexdigest}.sqsh",
        f"export IMAGE_URI={word(uri)}",
        " ".join([*srun, f"--output={output}"]) + f" bash -c {word(task)} \\",
        f'  || {{ echo "reprostack: the image import failed on a node (its log: {output.replace(chr(34), "")})" >&2; '
        "exit 2; }",
        'export IMAGE="${SQSH}"',
    ]
