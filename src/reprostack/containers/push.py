"""Built images to a registry, each digest read back from the registry itself (`reprostack build --push REGISTRY`).

`push_images(client, built, registry)` tags each built image `REGISTRY/<name>:<key>` (the build's own key, so a
pushed tag names one recipe state), pushes it with the engine, then asks the registry (lock.images, the reader
`lock images --check` uses) for the manifest digest it serves under that tag and for the image id that digest
pulls as (its config digest). A node then runs `REGISTRY/<name>@<digest>`.

Invariants:
- `--push` is checked before anything is built: `HOST[:PORT][/PATH]`, lower-case path components, no scheme, no
  tag or digest; anything else is one ContainerError line;
- a push is `pushed` only when the registry's answer is read back and the image id it pulls as equals the local
  image id (the same bytes); an engine push error, an unreachable registry or another image id is a ContainerError
  naming the image and the reference, never a digest the registry did not give;
- `out/build/pushed.json` (written atomically, after every image was pushed and read back) lists name, ref, digest,
  image id and where the digest was read.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from ..atomicfile import write_text_atomic
from ..lock.images import RegistryError, registry_digest, registry_image_id
from .errors import ContainerError

_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"
_REGISTRY = re.compile(rf"{_HOST}(?::[0-9]{{1,5}})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")


@dataclass(frozen=True)
class Pushed:
    name: str
    ref: str  # REGISTRY/name:key
    digest: str  # the manifest digest the registry serves for ref
    image_id: str  # the local image id, equal to the registry's config digest for that manifest
    read_from: str  # where the digest was read


def check_registry(value: str) -> str:
    """`value` as a push target (module doc), or ContainerError naming it."""
    v = value.rstrip("/")
    host = v.split("/", 1)[0]
    # the engine reads a first component as a registry only with a '.' or a ':' in it, or as `localhost`
    if len(v) > 255 or not _REGISTRY.fullmatch(v) or not (host == "localhost" or "." in host or ":" in host):
        raise ContainerError(
            f"--push {value!r}: not a registry `HOST[:PORT][/PATH]` (e.g. 127.0.0.1:5000/reprostack; no scheme, "
            f"tag or digest)"
        )
    return v


def push_images(client, built: Sequence[tuple[str, str, str]], registry: str, log=print) -> list[Pushed]:
    """Push `built` ([(name, local tag, image id)]) to `registry` and read each digest back (module doc)."""
    import docker.errors

    out = []
    for name, tag, image_id in built:
        key = tag.rsplit(":", 1)[1] if ":" in tag.rsplit("/", 1)[-1] else "latest"
        repo = f"{registry}/{name}"
        ref = f"{repo}:{key}"
        try:
            client.images.get(tag).tag(repo, key)
            errors = [
                x.get("error") or x.get("errorDetail")
                for x in client.images.push(repo, tag=key, stream=True, decode=True)
                if isinstance(x, dict) and (x.get("error") or x.get("errorDetail"))
            ]
        except docker.errors.DockerException as e:
            raise ContainerError(f"{name}: push {ref}: {e}") from None
        if errors:
            raise ContainerError(f"{name}: push {ref}: the engine says {errors[0]}")
        try:
            digest = registry_digest(repo, key)
            pulled_id = registry_image_id(repo, digest)
        except RegistryError as e:
            raise ContainerError(f"{name}: pushed {ref} but reading it back failed: {e}") from None
        if pulled_id != image_id:
            raise ContainerError(
                f"{name}: {ref}@{digest} pulls as image {pulled_id}, the build made {image_id}: not the image built"
            )
        p = Pushed(name, ref, digest, image_id, f"the registry's manifest for {ref} (HEAD /v2/.../manifests/{key})")
        log(f"{name}: pushed {ref}@{digest} (image {image_id[:19]}, as the registry serves it)")
        out.append(p)
    return out


def write_pushed(out_dir: Path, pushed: Sequence[Pushed]) -> Path:
    path = Path(out_dir) / "pushed.json"
    write_text_atomic(path, json.dumps({"pushed": [asdict(p) for p in pushed]}, indent=1) + "\n")
    return path
