"""Images for a node without registry access: `docker save` the built images into one archive, `docker load`
it there.

Archive layout (an uncompressed tar, written to a temp file and renamed, so a half-written bundle never
exists under its name):

    manifest.json          {"format": 1, "images": [{"name", "tag", "id", "member", "sha256", "bytes"}]}
    images/<name>.tar      the engine's own save of that image (docker SDK `get_image`), tag included

Invariants: `load_bundle` checks every member's sha256 against the manifest before the engine sees it, and
after loading checks that each tag names the recorded image id (content-addressed: the same bytes). Layers
shared by several images are stored once per image (the SDK saves one image per call): save the images the
node runs (a gate image holds its parents' layers), not every parent.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..digest import sha256_stream
from .errors import ContainerError

FORMAT = 1


@dataclass(frozen=True)
class BundledImage:
    name: str
    tag: str
    image_id: str
    sha256: str
    bytes: int


def save_bundle(client, images: Sequence[tuple[str, str]], dest: Path) -> list[BundledImage]:
    """Save `images` ([(name, tag)]) from the engine into the archive `dest` (see module doc).
    Raises ContainerError naming the image when the engine does not have it; nothing is left at `dest` then."""
    import docker.errors

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    out: list[BundledImage] = []
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        with (
            tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar,
            tempfile.TemporaryDirectory(dir=dest.parent) as scratch,
        ):
            for name, tag in images:
                try:
                    img = client.images.get(tag)
                except docker.errors.ImageNotFound:
                    raise ContainerError(
                        f"image {name} ({tag}) is not in this engine: build it first (`reprostack build {name}`)"
                    ) from None
                part = Path(scratch, f"{name}.tar")
                with open(part, "wb") as f:
                    sha, n = sha256_stream(client.api.get_image(tag), f)
                member = f"images/{name}.tar"
                tar.add(part, arcname=member, filter=_normalize)
                part.unlink()
                out.append(BundledImage(name, tag, img.id, sha, n))
            manifest = json.dumps(
                {
                    "format": FORMAT,
                    "images": [
                        {
                            "name": b.name,
                            "tag": b.tag,
                            "id": b.image_id,
                            "member": f"images/{b.name}.tar",
                            "sha256": b.sha256,
                            "bytes": b.bytes,
                        }
                        for b in out
                    ],
                },
                indent=1,
                sort_keys=True,
            ).encode()
            ti = _normalize(tarfile.TarInfo("manifest.json"))
            ti.size = len(manifest)
            tar.addfile(ti, io.BytesIO(manifest))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _normalize(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = 0
    ti.mode = 0o644
    return ti


def load_bundle(client, path: Path) -> list[BundledImage]:
    """Load every image of the archive `path` into the engine and check its tag names the recorded id.
    Raises ContainerError naming the archive and member for a missing/corrupt member or a wrong id."""
    path = Path(path)
    try:
        tar = tarfile.open(path, "r:")
    except (OSError, tarfile.TarError) as e:
        raise ContainerError(f"{path}: not an images bundle ({e})") from None
    with tar:
        try:
            manifest = json.load(tar.extractfile("manifest.json"))
        except (KeyError, ValueError, AttributeError):
            raise ContainerError(f"{path}: no readable manifest.json (not an images bundle)") from None
        if manifest.get("format") != FORMAT:
            raise ContainerError(f"{path}: bundle format {manifest.get('format')!r}, this reprostack reads {FORMAT}")
        out = []
        for e in manifest["images"]:
            try:
                f = tar.extractfile(e["member"])
            except KeyError:
                f = None
            if f is None:
                raise ContainerError(f"{path}: {e['member']} is missing")
            with tempfile.TemporaryFile() as tmpf:
                got_sha, _ = sha256_stream(f, tmpf)
                if got_sha != e["sha256"]:
                    raise ContainerError(
                        f"{path}: {e['member']} has sha256 {got_sha}, the manifest says "
                        f"{e['sha256']} (corrupt bundle; nothing of it was loaded)"
                    )
                tmpf.seek(0)
                client.api.load_image(tmpf)
            got = client.images.get(e["tag"]).id
            if got != e["id"]:
                raise ContainerError(f"{path}: after loading, {e['tag']} is {got}, the bundle recorded {e['id']}")
            out.append(BundledImage(e["name"], e["tag"], e["id"], e["sha256"], e["bytes"]))
        return out
